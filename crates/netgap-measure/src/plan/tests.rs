use super::peer::p2p_hosts;
use super::*;
use crate::cluster::{HostsArg, HostsSource};
use crate::conditions::ConditionAxis;
use crate::control::ControlAddr;
use crate::runner::{IterationPolicy, DEFAULT_CI_REPS};
use netgap_core::spec::{Mode, TransportOptions};
use netgap_transport::options::OptionValue;

fn req(test: &str) -> RunRequest {
    let mut r = RunRequest::new(&[test]);
    r.method.sizes = Some(vec![1]);
    r
}

fn err(r: &RunRequest) -> String {
    Plan::from_request(r).expect_err("refused").to_string()
}

fn option(flag: &str, value: OptionValue) -> OptionSetting {
    OptionSetting {
        decl: netgap_transport::options::find(flag).expect("declared"),
        value,
    }
}

#[test]
fn sizes_a_transport_cannot_carry_are_skipped_for_it_alone() {
    let mut r = req("pingpong");
    r.transport.transports = vec!["tcp".into(), "udp".into()];
    r.method.sizes = Some(vec![1, 1 << 20]);
    let p = Plan::from_request(&r).expect("valid");
    let points: Vec<(&str, u64)> = p
        .points
        .iter()
        .map(|s| (s.transport.as_str(), s.size_bytes))
        .collect();
    assert_eq!(points, [("tcp", 1), ("tcp", 1 << 20), ("udp", 1)]);
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(p.skipped[0].transport, "udp");
    assert_eq!(p.skipped[0].sizes_bytes, [1 << 20]);
    assert!(
        p.skipped[0].to_string().starts_with("udp carries at most ")
            && p.skipped[0].to_string().ends_with(": skipping 1M"),
        "{}",
        p.skipped[0]
    );
    // A size no transport of the run carries is refused.
    r.transport.transports = vec!["udp".into()];
    assert!(err(&r).contains("larger than the largest message transport udp"));
    // Nothing to skip: nothing said.
    r.transport.transports = vec!["tcp".into(), "unix".into()];
    assert!(Plan::from_request(&r).expect("valid").skipped.is_empty());
}

#[test]
fn the_main_job_interleaves_the_available_stacks_on_loopback() {
    let b = Plan::battery(PathBuf::from("x.jsonl"), None).expect("valid");
    let p = &b.plan;
    let stacks: std::collections::BTreeSet<&str> =
        p.points.iter().map(|s| s.transport.as_str()).collect();
    assert_eq!(stacks.len() + b.unavailable.len(), BATTERY_TRANSPORTS.len());
    assert!(
        stacks.contains("tcp") && stacks.contains("unix"),
        "{stacks:?}"
    );
    assert!(p.settings.interleave);
    assert!(
        matches!(p.settings.peer, Peer::Embedded { ipv6: false }),
        "{:?}",
        p.settings.peer
    );
    // udp leaves out the size it cannot carry, and says so.
    assert!(!p
        .points
        .iter()
        .any(|s| s.transport == "udp" && s.size_bytes > 65_536));
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(p.skipped[0].transport, "udp");
    // Pinned apart where the process may use two CPUs.
    if netgap_transport::affinity::allowed_cpus().len() >= 2 {
        assert!(p.settings.client_cpu.is_some());
        assert_ne!(p.settings.client_cpu, p.settings.server_cpu);
    }
    let b = Plan::battery(PathBuf::from("x.jsonl"), Some(2)).expect("valid");
    assert_eq!(b.plan.settings.method.reps, 2);
}

#[test]
fn unknown_names_are_refused_with_the_list() {
    let e = err(&req("pingpnog"));
    assert!(
        e.contains("unknown test \"pingpnog\"") && e.contains("pingpong"),
        "{e}"
    );
    let mut r = req("pingpong");
    r.transport.transports = vec!["carrier-pigeon".into()];
    assert!(err(&r).contains("unknown transport"));
}

