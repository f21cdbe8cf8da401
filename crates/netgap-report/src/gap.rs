//! The gap tables: for each test, metric and size band, every stack against
//! a baseline stack (`--baseline`, by default the host TCP stack with event
//! completion), with significance deciding whether each gap is real or
//! noise.
//!
//! Bands: *small* is under 1 KiB, *medium* under 64 KiB, *large* 64 KiB and
//! up. Multi-client tests are compared over their numbers of clients
//! instead of sizes (one entry per message size). A stack is only ever
//! compared directly with the baseline, on the sizes (or client counts)
//! both measured, so no stack gains from sizes another skipped and a peer
//! tool that measured other sizes still compares: its ratio is the
//! geometric mean of the per-size ratios. At one size a gap is *real* when
//! Welch's t-test on the two stacks' repetitions finds a difference (p <
//! 0.05), or, for records that carry a confidence interval but no
//! repetitions, when the two 95% intervals are disjoint; *noise* otherwise.
//! The row's verdict over its shared sizes is "real" or "within noise" when
//! every size agrees, else it counts the real ones; ", interleaved" when
//! every shared point of both stacks was measured in one interleaved run,
//! so that drift between runs cannot be what sets them apart. When a test has no
//! stack the baseline names, or a band lacks it, the band's rows are
//! against the best stack instead (the one that beats the most others in
//! such direct comparisons), and the entry says so.

use super::compare::{welch_p_value, ALPHA};
use super::load::{lower_is_better, Loaded};
use super::plots::Labels;
use super::stacks::{Baseline, SeriesKey};
use netgap_core::units::format_size;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Upper bound (exclusive) of the small band, bytes.
pub(crate) const SMALL_BELOW_BYTES: u64 = 1024;
/// Upper bound (exclusive) of the medium band, bytes.
pub(crate) const MEDIUM_BELOW_BYTES: u64 = 64 * 1024;

/// A message-size band, or the client counts of a multi-client test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Band {
    /// Under 1 KiB.
    Small,
    /// 1 KiB up to 64 KiB.
    Medium,
    /// 64 KiB and up.
    Large,
    /// Every number of clients of a multi-client test at one size.
    Clients,
}

impl Band {
    /// The band of a size in bytes.
    pub fn of(size_bytes: u64) -> Band {
        if size_bytes < SMALL_BELOW_BYTES {
            Band::Small
        } else if size_bytes < MEDIUM_BELOW_BYTES {
            Band::Medium
        } else {
            Band::Large
        }
    }

    /// The band's name with its limits.
    pub fn as_str(self) -> &'static str {
        match self {
            Band::Small => "small (<1K)",
            Band::Medium => "medium (1K-64K)",
            Band::Large => "large (>=64K)",
            Band::Clients => "by clients",
        }
    }
}

/// One stack in one band.
#[derive(Debug, Clone, PartialEq)]
pub struct GapRow {
    /// The stack's label.
    pub stack: String,
    /// Geometric mean of its values over the points it shares with the
    /// reference (all its points for the reference), in the metric's unit.
    pub value: f64,
    /// Geometric mean of its per-point ratios to the reference on the
    /// points both measured; 1 for the reference, NaN when they share none.
    pub ratio: f64,
    /// `baseline` (or `best`, when the rows are against the best),
    /// `real`, `within noise`, `real at k of n sizes`, `no confidence
    /// interval` when a side has neither repetitions nor an interval, or
    /// `no size in common`.
    pub verdict: String,
    /// Whether this stack beats the most others of the band in direct
    /// comparisons.
    pub best: bool,
}

