//! Which session of a port an arriving frame belongs to, as plain code: no
//! sockets, no clock (every call is given the time), no threads.
//!
//! A process holds one AF_XDP socket per interface (its *port*), and every
//! xdp flow of the process on that interface is a *session* on it. Frames
//! carry the flow ids of both ends, so an arrival goes to the session whose
//! id is its destination flow id; a SYN to a listening id opens a new
//! session (its own id, drawn fresh, answers); anything else is dropped and
//! counted. Nothing a peer sends can make the table grow without bound:
//! sessions are capped ([`MAX_SESSIONS`]), and so are the sessions opened
//! by a SYN that the application has not accepted yet (half-open), which
//! also expire ([`HALF_OPEN_TIMEOUT_NS`]); the port gives them a small
//! receive window until they are accepted, so a flood of forged openings
//! holds little memory.

use super::reliable::{Kind, Mac};
use std::collections::VecDeque;

/// Sessions (flows) a port holds at most, listeners included.
pub const MAX_SESSIONS: usize = 256;
/// Half-open sessions a port holds at most.
pub const MAX_HALF_OPEN: usize = 64;
/// How long a half-open session waits for its peer or its accept.
pub const HALF_OPEN_TIMEOUT_NS: u64 = 5_000_000_000;
/// Draws of a random flow id before the free ids are searched in order.
const RANDOM_ID_DRAWS: u32 = 16;

/// A port's ids are all taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no free xdp flow id: {open} flows and listeners are open on this interface's port (at most {max})")]
pub struct Exhausted {
    /// Sessions and listeners open.
    pub open: usize,
    /// The cap.
    pub max: usize,
}

/// Where an arrival goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the session at this index of the table.
    Session(usize),
    /// A SYN to the listener of this id from a peer it has no session
    /// with: the caller opens one ([`Table::insert_accepted`]).
    Open {
        /// The listening flow id.
        listener: u16,
    },
    /// Nowhere: dropped (and counted).
    Drop,
}

/// One session's entry.
#[derive(Debug)]
pub struct Slot<T> {
    /// The session's flow id on this port.
    pub id: u16,
    /// The peer's MAC and flow id, once known.
    pub peer: Option<(Mac, u16)>,
    /// The listener whose SYN opened it (server side).
    pub listener: Option<u16>,
    /// Since when it is half-open (ns), if it is.
    half_open_since_ns: Option<u64>,
    /// The session's own state.
    pub value: T,
}

/// A listening flow id and its sessions not accepted yet, oldest first.
#[derive(Debug)]
struct Listening {
    id: u16,
    backlog: VecDeque<u16>,
}

/// Counts of what was dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// Frames for no session and no listener.
    pub unknown_flow_frames: u64,
    /// SYNs to a listener refused because the port was full (sessions or
    /// half-open sessions at their cap).
    pub refused_syns: u64,
    /// Half-open sessions expired.
    pub expired_half_open: u64,
}

/// A port's sessions and listeners.
#[derive(Debug)]
pub struct Table<T> {
    slots: Vec<Slot<T>>,
    listeners: Vec<Listening>,
    half_open: usize,
    max_sessions: usize,
    max_half_open: usize,
    half_open_timeout_ns: u64,
    drops: DropCounts,
}

impl<T> Table<T> {
    /// An empty table with the caps given.
    pub fn new(max_sessions: usize, max_half_open: usize, half_open_timeout_ns: u64) -> Table<T> {
        Table {
            slots: Vec::new(),
            listeners: Vec::new(),
            half_open: 0,
            max_sessions,
            max_half_open,
            half_open_timeout_ns,
            drops: DropCounts::default(),
        }
    }

    /// The port's usual caps.
    pub fn with_default_caps() -> Table<T> {
        Table::new(MAX_SESSIONS, MAX_HALF_OPEN, HALF_OPEN_TIMEOUT_NS)
    }

    /// Sessions and listeners open.
    pub fn open(&self) -> usize {
        self.slots.len() + self.listeners.len()
    }

    /// Sessions open.
    pub fn sessions(&self) -> usize {
        self.slots.len()
    }

    /// Half-open sessions.
    pub fn half_open(&self) -> usize {
        self.half_open
    }

    /// What was dropped so far.
    pub fn drops(&self) -> DropCounts {
        self.drops
    }

