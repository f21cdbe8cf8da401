//! The statistical method behind every reported number. Each point is
//! measured a number of times (repetitions, 10 by default) and summarized by
//! a [`Summary`]: the headline value is the mean after dropping the single
//! highest and single lowest repetition (when there are at least three), so
//! one disturbed repetition cannot move it much; alongside it go the minimum,
//! median, maximum, sample standard deviation, a 95% Student-t confidence
//! interval of the mean of all repetitions, and the coefficient of variation
//! that drives the noise warning. Per-message latencies are collected in a
//! [`LatencyHistogram`] (nanoseconds in, microseconds out) whose
//! [`Percentiles`] are reported next to the summary. The functions here are
//! unit-agnostic: a summary carries whatever unit its repetitions were
//! measured in.

use hdrhistogram::Histogram;
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// Default coefficient of variation (standard deviation / mean, a fraction,
/// not a percentage) above which a point is called noisy: 0.05, i.e. 5%.
pub const NOISY_CV: f64 = 0.05;

/// Repetitions the headline value drops at each end (the highest and the
/// lowest) when there are at least `2 * DROPPED_EACH_SIDE + 1`; fixed,
/// as the seeds' method is.
pub const DROPPED_EACH_SIDE: u32 = 1;

/// Why a set of repetitions could not be summarized.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StatsError {
    /// There were no repetitions.
    #[error("no repetitions to summarize")]
    Empty,
    /// At least one repetition was NaN or infinite.
    #[error("a repetition's value is not a finite number")]
    NotFinite,
}

/// The summary of one point's repetitions. All fields except `cv` and
/// `reps` are in the unit of the repetitions (e.g. Gbit/s or µs).
///
/// Invariants (for a summary built by [`Summary::from_reps`]): `min <=
/// value <= max`, `min <= median <= max`, `ci95_low <= ci95_high` when
/// there is an interval, `stdev
/// >= 0`, `cv >= 0`, and `reps` is non-empty and finite.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// The headline value: the mean after dropping one highest and one
    /// lowest repetition when there are at least 3; the plain mean of 1 or 2.
    pub value: f64,
    /// The smallest repetition.
    pub min: f64,
    /// The median repetition (mean of the two middle ones for an even count).
    pub median: f64,
    /// The largest repetition.
    pub max: f64,
    /// Sample standard deviation (divisor n - 1) over all repetitions; 0 for
    /// a single repetition.
    pub stdev: f64,
    /// Lower bound of the 95% Student-t confidence interval of the mean of
    /// all repetitions; `None` for a single repetition, which has no
    /// interval (never a zero-width one).
    pub ci95_low: Option<f64>,
    /// Upper bound of the 95% Student-t confidence interval of the mean of
    /// all repetitions; `None` for a single repetition.
    pub ci95_high: Option<f64>,
    /// Coefficient of variation: `stdev / |mean|` over all repetitions, as a
    /// fraction (0.05 = 5%); 0 if the mean is 0.
    pub cv: f64,
    /// Each repetition's value, in measurement order.
    pub reps: Vec<f64>,
}

impl Summary {
    /// Summarizes repetitions given in measurement order.
    ///
    /// The confidence interval is `mean ± t(0.975, n-1) · s / √n` with the
    /// mean and sample standard deviation `s` of all `n` repetitions (not
    /// the trimmed headline value); for `n < 2` it is `[value, value]`.
    ///
    /// # Errors
    /// [`StatsError::Empty`] for no repetitions, [`StatsError::NotFinite`]
    /// if any repetition is NaN or infinite.
    pub fn from_reps(reps: &[f64]) -> Result<Summary, StatsError> {
        if reps.is_empty() {
            return Err(StatsError::Empty);
        }
        if reps.iter().any(|v| !v.is_finite()) {
            return Err(StatsError::NotFinite);
        }
        let sorted = sorted(reps);
        // `sorted` is non-empty, checked above.
        let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
        let n = reps.len();
        let mean_all = mean_of_nonempty(reps);
        let value = trimmed_mean_of_sorted(&sorted).clamp(min, max);
        let median = median_of_sorted(&sorted);
        let (stdev, ci95_low, ci95_high) = match sample_stdev(reps) {
            Some(s) => {
                let dof = (n - 1) as u64;
                let half_width = t_quantile(0.95, dof) * s / (n as f64).sqrt();
                (s, Some(mean_all - half_width), Some(mean_all + half_width))
            }
            None => (0.0, None, None),
        };
        let cv = if mean_all == 0.0 {
            0.0
        } else {
            stdev / mean_all.abs()
        };
        Ok(Summary {
            value,
            min,
            median,
            max,
            stdev,
            ci95_low,
            ci95_high,
            cv,
            reps: reps.to_vec(),
        })
    }

