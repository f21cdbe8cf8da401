//! The gap table: for each test, metric and size band, the best stack and
//! every other stack as a ratio to it, with the 95% confidence intervals of
//! the repetitions deciding whether each gap is real or noise.
//!
//! Bands: *small* is under 1 KiB, *medium* under 64 KiB, *large* 64 KiB and
//! up. Stacks are only ever compared directly, on the sizes both measured
//! (so no stack gains from sizes another skipped, and a peer tool that
//! measured other sizes still compares): the ratio of two stacks is the
//! geometric mean of their per-size ratios. The best stack is the one that
//! beats the most others in these pairwise comparisons (lower is better for
//! latency-like metrics, `_us` and `_ns`, higher otherwise), and every row
//! is its ratio to the best. A gap at one size is *real* when the two
//! stacks' 95% confidence intervals are disjoint and *noise* when they
//! overlap; the row's verdict, over the sizes it shares with the best, is
//! "real" or "within noise" when every size agrees, else it counts the real
//! ones.
//! Multi-client points are compared per number of clients.

use super::load::{lower_is_better, Loaded};
use super::plots::{several_hosts, stack_label};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Upper bound (exclusive) of the small band, bytes.
pub(crate) const SMALL_BELOW_BYTES: u64 = 1024;
/// Upper bound (exclusive) of the medium band, bytes.
pub(crate) const MEDIUM_BELOW_BYTES: u64 = 64 * 1024;

/// A message-size band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Band {
    /// Under 1 KiB.
    Small,
    /// 1 KiB up to 64 KiB.
    Medium,
    /// 64 KiB and up.
    Large,
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
        }
    }
}

/// One stack in one band.
#[derive(Debug, Clone, PartialEq)]
pub struct GapRow {
    /// The stack's label.
    pub stack: String,
    /// Geometric mean of its values over the sizes it shares with the best
    /// (all its sizes for the best), in the metric's unit.
    pub value: f64,
    /// Geometric mean of its per-size ratios to the best on the sizes both
    /// measured; 1 for the best, NaN when they share no size.
    pub ratio: f64,
    /// `best`, `real`, `within noise`, `real at k of n sizes`, `no
    /// confidence interval` when a side has no repetitions, or `no size in
    /// common with the best`.
    pub verdict: String,
}

/// One test, metric and band.
#[derive(Debug, Clone, PartialEq)]
pub struct GapEntry {
    /// Test name (with the number of clients for multi-client points).
    pub test: String,
    /// Metric with unit.
    pub metric: String,
    /// The band.
    pub band: Band,
    /// Sizes the best stack measured in the band, bytes.
    pub sizes: Vec<u64>,
    /// The stacks, best first.
    pub rows: Vec<GapRow>,
}

type Ci = Option<(f64, f64)>;

