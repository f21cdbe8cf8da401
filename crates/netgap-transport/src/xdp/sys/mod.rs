//! One AF_XDP socket with its own UMEM: the registered memory (an
//! anonymous mapping cut into frames), its fill and completion rings, the
//! socket's RX and TX rings, and the XDP program that steers netgap's
//! frames to it ([`super::steer`]). With the `xdp` feature, through libxdp
//! and libbpf: libxdp makes the UMEM and the socket but is told not to
//! load its default program, which would redirect every frame of the
//! socket's queue, the host's IP traffic included; the socket goes into an
//! `XSKMAP` of its own, and netgap's program, loaded with that map, is
//! attached to the interface through a BPF link, so it goes when the
//! socket does, or when the process dies. A socket another process made
//! and handed over (`handed.rs`) needs neither library, so the user side
//! alone (the `xdp-user` feature) links none: the ring operations are
//! Rust's (`ring.rs`), on the layout libxdp uses.

#[cfg(feature = "xdp")]
use std::collections::BTreeSet;
use std::ffi::c_void;
#[cfg(feature = "xdp")]
use std::ffi::{c_char, c_int, CString};
use std::io;
use std::os::fd::RawFd;
use std::ptr;
#[cfg(feature = "xdp")]
use std::sync::{Arc, Mutex};

mod handed;
mod ring;
#[cfg(feature = "xdp")]
mod steering;

use handed::HandedMaps;
#[cfg(feature = "xdp")]
pub use steering::{Registration, Steering};

/// Where the steering program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attach {
    /// The driver's hook (native XDP).
    #[cfg_attr(
        not(feature = "xdp"),
        allow(dead_code, reason = "only a program this process attaches is native")
    )]
    Native,
    /// The generic hook (SKB mode).
    Generic,
}

impl Attach {
    /// The name a record gives it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Attach::Native => "native",
            Attach::Generic => "generic",
        }
    }
}

/// Serialises making and deleting sockets in this process, so the BPF
/// descriptors that appear while one is made are that socket's.
#[cfg(feature = "xdp")]
static LIFECYCLE: Mutex<()> = Mutex::new(());

/// The process's open descriptors of BPF programs and maps.
#[cfg(feature = "xdp")]
fn bpf_fds() -> BTreeSet<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return BTreeSet::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
            is_bpf_fd(fd).then_some(fd)
        })
        .collect()
}

#[cfg(feature = "xdp")]
fn is_bpf_fd(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|t| t.to_string_lossy().starts_with("anon_inode:bpf"))
}

/// A libxdp producer or consumer ring (`struct xsk_ring_prod` /
/// `xsk_ring_cons`, which share one layout).
#[repr(C)]
struct Ring {
    cached_prod: u32,
    cached_cons: u32,
    mask: u32,
    size: u32,
    producer: *mut u32,
    consumer: *mut u32,
    ring: *mut c_void,
    flags: *mut u32,
}

impl Ring {
    fn empty() -> Box<Ring> {
        Box::new(Ring {
            cached_prod: 0,
            cached_cons: 0,
            mask: 0,
            size: 0,
            producer: ptr::null_mut(),
            consumer: ptr::null_mut(),
            ring: ptr::null_mut(),
            flags: ptr::null_mut(),
        })
    }
}

/// `struct xsk_umem_config`.
#[cfg(feature = "xdp")]
#[repr(C)]
struct UmemConfig {
    fill_size: u32,
    comp_size: u32,
    frame_size: u32,
    frame_headroom: u32,
    flags: u32,
}

/// `struct xsk_socket_config`.
#[cfg(feature = "xdp")]
#[repr(C)]
struct SocketConfig {
    rx_size: u32,
    tx_size: u32,
    libxdp_flags: u32,
    xdp_flags: u32,
    bind_flags: u16,
}

/// `struct xdp_desc`.
#[repr(C)]
struct XdpDesc {
    addr: u64,
    len: u32,
    options: u32,
}

/// `struct xsk_umem`, opaque.
#[cfg(feature = "xdp")]
#[repr(C)]
struct XskUmem {
    _private: [u8; 0],
}

/// `struct xsk_socket`, opaque.
#[cfg(feature = "xdp")]
#[repr(C)]
struct XskSocket {
    _private: [u8; 0],
}

#[cfg(feature = "xdp")]
extern "C" {
    fn xsk_umem__create(
        umem: *mut *mut XskUmem,
        area: *mut c_void,
        size: u64,
        fill: *mut Ring,
        comp: *mut Ring,
        config: *const UmemConfig,
    ) -> c_int;
    fn xsk_socket__create(
        xsk: *mut *mut XskSocket,
        ifname: *const c_char,
        queue_id: u32,
        umem: *mut XskUmem,
        rx: *mut Ring,
        tx: *mut Ring,
        config: *const SocketConfig,
    ) -> c_int;
    fn xsk_umem__delete(umem: *mut XskUmem) -> c_int;
    fn xsk_socket__delete(xsk: *mut XskSocket);
    fn xsk_socket__fd(xsk: *const XskSocket) -> c_int;
    fn netgap_xdp_quiet();
}

/// `XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD`: libxdp binds the socket and
/// loads no program; the caller steers frames to it.
#[cfg(feature = "xdp")]
const XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD: u32 = 1;

/// `XDP_COPY`: frames are copied between the driver's buffers and the UMEM.
#[cfg(feature = "xdp")]
const XDP_COPY: u16 = 1 << 1;
/// `XDP_USE_NEED_WAKEUP`: the kernel says when a TX kick or a fill-ring
/// wake-up is needed.
#[cfg(feature = "xdp")]
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;

/// The shape of a port's UMEM and rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Frames of the UMEM (a power of two).
    pub frames: u32,
    /// Bytes of each frame (a power of two, 2048 or 4096).
    pub frame_bytes: u32,
    /// Entries of each of the four rings (a power of two).
    pub ring_entries: u32,
}

/// One AF_XDP socket bound to one queue of one interface, with its own
/// UMEM and four rings, and the program that steers netgap's frames to it.
pub(crate) struct Xsk {
    area: *mut u8,
    area_bytes: usize,
    fill: Box<Ring>,
    comp: Box<Ring>,
    rx: Box<Ring>,
    tx: Box<Ring>,
    fd: RawFd,
    frame_bytes: u32,
    /// What libxdp and the steering made for a socket made in this
    /// process (`None` for a handed one, and while being made), deleted
    /// with it before the rings and the UMEM go. Behind a trait object, so
    /// that a port over a handed socket reaches none of libxdp's and
    /// libbpf's code: a program that only maps handed sockets (the preload
    /// library) links neither, even from a build whose features unified
    /// `xdp` into this crate.
    made: Option<Box<dyn MadeHere>>,
    /// The BPF descriptors libxdp opened for this socket (not the
    /// steering's own). libxdp 1.3 leaves some open after deleting the
    /// socket; they are closed then, or a long-lived agent would run out
    /// of descriptors after some hundreds of flows.
    #[cfg(feature = "xdp")]
    bpf_fds: BTreeSet<RawFd>,
    /// Whether dropping takes [`LIFECYCLE`]: not while `open` holds it.
    #[cfg(feature = "xdp")]
    lock_on_drop: bool,
    /// A handed-over socket's own descriptor and the rings this process
    /// mapped from it (`None` for a socket libxdp made here).
    handed: Option<HandedMaps>,
}

