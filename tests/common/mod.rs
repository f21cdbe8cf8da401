//! Pieces the integration tests share: the binary, a real agent process on
//! loopback that is killed on drop, and reading a results file.

#![allow(dead_code, reason = "each test file uses its own subset")]

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The `netgap` binary under test.
pub fn netgap() -> Command {
    Command::cargo_bin("netgap").expect("binary built")
}

/// A `netgap serve` on an ephemeral port of a loopback address, killed on
/// drop.
pub struct AgentProc {
    pub child: Child,
    /// Its control address, as it printed it.
    pub addr: String,
}

impl AgentProc {
    /// An agent bound to `bind`.
    pub fn start(bind: &str) -> AgentProc {
        AgentProc::start_with(bind, &[])
    }

    /// An agent with extra `serve` flags (limits, a key).
    pub fn start_with(bind: &str, flags: &[&str]) -> AgentProc {
        let mut child = netgap()
            .args(["serve", "--bind", bind, "--port", "0"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("agent prints its address");
        // A keyed agent says so after its address.
        let addr = line
            .trim()
            .trim_end_matches(" (key required)")
            .rsplit(' ')
            .next()
            .expect("address at the end")
            .to_string();
        AgentProc { child, addr }
    }

    /// Kills the agent and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every record of a JSON Lines results file (none when it is missing).
pub fn read_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}
