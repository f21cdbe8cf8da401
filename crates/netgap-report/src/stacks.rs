//! Series identity for the report and `compare`: a series is one stack
//! ([`Stack::of_record`]) on one pair of hosts with one set of the options
//! that change what is measured ([`Loaded::variant`]: the workload's own
//! options, the server it ran, pinning), never a merge of several.
//! Series shown together are labelled by what sets them apart
//! ([`Stack::distinguishing_labels`], then the variant entries and the
//! hosts that differ), and
//! a user names stacks on the command line by the parts of their
//! description ([`StackSelector`]).

use super::load::Loaded;
use netgap_core::spec::Mode;
use netgap_core::stack::Stack;
use std::collections::{BTreeMap, BTreeSet};

/// One series: a stack measured between the same hosts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeriesKey {
    /// What the points measured over.
    pub stack: Stack,
    /// Where they ran (`node2 -> node1`), when the records say.
    pub hosts: Option<String>,
    /// What else sets the points apart, as sorted `name=value` entries
    /// ([`Loaded::variant`]): workload options, server, pinning.
    pub variant: Vec<String>,
}

impl SeriesKey {
    /// The series of a record.
    pub fn of(l: &Loaded) -> SeriesKey {
        SeriesKey {
            stack: l.stack.clone(),
            hosts: l.hosts(),
            variant: l.variant.clone(),
        }
    }

    /// The key without its variant entry `name` (the figure's x axis, such
    /// as `alpha`), so points along that axis form one series.
    pub fn without(&self, name: &str) -> SeriesKey {
        let mut k = self.clone();
        k.variant.retain(|e| entry_name(e) != name);
        k
    }

    /// The key with the entry `name=value` added (a dimension a figure
    /// does not plot along, such as the size on a plot against clients).
    pub fn with_entry(&self, name: &str, value: &str) -> SeriesKey {
        let mut k = self.without(name);
        k.variant.push(format!("{name}={value}"));
        k.variant.sort();
        k
    }

    /// The series with its completion mode set aside: poll and event of
    /// the same stack share a family, so they are drawn side by side in the
    /// same colour.
    pub fn family(&self) -> SeriesKey {
        let mut f = self.clone();
        f.stack.mode = Mode::Event;
        f
    }

    /// Sort key that keeps a family's modes adjacent (event, then poll).
    pub fn order(&self) -> (SeriesKey, Mode) {
        (self.family(), self.stack.mode)
    }
}

/// The name of a variant entry: `alpha` of `alpha=0.8`.
pub fn entry_name(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(n, _)| n)
}

/// Labels for series shown together: by what sets their stacks apart, then
/// the variant entries whose values differ between them (an entry one
/// series lacks differs too), with ` @hosts` added when they ran on several
/// known hosts. Distinct series never share a label.
pub fn labels<'a>(keys: impl IntoIterator<Item = &'a SeriesKey>) -> BTreeMap<SeriesKey, String> {
    let keys: BTreeSet<&SeriesKey> = keys.into_iter().collect();
    let stacks: Vec<&Stack> = keys
        .iter()
        .map(|k| &k.stack)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let names: BTreeMap<&Stack, String> = stacks
        .iter()
        .copied()
        .zip(Stack::distinguishing_labels(&stacks))
        .collect();
    // Only known hosts count: an imported record, which names none, does
    // not make every netgap series say where it ran.
    let hosts: BTreeSet<&String> = keys.iter().filter_map(|k| k.hosts.as_ref()).collect();
    // Variant entries by name, and the names whose values differ.
    let value_of = |k: &SeriesKey, n: &str| -> Option<String> {
        k.variant.iter().find(|e| entry_name(e) == n).cloned()
    };
    let entry_names: BTreeSet<&str> = keys
        .iter()
        .flat_map(|k| k.variant.iter().map(|e| entry_name(e)))
        .collect();
    let varying: Vec<&str> = entry_names
        .into_iter()
        .filter(|n| {
            let values: BTreeSet<Option<String>> = keys.iter().map(|k| value_of(k, n)).collect();
            values.len() > 1
        })
        .collect();
    let mut out: BTreeMap<SeriesKey, String> = keys
        .iter()
        .map(|k| {
            let mut name = names.get(&k.stack).cloned().unwrap_or_default();
            for n in &varying {
                if let Some(e) = value_of(k, n) {
                    name.push_str(", ");
                    name.push_str(&e);
                }
            }
            if hosts.len() > 1 {
                if let Some(h) = &k.hosts {
                    name.push_str(" @");
                    name.push_str(h);
                }
            }
            ((*k).clone(), name)
        })
        .collect();
    // Keys that still share a label (an entry the set does not vary in
    // alone, or a stack label fallback) show every entry.
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for l in out.values() {
        *count.entry(l.clone()).or_default() += 1;
    }
    for (k, l) in out.iter_mut() {
        if count.get(l).copied().unwrap_or(0) > 1 && !k.variant.is_empty() {
            *l = format!("{}, {}", k.stack.describe(), k.variant.join(", "));
        }
    }
    out
}

