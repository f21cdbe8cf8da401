//! Link conditions as data: the MTU, offloads, rate limit, delay and loss
//! of a testbed's links, their parsing and their limits.
//!
//! [`LinkConditions`] is the full state of a testbed's links, as its hosts
//! file records it and every record's `stack.path` reports it. A
//! [`Condition`] sets some of those keys (`mtu=9000 offload=off`); the
//! conditions of one `--conditions` run are the cross product of the lists
//! given per key ([`cross`]).
//!
//! Plain code: the testbed applies these to its links,
//! and the measurement crate switches between them through its
//! `ConditionSwitch` seam; neither lives here.

use crate::stack::PathIdentity;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Smallest MTU a testbed link takes, in bytes (IPv4's minimum datagram).
pub const MIN_MTU_BYTES: u32 = 576;
/// Largest MTU a testbed link takes, in bytes.
pub const MAX_MTU_BYTES: u32 = 65_535;
/// Smallest rate limit, in bit/s.
pub const MIN_RATE_BPS: u64 = 8_000;
/// Largest rate limit, in bit/s.
pub const MAX_RATE_BPS: u64 = 1_000_000_000_000;
/// Longest added delay, in microseconds (netem takes more, no test needs it).
pub const MAX_DELAY_US: u64 = 10_000_000;
/// Loss is kept in parts per million: 100% is this.
pub const LOSS_PPM_ALL: u32 = 1_000_000;
/// Most conditions one run may alternate between.
pub const MAX_CONDITIONS: usize = 64;
/// The rate limiter's bucket at 1 Gbit/s, in bytes: two 64 KiB GSO packets
/// and their headers. With one (65,664 bytes) the rate held on a quiet
/// machine, but the shaper waited for its timer before nearly every
/// packet, and that cost the machine more than the stacks it carried: a
/// stream at 1 Gbit/s took 52% of a 2-vCPU machine's CPUs against 4 to 5%
/// with two, and three links at once kept it 98% busy (75% in softirq) and
/// reached 2.11 to 2.24 of their 2.869 Gbit/s, against 2.866 to 2.869 with
/// two (BENCHMARKS.md, "Shaper: the bucket per rate"). A larger bucket lets
/// more through at memory speed after an idle moment, which the path's
/// physics counts (`PathIdentity::bucket_bytes`).
pub const SHAPER_GSO_BUCKET_BYTES: u64 = 2 * (65_536 + 128);

/// The longest the GSO bucket may last at a link's rate, in microseconds
/// (two GSO packets last 1,051 µs at 1 Gbit/s). On a slower link two GSO
/// packets would be most of what a short trial moves: 10.5 ms of a
/// 100 Mbit/s link and 105 ms of a 10 Mbit/s one, so a NetPIPE block that
/// fit the bucket crossed a "10 Mbit/s" link at 2.3 Gbit/s after every
/// switch of the links. There the shaper's timer is cheap (a few hundred
/// wakes a second), and TBF cuts a GSO packet larger than its bucket into
/// the link's frames, so the bucket is what this lasts, or two frames.
pub const SHAPER_GSO_HOLD_MAX_US: u64 = 1_100;

/// How long the rate limiter's bucket holds its link busy at its rate, at
/// least, in microseconds: a timer that fires later than the bucket lasts
/// leaves the link idle. Measured at 10 Gbit/s, where two GSO packets last
/// 105 µs: 262,144 bytes held the rate within 2% at MTU 1500 but not at
/// 9000 (0.974 to 0.98), 1 MiB (840 µs) held it at both, offloads on and
/// off (0.970 to 0.998 of the payload limit); at 5 Gbit/s 262,144 bytes
/// held it (0.998) where two GSO packets did not at MTU 9000 (0.897).
pub const SHAPER_HOLD_US: u64 = 840;

/// The rate limiter's bucket for links of `mtu_bytes` shaped to
/// `rate_bps`, in bytes: [`SHAPER_GSO_BUCKET_BYTES`] or
/// [`SHAPER_GSO_HOLD_MAX_US`] of the rate, whichever is less (slow links),
/// at least two frames of the link's MTU, and at least [`SHAPER_HOLD_US`]
/// of the rate (the faster links).
pub fn shaper_bucket_bytes(mtu_bytes: u32, rate_bps: u64) -> u64 {
    let at_rate = |us: u64| {
        u64::try_from(u128::from(rate_bps) / 8 * u128::from(us) / 1_000_000).unwrap_or(u64::MAX)
    };
    SHAPER_GSO_BUCKET_BYTES
        .min(at_rate(SHAPER_GSO_HOLD_MAX_US))
        .max(2 * (u64::from(mtu_bytes) + 14))
        .max(at_rate(SHAPER_HOLD_US))
}

/// What drops the added loss of a testbed's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossMechanism {
    /// The kernel's netem qdisc.
    Netem,
    /// A random-drop rule of nftables (`numgen random`), where the kernel
    /// has no netem.
    Nftables,
}

