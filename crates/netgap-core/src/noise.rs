//! What kind of noise a noisy point shows, and the remedy that fits it.
//!
//! A point is noisy when the coefficient of variation of its repetitions
//! exceeds [`crate::stats::NOISY_CV`]. One advice for every noisy point is
//! wrong most of the time (pinning a run that is already pinned), so the
//! diagnosis looks first for a cause the record saw directly, then for a
//! pattern in the repetitions:
//!
//! 1. **The emulator** (on a testbed): the testbed's forwarding and
//!    shaping, the softirq share of the machine's CPUs, took
//!    [`crate::load::FORWARDING_BOUND_PERCENT`] of them or more, and at
//!    least as much as other work ([`CpuLoad::forwarding_named`]): the
//!    emulator, not the links, bound the point, and a quieter host would
//!    not help.
//! 2. **CPU contention**: other work kept some host of the point busy, by
//!    [`CONTENDED_BUSY_PERCENT`] of all its CPUs or more, beyond the
//!    point's own threads and the kernel's packet processing (from
//!    `/proc/stat` over the point; [`crate::load`]).
//! 3. **Short repetitions**: fewer than [`SHORT_REP_ITERATIONS`] exchanges
//!    (latency tests) or less than [`SHORT_REP_MS`] per repetition, so a
//!    single scheduler tick or interrupt is a large share of one.
//! 4. **Drift**: the repetitions follow a trend in time (a least-squares
//!    slope over the repetition index, significant at 95%).
//! 5. **Two groups**: sorted, the repetitions fall into two groups of at
//!    least two each, the gap between them at least
//!    [`TWO_GROUPS_GAP_SPREADS`] times the spread within them (the idea of
//!    [`crate::dropout::split_trials`], for any noisy point).
//!
//! Otherwise the noise is unexplained and the remedy is more repetitions.
//! Plain data in, plain data out: no I/O.

use crate::load::{emulator_finding, CpuLoad, EMULATOR_REMEDY};
use crate::record::ResultRecord;
use crate::stats::{t_quantile, NOISY_CV};
use serde::{Deserialize, Serialize};

/// Fewer iterations than this per repetition make a repetition short.
pub const SHORT_REP_ITERATIONS: u64 = 100;
/// A repetition shorter than this, in milliseconds, is short.
pub const SHORT_REP_MS: f64 = 5.0;
/// CPU busy beyond the point's own threads and the kernel's packet
/// processing (other work), in percent of all the host's CPUs, from which a
/// host counts as contended.
pub const CONTENDED_BUSY_PERCENT: f64 = 20.0;
/// How many within-group standard deviations the gap between two groups of
/// repetitions must span.
pub const TWO_GROUPS_GAP_SPREADS: f64 = 4.0;

/// The kind of noise a noisy point shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoiseKind {
    /// The testbed's own forwarding kept its machine's CPUs busy.
    Emulator,
    /// Another load kept a host of the point busy.
    CpuContention,
    /// Repetitions too short for their own timing.
    ShortRepetitions,
    /// Repetitions trend up or down over the run.
    Drift,
    /// Repetitions fall into a slow and a fast group.
    TwoGroups,
    /// None of the above.
    Unexplained,
}

impl NoiseKind {
    /// A few words naming the kind, for grouped warnings.
    pub fn title(self) -> &'static str {
        match self {
            NoiseKind::Emulator => "the testbed's forwarding",
            NoiseKind::CpuContention => "CPU contention",
            NoiseKind::ShortRepetitions => "short repetitions",
            NoiseKind::Drift => "drift across repetitions",
            NoiseKind::TwoGroups => "two groups of repetitions",
            NoiseKind::Unexplained => "no recognized pattern",
        }
    }
}