/// One test, metric and band.
#[derive(Debug, Clone, PartialEq)]
pub struct GapEntry {
    /// Test name (with the size for multi-client tests measured at several).
    pub test: String,
    /// Metric with unit.
    pub metric: String,
    /// The band.
    pub band: Band,
    /// The reference's points in the band: sizes in bytes, or client counts
    /// for [`Band::Clients`].
    pub sizes: Vec<u64>,
    /// The reference stack's label.
    pub reference: String,
    /// Whether the reference is the baseline (`false`: no baseline stack in
    /// this band, so the rows are against the best).
    pub against_baseline: bool,
    /// The stacks, reference first, then best to worst.
    pub rows: Vec<GapRow>,
}

/// One measured point as the table uses it.
#[derive(Debug, Clone)]
struct Pt {
    value: f64,
    ci: Option<(f64, f64)>,
    reps: Vec<f64>,
    /// The interleaved run the point was measured in, if any.
    group: Option<String>,
}

type Points = BTreeMap<u64, Pt>;

/// Builds the gap tables of one test's records (labelled by `labels`)
/// against `baseline`; bands with a single stack are left out.
pub fn gap_table(recs: &[&Loaded], labels: &Labels, baseline: &Baseline) -> Vec<GapEntry> {
    // (test, size of a multi-client point, metric, band) -> series -> x -> point
    type Group = (String, Option<u64>, String, Band);
    let mut groups: BTreeMap<Group, BTreeMap<SeriesKey, Points>> = BTreeMap::new();
    let sizes_of_clients: BTreeSet<u64> = recs
        .iter()
        .filter(|l| l.record.clients().is_some())
        .map(|l| l.record.size_bytes)
        .collect();
    for l in recs {
        let r = &l.record;
        // A measurement fault is no point to compare (the report's notes
        // list it).
        if !r.value.is_finite() || r.value <= 0.0 || r.fault().is_some() {
            continue;
        }
        let (size, band, x) = match l.record.clients() {
            Some(c) => (Some(r.size_bytes), Band::Clients, u64::from(c)),
            None => (None, Band::of(r.size_bytes), r.size_bytes),
        };
        groups
            .entry((l.section(), size, r.metric.clone(), band))
            .or_default()
            .entry(SeriesKey::of(l))
            .or_default()
            .insert(
                x,
                Pt {
                    value: r.value,
                    ci: l.ci95(),
                    reps: l.reps().to_vec(),
                    group: l.interleaved_group().map(str::to_string),
                },
            );
    }
    let mut out = Vec::new();
    for ((test, size, metric, band), stacks) in groups {
        if stacks.len() < 2 {
            continue;
        }
        let test = match size {
            Some(s) if sizes_of_clients.len() > 1 => format!("{test} at {}", format_size(s)),
            _ => test,
        };
        let lower = lower_is_better(&metric);
        let best = best_of(&stacks, lower);
        let base = stacks.keys().find(|k| baseline.matches(&k.stack));
        let (reference, against_baseline) = match base {
            Some(b) => (b, true),
            None => match &best {
                Some(b) => (b, false),
                None => continue,
            },
        };
        let ref_pts = &stacks[reference];
        let label = |k: &SeriesKey| labels.get(k).cloned().unwrap_or_else(|| k.stack.describe());
        let mut rows: Vec<GapRow> = stacks
            .iter()
            .map(|(key, pts)| {
                let shared: Vec<u64> = pts
                    .keys()
                    .filter(|s| ref_pts.contains_key(s))
                    .copied()
                    .collect();
                let (value, ratio, verdict) = if key == reference {
                    let word = if against_baseline { "baseline" } else { "best" };
                    (
                        geo_mean(pts.values().map(|v| v.value)),
                        1.0,
                        word.to_string(),
                    )
                } else if shared.is_empty() {
                    (
                        geo_mean(pts.values().map(|v| v.value)),
                        f64::NAN,
                        "no size in common".to_string(),
                    )
                } else {
                    (
                        geo_mean(shared.iter().map(|s| pts[s].value)),
                        ratio_on_shared(pts, ref_pts).unwrap_or(f64::NAN),
                        verdict(&shared, pts, ref_pts, band),
                    )
                };
                GapRow {
                    stack: label(key),
                    value,
                    ratio,
                    verdict,
                    best: best.as_ref() == Some(key),
                }
            })
            .collect();
        // Reference first, then best to worst, unknown ratios at the end.
        rows.sort_by(|a, b| {
            let key = |r: &GapRow| {
                let k = if lower { r.ratio } else { 1.0 / r.ratio };
                (
                    !(r.verdict == "baseline" || r.verdict == "best"),
                    if k.is_nan() { f64::INFINITY } else { k },
                )
            };
            let (ka, kb) = (key(a), key(b));
            ka.0.cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then_with(|| a.stack.cmp(&b.stack))
        });
        out.push(GapEntry {
            test,
            metric,
            band,
            sizes: ref_pts.keys().copied().collect(),
            reference: label(reference),
            against_baseline,
            rows,
        });
    }
    out
}

