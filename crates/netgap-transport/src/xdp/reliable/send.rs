//! The sending half's workings: what may go out under the window and the
//! credit, what an acknowledgment frees, and the retransmission timer.

use super::*;

impl SendWindow {
    /// A sender whose first frame is sequence `isn` (its initial sequence
    /// number), which may send `credit_frames` frames from it (the peer's
    /// opening) and keeps at most `max_inflight` frames unacknowledged (its
    /// buffers).
    pub fn new(isn: u32, credit_frames: u32, max_inflight: u32) -> SendWindow {
        SendWindow {
            next_seq: isn,
            credit: isn.wrapping_add(credit_frames.min(MAX_WINDOW_FRAMES)),
            inflight: VecDeque::new(),
            max_inflight: max_inflight.clamp(1, MAX_WINDOW_FRAMES),
            srtt_ns: None,
            rttvar_ns: 0,
            rto_ns: INITIAL_RTO_NS,
            backoff: 0,
            timer_ns: 0,
            last_probe_ns: 0,
            retransmits: 0,
            timeouts: 0,
        }
    }

    /// Whether a new frame may go now (credit and buffers allow it).
    pub fn may_send(&self) -> bool {
        (self.inflight.len() as u64) < u64::from(self.max_inflight)
            && seq_lt(self.next_seq, self.credit)
    }

    /// Whether nothing is waiting for an acknowledgment.
    pub fn idle(&self) -> bool {
        self.inflight.is_empty()
    }

    /// Frames waiting for an acknowledgment.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The sequence number the next frame gets.
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// The current retransmission timeout (with its backoff), ns.
    pub fn rto_ns(&self) -> u64 {
        (self.rto_ns << self.backoff).min(MAX_RTO_NS)
    }

