//! Where everything of a region lies, and the header as plain values.
//!
//! Every structure here is made only of atomics: the peer maps the same
//! bytes and may write any of them at any time, so any bit pattern must be
//! a valid value, and every access is an atomic one.

use crate::region::RegionError;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Bytes of the header and of each control block: one page each, so the
/// rings' data start on a page.
pub const PAGE_BYTES: usize = 4096;

/// Distance in bytes between independently written words of a
/// [`RingCtl`]: two 64-byte cache lines, because x86 cores prefetch lines
/// in adjacent pairs and a neighbour's writes would otherwise still steal
/// the line.
pub const LINE_BYTES: usize = 128;

/// One word alone on its own [`LINE_BYTES`]-byte line.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct Line<T>(pub T);

/// The control block of one ring. All-zero bytes are an empty ring. Each
/// word is written by one side (and cleared by the other where the wake
/// rule says so):
///
/// | word | set by | read by |
/// |---|---|---|
/// | `head` | producer | consumer |
/// | `tail` | consumer | producer |
/// | `data_waiter` | consumer (cleared by the producer when it wakes it) | producer |
/// | `space_waiter` | producer (cleared by the consumer when it wakes it) | consumer |
/// | `closing` | producer | consumer |
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingCtl {
    /// Bytes ever produced (wrapping at 2^64).
    pub head: Line<AtomicU64>,
    /// Bytes ever consumed (wrapping at 2^64).
    pub tail: Line<AtomicU64>,
    /// Non-zero while the consumer waits for data: its
    /// [`crate::wait`] bits; also the futex word a blocking consumer
    /// sleeps on.
    pub data_waiter: Line<AtomicU32>,
    /// Non-zero while the producer waits for space (as `data_waiter`).
    pub space_waiter: Line<AtomicU32>,
    /// Set by the producer's end when one of its processes closes or
    /// shuts down its sending side: a hint for a blocking consumer to look
    /// at whatever carries the end of the stream (the preload library's
    /// kernel socket) before it sleeps. Only a hint: after `fork` another
    /// process may still hold that end.
    pub closing: Line<AtomicU32>,
}

const _: () = assert!(std::mem::size_of::<RingCtl>() == 5 * LINE_BYTES);
const _: () = assert!(std::mem::size_of::<RingCtl>() <= PAGE_BYTES);

/// The region's first page. The maker writes it before it hands the
/// region over (the magic last); after that only the words the preload
/// library's ends keep about their connection change.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU32,
    /// [`Waits::code`] of the rule the ends wait by.
    pub waits: AtomicU32,
    /// Bytes of each ring's data: a power of two within
    /// [`MIN_CAPACITY_BYTES`]..=[`MAX_CAPACITY_BYTES`].
    pub capacity: AtomicU64,
    /// Inode of the connector's kernel socket (0: none recorded).
    pub connector_ino: AtomicU64,
    /// Inode of the listener's kernel socket (0: none recorded).
    pub listener_ino: AtomicU64,
    /// Set once, by the listener that maps the region: a region handed
    /// over again (for another connection) is refused.
    pub joined: AtomicU32,
    _pad: AtomicU32,
    /// How each end (by [`Role::index`]) ended its side: [`END_FIN`] once
    /// a process of it closed the connection or shut down its sending
    /// side, [`END_CLOSED`] once the process that alone held it closed it.
    pub ends: [AtomicU32; 2],
    /// Doorbells on their way to each end (by [`Role::index`]): counted
    /// up before the ringing end takes the waiter bits, down once the
    /// byte is sent, so an end about to close waits for those in flight
    /// and drains them (a byte left unread on a closed socket makes the
    /// kernel reset the connection).
    pub ringing: [AtomicU32; 2],
}

/// Bytes of the [`Header`]'s words (the rest of its page is zero).
pub const HEADER_BYTES: usize = std::mem::size_of::<Header>();

const _: () = assert!(HEADER_BYTES == 64);

/// An end closed or shut down its sending side ([`Header::ends`]).
pub const END_FIN: u32 = 1;
/// An end closed, in the one process that held it ([`Header::ends`]).
pub const END_CLOSED: u32 = 2;

/// `b"NGPRSHM\0"` as a little-endian word: a region's first eight bytes,
/// the bytes the preload library's regions carried before this crate, so
/// that a region of either build is the same bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"NGPRSHM\0");

/// The layout's version, bumped whenever the layout or the ring protocol
/// changes. It continues the preload library's region versions (its
/// regions carried the setup protocol's version, 4, in this word).
pub const LAYOUT_VERSION: u32 = 4;

/// Smallest ring capacity, in bytes.
pub const MIN_CAPACITY_BYTES: usize = PAGE_BYTES;

