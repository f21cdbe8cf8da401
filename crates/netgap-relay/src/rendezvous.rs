//! Where a direct connection's two halves meet, as plain code (the caller
//! passes the time): on the accepting host, a program's `Accept` request
//! and the other relay's `QUEUE_OFFER` for the same connection key, in
//! whichever order they come; on the connecting host, the program's
//! `Connect` request waiting for the other relay's `QUEUE_ANSWER`.
//!
//! Whichever half comes first waits, bounded: a waiting request's own
//! thread gives up after [`DIRECT_WAIT`] ([`Rendezvous::withdraw`]) and
//! refuses its program; a parked offer (no thread waits for it) past
//! [`DIRECT_WAIT`] is handed back by [`Rendezvous::expired`] for a
//! `NoQueue` answer. An `Accept` this relay refused (its caps, its
//! socket, its wait ran out) leaves its key behind for [`DIRECT_WAIT`]
//! ([`Rendezvous::refuse`]), so that the offer coming after it is
//! answered `NoQueue` at once and the connecting side falls back to the
//! relays while its connection is still there, not after its own wait.
//! Requests are capped per uid and in all, parked offers in all
//! ([`MAX_PARKED_OFFERS`]), refused keys in all ([`MAX_REFUSED_KEYS`]),
//! so neither a program nor the other relay can grow the table.

use netgap_proto::preload::RELAY_KEY_BYTES;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long either half of a direct connection waits for the other.
pub(crate) const DIRECT_WAIT: Duration = Duration::from_secs(3);

/// Most offers of the other relays parked at once, waiting for their
/// program's `Accept`.
pub(crate) const MAX_PARKED_OFFERS: usize = 64;

/// Most keys of refused `Accept`s remembered at once; past it the oldest
/// is forgotten (its offer then waits out [`DIRECT_WAIT`] as before).
pub(crate) const MAX_REFUSED_KEYS: usize = 256;

/// A connection's key.
pub(crate) type Key = [u8; RELAY_KEY_BYTES];

/// Why a request or an offer is not parked.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum PendingError {
    /// The asker's uid has as many direct requests waiting as it may.
    #[error("{0} direct requests of this uid wait already (--max-per-uid)")]
    PerUid(u32),
    /// As many direct requests wait as the relay takes.
    #[error("{0} direct requests wait already (--max-total)")]
    Total(u32),
    /// As many offers wait for their program as the relay keeps.
    #[error("{MAX_PARKED_OFFERS} offers of other relays wait already")]
    Offers,
    /// Something waits with the same key on the same side.
    #[error("a direct request with the same key waits already")]
    KeyTaken,
    /// This relay refused the connection's `Accept` already.
    #[error("this relay refused the connection's own direct request")]
    RefusedHere,
}

/// What waits under a key.
enum What<W, O> {
    /// A program's `Accept`, waiting for the offer (its mailbox).
    Accept(W),
    /// A program's `Connect`, waiting for the answer to its offer.
    Asked(W),
    /// The other relay's offer, waiting for the program's `Accept`.
    Offer(O),
}

struct Entry<W, O> {
    uid: Option<u32>,
    since: Instant,
    what: What<W, O>,
}

/// What an `Accept` finds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AcceptStep<O> {
    /// The other relay's offer was there first.
    Matched(O),
    /// Parked: the offer will come to the mailbox.
    Parked,
}

/// What an offer finds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OfferStep<W, O> {
    /// The program's `Accept` waits: its mailbox, and the offer for it.
    Matched(W, O),
    /// Parked until the program asks.
    Parked,
    /// Not kept (the table is full, or the key is taken): the offer
    /// back, to be answered `NoQueue`.
    Refused(O, PendingError),
}

/// The direct requests and the offers waiting for their other half, by
/// the connection's key; `W` is a waiting request's mailbox, `O` a
/// parked offer.
pub(crate) struct Rendezvous<W, O> {
    waiting: HashMap<Key, Entry<W, O>>,
    /// Keys of `Accept`s refused, oldest first, with when.
    refused: std::collections::VecDeque<(Key, Instant)>,
    per_uid: HashMap<u32, u32>,
    requests: u32,
    offers: usize,
    max_per_uid: u32,
    max_total: u32,
}

