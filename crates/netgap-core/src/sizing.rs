//! The block sizes of a NetPIPE-style sweep (`netgap sweep`): nominal sizes
//! that grow exponentially from `--start` to `--end`, each tested with small
//! perturbations around it (n−p, n, n+p) to find sizes where a stack
//! misbehaves. Plain arithmetic, no I/O; the sweep command walks the list.
//!
//! NetPIPE's own growth, the default, alternates factors of 1.5 and 4/3: the
//! powers of two and the midpoints between them (1, 2, 3, 4, 6, 8, 12, 16,
//! 24, ...), so sizes double every two steps. Like NetPIPE, a nominal size
//! is perturbed only when the step to the next nominal size is larger than
//! `p + 1` bytes, so the smallest sizes are not crowded with near-duplicates.

/// How nominal sizes grow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Growth {
    /// NetPIPE's: the powers of two and 1.5 times each, above the start.
    NetPipe,
    /// Each nominal size is this factor times the previous one (rounded,
    /// at least one byte more). Invariant: `> 1` and finite.
    Factor(f64),
}

/// Largest growth factor accepted.
pub(crate) const MAX_FACTOR: f64 = 1024.0;

/// Why a size range cannot be swept.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizingError {
    /// `--start` is 0 or above `--end`.
    #[error("start size {start} must be at least 1 byte and at most the end size {end}")]
    Range {
        /// Start size in bytes.
        start: u64,
        /// End size in bytes.
        end: u64,
    },
    /// The factor is not above 1.
    #[error("growth factor {0} must be above 1 and at most 1024")]
    Factor(f64),
}

/// The next nominal size after `n` bytes.
fn next_nominal(n: u64, growth: Growth) -> u64 {
    match growth {
        Growth::NetPipe => {
            // Smallest 2^k or 3·2^k above n.
            let pow2 = (n + 1).next_power_of_two();
            let three = if pow2 >= 4 { pow2 / 4 * 3 } else { 3 };
            if three > n && three < pow2 {
                three
            } else {
                pow2
            }
        }
        Growth::Factor(f) => {
            let grown = (n as f64 * f).round();
            if grown >= u64::MAX as f64 {
                u64::MAX
            } else {
                (grown as u64).max(n.saturating_add(1))
            }
        }
    }
}

fn check(start: u64, end: u64, growth: Growth) -> Result<(), SizingError> {
    if start == 0 || start > end {
        return Err(SizingError::Range { start, end });
    }
    if let Growth::Factor(f) = growth {
        if !(f > 1.0 && f <= MAX_FACTOR) {
            return Err(SizingError::Factor(f));
        }
    }
    Ok(())
}

/// The nominal sizes from `start` to `end` bytes inclusive, strictly
/// increasing, `start` first.
pub(crate) fn nominal_sizes(start: u64, end: u64, growth: Growth) -> Result<Vec<u64>, SizingError> {
    check(start, end, growth)?;
    let mut sizes = vec![start];
    let mut n = start;
    loop {
        n = next_nominal(n, growth);
        if n > end || n == u64::MAX {
            break;
        }
        sizes.push(n);
    }
    Ok(sizes)
}

/// Every size a sweep measures, in order: each nominal size `n` with `n − p`
/// and `n + p` when the step to the next nominal size exceeds `p + 1`
/// (`perturbation_bytes` = p, 0 switches perturbation off). Sizes stay
/// within `start..=end`, strictly increasing, without duplicates.
pub fn sweep_sizes(
    start: u64,
    end: u64,
    growth: Growth,
    perturbation_bytes: u64,
) -> Result<Vec<u64>, SizingError> {
    let nominal = nominal_sizes(start, end, growth)?;
    let p = perturbation_bytes;
    let mut sizes = Vec::with_capacity(nominal.len() * 3);
    for &n in &nominal {
        let step = next_nominal(n, growth).saturating_sub(n);
        if p > 0 && step > p + 1 {
            if n >= start.saturating_add(p) {
                sizes.push(n - p);
            }
            sizes.push(n);
            if n.saturating_add(p) <= end {
                sizes.push(n + p);
            }
        } else {
            sizes.push(n);
        }
    }
    sizes.sort_unstable();
    sizes.dedup();
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netpipe_growth_is_powers_of_two_and_their_midpoints() {
        assert_eq!(
            nominal_sizes(1, 200, Growth::NetPipe).expect("valid"),
            [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192]
        );
        assert_eq!(
            nominal_sizes(5, 40, Growth::NetPipe).expect("valid"),
            [5, 6, 8, 12, 16, 24, 32]
        );
    }

    /// The sizes NPtcp 3.7 measures with `-u 200` (its default perturbation
    /// of 3 bytes), as its output file lists them.
    #[test]
    fn default_sweep_matches_nptcp() {
        assert_eq!(
            sweep_sizes(1, 200, Growth::NetPipe, 3).expect("valid"),
            [
                1, 2, 3, 4, 6, 8, 12, 13, 16, 19, 21, 24, 27, 29, 32, 35, 45, 48, 51, 61, 64, 67,
                93, 96, 99, 125, 128, 131, 189, 192, 195
            ]
        );
    }

    #[test]
    fn perturbation_zero_gives_the_nominal_sizes() {
        assert_eq!(
            sweep_sizes(1, 8 << 20, Growth::NetPipe, 0).expect("valid"),
            nominal_sizes(1, 8 << 20, Growth::NetPipe).expect("valid")
        );
    }

    #[test]
    fn a_factor_grows_geometrically_and_perturbations_stay_in_range() {
        assert_eq!(
            nominal_sizes(1, 1000, Growth::Factor(4.0)).expect("valid"),
            [1, 4, 16, 64, 256]
        );
        assert_eq!(
            nominal_sizes(1, 10, Growth::Factor(1.1)).expect("valid"),
            (1..=10).collect::<Vec<_>>()
        );
        let s = sweep_sizes(64, 256, Growth::Factor(2.0), 5).expect("valid");
        assert_eq!(s, [64, 69, 123, 128, 133, 251, 256]);
    }

    #[test]
    fn sizes_are_strictly_increasing_and_bounded() {
        for (start, end, p) in [(1, 8 << 20, 3), (7, 1 << 16, 100), (1, 1, 3), (3, 5, 1)] {
            let s = sweep_sizes(start, end, Growth::NetPipe, p).expect("valid");
            assert!(s.windows(2).all(|w| w[0] < w[1]), "{s:?}");
            assert!(s.iter().all(|&x| x >= start && x <= end), "{s:?}");
            assert_eq!(s.first(), Some(&start));
        }
    }

    #[test]
    fn bad_ranges_and_factors_are_refused() {
        assert!(nominal_sizes(0, 10, Growth::NetPipe).is_err());
        assert!(nominal_sizes(11, 10, Growth::NetPipe).is_err());
        assert!(nominal_sizes(1, 10, Growth::Factor(1.0)).is_err());
        assert!(nominal_sizes(1, 10, Growth::Factor(f64::NAN)).is_err());
    }
}
