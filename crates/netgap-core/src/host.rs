//! Host facts recorded with every result, so a reader can tell whether two
//! results were measured on comparable machines.
//!
//! This module holds the facts as data; `netgap_transport::host::collect`
//! reads them off the local host. Facts of the peer arrive over the network,
//! so [`HostFacts::validate`] bounds every field before they are trusted.

use crate::spec::RangeError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Maximum length in bytes of each free-text fact (host name, kernel, CPU
/// model, interface, version).
pub const MAX_FACT_BYTES: usize = 256;
/// Maximum number of entries in [`HostFacts::sysctls`].
pub const MAX_SYSCTLS: usize = 32;
/// Maximum length in bytes of a sysctl name (dotted form).
pub const MAX_SYSCTL_KEY_BYTES: usize = 64;
/// Maximum length in bytes of a sysctl value (whitespace-normalized).
pub const MAX_SYSCTL_VALUE_BYTES: usize = 256;
/// Largest accepted value of [`HostFacts::cores`]; the smallest is 1.
pub const MAX_CORES: u32 = 65_536;

/// Sysctls recorded by `netgap_transport::host::collect`, by dotted name. The value of
/// each is read from `/proc/sys/<name with dots as slashes>`.
pub const RECORDED_SYSCTLS: [&str; 8] = [
    "net.core.rmem_max",
    "net.core.wmem_max",
    "net.core.rmem_default",
    "net.core.wmem_default",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_congestion_control",
    "net.core.busy_poll",
];

/// Facts about one host, as recorded in `host` and `peer_host` of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct HostFacts {
    /// Host name.
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// CPU model name.
    pub cpu_model: String,
    /// Online logical CPUs.
    pub cores: u32,
    /// Interface that carries the traffic, if it could be found.
    pub interface: Option<String>,
    /// MTU of that interface in bytes.
    pub mtu_bytes: Option<u32>,
    /// Socket buffer sysctls by their dotted name (`net.core.rmem_max`, ...).
    pub sysctls: BTreeMap<String, String>,
    /// netgap version running on the host.
    pub netgap_version: String,
    /// Offload state of that interface, when it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offloads: Option<Offloads>,
    /// Root queueing discipline of that interface (`noqdisc`, `tbf`,
    /// `netem`, ...), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qdisc: Option<String>,
}

/// Offload state of one interface, as the kernel reports it (what `ethtool
/// -k` shows); `None` where the kernel did not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Offloads {
    /// TCP segmentation offload.
    pub tso: Option<bool>,
    /// Generic segmentation offload.
    pub gso: Option<bool>,
    /// Generic receive offload.
    pub gro: Option<bool>,
    /// Receive checksum offload.
    pub rx_checksum: Option<bool>,
    /// Transmit checksum offload.
    pub tx_checksum: Option<bool>,
}

impl Offloads {
    /// The features by name, in the order they are shown.
    pub fn features(&self) -> [(&'static str, Option<bool>); 5] {
        [
            ("tso", self.tso),
            ("gso", self.gso),
            ("gro", self.gro),
            ("rx", self.rx_checksum),
            ("tx", self.tx_checksum),
        ]
    }

    /// What several ends have in common: `on` when every known feature is
    /// on at every end, `off` when none is on at any end, else the features
    /// on at every end, comma separated (`gso,gro`), or `mixed` when no
    /// feature is on at every end but some are on somewhere.
    pub fn summary(ends: &[&Offloads]) -> String {
        let mut on_everywhere = Vec::new();
        let mut any_on = false;
        let mut all_on = true;
        for (i, (name, _)) in Offloads::default().features().iter().enumerate() {
            let values: Vec<Option<bool>> = ends.iter().map(|o| o.features()[i].1).collect();
            if values.iter().all(Option::is_none) {
                continue;
            }
            let everywhere = values.iter().all(|v| *v == Some(true));
            any_on |= values.contains(&Some(true));
            all_on &= everywhere;
            if everywhere {
                on_everywhere.push(*name);
            }
        }
        if !any_on {
            "off".into()
        } else if all_on {
            "on".into()
        } else if on_everywhere.is_empty() {
            "mixed".into()
        } else {
            on_everywhere.join(",")
        }
    }
}

impl HostFacts {
    /// Checks that every field is within bounds, for facts received from a
    /// peer: each string at most [`MAX_FACT_BYTES`], at most [`MAX_SYSCTLS`]
    /// sysctls with names of at most [`MAX_SYSCTL_KEY_BYTES`] and values of at
    /// most [`MAX_SYSCTL_VALUE_BYTES`], and `cores` in `1..=`[`MAX_CORES`].
    /// Empty strings and missing optional facts are accepted.
    pub fn validate(&self) -> Result<(), RangeError> {
        check_len("hostname", &self.hostname, MAX_FACT_BYTES)?;
        check_len("kernel", &self.kernel, MAX_FACT_BYTES)?;
        check_len("cpu_model", &self.cpu_model, MAX_FACT_BYTES)?;
        check_len("netgap_version", &self.netgap_version, MAX_FACT_BYTES)?;
        if let Some(q) = &self.qdisc {
            check_len("qdisc", q, MAX_FACT_BYTES)?;
        }
        if let Some(interface) = &self.interface {
            check_len("interface", interface, MAX_FACT_BYTES)?;
        }
        if !(1..=MAX_CORES).contains(&self.cores) {
            return Err(RangeError {
                field: "cores",
                detail: format!("{} not in 1..={MAX_CORES}", self.cores),
            });
        }
        if self.sysctls.len() > MAX_SYSCTLS {
            return Err(RangeError {
                field: "sysctls",
                detail: format!("{} entries, at most {MAX_SYSCTLS}", self.sysctls.len()),
            });
        }
        for (key, value) in &self.sysctls {
            check_len("sysctls", key, MAX_SYSCTL_KEY_BYTES)?;
            check_len("sysctls", value, MAX_SYSCTL_VALUE_BYTES)?;
        }
        Ok(())
    }
}

/// Fails with a [`RangeError`] on `field` when `value` is longer than
/// `max_bytes` bytes.
fn check_len(field: &'static str, value: &str, max_bytes: usize) -> Result<(), RangeError> {
    if value.len() > max_bytes {
        return Err(RangeError {
            field,
            detail: format!("length {} bytes, at most {max_bytes}", value.len()),
        });
    }
    Ok(())
}

/// Cuts `s` to at most `max_bytes` bytes, on a character boundary.
pub fn truncate_utf8(mut s: String, max_bytes: usize) -> String {
    if s.len() > max_bytes {
        let mut end = max_bytes;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
