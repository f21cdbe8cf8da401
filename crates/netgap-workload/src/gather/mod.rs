//! `gather`: one client on the first host collects from every other host,
//! as Ganglia's collector does (seeds 000, 002; Figure 13): for each host
//! it connects, reads the whole answer until the host closes, and
//! disconnects; a gather is done when every host has answered. Hosts are
//! asked one after another (`sequential`, as the studies) or all at once
//! (`parallel`). The headline is the time of one full gather; beside it
//! the connection-setup time and its share of each host's exchange.
//!
//! The answering side is real gmond on every host (`--responder gmond`,
//! started through each host's agent, its XML parsed and its hosts and
//! metrics counted) or netgap's own responder (`--responder builtin`),
//! which answers each connection with the point's size of bytes over any
//! cross-host transport with connections, so connection cost can be
//! compared across stacks.

mod client_role;
mod fetch;
pub(crate) mod load_child;
mod server_role;

use super::options::{OptionKind, WorkloadArgs, WorkloadOption};
use super::place::{HostView, Placement, RolePlace};
use super::role::{parse_params, OpenRole, RoleContext, RoleError, PER_FLOW_BYTES};
use super::{CountFlag, FlowSample, Refused, Workload};
use crate::About;
use client_role::open_client;
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::{Programs, Transport};
use serde::{Deserialize, Serialize};
use server_role::open_server;
use std::time::Duration;

const NAME: &str = "gather";

/// Most hosts one gather reads from.
const MAX_SOURCES: u32 = 1024;
/// Largest answer of the built-in responder, bytes.
const MAX_ANSWER_BYTES: u64 = 16 * 1024 * 1024;
/// Largest gmond answer read, bytes.
const MAX_GMOND_BYTES: usize = 4 * 1024 * 1024;
/// How long a server keeps answering after the window.
const SERVER_GRACE: Duration = Duration::from_millis(500);

static RESPONDER: WorkloadOption = WorkloadOption {
    flag: "responder",
    kind: OptionKind::Choice(&["builtin", "gmond"]),
    value_name: "NAME[,NAME]",
    help: "gather: what answers on every host: builtin (netgap's responder, the point's size over the chosen transport) or gmond (Debian's ganglia-monitor, over tcp, or through the preload library over shm or xdp); a list gives one point per responder [default: builtin]",
    axis: true,
};
static GATHER_MODE: WorkloadOption = WorkloadOption {
    flag: "gather-mode",
    kind: OptionKind::Choice(&["sequential", "parallel"]),
    value_name: "MODE[,MODE]",
    help: "gather: ask the hosts one after another (as Ganglia) or all at once; a list gives one point per mode [default: sequential]",
    axis: true,
};
static OPTIONS: &[&WorkloadOption] = &[&RESPONDER, &GATHER_MODE];

/// The `gather` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gather;

/// What answers on every host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Responder {
    /// netgap's own responder.
    Builtin,
    /// Ganglia's gmond.
    Gmond,
}

/// What every role of a `gather` point gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// What answers.
    pub responder: Responder,
    /// The built-in responder's answer, bytes.
    pub answer_bytes: u64,
    /// Ask every host at once.
    pub parallel: bool,
    /// `-t shm`: gmond and the gatherer run under the preload library.
    #[serde(default)]
    pub preload: bool,
}

fn refused(detail: impl std::fmt::Display) -> RoleError {
    RoleError::Refused {
        workload: NAME,
        detail: detail.to_string(),
    }
}

/// What `Gather` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "one client connects to every other host, reads its whole answer (gmond XML or a built-in responder), disconnects; time per gather",
    metric: Metric::Other {
        key: "gather_time_ms",
        combine: netgap_core::metric::Combine::Max,
    },
    count: CountFlag::Hosts,
    max_flows: MAX_SOURCES,
    takes_bidir: false,
};