impl LossMechanism {
    /// Its name in records and the hosts file.
    pub fn as_str(self) -> &'static str {
        match self {
            LossMechanism::Netem => "netem",
            LossMechanism::Nftables => "nftables",
        }
    }
}

/// The state of a testbed's links, the same on every link end (and bridge
/// port): what `netgap testbed up` and `netgap testbed set` put in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConditions {
    /// MTU of every link end in bytes.
    pub mtu_bytes: u32,
    /// Segmentation, receive and checksum offloads (TSO, GSO, GRO, rx and tx
    /// checksum) all on or all off; `None` leaves the kernel's defaults.
    #[serde(default)]
    pub offload: Option<bool>,
    /// Rate limit in bit/s (a TBF at the shaping point toward each host).
    #[serde(default)]
    pub rate_bps: Option<u64>,
    /// Added one-way delay per link direction in microseconds (netem).
    #[serde(default)]
    pub delay_us: Option<u64>,
    /// Added loss per link direction in parts per million.
    #[serde(default)]
    pub loss_ppm: Option<u32>,
    /// The rate limiter's bucket in bytes ([`shaper_bucket_bytes`]), when a
    /// rate is set; `None` in a hosts file from before it was recorded.
    #[serde(default)]
    pub bucket_bytes: Option<u64>,
    /// What drops the loss, when a loss is set.
    #[serde(default)]
    pub loss_by: Option<LossMechanism>,
}

impl LinkConditions {
    /// Unshaped links with the kernel's offloads at `mtu_bytes`.
    pub fn plain(mtu_bytes: u32) -> LinkConditions {
        LinkConditions {
            mtu_bytes,
            offload: None,
            rate_bps: None,
            delay_us: None,
            loss_ppm: None,
            bucket_bytes: None,
            loss_by: None,
        }
    }

    /// These conditions with the bucket of the rule when a rate is set, and
    /// `loss_by` only while a loss is.
    fn with_rule_bucket(self) -> LinkConditions {
        LinkConditions {
            bucket_bytes: self
                .rate_bps
                .map(|r| shaper_bucket_bytes(self.mtu_bytes, r)),
            loss_by: self.loss_ppm.and(self.loss_by),
            ..self
        }
    }

    /// These conditions as a shaper applies them: the bucket of the rule
    /// ([`shaper_bucket_bytes`]) when a rate is set, and `loss_by` when a
    /// loss is.
    pub fn shaped_by(&self, loss_by: LossMechanism) -> LinkConditions {
        LinkConditions {
            bucket_bytes: self
                .rate_bps
                .map(|r| shaper_bucket_bytes(self.mtu_bytes, r)),
            loss_by: self.loss_ppm.map(|_| loss_by),
            ..*self
        }
    }

    /// Whether `other` sets the same keys (MTU, offload, rate, delay,
    /// loss), however a shaper applies them.
    pub fn same_setting(&self, other: &LinkConditions) -> bool {
        let keys =
            |c: &LinkConditions| (c.mtu_bytes, c.offload, c.rate_bps, c.delay_us, c.loss_ppm);
        keys(self) == keys(other)
    }

    /// Whether netem is needed: a delay, or a loss netem drops.
    pub fn needs_netem(&self) -> bool {
        self.delay_us.is_some()
            || (self.loss_ppm.is_some() && self.loss_by != Some(LossMechanism::Nftables))
    }