    fn taken(&self, id: u16) -> bool {
        self.slots.iter().any(|s| s.id == id) || self.listeners.iter().any(|l| l.id == id)
    }

    /// A free flow id (never 0): one of `random`'s draws, so a host that
    /// does not see the flow's frames cannot guess it, else the next free
    /// one after the last draw. Refused when the table is at its cap.
    pub fn alloc_id(&self, mut random: impl FnMut() -> u16) -> Result<u16, Exhausted> {
        let full = Exhausted {
            open: self.open(),
            max: self.max_sessions,
        };
        if self.open() >= self.max_sessions {
            return Err(full);
        }
        let mut last = 1u16;
        for _ in 0..RANDOM_ID_DRAWS {
            last = random().max(1);
            if !self.taken(last) {
                return Ok(last);
            }
        }
        let mut id = last;
        for _ in 0..u16::MAX {
            id = id.checked_add(1).unwrap_or(1);
            if !self.taken(id) {
                return Ok(id);
            }
        }
        Err(full)
    }

    /// Listens on `id` (from [`Table::alloc_id`]).
    pub fn listen(&mut self, id: u16) {
        self.listeners.push(Listening {
            id,
            backlog: VecDeque::new(),
        });
    }

    /// Stops listening on `id`; returns the ids of its sessions nobody
    /// accepted (the caller removes them).
    pub fn unlisten(&mut self, id: u16) -> Vec<u16> {
        let Some(i) = self.listeners.iter().position(|l| l.id == id) else {
            return Vec::new();
        };
        self.listeners.swap_remove(i).backlog.into()
    }

    /// Adds a session of id `id` (from [`Table::alloc_id`]) that this end
    /// opens (client side).
    pub fn insert(&mut self, id: u16, value: T) {
        self.slots.push(Slot {
            id,
            peer: None,
            listener: None,
            half_open_since_ns: None,
            value,
        });
    }

    /// Adds a session of id `id` opened by `peer`'s SYN to `listener`, at
    /// `now_ns`: half-open, and in the listener's backlog.
    pub fn insert_accepted(
        &mut self,
        id: u16,
        listener: u16,
        peer: (Mac, u16),
        now_ns: u64,
        value: T,
    ) {
        self.slots.push(Slot {
            id,
            peer: Some(peer),
            listener: Some(listener),
            half_open_since_ns: Some(now_ns),
            value,
        });
        self.half_open += 1;
        if let Some(l) = self.listeners.iter_mut().find(|l| l.id == listener) {
            l.backlog.push_back(id);
        }
    }

    /// Removes session `id`; its state, if it was there.
    pub fn remove(&mut self, id: u16) -> Option<T> {
        let i = self.index(id)?;
        let slot = self.slots.swap_remove(i);
        if slot.half_open_since_ns.is_some() {
            self.half_open -= 1;
        }
        if let Some(l) = slot
            .listener
            .and_then(|lid| self.listeners.iter_mut().find(|l| l.id == lid))
        {
            l.backlog.retain(|&b| b != id);
        }
        Some(slot.value)
    }

    /// The index of session `id`. A port with one session finds it at the
    /// first comparison.
    pub fn index(&self, id: u16) -> Option<usize> {
        self.slots.iter().position(|s| s.id == id)
    }

    /// The session at `i`.
    pub fn slot_mut(&mut self, i: usize) -> &mut Slot<T> {
        &mut self.slots[i]
    }

    /// Every session.
    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut Slot<T>> {
        self.slots.iter_mut()
    }

    /// Where a frame of `kind` from `src`'s flow `src_flow` to flow
    /// `dst_flow` goes. A drop is counted.
    pub fn route(&mut self, src: Mac, kind: Kind, dst_flow: u16, src_flow: u16) -> Route {
        if let Some(i) = self.index(dst_flow) {
            return Route::Session(i);
        }
        if kind == Kind::Syn {
            // A SYN again (its answer was lost): the session it opened,
            // even once the listener is gone (taken, then closed).
            if let Some(i) = self
                .slots
                .iter()
                .position(|s| s.listener == Some(dst_flow) && s.peer == Some((src, src_flow)))
            {
                return Route::Session(i);
            }
        }
        if kind == Kind::Syn && self.listeners.iter().any(|l| l.id == dst_flow) {
            if src_flow == 0
                || self.open() >= self.max_sessions
                || self.half_open >= self.max_half_open
            {
                self.drops.refused_syns += 1;
                return Route::Drop;
            }
            return Route::Open { listener: dst_flow };
        }
        self.drops.unknown_flow_frames += 1;
        Route::Drop
    }

