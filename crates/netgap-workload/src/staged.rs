//! The I/O a role of a staged placement ([`super::place::Staged`]) shares
//! with every other: parsing what the coordinator told it, listening once
//! per flow it accepts (a listener of some transports hands over one flow
//! only), and connecting to an earlier role's address with the point's
//! data proof. Used by `pipeline` and `pio`.

use super::place::Staged;
use super::role::{RoleContext, RoleError};
use netgap_transport::rate::{PacedFlow, RateBudget};
use netgap_transport::{self as transport, FlowConfig, FlowError};
use std::net::IpAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// What the coordinator told a staged role, range-checked: the placement
/// and the earlier roles' addresses, parsed.
#[derive(Debug, Clone)]
pub(crate) struct StagedView {
    /// The placement as the coordinator sent it.
    pub(crate) staged: Staged,
    /// The addresses of every earlier role, parsed by the point's
    /// transport and checked against the session's hosts.
    pub(crate) peers: Vec<Vec<transport::ListenAddr>>,
}

/// Checks the staged part of `spec`'s parameters, the earlier roles'
/// addresses parsed by `t`, the transport the role's streams take.
pub(crate) fn view(
    workload: &'static str,
    staged: Option<Staged>,
    spec: &netgap_proto::workload::WorkloadSpec,
    t: &dyn transport::Transport,
) -> Result<StagedView, RoleError> {
    let staged = staged.ok_or(RoleError::Params {
        workload,
        detail: "no staged placement in the parameters".into(),
    })?;
    let peers = staged
        .validate(spec.flows, &spec.session_hosts, t)
        .map_err(|e| RoleError::Params {
            workload,
            detail: e.to_string(),
        })?;
    Ok(StagedView { staged, peers })
}

/// The address a staged role listens on: the one the coordinator gave,
/// else the control connection's. A transport bound to one interface (one
/// that cannot run on loopback: xdp) cannot listen on every address, as
/// the coordinator asks when hosts have links of their own: it takes this
/// host's own address among the session's hosts instead (the lowest one an
/// interface here holds, the host's data address on a testbed), which
/// every host of a switch reaches.
pub(crate) fn listen_ip(
    workload: &'static str,
    ctx: &RoleContext<'_>,
    t: &dyn transport::Transport,
) -> Result<IpAddr, RoleError> {
    let ip = ctx
        .spec
        .listen_ips
        .first()
        .copied()
        .unwrap_or(ctx.control_ip);
    if !ip.is_unspecified() || t.capabilities().runs_on_loopback {
        return Ok(ip);
    }
    // Binding succeeds only at an address an interface here holds.
    ctx.spec
        .session_hosts
        .iter()
        .copied()
        .find(|h| !h.is_loopback() && std::net::UdpSocket::bind((*h, 0)).is_ok())
        .ok_or_else(|| RoleError::Params {
            workload,
            detail: format!(
                "transport {} listens on one interface, but no address of this host is among the session's hosts",
                t.name()
            ),
        })
}

type Accept = JoinHandle<Result<Box<dyn transport::Flow>, RoleError>>;

/// Listeners of a role, each accepting one flow in the background.
pub(crate) struct Inbound {
    /// The address of each listener, in order.
    pub(crate) addrs: Vec<String>,
    accepts: Vec<Accept>,
    /// The agent's `--max-rate` budget every accepted flow is charged to,
    /// and whether the transport keeps message boundaries.
    pace: (Arc<RateBudget>, bool),
}

/// `flow` with every byte it moves charged to the agent's `--max-rate`
/// budget `rate`, shared with everything else the agent moves.
fn paced(
    flow: Box<dyn transport::Flow>,
    rate: &Arc<RateBudget>,
    boundaries: bool,
) -> Box<dyn transport::Flow> {
    Box::new(PacedFlow::new(flow, Arc::clone(rate), boundaries))
}

