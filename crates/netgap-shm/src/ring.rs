//! The two ends of one ring: a [`Producer`] copies bytes in and publishes
//! them, a [`Consumer`] copies them out and releases their space (the
//! index discipline of the crate's docs).
//!
//! Both take `&self`: the preload library's connection is used by many
//! threads (its callers serialise each direction with a lock), the relay's
//! by one thread a direction, the `shm` transport's by its flow's halves.
//! A ring has one producer and one consumer at a time; that is the
//! caller's to keep, and a second one at once garbles the stream, never
//! memory outside the ring.
//!
//! The peer is another process and is not trusted: each index read from
//! the ring is checked against this end's own (`tail ≤ head ≤ tail +
//! capacity`, in wrapping order) and against the last value seen of it
//! (it never goes back), and a violation is a [`RingError`], never a panic
//! or an access outside the ring: every offset is an index masked by the
//! capacity, and every copy is at most the capacity long.

use crate::copy::copy_bytes;
use crate::layout::RingCtl;
use crate::region::Backing;
use crate::wait;
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The peer broke the ring's invariants: its indices cannot be trusted
/// any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The producer index read from the ring is impossible.
    BadHead {
        /// The value read.
        head: u64,
        /// The consumer's index.
        tail: u64,
        /// The last producer index seen before.
        last_head: u64,
        /// Ring capacity in bytes.
        capacity: u64,
    },
    /// The consumer index read from the ring is impossible.
    BadTail {
        /// The value read.
        tail: u64,
        /// The producer's index.
        head: u64,
        /// The last consumer index seen before.
        last_tail: u64,
        /// Ring capacity in bytes.
        capacity: u64,
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
                capacity,
            } => write!(
                f,
                "shm ring corrupt: peer's consumer index {tail} is impossible \
                 (producer index {head}, last consumer index {last_tail}, capacity {capacity} B)"
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// Where an end keeps its own index (the producer's `head`, the
/// consumer's `tail`): both write it through to the ring, which is what
/// the peer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnIndex {
    /// Read from the ring on every call: after `fork` the parent or the
    /// child may carry on with the end, so the ring is the only truth (the
    /// preload library, and the relay at its ends).
    InRing,
    /// A private copy: for an owner that never forks with its ends (the
    /// `shm` transport). Loading one's own index from the ring while the
    /// peer spins on it costs a cross-core transfer of its line on CPUs
    /// that hand a line to the core that last read it: on an AMD EPYC guest
    /// that was 35 ns of a one-way 1-byte message (0.127 µs against
    /// 0.092).
    Private,
}

/// Where one ring lives: its control block and its data.
#[derive(Clone, Copy)]
struct RingMem {
    ctl: NonNull<RingCtl>,
    data: NonNull<u8>,
    /// A power of two of at most [`crate::layout::MAX_CAPACITY_BYTES`].
    capacity: u64,
}

impl RingMem {
    #[inline]
    fn ctl(&self) -> &RingCtl {
        // SAFETY: `ctl` points at a control block inside the region, which
        // the end holding this value keeps alive (its `Arc<Backing>`); the
        // block holds only atomics, which the peer may change at any time.
        unsafe { self.ctl.as_ref() }
    }

    /// Copies `len ≤ capacity` bytes from `src` to the ring at index `at`,
    /// in at most two pieces.
    ///
    /// # Safety
    ///
    /// `src` valid for reads of `len` bytes, outside the region;
    /// `len ≤ capacity`.
    #[inline]
    unsafe fn copy_in(&self, at: u64, src: *const u8, len: usize) {
        let cap = self.capacity as usize;
        let off = (at & (self.capacity - 1)) as usize;
        let first = len.min(cap - off);
        debug_assert!(len <= cap);
        // SAFETY: `off + first ≤ cap` and `len - first ≤ cap`, so both
        // pieces lie in the ring's data, which spans `capacity` bytes of
        // the live region; `src` is valid per the contract and lies
        // outside the region, so the ranges do not overlap.
        unsafe {
            let base = self.data.as_ptr();
            copy_bytes(src, base.add(off), first);
            copy_bytes(src.add(first), base, len - first);
        }
    }

