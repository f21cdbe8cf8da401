//! The message buffers the tests, transports, workloads and the flow engine
//! send from and receive into.
//!
//! A copy between the kernel and a buffer that does not start on a page
//! boundary can run at half the rate of one that does, so every message
//! buffer comes from an allocation aligned to the page, and its data starts
//! `offset` bytes past an `align`-byte boundary (NetPIPE's `-A` and `-O`).
//! By default the data starts on a page boundary.
//!
//! So a buffer takes at least a page ([`AlignedBuffer::footprint_bytes`]),
//! whatever its size: what would hold one per flow by the thousand shares
//! them instead, as the flow engine's workers do (`flows::buffers`).

use netgap_core::spec::TransportOptions;
use std::alloc::Layout;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The page size used when the system does not say (the smallest Linux
/// page).
const FALLBACK_PAGE_BYTES: usize = 4096;

/// This host's page size in bytes.
pub fn page_bytes() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf only reads a system constant; it has no
        // preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n)
            .ok()
            .filter(|n| n.is_power_of_two())
            .unwrap_or(FALLBACK_PAGE_BYTES)
    })
}

/// Where a buffer's data starts: `offset_bytes` past an `align_bytes`
/// boundary. Made only checked ([`BufferLayout::new`]) or by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLayout {
    /// A power of two; the data's address modulo it is `offset_bytes`.
    align_bytes: usize,
    /// Below `align_bytes`.
    offset_bytes: usize,
}

impl Default for BufferLayout {
    /// Data on a page boundary.
    fn default() -> Self {
        BufferLayout {
            align_bytes: page_bytes(),
            offset_bytes: 0,
        }
    }
}

/// A buffer layout that cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The alignment is not a power of two.
    #[error("buffer alignment {0} bytes is not a power of two")]
    AlignNotPowerOfTwo(u64),
    /// The offset is not below the alignment.
    #[error(
        "buffer offset {offset_bytes} bytes is not below the alignment of {align_bytes} bytes"
    )]
    OffsetNotBelowAlign {
        /// The offset asked for.
        offset_bytes: u64,
        /// The alignment it must stay below.
        align_bytes: u64,
    },
    /// The allocation would be larger than the address space allows.
    #[error("a buffer of {size_bytes} bytes at this alignment and offset is too large")]
    TooLarge {
        /// The buffer's size.
        size_bytes: u64,
    },
    /// The allocator had no memory for the buffer.
    #[error("no memory for a buffer of {size_bytes} bytes")]
    OutOfMemory {
        /// The allocation's size.
        size_bytes: u64,
    },
}

impl BufferLayout {
    /// A checked layout: `align_bytes` a power of two (the page size when
    /// `None`), `offset_bytes` below it.
    pub fn new(align_bytes: Option<u64>, offset_bytes: u64) -> Result<BufferLayout, LayoutError> {
        let align = align_bytes.unwrap_or(page_bytes() as u64);
        if !align.is_power_of_two() {
            return Err(LayoutError::AlignNotPowerOfTwo(align));
        }
        if offset_bytes >= align {
            return Err(LayoutError::OffsetNotBelowAlign {
                offset_bytes,
                align_bytes: align,
            });
        }
        let too_large = LayoutError::TooLarge { size_bytes: align };
        Ok(BufferLayout {
            align_bytes: usize::try_from(align).map_err(|_| too_large.clone())?,
            offset_bytes: usize::try_from(offset_bytes).map_err(|_| too_large)?,
        })
    }

    /// The boundary the data is placed from, in bytes.
    pub fn align_bytes(&self) -> usize {
        self.align_bytes
    }

    /// Bytes past the boundary at which the data starts.
    pub fn offset_bytes(&self) -> usize {
        self.offset_bytes
    }

    /// The layout a point's transport options ask for (their
    /// `buffer_align_bytes` and `buffer_offset_bytes`).
    pub fn of_options(options: &TransportOptions) -> Result<BufferLayout, LayoutError> {
        BufferLayout::new(
            options.buffer_align_bytes.map(u64::from),
            u64::from(options.buffer_offset_bytes),
        )
    }

