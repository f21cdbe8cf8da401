//! The udp transport's datagrams on hostile input: whatever bytes arrive,
//! cut into datagrams, the header decoder and the receiving end of the
//! retry protocol take them as the data path does, and nothing panics, a
//! header that decodes encodes back to the same bytes, a datagram whose
//! offsets contradict the stream is refused without changing the
//! receiver, and every byte the receiver accounts for was delivered once
//! or counted lost once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_transport::udp::reliable::{
    Answer, Receiving, RecvWait, Sending, Tick, MAX_LOST_RANGES,
};
use netgap_transport::udp::wire::{Header, HEADER_BYTES};
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let mut rx = Receiving::new();
    let mut tx = Sending::new();
    tx.sent(100);
    tx.sent(100);
    let (mut delivered, mut lost_bytes) = (0u64, 0u64);
    let t0 = Instant::now();
    let rto = Duration::from_millis(20);
    let mut wait = RecvWait::new(t0, Duration::from_secs(1), rto, true);
    let mut now = t0;
    // Each datagram is its length (one byte) and that many bytes.
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let (datagram, after) = tail.split_at(tail.len().min(usize::from(len)));
        rest = after;
        let Ok(h) = Header::decode(datagram) else {
            continue;
        };
        let again = h.encode();
        assert_eq!(again[..5], datagram[..5], "magic, version, kind, flags");
        assert_eq!(again[8..], datagram[8..HEADER_BYTES], "sequence and offset");
        let payload_bytes = datagram.len() - HEADER_BYTES;
        let before = (rx.next_seq(), rx.next_offset_bytes());
        match rx.on_datagram(&h, payload_bytes) {
            Ok(a) => {
                assert!(a.deliver_bytes <= payload_bytes);
                delivered += a.deliver_bytes as u64;
                lost_bytes += a.tally.lost_bytes;
                if let Answer::Resend { from_seq } = a.answer {
                    let _ = tx.resends(from_seq);
                }
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                assert_eq!(before, (rx.next_seq(), rx.next_offset_bytes()));
                // The flow ends on a broken peer.
                break;
            }
        }
        assert_eq!(delivered + lost_bytes, rx.next_offset_bytes());
        assert!(rx.lost_ranges() <= MAX_LOST_RANGES);
        // The waiting end's timers, on a clock the flags move.
        now += Duration::from_micros(u64::from(h.flags) * 100);
        if let Tick::Wait { probe: true, .. } = wait.tick(now) {
            wait.probed(now, h.seq % 2 == 0, rto);
        }
        assert!(wait.wait() <= Duration::from_secs(1));
    }
});
