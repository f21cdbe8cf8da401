//! The load generator child (`netgap web-load`, `netgap gather-load`): the
//! job an agent hands it on standard input, the report it writes back,
//! and the agent's side that starts it under the preload library and
//! waits for it.

use super::fileset::Zipf;
use super::{client, refused, Params, Trace, MAX_CLIENT_WORKERS};
use crate::role::{RoleError, Stop};
use crate::service::{self, RunDir};
use netgap_core::stats::{LatencyHistogram, Percentiles};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// What the agent hands its load generator child (`netgap web-load`) on
/// standard input.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoadJob {
    pub(super) params: Params,
    pub(super) target: SocketAddr,
    pub(super) bind_ip: Option<IpAddr>,
    pub(super) flows: u32,
    pub(super) workers: usize,
    pub(super) seed: u64,
    pub(super) io_timeout_ms: u64,
    pub(super) poll: bool,
    pub(super) warmup_ns: u64,
    pub(super) duration_ns: u64,
}

/// One client's results as a child reports them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Reported {
    pub(super) index: u32,
    pub(super) transactions: u64,
    pub(super) window_body_bytes: u64,
    pub(super) bytes_tx: u64,
    pub(super) bytes_rx: u64,
    pub(super) errors: u64,
    pub(super) checked: u64,
    pub(super) verified: u64,
    pub(super) connections: u64,
    pub(super) percentiles: Option<Percentiles>,
    pub(super) last_error: Option<String>,
}

/// What the child writes on standard output when it is done.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LoadReport {
    pub(super) clients: Vec<Reported>,
    /// The window's latencies, all clients: [`LatencyHistogram::buckets`].
    pub(super) buckets: Vec<[u64; 2]>,
    pub(super) window_ns: u64,
}

impl Reported {
    pub(super) fn of(o: &client::ClientOutcome) -> Reported {
        Reported {
            index: o.index,
            transactions: o.transactions,
            window_body_bytes: o.window_body_bytes,
            bytes_tx: o.bytes_tx,
            bytes_rx: o.bytes_rx,
            errors: o.errors,
            checked: o.checked,
            verified: o.verified,
            connections: o.connections,
            percentiles: o.hist.percentiles_us(1.0),
            last_error: o.last_error.clone(),
        }
    }
}

