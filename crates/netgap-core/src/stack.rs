//! Stack identity: what one configuration of a test ran over, so that two
//! records of the same test and size made over different stacks are never
//! merged, and each series can be labelled by what sets it apart ("tcp, MTU
//! 9000, offload off").
//!
//! A [`Stack`] is the transport, its completion mode, the transport options
//! that differ from the defaults, the path (kind, topology, MTU, offloads,
//! link rate, queueing, delay, loss) and a user label. New records carry it
//! in their `stack` field; for records made before it existed, or imported
//! from a peer tool, [`Stack::of_record`] (beside the record, in
//! [`crate::record`]) derives it from the fields they do
//! have, so old results files group the same way.

use crate::framing::Framing;
use crate::host::{HostFacts, Offloads};
use crate::spec::{Mode, TransportOptions};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// What a record measured over. Two records belong to the same series, and
/// may be compared point by point, exactly when their stacks are equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "StackFields")]
pub struct Stack {
    /// Transport name (`tcp`, `unix`, ...), or what a peer tool measured.
    pub transport: String,
    /// Completion mode.
    pub mode: Mode,
    /// Transport options that differ from the defaults, as `name` or
    /// `name=value`, sorted (`congestion=bbr`, `sndbuf_bytes=524288`).
    #[serde(default)]
    pub options: Vec<String>,
    /// The path between the two ends.
    #[serde(default)]
    pub path: PathIdentity,
    /// The user's `--label`, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The peer tool that measured the record, for imported records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// How the stack puts its payload into frames on a link, as its
    /// transport declares; `null` for a stack with no link (unix, shm) or
    /// whose framing is not known. Always written, so that a record without
    /// the field is known to come from before it existed.
    pub framing: Option<Framing>,
}

/// A stack as a results file holds it: [`Stack`]'s fields, with the
/// framing absent in records written before stacks carried it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StackFields {
    transport: String,
    mode: Mode,
    #[serde(default)]
    options: Vec<String>,
    #[serde(default)]
    path: PathIdentity,
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    /// `None` when the field is absent; `Some(None)` for `null`.
    #[serde(default, deserialize_with = "present")]
    framing: Option<Option<Framing>>,
}

/// A field that is present, `null` included.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

impl From<StackFields> for Stack {
    fn from(f: StackFields) -> Stack {
        let framing = f
            .framing
            .unwrap_or_else(|| Framing::written_by_name(&f.transport, &f.options));
        Stack {
            transport: f.transport,
            mode: f.mode,
            options: f.options,
            path: f.path,
            label: f.label,
            tool: f.tool,
            framing,
        }
    }
}

/// The path a record's traffic took, as far as it sets one stack apart from
/// another. Unknown facts are `None` and compare equal only to `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathIdentity {
    /// `loopback`, `testbed` (netgap's namespace testbed) or `network`;
    /// `None` when unknown (imported records).
    #[serde(default)]
    pub kind: Option<String>,
    /// The testbed's topology (`switch`, `mesh`), when on a testbed.
    #[serde(default)]
    pub topology: Option<String>,
    /// MTU of the data interface in bytes; the smaller of the two ends'
    /// when they differ.
    #[serde(default)]
    pub mtu_bytes: Option<u32>,
    /// Segmentation, receive and checksum offloads of the data interfaces:
    /// `on` (all on at both ends), `off` (all off), or the features on at
    /// both ends (`gso,gro`) when mixed.
    #[serde(default)]
    pub offload: Option<String>,
    /// Link rate limit in bit/s (the testbed's TBF), when one is set.
    #[serde(default)]
    pub rate_bps: Option<u64>,
    /// Added one-way delay in microseconds (netem), when set.
    #[serde(default)]
    pub delay_us: Option<u64>,
    /// Added loss in parts per million, when set.
    #[serde(default)]
    pub loss_ppm: Option<u32>,
    /// What drops the added loss: `netem` or `nftables` (where the kernel
    /// has no netem); `None` when no loss is added or it is unknown.
    #[serde(default)]
    pub loss_by: Option<String>,
    /// The rate limiter's bucket in bytes: what may pass at memory speed
    /// after an idle moment; `None` when no rate is set or it is unknown.
    #[serde(default)]
    pub bucket_bytes: Option<u64>,
    /// Queueing discipline of the data interface, when known.
    #[serde(default)]
    pub qdisc: Option<String>,
    /// What the machine under a testbed forwards through its shapers, in
    /// Mbit/s of payload (calibrated by `netgap testbed up`): links whose
    /// limits sum past it cannot all be at their rate at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding_mbps: Option<u64>,
    /// The link rate a study asked for, in bit/s, when the links ran at
    /// `rate_bps`, a lower rate the machine carries, because the figure's
    /// links summed past what it forwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_scaled_from_bps: Option<u64>,
}

