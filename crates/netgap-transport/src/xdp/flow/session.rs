//! A session's side of the port: what it sends (data, its closing, its
//! retransmissions), what it does with each frame that arrives for it,
//! and its timers.

use super::*;

impl Session {
    pub(super) fn new(
        local_flow: u16,
        mss: usize,
        window_bytes: usize,
        isn: u32,
        (tx_count, credit_cap): (usize, u32),
    ) -> io::Result<Session> {
        let max_inflight = send_buffers(tx_count);
        Ok(Session {
            local_flow,
            peer: None,
            mss,
            recv_mss: mss,
            send: SendWindow::new(isn, 0, max_inflight),
            // Until the peer's opening names its initial sequence number.
            recv: RecvWindow::capped(0, mss, window_bytes, credit_cap),
            stats: DatagramStats::default(),
            arrivals: 0,
            woken: false,
            poller: false,
            cv_waiters: 0,
            signal: Signal::new()?,
            syn_to: None,
            fin_sent: false,
            isn,
            peer_isn: 0,
            side: None,
            window_bytes,
            max_inflight,
            guard: Guard::new(),
            heard_ns: 0,
            fin_wanted: false,
            fixed: None,
            unstamped_from: None,
        })
    }

    /// Writes a frame of `kind` into a free transmit buffer and queues it;
    /// `None` when no buffer or ring entry is free. `keep` keeps the
    /// buffer after completion (a data frame, until acknowledged).
    pub(super) fn post(
        &mut self,
        io: &mut PortIo,
        kind: Kind,
        seq: u32,
        payload: &[u8],
        keep: bool,
    ) -> Option<u32> {
        // An opening carries this end's initial sequence number, the
        // frames the peer may send (a span: the client does not know the
        // server's number yet) and the largest payload this end takes; the
        // answer echoes the client's number.
        let (seq, acked) = match kind {
            Kind::Syn | Kind::SynAck => (
                self.isn,
                (
                    if kind == Kind::SynAck {
                        self.peer_isn
                    } else {
                        0
                    },
                    self.recv.credit_frames(),
                    self.recv_mss as u64,
                ),
            ),
            _ => {
                if self.peer.or(self.syn_to).is_none() || io.free_tx.is_empty() {
                    return None;
                }
                (seq, self.recv.take_ack())
            }
        };
        self.post_with(io, kind, seq, payload, keep, acked)
    }

    /// [`Session::post`] with the acknowledgment fields given: `(ack,
    /// credit, sack)`, as [`RecvWindow::take_ack`] made them (or an
    /// opening's).
    pub(super) fn post_with(
        &mut self,
        io: &mut PortIo,
        kind: Kind,
        seq: u32,
        payload: &[u8],
        keep: bool,
        (ack, credit, sack): (u32, u32, u64),
    ) -> Option<u32> {
        let peer = self.addressee()?;
        let slot = io.free_tx.pop()?;
        let header = Header {
            kind,
            len: u16::try_from(payload.len()).unwrap_or(u16::MAX),
            dst_flow: peer.flow,
            src_flow: self.local_flow,
            seq,
            ack,
            credit,
            sack,
        };
        let local = io.local_mac;
        let frame = io.xsk.frame_mut(slot);
        let len = reliable::write_headers(frame, &peer.mac, &local, &header);
        frame[FRAME_OVERHEAD_BYTES..len].copy_from_slice(payload);
        self.guard.seal(&mut frame[..len]);
        let i = io.tx_index(slot)?;
        io.tx_release[i] = !keep;
        if !io.xsk.queue_tx(slot, len as u32) {
            io.free_tx.push(slot);
            return None;
        }
        io.tx_pending[i] = io.tx_pending[i].saturating_add(1);
        io.tx_queued = true;
        io.tx_outstanding += 1;
        if matches!(kind, Kind::Data | Kind::Fin) {
            self.stats.datagrams_sent += 1;
        }
        Some(slot)
    }

    /// Sends a kept data frame's buffer again, as it is (its header's
    /// acknowledgment fields are refreshed).
    pub(super) fn resend(&mut self, io: &mut PortIo, slot: u32) {
        let Some(i) = io.tx_index(slot) else { return };
        let (ack, credit, sack) = self.recv.take_ack();
        let frame = io.xsk.frame_mut(slot);
        let Ok(parsed) = reliable::parse(frame) else {
            return;
        };
        let mut header = parsed.header;
        let dst = frame_dst(frame);
        let src = parsed.src;
        header.ack = ack;
        header.credit = credit;
        header.sack = sack;
        let len = reliable::write_headers(frame, &dst, &src, &header);
        // Sealed again: the acknowledgment fields changed, and the flow
        // may have been keyed since the first send.
        self.guard.seal(&mut frame[..len]);
        if io.xsk.queue_tx(slot, len as u32) {
            io.tx_pending[i] = io.tx_pending[i].saturating_add(1);
            io.tx_queued = true;
            io.tx_outstanding += 1;
            self.stats.datagrams_sent += 1;
            self.stats.retries += 1;
        }
    }

