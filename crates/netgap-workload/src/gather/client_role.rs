//! The gatherer as a role: its sources prepared before the barrier, full
//! gathers over the window (one host after another, or every host at
//! once), and their times reduced to the role's outcome.

use super::fetch::{Asker, Fetch, FetchError, Source};
use super::load_child::{gather_in_child, GatherChild, GatherJob};
use super::server_role::answer;
use super::{refused, Params, Responder, NAME};
use crate::role::{
    find_transport, meter_window, per_flow, window, OpenRole, ReadyRole, RoleContext, RoleError,
    RoleResult, Stop,
};
use crate::service::{gmond, RunDir};
use netgap_core::cpu::CpuUsage;
use netgap_core::stats::LatencyHistogram;
use netgap_proto::workload::{FlowReport, WorkloadOutcome};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::{FlowConfig, Programs};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub(super) struct ClientRole {
    pub(super) asker: Asker,
    pub(super) sources: Vec<Source>,
    pub(super) parallel: bool,
    pub(super) warmup: Duration,
    pub(super) duration: Duration,
    pub(super) stop: Stop,
    /// Under the preload library: the library, the child's run directory,
    /// its job, and for `-t xdp` the host's relay.
    pub(super) child: Option<GatherChild>,
}

pub(super) fn open_client(
    p: &Params,
    ctx: &RoleContext<'_>,
) -> Result<Box<dyn OpenRole>, RoleError> {
    let spec = ctx.spec;
    let transport = find_transport(spec)?;
    let n = spec.flows as usize;
    let mut sources = Vec::with_capacity(n);
    for i in 0..n {
        let addr =
            per_flow(&spec.targets, i).ok_or_else(|| refused("a client role needs targets"))?;
        if addr.parse::<SocketAddr>().is_err() {
            return Err(RoleError::Params {
                workload: NAME,
                detail: format!("the target {addr:?} is not IP:PORT"),
            });
        }
        sources.push(Source {
            addr,
            bind_ip: per_flow(&spec.bind_ips, i),
        });
    }
    let expect = match p.responder {
        Responder::Builtin => answer(p.answer_bytes),
        Responder::Gmond => Vec::new(),
    };
    let (warmup, duration) = window(spec);
    let child = if p.preload {
        let library = crate::preload::library_path().map_err(refused)?;
        let dir = RunDir::new(ctx.dirs, "gather-load").map_err(refused)?;
        let relay =
            if netgap_transport::programs(&spec.point.transport) == Programs::LibraryWithRelay {
                Some(std::sync::Arc::new(crate::web::server_role::relay_for(
                    ctx, &dir, spec.flows,
                )?))
            } else {
                None
            };
        let job = GatherJob {
            point: spec.point.clone(),
            token: ctx.data_token.clone(),
            sources: sources
                .iter()
                .map(|s| (s.addr.clone(), s.bind_ip))
                .collect(),
            parallel: p.parallel,
            warmup_ns: u64::try_from(warmup.as_nanos()).unwrap_or(u64::MAX),
            duration_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
        };
        Some(GatherChild {
            library,
            stack: crate::preload::LibraryStack::of(&spec.point),
            dir,
            job,
            relay,
        })
    } else {
        None
    };
    Ok(Box::new(ClientRole {
        asker: Asker {
            responder: p.responder,
            transport,
            cfg: FlowConfig::from_spec(&spec.point),
            token: ctx.data_token.clone(),
            expect: std::sync::Arc::new(expect),
        },
        sources,
        parallel: p.parallel,
        warmup,
        duration,
        stop: ctx.stop.clone(),
        child,
    }))
}

impl OpenRole for ClientRole {
    fn addrs(&self) -> Vec<String> {
        Vec::new()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

/// Why the gathers stopped before the window's end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GatherError {
    /// A host's answer could not be fetched.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A thread asking one host could not start.
    #[error("starting a gather thread: {source}")]
    Thread {
        /// Why.
        source: std::io::Error,
    },
    /// A thread asking one host ended before the gathers did.
    #[error("a gather thread ended")]
    ThreadEnded,
}

/// What the measured gathers add up to.
#[derive(Default)]
struct Totals {
    gathers: u64,
    gather_ns: u64,
    /// Per host: exchanges' bytes, connect and total times.
    per_host: Vec<(u64, u64, u64, netgap_core::stats::FlowHistogram)>,
    /// netgap's handshakes, summed over every host's exchanges, ns.
    handshake_ns: u64,
    hist: LatencyHistogram,
    /// Every byte read, warm-up included, per host.
    bytes_rx: Vec<u64>,
}

/// One gather: every host's fetch, in host order.
type Gathered = Result<Vec<Fetch>, GatherError>;

/// One host's exchange and its answer, or why it failed.
type HostAnswer = Result<(Fetch, Vec<u8>), FetchError>;

impl Totals {
    /// Nothing measured yet from `n` hosts.
    fn new(n: usize) -> Totals {
        Totals {
            per_host: (0..n)
                .map(|_| (0, 0, 0, netgap_core::stats::FlowHistogram::new()))
                .collect(),
            hist: LatencyHistogram::new(),
            bytes_rx: vec![0; n],
            ..Totals::default()
        }
    }

