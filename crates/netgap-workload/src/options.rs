//! A workload's own options, each declared once by the workload that reads
//! it (`--trace zipf`, `--alpha 0.5,1.0`, `--preset vm`).
//!
//! A [`WorkloadOption`] is all netgap knows of one option: its flag, the
//! type of its value, its help, and whether a list of values makes one point
//! per value (an axis, like `--sizes`). The command line builds one flag per
//! distinct flag of [`all`] and hands the values on as typed text; the workload
//! plan parses them with the declaration ([`parse`]), refuses an option no
//! chosen workload declares, crosses the axes into points, and gives each
//! point's values ([`WorkloadArgs`]) to [`super::Workload::params`] and to
//! the record. No option name is repeated anywhere else.

use std::collections::BTreeMap;

/// The type of an option's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptionKind {
    /// A switch with no value (`--connection-per-request`).
    Switch,
    /// One of a fixed set of names (`--trace single|zipf`).
    Choice(&'static [&'static str]),
    /// A whole number in the unit its help states.
    Count {
        /// Smallest value allowed.
        min: u64,
        /// Largest value allowed.
        max: u64,
    },
    /// A size in bytes with an optional K, M, G suffix.
    Bytes {
        /// Smallest value allowed, in bytes.
        min: u64,
        /// Largest value allowed, in bytes.
        max: u64,
    },
    /// A decimal number (`--alpha 0.8`).
    Number {
        /// Smallest value allowed.
        min: f64,
        /// Largest value allowed.
        max: f64,
    },
    /// A subdirectory, relative, of the directory the agents that run the
    /// workload's roles allow (`--dir`): no absolute path, no `..`.
    Path,
    /// One list of whole numbers, comma separated (`--place 0,1,2,1`),
    /// each in range; the value is the list as text, normalized. Never an
    /// axis: its commas separate the list's entries.
    CountList {
        /// Smallest entry allowed.
        min: u64,
        /// Largest entry allowed.
        max: u64,
        /// Most entries.
        most: usize,
    },
}

/// One option of a workload.
#[derive(Debug)]
pub struct WorkloadOption {
    /// Long flag without the leading dashes; two workloads that declare the
    /// same flag declare it with the same kind.
    pub flag: &'static str,
    /// Type of the value.
    pub kind: OptionKind,
    /// Placeholder of the value in help; empty for a switch.
    pub value_name: &'static str,
    /// One line for `--help`.
    pub help: &'static str,
    /// A comma-separated list makes one point per value, crossed with the
    /// other axes; otherwise the option takes one value.
    pub axis: bool,
}

/// One value of an option, parsed by its [`OptionKind`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum OptionValue {
    /// The switch was given.
    Switch(bool),
    /// A choice, or a path.
    Name(String),
    /// A count, or a size in bytes.
    Whole(u64),
    /// A decimal number.
    Number(f64),
}

impl OptionValue {
    /// The value as a count or a size, if it is one.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            OptionValue::Whole(n) => Some(*n),
            _ => None,
        }
    }

    /// The value as a decimal number (counts too), if it is one.
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            OptionValue::Number(x) => Some(*x),
            OptionValue::Whole(n) => Some(*n as f64),
            _ => None,
        }
    }

    /// The value as a name or a path, if it is one.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            OptionValue::Name(s) => Some(s),
            _ => None,
        }
    }
}

/// The workload options of one point: one value per option given, by flag.
/// Options not given are absent; the workload applies its defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadArgs(pub BTreeMap<&'static str, OptionValue>);

impl WorkloadArgs {
    /// The value of `flag`, if given.
    pub(crate) fn get(&self, flag: &str) -> Option<&OptionValue> {
        self.0.get(flag)
    }

    /// The name or path given for `flag`, if any.
    pub(crate) fn str(&self, flag: &str) -> Option<&str> {
        self.get(flag).and_then(OptionValue::as_str)
    }

