//! Host facts of the local host, read from `/proc`, `/sys` and
//! `getifaddrs(3)`. [`collect`] never fails and leaves what it cannot read
//! empty; what it returns always passes [`HostFacts::validate`]: over-long
//! strings are cut to the limits and the core count is clamped into range.
//! An interface's offloads are read through [`ethtool`].

pub mod ethtool;

use ethtool::Offload;
use netgap_core::host::{
    truncate_utf8, HostFacts, Offloads, MAX_CORES, MAX_FACT_BYTES, MAX_SYSCTL_VALUE_BYTES,
    RECORDED_SYSCTLS,
};
use std::net::IpAddr;
use std::path::Path;

/// Name of the Linux loopback interface, used for loopback addresses that no
/// interface owns exactly (for example 127.0.0.2 on a `127.0.0.1/8` `lo`).
const LOOPBACK_INTERFACE: &str = "lo";

/// Collects the facts of this host; `local_ip` is the address the traffic
/// uses on this host, used to find the interface and its MTU. Never fails:
/// what cannot be read is left empty.
///
/// Strings are whitespace-normalized and cut to [`MAX_FACT_BYTES`];
/// `cores` is at least 1. The result always passes [`HostFacts::validate`](netgap_core::host::HostFacts::validate).
pub fn collect(local_ip: Option<IpAddr>) -> HostFacts {
    let uname = Uname::read();
    let hostname = read_proc_value(Path::new("/proc/sys/kernel/hostname"))
        .or_else(|| uname.as_ref().map(|u| u.nodename.clone()))
        .unwrap_or_default();
    let kernel = read_proc_value(Path::new("/proc/sys/kernel/osrelease"))
        .or_else(|| uname.as_ref().map(|u| u.release.clone()))
        .unwrap_or_default();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpu_model_from_cpuinfo(&text))
        .unwrap_or_else(|| "unknown".to_string());
    let interface = local_ip.and_then(interface_for_ip);
    let mtu_bytes = interface.as_deref().and_then(read_mtu_bytes);
    let offloads = interface.as_deref().and_then(read_offloads);
    let sysctls = RECORDED_SYSCTLS
        .iter()
        .filter_map(|name| {
            let value = read_sysctl(name)?;
            Some((
                name.to_string(),
                truncate_utf8(value, MAX_SYSCTL_VALUE_BYTES),
            ))
        })
        .collect();
    HostFacts {
        hostname: truncate_utf8(hostname, MAX_FACT_BYTES),
        kernel: truncate_utf8(kernel, MAX_FACT_BYTES),
        cpu_model: truncate_utf8(cpu_model, MAX_FACT_BYTES),
        cores: online_cpus().clamp(1, MAX_CORES),
        interface: interface.map(|name| truncate_utf8(name, MAX_FACT_BYTES)),
        mtu_bytes,
        sysctls,
        netgap_version: truncate_utf8(netgap_core::VERSION.to_string(), MAX_FACT_BYTES),
        offloads,
        qdisc: None,
    }
}

/// The offloads of interface `name` in this thread's network namespace, as
/// `ethtool -k` reports them; `None` when the interface cannot be asked.
fn read_offloads(name: &str) -> Option<Offloads> {
    let sock = ethtool::EthtoolSocket::open().ok()?;
    let get = |offload: Offload| sock.get(name, offload).ok();
    let o = Offloads {
        tso: get(Offload::Tso),
        gso: get(Offload::Gso),
        gro: get(Offload::Gro),
        rx_checksum: get(Offload::RxChecksum),
        tx_checksum: get(Offload::TxChecksum),
    };
    (o != Offloads::default()).then_some(o)
}

/// Collapses every run of whitespace into one space and trims both ends.
fn normalize_whitespace(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Reads a one-value file such as a `/proc/sys` entry, whitespace-normalized;
/// `None` when it cannot be read or is blank.
fn read_proc_value(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let value = normalize_whitespace(&text);
    (!value.is_empty()).then_some(value)
}

/// Reads the sysctl `name` (dotted form) from `/proc/sys`; `None` when the
/// name is malformed or the sysctl does not exist on this kernel.
fn read_sysctl(name: &str) -> Option<String> {
    let well_formed = !name.is_empty()
        && name
            .split('.')
            .all(|part| !part.is_empty() && !part.contains('/') && part != "..");
    if !well_formed {
        return None;
    }
    let path = format!("/proc/sys/{}", name.replace('.', "/"));
    read_proc_value(Path::new(&path))
}

/// The first `model name` value of a `/proc/cpuinfo` text, whitespace-
/// normalized; `None` if there is none (for example on most ARM kernels).
fn cpu_model_from_cpuinfo(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        if key.trim() != "model name" {
            return None;
        }
        let value = normalize_whitespace(value);
        (!value.is_empty()).then_some(value)
    })
}

