//! The retry protocol driven without sockets: two ends joined by an
//! in-memory network that loses, duplicates and reorders on request, on a
//! virtual clock.

use super::*;
use crate::rto::{Hysteresis, RETRY_INITIAL};
use netgap_core::datagram::DatagramStats;
use proptest::prelude::*;

fn data(seq: u64, offset_bytes: u64) -> Header {
    Header {
        kind: Kind::Data,
        flags: 0,
        seq,
        offset_bytes,
    }
}

/// One end: the machines the socket layer drives and what it keeps beside
/// them.
struct End {
    tx: Sending,
    rx: Receiving,
    rto: RetryTimeout,
    /// The last data datagram: header and payload length.
    last: Option<(Header, usize)>,
    /// The latest burst's last datagram, while it is probed for.
    probe_seq: Option<u64>,
    stats: DatagramStats,
    delivered_bytes: u64,
    /// Answers each new message with one of the same size.
    echo: bool,
    /// Sends one byte once this many bytes were delivered.
    answer_at_bytes: Option<u64>,
    /// Everything sent to it vanishes (a stopped process).
    stopped: bool,
}

impl End {
    fn new() -> End {
        End {
            tx: Sending::new(),
            rx: Receiving::new(),
            rto: RetryTimeout::new(Hysteresis::Quarter),
            last: None,
            probe_seq: None,
            stats: DatagramStats::default(),
            delivered_bytes: 0,
            echo: false,
            answer_at_bytes: None,
            stopped: false,
        }
    }
}

/// Two ends (0 and 1) and the datagrams between them, in order.
struct Sim {
    ends: [End; 2],
    wire: VecDeque<(usize, Header, usize)>,
    /// Datagrams lost once each: (to, kind, seq).
    lose: Vec<(usize, Kind, u64)>,
}

impl Sim {
    fn new() -> Sim {
        Sim {
            ends: [End::new(), End::new()],
            wire: VecDeque::new(),
            lose: Vec::new(),
        }
    }

    fn put(&mut self, to: usize, h: Header, len: usize) {
        if self.ends[to].stopped {
            return;
        }
        if let Some(i) = self
            .lose
            .iter()
            .position(|&(t, k, s)| (t, k, s) == (to, h.kind, h.seq))
        {
            self.lose.remove(i);
            return;
        }
        // What goes on the wire is what the peer decodes.
        let h = Header::decode(&h.encode()).expect("our own header");
        self.wire.push_back((to, h, len));
    }

    fn send(&mut self, from: usize, len: usize) {
        let e = &mut self.ends[from];
        let h = e.tx.data_header();
        e.tx.sent(len);
        e.last = Some((h, len));
        e.stats.datagrams_sent += 1;
        self.put(1 - from, h, len);
    }

    fn end_burst(&mut self, from: usize) {
        let e = &mut self.ends[from];
        if let Some(p) = e.tx.probe() {
            e.probe_seq = Some(p.seq);
            self.put(1 - from, p, 0);
        }
    }

    /// The socket layer's re-send: the last data datagram, flagged RETRY
    /// when `retry`, if the peer lacks it.
    fn resend(&mut self, from: usize, retry: bool, from_seq: u64) {
        let e = &mut self.ends[from];
        let Some((mut h, len)) = e.last else { return };
        if !e.tx.resends(from_seq) {
            return;
        }
        h.flags = if retry { FLAG_RETRY } else { 0 };
        e.stats.datagrams_sent += 1;
        e.stats.retries += 1;
        self.put(1 - from, h, len);
    }

    /// The socket layer's probe again: false once the burst is no longer
    /// the latest.
    fn reprobe(&mut self, from: usize) -> bool {
        let e = &mut self.ends[from];
        let Some(seq) = e.probe_seq else { return false };
        if !e.tx.still_ends_at(seq) {
            e.probe_seq = None;
            return false;
        }
        let p = e.tx.probe().expect("data was sent");
        self.put(1 - from, p, 0);
        true
    }