/// What the record says around its repetitions, for [`diagnose`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NoiseContext {
    /// Iterations in each repetition, when known and each is one timed
    /// exchange (latency tests).
    pub iterations_per_rep: Option<u64>,
    /// Length of one repetition in milliseconds, when known or estimable.
    pub rep_ms: Option<f64>,
    /// Where the CPUs of the point's busiest host went (on a testbed, of
    /// the machine its hosts share).
    pub cpu: Option<CpuLoad>,
    /// `--pin` placed both roles.
    pub pinned: bool,
    /// The repetitions alternated with other stacks' (`--interleave`).
    pub interleaved: bool,
    /// The flag that lengthens a repetition: `--rep-time` for
    /// point-to-point tests, `--duration` for multi-host workloads.
    pub length_flag: &'static str,
}

/// The diagnosis of one noisy point.
#[derive(Debug, Clone, PartialEq)]
pub struct NoiseDiagnosis {
    /// The kind of noise.
    pub kind: NoiseKind,
    /// Coefficient of variation of the repetitions (a fraction).
    pub cv: f64,
    /// One full sentence: how much the repetitions vary, why, and the
    /// remedy that fits.
    pub sentence: String,
    /// The remedy alone (the end of `sentence`), for warnings grouped by
    /// kind.
    pub remedy: String,
}

/// The least-squares slope of `values` over their index, with its
/// t statistic; `None` for fewer than 4 values or a perfect line (no
/// residual: then the trend is certain, reported as an infinite t).
fn slope_t(values: &[f64]) -> Option<(f64, f64)> {
    let n = values.len();
    if n < 4 {
        return None;
    }
    let nf = n as f64;
    let mean_x = (nf - 1.0) / 2.0;
    let mean_y = values.iter().sum::<f64>() / nf;
    let sxx: f64 = (0..n).map(|i| (i as f64 - mean_x).powi(2)).sum();
    let sxy: f64 = values
        .iter()
        .enumerate()
        .map(|(i, y)| (i as f64 - mean_x) * (y - mean_y))
        .sum();
    let slope = sxy / sxx;
    let sse: f64 = values
        .iter()
        .enumerate()
        .map(|(i, y)| (y - mean_y - slope * (i as f64 - mean_x)).powi(2))
        .sum();
    let se = (sse / (nf - 2.0) / sxx).sqrt();
    let t = if se > 0.0 {
        slope / se
    } else if slope != 0.0 {
        f64::INFINITY.copysign(slope)
    } else {
        0.0
    };
    Some((slope, t))
}

/// Where sorted repetitions split into two groups of at least two each
/// with a gap of [`TWO_GROUPS_GAP_SPREADS`] within-group deviations or
/// more: the size of the lower group and the two groups' means.
fn two_groups(values: &[f64]) -> Option<(usize, f64, f64)> {
    let n = values.len();
    if n < 4 {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let ss = |v: &[f64]| {
        let m = mean(v);
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>()
    };
    (2..=n - 2)
        .filter_map(|k| {
            let (low, high) = sorted.split_at(k);
            let gap = high[0] - low[k - 1];
            let within = ((ss(low) + ss(high)) / (n as f64 - 2.0)).sqrt();
            // Alike values within each group are the clearest split of all.
            let spreads = if within > 0.0 {
                gap / within
            } else if gap > 0.0 {
                f64::INFINITY
            } else {
                0.0
            };
            (spreads >= TWO_GROUPS_GAP_SPREADS).then_some((k, spreads, mean(low), mean(high)))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _, lo, hi)| (k, lo, hi))
}

/// Formats a percentage with one decimal under 10 and none above.
fn pct(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p.abs() < 10.0 {
        format!("{p:.1}")
    } else {
        format!("{p:.0}")
    }
}

/// Formats a value of the repetitions' own unit with 3 significant digits.
fn num(v: f64) -> String {
    let digits = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$}")
}