    /// The allocation for `len_bytes` of data at this layout: aligned to the
    /// larger of the page and `align_bytes` (both powers of two, so the
    /// larger is a multiple of the smaller), with `offset_bytes` before the
    /// data and at least one byte in all.
    fn allocation(&self, len_bytes: usize) -> Result<Layout, LayoutError> {
        let too_large = LayoutError::TooLarge {
            size_bytes: len_bytes as u64,
        };
        let size = self
            .offset_bytes
            .checked_add(len_bytes.max(1))
            .ok_or_else(|| too_large.clone())?;
        Layout::from_size_align(size, self.align_bytes.max(page_bytes())).map_err(|_| too_large)
    }
}

/// A byte buffer whose data starts where its [`BufferLayout`] says; it
/// reads and writes as a `[u8]` and frees its memory when dropped.
pub struct AlignedBuffer {
    /// The start of the allocation (not of the data).
    base: NonNull<u8>,
    /// What was allocated, for the free.
    alloc: Layout,
    /// Bytes from `base` to the data.
    offset_bytes: usize,
    /// Bytes of data.
    len_bytes: usize,
}

// SAFETY: an AlignedBuffer owns its allocation alone, as a Box<[u8]> does:
// no other value holds its pointer, so moving it to another thread moves
// the only access to the memory.
unsafe impl Send for AlignedBuffer {}
// SAFETY: through a shared reference the buffer hands out only `&[u8]`
// (no interior mutability), so sharing it between threads is as sound as
// sharing a `&[u8]`.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// `len_bytes` zero bytes at `layout`, or why they cannot be had.
    pub fn try_zeroed(
        len_bytes: usize,
        layout: BufferLayout,
    ) -> Result<AlignedBuffer, LayoutError> {
        let alloc = layout.allocation(len_bytes)?;
        // SAFETY: `alloc` has a non-zero size (at least one byte of data)
        // and a power-of-two alignment, as Layout guarantees.
        let raw = unsafe { std::alloc::alloc_zeroed(alloc) };
        // A failed allocation is an error the caller can refuse the point
        // with, not an abort: a peer's layout must never end the agent.
        let base = NonNull::new(raw).ok_or(LayoutError::OutOfMemory {
            size_bytes: alloc.size() as u64,
        })?;
        Ok(AlignedBuffer {
            base,
            alloc,
            offset_bytes: layout.offset_bytes,
            len_bytes,
        })
    }

    /// `len_bytes` zero bytes at `layout`.
    ///
    /// # Panics
    ///
    /// As `vec![0u8; len_bytes]` does, when the buffer would not fit in the
    /// address space; message sizes are checked long before (at most
    /// `netgap_core::spec::MAX_SIZE_BYTES`), so a run never gets here.
    pub fn zeroed(len_bytes: usize, layout: BufferLayout) -> AlignedBuffer {
        match AlignedBuffer::try_zeroed(len_bytes, layout) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        }
    }

    /// The address of the first data byte.
    pub fn data_addr(&self) -> usize {
        self.as_ptr() as usize
    }

    /// The heap bytes this buffer takes, in whole units of its allocation's
    /// alignment: the offset, the data and the rest of the last unit, which
    /// the allocator's padding to the next boundary makes its own. At the
    /// default layout that is whole pages, so a 1-byte buffer takes a page.
    pub fn footprint_bytes(&self) -> usize {
        // The allocation's size is at most isize::MAX and its alignment a
        // power of two, so rounding up overflows only past usize::MAX,
        // where saturating is the honest answer.
        let align = self.alloc.align();
        self.alloc
            .size()
            .checked_next_multiple_of(align)
            .unwrap_or(usize::MAX)
    }
}

impl Deref for AlignedBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the allocation holds `offset_bytes + len_bytes` bytes (or
        // one more, when `len_bytes` is 0), all initialised by alloc_zeroed,
        // so the data range is in bounds and initialised; `&self` ties the
        // slice's lifetime to the buffer, which frees the memory only in
        // drop.
        unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().add(self.offset_bytes), self.len_bytes)
        }
    }
}

