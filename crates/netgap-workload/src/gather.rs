//! `gather`: one client on the first host collects from every other host,
//! as Ganglia's collector does (seeds 000, 002; Figure 13): for each host
//! it connects, reads the whole answer until the host closes, and
//! disconnects; a gather is done when every host has answered. Hosts are
//! asked one after another (`sequential`, as the studies) or all at once
//! (`parallel`). The headline is the time of one full gather; beside it
//! the connection-setup time and its share of each host's exchange.
//!
//! The answering side is real gmond on every host (`--responder gmond`,
//! started through each host's agent, its XML parsed and its hosts and
//! metrics counted) or netgap's own responder (`--responder builtin`),
//! which answers each connection with the point's size of bytes over any
//! cross-host transport with connections, so connection cost can be
//! compared across stacks.

use super::options::{OptionKind, WorkloadArgs, WorkloadOption};
use super::place::{HostView, Placement, RolePlace};
use super::role::{
    find_transport, meter_window, meter_window_counting, metered, parse_params, per_flow, window,
    OpenRole, ReadyRole, RoleContext, RoleError, RoleResult, Stop, PER_FLOW_BYTES, STOP_TICK,
};
use super::web::fileset::mix64;
use super::{CountFlag, FlowSample, Refused, Workload};
use crate::service::{self, gmond, RunDir, Running};
use crate::About;
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::dataproof::DataToken;
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec};
use netgap_transport::buffer::{AlignedBuffer, BufferLayout};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::{FlowConfig, FlowError, Programs, Transport, TransportError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NAME: &str = "gather";

/// Most hosts one gather reads from.
const MAX_SOURCES: u32 = 1024;
/// Largest answer of the built-in responder, bytes.
const MAX_ANSWER_BYTES: u64 = 16 * 1024 * 1024;
/// Largest gmond answer read, bytes.
const MAX_GMOND_BYTES: usize = 4 * 1024 * 1024;
/// How long a server keeps answering after the window.
const SERVER_GRACE: Duration = Duration::from_millis(500);

static RESPONDER: WorkloadOption = WorkloadOption {
    flag: "responder",
    kind: OptionKind::Choice(&["builtin", "gmond"]),
    value_name: "NAME[,NAME]",
    help: "gather: what answers on every host: builtin (netgap's responder, the point's size over the chosen transport) or gmond (Debian's ganglia-monitor, over tcp, or through the preload library over shm or xdp); a list gives one point per responder [default: builtin]",
    axis: true,
};
static GATHER_MODE: WorkloadOption = WorkloadOption {
    flag: "gather-mode",
    kind: OptionKind::Choice(&["sequential", "parallel"]),
    value_name: "MODE[,MODE]",
    help: "gather: ask the hosts one after another (as Ganglia) or all at once; a list gives one point per mode [default: sequential]",
    axis: true,
};
static OPTIONS: &[&WorkloadOption] = &[&RESPONDER, &GATHER_MODE];

/// The `gather` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gather;

/// What answers on every host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Responder {
    /// netgap's own responder.
    Builtin,
    /// Ganglia's gmond.
    Gmond,
}

/// What every role of a `gather` point gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// What answers.
    pub responder: Responder,
    /// The built-in responder's answer, bytes.
    pub answer_bytes: u64,
    /// Ask every host at once.
    pub parallel: bool,
    /// `-t shm`: gmond and the gatherer run under the preload library.
    #[serde(default)]
    pub preload: bool,
}

fn refused(detail: impl std::fmt::Display) -> RoleError {
    RoleError::Refused {
        workload: NAME,
        detail: detail.to_string(),
    }
}

/// What `Gather` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "one client connects to every other host, reads its whole answer (gmond XML or a built-in responder), disconnects; time per gather",
    metric: Metric::Other {
        key: "gather_time_ms",
        combine: netgap_core::metric::Combine::Max,
    },
    count: CountFlag::Hosts,
    max_flows: MAX_SOURCES,
    takes_bidir: false,
};