    /// Half-width of the 95% confidence interval as a fraction of the mean of
    /// all repetitions (0.02 = ±2%); 0 if that mean is 0, `None` without an
    /// interval (a single repetition). Never negative.
    pub fn ci95_half_width_rel(&self) -> Option<f64> {
        let (low, high) = (self.ci95_low?, self.ci95_high?);
        let mean_all = mean(&self.reps).unwrap_or(0.0);
        Some(if mean_all == 0.0 {
            0.0
        } else {
            ((high - low) / 2.0).abs() / mean_all.abs()
        })
    }
}

/// A copy of `values` sorted ascending (NaN, if any, sorts last).
fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_unstable_by(f64::total_cmp);
    v
}

/// Arithmetic mean; `values` must be non-empty.
fn mean_of_nonempty(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// Trimmed mean of ascending `sorted`, which must be non-empty.
fn trimmed_mean_of_sorted(sorted: &[f64]) -> f64 {
    let drop = DROPPED_EACH_SIDE as usize;
    if sorted.len() > 2 * drop {
        mean_of_nonempty(&sorted[drop..sorted.len() - drop])
    } else {
        mean_of_nonempty(sorted)
    }
}

/// Median of ascending `sorted`, which must be non-empty.
fn median_of_sorted(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// The median: the middle value for an odd count, the average of the two
/// middle values for an even count. Same unit as the input. `None` for an
/// empty slice.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(median_of_sorted(&sorted(values)))
    }
}

/// The arithmetic mean. Same unit as the input. `None` for an empty slice.
pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(mean_of_nonempty(values))
    }
}

/// The sample standard deviation (divisor n - 1), computed in two passes
/// for accuracy. Same unit as the input; never negative for finite input.
/// `None` for fewer than 2 values.
pub fn sample_stdev(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let m = mean_of_nonempty(values);
    let sum_sq: f64 = values.iter().map(|v| (v - m) * (v - m)).sum();
    Some((sum_sq / (values.len() - 1) as f64).sqrt())
}

/// The two-sided Student-t critical value for `dof` degrees of freedom: the
/// `t` with `P(|T| < t) = confidence`, e.g. `t_quantile(0.95, 9) ≈ 2.262157`.
///
/// `confidence` is a probability (0.95, not 95). Out-of-domain inputs do not
/// panic: `confidence <= 0` (or NaN) gives 0, `confidence >= 1` gives
/// infinity, and `dof == 0` gives infinity (no interval can be formed).
pub fn t_quantile(confidence: f64, dof: u64) -> f64 {
    if confidence.is_nan() || confidence <= 0.0 {
        return 0.0;
    }
    if confidence >= 1.0 || dof == 0 {
        return f64::INFINITY;
    }
    let p = 0.5 + confidence / 2.0;
    if dof > T_EXPANSION_MIN_DOF {
        return t_quantile_large_dof(p, dof as f64);
    }
    match StudentsT::new(0.0, 1.0, dof as f64) {
        Ok(t) => t.inverse_cdf(p),
        Err(_) => f64::INFINITY,
    }
}

/// Above this many degrees of freedom [`t_quantile`] uses an asymptotic
/// expansion: statrs' exact inversion loses accuracy past about 10^4 and
/// stops converging for astronomically large values, while the expansion's
/// error is below 10^-9 from here on.
const T_EXPANSION_MIN_DOF: u64 = 1_000;

