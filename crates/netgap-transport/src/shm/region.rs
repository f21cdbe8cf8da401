//! The shared region of one `shm` flow: a sealed memfd mapped `MAP_SHARED`
//! by both ends, laid out as
//!
//! | offset | bytes | content |
//! |---|---|---|
//! | 0 | 4096 | `Header`: magic, version, mode, ring capacity, total size |
//! | 4096 | 4096 | control block of ring 0 (listener → connector) |
//! | 8192 | 4096 | control block of ring 1 (connector → listener) |
//! | 12288 | `capacity` | data of ring 0 |
//! | 12288 + `capacity` | `capacity` | data of ring 1 |
//!
//! The listener creates, sizes and seals the memfd (`F_SEAL_SHRINK`, so the
//! peer can never truncate it under our mapping and turn an access into
//! `SIGBUS`), writes the header, then passes the descriptor to the
//! connector, which checks the seals, the file size and every header field
//! before trusting any offset.

use super::ring::{RingCtl, RingMem, CTL_BYTES};
use netgap_core::spec::Mode;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `b"NGAPSHM\0"` read as a little-endian `u64`: the first word of every
/// netgap shared region.
pub const MAGIC: u64 = u64::from_le_bytes(*b"NGAPSHM\0");
/// Layout version; bumped whenever the layout or the ring protocol changes.
pub const VERSION: u32 = 1;
/// Bytes of the header and of each control block (one page each, so the
/// data regions start page-aligned).
pub(crate) const PAGE_BYTES: usize = 4096;
/// Smallest ring capacity accepted from a peer, in bytes.
pub(crate) const MIN_CAPACITY_BYTES: usize = PAGE_BYTES;
/// Largest ring capacity accepted from a peer, in bytes (1 GiB; indices'
/// low halves must stay futex-observable, which needs capacity < 2^32).
pub(crate) const MAX_CAPACITY_BYTES: usize = 1 << 30;

const _: () = assert!(CTL_BYTES <= PAGE_BYTES);

/// Which of the two rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingId {
    /// Ring 0: the listener produces, the connector consumes.
    ToConnector,
    /// Ring 1: the connector produces, the listener consumes.
    ToListener,
}

/// The first page of the region. Atomics, because the peer maps it too;
/// the listener writes it before passing the descriptor and nobody writes it
/// afterwards.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    /// [`mode_code`] of the listener's completion mode.
    mode: AtomicU32,
    /// Bytes of each ring's data region; a power of two.
    capacity: AtomicU64,
    /// Bytes of the whole region.
    total: AtomicU64,
}

/// How a mode is written in the header (0 is never valid).
fn mode_code(mode: Mode) -> u32 {
    match mode {
        Mode::Event => 1,
        Mode::Poll => 2,
    }
}

/// Bytes of a region whose rings hold `capacity` bytes each.
pub fn total_bytes(capacity: usize) -> usize {
    3 * PAGE_BYTES + 2 * capacity
}

/// A `MAP_SHARED` read-write mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with another process; this
// module only touches it through atomics and raw-pointer copies whose
// exclusivity the ring protocol provides, so the handle may be sent to and
// shared between threads.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        let nz = NonZeroUsize::new(len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty shm mapping"))?;
        // SAFETY: a fresh mapping chosen by the kernel (no address hint), so
        // no existing memory is replaced; `len` equals the file size, which
        // is sealed against shrinking, so every mapped page stays backed.
        let ptr = unsafe {
            mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd.as_fd(),
                0,
            )
        }
        .map_err(|e| errno_context(e, "mmap of the shm region"))?;
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and every
        // pointer into the mapping is held by values that own (an `Arc` of)
        // the `Region` holding this mapping, so none outlives it.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

fn errno_context(e: nix::errno::Errno, what: &str) -> io::Error {
    let io = io::Error::from(e);
    io::Error::new(io.kind(), format!("{what}: {io}"))
}

fn invalid(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail)
}

