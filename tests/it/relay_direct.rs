//! `netgap relay` serving direct connections: two namespaces this test
//! makes itself, joined by a one-queue veth for the programs' TCP
//! connections and a four-queue veth for the relays' xdp (no bridge: a
//! veth keeps the sender's queue), a relay in each. A TCP connection
//! between a listener in one namespace and a connector in the other asks
//! each relay for a direct connection; each side gets a grant and the
//! handed AF_XDP socket and UMEM: the queues agree (never 0), the flows
//! are crossed, each side's peer MAC is the other veth's, the socket is an
//! AF_XDP one bound to that queue, the memfd as large as the geometry
//! says. When a side's relay socket closes, its relay says the queue is
//! free again, and a new connection gets that queue again. Refusals, each
//! in one line of the relay's log: a socket the asker does not own, an
//! accept no connect follows (within its bound), a relay with direct
//! connections off.
//!
//! Built only with the `xdp` feature; without root or namespaces the test
//! prints why and passes (with NETGAP_REQUIRE_SYSTEM_TESTS=1 that is a
//! failure).

use crate::common::{self, netgap_path, system_ready};
use netgap::proto::direct::{
    DirectGrant, DirectRequest, DirectRole, DIRECT_GRANT_BYTES, DIRECT_REQUEST_BYTES,
};
use netgap::proto::preload::{RelayReply, RELAY_REPLY_BYTES};
use netgap::transport::xdp::handover::{make, receive_after, HandedPort};
use netgap::transport::xdp::Shape;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Queues of the xdp veth: seven a direct connection may take, six of
/// them one uid's.
const QUEUES: u32 = 8;

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn ns_sh(ns: &str, args: &[&str]) -> bool {
    let mut all = vec!["ip", "netns", "exec", ns];
    all.extend_from_slice(args);
    sh(&all)
}

