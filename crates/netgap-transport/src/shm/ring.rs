//! The single-producer, single-consumer byte ring at the heart of the `shm`
//! transport, independent of how its memory was obtained (a shared mapping
//! in production, a heap block in the unit tests).
//!
//! A ring is a [`RingCtl`] block of indices plus a data region of
//! `capacity` bytes (a power of two). The producer index (`head`) and the
//! consumer index (`tail`) count bytes ever published and ever consumed; they
//! only grow, so `head - tail` is the number of bytes in the ring and never
//! exceeds `capacity`, and a byte at index `i` lives at offset
//! `i & (capacity - 1)`. Each side keeps its own index in private memory and
//! only *writes* it to the shared block (a `Release` store after the data is
//! copied); the other side's index is *read* (`Acquire`) only when the value
//! it cached last time cannot satisfy a request. That keeps each index's
//! cache line owned by its writer in the common case, so a small message
//! costs about two cache-line transfers one way (index, then data), as in the
//! C floor program.
//!
//! The peer is another process and is not trusted: every index read from
//! shared memory is checked against what this side knows (`tail ≤ head`,
//! `head - tail ≤ capacity`, and neither index may go backwards), and a
//! violation is a [`RingError`], never a panic or an out-of-bounds access.
//! Offsets into the data region are computed from this side's private index
//! only, so a corrupt shared index can at worst make us copy garbage bytes
//! that lie inside the region.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Distance in bytes between independently written words of a [`RingCtl`]:
/// two 64-byte cache lines, because x86 cores prefetch lines in adjacent
/// pairs and a neighbour's writes would otherwise still steal the line.
pub const LINE_BYTES: usize = 128;

/// One word alone on its own [`LINE_BYTES`]-byte line.
#[repr(C, align(128))]
pub struct Line<T>(pub T);

/// The shared control block of one ring. All-zero bytes are a valid, empty
/// ring. Every field is written by exactly one side:
///
/// | field | written by | read by |
/// |---|---|---|
/// | `head` | producer | consumer |
/// | `tail` | consumer | producer |
/// | `data_waiter` | consumer | producer |
/// | `space_waiter` | producer | consumer |
#[repr(C)]
pub struct RingCtl {
    /// Producer index: bytes ever published into the ring.
    pub head: Line<AtomicU64>,
    /// Consumer index: bytes ever consumed from the ring.
    pub tail: Line<AtomicU64>,
    /// Non-zero while the consumer is asleep (or about to sleep) on the futex
    /// word of `head`, so the producer must wake it after publishing.
    pub data_waiter: Line<AtomicU32>,
    /// Non-zero while the producer is asleep (or about to sleep) on the
    /// futex word of `tail`, so the consumer must wake it after consuming.
    pub space_waiter: Line<AtomicU32>,
}

/// Bytes a [`RingCtl`] occupies.
pub(crate) const CTL_BYTES: usize = std::mem::size_of::<RingCtl>();

const _: () = assert!(CTL_BYTES == 4 * LINE_BYTES);
const _: () = assert!(std::mem::align_of::<RingCtl>() == LINE_BYTES);

/// Byte offset of the low 32 bits inside a `u64`: futexes are 32-bit words,
/// and the low half of an index changes on every publish (the index moves by
/// at most `capacity` < 2^32 while a waiter watches it).
const LOW_HALF_OFFSET: usize = if cfg!(target_endian = "little") { 0 } else { 4 };

impl RingCtl {
    /// The 32-bit futex word that changes whenever `head` does.
    pub fn head_futex(&self) -> *const u32 {
        low_half(&self.head.0)
    }

    /// The 32-bit futex word that changes whenever `tail` does.
    pub fn tail_futex(&self) -> *const u32 {
        low_half(&self.tail.0)
    }
}

pub(crate) fn low_half(word: &AtomicU64) -> *const u32 {
    word.as_ptr()
        .cast::<u8>()
        .wrapping_add(LOW_HALF_OFFSET)
        .cast()
}

