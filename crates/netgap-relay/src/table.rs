//! The link table as plain data: which links the relay holds to each
//! other host, which requests are opening one, and what a request for a
//! link does next. The hub keeps it under a lock and a condition
//! variable; the table itself never waits, sends or maps anything, so
//! its transitions are tested here without a flow.
//!
//! A host's entry holds its live links (the one listens name first) and
//! at most one listen and one connect opening a link. A listen opens one
//! when the host has neither link nor opening; a connect opens one when
//! no link ends at its target, even while a listen of this relay waits
//! for the other relay's flow: the other relay may be waiting for this
//! one's just the same (both hosts' programs listen, then connect to each
//! other), and neither flow would come. When both relays open at once,
//! each holds two links to the other: while both are new (up less than
//! [`LinkState::settled`] says) the one whose connecting end is the lower
//! address is named, at both ends alike, and the other carries the
//! connections already opened on it until it closes after its linger. A
//! new link next to a settled one is the other relay's anew (it lost the
//! old one): it is named from then on. The entry goes when it has no link
//! and no opening; it counts against the relay's most links from the
//! first claim, so the listens that open links always find room on the
//! xdp port.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// What the table needs to know of a link.
pub(crate) trait LinkState {
    /// The link takes no new connection (closing or broken); it stays
    /// in its entry until its threads end.
    fn closing(&self) -> bool;
    /// This relay connected the link's flow (rather than accepted it).
    fn connected_here(&self) -> bool;
    /// This relay's end of the link has the lower address of the two.
    fn lower_here(&self) -> bool;
    /// The link has been up longer than two relays' crossing openings
    /// take: a new link beside it is no crossing.
    fn settled(&self) -> bool;
}

/// Which request asks for a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A listen: the accepting side, which names a link (or a flow of
    /// its own to come) to the program.
    Listen,
    /// A connect to the other relay's end the program was given.
    Connect,
}

/// A host's links and openings.
struct Entry<L> {
    /// The live links to the host; the first is the one listens name.
    links: Vec<Arc<L>>,
    /// A listen waits for the other relay's flow.
    listening: bool,
    /// A connect opens a flow to the other relay.
    connecting: bool,
}

impl<L: LinkState> Entry<L> {
    fn claimed(&mut self, role: Role) -> &mut bool {
        match role {
            Role::Listen => &mut self.listening,
            Role::Connect => &mut self.connecting,
        }
    }

    fn empty(&self) -> bool {
        self.links.is_empty() && !self.listening && !self.connecting
    }
}

/// What a request for a link to a host does next.
pub(crate) enum Step<L> {
    /// Use this link: it is up, takes connections and fits the request.
    Use(Arc<L>),
    /// Open a link: the caller claimed the opening for its role, and
    /// must make the link up ([`LinkTable::up`]) or give the claim back
    /// ([`LinkTable::forget`]).
    Open,
    /// Wait: another request opens a link, or the host's links close.
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

/// Whether `link` is the one two crossing links leave named: the one
/// whose connecting end has the lower address. Both relays see the two
/// links alike, so they name the same one.
fn wins_a_crossing<L: LinkState>(link: &L) -> bool {
    link.connected_here() == link.lower_here()
}

/// The links by the other host's TCP address: the peer address of the
/// programs' connections, which both ends of a connection know before
/// any link exists.
pub(crate) struct LinkTable<L> {
    hosts: HashMap<IpAddr, Entry<L>>,
    max_links: usize,
}

impl<L: LinkState> LinkTable<L> {
    /// An empty table holding at most `max_links` hosts' entries.
    pub(crate) fn new(max_links: usize) -> LinkTable<L> {
        LinkTable {
            hosts: HashMap::new(),
            max_links,
        }
    }