/// The items of a stack's description (`tcp`, `event`, `MTU 9000`,
/// `offload off`, `[label]`, ...), the vocabulary a [`StackSelector`] uses.
pub(crate) fn parts(stack: &Stack) -> Vec<String> {
    let mut parts: Vec<String> = stack.describe().split(", ").map(str::to_string).collect();
    // Options are one item of the description, space separated; each is a
    // part of its own.
    parts.extend(stack.options.iter().cloned());
    parts
}

/// Why a stack selection is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The text names nothing.
    #[error("an empty stack selection; name parts of a stack such as \"tcp, MTU 9000\"")]
    Empty,
    /// No stack of the results matches.
    #[error("{flag} \"{text}\" matches no stack; the stacks are: {stacks}")]
    NoMatch {
        /// The flag that gave the selection.
        flag: String,
        /// The selection as given.
        text: String,
        /// Every stack of the results, described in full, `; ` separated.
        stacks: String,
    },
}

/// A user's naming of stacks: comma-separated terms, each naming one part
/// of a stack's description (`tcp`, `poll`, `tcp/event`, `MTU 9000`,
/// `offload off`, `loopback`, a `--label` with or without its brackets, a
/// peer tool such as `NPtcp`, an option such as `zerocopy`). A stack matches
/// when every term names one of its parts; case does not matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSelector {
    text: String,
    terms: Vec<String>,
}

impl StackSelector {
    /// Parses a selection; an empty one is refused.
    pub fn parse(text: &str) -> Result<StackSelector, SelectError> {
        let mut terms = Vec::new();
        for t in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            // `tcp/event` is two parts.
            match t.split_once('/') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !a.contains(' ') => {
                    terms.push(a.to_ascii_lowercase());
                    terms.push(b.to_ascii_lowercase());
                }
                _ => terms.push(t.to_ascii_lowercase()),
            }
        }
        if terms.is_empty() {
            return Err(SelectError::Empty);
        }
        Ok(StackSelector {
            text: text.to_string(),
            terms,
        })
    }

    /// The selection as the user gave it.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `term` names the description item `part`.
    fn names(term: &str, part: &str) -> bool {
        let part = part.to_ascii_lowercase();
        part == term
            || part == format!("[{term}]")
            // The transport item of an import is `tcp [NPtcp]`.
            || part.ends_with(&format!(" [{term}]"))
            || part.split(" [").next() == Some(term)
    }

    /// Whether every term names a part of `stack`.
    pub fn matches(&self, stack: &Stack) -> bool {
        let parts = parts(stack);
        self.terms
            .iter()
            .all(|t| parts.iter().any(|p| Self::names(t, p)))
    }

    /// The parts of `stack` that the selection does not name: what is left
    /// to pair it with a stack another selection picked.
    pub(crate) fn rest(&self, stack: &Stack) -> Vec<String> {
        parts(stack)
            .into_iter()
            .filter(|p| !self.terms.iter().any(|t| Self::names(t, p)))
            .collect()
    }

    /// The error for a selection given with `flag` that matches none of
    /// `stacks`.
    pub fn no_match<'a>(
        &self,
        flag: &str,
        stacks: impl IntoIterator<Item = &'a Stack>,
    ) -> SelectError {
        let all: BTreeSet<String> = stacks.into_iter().map(Stack::describe).collect();
        SelectError::NoMatch {
            flag: flag.to_string(),
            text: self.text.clone(),
            stacks: all.into_iter().collect::<Vec<_>>().join("; "),
        }
    }
}

