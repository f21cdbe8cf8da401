//! `netgap compare BASE NEW`: the change of every point between two results
//! files, or between two stacks of one file, so a stack, kernel or
//! condition change can be gated on it.
//!
//! Points are matched by test, size, metric, number of clients, the
//! options that changed what they measured (a workload's own, pinning) and
//! stack ([`Stack::of_record`]); a point a file holds twice is matched as
//! its own (`repeat=2`). `--base-stack` and `--new-stack` pick the stacks of each side
//! (every comma-separated term names a part of the stack: `MTU 9000`,
//! `offload off`, `tcp/poll`, a label), which also compares two stacks of
//! one file, as an interleaved A/B run makes. Stacks pair up when they are
//! equal; else when they differ only in what the two selections name;
//! else, with a note, when they differ only by label, or only in
//! conditions (the path), or when each side has just one stack left.
//!
//! Each matched pair is tested with Welch's unequal-variances t-test on the
//! repetitions (two-sided, significance level [`ALPHA`]). That test sees
//! only the variance within a run. When the two records come from separate
//! runs (they share no `interleaved.group`), whatever drifted between the
//! runs (the machine's load, its clocks, the neighbours on a shared host)
//! moves every point alike and the test cannot tell it from a change. So a
//! difference between separate runs is called `better` or `worse` only
//! beyond the *drift allowance*: the larger of the threshold and three
//! times the median absolute change over all the compared points of
//! separate runs. The median of those changes estimates the shift drift
//! gives a typical point (most points of a change do not move, or the whole
//! run moved alike, which two runs cannot tell from drift); three times it
//! is about two standard deviations of normal drift, so pure drift rarely
//! passes. A significant change inside the allowance is `within drift`.
//! Points of one interleaved run (records sharing `interleaved.group`) saw
//! the same drift, so the test alone decides. A point whose records carry
//! no repetitions (imported from a tool that reports one number) cannot be
//! tested and is never called better or worse, nor is a point whose
//! record on either side passes what its path allows (a measurement fault,
//! `netgap_core::physics`): its verdict is `fault`. A *regression* is a `worse`
//! point whose change is larger than the threshold; the binary exits with
//! [`REGRESSION_EXIT_CODE`] when there is at least one.

use crate::load::{lower_is_better, Loaded};
use crate::stacks::{SelectError, StackSelector};
use netgap_core::stack::Stack;
use netgap_core::text::escape_control;
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Two-sided significance level of the t-test.
pub const ALPHA: f64 = 0.05;

/// Exit status of `netgap compare` when a significant regression passes the
/// threshold (1 is any other error, 2 bad arguments).
pub const REGRESSION_EXIT_CODE: u8 = 3;

/// The drift allowance is this many times the median absolute change of
/// the points compared across separate runs (see the module docs).
pub const DRIFT_MEDIAN_FACTOR: f64 = 3.0;

/// What identifies a point on both sides, apart from its stack.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PointKey {
    /// Test name as the report names it (`sweep (stream)`).
    pub test: String,
    /// Message size, bytes.
    pub size_bytes: u64,
    /// Metric with unit.
    pub metric: String,
    /// Concurrent clients, for multi-client tests.
    pub clients: Option<u32>,
    /// The options that changed what the point measured besides its stack
    /// ([`Loaded::variant`]: `server=apache`, `alpha=0.8`, `pin=0/1`), so
    /// points of nginx and Apache are matched each with its own.
    pub variant: Vec<String>,
}

impl PointKey {
    fn of(l: &Loaded) -> PointKey {
        let r = &l.record;
        PointKey {
            test: l.section(),
            size_bytes: r.size_bytes,
            metric: r.metric.clone(),
            clients: l.record.clients(),
            variant: l.variant.clone(),
        }
    }

    /// Short label for tables: `pingpong tcp, MTU 9000 64 latency_us`, with
    /// the stack's label given.
    pub fn label(&self, stack: &str) -> String {
        let mut s = format!(
            "{} {stack} {} {}",
            self.test,
            netgap_core::units::format_size(self.size_bytes),
            self.metric
        );
        if let Some(c) = self.clients {
            let _ = write!(s, " x{c}");
        }
        for v in &self.variant {
            let _ = write!(s, " {v}");
        }
        s
    }
}

