//! The channel's tests: the index discipline on one region, hostile
//! regions and indices, and bytes crossing between two threads, each with
//! its own mapping of one memfd as two processes would have.

use crate::layout::{
    region_bytes, HeaderFields, RingId, Role, Waits, HEADER_BYTES, MAX_CAPACITY_BYTES, PAGE_BYTES,
};
use crate::region::{Expect, Region, RegionError};
use crate::ring::{OwnIndex, RingError};
use crate::wait::{WAIT_FD, WAIT_FUTEX};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A memfd of `len` bytes, sealed against shrinking if `sealed`.
fn memfd(len: usize, sealed: bool) -> OwnedFd {
    // SAFETY: a NUL-terminated name and plain flags.
    let fd =
        unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain calls on our own memfd.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
        if sealed {
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
        }
    }
    fd
}

/// A region of `capacity`-byte rings as its maker and as its peer map it.
fn pair(capacity: usize, waits: Waits) -> (Region, Region) {
    let fd = memfd(region_bytes(capacity), true);
    let maker = Region::create(fd.as_raw_fd(), capacity, waits, false).unwrap();
    let expect = Expect {
        capacity: Some(capacity),
        waits,
    };
    let peer = Region::open(fd.as_raw_fd(), &expect, false).unwrap();
    (maker, peer)
}

fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 7 + seed) % 251) as u8).collect()
}

fn iov(buf: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }
}

/// A valid region's bytes, rings of `capacity`, all else zero.
fn image(capacity: usize) -> Vec<u8> {
    let mut b = vec![0u8; region_bytes(capacity)];
    let h = HeaderFields {
        waits: Waits::Sleep,
        capacity: capacity as u64,
        connector_ino: 0,
        listener_ino: 0,
    };
    b[..HEADER_BYTES].copy_from_slice(&h.to_bytes());
    b
}

const SLEEP: Expect = Expect {
    capacity: None,
    waits: Waits::Sleep,
};

#[test]
fn bytes_cross_the_wrap_of_the_ring_in_order_and_partial_writes_take_what_fits() {
    let (a, b) = pair(4096, Waits::Sleep);
    let (tx, _) = a.ends(Role::Connector);
    let (_, rx) = b.ends(Role::Listener);
    let mut sent = Vec::new();
    let mut got = Vec::new();
    // 3000-byte writes against a 4096-byte ring wrap on the second one.
    for round in 0..10 {
        let msg = pattern(3000, round);
        assert_eq!(tx.try_write(&msg, usize::MAX).unwrap(), 3000);
        sent.extend_from_slice(&msg);
        let mut peeked = [0u8; 10];
        assert_eq!(rx.peek(&mut peeked).unwrap(), 10);
        let mut buf = vec![0u8; 3000];
        assert_eq!(rx.try_read(&mut buf, usize::MAX).unwrap(), 3000);
        assert_eq!(buf[..10], peeked);
        got.extend_from_slice(&buf);
    }
    assert_eq!(got, sent);
    // A full ring takes what fits, then nothing.
    let big = pattern(5000, 1);
    assert_eq!(tx.try_write(&big, usize::MAX).unwrap(), 4096);
    assert!(tx.is_full().unwrap());
    assert_eq!(tx.try_write(&big, usize::MAX).unwrap(), 0);
    assert_eq!(rx.available().unwrap(), 4096);
    // A partial read frees its bytes, and only those.
    let mut buf = [0u8; 100];
    assert_eq!(rx.try_read(&mut buf, 10).unwrap(), 10);
    assert_eq!(buf[..10], big[..10]);
    assert_eq!(tx.try_write(&big[4096..], usize::MAX).unwrap(), 10);
    let mut rest = vec![0u8; 5000];
    assert_eq!(rx.try_read(&mut rest, usize::MAX).unwrap(), 4096);
    assert_eq!(rest[..4096], big[10..4106]);
    // Empty: nothing to read, and room for a whole ring.
    assert_eq!(rx.try_read(&mut rest, usize::MAX).unwrap(), 0);
    assert_eq!(rx.available().unwrap(), 0);
    assert_eq!(tx.unconsumed().unwrap(), 0);
}

