//! The copies into and out of a ring: short ones in line, long ones by the
//! C library's `memcpy`, steering around its one slow case.

/// Copies at least this long go through [`copy_bytes`]'s distance check:
/// glibc on x86-64 copies anything shorter with vector loads and stores and
/// never with `rep movsb` (its threshold is at least 2048 bytes).
const COPY_BLOCK_BYTES: usize = 2048;

/// Copies this short are done in line (at most two overlapping loads and
/// stores) rather than by a call to the C library's `memcpy`.
const SMALL_COPY_BYTES: usize = 16;

/// Copies `n` bytes from `src` to `dst` with the C library's `memcpy`,
/// steering around its one slow case. glibc copies 2 KiB to 1 MiB with
/// `rep movsb`, and on AMD Zen 4 (this project's machines) `rep movsb` drops
/// from ~350 to ~16 Gbit/s when the destination lies 1 to 63 bytes after the
/// source modulo 4 KiB (glibc avoids that "short distance" only on Intel).
/// A byte stream hits it easily: a ring offset left at an odd byte by small
/// messages meets a heap buffer at 16 bytes past a page. In that case the
/// copy goes in [`COPY_BLOCK_BYTES`] pieces, which glibc copies with vector
/// instructions at full speed whatever the alignment (measured: 330–350
/// Gbit/s for 256 KiB against 370 for an undisturbed `rep movsb`).
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`]: `src` valid for reads and `dst`
/// for writes of `n` bytes, not overlapping.
#[inline]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    if n <= SMALL_COPY_BYTES {
        // SAFETY: the caller's contract.
        unsafe { copy_small(src, dst, n) };
        return;
    }
    let distance = (dst as usize).wrapping_sub(src as usize) & 4095;
    if n <= COPY_BLOCK_BYTES || distance == 0 || distance >= 64 {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    let mut off = 0;
    while off < n {
        let k = (n - off).min(COPY_BLOCK_BYTES);
        // SAFETY: `off + k ≤ n`, so both pieces lie inside the caller's
        // ranges, which do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), k) };
        off += k;
    }
}

/// Copies `n ≤ SMALL_COPY_BYTES` bytes as the C library does inside its
/// `memcpy`, without the call: a small message's copy in and copy out are
/// on a ping-pong's critical path twice per round trip.
///
/// # Safety
///
/// As for [`copy_bytes`].
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    debug_assert!(n <= SMALL_COPY_BYTES);
    // SAFETY: every access lies within `src[..n]` or `dst[..n]`, which the
    // caller guarantees valid; the unaligned forms make no assumption about
    // alignment.
    unsafe {
        if n >= 8 {
            let a = std::ptr::read_unaligned(src.cast::<u64>());
            let b = std::ptr::read_unaligned(src.add(n - 8).cast::<u64>());
            std::ptr::write_unaligned(dst.cast::<u64>(), a);
            std::ptr::write_unaligned(dst.add(n - 8).cast::<u64>(), b);
        } else if n >= 4 {
            let a = std::ptr::read_unaligned(src.cast::<u32>());
            let b = std::ptr::read_unaligned(src.add(n - 4).cast::<u32>());
            std::ptr::write_unaligned(dst.cast::<u32>(), a);
            std::ptr::write_unaligned(dst.add(n - 4).cast::<u32>(), b);
        } else if n > 0 {
            let (a, b, c) = (*src, *src.add(n / 2), *src.add(n - 1));
            *dst = a;
            *dst.add(n / 2) = b;
            *dst.add(n - 1) = c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 7 + seed) % 251) as u8).collect()
    }

    #[test]
    fn copies_of_every_short_length_move_exactly_their_bytes() {
        for n in 0..=40 {
            for (src_off, dst_off) in [(0, 0), (1, 0), (0, 3), (5, 7), (15, 9)] {
                let src = pattern(64, n);
                let mut dst = vec![0xEEu8; 64];
                // SAFETY: both ranges lie inside their 64-byte vectors
                // (offset at most 15, length at most 40), which are
                // distinct allocations.
                unsafe { copy_bytes(src.as_ptr().add(src_off), dst.as_mut_ptr().add(dst_off), n) };
                assert_eq!(
                    &dst[dst_off..dst_off + n],
                    &src[src_off..src_off + n],
                    "n={n}"
                );
                assert!(
                    dst[..dst_off]
                        .iter()
                        .chain(&dst[dst_off + n..])
                        .all(|&b| b == 0xEE),
                    "n={n}: a byte outside the copy changed"
                );
            }
        }
    }

    #[test]
    fn a_long_copy_at_a_short_distance_moves_every_byte() {
        let n = 3 * 4096;
        let src = pattern(n, 1);
        let mut dst = vec![0u8; n + 4096];
        // Destination 17 bytes past the source modulo 4 KiB: the pieces.
        let d = (src.as_ptr() as usize + 17).wrapping_sub(dst.as_ptr() as usize) & 4095;
        // SAFETY: `d < 4096`, so `d + n ≤ dst.len()`; distinct vectors.
        unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr().add(d), n) };
        assert_eq!(&dst[d..d + n], &src[..]);
    }
}