    /// What a request of `role` for a link to `peer` does now: use the
    /// first live link that `fits` it (a listen takes any; a connect the
    /// one that ends at its target), open one (a listen when the host has
    /// no link and no opening, a connect when no link fits and no other
    /// connect opens one), or wait. A host with no entry is claimed for
    /// the caller, if there is room.
    pub(crate) fn enter(
        &mut self,
        peer: IpAddr,
        role: Role,
        fits: impl Fn(&L) -> bool,
    ) -> Result<Step<L>, Full> {
        let room = self.hosts.len() < self.max_links;
        let Some(e) = self.hosts.get_mut(&peer) else {
            if !room {
                return Err(Full {
                    links: self.hosts.len(),
                });
            }
            let mut e = Entry {
                links: Vec::new(),
                listening: false,
                connecting: false,
            };
            *e.claimed(role) = true;
            self.hosts.insert(peer, e);
            return Ok(Step::Open);
        };
        if let Some(l) = e.links.iter().find(|l| !l.closing() && fits(l)) {
            return Ok(Step::Use(Arc::clone(l)));
        }
        let live = e.links.iter().any(|l| !l.closing());
        let open = match role {
            // Any live link fits a listen: it waits for the links that
            // close, or for the opening under way.
            Role::Listen => !e.listening && !e.connecting && e.links.is_empty(),
            // A live link that does not fit: the other relay listens at
            // a new end (crossing this relay's, or anew). Closing links
            // alone: their entry goes first, as the other relay's does.
            Role::Connect => !e.connecting && (live || e.links.is_empty()),
        };
        if open {
            *e.claimed(role) = true;
            return Ok(Step::Open);
        }
        Ok(Step::Wait)
    }

    /// `link` to `peer` is up, opened by the claim of its role (it gives
    /// that claim back). Returns the link listens no longer name or never
    /// named, when the host has another: that one carries what it carries
    /// until it closes.
    pub(crate) fn up(&mut self, peer: IpAddr, link: Arc<L>) -> Option<Arc<L>> {
        let e = self.hosts.entry(peer).or_insert_with(|| Entry {
            links: Vec::new(),
            listening: false,
            connecting: false,
        });
        let role = if link.connected_here() {
            Role::Connect
        } else {
            Role::Listen
        };
        *e.claimed(role) = false;
        let named = e.links.iter().position(|l| !l.closing());
        let Some(i) = named else {
            e.links.insert(0, link);
            return None;
        };
        let old = Arc::clone(&e.links[i]);
        let replaces = old.settled() || (wins_a_crossing(&*link) && !wins_a_crossing(&*old));
        if replaces {
            e.links.insert(0, link);
            Some(old)
        } else {
            e.links.push(Arc::clone(&link));
            Some(link)
        }
    }

    /// The claim of `role` on `peer`'s entry is given back: opening the
    /// link failed, or the request no longer needs one.
    pub(crate) fn forget(&mut self, peer: IpAddr, role: Role) {
        if let Some(e) = self.hosts.get_mut(&peer) {
            *e.claimed(role) = false;
            if e.empty() {
                self.hosts.remove(&peer);
            }
        }
    }

    /// `link`'s threads ended: it leaves its host's entry, and the entry
    /// goes with its last link and opening.
    pub(crate) fn gone(&mut self, peer: IpAddr, link: &Arc<L>) {
        if let Some(e) = self.hosts.get_mut(&peer) {
            e.links.retain(|l| !Arc::ptr_eq(l, link));
            if e.empty() {
                self.hosts.remove(&peer);
            }
        }
    }

    /// The live links to `peer` that do not `fit`: for the caller to
    /// close the stale ones.
    pub(crate) fn others(&self, peer: IpAddr, fits: impl Fn(&L) -> bool) -> Vec<Arc<L>> {
        self.hosts.get(&peer).map_or_else(Vec::new, |e| {
            e.links
                .iter()
                .filter(|l| !l.closing() && !fits(l))
                .cloned()
                .collect()
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A link as the table sees it; `flow` stands for the end it has at
    /// the other relay.
    #[derive(Default)]
    struct Fake {
        closing: AtomicBool,
        connected_here: bool,
        lower_here: bool,
        settled: AtomicBool,
        flow: u16,
    }

    impl LinkState for Fake {
        fn closing(&self) -> bool {
            self.closing.load(Ordering::SeqCst)
        }
        fn connected_here(&self) -> bool {
            self.connected_here
        }
        fn lower_here(&self) -> bool {
            self.lower_here
        }
        fn settled(&self) -> bool {
            self.settled.load(Ordering::SeqCst)
        }
    }

    fn host(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 1, n])
    }

    /// A link this relay accepted (`connected` false) or connected, at
    /// the lower end of the two or not, ending at `flow`.
    fn link(connected: bool, lower: bool, flow: u16) -> Arc<Fake> {
        Arc::new(Fake {
            connected_here: connected,
            lower_here: lower,
            flow,
            ..Fake::default()
        })
    }

    fn step(t: &mut LinkTable<Fake>, peer: IpAddr, role: Role) -> &'static str {
        match t.enter(peer, role, |_| true).unwrap() {
            Step::Use(_) => "use",
            Step::Open => "open",
            Step::Wait => "wait",
        }
    }

