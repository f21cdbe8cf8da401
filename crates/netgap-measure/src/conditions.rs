//! Link conditions: the seam through which a run changes a testbed's
//! links, and (re-exported from [`netgap_core::link`]) their data.
//!
//! The measurement crate never builds or changes a testbed itself: the
//! testbed owns its links (namespaces, `ip`, `tc`, ethtool ioctls) and
//! hands a run a [`ConditionSwitch`], which puts the links under the
//! conditions the interleaved run asks for, one at a time. Tests drive the
//! same run with a switch that only remembers what it was asked.

pub use netgap_core::link::{
    cross, parse_delay_us, parse_loss_ppm, parse_mtu, parse_offload, parse_rate_bps,
    parse_rate_setting, shaper_bucket_bytes, Condition, ConditionAxis, ConditionError,
    LinkConditions, LossMechanism, LOSS_PPM_ALL, MAX_CONDITIONS, MAX_DELAY_US, MAX_MTU_BYTES,
    MAX_RATE_BPS, MIN_MTU_BYTES, MIN_RATE_BPS, SHAPER_GSO_BUCKET_BYTES, SHAPER_GSO_HOLD_MAX_US,
    SHAPER_HOLD_US,
};

/// Why a switch could not put the links under a condition: its own error,
/// boxed, so the binary keeps its typed testbed errors.
pub type SwitchFailure = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The seam between an interleaved run and the testbed: puts every link of
/// the run's testbed under the given conditions, and returns once traffic
/// sent from then on meets them. The binary implements it over its testbed
/// (`netgap testbed set`); the measurement crate calls it between
/// repetitions and never changes a link itself.
pub trait ConditionSwitch {
    /// Puts the links under `to` (the whole state, not a change), updating
    /// whatever records the testbed's state (its hosts file); returns them
    /// as applied (the shaper's bucket and what drops a loss), for the
    /// records measured under them.
    fn switch(&mut self, to: &LinkConditions) -> Result<LinkConditions, SwitchFailure>;

    /// Puts the links back exactly as they were when the switch was opened
    /// (every link end's MTU, each offload feature as the kernel had it,
    /// the queueing disciplines), whatever was switched since.
    fn restore(&mut self) -> Result<(), SwitchFailure>;
}

/// A run's hold on the links: it switches them through a
/// [`ConditionSwitch`] and puts them back as they were when it is dropped
/// (or [`ConditionGuard::restore`]d), on success, on error and on an early
/// return alike. Point-to-point, multi-host and MPI runs all switch through
/// one.
pub struct ConditionGuard<'s> {
    switch: &'s mut dyn ConditionSwitch,
    /// The conditions in force; `None` while unknown (a switch failed
    /// halfway and may have left some links changed).
    in_force: Option<LinkConditions>,
    /// Whether anything was switched, so there is something to put back.
    touched: bool,
}

impl<'s> ConditionGuard<'s> {
    /// Holds the links of `switch`, which are under `base` now.
    pub fn new(switch: &'s mut dyn ConditionSwitch, base: LinkConditions) -> ConditionGuard<'s> {
        ConditionGuard {
            switch,
            in_force: Some(base),
            touched: false,
        }
    }

    /// Puts the links under `to` unless they are already; whether they
    /// changed.
    pub fn switch_to(&mut self, to: &LinkConditions) -> Result<bool, SwitchFailure> {
        if self.in_force.is_some_and(|f| f.same_setting(to)) {
            return Ok(false);
        }
        self.touched = true;
        self.in_force = None;
        self.in_force = Some(self.switch.switch(to)?);
        Ok(true)
    }

    /// The conditions in force, as the switch applied them; `None` after a
    /// failed switch.
    pub fn in_force(&self) -> Option<LinkConditions> {
        self.in_force
    }

    /// Puts the links back now, with the error if that fails.
    pub fn restore(mut self) -> Result<(), SwitchFailure> {
        self.restore_now()
    }

    fn restore_now(&mut self) -> Result<(), SwitchFailure> {
        if !std::mem::take(&mut self.touched) {
            return Ok(());
        }
        self.in_force = None;
        self.switch.restore()
    }
}

impl Drop for ConditionGuard<'_> {
    fn drop(&mut self) {
        // An early return or a panic: the links go back all the same, and
        // a failure to put them back is said, since no caller hears it.
        if let Err(e) = self.restore_now() {
            eprintln!("netgap: warning: the links could not be put back as they were: {e}");
        }
    }
}
