//! One repetition of a point: every role prepared in the placement's order,
//! the barrier that starts them all, and every role's reports gathered.

use super::addresses::{compact, fix_unspecified, listener_for, retarget, serving_role};
use super::{
    WorkloadCoordinator, WorkloadError, PER_FLOW_REPORT_TIME, REPLY_TIMEOUT, RESULT_SLACK,
};
use crate::workload_run::plan::{WorkloadPlan, WorkloadPoint};
use netgap_core::stats::LatencyHistogram;
use netgap_proto::dataproof::DataToken;
use netgap_proto::session::WorkloadProgress;
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec};
use netgap_workload::place::Placement;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// What one repetition produced.
pub(crate) struct RepResult {
    /// Reports per role (index into the placement's roles).
    pub(crate) reports: Vec<(usize, Vec<FlowReport>, WorkloadOutcome)>,
    /// Latency histogram of every timed exchange, ns.
    pub(crate) hist: LatencyHistogram,
}

/// How a point's roles reach each other on the run's hosts: what its
/// transport can listen on and bind, and whether the hosts form a mesh.
struct Paths {
    /// The transport binds a flow to a local address.
    binds_local: bool,
    /// A transport with addresses of its own (xdp's) listens on one
    /// interface, never on every address.
    own_form: bool,
    /// Per host, its first link (local, remote) to the server on a mesh,
    /// unless the workload pins flows to links.
    vias: Vec<Option<(IpAddr, IpAddr)>>,
    /// Some role connects to its server over a mesh link.
    meshed: bool,
    /// The workload's roles are stages, each listening for the next.
    staged: bool,
    /// A staged placement on a mesh: every stage listens on every address.
    staged_mesh: bool,
}

impl WorkloadCoordinator {
    /// Runs one repetition of `point`: prepare every role in the
    /// placement's order (a server announces its addresses before the
    /// roles that connect to it are prepared), the barrier, gather every
    /// report.
    pub(crate) fn rep(
        &mut self,
        point: &WorkloadPoint,
        placement: &Placement,
        plan: &WorkloadPlan,
    ) -> Result<RepResult, WorkloadError> {
        let hosts: Vec<usize> = placement.roles.iter().map(|r| r.host).collect();
        self.use_hosts(&hosts)?;
        // A repetition that failed may have left hosts marked as preparing.
        self.setup.iter_mut().for_each(|t| *t = None);
        self.setup_limit = Duration::from_millis(u64::from(point.spec.io_timeout_ms))
            .max(2 * netgap_proto::message::WORKLOAD_ALIVE_INTERVAL);
        let base = self.base_spec(point, plan);
        let paths = self.paths(point, placement)?;
        // One secret for the point: every flow between its roles proves it.
        let token = netgap_transport::preamble::new_token()
            .map_err(|e| WorkloadError::Point(e.to_string()))?;
        self.prepare_roles(point, placement, &paths, &base, &token)?;
        let mut order = ready_order(placement, paths.staged);
        self.await_ready(placement, &order)?;
        // The barrier: every role is prepared; start them all, servers first.
        // Staged roles start last role first: the roles downstream of the
        // first (a pipeline's consumer) start no later than it, so a time
        // taken from the start (a query's) errs long, never short.
        if !paths.staged {
            order.reverse();
        }
        self.start_roles(placement, &order)?;
        self.collect_reports(point, placement, plan, &order)
    }

    /// The spec every role of `point` starts from: the point, its
    /// parameters, the session's hosts and the window.
    fn base_spec(&self, point: &WorkloadPoint, plan: &WorkloadPlan) -> WorkloadSpec {
        WorkloadSpec {
            point: point.spec.clone(),
            role: WorkloadRole::Server,
            params: point.params.clone(),
            flows: 0,
            listen_ips: Vec::new(),
            targets: Vec::new(),
            bind_ips: Vec::new(),
            session_hosts: self.session_hosts(),
            warmup_ms: plan.warmup.as_millis() as u32,
            duration_ms: plan.duration.as_millis() as u32,
        }
    }

