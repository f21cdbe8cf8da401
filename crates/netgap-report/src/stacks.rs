//! Series identity for the report and `compare`: a series is one stack
//! ([`Stack::of_record`]) on one pair of hosts, never a merge of several.
//! Series shown together are labelled by what sets them apart
//! ([`Stack::distinguishing_labels`], plus the hosts when they differ), and
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
}

impl SeriesKey {
    /// The series of a record.
    pub fn of(l: &Loaded) -> SeriesKey {
        SeriesKey {
            stack: l.stack.clone(),
            hosts: l.hosts(),
        }
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

/// Labels for series shown together: by what sets their stacks apart, with
/// ` @hosts` added when they ran on several known hosts. Distinct series
/// never share a label.
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
    keys.iter()
        .map(|k| {
            let mut name = names.get(&k.stack).cloned().unwrap_or_default();
            if hosts.len() > 1 {
                if let Some(h) = &k.hosts {
                    name.push_str(" @");
                    name.push_str(h);
                }
            }
            ((*k).clone(), name)
        })
        .collect()
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
        };
        let p = SeriesKey {
            stack: stack("tcp", Mode::Poll, 1500, None),
            hosts: None,
        };
        assert_eq!(e.family(), p.family());
        assert!(e.order() < p.order());
    }
}
