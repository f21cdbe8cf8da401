//! One repetition of a point: every role prepared in the placement's order,
//! the barrier that starts them all, and every role's reports gathered.

use super::addresses::{compact, fix_unspecified, listener_for, retarget, serving_role};
use super::{
    WorkloadCoordinator, WorkloadError, PER_FLOW_REPORT_TIME, REPLY_TIMEOUT, RESULT_SLACK,
};
use crate::workload_run::plan::{WorkloadPlan, WorkloadPoint};
use netgap_core::stats::LatencyHistogram;
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
        let binds_local = netgap_transport::find(&point.spec.transport)
            .is_some_and(|t| t.capabilities().binds_local);
        // A transport with addresses of its own (xdp's) listens on one
        // interface, never on every address.
        let own_form = netgap_transport::find(&point.spec.transport)
            .is_some_and(|t| !t.capabilities().ip_port_addresses);
        // A repetition that failed may have left hosts marked as preparing.
        self.setup.iter_mut().for_each(|t| *t = None);
        self.setup_limit = Duration::from_millis(u64::from(point.spec.io_timeout_ms))
            .max(2 * netgap_proto::message::WORKLOAD_ALIVE_INTERVAL);
        let base = WorkloadSpec {
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
        };
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
        let mut announced: Vec<Vec<String>> = vec![Vec::new(); placement.roles.len()];
        // One secret for the point: every flow between its roles proves it.
        let token = netgap_transport::preamble::new_token()
            .map_err(|e| WorkloadError::Point(e.to_string()))?;
        for (r, role) in placement.roles.iter().enumerate() {
            let h = role.host;
            let mut spec = base.clone();
            spec.role = role.side;
            spec.flows = role.flows.len() as u32;
            spec.listen_ips = match &role.listen_ips {
                Some(ips) => ips.clone(),
                None if role.side != WorkloadRole::Server => Vec::new(),
                None if meshed && own_form => compact(self.mesh_listen_ips(placement, r)),
                None if meshed => vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
                None => self.links[h].host.address.into_iter().collect(),
            };
            if let Some(s) = role.connects_to {
                let link = vias[h];
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
                    None if !binds_local => Vec::new(),
                    None => match link {
                        Some((local, _)) => vec![local],
                        None => self.links[h].host.address.into_iter().collect(),
                    },
                };
            }
            if staged {
                // Every staged role listens (for the roles after it) and
                // learns the placement and the earlier roles' addresses.
                spec.role = WorkloadRole::Server;
                spec.listen_ips = match &role.listen_ips {
                    Some(ips) => ips.clone(),
                    None if staged_mesh => vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
                    None => self.links[h].host.address.into_iter().collect(),
                };
                spec.params = self.staged_params(&point.params, placement, r, &announced)?;
            }
            let req = self.links[h].session.workload_prepare(spec, token.clone());
            self.send(h, &req)?;
            self.setup[h] = Some(Instant::now());
            if staged {
                let reply = self.wait(h, REPLY_TIMEOUT)?;
                announced[r] = self.links[h]
                    .session
                    .on_workload_listening(reply)
                    .map_err(|e| self.host_error(h, e.to_string()))?;
            } else if role.side == WorkloadRole::Server {
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
                announced[r] = if meshed {
                    addrs
                } else {
                    addrs
                        .iter()
                        .map(|a| fix_unspecified(a, &self.links[h].host))
                        .collect()
                };
            }
        }
        let prepare_timeout = netgap_workload::role::ACCEPT_TIMEOUT + REPLY_TIMEOUT;
        // Roles that only connect are ready first; a server is ready once
        // they have all connected. Staged roles both accept and connect:
        // the last one prepared connects last and is ready first.
        let mut order: Vec<usize> = (0..placement.roles.len()).collect();
        if staged {
            order.reverse();
        } else {
            order.sort_by_key(|&r| placement.roles[r].side == WorkloadRole::Server);
        }
        for &r in &order {
            let h = placement.roles[r].host;
            let reply = self.wait(h, prepare_timeout)?;
            self.setup[h] = None;
            self.links[h]
                .session
                .on_workload_ready(reply)
                .map_err(|e| self.host_error(h, e.to_string()))?;
        }
        // The barrier: every role is prepared; start them all, servers first.
        // Staged roles start last role first: the roles downstream of the
        // first (a pipeline's consumer) start no later than it, so a time
        // taken from the start (a query's) errs long, never short.
        if !staged {
            order.reverse();
        }
        for &r in &order {
            let h = placement.roles[r].host;
            let go = self.links[h].session.workload_go();
            self.send(h, &go)?;
            self.running[h] = Some(Instant::now());
        }
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
        for &r in &order {
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
