//! What the wire allows: the payload a shaped path can carry, and the check
//! of a record against it.
//!
//! A testbed link is held to `rate_bps` by a token bucket filter that
//! counts every frame from its Ethernet header on (14 bytes, no preamble or
//! FCS), so the payload a stack moves is the rate times the share of each
//! frame that is payload, which depends on the stack's framing:
//!
//! - tcp (and `uring`, kernel TCP): MSS = MTU - 40 (IP and TCP headers) -
//!   12 (the timestamp option), in a frame of MTU + 14 (1448 of 1514 at
//!   MTU 1500);
//! - mptcp: tcp's, less the DSS option every data segment carries (64-bit
//!   data ack and mapping, 26 bytes padded to 28);
//! - udp: one datagram per message, netgap's 24-byte header and the UDP
//!   header after the message, IP-fragmented past the MTU (each fragment
//!   its own IP header and frame), so the share depends on the message size;
//! - xdp: raw Ethernet frames with netgap's own 36-byte header (fields and
//!   the 8-byte authentication tag) after the Ethernet header;
//! - MPI over its tcp transport (`btl=tcp`): tcp's;
//! - unix, shm, loopback and shared memory: no link, no limit.
//!
//! Several links used at once (multirail, a workload point across a mesh)
//! carry the sum of their limits; a bidirectional test carries twice the
//! one-way limit, each direction having its own shaper. A workload point
//! is bounded by the links between its server hosts and its client hosts:
//! on a switch each host has one link, on a mesh each pair of hosts has one.
//!
//! A token bucket lets its bucket through at memory speed after an idle
//! moment, so a result is judged against the model, not the rate alone:
//! a window of `W` seconds (each repetition's own: its payload over its
//! bandwidth) carries at most the payload limit plus the bucket's payload
//! over `W` (and at most the limit plus 1%, the measurement's own
//! tolerance, whichever is larger), and a transfer of `B`
//! bytes after an idle moment takes at least `(B - bucket) / rate` on the
//! wire. A result past either is a measurement fault ([`Fault`]), never a
//! clean point. A path whose rate, MTU or framing is unknown has no limit
//! (`None`), never a guess.
//!
//! A result well below its limit is no fault, but something other than the
//! links bound it. On a testbed that may be the emulator itself: its
//! forwarding and shaping run on the same CPUs as the hosts' stacks, and
//! when they fill them the links never get the chance to bind
//! ([`emulator_bound`]). Or it may be the shaper: a stream that keeps its
//! link busy and stays well below the limit while the CPUs sat idle and
//! no end was busy itself was held by the token bucket, its bucket too
//! small for the rate, not by the stack ([`shaper_held`]).

pub use crate::framing::{
    Framing, ETH_HEADER_BYTES, NETGAP_UDP_HEADER_BYTES, NETGAP_XDP_HEADER_BYTES,
};
use crate::load::{emulator_finding, CpuLoad, EMULATOR_REMEDY};
use crate::record::ResultRecord;
/// The physics section of a record is part of the result model.
pub use crate::record::{Fault, Physics};
use crate::stack::Stack;

/// Tolerance of the plain limit: a bandwidth up to 1% above it is noise.
pub const TOLERANCE: f64 = 0.01;

/// The wire model of one record's path: its payload limit and its bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WireModel {
    /// Payload the path carries in Gbit/s (10^9 bit/s), all links and
    /// directions the test uses together.
    pub payload_limit_gbps: f64,
    /// Share of the shaped bytes that is payload.
    pub payload_share: f64,
    /// One link's shaper rate in bit/s.
    pub rate_bps: u64,
    /// The buckets the test can drain at once (all links and directions),
    /// in bytes as the shaper counts them, when the bucket is known.
    pub bucket_bytes: Option<u64>,
    /// Shapers the test's traffic passes at once (links times directions).
    pub shapers: u32,
}

impl WireModel {
    /// The model of one shaped link of `rate_bps` carrying `framing` at
    /// `mtu_bytes` with messages of `size_bytes`, used `shapers` times at
    /// once; `None` for an MTU too small for the headers or no shaper.
    pub fn new(
        framing: Framing,
        rate_bps: u64,
        mtu_bytes: u64,
        size_bytes: u64,
        bucket_bytes: Option<u64>,
        shapers: u32,
    ) -> Option<WireModel> {
        if shapers == 0 || rate_bps == 0 {
            return None;
        }
        let (payload, frame) = framing.payload_and_frame_bytes(mtu_bytes, size_bytes)?;
        let payload_share = payload as f64 / frame as f64;
        Some(WireModel {
            payload_limit_gbps: rate_bps as f64 * payload_share * f64::from(shapers) / 1e9,
            payload_share,
            rate_bps,
            bucket_bytes: bucket_bytes.map(|b| b * u64::from(shapers)),
            shapers,
        })
    }

    /// The model of a record's path, or `None` when its limit is unknown
    /// (no stack, no rate, no MTU, a stack with no link, or a multi-host
    /// placement whose links the record does not tell).
    pub fn of_record(r: &ResultRecord) -> Option<WireModel> {
        let stack = r.stack.as_ref()?;
        let framing = stack.framing?;
        let path = &stack.path;
        let rate_bps = path.rate_bps?;
        let mtu_bytes = u64::from(path.mtu_bytes?);
        let links = links_used(r, stack)?;
        let directions = if is_bidirectional(r) { 2 } else { 1 };
        WireModel::new(
            framing,
            rate_bps,
            mtu_bytes,
            r.size_bytes,
            path.bucket_bytes,
            links * directions,
        )
    }

    /// The most bandwidth (Gbit/s) a window of `window_s` seconds can show:
    /// the limit plus 1%, or the limit plus the buckets' payload over the
    /// window when that is more (the bucket passes at memory speed).
    pub fn max_window_gbps(&self, window_s: Option<f64>) -> f64 {
        let plain = self.payload_limit_gbps * (1.0 + TOLERANCE);
        match (self.bucket_bytes, window_s) {
            (Some(b), Some(w)) if w > 0.0 => {
                let burst_gbps = b as f64 * self.payload_share * 8.0 / w / 1e9;
                plain.max(self.payload_limit_gbps + burst_gbps)
            }
            _ => plain,
        }
    }

