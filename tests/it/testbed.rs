//! The namespace testbed, for real: `netgap testbed up` as root builds
//! namespaces, links, shaping and agents; traffic crosses them; `down`
//! leaves nothing behind. Each test uses its own `--name`, so tests run
//! side by side, and a guard runs `testbed down` even when a test fails.
//!
//! Without root, `ip` or network namespaces these tests print why and pass,
//! unless NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI), where that is a failure.

use crate::common;
use crate::common::testbed::Testbed;
use crate::common::{netgap, netgap_path, ok, read_records as records, system_ready};
use serde_json::Value;
use std::net::{IpAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn sh(program: &str, args: &[&str]) -> String {
    ok(Command::new(program)
        .args(args)
        .output()
        .expect("command runs"))
}

/// Runs a coordinator inside host `from` against the agent of host `to`
/// over its Unix socket; the test traffic crosses the testbed.
fn run_from(tb: &Testbed, from: &str, to: &str, test: &str, json: &Path) -> Vec<Value> {
    let sock = tb.dir().join(format!("{to}.sock"));
    let out = Command::new("ip")
        .args(["netns", "exec", &tb.ns(from)])
        .arg(netgap_path())
        .args(["run", test, "--peer"])
        .arg(format!("unix:{}", sock.display()))
        .arg("--key")
        .arg(tb.key())
        .args(["-s", "16K", "--reps", "2", "-n", "200", "--json"])
        .arg(json)
        .output()
        .expect("netgap run");
    ok(out);
    records(json)
}

/// TX and RX byte counters of `dev` in namespace `ns`.
fn counters(ns: &str, dev: &str) -> (u64, u64) {
    let read = |what: &str| -> u64 {
        sh(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "cat",
                &format!("/sys/class/net/{dev}/statistics/{what}_bytes"),
            ],
        )
        .trim()
        .parse()
        .expect("a counter")
    };
    (read("tx"), read("rx"))
}

fn bytes_of(r: &Value, side: &str) -> u64 {
    r["bytes"][side].as_u64().expect("byte count")
}

#[test]
fn a_four_host_switch_testbed_carries_traffic_and_goes_away() {
    if !system_ready("a_four_host_switch_testbed_carries_traffic_and_goes_away") {
        return;
    }
    let root_links = || -> Vec<String> {
        sh("ip", &["-o", "link", "show"])
            .lines()
            .map(|l| l.split(':').nth(1).unwrap_or_default().trim().to_string())
            .collect()
    };
    let root_before = root_links();
    let (tb, out) = Testbed::up(
        "tsw",
        &[
            "--hosts",
            "4",
            "--topology",
            "switch",
            "--mtu",
            "9000",
            "--rate",
            "2G",
        ],
    );
    assert_eq!(out.matches("agent answers").count(), 4, "{out}");

    assert_eq!(
        root_links(),
        root_before,
        "the machine's own namespace keeps exactly its interfaces"
    );

    // The hosts file: four hosts on one subnet, each with its socket.
    let hosts = tb.hosts();
    assert_eq!(hosts.topology, "switch");
    assert_eq!(hosts.hosts.len(), 4);
    for (i, h) in hosts.hosts.iter().enumerate() {
        assert_eq!(h.name, format!("h{}", i + 1));
        assert_eq!(h.address.to_string(), format!("10.77.0.{}", i + 1));
        assert_eq!(h.netns.as_deref(), Some(&*tb.ns(&h.name)));
        assert_eq!(
            h.control,
            format!("unix:{}/h{}.sock", tb.dir().display(), i + 1)
        );
    }
    let key_mode = std::fs::metadata(tb.key())
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(key_mode & 0o777, 0o600);
    assert_eq!(hosts.key_file.as_deref(), Some(&*tb.key()));
    // The state directory and every file netgap wrote in it are root's
    // alone; the files replaced whole leave no `.new` behind.
    let mode = |p: &Path| {
        std::fs::symlink_metadata(p)
            .expect("state")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&tb.dir()), 0o700);
    for f in [
        "hosts.json",
        "params.json",
        "kernel-links.json",
        "h1.log",
        "h4.pid",
    ] {
        assert_eq!(mode(&tb.dir().join(f)), 0o600, "{f}");
    }
    let names: Vec<String> = std::fs::read_dir(tb.dir())
        .expect("state")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".new")), "{names:?}");

    // The MTU on each host's link; the TBF in the network, at the
    // bridge's port toward the host, and none in the host's own stack.
    let link = sh("ip", &["-n", &tb.ns("h1"), "link", "show", "eth0"]);
    assert!(link.contains("mtu 9000"), "{link}");
    let q = sh("tc", &["-n", &tb.ns("sw"), "qdisc", "show", "dev", "h3"]);
    assert!(q.contains("tbf") && q.contains("rate 2Gbit"), "{q}");
    let q = sh("tc", &["-n", &tb.ns("h3"), "qdisc", "show", "dev", "eth0"]);
    assert!(!q.contains("tbf"), "{q}");

    // Traffic from h2 to h1's agent crosses h2's link.
    let dir = tempfile::tempdir().expect("tempdir");
    let before = counters(&tb.ns("h2"), "eth0");
    let recs = run_from(&tb, "h2", "h1", "stream", &dir.path().join("s.jsonl"));
    let after = counters(&tb.ns("h2"), "eth0");
    assert_eq!(recs.len(), 1);
    let sent = bytes_of(&recs[0], "client_tx");
    assert_eq!(sent, bytes_of(&recs[0], "server_rx"));
    assert!(sent > 0);
    assert!(
        after.0 - before.0 >= sent,
        "h2 eth0 sent {} bytes for {sent} bytes of payload",
        after.0 - before.0
    );
    // Each testbed host has a host name of its own (its UTS namespace); the
    // coordinator here runs in h2's network namespace only.
    assert_eq!(recs[0]["peer_host"]["hostname"], "h1");
    assert_ne!(recs[0]["host"]["hostname"], "h1");

    // `up` again with the same flags keeps it; the agents still answer.
    let out = ok(netgap()
        .args(["testbed", "up", "--name", "tsw", "--hosts", "4"])
        .args(["--mtu", "9000", "--rate", "2G"])
        .output()
        .expect("up"));
    assert!(out.contains("already up"), "{out}");
    assert_eq!(out.matches("agent answers").count(), 4, "{out}");

    let out = tb.down();
    assert!(out.contains("5 namespaces"), "{out}");
    tb.assert_gone();
}

