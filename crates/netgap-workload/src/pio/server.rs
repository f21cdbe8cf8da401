//! The I/O server of `pio`: keeps its stripes of the logical file in a
//! real file on its host and serves every client's requests over its own
//! flow, one thread per client. The page cache is taken out of the
//! measurement where the file system lets it: `O_DIRECT` for aligned
//! requests where the file system takes it, else (and always at the
//! barrier between writes and reads) `fdatasync` and
//! `posix_fadvise(DONTNEED)`; on tmpfs the file *is* the page cache, which
//! is recorded. The server reads the edges of its phases ([`Phases`]) where
//! its clients' requests mark them: the writes begin when the first barrier
//! opens and end when the last client reaches the second (before the
//! flush), the reads begin when the second opens and end at the last
//! client's done.

use super::wire::{self, Header};
use super::{Phase, PioError};
use crate::confined::{relative_components, ConfinedError, Dir, STRIPE_PREFIX};
use crate::role::{Stop, WindowEdge};
use crate::staged::recv_patient;
use netgap_transport::buffer::{AlignedBuffer, BufferLayout};
use netgap_transport::{self as transport, FlowError};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Alignment `O_DIRECT` asks of offsets, lengths and buffers here.
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// How the server keeps the page cache out of its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheUse {
    /// Aligned requests bypass the cache (`O_DIRECT`); the rest is flushed
    /// and dropped at the barrier.
    Direct,
    /// The file system refuses `O_DIRECT`: flushed and dropped at the
    /// barrier.
    Flush,
    /// tmpfs: the file lives in memory; nothing to bypass or drop.
    Memory,
    /// `--cache keep`: the cache stays.
    Kept,
}

/// The file that holds this server's stripes, and what removes it.
pub(crate) struct ServerFile {
    /// The file, buffered.
    file: File,
    /// The same file opened with `O_DIRECT`, when the file system allows.
    direct: Option<File>,
    /// What was done about the page cache.
    pub cache: CacheUse,
    /// The file's name in the last of `dirs` (or in `io`), removed on drop.
    name: String,
    /// The subdirectories below `io` down to the file's, each opened
    /// relative to the one above without following a link; those this
    /// server made go when dropped.
    dirs: Vec<Dir>,
    /// The agent's I/O directory.
    io: Arc<Dir>,
    /// The file's path, for messages.
    pub path: PathBuf,
}

/// Most components of a `--dir` subdirectory.
pub(crate) const MAX_DIR_DEPTH: usize = 8;

/// Bytes a file system keeps free after the stripes are reserved: 5% of
/// its size, at most 1 GiB.
pub(crate) fn margin_bytes(total_bytes: u64) -> u64 {
    (total_bytes / 20).min(1 << 30)
}