/// The stack a report's gap tables measure every other against.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Baseline {
    /// The host TCP stack with event completion: transport `tcp`, mode
    /// `event`, no non-default option, measured by netgap itself.
    #[default]
    HostTcp,
    /// The stacks a `--baseline` selection matches.
    Select(StackSelector),
}

impl Baseline {
    /// Whether `stack` can be the baseline.
    pub fn matches(&self, stack: &Stack) -> bool {
        match self {
            Baseline::HostTcp => {
                stack.transport == "tcp"
                    && stack.mode == Mode::Event
                    && stack.options.is_empty()
                    && stack.tool.is_none()
            }
            Baseline::Select(s) => s.matches(stack),
        }
    }

    /// The baseline as the page names it.
    pub fn describe(&self) -> String {
        match self {
            Baseline::HostTcp => {
                "the host TCP stack with event completion (tcp, event, no options)".to_string()
            }
            Baseline::Select(s) => format!("--baseline \"{}\"", s.text()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netgap_core::spec::TransportOptions;
    use netgap_core::stack::PathIdentity;

    fn stack(transport: &str, mode: Mode, mtu: u32, label: Option<&str>) -> Stack {
        let path = PathIdentity {
            kind: Some("testbed".into()),
            mtu_bytes: Some(mtu),
            offload: Some("off".into()),
            ..PathIdentity::default()
        };
        Stack::new(
            transport,
            mode,
            &TransportOptions::default(),
            path,
            label.map(str::to_string),
        )
    }

    #[test]
    fn selections_name_parts_not_substrings() {
        let a = stack("tcp", Mode::Event, 1500, Some("run A"));
        let b = stack("tcp", Mode::Poll, 15000, None);
        let s = StackSelector::parse("MTU 1500").unwrap();
        assert!(s.matches(&a) && !s.matches(&b));
        assert!(StackSelector::parse("tcp/poll").unwrap().matches(&b));
        assert!(!StackSelector::parse("tcp/poll").unwrap().matches(&a));
        assert!(StackSelector::parse("run a").unwrap().matches(&a));
        assert!(StackSelector::parse("[run A], offload off")
            .unwrap()
            .matches(&a));
        assert_eq!(StackSelector::parse(" , "), Err(SelectError::Empty));
        let rest = StackSelector::parse("MTU 1500").unwrap().rest(&a);
        assert!(!rest.contains(&"MTU 1500".to_string()));
        assert!(rest.contains(&"offload off".to_string()));
    }

    #[test]
    fn labels_add_hosts_only_when_they_differ() {
        let k = |mtu, hosts: &str| SeriesKey {
            stack: stack("tcp", Mode::Event, mtu, None),
            hosts: Some(hosts.into()),
            variant: Vec::new(),
        };
        let (a, b) = (k(1500, "h1"), k(9000, "h1"));
        let l = labels([&a, &b]);
        assert_eq!(l[&a], "tcp, MTU 1500");
        let c = k(1500, "h2");
        let l = labels([&a, &c]);
        assert_eq!(l[&a], "tcp @h1");
        assert_eq!(l[&c], "tcp @h2");
    }

    #[test]
    fn poll_and_event_of_a_stack_are_one_family() {
        let e = SeriesKey {
            stack: stack("tcp", Mode::Event, 1500, None),
            hosts: None,
            variant: Vec::new(),
        };
        let p = SeriesKey {
            stack: stack("tcp", Mode::Poll, 1500, None),
            hosts: None,
            variant: Vec::new(),
        };
        assert_eq!(e.family(), p.family());
        assert!(e.order() < p.order());
    }

    #[test]
    fn labels_name_the_variant_entries_that_differ() {
        let k = |v: &[&str]| SeriesKey {
            stack: stack("tcp", Mode::Event, 1500, None),
            hosts: None,
            variant: v.iter().map(|s| s.to_string()).collect(),
        };
        let a = k(&["alpha=0.8", "server=nginx"]);
        let b = k(&["alpha=0.8", "server=apache"]);
        let c = k(&["alpha=0.8"]);
        let l = labels([&a, &b, &c]);
        assert_eq!(l[&a], "tcp, server=nginx");
        assert_eq!(l[&b], "tcp, server=apache");
        assert_eq!(l[&c], "tcp");
        assert_eq!(a.without("alpha").variant, ["server=nginx"]);
        assert_eq!(
            c.with_entry("clients", "4").variant,
            ["alpha=0.8", "clients=4"]
        );
    }
}
