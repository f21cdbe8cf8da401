//! Where netgap's preload sockets library (`libnetgap_preload.so`) is:
//! `NETGAP_PRELOAD` if set, else next to the running netgap binary. One
//! lookup for `netgap wrap` and for the workloads that run real programs
//! under the library.

use netgap_core::spec::PointSpec;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The library's file name.
pub const LIBRARY_FILE: &str = "libnetgap_preload.so";
/// Environment variable naming the library, overriding the search next to
/// the netgap binary.
pub const LIBRARY_ENV: &str = "NETGAP_PRELOAD";

/// The library is not where it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the preload library {} is missing (build it with `cargo build -p netgap-preload`, adding `--features xdp` for direct connections to other hosts, or set {LIBRARY_ENV})", .0.display())]
pub struct LibraryMissing(pub PathBuf);

/// The library: `NETGAP_PRELOAD` if set, else next to the running binary;
/// an error naming the path looked at when no file is there.
pub fn library_path() -> Result<PathBuf, LibraryMissing> {
    library_at(std::env::var_os(LIBRARY_ENV))
}

/// The library named by `named` (`NETGAP_PRELOAD`'s value) or else next to
/// the running binary, as an absolute path: the programs started under it
/// run in other directories, and the loader ignores an `LD_PRELOAD` it
/// cannot open (a relative one, from elsewhere), starting the program
/// without the library and saying so only on its standard error.
fn library_at(named: Option<OsString>) -> Result<PathBuf, LibraryMissing> {
    let path = match named {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join(LIBRARY_FILE)))
            .unwrap_or_else(|| PathBuf::from(LIBRARY_FILE)),
    };
    let path = std::path::absolute(&path).unwrap_or(path);
    if path.is_file() {
        Ok(path)
    } else {
        Err(LibraryMissing(path))
    }
}

/// Environment variable telling the library its stack (`shm`, or `xdp`:
/// connections to other hosts through the host's relay too).
pub const STACK_ENV: &str = "NETGAP_PRELOAD_STACK";

/// Environment variable asking the library for direct connections to
/// other hosts (`1`, each on an AF_XDP socket of the program's own) or not
/// (anything else).
pub const DIRECT_ENV: &str = "NETGAP_PRELOAD_DIRECT";

/// Environment variable naming the file the library logs to.
pub const LOG_ENV: &str = "NETGAP_PRELOAD_LOG";

/// What the programs a role runs under the library are started with: the
/// library's stack, and whether they ask for direct connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LibraryStack {
    /// The library's stack, the point's transport (`shm`, or `xdp`: also
    /// through the host's relay).
    pub(crate) name: String,
    /// The programs ask for direct connections: under xdp, unless the
    /// point keeps them on the relays (`--preload-relayed`).
    pub(crate) direct: bool,
}

impl LibraryStack {
    /// The stack of `point`'s programs.
    pub(crate) fn of(point: &PointSpec) -> LibraryStack {
        LibraryStack {
            name: point.transport.clone(),
            direct: point.transport == "xdp" && !point.options.preload_relayed,
        }
    }

    /// The environment a program starts with under `library`: `LD_PRELOAD`
    /// ([`preload_value`]), the stack, whether it asks for direct
    /// connections (`1` or `0`, always given, so a `NETGAP_PRELOAD_DIRECT`
    /// in the agent's own environment never reaches a run that did not ask
    /// for them), and the library's log at `log`.
    pub(crate) fn env(&self, library: &Path, log: &Path) -> [(OsString, OsString); 4] {
        [
            ("LD_PRELOAD".into(), preload_value(library)),
            (STACK_ENV.into(), self.name.clone().into()),
            (
                DIRECT_ENV.into(),
                if self.direct { "1" } else { "0" }.into(),
            ),
            (LOG_ENV.into(), log.into()),
        ]
    }
}

impl std::fmt::Display for LibraryStack {
    /// `shm`, `xdp with direct connections` or `xdp through the relays`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        match (self.name.as_str(), self.direct) {
            (_, true) => f.write_str(" with direct connections"),
            ("xdp", false) => f.write_str(" through the relays"),
            _ => Ok(()),
        }
    }
}

