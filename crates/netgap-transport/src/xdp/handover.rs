//! A port made by one process and used by another: the privileged maker
//! (the relay) makes the UMEM in a memfd and an AF_XDP socket on it, binds
//! the socket to a queue of its own (see `steer.rs`: one queue per
//! connection), puts it in the steering program's `XSKMAP`, and hands the
//! socket and the memfd over a Unix socket (`SCM_RIGHTS`) with the port's
//! geometry; the user maps the memfd and the socket's four rings itself
//! (`Xsk::from_handed`, in `sys/handed.rs`) and runs the flow engine on it as on
//! a port of its own. The maker keeps no copy: once the user has the
//! descriptors it closes its own, so when the user exits or dies the kernel
//! frees the socket, its UMEM and its `XSKMAP` entry, and nothing of one
//! process's frames is ever mapped in another's (the UMEM is the one
//! connection's alone).
//!
//! The socket is made with raw system calls, not libxdp, which would map
//! the rings in the maker, where nobody uses them.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr;

use super::sys::Shape;

/// `XDP_COPY`: frames are copied between the driver's buffers and the UMEM.
const XDP_COPY: u16 = 1 << 1;
/// `XDP_USE_NEED_WAKEUP`: the kernel says when a wake-up is needed.
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
/// Bytes of a handed port's geometry on the wire: five `u32`s.
const GEOMETRY_BYTES: usize = 20;
/// Largest UMEM a handed port may have: what a user maps on the maker's
/// word, bounded.
const MAX_UMEM_BYTES: u64 = 1 << 30;

/// The shape of a handed port and the queue its socket is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// The UMEM's and rings' shape.
    pub frames: u32,
    /// Bytes of each frame.
    pub frame_bytes: u32,
    /// Entries of each of the four rings.
    pub ring_entries: u32,
    /// The queue the socket is bound to.
    pub queue: u32,
    /// The interface's index in the maker's (and user's) namespace.
    pub ifindex: u32,
}

impl Geometry {
    /// The UMEM's bytes.
    pub fn umem_bytes(&self) -> u64 {
        u64::from(self.frames) * u64::from(self.frame_bytes)
    }

    fn to_bytes(self) -> [u8; GEOMETRY_BYTES] {
        let mut b = [0u8; GEOMETRY_BYTES];
        let fields = [
            self.frames,
            self.frame_bytes,
            self.ring_entries,
            self.queue,
            self.ifindex,
        ];
        for (chunk, v) in b.chunks_exact_mut(4).zip(fields) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// The geometry in `b`, checked: powers of two, a frame of 2048 or
    /// 4096 bytes, a UMEM of at most [`MAX_UMEM_BYTES`].
    fn from_bytes(b: &[u8]) -> io::Result<Geometry> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        if b.len() != GEOMETRY_BYTES {
            return Err(bad("a handed port's geometry has the wrong length"));
        }
        let f = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let g = Geometry {
            frames: f(0),
            frame_bytes: f(4),
            ring_entries: f(8),
            queue: f(12),
            ifindex: f(16),
        };
        let pow2 = |v: u32| v.is_power_of_two();
        if !(pow2(g.frames) && pow2(g.ring_entries) && matches!(g.frame_bytes, 2048 | 4096)) {
            return Err(bad(
                "a handed port's frames and rings must be powers of two",
            ));
        }
        if g.umem_bytes() > MAX_UMEM_BYTES || g.ring_entries > g.frames {
            return Err(bad("a handed port's UMEM or rings are too large"));
        }
        Ok(g)
    }
}

/// A port's socket and UMEM, made by one process for another.
#[derive(Debug)]
pub struct HandedPort {
    /// The AF_XDP socket, bound to `geometry.queue`.
    pub socket: OwnedFd,
    /// The memfd holding the UMEM.
    pub umem: OwnedFd,
    /// Its shape and queue.
    pub geometry: Geometry,
}

fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// `setsockopt(fd, SOL_XDP, opt, value)`.
fn set_xdp_opt<T>(fd: RawFd, opt: libc::c_int, value: &T, what: &str) -> io::Result<()> {
    // SAFETY: `value` is a live `T`, as long as the length says.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            ptr::from_ref(value).cast::<c_void>(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(last_error(what));
    }
    Ok(())
}