/// `bytes` in binary units, for a message (`64 GiB`, `28 KiB`).
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() < 0.05 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Opens (making it 0700 when missing) the subdirectory `sub` below `io`,
/// component by component, without following a link.
fn open_below(io: &Dir, sub: &str) -> Result<Vec<Dir>, PioError> {
    let parts =
        relative_components(sub, MAX_DIR_DEPTH).map_err(|e| PioError(format!("--dir: {e}")))?;
    let mut dirs: Vec<Dir> = Vec::with_capacity(parts.len());
    for part in parts {
        let parent = dirs.last().unwrap_or(io);
        let missing = |e: &ConfinedError| matches!(e, ConfinedError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
        let d = match parent.open_subdir(part) {
            Ok(d) => d,
            Err(e) if missing(&e) => match parent.fresh_subdir(part, 0o700) {
                Ok(d) => Ok(d),
                // Made meanwhile by another server of this host.
                Err(_) => parent.open_subdir(part),
            }
            .map_err(|e| PioError(format!("--dir {sub}: {e}")))?,
            Err(e) => return Err(PioError(format!("--dir {sub}: {e}"))),
        };
        dirs.push(d);
    }
    Ok(dirs)
}

impl ServerFile {
    /// Creates server `index`'s file of `bytes` bytes in the agent's I/O
    /// directory `io` or its subdirectory `sub` (relative; refused when
    /// absolute, with `..`, or through a link), named
    /// `netgap-pio-<agentpid>-<n>` and made exclusively; checks the file
    /// system has room for it beside a margin ([`margin_bytes`]) and
    /// reserves it (`fallocate`), so a full disk fails here and not in the
    /// timed part; opens it for direct I/O when `bypass` and the file
    /// system allows. Only what it made is removed when dropped.
    pub(crate) fn create(
        io: Arc<Dir>,
        sub: Option<&str>,
        index: usize,
        bypass: bool,
        bytes: u64,
    ) -> Result<ServerFile, PioError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dirs = match sub {
            Some(sub) => open_below(&io, sub)?,
            None => Vec::new(),
        };
        let holder = dirs.last().unwrap_or(&io);
        let (free, total) = holder.space_bytes().map_err(|e| PioError(e.to_string()))?;
        let margin = margin_bytes(total);
        if bytes.saturating_add(margin) > free {
            return Err(PioError(format!(
                "pio needs {} of stripes in {} but its file system has {} free (and {} is kept free)",
                human_bytes(bytes),
                holder.path().display(),
                human_bytes(free),
                human_bytes(margin)
            )));
        }
        let name = format!(
            "{STRIPE_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = holder.path().join(&name);
        let file = holder
            .create_file(&name, 0o600)
            .map_err(|e| PioError(format!("server {index}: {e}")))?;
        let on_tmpfs = holder.on_tmpfs();
        let mut made = ServerFile {
            file,
            direct: None,
            cache: CacheUse::Kept,
            name,
            dirs,
            io,
            path,
        };
        if bytes > 0 {
            match rustix::fs::fallocate(&made.file, rustix::fs::FallocateFlags::empty(), 0, bytes) {
                Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) => {}
                Err(e) => {
                    return Err(PioError(format!(
                        "pio could not reserve {} of stripes in {}: {}",
                        human_bytes(bytes),
                        made.path.display(),
                        std::io::Error::from(e)
                    )))
                }
            }
        }
        let (direct, cache) = if !bypass {
            (None, CacheUse::Kept)
        } else if on_tmpfs {
            (None, CacheUse::Memory)
        } else {
            // The same file again through its descriptor's link in /proc,
            // never by its path.
            use std::os::fd::AsRawFd;
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(format!("/proc/self/fd/{}", made.file.as_raw_fd()))
            {
                Ok(f) => (Some(f), CacheUse::Direct),
                Err(_) => (None, CacheUse::Flush),
            }
        };
        made.direct = direct;
        made.cache = cache;
        Ok(made)
    }

    /// The file handle for a request at `offset` of `len` bytes from a
    /// buffer at `ptr`: the direct one when everything is aligned.
    fn handle(&self, offset: u64, len: usize, ptr: *const u8) -> &File {
        let aligned = offset.is_multiple_of(DIRECT_ALIGN as u64)
            && len.is_multiple_of(DIRECT_ALIGN)
            && (ptr as usize).is_multiple_of(DIRECT_ALIGN);
        match &self.direct {
            Some(d) if aligned => d,
            _ => &self.file,
        }
    }

    /// Makes the file durable and, unless the cache is kept or the file
    /// lives in memory, drops its pages so reads come from the disk.
    fn flush(&self) -> std::io::Result<()> {
        if matches!(self.cache, CacheUse::Kept | CacheUse::Memory) {
            return Ok(());
        }
        self.file.sync_data()?;
        use std::os::fd::AsRawFd;
        nix::fcntl::posix_fadvise(
            self.file.as_raw_fd(),
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .map_err(std::io::Error::from)
    }
}

impl Drop for ServerFile {
    fn drop(&mut self) {
        let holder = self.dirs.last().unwrap_or(&self.io);
        let _ = holder.remove_file(&self.name);
        // The deepest directory first: one this server made goes (with
        // anything left in it), one it found stays.
        while let Some(d) = self.dirs.pop() {
            drop(d);
        }
    }
}

/// What the server's threads share.
pub(crate) struct Shared {
    /// The stripes' file.
    pub file: ServerFile,
    /// Largest request, bytes (a stripe unit).
    pub stripe_bytes: u64,
    /// Size the local file may reach.
    pub limit_bytes: u64,
    /// Clients that must arrive at a barrier.
    pub clients: usize,
    /// Where each flow's request buffer starts (`--align`, `--offset`; a
    /// page by default, which direct I/O needs too: a buffer off the page
    /// is served through the page cache).
    pub buffer: BufferLayout,
    /// Time in writes, ns.
    pub write_ns: AtomicU64,
    /// Time in reads, ns.
    pub read_ns: AtomicU64,
    /// Time flushing, ns.
    pub flush_ns: AtomicU64,
    barriers: Mutex<Barriers>,
    released: Condvar,
}

#[derive(Default)]
struct Barriers {
    /// Arrivals at barriers 0 and 1.
    arrived: [usize; 2],
    /// Whether each barrier has let its clients go.
    open: [bool; 2],
    /// A client's flow failed: nobody waits any more.
    failed: bool,
    /// Clients that said they are done.
    done: usize,
    /// The edges read so far.
    edges: PhaseEdges,
}

#[derive(Default)]
struct PhaseEdges {
    opened: [Option<WindowEdge>; 2],
    writes_done: Option<WindowEdge>,
    reads_done: Option<WindowEdge>,
}

/// The edges of a server's two phases, each from its start to its end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phases {
    /// From the first barrier's opening to the last client at the second.
    pub write: Phase,
    /// From the second barrier's opening to the last client's done.
    pub read: Phase,
}