/// Number of online logical CPUs, or 0 if it cannot be determined.
fn online_cpus() -> u32 {
    // SAFETY: sysconf takes no pointers and only reads a system variable.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if let Ok(n) = u32::try_from(online) {
        if n > 0 {
            return n;
        }
    }
    std::thread::available_parallelism()
        .ok()
        .and_then(|n| u32::try_from(n.get()).ok())
        .unwrap_or(0)
}

/// Host name and kernel release from `uname(2)`, the fallback when `/proc`
/// is not mounted.
struct Uname {
    /// Node (host) name.
    nodename: String,
    /// Kernel release.
    release: String,
}

impl Uname {
    /// Calls `uname(2)`; `None` if it fails.
    fn read() -> Option<Uname> {
        // SAFETY: utsname is plain old data (arrays of c_char), for which the
        // all-zero bit pattern is valid.
        let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: `uts` is a valid, writable utsname that outlives the call.
        if unsafe { libc::uname(&mut uts) } != 0 {
            return None;
        }
        Some(Uname {
            nodename: c_chars_to_string(&uts.nodename),
            release: c_chars_to_string(&uts.release),
        })
    }
}

/// Converts a NUL-terminated (or full) `c_char` array to a whitespace-
/// normalized string, replacing invalid UTF-8.
fn c_chars_to_string(chars: &[libc::c_char]) -> String {
    // `c_char` is i8 or u8 depending on the target; `as u8` reinterprets the
    // byte either way.
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    normalize_whitespace(&String::from_utf8_lossy(&bytes))
}

/// Name of the interface that owns `ip`, or for a loopback address without
/// an exact owner the loopback interface. `None` for unspecified addresses
/// or when no interface matches.
fn interface_for_ip(ip: IpAddr) -> Option<String> {
    // A v4-mapped v6 address (from a dual-stack socket) is owned as v4.
    let ip = ip.to_canonical();
    if ip.is_unspecified() {
        return None;
    }
    let mut loopback = None;
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifaddr in addrs {
            if ifaddr
                .flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
                && loopback.is_none()
            {
                loopback = Some(ifaddr.interface_name.clone());
            }
            let Some(address) = ifaddr.address else {
                continue;
            };
            let owned = if let Some(v4) = address.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            };
            if owned == Some(ip) {
                return Some(ifaddr.interface_name);
            }
        }
    }
    if !ip.is_loopback() {
        return None;
    }
    loopback.or_else(|| {
        Path::new("/sys/class/net")
            .join(LOOPBACK_INTERFACE)
            .exists()
            .then(|| LOOPBACK_INTERFACE.to_string())
    })
}

/// MTU in bytes of interface `name` from `/sys/class/net/<name>/mtu`.
fn read_mtu_bytes(name: &str) -> Option<u32> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    // /sys shows the namespace it was mounted in, not this thread's: a
    // coordinator that entered a testbed host's namespace would read the
    // machine's own interface of the same name there. The ioctl asks the
    // thread's namespace.
    read_mtu_ioctl(name).or_else(|| {
        let path = Path::new("/sys/class/net").join(name).join("mtu");
        read_proc_value(&path)?.parse().ok()
    })
}

/// The MTU of interface `name` in this thread's network namespace
/// (`SIOCGIFMTU`).
pub(crate) fn read_mtu_ioctl(name: &str) -> Option<u32> {
    let req = interface_ioctl(name, libc::SIOCGIFMTU)?;
    // SAFETY: SIOCGIFMTU wrote the union's `ifru_mtu`.
    u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).ok()
}

/// The MAC address of interface `name` in this thread's network
/// namespace (`SIOCGIFHWADDR`).
#[cfg(feature = "xdp-user")]
pub(crate) fn read_mac_ioctl(name: &str) -> Option<[u8; 6]> {
    let req = interface_ioctl(name, libc::SIOCGIFHWADDR)?;
    // SAFETY: SIOCGIFHWADDR wrote the union's `ifru_hwaddr`.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(data) {
        *m = d as u8;
    }
    Some(mac)
}