    /// The session's timers at `now`: retransmissions, a probe, a delayed
    /// acknowledgment.
    pub(super) fn on_timers(&mut self, io: &mut PortIo, now: u64) {
        if self.fixed.is_some() && !self.fixed_timers(io, now) {
            return;
        }
        if self.peer.is_none() {
            return;
        }
        for f in self.send.due(now) {
            self.resend(io, f.slot);
        }
        self.stats.retries = self.send.retransmits;
        if self.send.probe_due(now) {
            self.post(io, Kind::Probe, 0, &[], false);
        }
        if self.recv.ack_due(now) {
            self.post(io, Kind::Ack, 0, &[], false);
        }
    }

    /// Takes frame `raw`, parsed as `h` from `src` with `payload`, routed
    /// here.
    pub(super) fn on_frame(
        &mut self,
        io: &mut PortIo,
        h: &Header,
        src: Mac,
        payload: &[u8],
        raw: &[u8],
        now: u64,
    ) {
        let Some(peer) = self.peer else {
            if self.fixed.is_some() {
                self.on_fixed_opening(io, h, src, raw, now);
                return;
            }
            // The answer of the server this end asked, to this end's
            // opening (its initial sequence number echoed), from the
            // session it opened for this flow (its own flow id).
            if h.kind == Kind::SynAck
                && h.ack == self.isn
                && h.src_flow != 0
                && self.syn_to.is_some_and(|p| p.mac == src)
            {
                self.opened(h);
                self.peer = Some(Peer {
                    mac: src,
                    flow: h.src_flow,
                });
                self.side = Some(Side::Client);
                self.woken = true;
                // The third leg: the server's session hears from this end
                // before anything is sent, so it is not left half-open.
                self.post(io, Kind::Ack, 0, &[], false);
            }
            return;
        };
        if h.src_flow != peer.flow || src != peer.mac || !self.guard.admit(raw) {
            // Not the peer's (or altered on the way): as if never arrived.
            io.strays += 1;
            return;
        }
        if self.fixed.is_some_and(|f| f.ended()) {
            self.after_reset(io, h.kind);
            return;
        }
        match h.kind {
            Kind::Syn => {
                // Our SYN-ACK was lost: say it again (to the same opening
                // only).
                if h.seq == self.peer_isn {
                    self.post(io, Kind::SynAck, 0, &[], false);
                }
                return;
            }
            Kind::SynAck => return,
            Kind::Reset => {
                // Taken only by a session keyed from its first frame.
                if self.fixed.is_some() {
                    self.on_reset();
                }
                return;
            }
            Kind::Data | Kind::Fin => self.on_data(h, payload, now),
            Kind::Probe => self.recv.on_probe(),
            Kind::Ack => {}
        }
        self.on_acknowledgment(io, h, now);
    }

    /// Takes the payload of an authenticated data or closing frame `h`.
    pub(super) fn on_data(&mut self, h: &Header, payload: &[u8], now: u64) {
        self.stats.datagrams_received += 1;
        let arrival = self.recv.on_frame(h.seq, payload, h.kind == Kind::Fin, now);
        if arrival == Arrival::Duplicate {
            self.stats.duplicates += 1;
        }
    }

    /// Takes the acknowledgment fields of an authenticated frame `h` from
    /// the peer: frees what they acknowledge, resends what they show lost,
    /// and wakes the session's waiters.
    pub(super) fn on_acknowledgment(&mut self, io: &mut PortIo, h: &Header, now: u64) {
        let mut out = std::mem::take(&mut io.scratch_ack);
        self.send
            .on_ack_into(h.ack, h.credit, h.sack, now, &mut out);
        for &slot in &out.freed {
            if let Some(i) = io.tx_index(slot) {
                io.tx_release[i] = true;
                io.release_if_done(slot);
            }
        }
        for f in &out.resend {
            self.resend(io, f.slot);
        }
        io.scratch_ack = out;
        self.woken = true;
        self.heard_ns = now;
    }