    /// What a connect to the other relay's end `flow` does.
    fn connect(
        t: &mut LinkTable<Fake>,
        peer: IpAddr,
        flow: u16,
    ) -> Result<Arc<Fake>, &'static str> {
        match t.enter(peer, Role::Connect, |l| l.flow == flow).unwrap() {
            Step::Use(l) => Ok(l),
            Step::Open => Err("open"),
            Step::Wait => Err("wait"),
        }
    }

    /// The link a listen names now.
    fn named(t: &mut LinkTable<Fake>, peer: IpAddr) -> Arc<Fake> {
        match t.enter(peer, Role::Listen, |_| true).unwrap() {
            Step::Use(l) => l,
            _ => panic!("no link is named"),
        }
    }

    #[test]
    fn the_first_request_opens_the_others_wait_then_use_the_link() {
        let mut t = LinkTable::new(4);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
        assert_eq!(step(&mut t, host(2), Role::Listen), "wait");
        // Another host's link opens beside it.
        assert_eq!(step(&mut t, host(3), Role::Listen), "open");
        let l = link(false, true, 7);
        assert!(t.up(host(2), Arc::clone(&l)).is_none());
        assert!(Arc::ptr_eq(&named(&mut t, host(2)), &l));
        assert!(Arc::ptr_eq(&connect(&mut t, host(2), 7).unwrap(), &l));
    }

    #[test]
    fn a_listen_waits_while_a_connect_opens_the_link() {
        let mut t = LinkTable::new(4);
        assert_eq!(connect(&mut t, host(2), 7).err(), Some("open"));
        assert_eq!(connect(&mut t, host(2), 7).err(), Some("wait"));
        assert_eq!(step(&mut t, host(2), Role::Listen), "wait");
        let l = link(true, true, 7);
        assert!(t.up(host(2), Arc::clone(&l)).is_none());
        assert!(Arc::ptr_eq(&named(&mut t, host(2)), &l));
        assert!(Arc::ptr_eq(&connect(&mut t, host(2), 7).unwrap(), &l));
    }

    #[test]
    fn a_closing_link_makes_requests_wait_until_its_entry_goes() {
        let mut t = LinkTable::new(4);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
        let l = link(false, true, 7);
        t.up(host(2), Arc::clone(&l));
        l.closing.store(true, Ordering::SeqCst);
        assert_eq!(step(&mut t, host(2), Role::Listen), "wait");
        assert_eq!(connect(&mut t, host(2), 7).err(), Some("wait"));
        assert_eq!(connect(&mut t, host(2), 8).err(), Some("wait"));
        t.gone(host(2), &l);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
    }

    #[test]
    fn a_failed_opening_gives_the_host_back() {
        let mut t = LinkTable::new(1);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
        t.forget(host(2), Role::Listen);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
        t.forget(host(2), Role::Listen);
        assert_eq!(connect(&mut t, host(2), 7).err(), Some("open"));
        t.forget(host(2), Role::Connect);
        assert!(t.hosts.is_empty());
    }

    #[test]
    fn an_old_links_end_leaves_its_successors_entry() {
        let mut t = LinkTable::new(4);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
        let old = link(false, true, 7);
        let new = link(false, true, 8);
        t.up(host(2), Arc::clone(&new));
        t.gone(host(2), &old);
        assert!(Arc::ptr_eq(&named(&mut t, host(2)), &new));
    }

    #[test]
    fn opening_links_count_against_the_most_links() {
        let mut t = LinkTable::new(2);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
        assert_eq!(step(&mut t, host(3), Role::Listen), "open");
        let e = t.enter(host(4), Role::Connect, |_| true).err().unwrap();
        assert_eq!(e, Full { links: 2 });
        assert!(e.to_string().contains("(--max-links)"), "{e}");
        // A host that has an entry is not refused, nor is its crossing
        // connect.
        assert_eq!(step(&mut t, host(2), Role::Listen), "wait");
        assert_eq!(connect(&mut t, host(2), 9).err(), Some("open"));
        t.forget(host(3), Role::Listen);
        assert_eq!(step(&mut t, host(4), Role::Listen), "open");
    }

    /// Both relays got a listen first (each waits for the other's flow),
    /// then a connect to the other's end: each connect opens a flow of
    /// its own rather than wait behind the listen.
    #[test]
    fn a_connect_opens_its_link_while_a_listen_waits_for_the_other_relays_flow() {
        let mut t = LinkTable::new(1);
        assert_eq!(step(&mut t, host(2), Role::Listen), "open");
        assert_eq!(connect(&mut t, host(2), 8).err(), Some("open"));
        // One opening of each role at a time.
        assert_eq!(connect(&mut t, host(2), 8).err(), Some("wait"));
        assert_eq!(step(&mut t, host(2), Role::Listen), "wait");
    }