impl Workload for Gather {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        8 * 1024
    }

    /// The built-in responder needs a transport with connections that
    /// crosses hosts.
    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        if transport.capabilities().programs.under_library() {
            // gmond over the preload library (the built-in responder is
            // refused at placement, which sees the responder).
            return crate::preload::library_path()
                .map(|_| ())
                .map_err(|e| Refused(format!("{NAME} -t {}: {e}", spec.transport)));
        }
        super::check_cross_host(NAME, spec, transport)?;
        let connected = |t: &dyn Transport| {
            t.capabilities().cross_host
                && t.capabilities().reliable
                && !t.engine_path().is_some_and(|p| p.datagrams())
        };
        if !connected(transport) {
            let ok: Vec<&str> = netgap_transport::registry()
                .iter()
                .filter(|t| connected(**t))
                .map(|t| t.name())
                .collect();
            return Err(Refused(format!(
                "{NAME} measures connection setup, which {} does not have; use {}",
                spec.transport,
                ok.join(", ")
            )));
        }
        if spec.size_bytes == 0 || spec.size_bytes > MAX_ANSWER_BYTES {
            return Err(Refused(format!(
                "{NAME}: the responder's answer must be between 1 byte and 16M"
            )));
        }
        Ok(())
    }

    fn options(&self) -> &'static [&'static WorkloadOption] {
        OPTIONS
    }

    fn params(&self, spec: &PointSpec, args: &WorkloadArgs) -> serde_json::Value {
        let responder = match args.str("responder") {
            Some("gmond") => Responder::Gmond,
            _ => Responder::Builtin,
        };
        serde_json::json!(Params {
            responder,
            answer_bytes: spec.size_bytes,
            parallel: args.str("gather-mode") == Some("parallel"),
            // gmond over the preload library: on one host over shm, across
            // hosts over xdp through the hosts' relays (netgap's own
            // responder, which aims at IP:PORT, is refused at placement).
            preload: netgap_transport::programs(&spec.transport).under_library(),
        })
    }

    /// Every host but the first answers one flow; the first host's client
    /// reads them all.
    fn place(
        &self,
        params: &serde_json::Value,
        _count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        if params.get("preload").and_then(serde_json::Value::as_bool) == Some(true)
            && params.get("responder").and_then(serde_json::Value::as_str) != Some("gmond")
        {
            return Err(Refused(format!(
                "{NAME} over shm or xdp runs gmond and the gatherer under the preload library (netgap's own responder is aimed at IP:PORT, which xdp's flows have not); add --responder gmond"
            )));
        }
        if hosts.len() < 2 {
            return Err(Refused(format!(
                "{NAME}: no host to gather from: give at least two hosts"
            )));
        }
        let n = (hosts.len() - 1) as u32;
        if n > MAX_SOURCES {
            return Err(Refused(format!(
                "{NAME}: at most {MAX_SOURCES} hosts to gather from"
            )));
        }
        let mut roles: Vec<RolePlace> = (0..n)
            .map(|f| RolePlace {
                host: f as usize + 1,
                side: WorkloadRole::Server,
                flows: vec![f],
                connects_to: None,
                listen_ips: None,
                bind_ips: None,
            })
            .collect();
        roles.push(RolePlace {
            host: 0,
            side: WorkloadRole::Client,
            flows: (0..n).collect(),
            connects_to: Some(0),
            listen_ips: None,
            bind_ips: None,
        });
        Ok(Placement {
            roles,
            flows: n,
            links: Vec::new(),
        })
    }

    /// The client holds one answer buffer per host; a responder one answer.
    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        let answer = spec.point.size_bytes.max(MAX_GMOND_BYTES as u64);
        answer
            .saturating_add(PER_FLOW_BYTES)
            .saturating_mul(u64::from(spec.flows.max(1)))
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let p: Params = parse_params(NAME, ctx.spec)?;
        if p.answer_bytes == 0 || p.answer_bytes > MAX_ANSWER_BYTES {
            return Err(RoleError::Params {
                workload: NAME,
                detail: format!("answer_bytes {} is outside 1 to 16M", p.answer_bytes),
            });
        }
        ctx.limits.check_message_bytes(p.answer_bytes)?;
        if ctx.spec.flows == 0 || ctx.spec.flows > MAX_SOURCES {
            return Err(refused(format!(
                "{} flows is outside 1 to {MAX_SOURCES}",
                ctx.spec.flows
            )));
        }
        if p.responder == Responder::Gmond
            && netgap_transport::programs(&ctx.spec.point.transport) == Programs::No
        {
            return Err(refused(format!(
                "gmond answers over the host's TCP, or through the preload library over shm or xdp; use -t {}",
                netgap_transport::program_transports()
            )));
        }
        match ctx.spec.role {
            WorkloadRole::Server => open_server(&p, &ctx),
            WorkloadRole::Client => open_client(&p, &ctx),
        }
    }

    /// Every flow shares the gather's time: the client's window is the sum
    /// of the measured gathers' times, so window / gathers is their mean.
    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        if side == WorkloadRole::Server {
            return FlowSample::default();
        }
        let value = if report.round_trips == 0 {
            f64::NAN
        } else {
            window_ns as f64 / report.round_trips as f64 / 1e6
        };
        FlowSample {
            value: Some(value),
            bytes_tx: report.bytes_tx,
            bytes_rx: report.bytes_rx,
            window_bytes: report.window_bytes_rx,
            percentiles: report.percentiles.clone(),
        }
    }

    fn percentiles(&self, hist: &LatencyHistogram) -> Option<Percentiles> {
        hist.percentiles_us(1.0)
    }
}