    /// How the roles of `point` reach each other at `placement`; refuses a
    /// staged point whose transport cannot listen where a mesh needs it.
    fn paths(&self, point: &WorkloadPoint, placement: &Placement) -> Result<Paths, WorkloadError> {
        let binds_local = netgap_transport::find(&point.spec.transport)
            .is_some_and(|t| t.capabilities().binds_local);
        let own_form = netgap_transport::find(&point.spec.transport)
            .is_some_and(|t| !t.capabilities().ip_port_addresses);
        // On a mesh each client host reaches the server over its own link
        // (its own subnet): the server then listens on every address and
        // each client host targets the server's end of its first link.
        // Flows pinned to links by the workload take their own links.
        let pinned = !placement.links.is_empty();
        let vias: Vec<Option<(IpAddr, IpAddr)>> = self
            .links
            .iter()
            .map(|l| l.host.via.filter(|_| !pinned))
            .collect();
        let meshed = placement
            .roles
            .iter()
            .any(|r| r.connects_to.is_some() && vias[r.host].is_some());
        let staged = point.workload.staged().is_some();
        // A staged role reaches an earlier one over their own link on a
        // mesh: every staged role then listens on every address.
        let staged_mesh = staged
            && placement
                .roles
                .iter()
                .any(|r| !self.links[r.host].host.peer_links.is_empty());
        if staged_mesh && own_form && !self.staged_hosts_meet(placement) {
            return Err(WorkloadError::Point(format!(
                "{} over {} needs a switch testbed (--topology switch): on a mesh each stage reaches an earlier one over the link between them, and {} listens on one interface",
                point.spec.test, point.spec.transport, point.spec.transport
            )));
        }
        Ok(Paths {
            binds_local,
            own_form,
            vias,
            meshed,
            staged,
            staged_mesh,
        })
    }

    /// Prepares every role in the placement's order, each server's (and
    /// each stage's) announced addresses read before the roles that
    /// connect to it are prepared.
    fn prepare_roles(
        &mut self,
        point: &WorkloadPoint,
        placement: &Placement,
        paths: &Paths,
        base: &WorkloadSpec,
        token: &DataToken,
    ) -> Result<(), WorkloadError> {
        let mut announced: Vec<Vec<String>> = vec![Vec::new(); placement.roles.len()];
        for r in 0..placement.roles.len() {
            let spec = self.role_spec(point, placement, r, paths, base, &announced)?;
            if let Some(addrs) = self.prepare_role(placement, r, paths, spec, token)? {
                announced[r] = addrs;
            }
        }
        Ok(())
    }

    /// The spec of role `r`: where it listens, the addresses its flows
    /// target and leave from, and for a stage what it learns of the others.
    fn role_spec(
        &self,
        point: &WorkloadPoint,
        placement: &Placement,
        r: usize,
        paths: &Paths,
        base: &WorkloadSpec,
        announced: &[Vec<String>],
    ) -> Result<WorkloadSpec, WorkloadError> {
        let role = &placement.roles[r];
        let h = role.host;
        let mut spec = base.clone();
        spec.role = role.side;
        spec.flows = role.flows.len() as u32;
        spec.listen_ips = match &role.listen_ips {
            Some(ips) => ips.clone(),
            None if role.side != WorkloadRole::Server => Vec::new(),
            None if paths.meshed && paths.own_form => compact(self.mesh_listen_ips(placement, r)),
            None if paths.meshed => vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
            None => self.links[h].host.address.into_iter().collect(),
        };
        if let Some(s) = role.connects_to {
            let link = paths.vias[h];
            let mut targets = Vec::with_capacity(role.flows.len());
            for &f in &role.flows {
                // A flow goes to the server role that serves it: the
                // one the role connects to, or another server prepared
                // before it (a client gathering from every host).
                let s = serving_role(placement, r, s, f);
                let server = &placement.roles[s];
                let addr = listener_for(&announced[s], &server.flows, f).ok_or_else(|| {
                    self.host_error(server.host, format!("announced no address for flow {f}"))
                })?;
                targets.push(match link {
                    Some((_, server_end)) => retarget(&addr, server_end),
                    None => addr,
                });
            }
            spec.targets = compact(targets);
            // Flows leave from the host's own address (its end of the
            // link on a mesh) when it is known and the transport can
            // bind one.
            spec.bind_ips = match &role.bind_ips {
                Some(ips) => ips.clone(),
                None if !paths.binds_local => Vec::new(),
                None => match link {
                    Some((local, _)) => vec![local],
                    None => self.links[h].host.address.into_iter().collect(),
                },
            };
        }
        if paths.staged {
            // Every staged role listens (for the roles after it) and
            // learns the placement and the earlier roles' addresses.
            spec.role = WorkloadRole::Server;
            spec.listen_ips = match &role.listen_ips {
                Some(ips) => ips.clone(),
                None if paths.staged_mesh => vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
                None => self.links[h].host.address.into_iter().collect(),
            };
            spec.params = self.staged_params(&point.params, placement, r, announced)?;
        }
        Ok(spec)
    }

