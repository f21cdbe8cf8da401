//! The udp transport's retry protocol, as plain code: no sockets, no
//! clock (every call is given the time), no threads. The socket layer
//! (`udp/mod.rs`) decodes each datagram ([`super::wire`]), hands its header
//! and payload length to these machines, sends what they answer and sleeps
//! until the time they name; everything that decides what a datagram means
//! or when to send one is here, and is tested here with loss, duplication
//! and reordering simulated in memory.
//!
//! A flow's two directions are apart, as its halves run on two threads:
//! [`Sending`] numbers the data datagrams and names what a re-send or a
//! probe carries, [`SilenceWatch`] tells a one-way sender when its peer
//! stopped; [`Receiving`] accounts for every datagram that arrives (new,
//! lost, late or duplicate) and says what to answer, [`AckPacer`] spaces
//! its acknowledgments, [`RecvWait`] times one receive call's retries and
//! probes, and [`ProbeTimer`] the probes of an idle end. The rules
//! themselves are described in the transport's module documentation.
//!
//! Nothing a peer sends makes this code panic or grow without bound: a
//! datagram's offsets are checked against the stream before they are
//! used, and at most [`MAX_LOST_RANGES`] gaps are remembered.

use super::wire::{Header, Kind, FLAG_RETRY};
use crate::rto::{self, RetryTimeout};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Gaps remembered to tell a late datagram from a duplicate.
pub const MAX_LOST_RANGES: usize = 1024;

/// First interval between probes while a burst's end is unconfirmed; it
/// doubles up to the retry timeout.
pub const PROBE_FIRST: Duration = Duration::from_micros(100);

/// A data datagram whose offset contradicts the stream so far: the peer
/// broke the protocol, and the flow ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Its offset is before the next byte expected, or its payload would
    /// end past 2^64 bytes.
    #[error("datagram {seq} at offset {offset_bytes} bytes, expected at least {expected_bytes}")]
    OffsetOutOfRange {
        /// The datagram's sequence number.
        seq: u64,
        /// The datagram's offset.
        offset_bytes: u64,
        /// The next byte the receiver expects.
        expected_bytes: u64,
    },
    /// It skips datagrams without skipping bytes, or skips bytes without
    /// skipping datagrams.
    #[error(
        "datagram {seq} at offset {offset_bytes} bytes after datagram {prev_seq} ended at {prev_end_bytes}"
    )]
    GapMismatch {
        /// The datagram's sequence number.
        seq: u64,
        /// The datagram's offset.
        offset_bytes: u64,
        /// The last datagram delivered (wrapping below 0 before the first).
        prev_seq: u64,
        /// Where the last datagram delivered ended.
        prev_end_bytes: u64,
    },
}

/// What to send the peer in answer to a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Nothing.
    None,
    /// This header-only datagram (a hello-ack or a NACK).
    Control(Header),
    /// This end's last data datagram again, unflagged, if its sequence
    /// number is `from_seq` or later ([`Sending::resends`]).
    Resend {
        /// The first sequence number the peer lacks.
        from_seq: u64,
    },
}

/// How one datagram changes the receiving end's counters (beyond
/// "received", which every data datagram is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Datagrams its arrival proved lost.
    pub lost: u64,
    /// Their payload bytes.
    pub lost_bytes: u64,
    /// 1 if it arrived after being counted lost.
    pub reordered: u64,
    /// 1 if it was delivered (or arrived) before.
    pub duplicates: u64,
}

/// What became of one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Payload bytes to deliver, in order: 0 for control, late, duplicate
    /// or empty datagrams.
    pub deliver_bytes: usize,
    /// Its effect on the counters.
    pub tally: Tally,
    /// What to send the peer.
    pub answer: Answer,
}

impl Arrival {
    fn control(answer: Answer) -> Arrival {
        Arrival {
            deliver_bytes: 0,
            tally: Tally::default(),
            answer,
        }
    }
}