/// Diagnoses the repetitions `reps` of a point in `ctx` when their
/// coefficient of variation `cv` exceeds `threshold` (a fraction, normally
/// [`NOISY_CV`]); `None` for a quiet point or a NaN threshold. Never panics.
pub fn diagnose(
    reps: &[f64],
    cv: f64,
    ctx: &NoiseContext,
    threshold: f64,
) -> Option<NoiseDiagnosis> {
    // A NaN threshold or cv compares false: no warning rather than a wrong one.
    let noisy = cv > threshold;
    if !noisy || reps.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let lead = format!(
        "repetitions vary by {}% (coefficient of variation)",
        pct(cv)
    );
    let contended = |l: &CpuLoad| l.other_percent >= CONTENDED_BUSY_PERCENT;
    let (kind, finding, remedy) = if let Some((load, forwarding)) = ctx
        .cpu
        .as_ref()
        .filter(|l| l.forwarding_named())
        .and_then(|l| Some((l, l.forwarding_percent()?)))
    {
        let other = Some(load.other_percent).filter(|_| contended(load));
        (
            NoiseKind::Emulator,
            format!("while {}", emulator_finding(forwarding, other)),
            EMULATOR_REMEDY.to_string(),
        )
    } else if let Some(load) = ctx.cpu.as_ref().filter(|l| contended(l)) {
        let also = match load.forwarding_percent() {
            Some(f) if f >= crate::load::FORWARDING_BOUND_PERCENT => {
                format!(" (and the testbed's forwarding {f:.0}%)")
            }
            _ => String::new(),
        };
        (
            NoiseKind::CpuContention,
            format!(
                "while other work kept {:.0}% of {} busy{also}",
                load.other_percent,
                load.whose_cpus()
            ),
            "measure on a quieter host".to_string(),
        )
    } else if let Some(why) = short(ctx) {
        (
            NoiseKind::ShortRepetitions,
            format!("over short repetitions ({why})"),
            format!("lengthen them with {}", ctx.length_flag),
        )
    } else if let Some((_, t)) =
        slope_t(reps).filter(|(_, t)| t.abs() > t_quantile(0.95, reps.len() as u64 - 2))
    {
        let half = reps.len() / 2;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (first, second) = (mean(&reps[..half]), mean(&reps[reps.len() - half..]));
        let way = if t > 0.0 { "up" } else { "down" };
        let remedy = if ctx.interleaved {
            "the compared stacks were interleaved, so it fell on all of them alike; look for what changes on the host over the run (clock frequency, other load)"
        } else {
            "interleave the compared stacks with --interleave so drift falls on all of them alike"
        };
        (
            NoiseKind::Drift,
            format!(
                "and drift {way} over the run (first half {}, second half {})",
                num(first),
                num(second)
            ),
            remedy.to_string(),
        )
    } else if let Some((k, low, high)) = two_groups(reps) {
        let remedy = if ctx.pinned {
            "look for an intermittent stall (interrupts, power states) on the pinned CPUs or raise --reps"
        } else {
            "pin the client and server with --pin"
        };
        (
            NoiseKind::TwoGroups,
            format!(
                "in two groups ({k} of {} near {}, the rest near {})",
                reps.len(),
                num(low),
                num(high)
            ),
            remedy.to_string(),
        )
    } else {
        let remedy = if ctx.pinned {
            "raise --reps"
        } else {
            "pin the client and server with --pin or raise --reps"
        };
        (NoiseKind::Unexplained, String::new(), remedy.to_string())
    };
    let sentence = if finding.is_empty() {
        format!("{lead}; {remedy}")
    } else {
        format!("{lead} {finding}; {remedy}")
    };
    Some(NoiseDiagnosis {
        kind,
        cv,
        sentence,
        remedy,
    })
}

/// Why the repetitions of `ctx` are short, if they are.
fn short(ctx: &NoiseContext) -> Option<String> {
    let few = ctx.iterations_per_rep.filter(|&n| n < SHORT_REP_ITERATIONS);
    let brief = ctx.rep_ms.filter(|&ms| ms < SHORT_REP_MS);
    match (few, brief) {
        (Some(n), Some(ms)) => Some(format!("{n} iterations, {ms:.1} ms each")),
        (Some(n), None) => Some(format!("{n} iterations each")),
        (None, Some(ms)) => Some(format!("{ms:.1} ms each")),
        (None, None) => None,
    }
}