    /// The least time in µs that `payload_bytes` of one message after an
    /// idle moment take on one shaper: the frames past the bucket at the
    /// rate. `None` when the bucket is unknown: the least time then is not
    /// known either, and none is assumed.
    pub fn min_transfer_us(&self, payload_bytes: u64) -> Option<f64> {
        let per_shaper_bucket = self.bucket_bytes? / u64::from(self.shapers);
        let wire_bytes = payload_bytes as f64 / self.payload_share;
        let beyond = (wire_bytes - per_shaper_bucket as f64).max(0.0);
        Some(beyond * 8.0 / self.rate_bps as f64 * 1e6)
    }
}

/// Links the record's traffic crosses at once: a point-to-point test one,
/// `multirail` the links it lists, a workload point the links between
/// its server and client hosts.
fn links_used(r: &ResultRecord, stack: &Stack) -> Option<u32> {
    let Some(g) = &r.workload else {
        // mptcp on a mesh opens a subflow per link between the pair, and
        // the record does not say how many there are.
        let mesh = stack.path.topology.as_deref() == Some("mesh");
        let spans = stack.framing.is_some_and(Framing::spans_links);
        return (!(mesh && spans)).then_some(1);
    };
    if !g.links.is_empty() {
        return u32::try_from(g.links.len()).ok();
    }
    let count = |role: &str| -> Option<u32> {
        let mut hosts: Vec<&str> = g
            .hosts_cpu
            .iter()
            .filter(|h| h.role == role)
            .map(|h| h.host.as_str())
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        u32::try_from(hosts.len()).ok().filter(|&n| n > 0)
    };
    let clients = g.client_hosts.or_else(|| count("client"))?;
    let servers = count("server")?;
    match stack.path.topology.as_deref() {
        Some("switch") => Some(servers.min(clients)),
        Some("mesh") if !stack.framing.is_some_and(Framing::spans_links) => Some(servers * clients),
        _ => None,
    }
}

/// Whether the test moves payload both ways at once over the path.
fn is_bidirectional(r: &ResultRecord) -> bool {
    matches!(r.test.as_str(), "bibw" | "bibw-pingpong" | "mpi-bibw")
        || r.sweep.as_ref().is_some_and(|s| s.sweep_kind == "bidir")
        || r.options.as_ref().is_some_and(|o| o.bidir)
}

/// Tests whose headline is the one-way time of one message of the
/// record's size.
fn is_one_way_message(r: &ResultRecord) -> bool {
    r.metric == "latency_us" && matches!(r.test.as_str(), "pingpong" | "mpi-latency")
}

/// The share of what the machine under a testbed forwards through its
/// shapers that the links a point uses at once may take: the rest is left
/// to the measured programs' own work, which the calibration's kernel
/// streams do not have.
pub const FORWARDING_CARRY_SHARE: f64 = 0.8;

/// The machine's forwarding in Gbit/s when the path of `r`, whose payload
/// limit is `limit_gbps`, takes more than [`FORWARDING_CARRY_SHARE`] of
/// it; `None` when it does not, or the machine was not calibrated.
fn past_forwarding(r: &ResultRecord, limit_gbps: f64) -> Option<f64> {
    let mbps = r.stack.as_ref()?.path.forwarding_mbps?;
    let forwarding_gbps = mbps as f64 / 1e3;
    (limit_gbps > forwarding_gbps * FORWARDING_CARRY_SHARE).then_some(forwarding_gbps)
}

/// The fastest link rate, in bit/s, at which `shapers` shaped link
/// directions at once carry tcp's payload (at `mtu_bytes`) within
/// [`FORWARDING_CARRY_SHARE`] of a machine forwarding `forwarding_mbps`:
/// rounded down to two significant digits, so that it reads as a rate a
/// user would set.
pub fn carried_rate_bps(forwarding_mbps: u64, shapers: u32, mtu_bytes: u32) -> u64 {
    let share = tcp_payload_share(mtu_bytes);
    let raw =
        forwarding_mbps as f64 * 1e6 * FORWARDING_CARRY_SHARE / (share * f64::from(shapers.max(1)));
    round_down_two_digits(raw.max(0.0) as u64)
}

/// The share of a shaped link's bytes that is tcp's payload at
/// `mtu_bytes` (1 for an MTU too small for the headers: no share is
/// guessed below the rate).
pub fn tcp_payload_share(mtu_bytes: u32) -> f64 {
    Framing::Tcp
        .payload_and_frame_bytes(u64::from(mtu_bytes), 65_536)
        .map_or(1.0, |(p, f)| p as f64 / f as f64)
}

/// `v` with all but its two leading digits zeroed.
fn round_down_two_digits(v: u64) -> u64 {
    let mut scale = 1u64;
    while v / scale >= 100 {
        scale *= 10;
    }
    v / scale * scale
}

/// One sentence naming the point whose links take more than the machine
/// under the testbed carries (its [`Physics::past_forwarding_gbps`]).
pub fn past_forwarding_sentence(r: &ResultRecord, limit_gbps: f64, forwarding_gbps: f64) -> String {
    format!(
        "{} over {}, {} B: its links carry {limit_gbps:.3} Gbit/s at once, more than {:.0}% of \
         the {forwarding_gbps:.1} Gbit/s this machine forwards through the testbed's shapers: \
         the emulator, not the links, may bound this point; lower the links' rate (netgap \
         testbed set --rate) or use fewer links at once",
        r.test,
        r.transport,
        r.size_bytes,
        100.0 * FORWARDING_CARRY_SHARE
    )
}

