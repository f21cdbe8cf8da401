//! A region mapped and checked: made fresh by its maker
//! ([`Region::create`]), or taken from a peer ([`Region::open`]), which
//! trusts nothing of it before the checks, and hands out the ends of its
//! rings.
//!
//! Every pointer into the region is derived from the capacity as checked
//! here, against the length of the memory actually mapped: whatever the
//! header says afterwards (the peer may rewrite it at any time), no end
//! reads or writes past the mapping.

use crate::layout::{
    ctl_offset, data_offset, region_bytes, region_bytes_checked, valid_capacity, Header,
    HeaderFields, RingCtl, RingId, Role, Waits, LAYOUT_VERSION, MAGIC, MAX_CAPACITY_BYTES,
    MIN_CAPACITY_BYTES, PAGE_BYTES,
};
use crate::ring::{Consumer, OwnIndex, Producer};
use std::alloc::Layout;
use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Why a region was refused (or could not be made).
#[derive(Debug)]
pub enum RegionError {
    /// A system call on the region's file failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The descriptor is not a regular file (a memfd is one).
    NotAFile,
    /// The file is not sealed against shrinking: the peer could truncate
    /// it under the mapping and turn an access into `SIGBUS`.
    Unsealed,
    /// The file is not the size asked for.
    FileSize {
        /// Its size, in bytes.
        size: u64,
        /// What was asked for: a size, or the least and the most.
        wanted: String,
    },
    /// Fewer bytes than the smallest region.
    TooSmall {
        /// Bytes there are.
        len: u64,
    },
    /// The first word is not [`MAGIC`].
    Magic(u64),
    /// Another layout version.
    Version(u32),
    /// An unknown wait rule.
    WaitsCode(u32),
    /// Another wait rule than this end's.
    WaitsOther {
        /// What the header says.
        found: Waits,
        /// What this end waits by.
        expected: Waits,
    },
    /// The capacity is no power of two within the bounds.
    Capacity(u64),
    /// Another capacity than the one announced.
    CapacityOther {
        /// What the header says.
        found: u64,
        /// What was announced.
        expected: u64,
    },
    /// The header's capacity needs another size than the region has.
    Claims {
        /// The header's capacity.
        capacity: u64,
        /// Bytes a region of such rings has.
        need: u64,
        /// Bytes there are.
        len: u64,
    },
    /// A ring's indices say it holds more than it can.
    Indices {
        /// The ring's number.
        ring: usize,
        /// Its producer index.
        head: u64,
        /// Its consumer index.
        tail: u64,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Io { what, source } => write!(f, "{what}: {source}"),
            RegionError::NotAFile => write!(f, "the region is not a regular file"),
            RegionError::Unsealed => write!(
                f,
                "the region's file is not sealed against shrinking (F_SEAL_SHRINK)"
            ),
            RegionError::FileSize { size, wanted } => write!(
                f,
                "the region's file is {size} B, not the size of such a region ({wanted})"
            ),
            RegionError::TooSmall { len } => {
                write!(f, "the region is {len} B, smaller than any region")
            }
            RegionError::Magic(m) => {
                write!(f, "the region's magic is {m:#018x}, not {MAGIC:#018x}")
            }
            RegionError::Version(v) => write!(
                f,
                "the region has layout version {v}; this build speaks {LAYOUT_VERSION}"
            ),
            RegionError::WaitsCode(c) => write!(f, "the region names an unknown wait rule {c}"),
            RegionError::WaitsOther { found, expected } => write!(
                f,
                "the region's ends wait by {found:?} (the maker's mode), this end by {expected:?}"
            ),
            RegionError::Capacity(c) => write!(
                f,
                "the region's ring capacity {c} B is not a power of two in 4 KiB..=1 GiB"
            ),
            RegionError::CapacityOther { found, expected } => write!(
                f,
                "the region's rings hold {found} B, not the {expected} B announced"
            ),
            RegionError::Claims {
                capacity,
                need,
                len,
            } => write!(
                f,
                "the region claims rings of {capacity} B, which need {need} B, but it is {len} B"
            ),
            RegionError::Indices { ring, head, tail } => write!(
                f,
                "the region's ring {ring} is corrupt: producer index {head}, consumer index {tail}"
            ),
        }
    }
}

