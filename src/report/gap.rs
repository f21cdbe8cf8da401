//! The gap table: for each test, metric and size band, the best stack and
//! every other stack as a ratio to it, with the 95% confidence intervals of
//! the repetitions deciding whether each gap is real or noise.
//!
//! Bands: *small* is under 1 KiB, *medium* under 64 KiB, *large* 64 KiB and
//! up. Within a band the stack with the most sizes is the reference; each
//! stack's standing is the geometric mean of its value over the reference's
//! at the sizes both measured (so no stack gains from sizes another skipped,
//! and a peer tool's different sizes still compare), and a stack sharing no
//! size with the reference is left out. The best stack has the lowest
//! standing for latency-like metrics (`_us`, `_ns`) and the highest
//! otherwise; every ratio is to it. A gap at one size is *real* when the two
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
pub const SMALL_BELOW_BYTES: u64 = 1024;
/// Upper bound (exclusive) of the medium band, bytes.
pub const MEDIUM_BELOW_BYTES: u64 = 64 * 1024;

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
    /// Geometric mean of its values over the sizes it shares with the band's
    /// reference stack, in the metric's unit.
    pub value: f64,
    /// Its standing over the best's (geometric mean of per-size ratios to
    /// the reference, divided by the best's); 1 for the best.
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
    /// Sizes of the band's reference stack, bytes.
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
        let ci = r.stats.as_ref().map(|s| (s.ci95_low, s.ci95_high));
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
        // The reference is the stack with the most sizes in the band; every
        // stack is measured against it on the sizes both have, so a peer tool
        // that measured other sizes still gets a fair ratio.
        let Some((_, ref_pts)) = stacks
            .iter()
            .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(a.0)))
        else {
            continue;
        };
        let mut ranked: Vec<(&String, f64, f64)> = Vec::new();
        for (name, pts) in &stacks {
            let both: Vec<u64> = pts
                .keys()
                .filter(|s| ref_pts.contains_key(s))
                .copied()
                .collect();
            if both.is_empty() {
                continue;
            }
            let n = both.len() as f64;
            let ln_ratio = both
                .iter()
                .map(|s| (pts[s].0 / ref_pts[s].0).ln())
                .sum::<f64>()
                / n;
            let ln_value = both.iter().map(|s| pts[s].0.ln()).sum::<f64>() / n;
            ranked.push((name, ln_ratio.exp(), ln_value.exp()));
        }
        if ranked.len() < 2 {
            continue;
        }
        let lower = lower_is_better(&metric);
        ranked.sort_by(|a, b| {
            let o = a.1.total_cmp(&b.1);
            (if lower { o } else { o.reverse() }).then_with(|| a.0.cmp(b.0))
        });
        let (best_name, best_ratio) = (ranked[0].0, ranked[0].1);
        let best_pts = &stacks[best_name];
        let rows = ranked
            .iter()
            .map(|(name, ratio, value)| {
                let pts = &stacks[*name];
                let with_best: Vec<u64> = pts
                    .keys()
                    .filter(|s| best_pts.contains_key(s))
                    .copied()
                    .collect();
                let verdict = if *name == best_name {
                    "best".to_string()
                } else if with_best.is_empty() {
                    "no size in common with the best".to_string()
                } else {
                    verdict(&with_best, pts, best_pts)
                };
                GapRow {
                    stack: (*name).clone(),
                    value: *value,
                    ratio: ratio / best_ratio,
                    verdict,
                }
            })
            .collect();
        let sizes: Vec<u64> = ref_pts.keys().copied().collect();
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
pub fn conclusions(entries: &[GapEntry]) -> Vec<String> {
    entries
        .iter()
        .map(|e| {
            let best = &e.rows[0];
            let others: Vec<String> = e.rows[1..]
                .iter()
                .map(|r| {
                    format!(
                        "{} {} ({})",
                        r.stack,
                        ratio_words(r.ratio, &e.metric),
                        r.verdict
                    )
                })
                .collect();
            format!(
                "{} {} {}: {} is best; {}.",
                e.test,
                e.metric,
                e.band.as_str(),
                best.stack,
                others.join("; ")
            )
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
            .map(|s| crate::units::format_size(*s))
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
            let _ = writeln!(
                out,
                "  {:<24} {:>12.4} {:>8.3}x  {}",
                r.stack, r.value, r.ratio, r.verdict
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
