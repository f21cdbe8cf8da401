//! `pio`: striped parallel file I/O of the PVFS class (seeds 000, 002).
//! An I/O server on each of the first `--servers` hosts keeps its stripes
//! of one logical file in a real file on its host, under the directory
//! its agent's operator allows (`netgap serve --io-dir`, by default the
//! agent's run directory; `--dir` names only a relative subdirectory of
//! it), reserved before the timed part and removed afterwards; `--clients`
//! clients on the
//! other hosts stripe the file round-robin over the servers in units of
//! the point's size (the stripe unit, recorded as the size) and move it
//! in the `contiguous` pattern of pvfs-test or the `tile` pattern of
//! MPI-Tile-I/O.
//!
//! Each repetition writes then reads the whole file back, every byte
//! checked against what was written: a barrier at every server, the timed
//! writes and a sync, a barrier where the servers flush their files and
//! drop them from the page cache (or write directly, [`server`]), the
//! timed reads. The headline is the bandwidth of the `--op` phase: all
//! clients' bytes over the slowest client's time; both phases' figures
//! are in the record's `app.metrics`. Each role's CPU is its agent's over
//! the `--op` phase, read at the phase's edges (the gates and barriers
//! that time it), so it is the CPU of the threads that moved the
//! headline's bytes while they moved them; the CPU of both phases is in
//! `app.metrics` too. The job runs to completion; the warm-up and
//! `--duration` window of the repetition only bound it.

pub(crate) mod client;
mod client_role;
pub(crate) mod layout;
pub(crate) mod server;
mod server_role;
pub(crate) mod wire;

use super::options::{OptionKind, WorkloadArgs, WorkloadOption};
use super::place::{HostView, Placement, RolePlace, Staged};
use super::role::{
    find_transport, parse_params, OpenRole, RoleContext, RoleError, Stop, WindowEdge,
    PER_FLOW_BYTES,
};
use super::staged::{self, Inbound};
use super::{CountFlag, FlowSample, Refused, StagedWorkload, Workload};
use crate::About;
use client_role::ClientRole;
use layout::{Layout, Pattern};
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::{FlowConfig, Transport};
use server_role::ServerOpen;
use std::collections::BTreeMap;

const NAME: &str = "pio";

/// Most I/O servers of a point.
pub(crate) const MAX_SERVERS: u64 = 16;
/// Most clients of a point.
const MAX_CLIENTS: u32 = 256;
/// Largest logical file, bytes.
const MAX_FILE_BYTES: u64 = 64 << 30;
/// Smallest and largest stripe unit (the point's size), bytes.
const STRIPE_RANGE: (u64, u64) = (512, 16 << 20);

/// A failure of a pio role, one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PioError(pub String);

impl From<PioError> for RoleError {
    fn from(e: PioError) -> RoleError {
        RoleError::Refused {
            workload: NAME,
            detail: e.0,
        }
    }
}

