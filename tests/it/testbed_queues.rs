//! The testbed's host links have many queues, and a netgap frame sent on
//! queue q of one host arrives on queue q at the other, through the
//! switch's shaped link (a TBF toward the host, the uplink's IFB redirect
//! at the port it came in on) and through a shaped mesh link (a bridge in
//! the link's own namespace): what a direct connection, a socket bound to
//! one queue at each host, stands on.
//!
//! The frames are plain netgap-EtherType frames from a packet socket; a
//! small tc program at the sending host's egress puts each on its queue
//! (as an AF_XDP socket's copy-mode transmit uses its own queue), and an
//! XDP program at the receiving host's driver hook counts them by the
//! queue they arrive on. Both are plain instructions loaded with the `bpf`
//! system call, and attached as links, which go with the test.
//!
//! Without root and namespaces the test says why and passes (with
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 it fails, as in CI).

use crate::common::testbed::Testbed;
use crate::common::{netgap, ok, system_ready};
use serde_json::Value;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;

/// netgap's EtherType (the xdp transport's frames).
const ETHERTYPE: u16 = 0x88b5;
/// Frames sent on each queue.
const FRAMES: u64 = 20;

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// netgap's EtherType as a program loads it from a frame or `skb->protocol`
/// (network order).
fn ethertype_as_loaded() -> i32 {
    i32::from(u16::from_ne_bytes(ETHERTYPE.to_be_bytes()))
}

/// A `bpf_attr`, as bytes, big enough for the commands used.
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }

    fn u32_at(mut self, at: usize, v: u32) -> Attr {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }

    fn u64_at(mut self, at: usize, v: u64) -> Attr {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }

    fn call(mut self, cmd: libc::c_long) -> io::Result<libc::c_long> {
        // SAFETY: a zeroed `bpf_attr` prefix of the size given, whose
        // pointers (set by the callers) point to buffers alive for the
        // call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                self.0.as_mut_ptr(),
                self.0.len() as libc::c_uint,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc)
    }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: a new descriptor the kernel just returned; nothing else owns
    // it.
    unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) }
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_TCX_EGRESS: u32 = 47;
const BPF_XDP: u32 = 37;
/// Queues the counting map has a slot for.
const COUNTED_QUEUES: u32 = 64;

fn load(prog_type: u32, attach_type: u32, insns: &[Insn]) -> OwnedFd {
    let license = c"GPL";
    let fd = Attr::new()
        .u32_at(0, prog_type)
        .u32_at(4, insns.len() as u32)
        .u64_at(8, insns.as_ptr() as u64)
        .u64_at(16, license.as_ptr() as u64)
        .u32_at(68, attach_type)
        .call(BPF_PROG_LOAD)
        .expect("the program loads");
    owned(fd)
}

fn ifindex(ifname: &str) -> u32 {
    let name = std::ffi::CString::new(ifname).expect("a name");
    // SAFETY: a NUL-terminated name alive for the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "{ifname}: {}", io::Error::last_os_error());
    index
}

/// A link of `prog` at `attach_type` of `ifname` in this thread's
/// namespace; it goes with the descriptor.
fn link(prog: &OwnedFd, ifname: &str, attach_type: u32) -> OwnedFd {
    let fd = Attr::new()
        .u32_at(0, prog.as_raw_fd() as u32)
        .u32_at(4, ifindex(ifname))
        .u32_at(8, attach_type)
        .call(BPF_LINK_CREATE)
        .expect("the program attaches");
    owned(fd)
}

/// Runs `f` on a thread inside namespace `ns`; its result.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        netgap_transport::netns::enter(&ns).expect("entering the namespace");
        f()
    })
    .join()
    .expect("the namespace's thread")
}