    /// The root queueing discipline of every link end: `tbf`, `netem`,
    /// `netem+tbf` (netem at the root, TBF its child), or `noqueue` (veth's
    /// default) when nothing is shaped.
    pub fn qdisc(&self) -> &'static str {
        match (self.needs_netem(), self.rate_bps.is_some()) {
            (true, true) => "netem+tbf",
            (true, false) => "netem",
            (false, true) => "tbf",
            (false, false) => "noqueue",
        }
    }

    /// Adds what these conditions say to a path whose kind, MTU and
    /// offloads came from the ends' host facts: the testbed's topology, the
    /// rate, delay, loss and queueing discipline; the MTU and offload state
    /// where the facts did not have them.
    pub fn fill_path(&self, path: &mut PathIdentity, topology: &str) {
        path.kind = Some("testbed".into());
        path.topology = Some(topology.to_string());
        path.mtu_bytes = path.mtu_bytes.or(Some(self.mtu_bytes));
        if path.offload.is_none() {
            path.offload = self.offload.map(|on| if on { "on" } else { "off" }.into());
        }
        path.rate_bps = self.rate_bps;
        path.delay_us = self.delay_us;
        path.loss_ppm = self.loss_ppm;
        path.loss_by = self
            .loss_ppm
            .and(self.loss_by)
            .map(|m| m.as_str().to_string());
        path.bucket_bytes = self.rate_bps.and(self.bucket_bytes);
        path.qdisc = Some(self.qdisc().into());
    }

    /// Checks the ranges; the error names the key.
    pub fn check(&self) -> Result<(), ConditionError> {
        check_mtu(self.mtu_bytes)?;
        if let Some(r) = self.rate_bps {
            check_rate(r, &r.to_string())?;
        }
        if let Some(d) = self.delay_us {
            if d > MAX_DELAY_US {
                return Err(ConditionError::Range {
                    key: "delay",
                    value: format!("{d}us"),
                    range: "0 to 10s",
                });
            }
        }
        if let Some(l) = self.loss_ppm {
            if l > LOSS_PPM_ALL {
                return Err(ConditionError::Range {
                    key: "loss",
                    value: format!("{l}ppm"),
                    range: "0% to 100%",
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for LinkConditions {
    /// `MTU 9000, offload off, 1 Gbit/s, delay 1 ms, loss 0.1%, qdisc
    /// netem+tbf`: what `testbed status` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MTU {}", self.mtu_bytes)?;
        match self.offload {
            Some(true) => write!(f, ", offload on")?,
            Some(false) => write!(f, ", offload off")?,
            None => write!(f, ", offload as the kernel set it")?,
        }
        if let Some(r) = self.rate_bps {
            write!(f, ", rate {r} bit/s")?;
        }
        if let Some(d) = self.delay_us {
            write!(f, ", delay {d} us")?;
        }
        if let Some(b) = self.bucket_bytes.filter(|_| self.rate_bps.is_some()) {
            write!(f, ", bucket {b} B")?;
        }
        if let Some(l) = self.loss_ppm {
            write!(f, ", loss {}%", f64::from(l) / 10_000.0)?;
            if let Some(m) = self.loss_by {
                write!(f, " by {}", m.as_str())?;
            }
        }
        write!(f, ", qdisc {}", self.qdisc())
    }
}

/// Some keys of [`LinkConditions`] set to a value; the keys left `None`
/// keep what is in force. One condition of `--conditions`, or what
/// `testbed set` changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Condition {
    /// `mtu=BYTES`.
    pub mtu_bytes: Option<u32>,
    /// `offload=on|off`.
    pub offload: Option<bool>,
    /// `rate=RATE`, or `rate=none` (`Some(None)`) for no limit.
    pub rate_bps: Option<Option<u64>>,
    /// `delay=DUR` in microseconds; 0 for none.
    pub delay_us: Option<u64>,
    /// `loss=PCT` in parts per million; 0 for none.
    pub loss_ppm: Option<u32>,
}

impl Condition {
    /// `base` with this condition's keys set.
    pub fn apply_to(&self, base: &LinkConditions) -> LinkConditions {
        LinkConditions {
            mtu_bytes: self.mtu_bytes.unwrap_or(base.mtu_bytes),
            offload: self.offload.or(base.offload),
            rate_bps: self.rate_bps.unwrap_or(base.rate_bps),
            delay_us: self
                .delay_us
                .map_or(base.delay_us, |d| (d > 0).then_some(d)),
            loss_ppm: self
                .loss_ppm
                .map_or(base.loss_ppm, |l| (l > 0).then_some(l)),
            // How the shaper applies them is the testbed's to say (a
            // switch returns them applied); until then, the bucket of the
            // rule and the mechanism that drops the base's loss, if any.
            bucket_bytes: None,
            loss_by: base.loss_by,
        }
        .with_rule_bucket()
    }

    /// Whether the condition sets no key.
    pub fn is_empty(&self) -> bool {
        *self == Condition::default()
    }

    /// Merges the keys of `other` into this one; `Err` with the key's name
    /// when both set it.
    fn merge(&mut self, other: &Condition) -> Result<(), &'static str> {
        fn take<T: Copy>(
            a: &mut Option<T>,
            b: Option<T>,
            key: &'static str,
        ) -> Result<(), &'static str> {
            match (&a, b) {
                (Some(_), Some(_)) => Err(key),
                (None, Some(v)) => {
                    *a = Some(v);
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        take(&mut self.mtu_bytes, other.mtu_bytes, "mtu")?;
        take(&mut self.offload, other.offload, "offload")?;
        take(&mut self.rate_bps, other.rate_bps, "rate")?;
        take(&mut self.delay_us, other.delay_us, "delay")?;
        take(&mut self.loss_ppm, other.loss_ppm, "loss")?;
        Ok(())
    }
}

impl fmt::Display for Condition {
    /// `mtu=9000 offload=off`, in key order, as the user would type it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(m) = self.mtu_bytes {
            parts.push(format!("mtu={m}"));
        }
        if let Some(o) = self.offload {
            parts.push(format!("offload={}", if o { "on" } else { "off" }));
        }
        match self.rate_bps {
            Some(Some(r)) => parts.push(format!("rate={r}")),
            Some(None) => parts.push("rate=none".into()),
            None => {}
        }
        if let Some(d) = self.delay_us {
            parts.push(format!("delay={d}us"));
        }
        if let Some(l) = self.loss_ppm {
            parts.push(format!("loss={}%", f64::from(l) / 10_000.0));
        }
        f.write_str(&parts.join(" "))
    }
}

/// A condition or condition value that cannot be used. One line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    /// Not `KEY=V1,V2,...`.
    #[error("{0:?}: want KEY=VALUE[,VALUE...] with KEY one of mtu, offload, rate, delay, loss (e.g. mtu=1500,9000 offload=on,off)")]
    Syntax(String),
    /// A key netgap does not know.
    #[error("unknown condition key {0:?}: want mtu, offload, rate, delay or loss")]
    UnknownKey(String),
    /// A value that does not parse.
    #[error("{key}={value}: {want}")]
    Value {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What the key takes.
        want: &'static str,
    },
    /// A value out of range.
    #[error("{key}={value}: want {range}")]
    Range {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// The allowed range.
        range: &'static str,
    },
    /// The same value twice in a key's list.
    #[error("{key}={value} is listed twice")]
    Duplicate {
        /// The key.
        key: &'static str,
        /// The value.
        value: String,
    },
    /// The same key in two lists.
    #[error("condition key {0} is given twice; list all its values once, e.g. {0}=A,B")]
    DuplicateKey(&'static str),
    /// A cross product too large to interleave.
    #[error("{0} conditions: at most {MAX_CONDITIONS} can be interleaved in one run")]
    TooMany(usize),
}

impl ConditionError {
    /// The same error worded for a command-line flag that takes one value
    /// (`--rate fast: want a rate like 1G, ...`).
    pub fn for_flag(&self, flag: &str) -> String {
        match self {
            ConditionError::Value { value, want, .. } => format!("{flag} {value}: want {want}"),
            ConditionError::Range { value, range, .. } => format!("{flag} {value}: want {range}"),
            other => format!("{flag}: {other}"),
        }
    }
}

fn check_mtu(m: u32) -> Result<(), ConditionError> {
    if (MIN_MTU_BYTES..=MAX_MTU_BYTES).contains(&m) {
        Ok(())
    } else {
        Err(ConditionError::Range {
            key: "mtu",
            value: m.to_string(),
            range: "576 to 65535 bytes",
        })
    }
}

fn check_rate(bps: u64, text: &str) -> Result<(), ConditionError> {
    if (MIN_RATE_BPS..=MAX_RATE_BPS).contains(&bps) {
        Ok(())
    } else {
        Err(ConditionError::Range {
            key: "rate",
            value: text.to_string(),
            range: "8K to 1000G bit/s",
        })
    }
}

/// Parses a rate in bit/s: a number with an optional K, M or G (powers of
/// 1000) and an optional `bit`/`bps` (`1G`, `100Mbit`, `2.5G`), between
/// [`MIN_RATE_BPS`] and [`MAX_RATE_BPS`].
pub fn parse_rate_bps(s: &str) -> Result<u64, ConditionError> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let lower = lower
        .strip_suffix("bps")
        .or_else(|| lower.strip_suffix("bit"))
        .unwrap_or(&lower);
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1e3),
        Some('m') => (&lower[..lower.len() - 1], 1e6),
        Some('g') => (&lower[..lower.len() - 1], 1e9),
        _ => (lower, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| ConditionError::Value {
        key: "rate",
        value: t.to_string(),
        want: "a rate like 1G, 100M or 10000000 (bit/s)",
    })?;
    let bps = v * mult;
    if !bps.is_finite() || bps < 0.0 || bps > MAX_RATE_BPS as f64 {
        return Err(ConditionError::Range {
            key: "rate",
            value: t.to_string(),
            range: "8K to 1000G bit/s",
        });
    }
    let bps = bps as u64;
    check_rate(bps, t)?;
    Ok(bps)
}