    /// Copies `len ≤ capacity` bytes from the ring at index `at` to `dst`.
    ///
    /// # Safety
    ///
    /// `dst` valid for writes of `len` bytes, outside the region;
    /// `len ≤ capacity`.
    #[inline]
    unsafe fn copy_out(&self, at: u64, dst: *mut u8, len: usize) {
        let cap = self.capacity as usize;
        let off = (at & (self.capacity - 1)) as usize;
        let first = len.min(cap - off);
        debug_assert!(len <= cap);
        // SAFETY: as in `copy_in`, the other way.
        unsafe {
            let base = self.data.as_ptr();
            copy_bytes(base.add(off), dst, first);
            copy_bytes(base, dst.add(first), len - first);
        }
    }
}

/// The total length of `iov`, saturating.
fn iov_total(iov: &[libc::iovec]) -> u64 {
    iov.iter()
        .fold(0u64, |a, v| a.saturating_add(v.iov_len as u64))
}

/// The producing end of a ring: copies bytes in and publishes them.
pub struct Producer {
    mem: RingMem,
    /// Where this end's index is read from.
    own: OwnIndex,
    /// The private copy of this end's index, kept only when `own` is
    /// [`OwnIndex::Private`].
    own_head: AtomicU64,
    /// The consumer's index as last read and checked: never ahead of the
    /// ring's (indices only grow), so room it shows is really free.
    cached_tail: AtomicU64,
    /// Keeps the region mapped while this end lives.
    _region: Arc<Backing>,
}

/// The consuming end of a ring: copies bytes out and releases their space.
pub struct Consumer {
    mem: RingMem,
    /// Where this end's index is read from.
    own: OwnIndex,
    /// The private copy of this end's index, kept only when `own` is
    /// [`OwnIndex::Private`].
    own_tail: AtomicU64,
    /// The producer's index as last read and checked: never ahead of the
    /// ring's, so bytes it shows are really there.
    cached_head: AtomicU64,
    /// Keeps the region mapped while this end lives.
    _region: Arc<Backing>,
}

// SAFETY: an end is addresses into a region its `Arc` keeps mapped, and a
// cache in an atomic; the region is touched only through atomics and
// copies of bytes the ring protocol gives this end, so an end may move to
// and be shared between threads (one producer and one consumer at a time
// is the caller's, see the module docs).
unsafe impl Send for Producer {}
// SAFETY: as above.
unsafe impl Sync for Producer {}
// SAFETY: as for `Producer`.
unsafe impl Send for Consumer {}
// SAFETY: as above.
unsafe impl Sync for Consumer {}

impl Producer {
    /// The producer of the ring whose control block is at `ctl` and whose
    /// `capacity` bytes of data start at `data`.
    ///
    /// # Safety
    ///
    /// Both lie inside `region`'s memory and do not overlap; `capacity` is
    /// a power of two of at most `MAX_CAPACITY_BYTES`.
    pub(crate) unsafe fn new(
        ctl: NonNull<RingCtl>,
        data: NonNull<u8>,
        capacity: u64,
        region: Arc<Backing>,
        own: OwnIndex,
    ) -> Producer {
        let mem = RingMem {
            ctl,
            data,
            capacity,
        };
        let head = mem.ctl().head.0.load(Ordering::Acquire);
        Producer {
            mem,
            own,
            own_head: AtomicU64::new(head),
            // As far back as the ring allows: the first write reads the
            // consumer's index.
            cached_tail: AtomicU64::new(head.wrapping_sub(capacity)),
            _region: region,
        }
    }

