//! `netgap compare BASE NEW`: the change of every point between two results
//! files, so a stack or kernel change can be gated on it.
//!
//! Points are matched by (test, transport, mode, size, metric, tool,
//! clients); when a file holds a key twice the later record counts. Each
//! matched pair is tested with Welch's unequal-variances t-test on the
//! repetitions (two-sided, significance level [`ALPHA`]). A significant
//! change is `better` or `worse` by the metric's direction (latencies lower,
//! bandwidths higher); anything else is `same`. A point whose records carry
//! no repetitions (imported from a tool that reports one number) cannot be
//! tested and is never called better or worse. A *regression* is a `worse`
//! point whose change is larger than the threshold; the binary exits with
//! [`REGRESSION_EXIT_CODE`] when there is at least one.

use crate::load::{lower_is_better, Loaded};
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Two-sided significance level of the t-test.
pub const ALPHA: f64 = 0.05;

/// Exit status of `netgap compare` when a significant regression passes the
/// threshold (1 is any other error, 2 bad arguments).
pub const REGRESSION_EXIT_CODE: u8 = 3;

/// What identifies a point in both files.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PointKey {
    /// Test name.
    pub test: String,
    /// Transport name.
    pub transport: String,
    /// Completion mode.
    pub mode: String,
    /// Message size, bytes.
    pub size_bytes: u64,
    /// Metric with unit.
    pub metric: String,
    /// Peer tool, `None` for netgap's own points.
    pub tool: Option<String>,
    /// Concurrent clients, for multi-client tests.
    pub clients: Option<u32>,
}

impl PointKey {
    fn of(l: &Loaded) -> PointKey {
        let r = &l.record;
        PointKey {
            test: r.test.clone(),
            transport: r.transport.clone(),
            mode: r.mode.to_string(),
            size_bytes: r.size_bytes,
            metric: r.metric.clone(),
            tool: r.tool.clone(),
            clients: l.extras.clients,
        }
    }

    /// Short label for tables: `pingpong tcp/event 64B latency_us`.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{} {}/{} {} {}",
            self.test,
            self.transport,
            self.mode,
            netgap_core::units::format_size(self.size_bytes),
            self.metric
        );
        if let Some(c) = self.clients {
            let _ = write!(s, " x{c}");
        }
        if let Some(t) = &self.tool {
            let _ = write!(s, " [{t}]");
        }
        s
    }
}

/// The verdict on one matched point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Significantly better.
    Better,
    /// Significantly worse.
    Worse,
    /// No significant difference.
    Same,
    /// No repetitions on one side: not tested.
    Untested,
}

impl Verdict {
    /// The word shown in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::Same => "same",
            Verdict::Untested => "untested",
        }
    }
}

/// One matched point.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The point.
    pub key: PointKey,
    /// Headline value in BASE, in the metric's unit.
    pub base: f64,
    /// Headline value in NEW, in the metric's unit.
    pub new: f64,
    /// `(new - base) / base`, percent; signed, not direction-adjusted.
    pub change_pct: f64,
    /// Two-sided p-value of Welch's t-test, when both sides have repetitions.
    pub p_value: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
    /// Worse by more than the threshold.
    pub regression: bool,
}

/// The comparison of two files.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Matched points, in key order.
    pub changes: Vec<Change>,
    /// Points only in BASE.
    pub only_base: Vec<PointKey>,
    /// Points only in NEW.
    pub only_new: Vec<PointKey>,
    /// The threshold used, percent.
    pub threshold_pct: f64,
}

impl Comparison {
    /// The regressions: significantly worse by more than the threshold.
    pub fn regressions(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.regression)
    }
}

/// Welch's two-sided t-test of equal means; `None` when either side has
/// fewer than two values. Both sides constant: p is 1 for equal means and 0
/// otherwise.
pub(crate) fn welch_p_value(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (ma, mb) = (netgap_core::stats::mean(a)?, netgap_core::stats::mean(b)?);
    let (sa, sb) = (
        netgap_core::stats::sample_stdev(a)?,
        netgap_core::stats::sample_stdev(b)?,
    );
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let (va, vb) = (sa * sa / na, sb * sb / nb);
    let se2 = va + vb;
    if se2 == 0.0 {
        return Some(if ma == mb { 1.0 } else { 0.0 });
    }
    let t = (ma - mb) / se2.sqrt();
    // Welch–Satterthwaite degrees of freedom.
    let dof = se2 * se2 / (va * va / (na - 1.0) + vb * vb / (nb - 1.0));
    let dist = StudentsT::new(0.0, 1.0, dof).ok()?;
    Some((2.0 * (1.0 - dist.cdf(t.abs()))).clamp(0.0, 1.0))
}

