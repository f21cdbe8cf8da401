//! What the testbed does inside its namespaces without a helper program:
//! offloads switched with the `SIOCETHTOOL` ioctl (what `ethtool -K` does,
//! through `netgap_transport::host::ethtool`, the one home of that ioctl),
//! and per-namespace sysctls written under `/proc/sys`. Each runs on a
//! thread of its own that enters the namespace first, so the calling thread
//! and the rest of the process stay where they are, and nothing needs
//! `ethtool` installed.

use crate::TestbedError;
use netgap_transport::host::ethtool::{EthtoolSocket, Offload};

/// Runs `f` on a new thread inside network namespace `ns`; its result.
pub(crate) fn in_netns<T: Send + 'static>(
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

/// Switches TSO, GSO, GRO and rx/tx checksum offload on or off on every
/// interface of `devs` in namespace `ns`, and checks that each took.
pub(super) fn set_offloads(ns: &str, devs: &[String], on: bool) -> Result<(), TestbedError> {
    let devs = devs.to_vec();
    let ns_name = ns.to_string();
    in_netns(ns, move || {
        let sock = ethtool_socket(&ns_name)?;
        let order: Vec<Offload> = if on {
            Offload::ON_ORDER.to_vec()
        } else {
            Offload::ON_ORDER.iter().rev().copied().collect()
        };
        for dev in &devs {
            let fail = |f: Offload, e: std::io::Error| TestbedError::Command {
                cmd: format!(
                    "ethtool -K {dev} {} {} (in {ns_name})",
                    f.name(),
                    if on { "on" } else { "off" }
                ),
                detail: e.to_string(),
            };
            for &f in &order {
                sock.set(dev, f, on).map_err(|e| fail(f, e))?;
            }
            for &f in &order {
                let now = sock.get(dev, f).map_err(|e| fail(f, e))?;
                if now != on {
                    return Err(TestbedError::Command {
                        cmd: format!("ethtool -K {dev} {} (in {ns_name})", f.name()),
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
fn ethtool_socket(ns: &str) -> Result<EthtoolSocket, TestbedError> {
    EthtoolSocket::open().map_err(|source| TestbedError::Io {
        what: format!("opening a socket in {ns}"),
        source,
    })
}

/// Each offload of [`Offload::ON_ORDER`] of each interface of `devs` in
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
                Offload::ON_ORDER
                    .iter()
                    .map(|&f| {
                        sock.get(dev, f)
                            .map(|on| (f.name().to_string(), on))
                            .map_err(|e| TestbedError::Command {
                                cmd: format!("ethtool -k {dev} {} (in {ns_name})", f.name()),
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
/// reverse of [`Offload::ON_ORDER`] (TSO before the checksums it needs),
/// then those going on, in [`Offload::ON_ORDER`].
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
        let want = |f: Offload| features.get(f.name()).copied();
        let offs = Offload::ON_ORDER
            .into_iter()
            .rev()
            .filter(|&f| want(f) == Some(false));
        let ons = Offload::ON_ORDER
            .into_iter()
            .filter(|&f| want(f) == Some(true));
        for f in offs.chain(ons) {
            let on = want(f) == Some(true);
            let fail = |e: std::io::Error| TestbedError::Command {
                cmd: format!(
                    "ethtool -K {dev} {} {} (in {ns_name})",
                    f.name(),
                    if on { "on" } else { "off" }
                ),
                detail: e.to_string(),
            };
            sock.set(&dev, f, on).map_err(fail)?;
            let now = sock.get(&dev, f).map_err(fail)?;
            if now != on {
                return Err(TestbedError::Command {
                    cmd: format!("ethtool -K {dev} {} (in {ns_name})", f.name()),
                    detail: "the driver does not let it change".into(),
                });
            }
        }
        Ok(())
    })
}