/// The verdict on one matched point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Significantly better (beyond the drift allowance for separate runs).
    Better,
    /// Significantly worse (beyond the drift allowance for separate runs).
    Worse,
    /// No significant difference.
    Same,
    /// Significant within its runs, but not beyond the drift allowance of
    /// separate runs.
    WithinDrift,
    /// No repetitions on one side: not tested.
    Untested,
    /// One side's result passes what its path allows (a measurement
    /// fault): neither better nor worse.
    Fault,
}

impl Verdict {
    /// The word shown in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::Same => "same",
            Verdict::WithinDrift => "within drift",
            Verdict::Untested => "untested",
            Verdict::Fault => "fault",
        }
    }
}

/// One matched point.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The point.
    pub key: PointKey,
    /// The stacks compared, as the table labels them (`tcp, MTU 1500 ->
    /// tcp, MTU 9000` when they differ).
    pub stack: String,
    /// Headline value in BASE, in the metric's unit.
    pub base: f64,
    /// Headline value in NEW, in the metric's unit.
    pub new: f64,
    /// `(new - base) / base`, percent; signed, not direction-adjusted.
    pub change_pct: f64,
    /// Two-sided p-value of Welch's t-test, when both sides have repetitions.
    pub p_value: Option<f64>,
    /// Both records come from one interleaved run (a shared
    /// `interleaved.group`).
    pub interleaved: bool,
    /// The verdict.
    pub verdict: Verdict,
    /// Worse by more than the threshold.
    pub regression: bool,
}

impl Change {
    /// The row's label.
    pub fn label(&self) -> String {
        self.key.label(&self.stack)
    }
}

/// The comparison of two sides.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Matched points, in key order.
    pub changes: Vec<Change>,
    /// Points only in BASE.
    pub only_base: Vec<String>,
    /// Points only in NEW.
    pub only_new: Vec<String>,
    /// The threshold used, percent.
    pub threshold_pct: f64,
    /// The drift allowance applied to points of separate runs, percent;
    /// `None` when every point came from one interleaved run.
    pub drift_allowance_pct: Option<f64>,
    /// Full-sentence warnings for the user: separate runs, stacks paired
    /// although they differ.
    pub warnings: Vec<String>,
}

impl Comparison {
    /// The regressions: significantly worse by more than the threshold.
    pub fn regressions(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.regression)
    }
}

/// What to compare.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CompareOptions {
    /// Smallest change, in percent, that counts as a regression.
    pub threshold_pct: f64,
    /// The stacks of BASE to compare; all when `None`.
    pub base_stack: Option<StackSelector>,
    /// The stacks of NEW to compare; all when `None`.
    pub new_stack: Option<StackSelector>,
}

/// Why two sides cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    /// A stack selection matches nothing.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// Both selections pick the same stacks of one side.
    #[error(
        "--base-stack and --new-stack pick the same stack ({0}); name what sets the two apart"
    )]
    SameStack(String),
    /// Nothing to compare.
    #[error("no point in common")]
    Nothing,
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

/// A pairing of BASE's stacks with NEW's, with a warning for each pair
/// whose stacks differ.
type Pairs = Vec<(Stack, Stack, Option<String>)>;

/// The stacks not paired yet.
struct Unpaired<'a> {
    base: Vec<&'a Stack>,
    new: BTreeSet<&'a Stack>,
}

impl Unpaired<'_> {
    /// Each BASE stack left takes the one NEW stack left that `rule` calls
    /// its counterpart, if there is exactly one; `why` says how they differ.
    fn pass(
        &mut self,
        pairs: &mut Pairs,
        rule: impl Fn(&Stack, &Stack) -> bool,
        why: Option<&str>,
    ) {
        let mut still = Vec::new();
        for b in std::mem::take(&mut self.base) {
            let candidates: Vec<&Stack> = self.new.iter().copied().filter(|n| rule(b, n)).collect();
            match candidates.as_slice() {
                [n] => {
                    let n = *n;
                    self.new.remove(n);
                    let note = why.map(|w| {
                        let l = Stack::distinguishing_labels(&[b, n]);
                        format!("{} in BASE is compared with {} in NEW: {w}.", l[0], l[1])
                    });
                    pairs.push((b.clone(), n.clone(), note));
                }
                _ => still.push(b),
            }
        }
        self.base = still;
    }
}