/// The receiving direction: which datagram comes next and which gaps were
/// counted lost.
#[derive(Debug, Clone, Default)]
pub struct Receiving {
    /// Sequence number of the next datagram to deliver.
    next_seq: u64,
    /// Stream offset of the next payload byte to deliver.
    next_offset_bytes: u64,
    /// Sequence ranges `[start, end)` counted lost, newest last.
    lost_ranges: VecDeque<(u64, u64)>,
}

impl Receiving {
    /// Nothing received yet.
    pub fn new() -> Receiving {
        Receiving::default()
    }

    /// Sequence number of the next datagram to deliver.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Payload bytes delivered or counted lost so far.
    pub fn next_offset_bytes(&self) -> u64 {
        self.next_offset_bytes
    }

    /// Gaps remembered (at most [`MAX_LOST_RANGES`]).
    pub fn lost_ranges(&self) -> usize {
        self.lost_ranges.len()
    }

    /// Whether a data datagram with `header` would be new: the receive
    /// path leaves those queued for the test while it only listens.
    pub fn is_new_data(&self, header: &Header) -> bool {
        header.kind == Kind::Data && header.seq >= self.next_seq
    }

    /// The acknowledgment this end sends while data arrives.
    pub fn ack(&self) -> Header {
        self.here(Kind::Ack)
    }

    fn here(&self, kind: Kind) -> Header {
        Header {
            kind,
            flags: 0,
            seq: self.next_seq,
            offset_bytes: self.next_offset_bytes,
        }
    }

    /// Takes one of netgap's datagrams, `header` and `payload_bytes` after
    /// it.
    pub fn on_datagram(
        &mut self,
        header: &Header,
        payload_bytes: usize,
    ) -> Result<Arrival, ProtocolError> {
        let h = header;
        match h.kind {
            // The hello-ack was lost and the peer still knocks.
            Kind::Hello => {
                return Ok(Arrival::control(Answer::Control(Header::control(
                    Kind::HelloAck,
                ))))
            }
            // The flow engine's proof is no part of this path; an
            // acknowledgment only says the peer is alive.
            Kind::HelloAck | Kind::Confirm | Kind::ConfirmAck | Kind::Ack => {
                return Ok(Arrival::control(Answer::None))
            }
            // Everything sent before the probe is ahead of it in the
            // queue: what has not arrived by now was lost (or, on a real
            // network, overtaken; it then arrives late).
            Kind::Probe => {
                let answer = if h.seq >= self.next_seq {
                    Answer::Control(self.here(Kind::Nack))
                } else {
                    Answer::None
                };
                return Ok(Arrival::control(answer));
            }
            Kind::Nack => return Ok(Arrival::control(Answer::Resend { from_seq: h.seq })),
            Kind::Data => {}
        }
        let mut tally = Tally::default();
        let mut deliver_bytes = 0;
        if h.seq >= self.next_seq {
            let skipped = h.seq - self.next_seq;
            let lost_bytes = h.offset_bytes.checked_sub(self.next_offset_bytes);
            let end = h.offset_bytes.checked_add(payload_bytes as u64);
            let (Some(lost_bytes), Some(end)) = (lost_bytes, end) else {
                return Err(ProtocolError::OffsetOutOfRange {
                    seq: h.seq,
                    offset_bytes: h.offset_bytes,
                    expected_bytes: self.next_offset_bytes,
                });
            };
            if (skipped == 0) != (lost_bytes == 0) {
                return Err(ProtocolError::GapMismatch {
                    seq: h.seq,
                    offset_bytes: h.offset_bytes,
                    prev_seq: self.next_seq.wrapping_sub(1),
                    prev_end_bytes: self.next_offset_bytes,
                });
            }
            if skipped > 0 {
                tally.lost = skipped;
                tally.lost_bytes = lost_bytes;
                self.lost_ranges.push_back((self.next_seq, h.seq));
                if self.lost_ranges.len() > MAX_LOST_RANGES {
                    self.lost_ranges.pop_front();
                }
            }
            self.next_seq = h.seq.saturating_add(1);
            self.next_offset_bytes = end;
            deliver_bytes = payload_bytes;
        } else if take_lost(&mut self.lost_ranges, h.seq) {
            tally.reordered = 1;
        } else {
            tally.duplicates = 1;
        }
        // The peer waits for this end: its last datagram answers.
        let answer = if h.flags & FLAG_RETRY != 0 {
            Answer::Resend { from_seq: 0 }
        } else {
            Answer::None
        };
        Ok(Arrival {
            deliver_bytes,
            tally,
            answer,
        })
    }
}

