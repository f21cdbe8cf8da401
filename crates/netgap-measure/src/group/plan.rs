//! From the flags of `netgap run` to the points of a multi-host run. The
//! transport, mode, size and socket-option flags are validated by the
//! point-to-point [`Plan`] (the same rules apply); this adds the hosts,
//! client counts, streams, links and the window of each repetition.

use crate::cluster::HostsFile;
use crate::control::ControlAddr;
use crate::plan::{Plan, PlanError, RunArgs};
use crate::workload::{CountFlag, Workload};
use netgap_core::spec::PointSpec;
use netgap_core::units::parse_duration;
use netgap_proto::group::{MAX_GROUP_DURATION_MS, MAX_GROUP_FLOWS};
use std::path::PathBuf;
use std::time::Duration;

/// The `--sizes` default of point-to-point runs; group tests replace it
/// with their own default when it was not changed.
const P2P_DEFAULT_SIZES: &str = "1,64,1K,16K,64K,1M";
/// Shortest measured window.
const MIN_DURATION: Duration = Duration::from_millis(10);
/// Longest uncounted warm-up before each window.
const MAX_WARMUP: Duration = Duration::from_secs(1);
/// Most loopback links of an in-process multirail run.
pub const MAX_LOOPBACK_LINKS: u32 = 64;
/// Most in-process client hosts.
pub const MAX_EMBEDDED_HOSTS: u32 = 64;

/// Where the hosts of a group run come from.
#[derive(Debug, Clone)]
pub enum HostsSource {
    /// A hosts file (`--hosts @FILE`).
    File(HostsFile),
    /// Agents' control addresses (`--hosts A,B,...`); the first is the server.
    Addrs(Vec<ControlAddr>),
    /// In-process agents on loopback: a server on 127.0.0.1 and
    /// `client_hosts` client hosts on 127.0.0.2, 127.0.0.3, ...
    Embedded {
        /// Client hosts.
        client_hosts: u32,
        /// Loopback links of multirail.
        links: u32,
    },
}

impl HostsSource {
    /// Client hosts available.
    pub fn client_hosts(&self) -> u32 {
        match self {
            HostsSource::File(f) => f.hosts.len().saturating_sub(1) as u32,
            HostsSource::Addrs(a) => a.len().saturating_sub(1) as u32,
            HostsSource::Embedded { client_hosts, .. } => *client_hosts,
        }
    }

    /// How the hosts were given, for the record's options.
    pub fn label(&self) -> String {
        match self {
            HostsSource::File(_) => "hosts-file".into(),
            HostsSource::Addrs(a) => a
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(","),
            HostsSource::Embedded { .. } => "embedded".into(),
        }
    }
}

/// One point of a group run.
#[derive(Clone)]
pub struct GroupPoint {
    /// The workload.
    pub workload: &'static dyn Workload,
    /// Transport, mode, size, options, timeout (its `test` is the
    /// workload's name).
    pub spec: PointSpec,
    /// The count the workload reads ([`Workload::count`]): clients or
    /// streams; 0 when the hosts decide.
    pub clients: u32,
    /// The workload's parameters for every role of the point.
    pub params: serde_json::Value,
}

impl std::fmt::Debug for GroupPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupPoint")
            .field("workload", &self.workload.name())
            .field("spec", &self.spec)
            .field("clients", &self.clients)
            .field("params", &self.params)
            .finish()
    }
}

/// A validated group run.
#[derive(Debug, Clone)]
pub struct GroupPlan {
    /// Points in measurement order.
    pub points: Vec<GroupPoint>,
    /// The hosts.
    pub hosts: HostsSource,
    /// Repetitions per point.
    pub reps: u32,
    /// Measured window of each repetition.
    pub duration: Duration,
    /// Uncounted warm-up before each window.
    pub warmup: Duration,
    /// JSON Lines output.
    pub json: Option<PathBuf>,
    /// CSV output.
    pub csv: Option<PathBuf>,
    /// The point-to-point plan the shared flags validated into, for the
    /// record's options.
    pub base: Plan,
}

fn bad(msg: impl Into<String>) -> PlanError {
    PlanError(msg.into())
}

