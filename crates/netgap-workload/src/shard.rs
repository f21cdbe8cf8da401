//! A flow-engine server spread over processes, for a role whose flows are
//! more than one process may hold descriptors for (a hard `RLIMIT_NOFILE`
//! the agent cannot raise). The agent binds the listener once and starts
//! shard processes that inherit it, the way a pre-forked server's workers
//! share one listening socket: each shard is this binary again
//! (`/proc/self/exe` with the hidden `SUBCOMMAND`), runs a
//! [`FlowServer`] on the inherited socket, and holds at most its cap of
//! connections, so the kernel's accept queue hands the rest to the others.
//!
//! A shard takes its configuration over its stdin as one JSON line
//! (`ShardConfig`: engine configuration, data token, cap), never from its
//! arguments, and reports over its stdout (`FromShard`): that it serves,
//! its counts of connections every `STATUS_EVERY`, and at the end its
//! [`ServerTotals`] and its own peak memory. It stops when the agent says
//! so or closes its stdin, and dies with the thread that started it
//! (`PR_SET_PDEATHSIG`), so no shard outlives its role, however the agent
//! or its session ends. The seam is the server's today; a client host past
//! its limit could spread its flows the same way.

use netgap_core::spec::{Mode, TransportOptions};
use netgap_proto::dataproof::DataToken;
use netgap_transport::flows::{
    self, EngineConfig, EngineError, FlowServer, FlowWork, ServerTotals,
};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The hidden subcommand of the binary that runs one shard.
pub(crate) const SUBCOMMAND: &str = "flow-shard";
/// Most shard processes one server role starts: past them a point is
/// refused in one line, as a single process past its limit is.
pub(crate) const MAX_SHARDS: u32 = 16;
/// Most engine workers a shard runs.
pub(crate) const MAX_SHARD_WORKERS: u32 = 64;
/// What one shard process commits besides its flows, in bytes, an upper
/// bound: the binary's mapped and touched pages, its threads' stacks and
/// the workers' event buffers (an idle agent is about 6 MiB resident).
pub(crate) const SHARD_PROCESS_BYTES: u64 = 16 << 20;
/// The descriptor a shard finds the shared listener on.
const LISTENER_FD: RawFd = 3;
/// Longest line either side sends: a configuration is a few hundred bytes.
const MAX_LINE_BYTES: u64 = 64 * 1024;
/// How often a shard reports its counts of connections.
pub(crate) const STATUS_EVERY: Duration = Duration::from_millis(20);
/// How long the agent waits for a shard to say it serves, or to report
/// once told to stop (its drain is 100 ms; a busy host takes longer).
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest I/O timeout a shard accepts, ms (the point's own is smaller).
const MAX_IO_TIMEOUT_MS: u64 = 3_600_000;

/// Why a server could not be spread over processes, or a shard failed: one
/// line.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// Even the most shards do not hold the flows.
    #[error(
        "{flows} flows need {needed} server processes of {per_process} connections each \
         (descriptor limit {soft}, hard limit {hard}), more than the {max} one agent starts; \
         raise the hard limit (`ulimit -Hn`, LimitNOFILE= in the service unit) or use fewer flows"
    )]
    TooManyShards {
        /// Flows of the role.
        flows: u64,
        /// Processes they would need.
        needed: u64,
        /// Connections one process holds.
        per_process: u64,
        /// Soft descriptor limit.
        soft: u64,
        /// Hard descriptor limit.
        hard: u64,
        /// `MAX_SHARDS`.
        max: u32,
    },
    /// The system-wide count of open files would pass `fs.file-max`.
    #[error(
        "{flows} flows need {flows} more open files but the system has {in_use} of its \
         fs.file-max {max} open; raise it with `sysctl -w fs.file-max=N` or use fewer flows"
    )]
    SystemFiles {
        /// Flows of the role.
        flows: u64,
        /// Open files now.
        in_use: u64,
        /// fs.file-max.
        max: u64,
    },
    /// The shard's configuration is out of range or does not parse.
    #[error("shard configuration: {0}")]
    Config(String),
    /// The descriptor a shard should serve on is not a listening TCP socket.
    #[error("descriptor {LISTENER_FD} is not a listening TCP socket (a shard runs only as the agent starts it)")]
    NoListener,
    /// Starting or talking to a shard failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A shard said it failed, ended without its report, or was late.
    #[error("server process {index} of {count}: {detail}")]
    Shard {
        /// The shard, 0-based.
        index: usize,
        /// Shards of the role.
        count: usize,
        /// What happened.
        detail: String,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What each flow of a shard does (the engine's [`FlowWork`], as it travels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ShardWork {
    /// Pingpong round trips of `size_bytes` each way.
    PingPong {
        /// Message size, bytes.
        size_bytes: u64,
    },
    /// A connection per request and reply.
    Connect {
        /// Request size, bytes.
        request_bytes: u64,
        /// Reply size, bytes.
        reply_bytes: u64,
    },
}

impl From<FlowWork> for ShardWork {
    fn from(w: FlowWork) -> ShardWork {
        match w {
            FlowWork::PingPong { size_bytes } => ShardWork::PingPong {
                size_bytes: size_bytes as u64,
            },
            FlowWork::Connect {
                request_bytes,
                reply_bytes,
            } => ShardWork::Connect {
                request_bytes: request_bytes as u64,
                reply_bytes: reply_bytes as u64,
            },
        }
    }
}

/// A shard's configuration as it travels from the agent (raw: range-checked
/// by [`ShardConfig::validate`] before use).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardConfig {
    /// The transport whose engine data path the flows use.
    pub transport: String,
    /// Engine workers.
    pub workers: u32,
    /// The engine's I/O timeout, ms.
    pub io_timeout_ms: u64,
    /// Completion mode.
    pub mode: Mode,
    /// Socket options of every connection.
    pub options: TransportOptions,
    /// The point's session token, which every connection proves.
    pub token: Option<DataToken>,
    /// What each flow does.
    pub work: ShardWork,
    /// Most connections this shard holds open at once.
    pub max_open: u64,
    /// This shard's share of the agent's highest data rate, Gbit/s (the
    /// agent's `--max-rate` over its shards); `None`: unpaced.
    #[serde(default)]
    pub rate_gbps: Option<f64>,
}