/// Pairs BASE's stacks with NEW's (see the module docs).
fn pair_stacks(base: &BTreeSet<Stack>, new: &BTreeSet<Stack>, opts: &CompareOptions) -> Pairs {
    let mut pairs = Vec::new();
    let mut left = Unpaired {
        base: Vec::new(),
        new: new.iter().collect(),
    };
    for b in base {
        if left.new.remove(b) {
            pairs.push((b.clone(), b.clone(), None));
        } else {
            left.base.push(b);
        }
    }
    if let (Some(bs), Some(ns)) = (&opts.base_stack, &opts.new_stack) {
        left.pass(&mut pairs, |b, n| bs.rest(b) == ns.rest(n), None);
    }
    let unlabelled = |s: &Stack| Stack {
        label: None,
        ..s.clone()
    };
    left.pass(
        &mut pairs,
        |b, n| unlabelled(b) == unlabelled(n),
        Some("they differ only by label"),
    );
    let pathless = |s: &Stack| Stack {
        label: None,
        path: Default::default(),
        ..s.clone()
    };
    left.pass(
        &mut pairs,
        |b, n| pathless(b) == pathless(n),
        Some("they were measured under different conditions, so each change is the conditions' as much as the runs'"),
    );
    if left.base.len() == 1 && left.new.len() == 1 {
        left.pass(
            &mut pairs,
            |_, _| true,
            Some("they are different stacks, so each change is the stacks' as much as the runs'"),
        );
    }
    pairs
}

/// Compares two sets of records point by point (see the module docs).
pub fn compare(
    base: &[Loaded],
    new: &[Loaded],
    opts: &CompareOptions,
) -> Result<Comparison, CompareError> {
    let base = select(base, opts.base_stack.as_ref(), "--base-stack")?;
    let new = select(new, opts.new_stack.as_ref(), "--new-stack")?;
    let stacks =
        |recs: &[Loaded]| -> BTreeSet<Stack> { recs.iter().map(|l| l.stack.clone()).collect() };
    let (sb, sn) = (stacks(&base), stacks(&new));
    if opts.base_stack.is_some() && opts.new_stack.is_some() && sb == sn && base == new {
        let names: Vec<String> = sb.iter().map(Stack::describe).collect();
        return Err(CompareError::SameStack(names.join("; ")));
    }
    let pairs = pair_stacks(&sb, &sn, opts);
    let names = stack_names(&sb, &sn);
    let (bi, ni) = (index(&base), index(&new));
    let points = match_points(&bi, &ni, &pairs, &names);
    if points.matched.is_empty() {
        return Err(CompareError::Nothing);
    }
    let mut warnings: Vec<String> = pairs.iter().filter_map(|p| p.2.clone()).collect();
    let drift_allowance_pct = drift_allowance(&points.matched, opts.threshold_pct);
    if let Some(allowance) = drift_allowance_pct {
        warnings.insert(0, drift_warning(&points.matched, allowance));
    }
    let mut changes: Vec<Change> = points
        .matched
        .iter()
        .map(|m| judge_change(m, drift_allowance_pct, opts.threshold_pct))
        .collect();
    changes.sort_by(|a, b| a.key.cmp(&b.key).then_with(|| a.stack.cmp(&b.stack)));
    warnings.extend(fault_warning(&changes));
    Ok(Comparison {
        changes,
        only_base: points.only_base,
        only_new: points.only_new,
        threshold_pct: opts.threshold_pct,
        drift_allowance_pct,
        warnings,
    })
}

/// The records of one side that `sel` (given as `flag`) picks; all of
/// them without a selection.
fn select(
    recs: &[Loaded],
    sel: Option<&StackSelector>,
    flag: &str,
) -> Result<Vec<Loaded>, CompareError> {
    let Some(sel) = sel else {
        return Ok(recs.to_vec());
    };
    let picked: Vec<Loaded> = recs
        .iter()
        .filter(|l| sel.matches(&l.stack))
        .cloned()
        .collect();
    if picked.is_empty() {
        return Err(sel.no_match(flag, recs.iter().map(|l| &l.stack)).into());
    }
    Ok(picked)
}

/// The name each stack of either side goes by in the table: what sets it
/// apart from the others shown.
struct StackNames<'a>(BTreeMap<&'a Stack, String>);

impl StackNames<'_> {
    /// The name of `s`; its whole description if it is not shown.
    fn of(&self, s: &Stack) -> String {
        self.0.get(s).cloned().unwrap_or_else(|| s.describe())
    }
}

