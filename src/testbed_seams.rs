//! Where the testbed meets the measurement crate, neither of which sees
//! the other: the binary asks the testbed's agents whether they answer
//! with the coordinator's handshake ([`CoordinatorProbe`]), and hands a
//! run the testbed's switch of conditions as measure's
//! [`ConditionSwitch`] ([`Switch`]).

use netgap_core::hosts::ControlAddr;
use netgap_core::link::LinkConditions;
use netgap_measure::conditions::{ConditionSwitch, SwitchFailure};
use netgap_testbed::{AgentProbe, ProbeFailure, TestbedSwitch};
use std::path::Path;

/// Probes an agent as every coordinator reaches one: connect, prove the
/// key, `Hello`/`Welcome`, and say goodbye.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoordinatorProbe;

impl AgentProbe for CoordinatorProbe {
    fn probe(&self, control: &ControlAddr, key_file: Option<&Path>) -> Result<(), ProbeFailure> {
        let key = key_file.map(netgap_measure::auth::load_key).transpose()?;
        let coord = netgap_measure::coordinator::Coordinator::connect(control, key.as_ref())?;
        coord.bye();
        Ok(())
    }
}

/// A testbed's [`TestbedSwitch`] as the seam an interleaved run switches
/// the links through.
pub struct Switch(pub TestbedSwitch);

impl ConditionSwitch for Switch {
    fn switch(&mut self, to: &LinkConditions) -> Result<LinkConditions, SwitchFailure> {
        self.0.switch(to).map_err(|e| Box::new(e) as SwitchFailure)
    }

    fn restore(&mut self) -> Result<(), SwitchFailure> {
        self.0.restore().map_err(|e| Box::new(e) as SwitchFailure)
    }
}
