//! The files a `web` point serves, made deterministically from a seed so
//! the server host writes them and every client can regenerate any byte to
//! verify a body without holding the files.
//!
//! - `single`: one file of the point's size (`/f0.bin`).
//! - `zipf`: `files` files whose sizes follow the SPECweb99 file set: each
//!   directory of 36 files has four classes of nine files, class `c` file
//!   `j` of `(j + 1) * 1024 * 10^c / 10` bytes (102 B to 921 B, 1 KiB to
//!   9 KiB, 10 KiB to 90 KiB, 100 KiB to 900 KiB). Popularity is Zipf over
//!   the files ranked by size, smallest first: rank `r` (from 1) is asked
//!   for with probability proportional to `1 / r^alpha`, so small files are
//!   the most popular and large ones rare.
//!
//! A file's content is a keyed stream: byte `o` of file `i` is byte `o % 8`
//! of `splitmix64(seed, i, o / 8)`.

use sha2::{Digest, Sha256};

/// Most files of a `zipf` file set: 40 SPECweb99 directories, 204 MiB.
pub(crate) const MAX_FILES: u32 = 36 * 40;

/// A generated file set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileSet {
    seed: u64,
    /// Size of each file, bytes; file `i` is served as `/f{i}.bin`.
    sizes: Vec<u64>,
}

/// SplitMix64's finalizer: a well-mixed 64-bit value from any input.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Size of file `i` of the SPECweb99-like mix, bytes.
pub(crate) fn mix_size_bytes(i: u32) -> u64 {
    let k = i % 36;
    let class = k / 9;
    let j = u64::from(k % 9);
    (j + 1) * 1024 * 10u64.pow(class) / 10
}

impl FileSet {
    /// One file of `size_bytes`.
    pub(crate) fn single(seed: u64, size_bytes: u64) -> FileSet {
        FileSet {
            seed,
            sizes: vec![size_bytes],
        }
    }

    /// `files` files of the SPECweb99-like mix.
    pub(crate) fn mix(seed: u64, files: u32) -> FileSet {
        FileSet {
            seed,
            sizes: (0..files).map(mix_size_bytes).collect(),
        }
    }

    /// Number of files.
    pub(crate) fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Size of file `i`, bytes (0 past the set).
    pub(crate) fn size_bytes(&self, i: usize) -> u64 {
        self.sizes.get(i).copied().unwrap_or(0)
    }

    /// All files together, bytes.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }

    /// The URL path of file `i`.
    pub(crate) fn url(i: usize) -> String {
        format!("/f{i}.bin")
    }

    fn word(&self, i: usize, block: u64) -> u64 {
        mix64(self.seed ^ mix64((i as u64) << 40 ^ block))
    }

    /// Fills `buf` with the content of file `i` from byte `offset`.
    pub(crate) fn fill(&self, i: usize, offset: u64, buf: &mut [u8]) {
        let mut o = offset;
        let mut rest = buf;
        while !rest.is_empty() {
            let word = self.word(i, o / 8).to_le_bytes();
            let start = (o % 8) as usize;
            let n = (8 - start).min(rest.len());
            let (head, tail) = rest.split_at_mut(n);
            head.copy_from_slice(&word[start..start + n]);
            rest = tail;
            o += n as u64;
        }
    }

    /// Whether `data` is the content of file `i` from byte `offset`.
    ///
    /// The load generator checks every body byte with this, so it must
    /// cost far less than the transfer it checks: whole words are compared
    /// as integers in runs of 64, with no branch or call per word (a byte
    /// comparison per word, through `memcmp`, held one client to about
    /// 1.3 GB/s), and only a partial word at either end byte by byte.
    pub(crate) fn matches(&self, i: usize, offset: u64, data: &[u8]) -> bool {
        let head = (offset.wrapping_neg() % 8) as usize;
        let (first, rest) = data.split_at(head.min(data.len()));
        if !self.matches_bytes(i, offset, first) {
            return false;
        }
        let mut block = (offset + first.len() as u64) / 8;
        let mut runs = rest.chunks_exact(64 * 8);
        for run in &mut runs {
            if !self.matches_words(i, block, run) {
                return false;
            }
            block += 64;
        }
        let run = runs.remainder();
        let whole = run.len() / 8 * 8;
        self.matches_words(i, block, &run[..whole])
            && self.matches_bytes(i, (block + whole as u64 / 8) * 8, &run[whole..])
    }

