//! The retry timeout of netgap's udp datagrams, as plain code (no clock:
//! every wait is given): the one rule the udp transport's flows
//! ([`crate::udp`]) and the flow engine's datagram flows
//! (`flows::datagram`) follow.
//!
//! - [`RETRY_INITIAL`] until a wait was measured;
//! - then four times the smoothed wait (an exponentially weighted mean,
//!   7/8 old and 1/8 new) of the exchanges that needed no re-send, within
//!   [`RETRY_MIN`]..[`RETRY_MAX`];
//! - a wait that needed re-sends is no sample (Karn): its timer doubled on
//!   each expiry ([`backed_off`], up to [`RETRY_MAX`]) and the timeout
//!   keeps at least the wait it reached ([`RetryTimeout::back_off`]) until
//!   a clean exchange is measured, so a timeout below the real round trip
//!   grows instead of firing forever.
//!
//! There is no variance term: loopback and testbed round trips are short
//! and steady, and four times the mean covers their spread. (The xdp
//! transport's reliable protocol has its own estimator, RFC 6298's mean
//! plus four deviations with a shifted backoff, in nanoseconds of its own
//! clock; it is a different rule and stays in `xdp::reliable`.)

use std::time::Duration;

/// Retry timeout before any wait has been measured.
pub const RETRY_INITIAL: Duration = Duration::from_millis(20);
/// Shortest retry timeout.
pub const RETRY_MIN: Duration = Duration::from_millis(2);
/// Longest retry timeout, also the cap of the backoff.
pub const RETRY_MAX: Duration = Duration::from_secs(1);

/// The wait after a retry timer of `wait` expired: twice it, at most
/// [`RETRY_MAX`].
pub fn backed_off(wait: Duration) -> Duration {
    wait.saturating_mul(2).min(RETRY_MAX)
}

/// When a measured wait moves the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hysteresis {
    /// On every sample.
    None,
    /// Only when the new value differs from the current one by more than a
    /// quarter of it (the udp transport: event mode then seldom has to
    /// reset its socket's receive timeout).
    Quarter,
}

/// One retry timeout and the smoothed wait it comes from.
#[derive(Debug, Clone, Copy)]
pub struct RetryTimeout {
    srtt: Option<Duration>,
    rto: Duration,
    hysteresis: Hysteresis,
}

impl Default for RetryTimeout {
    fn default() -> Self {
        RetryTimeout::new(Hysteresis::None)
    }
}

impl RetryTimeout {
    /// Before any wait: [`RETRY_INITIAL`].
    pub const fn new(hysteresis: Hysteresis) -> RetryTimeout {
        RetryTimeout {
            srtt: None,
            rto: RETRY_INITIAL,
            hysteresis,
        }
    }

    /// The current retry timeout, within [`RETRY_MIN`]..[`RETRY_MAX`].
    pub fn get(&self) -> Duration {
        self.rto
    }

    /// The smoothed wait of clean exchanges, once one was measured.
    pub fn smoothed(&self) -> Option<Duration> {
        self.srtt
    }

    /// Keeps at least `backoff`, the wait an exchange that needed re-sends
    /// had reached (Karn): its round trip is no sample, and without this
    /// only the exchanges faster than the timeout would teach it, so a
    /// timeout below the real round trip would never grow.
    pub fn back_off(&mut self, backoff: Duration) {
        self.rto = self.rto.max(backoff).min(RETRY_MAX);
    }