impl DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference
        // to the data while the slice lives.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.as_ptr().add(self.offset_bytes),
                self.len_bytes,
            )
        }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc_zeroed` with exactly `alloc` and
        // is freed only here, once.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.alloc) }
    }
}

impl Clone for AlignedBuffer {
    fn clone(&self) -> Self {
        // Same alignment and offset; that layout was valid for `self`, so
        // it is again.
        let layout = BufferLayout {
            align_bytes: self.alloc.align(),
            offset_bytes: self.offset_bytes,
        };
        let mut copy = AlignedBuffer::zeroed(self.len_bytes, layout);
        copy.copy_from_slice(self);
        copy
    }
}

impl fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuffer")
            .field("len_bytes", &self.len_bytes)
            .field("align_bytes", &self.alloc.align())
            .field("offset_bytes", &self.offset_bytes)
            .finish()
    }
}

/// A message buffer of `size_bytes` at `layout`, filled with a fixed
/// pattern, so its pages are touched before timing starts.
///
/// # Panics
///
/// As [`AlignedBuffer::zeroed`].
pub fn message_buffer(size_bytes: usize, layout: BufferLayout) -> AlignedBuffer {
    let mut b = AlignedBuffer::zeroed(size_bytes, layout);
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_has_the_size_asked_and_the_pattern() {
        let b = message_buffer(300, BufferLayout::default());
        assert_eq!(b.len(), 300);
        assert_eq!((b[0], b[250], b[251]), (0, 250, 0));
    }

    #[test]
    fn by_default_the_data_starts_on_a_page() {
        for size in [0, 1, 4095, 65536] {
            let b = AlignedBuffer::zeroed(size, BufferLayout::default());
            assert_eq!(b.data_addr() % page_bytes(), 0, "size {size}");
            assert_eq!(b.len(), size);
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn the_offset_moves_the_data_from_the_align_boundary() {
        for (align, offset) in [(4096, 16), (4096, 4095), (64, 1), (1, 0), (1 << 16, 512)] {
            let layout = BufferLayout::new(Some(align), offset).unwrap();
            let mut b = message_buffer(1000, layout);
            assert_eq!(b.data_addr() as u64 % align, offset, "{align}/{offset}");
            b[999] = 7;
            assert_eq!(b[999], 7);
            let c = b.clone();
            assert_eq!(
                c.data_addr() as u64 % align,
                offset,
                "clone {align}/{offset}"
            );
            assert_eq!(&c[..], &b[..]);
        }
        let b = message_buffer(10, BufferLayout::new(None, 16).unwrap());
        assert_eq!(b.data_addr() % page_bytes(), 16);
    }

    #[test]
    fn the_footprint_is_whole_alignment_units() {
        let page = page_bytes();
        let one = AlignedBuffer::zeroed(1, BufferLayout::default());
        assert_eq!(one.footprint_bytes(), page);
        let over = AlignedBuffer::zeroed(page + 1, BufferLayout::default());
        assert_eq!(over.footprint_bytes(), 2 * page);
        let offset = AlignedBuffer::zeroed(page - 16, BufferLayout::new(None, 16).unwrap());
        assert_eq!(offset.footprint_bytes(), page);
        let big = BufferLayout::new(Some(1 << 16), 0).unwrap();
        assert_eq!(AlignedBuffer::zeroed(10, big).footprint_bytes(), 1 << 16);
    }

    #[test]
    fn bad_layouts_are_refused_with_what_was_wrong() {
        assert_eq!(
            BufferLayout::new(Some(3000), 0),
            Err(LayoutError::AlignNotPowerOfTwo(3000))
        );
        assert_eq!(
            BufferLayout::new(Some(64), 64),
            Err(LayoutError::OffsetNotBelowAlign {
                offset_bytes: 64,
                align_bytes: 64
            })
        );
        assert!(BufferLayout::new(Some(0), 0).is_err());
        let e = BufferLayout::new(None, 1 << 40).unwrap_err();
        assert!(e.to_string().contains("not below"), "{e}");
        assert!(AlignedBuffer::try_zeroed(usize::MAX, BufferLayout::default()).is_err());
    }
}