/// Parses a rate or `none`/`off` (no limit).
pub fn parse_rate_setting(s: &str) -> Result<Option<u64>, ConditionError> {
    match s.trim() {
        "none" | "off" => Ok(None),
        other => parse_rate_bps(other).map(Some),
    }
}

/// Parses a delay (`5ms`, `250us`, `0`) into microseconds; 0 means none.
pub fn parse_delay_us(s: &str) -> Result<u64, ConditionError> {
    let t = s.trim();
    if t == "0" || t == "none" || t == "off" {
        return Ok(0);
    }
    let d = crate::units::parse_duration(t).map_err(|_| ConditionError::Value {
        key: "delay",
        value: t.to_string(),
        want: "a duration like 5ms, 250us or 0",
    })?;
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if us > MAX_DELAY_US {
        return Err(ConditionError::Range {
            key: "delay",
            value: t.to_string(),
            range: "0 to 10s",
        });
    }
    Ok(us)
}

/// Parses a loss in percent (`0.1%`, `1`, `0`) into parts per million; 0
/// means none.
pub fn parse_loss_ppm(s: &str) -> Result<u32, ConditionError> {
    let t = s.trim();
    let pct: f64 = t
        .trim_end_matches('%')
        .parse()
        .map_err(|_| ConditionError::Value {
            key: "loss",
            value: t.to_string(),
            want: "a percentage like 0.1% or 1",
        })?;
    if !(0.0..=100.0).contains(&pct) {
        return Err(ConditionError::Range {
            key: "loss",
            value: t.to_string(),
            range: "0% to 100%",
        });
    }
    Ok((pct * 10_000.0).round() as u32)
}

