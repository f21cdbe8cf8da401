//! The offloads of a network interface read and switched with the
//! `SIOCETHTOOL` ioctl, what `ethtool -k` and `ethtool -K` do, so nothing
//! needs `ethtool` installed. The host facts read them for the record; the
//! testbed switches them on its links (from a thread inside each of its
//! namespaces: the ioctl acts on the calling thread's namespace).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `SIOCETHTOOL`, the ioctl behind `ethtool`.
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// One offload an interface may have on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Offload {
    /// Transmit checksum offload (`tx-checksumming`).
    TxChecksum,
    /// Receive checksum offload (`rx-checksumming`).
    RxChecksum,
    /// TCP segmentation offload (`tcp-segmentation-offload`).
    Tso,
    /// Generic segmentation offload (`generic-segmentation-offload`).
    Gso,
    /// Generic receive offload (`generic-receive-offload`).
    Gro,
}

impl Offload {
    /// Every offload, in the order to switch them on: TSO needs transmit
    /// checksums, so those come first; off goes the other way round.
    pub const ON_ORDER: [Offload; 5] = [
        Offload::TxChecksum,
        Offload::RxChecksum,
        Offload::Tso,
        Offload::Gso,
        Offload::Gro,
    ];

    /// Its name as `ethtool -k` shows it.
    pub fn name(self) -> &'static str {
        match self {
            Offload::TxChecksum => "tx-checksumming",
            Offload::RxChecksum => "rx-checksumming",
            Offload::Tso => "tcp-segmentation-offload",
            Offload::Gso => "generic-segmentation-offload",
            Offload::Gro => "generic-receive-offload",
        }
    }

    /// The legacy commands that read and set it (`ETHTOOL_G*`,
    /// `ETHTOOL_S*`): every kernel netgap runs on answers them, also for
    /// veth, bridge and loopback devices.
    fn commands(self) -> (u32, u32) {
        match self {
            Offload::TxChecksum => (0x16, 0x17),
            Offload::RxChecksum => (0x14, 0x15),
            Offload::Tso => (0x1e, 0x1f),
            Offload::Gso => (0x23, 0x24),
            Offload::Gro => (0x2b, 0x2c),
        }
    }
}

/// `struct ethtool_value`: a command and its one value.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with its union used as `ifr_data`, padded to the
/// kernel's size (a 16-byte name and a 24-byte union on 64-bit Linux).
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

/// The socket the ethtool ioctls go through, in the network namespace of
/// the thread that opened it; it asks about that namespace's interfaces.
#[derive(Debug)]
pub struct EthtoolSocket {
    sock: OwnedFd,
}

impl EthtoolSocket {
    /// Opens the socket in the calling thread's network namespace.
    pub fn open() -> io::Result<EthtoolSocket> {
        // SAFETY: socket has no memory preconditions; the descriptor is
        // owned (and closed) by the OwnedFd below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EthtoolSocket { sock })
    }

    /// Whether `offload` is on on interface `dev`. An empty name or one of
    /// `IFNAMSIZ` bytes or more is `InvalidInput`.
    pub fn get(&self, dev: &str, offload: Offload) -> io::Result<bool> {
        let (get, _) = offload.commands();
        self.value_command(dev, get, 0).map(|v| v != 0)
    }

    /// Switches `offload` on or off on interface `dev`; the driver may
    /// leave it as it was without an error, so a caller that must know
    /// reads it back with [`EthtoolSocket::get`].
    pub fn set(&self, dev: &str, offload: Offload, on: bool) -> io::Result<()> {
        let (_, set) = offload.commands();
        self.value_command(dev, set, u32::from(on)).map(|_| ())
    }

    /// One ethtool value command on interface `dev`: the value the kernel
    /// leaves in it.
    fn value_command(&self, dev: &str, cmd: u32, data: u32) -> io::Result<u32> {
        let bytes = dev.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut value = EthtoolValue { cmd, data };
        let mut req = IfreqData {
            name: [0; libc::IFNAMSIZ],
            data: &mut value,
            _pad: [0; 16],
        };
        for (dst, &b) in req.name.iter_mut().zip(bytes) {
            *dst = b as libc::c_char;
        }
        // SAFETY: `req` is a valid ifreq whose data pointer points at
        // `value`, both alive for the call; SIOCETHTOOL with a value command
        // reads and writes only `value`.
        let rc = unsafe {
            libc::ioctl(
                self.sock.as_raw_fd(),
                SIOCETHTOOL as _,
                &mut req as *mut IfreqData,
            )
        };
        if rc == 0 {
            Ok(value.data)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_refused_before_the_kernel_is_asked() {
        let sock = EthtoolSocket::open().expect("a socket");
        for dev in ["", "a-name-of-sixteen"] {
            let e = sock.get(dev, Offload::Tso).expect_err("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{dev:?}");
        }
    }

    #[test]
    fn loopback_answers_for_every_offload() {
        let sock = EthtoolSocket::open().expect("a socket");
        for o in Offload::ON_ORDER {
            sock.get("lo", o)
                .unwrap_or_else(|e| panic!("{}: {e}", o.name()));
        }
    }
}
