//! A stopped peer (SIGSTOP: alive, silent) is named within `--timeout`
//! plus one second, for every test. A file of its own, so no other test of
//! the suite competes with its timing for the CPU.

use crate::common::{netgap, AgentProc as Agent};
use std::time::{Duration, Instant};

/// Runs `test` over `transport` in `mode` against an agent that is stopped
/// (SIGSTOP: alive, silent) a second into the run; the time from the stop
/// to the run's exit, and its stderr.
fn run_against_a_stopped_agent(test: &str, transport: &str, mode: &str) -> (Duration, String) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let agent = Agent::start("127.0.0.1");
    let size = if transport == "udp" { "16K" } else { "64K" };
    let mut run = netgap()
        .args(["run", test, "-t", transport, "--mode", mode, "-s", size])
        .args(["--peer", &agent.addr, "--timeout", "1s"])
        .args(["--reps", "10000", "--rep-time", "20ms"])
        // Small socket buffers: after the stop, bytes still move into the
        // stopped peer's buffers (progress, rightly), and megabytes of
        // autotuned buffers filled on a busy machine would be timed as if
        // the silence had begun later than it did.
        .args(if matches!(transport, "tcp" | "unix") {
            &["--sndbuf", "64K", "--rcvbuf", "64K"][..]
        } else {
            &[][..]
        })
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run starts");
    std::thread::sleep(Duration::from_millis(1200));
    let pid = Pid::from_raw(agent.child.id() as i32);
    kill(pid, Signal::SIGSTOP).expect("stop the agent");
    let stopped = Instant::now();
    let out = loop {
        if let Some(_status) = run.try_wait().expect("wait") {
            break run.wait_with_output().expect("output");
        }
        if stopped.elapsed() > Duration::from_secs(30) {
            let _ = run.kill();
            break run.wait_with_output().expect("output");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = stopped.elapsed();
    // A stopped process takes SIGKILL; the guard reaps it.
    let _ = kill(pid, Signal::SIGCONT);
    assert!(
        !out.status.success(),
        "{test} over {transport} ({mode}) went on: it exited cleanly {took:?} after the stop; its stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (took, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_stopped_peer_is_named_within_the_timeout_plus_a_second_for_every_test() {
    // Every test over tcp in both modes and over unix and udp, and the
    // bandwidth test over the other transports: whichever call each was in
    // when the peer stopped (a partial send, a receive, the wait for the
    // agent's answer), and however many threads wait on the flow (bibw
    // sends on one and receives on another), the run ends within
    // --timeout 1s plus one second, naming the silence.
    let mut cases: Vec<(&str, &str, &str)> = Vec::new();
    for test in ["pingpong", "stream", "bibw", "bibw-pingpong"] {
        for (transport, mode) in [("tcp", "event"), ("tcp", "poll"), ("unix", "event")] {
            cases.push((test, transport, mode));
        }
        cases.push((test, "udp", "event"));
    }
    for transport in ["uring", "shm"] {
        cases.push(("stream", transport, "event"));
    }
    for (test, transport, mode) in cases {
        let (took, stderr) = run_against_a_stopped_agent(test, transport, mode);
        let error = stderr
            .lines()
            .find(|l| l.starts_with("netgap: error:"))
            .unwrap_or_else(|| panic!("no error line: {stderr}"));
        eprintln!("{test} over {transport} ({mode}): named {took:?} after the stop: {error}");
        assert!(
            error.contains("no data moved for 1000 ms") || error.contains("no control message"),
            "{test} {transport} {mode}: {error}"
        );
        assert!(
            // --timeout 1s plus one second, the bound the README gives.
            took <= Duration::from_millis(2000),
            "{test} over {transport} ({mode}) took {took:?} after the stop: {error}"
        );
    }
}