/// The window in seconds for the bandwidth rule of a result of `gbps`
/// from record `r`: a sweep block's time, or the payload of one repetition
/// over `gbps`. Each repetition is judged over its own window: a faster
/// one took less time, and the bucket it may have drained counts for more
/// over it (one judged over the record's slower window would pass the
/// physics while the model says it fits).
fn window_s(r: &ResultRecord, gbps: f64) -> Option<f64> {
    if let Some(s) = &r.sweep {
        return (s.block_time_us > 0.0).then_some(s.block_time_us / 1e6);
    }
    let b = r.bytes.as_ref()?;
    let reps = r.stats.as_ref().map(|s| s.reps.len()).filter(|&n| n > 0)?;
    let per_rep_bits = (b.client_rx + b.server_rx) as f64 * 8.0 / reps as f64;
    (gbps > 0.0).then(|| per_rep_bits / (gbps * 1e9))
}

/// The physics of a record: its limit and any fault. `None` for a record
/// without a stack (imported, or older than stacks).
pub fn assess(r: &ResultRecord) -> Option<Physics> {
    r.stack.as_ref()?;
    let Some(model) = WireModel::of_record(r) else {
        return Some(Physics {
            payload_limit_gbps: None,
            fault: None,
            past_forwarding_gbps: None,
        });
    };
    let reps = r.stats.as_ref().map_or(&[][..], |s| s.reps.as_slice());
    let fault = if r.metric == "bandwidth_gbps" {
        let most = |gbps: f64| model.max_window_gbps(window_s(r, gbps));
        // The value when it passed; else the highest repetition that did.
        let past = if r.value > most(r.value) {
            Some(r.value)
        } else {
            reps.iter()
                .copied()
                .filter(|&v| v > most(v))
                .reduce(f64::max)
        };
        past.map(|value| Fault {
            kind: "above_payload_limit".into(),
            limit: most(value),
            limit_gbps: model.payload_limit_gbps,
            value,
        })
    } else if is_one_way_message(r) {
        model.min_transfer_us(r.size_bytes).and_then(|least| {
            let bound = least * (1.0 - TOLERANCE);
            // The value when it passed; else the lowest repetition, if it did.
            let past = if r.value < bound {
                Some(r.value)
            } else {
                reps.iter().copied().filter(|&v| v < bound).reduce(f64::min)
            };
            past.map(|value| Fault {
                kind: "faster_than_wire".into(),
                limit: least,
                limit_gbps: model.payload_limit_gbps,
                value,
            })
        })
    } else {
        None
    };
    Some(Physics {
        payload_limit_gbps: Some(model.payload_limit_gbps),
        fault,
        past_forwarding_gbps: past_forwarding(r, model.payload_limit_gbps),
    })
}

/// One sentence naming the point and how it passed its model.
pub fn fault_sentence(r: &ResultRecord, f: &Fault) -> String {
    let point = format!("{} over {}, {} B", r.test, r.transport, r.size_bytes);
    // A repetition past the bound, the record's value within it.
    let point = if f.value == r.value {
        point
    } else {
        format!("{point}, a repetition")
    };
    match f.kind.as_str() {
        "faster_than_wire" => format!(
            "{point}: {:.1} us one way is faster than the {:.1} us the shaped link needs for \
             the message past its bucket: a measurement fault, not a result",
            f.value, f.limit
        ),
        _ => format!(
            "{point}: {:.3} Gbit/s is above the {:.3} Gbit/s its path can carry (payload \
             limit {:.3} Gbit/s): a measurement fault, not a result",
            f.value, f.limit, f.limit_gbps
        ),
    }
}

/// The share of its payload limit below which a bandwidth did not reach
/// its links' rate: past the shaper's own ripple (a few percent) and far
/// enough below to ask what bound it.
pub const BELOW_LIMIT_SHARE: f64 = 0.9;

/// A bandwidth below its path's limit on a testbed whose forwarding filled
/// the machine's CPUs: the emulator, not the links, bound it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatorBound {
    /// The record's bandwidth, Gbit/s.
    pub value: f64,
    /// The path's payload limit, Gbit/s.
    pub limit_gbps: f64,
    /// The testbed's forwarding, in percent of all the machine's CPUs.
    pub forwarding_percent: f64,
}

/// Whether the emulator bound `r`, with the load of its machine `load`: a
/// bandwidth under [`BELOW_LIMIT_SHARE`] of its payload limit, no fault,
/// the machine saturated ([`CpuLoad::saturated`]) and the testbed's
/// forwarding named ([`CpuLoad::forwarding_named`]). `None` otherwise
/// (other metrics, no limit, off a testbed), never a guess.
pub fn emulator_bound(r: &ResultRecord, load: &CpuLoad) -> Option<EmulatorBound> {
    let physics = r.physics.as_ref().filter(|p| p.fault.is_none())?;
    let limit_gbps = physics.payload_limit_gbps.filter(|l| *l > 0.0)?;
    let below = r.metric == "bandwidth_gbps" && r.value < limit_gbps * BELOW_LIMIT_SHARE;
    if !(below && load.saturated() && load.forwarding_named()) {
        return None;
    }
    Some(EmulatorBound {
        value: r.value,
        limit_gbps,
        forwarding_percent: load.forwarding_percent()?,
    })
}

/// One sentence naming the point, how far below its limit it stayed and
/// that the emulator bound it, with the remedy.
pub fn bound_sentence(r: &ResultRecord, b: &EmulatorBound) -> String {
    format!(
        "{} over {}, {} B: {:.3} Gbit/s is {:.0}% of the {:.3} Gbit/s its path can carry while \
         {}; {EMULATOR_REMEDY}",
        r.test,
        r.transport,
        r.size_bytes,
        b.value,
        100.0 * b.value / b.limit_gbps,
        b.limit_gbps,
        emulator_finding(b.forwarding_percent, None)
    )
}

/// Busy share of all the machine's CPUs below which they count as idle
/// for the shaper's verdict: on 2 CPUs, a whole CPU free, so neither the
/// ends nor the forwarding waited for one.
pub const SHAPER_IDLE_BUSY_PERCENT: f64 = 50.0;

/// An end's own threads, in percent of one core, from which that end may
/// be CPU-bound itself (a thread sending or receiving flat out), however
/// idle the machine as a whole.
pub const END_BUSY_PERCENT_OF_CORE: f64 = 80.0;