/// The peer broke the ring's invariants: the shared indices cannot be
/// trusted any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The producer index read from shared memory is impossible.
    BadHead {
        /// The value read.
        head: u64,
        /// This consumer's index.
        tail: u64,
        /// The last producer index seen before.
        last_head: u64,
        /// Ring capacity in bytes.
        capacity: u64,
    },
    /// The consumer index read from shared memory is impossible.
    BadTail {
        /// The value read.
        tail: u64,
        /// This producer's index.
        head: u64,
        /// The last consumer index seen before.
        last_tail: u64,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::BadHead {
                head,
                tail,
                last_head,
                capacity,
            } => write!(
                f,
                "shm ring corrupt: peer's producer index {head} is impossible \
                 (consumer index {tail}, last producer index {last_head}, capacity {capacity} B)"
            ),
            RingError::BadTail {
                tail,
                head,
                last_tail,
            } => write!(
                f,
                "shm ring corrupt: peer's consumer index {tail} is impossible \
                 (producer index {head}, last consumer index {last_tail})"
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// Copies at least this long go through [`copy_bytes`]'s distance check:
/// glibc on x86-64 copies anything shorter with vector loads and stores and
/// never with `rep movsb` (its threshold is at least 2048 bytes).
const COPY_BLOCK_BYTES: usize = 2048;

/// Copies `n` bytes from `src` to `dst` with the C library's `memcpy`,
/// steering around its one slow case. glibc copies 2 KiB to 1 MiB with
/// `rep movsb`, and on AMD Zen 4 (this project's machines) `rep movsb` drops
/// from ~350 to ~16 Gbit/s when the destination lies 1 to 63 bytes after the
/// source modulo 4 KiB (glibc avoids that "short distance" only on Intel).
/// A byte stream hits it easily: a ring offset left at an odd byte by small
/// messages meets a heap buffer at 16 bytes past a page. In that case the
/// copy goes in [`COPY_BLOCK_BYTES`] pieces, which glibc copies with vector
/// instructions at full speed whatever the alignment (measured: 330–350
/// Gbit/s for 256 KiB against 370 for an undisturbed `rep movsb`).
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`]: `src` valid for reads and `dst`
/// for writes of `n` bytes, not overlapping.
#[inline]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    if n <= SMALL_COPY_BYTES {
        // SAFETY: the caller's contract.
        unsafe { copy_small(src, dst, n) };
        return;
    }
    let distance = (dst as usize).wrapping_sub(src as usize) & 4095;
    if n <= COPY_BLOCK_BYTES || distance == 0 || distance >= 64 {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    let mut off = 0;
    while off < n {
        let k = (n - off).min(COPY_BLOCK_BYTES);
        // SAFETY: `off + k ≤ n`, so both pieces lie inside the caller's
        // ranges, which do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), k) };
        off += k;
    }
}

/// Copies this short are done in line (at most two overlapping loads and
/// stores) rather than by a call to the C library's `memcpy`.
const SMALL_COPY_BYTES: usize = 16;

/// Copies `n ≤ SMALL_COPY_BYTES` bytes as the C library does inside its
/// `memcpy`, without the call: a small message's copy in and copy out are
/// on a ping-pong's critical path twice per round trip.
///
/// # Safety
///
/// As for [`copy_bytes`].
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    debug_assert!(n <= SMALL_COPY_BYTES);
    // SAFETY: every access lies within `src[..n]` or `dst[..n]`, which the
    // caller guarantees valid; the unaligned forms make no assumption about
    // alignment.
    unsafe {
        if n >= 8 {
            let a = std::ptr::read_unaligned(src.cast::<u64>());
            let b = std::ptr::read_unaligned(src.add(n - 8).cast::<u64>());
            std::ptr::write_unaligned(dst.cast::<u64>(), a);
            std::ptr::write_unaligned(dst.add(n - 8).cast::<u64>(), b);
        } else if n >= 4 {
            let a = std::ptr::read_unaligned(src.cast::<u32>());
            let b = std::ptr::read_unaligned(src.add(n - 4).cast::<u32>());
            std::ptr::write_unaligned(dst.cast::<u32>(), a);
            std::ptr::write_unaligned(dst.add(n - 4).cast::<u32>(), b);
        } else if n > 0 {
            let (a, b, c) = (*src, *src.add(n / 2), *src.add(n - 1));
            *dst = a;
            *dst.add(n / 2) = b;
            *dst.add(n - 1) = c;
        }
    }
}

/// Where one ring lives: its control block and its data region.
#[derive(Clone, Copy)]
pub(crate) struct RingMem {
    ctl: NonNull<RingCtl>,
    data: NonNull<u8>,
    capacity: usize,
}

// SAFETY: a RingMem is two addresses and a length; the memory they name is
// only touched through atomics (control block) or raw-pointer copies of
// regions the ring protocol gives to one side at a time (data), so the
// handle may move between threads.
unsafe impl Send for RingMem {}

impl RingMem {
    /// Describes the ring whose control block is at `ctl` and whose data
    /// region of `capacity` bytes starts at `data`.
    ///
    /// # Safety
    ///
    /// `ctl` must be valid for reads and writes of a [`RingCtl`] (any bytes
    /// are valid; all zeroes is an empty ring) and `data` for reads and writes
    /// of `capacity` bytes, both for as long as any producer or consumer made
    /// from this value exists; the two must not overlap. `capacity` must be a
    /// power of two below 2^32.
    pub unsafe fn new(ctl: NonNull<RingCtl>, data: NonNull<u8>, capacity: usize) -> RingMem {
        debug_assert!(capacity.is_power_of_two() && (capacity as u64) < (1 << 32));
        RingMem {
            ctl,
            data,
            capacity,
        }
    }

    /// The shared control block.
    pub fn ctl(&self) -> &RingCtl {
        // SAFETY: `new`'s contract keeps the block valid while `self` is
        // used; it holds only atomics, which may be shared and mutated
        // concurrently by the peer.
        unsafe { self.ctl.as_ref() }
    }
}

/// The producing side of a ring: copies bytes in and publishes them.
pub(crate) struct Producer {
    mem: RingMem,
    /// This side's producer index (authoritative; the shared copy is only
    /// ever written from it).
    head: u64,
    /// The consumer index as last read from shared memory.
    cached_tail: u64,
}

/// The consuming side of a ring: copies bytes out and releases the space.
pub(crate) struct Consumer {
    mem: RingMem,
    /// This side's consumer index (authoritative).
    tail: u64,
    /// The producer index as last read from shared memory.
    cached_head: u64,
}

impl Producer {
    /// The producer of the ring in `mem`, starting at the indices found in
    /// its control block.
    ///
    /// Both ends of a ring must start at the same indices; the transport
    /// creates the rings zeroed, so both start at 0.
    pub fn new(mem: RingMem) -> Result<Producer, RingError> {
        let head = mem.ctl().head.0.load(Ordering::Acquire);
        let mut p = Producer {
            mem,
            head,
            cached_tail: head.saturating_sub(mem.capacity as u64),
        };
        p.refresh_tail()?;
        Ok(p)
    }

    /// The shared memory of this ring.
    pub fn mem(&self) -> &RingMem {
        &self.mem
    }

    /// This side's producer index: bytes published so far.
    #[cfg(test)]
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The consumer index as last read (what a futex waiter compares with).
    pub fn cached_tail(&self) -> u64 {
        self.cached_tail
    }

    /// Re-reads the consumer index, checking it; returns the free space in
    /// bytes.
    pub fn refresh_tail(&mut self) -> Result<u64, RingError> {
        let tail = self.mem.ctl().tail.0.load(Ordering::Acquire);
        // `cached_tail ≥ head - capacity` holds by construction, so these
        // two checks also bound `head - tail` by the capacity.
        if tail < self.cached_tail || tail > self.head {
            return Err(RingError::BadTail {
                tail,
                head: self.head,
                last_tail: self.cached_tail,
            });
        }
        self.cached_tail = tail;
        Ok(self.free_cached())
    }

    fn free_cached(&self) -> u64 {
        self.mem.capacity as u64 - (self.head - self.cached_tail)
    }

    /// Copies up to `min(buf.len(), max_bytes)` bytes into the ring and
    /// publishes them; returns how many went in (0: the ring is full). The
    /// consumer index is re-read only when the cached one leaves too little
    /// room for the whole request.
    #[inline]
    pub fn try_write(&mut self, buf: &[u8], max_bytes: usize) -> Result<usize, RingError> {
        let want = buf.len().min(max_bytes) as u64;
        let mut free = self.free_cached();
        if free < want {
            free = self.refresh_tail()?;
        }
        let n = want.min(free) as usize;
        if n == 0 {
            return Ok(0);
        }
        let cap = self.mem.capacity;
        let off = (self.head as usize) & (cap - 1);
        let first = n.min(cap - off);
        // SAFETY: `off < cap` and `off + first ≤ cap`, and the wrapped rest
        // `n - first ≤ cap` starts at offset 0, so both copies stay inside
        // the data region (`RingMem::new`'s contract); `buf` holds at least
        // `n` bytes and is private memory, so it cannot overlap the region.
        // Under the ring protocol the consumer does not touch these bytes
        // until `head` is published below; a misbehaving peer can only race
        // on bytes of its own shared mapping, never on our private memory.
        unsafe {
            let dst = self.mem.data.as_ptr();
            copy_bytes(buf.as_ptr(), dst.add(off), first);
            copy_bytes(buf.as_ptr().add(first), dst, n - first);
        }
        self.head += n as u64;
        self.mem.ctl().head.0.store(self.head, Ordering::Release);
        Ok(n)
    }
}

impl Consumer {
    /// The consumer of the ring in `mem`, starting at the indices found in
    /// its control block.
    pub fn new(mem: RingMem) -> Result<Consumer, RingError> {
        let tail = mem.ctl().tail.0.load(Ordering::Acquire);
        let mut c = Consumer {
            mem,
            tail,
            cached_head: tail,
        };
        c.refresh_head()?;
        Ok(c)
    }

    /// The shared memory of this ring.
    pub fn mem(&self) -> &RingMem {
        &self.mem
    }

    /// The producer index as last read (what a futex waiter compares with).
    pub fn cached_head(&self) -> u64 {
        self.cached_head
    }

    /// Re-reads the producer index, checking it; returns the bytes
    /// available.
    pub fn refresh_head(&mut self) -> Result<u64, RingError> {
        let head = self.mem.ctl().head.0.load(Ordering::Acquire);
        if head < self.cached_head || head - self.tail > self.mem.capacity as u64 {
            return Err(RingError::BadHead {
                head,
                tail: self.tail,
                last_head: self.cached_head,
                capacity: self.mem.capacity as u64,
            });
        }
        self.cached_head = head;
        Ok(head - self.tail)
    }

    /// Copies up to `min(buf.len(), max_bytes)` bytes out of the ring and
    /// releases their space; returns how many (0: the ring is empty). The
    /// producer index is re-read only when the cached one shows too few
    /// bytes for the whole request.
    #[inline]
    pub fn try_read(&mut self, buf: &mut [u8], max_bytes: usize) -> Result<usize, RingError> {
        let want = buf.len().min(max_bytes) as u64;
        let mut avail = self.cached_head - self.tail;
        if avail < want {
            avail = self.refresh_head()?;
        }
        let n = want.min(avail) as usize;
        if n == 0 {
            return Ok(0);
        }
        let cap = self.mem.capacity;
        let off = (self.tail as usize) & (cap - 1);
        let first = n.min(cap - off);
        // SAFETY: as in `Producer::try_write`: both source ranges lie inside
        // the data region, `buf` is private memory of at least `n` bytes,
        // and the producer does not write these bytes until `tail` is
        // published below.
        unsafe {
            let src = self.mem.data.as_ptr();
            copy_bytes(src.add(off), buf.as_mut_ptr(), first);
            copy_bytes(src, buf.as_mut_ptr().add(first), n - first);
        }
        self.tail += n as u64;
        self.mem.ctl().tail.0.store(self.tail, Ordering::Release);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{alloc_zeroed, dealloc, Layout};

    /// A zeroed heap block holding one ring.
    struct HeapRing {
        ptr: NonNull<u8>,
        layout: Layout,
        capacity: usize,
    }

    impl HeapRing {
        fn new(capacity: usize) -> HeapRing {
            let layout = Layout::from_size_align(CTL_BYTES + capacity, 4096).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            HeapRing {
                ptr,
                layout,
                capacity,
            }
        }

        fn mem(&self) -> RingMem {
            // SAFETY: the block holds a zeroed control block followed by
            // `capacity` data bytes and outlives every use in these tests.
            unsafe {
                RingMem::new(
                    self.ptr.cast(),
                    NonNull::new(self.ptr.as_ptr().add(CTL_BYTES)).unwrap(),
                    self.capacity,
                )
            }
        }
    }

    impl Drop for HeapRing {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    fn pattern(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 7 + seed) % 251) as u8).collect()
    }

    #[test]
    fn layout_keeps_indices_on_separate_lines() {
        let r = HeapRing::new(64);
        let ctl = r.mem();
        let ctl = ctl.ctl();
        let base = ctl as *const RingCtl as usize;
        let head = ctl.head.0.as_ptr() as usize - base;
        let tail = ctl.tail.0.as_ptr() as usize - base;
        let dw = ctl.data_waiter.0.as_ptr() as usize - base;
        let sw = ctl.space_waiter.0.as_ptr() as usize - base;
        assert_eq!((head, tail, dw, sw), (0, 128, 256, 384));
        assert_eq!(ctl.head_futex() as usize - base, 0);
    }

    #[test]
    fn wraps_around_and_keeps_order() {
        let r = HeapRing::new(64);
        let mut p = Producer::new(r.mem()).unwrap();
        let mut c = Consumer::new(r.mem()).unwrap();
        let mut out = Vec::new();
        let mut sent = Vec::new();
        // 40-byte writes and 40-byte reads against a 64-byte ring cross the
        // end of the data region on most turns.
        for round in 0..50 {
            let msg = pattern(40, round);
            assert_eq!(p.try_write(&msg, usize::MAX).unwrap(), 40);
            sent.extend_from_slice(&msg);
            let mut buf = [0u8; 40];
            assert_eq!(c.try_read(&mut buf, usize::MAX).unwrap(), 40);
            out.extend_from_slice(&buf);
        }
        assert_eq!(out, sent);
        assert_eq!(p.head(), 2000);
    }

    #[test]
    fn full_ring_takes_nothing_until_space_is_released() {
        let r = HeapRing::new(64);
        let mut p = Producer::new(r.mem()).unwrap();
        let mut c = Consumer::new(r.mem()).unwrap();
        let msg = pattern(100, 1);
        assert_eq!(p.try_write(&msg, usize::MAX).unwrap(), 64);
        assert_eq!(p.try_write(&msg[64..], usize::MAX).unwrap(), 0);
        let mut buf = [0u8; 10];
        assert_eq!(c.try_read(&mut buf, usize::MAX).unwrap(), 10);
        assert_eq!(&buf, &msg[..10]);
        assert_eq!(p.try_write(&msg[64..], usize::MAX).unwrap(), 10);
        let mut rest = [0u8; 100];
        assert_eq!(c.try_read(&mut rest, usize::MAX).unwrap(), 64);
        assert_eq!(&rest[..64], &msg[10..74]);
        assert_eq!(c.try_read(&mut rest, usize::MAX).unwrap(), 0);
    }

    #[test]
    fn partial_reads_and_chunk_limits() {
        let r = HeapRing::new(1024);
        let mut p = Producer::new(r.mem()).unwrap();
        let mut c = Consumer::new(r.mem()).unwrap();
        let msg = pattern(700, 3);
        assert_eq!(p.try_write(&msg, 300).unwrap(), 300);
        assert_eq!(p.try_write(&msg[300..], usize::MAX).unwrap(), 400);
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        loop {
            let n = c.try_read(&mut buf, 100).unwrap();
            if n == 0 {
                break;
            }
            assert!(n <= 100);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, msg);
    }

    #[test]
    fn empty_ring_reads_nothing() {
        let r = HeapRing::new(64);
        let mut c = Consumer::new(r.mem()).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(c.try_read(&mut buf, usize::MAX).unwrap(), 0);
    }

    #[test]
    fn corrupt_head_is_an_error() {
        let r = HeapRing::new(64);
        let mem = r.mem();
        let mut c = Consumer::new(mem).unwrap();
        let mut buf = [0u8; 8];
        // More bytes than the ring holds.
        mem.ctl().head.0.store(65, Ordering::Release);
        let e = c.try_read(&mut buf, usize::MAX).unwrap_err();
        assert!(matches!(e, RingError::BadHead { head: 65, .. }), "{e}");
        assert!(e.to_string().contains("producer index 65"));
        // A head that moved backwards.
        mem.ctl().head.0.store(10, Ordering::Release);
        assert_eq!(c.try_read(&mut buf, usize::MAX).unwrap(), 8);
        mem.ctl().head.0.store(5, Ordering::Release);
        assert!(c.try_read(&mut buf, usize::MAX).is_err());
        // Garbage far away, including values that would overflow.
        mem.ctl().head.0.store(u64::MAX, Ordering::Release);
        assert!(c.try_read(&mut buf, usize::MAX).is_err());
    }

    #[test]
    fn corrupt_tail_is_an_error() {
        let r = HeapRing::new(64);
        let mem = r.mem();
        let mut p = Producer::new(mem).unwrap();
        assert_eq!(p.try_write(&[1u8; 64], usize::MAX).unwrap(), 64);
        // Consumer claims to have read more than was written.
        mem.ctl().tail.0.store(100, Ordering::Release);
        let e = p.try_write(&[1u8; 8], usize::MAX).unwrap_err();
        assert!(matches!(e, RingError::BadTail { tail: 100, .. }), "{e}");
        // A tail that moved backwards.
        mem.ctl().tail.0.store(32, Ordering::Release);
        assert_eq!(p.try_write(&[1u8; 64], usize::MAX).unwrap(), 32);
        mem.ctl().tail.0.store(16, Ordering::Release);
        assert!(p.try_write(&[1u8; 8], usize::MAX).is_err());
    }

    #[test]
    fn construction_checks_the_shared_indices() {
        let r = HeapRing::new(64);
        let mem = r.mem();
        mem.ctl().head.0.store(1000, Ordering::Release);
        assert!(Consumer::new(mem).is_err());
        assert!(Producer::new(mem).is_err());
    }

    #[test]
    fn two_threads_move_a_long_stream() {
        let r = HeapRing::new(4096);
        let mem = r.mem();
        let total = 1 << 20;
        let data = pattern(total, 5);
        std::thread::scope(|s| {
            let src = &data;
            s.spawn(move || {
                let mut p = Producer::new(mem).unwrap();
                let mut off = 0;
                while off < total {
                    off += p
                        .try_write(&src[off..(off + 1000).min(total)], 777)
                        .unwrap();
                    std::hint::spin_loop();
                }
            });
            let mut c = Consumer::new(mem).unwrap();
            let mut got = vec![0u8; total];
            let mut off = 0;
            while off < total {
                off += c.try_read(&mut got[off..], 1500).unwrap();
                std::hint::spin_loop();
            }
            assert!(got == data);
        });
    }

    #[test]
    fn copies_of_every_short_length_move_exactly_their_bytes() {
        for n in 0..=40 {
            for (src_off, dst_off) in [(0, 0), (1, 0), (0, 3), (5, 7), (15, 9)] {
                let src = pattern(64, n);
                let mut dst = vec![0xEEu8; 64];
                // SAFETY: both ranges lie inside their 64-byte vectors
                // (offset at most 15, length at most 40), which are
                // distinct allocations.
                unsafe { copy_bytes(src.as_ptr().add(src_off), dst.as_mut_ptr().add(dst_off), n) };
                assert_eq!(
                    &dst[dst_off..dst_off + n],
                    &src[src_off..src_off + n],
                    "n={n}"
                );
                assert!(
                    dst[..dst_off]
                        .iter()
                        .chain(&dst[dst_off + n..])
                        .all(|&b| b == 0xEE),
                    "n={n}: a byte outside the copy changed"
                );
            }
        }
    }
}