/// `LD_PRELOAD` with `library` first, keeping what this process's
/// `LD_PRELOAD` held.
pub fn preload_value(library: &Path) -> OsString {
    let mut v = OsString::from(library);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// The abstract Unix socket a host's relay (`netgap relay`) listens on.
pub const RELAY_SOCKET: &[u8] = b"netgap-relay";

/// Whether a relay (`netgap relay`) of root's listens in this network
/// namespace: anyone can bind its name, and the library uses only a relay
/// the kernel says is root's (`SO_PEERCRED`), so a squatter counts as none.
pub fn relay_present() -> bool {
    // The relay's socket is a SOCK_SEQPACKET one: a stream socket cannot
    // connect to it.
    use nix::sys::socket::{
        connect, getsockopt, socket, sockopt::PeerCredentials, AddressFamily, SockFlag, SockType,
        UnixAddr,
    };
    use std::os::fd::AsRawFd;
    let Ok(fd) = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    let Ok(a) = UnixAddr::new_abstract(RELAY_SOCKET) else {
        return false;
    };
    connect(fd.as_raw_fd(), &a).is_ok()
        && getsockopt(&fd, PeerCredentials).is_ok_and(|c| c.uid() == 0)
}

/// Domain separation of the relays' key, derived from the agents' key.
pub const RELAY_KEY_CONTEXT: &[u8] = b"netgap relay v1: the relays' key, from the agents' key";

/// Bytes of the relays' key an agent derives.
pub const RELAY_KEY_BYTES: usize = 32;

/// What an agent gives the relays it starts for `-t xdp` runs
/// (`netgap serve --relay-interface`): the interface their xdp flows take,
/// and their shared key, derived from the agents' own key, so the relays
/// of agents that share a key share theirs, while the agents' key itself
/// never leaves the agent.
#[derive(Clone)]
pub struct RelaySetup {
    interface: String,
    key: [u8; RELAY_KEY_BYTES],
}

impl std::fmt::Debug for RelaySetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key's bytes never appear in a log.
        f.debug_struct("RelaySetup")
            .field("interface", &self.interface)
            .finish_non_exhaustive()
    }
}

/// Why a relay cannot be set up or started, one line (the relay's own
/// last word when it exits: no xdp in this build, not root, a bad
/// interface).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// `--relay-interface` is not an interface name.
    #[error("{name:?} is not an interface name")]
    BadInterface {
        /// The name given, control characters escaped.
        name: String,
    },
    /// No relay runs and the agent has no interface to start one on.
    #[error("no relay runs on this host and this agent has no interface for one (start the agent with `netgap serve --relay-interface NAME --key FILE`; a testbed with --links 2 or more does)")]
    NoInterface,
    /// The session names no host for the relay to serve.
    #[error("the session names no host for the relay to serve")]
    NoPeers,
    /// The directory for the relay's key could not be made.
    #[error("a directory for the relay's key: {source}")]
    KeyDir {
        /// Why.
        source: crate::confined::ConfinedError,
    },
    /// The relay's key could not be written.
    #[error("the relay's key: {source}")]
    Key {
        /// Why.
        source: crate::confined::ConfinedError,
    },
    /// netgap's own binary, which runs the relay, was not found.
    #[error("finding netgap's own binary: {source}")]
    OwnBinary {
        /// Why.
        source: std::io::Error,
    },
    /// The thread that starts and waits for the relay could not start.
    #[error("a thread for the relay: {source}")]
    Thread {
        /// Why.
        source: std::io::Error,
    },
    /// The relay's process could not start.
    #[error("starting {exe} relay: {source}")]
    Spawn {
        /// The binary started.
        exe: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The relay's log could not be made.
    #[error("the relay's log: {source}")]
    Log {
        /// Why.
        source: std::io::Error,
    },
    /// The thread that starts the relay could not enter its network
    /// namespace.
    #[error("entering network namespace {netns}: {source}")]
    Namespace {
        /// The namespace.
        netns: String,
        /// Why.
        source: netgap_transport::netns::NetnsError,
    },
    /// The thread that starts the relay ended without a word.
    #[error("the relay's thread ended")]
    ThreadEnded,
    /// The relay exited before it listened.
    #[error("the relay exited: {said}")]
    Exited {
        /// The last line of its log, control characters escaped.
        said: String,
    },
    /// The relay did not listen within `RELAY_START_WAIT`.
    #[error("the relay did not listen in time: {said}")]
    Late {
        /// The last line of its log, control characters escaped.
        said: String,
    },
}