    /// Adds one full gather that ran over `(start, end)`: its bytes
    /// always, its times when it lies wholly inside the window `(w0, w1)`.
    fn add(
        &mut self,
        fetched: &[Fetch],
        (start, end): (Instant, Instant),
        (w0, w1): (Instant, Instant),
    ) {
        for (i, f) in fetched.iter().enumerate() {
            self.bytes_rx[i] += f.bytes;
        }
        if start >= w0 && end <= w1 {
            let ns = u64::try_from((end - start).as_nanos()).unwrap_or(u64::MAX);
            self.gathers += 1;
            self.gather_ns += ns;
            self.hist.record_ns(ns);
            for (i, f) in fetched.iter().enumerate() {
                let h = &mut self.per_host[i];
                h.0 += f.bytes;
                h.1 += f.connect_ns;
                h.2 += f.total_ns;
                self.handshake_ns += f.handshake_ns;
                h.3.record_ns(f.total_ns);
            }
        }
    }

    /// The role's result: one flow report per host, the role's CPU over
    /// the window and its figures.
    fn into_result(self, cpu: CpuUsage, metrics: BTreeMap<String, f64>) -> RoleResult {
        let flows = self
            .per_host
            .iter()
            .enumerate()
            .map(|(i, h)| FlowReport {
                index: i as u32,
                bytes_tx: 0,
                bytes_rx: self.bytes_rx[i],
                window_bytes_rx: h.0,
                round_trips: self.gathers,
                percentiles: h.3.percentiles_us(1.0),
                errors: 0,
            })
            .collect();
        RoleResult {
            flows,
            buckets: self.hist.buckets(),
            outcome: WorkloadOutcome {
                // The measured gathers' time: the headline is this over
                // their count (see `sample`).
                window_ns: self.gather_ns,
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: self.bytes_rx.iter().sum(),
                bytes_tx: 0,
                datagrams: None,
                metrics,
                services: Vec::new(),
                last_error: None,
                data_window_ns: None,
                evidence: Vec::new(),
            },
        }
    }
}

/// Asks every host at once, from one thread per host that lives for the
/// whole run, so a gather costs no thread start.
struct Parallel {
    go: Vec<mpsc::Sender<()>>,
    done: mpsc::Receiver<(usize, HostAnswer)>,
}

impl Parallel {
    /// Starts a thread per host in `scope`, each asking its host once per
    /// go it is given.
    fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        asker: &Asker,
        sources: &[Source],
    ) -> Result<Parallel, GatherError> {
        let (done_tx, done) = mpsc::channel();
        let mut go = Vec::with_capacity(sources.len());
        for (i, src) in sources.iter().enumerate() {
            let (tx, rx) = mpsc::channel::<()>();
            go.push(tx);
            let done_tx = done_tx.clone();
            let asker = asker.clone();
            let src = src.clone();
            std::thread::Builder::new()
                .name(format!("gather {i}"))
                .spawn_scoped(scope, move || {
                    let mut buf = Vec::new();
                    while rx.recv().is_ok() {
                        let r = asker.fetch(&src, &mut buf).map(|f| (f, buf.clone()));
                        if done_tx.send((i, r)).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|source| GatherError::Thread { source })?;
        }
        Ok(Parallel { go, done })
    }

    /// One full gather: every host asked at once, each answer kept in its
    /// host's `bufs`; the first host's failure, if any.
    fn gather(&self, bufs: &mut [Vec<u8>]) -> Gathered {
        let n = self.go.len();
        for g in &self.go {
            g.send(()).map_err(|_| GatherError::ThreadEnded)?;
        }
        let mut got = vec![Fetch::default(); n];
        let mut first_err = None;
        for _ in 0..n {
            let (i, r) = self.done.recv().map_err(|_| GatherError::ThreadEnded)?;
            match r {
                Ok((f, b)) => {
                    got[i] = f;
                    bufs[i] = b;
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(got),
        }
    }
}

impl ReadyRole for ClientRole {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let ClientRole {
            asker,
            sources,
            parallel,
            warmup,
            duration,
            stop,
            child,
        } = *self;
        if let Some(child) = child {
            return gather_in_child(child, &stop);
        }
        let n = sources.len();
        let t0 = Instant::now();
        let (w0, w1) = (t0 + warmup, t0 + warmup + duration);
        let meter_stop = stop.clone();
        let meter = std::thread::Builder::new()
            .name("cpu meter".into())
            .spawn(move || meter_window(w0, w1, &meter_stop))
            .map_err(|source| RoleError::Thread {
                what: "the CPU meter",
                source,
            })?;
        let mut bufs: Vec<Vec<u8>> = vec![Vec::new(); n];
        let mut totals = Totals::new(n);
        let result = gather_over_window(
            &asker,
            &sources,
            parallel,
            (w0, w1),
            &stop,
            &mut bufs,
            &mut totals,
        );
        let (cpu, _) = meter.join().map_err(|_| RoleError::Panicked {
            what: "the CPU meter".into(),
        })?;
        result.map_err(refused)?;
        let metrics = figures(&asker, &sources, &bufs, &totals)?;
        Ok(totals.into_result(cpu, metrics))
    }
}

/// The measured phase: full gathers, one after another, until the window
/// `(w0, w1)` ends or the role is stopped; every byte read is counted, and
/// the gathers wholly inside the window are timed. `bufs` keeps each
/// host's last answer.
fn gather_over_window(
    asker: &Asker,
    sources: &[Source],
    parallel: bool,
    (w0, w1): (Instant, Instant),
    stop: &Stop,
    bufs: &mut [Vec<u8>],
    totals: &mut Totals,
) -> Result<(), GatherError> {
    std::thread::scope(|scope| -> Result<(), GatherError> {
        let par = if parallel {
            Some(Parallel::start(scope, asker, sources)?)
        } else {
            None
        };
        while Instant::now() < w1 && !stop.is_set() {
            let start = Instant::now();
            let fetched: Gathered = match &par {
                None => sources
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|(s, b)| asker.fetch(s, b).map_err(GatherError::from))
                    .collect(),
                Some(p) => p.gather(bufs),
            };
            let end = Instant::now();
            totals.add(&fetched?, (start, end), (w0, w1));
        }
        Ok(())
    })
}

/// The role's figures from its totals, and from the hosts' last answers
/// when they are gmond's (which must parse).
fn figures(
    asker: &Asker,
    sources: &[Source],
    bufs: &[Vec<u8>],
    totals: &Totals,
) -> Result<BTreeMap<String, f64>, RoleError> {
    let n = sources.len();
    let mut m: BTreeMap<String, f64> = BTreeMap::new();
    if asker.responder == Responder::Gmond {
        let mut names = BTreeSet::new();
        let mut metrics = 0u64;
        for (i, b) in bufs.iter().enumerate() {
            let a = gmond::parse(b)
                .map_err(|e| refused(format!("{}'s gmond answer: {e}", sources[i].addr)))?;
            metrics += u64::from(a.metrics);
            names.extend(a.hosts);
        }
        m.insert("xml_hosts".into(), names.len() as f64);
        m.insert("xml_metrics".into(), metrics as f64);
    }
    let g = totals.gathers.max(1) as f64;
    let exchanges = g * n as f64;
    let connect: u64 = totals.per_host.iter().map(|h| h.1).sum();
    // The exchange as the program would see it: netgap's handshake out.
    let total: u64 = totals
        .per_host
        .iter()
        .map(|h| h.2)
        .sum::<u64>()
        .saturating_sub(totals.handshake_ns);
    let bytes: u64 = totals.per_host.iter().map(|h| h.0).sum();
    m.insert("gathers".into(), totals.gathers as f64);
    m.insert("hosts".into(), n as f64);
    m.insert("gather_bytes".into(), bytes as f64 / g);
    m.insert("connect_time_us".into(), connect as f64 / exchanges / 1e3);
    m.insert("exchange_time_us".into(), total as f64 / exchanges / 1e3);
    if asker.responder == Responder::Builtin {
        m.insert(
            "handshake_time_us".into(),
            totals.handshake_ns as f64 / exchanges / 1e3,
        );
    }
    if total > 0 {
        m.insert(
            "connect_share_pct".into(),
            100.0 * connect as f64 / total as f64,
        );
    }
    Ok(m)
}