/// The one-sided Student-t quantile at probability `p` for large `dof`, by
/// the Cornish-Fisher expansion around the normal quantile z (Abramowitz &
/// Stegun 26.7.5), keeping terms up to 1/dof^3.
fn t_quantile_large_dof(p: f64, dof: f64) -> f64 {
    let z = match Normal::new(0.0, 1.0) {
        Ok(normal) => normal.inverse_cdf(p),
        Err(_) => return f64::INFINITY,
    };
    let z2 = z * z;
    let g1 = z * (z2 + 1.0) / 4.0;
    let g2 = z * ((5.0 * z2 + 16.0) * z2 + 3.0) / 96.0;
    let g3 = z * (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) / 384.0;
    z + (g1 + (g2 + g3 / dof) / dof) / dof
}

/// Latency percentiles in microseconds (after any scaling, see
/// [`LatencyHistogram::percentiles_us`]). Invariant: `p50 <= p90 <= p99 <=
/// p999 <= max` for a non-negative scale.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Percentiles {
    /// 50th percentile (median), µs.
    pub p50: f64,
    /// 90th percentile, µs.
    pub p90: f64,
    /// 99th percentile, µs.
    pub p99: f64,
    /// 99.9th percentile, µs.
    pub p999: f64,
    /// Largest recorded value, µs.
    pub max: f64,
}

/// The largest latency a [`LatencyHistogram`] tracks: one hour, in ns.
const MAX_TRACKED_NS: u64 = 3_600 * 1_000_000_000;

/// Histogram of latencies in nanoseconds, with 3 significant digits of
/// precision (every value is stored to within 0.1%) over the range 1 ns to
/// 1 hour. Storage grows on demand up to that range, so a histogram of
/// microsecond latencies stays small.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    /// Invariant: auto-resizing, lowest discernible value 1, and every
    /// recorded value lies in `1..=MAX_TRACKED_NS`.
    hist: Histogram<u64>,
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> LatencyHistogram {
        // 3 significant figures is within hdrhistogram's supported 0..=5,
        // so construction cannot fail.
        let hist = Histogram::new(3).expect("3 significant figures are always valid");
        LatencyHistogram { hist }
    }

    /// Records one latency in nanoseconds. 0 is recorded as 1 ns and values
    /// over one hour as one hour. Never panics.
    pub fn record_ns(&mut self, ns: u64) {
        let ns = ns.clamp(1, MAX_TRACKED_NS);
        if self.hist.record(ns).is_err() {
            // Only reachable if growing the storage failed; keep the sample
            // at the edge of the current range instead of dropping it.
            self.hist.saturating_record(ns);
        }
    }

    /// Number of latencies recorded.
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// Whether no latency has been recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Adds every latency recorded in `other` to this histogram.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        if self.hist.add(&other.hist).is_err() {
            // Only reachable if growing the storage failed; fall back to
            // recording each bucket, clamped to the current range.
            for bucket in other.hist.iter_recorded() {
                self.hist
                    .saturating_record_n(bucket.value_iterated_to(), bucket.count_at_value());
            }
        }
    }

    /// The 50th, 90th, 99th and 99.9th percentiles and the maximum, in
    /// microseconds, each recorded nanosecond value multiplied by `scale`
    /// first (pingpong passes 0.5 to turn round trips into one-way latency;
    /// pass 1.0 for no scaling). Values carry the histogram's 0.1% precision.
    /// `None` if nothing has been recorded.
    pub fn percentiles_us(&self, scale: f64) -> Option<Percentiles> {
        if self.is_empty() {
            return None;
        }
        let us = |ns: u64| ns as f64 * scale / 1_000.0;
        let at = |q: f64| us(self.hist.value_at_quantile(q));
        Some(Percentiles {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: us(self.hist.max()),
        })
    }

    /// Forgets every recorded latency, keeping the allocated storage.
    pub fn clear(&mut self) {
        self.hist.reset();
    }

    /// Every recorded value with its count, as `[value_ns, count]` pairs in
    /// increasing value order: the histogram in a form a control message
    /// carries (see [`LatencyHistogram::record_n_ns`]).
    pub fn buckets(&self) -> Vec<[u64; 2]> {
        self.hist
            .iter_recorded()
            .map(|b| [b.value_iterated_to(), b.count_at_value()])
            .collect()
    }

    /// Records `count` latencies of `ns` nanoseconds, clamped like
    /// [`LatencyHistogram::record_ns`]; rebuilds a histogram from
    /// [`LatencyHistogram::buckets`] sent by a peer. Never panics.
    pub fn record_n_ns(&mut self, ns: u64, count: u64) {
        let ns = ns.clamp(1, MAX_TRACKED_NS);
        if self.hist.record_n(ns, count).is_err() {
            self.hist.saturating_record_n(ns, count);
        }
    }
}