static SERVERS: WorkloadOption = WorkloadOption {
    flag: "servers",
    kind: OptionKind::Count {
        min: 1,
        max: MAX_SERVERS,
    },
    value_name: "S",
    help: "I/O servers, the first S hosts (default 1); a list makes one point each",
    axis: true,
};
static PATTERN: WorkloadOption = WorkloadOption {
    flag: "pattern",
    kind: OptionKind::Choice(&["contiguous", "tile"]),
    value_name: "PATTERN",
    help: "contiguous (pvfs-test blocks) or tile (MPI-Tile-I/O rows); default contiguous",
    axis: true,
};
static OP: WorkloadOption = WorkloadOption {
    flag: "op",
    kind: OptionKind::Choice(&["write", "read"]),
    value_name: "OP",
    help: "the phase whose bandwidth is the headline (both always run); default read; write,read makes a point each",
    axis: true,
};
static BLOCK: WorkloadOption = WorkloadOption {
    flag: "block",
    kind: OptionKind::Bytes {
        min: 4096,
        max: 64 << 20,
    },
    value_name: "BYTES",
    help: "contiguous pattern: bytes per block (default 2M, the study's)",
    axis: false,
};
static BLOCKS: WorkloadOption = WorkloadOption {
    flag: "blocks",
    kind: OptionKind::Count { min: 1, max: 4096 },
    value_name: "N",
    help: "contiguous pattern: blocks per client (default 8)",
    axis: false,
};
static TILE_COLS: WorkloadOption = WorkloadOption {
    flag: "tile-cols",
    kind: OptionKind::Count { min: 1, max: 65536 },
    value_name: "N",
    help: "tile pattern: elements per tile row (default 1024)",
    axis: false,
};
static TILE_ROWS: WorkloadOption = WorkloadOption {
    flag: "tile-rows",
    kind: OptionKind::Count { min: 1, max: 65536 },
    value_name: "N",
    help: "tile pattern: rows per tile (default 768)",
    axis: false,
};
static ELEMENT: WorkloadOption = WorkloadOption {
    flag: "element",
    kind: OptionKind::Bytes {
        min: 1,
        max: 1 << 20,
    },
    value_name: "BYTES",
    help: "tile pattern: bytes per element (default 32)",
    axis: false,
};
static CACHE: WorkloadOption = WorkloadOption {
    flag: "cache",
    kind: OptionKind::Choice(&["bypass", "keep"]),
    value_name: "HOW",
    help: "bypass (direct I/O, else flush and drop, as the file system allows; default) or keep the page cache",
    axis: false,
};
static DIR: WorkloadOption = WorkloadOption {
    flag: "dir",
    kind: OptionKind::Path,
    value_name: "DIR",
    help: "subdirectory, relative, of each server agent's I/O directory (netgap serve --io-dir; default its run directory) for its stripes; made if missing and then removed; only netgap's files are removed",
    axis: false,
};
static OPTIONS: [&WorkloadOption; 10] = [
    &SERVERS, &PATTERN, &OP, &BLOCK, &BLOCKS, &TILE_COLS, &TILE_ROWS, &ELEMENT, &CACHE, &DIR,
];

/// The parameters every pio role gets.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PioParams {
    servers: u32,
    pattern: String,
    op: String,
    block_bytes: u64,
    blocks: u64,
    tile_cols: u64,
    tile_rows: u64,
    element_bytes: u64,
    cache: String,
    #[serde(default)]
    dir: Option<String>,
    #[serde(default)]
    staged: Option<Staged>,
}

impl PioParams {
    fn pattern(&self) -> Result<Pattern, PioError> {
        match self.pattern.as_str() {
            "contiguous" => Ok(Pattern::Contiguous {
                block_bytes: self.block_bytes,
                blocks: self.blocks,
            }),
            "tile" => Ok(Pattern::Tile {
                cols: self.tile_cols,
                rows: self.tile_rows,
                element_bytes: self.element_bytes,
            }),
            p => Err(PioError(format!("unknown pattern {p:?}"))),
        }
    }

    /// Range-checks what a peer sent.
    fn check(&self, stripe_bytes: u64, clients: u32) -> Result<Pattern, PioError> {
        let ok = (1..=MAX_SERVERS as u32).contains(&self.servers)
            && (4096..=64 << 20).contains(&self.block_bytes)
            && (1..=4096).contains(&self.blocks)
            && (1..=65536).contains(&self.tile_cols)
            && (1..=65536).contains(&self.tile_rows)
            && (1..=1 << 20).contains(&self.element_bytes)
            && (STRIPE_RANGE.0..=STRIPE_RANGE.1).contains(&stripe_bytes)
            && matches!(self.op.as_str(), "write" | "read")
            && matches!(self.cache.as_str(), "bypass" | "keep")
            && (1..=MAX_CLIENTS).contains(&clients);
        if !ok {
            return Err(PioError("parameters out of range".into()));
        }
        let pattern = self.pattern()?;
        if pattern.logical_bytes(clients) > MAX_FILE_BYTES {
            return Err(PioError(format!(
                "a file of {} bytes is past the {MAX_FILE_BYTES}-byte limit",
                pattern.logical_bytes(clients)
            )));
        }
        Ok(pattern)
    }
}