/// A shard's configuration, checked: what [`FlowServer::on_listener`]
/// takes.
#[derive(Debug, Clone)]
pub(crate) struct ValidShard {
    /// The engine's configuration.
    pub cfg: EngineConfig,
    /// What each flow does.
    pub work: FlowWork,
    /// Most connections held open at once.
    pub max_open: usize,
}

impl ShardConfig {
    /// The configuration of a shard of a server with `cfg` doing `work`,
    /// holding at most `max_open` connections.
    pub(crate) fn new(cfg: &EngineConfig, work: FlowWork, max_open: u64) -> ShardConfig {
        ShardConfig {
            transport: cfg.path.name().to_string(),
            workers: u32::try_from(cfg.workers).unwrap_or(u32::MAX),
            io_timeout_ms: u64::try_from(cfg.io_timeout.as_millis()).unwrap_or(u64::MAX),
            mode: cfg.mode,
            options: cfg.options.clone(),
            token: cfg.token.clone(),
            work: work.into(),
            max_open,
            rate_gbps: cfg.rate.as_ref().map(|r| r.rate_gbps()),
        }
    }

    /// The same configuration for one of `count` shards that share the
    /// agent's rate budget equally.
    pub(crate) fn sharing_rate(mut self, count: u32) -> ShardConfig {
        self.rate_gbps = self.rate_gbps.map(|r| r / f64::from(count.max(1)));
        self
    }