impl Workload for Gather {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        8 * 1024
    }

    fn wrapped_programs(&self) -> Option<&'static str> {
        Some("gather --responder gmond")
    }

    /// gmond and the gatherer, under the library over shm or xdp.
    fn wraps_programs(&self, spec: &PointSpec, args: &WorkloadArgs) -> bool {
        args.str("responder") == Some("gmond")
            && netgap_transport::programs(&spec.transport).under_library()
    }

    /// The built-in responder needs a transport with connections that
    /// crosses hosts.
    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        if transport.capabilities().programs.under_library() {
            // gmond over the preload library (the built-in responder is
            // refused at placement, which sees the responder).
            return crate::preload::library_path()
                .map(|_| ())
                .map_err(|e| Refused(format!("{NAME} -t {}: {e}", spec.transport)));
        }
        super::check_cross_host(NAME, spec, transport)?;
        let connected = |t: &dyn Transport| {
            t.capabilities().cross_host
                && t.capabilities().reliable
                && !t.engine_path().is_some_and(|p| p.datagrams())
        };
        if !connected(transport) {
            let ok: Vec<&str> = netgap_transport::registry()
                .iter()
                .filter(|t| connected(**t))
                .map(|t| t.name())
                .collect();
            return Err(Refused(format!(
                "{NAME} measures connection setup, which {} does not have; use {}",
                spec.transport,
                ok.join(", ")
            )));
        }
        if spec.size_bytes == 0 || spec.size_bytes > MAX_ANSWER_BYTES {
            return Err(Refused(format!(
                "{NAME}: the responder's answer must be between 1 byte and 16M"
            )));
        }
        Ok(())
    }

    fn options(&self) -> &'static [&'static WorkloadOption] {
        OPTIONS
    }

    fn params(&self, spec: &PointSpec, args: &WorkloadArgs) -> serde_json::Value {
        let responder = match args.str("responder") {
            Some("gmond") => Responder::Gmond,
            _ => Responder::Builtin,
        };
        serde_json::json!(Params {
            responder,
            answer_bytes: spec.size_bytes,
            parallel: args.str("gather-mode") == Some("parallel"),
            // gmond over the preload library: on one host over shm, across
            // hosts over xdp through the hosts' relays (netgap's own
            // responder, which aims at IP:PORT, is refused at placement).
            preload: netgap_transport::programs(&spec.transport).under_library(),
        })
    }

    /// Every host but the first answers one flow; the first host's client
    /// reads them all.
    fn place(
        &self,
        params: &serde_json::Value,
        _count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        if params.get("preload").and_then(serde_json::Value::as_bool) == Some(true)
            && params.get("responder").and_then(serde_json::Value::as_str) != Some("gmond")
        {
            return Err(Refused(format!(
                "{NAME} over shm or xdp runs gmond and the gatherer under the preload library (netgap's own responder is aimed at IP:PORT, which xdp's flows have not); add --responder gmond"
            )));
        }
        if hosts.len() < 2 {
            return Err(Refused(format!(
                "{NAME}: no host to gather from: give at least two hosts"
            )));
        }
        let n = (hosts.len() - 1) as u32;
        if n > MAX_SOURCES {
            return Err(Refused(format!(
                "{NAME}: at most {MAX_SOURCES} hosts to gather from"
            )));
        }
        let mut roles: Vec<RolePlace> = (0..n)
            .map(|f| RolePlace {
                host: f as usize + 1,
                side: WorkloadRole::Server,
                flows: vec![f],
                connects_to: None,
                listen_ips: None,
                bind_ips: None,
            })
            .collect();
        roles.push(RolePlace {
            host: 0,
            side: WorkloadRole::Client,
            flows: (0..n).collect(),
            connects_to: Some(0),
            listen_ips: None,
            bind_ips: None,
        });
        Ok(Placement {
            roles,
            flows: n,
            links: Vec::new(),
        })
    }

    /// The client holds one answer buffer per host; a responder one answer.
    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        let answer = spec.point.size_bytes.max(MAX_GMOND_BYTES as u64);
        answer
            .saturating_add(PER_FLOW_BYTES)
            .saturating_mul(u64::from(spec.flows.max(1)))
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let p: Params = parse_params(NAME, ctx.spec)?;
        if p.answer_bytes == 0 || p.answer_bytes > MAX_ANSWER_BYTES {
            return Err(RoleError::Params {
                workload: NAME,
                detail: format!("answer_bytes {} is outside 1 to 16M", p.answer_bytes),
            });
        }
        ctx.limits.check_message_bytes(p.answer_bytes)?;
        if ctx.spec.flows == 0 || ctx.spec.flows > MAX_SOURCES {
            return Err(refused(format!(
                "{} flows is outside 1 to {MAX_SOURCES}",
                ctx.spec.flows
            )));
        }
        if p.responder == Responder::Gmond
            && netgap_transport::programs(&ctx.spec.point.transport) == Programs::No
        {
            return Err(refused(format!(
                "gmond answers over the host's TCP, or through the preload library over shm or xdp; use -t {}",
                netgap_transport::program_transports()
            )));
        }
        match ctx.spec.role {
            WorkloadRole::Server => open_server(&p, &ctx),
            WorkloadRole::Client => open_client(&p, &ctx),
        }
    }

    /// Every flow shares the gather's time: the client's window is the sum
    /// of the measured gathers' times, so window / gathers is their mean.
    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        if side == WorkloadRole::Server {
            return FlowSample::default();
        }
        let value = if report.round_trips == 0 {
            f64::NAN
        } else {
            window_ns as f64 / report.round_trips as f64 / 1e6
        };
        FlowSample {
            value: Some(value),
            bytes_tx: report.bytes_tx,
            bytes_rx: report.bytes_rx,
            window_bytes: report.window_bytes_rx,
            percentiles: report.percentiles.clone(),
        }
    }

    fn percentiles(&self, hist: &LatencyHistogram) -> Option<Percentiles> {
        hist.percentiles_us(1.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    use crate::place::test_hosts as hosts;

    #[test]
    fn every_other_host_answers_the_first() {
        let p = Gather.place(&serde_json::json!({}), 0, &hosts(4)).unwrap();
        p.validate(4).unwrap();
        assert_eq!(p.roles.len(), 4);
        assert_eq!(p.roles[3].host, 0);
        assert_eq!(p.roles[3].flows, vec![0, 1, 2]);
        assert_eq!(p.roles[1].flows, vec![1]);
        assert!(Gather.place(&serde_json::json!({}), 0, &hosts(1)).is_err());
    }

    #[test]
    fn the_headline_is_the_mean_gather_time() {
        let r = FlowReport {
            index: 0,
            bytes_tx: 0,
            bytes_rx: 0,
            window_bytes_rx: 0,
            round_trips: 4,
            percentiles: None,
            errors: 0,
        };
        let s = Gather.sample(WorkloadRole::Client, &r, 8_000_000);
        assert_eq!(s.value, Some(2.0));
    }
}
