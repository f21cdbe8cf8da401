//! The relay's end of a program's region (`netgap_shm`): the ring it
//! reads the program's output from, the one it writes the program's input
//! to, and how the program waiting for those bytes is woken.

use netgap_shm::layout::END_FIN;
use netgap_shm::wait as shm_wait;
use netgap_shm::{Consumer, Expect, Producer, Region, Role, Waits};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use thiserror::Error;

/// Why a request's region is not mapped.
#[derive(Debug, Error)]
pub(crate) enum MapError {
    /// Not a memfd sealed against shrinking and growing, of the size the
    /// rings need.
    #[error("the region is not a sealed memfd of the announced size")]
    NotSealed,
    /// The region's header is not one of this layout.
    #[error(transparent)]
    Region(#[from] netgap_shm::RegionError),
}

/// The program broke the ring's invariants.
pub(crate) struct Corrupt;

/// Bytes moved and how the program waiting for them is woken.
pub(crate) struct Moved {
    pub(crate) bytes: usize,
    /// By a doorbell on the TCP connection, which the other relay
    /// sends.
    pub(crate) wake_peer: bool,
    /// By a byte on its socket to this relay.
    pub(crate) wake_here: bool,
}

/// The relay's end of a library's region (`netgap_shm`'s layout and
/// ring): as the region's listener, the relay consumes ring 0 (the
/// program's output) and produces ring 1 (its input). The region's
/// header holds how each end ended its sending side: the program's
/// shutdown, and this end's mark once the other program's end came.
pub(crate) struct FarEnd {
    pub(crate) rx: Consumer,
    pub(crate) tx: Producer,
    region: Region,
}

/// Bytes moved and the waiters `taken` after the move: a waiter in
/// poll or epoll is woken by a doorbell on the TCP connection (as the
/// library's channel does), one whose epoll watches its relay socket
/// by a byte on the client socket; `netgap_shm` already woke the
/// blocking sleepers.
pub(crate) fn moved(bytes: usize, taken: Option<u32>) -> Moved {
    let bits = taken.unwrap_or(0);
    Moved {
        bytes,
        wake_peer: bits & shm_wait::WAIT_FD != 0,
        wake_here: bits & shm_wait::WAIT_BELL != 0,
    }
}

impl FarEnd {
    /// Checks the region (a memfd sealed against shrinking and
    /// growing, of exactly the size its rings need, with a header of
    /// this layout for rings of `capacity`) and maps it.
    pub(crate) fn map(fd: RawFd, capacity: usize) -> Result<FarEnd, MapError> {
        let len = netgap_shm::region_bytes(capacity);
        // SAFETY: all-zero bytes are a valid stat; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is valid for writes.
        let r = unsafe { libc::fstat(fd, &mut st) };
        // SAFETY: a plain fcntl on our descriptor.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        let sealed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if r != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
            || st.st_size != len as libc::off_t
            || seals < 0
            || seals & sealed != sealed
        {
            return Err(MapError::NotSealed);
        }
        let expect = Expect {
            capacity: Some(capacity),
            waits: Waits::Sleep,
        };
        let region = Region::open(fd, &expect, false)?;
        let (tx, rx) = region.ends(Role::Listener);
        Ok(FarEnd { rx, tx, region })
    }

    /// Whether the program shut down its sending side (the library's
    /// mark, made after it published its last bytes: a read of the
    /// ring after this says true sees them all). Only a shutdown marks
    /// it on a relayed connection; its close is its socket's hang-up.
    pub(crate) fn program_shut_down(&self) -> bool {
        self.region.header().ends[Role::Connector.index()].load(Ordering::SeqCst) & END_FIN != 0
    }

    /// The other program's sending side ended: marked for the library
    /// once every byte before the end is in the program's ring, so a
    /// reader that sees the mark and then an empty ring is at the end
    /// of the stream.
    pub(crate) fn mark_end(&self) {
        self.region.header().ends[Role::Listener.index()].fetch_or(END_FIN, Ordering::SeqCst);
    }

    pub(crate) fn readable(&self) -> Result<usize, Corrupt> {
        self.rx.available().map(|n| n as usize).map_err(|_| Corrupt)
    }

    /// Copies up to `buf.len()` bytes of the program's output out.
    pub(crate) fn read(&self, buf: &mut [u8]) -> Result<Moved, Corrupt> {
        let n = self.rx.try_read(buf, usize::MAX).map_err(|_| Corrupt)?;
        if n == 0 {
            return Ok(moved(0, None));
        }
        Ok(moved(n, self.rx.take_peer_waiters(|| ())))
    }

    /// Copies as much of `data` as fits into the program's input.
    pub(crate) fn write(&self, data: &[u8]) -> Result<Moved, Corrupt> {
        let n = self.tx.try_write(data, usize::MAX).map_err(|_| Corrupt)?;
        if n == 0 {
            return Ok(moved(0, None));
        }
        Ok(moved(n, self.tx.take_peer_waiters(|| ())))
    }

    /// Announces a wait for the program's output (the program's
    /// doorbell comes on the client socket).
    pub(crate) fn want_data(&self) {
        self.rx.arm(shm_wait::WAIT_FD);
    }

    /// The far side ended or the connection broke: the closing hint on
    /// the program's input ring, and its blocking sleepers woken, so
    /// they look at the TCP socket (for its end or reset) at once
    /// instead of after their sleep's time limit.
    pub(crate) fn closing(&self) {
        self.tx.hint_closing();
        self.tx.wake_peer_sleepers();
        self.rx.wake_peer_sleepers();
    }
}
