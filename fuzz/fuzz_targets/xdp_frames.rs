//! The xdp transport's frames on hostile input: whatever bytes arrive, cut
//! into frames, the parser, the authenticator's check and both windows of
//! the reliable protocol take them as the data path does, and nothing
//! panics, no frame without the flow's key passes a keyed end (so none
//! reaches its windows), and a receiver never holds more than its room.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::dataproof::FlowKey;
use netgap_transport::xdp::auth::{End, FrameKeys, Guard, Side};
use netgap_transport::xdp::reliable::{parse, Kind, RecvWindow, SendWindow};

const CLIENT: End = End {
    mac: [2, 0, 0, 0, 0, 1],
    flow: 0x1234,
    isn: 0xffff_fff0,
};
const SERVER: End = End {
    mac: [2, 0, 0, 0, 0, 2],
    flow: 0x4321,
    isn: 7,
};
const ROOM_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let mut keyed = Guard::new();
    keyed.set_keys(FrameKeys::derive(
        &FlowKey::from_bytes([5; 32]),
        Side::Server,
        &CLIENT,
        &SERVER,
    ));
    let mut open = Guard::new();
    let mut open_recv = RecvWindow::new(CLIENT.isn, 256, ROOM_BYTES);
    let mut send = SendWindow::new(SERVER.isn, 64, 16);
    for slot in 0..4 {
        send.push(slot, 0);
    }
    // Each frame is its length (one byte, in 4-byte units) and that many
    // bytes.
    let mut rest = data;
    let mut now_ns = 0u64;
    while let Some((&len, tail)) = rest.split_first() {
        let (frame, after) = tail.split_at(tail.len().min(usize::from(len) * 4));
        rest = after;
        now_ns += 1_000;
        assert!(!keyed.admit(frame), "a frame without the key passed");
        let Ok(p) = parse(frame) else { continue };
        assert!(open.admit(frame), "an unkeyed end takes every frame");
        let h = p.header;
        match h.kind {
            Kind::Data | Kind::Fin => {
                open_recv.on_frame(h.seq, p.payload, h.kind == Kind::Fin, now_ns);
            }
            Kind::Probe => open_recv.on_probe(),
            _ => {}
        }
        let _ = send.on_ack(h.ack, h.credit, h.sack, now_ns);
        let _ = send.due(now_ns);
        let _ = open_recv.take_ack();
        let mut buf = [0u8; 512];
        let _ = open_recv.read(&mut buf);
        assert!(open_recv.ready_bytes() <= ROOM_BYTES);
    }
});