/// The answer of the built-in responder: `size` bytes anyone can
/// regenerate.
fn answer(size: u64) -> Vec<u8> {
    (0..size)
        .map(|i| mix64(i / 8).to_le_bytes()[(i % 8) as usize])
        .collect()
}

/// A responder on one host.
enum Serving {
    /// gmond, running, and for `-t xdp` the host's relay.
    Gmond(Box<Running>, Option<crate::preload::RelayGuard>),
    /// netgap's responder: its listener, answered from a thread in `run`.
    Builtin {
        listener: Box<dyn netgap_transport::Listener>,
        /// Sent from a message buffer placed as the point asks.
        answer: AlignedBuffer,
        token: DataToken,
    },
}

struct ServerRole {
    serving: Serving,
    addr: String,
    warmup: Duration,
    duration: Duration,
    stop: Stop,
}

fn open_server(p: &Params, ctx: &RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
    let ip: IpAddr = ctx
        .spec
        .listen_ips
        .first()
        .copied()
        .unwrap_or(ctx.control_ip);
    let (warmup, duration) = window(ctx.spec);
    let (serving, addr) = match p.responder {
        Responder::Gmond => {
            if !ctx.services {
                return Err(refused(service::ServiceError::NotAllowed));
            }
            let mut dir = RunDir::new(ctx.dirs, gmond::NAME).map_err(refused)?;
            if p.preload {
                dir.preload(&ctx.spec.point.transport).map_err(refused)?;
            }
            let relay = if p.preload
                && netgap_transport::programs(&ctx.spec.point.transport)
                    == Programs::LibraryWithRelay
            {
                Some(super::web::server_role::relay_for(
                    ctx,
                    &dir,
                    ctx.spec.flows,
                )?)
            } else {
                None
            };
            let port = service::free_tcp_port(ip).map_err(refused)?;
            let addr = SocketAddr::new(ip, port);
            let running = gmond::start(dir, addr).map_err(refused)?;
            running
                .wait_answering(addr, ctx.stop, None, |a| {
                    let xml = service::read_all(a, MAX_GMOND_BYTES)?;
                    let answer = gmond::parse(&xml)?;
                    if answer.hosts.is_empty() || answer.metrics == 0 {
                        return Err("its answer names no host with metrics yet".into());
                    }
                    Ok(())
                })
                .map_err(refused)?;
            (Serving::Gmond(Box::new(running), relay), addr.to_string())
        }
        Responder::Builtin => {
            let t = find_transport(ctx.spec)?;
            let cfg = FlowConfig::from_spec(&ctx.spec.point);
            let listener = t
                .listen(&cfg, ip)
                .map_err(|source| RoleError::Open { index: 0, source })?;
            let addr = listener.addr();
            let size = usize::try_from(p.answer_bytes).map_err(|_| refused("answer too large"))?;
            let layout = BufferLayout::of_options(&ctx.spec.point.options)
                .map_err(|e| refused(format!("message buffers: {e}")))?;
            let mut sent = AlignedBuffer::zeroed(size, layout);
            sent.copy_from_slice(&answer(size as u64));
            let serving = Serving::Builtin {
                listener,
                answer: sent,
                token: ctx.data_token.clone(),
            };
            (serving, addr)
        }
    };
    Ok(Box::new(ServerRole {
        serving,
        addr,
        warmup,
        duration,
        stop: ctx.stop.clone(),
    }))
}