impl RelaySetup {
    /// The setup for relays on `interface` (an interface name: 1 to 15
    /// bytes, none of `/`, whitespace or control characters), their key
    /// derived from `agent_key`.
    pub fn new(
        interface: &str,
        agent_key: &netgap_proto::auth::Key,
    ) -> Result<RelaySetup, RelayError> {
        let ok = (1..16).contains(&interface.len())
            && interface
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
        if !ok {
            return Err(RelayError::BadInterface {
                name: netgap_core::text::escape_control(interface).into_owned(),
            });
        }
        Ok(RelaySetup {
            interface: interface.to_string(),
            key: agent_key.derive(RELAY_KEY_CONTEXT, &[]),
        })
    }

    /// The interface the relays' xdp flows take.
    pub fn interface(&self) -> &str {
        &self.interface
    }
}

/// A relay a role started for its run (`-t xdp` under the library),
/// stopped when dropped; or nothing, when one already ran.
pub(crate) struct RelayGuard {
    /// The relay's process group (its pid) and the thread that waits for
    /// it (the relay dies with that thread: `PR_SET_PDEATHSIG`).
    started: Option<(i32, std::thread::JoinHandle<()>)>,
}

impl RelayGuard {
    /// CPU time, ns, the kernel has accounted so far to the relay this
    /// guard started (0 for one that already ran: it is not the run's).
    pub(crate) fn cpu_ns(&self) -> u64 {
        self.started
            .as_ref()
            .and_then(|(pid, _)| u32::try_from(*pid).ok())
            .map_or(0, crate::service::tree_cpu_ns)
    }

    /// Whether the relay was started for this run (its CPU is counted).
    pub(crate) fn started(&self) -> bool {
        self.started.is_some()
    }
}

impl Drop for RelayGuard {
    fn drop(&mut self) {
        if let Some((pid, waiter)) = self.started.take() {
            // SAFETY: a signal to the process group of the relay this
            // guard started, still unreaped (its waiter holds it).
            unsafe { libc::kill(-pid, libc::SIGTERM) };
            let _ = waiter.join();
        }
    }
}