    /// Hands every datagram on the wire to its end, and what they answer,
    /// until the wire is empty.
    fn run(&mut self) {
        while let Some((to, h, len)) = self.wire.pop_front() {
            let e = &mut self.ends[to];
            if h.kind == Kind::Data {
                e.stats.datagrams_received += 1;
            }
            let a = e.rx.on_datagram(&h, len).expect("a well-behaved peer");
            e.stats.lost += a.tally.lost;
            e.stats.lost_bytes += a.tally.lost_bytes;
            e.stats.reordered += a.tally.reordered;
            e.stats.duplicates += a.tally.duplicates;
            let before = e.delivered_bytes;
            e.delivered_bytes += a.deliver_bytes as u64;
            let echo = e.echo && a.deliver_bytes > 0;
            let answer = e
                .answer_at_bytes
                .is_some_and(|n| before < n && e.delivered_bytes >= n);
            match a.answer {
                Answer::None => {}
                Answer::Control(c) => self.put(1 - to, c, 0),
                Answer::Resend { from_seq } => self.resend(to, false, from_seq),
            }
            if echo {
                self.send(to, a.deliver_bytes);
            }
            if answer {
                self.send(to, 1);
            }
        }
    }

    /// End `who` waits for new data from `now`, as a receive call does:
    /// the time it arrived, or the time the wait failed.
    fn wait(&mut self, who: usize, now: Instant, io_timeout: Duration) -> Result<Instant, Instant> {
        let had = self.ends[who].delivered_bytes;
        let probing = self.ends[who].probe_seq.is_some();
        let mut w = RecvWait::new(now, io_timeout, self.ends[who].rto.get(), probing);
        let mut now = now;
        loop {
            self.run();
            if self.ends[who].delivered_bytes > had {
                w.delivered(now, &mut self.ends[who].rto);
                return Ok(now);
            }
            now = w.wake_at().unwrap_or(now + w.wait());
            match w.tick(now) {
                Tick::TimedOut => return Err(now),
                Tick::Wait { retry, probe } => {
                    if retry {
                        self.resend(who, true, 0);
                    }
                    if probe {
                        let still = self.reprobe(who);
                        w.probed(now, still, self.ends[who].rto.get());
                    }
                }
            }
        }
    }
}

#[test]
fn a_clean_exchange_teaches_the_retry_timeout() {
    let mut sim = Sim::new();
    sim.ends[1].echo = true;
    let t0 = Instant::now();
    sim.send(0, 100);
    let got = sim.wait(0, t0, Duration::from_secs(1)).expect("echo");
    assert_eq!(got, t0, "the echo was on the wire at once");
    assert_eq!(sim.ends[0].delivered_bytes, 100);
    // A zero wait: four times it is below the floor, and far enough from
    // 20 ms to move the timeout.
    assert_eq!(sim.ends[0].rto.get(), crate::rto::RETRY_MIN);
    assert_eq!(sim.ends[0].stats.retries, 0);
}

#[test]
fn a_lost_request_is_retried_and_delivered_once() {
    let mut sim = Sim::new();
    sim.ends[1].echo = true;
    sim.lose.push((1, Kind::Data, 0));
    let t0 = Instant::now();
    sim.send(0, 4);
    let got = sim.wait(0, t0, Duration::from_secs(1)).expect("reply");
    assert_eq!(got, t0 + RETRY_INITIAL, "one retry timeout");
    let (a, b) = (&sim.ends[0], &sim.ends[1]);
    assert_eq!((a.stats.retries, a.stats.datagrams_sent), (1, 2));
    assert_eq!((b.delivered_bytes, b.stats.datagrams_received), (4, 1));
    // The retry asked the server for its last datagram; it had none.
    assert_eq!(b.stats.retries, 0);
    assert_eq!((b.stats.lost, b.stats.duplicates), (0, 0));
    // Karn: no sample, the backed-off wait holds.
    assert_eq!(a.rto.get(), 2 * RETRY_INITIAL);
}

