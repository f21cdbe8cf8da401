//! The shared-memory channel of one taken-over connection: a memfd mapped
//! by both ends holding two single-producer, single-consumer byte rings,
//! one per direction, as `netgap_shm` lays a region out and moves bytes
//! through it (its index discipline and wake rule). What this module adds
//! is the connection's: the connector makes the region, the listener
//! checks what it takes; each end records its socket's inode and how it
//! ended its side in the header; and the doorbells.
//!
//! Wake-ups: a side about to wait sets the ring's waiter word; the other
//! side, after moving an index, clears it and sends one byte (a doorbell)
//! over the connection's kernel TCP socket, which makes the waiter's
//! descriptor readable to `poll` and `epoll` as the program expects. A
//! reader first watches the ring for a short while (`conn::spin_until`),
//! so a reply that comes within it crosses without a doorbell or a sleep;
//! only a reader that really sleeps costs the writer a kernel call. A
//! doorbell is counted as on its way (`Header::ringing`) before the waiter
//! bits are taken, so an end that closes waits for those in flight.

use netgap_shm::layout::{self as lay, HEADER_BYTES};
use netgap_shm::wait as w;
use netgap_shm::{Consumer, Expect, HeaderFields, Producer, Region, Waits};
use std::io;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

/// How the peer ended its side, as its processes left it in the region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PeerEnd {
    /// It closed or shut down its sending side.
    pub(crate) fin: bool,
    /// It closed, and no other process held it.
    pub(crate) closed: bool,
}

/// What a region's header says, read through its file (see
/// [`read_header`]).
pub(crate) struct HeaderInfo {
    /// Bytes of each ring.
    pub(crate) capacity: usize,
    /// Socket inodes of the connector's and the listener's end.
    pub(crate) connector_ino: u64,
    pub(crate) listener_ino: u64,
}

/// Reads the header of the region file `fd` without mapping it: None if
/// it is not a region of this layout for a connection of this library.
pub(crate) fn read_header(fd: libc::c_int) -> Option<HeaderInfo> {
    let mut buf = [0u8; HEADER_BYTES];
    // SAFETY: `buf` is valid for writes of its length.
    let r = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if r != buf.len() as isize {
        return None;
    }
    let h = HeaderFields::parse(&buf).ok()?;
    let ok = h.waits == Waits::Sleep
        && (u64::from(netgap_proto::preload::MIN_RING_BYTES)
            ..=u64::from(netgap_proto::preload::MAX_RING_BYTES))
            .contains(&h.capacity);
    ok.then_some(HeaderInfo {
        capacity: h.capacity as usize,
        connector_ino: h.connector_ino,
        listener_ino: h.listener_ino,
    })
}

/// Which end of the connection this process is: the connector made the
/// region, sent the hello and handed the region over (`connect`); the
/// listener mapped the region handed over through the mailbox (`accept`).
pub(crate) use netgap_shm::Role;

/// The peer broke the ring's invariants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Corrupt;

/// Outcome of moving bytes through a ring.
pub(crate) struct Moved {
    /// Bytes moved.
    pub(crate) bytes: usize,
    /// The peer waits on this ring and must be sent a doorbell.
    pub(crate) wake_peer: bool,
}

/// The mapped region and this end's two rings.
pub(crate) struct Channel {
    region: Region,
    /// The producer of the outgoing ring.
    tx: Producer,
    /// The consumer of the incoming ring.
    rx: Consumer,
    role: Role,
}

impl Channel {
    /// Maps the memfd `fd` of `capacity`-byte rings. The connector
    /// (`role`) writes the header; the listener checks it.
    pub(crate) fn map(fd: libc::c_int, capacity: usize, role: Role) -> io::Result<Channel> {
        if role == Role::Listener {
            return Channel::reattach(fd, capacity, role);
        }
        let region = Region::create(fd, capacity, Waits::Sleep, false)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let ch = Channel::with(region, role);
        // A fresh program waits for data: the first bytes either way ring
        // the doorbell, so a program that polls before it ever reads is
        // woken.
        ch.rx.waiter().store(w::WAIT_FD, Ordering::Relaxed);
        ch.tx
            .ctl()
            .data_waiter
            .0
            .store(w::WAIT_FD, Ordering::Release);
        Ok(ch)
    }

