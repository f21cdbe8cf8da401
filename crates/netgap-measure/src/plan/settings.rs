//! What every kind of run shares, validated once: [`Settings`] from a
//! command's [`Common`] flags (method, timeout, placement, label, results
//! files, conditions and interleaving), and what a record says of them.

use super::{
    invalid, no_effect, show, stacks::buffer_layout_of, CiSpec, Common, Iterations, Peer,
    PlanError, RunRequest, Stacks, TransportChoice, DEFAULT_REPS, DEFAULT_REP_TIME,
    DEFAULT_TIMEOUT, MAX_LABEL_BYTES, MAX_REPS, PAPER_ITERATIONS,
};
use crate::cluster::{HostsArg, HostsSource, TestbedPath};
use crate::conditions::{cross, Condition};
use crate::control::ControlAddr;
use crate::runner::{CiTarget, IterationPolicy, Method, DEFAULT_CI_REPS};
use netgap_core::spec::{Mode, PointSpec, MAX_ITERATIONS};
use std::path::PathBuf;
use std::time::Duration;

/// Shortest `--rep-time`.
const MIN_REP_TIME: Duration = Duration::from_micros(100);

/// Longest `--rep-time`.
const MAX_REP_TIME: Duration = Duration::from_secs(3600);

/// Shortest `--timeout`.
const MIN_TIMEOUT: Duration = Duration::from_millis(10);

/// What the points of every kind of run share (point-to-point, sweep,
/// logp, multi-host, MPI), validated once from a command's raw request:
/// each command adds only what is its own (its tests, sizes, counts).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Transports, modes and options.
    pub stacks: Stacks,
    /// Repetitions, iterations, warm-up.
    pub method: Method,
    /// The data path's inactivity timeout of every point, in ms.
    pub io_timeout_ms: u32,
    /// CPU of the client role, if pinned.
    pub client_cpu: Option<u32>,
    /// CPU of the server role, if pinned.
    pub server_cpu: Option<u32>,
    /// `--verify`: check every payload byte.
    pub verify: bool,
    /// The agent.
    pub peer: Peer,
    /// `--hosts`, loaded once.
    pub hosts: Option<HostsSource>,
    /// JSON Lines output.
    pub json: Option<PathBuf>,
    /// CSV output.
    pub csv: Option<PathBuf>,
    /// Shared key file the agent requires.
    pub key_file: Option<PathBuf>,
    /// `--label`, for every record's `stack.label`.
    pub label: Option<String>,
    /// The testbed the hosts file describes (topology and link
    /// conditions), for every record's `stack.path`; `None` off a testbed.
    pub testbed: Option<TestbedPath>,
    /// The conditions to alternate between (the cross product of
    /// `--conditions`); empty for a run under the conditions in force.
    pub conditions: Vec<Condition>,
    /// The testbed to switch conditions on (its `--name`), when
    /// `conditions` is not empty.
    pub testbed_name: Option<String>,
    /// `--interleave`: alternate the stacks' repetitions at each test and
    /// size.
    pub interleave: bool,
}

