//! Where the bytes of the logical file live and which bytes each client
//! moves, without I/O: striping round-robin over the servers, the
//! `contiguous` (pvfs-test) and `tile` (MPI-Tile-I/O) access patterns, and
//! the deterministic contents a client writes and checks when it reads
//! them back.

/// The logical file striped round-robin over `servers` in units of
/// `stripe_bytes`: stripe `k` is on server `k % servers` at local offset
/// `(k / servers) * stripe_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Bytes of one stripe unit.
    pub stripe_bytes: u64,
    /// I/O servers the file is striped over.
    pub servers: u32,
}

/// One request to one server: a run of bytes inside one stripe unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The server that holds it.
    pub server: u32,
    /// Its offset in that server's local file.
    pub local_offset: u64,
    /// Its offset in the logical file.
    pub logical_offset: u64,
    /// Its length in bytes (at most a stripe unit).
    pub len: u64,
}

impl Layout {
    /// Appends the pieces of logical bytes `offset..offset + len`, split at
    /// stripe boundaries, to `out`.
    pub(crate) fn pieces(&self, mut offset: u64, len: u64, out: &mut Vec<Piece>) {
        let end = offset.saturating_add(len);
        let servers = u64::from(self.servers.max(1));
        while offset < end {
            let k = offset / self.stripe_bytes;
            let within = offset % self.stripe_bytes;
            let n = (self.stripe_bytes - within).min(end - offset);
            out.push(Piece {
                server: (k % servers) as u32,
                local_offset: (k / servers) * self.stripe_bytes + within,
                logical_offset: offset,
                len: n,
            });
            offset += n;
        }
    }

    /// The size a server's local file may reach for a logical file of
    /// `logical_bytes`: every server holds at most this much.
    pub(crate) fn local_bytes(&self, logical_bytes: u64) -> u64 {
        let stripes = logical_bytes.div_ceil(self.stripe_bytes);
        stripes.div_ceil(u64::from(self.servers.max(1))) * self.stripe_bytes
    }
}

/// Which bytes each client writes and reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// pvfs-test: client `r` of `n` moves block `j` at offset
    /// `(j * n + r) * block_bytes`, for `j` in `0..blocks`.
    Contiguous {
        /// Bytes of one block.
        block_bytes: u64,
        /// Blocks per client.
        blocks: u64,
    },
    /// MPI-Tile-I/O: a 2-D array of `n` tiles side by side (one row of
    /// tiles, one tile per client), each `rows` rows of `cols` elements of
    /// `element_bytes`; a file row holds a row of every tile, so each of a
    /// tile's rows is a run of its own, apart from the next.
    Tile {
        /// Elements per tile row.
        cols: u64,
        /// Rows per tile.
        rows: u64,
        /// Bytes per element.
        element_bytes: u64,
    },
}

impl Pattern {
    /// The runs `(logical offset, length)` client `r` of `n` moves, in
    /// order.
    pub(crate) fn requests(&self, r: u32, n: u32) -> Vec<(u64, u64)> {
        let (r, n) = (u64::from(r), u64::from(n));
        match *self {
            Pattern::Contiguous {
                block_bytes,
                blocks,
            } => (0..blocks)
                .map(|j| ((j * n + r) * block_bytes, block_bytes))
                .collect(),
            Pattern::Tile {
                cols,
                rows,
                element_bytes,
            } => {
                let row_bytes = cols * element_bytes;
                (0..rows)
                    .map(|i| ((i * n + r) * row_bytes, row_bytes))
                    .collect()
            }
        }
    }

    /// Bytes of the logical file `n` clients make.
    pub(crate) fn logical_bytes(&self, n: u32) -> u64 {
        let n = u64::from(n);
        match *self {
            Pattern::Contiguous {
                block_bytes,
                blocks,
            } => block_bytes.saturating_mul(blocks).saturating_mul(n),
            Pattern::Tile {
                cols,
                rows,
                element_bytes,
            } => cols
                .saturating_mul(rows)
                .saturating_mul(element_bytes)
                .saturating_mul(n),
        }
    }
}

/// A 64-bit mix of `x` (splitmix64's finalizer): the contents of the file
/// are a function of the offset and a seed, so a reader checks any run
/// without keeping what it wrote.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Fills `buf` with the file's contents at logical `offset` under `seed`.
pub(crate) fn fill(buf: &mut [u8], offset: u64, seed: u64) {
    let mut pos = offset;
    let mut i = 0;
    while i < buf.len() {
        let word = mix((pos / 8) ^ seed).to_le_bytes();
        let start = (pos % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[start..start + n]);
        i += n;
        pos += n as u64;
    }
}

/// What a client writes and expects back: the file's contents under a
/// seed, cheap to make and to check at link speed. Every stripe-sized run
/// of the file repeats one block of [`fill`]'s bytes, and the first 16
/// bytes of each piece are stamped with its logical offset and the seed,
/// so a byte changed, a piece misplaced or a stale file (another seed) is
/// caught by one comparison.
pub(crate) struct Contents {
    seed: u64,
    base: Vec<u8>,
}

