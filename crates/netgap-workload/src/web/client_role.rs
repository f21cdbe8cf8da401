//! A host's web clients as a role: prepared before the barrier, run over
//! the window on worker threads in the agent (or in a load generator
//! child under the preload library), and their outcomes reduced to flow
//! reports.

use super::fileset::Zipf;
use super::load_child::{child_evidence, run_child, LoadJob, LoadReport, Reported};
use super::server_role::relay_for;
use super::{bad, client, fileset, refused, Params, Trace, MAX_CLIENT_WORKERS};
use crate::role::{metered, window, OpenRole, ReadyRole, RoleContext, RoleError, RoleResult, Stop};
use crate::service::{self, RunDir};
use netgap_core::cpu::CpuUsage;
use netgap_core::spec::Mode;
use netgap_core::stats::LatencyHistogram;
use netgap_proto::workload::{FlowReport, WorkloadOutcome};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::Programs;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prepares this host's clients: nothing is connected before the barrier
/// (a request's connection is part of a transaction when one is opened per
/// request, and a kept-alive one opens with the first request).
pub(super) fn open_clients(
    p: &Params,
    ctx: &RoleContext<'_>,
) -> Result<Box<dyn OpenRole>, RoleError> {
    let spec = ctx.spec;
    let target = spec
        .targets
        .first()
        .ok_or_else(|| refused("a client role needs a target"))?;
    let target: SocketAddr = target
        .parse()
        .map_err(|_| bad(format!("the target {target:?} is not IP:PORT")))?;
    let set = Arc::new(p.fileset());
    let zipf = (p.trace == Trace::Zipf).then(|| Arc::new(Zipf::new(&set, p.alpha)));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = cpus.clamp(1, MAX_CLIENT_WORKERS);
    // Every client is a descriptor of this one process, besides each
    // worker's epoll and the agent's own: refuse a share it cannot open
    // before any connects.
    let fds = u64::from(spec.flows) + workers as u64 + netgap_transport::flows::limits::SPARE_FDS;
    netgap_transport::flows::ensure_fd_limit(fds)
        .map_err(|e| refused(format!("{} clients on this host: {e}", spec.flows)))?;
    // Each client host draws its own request sequence.
    let host_key = service::host_name()
        .bytes()
        .fold(0u64, |h, b| fileset::mix64(h ^ u64::from(b)));
    let cfg = client::ClientConfig {
        target,
        bind_ip: spec.bind_ips.first().copied(),
        flows: spec.flows as usize,
        workers,
        keepalive: !p.connection_per_request,
        fileset: set,
        zipf,
        verify_fraction: p.verify_fraction,
        seed: fileset::mix64(p.seed ^ host_key),
        io_timeout: Duration::from_millis(u64::from(spec.point.io_timeout_ms.max(1))),
        poll: spec.point.mode == Mode::Poll,
        buffer: netgap_transport::buffer::BufferLayout::of_options(&spec.point.options).map_err(
            |e| RoleError::Params {
                workload: "web",
                detail: format!("message buffers: {e}"),
            },
        )?,
    };
    let (warmup, duration) = window(spec);
    // Under the preload library the clients run in a child process of
    // their own, started with the library, as the user the server runs as.
    let programs = netgap_transport::programs(&spec.point.transport);
    let child = if programs.under_library() {
        let library = crate::preload::library_path().map_err(refused)?;
        let dir = RunDir::new(ctx.dirs, "web-load").map_err(refused)?;
        let relay = if programs == Programs::LibraryWithRelay {
            Some(std::sync::Arc::new(relay_for(ctx, &dir, spec.flows)?))
        } else {
            None
        };
        let job = LoadJob {
            params: p.clone(),
            target,
            bind_ip: cfg.bind_ip,
            flows: spec.flows,
            workers,
            seed: cfg.seed,
            io_timeout_ms: u64::try_from(cfg.io_timeout.as_millis()).unwrap_or(u64::MAX),
            poll: cfg.poll,
            warmup_ns: u64::try_from(warmup.as_nanos()).unwrap_or(u64::MAX),
            duration_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
        };
        Some(LoadChild {
            library,
            stack: crate::preload::LibraryStack::of(&ctx.spec.point),
            dir,
            job,
            relay,
        })
    } else {
        None
    };
    Ok(Box::new(ClientRole {
        cfg,
        warmup,
        duration,
        stop: ctx.stop.clone(),
        child,
    }))
}

/// This host's clients, ready.
struct ClientRole {
    cfg: client::ClientConfig,
    warmup: Duration,
    duration: Duration,
    stop: Stop,
    /// Under the preload library: the load generator's child.
    child: Option<LoadChild>,
}

/// The load generator's child process under the preload library, to
/// start.
struct LoadChild {
    library: std::path::PathBuf,
    /// The library's stack (`shm` or `xdp`), direct or not.
    stack: crate::preload::LibraryStack,
    /// The child's run directory.
    dir: RunDir,
    job: LoadJob,
    /// The host's relay, for `-t xdp`: its CPU counts as the clients'.
    relay: Option<std::sync::Arc<crate::preload::RelayGuard>>,
}

