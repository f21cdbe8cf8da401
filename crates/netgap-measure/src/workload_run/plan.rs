//! From the flags of `netgap run` to the points of a workload run. The
//! transport, mode, size and socket-option flags are validated into the
//! same [`Settings`] as a point-to-point run's (the same rules apply); this
//! adds the hosts, each workload's sizes (its default without `--sizes`),
//! client counts, streams, links and the window of each repetition.

pub use crate::cluster::HostsSource;
use crate::plan::{invalid, no_effect, show, PlanError, RunRequest, Settings, DEFAULT_REP_TIME};
use netgap_core::spec::PointSpec;
use netgap_proto::workload::{MAX_WORKLOAD_DURATION_MS, MAX_WORKLOAD_FLOWS};
use netgap_workload::options::{self as wopt, WorkloadArgs};
use netgap_workload::{CountFlag, Workload};
use std::time::Duration;

/// Default `--duration`.
pub(crate) const DEFAULT_DURATION: Duration = Duration::from_secs(1);
/// Default `--streams` of multistream.
pub(crate) const DEFAULT_STREAMS: u32 = 4;
/// Default `--client-hosts`.
pub(crate) const DEFAULT_CLIENT_HOSTS: u32 = 3;
/// Default `--links`.
pub(crate) const DEFAULT_LINKS: u32 = 3;
/// Shortest measured window.
const MIN_DURATION: Duration = Duration::from_millis(10);
/// Longest uncounted warm-up before each window.
const MAX_WARMUP: Duration = Duration::from_secs(1);
/// Most loopback links of an in-process multirail run.
pub(crate) const MAX_LOOPBACK_LINKS: u32 = 64;
/// Most links of a `--links` count with `--hosts` (a mesh testbed has at
/// most 8 per host pair; a hosts file may list more).
const MAX_LINK_COUNT: u32 = 1024;
/// Most in-process client hosts.
pub(crate) const MAX_EMBEDDED_HOSTS: u32 = 64;

/// One point of a workload run.
#[derive(Clone)]
pub struct WorkloadPoint {
    /// The workload.
    pub workload: &'static dyn Workload,
    /// Transport, mode, size, options, timeout (its `test` is the
    /// workload's name).
    pub spec: PointSpec,
    /// The count the workload reads ([`Workload::count`]): clients,
    /// streams, or links (`--links`); 0 when the hosts decide.
    pub clients: u32,
    /// The values of the workload's own options for this point.
    pub args: WorkloadArgs,
    /// `--bidir`: every flow carries payload both ways at once.
    pub bidir: bool,
    /// The workload's parameters for every role of the point.
    pub params: serde_json::Value,
}

impl std::fmt::Debug for WorkloadPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadPoint")
            .field("workload", &self.workload.name())
            .field("spec", &self.spec)
            .field("clients", &self.clients)
            .field("args", &self.args)
            .field("bidir", &self.bidir)
            .field("params", &self.params)
            .finish()
    }
}

/// A validated workload run.
#[derive(Debug, Clone)]
pub struct WorkloadPlan {
    /// Points in measurement order.
    pub points: Vec<WorkloadPoint>,
    /// The hosts.
    pub hosts: HostsSource,
    /// Measured window of each repetition.
    pub duration: Duration,
    /// Uncounted warm-up before each window.
    pub warmup: Duration,
    /// What the points share: repetitions, outputs, key, label, testbed,
    /// conditions.
    pub settings: Settings,
}

/// Whether every test named is a workload; `Err` if workloads and
/// point-to-point tests are mixed.
pub fn is_workload_run(tests: &[String]) -> Result<bool, PlanError> {
    let workloads = tests.iter().filter(|n| super::find(n).is_some()).count();
    if workloads == 0 {
        return Ok(false);
    }
    if workloads != tests.len() {
        return Err(PlanError::MixedTests);
    }
    Ok(true)
}

