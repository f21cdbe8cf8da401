//! The staged workloads over the `xdp` transport across the hosts of a
//! namespace testbed (four hosts on a switch, two links each, as study
//! 000's): each agent's xdp flows on an interface share one AF_XDP socket
//! of its process, each flow a session on it found by flow id.
//!
//! - `pipeline -t xdp` across three of the hosts (`--place 0,1,2`: the
//!   producer, the filter and the consumer on three hosts) completes its
//!   queries with every UOW checked by the consumer;
//! - `pio -t xdp` writes and reads back striped files, every byte checked,
//!   with one server and six clients (two clients on each client host: two
//!   xdp flows between the same two hosts at once, on one socket at each
//!   end) and with three servers and one client (one client's three flows
//!   at once, one per server);
//! - a pipeline that would join two copies on one host is refused in one
//!   line (xdp's flows need two hosts);
//! - the testbed leaves nothing behind.
//!
//! Built only with the `xdp` feature (`cargo test --features xdp --test it
//! xdp`); without root and namespaces it prints why and passes (with
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 a missing testbed is a failure, as in CI).

use crate::common::testbed::Testbed;
use crate::common::{netgap, one_line_error, system_ready};
use serde_json::Value;

/// Checks a pipeline record over xdp as every pipeline record is checked
/// (queries of `query` bytes in UOWs of `uow` bytes, every UOW through
/// every stage and checked, one copy per stage on `hosts`), and that it
/// names xdp.
fn check_pipeline(r: &Value, query: u64, uow: u64, hosts: &[&str]) {
    assert_eq!(r["transport"], "xdp", "the record names the transport");
    crate::pipeline::check_record(r, query, uow, 1, hosts);
}

/// Checks a pio record over xdp as every pio record is checked
/// (`clients` clients of `servers` servers each wrote and read back
/// `per_client` bytes, checked, one flow per client, the clients on the
/// hosts after the servers, cyclically), and that it names xdp.
fn check_pio(r: &Value, servers: usize, clients: usize, per_client: u64, hosts: &[String]) {
    assert_eq!(r["transport"], "xdp", "the record names the transport");
    crate::pio::check_record(r, servers, clients, per_client, hosts);
}

#[test]
fn pipeline_and_pio_run_over_xdp_across_testbed_hosts_verified() {
    if !system_ready("pipeline_and_pio_run_over_xdp_across_testbed_hosts_verified") {
        return;
    }
    let (tb, _) = Testbed::up(
        "xdpstg",
        &["--hosts", "4", "--topology", "switch", "--links", "2"],
    );
    let hosts: Vec<String> = tb.hosts().hosts.iter().map(|h| h.name.clone()).collect();
    let dir = tempfile::tempdir().expect("tempdir");

    // The pipeline on three hosts: producer, filter, consumer.
    let query = 2u64 << 20;
    let recs = tb.run(
        "pipeline",
        &[
            "-t",
            "xdp",
            "--place",
            "0,1,2",
            "--query-bytes",
            "2M",
            "-s",
            "16K",
            "--reps",
            "2",
            "--duration",
            "20s",
        ],
        &dir.path().join("pipeline.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    let three: Vec<&str> = hosts[..3].iter().map(String::as_str).collect();
    check_pipeline(&recs[0], query, 16 << 10, &three);

    // Striped I/O: two clients per client host (two xdp flows between the
    // same two hosts at once), then one client of three servers.
    let data_arg = format!("pio-xdp-{}", std::process::id());
    for (servers, clients) in [(1usize, 6usize), (3, 1)] {
        let recs = tb.run(
            "pio",
            &[
                "-t",
                "xdp",
                "--reps",
                "1",
                "--duration",
                "20s",
                "-s",
                "64K",
                "--block",
                "256K",
                "--blocks",
                "4",
                "--pattern",
                "contiguous",
                "--op",
                "write,read",
                "--dir",
                &data_arg,
                "--servers",
                &servers.to_string(),
                "--clients",
                &clients.to_string(),
            ],
            &dir.path().join(format!("pio-{servers}s{clients}c.jsonl")),
        );
        assert_eq!(recs.len(), 2, "two ops");
        for r in &recs {
            check_pio(r, servers, clients, 4 * 256 * 1024, &hosts);
        }
    }

    // Two copies on one host cannot be joined over xdp: refused in one
    // line, not hung.
    let out = netgap()
        .args(["run", "pipeline", "-t", "xdp", "--place", "0,0,1"])
        .args(["--hosts", &tb.hosts_arg()])
        .args(["--query-bytes", "1M", "--reps", "1", "--duration", "10s"])
        .output()
        .expect("netgap run");
    one_line_error(
        &out,
        "pipeline -t xdp --place 0,0,1",
        "two copies on one host",
    );

    let _ = tb.down();
    tb.assert_gone();
}
