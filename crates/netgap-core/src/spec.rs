//! What one measured point is: the test, the transport and its options, the
//! message size and where each role runs. A [`PointSpec`] travels from the
//! coordinator to the agent inside the control protocol, so it is plain data
//! with a [`PointSpec::validate`] that range-checks every field a peer sends.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Largest message size any test accepts, in bytes (256 MiB).
pub const MAX_SIZE_BYTES: u64 = 256 * 1024 * 1024;
/// Largest iteration count one repetition may ask for.
pub const MAX_ITERATIONS: u64 = 100_000_000;
/// Longest data-path inactivity timeout a peer may ask for, in milliseconds.
pub const MAX_IO_TIMEOUT_MS: u32 = 600_000;
/// Largest socket buffer a peer may ask for, in bytes (1 GiB).
pub const MAX_SOCKET_BUFFER_BYTES: u32 = 1 << 30;
/// Longest name (test, transport) accepted on the wire, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 32;
/// Highest CPU index a peer may ask to be pinned to.
pub const MAX_CPU_INDEX: u32 = 4095;

/// How a transport waits for completion (seed 000's polling- vs event-based
/// comparison).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Block in the kernel until the operation can complete.
    #[default]
    Event,
    /// Non-blocking calls in a busy loop: lowest latency, one core burnt.
    Poll,
}

impl Mode {
    /// Every mode, in the order they are shown.
    pub const ALL: [Mode; 2] = [Mode::Event, Mode::Poll];

    /// The mode's name as used on the command line and in results.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Event => "event",
            Mode::Poll => "poll",
        }
    }

    /// The mode named `name` as [`Mode::as_str`] names it.
    pub fn by_name(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options of the data flows, as both ends apply them and results record
/// them (`options.transport`; the keys stay as old results files have them).
/// Each option is declared once, by the transport that honours it
/// (`netgap_transport::options`): its declaration parses, refuses and records
/// it into this struct.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportOptions {
    /// TCP_NODELAY on the data connection (tcp only). On by default.
    pub nodelay: bool,
    /// SO_SNDBUF in bytes, or the system default.
    pub sndbuf_bytes: Option<u32>,
    /// SO_RCVBUF in bytes, or the system default.
    pub rcvbuf_bytes: Option<u32>,
    /// MSG_ZEROCOPY sends, their completions reaped (tcp only).
    pub zerocopy: bool,
    /// SO_BUSY_POLL in microseconds (tcp only).
    pub busy_poll_us: Option<u32>,
    /// TCP_QUICKACK re-armed after every receive (tcp only).
    pub quickack: bool,
    /// TCP_CORK around each message (tcp only).
    pub cork: bool,
    /// TCP congestion control algorithm, e.g. `cubic` (tcp only).
    pub congestion: Option<String>,
    /// Kernel-side submission polling (IORING_SETUP_SQPOLL; uring only).
    pub sqpoll: bool,
    /// Message buffers' data starts `buffer_offset_bytes` past a boundary of
    /// this many bytes, a power of two (`--align`); `None` is the page.
    /// Absent from older records and messages, and left out when `None`,
    /// so default runs keep their earlier form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_align_bytes: Option<u32>,
    /// Bytes past the alignment boundary at which message buffers' data
    /// starts (`--offset`), below the alignment; 0 by default and then left
    /// out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub buffer_offset_bytes: u32,
    /// The programs a workload runs under netgap's preload library keep
    /// their connections to other hosts on the hosts' relays instead of
    /// asking for direct ones, each on an AF_XDP socket of the program's
    /// own, as they do by default (`--preload-relayed`; xdp only, and only
    /// for a workload that wraps programs). Left out when false. Records
    /// older than this option ran their xdp programs through the relays
    /// without saying so; every record's `preload_direct` and
    /// `preload_xdp_connections` counts say which path each connection
    /// took.
    #[serde(default, skip_serializing_if = "is_false")]
    pub preload_relayed: bool,
}