impl OpenRole for ServerRole {
    fn addrs(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

/// Answers every connection of the built-in responder until `end` or the
/// stop: the connector proves the point's token, gets the answer, and the
/// responder closes. Returns (connections answered, bytes sent).
fn respond(
    listener: &mut dyn netgap_transport::Listener,
    answer: &[u8],
    token: &DataToken,
    end: Instant,
    stop: &Stop,
) -> (u64, u64) {
    let (mut answered, mut sent) = (0u64, 0u64);
    while Instant::now() < end && !stop.is_set() {
        let mut flow = match listener.accept(STOP_TICK) {
            Ok(f) => f,
            Err(TransportError::AcceptTimeout { .. }) => continue,
            Err(_) => {
                stop.sleep_until(Instant::now() + STOP_TICK);
                continue;
            }
        };
        // A stranger that cannot prove the token gets nothing.
        if netgap_transport::preamble::listener(flow.as_mut(), token).is_err() {
            continue;
        }
        if flow.send_all(answer).is_ok() {
            answered += 1;
            sent += answer.len() as u64;
        }
    }
    (answered, sent)
}

impl ReadyRole for ServerRole {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let ServerRole {
            serving,
            addr: _,
            warmup,
            duration,
            stop,
        } = *self;
        let t0 = Instant::now();
        let end = t0 + warmup + duration + SERVER_GRACE;
        let (cpu, services, sent) = match serving {
            Serving::Gmond(running, relay) => {
                // gmond answers the gathers (and the relay carries them
                // under -t xdp): their processes' CPU is the role's.
                let (cpu, _) =
                    meter_window_counting(t0 + warmup, t0 + warmup + duration, &stop, &|| {
                        running.cpu_ns() + relay.as_ref().map_or(0, |r| r.cpu_ns())
                    });
                stop.sleep_until(end);
                let record = running.record().clone();
                drop(running);
                drop(relay);
                (cpu, vec![record], 0)
            }
            Serving::Builtin {
                mut listener,
                answer,
                token,
            } => {
                let (cpu, (_, sent)) = metered(t0, warmup, duration, &stop, || {
                    respond(listener.as_mut(), &answer, &token, end, &stop)
                })?;
                (cpu, Vec::new(), sent)
            }
        };
        Ok(RoleResult {
            flows: Vec::new(),
            buckets: Vec::new(),
            outcome: WorkloadOutcome {
                window_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: 0,
                bytes_tx: sent,
                datagrams: None,
                metrics: BTreeMap::new(),
                services,
                last_error: None,
                data_window_ns: None,
            },
        })
    }
}

/// How the client reaches one host.
#[derive(Clone)]
struct Source {
    addr: String,
    bind_ip: Option<IpAddr>,
}

/// What the client needs to ask any host.
#[derive(Clone)]
struct Asker {
    responder: Responder,
    transport: &'static dyn Transport,
    cfg: FlowConfig,
    token: DataToken,
    /// The built-in responder's answer, to check against.
    expect: std::sync::Arc<Vec<u8>>,
}

/// One host's exchange.
#[derive(Debug, Clone, Copy, Default)]
struct Fetch {
    /// From the start to an open connection, ns: the stack's connect
    /// alone, as the papers timed it.
    connect_ns: u64,
    /// netgap's own authentication of the data connection after it opened
    /// (the preamble, builtin responder only), ns: no part of the
    /// connection a program like Ganglia makes, so timed apart and left out
    /// of the exchange's time and of the connect share.
    handshake_ns: u64,
    /// From the start to the host's close, ns.
    total_ns: u64,
    /// Answer bytes.
    bytes: u64,
}

impl Asker {
    /// Connects to `src`, reads its whole answer into `buf` until it
    /// closes, and disconnects.
    fn fetch(&self, src: &Source, buf: &mut Vec<u8>) -> Result<Fetch, String> {
        buf.clear();
        let t0 = Instant::now();
        let connect_ns;
        let mut handshake_ns = 0;
        match self.responder {
            Responder::Gmond => {
                let sa: SocketAddr = src
                    .addr
                    .parse()
                    .map_err(|_| format!("bad address {}", src.addr))?;
                let s = TcpStream::connect_timeout(&sa, self.cfg.io_timeout)
                    .map_err(|e| format!("connecting to {sa}: {e}"))?;
                connect_ns = elapsed_ns(t0);
                s.set_read_timeout(Some(self.cfg.io_timeout))
                    .map_err(|e| e.to_string())?;
                s.take(MAX_GMOND_BYTES as u64)
                    .read_to_end(buf)
                    .map_err(|e| format!("reading from {sa}: {e}"))?;
                if !buf.starts_with(b"<?xml") {
                    return Err(format!("{sa} answered something other than XML"));
                }
            }
            Responder::Builtin => {
                let mut flow = match src.bind_ip {
                    Some(ip) if self.transport.capabilities().binds_local => {
                        self.transport.connect_from(&self.cfg, &src.addr, ip)
                    }
                    _ => self.transport.connect(&self.cfg, &src.addr),
                }
                .map_err(|e| format!("connecting to {}: {e}", src.addr))?;
                connect_ns = elapsed_ns(t0);
                netgap_transport::preamble::connector(flow.as_mut(), &self.token)
                    .map_err(|e| format!("{}: {e}", src.addr))?;
                handshake_ns = elapsed_ns(t0).saturating_sub(connect_ns);
                let (_, rx) = flow.split();
                let want = self.expect.len();
                buf.resize(want + 1, 0);
                let mut have = 0;
                loop {
                    if have > want {
                        return Err(format!("{} answered more than {want} bytes", src.addr));
                    }
                    match rx.recv_some(&mut buf[have..]) {
                        Ok(n) => have += n,
                        Err(FlowError::Closed) => break,
                        Err(e) => return Err(format!("reading from {}: {e}", src.addr)),
                    }
                }
                buf.truncate(have);
                if buf.as_slice() != self.expect.as_slice() {
                    return Err(format!(
                        "{} answered {have} bytes that are not the {want} it was to send",
                        src.addr
                    ));
                }
            }
        }
        Ok(Fetch {
            connect_ns,
            handshake_ns,
            total_ns: elapsed_ns(t0),
            bytes: buf.len() as u64,
        })
    }
}

fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

struct ClientRole {
    asker: Asker,
    sources: Vec<Source>,
    parallel: bool,
    warmup: Duration,
    duration: Duration,
    stop: Stop,
    /// Under the preload library: the library, the child's run directory,
    /// its job, and for `-t xdp` the host's relay.
    child: Option<GatherChild>,
}

/// The gatherer's child process under the preload library, to start.
struct GatherChild {
    library: std::path::PathBuf,
    /// The library's stack (`shm` or `xdp`).
    stack: String,
    /// The child's run directory.
    dir: RunDir,
    job: GatherJob,
    /// The host's relay, for `-t xdp`: its CPU counts as the gatherer's.
    relay: Option<std::sync::Arc<crate::preload::RelayGuard>>,
}

/// What the agent hands its gatherer child (`netgap gather-load`) on
/// standard input: gmond's hosts and how to ask them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GatherJob {
    point: PointSpec,
    token: DataToken,
    sources: Vec<(String, Option<IpAddr>)>,
    parallel: bool,
    warmup_ns: u64,
    duration_ns: u64,
}

