//! Every flag group walked through the real binary: for each command that
//! takes a flag, the flag either changes what the record says (its
//! `options`, or the point's own fields) or is refused with one line naming
//! it. Runs are tiny (one size, two short repetitions), so the walk takes
//! seconds.

use serde_json::Value;
use std::path::Path;

use crate::common::{netgap, read_records, run_ok, AgentProc};

/// What a flag must do to a command.
enum Expect {
    /// The first record's value at this JSON pointer becomes this value,
    /// which is not the value without the flag.
    Records(&'static str, Value),
    /// The first record's array at this JSON pointer has this length.
    Len(&'static str, usize),
    /// Refused: non-zero exit, one line on stderr containing this.
    Refused(&'static str),
}
use Expect::{Len, Records, Refused};

/// One command's walk: its fixed words, and the flags that keep its runs
/// tiny, each left out when a case gives that flag or one that conflicts
/// with it.
struct Command<'a> {
    words: Vec<&'a str>,
    tiny: Vec<(&'a str, &'a str, &'a [&'a str])>,
    dir: &'a Path,
}

impl Command<'_> {
    /// The arguments of a run with `flags`, writing to `json`.
    fn argv(&self, flags: &[&str], json: &Path) -> Vec<String> {
        let mut argv: Vec<String> = self.words.iter().map(|s| s.to_string()).collect();
        for (flag, value, conflicts) in &self.tiny {
            let given = flags.iter().any(|f| f == flag || conflicts.contains(f));
            if !given {
                argv.push(flag.to_string());
                argv.push(value.to_string());
            }
        }
        argv.extend(flags.iter().map(|s| s.to_string()));
        argv.push("--json".into());
        argv.push(json.display().to_string());
        argv
    }

    /// Runs with `flags`, returning the records, or the stderr on failure.
    fn run(&self, flags: &[&str]) -> Result<Vec<Value>, (String, Vec<String>)> {
        let json = self.dir.join(format!("{}.jsonl", unique()));
        let argv = self.argv(flags, &json);
        let out = netgap().args(&argv).output().expect("netgap runs");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.success() {
            Ok(read_records(&json))
        } else {
            Err((stderr, argv))
        }
    }

    /// Checks every case against a run without the flag.
    fn walk(&self, cases: &[(&[&str], Expect)]) {
        let base = self
            .run(&[])
            .unwrap_or_else(|(e, argv)| panic!("{argv:?}: {e}"));
        let base = base.first().expect("a record without flags");
        for (flags, expect) in cases {
            match (self.run(flags), expect) {
                (Ok(records), Records(pointer, want)) => {
                    let r = records
                        .first()
                        .unwrap_or_else(|| panic!("{flags:?}: no record"));
                    assert_eq!(
                        r.pointer(pointer),
                        Some(want),
                        "{flags:?}: {pointer} in {r}"
                    );
                    assert_ne!(
                        base.pointer(pointer),
                        Some(want),
                        "{flags:?} changes nothing at {pointer}"
                    );
                }
                (Ok(records), Len(pointer, n)) => {
                    let r = records
                        .first()
                        .unwrap_or_else(|| panic!("{flags:?}: no record"));
                    let len = r.pointer(pointer).and_then(Value::as_array).map(Vec::len);
                    assert_eq!(len, Some(*n), "{flags:?}: {pointer} in {r}");
                    let base_len = base
                        .pointer(pointer)
                        .and_then(Value::as_array)
                        .map(Vec::len);
                    assert_ne!(base_len, Some(*n), "{flags:?} changes nothing at {pointer}");
                }
                (Err((stderr, argv)), Refused(needle)) => {
                    assert_eq!(stderr.trim_end().lines().count(), 1, "{argv:?}: {stderr}");
                    assert!(
                        stderr.contains(needle),
                        "{argv:?}: {stderr:?} lacks {needle:?}"
                    );
                    assert!(!stderr.contains("panicked"), "{stderr}");
                }
                (Ok(records), Refused(needle)) => {
                    panic!("{flags:?} was accepted, not refused ({needle}): {records:?}")
                }
                (Err((stderr, argv)), _) => panic!("{argv:?} failed: {stderr}"),
            }
        }
    }
}

/// A name no other run of this process uses.
fn unique() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("r{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn uring_available() -> bool {
    netgap::transport::find("uring").is_some_and(|t| t.availability().is_ok())
}