impl Settings {
    /// Validates what every kind of run shares, once. `what` names the
    /// tests or command in messages.
    pub(crate) fn new(c: &Common<'_>, what: &str) -> Result<Settings, PlanError> {
        let t = c.target;
        if c.key_file.is_some() && t.peer.is_none() && t.hosts.is_none() {
            return Err(PlanError::Needs {
                flag: "--key",
                needs: "--peer or --hosts",
                reason: "in-process agents run without a key",
            });
        }
        let mut stacks = Stacks::validate(c.transport)?;
        let (align, offset) = buffer_layout_of(c.buffer)?;
        stacks.options.buffer_align_bytes = align;
        stacks.options.buffer_offset_bytes = offset;
        let method = method_of(c)?;
        let timeout = c.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout < MIN_TIMEOUT
            || timeout.as_millis() > u128::from(netgap_core::spec::MAX_IO_TIMEOUT_MS)
        {
            return Err(invalid(
                "--timeout",
                show(timeout),
                "must be between 10ms and 10m",
            ));
        }
        let (client_cpu, server_cpu) = match c.pin {
            None => (None, None),
            Some(p) => {
                for cpu in [p.client_cpu, p.server_cpu] {
                    if cpu > netgap_core::spec::MAX_CPU_INDEX {
                        return Err(invalid(
                            "--pin",
                            format!("{},{}", p.client_cpu, p.server_cpu),
                            format!("{cpu} is not a CPU number"),
                        ));
                    }
                }
                (Some(p.client_cpu), Some(p.server_cpu))
            }
        };
        let label = check_label(c.outputs.label.as_deref())?;
        let peer = match &t.peer {
            None => Peer::Embedded { ipv6: t.ipv6 },
            Some(p) => Peer::Remote {
                label: p.label.clone(),
                addr: p.addr.clone(),
            },
        };
        if let Peer::Remote {
            addr: ControlAddr::Tcp(addr),
            label,
        } = &peer
        {
            if !addr.ip().is_loopback() {
                if let Some(t) = stacks
                    .transports
                    .iter()
                    .find(|t| !t.capabilities().cross_host)
                {
                    return Err(PlanError::SameHostOnly {
                        transport: t.name().to_string(),
                        peer: label.clone(),
                    });
                }
            }
        }
        let mut hosts = t.hosts.as_ref().map(HostsArg::load).transpose()?;
        if let Some(w) = t.wait {
            match &mut hosts {
                Some(HostsSource::Nodes { wait, .. }) => *wait = Some(w),
                _ => {
                    return Err(invalid(
                        "--wait",
                        humantime::format_duration(w),
                        "only the agents of --hosts @slurm or @hostfile are waited for",
                    ))
                }
            }
        }
        let testbed = match &hosts {
            Some(HostsSource::File(f)) => f.path_facts(),
            _ => None,
        };
        let mut settings = Settings {
            stacks,
            method,
            io_timeout_ms: timeout.as_millis() as u32,
            client_cpu,
            server_cpu,
            verify: c.verify,
            peer,
            hosts,
            json: c.outputs.json.clone(),
            csv: c.outputs.csv.clone(),
            key_file: c.key_file.cloned(),
            label,
            testbed,
            conditions: Vec::new(),
            testbed_name: None,
            interleave: false,
        };
        settings.check_interleaving(c, what)?;
        Ok(settings)
    }

    /// The settings of a point-to-point run's request whose points have a
    /// stack of their own (MPI's): `transport` stands for the request's
    /// transports, modes and options. The flags of workloads are
    /// refused, naming `what`.
    pub fn with_stack(
        r: &RunRequest,
        transport: &TransportChoice,
        what: &str,
    ) -> Result<Settings, PlanError> {
        refuse_workload_flags(r, what)?;
        let c = Common {
            transport,
            ..r.common(DEFAULT_REP_TIME)
        };
        let mut settings = Settings::new(&c, what)?;
        settings.refuse_preload_relayed(what)?;
        settings.place_point_to_point()?;
        Ok(settings)
    }

    /// Refuses `--preload-relayed` for the tests of a point-to-point run
    /// (`what`), whose flows are netgap's own and no program's: it would
    /// change nothing.
    pub(crate) fn refuse_preload_relayed(&self, what: &str) -> Result<(), PlanError> {
        if !self.stacks.options.preload_relayed {
            return Ok(());
        }
        Err(no_effect(
            "--preload-relayed",
            what,
            format!(
                "it keeps the connections of the programs a workload runs under the preload library on the relays ({}), and {what} runs netgap's own flows",
                netgap_workload::preload_relayed_takers()
            ),
        ))
    }

    /// One point of `test` with these settings.
    pub fn point(&self, test: &str, transport: &str, mode: Mode, size: u64) -> PointSpec {
        PointSpec {
            test: test.to_string(),
            transport: transport.to_string(),
            mode,
            size_bytes: size,
            options: self.stacks.options.clone(),
            server_cpu: self.server_cpu,
            io_timeout_ms: self.io_timeout_ms,
            verify: self.verify,
        }
    }