impl Shared {
    /// State for a server of `clients` clients.
    pub(crate) fn new(
        file: ServerFile,
        stripe_bytes: u64,
        limit_bytes: u64,
        clients: usize,
        buffer: BufferLayout,
    ) -> Shared {
        Shared {
            file,
            stripe_bytes,
            limit_bytes,
            clients,
            buffer,
            write_ns: AtomicU64::new(0),
            read_ns: AtomicU64::new(0),
            flush_ns: AtomicU64::new(0),
            barriers: Mutex::new(Barriers::default()),
            released: Condvar::new(),
        }
    }

    /// Wakes every waiting thread for good: a flow failed.
    pub(crate) fn fail(&self) {
        if let Ok(mut b) = self.barriers.lock() {
            b.failed = true;
        }
        self.released.notify_all();
    }

    /// Arrives at barrier `n`; the last client in flushes the file after
    /// the writes (barrier 1) and lets everyone go.
    fn barrier(&self, n: usize, deadline: Instant, stop: &Stop) -> Result<(), PioError> {
        let poisoned = || PioError("a barrier's lock was poisoned".into());
        let mut b = self.barriers.lock().map_err(|_| poisoned())?;
        b.arrived[n] += 1;
        if b.arrived[n] == self.clients {
            if n == 1 {
                // The writes end here; the flush is neither phase's.
                b.edges.writes_done = Some(WindowEdge::now());
                let t0 = Instant::now();
                self.file
                    .flush()
                    .map_err(|e| PioError(format!("flushing {}: {e}", self.file.path.display())))?;
                self.flush_ns
                    .fetch_add(netgap_core::units::ns_since(t0), Ordering::Relaxed);
            }
            b.open[n] = true;
            b.edges.opened[n] = Some(WindowEdge::now());
            self.released.notify_all();
            return Ok(());
        }
        while !b.open[n] {
            if b.failed || stop.is_set() {
                return Err(PioError("another client's flow failed".into()));
            }
            if Instant::now() >= deadline {
                return Err(PioError(
                    "clients did not all reach the barrier within the window; lengthen --duration"
                        .into(),
                ));
            }
            b = self
                .released
                .wait_timeout(b, crate::role::STOP_TICK)
                .map_err(|_| poisoned())?
                .0;
        }
        Ok(())
    }

    /// Counts a client done; the last one ends the reads.
    fn done(&self) -> Result<(), PioError> {
        let mut b = self
            .barriers
            .lock()
            .map_err(|_| PioError("a barrier's lock was poisoned".into()))?;
        b.done += 1;
        if b.done == self.clients {
            b.edges.reads_done = Some(WindowEdge::now());
        }
        Ok(())
    }

    /// The edges of both phases, once every client is done; `None` before.
    pub(crate) fn phases(&self) -> Option<Phases> {
        let b = self.barriers.lock().ok()?;
        let e = &b.edges;
        Some(Phases {
            write: (e.opened[0]?, e.writes_done?),
            read: (e.opened[1]?, e.reads_done?),
        })
    }
}

/// What one client's flow moved at this server.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Served {
    /// Bytes the client wrote here.
    pub written: u64,
    /// Bytes the client read from here.
    pub read: u64,
    /// Requests served.
    pub requests: u64,
}

fn flow_err(e: FlowError) -> PioError {
    PioError(e.to_string())
}