    /// Gives the data frames sent with a provisional time the time `now`
    /// (read after they were queued).
    pub(super) fn stamp_sends(&mut self, now: u64) {
        if let Some(first) = self.unstamped_from.take() {
            self.send.stamp_from(first, now);
        }
    }

    /// Takes the peer's opening `h`: its initial sequence number, the
    /// credit it gives and the payload it takes.
    pub(super) fn opened(&mut self, h: &Header) {
        self.peer_isn = h.seq;
        self.send = SendWindow::new(self.isn, h.credit, self.max_inflight);
        self.unstamped_from = None;
        // The cap is the port's share for this session (see
        // `PortState::reshare`), kept across the new window.
        let cap = self.recv.credit_cap_frames();
        self.recv = RecvWindow::capped(h.seq, self.recv_mss, self.window_bytes, cap);
        self.mss = peer_mss(u32::try_from(h.sack).unwrap_or(u32::MAX), self.recv_mss);
    }

    /// Keys the open flow with the proven connection's `key`: from now on
    /// every frame is sealed and every arrival must verify.
    pub(super) fn bind(&mut self, local_mac: Mac, key: &FlowKey) -> Result<(), FlowError> {
        let (Some(peer), Some(side)) = (self.peer, self.side) else {
            return Err(FlowError::Io(io::Error::other(
                "an xdp flow can be keyed only once it is open",
            )));
        };
        let local = End {
            mac: local_mac,
            flow: self.local_flow,
            isn: self.isn,
        };
        let remote = End {
            mac: peer.mac,
            flow: peer.flow,
            isn: self.peer_isn,
        };
        let (client, server) = match side {
            Side::Client => (local, remote),
            Side::Server => (remote, local),
        };
        self.guard
            .set_keys(FrameKeys::derive(key, side, &client, &server));
        Ok(())
    }

    /// Whether the flow is open (the handshake is done).
    pub(super) fn connected(&self) -> bool {
        self.peer.is_some()
    }

    /// Sends as much of `buf` as credit, buffers and this session's share
    /// of them allow; returns the bytes taken.
    pub(super) fn send_some(&mut self, io: &mut PortIo, buf: &[u8]) -> Result<usize, FlowError> {
        let mut taken = 0;
        if !(self.send.may_send()
            && self.send.in_flight() < io.share
            && io.free_tx.len() > CONTROL_RESERVE_FRAMES)
            || buf.is_empty()
        {
            return Ok(0);
        }
        // The frames of the previous call, if no pump gave them a time
        // since, went with its doorbell: before now.
        if self.unstamped_from.is_some() {
            let now = io.now_ns();
            self.stamp_sends(now);
        }
        // This call's frames take the port's latest time for now, and the
        // time read after their doorbell rang once a pump (or the next
        // call) reads the clock: a read here would stand between the
        // frame and the peer, while the read after the doorbell falls in
        // the wait for the answer. Their timeout starts later than they
        // went, never earlier.
        let now = io.now_cache_ns;
        let first_seq = self.send.next_seq();
        // And one acknowledgment for them: nothing arrives in between, so
        // every frame would carry the same fields.
        let acked = self.recv.take_ack();
        while taken < buf.len()
            && self.send.may_send()
            && self.send.in_flight() < io.share
            && io.free_tx.len() > CONTROL_RESERVE_FRAMES
        {
            let end = (taken + self.mss).min(buf.len());
            let seq = self.send.next_seq();
            let Some(slot) = self.post_with(io, Kind::Data, seq, &buf[taken..end], true, acked)
            else {
                break;
            };
            self.send.push(slot, now);
            taken = end;
        }
        if taken > 0 {
            self.unstamped_from = Some(first_seq);
            io.stamps_due = true;
            io.flush();
        }
        Ok(taken)
    }

    /// Sends the end of this end's stream once, when credit allows.
    pub(super) fn send_fin(&mut self, io: &mut PortIo) {
        if self.fin_sent || !self.send.may_send() || io.free_tx.is_empty() {
            return;
        }
        let seq = self.send.next_seq();
        if let Some(slot) = self.post(io, Kind::Fin, seq, &[], true) {
            let now = io.now_ns();
            self.send.push(slot, now);
            self.fin_sent = true;
        }
        io.flush();
    }

    /// When the next timer (a retransmission, a probe, a delayed
    /// acknowledgment) falls due, as a duration from `now_ns`.
    pub(super) fn next_timer(&self, now_ns: u64) -> Option<Duration> {
        let at = match (self.send.next_deadline_ns(), self.recv.ack_deadline_ns()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(Duration::from_nanos(at.saturating_sub(now_ns)))
    }
}