    /// Bytes of the ring.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.mem.capacity
    }

    /// The ring's control block.
    #[inline]
    pub fn ctl(&self) -> &RingCtl {
        self.mem.ctl()
    }

    /// The consumer's index word: what a side that never sleeps watches
    /// while the ring is full.
    #[inline]
    pub fn peer_index(&self) -> &AtomicU64 {
        &self.mem.ctl().tail.0
    }

    /// The consumer's index as last read (what a full ring's watcher
    /// compares [`Producer::peer_index`] with).
    #[inline]
    pub fn cached_tail(&self) -> u64 {
        self.cached_tail.load(Ordering::Relaxed)
    }

    /// This end's index: as the ring holds it (`Acquire`: after `fork`,
    /// another process holding this end may have written it), or its
    /// private copy.
    #[inline]
    fn head(&self) -> u64 {
        match self.own {
            OwnIndex::InRing => self.mem.ctl().head.0.load(Ordering::Acquire),
            OwnIndex::Private => self.own_head.load(Ordering::Relaxed),
        }
    }

    /// Free bytes for a write of `want` at `head`: from the cached tail
    /// when it shows enough, else read again.
    #[inline]
    fn room(&self, head: u64, want: u64) -> Result<u64, RingError> {
        let cap = self.mem.capacity;
        let used = head.wrapping_sub(self.cached_tail.load(Ordering::Relaxed));
        if used <= cap && cap - used >= want {
            return Ok(cap - used);
        }
        self.refresh(head)
    }

    /// Reads the consumer's index again and checks it (`last ≤ tail ≤
    /// head` and `head - tail ≤ capacity`, in wrapping order); the free
    /// bytes.
    #[inline]
    fn refresh(&self, head: u64) -> Result<u64, RingError> {
        let cap = self.mem.capacity;
        let tail = self.mem.ctl().tail.0.load(Ordering::Acquire);
        let last = self.cached_tail.load(Ordering::Relaxed);
        let used = head.wrapping_sub(tail);
        if used > cap || tail.wrapping_sub(last) > head.wrapping_sub(last) {
            return Err(RingError::BadTail {
                tail,
                head,
                last_tail: last,
                capacity: cap,
            });
        }
        self.cached_tail.store(tail, Ordering::Relaxed);
        Ok(cap - used)
    }

    #[inline]
    fn publish(&self, head: u64, n: u64) {
        let head = head.wrapping_add(n);
        if self.own == OwnIndex::Private {
            self.own_head.store(head, Ordering::Relaxed);
        }
        self.mem.ctl().head.0.store(head, Ordering::Release);
    }

    /// Copies up to `min(buf.len(), max_bytes)` bytes into the ring and
    /// publishes them; returns how many went in (0: the ring is full). The
    /// caller then takes the consumer's waiters
    /// ([`Producer::take_peer_waiters`]) unless the region is
    /// [`crate::Waits::Spin`].
    #[inline]
    pub fn try_write(&self, buf: &[u8], max_bytes: usize) -> Result<usize, RingError> {
        let head = self.head();
        let want = buf.len().min(max_bytes) as u64;
        let n = want.min(self.room(head, want)?);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: `buf` holds at least `n` bytes of this process's own
        // memory; `n ≤ room ≤ capacity`, and the bytes from `head` on are
        // free space the consumer does not read before the publish below.
        unsafe { self.mem.copy_in(head, buf.as_ptr(), n as usize) };
        self.publish(head, n);
        Ok(n as usize)
    }

    /// Copies as much of the iovecs as fits into the ring and publishes
    /// it; returns how many bytes went in.
    ///
    /// # Safety
    ///
    /// Every iovec valid for reads of its length, outside the region.
    #[inline]
    pub unsafe fn write_iov(&self, iov: &[libc::iovec]) -> Result<usize, RingError> {
        let head = self.head();
        let mut space = self.room(head, iov_total(iov))?;
        let mut at = head;
        for v in iov {
            if space == 0 {
                break;
            }
            let n = (v.iov_len as u64).min(space);
            // SAFETY: the iovec is valid for reads of `n ≤ iov_len` bytes
            // (contract); `n ≤ space ≤ capacity`, and the bytes from `at`
            // on are free.
            unsafe { self.mem.copy_in(at, v.iov_base.cast(), n as usize) };
            at = at.wrapping_add(n);
            space -= n;
        }
        let n = at.wrapping_sub(head);
        if n > 0 {
            self.publish(head, n);
        }
        Ok(n as usize)
    }

    /// Fills the ring's free space directly with `fill`, which gets one
    /// contiguous piece (a pointer valid for writes of the length given,
    /// at most `max`) and returns how many bytes it wrote; publishes them.
    /// Ok(Ok(0)): the ring is full (or `max` is 0).
    pub fn write_with<E>(
        &self,
        max: usize,
        fill: impl FnOnce(*mut u8, usize) -> Result<usize, E>,
    ) -> Result<Result<usize, E>, RingError> {
        let head = self.head();
        let cap = self.mem.capacity;
        let off = head & (cap - 1);
        let want = (max as u64).min(cap - off);
        let n = want.min(self.room(head, want)?);
        if n == 0 {
            return Ok(Ok(0));
        }
        // SAFETY: `off + n ≤ capacity`: the piece lies in the ring's data,
        // in free space the consumer does not read before the publish.
        let dst = unsafe { self.mem.data.as_ptr().add(off as usize) };
        Ok(fill(dst, n as usize).map(|k| {
            let k = (k as u64).min(n);
            if k > 0 {
                self.publish(head, k);
            }
            k as usize
        }))
    }

    /// Bytes published and not yet consumed, read afresh.
    pub fn unconsumed(&self) -> Result<u64, RingError> {
        let free = self.refresh(self.head())?;
        Ok(self.mem.capacity - free)
    }

    /// Whether the ring is full, read afresh.
    pub fn is_full(&self) -> Result<bool, RingError> {
        Ok(self.refresh(self.head())? == 0)
    }

    /// Takes back every byte published and not consumed, consuming them as
    /// the consumer would: for a peer that never mapped the region, these
    /// bytes must go another way.
    pub fn take_back(&self) -> Result<Vec<u8>, RingError> {
        let head = self.head();
        let n = self.mem.capacity - self.refresh(head)?;
        let tail = head.wrapping_sub(n);
        let mut out = vec![0u8; n as usize];
        // SAFETY: `out` is this process's memory, valid for writes of
        // `n ≤ capacity` bytes.
        unsafe { self.mem.copy_out(tail, out.as_mut_ptr(), n as usize) };
        self.mem.ctl().tail.0.store(head, Ordering::Release);
        self.cached_tail.store(head, Ordering::Relaxed);
        Ok(out)
    }

    /// After a publish: fences, then takes the consumer's waiters
    /// ([`wait::take`]; `claim` runs first when there are any) and returns
    /// their bits, futex sleepers already woken.
    #[inline]
    pub fn take_peer_waiters(&self, claim: impl FnOnce()) -> Option<u32> {
        fence(Ordering::SeqCst);
        wait::take(&self.mem.ctl().data_waiter.0, claim)
    }

    /// This end's waiter word (it waits for space).
    #[inline]
    pub fn waiter(&self) -> &AtomicU32 {
        &self.mem.ctl().space_waiter.0
    }

    /// Announces a wait for space ([`wait::arm`]); the caller looks at the
    /// ring again before it sleeps.
    #[inline]
    pub fn arm(&self, bit: u32) -> u32 {
        wait::arm(self.waiter(), bit)
    }

    /// Withdraws a wait for space that found room without sleeping.
    #[inline]
    pub fn disarm(&self, bit: u32) {
        wait::disarm(self.waiter(), bit);
    }

    /// Sleeps until the consumer makes room (or `timeout` passes), with
    /// what [`Producer::arm`] returned.
    pub fn sleep(&self, armed: u32, timeout: Duration) -> io::Result<()> {
        wait::futex_wait(self.waiter(), armed, timeout)
    }

    /// Withdraws every wait of this end for space (it is closing).
    pub fn clear_waits(&self) {
        self.waiter().swap(0, Ordering::SeqCst);
    }

    /// Raises the closing hint: this end's process closed or shut down its
    /// sending side.
    pub fn hint_closing(&self) {
        self.mem.ctl().closing.0.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
    }

    /// Wakes the consumer's blocking sleepers without taking its waiter
    /// word (see [`wait::wake_sleepers`]).
    pub fn wake_peer_sleepers(&self) {
        wait::wake_sleepers(&self.mem.ctl().data_waiter.0);
    }
}