/// Serves one client's flow until it says it is done.
pub(crate) fn serve(
    flow: &mut dyn transport::Flow,
    shared: &Shared,
    deadline: Instant,
    stop: &Stop,
) -> Result<Served, PioError> {
    let (tx, rx) = flow.split();
    let stripe = usize::try_from(shared.stripe_bytes).unwrap_or(usize::MAX);
    let mut buf = AlignedBuffer::zeroed(stripe, shared.buffer);
    let mut served = Served::default();
    let mut next_barrier = 0u64;
    loop {
        if stop.is_set() {
            return Err(PioError("stopped".into()));
        }
        let mut hb = [0u8; wire::HEADER_BYTES];
        recv_patient(rx, &mut hb, deadline, stop).map_err(flow_err)?;
        let h = Header::decode(&hb);
        served.requests += 1;
        let len = h.len as usize;
        let in_file = || {
            if h.len == 0
                || u64::from(h.len) > shared.stripe_bytes
                || h.offset.saturating_add(u64::from(h.len)) > shared.limit_bytes
            {
                return Err(PioError(format!(
                    "a request of {} bytes at {} is outside this server's {} bytes (stripes of {})",
                    h.len, h.offset, shared.limit_bytes, shared.stripe_bytes
                )));
            }
            Ok(())
        };
        match h.op {
            wire::OP_BARRIER => {
                if h.offset != next_barrier || next_barrier > 1 {
                    return Err(PioError(format!(
                        "barrier {} out of order (expected {next_barrier})",
                        h.offset
                    )));
                }
                shared.barrier(next_barrier as usize, deadline, stop)?;
                next_barrier += 1;
                tx.send_all(&[wire::STATUS_OK]).map_err(flow_err)?;
            }
            wire::OP_WRITE => {
                in_file()?;
                let data = &mut buf[..len.min(stripe)];
                rx.recv_exact(data).map_err(flow_err)?;
                let t0 = Instant::now();
                let f = shared.file.handle(h.offset, len, data.as_ptr());
                let r = f.write_all_at(data, h.offset);
                shared
                    .write_ns
                    .fetch_add(netgap_core::units::ns_since(t0), Ordering::Relaxed);
                if let Err(e) = r {
                    let _ = tx.send_all(&[wire::STATUS_FAILED]);
                    return Err(PioError(format!(
                        "writing {}: {e}",
                        shared.file.path.display()
                    )));
                }
                served.written += u64::from(h.len);
                tx.send_all(&[wire::STATUS_OK]).map_err(flow_err)?;
            }
            wire::OP_READ => {
                in_file()?;
                let data = &mut buf[..len.min(stripe)];
                let t0 = Instant::now();
                let f = shared.file.handle(h.offset, len, data.as_ptr());
                let r = f.read_exact_at(data, h.offset);
                shared
                    .read_ns
                    .fetch_add(netgap_core::units::ns_since(t0), Ordering::Relaxed);
                if let Err(e) = r {
                    return Err(PioError(format!(
                        "reading {}: {e}",
                        shared.file.path.display()
                    )));
                }
                tx.send_all(data).map_err(flow_err)?;
                served.read += u64::from(h.len);
            }
            wire::OP_SYNC => {
                let t0 = Instant::now();
                let r = if matches!(shared.file.cache, CacheUse::Memory | CacheUse::Kept) {
                    Ok(())
                } else {
                    shared.file.file.sync_data()
                };
                shared
                    .flush_ns
                    .fetch_add(netgap_core::units::ns_since(t0), Ordering::Relaxed);
                if let Err(e) = r {
                    let _ = tx.send_all(&[wire::STATUS_FAILED]);
                    return Err(PioError(format!(
                        "syncing {}: {e}",
                        shared.file.path.display()
                    )));
                }
                tx.send_all(&[wire::STATUS_OK]).map_err(flow_err)?;
            }
            wire::OP_DONE => {
                shared.done()?;
                return Ok(served);
            }
            op => return Err(PioError(format!("unknown request {op}"))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What a server of one client says to `requests` (raw bytes).
    fn serve_raw(requests: &[u8]) -> Result<Served, PioError> {
        serve_phases(requests).0
    }

    /// What a server of one client says to `requests`, and the edges of
    /// its phases then.
    fn serve_phases(requests: &[u8]) -> (Result<Served, PioError>, Option<Phases>) {
        let dir = tempfile::tempdir().unwrap();
        let io = Arc::new(Dir::open_operator(dir.path()).unwrap());
        let file = ServerFile::create(io, None, 0, false, 16384).unwrap();
        let shared = Shared::new(file, 4096, 16384, 1, BufferLayout::default());
        let (mut server, mut peer) = crate::staged::flow_pair();
        peer.send_all(requests).unwrap();
        let stop = Stop::new();
        let r = serve(
            server.as_mut(),
            &shared,
            Instant::now() + Duration::from_secs(2),
            &stop,
        );
        let phases = shared.phases();
        drop(shared);
        // Only the file's own name was ever in the directory; it is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        (r, phases)
    }

    #[test]
    fn stripes_go_only_below_the_io_directory_and_what_was_made_goes_after() {
        let t = tempfile::tempdir().unwrap();
        let io = Arc::new(Dir::open_operator(t.path()).unwrap());
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("link")).unwrap();
        for (sub, says) in [
            ("/etc", "absolute path"),
            ("../x", "\"..\""),
            ("a/../../x", "\"..\""),
            ("link", "symbolic link"),
            ("link/deeper", "symbolic link"),
        ] {
            let e = ServerFile::create(Arc::clone(&io), Some(sub), 0, false, 4096)
                .err()
                .unwrap()
                .0;
            assert!(e.contains(says) && e.contains("--dir"), "{sub}: {e}");
            assert_eq!(e.lines().count(), 1);
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // A fresh subdirectory is made, used and removed; an existing one
        // stays.
        std::fs::create_dir(t.path().join("kept")).unwrap();
        let f = ServerFile::create(Arc::clone(&io), Some("kept/new/er"), 0, true, 8192).unwrap();
        assert!(f.path.starts_with(t.path().join("kept/new/er")));
        let name = f.path.file_name().unwrap().to_str().unwrap().to_string();
        assert!(
            name.starts_with(&format!("netgap-pio-{}-", std::process::id())),
            "{name}"
        );
        assert_eq!(std::fs::metadata(&f.path).unwrap().len(), 8192, "reserved");
        drop(f);
        assert!(t.path().join("kept").is_dir());
        assert!(!t.path().join("kept/new").exists());
        // Too large for its file system: refused before anything is made.
        let e = ServerFile::create(Arc::clone(&io), None, 0, false, u64::MAX / 2)
            .err()
            .unwrap()
            .0;
        assert!(
            e.starts_with("pio needs 4096.0 TiB") || e.contains("of stripes in"),
            "{e}"
        );
        assert!(e.contains("free"), "{e}");
        let left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_bytes(64 << 30), "64 GiB");
        assert_eq!(human_bytes(28 << 10), "28 KiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(margin_bytes(1 << 20), 52428);
        assert_eq!(margin_bytes(1 << 40), 1 << 30);
    }

    fn header(op: u8, len: u32, offset: u64) -> Vec<u8> {
        Header { op, len, offset }.encode().to_vec()
    }

    #[test]
    fn requests_outside_the_file_or_out_of_order_end_the_flow_with_one_line() {
        // Past the local file's end.
        let e = serve_raw(&header(wire::OP_READ, 4096, 16384)).unwrap_err();
        assert!(e.0.contains("outside this server's"), "{e}");
        // Larger than a stripe.
        let e = serve_raw(&header(wire::OP_WRITE, 8192, 0)).unwrap_err();
        assert!(e.0.contains("outside"), "{e}");
        // A second barrier before the first.
        let e = serve_raw(&header(wire::OP_BARRIER, 0, 1)).unwrap_err();
        assert!(e.0.contains("out of order"), "{e}");
        let e = serve_raw(&header(9, 0, 0)).unwrap_err();
        assert!(e.0.contains("unknown request 9"), "{e}");
        // A write, a read of it and done are served.
        let mut ok = header(wire::OP_BARRIER, 0, 0);
        ok.extend(header(wire::OP_WRITE, 4, 8));
        ok.extend([1, 2, 3, 4]);
        ok.extend(header(wire::OP_SYNC, 0, 0));
        ok.extend(header(wire::OP_BARRIER, 0, 1));
        ok.extend(header(wire::OP_READ, 4, 8));
        ok.extend(header(wire::OP_DONE, 0, 0));
        let (s, phases) = serve_phases(&ok);
        let s = s.unwrap();
        assert_eq!((s.written, s.read, s.requests), (4, 4, 6));
        // The phases follow each other, as the requests marked them.
        let p = phases.unwrap();
        let at = [p.write.0, p.write.1, p.read.0, p.read.1].map(|e| e.at());
        assert!(at.windows(2).all(|w| w[0] <= w[1]), "{at:?}");
        // A client done before the barriers leaves no phases to report.
        let (s, phases) = serve_phases(&header(wire::OP_DONE, 0, 0));
        assert_eq!(s.unwrap().requests, 1);
        assert!(phases.is_none());
    }
}
