//! What a figure reads on y and a claim reads its series in, and how each
//! is read from a record.

use crate::record::ResultRecord;

/// What a figure reads on y, or a claim reads its series in, as the study
/// file names it: parsed when the study loads (a name that is none of
/// these is refused), and read from a record with [`Quantity::of`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quantity {
    /// `value`: each record's headline, whatever its metric (LogP's
    /// parameters, told apart by the `metric` series).
    Headline,
    /// A metric by its key, the unit in the name (`latency_us`,
    /// `connect_time_us`): the headline of a record whose metric it is,
    /// else the application's figure of that name (`app.metrics`).
    Metric(String),
    /// `block_time_us`: a sweep point's block time, its interval the
    /// throughput's turned over.
    BlockTime,
    /// `dropouts`: 1 for a point flagged as a dropout, else 0.
    Dropouts,
    /// `cpu.END.SHARE`: the CPU of one end, percent
    /// (`cpu.local.process_percent`).
    Cpu(CpuEnd, CpuShare),
}

/// One end of a point-to-point record's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuEnd {
    /// The coordinator's end (`local`).
    Local,
    /// The agent's end (`remote`).
    Remote,
}

/// A share of one end's CPU, percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuShare {
    /// The netgap process's, of one core (`process_percent`).
    Process,
    /// The host's busy share of all its CPUs (`system_busy_percent`).
    SystemBusy,
}

/// Units a metric's key may end in.
pub(crate) const METRIC_UNITS: [&str; 7] =
    ["_us", "_ms", "_ns", "_gbps", "_pct", "_percent", "_per_s"];

impl Quantity {
    /// The quantity the study file names `name`; `Err` says what it takes.
    pub(crate) fn parse(name: &str) -> Result<Quantity, QuantityError> {
        let cpu = |end: &str, share: &str| {
            let end = match end {
                "local" => CpuEnd::Local,
                "remote" => CpuEnd::Remote,
                _ => return None,
            };
            let share = match share {
                "process_percent" => CpuShare::Process,
                "system_busy_percent" => CpuShare::SystemBusy,
                _ => return None,
            };
            Some(Quantity::Cpu(end, share))
        };
        let key = |n: &str| {
            n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && n.starts_with(|c: char| c.is_ascii_lowercase())
                && METRIC_UNITS.iter().any(|u| n.ends_with(u))
        };
        let parts: Vec<&str> = name.split('.').collect();
        let q = match parts.as_slice() {
            ["value"] => Some(Quantity::Headline),
            ["block_time_us"] => Some(Quantity::BlockTime),
            ["dropouts"] => Some(Quantity::Dropouts),
            ["cpu", end, share] => cpu(end, share),
            [n] if key(n) => Some(Quantity::Metric((*n).to_string())),
            _ => None,
        };
        q.ok_or_else(|| QuantityError {
            name: name.to_string(),
        })
    }

    /// The quantity's name as the study file gives it.
    pub fn name(&self) -> String {
        match self {
            Quantity::Headline => "value".into(),
            Quantity::Metric(key) => key.clone(),
            Quantity::BlockTime => "block_time_us".into(),
            Quantity::Dropouts => "dropouts".into(),
            Quantity::Cpu(end, share) => {
                let end = match end {
                    CpuEnd::Local => "local",
                    CpuEnd::Remote => "remote",
                };
                let share = match share {
                    CpuShare::Process => "process_percent",
                    CpuShare::SystemBusy => "system_busy_percent",
                };
                format!("cpu.{end}.{share}")
            }
        }
    }