    /// Validates `--conditions` and `--interleave`: the conditions need a
    /// testbed whose hosts file records its links' state, and neither goes
    /// with `--ci` (interleaving alternates a fixed count of repetitions).
    fn check_interleaving(&mut self, c: &Common<'_>, what: &str) -> Result<(), PlanError> {
        let i = c.interleaving;
        let conditions = cross(&i.conditions)?;
        if conditions.is_empty() && !i.interleave {
            return Ok(());
        }
        let flag = if conditions.is_empty() {
            "--interleave"
        } else {
            "--conditions"
        };
        if c.ci.is_some() {
            return Err(no_effect(
                "--ci",
                &format!("{what} with {flag}"),
                format!(
                    "interleaved repetitions alternate a fixed count; give {}",
                    c.repetitions.reps.1
                ),
            ));
        }
        if !conditions.is_empty() {
            const WHY: &str = "conditions are set on netgap's testbed: give --hosts @testbed (or a testbed's hosts file) after `netgap testbed up`";
            let (Some(HostsArg::File { path, .. }), Some(HostsSource::File(file))) =
                (&c.target.hosts, &self.hosts)
            else {
                return Err(invalid("--conditions", what, WHY));
            };
            let (Some(name), Some(tb)) = (file.testbed.clone(), self.testbed.as_ref()) else {
                return Err(invalid(
                    "--conditions",
                    path.display(),
                    "this hosts file names no testbed made by this netgap; rebuild it with `netgap testbed up`",
                ));
            };
            if tb.conditions.is_none() {
                return Err(invalid(
                    "--conditions",
                    path.display(),
                    "the testbed's hosts file records no link conditions; rebuild it with `netgap testbed up`",
                ));
            }
            self.testbed_name = Some(name);
        }
        if i.interleave {
            let stacks: std::collections::HashSet<(&str, Mode)> = self
                .stacks
                .transports
                .iter()
                .flat_map(|t| self.stacks.modes.iter().map(|&m| (t.name(), m)))
                .collect();
            if stacks.len() < 2 {
                return Err(no_effect(
                    "--interleave",
                    what,
                    "it alternates the repetitions of several stacks; give several with -t or --mode (--conditions alone alternates its conditions)",
                ));
            }
        }
        self.conditions = conditions;
        self.interleave = i.interleave;
        Ok(())
    }

    /// Options as recorded in results.
    pub fn record_options(&self, spec: &PointSpec) -> netgap_core::record::RecordOptions {
        let (iterations, rep_time_ms) = match self.method.iterations {
            IterationPolicy::Fixed(n) => (Some(n), None),
            IterationPolicy::Budget(d) => (None, Some(d.as_millis() as u64)),
        };
        netgap_core::record::RecordOptions {
            peer: match &self.peer {
                Peer::Embedded { ipv6: false } => "embedded".into(),
                Peer::Embedded { ipv6: true } => "embedded-ipv6".into(),
                Peer::Remote { addr, .. } => addr.to_string(),
                Peer::Agents { hosts } => format!("agents: {}", hosts.label()),
            },
            transport: spec.options.clone(),
            verify: spec.verify,
            placement: netgap_core::record::Placement {
                client_cpu: self.client_cpu,
                server_cpu: spec.server_cpu,
            },
            reps: self.method.reps,
            iterations,
            rep_time_ms,
            warmup: self.method.warmup,
            io_timeout_ms: spec.io_timeout_ms,
            interleaved: None,
            bidir: false,
        }
    }
}

