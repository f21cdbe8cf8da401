//! Bridge from group roles to the epoll flows engine (hotspot, connect).

use crate::proto::group::{FlowReport, GroupSpec};
use crate::stats::LatencyHistogram;
use std::net::IpAddr;
use std::time::Duration;

/// A prepared engine role.
pub struct Prepared;

/// Opens the engine's server listener.
pub fn listen(_spec: &GroupSpec, _ip: IpAddr) -> Result<(String, Prepared), String> {
    Err("this build has no flows engine".into())
}

/// Opens the engine's client flows.
pub fn connect(_spec: &GroupSpec) -> Result<Prepared, String> {
    Err("this build has no flows engine".into())
}

/// Runs the engine role.
pub fn run(
    _p: Prepared,
    _warmup: Duration,
    _duration: Duration,
) -> Result<(Vec<FlowReport>, LatencyHistogram, u64), String> {
    Err("this build has no flows engine".into())
}
