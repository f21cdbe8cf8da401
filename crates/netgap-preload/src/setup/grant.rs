//! An accepted connection's direct request while its grant is awaited
//! (`Pend::Granting`): kept in the pending connection, looked at without
//! waiting by every call and wait on it, and waited for only as long as a
//! blocking call would wait for data. The grant opens the direct
//! connection; a refusal (or the grant's wait passing) takes the relayed
//! path, whose listen was kept ready.

use super::{finish_pending, Done, Resolved};
use crate::channel::Role;
use crate::conn::Conn;
use crate::direct::Heard;
use crate::errno::{errno, set_errno};
use crate::exchange::wait_for;
use crate::log::log_line;
use crate::pending::{held_events, Granting, Pend, Pending};
use crate::{real, table};
use libc::{c_int, epoll_event};
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

/// A call on the pending connection `fd` in the stage `Pend::Granting`
/// (`stage`, held): its end if the grant or the refusal is in, else, for
/// a `blocking` call, a wait for it on the request's socket until `until`
/// (the call's own timeout: then `NotYet`, which a read says as `EAGAIN`,
/// as the kernel's read does); a non-blocking call says `NotYet` at once.
pub(super) fn in_call(
    fd: c_int,
    p: &Arc<Pending>,
    stage: MutexGuard<'_, Pend>,
    blocking: bool,
    until: Instant,
) -> Resolved {
    loop {
        if let Some(done) = step(fd, p) {
            drop(stage);
            return finish_pending(fd, p, done);
        }
        if !blocking {
            return Resolved::NotYet;
        }
        let grant_by = p
            .granting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(until, |g| g.asked.deadline());
        // Woken by the grant, the refusal, or the grant's wait passing:
        // looked at again.
        wait_for(p.granting_fd(), libc::POLLIN, until.min(grant_by));
        if Instant::now() >= until {
            return Resolved::NotYet;
        }
    }
}

/// Keeps an accepted connection's direct request in it while the grant is
/// awaited, and the request's socket in the connection's epolls.
pub(super) fn keep(fd: c_int, p: &Pending, stage: &mut Pend, g: Granting) {
    let relay = g.asked.relay_fd();
    *p.granting.lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
    *stage = Pend::Granting;
    crate::bell::granting_in_epolls(fd, relay, libc::EPOLL_CTL_ADD);
    hold_writes(fd, true);
}

/// Registers `fd` in the program's epolls as the program asked, but for
/// its writability while `holding` ([`held_events`]).
fn hold_writes(fd: c_int, holding: bool) {
    let e = errno();
    let _registering = table::registering();
    for (epfd, i) in table::epoll_regs_without_bell(fd) {
        if held_events(i.events) == i.events {
            continue;
        }
        let mut ev = epoll_event {
            events: if holding {
                held_events(i.events)
            } else {
                i.events
            },
            u64: i.data,
        };
        // SAFETY: a plain epoll_ctl on the program's epoll and its own
        // descriptor, registered there, with an event on the stack.
        unsafe { real::epoll_ctl()(epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) };
    }
    set_errno(e);
}

/// Looks at an accepted connection's direct request without waiting: its
/// end once the grant or the refusal came (or the grant's wait passed),
/// None while it is awaited. A refused connection takes the relayed path,
/// whose listen was kept ready, with one log line.
fn step(fd: c_int, p: &Pending) -> Option<Done> {
    let mut slot = p.granting.lock().unwrap_or_else(|e| e.into_inner());
    let Granting {
        asked,
        ch,
        bell,
        forks,
    } = slot.take()?;
    let relay = asked.relay_fd();
    let heard = match crate::direct::try_granted(asked) {
        Ok(Heard::Waiting(asked)) => {
            *slot = Some(Granting {
                asked,
                ch,
                bell,
                forks,
            });
            return None;
        }
        Ok(Heard::Granted(d)) => Ok(d),
        Err(why) => Err(why),
    };
    // The request's socket leaves the program's epolls before it closes
    // or stays with the direct connection, which is watched on its own.
    crate::bell::granting_in_epolls(fd, relay, libc::EPOLL_CTL_DEL);
    hold_writes(fd, false);
    match heard {
        Ok(d) => {
            // The relayed listen is not needed: its socket and region go.
            drop((ch, bell));
            Some(Done::Direct(Arc::new(d)))
        }
        Err(why) => {
            log_line!("fd {fd}: relay: {why}");
            Some(Done::Shm(Arc::new(
                Conn::new(fd, ch, Role::Listener, false, -1)
                    .with_bell(std::os::fd::IntoRawFd::into_raw_fd(bell)),
            )))
        }
    }
}
