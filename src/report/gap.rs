//! The gap table: for each test, metric and size band, the best stack and
//! every other stack as a ratio to it, with the 95% confidence intervals of
//! the repetitions deciding whether each gap is real or noise.
//!
//! Bands: *small* is under 1 KiB, *medium* under 64 KiB, *large* 64 KiB and
//! up. Within a band a stack's value is the geometric mean of its headline
//! values over the sizes every stack of the band measured (so no stack gains
//! from sizes the others skipped); when they share no size, each stack's own
//! sizes are used and the row says so. The best stack has the lowest value
//! for latency-like metrics (`_us`, `_ns`) and the highest otherwise. A gap
//! at one size is *real* when the two 95% confidence intervals are disjoint
//! and *noise* when they overlap; the band's verdict is "real" or "within
//! noise" when every shared size agrees, else it counts the real ones.
//! Multi-client points are compared per number of clients.

use super::load::{lower_is_better, Loaded};
use super::plots::{several_hosts, stack_label};
use std::collections::{BTreeMap, BTreeSet};
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
    /// Geometric mean of its values over the compared sizes, metric's unit.
    pub value: f64,
    /// `value / best value`; 1 for the best.
    pub ratio: f64,
    /// `best`, `real`, `within noise`, `real at k of n sizes`, or `no
    /// confidence interval` when a side has no repetitions.
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
    /// Sizes compared, bytes; empty when the stacks share none.
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
        let mut shared: Option<BTreeSet<u64>> = None;
        for pts in stacks.values() {
            let sizes: BTreeSet<u64> = pts.keys().copied().collect();
            shared = Some(match shared {
                None => sizes,
                Some(s) => s.intersection(&sizes).copied().collect(),
            });
        }
        let shared: Vec<u64> = shared.unwrap_or_default().into_iter().collect();
        let geo = |pts: &BTreeMap<u64, (f64, Ci)>| -> f64 {
            let vals: Vec<f64> = if shared.is_empty() {
                pts.values().map(|v| v.0).collect()
            } else {
                shared.iter().filter_map(|s| pts.get(s).map(|v| v.0)).collect()
            };
            let n = vals.len().max(1) as f64;
            (vals.iter().map(|v| v.ln()).sum::<f64>() / n).exp()
        };
        let mut ranked: Vec<(&String, f64)> = stacks.iter().map(|(k, p)| (k, geo(p))).collect();
        let lower = lower_is_better(&metric);
        ranked.sort_by(|a, b| {
            let o = a.1.total_cmp(&b.1);
            (if lower { o } else { o.reverse() }).then_with(|| a.0.cmp(b.0))
        });
        let (best_name, best_value) = (ranked[0].0, ranked[0].1);
        let best_pts = &stacks[best_name];
        let rows = ranked
            .iter()
            .map(|(name, value)| {
                let verdict = if *name == best_name {
                    "best".to_string()
                } else if shared.is_empty() {
                    "sizes differ: not tested".to_string()
                } else {
                    verdict(&shared, &stacks[*name], best_pts)
                };
                GapRow {
                    stack: (*name).clone(),
                    value: *value,
                    ratio: value / best_value,
                    verdict,
                }
            })
            .collect();
        out.push(GapEntry {
            test,
            metric,
            band,
            sizes: shared,
            rows,
        });
    }
    out
}

fn verdict(
    sizes: &[u64],
    a: &BTreeMap<u64, (f64, Ci)>,
    b: &BTreeMap<u64, (f64, Ci)>,
) -> String {
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
                .map(|r| format!("{} {} ({})", r.stack, ratio_words(r.ratio, &e.metric), r.verdict))
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
        let sizes: Vec<String> = e.sizes.iter().map(|s| crate::units::format_size(*s)).collect();
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
