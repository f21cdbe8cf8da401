//! This process's id, kept: every call on a direct connection asks
//! whether this process drives it, and the progress thread whether it is
//! this process's, and `getpid` is a system call (glibc keeps no copy),
//! several per round trip. A layer below every file that asks, so the
//! direct connections and the progress thread share one copy.

use std::sync::atomic::{AtomicU32, Ordering};

/// The kept id: 0 until first asked; a child after `fork` sets its own
/// in the fork handler [`pid`] registers (the library's connections
/// already count on `fork`'s handlers running, see `before_fork`).
static PID: AtomicU32 = AtomicU32::new(0);

/// Forks this process made, and the one that made it, since [`pid`] was
/// first asked (its handlers count them): a state made before a fork may
/// be another process's too.
static FORKS: AtomicU32 = AtomicU32::new(0);

/// This process's id ([`PID`]).
pub(crate) fn pid() -> u32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    static FORK_HANDLER: std::sync::Once = std::sync::Once::new();
    FORK_HANDLER.call_once(|| {
        // SAFETY: registers a plain extern "C" function that only stores
        // the child's id.
        unsafe { libc::pthread_atfork(None, Some(parent_forked), Some(forked)) };
    });
    let p = std::process::id();
    PID.store(p, Ordering::Relaxed);
    p
}

/// Forks since this process's id was first asked ([`FORKS`]); ask
/// [`pid`] first, which starts the count.
pub(crate) fn forks() -> u32 {
    FORKS.load(Ordering::Relaxed)
}

/// In a child after `fork`: its own id, before any of its calls.
extern "C" fn forked() {
    PID.store(std::process::id(), Ordering::Relaxed);
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// In the parent after `fork`: one more fork.
extern "C" fn parent_forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}
