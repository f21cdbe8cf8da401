//! A validated MPI run: the points, the method, and where the two ranks
//! run (this machine's shared memory, or two hosts of netgap's testbed over
//! its links). The method, sizes, outputs and conditions are checked into
//! the same settings as every point-to-point test's
//! (`netgap_measure::plan::Settings`), so
//! `--reps`, `--iterations`, `--rep-time`, `--warmup`, `--sizes`,
//! `--label` and `--conditions` mean the same for MPI as for sockets.

use crate::kind::MpiTest;
use crate::launch::{check_environment, netgap_mca_names, EnvironmentClash, LocalBtl, Where};
use crate::library::Library;
use crate::wire::{RankIterations, RankPlan, RankPoint, MAX_MPI_SIZE_BYTES};
use netgap_core::spec::{Mode, PointSpec};
use netgap_measure::cluster::{ClusterNode, HostEntry, HostsArg, HostsSource};
use netgap_measure::plan::{
    Peer, PlanError, RunRequest, Settings, TransportChoice, DEFAULT_SIZES_BYTES,
};
use netgap_measure::runner::IterationPolicy;

/// A validated MPI run.
#[derive(Debug, Clone)]
pub struct MpiPlan {
    /// The checked method, agent, outputs, label, testbed and conditions.
    pub settings: Settings,
    /// The points, in order: the test and the spec its record describes
    /// (transport `mpi`).
    pub points: Vec<(MpiTest, PointSpec)>,
    /// The testbed hosts of rank 0 and rank 1, or `None` for this machine.
    pub hosts: Option<(HostEntry, HostEntry)>,
    /// The first two nodes of a cluster launcher's hosts (`--hosts
    /// @slurm`, `@hostfile`): rank 0 and rank 1 run there, started by
    /// mpirun from here (through srun inside a Slurm allocation).
    pub nodes: Option<(ClusterNode, ClusterNode)>,
    /// The BTL the ranks meet over on this machine (across testbed hosts
    /// they always use TCP).
    pub local_btl: LocalBtl,
    /// The preload library the ranks run under (`-t shm|xdp` with MPI
    /// tests alone), its tcp BTL's connections moved by it; `None`: the
    /// ranks run as they are.
    pub library: Option<Library>,
}

/// The MPI tests' own flags, as the command line gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MpiOptions {
    /// `--mpi-btl`: the BTL the ranks use on this machine.
    pub btl: Option<LocalBtl>,
}

/// Why an MPI run cannot be measured, in one line naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum MpiPlanError {
    /// The shared checks refused the request.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A flag that does not apply to MPI tests.
    #[error("{flag} has no effect on the MPI tests ({tests}): {why}")]
    NoEffect {
        /// The flag.
        flag: &'static str,
        /// The MPI tests asked for.
        tests: String,
        /// Why, and what to do.
        why: &'static str,
    },
    /// A size over the MPI tests' limit.
    #[error("--sizes: {size_bytes} bytes is over the MPI tests' limit of {MAX_MPI_SIZE_BYTES} bytes (a window of 64 messages is held in memory)")]
    TooLarge {
        /// The size.
        size_bytes: u64,
    },
    /// The hosts are not two testbed hosts.
    #[error("--hosts: {0}")]
    Hosts(String),
    /// `--mpi-btl` asks for what the placement cannot do.
    #[error("--mpi-btl {btl}: {why}")]
    Btl {
        /// The BTL asked for.
        btl: &'static str,
        /// Why not.
        why: &'static str,
    },
    /// The environment sets an Open MPI parameter netgap sets itself.
    #[error(transparent)]
    Environment(#[from] EnvironmentClash),
    /// The ranks cannot run under the library where they are placed.
    #[error("-t {stack}: {why}")]
    Library {
        /// The library's stack asked for.
        stack: String,
        /// Why not, and what to do.
        why: &'static str,
    },
}

/// Splits a run's test names into MPI tests and the rest, in order.
pub fn split_tests(names: &[String]) -> (Vec<MpiTest>, Vec<String>) {
    let mut mpi = Vec::new();
    let mut rest = Vec::new();
    for n in names {
        match MpiTest::by_name(n) {
            Some(t) => mpi.push(t),
            None => rest.push(n.clone()),
        }
    }
    (mpi, rest)
}