/// The counter at the receiving host: an XDP program on `ifname` that
/// counts netgap frames by the queue they arrived on. Its map and its
/// link, which holds it there.
fn count_by_queue(ifname: &str) -> (OwnedFd, OwnedFd) {
    let map = owned(
        Attr::new()
            .u32_at(0, BPF_MAP_TYPE_ARRAY)
            .u32_at(4, 4)
            .u32_at(8, 8)
            .u32_at(12, COUNTED_QUEUES)
            .call(BPF_MAP_CREATE)
            .expect("the map"),
    );
    let map_fd = map.as_raw_fd();
    let prog = [
        // r2 = ctx->rx_queue_index; r3 = data; r4 = data_end
        insn(0x61, 2, 1, 16, 0),
        insn(0x61, 3, 1, 0, 0),
        insn(0x61, 4, 1, 4, 0),
        // if data + 14 > data_end: to the verdict
        insn(0xbf, 5, 3, 0, 0),
        insn(0x07, 5, 0, 0, 14),
        insn(0x2d, 5, 4, 11, 0),
        // if the EtherType is not netgap's: to the verdict
        insn(0x69, 5, 3, 12, 0),
        insn(0x55, 5, 0, 9, ethertype_as_loaded()),
        // counts[rx_queue_index] += 1
        insn(0x63, 10, 2, -4, 0),
        insn(0x18, 1, 1, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(0xbf, 2, 10, 0, 0),
        insn(0x07, 2, 0, 0, -4),
        insn(0x85, 0, 0, 0, 1),
        insn(0x15, 0, 0, 2, 0),
        insn(0xb7, 1, 0, 0, 1),
        insn(0xdb, 0, 1, 0, 0),
        // XDP_PASS
        insn(0xb7, 0, 0, 0, 2),
        insn(0x95, 0, 0, 0, 0),
    ];
    let prog = load(BPF_PROG_TYPE_XDP, BPF_XDP, &prog);
    let link = link(&prog, ifname, BPF_XDP);
    (map, link)
}

/// The count of queue `queue` in `map`.
fn counted(map: &OwnedFd, queue: u32) -> u64 {
    let key = queue;
    let mut value = 0u64;
    Attr::new()
        .u32_at(0, map.as_raw_fd() as u32)
        .u64_at(8, std::ptr::from_ref(&key) as u64)
        .u64_at(16, std::ptr::from_mut(&mut value) as u64)
        .call(BPF_MAP_LOOKUP_ELEM)
        .expect("the map's slot");
    value
}

/// Sends [`FRAMES`] netgap frames to `dst` out of `ifname` (in this
/// thread's namespace) on transmit queue `queue`: a tc program at the
/// egress sets their queue (a mapping written there is read as a recorded
/// receive queue, stored plus one), for as long as the sending lasts.
fn send_on_queue(ifname: &str, dst: [u8; 6], queue: u32) {
    let prog = [
        insn(0x61, 2, 1, 16, 0),
        insn(0x55, 2, 0, 2, ethertype_as_loaded()),
        insn(0xb7, 2, 0, 0, queue as i32 + 1),
        insn(0x63, 1, 2, 12, 0),
        insn(0xb7, 0, 0, 0, -1),
        insn(0x95, 0, 0, 0, 0),
    ];
    let prog = load(BPF_PROG_TYPE_SCHED_CLS, 0, &prog);
    let _on_queue = link(&prog, ifname, BPF_TCX_EGRESS);
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(fd >= 0, "packet socket: {}", io::Error::last_os_error());
    let socket = owned(libc::c_long::from(fd));
    // SAFETY: sockaddr_ll is plain data; all zero is a valid value.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_protocol = ETHERTYPE.to_be();
    to.sll_ifindex = ifindex(ifname) as i32;
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&dst);
    for i in 0..FRAMES {
        let mut frame = Vec::with_capacity(64);
        frame.extend_from_slice(&dst);
        frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x51]);
        frame.extend_from_slice(&ETHERTYPE.to_be_bytes());
        frame.resize(60, 0);
        frame[56..].copy_from_slice(&(i as u32).to_be_bytes());
        // SAFETY: the frame and the address are alive for the call, their
        // lengths as given.
        let sent = unsafe {
            libc::sendto(
                socket.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::from_ref(&to).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(sent, frame.len() as isize, "{}", io::Error::last_os_error());
    }
}