/// A keyed agent started by hand inside `ns`, listening on `ip` over TCP.
struct ExtraAgent(Child);

impl Drop for ExtraAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_two_host_mesh_with_three_links_uses_each_link_and_down_cleans_a_crash() {
    if !system_ready("a_two_host_mesh_with_three_links_uses_each_link_and_down_cleans_a_crash") {
        return;
    }
    let (tb, out) = Testbed::up(
        "tmesh",
        &[
            "--hosts",
            "2",
            "--topology",
            "mesh",
            "--links",
            "3",
            "--rate",
            "1G",
        ],
    );
    assert_eq!(out.matches("agent answers").count(), 2, "{out}");
    let hosts = tb.hosts();
    assert_eq!(hosts.topology, "mesh");
    let h1 = hosts.host("h1").expect("h1");
    let h2 = hosts.host("h2").expect("h2");
    assert_eq!(h1.links.len(), 3);
    assert_eq!(h2.links.len(), 3);
    let mut subnets: Vec<String> = h1
        .links
        .iter()
        .map(|l| {
            l.local
                .to_string()
                .rsplit_once('.')
                .expect("v4")
                .0
                .to_string()
        })
        .collect();
    subnets.dedup();
    assert_eq!(subnets.len(), 3, "each link its own subnet");

    // Each link: up, shaped, and carrying traffic between the two hosts.
    let dir = tempfile::tempdir().expect("tempdir");
    for (k, l) in h1.links.iter().enumerate() {
        let back = h2.links_to("h1").find(|b| b.index == l.index).expect("end");
        assert_eq!((back.local, back.remote), (l.remote, l.local));
        // Shaped in the middle of the link, toward each host; not in the
        // hosts' stacks.
        for toward in ["h1", "h2"] {
            let q = sh(
                "tc",
                &[
                    "-n",
                    &tb.ns(&format!("l{k}")),
                    "qdisc",
                    "show",
                    "dev",
                    toward,
                ],
            );
            assert!(q.contains("tbf") && q.contains("rate 1Gbit"), "{q}");
        }
        let q = sh(
            "tc",
            &["-n", &tb.ns("h2"), "qdisc", "show", "dev", &back.ifname],
        );
        assert!(!q.contains("tbf"), "{q}");

        // An agent in h1 on this link's address (TCP, keyed: it is not
        // loopback), driven from h2.
        let port = 7300 + k as u16;
        let agent = ExtraAgent(
            Command::new("ip")
                .args(["netns", "exec", &tb.ns("h1")])
                .arg(netgap_path())
                .args(["serve", "--bind", &l.local.to_string(), "--port"])
                .arg(port.to_string())
                .arg("--key")
                .arg(tb.key())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("agent"),
        );
        let t0 = Instant::now();
        let before: Vec<(u64, u64)> = h2
            .links
            .iter()
            .map(|e| counters(&tb.ns("h2"), &e.ifname))
            .collect();
        let json = dir.path().join(format!("l{k}.jsonl"));
        let run = || {
            Command::new("ip")
                .args(["netns", "exec", &tb.ns("h2")])
                .arg(netgap_path())
                .args(["run", "stream", "--peer"])
                .arg(format!("{}:{port}", l.local))
                .arg("--key")
                .arg(tb.key())
                .args(["-s", "16K", "--reps", "2", "-n", "200", "--json"])
                .arg(&json)
                .output()
                .expect("run")
        };
        // The agent may still be starting.
        let mut out = run();
        while !out.status.success() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
            out = run();
        }
        ok(out);
        drop(agent);
        let recs = records(&json);
        let sent = bytes_of(&recs[0], "client_tx");
        let after: Vec<(u64, u64)> = h2
            .links
            .iter()
            .map(|e| counters(&tb.ns("h2"), &e.ifname))
            .collect();
        for (j, e) in h2.links.iter().enumerate() {
            let tx = after[j].0 - before[j].0;
            if e.index == back.index {
                assert!(tx >= sent, "link {k}: {tx} bytes for {sent} of payload");
            } else {
                assert!(
                    tx < sent / 10,
                    "link {j} carried {tx} bytes meant for link {k}"
                );
            }
        }
    }

    // A crash: one agent killed, the hosts file gone. `down` still cleans up.
    let pid = std::fs::read_to_string(tb.dir().join("h2.pid")).expect("pid");
    sh("kill", &["-9", pid.trim()]);
    std::fs::remove_file(tb.dir().join("hosts.json")).expect("rm");
    let status = ok(netgap()
        .args(["testbed", "status", "--name", "tmesh"])
        .output()
        .expect("status"));
    assert!(status.contains("incomplete"), "{status}");
    let out = tb.down();
    assert!(out.contains("5 namespaces"), "2 hosts and 3 links: {out}");
    tb.assert_gone();
}

