//! Workload CPU against the kernel's accounting. Two agents, each its own
//! process on a loopback address (no root needed), run `pio`, `pipeline`,
//! `fanin` and `hotspot`; around each run the test reads what the kernel
//! has accounted to each agent's process (user and system time in
//! `/proc/PID/stat`). A record's CPU of a role is its agent's over the
//! window in which the role's bytes moved, so it is never more than the
//! kernel's figure (give or take a clock tick at each reading), and, the
//! work filling the run, at least half of it: a meter on a thread that only
//! waited (pio's and pipeline's, once: tens of microseconds of CPU while
//! the kernel counted tens of milliseconds) fails. A pio role is held to
//! both its phases' CPU, which together are its job; its record's CPU is
//! the headline phase's, over that phase, and the table shows it.

use crate::common::{f, metric, netgap, read_records, u, AgentProc};
use serde_json::Value;

/// Repetitions of every point.
const REPS: u64 = 2;

/// One clock tick of `/proc/PID/stat`, ms.
fn tick_ms() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(hz > 0, "clock ticks per second: {hz}");
    1000.0 / hz as f64
}

/// CPU time the kernel has accounted so far to process `pid`, every thread
/// of it, ms: utime and stime, the 14th and 15th fields of its stat line,
/// counted after the command name (which may hold spaces).
fn kernel_cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the agent's stat");
    let rest = &stat[stat.rfind(')').expect("a command name") + 1..];
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|t| t.parse::<u64>().expect("clock ticks"))
        .sum();
    ticks as f64 * tick_ms()
}

/// A server agent and a client agent, each its own process.
struct Agents {
    server: AgentProc,
    client: AgentProc,
    dir: tempfile::TempDir,
}

impl Agents {
    fn start() -> Agents {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = dir.path().join("run");
        let io = dir.path().join("io");
        std::fs::create_dir(&io).expect("an I/O directory");
        let flags = [
            "--run-dir",
            run.to_str().expect("utf8"),
            "--io-dir",
            io.to_str().expect("utf8"),
        ];
        Agents {
            server: AgentProc::start_with("127.0.0.61", &flags),
            client: AgentProc::start_with("127.0.0.62", &flags),
            dir,
        }
    }

    /// The kernel's CPU of each agent, ms: (server, client).
    fn kernel_cpu_ms(&self) -> (f64, f64) {
        (
            kernel_cpu_ms(self.server.child.id()),
            kernel_cpu_ms(self.client.child.id()),
        )
    }

    /// `netgap run ARGS` over the two agents; its records, its table and
    /// the CPU the kernel accounted to each agent over it, ms.
    fn run(&self, name: &str, args: &[&str]) -> (Vec<Value>, String, (f64, f64)) {
        let json = self.dir.path().join(format!("{name}.jsonl"));
        let hosts = format!("{},{}", self.server.addr, self.client.addr);
        let before = self.kernel_cpu_ms();
        let out = netgap()
            .arg("run")
            .args(args)
            .args(["--hosts", &hosts, "--reps", &REPS.to_string(), "--json"])
            .arg(&json)
            .output()
            .expect("netgap run");
        let after = self.kernel_cpu_ms();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let records = read_records(&json);
        assert_eq!(records.len(), 1, "{name}");
        (
            records,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            (after.0 - before.0, after.1 - before.1),
        )
    }
}

/// The record's CPU of the roles on `host`, ms, summed over repetitions.
fn record_cpu_ms(r: &Value, host: &str) -> f64 {
    let roles: Vec<&Value> = r["hosts_cpu"]
        .as_array()
        .expect("hosts_cpu")
        .iter()
        .filter(|h| h["host"] == host)
        .collect();
    assert!(!roles.is_empty(), "no role on {host}: {}", r["hosts_cpu"]);
    roles
        .iter()
        .map(|h| u(&h["cpu"]["cpu_ns"]) as f64 / 1e6)
        .sum()
}

/// The record's CPU of a role agrees with what the kernel accounted to its
/// agent over the run: no more (but for a tick of rounding at each of the
/// kernel's two readings), and no less than half.
fn agrees_with_kernel(what: &str, record_ms: f64, kernel_ms: f64) {
    assert!(
        record_ms <= kernel_ms + 2.0 * tick_ms() + kernel_ms / 100.0,
        "{what}: the record says {record_ms:.2} ms of CPU, more than the {kernel_ms:.2} ms the kernel accounted to its agent"
    );
    assert!(
        record_ms >= kernel_ms / 2.0,
        "{what}: the record says {record_ms:.2} ms of CPU, under half of the {kernel_ms:.2} ms the kernel accounted to its agent"
    );
}