impl<W, O> Rendezvous<W, O> {
    /// Nothing waits; at most `max_per_uid` requests of a uid and
    /// `max_total` in all may.
    pub(crate) fn new(max_per_uid: u32, max_total: u32) -> Rendezvous<W, O> {
        Rendezvous {
            waiting: HashMap::new(),
            refused: std::collections::VecDeque::new(),
            per_uid: HashMap::new(),
            requests: 0,
            offers: 0,
            max_per_uid,
            max_total,
        }
    }

    fn admit(&self, uid: u32, key: &Key) -> Result<(), PendingError> {
        if self.waiting.contains_key(key) {
            return Err(PendingError::KeyTaken);
        }
        if self.per_uid.get(&uid).copied().unwrap_or(0) >= self.max_per_uid {
            return Err(PendingError::PerUid(self.max_per_uid));
        }
        if self.requests >= self.max_total {
            return Err(PendingError::Total(self.max_total));
        }
        Ok(())
    }

    fn insert(&mut self, key: Key, uid: Option<u32>, what: What<W, O>, now: Instant) {
        match uid {
            Some(uid) => {
                *self.per_uid.entry(uid).or_insert(0) += 1;
                self.requests += 1;
            }
            None => self.offers += 1,
        }
        self.waiting.insert(
            key,
            Entry {
                uid,
                since: now,
                what,
            },
        );
    }