/// Sub-buckets per power of two of a [`FlowHistogram`], as a shift:
/// 2^5 = 32, so a bucket is at most 1/32 of its lower bound wide.
const FLOW_SUB_BITS: u32 = 5;
/// Sub-buckets per power of two.
const FLOW_SUB: u64 = 1 << FLOW_SUB_BITS;

/// One flow's latencies in a few hundred bytes: the per-flow histogram of
/// workloads with up to 100,000 concurrent flows, where even a 1%
/// `hdrhistogram` (over 9 KiB once it holds microseconds) per flow would
/// dominate the run's memory.
///
/// Log-linear buckets: values below 32 ns exactly, above that 32 buckets per
/// power of two, so a bucket spans at most 1/32 (3.1%) of its value and a
/// percentile, reported at its bucket's midpoint, is within 1.6% of the
/// recorded value. Counts are `u32` and only the buckets between the
/// smallest and the largest value recorded are stored, so a flow whose
/// round trips span one decade (3.3 powers of two) holds about 107 counts,
/// 428 bytes; the worst case, 1 ns to an hour, is 1,185 counts (4.6 KiB).
/// The exact maximum is kept beside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowHistogram {
    /// Bucket index of `counts[0]`.
    first: u32,
    counts: Vec<u32>,
    total: u64,
    max_ns: u64,
}

impl FlowHistogram {
    /// An empty histogram; allocates nothing until the first value.
    pub fn new() -> FlowHistogram {
        FlowHistogram::default()
    }

    /// The bucket of `ns` (1..=one hour).
    fn bucket(ns: u64) -> u32 {
        if ns < FLOW_SUB {
            return ns as u32;
        }
        let octave = 63 - ns.leading_zeros();
        let shift = octave - FLOW_SUB_BITS;
        let mantissa = (ns >> shift) & (FLOW_SUB - 1);
        ((shift + 1) << FLOW_SUB_BITS) + mantissa as u32
    }

    /// The middle of bucket `b`'s range, ns.
    fn midpoint_ns(b: u32) -> u64 {
        if u64::from(b) < FLOW_SUB {
            return u64::from(b);
        }
        let shift = (b >> FLOW_SUB_BITS) - 1;
        let mantissa = u64::from(b) & (FLOW_SUB - 1);
        let low = (FLOW_SUB + mantissa) << shift;
        low + ((1u64 << shift) >> 1)
    }

    /// Records one latency in nanoseconds, clamped to 1 ns..one hour.
    pub fn record_ns(&mut self, ns: u64) {
        let ns = ns.clamp(1, MAX_TRACKED_NS);
        let b = FlowHistogram::bucket(ns);
        if self.counts.is_empty() {
            self.first = b;
            self.counts.push(0);
        } else if b < self.first {
            let grow = (self.first - b) as usize;
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.first = b;
        } else if (b - self.first) as usize >= self.counts.len() {
            self.counts.resize((b - self.first) as usize + 1, 0);
        }
        let c = &mut self.counts[(b - self.first) as usize];
        *c = c.saturating_add(1);
        self.total += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Number of latencies recorded.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether no latency has been recorded.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Heap bytes held, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<u32>()
    }

