//! Dropout detection for a sweep (NetPIPE's "problem points"): sizes whose
//! throughput falls below the trend of the smaller sizes by more than the
//! measurement noise, and points whose trials split into a fast and a slow
//! group (intermittent stalls). Plain arithmetic on summaries, no I/O.
//!
//! Each point is judged the moment it is measured, against the points
//! already measured with sizes from half its size up to its own (the
//! previous octave: its smaller neighbours, perturbations included). The
//! trend there is the neighbours' median throughput, and the reference is
//! the neighbour that holds it: a robust level that a single lucky high
//! neighbour does not raise, and that a curve still rising towards a
//! plateau (a link's rate) never lies above. The point is a dropout when it
//! lies below that reference by more than [`NOISE_SIGMAS`] times the
//! combined standard deviation of both points' trials,
//! `sqrt(sd_ref² + sd_point²)`, and by at least [`MIN_DEPTH_FRACTION`] of
//! the reference: the threshold follows the spread each run actually had,
//! and a dip too shallow to see on NetPIPE's graph is not called one.
//!
//! A standard deviation from a handful of trials is itself uncertain: one
//! point may happen to show almost no spread. So each point's deviation is
//! taken as at least its value times the median coefficient of variation of
//! the points compared (the window and the point), a spread pooled over
//! neighbouring sizes. A point or reference with fewer than two trials has
//! no spread and is not judged.
//!
//! A point whose sorted trials have a gap of [`UNSTABLE_RATIO`] or more
//! between two neighbours is [`Unstable`]: its trials form a fast and a slow
//! group, which an intermittent stall (a delayed ACK, a retransmission
//! timeout, another process) makes, and no mean describes it. Such a point
//! is reported as unstable, not judged as a dropout, and not used as a
//! neighbour.

use crate::record::{Dropout, Unstable};

/// How many combined standard deviations a dip must exceed.
pub const NOISE_SIGMAS: f64 = 4.0;

/// The shallowest dip that counts as a dropout, as a fraction of the
/// reference (0.10 = 10% below the smaller sizes' trend).
pub const MIN_DEPTH_FRACTION: f64 = 0.10;

/// The smallest ratio between two neighbouring sorted trials that splits a
/// point's trials into a slow and a fast group. Trial noise on a quiet or
/// busy machine stays far below it (a few percent between neighbours); a
/// stall of one round trip in a block's transfer exceeds it.
pub const UNSTABLE_RATIO: f64 = 1.5;

/// Whether `trials` (throughputs, higher is faster) split into a slow and a
/// fast group: the largest ratio between two neighbouring sorted trials is
/// at least [`UNSTABLE_RATIO`]. `None` for fewer than two trials or any
/// trial that is not a positive number.
pub fn split_trials(trials: &[f64]) -> Option<Unstable> {
    if trials.len() < 2 || trials.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
        return None;
    }
    let mut sorted = trials.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    let (gap_at, ratio) = sorted
        .windows(2)
        .enumerate()
        .map(|(i, w)| (i + 1, w[1] / w[0]))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    if ratio < UNSTABLE_RATIO {
        return None;
    }
    let (slow, fast) = sorted.split_at(gap_at);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Some(Unstable {
        slow_value: mean(slow),
        fast_value: mean(fast),
        slow_trials: slow.len() as u32,
        trials: trials.len() as u32,
    })
}

/// One measured point as the detector sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PointThroughput {
    /// Block size in bytes.
    pub size_bytes: u64,
    /// Headline throughput (any unit, the same for all points).
    pub value: f64,
    /// Sample standard deviation of the point's trials, same unit.
    pub stdev: f64,
    /// Number of trials.
    pub trials: usize,
}

/// Judges the points of one sweep in measurement order (sizes increasing).
#[derive(Debug, Clone, Default)]
pub struct DropoutDetector {
    history: Vec<PointThroughput>,
}

impl DropoutDetector {
    /// A detector with no points yet.
    pub fn new() -> DropoutDetector {
        DropoutDetector::default()
    }

    /// Judges `point` against the smaller points seen so far, then keeps it
    /// as a neighbour for later points. Returns the dropout if it is one.
    pub fn judge(&mut self, point: PointThroughput) -> Option<Dropout> {
        let verdict = self.assess(&point);
        self.keep(point);
        verdict
    }

    /// Keeps `point` as a neighbour for later points without judging it.
    pub fn keep(&mut self, point: PointThroughput) {
        self.history.push(point);
    }