/// The names of the stacks of both sides.
fn stack_names<'a>(base: &'a BTreeSet<Stack>, new: &'a BTreeSet<Stack>) -> StackNames<'a> {
    let shown: Vec<&Stack> = base
        .iter()
        .chain(new.iter())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    StackNames(
        shown
            .iter()
            .copied()
            .zip(Stack::distinguishing_labels(&shown))
            .collect(),
    )
}

/// One side's records by stack and point; a point a side holds twice
/// keeps the later record.
type Index = BTreeMap<(Stack, PointKey), Loaded>;

/// One side's [`Index`].
fn index(recs: &[Loaded]) -> Index {
    recs.iter()
        .map(|l| ((l.stack.clone(), PointKey::of(l)), l.clone()))
        .collect()
}

/// A point both sides hold, on paired stacks.
struct Matched<'a> {
    key: PointKey,
    /// The stacks as the table labels them.
    stack: String,
    b: &'a Loaded,
    n: &'a Loaded,
}

impl Matched<'_> {
    /// Both records come from one interleaved run.
    fn interleaved(&self) -> bool {
        match (self.b.interleaved_group(), self.n.interleaved_group()) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// `(new - base) / base`, percent; 0 when the base is 0.
    fn change_pct(&self) -> f64 {
        let (bv, nv) = (self.b.record.value, self.n.record.value);
        if bv == 0.0 {
            0.0
        } else {
            100.0 * (nv - bv) / bv.abs()
        }
    }
}

/// The points of BASE matched with NEW's on the paired stacks, and those
/// of either side left without a counterpart, as labels.
struct Points<'a> {
    matched: Vec<Matched<'a>>,
    only_base: Vec<String>,
    only_new: Vec<String>,
}

/// Matches BASE's points with NEW's on the stacks `pairs` pairs.
fn match_points<'a>(
    bi: &'a Index,
    ni: &'a Index,
    pairs: &Pairs,
    names: &StackNames<'_>,
) -> Points<'a> {
    let mut matched = Vec::new();
    let mut used_new: BTreeSet<(Stack, PointKey)> = BTreeSet::new();
    let mut only_base = Vec::new();
    for ((stack, key), bl) in bi {
        let counterpart = pairs.iter().find(|p| p.0 == *stack).map(|p| &p.1);
        let found = counterpart.and_then(|n| ni.get(&(n.clone(), key.clone())).map(|l| (n, l)));
        match found {
            Some((n, nl)) => {
                used_new.insert((n.clone(), key.clone()));
                let label = if n == stack {
                    names.of(stack)
                } else {
                    format!("{} -> {}", names.of(stack), names.of(n))
                };
                matched.push(Matched {
                    key: key.clone(),
                    stack: label,
                    b: bl,
                    n: nl,
                });
            }
            None => only_base.push(key.label(&names.of(stack))),
        }
    }
    let only_new: Vec<String> = ni
        .keys()
        .filter(|k| !used_new.contains(*k))
        .map(|(s, k)| k.label(&names.of(s)))
        .collect();
    Points {
        matched,
        only_base,
        only_new,
    }
}