#[test]
fn size_zero_and_oversize_are_refused() {
    let mut r = req("pingpong");
    r.method.sizes = Some(vec![0]);
    assert!(err(&r).contains("out of range"));
    r.method.sizes = Some(vec![1 << 30]);
    assert!(err(&r).contains("out of range"));
}

#[test]
fn pin_and_paper_resolve() {
    let mut r = req("pingpong");
    r.method.pin = Some(Pin {
        client_cpu: 0,
        server_cpu: 1,
    });
    r.method.paper = true;
    let p = Plan::from_request(&r).expect("valid");
    assert_eq!(p.settings.client_cpu, Some(0));
    assert_eq!(p.points[0].server_cpu, Some(1));
    assert_eq!(
        p.settings.method.iterations,
        IterationPolicy::Fixed(PAPER_ITERATIONS)
    );
    r.method.pin = Some(Pin {
        client_cpu: 1 << 20,
        server_cpu: 0,
    });
    assert!(err(&r).contains("--pin"));
}

#[test]
fn peer_forms_resolve() {
    assert_eq!(
        resolve_peer("127.0.0.1").map(|a| a.port()).ok(),
        Some(DEFAULT_PORT)
    );
    assert_eq!(resolve_peer("127.0.0.1:9").map(|a| a.port()).ok(), Some(9));
    assert_eq!(resolve_peer("::1").map(|a| a.is_ipv6()).ok(), Some(true));
    assert_eq!(resolve_peer("[::1]:9").map(|a| a.port()).ok(), Some(9));
    assert!(resolve_peer("no such host.invalid").is_err());
    assert!(matches!(
        PeerAddr::parse("unix:/tmp/a.sock").map(|p| p.addr),
        Ok(ControlAddr::Unix(_))
    ));
}

#[test]
fn sizes_above_a_transports_largest_message_are_refused() {
    let mut r = req("pingpong");
    r.transport.transports = vec!["udp".into()];
    r.method.sizes = Some(vec![1, 60 * 1024]);
    assert!(Plan::from_request(&r).is_ok());
    r.method.sizes = Some(vec![1, 100 * 1024]);
    let e = err(&r);
    assert!(
        e.contains("100K") && e.contains("udp") && e.contains("65483 bytes"),
        "{e}"
    );
}

#[test]
fn ci_targets_check_their_bounds() {
    let mut m = MethodSpec {
        ci: Some(CiSpec {
            confidence_pct: 99.0,
            half_width_pct: 2.0,
        }),
        ..MethodSpec::default()
    };
    let t = ci_target(m.ci, m.ci_reps).expect("valid").expect("some");
    assert_eq!((t.confidence_pct, t.half_width_pct), (99.0, 2.0));
    assert_eq!((t.min_reps, t.max_reps), DEFAULT_CI_REPS);
    assert!(ci_target(None, None).expect("valid").is_none());
    for (level, width, reps) in [
        (99.0, 2.0, (1, 30)),
        (100.0, 2.0, (3, 30)),
        (99.0, 2.0, (9, 3)),
        (99.0, 0.0, (3, 30)),
        (99.0, 2.0, (3, MAX_REPS + 1)),
    ] {
        m.ci = Some(CiSpec {
            confidence_pct: level,
            half_width_pct: width,
        });
        m.ci_reps = Some(reps);
        assert!(
            ci_target(m.ci, m.ci_reps).is_err(),
            "{level} {width} {reps:?}"
        );
    }
}

#[test]
fn unix_is_refused_for_a_remote_peer() {
    let mut r = req("pingpong");
    r.transport.transports = vec!["unix".into()];
    r.target.peer = Some(PeerAddr {
        label: "192.0.2.1".into(),
        addr: ControlAddr::Tcp("192.0.2.1:7100".parse().expect("addr")),
    });
    assert!(err(&r).contains("one host"));
}