/// `/sys/class/net/DEV/NAME` as namespace `ns` has it (sysfs shows the
/// namespace it was mounted in, which `ip netns exec` sees to).
fn sys_value(ns: &str, dev: &str, name: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat"])
        .arg(format!("/sys/class/net/{dev}/{name}"))
        .output()
        .expect("cat");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn read_mac(ns: &str, dev: &str) -> [u8; 6] {
    let text = sys_value(ns, dev, "address");
    let mut mac = [0u8; 6];
    for (m, part) in mac.iter_mut().zip(text.split(':')) {
        *m = u8::from_str_radix(part, 16).expect("a MAC");
    }
    mac
}

/// Two namespaces `PREFIX1` and `PREFIX2`: a TCP link `10.N.0.0/24`
/// (`PREFIXt1`, `PREFIXt2`) and a four-queue xdp link `10.N.1.0/24`
/// (`PREFIXx1`, `PREFIXx2`), each side's neighbour entry filled. Taken
/// down on drop.
struct Bed {
    prefix: &'static str,
    net: u8,
}

impl Bed {
    fn ns(&self, i: u8) -> String {
        format!("{}{i}", self.prefix)
    }

    fn dev(&self, kind: char, i: u8) -> String {
        format!("{}{kind}{i}", self.prefix)
    }

    fn tcp_ip(&self, i: u8) -> String {
        format!("10.{}.0.{i}", self.net)
    }

    fn xdp_ip(&self, i: u8) -> String {
        format!("10.{}.1.{i}", self.net)
    }

    fn up(prefix: &'static str, net: u8) -> Bed {
        let bed = Bed { prefix, net };
        // Left over by an earlier run of this test, if any.
        bed.down();
        let (n1, n2) = (bed.ns(1), bed.ns(2));
        for ns in [&n1, &n2] {
            assert!(sh(&["ip", "netns", "add", ns]), "ip netns add {ns}");
            assert!(ns_sh(ns, &["ip", "link", "set", "lo", "up"]));
        }
        let q = QUEUES.to_string();
        assert!(sh(&[
            "ip",
            "link",
            "add",
            &bed.dev('t', 1),
            "netns",
            &n1,
            "type",
            "veth",
            "peer",
            "name",
            &bed.dev('t', 2),
            "netns",
            &n2
        ]));
        assert!(sh(&[
            "ip",
            "link",
            "add",
            &bed.dev('x', 1),
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &n1,
            "type",
            "veth",
            "peer",
            "name",
            &bed.dev('x', 2),
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &n2
        ]));
        for i in [1u8, 2] {
            let ns = bed.ns(i);
            for (kind, ip) in [('t', bed.tcp_ip(i)), ('x', bed.xdp_ip(i))] {
                let dev = bed.dev(kind, i);
                assert!(ns_sh(
                    &ns,
                    &["ip", "addr", "add", &format!("{ip}/24"), "dev", &dev]
                ));
                assert!(ns_sh(&ns, &["ip", "link", "set", &dev, "up"]));
            }
        }
        // Both neighbour entries of the xdp link (a connect's target is
        // checked against them): a TCP connection attempt each way, which
        // the kernel resolves and the other side refuses.
        for (i, other) in [(1u8, bed.xdp_ip(2)), (2, bed.xdp_ip(1))] {
            in_ns(&bed.ns(i), move || {
                let to = std::net::SocketAddr::new(other.parse().expect("an address"), 9);
                let _ = TcpStream::connect_timeout(&to, Duration::from_secs(3));
            })
            .join()
            .expect("resolving the neighbour");
        }
        bed
    }

    fn down(&self) {
        for i in [1u8, 2] {
            sh(&["ip", "netns", "del", &self.ns(i)]);
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.down();
    }
}

/// A relay in namespace `i` of `bed`, its log in a file; killed on drop.
struct Relay {
    child: Child,
    log: PathBuf,
}

impl Relay {
    fn start(bed: &Bed, i: u8, key: &Path, dir: &Path, extra: &[&str]) -> Relay {
        let log = dir.join(format!("relay{i}-{}.log", extra.len()));
        let other = 3 - i;
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.ns(i)])
            .arg(netgap_path())
            .args(["relay", "--interface", &bed.dev('x', i)])
            .args(["--peers", &bed.tcp_ip(other), "--key"])
            .arg(key)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the relay's log"))
            .spawn()
            .expect("the relay starts");
        let r = Relay { child, log };
        r.wait_log("listening on @netgap-relay", Duration::from_secs(10));
        r
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_log(&self, needle: &str, within: Duration) {
        let t0 = Instant::now();
        while !self.log().contains(needle) {
            assert!(
                t0.elapsed() < within,
                "the relay's log has no {needle:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // SAFETY: a signal to the relay this test started, by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// What a test on namespaces of its own starts from: the bed, and a
/// directory with the relays' key and their logs. The bed goes before
/// the directory.
struct Setup {
    bed: Bed,
    key: PathBuf,
    dir: tempfile::TempDir,
}

impl Setup {
    /// The bed `prefix`, `net` (see [`Bed`]) and the key; `None` when the
    /// system cannot run `test` (it said why).
    fn up(test: &str, prefix: &'static str, net: u8) -> Option<Setup> {
        if !system_ready(test) {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let bed = Bed::up(prefix, net);
        let key = common::new_key_file(dir.path(), "relay.key");
        Some(Setup { bed, key, dir })
    }

    /// A relay in namespace `i` with the key and `extra` flags.
    fn relay(&self, i: u8, extra: &[&str]) -> Relay {
        Relay::start(&self.bed, i, &self.key, self.dir.path(), extra)
    }
}

/// Runs `f` on a thread in namespace `ns`.
fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("the namespace");
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
}

/// A TCP connection from namespace 1 to a listener in namespace 2: the
/// connector's socket and the accepted one.
fn tcp_pair(bed: &Bed) -> (TcpStream, TcpStream) {
    let ip = bed.tcp_ip(2);
    let listener = in_ns(&bed.ns(2), move || {
        TcpListener::bind((ip.as_str(), 0)).expect("listen")
    })
    .join()
    .expect("listener");
    let addr = listener.local_addr().expect("its address");
    let connector = in_ns(&bed.ns(1), move || {
        TcpStream::connect(addr).expect("connect")
    })
    .join()
    .expect("connector");
    let (accepted, _) = listener.accept().expect("accept");
    (connector, accepted)
}

/// A connection to the relay's socket in this thread's namespace.
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

/// Sends a direct request with the TCP socket `tcp` on `sock`.
fn send_request(sock: &OwnedFd, req: &DirectRequest, tcp: RawFd) {
    let bytes = req.encode();
    assert_eq!(bytes.len(), DIRECT_REQUEST_BYTES);
    let fds = [tcp];
    let iov = [std::io::IoSlice::new(&bytes)];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    nix::sys::socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &cmsg,
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .expect("sending the request");
}

/// The next datagram's length, waiting at most `within`; 0 when the
/// relay hung up, None when nothing came.
fn next_len(sock: &OwnedFd, within: Duration) -> Option<usize> {
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, within.as_millis() as libc::c_int) } <= 0 {
        return None;
    }
    let mut b = [0u8; 1];
    // SAFETY: a peek of at most one byte into `b`; MSG_TRUNC gives the
    // datagram's whole length.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_TRUNC,
        )
    };
    usize::try_from(n).ok()
}

/// Asks the relay of this thread's namespace for a direct connection:
/// `role` with `key`, over the TCP socket `tcp`; the socket to the relay.
fn ask(key: [u8; 32], role: DirectRole, tcp: RawFd) -> OwnedFd {
    let sock = relay_socket();
    send_request(&sock, &DirectRequest { key, role }, tcp);
    sock
}

/// The relay's reply (not a grant), as text.
fn reply(sock: &OwnedFd, within: Duration) -> String {
    match next_len(sock, within) {
        None => return "no reply".into(),
        Some(0) => return "hung up".into(),
        Some(_) => {}
    }
    let mut b = [0u8; RELAY_REPLY_BYTES];
    // SAFETY: `b` is valid for writes of its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), 0) };
    match RelayReply::decode(&b[..usize::try_from(n).unwrap_or(0)]) {
        Ok(RelayReply::Refused(why)) => format!("refused: {why}"),
        Ok(RelayReply::Ok(what)) => format!("ok: {what}"),
        Err(e) => format!("a bad reply: {e}"),
    }
}

/// The grant and the handed port, or the relay's refusal as text.
fn grant(sock: &OwnedFd) -> Result<(DirectGrant, HandedPort), String> {
    match next_len(sock, Duration::from_secs(10)) {
        Some(n) if n == DIRECT_GRANT_BYTES + 20 => {}
        Some(n) if n == RELAY_REPLY_BYTES => return Err(reply(sock, Duration::ZERO)),
        other => return Err(format!("no grant: {other:?}")),
    }
    let mut head = [0u8; DIRECT_GRANT_BYTES];
    let port = receive_after(sock.as_fd(), &mut head).map_err(|e| e.to_string())?;
    let g = DirectGrant::decode(&head).map_err(|e| e.to_string())?;
    Ok((g, port))
}

/// Both sides of a new TCP connection ask for a direct connection with
/// `key`, as a program's would: the accepting side (namespace 2) first,
/// the connecting side (namespace 1) once the accepting relay named its
/// target. Then each side's socket to its relay goes to its own
/// function: `connecting`'s result and `accepting`'s.
fn crossed<C, A>(
    bed: &Bed,
    key: [u8; 32],
    connecting: impl FnOnce(OwnedFd) -> C + Send + 'static,
    accepting: impl FnOnce(OwnedFd) -> A + Send + 'static,
) -> (C, A)
where
    C: Send + 'static,
    A: Send + 'static,
{
    let (connector, accepted) = tcp_pair(bed);
    let (target_tx, target_rx) = mpsc::channel::<String>();
    let accepting = in_ns(&bed.ns(2), move || {
        let sock = ask(key, DirectRole::Accept, accepted.as_raw_fd());
        let first = reply(&sock, Duration::from_secs(10));
        let target = first
            .strip_prefix("ok: ")
            .unwrap_or_else(|| panic!("the accept's first reply: {first}"))
            .to_string();
        target_tx.send(target).expect("the target to the connector");
        accepting(sock)
    });
    let target = target_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the accepting relay's target");
    let connecting = in_ns(&bed.ns(1), move || {
        let sock = ask(key, DirectRole::Connect { target }, connector.as_raw_fd());
        connecting(sock)
    });
    let c = connecting.join().expect("the connecting side");
    let a = accepting.join().expect("the accepting side");
    (c, a)
}

/// Both sides of one TCP connection ask for a direct connection with
/// `key`; each side's relay socket, grant and port.
type Side = (OwnedFd, DirectGrant, HandedPort);

fn both_sides(bed: &Bed, key: [u8; 32]) -> (Side, Side) {
    crossed(
        bed,
        key,
        |sock| {
            let (g, port) = grant(&sock).unwrap_or_else(|e| panic!("the connecting side: {e}"));
            (sock, g, port)
        },
        |sock| {
            let (g, port) = grant(&sock).unwrap_or_else(|e| panic!("the accepting side: {e}"));
            (sock, g, port)
        },
    )
}

/// Whether queue `queue` of interface `ifindex` in namespace `ns` is
/// taken: a second AF_XDP socket cannot bind it (the kernel has no
/// socket diagnostics for AF_XDP everywhere, so this is how a socket's
/// queue shows).
fn queue_taken(ns: &str, ifindex: u32, queue: u32) -> bool {
    let small = Shape {
        frames: 64,
        frame_bytes: 4096,
        ring_entries: 32,
    };
    in_ns(ns, move || match make(ifindex, queue, small) {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => true,
        Err(e) => panic!("binding a second socket to queue {queue}: {e}"),
    })
    .join()
    .expect("the binding thread")
}

fn domain_of(fd: RawFd) -> i32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` is valid for writes of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "SO_DOMAIN");
    v
}

fn size_of_fd(fd: &OwnedFd) -> u64 {
    std::fs::File::from(fd.try_clone().expect("dup"))
        .metadata()
        .expect("fstat")
        .len()
}

fn checked_side(bed: &Bed, i: u8, side: &Side) {
    let (_, g, port) = side;
    assert!(g.queue > 0 && u32::from(g.queue) < QUEUES, "{g:?}");
    assert_eq!(port.geometry.queue, u32::from(g.queue));
    assert_eq!(domain_of(port.socket.as_raw_fd()), libc::AF_XDP);
    assert_eq!(size_of_fd(&port.umem), port.geometry.umem_bytes());
    assert_eq!(
        g.peer_mac,
        read_mac(&bed.ns(3 - i), &bed.dev('x', 3 - i)),
        "side {i}'s peer MAC is the other veth's"
    );
    let index: u32 = sys_value(&bed.ns(i), &bed.dev('x', i), "ifindex")
        .parse()
        .expect("an ifindex");
    assert_eq!(port.geometry.ifindex, index, "the xdp veth");
    assert!(
        queue_taken(&bed.ns(i), index, u32::from(g.queue)),
        "side {i}: the handed socket holds queue {}",
        g.queue
    );
    let unheld = QUEUES - 1;
    assert_ne!(u32::from(g.queue), unheld, "the lowest queue is agreed");
    assert!(
        !queue_taken(&bed.ns(i), index, unheld),
        "queue {unheld} is held by nobody"
    );
}

#[test]
fn a_direct_connection_gets_one_queue_at_both_ends_freed_when_its_program_hangs_up() {
    let test = "a_direct_connection_gets_one_queue_at_both_ends_freed_when_its_program_hangs_up";
    let Some(setup) = Setup::up(test, "ngrda", 93) else {
        return;
    };
    let bed = &setup.bed;
    let r1 = setup.relay(1, &[]);
    let r2 = setup.relay(2, &[]);

    let (c, a) = both_sides(bed, [0x31; 32]);
    let (cg, ag) = (c.1, a.1);
    assert_eq!(cg.queue, ag.queue, "the queues agree");
    assert_eq!(cg.local_flow, ag.peer_flow, "the flows are crossed");
    assert_eq!(ag.local_flow, cg.peer_flow, "the flows are crossed");
    checked_side(bed, 1, &c);
    checked_side(bed, 2, &a);
    let q = cg.queue;

    // The accepting program goes: its relay frees the queue.
    drop(a);
    let freed = format!("direct connection on queue {q} closed");
    r2.wait_log(&freed, Duration::from_secs(5));
    assert!(r2.log().contains(&format!("queue {q} is free again")));
    drop(c);
    r1.wait_log(&freed, Duration::from_secs(5));

    // A new connection gets the same (lowest) queue again at both ends,
    // once the relays stop passing over a queue just released (200 ms,
    // while the kernel may still be freeing the last socket's hold on it).
    std::thread::sleep(Duration::from_millis(300));
    let (c, a) = both_sides(bed, [0x32; 32]);
    assert_eq!((c.1.queue, a.1.queue), (q, q), "{:?} {:?}", c.1, a.1);
    drop((c, a));

    // Connections offered at the same moment each get a queue of their
    // own (an offer reserved every free queue, and those offered
    // meanwhile found none).
    let four: Vec<(Side, Side)> = std::thread::scope(|s| {
        let each: Vec<_> = (0..4u8)
            .map(|i| s.spawn(move || both_sides(bed, [0x40 + i; 32])))
            .collect();
        each.into_iter()
            .map(|h| h.join().expect("a connection offered at once"))
            .collect()
    });
    let mut queues: Vec<u16> = four
        .iter()
        .map(|(c, a)| {
            assert_eq!(c.1.queue, a.1.queue, "the queues agree");
            c.1.queue
        })
        .collect();
    queues.sort_unstable();
    queues.dedup();
    assert_eq!(queues.len(), 4, "a queue each: {queues:?}");
    drop(four);
    drop((r1, r2));
}

/// A regression test: past the connecting side's cap its relay refused
/// its program before offering, and the accepting side's relay waited out
/// its 3 s for an offer that never came, with its program (a server's
/// event loop) waiting inside its call.
#[test]
fn a_connect_past_its_users_cap_refuses_the_accepting_side_at_once() {
    let test = "a_connect_past_its_users_cap_refuses_the_accepting_side_at_once";
    let Some(setup) = Setup::up(test, "ngrdc", 95) else {
        return;
    };
    let bed = &setup.bed;
    let r1 = setup.relay(1, &["--max-direct-per-uid", "1"]);
    let r2 = setup.relay(2, &[]);
    // The connecting side's user holds its one queue.
    let held = both_sides(bed, [0x51; 32]);

    // The accepting side's wait is timed from when its relay named the
    // target, which the connecting side then asks for.
    let (connecting, (second, waited)) = crossed(
        bed,
        [0x52; 32],
        |sock| reply(&sock, Duration::from_secs(10)),
        |sock| {
            let t0 = Instant::now();
            let second = reply(&sock, Duration::from_secs(10));
            (second, t0.elapsed())
        },
    );
    // The reply's text is cut to its record's size.
    assert!(
        connecting.starts_with("refused: this uid holds 1 direct queues already"),
        "{connecting}"
    );
    assert_eq!(
        second,
        "refused: the other relay has no queue for the connection"
    );
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    drop(held);
    drop((r1, r2));
}

/// A regression test: an accept its relay refused (here at the door, past
/// `--max-per-uid`) left the connecting side's offer parked for its 3 s,
/// and a granted direct connection held its slot in the connections per
/// uid until its program hung up, so closes that linger refused the next
/// connection (`relay: connection limit`, gmond's answers).
#[test]
fn a_refused_accept_refuses_the_connect_at_once_and_granted_ones_leave_the_connection_limit() {
    let test =
        "a_refused_accept_refuses_the_connect_at_once_and_granted_ones_leave_the_connection_limit";
    let Some(setup) = Setup::up(test, "ngrdl", 97) else {
        return;
    };
    let bed = &setup.bed;
    let r1 = setup.relay(1, &[]);
    let r2 = setup.relay(2, &["--max-per-uid", "1"]);
    let first = both_sides(bed, [0x61; 32]);
    let second = both_sides(bed, [0x62; 32]);
    assert_ne!(first.0 .1.queue, second.0 .1.queue);
    let log = r2.log();
    let at = "listening for the other relay's flow at ";
    let target = log
        .lines()
        .find_map(|l| l.split_once(at).map(|(_, t)| t.trim().to_string()))
        .unwrap_or_else(|| panic!("the accepting relay's target:\n{log}"));

    // A client that sends nothing holds the accepting user's one slot.
    let hog = in_ns(&bed.ns(2), relay_socket).join().expect("the hog");
    let (connector, accepted) = tcp_pair(bed);
    let refused = in_ns(&bed.ns(2), move || {
        let sock = ask([0x63; 32], DirectRole::Accept, accepted.as_raw_fd());
        reply(&sock, Duration::from_secs(5))
    })
    .join()
    .expect("the accepting side");
    assert_eq!(refused, "refused: connection limit");
    let (answer, waited) = in_ns(&bed.ns(1), move || {
        let t0 = Instant::now();
        let sock = ask(
            [0x63; 32],
            DirectRole::Connect { target },
            connector.as_raw_fd(),
        );
        (reply(&sock, Duration::from_secs(10)), t0.elapsed())
    })
    .join()
    .expect("the connecting side");
    assert_eq!(
        answer,
        "refused: the other relay has no queue for the connection"
    );
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    drop((hog, first, second));
    drop((r1, r2));
}

/// The helper run as another user (65534) in namespace 1: makes a TCP
/// connection to `DIRECT_PEER` while still root, drops root, and asks the
/// relay for a direct connection with that socket; prints the reply.
#[test]
#[ignore = "helper run in a child process by the direct relay's refusal test"]
fn foreign_asker() {
    let peer = std::env::var("DIRECT_PEER").expect("DIRECT_PEER");
    let tcp = TcpStream::connect(peer.as_str()).expect("connect");
    // SAFETY: plain credential calls; glibc applies them to every thread.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups");
        assert_eq!(libc::setresgid(65534, 65534, 65534), 0, "setresgid");
        assert_eq!(libc::setresuid(65534, 65534, 65534), 0, "setresuid");
    }
    let sock = ask([0x41; 32], DirectRole::Accept, tcp.as_raw_fd());
    println!();
    println!("REPLY {}", reply(&sock, Duration::from_secs(10)));
}

#[test]
fn direct_requests_are_refused_in_one_line_each() {
    let test = "direct_requests_are_refused_in_one_line_each";
    let Some(setup) = Setup::up(test, "ngrdb", 94) else {
        return;
    };
    let bed = &setup.bed;
    let r1 = setup.relay(1, &[]);

    // A socket the asker does not own: root's, asked by uid 65534.
    let ip = bed.tcp_ip(2);
    let listener = in_ns(&bed.ns(2), move || {
        TcpListener::bind((ip.as_str(), 0)).expect("listen")
    })
    .join()
    .expect("listener");
    let peer = listener.local_addr().expect("address").to_string();
    let cmd = common::child_test(module_path!(), "foreign_asker");
    let out = Command::new("ip")
        .args(["netns", "exec", &bed.ns(1)])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env("DIRECT_PEER", &peer)
        .output()
        .expect("the foreign asker runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("REPLY refused: the socket is uid 0's, not the asker's"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    r1.wait_log("uid 65534", Duration::from_secs(5));
    assert!(r1.log().contains("direct: refused: the socket is uid 0's"));
    drop(listener);

    // An accept that no connect follows: its target, then the refusal
    // within the bound (3 s).
    let r2 = setup.relay(2, &[]);
    let (_connector, accepted) = tcp_pair(bed);
    let t0 = Instant::now();
    let (first, second) = in_ns(&bed.ns(2), move || {
        let sock = ask([0x43; 32], DirectRole::Accept, accepted.as_raw_fd());
        let first = reply(&sock, Duration::from_secs(10));
        let second = reply(&sock, Duration::from_secs(10));
        (first, second)
    })
    .join()
    .expect("the accepting thread");
    let waited = t0.elapsed();
    assert!(first.starts_with("ok: 10.94.1.2/"), "{first}");
    assert_eq!(
        second,
        "refused: no queue offer from the other relay within 3s"
    );
    assert!(
        waited >= Duration::from_millis(2900) && waited < Duration::from_secs(6),
        "{waited:?}"
    );
    r2.wait_log("direct: refused: no queue offer", Duration::from_secs(5));
    drop(r2);

    // A relay with direct connections off.
    let r2 = setup.relay(2, &["--no-direct"]);
    assert!(r2.log().contains("direct connections off (--no-direct)"));
    let (_connector, accepted) = tcp_pair(bed);
    let said = in_ns(&bed.ns(2), move || {
        let sock = ask([0x44; 32], DirectRole::Accept, accepted.as_raw_fd());
        reply(&sock, Duration::from_secs(10))
    })
    .join()
    .expect("the accepting thread");
    assert_eq!(
        said,
        "refused: direct connections are off on this relay (--no-direct)"
    );
    r2.wait_log(
        "direct: refused: direct connections are off",
        Duration::from_secs(5),
    );
    drop((r1, r2));
}

/// A direct queue cap of 0 is no way to turn direct connections off: the
/// relay refuses to start and names the flag that does.
#[test]
fn a_relay_allowing_no_direct_queue_refuses_to_start_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = common::new_key_file(dir.path(), "relay.key");
    let key = key.to_str().expect("utf-8");
    common::fails_with_one_line(
        &[
            "relay",
            "--interface",
            "eth1",
            "--peers",
            "10.0.0.2",
            "--key",
            key,
            "--max-direct-per-uid",
            "0",
        ],
        "--max-direct-per-uid must be at least 1 (turn direct connections off with --no-direct)",
    );
}
