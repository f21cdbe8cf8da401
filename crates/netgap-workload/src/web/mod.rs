//! `web`: a real web server (nginx or Apache httpd) on the first host
//! serves a generated file set to N closed-loop HTTP/1.1 clients spread
//! cyclically over the other hosts (seed 001, section 4.3 and Figure 8).
//! The headline is transactions per second, all clients together.
//!
//! The server role starts the server through its agent ([`crate::service`])
//! after writing the file set ([`fileset`]) into the server's run
//! directory; the client roles run netgap's own load generator
//! ([`client`]). Traces: `single` asks every request for one file of the
//! point's size (`-s 1K,4K,...` gives one point per size); `zipf` asks for
//! the files of a SPECweb99-like set by Zipf popularity (`--alpha
//! 0.5,...,1.0` gives one point per exponent).

pub(crate) mod client;
mod client_role;
pub(crate) mod fileset;
pub(crate) mod load_child;
pub(crate) mod server_role;

use super::options::{OptionKind, WorkloadArgs, WorkloadOption};
use super::place::{self, HostView, Placement};
use super::role::{parse_params, OpenRole, RoleContext, RoleError, PER_FLOW_BYTES};
use super::{CountFlag, FlowSample, Refused, Workload};
use crate::service;
use crate::About;
use client_role::open_clients;
use fileset::FileSet;
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::{Programs, Transport};
use serde::{Deserialize, Serialize};
use server_role::open_server;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

const NAME: &str = "web";

/// Most clients of one point: a workload point's most flows. Each client host must
/// hold its share in one process ([`open_clients`] refuses a share past
/// its descriptor limit).
const MAX_CLIENTS: u32 = netgap_proto::workload::MAX_WORKLOAD_FLOWS;
/// Largest file of a `single` trace, bytes.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Files of a `zipf` set when the run names no count: one SPECweb99
/// directory per 36 files.
const DEFAULT_FILES: u32 = 360;
/// Seed of the file set when the run names none.
const DEFAULT_SEED: u64 = 1;
/// Most worker processes (nginx) or children (Apache).
const MAX_SERVER_WORKERS: u64 = 64;
/// How long the server keeps serving after the window, so the clients'
/// last requests finish before it stops.
const SERVER_GRACE: Duration = Duration::from_millis(500);
/// Most client worker threads on one agent.
const MAX_CLIENT_WORKERS: usize = 8;
/// What one client commits, bytes, an upper bound: its connection's state
/// (at most 512 bytes, which a unit test of `client` holds it to; 320 measured), its request
/// (under 256: a GET line and a Host header), its latency histogram (a
/// `FlowHistogram`: typically under 1 KiB, 4.6 KiB if its transactions
/// spanned 1 ns to an hour) and its outcome and report (about 200):
/// 512 + 256 + 4,710 + 200 = 5,678, rounded up. The receive buffer is its
/// worker's; a response head split across reads is copied until it is
/// whole (a few hundred bytes from nginx or Apache; at most
/// [`client::BUF_BYTES`] from a server that sends a huge head slowly).
const CLIENT_BYTES: u64 = 6 * 1024;

