//! `--hosts @slurm` and `--hosts @hostfile:FILE` from the command line: the
//! hosts a cluster launcher names become the agents of a run, and bad
//! lists are refused in one line. The expansion itself is unit-tested on
//! synthetic inputs in `netgap_measure::hostlist`.

use crate::common;

use crate::common::{fails_with_one_line, netgap, ok, read_records, AgentProc};
use std::io::{BufRead, BufReader};
use std::process::Stdio;

/// `netgap serve --bind IP` on the default port 7100, killed on drop.
fn agent_on_default_port(ip: &str) -> AgentProc {
    agent_on_port(ip, 7100)
}

/// `netgap serve --bind IP --port PORT`, killed on drop.
fn agent_on_port(ip: &str, port: u16) -> AgentProc {
    let mut child = netgap()
        .args(["serve", "--bind", ip, "--port", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("agent prints its address");
    let addr = format!("{ip}:{port}");
    assert!(line.contains(&addr), "{line}");
    AgentProc { child, addr }
}

/// A run on a launcher's hosts waits for agents that start after it (as
/// `srun ... netgap serve &` followed at once by `netgap run` does), on the
/// port named after the hostfile, and its records name the nodes.
#[test]
fn a_run_waits_for_the_agents_of_a_hostfile_on_its_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hosts");
    std::fs::write(&file, "127.0.14.5\n127.0.14.6 slots=1\n").expect("write");
    let json = dir.path().join("r.jsonl");
    let run = netgap()
        .args(["run", "multistream", "--hosts"])
        .arg(format!("@hostfile:{}:7151", file.display()))
        .args(["-P", "1", "--reps", "1", "--duration", "100ms"])
        .args(["--wait", "30s", "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run starts");
    let mut run = common::procs::Reaped(run);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let _server = agent_on_port("127.0.14.5", 7151);
    let _client = agent_on_port("127.0.14.6", 7151);
    let status = run.0.wait().expect("run ends");
    let mut stderr = String::new();
    if let Some(mut e) = run.0.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).expect("stderr");
    }
    assert!(status.success(), "{stderr}");
    let records = read_records(&json);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["flows"][0]["host"], "127.0.14.6");
    assert_eq!(
        records[0]["options"]["peer"],
        "hostfile:127.0.14.5,127.0.14.6"
    );
}

/// A node whose agent never answers is named, with the others that did
/// not, in one line once the wait is over; the node that answered is not.
#[test]
fn nodes_that_never_answer_are_named_in_one_line() {
    let _server = agent_on_port("127.0.14.7", 7152);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hosts");
    std::fs::write(&file, "127.0.14.7\n127.0.14.8\n127.0.14.9\n").expect("write");
    let arg = format!("@hostfile:{}:7152", file.display());
    let t0 = std::time::Instant::now();
    let e = common::one_line_error(
        &netgap()
            .args(["run", "multistream", "--hosts", &arg, "--wait", "600ms"])
            .output()
            .expect("runs"),
        "a run with two silent nodes",
        "no agent answered within 600ms on 127.0.14.8 (127.0.14.8:7152: Connection refused",
    );
    assert!(e.contains(", 127.0.14.9 (127.0.14.9:7152"), "{e}");
    assert!(!e.contains("127.0.14.7 ("), "{e}");
    assert!(t0.elapsed() >= std::time::Duration::from_millis(600));
}

/// Bad launcher input is refused in one line: a port out of range, a wait
/// with hosts no launcher named, an allocation of one node.
#[test]
fn bad_launcher_input_is_refused_in_one_line() {
    fails_with_one_line(
        &["run", "multistream", "--hosts", "@slurm:65536"],
        "port 65536 is out of range (1-65535)",
    );
    fails_with_one_line(
        &["run", "multistream", "--hosts", "@hostfile:h:0"],
        "port 0 is out of range",
    );
    fails_with_one_line(
        &[
            "run",
            "multistream",
            "--hosts",
            "127.0.0.1,127.0.0.2",
            "--wait",
            "1s",
        ],
        "--wait",
    );
    let out = netgap()
        .args(["run", "multistream", "--hosts", "@slurm:7153"])
        .env("SLURM_JOB_NODELIST", "127.0.14.10")
        .output()
        .expect("runs");
    common::one_line_error(&out, "one node", "the allocation has one node");
}

#[test]
fn a_bad_slurm_node_list_is_refused_in_one_line() {
    for (list, why) in [
        ("node[01-04", "without ']'"),
        ("node[4-1]", "backwards"),
        ("a,,b", "empty entry"),
    ] {
        let out = netgap()
            .args(["run", "multistream", "--hosts", "@slurm"])
            .env("SLURM_JOB_NODELIST", list)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{list}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("@slurm") && stderr.contains(why),
            "{list}: {stderr}"
        );
    }
    let out = netgap()
        .args(["run", "multistream", "--hosts", "@slurm"])
        .env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("SLURM_JOB_NODELIST is not set"), "{stderr}");
}

#[test]
fn a_bad_hostfile_is_refused_naming_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hosts");
    std::fs::write(&file, "# nodes\nnode01 slots=4\nnode02 slots=four\n").expect("write");
    let arg = format!("@hostfile:{}", file.display());
    fails_with_one_line(&["run", "multistream", "--hosts", &arg], "line 3");
    fails_with_one_line(
        &[
            "run",
            "multistream",
            "--hosts",
            "@hostfile:/nonexistent/hostfile",
        ],
        "/nonexistent/hostfile",
    );
}