/// The stack that beats the most others in direct comparisons on the
/// points both measured (fewest losses on a tie, then order). Chaining
/// ratios through a third stack would carry that stack's noise into every
/// row, so only pairs are compared.
fn best_of(stacks: &BTreeMap<SeriesKey, Points>, lower: bool) -> Option<SeriesKey> {
    let names: Vec<&SeriesKey> = stacks.keys().collect();
    let mut score: BTreeMap<&SeriesKey, i64> = BTreeMap::new();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            let Some(r) = ratio_on_shared(&stacks[*a], &stacks[*b]) else {
                continue;
            };
            if r == 1.0 {
                continue;
            }
            let a_better = if lower { r < 1.0 } else { r > 1.0 };
            let (w, l) = if a_better { (*a, *b) } else { (*b, *a) };
            *score.entry(w).or_default() += 1;
            *score.entry(l).or_default() -= 1;
        }
    }
    names
        .iter()
        .copied()
        .max_by(|a, b| {
            let (sa, sb) = (
                score.get(a).copied().unwrap_or_default(),
                score.get(b).copied().unwrap_or_default(),
            );
            sa.cmp(&sb).then_with(|| b.cmp(a))
        })
        .cloned()
}

/// Geometric mean of positive values; NaN for none.
fn geo_mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v.ln(), n + 1));
    if n == 0 {
        f64::NAN
    } else {
        (sum / n as f64).exp()
    }
}

/// Geometric mean of `a / b` over the points both measured; `None` if none.
fn ratio_on_shared(a: &Points, b: &Points) -> Option<f64> {
    let ratios: Vec<f64> = a
        .iter()
        .filter_map(|(s, p)| b.get(s).map(|q| p.value / q.value))
        .collect();
    (!ratios.is_empty()).then(|| geo_mean(ratios.into_iter()))
}

/// Whether two points differ beyond their noise: Welch's test on the
/// repetitions when both have them, else disjoint confidence intervals;
/// `None` when neither can be judged.
fn significant(a: &Pt, b: &Pt) -> Option<bool> {
    if let Some(p) = welch_p_value(&a.reps, &b.reps) {
        return Some(p < ALPHA && a.value != b.value);
    }
    let (x, y) = (a.ci?, b.ci?);
    Some(x.1 < y.0 || y.1 < x.0)
}

fn verdict(shared: &[u64], a: &Points, b: &Points, band: Band) -> String {
    let (mut real, mut judged) = (0, 0);
    for s in shared {
        let (Some(x), Some(y)) = (a.get(s), b.get(s)) else {
            continue;
        };
        if let Some(r) = significant(x, y) {
            judged += 1;
            real += usize::from(r);
        }
    }
    let what = if band == Band::Clients {
        "client counts"
    } else {
        "sizes"
    };
    let word = match real {
        _ if judged == 0 => return "no confidence interval".into(),
        0 => "within noise".to_string(),
        r if r == judged => "real".to_string(),
        r => format!("real at {r} of {judged} {what}"),
    };
    // Points of one interleaved run saw the same drift; others may differ
    // by whatever drifted between their runs, which no test here sees.
    let interleaved = shared.iter().all(|s| match (a.get(s), b.get(s)) {
        (Some(x), Some(y)) => x.group.is_some() && x.group == y.group,
        _ => false,
    });
    let word = if interleaved {
        format!("{word}, interleaved")
    } else {
        word
    };
    match shared.len() - judged {
        0 => word,
        n => format!(
            "{word}; {n} of {} {what} without a confidence interval",
            shared.len()
        ),
    }
}