#[test]
fn ends_with_private_indices_write_them_through_to_the_ring() {
    let (a, b) = pair(4096, Waits::Spin);
    let (tx, _) = a.ends_with(Role::Connector, OwnIndex::Private);
    let (_, rx) = b.ends_with(Role::Listener, OwnIndex::Private);
    let (_, shared_rx) = b.ends(Role::Listener);
    let mut got = Vec::new();
    for round in 0..10 {
        let msg = pattern(3000, round);
        assert_eq!(tx.try_write(&msg, usize::MAX).unwrap(), 3000);
        // The peer reads the index from the ring: it moved there too.
        assert_eq!(shared_rx.available().unwrap(), 3000);
        let mut buf = vec![0u8; 3000];
        assert_eq!(rx.try_read(&mut buf, usize::MAX).unwrap(), 3000);
        assert_eq!(buf, msg);
        got.push(buf);
    }
    let ctl = a.ctl(RingId::ToListener);
    assert_eq!(ctl.head.0.load(Ordering::Acquire), 30_000);
    assert_eq!(ctl.tail.0.load(Ordering::Acquire), 30_000);
    assert_eq!(tx.unconsumed().unwrap(), 0);
    assert_eq!(got.len(), 10);
}

#[test]
fn the_counters_wrap_at_two_to_the_sixty_four() {
    let (a, b) = pair(4096, Waits::Sleep);
    let start = u64::MAX - 1000;
    for ring in [RingId::ToListener, RingId::ToConnector] {
        a.ctl(ring).head.0.store(start, Ordering::Release);
        a.ctl(ring).tail.0.store(start, Ordering::Release);
    }
    let (tx, _) = a.ends(Role::Connector);
    let (_, rx) = b.ends(Role::Listener);
    let mut sent = Vec::new();
    let mut got = Vec::new();
    for round in 0..8 {
        let msg = pattern(700, round);
        assert_eq!(tx.try_write(&msg, usize::MAX).unwrap(), 700);
        sent.extend_from_slice(&msg);
        assert_eq!(rx.available().unwrap(), 700);
        let mut buf = [0u8; 700];
        assert_eq!(rx.try_read(&mut buf, usize::MAX).unwrap(), 700);
        got.extend_from_slice(&buf);
    }
    assert_eq!(got, sent);
    let head = a.ctl(RingId::ToListener).head.0.load(Ordering::Acquire);
    assert_eq!(head, start.wrapping_add(5600));
    assert!(head < start, "the index wrapped");
    // Full across the wrap, too.
    let big = pattern(8192, 3);
    assert_eq!(tx.try_write(&big, usize::MAX).unwrap(), 4096);
    assert!(tx.is_full().unwrap());
    let out = tx.take_back().unwrap();
    assert_eq!(out, big[..4096]);
    assert_eq!(rx.available().unwrap(), 0);
}

#[test]
fn iovecs_scatter_and_gather_and_a_peek_consumes_nothing() {
    let (a, b) = pair(4096, Waits::Sleep);
    let (tx, _) = a.ends(Role::Listener);
    let (_, rx) = b.ends(Role::Connector);
    let mut x = pattern(1000, 1);
    let mut y = pattern(4000, 2);
    // SAFETY: both iovecs name live vectors of their lengths.
    let n = unsafe { tx.write_iov(&[iov(&mut x), iov(&mut y)]) }.unwrap();
    assert_eq!(n, 4096);
    let mut p = vec![0u8; 5];
    let mut q = vec![0u8; 5000];
    // SAFETY: as above.
    let n = unsafe { rx.read_iov(&[iov(&mut p), iov(&mut q)], true) }.unwrap();
    assert_eq!(n, 4096);
    assert_eq!(rx.available().unwrap(), 4096);
    // SAFETY: as above.
    let n = unsafe { rx.read_iov(&[iov(&mut p), iov(&mut q)], false) }.unwrap();
    assert_eq!(n, 4096);
    assert_eq!(p, x[..5]);
    assert_eq!(q[..995], x[5..]);
    assert_eq!(q[995..4091], y[..3096]);
    assert_eq!(rx.available().unwrap(), 0);
}

