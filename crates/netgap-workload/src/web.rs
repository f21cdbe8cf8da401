//! `web`: a real web server (nginx or Apache httpd) on the first host
//! serves a generated file set to N closed-loop HTTP/1.1 clients spread
//! cyclically over the other hosts (seed 001, section 4.3 and Figure 8).
//! The headline is transactions per second, all clients together.
//!
//! The server role starts the server through its agent ([`crate::service`])
//! after writing the file set ([`fileset`]) into the server's run
//! directory; the client roles run netgap's own load generator
//! ([`client`]). Traces: `single` asks every request for one file of the
//! point's size (`-s 1K,4K,...` gives one point per size); `zipf` asks for
//! the files of a SPECweb99-like set by Zipf popularity (`--alpha
//! 0.5,...,1.0` gives one point per exponent).

pub(crate) mod client;
pub(crate) mod fileset;

use super::options::{OptionKind, WorkloadArgs, WorkloadOption};
use super::place::{self, HostView, Placement};
use super::role::{
    meter_window_counting, metered, parse_params, window, OpenRole, ReadyRole, RoleContext,
    RoleError, RoleResult, Stop, PER_FLOW_BYTES,
};
use super::{CountFlag, FlowSample, Refused, Workload};
use crate::service::{self, RunDir, Running, WebServer, WebStart};
use crate::About;
use fileset::{FileSet, Zipf};
use netgap_core::metric::Metric;
use netgap_core::spec::{Mode, PointSpec};
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::{Programs, Transport};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const NAME: &str = "web";

/// Most clients of one point: a workload point's most flows. Each client host must
/// hold its share in one process ([`open_clients`] refuses a share past
/// its descriptor limit).
const MAX_CLIENTS: u32 = netgap_proto::workload::MAX_WORKLOAD_FLOWS;
/// Largest file of a `single` trace, bytes.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Files of a `zipf` set when the run names no count: one SPECweb99
/// directory per 36 files.
const DEFAULT_FILES: u32 = 360;
/// Seed of the file set when the run names none.
const DEFAULT_SEED: u64 = 1;
/// Most worker processes (nginx) or children (Apache).
const MAX_SERVER_WORKERS: u64 = 64;
/// How long the server keeps serving after the window, so the clients'
/// last requests finish before it stops.
const SERVER_GRACE: Duration = Duration::from_millis(500);
/// Most client worker threads on one agent.
const MAX_CLIENT_WORKERS: usize = 8;
/// What one client commits, bytes, an upper bound: its connection's state
/// (at most 512 bytes, which a unit test of `client` holds it to; 320 measured), its request
/// (under 256: a GET line and a Host header), its latency histogram (a
/// `FlowHistogram`: typically under 1 KiB, 4.6 KiB if its transactions
/// spanned 1 ns to an hour) and its outcome and report (about 200):
/// 512 + 256 + 4,710 + 200 = 5,678, rounded up. The receive buffer is its
/// worker's; a response head split across reads is copied until it is
/// whole (a few hundred bytes from nginx or Apache; at most
/// [`client::BUF_BYTES`] from a server that sends a huge head slowly).
const CLIENT_BYTES: u64 = 6 * 1024;