/// The receive (or combined) channels of interface `name` in this
/// thread's network namespace, as its driver reports them
/// (`ETHTOOL_GCHANNELS`); `None` if it reports none.
pub fn receive_channels(name: &str) -> Option<u16> {
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    /// `struct ethtool_channels`.
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    let mut ch = Channels {
        cmd: ETHTOOL_GCHANNELS,
        ..Channels::default()
    };
    // SAFETY: `ch` is the buffer ETHTOOL_GCHANNELS reads its command from
    // and writes, alive for the call.
    unsafe { interface_ioctl_into(name, libc::SIOCETHTOOL, (&raw mut ch).cast()) }?;
    u16::try_from(ch.rx_count.max(ch.combined_count))
        .ok()
        .filter(|n| *n > 0)
}

/// `ioctl(request)` on interface `name` in this thread's network
/// namespace (a `SIOCGIF*` that fills the `ifreq`'s union); the `ifreq`
/// it filled, or `None` for a name the kernel cannot hold or a failed
/// call.
pub(crate) fn interface_ioctl(name: &str, request: libc::c_ulong) -> Option<libc::ifreq> {
    // SAFETY: no buffer: the request writes the union itself.
    unsafe { interface_ioctl_into(name, request, std::ptr::null_mut()) }
}

/// [`interface_ioctl`] with the union's pointer set to `data`, for a
/// request that takes its buffer there (`SIOCETHTOOL`).
///
/// # Safety
///
/// `data` is null, or points at the buffer `request` reads and writes,
/// alive and of its size for the call.
unsafe fn interface_ioctl_into(
    name: &str,
    request: libc::c_ulong,
    data: *mut libc::c_void,
) -> Option<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: socket has no memory preconditions; the descriptor is owned
    // (and closed) by the OwnedFd below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: all-zero bytes are a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &b) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    req.ifr_ifru.ifru_data = data.cast();
    // SAFETY: `req` is a valid, NUL-terminated ifreq alive for the call,
    // of the size every SIOCGIF* request writes into; its pointer is null
    // or, by the caller's contract, a live buffer of the request's.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            request as _,
            &raw mut req,
        )
    };
    (rc == 0).then_some(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netgap_core::host::{MAX_SYSCTLS, MAX_SYSCTL_KEY_BYTES};
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn collect_loopback_finds_lo_and_mtu() {
        let facts = collect(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(facts.interface.as_deref(), Some("lo"));
        assert!(facts.mtu_bytes.is_some_and(|mtu| mtu > 0));
        assert!(!facts.kernel.is_empty());
        assert!(!facts.hostname.is_empty());
        assert!(!facts.cpu_model.is_empty());
        assert!(facts.cores >= 1);
        assert_eq!(facts.netgap_version, netgap_core::VERSION);
    }

    #[cfg(feature = "xdp-user")]
    #[test]
    fn each_interface_s_mac_from_its_ioctl_is_the_one_its_addresses_list() {
        let mut seen = 0;
        for a in nix::ifaddrs::getifaddrs().expect("getifaddrs") {
            let Some(mac) = a.address.and_then(|s| s.as_link_addr()?.addr()) else {
                continue;
            };
            assert_eq!(
                read_mac_ioctl(&a.interface_name),
                Some(mac),
                "{}",
                a.interface_name
            );
            seen += 1;
        }
        assert!(seen >= 1, "lo at least has a link address");
        assert_eq!(read_mac_ioctl("no-such-if0"), None);
        assert_eq!(read_mac_ioctl(&"x".repeat(libc::IFNAMSIZ)), None);
    }

    #[test]
    fn channels_are_none_where_the_driver_reports_none() {
        // The loopback's driver has no channels to report; a name that is
        // no interface or too long for one is refused.
        assert_eq!(receive_channels("lo"), None);
        assert_eq!(receive_channels("no-such-if0"), None);
        assert_eq!(receive_channels(&"x".repeat(libc::IFNAMSIZ)), None);
    }

    #[test]
    fn loopback_offloads_are_read() {
        let facts = collect(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let o = facts.offloads.expect("lo answers SIOCETHTOOL");
        assert!(o.gso.is_some() && o.tso.is_some(), "{o:?}");
        assert_eq!(read_offloads("no-such-if0"), None);
        assert_eq!(read_offloads(""), None);
    }

    #[test]
    fn collect_other_loopback_address_maps_to_lo() {
        let facts = collect(Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))));
        assert_eq!(facts.interface.as_deref(), Some("lo"));
    }

    #[test]
    fn collect_without_ip_or_unknown_ip_has_no_interface() {
        let none = collect(None);
        assert_eq!(none.interface, None);
        assert_eq!(none.mtu_bytes, None);
        // 192.0.2.0/24 is TEST-NET-1, never assigned to a real host.
        let unknown = collect(Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77))));
        assert_eq!(unknown.interface, None);
        let unspecified = collect(Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED)));
        assert_eq!(unspecified.interface, None);
    }

    #[test]
    fn collect_reads_sysctls_normalized() {
        let facts = collect(None);
        for (key, value) in &facts.sysctls {
            assert!(RECORDED_SYSCTLS.contains(&key.as_str()), "{key}");
            assert!(!value.is_empty());
            assert!(!value.contains(['\t', '\n']), "{key}={value:?}");
            assert!(!value.contains("  "), "{key}={value:?}");
        }
    }

    #[test]
    fn validate_accepts_collected_facts() {
        let facts = collect(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(facts.validate(), Ok(()));
        assert_eq!(collect(None).validate(), Ok(()));
    }

    #[test]
    fn validate_rejects_huge_hostname() {
        let facts = HostFacts {
            hostname: "h".repeat(10 * 1024),
            ..collect(None)
        };
        let err = facts
            .validate()
            .expect_err("10 KB hostname must be rejected");
        assert_eq!(err.field, "hostname");
    }

    #[test]
    fn validate_rejects_too_many_sysctls() {
        let mut facts = collect(None);
        facts.sysctls = (0..=MAX_SYSCTLS)
            .map(|i| (format!("net.fake.key{i}"), "1".to_string()))
            .collect();
        let err = facts.validate().expect_err("33 sysctls must be rejected");
        assert_eq!(err.field, "sysctls");
        facts.sysctls.pop_last();
        assert_eq!(facts.validate(), Ok(()));
    }

    #[test]
    fn validate_bounds_sysctl_entries_cores_and_interface() {
        let base = collect(None);
        let long_key = HostFacts {
            sysctls: [("k".repeat(MAX_SYSCTL_KEY_BYTES + 1), "1".to_string())].into(),
            ..base.clone()
        };
        assert_eq!(long_key.validate().map_err(|e| e.field), Err("sysctls"));
        let long_value = HostFacts {
            sysctls: [("a.b".to_string(), "v".repeat(MAX_SYSCTL_VALUE_BYTES + 1))].into(),
            ..base.clone()
        };
        assert_eq!(long_value.validate().map_err(|e| e.field), Err("sysctls"));
        for cores in [0, MAX_CORES + 1] {
            let bad = HostFacts {
                cores,
                ..base.clone()
            };
            assert_eq!(bad.validate().map_err(|e| e.field), Err("cores"));
        }
        let edge = HostFacts {
            cores: MAX_CORES,
            hostname: "h".repeat(MAX_FACT_BYTES),
            ..base.clone()
        };
        assert_eq!(edge.validate(), Ok(()));
        let long_if = HostFacts {
            interface: Some("i".repeat(MAX_FACT_BYTES + 1)),
            ..base
        };
        assert_eq!(long_if.validate().map_err(|e| e.field), Err("interface"));
    }

    #[test]
    fn cpu_model_parsing() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\n\
                    model name\t: Intel(R)  Xeon(R)   CPU @ 2.20GHz\n\
                    processor\t: 1\nmodel name\t: Other\n";
        assert_eq!(
            cpu_model_from_cpuinfo(text).as_deref(),
            Some("Intel(R) Xeon(R) CPU @ 2.20GHz")
        );
        assert_eq!(
            cpu_model_from_cpuinfo("processor : 0\nBogoMIPS : 50\n"),
            None
        );
    }

    #[test]
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate_utf8("abc".to_string(), 5), "abc");
        assert_eq!(truncate_utf8("abcdef".to_string(), 3), "abc");
        // 'é' is two bytes: cutting at 2 would split it.
        assert_eq!(truncate_utf8("aé".to_string(), 2), "a");
    }

    #[test]
    fn sysctl_names_are_checked() {
        assert_eq!(read_sysctl("../../etc/passwd"), None);
        assert_eq!(read_sysctl("net..core"), None);
        assert_eq!(read_sysctl(""), None);
        assert_eq!(read_sysctl("net.core.no_such_sysctl_here"), None);
    }

    #[test]
    fn serde_round_trip_rejects_unknown_fields() {
        let facts = collect(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let json = serde_json::to_string(&facts).expect("serializable");
        let back: HostFacts = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, facts);
        let extra = json.replacen('{', "{\"bogus\":1,", 1);
        assert!(serde_json::from_str::<HostFacts>(&extra).is_err());
    }
}
