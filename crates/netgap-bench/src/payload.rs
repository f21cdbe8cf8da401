//! Message contents and `--verify`. Without verification a test sends one
//! buffer over and over and never looks at what arrives, so the data path is
//! all that is timed. With it, every byte carries a pattern keyed by its
//! offset in the flow's byte stream, so a lost, duplicated, reordered or
//! corrupted byte is caught where it lands; filling and checking cost time,
//! so verified runs are for correctness, not speed figures.

use netgap_transport::FlowError;

/// The pattern byte at `offset` of a flow's byte stream: a multiplicative
/// hash, so neighbouring messages differ and a shifted stream is caught.
#[inline]
pub(crate) fn pattern_byte(offset: u64) -> u8 {
    (offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// Writes the pattern for stream offsets `offset..offset + buf.len()`.
pub(crate) fn fill_pattern(buf: &mut [u8], offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(offset + i as u64);
    }
}

/// One direction's position in the pattern.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PatternCursor {
    /// Whether bytes are filled or checked at all.
    pub verify: bool,
    /// Stream offset of the next byte, in bytes.
    pub offset_bytes: u64,
}

impl PatternCursor {
    /// A cursor at offset 0.
    pub(crate) fn new(verify: bool) -> PatternCursor {
        PatternCursor {
            verify,
            offset_bytes: 0,
        }
    }

    /// Fills `buf` with the next bytes of the pattern (when verifying).
    #[inline]
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        if self.verify {
            fill_pattern(buf, self.offset_bytes);
            self.offset_bytes += buf.len() as u64;
        }
    }

    /// Checks that `data` are the next bytes of the pattern (when verifying).
    #[inline]
    pub(crate) fn check(&mut self, data: &[u8]) -> Result<(), FlowError> {
        if !self.verify {
            return Ok(());
        }
        for (i, &got) in data.iter().enumerate() {
            let offset = self.offset_bytes + i as u64;
            let expected = pattern_byte(offset);
            if got != expected {
                return Err(FlowError::Corrupt {
                    offset_bytes: offset,
                    expected,
                    got,
                });
            }
        }
        self.offset_bytes += data.len() as u64;
        Ok(())
    }

    /// Moves past `bytes` that will never arrive (lost datagrams), so the
    /// bytes after them are checked against their own offsets.
    #[inline]
    pub(crate) fn skip(&mut self, bytes: u64) {
        if self.verify {
            self.offset_bytes += bytes;
        }
    }
}

/// Receives exactly `total_bytes` into `scratch` (non-empty) chunk by chunk,
/// checking each chunk against `cursor`. Bytes an unreliable flow counts
/// lost count toward `total_bytes` and are skipped in the pattern; returns
/// how many there were (0 on a reliable flow).
pub(crate) fn recv_checked(
    rx: &mut dyn netgap_transport::Receiver,
    mut total_bytes: u64,
    scratch: &mut [u8],
    cursor: &mut PatternCursor,
) -> Result<u64, FlowError> {
    let lost_at_start = rx.lost_bytes();
    if !cursor.verify {
        rx.recv_discard(total_bytes, scratch)?;
        return Ok(rx.lost_bytes().saturating_sub(lost_at_start));
    }
    while total_bytes > 0 {
        let want = scratch
            .len()
            .min(usize::try_from(total_bytes).unwrap_or(usize::MAX));
        let lost0 = rx.lost_bytes();
        let n = rx.recv_some(&mut scratch[..want])?;
        let lost = rx.lost_bytes().saturating_sub(lost0);
        cursor.skip(lost);
        cursor.check(&scratch[..n])?;
        total_bytes = total_bytes.saturating_sub(n as u64 + lost);
    }
    Ok(rx.lost_bytes().saturating_sub(lost_at_start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_accepts_the_pattern_in_any_chunking() {
        let mut data = vec![0u8; 10_000];
        fill_pattern(&mut data, 0);
        let mut c = PatternCursor::new(true);
        for chunk in data.chunks(333) {
            c.check(chunk).expect("pattern");
        }
        assert_eq!(c.offset_bytes, 10_000);
    }

    #[test]
    fn check_names_the_first_bad_offset() {
        let mut data = vec![0u8; 100];
        fill_pattern(&mut data, 0);
        data[42] ^= 1;
        let e = PatternCursor::new(true).check(&data).unwrap_err();
        assert!(
            matches!(
                e,
                FlowError::Corrupt {
                    offset_bytes: 42,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_repeated_message_is_caught() {
        let mut msg = vec![0u8; 64];
        fill_pattern(&mut msg, 0);
        let mut c = PatternCursor::new(true);
        c.check(&msg).expect("first copy");
        assert!(
            c.check(&msg).is_err(),
            "the same bytes again are not the next bytes"
        );
    }

    #[test]
    fn without_verify_nothing_is_checked() {
        let mut c = PatternCursor::new(false);
        c.check(&[1, 2, 3]).expect("unchecked");
        assert_eq!(c.offset_bytes, 0);
    }
}
