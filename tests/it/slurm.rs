//! netgap under a real Slurm cluster and under mpirun, end to end:
//! `bench/slurm-cluster.sh` builds a switch testbed, munge, slurmctld and a
//! slurmd in every testbed host's namespaces (its own UTS namespace named
//! after the node), waits for every node to be idle, and runs a batch job
//! whose srun starts `netgap serve --bind auto` on every node and whose
//! `netgap run --hosts @slurm:PORT` measures multistream, hotspot, fanin and
//! gather across them, and `netgap study 003 --quick --hosts @slurm:PORT
//! --key KEY` measures figures 2 and 3 (NetPIPE sweeps over kernel TCP)
//! with both roles of each point on the first two nodes' agents. Built
//! with xdp, the job also runs pingpong and stream over xdp and tcp with
//! both roles on the first two nodes' agents, whose control connections
//! take the eth0 the xdp flows take (`--xdp`). Then the same with mpirun
//! and a hostfile. This test
//! checks what the script leaves: records naming the nodes, link counters
//! showing the data crossed each node's testbed link, no agent after the
//! job, and nothing at all after the script, on success and on failure.
//!
//! Without root, namespaces, slurm-wlm or munge it says why and passes,
//! unless NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI).

use crate::common::{self, read_records, system_ready, u};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The programs the cluster needs.
const SLURM_PROGRAMS: [&str; 7] = [
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "sinfo",
    "scontrol",
];

fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/slurm-cluster.sh")
}

/// The script on testbed `name` with agents on `port`, its temporary
/// directory under `tmp`; what it printed and how it ended.
fn run_script(name: &str, port: u16, tmp: &Path, out: &Path, flags: &[&str]) -> Output {
    Command::new("bash")
        .arg(script())
        .args(["--hosts", "3", "--name", name, "--port", &port.to_string()])
        .arg("--netgap")
        .arg(common::netgap_path())
        .arg("--out")
        .arg(out)
        .args(flags)
        .env("TMPDIR", tmp)
        .output()
        .expect("bench/slurm-cluster.sh runs")
}

fn show(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Bytes sent plus received on `eth0` of each host, from a file of `ip -s
/// -j link` arrays, one host a line, in host order (h1, h2, ...).
fn link_bytes(path: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).expect("link counters");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).expect("ip -j output");
            let s = &v[0]["stats64"];
            (
                format!("h{}", i + 1),
                u(&s["tx"]["bytes"]) + u(&s["rx"]["bytes"]),
            )
        })
        .collect()
}