/// `--server`: its choices and help come from [`service::web_servers`].
fn server_option() -> &'static WorkloadOption {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    static HELP: OnceLock<String> = OnceLock::new();
    static OPTION: OnceLock<WorkloadOption> = OnceLock::new();
    OPTION.get_or_init(|| {
        let servers = service::web_servers();
        let names = NAMES.get_or_init(|| servers.iter().map(|s| s.name()).collect());
        let helps: Vec<&str> = servers.iter().map(|s| s.help()).collect();
        let default = names.first().copied().unwrap_or_default();
        WorkloadOption {
            flag: "server",
            kind: OptionKind::Choice(names.as_slice()),
            value_name: "NAME[,NAME]",
            help: HELP.get_or_init(|| {
                format!(
                    "web: the server program on the first host: {}; a list gives one point per server [default: {default}]",
                    helps.join(" or ")
                )
            }),
            axis: true,
        }
    })
}
static TRACE: WorkloadOption = WorkloadOption {
    flag: "trace",
    kind: OptionKind::Choice(&["single", "zipf"]),
    value_name: "NAME",
    help: "web: single (every request for one file of the point's size, one point per -s size) or zipf (a generated file set by Zipf popularity) [default: single]",
    axis: false,
};
static ALPHA: WorkloadOption = WorkloadOption {
    flag: "alpha",
    kind: OptionKind::Number { min: 0.0, max: 3.0 },
    value_name: "A[,A...]",
    help: "web --trace zipf: the Zipf exponent of file popularity (0: uniform); a list gives one point per exponent [default: 1.0]",
    axis: true,
};
static FILES: WorkloadOption = WorkloadOption {
    flag: "files",
    kind: OptionKind::Count {
        min: 1,
        max: fileset::MAX_FILES as u64,
    },
    value_name: "N",
    help: "web --trace zipf: files in the generated set (SPECweb99 classes, 36 per directory) [default: 360]",
    axis: false,
};
static FILE_SEED: WorkloadOption = WorkloadOption {
    flag: "file-seed",
    kind: OptionKind::Count {
        min: 0,
        max: u32::MAX as u64,
    },
    value_name: "N",
    help: "web: seed of the file set's content and of the clients' request sequences [default: 1]",
    axis: false,
};
static VERIFY_FRACTION: WorkloadOption = WorkloadOption {
    flag: "verify-fraction",
    kind: OptionKind::Number { min: 0.0, max: 1.0 },
    value_name: "F",
    help: "web: share of response bodies compared byte for byte with the file set (every status and length is always checked) [default: 1]",
    axis: false,
};
static PER_REQUEST: WorkloadOption = WorkloadOption {
    flag: "connection-per-request",
    kind: OptionKind::Switch,
    value_name: "",
    help: "web: open a new connection for every request (Connection: close) instead of keeping one alive per client",
    axis: false,
};
/// `--server-workers`: its help names each server's workers
/// ([`WebServer::workers_help`]).
fn server_workers_option() -> &'static WorkloadOption {
    static HELP: OnceLock<String> = OnceLock::new();
    static OPTION: OnceLock<WorkloadOption> = OnceLock::new();
    OPTION.get_or_init(|| {
        let workers: Vec<&str> = service::web_servers()
            .iter()
            .map(|s| s.workers_help())
            .collect();
        WorkloadOption {
            flag: "server-workers",
            kind: OptionKind::Count {
                min: 1,
                max: MAX_SERVER_WORKERS,
            },
            value_name: "N",
            help: HELP.get_or_init(|| {
                format!(
                    "web: {} [default: one per CPU of the server host]",
                    workers.join(", or ")
                )
            }),
            axis: false,
        }
    })
}

/// Every option of `web`.
fn all_options() -> &'static [&'static WorkloadOption] {
    static OPTIONS: OnceLock<Vec<&'static WorkloadOption>> = OnceLock::new();
    OPTIONS.get_or_init(|| {
        vec![
            server_option(),
            &TRACE,
            &ALPHA,
            &FILES,
            &FILE_SEED,
            &VERIFY_FRACTION,
            &PER_REQUEST,
            server_workers_option(),
        ]
    })
}

/// The `web` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Web;

/// The request trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Trace {
    /// Every request for one file.
    Single,
    /// Zipf popularity over a file set.
    Zipf,
}

/// What every role of a `web` point gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// The server program: a name of [`service::web_servers`].
    pub server: String,
    /// The trace.
    pub trace: Trace,
    /// The file's size for `single`, bytes.
    pub file_bytes: u64,
    /// Files of the `zipf` set.
    pub files: u32,
    /// Zipf exponent.
    pub alpha: f64,
    /// Seed of the content and the request sequences.
    pub seed: u64,
    /// Share of bodies compared byte for byte, 0 to 1.
    pub verify_fraction: f64,
    /// A new connection per request.
    pub connection_per_request: bool,
    /// Server workers; 0: one per CPU of the server host.
    pub server_workers: u32,
}

