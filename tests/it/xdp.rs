//! The `xdp` transport (AF_XDP, user-level networking) between two hosts of
//! a namespace testbed: every point-to-point test in both modes with
//! `--verify` (the conformance matrix for a transport that needs two
//! hosts), then the same with 1% of the frames dropped on the link,
//! still verified, with the retransmissions counted in the records.
//!
//! Loss: `netgap testbed set --loss 1%`, applied where the testbed shapes
//! its links, in the switch's namespace (netem at the ports toward the
//! hosts, or where the kernel lacks netem an nftables random drop in the
//! bridge's forward hook), which every frame between two hosts crosses,
//! raw Ethernet frames included: an AF_XDP socket's own transmissions
//! bypass the sending host's qdiscs, so a loss in a host's stack would not
//! touch them.
//!
//! A third test forges frames from the switch's namespace during a
//! verified run (`forged_frames_from_the_switch_neither_corrupt_nor_end_a_flow`):
//! it watches the flows' real frames on the bridge's ports and sends frames
//! shaped like them, with the right addresses, flow ids and sequence
//! numbers (and numbers counted from 0), but without the flow's key:
//! data, FINs and acknowledgments. The run must still complete with every
//! byte verified.
//!
//! A fourth runs `multirail` over xdp across a three-link mesh
//! (`multirail_over_xdp_takes_each_link_of_a_mesh`): one AF_XDP flow per
//! link, each on its own link's interface. A fifth runs `multistream`,
//! `fanin` and `fanout` over xdp across a shaped three-host mesh
//! (`bandwidth_workloads_over_xdp_take_each_clients_link_of_a_mesh`): each
//! client's frames on its own link, fan-in's limit the sum of two links;
//! `pipeline` over xdp on that mesh is refused in one line. A sixth
//! (`xdp_runs_between_agents_whose_control_connections_share_its_interface`)
//! runs pingpong and stream over xdp, then over tcp, between agents
//! controlled over TCP on the one interface the xdp flows take, as on a
//! cluster whose nodes have one interface.
//!
//! Built only with the `xdp` feature (`cargo test --features xdp --test it
//! xdp::`); without root and namespaces it prints why and passes (with
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 a missing testbed is a failure, as in CI).

use crate::common::testbed::{link_bytes, Testbed};
use crate::common::{netgap, ok, system_ready, AgentProc};
use netgap::bench;
use serde_json::Value;
use std::process::Command;

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Retransmissions both ends counted in a record.
fn retries(r: &Value) -> u64 {
    n(&r["datagrams"]["client"]["retries"]) + n(&r["datagrams"]["server"]["retries"])
}

/// Runs `tests` over xdp in both modes with `--verify`; the records.
fn run_verified(tb: &Testbed, tests: &str, sizes: &str, json: &std::path::Path) -> Vec<Value> {
    tb.run(
        tests,
        &[
            "-t",
            "xdp",
            "--mode",
            "event,poll",
            "--sizes",
            sizes,
            "--reps",
            "2",
            "--rep-time",
            "10ms",
            "--verify",
        ],
        json,
    )
}

fn check_records(recs: &[Value], tests: usize, sizes: usize) {
    assert_eq!(
        recs.len(),
        tests * 2 * sizes,
        "one record per test, mode and size"
    );
    for r in recs {
        assert_eq!(r["transport"], "xdp", "{r}");
        assert_eq!(r["options"]["verify"], true, "{r}");
        // Where the program attached (native or generic XDP) sets the
        // stack apart, so the record says which.
        let choices: Vec<&str> = r["stack"]["options"]
            .as_array()
            .expect("stack options")
            .iter()
            .filter_map(|o| o.as_str())
            .filter(|o| o.starts_with("xdp_attach="))
            .collect();
        assert!(
            choices == ["xdp_attach=native"] || choices == ["xdp_attach=generic"],
            "{r}"
        );
        let b = &r["bytes"];
        assert_eq!(b["client_tx"], b["server_rx"], "{r}");
        assert_eq!(b["server_tx"], b["client_rx"], "{r}");
        // The flow's frame counters are in the record, and nothing was
        // given up as lost: the transport is reliable.
        let d = &r["datagrams"];
        assert!(n(&d["client"]["datagrams_sent"]) > 0, "{r}");
        assert_eq!(
            n(&d["client"]["lost_bytes"]) + n(&d["server"]["lost_bytes"]),
            0
        );
    }
}