    /// Sends role `r` its prepare request and, for a server or a stage,
    /// reads the addresses it announces (made reachable from the other
    /// hosts unless on a mesh).
    fn prepare_role(
        &mut self,
        placement: &Placement,
        r: usize,
        paths: &Paths,
        spec: WorkloadSpec,
        token: &DataToken,
    ) -> Result<Option<Vec<String>>, WorkloadError> {
        let role = &placement.roles[r];
        let h = role.host;
        let req = self.links[h].session.workload_prepare(spec, token.clone());
        self.send(h, &req)?;
        self.setup[h] = Some(Instant::now());
        if paths.staged {
            let reply = self.wait(h, REPLY_TIMEOUT)?;
            let addrs = self.links[h]
                .session
                .on_workload_listening(reply)
                .map_err(|e| self.host_error(h, e.to_string()))?;
            return Ok(Some(addrs));
        }
        if role.side != WorkloadRole::Server {
            return Ok(None);
        }
        let reply = self.wait(h, REPLY_TIMEOUT)?;
        let addrs = self.links[h]
            .session
            .on_workload_listening(reply)
            .map_err(|e| self.host_error(h, e.to_string()))?;
        if addrs.len() != 1 && addrs.len() != role.flows.len() {
            return Err(self.host_error(
                h,
                format!(
                    "announced {} listeners for {} flows",
                    addrs.len(),
                    role.flows.len()
                ),
            ));
        }
        Ok(Some(if paths.meshed {
            addrs
        } else {
            addrs
                .iter()
                .map(|a| fix_unspecified(a, &self.links[h].host))
                .collect()
        }))
    }

    /// Waits for every role, in `order`, to say it is ready.
    fn await_ready(&mut self, placement: &Placement, order: &[usize]) -> Result<(), WorkloadError> {
        let prepare_timeout = netgap_workload::role::ACCEPT_TIMEOUT + REPLY_TIMEOUT;
        for &r in order {
            let h = placement.roles[r].host;
            let reply = self.wait(h, prepare_timeout)?;
            self.setup[h] = None;
            self.links[h]
                .session
                .on_workload_ready(reply)
                .map_err(|e| self.host_error(h, e.to_string()))?;
        }
        Ok(())
    }

    /// The barrier: tells every role, in `order`, to start.
    fn start_roles(&mut self, placement: &Placement, order: &[usize]) -> Result<(), WorkloadError> {
        for &r in order {
            let h = placement.roles[r].host;
            let go = self.links[h].session.workload_go();
            self.send(h, &go)?;
            self.running[h] = Some(Instant::now());
        }
        Ok(())
    }

    /// Gathers every role's reports, in `order`, until each says it has
    /// finished or the window, the drain and the reports' time have passed.
    fn collect_reports(
        &mut self,
        point: &WorkloadPoint,
        placement: &Placement,
        plan: &WorkloadPlan,
        order: &[usize],
    ) -> Result<RepResult, WorkloadError> {
        // In-flight exchanges may take an I/O timeout to finish after the
        // window, and thousands of flows take a while to close and report.
        let timeout = plan.warmup
            + plan.duration
            + 2 * Duration::from_millis(u64::from(point.spec.io_timeout_ms))
            + RESULT_SLACK
            + PER_FLOW_REPORT_TIME * placement.flows;
        let deadline = Instant::now() + timeout;
        let mut result = RepResult {
            reports: Vec::new(),
            hist: LatencyHistogram::new(),
        };
        for &r in order {
            let h = placement.roles[r].host;
            let mut reports = Vec::new();
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let reply = self.wait(h, left.max(Duration::from_millis(1)))?;
                let progress = self.links[h]
                    .session
                    .on_workload_result(reply)
                    .map_err(|e| self.host_error(h, e.to_string()))?;
                match progress {
                    WorkloadProgress::Alive => {}
                    WorkloadProgress::Flows(f) => reports.extend(f),
                    WorkloadProgress::Buckets(b) => {
                        for [v, n] in b {
                            result.hist.record_n_ns(v, n);
                        }
                    }
                    WorkloadProgress::Finished(outcome) => {
                        self.running[h] = None;
                        result.reports.push((r, reports, *outcome));
                        break;
                    }
                }
            }
        }
        Ok(result)
    }
}

/// The order the roles become ready in: roles that only connect first, a
/// server once they have all connected. Staged roles both accept and
/// connect: the last one prepared connects last and is ready first.
fn ready_order(placement: &Placement, staged: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..placement.roles.len()).collect();
    if staged {
        order.reverse();
    } else {
        order.sort_by_key(|&r| placement.roles[r].side == WorkloadRole::Server);
    }
    order
}