/// Sends one UDP datagram of `bytes` (never fragmented on the way) from
/// `local` inside namespace `from_ns` to `remote` inside `to_ns`; the
/// source address it arrived from, or why it did not arrive within 2 s.
fn udp_across(
    from_ns: &str,
    local: IpAddr,
    to_ns: &str,
    remote: IpAddr,
    bytes: usize,
) -> Result<IpAddr, String> {
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || -> Result<IpAddr, String> {
            netgap_transport::netns::enter(to_ns).map_err(|e| e.to_string())?;
            let sock = UdpSocket::bind((remote, 0)).map_err(|e| format!("bind {remote}: {e}"))?;
            let port = sock.local_addr().map_err(|e| e.to_string())?.port();
            let _ = port_tx.send(port);
            sock.set_read_timeout(Some(Duration::from_secs(2)))
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; bytes + 1];
            let (n, from) = sock
                .recv_from(&mut buf)
                .map_err(|e| format!("nothing from {local} at {remote}: {e}"))?;
            if n != bytes {
                return Err(format!("{n} bytes arrived of {bytes}"));
            }
            Ok(from.ip())
        });
        let sent = s
            .spawn(move || -> Result<(), String> {
                let port: u16 = port_rx.recv().map_err(|_| "no receiver".to_string())?;
                netgap_transport::netns::enter(from_ns).map_err(|e| e.to_string())?;
                let sock = UdpSocket::bind((local, 0)).map_err(|e| format!("bind {local}: {e}"))?;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
                let mode: libc::c_int = libc::IP_PMTUDISC_DO;
                // SAFETY: `mode` lives for the call and its size is passed.
                let r = unsafe {
                    libc::setsockopt(
                        fd,
                        libc::IPPROTO_IP,
                        libc::IP_MTU_DISCOVER,
                        (&raw const mode).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                assert_eq!(r, 0, "IP_MTU_DISCOVER");
                sock.send_to(&vec![7u8; bytes], (remote, port))
                    .map_err(|e| format!("send {local} -> {remote}: {e}"))?;
                Ok(())
            })
            .join()
            .expect("sender");
        let got = receiver.join().expect("receiver");
        sent.and(got)
    })
}

/// MTU of `dev` in namespace `ns`.
fn mtu_of(ns: &str, dev: &str) -> String {
    let link = sh("ip", &["-n", ns, "-o", "link", "show", "dev", dev]);
    link.split_whitespace()
        .skip_while(|w| *w != "mtu")
        .nth(1)
        .expect("an MTU")
        .to_string()
}

#[test]
fn a_switch_with_two_links_reaches_every_host_on_both_and_down_finds_both_switches() {
    let name = "a_switch_with_two_links_reaches_every_host_on_both_and_down_finds_both_switches";
    if !system_ready(name) {
        return;
    }
    let (tb, out) = Testbed::up(
        "tswl",
        &[
            "--hosts",
            "3",
            "--topology",
            "switch",
            "--links",
            "2",
            "--rate",
            "1G",
        ],
    );
    assert_eq!(out.matches("agent answers").count(), 3, "{out}");
    // `status` lists each host's links, as on a mesh.
    assert!(
        out.contains("link h2#1 eth1 10.77.1.1 -> 10.77.1.2"),
        "{out}"
    );
    assert!(out.contains("live links: as the hosts file says"), "{out}");
    let hosts = tb.hosts();
    assert_eq!(hosts.topology, "switch");
    for (i, h) in hosts.hosts.iter().enumerate() {
        let n = i + 1;
        // The first link is the one switch of a one-link testbed.
        assert_eq!(h.address.to_string(), format!("10.77.0.{n}"));
        assert_eq!(h.links.len(), 4, "{}: two peers, two links each", h.name);
        for peer in hosts.hosts.iter().filter(|p| p.name != h.name) {
            let rails: Vec<_> = h.links_to(&peer.name).collect();
            assert_eq!(rails.len(), 2, "{} to {}", h.name, peer.name);
            for (k, l) in rails.iter().enumerate() {
                assert_eq!(l.index as usize, k);
                assert_eq!(l.ifname, format!("eth{k}"));
                assert_eq!(l.local.to_string(), format!("10.77.{k}.{n}"));
                // Each host reaches each other on this link, leaving by its
                // own interface.
                let remote = l.remote.to_string();
                let route = sh("ip", &["-n", &tb.ns(&h.name), "route", "get", &remote]);
                assert!(route.contains(&format!("dev eth{k}")), "{route}");
                let from = udp_across(&tb.ns(&h.name), l.local, &tb.ns(&peer.name), l.remote, 1400);
                assert_eq!(from, Ok(l.local), "{} to {} on link {k}", h.name, peer.name);
            }
        }
    }
    // Each switch shapes its port toward each host; the second is a
    // namespace of its own.
    for sw in ["sw", "sw1"] {
        for toward in ["h1", "h2", "h3"] {
            let q = sh("tc", &["-n", &tb.ns(sw), "qdisc", "show", "dev", toward]);
            assert!(
                q.contains("tbf") && q.contains("rate 1Gbit"),
                "{sw}/{toward}: {q}"
            );
        }
    }
    // Multipath TCP announces both of a host's addresses, once each.
    if Path::new("/proc/sys/net/mptcp/enabled").exists() {
        let eps = sh("ip", &["-n", &tb.ns("h2"), "mptcp", "endpoint", "show"]);
        assert_eq!(eps.lines().count(), 2, "{eps}");
        assert!(
            eps.contains("10.77.0.2") && eps.contains("10.77.1.2"),
            "{eps}"
        );
    }

    // multirail reads the links of the hosts file: one flow on each switch.
    let client = &hosts.hosts[1];
    let rails: Vec<_> = client.links_to(&hosts.hosts[0].name).cloned().collect();
    let before: Vec<(u64, u64)> = rails
        .iter()
        .map(|l| counters(&tb.ns(&client.name), &l.ifname))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "multirail",
        &["--reps", "1", "--duration", "300ms"],
        &dir.path().join("mr.jsonl"),
    );
    let links = recs[0]["links"].as_array().expect("links");
    assert_eq!(links.len(), 2, "{}", recs[0]);
    for (k, (l, rail)) in links.iter().zip(&rails).enumerate() {
        assert_eq!(l["local"], rail.local.to_string().as_str(), "{l}");
        let payload = l["bytes"].as_u64().expect("bytes");
        assert!(payload > 0, "link {k} carried nothing: {l}");
        let moved = counters(&tb.ns(&client.name), &rail.ifname).0 - before[k].0;
        assert!(moved >= payload, "eth{k} moved {moved} < payload {payload}");
    }

    // `set` changes every link alike: both of each host's interfaces and
    // both switches' ports.
    let out = ok(netgap()
        .args(["testbed", "set", "--name", "tswl", "--mtu", "9000"])
        .output()
        .expect("set"));
    assert!(out.contains("live links: as the hosts file says"), "{out}");
    for h in ["h1", "h2", "h3"] {
        for dev in ["eth0", "eth1"] {
            assert_eq!(mtu_of(&tb.ns(h), dev), "9000", "{h}/{dev}");
        }
        for sw in ["sw", "sw1"] {
            assert_eq!(mtu_of(&tb.ns(sw), h), "9000", "{sw}/{h}");
        }
    }
    assert!(tb.hosts().hosts[0]
        .links
        .iter()
        .all(|l| l.mtu_bytes == 9000));
    // A jumbo frame crosses each switch unfragmented.
    for k in 0..2 {
        let ip = |n: u8| IpAddr::V4(std::net::Ipv4Addr::new(10, 77, k, n));
        let from = udp_across(&tb.ns("h3"), ip(3), &tb.ns("h1"), ip(1), 8900);
        assert_eq!(from, Ok(ip(3)), "a jumbo frame on link {k}");
    }

    // Without its hosts file (a crash halfway), `down` still finds every
    // namespace by its name: three hosts and two switches.
    std::fs::remove_file(tb.dir().join("hosts.json")).expect("rm");
    let out = tb.down();
    assert!(out.contains("5 namespaces"), "{out}");
    tb.assert_gone();
}