    /// The connect's flow comes up, and the other relay's connection
    /// comes on it rather than to this relay's listen (the other relay
    /// had its link before its connect): the listen gives its claim
    /// back, and the one link serves both ways.
    #[test]
    fn a_crossing_that_makes_one_link_leaves_that_link() {
        for listen_ends_first in [false, true] {
            let mut t = LinkTable::new(1);
            assert_eq!(step(&mut t, host(2), Role::Listen), "open");
            assert_eq!(connect(&mut t, host(2), 8).err(), Some("open"));
            let c = link(true, true, 8);
            if listen_ends_first {
                t.forget(host(2), Role::Listen);
                assert!(t.up(host(2), Arc::clone(&c)).is_none());
            } else {
                assert!(t.up(host(2), Arc::clone(&c)).is_none());
                // The listen still waits for its flow: the link is used.
                assert!(Arc::ptr_eq(&named(&mut t, host(2)), &c));
                t.forget(host(2), Role::Listen);
            }
            assert!(Arc::ptr_eq(&named(&mut t, host(2)), &c));
            assert!(Arc::ptr_eq(&connect(&mut t, host(2), 8).unwrap(), &c));
            t.gone(host(2), &c);
            assert!(t.hosts.is_empty(), "the entry goes with its last link");
        }
    }

    /// Both relays opened at once: each has the link it connected and the
    /// one it accepted, in either order. Both name the link whose
    /// connecting end is the lower relay; the other keeps carrying what
    /// was opened on it.
    #[test]
    fn two_crossing_links_leave_the_lower_connectors_named_at_both_ends() {
        for lower_here in [true, false] {
            for connected_first in [true, false] {
                let mut t = LinkTable::new(1);
                assert_eq!(step(&mut t, host(2), Role::Listen), "open");
                assert_eq!(connect(&mut t, host(2), 8).err(), Some("open"));
                // Connected to the other's end (flow 8); accepted at this
                // end (flow 7).
                let c = link(true, lower_here, 8);
                let a = link(false, lower_here, 7);
                let (first, second) = if connected_first { (&c, &a) } else { (&a, &c) };
                assert!(t.up(host(2), Arc::clone(first)).is_none());
                let aside = t.up(host(2), Arc::clone(second)).unwrap();
                let (kept, other) = if lower_here { (&c, &a) } else { (&a, &c) };
                assert!(
                    Arc::ptr_eq(&aside, other),
                    "lower {lower_here}, connected first {connected_first}"
                );
                assert!(Arc::ptr_eq(&named(&mut t, host(2)), kept));
                // A connect to either end finds its link: nothing opened
                // on the other is lost, nothing goes twice.
                assert!(Arc::ptr_eq(&connect(&mut t, host(2), 8).unwrap(), &c));
                assert!(Arc::ptr_eq(&connect(&mut t, host(2), 7).unwrap(), &a));
                // Both claims are given back by the links' coming up.
                assert!(!t.hosts[&host(2)].listening && !t.hosts[&host(2)].connecting);
                // The other closes after its linger; the kept one stays named.
                other.closing.store(true, Ordering::SeqCst);
                t.gone(host(2), other);
                assert!(Arc::ptr_eq(&named(&mut t, host(2)), kept));
                t.gone(host(2), kept);
                assert!(t.hosts.is_empty());
            }
        }
    }

    /// A connect whose target is a new end of a host this relay has a
    /// settled link to: the other relay lost that link and listens
    /// anew. The new link is named from then on.
    #[test]
    fn a_link_opened_anew_beside_a_settled_one_is_named() {
        for lower_here in [true, false] {
            let mut t = LinkTable::new(1);
            assert_eq!(step(&mut t, host(2), Role::Listen), "open");
            let old = link(false, lower_here, 7);
            t.up(host(2), Arc::clone(&old));
            old.settled.store(true, Ordering::SeqCst);
            assert_eq!(connect(&mut t, host(2), 9).err(), Some("open"));
            let others = t.others(host(2), |l| l.flow == 9);
            assert_eq!(others.len(), 1);
            assert!(Arc::ptr_eq(&others[0], &old));
            let new = link(true, lower_here, 9);
            let aside = t.up(host(2), Arc::clone(&new)).unwrap();
            assert!(Arc::ptr_eq(&aside, &old));
            assert!(Arc::ptr_eq(&named(&mut t, host(2)), &new));
            assert!(t.others(host(2), |l| l.flow == 9 || l.flow == 7).is_empty());
        }
    }

