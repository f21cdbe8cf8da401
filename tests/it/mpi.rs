//! The MPI tests (`--features mpi`): real Open MPI ranks started by
//! mpirun, on this machine over shared memory and between two testbed
//! namespaces over the testbed's link, beside netgap's own sockets in the
//! same run. Checks the records' structure, never their speed.

use crate::common;

use crate::common::testbed::Testbed;
use crate::common::{
    f, fails_with_one_line, has_whole_record, netgap, ok, one_line_error, read_records,
    system_ready,
};
use serde_json::Value;
use std::process::Command;

fn stack_options(r: &Value) -> Vec<String> {
    r["stack"]["options"]
        .as_array()
        .expect("stack options")
        .iter()
        .map(|o| o.as_str().expect("string").to_string())
        .collect()
}

/// What every MPI record holds, whatever it ran over.
fn check_mpi_record(r: &Value, reps: usize) {
    assert_eq!(r["transport"], "mpi");
    assert_eq!(r["mode"], "poll");
    let test = r["test"].as_str().expect("test");
    let metric = if test == "pingpong" {
        "latency_us"
    } else {
        "bandwidth_gbps"
    };
    assert_eq!(r["metric"], metric, "{r}");
    assert!(f(&r["value"]) > 0.0);
    let stats = &r["stats"];
    assert_eq!(stats["reps"].as_array().expect("reps").len(), reps);
    assert!(f(&stats["min"]) <= f(&r["value"]) && f(&r["value"]) <= f(&stats["max"]));
    assert!(f(&stats["ci95_low"]) <= f(&stats["ci95_high"]));
    if test == "pingpong" {
        let p = &r["percentiles"];
        let ordered = ["p50", "p90", "p99", "p999", "max"]
            .windows(2)
            .all(|w| f(&p[w[0]]) <= f(&p[w[1]]));
        assert!(ordered, "{p}");
        let b = &r["bytes"];
        assert_eq!(b["client_tx"], b["client_rx"]);
    } else {
        assert!(r["percentiles"].is_null());
    }
    // Both ranks' CPU over the measured repetitions.
    for end in ["local", "remote"] {
        let c = &r["cpu"][end];
        assert!(f(&c["process_percent"]) >= 0.0, "{r}");
        assert!(c["wall_ns"].as_u64().expect("wall") > 0, "{r}");
    }
    if test != "pingpong" {
        assert!(f(&r["service_demand_us_per_kib"]["local"]) >= 0.0, "{r}");
    }
    // Fixed iterations: every repetition ran them, after a warm-up.
    assert_eq!(r["iterations_per_rep"], 20);
    assert!(r["warmup_iterations"].as_u64().expect("warmup") > 0);
    let size = r["size_bytes"].as_u64().expect("size");
    let windows = if test == "pingpong" { 1 } else { 64 };
    assert_eq!(
        r["bytes"]["client_tx"].as_u64(),
        Some(size * 20 * windows * reps as u64)
    );
    let opts = stack_options(r);
    assert!(
        opts.iter().any(|o| o.starts_with("mpi_library=Open MPI")),
        "{opts:?}"
    );
    assert!(
        opts.iter().any(|o| o.starts_with("mpi_standard=")),
        "{opts:?}"
    );
}

#[test]
fn mpi_tests_run_on_this_machine_over_shared_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    ok(netgap()
        .args(["run", "mpi-latency,mpi-bw,mpi-bibw", "-s", "1,4K"])
        .args(["--reps", "3", "--iterations", "20", "--json"])
        .arg(&json)
        .output()
        .expect("runs"));
    let records = read_records(&json);
    let tests: Vec<(&str, u64)> = records
        .iter()
        .map(|r| {
            (
                r["test"].as_str().expect("test"),
                r["size_bytes"].as_u64().expect("size"),
            )
        })
        .collect();
    assert_eq!(
        tests,
        [
            ("pingpong", 1),
            ("pingpong", 4096),
            ("stream", 1),
            ("stream", 4096),
            ("bibw", 1),
            ("bibw", 4096)
        ]
    );
    for r in &records {
        check_mpi_record(r, 3);
        // What Open MPI reported it used, and nothing it did not.
        let opts = stack_options(r);
        assert!(opts.contains(&"btl=vader".to_string()), "{opts:?}");
        assert!(opts.contains(&"pml=ob1".to_string()), "{opts:?}");
        assert!(!opts.iter().any(|o| o.starts_with("btl_if=")), "{opts:?}");
        assert_eq!(r["stack"]["path"]["kind"], "shared-memory");
    }
    // bibw moves as much each way.
    let b = &records[5]["bytes"];
    assert_eq!(b["client_tx"], b["client_rx"]);
}

