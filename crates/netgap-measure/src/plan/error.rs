//! Why a request cannot be measured: [`PlanError`], one variant per cause,
//! each naming the flag the user typed, and the helpers that build the
//! common ones.

use crate::cluster::HostsError;
use crate::conditions::ConditionError;
use netgap_core::spec::{Mode, RangeError};
use netgap_transport::options::OptionError;
use std::time::Duration;

/// Why a request cannot be measured: one line naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Links used at once whose limits sum past what the machine under the
    /// testbed carries through its shapers.
    #[error(
        "--links {links}: {shapers} shaped link directions at {rate} carry {need_gbps:.2} Gbit/s \
         of tcp payload at once, more than {share_pct:.0}% of the {forwarding_gbps:.1} Gbit/s \
         this machine forwards through the testbed's shapers, so the emulator, not the links, \
         would bound them; set the links to {carried} or less (netgap testbed set --rate \
         {carried}) or use fewer links"
    )]
    PastForwarding {
        /// Most links of a point.
        links: u32,
        /// Shaped link directions at once (links, twice with `--bidir`).
        shapers: u32,
        /// The links' rate, as the flags take it.
        rate: String,
        /// Their payload limit together, Gbit/s.
        need_gbps: f64,
        /// [`netgap_core::physics::FORWARDING_CARRY_SHARE`] in percent.
        share_pct: f64,
        /// What the machine forwards, Gbit/s.
        forwarding_gbps: f64,
        /// The fastest rate it carries for them, as the flags take it.
        carried: String,
    },
    /// A test name not in the registry.
    #[error("unknown test {name:?}; available: {available}")]
    UnknownTest {
        /// As given.
        name: String,
        /// The registered names.
        available: String,
    },
    /// A transport name not in the registry.
    #[error("unknown transport {name:?}; available: {available}")]
    UnknownTransport {
        /// As given.
        name: String,
        /// The registered names.
        available: String,
    },
    /// A transport this host cannot run.
    #[error("transport {name} is not available here: {why}")]
    Unavailable {
        /// The transport.
        name: String,
        /// Why not.
        why: netgap_transport::Unavailable,
    },
    /// An empty list.
    #[error("no {what} given; {hint}")]
    Empty {
        /// `test`, `transport`, `mode`.
        what: &'static str,
        /// What to give.
        hint: &'static str,
    },
    /// A value out of its range.
    #[error("{flag} {value}: {detail}")]
    Invalid {
        /// The flag, as typed (`--reps`).
        flag: &'static str,
        /// The value given.
        value: String,
        /// The allowed range or what is wrong.
        detail: String,
    },
    /// A message size out of the range every test accepts.
    #[error("{flag}: size {size_bytes} is out of range: sizes go from 1 byte to {max}")]
    SizeOutOfRange {
        /// The flag that gave it (`--sizes`).
        flag: &'static str,
        /// The size, in bytes.
        size_bytes: u64,
        /// The largest size, formatted.
        max: String,
    },
    /// A message size above what a transport carries.
    #[error("{flag}: size {size} is larger than the largest message transport {transport} carries, {max_bytes} bytes")]
    TooLarge {
        /// The flag that gave it (`--sizes`).
        flag: &'static str,
        /// The size, formatted.
        size: String,
        /// The transport.
        transport: String,
        /// Its largest message, in bytes.
        max_bytes: u64,
    },
    /// A flag that would have no effect on what is asked.
    #[error("{flag} does not apply to {what}: {reason}")]
    NoEffect {
        /// The flag, as typed.
        flag: String,
        /// The tests or command asked for.
        what: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A transport option a chosen transport does not honour.
    #[error("{flag} does not apply to transport {transport} ({takes})")]
    OptionNotTaken {
        /// The option's flag.
        flag: String,
        /// The transport.
        transport: String,
        /// What it takes instead.
        takes: String,
    },
    /// A transport option's value out of range.
    #[error(transparent)]
    Option(#[from] OptionError),
    /// A `--conditions` list that cannot be used.
    #[error("--conditions: {0}")]
    Conditions(#[from] ConditionError),
    /// A flag that needs another one.
    #[error("{flag} needs {needs}: {reason}")]
    Needs {
        /// The flag given.
        flag: &'static str,
        /// The flags it needs.
        needs: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A same-host transport toward a remote agent.
    #[error(
        "transport {transport} works only on one host, but --peer {peer} is not a loopback address"
    )]
    SameHostOnly {
        /// The transport.
        transport: String,
        /// The peer as typed.
        peer: String,
    },
    /// A mode the transport lacks.
    #[error("transport {transport} has no {mode} mode")]
    NoMode {
        /// The transport.
        transport: String,
        /// The mode.
        mode: Mode,
    },
    /// `--peer` names no usable agent.
    #[error("bad peer {peer:?}: {detail}")]
    BadPeer {
        /// As typed.
        peer: String,
        /// What is wrong.
        detail: String,
    },
    /// A point the protocol's own checks refuse.
    #[error("invalid option: {0}")]
    Spec(#[from] RangeError),
    /// The hosts file or list is unusable.
    #[error(transparent)]
    Hosts(#[from] HostsError),
    /// Multi-host and point-to-point tests in one run.
    #[error(
        "workloads ({}) cannot be mixed with point-to-point tests in one run",
        netgap_workload::names()
    )]
    MixedTests,
    /// A multi-host workload refuses the transport, mode or options.
    #[error(transparent)]
    Workload(#[from] netgap_workload::Refused),
    /// More in-process flows than this process may hold descriptors for.
    #[error("--clients {clients}: in-process agents hold both ends of every flow in this process, {needed} descriptors, but the limit is {limit}; run `netgap serve` on each host and give --hosts, or raise the hard limit (ulimit -Hn, /etc/security/limits.conf)")]
    Descriptors {
        /// The largest client count asked for.
        clients: u32,
        /// Descriptors needed.
        needed: u64,
        /// The hard limit.
        limit: u64,
    },
}

/// A [`PlanError::NoEffect`].
pub(crate) fn no_effect(flag: &str, what: &str, reason: impl Into<String>) -> PlanError {
    PlanError::NoEffect {
        flag: flag.to_string(),
        what: what.to_string(),
        reason: reason.into(),
    }
}

/// A [`PlanError::Invalid`].
pub(crate) fn invalid(
    flag: &'static str,
    value: impl ToString,
    detail: impl Into<String>,
) -> PlanError {
    PlanError::Invalid {
        flag,
        value: value.to_string(),
        detail: detail.into(),
    }
}

/// A duration as a user would type it (`100ms`).
pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