    /// Two relays, the lower (0) and the higher (1), in one host pair:
    /// each gets a listen for the other's program's connection and a
    /// connect to the end the other's listen named. A flow opened to a
    /// listening end comes up at both ends at once.
    struct Pair {
        tables: [LinkTable<Fake>; 2],
        /// The end a listen of each relay waits at for a flow.
        accepting: [Option<u16>; 2],
        /// The end each relay's listen named.
        named: [Option<u16>; 2],
    }

    const OWN_END: [u16; 2] = [10, 20];

    impl Pair {
        fn listen(&mut self, r: usize) {
            let name = match self.tables[r]
                .enter(host(2), Role::Listen, |_| true)
                .unwrap()
            {
                Step::Use(l) => l.flow,
                Step::Open => {
                    self.accepting[r] = Some(OWN_END[r]);
                    OWN_END[r]
                }
                Step::Wait => panic!("relay {r}'s listen waits with nothing opening"),
            };
            self.named[r] = Some(name);
        }

        /// Relay `r`'s connect to the other's named end; the flow of the
        /// link it goes on.
        fn connect(&mut self, r: usize) -> u16 {
            let o = 1 - r;
            let target = self.named[o].unwrap();
            match self.tables[r]
                .enter(host(2), Role::Connect, |l| l.flow == target)
                .unwrap()
            {
                Step::Use(l) => {
                    // The OPEN takes the other's listen on this link: that
                    // listen waits for no flow any more.
                    if self.accepting[o].take().is_some() {
                        self.tables[o].forget(host(2), Role::Listen);
                    }
                    l.flow
                }
                Step::Open => {
                    assert_eq!(self.accepting[o], Some(target), "relay {o} listens there");
                    self.accepting[o] = None;
                    self.tables[r].up(host(2), link(true, r == 0, target));
                    self.tables[o].up(host(2), link(false, o == 0, target));
                    target
                }
                Step::Wait => panic!("relay {r}'s connect waits"),
            }
        }

        fn links(&self, r: usize) -> Vec<u16> {
            self.tables[r].hosts[&host(2)]
                .links
                .iter()
                .map(|l| l.flow)
                .collect()
        }
    }

    /// Every order of the four requests (each connect after the listen
    /// whose end it targets): no request waits, each connection goes on a
    /// link both relays hold, and both name the same link, the lower
    /// relay's connector when there are two.
    #[test]
    fn every_order_of_two_relays_listens_and_connects_leaves_one_named_link() {
        // Events: 0 and 1 are the listens, 2 and 3 the connects of relay
        // 0 and 1.
        let mut orders = Vec::new();
        for a in 0..4 {
            for b in 0..4 {
                for c in 0..4 {
                    for d in 0..4 {
                        let o = [a, b, c, d];
                        let at = |e: usize| o.iter().position(|&x| x == e).unwrap();
                        let distinct = (0..4).all(|e| o.contains(&e));
                        if distinct && at(1) < at(2) && at(0) < at(3) {
                            orders.push(o);
                        }
                    }
                }
            }
        }
        assert_eq!(orders.len(), 6);
        for order in orders {
            let mut p = Pair {
                tables: [LinkTable::new(1), LinkTable::new(1)],
                accepting: [None, None],
                named: [None, None],
            };
            let mut carried = Vec::new();
            for e in order {
                match e {
                    0 | 1 => p.listen(e),
                    _ => carried.push(p.connect(e - 2)),
                }
            }
            let (l0, l1) = (p.links(0), p.links(1));
            assert_eq!(l0[0], l1[0], "{order:?}: both relays name one link");
            let mut both = l0.clone();
            both.sort_unstable();
            let mut other = l1.clone();
            other.sort_unstable();
            assert_eq!(both, other, "{order:?}: the same links at both ends");
            if l0.len() == 2 {
                assert_eq!(
                    l0[0], OWN_END[1],
                    "{order:?}: the lower relay's connector is named"
                );
            }
            for c in carried {
                assert!(
                    both.contains(&c),
                    "{order:?}: connection on a link both hold"
                );
            }
            for t in &p.tables {
                let e = &t.hosts[&host(2)];
                assert!(
                    !e.listening && !e.connecting,
                    "{order:?}: no opening is left"
                );
            }
        }
    }
}