/// Refuses points whose links (`--links`) take more at once than the
/// machine under the testbed carries through its shapers, before anything
/// runs. Other points are
/// judged on their record ([`netgap_core::physics::Physics::past_forwarding_gbps`]).
fn check_forwarding(
    points: &[WorkloadPoint],
    hosts: &HostsSource,
    settings: &Settings,
) -> Result<(), PlanError> {
    let Some(tb) = &settings.testbed else {
        return Ok(());
    };
    let (Some(forwarding_mbps), Some(c)) = (tb.forwarding_mbps, tb.conditions) else {
        return Ok(());
    };
    let Some(rate_bps) = c.rate_bps else {
        return Ok(());
    };
    if !matches!(hosts, HostsSource::File(_)) {
        return Ok(());
    }
    // Only a count `--links` named is a count of links: without it a
    // workload counted in hosts (a pipeline's stages) uses what its
    // placement gives it.
    let links_at_once = points
        .iter()
        .filter(|p| p.workload.count() == CountFlag::Hosts && p.clients > 0)
        .map(|p| (p.clients, p.clients * if p.bidir { 2 } else { 1 }))
        .max_by_key(|&(_, shapers)| shapers);
    let Some((links, shapers)) = links_at_once else {
        return Ok(());
    };
    let carried = netgap_core::physics::carried_rate_bps(forwarding_mbps, shapers, c.mtu_bytes);
    if rate_bps <= carried {
        return Ok(());
    }
    let share = netgap_core::physics::tcp_payload_share(c.mtu_bytes);
    Err(PlanError::PastForwarding {
        links,
        shapers,
        rate: netgap_core::units::rate_text(rate_bps),
        need_gbps: rate_bps as f64 * share * f64::from(shapers) / 1e9,
        share_pct: 100.0 * netgap_core::physics::FORWARDING_CARRY_SHARE,
        forwarding_gbps: forwarding_mbps as f64 / 1e3,
        carried: netgap_core::units::rate_text(carried),
    })
}