impl Consumer {
    /// The consumer of the ring whose control block is at `ctl` and whose
    /// `capacity` bytes of data start at `data`.
    ///
    /// # Safety
    ///
    /// As for [`Producer::new`].
    pub(crate) unsafe fn new(
        ctl: NonNull<RingCtl>,
        data: NonNull<u8>,
        capacity: u64,
        region: Arc<Backing>,
        own: OwnIndex,
    ) -> Consumer {
        let mem = RingMem {
            ctl,
            data,
            capacity,
        };
        let tail = mem.ctl().tail.0.load(Ordering::Acquire);
        Consumer {
            mem,
            own,
            own_tail: AtomicU64::new(tail),
            // Nothing seen yet: the first read reads the producer's index.
            cached_head: AtomicU64::new(tail),
            _region: region,
        }
    }

    /// Bytes of the ring.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.mem.capacity
    }

    /// The ring's control block.
    #[inline]
    pub fn ctl(&self) -> &RingCtl {
        self.mem.ctl()
    }

    /// The producer's index word: what a side that never sleeps watches
    /// while the ring is empty.
    #[inline]
    pub fn peer_index(&self) -> &AtomicU64 {
        &self.mem.ctl().head.0
    }

    /// The producer's index as last read (what an empty ring's watcher
    /// compares [`Consumer::peer_index`] with).
    #[inline]
    pub fn cached_head(&self) -> u64 {
        self.cached_head.load(Ordering::Relaxed)
    }

    /// This end's index, as [`Producer`]'s.
    #[inline]
    fn tail(&self) -> u64 {
        match self.own {
            OwnIndex::InRing => self.mem.ctl().tail.0.load(Ordering::Acquire),
            OwnIndex::Private => self.own_tail.load(Ordering::Relaxed),
        }
    }

    /// Bytes ready for a read of `want` at `tail`: from the cached head
    /// when it shows enough, else read again.
    #[inline]
    fn ready(&self, tail: u64, want: u64) -> Result<u64, RingError> {
        let ready = self.cached_head.load(Ordering::Relaxed).wrapping_sub(tail);
        if ready <= self.mem.capacity && ready >= want {
            return Ok(ready);
        }
        self.refresh(tail)
    }

    /// Reads the producer's index again and checks it (`tail ≤ head ≤
    /// tail + capacity`, and not behind the last head seen while that one
    /// is still ahead of `tail`); the bytes ready.
    #[inline]
    fn refresh(&self, tail: u64) -> Result<u64, RingError> {
        let cap = self.mem.capacity;
        let head = self.mem.ctl().head.0.load(Ordering::Acquire);
        let last = self.cached_head.load(Ordering::Relaxed);
        let ready = head.wrapping_sub(tail);
        // After `fork` another process of this end may have consumed past
        // `last`; a cache behind `tail` says nothing.
        let seen = last.wrapping_sub(tail);
        if ready > cap || (seen <= cap && ready < seen) {
            return Err(RingError::BadHead {
                head,
                tail,
                last_head: last,
                capacity: cap,
            });
        }
        self.cached_head.store(head, Ordering::Relaxed);
        Ok(ready)
    }

    #[inline]
    fn release(&self, tail: u64, n: u64) {
        let tail = tail.wrapping_add(n);
        if self.own == OwnIndex::Private {
            self.own_tail.store(tail, Ordering::Relaxed);
        }
        self.mem.ctl().tail.0.store(tail, Ordering::Release);
    }

    /// Bytes ready to read, read afresh.
    pub fn available(&self) -> Result<u64, RingError> {
        self.refresh(self.tail())
    }

    /// Copies up to `min(buf.len(), max_bytes)` bytes out of the ring and
    /// releases their space; returns how many (0: the ring is empty). The
    /// caller then takes the producer's waiters
    /// ([`Consumer::take_peer_waiters`]) unless the region is
    /// [`crate::Waits::Spin`].
    #[inline]
    pub fn try_read(&self, buf: &mut [u8], max_bytes: usize) -> Result<usize, RingError> {
        let tail = self.tail();
        let want = buf.len().min(max_bytes) as u64;
        let n = want.min(self.ready(tail, want)?);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: `buf` holds at least `n` bytes of this process's own
        // memory; `n ≤ ready ≤ capacity`, bytes the producer published and
        // does not write again before the release below.
        unsafe { self.mem.copy_out(tail, buf.as_mut_ptr(), n as usize) };
        self.release(tail, n);
        Ok(n as usize)
    }

    /// Copies up to `buf.len()` bytes out of the ring without consuming
    /// them.
    pub fn peek(&self, buf: &mut [u8]) -> Result<usize, RingError> {
        let tail = self.tail();
        let want = buf.len() as u64;
        let n = want.min(self.ready(tail, want)?);
        // SAFETY: as in `try_read`.
        unsafe { self.mem.copy_out(tail, buf.as_mut_ptr(), n as usize) };
        Ok(n as usize)
    }

    /// Copies up to the iovecs' total out of the ring, in order; consumes
    /// the bytes unless `peek`. Returns how many bytes it copied.
    ///
    /// # Safety
    ///
    /// Every iovec valid for writes of its length, outside the region.
    #[inline]
    pub unsafe fn read_iov(&self, iov: &[libc::iovec], peek: bool) -> Result<usize, RingError> {
        let tail = self.tail();
        let mut left = self.ready(tail, iov_total(iov))?;
        let mut at = tail;
        for v in iov {
            if left == 0 {
                break;
            }
            let n = (v.iov_len as u64).min(left);
            // SAFETY: the iovec is valid for writes of `n ≤ iov_len` bytes
            // (contract); `n ≤ left ≤ capacity`, published bytes.
            unsafe { self.mem.copy_out(at, v.iov_base.cast(), n as usize) };
            at = at.wrapping_add(n);
            left -= n;
        }
        let n = at.wrapping_sub(tail);
        if n > 0 && !peek {
            self.release(tail, n);
        }
        Ok(n as usize)
    }

    /// After a release: fences, then takes the producer's waiters (as
    /// [`Producer::take_peer_waiters`]).
    #[inline]
    pub fn take_peer_waiters(&self, claim: impl FnOnce()) -> Option<u32> {
        fence(Ordering::SeqCst);
        wait::take(&self.mem.ctl().space_waiter.0, claim)
    }

    /// This end's waiter word (it waits for data).
    #[inline]
    pub fn waiter(&self) -> &AtomicU32 {
        &self.mem.ctl().data_waiter.0
    }

    /// Announces a wait for data ([`wait::arm`]); the caller looks at the
    /// ring again before it sleeps.
    #[inline]
    pub fn arm(&self, bit: u32) -> u32 {
        wait::arm(self.waiter(), bit)
    }

    /// Withdraws a wait for data that found bytes without sleeping.
    #[inline]
    pub fn disarm(&self, bit: u32) {
        wait::disarm(self.waiter(), bit);
    }

    /// Sleeps until the producer publishes (or `timeout` passes), with
    /// what [`Consumer::arm`] returned.
    pub fn sleep(&self, armed: u32, timeout: Duration) -> io::Result<()> {
        wait::futex_wait(self.waiter(), armed, timeout)
    }

    /// Withdraws every wait of this end for data (it is closing).
    pub fn clear_waits(&self) {
        self.waiter().swap(0, Ordering::SeqCst);
    }

    /// Whether the producer's end raised its closing hint.
    #[inline]
    pub fn peer_closing(&self) -> bool {
        self.mem.ctl().closing.0.load(Ordering::Acquire) != 0
    }

    /// Wakes the producer's blocking sleepers without taking its waiter
    /// word (see [`wait::wake_sleepers`]).
    pub fn wake_peer_sleepers(&self) {
        wait::wake_sleepers(&self.mem.ctl().space_waiter.0);
    }
}