/// Removes `seq` from the lost ranges; true if it was there.
fn take_lost(ranges: &mut VecDeque<(u64, u64)>, seq: u64) -> bool {
    let Some(i) = ranges.iter().position(|&(s, e)| s <= seq && seq < e) else {
        return false;
    };
    let (s, e) = ranges[i];
    match (seq == s, seq + 1 == e) {
        (true, true) => {
            ranges.remove(i);
        }
        (true, false) => ranges[i].0 = seq + 1,
        (false, true) => ranges[i].1 = seq,
        (false, false) => {
            ranges[i].1 = seq;
            ranges.insert(i + 1, (seq + 1, e));
            if ranges.len() > MAX_LOST_RANGES {
                ranges.pop_front();
            }
        }
    }
    true
}

/// The sending direction: the numbering of data datagrams.
#[derive(Debug, Clone, Default)]
pub struct Sending {
    /// Sequence number of the next data datagram.
    next_seq: u64,
    /// Stream offset of the next payload byte.
    next_offset_bytes: u64,
}

impl Sending {
    /// Nothing sent yet.
    pub fn new() -> Sending {
        Sending::default()
    }

    /// Data datagrams sent so far.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The header of the next data datagram.
    pub fn data_header(&self) -> Header {
        Header {
            kind: Kind::Data,
            flags: 0,
            seq: self.next_seq,
            offset_bytes: self.next_offset_bytes,
        }
    }

    /// The datagram [`Sending::data_header`] named went out (or was given
    /// to the network to lose) with `payload_bytes` of payload.
    pub fn sent(&mut self, payload_bytes: usize) {
        self.next_seq += 1;
        self.next_offset_bytes += payload_bytes as u64;
    }

    /// Whether the last data datagram is one a peer lacking everything
    /// from `from_seq` on needs (and there is one).
    pub fn resends(&self, from_seq: u64) -> bool {
        self.next_seq > from_seq
    }

    /// The probe that ends a burst: it names the last data datagram and
    /// where the stream ends; none before any data.
    pub fn probe(&self) -> Option<Header> {
        let seq = self.next_seq.checked_sub(1)?;
        Some(Header {
            kind: Kind::Probe,
            flags: 0,
            seq,
            offset_bytes: self.next_offset_bytes,
        })
    }

    /// Whether the burst whose last datagram is `seq` is still the latest
    /// (no data followed it), so its probe is still worth sending.
    pub fn still_ends_at(&self, seq: u64) -> bool {
        self.next_seq == seq.wrapping_add(1)
    }
}

/// Whether a sender that only sends should look at what its peer sent
/// first ([`SilenceWatch::before_send`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendCheck {
    /// Send.
    Go,
    /// Read what the peer sent without waiting, then ask
    /// [`SilenceWatch::after_listen`].
    Listen {
        /// How long the peer has been quiet.
        quiet: Duration,
    },
}

