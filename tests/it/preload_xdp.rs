//! The preload library across hosts (`netgap wrap -t xdp`): on a two-host
//! mesh testbed with two links (the TCP connection takes the first, the
//! relays' xdp flow the second), a `netgap relay` in each host's
//! namespace, real nginx wrapped on host 2 and curl wrapped on host 1:
//! every 1 MiB body's sha256 verified, the library's logs saying each
//! connection moved to xdp through the relay with the kernel TCP socket
//! carrying under 1% of the payload, and the relays' counters showing the
//! body crossed them; a connection half-closed with megabytes still in the
//! relays delivers every byte both ways, its end behind them; with no
//! relay on the server's host the connection stays on the kernel's TCP
//! and still works; a relay killed mid-transfer
//! gives curl an error within the timeout, and once a relay runs again the
//! next transfer goes through it (nothing was left holding the queue);
//! wrk with eight connections and eight curls at once all move to the
//! relays over one link (nginx and wrk woken by their own host's relay
//! on the relay socket the library registers in their epolls) (no refusal, every body verified, the link's close
//! line counting every connection), a curl stopped mid-transfer stalls
//! only its own connection (a second transfer completes meanwhile), and
//! once the idle link closed the next connection opens a new one; a
//! server's relay carries two client hosts' connections on two links at
//! once, and past its `--max-links` keeps a connection on the kernel's TCP.
//!
//! Built only with the `xdp` feature; without root, namespaces or nginx
//! and curl these tests print why and pass (with
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 that is a failure).

use crate::common::testbed::Testbed;
use crate::common::{self, netgap_path, system_ready};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn programs_ready(test: &str) -> bool {
    common::installed(
        test,
        &[
            ("/usr/sbin/nginx", "nginx-light"),
            ("/usr/bin/curl", "curl"),
        ],
    )
}

/// A child process stopped (TERM, then KILL) and reaped on drop.
struct Guard(Child);

impl Guard {
    fn stop(&mut self, signal: i32) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.0.id() as i32, signal) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop(libc::SIGTERM);
    }
}

/// `netgap relay` on `host` of `tb` (its interface: the host's end of the
/// second link; the other hosts served; `key`, the relays' key), logging
/// to `log`; up once its socket answers.
fn relay(tb: &Testbed, host: &str, key: &Path, log: &Path) -> Guard {
    relay_with(tb, host, key, log, &[])
}

/// [`relay`] with more flags. These tests are the relayed path's: the
/// relays refuse direct connections (`preload_direct.rs` has those), but
/// for [`direct_relay`]'s.
fn relay_with(tb: &Testbed, host: &str, key: &Path, log: &Path, flags: &[&str]) -> Guard {
    relay_of(tb, host, key, log, &[&["--no-direct"], flags].concat())
}

/// [`relay`] serving direct connections too.
fn direct_relay(tb: &Testbed, host: &str, key: &Path, log: &Path) -> Guard {
    relay_of(tb, host, key, log, &[])
}

fn relay_of(tb: &Testbed, host: &str, key: &Path, log: &Path, flags: &[&str]) -> Guard {
    let child = tb
        .relay_command(host, key)
        .args(["--timeout-ms", "3000"])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("relay log"))
        .spawn()
        .expect("the relay starts");
    let g = Guard(child);
    await_text(
        log,
        "listening on @netgap-relay",
        10,
        "the relay did not come up",
    );
    g
}

/// Waits up to `secs` for `log` to contain `marker`, failing with `what`
/// and the log.
fn await_text(log: &Path, marker: &str, secs: u64, what: &str) {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(marker) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(secs), "{what}: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ip netns exec NS netgap wrap -t xdp -- timeout -s KILL 300 PROGRAM
/// ARGS`, logging the library to `log`, its connections to other hosts
/// on the relays (`NETGAP_PRELOAD_DIRECT=0`) unless the caller's
/// environment says otherwise.
fn wrapped(ns: &str, program: &str, args: &[&str], log: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .arg(netgap_path())
        .args([
            "wrap", "-t", "xdp", "--", "timeout", "-s", "KILL", "300", program,
        ])
        .args(args)
        .env("NETGAP_PRELOAD", common::preload_library())
        .env("NETGAP_PRELOAD_DIRECT", "0")
        .env("NETGAP_PRELOAD_LOG", log);
    c
}

/// [`nginx`] asking for direct connections (`NETGAP_PRELOAD_DIRECT`).
fn direct_nginx(ns: &str, ip: &str, dir: &Path, root: &Path, log: &Path) -> Guard {
    nginx_with(ns, ip, dir, root, log, &[("NETGAP_PRELOAD_DIRECT", "1")])
}

/// [`curl`] asking for direct connections (`NETGAP_PRELOAD_DIRECT`).
fn direct_curl(ns: &str, url: &str, out: &Path, log: &Path) -> (bool, String, Duration) {
    curl_with(ns, url, out, &[], log, &[("NETGAP_PRELOAD_DIRECT", "1")])
}

/// A docroot with `f1m` (1 MiB) and `f16m` (16 MiB) of pseudo-random
/// bytes; the sha256 of `f1m`.
fn docroot(dir: &Path) -> (PathBuf, String) {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).expect("docroot");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (name, len) in [("f1m", 1usize << 20), ("f16m", 16 << 20)] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(root.join(name), bytes).expect("a file");
    }
    (root.clone(), sha256(&root.join("f1m")))
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

