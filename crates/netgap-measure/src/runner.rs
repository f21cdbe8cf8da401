//! The runner owns timing and repetitions: warm-up, calibration of the
//! iteration count from a time budget, the measured repetitions, CPU meters
//! around each, and the check that every byte sent was received (or, over an
//! unreliable flow, received or counted lost). Tests only move bytes; the
//! peer's server role is driven through [`PeerControl`].

use crate::bench::{ClientRole, RepOutcome};
use netgap_core::cpu::CpuUsage;
use netgap_core::spec::MAX_ITERATIONS;
use netgap_core::stats::LatencyHistogram;
use netgap_proto::message::Phase;
use netgap_transport::cpu::CpuMeter;
use netgap_transport::{DatagramStats, FlowError};
use std::time::Duration;

/// How many iterations one repetition runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IterationPolicy {
    /// Exactly this many (the seeds used 100,000).
    Fixed(u64),
    /// As many as fill this much time, calibrated during warm-up.
    Budget(Duration),
}

/// Confidence-driven repetition (`--ci LEVEL,WIDTH` with `--ci-reps
/// MIN,MAX`, netperf's `-I` and `-i`): repeat until the Student-t confidence
/// interval of the mean is narrow enough, within a repetition range.
///
/// Invariants (checked by [`CiTarget::new`]): `0 < confidence_pct < 100`,
/// `half_width_pct > 0`, `2 <= min_reps <= max_reps`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CiTarget {
    /// Confidence level in percent (99.0).
    pub confidence_pct: f64,
    /// Largest half-width of the interval, in percent of the mean (2.0).
    pub half_width_pct: f64,
    /// Repetitions always measured.
    pub min_reps: u32,
    /// Repetitions never exceeded, target met or not.
    pub max_reps: u32,
}

/// Why a confidence target is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CiTargetError {
    /// The confidence level is not strictly between 0 and 100 percent.
    #[error("confidence level {0} must lie between 0 and 100 (percent)")]
    Level(f64),
    /// The interval's half-width is not a positive percentage.
    #[error("interval width {0} must be a positive percentage of the mean")]
    Width(f64),
    /// The repetition bounds are out of order or below two.
    #[error("repetitions {0},{1}: need 2 <= MIN <= MAX (an interval needs two repetitions)")]
    Reps(u32, u32),
}

/// Default `--ci-reps`: at least 3 repetitions, at most 30.
pub(crate) const DEFAULT_CI_REPS: (u32, u32) = (3, 30);

impl CiTarget {
    /// A checked target; the error names the bad value.
    pub fn new(
        confidence_pct: f64,
        half_width_pct: f64,
        min_reps: u32,
        max_reps: u32,
    ) -> Result<CiTarget, CiTargetError> {
        if !(confidence_pct > 0.0 && confidence_pct < 100.0) {
            return Err(CiTargetError::Level(confidence_pct));
        }
        if !(half_width_pct > 0.0 && half_width_pct.is_finite()) {
            return Err(CiTargetError::Width(half_width_pct));
        }
        if min_reps < 2 || max_reps < min_reps {
            return Err(CiTargetError::Reps(min_reps, max_reps));
        }
        Ok(CiTarget {
            confidence_pct,
            half_width_pct,
            min_reps,
            max_reps,
        })
    }

    /// Half-width of the interval of `values` at this confidence, in percent
    /// of their mean; infinite for fewer than 2 values or a zero mean.
    pub fn half_width_pct_of(&self, values: &[f64]) -> f64 {
        let (Some(mean), Some(sd)) = (
            netgap_core::stats::mean(values),
            netgap_core::stats::sample_stdev(values),
        ) else {
            return f64::INFINITY;
        };
        if mean == 0.0 {
            return f64::INFINITY;
        }
        let t =
            netgap_core::stats::t_quantile(self.confidence_pct / 100.0, values.len() as u64 - 1);
        100.0 * t * sd / (values.len() as f64).sqrt() / mean.abs()
    }

    /// Whether `values` (the repetitions so far) call for no more: the target
    /// is met after at least `min_reps`, or `max_reps` were measured.
    pub fn done(&self, values: &[f64]) -> bool {
        let n = values.len();
        n >= self.max_reps as usize
            || (n >= self.min_reps as usize
                && self.half_width_pct_of(values) <= self.half_width_pct)
    }