/// Parses `on` or `off`.
pub fn parse_offload(s: &str) -> Result<bool, ConditionError> {
    match s.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(ConditionError::Value {
            key: "offload",
            value: other.to_string(),
            want: "on or off",
        }),
    }
}

/// Parses an MTU in bytes.
pub fn parse_mtu(s: &str) -> Result<u32, ConditionError> {
    let t = s.trim();
    let m: u32 = t.parse().map_err(|_| ConditionError::Value {
        key: "mtu",
        value: t.to_string(),
        want: "a size in bytes, 576 to 65535",
    })?;
    check_mtu(m)?;
    Ok(m)
}

/// Parses one value of a key into the condition that sets it.
type ValueParser = fn(&str) -> Result<Condition, ConditionError>;

/// One key with its list of values (`mtu=1500,9000`), each value a
/// [`Condition`] setting that key alone, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionAxis {
    /// The key, as typed.
    pub key: &'static str,
    /// One condition per value.
    pub values: Vec<Condition>,
}

impl ConditionAxis {
    /// Parses `KEY=V1,V2,...`.
    pub fn parse(text: &str) -> Result<ConditionAxis, ConditionError> {
        let (key, list) = text
            .split_once('=')
            .ok_or_else(|| ConditionError::Syntax(text.to_string()))?;
        let key = key.trim();
        let items: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .collect();
        if items.is_empty() {
            return Err(ConditionError::Syntax(text.to_string()));
        }
        let (key, parse): (&'static str, ValueParser) = match key {
            "mtu" => ("mtu", |v| {
                Ok(Condition {
                    mtu_bytes: Some(parse_mtu(v)?),
                    ..Condition::default()
                })
            }),
            "offload" => ("offload", |v| {
                Ok(Condition {
                    offload: Some(parse_offload(v)?),
                    ..Condition::default()
                })
            }),
            "rate" => ("rate", |v| {
                Ok(Condition {
                    rate_bps: Some(parse_rate_setting(v)?),
                    ..Condition::default()
                })
            }),
            "delay" => ("delay", |v| {
                Ok(Condition {
                    delay_us: Some(parse_delay_us(v)?),
                    ..Condition::default()
                })
            }),
            "loss" => ("loss", |v| {
                Ok(Condition {
                    loss_ppm: Some(parse_loss_ppm(v)?),
                    ..Condition::default()
                })
            }),
            other => return Err(ConditionError::UnknownKey(other.to_string())),
        };
        let mut values: Vec<Condition> = Vec::new();
        for item in items {
            let c = parse(item)?;
            if values.contains(&c) {
                return Err(ConditionError::Duplicate {
                    key,
                    value: item.to_string(),
                });
            }
            values.push(c);
        }
        Ok(ConditionAxis { key, values })
    }
}