/// Wrapped nginx (two workers, sendfile, running as root like the relay's
/// clients) on `ip:8080` in `ns`.
fn nginx(ns: &str, ip: &str, dir: &Path, root: &Path, log: &Path) -> Guard {
    nginx_with(ns, ip, dir, root, log, &[])
}

/// [`nginx`] with more environment.
fn nginx_with(
    ns: &str,
    ip: &str,
    dir: &Path,
    root: &Path,
    log: &Path,
    env: &[(&str, &str)],
) -> Guard {
    let run = dir.join("nginx");
    std::fs::create_dir_all(&run).expect("run dir");
    let d = run.display();
    let conf = format!(
        "daemon off;\nuser root root;\nmaster_process on;\nworker_processes 2;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\nevents {{ worker_connections 64; }}\n\
         http {{\n access_log off;\n sendfile on;\n tcp_nopush on;\n tcp_nodelay on;\n\
         client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
         types {{ }}\n default_type application/octet-stream;\n\
         server {{ listen {ip}:8080; root {root}; }}\n}}\n",
        root = root.display()
    );
    let conf_path = run.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("nginx.conf");
    let err = run.join("error.log");
    let child = wrapped(
        ns,
        "/usr/sbin/nginx",
        &[
            "-p",
            run.to_str().expect("utf-8"),
            "-e",
            err.to_str().expect("utf-8"),
            "-c",
            conf_path.to_str().expect("utf-8"),
        ],
        log,
    )
    .envs(env.iter().copied())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("nginx starts");
    let g = Guard(child);
    let t0 = Instant::now();
    while !run.join("nginx.pid").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "nginx did not come up: {}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    g
}

/// Wrapped curl in `ns` fetching `url` into `out`; its exit status and
/// stderr, and how long it took.
fn curl(ns: &str, url: &str, out: &Path, extra: &[&str], log: &Path) -> (bool, String, Duration) {
    curl_with(ns, url, out, extra, log, &[])
}

