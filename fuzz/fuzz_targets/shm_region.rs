//! A peer's shared-memory region on hostile input (`netgap_shm`, the
//! channel of the preload library, the relay and the shm transport).
//!
//! First the input as a whole region, as a peer could hand it over: the
//! checks (`Region::from_bytes`, and `Region::open` on a sealed memfd
//! holding the bytes, mapped as a peer's file is) and the header parser
//! never panic, whatever the bytes, and a region they accept has rings
//! that fit in it.
//!
//! Then a region of 4 KiB rings whose header and control words the input
//! may overwrite, mapped as the listener's end, and a script of moves
//! from the input: this end's reads, peeks, writes and fills; the peer's
//! honest moves (its own ends of the same rings); and the peer's
//! hostile writes to any index, waiter word or header word at any point.
//! No move panics or copies more than was asked or than a ring holds; and
//! while the peer only moved honestly, every byte read is the byte the
//! peer wrote, in order, each side sees exactly the bytes in the ring,
//! and nothing is an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_shm::layout::{ctl_offset, HEADER_BYTES};
use netgap_shm::{region_bytes, Expect, HeaderFields, Region, RingId, Role, Waits};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

/// Bytes of each ring of the scripted region.
const CAP: usize = 4096;

/// Bytes of the control words the input may overwrite per ring: head,
/// tail (8 each), the two waiter words and the closing hint (4 each).
const CTL_WORDS: usize = 28;

/// Reads `N` bytes of `data` at `*at`, zeros past its end.
fn take<const N: usize>(data: &[u8], at: &mut usize) -> [u8; N] {
    let mut w = [0u8; N];
    for (i, b) in w.iter_mut().enumerate() {
        *b = data.get(*at + i).copied().unwrap_or(0);
    }
    *at += N;
    w
}

/// The input's bytes in a sealed memfd, as a peer hands a region over.
fn memfd_of(data: &[u8]) -> Option<OwnedFd> {
    // SAFETY: a NUL-terminated name and plain flags.
    let fd =
        unsafe { libc::memfd_create(c"f".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `data` is valid for reads of its length; plain calls on our
    // own memfd.
    let ok = unsafe {
        libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), 0) == data.len() as isize
            && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) == 0
    };
    ok.then_some(fd)
}