/// `--mpi-btl tcp`: the ranks on this machine meet over TCP on loopback,
/// the path the socket tests take, and the record says so.
#[test]
fn mpi_btl_tcp_runs_the_ranks_over_loopback_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    ok(netgap()
        .args([
            "run",
            "pingpong,mpi-latency,mpi-bw",
            "-t",
            "tcp",
            "-s",
            "1K",
        ])
        .args(["--reps", "2", "--iterations", "20", "--mpi-btl", "tcp"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("runs"));
    let records = read_records(&json);
    assert_eq!(records.len(), 3);
    let (tcp, mpi): (Vec<&Value>, Vec<&Value>) =
        records.iter().partition(|r| r["transport"] == "tcp");
    for r in &mpi {
        check_mpi_record(r, 2);
        let opts = stack_options(r);
        for want in ["btl=tcp", "btl_if=lo", "pml=ob1"] {
            assert!(opts.contains(&want.to_string()), "{want}: {opts:?}");
        }
        assert_eq!(r["stack"]["path"]["kind"], "loopback");
        assert_eq!(r["stack"]["path"]["kind"], tcp[0]["stack"]["path"]["kind"]);
    }
    fails_with_one_line(
        &["run", "pingpong", "--mpi-btl", "tcp"],
        "--mpi-btl has no effect without an MPI test",
    );
    fails_with_one_line(&["run", "mpi-bw", "--mpi-btl", "ib"], "choose vader or tcp");
}

/// An Open MPI parameter netgap sets itself cannot also come from the
/// environment (mpirun's --mca would silently win): refused in one line
/// naming it, before any job starts.
#[test]
fn an_environment_parameter_netgap_sets_is_refused_in_one_line() {
    let out = netgap()
        .args(["run", "mpi-latency", "-s", "1", "--reps", "2"])
        .env("OMPI_MCA_btl", "tcp,self")
        .output()
        .expect("runs");
    let stderr = one_line_error(&out, "OMPI_MCA_btl", "OMPI_MCA_btl=tcp,self is set");
    assert!(stderr.contains("--mpi-btl tcp"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing was measured");
}

/// Two ranks confined to one core spin against each other: the run warns
/// with the remedy, and with that remedy in the environment (honoured and
/// named in the record) it does not.
#[test]
fn spinning_ranks_on_one_core_are_warned_about_with_the_remedy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |json: &std::path::Path, env: Option<(&str, &str)>| {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0"]).arg(netgap().get_program());
        cmd.args(["run", "mpi-latency", "-s", "1", "--reps", "2"])
            .args(["--iterations", "20", "--json"])
            .arg(json);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("taskset runs (util-linux)");
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8_lossy(&out.stderr).into_owned(),
            read_records(json),
        )
    };
    let (stderr, records) = run(&dir.path().join("spin.jsonl"), None);
    let warning = "2 MPI ranks spin on 1 core available to them";
    assert!(stderr.contains(warning), "{stderr}");
    assert!(
        stderr.contains("OMPI_MCA_mpi_yield_when_idle=1"),
        "{stderr}"
    );
    let recorded = records[0]["warnings"].as_array().expect("warnings");
    assert!(
        recorded
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains(warning))),
        "{recorded:?}"
    );
    let (stderr, records) = run(
        &dir.path().join("yield.jsonl"),
        Some(("OMPI_MCA_mpi_yield_when_idle", "1")),
    );
    assert!(!stderr.contains(warning), "{stderr}");
    let opts = stack_options(&records[0]);
    assert!(
        opts.contains(&"mca_mpi_yield_when_idle=1".to_string()),
        "{opts:?}"
    );
}