/// Makes a UMEM of `shape` in a memfd and an AF_XDP socket over it (copy
/// mode, with wake-ups), bound to `queue` of interface `ifindex` in this
/// thread's namespace. Needs the rights AF_XDP needs (`CAP_NET_RAW`).
/// [`prepare`] then [`Unbound::bind`].
pub fn make(ifindex: u32, queue: u32, shape: Shape) -> io::Result<HandedPort> {
    prepare(shape)?.bind(ifindex, queue).map_err(|(_, e)| e)
}

/// A port's socket with its UMEM registered and its rings sized, bound to
/// no queue yet: all of a port's making but the bind, which is what ties
/// it to a queue. The UMEM's registration, the costly part (the kernel
/// faults in and pins every page of it, milliseconds for 4 MiB), can so be
/// done before anyone knows the queue. Never bound, it receives nothing
/// and its drop frees it all.
#[derive(Debug)]
pub struct Unbound {
    socket: OwnedFd,
    umem: OwnedFd,
    shape: Shape,
    huge_pages: bool,
}

/// Makes a UMEM of `shape` in a fresh memfd and a fresh AF_XDP socket over
/// it, rings sized, bound to nothing ([`Unbound::bind`] binds it). Needs
/// `CAP_NET_RAW`.
///
/// The UMEM is on the system's huge pages while it has enough of them
/// free (`vm.nr_hugepages`, reserved by its operator), else on ordinary
/// pages: the registration faults in and pins each page, 2.4 µs a 4 KiB
/// page on a small VM (1.2 ms for 2 MiB), 0.04 ms for one 2 MiB huge page.
/// Either way the memory is fresh and the program maps it alike. On huge
/// pages the port takes as many more frames as fill its last page, up to
/// what its rings hold ([`on_whole_pages`]): registering a huge page costs
/// the same whatever part of it the frames use, and a size that is no
/// whole number of pages cannot go on them.
pub fn prepare(shape: Shape) -> io::Result<Unbound> {
    let huge = huge_page_bytes()
        .and_then(|page| on_whole_pages(shape, page))
        .ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported));
    huge.and_then(|s| prepare_on(s, true))
        .or_else(|_| prepare_on(shape, false))
}

/// The system's default huge page size, bytes (`Hugepagesize` in
/// `/proc/meminfo`, read once: it is fixed at boot); None where it has
/// none.
fn huge_page_bytes() -> Option<u64> {
    static BYTES: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = meminfo.lines().find(|l| l.starts_with("Hugepagesize:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024).filter(|&b| b > 0)
    })
}

/// `shape` with its frames raised to fill whole pages of `page_bytes`;
/// None when that takes more receive frames (half of them) than a ring
/// holds at once, or the frames do not divide a page.
fn on_whole_pages(shape: Shape, page_bytes: u64) -> Option<Shape> {
    let frame_bytes = u64::from(shape.frame_bytes);
    if frame_bytes == 0 || !page_bytes.is_multiple_of(frame_bytes) {
        return None;
    }
    let per_page = page_bytes / frame_bytes;
    let frames = u64::from(shape.frames).div_ceil(per_page) * per_page;
    (frames / 2 <= u64::from(shape.ring_entries)).then_some(Shape {
        frames: u32::try_from(frames).ok()?,
        ..shape
    })
}