    /// The outcome to record for the final `values`.
    pub fn outcome(&self, values: &[f64]) -> netgap_core::record::CiOutcome {
        let achieved = self.half_width_pct_of(values);
        netgap_core::record::CiOutcome {
            confidence_pct: self.confidence_pct,
            half_width_pct: self.half_width_pct,
            achieved_half_width_pct: if achieved.is_finite() { achieved } else { -1.0 },
            met: achieved <= self.half_width_pct,
        }
    }
}

/// The measurement method of a point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Method {
    /// Measured repetitions, at least 1.
    pub reps: u32,
    /// Iterations per repetition.
    pub iterations: IterationPolicy,
    /// Uncounted warm-up iterations before calibration; `None` picks 10% of
    /// a fixed count (at most 10,000), or none beyond calibration for a budget.
    pub warmup: Option<u64>,
    /// Repeat until this confidence target is met instead of exactly `reps`
    /// times; `None` keeps the seeds' fixed count.
    pub ci: Option<CiTarget>,
}

/// The server role's report of one repetition, received over the control
/// channel.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ServerRep {
    /// Payload bytes the server received.
    pub bytes_rx: u64,
    /// Payload bytes the server sent.
    pub bytes_tx: u64,
    /// The server's CPU usage over the repetition.
    pub cpu: CpuUsage,
    /// The server end's datagram counters over the repetition, for an
    /// unreliable flow.
    pub datagrams: Option<DatagramStats>,
}

/// Both ends of a point, one repetition at a time: where the client role
/// runs (in this process, or on an agent) is theirs to know; the runner
/// only times, calibrates and checks what they report.
pub trait PointEnds {
    /// Runs one repetition of `iterations` iterations on both ends and
    /// returns what each measured; a latency test's client round trips, in
    /// nanoseconds, go into `hist`.
    fn rep(
        &mut self,
        iterations: u64,
        phase: Phase,
        hist: &mut LatencyHistogram,
    ) -> Result<RepMeasurement, RunError>;
}

/// Drives the peer's server role, one repetition at a time.
pub trait PeerControl {
    /// Asks the peer to run its role for `iterations`; returns once asked.
    fn start(&mut self, iterations: u64, phase: Phase) -> Result<(), RunError>;
    /// Waits for the peer's report of the repetition just run.
    fn finish(&mut self) -> Result<ServerRep, RunError>;
}

/// Why a point could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The data flow failed.
    #[error("data flow: {0}")]
    Flow(#[from] FlowError),
    /// The control channel or the peer failed.
    #[error("{0}")]
    Peer(String),
    /// The peer sent nothing for the whole wait for its report: alive or
    /// not, it will not say why the repetition failed.
    #[error("{0}")]
    PeerSilent(String),
    /// Bytes were lost or invented: a transport bug.
    #[error("{direction}: {sent} bytes sent but {received} received")]
    ByteMismatch {
        /// `client to server` or `server to client`.
        direction: &'static str,
        /// Bytes the sender reported.
        sent: u64,
        /// Bytes the receiver reported.
        received: u64,
    },
    /// Over an unreliable flow, bytes received plus bytes counted lost are
    /// not the bytes sent: a transport bug.
    #[error("{direction}: {sent} bytes sent but {received} received and {lost} counted lost")]
    LossMismatch {
        /// `client to server` or `server to client`.
        direction: &'static str,
        /// Bytes the sender reported.
        sent: u64,
        /// Bytes the receiver reported.
        received: u64,
        /// Bytes the receiver's flow counted lost.
        lost: u64,
    },
}

/// One measured repetition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepMeasurement {
    /// What the client role measured.
    pub client: RepOutcome,
    /// The client's CPU usage.
    pub client_cpu: CpuUsage,
    /// The client end's datagram counters over the repetition, for an
    /// unreliable flow.
    pub client_datagrams: Option<DatagramStats>,
    /// What the server role reported.
    pub server: ServerRep,
}

