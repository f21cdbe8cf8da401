//! Workload runs: the workloads of [`netgap_workload`] driven on
//! every host at once by one coordinator.
//!
//! A [`plan::WorkloadPlan`] lists the points; the [`coordinator`] connects to
//! every host's agent, asks the point's workload where its roles go,
//! prepares them all (servers first, so their addresses are known to the
//! roles that connect to them), starts every flow at once (a barrier) and
//! gathers the per-flow reports, which [`summary`] reduces with the
//! workload's own rules into one record per point.
//!
//! Nothing here names a workload: adding one is a module and a line in
//! [`netgap_workload::registry`].

pub mod coordinator;
pub mod plan;
mod point_to_point;
pub mod summary;

pub use netgap_workload::{find, names, registry};

use crate::point_loop::{run_points, Observer};
use crate::sink::RecordSink;
use coordinator::WorkloadError;
use plan::WorkloadPlan;
use std::time::SystemTime;

/// Runs a whole workload plan, writing each record to every sink as soon as it
/// is measured. On failure, every point measured before is already in the
/// sinks.
pub fn run_workload_plan(
    plan: &WorkloadPlan,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<usize, WorkloadError> {
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

/// Runs a whole workload plan once under each of its conditions
/// (`plan.settings.conditions`, from `--conditions`), one condition after
/// another: `switch` puts the testbed's links under the condition, the
/// sessions are opened anew (so every host's facts are read under it) and
/// every point is measured; each record's `stack.path` says the condition
/// it ran under. Afterwards the links go back exactly as they were, also
/// after a failure.
pub fn run_workload_plan_under(
    plan: &WorkloadPlan,
    switch: &mut dyn crate::conditions::ConditionSwitch,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<usize, WorkloadError> {
    let crate::cluster::HostsSource::File(file) = &plan.hosts else {
        return Err(WorkloadError::Point(
            "--conditions needs a testbed's hosts file".into(),
        ));
    };
    let Some(base) = file.conditions else {
        return Err(WorkloadError::Point(
            "the testbed's hosts file records no link conditions; rebuild it with `netgap testbed up`".into(),
        ));
    };
    let mut guard = crate::conditions::ConditionGuard::new(switch, base);
    let mut done = 0;
    let mut result = Ok(());
    for c in &plan.settings.conditions {
        let to = c.apply_to(&base);
        if let Err(e) = guard.switch_to(&to) {
            result = Err(WorkloadError::Point(format!("switching to {to}: {e}")));
            break;
        }
        let mut under = plan.clone();
        let mut f = file.clone();
        // The records say how the switch applied it.
        f.conditions = Some(guard.in_force().unwrap_or(to));
        under.hosts = crate::cluster::HostsSource::File(f);
        match run_workload_plan(&under, sinks, observer) {
            Ok(n) => done += n,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let restored = guard
        .restore()
        .map_err(|e| WorkloadError::Point(format!("putting the links back: {e}")));
    result.and(restored).map(|()| done)
}
