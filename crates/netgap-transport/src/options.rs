//! Transport options, each declared once by the transport that honours it.
//!
//! An [`OptionDecl`] is everything netgap knows about one option: its flag,
//! the type of its value, its help text, and how a given value is recorded
//! into the [`TransportOptions`] that travel to the agent and into results.
//! Each transport module declares its own options (the socket buffer options
//! shared by every socket transport live here) and lists the ones it honours
//! in [`crate::Capabilities::options`], next to the code that applies them to
//! its sockets or rings. The command line builds its flags from [`all`],
//! the plan refuses an option a chosen transport does not list, and the
//! record says what [`OptionDecl::record`] wrote: no option name is repeated
//! anywhere else.

use netgap_core::spec::{TransportOptions, MAX_SOCKET_BUFFER_BYTES};

/// The type of an option's value, which sets how the command line parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    /// A switch with no value (`--cork`).
    Switch,
    /// A size in bytes with an optional K, M, G suffix (`--sndbuf 512K`).
    Bytes,
    /// A whole number in the unit its help states (`--busy-poll 50`, µs).
    Count,
    /// A name (`--congestion bbr`).
    Name,
}

/// A value given for an option, already parsed to its [`OptionKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionValue {
    /// The switch was given.
    Switch,
    /// A size in bytes or a count, in the unit the option's help states.
    Number(u64),
    /// A name.
    Name(String),
}

/// An option's value is out of its range or of the wrong kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag} {value}: {detail}")]
pub struct OptionError {
    /// The option's flag, without the leading dashes.
    pub flag: &'static str,
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub detail: String,
}

/// One transport option: its flag, value type, help, and how a value is
/// recorded. Options are compared by flag.
#[derive(Debug)]
pub struct OptionDecl {
    /// Long flag without the leading dashes (`sndbuf`); unique among all
    /// transports' options.
    pub flag: &'static str,
    /// Type of the value.
    pub kind: OptionKind,
    /// Placeholder of the value in help (`BYTES`); empty for a switch.
    pub value_name: &'static str,
    /// One line for `--help`, naming the socket option it sets.
    pub help: &'static str,
    /// Writes a given value into the options both ends apply and results
    /// record; checks its range first.
    pub record: fn(&mut TransportOptions, &OptionValue) -> Result<(), OptionError>,
}

impl PartialEq for OptionDecl {
    fn eq(&self, other: &Self) -> bool {
        self.flag == other.flag
    }
}

impl Eq for OptionDecl {}

impl OptionDecl {
    /// The flag as typed, `--sndbuf`.
    pub fn long(&self) -> String {
        format!("--{}", self.flag)
    }

    /// Records `value` into `options` (see [`OptionDecl::record`]).
    pub fn apply_value(
        &self,
        options: &mut TransportOptions,
        value: &OptionValue,
    ) -> Result<(), OptionError> {
        (self.record)(options, value)
    }
}

/// An [`OptionError`] for `flag` given `value`.
pub(crate) fn bad_value(flag: &'static str, value: &OptionValue, detail: &str) -> OptionError {
    OptionError {
        flag,
        value: match value {
            OptionValue::Switch => String::new(),
            OptionValue::Number(n) => n.to_string(),
            OptionValue::Name(s) => s.clone(),
        },
        detail: detail.into(),
    }
}

/// The number of a value that must be one, else an error naming `flag`.
pub(crate) fn number(flag: &'static str, value: &OptionValue) -> Result<u64, OptionError> {
    match value {
        OptionValue::Number(n) => Ok(*n),
        other => Err(bad_value(flag, other, "expected a number")),
    }
}

/// A socket buffer size in 1 byte..=1 GiB, else an error naming `flag`.
fn buffer_bytes(flag: &'static str, value: &OptionValue) -> Result<u32, OptionError> {
    let n = number(flag, value)?;
    u32::try_from(n)
        .ok()
        .filter(|&b| b > 0 && b <= MAX_SOCKET_BUFFER_BYTES)
        .ok_or_else(|| bad_value(flag, value, "must be between 1 byte and 1G"))
}

/// `--sndbuf BYTES`: SO_SNDBUF of the data flow (socket transports).
pub(crate) static SNDBUF: OptionDecl = OptionDecl {
    flag: "sndbuf",
    kind: OptionKind::Bytes,
    value_name: "BYTES",
    help: "SO_SNDBUF of the data flow, e.g. 512K.",
    record: |o, v| {
        o.sndbuf_bytes = Some(buffer_bytes("sndbuf", v)?);
        Ok(())
    },
};