impl PathIdentity {
    /// The path facts two ends report: kind from the interface (`lo` is
    /// loopback), the smaller MTU, and the offloads both ends have on.
    /// Conditions netgap set itself (topology, rate, delay, loss) are the
    /// caller's to add.
    pub fn from_ends(local: Option<&HostFacts>, remote: Option<&HostFacts>) -> PathIdentity {
        let ends: Vec<&HostFacts> = [local, remote].into_iter().flatten().collect();
        let kind = ends
            .iter()
            .find_map(|h| h.interface.as_deref())
            .map(|i| if i == "lo" { "loopback" } else { "network" }.to_string());
        let mtu_bytes = ends.iter().filter_map(|h| h.mtu_bytes).min();
        let offloads: Vec<&Offloads> = ends.iter().filter_map(|h| h.offloads.as_ref()).collect();
        let offload = if offloads.is_empty() {
            None
        } else {
            Some(Offloads::summary(&offloads))
        };
        let qdisc = ends.iter().find_map(|h| h.qdisc.clone());
        PathIdentity {
            kind,
            mtu_bytes,
            offload,
            qdisc,
            ..PathIdentity::default()
        }
    }
}

/// A transport option that differs from its default, as a stack names it.
pub(crate) fn option_entries(o: &TransportOptions) -> Vec<String> {
    let d = TransportOptions::default();
    let mut v = Vec::new();
    let mut flag = |name: &str, on: bool, default: bool| {
        if on != default {
            v.push(if on {
                name.to_string()
            } else {
                format!("no_{name}")
            });
        }
    };
    flag("nodelay", o.nodelay, d.nodelay);
    flag("zerocopy", o.zerocopy, d.zerocopy);
    flag("quickack", o.quickack, d.quickack);
    flag("cork", o.cork, d.cork);
    flag("sqpoll", o.sqpoll, d.sqpoll);
    flag("preload_relayed", o.preload_relayed, d.preload_relayed);
    if let Some(b) = o.sndbuf_bytes {
        v.push(format!("sndbuf_bytes={b}"));
    }
    if let Some(b) = o.rcvbuf_bytes {
        v.push(format!("rcvbuf_bytes={b}"));
    }
    if let Some(us) = o.busy_poll_us {
        v.push(format!("busy_poll_us={us}"));
    }
    if let Some(c) = &o.congestion {
        v.push(format!("congestion={c}"));
    }
    if let Some(a) = o.buffer_align_bytes {
        v.push(format!("buffer_align_bytes={a}"));
    }
    if o.buffer_offset_bytes != 0 {
        v.push(format!("buffer_offset_bytes={}", o.buffer_offset_bytes));
    }
    v.sort();
    v
}

impl Stack {
    /// The stack of a point measured over `transport` in `mode` with
    /// `options`, on `path`, labelled `label`.
    pub fn new(
        transport: &str,
        mode: Mode,
        options: &TransportOptions,
        path: PathIdentity,
        label: Option<String>,
    ) -> Stack {
        Stack {
            transport: transport.to_string(),
            mode,
            options: option_entries(options),
            path,
            label,
            tool: None,
            framing: None,
        }
    }

    /// The stack with the framing its transport declares.
    pub fn with_framing(mut self, framing: Option<Framing>) -> Stack {
        self.framing = framing;
        self
    }