    /// Maps the region `fd` as `role` and checks it (a listener's first
    /// mapping, or either end's again after an `exec`: the header and the
    /// rings as they are).
    pub(crate) fn reattach(fd: libc::c_int, capacity: usize, role: Role) -> io::Result<Channel> {
        let expect = Expect {
            capacity: Some(capacity),
            waits: Waits::Sleep,
        };
        let region = Region::open(fd, &expect, false)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(Channel::with(region, role))
    }

    fn with(region: Region, role: Role) -> Channel {
        let (tx, rx) = region.ends(role);
        Channel {
            region,
            tx,
            rx,
            role,
        }
    }

    fn header(&self) -> &lay::Header {
        self.region.header()
    }

    /// The listener joins the region to its connection: false if another
    /// listener did first (a region handed over twice).
    pub(crate) fn join(&self) -> bool {
        self.header()
            .joined
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// This end ended its side: `fin`, it shut down its sending side or
    /// closed the connection in an orderly way (a reset that follows is a
    /// doorbell's, read as the end of the stream); `closed`, it closed the
    /// connection in the one process that held it (orderly or not). On a
    /// relayed connection only a shutdown marks `fin`: the relay sends
    /// the end of the stream once the ring's bytes before it went out,
    /// and takes a close from its socket's hang-up.
    pub(crate) fn mark_end(&self, fin: bool, closed: bool) {
        let v = if fin { lay::END_FIN } else { 0 } | if closed { lay::END_CLOSED } else { 0 };
        self.header().ends[self.role.index()].fetch_or(v, Ordering::SeqCst);
    }

    /// How the other end ended its side. A relayed connection's other end
    /// is its relay, which marks `fin` once every byte the other program
    /// sent before its end is in the ring.
    pub(crate) fn peer_end(&self) -> PeerEnd {
        let v = self.header().ends[self.role.peer().index()].load(Ordering::Acquire);
        PeerEnd {
            fin: v & lay::END_FIN != 0,
            closed: v & lay::END_CLOSED != 0,
        }
    }

    /// How this end ended its side, as any of its processes marked it.
    pub(crate) fn own_end(&self) -> PeerEnd {
        let v = self.header().ends[self.role.index()].load(Ordering::Acquire);
        PeerEnd {
            fin: v & lay::END_FIN != 0,
            closed: v & lay::END_CLOSED != 0,
        }
    }

    /// The connector's socket inode, as its header says.
    pub(crate) fn connector_ino(&self) -> u64 {
        self.header().connector_ino.load(Ordering::Acquire)
    }

    /// Bytes of each ring.
    pub(crate) fn capacity(&self) -> u32 {
        self.region.capacity() as u32
    }

    /// This end is closing: it waits for nothing any more (its waiter
    /// bits are cleared, so the peer rings no more doorbells), and returns
    /// once the doorbells already on their way have been sent, for the
    /// caller to drain them (waiting at most `limit`).
    pub(crate) fn quiesce(&self, limit: std::time::Duration) {
        self.rx.clear_waits();
        self.tx.clear_waits();
        fence(Ordering::SeqCst);
        let ringing = &self.header().ringing[self.role.index()];
        let start = std::time::Instant::now();
        while ringing.load(Ordering::SeqCst) != 0 && start.elapsed() < limit {
            std::thread::yield_now();
        }
    }

    /// Doorbells on their way to the peer.
    #[inline]
    fn ringing_peer(&self) -> &AtomicU32 {
        &self.header().ringing[self.role.peer().index()]
    }

    /// Counts a doorbell as on its way to the peer, before the waiter bits
    /// that ask for it are taken (so a closing peer waits for it).
    #[inline]
    fn count_doorbell(&self) {
        self.ringing_peer().fetch_add(1, Ordering::SeqCst);
    }

    /// Whether the peer's waiters, as taken (futex sleepers already
    /// woken), need a doorbell; a doorbell counted for waiters that needed
    /// none is uncounted. If so, it stays counted as on its way until the
    /// caller says it went ([`Channel::rang`]).
    #[inline]
    fn doorbell(&self, taken: Option<u32>) -> bool {
        match taken {
            None => false,
            Some(old) if old & w::WAIT_FD != 0 => true,
            Some(_) => {
                self.ringing_peer().fetch_sub(1, Ordering::SeqCst);
                false
            }
        }
    }

    /// The doorbell a [`Moved`] asked for went (or failed): it is no
    /// longer on its way.
    pub(crate) fn rang(&self) {
        self.ringing_peer().fetch_sub(1, Ordering::SeqCst);
    }

    /// Records this end's socket inode in the header (for [`reattach`]).
    ///
    /// [`reattach`]: Channel::reattach
    pub(crate) fn set_socket_ino(&self, ino: u64) {
        let header = self.header();
        match self.role {
            Role::Connector => header.connector_ino.store(ino, Ordering::Release),
            Role::Listener => header.listener_ino.store(ino, Ordering::Release),
        }
    }

    /// Bytes waiting to be read.
    pub(crate) fn readable(&self) -> Result<usize, Corrupt> {
        self.rx.available().map(|n| n as usize).map_err(|_| Corrupt)
    }

    /// Whether the outgoing ring is full.
    pub(crate) fn tx_full(&self) -> Result<bool, Corrupt> {
        self.tx.is_full().map_err(|_| Corrupt)
    }

    /// Copies up to the iovecs' total out of the incoming ring; consumes
    /// them unless `peek`.
    ///
    /// # Safety
    ///
    /// Every iovec must be valid for writes of its length.
    #[inline]
    pub(crate) unsafe fn read(&self, iov: &[libc::iovec], peek: bool) -> Result<Moved, Corrupt> {
        // SAFETY: the caller's contract; the program's buffers are never
        // inside the region, which only this library maps.
        let bytes = unsafe { self.rx.read_iov(iov, peek) }.map_err(|_| Corrupt)?;
        if peek || bytes == 0 {
            return Ok(Moved {
                bytes,
                wake_peer: false,
            });
        }
        let wake_peer = self.doorbell(self.rx.take_peer_waiters(|| self.count_doorbell()));
        Ok(Moved { bytes, wake_peer })
    }

    /// Copies as much of the iovecs as fits into the outgoing ring and
    /// publishes it.
    ///
    /// # Safety
    ///
    /// Every iovec must be valid for reads of its length.
    #[inline]
    pub(crate) unsafe fn write(&self, iov: &[libc::iovec]) -> Result<Moved, Corrupt> {
        // SAFETY: the caller's contract; as in `read`.
        let bytes = unsafe { self.tx.write_iov(iov) }.map_err(|_| Corrupt)?;
        Ok(self.published(bytes))
    }

    /// Fills the outgoing ring's free space directly with `fill` (which
    /// gets one contiguous piece of at most `max` bytes and returns how
    /// many it wrote), then publishes them: how `sendfile` reads a file
    /// straight into the ring.
    pub(crate) fn write_with(
        &self,
        max: usize,
        fill: impl FnOnce(*mut u8, usize) -> io::Result<usize>,
    ) -> Result<io::Result<Moved>, Corrupt> {
        let done = self.tx.write_with(max, fill).map_err(|_| Corrupt)?;
        Ok(done.map(|bytes| self.published(bytes)))
    }

    /// After `bytes` were published: the consumer's waiters.
    #[inline]
    fn published(&self, bytes: usize) -> Moved {
        if bytes == 0 {
            return Moved {
                bytes,
                wake_peer: false,
            };
        }
        let wake_peer = self.doorbell(self.tx.take_peer_waiters(|| self.count_doorbell()));
        Moved { bytes, wake_peer }
    }

    /// Bytes written to the outgoing ring that the peer has not consumed.
    pub(crate) fn unsent(&self) -> Result<usize, Corrupt> {
        self.tx
            .unconsumed()
            .map(|n| n as usize)
            .map_err(|_| Corrupt)
    }

    /// Takes back everything in the outgoing ring (consuming it as the
    /// peer would): for a peer that refused the channel and so never
    /// mapped the region, these bytes must go over the kernel socket.
    pub(crate) fn take_unsent(&self) -> Result<Vec<u8>, Corrupt> {
        self.tx.take_back().map_err(|_| Corrupt)
    }

    /// Announces that this end is about to wait for data; the caller must
    /// check [`Channel::readable`] again afterwards.
    pub(crate) fn want_data(&self) {
        self.rx.arm(w::WAIT_FD);
    }

    /// Announces a wait for data in an epoll that watches the relay
    /// socket (see [`w::WAIT_BELL`]); the caller must check
    /// [`Channel::readable`] again afterwards.
    pub(crate) fn want_data_bell(&self) {
        self.rx.arm(w::WAIT_BELL);
    }

    /// Announces a blocking wait for data; the caller checks
    /// [`Channel::readable`] again, then calls [`Channel::sleep_data`]
    /// with the value returned here.
    pub(crate) fn want_data_futex(&self) -> u32 {
        self.rx.arm(w::WAIT_FUTEX)
    }

    /// Whether the peer said it may be closing (see `netgap_shm::layout::RingCtl::closing`).
    pub(crate) fn peer_closing(&self) -> bool {
        self.rx.peer_closing()
    }

    /// Sleeps until the peer publishes data (or `timeout_ms` passes).
    pub(crate) fn sleep_data(&self, armed: u32, timeout_ms: u32) {
        // EAGAIN, EINTR and the timeout all send the caller back to look
        // at the ring; no other error can come for a word of the region.
        let _ = self
            .rx
            .sleep(armed, Duration::from_millis(u64::from(timeout_ms)));
    }

    /// Announces a blocking wait for space (as [`Channel::want_data_futex`]).
    pub(crate) fn want_space_futex(&self) -> u32 {
        self.tx.arm(w::WAIT_FUTEX)
    }

    /// Sleeps until the peer consumes (or `timeout_ms` passes).
    pub(crate) fn sleep_space(&self, armed: u32, timeout_ms: u32) {
        // As in `sleep_data`.
        let _ = self
            .tx
            .sleep(armed, Duration::from_millis(u64::from(timeout_ms)));
    }

    /// This end is closing or shut down its sending side: wakes the peer's
    /// blocking sleepers on either ring, which then see the kernel
    /// socket's end (a FIN does not wake a futex).
    pub(crate) fn wake_peer_sleepers(&self) {
        self.tx.hint_closing();
        self.tx.wake_peer_sleepers();
        self.rx.wake_peer_sleepers();
    }

    /// Announces that this end is about to wait for space; the caller must
    /// check [`Channel::tx_full`] again afterwards.
    pub(crate) fn want_space(&self) {
        self.tx.arm(w::WAIT_FD);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    /// Both ends of a channel of 4 KiB rings in one memfd, sealed as the
    /// connector seals it, as the connector and the listener map it.
    fn pair() -> (Channel, Channel) {
        let cap = 4096;
        // SAFETY: a NUL-terminated name and plain flags.
        let fd = unsafe {
            libc::memfd_create(
                c"test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(fd >= 0);
        let len = netgap_shm::region_bytes(cap) as libc::off_t;
        // SAFETY: sizing and sealing our own memfd.
        let sized = unsafe {
            libc::ftruncate(fd, len) == 0
                && libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) == 0
        };
        assert!(sized);
        let a = Channel::map(fd, cap, Role::Connector).unwrap();
        let b = Channel::map(fd, cap, Role::Listener).unwrap();
        // SAFETY: our own descriptor; the mappings keep the memory.
        unsafe { libc::close(fd) };
        (a, b)
    }

    fn iov(buf: &mut [u8]) -> [libc::iovec; 1] {
        [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }]
    }

    #[test]
    fn bytes_cross_the_wrap_in_order_and_a_full_ring_takes_no_more() {
        let (a, b) = pair();
        let mut sent = 0u8;
        let mut got = 0u8;
        // 3000-byte writes against a 4096-byte ring wrap on the second one.
        for _ in 0..10 {
            let mut out: Vec<u8> = (0..3000)
                .map(|_| {
                    sent = sent.wrapping_add(1);
                    sent
                })
                .collect();
            // SAFETY: `out` is valid for reads of its length.
            let m = unsafe { a.write(&iov(&mut out)) }.unwrap();
            assert_eq!(m.bytes, 3000);
            let mut peeked = vec![0u8; 10];
            // SAFETY: valid for writes.
            let p = unsafe { b.read(&iov(&mut peeked), true) }.unwrap();
            assert_eq!(p.bytes, 10);
            let mut inb = vec![0u8; 3000];
            // SAFETY: valid for writes.
            let r = unsafe { b.read(&iov(&mut inb), false) }.unwrap();
            assert_eq!(r.bytes, 3000);
            assert_eq!(inb[..10], peeked[..]);
            for x in inb {
                got = got.wrapping_add(1);
                assert_eq!(x, got);
            }
        }
        let mut big = vec![7u8; 5000];
        // SAFETY: valid for reads.
        assert_eq!(unsafe { a.write(&iov(&mut big)) }.unwrap().bytes, 4096);
        assert!(a.tx_full().unwrap());
        // SAFETY: valid for reads.
        assert_eq!(unsafe { a.write(&iov(&mut big)) }.unwrap().bytes, 0);
        assert_eq!(b.readable().unwrap(), 4096);
    }

    #[test]
    fn a_waiting_peer_is_woken_once() {
        let (a, b) = pair();
        let mut x = [1u8; 8];
        // A fresh channel counts the peer as waiting for its first bytes.
        // SAFETY: valid for reads.
        assert!(unsafe { a.write(&iov(&mut x)) }.unwrap().wake_peer);
        // SAFETY: valid for reads.
        assert!(!unsafe { a.write(&iov(&mut x)) }.unwrap().wake_peer);
        b.want_data();
        // SAFETY: valid for reads.
        assert!(unsafe { a.write(&iov(&mut x)) }.unwrap().wake_peer);
    }

    #[test]
    fn a_blocking_sleeper_is_woken_by_futex_and_costs_no_doorbell() {
        let (a, b) = pair();
        let mut x = [1u8; 8];
        // The first bytes wake the fresh channel's descriptor waiter.
        // SAFETY: valid for reads.
        assert!(unsafe { a.write(&iov(&mut x)) }.unwrap().wake_peer);
        let armed = b.want_data_futex();
        assert_eq!(armed, w::WAIT_FUTEX);
        // SAFETY: valid for reads.
        assert!(!unsafe { a.write(&iov(&mut x)) }.unwrap().wake_peer);
        // The writer cleared the word: a sleep on the armed value returns
        // at once (the word changed) instead of waiting out the timeout.
        let t0 = std::time::Instant::now();
        b.sleep_data(armed, 5000);
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        // Both kinds at once: a doorbell is still owed to the descriptor.
        b.want_data();
        b.want_data_futex();
        // SAFETY: valid for reads.
        assert!(unsafe { a.write(&iov(&mut x)) }.unwrap().wake_peer);
    }

    #[test]
    fn an_ends_mark_is_its_own_end_and_its_peers_peer_end() {
        let (a, b) = pair();
        a.mark_end(true, false);
        assert!(a.own_end().fin && !a.own_end().closed);
        assert_eq!(b.peer_end(), a.own_end());
        assert_eq!(b.own_end(), PeerEnd::default());
        assert_eq!(a.peer_end(), PeerEnd::default());
    }

    #[test]
    fn an_impossible_index_from_the_peer_is_an_error() {
        let (a, b) = pair();
        // The peer claims more bytes than the ring holds.
        a.tx.ctl().head.0.store(1 << 20, Ordering::Release);
        assert!(b.readable().is_err());
        let mut buf = [0u8; 16];
        // SAFETY: valid for writes.
        assert!(unsafe { b.read(&iov(&mut buf), false) }.is_err());
    }
}