fn bad(detail: impl Into<String>) -> RoleError {
    RoleError::Params {
        workload: NAME,
        detail: detail.into(),
    }
}

impl Params {
    /// Range-checks parameters from a peer; never panics.
    fn check(&self, ctx: &RoleContext<'_>) -> Result<(), RoleError> {
        if self.file_bytes == 0 || self.file_bytes > MAX_FILE_BYTES {
            return Err(bad(format!(
                "file_bytes {} is outside 1 to {MAX_FILE_BYTES}",
                self.file_bytes
            )));
        }
        ctx.limits.check_message_bytes(self.file_bytes)?;
        if self.files == 0 || self.files > fileset::MAX_FILES {
            return Err(bad(format!(
                "files {} is outside 1 to {}",
                self.files,
                fileset::MAX_FILES
            )));
        }
        if !(0.0..=3.0).contains(&self.alpha) {
            return Err(bad("alpha is outside 0 to 3"));
        }
        if !(0.0..=1.0).contains(&self.verify_fraction) {
            return Err(bad("verify_fraction is outside 0 to 1"));
        }
        if u64::from(self.server_workers) > MAX_SERVER_WORKERS {
            return Err(bad(format!("server_workers is over {MAX_SERVER_WORKERS}")));
        }
        Ok(())
    }

    /// The point's file set.
    fn fileset(&self) -> FileSet {
        match self.trace {
            Trace::Single => FileSet::single(self.seed, self.file_bytes),
            Trace::Zipf => FileSet::mix(self.seed, self.files),
        }
    }
}

/// What `Web` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "nginx or Apache on the first host, N closed-loop HTTP/1.1 clients; transactions/s",
    metric: Metric::Other {
        key: "transactions_per_s",
        combine: netgap_core::metric::Combine::Sum,
    },
    count: CountFlag::Clients,
    max_flows: MAX_CLIENTS,
    takes_bidir: false,
};