#[test]
fn a_lost_reply_is_brought_back_by_the_retried_request() {
    let mut sim = Sim::new();
    sim.ends[1].echo = true;
    sim.lose.push((0, Kind::Data, 0));
    let t0 = Instant::now();
    sim.send(0, 8);
    sim.wait(0, t0, Duration::from_secs(1)).expect("reply");
    let (a, b) = (&sim.ends[0], &sim.ends[1]);
    assert_eq!(a.delivered_bytes, 8);
    assert_eq!(
        b.delivered_bytes, 8,
        "the retried request is not delivered twice"
    );
    assert_eq!(b.stats.duplicates, 1);
    assert_eq!((a.stats.retries, b.stats.retries), (1, 1));
    assert_eq!((a.stats.lost, b.stats.lost), (0, 0));
    // The next exchange goes on from there.
    sim.send(0, 8);
    sim.wait(0, t0 + Duration::from_secs(1), Duration::from_secs(1))
        .expect("second reply");
    assert_eq!(
        (sim.ends[0].delivered_bytes, sim.ends[1].delivered_bytes),
        (16, 16)
    );
}

#[test]
fn a_duplicate_is_counted_and_not_delivered() {
    let mut rx = Receiving::new();
    let a = rx.on_datagram(&data(0, 0), 3).expect("new");
    assert_eq!((a.deliver_bytes, a.tally), (3, Tally::default()));
    let a = rx.on_datagram(&data(0, 0), 3).expect("again");
    assert_eq!(a.deliver_bytes, 0);
    assert_eq!(
        a.tally,
        Tally {
            duplicates: 1,
            ..Tally::default()
        }
    );
    assert_eq!(a.answer, Answer::None);
}

#[test]
fn a_reordered_datagram_counts_lost_then_late_and_is_never_delivered() {
    let mut rx = Receiving::new();
    rx.on_datagram(&data(0, 0), 2).expect("0");
    let a = rx.on_datagram(&data(3, 7), 2).expect("3");
    assert_eq!(a.deliver_bytes, 2);
    assert_eq!((a.tally.lost, a.tally.lost_bytes), (2, 5));
    let a = rx.on_datagram(&data(2, 4), 3).expect("2, late");
    assert_eq!((a.deliver_bytes, a.tally.reordered), (0, 1));
    // Once taken from the gap, it is a duplicate.
    let a = rx.on_datagram(&data(2, 4), 3).expect("2, again");
    assert_eq!((a.deliver_bytes, a.tally.duplicates), (0, 1));
    let a = rx.on_datagram(&data(1, 2), 2).expect("1, late");
    assert_eq!(a.tally.reordered, 1);
    assert_eq!(rx.lost_ranges(), 0);
    assert_eq!((rx.next_seq(), rx.next_offset_bytes()), (4, 9));
}

#[test]
fn a_lost_tail_is_asked_for_by_the_probe() {
    let mut sim = Sim::new();
    sim.lose.push((1, Kind::Data, 3));
    for _ in 0..4 {
        sim.send(0, 10);
    }
    sim.end_burst(0);
    sim.run();
    let (a, b) = (&sim.ends[0], &sim.ends[1]);
    assert_eq!(b.delivered_bytes, 40, "the NACK brought the tail back");
    assert_eq!((b.stats.lost, b.stats.lost_bytes), (0, 0));
    assert_eq!(a.stats.retries, 1);
}

#[test]
fn a_lost_tail_and_probe_cost_probe_intervals_not_a_retry_timeout() {
    let mut sim = Sim::new();
    sim.ends[1].answer_at_bytes = Some(20);
    // The request's tail and the probe after it are dropped by the same
    // full queue.
    sim.lose.push((1, Kind::Data, 1));
    sim.lose.push((1, Kind::Probe, 1));
    let t0 = Instant::now();
    sim.send(0, 10);
    sim.send(0, 10);
    sim.end_burst(0);
    let got = sim.wait(0, t0, Duration::from_secs(1)).expect("reply");
    assert_eq!(got, t0 + PROBE_FIRST, "the first probe again");
    assert_eq!(sim.ends[1].delivered_bytes, 20);
    assert_eq!(sim.ends[0].stats.retries, 1);
}