/// The MAC of `dev` in namespace `ns`.
fn mac_of(ns: &str, dev: &str) -> [u8; 6] {
    let text = ok(Command::new("ip")
        .args(["-j", "-n", ns, "link", "show", "dev", dev])
        .output()
        .expect("ip runs"));
    let v: Value = serde_json::from_str(&text).expect("ip's JSON");
    let mut mac = [0u8; 6];
    let text = v[0]["address"].as_str().expect("a MAC");
    for (b, part) in mac.iter_mut().zip(text.split(':')) {
        *b = u8::from_str_radix(part, 16).expect("a MAC byte");
    }
    mac
}

/// Testbed `tb`'s status and `kernel-links.json` say its host links have
/// 32 queues each way.
fn assert_links_have_32_queues(tb: &Testbed) -> String {
    let status = ok(netgap()
        .args(["testbed", "status", "--name", &tb.name])
        .output()
        .expect("status runs"));
    assert!(
        status.contains("host links: 32 queues each way"),
        "{status}"
    );
    let kernel: Value = serde_json::from_str(
        &std::fs::read_to_string(tb.dir().join("kernel-links.json")).expect("kernel-links.json"),
    )
    .expect("its JSON");
    for end in kernel.as_array().expect("link ends") {
        assert_eq!(end["queues"], 32, "{end}");
    }
    status
}

/// Frames h1 sends out of `h1_if` on queues 1, 2, 7, 31 and 0, to h2's
/// `h2_if`, each arrive there on the queue they were sent on, and only
/// there.
fn assert_frames_keep_their_queues(tb: &Testbed, h1_if: &'static str, h2_if: &'static str) {
    let (h1, h2) = (tb.ns("h1"), tb.ns("h2"));
    let dst = mac_of(&h2, h2_if);
    let (map, _counting) = in_ns(&h2, move || count_by_queue(h2_if));
    for queue in [1, 2, 7, 31, 0] {
        let before: Vec<u64> = (0..COUNTED_QUEUES).map(|q| counted(&map, q)).collect();
        in_ns(&h1, move || send_on_queue(h1_if, dst, queue));
        let t0 = std::time::Instant::now();
        while counted(&map, queue) - before[queue as usize] < FRAMES
            && t0.elapsed() < std::time::Duration::from_secs(5)
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let arrived: Vec<(u32, u64)> = (0..COUNTED_QUEUES)
            .map(|q| (q, counted(&map, q) - before[q as usize]))
            .filter(|&(_, n)| n > 0)
            .collect();
        assert_eq!(
            arrived,
            vec![(queue, FRAMES)],
            "frames sent on queue {queue} arrived on (queue, frames)"
        );
    }
}

/// Through the switch, shaped: a TBF at the port toward h2, and h1's
/// uplink (its port's ingress redirected to an IFB device), which sends
/// every frame on with queue 0.
#[test]
fn a_frame_sent_on_a_queue_arrives_on_it_through_a_shaped_link() {
    if !system_ready("a_frame_sent_on_a_queue_arrives_on_it_through_a_shaped_link") {
        return;
    }
    let (tb, _) = Testbed::up("tqueue", &["--hosts", "2", "--rate", "1G"]);
    let status = assert_links_have_32_queues(&tb);
    assert!(
        status.contains("ingress ffff:"),
        "the uplink's redirect: {status}"
    );
    assert_frames_keep_their_queues(&tb, "eth0", "eth0");
}

/// Through a mesh link, shaped: its middle namespace's bridge, a TBF at
/// the port toward each host.
#[test]
fn a_frame_sent_on_a_queue_arrives_on_it_through_a_shaped_mesh_link() {
    if !system_ready("a_frame_sent_on_a_queue_arrives_on_it_through_a_shaped_mesh_link") {
        return;
    }
    let (tb, _) = Testbed::up(
        "tqueuemesh",
        &["--hosts", "2", "--topology", "mesh", "--rate", "1G"],
    );
    assert_links_have_32_queues(&tb);
    assert_frames_keep_their_queues(&tb, "p2l0", "p1l0");
}