impl MpiPlan {
    /// Validates the MPI part of `r`: `tests` are its MPI tests, `mpi`
    /// their own flags, `env` the environment mpirun will see (its
    /// `OMPI_MCA_*` variables are checked against the parameters netgap
    /// sets); `alone` says the run has no other tests, so that flags only
    /// other tests use are refused rather than ignored.
    pub fn from_request<E>(
        r: &RunRequest,
        tests: &[MpiTest],
        mpi: &MpiOptions,
        env: E,
        alone: bool,
    ) -> Result<MpiPlan, MpiPlanError>
    where
        E: IntoIterator<Item = (String, String)>,
    {
        let names = tests.iter().map(|t| t.name()).collect::<Vec<_>>().join(",");
        let no_effect = |flag, why| MpiPlanError::NoEffect {
            flag,
            tests: names.clone(),
            why,
        };
        let library = library_choice(r, alone, &no_effect)?;
        refuse_socket_flags(r, alone && library.is_none(), &no_effect)?;
        if let Some(&s) = r
            .method
            .sizes
            .iter()
            .flatten()
            .find(|&&s| s > MAX_MPI_SIZE_BYTES)
        {
            return Err(MpiPlanError::TooLarge { size_bytes: s });
        }
        // A launcher's nodes: mpirun starts the ranks on the first two, so
        // the run itself has no agents to reach (nor to wait for).
        let launcher = launcher_nodes(r)?;
        let nodes = launcher.as_ref().map(|l| l.nodes.clone());
        let r = launcher.as_ref().map_or(r, |l| &l.request);
        let record_tests = tests.iter().map(|t| t.record_test()).collect::<Vec<_>>();
        // The ranks' stack is MPI's own: the socket transports' flags are
        // the socket tests'.
        let settings =
            Settings::with_stack(r, &TransportChoice::default(), &record_tests.join(","))?;
        let sizes = r
            .method
            .sizes
            .clone()
            .unwrap_or_else(|| DEFAULT_SIZES_BYTES.to_vec());
        settings.check_sizes(&sizes)?;
        let hosts = testbed_hosts(&settings.peer, &no_effect)?;
        let across = hosts.is_some() || nodes.is_some();
        let local_btl = local_btl(mpi.btl, across, library.as_ref())?;
        if let Some(l) = &library {
            check_library_placement(l, hosts.is_some(), across)?;
        }
        let placed = match (&hosts, &nodes) {
            (Some(_), _) => Where::Testbed,
            (None, Some(_)) => Where::Nodes,
            (None, None) => Where::Local(local_btl),
        };
        check_environment(env, &netgap_mca_names(placed)).map_err(MpiPlanError::Environment)?;
        let points = mpi_points(tests, &sizes, &settings)?;
        Ok(MpiPlan {
            settings,
            points,
            hosts,
            nodes,
            local_btl,
            library,
        })
    }

