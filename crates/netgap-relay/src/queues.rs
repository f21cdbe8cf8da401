//! The interface's queues a direct connection may take, as plain code:
//! queues `1..count` (queue 0 is the relay's own port; `count` is the
//! interface's receive queues, at most `MAX_QUEUES`), less those held by
//! a granted connection and those an offer in flight named. An offer
//! names a quarter of the free queues (at least one, at most
//! [`OFFER_QUEUES`]), the lowest (the highest from the relay at the
//! higher address of the two, so two relays' offers to each other at
//! once differ), and reserves them until its answer settles it (the agreed queue held, the
//! others freed), so two offers in flight never get the same queue and
//! offers made at the same moment each find queues while any are free. A
//! uid holds at most its cap of queues, and never every queue of an
//! interface that has two or more.
//!
//! A queue released a moment ago is taken or offered only when no other
//! is free ([`COOLING`]), and then the one released longest ago: the
//! kernel frees the last socket's hold on a queue in deferred work after
//! its close, and a bind meanwhile fails with `EBUSY` (waited out, up to
//! tens of milliseconds, inside a connection's setup). Short connections
//! one after another (a gather's) so take turns on the queues rather
//! than wait on one.

use netgap_proto::direct::{agree, free_queues, MAX_QUEUES};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long a released queue is passed over while others are free: more
/// than the kernel's deferred freeing of a closed AF_XDP socket's queue
/// takes on a loaded host (a few to tens of milliseconds).
pub(crate) const COOLING: Duration = Duration::from_millis(200);

/// Most queues one offer names and reserves: enough for the other relay
/// to find one free at its end too (both ends' busy queues are mostly the
/// same ones, those of the connections between the same two hosts), few
/// enough that a busy client's offers made at once (a web client's, one
/// per worker) each get their own. An offer takes a quarter of the free
/// queues, at most this many and at least one, so the fewer are free the
/// more offers at once still find one.
pub(crate) const OFFER_QUEUES: u32 = 4;

/// Why no queue is taken.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum QueueError {
    /// Every queue is held or offered.
    #[error("no free queue on {0} (every queue but 0 is taken)")]
    NoneFree(String),
    /// None free at both ends.
    #[error("no queue free at both ends")]
    NoneShared,
    /// The uid holds as many queues as it may.
    #[error("this uid holds {0} direct queues already, the most it may (--max-direct-per-uid)")]
    UidCap(u32),
    /// An answer naming a queue the offer did not reserve.
    #[error("the other relay agreed on queue {0}, which this relay did not offer")]
    NotOffered(u16),
}

/// The queues of one interface and who holds or offered them.
#[derive(Debug)]
pub(crate) struct Queues {
    iface: String,
    count: u16,
    /// Held queue → the uid whose connection holds it.
    held: HashMap<u16, u32>,
    /// Offer's token → (uid, the mask it reserved).
    offered: HashMap<u64, (u32, u32)>,
    /// Released queue → when, while [`COOLING`].
    released: HashMap<u16, Instant>,
    max_per_uid: u32,
}

impl Queues {
    /// `count` receive queues on `iface` (more than `MAX_QUEUES` are
    /// not named); a uid holds at most `max_per_uid`.
    pub(crate) fn new(iface: &str, count: u16, max_per_uid: u32) -> Queues {
        Queues {
            iface: iface.to_string(),
            count: count.min(MAX_QUEUES),
            held: HashMap::new(),
            offered: HashMap::new(),
            released: HashMap::new(),
            max_per_uid,
        }
    }

    /// What one uid may hold: its cap, and never every usable queue
    /// when there are two or more.
    fn uid_cap(&self) -> u32 {
        let usable = u32::from(self.count.saturating_sub(1));
        self.max_per_uid.min(usable.saturating_sub(1).max(1))
    }

    fn check_uid(&self, uid: u32) -> Result<(), QueueError> {
        let mine = self.held.values().filter(|&&u| u == uid).count() as u32
            + self.offered.values().filter(|(u, _)| *u == uid).count() as u32;
        if mine >= self.uid_cap() {
            return Err(QueueError::UidCap(self.uid_cap()));
        }
        Ok(())
    }