/// Everything measured for one point.
pub struct PointMeasurement {
    /// Measured repetitions, in order.
    pub reps: Vec<RepMeasurement>,
    /// Iterations in each measured repetition.
    pub iterations_per_rep: u64,
    /// Uncounted iterations run before them (warm-up and calibration).
    pub warmup_iterations: u64,
    /// Round trips of all measured repetitions, in nanoseconds.
    pub rtt_hist: LatencyHistogram,
    /// What `--ci` achieved, when the method asked for a target.
    pub ci: Option<netgap_core::record::CiOutcome>,
    /// Choices the transport made in setting up the flow's data path
    /// ([`netgap_transport::Flow::path_choices`]), for the record's stack.
    pub path_choices: Vec<String>,
}

/// Calibration stops once a trial fills this fraction of the budget.
const CALIBRATION_FRACTION: u32 = 10;
/// Growth of the trial iteration count between calibration steps.
const CALIBRATION_GROWTH: u64 = 4;
/// Warm-up cap for fixed iteration counts.
const MAX_DEFAULT_WARMUP: u64 = 10_000;

/// The client role in this process, on this thread, and the peer's server
/// role driven over its control channel.
struct LocalEnds<'a> {
    role: &'a mut dyn ClientRole,
    peer: &'a mut dyn PeerControl,
    /// The role's datagram counters at the end of the last repetition.
    datagrams: Option<DatagramStats>,
}

impl PointEnds for LocalEnds<'_> {
    fn rep(
        &mut self,
        iterations: u64,
        phase: Phase,
        hist: &mut LatencyHistogram,
    ) -> Result<RepMeasurement, RunError> {
        self.peer.start(iterations, phase)?;
        let meter = CpuMeter::start();
        let client = self.role.run(iterations, hist)?;
        let client_cpu = meter.stop(client.helper_cpu_ns);
        let server = self.peer.finish()?;
        let now = self.role.datagram_stats();
        let client_datagrams = now.map(|n| n.since(&self.datagrams.unwrap_or_default()));
        self.datagrams = now;
        Ok(RepMeasurement {
            client,
            client_cpu,
            client_datagrams,
            server,
        })
    }
}

struct Driver<'a> {
    ends: &'a mut dyn PointEnds,
}

impl Driver<'_> {
    fn rep(
        &mut self,
        iterations: u64,
        phase: Phase,
        hist: &mut LatencyHistogram,
    ) -> Result<RepMeasurement, RunError> {
        let m = self.ends.rep(iterations, phase, hist)?;
        let RepMeasurement {
            client,
            client_datagrams,
            server,
            ..
        } = m;
        let lost = |d: Option<DatagramStats>| d.map(|d| d.lost_bytes);
        check_bytes(
            "client to server",
            client.bytes_tx,
            server.bytes_rx,
            lost(server.datagrams),
        )?;
        check_bytes(
            "server to client",
            server.bytes_tx,
            client.bytes_rx,
            lost(client_datagrams),
        )?;
        Ok(m)
    }
}

/// Bytes sent must all be received; over an unreliable flow (`lost` known)
/// received plus lost must be exactly the bytes sent.
fn check_bytes(
    direction: &'static str,
    sent: u64,
    received: u64,
    lost: Option<u64>,
) -> Result<(), RunError> {
    match lost {
        None if sent != received => Err(RunError::ByteMismatch {
            direction,
            sent,
            received,
        }),
        Some(lost) if received.checked_add(lost) != Some(sent) => Err(RunError::LossMismatch {
            direction,
            sent,
            received,
            lost,
        }),
        _ => Ok(()),
    }
}