fn xdp_available() -> bool {
    netgap::transport::find("xdp").is_some_and(|t| t.availability().is_ok())
}

/// The flags of the transport and method groups that every point-to-point
/// command records the same way.
fn shared_point_to_point_cases() -> Vec<(&'static [&'static str], Expect)> {
    let mut cases: Vec<(&[&str], Expect)> = vec![
        (&["-t", "unix"], Records("/transport", "unix".into())),
        (&["--mode", "poll"], Records("/mode", "poll".into())),
        (
            &["--no-nodelay"],
            Records("/options/transport/nodelay", false.into()),
        ),
        (
            &["--sndbuf", "64K"],
            Records("/options/transport/sndbuf_bytes", 65536.into()),
        ),
        (
            &["--rcvbuf", "64K"],
            Records("/options/transport/rcvbuf_bytes", 65536.into()),
        ),
        (
            &["--quickack"],
            Records("/options/transport/quickack", true.into()),
        ),
        (&["--cork"], Records("/options/transport/cork", true.into())),
        (
            &["--congestion", "reno"],
            Records("/options/transport/congestion", "reno".into()),
        ),
        (
            &["--busy-poll", "10"],
            Records("/options/transport/busy_poll_us", 10.into()),
        ),
        (
            &["--zerocopy"],
            Records("/options/transport/zerocopy", true.into()),
        ),
        (
            &["--sqpoll"],
            Refused("--sqpoll does not apply to transport tcp (it takes --no-nodelay"),
        ),
        (
            &["-t", "unix", "--cork"],
            Refused("--cork does not apply to transport unix (it takes --sndbuf, --rcvbuf)"),
        ),
        (
            &["--preload-relayed"],
            Refused("--preload-relayed does not apply to transport tcp (it takes --no-nodelay"),
        ),
        (&["--warmup", "5"], Records("/options/warmup", 5.into())),
        (
            &["--timeout", "500ms"],
            Records("/options/io_timeout_ms", 500.into()),
        ),
        (
            &["--pin", "0,0"],
            Records("/options/placement/client_cpu", 0.into()),
        ),
        (&["--verify"], Records("/options/verify", true.into())),
        (
            &["--offset", "16"],
            Records("/options/transport/buffer_offset_bytes", 16.into()),
        ),
        (
            &["--align", "64", "--offset", "8"],
            Records("/options/transport/buffer_align_bytes", 64.into()),
        ),
        (
            &["--align", "3000"],
            Refused("--align 3000: must be a power of two"),
        ),
        (
            &["--align", "64", "--offset", "64"],
            Refused("--offset 64: must be below the alignment, 64 bytes"),
        ),
        (
            &["--offset", "1000000"],
            Refused("--offset 1000000: must be below the alignment"),
        ),
        (
            &["--ci", "90,50"],
            Records("/ci_target/confidence_pct", 90.0.into()),
        ),
        (&["-6"], Records("/options/peer", "embedded-ipv6".into())),
        (&["--ci-reps", "3,4"], Refused("--ci")),
        (
            &["--label", "run A"],
            Records("/stack/label", "run A".into()),
        ),
        (
            &["--label", ""],
            Refused("--label \"\": want 1 to 100 bytes"),
        ),
        (&["--key", "k"], Refused("--key needs --peer or --hosts")),
        // One agent has no second host for the client role.
        (
            &["--hosts", "127.0.0.1:1"],
            Refused("a point-to-point test needs two hosts"),
        ),
    ];
    if uring_available() {
        cases.push((
            &["-t", "uring", "--sqpoll"],
            Records("/options/transport/sqpoll", true.into()),
        ));
    }
    if xdp_available() {
        // Point-to-point tests run netgap's own flows, no program.
        cases.push((
            &["-t", "xdp", "--preload-relayed"],
            Refused(
                "on the relays (web, gather --responder gmond, pipeline --stages program), and",
            ),
        ));
    }
    cases
}