    /// Queues neither held nor offered.
    pub(crate) fn free(&self) -> u32 {
        let reserved = self.offered.values().fold(0u32, |m, (_, o)| m | o);
        free_queues(self.count, self.held.keys().copied()) & !reserved
    }

    /// The queues released within [`COOLING`] of `now`.
    fn cooling(&mut self, now: Instant) -> u32 {
        self.released
            .retain(|_, at| now.saturating_duration_since(*at) < COOLING);
        self.released
            .keys()
            .filter(|&&q| q < MAX_QUEUES)
            .fold(0u32, |m, &q| m | (1u32 << q))
    }

    /// The `n` queues of `mask` released longest ago (each of `mask` is
    /// cooling): where every free queue was released a moment ago (short
    /// connections one after another, more of them in [`COOLING`] than
    /// there are queues), the one the kernel most likely let go of, not
    /// the lowest, which may be the one released last.
    fn longest_cooled(&self, mask: u32, n: u32) -> u32 {
        let mut by_age: Vec<(Instant, u16)> = self
            .released
            .iter()
            .filter(|&(&q, _)| q < MAX_QUEUES && mask & (1u32 << q) != 0)
            .map(|(&q, &at)| (at, q))
            .collect();
        by_age.sort_unstable();
        by_age
            .iter()
            .take(n as usize)
            .fold(0u32, |m, &(_, q)| m | (1u32 << q))
    }

    /// An offer of `uid`'s, as `token`: a quarter of the free queues (at
    /// least one, at most [`OFFER_QUEUES`]), reserved until
    /// [`Queues::settle`]; the lowest, or the highest when `from_top`.
    /// The relay at the higher address of the two offers from the top, so
    /// offers the two relays make to each other at the same moment (two
    /// programs that connect to each other at once) name different
    /// queues, where each would find the queues the other named reserved
    /// by its own offer.
    pub(crate) fn offer(
        &mut self,
        token: u64,
        uid: u32,
        from_top: bool,
    ) -> Result<u32, QueueError> {
        self.check_uid(uid)?;
        let free = self.free();
        let n = (free.count_ones() / 4).clamp(1, OFFER_QUEUES);
        let cooling = self.cooling(Instant::now());
        let mask = match free & !cooling {
            0 => self.longest_cooled(free, n),
            settled if from_top => highest(settled, n),
            settled => lowest(settled, n),
        };
        if mask == 0 {
            return Err(QueueError::NoneFree(self.iface.clone()));
        }
        self.offered.insert(token, (uid, mask));
        Ok(mask)
    }

    /// The answer to offer `token`: the agreed queue is held (if the
    /// offer named it), every other queue it reserved freed.
    pub(crate) fn settle(&mut self, token: u64, agreed: Option<u16>) -> Result<(), QueueError> {
        let Some((uid, mask)) = self.offered.remove(&token) else {
            return Ok(());
        };
        match agreed {
            None => Ok(()),
            Some(q) if q < MAX_QUEUES && mask & (1u32 << q) != 0 => {
                self.held.insert(q, uid);
                Ok(())
            }
            Some(q) => Err(QueueError::NotOffered(q)),
        }
    }

    /// The accepting side: the lowest queue free here and in the other
    /// end's offer `theirs`, held for `uid`.
    pub(crate) fn take(&mut self, uid: u32, theirs: u32) -> Result<u16, QueueError> {
        self.check_uid(uid)?;
        let ours = self.free();
        if ours == 0 {
            return Err(QueueError::NoneFree(self.iface.clone()));
        }
        let cooling = self.cooling(Instant::now());
        let q = agree(ours & !cooling, theirs)
            .or_else(|| agree(self.longest_cooled(ours & theirs & !1, 1), theirs))
            .ok_or(QueueError::NoneShared)?;
        self.held.insert(q, uid);
        Ok(q)
    }