#[test]
fn flags_that_mean_nothing_to_mpi_are_refused_in_one_line() {
    fails_with_one_line(
        &["run", "mpi-latency", "--verify"],
        "--verify has no effect",
    );
    fails_with_one_line(&["run", "mpi-bw", "--peer", "127.0.0.1"], "--peer");
    fails_with_one_line(&["run", "mpi-bw", "-s", "64M"], "limit");
    fails_with_one_line(&["run", "mpi-bw", "-t", "unix"], "-t/--mode");
}

#[test]
fn list_says_mpi_is_built_in() {
    let out = ok(netgap().arg("list").output().expect("runs"));
    assert!(
        out.contains("mpi-latency") && out.contains("mpi-bibw"),
        "{out}"
    );
    assert!(out.contains("MPI: built in"), "{out}");
}

/// Processes in network namespace `ns`.
fn pids_in(ns: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .expect("ip netns pids");
    let mut pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    pids.sort();
    pids
}

/// Between two testbed namespaces, in one run: netgap's tcp pingpong,
/// then MPI latency and bandwidth over Open MPI's TCP transport pinned to
/// the testbed's interface.
#[test]
fn mpi_runs_between_two_testbed_hosts_beside_raw_sockets() {
    if !system_ready("mpi_runs_between_two_testbed_hosts_beside_raw_sockets") {
        return;
    }
    let (tb, _) = Testbed::up("mpipair", &["--hosts", "2"]);
    let hosts = tb.hosts();
    let before = (pids_in(&tb.ns("h1")), pids_in(&tb.ns("h2")));
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let records = tb.run(
        "pingpong,mpi-latency,mpi-bw",
        &["-s", "1,64K", "--reps", "2", "--iterations", "20"],
        &json,
    );
    assert_eq!(records.len(), 6, "{records:?}");
    let (tcp, mpi): (Vec<&Value>, Vec<&Value>) =
        records.iter().partition(|r| r["transport"] == "tcp");
    assert_eq!(tcp.len(), 2);
    assert_eq!(mpi.len(), 4);
    for r in &mpi {
        check_mpi_record(r, 2);
        let opts = stack_options(r);
        assert!(opts.contains(&"btl=tcp".to_string()), "{opts:?}");
        // The interface MPI was pinned to is the one holding each host's
        // testbed address.
        let iface = opts
            .iter()
            .find_map(|o| o.strip_prefix("btl_if="))
            .expect("btl_if");
        for (host, end) in [(&hosts.hosts[0], "host"), (&hosts.hosts[1], "peer_host")] {
            assert_eq!(r[end]["interface"], iface, "{end}");
            let shown = ok(Command::new("ip")
                .args(["netns", "exec", host.netns.as_deref().expect("netns")])
                .args(["ip", "-o", "addr", "show", "dev", iface])
                .output()
                .expect("ip addr"));
            assert!(shown.contains(&host.address.to_string()), "{shown}");
        }
        let path = &r["stack"]["path"];
        assert_eq!(path["kind"], "testbed");
        assert_eq!(path["topology"], "switch");
        assert_eq!(path["mtu_bytes"], 1500);
        let peer = r["options"]["peer"].as_str().expect("peer");
        assert!(peer.contains("h1") && peer.contains("h2"), "{peer}");
        // The hosts the ranks ran on, by their testbed names.
        assert_eq!(r["host"]["hostname"], "h1", "{r}");
        assert_eq!(r["peer_host"]["hostname"], "h2", "{r}");
        assert!(opts.contains(&"pml=ob1".to_string()), "{opts:?}");
    }
    // Sockets and MPI ran over the same path.
    assert_eq!(tcp[0]["stack"]["path"], mpi[0]["stack"]["path"]);
    // mpirun, its daemon and the ranks are gone.
    let after = (pids_in(&tb.ns("h1")), pids_in(&tb.ns("h2")));
    assert_eq!(before, after, "processes left in the testbed");
    // Also when the coordinator is killed: mpirun on h1 and the daemon and
    // rank it started on h2 go with it.
    killed_coordinator_leaves_nothing(
        &["--hosts", &tb.hosts_arg()],
        &dir.path().join("killed.jsonl"),
    );
    let after = (pids_in(&tb.ns("h1")), pids_in(&tb.ns("h2")));
    assert_eq!(before, after, "processes left in the testbed");
    tb.down();
    tb.assert_gone();
}