    /// What the ranks are told to run.
    pub fn rank_plan(&self) -> RankPlan {
        RankPlan {
            points: self
                .points
                .iter()
                .map(|(test, spec)| RankPoint {
                    test: *test,
                    size_bytes: spec.size_bytes,
                })
                .collect(),
            reps: self.settings.method.reps,
            iterations: match self.settings.method.iterations {
                IterationPolicy::Fixed(n) => RankIterations::Fixed(n),
                IterationPolicy::Budget(d) => {
                    RankIterations::BudgetUs(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
                }
            },
            warmup: self.settings.method.warmup,
        }
    }
}

/// Refuses the flags of `r` that mean nothing to the MPI ranks, in one
/// line saying why (`no_effect` names the MPI tests); `alone` says the run
/// has no socket tests, so their transport flags are refused too.
fn refuse_socket_flags(
    r: &RunRequest,
    alone: bool,
    no_effect: &dyn Fn(&'static str, &'static str) -> MpiPlanError,
) -> Result<(), MpiPlanError> {
    if r.target.peer.is_some() {
        return Err(no_effect(
            "--peer",
            "mpirun starts both ranks; give --hosts @testbed to run them on two testbed hosts",
        ));
    }
    if r.method.pin.is_some() {
        return Err(no_effect("--pin", "mpirun places the ranks"));
    }
    if r.method.ci.is_some() {
        return Err(no_effect("--ci", "give --reps"));
    }
    if r.method.verify {
        return Err(no_effect("--verify", "MPI delivers the bytes it was given"));
    }
    if r.method.buffer.align_bytes.is_some() || r.method.buffer.offset_bytes.is_some() {
        return Err(no_effect(
            "--align/--offset",
            "the MPI ranks place their own buffers",
        ));
    }
    if r.interleaving.interleave {
        return Err(no_effect(
            "--interleave",
            "MPI runs in its own job; --conditions measures it under each condition",
        ));
    }
    if alone && !r.transport.options.is_empty() {
        return Err(no_effect(
            "transport options",
            "they set the sockets of netgap's own transports",
        ));
    }
    if alone && r.transport != TransportChoice::default() {
        return Err(no_effect(
            "-t/--mode",
            "they choose the stacks of the socket tests; add e.g. pingpong,stream to the run to measure sockets beside MPI",
        ));
    }
    Ok(())
}

/// The ranks' nodes of a cluster launcher, and the request validated in
/// their place.
struct LauncherNodes {
    /// The first two nodes: rank 0's and rank 1's.
    nodes: (ClusterNode, ClusterNode),
    /// The request without its hosts: mpirun reaches the nodes itself.
    request: RunRequest,
}

/// The first two nodes of a cluster launcher's hosts (`--hosts @slurm`,
/// `@hostfile`); none for a testbed's hosts file or no hosts; a list of
/// agents is refused.
fn launcher_nodes(r: &RunRequest) -> Result<Option<LauncherNodes>, MpiPlanError> {
    let Some(h) = &r.target.hosts else {
        return Ok(None);
    };
    match h {
        HostsArg::File { .. } => Ok(None),
        HostsArg::Slurm { .. } | HostsArg::Hostfile { .. } => {
            let source = h.load().map_err(|e| MpiPlanError::Plan(e.into()))?;
            let HostsSource::Nodes { nodes: list, .. } = &source else {
                return Err(MpiPlanError::Hosts(format!(
                    "{} names no nodes",
                    source.label()
                )));
            };
            let [n0, n1, ..] = list.as_slice() else {
                return Err(MpiPlanError::Hosts(format!(
                    "{}: one node, and the MPI tests run rank 0 and rank 1 on two nodes (allocate two or more: sbatch -N 2)",
                    source.label()
                )));
            };
            let mut local = r.clone();
            local.target.hosts = None;
            local.target.wait = None;
            Ok(Some(LauncherNodes {
                nodes: (n0.clone(), n1.clone()),
                request: local,
            }))
        }
        HostsArg::Addrs(_) => Err(MpiPlanError::Hosts(
            "MPI across hosts runs on netgap's testbed (--hosts @testbed) or on a cluster's nodes (--hosts @slurm, @hostfile:FILE), where mpirun starts the ranks; a list of agents names no place for them"
                .into(),
        )),
    }
}

/// The testbed hosts of rank 0 and rank 1 for `peer`, or `None` for this
/// machine (or a launcher's nodes); refuses hosts this process cannot
/// enter the namespaces of.
fn testbed_hosts(
    peer: &Peer,
    no_effect: &dyn Fn(&'static str, &'static str) -> MpiPlanError,
) -> Result<Option<(HostEntry, HostEntry)>, MpiPlanError> {
    match peer {
        Peer::Embedded { ipv6: false } => Ok(None),
        Peer::Embedded { ipv6: true } => Err(no_effect("-6", "the ranks meet over shared memory")),
        Peer::Remote { .. } => Ok(None),
        // The socket tests of the run go to the two hosts' agents; mpirun
        // starts the ranks in their namespaces itself, from the hosts
        // file's first two entries.
        Peer::Agents { hosts } => Ok(Some(testbed_pair(hosts)?)),
    }
}

/// The hosts of rank 0 and rank 1 on netgap's testbed: the first two
/// entries of a hosts file whose client host has a network namespace this
/// process may enter (root), the first host's namespace too.
fn testbed_pair(hosts: &HostsSource) -> Result<(HostEntry, HostEntry), MpiPlanError> {
    let pair = match hosts {
        HostsSource::File(f) => match f.hosts.as_slice() {
            [server, client, ..] if may_enter_netns() && client.netns.is_some() => {
                Some((server, client))
            }
            _ => None,
        },
        _ => None,
    };
    let Some((server, client)) = pair else {
        return Err(MpiPlanError::Hosts(
            "these hosts have no network namespaces this process can enter; MPI across hosts runs on netgap's testbed as root, or on a cluster's nodes with --hosts @slurm or @hostfile:FILE".into(),
        ));
    };
    if server.netns.is_none() {
        return Err(MpiPlanError::Hosts(format!(
            "host {} has no network namespace; MPI across hosts runs on netgap's testbed, or on a cluster's nodes with --hosts @slurm or @hostfile:FILE",
            server.name
        )));
    }
    Ok((server.clone(), client.clone()))
}

/// Whether this process may enter another network namespace (root).
fn may_enter_netns() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The BTL the ranks meet over: `--mpi-btl`, else shared memory (TCP
/// under the library, whose connections it carries); shared memory is
/// refused when the ranks run on two hosts (`across`) or under the
/// library.
fn local_btl(
    asked: Option<LocalBtl>,
    across: bool,
    library: Option<&Library>,
) -> Result<LocalBtl, MpiPlanError> {
    match (asked, across, library) {
        (Some(LocalBtl::Vader), true, _) => Err(MpiPlanError::Btl {
            btl: LocalBtl::Vader.name(),
            why: "shared memory does not cross hosts; across hosts the ranks use TCP over the hosts' network",
        }),
        (Some(LocalBtl::Vader), false, Some(_)) => Err(MpiPlanError::Btl {
            btl: LocalBtl::Vader.name(),
            why: "under the preload library the ranks use TCP, whose connections the library moves; Open MPI's own shared memory would bypass it",
        }),
        (Some(b), _, _) => Ok(b),
        (None, _, Some(_)) => Ok(LocalBtl::Tcp),
        (None, _, None) => Ok(LocalBtl::Vader),
    }
}

/// The preload library the ranks run under: `-t` naming one transport
/// that unmodified programs run over under the library (`shm`, `xdp`), in
/// a run of MPI tests alone (beside socket tests, `-t` is theirs). The
/// library has no completion modes of netgap's, so `--mode` is refused
/// with it.
fn library_choice(
    r: &RunRequest,
    alone: bool,
    no_effect: &dyn Fn(&'static str, &'static str) -> MpiPlanError,
) -> Result<Option<Library>, MpiPlanError> {
    let library = match r.transport.transports.as_slice() {
        [one] if alone => Library::for_transport(one),
        _ => None,
    };
    if library.is_some() && r.transport.modes != TransportChoice::default().modes {
        return Err(no_effect(
            "--mode",
            "under the preload library the ranks' connections wait as Open MPI makes them",
        ));
    }
    Ok(library)
}

/// Refuses a library that cannot carry the ranks where they run: a
/// relayed one (`xdp`) needs two testbed hosts, whose relays the job
/// starts (`testbed`); one on one host (`shm`) needs this machine (not
/// `across` hosts or nodes).
fn check_library_placement(
    library: &Library,
    testbed: bool,
    across: bool,
) -> Result<(), MpiPlanError> {
    let why = match (library.relayed, testbed, across) {
        (true, false, _) => "the ranks run under the library across two testbed hosts, through relays the job starts in their namespaces; give --hosts @testbed (a testbed made with --links 2)",
        (false, _, true) => "the library carries the ranks' connections over shared memory on this machine; across testbed hosts give -t xdp",
        _ => return Ok(()),
    };
    Err(MpiPlanError::Library {
        stack: library.stack.clone(),
        why,
    })
}

/// Every test at every size, in order, each spec checked.
fn mpi_points(
    tests: &[MpiTest],
    sizes: &[u64],
    settings: &Settings,
) -> Result<Vec<(MpiTest, PointSpec)>, MpiPlanError> {
    let mut points = Vec::new();
    for &test in tests {
        for &size in sizes {
            let spec = settings.point(test.record_test(), "mpi", Mode::Poll, size);
            spec.validate()
                .map_err(|e| MpiPlanError::Plan(PlanError::Spec(e)))?;
            points.push((test, spec));
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env() -> Vec<(String, String)> {
        Vec::new()
    }

    fn env(k: &str, v: &str) -> Vec<(String, String)> {
        vec![(k.to_string(), v.to_string())]
    }

    #[test]
    fn the_environment_cannot_set_what_netgap_sets() {
        let tests = [MpiTest::Latency];
        let r = req(&["mpi-latency"]);
        let none = MpiOptions::default();
        let e = MpiPlan::from_request(&r, &tests, &none, env("OMPI_MCA_btl", "tcp,self"), true)
            .expect_err("refused");
        let line = e.to_string();
        assert!(line.starts_with("OMPI_MCA_btl=tcp,self is set"), "{line}");
        assert!(
            line.contains("--mpi-btl tcp") && !line.contains('\n'),
            "{line}"
        );
        // btl_tcp_if_include is netgap's only when the ranks use TCP.
        let tcp = MpiOptions {
            btl: Some(LocalBtl::Tcp),
        };
        let lo = env("OMPI_MCA_btl_tcp_if_include", "eth0");
        assert!(MpiPlan::from_request(&r, &tests, &none, lo.clone(), true).is_ok());
        let e = MpiPlan::from_request(&r, &tests, &tcp, lo, true).expect_err("refused");
        assert!(e.to_string().contains("btl_tcp_if_include"), "{e}");
        // Parameters netgap leaves alone are Open MPI's to read.
        let y = env("OMPI_MCA_mpi_yield_when_idle", "1");
        let p = MpiPlan::from_request(&r, &tests, &tcp, y, true).expect("plan");
        assert_eq!(p.local_btl, LocalBtl::Tcp);
    }

    #[test]
    fn a_launchers_first_two_nodes_hold_the_ranks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("hosts");
        std::fs::write(&file, "127.0.0.1 slots=1\n127.0.0.2\n127.0.0.3\n").expect("write");
        let tests = [MpiTest::Latency];
        let none = MpiOptions::default();
        let mut r = req(&["mpi-latency"]);
        r.target.hosts =
            Some(HostsArg::parse(&format!("@hostfile:{}:7300", file.display())).expect("parses"));
        r.target.wait = Some(std::time::Duration::from_secs(5));
        let p = MpiPlan::from_request(&r, &tests, &none, no_env(), true).expect("plan");
        let (n0, n1) = p.nodes.expect("nodes");
        assert_eq!(
            (n0.name.as_str(), n1.name.as_str()),
            ("127.0.0.1", "127.0.0.2")
        );
        assert!(p.hosts.is_none());
        // Shared memory does not cross nodes; the launch agent is the
        // user's to set.
        let vader = MpiOptions {
            btl: Some(LocalBtl::Vader),
        };
        assert!(MpiPlan::from_request(&r, &tests, &vader, no_env(), true).is_err());
        let rsh = env("OMPI_MCA_plm_rsh_agent", "/usr/bin/ssh");
        assert!(MpiPlan::from_request(&r, &tests, &none, rsh, true).is_ok());
        let clash = env("OMPI_MCA_btl", "tcp,self");
        assert!(MpiPlan::from_request(&r, &tests, &none, clash, true).is_err());

        std::fs::write(&file, "127.0.0.1\n").expect("write");
        let e = MpiPlan::from_request(&r, &tests, &none, no_env(), true).expect_err("one node");
        assert!(e.to_string().contains("one node"), "{e}");
        r.target.hosts = Some(HostsArg::parse("127.0.0.1,127.0.0.2").expect("parses"));
        r.target.wait = None;
        let e = MpiPlan::from_request(&r, &tests, &none, no_env(), true).expect_err("agents");
        assert!(e.to_string().contains("@slurm"), "{e}");
    }

    fn req(tests: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(tests);
        r.method.sizes = Some(vec![1, 1024]);
        r
    }

    #[test]
    fn mpi_tests_are_split_out_and_planned_as_mpi_points() {
        let names: Vec<String> = ["pingpong", "mpi-latency", "mpi-bw"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (mpi, rest) = split_tests(&names);
        assert_eq!(mpi, vec![MpiTest::Latency, MpiTest::Bandwidth]);
        assert_eq!(rest, vec!["pingpong".to_string()]);
        let p = MpiPlan::from_request(
            &req(&["mpi-latency", "mpi-bw"]),
            &mpi,
            &MpiOptions::default(),
            no_env(),
            true,
        )
        .expect("plan");
        assert_eq!(p.points.len(), 4);
        assert!(p.points.iter().all(|(_, s)| s.transport == "mpi"));
        assert_eq!(p.points[0].1.test, "pingpong");
        assert_eq!(p.points[3].1.test, "stream");
        assert!(p.hosts.is_none());
        let rank = p.rank_plan();
        assert_eq!(rank.points.len(), 4);
        assert_eq!(rank.check(), Ok(()));
    }

    #[test]
    fn the_ranks_run_under_the_library_with_t_shm_or_xdp_alone() {
        let tests = [MpiTest::Latency];
        let none = MpiOptions::default();
        let mut r = req(&["mpi-latency"]);
        r.transport.transports = vec!["shm".into()];
        let p = MpiPlan::from_request(&r, &tests, &none, no_env(), true).expect("plan");
        let library = p.library.expect("under the library");
        assert_eq!((library.stack.as_str(), library.relayed), ("shm", false));
        // Its connections are TCP's: the tcp BTL, never Open MPI's own
        // shared memory.
        assert_eq!(p.local_btl, LocalBtl::Tcp);
        let vader = MpiOptions {
            btl: Some(LocalBtl::Vader),
        };
        let e = MpiPlan::from_request(&r, &tests, &vader, no_env(), true).expect_err("vader");
        assert!(e.to_string().contains("bypass"), "{e}");
        // Beside socket tests, -t is theirs.
        let p = MpiPlan::from_request(&r, &tests, &none, no_env(), false).expect("plan");
        assert!(p.library.is_none());
        // The library has no modes of netgap's.
        r.transport.modes = vec![Mode::Poll];
        let e = MpiPlan::from_request(&r, &tests, &none, no_env(), true).expect_err("--mode");
        assert!(e.to_string().starts_with("--mode has no effect"), "{e}");
        // xdp goes through relays on two testbed hosts.
        let mut r = req(&["mpi-latency"]);
        r.transport.transports = vec!["xdp".into()];
        if Library::for_transport("xdp").is_some() {
            let e = MpiPlan::from_request(&r, &tests, &none, no_env(), true).expect_err("one host");
            let line = e.to_string();
            assert!(
                line.starts_with("-t xdp: ") && line.contains("--hosts @testbed"),
                "{line}"
            );
        }
    }

    #[test]
    fn flags_that_do_not_apply_are_refused_in_one_line() {
        let tests = [MpiTest::Latency];
        let mut r = req(&["mpi-latency"]);
        r.method.verify = true;
        let e = MpiPlan::from_request(&r, &tests, &MpiOptions::default(), no_env(), true)
            .expect_err("refused");
        assert!(e.to_string().starts_with("--verify has no effect"), "{e}");
        let mut r = req(&["mpi-latency"]);
        r.method.buffer.offset_bytes = Some(16);
        let e = MpiPlan::from_request(&r, &tests, &MpiOptions::default(), no_env(), true)
            .expect_err("refused");
        assert!(
            e.to_string().starts_with("--align/--offset has no effect"),
            "{e}"
        );
        let mut r = req(&["mpi-latency"]);
        r.method.sizes = Some(vec![64 << 20]);
        let e = MpiPlan::from_request(&r, &tests, &MpiOptions::default(), no_env(), true)
            .expect_err("refused");
        assert!(e.to_string().contains("limit"), "{e}");
        let mut r = req(&["mpi-latency"]);
        r.transport.transports = vec!["unix".into()];
        assert!(MpiPlan::from_request(&r, &tests, &MpiOptions::default(), no_env(), true).is_err());
        // Beside socket tests, -t chooses their transports.
        assert!(MpiPlan::from_request(&r, &tests, &MpiOptions::default(), no_env(), false).is_ok());
        let mut r = req(&["mpi-latency"]);
        r.method.reps = Some(0);
        let e = MpiPlan::from_request(&r, &tests, &MpiOptions::default(), no_env(), true)
            .expect_err("refused");
        assert!(e.to_string().contains("--reps"), "{e}");
    }
}
