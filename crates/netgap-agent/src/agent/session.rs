//! One control session: its first request, each request checked against
//! the agent's limits and handed to the session machine, and the actions
//! the machine asks for carried out on the sockets.

use super::end::{BusyClaim, SessionEnd};
use super::keyless::{keyless_stays_on_loopback, keyless_targets_loopback};
use super::open::{open_client, open_point, OpenPoint, PointRole};
use super::workload::{alive_while, prepare_workload, role_deadline, run_workload};
use super::{watchdog, Shared, HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, MIN_IDLE_TIMEOUT};
use crate::control::{ControlConn, ControlError, ControlStream};
use netgap_core::spec::PointSpec;
use netgap_proto::auth::is_auth_frame;
use netgap_proto::codec::decode_request;
use netgap_proto::dataproof::DataToken;
use netgap_proto::limits::LimitError;
use netgap_proto::message::{Reply, Request};
use netgap_proto::session::{AgentAction, AgentSession};
use netgap_proto::workload::WorkloadSpec;
use netgap_transport::cpu::CpuMeter;
use netgap_workload::role::{ReadyRole, RoleContext, RoleError, Stop};
use std::net::{IpAddr, Ipv4Addr};
use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A session past its first request: the control connection, the session
/// machine and what the session has open. The fields drop in their order
/// when the session ends: its roles first, and the busy claim before the
/// connection closes, so a coordinator that sees the close finds the agent
/// free.
struct Session<'a> {
    shared: &'a Arc<Shared>,
    /// The address the session's roles listen on.
    local_ip: IpAddr,
    workload: Option<(Box<dyn ReadyRole>, Stop, Duration)>,
    /// The data token of the point being opened or prepared.
    token: Option<DataToken>,
    open_size_bytes: u64,
    /// One thread for all of the session's repetitions, started with the
    /// first.
    watchdog: watchdog::Watchdog,
    point: Option<OpenPoint>,
    machine: AgentSession,
    claim: Option<Arc<BusyClaim>>,
    conn: ControlConn,
}

pub(crate) fn run_session(
    stream: ControlStream,
    shared: &Arc<Shared>,
    slot: crate::admission::Ticket,
) -> Result<(), SessionEnd> {
    let (mut s, hello) = Session::start(stream, shared, slot)?;
    // A silent coordinator holds the agent no longer than its longest run.
    let idle = shared
        .limits
        .max_duration
        .clamp(MIN_IDLE_TIMEOUT, IDLE_TIMEOUT);
    let mut request = hello;
    loop {
        // Limits first: nothing past them reaches a data socket.
        if let Err(e) = s.within_limits(&request) {
            return Err(refuse(&mut s.conn, e.to_string()));
        }
        let action = match s.machine.on_request(&request) {
            Ok(a) => a,
            Err(e) => return Err(refuse(&mut s.conn, e.to_string())),
        };
        if s.act(action)?.is_break() {
            return Ok(());
        }
        let payload = next_request(&mut s.conn, s.point.as_ref(), idle)?;
        request = match decode_request(&payload) {
            Ok(r) => r,
            Err(e) => return Err(refuse(&mut s.conn, format!("bad message: {e}"))),
        };
    }
}