    /// The value at quantile `q` (0..=1), ns: its bucket's midpoint, or the
    /// exact maximum in the top bucket.
    fn value_at_quantile_ns(&self, q: f64) -> u64 {
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                let b = self.first + i as u32;
                return FlowHistogram::midpoint_ns(b).min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// The percentiles in µs, values multiplied by `scale` first (as
    /// [`LatencyHistogram::percentiles_us`]); `None` if nothing was
    /// recorded.
    pub fn percentiles_us(&self, scale: f64) -> Option<Percentiles> {
        if self.is_empty() {
            return None;
        }
        let us = |ns: u64| ns as f64 * scale / 1_000.0;
        let at = |q: f64| us(self.value_at_quantile_ns(q));
        Some(Percentiles {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: us(self.max_ns),
        })
    }

    /// Adds every recorded latency to `into`, each at its bucket's midpoint
    /// (the maximum exactly).
    pub fn merge_into(&self, into: &mut LatencyHistogram) {
        let top = self.counts.len().saturating_sub(1);
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let b = self.first + i as u32;
            if i == top {
                // The maximum itself, and the rest of its bucket at the
                // midpoint (never above the maximum).
                into.record_ns(self.max_ns);
                if c > 1 {
                    into.record_n_ns(
                        FlowHistogram::midpoint_ns(b).min(self.max_ns),
                        u64::from(c) - 1,
                    );
                }
            } else {
                into.record_n_ns(FlowHistogram::midpoint_ns(b), u64::from(c));
            }
        }
    }

    /// Forgets every recorded latency, keeping the allocated storage.
    pub fn clear(&mut self) {
        self.counts.clear();
        self.total = 0;
        self.max_ns = 0;
    }
}

