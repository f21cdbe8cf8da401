//! netgap's one shared-memory channel: the region two processes map, its
//! two single-producer, single-consumer byte rings, the rule by which an
//! end waits and is woken, and the checks of a region another process
//! made. Three users move bytes through it and none of them knows the
//! layout: the preload library (`netgap-preload`, a `cdylib`, so the
//! contract cannot live there), `netgap relay` (which maps the rings of
//! the library's connections to other hosts) and the `shm` transport of
//! `netgap-transport`. It depends on nothing of netgap, only on `libc`.
//!
//! # Layout
//!
//! A region is a file (a sealed memfd) mapped `MAP_SHARED` by both ends:
//!
//! | offset | bytes | content |
//! |---|---|---|
//! | 0 | 4096 | [`layout::Header`]: magic, layout version, [`Waits`], ring capacity, the ends' socket inodes and their end-of-connection words |
//! | 4096 | 4096 | [`layout::RingCtl`] of ring 0, [`RingId::ToListener`] (the connector produces) |
//! | 8192 | 4096 | [`layout::RingCtl`] of ring 1, [`RingId::ToConnector`] (the listener produces) |
//! | 12288 | capacity | data of ring 0 |
//! | 12288 + capacity | capacity | data of ring 1 |
//!
//! A control block holds the producer's index (`head`), the consumer's
//! (`tail`), the two waiter words and the producer's closing hint, each
//! alone on a 128-byte line ([`layout::Line`]: x86 cores fetch lines in
//! adjacent pairs, so a neighbour's writes would still steal a 64-byte
//! one).
//!
//! # Index discipline ([`ring`])
//!
//! `head` counts bytes ever produced, `tail` bytes ever consumed; each is
//! written by one side only, and both wrap at 2^64 (every comparison is a
//! wrapping difference), so `head - tail` is the bytes in the ring, never
//! more than its capacity, and byte `i` lives at offset `i & (capacity -
//! 1)`. The producer copies, then publishes the new `head` with a
//! `Release` store; the consumer loads `head` with `Acquire` before it
//! copies out, and publishes `tail` the same way.
//!
//! An end of the preload library or the relay reads its own index from the
//! ring on every call, never from a private copy: after `fork` the parent
//! or the child may carry on with a preload library's connection, so the
//! shared index is the only truth. The `shm` transport, which never forks
//! with its flows, keeps a private copy ([`OwnIndex::Private`]): loading
//! one's own index while the peer spins on its line costs a cross-core
//! transfer on some CPUs.
//! The peer's index is cached in the end's own memory and read again only
//! when the cache cannot satisfy the request, so a producer with room
//! reads nothing the consumer wrote: a small message costs two cache-line
//! transfers one way (the index, then the data), as in the C floor
//! program the `shm` transport is measured against. A cache is never
//! ahead of the truth (indices only grow), so it can only send an end to
//! read again.
//!
//! # Wake rule ([`wait`])
//!
//! An end about to wait sets its bit in the waiter word of what it waits
//! for (`data_waiter` of its incoming ring, `space_waiter` of its outgoing
//! one), fences, and looks at the ring once more; the other end, after it
//! moves an index, fences and, if the word is not zero, swaps it to zero,
//! wakes the futex sleepers on it and wakes the others as their bits say:
//! [`wait::WAIT_FUTEX`] sleeps on the word itself, [`wait::WAIT_FD`] in
//! `poll` or `epoll` on a descriptor (a doorbell byte wakes it),
//! [`wait::WAIT_BELL`] in an epoll that watches its relay's socket. The two
//! fences make a wake-up impossible to lose: either the waiter's second
//! look sees the index moved, or the mover sees the bit.
//!
//! A region made for [`Waits::Spin`] (the `shm` transport's poll mode)
//! promises that no end ever waits that way: an end there watches only
//! the peer's index word, and a producer skips the fence and the look at
//! the waiter word after each publish.
//!
//! # Trust ([`region`])
//!
//! A region mapped from another process is input from a stranger:
//! [`Region::open`] checks the file (a regular file sealed against
//! shrinking, so no access can turn into `SIGBUS`, of the size asked for),
//! then the header (magic, version, wait rule, a power-of-two capacity
//! whose rings exactly fill the mapping) and both rings' indices, before
//! anything is derived from it; every offset comes from the checked
//! capacity, never from what the header says later, and every index read
//! from the peer is checked again on use ([`RingError`]). Whatever the
//! peer writes, an end copies only bytes inside the mapping, and never
//! panics.
//!
//! # What each user adds
//!
//! - The preload library: the region's file (a memfd of its name, made by
//!   the connector, taken by the listener from the process the kernel
//!   names), the doorbells on the kernel socket that `WAIT_FD` asks for,
//!   the count of doorbells in flight (`Header::ringing`) and the ends'
//!   end-of-connection words, and its waits (spin, then sleep).
//! - `netgap relay`: the listener's end of a program's region, pumping it
//!   to and from its link; it wakes a program's `WAIT_BELL` with a byte on
//!   the program's socket to the relay.
//! - The `shm` transport: a region per flow, handed over a Unix socket;
//!   event mode sleeps with `WAIT_FUTEX`, poll mode makes a region of
//!   [`Waits::Spin`].

mod copy;
pub mod layout;
pub mod region;
pub mod ring;
pub mod wait;

pub use layout::{region_bytes, HeaderFields, RingId, Role, Waits};
pub use region::{Expect, Region, RegionError};
pub use ring::{Consumer, OwnIndex, Producer, RingError};

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
