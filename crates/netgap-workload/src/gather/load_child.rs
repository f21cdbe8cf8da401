//! The gatherer in a child process under the preload library (`netgap
//! gather-load`): the job the agent hands it, the report it writes back,
//! and the agent's side that starts it and waits for it.

use super::client_role::ClientRole;
use super::fetch::{Asker, Source};
use super::{refused, Responder};
use crate::role::{ReadyRole, RoleError, RoleResult, Stop};
use crate::service::{self, RunDir};
use crate::web::load_child::LoadChildError;
use netgap_core::spec::PointSpec;
use netgap_proto::dataproof::DataToken;
use netgap_proto::workload::{FlowReport, WorkloadOutcome};
use netgap_transport::FlowConfig;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::net::IpAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The gatherer's child process under the preload library, to start.
pub(super) struct GatherChild {
    pub(super) library: std::path::PathBuf,
    /// The library's stack (`shm` or `xdp`), direct or not.
    pub(super) stack: crate::preload::LibraryStack,
    /// The child's run directory.
    pub(super) dir: RunDir,
    pub(super) job: GatherJob,
    /// The host's relay, for `-t xdp`: its CPU counts as the gatherer's.
    pub(super) relay: Option<std::sync::Arc<crate::preload::RelayGuard>>,
}

/// What the agent hands its gatherer child (`netgap gather-load`) on
/// standard input: gmond's hosts and how to ask them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GatherJob {
    pub(super) point: PointSpec,
    pub(super) token: DataToken,
    pub(super) sources: Vec<(String, Option<IpAddr>)>,
    pub(super) parallel: bool,
    pub(super) warmup_ns: u64,
    pub(super) duration_ns: u64,
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
pub fn run_gather_child() -> Result<(), LoadChildError> {
    let mut text = String::new();
    std::io::stdin()
        .take(16 << 20)
        .read_to_string(&mut text)
        .map_err(|source| LoadChildError::ReadJob {
            command: "gather-load",
            source,
        })?;
    let job: GatherJob = serde_json::from_str(&text).map_err(|source| LoadChildError::Job {
        command: "gather-load",
        source,
    })?;
    let transport = netgap_transport::find(&job.point.transport).ok_or_else(|| {
        LoadChildError::NoTransport {
            name: job.point.transport.clone(),
        }
    })?;
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
    let r = Box::new(role).run().map_err(LoadChildError::Gather)?;
    let report = GatherReport {
        flows: r.flows,
        buckets: r.buckets,
        outcome: r.outcome,
    };
    let out = serde_json::to_string(&report).map_err(|source| LoadChildError::Report {
        command: "gather-load",
        source,
    })?;
    println!("{out}");
    Ok(())
}

/// Runs the gatherer in a child under the preload library: the child's
/// result, with the CPU of the agent and the child over the window, and
/// the library log's counts among its metrics.
pub(super) fn gather_in_child(child: GatherChild, stop: &Stop) -> Result<RoleResult, RoleError> {
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
        .spawn(move || crate::role::meter_window_counting(w0, w1, &meter_stop, &extra))
        .map_err(|source| RoleError::Thread {
            what: "the CPU meter",
            source,
        })?;
    let ran = crate::web::load_child::run_child(
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
    report.outcome.evidence = crate::web::load_child::child_evidence(&log);
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