// SAFETY: the socket, the UMEM and the rings belong to this value alone and
// are used only through `&mut self` (the flow serialises every use behind
// a mutex); nothing in them is tied to the thread that made them.
unsafe impl Send for Xsk {}

/// What a socket made in this process holds of libxdp's and of the
/// steering's; dropping it deletes libxdp's socket and UMEM, the
/// steering's hold on the interface first.
trait MadeHere {
    /// The netgap frames the steering dropped on the interface's other
    /// queues (0 when it does not say).
    fn steered_drops(&self) -> u64;

    /// Where the steering program is attached.
    fn attach(&self) -> Attach;

    /// Whether BPF descriptor `fd` is the steering's own.
    #[cfg(feature = "xdp")]
    fn owns(&self, fd: RawFd) -> bool;
}

/// libxdp's socket and UMEM made here, and the steering holding the
/// program that takes their frames.
#[cfg(feature = "xdp")]
struct Made {
    umem: *mut XskUmem,
    socket: *mut XskSocket,
    /// The steering program of the interface, attached (None only while
    /// being made): the process's one program there, shared with the
    /// sockets it makes for others on other queues.
    steering: Option<Arc<Steering>>,
}

#[cfg(feature = "xdp")]
impl MadeHere for Made {
    fn steered_drops(&self) -> u64 {
        self.steering
            .as_ref()
            .and_then(|s| s.drops().ok())
            .unwrap_or(0)
    }

    fn attach(&self) -> Attach {
        self.steering
            .as_ref()
            .map_or(Attach::Generic, |s| s.attach_mode())
    }

    fn owns(&self, fd: RawFd) -> bool {
        self.steering.as_ref().is_some_and(|s| s.owns(fd))
    }
}

#[cfg(feature = "xdp")]
impl Drop for Made {
    fn drop(&mut self) {
        // The program goes first, so no frame is steered to a socket on
        // its way out.
        drop(self.steering.take());
        // SAFETY: each pointer is either null (not created) or was created
        // by libxdp in `Xsk::create` and is deleted once, socket before
        // UMEM, while the rings and the memory they use still stand (the
        // `Xsk` drops this first).
        unsafe {
            if !self.socket.is_null() {
                xsk_socket__delete(self.socket);
            }
            if !self.umem.is_null() {
                xsk_umem__delete(self.umem);
            }
        }
    }
}

impl Xsk {
    /// Opens a socket on queue `queue` of `ifname` with a UMEM of `shape`,
    /// in copy mode, and attaches the program that steers netgap's frames
    /// to it (native XDP where the driver has it, else generic).
    #[cfg(feature = "xdp")]
    pub(crate) fn open(ifname: &str, queue: u32, shape: Shape) -> io::Result<Xsk> {
        let name = CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
        let _serial = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
        let before = bpf_fds();
        match Xsk::create(&name, queue, shape) {
            Ok(mut x) => {
                let made = x.made.as_ref();
                x.bpf_fds = bpf_fds()
                    .difference(&before)
                    .copied()
                    .filter(|&fd| !made.is_some_and(|m| m.owns(fd)))
                    .collect();
                x.lock_on_drop = true;
                Ok(x)
            }
            Err(e) => {
                // What a failed attempt left open is libxdp's leftover too
                // (the steering's own descriptors closed with it).
                for fd in bpf_fds().difference(&before) {
                    // SAFETY: a BPF descriptor opened during the failed
                    // attempt, under the lock: nothing else owns it.
                    unsafe { libc::close(*fd) };
                }
                Err(e)
            }
        }
    }

    /// A port over the UMEM mapped at `area` (`area_bytes` long, frames of
    /// `frame_bytes`) and socket `fd` (-1: not made yet), its rings not
    /// mapped yet, no program, nothing libxdp made: its Drop unmaps `area`
    /// and whatever the maker adds before a failure.
    fn unmapped(area: *mut u8, area_bytes: usize, fd: RawFd, frame_bytes: u32) -> Xsk {
        Xsk {
            area,
            area_bytes,
            fill: Ring::empty(),
            comp: Ring::empty(),
            rx: Ring::empty(),
            tx: Ring::empty(),
            fd,
            frame_bytes,
            made: None,
            #[cfg(feature = "xdp")]
            bpf_fds: BTreeSet::new(),
            #[cfg(feature = "xdp")]
            lock_on_drop: false,
            handed: None,
        }
    }