#[test]
fn a_probe_for_what_arrived_is_not_answered() {
    let mut rx = Receiving::new();
    rx.on_datagram(&data(0, 0), 5).expect("0");
    let probe = Header {
        kind: Kind::Probe,
        flags: 0,
        seq: 0,
        offset_bytes: 5,
    };
    assert_eq!(
        rx.on_datagram(&probe, 0).expect("probe").answer,
        Answer::None
    );
    let probe = Header { seq: 1, ..probe };
    assert_eq!(
        rx.on_datagram(&probe, 0).expect("probe").answer,
        Answer::Control(Header {
            kind: Kind::Nack,
            flags: 0,
            seq: 1,
            offset_bytes: 5
        })
    );
}

#[test]
fn probes_double_up_to_the_retry_timeout_and_stop_with_new_data() {
    let t0 = Instant::now();
    let rto = Duration::from_micros(800);
    let mut p = ProbeTimer::new(t0, true);
    let mut now = t0;
    let mut gaps = Vec::new();
    while let Some(at) = p.at() {
        assert!(!p.due(at - Duration::from_nanos(1)));
        assert!(p.due(at));
        gaps.push(at - now);
        now = at;
        p.probed(now, true, rto);
    }
    let us: Vec<u128> = gaps.iter().map(|d| d.as_micros()).collect();
    assert_eq!(us, [100, 200, 400, 800]);
    let mut p = ProbeTimer::new(t0, true);
    p.probed(t0 + PROBE_FIRST, false, rto);
    assert_eq!(p.at(), None, "more data followed the burst");
    assert_eq!(ProbeTimer::new(t0, false).at(), None);
    // The sender's side of it: a probe names the last datagram.
    let mut tx = Sending::new();
    assert_eq!(tx.probe(), None);
    tx.sent(3);
    tx.sent(4);
    let probe = tx.probe().expect("a burst");
    assert_eq!(
        (probe.kind, probe.seq, probe.offset_bytes),
        (Kind::Probe, 1, 7)
    );
    assert!(tx.still_ends_at(1));
    tx.sent(1);
    assert!(!tx.still_ends_at(1));
}

#[test]
fn a_stopped_peer_is_retried_with_backoff_then_timed_out() {
    let mut sim = Sim::new();
    sim.ends[1].stopped = true;
    let t0 = Instant::now();
    sim.send(0, 1);
    let failed = sim
        .wait(0, t0, Duration::from_secs(1))
        .expect_err("nobody answers");
    assert_eq!(failed, t0 + Duration::from_secs(1));
    // Retries at 20, 60, 140, 300 and 620 ms; the next would be at 1,260.
    assert_eq!(sim.ends[0].stats.retries, 5);
    assert_eq!(
        sim.ends[0].rto.get(),
        RETRY_INITIAL,
        "no sample from a failure"
    );
}

#[test]
fn a_wait_blocks_until_the_next_retry_or_the_deadline() {
    let t0 = Instant::now();
    let mut w = RecvWait::new(t0, Duration::from_millis(50), RETRY_INITIAL, false);
    assert_eq!((w.wait(), w.wake_at()), (RETRY_INITIAL, None));
    let t = t0 + Duration::from_millis(5);
    assert_eq!(
        w.tick(t),
        Tick::Wait {
            retry: false,
            probe: false
        }
    );
    assert_eq!(w.wait(), Duration::from_millis(15));
    let t = t0 + RETRY_INITIAL;
    assert_eq!(
        w.tick(t),
        Tick::Wait {
            retry: true,
            probe: false
        }
    );
    assert!(w.retried());
    // The next retry would be at 60 ms, past the deadline at 50.
    assert_eq!(w.wait(), Duration::from_millis(30));
    assert_eq!(w.tick(t0 + Duration::from_millis(50)), Tick::TimedOut);
    let w = RecvWait::new(t0, Duration::from_millis(5), RETRY_INITIAL, true);
    assert_eq!(w.wait(), Duration::from_millis(5));
    assert_eq!(w.wake_at(), Some(t0 + PROBE_FIRST));
}