/// The `pio` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pio;

impl StagedWorkload for Pio {
    /// All bytes over the slowest client's time.
    fn headline(&self, metrics: &BTreeMap<String, f64>) -> Option<f64> {
        let bytes = metrics.get("headline_bytes")?;
        let ms = metrics.get("headline_time_ms")?;
        (*ms > 0.0).then(|| netgap_core::units::gbps(*bytes, ms * 1e6))
    }
}

/// What `Pio` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "striped parallel file I/O (PVFS class): S servers, C clients, contiguous or tiled; write and read bandwidth, verified",
    metric: Metric::BandwidthGbps,
    count: CountFlag::Clients,
    max_flows: MAX_CLIENTS,
    takes_bidir: false,
};

impl Workload for Pio {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        64 * 1024
    }

    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        // Clients dial only the addresses the servers announced, in the
        // transport's own form (xdp's `IP/MAC/FLOW` too).
        super::check_crosses_hosts(NAME, spec, transport)?;
        if !transport.capabilities().reliable {
            return Err(Refused(format!(
                "pio: transport {} is not reliable; a file's bytes need every byte delivered",
                spec.transport
            )));
        }
        // The smallest size is checked by each role.
        if spec.size_bytes > STRIPE_RANGE.1 {
            return Err(Refused(format!(
                "pio: the size is the stripe unit: {} bytes is not between {} and {}",
                spec.size_bytes, STRIPE_RANGE.0, STRIPE_RANGE.1
            )));
        }
        Ok(())
    }

    fn options(&self) -> &'static [&'static WorkloadOption] {
        &OPTIONS
    }

    fn params(&self, _spec: &PointSpec, args: &WorkloadArgs) -> serde_json::Value {
        let p = PioParams {
            servers: args.u64("servers").unwrap_or(1) as u32,
            pattern: args.str("pattern").unwrap_or("contiguous").to_string(),
            op: args.str("op").unwrap_or("read").to_string(),
            block_bytes: args.u64("block").unwrap_or(2 << 20),
            blocks: args.u64("blocks").unwrap_or(8),
            tile_cols: args.u64("tile-cols").unwrap_or(1024),
            tile_rows: args.u64("tile-rows").unwrap_or(768),
            element_bytes: args.u64("element").unwrap_or(32),
            cache: args.str("cache").unwrap_or("bypass").to_string(),
            dir: args.str("dir").map(str::to_string),
            staged: None,
        };
        serde_json::to_value(p).unwrap_or_default()
    }

    fn metrics(
        &self,
        roles: &[(WorkloadRole, &BTreeMap<String, f64>)],
        _window_ns: u64,
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (_, m) in roles {
            for (k, v) in m.iter() {
                let e = out.entry(k.clone()).or_insert(0.0);
                // A phase lasts as long as its slowest client.
                if k.ends_with("_time_ms") {
                    *e = f64::max(*e, *v);
                } else {
                    *e += v;
                }
            }
        }
        for phase in ["write", "read"] {
            let bytes = out.get(&format!("{phase}_bytes")).copied();
            let ms = out.get(&format!("{phase}_time_ms")).copied();
            if let (Some(b), Some(ms)) = (bytes, ms) {
                if ms > 0.0 {
                    out.insert(
                        format!("{phase}_gbps"),
                        netgap_core::units::gbps(b, ms * 1e6),
                    );
                }
            }
        }
        out
    }

    fn place(
        &self,
        params: &serde_json::Value,
        count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        let servers = params
            .get("servers")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1);
        place(servers as usize, count, hosts)
    }

    fn staged(&self) -> Option<&dyn StagedWorkload> {
        Some(self)
    }

    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        // A server holds a stripe per client flow; a client two stripes per
        // server flow of each of its clients.
        let servers = spec
            .params
            .get("servers")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1)
            .min(MAX_SERVERS);
        let stripe = spec
            .point
            .size_bytes
            .saturating_add(server::DIRECT_ALIGN as u64);
        let per_flow = stripe
            .saturating_mul(2)
            .saturating_add(PER_FLOW_BYTES)
            .saturating_mul(servers);
        per_flow.saturating_mul(u64::from(spec.flows))
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let params: PioParams = parse_params(NAME, ctx.spec)?;
        let t = find_transport(ctx.spec)?;
        let view = staged::view(NAME, params.staged.clone(), ctx.spec, t)?;
        let s = &view.staged;
        let clients: u32 = s
            .roles
            .iter()
            .filter(|r| r.side == WorkloadRole::Client)
            .map(|r| r.flows.len() as u32)
            .sum();
        let pattern = params.check(ctx.spec.point.size_bytes, clients)?;
        ctx.limits.check_message_bytes(ctx.spec.point.size_bytes)?;
        // A file is written and read once per repetition: no more than the
        // agent moves in one run.
        let file_bytes = pattern.logical_bytes(clients);
        if file_bytes as f64 * 2.0 > ctx.limits.max_run_bytes() {
            return Err(PioError(format!(
                "a file of {file_bytes} bytes written and read is past what this agent moves in one run ({:.3e} bytes)",
                ctx.limits.max_run_bytes()
            ))
            .into());
        }
        let servers = params.servers as usize;
        let shape_ok = s.roles.len() > servers
            && s.roles[..servers]
                .iter()
                .all(|r| r.side == WorkloadRole::Server)
            && s.roles[servers..]
                .iter()
                .all(|r| r.side == WorkloadRole::Client)
            && s.roles[servers..]
                .iter()
                .flat_map(|r| r.flows.iter())
                .all(|&f| f < clients);
        if !shape_ok {
            return Err(PioError("the placement is not servers then clients".into()).into());
        }
        let layout = Layout {
            stripe_bytes: ctx.spec.point.size_bytes,
            servers: params.servers,
        };
        let config = FlowConfig::from_spec(&ctx.spec.point);
        let me = s.role;
        let common = Common {
            spec: ctx.spec.clone(),
            stop: ctx.stop.clone(),
            layout,
            pattern,
            clients,
            headline_read: params.op == "read",
        };
        if me < servers {
            // A server: one listener per client, client c at listener c.
            let limit = layout.local_bytes(pattern.logical_bytes(clients));
            // Stripes go only under the directory the agent's operator
            // allows; a coordinator names at most a relative subdirectory.
            let io = ctx.dirs.io_dir().map_err(|e| PioError(e.to_string()))?;
            let file = server::ServerFile::create(
                io,
                params.dir.as_deref(),
                me,
                params.cache == "bypass",
                limit,
            )?;
            let ip = staged::listen_ip(NAME, &ctx, t)?;
            let inbound =
                Inbound::listen(t, &config, ip, clients as usize, ctx.data_token, ctx.rate)?;
            Ok(Box::new(ServerOpen {
                common,
                inbound,
                file,
                limit,
                index: me,
            }))
        } else {
            let mine = s.roles[me].flows.clone();
            let mut conns = Vec::with_capacity(mine.len());
            for (k, &c) in mine.iter().enumerate() {
                let mut per_server = Vec::with_capacity(servers);
                for srv in 0..servers {
                    let addr = view.peers[srv].get(c as usize).ok_or_else(|| {
                        PioError(format!("server {srv} announced no address for client {c}"))
                    })?;
                    let index = k * servers + srv;
                    per_server.push(staged::dial(
                        t,
                        &config,
                        addr.as_str(),
                        ctx.data_token,
                        index,
                        ctx.rate,
                    )?);
                }
                conns.push((c, per_server));
            }
            Ok(Box::new(ClientRole { common, conns }))
        }
    }

    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        if side == WorkloadRole::Server {
            return FlowSample::default();
        }
        // A client's share of its role's phase: its bytes over the time of
        // its role's slowest client.
        FlowSample {
            value: Some(netgap_core::units::gbps(
                report.window_bytes_rx as f64,
                window_ns.max(1) as f64,
            )),
            bytes_tx: report.bytes_tx,
            bytes_rx: report.bytes_rx,
            window_bytes: report.window_bytes_rx,
            percentiles: None,
        }
    }
}