    /// `record`'s value of the quantity with its 95% interval, when it has
    /// one; `None` when the record does not carry it.
    pub fn of(&self, record: &ResultRecord) -> Option<(f64, Option<(f64, f64)>)> {
        let interval = || {
            let s = record.stats.as_ref()?;
            s.ci95_low.zip(s.ci95_high)
        };
        match self {
            Quantity::Dropouts => Some((if record.dropout().is_some() { 1.0 } else { 0.0 }, None)),
            Quantity::Headline => Some((record.value, interval())),
            Quantity::Metric(key) if *key == record.metric => Some((record.value, interval())),
            Quantity::Metric(key) => record
                .workload
                .as_ref()
                .and_then(|w| w.app.as_ref())
                .and_then(|a| a.metrics.get(key))
                .map(|v| (*v, None)),
            Quantity::BlockTime => {
                // A sweep's block time is its size over its throughput: its
                // interval is the throughput's, turned over.
                let t = record.block_time_us()?;
                let v = record.value;
                let ci = match interval() {
                    Some((lo, hi)) if lo > 0.0 && v > 0.0 => Some((t * v / hi, t * v / lo)),
                    _ => None,
                };
                Some((t, ci))
            }
            Quantity::Cpu(end, share) => {
                let cpu = record.cpu.as_ref()?;
                let usage = match end {
                    CpuEnd::Local => &cpu.local,
                    CpuEnd::Remote => &cpu.remote,
                };
                let v = match share {
                    CpuShare::Process => usage.process_percent,
                    CpuShare::SystemBusy => usage.system_busy_percent,
                };
                Some((v, None))
            }
        }
    }
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A name that is no [`Quantity`], with what the study file may
/// name instead.
#[derive(Debug, thiserror::Error)]
#[error(
    "{name:?} is no quantity: value, dropouts, block_time_us, \
     cpu.local|remote.process_percent|system_busy_percent, or a metric's key \
     with its unit ({units})",
    units = METRIC_UNITS.join(", ")
)]
pub struct QuantityError {
    /// The name given.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::{Attr, XAxis};

    /// Each quantity reads its own part of a record: the headline with its
    /// interval, an application's figure, a sweep's block time with the
    /// throughput's interval turned over, a flagged dropout, one end's CPU.
    #[test]
    fn quantities_read_their_part_of_a_record() {
        use crate::cpu::CpuUsage;
        use crate::record::{
            AppResult, CpuPair, Dropout, RecordHead, RecordStats, SweepSection, WorkloadSection,
        };
        let mut r = ResultRecord::new(RecordHead {
            test: "sweep".into(),
            transport: "tcp".into(),
            mode: crate::spec::Mode::Event,
            size_bytes: 1000,
            metric: "bandwidth_gbps".into(),
            value: 2.0,
            time: "t".into(),
        });
        r.stats = Some(RecordStats {
            min: 1.0,
            median: 2.0,
            max: 3.0,
            stdev: 0.5,
            ci95_low: Some(1.0),
            ci95_high: Some(4.0),
            cv: 0.25,
            reps: vec![1.0, 2.0, 3.0],
        });
        let q = |name: &str| Quantity::parse(name).expect(name);
        assert_eq!(q("value").of(&r), Some((2.0, Some((1.0, 4.0)))));
        assert_eq!(q("bandwidth_gbps").of(&r), Some((2.0, Some((1.0, 4.0)))));
        assert_eq!(q("latency_us").of(&r), None);
        assert_eq!(q("block_time_us").of(&r), None);
        assert_eq!(q("dropouts").of(&r), Some((0.0, None)));
        assert_eq!(q("cpu.remote.process_percent").of(&r), None);
        r.sweep = Some(SweepSection {
            sweep_kind: "stream".into(),
            block_time_us: 4.0,
            dropout: Some(Dropout {
                depth_pct: 20.0,
                reference_size_bytes: 500,
                reference_value: 2.5,
            }),
            unstable: None,
        });
        assert_eq!(q("block_time_us").of(&r), Some((4.0, Some((2.0, 8.0)))));
        assert_eq!(q("dropouts").of(&r), Some((1.0, None)));
        let usage = |process_percent: f64| CpuUsage {
            process_percent,
            system_busy_percent: 50.0,
            ..CpuUsage::default()
        };
        r.cpu = Some(CpuPair {
            local: usage(30.0),
            remote: usage(40.0),
        });
        assert_eq!(q("cpu.remote.process_percent").of(&r), Some((40.0, None)));
        assert_eq!(
            q("cpu.local.system_busy_percent").of(&r),
            Some((50.0, None))
        );
        r.workload = Some(WorkloadSection {
            clients: 4,
            client_hosts: None,
            flows: Vec::new(),
            hosts_cpu: Vec::new(),
            links: Vec::new(),
            app: Some(AppResult {
                metrics: [("connect_time_us".to_string(), 7.0)].into(),
                ..AppResult::default()
            }),
        });
        assert_eq!(q("connect_time_us").of(&r), Some((7.0, None)));
        assert_eq!(XAxis::Clients.of(&r), Some(4.0));
        assert_eq!(Attr::Kind.of(&r).as_deref(), Some("stream"));
        assert_eq!(Attr::Options.of(&r).as_deref(), Some("defaults"));
        for name in [
            "value",
            "dropouts",
            "block_time_us",
            "cpu.local.process_percent",
            "query_time_ms",
        ] {
            assert_eq!(q(name).name(), name);
        }
    }
}