/// One sentence per entry: each stack against the reference, and who is
/// best.
pub(crate) fn conclusions(entries: &[GapEntry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| {
            let (reference, rest) = e.rows.split_first()?;
            let others: Vec<String> = rest
                .iter()
                .map(|r| {
                    if r.ratio.is_finite() {
                        format!(
                            "{} {} ({})",
                            r.stack,
                            ratio_words(r.ratio, &e.metric),
                            r.verdict
                        )
                    } else {
                        format!("{} ({})", r.stack, r.verdict)
                    }
                })
                .collect();
            let best = e
                .rows
                .iter()
                .find(|r| r.best)
                .map(|r| format!(" Best: {}.", r.stack))
                .unwrap_or_default();
            let against = if e.against_baseline {
                "baseline"
            } else {
                "best (no baseline stack here)"
            };
            Some(format!(
                "{} {} {}: against {} {}: {}.{best}",
                e.test,
                e.metric,
                e.band.as_str(),
                against,
                reference.stack,
                others.join("; "),
            ))
        })
        .collect()
}

/// `2.10x the latency` style wording of a ratio to the reference.
pub(crate) fn ratio_words(ratio: f64, metric: &str) -> String {
    if lower_is_better(metric) {
        format!("at {ratio:.2}x")
    } else {
        format!("at {:.0}%", ratio * 100.0)
    }
}

/// The points of an entry as text: sizes (`1K`) or client counts.
pub(crate) fn points_text(e: &GapEntry) -> String {
    e.sizes
        .iter()
        .map(|s| {
            if e.band == Band::Clients {
                s.to_string()
            } else {
                format_size(*s)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The gap tables as aligned text (also the snapshot tests' form).
pub fn render_text(entries: &[GapEntry]) -> String {
    let mut out = String::new();
    for e in entries {
        let what = if e.band == Band::Clients {
            "clients"
        } else {
            "sizes"
        };
        let _ = writeln!(
            out,
            "{} {} {} {what} [{}]",
            e.test,
            e.metric,
            e.band.as_str(),
            points_text(e)
        );
        for r in &e.rows {
            let ratio = if r.ratio.is_finite() {
                format!("{:.3}x", r.ratio)
            } else {
                "-".to_string()
            };
            let best = if r.best { " (best)" } else { "" };
            let _ = writeln!(
                out,
                "  {:<32} {:>12.4} {:>9}  {}{best}",
                r.stack, r.value, ratio, r.verdict
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_split_at_1k_and_64k() {
        assert_eq!(Band::of(1023), Band::Small);
        assert_eq!(Band::of(1024), Band::Medium);
        assert_eq!(Band::of(65535), Band::Medium);
        assert_eq!(Band::of(65536), Band::Large);
    }

    fn pt(value: f64, reps: &[f64]) -> Pt {
        Pt {
            value,
            ci: None,
            reps: reps.to_vec(),
            group: None,
        }
    }

    #[test]
    fn one_repetition_is_not_a_confidence_interval() {
        let (a, b) = (pt(1.0, &[1.0]), pt(1.01, &[1.01]));
        assert_eq!(significant(&a, &b), None);
        let (a, b) = (pt(1.0, &[0.99, 1.0, 1.01]), pt(1.5, &[1.49, 1.5, 1.51]));
        assert_eq!(significant(&a, &b), Some(true));
    }
}
