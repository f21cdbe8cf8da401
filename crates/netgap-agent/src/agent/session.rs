//! One control session: its first request, each request checked against
//! the agent's limits and handed to the session machine, and the actions
//! the machine asks for carried out on the sockets.

use super::keyless::{keyless_stays_on_loopback, keyless_targets_loopback};
use super::open::{open_client, open_point, OpenPoint, PointRole};
use super::workload::{alive_while, prepare_workload, role_deadline, run_workload};
use super::{watchdog, Shared, HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, MIN_IDLE_TIMEOUT};
use crate::control::{ControlConn, ControlError, ControlStream};
use netgap_proto::auth::is_auth_frame;
use netgap_proto::codec::decode_request;
use netgap_proto::dataproof::DataToken;
use netgap_proto::message::{Reply, Request};
use netgap_proto::session::{AgentAction, AgentSession};
use netgap_transport::cpu::CpuMeter;
use netgap_workload::role::{ReadyRole, RoleContext, RoleError, Stop};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a session ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionEnd {
    #[error("{0}")]
    Control(#[from] ControlError),
    #[error("{0}")]
    Refused(String),
    /// Ended before the peer proved the key (or, keyless, said hello).
    #[error("{0}")]
    Unproven(Box<SessionEnd>),
}

/// Releases the busy flag when the session that claimed it and every role
/// thread it started have ended: the next session starts only once nothing
/// of this one runs.
pub(crate) struct BusyClaim(Arc<Shared>);

impl Drop for BusyClaim {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// Waits for the next request. While a point over an unreliable flow is
/// open, the peer's retries are answered meanwhile: the server role is idle,
/// but the client may still wait for the last datagram of a repetition.
fn next_request(
    conn: &mut ControlConn,
    point: Option<&OpenPoint>,
    idle: Duration,
) -> Result<Vec<u8>, ControlError> {
    let Some(monitor) = point.and_then(|p| p.monitor.as_ref()) else {
        return conn.recv_or_tell(idle);
    };
    let t0 = Instant::now();
    // A broken flow shows in the next repetition; the wait goes on.
    let _ = monitor.serve_idle(conn.stream().as_fd(), idle);
    let left = idle
        .saturating_sub(t0.elapsed())
        .max(Duration::from_millis(1));
    conn.recv_or_tell(left).map_err(|e| match e {
        ControlError::TimedOut(_) => ControlError::TimedOut(idle),
        other => other,
    })
}

/// The key proof, when the agent has a key, and the first request after it.
fn first_request(
    conn: &mut ControlConn,
    shared: &Shared,
    slot: &crate::admission::Ticket,
) -> Result<Request, SessionEnd> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    if let Some(key) = &shared.key {
        crate::auth::challenge(conn, key, deadline, &|| slot.started())
            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
    }
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let first = conn.recv_or_tell(left)?;
    if is_auth_frame(&first) {
        let message = match shared.key {
            Some(_) => crate::auth::ALREADY_PROVEN.to_string(),
            None => crate::auth::no_key_message(),
        };
        return Err(refuse(conn, message));
    }
    match decode_request(&first) {
        Ok(r) => Ok(r),
        Err(e) => Err(refuse(conn, format!("bad first message: {e}"))),
    }
}

pub(crate) fn run_session(
    stream: ControlStream,
    shared: &Arc<Shared>,
    slot: crate::admission::Ticket,
) -> Result<(), SessionEnd> {
    let local_ip = shared
        .data_ip
        .or(stream.local_ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let mut conn = ControlConn::new(stream)
        .map_err(|e| SessionEnd::Unproven(Box::new(ControlError::Io(e).into())))?;
    let hello =
        first_request(&mut conn, shared, &slot).map_err(|e| SessionEnd::Unproven(Box::new(e)))?;
    drop(slot);
    let busy = &shared.busy;
    let claimed = matches!(hello, Request::Hello { .. })
        && busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
    let mut claim = claimed.then(|| Arc::new(BusyClaim(Arc::clone(shared))));
    let mut session = AgentSession::new(netgap_transport::host::collect(Some(local_ip)), !claimed);
    let mut point: Option<OpenPoint> = None;
    // One thread for all of the session's repetitions, started with the
    // first.
    let mut watchdog = watchdog::Watchdog::default();
    // A silent coordinator holds the agent no longer than its longest run.
    let idle = shared
        .limits
        .max_duration
        .clamp(MIN_IDLE_TIMEOUT, IDLE_TIMEOUT);
    let mut open_size_bytes = 0u64;
    // The data token of the point being opened or prepared.
    let mut token: Option<DataToken> = None;
    let mut workload: Option<(Box<dyn ReadyRole>, Stop, Duration)> = None;
    let mut request = hello;
    loop {
        // Limits first: nothing past them reaches a data socket.
        let within = match &request {
            Request::Open { spec, data_token } => {
                open_size_bytes = spec.size_bytes;
                token = Some(data_token.clone());
                // A transport this build lacks is refused when the point
                // opens; until then it commits nothing of its own.
                let flow_bytes =
                    netgap_transport::find(&spec.transport).map_or(0, |t| t.flow_memory_bytes());
                shared.limits.check_point(spec, flow_bytes)
            }
            Request::Run { iterations, .. } | Request::ClientRun { iterations, .. } => {
                shared.limits.check_run(*iterations, open_size_bytes)
            }
            Request::ClientOpen {
                spec,
                data_token,
                target,
                ..
            } => {
                open_size_bytes = spec.size_bytes;
                token = Some(data_token.clone());
                let flow_bytes =
                    netgap_transport::find(&spec.transport).map_or(0, |t| t.flow_memory_bytes());
                shared
                    .limits
                    .check_point(spec, flow_bytes)
                    .and_then(|()| keyless_targets_loopback(shared.key.is_some(), target))
            }
            Request::WorkloadPrepare { spec, data_token } => {
                token = Some(data_token.clone());
                shared
                    .limits
                    .check_workload(spec)
                    .and_then(|()| keyless_stays_on_loopback(shared.key.is_some(), spec))
            }
            _ => Ok(()),
        };
        if let Err(e) = within {
            return Err(refuse(&mut conn, e.to_string()));
        }
        let action = match session.on_request(&request) {
            Ok(a) => a,
            Err(e) => return Err(refuse(&mut conn, e.to_string())),
        };
        match action {
            AgentAction::Reply(r) => conn.send(&r)?,
            AgentAction::ReplyAndClose(r) => {
                // Everything of the session goes before the answer: a
                // coordinator that has read it may start the next session
                // at once and finds the agent free.
                drop(point.take());
                drop(workload.take());
                drop(claim.take());
                conn.send(&r)?;
                return Ok(());
            }
            AgentAction::OpenPoint(spec) => {
                let Some(token) = token.as_ref() else {
                    return Err(refuse(&mut conn, "no data token".into()));
                };
                // The previous point's flow goes first: a transport may
                // hold one flow per interface at a time (xdp binds the
                // interface's queue).
                drop(point.take());
                let opened = open_point(
                    &mut conn,
                    &mut session,
                    &spec,
                    (local_ip, token),
                    &shared.rate,
                );
                match opened {
                    Ok(p) => point = Some(p),
                    Err(e) => return Err(refuse(&mut conn, e.to_string())),
                }
            }
            AgentAction::OpenClient {
                spec,
                target,
                client_cpu,
            } => {
                let Some(token) = token.as_ref() else {
                    return Err(refuse(&mut conn, "no data token".into()));
                };
                drop(point.take());
                match open_client(&spec, &target, token, &shared.rate) {
                    Ok((mut p, choices)) => {
                        p.cpu = client_cpu;
                        let reply = session
                            .client_connected(choices)
                            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                        conn.send(&reply)?;
                        point = Some(p);
                    }
                    // Nothing of the point is open: the session stays
                    // usable, as after a listener that could not open.
                    Err(e) => conn.send(&session.failed(&e.to_string()))?,
                }
            }
            AgentAction::RunClient { iterations, .. } => {
                let Some(p) = point.as_mut() else {
                    return Err(refuse(&mut conn, "no point is open".into()));
                };
                let PointRole::Client(role) = &mut p.role else {
                    return Err(refuse(
                        &mut conn,
                        "this point's role is the server's".into(),
                    ));
                };
                let limit = shared.limits.max_duration + REPETITION_GRACE;
                if let Some(abort) = &p.abort {
                    watchdog.arm(abort.clone(), limit);
                }
                let cpu = p.cpu;
                let ran = alive_while(&mut conn, &session, || {
                    if let Some(cpu) = cpu {
                        netgap_transport::affinity::pin_current_thread(cpu)
                            .map_err(|e| format!("client placement: {e}"))?;
                    }
                    // The role's own thread meters it: the meter reads the
                    // CPU clock of the thread that starts it.
                    let meter = CpuMeter::start();
                    let mut hist = netgap_core::stats::LatencyHistogram::new();
                    role.run(iterations, &mut hist)
                        .map(|out| (out, meter.stop(out.helper_cpu_ns), hist))
                        .map_err(|e| e.to_string())
                })?;
                if watchdog.disarm() {
                    return Err(refuse(&mut conn, past_longest_run(shared)));
                }
                match ran {
                    Ok((out, cpu, hist)) => {
                        let rep = netgap_proto::message::ClientRep {
                            elapsed_ns: out.elapsed_ns,
                            value: out.value,
                            bytes_tx: out.bytes_tx,
                            bytes_rx: out.bytes_rx,
                            cpu,
                            datagrams: p.datagrams_since_report(),
                        };
                        let replies = session
                            .client_done(rep, hist.buckets())
                            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                        for r in &replies {
                            conn.send(r)?;
                        }
                    }
                    Err(e) => {
                        return Err(refuse(&mut conn, format!("client role failed: {e}")));
                    }
                }
            }
            AgentAction::RunRole { iterations, .. } => {
                let Some(p) = point.as_mut() else {
                    return Err(refuse(&mut conn, "no point is open".into()));
                };
                let PointRole::Server(role) = &mut p.role else {
                    return Err(refuse(
                        &mut conn,
                        "this point's role is the client's".into(),
                    ));
                };
                let meter = CpuMeter::start();
                let limit = shared.limits.max_duration + REPETITION_GRACE;
                if let Some(abort) = &p.abort {
                    watchdog.arm(abort.clone(), limit);
                }
                let ran = role.run(iterations);
                if watchdog.disarm() {
                    return Err(refuse(&mut conn, past_longest_run(shared)));
                }
                match ran {
                    Ok(out) => {
                        let cpu = meter.stop(out.helper_cpu_ns);
                        let datagrams = p.datagrams_since_report();
                        let reply = session
                            .role_done(out.bytes_rx, out.bytes_tx, cpu, datagrams)
                            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                        conn.send(&reply)?;
                    }
                    Err(e) => {
                        return Err(refuse(&mut conn, format!("server role failed: {e}")));
                    }
                }
            }
            AgentAction::PrepareWorkload(spec) => {
                // A role of its own: a failing flow engine sets it too.
                let stop = Stop::new();
                let Some(token) = token.as_ref() else {
                    return Err(refuse(&mut conn, "no data token".into()));
                };
                let ctx = RoleContext {
                    spec: &spec,
                    control_ip: local_ip,
                    limits: &shared.limits,
                    stop: &stop,
                    data_token: token,
                    services: shared.services,
                    flows_per_process: shared.flows_per_process,
                    dirs: &shared.dirs,
                    rate: &shared.rate,
                    relay: shared.relay.as_ref(),
                };
                workload = prepare_workload(&mut conn, &mut session, ctx)?
                    .map(|role| (role, stop, role_deadline(&spec)));
            }
            AgentAction::RunWorkload => {
                let outcome = match workload.take() {
                    Some(g) => run_workload(&mut conn, &session, g, claim.clone())?,
                    None => Err(RoleError::NotPrepared),
                };
                let replies = match outcome {
                    Ok(r) => session
                        .workload_finished(r.flows, r.buckets, r.outcome)
                        .map_err(|e| SessionEnd::Refused(e.to_string()))?,
                    Err(msg) => vec![session.failed(&format!("workload role failed: {msg}"))],
                };
                for r in &replies {
                    conn.send(r)?;
                }
            }
            AgentAction::ClosePoint => {
                point = None;
                let reply = session
                    .closed()
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                conn.send(&reply)?;
            }
        }
        let payload = next_request(&mut conn, point.as_ref(), idle)?;
        request = match decode_request(&payload) {
            Ok(r) => r,
            Err(e) => return Err(refuse(&mut conn, format!("bad message: {e}"))),
        };
    }
}

/// The refusal of a repetition the watchdog ended.
fn past_longest_run(shared: &Shared) -> String {
    format!(
        "refused by the agent's limits: the repetition ran past its longest run ({}); ask for fewer iterations or a shorter --rep-time",
        humantime::format_duration(shared.limits.max_duration)
    )
}

/// How long past the agent's `--max-duration` a point-to-point repetition
/// may run before its flow is shut down.
const REPETITION_GRACE: Duration = Duration::from_millis(500);

/// Sends a last error reply (best effort) and ends the session.
fn refuse(conn: &mut ControlConn, message: String) -> SessionEnd {
    let _ = conn.send(&Reply::Error {
        message: message.clone(),
    });
    SessionEnd::Refused(message)
}