/// Tests whose records keep their links busy: messages back to back until
/// the window ends, so a bandwidth below the limit is not the time between
/// messages. MPI's `mpi-bw` and `mpi-bibw` record as `stream` and `bibw`;
/// the ping-pong bandwidths (`bibw-pingpong`, a sweep's) wait a round trip
/// per message and are bound by it.
const LINK_BUSY_TESTS: [&str; 6] = [
    "stream",
    "bibw",
    "multistream",
    "fanin",
    "fanout",
    "multirail",
];

/// The remedy for a point the shaper held. The testbed sets the bucket by
/// its rule for the rate ([`crate::stack::PathIdentity::bucket_bytes`]),
/// no flag does, so what tells the stack's own figure is the same link
/// unshaped.
pub const SHAPER_REMEDY: &str = "compare with the unshaped link (netgap testbed set --rate \
     none) for what the stack reaches without it";

/// A bandwidth below its path's limit on a stream that kept its shaped
/// link busy while the CPUs were idle: the shaper, not the stack, held it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShaperHeld {
    /// The record's bandwidth, Gbit/s.
    pub value: f64,
    /// The path's payload limit, Gbit/s.
    pub limit_gbps: f64,
    /// Busy share of all the testbed machine's CPUs.
    pub busy_percent: f64,
    /// One link's bucket in bytes as the shaper counts them, when the
    /// record knows it.
    pub bucket_bytes: Option<u64>,
}

/// The highest share of one core an end's own threads used: both ends of
/// a point, or every host of a workload point. `None` without a reading,
/// or with one that is not finite.
fn busiest_end_percent_of_core(r: &ResultRecord) -> Option<f64> {
    let pair = r
        .cpu
        .iter()
        .flat_map(|c| [c.local.process_percent, c.remote.process_percent]);
    let hosts = r
        .workload
        .iter()
        .flat_map(|g| &g.hosts_cpu)
        .map(|h| h.cpu.process_percent);
    let mut busiest: Option<f64> = None;
    for p in pair.chain(hosts) {
        if !p.is_finite() {
            return None;
        }
        busiest = Some(busiest.map_or(p, |b| b.max(p)));
    }
    busiest
}

/// Whether the testbed's shaper held `r`, with the load of its machine
/// `load`: a bandwidth under [`BELOW_LIMIT_SHARE`] of its payload limit,
/// no fault, on a shaped testbed path with neither added delay nor loss
/// (each binds a stream by itself) and no socket buffer the run set (a
/// capped window does too), from a test that keeps its link busy
/// (`stream`, `bibw`, `multistream`, `fanin`, `fanout`, `multirail`; no
/// sweep, no ping-pong) with messages of at least the path's MTU (smaller
/// ones are bound by their per-message cost), the machine under
/// [`SHAPER_IDLE_BUSY_PERCENT`] busy and no end at
/// [`END_BUSY_PERCENT_OF_CORE`] of a core or more. `None` otherwise, and
/// without the readings to tell, never a guess.
pub fn shaper_held(r: &ResultRecord, load: &CpuLoad) -> Option<ShaperHeld> {
    let physics = r.physics.as_ref().filter(|p| p.fault.is_none())?;
    let limit_gbps = physics.payload_limit_gbps.filter(|l| *l > 0.0)?;
    let stack = r.stack.as_ref()?;
    let path = &stack.path;
    path.rate_bps?;
    let mtu_bytes = u64::from(path.mtu_bytes?);
    let plain_path = path.delay_us.unwrap_or(0) == 0 && path.loss_ppm.unwrap_or(0) == 0;
    let autotuned_window = !stack
        .options
        .iter()
        .any(|o| o.starts_with("sndbuf_bytes=") || o.starts_with("rcvbuf_bytes="));
    let streaming = r.sweep.is_none()
        && LINK_BUSY_TESTS.contains(&r.test.as_str())
        && r.size_bytes >= mtu_bytes;
    let below = r.metric == "bandwidth_gbps" && r.value < limit_gbps * BELOW_LIMIT_SHARE;
    let idle = load.testbed
        && load.busy_percent.is_finite()
        && load.busy_percent < SHAPER_IDLE_BUSY_PERCENT;
    if !(plain_path && autotuned_window && streaming && below && idle) {
        return None;
    }
    if busiest_end_percent_of_core(r)? >= END_BUSY_PERCENT_OF_CORE {
        return None;
    }
    Some(ShaperHeld {
        value: r.value,
        limit_gbps,
        busy_percent: load.busy_percent,
        bucket_bytes: path.bucket_bytes,
    })
}