/// Why a load generator child (`netgap web-load`, `netgap gather-load`)
/// failed, one line beginning with its command.
#[derive(Debug, thiserror::Error)]
pub enum LoadChildError {
    /// Its job could not be read from standard input.
    #[error("{command}: reading the job: {source}")]
    ReadJob {
        /// The child's command.
        command: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// Its job does not parse.
    #[error("{command}: the job: {source}")]
    Job {
        /// The child's command.
        command: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// Its report could not be written as JSON.
    #[error("{command}: the report: {source}")]
    Report {
        /// The child's command.
        command: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// The job names a transport this build does not have.
    #[error("gather-load: no transport {name}")]
    NoTransport {
        /// The transport named.
        name: String,
    },
    /// The gatherer failed.
    #[error("gather-load: {0}")]
    Gather(RoleError),
    /// The message buffers' layout is out of range.
    #[error("web-load: message buffers: {0}")]
    Buffers(netgap_transport::buffer::LayoutError),
    /// The clients' descriptors do not fit the process's limit.
    #[error("web-load: {flows} clients: {source}")]
    Descriptors {
        /// The job's clients.
        flows: u32,
        /// Why.
        source: netgap_transport::flows::EngineError,
    },
    /// The clients failed.
    #[error("web-load: {0}")]
    Clients(client::ClientError),
}

/// Runs clients as `job` says and reports them: the body of the hidden
/// `netgap web-load` command, which an agent starts under the preload
/// library. Reads the job on standard input, writes one JSON report on
/// standard output.
pub fn run_load_child() -> Result<(), LoadChildError> {
    use std::io::Read as _;
    let mut text = String::new();
    std::io::stdin()
        .take(1 << 20)
        .read_to_string(&mut text)
        .map_err(|source| LoadChildError::ReadJob {
            command: "web-load",
            source,
        })?;
    let job: LoadJob = serde_json::from_str(&text).map_err(|source| LoadChildError::Job {
        command: "web-load",
        source,
    })?;
    let set = Arc::new(job.params.fileset());
    let zipf =
        (job.params.trace == Trace::Zipf).then(|| Arc::new(Zipf::new(&set, job.params.alpha)));
    let cfg = client::ClientConfig {
        target: job.target,
        bind_ip: job.bind_ip,
        flows: job.flows as usize,
        workers: job.workers.clamp(1, MAX_CLIENT_WORKERS),
        keepalive: !job.params.connection_per_request,
        fileset: set,
        zipf,
        verify_fraction: job.params.verify_fraction,
        seed: job.seed,
        io_timeout: Duration::from_millis(job.io_timeout_ms.max(1)),
        poll: job.poll,
        buffer: netgap_transport::buffer::BufferLayout::of_options(
            &netgap_core::spec::TransportOptions::default(),
        )
        .map_err(LoadChildError::Buffers)?,
    };
    netgap_transport::flows::ensure_fd_limit(
        u64::from(job.flows) + cfg.workers as u64 + netgap_transport::flows::limits::SPARE_FDS,
    )
    .map_err(|source| LoadChildError::Descriptors {
        flows: job.flows,
        source,
    })?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (outcomes, window_ns) = client::run(
        &cfg,
        Duration::from_nanos(job.warmup_ns),
        Duration::from_nanos(job.duration_ns),
        &stop,
    )
    .map_err(LoadChildError::Clients)?;
    let mut hist = LatencyHistogram::new();
    for o in &outcomes {
        o.hist.merge_into(&mut hist);
    }
    let report = LoadReport {
        clients: outcomes.iter().map(Reported::of).collect(),
        buckets: hist.buckets(),
        window_ns,
    };
    let out = serde_json::to_string(&report).map_err(|source| LoadChildError::Report {
        command: "web-load",
        source,
    })?;
    println!("{out}");
    Ok(())
}

/// The notes of a load generator's library log as its role's evidence
/// (`WorkloadOutcome::evidence`).
pub(crate) fn child_evidence(log: &crate::preload::LogSummary) -> Vec<String> {
    log.notes
        .iter()
        .map(|l| service::evidence_line("the load generator's preload.log", l))
        .collect()
}

/// Runs `netgap COMMAND` (a role's clients) in a child process under the
/// preload library, hands it `job` as JSON on standard input and waits
/// for its report on standard output (killing it if the role is
/// stopped); returns the report and what its library log says.
pub(crate) fn run_child(
    library: &std::path::Path,
    stack: &crate::preload::LibraryStack,
    dir: &RunDir,
    command: &str,
    job: &impl Serialize,
    stop: &Stop,
    pid_out: &std::sync::mpsc::Sender<u32>,
) -> Result<(Vec<u8>, crate::preload::LogSummary), RoleError> {
    use std::io::{Read as _, Write as _};
    let log = dir.service_file("preload.log").map_err(refused)?;
    dir.hand_over().map_err(refused)?;
    let exe = std::env::current_exe()
        .map_err(|e| refused(format!("finding netgap's own binary: {e}")))?;
    let run_as = service::user::ServiceUser::for_agent()
        .map_err(refused)?
        .map(|u| crate::tether::RunAs {
            uid: u.uid,
            gid: u.gid,
        });
    let mut cmd = crate::tether::command_in_group(&exe, &[command], run_as);
    cmd.envs(stack.env(library, &dir.path().join("preload.log")))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .current_dir(dir.path());
    let mut child = cmd.spawn().map_err(|e| {
        refused(format!(
            "starting the load generator {}: {e}",
            exe.display()
        ))
    })?;
    let _ = pid_out.send(child.id());
    let job_text = serde_json::to_vec(job).map_err(|e| refused(format!("the load job: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&job_text)
            .map_err(|e| refused(format!("handing the load generator its job: {e}")))?;
    }
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(64 << 20).read_to_end(&mut out);
        }
        out
    });
    let mut stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(64 << 10).read_to_end(&mut out);
        }
        out
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if stop.is_set() => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(refused("stopped"));
            }
            Ok(None) => std::thread::sleep(crate::role::STOP_TICK),
            Err(e) => return Err(refused(format!("waiting for the load generator: {e}"))),
        }
    };
    let out = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        return Err(refused(format!(
            "the load generator under the preload library failed ({status}): {}",
            netgap_core::text::escape_control(err.trim())
                .chars()
                .take(400)
                .collect::<String>()
        )));
    }
    Ok((out, crate::preload::LogSummary::read(&log)))
}