#[test]
fn every_flag_of_run_changes_a_point_to_point_record_or_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cmd = Command {
        words: vec!["run", "pingpong"],
        tiny: vec![
            ("-s", "1", &["--sizes"]),
            ("--reps", "2", &["--paper"]),
            ("--rep-time", "1ms", &["-n", "--iterations", "--paper"]),
        ],
        dir: dir.path(),
    };
    let mut cases = shared_point_to_point_cases();
    cases.extend([
        (&["-s", "64"][..], Records("/size_bytes", 64.into())),
        (&["--reps", "3"], Records("/options/reps", 3.into())),
        (&["-n", "10"], Records("/options/iterations", 10.into())),
        (
            &["--rep-time", "2ms"],
            Records("/options/rep_time_ms", 2.into()),
        ),
        (
            &["--ci", "99.9,0.0001", "--ci-reps", "3,4"],
            Len("/stats/reps", 4),
        ),
        (&["-n", "10", "--rep-time", "1ms"], Refused("--rep-time")),
        (&["--paper", "-n", "10"], Refused("--paper")),
        (
            &["--clients", "3"],
            Refused("--clients does not apply to pingpong"),
        ),
        (
            &["-P", "16"],
            Refused("--streams does not apply to pingpong"),
        ),
        (
            &["--links", "9"],
            Refused("--links does not apply to pingpong"),
        ),
        (
            &["--duration", "5s"],
            Refused("--duration does not apply to pingpong"),
        ),
        (
            &["--client-hosts", "2"],
            Refused("--client-hosts does not apply to pingpong"),
        ),
        (
            &["-6", "--peer", "127.0.0.1:1"],
            Refused("-6 does not apply to pingpong"),
        ),
        (
            &["--interleave", "-t", "tcp,unix"],
            Records("/options/interleaved/with", 2.into()),
        ),
        (
            &["--interleave"],
            Refused("--interleave does not apply to pingpong: it alternates"),
        ),
        (
            &["--interleave", "-t", "tcp,unix", "--ci", "90,50"],
            Refused("--ci does not apply to pingpong with --interleave"),
        ),
        (
            &["--conditions", "mtu=1500,9000"],
            Refused("conditions are set on netgap's testbed"),
        ),
        (
            &["--conditions", "mtu=1500,9000", "speed=1"],
            Refused("unknown condition key \"speed\""),
        ),
        (
            &["--conditions", "mtu=1500", "mtu=9000"],
            Refused("--conditions: condition key mtu is given twice"),
        ),
    ]);
    // --paper (10 repetitions of 100,000 iterations) takes seconds; the
    // plan's unit tests check what it resolves to.
    cmd.walk(&cases);
}

#[test]
fn every_flag_of_sweep_and_logp_changes_a_record_or_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sweep = Command {
        words: vec!["sweep", "--end", "1", "--perturbation", "0"],
        tiny: vec![("--trials", "2", &[]), ("--trial-time", "1ms", &[])],
        dir: dir.path(),
    };
    let mut cases = shared_point_to_point_cases();
    cases.extend([
        (&["--trials", "3"][..], Len("/stats/reps", 3)),
        (&["--stream"], Records("/sweep_kind", "stream".into())),
        (&["-s", "1"], Refused("unexpected argument '-s'")),
        (&["--reps", "2"], Refused("unexpected argument '--reps'")),
        (
            &["--rep-time", "1ms"],
            Refused("unexpected argument '--rep-time'"),
        ),
        (&["-n", "10"], Refused("unexpected argument '-n'")),
        (&["--paper"], Refused("unexpected argument '--paper'")),
        (
            &["--client-hosts", "2"],
            Refused("unexpected argument '--client-hosts'"),
        ),
        (&["--clients", "2"], Refused("--clients")),
    ]);
    sweep.walk(&cases);

    let logp = Command {
        words: vec!["logp"],
        tiny: vec![
            ("-s", "1", &["--sizes"]),
            ("--reps", "2", &["--paper"]),
            ("--rep-time", "1ms", &["-n", "--iterations", "--paper"]),
        ],
        dir: dir.path(),
    };
    let mut cases = shared_point_to_point_cases();
    cases.extend([
        (&["-s", "64"][..], Records("/size_bytes", 64.into())),
        (&["--reps", "3"], Records("/options/reps", 3.into())),
        (&["-n", "10"], Records("/options/iterations", 10.into())),
        (
            &["--rep-time", "2ms"],
            Records("/options/rep_time_ms", 2.into()),
        ),
        (
            &["--client-hosts", "2"],
            Refused("unexpected argument '--client-hosts'"),
        ),
        (&["--duration", "1s"], Refused("--duration")),
    ]);
    logp.walk(&cases);
}