    /// Replaces the kept point of the same size with `point`, a new
    /// measurement of it (a suspect dropout's reference measured again);
    /// keeps it if there was none.
    pub fn revise(&mut self, point: PointThroughput) {
        match self
            .history
            .iter_mut()
            .find(|p| p.size_bytes == point.size_bytes)
        {
            Some(p) => *p = point,
            None => self.history.push(point),
        }
    }

    /// Judges `point` against the smaller points seen so far without keeping
    /// it, so a caller can re-measure a suspect point before deciding.
    pub fn assess(&self, point: &PointThroughput) -> Option<Dropout> {
        if point.trials < 2 || !point.value.is_finite() {
            return None;
        }
        let lowest = point.size_bytes / 2;
        let mut window: Vec<&PointThroughput> = self
            .history
            .iter()
            .filter(|p| p.size_bytes >= lowest && p.size_bytes < point.size_bytes)
            .filter(|p| p.trials >= 2 && p.value.is_finite() && p.value > 0.0)
            .collect();
        if window.is_empty() {
            return None;
        }
        window.sort_by(|a, b| a.value.total_cmp(&b.value));
        // The upper median: with two neighbours, the higher one.
        let reference = window[window.len() / 2];
        let cvs: Vec<f64> = window
            .iter()
            .copied()
            .chain(std::iter::once(point))
            .filter(|p| p.value > 0.0)
            .map(|p| p.stdev / p.value)
            .collect();
        let pooled_cv = crate::stats::median(&cvs).unwrap_or(0.0);
        let spread = |p: &PointThroughput| p.stdev.max(p.value.abs() * pooled_cv);
        let dip = reference.value - point.value;
        let noise = (spread(reference).powi(2) + spread(point).powi(2)).sqrt();
        if dip > NOISE_SIGMAS * noise && dip >= MIN_DEPTH_FRACTION * reference.value {
            Some(Dropout {
                depth_pct: 100.0 * dip / reference.value,
                reference_size_bytes: reference.size_bytes,
                reference_value: reference.value,
            })
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizing::{sweep_sizes, Growth};

    /// A clean loopback-like curve: throughput rises with size and levels
    /// off, with 2% trial spread.
    fn clean(size: u64) -> f64 {
        let s = size as f64;
        40.0 * s / (s + 20_000.0)
    }

    fn point(size: u64, value: f64) -> PointThroughput {
        PointThroughput {
            size_bytes: size,
            value,
            stdev: 0.02 * value,
            trials: 5,
        }
    }

    fn run(curve: impl Fn(u64) -> f64) -> Vec<(u64, Dropout)> {
        let mut d = DropoutDetector::new();
        sweep_sizes(1, 8 << 20, Growth::NetPipe, 3)
            .expect("valid")
            .into_iter()
            .filter_map(|s| d.judge(point(s, curve(s))).map(|x| (s, x)))
            .collect()
    }

    #[test]
    fn a_clean_curve_has_no_dropouts() {
        assert_eq!(run(clean), []);
    }

    #[test]
    fn small_wobbles_within_the_noise_are_not_dropouts() {
        // ±3% alternation with 2% trial spread: within 3 combined sigmas.
        let found = run(|s| clean(s) * if s % 2 == 0 { 1.03 } else { 0.97 });
        assert_eq!(found, []);
    }

    #[test]
    fn a_planted_dip_is_found_with_its_depth_and_reference() {
        // Sizes 96K ± 3 lose 40%, as a delayed-ACK stall would cost.
        let dip = |s: u64| {
            if (98_301..=98_307).contains(&s) {
                clean(s) * 0.6
            } else {
                clean(s)
            }
        };
        let found = run(dip);
        let sizes: Vec<u64> = found.iter().map(|(s, _)| *s).collect();
        assert_eq!(sizes, [98_301, 98_304, 98_307]);
        let (_, first) = found[0];
        // The reference holds the median of the octave below: 64K and its
        // neighbours on a curve that has levelled off.
        assert!(
            (49_152..98_301).contains(&first.reference_size_bytes),
            "{first:?}"
        );
        let expected = 100.0 * (1.0 - 0.6 * clean(98_301) / first.reference_value);
        assert!((first.depth_pct - expected).abs() < 1e-9, "{first:?}");
        assert!(first.depth_pct > 30.0);
        assert!((first.reference_value - clean(first.reference_size_bytes)).abs() < 1e-9);
    }

    #[test]
    fn the_approach_to_a_links_rate_is_not_a_dropout() {
        // A 100 Mbit/s link: throughput climbs to the rate and stays there,
        // trials very quiet (0.2%), wobbling a little below and above it.
        let rate = 0.0956;
        let curve = |s: u64| {
            let x = s as f64;
            let level = rate * x / (x + 2_000.0);
            level * if s.is_multiple_of(3) { 0.995 } else { 1.004 }
        };
        let mut d = DropoutDetector::new();
        let found: Vec<u64> = sweep_sizes(1, 8 << 20, Growth::NetPipe, 3)
            .expect("valid")
            .into_iter()
            .filter(|&s| {
                let v = curve(s);
                d.judge(PointThroughput {
                    size_bytes: s,
                    value: v,
                    stdev: 0.002 * v,
                    trials: 3,
                })
                .is_some()
            })
            .collect();
        assert_eq!(found, Vec::<u64>::new());
    }

    #[test]
    fn a_threefold_dip_at_one_size_is_found() {
        let dip = |s: u64| {
            if s == 65_536 {
                clean(s) / 3.0
            } else {
                clean(s)
            }
        };
        let found: Vec<u64> = run(dip).into_iter().map(|(s, _)| s).collect();
        assert_eq!(found, [65_536]);
    }

    #[test]
    fn trials_in_a_fast_and_a_slow_group_are_unstable() {
        // Two of three trials stalled to a third of the speed.
        let u = split_trials(&[9.0, 3.1, 2.9]).expect("split");
        assert_eq!((u.slow_trials, u.trials), (2, 3));
        assert!((u.slow_value - 3.0).abs() < 1e-9 && (u.fast_value - 9.0).abs() < 1e-9);
        // Ordinary noise, even wide, is not a split.
        assert_eq!(split_trials(&[10.0, 10.4, 9.7, 10.1, 9.9]), None);
        assert_eq!(split_trials(&[10.0, 12.0, 13.5, 11.0]), None);
        assert_eq!(split_trials(&[10.0]), None);
        assert_eq!(split_trials(&[10.0, 0.0]), None);
    }

    #[test]
    fn the_threshold_follows_the_spread() {
        let mut quiet = DropoutDetector::new();
        quiet.judge(point(1000, 10.0));
        assert!(
            quiet.judge(point(1500, 8.5)).is_some(),
            "15% dip, 2% spread"
        );
        let mut noisy = DropoutDetector::new();
        let wide = |size, value| PointThroughput {
            stdev: 0.1 * value,
            ..point(size, value)
        };
        noisy.judge(wide(1000, 10.0));
        assert!(
            noisy.judge(wide(1500, 8.5)).is_none(),
            "15% dip, 10% spread"
        );
    }

    #[test]
    fn one_point_with_a_lucky_small_spread_does_not_lower_the_bar() {
        let mut d = DropoutDetector::new();
        let with_cv = |size, value, cv: f64| PointThroughput {
            stdev: cv * value,
            ..point(size, value)
        };
        d.judge(with_cv(1000, 10.0, 0.08));
        d.judge(with_cv(1100, 10.2, 0.1));
        d.judge(with_cv(1200, 10.1, 0.09));
        // 20% below with a 1% spread of its own: within the pooled noise.
        assert!(d.judge(with_cv(1300, 8.2, 0.01)).is_none());
    }

    #[test]
    fn a_revised_reference_clears_a_dip_it_alone_caused() {
        let mut d = DropoutDetector::new();
        d.judge(point(1000, 10.0));
        d.judge(point(1200, 14.0));
        let p = point(1400, 10.2);
        assert_eq!(d.assess(&p).map(|x| x.reference_size_bytes), Some(1200));
        d.revise(point(1200, 10.1));
        assert_eq!(d.assess(&p), None);
    }

    #[test]
    fn points_without_a_spread_or_neighbours_are_not_judged() {
        let mut d = DropoutDetector::new();
        assert!(d.judge(point(1000, 10.0)).is_none(), "no neighbour yet");
        let single = PointThroughput {
            trials: 1,
            stdev: 0.0,
            ..point(1500, 1.0)
        };
        assert!(d.judge(single).is_none());
        assert!(
            d.judge(point(5000, 1.0)).is_none(),
            "1000 is over an octave away"
        );
    }
}
