//! The agent (`netgap serve`): accepts control sessions from coordinators and
//! runs the server role of each point they open, or its client role when a
//! coordinator places both roles of a point on agents (the client then
//! connects to another agent's server role and reports what it timed). One
//! session at a time runs
//! tests; another coordinator gets an explicit "busy". A client that vanishes
//! or sends garbage ends only its own session; the agent serves the next one.
//!
//! With a key, every connection first proves it ([`crate::auth::challenge`])
//! before any request is decoded. Connections still in that handshake (or
//! before their `Hello`) are few ([`MAX_HANDSHAKES`]), short
//! ([`HANDSHAKE_TIMEOUT`]) and never turned away: a new one closes the
//! oldest unproven connection of the busiest source when the pool is full
//! (see `admission`), and none of them holds the busy slot, so clients that
//! cannot authenticate cannot keep the agent from serving. Requests are
//! checked against the agent's [`AgentLimits`] before any data socket opens.

mod end;
mod keyless;
mod open;
mod session;
mod watchdog;
mod workload;

use end::SessionEnd;
use session::run_session;

use crate::admission::{RefusalLog, REFUSAL_LOG_INTERVAL};
use crate::control::{ControlAddr, ControlStream};
use netgap_core::text::escape_control;
use netgap_proto::auth::Key;
use netgap_proto::limits::AgentLimits;
use netgap_transport::rate::RateBudget;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a new connection may take to authenticate and say hello.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most connections at once that have not yet said hello; a new one past
/// them closes the oldest of the source holding the most.
pub const MAX_HANDSHAKES: usize = crate::admission::MAX_UNPROVEN;
/// How long an established session may stay silent between requests, at
/// most: an agent with a shorter `--max-duration` waits that long, but at
/// least [`MIN_IDLE_TIMEOUT`].
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest wait between requests, whatever `--max-duration` says: a
/// coordinator computes and writes a point's results between requests.
const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the agent waits for the coordinator's data connection.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub addr: String,
    /// Underlying error (address in use, no permission, ...).
    pub source: io::Error,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn accept(&self) -> io::Result<(ControlStream, String)> {
        match self {
            Listener::Tcp(l) => l
                .accept()
                .map(|(s, peer)| (ControlStream::Tcp(s), peer.to_string())),
            Listener::Unix(l) => l
                .accept()
                .map(|(s, _)| (ControlStream::Unix(s), "a local client".to_string())),
        }
    }
}

/// What every session of an agent shares.
struct Shared {
    busy: AtomicBool,
    unproven: Arc<crate::admission::Pool>,
    /// The connections refused before proving themselves, logged as a
    /// summary at most once per interval.
    refusals: Mutex<RefusalLog>,
    key: Option<Key>,
    limits: AgentLimits,
    data_ip: Option<IpAddr>,
    /// Whether workloads may start real server programs on this host.
    services: bool,
    /// Most connections one process of this agent holds (a server role
    /// past it is spread over processes); `None`: the descriptor limit.
    flows_per_process: Option<u32>,
    /// The only directories the agent writes in: its run directory and
    /// the one pio's stripes go under ([`netgap_workload::confined`]).
    dirs: Arc<netgap_workload::confined::AgentDirs>,
    /// The agent's highest data rate (`--max-rate`) as a budget every
    /// flow of every session charges, point-to-point and workload alike.
    rate: Arc<RateBudget>,
    /// What the relays it starts for `-t xdp` runs take
    /// (`--relay-interface`, and a key derived from its own).
    relay: Option<netgap_workload::preload::RelaySetup>,
}

/// A bound agent, ready to serve.
pub struct Agent {
    listener: Listener,
    shared: Shared,
    quiet: bool,
}

impl Agent {
    /// Binds the control listener at a TCP `addr`.
    pub fn bind(addr: SocketAddr) -> Result<Agent, BindError> {
        let listener = TcpListener::bind(addr).map_err(|source| BindError {
            addr: addr.to_string(),
            source,
        })?;
        Ok(Agent::with_listener(Listener::Tcp(listener)))
    }

    /// Binds the control listener at `addr`, TCP or a Unix socket. A stale
    /// socket file nobody listens on is replaced; a live one is an error.
    /// The Unix socket is made accessible to its owner only.
    pub fn bind_control(addr: &ControlAddr) -> Result<Agent, BindError> {
        let path = match addr {
            ControlAddr::Tcp(a) => return Agent::bind(*a),
            ControlAddr::Unix(p) => p,
        };
        let err = |source| BindError {
            addr: addr.to_string(),
            source,
        };
        let is_socket = std::fs::symlink_metadata(path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        // Only a socket is ever removed, never another kind of file.
        if is_socket && std::os::unix::net::UnixStream::connect(path).is_err() {
            std::fs::remove_file(path).map_err(err)?;
        }
        let listener = UnixListener::bind(path).map_err(err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        Ok(Agent::with_listener(Listener::Unix(listener)))
    }

    fn with_listener(listener: Listener) -> Agent {
        Agent {
            listener,
            shared: Shared {
                busy: AtomicBool::new(false),
                unproven: Arc::default(),
                refusals: Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL)),
                key: None,
                limits: AgentLimits::default(),
                data_ip: None,
                services: false,
                flows_per_process: None,
                dirs: Arc::new(netgap_workload::confined::AgentDirs::new(
                    netgap_workload::confined::default_run_base(),
                )),
                rate: Arc::new(RateBudget::new(AgentLimits::default().max_rate_gbps)),
                relay: None,
            },
            quiet: false,
        }
    }