    /// Makes the UMEM, the socket and its steering; the caller holds
    /// [`LIFECYCLE`] (a half-made value dropped on failure does not take it
    /// again).
    #[cfg(feature = "xdp")]
    fn create(name: &CString, queue: u32, shape: Shape) -> io::Result<Xsk> {
        let area_bytes = shape.frames as usize * shape.frame_bytes as usize;
        // SAFETY: quietens libxdp's and libbpf's printing; the calls only
        // swap a function pointer in each library.
        unsafe { netgap_xdp_quiet() };
        // SAFETY: an anonymous private mapping of `area_bytes`, no address
        // hint; the result is checked before use.
        let area = unsafe {
            libc::mmap(
                ptr::null_mut(),
                area_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if area == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut x = Xsk::unmapped(area.cast::<u8>(), area_bytes, -1, shape.frame_bytes);
        // Dropped before `x` on a failure: what libxdp made goes before
        // the rings and the memory it uses.
        let mut made = Made {
            umem: ptr::null_mut(),
            socket: ptr::null_mut(),
            steering: None,
        };
        let ucfg = UmemConfig {
            fill_size: shape.ring_entries,
            comp_size: shape.ring_entries,
            frame_size: shape.frame_bytes,
            frame_headroom: 0,
            flags: 0,
        };
        // SAFETY: `area` is a live mapping of `area_bytes` that outlives the
        // UMEM (unmapped in Drop after the UMEM is deleted); the rings are
        // boxed, so the addresses libxdp keeps stay valid as long as `x`.
        let rc = unsafe {
            xsk_umem__create(
                &mut made.umem,
                area,
                area_bytes as u64,
                &mut *x.fill,
                &mut *x.comp,
                &ucfg,
            )
        };
        if rc != 0 {
            let e = io::Error::from_raw_os_error(-rc);
            return Err(io::Error::new(e.kind(), format!("making the UMEM: {e}")));
        }
        let scfg = SocketConfig {
            rx_size: shape.ring_entries,
            tx_size: shape.ring_entries,
            // libxdp's own program would steer every frame of the queue
            // here; `steer` attaches one that takes only netgap's.
            libxdp_flags: XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD,
            xdp_flags: 0,
            bind_flags: XDP_COPY | XDP_USE_NEED_WAKEUP,
        };
        // SAFETY: `name` is a NUL-terminated string alive for the call; the
        // UMEM was created above; the rings are boxed and live as long as
        // `x`, which deletes the socket before anything else.
        let rc = unsafe {
            xsk_socket__create(
                &mut made.socket,
                name.as_ptr(),
                queue,
                made.umem,
                &mut *x.rx,
                &mut *x.tx,
                &scfg,
            )
        };
        if rc != 0 {
            let e = io::Error::from_raw_os_error(-rc);
            return Err(io::Error::new(
                e.kind(),
                format!("binding the AF_XDP socket: {e}"),
            ));
        }
        // SAFETY: the socket was created above and is live.
        x.fd = unsafe { xsk_socket__fd(made.socket) };
        let steering = Steering::shared_serialized(&name.to_string_lossy())?;
        steering.put_socket(queue, x.fd)?;
        made.steering = Some(steering);
        x.made = Some(Box::new(made));
        Ok(x)
    }

    /// The socket's descriptor, to poll and to kick.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd
    }

    /// Frames the kernel dropped on their way to this socket since it
    /// opened (no buffer on the fill ring, or the receive ring full), and
    /// the netgap frames the steering program this port attached dropped
    /// on the interface's other queues, where no connection of theirs is
    /// registered (on a link of several queues a forged or stray frame
    /// may arrive on any); `None` when the kernel does not say.
    pub(crate) fn kernel_drops(&self) -> Option<u64> {
        // `struct xdp_statistics` of linux/if_xdp.h: rx_dropped,
        // rx_invalid_descs, tx_invalid_descs, rx_ring_full, then two
        // counters of the fill and TX rings being empty. A kernel older
        // than the ring-full counter writes fewer bytes.
        const XDP_STATISTICS: libc::c_int = 7;
        let mut st = [0u64; 6];
        let mut len = std::mem::size_of_val(&st) as libc::socklen_t;
        // SAFETY: `st` is valid for writes of `len` bytes, and the kernel
        // writes at most `len` of them.
        let rc = unsafe {
            libc::getsockopt(
                self.fd,
                libc::SOL_XDP,
                XDP_STATISTICS,
                st.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return None;
        }
        let ring_full = if len as usize >= 4 * 8 { st[3] } else { 0 };
        // A handed socket has no steering here: its maker's counts.
        let steered = self.made.as_ref().map_or(0, |m| m.steered_drops());
        Some(st[0].saturating_add(ring_full).saturating_add(steered))
    }

    /// Where the program that steers frames to it is attached.
    pub(crate) fn attach(&self) -> Attach {
        self.made.as_ref().map_or(Attach::Generic, |m| m.attach())
    }

    /// The UMEM bytes of frame `slot` (a whole frame).
    pub(crate) fn frame_mut(&mut self, slot: u32) -> &mut [u8] {
        let start = slot as usize * self.frame_bytes as usize;
        assert!(start + self.frame_bytes as usize <= self.area_bytes);
        // SAFETY: the range lies inside the mapping (checked above), which
        // lives as long as `self`; `&mut self` makes the borrow unique on
        // this side. The kernel writes a frame only while it owns it (after
        // `fill`, until it comes back through `rx`), and the flow never
        // touches a frame it has handed over.
        unsafe { std::slice::from_raw_parts_mut(self.area.add(start), self.frame_bytes as usize) }
    }

    /// The received bytes at UMEM address `addr`, `len` long, if they lie
    /// inside the UMEM.
    fn received(&self, addr: u64, len: u32) -> Option<&[u8]> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len as usize)?;
        if end > self.area_bytes {
            return None;
        }
        // SAFETY: the range lies inside the mapping (checked above), which
        // lives as long as `self`; the kernel handed this frame to us
        // through the RX ring and does not write it until it is filled
        // again.
        Some(unsafe { std::slice::from_raw_parts(self.area.add(start), len as usize) })
    }

    /// Hands frames `slots` to the kernel for receiving; returns how many
    /// went (all or none).
    pub(crate) fn fill(&mut self, slots: &[u32]) -> usize {
        let Ok(n) = u32::try_from(slots.len()) else {
            return 0;
        };
        if n == 0 {
            return 0;
        }
        let mut idx = 0u32;
        // SAFETY: the fill ring is live (created with the UMEM); `idx` is a
        // live local.
        if unsafe { self.fill.reserve(n, &mut idx) } != n {
            return 0;
        }
        for (i, &slot) in slots.iter().enumerate() {
            let addr = u64::from(slot) * u64::from(self.frame_bytes);
            // SAFETY: `idx + i` is one of the entries reserved above; the
            // returned pointer is into the ring's mapping.
            unsafe { *self.fill.fill_addr(idx.wrapping_add(i as u32)) = addr };
        }
        // SAFETY: submits exactly the entries reserved and written above.
        unsafe { self.fill.submit(n) };
        slots.len()
    }

    /// Takes up to `max` received frames, calling `f(bytes)` for each
    /// (bytes checked to lie in the frame), then gives the entries back to
    /// the ring. Puts their slots, to be filled again, in `slots` (cleared
    /// first: the caller keeps one vector, so the hot path allocates
    /// nothing).
    pub(crate) fn receive(&mut self, max: u32, slots: &mut Vec<u32>, mut f: impl FnMut(&[u8])) {
        slots.clear();
        let mut idx = 0u32;
        // SAFETY: the RX ring is live; `idx` is a live local.
        let n = unsafe { self.rx.peek(max, &mut idx) };
        for i in 0..n {
            // SAFETY: `idx + i` is one of the `n` entries peeked above.
            let d = unsafe { &*self.rx.rx_desc(idx.wrapping_add(i)) };
            // In copy mode an address is a frame's start plus headroom.
            let slot = d.addr / u64::from(self.frame_bytes);
            if let Some(bytes) = self.received(d.addr, d.len) {
                f(bytes);
            }
            if let Ok(slot) = u32::try_from(slot) {
                slots.push(slot);
            }
        }
        if n > 0 {
            // SAFETY: releases exactly the entries peeked above.
            unsafe { self.rx.release(n) };
        }
    }

    /// Whether a received frame or a completed transmission waits on its
    /// ring: two loads, no system call.
    pub(crate) fn anything_arrived(&mut self) -> bool {
        // SAFETY: the RX and completion rings are live for `self`'s life.
        unsafe { self.rx.ready() || self.comp.ready() }
    }

    /// Takes up to `max` completed transmissions into `slots` (cleared
    /// first): the slots whose frames the kernel has sent and no longer
    /// reads.
    pub(crate) fn completed(&mut self, max: u32, slots: &mut Vec<u32>) {
        slots.clear();
        let mut idx = 0u32;
        // SAFETY: the completion ring is live; `idx` is a live local.
        let n = unsafe { self.comp.peek(max, &mut idx) };
        for i in 0..n {
            // SAFETY: `idx + i` is one of the `n` entries peeked above.
            let addr = unsafe { *self.comp.comp_addr(idx.wrapping_add(i)) };
            if let Ok(slot) = u32::try_from(addr / u64::from(self.frame_bytes)) {
                slots.push(slot);
            }
        }
        if n > 0 {
            // SAFETY: releases exactly the entries peeked above.
            unsafe { self.comp.release(n) };
        }
    }