impl Workload for Web {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        1024
    }

    /// A real web server speaks HTTP over the host's TCP: any other
    /// transport, and socket options the server would not share, are
    /// refused.
    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        match transport.capabilities().programs {
            Programs::Kernel => {}
            Programs::Library | Programs::LibraryWithRelay => {
                crate::preload::library_path()
                    .map_err(|e| Refused(format!("{NAME} -t {}: {e}", spec.transport)))?;
            }
            Programs::No => {
                return Err(Refused(format!(
                    "{NAME} runs real web servers, which speak HTTP over the host's TCP, or through the preload library over shm on one host or xdp across hosts; use -t {}, not {}",
                    netgap_transport::program_transports(),
                    spec.transport
                )))
            }
        }
        if spec.options != netgap_core::spec::TransportOptions::default() {
            return Err(Refused(format!(
                "{NAME}: transport options apply to netgap's own flows, not to a real server's; drop them"
            )));
        }
        if spec.size_bytes == 0 || spec.size_bytes > MAX_FILE_BYTES {
            return Err(Refused(format!(
                "{NAME}: file sizes must be between 1 byte and 64M"
            )));
        }
        Ok(())
    }

    fn options(&self) -> &'static [&'static WorkloadOption] {
        all_options()
    }

    fn params(&self, spec: &PointSpec, args: &WorkloadArgs) -> serde_json::Value {
        let default = service::web_servers().first().map_or("", |s| s.name());
        let server = args.str("server").unwrap_or(default).to_string();
        let trace = match args.str("trace") {
            Some("zipf") => Trace::Zipf,
            _ => Trace::Single,
        };
        let u32_of = |flag: &str, default: u32| {
            args.u64(flag)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(default)
        };
        serde_json::json!(Params {
            server,
            trace,
            file_bytes: spec.size_bytes,
            files: u32_of("files", DEFAULT_FILES),
            alpha: args.f64("alpha").unwrap_or(1.0),
            seed: args.u64("file-seed").unwrap_or(DEFAULT_SEED),
            verify_fraction: args.f64("verify-fraction").unwrap_or(1.0),
            connection_per_request: args.switch("connection-per-request"),
            server_workers: u32_of("server-workers", 0),
        })
    }

    fn metrics(
        &self,
        roles: &[(WorkloadRole, &BTreeMap<String, f64>)],
        window_ns: u64,
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (_, m) in roles {
            for (k, v) in m.iter() {
                *out.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        if let Some(&bytes) = out.get("payload_bytes") {
            if window_ns > 0 {
                out.insert(
                    "payload_gbps".into(),
                    netgap_core::units::gbps(bytes, window_ns as f64),
                );
            }
        }
        if let (Some(&v), Some(&c)) = (out.get("verified"), out.get("checked")) {
            if c > 0.0 {
                out.insert("verified_share".into(), v / c);
            }
        }
        out
    }

    /// Refuses, before anything starts, more clients than the server's
    /// configuration serves ([`WebServer::refuse_clients`]).
    fn place(
        &self,
        params: &serde_json::Value,
        count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        let server = params
            .get("server")
            .and_then(|v| v.as_str())
            .and_then(service::web_server);
        let workers = params
            .get("server_workers")
            .and_then(|v| v.as_u64())
            .and_then(|w| u32::try_from(w).ok())
            .unwrap_or(0);
        if let Some(detail) = server.and_then(|s| s.refuse_clients(u64::from(count), workers)) {
            return Err(Refused(format!("{NAME}: {detail}")));
        }
        place::spread(count, hosts)
    }

    /// A client holds its state, request, histogram and report
    /// (6 KiB, an upper bound); its worker's receive buffer is shared by the
    /// worker's clients. The server role holds nothing per client (the
    /// server program does).
    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        match spec.role {
            WorkloadRole::Server => PER_FLOW_BYTES,
            WorkloadRole::Client => CLIENT_BYTES
                .saturating_mul(u64::from(spec.flows))
                .saturating_add((MAX_CLIENT_WORKERS * client::BUF_BYTES) as u64),
        }
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let p: Params = parse_params(NAME, ctx.spec)?;
        p.check(&ctx)?;
        match ctx.spec.role {
            WorkloadRole::Server => open_server(&p, &ctx),
            WorkloadRole::Client => open_clients(&p, &ctx),
        }
    }

    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        if side == WorkloadRole::Server {
            return FlowSample::default();
        }
        FlowSample {
            value: Some(per_second(report.round_trips, window_ns)),
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

/// `count` events in `window_ns`, per second.
fn per_second(count: u64, window_ns: u64) -> f64 {
    if window_ns == 0 {
        return 0.0;
    }
    count as f64 / (window_ns as f64 / 1e9)
}

fn refused(detail: impl std::fmt::Display) -> RoleError {
    RoleError::Refused {
        workload: NAME,
        detail: detail.to_string(),
    }
}

/// Writes the file set and starts the server on it; returns once it
/// answers.
fn open_server(p: &Params, ctx: &RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
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
    let stack = ctx.spec.point.transport.as_str();
    match netgap_transport::programs(stack) {
        Programs::Library => dir.preload(stack).map_err(refused).map(|()| None),
        Programs::LibraryWithRelay => {
            dir.preload(stack).map_err(refused)?;
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

/// Prepares this host's clients: nothing is connected before the barrier
/// (a request's connection is part of a transaction when one is opened per
/// request, and a kept-alive one opens with the first request).
fn open_clients(p: &Params, ctx: &RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
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
            stack: ctx.spec.point.transport.clone(),
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
    /// The library's stack (`shm` or `xdp`).
    stack: String,
    /// The child's run directory.
    dir: RunDir,
    job: LoadJob,
    /// The host's relay, for `-t xdp`: its CPU counts as the clients'.
    relay: Option<std::sync::Arc<crate::preload::RelayGuard>>,
}

/// What the agent hands its load generator child (`netgap web-load`) on
/// standard input.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoadJob {
    params: Params,
    target: SocketAddr,
    bind_ip: Option<IpAddr>,
    flows: u32,
    workers: usize,
    seed: u64,
    io_timeout_ms: u64,
    poll: bool,
    warmup_ns: u64,
    duration_ns: u64,
}

/// One client's results as a child reports them.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reported {
    index: u32,
    transactions: u64,
    window_body_bytes: u64,
    bytes_tx: u64,
    bytes_rx: u64,
    errors: u64,
    checked: u64,
    verified: u64,
    connections: u64,
    percentiles: Option<Percentiles>,
    last_error: Option<String>,
}

/// What the child writes on standard output when it is done.
#[derive(Debug, Serialize, Deserialize)]
struct LoadReport {
    clients: Vec<Reported>,
    /// The window's latencies, all clients: [`LatencyHistogram::buckets`].
    buckets: Vec<[u64; 2]>,
    window_ns: u64,
}

impl Reported {
    fn of(o: &client::ClientOutcome) -> Reported {
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

/// Runs clients as `job` says and reports them: the body of the hidden
/// `netgap web-load` command, which an agent starts under the preload
/// library. Reads the job on standard input, writes one JSON report on
/// standard output.
pub fn run_load_child() -> Result<(), String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::io::stdin()
        .take(1 << 20)
        .read_to_string(&mut text)
        .map_err(|e| format!("web-load: reading the job: {e}"))?;
    let job: LoadJob =
        serde_json::from_str(&text).map_err(|e| format!("web-load: the job: {e}"))?;
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
        .map_err(|e| format!("web-load: message buffers: {e}"))?,
    };
    netgap_transport::flows::ensure_fd_limit(
        u64::from(job.flows) + cfg.workers as u64 + netgap_transport::flows::limits::SPARE_FDS,
    )
    .map_err(|e| format!("web-load: {} clients: {e}", job.flows))?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (outcomes, window_ns) = client::run(
        &cfg,
        Duration::from_nanos(job.warmup_ns),
        Duration::from_nanos(job.duration_ns),
        &stop,
    )
    .map_err(|e| format!("web-load: {e}"))?;
    let mut hist = LatencyHistogram::new();
    for o in &outcomes {
        o.hist.merge_into(&mut hist);
    }
    let report = LoadReport {
        clients: outcomes.iter().map(Reported::of).collect(),
        buckets: hist.buckets(),
        window_ns,
    };
    let out = serde_json::to_string(&report).map_err(|e| format!("web-load: the report: {e}"))?;
    println!("{out}");
    Ok(())
}

/// Runs `netgap COMMAND` (a role's clients) in a child process under the
/// preload library, hands it `job` as JSON on standard input and waits
/// for its report on standard output (killing it if the role is
/// stopped); returns the report and what its library log says.
pub(crate) fn run_child(
    library: &std::path::Path,
    stack: &str,
    dir: &RunDir,
    command: &str,
    job: &impl Serialize,
    stop: &Stop,
    pid_out: &std::sync::mpsc::Sender<u32>,
) -> Result<(Vec<u8>, crate::preload::LogSummary), RoleError> {
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::FileExt as _;
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
    cmd.env("LD_PRELOAD", crate::preload::preload_value(library))
        .env(crate::preload::STACK_ENV, stack)
        .env("NETGAP_PRELOAD_LOG", dir.path().join("preload.log"))
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
            Ok(None) => std::thread::sleep(super::role::STOP_TICK),
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
    let len = log.metadata().map_or(0, |m| m.len()).min(16 << 20);
    let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
    let n = log.read_at(&mut buf, 0).unwrap_or(0);
    let summary = crate::preload::LogSummary::parse(&String::from_utf8_lossy(&buf[..n]));
    Ok((out, summary))
}

impl OpenRole for ClientRole {
    fn addrs(&self) -> Vec<String> {
        Vec::new()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
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
        let flag = stop.flag();
        let mut m: BTreeMap<String, f64> = BTreeMap::new();
        let (cpu, outcomes, buckets, window_ns) = match child {
            None => {
                let (cpu, ran) = metered(Instant::now(), warmup, duration, &stop, || {
                    client::run(&cfg, warmup, duration, &flag)
                })?;
                let (outcomes, window_ns) = ran.map_err(refused)?;
                let mut hist = LatencyHistogram::new();
                for o in &outcomes {
                    o.hist.merge_into(&mut hist);
                }
                let reported: Vec<Reported> = outcomes.iter().map(Reported::of).collect();
                (cpu, reported, hist.buckets(), window_ns)
            }
            Some(LoadChild {
                library,
                stack,
                dir,
                job,
                relay,
            }) => {
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
                    p.1.map_or(0, service::tree_cpu_ns)
                        + relay_cpu.as_ref().map_or(0, |r| r.cpu_ns())
                };
                let meter_stop = stop.clone();
                let meter = std::thread::Builder::new()
                    .name("cpu meter".into())
                    .spawn(move || {
                        super::role::meter_window_counting(
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
                let ran = run_child(&library, &stack, &dir, "web-load", &job, &stop, &pid_tx);
                let (cpu, _) = meter.join().map_err(|_| RoleError::Panicked {
                    what: "the CPU meter".into(),
                })?;
                let (out, log) = ran?;
                let report: LoadReport = serde_json::from_slice(&out)
                    .map_err(|e| refused(format!("the load generator's report: {e}")))?;
                for (k, v) in log.record_metrics() {
                    m.insert(k.into(), v);
                }
                drop(dir);
                drop(relay);
                (cpu, report.clients, report.buckets, report.window_ns)
            }
        };
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
            return Err(refused(format!(
                "no client completed a transaction with {} in the window{}",
                cfg.target,
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
            },
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn transactions_per_second_over_the_window() {
        assert!((per_second(500, 500_000_000) - 1000.0).abs() < 1e-9);
        assert_eq!(per_second(5, 0), 0.0);
    }

    #[test]
    fn the_server_option_offers_every_registered_server() {
        let names: Vec<&str> = service::web_servers().iter().map(|s| s.name()).collect();
        assert_eq!(names, ["nginx", "apache"]);
        assert!(matches!(server_option().kind, OptionKind::Choice(c) if c == names.as_slice()));
        assert!(server_option().help.ends_with("[default: nginx]"));
    }

    #[test]
    fn apache_is_sized_to_the_clients_and_refused_past_its_thread_limit_in_one_line() {
        let hosts: Vec<HostView> = (0..2)
            .map(|i| HostView {
                name: format!("h{i}"),
                address: None,
                rails: vec![],
            })
            .collect();
        let apache = serde_json::json!({ "server": "apache", "server_workers": 0 });
        assert!(Web.place(&apache, 4097, &hosts).is_ok());
        assert!(Web.place(&apache, MAX_CLIENTS, &hosts).is_ok());
        let one_child = serde_json::json!({ "server": "apache", "server_workers": 1 });
        assert!(Web.place(&one_child, 15_000, &hosts).is_ok());
        let e = Web.place(&one_child, 16_000, &hosts).unwrap_err();
        assert_eq!(
            e.0,
            "web: Apache cannot serve 16000 clients with 1 children: each would need 20064 threads, past the most its ThreadLimit may be (20000); ask for more children with --server-workers"
        );
        let nginx = serde_json::json!({ "server": "nginx", "server_workers": 1 });
        assert!(Web.place(&nginx, 16_000, &hosts).is_ok());
    }
}
