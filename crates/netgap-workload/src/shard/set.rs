//! The agent's side: the shard processes of one role started on the
//! inherited listener, kept and watched through their reports, stopped,
//! and their totals summed into the role's.

use super::message::{read_line, write_line, FromShard, ShardConfig, ShardTotals, ToShard};
use super::{ShardError, ShardFailure, LISTENER_FD, REPORT_TIMEOUT, SUBCOMMAND};
use netgap_transport::flows::ServerTotals;
use std::io::BufReader;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Counts of one shard's connections, as its last status said.
#[derive(Debug, Default)]
struct Counts {
    accepted: AtomicU64,
    open: AtomicU64,
}

/// What each shard's reader thread ends with.
type Report = Result<(ShardTotals, Option<u64>), ShardFailure>;

/// One shard as the agent holds it.
pub(super) struct Shard {
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
                    detail: ShardFailure::StarterEnded,
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
                        _ => ShardFailure::NotServing(REPORT_TIMEOUT),
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
                        detail: ShardFailure::NoReport(REPORT_TIMEOUT),
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
    serving: &mpsc::Sender<Result<(), ShardFailure>>,
    report: &mpsc::Sender<Report>,
) {
    let mut r = BufReader::new(stdout);
    let end: Report = loop {
        let line = match read_line(&mut r) {
            Ok(Some(l)) => l,
            Ok(None) => break Err(ShardFailure::Ended),
            Err(e) => break Err(ShardFailure::Unreadable(Arc::new(e))),
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
                let failure = ShardFailure::Failed(message);
                let _ = serving.send(Err(failure.clone()));
                break Err(failure);
            }
            Err(e) => break Err(ShardFailure::Garbled(Arc::new(e))),
        }
    };
    if let Err(e) = &end {
        let _ = serving.send(Err(e.clone()));
    }
    let _ = report.send(end);
}
