//! The one entry of a point-to-point plan: its points in order, or, when
//! the plan interleaves stacks or alternates link conditions, in rounds
//! ([`crate::interleave`]). It sits above both so that neither imports the
//! other's caller.

use crate::conditions::ConditionSwitch;
use crate::coordinator::{run_in_order, CoordError, RunSummary};
use crate::plan::Plan;
use crate::point_loop::Observer;
use crate::sink::RecordSink;

/// Runs a whole plan against its agent, writing each record to every sink as
/// soon as it is measured. On failure, every point measured before is
/// already in the sinks. A plan with conditions needs `switch`, through
/// which the run puts the testbed's links under each in turn (see
/// [`crate::interleave`]); a plan that interleaves runs its groups' rounds.
pub fn run_plan(
    plan: &Plan,
    switch: Option<&mut dyn ConditionSwitch>,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<RunSummary, CoordError> {
    if plan.settings.interleave || !plan.settings.conditions.is_empty() {
        return crate::interleave::run(plan, switch, sinks, observer);
    }
    run_in_order(plan, sinks, observer)
}