/// [`prepare`] on huge pages (`huge`) or ordinary ones.
fn prepare_on(shape: Shape, huge: bool) -> io::Result<Unbound> {
    let geometry = Geometry {
        frames: shape.frames,
        frame_bytes: shape.frame_bytes,
        ring_entries: shape.ring_entries,
        queue: 0,
        ifindex: 0,
    };
    // Checked as the user will check it.
    Geometry::from_bytes(&geometry.to_bytes())?;
    let umem_bytes = geometry.umem_bytes();
    let flags = libc::MFD_CLOEXEC | if huge { libc::MFD_HUGETLB } else { 0 };
    // SAFETY: a constant NUL-terminated name; the result is checked.
    let memfd = unsafe { libc::memfd_create(c"netgap-umem".as_ptr(), flags) };
    if memfd < 0 {
        return Err(last_error("making the UMEM's memfd"));
    }
    // SAFETY: a new descriptor nothing else owns.
    let umem = unsafe { OwnedFd::from_raw_fd(memfd) };
    let len = libc::off_t::try_from(umem_bytes).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: resizes the memfd made above.
    if unsafe { libc::ftruncate(umem.as_raw_fd(), len) } != 0 {
        return Err(last_error("sizing the UMEM's memfd"));
    }
    // SAFETY: AF_XDP's socket call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_error("making the AF_XDP socket"));
    }
    // SAFETY: a new descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    register_umem(socket.as_raw_fd(), &umem, &geometry)?;
    let entries = shape.ring_entries;
    for (opt, what) in [
        (libc::XDP_UMEM_FILL_RING, "sizing the fill ring"),
        (libc::XDP_UMEM_COMPLETION_RING, "sizing the completion ring"),
        (libc::XDP_RX_RING, "sizing the RX ring"),
        (libc::XDP_TX_RING, "sizing the TX ring"),
    ] {
        set_xdp_opt(socket.as_raw_fd(), opt, &entries, what)?;
    }
    Ok(Unbound {
        socket,
        umem,
        shape,
        huge_pages: huge,
    })
}

impl Unbound {
    /// Binds the socket to `queue` of interface `ifindex` in this thread's
    /// namespace: the port, ready to hand over. On an error (`EBUSY`: the
    /// queue's last socket is still being freed by the kernel) the socket
    /// stays unbound and comes back with it, to be bound again.
    #[allow(
        clippy::result_large_err,
        reason = "the unbound port comes back whole, to be bound again"
    )]
    pub fn bind(self, ifindex: u32, queue: u32) -> Result<HandedPort, (Unbound, io::Error)> {
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: XDP_COPY | XDP_USE_NEED_WAKEUP,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `addr` is a live `sockaddr_xdp` of the length given.
        let rc = unsafe {
            libc::bind(
                self.socket.as_raw_fd(),
                ptr::from_ref(&addr).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            let e = last_error(&format!("binding the AF_XDP socket to queue {queue}"));
            return Err((self, e));
        }
        Ok(HandedPort {
            socket: self.socket,
            umem: self.umem,
            geometry: Geometry {
                frames: self.shape.frames,
                frame_bytes: self.shape.frame_bytes,
                ring_entries: self.shape.ring_entries,
                queue,
                ifindex,
            },
        })
    }

    /// The socket, for its identity (tests, logs).
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// The UMEM's memfd, for its identity.
    pub fn umem(&self) -> BorrowedFd<'_> {
        self.umem.as_fd()
    }

    /// Whether the UMEM is on huge pages.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }
}

/// Registers the memfd's pages as the socket's UMEM. The kernel pins them
/// for the socket's life, so the maker's own mapping is only needed for
/// the call.
fn register_umem(socket: RawFd, umem: &OwnedFd, g: &Geometry) -> io::Result<()> {
    let len = usize::try_from(g.umem_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a shared mapping of the memfd, sized above; checked.
    let area = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            umem.as_raw_fd(),
            0,
        )
    };
    if area == libc::MAP_FAILED {
        return Err(last_error("mapping the UMEM"));
    }
    let reg = libc::xdp_umem_reg {
        addr: area as u64,
        len: len as u64,
        chunk_size: g.frame_bytes,
        headroom: 0,
        flags: 0,
        tx_metadata_len: 0,
    };
    let registered = set_xdp_opt(socket, libc::XDP_UMEM_REG, &reg, "registering the UMEM");
    // SAFETY: the mapping made above, used by nothing after the call (the
    // kernel holds the pages it pinned, not the mapping).
    unsafe { libc::munmap(area, len) };
    registered
}

/// Hands `port` over `stream`: its geometry, and its two descriptors as
/// `SCM_RIGHTS`. The maker's copies close when `port` drops at the end.
pub fn send(stream: &UnixStream, port: HandedPort) -> io::Result<()> {
    send_after(stream.as_fd(), &[], port)
}