impl std::error::Error for RegionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RegionError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// What an end expects of a region a peer made.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// The capacity the peer announced (the preload library's hello, the
    /// relay's request), or None to take the header's, checked against
    /// the file's size.
    pub capacity: Option<usize>,
    /// The rule this end waits by.
    pub waits: Waits,
}

/// Where a region's memory came from.
enum Kind {
    /// A `MAP_SHARED` mapping of its file, unmapped on drop.
    Mapped,
    /// A copy in this process's heap ([`Region::from_bytes`]), freed on
    /// drop.
    Heap(Layout),
}

/// A region's memory: page-aligned, `len` bytes, alive until the last
/// [`Region`] or ring end that holds it is gone.
pub(crate) struct Backing {
    base: NonNull<u8>,
    len: usize,
    kind: Kind,
}

// SAFETY: the memory is plain bytes shared with another process, touched
// only through atomics (header, control blocks) and copies whose
// exclusivity the ring protocol provides; the handle may move to and be
// shared between threads.
unsafe impl Send for Backing {}
// SAFETY: as above.
unsafe impl Sync for Backing {}

impl Drop for Backing {
    fn drop(&mut self) {
        match self.kind {
            Kind::Mapped => {
                // SAFETY: `base`/`len` are what mmap returned, unmapped
                // once, here, after every region and ring end holding this
                // backing is gone.
                unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
            }
            Kind::Heap(layout) => {
                // SAFETY: allocated in `from_bytes` with this layout, freed
                // once.
                unsafe { std::alloc::dealloc(self.base.as_ptr(), layout) };
            }
        }
    }
}