/// Largest ring capacity, in bytes (1 GiB: an index then moves by less
/// than 2^32 while an end looks at it, and a region's size fits any
/// `off_t`).
pub const MAX_CAPACITY_BYTES: usize = 1 << 30;

/// How the ends of a region wait, recorded in its header so both agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waits {
    /// Ends may wait on the waiter words (futex, descriptor, relay bell):
    /// a producer or consumer that moved an index takes the other side's
    /// waiters. Code 0, what the preload library's regions always held.
    Sleep,
    /// No end ever waits on a waiter word: each watches the peer's index,
    /// and a side that moved its index looks at no waiter word.
    Spin,
}

impl Waits {
    /// How the rule is written in the header.
    pub fn code(self) -> u32 {
        match self {
            Waits::Sleep => 0,
            Waits::Spin => 1,
        }
    }

    /// The rule a header's word names; None for an unknown code.
    pub fn from_code(code: u32) -> Option<Waits> {
        match code {
            0 => Some(Waits::Sleep),
            1 => Some(Waits::Spin),
            _ => None,
        }
    }
}

/// Which of the two rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingId {
    /// Ring 0: the connector produces, the listener consumes.
    ToListener,
    /// Ring 1: the listener produces, the connector consumes.
    ToConnector,
}

impl RingId {
    /// The ring's number: 0 or 1.
    pub fn index(self) -> usize {
        match self {
            RingId::ToListener => 0,
            RingId::ToConnector => 1,
        }
    }
}

/// Which end of the region a process is, named after the connection it
/// carries. Either end may be the region's maker: the preload library's
/// connector makes it, the `shm` transport's listener does (before any
/// peer comes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The end that connected.
    Connector,
    /// The end that accepted.
    Listener,
}

impl Role {
    /// The end's slot in [`Header::ends`] and [`Header::ringing`].
    pub fn index(self) -> usize {
        match self {
            Role::Connector => 0,
            Role::Listener => 1,
        }
    }

    /// The other end.
    pub fn peer(self) -> Role {
        match self {
            Role::Connector => Role::Listener,
            Role::Listener => Role::Connector,
        }
    }

    /// The ring this end produces.
    pub fn tx(self) -> RingId {
        match self {
            Role::Connector => RingId::ToListener,
            Role::Listener => RingId::ToConnector,
        }
    }

    /// The ring this end consumes.
    pub fn rx(self) -> RingId {
        self.peer().tx()
    }
}

/// Bytes of a region whose rings hold `capacity` bytes each; None past
/// what a `usize` holds.
pub fn region_bytes_checked(capacity: u64) -> Option<usize> {
    usize::try_from(capacity)
        .ok()?
        .checked_mul(2)?
        .checked_add(3 * PAGE_BYTES)
}

/// Bytes of a region whose rings hold `capacity` bytes each (a capacity
/// within [`MAX_CAPACITY_BYTES`]).
pub const fn region_bytes(capacity: usize) -> usize {
    3 * PAGE_BYTES + 2 * capacity
}

/// Offset of a ring's control block in the region.
pub const fn ctl_offset(ring: RingId) -> usize {
    match ring {
        RingId::ToListener => PAGE_BYTES,
        RingId::ToConnector => 2 * PAGE_BYTES,
    }
}

/// Offset of a ring's data in a region of `capacity`-byte rings.
pub const fn data_offset(ring: RingId, capacity: usize) -> usize {
    match ring {
        RingId::ToListener => 3 * PAGE_BYTES,
        RingId::ToConnector => 3 * PAGE_BYTES + capacity,
    }
}

/// Whether `capacity` is a ring capacity a region may have.
pub fn valid_capacity(capacity: u64) -> bool {
    capacity.is_power_of_two()
        && (MIN_CAPACITY_BYTES as u64..=MAX_CAPACITY_BYTES as u64).contains(&capacity)
}

/// The header's fields as plain values: what a maker writes, and what a
/// reader that has not mapped the region (the preload library after
/// `exec`, reading its file with `pread`) parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderFields {
    /// The wait rule.
    pub waits: Waits,
    /// Bytes of each ring.
    pub capacity: u64,
    /// Inode of the connector's kernel socket (0: none).
    pub connector_ino: u64,
    /// Inode of the listener's kernel socket (0: none).
    pub listener_ino: u64,
}

/// Reads the native-endian word of `N` bytes at `at` of `b` (which holds
/// at least [`HEADER_BYTES`]).
fn word<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut w = [0u8; N];
    w.copy_from_slice(&b[at..at + N]);
    w
}