fn whole_region(data: &[u8], flags: u8) {
    let _ = HeaderFields::parse(data);
    let waits = if flags & 4 != 0 {
        Waits::Spin
    } else {
        Waits::Sleep
    };
    for capacity in [None, Some(CAP), Some(1 << 13)] {
        let expect = Expect { capacity, waits };
        if let Ok(r) = Region::from_bytes(data, &expect) {
            assert_eq!(region_bytes(r.capacity()), data.len());
            if let Some(c) = capacity {
                assert_eq!(r.capacity(), c);
            }
        }
    }
    if flags & 16 != 0 {
        if let Some(fd) = memfd_of(data) {
            let expect = Expect {
                capacity: None,
                waits,
            };
            if let Ok(r) = Region::open(fd.as_raw_fd(), &expect, false) {
                assert_eq!(region_bytes(r.capacity()), data.len());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    whole_region(rest, flags);

    // The scripted region: a valid image, then what the input overwrites.
    let mut at = 0;
    let mut img = vec![0u8; region_bytes(CAP)];
    let header = HeaderFields {
        waits: Waits::Sleep,
        capacity: CAP as u64,
        connector_ino: 0,
        listener_ino: 0,
    };
    img[..HEADER_BYTES].copy_from_slice(&header.to_bytes());
    let over: [u8; HEADER_BYTES] = take(rest, &mut at);
    if flags & 1 != 0 {
        img[..HEADER_BYTES].copy_from_slice(&over);
    }
    let words: [u8; 2 * CTL_WORDS] = take(rest, &mut at);
    let mut honest = true;
    if flags & 2 != 0 {
        honest = false;
        for ring in 0..2 {
            let base = ctl_offset(if ring == 0 {
                RingId::ToListener
            } else {
                RingId::ToConnector
            });
            let w = &words[ring * CTL_WORDS..];
            for (k, off) in [(0, 0), (8, 128)] {
                img[base + off..base + off + 8].copy_from_slice(&w[k..k + 8]);
            }
            for (k, off) in [(16, 256), (20, 384), (24, 512)] {
                img[base + off..base + off + 4].copy_from_slice(&w[k..k + 4]);
            }
        }
    }
    let expect = Expect {
        capacity: (flags & 8 != 0).then_some(CAP),
        waits: Waits::Sleep,
    };
    let Ok(region) = Region::from_bytes(&img, &expect) else {
        return;
    };
    let cap = region.capacity();
    assert_eq!(cap, CAP, "offsets come from the checked capacity");
    // This end is the listener; the peer's honest ends are the others.
    let (tx, rx) = region.ends(Role::Listener);
    let (peer_tx, peer_rx) = region.ends(Role::Connector);
    // What the peer wrote and this end has not read, and the other way.
    let mut to_me: VecDeque<u8> = VecDeque::new();
    let mut to_peer: VecDeque<u8> = VecDeque::new();
    let mut seq = 0u8;
    let mut fill = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seq = seq.wrapping_add(1);
                seq
            })
            .collect()
    };
    let mut buf = vec![0u8; 2 * CAP + 1];
    let mut steps = 0;
    while at < rest.len() && steps < 256 {
        steps += 1;
        let [op, a, b] = take::<3>(rest, &mut at);
        let n = usize::from(u16::from_le_bytes([a, b])) % (2 * CAP + 1);
        match op % 16 {
            0 | 1 => {
                let max = if op % 16 == 1 { n / 3 + 1 } else { usize::MAX };
                let r = rx.try_read(&mut buf[..n], max);
                if let Ok(k) = r {
                    assert!(k <= n && k <= max && k <= cap);
                    if honest {
                        assert_eq!(k, n.min(max).min(to_me.len()));
                        let want: Vec<u8> = to_me.drain(..k.min(to_me.len())).collect();
                        assert_eq!(want.len(), k, "read more than the peer wrote");
                        assert_eq!(&buf[..k], &want[..]);
                    }
                    if k > 0 {
                        let _ = rx.take_peer_waiters(|| ());
                    }
                } else {
                    assert!(!honest, "{r:?}");
                }
            }
            2 => {
                let r = rx.peek(&mut buf[..n]);
                if let Ok(k) = r {
                    assert!(k <= n && k <= cap);
                    if honest {
                        assert_eq!(k, n.min(to_me.len()));
                        assert!(buf[..k].iter().zip(to_me.iter()).all(|(x, y)| x == y));
                    }
                } else {
                    assert!(!honest, "{r:?}");
                }
            }
            3 => {
                let (p, q) = buf.split_at_mut(n / 2);
                let iov = [
                    libc::iovec {
                        iov_base: p.as_mut_ptr().cast(),
                        iov_len: p.len(),
                    },
                    libc::iovec {
                        iov_base: q.as_mut_ptr().cast(),
                        iov_len: (n - n / 2).min(q.len()),
                    },
                ];
                // SAFETY: both iovecs lie in `buf`, apart.
                let r = unsafe { rx.read_iov(&iov, op & 16 != 0) };
                if let Ok(k) = r {
                    assert!(k <= n && k <= cap);
                    if honest {
                        assert_eq!(k, n.min(to_me.len()));
                        if op & 16 == 0 {
                            to_me.drain(..k);
                        }
                    }
                } else {
                    assert!(!honest, "{r:?}");
                }
            }
            4 => {
                let out = fill(n);
                let r = tx.try_write(&out, usize::MAX);
                if let Ok(k) = r {
                    assert!(k <= n && k <= cap);
                    if honest {
                        assert_eq!(k, n.min(cap - to_peer.len()));
                        to_peer.extend(&out[..k]);
                    }
                    if k > 0 {
                        let _ = tx.take_peer_waiters(|| ());
                    }
                } else {
                    assert!(!honest, "{r:?}");
                }
            }
            5 => {
                let mut out = fill(n);
                let iov = [libc::iovec {
                    iov_base: out.as_mut_ptr().cast(),
                    iov_len: out.len(),
                }];
                // SAFETY: the iovec names `out`.
                let r = unsafe { tx.write_iov(&iov) };
                if let Ok(k) = r {
                    assert!(k <= n && k <= cap);
                    if honest {
                        assert_eq!(k, n.min(cap - to_peer.len()));
                        to_peer.extend(&out[..k]);
                    }
                } else {
                    assert!(!honest, "{r:?}");
                }
            }
            6 => {
                let out = fill(n);
                let r = tx.write_with(n, |dst, room| -> Result<usize, ()> {
                    assert!(room <= n && room <= cap);
                    // SAFETY: `dst` is valid for writes of `room` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), dst, room) };
                    Ok(room)
                });
                match r {
                    Ok(Ok(k)) => {
                        if honest {
                            to_peer.extend(&out[..k]);
                        }
                    }
                    Ok(Err(())) => unreachable!("the fill never fails"),
                    Err(e) => assert!(!honest, "{e}"),
                }
            }
            7 => {
                let r = tx.take_back();
                if let Ok(v) = r {
                    assert!(v.len() <= cap);
                    if honest {
                        let want: Vec<u8> = to_peer.drain(..).collect();
                        assert_eq!(v, want);
                    }
                } else {
                    assert!(!honest, "{r:?}");
                }
            }
            8 => {
                let (a, u, f) = (rx.available(), tx.unconsumed(), tx.is_full());
                if honest {
                    assert_eq!(a.ok(), Some(to_me.len() as u64));
                    assert_eq!(u.ok(), Some(to_peer.len() as u64));
                    assert_eq!(f.ok(), Some(to_peer.len() == cap));
                }
            }
            9 => {
                // The peer writes honestly.
                let out = fill(n);
                match peer_tx.try_write(&out, usize::MAX) {
                    Ok(k) if honest => {
                        assert_eq!(k, n.min(cap - to_me.len()));
                        to_me.extend(&out[..k]);
                    }
                    Ok(_) => {}
                    Err(e) => assert!(!honest, "{e}"),
                }
            }
            10 => {
                // The peer reads honestly.
                match peer_rx.try_read(&mut buf[..n], usize::MAX) {
                    Ok(k) if honest => {
                        assert_eq!(k, n.min(to_peer.len()));
                        let want: Vec<u8> = to_peer.drain(..k).collect();
                        assert_eq!(&buf[..k], &want[..]);
                    }
                    Ok(_) => {}
                    Err(e) => assert!(!honest, "{e}"),
                }
            }
            11..=13 => {
                // The peer writes an index: any of the four.
                honest = false;
                let v = u64::from_le_bytes(take(rest, &mut at));
                let ring = if op & 16 != 0 {
                    RingId::ToListener
                } else {
                    RingId::ToConnector
                };
                let c = region.ctl(ring);
                if op & 32 != 0 {
                    c.head.0.store(v, Ordering::Release);
                } else {
                    c.tail.0.store(v, Ordering::Release);
                }
            }
            14 => {
                // The peer writes a waiter word or the closing hint; this
                // end looks and takes as the wake rule says.
                let v = u32::from_le_bytes([a, b, op, 0]);
                let ring = if op & 16 != 0 {
                    RingId::ToListener
                } else {
                    RingId::ToConnector
                };
                let c = region.ctl(ring);
                match op >> 5 {
                    0 => c.data_waiter.0.store(v, Ordering::Release),
                    1 => c.space_waiter.0.store(v, Ordering::Release),
                    _ => c.closing.0.store(v, Ordering::Release),
                }
                // Never a real sleeper here: a futex wake finds none.
                let _ = rx.peer_closing();
                let _ = tx.take_peer_waiters(|| ());
                let _ = rx.take_peer_waiters(|| ());
                rx.disarm(netgap_shm::wait::WAIT_FUTEX);
            }
            _ => {
                // The peer rewrites the header: nothing already derived
                // from it changes.
                let h = region.header();
                h.capacity
                    .store(u64::from_le_bytes(take(rest, &mut at)), Ordering::Relaxed);
                h.magic.store(0, Ordering::Relaxed);
                assert_eq!(region.capacity(), CAP);
            }
        }
    }
});
