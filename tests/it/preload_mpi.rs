//! Open MPI's tcp BTL under the preload library (`--features mpi`):
//! `netgap run mpi-latency,mpi-bw -t shm` runs both ranks under the
//! library on this machine, their connection moved onto shared memory;
//! `-t xdp --hosts @TESTBED` runs them on two testbed hosts, their
//! connection moved onto xdp through relays the job starts in both hosts'
//! namespaces and stops after it. The records name the library's stack
//! (`preload=shm|xdp`) and carry no warning of a connection it kept on the
//! kernel's TCP. And with every message verified: an mpicc ping-pong
//! (`preload_mpi_pingpong.c`, which checks every byte of every message)
//! between two testbed hosts under the library through the relays, and
//! again on direct connections (`NETGAP_PRELOAD_DIRECT=1`); the
//! same program on one host over shm is `preload::an_open_mpi_ping_pong_over_the_tcp_btl_moves_to_shm`.
//!
//! Without root or namespaces the tests print why and pass (with
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 that is a failure); the tests across
//! hosts need the `xdp` feature too, for the relays.

use crate::common::{self, netgap, system_ready};
use serde_json::Value;

/// Two sizes, two repetitions of 50 iterations each: enough for every
/// record, short enough for a test.
const SHORT_RUN: [&str; 6] = ["-s", "1,64K", "--reps", "2", "--iterations", "50"];

/// The record's stack options.
fn stack_options(r: &Value) -> Vec<&str> {
    r["stack"]["options"]
        .as_array()
        .expect("stack options")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// What every record of the ranks under the library over `stack` holds:
/// MPI's own test over the tcp BTL, the library's stack named, and no
/// warning that one of the ranks' connections stayed on the kernel's TCP.
fn check_library_record(r: &Value, stack: &str) {
    assert_eq!(r["transport"], "mpi", "{r}");
    assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    let opts = stack_options(r);
    assert!(opts.contains(&"btl=tcp"), "{opts:?}");
    assert!(
        opts.contains(&format!("preload={stack}").as_str()),
        "{opts:?}"
    );
    let warnings: Vec<&str> = r["warnings"]
        .as_array()
        .map(|w| w.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        !warnings.iter().any(|w| w.contains("kernel's TCP")),
        "{warnings:?}"
    );
}

#[test]
fn mpi_ranks_under_the_library_over_shm_from_the_command_line() {
    let test = "mpi_ranks_under_the_library_over_shm_from_the_command_line";
    if !system_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let stack = ["mpi-latency,mpi-bw", "-t", "shm"];
    let (ok, text, recs) = common::run_preloaded(&[&stack[..], &SHORT_RUN].concat(), &json);
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 4, "{text}");
    for r in &recs {
        check_library_record(r, "shm");
        // On one host the library's rings: no link in the path.
        assert_eq!(r["stack"]["path"]["kind"], "shared-memory", "{r}");
        assert!(r["stack"]["framing"].is_null(), "{r}");
    }
    // Open MPI's own shared memory would bypass the library.
    let out = netgap()
        .args(["run", "mpi-latency", "-t", "shm", "--mpi-btl", "vader"])
        .output()
        .expect("netgap run");
    common::one_line_error(&out, "-t shm --mpi-btl vader", "bypass");
}

#[cfg(feature = "xdp")]
mod across_hosts {
    use super::*;
    use crate::common::testbed::Testbed;
    use std::process::Command;

    #[test]
    fn mpi_ranks_under_the_library_across_testbed_hosts_on_direct_connections_from_the_command_line(
    ) {
        let test =
            "mpi_ranks_under_the_library_across_testbed_hosts_on_direct_connections_from_the_command_line";
        if !system_ready(test) {
            return;
        }
        let (tb, _) = Testbed::up("pxmpicli", &["--hosts", "2", "--links", "2"]);
        let dir = tempfile::tempdir().expect("tempdir");
        let json = dir.path().join("r.jsonl");
        let hosts = tb.hosts_arg();
        let stack = ["mpi-latency,mpi-bw", "-t", "xdp", "--hosts", &hosts];
        let (ok, text, recs) = common::run_preloaded(&[&stack[..], &SHORT_RUN].concat(), &json);
        assert!(ok, "{text}");
        assert_eq!(recs.len(), 4, "{text}");
        for r in &recs {
            check_library_record(r, "xdp");
            // The ranks asked for direct connections, and the record says
            // the library's log showed them direct.
            let opts = stack_options(r);
            assert!(opts.contains(&"preload_path=direct"), "{opts:?}");
            // Across hosts the bytes cross the link in the xdp transport's
            // frames, between the two testbed hosts.
            assert!(!r["stack"]["framing"].is_null(), "{r}");
            assert!(
                r["options"]["peer"]
                    .as_str()
                    .is_some_and(|p| p.contains("h1 (rank 0), h2 (rank 1)")),
                "{r}"
            );
        }
        tb.assert_no_relay();
        // Without the testbed's hosts, xdp is one line before anything
        // starts.
        let out = netgap()
            .args(["run", "mpi-latency", "-t", "xdp"])
            .output()
            .expect("netgap run");
        common::one_line_error(&out, "-t xdp on one host", "--hosts @testbed");
        tb.down();
        tb.assert_gone();
    }

