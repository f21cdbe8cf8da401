//! The runner driven in memory: a scripted client role and a scripted peer,
//! no sockets, so calibration, warm-up, repetition counts and the byte check
//! are tested exactly.

use netgap::bench::{ClientRole, RepOutcome};
use netgap::proto::message::Phase;
use netgap::runner::{
    measure_point, CiTarget, IterationPolicy, Method, PeerControl, RunError, ServerRep,
};
use netgap::stats::LatencyHistogram;
use netgap::transport::FlowError;
use std::time::Duration;

/// A role whose every iteration "takes" `ns_per_iteration` and moves
/// `size_bytes` each way; records what it was asked to run.
struct FakeRole {
    ns_per_iteration: u64,
    size_bytes: u64,
    runs: Vec<u64>,
}

impl ClientRole for FakeRole {
    fn run(
        &mut self,
        iterations: u64,
        rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        self.runs.push(iterations);
        for _ in 0..iterations.min(1000) {
            rtt_hist.record_ns(self.ns_per_iteration);
        }
        let bytes = self.size_bytes * iterations;
        Ok(RepOutcome {
            elapsed_ns: self.ns_per_iteration * iterations,
            value: self.ns_per_iteration as f64,
            bytes_tx: bytes,
            bytes_rx: bytes,
            helper_cpu_ns: 0,
        })
    }
}

/// A peer that echoes the byte counts it should have seen, minus `short_bytes`
/// on the measured repetition `short_on`.
struct FakePeer {
    size_bytes: u64,
    pending: Option<(u64, Phase)>,
    phases: Vec<(u64, Phase)>,
    short_on: Option<usize>,
}

impl PeerControl for FakePeer {
    fn start(&mut self, iterations: u64, phase: Phase) -> Result<(), RunError> {
        self.pending = Some((iterations, phase));
        self.phases.push((iterations, phase));
        Ok(())
    }

    fn finish(&mut self) -> Result<ServerRep, RunError> {
        let (iterations, _) = self
            .pending
            .take()
            .ok_or_else(|| RunError::Peer("finish without start".into()))?;
        let measured = self
            .phases
            .iter()
            .filter(|(_, p)| *p == Phase::Measure)
            .count();
        let mut bytes = self.size_bytes * iterations;
        if self.short_on == Some(measured) {
            bytes -= 1;
        }
        Ok(ServerRep {
            bytes_rx: bytes,
            bytes_tx: self.size_bytes * iterations,
            cpu: Default::default(),
            datagrams: None,
        })
    }
}

fn setup(ns: u64, short_on: Option<usize>) -> (FakeRole, FakePeer) {
    (
        FakeRole {
            ns_per_iteration: ns,
            size_bytes: 8,
            runs: Vec::new(),
        },
        FakePeer {
            size_bytes: 8,
            pending: None,
            phases: Vec::new(),
            short_on,
        },
    )
}

#[test]
fn fixed_iterations_warm_up_then_run_every_repetition() {
    let (mut role, mut peer) = setup(1000, None);
    let method = Method {
        reps: 5,
        iterations: IterationPolicy::Fixed(2000),
        warmup: None,
        ci: None,
    };
    let mut seen = Vec::new();
    let m = measure_point(&mut role, &mut peer, &method, &mut |i| seen.push(i)).expect("measured");
    assert_eq!(m.reps.len(), 5);
    assert_eq!(m.iterations_per_rep, 2000);
    assert_eq!(m.warmup_iterations, 200, "10% of a fixed count");
    assert_eq!(role.runs, vec![200, 2000, 2000, 2000, 2000, 2000]);
    assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    assert_eq!(peer.phases[0].1, Phase::Warmup);
    assert!(peer.phases[1..].iter().all(|(_, p)| *p == Phase::Measure));
    assert_eq!(
        m.rtt_hist.len(),
        5 * 1000,
        "only measured repetitions are in the histogram"
    );
}