    /// The count or size given for `flag`, if any.
    pub(crate) fn u64(&self, flag: &str) -> Option<u64> {
        self.get(flag).and_then(OptionValue::as_u64)
    }

    /// The number (or count) given for `flag`, if any.
    pub(crate) fn f64(&self, flag: &str) -> Option<f64> {
        self.get(flag).and_then(OptionValue::as_f64)
    }

    /// Whether the switch `flag` was given.
    pub(crate) fn switch(&self, flag: &str) -> bool {
        matches!(self.get(flag), Some(OptionValue::Switch(true)))
    }

    /// The values as a JSON object, for the record.
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.0
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_string(),
                    serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
                )
            })
            .collect()
    }
}

/// A value that does not parse or is out of the option's range: one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag} {value}: {detail}")]
pub struct OptionError {
    /// The flag, without the leading dashes.
    pub flag: &'static str,
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub detail: String,
}

/// Every distinct option of every workload, in registry order; a flag two
/// workloads share appears once.
pub fn all() -> Vec<&'static WorkloadOption> {
    let mut out: Vec<&'static WorkloadOption> = Vec::new();
    for w in super::registry() {
        for o in w.options() {
            if !out.iter().any(|d| d.flag == o.flag) {
                out.push(o);
            }
        }
    }
    out
}

/// The workloads that declare `flag`, by name.
pub fn workloads_taking(flag: &str) -> Vec<&'static str> {
    super::registry()
        .iter()
        .filter(|w| w.options().iter().any(|o| o.flag == flag))
        .map(|w| w.name())
        .collect()
}

/// Parses `raw` as the option's values: a comma-separated list for an
/// axis, one value otherwise; a switch takes an empty `raw`.
pub fn parse(decl: &'static WorkloadOption, raw: &str) -> Result<Vec<OptionValue>, OptionError> {
    let err = |value: &str, detail: String| OptionError {
        flag: decl.flag,
        value: value.to_string(),
        detail,
    };
    if let OptionKind::Switch = decl.kind {
        return Ok(vec![OptionValue::Switch(true)]);
    }
    let items: Vec<&str> = if decl.axis {
        raw.split(',').map(str::trim).collect()
    } else {
        vec![raw.trim()]
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        if item.is_empty() {
            return Err(err(raw, "empty value".into()));
        }
        let v = match decl.kind {
            OptionKind::Switch => OptionValue::Switch(true),
            OptionKind::Choice(names) => {
                if !names.contains(&item) {
                    return Err(err(item, format!("must be one of {}", names.join(", "))));
                }
                OptionValue::Name(item.to_string())
            }
            OptionKind::Count { min, max } => {
                let n: u64 = item
                    .parse()
                    .map_err(|_| err(item, "not a whole number".into()))?;
                if n < min || n > max {
                    return Err(err(item, format!("must be between {min} and {max}")));
                }
                OptionValue::Whole(n)
            }
            OptionKind::Bytes { min, max } => {
                let n = netgap_core::units::parse_size_bytes(item)
                    .map_err(|e| err(item, e.to_string()))?;
                if n < min || n > max {
                    return Err(err(
                        item,
                        format!(
                            "must be between {} and {}",
                            netgap_core::units::format_size(min),
                            netgap_core::units::format_size(max)
                        ),
                    ));
                }
                OptionValue::Whole(n)
            }
            OptionKind::Number { min, max } => {
                let x: f64 = item.parse().map_err(|_| err(item, "not a number".into()))?;
                if !x.is_finite() || x < min || x > max {
                    return Err(err(item, format!("must be between {min} and {max}")));
                }
                OptionValue::Number(x)
            }
            OptionKind::CountList { min, max, most } => {
                let mut list = Vec::new();
                for x in item.split(',').map(str::trim) {
                    let n: u64 = x
                        .parse()
                        .map_err(|_| err(item, format!("{x:?} is not a whole number")))?;
                    if n < min || n > max {
                        return Err(err(item, format!("{n} is not between {min} and {max}")));
                    }
                    list.push(n.to_string());
                }
                if list.len() > most {
                    return Err(err(item, format!("more than {most} entries")));
                }
                OptionValue::Name(list.join(","))
            }
            OptionKind::Path => {
                if item.contains('\0') || item.len() > 4096 {
                    return Err(err(item, "not a usable path".into()));
                }
                // Checked here so the run stops before it starts; each
                // agent checks again what it is sent.
                crate::confined::relative_components(item, crate::pio::server::MAX_DIR_DEPTH)
                    .map_err(|e| err(item, e.to_string()))?;
                OptionValue::Name(item.to_string())
            }
        };
        out.push(v);
    }
    Ok(out)
}

