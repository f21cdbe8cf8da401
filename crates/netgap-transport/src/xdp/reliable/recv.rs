//! The receiving half's workings: reassembly of arrivals in sequence
//! order, the credit it grants, and when it owes an acknowledgment.

use super::*;

impl RecvWindow {
    /// A receiver expecting sequence `isn` first (the peer's initial
    /// sequence number), with frames of at most `mss` payload bytes and
    /// room for `capacity_bytes` not yet read.
    pub fn new(isn: u32, mss: usize, capacity_bytes: usize) -> RecvWindow {
        RecvWindow::capped(isn, mss, capacity_bytes, MAX_WINDOW_FRAMES)
    }

    /// A receiver as [`RecvWindow::new`] makes, whose credits announce at
    /// most `cap_frames` past the next in-order frame from the first (see
    /// [`RecvWindow::cap_credit`]).
    pub fn capped(isn: u32, mss: usize, capacity_bytes: usize, cap_frames: u32) -> RecvWindow {
        let mss = mss.max(1);
        let mut w = RecvWindow {
            next: isn,
            mss,
            capacity_bytes: capacity_bytes.max(mss),
            ready: VecDeque::new(),
            ahead: BTreeMap::new(),
            ahead_bytes: 0,
            fin_seq: None,
            closed: false,
            ack_owed: false,
            owed_frames: 0,
            owed_since_ns: None,
            credit_sent: 0,
            credit_cap_frames: cap_frames.clamp(1, MAX_WINDOW_FRAMES),
        };
        w.credit_sent = w.credit();
        w
    }

    /// Frames the free room holds: the credit an opening announces.
    pub fn credit_frames(&self) -> u32 {
        self.credit().wrapping_sub(self.next)
    }

    /// The credit to advertise: the first sequence number past the frames
    /// the free room holds.
    pub fn credit(&self) -> u32 {
        let free = self
            .capacity_bytes
            .saturating_sub(self.ready.len() + self.ahead_bytes);
        let frames = u32::try_from(free / self.mss)
            .unwrap_or(u32::MAX)
            .min(self.credit_cap_frames);
        self.next.wrapping_add(frames)
    }

    /// Caps what a credit announces at `frames` past the next in-order
    /// frame (at least one, at most [`MAX_WINDOW_FRAMES`]). A credit already
    /// sent stays good: frames under it are still taken.
    pub fn cap_credit(&mut self, frames: u32) {
        self.credit_cap_frames = frames.clamp(1, MAX_WINDOW_FRAMES);
    }

    /// The cap [`RecvWindow::cap_credit`] set, in frames.
    pub fn credit_cap_frames(&self) -> u32 {
        self.credit_cap_frames
    }

    /// The frames a full credit announces: the room, or the cap if less.
    pub(super) fn window_frames(&self) -> u32 {
        u32::try_from(self.capacity_bytes / self.mss)
            .unwrap_or(u32::MAX)
            .min(self.credit_cap_frames)
    }

    /// Takes a data (`fin` false) or closing frame of sequence `seq`,
    /// arrived at `now_ns`.
    pub fn on_frame(&mut self, seq: u32, payload: &[u8], fin: bool, now_ns: u64) -> Arrival {
        if seq_lt(seq, self.next) || self.ahead.contains_key(&seq) {
            self.ack_owed = true;
            return Arrival::Duplicate;
        }
        if payload.len() > self.mss || !seq_lt(seq, self.credit().max_seq(self.credit_sent)) {
            self.ack_owed = true;
            return Arrival::OutOfWindow;
        }
        let used = self.ready.len() + self.ahead_bytes;
        if used + payload.len() > self.capacity_bytes {
            self.ack_owed = true;
            return Arrival::OutOfWindow;
        }
        if self.fin_seq.is_some_and(|f| !seq_lt(seq, f)) {
            // Nothing comes after the end of the stream.
            self.ack_owed = true;
            return Arrival::OutOfWindow;
        }
        if fin {
            self.fin_seq = Some(seq);
            self.ack_owed = true;
        }
        if seq != self.next {
            // A gap: the sender learns of it at once.
            self.ack_owed = true;
            self.ahead_bytes += payload.len();
            self.ahead.insert(seq, payload.to_vec());
            return Arrival::Buffered;
        }
        self.owed_frames += 1;
        self.owed_since_ns.get_or_insert(now_ns);
        if !self.ahead.is_empty() {
            // Filling a gap: say so at once.
            self.ack_owed = true;
        }
        self.ready.extend(payload);
        self.advance();
        while let Some(bytes) = self.ahead.remove(&self.next) {
            self.ahead_bytes -= bytes.len();
            self.ready.extend(&bytes);
            self.advance();
        }
        Arrival::InOrder
    }