impl OpenRole for ClientRole {
    fn addrs(&self) -> Vec<String> {
        Vec::new()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

/// What a host's clients did over the window, wherever they ran.
struct Ran {
    /// The role's CPU over the window (the child's and the relay's
    /// counted as its own).
    cpu: CpuUsage,
    clients: Vec<Reported>,
    /// The window's latencies, all clients.
    buckets: Vec<[u64; 2]>,
    window_ns: u64,
    /// The preload library's figures, when the clients ran under it.
    metrics: BTreeMap<String, f64>,
    /// What the library's log notes, when the clients ran under it.
    evidence: Vec<String>,
}

impl ReadyRole for ClientRole {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let ClientRole {
            cfg,
            warmup,
            duration,
            stop,
            child,
        } = *self;
        let ran = match child {
            None => run_here(&cfg, warmup, duration, &stop)?,
            Some(child) => run_in_child(child, warmup, duration, &stop)?,
        };
        summary(ran, &cfg.target, &stop)
    }
}

/// Runs the clients on worker threads of the agent.
fn run_here(
    cfg: &client::ClientConfig,
    warmup: Duration,
    duration: Duration,
    stop: &Stop,
) -> Result<Ran, RoleError> {
    let flag = stop.flag();
    let (cpu, ran) = metered(Instant::now(), warmup, duration, stop, || {
        client::run(cfg, warmup, duration, &flag)
    })?;
    let (outcomes, window_ns) = ran.map_err(refused)?;
    let mut hist = LatencyHistogram::new();
    for o in &outcomes {
        o.hist.merge_into(&mut hist);
    }
    let clients: Vec<Reported> = outcomes.iter().map(Reported::of).collect();
    Ok(Ran {
        cpu,
        clients,
        buckets: hist.buckets(),
        window_ns,
        metrics: BTreeMap::new(),
        evidence: Vec::new(),
    })
}

/// Runs the clients in the load generator's child under the preload
/// library, metering its CPU (and the relay's) as the role's own.
fn run_in_child(
    child: LoadChild,
    warmup: Duration,
    duration: Duration,
    stop: &Stop,
) -> Result<Ran, RoleError> {
    let LoadChild {
        library,
        stack,
        dir,
        job,
        relay,
    } = child;
    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    let relay_cpu = relay.clone();
    let t0 = Instant::now();
    // The child's CPU counts as the role's own, from when its
    // pid is known.
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
        .spawn(move || {
            crate::role::meter_window_counting(
                t0 + warmup,
                t0 + warmup + duration,
                &meter_stop,
                &extra,
            )
        })
        .map_err(|source| RoleError::Thread {
            what: "the CPU meter",
            source,
        })?;
    let ran = run_child(&library, &stack, &dir, "web-load", &job, stop, &pid_tx);
    let (cpu, _) = meter.join().map_err(|_| RoleError::Panicked {
        what: "the CPU meter".into(),
    })?;
    let (out, log) = ran?;
    let report: LoadReport = serde_json::from_slice(&out)
        .map_err(|e| refused(format!("the load generator's report: {e}")))?;
    let mut metrics = BTreeMap::new();
    for (k, v) in log.record_metrics() {
        metrics.insert(k.into(), v);
    }
    drop(dir);
    drop(relay);
    Ok(Ran {
        cpu,
        clients: report.clients,
        buckets: report.buckets,
        window_ns: report.window_ns,
        metrics,
        evidence: child_evidence(&log),
    })
}

/// The role's result from what its clients did: a flow report per
/// client and the summed figures; refused when no client completed a
/// transaction with `target` and the role was not stopped.
fn summary(ran: Ran, target: &SocketAddr, stop: &Stop) -> Result<RoleResult, RoleError> {
    let Ran {
        cpu,
        clients: outcomes,
        buckets,
        window_ns,
        metrics: mut m,
        evidence,
    } = ran;
    let mut flows = Vec::with_capacity(outcomes.len());
    let (mut rx, mut tx) = (0, 0);
    let mut last_error = None;
    for o in &outcomes {
        rx += o.bytes_rx;
        tx += o.bytes_tx;
        for (k, v) in [
            ("transactions", o.transactions),
            ("payload_bytes", o.window_body_bytes),
            ("errors", o.errors),
            ("checked", o.checked),
            ("verified", o.verified),
            ("connections", o.connections),
        ] {
            *m.entry(k.into()).or_insert(0.0) += v as f64;
        }
        if o.last_error.is_some() {
            last_error.clone_from(&o.last_error);
        }
        flows.push(FlowReport {
            index: o.index,
            bytes_tx: o.bytes_tx,
            bytes_rx: o.bytes_rx,
            window_bytes_rx: o.window_body_bytes,
            round_trips: o.transactions,
            percentiles: o.percentiles.clone(),
            errors: o.errors,
        });
    }
    if !stop.is_set() && outcomes.iter().all(|o| o.transactions == 0) {
        // What the clients moved at all tells a server that never answered
        // from connections that never opened (a lost SYN waits a second).
        return Err(refused(format!(
            "no client completed a transaction with {} in the window ({} clients sent {} B and received {} B in all){}",
            target,
            outcomes.len(),
            tx,
            rx,
            last_error.map_or(String::new(), |e| format!(" (last error: {e})"))
        )));
    }
    Ok(RoleResult {
        flows,
        buckets,
        outcome: WorkloadOutcome {
            window_ns,
            cpu,
            peak_rss_kib: peak_rss_kib(),
            processes: None,
            bytes_rx: rx,
            bytes_tx: tx,
            datagrams: None,
            metrics: m,
            services: Vec::new(),
            // Within what an outcome may carry, on a character's edge.
            last_error: last_error.map(|e| {
                e.char_indices()
                    .take_while(|(i, c)| i + c.len_utf8() <= 400)
                    .map(|(_, c)| c)
                    .collect()
            }),
            data_window_ns: None,
            evidence,
        },
    })
}