/// One flow's shared region, mapped and validated; the rings inside stay
/// valid for as long as the `Region` lives.
pub(crate) struct Region {
    map: Mapping,
    capacity: usize,
}

impl Region {
    /// Creates a sealed memfd holding two rings of `capacity` bytes (a power
    /// of two within [`MIN_CAPACITY_BYTES`]..=[`MAX_CAPACITY_BYTES`]), maps
    /// it and writes the header for `mode`. Returns the region and the
    /// descriptor to pass to the peer.
    pub fn create(capacity: usize, mode: Mode) -> io::Result<(Region, OwnedFd)> {
        if !capacity.is_power_of_two()
            || !(MIN_CAPACITY_BYTES..=MAX_CAPACITY_BYTES).contains(&capacity)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shm ring capacity {capacity} B is not a power of two in 4 KiB..=1 GiB"),
            ));
        }
        let fd = memfd_create(
            c"netgap-shm",
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(|e| errno_context(e, "memfd_create"))?;
        let total = total_bytes(capacity);
        let len = libc::off_t::try_from(total)
            .map_err(|_| invalid(format!("shm region of {total} B is too large")))?;
        nix::unistd::ftruncate(&fd, len).map_err(|e| errno_context(e, "ftruncate of the memfd"))?;
        fcntl(
            fd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(|e| errno_context(e, "sealing the memfd (F_ADD_SEALS)"))?;
        let map = Mapping::new(&fd, total)?;
        let region = Region { map, capacity };
        let h = region.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.mode.store(mode_code(mode), Ordering::Relaxed);
        h.capacity.store(capacity as u64, Ordering::Relaxed);
        h.total.store(total as u64, Ordering::Relaxed);
        // Magic last: a header with the magic is complete.
        h.magic.store(MAGIC, Ordering::Release);
        Ok((region, fd))
    }

    /// Maps the region in `fd`, received from the listener, and checks that
    /// it is a sealed memfd whose size and header describe a region this
    /// version understands, made for `mode`.
    pub fn open(fd: OwnedFd, mode: Mode) -> io::Result<Region> {
        let seals = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).map_err(|e| {
            errno_context(e, "F_GET_SEALS on the received descriptor (not a memfd?)")
        })?;
        if !SealFlag::from_bits_retain(seals).contains(SealFlag::F_SEAL_SHRINK) {
            return Err(invalid(
                "the received memfd is not sealed against shrinking (F_SEAL_SHRINK)".into(),
            ));
        }
        let st = nix::sys::stat::fstat(fd.as_raw_fd())
            .map_err(|e| errno_context(e, "fstat of the received memfd"))?;
        let size = usize::try_from(st.st_size).unwrap_or(0);
        if size < total_bytes(MIN_CAPACITY_BYTES) || size > total_bytes(MAX_CAPACITY_BYTES) {
            return Err(invalid(format!(
                "the received memfd is {size} B, not the size of an shm region"
            )));
        }
        let map = Mapping::new(&fd, size)?;
        // Header fields are read once, checked, and never read again.
        // SAFETY: the mapping is at least one page, page-aligned, and a
        // Header is a few atomics (any bit pattern is valid).
        let h = unsafe { map.ptr.cast::<Header>().as_ref() };
        let magic = h.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(invalid(format!(
                "the shm region's magic is {magic:#018x}, not {MAGIC:#018x}"
            )));
        }
        let version = h.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(invalid(format!(
                "the shm region has layout version {version}; this netgap speaks {VERSION}"
            )));
        }
        let peer_mode = h.mode.load(Ordering::Relaxed);
        if peer_mode != mode_code(mode) {
            return Err(invalid(format!(
                "the listener's shm region uses mode code {peer_mode}, this side wants {mode} ({})",
                mode_code(mode)
            )));
        }
        let capacity = h.capacity.load(Ordering::Relaxed);
        let total = h.total.load(Ordering::Relaxed);
        let capacity_ok = usize::try_from(capacity).ok().filter(|c| {
            c.is_power_of_two() && (MIN_CAPACITY_BYTES..=MAX_CAPACITY_BYTES).contains(c)
        });
        let Some(capacity) = capacity_ok else {
            return Err(invalid(format!(
                "the shm region's ring capacity {capacity} B is not a power of two in 4 KiB..=1 GiB"
            )));
        };
        if total != size as u64 || size != total_bytes(capacity) {
            return Err(invalid(format!(
                "the shm region claims {total} B for rings of {capacity} B, \
                 but the memfd is {size} B and such rings need {} B",
                total_bytes(capacity)
            )));
        }
        Ok(Region { map, capacity })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a page for the header; atomics
        // accept any bit pattern and concurrent access.
        unsafe { self.map.ptr.cast::<Header>().as_ref() }
    }

    /// Bytes of each ring's data region.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The memory of one ring. The pointers inside stay valid while `self`
    /// lives: keep the region alive (an `Arc`) next to any producer or
    /// consumer made from it.
    pub fn ring(&self, id: RingId) -> RingMem {
        let (ctl_off, data_off) = match id {
            RingId::ToConnector => (PAGE_BYTES, 3 * PAGE_BYTES),
            RingId::ToListener => (2 * PAGE_BYTES, 3 * PAGE_BYTES + self.capacity),
        };
        // Both offsets and `data_off + capacity` lie within
        // `total_bytes(capacity)`, which is the mapping's length (checked in
        // `open`, by construction in `create`).
        debug_assert!(data_off + self.capacity <= self.map.len);
        let base = self.map.ptr.as_ptr();
        // SAFETY: in-bounds offsets of a live mapping, per the check above,
        // so the sums do not leave the allocation and are non-null.
        let (ctl, data) = unsafe {
            (
                NonNull::new_unchecked(base.add(ctl_off).cast::<RingCtl>()),
                NonNull::new_unchecked(base.add(data_off)),
            )
        };
        // SAFETY: `ctl` is a page-aligned, page-sized control block and
        // `data` a `capacity`-byte region right after the control pages;
        // they do not overlap, live as long as `self`, and `capacity` is a
        // power of two below 2^32 (checked in `create`/`open`).
        unsafe { RingMem::new(ctl, data, self.capacity) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_opens_in_a_second_mapping() {
        let (region, fd) = Region::create(8192, Mode::Poll).unwrap();
        let peer = Region::open(fd, Mode::Poll).unwrap();
        assert_eq!(peer.capacity(), 8192);
        // Both mappings see the same rings.
        region
            .ring(RingId::ToListener)
            .ctl()
            .head
            .0
            .store(42, Ordering::Release);
        let seen = peer
            .ring(RingId::ToListener)
            .ctl()
            .head
            .0
            .load(Ordering::Acquire);
        assert_eq!(seen, 42);
        assert_eq!(MAGIC.to_le_bytes(), *b"NGAPSHM\0");
    }

    #[test]
    fn bad_capacities_are_refused() {
        for cap in [0, 100, 2048, 3 * 4096, 2 << 30] {
            assert!(Region::create(cap, Mode::Event).is_err(), "{cap}");
        }
    }

    #[test]
    fn header_fields_are_checked() {
        let check = |corrupt: &dyn Fn(&Header), needle: &str| {
            let (region, fd) = Region::create(4096, Mode::Event).unwrap();
            corrupt(region.header());
            let e = Region::open(fd, Mode::Event).map(drop).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(needle), "{e}");
        };
        check(&|h| h.magic.store(7, Ordering::Relaxed), "magic");
        check(&|h| h.version.store(99, Ordering::Relaxed), "version");
        check(&|h| h.mode.store(2, Ordering::Relaxed), "mode");
        check(
            &|h| h.capacity.store(5000, Ordering::Relaxed),
            "power of two",
        );
        check(&|h| h.capacity.store(1 << 20, Ordering::Relaxed), "claims");
        check(&|h| h.total.store(1, Ordering::Relaxed), "claims");
    }
}