#[test]
fn every_test_runs_over_xdp_between_two_hosts_verified_with_and_without_loss() {
    let name = "every_test_runs_over_xdp_between_two_hosts_verified_with_and_without_loss";
    if !system_ready(name) {
        return;
    }
    let list = ok(netgap().arg("list").output().expect("list"));
    let row: Vec<&str> = list
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&"xdp"))
        .expect("xdp listed");
    assert_eq!(row.get(1), Some(&"yes"), "{list}");

    // Without two hosts it refuses in one line.
    let out = netgap()
        .args(["run", "pingpong", "-t", "xdp", "--reps", "1"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("between two hosts"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let (tb, _) = Testbed::up("xdp2", &["--hosts", "2"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let tests: Vec<&str> = bench::registry().iter().map(|t| t.name()).collect();
    // One byte, a message of three frames, and one of hundreds.
    let recs = run_verified(
        &tb,
        &tests.join(","),
        "1,4K,256K",
        &dir.path().join("clean.jsonl"),
    );
    check_records(&recs, tests.len(), 3);

    // 1% of the frames crossing the bridge dropped, both ways, by the
    // testbed's own loss (netem at the switch's ports, or nftables there
    // where the kernel has no netem).
    ok(netgap()
        .args(["testbed", "set", "--name", "xdp2", "--loss", "1%"])
        .output()
        .expect("testbed set"));
    let by = tb
        .hosts()
        .conditions
        .and_then(|c| c.loss_by)
        .expect("the loss's mechanism")
        .as_str();
    let lossy = "pingpong,stream,bibw,bibw-pingpong";
    let recs = run_verified(&tb, lossy, "1,64K", &dir.path().join("lossy.jsonl"));
    check_records(&recs, 4, 2);
    for r in &recs {
        assert_eq!(r["stack"]["path"]["loss_ppm"], 10_000, "{r}");
        assert_eq!(r["stack"]["path"]["loss_by"], by, "{r}");
    }
    if by == "nftables" {
        let ruleset = ok(Command::new("ip")
            .args(["netns", "exec", &tb.ns("sw"), "nft"])
            .args(["list", "table", "bridge", "netgap"])
            .output()
            .expect("nft"));
        let dropped: u64 = ruleset
            .split("packets ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .expect("the rule's counter");
        assert!(dropped > 0, "the bridge dropped nothing: {ruleset}");
    }
    let resent: u64 = recs.iter().map(retries).sum();
    assert!(
        resent > 0,
        "1% of the frames dropped ({by}), but no retransmission was counted"
    );
    let _ = tb.down();
    tb.assert_gone();
}

/// Frames forged during a run, by what they claimed to be.
#[derive(Debug, Default, Clone, Copy)]
struct Forged {
    /// Real frames of keyed flows seen on the ports.
    seen: u64,
    /// Data frames at the receiver's next sequence numbers.
    data: u64,
    /// FINs at the receiver's next sequence number.
    fins: u64,
    /// Acknowledgments of everything the sender has in flight.
    acks: u64,
    /// FINs and data numbered from 0, as a blind guess would go.
    blind: u64,
}

/// A raw packet socket in the calling thread's network namespace, bound
/// to interface `ifname`.
fn packet_socket(ifname: &str) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: socket() with constant arguments; the result is checked and
    // owned at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname).expect("interface name");
    // SAFETY: `name` is a live NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(index > 0, "no interface {ifname}");
    // SAFETY: sockaddr_ll is plain data; all zeros is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as i32;
    use std::os::fd::AsRawFd;
    // SAFETY: binds our socket to a live sockaddr_ll of the size given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: sets a receive timeout from a live timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast::<libc::c_void>(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    fd
}

/// Watches the ports `ports` of the switch namespace `sw` until `stop`,
/// and for every few real frames of a keyed flow forges frames at both of
/// its ends; what it forged.
fn forge_until(sw: &str, ports: &[String], stop: &std::sync::atomic::AtomicBool) -> Forged {
    use netgap::transport::xdp::reliable::{
        parse, write_headers, Header, Kind, Mac, ETH_HEADER_BYTES, FIELDS_BYTES,
        FRAME_OVERHEAD_BYTES,
    };
    use std::collections::HashMap;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;

    let ns = std::fs::File::open(format!("/run/netns/{sw}")).expect("switch namespace");
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    // One socket per port to watch, one to send on: the port a host hangs
    // off, so a forged frame goes straight to it (and the bridge does not
    // learn its spoofed source address).
    let watch: Vec<_> = ports.iter().map(|p| packet_socket(p)).collect();
    let send: Vec<_> = ports.iter().map(|p| packet_socket(p)).collect();
    // Which port each host's MAC hangs off, learnt from what it sends.
    let mut port_of: HashMap<Mac, usize> = HashMap::new();
    let mut out = Forged::default();
    let mut blind_seq = 0u32;
    let mut buf = vec![0u8; 16 * 1024];
    let tx = |port: usize, frame: &[u8]| {
        // SAFETY: sends from a live buffer of the length given on our
        // bound socket.
        let n = unsafe {
            libc::send(
                send[port].as_raw_fd(),
                frame.as_ptr().cast::<libc::c_void>(),
                frame.len(),
                0,
            )
        };
        n == frame.len() as isize
    };
    let forge = |dst: &Mac, src: &Mac, h: &Header, payload: &[u8]| {
        let mut f = vec![0u8; FRAME_OVERHEAD_BYTES + payload.len()];
        let n = write_headers(&mut f, dst, src, h);
        f[FRAME_OVERHEAD_BYTES..n].copy_from_slice(payload);
        // A tag of ones: not zeros, not the flow's.
        f[ETH_HEADER_BYTES + FIELDS_BYTES..FRAME_OVERHEAD_BYTES].fill(0xff);
        f
    };
    let mut fds: Vec<libc::pollfd> = watch
        .iter()
        .map(|w| libc::pollfd {
            fd: w.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut frames = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: `fds` is a live array of as many pollfd structs as given.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        frames.clear();
        for (port, w) in watch.iter().enumerate() {
            loop {
                // SAFETY: sockaddr_ll is plain data; all zeros is valid.
                let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                // SAFETY: receives into a live buffer of its length, and
                // the sender's address into a live sockaddr_ll of the size
                // given.
                let n = unsafe {
                    libc::recvfrom(
                        w.as_raw_fd(),
                        buf.as_mut_ptr().cast::<libc::c_void>(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                        (&raw mut from).cast::<libc::sockaddr>(),
                        &raw mut from_len,
                    )
                };
                let Ok(n) = usize::try_from(n) else { break };
                // Each frame between the hosts enters the switch at one
                // port and leaves at the other: it is taken where it
                // enters, so the port a MAC hangs off is the one it came
                // in on.
                if from.sll_pkttype != libc::PACKET_OUTGOING {
                    frames.push((port, buf[..n].to_vec()));
                }
            }
        }
        for (port, frame) in &frames {
            let (port, frame) = (*port, &frame[..]);
            let Ok(p) = parse(frame) else { continue };
            let tag = &frame[ETH_HEADER_BYTES + FIELDS_BYTES..FRAME_OVERHEAD_BYTES];
            // Frames of ours (a tag of ones) and frames of flows not keyed
            // yet (zeros: the opening and the proof, which no key
            // protects) are left alone.
            if tag.iter().all(|&b| b == 0xff) || tag.iter().all(|&b| b == 0) {
                continue;
            }
            port_of.insert(p.src, port);
            let h = p.header;
            if h.kind != Kind::Data || p.payload.len() < 1000 {
                continue;
            }
            out.seen += 1;
            if out.seen % 4 != 0 {
                continue;
            }
            let mut dst = [0u8; 6];
            dst.copy_from_slice(&frame[0..6]);
            let Some(&to_receiver) = port_of.get(&dst) else {
                continue;
            };
            let to_sender = port;
            // To the receiver, as the sender: data and a FIN at the next
            // numbers, and numbers from 0.
            let as_sender = |kind, seq, len: u16| Header {
                kind,
                len,
                seq,
                ..h
            };
            let junk = vec![0xee; p.payload.len()];
            for k in 1..=2u32 {
                let f = forge(
                    &dst,
                    &p.src,
                    &as_sender(Kind::Data, h.seq.wrapping_add(k), h.len),
                    &junk,
                );
                out.data += u64::from(tx(to_receiver, &f));
            }
            let f = forge(
                &dst,
                &p.src,
                &as_sender(Kind::Fin, h.seq.wrapping_add(1), 0),
                &[],
            );
            out.fins += u64::from(tx(to_receiver, &f));
            for kind in [Kind::Fin, Kind::Data] {
                let len = if kind == Kind::Data { h.len } else { 0 };
                let payload = if kind == Kind::Data {
                    &junk[..]
                } else {
                    &[][..]
                };
                let f = forge(&dst, &p.src, &as_sender(kind, blind_seq, len), payload);
                out.blind += u64::from(tx(to_receiver, &f));
                blind_seq = blind_seq.wrapping_add(1);
            }
            // To the sender, as the receiver: everything in flight
            // acknowledged, and the receiver's stream ended at the number
            // the sender expects next.
            let as_receiver = |kind, seq, ack| Header {
                kind,
                len: 0,
                dst_flow: h.src_flow,
                src_flow: h.dst_flow,
                seq,
                ack,
                credit: ack.wrapping_add(1000),
                sack: 0,
            };
            let f = forge(
                &p.src,
                &dst,
                &as_receiver(Kind::Ack, 0, h.seq.wrapping_add(1)),
                &[],
            );
            out.acks += u64::from(tx(to_sender, &f));
            let f = forge(
                &p.src,
                &dst,
                &as_receiver(Kind::Fin, h.ack, h.seq.wrapping_add(1)),
                &[],
            );
            out.fins += u64::from(tx(to_sender, &f));
        }
    }
    out
}

#[test]
fn forged_frames_from_the_switch_neither_corrupt_nor_end_a_flow() {
    let name = "forged_frames_from_the_switch_neither_corrupt_nor_end_a_flow";
    if !system_ready(name) {
        return;
    }
    let (tb, _) = Testbed::up("xdpf", &["--hosts", "2"]);
    let ports: Vec<String> = tb.hosts().hosts.iter().map(|h| h.name.clone()).collect();
    let sw = tb.ns("sw");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let tests = "stream,pingpong,bibw";
    /// Stops the forger when the run ends, even by a panic (the scope
    /// joins the forger before the panic goes on).
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let (recs, forged) = std::thread::scope(|s| {
        let forger = s.spawn(|| forge_until(&sw, &ports, &stop));
        let stopper = StopOnDrop(&stop);
        let recs = tb.run(
            tests,
            &[
                "-t",
                "xdp",
                "--mode",
                "event,poll",
                "--sizes",
                "64K,1M",
                "--reps",
                "3",
                "--rep-time",
                "50ms",
                "--verify",
            ],
            &dir.path().join("forged.jsonl"),
        );
        drop(stopper);
        (recs, forger.join().expect("the forger"))
    });
    eprintln!("{forged:?}");
    check_records(&recs, 3, 2);
    assert!(forged.seen > 0, "no frame of a keyed flow was seen");
    for (what, n) in [
        ("data", forged.data),
        ("FIN", forged.fins),
        ("acknowledgment", forged.acks),
        ("blind", forged.blind),
    ] {
        assert!(n > 0, "no forged {what} frame went out: {forged:?}");
    }
    // The records say the ports dropped frames while they ran: the forged
    // ones that reached them.
    let dropped: u64 = recs
        .iter()
        .map(|r| n(&r["datagrams"]["client"]["dropped"]) + n(&r["datagrams"]["server"]["dropped"]))
        .sum();
    assert!(dropped > 0, "no record counts a dropped frame");
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn multirail_over_xdp_takes_each_link_of_a_mesh() {
    if !system_ready("multirail_over_xdp_takes_each_link_of_a_mesh") {
        return;
    }
    let (tb, _) = Testbed::up(
        "xdpmr",
        &["--hosts", "2", "--topology", "mesh", "--links", "3"],
    );
    let hosts = tb.hosts();
    let (server, client) = (&hosts.hosts[0], &hosts.hosts[1]);
    let rails: Vec<_> = client.links_to(&server.name).cloned().collect();
    assert_eq!(rails.len(), 3);
    let before: Vec<u64> = rails
        .iter()
        .map(|l| link_bytes(&tb.ns(&client.name), &l.ifname))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "multirail",
        &["-t", "xdp", "--reps", "1", "--duration", "300ms"],
        &dir.path().join("mr.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r["transport"], "xdp");
    let links = r["links"].as_array().expect("links");
    assert_eq!(links.len(), 3, "{r}");
    for (k, (l, rail)) in links.iter().zip(&rails).enumerate() {
        assert_eq!(l["local"], rail.local.to_string().as_str(), "{l}");
        assert_eq!(l["remote"], rail.remote.to_string().as_str(), "{l}");
        let payload = n(&l["bytes"]);
        assert!(payload > 0, "link {k} carried nothing: {l}");
        // The link's own interface carried the frames of its flow: at
        // least the payload the record counts on it.
        let moved = link_bytes(&tb.ns(&client.name), &rail.ifname) - before[k];
        assert!(
            moved >= payload,
            "link {k} ({}) moved {moved} bytes < payload {payload}",
            rail.ifname
        );
    }
    let _ = tb.down();
    tb.assert_gone();
}

/// multistream, fanin and fanout over xdp on a three-host mesh whose links
/// are shaped: the server listens for each flow on its end of the link from
/// that flow's client host, so every client's frames cross its own link,
/// and fan-in's and fan-out's payload limit is the sum of two links (for
/// xdp's framing), which no result passes.
#[test]
fn bandwidth_workloads_over_xdp_take_each_clients_link_of_a_mesh() {
    if !system_ready("bandwidth_workloads_over_xdp_take_each_clients_link_of_a_mesh") {
        return;
    }
    let (tb, _) = Testbed::up(
        "xdpfan",
        &["--hosts", "3", "--topology", "mesh", "--rate", "100M"],
    );
    let hosts = tb.hosts();
    let server = &hosts.hosts[0];
    let clients = &hosts.hosts[1..];
    let link_of = |h: &netgap::cluster::HostEntry| {
        h.links_to(&server.name)
            .next()
            .expect("a link to the server")
            .clone()
    };
    let before: Vec<u64> = clients
        .iter()
        .map(|h| link_bytes(&tb.ns(&h.name), &link_of(h).ifname))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "multistream,fanin,fanout",
        &["-t", "xdp", "-P", "2", "--reps", "1", "--duration", "500ms"],
        &dir.path().join("fan.jsonl"),
    );
    assert_eq!(recs.len(), 3, "{recs:?}");
    let limit = |r: &Value| r["physics"]["payload_limit_gbps"].as_f64().expect("limit");
    let one_link = limit(&recs[0]);
    for r in &recs {
        assert_eq!(r["transport"], "xdp", "{r}");
        // The frames each end sent and took are in the record.
        let d = &r["datagrams"];
        assert!(
            n(&d["client"]["datagrams_sent"]) > 0 && n(&d["server"]["datagrams_sent"]) > 0,
            "{r}"
        );
        let (value, cap) = (r["value"].as_f64().expect("value"), limit(r));
        // Past the limit only by a shaper's burst, and never a fault.
        assert!(
            value > 0.0 && value <= cap * 1.05,
            "{} {value} past {cap}",
            r["test"]
        );
        assert!(r["physics"].get("fault").is_none_or(Value::is_null), "{r}");
    }
    // One client host's two streams share its link; fan-in's and
    // fan-out's two clients have a link each.
    assert!(one_link < 0.1 && one_link > 0.09, "{one_link}");
    for r in &recs[1..] {
        let cap = limit(r);
        assert!((cap - 2.0 * one_link).abs() < 1e-9, "{} {cap}", r["test"]);
    }
    // Each client host's link carried at least the payload its flows moved.
    for (k, h) in clients.iter().enumerate() {
        let payload: u64 = recs
            .iter()
            .flat_map(|r| r["flows"].as_array().expect("flows").iter())
            .filter(|f| f["host"] == h.name.as_str())
            .map(|f| n(&f["bytes_tx"]).max(n(&f["bytes_rx"])))
            .sum();
        assert!(payload > 0, "{} moved nothing", h.name);
        let moved = link_bytes(&tb.ns(&h.name), &link_of(h).ifname) - before[k];
        assert!(
            moved >= payload,
            "{}: link moved {moved} < payload {payload}",
            h.name
        );
    }
    // A staged workload's later stages reach an earlier one only over the
    // link between them, which an xdp listener on one interface cannot
    // serve for both: refused in one line, before any traffic.
    crate::common::fails_with_one_line(
        &[
            "run",
            "pipeline",
            "-t",
            "xdp",
            "--hosts",
            &tb.hosts_arg(),
            "--reps",
            "1",
        ],
        "needs a switch testbed",
    );
    let _ = tb.down();
    tb.assert_gone();
}

/// `netgap serve` in testbed host `host`'s namespaces (its own UTS
/// namespace named after it, as a cluster node's), listening on TCP on
/// `addr`, the host's one interface; killed on drop.
fn tcp_agent(tb: &Testbed, host: &str, addr: &str, key: &std::path::Path) -> AgentProc {
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &tb.ns(host),
            "unshare",
            "--uts",
            "sh",
            "-c",
        ])
        .arg(format!(
            "hostname {host} && exec \"$0\" serve --bind {addr} --port 0 --key \"$1\""
        ))
        .arg(crate::common::netgap_path())
        .arg(key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("agent starts");
    let addr = crate::common::agent_addr(&mut child);
    AgentProc { child, addr }
}

/// The bug this pins: libxdp's default program took every frame of the
/// port's queue, TCP and ARP too, so a client agent whose control
/// connection shared its interface with its xdp flows went silent
/// ("its agent went silent (no answer within 8s)") and stayed deaf for
/// its session's deadline. Here both agents are reached over TCP on
/// `eth0`, the interface the flows take, and this process coordinates
/// from h1's namespace, as a job step on a cluster's first node does: the
/// xdp points are measured, the tcp points after them run over the same
/// control connections, and no XDP program is left on either interface.
#[test]
fn xdp_runs_between_agents_whose_control_connections_share_its_interface() {
    let name = "xdp_runs_between_agents_whose_control_connections_share_its_interface";
    if !system_ready(name) {
        return;
    }
    if let Err(why) = netgap::transport::find("xdp")
        .expect("xdp is registered")
        .availability()
    {
        crate::common::skip(name, &why.0);
        return;
    }
    let (tb, _) = Testbed::up("txctl", &["--hosts", "2"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let key = tb.key();
    let mut file = tb.hosts();
    let agents: Vec<AgentProc> = file
        .hosts
        .iter()
        .map(|h| tcp_agent(&tb, &h.name, &h.address.to_string(), &key))
        .collect();
    for (h, a) in file.hosts.iter_mut().zip(&agents) {
        h.control = a.addr.clone();
        h.netns = None;
    }
    file.key_file = None;
    let hosts = dir.path().join("agents.json");
    std::fs::write(&hosts, serde_json::to_string(&file).expect("hosts file")).expect("written");
    let json = dir.path().join("ctl.jsonl");
    let out = Command::new("ip")
        .args(["netns", "exec", &tb.ns("h1")])
        .arg(crate::common::netgap_path())
        .args(["run", "pingpong,stream", "-t", "xdp,tcp", "--hosts"])
        .arg(format!("@{}", hosts.display()))
        .arg("--key")
        .arg(&key)
        .args(["-s", "1,4K", "--reps", "2", "-n", "200", "--json"])
        .arg(&json)
        .output()
        .expect("run");
    ok(out);
    let recs = crate::common::read_records(&json);
    let got: Vec<(String, String)> = recs
        .iter()
        .map(|r| (r["test"].to_string(), r["transport"].to_string()))
        .collect();
    assert_eq!(recs.len(), 8, "{got:?}");
    for r in &recs {
        let t = format!("{} {} {}", r["test"], r["transport"], r["size_bytes"]);
        assert_eq!(r["host"]["hostname"], "h2", "{t}");
        assert_eq!(r["peer_host"]["hostname"], "h1", "{t}");
        assert_eq!(r["host"]["interface"], "eth0", "{t}");
        assert!(r["physics"].is_object(), "{t}: {r}");
        let b = &r["bytes"];
        assert!(n(&b["client_tx"]) > 0, "{t}: {b}");
        assert_eq!(b["client_tx"], b["server_rx"], "{t}: {b}");
        assert_eq!(b["server_tx"], b["client_rx"], "{t}: {b}");
    }
    assert_eq!(
        recs.iter().filter(|r| r["transport"] == "xdp").count(),
        4,
        "{got:?}"
    );
    for host in ["h1", "h2"] {
        let link = Command::new("ip")
            .args(["-n", &tb.ns(host), "link", "show", "eth0"])
            .output()
            .expect("ip link");
        let link = String::from_utf8_lossy(&link.stdout);
        assert!(
            !link.contains("prog/xdp") && !link.contains(" xdp"),
            "{host}: {link}"
        );
    }
    drop(agents);
}
