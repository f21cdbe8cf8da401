//! One AF_XDP socket with its own UMEM, through libxdp: the registered
//! memory (an anonymous mapping cut into frames), its fill and completion
//! rings, and the socket's RX and TX rings. `xsk_socket__create` also
//! loads libxdp's default XDP program on the interface (or adds the socket
//! to the one already there) and puts the socket in its map, so every frame
//! arriving on the bound queue is steered to the socket; deleting the last
//! socket unloads it. The ring operations are libxdp's own inline
//! functions, given symbols by `shim.c`.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::Mutex;

/// Serialises making and deleting sockets in this process, so the BPF
/// descriptors that appear while one is made are that socket's.
static LIFECYCLE: Mutex<()> = Mutex::new(());

/// The process's open descriptors of BPF programs and maps.
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
#[repr(C)]
struct UmemConfig {
    fill_size: u32,
    comp_size: u32,
    frame_size: u32,
    frame_headroom: u32,
    flags: u32,
}

/// `struct xsk_socket_config`.
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
#[repr(C)]
struct XskUmem {
    _private: [u8; 0],
}

/// `struct xsk_socket`, opaque.
#[repr(C)]
struct XskSocket {
    _private: [u8; 0],
}

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

    fn netgap_xsk_prod_reserve(r: *mut Ring, nb: u32, idx: *mut u32) -> u32;
    fn netgap_xsk_prod_submit(r: *mut Ring, nb: u32);
    fn netgap_xsk_fill_addr(r: *mut Ring, idx: u32) -> *mut u64;
    fn netgap_xsk_tx_desc(r: *mut Ring, idx: u32) -> *mut XdpDesc;
    fn netgap_xsk_needs_wakeup(r: *const Ring) -> c_int;
    fn netgap_xsk_cons_peek(r: *mut Ring, nb: u32, idx: *mut u32) -> u32;
    fn netgap_xsk_cons_release(r: *mut Ring, nb: u32);
    fn netgap_xsk_cons_ready(r: *mut Ring) -> c_int;
    fn netgap_xsk_comp_addr(r: *const Ring, idx: u32) -> *const u64;
    fn netgap_xsk_rx_desc(r: *const Ring, idx: u32) -> *const XdpDesc;
    fn netgap_xdp_quiet();
}

/// `XDP_FLAGS_SKB_MODE`: the generic XDP hook, in the stack after the
/// driver made an skb; works on every interface.
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: the driver's own XDP hook.
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `XDP_COPY`: frames are copied between the driver's buffers and the UMEM.
const XDP_COPY: u16 = 1 << 1;
/// `XDP_USE_NEED_WAKEUP`: the kernel says when a TX kick or a fill-ring
/// wake-up is needed.
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;

/// Where libxdp attaches its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attach {
    /// The driver's hook (native XDP).
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

/// The shape of a port's UMEM and rings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Frames of the UMEM (a power of two).
    pub frames: u32,
    /// Bytes of each frame (a power of two, 2048 or 4096).
    pub frame_bytes: u32,
    /// Entries of each of the four rings (a power of two).
    pub ring_entries: u32,
}

/// One AF_XDP socket bound to one queue of one interface, with its own
/// UMEM and four rings.
pub(crate) struct Xsk {
    area: *mut u8,
    area_bytes: usize,
    umem: *mut XskUmem,
    socket: *mut XskSocket,
    fill: Box<Ring>,
    comp: Box<Ring>,
    rx: Box<Ring>,
    tx: Box<Ring>,
    fd: RawFd,
    frame_bytes: u32,
    /// Where libxdp attached the program that steers frames to it.
    attach: Attach,
    /// The BPF descriptors (program, maps) libxdp opened for this socket.
    /// libxdp 1.3 leaves some open after deleting the socket; they are
    /// closed then, or a long-lived agent would run out of descriptors
    /// after some hundreds of flows.
    bpf_fds: BTreeSet<RawFd>,
    /// Whether dropping takes [`LIFECYCLE`]: not while `open` holds it.
    lock_on_drop: bool,
}