/// Checks a list of counts against 1..=`max`.
fn check_counts(flag: &'static str, counts: &[u32], max: u32) -> Result<(), PlanError> {
    let list = || {
        counts
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    if counts.is_empty() {
        return Err(invalid(flag, "", "no count given"));
    }
    if let Some(n) = counts.iter().find(|&&n| n == 0 || n > max) {
        return Err(invalid(
            flag,
            list(),
            format!("{n} is not between 1 and {max}"),
        ));
    }
    Ok(())
}

/// The points' values of `test`'s own options: the options given that it
/// declares, parsed, their axes crossed.
fn workload_args(
    test: &'static dyn Workload,
    given: &[(String, String)],
) -> Result<Vec<WorkloadArgs>, PlanError> {
    let mut parsed = Vec::new();
    for (flag, raw) in given {
        let Some(decl) = test.options().iter().find(|o| o.flag == flag.as_str()) else {
            continue;
        };
        let values = wopt::parse(decl, raw)
            .map_err(|e| PlanError::Workload(netgap_workload::Refused(e.to_string())))?;
        parsed.push((*decl, values));
    }
    Ok(wopt::cross(&parsed))
}

/// Refuses a workload option that no workload of the run declares.
fn refuse_foreign_options(
    tests: &[&'static dyn Workload],
    given: &[(String, String)],
) -> Result<(), PlanError> {
    for (flag, _) in given {
        if !tests
            .iter()
            .any(|t| t.options().iter().any(|o| o.flag == flag.as_str()))
        {
            let takers = wopt::workloads_taking(flag);
            let what = tests
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(", ");
            let reason = if takers.is_empty() {
                "no workload takes it".to_string()
            } else {
                format!("it is an option of {}", takers.join(", "))
            };
            return Err(no_effect(&format!("--{flag}"), &what, reason));
        }
    }
    Ok(())
}

/// Descriptors kept aside for everything but the flows.
const SPARE_DESCRIPTORS: u64 = 256;

/// In-process agents hold both ends of every engine flow in this one
/// process: refuse counts its descriptor limit cannot hold, before any
/// socket opens, saying what to change.
fn check_embedded_descriptors(
    tests: &[&'static dyn Workload],
    clients: Option<&[u32]>,
) -> Result<(), PlanError> {
    let Some(counts) = clients else { return Ok(()) };
    if !tests.iter().any(|t| t.count() == CountFlag::Clients) {
        return Ok(());
    }
    check_counts("--clients", counts, MAX_WORKLOAD_FLOWS)?;
    let most = counts.iter().copied().max().unwrap_or(0);
    let needed = 2 * u64::from(most) + SPARE_DESCRIPTORS;
    let Ok((_, hard)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return Ok(());
    };
    if needed > hard {
        return Err(PlanError::Descriptors {
            clients: most,
            needed,
            limit: hard,
        });
    }
    Ok(())
}

/// Refuses the flags a workload run would ignore: the point-to-point
/// method (iterations, time budgets, confidence targets, placement, payload
/// checks), `--peer` and `-6`, and flags of tests that are not asked for.
fn refuse_ignored_flags(r: &RunRequest, tests: &[&'static dyn Workload]) -> Result<(), PlanError> {
    let what = r.tests.join(",");
    let m = &r.method;
    let window =
        "each repetition of a workload is a --duration window after a warm-up of a fifth of it";
    for (flag, given, reason) in [
        (
            "--peer",
            r.target.peer.is_some(),
            "workloads drive the agents of --hosts",
        ),
        (
            "-6",
            r.target.ipv6,
            "in-process hosts are IPv4 loopback addresses; give IPv6 agents with --hosts",
        ),
        ("--iterations", m.iterations.is_some(), window),
        ("--rep-time", m.rep_time.is_some(), window),
        ("--warmup", m.warmup.is_some(), window),
        ("--paper", m.paper, window),
        (
            "--ci",
            m.ci.is_some(),
            "workloads repeat each point --reps times",
        ),
        (
            "--pin",
            m.pin.is_some(),
            "multi-host flows are not placed on CPUs",
        ),
        (
            "--verify",
            m.verify,
            "multi-host flows do not check payload bytes",
        ),
    ] {
        if given {
            return Err(no_effect(flag, &what, reason));
        }
    }
    let any = |count: CountFlag| tests.iter().any(|t| t.count() == count);
    if r.multi_host.clients.is_some() && !any(CountFlag::Clients) {
        return Err(no_effect(
            "--clients",
            &what,
            "multistream takes -P, multirail one flow per link",
        ));
    }
    if r.multi_host.streams.is_some() && !any(CountFlag::Streams) {
        return Err(no_effect(
            "--streams",
            &what,
            "only multistream runs parallel streams",
        ));
    }
    if r.target.hosts.is_some() && r.multi_host.client_hosts.is_some() {
        return Err(no_effect(
            "--client-hosts",
            &what,
            "the hosts of --hosts are the client hosts",
        ));
    }
    if r.multi_host.links.is_some() && !any(CountFlag::Hosts) {
        return Err(no_effect(
            "--links",
            &what,
            "only multirail chooses how many links it uses",
        ));
    }
    if r.multi_host.bidir && !tests.iter().any(|t| t.takes_bidir()) {
        return Err(no_effect(
            "--bidir",
            &what,
            "only multistream and multirail send both ways at once",
        ));
    }
    Ok(())
}

impl WorkloadPlan {
    /// Validates a run of workloads.
    pub fn from_request(r: &RunRequest) -> Result<WorkloadPlan, PlanError> {
        let tests = find_workloads(&r.tests)?;
        let what = r.tests.join(",");
        crate::plan::refuse_interleaving(r, &what)?;
        refuse_ignored_flags(r, &tests)?;
        refuse_foreign_options(&tests, &r.multi_host.workload_options)?;
        let settings = Settings::new(&r.common(DEFAULT_REP_TIME), &what)?;
        let hosts = run_hosts(r, &settings)?;
        let duration = checked_duration(r)?;
        let warmup = (duration / 5).min(MAX_WARMUP);
        if let Some(sizes) = &r.method.sizes {
            for &size in sizes {
                settings.stacks.check_size(size, "--sizes")?;
            }
        }
        if let HostsSource::Embedded { .. } = hosts {
            check_embedded_descriptors(&tests, r.multi_host.clients.as_deref())?;
        }
        if let (Some(counts), HostsSource::File(_)) = (&r.multi_host.links, &hosts) {
            check_counts("--links", counts, MAX_LINK_COUNT)?;
        }
        let mut points = Vec::new();
        for &test in &tests {
            points.extend(workload_points(test, r, &settings, &hosts)?);
        }
        check_forwarding(&points, &hosts, &settings)?;
        Ok(WorkloadPlan {
            points,
            hosts,
            duration,
            warmup,
            settings,
        })
    }
}

/// The workloads `names` name, in order; refuses a name no workload has.
fn find_workloads(names: &[String]) -> Result<Vec<&'static dyn Workload>, PlanError> {
    names
        .iter()
        .map(|name| {
            super::find(name).ok_or_else(|| PlanError::UnknownTest {
                name: name.clone(),
                available: super::names(),
            })
        })
        .collect()
}

/// Where the run's roles go: the hosts of `--hosts` (at least two), else
/// in-process hosts on loopback with `--client-hosts` clients and as many
/// links as the largest `--links`.
fn run_hosts(r: &RunRequest, settings: &Settings) -> Result<HostsSource, PlanError> {
    if let Some(hosts) = &settings.hosts {
        if hosts.hosts() < 2 {
            use crate::cluster::Launcher;
            let detail = match hosts {
                HostsSource::Nodes { launcher: Launcher::Slurm, .. } => "the allocation has one node, and a workload run needs a server and at least one client host (allocate two or more: sbatch -N 2)",
                HostsSource::Nodes { .. } => "the hostfile names one host, and a workload run needs a server and at least one client host",
                _ => "a workload run needs a server and at least one client host, e.g. 10.0.0.1,10.0.0.2",
            };
            return Err(invalid("--hosts", hosts.label(), detail));
        }
        return Ok(hosts.clone());
    }
    let client_hosts = r.multi_host.client_hosts.unwrap_or(DEFAULT_CLIENT_HOSTS);
    if client_hosts == 0 || client_hosts > MAX_EMBEDDED_HOSTS {
        return Err(invalid(
            "--client-hosts",
            client_hosts,
            format!("must be between 1 and {MAX_EMBEDDED_HOSTS}"),
        ));
    }
    let links = match &r.multi_host.links {
        Some(counts) => {
            check_counts("--links", counts, MAX_LOOPBACK_LINKS)?;
            counts.iter().copied().max().unwrap_or(DEFAULT_LINKS)
        }
        None => DEFAULT_LINKS,
    };
    Ok(HostsSource::Embedded {
        client_hosts,
        links,
    })
}

/// `--duration`, the measured window of each repetition, checked against
/// its bounds.
fn checked_duration(r: &RunRequest) -> Result<Duration, PlanError> {
    let duration = r.multi_host.duration.unwrap_or(DEFAULT_DURATION);
    let max = Duration::from_millis(u64::from(MAX_WORKLOAD_DURATION_MS));
    if duration < MIN_DURATION || duration > max {
        return Err(invalid(
            "--duration",
            show(duration),
            format!("must be between 10ms and {}s", max.as_secs()),
        ));
    }
    Ok(duration)
}

/// The counts `test` runs with: its `--clients` (one per client host by
/// default), `--streams`, or `--links` (every link without it), checked
/// against its largest number of flows.
fn workload_counts(
    test: &'static dyn Workload,
    r: &RunRequest,
    hosts: &HostsSource,
) -> Result<Vec<u32>, PlanError> {
    let limit = test.max_flows();
    Ok(match test.count() {
        CountFlag::Clients => {
            let default_clients = vec![hosts.client_hosts()];
            let c = r.multi_host.clients.as_ref().unwrap_or(&default_clients);
            check_counts("--clients", c, limit)?;
            c.clone()
        }
        CountFlag::Streams => {
            let default_streams = vec![DEFAULT_STREAMS];
            let c = r.multi_host.streams.as_ref().unwrap_or(&default_streams);
            check_counts("--streams", c, limit)?;
            c.clone()
        }
        // Without --links the hosts decide: every link.
        CountFlag::Hosts => r.multi_host.links.clone().unwrap_or_else(|| vec![0]),
    })
}

/// The points of `test`: every transport, mode and size (the workload's
/// own size on each transport without `--sizes`), each with every value
/// of its own options and every count.
fn workload_points(
    test: &'static dyn Workload,
    r: &RunRequest,
    settings: &Settings,
    hosts: &HostsSource,
) -> Result<Vec<WorkloadPoint>, PlanError> {
    let counts = workload_counts(test, r, hosts)?;
    let arg_points = workload_args(test, &r.multi_host.workload_options)?;
    let bidir = r.multi_host.bidir && test.takes_bidir();
    let mut seen = Vec::new();
    let sizes_given = r.method.sizes.as_deref();
    let mut points = Vec::new();
    for &t in &settings.stacks.transports {
        for &mode in &settings.stacks.modes {
            // Without --sizes, the workload's own size on this
            // transport, checked as a given one would be.
            if !t.capabilities().modes.contains(&mode) {
                return Err(PlanError::NoMode {
                    transport: t.name().to_string(),
                    mode,
                });
            }
            let default_size = [test.default_size_bytes(t)];
            for &size in sizes_given.unwrap_or(&default_size) {
                let spec = settings.point(test.name(), t.name(), mode, size);
                spec.validate()?;
                test.check(&spec, t)?;
                if sizes_given.is_none() {
                    settings.stacks.check_size_on(size, "--sizes", [t])?;
                }
                let key = (spec.transport.clone(), spec.mode, spec.size_bytes);
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                for args in &arg_points {
                    test.check_args(&spec, t, args)?;
                    netgap_workload::check_preload_relayed(test, &spec, args)?;
                    let mut params = test.params(&spec, args);
                    if bidir {
                        if let Some(o) = params.as_object_mut() {
                            o.insert("bidir".into(), serde_json::Value::Bool(true));
                        }
                    }
                    for &clients in &counts {
                        points.push(WorkloadPoint {
                            workload: test,
                            spec: spec.clone(),
                            clients,
                            bidir,
                            args: args.clone(),
                            params: params.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(points)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::plan::Plan;

    fn err(r: &RunRequest) -> String {
        WorkloadPlan::from_request(r).unwrap_err().to_string()
    }

    #[test]
    fn client_lists_make_one_point_each() {
        let mut r = RunRequest::new(&["fanin"]);
        r.multi_host.clients = Some(vec![3, 6, 9, 12]);
        let p = WorkloadPlan::from_request(&r).unwrap();
        let counts: Vec<u32> = p.points.iter().map(|p| p.clients).collect();
        assert_eq!(counts, vec![3, 6, 9, 12]);
        assert_eq!(p.points[0].spec.size_bytes, 64 * 1024);
        assert_eq!(p.points[0].spec.test, "fanin");
        // Sizes given apply to every test, even one equal to a default list.
        r.method.sizes = Some(crate::plan::DEFAULT_SIZES_BYTES.to_vec());
        let p = WorkloadPlan::from_request(&r).unwrap();
        assert_eq!(p.points.len(), 4 * 6);
    }

    #[test]
    fn a_link_list_makes_one_point_per_count_and_bidir_goes_to_the_roles() {
        let mut r = RunRequest::new(&["multirail", "multistream"]);
        r.multi_host.links = Some(vec![1, 2, 3]);
        r.multi_host.bidir = true;
        let p = WorkloadPlan::from_request(&r).unwrap();
        let rail: Vec<u32> = p
            .points
            .iter()
            .filter(|p| p.workload.name() == "multirail")
            .map(|p| p.clients)
            .collect();
        assert_eq!(rail, vec![1, 2, 3]);
        assert!(matches!(p.hosts, HostsSource::Embedded { links: 3, .. }));
        for point in &p.points {
            assert!(point.bidir);
            assert_eq!(point.params["bidir"], true);
        }
        r.multi_host.links = Some(vec![0]);
        assert!(err(&r).contains("--links"));
    }

    #[test]
    fn bad_inputs_are_one_line_errors() {
        let mut r = RunRequest::new(&["fanin"]);
        r.multi_host.clients = Some(vec![0]);
        assert!(err(&r).contains("--clients"));
        let mut r = RunRequest::new(&["connect"]);
        r.transport.transports = vec!["udp".into()];
        let e = err(&r);
        assert!(
            e.contains("connect measures connection setup, which udp does not have"),
            "{e}"
        );
        let mut r = RunRequest::new(&["hotspot", "multirail"]);
        r.transport.transports = vec!["udp".into()];
        assert!(WorkloadPlan::from_request(&r).is_ok());
        let mut r = RunRequest::new(&["fanout"]);
        r.transport.transports = vec!["unix".into()];
        assert!(err(&r).contains("cannot cross hosts"));
        let mut r = RunRequest::new(&["fanin"]);
        r.multi_host.duration = Some(Duration::from_secs(7200));
        assert!(err(&r).contains("--duration 2h"));
        assert!(is_workload_run(&["fanin".into(), "pingpong".into()]).is_err());
        assert!(!is_workload_run(&["pingpong".into()]).unwrap());
    }

    #[test]
    fn flags_a_workload_run_ignores_are_refused() {
        let mut r = RunRequest::new(&["fanin"]);
        r.multi_host.streams = Some(vec![2]);
        assert!(err(&r).starts_with("--streams does not apply to fanin"));
        let mut r = RunRequest::new(&["multistream"]);
        r.multi_host.clients = Some(vec![2]);
        assert!(err(&r).starts_with("--clients does not apply"));
        let mut r = RunRequest::new(&["fanin"]);
        r.multi_host.links = Some(vec![2]);
        assert!(err(&r).starts_with("--links does not apply"));
        let mut r = RunRequest::new(&["fanin"]);
        r.multi_host.bidir = true;
        assert!(err(&r).starts_with("--bidir does not apply"));
        let mut r = RunRequest::new(&["hotspot"]);
        r.method.verify = true;
        assert!(err(&r).starts_with("--verify does not apply"));
        let mut r = RunRequest::new(&["fanin"]);
        r.method.iterations = Some(10);
        assert!(err(&r).starts_with("--iterations does not apply"));
        let mut r = RunRequest::new(&["fanin", "multirail"]);
        r.multi_host.links = Some(vec![2]);
        assert!(WorkloadPlan::from_request(&r).is_ok());
        let mut r = RunRequest::new(&["fanin"]);
        r.multi_host.workload_options = vec![("no-such".into(), "1".into())];
        assert!(err(&r).starts_with("--no-such does not apply to fanin"));
        let mut r = RunRequest::new(&["pingpong"]);
        r.multi_host.workload_options = vec![("no-such".into(), "1".into())];
        let e = Plan::from_request(&r).unwrap_err().to_string();
        assert!(e.starts_with("--no-such does not apply"), "{e}");
    }
}