/// `web -t xdp` on a switch with two links: nginx's connection takes the
/// first switch and the relays' xdp flow the second, so a study's shared
/// switch stays while the preload library crosses hosts.
#[cfg(feature = "xdp")]
#[test]
fn web_over_xdp_on_a_two_link_switch_relays_on_the_second_switch() {
    let name = "web_over_xdp_on_a_two_link_switch_relays_on_the_second_switch";
    if !system_ready(name) {
        return;
    }
    if !Path::new("/usr/sbin/nginx").exists() {
        common::skip(name, "/usr/sbin/nginx is missing");
        return;
    }
    let (tb, _) = Testbed::up(
        "tswx",
        &["--hosts", "2", "--topology", "switch", "--links", "2"],
    );
    let sent = |dev: &str| -> u64 {
        ["h1", "h2"]
            .iter()
            .map(|h| counters(&tb.ns(h), dev).0)
            .sum()
    };
    let before = (sent("eth0"), sent("eth1"));
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("web.jsonl");
    let out = netgap()
        .args([
            "run",
            "web",
            "-t",
            "xdp",
            "--reps",
            "1",
            "--duration",
            "1s",
            "-s",
            "64k",
        ])
        .args(["--hosts", &tb.hosts_arg(), "--json"])
        .arg(&json)
        .env("NETGAP_PRELOAD", common::preload_library())
        .output()
        .expect("netgap run");
    ok(out);
    let (eth0, eth1) = (sent("eth0") - before.0, sent("eth1") - before.1);
    let recs = records(&json);
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    let m = |k: &str| {
        r["app"]["metrics"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k}: {}", r["app"]))
    };
    assert_eq!(r["transport"], "xdp");
    assert_eq!(m("verified_share"), 1.0, "{}", r["app"]);
    assert!(m("preload_xdp_connections") >= 1.0, "{}", r["app"]);
    assert_eq!(m("preload_kernel_connections"), 0.0, "{}", r["app"]);
    let payload = m("payload_bytes") as u64;
    assert!(payload > 0, "{}", r["app"]);
    assert!(
        eth1 >= payload,
        "the second switch carried {eth1} bytes of {payload}"
    );
    assert!(
        eth0 < payload / 10,
        "the first switch carried {eth0} bytes of {payload}"
    );
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn traffic_between_switch_hosts_runs_through_the_agents_sockets() {
    if !system_ready("traffic_between_switch_hosts_runs_through_the_agents_sockets") {
        return;
    }
    let (tb, _) = Testbed::up("tpp", &["--hosts", "2"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = run_from(&tb, "h2", "h1", "pingpong", &dir.path().join("p.jsonl"));
    assert_eq!(recs[0]["test"], "pingpong");
    assert_eq!(
        bytes_of(&recs[0], "client_tx"),
        bytes_of(&recs[0], "server_rx")
    );
    // The agent reports the testbed address it served on.
    assert!(
        recs[0]["options"]["peer"]
            .as_str()
            .is_some_and(|p| p.ends_with("h1.sock")),
        "{}",
        recs[0]["options"]
    );
    // Up with other parameters rebuilds.
    let out = ok(netgap()
        .args(["testbed", "up", "--name", "tpp", "--hosts", "3"])
        .output()
        .expect("up"));
    assert!(
        out.contains("rebuilding") && out.contains("differ"),
        "{out}"
    );
    assert_eq!(tb.hosts().hosts.len(), 3);
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn without_root_the_testbed_says_so_in_one_line() {
    if !system_ready("without_root_the_testbed_says_so_in_one_line") {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        common::skip(
            "without_root_the_testbed_says_so_in_one_line",
            "setpriv is not installed",
        );
        return;
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(netgap_path())
        .args(["testbed", "up", "--name", "tnoroot"])
        .output()
        .expect("setpriv");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("needs root"), "{stderr}");
    assert!(!Path::new("/run/netgap/tnoroot").exists());
}

/// A testbed state directory netgap would not write in (another user's,
/// one every user can write in, a link to elsewhere) is refused by `up`,
/// `set`, `status` and `down` in one line naming it, before anything
/// reads or changes it: nothing is built, and nothing in it, or where its
/// link points, is written or removed.
#[test]
fn a_state_directory_another_user_owns_or_can_write_is_refused_in_one_line() {
    let test = "a_state_directory_another_user_owns_or_can_write_is_refused_in_one_line";
    if !system_ready(test) {
        return;
    }
    /// Removes what the test planted, even when it fails.
    struct Planted(std::path::PathBuf);
    impl Drop for Planted {
        fn drop(&mut self) {
            match std::fs::symlink_metadata(&self.0) {
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir_all(&self.0);
                }
                Ok(_) => {
                    let _ = std::fs::remove_file(&self.0);
                }
                Err(_) => {}
            }
            let _ = netgap()
                .args(["testbed", "down", "--name", "tstate"])
                .output();
        }
    }
    // Nothing of an earlier run, and the state root made as netgap makes it.
    ok(netgap()
        .args(["testbed", "down", "--name", "tstate"])
        .output()
        .expect("down"));
    let dir = Path::new("/run/netgap/tstate");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let plant = |what: &str| -> (Planted, std::path::PathBuf) {
        let guard = Planted(dir.to_path_buf());
        let files = if what == "link" {
            std::os::unix::fs::symlink(elsewhere.path(), dir).expect("link");
            elsewhere.path().to_path_buf()
        } else {
            std::fs::create_dir(dir).expect("dir");
            if what == "theirs" {
                std::os::unix::fs::chown(dir, Some(65534), Some(65534)).expect("chown");
            } else {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
                    .expect("chmod");
            }
            dir.to_path_buf()
        };
        // What another user would leave for the testbed to trust or to
        // write through.
        std::fs::write(files.join("hosts.json"), "planted").expect("hosts");
        std::fs::write(files.join("params.json"), "planted").expect("params");
        std::fs::write(files.join("h1.pid"), "1\n").expect("pid");
        (guard, files)
    };
    for (what, needle) in [
        (
            "theirs",
            "it is owned by uid 65534, not by the user netgap runs as (uid 0)",
        ),
        ("open", "it is writable by every user (mode 777)"),
        ("link", "it is a symbolic link"),
    ] {
        let (guard, files) = plant(what);
        let refusal = format!(
            "refusing /run/netgap/tstate as testbed tstate's state directory: {needle}; remove it"
        );
        for args in [
            &["testbed", "up", "--name", "tstate", "--hosts", "2"][..],
            &["testbed", "set", "--name", "tstate", "--mtu", "9000"],
            &["testbed", "status", "--name", "tstate"],
            &["testbed", "down", "--name", "tstate"],
        ] {
            common::one_line_error(
                &netgap().args(args).output().expect("runs"),
                &format!("{what}: {args:?}"),
                &refusal,
            );
        }
        let mut names: Vec<String> = std::fs::read_dir(&files)
            .expect("planted")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["h1.pid", "hosts.json", "params.json"], "{what}");
        for f in ["hosts.json", "params.json"] {
            assert_eq!(
                std::fs::read_to_string(files.join(f)).expect("planted"),
                "planted",
                "{what}: {f}"
            );
        }
        let list = sh("ip", &["netns", "list"]);
        assert!(!list.contains("ngtb-tstate-"), "{what}: built: {list}");
        drop(guard);
        let _ = std::fs::remove_file(elsewhere.path().join("hosts.json"));
        let _ = std::fs::remove_file(elsewhere.path().join("params.json"));
        let _ = std::fs::remove_file(elsewhere.path().join("h1.pid"));
    }
    // Once it is gone, netgap makes it again, root's with mode 0700.
    let (tb, _) = Testbed::up("tstate", &["--hosts", "2"]);
    let m = std::fs::symlink_metadata(tb.dir()).expect("state");
    assert!(m.is_dir() && m.permissions().mode() & 0o777 == 0o700);
    let _ = tb.down();
    tb.assert_gone();
}

/// A testbed another process holds (a child of this test, holding the
/// lock a study takes) is neither rebuilt, changed nor removed by hand:
/// `up`, `set`, `down` and a run with `--conditions` are refused in one
/// line naming the holder, and the testbed stays up. Once the holder is
/// killed (SIGKILL: nothing of its own runs), `down` works.
#[test]
fn a_testbed_another_process_holds_is_refused_up_set_and_down_in_one_line() {
    if !system_ready("a_testbed_another_process_holds_is_refused_up_set_and_down_in_one_line") {
        return;
    }
    let (tb, _) = Testbed::up("tlock", &["--hosts", "2"]);
    let mut holder = common::procs::Reaped(
        common::child_test(module_path!(), "lock_holder_child")
            .env("NETGAP_LOCK_CHILD", "tlock")
            .stdout(Stdio::piped())
            .spawn()
            .expect("the holder"),
    );
    let out = holder.0.stdout.take().expect("its output");
    let held = std::io::BufRead::lines(std::io::BufReader::new(out))
        .map_while(Result::ok)
        .any(|l| l.contains("HELD"));
    assert!(held, "the child took the lock");
    let named = format!(
        "testbed tlock is in use by `netgap study 999` (pid {})",
        holder.0.id()
    );
    let hosts = tb.hosts_arg();
    for args in [
        &["testbed", "down", "--name", "tlock"][..],
        &["testbed", "up", "--name", "tlock", "--hosts", "3"],
        &["testbed", "set", "--name", "tlock", "--mtu", "9000"],
        &[
            "run",
            "pingpong",
            "--hosts",
            &hosts,
            "--conditions",
            "mtu=1500,9000",
        ],
    ] {
        let line = common::one_line_error(
            &netgap().args(args).output().expect("runs"),
            &format!("{args:?}"),
            &named,
        );
        assert!(line.contains("nothing was changed"), "{line}");
    }
    assert_eq!(tb.hosts().hosts.len(), 2, "the testbed was not rebuilt");
    let status = ok(netgap()
        .args(["testbed", "status", "--name", "tlock"])
        .output()
        .expect("status"));
    assert_eq!(status.matches("agent answers").count(), 2, "{status}");
    assert!(
        !status.contains("9000"),
        "its MTU was not changed: {status}"
    );
    holder.0.kill().expect("SIGKILL");
    let _ = holder.0.wait();
    let _ = tb.down();
    tb.assert_gone();
}

/// Holds the lock of the testbed `NETGAP_LOCK_CHILD` names, as a study
/// holds its testbed's, prints `HELD` and waits to be killed; does nothing
/// when run directly.
#[test]
#[ignore = "helper run in a child process by the testbed lock test"]
fn lock_holder_child() {
    let Ok(name) = std::env::var("NETGAP_LOCK_CHILD") else {
        return;
    };
    let _lock = netgap::testbed::TestbedLock::acquire(&name, "netgap study 999")
        .expect("the testbed is free");
    println!("HELD");
    std::thread::sleep(Duration::from_secs(300));
}

#[test]
fn point_to_point_tests_sweep_and_logp_run_between_testbed_hosts() {
    if !system_ready("point_to_point_tests_sweep_and_logp_run_between_testbed_hosts") {
        return;
    }
    let (tb, _) = Testbed::up("tp2p", &["--hosts", "2"]);
    let hosts = format!("@{}", tb.dir().join("hosts.json").display());
    let dir = tempfile::tempdir().expect("tempdir");

    // `run --hosts`: h1's agent serves, h2's plays the client, with the
    // hosts file's key; the traffic crosses h2's link.
    let json = dir.path().join("run.jsonl");
    let before = counters(&tb.ns("h2"), "eth0");
    ok(netgap()
        .args(["run", "pingpong,stream", "--hosts", &hosts])
        .args(["-s", "1K", "--reps", "2", "-n", "100", "--json"])
        .arg(&json)
        .output()
        .expect("run"));
    let after = counters(&tb.ns("h2"), "eth0");
    let recs = records(&json);
    assert_eq!(recs.len(), 2);
    for r in &recs {
        assert_eq!(r["host"]["hostname"], "h2", "{}", r["host"]);
        assert_eq!(r["peer_host"]["hostname"], "h1", "{}", r["peer_host"]);
        assert_eq!(r["host"]["interface"], "eth0", "{}", r["host"]);
        assert_eq!(r["peer_host"]["interface"], "eth0", "{}", r["peer_host"]);
        assert_eq!(r["options"]["peer"], "agents: hosts-file");
        assert_eq!(bytes_of(r, "client_tx"), bytes_of(r, "server_rx"));
    }
    let sent: u64 = recs.iter().map(|r| bytes_of(r, "client_tx")).sum();
    assert!(after.0 - before.0 >= sent, "h2 eth0 carried the payload");

    // `sweep --hosts`: the same path, keyed through the hosts file.
    let json = dir.path().join("sweep.jsonl");
    ok(netgap()
        .args(["sweep", "--hosts", &hosts, "--end", "64", "--json"])
        .arg(&json)
        .output()
        .expect("sweep"));
    let recs = records(&json);
    assert!(!recs.is_empty());
    assert!(recs
        .iter()
        .all(|r| r["test"] == "sweep" && r["peer_host"]["hostname"] == "h1"));

    // `logp` between the hosts with the key given as --key.
    let json = dir.path().join("logp.jsonl");
    ok(netgap()
        .args(["logp", "--hosts", &hosts, "--key"])
        .arg(tb.key())
        .args(["--sizes", "1", "--json"])
        .arg(&json)
        .output()
        .expect("logp"));
    let recs = records(&json);
    assert_eq!(recs.len(), 4, "o_s, o_r, g and L");
    assert!(recs
        .iter()
        .all(|r| r["host"]["hostname"] == "h2" && r["peer_host"]["hostname"] == "h1"));
    // From h2 without the key, h1's keyed agent refuses: one line.
    let sock = format!("unix:{}", tb.dir().join("h1.sock").display());
    let out = Command::new("ip")
        .args(["netns", "exec", &tb.ns("h2")])
        .arg(netgap_path())
        .args(["logp", "--peer", &sock, "--sizes", "1"])
        .output()
        .expect("logp");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("key"), "{stderr}");

    // One agent has no second host for the client role: refused in one
    // line (two agents take both roles: the `agent_pair` module).
    let out = netgap()
        .args(["run", "pingpong", "--hosts", "127.0.0.1:1"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs two hosts"), "{stderr}");
    let _ = tb.down();
    tb.assert_gone();
}

/// The payload limit of a TBF-shaped TCP stream, in Gbit/s: of every frame
/// of `mtu` bytes plus 14 of Ethernet header, `mtu - 52` are payload (IP and
/// TCP headers with timestamps).
fn tcp_payload_limit_gbps(rate_gbps: f64, mtu: u64) -> f64 {
    rate_gbps * (mtu - 52) as f64 / (mtu + 14) as f64
}

#[test]
fn conditions_are_set_recorded_and_interleaved_in_one_run() {
    if !system_ready("conditions_are_set_recorded_and_interleaved_in_one_run") {
        return;
    }
    let (tb, out) = Testbed::up(
        "tcond",
        &["--hosts", "2", "--rate", "1G", "--offload", "on"],
    );
    assert!(
        out.contains(
            "conditions: MTU 1500, offload on, rate 1000000000 bit/s, bucket 131328 B, qdisc tbf"
        ),
        "{out}"
    );
    let hosts = tb.hosts();
    assert_eq!(hosts.testbed.as_deref(), Some("tcond"));
    let before = hosts.conditions.expect("conditions recorded");
    assert_eq!((before.mtu_bytes, before.offload), (1500, Some(true)));
    let pids: Vec<String> = ["h1", "h2"]
        .iter()
        .map(|h| std::fs::read_to_string(tb.dir().join(format!("{h}.pid"))).expect("pid"))
        .collect();

    // One run, four conditions, their repetitions interleaved.
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "stream",
        &[
            "-s",
            "64K",
            "--reps",
            "2",
            "-n",
            "400",
            "--label",
            "cond",
            "--conditions",
            "mtu=1500,9000",
            "offload=on,off",
        ],
        &dir.path().join("c.jsonl"),
    );
    assert_eq!(recs.len(), 4, "one record per condition");
    let mut stacks: Vec<(u64, String)> = Vec::new();
    let group = &recs[0]["options"]["interleaved"]["group"];
    for r in &recs {
        let path = &r["stack"]["path"];
        let mtu = path["mtu_bytes"].as_u64().expect("mtu");
        stacks.push((mtu, path["offload"].as_str().expect("offload").to_string()));
        assert_eq!(path["kind"], "testbed", "{path}");
        assert_eq!(path["topology"], "switch", "{path}");
        assert_eq!(path["rate_bps"], 1_000_000_000u64, "{path}");
        assert_eq!(path["qdisc"], "tbf", "{path}");
        // The bucket the switch applied under each condition.
        assert_eq!(path["bucket_bytes"], 131_328u64, "{path}");
        assert_eq!(r["stack"]["label"], "cond");
        assert_eq!(r["options"]["interleaved"]["with"], 4);
        assert_eq!(&r["options"]["interleaved"]["group"], group);
        assert_eq!(r["stats"]["reps"].as_array().map(Vec::len), Some(2));
        assert_eq!(r["iterations_per_rep"], 400);
        // Both hosts' facts say what the path says.
        for end in ["host", "peer_host"] {
            assert_eq!(r[end]["mtu_bytes"].as_u64(), Some(mtu), "{end}: {}", r[end]);
        }
        // Physics: no stream beats the TBF's payload limit at its MTU (a
        // few percent over for the bucket's burst at each repetition's
        // start).
        let limit = tcp_payload_limit_gbps(1.0, mtu);
        for v in r["stats"]["reps"].as_array().expect("reps") {
            let v = v.as_f64().expect("value");
            assert!(
                v > 0.0 && v <= limit * 1.05,
                "{v} Gbit/s over {limit} at MTU {mtu}"
            );
        }
    }
    stacks.sort();
    assert_eq!(
        stacks,
        [
            (1500, "off".to_string()),
            (1500, "on".into()),
            (9000, "off".into()),
            (9000, "on".into())
        ],
        "four distinct stacks"
    );
    // The report keeps the four stacks apart: four series, each named by
    // what sets it apart from the others.
    let html = dir.path().join("c.html");
    ok(netgap()
        .arg("report")
        .arg(dir.path().join("c.jsonl"))
        .arg("-o")
        .arg(&html)
        .output()
        .expect("report"));
    let page = std::fs::read_to_string(&html).expect("report page");
    for label in [
        "tcp, MTU 1500, offload on",
        "tcp, MTU 9000, offload on",
        "tcp, MTU 1500, offload off",
        "tcp, MTU 9000, offload off",
    ] {
        assert!(
            page.contains(label),
            "the report names the series {label:?}"
        );
    }
    // The run put the testbed back as it found it.
    assert_eq!(tb.hosts().conditions, Some(before));

    // `testbed set` changes a running testbed; its agents stay.
    let out = ok(netgap()
        .args(["testbed", "set", "--name", "tcond", "--mtu", "9000"])
        .args(["--offload", "off", "--rate", "none"])
        .output()
        .expect("set"));
    assert!(
        out.contains("MTU 9000, offload off, qdisc noqueue"),
        "{out}"
    );
    assert_eq!(out.matches("agent answers").count(), 2, "{out}");
    for (ns, dev) in [
        (tb.ns("h1"), "eth0"),
        (tb.ns("sw"), "h2"),
        (tb.ns("sw"), "br0"),
    ] {
        let link = sh("ip", &["-n", &ns, "link", "show", dev]);
        assert!(link.contains("mtu 9000"), "{ns} {dev}: {link}");
    }
    let q = sh("tc", &["-n", &tb.ns("sw"), "qdisc", "show", "dev", "h2"]);
    assert!(!q.contains("tbf"), "{q}");
    let c = tb.hosts().conditions.expect("conditions");
    assert_eq!(
        (c.mtu_bytes, c.offload, c.rate_bps),
        (9000, Some(false), None)
    );
    for (h, pid) in ["h1", "h2"].iter().zip(&pids) {
        let now = std::fs::read_to_string(tb.dir().join(format!("{h}.pid"))).expect("pid");
        assert_eq!(&now, pid, "{h}'s agent was not restarted");
    }
    let recs = tb.run(
        "pingpong",
        &["-s", "1", "--reps", "2", "-n", "100"],
        &dir.path().join("p.jsonl"),
    );
    let path = &recs[0]["stack"]["path"];
    assert_eq!(
        (path["mtu_bytes"].as_u64(), path["offload"].as_str()),
        (Some(9000), Some("off"))
    );
    assert!(recs[0]["options"].get("interleaved").is_none());

    // netem: delay and loss, with a rate as its child, where the kernel
    // has it; where it does not, one line says so and nothing changed.
    let out = netgap()
        .args(["testbed", "set", "--name", "tcond", "--delay", "1ms"])
        .args(["--loss", "0.1%", "--rate", "1G"])
        .output()
        .expect("set");
    if out.status.success() {
        let q = sh("tc", &["-n", &tb.ns("sw"), "qdisc", "show", "dev", "h1"]);
        assert!(q.contains("netem") && q.contains("tbf"), "{q}");
        assert_eq!(tb.hosts().conditions.map(|c| c.qdisc()), Some("netem+tbf"));
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("netem"), "{stderr}");
        assert_eq!(tb.hosts().conditions, Some(c));
    }
    // `up` with the testbed's own build but other conditions keeps it and
    // changes them.
    let out = ok(netgap()
        .args(["testbed", "up", "--name", "tcond", "--hosts", "2"])
        .args(["--rate", "1G", "--offload", "on"])
        .output()
        .expect("up"));
    assert!(out.contains("changing its conditions"), "{out}");
    assert_eq!(tb.hosts().conditions, Some(before));
    // Nothing to set, or a bad value: one line.
    for args in [
        &["testbed", "set", "--name", "tcond"][..],
        &["testbed", "set", "--name", "tcond", "--loss", "200"],
    ] {
        let out = netgap().args(args).output().expect("set");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
    let _ = tb.down();
    tb.assert_gone();
}

/// `ethtool -k` of every link end of a two-host switch testbed.
fn offloads_of(tb: &Testbed) -> Vec<String> {
    [("h1", "eth0"), ("h2", "eth0"), ("sw", "h1"), ("sw", "h2")]
        .iter()
        .map(|(host, dev)| sh("ip", &["netns", "exec", &tb.ns(host), "ethtool", "-k", dev]))
        .collect()
}

#[test]
fn every_kind_of_run_under_conditions_puts_the_links_back_as_the_kernel_had_them() {
    let name = "every_kind_of_run_under_conditions_puts_the_links_back_as_the_kernel_had_them";
    if !system_ready(name) {
        return;
    }
    if Command::new("ethtool").arg("--version").output().is_err() {
        common::skip(name, "ethtool is missing (apt-get install ethtool)");
        return;
    }
    // Built with the kernel's own offloads.
    let (tb, out) = Testbed::up("tkern", &["--hosts", "2"]);
    assert!(out.contains("offload as the kernel set it"), "{out}");
    assert!(out.contains("live links: as the hosts file says"), "{out}");
    let before = offloads_of(&tb);
    let dir = tempfile::tempdir().expect("tempdir");
    // A point-to-point run (interleaved) and a workload run, each under
    // offload on and off.
    tb.run(
        "pingpong",
        &[
            "-s",
            "1",
            "--reps",
            "2",
            "-n",
            "50",
            "--conditions",
            "offload=on,off",
        ],
        &dir.path().join("p.jsonl"),
    );
    assert_eq!(offloads_of(&tb), before, "after a point-to-point run");
    tb.run(
        "multistream",
        &["-P", "2", "--reps", "1", "--duration", "200ms"],
        &dir.path().join("m0.jsonl"),
    );
    tb.run(
        "multistream",
        &[
            "-P",
            "2",
            "--reps",
            "1",
            "--duration",
            "200ms",
            "--conditions",
            "offload=off,on",
        ],
        &dir.path().join("m.jsonl"),
    );
    assert_eq!(offloads_of(&tb), before, "after a workload run");
    let status = || {
        ok(netgap()
            .args(["testbed", "status", "--name", "tkern"])
            .output()
            .expect("status"))
    };
    let out = status();
    assert!(out.contains("offload as the kernel set it"), "{out}");
    assert!(out.contains("live links: as the hosts file says"), "{out}");

    // Ctrl-C in the middle of a run under conditions: the links go back.
    let run = netgap()
        .args(["run", "stream", "--hosts", &tb.hosts_arg()])
        .args(["-s", "64K", "--reps", "1000", "--rep-time", "50ms"])
        .args(["--conditions", "offload=off,on"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tb.hosts().conditions.and_then(|c| c.offload).is_none() {
        assert!(Instant::now() < deadline, "the run never switched");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("interrupt");
    let out = run.wait_with_output().expect("run ends");
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("putting testbed tkern's links back"),
        "{stderr}"
    );
    assert_eq!(offloads_of(&tb), before, "after an interrupted run");
    assert!(status().contains("live links: as the hosts file says"));

    // A change behind netgap's back: status names it, and `up` with the
    // same parameters does not keep the testbed as it is.
    let gso = if before[0].contains("generic-segmentation-offload: on") {
        "off"
    } else {
        "on"
    };
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &tb.ns("h1"),
            "ethtool",
            "-K",
            "eth0",
            "gso",
            gso,
        ],
    );
    let out = status();
    assert!(out.contains("live links DIFFER"), "{out}");
    assert!(
        out.contains(&format!("eth0: generic-segmentation-offload {gso}")),
        "{out}"
    );
    let out = ok(netgap()
        .args(["testbed", "up", "--name", "tkern", "--hosts", "2"])
        .output()
        .expect("up"));
    assert!(out.contains("rebuilding testbed tkern"), "{out}");
    assert_eq!(offloads_of(&tb), before, "after the rebuild");
    let _ = tb.down();
    tb.assert_gone();
}