/// The iterations that fill `budget`: trials growing by
/// [`CALIBRATION_GROWTH`] until one fills [`CALIBRATION_FRACTION`] of it.
/// That trial is run once more and the faster of the two sets the count:
/// one stalled trial (a cold first transfer, a preempted thread on a busy
/// machine) would otherwise make every repetition far shorter than the
/// budget (a 20 ms budget whose single-iteration trial stalled for 20 ms
/// gave repetitions of one iteration, a whole point in a second). A second
/// trial that no longer fills the fraction was the stall: growth goes on.
fn calibrate(
    d: &mut Driver<'_>,
    budget: Duration,
    scratch: &mut LatencyHistogram,
    warmup_iterations: &mut u64,
) -> Result<u64, RunError> {
    let budget_ns = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX).max(1);
    let target_ns = budget_ns / u64::from(CALIBRATION_FRACTION);
    let mut trial = 1u64;
    let mut timed = |d: &mut Driver<'_>, n: u64| -> Result<u64, RunError> {
        let m = d.rep(n, Phase::Warmup, scratch)?;
        *warmup_iterations += n;
        Ok(m.client.elapsed_ns.max(1))
    };
    loop {
        let mut elapsed_ns = timed(d, trial)?;
        let last = trial >= MAX_ITERATIONS / CALIBRATION_GROWTH;
        if elapsed_ns >= target_ns || last {
            if !last {
                elapsed_ns = elapsed_ns.min(timed(d, trial)?);
            }
            if elapsed_ns >= target_ns || last {
                let per_iteration_ns = (elapsed_ns as f64 / trial as f64).max(1e-3);
                return Ok(((budget_ns as f64 / per_iteration_ns) as u64).clamp(1, MAX_ITERATIONS));
            }
        }
        trial *= CALIBRATION_GROWTH;
    }
}

/// Measures one point: warm-up, calibration, then `method.reps` repetitions,
/// or with a [`CiTarget`] as many as it needs (judged on the client role's
/// per-repetition value). `on_rep` is called after each measured repetition
/// with its index.
pub fn measure_point(
    role: &mut dyn ClientRole,
    peer: &mut dyn PeerControl,
    method: &Method,
    on_rep: &mut dyn FnMut(u32),
) -> Result<PointMeasurement, RunError> {
    let datagrams = role.datagram_stats();
    let mut ends = LocalEnds {
        role,
        peer,
        datagrams,
    };
    measure_ends(&mut ends, method, on_rep)
}