#[test]
fn mpi_across_hosts_needs_a_testbed() {
    fails_with_one_line(
        &["run", "mpi-latency", "--hosts", "127.0.0.1,127.0.0.2"],
        "netgap's testbed",
    );
}

/// The MPI ranks among `procs` (not mpirun or unshare naming them).
fn ranks(procs: &[common::procs::Proc]) -> Vec<u32> {
    procs
        .iter()
        .filter(|(_, _, c)| c.contains(" mpi-rank ") && !c.contains("mpirun"))
        .map(|(p, _, _)| *p)
        .collect()
}

/// Waits until the run `pid` has written a first record to `json`; the
/// processes it started by then.
fn tree_once_measuring(pid: u32, json: &std::path::Path) -> Vec<common::procs::Proc> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !has_whole_record(json) {
        assert!(std::time::Instant::now() < deadline, "no first record");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    common::procs::descendants(pid)
}

/// A rank that dies mid-run ends the run within seconds with one line that
/// names the point; the points measured before are in the results file.
#[test]
fn a_rank_that_dies_ends_the_run_naming_the_point_and_keeping_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let run = netgap()
        .args([
            "run",
            "mpi-latency",
            "-s",
            "1,2,3",
            "--reps",
            "10",
            "--rep-time",
            "200ms",
        ])
        .arg("--json")
        .arg(&json)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let tree = tree_once_measuring(run.id(), &json);
    let ranks = ranks(&tree);
    assert_eq!(ranks.len(), 2, "two ranks under the run: {tree:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(ranks[1]).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill a rank");
    let killed = std::time::Instant::now();
    let out = run.wait_with_output().expect("run ends");
    assert!(killed.elapsed() < std::time::Duration::from_secs(30));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains("mpi-latency (2 bytes)"), "{stderr}");
    assert!(last.contains("points measured before are in"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(read_records(&json).len(), 1);
}

/// With --conditions, the MPI tests run under each condition in turn after
/// the sockets' interleaved rounds, each record naming its condition, and
/// the testbed goes back to the conditions it had.
#[test]
fn mpi_runs_under_each_condition_beside_the_sockets() {
    if !system_ready("mpi_runs_under_each_condition_beside_the_sockets") {
        return;
    }
    let (tb, _) = Testbed::up("mpicond", &["--hosts", "2"]);
    let before = tb.hosts().conditions;
    // Every link end's offloads as the kernel set them (`ethtool -k`): the
    // run must leave each feature as it found it, not only the hosts file.
    let offloads = || -> Vec<String> {
        [("h1", "eth0"), ("h2", "eth0"), ("sw", "h1"), ("sw", "h2")]
            .iter()
            .map(|(host, dev)| {
                let out = std::process::Command::new("ip")
                    .args(["netns", "exec", &tb.ns(host), "ethtool", "-k", dev])
                    .output()
                    .expect("ethtool runs (apt-get install ethtool)");
                assert!(out.status.success(), "ethtool -k {dev}: {out:?}");
                String::from_utf8_lossy(&out.stdout).into_owned()
            })
            .collect()
    };
    let kernel_offloads = offloads();
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let records = tb.run(
        "pingpong,mpi-latency",
        &[
            "-s",
            "1",
            "--reps",
            "2",
            "--iterations",
            "20",
            "--conditions",
            "offload=on,off",
        ],
        &json,
    );
    let seen: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["transport"].as_str().expect("transport"),
                r["stack"]["path"]["offload"].as_str().expect("offload"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("tcp", "on"), ("tcp", "off"), ("mpi", "on"), ("mpi", "off")]
    );
    for r in records.iter().filter(|r| r["transport"] == "mpi") {
        check_mpi_record(r, 2);
    }
    assert_eq!(tb.hosts().conditions, before, "conditions restored");
    assert_eq!(
        offloads(),
        kernel_offloads,
        "each offload as the kernel had it"
    );
    tb.down();
}