    /// Checks every field: a known transport with a connection data path,
    /// 1 to [`MAX_SHARD_WORKERS`] workers, an I/O timeout of 1 ms to an
    /// hour, a cap of at least one connection and message sizes that fit
    /// this host's words (the engine checks their own limits when it binds).
    pub(crate) fn validate(&self) -> Result<ValidShard, ShardError> {
        let bad = |m: String| Err(ShardError::Config(m));
        let Some(t) = netgap_transport::find(&self.transport) else {
            return bad(format!("unknown transport {:?}", self.transport));
        };
        let Some(path) = t.engine_path() else {
            return bad(format!("{} has no engine data path", self.transport));
        };
        if path.datagrams() {
            return bad(format!(
                "{} flows are served from one process",
                self.transport
            ));
        }
        if !(1..=MAX_SHARD_WORKERS).contains(&self.workers) {
            return bad(format!(
                "{} workers is not 1 to {MAX_SHARD_WORKERS}",
                self.workers
            ));
        }
        if !(1..=MAX_IO_TIMEOUT_MS).contains(&self.io_timeout_ms) {
            return bad(format!(
                "an I/O timeout of {} ms is not 1 ms to an hour",
                self.io_timeout_ms
            ));
        }
        if let Some(r) = self.rate_gbps.filter(|r| !(r.is_finite() && *r > 0.0)) {
            return bad(format!("a rate of {r} Gbit/s"));
        }
        let max_open = usize::try_from(self.max_open).unwrap_or(0);
        if max_open == 0 {
            return bad(format!("a cap of {} connections", self.max_open));
        }
        let size =
            |b: u64| usize::try_from(b).map_err(|_| ShardError::Config(format!("{b} bytes")));
        let work = match self.work {
            ShardWork::PingPong { size_bytes } => FlowWork::PingPong {
                size_bytes: size(size_bytes)?,
            },
            ShardWork::Connect {
                request_bytes,
                reply_bytes,
            } => FlowWork::Connect {
                request_bytes: size(request_bytes)?,
                reply_bytes: size(reply_bytes)?,
            },
        };
        Ok(ValidShard {
            cfg: EngineConfig {
                workers: self.workers as usize,
                io_timeout: Duration::from_millis(self.io_timeout_ms),
                mode: self.mode,
                options: self.options.clone(),
                path,
                token: self.token.clone(),
                rate: self
                    .rate_gbps
                    .map(|r| std::sync::Arc::new(netgap_transport::rate::RateBudget::new(r))),
            },
            work,
            max_open,
        })
    }
}

/// What the agent tells a shard after its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToShard {
    /// Stop accepting, drain, report and exit.
    Stop,
}

/// A shard's [`ServerTotals`] as they travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardTotals {
    /// Payload bytes read from clients.
    pub bytes_rx: u64,
    /// Payload bytes written to clients.
    pub bytes_tx: u64,
    /// Connections accepted.
    pub connections_accepted: u64,
    /// Connections that ended cleanly.
    pub connections_completed: u64,
    /// Connections that ended with an error.
    pub errors: u64,
    /// Connections that did not prove the session.
    pub strangers: u64,
}

impl From<&ServerTotals> for ShardTotals {
    fn from(t: &ServerTotals) -> ShardTotals {
        ShardTotals {
            bytes_rx: t.bytes_rx,
            bytes_tx: t.bytes_tx,
            connections_accepted: t.connections_accepted,
            connections_completed: t.connections_completed,
            errors: t.errors,
            strangers: t.strangers,
        }
    }
}

impl ShardTotals {
    /// The totals as the engine keeps them.
    pub(crate) fn to_server(self) -> ServerTotals {
        ServerTotals {
            bytes_rx: self.bytes_rx,
            bytes_tx: self.bytes_tx,
            connections_accepted: self.connections_accepted,
            connections_completed: self.connections_completed,
            errors: self.errors,
            strangers: self.strangers,
            datagrams: None,
        }
    }

    fn add(&mut self, o: &ShardTotals) {
        self.bytes_rx += o.bytes_rx;
        self.bytes_tx += o.bytes_tx;
        self.connections_accepted += o.connections_accepted;
        self.connections_completed += o.connections_completed;
        self.errors += o.errors;
        self.strangers += o.strangers;
    }
}

/// What a shard tells the agent, one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum FromShard {
    /// Its server runs on the shared listener.
    Serving,
    /// Its connections so far and now.
    Status {
        /// Accepted so far.
        accepted: u64,
        /// Open now.
        open: u64,
    },
    /// It stopped: what it moved and its peak resident memory.
    Done {
        /// Its server's totals.
        totals: ShardTotals,
        /// Its VmHWM, KiB, if readable.
        peak_rss_kib: Option<u64>,
    },
    /// It could not serve.
    Failed {
        /// Why, one line.
        message: String,
    },
}