/// Measures one point as [`measure_point`] does, over `ends` wherever its
/// roles run: warm-up, calibration and the repetitions, each checked for
/// bytes lost or invented.
pub fn measure_ends(
    ends: &mut dyn PointEnds,
    method: &Method,
    on_rep: &mut dyn FnMut(u32),
) -> Result<PointMeasurement, RunError> {
    let mut d = Driver { ends };
    let mut scratch = LatencyHistogram::new();
    let mut warmup_iterations = 0u64;

    let explicit_warmup = match (method.warmup, method.iterations) {
        (Some(n), _) => n,
        (None, IterationPolicy::Fixed(n)) => (n / 10).clamp(1, MAX_DEFAULT_WARMUP),
        (None, IterationPolicy::Budget(_)) => 0,
    };
    if explicit_warmup > 0 {
        d.rep(
            explicit_warmup.min(MAX_ITERATIONS),
            Phase::Warmup,
            &mut scratch,
        )?;
        warmup_iterations += explicit_warmup;
    }

    let iterations_per_rep = match method.iterations {
        IterationPolicy::Fixed(n) => n,
        IterationPolicy::Budget(budget) => {
            calibrate(&mut d, budget, &mut scratch, &mut warmup_iterations)?
        }
    };

    let mut rtt_hist = LatencyHistogram::new();
    let mut reps = Vec::with_capacity(method.reps as usize);
    let mut values = Vec::new();
    let mut i = 0u32;
    loop {
        let done = match &method.ci {
            None => i >= method.reps,
            Some(target) => target.done(&values),
        };
        if done {
            break;
        }
        let m = d.rep(iterations_per_rep, Phase::Measure, &mut rtt_hist)?;
        values.push(m.client.value);
        reps.push(m);
        on_rep(i);
        i += 1;
    }
    Ok(PointMeasurement {
        reps,
        iterations_per_rep,
        warmup_iterations,
        rtt_hist,
        ci: method.ci.map(|t| t.outcome(&values)),
        path_choices: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> CiTarget {
        CiTarget::new(99.0, 2.0, 3, 30).expect("valid target")
    }

    #[test]
    fn ci_stops_once_the_interval_is_narrow_enough() {
        let t = target();
        assert!(!t.done(&[100.0, 100.1]), "fewer than the minimum");
        assert!(t.done(&[100.0, 100.1, 99.9]));
        let outcome = t.outcome(&[100.0, 100.1, 99.9]);
        assert!(outcome.met && outcome.achieved_half_width_pct < 2.0);
    }

    #[test]
    fn ci_gives_up_at_the_maximum_and_says_so() {
        let t = target();
        let noisy: Vec<f64> = (0..30)
            .map(|i| if i % 2 == 0 { 50.0 } else { 150.0 })
            .collect();
        assert!(!t.done(&noisy[..29]));
        assert!(t.done(&noisy));
        let outcome = t.outcome(&noisy);
        assert!(
            !outcome.met && outcome.achieved_half_width_pct > 2.0,
            "{outcome:?}"
        );
    }

    #[test]
    fn ci_targets_are_checked() {
        assert!(CiTarget::new(100.0, 2.0, 3, 30).is_err());
        assert!(CiTarget::new(99.0, 0.0, 3, 30).is_err());
        assert!(CiTarget::new(99.0, 2.0, 1, 30).is_err());
        assert!(CiTarget::new(99.0, 2.0, 5, 4).is_err());
    }

    #[test]
    fn a_reliable_flow_must_deliver_every_byte() {
        assert!(check_bytes("client to server", 10, 10, None).is_ok());
        assert!(matches!(
            check_bytes("client to server", 10, 9, None),
            Err(RunError::ByteMismatch {
                sent: 10,
                received: 9,
                ..
            })
        ));
    }

    #[test]
    fn an_unreliable_flow_must_account_for_every_byte() {
        assert!(check_bytes("server to client", 10, 7, Some(3)).is_ok());
        assert!(check_bytes("server to client", 10, 10, Some(0)).is_ok());
        let e = check_bytes("server to client", 10, 7, Some(2)).err();
        assert!(
            matches!(
                e,
                Some(RunError::LossMismatch {
                    sent: 10,
                    received: 7,
                    lost: 2,
                    ..
                })
            ),
            "{e:?}"
        );
        assert!(check_bytes("server to client", 10, u64::MAX, Some(1)).is_err());
    }

    /// A role whose repetitions take `per_iteration_ns` each, except the
    /// ones listed in `stalls` (by call, from 0), which take `stall_ns`.
    struct Scripted {
        per_iteration_ns: u64,
        stalls: Vec<usize>,
        stall_ns: u64,
        calls: usize,
    }

    impl ClientRole for Scripted {
        fn run(
            &mut self,
            iterations: u64,
            _rtt_hist: &mut LatencyHistogram,
        ) -> Result<RepOutcome, FlowError> {
            let elapsed_ns = if self.stalls.contains(&self.calls) {
                self.stall_ns
            } else {
                iterations * self.per_iteration_ns
            };
            self.calls += 1;
            Ok(RepOutcome {
                elapsed_ns,
                value: 1.0,
                bytes_tx: 0,
                bytes_rx: 0,
                helper_cpu_ns: 0,
            })
        }
    }

    struct QuietPeer;

    impl PeerControl for QuietPeer {
        fn start(&mut self, _iterations: u64, _phase: Phase) -> Result<(), RunError> {
            Ok(())
        }
        fn finish(&mut self) -> Result<ServerRep, RunError> {
            Ok(ServerRep::default())
        }
    }

    fn iterations_for_20ms(stalls: Vec<usize>) -> u64 {
        let mut role = Scripted {
            per_iteration_ns: 10_000,
            stalls,
            stall_ns: 30_000_000,
            calls: 0,
        };
        let method = Method {
            reps: 2,
            iterations: IterationPolicy::Budget(Duration::from_millis(20)),
            warmup: None,
            ci: None,
        };
        measure_point(&mut role, &mut QuietPeer, &method, &mut |_| {})
            .expect("measured")
            .iterations_per_rep
    }

    #[test]
    fn one_stalled_calibration_trial_does_not_shorten_the_repetitions() {
        // 10 µs an iteration: 2,000 fill 20 ms.
        assert_eq!(iterations_for_20ms(vec![]), 2000);
        // The first trial (one iteration) stalls for 30 ms: alone it would
        // give repetitions of one iteration.
        assert_eq!(iterations_for_20ms(vec![0]), 2000);
        // A stall in the trial that fills the fraction, or in its repeat,
        // is outvoted by the other.
        for call in 1..8 {
            let n = iterations_for_20ms(vec![call]);
            assert!((1800..=2000).contains(&n), "stall in call {call}: {n}");
        }
    }
}