/// [`curl`] with more environment.
fn curl_with(
    ns: &str,
    url: &str,
    out: &Path,
    extra: &[&str],
    log: &Path,
    env: &[(&str, &str)],
) -> (bool, String, Duration) {
    let t0 = Instant::now();
    let mut args = vec![
        "-sS",
        "--max-time",
        "60",
        "-o",
        out.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    args.push(url);
    let o = wrapped(ns, "/usr/bin/curl", &args, log)
        .envs(env.iter().copied())
        .output()
        .expect("curl runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        t0.elapsed(),
    )
}

/// Wrapped curl in `ns` fetching `f16m` from `ip` into `out` at 4 MB/s
/// (about 4 s), in the background.
fn slow_curl(ns: &str, ip: &str, out: &Path, log: &Path) -> Guard {
    let child = wrapped(
        ns,
        "/usr/bin/curl",
        &[
            "-sS",
            "--max-time",
            "120",
            "--limit-rate",
            "4M",
            "-o",
            out.to_str().expect("utf-8"),
            &format!("http://{ip}:8080/f16m"),
        ],
        log,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("curl starts");
    Guard(child)
}

/// The `name=` values of the library's or the relay's log lines that
/// contain `marker`.
fn counters(log: &Path, marker: &str, name: &str) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

/// [`counters`] once the log has `n` of them, or after 5 s what it has: a
/// relay logs a connection's close just after its program saw the end.
fn counters_of(log: &Path, marker: &str, name: &str, n: usize) -> Vec<u64> {
    let t0 = Instant::now();
    loop {
        let c = counters(log, marker, name);
        if c.len() >= n || t0.elapsed() > Duration::from_secs(5) {
            return c;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The testbed, its two hosts' namespaces and the server's first-link
/// address (the one the TCP connection takes).
/// Bytes the half-closing client writes before its shutdown, and the
/// server's reply: megabytes, so that some are still in the relays when
/// the client shuts down.
const HALF_CLOSE_BYTES: usize = 4 << 20;

/// The pattern both ends of [`half_close`] write and check (Python).
const HALF_CLOSE_PATTERN: &str = "def data(n, seed):\n\
     \x20   block = bytes((i * 7 + seed) % 256 for i in range(251))\n\
     \x20   return (block * (n // 251 + 1))[:n]\n\
     def read_to_end(s):\n\
     \x20   got = bytearray()\n\
     \x20   while True:\n\
     \x20       b = s.recv(1 << 20)\n\
     \x20       if not b:\n\
     \x20           return bytes(got)\n\
     \x20       got += b\n\
     def check(got, want, who):\n\
     \x20   if got != want:\n\
     \x20       at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))\n\
     \x20       raise SystemExit(f'{who} read {len(got)} bytes of {len(want)}, the first wrong at {at}')\n";

/// A relayed connection half-closed under load: a wrapped Python client
/// on `cns` writes [`HALF_CLOSE_BYTES`] to a wrapped Python server on
/// `sns` (`ip`, port 8090), shuts down its sending side at once and reads
/// the reply; the server reads every byte and then the end of the stream,
/// replies as much, and closes. Every byte is checked at both ends; the
/// libraries' logs (in `dir`) must say the connection went through the
/// relay at both ends.
fn half_close(cns: &str, sns: &str, ip: &str, dir: &Path) {
    use std::io::{BufRead, BufReader, Read};
    let n = HALF_CLOSE_BYTES;
    let server_script = format!(
        "{HALF_CLOSE_PATTERN}\
         import socket\n\
         l = socket.socket()\n\
         l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         l.bind(('0.0.0.0', 8090))\n\
         l.listen(1)\n\
         print('listening', flush=True)\n\
         c, _ = l.accept()\n\
         check(read_to_end(c), data({n}, 1), 'the server')\n\
         c.sendall(data({n}, 2))\n\
         c.close()\n\
         print('server: ok', flush=True)\n"
    );
    let client_script = format!(
        "{HALF_CLOSE_PATTERN}\
         import socket\n\
         s = socket.create_connection(('{ip}', 8090))\n\
         s.sendall(data({n}, 1))\n\
         s.shutdown(socket.SHUT_WR)\n\
         check(read_to_end(s), data({n}, 2), 'the client')\n\
         s.close()\n\
         print('client: ok')\n"
    );
    let (s_log, c_log) = (dir.join("half-server.log"), dir.join("half-client.log"));
    let mut server = Guard(
        wrapped(sns, "/usr/bin/python3", &["-c", &server_script], &s_log)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs"),
    );
    let mut lines = BufReader::new(server.0.stdout.take().expect("the server's output"));
    let mut first = String::new();
    lines
        .read_line(&mut first)
        .expect("the server's first line");
    assert_eq!(
        first.trim(),
        "listening",
        "the half-close server did not listen"
    );
    let out = wrapped(cns, "/usr/bin/python3", &["-c", &client_script], &c_log)
        .output()
        .expect("python3 runs");
    let mut rest = String::new();
    lines
        .read_to_string(&mut rest)
        .expect("the server's output");
    let mut errors = String::new();
    if let Some(mut e) = server.0.stderr.take() {
        e.read_to_string(&mut errors).expect("the server's errors");
    }
    let logs = || {
        format!(
            "the client's library:\n{}\nthe server's library:\n{}",
            std::fs::read_to_string(&c_log).unwrap_or_default(),
            std::fs::read_to_string(&s_log).unwrap_or_default()
        )
    };
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("client: ok"),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        logs()
    );
    assert!(rest.contains("server: ok"), "{rest}{errors}\n{}", logs());
    for log in [&c_log, &s_log] {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(text.contains("moved to xdp via the relay"), "{}", logs());
    }
}

fn testbed(name: &str) -> (Testbed, String, String, String) {
    let (tb, _) = Testbed::up(
        name,
        &["--hosts", "2", "--topology", "mesh", "--links", "2"],
    );
    let hosts = tb.hosts();
    let (client, server) = (&hosts.hosts[0], &hosts.hosts[1]);
    let ip = server.address.to_string();
    let (c, s) = (tb.ns(&client.name), tb.ns(&server.name));
    (tb, c, s, ip)
}

#[test]
fn nginx_and_curl_across_hosts_on_direct_connections_with_every_body_verified() {
    let test = "nginx_and_curl_across_hosts_on_direct_connections_with_every_body_verified";
    if !system_ready(test) || !programs_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, want) = docroot(dir.path());
    let (tb, cns, sns, ip) = testbed("pxdpdir");
    let key = common::new_key_file(dir.path(), "relay.key");
    let (r1_log, r2_log) = (dir.path().join("relay1.log"), dir.path().join("relay2.log"));
    let (s_log, c_log) = (dir.path().join("server.log"), dir.path().join("client.log"));
    let r1 = direct_relay(&tb, "h1", &key, &r1_log);
    let r2 = direct_relay(&tb, "h2", &key, &r2_log);
    // nginx's workers wait in epoll (edge-triggered) and send with
    // sendfile; curl waits in poll.
    let server = direct_nginx(&sns, &ip, dir.path(), &root, &s_log);
    let body = dir.path().join("body");
    let want16 = sha256(&root.join("f16m"));
    for (i, (file, digest)) in [("f1m", &want), ("f16m", &want16), ("f1m", &want)]
        .into_iter()
        .enumerate()
    {
        let url = format!("http://{ip}:8080/{file}");
        let (ok, err, took) = direct_curl(&cns, &url, &body, &c_log);
        let logs = || {
            format!(
                "the client:\n{}\nthe server:\n{}\nthe relays:\n{}{}",
                std::fs::read_to_string(&c_log).unwrap_or_default(),
                std::fs::read_to_string(&s_log).unwrap_or_default(),
                std::fs::read_to_string(&r1_log).unwrap_or_default(),
                std::fs::read_to_string(&r2_log).unwrap_or_default()
            )
        };
        assert!(ok, "fetch {i}: {err}\n{}", logs());
        assert_eq!(
            &sha256(&body),
            digest,
            "fetch {i}: the body differs\n{}",
            logs()
        );
        eprintln!("{test}: {file} in {} ms", took.as_millis());
    }
    let client_log = std::fs::read_to_string(&c_log).unwrap_or_default();
    let server_log = std::fs::read_to_string(&s_log).unwrap_or_default();
    assert_eq!(
        client_log.matches("moved to direct on queue").count(),
        3,
        "{client_log}"
    );
    assert_eq!(
        server_log
            .matches("accepted connection moved to direct on queue")
            .count(),
        3,
        "{server_log}"
    );
    assert!(!client_log.contains("via the relay"), "{client_log}");
    assert!(!server_log.contains("via the relay"), "{server_log}");
    drop(server);
    drop((r1, r2));
    tb.assert_no_relay();
    tb.down();
    tb.assert_gone();
}

#[test]
fn nginx_and_curl_across_hosts_through_the_relays_then_without_a_relay_on_kernel_tcp() {
    let test = "nginx_and_curl_across_hosts_through_the_relays_then_without_a_relay_on_kernel_tcp";
    if !system_ready(test) || !programs_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, want) = docroot(dir.path());
    let (tb, cns, sns, ip) = testbed("pxdp1");
    let key = common::new_key_file(dir.path(), "relay.key");
    let (r1_log, r2_log) = (dir.path().join("relay1.log"), dir.path().join("relay2.log"));
    let (s_log, c_log) = (dir.path().join("server.log"), dir.path().join("client.log"));
    let r1 = relay(&tb, "h1", &key, &r1_log);
    let mut r2 = relay(&tb, "h2", &key, &r2_log);
    let server = nginx(&sns, &ip, dir.path(), &root, &s_log);
    let url = format!("http://{ip}:8080/f1m");
    let body = dir.path().join("body");
    for i in 0..3 {
        let (ok, err, _) = curl(&cns, &url, &body, &[], &c_log);
        assert!(
            ok,
            "fetch {i}: {err}\n{}",
            std::fs::read_to_string(&c_log).unwrap_or_default()
        );
        assert_eq!(sha256(&body), want, "fetch {i}: the body differs");
    }
    let client_log = std::fs::read_to_string(&c_log).unwrap_or_default();
    assert_eq!(
        client_log.matches("moved to xdp via the relay").count(),
        3,
        "{client_log}"
    );
    // The body crossed the relays, not the kernel's TCP: the library's
    // counters at both ends, the relays' at both hosts.
    let received = counters(&c_log, "(connector)", "shm_received_bytes");
    let tcp_in = counters(&c_log, "(connector)", "kernel_tcp_received_bytes");
    assert_eq!(received.len(), 3, "{client_log}");
    for (r, t) in received.iter().zip(&tcp_in) {
        assert!(*r > 1 << 20, "{client_log}");
        assert!(
            *t * 100 < 1 << 20,
            "the TCP socket carried {t} bytes: {client_log}"
        );
    }
    let tcp_out = counters_of(&s_log, "(listener)", "kernel_tcp_sent_bytes", 3);
    assert_eq!(
        tcp_out.len(),
        3,
        "{}",
        std::fs::read_to_string(&s_log).unwrap_or_default()
    );
    assert!(tcp_out.iter().all(|t| t * 100 < 1 << 20), "{tcp_out:?}");
    let r_in = counters_of(&r1_log, "connection closed", "relayed_in_bytes", 3);
    let r_out = counters_of(&r2_log, "connection closed", "relayed_out_bytes", 3);
    assert_eq!(
        r_in.len(),
        3,
        "{}",
        std::fs::read_to_string(&r1_log).unwrap_or_default()
    );
    assert!(
        r_in.iter().chain(&r_out).all(|b| *b > 1 << 20),
        "{r_in:?} {r_out:?}"
    );
    // curl waits in poll, where the library watches each connection's
    // relay socket beside it: its relay wakes it on its own host, every
    // connection.
    let here = counters_of(&r1_log, "connection closed", "bells_here", 3);
    assert!(
        here.len() == 3 && here.iter().all(|n| *n > 0),
        "curl's relay woke it on its own host: {here:?}\n{}",
        std::fs::read_to_string(&r1_log).unwrap_or_default()
    );
    // A program waiting in select (python's `select.select`) likewise.
    let py_log = dir.path().join("select.log");
    let script = format!(
        "import socket, select\n\
         s = socket.create_connection(('{ip}', 8080))\n\
         s.sendall(b'GET /f1m HTTP/1.0\\r\\n\\r\\n')\n\
         n = 0\n\
         while True:\n\
         \x20   r, _, _ = select.select([s], [], [], 10)\n\
         \x20   assert r, 'select timed out'\n\
         \x20   b = s.recv(65536)\n\
         \x20   if not b:\n\
         \x20       break\n\
         \x20   n += len(b)\n\
         print(n)\n"
    );
    let out = wrapped(&cns, "/usr/bin/python3", &["-c", &script], &py_log)
        .output()
        .expect("python3 runs");
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && got.trim().parse::<u64>().is_ok_and(|n| n > 1 << 20),
        "{got}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&py_log).unwrap_or_default()
    );
    let py = std::fs::read_to_string(&py_log).unwrap_or_default();
    assert!(py.contains("moved to xdp via the relay"), "{py}");
    let here = counters_of(&r1_log, "connection closed", "bells_here", 4);
    assert!(
        here.len() == 4 && here[3] > 0,
        "the select waiter's relay woke it on its own host: {here:?}\n{}",
        std::fs::read_to_string(&r1_log).unwrap_or_default()
    );

    // A half-closed connection: the client's shutdown travels through
    // the relays behind its last bytes, and the server's reply and close
    // reach the client whole.
    half_close(&cns, &sns, &ip, dir.path());

    // wrk (epoll, keep-alive), wrapped too, over one connection.
    if Path::new("/usr/bin/wrk").exists() {
        let w_log = dir.path().join("wrk.log");
        let out = wrapped(&cns, "/usr/bin/wrk", &["-t1", "-c1", "-d2s", &url], &w_log)
            .output()
            .expect("wrk runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let requests: u64 = text
            .lines()
            .find_map(|l| {
                l.trim()
                    .split(" requests in")
                    .next()
                    .filter(|_| l.contains(" requests in"))
            })
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no request count: {text}"));
        assert!(requests > 0, "{text}");
        eprintln!("wrk across hosts through the relays: {requests} requests of 1 MiB in 2 s");
        assert!(
            !text.contains("Socket errors") && !text.contains("Non-2xx"),
            "{text}"
        );
        let wl = std::fs::read_to_string(&w_log).unwrap_or_default();
        assert!(wl.contains("moved to xdp via the relay"), "{wl}");
    } else {
        common::skip("wrk across hosts", "/usr/bin/wrk is missing");
    }

    // A client that sends garbage is refused with one line; the relay
    // serves on.
    let garbage = Command::new("ip")
        .args(["netns", "exec", &sns, "python3", "-c"])
        .arg("import socket; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect('\\0netgap-relay'); s.send(b'GET / HTTP/1.1' * 20); s.recv(10)")
        .output()
        .expect("python3 runs");
    assert!(
        garbage.status.success(),
        "{}",
        String::from_utf8_lossy(&garbage.stderr)
    );
    await_text(
        &r2_log,
        "refused: a request or its descriptors were cut",
        10,
        "no line for the garbage",
    );
    let (ok, err, _) = curl(&cns, &url, &body, &[], &c_log);
    assert!(ok, "after the garbage: {err}");
    assert_eq!(sha256(&body), want);
    assert_eq!(
        std::fs::read_to_string(&c_log)
            .unwrap_or_default()
            .matches("moved to xdp via the relay")
            .count(),
        4
    );

    // No relay on the server's host: the same fetch stays on the
    // kernel's TCP, saying why, and still works.
    r2.stop(libc::SIGTERM);
    let (ok, err, _) = curl(&cns, &url, &body, &[], &c_log);
    assert!(ok, "{err}");
    assert_eq!(sha256(&body), want);
    let client_log = std::fs::read_to_string(&c_log).unwrap_or_default();
    assert!(
        client_log.contains("stays on the kernel's TCP: no relay runs on the peer's host"),
        "{client_log}"
    );
    drop(server);
    drop(r1);
    drop(r2);
    drop(tb);
}

#[test]
fn a_relay_killed_mid_transfer_fails_the_transfer_in_time_and_leaves_nothing_behind() {
    let test = "a_relay_killed_mid_transfer_fails_the_transfer_in_time_and_leaves_nothing_behind";
    if !system_ready(test) || !programs_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, want) = docroot(dir.path());
    let (tb, cns, sns, ip) = testbed("pxdp2");
    let key = common::new_key_file(dir.path(), "relay.key");
    let (r1_log, r2_log) = (dir.path().join("relay1.log"), dir.path().join("relay2.log"));
    let (s_log, c_log) = (dir.path().join("server.log"), dir.path().join("client.log"));
    let r1 = relay(&tb, "h1", &key, &r1_log);
    let mut r2 = relay(&tb, "h2", &key, &r2_log);
    let server = nginx(&sns, &ip, dir.path(), &root, &s_log);
    let body = dir.path().join("body");
    // 16 MiB at 2 MiB/s: the server's relay is killed after about 1.5 s.
    let pid = r2.0.id() as i32;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: a signal to the relay, our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let (ok, err, took) = curl(
        &cns,
        &format!("http://{ip}:8080/f16m"),
        &body,
        &["--limit-rate", "2M"],
        &c_log,
    );
    killer.join().expect("the killer thread");
    r2.stop(libc::SIGKILL);
    assert!(!ok, "the transfer cannot complete without the relay");
    // The relay's timeout is 3 s: the error comes well before curl's own
    // 60 s limit.
    assert!(took < Duration::from_secs(20), "curl took {took:?}: {err}");
    // The relay logs the connection's reset once its pump saw the link
    // break, which may come just after curl's error.
    let r1_text = wait_lines(&r1_log, "connection reset", 1);
    assert!(r1_text.contains("connection reset"), "{r1_text}");
    // Nothing held the queue or the connection: with a relay again, the
    // next transfer goes through the relays.
    let r2 = relay(&tb, "h2", &key, &r2_log);
    let (ok, err, _) = curl(&cns, &format!("http://{ip}:8080/f1m"), &body, &[], &c_log);
    assert!(ok, "{err}");
    assert_eq!(sha256(&body), want);
    let client_log = std::fs::read_to_string(&c_log).unwrap_or_default();
    assert_eq!(
        client_log.matches("moved to xdp via the relay").count(),
        2,
        "{client_log}"
    );
    drop(server);
    drop(r1);
    drop(r2);
    tb.down();
    tb.assert_gone();
}

/// The pid of the `curl` process under `root` (the wrapper's child
/// chain: ip netns exec, netgap wrap, timeout, curl).
fn curl_under(root: u32) -> Option<i32> {
    let mut parent = std::collections::HashMap::new();
    let mut comm = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid …: comm may hold spaces, so from the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent.insert(pid, ppid);
            comm.insert(pid, stat[open + 1..close].to_string());
        }
    }
    comm.iter()
        .filter(|(_, c)| c.as_str() == "curl")
        .map(|(p, _)| *p)
        .find(|p| {
            let mut q = *p;
            for _ in 0..8 {
                match parent.get(&q) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) => q = pp,
                    None => return false,
                }
            }
            false
        })
        .map(|p| p as i32)
}