/// Checks the records of one run on nodes h1..h3 named by `peer`, and that
/// each node's link carried at least the bytes its flows moved.
fn check_run(out: &Path, run: &str, peer: &str) {
    let records = read_records(&out.join(format!("{run}.jsonl")));
    let tests: Vec<&str> = records
        .iter()
        .map(|r| r["test"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        tests,
        ["multistream", "hotspot", "fanin", "gather"],
        "{run}"
    );
    let nodes = ["h1", "h2", "h3"];
    let mut moved: BTreeMap<String, u64> = BTreeMap::new();
    for r in &records {
        let test = r["test"].as_str().unwrap_or("");
        assert_eq!(r["options"]["peer"], peer, "{run} {test}");
        let hosts = r["hosts_cpu"].as_array().expect("hosts_cpu");
        // The first node serves (gather: collects from the others' gmonds).
        let first = if test == "gather" { "client" } else { "server" };
        assert!(
            hosts
                .iter()
                .any(|h| h["host"] == "h1" && h["role"] == first),
            "{run} {test}: {hosts:?}"
        );
        for h in hosts {
            let name = h["host"].as_str().unwrap_or("");
            assert!(nodes.contains(&name), "{run} {test}: host {name}");
            // The agent ran in the node's own UTS namespace.
            assert_eq!(h["facts"]["hostname"], name, "{run} {test}");
        }
        for f in r["flows"].as_array().expect("flows") {
            let host = f["host"].as_str().unwrap_or("");
            assert!(nodes.contains(&host), "{run} {test}: flow {f}");
            // Each flow is between h1 and another node: it crossed h1's
            // link and its own host's.
            let bytes = u(&f["bytes_tx"]).max(u(&f["bytes_rx"]));
            *moved.entry(host.to_string()).or_default() += bytes;
            if host != "h1" {
                *moved.entry("h1".to_string()).or_default() += bytes;
            }
        }
    }
    assert!(moved.get("h2").is_some_and(|&b| b > 0), "{run}: {moved:?}");
    let before = link_bytes(&out.join(format!("links-{run}-before.json")));
    let after = link_bytes(&out.join(format!("links-{run}-after.json")));
    for (host, bytes) in &moved {
        let crossed = after[host] - before[host];
        assert!(
            crossed >= *bytes,
            "{run}: {host}'s testbed link carried {crossed} bytes, its flows moved {bytes}"
        );
    }
}

/// The MPI tests' records of one run: rank 0 on h1, rank 1 on h2, over
/// TCP.
fn check_mpi(out: &Path, run: &str) {
    let records = read_records(&out.join(format!("{run}.jsonl")));
    let tests: Vec<&str> = records
        .iter()
        .map(|r| r["test"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(tests, ["pingpong", "pingpong", "stream", "stream"], "{run}");
    for r in &records {
        assert_eq!(r["transport"], "mpi", "{run}");
        assert_eq!(r["host"]["hostname"], "h1", "{run}");
        assert_eq!(r["peer_host"]["hostname"], "h2", "{run}");
        assert_eq!(
            r["options"]["peer"], "mpirun: h1 (rank 0), h2 (rank 1)",
            "{run}"
        );
        let stack = r["stack"]["options"].as_array().expect("stack options");
        assert!(stack.iter().any(|o| o == "btl=tcp"), "{run}: {stack:?}");
        assert!(common::f(&r["value"]) > 0.0, "{run}: {r}");
    }
}

/// The study the job ran: its point-to-point records, each with h2's agent
/// as the client and h1's as the server and bytes both ways, and its
/// report with the claims judged.
fn check_study(out: &Path) {
    let dir = out.join("study");
    let records = read_records(&dir.join("netgap-study-003.jsonl"));
    assert!(!records.is_empty(), "the study measured nothing");
    for label in ["study 003 figure 2", "study 003 figure 3"] {
        assert!(
            records.iter().any(|r| r["stack"]["label"] == label),
            "no record of {label}"
        );
    }
    for r in &records {
        assert_eq!(r["test"], "sweep", "{r}");
        let test = r["test"].as_str().unwrap_or("");
        assert_eq!(r["host"]["hostname"], "h2", "study {test}: {}", r["host"]);
        assert_eq!(r["peer_host"]["hostname"], "h1", "study {test}");
        assert_eq!(r["options"]["peer"], "agents: slurm:h1,h2", "study {test}");
        let b = &r["bytes"];
        assert!(
            u(&b["client_tx"]) > 0 && u(&b["server_tx"]) > 0,
            "{test}: {b}"
        );
        assert_eq!(u(&b["client_tx"]), u(&b["server_rx"]), "{test}: {b}");
        assert_eq!(u(&b["server_tx"]), u(&b["client_rx"]), "{test}: {b}");
    }
    let report = std::fs::read_to_string(dir.join("netgap-study-003.html")).expect("report");
    assert!(
        report.contains("<table class=\"claims"),
        "the report has no claim table"
    );
}

/// The point-to-point run over xdp and tcp through the first two nodes'
/// agents (`--xdp`): every point measured, with h2's agent as the client
/// and h1's as the server, bytes both ways, and a physics section (so the
/// record was judged against its path).
fn check_xdp(out: &Path) {
    let records = read_records(&out.join("slurm-xdp.jsonl"));
    let points: Vec<String> = records
        .iter()
        .map(|r| format!("{} {} {}", r["test"], r["transport"], r["size_bytes"]))
        .collect();
    assert_eq!(records.len(), 8, "{points:?}");
    for test in ["pingpong", "stream"] {
        assert_eq!(
            records
                .iter()
                .filter(|r| r["test"] == test && r["transport"] == "xdp")
                .count(),
            2,
            "{points:?}"
        );
    }
    for (r, point) in records.iter().zip(&points) {
        assert_eq!(r["host"]["hostname"], "h2", "{point}: {}", r["host"]);
        assert_eq!(r["peer_host"]["hostname"], "h1", "{point}");
        assert_eq!(r["host"]["interface"], "eth0", "{point}");
        assert_eq!(r["options"]["peer"], "agents: slurm:h1,h2", "{point}");
        assert!(r["physics"].is_object(), "{point}: {r}");
        let b = &r["bytes"];
        assert!(
            u(&b["client_tx"]) > 0 && u(&b["server_tx"]) > 0,
            "{point}: {b}"
        );
        assert_eq!(u(&b["client_tx"]), u(&b["server_rx"]), "{point}: {b}");
        assert_eq!(u(&b["server_tx"]), u(&b["client_rx"]), "{point}: {b}");
        assert!(common::f(&r["value"]) > 0.0, "{point}: {r}");
    }
}

/// Nothing of the script is left: testbed namespaces, /etc/netns files,
/// its temporary directory, daemons, agents.
fn assert_all_gone(name: &str, port: u16, tmp: &Path) {
    let prefix = format!("ngtb-{name}-");
    let list = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns")
            .stdout,
    )
    .into_owned();
    assert!(!list.contains(&prefix), "namespaces left: {list}");
    for i in 1..=3 {
        let etc = PathBuf::from(format!("/etc/netns/{prefix}h{i}"));
        assert!(!etc.exists(), "{} left", etc.display());
    }
    let left: Vec<_> = std::fs::read_dir(tmp).expect("tmp").flatten().collect();
    assert!(left.is_empty(), "left in the temporary directory: {left:?}");
    for pattern in [tmp.display().to_string(), format!("--port {port} --key")] {
        let p = Command::new("pgrep")
            .args(["-af", &pattern])
            .output()
            .expect("pgrep");
        assert!(
            p.stdout.is_empty(),
            "processes left: {}",
            String::from_utf8_lossy(&p.stdout)
        );
    }
}

#[test]
fn netgap_runs_on_a_real_slurm_cluster_and_under_mpirun() {
    const TEST: &str = "netgap_runs_on_a_real_slurm_cluster_and_under_mpirun";
    if !system_ready(TEST) {
        return;
    }
    if let Some(p) = SLURM_PROGRAMS.iter().find(|p| !installed(p)) {
        common::skip(
            TEST,
            &format!("{p} is not installed (apt-get install slurm-wlm munge)"),
        );
        return;
    }
    let mut flags = Vec::new();
    // Built with MPI: the MPI tests run on the allocation's first two
    // nodes too, and on the hostfile's.
    let mpi = cfg!(feature = "mpi");
    if mpi {
        flags.push("--mpi");
    }
    // Built with xdp: user-level networking through the agents too.
    let xdp = cfg!(feature = "xdp");
    if xdp {
        flags.push("--xdp");
    }
    if !installed("mpirun") {
        common::skip(
            &format!("{TEST} (its mpirun part)"),
            "mpirun is not installed (apt-get install openmpi-bin)",
        );
        flags.retain(|f| *f == "--xdp");
        flags.push("--no-mpirun");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (tmp, out) = (dir.path().join("tmp"), dir.path().join("out"));
    std::fs::create_dir(&tmp).expect("tmp");
    let (name, port) = ("tslurm", 7191);
    let t0 = std::time::Instant::now();
    let done = run_script(name, port, &tmp, &out, &flags);
    assert!(done.status.success(), "{}", show(&done));
    let said = String::from_utf8_lossy(&done.stdout);
    // srun's agents found the address Slurm knows each node by, since the
    // nodes' names resolve to loopback there.
    for i in 1..=3 {
        assert!(
            said.contains(&format!(
                "--bind auto: 10.77.0.{i} (Slurm's NodeAddr of node h{i})"
            )),
            "{}",
            show(&done)
        );
    }
    check_run(&out, "slurm", "slurm:h1,h2,h3");
    check_study(&out);
    if xdp {
        check_xdp(&out);
    }
    if !flags.contains(&"--no-mpirun") {
        check_run(&out, "mpirun", "hostfile:h1,h2,h3");
    }
    if flags.contains(&"--mpi") {
        for run in ["slurm-mpi", "mpirun-mpi"] {
            check_mpi(&out, run);
        }
    }
    assert_all_gone(name, port, &tmp);
    eprintln!("{TEST}: the cluster and its runs took {:?}", t0.elapsed());

    // A job that fails (the run refuses a flag) fails the script, which
    // still takes everything down.
    let failed = run_script(
        name,
        port,
        &tmp,
        &out,
        &["--no-mpirun", "--no-study", "--", "--no-such-flag"],
    );
    assert!(!failed.status.success(), "{}", show(&failed));
    assert!(
        String::from_utf8_lossy(&failed.stderr).contains("the job failed"),
        "{}",
        show(&failed)
    );
    assert_all_gone(name, port, &tmp);
}