#[test]
fn every_flag_of_a_multi_host_run_changes_its_record_or_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tiny: Vec<(&str, &str, &[&str])> = vec![
        ("--reps", "1", &["--paper"]),
        // Long enough that every client of a loaded machine completes a
        // round trip (a run where one did not is refused).
        ("--duration", "100ms", &[]),
        ("--client-hosts", "1", &["--hosts"]),
    ];
    let fanin = Command {
        words: vec!["run", "fanin"],
        tiny: tiny.clone(),
        dir: dir.path(),
    };
    fanin.walk(&[
        (&["--clients", "2"], Records("/clients", 2.into())),
        (&["--label", "x"], Records("/stack/label", "x".into())),
        (
            // Workload runs take conditions on a testbed only.
            &["--conditions", "mtu=9000"],
            Refused("conditions are set on netgap's testbed"),
        ),
        (
            &["--interleave", "-t", "tcp,udp"],
            Refused("--interleave does not apply to fanin"),
        ),
        (&["--client-hosts", "2"], Records("/client_hosts", 2.into())),
        (
            &["--duration", "150ms"],
            Records("/options/rep_time_ms", 150.into()),
        ),
        (&["--reps", "2"], Records("/options/reps", 2.into())),
        (&["-s", "1K"], Records("/size_bytes", 1024.into())),
        (&["-t", "udp"], Records("/transport", "udp".into())),
        (
            &["--timeout", "500ms"],
            Records("/options/io_timeout_ms", 500.into()),
        ),
        (
            &["--sndbuf", "64K"],
            Records("/options/transport/sndbuf_bytes", 65536.into()),
        ),
        (&["-P", "2"], Refused("--streams does not apply to fanin")),
        (
            &["--links", "2"],
            Refused("--links does not apply to fanin"),
        ),
        (
            &["--peer", "127.0.0.1:1"],
            Refused("--peer does not apply to fanin"),
        ),
        (&["-6"], Refused("-6 does not apply to fanin")),
        (
            &["-n", "10"],
            Refused("--iterations does not apply to fanin"),
        ),
        (
            &["--rep-time", "2ms"],
            Refused("--rep-time does not apply to fanin"),
        ),
        (
            &["--warmup", "5"],
            Refused("--warmup does not apply to fanin"),
        ),
        (&["--paper"], Refused("--paper does not apply to fanin")),
        (&["--ci", "90,50"], Refused("--ci does not apply to fanin")),
        (&["--pin", "0,0"], Refused("--pin does not apply to fanin")),
        (&["--verify"], Refused("--verify does not apply to fanin")),
        (&["--key", "k"], Refused("--key needs --peer or --hosts")),
        (
            &["--hosts", "127.0.0.1:1,127.0.0.1:2", "--client-hosts", "2"],
            Refused("--client-hosts does not apply to fanin"),
        ),
    ]);
    let multistream = Command {
        words: vec!["run", "multistream"],
        tiny: tiny.clone(),
        dir: dir.path(),
    };
    let mut cases: Vec<(&[&str], Expect)> = vec![
        (&["-P", "2"], Records("/clients", 2.into())),
        (
            &["--clients", "2"],
            Refused("--clients does not apply to multistream"),
        ),
        (&["--bidir"], Records("/options/bidir", true.into())),
        (
            &["--preload-relayed"],
            Refused("--preload-relayed does not apply to transport tcp (it takes --no-nodelay"),
        ),
    ];
    if xdp_available() {
        // Its roles are netgap's own: no program to ask.
        cases.push((
            &["-t", "xdp", "--preload-relayed"],
            Refused("--preload-relayed does not apply to this multistream point: it runs no programs under the preload library; it acts on web, gather --responder gmond, pipeline --stages program"),
        ));
    }
    multistream.walk(&cases);
    let multirail = Command {
        words: vec!["run", "multirail"],
        tiny: tiny.clone(),
        dir: dir.path(),
    };
    multirail.walk(&[
        (&["--links", "2"], Len("/links", 2)),
        (&["--links", "1,2"], Records("/clients", 1.into())),
        (&["--bidir"], Records("/options/bidir", true.into())),
    ]);
    let hotspot = Command {
        words: vec!["run", "hotspot"],
        tiny,
        dir: dir.path(),
    };
    hotspot.walk(&[
        (&["--clients", "2"], Records("/clients", 2.into())),
        (&["--cork"], Refused("--cork does not apply to hotspot")),
    ]);
}