/// `--server`: its choices and help come from [`service::web_servers`].
fn server_option() -> &'static WorkloadOption {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    static HELP: OnceLock<String> = OnceLock::new();
    static OPTION: OnceLock<WorkloadOption> = OnceLock::new();
    OPTION.get_or_init(|| {
        let servers = service::web_servers();
        let names = NAMES.get_or_init(|| servers.iter().map(|s| s.name()).collect());
        let helps: Vec<&str> = servers.iter().map(|s| s.help()).collect();
        let default = names.first().copied().unwrap_or_default();
        WorkloadOption {
            flag: "server",
            kind: OptionKind::Choice(names.as_slice()),
            value_name: "NAME[,NAME]",
            help: HELP.get_or_init(|| {
                format!(
                    "web: the server program on the first host: {}; a list gives one point per server [default: {default}]",
                    helps.join(" or ")
                )
            }),
            axis: true,
        }
    })
}
static TRACE: WorkloadOption = WorkloadOption {
    flag: "trace",
    kind: OptionKind::Choice(&["single", "zipf"]),
    value_name: "NAME",
    help: "web: single (every request for one file of the point's size, one point per -s size) or zipf (a generated file set by Zipf popularity) [default: single]",
    axis: false,
};
static ALPHA: WorkloadOption = WorkloadOption {
    flag: "alpha",
    kind: OptionKind::Number { min: 0.0, max: 3.0 },
    value_name: "A[,A...]",
    help: "web --trace zipf: the Zipf exponent of file popularity (0: uniform); a list gives one point per exponent [default: 1.0]",
    axis: true,
};
static FILES: WorkloadOption = WorkloadOption {
    flag: "files",
    kind: OptionKind::Count {
        min: 1,
        max: fileset::MAX_FILES as u64,
    },
    value_name: "N",
    help: "web --trace zipf: files in the generated set (SPECweb99 classes, 36 per directory) [default: 360]",
    axis: false,
};
static FILE_SEED: WorkloadOption = WorkloadOption {
    flag: "file-seed",
    kind: OptionKind::Count {
        min: 0,
        max: u32::MAX as u64,
    },
    value_name: "N",
    help: "web: seed of the file set's content and of the clients' request sequences [default: 1]",
    axis: false,
};
static VERIFY_FRACTION: WorkloadOption = WorkloadOption {
    flag: "verify-fraction",
    kind: OptionKind::Number { min: 0.0, max: 1.0 },
    value_name: "F",
    help: "web: share of response bodies compared byte for byte with the file set (every status and length is always checked) [default: 1]",
    axis: false,
};
static PER_REQUEST: WorkloadOption = WorkloadOption {
    flag: "connection-per-request",
    kind: OptionKind::Switch,
    value_name: "",
    help: "web: open a new connection for every request (Connection: close) instead of keeping one alive per client",
    axis: false,
};
/// `--server-workers`: its help names each server's workers
/// ([`WebServer::workers_help`](service::WebServer::workers_help)).
fn server_workers_option() -> &'static WorkloadOption {
    static HELP: OnceLock<String> = OnceLock::new();
    static OPTION: OnceLock<WorkloadOption> = OnceLock::new();
    OPTION.get_or_init(|| {
        let workers: Vec<&str> = service::web_servers()
            .iter()
            .map(|s| s.workers_help())
            .collect();
        WorkloadOption {
            flag: "server-workers",
            kind: OptionKind::Count {
                min: 1,
                max: MAX_SERVER_WORKERS,
            },
            value_name: "N",
            help: HELP.get_or_init(|| {
                format!(
                    "web: {} [default: one per CPU of the server host]",
                    workers.join(", or ")
                )
            }),
            axis: false,
        }
    })
}

/// Every option of `web`.
fn all_options() -> &'static [&'static WorkloadOption] {
    static OPTIONS: OnceLock<Vec<&'static WorkloadOption>> = OnceLock::new();
    OPTIONS.get_or_init(|| {
        vec![
            server_option(),
            &TRACE,
            &ALPHA,
            &FILES,
            &FILE_SEED,
            &VERIFY_FRACTION,
            &PER_REQUEST,
            server_workers_option(),
        ]
    })
}

/// The `web` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Web;

/// The request trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Trace {
    /// Every request for one file.
    Single,
    /// Zipf popularity over a file set.
    Zipf,
}

/// What every role of a `web` point gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// The server program: a name of [`service::web_servers`].
    pub server: String,
    /// The trace.
    pub trace: Trace,
    /// The file's size for `single`, bytes.
    pub file_bytes: u64,
    /// Files of the `zipf` set.
    pub files: u32,
    /// Zipf exponent.
    pub alpha: f64,
    /// Seed of the content and the request sequences.
    pub seed: u64,
    /// Share of bodies compared byte for byte, 0 to 1.
    pub verify_fraction: f64,
    /// A new connection per request.
    pub connection_per_request: bool,
    /// Server workers; 0: one per CPU of the server host.
    pub server_workers: u32,
}

fn bad(detail: impl Into<String>) -> RoleError {
    RoleError::Params {
        workload: NAME,
        detail: detail.into(),
    }
}