#[test]
fn an_option_a_transport_ignores_is_refused() {
    let mut r = req("pingpong");
    r.transport.transports = vec!["unix".into()];
    r.transport.options = vec![option("cork", OptionValue::Switch)];
    let e = err(&r);
    assert!(
        e.contains("--cork does not apply to transport unix (it takes --sndbuf, --rcvbuf)"),
        "{e}"
    );
    r.transport.transports = vec!["tcp".into()];
    let p = Plan::from_request(&r).expect("tcp corks");
    assert!(p.points[0].options.cork);
    r.transport.transports = vec!["shm".into()];
    r.transport.options = vec![option("sndbuf", OptionValue::Number(64 * 1024))];
    assert!(err(&r).contains("takes no options"));
    r.transport.transports = vec!["tcp".into()];
    r.transport.options = vec![option("sndbuf", OptionValue::Number(0))];
    assert!(err(&r).contains("--sndbuf 0: must be between"));
}

#[test]
fn preload_relayed_is_refused_off_xdp_and_for_netgap_s_own_flows() {
    let mut r = req("pingpong");
    r.transport.options = vec![option("preload-relayed", OptionValue::Switch)];
    let e = err(&r);
    assert!(
        e.starts_with("--preload-relayed does not apply to transport tcp"),
        "{e}"
    );
    // Over xdp (where this build and host have it), a point-to-point
    // test has no program to ask.
    if netgap_transport::find("xdp").is_some_and(|t| t.availability().is_ok()) {
        r.transport.transports = vec!["xdp".into()];
        assert_eq!(
            err(&r),
            "--preload-relayed does not apply to pingpong: it keeps the connections of the programs a workload runs under the preload library on the relays (web, gather --responder gmond, pipeline --stages program), and pingpong runs netgap's own flows"
        );
    }
}

#[test]
fn flags_of_multi_host_tests_are_refused_for_point_to_point_tests() {
    let mut r = req("pingpong");
    r.multi_host.clients = Some(vec![3]);
    let e = err(&r);
    assert!(e.starts_with("--clients does not apply to pingpong"), "{e}");
    let mut r = req("pingpong");
    r.multi_host.duration = Some(Duration::from_secs(5));
    assert!(err(&r).starts_with("--duration does not apply"));
    let mut r = req("stream");
    r.target.ipv6 = true;
    r.target.peer = PeerAddr::parse("127.0.0.1").ok();
    assert!(err(&r).starts_with("-6 does not apply"));
}

#[test]
fn labels_are_checked_and_kept() {
    let mut r = req("pingpong");
    r.outputs.label = Some(" kernel 6.8 ".into());
    assert_eq!(
        Plan::from_request(&r)
            .expect("valid")
            .settings
            .label
            .as_deref(),
        Some("kernel 6.8")
    );
    for bad in ["", "  ", "a\nb", &"x".repeat(MAX_LABEL_BYTES + 1)] {
        r.outputs.label = Some(bad.to_string());
        assert!(err(&r).starts_with("--label"), "{bad:?}");
    }
}

/// A testbed's hosts file in `dir`, with or without its name and
/// conditions.
fn testbed_file(dir: &std::path::Path, named: bool) -> HostsArg {
    let host = |n: u32| {
        serde_json::json!({
            "name": format!("h{n}"), "control": format!("unix:/tmp/h{n}.sock"),
            "address": format!("10.77.0.{n}"), "netns": format!("ngtb-t-h{n}"),
        })
    };
    let mut file = serde_json::json!({
        "version": 1, "topology": "switch", "hosts": [host(1), host(2)],
    });
    if named {
        file["testbed"] = "t".into();
        file["conditions"] = serde_json::json!({"mtu_bytes": 1500, "offload": true});
    }
    let path = dir.join(format!("hosts-{named}.json"));
    std::fs::write(&path, file.to_string()).expect("written");
    HostsArg::File {
        path,
        testbed: false,
    }
}

