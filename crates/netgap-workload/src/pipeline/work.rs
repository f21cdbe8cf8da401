//! What moves on a pipeline stream and what a filter does to it, without
//! I/O: the frame of a unit of work (UOW) or an end-of-work marker, the
//! checksum every stage checks, the transform every filter stage applies
//! to every byte, and the producer's deterministic data, which lets the
//! consumer recompute what each UOW must be when it arrives.

/// A frame carries a unit of work.
pub(crate) const KIND_UOW: u8 = 1;
/// A frame ends the query on its stream.
pub(crate) const KIND_EOW: u8 = 2;
/// Bytes of a frame header.
pub(crate) const HEADER_BYTES: usize = 32;

/// The header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    /// [`KIND_UOW`] or [`KIND_EOW`].
    pub kind: u8,
    /// Payload bytes that follow.
    pub len: u32,
    /// The UOW's number in the query.
    pub seq: u64,
    /// When the producer sent it, ns after its role's start.
    pub sent_ns: u64,
    /// [`checksum`] of the payload.
    pub sum: u64,
}

impl Frame {
    /// The header's bytes (little-endian).
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0] = self.kind;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.sent_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.sum.to_le_bytes());
        b
    }

    /// A header from its bytes; the caller range-checks the fields.
    pub(crate) fn decode(b: &[u8; HEADER_BYTES]) -> Frame {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[4..8]);
        Frame {
            kind: b[0],
            len: u32::from_le_bytes(len),
            seq: u64_at(8),
            sent_ns: u64_at(16),
            sum: u64_at(24),
        }
    }
}

/// A checksum of every byte (Fletcher-style over 64-bit words, with the
/// tail bytewise): cheap, and any changed, lost or moved byte changes it.
pub(crate) fn checksum(data: &[u8]) -> u64 {
    let (mut a, mut b) = (0x1234_5678u64, 0u64);
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        a = a.wrapping_add(u64::from_le_bytes(w));
        b = b.wrapping_add(a);
    }
    for &x in chunks.remainder() {
        a = a.wrapping_add(u64::from(x));
        b = b.wrapping_add(a);
    }
    a ^ b.rotate_left(32) ^ data.len() as u64
}

/// Filter stage `stage`'s transform of every byte, in place: a bijection
/// of each byte that differs from stage to stage.
pub(crate) fn transform(stage: u32, data: &mut [u8]) {
    let key = (stage.wrapping_mul(17).wrapping_add(1) & 0xff) as u8;
    for x in data.iter_mut() {
        *x = x.wrapping_mul(3).wrapping_add(key);
    }
}

/// The producer's UOW `seq` of a query of UOWs of `uow_bytes`.
pub(crate) fn produce(seq: u64, uow_bytes: u64, buf: &mut [u8]) {
    crate::pio::layout::fill(buf, seq.wrapping_mul(uow_bytes), 0x5eed_da7a);
}

/// What UOW `seq` must be after `filters` filter stages.
pub(crate) fn expected(seq: u64, uow_bytes: u64, filters: u32, buf: &mut [u8]) {
    produce(seq, uow_bytes, buf);
    for s in 1..=filters {
        transform(s, buf);
    }
}

/// The UOWs of a query of `data_bytes` and the length of UOW `seq`.
pub(crate) fn uow_len(seq: u64, data_bytes: u64, uow_bytes: u64) -> u64 {
    data_bytes.saturating_sub(seq * uow_bytes).min(uow_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_work_is_checked_end_to_end() {
        let f = Frame {
            kind: KIND_UOW,
            len: 16384,
            seq: 9,
            sent_ns: 77,
            sum: 0xdead_beef,
        };
        assert_eq!(Frame::decode(&f.encode()), f);
        let mut a = vec![0u8; 1000];
        produce(3, 1000, &mut a);
        let s0 = checksum(&a);
        transform(1, &mut a);
        transform(2, &mut a);
        let mut b = vec![0u8; 1000];
        expected(3, 1000, 2, &mut b);
        assert_eq!(a, b);
        assert_ne!(checksum(&a), s0);
        // Swapping two bytes changes the checksum.
        let before = checksum(&b);
        b.swap(10, 900);
        assert!(b[10] == b[900] || checksum(&b) != before);
        assert_eq!(uow_len(2, 2500, 1000), 500);
        assert_eq!(uow_len(3, 2500, 1000), 0);
    }
}