/// Starts `netgap run mpi-latency` with `flags` writing to `json`, waits
/// until it measured a point, kills it with SIGKILL, and checks that within
/// 2 s nothing it started (mpirun, its daemons, the ranks) runs.
fn killed_coordinator_leaves_nothing(flags: &[&str], json: &std::path::Path) {
    let run = common::procs::Reaped(
        netgap()
            .args(["run", "mpi-latency", "-s", "1,2,3,4"])
            .args(["--reps", "10", "--rep-time", "500ms"])
            .args(flags)
            .arg("--json")
            .arg(json)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("runs"),
    );
    let mut run = run;
    let tree = tree_once_measuring(run.0.id(), json);
    assert_eq!(ranks(&tree).len(), 2, "two ranks under the run: {tree:?}");
    assert!(
        tree.iter().any(|(_, _, c)| c.starts_with("mpirun")),
        "{tree:?}"
    );
    let pid = run.0.id();
    run.0.kill().expect("SIGKILL the coordinator");
    let _ = run.0.wait();
    let left = common::gone_within(std::time::Duration::from_secs(2), || {
        common::procs::still_running(&tree)
    });
    // The job's own directory, which its killed coordinator could not
    // remove (the next job on the host would).
    for base in ["/dev/shm".into(), std::env::temp_dir()] {
        for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("netgap-mpi-{pid}-")) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    assert_eq!(left, Ok(()), "processes outlived their coordinator");
}

/// A coordinator killed mid-run takes mpirun and both ranks with it.
#[test]
fn a_killed_coordinator_takes_its_mpi_job_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    killed_coordinator_leaves_nothing(&[], &dir.path().join("r.jsonl"));
}

/// An mpirun that never gets the ranks started is stopped after the
/// start-up wait, and a second one runs the points; every record says the
/// first was stopped, and nothing of the first is left.
#[test]
fn a_start_that_stalls_is_stopped_and_launched_once_more() {
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
        .expect("mpirun on the PATH (apt-get install openmpi-bin)");
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    let mark = dir.path().join("stalled-once");
    // The first launch sleeps where mpirun would start the ranks; the
    // second is the real mpirun.
    let script = format!(
        "#!/bin/sh\nif [ ! -e '{}' ]; then : > '{}'; exec sleep 600; fi\nexec '{}' \"$@\"\n",
        mark.display(),
        mark.display(),
        real.display()
    );
    let fake = bin.join("mpirun");
    std::fs::write(&fake, script).expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let json = dir.path().join("r.jsonl");
    let t0 = std::time::Instant::now();
    ok(netgap()
        .env("PATH", path)
        .args(["run", "mpi-latency", "-s", "1", "--reps", "2"])
        .args(["--iterations", "20", "--json"])
        .arg(&json)
        .output()
        .expect("runs"));
    assert!(mark.exists(), "the first launch ran the stalling mpirun");
    assert!(
        t0.elapsed() >= std::time::Duration::from_secs(20),
        "waited for the start"
    );
    let records = read_records(&json);
    assert_eq!(records.len(), 1, "{records:?}");
    let warned = common::warnings(&records[0]);
    assert!(
        warned
            .iter()
            .any(|w| w.contains("never started the ranks") && w.contains("0 of 2 ranks")),
        "{warned:?}"
    );
    // The stalled launch's sleep went with its PID namespace.
    let left = Command::new("pgrep")
        .args(["-x", "-f", "sleep 600"])
        .output()
        .expect("pgrep");
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "{left:?}"
    );
}
