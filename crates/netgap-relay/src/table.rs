//! The link table as plain data: which other hosts the relay has a link
//! to, which link is being opened, and what a request for a link does
//! next. The hub keeps it under a lock and a condition variable; the
//! table itself never waits, sends or maps anything, so its transitions
//! are tested here without a flow.
//!
//! A host's entry goes: none → opening (one request claims it and opens
//! the link; the others for that host wait) → up (requests use the link
//! while it is not closing, wait while it closes) → none (the opening
//! failed, or the link's threads ended). An entry is counted against the
//! relay's most links from the claim on, so the listens that open links
//! always find room on the xdp port.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// What the table needs to know of a link.
pub(crate) trait LinkState {
    /// The link takes no new connection (closing or broken); its entry
    /// stays until its threads end.
    fn closing(&self) -> bool;
}

/// What this relay's link to one other host is doing; a host with no
/// entry has no link, and the next listen or connect for it opens one.
enum State<L> {
    /// A request is opening the link (listening for the other relay's
    /// flow, or connecting to it): the others for that host wait for
    /// it.
    Opening,
    /// The link, until both its threads have ended (also while it
    /// closes: requests then wait for its entry to go).
    Up(Arc<L>),
}

/// What a request for a link to a host does next.
pub(crate) enum Step<L> {
    /// Use this link: it is up and takes connections.
    Use(Arc<L>),
    /// Open the link: the caller claimed the entry, and must make it up
    /// ([`LinkTable::up`]) or give it back ([`LinkTable::forget`]).
    Open,
    /// Wait: another request opens the link, or it closes.
    Wait,
}

/// No room for another link: `links` are open or opening.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Full {
    links: usize,
}

impl std::error::Error for Full {}

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} links to other hosts are open or opening, the most this relay holds (--max-links)",
            self.links
        )
    }
}

/// The links by the other host's TCP address: the peer address of the
/// programs' connections, which both ends of a connection know before
/// any link exists.
pub(crate) struct LinkTable<L> {
    links: HashMap<IpAddr, State<L>>,
    max_links: usize,
}

impl<L: LinkState> LinkTable<L> {
    /// An empty table holding at most `max_links` entries.
    pub(crate) fn new(max_links: usize) -> LinkTable<L> {
        LinkTable {
            links: HashMap::new(),
            max_links,
        }
    }

    /// What a request for a link to `peer` does now; a host with no
    /// entry is claimed for the caller (opening), if there is room.
    pub(crate) fn enter(&mut self, peer: IpAddr) -> Result<Step<L>, Full> {
        match self.links.get(&peer) {
            Some(State::Up(link)) if !link.closing() => Ok(Step::Use(Arc::clone(link))),
            Some(_) => Ok(Step::Wait),
            None if self.links.len() >= self.max_links => Err(Full {
                links: self.links.len(),
            }),
            None => {
                self.links.insert(peer, State::Opening);
                Ok(Step::Open)
            }
        }
    }

    /// The link to `peer` is up.
    pub(crate) fn up(&mut self, peer: IpAddr, link: Arc<L>) {
        self.links.insert(peer, State::Up(link));
    }

    /// The claim on `peer`'s entry is given back: opening the link
    /// failed.
    pub(crate) fn forget(&mut self, peer: IpAddr) {
        self.links.remove(&peer);
    }

    /// `link`'s threads ended: its entry goes, unless a newer link to
    /// the same host has taken it.
    pub(crate) fn gone(&mut self, peer: IpAddr, link: &Arc<L>) {
        if matches!(self.links.get(&peer), Some(State::Up(l)) if Arc::ptr_eq(l, link)) {
            self.links.remove(&peer);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    struct Fake {
        closing: AtomicBool,
    }

    impl LinkState for Fake {
        fn closing(&self) -> bool {
            self.closing.load(Ordering::SeqCst)
        }
    }

    fn host(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 1, n])
    }

    fn step(t: &mut LinkTable<Fake>, peer: IpAddr) -> &'static str {
        match t.enter(peer).unwrap() {
            Step::Use(_) => "use",
            Step::Open => "open",
            Step::Wait => "wait",
        }
    }

    #[test]
    fn the_first_request_opens_the_others_wait_then_use_the_link() {
        let mut t = LinkTable::new(4);
        assert_eq!(step(&mut t, host(2)), "open");
        assert_eq!(step(&mut t, host(2)), "wait");
        // Another host's link opens beside it.
        assert_eq!(step(&mut t, host(3)), "open");
        let link = Arc::new(Fake::default());
        t.up(host(2), Arc::clone(&link));
        match t.enter(host(2)).unwrap() {
            Step::Use(l) => assert!(Arc::ptr_eq(&l, &link)),
            _ => panic!("the link is up"),
        }
    }

    #[test]
    fn a_closing_link_makes_requests_wait_until_its_entry_goes() {
        let mut t = LinkTable::new(4);
        assert_eq!(step(&mut t, host(2)), "open");
        let link = Arc::new(Fake::default());
        t.up(host(2), Arc::clone(&link));
        link.closing.store(true, Ordering::SeqCst);
        assert_eq!(step(&mut t, host(2)), "wait");
        t.gone(host(2), &link);
        assert_eq!(step(&mut t, host(2)), "open");
    }

    #[test]
    fn a_failed_opening_gives_the_host_back() {
        let mut t = LinkTable::new(1);
        assert_eq!(step(&mut t, host(2)), "open");
        t.forget(host(2));
        assert_eq!(step(&mut t, host(2)), "open");
    }

    #[test]
    fn an_old_links_end_leaves_its_successors_entry() {
        let mut t = LinkTable::new(4);
        assert_eq!(step(&mut t, host(2)), "open");
        let old = Arc::new(Fake::default());
        let new = Arc::new(Fake::default());
        t.up(host(2), Arc::clone(&new));
        t.gone(host(2), &old);
        assert_eq!(step(&mut t, host(2)), "use");
    }

    #[test]
    fn opening_links_count_against_the_most_links() {
        let mut t = LinkTable::new(2);
        assert_eq!(step(&mut t, host(2)), "open");
        assert_eq!(step(&mut t, host(3)), "open");
        let e = t.enter(host(4)).err().unwrap();
        assert_eq!(e, Full { links: 2 });
        assert!(e.to_string().contains("(--max-links)"), "{e}");
        // A host that has an entry is not refused.
        assert_eq!(step(&mut t, host(2)), "wait");
        t.forget(host(3));
        assert_eq!(step(&mut t, host(4)), "open");
    }
}