/// A one-way sender at `gap` between sends, from `t0` to `until`; the
/// receiver acknowledges (paced) until `stop`. The time the sender names
/// the peer silent, if it does.
fn one_way(
    io_timeout: Duration,
    gap: Duration,
    stop: Duration,
    until: Duration,
) -> Option<Duration> {
    let t0 = Instant::now();
    let mut watch = SilenceWatch::new(io_timeout);
    let mut pacer = AckPacer::new(io_timeout);
    let mut heard = 0u64;
    let mut t = Duration::ZERO;
    while t < until {
        let now = t0 + t;
        if let SendCheck::Listen { quiet } = watch.before_send(now, heard) {
            if watch.after_listen(now, heard, quiet) {
                return Some(t);
            }
        }
        // The datagram arrives; a receiving peer may acknowledge it, and
        // the sender hears that at its next look.
        if t < stop && pacer.due(now) {
            heard += 1;
        }
        t += gap;
    }
    None
}

#[test]
fn a_one_way_sender_names_a_peer_that_stops_and_not_one_that_receives() {
    let timeout = Duration::from_millis(200);
    let gap = Duration::from_millis(1);
    assert_eq!(
        one_way(timeout, gap, Duration::from_secs(5), Duration::from_secs(5)),
        None,
        "a receiving peer acknowledges"
    );
    let stop = Duration::from_secs(1);
    let named = one_way(timeout, gap, stop, Duration::from_secs(5)).expect("named");
    let after = named - stop;
    assert!(
        after >= Duration::from_millis(150) && after <= Duration::from_millis(250),
        "{after:?}"
    );
}

#[test]
fn a_sender_that_paused_is_not_taken_for_a_silent_peer() {
    let timeout = Duration::from_millis(200);
    let t0 = Instant::now();
    let mut watch = SilenceWatch::new(timeout);
    // Sends now and then, each after a pause longer than an eighth of the
    // timeout, from a peer that never answers: no silence of the peer's.
    for i in 0..50u32 {
        let now = t0 + Duration::from_millis(30) * i;
        assert_eq!(watch.before_send(now, 0), SendCheck::Go, "send {i}");
    }
}

#[test]
fn acknowledgments_go_at_most_every_quarter_timeout() {
    let t0 = Instant::now();
    let mut p = AckPacer::new(Duration::from_millis(200));
    assert!(p.due(t0));
    assert!(!p.due(t0 + Duration::from_millis(49)));
    assert!(p.due(t0 + Duration::from_millis(50)));
    assert!(!p.due(t0 + Duration::from_millis(51)));
}

#[test]
fn control_datagrams_answer_as_the_protocol_says() {
    let mut rx = Receiving::new();
    let hello = rx
        .on_datagram(&Header::control(Kind::Hello), 0)
        .expect("hello");
    assert_eq!(
        hello.answer,
        Answer::Control(Header::control(Kind::HelloAck))
    );
    for kind in [Kind::HelloAck, Kind::Confirm, Kind::ConfirmAck, Kind::Ack] {
        let a = rx.on_datagram(&Header::control(kind), 0).expect("control");
        assert_eq!(
            a,
            Arrival {
                deliver_bytes: 0,
                tally: Tally::default(),
                answer: Answer::None
            }
        );
    }
    let nack = Header {
        kind: Kind::Nack,
        flags: 0,
        seq: 4,
        offset_bytes: 0,
    };
    assert_eq!(
        rx.on_datagram(&nack, 0).expect("nack").answer,
        Answer::Resend { from_seq: 4 }
    );
    let retry = Header {
        flags: FLAG_RETRY,
        ..data(0, 0)
    };
    assert_eq!(
        rx.on_datagram(&retry, 1).expect("retry").answer,
        Answer::Resend { from_seq: 0 }
    );
    assert_eq!(
        rx.ack(),
        Header {
            kind: Kind::Ack,
            flags: 0,
            seq: 1,
            offset_bytes: 1
        }
    );
    assert!(rx.is_new_data(&data(1, 1)) && !rx.is_new_data(&data(0, 0)));
}