/// Reads one line of at most [`MAX_LINE_BYTES`]; `None` at end of stream.
fn read_line(r: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    let n = r.by_ref().take(MAX_LINE_BYTES).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with('\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a line too long or cut short",
        ));
    }
    Ok(Some(line))
}

fn write_line<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

// ---------------------------------------------------------------- planning

/// How a server role of `flows` connections is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Processes {
    /// By the agent's own process, whose descriptor limit now holds them.
    One,
    /// By `count` shard processes holding at most `per_process`
    /// connections each.
    Shards {
        /// Shard processes.
        count: u32,
        /// Most connections each holds.
        per_process: u64,
    },
}

/// Decides how `flows` connections with `workers` engine workers per
/// process are served: in this process when its descriptor limit (raised
/// as far as allowed) holds them and they are within `forced` (an
/// agent-start cap of connections per process), else over as many shard
/// processes as the hard limit (and `forced`) needs. Refuses in one line
/// what [`MAX_SHARDS`] processes, or the system's `fs.file-max`, cannot
/// hold.
pub(crate) fn plan(flows: u64, workers: u64, forced: Option<u64>) -> Result<Processes, ShardError> {
    let needed = flows + workers + flows::limits::SPARE_FDS;
    if forced.is_none_or(|cap| flows <= cap) {
        match flows::ensure_fd_limit(needed) {
            Ok(_) => return Ok(Processes::One),
            Err(EngineError::TooFewDescriptors { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (_, hard) = flows::limits::fd_limits()?;
    let per_process =
        flows::limits::connections_per_process(hard, workers).min(forced.unwrap_or(u64::MAX));
    let (soft, _) = flows::limits::fd_limits()?;
    let count = if per_process == 0 {
        u64::MAX
    } else {
        flows.div_ceil(per_process)
    };
    if count > u64::from(MAX_SHARDS) {
        return Err(ShardError::TooManyShards {
            flows,
            needed: count,
            per_process,
            soft,
            hard,
            max: MAX_SHARDS,
        });
    }
    if let Some((in_use, max)) = flows::limits::system_files() {
        check_system_files(flows, in_use, max)?;
    }
    Ok(Processes::Shards {
        count: u32::try_from(count).unwrap_or(MAX_SHARDS),
        per_process,
    })
}

/// Refuses `flows` more open files when the system's `fs.file-max` would
/// not hold them.
fn check_system_files(flows: u64, in_use: u64, max: u64) -> Result<(), ShardError> {
    if in_use.saturating_add(flows) > max {
        return Err(ShardError::SystemFiles { flows, in_use, max });
    }
    Ok(())
}

// ------------------------------------------------------------- the agent

/// Counts of one shard's connections, as its last status said.
#[derive(Debug, Default)]
struct Counts {
    accepted: AtomicU64,
    open: AtomicU64,
}

/// What each shard's reader thread ends with.
type Report = Result<(ShardTotals, Option<u64>), String>;

/// One shard as the agent holds it.
struct Shard {
    stdin: Option<ChildStdin>,
    counts: Arc<Counts>,
    /// The shard's final report, once its reader has it.
    report: mpsc::Receiver<Report>,
    reader: Option<JoinHandle<()>>,
}

/// A server's shard processes, from the agent's side: started on one
/// listener, counted while they serve, stopped and summed; dropped, it
/// closes their stdin and kills and reaps what is left.
pub(crate) struct ShardSet {
    local_addr: SocketAddr,
    shards: Vec<Shard>,
    /// Holds the shard processes: their parent thread (their
    /// `PR_SET_PDEATHSIG` fires when it ends) and their reaper.
    keeper: Option<JoinHandle<()>>,
    /// Dropped to tell the keeper to reap.
    end: Option<mpsc::Sender<()>>,
    /// The shards' process ids, for tests and diagnostics.
    pids: Vec<u32>,
}

impl std::fmt::Debug for ShardSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardSet")
            .field("local_addr", &self.local_addr)
            .field("pids", &self.pids)
            .finish()
    }
}

/// What a stopped [`ShardSet`] moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardsOutcome {
    /// Every shard's totals, summed.
    pub totals: ServerTotals,
    /// The shards' peak resident memory, summed, KiB (those that could
    /// read theirs).
    pub peak_rss_kib: u64,
    /// Shard processes.
    pub processes: u32,
}

impl ShardSet {
    /// Binds `listener` already, and starts `count` shards of this binary
    /// on it, each with `config`; returns once every one serves.
    pub(crate) fn start(
        listener: TcpListener,
        config: &ShardConfig,
        count: u32,
    ) -> Result<ShardSet, ShardError> {
        ShardSet::start_with(PathBuf::from("/proc/self/exe"), listener, config, count)
    }

    /// [`ShardSet::start`] with the program to run as a shard (this binary,
    /// or one that has the [`SUBCOMMAND`]).
    pub(crate) fn start_with(
        exe: PathBuf,
        listener: TcpListener,
        config: &ShardConfig,
        count: u32,
    ) -> Result<ShardSet, ShardError> {
        config.validate()?;
        let local_addr = listener.local_addr().map_err(|source| ShardError::Io {
            what: "reading the listener's address".into(),
            source,
        })?;
        let (end_tx, end_rx) = mpsc::channel::<()>();
        let (spawned_tx, spawned_rx) = mpsc::channel();
        let keeper = std::thread::Builder::new()
            .name("flow shards".into())
            .spawn(move || keep(exe, listener, count, end_rx, spawned_tx))
            .map_err(|source| ShardError::Io {
                what: "starting the thread that holds the server processes".into(),
                source,
            })?;
        let mut set = ShardSet {
            local_addr,
            shards: Vec::new(),
            keeper: Some(keeper),
            end: Some(end_tx),
            pids: Vec::new(),
        };
        let total = count as usize;
        for index in 0..total {
            let started = spawned_rx
                .recv()
                .map_err(|_| ShardError::Shard {
                    index,
                    count: total,
                    detail: "the thread starting it ended".into(),
                })?
                .map_err(|source| ShardError::Io {
                    what: format!("starting server process {index} of {total}"),
                    source,
                })?;
            let (pid, mut stdin, stdout) = started;
            set.pids.push(pid);
            write_line(&mut stdin, config).map_err(|source| ShardError::Io {
                what: format!("configuring server process {index} of {total}"),
                source,
            })?;
            let counts = Arc::new(Counts::default());
            let (serving_tx, serving_rx) = mpsc::channel();
            let (report_tx, report_rx) = mpsc::channel();
            let c = Arc::clone(&counts);
            let reader = std::thread::Builder::new()
                .name(format!("flow shard {index}"))
                .spawn(move || read_shard(stdout, &c, &serving_tx, &report_tx))
                .map_err(|source| ShardError::Io {
                    what: "starting a server process's reader".into(),
                    source,
                })?;
            set.shards.push(Shard {
                stdin: Some(stdin),
                counts,
                report: report_rx,
                reader: Some(reader),
            });
            match serving_rx.recv_timeout(REPORT_TIMEOUT) {
                Ok(Ok(())) => {}
                Ok(Err(detail)) => {
                    return Err(ShardError::Shard {
                        index,
                        count: total,
                        detail,
                    })
                }
                Err(_) => {
                    let detail = match set.shards[index].report.try_recv() {
                        Ok(Err(d)) => d,
                        _ => format!("not serving within {REPORT_TIMEOUT:?}"),
                    };
                    return Err(ShardError::Shard {
                        index,
                        count: total,
                        detail,
                    });
                }
            }
        }
        Ok(set)
    }

    /// The listener's address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The shards' process ids.
    pub(crate) fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Connections the shards accepted so far, as last reported.
    pub(crate) fn accepted_connections(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.counts.accepted.load(Ordering::Relaxed))
            .sum()
    }

    /// Connections the shards hold open, as last reported.
    pub(crate) fn open_connections(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.counts.open.load(Ordering::Relaxed))
            .sum()
    }

    /// Tells every shard to stop, waits for their reports (each drains
    /// its exchanges under way first) and sums them.
    pub(crate) fn stop(mut self) -> Result<ShardsOutcome, ShardError> {
        for s in &mut self.shards {
            if let Some(mut stdin) = s.stdin.take() {
                // A shard already gone shows in its report.
                let _ = write_line(&mut stdin, &ToShard::Stop);
            }
        }
        let count = self.shards.len();
        let mut totals = ShardTotals::default();
        let mut peak_rss_kib = 0;
        let mut first_err = None;
        let deadline = Instant::now() + REPORT_TIMEOUT;
        for (index, s) in self.shards.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            match s.report.recv_timeout(left) {
                Ok(Ok((t, rss))) => {
                    totals.add(&t);
                    peak_rss_kib += rss.unwrap_or(0);
                }
                Ok(Err(detail)) => {
                    first_err.get_or_insert(ShardError::Shard {
                        index,
                        count,
                        detail,
                    });
                }
                Err(_) => {
                    first_err.get_or_insert(ShardError::Shard {
                        index,
                        count,
                        detail: format!("no report within {REPORT_TIMEOUT:?} of being stopped"),
                    });
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(ShardsOutcome {
                totals: totals.to_server(),
                peak_rss_kib,
                processes: u32::try_from(count).unwrap_or(u32::MAX),
            }),
        }
    }
}

