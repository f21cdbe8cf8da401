//! An agent's log under a flood of connections that never prove the key:
//! a few summary lines, not one per connection, each naming the busiest
//! sources, with what the strangers sent escaped; and a coordinator with
//! the key still gets in.

use crate::common;
use crate::common::{netgap, new_key_file};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A keyed `netgap serve` whose standard error goes to a file; killed on
/// drop.
struct LoggedAgent {
    child: Child,
    addr: String,
}

impl Drop for LoggedAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The connections counted by the summary lines of `log`.
fn counted(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.strip_prefix("netgap agent: "))
        .filter_map(|l| l.split_once(" unauthenticated connection"))
        .filter_map(|(n, _)| n.parse::<u64>().ok())
        .sum()
}

#[test]
fn many_refused_connections_give_a_bounded_number_of_log_lines() {
    const STRANGERS: u64 = 300;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = new_key_file(dir.path(), "key");
    let log_path = dir.path().join("agent.log");
    let log_file = std::fs::File::create(&log_path).expect("log file");
    let mut child = netgap()
        .args(["serve", "--bind", "127.0.0.1", "--port", "0", "--key"])
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .expect("agent starts");
    let addr = common::agent_addr(&mut child);
    let agent = LoggedAgent { child, addr };

    let t0 = Instant::now();
    for _ in 0..STRANGERS {
        let mut s = TcpStream::connect(&agent.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        // Not a frame of the protocol, with a terminal escape in it.
        let _ = s.write_all(b"GET /\x1b[2J HTTP/1.0\r\n\r\n");
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    let flood = t0.elapsed();

    // Every refusal is reported within an interval and a second or so.
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = std::fs::read_to_string(&log_path).expect("log");
        if counted(&log) >= STRANGERS || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(counted(&log), STRANGERS, "{log}");
    let lines: Vec<&str> = log.lines().collect();
    // The first refusal at once, then at most one line per 10 s of the
    // flood, and the rest after it.
    let most = 2 + usize::try_from(flood.as_secs() / 10).expect("small");
    assert!(
        lines.len() <= most,
        "{} lines for {STRANGERS} refusals in {flood:?}:\n{log}",
        lines.len()
    );
    for l in &lines {
        assert!(
            l.contains("unauthenticated connection") && l.contains("127.0.0.1 x "),
            "{l}"
        );
    }
    assert!(!log.contains('\x1b'), "raw escape in the log: {log:?}");

    // The coordinator with the key still gets in.
    common::run_ok(
        netgap()
            .args(["run", "pingpong", "-s", "64", "--reps", "1", "-n", "10"])
            .args(["--peer", &agent.addr, "--key"])
            .arg(&key),
    );
}