#[test]
fn hosts_lists_and_hosts_files_drive_real_agents() {
    let agents: Vec<AgentProc> = (2..=3)
        .map(|i| AgentProc::start(&format!("127.0.0.{i}")))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let list = format!("{},{}", agents[0].addr, agents[1].addr);
    let hosts_file = dir.path().join("hosts.json");
    let file = serde_json::json!({
        "version": 1,
        "topology": "list",
        "hosts": [
            {"name": "h1", "control": agents[0].addr, "address": "127.0.0.2"},
            {"name": "h2", "control": agents[1].addr, "address": "127.0.0.3"},
        ]
    });
    std::fs::write(&hosts_file, file.to_string()).expect("hosts file written");
    let at_file = format!("@{}", hosts_file.display());
    let fanin = Command {
        words: vec!["run", "fanin"],
        tiny: vec![("--reps", "1", &[]), ("--duration", "20ms", &[])],
        dir: dir.path(),
    };
    fanin.walk(&[
        (
            &["--hosts", &list],
            Records("/options/peer", list.clone().into()),
        ),
        (
            &["--hosts", &at_file],
            Records("/options/peer", "hosts-file".into()),
        ),
    ]);
    let records = fanin.run(&["--hosts", &at_file]).expect("runs");
    assert_eq!(records[0]["flows"][0]["host"], "h2");
    // A point-to-point test over hosts runs both roles on their agents:
    // h1's serves, h2's plays the client (the `testbed` and `agent_pair`
    // modules do the same on a testbed's agents).
    let pingpong = Command {
        words: vec!["run", "pingpong"],
        tiny: vec![
            ("-s", "1", &[]),
            ("--reps", "2", &[]),
            ("--rep-time", "1ms", &[]),
        ],
        dir: dir.path(),
    };
    pingpong.walk(&[
        (
            &["--hosts", &at_file],
            Records("/options/peer", "agents: hosts-file".into()),
        ),
        (
            &["--hosts", &list],
            Records("/options/peer", format!("agents: {list}").into()),
        ),
    ]);
    let records = pingpong.run(&["--hosts", &at_file]).expect("runs");
    let b = &records[0]["bytes"];
    assert_eq!(b["client_tx"], b["server_rx"], "{b}");
    assert_eq!(b["server_tx"], b["client_rx"], "{b}");
}

#[test]
fn run_sweep_and_logp_drive_a_keyed_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = crate::common::new_key_file(dir.path(), "key");
    let key_arg = key.display().to_string();
    let agent = AgentProc::start_with("127.0.0.1", &["--key", &key_arg]);
    let commands = [
        Command {
            words: vec!["run", "pingpong"],
            tiny: vec![
                ("-s", "1", &[]),
                ("--reps", "2", &[]),
                ("--rep-time", "1ms", &[]),
            ],
            dir: dir.path(),
        },
        Command {
            words: vec!["sweep", "--end", "1", "--perturbation", "0"],
            tiny: vec![("--trials", "2", &[]), ("--trial-time", "1ms", &[])],
            dir: dir.path(),
        },
        Command {
            // Pinned, so logp's note about pinning stays out of stderr.
            words: vec!["logp", "--pin", "0,1"],
            tiny: vec![
                ("-s", "1", &[]),
                ("--reps", "2", &[]),
                ("--rep-time", "1ms", &[]),
            ],
            dir: dir.path(),
        },
    ];
    for cmd in &commands {
        let (stderr, argv) = cmd
            .run(&["--peer", &agent.addr])
            .expect_err("an unkeyed coordinator is refused");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{argv:?}: {stderr}");
        let records = cmd
            .run(&["--peer", &agent.addr, "--key", &key_arg])
            .unwrap_or_else(|(e, argv)| panic!("{argv:?}: {e}"));
        assert!(!records.is_empty(), "{:?}", cmd.words);
        for r in &records {
            assert_eq!(r["options"]["peer"], agent.addr.as_str(), "{r}");
        }
    }
}

#[test]
fn csv_output_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("r.csv");
    run_ok(
        netgap()
            .args([
                "run",
                "pingpong",
                "-s",
                "1",
                "--reps",
                "2",
                "--rep-time",
                "1ms",
                "--csv",
            ])
            .arg(&csv),
    );
    let text = std::fs::read_to_string(&csv).expect("csv written");
    assert_eq!(text.lines().count(), 2, "{text}");
}