/// The method of the shared flags: repetitions and iterations checked
/// under the names of the flags that gave them, the warm-up and `--ci`.
fn method_of(c: &Common<'_>) -> Result<Method, PlanError> {
    let r = c.repetitions;
    let (reps, iterations) = match r.iterations {
        Iterations::Paper => (DEFAULT_REPS, IterationPolicy::Fixed(PAPER_ITERATIONS)),
        Iterations::Fixed(n) => {
            if n == 0 || n > MAX_ITERATIONS {
                return Err(invalid(
                    "--iterations",
                    n,
                    format!("must be between 1 and {MAX_ITERATIONS}"),
                ));
            }
            (r.reps.0, IterationPolicy::Fixed(n))
        }
        Iterations::Budget(d, flag) => {
            if !(MIN_REP_TIME..=MAX_REP_TIME).contains(&d) {
                return Err(invalid(flag, show(d), "must be between 100us and 1h"));
            }
            (r.reps.0, IterationPolicy::Budget(d))
        }
    };
    if reps == 0 || reps > MAX_REPS {
        return Err(invalid(
            r.reps.1,
            reps,
            format!("must be between 1 and {MAX_REPS}"),
        ));
    }
    if let Some(w) = c.warmup {
        if w > MAX_ITERATIONS {
            return Err(invalid("--warmup", w, format!("at most {MAX_ITERATIONS}")));
        }
    }
    Ok(Method {
        reps,
        iterations,
        warmup: c.warmup,
        ci: ci_target(c.ci, c.ci_reps)?,
    })
}

/// The `--ci` target of a method; `None` without `--ci`.
pub fn ci_target(
    ci: Option<CiSpec>,
    ci_reps: Option<(u32, u32)>,
) -> Result<Option<CiTarget>, PlanError> {
    let Some(ci) = ci else { return Ok(None) };
    let (min, max) = ci_reps.unwrap_or(DEFAULT_CI_REPS);
    for n in [min, max] {
        if n > MAX_REPS {
            return Err(invalid(
                "--ci-reps",
                format!("{min},{max}"),
                format!("{n} is above {MAX_REPS} repetitions"),
            ));
        }
    }
    CiTarget::new(ci.confidence_pct, ci.half_width_pct, min, max)
        .map(Some)
        .map_err(|e| {
            invalid(
                "--ci",
                format!(
                    "{},{} --ci-reps {min},{max}",
                    ci.confidence_pct, ci.half_width_pct
                ),
                e.to_string(),
            )
        })
}

/// A `--label`: 1 to [`MAX_LABEL_BYTES`] bytes of printable text.
fn check_label(label: Option<&str>) -> Result<Option<String>, PlanError> {
    let Some(l) = label else { return Ok(None) };
    if l.trim().is_empty() || l.len() > MAX_LABEL_BYTES || l.chars().any(char::is_control) {
        return Err(invalid(
            "--label",
            format!("{l:?}"),
            format!("want 1 to {MAX_LABEL_BYTES} bytes of printable text"),
        ));
    }
    Ok(Some(l.trim().to_string()))
}

/// Refuses `--interleave` for `what` (workloads), which do not
/// alternate repetitions; their `--conditions` run every point under one
/// condition after another ([`crate::workload_run::run_workload_plan_under`]).
pub fn refuse_interleaving(r: &RunRequest, what: &str) -> Result<(), PlanError> {
    let i = &r.interleaving;
    let reason = "only point-to-point tests alternate repetitions across stacks";
    if i.interleave {
        return Err(no_effect("--interleave", what, reason));
    }
    Ok(())
}

/// Refuses the flags of workloads in a point-to-point request: they
/// would change nothing. `what` names the tests or command in the message.
pub(crate) fn refuse_workload_flags(r: &RunRequest, what: &str) -> Result<(), PlanError> {
    let m = &r.multi_host;
    let reason = format!("it is a flag of workloads ({})", netgap_workload::names());
    for (flag, given) in [
        ("--clients", m.clients.is_some()),
        ("--streams", m.streams.is_some()),
        ("--duration", m.duration.is_some()),
        ("--links", m.links.is_some()),
        ("--client-hosts", m.client_hosts.is_some()),
    ] {
        if given {
            return Err(no_effect(flag, what, reason));
        }
    }
    if let Some((flag, _)) = m.workload_options.first() {
        let takers = netgap_workload::options::workloads_taking(flag).join(", ");
        return Err(no_effect(
            &format!("--{flag}"),
            what,
            format!("it is an option of {takers}"),
        ));
    }
    if r.target.ipv6 && r.target.peer.is_some() {
        return Err(no_effect(
            "-6",
            what,
            "it picks IPv6 loopback for the in-process agent, and --peer names an agent; give --peer an IPv6 address instead",
        ));
    }
    Ok(())
}
