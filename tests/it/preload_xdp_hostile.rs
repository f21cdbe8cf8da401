//! `netgap relay` against a hostile local user: on a three-host switch
//! testbed with two links, a relay on host 1 (its xdp interface the
//! second link's `eth1`, serving host 2 only), and a client running as
//! uid 65534 in host 1's namespace (a child of this test binary that drops
//! root with `setresuid` after making one socket as root) that asks it to
//! move a loopback connection, root's connection to the served host, its
//! own connection to a host the relay does not serve, and to connect its
//! own connection to the served host at a made-up MAC. Each is refused
//! with its reason, in the reply and in one line of the relay's log, and
//! no interface of the host gets an XDP program. Then the same user
//! floods the relay with garbage: past its requests a second it is
//! refused at once, and its log lines stop after a burst, with one line
//! counting the rest.
//!
//! Built only with the `xdp` feature; without root or namespaces the test
//! prints why and passes (with NETGAP_REQUIRE_SYSTEM_TESTS=1 that is a
//! failure).

use crate::common::testbed::Testbed;
use crate::common::{self, netgap_path, system_ready};
use netgap::proto::preload::{RelayReply, RelayRequest, RELAY_REPLY_BYTES};
use netgap::shm::{region_bytes, HeaderFields, Waits};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The made-up MAC the hostile connect names.
const MADE_UP_MAC: &str = "02:de:ad:be:ef:01";
/// Garbage requests the hostile user sends.
const GARBAGE: usize = 120;
/// The relay's requests a second per uid in this test.
const REQUESTS_PER_S: usize = 60;

/// A TCP listener in namespace `ns` at `ip`, accepting and holding every
/// connection until `stop`; its address.
fn hold_connections(ns: String, ip: String, stop: Arc<AtomicBool>) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        netgap::transport::netns::enter(&ns).expect("enter the namespace");
        let l = TcpListener::bind((ip.as_str(), 0)).expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        tx.send(l.local_addr().expect("address")).expect("send");
        let mut held = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((s, _)) => held.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the listener is up")
}

#[test]
fn a_hostile_local_user_is_refused_in_one_line_each_and_nothing_is_attached() {
    let test = "a_hostile_local_user_is_refused_in_one_line_each_and_nothing_is_attached";
    if !system_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (tb, _) = Testbed::up(
        "pxhost",
        &["--hosts", "3", "--topology", "switch", "--links", "2"],
    );
    let hosts = tb.hosts();
    let addr = |i: usize| hosts.hosts[i].address.to_string();
    let h1 = tb.ns("h1");
    let key = common::new_key_file(dir.path(), "relay.key");
    let log = dir.path().join("relay.log");
    let mut relay = Command::new("ip")
        .args(["netns", "exec", &h1])
        .arg(netgap_path())
        .args(["relay", "--interface", "eth1", "--peers", &addr(1), "--key"])
        .arg(&key)
        .args(["--max-requests-per-uid", &REQUESTS_PER_S.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the relay's log"))
        .spawn()
        .expect("the relay starts");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let t0 = Instant::now();
    while !read_log().contains("listening on @netgap-relay") {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the relay did not come up: {}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let served = hold_connections(tb.ns("h2"), addr(1), Arc::clone(&stop));
    let unserved = hold_connections(tb.ns("h3"), addr(2), Arc::clone(&stop));
    // The served host's xdp end, as the neighbour table has it but for
    // the MAC.
    let target = format!("{}/{MADE_UP_MAC}/5", hosts.hosts[1].links[1].local);
    assert!(
        target.starts_with("10.77.1.2/"),
        "{target}: the served host's second link"
    );

    let cmd = common::child_test(module_path!(), "hostile_client");
    let out = Command::new("ip")
        .args(["netns", "exec", &h1])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env("HOSTILE_SERVED", served.to_string())
        .env("HOSTILE_UNSERVED", unserved.to_string())
        .env("HOSTILE_TARGET", &target)
        .output()
        .expect("the hostile client runs");
    stop.store(true, Ordering::Relaxed);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        read_log()
    );
    // Each request refused, with its reason in the reply.
    for (case, reason) in [
        ("loopback", "is this host (loopback)"),
        ("foreign", "the socket is uid 0's, not the asker's"),
        ("unserved", "is no host this relay serves"),
        ("made-up MAC", "not the MAC the neighbour table has"),
    ] {
        let line = said
            .lines()
            .find(|l| l.starts_with(&format!("{case}: ")))
            .unwrap_or_else(|| panic!("no answer to {case}: {said}"));
        assert!(
            line.contains("refused: ") && line.contains(reason),
            "{line}\n{said}"
        );
        // And one line of the relay's log each.
        let text = read_log();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("uid 65534 (pid") && l.contains(reason))
            .collect();
        assert_eq!(lines.len(), 1, "{case}: {text}");
    }
    // The flood: past its requests a second it is refused at once, each
    // refusal said in the reply.
    let garbage = said
        .lines()
        .filter(|l| l.starts_with("garbage: refused: "))
        .count();
    let rated = said
        .lines()
        .filter(|l| l.starts_with("garbage: refused: more than"))
        .count();
    assert_eq!(garbage, GARBAGE, "{said}");
    // The first REQUESTS_PER_S requests (the four above among them) and
    // what the bucket regained meanwhile passed.
    assert!(
        (1..=GARBAGE + 4 - REQUESTS_PER_S).contains(&rated),
        "{rated} refused for the rate: {said}"
    );
    // Its log lines: a burst, then a line counting the rest, within a
    // second or so.
    // Its lines written (its uid and pid in them) and counted.
    let tally = |text: &str| -> (usize, usize) {
        let written = text
            .lines()
            .filter(|l| l.contains("uid 65534 (pid"))
            .count();
        let counted = text
            .lines()
            .filter_map(|l| l.split("uid 65534: ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
            .sum();
        (written, counted)
    };
    let t0 = Instant::now();
    let mut text = read_log();
    loop {
        let (written, counted) = tally(&text);
        if written + counted >= 4 + GARBAGE || t0.elapsed() > Duration::from_secs(5) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        text = read_log();
    }
    let (written, counted) = tally(&text);
    assert_eq!(
        written + counted,
        4 + GARBAGE,
        "every line of uid 65534 written or counted: {text}"
    );
    assert!(written <= 25, "{written} lines of uid 65534: {text}");
    // Nothing was attached or opened for any of it.
    for l in text.lines() {
        assert!(
            !l.contains("no link") && !l.contains("link up"),
            "a refused request opened a link: {text}"
        );
    }
    let links = Command::new("ip")
        .args(["-n", &h1, "-d", "link", "show"])
        .output()
        .expect("ip link");
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains("xdp"),
        "an XDP program is attached: {links}"
    );
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(relay.id() as i32, libc::SIGTERM) };
    let _ = relay.wait();
    drop(tb);
}

/// A region as the library makes it: a sealed memfd with its header, of
/// 4096-byte rings.
fn region() -> OwnedFd {
    const RING: usize = 4096;
    // SAFETY: a NUL-terminated name and plain flags.
    let fd =
        unsafe { libc::memfd_create(c"r".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: our own new descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let header = HeaderFields {
        waits: Waits::Sleep,
        capacity: RING as u64,
        connector_ino: 0,
        listener_ino: 0,
    }
    .to_bytes();
    // SAFETY: plain calls on our own memfd; `header` is valid for reads
    // of its length.
    unsafe {
        assert_eq!(
            libc::ftruncate(fd.as_raw_fd(), region_bytes(RING) as libc::off_t),
            0
        );
        assert_eq!(
            libc::pwrite(fd.as_raw_fd(), header.as_ptr().cast(), header.len(), 0),
            header.len() as isize
        );
        assert_eq!(
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            ),
            0
        );
    }
    fd
}

/// A connection to the relay's socket.
fn relay_socket() -> OwnedFd {
    // SAFETY: plain socket creation, checked and owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket");
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero bytes are a valid sockaddr_un.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path[1..].iter_mut().zip(b"netgap-relay") {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + "netgap-relay".len();
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const a).cast(),
            len as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "connect to @netgap-relay");
    fd
}

/// Sends `bytes` with descriptors `fds` on a new connection to the relay;
/// its reply, as text.
fn ask(bytes: &[u8], fds: &[RawFd]) -> String {
    let sock = relay_socket();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let mut control = [0u8; 64];
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let data_len = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE of a small length.
        let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds `space` bytes, room for one
        // header and `fds`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_len as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    // SAFETY: a complete msghdr over live buffers.
    // A relay that refuses at once (past the requests a second) may have
    // closed the connection already: its reply is still there to read.
    let _ = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    let mut reply = [0u8; RELAY_REPLY_BYTES];
    let mut f = std::fs::File::from(sock);
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, 10_000) } <= 0 {
        return "no reply".into();
    }
    match f.read(&mut reply) {
        Ok(n) => match RelayReply::decode(&reply[..n]) {
            Ok(RelayReply::Refused(why)) => format!("refused: {why}"),
            Ok(RelayReply::Ok(what)) => format!("ok: {what}"),
            Err(e) => format!("a bad reply: {e}"),
        },
        Err(e) => format!("no reply: {e}"),
    }
}