#[test]
fn a_fill_in_place_gets_one_contiguous_piece() {
    let (a, b) = pair(4096, Waits::Sleep);
    let (tx, _) = a.ends(Role::Connector);
    let (_, rx) = b.ends(Role::Listener);
    assert_eq!(tx.try_write(&[0u8; 4000], usize::MAX).unwrap(), 4000);
    let mut buf = [0u8; 4000];
    assert_eq!(rx.try_read(&mut buf, usize::MAX).unwrap(), 4000);
    // 96 bytes to the end of the ring's data: the piece stops there.
    let got = tx
        .write_with(1000, |dst, n| -> Result<usize, ()> {
            assert_eq!(n, 96);
            // SAFETY: `dst` is valid for writes of `n` bytes.
            unsafe { std::ptr::write_bytes(dst, 9, n) };
            Ok(n)
        })
        .unwrap();
    assert_eq!(got, Ok(96));
    let failed = tx.write_with(1000, |_, _| Err("no input")).unwrap();
    assert_eq!(failed, Err("no input"));
    assert_eq!(rx.available().unwrap(), 96);
}

#[test]
fn a_waiting_peer_is_taken_once_and_a_futex_sleeper_is_woken() {
    let (a, b) = pair(4096, Waits::Sleep);
    let (tx, _) = a.ends(Role::Connector);
    let (_, rx) = b.ends(Role::Listener);
    assert_eq!(tx.try_write(b"x", usize::MAX).unwrap(), 1);
    assert_eq!(tx.take_peer_waiters(|| ()), None);
    rx.arm(WAIT_FD);
    let armed = rx.arm(WAIT_FUTEX);
    assert_eq!(armed, WAIT_FD | WAIT_FUTEX);
    std::thread::scope(|s| {
        let sleeper = s.spawn(|| {
            let t0 = Instant::now();
            rx.sleep(armed, Duration::from_secs(5)).unwrap();
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(tx.try_write(b"y", usize::MAX).unwrap(), 1);
        let mut claimed = false;
        assert_eq!(
            tx.take_peer_waiters(|| claimed = true),
            Some(WAIT_FD | WAIT_FUTEX)
        );
        assert!(claimed);
        assert!(sleeper.join().unwrap() < Duration::from_secs(2));
    });
    assert_eq!(tx.take_peer_waiters(|| ()), None, "taken once");
    // The closing hint, and a sleeper woken without taking its word.
    assert!(!rx.peer_closing());
    tx.hint_closing();
    assert!(rx.peer_closing());
}

/// What a region made by a stranger may hold, each refused by the checks
/// (never a panic, never an access past the memory).
#[test]
fn a_hostile_header_is_refused() {
    let refuse = |bytes: &[u8], expect: &Expect, needle: &str| {
        let e = Region::from_bytes(bytes, expect).map(drop).unwrap_err();
        assert!(e.to_string().contains(needle), "{needle}: {e}");
        e
    };
    let good = image(4096);
    assert!(Region::from_bytes(&good, &SLEEP).is_ok());
    // Too short for a header and two control blocks, or empty.
    refuse(&good[..3 * PAGE_BYTES], &SLEEP, "smaller");
    refuse(&[], &SLEEP, "smaller");
    let with = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    refuse(&with(0, b"NGAPSHM\0"), &SLEEP, "magic");
    refuse(&with(8, &5u32.to_ne_bytes()), &SLEEP, "version");
    refuse(&with(12, &9u32.to_ne_bytes()), &SLEEP, "wait rule");
    refuse(
        &good,
        &Expect {
            capacity: None,
            waits: Waits::Spin,
        },
        "wait",
    );
    refuse(&with(16, &5000u64.to_ne_bytes()), &SLEEP, "power of two");
    refuse(&with(16, &0u64.to_ne_bytes()), &SLEEP, "power of two");
    refuse(
        &with(16, &(1u64 << 63).to_ne_bytes()),
        &SLEEP,
        "power of two",
    );
    // Rings bigger than the memory holds: sizes past the mapping.
    refuse(&with(16, &8192u64.to_ne_bytes()), &SLEEP, "claims");
    refuse(
        &with(16, &(MAX_CAPACITY_BYTES as u64).to_ne_bytes()),
        &SLEEP,
        "claims",
    );
    // Smaller rings than the memory: refused too, a region is exact.
    let mut big = image(8192);
    big[16..24].copy_from_slice(&4096u64.to_ne_bytes());
    refuse(&big, &SLEEP, "claims");
    // Another capacity than announced.
    refuse(
        &good,
        &Expect {
            capacity: Some(8192),
            waits: Waits::Sleep,
        },
        "announced",
    );
    // Indices that claim more bytes than the ring holds.
    let ctl1 = 2 * PAGE_BYTES;
    refuse(&with(ctl1, &5000u64.to_ne_bytes()), &SLEEP, "ring 1");
    refuse(
        &with(PAGE_BYTES + 128, &1u64.to_ne_bytes()),
        &SLEEP,
        "ring 0",
    );
}

#[test]
fn a_hostile_file_is_refused_before_it_is_mapped() {
    let open = |fd: &OwnedFd, expect: &Expect| {
        Region::open(fd.as_raw_fd(), expect, false)
            .map(drop)
            .unwrap_err()
            .to_string()
    };
    let announced = Expect {
        capacity: Some(4096),
        waits: Waits::Sleep,
    };
    // Unsealed: it could shrink under the mapping.
    assert!(open(&memfd(region_bytes(4096), false), &announced).contains("F_SEAL_SHRINK"));
    // Shorter or longer than announced, or than any region.
    assert!(open(&memfd(region_bytes(4096) - 1, true), &announced).contains("not the size"));
    assert!(open(&memfd(region_bytes(8192), true), &announced).contains("not the size"));
    assert!(open(&memfd(100, true), &SLEEP).contains("not the size"));
    // The right size, but zeroes.
    assert!(open(&memfd(region_bytes(4096), true), &announced).contains("magic"));
    // No memfd at all.
    let mut p = [0; 2];
    // SAFETY: `p` holds two descriptors' room.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: new descriptors nothing else owns.
    let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    assert!(open(&r, &SLEEP).contains("regular file"));
    // A header written as the maker writes it passes.
    let fd = memfd(region_bytes(4096), true);
    let h = HeaderFields {
        waits: Waits::Sleep,
        capacity: 4096,
        connector_ino: 42,
        listener_ino: 0,
    }
    .to_bytes();
    // SAFETY: `h` is valid for reads of its length.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), h.as_ptr().cast(), h.len(), 0) };
    assert_eq!(n, h.len() as isize);
    let r = Region::open(fd.as_raw_fd(), &announced, false).unwrap();
    assert_eq!(r.header().connector_ino.load(Ordering::Relaxed), 42);
    assert_eq!(r.capacity(), 4096);
}

/// The peer rewrites the indices after the checks: every read and write
/// stays inside the ring, and an impossible index is an error.
#[test]
fn hostile_indices_are_errors_never_a_read_past_the_ring() {
    let (a, b) = pair(4096, Waits::Sleep);
    let (tx, rx) = b.ends(Role::Listener);
    let peer_out = a.ctl(RingId::ToListener);
    let peer_in = a.ctl(RingId::ToConnector);
    let mut buf = vec![0u8; 10_000];
    // More bytes than the ring holds.
    peer_out.head.0.store(4097, Ordering::Release);
    assert!(matches!(
        rx.try_read(&mut buf, usize::MAX),
        Err(RingError::BadHead { head: 4097, .. })
    ));
    assert!(rx.available().is_err());
    // A head that moved back.
    peer_out.head.0.store(100, Ordering::Release);
    assert_eq!(rx.try_read(&mut buf, 10).unwrap(), 10);
    peer_out.head.0.store(50, Ordering::Release);
    assert!(rx.try_read(&mut buf, usize::MAX).is_err());
    // Garbage far away: u64::MAX and values around the wrap.
    for v in [u64::MAX, u64::MAX - 4095, 1 << 63] {
        peer_out.head.0.store(v, Ordering::Release);
        assert!(rx.try_read(&mut buf, usize::MAX).is_err(), "{v}");
    }
    // The consumer claims bytes never written (seen once the ring is
    // full and the producer must read its index again).
    assert_eq!(tx.try_write(&buf[..4096], usize::MAX).unwrap(), 4096);
    peer_in.tail.0.store(5000, Ordering::Release);
    assert!(matches!(
        tx.try_write(&buf[..8], usize::MAX),
        Err(RingError::BadTail { tail: 5000, .. })
    ));
    // A tail that moved back.
    peer_in.tail.0.store(32, Ordering::Release);
    assert_eq!(tx.try_write(&buf, usize::MAX).unwrap(), 32);
    peer_in.tail.0.store(16, Ordering::Release);
    assert!(tx.unconsumed().is_err());
    // The peer rewrites this end's own index too, across the wrap: the
    // copy still lies inside the ring (offsets are masked) and is at most
    // a ring long.
    b.ctl(RingId::ToListener)
        .tail
        .0
        .store(u64::MAX - 3, Ordering::Release);
    peer_out
        .head
        .0
        .store((u64::MAX - 3).wrapping_add(4096), Ordering::Release);
    assert_eq!(rx.try_read(&mut buf, usize::MAX).unwrap(), 4096);
}

/// The producer on one mapping, the consumer on another, as two processes
/// map one region: 8 MiB in writes and reads of sizes that never line up
/// with the ring, every byte checked; both sides sleep by the wake rule
/// when they must wait, and no wake-up is lost (a lost one would leave a
/// side asleep for its whole timeout).
#[test]
fn two_threads_move_a_pattern_through_and_every_byte_arrives() {
    let total = 8 << 20;
    let data = pattern(total, 5);
    let (a, b) = pair(1 << 16, Waits::Sleep);
    let long_sleeps = std::sync::atomic::AtomicU32::new(0);
    let slept = |t0: Instant| {
        if t0.elapsed() > Duration::from_secs(4) {
            long_sleeps.fetch_add(1, Ordering::Relaxed);
        }
    };
    std::thread::scope(|s| {
        let src = &data;
        let slept = &slept;
        s.spawn(move || {
            let (tx, _) = a.ends(Role::Connector);
            let mut off = 0;
            let mut k = 0;
            while off < total {
                let chunk = [1, 7, 4096, 65_537, 100_000][k % 5];
                k += 1;
                let end = (off + chunk).min(total);
                let n = tx.try_write(&src[off..end], 50_000).unwrap();
                if n > 0 {
                    off += n;
                    tx.take_peer_waiters(|| ());
                    continue;
                }
                let armed = tx.arm(WAIT_FUTEX);
                if !tx.is_full().unwrap() {
                    tx.disarm(WAIT_FUTEX);
                    continue;
                }
                let t0 = Instant::now();
                tx.sleep(armed, Duration::from_secs(5)).unwrap();
                slept(t0);
            }
        });
        let (_, rx) = b.ends(Role::Listener);
        let mut got = vec![0u8; total];
        let mut off = 0;
        let mut k = 0;
        while off < total {
            let chunk = [3, 70_001, 512, 9][k % 4];
            k += 1;
            let end = (off + chunk).min(total);
            let n = rx.try_read(&mut got[off..end], usize::MAX).unwrap();
            if n > 0 {
                off += n;
                rx.take_peer_waiters(|| ());
                continue;
            }
            let armed = rx.arm(WAIT_FUTEX);
            if rx.available().unwrap() > 0 {
                rx.disarm(WAIT_FUTEX);
                continue;
            }
            let t0 = Instant::now();
            rx.sleep(armed, Duration::from_secs(5)).unwrap();
            slept(t0);
        }
        assert!(got == data, "the bytes differ");
    });
    assert_eq!(long_sleeps.load(Ordering::Relaxed), 0, "a lost wake-up");
}

#[test]
fn a_region_of_spinning_ends_is_refused_by_a_sleeping_one() {
    let fd = memfd(region_bytes(4096), true);
    let _maker = Region::create(fd.as_raw_fd(), 4096, Waits::Spin, false).unwrap();
    let e = Region::open(fd.as_raw_fd(), &SLEEP, false)
        .map(drop)
        .unwrap_err();
    assert!(matches!(e, RegionError::WaitsOther { .. }), "{e}");
    let spin = Expect {
        capacity: None,
        waits: Waits::Spin,
    };
    assert_eq!(
        Region::open(fd.as_raw_fd(), &spin, false)
            .unwrap()
            .capacity(),
        4096
    );
    // The maker checks its own file too.
    let short = memfd(100, true);
    assert!(Region::create(short.as_raw_fd(), 4096, Waits::Spin, false).is_err());
    assert!(Region::create(fd.as_raw_fd(), 5000, Waits::Spin, false).is_err());
}
