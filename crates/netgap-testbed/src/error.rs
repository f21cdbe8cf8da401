//! The testbed's typed errors.

use crate::holder::{holder_text, Holder};
use crate::ProbeFailure;
use netgap_core::hosts::HostsFileError;
use std::io;

/// Why a testbed command failed. Each is one line.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// Not root.
    #[error("the testbed needs root (it creates network namespaces); run it as root")]
    NotRoot,
    /// No network namespaces here.
    #[error("this system has no network namespace support (/proc/self/ns/net is missing)")]
    NoNetns,
    /// Bad flags.
    #[error("{0}")]
    Args(String),
    /// A command failed.
    #[error("`{cmd}` failed: {detail}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its stderr, or why it did not run.
        detail: String,
    },
    /// A file of the state directory.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Underlying error.
        source: io::Error,
    },
    /// A thread could not enter a testbed namespace.
    #[error(transparent)]
    Netns(#[from] netgap_transport::netns::NetnsError),
    /// The kernel has no netem qdisc, and a delay was asked for.
    #[error("a delay needs the kernel's netem qdisc (sch_netem), which this kernel does not have; nothing was changed")]
    NoNetem,
    /// The kernel has neither netem nor nftables' bridge family, and a
    /// loss was asked for.
    #[error("a loss needs the kernel's netem qdisc or nftables (bridge family); this system has neither ({0}); nothing was changed")]
    NoLoss(String),
    /// Another process holds the testbed ([`TestbedLock`](crate::TestbedLock)).
    #[error("testbed {name} is in use by {}; nothing was changed: wait for it to end, or stop it", holder_text(.holder))]
    Busy {
        /// The testbed.
        name: String,
        /// Who holds it, when its record could be read.
        holder: Option<Holder>,
    },
    /// A directory or file of the testbeds' state could not be used safely.
    #[error(transparent)]
    Confined(#[from] netgap_workload::confined::ConfinedError),
    /// No testbed of that name is up.
    #[error("no testbed {0} is up (start one with `netgap testbed up --name {0}`)")]
    NotUp(String),
    /// An agent did not come up.
    #[error("the agent of {host} did not start: {source} (see {log})")]
    Agent {
        /// The host.
        host: String,
        /// What went wrong.
        source: Box<AgentProbeError>,
        /// Its log file.
        log: String,
    },
    /// The handler that puts a testbed back on an interrupt could not be
    /// installed.
    #[error(transparent)]
    Interrupt(#[from] InterruptError),
}

/// Why the handler that puts a testbed back on Ctrl-C, SIGTERM or SIGHUP
/// (its links' conditions, or a study's own testbed taken down) could not
/// be installed. Kept once per process and handed to every later caller,
/// so it is `Clone`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InterruptError {
    /// The pipe the signal handler wakes the interrupt thread through.
    #[error("making the interrupt pipe: {source}")]
    Pipe {
        /// Why it could not be made.
        source: nix::errno::Errno,
    },
    /// The thread that puts the testbed back.
    #[error("starting the interrupt thread: {source}")]
    Thread {
        /// Why it could not be started.
        source: std::sync::Arc<io::Error>,
    },
    /// A signal's handler.
    #[error("handling {signal}: {source}")]
    Signal {
        /// The signal.
        signal: nix::sys::signal::Signal,
        /// Why its handler could not be set.
        source: nix::errno::Errno,
    },
}

/// Why a testbed agent does not answer.
#[derive(Debug, thiserror::Error)]
pub enum AgentProbeError {
    /// The hosts file's control address does not parse.
    #[error("bad control address {0:?}")]
    BadAddress(String),
    /// The probe failed: the key file is unusable, or connecting or the
    /// handshake failed.
    #[error(transparent)]
    Failed(ProbeFailure),
    /// The agent's process is gone.
    #[error("it exited")]
    Exited,
}

/// Why a testbed that is up cannot be kept as it is.
#[derive(Debug, thiserror::Error)]
pub enum Unhealthy {
    /// Its hosts file is missing or bad.
    #[error(transparent)]
    Hosts(#[from] HostsFileError),
    /// Its namespaces could not be listed.
    #[error(transparent)]
    Listing(#[from] TestbedError),
    /// One of its namespaces is gone.
    #[error("namespace {0} is missing")]
    MissingNamespace(String),
    /// One of its agents does not answer.
    #[error("the agent of {host} does not answer: {source}")]
    Agent {
        /// The host.
        host: String,
        /// Why.
        source: AgentProbeError,
    },
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TestbedError {
    let what = what.into();
    move |source| TestbedError::Io { what, source }
}