/// What the gatherer child reports: its role's result.
#[derive(Debug, Serialize, Deserialize)]
struct GatherReport {
    flows: Vec<FlowReport>,
    buckets: Vec<[u64; 2]>,
    outcome: WorkloadOutcome,
}

/// Gathers from gmond as `job` says and reports the result: the body of
/// the hidden `netgap gather-load` command, which an agent starts under
/// the preload library. Reads the job on standard input, writes one JSON
/// report on standard output.
pub fn run_gather_child() -> Result<(), String> {
    let mut text = String::new();
    std::io::stdin()
        .take(16 << 20)
        .read_to_string(&mut text)
        .map_err(|e| format!("gather-load: reading the job: {e}"))?;
    let job: GatherJob =
        serde_json::from_str(&text).map_err(|e| format!("gather-load: the job: {e}"))?;
    let transport = netgap_transport::find(&job.point.transport)
        .ok_or_else(|| format!("gather-load: no transport {}", job.point.transport))?;
    let role = ClientRole {
        asker: Asker {
            responder: Responder::Gmond,
            transport,
            cfg: FlowConfig::from_spec(&job.point),
            token: job.token,
            expect: std::sync::Arc::new(Vec::new()),
        },
        sources: job
            .sources
            .into_iter()
            .map(|(addr, bind_ip)| Source { addr, bind_ip })
            .collect(),
        parallel: job.parallel,
        warmup: Duration::from_nanos(job.warmup_ns),
        duration: Duration::from_nanos(job.duration_ns),
        stop: Stop::new(),
        child: None,
    };
    let r = Box::new(role)
        .run()
        .map_err(|e| format!("gather-load: {e}"))?;
    let report = GatherReport {
        flows: r.flows,
        buckets: r.buckets,
        outcome: r.outcome,
    };
    let out =
        serde_json::to_string(&report).map_err(|e| format!("gather-load: the report: {e}"))?;
    println!("{out}");
    Ok(())
}