/// Whether every test named in `tests` (comma separated) is a group test;
/// `Err` if group and point-to-point tests are mixed.
pub fn is_group_run(tests: &str) -> Result<bool, PlanError> {
    let names: Vec<&str> = tests
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .collect();
    let group = names.iter().filter(|n| super::find(n).is_some()).count();
    if group == 0 {
        return Ok(false);
    }
    if group != names.len() {
        return Err(bad(format!(
            "multi-host tests ({}) cannot be mixed with point-to-point tests in one run",
            super::names()
        )));
    }
    Ok(true)
}

fn parse_counts(flag: &str, text: &str, max: u32) -> Result<Vec<u32>, PlanError> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let n: u32 = part
            .parse()
            .map_err(|_| bad(format!("{flag} {text}: {part:?} is not a count")))?;
        if n == 0 || n > max {
            return Err(bad(format!(
                "{flag} {text}: {n} is not between 1 and {max}"
            )));
        }
        out.push(n);
    }
    if out.is_empty() {
        return Err(bad(format!("{flag}: no count given")));
    }
    Ok(out)
}

fn parse_hosts(text: &str) -> Result<HostsSource, PlanError> {
    if let Some(path) = text.strip_prefix('@') {
        let file = HostsFile::load(std::path::Path::new(path)).map_err(|e| bad(e.to_string()))?;
        if file.hosts.len() < 2 {
            return Err(bad(format!(
                "--hosts {text}: a multi-host run needs a server and at least one client host"
            )));
        }
        return Ok(HostsSource::File(file));
    }
    let mut addrs = Vec::new();
    for part in text.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let with_port = if part.parse::<std::net::IpAddr>().is_ok() {
            format!("{part}:{}", crate::plan::DEFAULT_PORT)
        } else {
            part.to_string()
        };
        let addr = ControlAddr::parse(&with_port).ok_or_else(|| {
            bad(format!(
                "--hosts: {part:?} is not IP[:PORT] or unix:PATH (or give @FILE)"
            ))
        })?;
        addrs.push(addr);
    }
    if addrs.len() < 2 {
        return Err(bad(
            "--hosts: give the server and at least one client host, e.g. 10.0.0.1,10.0.0.2",
        ));
    }
    Ok(HostsSource::Addrs(addrs))
}

/// Descriptors kept aside for everything but the flows.
const SPARE_DESCRIPTORS: u64 = 256;

