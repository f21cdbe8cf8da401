//! What the testbed does inside its namespaces without a helper program:
//! offloads switched with the `SIOCETHTOOL` ioctl (what `ethtool -K` does),
//! and per-namespace sysctls written under `/proc/sys`. Each runs on a
//! thread of its own that enters the namespace first, so the calling thread
//! and the rest of the process stay where they are, and nothing needs
//! `ethtool` installed.

use crate::TestbedError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `SIOCETHTOOL`, the ioctl behind `ethtool`.
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// One offload: its name as `ethtool -k` shows it, and the legacy get and
/// set commands (`ETHTOOL_G*`, `ETHTOOL_S*`), which every kernel netgap
/// runs on answers for veth and bridge devices.
struct Feature {
    name: &'static str,
    get: u32,
    set: u32,
}

const TX_CSUM: Feature = Feature {
    name: "tx-checksumming",
    get: 0x16,
    set: 0x17,
};
const RX_CSUM: Feature = Feature {
    name: "rx-checksumming",
    get: 0x14,
    set: 0x15,
};
const TSO: Feature = Feature {
    name: "tcp-segmentation-offload",
    get: 0x1e,
    set: 0x1f,
};
const GSO: Feature = Feature {
    name: "generic-segmentation-offload",
    get: 0x23,
    set: 0x24,
};
const GRO: Feature = Feature {
    name: "generic-receive-offload",
    get: 0x2b,
    set: 0x2c,
};

/// The order to switch them on: TSO needs transmit checksums, so those
/// come first; off goes the other way round.
const ON_ORDER: [&Feature; 5] = [&TX_CSUM, &RX_CSUM, &TSO, &GSO, &GRO];

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

/// Runs `f` on a new thread inside network namespace `ns`; its result.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T, TestbedError> + Send + 'static,
) -> Result<T, TestbedError> {
    let name = ns.to_string();
    let handle = std::thread::Builder::new()
        .name(format!("netns {ns}"))
        .spawn(move || {
            netgap_transport::netns::enter(&name)?;
            f()
        })
        .map_err(|e| TestbedError::Io {
            what: format!("starting a thread for namespace {ns}"),
            source: e,
        })?;
    handle.join().unwrap_or_else(|_| {
        Err(TestbedError::Args(format!(
            "the thread working in namespace {ns} panicked"
        )))
    })
}