    /// Queue `q` is free again (its connection's program hung up).
    pub(crate) fn release(&mut self, q: u16) {
        if self.held.remove(&q).is_some() {
            self.released.insert(q, Instant::now());
        }
    }
}

/// The lowest `n` bits set in `mask`.
fn lowest(mut mask: u32, n: u32) -> u32 {
    let mut kept = 0;
    for _ in 0..n {
        if mask == 0 {
            break;
        }
        let bit = mask & mask.wrapping_neg();
        kept |= bit;
        mask &= !bit;
    }
    kept
}

/// The `n` highest bits of `mask` (all of them when it has fewer).
fn highest(mut mask: u32, n: u32) -> u32 {
    let mut kept = 0;
    for _ in 0..n {
        if mask == 0 {
            break;
        }
        let bit = 1u32 << (31 - mask.leading_zeros());
        kept |= bit;
        mask &= !bit;
    }
    kept
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn queue_zero_is_never_taken_and_a_released_queue_is_free_again() {
        let mut q = Queues::new("eth1", 4, 8);
        assert_eq!(q.free(), 0b1110);
        assert_eq!(q.take(1, !1).unwrap(), 1);
        assert_eq!(q.take(2, 0b1100).unwrap(), 2);
        assert_eq!(q.free(), 0b1000);
        q.release(1);
        assert_eq!(q.free(), 0b1010);
        assert_eq!(q.take(3, 0b0010).unwrap(), 1, "the same queue again");
        assert_eq!(q.take(3, 0b0100), Err(QueueError::NoneShared));
    }

    /// A queue whose socket the kernel may still be freeing is passed
    /// over while another is free, and taken when it is the only one.
    #[test]
    fn a_queue_just_released_waits_while_another_is_free() {
        let mut q = Queues::new("eth1", 4, 8);
        assert_eq!(q.take(1, !1).unwrap(), 1);
        q.release(1);
        assert_eq!(q.take(2, !1).unwrap(), 2, "not the queue just released");
        let offer = q.offer(7, 3, false).unwrap();
        assert_eq!(offer, 0b1000, "the offer names the settled queue");
        q.settle(7, None).unwrap();
        q.released.insert(1, Instant::now() - COOLING);
        assert_eq!(q.offer(8, 3, false).unwrap(), 0b0010, "cooled down");
        q.settle(8, None).unwrap();
        q.release(2);
        q.held.insert(3, 9);
        q.held.insert(1, 9);
        assert_eq!(
            q.take(3, !1).unwrap(),
            2,
            "the only free one, cooling or not"
        );
    }

    /// Every free queue released a moment ago: the offer names, and the
    /// accepting side takes, those released longest ago, not the lowest.
    #[test]
    fn among_queues_all_just_released_the_one_released_longest_ago_goes_first() {
        let mut q = Queues::new("eth1", 8, 8);
        let now = Instant::now();
        // Queues 1 to 7 released 7 to 1 ms ago: queue 7 longest ago.
        for k in 1..8u16 {
            q.released
                .insert(k, now - Duration::from_millis(u64::from(k)));
        }
        assert_eq!(
            q.offer(1, 3, false).unwrap(),
            0b1000_0000,
            "one of seven free"
        );
        q.settle(1, None).unwrap();
        assert_eq!(q.take(3, 0b0110_0110).unwrap(), 6, "of 1, 2, 5 and 6");
        // One settled queue goes before any cooling one, older or not.
        q.released.remove(&1);
        assert_eq!(q.take(4, 0b1011_1110).unwrap(), 1);
    }

    #[test]
    fn an_offer_reserves_its_queues_until_its_answer() {
        let mut q = Queues::new("eth1", 32, 30);
        assert_eq!(
            q.offer(1, 10, false).unwrap(),
            0b1_1110,
            "four queues at most"
        );
        assert_eq!(q.take(11, 0b1_1110), Err(QueueError::NoneShared));
        q.settle(1, Some(2)).unwrap();
        assert_eq!(q.free() & 0b11_1111, 0b11_1010);
        assert_eq!(q.offer(2, 11, false).unwrap(), 0b11_1010);
        assert_eq!(q.settle(2, Some(2)), Err(QueueError::NotOffered(2)));
        assert_eq!(q.free() & 0b11_1111, 0b11_1010, "a refused answer frees it");
        assert_eq!(q.offer(3, 11, false).unwrap(), 0b11_1010);
        q.settle(3, None).unwrap();
        assert_eq!(q.free() & 0b11_1111, 0b11_1010);
    }

    #[test]
    fn offers_made_at_once_each_get_their_own_queues_while_any_are_free() {
        let mut q = Queues::new("eth1", 4, 8);
        assert_eq!(
            q.offer(1, 10, false).unwrap(),
            0b0010,
            "a quarter, at least one"
        );
        assert_eq!(q.offer(2, 11, false).unwrap(), 0b0100);
        assert_eq!(q.offer(3, 12, false).unwrap(), 0b1000);
        assert!(matches!(
            q.offer(4, 13, false),
            Err(QueueError::NoneFree(_))
        ));
        q.settle(2, Some(2)).unwrap();
        q.settle(1, None).unwrap();
        q.settle(3, None).unwrap();
        assert_eq!(q.free(), 0b1010);

        let mut q = Queues::new("eth1", 32, 30);
        let masks: Vec<u32> = (0..14).map(|t| q.offer(t, 7, false).unwrap()).collect();
        let sizes: Vec<u32> = masks.iter().map(|m| m.count_ones()).collect();
        assert_eq!(sizes, [4, 4, 4, 4, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1]);
        assert!(matches!(
            q.offer(14, 7, false),
            Err(QueueError::NoneFree(_))
        ));
        for (i, m) in masks.iter().enumerate() {
            for other in &masks[i + 1..] {
                assert_eq!(m & other, 0, "no queue in two offers");
            }
        }
        // Each answer holds one queue and frees the others for the next.
        for (t, m) in masks.iter().enumerate() {
            q.settle(t as u64, Some(m.trailing_zeros() as u16)).unwrap();
        }
        assert_eq!(q.offer(14, 8, false).unwrap().count_ones(), 4);
        assert_eq!(lowest(0b1011_0100, 2), 0b0001_0100);
        assert_eq!(lowest(0b100, 4), 0b100);
    }

    #[test]
    fn offers_two_relays_make_to_each_other_at_once_name_different_queues() {
        // Eight queues, as the testbed's xdp veths have: a quarter of the
        // seven free is one queue each.
        let (mut low, mut high) = (Queues::new("eth1", 8, 8), Queues::new("eth1", 8, 8));
        let from_low = low.offer(1, 10, false).unwrap();
        let from_high = high.offer(1, 10, true).unwrap();
        assert_eq!((from_low, from_high), (0b10, 0b1000_0000));
        // Each answers the other's offer while its own is in flight.
        assert_eq!(low.take(10, from_high).unwrap(), 7);
        assert_eq!(high.take(10, from_low).unwrap(), 1);
        assert_eq!(highest(0b1011_0100, 2), 0b1010_0000);
        assert_eq!(highest(0b100, 4), 0b100);
    }

    #[test]
    fn one_uid_never_holds_every_queue_nor_past_its_cap() {
        let mut q = Queues::new("eth1", 4, 8);
        q.take(7, 0b1110).unwrap();
        q.take(7, 0b1110).unwrap();
        assert_eq!(q.take(7, 0b1110), Err(QueueError::UidCap(2)));
        assert_eq!(q.take(8, 0b1110).unwrap(), 3, "another uid takes the last");
        let mut q = Queues::new("eth1", 32, 3);
        for token in 0..3 {
            let m = q.offer(token, 7, false).unwrap();
            q.settle(token, Some(m.trailing_zeros() as u16)).unwrap();
        }
        assert_eq!(q.offer(99, 7, false), Err(QueueError::UidCap(3)));
        let one = Queues::new("eth1", 2, 8);
        assert_eq!(one.uid_cap(), 1, "a single usable queue can be held");
        assert_eq!(Queues::new("eth1", 1, 8).free(), 0, "one queue: none");
    }
}