// SAFETY: the socket, the UMEM and the rings belong to this value alone and
// are used only through `&mut self` (the flow serialises every use behind
// a mutex); nothing in them is tied to the thread that made them.
unsafe impl Send for Xsk {}

impl Xsk {
    /// Opens a socket on queue `queue` of `ifname` with a UMEM of `shape`,
    /// attached as `attach`, in copy mode.
    pub(crate) fn open(ifname: &str, queue: u32, shape: Shape, attach: Attach) -> io::Result<Xsk> {
        let name = CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
        let _serial = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
        let before = bpf_fds();
        match Xsk::create(&name, queue, shape, attach) {
            Ok(mut x) => {
                x.bpf_fds = bpf_fds().difference(&before).copied().collect();
                x.lock_on_drop = true;
                Ok(x)
            }
            Err(e) => {
                // What a failed attempt left open is libxdp's leftover too.
                for fd in bpf_fds().difference(&before) {
                    // SAFETY: a BPF descriptor opened during the failed
                    // attempt, under the lock: nothing else owns it.
                    unsafe { libc::close(*fd) };
                }
                Err(e)
            }
        }
    }

    /// Makes the UMEM and the socket; the caller holds [`LIFECYCLE`] (a
    /// half-made value dropped on failure does not take it again).
    fn create(name: &CString, queue: u32, shape: Shape, attach: Attach) -> io::Result<Xsk> {
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
        let mut x = Xsk {
            area: area.cast::<u8>(),
            area_bytes,
            umem: ptr::null_mut(),
            socket: ptr::null_mut(),
            fill: Ring::empty(),
            comp: Ring::empty(),
            rx: Ring::empty(),
            tx: Ring::empty(),
            fd: -1,
            frame_bytes: shape.frame_bytes,
            attach,
            bpf_fds: BTreeSet::new(),
            lock_on_drop: false,
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
                &mut x.umem,
                area,
                area_bytes as u64,
                &mut *x.fill,
                &mut *x.comp,
                &ucfg,
            )
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(-rc));
        }
        let scfg = SocketConfig {
            rx_size: shape.ring_entries,
            tx_size: shape.ring_entries,
            libxdp_flags: 0,
            xdp_flags: match attach {
                Attach::Native => XDP_FLAGS_DRV_MODE,
                Attach::Generic => XDP_FLAGS_SKB_MODE,
            },
            bind_flags: XDP_COPY | XDP_USE_NEED_WAKEUP,
        };
        // SAFETY: `name` is a NUL-terminated string alive for the call; the
        // UMEM was created above; the rings are boxed and live as long as
        // `x`, which deletes the socket before anything else.
        let rc = unsafe {
            xsk_socket__create(
                &mut x.socket,
                name.as_ptr(),
                queue,
                x.umem,
                &mut *x.rx,
                &mut *x.tx,
                &scfg,
            )
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(-rc));
        }
        // SAFETY: the socket was created above and is live.
        x.fd = unsafe { xsk_socket__fd(x.socket) };
        Ok(x)
    }

    /// The socket's descriptor, to poll and to kick.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd
    }

    /// Frames the kernel dropped on their way to this socket since it
    /// opened (no buffer on the fill ring, or the receive ring full);
    /// `None` when the kernel does not say.
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
        Some(st[0].saturating_add(ring_full))
    }

    /// Where libxdp attached the program that steers frames to it.
    pub(crate) fn attach(&self) -> Attach {
        self.attach
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
        if unsafe { netgap_xsk_prod_reserve(&mut *self.fill, n, &mut idx) } != n {
            return 0;
        }
        for (i, &slot) in slots.iter().enumerate() {
            let addr = u64::from(slot) * u64::from(self.frame_bytes);
            // SAFETY: `idx + i` is one of the entries reserved above; the
            // returned pointer is into the ring's mapping.
            unsafe { *netgap_xsk_fill_addr(&mut *self.fill, idx.wrapping_add(i as u32)) = addr };
        }
        // SAFETY: submits exactly the entries reserved and written above.
        unsafe { netgap_xsk_prod_submit(&mut *self.fill, n) };
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
        let n = unsafe { netgap_xsk_cons_peek(&mut *self.rx, max, &mut idx) };
        for i in 0..n {
            // SAFETY: `idx + i` is one of the `n` entries peeked above.
            let d = unsafe { &*netgap_xsk_rx_desc(&*self.rx, idx.wrapping_add(i)) };
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
            unsafe { netgap_xsk_cons_release(&mut *self.rx, n) };
        }
    }

    /// Whether a received frame waits on the RX ring: one load, no system
    /// call.
    pub(crate) fn rx_waiting(&mut self) -> bool {
        // SAFETY: the RX ring is live for `self`'s life.
        unsafe { netgap_xsk_cons_ready(&mut *self.rx) != 0 }
    }

    /// Whether a received frame or a completed transmission waits on its
    /// ring: two loads, no system call.
    pub(crate) fn anything_arrived(&mut self) -> bool {
        // SAFETY: the RX and completion rings are live for `self`'s life.
        unsafe {
            netgap_xsk_cons_ready(&mut *self.rx) != 0 || netgap_xsk_cons_ready(&mut *self.comp) != 0
        }
    }

    /// Takes up to `max` completed transmissions into `slots` (cleared
    /// first): the slots whose frames the kernel has sent and no longer
    /// reads.
    pub(crate) fn completed(&mut self, max: u32, slots: &mut Vec<u32>) {
        slots.clear();
        let mut idx = 0u32;
        // SAFETY: the completion ring is live; `idx` is a live local.
        let n = unsafe { netgap_xsk_cons_peek(&mut *self.comp, max, &mut idx) };
        for i in 0..n {
            // SAFETY: `idx + i` is one of the `n` entries peeked above.
            let addr = unsafe { *netgap_xsk_comp_addr(&*self.comp, idx.wrapping_add(i)) };
            if let Ok(slot) = u32::try_from(addr / u64::from(self.frame_bytes)) {
                slots.push(slot);
            }
        }
        if n > 0 {
            // SAFETY: releases exactly the entries peeked above.
            unsafe { netgap_xsk_cons_release(&mut *self.comp, n) };
        }
    }

    /// Queues frame `slot`'s first `len` bytes for sending; `false` when
    /// the TX ring is full.
    pub(crate) fn queue_tx(&mut self, slot: u32, len: u32) -> bool {
        let mut idx = 0u32;
        // SAFETY: the TX ring is live; `idx` is a live local.
        if unsafe { netgap_xsk_prod_reserve(&mut *self.tx, 1, &mut idx) } != 1 {
            return false;
        }
        // SAFETY: `idx` is the entry reserved above; the pointer is into
        // the ring's mapping.
        unsafe {
            let d = &mut *netgap_xsk_tx_desc(&mut *self.tx, idx);
            d.addr = u64::from(slot) * u64::from(self.frame_bytes);
            d.len = len;
            d.options = 0;
            netgap_xsk_prod_submit(&mut *self.tx, 1);
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
        unsafe { netgap_xsk_needs_wakeup(&*self.tx) != 0 }
    }

    /// Whether the kernel wants a wake-up to take the fill ring's frames.
    pub(crate) fn fill_needs_wakeup(&self) -> bool {
        // SAFETY: the fill ring is live.
        unsafe { netgap_xsk_needs_wakeup(&*self.fill) != 0 }
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        let _serial = self
            .lock_on_drop
            .then(|| LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner()));
        // SAFETY: each pointer is either null (not created) or was created
        // by libxdp above and is deleted once, socket before UMEM before the
        // memory they use.
        unsafe {
            if !self.socket.is_null() {
                xsk_socket__delete(self.socket);
            }
            if !self.umem.is_null() {
                xsk_umem__delete(self.umem);
            }
            libc::munmap(self.area.cast::<c_void>(), self.area_bytes);
        }
        // Under the lock no other socket of this process opens BPF
        // descriptors, so one of this socket's numbers that still names a
        // BPF object is the one libxdp left open.
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