    /// Requires every coordinator to prove `key` before anything else.
    pub fn with_key(mut self, key: Key) -> Agent {
        self.shared.key = Some(key);
        self
    }

    /// Refuses requests past `limits`.
    pub fn with_limits(mut self, limits: AgentLimits) -> Agent {
        self.shared.limits = limits;
        self.shared.rate = Arc::new(RateBudget::new(limits.max_rate_gbps));
        self
    }

    /// Opens data listeners on `ip` (default: the address the control
    /// connection came in on, or 127.0.0.1 over a Unix socket).
    pub fn with_data_ip(mut self, ip: IpAddr) -> Agent {
        self.shared.data_ip = Some(ip);
        self
    }

    /// Lets workloads start the real server programs netgap knows (nginx,
    /// Apache, gmond) on this host, each from a configuration the agent
    /// writes itself into a directory of its own (`netgap_workload`'s services).
    pub fn allow_services(mut self) -> Agent {
        self.shared.services = true;
        self
    }

    /// Writes only under `dirs` (default: a run directory under
    /// [`netgap_workload::confined::default_run_base`], made when first needed).
    /// What a killed agent left there is removed when its base is opened
    /// ([`netgap_workload::confined::AgentDirs::open_base`]).
    pub fn with_dirs(mut self, dirs: netgap_workload::confined::AgentDirs) -> Agent {
        self.shared.dirs = Arc::new(dirs);
        self
    }

    /// Spreads a flow-engine server role over processes past `flows`
    /// connections per process, even when the descriptor limit would hold
    /// more ([`netgap_workload::shard`]); for tests of that path at small scale.
    pub fn with_flows_per_process(mut self, flows: u32) -> Agent {
        self.shared.flows_per_process = Some(flows.max(1));
        self
    }

    /// Starts the host's relay, for a `-t xdp` run under the preload
    /// library when none runs, on `setup`'s interface with its key.
    pub fn with_relay(mut self, setup: netgap_workload::preload::RelaySetup) -> Agent {
        self.shared.relay = Some(setup);
        self
    }

    /// Stops session log lines on stderr (used by the in-process agent).
    pub fn quiet(mut self) -> Agent {
        self.quiet = true;
        self
    }

    /// The TCP address the agent listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Unix(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the agent listens on a Unix socket",
            )),
        }
    }

    /// Serves sessions until the process ends, each on its own thread.
    pub fn serve(self) -> io::Result<()> {
        let shared = Arc::new(self.shared);
        if !self.quiet {
            spawn_refusal_summaries(Arc::downgrade(&shared));
        }
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_transient_accept_error(&e) => {
                    eprintln!("netgap agent: accept failed: {e}; continuing");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Err(e) => return Err(e),
            };
            // A connection that cannot be closed from outside could not be
            // evicted: it gets no place.
            let Ok(closer) = stream.try_clone() else {
                continue;
            };
            let source = stream.peer_ip();
            let slot = shared.unproven.admit(
                source,
                Box::new(move || {
                    let _ = closer.shutdown();
                }),
            );
            let shared = Arc::clone(&shared);
            let quiet = self.quiet;
            let spawned = std::thread::Builder::new()
                .name(format!("session {peer}"))
                .spawn(move || match run_session(stream, &shared, slot) {
                    Ok(()) => {}
                    Err(_) if quiet => {}
                    Err(SessionEnd::Unproven(why)) => {
                        shared.refused(source, &why.to_string());
                    }
                    Err(e) => eprintln!(
                        "netgap agent: session with {peer} ended: {}",
                        escape_control(&e.to_string())
                    ),
                });
            if let Err(e) = spawned {
                eprintln!("netgap agent: cannot start a session thread: {e}");
            }
        }
    }

    /// Serves on a background thread; for the coordinator's in-process agent.
    pub fn spawn(self) -> io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("agent".into())
            .spawn(move || {
                if let Err(e) = self.serve() {
                    eprintln!("netgap agent: stopped: {e}");
                }
            })
    }
}

impl Shared {
    /// Counts a connection refused before it proved itself, and prints the
    /// summary of refusals when one is due.
    fn refused(&self, source: Option<IpAddr>, why: &str) {
        let line = {
            let mut log = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            log.record(source, why, now);
            log.summary(now)
        };
        if let Some(line) = line {
            eprintln!("netgap agent: {line}");
        }
    }
}

/// Prints the refusals that no later refusal reported, at most once per
/// [`REFUSAL_LOG_INTERVAL`] (the log decides; this thread only asks it
/// every second), for as long as the agent serves.
fn spawn_refusal_summaries(shared: std::sync::Weak<Shared>) {
    let spawned = std::thread::Builder::new()
        .name("refusal log".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let line = shared
                .refusals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .summary(Instant::now());
            if let Some(line) = line {
                eprintln!("netgap agent: {line}");
            }
        });
    // Without the thread, refusals are still summarized as they come.
    if let Err(e) = spawned {
        eprintln!("netgap agent: cannot start the refusal log thread: {e}");
    }
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
    )
}
