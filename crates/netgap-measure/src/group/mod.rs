//! Multi-host (group) runs: the workloads of [`crate::workload`] driven on
//! every host at once by one coordinator.
//!
//! A [`plan::GroupPlan`] lists the points; the [`coordinator`] connects to
//! every host's agent, asks the point's workload where its roles go,
//! prepares them all (servers first, so their addresses are known to the
//! roles that connect to them), starts every flow at once (a barrier) and
//! gathers the per-flow reports, which [`summary`] reduces with the
//! workload's own rules into one record per point.
//!
//! Nothing here names a workload: adding one is a module and a line in
//! [`crate::workload::registry`].

pub mod coordinator;
pub mod plan;
pub mod summary;

pub use crate::workload::{find, names, registry, GroupMetric};

use crate::point_loop::{run_points, Observer};
use crate::sink::RecordSink;
use coordinator::GroupError;
use plan::GroupPlan;
use std::time::SystemTime;

/// Runs a whole group plan under each of its `--conditions` in turn
/// (every point under the first, then under the next), putting the
/// testbed's links under each through `switch` and opening fresh sessions
/// so every host's facts are read under it; the records' paths say the
/// condition. The testbed goes back to the conditions it had, whatever
/// happens. Without conditions it is [`run_group_plan`].
pub fn run_group_plan_under(
    plan: &GroupPlan,
    switch: Option<&mut dyn crate::conditions::ConditionSwitch>,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<usize, GroupError> {
    if plan.conditions.is_empty() {
        return run_group_plan(plan, sinks, observer);
    }
    let Some(switch) = switch else {
        return Err(GroupError::Point(
            "--conditions: no testbed to switch conditions on".into(),
        ));
    };
    let plan::HostsSource::File(file) = &plan.hosts else {
        return Err(GroupError::Point(
            "--conditions: the hosts are not a testbed".into(),
        ));
    };
    let Some(base) = file.conditions else {
        return Err(GroupError::Point(
            "--conditions: the testbed's hosts file records no link conditions".into(),
        ));
    };
    let mut done = 0;
    let mut outcome = Ok(());
    for c in &plan.conditions {
        let to = c.apply_to(&base);
        if let Err(e) = switch.switch(&to) {
            outcome = Err(GroupError::Point(format!("--conditions: {to}: {e}")));
            break;
        }
        let mut under = plan.clone();
        let mut f = file.clone();
        f.conditions = Some(to);
        under.hosts = plan::HostsSource::File(f);
        match run_group_plan(&under, sinks, observer) {
            Ok(n) => done += n,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    let restored = switch
        .switch(&base)
        .map_err(|e| GroupError::Point(format!("restoring the testbed to {base}: {e}")));
    outcome?;
    restored?;
    Ok(done)
}

/// Runs a whole group plan, writing each record to every sink as soon as it
/// is measured. On failure, every point measured before is already in the
/// sinks.
pub fn run_group_plan(
    plan: &GroupPlan,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<usize, GroupError> {
    let mut coord = coordinator::open(plan)?;
    let done = run_points(
        &plan.points,
        |point| &point.spec,
        sinks,
        observer,
        |point, observer| {
            let started = SystemTime::now();
            summary::measure_point(&mut coord, point, plan, started, observer)
                .map(|record| vec![record])
        },
    )?;
    coord.bye();
    Ok(done)
}