impl<'a> Session<'a> {
    /// The handshake: the key proof and the first request, then the busy
    /// slot claimed for a `Hello`. The session, and its first request.
    fn start(
        stream: ControlStream,
        shared: &'a Arc<Shared>,
        slot: crate::admission::Ticket,
    ) -> Result<(Session<'a>, Request), SessionEnd> {
        let local_ip = shared
            .data_ip
            .or(stream.local_ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let mut conn = ControlConn::new(stream)
            .map_err(|e| SessionEnd::Unproven(Box::new(ControlError::Io(e).into())))?;
        let hello = first_request(&mut conn, shared, &slot)
            .map_err(|e| SessionEnd::Unproven(Box::new(e)))?;
        drop(slot);
        let claimed = matches!(hello, Request::Hello { .. })
            && shared
                .busy
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        let claim = claimed.then(|| Arc::new(BusyClaim(Arc::clone(shared))));
        let machine = AgentSession::new(netgap_transport::host::collect(Some(local_ip)), !claimed);
        let session = Session {
            shared,
            local_ip,
            workload: None,
            token: None,
            open_size_bytes: 0,
            watchdog: watchdog::Watchdog::default(),
            point: None,
            machine,
            claim,
            conn,
        };
        Ok((session, hello))
    }

    /// Checks `request` against the agent's limits, and keeps the size and
    /// data token of the point it opens or prepares.
    fn within_limits(&mut self, request: &Request) -> Result<(), LimitError> {
        let limits = &self.shared.limits;
        let keyed = self.shared.key.is_some();
        match request {
            Request::Open { spec, data_token } => {
                self.open_size_bytes = spec.size_bytes;
                self.token = Some(data_token.clone());
                // A transport this build lacks is refused when the point
                // opens; until then it commits nothing of its own.
                let flow_bytes =
                    netgap_transport::find(&spec.transport).map_or(0, |t| t.flow_memory_bytes());
                limits.check_point(spec, flow_bytes)
            }
            Request::Run { iterations, .. } | Request::ClientRun { iterations, .. } => {
                limits.check_run(*iterations, self.open_size_bytes)
            }
            Request::ClientOpen {
                spec,
                data_token,
                target,
                ..
            } => {
                self.open_size_bytes = spec.size_bytes;
                self.token = Some(data_token.clone());
                let flow_bytes =
                    netgap_transport::find(&spec.transport).map_or(0, |t| t.flow_memory_bytes());
                limits
                    .check_point(spec, flow_bytes)
                    .and_then(|()| keyless_targets_loopback(keyed, target))
            }
            Request::WorkloadPrepare { spec, data_token } => {
                self.token = Some(data_token.clone());
                limits
                    .check_workload(spec)
                    .and_then(|()| keyless_stays_on_loopback(keyed, spec))
            }
            _ => Ok(()),
        }
    }

    /// Carries out what the session machine asked for; breaks when the
    /// session has closed.
    fn act(&mut self, action: AgentAction) -> Result<ControlFlow<()>, SessionEnd> {
        match action {
            AgentAction::Reply(r) => self.conn.send(&r)?,
            AgentAction::ReplyAndClose(r) => {
                self.close(&r)?;
                return Ok(ControlFlow::Break(()));
            }
            AgentAction::OpenPoint(spec) => self.open_server_role(&spec)?,
            AgentAction::OpenClient {
                spec,
                target,
                client_cpu,
            } => self.open_client_role(&spec, &target, client_cpu)?,
            AgentAction::RunClient { iterations, .. } => self.run_client_rep(iterations)?,
            AgentAction::RunRole { iterations, .. } => self.run_server_rep(iterations)?,
            AgentAction::PrepareWorkload(spec) => self.prepare_workload_role(&spec)?,
            AgentAction::RunWorkload => self.run_workload_role()?,
            AgentAction::ClosePoint => {
                self.point = None;
                let reply = self
                    .machine
                    .closed()
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                self.conn.send(&reply)?;
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Teardown: everything of the session goes before the last answer, `r`:
    /// a coordinator that has read it may start the next session at once
    /// and finds the agent free.
    fn close(&mut self, r: &Reply) -> Result<(), SessionEnd> {
        drop(self.point.take());
        drop(self.workload.take());
        drop(self.claim.take());
        self.conn.send(r)?;
        Ok(())
    }

    /// Opens the server role of `spec`: its listener, the flow it accepts
    /// and the test's setup.
    fn open_server_role(&mut self, spec: &PointSpec) -> Result<(), SessionEnd> {
        let Some(token) = self.token.as_ref() else {
            return Err(refuse(&mut self.conn, "no data token".into()));
        };
        // The previous point's flow goes first: a transport may
        // hold one flow per interface at a time (xdp binds the
        // interface's queue).
        drop(self.point.take());
        let opened = open_point(
            &mut self.conn,
            &mut self.machine,
            spec,
            (self.local_ip, token),
            &self.shared.rate,
        );
        match opened {
            Ok(p) => self.point = Some(p),
            Err(e) => return Err(refuse(&mut self.conn, e.to_string())),
        }
        Ok(())
    }

    /// Opens the client role of `spec` towards the server role at
    /// `target`. A failure leaves nothing of the point open and the
    /// session usable, as after a listener that could not open.
    fn open_client_role(
        &mut self,
        spec: &PointSpec,
        target: &str,
        client_cpu: Option<u32>,
    ) -> Result<(), SessionEnd> {
        let Some(token) = self.token.as_ref() else {
            return Err(refuse(&mut self.conn, "no data token".into()));
        };
        drop(self.point.take());
        match open_client(spec, target, token, &self.shared.rate) {
            Ok((mut p, choices)) => {
                p.cpu = client_cpu;
                let reply = self
                    .machine
                    .client_connected(choices)
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                self.conn.send(&reply)?;
                self.point = Some(p);
            }
            Err(e) => self.conn.send(&self.machine.failed(&e.to_string()))?,
        }
        Ok(())
    }

    /// Runs and times one repetition of the open point's client role on a
    /// thread of its own, telling the coordinator meanwhile that the agent
    /// is alive, and reports it.
    fn run_client_rep(&mut self, iterations: u64) -> Result<(), SessionEnd> {
        let Some(p) = self.point.as_mut() else {
            return Err(refuse(&mut self.conn, "no point is open".into()));
        };
        let PointRole::Client(role) = &mut p.role else {
            return Err(refuse(
                &mut self.conn,
                "this point's role is the server's".into(),
            ));
        };
        let limit = self.shared.limits.max_duration + REPETITION_GRACE;
        if let Some(abort) = &p.abort {
            self.watchdog.arm(abort.clone(), limit);
        }
        let cpu = p.cpu;
        let ran = alive_while(&mut self.conn, &self.machine, || {
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
        if self.watchdog.disarm() {
            return Err(refuse(&mut self.conn, past_longest_run(self.shared)));
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
                let replies = self
                    .machine
                    .client_done(rep, hist.buckets())
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                for r in &replies {
                    self.conn.send(r)?;
                }
                Ok(())
            }
            Err(e) => Err(refuse(&mut self.conn, format!("client role failed: {e}"))),
        }
    }

    /// Runs one repetition of the open point's server role and reports
    /// what it moved and the CPU it took.
    fn run_server_rep(&mut self, iterations: u64) -> Result<(), SessionEnd> {
        let Some(p) = self.point.as_mut() else {
            return Err(refuse(&mut self.conn, "no point is open".into()));
        };
        let PointRole::Server(role) = &mut p.role else {
            return Err(refuse(
                &mut self.conn,
                "this point's role is the client's".into(),
            ));
        };
        let meter = CpuMeter::start();
        let limit = self.shared.limits.max_duration + REPETITION_GRACE;
        if let Some(abort) = &p.abort {
            self.watchdog.arm(abort.clone(), limit);
        }
        let ran = role.run(iterations);
        if self.watchdog.disarm() {
            return Err(refuse(&mut self.conn, past_longest_run(self.shared)));
        }
        match ran {
            Ok(out) => {
                let cpu = meter.stop(out.helper_cpu_ns);
                let datagrams = p.datagrams_since_report();
                let reply = self
                    .machine
                    .role_done(out.bytes_rx, out.bytes_tx, cpu, datagrams)
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                self.conn.send(&reply)?;
                Ok(())
            }
            Err(e) => Err(refuse(&mut self.conn, format!("server role failed: {e}"))),
        }
    }

    /// Prepares the workload role `spec` names, kept for the run that
    /// follows; a failure is answered and leaves the session usable.
    fn prepare_workload_role(&mut self, spec: &WorkloadSpec) -> Result<(), SessionEnd> {
        // A role of its own: a failing flow engine sets it too.
        let stop = Stop::new();
        let Some(token) = self.token.as_ref() else {
            return Err(refuse(&mut self.conn, "no data token".into()));
        };
        let shared = self.shared;
        let ctx = RoleContext {
            spec,
            control_ip: self.local_ip,
            limits: &shared.limits,
            stop: &stop,
            data_token: token,
            services: shared.services,
            flows_per_process: shared.flows_per_process,
            dirs: &shared.dirs,
            rate: &shared.rate,
            relay: shared.relay.as_ref(),
        };
        self.workload = prepare_workload(&mut self.conn, &mut self.machine, ctx)?
            .map(|role| (role, stop, role_deadline(spec)));
        Ok(())
    }

    /// Runs the prepared workload role and reports its flows, or why it
    /// failed.
    fn run_workload_role(&mut self) -> Result<(), SessionEnd> {
        let outcome = match self.workload.take() {
            Some(g) => run_workload(&mut self.conn, &self.machine, g, self.claim.clone())?,
            None => Err(RoleError::NotPrepared),
        };
        let replies = match outcome {
            Ok(r) => self
                .machine
                .workload_finished(r.flows, r.buckets, r.outcome)
                .map_err(|e| SessionEnd::Refused(e.to_string()))?,
            Err(msg) => vec![self.machine.failed(&format!("workload role failed: {msg}"))],
        };
        for r in &replies {
            self.conn.send(r)?;
        }
        Ok(())
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