impl Inbound {
    /// Opens `count` listeners at `ip` and accepts one proven flow on each
    /// in the background; `first_index` numbers them in errors.
    pub(crate) fn listen(
        t: &dyn transport::Transport,
        config: &FlowConfig,
        ip: IpAddr,
        count: usize,
        token: &netgap_proto::dataproof::DataToken,
        rate: &Arc<RateBudget>,
    ) -> Result<Inbound, RoleError> {
        let mut addrs = Vec::with_capacity(count);
        let mut accepts = Vec::with_capacity(count);
        for i in 0..count {
            let mut listener = t
                .listen(config, ip)
                .map_err(|source| RoleError::Open { index: i, source })?;
            addrs.push(listener.addr());
            let token = token.clone();
            let h = std::thread::Builder::new()
                .name(format!("accept {i}"))
                .spawn(move || super::stream::accept_proven(listener.as_mut(), &token, i))
                .map_err(|source| RoleError::Thread {
                    what: "an accept thread",
                    source,
                })?;
            accepts.push(h);
        }
        Ok(Inbound {
            addrs,
            accepts,
            pace: (Arc::clone(rate), t.capabilities().message_boundaries),
        })
    }

    /// Waits for every flow (each within [`super::role::ACCEPT_TIMEOUT`]), in listener
    /// order.
    pub(crate) fn join(self) -> Result<Vec<Box<dyn transport::Flow>>, RoleError> {
        let mut flows = Vec::with_capacity(self.accepts.len());
        let mut first_err = None;
        for (index, h) in self.accepts.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(f)) => flows.push(paced(f, &self.pace.0, self.pace.1)),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(RoleError::Panicked {
                        what: format!("the accept thread of flow {index}"),
                    });
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(flows),
        }
    }
}

/// Connects flow `index` to `target` and proves the point's token; the
/// flow is charged to the agent's `--max-rate` budget `rate`.
pub(crate) fn dial(
    t: &dyn transport::Transport,
    config: &FlowConfig,
    target: &str,
    token: &netgap_proto::dataproof::DataToken,
    index: usize,
    rate: &Arc<RateBudget>,
) -> Result<Box<dyn transport::Flow>, RoleError> {
    let mut flow = t
        .connect(config, target)
        .map_err(|source| RoleError::Open { index, source })?;
    netgap_transport::preamble::connector(flow.as_mut(), token)
        .map_err(|source| RoleError::NotInSession { index, source })?;
    Ok(paced(flow, rate, t.capabilities().message_boundaries))
}

/// Fills `buf` from `rx`, waiting past the flow's own inactivity timeout
/// (a peer that waits at a barrier for slower peers says nothing for a
/// while) until `deadline` or the stop, but only while nothing of `buf` has
/// arrived: once a message has begun, the flow's timeout applies.
pub(crate) fn recv_patient(
    rx: &mut dyn transport::Receiver,
    buf: &mut [u8],
    deadline: Instant,
    stop: &super::role::Stop,
) -> Result<(), FlowError> {
    let Some((first, rest)) = buf.split_first_mut() else {
        return Ok(());
    };
    let mut one = [0u8; 1];
    loop {
        match rx.recv_some(&mut one) {
            Ok(_) => break,
            Err(FlowError::TimedOut { .. }) if Instant::now() < deadline && !stop.is_set() => {}
            Err(e) => return Err(e),
        }
    }
    *first = one[0];
    rx.recv_exact(rest)
}

/// Time a role may still wait for the job of its repetition: until its
/// warm-up and window end, counted from `t0`.
pub(crate) fn job_deadline(spec: &netgap_proto::workload::WorkloadSpec, t0: Instant) -> Instant {
    let (warmup, window) = super::role::window(spec);
    t0 + warmup + window
}

/// A connected pair of unix flows on this host (the accepting end, the
/// connecting end), for tests of what a role does with a peer's bytes.
#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
pub(crate) fn flow_pair() -> (Box<dyn transport::Flow>, Box<dyn transport::Flow>) {
    use netgap_core::spec::{Mode, TransportOptions};
    let t = transport::find("unix").unwrap();
    let config = FlowConfig {
        mode: Mode::Event,
        options: TransportOptions::default(),
        io_timeout: std::time::Duration::from_millis(500),
    };
    let mut l = t.listen(&config, IpAddr::from([127, 0, 0, 1])).unwrap();
    let addr = l.addr();
    let h = std::thread::spawn(move || l.accept(std::time::Duration::from_secs(5)).unwrap());
    let peer = t.connect(&config, &addr).unwrap();
    (h.join().unwrap(), peer)
}