/// Drops root for good: uid and gid 65534, no groups.
fn become_nobody() {
    // SAFETY: plain credential calls; glibc applies them to every thread.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups");
        assert_eq!(libc::setresgid(65534, 65534, 65534), 0, "setresgid");
        assert_eq!(libc::setresuid(65534, 65534, 65534), 0, "setresuid");
        assert_eq!(libc::geteuid(), 65534);
    }
}

/// The hostile user's side, run by the test above as a child in host 1's
/// namespace: each request on a fresh connection to the relay, one line
/// each on standard output, `CASE: REPLY`.
#[test]
#[ignore = "helper run in a child process by the hostile relay test"]
fn hostile_client() {
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let served: SocketAddr = env("HOSTILE_SERVED").parse().expect("an address");
    let unserved: SocketAddr = env("HOSTILE_UNSERVED").parse().expect("an address");
    let target = env("HOSTILE_TARGET");
    // Off the line the test harness began with its name.
    println!();
    // Root's connection to the served host, made before root is dropped.
    let roots = TcpStream::connect(served).expect("root's connection");
    become_nobody();
    let listen = RelayRequest::Listen {
        ring_bytes: 4096,
        key: [7; 32],
    }
    .encode();
    let lo = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let looped = TcpStream::connect(lo.local_addr().expect("address")).expect("loopback");
    let own_unserved = TcpStream::connect(unserved).expect("a connection to host 3");
    let own_served = TcpStream::connect(served).expect("a connection to host 2");
    let connect = RelayRequest::Connect {
        ring_bytes: 4096,
        key: [8; 32],
        target,
    }
    .encode();
    for (case, req, tcp) in [
        ("loopback", &listen, looped.as_raw_fd()),
        ("foreign", &listen, roots.as_raw_fd()),
        ("unserved", &listen, own_unserved.as_raw_fd()),
        ("made-up MAC", &connect, own_served.as_raw_fd()),
    ] {
        let r = region();
        println!("{case}: {}", ask(req, &[r.as_raw_fd(), tcp]));
    }
    for i in 0..GARBAGE {
        let junk = format!("GET /{i} HTTP/1.1\r\n\r\n");
        println!("garbage: {}", ask(junk.as_bytes(), &[]));
    }
}