impl NoiseContext {
    /// What `record` says around its repetitions: iterations, the length
    /// of a repetition (its time budget, or estimated from its iterations
    /// and value), where the CPUs of its busiest host went
    /// ([`CpuLoad::of_record`]: both ends on one host, or every host of a
    /// testbed, count together), pinning and interleaving.
    pub fn of_record(record: &ResultRecord) -> NoiseContext {
        let options = record.options.as_ref();
        let multi_host = record.workload.is_some();
        let reps = options.map_or(0, |o| o.reps).max(1);
        let rep_ms = options
            .and_then(|o| o.rep_time_ms)
            .map(|ms| ms as f64)
            .or_else(|| {
                let n = record.iterations_per_rep? as f64;
                match record.metric.as_str() {
                    // A latency is one way of a round trip.
                    "latency_us" => Some(n * 2.0 * record.value / 1000.0),
                    "bandwidth_gbps" if record.value > 0.0 => {
                        let bytes = record.bytes.as_ref()?.client_tx as f64 / f64::from(reps);
                        Some(bytes * 8.0 / (record.value * 1e9) * 1000.0)
                    }
                    _ => None,
                }
            });
        NoiseContext {
            // Only a latency test's iteration is one timed exchange; a
            // bandwidth test's is a burst of messages, few by design.
            iterations_per_rep: record
                .iterations_per_rep
                .filter(|_| record.metric == "latency_us"),
            rep_ms,
            cpu: CpuLoad::of_record(record),
            pinned: options.is_some_and(|o| {
                o.placement.client_cpu.is_some() && o.placement.server_cpu.is_some()
            }),
            interleaved: options.is_some_and(|o| o.interleaved.is_some()),
            length_flag: if multi_host {
                "--duration"
            } else {
                "--rep-time"
            },
        }
    }
}

