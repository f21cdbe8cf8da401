//! Wrapped programs on two testbed hosts whose connection goes direct:
//! each end's library asks its host's relay, the relays agree on a queue,
//! and each program drives netgap's xdp transport on an AF_XDP socket of
//! its own (`netgap-preload`'s `direct`), the relays' rings carrying
//! nothing. A C program (`preload_direct.c`) plays a 1-byte ping-pong and
//! then streams some MiB each way, every byte checked at both ends; a
//! relay started with `--no-direct` keeps the connection on the relays'
//! path, both ends saying why.
//!
//! Built only with the `xdp` feature (the library then has its own);
//! without root, namespaces or a C compiler the tests print why and pass
//! (with NETGAP_REQUIRE_SYSTEM_TESTS=1 that is a failure).

use crate::common::procs::Terminated;
use crate::common::testbed::Testbed;
use crate::common::{self, system_ready};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

/// Rounds of the ping-pong.
const ROUNDS: &str = "2000";
/// Bytes of the stream each way.
const STREAM_BYTES: &str = "4194304";

/// The relays of `tb`, each logging to `DIR/relay-HOST.log`, the second
/// host's with `second_flags` too; returned once each listens.
fn relays(
    tb: &Testbed,
    key: &Path,
    dir: &Path,
    second_flags: &[&str],
) -> Vec<(Terminated, PathBuf)> {
    let hosts = tb.hosts();
    let mut relays = Vec::new();
    for (k, h) in hosts.hosts.iter().enumerate() {
        let log = dir.join(format!("relay-{}.log", h.name));
        let mut cmd = tb.relay_command(&h.name, key);
        if k == 1 {
            cmd.args(second_flags);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a relay log"))
            .spawn()
            .expect("netgap relay");
        relays.push((Terminated(child), log));
    }
    for (_, log) in &relays {
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("listening on")
        {
            assert!(t0.elapsed().as_secs() < 20, "the relay does not listen");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    relays
}

/// The program `exe` with `args` under the library (`-t xdp`) in `host`'s
/// namespace, its library log at `log`.
fn wrapped(tb: &Testbed, host: &str, exe: &Path, args: &[&str], log: &Path) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", &tb.ns(host)])
        .arg(common::netgap_path())
        .args(["wrap", "-t", "xdp", "--", "timeout", "-s", "KILL", "120"])
        .arg(exe)
        .args(args)
        .env("NETGAP_PRELOAD", common::preload_library())
        .env("NETGAP_PRELOAD_DIRECT", "1")
        .env("NETGAP_PRELOAD_LOG", log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("netgap wrap")
}

/// What a program said and how it ended.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Waits until the server `child` says it listens (its beacon is up
/// then, so a connector's probe finds it); the rest of its output.
fn listening(child: &mut Child) -> BufReader<ChildStdout> {
    let mut out = BufReader::new(child.stdout.take().expect("the server's output"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the server's first line");
    assert_eq!(line.trim(), "listening", "the server did not listen");
    out
}

/// Waits for `child`, whose output from `rest` on is read.
fn ended(mut child: Child, rest: Option<BufReader<ChildStdout>>) -> Ran {
    let mut stdout = String::new();
    match rest {
        Some(mut r) => r.read_to_string(&mut stdout),
        None => child
            .stdout
            .take()
            .expect("the output")
            .read_to_string(&mut stdout),
    }
    .expect("the program's output");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("the errors")
        .read_to_string(&mut stderr)
        .expect("the program's errors");
    let ok = child.wait().expect("the program ends").success();
    Ran { ok, stdout, stderr }
}

/// The ping-pong and the streams between the two hosts of `tb`: the
/// server's and the client's output and library logs.
fn ping_pong(tb: &Testbed, exe: &Path, dir: &Path, port: &str) -> [(Ran, String); 2] {
    ping_pong_as(tb, exe, dir, port, "server")
}

/// [`ping_pong`] with the server's `mode` (`server`, `forkserver`).
fn ping_pong_as(
    tb: &Testbed,
    exe: &Path,
    dir: &Path,
    port: &str,
    mode: &str,
) -> [(Ran, String); 2] {
    pair(tb, exe, dir, port, [mode, "client"], ROUNDS, STREAM_BYTES)
}

/// The server `modes[0]` and the client `modes[1]` of `preload_direct.c`
/// between the two hosts of `tb`, `rounds` of ping-pong then the streams
/// of `stream` bytes: the server's and the client's output and library
/// logs.
fn pair(
    tb: &Testbed,
    exe: &Path,
    dir: &Path,
    port: &str,
    modes: [&str; 2],
    rounds: &str,
    stream: &str,
) -> [(Ran, String); 2] {
    pair_on(tb, exe, dir, port, modes, (rounds, stream), [1, 0])
}

/// [`pair`] with the server on host `on[0]` of `tb` and the client on
/// host `on[1]`.
fn pair_on(
    tb: &Testbed,
    exe: &Path,
    dir: &Path,
    port: &str,
    modes: [&str; 2],
    (rounds, stream): (&str, &str),
    on: [usize; 2],
) -> [(Ran, String); 2] {
    let hosts = tb.hosts();
    let (h1, h2) = (&hosts.hosts[on[1]], &hosts.hosts[on[0]]);
    let server_log = dir.join("library-server.log");
    let client_log = dir.join("library-client.log");
    let mut server = wrapped(
        tb,
        &h2.name,
        exe,
        &[modes[0], port, rounds, stream],
        &server_log,
    );
    let rest = listening(&mut server);
    let ip = h2.address.to_string();
    let client = wrapped(
        tb,
        &h1.name,
        exe,
        &[modes[1], &ip, port, rounds, stream],
        &client_log,
    );
    let c = ended(client, None);
    let s = ended(server, Some(rest));
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    [(s, read(&server_log)), (c, read(&client_log))]
}

fn all_logs(relays: &[(Terminated, PathBuf)]) -> String {
    relays
        .iter()
        .map(|(_, log)| std::fs::read_to_string(log).unwrap_or_default())
        .collect()
}

/// Both ends ended well; else every end's output and library log (the
/// end that failed first is often not the one at fault), and the relays'.
fn check_ok(ends: &[(Ran, String)], relay_logs: &str) {
    if ends
        .iter()
        .all(|(out, _)| out.ok && out.stdout.contains("direct: ok"))
    {
        return;
    }
    let said: String = ends
        .iter()
        .map(|(out, log)| {
            format!(
                "ok: {}\n{}{}the library:\n{log}\n",
                out.ok, out.stdout, out.stderr
            )
        })
        .collect();
    panic!("{said}the relays:\n{relay_logs}");
}

/// Both ends' library logs say the connection (to `port`, when given)
/// moved to direct; else both logs and the relays'.
fn assert_direct_at_both_ends(port: Option<&str>, server: &str, client: &str, relay_logs: &str) {
    let connector = match port {
        Some(port) => format!("connection to port {port} moved to direct on queue"),
        None => "moved to direct on queue".to_string(),
    };
    assert!(
        client.contains(&connector)
            && server.contains("accepted connection moved to direct on queue"),
        "the client:\n{client}\nthe server:\n{server}\nthe relays:\n{relay_logs}"
    );
}

/// Stops the relays and takes the testbed down, checking that no relay
/// and nothing of the testbed is left.
fn stop_all(relays: Vec<(Terminated, PathBuf)>, tb: &Testbed) {
    drop(relays);
    tb.assert_no_relay();
    tb.down();
    tb.assert_gone();
}

#[test]
fn a_ping_pong_and_a_stream_across_hosts_go_direct_at_both_ends_with_every_byte_checked() {
    let test =
        "a_ping_pong_and_a_stream_across_hosts_go_direct_at_both_ends_with_every_byte_checked";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirect", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    let ends = ping_pong(&tb, &exe, dir.path(), "7700");
    let relay_logs = all_logs(&relays);
    check_ok(&ends, &relay_logs);
    let [(_, server), (client_out, client)] = &ends;
    assert_direct_at_both_ends(Some("7700"), server, client, &relay_logs);
    for log in [server, client] {
        // Nothing went through a relay's ring.
        assert!(!log.contains("via the relay"), "{log}");
        assert!(!log.contains("relayed connection closed"), "{log}");
        assert!(log.contains("direct connection on queue"), "{log}");
    }
    assert_eq!(
        relay_logs.matches("direct: granted queue").count(),
        2,
        "{relay_logs}"
    );
    eprintln!("{test}: {}", client_out.stdout.trim());
    // Each program's exit hung its relay socket up: the queues are free.
    let t0 = std::time::Instant::now();
    while all_logs(&relays).matches("is free again").count() < 2 {
        assert!(
            t0.elapsed().as_secs() < 10,
            "the queues stay held:\n{}",
            all_logs(&relays)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    stop_all(relays, &tb);
}

/// A regression test: a thread writing while the connector's offer went
/// direct put its bytes into the ring after the ring's bytes were taken
/// to go first on the direct connection, and they were lost.
#[test]
fn bytes_written_by_another_thread_while_the_offer_goes_direct_all_arrive_in_order() {
    let test = "bytes_written_by_another_thread_while_the_offer_goes_direct_all_arrive_in_order";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirrace", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    let ends = pair(
        &tb,
        &exe,
        dir.path(),
        "7705",
        ["server", "threadclient"],
        "0",
        STREAM_BYTES,
    );
    let relay_logs = all_logs(&relays);
    check_ok(&ends, &relay_logs);
    let [(_, server), (_, client)] = &ends;
    assert_direct_at_both_ends(Some("7705"), server, client, &relay_logs);
    stop_all(relays, &tb);
}

/// A regression test: `select` on a direct connection watched its kernel
/// socket, which never becomes readable, so a client waiting in select
/// for each read never read. Then, in about three runs of four, its first
/// wait still slept through the reply: the wait began while the
/// connection's offer was open, on its kernel socket, and the library's
/// thread that watches the offer took the listener's answer off that
/// socket first and moved the connection direct, so nothing woke the wait
/// (the reply came on the connection's AF_XDP socket) and the server's
/// read timed out after the transport's 10 s. `poll` had the same fault;
/// a second client waits in poll, a third in an epoll (which did not: the
/// move registers the connection's AF_XDP socket in the program's epolls,
/// and a registration wakes a wait already asleep), against a server
/// that is non-blocking in an epoll too, whose accepted connection goes
/// direct while it waits there.
#[test]
fn a_client_that_waits_in_select_poll_or_epoll_for_each_read_sees_its_direct_connection_readable() {
    let test =
        "a_client_that_waits_in_select_poll_or_epoll_for_each_read_sees_its_direct_connection_readable";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirsel", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    // The epoll client's server is non-blocking in an epoll too.
    for (server, client, port) in [
        ("server", "selectclient", "7706"),
        ("server", "pollclient", "7707"),
        ("epollserver", "epollclient", "7708"),
    ] {
        let logs = dir.path().join(client);
        std::fs::create_dir(&logs).expect("a log directory");
        let ends = pair(
            &tb,
            &exe,
            &logs,
            port,
            [server, client],
            "200",
            STREAM_BYTES,
        );
        let relay_logs = all_logs(&relays);
        check_ok(&ends, &relay_logs);
        let [(_, server), (_, client)] = &ends;
        assert_direct_at_both_ends(Some(port), server, client, &relay_logs);
    }
    stop_all(relays, &tb);
}

/// Waits until the relays of `relays` logged `n` queues free again, for
/// at most `within`.
fn queues_free(relays: &[(Terminated, PathBuf)], n: usize, within: std::time::Duration) {
    let t0 = std::time::Instant::now();
    while all_logs(relays).matches("is free again").count() < n {
        assert!(
            t0.elapsed() < within,
            "the queues stay held:\n{}",
            all_logs(relays)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A regression test: a direct connection whose program closed it before
/// both ends finished connecting, or with its peer's bytes unread, told
/// its peer nothing, and the peer waited out the transport's silence
/// limit (10 s) holding its queue, its process's exit waiting on it (Open
/// MPI throws one of two crossing connections away so). A server that
/// closes with the client's greeting unread resets the connection, as the
/// kernel's close does: the client's read fails with ECONNRESET at once,
/// its close returns at once, and both relays free their queues within a
/// second or two; a client that closes at once after its greeting, while
/// its connection is still being offered, is done as soon, and its
/// process's exit with it. A server that closes its accepted connection
/// while the grant waits unread on its request socket (the client already
/// on its direct connection) resets the client as soon: the close takes
/// the grant first (it used to drop it, and the client waited out its
/// silence limit).
/// Closes end the peer's connection at once (a reset with bytes unread),
/// and so does a program's exit with its connection still open, as the
/// kernel ends an exiting process's connections; both queues go free each
/// time.
#[test]
fn a_close_or_an_exit_ends_the_peers_connection_at_once_and_frees_both_queues() {
    let test = "a_close_or_an_exit_ends_the_peers_connection_at_once_and_frees_both_queues";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirclose", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    // Built before the clock starts.
    common::preload_library();
    let mut freed = 0;
    for (server_mode, client_mode, port) in [
        ("closeserver", "closeclient", "7712"),
        ("closeserver", "closenowclient", "7713"),
        ("closeearlyserver", "closeclient", "7714"),
        ("closeearlyserver", "closenowclient", "7715"),
        // Closed while its grant was in but not yet taken: the close takes
        // it and ends the direct connection, which the client is on.
        ("closegrantserver", "closeclient", "7716"),
    ] {
        let logs = dir.path().join(port);
        std::fs::create_dir(&logs).expect("a log directory");
        let t0 = std::time::Instant::now();
        let ends = pair(&tb, &exe, &logs, port, [server_mode, client_mode], "0", "0");
        let took = t0.elapsed();
        let relay_logs = all_logs(&relays);
        check_ok(&ends, &relay_logs);
        let [(server_out, server), (client_out, client)] = &ends;
        if server_mode == "closegrantserver" {
            assert!(
                server_out.stdout.contains("closed_while_granting 1"),
                "the grant was taken before the close:\n{}\n{server}",
                server_out.stdout
            );
        }
        assert_direct_at_both_ends(Some(port), server, client, &relay_logs);
        for log in [server, client] {
            assert!(!log.contains("timed out"), "{log}");
            assert!(!log.contains("shm connection closed"), "{log}");
        }
        let said = |key: &str| -> u64 {
            client_out
                .stdout
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {}", client_out.stdout))
        };
        if client_mode == "closeclient" {
            let read_ms = said("read_ms ");
            assert!(read_ms < 2000, "the end took {read_ms} ms\n{client}");
            // The greeting was there, unread, when the server closed: a
            // reset, not the end.
            if server_mode == "closeserver" {
                assert!(
                    client_out.stdout.contains("(Connection reset by peer)"),
                    "{}",
                    client_out.stdout
                );
            }
        }
        let close_ns = said("close_ns ");
        assert!(
            close_ns < 50_000_000,
            "the close took {close_ns} ns\n{client}"
        );
        // Both programs ran and exited well within the silence limit.
        assert!(
            took < std::time::Duration::from_secs(6),
            "{server_mode}, {client_mode}: the pair took {took:?}\n{client}\n{server}"
        );
        freed += 2;
        queues_free(&relays, freed, std::time::Duration::from_secs(2));
        eprintln!(
            "{test}: {server_mode}, {client_mode}: both ends done in {} ms",
            took.as_millis()
        );
    }
    // A client that writes its stream and exits with the connection open:
    // the server reads every byte, then the end, at once; with the
    // socket's SO_LINGER 0, a reset, as the kernel's exit gives.
    for (modes, port) in [
        (["endserver", "exitclient"], "7717"),
        (["resetserver", "resetexitclient"], "7718"),
    ] {
        let logs = dir.path().join(modes[1]);
        std::fs::create_dir(&logs).expect("a log directory");
        let ends = pair(&tb, &exe, &logs, port, modes, "0", "1048576");
        let relay_logs = all_logs(&relays);
        check_ok(&ends, &relay_logs);
        let [(server_out, server), (_, client)] = &ends;
        assert_direct_at_both_ends(Some(port), server, client, &relay_logs);
        let end_ms: u64 = server_out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("end_ms "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no end_ms in {}", server_out.stdout));
        assert!(
            end_ms < 2000,
            "{modes:?}: the end took {end_ms} ms\n{client}\n{server}"
        );
        assert!(
            client.contains("direct connection on queue") && client.contains("closed:"),
            "{modes:?}: the exit logged no close:\n{client}"
        );
        freed += 2;
        queues_free(&relays, freed, std::time::Duration::from_secs(2));
        eprintln!("{test}: {modes:?}: the end came {end_ms} ms after the stream");
    }
    stop_all(relays, &tb);
}

#[test]
fn a_relay_with_no_direct_keeps_the_connection_on_the_relays_path_at_both_ends() {
    let test = "a_relay_with_no_direct_keeps_the_connection_on_the_relays_path_at_both_ends";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirno", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    // The server's relay refuses direct connections.
    let relays = relays(&tb, &key, dir.path(), &["--no-direct"]);
    let ends = ping_pong(&tb, &exe, dir.path(), "7701");
    let relay_logs = all_logs(&relays);
    check_ok(&ends, &relay_logs);
    let [(_, server), (_, client)] = &ends;
    common::assert_relayed_at_both_ends(&format!("{server}{client}"));
    for log in [server, client] {
        assert!(!log.contains("moved to direct"), "{log}");
        // One line at each end says why.
        assert_eq!(log.matches(": relay: ").count(), 1, "{log}");
    }
    assert!(server.contains("--no-direct"), "{server}");
    // The other way round the client's relay refuses, and the server's
    // refuses the server's side only when its wait for the other half
    // passes (3 s): a non-blocking server waiting in an epoll never waits
    // for it in its calls, and is woken when the refusal comes.
    let back = dir.path().join("back");
    std::fs::create_dir(&back).expect("a log directory");
    let ends = pair_on(
        &tb,
        &exe,
        &back,
        "7709",
        ["epollserver", "client"],
        (ROUNDS, STREAM_BYTES),
        [0, 1],
    );
    let relay_logs = all_logs(&relays);
    check_ok(&ends, &relay_logs);
    let [(server_out, server), (_, client)] = &ends;
    common::assert_relayed_at_both_ends(&format!("{server}{client}"));
    for log in [server, client] {
        assert!(!log.contains("moved to direct"), "{log}");
        assert_eq!(log.matches(": relay: ").count(), 1, "{log}");
    }
    let first_peek_ms: u64 = server_out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("first_peek_ms "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no first peek in {}", server_out.stdout));
    assert!(
        first_peek_ms < 1000,
        "the first peek waited {first_peek_ms} ms:\n{}\n{server}",
        server_out.stdout
    );
    eprintln!("{test}: the server's first peek took {first_peek_ms} ms");
    stop_all(relays, &tb);
}

#[test]
fn a_killed_program_frees_its_queue_and_its_peer_sees_the_connection_time_out() {
    let test = "a_killed_program_frees_its_queue_and_its_peer_sees_the_connection_time_out";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirkill", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    let hosts = tb.hosts();
    let (h1, h2) = (&hosts.hosts[0], &hosts.hosts[1]);
    let server_log = dir.path().join("library-server.log");
    let client_log = dir.path().join("library-client.log");
    // Rounds enough to outlast the test: the client is killed in them.
    let rounds = "1000000000";
    let mut server = wrapped(
        &tb,
        &h2.name,
        &exe,
        &["server", "7702", rounds, "0"],
        &server_log,
    );
    let rest = listening(&mut server);
    let ip = h2.address.to_string();
    let mut client = wrapped(
        &tb,
        &h1.name,
        &exe,
        &["client", &ip, "7702", rounds, "0"],
        &client_log,
    );
    let t0 = std::time::Instant::now();
    let moved = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .contains("moved to direct on queue")
    };
    while !(moved(&server_log) && moved(&client_log)) {
        assert!(
            t0.elapsed().as_secs() < 20,
            "not direct:\n{}\n{}",
            std::fs::read_to_string(&server_log).unwrap_or_default(),
            std::fs::read_to_string(&client_log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The program itself, by its executable (a path of this test's own
    // directory), killed at once.
    let pids = Command::new("pgrep")
        .args(["-f", &format!("^{} client", exe.display())])
        .output()
        .expect("pgrep");
    let pids = String::from_utf8_lossy(&pids.stdout).to_string();
    assert_eq!(pids.lines().count(), 1, "{pids}");
    let pid: i32 = pids.trim().parse().expect("a pid");
    // SAFETY: a plain kill of the test's own child program.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let _ = client.wait();
    // The server's calls see the peer gone within the silence limit (10
    // s), as ETIMEDOUT, never a hang.
    let killed_at = std::time::Instant::now();
    let s = ended(server, Some(rest));
    let waited = killed_at.elapsed();
    let stderr = s.stderr;
    assert!(!s.ok, "{stderr}");
    assert!(stderr.contains("Connection timed out"), "{stderr}");
    assert!(waited.as_secs() < 30, "{waited:?}");
    // Both programs gone: both relays freed their queues.
    let t1 = std::time::Instant::now();
    while all_logs(&relays).matches("is free again").count() < 2 {
        assert!(
            t1.elapsed().as_secs() < 10,
            "the queues stay held:\n{}",
            all_logs(&relays)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // No AF_XDP socket is left in either namespace but each relay's own
    // (queue 0).
    for h in [h1, h2] {
        let ss = Command::new("ip")
            .args([
                "netns",
                "exec",
                &tb.ns(&h.name),
                "ss",
                "-f",
                "xdp",
                "-a",
                "-n",
                "-H",
            ])
            .output()
            .expect("ss");
        let text = String::from_utf8_lossy(&ss.stdout).to_string();
        assert!(text.lines().count() <= 1, "{}: {text}", h.name);
    }
    eprintln!(
        "{test}: the server saw the peer gone after {} ms",
        waited.as_millis()
    );
    stop_all(relays, &tb);
}

#[test]
fn a_server_that_forks_after_accept_serves_the_direct_connection_from_its_child() {
    let test = "a_server_that_forks_after_accept_serves_the_direct_connection_from_its_child";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirfork", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    let ends = ping_pong_as(&tb, &exe, dir.path(), "7703", "forkserver");
    let relay_logs = all_logs(&relays);
    check_ok(&ends, &relay_logs);
    let [(_, server), (_, client)] = &ends;
    // The child, the first to read the accepted connection, set it up and
    // drove it; the parent's close of its copy sent nothing.
    assert_direct_at_both_ends(None, server, client, &relay_logs);
    assert!(!server.contains("EBADFD"), "{server}");
    stop_all(relays, &tb);
}

/// A regression test: an edge-triggered epoll registration of a direct
/// connection was reported only when the connection's readiness gained
/// an event since the last wait looked, so a server that read a request
/// short, answered, and was back in its wait only after the next request
/// arrived slept on that request (nginx kept a client waiting until it
/// gave up). Each round's request is there before the server's wait.
#[test]
fn an_edge_triggered_server_sees_a_request_that_arrived_before_its_wait() {
    let test = "an_edge_triggered_server_sees_a_request_that_arrived_before_its_wait";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdiredge", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    let ends = pair(
        &tb,
        &exe,
        dir.path(),
        "7708",
        ["edgeserver", "client"],
        "100",
        "65536",
    );
    let relay_logs = all_logs(&relays);
    check_ok(&ends, &relay_logs);
    let [(_, server), (_, client)] = &ends;
    assert_direct_at_both_ends(Some("7708"), server, client, &relay_logs);
    stop_all(relays, &tb);
}

/// The progress thread: a server that makes no socket call for longer
/// than the transport's silence limit (10 s) while its client's stream
/// arrives and the client waits for the answer is still answered for (the
/// client does not time out, and every byte arrives), and the client's
/// close returns at once while the server is quiet again, its linger
/// finished in the background.
#[test]
fn a_program_quiet_past_the_silence_limit_keeps_its_peer_and_a_close_returns_at_once() {
    // Also: a connection past its user's cap of queues falls back to the
    // relays at once at both ends while the quiet one holds the queue.
    let test = "a_program_quiet_past_the_silence_limit_keeps_its_peer_and_a_close_returns_at_once";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirquiet", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    // Built before the quiet pair starts, so that its wait for the direct
    // connection below does not include the library's build.
    common::preload_library();
    // The server's user may hold one queue: the quiet connection's.
    let relays = relays(&tb, &key, dir.path(), &["--max-direct-per-uid", "1"]);
    let past = dir.path().join("past");
    std::fs::create_dir(&past).expect("a log directory");
    let (ends, past_ends) = std::thread::scope(|s| {
        let quiet = s.spawn(|| {
            pair(
                &tb,
                &exe,
                dir.path(),
                "7707",
                ["quietserver", "quietclient"],
                "0",
                "65536",
            )
        });
        let server_log = dir.path().join("library-server.log");
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(&server_log)
            .unwrap_or_default()
            .contains("moved to direct")
        {
            assert!(
                t0.elapsed().as_secs() < 10,
                "the quiet connection is not direct"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // While the quiet connection holds the server's queue, a second
        // connection is past its user's cap: both ends fall back to the
        // relays at once, every byte checked.
        let past_ends = pair_on(
            &tb,
            &exe,
            &past,
            "7711",
            ["epollserver", "client"],
            ("200", "65536"),
            [1, 0],
        );
        (quiet.join().expect("the quiet pair"), past_ends)
    });
    let relay_logs = all_logs(&relays);
    check_ok(&past_ends, &relay_logs);
    let [(past_out, past_server), (_, past_client)] = &past_ends;
    common::assert_relayed_at_both_ends(&format!("{past_server}{past_client}"));
    for log in [past_server, past_client] {
        assert!(!log.contains("moved to direct"), "{log}");
        assert_eq!(log.matches(": relay: ").count(), 1, "{log}");
    }
    let first_peek_ms: u64 = past_out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("first_peek_ms "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no first peek in {}", past_out.stdout));
    assert!(
        first_peek_ms < 1000,
        "the first peek waited {first_peek_ms} ms"
    );
    check_ok(&ends, &relay_logs);
    let [(_, server), (client_out, client)] = &ends;
    assert_direct_at_both_ends(Some("7707"), server, client, &relay_logs);
    // The close did not wait for the quiet server's acknowledgment, which
    // the transport's linger (300 ms) would have.
    let close_ns: u64 = client_out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("close_ns "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no close time: {}", client_out.stdout));
    let linger_ns = netgap_transport::xdp::direct::CLOSE_LINGER.as_nanos() as u64;
    assert!(
        close_ns < linger_ns / 2,
        "the close took {close_ns} ns, the linger's time\n{client}"
    );
    stop_all(relays, &tb);
}

#[test]
fn a_direct_connection_kept_across_exec_is_shut_down_in_the_new_image() {
    let test = "a_direct_connection_kept_across_exec_is_shut_down_in_the_new_image";
    if !system_ready(test) || !common::installed(test, &[("/usr/bin/cc", "gcc")]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(dir.path(), "direct", include_str!("preload_direct.c"), "cc");
    let (tb, _) = Testbed::up("pdirexec", &["--hosts", "2", "--links", "2"]);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = relays(&tb, &key, dir.path(), &[]);
    let hosts = tb.hosts();
    let (h1, h2) = (&hosts.hosts[0], &hosts.hosts[1]);
    let server_log = dir.path().join("library-server.log");
    let client_log = dir.path().join("library-client.log");
    // One round on the direct connection, then the server execs itself
    // keeping the descriptor; the client then streams and waits.
    let mut server = wrapped(
        &tb,
        &h2.name,
        &exe,
        &["execserver", "7704", "1", "1"],
        &server_log,
    );
    let rest = listening(&mut server);
    let ip = h2.address.to_string();
    let client = wrapped(
        &tb,
        &h1.name,
        &exe,
        &["client", &ip, "7704", "1", "1"],
        &client_log,
    );
    let s = ended(server, Some(rest));
    let c = ended(client, None);
    let server_text = std::fs::read_to_string(&server_log).unwrap_or_default();
    let client_text = std::fs::read_to_string(&client_log).unwrap_or_default();
    // The new image read the end and its write failed, at once.
    assert!(
        s.ok && s.stdout.contains("direct: ok"),
        "{}{}\n{server_text}",
        s.stdout,
        s.stderr
    );
    assert!(
        server_text.contains("accepted connection moved to direct on queue"),
        "{server_text}"
    );
    assert_eq!(
        server_text.matches("does not survive exec").count(),
        1,
        "{server_text}"
    );
    // The client's peer went silent: its wait ends in ETIMEDOUT.
    assert!(!c.ok, "{}", c.stdout);
    assert!(
        c.stderr.contains("Connection timed out"),
        "{}\n{client_text}",
        c.stderr
    );
    // The old image's socket went with exec: both queues are free.
    let t0 = std::time::Instant::now();
    while all_logs(&relays).matches("is free again").count() < 2 {
        assert!(
            t0.elapsed().as_secs() < 10,
            "the queues stay held:\n{}",
            all_logs(&relays)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    stop_all(relays, &tb);
}