    /// Queues frame `slot`'s first `len` bytes for sending; `false` when
    /// the TX ring is full.
    pub(crate) fn queue_tx(&mut self, slot: u32, len: u32) -> bool {
        let mut idx = 0u32;
        // SAFETY: the TX ring is live; `idx` is a live local.
        if unsafe { self.tx.reserve(1, &mut idx) } != 1 {
            return false;
        }
        // SAFETY: `idx` is the entry reserved above; the pointer is into
        // the ring's mapping.
        unsafe {
            let d = &mut *self.tx.tx_desc(idx);
            d.addr = u64::from(slot) * u64::from(self.frame_bytes);
            d.len = len;
            d.options = 0;
            self.tx.submit(1);
        }
        true
    }

    /// Rings the doorbell: tells the kernel the TX ring has frames (in
    /// copy mode the kernel sends them during this call).
    pub(crate) fn kick(&mut self) -> io::Result<()> {
        if !self.tx_needs_wakeup() {
            return Ok(());
        }
        ring_doorbell(self.fd)
    }

    /// Whether the kernel wants the doorbell to take the TX ring's frames.
    pub(crate) fn tx_needs_wakeup(&self) -> bool {
        // SAFETY: the TX ring is live.
        unsafe { self.tx.needs_wakeup() }
    }

    /// Whether the kernel wants a wake-up to take the fill ring's frames.
    pub(crate) fn fill_needs_wakeup(&self) -> bool {
        // SAFETY: the fill ring is live.
        unsafe { self.fill.needs_wakeup() }
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        #[cfg(feature = "xdp")]
        let _serial = self
            .lock_on_drop
            .then(|| LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner()));
        // libxdp's socket and UMEM go before the memory they use.
        drop(self.made.take());
        // SAFETY: the handed socket's ring mappings and the UMEM's are this
        // value's own, unmapped once, after the socket they serve is gone.
        unsafe {
            if let Some(HandedMaps { socket, rings }) = self.handed.take() {
                for (at, len) in rings {
                    libc::munmap(at, len);
                }
                // The kernel frees the socket, its UMEM and its XSKMAP
                // entry once no process holds it.
                drop(socket);
            }
            libc::munmap(self.area.cast::<c_void>(), self.area_bytes);
        }
        // Under the lock no other socket of this process opens BPF
        // descriptors, so one of this socket's numbers that still names a
        // BPF object is the one libxdp left open.
        #[cfg(feature = "xdp")]
        for &fd in &self.bpf_fds {
            if is_bpf_fd(fd) {
                // SAFETY: `fd` is a BPF descriptor libxdp opened for this
                // socket, which is deleted; nothing uses it any more.
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// The TX doorbell of the AF_XDP socket `fd`: a zero-length `sendto`.
/// Safe to ring without the port's lock (the kernel serializes a socket's
/// transmits), so a sender that rings it after letting the lock go leaves
/// the port to its other threads while the kernel sends.
pub(crate) fn ring_doorbell(fd: RawFd) -> io::Result<()> {
    // SAFETY: a zero-length sendto on the socket's descriptor, no buffer
    // and no address, is AF_XDP's TX wake-up.
    let rc = unsafe { libc::sendto(fd, ptr::null(), 0, libc::MSG_DONTWAIT, ptr::null(), 0) };
    if rc >= 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // The kernel is busy or the completion ring is full: the frames
        // stay queued and go with the next kick.
        Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => Ok(()),
        _ => Err(e),
    }
}

// The switch of the queue tests, for the direct connection's tests.
#[cfg(all(test, feature = "xdp"))]
pub(crate) use tests::{in_ns, index_of, sh, switch_of_two, Namespaces};

// The tests make their sockets and steering here, through libxdp.
#[cfg(feature = "xdp")]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
#[cfg(test)]
mod tests {
    use super::super::steer::{self, ConnId};
    use super::steering::{bpf_fd, ifindex};
    use super::*;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::process::Command;

    extern "C" {
        fn bpf_xdp_query_id(ifindex: c_int, flags: c_int, prog_id: *mut u32) -> c_int;
        fn bpf_prog_get_fd_by_id(id: u32) -> c_int;
    }

    /// `union bpf_attr`'s `test` member, up to the fields used.
    #[repr(C)]
    #[derive(Default)]
    struct TestRunAttr {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
    }

    /// `struct xdp_md`, the context a test run is given.
    #[repr(C)]
    #[derive(Default)]
    struct XdpMd {
        data: u32,
        data_end: u32,
        data_meta: u32,
        ingress_ifindex: u32,
        rx_queue_index: u32,
        egress_ifindex: u32,
    }

    /// `BPF_PROG_TEST_RUN`.
    const BPF_PROG_TEST_RUN: libc::c_long = 10;

    /// The verdict of XDP program `prog` on `frame` (the kernel runs it
    /// on a copy and does not send it anywhere).
    fn verdict(prog: &OwnedFd, frame: &[u8]) -> u32 {
        verdict_on(prog, frame, None)
    }

    /// The verdict of XDP program `prog` on `frame` arriving on
    /// `(ifindex, queue)` if given.
    fn verdict_on(prog: &OwnedFd, frame: &[u8], on: Option<(u32, u32)>) -> u32 {
        let mut out = vec![0u8; frame.len() + 256];
        let md = on.map(|(ifindex, queue)| XdpMd {
            data_end: frame.len() as u32,
            ingress_ifindex: ifindex,
            rx_queue_index: queue,
            ..XdpMd::default()
        });
        let mut attr = TestRunAttr {
            prog_fd: prog.as_raw_fd() as u32,
            data_size_in: frame.len() as u32,
            data_size_out: out.len() as u32,
            data_in: frame.as_ptr() as u64,
            data_out: out.as_mut_ptr() as u64,
            repeat: 1,
            ..TestRunAttr::default()
        };
        if let Some(md) = &md {
            attr.ctx_size_in = std::mem::size_of::<XdpMd>() as u32;
            attr.ctx_in = std::ptr::from_ref(md) as u64;
        }
        // SAFETY: `attr` is a live `bpf_attr` prefix of its own size; the
        // buffers it points to are alive and as long as it says.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_TEST_RUN,
                &mut attr as *mut TestRunAttr,
                std::mem::size_of::<TestRunAttr>(),
            )
        };
        assert_eq!(rc, 0, "test run: {}", io::Error::last_os_error());
        attr.retval
    }