    pub(super) fn advance(&mut self) {
        if self.fin_seq == Some(self.next) {
            self.closed = true;
        }
        self.next = self.next.wrapping_add(1);
    }

    /// Bytes ready to read.
    pub fn ready_bytes(&self) -> usize {
        self.ready.len()
    }

    /// The peer ended its stream and every byte before the end was read.
    pub fn finished(&self) -> bool {
        self.closed && self.ready.is_empty()
    }

    /// Moves ready bytes into `buf`; returns how many.
    pub fn read(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.ready.len());
        let (a, b) = self.ready.as_slices();
        let from_a = n.min(a.len());
        buf[..from_a].copy_from_slice(&a[..from_a]);
        buf[from_a..n].copy_from_slice(&b[..n - from_a]);
        self.ready.drain(..n);
        n
    }

    /// Whether an acknowledgment should go on its own at `now_ns`: a gap,
    /// duplicate or probe is owed one, in-order frames waited
    /// [`ACK_DELAY_NS`] or number [`ACK_EVERY_FRAMES`], or reading opened a
    /// quarter of the room since the last credit (so a sender waiting for
    /// credit goes on).
    pub fn ack_due(&self, now_ns: u64) -> bool {
        if self.ack_owed || self.owed_frames >= ACK_EVERY_FRAMES {
            return true;
        }
        if self
            .owed_since_ns
            .is_some_and(|t| now_ns.saturating_sub(t) >= ACK_DELAY_NS)
        {
            return true;
        }
        let window = self.window_frames();
        let opened = self.credit().wrapping_sub(self.credit_sent);
        !seq_lt(self.credit(), self.credit_sent) && opened >= (window / 4).max(1)
    }

    /// When a delayed acknowledgment falls due, ns.
    pub fn ack_deadline_ns(&self) -> Option<u64> {
        self.owed_since_ns.map(|t| t.saturating_add(ACK_DELAY_NS))
    }

    /// Room for `capacity_bytes` not yet read, if that is more than there
    /// is (a session the application took): the credit the next
    /// acknowledgment carries grows with it. The room never shrinks, so
    /// frames sent under an earlier credit still fit.
    pub fn grow_capacity(&mut self, capacity_bytes: usize) {
        self.capacity_bytes = self.capacity_bytes.max(capacity_bytes);
    }

    /// A probe asked for the credit: the next acknowledgment goes at once.
    pub fn on_probe(&mut self) {
        self.ack_owed = true;
    }

    /// The acknowledgment to send now: `(ack, credit, sack)`. Clears what
    /// was owed.
    pub fn take_ack(&mut self) -> (u32, u32, u64) {
        let mut sack = 0u64;
        for &seq in self.ahead.keys() {
            let off = seq.wrapping_sub(self.next);
            if (1..=SACK_FRAMES).contains(&off) {
                sack |= 1u64 << (off - 1);
            }
        }
        let credit = self.credit();
        // The credit never goes back: frames sent under an earlier credit
        // are still taken (the room is checked on arrival too).
        if seq_lt(self.credit_sent, credit) {
            self.credit_sent = credit;
        }
        self.ack_owed = false;
        self.owed_frames = 0;
        self.owed_since_ns = None;
        (self.next, self.credit_sent, sack)
    }
}
