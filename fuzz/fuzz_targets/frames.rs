//! Control frames as a peer's bytes arrive: split into chunks at arbitrary
//! points, pushed into a frame decoder, every complete frame decoded as a
//! request and as a reply. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::codec::{decode_reply, decode_request, FrameDecoder};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the chunk size, so a frame's header and payload
    // arrive split in every way.
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = FrameDecoder::new();
    for piece in rest.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let _ = decode_request(&frame);
                    let _ = decode_reply(&frame);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