    /// The program attached to interface `ifname` of this thread's
    /// namespace, if any.
    fn attached(ifname: &str) -> Option<OwnedFd> {
        let name = CString::new(ifname).unwrap();
        // SAFETY: a NUL-terminated name alive for the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as c_int;
        assert!(ifindex > 0, "{ifname}");
        let mut id = 0u32;
        // SAFETY: `id` is a live u32 the call writes.
        let rc = unsafe { bpf_xdp_query_id(ifindex, 0, &mut id) };
        assert_eq!(rc, 0, "querying {ifname}'s XDP program");
        // SAFETY: a program id the kernel just named.
        (id != 0).then(|| bpf_fd(unsafe { bpf_prog_get_fd_by_id(id) }, "program").unwrap())
    }

    fn frame(ethertype: u16, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f
    }

    pub(crate) fn sh(args: &[&str]) {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }

    /// The bug this pins: libxdp's default program sent every frame of
    /// the socket's queue to the socket, so an agent whose control
    /// connection shared the interface with its xdp flows went deaf (its
    /// TCP segments, and ARP, went to netgap's demultiplexer, which drops
    /// what is not its own) until the port closed, which the control
    /// connection it could not hear should have told it to do. The program
    /// on an interface with an open port must pass IP and ARP to the
    /// kernel and take only netgap's frames; once the port closes, no
    /// program is left on the interface.
    #[test]
    fn an_open_port_leaves_ip_and_arp_frames_to_the_kernel() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: AF_XDP sockets and XDP programs need root");
            return;
        }
        // A network namespace of this test's thread alone, with a veth
        // pair: nothing of the machine's is touched, and the namespace
        // goes with the thread.
        std::thread::spawn(|| {
            // SAFETY: unshare of the calling thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "skipped: no network namespace: {}",
                    io::Error::last_os_error()
                );
                return;
            }
            sh(&[
                "link", "add", "ngxa", "type", "veth", "peer", "name", "ngxb",
            ]);
            sh(&["link", "set", "ngxa", "up"]);
            sh(&["link", "set", "ngxb", "up"]);
            let shape = Shape {
                frames: 64,
                frame_bytes: 4096,
                ring_entries: 32,
            };
            let xsk = Xsk::open("ngxa", 0, shape).unwrap();
            let prog = attached("ngxa").expect("a program on the port's interface");
            let ipv4 = frame(0x0800, 60);
            let arp = frame(0x0806, 60);
            let ipv6 = frame(0x86dd, 80);
            for (what, f) in [("IPv4", &ipv4), ("ARP", &arp), ("IPv6", &ipv6)] {
                assert_eq!(verdict(&prog, f), steer::XDP_PASS, "{what}");
            }
            let ours = frame(super::super::reliable::ETHERTYPE, 64);
            assert_eq!(verdict(&prog, &ours), steer::XDP_REDIRECT, "netgap's frame");
            drop(xsk);
            assert!(
                attached("ngxa").is_none(),
                "a program left after the port closed"
            );
        })
        .join()
        .unwrap();
    }

    /// Runs `f` in a network namespace of its own thread holding a veth
    /// pair `ngxa`/`ngxb` of `queues` queues each way (nothing of the
    /// machine's is touched; the namespace goes with the thread); skips
    /// without root or namespaces.
    fn in_netns_with_veth(queues: u32, f: impl FnOnce() + Send + 'static) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: AF_XDP sockets and XDP programs need root");
            return;
        }
        std::thread::spawn(move || {
            // SAFETY: unshare of the calling thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "skipped: no network namespace: {}",
                    io::Error::last_os_error()
                );
                return;
            }
            let q = queues.to_string();
            sh(&[
                "link",
                "add",
                "ngxa",
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "type",
                "veth",
                "peer",
                "name",
                "ngxb",
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
            ]);
            sh(&["link", "set", "ngxa", "up"]);
            sh(&["link", "set", "ngxb", "up"]);
            f();
        })
        .join()
        .unwrap();
    }

    pub(crate) fn index_of(ifname: &str) -> u32 {
        let name = CString::new(ifname).unwrap();
        ifindex(&name).unwrap() as u32
    }

    /// A netgap frame from `src` to flow `dst_flow`.
    fn ours_from(src: Mac, dst_flow: u16) -> Vec<u8> {
        let mut f = frame(super::super::reliable::ETHERTYPE, 64);
        f[6..12].copy_from_slice(&src);
        f[18..20].copy_from_slice(&dst_flow.to_be_bytes());
        f
    }

    type Mac = super::super::reliable::Mac;
    const PEER: Mac = [0x02, 0, 0, 0, 0, 0x0a];
    const STRANGER: Mac = [0x02, 0, 0, 0, 0, 0x0b];

    const SMALL: Shape = Shape {
        frames: 64,
        frame_bytes: 4096,
        ring_entries: 32,
    };

    /// The check this pins: a frame on a connection's queue reaches the
    /// queue's socket only if it is the registered connection's (its
    /// source MAC and destination flow); anything else on that queue is
    /// dropped and counted, so one process never reads another's frames.
    /// Queue 0 still takes every netgap frame, and other EtherTypes still
    /// go to the kernel.
    #[test]
    fn a_connection_queue_takes_only_its_connections_frames() {
        in_netns_with_veth(4, || {
            let steering = Steering::attach("ngxa", 4).unwrap();
            let ifindex = index_of("ngxa");
            let port = super::super::handover::make(ifindex, 2, SMALL).unwrap();
            steering.put_socket(2, port.socket.as_raw_fd()).unwrap();
            let conn = ConnId {
                peer_mac: PEER,
                local_flow: 7,
            };
            let prog = steering.prog();
            let on = |q| Some((ifindex, q));
            let ours = ours_from(PEER, 7);
            assert_eq!(
                verdict_on(prog, &ours, on(2)),
                steer::XDP_DROP,
                "no connection registered yet"
            );
            steering.register(2, conn).unwrap();
            assert_eq!(verdict_on(prog, &ours, on(2)), steer::XDP_REDIRECT);
            let strangers = [
                ("another source", ours_from(STRANGER, 7)),
                ("another flow", ours_from(PEER, 8)),
                ("too short to tell", ours_from(PEER, 7)[..18].to_vec()),
            ];
            for (what, f) in &strangers {
                assert_eq!(verdict_on(prog, f, on(2)), steer::XDP_DROP, "{what}");
            }
            assert_eq!(steering.drops().unwrap(), 1 + strangers.len() as u64);
            assert_eq!(
                verdict_on(prog, &frame(0x0800, 60), on(2)),
                steer::XDP_PASS,
                "IPv4 on a connection's queue"
            );
            // Queue 0 has no socket here: its frames take the redirect's
            // fallback, not the drop.
            let stranger = ours_from(STRANGER, 9);
            assert_eq!(verdict_on(prog, &stranger, on(0)), steer::XDP_PASS);
            steering.unregister(2).unwrap();
            assert_eq!(verdict_on(prog, &ours, on(2)), steer::XDP_DROP);
            assert_eq!(steering.drops().unwrap(), 2 + strangers.len() as u64);
        });
    }

    /// Sends `payload` in one raw frame from `from` (source MAC `src`) to
    /// flow `dst_flow`.
    fn send_frame(from: &mut Xsk, src: Mac, dst_flow: u16, payload: &[u8]) {
        let mut done = Vec::new();
        from.completed(8, &mut done);
        let mut f = ours_from(src, dst_flow);
        f.extend_from_slice(payload);
        let slot = SMALL.frames - 1;
        from.frame_mut(slot)[..f.len()].copy_from_slice(&f);
        assert!(from.queue_tx(slot, f.len() as u32));
        ring_doorbell(from.fd()).unwrap();
    }

    /// The bytes of the frames that arrive on `to` within `wait` (none:
    /// empty), the receive buffers given back.
    fn frames_within(to: &mut Xsk, wait: std::time::Duration) -> Vec<u8> {
        let t0 = std::time::Instant::now();
        let mut slots = Vec::new();
        loop {
            let mut got = Vec::new();
            to.receive(8, &mut slots, |b| got.extend_from_slice(b));
            to.fill(&slots);
            if !got.is_empty() || t0.elapsed() >= wait {
                return got;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Sends `payload` from `from` and waits for it on `to`; returns what
    /// arrived.
    fn carry(from: &mut Xsk, to: &mut Xsk, src: Mac, dst_flow: u16, payload: &[u8]) -> Vec<u8> {
        send_frame(from, src, dst_flow, payload);
        let got = frames_within(to, std::time::Duration::from_secs(3));
        assert!(!got.is_empty(), "nothing arrived");
        got
    }

    /// The AF_XDP sockets of this thread's namespace, as the kernel counts
    /// them (the `XDP` row of /proc/net/protocols; `ss --xdp` needs a
    /// diagnostics module this kernel may lack).
    fn xdp_sockets() -> usize {
        let text = std::fs::read_to_string("/proc/thread-self/net/protocols").unwrap();
        let row = text.lines().find(|l| l.starts_with("XDP ")).unwrap();
        row.split_whitespace().nth(2).unwrap().parse().unwrap()
    }

    /// A handed port: the maker (here another thread, as the relay is
    /// another process) makes the UMEM and the socket on queue 2 of each
    /// end of a veth pair and hands them over a Unix socket; the users map
    /// the rings themselves and carry bytes both ways, each reading only
    /// its registered connection's frames. Once a user lets go of its
    /// port, no socket is left and the queue's `XSKMAP` entry is gone.
    #[test]
    fn a_handed_port_carries_frames_both_ways_and_leaves_nothing_behind() {
        in_netns_with_veth(4, || {
            let a_mac = [0x02, 0, 0, 0, 0, 0xa1];
            let b_mac = [0x02, 0, 0, 0, 0, 0xb1];
            let q = 2;
            let before = xdp_sockets();
            let mut users = Vec::new();
            let mut steerings = Vec::new();
            for (ifname, peer, flow) in [("ngxa", b_mac, 11u16), ("ngxb", a_mac, 22)] {
                let steering = Steering::attach(ifname, 4).unwrap();
                let port = super::super::handover::make(index_of(ifname), q, SMALL).unwrap();
                steering.put_socket(q, port.socket.as_raw_fd()).unwrap();
                steering
                    .register(
                        q,
                        ConnId {
                            peer_mac: peer,
                            local_flow: flow,
                        },
                    )
                    .unwrap();
                let (maker, user) = std::os::unix::net::UnixStream::pair().unwrap();
                super::super::handover::send(&maker, port).unwrap();
                let handed = super::super::handover::receive(&user).unwrap();
                assert_eq!(handed.geometry.queue, q);
                let mut x = Xsk::from_handed(handed).unwrap();
                let rx: Vec<u32> = (0..SMALL.frames / 2).collect();
                assert_eq!(x.fill(&rx), rx.len());
                users.push(x);
                steerings.push(steering);
            }
            assert_eq!(xdp_sockets(), before + 2, "one socket per handed port");
            let (a, b) = users.split_at_mut(1);
            let (a, b) = (&mut a[0], &mut b[0]);
            let got = carry(a, b, a_mac, 22, b"to b");
            assert!(got.ends_with(b"to b"), "{got:?}");
            let got = carry(b, a, b_mac, 11, b"to a");
            assert!(got.ends_with(b"to a"), "{got:?}");
            let to_b = ours_from(a_mac, 22);
            let prog_b = steerings[1].prog();
            let on_b = Some((index_of("ngxb"), q));
            assert_eq!(verdict_on(prog_b, &to_b, on_b), steer::XDP_REDIRECT);
            drop(users);
            // The kernel frees a closed socket a little after the close.
            let t0 = std::time::Instant::now();
            while xdp_sockets() != before && t0.elapsed().as_secs() < 2 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert_eq!(xdp_sockets(), before, "a socket left after its user");
            assert_eq!(
                verdict_on(prog_b, &to_b, on_b),
                steer::XDP_PASS,
                "the XSKMAP entry outlived its socket"
            );
        });
    }

    /// Named network namespaces of a test, deleted when it ends however it
    /// ends.
    pub(crate) struct Namespaces(Vec<String>);

    impl Namespaces {
        fn add(names: &[String]) -> Namespaces {
            let made = Namespaces(names.to_vec());
            for n in names {
                sh(&["netns", "add", n]);
            }
            made
        }
    }

    impl Drop for Namespaces {
        fn drop(&mut self) {
            for n in &self.0 {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
    }

    /// Runs `f` on a thread inside namespace `ns`; its result.
    pub(crate) fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = ns.to_string();
        std::thread::spawn(move || {
            crate::netns::enter(&ns).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    /// Host namespaces `a` and `b`, each with a four-queue veth (`a0`,
    /// `b0`) to a port (`pa`, `pb`) of a bridge in namespace `sw`, as the
    /// testbed's switch has them, the queue-keeping programs on the ports.
    /// `shaped`: each port shaped as the testbed's `shaping.rs` shapes a
    /// rate, a TBF toward the host, and the host's uplink, the port's
    /// ingress redirected to a one-queue IFB device under a TBF.
    pub(crate) fn switch_of_two(tag: &str, shaped: bool) -> (Namespaces, [String; 3]) {
        let names = [format!("{tag}a"), format!("{tag}s"), format!("{tag}b")];
        let made = Namespaces::add(&names);
        let [a, sw, b] = &names;
        for (ns, dev, port) in [(a, "a0", "pa"), (b, "b0", "pb")] {
            sh(&[
                "-n",
                ns,
                "link",
                "add",
                dev,
                "numtxqueues",
                "4",
                "numrxqueues",
                "4",
                "type",
                "veth",
                "peer",
                "name",
                port,
                "numtxqueues",
                "4",
                "numrxqueues",
                "4",
                "netns",
                sw,
            ]);
            sh(&["-n", ns, "link", "set", dev, "up"]);
        }
        sh(&["-n", sw, "link", "add", "br0", "type", "bridge"]);
        sh(&["-n", sw, "link", "set", "br0", "up"]);
        for port in ["pa", "pb"] {
            sh(&["-n", sw, "link", "set", port, "master", "br0", "up"]);
        }
        if shaped {
            for port in ["pa", "pb"] {
                shape_port(sw, port);
            }
        }
        in_ns(sw, || {
            // The probe and the program load BPF descriptors: not while a
            // socket is being made in another test (see `Steering::attach`).
            let _serial = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
            assert!(
                super::super::queue_path::kernel_keeps_queues_here(),
                "no tcx: the switch cannot keep queues"
            );
            for port in ["pa", "pb"] {
                super::super::queue_path::keep_queue_here(port).unwrap();
            }
        });
        // A port forwards once the kernel has seen its carrier come up,
        // which it learns a little later (link events are deferred).
        let t0 = std::time::Instant::now();
        for port in ["pa", "pb"] {
            loop {
                let out = Command::new("ip")
                    .args(["-n", sw, "-d", "link", "show", port])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("state forwarding") {
                    break;
                }
                assert!(t0.elapsed().as_secs() < 5, "{port} never forwards");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        (made, names)
    }

    /// Shapes switch port `port` of namespace `sw` as the testbed shapes
    /// a link held to 1 Gbit/s (`tc` as `shaping.rs` runs it).
    fn shape_port(sw: &str, port: &str) {
        let tc = |args: &[&str]| {
            let st = Command::new("tc")
                .args(["-n", sw])
                .args(args)
                .status()
                .unwrap();
            assert!(st.success(), "tc {args:?}");
        };
        let tbf = "tbf rate 1000000000bit burst 125000 latency 100ms";
        let ifb = format!("u{port}");
        let toward_host = format!("qdisc add dev {port} root handle 1: {tbf}");
        let uplink = format!("qdisc add dev {ifb} root handle 1: {tbf}");
        let redirect = format!(
            "filter add dev {port} parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev {ifb}"
        );
        tc(&toward_host.split(' ').collect::<Vec<_>>());
        sh(&["-n", sw, "link", "add", &ifb, "type", "ifb"]);
        sh(&["-n", sw, "link", "set", "dev", &ifb, "up"]);
        tc(&uplink.split(' ').collect::<Vec<_>>());
        tc(&["qdisc", "add", "dev", port, "handle", "ffff:", "ingress"]);
        tc(&redirect.split(' ').collect::<Vec<_>>());
    }

    /// A host's side of [`switch_of_two`]: the steering on `dev` and a
    /// handed port on each of `queues`, the connection from `peer` to flow
    /// `flow_base + q` registered on each queue but 0.
    fn host_ports(
        ns: &str,
        dev: &'static str,
        queues: &'static [u32],
        peer: Mac,
        flow_base: u16,
    ) -> (Steering, Vec<Xsk>) {
        in_ns(ns, move || {
            let steering = Steering::attach(dev, 4).unwrap();
            let mut ports = Vec::new();
            for &q in queues {
                let port = super::super::handover::make(index_of(dev), q, SMALL).unwrap();
                steering.put_socket(q, port.socket.as_raw_fd()).unwrap();
                if q != 0 {
                    let conn = ConnId {
                        peer_mac: peer,
                        local_flow: flow_base + q as u16,
                    };
                    steering.register(q, conn).unwrap();
                }
                let mut x = Xsk::from_handed(port).unwrap();
                let rx: Vec<u32> = (0..SMALL.frames / 2).collect();
                assert_eq!(x.fill(&rx), rx.len());
                ports.push(x);
            }
            (steering, ports)
        })
    }

    /// The fact the direct connections stand on: through the testbed's
    /// switch (a bridge between multi-queue veths, the queue-keeping
    /// program on its ports), a frame an AF_XDP socket sends on queue q
    /// arrives on queue q at the other host, both ways, queue 0 included.
    /// Without the programs the bridge sends q on q - 1 and hashes 0, and
    /// nothing reaches these sockets.
    #[test]
    fn a_frame_keeps_its_queue_across_a_switch() {
        frames_keep_their_queues("ngq", false);
    }

    /// The same through shaped ports: the uplink's IFB redirect sends
    /// every frame on with queue 0, which the bridge hashes, so without
    /// the egress program setting the queue from the frame's mark every
    /// queue arrives on the flow hash's.
    #[test]
    fn a_frame_keeps_its_queue_across_a_shaped_switch() {
        frames_keep_their_queues("ngs", true);
    }

    /// Frames on queues 0, 1 and 3 each way through [`switch_of_two`]
    /// arrive on their queue's sockets.
    fn frames_keep_their_queues(prefix: &str, shaped: bool) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: namespaces and AF_XDP sockets need root");
            return;
        }
        let tag = format!("{prefix}{}", std::process::id());
        let (_made, [a, _, b]) = switch_of_two(&tag, shaped);
        let a_mac = [0x02, 0, 0, 0, 0, 0xa1];
        let b_mac = [0x02, 0, 0, 0, 0, 0xb1];
        const QUEUES: &[u32] = &[0, 1, 3];
        let (_sa, mut on_a) = host_ports(&a, "a0", QUEUES, b_mac, 200);
        let (_sb, mut on_b) = host_ports(&b, "b0", QUEUES, a_mac, 100);
        for (i, &q) in QUEUES.iter().enumerate() {
            let to_b = format!("to b on {q}");
            let got = carry(
                &mut on_a[i],
                &mut on_b[i],
                a_mac,
                100 + q as u16,
                to_b.as_bytes(),
            );
            assert!(got.ends_with(to_b.as_bytes()), "queue {q}: {got:?}");
            let to_a = format!("to a on {q}");
            let got = carry(
                &mut on_b[i],
                &mut on_a[i],
                b_mac,
                200 + q as u16,
                to_a.as_bytes(),
            );
            assert!(got.ends_with(to_a.as_bytes()), "queue {q}: {got:?}");
        }
    }

    /// The user of a handed port, run as a process of its own by
    /// [`a_killed_user_of_a_handed_port_leaves_no_socket_and_no_map_entry`]:
    /// takes the port from the maker's Unix socket, says it is ready, and,
    /// as the `first`, sends until the other answers, or, as the second,
    /// answers what arrives; reports the bytes it got to the maker, then
    /// goes on answering until it is killed.
    #[test]
    #[ignore = "run in a child process by the handed-port test"]
    fn handed_port_user() {
        use std::io::{Read, Write};
        let var = |k: &str| std::env::var(k).unwrap();
        let first = var("NG_HANDED_ROLE") == "first";
        let src: Mac = [0x02, 0, 0, 0, 0, var("NG_HANDED_SRC").parse().unwrap()];
        let dst_flow: u16 = var("NG_HANDED_DST_FLOW").parse().unwrap();
        let mut maker = std::os::unix::net::UnixStream::connect(var("NG_HANDED_PATH")).unwrap();
        let port = super::super::handover::receive(&maker).unwrap();
        let mut x = Xsk::from_handed(port).unwrap();
        let rx: Vec<u32> = (0..SMALL.frames / 2).collect();
        assert_eq!(x.fill(&rx), rx.len());
        maker.write_all(b"R").unwrap();
        let mut go = [0u8; 1];
        maker.read_exact(&mut go).unwrap();
        let me = if first { "from first" } else { "from second" };
        let tick = std::time::Duration::from_millis(50);
        let got = loop {
            if first {
                send_frame(&mut x, src, dst_flow, me.as_bytes());
            }
            let got = frames_within(&mut x, tick);
            if !got.is_empty() {
                break got;
            }
        };
        if !first {
            send_frame(&mut x, src, dst_flow, me.as_bytes());
        }
        maker.write_all(&got).unwrap();
        loop {
            if !frames_within(&mut x, tick).is_empty() && !first {
                send_frame(&mut x, src, dst_flow, me.as_bytes());
            }
        }
    }

    /// A user process, killed when the test ends however it ends.
    struct User(std::process::Child);

    impl Drop for User {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A handed port between two processes on two hosts: the maker (this
    /// process, in each host's namespace) makes a port on queue 2 of each
    /// host's link through the switch and hands it to a user process
    /// there; the two users carry bytes both ways; a killed user leaves no
    /// AF_XDP socket in its namespace and no entry in its `XSKMAP` (a
    /// frame of its connection goes to the kernel, not to a socket).
    #[test]
    fn a_killed_user_of_a_handed_port_leaves_no_socket_and_no_map_entry() {
        use std::io::{Read, Write};
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: namespaces and AF_XDP sockets need root");
            return;
        }
        let tag = format!("ngh{}", std::process::id());
        let (_made, [a, _, b]) = switch_of_two(&tag, false);
        let dir = tempfile::tempdir().unwrap();
        let q = 2;
        // (namespace, device, own MAC's last byte, own flow, peer's)
        let hosts = [(&a, "a0", 0xa1u8, 11u16, 22u16), (&b, "b0", 0xb1, 22, 11)];
        let mut users = Vec::new();
        for (i, &(ns, dev, mac, flow, peer_flow)) in hosts.iter().enumerate() {
            let peer_mac = [0x02, 0, 0, 0, 0, hosts[1 - i].2];
            let path = dir.path().join(format!("maker{i}"));
            let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
            let child = User(
                Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "xdp::sys::tests::handed_port_user", "--ignored"])
                    .env("NG_HANDED_ROLE", if i == 0 { "first" } else { "second" })
                    .env("NG_HANDED_SRC", mac.to_string())
                    .env("NG_HANDED_DST_FLOW", peer_flow.to_string())
                    .env("NG_HANDED_PATH", &path)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let (stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            let ns = ns.to_string();
            let (steering, sockets_before) = in_ns(&ns, move || {
                let before = xdp_sockets();
                let steering = Steering::attach(dev, 4).unwrap();
                let port = super::super::handover::make(index_of(dev), q, SMALL).unwrap();
                steering.put_socket(q, port.socket.as_raw_fd()).unwrap();
                let conn = ConnId {
                    peer_mac,
                    local_flow: flow,
                };
                steering.register(q, conn).unwrap();
                super::super::handover::send(&stream, port).unwrap();
                (steering, (before, stream))
            });
            let (before, stream) = sockets_before;
            users.push((child, stream, steering, before, ns, peer_mac, flow, dev));
        }
        for u in &mut users {
            let mut ready = [0u8; 1];
            u.1.read_exact(&mut ready).unwrap();
        }
        for u in &mut users {
            u.1.write_all(b"G").unwrap();
        }
        for (u, want) in users.iter_mut().zip(["from second", "from first"]) {
            let mut got = vec![0u8; 4096];
            let n = u.1.read(&mut got).unwrap();
            let got = String::from_utf8_lossy(&got[..n]).to_string();
            assert!(got.ends_with(want), "{got:?}");
        }
        for (mut child, _stream, steering, before, ns, peer_mac, flow, dev) in users {
            // The test run names the queue by the interface's index in
            // the host's namespace, so it runs there.
            let prog = steering.prog().try_clone().unwrap();
            let verdict_there = move || {
                let prog = prog.try_clone().unwrap();
                in_ns(&ns, move || {
                    let on = Some((index_of(dev), q));
                    (
                        verdict_on(&prog, &ours_from(peer_mac, flow), on),
                        xdp_sockets(),
                    )
                })
            };
            let (v, _) = verdict_there();
            assert_eq!(v, steer::XDP_REDIRECT, "the user's socket is in the map");
            child.0.kill().unwrap();
            child.0.wait().unwrap();
            let t0 = std::time::Instant::now();
            let (v, left) = loop {
                let (v, left) = verdict_there();
                if left == before || t0.elapsed().as_secs() >= 3 {
                    break (v, left);
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            };
            assert_eq!(left, before, "an AF_XDP socket outlived its killed user");
            assert_eq!(
                v,
                steer::XDP_PASS,
                "the XSKMAP entry outlived the killed user's socket"
            );
        }
    }

    /// The relay's case: a process with its own port on an interface (queue
    /// 0) makes a socket for another process on queue 2 of the same
    /// interface. One XDP program serves both (an interface holds one):
    /// the port's steering is the interface's shared one; the connection
    /// registered for queue 2 stays while its registration lives; and the
    /// program stays while any holder keeps it, and goes after the last.
    #[test]
    fn a_port_and_the_sockets_made_beside_it_share_one_program() {
        in_netns_with_veth(4, || {
            let port = Xsk::open("ngxa", 0, SMALL).unwrap();
            let shared = Steering::shared("ngxa").unwrap();
            let own = port.made.as_ref().unwrap();
            assert!(own.owns(shared.prog().as_raw_fd()), "a second program");
            let made = super::super::handover::make(index_of("ngxa"), 2, SMALL).unwrap();
            shared.put_socket(2, made.socket.as_raw_fd()).unwrap();
            let conn = ConnId {
                peer_mac: PEER,
                local_flow: 7,
            };
            let registered = shared.register_while(2, conn).unwrap();
            let prog = attached("ngxa").expect("the port's program");
            let on = Some((index_of("ngxa"), 2));
            let ours = ours_from(PEER, 7);
            assert_eq!(verdict_on(&prog, &ours, on), steer::XDP_REDIRECT);
            assert_eq!(
                verdict_on(&prog, &ours_from(STRANGER, 7), on),
                steer::XDP_DROP
            );
            drop(registered);
            assert_eq!(
                verdict_on(&prog, &ours, on),
                steer::XDP_DROP,
                "the connection outlived its registration"
            );
            drop((port, prog));
            assert!(
                attached("ngxa").is_some(),
                "the program went with a holder left"
            );
            drop((shared, made));
            assert!(
                attached("ngxa").is_none(),
                "the program outlived its holders"
            );
        });
    }
}