/// Runs the gatherer in a child under the preload library: the child's
/// result, with the CPU of the agent and the child over the window, and
/// the library log's counts among its metrics.
fn gather_in_child(child: GatherChild, stop: &Stop) -> Result<RoleResult, RoleError> {
    let GatherChild {
        library,
        stack,
        dir,
        job,
        relay,
    } = child;
    let relay_cpu = relay.clone();
    let (pid_tx, pid_rx) = mpsc::channel();
    let t0 = Instant::now();
    let (w0, w1) = (
        t0 + Duration::from_nanos(job.warmup_ns),
        t0 + Duration::from_nanos(job.warmup_ns.saturating_add(job.duration_ns)),
    );
    let pid = std::sync::Mutex::new((pid_rx, None::<u32>));
    let extra = move || {
        let mut p = pid
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if p.1.is_none() {
            p.1 = p.0.try_recv().ok();
        }
        p.1.map_or(0, service::tree_cpu_ns) + relay_cpu.as_ref().map_or(0, |r| r.cpu_ns())
    };
    let meter_stop = stop.clone();
    let meter = std::thread::Builder::new()
        .name("cpu meter".into())
        .spawn(move || super::role::meter_window_counting(w0, w1, &meter_stop, &extra))
        .map_err(|source| RoleError::Thread {
            what: "the CPU meter",
            source,
        })?;
    let ran = super::web::load_child::run_child(
        &library,
        &stack,
        &dir,
        "gather-load",
        &job,
        stop,
        &pid_tx,
    );
    let (cpu, _) = meter.join().map_err(|_| RoleError::Panicked {
        what: "the CPU meter".into(),
    })?;
    let (out, log) = ran?;
    let mut report: GatherReport =
        serde_json::from_slice(&out).map_err(|e| refused(format!("the gatherer's report: {e}")))?;
    report.outcome.cpu = cpu;
    let m = &mut report.outcome.metrics;
    for (k, v) in log.record_metrics() {
        m.insert(k.into(), v);
    }
    drop(dir);
    drop(relay);
    Ok(RoleResult {
        flows: report.flows,
        buckets: report.buckets,
        outcome: report.outcome,
    })
}

