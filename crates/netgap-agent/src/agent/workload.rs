//! A workload role on the agent: prepared and run on threads of their own
//! while the coordinator hears every interval that the agent is alive, and
//! stopped when the coordinator goes or the role overruns its deadline.

use super::end::{BusyClaim, SessionEnd};
use crate::control::{ControlConn, ControlError};
use netgap_proto::session::AgentSession;
use netgap_proto::workload::WorkloadRole;
use netgap_workload::role::{self, ReadyRole, RoleContext, RoleError, RoleResult, Stop};
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prepares a workload role with the workload the point names: a server
/// listens, announces its addresses and accepts every flow; a client
/// connects its flows. A failure is answered with an error reply and leaves
/// the session usable; only a broken control connection ends it.
pub(crate) fn prepare_workload(
    conn: &mut ControlConn,
    session: &mut AgentSession,
    ctx: RoleContext<'_>,
) -> Result<Option<Box<dyn ReadyRole>>, SessionEnd> {
    let prepared = match alive_while(conn, session, || role::open(ctx))? {
        Ok(open) => {
            if ctx.spec.role == WorkloadRole::Server {
                let reply = session
                    .workload_listening(open.addrs())
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                conn.send(&reply)?;
            }
            alive_while(conn, session, move || open.ready())?
        }
        Err(e) => Err(e),
    };
    match prepared {
        Ok(p) => {
            let reply = session
                .workload_ready()
                .map_err(|e| SessionEnd::Refused(e.to_string()))?;
            conn.send(&reply)?;
            Ok(Some(p))
        }
        Err(e) => {
            conn.send(&session.failed(&e.to_string()))?;
            Ok(None)
        }
    }
}

/// Runs `work` (a step of preparing a workload role: opening listeners,
/// connecting thousands of flows) on its own thread while this one tells the
/// coordinator every [`netgap_proto::message::WORKLOAD_ALIVE_INTERVAL`] that the
/// agent is alive, so a slow setup is told apart from a silent host.
pub(crate) fn alive_while<T: Send>(
    conn: &mut ControlConn,
    session: &AgentSession,
    work: impl FnOnce() -> T + Send,
) -> Result<T, SessionEnd> {
    use netgap_proto::message::WORKLOAD_ALIVE_INTERVAL;
    use std::sync::mpsc;
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        scope.spawn(move || {
            let _ = tx.send(work());
        });
        loop {
            match rx.recv_timeout(WORKLOAD_ALIVE_INTERVAL) {
                Ok(result) => return Ok(result),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let alive = session
                        .workload_alive()
                        .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                    conn.send(&alive)?;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(SessionEnd::Refused(
                        "preparing the workload role panicked".into(),
                    ))
                }
            }
        }
    })
}

/// How long past its warm-up and window a workload role may run before the
/// agent stops it: its receivers' drain (the I/O timeout) and a grace.
pub(crate) fn role_deadline(spec: &netgap_proto::workload::WorkloadSpec) -> Duration {
    let (warmup, window) = role::window(spec);
    let drain = Duration::from_millis(u64::from(spec.point.io_timeout_ms));
    warmup + window + drain + ROLE_GRACE
}

/// Time a role may take past its window and drain (closing its flows,
/// gathering reports) before the agent stops it.
const ROLE_GRACE: Duration = Duration::from_secs(2);

/// Sets a role's stop signal when dropped: whichever way [`run_workload`]
/// returns (the role done, the coordinator gone, the control connection
/// broken), nothing of the role keeps running.
struct StopOnDrop(Stop);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// Whether the peer of `conn` has closed it (or it broke), without
/// consuming anything it sent.
fn peer_gone(conn: &ControlConn) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: the fd is the open control socket, borrowed for the call;
    // the buffer is one writable byte that outlives it.
    let n = unsafe {
        libc::recv(
            conn.stream().as_fd().as_raw_fd(),
            std::ptr::from_mut(&mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            io::Error::last_os_error().kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Runs a prepared workload role on its own thread, telling the coordinator
/// every [`WORKLOAD_ALIVE_INTERVAL`] that this agent is still alive. The role
/// stops when the coordinator goes away or when it overruns its deadline;
/// its thread holds the busy claim until its flows are gone.
pub(crate) fn run_workload(
    conn: &mut ControlConn,
    session: &AgentSession,
    (role, stop, deadline): (Box<dyn ReadyRole>, Stop, Duration),
    claim: Option<Arc<BusyClaim>>,
) -> Result<Result<RoleResult, RoleError>, SessionEnd> {
    use netgap_proto::message::WORKLOAD_ALIVE_INTERVAL;
    use std::sync::mpsc;
    let _stop_on_return = StopOnDrop(stop.clone());
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("workload role".into())
        .spawn(move || {
            let _claim = claim;
            let _ = tx.send(role.run());
        });
    let thread = match spawned {
        Ok(t) => t,
        Err(e) => {
            return Ok(Err(RoleError::Thread {
                what: "the workload role",
                source: e,
            }))
        }
    };
    let t0 = Instant::now();
    let mut next_alive = t0 + WORKLOAD_ALIVE_INTERVAL;
    loop {
        match rx.recv_timeout(role::STOP_TICK) {
            Ok(result) => {
                // The thread ends right after its result, releasing its
                // claim: the role is wholly gone before it is reported.
                let _ = thread.join();
                return Ok(result);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if peer_gone(conn) {
                    return Err(ControlError::Closed.into());
                }
                if t0.elapsed() > deadline {
                    // Past its window and drain: the role waits on a silent
                    // peer; it ends at its next message or I/O timeout.
                    stop.set();
                }
                if Instant::now() >= next_alive {
                    next_alive += WORKLOAD_ALIVE_INTERVAL;
                    let alive = session
                        .workload_alive()
                        .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                    conn.send(&alive)?;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Ok(Err(RoleError::Panicked {
                    what: "the workload role".into(),
                }))
            }
        }
    }
}