/// `--rcvbuf BYTES`: SO_RCVBUF of the data flow (socket transports).
pub(crate) static RCVBUF: OptionDecl = OptionDecl {
    flag: "rcvbuf",
    kind: OptionKind::Bytes,
    value_name: "BYTES",
    help: "SO_RCVBUF of the data flow, e.g. 512K.",
    record: |o, v| {
        o.rcvbuf_bytes = Some(buffer_bytes("rcvbuf", v)?);
        Ok(())
    },
};

/// The socket buffer options alone: what unix and udp honour.
pub(crate) static SOCKET_BUFFERS: &[&OptionDecl] = &[&SNDBUF, &RCVBUF];

/// `--preload-relayed`: the programs a workload runs under netgap's preload
/// library across hosts send through their hosts' relays instead of
/// asking for direct connections (each program driving the xdp transport
/// on an AF_XDP socket of its own), as they do by default: the path
/// before direct connections, to compare with them. The agents' roles
/// give the programs `NETGAP_PRELOAD_DIRECT=0` (`netgap_workload::preload`).
/// The workload plan refuses it for a point whose roles wrap no programs.
pub(crate) static PRELOAD_RELAYED: OptionDecl = OptionDecl {
    flag: "preload-relayed",
    kind: OptionKind::Switch,
    value_name: "",
    help: "Programs a workload runs under the preload library (web, gather --responder gmond, pipeline --stages program) send through the relays instead of connecting directly over AF_XDP.",
    record: |o, _| {
        o.preload_relayed = true;
        Ok(())
    },
};

/// The options xdp honours: its wrapped programs' path (its own flows take
/// none).
pub(crate) static XDP: &[&OptionDecl] = &[&PRELOAD_RELAYED];

/// Every option of every registered transport, each once, in registry
/// order (a transport's own order within it): the flags of the command line.
pub fn all() -> Vec<&'static OptionDecl> {
    let mut out: Vec<&'static OptionDecl> = Vec::new();
    for t in crate::registry() {
        for &o in t.capabilities().options {
            if !out.iter().any(|x| x.flag == o.flag) {
                out.push(o);
            }
        }
    }
    out
}

/// The option whose flag is `flag` (without dashes), if any transport has it.
pub fn find(flag: &str) -> Option<&'static OptionDecl> {
    all().into_iter().find(|o| o.flag == flag)
}

/// The transports that honour `option`, in registry order.
pub fn transports_taking(option: &OptionDecl) -> Vec<&'static str> {
    crate::registry()
        .iter()
        .filter(|t| t.capabilities().options.contains(&option))
        .map(|t| t.name())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_unique_and_each_is_taken_by_some_transport() {
        let all = all();
        for (i, o) in all.iter().enumerate() {
            assert!(all[..i].iter().all(|x| x.flag != o.flag), "{}", o.flag);
            assert!(!transports_taking(o).is_empty(), "{}", o.flag);
            assert_eq!(o.kind == OptionKind::Switch, o.value_name.is_empty());
        }
        assert_eq!(find("sndbuf").map(|o| o.flag), Some("sndbuf"));
    }

    #[test]
    fn recording_checks_the_range_and_names_the_flag() {
        let mut o = TransportOptions::default();
        SNDBUF
            .apply_value(&mut o, &OptionValue::Number(4096))
            .expect("in range");
        assert_eq!(o.sndbuf_bytes, Some(4096));
        let e = RCVBUF
            .apply_value(&mut o, &OptionValue::Number(0))
            .expect_err("zero");
        assert_eq!(e.to_string(), "--rcvbuf 0: must be between 1 byte and 1G");
    }

    #[test]
    fn preload_relayed_is_xdp_s_alone_and_recorded_as_given() {
        assert_eq!(find("preload-relayed"), Some(&PRELOAD_RELAYED));
        assert_eq!(transports_taking(&PRELOAD_RELAYED), ["xdp"]);
        let mut o = TransportOptions::default();
        assert!(!o.preload_relayed);
        PRELOAD_RELAYED
            .apply_value(&mut o, &OptionValue::Switch)
            .expect("a switch");
        assert_eq!(
            o,
            TransportOptions {
                preload_relayed: true,
                ..TransportOptions::default()
            }
        );
    }
}