fn open_client(p: &Params, ctx: &RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
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
                Some(std::sync::Arc::new(super::web::server_role::relay_for(
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
            stack: spec.point.transport.clone(),
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
type Gathered = Result<Vec<Fetch>, String>;

/// One host's exchange and its answer, or why it failed.
type HostAnswer = Result<(Fetch, Vec<u8>), String>;

/// Asks every host at once, from one thread per host that lives for the
/// whole run, so a gather costs no thread start.
struct Parallel {
    go: Vec<mpsc::Sender<()>>,
    done: mpsc::Receiver<(usize, HostAnswer)>,
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
        let mut totals = Totals {
            per_host: (0..n)
                .map(|_| (0, 0, 0, netgap_core::stats::FlowHistogram::new()))
                .collect(),
            hist: LatencyHistogram::new(),
            bytes_rx: vec![0; n],
            ..Totals::default()
        };
        let result = std::thread::scope(|scope| -> Result<(), String> {
            let par = if parallel {
                let (done_tx, done) = mpsc::channel();
                let mut go = Vec::with_capacity(n);
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
                        .map_err(|e| format!("starting a gather thread: {e}"))?;
                }
                Some(Parallel { go, done })
            } else {
                None
            };
            while Instant::now() < w1 && !stop.is_set() {
                let start = Instant::now();
                let fetched: Gathered = match &par {
                    None => sources
                        .iter()
                        .zip(bufs.iter_mut())
                        .map(|(s, b)| asker.fetch(s, b))
                        .collect(),
                    Some(p) => {
                        for g in &p.go {
                            g.send(())
                                .map_err(|_| "a gather thread ended".to_string())?;
                        }
                        let mut got = vec![Fetch::default(); n];
                        let mut first_err = None;
                        for _ in 0..n {
                            let (i, r) = p
                                .done
                                .recv()
                                .map_err(|_| "a gather thread ended".to_string())?;
                            match r {
                                Ok((f, b)) => {
                                    got[i] = f;
                                    bufs[i] = b;
                                }
                                Err(e) => first_err = first_err.or(Some(e)),
                            }
                        }
                        match first_err {
                            Some(e) => Err(e),
                            None => Ok(got),
                        }
                    }
                };
                let end = Instant::now();
                let fetched = fetched?;
                for (i, f) in fetched.iter().enumerate() {
                    totals.bytes_rx[i] += f.bytes;
                }
                if start >= w0 && end <= w1 {
                    let ns = u64::try_from((end - start).as_nanos()).unwrap_or(u64::MAX);
                    totals.gathers += 1;
                    totals.gather_ns += ns;
                    totals.hist.record_ns(ns);
                    for (i, f) in fetched.iter().enumerate() {
                        let h = &mut totals.per_host[i];
                        h.0 += f.bytes;
                        h.1 += f.connect_ns;
                        h.2 += f.total_ns;
                        totals.handshake_ns += f.handshake_ns;
                        h.3.record_ns(f.total_ns);
                    }
                }
            }
            Ok(())
        });
        let (cpu, _) = meter.join().map_err(|_| RoleError::Panicked {
            what: "the CPU meter".into(),
        })?;
        result.map_err(refused)?;
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
        let flows = totals
            .per_host
            .iter()
            .enumerate()
            .map(|(i, h)| FlowReport {
                index: i as u32,
                bytes_tx: 0,
                bytes_rx: totals.bytes_rx[i],
                window_bytes_rx: h.0,
                round_trips: totals.gathers,
                percentiles: h.3.percentiles_us(1.0),
                errors: 0,
            })
            .collect();
        Ok(RoleResult {
            flows,
            buckets: totals.hist.buckets(),
            outcome: WorkloadOutcome {
                // The measured gathers' time: the headline is this over
                // their count (see `sample`).
                window_ns: totals.gather_ns,
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: totals.bytes_rx.iter().sum(),
                bytes_tx: 0,
                datagrams: None,
                metrics: m,
                services: Vec::new(),
                last_error: None,
                data_window_ns: None,
            },
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    use crate::place::test_hosts as hosts;

    #[test]
    fn every_other_host_answers_the_first() {
        let p = Gather.place(&serde_json::json!({}), 0, &hosts(4)).unwrap();
        p.validate(4).unwrap();
        assert_eq!(p.roles.len(), 4);
        assert_eq!(p.roles[3].host, 0);
        assert_eq!(p.roles[3].flows, vec![0, 1, 2]);
        assert_eq!(p.roles[1].flows, vec![1]);
        assert!(Gather.place(&serde_json::json!({}), 0, &hosts(1)).is_err());
    }

    #[test]
    fn the_headline_is_the_mean_gather_time() {
        let r = FlowReport {
            index: 0,
            bytes_tx: 0,
            bytes_rx: 0,
            window_bytes_rx: 0,
            round_trips: 4,
            percentiles: None,
            errors: 0,
        };
        let s = Gather.sample(WorkloadRole::Client, &r, 8_000_000);
        assert_eq!(s.value, Some(2.0));
    }
}