/// Hands `port` over `socket` in one message: `head` (a record of the
/// caller's, such as a relay's grant) then the port's geometry, with its
/// two descriptors as `SCM_RIGHTS`. On a `SOCK_SEQPACKET` socket the
/// message is one datagram, so the record and the port arrive together or
/// not at all. The maker's copies close when `port` drops at the end.
pub fn send_after(socket: BorrowedFd<'_>, head: &[u8], port: HandedPort) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let bytes = port.geometry.to_bytes();
    let iov = [io::IoSlice::new(head), io::IoSlice::new(&bytes)];
    let fds = [port.socket.as_raw_fd(), port.umem.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("handing the port over: {e}"),
        )
    })?;
    if sent != head.len() + bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "handing the port over: a short send",
        ));
    }
    Ok(())
}

/// Takes a port handed over `stream` ([`send`]): its geometry, checked,
/// and its two descriptors, close-on-exec.
pub fn receive(stream: &UnixStream) -> io::Result<HandedPort> {
    receive_after(stream.as_fd(), &mut [])
}

/// Takes what [`send_after`] sent over `socket`: `head.len()` bytes of the
/// caller's record into `head`, then the port (its geometry, checked, and
/// its two descriptors, close-on-exec). A message of any other length, or
/// without both descriptors, is refused (its descriptors closed).
pub fn receive_after(socket: BorrowedFd<'_>, head: &mut [u8]) -> io::Result<HandedPort> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut bytes = [0u8; GEOMETRY_BYTES];
    let mut iov = [io::IoSliceMut::new(head), io::IoSliceMut::new(&mut bytes)];
    let head_bytes = iov[0].len();
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("taking a handed port: {e}"),
        )
    })?;
    let got = msg.bytes;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(rights) = c {
            // SAFETY: descriptors the kernel just installed in this
            // process for this message; nothing else owns them.
            fds.extend(
                rights
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let truncated = msg
        .flags
        .intersects(MsgFlags::MSG_CTRUNC | MsgFlags::MSG_TRUNC);
    let body = got.saturating_sub(head_bytes).min(GEOMETRY_BYTES);
    if got < head_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a handed port came without its record",
        ));
    }
    let geometry = Geometry::from_bytes(&bytes[..body])?;
    let (Ok([socket, umem]), false) = (<[OwnedFd; 2]>::try_from(fds), truncated) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a handed port came without its socket and UMEM",
        ));
    };
    Ok(HandedPort {
        socket,
        umem,
        geometry,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_geometry_round_trips_and_a_bad_one_is_refused() {
        let g = Geometry {
            frames: 256,
            frame_bytes: 4096,
            ring_entries: 128,
            queue: 3,
            ifindex: 9,
        };
        assert_eq!(Geometry::from_bytes(&g.to_bytes()).unwrap(), g);
        for bad in [
            Geometry { frames: 255, ..g },
            Geometry {
                frame_bytes: 1000,
                ..g
            },
            Geometry {
                ring_entries: 0,
                ..g
            },
            Geometry {
                frames: 1 << 20,
                ..g
            },
            Geometry {
                ring_entries: 512,
                ..g
            },
        ] {
            assert!(Geometry::from_bytes(&bad.to_bytes()).is_err(), "{bad:?}");
        }
        assert!(Geometry::from_bytes(&g.to_bytes()[..19]).is_err());
    }

    #[test]
    fn a_record_and_a_port_go_in_one_datagram() {
        use std::os::unix::net::UnixDatagram;
        let g = Geometry {
            frames: 64,
            frame_bytes: 4096,
            ring_entries: 32,
            queue: 2,
            ifindex: 1,
        };
        let (a, b) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (x, y) = UnixDatagram::pair().unwrap();
        let port = HandedPort {
            socket: OwnedFd::from(x),
            umem: OwnedFd::from(y),
            geometry: g,
        };
        send_after(a.as_fd(), b"grant", port).unwrap();
        let mut head = [0u8; 5];
        let got = receive_after(b.as_fd(), &mut head).unwrap();
        assert_eq!(&head, b"grant");
        assert_eq!(got.geometry, g);
        // A record of another length than the receiver expects is
        // refused, not read as a port.
        let (x, y) = UnixDatagram::pair().unwrap();
        let port = HandedPort {
            socket: OwnedFd::from(x),
            umem: OwnedFd::from(y),
            geometry: g,
        };
        send_after(a.as_fd(), b"grant!", port).unwrap();
        assert!(receive_after(b.as_fd(), &mut head).is_err());
    }

    /// The filesystem type of the file `fd` is open on.
    fn fs_type(fd: BorrowedFd<'_>) -> i64 {
        // SAFETY: all-zero bytes are a valid statfs; `fd` is live.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) }, 0);
        st.f_type
    }

    #[test]
    fn on_huge_pages_a_port_takes_its_last_pages_frames_while_its_rings_hold_them() {
        const PAGE: u64 = 2 << 20;
        let shape = |frames, frame_bytes, ring_entries| Shape {
            frames,
            frame_bytes,
            ring_entries,
        };
        // A direct port at a 1500-byte MTU: 1 MiB asked, 2 MiB taken.
        assert_eq!(
            on_whole_pages(shape(512, 2048, 512), PAGE),
            Some(shape(1024, 2048, 512))
        );
        // Already whole: unchanged.
        assert_eq!(
            on_whole_pages(shape(512, 4096, 512), PAGE),
            Some(shape(512, 4096, 512))
        );
        assert_eq!(
            on_whole_pages(shape(1024, 2048, 512), PAGE),
            Some(shape(1024, 2048, 512))
        );
        // Rings too small for a page's receive frames, or frames that do
        // not divide a page: ordinary pages.
        assert_eq!(on_whole_pages(shape(64, 2048, 32), PAGE), None);
        assert_eq!(on_whole_pages(shape(512, 3000, 512), PAGE), None);
        assert_eq!(on_whole_pages(shape(512, 0, 512), PAGE), None);
    }

    /// A UMEM goes on huge pages while the system has them free, and on
    /// ordinary pages otherwise (none free, or a size that is no whole
    /// number of them); the memfd maps and holds bytes either way.
    #[test]
    fn a_umem_is_on_huge_pages_while_the_system_has_them_free_else_on_ordinary_ones() {
        const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
        const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: AF_XDP sockets need root");
            return;
        }
        let maps_and_holds = |u: &Unbound, bytes: usize| {
            // SAFETY: a shared mapping of the memfd, its whole size; checked.
            let area = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    u.umem().as_raw_fd(),
                    0,
                )
            };
            assert_ne!(area, libc::MAP_FAILED, "the UMEM maps");
            // SAFETY: `area` is `bytes` long and writable.
            unsafe {
                area.cast::<u8>().add(bytes - 1).write(0x5a);
                assert_eq!(area.cast::<u8>().add(bytes - 1).read(), 0x5a);
                libc::munmap(area, bytes);
            }
        };
        // 128 KiB, whose rings cannot take a whole 2 MiB page's frames.
        let small = Shape {
            frames: 64,
            frame_bytes: 2048,
            ring_entries: 32,
        };
        let u = prepare(small).unwrap();
        assert!(!u.huge_pages());
        assert_ne!(fs_type(u.umem()), HUGETLBFS_MAGIC);
        maps_and_holds(&u, 64 * 2048);
        // 2 MiB, with two huge pages reserved for the test and given back.
        let before = std::fs::read_to_string(NR_HUGEPAGES).unwrap();
        let n: u64 = before.trim().parse().unwrap();
        std::fs::write(NR_HUGEPAGES, format!("{}", n + 2)).unwrap();
        let reserved: u64 = std::fs::read_to_string(NR_HUGEPAGES)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // 1 MiB asked, the whole 2 MiB page's frames taken.
        let shape = Shape {
            frames: 512,
            frame_bytes: 2048,
            ring_entries: 512,
        };
        let huge = (reserved > n).then(|| prepare(shape).unwrap());
        std::fs::write(NR_HUGEPAGES, before.trim()).unwrap();
        match huge {
            Some(u) => {
                assert!(u.huge_pages(), "a huge page was free");
                assert_eq!(fs_type(u.umem()), HUGETLBFS_MAGIC);
                assert_eq!(u.shape.frames, 1024);
                maps_and_holds(&u, 2 << 20);
            }
            None => eprintln!("skipped the huge pages' half: the system reserved none"),
        }
    }

    #[cfg(feature = "xdp")]
    fn sh(args: &[&str]) {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }

    #[cfg(feature = "xdp")]
    fn random_u32() -> io::Result<u32> {
        let mut b = [0u8; 4];
        crate::random::fill_random(&mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    /// The claim of the handover: the flow engine (sessions, reliable
    /// delivery) runs unchanged on a port whose socket and UMEM another
    /// process made, here the queue-0 port of each end of a veth pair,
    /// handed over a Unix socket: a flow opens and carries a message each
    /// way, checked.
    // The maker's steering is libbpf's.
    #[cfg(feature = "xdp")]
    #[test]
    fn the_flow_engine_runs_on_handed_ports() {
        use super::super::flow::{Peer, Port, PortIo, PortKey, Shared, XdpFlow};
        use super::super::reliable::{ETH_HEADER_BYTES, FRAME_OVERHEAD_BYTES};
        use super::super::sys::{Steering, Xsk};
        use crate::Flow;
        use netgap_core::spec::Mode;
        use std::time::{Duration, Instant};
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: AF_XDP sockets and XDP programs need root");
            return;
        }
        std::thread::spawn(|| {
            // SAFETY: unshare of the calling thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!("skipped: no network namespace");
                return;
            }
            sh(&[
                "link", "add", "ngha", "type", "veth", "peer", "name", "nghb",
            ]);
            sh(&["link", "set", "ngha", "up"]);
            sh(&["link", "set", "nghb", "up"]);
            let shape = Shape {
                frames: super::super::FRAMES,
                frame_bytes: super::super::FRAME_BYTES,
                ring_entries: super::super::RING_ENTRIES,
            };
            let mss = 1500 + ETH_HEADER_BYTES - FRAME_OVERHEAD_BYTES;
            let macs = [[0x02, 0, 0, 0, 0, 0xa1], [0x02, 0, 0, 0, 0, 0xb1]];
            let mut ports = Vec::new();
            let mut steerings = Vec::new();
            for (dev, mac) in ["ngha", "nghb"].into_iter().zip(macs) {
                let steering = Steering::attach(dev, 1).unwrap();
                let name = std::ffi::CString::new(dev).unwrap();
                // SAFETY: a NUL-terminated name alive for the call.
                let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
                let made = make(ifindex, 0, shape).unwrap();
                steering.put_socket(0, made.socket.as_raw_fd()).unwrap();
                let (maker, user) = UnixStream::pair().unwrap();
                send(&maker, made).unwrap();
                let handed = receive(&user).unwrap();
                let key = PortKey::here(dev).unwrap();
                let port = Port::get(
                    key,
                    || {
                        let xsk = Xsk::from_handed(handed)?;
                        Ok((
                            PortIo::new(xsk, shape.frames, mac)?,
                            mss,
                            super::super::WINDOW_BYTES,
                        ))
                    },
                    random_u32,
                )
                .unwrap();
                ports.push(port);
                steerings.push(steering);
            }
            let listener = ports[0].listen().unwrap();
            let client = ports[1]
                .open_session(Peer {
                    mac: macs[0],
                    flow: listener,
                })
                .unwrap();
            let t0 = Instant::now();
            let mut last_syn = Instant::now();
            let accepted = loop {
                ports[0].pump().unwrap();
                ports[1].pump().unwrap();
                if let Some(id) = ports[0].accept(listener) {
                    if ports[1].connected(client) {
                        break id;
                    }
                }
                assert!(t0.elapsed() < Duration::from_secs(3), "no flow opened");
                if last_syn.elapsed() >= Duration::from_millis(50) {
                    ports[1].syn_again(client).unwrap();
                    last_syn = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            let timeout = Duration::from_secs(5);
            let mut server =
                XdpFlow::new(Shared::new(ports[0].clone(), accepted, Mode::Poll, timeout).unwrap());
            let mut client_flow =
                XdpFlow::new(Shared::new(ports[1].clone(), client, Mode::Poll, timeout).unwrap());
            let message: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
            let echo = std::thread::spawn(move || {
                let mut got = vec![0u8; 10_000];
                server.recv_exact(&mut got).unwrap();
                server.send_all(&got).unwrap();
                server
            });
            client_flow.send_all(&message).unwrap();
            let mut back = vec![0u8; message.len()];
            client_flow.recv_exact(&mut back).unwrap();
            assert_eq!(back, message, "the message came back whole");
            let server = echo.join().unwrap();
            drop((server, client_flow));
        })
        .join()
        .unwrap();
    }
}