impl HeaderFields {
    /// The header's bytes as a maker writes them (magic and version
    /// included; the words of the ends' connection zero), for a region
    /// made by writing its file.
    pub fn to_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&MAGIC.to_ne_bytes());
        b[8..12].copy_from_slice(&LAYOUT_VERSION.to_ne_bytes());
        b[12..16].copy_from_slice(&self.waits.code().to_ne_bytes());
        b[16..24].copy_from_slice(&self.capacity.to_ne_bytes());
        b[24..32].copy_from_slice(&self.connector_ino.to_ne_bytes());
        b[32..40].copy_from_slice(&self.listener_ino.to_ne_bytes());
        b
    }

    /// Parses and checks a header's first bytes (magic, version, wait
    /// rule, capacity); never panics, whatever `bytes` holds.
    pub fn parse(bytes: &[u8]) -> Result<HeaderFields, RegionError> {
        if bytes.len() < HEADER_BYTES {
            return Err(RegionError::TooSmall {
                len: bytes.len() as u64,
            });
        }
        HeaderFields::check(
            u64::from_ne_bytes(word(bytes, 0)),
            u32::from_ne_bytes(word(bytes, 8)),
            u32::from_ne_bytes(word(bytes, 12)),
            u64::from_ne_bytes(word(bytes, 16)),
            u64::from_ne_bytes(word(bytes, 24)),
            u64::from_ne_bytes(word(bytes, 32)),
        )
    }

    /// The checks of [`HeaderFields::parse`] on words already read.
    pub(crate) fn check(
        magic: u64,
        version: u32,
        waits: u32,
        capacity: u64,
        connector_ino: u64,
        listener_ino: u64,
    ) -> Result<HeaderFields, RegionError> {
        if magic != MAGIC {
            return Err(RegionError::Magic(magic));
        }
        if version != LAYOUT_VERSION {
            return Err(RegionError::Version(version));
        }
        let waits = Waits::from_code(waits).ok_or(RegionError::WaitsCode(waits))?;
        if !valid_capacity(capacity) {
            return Err(RegionError::Capacity(capacity));
        }
        Ok(HeaderFields {
            waits,
            capacity,
            connector_ino,
            listener_ino,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The offsets every region has carried: a change is a new layout
    /// (and a new [`LAYOUT_VERSION`]).
    #[test]
    fn the_layout_is_pinned() {
        assert_eq!(offset_of!(Header, magic), 0);
        assert_eq!(offset_of!(Header, version), 8);
        assert_eq!(offset_of!(Header, waits), 12);
        assert_eq!(offset_of!(Header, capacity), 16);
        assert_eq!(offset_of!(Header, connector_ino), 24);
        assert_eq!(offset_of!(Header, listener_ino), 32);
        assert_eq!(offset_of!(Header, joined), 40);
        assert_eq!(offset_of!(Header, ends), 48);
        assert_eq!(offset_of!(Header, ringing), 56);
        assert_eq!(offset_of!(RingCtl, head), 0);
        assert_eq!(offset_of!(RingCtl, tail), 128);
        assert_eq!(offset_of!(RingCtl, data_waiter), 256);
        assert_eq!(offset_of!(RingCtl, space_waiter), 384);
        assert_eq!(offset_of!(RingCtl, closing), 512);
        assert_eq!(MAGIC.to_le_bytes(), *b"NGPRSHM\0");
        assert_eq!(region_bytes(4096), 5 * 4096);
        assert_eq!(ctl_offset(RingId::ToListener), 4096);
        assert_eq!(ctl_offset(RingId::ToConnector), 8192);
        assert_eq!(data_offset(RingId::ToConnector, 4096), 4 * 4096);
        assert_eq!(Role::Connector.tx(), RingId::ToListener);
        assert_eq!(Role::Listener.rx(), RingId::ToListener);
    }

    #[test]
    fn header_bytes_parse_back_and_bad_ones_are_named() {
        let f = HeaderFields {
            waits: Waits::Spin,
            capacity: 1 << 16,
            connector_ino: 7,
            listener_ino: 9,
        };
        assert_eq!(HeaderFields::parse(&f.to_bytes()).unwrap(), f);
        let bad = |at: usize, v: &[u8]| {
            let mut b = f.to_bytes();
            b[at..at + v.len()].copy_from_slice(v);
            HeaderFields::parse(&b).unwrap_err().to_string()
        };
        assert!(bad(0, b"x").contains("magic"));
        assert!(bad(8, &9u32.to_ne_bytes()).contains("version"));
        assert!(bad(12, &7u32.to_ne_bytes()).contains("wait"));
        assert!(bad(16, &5000u64.to_ne_bytes()).contains("power of two"));
        assert!(bad(16, &(2u64 << 30).to_ne_bytes()).contains("power of two"));
        assert!(HeaderFields::parse(&[0u8; 10]).is_err());
    }

    #[test]
    fn region_sizes_never_overflow() {
        assert_eq!(region_bytes_checked(4096), Some(5 * 4096));
        assert_eq!(region_bytes_checked(u64::MAX), None);
    }
}