#[test]
fn a_time_budget_is_filled_by_calibration() {
    // 10 us per iteration and a 100 ms budget: 10,000 iterations per rep.
    let (mut role, mut peer) = setup(10_000, None);
    let method = Method {
        reps: 3,
        iterations: IterationPolicy::Budget(Duration::from_millis(100)),
        warmup: Some(7),
        ci: None,
    };
    let m = measure_point(&mut role, &mut peer, &method, &mut |_| {}).expect("measured");
    assert_eq!(m.iterations_per_rep, 10_000);
    // The explicit warm-up, then trials growing by 4 until one fills a tenth
    // of the budget (10 ms = 1,000 iterations: 1, 4, 16, 64, 256, 1024),
    // that one twice (the faster of the two sets the count).
    assert_eq!(&role.runs[..8], &[7, 1, 4, 16, 64, 256, 1024, 1024]);
    assert_eq!(m.warmup_iterations, 7 + 1 + 4 + 16 + 64 + 256 + 1024 + 1024);
    assert_eq!(&role.runs[8..], &[10_000, 10_000, 10_000]);
}

#[test]
fn a_lost_byte_is_a_byte_mismatch_naming_the_direction() {
    let (mut role, mut peer) = setup(1000, Some(2));
    let method = Method {
        reps: 4,
        iterations: IterationPolicy::Fixed(10),
        warmup: Some(0),
        ci: None,
    };
    let e = measure_point(&mut role, &mut peer, &method, &mut |_| {})
        .err()
        .expect("mismatch found");
    assert!(
        matches!(
            e,
            RunError::ByteMismatch {
                direction: "client to server",
                sent: 80,
                received: 79
            }
        ),
        "{e}"
    );
}

/// A role whose repetitions report the values of `script` in turn.
struct ScriptedRole {
    script: Vec<f64>,
    next: usize,
}

impl ClientRole for ScriptedRole {
    fn run(
        &mut self,
        iterations: u64,
        _rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        let value = self.script[self.next % self.script.len()];
        self.next += 1;
        Ok(RepOutcome {
            elapsed_ns: 1000 * iterations,
            value,
            bytes_tx: 8 * iterations,
            bytes_rx: 8 * iterations,
            helper_cpu_ns: 0,
        })
    }
}

fn ci_method() -> Method {
    Method {
        reps: 10,
        iterations: IterationPolicy::Fixed(10),
        warmup: Some(0),
        ci: Some(CiTarget::new(99.0, 2.0, 3, 12).expect("valid target")),
    }
}

#[test]
fn ci_stops_at_the_minimum_when_the_repetitions_agree() {
    let (_, mut peer) = setup(1000, None);
    let mut role = ScriptedRole {
        script: vec![100.0, 100.2, 99.9, 100.1],
        next: 0,
    };
    let m = measure_point(&mut role, &mut peer, &ci_method(), &mut |_| {}).expect("measured");
    assert_eq!(m.reps.len(), 3);
    let ci = m.ci.expect("a --ci point records its outcome");
    assert!(ci.met, "{ci:?}");
    assert!(ci.achieved_half_width_pct <= 2.0);
    assert_eq!((ci.confidence_pct, ci.half_width_pct), (99.0, 2.0));
}

#[test]
fn ci_repeats_up_to_the_maximum_and_reports_a_missed_target() {
    let (_, mut peer) = setup(1000, None);
    let mut role = ScriptedRole {
        script: vec![60.0, 140.0],
        next: 0,
    };
    let m = measure_point(&mut role, &mut peer, &ci_method(), &mut |_| {}).expect("measured");
    assert_eq!(m.reps.len(), 12);
    let ci = m.ci.expect("outcome recorded");
    assert!(!ci.met && ci.achieved_half_width_pct > 2.0, "{ci:?}");
}

#[test]
fn ci_keeps_going_until_a_noisy_start_settles() {
    let (_, mut peer) = setup(1000, None);
    let mut script = vec![80.0, 120.0];
    script.extend(std::iter::repeat_n(100.0, 40));
    let mut role = ScriptedRole { script, next: 0 };
    let mut method = ci_method();
    method.ci = Some(CiTarget::new(95.0, 5.0, 3, 40).expect("valid"));
    let m = measure_point(&mut role, &mut peer, &method, &mut |_| {}).expect("measured");
    let n = m.reps.len();
    assert!(n > 3 && n < 40, "{n} repetitions");
    assert!(m.ci.expect("outcome").met);
}