#[test]
fn a_point_to_point_run_over_hosts_places_both_roles_on_the_first_two_agents() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A testbed's hosts, namespaces and all: their agents play both
    // roles, whoever runs netgap.
    let file = testbed_file(dir.path(), false).load().expect("hosts");
    let (peer, _) = p2p_hosts(file).expect("placed");
    let Peer::Agents {
        hosts: HostsSource::File(f),
    } = &peer
    else {
        panic!("{peer:?}");
    };
    let names: Vec<&str> = f.hosts.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["h1", "h2"]);
    // A list of agents: its first two.
    let three = HostsArg::parse("127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")
        .and_then(|a| a.load())
        .expect("list");
    let (peer, key) = p2p_hosts(three).expect("placed");
    assert!(key.is_none());
    let Peer::Agents { hosts } = &peer else {
        panic!("{peer:?}");
    };
    assert_eq!(hosts.label(), "127.0.0.1:7101,127.0.0.1:7102");
    let one = HostsArg::parse("127.0.0.1:7101")
        .and_then(|a| a.load())
        .expect("list");
    let e = p2p_hosts(one).err().map(|e| e.to_string());
    assert!(
        e.as_deref().is_some_and(|e| e.contains("needs two hosts")),
        "{e:?}"
    );
}

#[test]
fn conditions_need_a_testbed_and_a_fixed_repetition_count() {
    let axes = || {
        vec![
            ConditionAxis::parse("mtu=1500,9000").expect("axis"),
            ConditionAxis::parse("offload=on,off").expect("axis"),
        ]
    };
    let mut r = req("stream");
    r.interleaving.conditions = axes();
    assert!(err(&r).contains("conditions are set on netgap's testbed"));
    let dir = tempfile::tempdir().expect("tempdir");
    r.target.hosts = Some(testbed_file(dir.path(), false));
    assert!(err(&r).contains("names no testbed"), "{}", err(&r));
    r.target.hosts = Some(testbed_file(dir.path(), true));
    let p = Plan::from_request(&r).expect("valid");
    assert_eq!(p.settings.conditions.len(), 4);
    assert_eq!(p.settings.testbed_name.as_deref(), Some("t"));
    let tb = p.settings.testbed.expect("testbed facts");
    assert_eq!(tb.topology, "switch");
    assert_eq!(tb.conditions.map(|c| c.mtu_bytes), Some(1500));
    r.method.ci = Some(CiSpec {
        confidence_pct: 90.0,
        half_width_pct: 5.0,
    });
    assert!(err(&r).starts_with("--ci does not apply to stream with --conditions"));
}

#[test]
fn interleave_needs_several_stacks() {
    let mut r = req("pingpong");
    r.interleaving.interleave = true;
    assert!(err(&r).starts_with("--interleave does not apply to pingpong"));
    r.transport.modes = vec![Mode::Event, Mode::Poll];
    let p = Plan::from_request(&r).expect("two modes are two stacks");
    assert!(p.settings.interleave && p.settings.conditions.is_empty());
}

#[test]
fn defaults_are_the_documented_ones() {
    let p = Plan::from_request(&RunRequest::new(&["pingpong"])).expect("valid");
    let sizes: Vec<u64> = p.points.iter().map(|s| s.size_bytes).collect();
    assert_eq!(sizes, DEFAULT_SIZES_BYTES);
    assert_eq!(p.settings.method.reps, DEFAULT_REPS);
    assert_eq!(
        p.settings.method.iterations,
        IterationPolicy::Budget(DEFAULT_REP_TIME)
    );
    assert_eq!(p.points[0].io_timeout_ms, 3000);
    assert_eq!(p.points[0].options, TransportOptions::default());
}

#[test]
fn pins_and_counts_that_do_not_parse_name_their_cause() {
    assert_eq!(Pin::parse(" a,1"), Err(PinError::NotACpu(" a".into())));
    assert_eq!(Pin::parse("1,2,3"), Err(PinError::Shape));
    assert_eq!(
        Pin::parse("x").map_err(|e| e.to_string()),
        Err("\"x\" is not a CPU number".to_string())
    );
    assert_eq!(parse_counts("1,x"), Err(CountsError::NotACount("x".into())));
    assert_eq!(parse_counts(" , "), Err(CountsError::Empty));
    assert_eq!(parse_counts("2, ,3"), Ok(vec![2, 3]));
}