/// Tells a sender that hears nothing else (a one-way stream) that its peer
/// stopped. A datagram socket's send never waits on a stopped peer (the
/// kernel drops what its queue cannot hold), so the sender, once the peer
/// has been quiet for an eighth of the inactivity timeout, reads what the
/// peer sent every sixteenth of it: a receiving peer acknowledges
/// ([`Kind::Ack`]) every quarter of the timeout while data arrives
/// ([`AckPacer`]). A stopped peer is named within about the timeout and a
/// fifth of it, as a stream socket's full buffer would.
#[derive(Debug, Clone, Copy)]
pub struct SilenceWatch {
    io_timeout: Duration,
    /// When this end first sent data since it last heard from the peer.
    quiet_since: Option<Instant>,
    /// The count of the peer's datagrams when this end last looked.
    heard_seen: u64,
    /// When this end next reads what the peer sent while only sending.
    next_listen: Option<Instant>,
    /// When this end last sent data.
    last_send: Option<Instant>,
}

impl SilenceWatch {
    /// A watch for a flow with this inactivity timeout.
    pub fn new(io_timeout: Duration) -> SilenceWatch {
        SilenceWatch {
            io_timeout,
            quiet_since: None,
            heard_seen: 0,
            next_listen: None,
            last_send: None,
        }
    }

    /// Before a send at `now`, `heard` datagrams of the peer's having
    /// arrived in all.
    pub fn before_send(&mut self, now: Instant, heard: u64) -> SendCheck {
        let listen_every = self.io_timeout / 8;
        // The peer acknowledges only data that arrives: time this end
        // spent not sending is no silence of the peer's.
        let paused = self
            .last_send
            .is_some_and(|t| now.saturating_duration_since(t) > listen_every);
        self.last_send = Some(now);
        if heard != self.heard_seen || paused {
            self.heard_seen = heard;
            self.quiet_since = None;
        }
        let since = *self.quiet_since.get_or_insert(now);
        let quiet = now.saturating_duration_since(since);
        if quiet < listen_every || self.next_listen.is_some_and(|at| now < at) {
            return SendCheck::Go;
        }
        self.next_listen = Some(now + listen_every / 2);
        SendCheck::Listen { quiet }
    }

    /// After the listen [`SilenceWatch::before_send`] asked for, `heard`
    /// datagrams having arrived in all: true if the peer is silent (the
    /// send fails as timed out).
    pub fn after_listen(&mut self, now: Instant, heard: u64, quiet: Duration) -> bool {
        if heard != self.heard_seen {
            self.heard_seen = heard;
            self.quiet_since = Some(now);
            return false;
        }
        quiet >= self.io_timeout
    }
}

/// Spaces a receiving end's acknowledgments: at most one every quarter of
/// the inactivity timeout (see [`SilenceWatch`]).
#[derive(Debug, Clone, Copy)]
pub struct AckPacer {
    io_timeout: Duration,
    acked_at: Option<Instant>,
}

impl AckPacer {
    /// A pacer for a flow with this inactivity timeout.
    pub fn new(io_timeout: Duration) -> AckPacer {
        AckPacer {
            io_timeout,
            acked_at: None,
        }
    }

    /// Whether to acknowledge at `now` (data just arrived); if so, the
    /// acknowledgment counts as sent.
    pub fn due(&mut self, now: Instant) -> bool {
        if self
            .acked_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.io_timeout / 4)
        {
            return false;
        }
        self.acked_at = Some(now);
        true
    }
}

/// The probes of a burst's end while this end waits: the first
/// [`PROBE_FIRST`] after the wait starts, then at doubling intervals while
/// the interval is within the retry timeout and the burst is still the
/// latest.
#[derive(Debug, Clone, Copy)]
pub struct ProbeTimer {
    interval: Duration,
    at: Option<Instant>,
}

impl ProbeTimer {
    /// Starts at `now`; no probes unless `probing` (a burst's end is
    /// unconfirmed).
    pub fn new(now: Instant, probing: bool) -> ProbeTimer {
        ProbeTimer {
            interval: PROBE_FIRST,
            at: probing.then_some(now + PROBE_FIRST),
        }
    }

