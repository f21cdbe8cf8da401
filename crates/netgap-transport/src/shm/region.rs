//! The shared region of one `shm` flow: a sealed memfd holding a
//! `netgap_shm` region (its layout, rings and checks; see that crate's
//! docs), which the listener makes before any peer comes and hands to the
//! connector over the rendezvous socket.
//!
//! The listener creates, sizes and seals the memfd (`F_SEAL_SHRINK`, so the
//! peer can never truncate it under our mapping and turn an access into
//! `SIGBUS`) and writes the header; the connector maps it only through
//! [`Region::open`], which checks the seals, the file size, every header
//! field and the rings' indices before trusting any offset.
//!
//! The flow's mode is the region's wait rule, recorded in the header so
//! both ends agree: event mode sleeps on the rings' waiter words
//! ([`Waits::Sleep`]), poll mode never does ([`Waits::Spin`]).

use netgap_core::spec::Mode;
use netgap_shm::layout::valid_capacity;
use netgap_shm::{region_bytes, Expect, Region, Waits};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// The wait rule of a flow's mode.
pub(crate) fn waits(mode: Mode) -> Waits {
    match mode {
        Mode::Event => Waits::Sleep,
        Mode::Poll => Waits::Spin,
    }
}

fn errno_context(e: nix::errno::Errno, what: &str) -> io::Error {
    let io = io::Error::from(e);
    io::Error::new(io.kind(), format!("{what}: {io}"))
}

fn invalid(e: netgap_shm::RegionError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Creates a sealed memfd holding two rings of `capacity` bytes (a power
/// of two within 4 KiB..=1 GiB), maps it (every page at once: no fault
/// lands in a measurement) and writes the header for `mode`. Returns the
/// region and the descriptor to pass to the peer.
pub(crate) fn create(capacity: usize, mode: Mode) -> io::Result<(Region, OwnedFd)> {
    if !valid_capacity(capacity as u64) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("shm ring capacity {capacity} B is not a power of two in 4 KiB..=1 GiB"),
        ));
    }
    let fd = memfd_create(
        c"netgap-shm",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(|e| errno_context(e, "memfd_create"))?;
    let total = region_bytes(capacity);
    let len = libc::off_t::try_from(total).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("shm region of {total} B is too large"),
        )
    })?;
    nix::unistd::ftruncate(&fd, len).map_err(|e| errno_context(e, "ftruncate of the memfd"))?;
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|e| errno_context(e, "sealing the memfd (F_ADD_SEALS)"))?;
    let region = Region::create(fd.as_raw_fd(), capacity, waits(mode), true).map_err(invalid)?;
    Ok((region, fd))
}

/// Maps the region in `fd`, received from the listener, once
/// [`Region::open`] found it a sealed memfd whose size and header describe
/// a region of this layout, made for `mode`. The descriptor goes; the
/// mapping stays.
pub(crate) fn open(fd: OwnedFd, mode: Mode) -> io::Result<Region> {
    let expect = Expect {
        capacity: None,
        waits: waits(mode),
    };
    Region::open(fd.as_raw_fd(), &expect, true).map_err(invalid)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use netgap_shm::RingId;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_region_opens_in_a_second_mapping() {
        let (region, fd) = create(8192, Mode::Poll).unwrap();
        let peer = open(fd, Mode::Poll).unwrap();
        assert_eq!(peer.capacity(), 8192);
        // Both mappings see the same rings.
        region
            .ctl(RingId::ToListener)
            .head
            .0
            .store(42, Ordering::Release);
        let seen = peer.ctl(RingId::ToListener).head.0.load(Ordering::Acquire);
        assert_eq!(seen, 42);
    }

    #[test]
    fn bad_capacities_are_refused() {
        for cap in [0, 100, 2048, 3 * 4096, 2 << 30] {
            assert!(create(cap, Mode::Event).is_err(), "{cap}");
        }
    }

    #[test]
    fn both_ends_must_wait_alike() {
        for (made, wanted) in [(Mode::Event, Mode::Poll), (Mode::Poll, Mode::Event)] {
            let (_region, fd) = create(4096, made).unwrap();
            let e = open(fd, wanted).map(drop).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("wait by"), "{e}");
        }
    }
}