/// How long a started relay has to listen.
const RELAY_START_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Makes sure a relay carries this network namespace's relayed
/// connections for the role's run: the one that runs, or `netgap relay`
/// (this binary) started as root on the agent's relay interface, serving
/// `peers` (the session's hosts), with room for `connections`
/// connections and its log in `log`, stopped when the guard drops. Its key
/// goes to it in a file made fresh (0600) in a directory of its own
/// (0700) in the agent's run directory, removed once the relay listens
/// (it read the key before). An error is one line (the relay's own, when
/// it exits: no xdp in this build, not root, a bad interface).
pub(crate) fn ensure_relay(
    log: std::fs::File,
    log_path: &Path,
    connections: u32,
    relay: Option<&RelaySetup>,
    peers: &[std::net::IpAddr],
    dirs: &crate::confined::AgentDirs,
) -> Result<RelayGuard, RelayError> {
    if relay_present() {
        return Ok(RelayGuard { started: None });
    }
    let Some(setup) = relay else {
        return Err(RelayError::NoInterface);
    };
    if peers.is_empty() {
        return Err(RelayError::NoPeers);
    }
    let peers = peers
        .iter()
        .map(std::string::ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let key_dir = dirs
        .run_dir()
        .and_then(|d| d.fresh_subdir(&crate::confined::fresh_name("relay-key"), 0o700))
        .map_err(|source| RelayError::KeyDir { source })?;
    key_dir
        .write_file("key", &setup.key, 0o600)
        .map_err(|source| RelayError::Key { source })?;
    let key_path = key_dir.path().join("key");
    let cap = connections.clamp(16, 1024).to_string();
    let args: Vec<OsString> = vec![
        "relay".into(),
        "--max-per-uid".into(),
        cap.clone().into(),
        "--max-total".into(),
        cap.into(),
        "--interface".into(),
        setup.interface.clone().into(),
        "--peers".into(),
        peers.into(),
        "--key".into(),
        key_path.into_os_string(),
    ];
    let (pid, waiter) = spawn_relay(None, args, log)?;
    let guard = RelayGuard {
        started: Some((pid, waiter)),
    };
    await_relay(None, log_path, || {
        guard.started.as_ref().is_some_and(|(_, w)| w.is_finished())
    })?;
    // The relay read its key before it listened.
    drop(key_dir);
    Ok(guard)
}

/// Whether a relay of root's listens in network namespace `netns` (this
/// process's own when None): [`relay_present`] asked from a thread that
/// enters it, so this thread's namespace stays as it is.
pub fn relay_present_in(netns: Option<&str>) -> bool {
    let Some(netns) = netns else {
        return relay_present();
    };
    let netns = netns.to_string();
    std::thread::spawn(move || netgap_transport::netns::enter(&netns).is_ok() && relay_present())
        .join()
        .unwrap_or(false)
}

/// Waits until a relay just started ([`spawn_relay`]) listens in network
/// namespace `netns` (this process's own when None), for at most
/// `RELAY_START_WAIT`; `exited` says whether its process ended. When it
/// exits first, or is late, the last line of its log at `log` is its word
/// (control characters escaped) in the error.
pub fn await_relay(
    netns: Option<&str>,
    log: &Path,
    exited: impl Fn() -> bool,
) -> Result<(), RelayError> {
    let t0 = std::time::Instant::now();
    while !relay_present_in(netns) {
        let gone = exited();
        if gone || t0.elapsed() > RELAY_START_WAIT {
            let said = std::fs::read_to_string(log).unwrap_or_default();
            let line = said.lines().last().unwrap_or("no word in its log").trim();
            let said = netgap_core::text::escape_control(line).into_owned();
            return Err(if gone {
                RelayError::Exited { said }
            } else {
                RelayError::Late { said }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// Starts netgap's own binary with `args` (a `relay` command line) in a
/// process group of its own, its standard error to `log`, from a thread
/// that waits for it, so the relay dies with that thread
/// (`PR_SET_PDEATHSIG`); in network namespace `netns` when given (the
/// thread enters it and the relay inherits it). The relay's process group
/// and the thread.
pub fn spawn_relay(
    netns: Option<&str>,
    args: Vec<OsString>,
    log: std::fs::File,
) -> Result<(i32, std::thread::JoinHandle<()>), RelayError> {
    let exe = std::env::current_exe().map_err(|source| RelayError::OwnBinary { source })?;
    let netns = netns.map(str::to_string);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::Builder::new()
        .name("relay".into())
        .spawn(move || {
            if let Some(ns) = &netns {
                if let Err(source) = netgap_transport::netns::enter(ns) {
                    let _ = tx.send(Err(RelayError::Namespace {
                        netns: ns.clone(),
                        source,
                    }));
                    return;
                }
            }
            let mut cmd = crate::tether::command_in_group(&exe, &args, None);
            cmd.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(log);
            match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id() as i32));
                    let _ = child.wait();
                }
                Err(e) => {
                    let _ = tx.send(Err(RelayError::Spawn {
                        exe: exe.clone(),
                        source: e,
                    }));
                }
            }
        })
        .map_err(|source| RelayError::Thread { source })?;
    match rx.recv() {
        Ok(Ok(pid)) => Ok((pid, waiter)),
        Ok(Err(e)) => {
            let _ = waiter.join();
            Err(e)
        }
        Err(_) => {
            let _ = waiter.join();
            Err(RelayError::ThreadEnded)
        }
    }
}

/// What one process's preload log (`NETGAP_PRELOAD_LOG`) says of the
/// connections it made and accepted: how many moved to shared memory, how
/// many stayed on the kernel's TCP and why, and the bytes each carried.
/// A run under the library reads its programs' logs into this, so a
/// connection that fell back is counted, never passed off as shm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSummary {
    /// Connections this process made that moved to shm.
    pub connected_shm: u64,
    /// Connections this process made that stayed on the kernel's TCP.
    pub connected_kernel: u64,
    /// Connections this process accepted that moved to shm.
    pub accepted_shm: u64,
    /// Connections this process accepted that stayed on the kernel's TCP.
    pub accepted_kernel: u64,
    /// Connections whose setup failed (the program saw ECONNRESET).
    pub failed: u64,
    /// Why connections stayed on the kernel's TCP: each reason and how
    /// many times it was given.
    pub fallback_reasons: std::collections::BTreeMap<String, u64>,
    /// Payload bytes the closed shm connections sent over their rings.
    pub shm_sent_bytes: u64,
    /// Payload bytes the closed shm connections received over their rings.
    pub shm_received_bytes: u64,
    /// Bytes the closed shm connections' kernel sockets sent (setup and
    /// wake-ups).
    pub kernel_tcp_sent_bytes: u64,
    /// Bytes the closed shm connections' kernel sockets received.
    pub kernel_tcp_received_bytes: u64,
    /// Shm connections whose close was logged.
    pub closed_shm: u64,
    /// Connections this process made that moved to xdp through the host's
    /// relay.
    pub connected_xdp: u64,
    /// Connections this process accepted that moved to xdp through the
    /// host's relay.
    pub accepted_xdp: u64,
    /// Payload bytes the closed connections across hosts moved, both
    /// ways: the relayed ones through their rings to and from the relay,
    /// the direct ones on their own AF_XDP sockets (also in
    /// `direct_bytes`).
    pub xdp_bytes: u64,
    /// Relayed connections whose close was logged.
    pub closed_xdp: u64,
    /// Connections this process made that moved to a direct AF_XDP
    /// socket of their own.
    pub connected_direct: u64,
    /// Connections this process accepted that moved to a direct AF_XDP
    /// socket of their own.
    pub accepted_direct: u64,
    /// Direct requests refused, so the connection went on the relay's
    /// path: each reason and how many times it was given.
    pub direct_refusals: std::collections::BTreeMap<String, u64>,
    /// Payload bytes the closed direct connections sent and received.
    pub direct_bytes: u64,
    /// Direct connections whose close was logged.
    pub closed_direct: u64,
    /// The last [`MAX_NOTES`] lines of the library's other than a
    /// connection's routine move or close (a fallback, a refusal, a
    /// failure, a warning), whole, in the log's order: what explains a
    /// point whose transactions failed.
    pub notes: Vec<String>,
}

/// Most of the library's lines a [`LogSummary`] keeps as notes.
pub const MAX_NOTES: usize = 6;

impl LogSummary {
    /// The counts a record carries in its application metrics: connections
    /// moved to shm, to xdp across hosts (relayed or direct; the direct
    /// ones also as `preload_direct`) and kept on the kernel's TCP (setup
    /// failures count as kept), and the bytes the rings and the kernel
    /// sockets carried.
    pub fn record_metrics(&self) -> [(&'static str, f64); 7] {
        [
            ("preload_shm_connections", self.connected_shm as f64),
            ("preload_direct", self.connected_direct as f64),
            (
                "preload_xdp_connections",
                (self.connected_xdp + self.connected_direct) as f64,
            ),
            ("preload_xdp_bytes", self.xdp_bytes as f64),
            (
                "preload_kernel_connections",
                (self.connected_kernel + self.failed) as f64,
            ),
            (
                "preload_shm_bytes",
                (self.shm_sent_bytes + self.shm_received_bytes) as f64,
            ),
            (
                "preload_kernel_tcp_bytes",
                (self.kernel_tcp_sent_bytes + self.kernel_tcp_received_bytes) as f64,
            ),
        ]
    }

    /// Reads the library's log lines (`netgap-preload[PID]: ...`); lines
    /// of other programs and lines it does not know are skipped.
    pub fn parse(text: &str) -> LogSummary {
        let mut s = LogSummary::default();
        for line in text.lines() {
            let Some(rest) = line
                .strip_prefix("netgap-preload[")
                .and_then(|r| r.split_once("]: "))
                .map(|(_, r)| r)
            else {
                continue;
            };
            if !s.add(rest) {
                if s.notes.len() == MAX_NOTES {
                    s.notes.remove(0);
                }
                s.notes.push(line.to_string());
            }
        }
        s
    }

    /// Reads a program's library log through the descriptor the agent
    /// kept (at most its first 16 MiB).
    pub(crate) fn read(log: &std::fs::File) -> LogSummary {
        use std::os::unix::fs::FileExt as _;
        let len = log.metadata().map_or(0, |m| m.len()).min(16 << 20);
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
        let n = log.read_at(&mut buf, 0).unwrap_or(0);
        LogSummary::parse(&String::from_utf8_lossy(&buf[..n]))
    }

    /// Connections that stayed on the kernel's TCP, either side.
    pub fn kernel_connections(&self) -> u64 {
        self.connected_kernel + self.accepted_kernel
    }

    /// Counts one of the library's lines (without its `netgap-preload[PID]: `);
    /// whether it was a connection's routine move or close.
    fn add(&mut self, event: &str) -> bool {
        // "fd N: ..." or "fd N (accepted on fd M): ..."
        let Some((_, what)) = event.split_once(": ") else {
            return false;
        };
        const KEPT: &str = "stays on the kernel's TCP: ";
        const RELAYED: &str = "moved to xdp via the relay";
        const DIRECT: &str = "moved to direct on queue ";
        let relayed = what.strip_prefix("relayed connection closed (");
        if let Some(counters) = relayed.or_else(|| what.strip_prefix("shm connection closed (")) {
            // A relayed connection's ring counters are what crossed the
            // relay; either's kernel socket bytes are setup and wake-ups.
            let is_relayed = relayed.is_some();
            if is_relayed {
                self.closed_xdp += 1;
            } else {
                self.closed_shm += 1;
            }
            for field in counters.split_whitespace() {
                let Some((k, v)) = field.split_once('=') else {
                    continue;
                };
                let Ok(v) = v.parse::<u64>() else {
                    continue;
                };
                let slot = match (k, is_relayed) {
                    ("shm_sent_bytes" | "shm_received_bytes", true) => &mut self.xdp_bytes,
                    ("shm_sent_bytes", false) => &mut self.shm_sent_bytes,
                    ("shm_received_bytes", false) => &mut self.shm_received_bytes,
                    ("kernel_tcp_sent_bytes", _) => &mut self.kernel_tcp_sent_bytes,
                    ("kernel_tcp_received_bytes", _) => &mut self.kernel_tcp_received_bytes,
                    _ => continue,
                };
                *slot = slot.saturating_add(v);
            }
            true
        } else if let Some(rest) = what.strip_prefix("direct connection on queue ") {
            // "Q closed: S bytes sent, R received, ..."
            let Some((_, counts)) = rest.split_once(" closed: ") else {
                return false;
            };
            self.closed_direct += 1;
            let mut parts = counts.split(", ");
            let sent = parts.next().and_then(|p| p.strip_suffix(" bytes sent"));
            let received = parts.next().and_then(|p| p.strip_suffix(" received"));
            for n in [sent, received].into_iter().flatten() {
                if let Ok(v) = n.parse::<u64>() {
                    self.direct_bytes = self.direct_bytes.saturating_add(v);
                    self.xdp_bytes = self.xdp_bytes.saturating_add(v);
                }
            }
            true
        } else if let Some(why) = what.strip_prefix("relay: ") {
            *self.direct_refusals.entry(why.to_string()).or_insert(0) += 1;
            false
        } else if what
            .strip_prefix("accepted connection ")
            .is_some_and(|w| w.starts_with(DIRECT))
        {
            self.accepted_direct += 1;
            true
        } else if what == format!("accepted connection {RELAYED}") {
            self.accepted_xdp += 1;
            true
        } else if what == "accepted connection moved to shm" {
            self.accepted_shm += 1;
            true
        } else if let Some(why) = what
            .strip_prefix("accepted connection ")
            .and_then(|w| w.strip_prefix(KEPT))
        {
            self.accepted_kernel += 1;
            *self.fallback_reasons.entry(why.to_string()).or_insert(0) += 1;
            false
        } else if let Some(why) = what.strip_prefix(KEPT) {
            // "fd N (accepted on fd M): stays on ..."
            self.accepted_kernel += 1;
            *self.fallback_reasons.entry(why.to_string()).or_insert(0) += 1;
            false
        } else if let Some(rest) = what.strip_prefix("connection to port ") {
            let rest = rest.split_once(' ').map_or("", |(_, r)| r);
            if rest == "moved to shm" {
                self.connected_shm += 1;
            } else if rest == RELAYED {
                self.connected_xdp += 1;
            } else if rest.starts_with(DIRECT) {
                self.connected_direct += 1;
            } else {
                if let Some(why) = rest.strip_prefix(KEPT) {
                    self.connected_kernel += 1;
                    *self.fallback_reasons.entry(why.to_string()).or_insert(0) += 1;
                } else if rest.starts_with("fails ") {
                    self.failed += 1;
                }
                return false;
            }
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    /// A relative `NETGAP_PRELOAD` is made absolute where it is read: the
    /// programs under the library run elsewhere.
    #[test]
    fn a_relative_library_path_is_made_absolute() {
        // The crate's directory is the test's: its manifest is a file there.
        let found = library_at(Some("Cargo.toml".into())).unwrap();
        assert!(found.is_absolute(), "{}", found.display());
        assert!(found.ends_with("Cargo.toml"));
        let missing = library_at(Some("no-such-library.so".into())).unwrap_err();
        assert!(missing.0.is_absolute(), "{}", missing.0.display());
    }

    #[test]
    fn a_program_s_environment_always_says_whether_it_goes_direct() {
        let point = |direct: bool| PointSpec {
            test: "web".into(),
            transport: "xdp".into(),
            mode: netgap_core::spec::Mode::Event,
            size_bytes: 1024,
            options: netgap_core::spec::TransportOptions {
                preload_relayed: !direct,
                ..netgap_core::spec::TransportOptions::default()
            },
            server_cpu: None,
            io_timeout_ms: 3000,
            verify: false,
        };
        let env_of = |point: &PointSpec| {
            LibraryStack::of(point).env(
                Path::new("/opt/libnetgap_preload.so"),
                Path::new("/run/x/preload.log"),
            )
        };
        let env = |direct: bool| env_of(&point(direct));
        let value = |env: &[(OsString, OsString)], key: &str| {
            env.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let on = env(true);
        assert_eq!(value(&on, DIRECT_ENV), "1");
        assert_eq!(value(&on, STACK_ENV), "xdp");
        assert_eq!(value(&on, LOG_ENV), "/run/x/preload.log");
        assert!(value(&on, "LD_PRELOAD")
            .to_string_lossy()
            .starts_with("/opt/libnetgap_preload.so"));
        // Off is said too, so an agent started with the variable does not
        // hand it to a run that did not ask.
        assert_eq!(value(&env(false), DIRECT_ENV), "0");
        assert_eq!(
            LibraryStack::of(&point(true)).to_string(),
            "xdp with direct connections"
        );
        assert_eq!(
            LibraryStack::of(&point(false)).to_string(),
            "xdp through the relays"
        );
        // Shared memory has no direct connections to ask for.
        let shm = PointSpec {
            transport: "shm".into(),
            ..point(true)
        };
        assert_eq!(value(&env_of(&shm), DIRECT_ENV), "0");
        assert_eq!(LibraryStack::of(&shm).to_string(), "shm");
    }

    #[test]
    fn a_log_counts_each_side_each_fallback_and_the_closed_connections_bytes() {
        let log = "\
netgap-preload[7]: fd 5: connection to port 8080 moved to shm
netgap-preload[7]: fd 6: connection to port 8080 moved to shm
netgap-preload[7]: fd 7: connection to port 8080 stays on the kernel's TCP: no listener with the library there
netgap-preload[7]: fd 8: connection to port 8080 fails (ECONNRESET): no answer
netgap-preload[9]: fd 11: accepted connection moved to shm
netgap-preload[9]: fd 12: accepted connection stays on the kernel's TCP: the first bytes are no hello
netgap-preload[9]: fd 13 (accepted on fd 4): stays on the kernel's TCP: the peer is not on this host
netgap-preload[7]: fd 5: shm connection closed (connector): shm_sent_bytes=100 shm_received_bytes=2000 doorbells_sent=3 kernel_tcp_sent_bytes=40 kernel_tcp_received_bytes=8
netgap-preload[9]: fd 11: shm connection closed (listener): shm_sent_bytes=2000 shm_received_bytes=100 doorbells_sent=2 kernel_tcp_sent_bytes=9 kernel_tcp_received_bytes=40
nginx: something else
netgap-preload[9]: fd 14: sendmsg with ancillary data on a shm connection: the data is dropped
";
        let s = LogSummary::parse(log);
        assert_eq!((s.connected_shm, s.connected_kernel, s.failed), (2, 1, 1));
        assert_eq!((s.accepted_shm, s.accepted_kernel), (1, 2));
        assert_eq!(s.kernel_connections(), 3);
        assert_eq!(s.closed_shm, 2);
        assert_eq!((s.shm_sent_bytes, s.shm_received_bytes), (2100, 2100));
        assert_eq!(
            (s.kernel_tcp_sent_bytes, s.kernel_tcp_received_bytes),
            (49, 48)
        );
        assert_eq!(
            s.fallback_reasons.get("no listener with the library there"),
            Some(&1)
        );
        assert_eq!(s.fallback_reasons.len(), 3);
        assert_eq!(LogSummary::parse(""), LogSummary::default());
        // Every line but a routine move or close is a note, whole; other
        // programs' lines are none.
        assert_eq!(
            s.notes,
            [
                "netgap-preload[7]: fd 7: connection to port 8080 stays on the kernel's TCP: no listener with the library there",
                "netgap-preload[7]: fd 8: connection to port 8080 fails (ECONNRESET): no answer",
                "netgap-preload[9]: fd 12: accepted connection stays on the kernel's TCP: the first bytes are no hello",
                "netgap-preload[9]: fd 13 (accepted on fd 4): stays on the kernel's TCP: the peer is not on this host",
                "netgap-preload[9]: fd 14: sendmsg with ancillary data on a shm connection: the data is dropped",
            ]
        );
    }

    #[test]
    fn a_log_keeps_its_last_notes_only() {
        let mut log = String::new();
        for fd in 0..20 {
            log.push_str(&format!(
                "netgap-preload[7]: fd {fd}: connection to port 80 moved to xdp via the relay\n\
                 netgap-preload[7]: fd {fd}: read: the relay hung up\n"
            ));
        }
        let s = LogSummary::parse(&log);
        assert_eq!(s.connected_xdp, 20);
        assert_eq!(s.notes.len(), MAX_NOTES);
        assert_eq!(
            s.notes.last().map(String::as_str),
            Some("netgap-preload[7]: fd 19: read: the relay hung up")
        );
        assert!(s.notes[0].contains("fd 14:"), "{:?}", s.notes);
    }

    #[test]
    fn relayed_connections_are_counted_as_xdp_never_as_shm() {
        let log = "\
netgap-preload[7]: fd 5: connection to port 80 moved to xdp via the relay
netgap-preload[9]: fd 11: accepted connection moved to xdp via the relay
netgap-preload[7]: fd 5: relayed connection closed (connector): shm_sent_bytes=100 shm_received_bytes=2000 doorbells_sent=3 kernel_tcp_sent_bytes=40 kernel_tcp_received_bytes=8
";
        let s = LogSummary::parse(log);
        assert_eq!((s.connected_xdp, s.accepted_xdp, s.closed_xdp), (1, 1, 1));
        assert_eq!((s.connected_shm, s.accepted_shm, s.closed_shm), (0, 0, 0));
        assert_eq!((s.xdp_bytes, s.shm_sent_bytes), (2100, 0));
        assert_eq!(s.kernel_tcp_sent_bytes, 40);
        let m: std::collections::BTreeMap<_, _> = s.record_metrics().into_iter().collect();
        assert_eq!(m["preload_xdp_connections"], 1.0);
        assert_eq!(m["preload_shm_connections"], 0.0);
    }

    #[test]
    fn direct_connections_and_the_refusals_that_kept_others_relayed_are_counted() {
        let log = "\
netgap-preload[7]: fd 5: connection to port 80 moved to direct on queue 3
netgap-preload[9]: fd 11: accepted connection moved to direct on queue 3
netgap-preload[7]: fd 6: relay: direct connections are off on this relay (--no-direct)
netgap-preload[7]: fd 6: connection to port 80 moved to xdp via the relay
";
        let s = LogSummary::parse(log);
        assert_eq!((s.connected_direct, s.accepted_direct), (1, 1));
        assert_eq!((s.connected_xdp, s.accepted_xdp), (1, 0));
        assert_eq!(
            s.direct_refusals
                .get("direct connections are off on this relay (--no-direct)"),
            Some(&1)
        );
        let m: std::collections::BTreeMap<_, _> = s.record_metrics().into_iter().collect();
        assert_eq!(m["preload_direct"], 1.0);
        // Across hosts on xdp, relayed or direct.
        assert_eq!(m["preload_xdp_connections"], 2.0);
    }

    #[test]
    fn a_closed_direct_connections_bytes_count_as_xdp_bytes() {
        let log = "\
netgap-preload[7]: fd 5: connection to port 80 moved to direct on queue 3
netgap-preload[7]: fd 5: direct connection on queue 3 closed: 1000 bytes sent, 20000 received, 30 frames sent, 40 received, 0 sent again
netgap-preload[7]: fd 6: relayed connection closed (connector): shm_sent_bytes=100 shm_received_bytes=200 doorbells_sent=3 kernel_tcp_sent_bytes=40 kernel_tcp_received_bytes=8
";
        let s = LogSummary::parse(log);
        assert_eq!((s.closed_direct, s.direct_bytes), (1, 21000));
        let m: std::collections::BTreeMap<_, _> = s.record_metrics().into_iter().collect();
        assert_eq!(m["preload_xdp_bytes"], 21300.0);
    }

    #[test]
    fn a_missing_library_is_one_line_naming_the_path() {
        let e = LibraryMissing(PathBuf::from("/nonexistent/libnetgap_preload.so"));
        let line = e.to_string();
        assert!(line.contains("/nonexistent/libnetgap_preload.so"), "{line}");
        assert!(line.contains(LIBRARY_ENV), "{line}");
        assert_eq!(line.lines().count(), 1);
    }
}