/// The agents of a hostfile's hosts serve a workload run: an Open MPI
/// line and an MPICH line, with comments and blank lines between.
#[test]
fn a_hostfile_names_the_agents_of_a_run() {
    // Two agents on the default port of their own loopback addresses, as
    // `netgap serve` listens on each node of a cluster.
    let _server = agent_on_default_port("127.0.14.1");
    let _client = agent_on_default_port("127.0.14.2");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hosts");
    std::fs::write(
        &file,
        "# Open MPI style\n127.0.14.1 slots=2 max_slots=4\n\n127.0.14.2:2   # MPICH style\n",
    )
    .expect("write");
    let json = dir.path().join("r.jsonl");
    ok(netgap()
        .args(["run", "multistream", "--hosts"])
        .arg(format!("@hostfile:{}", file.display()))
        .args(["-P", "2", "--reps", "1", "--duration", "100ms", "--json"])
        .arg(&json)
        .output()
        .expect("runs"));
    let records = read_records(&json);
    assert_eq!(records.len(), 1);
    let flows = records[0]["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 2);
    assert!(flows.iter().all(|f| f["host"] == "127.0.14.2"), "{flows:?}");
}

/// The nodes of a Slurm allocation, given as a compressed range, are the
/// agents of a run (here loopback addresses stand in for node names).
#[test]
fn the_slurm_allocation_names_the_agents_of_a_run() {
    let _server = agent_on_default_port("127.0.14.3");
    let _client = agent_on_default_port("127.0.14.4");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    ok(netgap()
        .args(["run", "multistream", "--hosts", "@slurm"])
        .env("SLURM_JOB_NODELIST", "127.0.14.[3-4]")
        .args(["-P", "1", "--reps", "1", "--duration", "100ms", "--json"])
        .arg(&json)
        .output()
        .expect("runs"));
    let records = read_records(&json);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["flows"][0]["host"], "127.0.14.4");
}

/// `serve --bind auto` listens on the address the node's name resolves to:
/// here a testbed host whose host name is its address, reached from the
/// other host with the key.
#[test]
fn serve_bind_auto_listens_on_the_nodes_address() {
    if !common::system_ready("serve_bind_auto_listens_on_the_nodes_address") {
        return;
    }
    let (tb, _) = common::testbed::Testbed::up("hlauto", &["--hosts", "2"]);
    let key = tb.key();
    let key = key.to_str().expect("utf-8 key path");
    let mut child = netgap()
        .args([
            "mpi-exec",
            "--netns",
            &tb.ns("h1"),
            "--hostname",
            "10.77.0.1",
            "--",
        ])
        .arg(common::netgap_path())
        .args(["serve", "--bind", "auto", "--key", key])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent starts");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let (mut chose, mut line) = (String::new(), String::new());
    out.read_line(&mut chose).expect("agent says its choice");
    out.read_line(&mut line).expect("agent prints its address");
    let agent = AgentProc {
        child,
        addr: "10.77.0.1:7100".into(),
    };
    assert_eq!(
        chose.trim_end(),
        "--bind auto: 10.77.0.1 (the address of this node's name 10.77.0.1)"
    );
    assert!(
        line.contains("listening on 10.77.0.1:7100 (key required)"),
        "{line}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    ok(std::process::Command::new("ip")
        .args(["netns", "exec", &tb.ns("h2")])
        .arg(common::netgap_path())
        .args(["run", "pingpong", "--peer", "10.77.0.1", "--key", key])
        .args(["-s", "1", "--reps", "1", "--iterations", "10", "--json"])
        .arg(&json)
        .output()
        .expect("runs"));
    assert_eq!(read_records(&json).len(), 1);
    drop(agent);
    tb.down();
}

/// Hosts files and hostfiles are read only when regular files of at most
/// 16 MiB: `/dev/zero`, a FIFO with no writer and a longer file are refused
/// at once in one line naming the file, not after a timeout.
#[test]
fn a_hosts_file_that_is_a_device_a_fifo_or_past_the_cap_is_refused_at_once() {
    use common::files::{mkfifo, one_error_line, output_within, sparse};
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("hosts.fifo");
    mkfifo(&fifo);
    let big = dir.path().join("hosts.json");
    sparse(&big, (16 << 20) + 1);
    let cases = [
        (
            "/dev/zero".to_string(),
            "/dev/zero is a character device, not a regular file".to_string(),
        ),
        (
            fifo.display().to_string(),
            format!("{} is a FIFO, not a regular file", fifo.display()),
        ),
        (
            big.display().to_string(),
            format!(
                "{} holds 16777217 bytes, more than the 16M (16777216 bytes) netgap reads from a hosts file",
                big.display()
            ),
        ),
    ];
    for (file, wanted) in &cases {
        for arg in [format!("@{file}"), format!("@hostfile:{file}")] {
            let out = output_within(
                netgap().args(["run", "multistream", "--hosts", &arg]),
                std::time::Duration::from_secs(30),
            );
            let err = one_error_line(&out);
            assert!(err.contains(wanted.as_str()), "--hosts {arg}: {err}");
        }
    }
}
