//! Interleaved comparison: the repetitions of several stacks or conditions
//! of one point taken in turns, so that whatever drifts while a run goes
//! (CPU frequency, other load, a neighbour's traffic) falls on every member
//! alike, and their records compare fairly.
//!
//! A *group* is what is compared: one point under each condition of
//! `--conditions`, or with `--interleave` every stack (transport, mode) of
//! one test and size under each condition. Each member gets one repetition
//! per *round*; the rounds alternate direction (A B C D, then D C B A, ...)
//! so that a drift that rises steadily through the run lands on each member
//! the same on average, and the condition in force at a round's end carries
//! into the next round without a switch.
//!
//! A member's first repetition warms up and calibrates its iteration count
//! as a point on its own would; every later one runs that count after a
//! short warm-up of its own, since each repetition opens a new flow: a link
//! whose MTU or offloads changed since the last one must be met by a new
//! connection (its MSS and segment sizes are fixed when it opens). The
//! record keeps the iterations per repetition and all warm-up iterations.
//!
//! Conditions are put in place through the [`ConditionSwitch`] the binary
//! hands in; after the last round, or a failure, the testbed goes back to
//! the conditions it had before the run.

use crate::conditions::{ConditionGuard, ConditionSwitch, LinkConditions};
use crate::coordinator::{build_record, open_session, CoordError, Coordinator, RunSummary};
use crate::plan::Plan;
use crate::point_loop::{run_points, Observer};
use crate::runner::{IterationPolicy, Method, PointMeasurement};
use crate::sink::RecordSink;
use netgap_core::host::HostFacts;
use netgap_core::record::{Interleaved, ResultRecord};
use netgap_core::spec::PointSpec;
use std::time::SystemTime;

/// One member of a group: a point of the plan under one condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Index of the point in [`Plan::points`].
    pub point: usize,
    /// Index of the condition in [`Settings::conditions`](crate::plan::Settings::conditions); `None` for a run
    /// without conditions.
    pub condition: Option<usize>,
}

/// The members compared with one another, in the order of a forward round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Members, condition-major: every point under the first condition,
    /// then every point under the second, ... so that a round switches the
    /// testbed once per condition.
    pub members: Vec<Member>,
}

/// The groups of an interleaved plan, in the order the plan lists their
/// first point: one per point, or with `--interleave` one per test and size.
pub fn groups(plan: &Plan) -> Vec<Group> {
    let mut keyed: Vec<((&str, u64), Vec<usize>)> = Vec::new();
    for (i, p) in plan.points.iter().enumerate() {
        if plan.settings.interleave {
            let key = (p.test.as_str(), p.size_bytes);
            match keyed.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(i),
                None => keyed.push((key, vec![i])),
            }
        } else {
            keyed.push(((p.test.as_str(), p.size_bytes), vec![i]));
        }
    }
    let conditions: Vec<Option<usize>> = if plan.settings.conditions.is_empty() {
        vec![None]
    } else {
        (0..plan.settings.conditions.len()).map(Some).collect()
    };
    keyed
        .into_iter()
        .map(|(_, points)| Group {
            members: conditions
                .iter()
                .flat_map(|&condition| points.iter().map(move |&point| Member { point, condition }))
                .collect(),
        })
        .collect()
}

/// The order of a group's repetitions: `(round, member index)` for `reps`
/// rounds over `members` members, even rounds forward and odd rounds
/// backward.
pub fn schedule(members: usize, reps: u32) -> Vec<(u32, usize)> {
    let mut out = Vec::with_capacity(members * reps as usize);
    for round in 0..reps {
        if round % 2 == 0 {
            out.extend((0..members).map(|m| (round, m)));
        } else {
            out.extend((0..members).rev().map(|m| (round, m)));
        }
    }
    out
}

/// What one member gathered over the rounds.
struct Gathered {
    measurement: Option<PointMeasurement>,
    facts: Option<(HostFacts, HostFacts)>,
    started: SystemTime,
}