    fn remove(&mut self, key: &Key) -> Option<Entry<W, O>> {
        let e = self.waiting.remove(key)?;
        match e.uid {
            Some(uid) => {
                self.requests = self.requests.saturating_sub(1);
                if let Some(n) = self.per_uid.get_mut(&uid) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.per_uid.remove(&uid);
                    }
                }
            }
            None => self.offers = self.offers.saturating_sub(1),
        }
        Some(e)
    }

    /// A program of `uid` accepts the connection `key`: the offer that
    /// came first, or its mailbox parked for the offer.
    pub(crate) fn accept(
        &mut self,
        key: Key,
        uid: u32,
        mailbox: W,
        now: Instant,
    ) -> Result<AcceptStep<O>, PendingError> {
        if matches!(self.waiting.get(&key), Some(e) if matches!(e.what, What::Offer(_)) && now.saturating_duration_since(e.since) < DIRECT_WAIT)
        {
            if let Some(Entry {
                what: What::Offer(o),
                ..
            }) = self.remove(&key)
            {
                return Ok(AcceptStep::Matched(o));
            }
        }
        self.admit(uid, &key)?;
        self.insert(key, Some(uid), What::Accept(mailbox), now);
        Ok(AcceptStep::Parked)
    }

    /// A program of `uid` connects with `key`: its mailbox waits for the
    /// other relay's answer.
    pub(crate) fn ask(
        &mut self,
        key: Key,
        uid: u32,
        mailbox: W,
        now: Instant,
    ) -> Result<(), PendingError> {
        self.admit(uid, &key)?;
        self.insert(key, Some(uid), What::Asked(mailbox), now);
        Ok(())
    }

    /// The other relay's offer for `key`: the mailbox of the `Accept`
    /// waiting for it, or parked for the `Accept` to come.
    pub(crate) fn offer(&mut self, key: Key, offer: O, now: Instant) -> OfferStep<W, O> {
        if matches!(self.waiting.get(&key), Some(e) if matches!(e.what, What::Accept(_))) {
            if let Some(Entry {
                what: What::Accept(w),
                ..
            }) = self.remove(&key)
            {
                return OfferStep::Matched(w, offer);
            }
        }
        if self.waiting.contains_key(&key) {
            return OfferStep::Refused(offer, PendingError::KeyTaken);
        }
        self.forget_refused(now);
        if let Some(i) = self.refused.iter().position(|(k, _)| *k == key) {
            self.refused.remove(i);
            return OfferStep::Refused(offer, PendingError::RefusedHere);
        }
        if self.offers >= MAX_PARKED_OFFERS {
            return OfferStep::Refused(offer, PendingError::Offers);
        }
        self.insert(key, None, What::Offer(offer), now);
        OfferStep::Parked
    }

    /// The other relay's answer for `key`: the mailbox of the `Connect`
    /// that waits for it, if one does.
    pub(crate) fn answer(&mut self, key: &Key) -> Option<W> {
        if !matches!(self.waiting.get(key), Some(e) if matches!(e.what, What::Asked(_))) {
            return None;
        }
        match self.remove(key)?.what {
            What::Asked(w) => Some(w),
            _ => None,
        }
    }

    /// A waiting request gives up (its wait ran out): whether it still
    /// waited (false: its other half took it meanwhile).
    pub(crate) fn withdraw(&mut self, key: &Key) -> bool {
        let waits = matches!(
            self.waiting.get(key),
            Some(e) if matches!(e.what, What::Accept(_) | What::Asked(_))
        );
        waits && self.remove(key).is_some()
    }

    /// This relay refused the `Accept` of `key` (after
    /// [`Rendezvous::withdraw`] if it waited): an offer for it coming
    /// within [`DIRECT_WAIT`] is refused at once. An offer parked under
    /// the key is taken out and handed back, to be answered `NoQueue`.
    pub(crate) fn refuse(&mut self, key: Key, now: Instant) -> Option<O> {
        if matches!(self.waiting.get(&key), Some(e) if matches!(e.what, What::Offer(_))) {
            if let Some(Entry {
                what: What::Offer(o),
                ..
            }) = self.remove(&key)
            {
                return Some(o);
            }
        }
        if self.waiting.contains_key(&key) {
            // Another request of the same key waits: its offer is its own.
            return None;
        }
        self.forget_refused(now);
        if self.refused.len() >= MAX_REFUSED_KEYS {
            self.refused.pop_front();
        }
        self.refused.push_back((key, now));
        None
    }

    fn forget_refused(&mut self, now: Instant) {
        while matches!(self.refused.front(), Some((_, t)) if now.saturating_duration_since(*t) >= DIRECT_WAIT)
        {
            self.refused.pop_front();
        }
    }

    /// The parked offers older than [`DIRECT_WAIT`], taken out, to be
    /// answered `NoQueue`.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<O> {
        let old: Vec<Key> = self
            .waiting
            .iter()
            .filter(|(_, e)| {
                matches!(e.what, What::Offer(_))
                    && now.saturating_duration_since(e.since) >= DIRECT_WAIT
            })
            .map(|(k, _)| *k)
            .collect();
        old.iter()
            .filter_map(|k| match self.remove(k)?.what {
                What::Offer(o) => Some(o),
                _ => None,
            })
            .collect()
    }

    /// Keys of refused `Accept`s remembered.
    #[cfg(test)]
    pub(crate) fn refused_keys(&self) -> usize {
        self.refused.len()
    }

    /// Requests waiting, offers parked.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (u32, usize) {
        (self.requests, self.offers)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    const A: Key = [1; RELAY_KEY_BYTES];
    const B: Key = [2; RELAY_KEY_BYTES];

    fn table() -> Rendezvous<&'static str, u16> {
        Rendezvous::new(2, 3)
    }

    #[test]
    fn an_accept_and_an_offer_meet_by_key_in_either_order() {
        let now = Instant::now();
        let mut t = table();
        assert_eq!(t.accept(A, 7, "mailbox", now), Ok(AcceptStep::Parked));
        assert_eq!(t.offer(B, 5, now), OfferStep::Parked, "another key");
        assert_eq!(t.offer(A, 4, now), OfferStep::Matched("mailbox", 4));
        assert_eq!(t.accept(B, 7, "late", now), Ok(AcceptStep::Matched(5)));
        assert_eq!(t.counts(), (0, 0));
    }

    #[test]
    fn an_answer_finds_only_the_connect_that_asked() {
        let now = Instant::now();
        let mut t = table();
        t.ask(A, 7, "asked", now).unwrap();
        assert_eq!(t.answer(&B), None);
        assert_eq!(t.answer(&A), Some("asked"));
        assert_eq!(t.answer(&A), None, "only once");
        t.accept(B, 7, "accept", now).unwrap();
        assert_eq!(t.answer(&B), None, "an accept waits for an offer");
        assert!(t.withdraw(&B));
    }

    #[test]
    fn a_request_that_gave_up_is_gone_and_one_taken_cannot_give_up() {
        let now = Instant::now();
        let mut t = table();
        t.accept(A, 7, "mailbox", now).unwrap();
        assert!(t.withdraw(&A));
        assert!(!t.withdraw(&A));
        assert_eq!(t.offer(A, 1, now), OfferStep::Parked, "nothing waits now");
        assert!(!t.withdraw(&A), "an offer is not a request's to withdraw");
        assert_eq!(t.counts(), (0, 1));
    }

    #[test]
    fn parked_offers_expire_after_the_wait_and_an_old_one_is_not_matched() {
        let t0 = Instant::now();
        let mut t = table();
        assert_eq!(t.offer(A, 1, t0), OfferStep::Parked);
        assert_eq!(t.offer(B, 2, t0 + DIRECT_WAIT / 2), OfferStep::Parked);
        assert!(t.expired(t0 + DIRECT_WAIT / 2).is_empty());
        assert_eq!(t.expired(t0 + DIRECT_WAIT), vec![1]);
        // An offer past its wait is not matched even before a sweep.
        let later = t0 + DIRECT_WAIT * 2;
        assert!(matches!(
            t.accept(B, 7, "late", later),
            Err(PendingError::KeyTaken)
        ));
        assert_eq!(t.expired(later), vec![2]);
        assert_eq!(t.accept(B, 7, "late", later), Ok(AcceptStep::Parked));
    }

    #[test]
    fn an_offer_for_a_refused_accept_is_refused_at_once_within_the_wait() {
        let t0 = Instant::now();
        let mut t = table();
        assert_eq!(t.refuse(A, t0), None);
        assert_eq!(
            t.offer(A, 1, t0 + DIRECT_WAIT / 2),
            OfferStep::Refused(1, PendingError::RefusedHere)
        );
        assert_eq!(t.offer(A, 2, t0), OfferStep::Parked, "refused once only");
        assert_eq!(t.refuse(A, t0), Some(2), "a parked offer comes back");
        assert_eq!(t.counts(), (0, 0));
        t.refuse(B, t0);
        assert_eq!(
            t.offer(B, 3, t0 + DIRECT_WAIT),
            OfferStep::Parked,
            "forgotten"
        );
        for i in 0..MAX_REFUSED_KEYS + 5 {
            let mut k = [0xb0; RELAY_KEY_BYTES];
            k[..8].copy_from_slice(&(i as u64).to_le_bytes());
            t.refuse(k, t0);
        }
        assert_eq!(t.refused_keys(), MAX_REFUSED_KEYS);
        t.accept(A, 7, "waits", t0).unwrap();
        assert_eq!(t.refuse(A, t0), None, "another accept's key is kept");
        assert_eq!(t.offer(A, 4, t0), OfferStep::Matched("waits", 4));
    }

    #[test]
    fn requests_are_capped_per_uid_and_in_all_and_offers_in_all() {
        let now = Instant::now();
        let mut t: Rendezvous<u8, u16> = Rendezvous::new(2, 3);
        t.accept([1; 32], 7, 0, now).unwrap();
        t.ask([2; 32], 7, 0, now).unwrap();
        assert_eq!(t.ask([3; 32], 7, 0, now), Err(PendingError::PerUid(2)));
        t.ask([3; 32], 8, 0, now).unwrap();
        assert_eq!(t.ask([4; 32], 9, 0, now), Err(PendingError::Total(3)));
        assert_eq!(t.ask([1; 32], 9, 0, now), Err(PendingError::KeyTaken));
        assert!(t.withdraw(&[1; 32]));
        t.ask([4; 32], 9, 0, now).unwrap();
        for i in 0..MAX_PARKED_OFFERS {
            let mut k = [0xa0; 32];
            k[..8].copy_from_slice(&(i as u64).to_le_bytes());
            assert_eq!(t.offer(k, 1, now), OfferStep::Parked);
        }
        assert_eq!(
            t.offer([0xff; 32], 9, now),
            OfferStep::Refused(9, PendingError::Offers)
        );
        assert_eq!(
            t.offer([2; 32], 9, now),
            OfferStep::Refused(9, PendingError::KeyTaken),
            "an offer for a connect's own key"
        );
    }
}