/// The absolute changes of the points that come from separate runs.
fn separate_changes(matched: &[Matched<'_>]) -> Vec<f64> {
    matched
        .iter()
        .filter(|m| !m.interleaved())
        .map(|m| m.change_pct().abs())
        .filter(|c| c.is_finite())
        .collect()
}

/// The drift allowance, percent, for the points of separate runs (see
/// the module docs); `None` when every point came from one interleaved
/// run.
fn drift_allowance(matched: &[Matched<'_>], threshold_pct: f64) -> Option<f64> {
    let separate = separate_changes(matched);
    (!separate.is_empty()).then(|| {
        let median = netgap_core::stats::median(&separate).unwrap_or(0.0);
        threshold_pct.max(DRIFT_MEDIAN_FACTOR * median)
    })
}

/// The warning that points come from separate runs, with the allowance
/// they are judged by.
fn drift_warning(matched: &[Matched<'_>], allowance: f64) -> String {
    let separate = separate_changes(matched);
    let runs = if separate.len() == matched.len() {
        "BASE and NEW come from separate runs".to_string()
    } else {
        format!(
            "{} of the {} points come from separate runs",
            separate.len(),
            matched.len()
        )
    };
    format!(
        "{runs}, so drift between the runs is not in Welch's test (it sees only the variance within each run); \
         a difference counts only beyond a drift allowance of {allowance:.1}% (the larger of --threshold and {DRIFT_MEDIAN_FACTOR} times \
         the median change over those {} points); measure the stacks in one interleaved run to compare them directly.",
        separate.len()
    )
}

/// The verdict on one matched point: a fault, untested, the same, within
/// the drift allowance, better or worse; and a regression when worse by
/// more than the threshold.
fn judge_change(m: &Matched<'_>, drift_allowance_pct: Option<f64>, threshold_pct: f64) -> Change {
    let (bv, nv) = (m.b.record.value, m.n.record.value);
    let change_pct = m.change_pct();
    let p_value = welch_p_value(m.b.reps(), m.n.reps());
    let improved = if lower_is_better(&m.key.metric) {
        nv < bv
    } else {
        nv > bv
    };
    let inter = m.interleaved();
    let beyond_drift = inter || drift_allowance_pct.is_none_or(|a| change_pct.abs() > a);
    let faulted = m.b.record.fault().is_some() || m.n.record.fault().is_some();
    let verdict = match p_value {
        _ if faulted => Verdict::Fault,
        None => Verdict::Untested,
        Some(p) if p >= ALPHA || nv == bv => Verdict::Same,
        Some(_) if !beyond_drift => Verdict::WithinDrift,
        Some(_) if improved => Verdict::Better,
        Some(_) => Verdict::Worse,
    };
    Change {
        key: m.key.clone(),
        stack: m.stack.clone(),
        base: bv,
        new: nv,
        change_pct,
        p_value,
        interleaved: inter,
        verdict,
        regression: verdict == Verdict::Worse && change_pct.abs() > threshold_pct,
    }
}

/// The warning naming the points judged a fault, if any.
fn fault_warning(changes: &[Change]) -> Option<String> {
    let faulted: Vec<String> = changes
        .iter()
        .filter(|c| c.verdict == Verdict::Fault)
        .map(Change::label)
        .collect();
    (!faulted.is_empty()).then(|| {
        format!(
            "{} points are past what their path allows on one side (a measurement fault) and are neither better nor worse: {}.",
            faulted.len(),
            faulted.join(", ")
        )
    })
}

/// The comparison as a text table with a closing summary line. The
/// labels come from results files, so their control characters are
/// escaped ([`escape_control`]): a label cannot drive the terminal.
pub fn render(c: &Comparison) -> String {
    let mut out = String::new();
    let labels: Vec<String> = c
        .changes
        .iter()
        .map(|ch| escape_control(&ch.label()).into_owned())
        .collect();
    let width = labels
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        out,
        "{:<width$}  {:>12}  {:>12}  {:>8}  {:>8}  verdict",
        "point", "base", "new", "change", "p"
    );
    for (ch, label) in c.changes.iter().zip(&labels) {
        let p = ch
            .p_value
            .map_or_else(|| "-".to_string(), |p| format!("{p:.3}"));
        let flag = if ch.regression { "  REGRESSION" } else { "" };
        let _ = writeln!(
            out,
            "{:<width$}  {:>12.4}  {:>12.4}  {:>+7.1}%  {:>8}  {}{flag}",
            label,
            ch.base,
            ch.new,
            ch.change_pct,
            p,
            ch.verdict.as_str()
        );
    }
    for k in &c.only_base {
        let _ = writeln!(out, "only in base: {}", escape_control(k));
    }
    for k in &c.only_new {
        let _ = writeln!(out, "only in new: {}", escape_control(k));
    }
    let count = |v: Verdict| c.changes.iter().filter(|ch| ch.verdict == v).count();
    let faulted = match count(Verdict::Fault) {
        0 => String::new(),
        n => format!(", {n} faulted"),
    };
    let drift = match c.drift_allowance_pct {
        Some(a) => format!(
            ", {} within the drift allowance of {a:.1}%",
            count(Verdict::WithinDrift)
        ),
        None => ", all from one interleaved run".to_string(),
    };
    let _ = writeln!(
        out,
        "{} points: {} better, {} worse, {} same, {} untested{faulted} (Welch's t-test, p < {ALPHA}){drift}; {} regressions beyond {}%",
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