impl Contents {
    /// The contents under `seed` of a file striped in units of
    /// `stripe_bytes`.
    pub(crate) fn new(seed: u64, stripe_bytes: usize) -> Contents {
        let mut base = vec![0u8; stripe_bytes.max(1)];
        fill(&mut base, 0, seed);
        Contents { seed, base }
    }

    /// The piece at logical `offset`, `buf.len()` bytes inside one stripe
    /// unit.
    pub(crate) fn piece(&self, offset: u64, buf: &mut [u8]) {
        let w = (offset % self.base.len() as u64) as usize;
        match self.base.get(w..w + buf.len()) {
            Some(src) => buf.copy_from_slice(src),
            None => fill(buf, offset, self.seed),
        }
        let mut stamp = [0u8; 16];
        stamp[..8].copy_from_slice(&(offset ^ self.seed).to_le_bytes());
        stamp[8..].copy_from_slice(&self.seed.rotate_left(17).to_le_bytes());
        let n = buf.len().min(16);
        buf[..n].copy_from_slice(&stamp[..n]);
    }

    /// The logical offset of the first byte of `buf` (the piece read at
    /// `offset`) that differs from what was written, if any; `scratch` is
    /// at least as long as `buf`.
    pub(crate) fn first_mismatch(
        &self,
        buf: &[u8],
        offset: u64,
        scratch: &mut [u8],
    ) -> Option<u64> {
        let expected = &mut scratch[..buf.len()];
        self.piece(offset, expected);
        if buf == &expected[..] {
            return None;
        }
        buf.iter()
            .zip(expected.iter())
            .position(|(a, b)| a != b)
            .map(|i| offset + i as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_go_round_robin_and_split_at_their_boundaries() {
        let l = Layout {
            stripe_bytes: 100,
            servers: 3,
        };
        let mut p = Vec::new();
        l.pieces(250, 200, &mut p);
        let got: Vec<(u32, u64, u64)> = p
            .iter()
            .map(|p| (p.server, p.local_offset, p.len))
            .collect();
        // Stripes 2 (server 2, local 0), 3 (server 0, local 100), 4
        // (server 1, local 100).
        assert_eq!(got, vec![(2, 50, 50), (0, 100, 100), (1, 100, 50)]);
        assert_eq!(p.iter().map(|p| p.len).sum::<u64>(), 200);
        // 10 stripes over 3 servers: at most 4 each.
        assert_eq!(l.local_bytes(1000), 400);
        assert_eq!(l.local_bytes(901), 400);
    }

    #[test]
    fn contiguous_clients_interleave_blocks_and_tiles_rows() {
        let c = Pattern::Contiguous {
            block_bytes: 10,
            blocks: 2,
        };
        assert_eq!(c.requests(1, 3), vec![(10, 10), (40, 10)]);
        assert_eq!(c.logical_bytes(3), 60);
        // The study's tile: 2 tiles of 1024 x 768 elements of 32 bytes.
        let t = Pattern::Tile {
            cols: 1024,
            rows: 768,
            element_bytes: 32,
        };
        assert_eq!(t.logical_bytes(2), 48 << 20);
        let rows = t.requests(1, 2);
        assert_eq!(rows.len(), 768);
        assert_eq!(rows[0], (32 << 10, 32 << 10));
        assert_eq!(rows[1], (96 << 10, 32 << 10));
        // Every byte of the file is some client's, once.
        let mut all: Vec<(u64, u64)> = (0..2).flat_map(|r| t.requests(r, 2)).collect();
        all.sort_unstable();
        let mut at = 0;
        for (o, n) in all {
            assert_eq!(o, at);
            at += n;
        }
        assert_eq!(at, 48 << 20);
    }

    #[test]
    fn contents_depend_on_offset_and_seed_and_any_run_checks() {
        let mut whole = vec![0u8; 100];
        fill(&mut whole, 3, 7);
        let mut part = vec![0u8; 13];
        fill(&mut part, 3 + 41, 7);
        assert_eq!(&whole[41..54], &part[..]);
        let c = Contents::new(7, 64);
        let mut piece = vec![0u8; 40];
        c.piece(128 + 8, &mut piece);
        let mut scratch = vec![0u8; 64];
        assert_eq!(c.first_mismatch(&piece, 136, &mut scratch), None);
        // The same bytes at another offset, or under another seed, differ.
        assert!(c.first_mismatch(&piece, 200, &mut scratch).is_some());
        assert!(Contents::new(8, 64)
            .first_mismatch(&piece, 136, &mut scratch)
            .is_some());
        piece[30] ^= 1;
        assert_eq!(c.first_mismatch(&piece, 136, &mut scratch), Some(166));
    }
}