    /// The session at `i` is no longer half-open (the application took
    /// it).
    pub fn confirmed(&mut self, i: usize) {
        if self.slots[i].half_open_since_ns.take().is_some() {
            self.half_open -= 1;
        }
    }

    /// The oldest session of `listener`'s backlog, taken by the
    /// application (no longer half-open).
    pub fn accept(&mut self, listener: u16) -> Option<u16> {
        let id = self
            .listeners
            .iter_mut()
            .find(|l| l.id == listener)?
            .backlog
            .pop_front()?;
        if let Some(i) = self.index(id) {
            self.confirmed(i);
        }
        Some(id)
    }

    /// Removes the half-open sessions older than the timeout at `now_ns`;
    /// returns their states.
    pub fn expire(&mut self, now_ns: u64) -> Vec<T> {
        if self.half_open == 0 {
            return Vec::new();
        }
        let timeout = self.half_open_timeout_ns;
        let old: Vec<u16> = self
            .slots
            .iter()
            .filter(|s| {
                s.half_open_since_ns
                    .is_some_and(|t| now_ns.saturating_sub(t) >= timeout)
            })
            .map(|s| s.id)
            .collect();
        let mut gone = Vec::with_capacity(old.len());
        for id in old {
            if let Some(v) = self.remove(id) {
                self.drops.expired_half_open += 1;
                gone.push(v);
            }
        }
        gone
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    const A: Mac = [2, 0, 0, 0, 0, 0xa];
    const B: Mac = [2, 0, 0, 0, 0, 0xb];

    fn counter(start: u16) -> impl FnMut() -> u16 {
        let mut n = start;
        move || {
            n = n.wrapping_add(1);
            n
        }
    }

    #[test]
    fn frames_go_to_the_session_of_their_destination_flow_id() {
        let mut t: Table<&str> = Table::with_default_caps();
        t.insert(7, "seven");
        t.insert(9, "nine");
        let Route::Session(i) = t.route(A, Kind::Data, 9, 100) else {
            panic!("not routed")
        };
        assert_eq!(t.slot_mut(i).value, "nine");
        let Route::Session(i) = t.route(B, Kind::Ack, 7, 5) else {
            panic!("not routed")
        };
        assert_eq!(t.slot_mut(i).value, "seven");
        assert_eq!(t.drops(), DropCounts::default());
    }

    #[test]
    fn a_frame_for_no_flow_is_dropped_and_counted() {
        let mut t: Table<()> = Table::with_default_caps();
        t.insert(7, ());
        t.listen(8);
        assert_eq!(t.route(A, Kind::Data, 11, 1), Route::Drop);
        // Only a SYN opens a session at a listener.
        assert_eq!(t.route(A, Kind::Data, 8, 1), Route::Drop);
        assert_eq!(t.drops().unknown_flow_frames, 2);
        t.remove(7);
        assert_eq!(t.route(A, Kind::Data, 7, 1), Route::Drop);
        assert_eq!(t.drops().unknown_flow_frames, 3);
    }

    #[test]
    fn a_syn_to_a_listener_opens_one_session_per_peer_flow() {
        let mut t: Table<u16> = Table::with_default_caps();
        t.listen(8);
        assert_eq!(t.route(A, Kind::Syn, 8, 1), Route::Open { listener: 8 });
        t.insert_accepted(20, 8, (A, 1), 0, 20);
        // The same opening again goes to its session, not a new one.
        assert_eq!(t.route(A, Kind::Syn, 8, 1), Route::Session(0));
        // Another peer flow, or another host, is a new session.
        assert_eq!(t.route(A, Kind::Syn, 8, 2), Route::Open { listener: 8 });
        assert_eq!(t.route(B, Kind::Syn, 8, 1), Route::Open { listener: 8 });
        t.insert_accepted(21, 8, (B, 1), 0, 21);
        assert_eq!(t.half_open(), 2);
        assert_eq!(t.accept(8), Some(20));
        assert_eq!(t.accept(8), Some(21));
        assert_eq!(t.accept(8), None);
        assert_eq!(t.half_open(), 0);
        // The listener closes: an opening repeated still reaches the
        // session it opened; a new one is for no flow.
        assert!(t.unlisten(8).is_empty());
        assert_eq!(t.route(A, Kind::Syn, 8, 1), Route::Session(0));
        assert_eq!(t.route(A, Kind::Syn, 8, 3), Route::Drop);
        assert_eq!(t.drops().unknown_flow_frames, 1);
    }

    #[test]
    fn half_open_sessions_are_capped_and_expire() {
        let mut t: Table<u16> = Table::new(256, 4, 1000);
        t.listen(8);
        for f in 1..=4u16 {
            assert_eq!(t.route(A, Kind::Syn, 8, f), Route::Open { listener: 8 });
            t.insert_accepted(100 + f, 8, (A, f), 10 * u64::from(f), f);
        }
        // A flood of forged openings: refused, counted, nothing grows.
        for f in 5..1000u16 {
            assert_eq!(t.route(A, Kind::Syn, 8, f), Route::Drop);
        }
        assert_eq!(t.drops().refused_syns, 995);
        assert_eq!(t.sessions(), 4);
        // One is taken by the application: room for one more.
        let i = t.index(101).unwrap();
        t.confirmed(i);
        assert_eq!(t.half_open(), 3);
        assert_eq!(t.route(B, Kind::Syn, 8, 1), Route::Open { listener: 8 });
        // The rest time out; the confirmed one stays.
        let gone = t.expire(1040);
        assert_eq!(gone.len(), 3, "{gone:?}");
        assert_eq!(t.half_open(), 0);
        assert_eq!(t.sessions(), 1);
        assert_eq!(t.drops().expired_half_open, 3);
        // Expired ones left the backlog too.
        assert_eq!(t.accept(8), Some(101));
        assert_eq!(t.accept(8), None);
    }

    #[test]
    fn flow_ids_are_unique_never_zero_and_refused_when_exhausted() {
        let mut t: Table<()> = Table::new(300, 64, 1000);
        // A source that draws the same id every time still yields unique
        // ones.
        for _ in 0..299 {
            let id = t.alloc_id(|| 0).unwrap();
            assert_ne!(id, 0);
            assert!(t.index(id).is_none());
            t.insert(id, ());
        }
        let l = t.alloc_id(counter(40)).unwrap();
        assert!(t.index(l).is_none());
        t.listen(l);
        let e = t.alloc_id(counter(0)).unwrap_err();
        assert_eq!(
            e,
            Exhausted {
                open: 300,
                max: 300
            }
        );
        let line = e.to_string();
        assert!(
            line.contains("no free xdp flow id") && !line.contains('\n'),
            "{line}"
        );
        // A closed flow frees its id.
        t.unlisten(l);
        assert!(t.alloc_id(counter(0)).is_ok());
    }

    #[test]
    fn no_stream_of_frames_grows_the_table_past_its_caps() {
        // Frames of every kind from a few hosts to a few ids, a listener's
        // openings taken as the port takes them, the clock running: the
        // table stays within its caps, and expiry empties what nobody
        // accepted.
        let mut t: Table<()> = Table::new(32, 8, 1000);
        t.listen(5);
        t.insert(6, ());
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let kinds = [
            Kind::Syn,
            Kind::SynAck,
            Kind::Data,
            Kind::Ack,
            Kind::Probe,
            Kind::Fin,
            Kind::Reset,
        ];
        for now in 0..20_000u64 {
            let r = next();
            let src: Mac = [2, 0, 0, 0, 0, (r % 3) as u8];
            let kind = kinds[(r >> 8) as usize % kinds.len()];
            let dst = [5, 6, 7, 0][(r >> 16) as usize % 4];
            let src_flow = (r >> 24) as u16 % 64;
            if let Route::Open { listener } = t.route(src, kind, dst, src_flow) {
                let id = t.alloc_id(|| 0).unwrap();
                t.insert_accepted(id, listener, (src, src_flow), now / 10, ());
            }
            assert!(t.open() <= 32 && t.half_open() <= 8, "{now}");
            t.expire(now / 10);
        }
        let d = t.drops();
        assert!(d.refused_syns > 0 && d.unknown_flow_frames > 0 && d.expired_half_open > 0);
        t.expire(u64::MAX);
        assert_eq!((t.sessions(), t.half_open()), (1, 0));
    }
}