/// Compares two sets of records point by point; `threshold_pct` is the
/// smallest change, in percent, that counts as a regression.
pub fn compare(base: &[Loaded], new: &[Loaded], threshold_pct: f64) -> Comparison {
    let index = |recs: &[Loaded]| -> BTreeMap<PointKey, Loaded> {
        recs.iter().map(|l| (PointKey::of(l), l.clone())).collect()
    };
    let (b, n) = (index(base), index(new));
    let mut changes = Vec::new();
    for (key, bl) in &b {
        let Some(nl) = n.get(key) else { continue };
        let (bv, nv) = (bl.record.value, nl.record.value);
        let change_pct = if bv == 0.0 {
            0.0
        } else {
            100.0 * (nv - bv) / bv.abs()
        };
        let reps = |l: &Loaded| l.record.stats.as_ref().map(|s| s.reps.clone());
        let p_value = match (reps(bl), reps(nl)) {
            (Some(x), Some(y)) => welch_p_value(&x, &y),
            _ => None,
        };
        let improved = if lower_is_better(&key.metric) {
            nv < bv
        } else {
            nv > bv
        };
        let verdict = match p_value {
            None => Verdict::Untested,
            Some(p) if p >= ALPHA || nv == bv => Verdict::Same,
            Some(_) if improved => Verdict::Better,
            Some(_) => Verdict::Worse,
        };
        changes.push(Change {
            key: key.clone(),
            base: bv,
            new: nv,
            change_pct,
            p_value,
            verdict,
            regression: verdict == Verdict::Worse && change_pct.abs() > threshold_pct,
        });
    }
    Comparison {
        changes,
        only_base: b.keys().filter(|k| !n.contains_key(*k)).cloned().collect(),
        only_new: n.keys().filter(|k| !b.contains_key(*k)).cloned().collect(),
        threshold_pct,
    }
}

/// The comparison as a text table with a closing summary line.
pub fn render(c: &Comparison) -> String {
    let mut out = String::new();
    let width = c
        .changes
        .iter()
        .map(|ch| ch.key.label().len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        out,
        "{:<width$}  {:>12}  {:>12}  {:>8}  {:>8}  verdict",
        "point", "base", "new", "change", "p"
    );
    for ch in &c.changes {
        let p = ch
            .p_value
            .map_or_else(|| "-".to_string(), |p| format!("{p:.3}"));
        let flag = if ch.regression { "  REGRESSION" } else { "" };
        let _ = writeln!(
            out,
            "{:<width$}  {:>12.4}  {:>12.4}  {:>+7.1}%  {:>8}  {}{flag}",
            ch.key.label(),
            ch.base,
            ch.new,
            ch.change_pct,
            p,
            ch.verdict.as_str()
        );
    }
    for k in &c.only_base {
        let _ = writeln!(out, "only in base: {}", k.label());
    }
    for k in &c.only_new {
        let _ = writeln!(out, "only in new: {}", k.label());
    }
    let count = |v: Verdict| c.changes.iter().filter(|ch| ch.verdict == v).count();
    let _ = writeln!(
        out,
        "{} points: {} better, {} worse, {} same, {} untested (Welch's t-test, p < {ALPHA}); {} regressions beyond {}%",
        c.changes.len(),
        count(Verdict::Better),
        count(Verdict::Worse),
        count(Verdict::Same),
        count(Verdict::Untested),
        c.regressions().count(),
        c.threshold_pct
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welch_matches_a_hand_computed_value() {
        // Equal variances and sizes: Welch's dof is 2(n - 1) = 8.
        let a = [9.0, 10.0, 11.0, 10.0, 10.0];
        let b: Vec<f64> = a.iter().map(|x| x + 2.0).collect();
        let p = welch_p_value(&a, &b).unwrap();
        let s = netgap_core::stats::sample_stdev(&a).unwrap();
        let t = 2.0 / (2.0 * s * s / 5.0).sqrt();
        let expect = 2.0 * (1.0 - StudentsT::new(0.0, 1.0, 8.0).unwrap().cdf(t));
        assert!((p - expect).abs() < 1e-9, "{p} vs {expect}");
        assert!(p < ALPHA);
    }

    #[test]
    fn constant_samples_are_equal_or_different_for_sure() {
        assert_eq!(welch_p_value(&[1.0, 1.0], &[1.0, 1.0]), Some(1.0));
        assert_eq!(welch_p_value(&[1.0, 1.0], &[2.0, 2.0]), Some(0.0));
        assert_eq!(welch_p_value(&[1.0], &[2.0, 2.0]), None);
    }
}