    /// When the next probe is due, if one is.
    pub fn at(&self) -> Option<Instant> {
        self.at
    }

    /// Whether a probe is due at `now`: the caller then sends it (if the
    /// burst is still the latest) and calls [`ProbeTimer::probed`].
    pub fn due(&self, now: Instant) -> bool {
        self.at.is_some_and(|at| now >= at)
    }

    /// A due probe was handled at `now`: `still_probing` if it was sent
    /// (the burst is still the latest), `rto` the retry timeout.
    pub fn probed(&mut self, now: Instant, still_probing: bool, rto: Duration) {
        self.interval = self.interval.saturating_mul(2);
        self.at = (still_probing && self.interval <= rto).then_some(now + self.interval);
    }
}

/// What a waiting receive does at a clock check ([`RecvWait::tick`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// The inactivity timeout passed without new data: the receive fails.
    TimedOut,
    /// Go on waiting, first doing what is due.
    Wait {
        /// Re-send the last data datagram flagged RETRY.
        retry: bool,
        /// A probe is due: send it if the burst is still the latest, then
        /// [`RecvWait::probed`].
        probe: bool,
    },
}

/// The timers of one receive call that waits for new data: its retries
/// (starting at the retry timeout, backing off on each expiry), its probes
/// and its inactivity deadline.
#[derive(Debug, Clone, Copy)]
pub struct RecvWait {
    start: Instant,
    deadline: Instant,
    /// The current wait between retries.
    interval: Duration,
    retry_at: Instant,
    /// Whether a retry went out during this wait (Karn).
    retried: bool,
    /// How long to block before the next clock check (event mode without
    /// probes).
    wait: Duration,
    probe: ProbeTimer,
}

impl RecvWait {
    /// A wait starting at `now`, failing after `io_timeout`, retrying
    /// after `rto`, probing if `probing`.
    pub fn new(now: Instant, io_timeout: Duration, rto: Duration, probing: bool) -> RecvWait {
        RecvWait {
            start: now,
            deadline: now + io_timeout,
            interval: rto,
            retry_at: now + rto,
            retried: false,
            wait: rto.min(io_timeout),
            probe: ProbeTimer::new(now, probing),
        }
    }

    /// When the socket must be looked at next, if a probe is scheduled
    /// (sooner than a receive timeout's tick allows); `None`: block for
    /// [`RecvWait::wait`].
    pub fn wake_at(&self) -> Option<Instant> {
        let at = self.probe.at()?;
        Some(at.min(self.retry_at).min(self.deadline))
    }

    /// How long to block before the next clock check.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether a retry went out during this wait.
    pub fn retried(&self) -> bool {
        self.retried
    }

    /// A clock check at `now` (nothing new arrived).
    pub fn tick(&mut self, now: Instant) -> Tick {
        if now >= self.deadline {
            return Tick::TimedOut;
        }
        let retry = now >= self.retry_at;
        if retry {
            self.retried = true;
            self.interval = rto::backed_off(self.interval);
            self.retry_at = now + self.interval;
        }
        self.wait = self
            .retry_at
            .min(self.deadline)
            .saturating_duration_since(now);
        Tick::Wait {
            retry,
            probe: self.probe.due(now),
        }
    }

    /// The due probe [`RecvWait::tick`] named was handled (see
    /// [`ProbeTimer::probed`]).
    pub fn probed(&mut self, now: Instant, still_probing: bool, rto: Duration) {
        self.probe.probed(now, still_probing, rto);
    }

    /// New data arrived at `now`: the wait teaches the retry timeout, or,
    /// if it needed retries, its backed-off interval holds (Karn).
    pub fn delivered(&self, now: Instant, rto: &mut RetryTimeout) {
        if self.retried {
            rto.back_off(self.interval);
        } else {
            rto.observe(now.saturating_duration_since(self.start));
        }
    }
}

#[cfg(test)]
mod tests;
