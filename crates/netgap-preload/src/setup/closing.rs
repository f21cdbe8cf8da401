//! A relayed connector's offer that the program closes or shuts down
//! before the listener's answer came: the program's call returns at once,
//! as the kernel's would, and a thread of the library's ends the offer
//! (the relay must take the bytes in the ring first, so they are not
//! lost), then applies the close or shutdown, within the answer's time
//! limit. The program's exit waits for those threads, as the kernel
//! delivers what a program wrote before it closed and exited.

use super::{finish_offer, finish_offer_by, Resolved, WATCH_STACK_BYTES};
use crate::conn::{Conn, OfferOnClose};
use crate::exchange::{wait_for_either, ANSWER_WAIT};
use crate::log::log_line;
use crate::table;
use crate::unix;
use libc::c_int;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Takes the answer of `c`'s offer when it comes, up to `deadline`,
/// without holding the offer between looks (the program's calls, its
/// close among them, go on meanwhile). The descriptor is the offer's own
/// at each look ([`Conn::offer_fd`]): the program's close may hand it to
/// the library. True: the offer ended.
///
/// The wait wakes when the offer ends too (its eventfd, for a relayed
/// offer): a program's own call that took the answer first must not leave
/// the watcher asleep until the deadline, holding the connection. The
/// watcher's hold would keep a connection that went direct alive past the
/// program's last close, so its closing frame would wait for the watcher
/// (up to the answer's time limit), or never go if the program exited
/// meanwhile, leaving its peer to wait for an end that never comes.
pub(super) fn watch_answer(c: &Arc<Conn>, deadline: Instant) -> bool {
    while let Some(fd) = c.offer_fd() {
        if !wait_for_either(fd, c.offer_end_fd(), deadline) {
            return !c.offered();
        }
        if let Resolved::NotYet = finish_offer(fd, c, false) {
            // Part of the answer: give the rest a moment.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    true
}

/// The program closes its descriptor `fd` of the relayed connection `c`
/// whose answer is still to come. Its close returns at once, as the
/// kernel's would: a thread of the library's ends the offer (the relay
/// must take the bytes in the ring first, so that they are not lost) and
/// then the connection, as the program's close would have, on a duplicate
/// of the socket it closes after (bounded by the answer's time limit).
/// Another descriptor of the program that stays open keeps the offer.
/// False: the offer had ended, and the close goes the usual way. Without
/// a duplicate or a thread, the close waits for the answer.
pub(crate) fn close_offered(fd: c_int, c: &Arc<Conn>) -> bool {
    let other = table::descriptors_of(c).into_iter().find(|d| *d != fd);
    let keep = match c.offer_outlives(fd, other) {
        OfferOnClose::Ended => return false,
        OfferOnClose::Kept => return true,
        OfferOnClose::Orphaned(keep) => keep,
        OfferOnClose::NoDuplicate => {
            let _ = finish_offer(fd, c, true);
            return false;
        }
    };
    let deadline = Instant::now() + ANSWER_WAIT;
    let (tx, rx) = std::sync::mpsc::channel::<(OwnedFd, Arc<Conn>)>();
    let end = move || {
        if let Ok((keep, c)) = rx.recv() {
            end_orphan(keep, &c, deadline);
        }
        ORPHANS.ended();
    };
    ORPHANS.begun();
    let started = std::thread::Builder::new()
        .name("netgap-close".into())
        .stack_size(WATCH_STACK_BYTES)
        .spawn(end);
    match started {
        Ok(_) => {
            let _ = tx.send((keep, c.clone()));
        }
        Err(why) => {
            ORPHANS.ended();
            log_line!("fd {fd}: no thread to end the closed connection's offer ({why}); the close waits for the answer");
            end_orphan(keep, c, deadline);
        }
    }
    true
}

/// The threads ending offers whose program closed them, counted so that
/// the program's exit waits for them (each ends by its deadline): the
/// kernel delivers what a program wrote before its close and exit, and so
/// must the relay.
struct Orphans {
    /// The process that counts them (a forked child has none of its
    /// parent's threads) and how many run.
    count: Mutex<(libc::pid_t, usize)>,
    ended: std::sync::Condvar,
}

static ORPHANS: Orphans = Orphans {
    count: Mutex::new((0, 0)),
    ended: std::sync::Condvar::new(),
};

impl Orphans {
    fn begun(&self) {
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        // SAFETY: registering a handler with no preconditions; it only
        // waits, bounded, on this count.
        AT_EXIT.call_once(|| unsafe {
            libc::atexit(orphans_end_before_exit);
        });
        // SAFETY: getpid has no preconditions and cannot fail.
        let pid = unsafe { libc::getpid() };
        let mut g = self.count.lock().unwrap_or_else(|p| p.into_inner());
        if g.0 != pid {
            *g = (pid, 0);
        }
        g.1 += 1;
    }

    fn ended(&self) {
        let mut g = self.count.lock().unwrap_or_else(|p| p.into_inner());
        g.1 = g.1.saturating_sub(1);
        self.ended.notify_all();
    }

    /// Waits until this process's threads ended, at most a little past
    /// the answer's time limit.
    fn wait(&self) {
        // SAFETY: getpid has no preconditions and cannot fail.
        let pid = unsafe { libc::getpid() };
        let until = Instant::now() + ANSWER_WAIT + Duration::from_secs(1);
        let mut g = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while g.0 == pid && g.1 > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            g = match self.ended.wait_timeout(g, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

extern "C" fn orphans_end_before_exit() {
    ORPHANS.wait();
}

/// Ends the offer of `c`, whose program closed its last descriptor, by
/// `deadline` (broken past it), then the connection, on `keep`, the
/// library's duplicate of its socket, which goes last.
fn end_orphan(keep: OwnedFd, c: &Arc<Conn>, deadline: Instant) {
    let fd = keep.as_raw_fd();
    if !watch_answer(c, deadline) {
        let _ = finish_offer_by(fd, c, Some(deadline));
    }
    c.close_orphan(fd);
    unix::close(keep);
    c.wake_peer();
}

/// The program shuts down (`how`) the relayed connection `c` on `fd`
/// whose answer is still to come. Its shutdown returns at once, as the
/// kernel's would: the library's side of the connection is shut now, the
/// kernel socket's once the offer ended (after the ring's bytes went to
/// the relay or the kernel socket), and a thread of the library's sees
/// that it ends, on a duplicate of the socket, within the answer's time
/// limit. False: the offer had ended, and the shutdown goes the usual way.
pub(crate) fn shut_offered(fd: c_int, c: &Arc<Conn>, how: c_int) -> bool {
    if !c.defer_shutdown(how) {
        return false;
    }
    let deadline = Instant::now() + ANSWER_WAIT;
    let c = c.clone();
    let end = move || {
        if !watch_answer(&c, deadline) {
            if let Some(fd) = c.offer_fd() {
                let _ = finish_offer_by(fd, &c, Some(deadline));
            }
        }
    };
    let started = std::thread::Builder::new()
        .name("netgap-shutdown".into())
        .stack_size(WATCH_STACK_BYTES)
        .spawn(end);
    if let Err(why) = started {
        log_line!("fd {fd}: no thread to end the shut down connection's offer ({why}); the program's next call on it takes the answer");
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::conn::{OfferPath, RelayOffer};

    /// A watcher of a relayed offer that another thread ends (a program's
    /// own call took the answer) wakes at once, not at its deadline, and
    /// lets the connection go: a connection that went direct is closed
    /// by the program's last close only once nothing else holds it.
    #[test]
    fn a_watcher_lets_go_as_soon_as_another_thread_ends_the_offer() {
        let (ch, region) = crate::region::make(4096).unwrap();
        let path = OfferPath::Relay(RelayOffer {
            key: [1; netgap_proto::preload::RELAY_KEY_BYTES],
            ring_bytes: 4096,
            sock: -1,
            region,
        });
        let c = Arc::new(Conn::new_offered(-1, ch, false, (7, path), -1));
        let held = Arc::clone(&c);
        let t0 = Instant::now();
        let watcher = std::thread::spawn(move || {
            watch_answer(&held, Instant::now() + Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(50));
        // As a program's call ends it: the offer taken, then its end told.
        drop(c.offer_lock().take());
        c.offer_dropped();
        assert!(watcher.join().unwrap(), "the offer ended");
        let waited = t0.elapsed();
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        assert_eq!(Arc::strong_count(&c), 1, "the watcher let it go");
    }
}