/// Waits up to 15 s for `log` to hold at least `n` lines with `marker`;
/// the log.
fn wait_lines(log: &Path, marker: &str, n: usize) -> String {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(marker).count() >= n || t0.elapsed() > Duration::from_secs(15) {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn many_connections_at_once_share_one_link_and_a_stopped_reader_stalls_only_its_own() {
    let test = "many_connections_at_once_share_one_link_and_a_stopped_reader_stalls_only_its_own";
    if !system_ready(test) || !programs_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, want) = docroot(dir.path());
    let want16 = sha256(&root.join("f16m"));
    let (tb, cns, sns, ip) = testbed("pxdp3");
    let key = common::new_key_file(dir.path(), "relay.key");
    let (r1_log, r2_log) = (dir.path().join("relay1.log"), dir.path().join("relay2.log"));
    let s_log = dir.path().join("server.log");
    let r1 = relay(&tb, "h1", &key, &r1_log);
    let r2 = relay(&tb, "h2", &key, &r2_log);
    let server = nginx(&sns, &ip, dir.path(), &root, &s_log);
    let url = format!("http://{ip}:8080/f1m");

    // wrk with eight connections at once (two threads, epoll,
    // keep-alive): every connection moves to the relay, all on one link.
    if Path::new("/usr/bin/wrk").exists() {
        let w_log = dir.path().join("wrk.log");
        let out = wrapped(&cns, "/usr/bin/wrk", &["-t2", "-c8", "-d3s", &url], &w_log)
            .output()
            .expect("wrk runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let wl = std::fs::read_to_string(&w_log).unwrap_or_default();
        assert!(
            !text.contains("Socket errors") && !text.contains("Non-2xx"),
            "{text}\nwrk's library: {wl}\nclient relay: {}\nserver relay: {}",
            std::fs::read_to_string(&r1_log).unwrap_or_default(),
            std::fs::read_to_string(&r2_log).unwrap_or_default()
        );
        assert!(
            wl.matches("moved to xdp via the relay").count() >= 8,
            "{wl}"
        );
        assert!(!wl.contains("stays on the kernel's TCP"), "{wl}");
        let l1 = wait_lines(&r1_log, "connection closed", 8);
        assert!(l1.matches("connection closed").count() >= 8, "{l1}");
        assert_eq!(l1.matches("link up").count(), 1, "{l1}");
        let l2 = wait_lines(&r2_log, "connection closed", 8);
        assert!(l2.matches("connection closed").count() >= 8, "{l2}");
        assert_eq!(l2.matches("link up").count(), 1, "{l2}");
        // nginx and wrk wait in epoll, where the library registers each
        // connection's relay socket: their relays wake them on their own
        // host, not through the other relay's doorbell.
        for (log, side) in [(&r1_log, "wrk"), (&r2_log, "nginx")] {
            let here: u64 = counters(log, "connection closed", "bells_here")
                .iter()
                .sum();
            assert!(
                here > 0,
                "{side}'s relay woke it on its own host none of the time"
            );
        }
        eprintln!(
            "wrk -c8 across hosts through one relay link: {}",
            text.lines()
                .find(|l| l.contains(" requests in"))
                .unwrap_or("")
                .trim()
        );
    } else {
        common::skip("wrk across hosts", "/usr/bin/wrk is missing");
    }

    // Eight curls at once: every body verified, every connection moved.
    let fetches: Vec<_> = (0..8)
        .map(|i| {
            let (cns, url) = (cns.clone(), url.clone());
            let body = dir.path().join(format!("body{i}"));
            let log = dir.path().join(format!("curl{i}.log"));
            std::thread::spawn(move || {
                let (ok, err, _) = curl(&cns, &url, &body, &[], &log);
                (ok, err, body, log)
            })
        })
        .collect();
    for f in fetches {
        let (ok, err, body, log) = f.join().expect("a fetch thread");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(ok, "{err}\n{text}");
        assert_eq!(sha256(&body), want, "{}", body.display());
        assert!(text.contains("moved to xdp via the relay"), "{text}");
    }

    // A reader stopped mid-transfer stalls only its own connection: a
    // second transfer on the same link completes while the first is
    // stopped, then the first completes too, both bodies intact.
    let (a_body, a_log) = (dir.path().join("slow"), dir.path().join("slow.log"));
    let mut a = slow_curl(&cns, &ip, &a_body, &a_log);
    let t0 = Instant::now();
    let a_pid = loop {
        let started = std::fs::metadata(&a_body).map_or(0, |m| m.len()) >= 1 << 20;
        match curl_under(a.0.id()) {
            Some(p) if started => break p,
            _ => {}
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the slow transfer did not start: {}",
            std::fs::read_to_string(&a_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: a signal to our own descendant.
    unsafe { libc::kill(a_pid, libc::SIGSTOP) };
    let stopped_at = std::fs::metadata(&a_body).map_or(0, |m| m.len());
    let (b_body, b_log) = (dir.path().join("fast"), dir.path().join("fast.log"));
    let (ok, err, took) = curl(
        &cns,
        &format!("http://{ip}:8080/f16m"),
        &b_body,
        &[],
        &b_log,
    );
    let a_now = std::fs::metadata(&a_body).map_or(0, |m| m.len());
    assert!(
        a.0.try_wait().expect("try_wait").is_none(),
        "the stopped transfer ended"
    );
    // SAFETY: as above.
    unsafe { libc::kill(a_pid, libc::SIGCONT) };
    assert!(ok, "the second transfer: {err}");
    assert_eq!(sha256(&b_body), want16, "the second transfer's body");
    assert_eq!(a_now, stopped_at, "the stopped curl wrote meanwhile");
    eprintln!("16 MiB beside a stopped reader on the same link: {took:?}");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = a.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the resumed transfer did not finish"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&a_log).unwrap_or_default()
    );
    assert_eq!(sha256(&a_body), want16, "the resumed transfer's body");
    for l in [&a_log, &b_log] {
        let text = std::fs::read_to_string(l).unwrap_or_default();
        assert!(text.contains("moved to xdp via the relay"), "{text}");
    }

    // No refusal anywhere; once idle the link closes, having carried
    // every connection.
    for log in [&r1_log, &r2_log] {
        let text = wait_lines(log, " connections=", 1);
        assert!(
            !text.contains("busy") && !text.contains("refused"),
            "{text}"
        );
        let carried: u64 = counters(log, " connections=", "connections").iter().sum();
        let conns = text.matches("connection closed").count() as u64;
        assert!(conns >= 10, "{text}");
        assert_eq!(carried, conns, "{text}");
        for l in text.lines().filter(|l| l.contains("link")) {
            eprintln!("{l}");
        }
    }
    // The closed link released the queue: the next connection opens a
    // new one.
    let (ok, err, _) = curl(&cns, &url, &b_body, &[], &b_log);
    assert!(ok, "after the link closed: {err}");
    assert_eq!(sha256(&b_body), want);
    for log in [&r1_log, &r2_log] {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert_eq!(text.matches("link up").count(), 2, "{text}");
    }
    drop(a);
    drop(server);
    drop(r1);
    drop(r2);
    tb.down();
    tb.assert_gone();
}

/// Waits for the slow transfer logging to `log` to move to xdp.
fn wait_moved(log: &Path) {
    await_text(
        log,
        "moved to xdp via the relay",
        20,
        "the slow transfer did not move to xdp",
    );
}

/// Waits for a slow transfer to finish; whether it succeeded.
fn finished(mut slow: Guard) -> bool {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(s)) = slow.0.try_wait() {
            return s.success();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the slow curl hangs"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A server host's relay holds a link to each client host at once (all
/// sessions on its one xdp socket): while the link to host 1 carries a
/// slow transfer, host 3's connection moves to xdp on a second link, both
/// bodies intact. With `--max-links 1`, host 3's connection is refused by
/// the server's relay meanwhile and stays on the kernel's TCP, its body
/// intact.
#[test]
fn a_server_relay_holds_links_to_two_hosts_at_once_and_past_its_limit_keeps_kernel_tcp() {
    let test =
        "a_server_relay_holds_links_to_two_hosts_at_once_and_past_its_limit_keeps_kernel_tcp";
    if !system_ready(test) || !programs_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, want) = docroot(dir.path());
    let want16 = sha256(&root.join("f16m"));
    let (tb, _) = Testbed::up(
        "pxdp4",
        &["--hosts", "3", "--topology", "switch", "--links", "2"],
    );
    let hosts = tb.hosts();
    let ip = hosts.hosts[1].address.to_string();
    let (ns1, sns, ns3) = (
        tb.ns(&hosts.hosts[0].name),
        tb.ns(&hosts.hosts[1].name),
        tb.ns(&hosts.hosts[2].name),
    );
    let log = |name: &str| dir.path().join(name);
    let key = common::new_key_file(dir.path(), "relay.key");
    let relays = [
        relay(&tb, "h1", &key, &log("relay1.log")),
        relay(&tb, "h3", &key, &log("relay3.log")),
    ];
    let server_relay = relay(&tb, "h2", &key, &log("relay2.log"));
    let server = nginx(&sns, &ip, dir.path(), &root, &log("server.log"));
    let url = format!("http://{ip}:8080/f1m");
    let (body, body16) = (log("body"), log("body16"));

    // Host 1 holds a link with a slow 16 MiB transfer (about 4 s); host
    // 3's connection meanwhile takes a second link.
    let slow = slow_curl(&ns1, &ip, &body16, &log("c1.log"));
    wait_moved(&log("c1.log"));
    let (ok, err, _) = curl(&ns3, &url, &body, &[], &log("c3.log"));
    assert!(ok, "{err}");
    assert_eq!(sha256(&body), want);
    let c3 = std::fs::read_to_string(log("c3.log")).unwrap_or_default();
    assert_eq!(c3.matches("moved to xdp via the relay").count(), 1, "{c3}");
    let r2 = wait_lines(&log("relay2.log"), "link up", 2);
    assert_eq!(r2.matches("link up").count(), 2, "{r2}");
    assert!(!r2.contains("resetting"), "{r2}");
    assert!(finished(slow), "the slow transfer failed");
    assert_eq!(sha256(&body16), want16);

    // The server's relay again, with room for one link. The client
    // relays' links to the old one close first (idle, or its keep-alives
    // gone).
    drop(server_relay);
    for r in ["relay1.log", "relay3.log"] {
        let text = wait_lines(&log(r), "closed after", 1);
        assert!(text.contains("closed after"), "{text}");
    }
    let _server_relay = relay_with(&tb, "h2", &key, &log("relay2b.log"), &["--max-links", "1"]);
    let slow = slow_curl(&ns1, &ip, &body16, &log("c1b.log"));
    wait_moved(&log("c1b.log"));
    let (ok, err, _) = curl(&ns3, &url, &body, &[], &log("c3b.log"));
    let logs = || {
        [
            "c3b.log",
            "c1b.log",
            "server.log",
            "relay2b.log",
            "relay3.log",
            "relay1.log",
        ]
        .map(|n| {
            format!(
                "{n}:\n{}",
                std::fs::read_to_string(log(n)).unwrap_or_default()
            )
        })
        .join("\n")
    };
    assert!(ok, "{err}\n{}", logs());
    assert_eq!(sha256(&body), want);
    let c3 = std::fs::read_to_string(log("c3b.log")).unwrap_or_default();
    assert!(
        c3.contains("stays on the kernel's TCP: the listener refused"),
        "{c3}"
    );
    let r2 = std::fs::read_to_string(log("relay2b.log")).unwrap_or_default();
    assert!(r2.contains("(--max-links)"), "{r2}");
    assert!(finished(slow), "the slow transfer failed");
    assert_eq!(sha256(&body16), want16);
    drop(server);
    drop(relays);
    drop(tb);
}