impl TransportOptions {
    /// Bytes one message buffer may take beyond its data because of its
    /// layout: the offset before the data and, for an alignment past the
    /// page, what the allocator may set aside to reach that boundary. A
    /// peer's `--align` and `--offset` count against the agent's memory
    /// budget with this.
    pub fn buffer_padding_bytes(&self) -> u64 {
        u64::from(self.buffer_offset_bytes)
            .saturating_add(self.buffer_align_bytes.map_or(0, u64::from))
    }
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            nodelay: true,
            sndbuf_bytes: None,
            rcvbuf_bytes: None,
            zerocopy: false,
            busy_poll_us: None,
            quickack: false,
            cork: false,
            congestion: None,
            sqpoll: false,
            buffer_align_bytes: None,
            buffer_offset_bytes: 0,
            preload_relayed: false,
        }
    }
}

/// Longest busy-poll time a peer may ask for, in microseconds (1 s).
pub const MAX_BUSY_POLL_US: u32 = 1_000_000;
/// Largest message buffer alignment a run or a peer may ask for, in bytes
/// (1 GiB, a huge page on every Linux architecture).
pub const MAX_BUFFER_ALIGN_BYTES: u32 = 1 << 30;
/// Largest message buffer offset when the alignment is the page, in bytes:
/// below the largest Linux page (the agent checks it against its own page).
pub const MAX_PAGE_OFFSET_BYTES: u32 = (1 << 16) - 1;

/// Longest congestion control name, in bytes (the kernel's TCP_CA_NAME_MAX).
pub const MAX_CONGESTION_NAME_BYTES: usize = 16;

/// One measured point as the agent needs to know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointSpec {
    /// Registered test name (`pingpong`, `stream`, ...).
    pub test: String,
    /// Registered transport name (`tcp`, `unix`, ...).
    pub transport: String,
    /// Completion mode on both ends.
    pub mode: Mode,
    /// Message size in bytes, 1..=[`MAX_SIZE_BYTES`].
    pub size_bytes: u64,
    /// Transport options, applied on both ends.
    pub options: TransportOptions,
    /// CPU the agent pins its role to, if any.
    pub server_cpu: Option<u32>,
    /// Data-path inactivity timeout in milliseconds, 1..=[`MAX_IO_TIMEOUT_MS`].
    pub io_timeout_ms: u32,
    /// Check every payload byte received against the sent pattern.
    pub verify: bool,
}

/// A field of a [`PointSpec`] or a message that is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} out of range: {detail}")]
pub struct RangeError {
    /// The offending field.
    pub field: &'static str,
    /// What was wrong with it.
    pub detail: String,
}

fn range(field: &'static str, detail: impl Into<String>) -> RangeError {
    RangeError {
        field,
        detail: detail.into(),
    }
}

/// Checks a name sent by a peer: short, lowercase ASCII letters, digits, `-`.
pub fn check_name(field: &'static str, name: &str) -> Result<(), RangeError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(range(
            field,
            format!("length {} not in 1..={MAX_NAME_BYTES}", name.len()),
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(range(field, "only a-z, 0-9, '-' and '_' are allowed"));
    }
    Ok(())
}

/// Checks a message size in bytes against 1..=[`MAX_SIZE_BYTES`].
pub fn check_size(size_bytes: u64) -> Result<(), RangeError> {
    if size_bytes == 0 || size_bytes > MAX_SIZE_BYTES {
        return Err(range(
            "size_bytes",
            format!("{size_bytes} not in 1..={MAX_SIZE_BYTES}"),
        ));
    }
    Ok(())
}

/// Checks a message buffer layout: the alignment a power of two up to
/// [`MAX_BUFFER_ALIGN_BYTES`], the offset below it (below
/// [`MAX_PAGE_OFFSET_BYTES`] when the alignment is the page).
pub fn check_buffer_layout(align_bytes: Option<u32>, offset_bytes: u32) -> Result<(), RangeError> {
    match align_bytes {
        Some(a) if !a.is_power_of_two() || a > MAX_BUFFER_ALIGN_BYTES => Err(range(
            "buffer_align_bytes",
            format!("{a} is not a power of two in 1..={MAX_BUFFER_ALIGN_BYTES}"),
        )),
        Some(a) if offset_bytes >= a => Err(range(
            "buffer_offset_bytes",
            format!("{offset_bytes} is not below the alignment of {a} bytes"),
        )),
        None if offset_bytes > MAX_PAGE_OFFSET_BYTES => Err(range(
            "buffer_offset_bytes",
            format!("{offset_bytes} > {MAX_PAGE_OFFSET_BYTES}"),
        )),
        _ => Ok(()),
    }
}