    /// The stack with `choices` (`name=value`) the transport made in setting
    /// up the data path among its options, kept sorted: they set stacks
    /// apart as options do.
    pub fn with_choices(mut self, choices: &[String]) -> Stack {
        self.options.extend(choices.iter().cloned());
        self.options.sort();
        self.options.dedup();
        self
    }

    /// The stack in full, as one short line: `tcp/event, MTU 9000, offload
    /// off, 1 Gbit/s, sndbuf_bytes=524288, [label]`.
    pub fn describe(&self) -> String {
        self.describe_fields(&Field::ALL)
    }

    fn describe_fields(&self, fields: &[Field]) -> String {
        let mut parts: Vec<String> = Vec::new();
        for f in fields {
            if let Some(p) = self.part(*f) {
                parts.push(p);
            }
        }
        parts.join(", ")
    }

    /// One field of the description, if the stack has it.
    fn part(&self, f: Field) -> Option<String> {
        let p = &self.path;
        match f {
            Field::Transport => Some(match &self.tool {
                Some(t) => format!("{} [{t}]", self.transport),
                None => self.transport.clone(),
            }),
            Field::Mode => Some(self.mode.as_str().to_string()),
            Field::Kind => p.kind.clone(),
            Field::Topology => p.topology.clone(),
            Field::Mtu => p.mtu_bytes.map(|m| format!("MTU {m}")),
            Field::Offload => p.offload.as_ref().map(|o| format!("offload {o}")),
            Field::Rate => p.rate_bps.map(format_rate),
            Field::Delay => p.delay_us.map(|d| format!("delay {}", format_delay(d))),
            Field::Loss => p
                .loss_ppm
                .map(|l| format!("loss {}%", trim_float(f64::from(l) / 10_000.0))),
            Field::Qdisc => p.qdisc.as_ref().map(|q| format!("qdisc {q}")),
            Field::Options => (!self.options.is_empty()).then(|| self.options.join(" ")),
            Field::Label => self.label.as_ref().map(|l| format!("[{l}]")),
        }
    }

    /// Labels for a set of stacks by what sets each apart from the others:
    /// the transport always, then only the fields whose values differ
    /// within the set ("tcp, MTU 9000, offload off" beside "tcp, MTU 1500,
    /// offload off"). Stacks that differ in nothing shown get the full
    /// description, so distinct stacks never share a label.
    pub fn distinguishing_labels(stacks: &[&Stack]) -> Vec<String> {
        let varying: Vec<Field> = Field::ALL
            .iter()
            .copied()
            .filter(|&f| {
                f == Field::Transport || {
                    let mut values = stacks.iter().map(|s| s.part(f));
                    let first = values.next().flatten();
                    values.any(|v| v != first)
                }
            })
            .collect();
        let labels: Vec<String> = stacks.iter().map(|s| s.describe_fields(&varying)).collect();
        // Distinct stacks whose shown fields collide (a field the set does
        // not vary in, but that still tells them apart) fall back to the
        // whole description.
        labels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let clash = labels
                    .iter()
                    .enumerate()
                    .any(|(j, m)| j != i && m == l && stacks[j] != stacks[i]);
                if clash {
                    stacks[i].describe()
                } else {
                    l.clone()
                }
            })
            .collect()
    }
}

/// The fields of a stack's description, in the order they are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Transport,
    Mode,
    Kind,
    Topology,
    Mtu,
    Offload,
    Rate,
    Delay,
    Loss,
    Qdisc,
    Options,
    Label,
}

impl Field {
    const ALL: [Field; 12] = [
        Field::Transport,
        Field::Mode,
        Field::Kind,
        Field::Topology,
        Field::Mtu,
        Field::Offload,
        Field::Rate,
        Field::Delay,
        Field::Loss,
        Field::Qdisc,
        Field::Options,
        Field::Label,
    ];
}