    /// Folds in the wait of an exchange that needed no re-send.
    pub fn observe(&mut self, sample: Duration) {
        let srtt = match self.srtt {
            None => sample,
            Some(s) => (s.saturating_mul(7).saturating_add(sample)) / 8,
        };
        self.srtt = Some(srtt);
        let target = srtt.saturating_mul(4).clamp(RETRY_MIN, RETRY_MAX);
        let moves = match self.hysteresis {
            Hysteresis::None => true,
            Hysteresis::Quarter => {
                target > self.rto + self.rto / 4 || target < self.rto - self.rto / 4
            }
        };
        if moves {
            self.rto = target;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_retry_timeout_follows_clean_round_trips_within_bounds() {
        let mut t = RetryTimeout::new(Hysteresis::None);
        assert_eq!(t.get(), RETRY_INITIAL);
        assert_eq!(t.smoothed(), None);
        t.observe(Duration::from_micros(10));
        assert_eq!(t.get(), RETRY_MIN);
        for _ in 0..100 {
            t.observe(Duration::from_millis(100));
        }
        assert!(t.get() > Duration::from_millis(300) && t.get() <= Duration::from_millis(400));
        t.observe(Duration::from_secs(60));
        assert_eq!(t.get(), RETRY_MAX);
    }

    #[test]
    fn the_smoothed_wait_is_seven_eighths_old_and_one_eighth_new() {
        let mut t = RetryTimeout::new(Hysteresis::None);
        t.observe(Duration::from_millis(8));
        assert_eq!(t.smoothed(), Some(Duration::from_millis(8)));
        assert_eq!(t.get(), Duration::from_millis(32));
        t.observe(Duration::from_millis(16));
        assert_eq!(t.smoothed(), Some(Duration::from_millis(9)));
        assert_eq!(t.get(), Duration::from_millis(36));
    }

    #[test]
    fn a_backed_off_wait_holds_until_a_clean_sample() {
        let mut t = RetryTimeout::new(Hysteresis::None);
        t.back_off(Duration::from_millis(80));
        assert_eq!(t.get(), Duration::from_millis(80));
        t.back_off(Duration::from_millis(40));
        assert_eq!(t.get(), Duration::from_millis(80));
        t.back_off(Duration::from_secs(9));
        assert_eq!(t.get(), RETRY_MAX);
        t.observe(Duration::from_micros(100));
        assert_eq!(t.get(), RETRY_MIN);
    }

    #[test]
    fn the_backoff_doubles_up_to_the_cap() {
        assert_eq!(backed_off(RETRY_INITIAL), Duration::from_millis(40));
        assert_eq!(backed_off(Duration::from_millis(600)), RETRY_MAX);
        assert_eq!(backed_off(RETRY_MAX), RETRY_MAX);
        assert_eq!(backed_off(Duration::MAX), RETRY_MAX);
    }

    #[test]
    fn a_quarter_hysteresis_ignores_small_moves() {
        let mut t = RetryTimeout::new(Hysteresis::Quarter);
        // 4 x 5.5 ms = 22 ms: within a quarter of 20 ms, so it stays.
        t.observe(Duration::from_micros(5_500));
        assert_eq!(t.get(), RETRY_INITIAL);
        // The smoothed wait moves on all the same: 4 x 7 ms = 28 ms moves it.
        for _ in 0..40 {
            t.observe(Duration::from_millis(7));
        }
        assert!(t.get() > Duration::from_millis(25), "{:?}", t.get());
        let mut plain = RetryTimeout::new(Hysteresis::None);
        plain.observe(Duration::from_micros(5_500));
        assert_eq!(plain.get(), Duration::from_millis(22));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Observe(Duration),
        BackOff(Duration),
    }

    fn step() -> impl Strategy<Value = Step> {
        let wait = (0u64..=20_000_000_000).prop_map(Duration::from_nanos);
        prop_oneof![
            wait.clone().prop_map(Step::Observe),
            wait.prop_map(Step::BackOff)
        ]
    }

    proptest! {
        #[test]
        fn the_timeout_stays_within_its_bounds(
            quarter: bool,
            steps in proptest::collection::vec(step(), 0..64),
        ) {
            let h = if quarter { Hysteresis::Quarter } else { Hysteresis::None };
            let mut t = RetryTimeout::new(h);
            for s in steps {
                let before = t.get();
                match s {
                    Step::Observe(d) => {
                        t.observe(d);
                        let target = (t.smoothed().expect("observed") * 4)
                            .clamp(RETRY_MIN, RETRY_MAX);
                        if h == Hysteresis::None {
                            prop_assert_eq!(t.get(), target);
                        } else {
                            prop_assert!(t.get() == target || t.get() == before);
                        }
                    }
                    Step::BackOff(d) => {
                        t.back_off(d);
                        prop_assert!(t.get() >= before);
                        prop_assert!(t.get() >= d.min(RETRY_MAX));
                    }
                }
                prop_assert!(t.get() >= RETRY_MIN && t.get() <= RETRY_MAX, "{:?}", t.get());
            }
        }

        #[test]
        fn the_backoff_never_passes_the_cap(nanos in 0u64..=u64::MAX) {
            let d = Duration::from_nanos(nanos);
            let b = backed_off(d);
            prop_assert!(b <= RETRY_MAX);
            prop_assert!(b >= d.min(RETRY_MAX));
        }
    }
}