    /// The bytes the closed relayed connections in `log` received.
    fn relayed_received_bytes(log: &str) -> u64 {
        log.lines()
            .filter(|l| l.contains("relayed connection closed"))
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("shm_received_bytes="))
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .sum()
    }

    /// The bytes the closed direct connections in `log` sent, each
    /// connection's sum.
    fn direct_sent_bytes(log: &str) -> Vec<u64> {
        log.lines()
            .filter(|l| l.contains("direct connection on queue") && l.contains(" closed: "))
            .filter_map(|l| {
                let (_, after) = l.split_once(" closed: ")?;
                after.split_whitespace().next()?.parse::<u64>().ok()
            })
            .collect()
    }

    /// `preload_mpi_pingpong.c` (`exe`) for 300 round trips between the
    /// testbed's two hosts under the library over xdp, with `env` added to
    /// the ranks' environment and the library's log in `log`: mpirun in
    /// the first host's namespaces, its daemon on the second through
    /// netgap's launch agent, as `netgap run mpi-*` starts them; only the
    /// ranks run under the library. Every message checked.
    fn ping_pong(
        tb: &Testbed,
        dir: &std::path::Path,
        exe: &std::path::Path,
        log: &std::path::Path,
        env: &[&str],
    ) {
        let netgap_path = common::netgap_path();
        let netgap_s = netgap_path.to_str().expect("a path");
        let hosts = tb.hosts();
        let (h1, h2) = (&hosts.hosts[0], &hosts.hosts[1]);
        let iface = &h1.links[0].ifname;
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", "120", netgap_s, "mpi-exec", "--netns"])
            .arg(tb.ns("h1"))
            .args(["--hostname", "h1", "--", "mpirun", "--allow-run-as-root"])
            .args(["-np", "2", "--host"])
            .arg(format!("{}:1,{}:1", h1.address, h2.address))
            .args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"])
            .args(["--mca", "btl_tcp_if_include", iface])
            .args(["--mca", "oob_tcp_if_include", iface])
            .args(["--mca", "plm_rsh_agent"])
            .arg(format!("{netgap_s} mpi-agent"))
            .args(["--mca", "orte_tmpdir_base"])
            .arg(dir)
            .arg("-x")
            .arg(format!(
                "LD_PRELOAD={}",
                common::preload_library().display()
            ))
            .args(["-x", "NETGAP_PRELOAD_STACK=xdp", "-x"])
            .arg(format!("NETGAP_PRELOAD_LOG={}", log.display()));
        for e in env {
            cmd.args(["-x", e]);
        }
        let out = cmd
            .arg(exe)
            .arg("300")
            .env(
                "NETGAP_MPI_HOSTS",
                format!(
                    "{}={}=h1;{}={}=h2",
                    h1.address,
                    tb.ns("h1"),
                    h2.address,
                    tb.ns("h2")
                ),
            )
            .output()
            .expect("mpirun runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            crate::preload::read(log)
        );
        // 300 round trips of 1 B and 1 KiB, 31 of 64 KiB and of 1 MiB,
        // every byte checked by both ranks.
        assert!(
            stdout.contains("verified round trips: 662 bad: 0"),
            "{stdout}"
        );
    }

    /// The ping-pong through the relays, then on direct connections
    /// (`NETGAP_PRELOAD_DIRECT=1`, relays that grant them): the ranks
    /// connect to each other at once, so each relay gets a listen and
    /// then a connect to the other's end, and the two relays open their
    /// links from both sides. On direct connections that pins a fault of
    /// the relay's: the connect's link closed the crossing one as stale,
    /// the queue answer the other relay owed on it was lost, and the
    /// ranks' connection failed after the relays' 3 s wait.
    #[test]
    fn a_verified_mpi_ping_pong_across_testbed_hosts_through_the_relays() {
        let test = "a_verified_mpi_ping_pong_across_testbed_hosts_through_the_relays";
        if !system_ready(test) {
            return;
        }
        let (tb, _) = Testbed::up("pxmpipp", &["--hosts", "2", "--links", "2"]);
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = common::build_c(
            dir.path(),
            "pingpong",
            include_str!("preload_mpi_pingpong.c"),
            "mpicc",
        );
        let key = common::new_key_file(dir.path(), "relay.key");
        let relays = tb.start_relays(&key, dir.path());
        let log = dir.path().join("mpi.log");
        ping_pong(&tb, dir.path(), &exe, &log, &["NETGAP_PRELOAD_DIRECT=0"]);
        let text = crate::preload::read(&log);
        // The connection between the ranks moved to xdp at both ends.
        common::assert_relayed_at_both_ends(&text);
        // Both ranks received 31 MiB and more each through the relays.
        let relayed = relayed_received_bytes(&text);
        assert!(relayed > 2 * 31 * (1 << 20), "{relayed} B relayed: {text}");
        drop(relays);
        tb.assert_no_relay();

        let relays = tb.start_direct_relays(&key, dir.path());
        let log = dir.path().join("mpi-direct.log");
        ping_pong(&tb, dir.path(), &exe, &log, &["NETGAP_PRELOAD_DIRECT=1"]);
        let text = crate::preload::read(&log);
        // The connection that carried the messages was direct at both
        // ranks, and nothing went through the relays.
        let carried: Vec<u64> = direct_sent_bytes(&text)
            .into_iter()
            .filter(|b| *b > 31 * (1 << 20))
            .collect();
        assert_eq!(carried.len(), 2, "{text}");
        assert!(
            text.contains("accepted connection moved to direct"),
            "{text}"
        );
        assert!(!text.contains("relayed connection closed"), "{text}");
        drop(relays);
        tb.assert_no_relay();
        tb.down();
        tb.assert_gone();
    }
}