impl Drop for ShardSet {
    fn drop(&mut self) {
        // Closing their stdin tells the shards to stop; the keeper then
        // gives them a moment and kills what is left, and reaps.
        for s in &mut self.shards {
            s.stdin.take();
        }
        drop(self.end.take());
        if let Some(k) = self.keeper.take() {
            let _ = k.join();
        }
        for s in &mut self.shards {
            if let Some(r) = s.reader.take() {
                let _ = r.join();
            }
        }
    }
}

/// A started shard: its pid and its pipes.
type Started = std::io::Result<(u32, ChildStdin, ChildStdout)>;

/// The keeper thread: starts the shards (so that their parent-death signal
/// is tied to this thread, which lives as long as the set), hands their
/// pipes over, waits for the set to end, then reaps them, killing those
/// still running after a short grace.
fn keep(
    exe: PathBuf,
    listener: TcpListener,
    count: u32,
    end: mpsc::Receiver<()>,
    spawned: mpsc::Sender<Started>,
) {
    let mut children: Vec<Child> = Vec::new();
    for _ in 0..count {
        match spawn_shard(&exe, &listener) {
            Ok(mut child) => {
                let pipes = (child.stdin.take(), child.stdout.take());
                let pid = child.id();
                children.push(child);
                let sent = match pipes {
                    (Some(i), Some(o)) => spawned.send(Ok((pid, i, o))),
                    _ => spawned.send(Err(std::io::Error::other("no pipes to the process"))),
                };
                if sent.is_err() {
                    break;
                }
            }
            Err(e) => {
                let _ = spawned.send(Err(e));
                break;
            }
        }
    }
    drop(spawned);
    // The shards hold the listener now; the agent's copy is not needed.
    drop(listener);
    // Returns when the set is dropped (its sender goes).
    let _ = end.recv();
    let grace_end = Instant::now() + Duration::from_secs(1);
    for c in &mut children {
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= grace_end => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

/// Starts one shard: this binary with the [`SUBCOMMAND`], the listener at
/// [`LISTENER_FD`], piped stdin and stdout, killed when its parent thread
/// ends.
fn spawn_shard(exe: &std::path::Path, listener: &TcpListener) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let fd = listener.as_raw_fd();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let mut cmd = Command::new(exe);
    cmd.arg(SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: prctl, getppid, dup2 and fcntl are async-signal-safe system
    // calls acting on this (forked) process only; `fd` is the listener's
    // descriptor, open in the parent (it is borrowed for this call) and so
    // in the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the signal was armed.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the agent ended"));
            }
            if fd == LISTENER_FD {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, LISTENER_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Reads a shard's lines: says when it serves (or why not), keeps its
/// counts, and ends with its report.
fn read_shard(
    stdout: ChildStdout,
    counts: &Counts,
    serving: &mpsc::Sender<Result<(), String>>,
    report: &mpsc::Sender<Report>,
) {
    let mut r = BufReader::new(stdout);
    let end: Report = loop {
        let line = match read_line(&mut r) {
            Ok(Some(l)) => l,
            Ok(None) => break Err("ended without its report".into()),
            Err(e) => break Err(format!("unreadable report: {e}")),
        };
        match serde_json::from_str::<FromShard>(&line) {
            Ok(FromShard::Serving) => {
                let _ = serving.send(Ok(()));
            }
            Ok(FromShard::Status { accepted, open }) => {
                counts.accepted.store(accepted, Ordering::Relaxed);
                counts.open.store(open, Ordering::Relaxed);
            }
            Ok(FromShard::Done {
                totals,
                peak_rss_kib,
            }) => break Ok((totals, peak_rss_kib)),
            Ok(FromShard::Failed { message }) => {
                let _ = serving.send(Err(message.clone()));
                break Err(message);
            }
            Err(e) => break Err(format!("unreadable report: {e}")),
        }
    };
    if let Err(e) = &end {
        let _ = serving.send(Err(e.clone()));
    }
    let _ = report.send(end);
}

// ------------------------------------------------------------- the shard

/// Runs this process as a shard (the binary's hidden `SUBCOMMAND`):
/// reads its configuration from stdin, serves on the listener it inherited
/// until told to stop or its stdin closes, and reports on stdout. A
/// failure is reported as `FromShard::Failed` and returned.
pub fn run_shard() -> Result<(), ShardError> {
    let mut out = std::io::stdout().lock();
    let result = serve_shard(&mut out);
    if let Err(e) = &result {
        let _ = write_line(
            &mut out,
            &FromShard::Failed {
                message: e.to_string(),
            },
        );
    }
    result
}

fn serve_shard(out: &mut impl Write) -> Result<(), ShardError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ShardError::Io { what, source }
    };
    let mut stdin = BufReader::new(std::io::stdin());
    let line = read_line(&mut stdin)
        .map_err(io("reading the configuration"))?
        .ok_or_else(|| ShardError::Config("no configuration on stdin".into()))?;
    let config: ShardConfig =
        serde_json::from_str(&line).map_err(|e| ShardError::Config(e.to_string()))?;
    let valid = config.validate()?;
    let listener = inherited_listener()?;
    let server = FlowServer::on_listener(listener, valid.work, valid.cfg, valid.max_open)?;
    write_line(out, &FromShard::Serving).map_err(io("reporting"))?;
    // Any line (a stop), the end of stdin or an unreadable stdin: stop.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("shard control".into())
        .spawn(move || {
            let _ = read_line(&mut stdin);
            flag.store(true, Ordering::Relaxed);
        })
        .map_err(io("starting the control reader"))?;
    while !stop.load(Ordering::Relaxed) {
        let status = FromShard::Status {
            accepted: server.accepted_connections(),
            open: server.open_connections() as u64,
        };
        if write_line(out, &status).is_err() {
            // The agent is gone: stop serving.
            break;
        }
        std::thread::sleep(STATUS_EVERY);
    }
    let totals = server.stop()?;
    let done = FromShard::Done {
        totals: ShardTotals::from(&totals),
        peak_rss_kib: netgap_transport::cpu::peak_rss_kib(),
    };
    write_line(out, &done).map_err(io("reporting"))?;
    Ok(())
}

/// Takes [`LISTENER_FD`] as the shared listener, once it is seen to be a
/// listening TCP socket.
fn inherited_listener() -> Result<TcpListener, ShardError> {
    use nix::sys::socket::{getsockopt, sockopt};
    // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags; it fails
    // (EBADF) when the descriptor is not open.
    if unsafe { libc::fcntl(LISTENER_FD, libc::F_GETFD) } < 0 {
        return Err(ShardError::NoListener);
    }
    // SAFETY: the descriptor is open (checked above) and nothing else in
    // this process owns it: the agent put it there for this process, and
    // the standard streams are 0 to 2.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(LISTENER_FD) };
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    let stream =
        getsockopt(&fd, sockopt::SockType).is_ok_and(|t| t == nix::sys::socket::SockType::Stream);
    if !listening || !stream {
        return Err(ShardError::NoListener);
    }
    let listener = TcpListener::from(fd);
    match listener.local_addr() {
        Ok(_) => Ok(listener),
        Err(_) => Err(ShardError::NoListener),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn config() -> ShardConfig {
        let mut cfg = EngineConfig::tcp(2, Duration::from_secs(3));
        cfg.token = Some(DataToken::from_bytes([7; 32]));
        ShardConfig::new(
            &cfg,
            FlowWork::Connect {
                request_bytes: 1,
                reply_bytes: 2,
            },
            500,
        )
    }

    #[test]
    fn a_configuration_travels_and_validates() {
        let c = config();
        let line = serde_json::to_string(&c).unwrap();
        let back: ShardConfig = serde_json::from_str(&line).unwrap();
        assert_eq!(back, c);
        let v = back.validate().unwrap();
        assert_eq!(v.max_open, 500);
        assert_eq!(v.cfg.workers, 2);
        assert_eq!(v.cfg.io_timeout, Duration::from_secs(3));
        assert!(v.cfg.token.is_some());
        assert_eq!(
            v.work,
            FlowWork::Connect {
                request_bytes: 1,
                reply_bytes: 2
            }
        );
    }

    #[test]
    fn a_configuration_out_of_range_is_refused() {
        let bad = |f: fn(&mut ShardConfig)| {
            let mut c = config();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.workers = 0).contains("workers"));
        assert!(bad(|c| c.workers = MAX_SHARD_WORKERS + 1).contains("workers"));
        assert!(bad(|c| c.io_timeout_ms = 0).contains("timeout"));
        assert!(bad(|c| c.max_open = 0).contains("cap"));
        assert!(bad(|c| c.transport = "carrier-pigeon".into()).contains("unknown transport"));
        assert!(bad(|c| c.transport = "udp".into()).contains("one process"));
        // Unknown fields and kinds do not parse.
        let mut v = serde_json::to_value(config()).unwrap();
        v["extra"] = 1.into();
        assert!(serde_json::from_value::<ShardConfig>(v).is_err());
        assert!(serde_json::from_str::<FromShard>(r#"{"kind":"exec","cmd":"sh"}"#).is_err());
    }

    #[test]
    fn lines_are_bounded() {
        let long = vec![b'x'; MAX_LINE_BYTES as usize + 10];
        assert!(read_line(&mut &long[..]).is_err());
        assert_eq!(read_line(&mut &b""[..]).unwrap(), None);
        assert_eq!(
            read_line(&mut &b"{}\n"[..]).unwrap().as_deref(),
            Some("{}\n")
        );
    }

    #[test]
    fn the_plan_keeps_a_role_in_one_process_when_it_fits_and_caps_shards() {
        assert_eq!(plan(10, 2, None).unwrap(), Processes::One);
        assert_eq!(plan(400, 2, Some(500)).unwrap(), Processes::One);
        assert_eq!(
            plan(2000, 2, Some(500)).unwrap(),
            Processes::Shards {
                count: 4,
                per_process: 500
            }
        );
        assert_eq!(
            plan(2001, 2, Some(500)).unwrap(),
            Processes::Shards {
                count: 5,
                per_process: 500
            }
        );
        let e = plan(500 * u64::from(MAX_SHARDS) + 1, 2, Some(500))
            .unwrap_err()
            .to_string();
        assert!(e.contains("server processes") && e.contains("16"), "{e}");
        assert!(check_system_files(1000, 100, 2000).is_ok());
        let e = check_system_files(1000, 1500, 2000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fs.file-max"), "{e}");
    }

    #[test]
    fn totals_travel_and_sum() {
        let t = ServerTotals {
            bytes_rx: 5,
            bytes_tx: 6,
            connections_accepted: 2,
            connections_completed: 1,
            errors: 1,
            strangers: 1,
            datagrams: None,
        };
        let mut s = ShardTotals::from(&t);
        s.add(&ShardTotals::from(&t));
        assert_eq!(s.to_server().bytes_rx, 10);
        assert_eq!(s.to_server().connections_accepted, 4);
        let msg = FromShard::Done {
            totals: s,
            peak_rss_kib: Some(7),
        };
        let line = serde_json::to_string(&msg).unwrap();
        assert_eq!(serde_json::from_str::<FromShard>(&line).unwrap(), msg);
    }
}
