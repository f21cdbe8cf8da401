//! Two programs on two testbed hosts, each under the preload library with
//! its host's relay, that connect to each other before either accepts
//! (`preload_crossed.c`, as Open MPI's ranks do when both send first): a
//! connect through the relays returns once the kernel's connection is up,
//! as the kernel's does, rather than wait for the listener's answer (each
//! would wait for the other's accept); each program writes its greeting
//! before it accepts, then reads the other's on the accepted connection and
//! answers there, every byte checked at both ends, and all four connections
//! moved to xdp through the relays. Both accept at once, so each relay gets
//! a listen before it has a link to the other, then a connect to the
//! other's end: the two relays open their link from both sides at once.
//! Then the first program connects once more, writes and closes before
//! the second accepts: its close returns within 100 ms (it waited for the
//! answer, which comes only once the other program accepts and reads, up
//! to 10 s), and the second program, accepting 300 ms later, reads every
//! byte, then the end.
//!
//! Built only with the `xdp` feature; without root, namespaces or a C
//! compiler the test prints why and passes (with
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 that is a failure).

use crate::common::testbed::Testbed;
use crate::common::{self, system_ready};
use std::process::{Command, Stdio};

#[test]
fn two_programs_that_connect_to_each_other_across_hosts_before_either_accepts_do_not_hang() {
    let test =
        "two_programs_that_connect_to_each_other_across_hosts_before_either_accepts_do_not_hang";
    if !system_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    if !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let exe = common::build_c(
        dir.path(),
        "crossed",
        include_str!("preload_crossed.c"),
        "cc",
    );
    let (tb, _) = Testbed::up("pxcross", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = tb.start_relays(&key, dir.path());
    let hosts = tb.hosts();
    let (h1, h2) = (&hosts.hosts[0], &hosts.hosts[1]);
    let port = |me: usize| (7600 + me).to_string();
    let mut programs = Vec::new();
    for (me, host, peer) in [(1, h1, h2), (2, h2, h1)] {
        let log = dir.path().join(format!("library-{me}.log"));
        let child = Command::new("ip")
            .args(["netns", "exec", &tb.ns(&host.name)])
            .arg(common::netgap_path())
            .args(["wrap", "-t", "xdp", "--relayed", "--"])
            .args(["timeout", "-s", "KILL", "90"])
            .arg(&exe)
            .args([me.to_string(), port(me), peer.address.to_string()])
            .arg(port(3 - me))
            .arg(dir.path())
            .env("NETGAP_PRELOAD", common::preload_library())
            .env("NETGAP_PRELOAD_LOG", &log)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("netgap wrap");
        programs.push((child, log));
    }
    let ended: Vec<_> = programs
        .into_iter()
        .map(|(child, log)| (child.wait_with_output().expect("the program ends"), log))
        .collect();
    let relay_logs: String = relays
        .iter()
        .map(|(_, log)| std::fs::read_to_string(log).unwrap_or_default())
        .collect();
    for (out, log) in ended {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("crossed: ok"),
            "{stdout}{}\n{text}\nthe relays:\n{relay_logs}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Its own connection and the one it accepted, both relayed.
        common::assert_relayed_at_both_ends(&text);
        assert!(!text.contains("kernel's TCP"), "{text}");
    }
    drop(relays);
    tb.assert_no_relay();
    tb.down();
    tb.assert_gone();
}