impl Backing {
    /// Maps `len` bytes of `fd`, shared and writable.
    fn map(fd: RawFd, len: usize, prefault: bool) -> Result<Backing, RegionError> {
        let flags = libc::MAP_SHARED | if prefault { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh mapping at an address the kernel picks, so no
        // memory of this process is replaced; an invalid descriptor or
        // length fails with an error. The callers checked the file holds
        // `len` bytes and cannot shrink, so every page stays backed.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(RegionError::Io {
                what: "mapping the region",
                source: io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or(RegionError::Io {
            what: "mapping the region",
            source: io::Error::other("mmap gave a null address"),
        })?;
        Ok(Backing {
            base,
            len,
            kind: Kind::Mapped,
        })
    }

    /// The header, at the start of the memory.
    fn header(&self) -> &Header {
        // SAFETY: every backing is page-aligned and at least
        // `region_bytes(MIN_CAPACITY_BYTES)` long (checked before one is
        // made), so the header's 64 bytes lie inside it, aligned; it holds
        // only atomics, and any bit pattern is a valid value of them.
        unsafe { self.base.cast::<Header>().as_ref() }
    }
}

/// The size, checked, of the file behind `fd` (a regular file sealed
/// against shrinking).
fn file_size(fd: RawFd) -> Result<u64, RegionError> {
    // SAFETY: all-zero bytes are a valid `stat`, which fstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes; a bad descriptor is an error.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(RegionError::Io {
            what: "fstat of the region's file",
            source: io::Error::last_os_error(),
        });
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(RegionError::NotAFile);
    }
    // The system call itself: in the preload library `fcntl` is the
    // library's own, interposed one.
    // SAFETY: F_GET_SEALS takes no argument and only reads the descriptor.
    let seals = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(RegionError::Io {
            what: "F_GET_SEALS on the region's file (not a memfd?)",
            source: io::Error::last_os_error(),
        });
    }
    if seals & libc::c_long::from(libc::F_SEAL_SHRINK) == 0 {
        return Err(RegionError::Unsealed);
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

/// Checks a region's memory against what this end expects; the capacity.
fn check(mem: &Backing, expect: &Expect) -> Result<usize, RegionError> {
    let h = mem.header();
    let fields = HeaderFields::check(
        h.magic.load(Ordering::Acquire),
        h.version.load(Ordering::Relaxed),
        h.waits.load(Ordering::Relaxed),
        h.capacity.load(Ordering::Relaxed),
        0,
        0,
    )?;
    if fields.waits != expect.waits {
        return Err(RegionError::WaitsOther {
            found: fields.waits,
            expected: expect.waits,
        });
    }
    if let Some(c) = expect.capacity {
        if fields.capacity != c as u64 {
            return Err(RegionError::CapacityOther {
                found: fields.capacity,
                expected: c as u64,
            });
        }
    }
    // `valid_capacity` held, so this is at most 2 GiB and some pages.
    let capacity = fields.capacity as usize;
    let need = region_bytes(capacity);
    if need != mem.len {
        return Err(RegionError::Claims {
            capacity: fields.capacity,
            need: need as u64,
            len: mem.len as u64,
        });
    }
    for ring in [RingId::ToListener, RingId::ToConnector] {
        // SAFETY: the control block lies in the second or third page,
        // inside the memory (`len ≥ region_bytes(MIN)`), aligned to a
        // page; all atomics.
        let ctl = unsafe { mem.base.add(ctl_offset(ring)).cast::<RingCtl>().as_ref() };
        let head = ctl.head.0.load(Ordering::Acquire);
        let tail = ctl.tail.0.load(Ordering::Acquire);
        if head.wrapping_sub(tail) > fields.capacity {
            return Err(RegionError::Indices {
                ring: ring.index(),
                head,
                tail,
            });
        }
    }
    Ok(capacity)
}

/// A region, mapped and checked: the header and the ends of its rings.
/// Cloning it shares the mapping, which goes when the last clone and the
/// last ring end made from it are gone.
#[derive(Clone)]
pub struct Region {
    mem: Arc<Backing>,
    /// Bytes of each ring, as checked (never re-read from the header).
    capacity: usize,
}

impl Region {
    /// Makes the region in `fd`, a file of exactly [`region_bytes`]`(capacity)`
    /// bytes (the maker sized and sealed it): maps it (`prefault`: every
    /// page at once, so no fault lands in a measurement) and writes the
    /// header, the magic last, so a header with the magic is complete.
    pub fn create(
        fd: RawFd,
        capacity: usize,
        waits: Waits,
        prefault: bool,
    ) -> Result<Region, RegionError> {
        if !valid_capacity(capacity as u64) {
            return Err(RegionError::Capacity(capacity as u64));
        }
        let len = region_bytes(capacity);
        let size = file_size(fd)?;
        if size != len as u64 {
            return Err(RegionError::FileSize {
                size,
                wanted: format!("{len} B"),
            });
        }
        let mem = Backing::map(fd, len, prefault)?;
        let h = mem.header();
        h.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.waits.store(waits.code(), Ordering::Relaxed);
        h.capacity.store(capacity as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(Region {
            mem: Arc::new(mem),
            capacity,
        })
    }

    /// Maps the region in `fd`, made by a peer, and checks it: a regular
    /// file sealed against shrinking, of the size its announced capacity
    /// needs (or of a size some capacity needs), whose header has the
    /// magic, this layout's version, this end's wait rule and a capacity
    /// that fills exactly the file, and whose rings' indices are possible.
    pub fn open(fd: RawFd, expect: &Expect, prefault: bool) -> Result<Region, RegionError> {
        let size = file_size(fd)?;
        let fits = match expect.capacity {
            Some(c) => region_bytes_checked(c as u64) == Some(size as usize),
            None => (region_bytes(MIN_CAPACITY_BYTES) as u64
                ..=region_bytes(MAX_CAPACITY_BYTES) as u64)
                .contains(&size),
        };
        if !fits {
            return Err(RegionError::FileSize {
                size,
                wanted: match expect.capacity.and_then(|c| region_bytes_checked(c as u64)) {
                    Some(len) => format!("{len} B"),
                    None => format!(
                        "{} B to {} B",
                        region_bytes(MIN_CAPACITY_BYTES),
                        region_bytes(MAX_CAPACITY_BYTES)
                    ),
                },
            });
        }
        // `size` is at most `region_bytes(MAX_CAPACITY_BYTES)`: it fits.
        let mem = Backing::map(fd, size as usize, prefault)?;
        let capacity = check(&mem, expect)?;
        Ok(Region {
            mem: Arc::new(mem),
            capacity,
        })
    }

    /// Checks `bytes` as a region a peer made, copied into memory of this
    /// process's own (page-aligned, as a mapping is): the checks of
    /// [`Region::open`] after the file's, on the same code. For tests and
    /// fuzzing: the copy is no shared mapping.
    pub fn from_bytes(bytes: &[u8], expect: &Expect) -> Result<Region, RegionError> {
        let len = bytes.len();
        if len < region_bytes(MIN_CAPACITY_BYTES) {
            return Err(RegionError::TooSmall { len: len as u64 });
        }
        if len > region_bytes(MAX_CAPACITY_BYTES) {
            return Err(RegionError::FileSize {
                size: len as u64,
                wanted: format!("at most {} B", region_bytes(MAX_CAPACITY_BYTES)),
            });
        }
        let layout = Layout::from_size_align(len, PAGE_BYTES).map_err(|e| RegionError::Io {
            what: "a copy of the region",
            source: io::Error::other(e),
        })?;
        // SAFETY: the layout's size is at least a region's, not zero.
        let p = unsafe { std::alloc::alloc(layout) };
        let Some(base) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: `base` is a fresh allocation of `len` bytes, `bytes` is
        // `len` bytes elsewhere.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.as_ptr(), len) };
        let mem = Backing {
            base,
            len,
            kind: Kind::Heap(layout),
        };
        let capacity = check(&mem, expect)?;
        Ok(Region {
            mem: Arc::new(mem),
            capacity,
        })
    }

    /// Bytes of each ring.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The header.
    pub fn header(&self) -> &Header {
        self.mem.header()
    }

    /// A ring's control block.
    pub fn ctl(&self, ring: RingId) -> &RingCtl {
        // SAFETY: the control block lies in the second or third page of
        // the memory, which is at least a region long, page-aligned; all
        // atomics, alive while `self` is.
        unsafe {
            self.mem
                .base
                .add(ctl_offset(ring))
                .cast::<RingCtl>()
                .as_ref()
        }
    }

    /// The addresses of a ring's control block and data.
    fn ring(&self, ring: RingId) -> (NonNull<RingCtl>, NonNull<u8>) {
        debug_assert!(data_offset(ring, self.capacity) + self.capacity <= self.mem.len);
        // SAFETY: `ctl_offset` is within the first three pages and
        // `data_offset + capacity ≤ region_bytes(capacity) = len` (checked
        // when the region was made or opened), so both stay inside the
        // memory and are not null.
        unsafe {
            (
                self.mem.base.add(ctl_offset(ring)).cast::<RingCtl>(),
                self.mem.base.add(data_offset(ring, self.capacity)),
            )
        }
    }

    /// The producing end of `ring`, reading its own index from the ring.
    pub fn producer(&self, ring: RingId) -> Producer {
        self.producer_with(ring, OwnIndex::InRing)
    }

    /// The producing end of `ring`, its own index kept as `own` says.
    pub fn producer_with(&self, ring: RingId, own: OwnIndex) -> Producer {
        let (ctl, data) = self.ring(ring);
        // SAFETY: both lie in this region's memory, which the end keeps
        // (its `Arc`), and do not overlap (control pages, then data); the
        // capacity was checked to be a power of two within the bounds.
        unsafe { Producer::new(ctl, data, self.capacity as u64, Arc::clone(&self.mem), own) }
    }

    /// The consuming end of `ring`, reading its own index from the ring.
    pub fn consumer(&self, ring: RingId) -> Consumer {
        self.consumer_with(ring, OwnIndex::InRing)
    }

    /// The consuming end of `ring`, its own index kept as `own` says.
    pub fn consumer_with(&self, ring: RingId, own: OwnIndex) -> Consumer {
        let (ctl, data) = self.ring(ring);
        // SAFETY: as in `producer_with`.
        unsafe { Consumer::new(ctl, data, self.capacity as u64, Arc::clone(&self.mem), own) }
    }

    /// The ends of `role`: the producer of its outgoing ring and the
    /// consumer of its incoming one.
    pub fn ends(&self, role: Role) -> (Producer, Consumer) {
        self.ends_with(role, OwnIndex::InRing)
    }

    /// The ends of `role`, their own indices kept as `own` says.
    pub fn ends_with(&self, role: Role, own: OwnIndex) -> (Producer, Consumer) {
        (
            self.producer_with(role.tx(), own),
            self.consumer_with(role.rx(), own),
        )
    }
}
