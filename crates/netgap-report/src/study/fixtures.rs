//! Records and a study file the study report's unit tests share: study
//! 009's figure 1, `stream` over tcp by offload.

use super::figure_label;
use netgap_core::record::ResultRecord;

use netgap_core::record::{
    Dropout, LinkResult, RecordHead, RecordStats, SweepSection, WorkloadSection,
};
use netgap_core::spec::{Mode, TransportOptions};
use netgap_core::stack::{PathIdentity, Stack};

/// A `stream` record over tcp of study 009's figure `fig` at `size`
/// bytes: its headline `v` Gbit/s with a 95% interval of `half` of it
/// either side, on a path that names nothing but what `path` sets.
pub(crate) fn record(fig: &str, path: PathIdentity, size: u64, v: f64, half: f64) -> ResultRecord {
    let mut r = ResultRecord::new(RecordHead {
        test: "stream".into(),
        transport: "tcp".into(),
        mode: Mode::Event,
        size_bytes: size,
        metric: "bandwidth_gbps".into(),
        value: v,
        time: "2026-01-01T00:00:00Z".into(),
    });
    r.stats = Some(RecordStats {
        min: v,
        median: v,
        max: v,
        stdev: 0.0,
        ci95_low: Some(v * (1.0 - half)),
        ci95_high: Some(v * (1.0 + half)),
        cv: 0.0,
        reps: Vec::new(),
    });
    let label = Some(figure_label("009", fig));
    r.with_stack(Stack::new(
        "tcp",
        Mode::Event,
        &TransportOptions::default(),
        path,
        label,
    ))
}

/// A path at MTU 1500 with offload `offload`.
pub(crate) fn offloaded(offload: &str) -> PathIdentity {
    PathIdentity {
        mtu_bytes: Some(1500),
        offload: Some(offload.into()),
        ..PathIdentity::default()
    }
}

pub(crate) fn rec(fig: &str, offload: &str, size: u64, v: f64) -> ResultRecord {
    rec_ci(fig, offload, size, v, 0.05)
}

/// A record whose 95% interval is `half` of its value either side.
pub(crate) fn rec_ci(fig: &str, offload: &str, size: u64, v: f64, half: f64) -> ResultRecord {
    record(fig, offloaded(offload), size, v, half)
}

/// The offload of `r`'s path.
pub(crate) fn offload_of(r: &ResultRecord) -> Option<&str> {
    r.stack.as_ref().and_then(|s| s.path.offload.as_deref())
}

/// `r` as a workload point of `clients` (streams, links), with no
/// flows.
pub(crate) fn workload(r: &mut ResultRecord, clients: u32) -> &mut WorkloadSection {
    r.workload.get_or_insert_with(|| WorkloadSection {
        clients,
        client_hosts: None,
        flows: Vec::new(),
        hosts_cpu: Vec::new(),
        links: Vec::new(),
        app: None,
    })
}

/// One link of a multirail point carrying `gbps`.
pub(crate) fn link(gbps: f64) -> LinkResult {
    LinkResult {
        local: "10.0.0.2".into(),
        remote: "10.0.0.1".into(),
        bytes: 1,
        bandwidth_gbps: gbps,
    }
}

/// A sweep section for `r`, its block time from its size and
/// headline.
pub(crate) fn sweep_of(r: &ResultRecord, dropout: Option<Dropout>) -> SweepSection {
    SweepSection {
        sweep_kind: "stream".into(),
        block_time_us: r.size_bytes as f64 * 8.0 / (r.value * 1e3),
        dropout,
        unstable: None,
    }
}

pub(crate) const STUDY: &str = r#"
id = "009"
[citation]
authors = ["A"]
title = "T"
venue = "V"
[method]
reps = 10
drop_each_side = 1
text = "m"
[testbed]
hosts = 2
topology = "switch"
text = "t"
[[figure]]
id = "1"
caption = "Bandwidth"
tests = ["stream"]
x = "size"
y = "bandwidth_gbps"
series = ["offload"]
hosts = 2
paper = "p"
here = "h"
[[claim]]
figure = "1"
text = "offload raises bandwidth"
published = "1.52"
where = "Fig 1"
kind = "ratio"
a = { offload = "on" }
b = { offload = "off" }
at = "peak"
above = 1.0
[[claim]]
figure = "1"
text = "grows"
published = "-"
where = "Fig 1"
kind = "trend"
series = { offload = "off" }
above = 1.0
[[claim]]
figure = "1"
text = "flat"
published = "-"
where = "Fig 1"
kind = "trend"
series = { offload = "on" }
tolerance_pct = 20.0
[[claim]]
figure = "1"
text = "offload raises bandwidth by 52%"
published = "7.6 / 5 Gbps = 1.52"
where = "Fig 1"
kind = "ratio"
a = { offload = "on" }
b = { offload = "off" }
at = "peak"
above = 1.0
published_value = 1.52
size_tolerance_pct = 17
size_why = "half to one and a half times the paper's gain"
"#;
