//! The web server role: the file set written into the server's run
//! directory, nginx or Apache started on it (under the preload library
//! and with the host's relay when the stack asks), kept serving over the
//! window, and its processes' memory.

use super::fileset::FileSet;
use super::{bad, refused, Params, MAX_SERVER_WORKERS, SERVER_GRACE};
use crate::role::{
    meter_window_counting, window, OpenRole, ReadyRole, RoleContext, RoleError, RoleResult, Stop,
};
use crate::service::{self, RunDir, Running, WebServer, WebStart};
use netgap_proto::workload::WorkloadOutcome;
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::Programs;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Writes the file set and starts the server on it; returns once it
/// answers.
pub(super) fn open_server(
    p: &Params,
    ctx: &RoleContext<'_>,
) -> Result<Box<dyn OpenRole>, RoleError> {
    if !ctx.services {
        return Err(refused(service::ServiceError::NotAllowed));
    }
    let ip: IpAddr = ctx
        .spec
        .listen_ips
        .first()
        .copied()
        .unwrap_or(ctx.control_ip);
    let server: &dyn WebServer = service::web_server(&p.server).ok_or_else(|| {
        let names: Vec<&str> = service::web_servers().iter().map(|s| s.name()).collect();
        bad(format!(
            "unknown server {:?}; netgap starts {}",
            p.server,
            names.join(", ")
        ))
    })?;
    let name = server.name();
    let set = p.fileset();
    // The files may live in memory (a tmpfs): they count against the
    // agent's memory budget before one is written.
    ctx.limits.check_memory(
        &format!("a web file set of {} files", set.len()),
        set.total_bytes(),
    )?;
    let mut dir = RunDir::new(ctx.dirs, name).map_err(refused)?;
    let relay = preload_stack(ctx, &mut dir)?;
    let www = dir.subdir("www").map_err(refused)?;
    let sha = set.write(&www).map_err(|e| {
        refused(format!(
            "writing the file set into {}: {e}",
            www.path().display()
        ))
    })?;
    // The server's own log, which it opens by name; the agent reads it
    // only through this descriptor.
    let error_log = dir.service_file("error.log").map_err(refused)?;
    let port = service::free_tcp_port(ip).map_err(refused)?;
    let addr = SocketAddr::new(ip, port);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let workers = if p.server_workers == 0 {
        cpus.clamp(1, MAX_SERVER_WORKERS as u32)
    } else {
        p.server_workers
    };
    let mut running = server
        .start(WebStart {
            dir,
            docroot: www.path(),
            listen: addr,
            workers,
            workers_fixed: p.server_workers != 0,
            max_workers: MAX_SERVER_WORKERS as u32,
            clients: u64::from(ctx.spec.flows),
            files: set.len() as u64,
        })
        .map_err(refused)?;
    running
        .wait_answering(addr, ctx.stop, Some(&error_log), |a| {
            service::http_probe(a, &FileSet::url(0))
        })
        .map_err(refused)?;
    let facts = running.facts_mut();
    facts.insert("fileset_files".into(), set.len().to_string());
    facts.insert("fileset_bytes".into(), set.total_bytes().to_string());
    facts.insert("fileset_sha256".into(), sha);
    facts.insert("fileset_seed".into(), p.seed.to_string());
    if let Some(r) = &relay {
        facts.insert(
            "relay".into(),
            if r.started() {
                "started for the run; its CPU counts as the server's"
            } else {
                "already running; its CPU is not counted"
            }
            .into(),
        );
    }
    let (warmup, duration) = window(ctx.spec);
    Ok(Box::new(ServerRole {
        running,
        error_log,
        relay,
        addr,
        warmup,
        duration,
        stop: ctx.stop.clone(),
    }))
}

/// Under the preload library (`-t shm` or `-t xdp`): the server's
/// environment gets the library, and across hosts the host's relay runs
/// (started for the run, its log in `dir`, when none does).
fn preload_stack(
    ctx: &RoleContext<'_>,
    dir: &mut RunDir,
) -> Result<Option<crate::preload::RelayGuard>, RoleError> {
    let stack = crate::preload::LibraryStack::of(&ctx.spec.point);
    match netgap_transport::programs(&stack.name) {
        Programs::Library => dir.preload(&stack).map_err(refused).map(|()| None),
        Programs::LibraryWithRelay => {
            dir.preload(&stack).map_err(refused)?;
            relay_for(ctx, dir, ctx.spec.flows).map(Some)
        }
        Programs::Kernel | Programs::No => Ok(None),
    }
}

