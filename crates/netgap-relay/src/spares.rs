//! Spare ports: direct connections' sockets made ahead, their UMEM
//! registered and their rings sized but bound to no queue
//! (`handover::Unbound`), so that a grant only binds one to its queue.
//! The UMEM's registration, where the kernel faults in and pins each of
//! its pages, is most of a port's making (about 2.5 ms of CPU for a 4 MiB
//! UMEM on a small VM, half that for the 2 MiB one of a 1500-byte MTU,
//! where the bind is tens of microseconds); it no longer sits between a
//! direct request and its grant, on each end.
//!
//! A UMEM goes on the system's huge pages while enough are free
//! (`handover::prepare`): 0.04 ms to make instead of 1.2 ms for 2 MiB on
//! that VM, which halved a short direct connection's setup there.
//!
//! A spare is fresh: made for no one, handed to one program at most, and
//! never back in the pool (the relay keeps no copy of what it handed).
//! An unbound spare is in no queue and no steering map, so it receives
//! nothing; the relay's exit frees them with it. A few are kept, each
//! pinning its UMEM meanwhile ([`SPARES`]).

use netgap_transport::xdp::handover::{self, Unbound};
use netgap_transport::xdp::Shape;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Spares kept ready: a short burst of connections (a gather's, or a web
/// client's workers opening at once) finds each of its ports made, while
/// the pinned memory stays small (2 or 4 MiB each).
pub(crate) const SPARES: usize = 2;

/// The pool and its refilling thread's bell.
pub(crate) struct Spares {
    shape: Shape,
    ready: Mutex<Vec<Unbound>>,
    low: Condvar,
}

impl Spares {
    /// A pool of ports of `shape`, filled by a thread of its own while
    /// it is short; without that thread (none could be made) each port is
    /// made when taken.
    pub(crate) fn start(shape: Shape) -> Arc<Spares> {
        let spares = Arc::new(Spares {
            shape,
            ready: Mutex::new(Vec::with_capacity(SPARES)),
            low: Condvar::new(),
        });
        let filler = Arc::clone(&spares);
        let spawned = std::thread::Builder::new()
            .name("relay-direct-spares".into())
            .spawn(move || filler.fill());
        if let Err(e) = spawned {
            log!("no thread for spare direct ports (each is made at its grant): {e}");
        }
        spares
    }

    fn ready(&self) -> MutexGuard<'_, Vec<Unbound>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh port: a spare if one is ready (the pool refilled behind
    /// it), else one made now.
    pub(crate) fn take(&self) -> io::Result<Unbound> {
        let spare = self.ready().pop();
        self.low.notify_one();
        match spare {
            Some(s) => Ok(s),
            None => handover::prepare(self.shape),
        }
    }

    /// Keeps [`SPARES`] ready, each made outside the lock. A port that
    /// cannot be made (memory, rights) is tried again after a pause, the
    /// grants meanwhile making their own and saying why they could not;
    /// the log says when that starts and when it ends, not every second;
    /// and when the ports go on huge pages or off them (none free).
    fn fill(&self) {
        let mut failing = false;
        let mut on_huge_pages = None;
        loop {
            {
                let mut ready = self.ready();
                while ready.len() >= SPARES {
                    ready = self.low.wait(ready).unwrap_or_else(|e| e.into_inner());
                }
            }
            match handover::prepare(self.shape) {
                Ok(s) => {
                    if std::mem::take(&mut failing) {
                        log!("spare direct ports are made again");
                    }
                    if on_huge_pages.replace(s.huge_pages()) != Some(s.huge_pages()) {
                        if s.huge_pages() {
                            log!("direct ports' UMEMs on huge pages");
                        } else {
                            log!("direct ports' UMEMs on ordinary pages: no huge page free (vm.nr_hugepages); each costs the kernel more to make");
                        }
                    }
                    self.ready().push(s);
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        log!("a spare direct port: {e} (tried again each second)");
                    }
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
    }

    /// Spares ready now.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.ready().len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    fn inode(fd: std::os::fd::BorrowedFd<'_>) -> u64 {
        // SAFETY: `stat` is plain data, all zeros a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a live descriptor and a stat buffer on the stack.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        st.st_ino
    }

    /// Each port taken is one nobody had: its socket and its UMEM are
    /// new ones, never one taken before (nor one whose taker dropped it,
    /// as a killed program's), and the pool fills again behind them.
    #[test]
    fn each_port_taken_is_fresh_and_none_comes_back() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: AF_XDP sockets need root");
            return;
        }
        let spares = Spares::start(netgap_transport::xdp::direct::DirectConn::SHAPE);
        let mut seen = std::collections::HashSet::new();
        let mut kept = Vec::new();
        for i in 0..3 * SPARES {
            let p = spares.take().unwrap();
            // Both descriptors' inodes are new; a dropped port's are
            // never handed again (they would be seen twice).
            assert!(
                seen.insert(("socket", inode(p.socket()))),
                "socket {i} is fresh"
            );
            assert!(seen.insert(("umem", inode(p.umem()))), "UMEM {i} is fresh");
            if i % 2 == 0 {
                drop(p);
            } else {
                kept.push(p);
            }
        }
        let t0 = Instant::now();
        while spares.count() < SPARES {
            assert!(t0.elapsed() < Duration::from_secs(5), "the pool refills");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