impl PointSpec {
    /// Range-checks every field; never panics on peer input.
    pub fn validate(&self) -> Result<(), RangeError> {
        check_name("test", &self.test)?;
        check_name("transport", &self.transport)?;
        check_size(self.size_bytes)?;
        for (field, v) in [
            ("sndbuf_bytes", self.options.sndbuf_bytes),
            ("rcvbuf_bytes", self.options.rcvbuf_bytes),
        ] {
            if let Some(v) = v {
                if v == 0 || v > MAX_SOCKET_BUFFER_BYTES {
                    return Err(range(
                        field,
                        format!("{v} not in 1..={MAX_SOCKET_BUFFER_BYTES}"),
                    ));
                }
            }
        }
        if let Some(us) = self.options.busy_poll_us {
            if us > MAX_BUSY_POLL_US {
                return Err(range("busy_poll_us", format!("{us} > {MAX_BUSY_POLL_US}")));
            }
        }
        if let Some(name) = &self.options.congestion {
            check_name("congestion", name)?;
            if name.len() > MAX_CONGESTION_NAME_BYTES {
                return Err(range(
                    "congestion",
                    format!("longer than {MAX_CONGESTION_NAME_BYTES} bytes"),
                ));
            }
        }
        check_buffer_layout(
            self.options.buffer_align_bytes,
            self.options.buffer_offset_bytes,
        )?;
        if let Some(cpu) = self.server_cpu {
            if cpu > MAX_CPU_INDEX {
                return Err(range("server_cpu", format!("{cpu} > {MAX_CPU_INDEX}")));
            }
        }
        if self.io_timeout_ms == 0 || self.io_timeout_ms > MAX_IO_TIMEOUT_MS {
            return Err(range(
                "io_timeout_ms",
                format!("{} not in 1..={MAX_IO_TIMEOUT_MS}", self.io_timeout_ms),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PointSpec {
        PointSpec {
            test: "pingpong".into(),
            transport: "tcp".into(),
            mode: Mode::Event,
            size_bytes: 1,
            options: TransportOptions::default(),
            server_cpu: None,
            io_timeout_ms: 5000,
            verify: false,
        }
    }

    #[test]
    fn valid_spec_passes() {
        assert_eq!(spec().validate(), Ok(()));
    }

    #[test]
    fn out_of_range_fields_are_named() {
        let mut s = spec();
        s.size_bytes = 0;
        assert_eq!(s.validate().unwrap_err().field, "size_bytes");
        let mut s = spec();
        s.size_bytes = MAX_SIZE_BYTES + 1;
        assert_eq!(s.validate().unwrap_err().field, "size_bytes");
        let mut s = spec();
        s.test = "Ping Pong".into();
        assert_eq!(s.validate().unwrap_err().field, "test");
        let mut s = spec();
        s.options.sndbuf_bytes = Some(0);
        assert_eq!(s.validate().unwrap_err().field, "sndbuf_bytes");
        let mut s = spec();
        s.options.buffer_align_bytes = Some(48);
        assert_eq!(s.validate().unwrap_err().field, "buffer_align_bytes");
        let mut s = spec();
        s.options.buffer_align_bytes = Some(64);
        s.options.buffer_offset_bytes = 64;
        assert_eq!(s.validate().unwrap_err().field, "buffer_offset_bytes");
        let mut s = spec();
        s.options.buffer_offset_bytes = MAX_PAGE_OFFSET_BYTES + 1;
        assert_eq!(s.validate().unwrap_err().field, "buffer_offset_bytes");
        let mut s = spec();
        s.io_timeout_ms = 0;
        assert_eq!(s.validate().unwrap_err().field, "io_timeout_ms");
        let mut s = spec();
        s.options.busy_poll_us = Some(MAX_BUSY_POLL_US + 1);
        assert_eq!(s.validate().unwrap_err().field, "busy_poll_us");
        let mut s = spec();
        s.options.congestion = Some("x".repeat(17));
        assert_eq!(s.validate().unwrap_err().field, "congestion");
        let mut s = spec();
        s.server_cpu = Some(1 << 20);
        assert_eq!(s.validate().unwrap_err().field, "server_cpu");
    }
}