/// One sentence naming the point, how far below its limit it stayed on
/// idle CPUs and that the shaper held it, with the remedy.
pub fn held_sentence(r: &ResultRecord, h: &ShaperHeld) -> String {
    let bucket = h
        .bucket_bytes
        .map_or_else(String::new, |b| format!(" (bucket {b} B)"));
    format!(
        "{} over {}, {} B: {:.3} Gbit/s is {:.0}% of the {:.3} Gbit/s its path can carry while \
         the CPUs were {:.0}% busy: the testbed's shaper{bucket}, not the stack, held this \
         point; {SHAPER_REMEDY}",
        r.test,
        r.transport,
        r.size_bytes,
        h.value,
        100.0 * h.value / h.limit_gbps,
        h.limit_gbps,
        h.busy_percent,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ByteCounts, HostCpu, RecordHead, RecordStats, WorkloadSection};
    use crate::spec::{Mode, TransportOptions};
    use crate::stack::PathIdentity;

    const G: u64 = 1_000_000_000;

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn record(test: &str, transport: &str, size: u64, metric: &str, value: f64) -> ResultRecord {
        ResultRecord::new(RecordHead {
            test: test.into(),
            transport: transport.into(),
            mode: Mode::Event,
            size_bytes: size,
            metric: metric.into(),
            value,
            time: "t".into(),
        })
    }

    fn shaped(topology: &str, mtu: u32, bucket: Option<u64>) -> PathIdentity {
        PathIdentity {
            kind: Some("testbed".into()),
            topology: Some(topology.into()),
            mtu_bytes: Some(mtu),
            rate_bps: Some(G),
            bucket_bytes: bucket,
            ..PathIdentity::default()
        }
    }

    fn on(mut r: ResultRecord, path: PathIdentity) -> ResultRecord {
        let t = r.transport.clone();
        let framing = Framing::written_by_name(&t, &[]);
        r = r.with_stack(
            Stack::new(&t, Mode::Event, &TransportOptions::default(), path, None)
                .with_framing(framing),
        );
        // As the record's maker leaves it: judged by the model.
        r.physics = assess(&r);
        r
    }

    fn limit(r: &ResultRecord) -> Option<f64> {
        assess(r).and_then(|p| p.payload_limit_gbps)
    }

    #[test]
    fn tcp_carries_1448_of_1514_at_mtu_1500_and_8948_of_9014_at_9000() {
        let r = on(
            record("stream", "tcp", 65536, "bandwidth_gbps", 0.9),
            shaped("switch", 1500, None),
        );
        assert!(near(limit(&r).expect("limit"), 1448.0 / 1514.0));
        let r = on(
            record("stream", "tcp", 65536, "bandwidth_gbps", 0.9),
            shaped("switch", 9000, None),
        );
        assert!(near(limit(&r).expect("limit"), 8948.0 / 9014.0));
        let r = on(
            record("stream", "mptcp", 65536, "bandwidth_gbps", 0.9),
            shaped("switch", 1500, None),
        );
        assert!(near(limit(&r).expect("limit"), 1420.0 / 1514.0));
    }

    #[test]
    fn udp_depends_on_the_message_and_xdp_on_its_own_header() {
        // A datagram that fills a frame: 1448 payload + 24 + 8 + 20 + 14.
        let r = on(
            record("stream", "udp", 1448, "bandwidth_gbps", 0.9),
            shaped("switch", 1500, None),
        );
        assert!(near(limit(&r).expect("limit"), 1448.0 / 1514.0));
        // 64 KiB - 24 - 8 bytes of datagram in 45 fragments of 1480.
        let (p, f) = Framing::Udp
            .payload_and_frame_bytes(1500, 65000)
            .expect("fits");
        assert_eq!((p, f), (65000, 65000 + 32 + 44 * 34));
        let r = on(
            record("stream", "xdp", 65536, "bandwidth_gbps", 0.9),
            shaped("switch", 1500, None),
        );
        assert!(near(limit(&r).expect("limit"), 1464.0 / 1514.0));
        assert_eq!(Framing::Tcp.payload_and_frame_bytes(40, 1), None);
    }

    #[test]
    fn links_and_directions_add_up() {
        let mut r = record("multirail", "tcp", 65536, "bandwidth_gbps", 2.8);
        let link = crate::record::LinkResult {
            local: "a".into(),
            remote: "b".into(),
            bytes: 1,
            bandwidth_gbps: 1.0,
        };
        r = r.with_workload(WorkloadSection {
            clients: 3,
            client_hosts: Some(1),
            flows: Vec::new(),
            hosts_cpu: Vec::new(),
            links: vec![link.clone(), link.clone(), link],
            app: None,
        });
        let r = on(r, shaped("mesh", 1500, None));
        assert!(near(limit(&r).expect("limit"), 3.0 * 1448.0 / 1514.0));

        let r = on(
            record("bibw", "tcp", 65536, "bandwidth_gbps", 1.9),
            shaped("switch", 1500, None),
        );
        assert!(near(limit(&r).expect("limit"), 2.0 * 1448.0 / 1514.0));
        assert!(assess(&r).and_then(|p| p.fault).is_none());

        // Fan-in of three client hosts: the server's one link on a switch,
        // one link per client on a mesh.
        let host = |name: &str, role: &str| HostCpu {
            host: name.into(),
            role: role.into(),
            cpu: crate::cpu::CpuUsage::default(),
            peak_rss_kib: None,
            processes: None,
            facts: None,
        };
        let fan_in = || {
            record("fan-in", "tcp", 65536, "bandwidth_gbps", 0.95).with_workload(WorkloadSection {
                clients: 3,
                client_hosts: Some(3),
                flows: Vec::new(),
                hosts_cpu: vec![
                    host("s", "server"),
                    host("a", "client"),
                    host("b", "client"),
                    host("c", "client"),
                ],
                links: Vec::new(),
                app: None,
            })
        };
        let switch = on(fan_in(), shaped("switch", 1500, None));
        assert!(near(limit(&switch).expect("limit"), 1448.0 / 1514.0));
        let mesh = on(fan_in(), shaped("mesh", 1500, None));
        assert!(near(limit(&mesh).expect("limit"), 3.0 * 1448.0 / 1514.0));
    }

    #[test]
    fn mpi_over_tcp_is_tcp_and_over_shared_memory_has_no_limit() {
        let mpi = |btl: &str, test: &str| {
            let mut stack = Stack::new(
                "mpi",
                Mode::Event,
                &TransportOptions::default(),
                shaped("switch", 1500, None),
                None,
            );
            stack.options = vec![format!("btl={btl}"), "mca_btl=tcp,self".into()];
            stack.framing = Framing::written_by_name("mpi", &stack.options);
            record(test, "mpi", 65536, "bandwidth_gbps", 0.9).with_stack(stack)
        };
        assert!(near(
            limit(&mpi("tcp", "mpi-bw")).expect("limit"),
            1448.0 / 1514.0
        ));
        assert!(near(
            limit(&mpi("tcp", "mpi-bibw")).expect("limit"),
            2.0 * 1448.0 / 1514.0
        ));
        assert_eq!(limit(&mpi("vader", "mpi-bw")), None);
    }

    #[test]
    fn an_unknown_path_has_no_limit() {
        let r = on(
            record("stream", "tcp", 65536, "bandwidth_gbps", 30.0),
            PathIdentity {
                kind: Some("loopback".into()),
                mtu_bytes: Some(65536),
                ..PathIdentity::default()
            },
        );
        let p = assess(&r).expect("a stack");
        assert_eq!(p.payload_limit_gbps, None);
        assert_eq!(p.fault, None);
        // No stack at all: no physics section.
        assert_eq!(
            assess(&record("stream", "tcp", 1, "bandwidth_gbps", 1.0)),
            None
        );
        for t in ["unix", "shm"] {
            let r = on(
                record("stream", t, 65536, "bandwidth_gbps", 30.0),
                shaped("switch", 1500, None),
            );
            assert_eq!(limit(&r), None, "{t}");
        }
        let r = on(
            record("stream", "mptcp", 65536, "bandwidth_gbps", 2.0),
            shaped("mesh", 1500, None),
        );
        assert_eq!(limit(&r), None);
    }

    #[test]
    fn a_bandwidth_past_the_limit_plus_one_percent_or_the_bucket_is_a_fault() {
        let stream = |value: f64, bytes_per_rep: u64, bucket: Option<u64>| {
            let mut r = record("stream", "tcp", 65536, "bandwidth_gbps", value);
            r.stats = Some(RecordStats {
                min: value,
                median: value,
                max: value,
                stdev: 0.0,
                ci95_low: None,
                ci95_high: None,
                cv: 0.0,
                reps: vec![value; 2],
            });
            r.bytes = Some(ByteCounts {
                client_tx: 2 * bytes_per_rep,
                client_rx: 0,
                server_tx: 0,
                server_rx: 2 * bytes_per_rep,
            });
            on(r, shaped("switch", 1500, bucket))
        };
        let l = 1448.0 / 1514.0;
        assert_eq!(
            assess(&stream(l * 1.005, 1 << 30, None)).and_then(|p| p.fault),
            None
        );
        let f = assess(&stream(l * 1.02, 1 << 30, None))
            .and_then(|p| p.fault)
            .expect("fault");
        assert_eq!(f.kind, "above_payload_limit");
        assert!(near(f.limit, l * 1.01) && near(f.limit_gbps, l));
        // 16 MiB with a 500 KB bucket: the window may show the bucket's
        // share above the rate, and no more.
        let bytes = 16 << 20;
        let bucket = 500_000u64;
        let w_at = |gbps: f64| bytes as f64 * 8.0 / (gbps * 1e9);
        let most = |gbps: f64| l + bucket as f64 * l * 8.0 / w_at(gbps) / 1e9;
        let v = 0.98;
        assert!(v < most(v));
        assert_eq!(
            assess(&stream(v, bytes, Some(bucket))).and_then(|p| p.fault),
            None
        );
        let v = 1.1;
        assert!(v > most(v));
        assert!(assess(&stream(v, bytes, Some(bucket)))
            .and_then(|p| p.fault)
            .is_some());
        // A mean within the limit whose one repetition passed it: the
        // repetition is the fault, and the sentence says so.
        let mut r = stream(l * 0.99, 1 << 30, None);
        if let Some(s) = r.stats.as_mut() {
            s.reps = vec![l * 0.96, l * 1.02];
        }
        let f = assess(&r).and_then(|p| p.fault).expect("fault");
        assert_eq!(f.kind, "above_payload_limit");
        assert!(near(f.value, l * 1.02), "{}", f.value);
        assert!(fault_sentence(&r, &f).contains("a repetition"));
        if let Some(s) = r.stats.as_mut() {
            s.reps = vec![l * 0.98, l * 1.0];
        }
        assert_eq!(assess(&r).and_then(|p| p.fault), None);
        // Each repetition over its own window: the first after an idle
        // moment drains the bucket in less time than the record's mean
        // says, and may show more over it (study 000's 1 MiB tcp stream:
        // 7 MiB a repetition, 11.40 Gbit/s against a mean of 9.95 on a
        // 9.93 Gbit/s path). Judged over the mean's window it passed.
        let bytes = 7 << 20;
        let bucket = 1_000_000u64;
        let most = |gbps: f64| {
            let w = bytes as f64 * 8.0 / (gbps * 1e9);
            l + bucket as f64 * l * 8.0 / w / 1e9
        };
        let first = most(1.0) * 0.99;
        let mut r = stream(l * 0.9, bytes, Some(bucket));
        if let Some(s) = r.stats.as_mut() {
            s.reps = vec![first, l * 0.85];
        }
        assert!(first > most(l * 0.9), "past the mean's window");
        assert_eq!(assess(&r).and_then(|p| p.fault), None);
        // Past its own window's bucket, it is a fault, with its own limit.
        if let Some(s) = r.stats.as_mut() {
            s.reps = vec![most(1.2) * 1.01, l * 0.85];
        }
        let f = assess(&r).and_then(|p| p.fault).expect("fault");
        assert!(near(f.value, most(1.2) * 1.01));
        assert!(f.limit > most(1.0) && f.limit < f.value, "{f:?}");
    }

    #[test]
    fn the_carried_rate_leaves_a_share_of_the_machine_and_reads_as_a_rate() {
        // 10 Gbit/s forwarded, 80% of it over three links of tcp at 1500:
        // 2.667 Gbit/s of payload each, 2.79 Gbit/s of line, down to 2.7G.
        assert_eq!(carried_rate_bps(10_000, 3, 1500), 2_700_000_000);
        assert_eq!(carried_rate_bps(10_000, 1, 1500), 8_300_000_000);
        assert_eq!(carried_rate_bps(0, 3, 1500), 0);
        assert_eq!(round_down_two_digits(123_456), 120_000);
        assert_eq!(round_down_two_digits(99), 99);
    }

    #[test]
    fn a_path_past_the_machines_forwarding_says_so() {
        let mut path = shaped("mesh", 1500, Some(131_328));
        path.forwarding_mbps = Some(2_000);
        let one = on(
            record("stream", "tcp", 65536, "bandwidth_gbps", 0.9),
            path.clone(),
        );
        assert_eq!(assess(&one).and_then(|p| p.past_forwarding_gbps), None);
        path.rate_bps = Some(3 * G);
        let three = on(
            record("stream", "tcp", 65536, "bandwidth_gbps", 0.9),
            path.clone(),
        );
        let p = assess(&three).expect("physics");
        assert_eq!(p.past_forwarding_gbps, Some(2.0));
        let s = past_forwarding_sentence(&three, p.payload_limit_gbps.expect("limit"), 2.0);
        assert!(
            s.contains("2.869 Gbit/s at once") && s.contains("2.0 Gbit/s"),
            "{s}"
        );
        path.forwarding_mbps = None;
        let unknown = on(record("stream", "tcp", 65536, "bandwidth_gbps", 0.9), path);
        assert_eq!(assess(&unknown).and_then(|p| p.past_forwarding_gbps), None);
    }

    #[test]
    fn only_a_bandwidth_well_below_its_limit_on_a_machine_full_of_forwarding_is_emulator_bound() {
        let load = |busy: f64, softirq: f64, testbed: bool| CpuLoad {
            hosts: vec!["h1".into(), "h2".into()],
            cores: 2,
            busy_percent: busy,
            own_percent: 50.0,
            softirq_percent: Some(softirq),
            other_percent: (busy - 50.0 - softirq).max(0.0),
            testbed,
            bound_by: None,
        };
        let stream = |v: f64| {
            on(
                record("stream", "tcp", 65536, "bandwidth_gbps", v),
                shaped("mesh", 1500, None),
            )
        };
        let l = 1448.0 / 1514.0;
        let b = emulator_bound(&stream(0.5), &load(99.0, 45.0, true)).expect("bound");
        assert!(near(b.limit_gbps, l) && b.value == 0.5 && b.forwarding_percent == 45.0);
        assert!(
            bound_sentence(&stream(0.5), &b).starts_with(
                "stream over tcp, 65536 B: 0.500 Gbit/s is 52% of the 0.956 Gbit/s its path can \
                 carry while the testbed's forwarding used 45% of the CPUs"
            ),
            "{}",
            bound_sentence(&stream(0.5), &b)
        );
        // Near its limit, on CPUs to spare, off a testbed, with forwarding
        // under the bar, or past the limit (a fault): not the emulator.
        assert_eq!(emulator_bound(&stream(0.9), &load(99.0, 45.0, true)), None);
        assert_eq!(emulator_bound(&stream(0.5), &load(80.0, 30.0, true)), None);
        assert_eq!(emulator_bound(&stream(0.5), &load(99.0, 45.0, false)), None);
        assert_eq!(emulator_bound(&stream(0.5), &load(99.0, 10.0, true)), None);
        assert_eq!(emulator_bound(&stream(2.0), &load(99.0, 45.0, true)), None);
        // A latency has no such verdict; a path without a limit neither.
        let ping = on(
            record("pingpong", "tcp", 64, "latency_us", 50.0),
            shaped("mesh", 1500, None),
        );
        assert_eq!(emulator_bound(&ping, &load(99.0, 45.0, true)), None);
        let unix = on(
            record("stream", "unix", 65536, "bandwidth_gbps", 0.5),
            shaped("mesh", 1500, None),
        );
        assert_eq!(emulator_bound(&unix, &load(99.0, 45.0, true)), None);
    }

    #[test]
    fn only_a_stream_well_below_its_limit_on_idle_cpus_and_quiet_ends_is_shaper_held() {
        let load = |busy: f64| CpuLoad {
            hosts: vec!["h1".into(), "h2".into()],
            cores: 2,
            busy_percent: busy,
            own_percent: 25.0,
            softirq_percent: Some(5.0),
            other_percent: 0.0,
            testbed: true,
            bound_by: None,
        };
        let ends = |local: f64, remote: f64| crate::record::CpuPair {
            local: crate::cpu::CpuUsage {
                process_percent: local,
                ..crate::cpu::CpuUsage::default()
            },
            remote: crate::cpu::CpuUsage {
                process_percent: remote,
                ..crate::cpu::CpuUsage::default()
            },
        };
        let l = 1448.0 / 1514.0;
        let point = |test: &str, size: u64, value: f64, path: PathIdentity| {
            let mut r = record(test, "tcp", size, "bandwidth_gbps", value);
            r.cpu = Some(ends(30.0, 20.0));
            on(r, path)
        };
        let stream =
            |value: f64| point("stream", 65536, value, shaped("switch", 1500, Some(65_664)));
        let r = stream(0.7 * l);
        let h = shaper_held(&r, &load(15.0)).expect("held");
        assert!(near(h.limit_gbps, l) && near(h.value, 0.7 * l));
        assert_eq!((h.busy_percent, h.bucket_bytes), (15.0, Some(65_664)));
        assert_eq!(
            held_sentence(&r, &h),
            format!(
                "stream over tcp, 65536 B: 0.669 Gbit/s is 70% of the 0.956 Gbit/s its path can \
                 carry while the CPUs were 15% busy: the testbed's shaper (bucket 65664 B), not \
                 the stack, held this point; {SHAPER_REMEDY}"
            )
        );
        // Without the bucket in the record the sentence names none.
        let r = point("stream", 65536, 0.7 * l, shaped("switch", 1500, None));
        let h = shaper_held(&r, &load(15.0)).expect("held");
        assert!(held_sentence(&r, &h).contains("the testbed's shaper, not the stack"));
        // Every test that keeps its link busy; MPI's records as `stream`.
        for test in ["bibw", "multistream", "fanin", "fanout"] {
            let r = point(test, 65536, 0.5 * l, shaped("switch", 1500, None));
            assert!(shaper_held(&r, &load(15.0)).is_some(), "{test}");
        }

        // A busy machine, a busy end, near the limit: not the shaper.
        assert_eq!(shaper_held(&stream(0.7 * l), &load(60.0)), None);
        let mut r = stream(0.7 * l);
        r.cpu = Some(ends(30.0, 95.0));
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        assert_eq!(shaper_held(&stream(0.95 * l), &load(15.0)), None);
        // A workload host's agent busy on its own.
        let mut r = point("multistream", 65536, 0.5 * l, shaped("switch", 1500, None));
        r.cpu = None;
        let host = |name: &str, role: &str, own: f64| HostCpu {
            host: name.into(),
            role: role.into(),
            cpu: crate::cpu::CpuUsage {
                process_percent: own,
                ..crate::cpu::CpuUsage::default()
            },
            peak_rss_kib: None,
            processes: None,
            facts: None,
        };
        let mut r = r.with_workload(WorkloadSection {
            clients: 4,
            client_hosts: Some(1),
            flows: Vec::new(),
            hosts_cpu: vec![host("h1", "server", 40.0), host("h2", "client", 85.0)],
            links: Vec::new(),
            app: None,
        });
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        if let Some(g) = r.workload.as_mut() {
            g.hosts_cpu[1].cpu.process_percent = 35.0;
        }
        assert!(shaper_held(&r, &load(15.0)).is_some());
        // No reading of the ends: no verdict.
        let mut r = stream(0.7 * l);
        r.cpu = None;
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        // Off a testbed, unshaped, or with delay, loss or a socket buffer
        // set, something else may hold a stream.
        let off = CpuLoad {
            testbed: false,
            ..load(15.0)
        };
        assert_eq!(shaper_held(&stream(0.7 * l), &off), None);
        let unshaped = PathIdentity {
            rate_bps: None,
            ..shaped("switch", 1500, None)
        };
        let r = point("stream", 65536, 0.7 * l, unshaped);
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        let delayed = PathIdentity {
            delay_us: Some(1000),
            ..shaped("switch", 1500, None)
        };
        let r = point("stream", 65536, 0.7 * l, delayed);
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        let lossy = PathIdentity {
            loss_ppm: Some(1000),
            ..shaped("switch", 1500, None)
        };
        let r = point("stream", 65536, 0.7 * l, lossy);
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        let mut r = record("stream", "tcp", 65536, "bandwidth_gbps", 0.7 * l);
        r.cpu = Some(ends(30.0, 20.0));
        let mut r = r.with_stack(
            Stack::new(
                "tcp",
                Mode::Event,
                &TransportOptions {
                    rcvbuf_bytes: Some(65_536),
                    ..TransportOptions::default()
                },
                shaped("switch", 1500, None),
                None,
            )
            .with_framing(Some(Framing::Tcp)),
        );
        r.physics = assess(&r);
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        // A ping-pong's bandwidth, a sweep's, a latency: bound by the
        // round trip.
        let r = point(
            "bibw-pingpong",
            65536,
            0.5 * l,
            shaped("switch", 1500, None),
        );
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        let mut r = record("pingpong", "tcp", 65536, "latency_us", 900.0);
        r.cpu = Some(ends(30.0, 20.0));
        let r = on(r, shaped("switch", 1500, None));
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        for test in ["sweep", "stream"] {
            let mut r = record(test, "tcp", 65536, "bandwidth_gbps", 0.5 * l);
            r.cpu = Some(ends(30.0, 20.0));
            r = r.with_sweep(crate::record::SweepSection {
                sweep_kind: "stream".into(),
                block_time_us: 65536.0 * 8.0 / (0.5 * l * 1e3),
                dropout: None,
                unstable: None,
            });
            let r = on(r, shaped("switch", 1500, None));
            assert_eq!(shaper_held(&r, &load(15.0)), None, "{test}");
        }
        // Messages smaller than a frame: bound by their per-message cost.
        let r = point("stream", 1024, 0.5 * l, shaped("switch", 1500, None));
        assert_eq!(shaper_held(&r, &load(15.0)), None);
        // A fault is no result to judge.
        let mut r = stream(0.7 * l);
        if let Some(p) = r.physics.as_mut() {
            p.fault = Some(Fault {
                kind: "above_payload_limit".into(),
                limit: l * 1.01,
                limit_gbps: l,
                value: l * 1.2,
            });
        }
        assert_eq!(shaper_held(&r, &load(15.0)), None);
    }

    #[test]
    fn a_message_faster_than_its_frames_past_the_bucket_is_a_fault() {
        let mib = 1 << 20;
        let ping = |us: f64, bucket: Option<u64>| {
            on(
                record("pingpong", "tcp", mib, "latency_us", us),
                shaped("switch", 1500, bucket),
            )
        };
        // 1 MiB at 1 Gbit/s, a 64 KiB bucket: (1 MiB * 1514/1448 - 64 KiB)
        // * 8 / 1e9 s.
        let least = (mib as f64 * 1514.0 / 1448.0 - 65536.0) * 8.0 / 1e3;
        assert!((least - 8246.0).abs() < 1.0, "{least}");
        assert_eq!(
            assess(&ping(8400.0, Some(65536))).and_then(|p| p.fault),
            None
        );
        let f = assess(&ping(5205.0, Some(65536)))
            .and_then(|p| p.fault)
            .expect("fault");
        assert_eq!(f.kind, "faster_than_wire");
        assert!(near(f.limit, least));
        // One repetition faster than the wire, the mean not.
        let mut r = ping(8400.0, Some(65536));
        r.stats = Some(RecordStats {
            min: 5205.0,
            median: 8400.0,
            max: 11595.0,
            stdev: 0.0,
            ci95_low: None,
            ci95_high: None,
            cv: 0.0,
            reps: vec![5205.0, 11595.0],
        });
        let f = assess(&r).and_then(|p| p.fault).expect("fault");
        assert!(near(f.value, 5205.0), "{}", f.value);
        // Without the bucket the least time is not known: no verdict.
        assert_eq!(assess(&ping(5205.0, None)).and_then(|p| p.fault), None);
        // A sweep block's time is its window.
        let mut r = record("sweep", "tcp", mib, "bandwidth_gbps", 1.9);
        r = r.with_sweep(crate::record::SweepSection {
            sweep_kind: "pingpong".into(),
            block_time_us: mib as f64 * 8.0 / 1.9e3,
            dropout: None,
            unstable: None,
        });
        let r = on(r, shaped("switch", 1500, Some(65536)));
        assert!(assess(&r).and_then(|p| p.fault).is_some());
    }
}