/// One ethtool value command on interface `dev` through socket `sock`.
fn ethtool(sock: &OwnedFd, dev: &str, cmd: u32, data: u32) -> std::io::Result<u32> {
    let bytes = dev.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
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
    // SAFETY: `req` is a valid ifreq whose data pointer points at `value`,
    // both alive for the call; SIOCETHTOOL with a value command reads and
    // writes only `value`.
    let rc = unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            SIOCETHTOOL as _,
            &mut req as *mut IfreqData,
        )
    };
    if rc == 0 {
        Ok(value.data)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Switches TSO, GSO, GRO and rx/tx checksum offload on or off on every
/// interface of `devs` in namespace `ns`, and checks that each took.
pub(super) fn set_offloads(ns: &str, devs: &[String], on: bool) -> Result<(), TestbedError> {
    let devs = devs.to_vec();
    let ns_name = ns.to_string();
    in_netns(ns, move || {
        let sock = ethtool_socket(&ns_name)?;
        let order: Vec<&Feature> = if on {
            ON_ORDER.to_vec()
        } else {
            ON_ORDER.iter().rev().copied().collect()
        };
        for dev in &devs {
            let fail = |f: &Feature, e: std::io::Error| TestbedError::Command {
                cmd: format!(
                    "ethtool -K {dev} {} {} (in {ns_name})",
                    f.name,
                    if on { "on" } else { "off" }
                ),
                detail: e.to_string(),
            };
            for f in &order {
                ethtool(&sock, dev, f.set, u32::from(on)).map_err(|e| fail(f, e))?;
            }
            for f in &order {
                let now = ethtool(&sock, dev, f.get, 0).map_err(|e| fail(f, e))?;
                if (now != 0) != on {
                    return Err(TestbedError::Command {
                        cmd: format!("ethtool -K {dev} {} (in {ns_name})", f.name),
                        detail: format!(
                            "it stays {}: the driver does not let it change",
                            if on { "off" } else { "on" }
                        ),
                    });
                }
            }
        }
        Ok(())
    })
}

/// Writes `value` to the sysctl `path` (under `/proc/sys`) of namespace
/// `ns`: a thread that entered the namespace sees its own `net.*` there.
pub(super) fn set_sysctl(
    ns: &str,
    path: &'static str,
    value: &'static str,
) -> Result<(), TestbedError> {
    let ns_name = ns.to_string();
    in_netns(ns, move || {
        std::fs::write(format!("/proc/sys/{path}"), value).map_err(|source| TestbedError::Io {
            what: format!("writing {value} to /proc/sys/{path} in {ns_name}"),
            source,
        })
    })
}

/// Opens the socket the ethtool ioctls go through, in the calling thread's
/// namespace.
fn ethtool_socket(ns: &str) -> Result<OwnedFd, TestbedError> {
    // SAFETY: socket has no memory preconditions; the descriptor is
    // owned (and closed) by the OwnedFd below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(TestbedError::Io {
            what: format!("opening a socket in {ns}"),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Each offload of [`OFFLOAD_NAMES`] of each interface of `devs` in
/// namespace `ns`, as the kernel has it now (`ethtool -k`), in `devs`'
/// order.
pub(super) fn read_offloads(
    ns: &str,
    devs: &[String],
) -> Result<Vec<std::collections::BTreeMap<String, bool>>, TestbedError> {
    let devs = devs.to_vec();
    let ns_name = ns.to_string();
    in_netns(ns, move || {
        let sock = ethtool_socket(&ns_name)?;
        devs.iter()
            .map(|dev| {
                ON_ORDER
                    .iter()
                    .map(|f| {
                        ethtool(&sock, dev, f.get, 0)
                            .map(|v| (f.name.to_string(), v != 0))
                            .map_err(|e| TestbedError::Command {
                                cmd: format!("ethtool -k {dev} {} (in {ns_name})", f.name),
                                detail: e.to_string(),
                            })
                    })
                    .collect()
            })
            .collect()
    })
}

/// Puts each offload of interface `dev` in namespace `ns` back to exactly
/// `features` (what [`read_offloads`] read), features it does not name
/// untouched, and checks that each took. Those going off go first, in the
/// reverse of [`ON_ORDER`] (TSO before the checksums it needs), then those
/// going on, in [`ON_ORDER`].
pub(super) fn restore_offloads(
    ns: &str,
    dev: &str,
    features: &std::collections::BTreeMap<String, bool>,
) -> Result<(), TestbedError> {
    let dev = dev.to_string();
    let features = features.clone();
    let ns_name = ns.to_string();
    in_netns(ns, move || {
        let sock = ethtool_socket(&ns_name)?;
        let want = |f: &Feature| features.get(f.name).copied();
        let offs = ON_ORDER.iter().rev().filter(|f| want(f) == Some(false));
        let ons = ON_ORDER.iter().filter(|f| want(f) == Some(true));
        for f in offs.chain(ons) {
            let on = want(f) == Some(true);
            let fail = |e: std::io::Error| TestbedError::Command {
                cmd: format!(
                    "ethtool -K {dev} {} {} (in {ns_name})",
                    f.name,
                    if on { "on" } else { "off" }
                ),
                detail: e.to_string(),
            };
            ethtool(&sock, &dev, f.set, u32::from(on)).map_err(fail)?;
            let now = ethtool(&sock, &dev, f.get, 0).map_err(fail)?;
            if (now != 0) != on {
                return Err(TestbedError::Command {
                    cmd: format!("ethtool -K {dev} {} (in {ns_name})", f.name),
                    detail: "the driver does not let it change".into(),
                });
            }
        }
        Ok(())
    })
}