/// Servers on the first `servers` hosts, every one serving every client;
/// clients spread cyclically over the other hosts.
fn place(servers: usize, clients: u32, hosts: &[HostView]) -> Result<Placement, Refused> {
    if hosts.len() <= servers {
        return Err(Refused(format!(
            "pio: --servers {servers} needs {servers} server hosts and a client host; the run has {} hosts",
            hosts.len()
        )));
    }
    let client_hosts = (hosts.len() - servers) as u32;
    let mut roles: Vec<RolePlace> = (0..servers)
        .map(|h| RolePlace {
            host: h,
            side: WorkloadRole::Server,
            flows: (0..clients).collect(),
            connects_to: None,
            listen_ips: None,
            bind_ips: None,
        })
        .collect();
    for h in 0..client_hosts {
        let flows = super::allot::clients_of(clients, client_hosts, h);
        if !flows.is_empty() {
            roles.push(RolePlace {
                host: servers + h as usize,
                side: WorkloadRole::Client,
                flows,
                connects_to: None,
                listen_ips: None,
                bind_ips: None,
            });
        }
    }
    Ok(Placement {
        roles,
        flows: clients,
        links: Vec::new(),
    })
}

/// What every pio role keeps.
struct Common {
    spec: WorkloadSpec,
    stop: Stop,
    layout: Layout,
    pattern: Pattern,
    clients: u32,
    headline_read: bool,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn join_all<T>(
    handles: Vec<std::thread::JoinHandle<Result<T, PioError>>>,
) -> Result<Vec<T>, RoleError> {
    let mut out = Vec::with_capacity(handles.len());
    let mut first_err = None;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(RoleError::from(e));
            }
            Err(_) => {
                first_err.get_or_insert(RoleError::Panicked {
                    what: format!("pio thread {i}"),
                });
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// A phase of the job, from its start to its end.
pub(crate) type Phase = (WindowEdge, WindowEdge);

/// The length of a phase, ns.
fn phase_ns((start, end): Phase) -> u64 {
    u64::try_from(end.at().saturating_duration_since(start.at()).as_nanos()).unwrap_or(u64::MAX)
}

/// The span of `phase` and of `so_far` (the phases of a role's other
/// clients): from the earlier start to the later end.
fn span(so_far: Option<Phase>, phase: Phase) -> Phase {
    match so_far {
        None => phase,
        Some((start, end)) => (
            if phase.0.at() < start.at() {
                phase.0
            } else {
                start
            },
            if phase.1.at() > end.at() {
                phase.1
            } else {
                end
            },
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    use crate::place::test_hosts as hosts;

    #[test]
    fn servers_take_the_first_hosts_and_clients_the_rest() {
        let p = place(3, 1, &hosts(4)).unwrap();
        p.validate(4).unwrap();
        assert_eq!(p.roles.len(), 4);
        assert!(p.roles[..3].iter().all(|r| r.side == WorkloadRole::Server));
        assert_eq!(p.roles[3].host, 3);
        let p = place(1, 3, &hosts(4)).unwrap();
        assert_eq!(p.roles.len(), 4);
        assert_eq!(p.roles[1].flows, vec![0]);
        assert!(place(4, 1, &hosts(4))
            .unwrap_err()
            .0
            .contains("--servers 4"));
    }

    #[test]
    fn the_headline_is_all_bytes_over_the_slowest_client() {
        let a = BTreeMap::from([
            ("headline_bytes".to_string(), 1e9),
            ("headline_time_ms".to_string(), 1000.0),
        ]);
        let b = BTreeMap::from([
            ("headline_bytes".to_string(), 1e9),
            ("headline_time_ms".to_string(), 2000.0),
        ]);
        let m = Pio.metrics(&[(WorkloadRole::Client, &a), (WorkloadRole::Client, &b)], 0);
        // 2e9 bytes in 2 s: 8 Gbit/s.
        assert_eq!((&Pio as &dyn Workload).headline(&[], &m), Some(8.0));
    }
}