/// Builds the gap table of `records`; bands with a single stack are left out.
pub fn gap_table(records: &[Loaded]) -> Vec<GapEntry> {
    let hosts = several_hosts(records);
    // (test, metric, band) -> stack -> size -> (value, ci)
    type Points = BTreeMap<String, BTreeMap<u64, (f64, Ci)>>;
    let mut groups: BTreeMap<(String, Option<u32>, String, Band), Points> = BTreeMap::new();
    for l in records {
        let r = &l.record;
        if !r.value.is_finite() || r.value <= 0.0 {
            continue;
        }
        let ci = r
            .stats
            .as_ref()
            .and_then(|s| Some((s.ci95_low?, s.ci95_high?)));
        groups
            .entry((
                r.test.clone(),
                l.extras.clients,
                r.metric.clone(),
                Band::of(r.size_bytes),
            ))
            .or_default()
            .entry(stack_label(l, hosts))
            .or_default()
            .insert(r.size_bytes, (r.value, ci));
    }
    let mut out = Vec::new();
    for ((test, clients, metric, band), stacks) in groups {
        if stacks.len() < 2 {
            continue;
        }
        let test = match clients {
            Some(c) => format!("{test} x{c} clients"),
            None => test,
        };
        let lower = lower_is_better(&metric);
        // The best is found by direct comparisons only: every pair of stacks
        // is compared on the sizes both measured, and the stack that beats
        // the most others (fewest losses on a tie, then name) is the best.
        // Chaining ratios through a third stack would carry that stack's
        // noise into every row.
        let names: Vec<&String> = stacks.keys().collect();
        let mut score: BTreeMap<&String, (i64, i64)> = BTreeMap::new();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                let Some(r) = ratio_on_shared(&stacks[*a], &stacks[*b]) else {
                    continue;
                };
                let a_better = if lower { r < 1.0 } else { r > 1.0 };
                if r == 1.0 {
                    continue;
                }
                let (w, l) = if a_better { (*a, *b) } else { (*b, *a) };
                score.entry(w).or_default().0 += 1;
                score.entry(l).or_default().1 += 1;
            }
        }
        let Some(best_name) = names.iter().copied().max_by(|a, b| {
            let (sa, sb) = (
                score.get(a).copied().unwrap_or_default(),
                score.get(b).copied().unwrap_or_default(),
            );
            (sa.0 - sa.1).cmp(&(sb.0 - sb.1)).then_with(|| b.cmp(a))
        }) else {
            continue;
        };
        let best_pts = &stacks[best_name];
        let mut rows: Vec<GapRow> = names
            .iter()
            .map(|name| {
                let pts = &stacks[*name];
                let with_best: Vec<u64> = pts
                    .keys()
                    .filter(|s| best_pts.contains_key(s))
                    .copied()
                    .collect();
                let (value, ratio, verdict) = if *name == best_name {
                    (geo_mean(pts.values().map(|v| v.0)), 1.0, "best".to_string())
                } else if with_best.is_empty() {
                    (
                        geo_mean(pts.values().map(|v| v.0)),
                        f64::NAN,
                        "no size in common with the best".to_string(),
                    )
                } else {
                    (
                        geo_mean(with_best.iter().map(|s| pts[s].0)),
                        ratio_on_shared(pts, best_pts).unwrap_or(f64::NAN),
                        verdict(&with_best, pts, best_pts),
                    )
                };
                GapRow {
                    stack: (*name).clone(),
                    value,
                    ratio,
                    verdict,
                }
            })
            .collect();
        // Best first, then by ratio (worst last), unknown ratios at the end.
        rows.sort_by(|a, b| {
            let key = |r: &GapRow| {
                let k = if lower { r.ratio } else { 1.0 / r.ratio };
                (
                    r.verdict != "best",
                    if k.is_nan() { f64::INFINITY } else { k },
                )
            };
            let (ka, kb) = (key(a), key(b));
            ka.0.cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then_with(|| a.stack.cmp(&b.stack))
        });
        let sizes: Vec<u64> = best_pts.keys().copied().collect();
        out.push(GapEntry {
            test,
            metric,
            band,
            sizes,
            rows,
        });
    }
    out
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

/// Geometric mean of `a / b` over the sizes both measured; `None` if none.
fn ratio_on_shared(a: &BTreeMap<u64, (f64, Ci)>, b: &BTreeMap<u64, (f64, Ci)>) -> Option<f64> {
    let ratios: Vec<f64> = a
        .iter()
        .filter_map(|(s, (v, _))| b.get(s).map(|(w, _)| v / w))
        .collect();
    (!ratios.is_empty()).then(|| geo_mean(ratios.into_iter()))
}

fn verdict(sizes: &[u64], a: &BTreeMap<u64, (f64, Ci)>, b: &BTreeMap<u64, (f64, Ci)>) -> String {
    let mut real = 0;
    for s in sizes {
        let (Some((_, Some(x))), Some((_, Some(y)))) = (a.get(s), b.get(s)) else {
            return "no confidence interval".into();
        };
        if x.1 < y.0 || y.1 < x.0 {
            real += 1;
        }
    }
    match real {
        0 => "within noise".into(),
        r if r == sizes.len() => "real".into(),
        r => format!("real at {r} of {} sizes", sizes.len()),
    }
}

/// One sentence per entry: who wins, by how much, where.
pub(crate) fn conclusions(entries: &[GapEntry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| {
            let (best, rest) = e.rows.split_first()?;
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
            Some(format!(
                "{} {} {}: {} is best; {}.",
                e.test,
                e.metric,
                e.band.as_str(),
                best.stack,
                others.join("; ")
            ))
        })
        .collect()
}

/// `2.10x the latency` style wording of a ratio to the best.
fn ratio_words(ratio: f64, metric: &str) -> String {
    if lower_is_better(metric) {
        format!("{ratio:.2}x the best")
    } else {
        format!("{:.0}% of the best", ratio * 100.0)
    }
}

/// The gap table as aligned text (also the snapshot tests' form).
pub fn render_text(entries: &[GapEntry]) -> String {
    let mut out = String::new();
    for e in entries {
        let sizes: Vec<String> = e
            .sizes
            .iter()
            .map(|s| netgap_core::units::format_size(*s))
            .collect();
        let _ = writeln!(
            out,
            "{} {} {} sizes [{}]",
            e.test,
            e.metric,
            e.band.as_str(),
            sizes.join(" ")
        );
        for r in &e.rows {
            let ratio = if r.ratio.is_finite() {
                format!("{:.3}x", r.ratio)
            } else {
                "-".to_string()
            };
            let _ = writeln!(
                out,
                "  {:<24} {:>12.4} {:>9}  {}",
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
}