impl Params {
    /// Range-checks parameters from a peer; never panics.
    fn check(&self, ctx: &RoleContext<'_>) -> Result<(), RoleError> {
        if self.file_bytes == 0 || self.file_bytes > MAX_FILE_BYTES {
            return Err(bad(format!(
                "file_bytes {} is outside 1 to {MAX_FILE_BYTES}",
                self.file_bytes
            )));
        }
        ctx.limits.check_message_bytes(self.file_bytes)?;
        if self.files == 0 || self.files > fileset::MAX_FILES {
            return Err(bad(format!(
                "files {} is outside 1 to {}",
                self.files,
                fileset::MAX_FILES
            )));
        }
        if !(0.0..=3.0).contains(&self.alpha) {
            return Err(bad("alpha is outside 0 to 3"));
        }
        if !(0.0..=1.0).contains(&self.verify_fraction) {
            return Err(bad("verify_fraction is outside 0 to 1"));
        }
        if u64::from(self.server_workers) > MAX_SERVER_WORKERS {
            return Err(bad(format!("server_workers is over {MAX_SERVER_WORKERS}")));
        }
        Ok(())
    }

    /// The point's file set.
    fn fileset(&self) -> FileSet {
        match self.trace {
            Trace::Single => FileSet::single(self.seed, self.file_bytes),
            Trace::Zipf => FileSet::mix(self.seed, self.files),
        }
    }
}

/// What `Web` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "nginx or Apache on the first host, N closed-loop HTTP/1.1 clients; transactions/s",
    metric: Metric::Other {
        key: "transactions_per_s",
        combine: netgap_core::metric::Combine::Sum,
    },
    count: CountFlag::Clients,
    max_flows: MAX_CLIENTS,
    takes_bidir: false,
};