    /// Takes a sequence number for a frame in buffer `slot`, sent at
    /// `now_ns`. Call only when [`SendWindow::may_send`].
    pub fn push(&mut self, slot: u32, now_ns: u64) -> u32 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        if self.inflight.is_empty() {
            self.timer_ns = now_ns;
        }
        self.inflight.push_back(InFlight {
            seq,
            slot,
            sent_ns: now_ns,
            tries: 1,
            sacked: false,
        });
        seq
    }

    /// Gives the frames from `first_seq` on, pushed with a provisional
    /// time, the time `now_ns`, read after they were queued (usually after
    /// their doorbell rang): later than they went, so their timeout falls
    /// later, never earlier, and their round-trip samples come out short
    /// by a doorbell's time, which the timeout's floor ([`MIN_RTO_NS`],
    /// milliseconds) dwarfs. A frame sent
    /// again since keeps the time of its resending. Frames stamped this way
    /// keep the order of their calls, which the loss detection in
    /// [`SendWindow::on_ack_into`] compares.
    pub fn stamp_from(&mut self, first_seq: u32, now_ns: u64) {
        for f in self.inflight.iter_mut().rev() {
            if seq_lt(f.seq, first_seq) {
                break;
            }
            if f.tries == 1 {
                f.sent_ns = f.sent_ns.max(now_ns);
            }
        }
        // The window's timer started at the first of these frames.
        if self
            .inflight
            .front()
            .is_some_and(|f| !seq_lt(f.seq, first_seq))
        {
            self.timer_ns = self.timer_ns.max(now_ns);
        }
    }

    /// Takes an acknowledgment (`ack`, `credit`, `sack` of a frame from the
    /// peer) at `now_ns`. An acknowledgment of frames never sent is ignored.
    pub fn on_ack(&mut self, ack: u32, credit: u32, sack: u64, now_ns: u64) -> AckOutcome {
        let mut out = AckOutcome::default();
        self.on_ack_into(ack, credit, sack, now_ns, &mut out);
        out
    }

    /// [`SendWindow::on_ack`], its outcome written into `out` (cleared
    /// first), so a caller that keeps one allocates nothing per frame.
    pub fn on_ack_into(
        &mut self,
        ack: u32,
        credit: u32,
        sack: u64,
        now_ns: u64,
        out: &mut AckOutcome,
    ) {
        out.freed.clear();
        out.resend.clear();
        let una = self.inflight.front().map_or(self.next_seq, |f| f.seq);
        if !(seq_le(una, ack) && seq_le(ack, self.next_seq)) {
            return;
        }
        let new_credit = clamp_credit(ack, credit);
        if seq_lt(self.credit, new_credit) {
            self.credit = new_credit;
        }
        // When the latest frame known to have arrived was sent (a frame
        // sent once, so its one copy is the one that arrived).
        let mut delivered_sent_ns = None;
        while let Some(&f) = self.inflight.front() {
            if !seq_lt(f.seq, ack) {
                break;
            }
            // Karn: only a frame sent once times the round trip.
            if f.tries == 1 {
                self.sample_rtt(now_ns.saturating_sub(f.sent_ns));
                delivered_sent_ns = delivered_sent_ns.max(Some(f.sent_ns));
            }
            out.freed.push(f.slot);
            self.inflight.pop_front();
        }
        if !out.freed.is_empty() {
            // Progress: the timer restarts, without its backoff.
            self.timer_ns = now_ns;
            self.backoff = 0;
        }
        if sack == 0 {
            return;
        }
        for f in self.inflight.iter_mut() {
            let off = f.seq.wrapping_sub(ack);
            if (1..=SACK_FRAMES).contains(&off) && sack & (1u64 << (off - 1)) != 0 {
                f.sacked = true;
                if f.tries == 1 {
                    delivered_sent_ns = delivered_sent_ns.max(Some(f.sent_ns));
                }
            }
        }
        // A link keeps frames in order: a frame not acknowledged though one
        // sent after it arrived was lost (the idea of RACK, RFC 8985), and
        // goes again; its new copy is judged against later arrivals only.
        let Some(delivered) = delivered_sent_ns else {
            return;
        };
        for f in self.inflight.iter_mut() {
            if !f.sacked && f.sent_ns < delivered {
                f.sent_ns = now_ns;
                f.tries += 1;
                self.retransmits += 1;
                out.resend.push(*f);
            }
        }
    }

    /// The frames whose retransmission timeout expired by `now_ns`, marked
    /// sent again; the timeout doubles when any expired.
    pub fn due(&mut self, now_ns: u64) -> Vec<InFlight> {
        if self.inflight.is_empty() || now_ns.saturating_sub(self.timer_ns) < self.rto_ns() {
            return Vec::new();
        }
        // One timer for the window, as TCP has: on expiry the oldest frame
        // not known to have arrived goes again (the acknowledgments it
        // brings reveal the other losses), and the timeout doubles.
        self.timer_ns = now_ns;
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
        self.timeouts += 1;
        let Some(f) = self.inflight.iter_mut().find(|f| !f.sacked) else {
            return Vec::new();
        };
        f.sent_ns = now_ns;
        f.tries += 1;
        self.retransmits += 1;
        vec![*f]
    }

    /// Whether to ask the peer for its credit now: no credit, nothing in
    /// flight to bring an acknowledgment, and no probe within a timeout.
    pub fn probe_due(&mut self, now_ns: u64) -> bool {
        if !self.inflight.is_empty() || seq_lt(self.next_seq, self.credit) {
            return false;
        }
        if now_ns.saturating_sub(self.last_probe_ns) < self.rto_ns() {
            return false;
        }
        self.last_probe_ns = now_ns;
        true
    }

    /// When the next retransmission (or probe) falls due, ns; `None` when
    /// nothing waits.
    pub fn next_deadline_ns(&self) -> Option<u64> {
        if !self.inflight.is_empty() {
            return Some(self.timer_ns.saturating_add(self.rto_ns()));
        }
        if !seq_lt(self.next_seq, self.credit) {
            return Some(self.last_probe_ns.saturating_add(self.rto_ns()));
        }
        None
    }

    pub(super) fn sample_rtt(&mut self, rtt_ns: u64) {
        // RFC 6298's smoothing, in integers.
        match self.srtt_ns {
            None => {
                self.srtt_ns = Some(rtt_ns);
                self.rttvar_ns = rtt_ns / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(rtt_ns);
                self.rttvar_ns = (3 * self.rttvar_ns + err) / 4;
                self.srtt_ns = Some((7 * srtt + rtt_ns) / 8);
            }
        }
        let srtt = self.srtt_ns.unwrap_or(rtt_ns);
        self.rto_ns = (srtt + 4 * self.rttvar_ns).clamp(MIN_RTO_NS, MAX_RTO_NS);
    }
}