/// The diagnosis of `record`'s noise from its own repetitions and what it
/// says around them; `None` when it is quiet or has no repetitions.
pub fn diagnose_record(record: &ResultRecord) -> Option<NoiseDiagnosis> {
    let stats = record.stats.as_ref()?;
    diagnose(
        &stats.reps,
        stats.cv,
        &NoiseContext::of_record(record),
        NOISY_CV,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::stats::Summary;

    fn ctx() -> NoiseContext {
        NoiseContext {
            iterations_per_rep: Some(100_000),
            rep_ms: Some(1000.0),
            cpu: None,
            pinned: false,
            interleaved: false,
            length_flag: "--rep-time",
        }
    }

    fn run(reps: &[f64], ctx: &NoiseContext) -> NoiseDiagnosis {
        let s = Summary::from_reps(reps).unwrap();
        diagnose(reps, s.cv, ctx, NOISY_CV).unwrap()
    }

    #[test]
    fn a_quiet_point_has_no_diagnosis() {
        let reps = [10.0, 10.1, 9.9, 10.0, 10.05];
        let s = Summary::from_reps(&reps).unwrap();
        assert_eq!(diagnose(&reps, s.cv, &ctx(), NOISY_CV), None);
        assert_eq!(diagnose(&reps, 0.5, &ctx(), f64::NAN), None);
    }

    #[test]
    fn drift_is_diagnosed_with_interleave_as_remedy() {
        let reps = [10.0, 10.6, 11.1, 11.5, 12.2, 12.6, 13.1, 13.7];
        let d = run(&reps, &ctx());
        assert_eq!(d.kind, NoiseKind::Drift);
        assert!(d.sentence.contains("drift up"), "{}", d.sentence);
        assert!(d.sentence.contains("--interleave"), "{}", d.sentence);
        let mut interleaved = ctx();
        interleaved.interleaved = true;
        let d = run(&reps, &interleaved);
        assert!(!d.sentence.contains("with --interleave"), "{}", d.sentence);
    }

    #[test]
    fn two_groups_are_diagnosed_and_pin_is_advised_only_when_unpinned() {
        // Alternating, so no trend: a slow group and a fast one.
        let reps = [10.0, 13.0, 10.1, 13.1, 9.9, 12.9, 10.0, 13.0];
        let d = run(&reps, &ctx());
        assert_eq!(d.kind, NoiseKind::TwoGroups);
        assert!(
            d.sentence.contains("4 of 8 near 10.0, the rest near 13.0"),
            "{}",
            d.sentence
        );
        assert!(d.sentence.contains("--pin"), "{}", d.sentence);
        let mut pinned = ctx();
        pinned.pinned = true;
        let d = run(&reps, &pinned);
        assert_eq!(d.kind, NoiseKind::TwoGroups);
        assert!(!d.sentence.contains("--pin"), "{}", d.sentence);
    }

    #[test]
    fn short_repetitions_are_diagnosed_by_iterations_or_length() {
        let reps = [10.0, 12.0, 9.0, 11.5, 8.5, 12.5];
        let mut few = ctx();
        few.iterations_per_rep = Some(20);
        let d = run(&reps, &few);
        assert_eq!(d.kind, NoiseKind::ShortRepetitions);
        assert!(d.sentence.contains("20 iterations"), "{}", d.sentence);
        assert!(d.sentence.contains("--rep-time"), "{}", d.sentence);
        let mut brief = ctx();
        brief.rep_ms = Some(1.5);
        brief.length_flag = "--duration";
        let d = run(&reps, &brief);
        assert_eq!(d.kind, NoiseKind::ShortRepetitions);
        assert!(d.sentence.contains("1.5 ms each"), "{}", d.sentence);
        assert!(d.sentence.contains("--duration"), "{}", d.sentence);
    }

    /// A host's load: `busy` of its CPUs, `own` and `softirq` of them,
    /// the rest other work; on a testbed when `testbed`.
    fn load(busy: f64, own: f64, softirq: f64, testbed: bool) -> CpuLoad {
        CpuLoad {
            hosts: vec!["h1".into()],
            cores: 2,
            busy_percent: busy,
            own_percent: own,
            softirq_percent: Some(softirq),
            other_percent: (busy - own - softirq).max(0.0),
            testbed,
            bound_by: None,
        }
    }

    #[test]
    fn cpu_contention_is_diagnosed_and_comes_before_the_pattern() {
        let reps = [10.0, 10.6, 11.1, 11.5, 12.2, 12.6, 13.1, 13.7];
        let mut busy = ctx();
        busy.cpu = Some(load(95.0, 45.0, 5.0, false));
        let d = run(&reps, &busy);
        assert_eq!(d.kind, NoiseKind::CpuContention);
        assert!(d.sentence.contains("45% of h1's CPUs"), "{}", d.sentence);
        assert!(d.sentence.contains("quieter host"), "{}", d.sentence);
        // Slight foreign load is not contention.
        busy.cpu = Some(load(55.0, 45.0, 5.0, false));
        assert_eq!(run(&reps, &busy).kind, NoiseKind::Drift);
        // Off a testbed the kernel's packet processing is the point's own
        // stack at work, neither other work nor an emulator.
        busy.cpu = Some(load(95.0, 45.0, 45.0, false));
        assert_eq!(run(&reps, &busy).kind, NoiseKind::Drift);
    }

    #[test]
    fn the_testbeds_forwarding_is_named_as_the_emulator_never_as_other_work() {
        let reps = [10.0, 10.6, 11.1, 11.5, 12.2, 12.6, 13.1, 13.7];
        let mut c = ctx();
        // The multirail: 99.9% busy, netgap's ends 63.5%, the
        // rest the testbed's forwarding.
        c.cpu = Some(load(99.9, 63.5, 33.0, true));
        let d = run(&reps, &c);
        assert_eq!(d.kind, NoiseKind::Emulator);
        assert!(
            d.sentence.contains(
                "the testbed's forwarding used 33% of the CPUs: the emulator, not the links, \
                 bound this point"
            ),
            "{}",
            d.sentence
        );
        assert!(!d.sentence.contains("quieter host"), "{}", d.sentence);
        assert!(!d.sentence.contains("other work"), "{}", d.sentence);
        assert!(d.remedy.contains("--rate"), "{}", d.remedy);
        // Forwarding and other work both past the bar: the larger names
        // the kind, the other is said beside it.
        c.cpu = Some(load(100.0, 20.0, 50.0, true));
        let d = run(&reps, &c);
        assert_eq!(d.kind, NoiseKind::Emulator);
        assert!(
            d.sentence.contains(
                "forwarding used 50% of the CPUs (other work 30%): the emulator, not the links"
            ),
            "{}",
            d.sentence
        );
        // A busy loop beside the testbed: other work, with its remedy.
        c.cpu = Some(load(100.0, 20.0, 25.0, true));
        let d = run(&reps, &c);
        assert_eq!(d.kind, NoiseKind::CpuContention);
        assert!(
            d.sentence.contains(
                "other work kept 55% of the testbed machine's CPUs busy (and the testbed's \
                 forwarding 25%)"
            ),
            "{}",
            d.sentence
        );
        assert!(d.sentence.contains("quieter host"), "{}", d.sentence);
        // Little of either: the pattern decides.
        c.cpu = Some(load(60.0, 40.0, 10.0, true));
        assert_eq!(run(&reps, &c).kind, NoiseKind::Drift);
    }

    #[test]
    fn noise_of_no_known_kind_advises_pin_only_when_unpinned() {
        let reps = [10.0, 11.2, 9.1, 10.6, 9.5, 11.0, 9.8, 10.3];
        let d = run(&reps, &ctx());
        assert_eq!(d.kind, NoiseKind::Unexplained);
        assert!(d.sentence.contains("--pin"), "{}", d.sentence);
        let mut pinned = ctx();
        pinned.pinned = true;
        let d = run(&reps, &pinned);
        assert!(!d.sentence.contains("--pin"), "{}", d.sentence);
        assert!(d.sentence.contains("--reps"), "{}", d.sentence);
    }

    #[test]
    fn a_record_gives_its_context() {
        let mut r: ResultRecord = serde_json::from_value(serde_json::json!({
            "test": "pingpong", "transport": "tcp", "mode": "event", "size_bytes": 1,
            "metric": "latency_us", "value": 10.0, "warnings": [], "version": "0",
            "time": "2026-01-01T00:00:00Z", "iterations_per_rep": 50,
            "stats": null, "percentiles": null, "cpu": {
                "local": {"system_busy_percent": 90.0, "process_percent": 50.0, "cpu_ns": 0, "wall_ns": 0},
                "remote": {"system_busy_percent": 90.0, "process_percent": 50.0, "cpu_ns": 0, "wall_ns": 0}
            },
            "service_demand_us_per_kib": null, "warmup_iterations": null, "bytes": null,
            "datagrams": null, "host": null, "peer_host": null, "options": null
        }))
        .unwrap();
        r.host = Some(crate::host::HostFacts {
            hostname: "a".into(),
            cores: 2,
            ..Default::default()
        });
        let c = NoiseContext::of_record(&r);
        assert_eq!(c.iterations_per_rep, Some(50));
        assert_eq!(c.rep_ms, Some(1.0));
        // Both ends on one 2-core host: 100% of a core of their own is 50%.
        let cpu = c.cpu.as_ref().unwrap();
        assert_eq!((cpu.own_percent, cpu.other_percent), (50.0, 40.0));
        assert!(!c.pinned);
        assert_eq!(c.length_flag, "--rep-time");
        // A bandwidth test's few iterations are bursts, not short ones.
        r.metric = "bandwidth_gbps".into();
        assert_eq!(NoiseContext::of_record(&r).iterations_per_rep, None);
    }
}
