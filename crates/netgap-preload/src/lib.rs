//! `libnetgap_preload.so`: a sockets library preloaded into an unmodified
//! program (`LD_PRELOAD`, or `netgap wrap -t shm -- PROGRAM ARGS`) that
//! moves its TCP connections to peers on the same host onto shared-memory
//! rings, and leaves every other descriptor to the kernel.
//!
//! A taken-over connection stays a real kernel TCP socket under the same
//! descriptor number: the program's epoll registrations, poll sets,
//! socket options and addresses work unchanged. The connection is set up
//! over that socket (`setup`), then its bytes move over a ring pair in a
//! shared memfd (`channel`), while the socket carries only one-byte
//! wake-ups and, at the end, the FIN or reset that tells the peer the
//! connection closed (`conn`). The interposed C calls (`interpose`)
//! consult a per-process descriptor table (`table`).
//!
//! A connection whose descriptor the program keeps across `exec` (close-on-
//! exec cleared) keeps working on shm in the new image, which the library
//! is loaded into again (`inherit`); a descriptor closed on exec closes
//! the connection as usual.
//!
//! Whatever the library cannot serve stays on the kernel's TCP, with one
//! line in the log (`log`: the file `NETGAP_PRELOAD_LOG` names, or
//! standard error): a peer without the library, a peer on another host, a
//! region that cannot be shared.
//!
//! The library runs inside other people's programs, often as root, and
//! trusts nothing a peer sends: a region is handed over as a descriptor
//! through a mailbox whose owner the kernel vouches for, never opened by a
//! name or number from the wire; a beacon or a relay counts only once the
//! kernel says whose it is (`beacon`, `relay`); and no program thread
//! waits on another process's bytes longer than its own call would have
//! (`setup`).

mod beacon;
mod bell;
mod channel;
mod conn;
mod diag;
#[cfg(feature = "xdp")]
mod direct;
mod errno;
mod exchange;
mod inherit;
pub mod interpose;
mod log;
mod pending;
#[cfg(feature = "xdp")]
mod pid;
#[cfg(feature = "xdp")]
mod progress;
mod real;
mod region;
mod relay;
mod setup;
mod table;
mod unix;

/// The stacks the library provides (`NETGAP_PRELOAD_STACK`, which
/// `netgap wrap -t STACK` sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stack {
    /// Same-host connections on shared memory; nothing else is touched,
    /// and the host's relay is never asked.
    Shm,
    /// Also connections to other hosts, through the host's relay.
    Xdp,
}

/// The library's settings, read from the environment when the library is
/// loaded: programs such as nginx clear their environment in the worker
/// processes they fork, which keep the library but not the variables.
pub(crate) struct Settings {
    /// `NETGAP_PRELOAD_LOG`: the log file, or standard error.
    pub(crate) log_path: Option<std::ffi::CString>,
    /// `NETGAP_PRELOAD_RING_BYTES`: bytes of each ring of a channel this
    /// process makes.
    pub(crate) ring_bytes: Option<u32>,
    /// `NETGAP_PRELOAD_SPIN_US` (default [`DEFAULT_SPIN_US`]; 0: never):
    /// how long a read or a poll about to sleep for a taken-over
    /// connection first watches its ring, in nanoseconds.
    pub(crate) spin_ns: u64,
    /// `NETGAP_PRELOAD_STACK` (`shm` unless it says `xdp`).
    pub(crate) stack: Stack,
    /// With the `xdp` feature, connections to other hosts ask for a direct
    /// path first (each on an AF_XDP socket of the program's own, set up
    /// by the relays), unless `NETGAP_PRELOAD_DIRECT=0` keeps them on the
    /// relays (to compare the two paths). A refusal falls back to the
    /// relays with one log line.
    #[cfg(feature = "xdp")]
    pub(crate) direct: bool,
}

/// Microseconds a reader watches the ring before it sleeps, unless
/// `NETGAP_PRELOAD_SPIN_US` says otherwise: long enough for a peer on
/// another core to answer a small request, short enough that an idle
/// connection costs little CPU.
const DEFAULT_SPIN_US: u64 = 30;

static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();

/// The settings (read on first use if the loader did not run the
/// constructor).
pub(crate) fn settings() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings {
        log_path: std::env::var_os("NETGAP_PRELOAD_LOG").and_then(|p| {
            std::ffi::CString::new(std::os::unix::ffi::OsStringExt::into_vec(p)).ok()
        }),
        ring_bytes: std::env::var("NETGAP_PRELOAD_RING_BYTES")
            .ok()
            .and_then(|v| v.parse::<u32>().ok()),
        spin_ns: std::env::var("NETGAP_PRELOAD_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(DEFAULT_SPIN_US)
            .min(1_000_000)
            * 1000,
        stack: match std::env::var("NETGAP_PRELOAD_STACK").as_deref() {
            Ok("xdp") => Stack::Xdp,
            _ => Stack::Shm,
        },
        #[cfg(feature = "xdp")]
        direct: std::env::var("NETGAP_PRELOAD_DIRECT").as_deref() != Ok("0"),
    })
}

/// Before `fork`: every connection may be held by two processes from now
/// on (see `Conn::last_close`).
extern "C" fn before_fork() {
    for c in table::connections() {
        c.set_shared();
    }
}

extern "C" fn load() {
    settings();
    // SAFETY: registering a handler with no preconditions; it runs in the
    // parent before each fork and only marks connections.
    unsafe { libc::pthread_atfork(Some(before_fork), None, None) };
    table::hold_registrations_across_fork();
    inherit::adopt();
}

/// Runs [`load`] when the dynamic loader maps the library, before the
/// program's `main`.
#[used]
#[link_section = ".init_array"]
static LOAD: extern "C" fn() = load;