/// Runs an interleaved plan: every group's rounds, one record per member
/// once its group is done. `switch` must be given when the plan has
/// conditions. The testbed goes back to its conditions from before the run
/// however the run ends.
pub(crate) fn run(
    plan: &Plan,
    switch: Option<&mut dyn ConditionSwitch>,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<RunSummary, CoordError> {
    let mut rounds = Rounds::open(plan, switch)?;
    // Each group with the spec its observer rows are named after.
    let groups: Vec<(usize, PointSpec, Group)> = groups(plan)
        .into_iter()
        .enumerate()
        .map(|(i, g)| (i, plan.points[g.members[0].point].clone(), g))
        .collect();
    let outcome = run_points(
        &groups,
        |(_, spec, _)| spec,
        sinks,
        observer,
        |(index, _, group), observer| -> Result<Vec<ResultRecord>, CoordError> {
            let measured = rounds.measure_group(group, *index, observer)?;
            Ok(measured.into_iter().map(|(_, r)| r).collect())
        },
    );
    let restored = rounds.finish();
    let points = outcome?;
    restored?;
    Ok(RunSummary { points })
}

/// The rounds of an interleaved plan's groups, measured one group at a
/// time by whoever drives the run (a run's points, a sweep's sizes): the
/// session, the conditions in force and the switch that holds the links.
pub(crate) struct Rounds<'p, 's> {
    state: RunState<'p, 's>,
}

impl<'p, 's> Rounds<'p, 's> {
    /// Checks the plan's conditions against its testbed and opens the
    /// session. `switch` must be given when the plan has conditions; once
    /// it is held, [`Rounds::finish`] (or a drop) puts the links back.
    pub(crate) fn open(
        plan: &'p Plan,
        switch: Option<&'s mut dyn ConditionSwitch>,
    ) -> Result<Rounds<'p, 's>, CoordError> {
        let base = plan.settings.testbed.as_ref().and_then(|t| t.conditions);
        let targets: Vec<LinkConditions> = match (&base, plan.settings.conditions.is_empty()) {
            (_, true) => Vec::new(),
            (Some(base), false) => plan
                .settings
                .conditions
                .iter()
                .map(|c| c.apply_to(base))
                .collect(),
            (None, false) => return Err(CoordError::NoTestbedConditions),
        };
        if !targets.is_empty() && switch.is_none() {
            return Err(CoordError::NoSwitch);
        }
        let guard = match (switch, base) {
            (Some(s), Some(base)) => Some(ConditionGuard::new(s, base)),
            _ => None,
        };
        let mut state = RunState {
            plan,
            coord: None,
            in_force: base,
            targets,
            run_id: run_id(),
            guard,
        };
        state.coord()?;
        Ok(Rounds { state })
    }

    /// Measures one group's rounds: each member's record, with the group
    /// named by `index` in `options.interleaved`.
    pub(crate) fn measure_group(
        &mut self,
        group: &Group,
        index: usize,
        observer: &mut dyn Observer,
    ) -> Result<Vec<(Member, ResultRecord)>, CoordError> {
        self.state.measure_group(group, index, observer)
    }

    /// Ends the session and puts the links back under the conditions they
    /// had before the run.
    pub(crate) fn finish(mut self) -> Result<(), CoordError> {
        if let Some(c) = self.state.coord.take() {
            c.bye();
        }
        match self.state.guard.take() {
            Some(g) => g.restore().map_err(CoordError::Restore),
            None => Ok(()),
        }
    }
}

/// A name for the run's groups no other run shares: the start time to the
/// second, the process and a counter.
fn run_id() -> String {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace([':', '-'], "");
    format!("{stamp}-{}", std::process::id())
}

struct RunState<'p, 's> {
    plan: &'p Plan,
    /// The session; reopened after every switch, so the host facts it
    /// records are read under the new conditions.
    coord: Option<Coordinator>,
    /// The conditions the links are under now.
    in_force: Option<LinkConditions>,
    /// The conditions of the plan, applied to the testbed's own.
    targets: Vec<LinkConditions>,
    run_id: String,
    /// Holds the links while the run switches them; puts them back when
    /// dropped.
    guard: Option<ConditionGuard<'s>>,
}

impl RunState<'_, '_> {
    fn coord(&mut self) -> Result<&mut Coordinator, CoordError> {
        match &mut self.coord {
            Some(c) => Ok(c),
            slot => Ok(slot.insert(open_session(self.plan)?)),
        }
    }

    /// Puts the links under `to` unless they are already, and opens a new
    /// session under it.
    fn switch_to(&mut self, to: LinkConditions) -> Result<(), CoordError> {
        if self.in_force.is_some_and(|f| f.same_setting(&to)) {
            return Ok(());
        }
        let Some(guard) = self.guard.as_mut() else {
            return Err(CoordError::NoSwitch);
        };
        if let Some(c) = self.coord.take() {
            c.bye();
        }
        // Unknown until the switch succeeds: a failed switch may have left
        // some links changed.
        self.in_force = None;
        guard
            .switch_to(&to)
            .map_err(|source| CoordError::Switch { to, source })?;
        self.in_force = guard.in_force();
        self.coord()?;
        Ok(())
    }

    fn measure_group(
        &mut self,
        group: &Group,
        index: usize,
        observer: &mut dyn Observer,
    ) -> Result<Vec<(Member, ResultRecord)>, CoordError> {
        let plan = self.plan;
        let mut gathered: Vec<Gathered> = group
            .members
            .iter()
            .map(|_| Gathered {
                measurement: None,
                facts: None,
                started: SystemTime::now(),
            })
            .collect();
        for (round, m) in schedule(group.members.len(), plan.settings.method.reps) {
            let member = group.members[m];
            let spec = &plan.points[member.point];
            if let Some(c) = member.condition {
                let to = self.targets[c];
                self.switch_to(to)?;
                // The records say how the switch applied it.
                if let Some(applied) = self.in_force {
                    self.targets[c] = applied;
                }
            }
            let g = &mut gathered[m];
            let method = match &g.measurement {
                // The first repetition warms up and calibrates as a point
                // measured alone would.
                None => Method {
                    reps: 1,
                    ci: None,
                    ..plan.settings.method
                },
                // Later ones run the calibrated count on their new flow,
                // after the runner's warm-up for a fixed count (a tenth of
                // it) or the one asked for.
                Some(m) => Method {
                    reps: 1,
                    iterations: IterationPolicy::Fixed(m.iterations_per_rep),
                    warmup: plan.settings.method.warmup,
                    ci: None,
                },
            };
            if g.measurement.is_none() {
                g.started = SystemTime::now();
            }
            let coord = self.coord()?;
            let one = coord
                .measure(spec, &method, &mut |_| observer.rep_done(round))
                .map_err(|e| CoordError::point(spec, &spec.test, e))?;
            let facts = (coord.local_host().clone(), coord.peer_host().clone());
            let g = &mut gathered[m];
            g.facts = Some(facts);
            g.measurement = Some(match g.measurement.take() {
                None => one,
                Some(mut acc) => {
                    acc.reps.extend(one.reps);
                    acc.rtt_hist.merge(&one.rtt_hist);
                    acc.warmup_iterations += one.warmup_iterations;
                    acc
                }
            });
        }
        let with = u32::try_from(group.members.len()).unwrap_or(u32::MAX);
        let mut records = Vec::with_capacity(group.members.len());
        for (member, g) in group.members.iter().zip(gathered) {
            let spec: &PointSpec = &plan.points[member.point];
            let (Some(m), Some((host, peer))) = (g.measurement, g.facts) else {
                continue;
            };
            let conditions = member.condition.map(|c| self.targets[c]);
            let mut record = build_record(spec, &m, plan, &host, &peer, g.started, conditions)
                .map_err(|e| CoordError::point(spec, &spec.test, e))?;
            if let Some(o) = record.options.as_mut() {
                o.interleaved = Some(Interleaved {
                    group: format!("{}-{index}", self.run_id),
                    with: Some(with),
                });
            }
            records.push((*member, record));
        }
        Ok(records)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::conditions::{cross, ConditionAxis};
    use crate::plan::RunRequest;

    fn plan(transports: &[&str], sizes: &[u64], conditions: &[&str], interleave: bool) -> Plan {
        let mut r = RunRequest::new(&["stream"]);
        r.transport.transports = transports.iter().map(|t| t.to_string()).collect();
        r.method.sizes = Some(sizes.to_vec());
        r.method.reps = Some(3);
        let mut p = Plan::from_request(&r).expect("valid");
        let axes: Vec<ConditionAxis> = conditions
            .iter()
            .map(|c| ConditionAxis::parse(c).expect("axis"))
            .collect();
        p.settings.conditions = cross(&axes).expect("cross");
        p.settings.interleave = interleave;
        p
    }

    #[test]
    fn rounds_take_every_member_once_and_alternate_direction() {
        let order = schedule(4, 3);
        assert_eq!(
            order,
            [
                (0, 0),
                (0, 1),
                (0, 2),
                (0, 3),
                (1, 3),
                (1, 2),
                (1, 1),
                (1, 0),
                (2, 0),
                (2, 1),
                (2, 2),
                (2, 3)
            ]
        );
        // Every member's repetition r comes before any member's r + 1.
        for w in order.windows(2) {
            assert!(w[0].0 <= w[1].0);
        }
        assert!(schedule(3, 0).is_empty());
    }

    #[test]
    fn conditions_make_one_group_per_point_condition_major() {
        let p = plan(
            &["tcp"],
            &[1024, 65536],
            &["mtu=1500,9000", "offload=on,off"],
            false,
        );
        let g = groups(&p);
        assert_eq!(g.len(), 2, "one group per point");
        for (i, group) in g.iter().enumerate() {
            assert_eq!(group.members.len(), 4);
            assert!(group.members.iter().all(|m| m.point == i));
            let conds: Vec<Option<usize>> = group.members.iter().map(|m| m.condition).collect();
            assert_eq!(conds, [Some(0), Some(1), Some(2), Some(3)]);
        }
    }

    #[test]
    fn interleave_groups_the_stacks_of_each_test_and_size() {
        let p = plan(&["tcp", "unix"], &[1024, 65536], &[], true);
        let g = groups(&p);
        assert_eq!(g.len(), 2, "one group per size");
        for group in &g {
            let size = p.points[group.members[0].point].size_bytes;
            let stacks: Vec<&str> = group
                .members
                .iter()
                .map(|m| p.points[m.point].transport.as_str())
                .collect();
            assert_eq!(stacks, ["tcp", "unix"]);
            assert!(group
                .members
                .iter()
                .all(|m| p.points[m.point].size_bytes == size && m.condition.is_none()));
        }
        // With conditions too: every stack under the first condition, then
        // every stack under the second.
        let p = plan(&["tcp", "unix"], &[1024], &["mtu=1500,9000"], true);
        let g = groups(&p);
        let members: Vec<(&str, Option<usize>)> = g[0]
            .members
            .iter()
            .map(|m| (p.points[m.point].transport.as_str(), m.condition))
            .collect();
        assert_eq!(
            members,
            [
                ("tcp", Some(0)),
                ("unix", Some(0)),
                ("tcp", Some(1)),
                ("unix", Some(1))
            ]
        );
    }

    /// A switch that remembers what it was asked: the conditions of each
    /// switch, `None` for a restore.
    pub(crate) struct Recorder(pub(crate) Vec<Option<LinkConditions>>);

    impl ConditionSwitch for Recorder {
        fn switch(
            &mut self,
            to: &LinkConditions,
        ) -> Result<LinkConditions, crate::conditions::SwitchFailure> {
            self.0.push(Some(*to));
            Ok(*to)
        }

        fn restore(&mut self) -> Result<(), crate::conditions::SwitchFailure> {
            self.0.push(None);
            Ok(())
        }
    }

    /// A sink that keeps the records where the test can read them.
    pub(crate) struct Memory(
        pub(crate) std::rc::Rc<std::cell::RefCell<Vec<ResultRecord>>>,
        pub(crate) std::path::PathBuf,
    );

    impl RecordSink for Memory {
        fn append(&mut self, record: &ResultRecord) -> std::io::Result<()> {
            self.0.borrow_mut().push(record.clone());
            Ok(())
        }
        fn path(&self) -> &std::path::Path {
            &self.1
        }
    }

    struct Quiet;
    impl Observer for Quiet {}

    #[test]
    fn an_interleaved_run_switches_only_on_change_and_records_each_condition() {
        // On loopback, with a switch that only remembers: the run's own
        // logic, without a testbed or root.
        let mut p = plan(&["tcp"], &[1024], &["rate=1G,2G"], false);
        p.settings.method.iterations = IterationPolicy::Fixed(50);
        let base = LinkConditions::plain(1500);
        p.settings.testbed = Some(crate::cluster::TestbedPath {
            topology: "switch".into(),
            conditions: Some(base),
            ..Default::default()
        });
        let mut rec = Recorder(Vec::new());
        let kept = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut sinks: Vec<Box<dyn RecordSink>> =
            vec![Box::new(Memory(kept.clone(), "mem".into()))];
        let summary =
            crate::run::run_plan(&p, Some(&mut rec), &mut sinks, &mut Quiet).expect("runs");
        assert_eq!(summary.points, 2, "one record per condition");
        let rates: Vec<Option<Option<u64>>> = rec.0.iter().map(|c| c.map(|c| c.rate_bps)).collect();
        // Round 0 forward (1G, 2G), round 1 backward (2G stays, 1G), round
        // 2 forward (1G stays, 2G), then back to the testbed's own.
        let (g1, g2) = (Some(1_000_000_000), Some(2_000_000_000));
        assert_eq!(rates, [Some(g1), Some(g2), Some(g1), Some(g2), None]);
        let records = kept.borrow();
        assert_eq!(records.len(), 2);
        let mut groups = Vec::new();
        for (r, want) in records.iter().zip([g1, g2]) {
            let stack = r.stack.as_ref().expect("stack");
            assert_eq!(stack.path.rate_bps, want);
            assert_eq!(stack.path.kind.as_deref(), Some("testbed"));
            assert_eq!(stack.path.qdisc.as_deref(), Some("tbf"));
            assert_eq!(r.stats.as_ref().map(|s| s.reps.len()), Some(3));
            assert_eq!(r.iterations_per_rep, Some(50));
            // A warm-up on each of the three flows: a tenth of 50.
            assert_eq!(r.warmup_iterations, Some(15));
            let i = r.options.as_ref().and_then(|o| o.interleaved.clone());
            let i = i.expect("interleaved");
            assert_eq!(i.with, Some(2));
            groups.push(i.group);
        }
        assert_eq!(groups[0], groups[1], "one group");
    }

    #[test]
    fn a_run_without_a_switch_is_refused_before_measuring() {
        let mut p = plan(&["tcp"], &[1024], &["rate=1G,2G"], false);
        p.settings.testbed = Some(crate::cluster::TestbedPath {
            topology: "switch".into(),
            conditions: Some(LinkConditions::plain(1500)),
            ..Default::default()
        });
        let e = crate::run::run_plan(&p, None, &mut [], &mut Quiet).expect_err("refused");
        assert!(e.to_string().contains("nothing to switch"), "{e}");
    }
}
