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