/// A rate in bit/s with the largest unit that keeps it whole or short.
fn format_rate(bps: u64) -> String {
    let v = bps as f64;
    let (x, unit) = if v >= 1e9 {
        (v / 1e9, "Gbit/s")
    } else if v >= 1e6 {
        (v / 1e6, "Mbit/s")
    } else {
        (v / 1e3, "kbit/s")
    };
    format!("{} {unit}", trim_float(x))
}

/// A delay in µs as ms when it is at least a millisecond.
fn format_delay(us: u64) -> String {
    if us >= 1000 {
        format!("{} ms", trim_float(us as f64 / 1000.0))
    } else {
        format!("{us} us")
    }
}

/// A number with at most three decimals and no trailing zeros.
fn trim_float(x: f64) -> String {
    let mut s = String::new();
    let _ = write!(s, "{x:.3}");
    let t = s.trim_end_matches('0').trim_end_matches('.');
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ResultRecord;

    #[test]
    fn a_stack_carries_its_framing_and_an_older_one_is_read_by_its_name() {
        let read = |json: &str| -> Stack { serde_json::from_str(json).expect("stack") };
        // Declared: whatever the transport is called.
        let s = read(r#"{"transport":"mine","mode":"event","framing":"xdp"}"#);
        assert_eq!(s.framing, Some(Framing::Xdp));
        // Declared as none: no name brings one back.
        let s = read(r#"{"transport":"tcp","mode":"event","framing":null}"#);
        assert_eq!(s.framing, None);
        // Written before stacks carried it: as that netgap read the name.
        let s = read(r#"{"transport":"mptcp","mode":"event"}"#);
        assert_eq!(s.framing, Some(Framing::Mptcp));
        let s = read(r#"{"transport":"unix","mode":"event"}"#);
        assert_eq!(s.framing, None);
        // Written out, it reads back the same, `null` included.
        for framing in [None, Some(Framing::Udp)] {
            let s = Stack::new(
                "udp",
                Mode::Event,
                &TransportOptions::default(),
                path(1500, "on"),
                None,
            )
            .with_framing(framing);
            let json = serde_json::to_string(&s).expect("encoded");
            assert!(json.contains("\"framing\":"), "{json}");
            assert_eq!(read(&json), s);
        }
        // A record of a stack that is not netgap's fails as before.
        assert!(
            serde_json::from_str::<Stack>(r#"{"transport":"tcp","mode":"event","x":1}"#).is_err()
        );
    }

    fn path(mtu: u32, offload: &str) -> PathIdentity {
        PathIdentity {
            kind: Some("testbed".into()),
            topology: Some("switch".into()),
            mtu_bytes: Some(mtu),
            offload: Some(offload.into()),
            ..PathIdentity::default()
        }
    }

    fn tcp(p: PathIdentity) -> Stack {
        Stack::new("tcp", Mode::Event, &TransportOptions::default(), p, None)
    }

    #[test]
    fn labels_name_only_what_sets_stacks_apart() {
        let a = tcp(path(1500, "on"));
        let b = tcp(path(9000, "on"));
        let c = tcp(path(1500, "off"));
        let d = tcp(path(9000, "off"));
        let labels = Stack::distinguishing_labels(&[&a, &b, &c, &d]);
        assert_eq!(
            labels,
            [
                "tcp, MTU 1500, offload on",
                "tcp, MTU 9000, offload on",
                "tcp, MTU 1500, offload off",
                "tcp, MTU 9000, offload off"
            ]
        );
        let labels = Stack::distinguishing_labels(&[&a, &b]);
        assert_eq!(labels, ["tcp, MTU 1500", "tcp, MTU 9000"]);
        // One stack alone is named by its transport.
        assert_eq!(Stack::distinguishing_labels(&[&a]), ["tcp"]);
    }

    #[test]
    fn path_choices_join_the_options_sorted_and_set_stacks_apart() {
        let o = TransportOptions {
            nodelay: false,
            ..TransportOptions::default()
        };
        let base = || Stack::new("xdp", Mode::Event, &o, PathIdentity::default(), None);
        let native = base().with_choices(&["xdp_attach=native".into()]);
        let generic = base().with_choices(&["xdp_attach=generic".into()]);
        assert_eq!(native.options, ["no_nodelay", "xdp_attach=native"]);
        assert_ne!(native, generic);
        // A choice given twice is one option.
        let twice = base().with_choices(&["xdp_attach=native".into(), "xdp_attach=native".into()]);
        assert_eq!(twice, native);
        assert_eq!(base().with_choices(&[]), base());
    }

    #[test]
    fn options_rates_delay_loss_and_labels_are_described() {
        let o = TransportOptions {
            sndbuf_bytes: Some(524_288),
            nodelay: false,
            ..TransportOptions::default()
        };
        let p = PathIdentity {
            rate_bps: Some(1_000_000_000),
            delay_us: Some(2500),
            loss_ppm: Some(1000),
            ..PathIdentity::default()
        };
        let s = Stack::new("tcp", Mode::Poll, &o, p, Some("run A".into()));
        assert_eq!(
            s.describe(),
            "tcp, poll, 1 Gbit/s, delay 2.5 ms, loss 0.1%, no_nodelay sndbuf_bytes=524288, [run A]"
        );
    }

    #[test]
    fn a_buffer_layout_other_than_the_default_sets_stacks_apart() {
        let default = Stack::new(
            "tcp",
            Mode::Event,
            &TransportOptions::default(),
            path(1500, "on"),
            None,
        );
        assert!(default.options.is_empty());
        let o = TransportOptions {
            buffer_offset_bytes: 16,
            ..TransportOptions::default()
        };
        let offset = Stack::new("tcp", Mode::Event, &o, path(1500, "on"), None);
        assert_eq!(offset.options, ["buffer_offset_bytes=16"]);
        let o = TransportOptions {
            buffer_align_bytes: Some(64),
            buffer_offset_bytes: 8,
            ..TransportOptions::default()
        };
        let both = Stack::new("tcp", Mode::Event, &o, path(1500, "on"), None);
        assert_eq!(
            both.options,
            ["buffer_align_bytes=64", "buffer_offset_bytes=8"]
        );
        assert_ne!(default, offset);
        let json = serde_json::to_value(TransportOptions::default()).unwrap();
        assert!(
            json.get("buffer_align_bytes").is_none() && json.get("buffer_offset_bytes").is_none()
        );
    }

    #[test]
    fn wrapped_programs_kept_on_the_relays_are_a_stack_of_their_own() {
        let direct = Stack::new(
            "xdp",
            Mode::Event,
            &TransportOptions::default(),
            path(1500, "on"),
            None,
        );
        let o = TransportOptions {
            preload_relayed: true,
            ..TransportOptions::default()
        };
        let relayed = Stack::new("xdp", Mode::Event, &o, path(1500, "on"), None);
        assert_eq!(relayed.options, ["preload_relayed"]);
        assert_ne!(relayed, direct);
        assert_eq!(
            Stack::distinguishing_labels(&[&direct, &relayed]),
            ["xdp", "xdp, preload_relayed"]
        );
        // The default is left out; the relays say so, and read back.
        let json = serde_json::to_value(TransportOptions::default()).unwrap();
        assert!(json.get("preload_relayed").is_none());
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(json["preload_relayed"], true);
        let back: TransportOptions = serde_json::from_value(json).unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn stacks_of_old_records_come_from_their_host_facts() {
        let record = |mtu: u32| -> ResultRecord {
            serde_json::from_value(serde_json::json!({
                "test": "stream", "transport": "tcp", "mode": "event", "size_bytes": 65536,
                "metric": "bandwidth_gbps", "value": 1.0, "warnings": [], "version": "0",
                "time": "t",
                "host": {"hostname": "a", "kernel": "k", "cpu_model": "c", "cores": 2,
                         "interface": "eth0", "mtu_bytes": mtu, "sysctls": {},
                         "netgap_version": "0"},
            }))
            .expect("record")
        };
        let a = Stack::of_record(&record(1500));
        let b = Stack::of_record(&record(9000));
        assert_ne!(a, b);
        assert_eq!(a.path.kind.as_deref(), Some("network"));
        assert_eq!(a.path.mtu_bytes, Some(1500));
    }
}
