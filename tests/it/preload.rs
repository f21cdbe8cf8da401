//! The preload sockets library (`netgap wrap -t shm`) with unmodified
//! programs on one host: real nginx and an HTTP/1.1 client (this test
//! binary's helper, blocking std sockets) both wrapped, every body
//! verified, and the library's own counters showing the bytes moved over
//! shared memory while the kernel TCP socket carried only the setup and
//! the wake-ups; curl (poll) and wrk (epoll) against nginx, all wrapped;
//! the fallback to the kernel's TCP with either end unwrapped; a server
//! that forks after accept; Apache's event MPM serving wrapped clients of
//! the user its children switch to; an Open MPI ping-pong over the tcp
//! BTL with both ranks wrapped; a server that execs itself keeping a
//! connection, which stays on shm in the new image; nothing left mapped after a wrapped client is
//! killed; and a wrap of a missing program refused in one line.
//!
//! Without nginx these tests print why and pass, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI), where that is a failure.

use crate::common;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether nginx is installed; fails when system tests are required.
pub(crate) fn nginx_ready(test: &str) -> bool {
    common::installed(test, &[("/usr/sbin/nginx", "nginx-light")])
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `netgap wrap -t shm -- timeout PROGRAM ARGS` logging to `log`, or the
/// program alone (under `timeout` too) when `wrapped` is false: a program
/// that hangs is killed after five minutes, so a test fails instead of
/// hanging.
fn maybe_wrapped(wrapped: bool, program: &Path, args: &[&str], log: &Path) -> Command {
    let mut cmd = if wrapped {
        let mut c = common::netgap();
        c.env("NETGAP_PRELOAD", common::preload_library())
            .args(["wrap", "-t", "shm", "--"]);
        c
    } else {
        Command::new("timeout")
    };
    if wrapped {
        cmd.arg("timeout");
    }
    cmd.args(["-s", "KILL", "300"]).arg(program).args(args);
    cmd.env("NETGAP_PRELOAD_LOG", log);
    cmd
}

/// A docroot with a 1 KiB and a 64 KiB file of pseudo-random bytes.
pub(crate) fn docroot(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).expect("docroot");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (name, len) in [("f1k", 1024usize), ("f64k", 65536)] {
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
    root
}

/// Real nginx (two workers, sendfile, keep-alive, room for hundreds of
/// idle connections a hostile test holds) serving `root` on 127.0.0.1,
/// wrapped or not, stopped on drop.
pub(crate) struct Nginx {
    child: Child,
    pub(crate) port: u16,
    dir: PathBuf,
}

impl Nginx {
    pub(crate) fn start(dir: &Path, root: &Path, wrapped: bool, log: &Path) -> Nginx {
        let port = free_port();
        let run = dir.join(format!("nginx-{port}"));
        std::fs::create_dir_all(&run).expect("run dir");
        // SAFETY: geteuid cannot fail.
        let user = if unsafe { libc::geteuid() } == 0 {
            // The workers stay root like the client: a shared region is
            // only opened by a process of the same user.
            "user root root;\n"
        } else {
            ""
        };
        let d = run.display();
        let conf = format!(
            "daemon off;\n{user}master_process on;\nworker_processes 2;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 1024; }}\n\
             http {{\n access_log off;\n sendfile on;\n tcp_nopush on;\n tcp_nodelay on;\n\
             keepalive_requests 100000;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
             types {{ }}\n default_type application/octet-stream;\n\
             server {{ listen 127.0.0.1:{port}; root {root}; }}\n}}\n",
            root = root.display()
        );
        let conf_path = run.join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("nginx.conf");
        let error_log = run.join("error.log");
        let child = maybe_wrapped(
            wrapped,
            Path::new("/usr/sbin/nginx"),
            &[
                "-p",
                run.to_str().expect("utf-8 path"),
                "-e",
                error_log.to_str().expect("utf-8 path"),
                "-c",
                conf_path.to_str().expect("utf-8 path"),
            ],
            log,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx starts");
        let n = Nginx {
            child,
            port,
            dir: run,
        };
        let t0 = Instant::now();
        while !n.dir.join("nginx.pid").exists() || TcpStream::connect(("127.0.0.1", port)).is_err()
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "nginx did not come up: {}",
                std::fs::read_to_string(n.dir.join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        n
    }

    /// The worker processes' ids.
    pub(crate) fn workers(&self) -> Vec<u32> {
        common::procs::descendants(self.child.id())
            .iter()
            .map(|p| p.0)
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child (nginx's master: wrap execs).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The HTTP client helper (this binary, the ignored test `http_client`),
/// wrapped or not: `conns` keep-alive connections of `requests` requests
/// each, alternating the two files, every body compared with the file.
/// Returns the bodies verified.
pub(crate) fn run_client(
    wrapped: bool,
    port: u16,
    root: &Path,
    conns: u32,
    requests: u32,
    log: &Path,
) -> u64 {
    let exe = std::env::current_exe().expect("the test binary");
    let out = maybe_wrapped(
        wrapped,
        &exe,
        &[
            "preload::http_client",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ],
        log,
    )
    .env("PRELOAD_TEST_PORT", port.to_string())
    .env("PRELOAD_TEST_ROOT", root)
    .env("PRELOAD_TEST_CONNS", conns.to_string())
    .env("PRELOAD_TEST_REQUESTS", requests.to_string())
    .output()
    .expect("the client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split("verified bodies: ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count in the client's output: {stdout}"))
}

#[test]
#[ignore = "helper run in a child process by the preload tests"]
fn http_client() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
    let port: u16 = var("PRELOAD_TEST_PORT").parse().expect("a port");
    let root = PathBuf::from(var("PRELOAD_TEST_ROOT"));
    let conns: u32 = var("PRELOAD_TEST_CONNS").parse().expect("a count");
    let requests: u32 = var("PRELOAD_TEST_REQUESTS").parse().expect("a count");
    let files: Vec<(&str, Vec<u8>)> = ["f1k", "f64k"]
        .iter()
        .map(|n| (*n, std::fs::read(root.join(n)).expect("a file")))
        .collect();
    let mut verified = 0u64;
    for _ in 0..conns {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let mut w = s.try_clone().expect("clone");
        let mut r = BufReader::new(s);
        for i in 0..requests {
            let (name, want) = &files[i as usize % files.len()];
            write!(w, "GET /{name} HTTP/1.1\r\nHost: t\r\n\r\n").expect("request");
            let mut length = None;
            let mut status = String::new();
            r.read_line(&mut status).expect("status line");
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            loop {
                let mut line = String::new();
                r.read_line(&mut line).expect("header");
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse::<usize>().ok();
                }
            }
            let mut body = vec![0u8; length.expect("a content length")];
            r.read_exact(&mut body).expect("body");
            assert!(body == *want, "body of /{name} differs");
            verified += 1;
        }
    }
    println!("verified bodies: {verified}");
}

/// Sums a counter over the library's close lines in `log`.
fn counter(log: &str, name: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("shm connection closed"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn nginx_and_clients_over_shm_with_every_body_verified() {
    if !nginx_ready("nginx_and_clients_over_shm_with_every_body_verified") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = docroot(dir.path());
    let server_log = dir.path().join("server.log");
    let client_log = dir.path().join("client.log");
    let nginx = Nginx::start(dir.path(), &root, true, &server_log);

    // Both wrapped: 4 connections of 50 requests, half of them 64 KiB.
    let verified = run_client(true, nginx.port, &root, 4, 50, &client_log);
    assert_eq!(verified, 200);
    let log = read(&client_log);
    assert_eq!(
        log.matches("moved to shm").count(),
        4,
        "every connection on shm: {log}"
    );
    let body_bytes = 100 * 1024 + 100 * 65536;
    let shm_in = counter(&log, "shm_received_bytes");
    let tcp_in = counter(&log, "kernel_tcp_received_bytes");
    let tcp_out = counter(&log, "kernel_tcp_sent_bytes");
    assert!(shm_in > body_bytes, "{shm_in} B over shm: {log}");
    // The kernel socket carried only the setup (a 24-byte hello out, a
    // 16-byte answer in) and one-byte doorbells: well under 1% of the bytes.
    assert!(
        (tcp_in + tcp_out) * 100 < shm_in,
        "{tcp_in} B in and {tcp_out} B out over TCP against {shm_in} B over shm: {log}"
    );
    assert!(tcp_out >= 4 * 24 && tcp_in >= 4 * 16, "{log}");
    let slog = read(&server_log);
    assert!(
        slog.matches("accepted connection moved to shm").count() >= 4,
        "{slog}"
    );

    // The client unwrapped: the same answers over the kernel's TCP, and the
    // server's log says why.
    let plain_log = dir.path().join("plain.log");
    assert_eq!(run_client(false, nginx.port, &root, 2, 20, &plain_log), 40);
    assert!(
        !plain_log.exists(),
        "an unwrapped client has no library log"
    );
    let slog = read(&server_log);
    assert!(
        slog.contains("accepted connection stays on the kernel's TCP: the peer sent no hello"),
        "{slog}"
    );

    // curl (its event loop on poll), wrapped: both files on one connection.
    if Path::new("/usr/bin/curl").exists() {
        let curl_log = dir.path().join("curl.log");
        let (o1, o2) = (dir.path().join("o1"), dir.path().join("o2"));
        let base = format!("http://127.0.0.1:{}", nginx.port);
        let out = maybe_wrapped(
            true,
            Path::new("/usr/bin/curl"),
            &[
                "-sS",
                &format!("{base}/f1k"),
                &format!("{base}/f64k"),
                "-o",
                o1.to_str().expect("utf-8"),
                "-o",
                o2.to_str().expect("utf-8"),
            ],
            &curl_log,
        )
        .output()
        .expect("curl runs");
        assert!(out.status.success(), "{out:?}");
        assert!(std::fs::read(&o1).ok() == std::fs::read(root.join("f1k")).ok());
        assert!(std::fs::read(&o2).ok() == std::fs::read(root.join("f64k")).ok());
        let clog = read(&curl_log);
        assert_eq!(clog.matches("moved to shm").count(), 1, "{clog}");
        assert!(counter(&clog, "shm_received_bytes") > 65536, "{clog}");
    } else {
        common::skip(
            "curl against nginx, both wrapped",
            "/usr/bin/curl is missing",
        );
    }

    // wrk, wrapped too, against the wrapped nginx.
    let sent_before = counter(&read(&server_log), "shm_sent_bytes");
    if Path::new("/usr/bin/wrk").exists() {
        let wrk_log = dir.path().join("wrk.log");
        let url = format!("http://127.0.0.1:{}/f64k", nginx.port);
        let out = maybe_wrapped(
            true,
            Path::new("/usr/bin/wrk"),
            &["-t1", "-c4", "-d1s", &url],
            &wrk_log,
        )
        .output()
        .expect("wrk runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("requests in"), "{text}");
        assert!(!text.contains("Socket errors"), "{text}");
        assert!(!text.contains("Non-2xx"), "{text}");
        // wrk's four connections and the one it makes first to try the
        // address.
        let wlog = read(&wrk_log);
        assert!(wlog.matches("moved to shm").count() >= 4, "{wlog}");
        assert!(!wlog.contains("kernel's TCP"), "{wlog}");
        // wrk exits without closing; nginx closes its ends and logs what
        // they sent over shm.
        let t0 = Instant::now();
        while counter(&read(&server_log), "shm_sent_bytes") < sent_before + 65536 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{}",
                read(&server_log)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    } else {
        common::skip("wrk against nginx, both wrapped", "/usr/bin/wrk is missing");
    }
    drop(nginx);
}

#[test]
fn a_wrapped_client_of_a_plain_nginx_stays_on_kernel_tcp() {
    if !nginx_ready("a_wrapped_client_of_a_plain_nginx_stays_on_kernel_tcp") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = docroot(dir.path());
    let server_log = dir.path().join("server.log");
    let client_log = dir.path().join("client.log");
    let nginx = Nginx::start(dir.path(), &root, false, &server_log);
    assert_eq!(run_client(true, nginx.port, &root, 2, 20, &client_log), 40);
    let log = read(&client_log);
    assert_eq!(
        log.matches("stays on the kernel's TCP: no listener with the library there")
            .count(),
        2,
        "{log}"
    );
    assert!(!log.contains("moved to shm"), "{log}");
    drop(nginx);
}

#[test]
fn a_killed_client_leaves_nothing_behind() {
    if !nginx_ready("a_killed_client_leaves_nothing_behind") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = docroot(dir.path());
    let server_log = dir.path().join("server.log");
    let client_log = dir.path().join("client.log");
    let nginx = Nginx::start(dir.path(), &root, true, &server_log);
    let exe = std::env::current_exe().expect("the test binary");
    // A client that runs until killed: many requests on one connection.
    let mut client = maybe_wrapped(
        true,
        &exe,
        &[
            "preload::http_client",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ],
        &client_log,
    )
    .env("PRELOAD_TEST_PORT", nginx.port.to_string())
    .env("PRELOAD_TEST_ROOT", &root)
    .env("PRELOAD_TEST_CONNS", "1")
    .env("PRELOAD_TEST_REQUESTS", "100000000")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("the client runs");
    let mapped = |pids: &[u32]| -> Vec<u32> {
        pids.iter()
            .copied()
            .filter(|p| read(Path::new(&format!("/proc/{p}/maps"))).contains("netgap-preload"))
            .collect()
    };
    let workers = nginx.workers();
    let t0 = Instant::now();
    while mapped(&workers).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no worker mapped a region: {}",
            read(&server_log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    // The helper runs under `timeout`: kill it, then `timeout`.
    for (pid, _, _) in common::procs::descendants(client.id()) {
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    client.kill().expect("kill the client");
    client.wait().expect("reap the client");
    // The worker sees the kernel socket's end, closes, and unmaps; no file
    // names a region at any time.
    let left = common::gone_within(Duration::from_secs(10), || mapped(&workers));
    assert!(left.is_ok(), "still mapped in {left:?}");
    let named: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("netgap-preload"))
                .collect()
        })
        .unwrap_or_default();
    assert!(named.is_empty(), "{named:?}");
    // The server carries on.
    assert_eq!(run_client(true, nginx.port, &root, 1, 4, &client_log), 4);
    drop(nginx);
}

/// The echo pattern of the fork test and of the echo clients of
/// `preload_hostile`.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
#[ignore = "helper run in a child process by the preload tests"]
fn fork_server() {
    let port_file = PathBuf::from(std::env::var("PRELOAD_TEST_PORT_FILE").expect("set"));
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    // Written whole, then renamed into place: the test polls the file and
    // must never read a prefix of the number (`4` of `45678`) as the port.
    let partial = port_file.with_extension("partial");
    std::fs::write(&partial, port.to_string()).expect("port file");
    std::fs::rename(&partial, &port_file).expect("port file in place");
    let mut children = Vec::new();
    for _ in 0..2 {
        let (mut s, _) = l.accept().expect("accept");
        // SAFETY: fork in a process whose other threads (the harness's
        // main thread) hold no lock the child needs; the child only does
        // socket I/O and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let mut buf = vec![0u8; 65536];
            let code = loop {
                match s.read(&mut buf) {
                    Ok(0) => break 0,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).is_err() {
                            break 1;
                        }
                    }
                    Err(_) => break 1,
                }
            };
            drop(s);
            // SAFETY: ends the forked child without running the parent's
            // exit handlers.
            unsafe { libc::_exit(code) };
        }
        // The parent keeps accepting; its copy of the connection closes.
        drop(s);
        children.push(pid);
    }
    for pid in children {
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
    println!("served: 2");
}

#[test]
#[ignore = "helper run in a child process by the preload tests"]
fn echo_client() {
    let port: u16 = std::env::var("PRELOAD_TEST_PORT")
        .expect("set")
        .parse()
        .expect("a port");
    for seed in 0..2u8 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let want = pattern(1 << 20, seed);
        let mut w = s.try_clone().expect("clone");
        let sent = want.clone();
        let writer = std::thread::spawn(move || {
            for chunk in sent.chunks(10_000) {
                w.write_all(chunk).expect("write");
            }
            w.shutdown(std::net::Shutdown::Write).expect("shutdown");
        });
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read");
        writer.join().expect("writer");
        assert!(
            got == want,
            "echo {seed} differs ({} bytes back)",
            got.len()
        );
    }
    println!("echoed: 2");
}

#[test]
fn a_server_that_forks_after_accept_keeps_its_connections_on_shm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("the test binary");
    let server_log = dir.path().join("server.log");
    let client_log = dir.path().join("client.log");
    let port_file = dir.path().join("port");
    let args = |name: &'static str| {
        vec![
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]
    };
    let server = maybe_wrapped(true, &exe, &args("preload::fork_server"), &server_log)
        .env("PRELOAD_TEST_PORT_FILE", &port_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    let t0 = Instant::now();
    let port = loop {
        if let Some(p) = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
        {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no port");
        std::thread::sleep(Duration::from_millis(20));
    };
    let client = maybe_wrapped(true, &exe, &args("preload::echo_client"), &client_log)
        .env("PRELOAD_TEST_PORT", port.to_string())
        .output()
        .expect("client");
    let server = server.wait_with_output().expect("server ends");
    let cout = String::from_utf8_lossy(&client.stdout);
    let sout = String::from_utf8_lossy(&server.stdout);
    assert!(
        client.status.success() && cout.contains("echoed: 2"),
        "{cout}\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success() && sout.contains("served: 2"),
        "{sout}"
    );
    let clog = read(&client_log);
    assert_eq!(clog.matches("moved to shm").count(), 2, "{clog}");
    // Each forked child echoed its megabyte over shm.
    let slog = read(&server_log);
    assert!(counter(&slog, "shm_sent_bytes") >= 2 << 20, "{slog}");
    assert!(counter(&clog, "shm_received_bytes") >= 2 << 20, "{clog}");
}

#[test]
fn a_wrap_of_a_missing_program_is_one_line() {
    let out = common::netgap()
        .env("NETGAP_PRELOAD", common::preload_library())
        .args(["wrap", "-t", "shm", "--", "/nonexistent/program", "x"])
        .output()
        .expect("netgap runs");
    assert!(!out.status.success());
    let err = common::one_line_error(&out, "wrap", "cannot run /nonexistent/program");
    assert!(err.contains("No such file"), "{err}");
    let out = common::netgap()
        .args(["wrap", "-t", "udp", "--", "true"])
        .output()
        .expect("netgap runs");
    common::one_line_error(&out, "wrap", "stack \"udp\" is not provided");
    // The relays are xdp's: on one host there is nothing to keep on them.
    let out = common::netgap()
        .env("NETGAP_PRELOAD", common::preload_library())
        .args(["wrap", "-t", "shm", "--relayed", "--", "true"])
        .output()
        .expect("netgap runs");
    common::one_line_error(&out, "wrap", "--relayed applies to -t xdp alone");
}

/// Whether `program` is on the PATH.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

#[test]
fn an_open_mpi_ping_pong_over_the_tcp_btl_moves_to_shm() {
    let test = "an_open_mpi_ping_pong_over_the_tcp_btl_moves_to_shm";
    if !on_path("mpicc") || !on_path("mpirun") {
        common::skip(
            test,
            "mpicc or mpirun is missing (apt-get install libopenmpi-dev openmpi-bin)",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = common::build_c(
        dir.path(),
        "pingpong",
        include_str!("preload_mpi_pingpong.c"),
        "mpicc",
    );
    let log = dir.path().join("mpi.log");
    // Both ranks under the library; mpirun and its daemon stay plain (their
    // own connections have no listener with the library, so they stay on
    // the kernel's TCP). The tcp BTL on loopback only, ob1 over it.
    let launch = || {
        Command::new("timeout")
            .args([
                "-s",
                "KILL",
                "120",
                "mpirun",
                "--allow-run-as-root",
                "--oversubscribe",
            ])
            .args([
                "-np", "2", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
            ])
            .args(["--mca", "btl_tcp_if_include", "lo"])
            .arg("-x")
            .arg(format!(
                "LD_PRELOAD={}",
                common::preload_library().display()
            ))
            .arg("-x")
            .arg(format!("NETGAP_PRELOAD_LOG={}", log.display()))
            .arg(&exe)
            .arg("300")
            .current_dir(dir.path())
            .output()
            .expect("mpirun runs")
    };
    // mpirun's own start-up (the ranks' PMIx handshake with it, before
    // MPI_Init returns and before the tcp BTL opens a connection) can fail
    // on this shared machine under a full test run; that launch is tried
    // once more, saying so. A failure after MPI_Init is the test's.
    let mut out = launch();
    let said = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    if !out.status.success() && said(&out).contains("PMIX ERROR") {
        eprintln!(
            "{test}: mpirun failed to start its ranks (PMIx), trying once more: {}",
            said(&out)
        );
        let _ = std::fs::remove_file(&log);
        out = launch();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = read(&log);
    assert!(
        out.status.success(),
        "{stdout}{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 300 round trips of 1 B and 1 KiB, 31 of 64 KiB and of 1 MiB.
    assert!(
        stdout.contains("verified round trips: 662 bad: 0"),
        "{stdout}"
    );
    // Each rank connected to the other at once: every connection between
    // the ranks that carried the ping-pong moved to shm, at both ends.
    assert!(
        text.matches("accepted connection moved to shm").count() >= 1,
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("connection to port") && l.ends_with("moved to shm")),
        "{text}"
    );
    assert!(!text.contains("fails"), "{text}");
    let shm_in = counter(&text, "shm_received_bytes");
    let tcp = counter(&text, "kernel_tcp_received_bytes") + counter(&text, "kernel_tcp_sent_bytes");
    // Both ranks received 31 MiB and more each over shm.
    assert!(shm_in > 2 * 31 * (1 << 20), "{shm_in} B over shm: {text}");
    assert!(
        tcp * 100 < shm_in,
        "{tcp} B over the kernel's TCP against {shm_in} B over shm: {text}"
    );
}

/// `cmd` run as `nobody` when the test runs as root (as Apache's children
/// do: a region is shared only between processes of one user), else as
/// is.
pub(crate) fn as_nobody(cmd: &Command) -> Command {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let mut c = Command::new(cmd.get_program());
        c.args(cmd.get_args());
        copy_env(cmd, &mut c);
        return c;
    }
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    copy_env(cmd, &mut c);
    c
}

/// The environment changes of `from` made on `to` too.
pub(crate) fn copy_env(from: &Command, to: &mut Command) {
    for (k, v) in from.get_envs() {
        match v {
            Some(v) => to.env(k, v),
            None => to.env_remove(k),
        };
    }
}

/// Makes `path` readable (and a directory traversable) by every user.
fn open_to_all(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn apache_event_mpm_serves_wrapped_clients_over_shm() {
    let test = "apache_event_mpm_serves_wrapped_clients_over_shm";
    let modules = Path::new("/usr/lib/apache2/modules/mod_mpm_event.so");
    if !Path::new("/usr/sbin/apache2").exists() || !modules.exists() {
        common::skip(
            test,
            "apache2 (with the event MPM) is missing (apt-get install apache2)",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    open_to_all(dir.path(), 0o755);
    let root = docroot(dir.path());
    open_to_all(&root, 0o755);
    for f in ["f1k", "f64k"] {
        open_to_all(&root.join(f), 0o644);
    }
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).expect("run dir");
    let server_log = dir.path().join("server.log");
    let client_log = dir.path().join("client.log");
    for l in [&server_log, &client_log] {
        std::fs::write(l, "").expect("log");
        // Written by the children after they switch user.
        open_to_all(l, 0o666);
    }
    let port = free_port();
    // SAFETY: geteuid cannot fail.
    let user = if unsafe { libc::geteuid() } == 0 {
        "User nobody\nGroup nogroup\n"
    } else {
        ""
    };
    let d = run.display();
    let conf = format!(
        "ServerRoot \"{d}\"\nServerName netgap\n\
         LoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so\n\
         LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so\n\
         PidFile \"{d}/httpd.pid\"\nDefaultRuntimeDir \"{d}\"\nMutex file:{d} default\n\
         ErrorLog \"{d}/error.log\"\nLogLevel warn\nListen 127.0.0.1:{port}\n{user}\
         KeepAlive On\nMaxKeepAliveRequests 0\nEnableSendfile On\n\
         StartServers 2\nServerLimit 2\nThreadsPerChild 16\nThreadLimit 16\n\
         MinSpareThreads 8\nMaxSpareThreads 32\nMaxRequestWorkers 32\n\
         DocumentRoot \"{r}\"\n<Directory \"{r}\">\n Require all granted\n</Directory>\n",
        r = root.display()
    );
    let conf_path = run.join("httpd.conf");
    std::fs::write(&conf_path, conf).expect("httpd.conf");
    let mut apache = maybe_wrapped(
        true,
        Path::new("/usr/sbin/apache2"),
        &[
            "-f",
            conf_path.to_str().expect("utf-8 path"),
            "-DFOREGROUND",
        ],
        &server_log,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("apache starts");
    struct Stop<'a>(&'a mut Child, PathBuf);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            // Apache's parent (under `timeout`) stops its children on
            // SIGTERM.
            if let Ok(pid) = read(&self.1).trim().parse::<i32>() {
                // SAFETY: a signal to the server this test started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            for (pid, _, _) in common::procs::descendants(self.0.id()) {
                // SAFETY: a signal to a process this test started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid_file = run.join("httpd.pid");
    let stop = Stop(&mut apache, pid_file.clone());
    let t0 = Instant::now();
    // Up when it listens and both children have switched user (each then
    // announces the listener under its new user).
    while !pid_file.exists()
        || TcpStream::connect(("127.0.0.1", port)).is_err()
        || common::procs::descendants(stop.0.id()).len() < 3
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "apache did not come up: {}",
            read(&run.join("error.log"))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));

    // The HTTP client helper, wrapped, as the children's user: 4
    // connections of 50 requests, every body compared with its file.
    let exe = std::env::current_exe().expect("the test binary");
    let mut client = maybe_wrapped(
        true,
        &exe,
        &[
            "preload::http_client",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ],
        &client_log,
    );
    client
        .env("PRELOAD_TEST_PORT", port.to_string())
        .env("PRELOAD_TEST_ROOT", &root)
        .env("PRELOAD_TEST_CONNS", "4")
        .env("PRELOAD_TEST_REQUESTS", "50");
    let out = as_nobody(&client).output().expect("the client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("verified bodies: 200"),
        "{stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        read(&client_log)
    );
    let log = read(&client_log);
    assert_eq!(
        log.matches("moved to shm").count(),
        4,
        "every connection on shm: {log}"
    );
    let shm_in = counter(&log, "shm_received_bytes");
    let tcp = counter(&log, "kernel_tcp_received_bytes") + counter(&log, "kernel_tcp_sent_bytes");
    assert!(
        shm_in > 100 * 1024 + 100 * 65536,
        "{shm_in} B over shm: {log}"
    );
    assert!(
        tcp * 100 < shm_in,
        "{tcp} B over the kernel's TCP against {shm_in} B over shm: {log}"
    );

    // curl (poll), wrapped, as the children's user: both files on one
    // connection.
    if Path::new("/usr/bin/curl").exists() {
        let curl_log = dir.path().join("curl.log");
        std::fs::write(&curl_log, "").expect("log");
        open_to_all(&curl_log, 0o666);
        let outdir = dir.path().join("out");
        std::fs::create_dir_all(&outdir).expect("out dir");
        open_to_all(&outdir, 0o777);
        let (o1, o2) = (outdir.join("o1"), outdir.join("o2"));
        let base = format!("http://127.0.0.1:{port}");
        let curl = maybe_wrapped(
            true,
            Path::new("/usr/bin/curl"),
            &[
                "-sS",
                &format!("{base}/f1k"),
                &format!("{base}/f64k"),
                "-o",
                o1.to_str().expect("utf-8"),
                "-o",
                o2.to_str().expect("utf-8"),
            ],
            &curl_log,
        );
        let out = as_nobody(&curl).output().expect("curl runs");
        assert!(out.status.success(), "{out:?}");
        assert!(std::fs::read(&o1).ok() == std::fs::read(root.join("f1k")).ok());
        assert!(std::fs::read(&o2).ok() == std::fs::read(root.join("f64k")).ok());
        let clog = read(&curl_log);
        assert_eq!(clog.matches("moved to shm").count(), 1, "{clog}");
    }
    let slog = read(&server_log);
    assert!(
        slog.matches("accepted connection moved to shm").count() >= 4,
        "{slog}"
    );
    // Only the test's own probes (connected and closed at once) stayed on
    // the kernel's TCP.
    assert!(
        slog.lines()
            .filter(|l| l.contains("stays on the kernel's TCP") || l.contains("fails"))
            .all(|l| l.ends_with("the peer closed before sending anything")),
        "{slog}"
    );
    drop(stop);
}

#[test]
#[ignore = "helper run in a child process by the preload tests"]
fn exec_server() {
    use std::os::fd::IntoRawFd;
    use std::os::unix::process::CommandExt;
    let port_file = PathBuf::from(std::env::var("PRELOAD_TEST_PORT_FILE").expect("set"));
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let partial = port_file.with_extension("partial");
    std::fs::write(&partial, port.to_string()).expect("port file");
    std::fs::rename(&partial, &port_file).expect("port file in place");
    let (mut s, _) = l.accept().expect("accept");
    // The connection is on shm in this image before the exec.
    let mut hello = [0u8; 5];
    s.read_exact(&mut hello).expect("hello");
    assert_eq!(&hello, b"hello");
    s.write_all(b"ready").expect("ready");
    drop(l);
    let fd = s.into_raw_fd();
    // SAFETY: clears close-on-exec on our own descriptor.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    assert_eq!(r, 0);
    let exe = std::env::current_exe().expect("the test binary");
    let e = Command::new(exe)
        .args([
            "preload::exec_server_after",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .arg("--test-threads=1")
        .env("PRELOAD_TEST_FD", fd.to_string())
        .exec();
    panic!("exec: {e}");
}

#[test]
#[ignore = "helper run in a child process by the preload tests"]
fn exec_server_after() {
    use std::os::fd::FromRawFd;
    let fd: i32 = std::env::var("PRELOAD_TEST_FD")
        .expect("set")
        .parse()
        .expect("a descriptor");
    // SAFETY: the descriptor the image before the exec kept open for us.
    let mut s = unsafe { TcpStream::from_raw_fd(fd) };
    let mut buf = vec![0u8; 65536];
    let mut echoed = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                s.write_all(&buf[..n]).expect("echo");
                echoed += n;
            }
            Err(e) => panic!("read after exec: {e}"),
        }
    }
    println!("echoed after exec: {echoed}");
}

#[test]
#[ignore = "helper run in a child process by the preload tests"]
fn exec_client() {
    let port: u16 = std::env::var("PRELOAD_TEST_PORT")
        .expect("set")
        .parse()
        .expect("a port");
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(b"hello").expect("hello");
    let mut ready = [0u8; 5];
    s.read_exact(&mut ready).expect("ready");
    assert_eq!(&ready, b"ready");
    let want = pattern(1 << 20, 7);
    let mut w = s.try_clone().expect("clone");
    let sent = want.clone();
    let writer = std::thread::spawn(move || {
        for chunk in sent.chunks(10_000) {
            w.write_all(chunk).expect("write");
        }
        w.shutdown(std::net::Shutdown::Write).expect("shutdown");
    });
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("read");
    writer.join().expect("writer");
    assert!(got == want, "the echo differs ({} bytes back)", got.len());
    println!("echoed: {}", got.len());
}

#[test]
fn a_connection_kept_across_exec_stays_on_shm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("the test binary");
    let server_log = dir.path().join("server.log");
    let client_log = dir.path().join("client.log");
    let port_file = dir.path().join("port");
    let args = |name: &'static str| {
        vec![
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]
    };
    let server = maybe_wrapped(true, &exe, &args("preload::exec_server"), &server_log)
        .env("PRELOAD_TEST_PORT_FILE", &port_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    let t0 = Instant::now();
    let port = loop {
        if let Some(p) = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
        {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no port");
        std::thread::sleep(Duration::from_millis(20));
    };
    let client = maybe_wrapped(true, &exe, &args("preload::exec_client"), &client_log)
        .env("PRELOAD_TEST_PORT", port.to_string())
        .output()
        .expect("client");
    let server = server.wait_with_output().expect("server ends");
    let cout = String::from_utf8_lossy(&client.stdout);
    let sout = String::from_utf8_lossy(&server.stdout);
    let slog = read(&server_log);
    let clog = read(&client_log);
    assert!(
        client.status.success() && cout.contains("echoed: 1048576"),
        "{cout}\n{}\n{clog}\n{slog}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success() && sout.contains("echoed after exec: 1048576"),
        "{sout}\n{}\n{slog}",
        String::from_utf8_lossy(&server.stderr)
    );
    assert_eq!(clog.matches("moved to shm").count(), 1, "{clog}");
    assert_eq!(
        slog.matches("accepted connection moved to shm").count(),
        1,
        "{slog}"
    );
    assert_eq!(
        slog.matches("connection kept across exec, on shm again")
            .count(),
        1,
        "{slog}"
    );
    // The megabyte went both ways over shm after the exec; the kernel
    // socket carried the setup and doorbells only.
    let shm_in = counter(&slog, "shm_received_bytes");
    let tcp = counter(&slog, "kernel_tcp_received_bytes") + counter(&slog, "kernel_tcp_sent_bytes");
    assert!(shm_in >= 1 << 20, "{slog}");
    assert!(tcp * 100 < shm_in, "{tcp} B over TCP: {slog}");
    assert!(
        counter(&clog, "shm_received_bytes") >= (1 << 20) + 5,
        "{clog}"
    );
}