/// The points' option values for one workload: every combination of the
/// axes' values (first axis slowest), each with the single-valued options.
pub fn cross(given: &[(&'static WorkloadOption, Vec<OptionValue>)]) -> Vec<WorkloadArgs> {
    let mut out = vec![WorkloadArgs::default()];
    for (decl, values) in given {
        let mut next = Vec::with_capacity(out.len() * values.len());
        for args in &out {
            for v in values {
                let mut a = args.clone();
                a.0.insert(decl.flag, v.clone());
                next.push(a);
            }
        }
        out = next;
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    static ALPHA: WorkloadOption = WorkloadOption {
        flag: "alpha",
        kind: OptionKind::Number { min: 0.0, max: 3.0 },
        value_name: "A[,A...]",
        help: "Zipf exponent.",
        axis: true,
    };
    static TRACE: WorkloadOption = WorkloadOption {
        flag: "trace",
        kind: OptionKind::Choice(&["single", "zipf"]),
        value_name: "NAME",
        help: "Request trace.",
        axis: false,
    };

    #[test]
    fn axes_cross_and_values_are_range_checked() {
        let a = parse(&ALPHA, "0.5, 1.0").unwrap();
        let t = parse(&TRACE, "zipf").unwrap();
        let points = cross(&[(&TRACE, t), (&ALPHA, a)]);
        assert_eq!(points.len(), 2);
        assert_eq!(points[1].get("alpha").unwrap().as_f64(), Some(1.0));
        assert_eq!(points[0].get("trace").unwrap().as_str(), Some("zipf"));
        assert!(parse(&ALPHA, "4")
            .unwrap_err()
            .to_string()
            .contains("between"));
        assert!(parse(&ALPHA, "0.5,,1").is_err());
        assert!(parse(&ALPHA, "nan").is_err());
        assert!(parse(&TRACE, "single,zipf").is_err());
        assert_eq!(
            parse(&TRACE, "x").unwrap_err().to_string(),
            "--trace x: must be one of single, zipf"
        );
    }

    #[test]
    fn a_count_list_is_one_value_checked_entry_by_entry() {
        static PLACE: WorkloadOption = WorkloadOption {
            flag: "place",
            kind: OptionKind::CountList {
                min: 0,
                max: 3,
                most: 4,
            },
            value_name: "H[,H...]",
            help: "Hosts.",
            axis: false,
        };
        let v = parse(&PLACE, "0, 1,3").unwrap();
        assert_eq!(v, vec![OptionValue::Name("0,1,3".into())]);
        assert!(parse(&PLACE, "0,4")
            .unwrap_err()
            .to_string()
            .contains("4 is not between"));
        assert!(parse(&PLACE, "0,x").is_err());
        assert!(parse(&PLACE, "0,1,2,3,0")
            .unwrap_err()
            .to_string()
            .contains("more than 4"));
    }

    #[test]
    fn a_flag_two_workloads_share_has_one_kind() {
        for w in super::super::registry() {
            for o in w.options() {
                let first = all().into_iter().find(|d| d.flag == o.flag).unwrap();
                assert_eq!(
                    first.kind, o.kind,
                    "--{} declared twice differently",
                    o.flag
                );
                assert_eq!(
                    first.axis, o.axis,
                    "--{} declared twice differently",
                    o.flag
                );
            }
        }
    }
}