impl Workload for Web {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        1024
    }

    fn wrapped_programs(&self) -> Option<&'static str> {
        Some(NAME)
    }

    /// The server and the load generator, under the library over shm or
    /// xdp.
    fn wraps_programs(&self, spec: &PointSpec, _args: &WorkloadArgs) -> bool {
        netgap_transport::programs(&spec.transport).under_library()
    }

    /// A real web server speaks HTTP over the host's TCP: any other
    /// transport, and socket options the server would not share, are
    /// refused.
    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        match transport.capabilities().programs {
            Programs::Kernel => {}
            Programs::Library | Programs::LibraryWithRelay => {
                crate::preload::library_path()
                    .map_err(|e| Refused(format!("{NAME} -t {}: {e}", spec.transport)))?;
            }
            Programs::No => {
                return Err(Refused(format!(
                    "{NAME} runs real web servers, which speak HTTP over the host's TCP, or through the preload library over shm on one host or xdp across hosts; use -t {}, not {}",
                    netgap_transport::program_transports(),
                    spec.transport
                )))
            }
        }
        // `--preload-relayed` is for the programs, the one option that is.
        let own = netgap_core::spec::TransportOptions {
            preload_relayed: false,
            ..spec.options.clone()
        };
        if own != netgap_core::spec::TransportOptions::default() {
            return Err(Refused(format!(
                "{NAME}: transport options apply to netgap's own flows, not to a real server's; drop them"
            )));
        }
        if spec.size_bytes == 0 || spec.size_bytes > MAX_FILE_BYTES {
            return Err(Refused(format!(
                "{NAME}: file sizes must be between 1 byte and 64M"
            )));
        }
        Ok(())
    }

    fn options(&self) -> &'static [&'static WorkloadOption] {
        all_options()
    }

    fn params(&self, spec: &PointSpec, args: &WorkloadArgs) -> serde_json::Value {
        let default = service::web_servers().first().map_or("", |s| s.name());
        let server = args.str("server").unwrap_or(default).to_string();
        let trace = match args.str("trace") {
            Some("zipf") => Trace::Zipf,
            _ => Trace::Single,
        };
        let u32_of = |flag: &str, default: u32| {
            args.u64(flag)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(default)
        };
        serde_json::json!(Params {
            server,
            trace,
            file_bytes: spec.size_bytes,
            files: u32_of("files", DEFAULT_FILES),
            alpha: args.f64("alpha").unwrap_or(1.0),
            seed: args.u64("file-seed").unwrap_or(DEFAULT_SEED),
            verify_fraction: args.f64("verify-fraction").unwrap_or(1.0),
            connection_per_request: args.switch("connection-per-request"),
            server_workers: u32_of("server-workers", 0),
        })
    }

    fn metrics(
        &self,
        roles: &[(WorkloadRole, &BTreeMap<String, f64>)],
        window_ns: u64,
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (_, m) in roles {
            for (k, v) in m.iter() {
                *out.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        if let Some(&bytes) = out.get("payload_bytes") {
            if window_ns > 0 {
                out.insert(
                    "payload_gbps".into(),
                    netgap_core::units::gbps(bytes, window_ns as f64),
                );
            }
        }
        if let (Some(&v), Some(&c)) = (out.get("verified"), out.get("checked")) {
            if c > 0.0 {
                out.insert("verified_share".into(), v / c);
            }
        }
        out
    }

    /// Refuses, before anything starts, more clients than the server's
    /// configuration serves ([`WebServer::refuse_clients`](service::WebServer::refuse_clients)).
    fn place(
        &self,
        params: &serde_json::Value,
        count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        let server = params
            .get("server")
            .and_then(|v| v.as_str())
            .and_then(service::web_server);
        let workers = params
            .get("server_workers")
            .and_then(|v| v.as_u64())
            .and_then(|w| u32::try_from(w).ok())
            .unwrap_or(0);
        if let Some(detail) = server.and_then(|s| s.refuse_clients(u64::from(count), workers)) {
            return Err(Refused(format!("{NAME}: {detail}")));
        }
        place::spread(count, hosts)
    }

    /// A client holds its state, request, histogram and report
    /// (6 KiB, an upper bound); its worker's receive buffer is shared by the
    /// worker's clients. The server role holds nothing per client (the
    /// server program does).
    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        match spec.role {
            WorkloadRole::Server => PER_FLOW_BYTES,
            WorkloadRole::Client => CLIENT_BYTES
                .saturating_mul(u64::from(spec.flows))
                .saturating_add((MAX_CLIENT_WORKERS * client::BUF_BYTES) as u64),
        }
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let p: Params = parse_params(NAME, ctx.spec)?;
        p.check(&ctx)?;
        match ctx.spec.role {
            WorkloadRole::Server => open_server(&p, &ctx),
            WorkloadRole::Client => open_clients(&p, &ctx),
        }
    }

    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        if side == WorkloadRole::Server {
            return FlowSample::default();
        }
        FlowSample {
            value: Some(per_second(report.round_trips, window_ns)),
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

/// `count` events in `window_ns`, per second.
fn per_second(count: u64, window_ns: u64) -> f64 {
    if window_ns == 0 {
        return 0.0;
    }
    count as f64 / (window_ns as f64 / 1e9)
}

fn refused(detail: impl std::fmt::Display) -> RoleError {
    RoleError::Refused {
        workload: NAME,
        detail: detail.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn transactions_per_second_over_the_window() {
        assert!((per_second(500, 500_000_000) - 1000.0).abs() < 1e-9);
        assert_eq!(per_second(5, 0), 0.0);
    }

    #[test]
    fn the_server_option_offers_every_registered_server() {
        let names: Vec<&str> = service::web_servers().iter().map(|s| s.name()).collect();
        assert_eq!(names, ["nginx", "apache"]);
        assert!(matches!(server_option().kind, OptionKind::Choice(c) if c == names.as_slice()));
        assert!(server_option().help.ends_with("[default: nginx]"));
    }

    #[test]
    fn apache_is_sized_to_the_clients_and_refused_past_its_thread_limit_in_one_line() {
        let hosts: Vec<HostView> = (0..2)
            .map(|i| HostView {
                name: format!("h{i}"),
                address: None,
                rails: vec![],
            })
            .collect();
        let apache = serde_json::json!({ "server": "apache", "server_workers": 0 });
        assert!(Web.place(&apache, 4097, &hosts).is_ok());
        assert!(Web.place(&apache, MAX_CLIENTS, &hosts).is_ok());
        let one_child = serde_json::json!({ "server": "apache", "server_workers": 1 });
        assert!(Web.place(&one_child, 15_000, &hosts).is_ok());
        let e = Web.place(&one_child, 16_000, &hosts).unwrap_err();
        assert_eq!(
            e.0,
            "web: Apache cannot serve 16000 clients with 1 children: each would need 20064 threads, past the most its ThreadLimit may be (20000); ask for more children with --server-workers"
        );
        let nginx = serde_json::json!({ "server": "nginx", "server_workers": 1 });
        assert!(Web.place(&nginx, 16_000, &hosts).is_ok());
    }
}