#[test]
fn offsets_that_contradict_the_stream_are_protocol_errors() {
    let mut rx = Receiving::new();
    rx.on_datagram(&data(0, 0), 2).expect("0");
    let e = rx.on_datagram(&data(1, 0), 1).expect_err("backwards");
    assert_eq!(
        e.to_string(),
        "datagram 1 at offset 0 bytes, expected at least 2"
    );
    let e = rx
        .on_datagram(&data(5, u64::MAX), 2)
        .expect_err("past 2^64");
    assert!(
        matches!(e, ProtocolError::OffsetOutOfRange { seq: 5, .. }),
        "{e}"
    );
    let e = rx
        .on_datagram(&data(3, 2), 1)
        .expect_err("datagrams without bytes");
    assert_eq!(
        e.to_string(),
        "datagram 3 at offset 2 bytes after datagram 0 ended at 2"
    );
    let e = rx
        .on_datagram(&data(1, 9), 1)
        .expect_err("bytes without datagrams");
    assert!(matches!(e, ProtocolError::GapMismatch { .. }), "{e}");
    // Nothing changed.
    assert_eq!((rx.next_seq(), rx.next_offset_bytes()), (1, 2));
}

#[test]
fn the_lost_set_splits_and_forgets() {
    let mut r = VecDeque::from([(2u64, 6u64)]);
    assert!(take_lost(&mut r, 4));
    assert_eq!(r, [(2, 4), (5, 6)]);
    assert!(take_lost(&mut r, 2) && take_lost(&mut r, 5));
    assert_eq!(r, [(3, 4)]);
    assert!(!take_lost(&mut r, 9));
    assert!(take_lost(&mut r, 3));
    assert!(r.is_empty());
}

proptest! {
    /// Whatever is lost, duplicated or reordered, every byte sent is
    /// delivered once or counted lost once, and the gaps stay bounded.
    #[test]
    fn received_plus_lost_bytes_is_what_was_sent(
        lens in proptest::collection::vec(1usize..2000, 1..200),
        fate in proptest::collection::vec(0u8..4, 1..200),
    ) {
        let mut tx = Sending::new();
        let mut sent = Vec::new();
        for &len in &lens {
            sent.push((tx.data_header(), len));
            tx.sent(len);
        }
        // 0: arrives, 1: lost, 2: arrives twice, 3: swapped with the next.
        let mut wire = Vec::new();
        let mut i = 0;
        while i < sent.len() {
            match fate[i % fate.len()] {
                1 => {}
                2 => { wire.push(sent[i]); wire.push(sent[i]); }
                3 if i + 1 < sent.len() => { wire.push(sent[i + 1]); wire.push(sent[i]); i += 1; }
                _ => wire.push(sent[i]),
            }
            i += 1;
        }
        let mut rx = Receiving::new();
        let (mut delivered, mut lost_bytes) = (0u64, 0u64);
        for (h, len) in wire {
            let a = rx.on_datagram(&h, len).expect("a well-behaved sender");
            delivered += a.deliver_bytes as u64;
            lost_bytes += a.tally.lost_bytes;
            prop_assert!(rx.lost_ranges() <= MAX_LOST_RANGES);
        }
        prop_assert_eq!(delivered + lost_bytes, rx.next_offset_bytes());
        // The tail: a probe finds what is missing after the last arrival.
        if let Some(p) = tx.probe() {
            let nacked = matches!(rx.on_datagram(&p, 0).expect("probe").answer, Answer::Control(_));
            prop_assert_eq!(nacked, rx.next_seq() < tx.next_seq());
        }
    }
}