/// The host's relay for a run over xdp through the library, its log
/// (`relay.log`) in `dir`, serving the session's hosts.
pub(crate) fn relay_for(
    ctx: &RoleContext<'_>,
    dir: &RunDir,
    connections: u32,
) -> Result<crate::preload::RelayGuard, RoleError> {
    let log = dir.service_file("relay.log").map_err(refused)?;
    crate::preload::ensure_relay(
        log,
        &dir.path().join("relay.log"),
        connections.saturating_mul(2),
        ctx.relay,
        &ctx.spec.session_hosts,
        ctx.dirs,
    )
    .map_err(|e| refused(format!("-t xdp: {e}")))
}

/// A web server running for the point.
struct ServerRole {
    running: Running,
    /// The server's own error log, for the repetition's evidence.
    error_log: std::fs::File,
    /// The host's relay, for `-t xdp`: its CPU counts as the server's.
    relay: Option<crate::preload::RelayGuard>,
    addr: SocketAddr,
    warmup: Duration,
    duration: Duration,
    stop: Stop,
}

impl OpenRole for ServerRole {
    fn addrs(&self) -> Vec<String> {
        vec![self.addr.to_string()]
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

impl ReadyRole for ServerRole {
    /// Serves through the window and a grace, then stops the server before
    /// reporting. The role's CPU in the window is the agent's and the
    /// server program's: every process of it (nginx's master and workers,
    /// Apache's children), from the kernel's accounting.
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let ServerRole {
            running,
            error_log,
            relay,
            addr: _,
            warmup,
            duration,
            stop,
        } = *self;
        let t0 = Instant::now();
        let (cpu, _) = meter_window_counting(t0 + warmup, t0 + warmup + duration, &stop, &|| {
            running.cpu_ns() + relay.as_ref().map_or(0, |r| r.cpu_ns())
        });
        stop.sleep_until(Instant::now() + SERVER_GRACE);
        let mut running = running;
        // The agent holds nothing per client; the server program's own
        // peak is its host's memory for the clients.
        if let Some(kib) = server_peak_rss_kib(running.dir()) {
            running
                .facts_mut()
                .insert("peak_rss_kib".into(), kib.to_string());
        }
        let record = running.record().clone();
        let evidence = running.evidence(Some(&error_log));
        drop(running);
        drop(relay);
        Ok(RoleResult {
            flows: Vec::new(),
            buckets: Vec::new(),
            outcome: WorkloadOutcome {
                window_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: 0,
                bytes_tx: 0,
                datagrams: None,
                metrics: BTreeMap::new(),
                services: vec![record],
                last_error: None,
                data_window_ns: None,
                evidence,
            },
        })
    }
}

/// The summed peak resident memory (VmHWM), KiB, of the server program's
/// processes: those whose command line names its run directory `dir` (its
/// main process, and the `unshare` wrapper that starts it) and every
/// descendant of them (nginx's workers, Apache's children). Pages the
/// processes share count once per process, so it bounds the program's
/// memory from above. `None` if no such process is found.
fn server_peak_rss_kib(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let needle = dir.as_os_str().as_bytes();
    if needle.is_empty() {
        return None;
    }
    // (pid, parent, names the directory, VmHWM KiB) of every process.
    let mut procs: Vec<(u32, u32, bool, u64)> = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        let ppid = field("PPid:")
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0);
        let hwm = field("VmHWM:").unwrap_or(0);
        let names = std::fs::read(entry.path().join("cmdline"))
            .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle));
        procs.push((pid, ppid, names, hwm));
    }
    let mut ours: Vec<u32> = procs.iter().filter(|p| p.2).map(|p| p.0).collect();
    if ours.is_empty() {
        return None;
    }
    // Descendants, a generation per pass.
    loop {
        let before = ours.len();
        for p in &procs {
            if !ours.contains(&p.0) && ours.contains(&p.1) {
                ours.push(p.0);
            }
        }
        if ours.len() == before {
            break;
        }
    }
    Some(
        procs
            .iter()
            .filter(|p| ours.contains(&p.0))
            .map(|p| p.3)
            .sum(),
    )
}