    /// [`FileSet::matches`] for `data` of whole words from word `block`.
    fn matches_words(&self, i: usize, block: u64, data: &[u8]) -> bool {
        let mut diff = 0u64;
        for (k, w) in data.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            diff |= u64::from_le_bytes(b) ^ self.word(i, block + k as u64);
        }
        diff == 0
    }

    /// [`FileSet::matches`] a byte at a time.
    fn matches_bytes(&self, i: usize, offset: u64, data: &[u8]) -> bool {
        data.iter().enumerate().all(|(k, &b)| {
            let o = offset + k as u64;
            self.word(i, o / 8).to_le_bytes()[(o % 8) as usize] == b
        })
    }

    /// Writes every file into `dir` (each made exclusively, relative to
    /// the directory's descriptor, readable by all) and returns the
    /// SHA-256 of the set: of each file's name and content, in order.
    pub(crate) fn write(&self, dir: &crate::confined::Dir) -> std::io::Result<String> {
        use std::io::Write;
        let mut sha = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        for (i, &size) in self.sizes.iter().enumerate() {
            let name = format!("f{i}.bin");
            let mut f = std::io::BufWriter::new(
                dir.create_file(&name, 0o644)
                    .map_err(|e| std::io::Error::other(e.to_string()))?,
            );
            sha.update(name.as_bytes());
            let mut off = 0;
            while off < size {
                let n = (size - off).min(buf.len() as u64) as usize;
                self.fill(i, off, &mut buf[..n]);
                f.write_all(&buf[..n])?;
                sha.update(&buf[..n]);
                off += n as u64;
            }
            f.flush()?;
        }
        Ok(sha.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// Zipf popularity over a file set's files ranked by size (smallest first).
#[derive(Debug, Clone)]
pub(crate) struct Zipf {
    /// Cumulative probability of each rank, rising to 1.
    cdf: Vec<f64>,
    /// The file at each rank.
    files: Vec<usize>,
}

impl Zipf {
    /// Popularity with exponent `alpha` (0: uniform) over `set`.
    pub(crate) fn new(set: &FileSet, alpha: f64) -> Zipf {
        let mut files: Vec<usize> = (0..set.len()).collect();
        files.sort_by_key(|&i| (set.size_bytes(i), i));
        let weights: Vec<f64> = (1..=files.len())
            .map(|r| 1.0 / (r as f64).powf(alpha))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        Zipf { cdf, files }
    }

    /// The file asked for when the uniform draw is `u` in `[0, 1)`.
    pub(crate) fn pick(&self, u: f64) -> usize {
        let r = self.cdf.partition_point(|&c| c <= u);
        let r = r.min(self.files.len().saturating_sub(1));
        self.files.get(r).copied().unwrap_or(0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn the_mix_follows_the_specweb99_classes() {
        assert_eq!(mix_size_bytes(0), 102);
        assert_eq!(mix_size_bytes(8), 921);
        assert_eq!(mix_size_bytes(9), 1024);
        assert_eq!(mix_size_bytes(26), 92160);
        assert_eq!(mix_size_bytes(35), 921600);
        assert_eq!(mix_size_bytes(36), 102);
    }

    #[test]
    fn content_is_reproducible_and_checked_at_any_offset() {
        let set = FileSet::mix(7, 36);
        let mut a = vec![0u8; 1000];
        set.fill(20, 13, &mut a);
        assert!(set.matches(20, 13, &a));
        assert!(set.matches(20, 500, &a[487..]));
        a[3] ^= 1;
        assert!(!set.matches(20, 13, &a));
        let other = FileSet::mix(8, 36);
        let mut b = vec![0u8; 64];
        other.fill(20, 0, &mut b);
        assert!(!set.matches(20, 0, &b));
    }

    /// Every start offset within a word, lengths around the word runs, and
    /// one flipped bit at every position of the piece: the word path and
    /// the byte path agree with the content.
    #[test]
    fn a_flipped_bit_anywhere_is_found_at_every_alignment_and_length() {
        let set = FileSet::mix(5, 36);
        let mut a = vec![0u8; 2 * 64 * 8 + 40];
        set.fill(35, 0, &mut a);
        for start in 0..17usize {
            for len in [0, 1, 7, 8, 9, 63, 511, 512, 513, 1031, a.len() - start] {
                let piece = &a[start..start + len];
                assert!(set.matches(35, start as u64, piece), "{start} {len}");
                let mut bad = piece.to_vec();
                for k in 0..len {
                    bad[k] ^= 0x10;
                    assert!(!set.matches(35, start as u64, &bad), "{start} {len} {k}");
                    bad[k] ^= 0x10;
                }
            }
        }
    }

    #[test]
    fn zipf_prefers_small_files_and_covers_the_set() {
        let set = FileSet::mix(1, 36);
        let z = Zipf::new(&set, 1.0);
        assert_eq!(set.size_bytes(z.pick(0.0)), 102);
        assert_eq!(set.size_bytes(z.pick(0.999_999)), 921_600);
        // Uniform: an even grid of draws picks every file about equally.
        let u = Zipf::new(&set, 0.0);
        let mut count = [0u32; 36];
        for k in 0..3600 {
            count[u.pick((f64::from(k) + 0.5) / 3600.0)] += 1;
        }
        assert!(count.iter().all(|&c| (99..=101).contains(&c)), "{count:?}");
        // alpha 1: the smallest file is asked for most, the largest least.
        let mut count = [0u32; 36];
        for k in 0..36_000 {
            count[z.pick((f64::from(k) + 0.5) / 36_000.0)] += 1;
        }
        assert!(count[0] > count[9] && count[9] > count[35], "{count:?}");
    }

    #[test]
    fn written_files_match_the_content_and_the_checksum_is_stable() {
        let t = tempfile::tempdir().unwrap();
        let d = crate::confined::Dir::open_operator(t.path()).unwrap();
        let set = FileSet::mix(3, 12);
        let sum = set.write(&d).unwrap();
        let body = std::fs::read(t.path().join("f10.bin")).unwrap();
        assert_eq!(body.len() as u64, set.size_bytes(10));
        assert!(set.matches(10, 0, &body));
        let t2 = tempfile::tempdir().unwrap();
        let d2 = crate::confined::Dir::open_operator(t2.path()).unwrap();
        assert_eq!(set.write(&d2).unwrap(), sum);
        // Files are made exclusively: a second write into the same
        // directory fails rather than overwrite.
        assert!(set.write(&d).is_err());
    }
}