impl fmt::Display for ConditionAxis {
    /// `KEY=V1,V2,...`, as [`ConditionAxis::parse`] reads it back: each
    /// value sets this key alone, so its [`Condition`]'s own text is
    /// `KEY=VALUE`, and the values follow one `KEY=`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = format!("{}=", self.key);
        let values: Vec<String> = self
            .values
            .iter()
            .map(|c| {
                let text = c.to_string();
                text.strip_prefix(&prefix)
                    .map(str::to_string)
                    .unwrap_or(text)
            })
            .collect();
        write!(f, "{prefix}{}", values.join(","))
    }
}

/// The cross product of the axes, the first axis varying slowest:
/// `mtu=1500,9000 offload=on,off` gives (1500, on), (1500, off), (9000,
/// on), (9000, off). No axes give no conditions.
pub fn cross(axes: &[ConditionAxis]) -> Result<Vec<Condition>, ConditionError> {
    for (i, a) in axes.iter().enumerate() {
        if axes[..i].iter().any(|b| b.key == a.key) {
            return Err(ConditionError::DuplicateKey(a.key));
        }
    }
    let total = axes
        .iter()
        .try_fold(1usize, |n, a| n.checked_mul(a.values.len()))
        .unwrap_or(usize::MAX);
    if total > MAX_CONDITIONS {
        return Err(ConditionError::TooMany(total));
    }
    if axes.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = vec![Condition::default()];
    for a in axes {
        let mut next = Vec::with_capacity(out.len() * a.values.len());
        for c in &out {
            for v in &a.values {
                let mut m = *c;
                m.merge(v).map_err(ConditionError::DuplicateKey)?;
                next.push(m);
            }
        }
        out = next;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(s: &str) -> ConditionAxis {
        ConditionAxis::parse(s).expect("parses")
    }

    #[test]
    fn an_axis_reads_back_from_its_text() {
        for text in [
            "mtu=1500,9000",
            "offload=on,off",
            "rate=1G,none",
            "rate=2500000",
            "delay=0,250us,5ms",
            "loss=0,0.1%,1%",
        ] {
            let a = axis(text);
            assert_eq!(axis(&a.to_string()), a, "{text} as {a}");
        }
        assert_eq!(axis("offload=on,off").to_string(), "offload=on,off");
        assert_eq!(axis("mtu= 1500 ,9000").to_string(), "mtu=1500,9000");
    }

    #[test]
    fn axes_parse_each_key() {
        let a = axis("mtu=1500,9000");
        assert_eq!(a.key, "mtu");
        assert_eq!(
            a.values.iter().map(|c| c.mtu_bytes).collect::<Vec<_>>(),
            [Some(1500), Some(9000)]
        );
        assert_eq!(axis("offload=on,off").values[1].offload, Some(false));
        assert_eq!(
            axis("rate=1G,none")
                .values
                .iter()
                .map(|c| c.rate_bps)
                .collect::<Vec<_>>(),
            [Some(Some(1_000_000_000)), Some(None)]
        );
        assert_eq!(axis("delay=5ms,0").values[0].delay_us, Some(5000));
        assert_eq!(axis("loss=0.1%,1").values[0].loss_ppm, Some(1000));
        assert_eq!(axis("loss=0.1%,1").values[1].loss_ppm, Some(10_000));
    }

    #[test]
    fn bad_axes_are_refused_with_the_key() {
        for (text, needle) in [
            ("mtu", "want KEY=VALUE"),
            ("mtu=", "want KEY=VALUE"),
            ("speed=1G", "unknown condition key \"speed\""),
            ("mtu=100", "mtu=100: want 576 to 65535"),
            ("mtu=big", "mtu=big: a size in bytes"),
            ("offload=maybe", "offload=maybe: on or off"),
            ("rate=fast", "rate=fast"),
            ("rate=1", "8K to 1000G"),
            ("delay=soon", "delay=soon"),
            ("loss=200", "0% to 100%"),
            ("mtu=1500,1500", "listed twice"),
        ] {
            let e = ConditionAxis::parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert_eq!(e.lines().count(), 1);
        }
    }

    #[test]
    fn the_cross_product_varies_the_first_key_slowest() {
        let c = cross(&[axis("mtu=1500,9000"), axis("offload=on,off")]).expect("crosses");
        let shown: Vec<String> = c.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "mtu=1500 offload=on",
                "mtu=1500 offload=off",
                "mtu=9000 offload=on",
                "mtu=9000 offload=off"
            ]
        );
        assert!(cross(&[]).expect("empty").is_empty());
        assert!(matches!(
            cross(&[axis("mtu=1500"), axis("mtu=9000")]),
            Err(ConditionError::DuplicateKey("mtu"))
        ));
        let big = axis(&format!(
            "mtu={}",
            (0..9)
                .map(|i| (1500 + i).to_string())
                .collect::<Vec<_>>()
                .join(",")
        ));
        let many = cross(&[big.clone(), big.clone()]);
        assert!(matches!(many, Err(ConditionError::DuplicateKey(_))));
        let rates = axis(&format!(
            "rate={}",
            (1..=9)
                .map(|i| format!("{i}G"))
                .collect::<Vec<_>>()
                .join(",")
        ));
        assert!(matches!(
            cross(&[big, rates]),
            Err(ConditionError::TooMany(81))
        ));
    }

    #[test]
    fn a_condition_keeps_the_keys_it_does_not_set() {
        let base = LinkConditions {
            mtu_bytes: 1500,
            offload: Some(true),
            rate_bps: Some(1_000_000_000),
            delay_us: Some(1000),
            loss_ppm: None,
            bucket_bytes: Some(65_664),
            loss_by: None,
        };
        let c = Condition {
            mtu_bytes: Some(9000),
            rate_bps: Some(None),
            delay_us: Some(0),
            ..Condition::default()
        };
        let to = c.apply_to(&base);
        assert_eq!(to.mtu_bytes, 9000);
        assert_eq!(to.offload, Some(true));
        assert_eq!((to.rate_bps, to.delay_us), (None, None));
        assert_eq!(base.qdisc(), "netem+tbf");
        assert_eq!(to.qdisc(), "noqueue");
        let mut path = PathIdentity::default();
        base.fill_path(&mut path, "switch");
        assert_eq!(path.kind.as_deref(), Some("testbed"));
        assert_eq!(path.offload.as_deref(), Some("on"));
        assert_eq!(path.rate_bps, Some(1_000_000_000));
        assert_eq!(path.qdisc.as_deref(), Some("netem+tbf"));
        assert_eq!(path.bucket_bytes, Some(65_664));
        assert_eq!(path.loss_by, None);
    }

    #[test]
    fn a_shaper_states_its_bucket_and_what_drops_the_loss() {
        assert_eq!(
            shaper_bucket_bytes(1500, 1_000_000_000),
            SHAPER_GSO_BUCKET_BYTES
        );
        // A slow link's bucket lasts SHAPER_GSO_HOLD_MAX_US at its rate,
        // or holds two frames: 13,750 bytes at 100 Mbit/s, two 1,514-byte
        // frames at 10 Mbit/s (1,375 bytes would last 1.1 ms), two jumbo
        // frames at 10 Mbit/s and MTU 9000.
        assert_eq!(shaper_bucket_bytes(1500, 100_000_000), 13_750);
        assert_eq!(shaper_bucket_bytes(9000, 100_000_000), 18_028);
        assert_eq!(shaper_bucket_bytes(1500, 10_000_000), 3_028);
        assert_eq!(shaper_bucket_bytes(9000, 10_000_000), 18_028);
        // Two frames of the largest MTU fit the GSO bucket, which holds
        // from about 1 Gbit/s up.
        assert!(2 * (u64::from(MAX_MTU_BYTES) + 14) <= SHAPER_GSO_BUCKET_BYTES);
        assert_eq!(
            shaper_bucket_bytes(MAX_MTU_BYTES, 1_000_000_000),
            SHAPER_GSO_BUCKET_BYTES
        );
        // A fast link's bucket lasts SHAPER_HOLD_US at its rate.
        assert_eq!(shaper_bucket_bytes(1500, 10_000_000_000), 1_050_000);
        assert_eq!(shaper_bucket_bytes(9000, 5_000_000_000), 525_000);
        assert_eq!(shaper_bucket_bytes(1500, MAX_RATE_BPS), 105_000_000);
        let mut c = LinkConditions::plain(1500);
        c.loss_ppm = Some(1000);
        assert!(c.needs_netem());
        let by_nft = c.shaped_by(LossMechanism::Nftables);
        assert!(!by_nft.needs_netem());
        assert_eq!(by_nft.qdisc(), "noqueue");
        assert_eq!(by_nft.bucket_bytes, None, "no rate, no bucket");
        c.rate_bps = Some(1_000_000_000);
        let shaped = c.shaped_by(LossMechanism::Nftables);
        assert_eq!(shaped.qdisc(), "tbf");
        assert_eq!(shaped.bucket_bytes, Some(SHAPER_GSO_BUCKET_BYTES));
        let mut path = PathIdentity::default();
        shaped.fill_path(&mut path, "mesh");
        assert_eq!(path.loss_by.as_deref(), Some("nftables"));
        assert_eq!(path.bucket_bytes, Some(SHAPER_GSO_BUCKET_BYTES));
        assert_eq!(
            shaped.to_string(),
            "MTU 1500, offload as the kernel set it, rate 1000000000 bit/s, bucket 131328 B, loss 0.1% by nftables, qdisc tbf"
        );
        // A condition applied to them keeps the mechanism of the loss and
        // takes the bucket of the rule at its MTU.
        let to = Condition {
            mtu_bytes: Some(9000),
            ..Condition::default()
        }
        .apply_to(&shaped);
        assert_eq!(
            to.bucket_bytes,
            Some(shaper_bucket_bytes(9000, 1_000_000_000))
        );
        assert_eq!(to.loss_by, Some(LossMechanism::Nftables));
        assert!(to.same_setting(&to.shaped_by(LossMechanism::Netem)));
        assert!(!to.same_setting(&shaped));
        let back: LinkConditions =
            serde_json::from_str(&serde_json::to_string(&shaped).expect("json")).expect("parse");
        assert_eq!(back, shaped);
    }

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate_bps("1G"), Ok(1_000_000_000));
        assert_eq!(parse_rate_bps("100Mbit"), Ok(100_000_000));
        assert_eq!(parse_rate_bps("2.5g"), Ok(2_500_000_000));
        assert_eq!(parse_rate_bps("10000000"), Ok(10_000_000));
        assert!(parse_rate_bps("fast").is_err());
        assert!(parse_rate_bps("0").is_err());
        assert!(parse_rate_bps("-1G").is_err());
        assert_eq!(parse_rate_setting("none"), Ok(None));
    }
}