/// The table's `cpu_loc_%` and `cpu_rem_%` of the row of `test`: the two
/// columns after the confidence interval.
fn table_cpu(table: &str, test: &str) -> (String, String) {
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(test))
        .unwrap_or_else(|| panic!("no {test} row in {table}"));
    let mut after_ci = row
        .split_whitespace()
        .skip_while(|t| !t.starts_with('±'))
        .skip(1);
    let mut next = || after_ci.next().unwrap_or_default().to_string();
    (next(), next())
}

#[test]
fn a_roles_cpu_is_what_the_kernel_accounted_to_its_agent_not_a_waiting_threads() {
    let agents = Agents::start();
    let (server, client) = (agents.server.addr.as_str(), agents.client.addr.as_str());

    // pio, 64 MiB written and read back each repetition: both phases' CPU
    // of each role is what its agent used, and the record's own is the
    // read phase's, over that phase.
    let (recs, table, kernel) = agents.run(
        "pio",
        &[
            "pio",
            "--op",
            "read",
            "--cache",
            "keep",
            "-s",
            "1M",
            "--block",
            "16M",
            "--blocks",
            "4",
            "--duration",
            "60s",
        ],
    );
    let r = &recs[0];
    assert_eq!(metric(r, "read_bytes"), (64u64 << 20) as f64);
    let reps = REPS as f64;
    let job = |side: &str| {
        reps * (metric(r, &format!("{side}_write_cpu_ms"))
            + metric(r, &format!("{side}_read_cpu_ms")))
    };
    agrees_with_kernel("pio server", job("servers"), kernel.0);
    agrees_with_kernel("pio client", job("clients"), kernel.1);
    for (host, side) in [(server, "servers"), (client, "clients")] {
        let read = reps * metric(r, &format!("{side}_read_cpu_ms"));
        let own = record_cpu_ms(r, host);
        assert!(
            (own - read).abs() <= 1e-6 * read.max(1.0),
            "{host}: {own} ms is not the read phase's {read} ms"
        );
    }
    // The client's window is its read phase, as the headline's time.
    let cpu = r["hosts_cpu"]
        .as_array()
        .expect("hosts_cpu")
        .iter()
        .find(|h| h["role"] == "client")
        .expect("the client's CPU");
    let read_ns = reps * metric(r, "read_time_ms") * 1e6;
    let wall_ns = u(&cpu["cpu"]["wall_ns"]) as f64;
    assert!(
        (wall_ns - read_ns).abs() <= 1e-6 * read_ns,
        "{wall_ns} ns is not the read phase's {read_ns} ns"
    );
    // The table shows the record's figures, the busiest client and the
    // server, as percents of a core.
    let pct = |role: &str| {
        let h = r["hosts_cpu"]
            .as_array()
            .expect("hosts_cpu")
            .iter()
            .find(|h| h["role"] == role)
            .expect("a role");
        f(&h["cpu"]["process_percent"])
    };
    let (loc, rem) = table_cpu(&table, "pio");
    assert_eq!(
        (loc.as_str(), rem.as_str()),
        (
            format!("{:.0}", pct("client")).as_str(),
            format!("{:.0}", pct("server")).as_str()
        ),
        "{table}"
    );
    assert!(pct("client") >= 1.0 && pct("server") >= 1.0, "{table}");

    // pipeline: a role's CPU over its run of the query, every copy's.
    let (recs, _, kernel) = agents.run("pipeline", &["pipeline", "--query-bytes", "8M"]);
    agrees_with_kernel(
        "pipeline on the first host",
        record_cpu_ms(&recs[0], server),
        kernel.0,
    );
    agrees_with_kernel(
        "pipeline on the second host",
        record_cpu_ms(&recs[0], client),
        kernel.1,
    );

    // The bandwidth roles and the flow engine over their --duration window.
    for (test, args) in [
        ("fanin", &["fanin", "--duration", "500ms"][..]),
        (
            "hotspot",
            &["hotspot", "--clients", "2", "--duration", "500ms"][..],
        ),
    ] {
        let (recs, _, kernel) = agents.run(test, args);
        agrees_with_kernel(
            &format!("{test} server"),
            record_cpu_ms(&recs[0], server),
            kernel.0,
        );
        agrees_with_kernel(
            &format!("{test} client"),
            record_cpu_ms(&recs[0], client),
            kernel.1,
        );
    }
}