impl Default for LatencyHistogram {
    /// Same as [`LatencyHistogram::new`].
    fn default() -> Self {
        LatencyHistogram::new()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn flow_histogram_percentiles_are_within_two_percent_and_small() {
        let mut h = FlowHistogram::new();
        let mut exact = Vec::new();
        // A decade of round trips, 20 µs to 200 µs, and one slow outlier.
        for i in 0..10_000u64 {
            let ns = 20_000 + (i * 7_919) % 180_000;
            h.record_ns(ns);
            exact.push(ns);
        }
        h.record_ns(5_000_000);
        exact.push(5_000_000);
        exact.sort_unstable();
        let p = h.percentiles_us(1.0).expect("recorded");
        let at = |q: f64| exact[((q * exact.len() as f64).ceil() as usize).max(1) - 1] as f64 / 1e3;
        for (q, got) in [(0.5, p.p50), (0.9, p.p90), (0.99, p.p99)] {
            let want = at(q);
            assert!(
                (got - want).abs() / want < 0.02,
                "p{q}: {got} against {want}"
            );
        }
        assert_eq!(p.max, 5_000.0);
        // 20 µs..5 ms is 8 powers of two: about 256 counts of 4 bytes.
        assert!(h.heap_bytes() <= 1_200, "{} bytes", h.heap_bytes());
        let mut full = LatencyHistogram::new();
        h.merge_into(&mut full);
        assert_eq!(full.len(), h.len());
        let f = full.percentiles_us(1.0).expect("merged");
        assert!((f.p99 - p.p99).abs() / p.p99 < 0.01);
        assert!((f.max - 5_000.0).abs() < 5.0);
    }

    #[test]
    fn flow_histogram_buckets_cover_every_value_in_order() {
        let mut last = 0;
        for ns in (1..100_000u64).chain([MAX_TRACKED_NS - 1, MAX_TRACKED_NS]) {
            let b = FlowHistogram::bucket(ns);
            assert!(b >= last, "bucket of {ns} went down");
            last = b;
            let mid = FlowHistogram::midpoint_ns(b);
            assert!(
                mid.abs_diff(ns) as f64 <= ns as f64 / 60.0 + 0.5,
                "{ns}: {mid}"
            );
        }
        let mut h = FlowHistogram::new();
        h.record_ns(1_000_000);
        h.record_ns(10);
        h.record_ns(0);
        assert_eq!(h.len(), 3);
        assert_eq!(h.percentiles_us(1.0).expect("some").max, 1_000.0);
        h.clear();
        assert!(h.percentiles_us(1.0).is_none());
    }
    use proptest::prelude::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn trimmed_mean_drops_one_each_end() {
        let value = |reps: &[f64]| Summary::from_reps(reps).ok().map(|s| s.value);
        assert_eq!(value(&[1.0, 2.0, 3.0, 4.0, 100.0]), Some(3.0));
        assert_eq!(value(&[100.0, 4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(value(&[5.0, 1.0, 9.0]), Some(5.0));
        // Only one copy of a repeated extreme is dropped.
        assert_eq!(value(&[1.0, 1.0, 1.0, 4.0]), Some(1.0));
        assert_eq!(value(&[2.0, 4.0]), Some(3.0));
        assert_eq!(value(&[7.0]), Some(7.0));
        assert_eq!(value(&[]), None);
    }

    #[test]
    fn median_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0]), Some(5.0));
        assert_eq!(median(&[1.0, 2.0]), Some(1.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn mean_and_stdev() {
        assert_eq!(mean(&[1.0, 2.0, 3.0, 6.0]), Some(3.0));
        assert_eq!(mean(&[]), None);
        let s = sample_stdev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        // sqrt(32 / 7)
        assert!(close(s, 2.138_089_935_299_395, 1e-12), "{s}");
        assert_eq!(sample_stdev(&[3.0, 3.0, 3.0]), Some(0.0));
        assert_eq!(sample_stdev(&[1.0]), None);
        assert_eq!(sample_stdev(&[]), None);
    }

    #[test]
    fn t_quantiles_match_tables() {
        assert!(close(t_quantile(0.95, 9), 2.262_157, 1e-6));
        assert!(close(t_quantile(0.99, 4), 4.604_095, 1e-6));
        assert!(close(t_quantile(0.95, 1), 12.706_205, 1e-5));
        assert!(close(t_quantile(0.90, 30), 1.697_261, 1e-6));
        // Both sides of the switch to the large-dof expansion agree with
        // tables, and very large dof approaches the normal quantile 1.959964.
        assert!(close(t_quantile(0.95, 1_000), 1.962_339, 1e-6));
        assert!(close(t_quantile(0.95, 1_001), 1.962_336_7, 1e-6));
        assert!(close(t_quantile(0.99, 2_000), 2.578_290, 1e-6));
        assert!(close(t_quantile(0.95, 1_000_000), 1.959_966_4, 1e-7));
        assert!(close(t_quantile(0.95, u64::MAX), 1.959_964_0, 1e-7));
    }

    #[test]
    fn t_quantile_out_of_domain_does_not_panic() {
        assert_eq!(t_quantile(0.0, 5), 0.0);
        assert_eq!(t_quantile(-1.0, 5), 0.0);
        assert_eq!(t_quantile(f64::NAN, 5), 0.0);
        assert_eq!(t_quantile(1.0, 5), f64::INFINITY);
        assert_eq!(t_quantile(2.0, 5), f64::INFINITY);
        assert_eq!(t_quantile(0.95, 0), f64::INFINITY);
        assert!(t_quantile(0.95, u64::MAX).is_finite());
    }

    #[test]
    fn summary_of_known_vector() {
        let reps = [10.0, 12.0, 11.0, 13.0, 9.0];
        let s = Summary::from_reps(&reps).unwrap();
        // Trimmed: drop 9 and 13 -> mean(10, 11, 12) = 11.
        assert_eq!(s.value, 11.0);
        assert_eq!((s.min, s.median, s.max), (9.0, 11.0, 13.0));
        // Mean 11, squared deviations 1+1+0+4+4 = 10, s = sqrt(10/4).
        let sd = 2.5f64.sqrt();
        assert!(close(s.stdev, sd, 1e-12));
        // Half-width = t(0.975, 4) * s / sqrt(5) = 2.776445 * 1.581139 / 2.236068.
        let hw = 2.776_445_105 * sd / 5f64.sqrt();
        assert!(close(hw, 1.963_243, 1e-6));
        let (low, high) = (s.ci95_low.unwrap(), s.ci95_high.unwrap());
        assert!(close(low, 11.0 - hw, 1e-6), "{low}");
        assert!(close(high, 11.0 + hw, 1e-6), "{high}");
        assert!(close(s.cv, sd / 11.0, 1e-12));
        assert!(close(s.ci95_half_width_rel().unwrap(), hw / 11.0, 1e-6));
        assert_eq!(s.reps, reps.to_vec());
    }

    #[test]
    fn summary_ci_is_around_mean_of_all_reps() {
        let s = Summary::from_reps(&[1.0, 2.0, 3.0, 4.0, 100.0]).unwrap();
        assert_eq!(s.value, 3.0);
        let mid = (s.ci95_low.unwrap() + s.ci95_high.unwrap()) / 2.0;
        assert!(close(mid, 22.0, 1e-9), "{mid}");
    }

    #[test]
    fn summary_of_one_and_two_reps() {
        let one = Summary::from_reps(&[4.5]).unwrap();
        assert_eq!(one.value, 4.5);
        assert_eq!((one.min, one.median, one.max), (4.5, 4.5, 4.5));
        assert_eq!(one.stdev, 0.0);
        // One repetition has no interval: none, not a zero-width one.
        assert_eq!((one.ci95_low, one.ci95_high), (None, None));
        assert_eq!(one.cv, 0.0);
        assert_eq!(one.ci95_half_width_rel(), None);

        let two = Summary::from_reps(&[2.0, 4.0]).unwrap();
        assert_eq!(two.value, 3.0);
        assert_eq!(two.median, 3.0);
        // s = sqrt(2), half-width = t(0.975, 1) * sqrt(2) / sqrt(2) = 12.7062.
        assert!(close(two.ci95_high.unwrap() - 3.0, 12.706_205, 1e-5));
    }

    #[test]
    fn summary_zero_mean_has_zero_cv() {
        let s = Summary::from_reps(&[-1.0, 1.0]).unwrap();
        assert_eq!(s.cv, 0.0);
        assert_eq!(s.ci95_half_width_rel(), Some(0.0));
        let z = Summary::from_reps(&[0.0, 0.0, 0.0]).unwrap();
        assert_eq!((z.value, z.stdev, z.cv), (0.0, 0.0, 0.0));
        assert_eq!((z.ci95_low, z.ci95_high), (Some(0.0), Some(0.0)));
    }

    #[test]
    fn summary_rejects_empty_and_non_finite() {
        assert_eq!(Summary::from_reps(&[]), Err(StatsError::Empty));
        assert_eq!(
            Summary::from_reps(&[1.0, f64::NAN]),
            Err(StatsError::NotFinite)
        );
        assert_eq!(
            Summary::from_reps(&[f64::INFINITY]),
            Err(StatsError::NotFinite)
        );
        assert_eq!(
            Summary::from_reps(&[1.0, f64::NEG_INFINITY, 2.0]),
            Err(StatsError::NotFinite)
        );
        assert_eq!(StatsError::Empty.to_string(), "no repetitions to summarize");
    }

    #[test]
    fn summary_serde_round_trip() {
        let s = Summary::from_reps(&[1.0, 2.0, 4.0]).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"ci95_low\""));
        let back: Summary = serde_json::from_str(&json).unwrap();
        // serde_json's default float parsing may differ in the last bit.
        assert!(close(back.stdev, s.stdev, 1e-12));
        assert_eq!(back.reps, s.reps);
        assert_eq!((back.value, back.median), (s.value, s.median));
    }

    #[test]
    fn histogram_percentiles_of_1_to_1000_ns() {
        let mut h = LatencyHistogram::new();
        assert!(h.is_empty());
        assert_eq!(h.percentiles_us(1.0), None);
        for ns in 1..=1000 {
            h.record_ns(ns);
        }
        assert_eq!(h.len(), 1000);
        assert!(!h.is_empty());
        let p = h.percentiles_us(1.0).unwrap();
        // Values below 2048 ns are stored exactly at 3 significant figures.
        assert!(close(p.p50, 0.5, 0.001), "{p:?}");
        assert!(close(p.p90, 0.9, 0.001), "{p:?}");
        assert!(close(p.p99, 0.99, 0.001), "{p:?}");
        assert!(close(p.p999, 0.999, 0.001), "{p:?}");
        assert_eq!(p.max, 1.0);

        let half = h.percentiles_us(0.5).unwrap();
        assert!(close(half.p50, p.p50 / 2.0, 1e-12));
        assert!(close(half.p999, p.p999 / 2.0, 1e-12));
        assert_eq!(half.max, 0.5);
    }

    #[test]
    fn histogram_clamps_and_never_panics() {
        let mut h = LatencyHistogram::default();
        h.record_ns(0);
        let p = h.percentiles_us(1.0).unwrap();
        assert_eq!(p.max, 0.001);
        h.record_ns(u64::MAX);
        assert_eq!(h.len(), 2);
        let p = h.percentiles_us(1.0).unwrap();
        let hour_us = 3.6e9;
        assert!(close(p.max, hour_us, hour_us * 0.001), "{p:?}");
    }

    #[test]
    fn histogram_precision_for_large_values() {
        let mut h = LatencyHistogram::new();
        h.record_ns(123_456_789);
        let p = h.percentiles_us(1.0).unwrap();
        assert!(close(p.p50, 123_456.789, 123.457), "{p:?}");
    }

    #[test]
    fn histogram_merge_and_clear() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        for ns in 1..=500 {
            a.record_ns(ns);
        }
        for ns in 501..=1000 {
            b.record_ns(ns);
        }
        b.record_ns(10_000_000_000);
        a.merge(&b);
        assert_eq!(a.len(), 1001);
        let p = a.percentiles_us(1.0).unwrap();
        assert!(close(p.p50, 0.501, 0.001), "{p:?}");
        assert!(close(p.max, 10_000_000.0, 10_000.0), "{p:?}");
        assert_eq!(b.len(), 501);

        a.merge(&LatencyHistogram::new());
        assert_eq!(a.len(), 1001);

        a.clear();
        assert!(a.is_empty());
        assert_eq!(a.percentiles_us(1.0), None);
        a.record_ns(42);
        assert_eq!(a.len(), 1);
    }

    proptest! {
        #[test]
        fn summary_invariants(reps in prop::collection::vec(-1e6f64..1e6, 1..40)) {
            let s = Summary::from_reps(&reps).unwrap();
            prop_assert!(s.min <= s.value && s.value <= s.max);
            prop_assert!(s.min <= s.median && s.median <= s.max);
            prop_assert!(s.stdev >= 0.0 && s.cv >= 0.0);
            let m = mean(&reps).unwrap();
            if reps.len() >= 2 {
                let (low, high) = (s.ci95_low.unwrap(), s.ci95_high.unwrap());
                prop_assert!(low <= high);
                prop_assert!(low <= m + 1e-6 && m - 1e-6 <= high);
            } else {
                prop_assert!(s.ci95_low.is_none() && s.ci95_high.is_none());
            }
        }

        #[test]
        fn percentiles_are_ordered(values in prop::collection::vec(any::<u64>(), 1..200)) {
            let mut h = LatencyHistogram::new();
            for v in &values {
                h.record_ns(*v);
            }
            let p = h.percentiles_us(1.0).unwrap();
            prop_assert!(p.p50 <= p.p90 && p.p90 <= p.p99);
            prop_assert!(p.p99 <= p.p999 && p.p999 <= p.max);
        }
    }
}
