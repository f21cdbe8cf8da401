//! From what the user asked for to what will be measured. A [`RunRequest`]
//! is the typed input: the command line builds it from flags it has already
//! parsed (sizes, durations, lists, addresses), the default battery builds it
//! directly. Every kind of run (point-to-point, sweep, logp, multi-host,
//! MPI) validates its shared flags once into [`Settings`] (stacks, method,
//! agent, outputs, conditions), each from its own raw request under the
//! names of its own flags, and adds only what is its own: its tests, sizes
//! and counts. [`Plan::from_request`] is the point-to-point run's; every
//! check fails with a [`PlanError`] naming the flag.
//!
//! A field of the request that the user did not give is `None` (or empty),
//! so a plan can tell a default from a choice and refuse a flag that does
//! nothing for what is asked.

use crate::bench;
use netgap_core::spec::PointSpec;
use netgap_transport as transport;
use std::path::PathBuf;
use std::time::Duration;

mod error;
mod peer;
mod request;
mod settings;
mod sizes;
mod stacks;

pub use error::PlanError;
pub(crate) use error::{invalid, no_effect, show};
pub(crate) use peer::resolve_peer;
pub use peer::Peer;
pub use request::{
    parse_counts, BufferFlags, CiSpec, CountsError, Interleaving, MethodSpec, MultiHostSpec,
    OptionSetting, Outputs, PeerAddr, Pin, PinError, RunRequest, Target, TransportChoice,
    MAX_LABEL_BYTES,
};
pub(crate) use request::{Common, Iterations, Repetitions, Sizes};
pub(crate) use settings::refuse_workload_flags;
pub use settings::{ci_target, refuse_interleaving, Settings};
pub use sizes::SkippedSizes;
pub(crate) use stacks::bench_tests;
pub use stacks::Stacks;

/// The agent's control port when `--peer` names none.
pub const DEFAULT_PORT: u16 = 7100;

/// Default repetitions per point (the seeds' method).
pub(crate) const DEFAULT_REPS: u32 = 10;

/// Default time budget of one repetition.
pub const DEFAULT_REP_TIME: Duration = Duration::from_millis(100);

/// Default data-path inactivity timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// Default message sizes of point-to-point runs, in bytes.
pub const DEFAULT_SIZES_BYTES: [u64; 6] = [1, 64, 1024, 16 * 1024, 64 * 1024, 1024 * 1024];

/// Most repetitions per point.
pub(crate) const MAX_REPS: u32 = 10_000;

/// Iterations per repetition of `--paper` (the seeds' setting).
pub(crate) const PAPER_ITERATIONS: u64 = 100_000;

/// The tests of the main job, in order: latency and bandwidth, the two
/// halves of the gap.
pub const BATTERY_TESTS: [&str; 2] = ["pingpong", "stream"];

/// The stacks the main job compares on loopback, the baseline (tcp)
/// first: those of them available on this host.
pub const BATTERY_TRANSPORTS: [&str; 5] = ["tcp", "unix", "shm", "uring", "udp"];

/// The main job's sizes: small, medium and large messages (udp leaves out
/// the largest).
pub const BATTERY_SIZES_BYTES: [u64; 3] = [64, 16 << 10, 1 << 20];

/// The main job's time budget per repetition: long enough that a
/// repetition's figure is steady on a small shared machine, short enough
/// that the job takes about a minute.
const BATTERY_REP_TIME: Duration = Duration::from_millis(100);

/// A validated run: the settings its points share and the points.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Points in measurement order.
    pub points: Vec<PointSpec>,
    /// What every point shares: method, agent, outputs, conditions.
    pub settings: Settings,
    /// The sizes a transport of the run cannot carry, left out of its
    /// points; the other transports measure them.
    pub skipped: Vec<SkippedSizes>,
}

impl Plan {
    /// Validates a run of point-to-point tests.
    pub fn from_request(r: &RunRequest) -> Result<Plan, PlanError> {
        let tests = bench_tests(&r.tests)?;
        Plan::point_to_point(
            r,
            &tests,
            &DEFAULT_SIZES_BYTES,
            DEFAULT_REP_TIME,
            &r.tests.join(","),
        )
    }

    /// Validates a point-to-point run of `tests` from a request of `run`'s
    /// flags, with the command's default sizes and time budget; the flags
    /// of workloads are refused, naming `what` (the tests, or the
    /// command that measures them).
    pub(crate) fn point_to_point(
        r: &RunRequest,
        tests: &[&'static dyn bench::Test],
        default_sizes: &[u64],
        default_rep_time: Duration,
        what: &str,
    ) -> Result<Plan, PlanError> {
        refuse_workload_flags(r, what)?;
        Plan::of_settings(
            &r.common(default_rep_time),
            tests,
            &r.sizes(default_sizes),
            what,
        )
    }

    /// Validates a point-to-point run of `tests` at `sizes` from a
    /// command's shared flags: the settings, the agent of `--hosts`, the
    /// points.
    pub(crate) fn of_settings(
        c: &Common<'_>,
        tests: &[&'static dyn bench::Test],
        sizes: &Sizes,
        what: &str,
    ) -> Result<Plan, PlanError> {
        let mut settings = Settings::new(c, what)?;
        settings.refuse_preload_relayed(what)?;
        let (points, skipped) = settings.points(tests, sizes)?;
        settings.place_point_to_point()?;
        Ok(Plan {
            points,
            settings,
            skipped,
        })
    }

    /// The main job, plain `netgap`: pingpong and stream over the stacks
    /// of [`BATTERY_TRANSPORTS`] available here, on loopback, their
    /// repetitions interleaved at each test and size, the client and
    /// server on two different CPUs when the process may use two.
    /// `reps` overrides the repetitions (a shorter job).
    pub fn battery(json: PathBuf, reps: Option<u32>) -> Result<Battery, PlanError> {
        let mut transports = Vec::new();
        let mut unavailable = Vec::new();
        for name in BATTERY_TRANSPORTS {
            match transport::find(name).map(|t| t.availability()) {
                Some(Ok(())) => transports.push(name.to_string()),
                Some(Err(why)) => unavailable.push((name.to_string(), why.0)),
                None => unavailable.push((name.to_string(), "not built in".to_string())),
            }
        }
        let cpus = netgap_transport::affinity::allowed_cpus();
        let pin = match cpus.as_slice() {
            [client, server, ..] => Some(Pin {
                client_cpu: *client,
                server_cpu: *server,
            }),
            _ => None,
        };
        let request = RunRequest {
            interleaving: Interleaving {
                conditions: Vec::new(),
                interleave: transports.len() > 1,
            },
            transport: TransportChoice {
                transports,
                ..TransportChoice::default()
            },
            method: MethodSpec {
                sizes: Some(BATTERY_SIZES_BYTES.to_vec()),
                rep_time: Some(BATTERY_REP_TIME),
                reps,
                pin,
                ..MethodSpec::default()
            },
            outputs: Outputs {
                json: Some(json),
                ..Outputs::default()
            },
            ..RunRequest::new(&BATTERY_TESTS)
        };
        Ok(Battery {
            plan: Plan::from_request(&request)?,
            unavailable,
        })
    }
}

/// The main job's plan, and the stacks it leaves out.
#[derive(Debug, Clone)]
pub struct Battery {
    /// The points.
    pub plan: Plan,
    /// The stacks of [`BATTERY_TRANSPORTS`] not available here, with why.
    pub unavailable: Vec<(String, String)>,
}

#[cfg(test)]
mod tests;