/// In-process agents hold both ends of every engine flow in this one
/// process: refuse counts its descriptor limit cannot hold, before any
/// socket opens, saying what to change.
fn check_embedded_descriptors(
    tests: &[&'static dyn Workload],
    clients: Option<&str>,
) -> Result<(), PlanError> {
    let Some(text) = clients else { return Ok(()) };
    if !tests.iter().any(|t| t.count() == CountFlag::Clients) {
        return Ok(());
    }
    let most = parse_counts("--clients", text, MAX_GROUP_FLOWS)?
        .into_iter()
        .max()
        .unwrap_or(0);
    let needed = 2 * u64::from(most) + SPARE_DESCRIPTORS;
    let Ok((_, hard)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return Ok(());
    };
    if needed > hard {
        return Err(bad(format!(
            "--clients {most}: in-process agents hold both ends of every flow in this process, {needed} descriptors, but the limit is {hard}; run `netgap serve` on each host and give --hosts, or raise the hard limit (ulimit -Hn, /etc/security/limits.conf)"
        )));
    }
    Ok(())
}

impl GroupPlan {
    /// Validates the flags of a run of group tests.
    pub fn from_args(a: &RunArgs) -> Result<GroupPlan, PlanError> {
        let mut tests = Vec::new();
        for name in a.test.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            tests.push(super::find(name).ok_or_else(|| {
                bad(format!(
                    "unknown test {name:?}; multi-host tests: {}",
                    super::names()
                ))
            })?);
        }
        let hosts = match &a.hosts {
            Some(h) => parse_hosts(h)?,
            None => {
                if a.client_hosts == 0 || a.client_hosts > MAX_EMBEDDED_HOSTS {
                    return Err(bad(format!(
                        "--client-hosts {}: must be between 1 and {MAX_EMBEDDED_HOSTS}",
                        a.client_hosts
                    )));
                }
                if a.links == 0 || a.links > MAX_LOOPBACK_LINKS {
                    return Err(bad(format!(
                        "--links {}: must be between 1 and {MAX_LOOPBACK_LINKS}",
                        a.links
                    )));
                }
                HostsSource::Embedded {
                    client_hosts: a.client_hosts,
                    links: a.links,
                }
            }
        };
        let duration = parse_duration(&a.duration).map_err(|e| bad(format!("--duration: {e}")))?;
        let max = Duration::from_millis(u64::from(MAX_GROUP_DURATION_MS));
        if duration < MIN_DURATION || duration > max {
            return Err(bad(format!(
                "--duration {}: must be between 10ms and {}s",
                a.duration,
                max.as_secs()
            )));
        }
        let warmup = (duration / 5).min(MAX_WARMUP);
        let sizes_changed = a.sizes.replace(' ', "") != P2P_DEFAULT_SIZES;
        // Unchanged sizes are replaced per test below; validate a size
        // every transport carries meanwhile.
        let base_args = RunArgs {
            test: "stream".into(),
            sizes: if sizes_changed {
                a.sizes.clone()
            } else {
                "1".into()
            },
            ..a.clone()
        };
        let base = Plan::from_args(&base_args)?;
        let client_hosts = hosts.client_hosts();
        let default_clients = client_hosts.to_string();
        if let HostsSource::Embedded { .. } = hosts {
            check_embedded_descriptors(&tests, a.clients.as_deref())?;
        }
        let mut points = Vec::new();
        for &test in &tests {
            let limit = test.max_flows();
            let counts = match test.count() {
                CountFlag::Clients => parse_counts(
                    "--clients",
                    a.clients.as_deref().unwrap_or(&default_clients),
                    limit,
                )?,
                CountFlag::Streams => parse_counts("--streams", &a.streams, limit)?,
                CountFlag::Hosts => vec![0],
            };
            let mut seen = Vec::new();
            for spec in &base.points {
                let t = netgap_transport::find(&spec.transport)
                    .ok_or_else(|| bad(format!("unknown transport {}", spec.transport)))?;
                test.check(spec, t).map_err(|e| bad(e.to_string()))?;
                let mut spec = spec.clone();
                spec.test = test.name().to_string();
                if !sizes_changed {
                    spec.size_bytes = test.default_size_bytes(t);
                }
                let key = (spec.transport.clone(), spec.mode, spec.size_bytes);
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                let params = test.params(&spec);
                for &clients in &counts {
                    points.push(GroupPoint {
                        workload: test,
                        spec: spec.clone(),
                        clients,
                        params: params.clone(),
                    });
                }
            }
        }
        Ok(GroupPlan {
            points,
            hosts,
            reps: base.method.reps,
            duration,
            warmup,
            json: a.json.clone(),
            csv: a.csv.clone(),
            base,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn client_lists_make_one_point_each() {
        let mut a = RunArgs::with_defaults("fanin");
        a.clients = Some("3,6,9,12".into());
        let p = GroupPlan::from_args(&a).unwrap();
        let counts: Vec<u32> = p.points.iter().map(|p| p.clients).collect();
        assert_eq!(counts, vec![3, 6, 9, 12]);
        assert_eq!(p.points[0].spec.size_bytes, 64 * 1024);
        assert_eq!(p.points[0].spec.test, "fanin");
    }

    #[test]
    fn bad_inputs_are_one_line_errors() {
        let mut a = RunArgs::with_defaults("fanin");
        a.clients = Some("0".into());
        assert!(GroupPlan::from_args(&a).is_err());
        let mut a = RunArgs::with_defaults("hotspot");
        a.transport = "udp".into();
        let e = GroupPlan::from_args(&a).unwrap_err().to_string();
        assert!(
            e.contains("flow engine, which carries tcp, uring, not udp"),
            "{e}"
        );
        let mut a = RunArgs::with_defaults("multirail");
        a.transport = "udp".into();
        let e = GroupPlan::from_args(&a).unwrap_err().to_string();
        assert!(e.contains("binds each flow"), "{e}");
        let mut a = RunArgs::with_defaults("fanout");
        a.transport = "unix".into();
        let e = GroupPlan::from_args(&a).unwrap_err().to_string();
        assert!(e.contains("cannot cross hosts"), "{e}");
        let mut a = RunArgs::with_defaults("fanin");
        a.duration = "2h".into();
        assert!(GroupPlan::from_args(&a).is_err());
        assert!(is_group_run("fanin,pingpong").is_err());
        assert!(!is_group_run("pingpong").unwrap());
    }
}
