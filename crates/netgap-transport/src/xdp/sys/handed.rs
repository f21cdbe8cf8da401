//! A port whose socket and UMEM another process made and handed over
//! ([`super::super::handover`]): the UMEM's memfd and the socket's four
//! rings mapped in this process, at the offsets the kernel gives
//! (`XDP_MMAP_OFFSETS`), and the rings laid out as the ring operations
//! (`ring.rs`, on libxdp's layout) expect, so the port works as one made
//! here.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr;

use super::{Ring, Xsk};
use crate::xdp::handover::HandedPort;

/// What a socket handed over by another process holds in this one: the
/// socket's descriptor and the four ring mappings.
pub(super) struct HandedMaps {
    pub(super) socket: OwnedFd,
    pub(super) rings: Vec<(*mut c_void, usize)>,
}

impl Xsk {
    /// The port over a socket and UMEM another process made and handed
    /// over ([`super::super::handover`]): maps the UMEM's memfd and the
    /// socket's four rings here, at the offsets the kernel gives
    /// (`XDP_MMAP_OFFSETS`). No program is attached: the maker's steering
    /// holds the socket in its `XSKMAP`.
    pub(crate) fn from_handed(port: HandedPort) -> io::Result<Xsk> {
        let g = port.geometry;
        let (area, area_bytes) = map_umem(&port)?;
        let fd = port.socket.as_raw_fd();
        // From here on the value's Drop unmaps what was mapped, the UMEM
        // and every ring mapped before a failure.
        let mut x = Xsk::unmapped(area, area_bytes, fd, g.frame_bytes);
        x.handed = Some(HandedMaps {
            socket: port.socket,
            rings: Vec::with_capacity(4),
        });
        let off = mmap_offsets(fd)?;
        let n = g.ring_entries;
        let desc_bytes = std::mem::size_of::<libc::xdp_desc>();
        let addr_bytes = std::mem::size_of::<u64>();
        let rx_pgoff = libc::XDP_PGOFF_RX_RING as u64;
        let tx_pgoff = libc::XDP_PGOFF_TX_RING as u64;
        let rings: [(&mut Ring, &libc::xdp_ring_offset, u64, usize, bool); 4] = [
            (&mut *x.rx, &off.rx, rx_pgoff, desc_bytes, false),
            (&mut *x.tx, &off.tx, tx_pgoff, desc_bytes, true),
            (
                &mut *x.fill,
                &off.fr,
                libc::XDP_UMEM_PGOFF_FILL_RING,
                addr_bytes,
                true,
            ),
            (
                &mut *x.comp,
                &off.cr,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING,
                addr_bytes,
                false,
            ),
        ];
        let mut maps = Vec::with_capacity(4);
        let mut failed = None;
        for (ring, o, pgoff, entry_bytes, producer) in rings {
            match map_ring(fd, ring, o, pgoff, n, entry_bytes, producer) {
                Ok(m) => maps.push(m),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(h) = x.handed.as_mut() {
            h.rings = maps;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(x),
        }
    }
}

/// Maps a handed port's UMEM (its memfd, shared), after checking the
/// memfd holds as many bytes as the geometry says; the mapping and its
/// length.
fn map_umem(port: &HandedPort) -> io::Result<(*mut u8, usize)> {
    let g = port.geometry;
    let area_bytes = usize::try_from(g.umem_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a live stat buffer the call fills.
    if unsafe { libc::fstat(port.umem.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded and filled it.
    let size = unsafe { st.assume_init() }.st_size;
    if u64::try_from(size).unwrap_or(0) < g.umem_bytes() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the handed UMEM is smaller than its geometry says",
        ));
    }
    // SAFETY: a shared mapping of the memfd, no larger than it (checked
    // above); the result is checked.
    let area = unsafe {
        libc::mmap(
            ptr::null_mut(),
            area_bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            port.umem.as_raw_fd(),
            0,
        )
    };
    if area == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok((area.cast::<u8>(), area_bytes))
}

/// Where the kernel puts each ring's indices, flags and entries in the
/// mappings of AF_XDP socket `fd`; refuses a kernel older than the flags
/// word (5.4), whose layout is shorter.
fn mmap_offsets(fd: RawFd) -> io::Result<libc::xdp_mmap_offsets> {
    let mut off = std::mem::MaybeUninit::<libc::xdp_mmap_offsets>::zeroed();
    let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: `off` is valid for `len` bytes of writes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            off.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 || len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel gives no ring offsets of the flags layout (XDP_MMAP_OFFSETS)",
        ));
    }
    // SAFETY: the kernel filled the whole structure (length checked).
    Ok(unsafe { off.assume_init() })
}

/// Maps one ring of AF_XDP socket `fd` (at page offset `pgoff`, `n`
/// entries of `entry_bytes`) and points `ring` at it, as the ring
/// operations expect: a producer ring (fill, TX) starts with all `n`
/// entries free, a consumer ring (RX, completion) with what the kernel
/// has produced. Returns the mapping, for unmapping.
fn map_ring(
    fd: RawFd,
    ring: &mut Ring,
    o: &libc::xdp_ring_offset,
    pgoff: u64,
    n: u32,
    entry_bytes: usize,
    producer: bool,
) -> io::Result<(*mut c_void, usize)> {
    let bytes =
        usize::try_from(o.desc).map_err(|_| io::ErrorKind::InvalidData)? + n as usize * entry_bytes;
    let pgoff = libc::off_t::try_from(pgoff).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a shared mapping of the socket's ring at the kernel's page
    // offset for it, as long as its entries; checked.
    let at = unsafe {
        libc::mmap(
            ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            pgoff,
        )
    };
    if at == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("mapping a ring of the handed socket: {e}"),
        ));
    }
    let base = at.cast::<u8>();
    let field = |off: u64| {
        // SAFETY: the kernel's offsets lie inside the mapping it sized.
        unsafe { base.add(off as usize) }
    };
    ring.producer = field(o.producer).cast();
    ring.consumer = field(o.consumer).cast();
    ring.flags = field(o.flags).cast();
    ring.ring = field(o.desc).cast();
    ring.mask = n - 1;
    ring.size = n;
    // SAFETY: the producer and consumer indices are u32s in the mapping,
    // which the kernel keeps aligned.
    let (prod, cons) = unsafe { (ring.producer.read_volatile(), ring.consumer.read_volatile()) };
    ring.cached_prod = prod;
    ring.cached_cons = if producer { cons.wrapping_add(n) } else { cons };
    Ok((at, bytes))
}
