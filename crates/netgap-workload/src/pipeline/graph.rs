//! The shape of a filter group, without I/O: its stages (a producer, the
//! filter stages, a consumer), the transparent copies of each, the
//! streams between every copy of one stage and every copy of the next,
//! and, for a staged placement's roles, which role listens for and which
//! dials each stream.

use std::ops::Range;

/// A filter group: one producer, `filters` filter stages of `copies`
/// copies each, one consumer. Copies are numbered stage by stage from 0
/// (the producer) to `total() - 1` (the consumer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Graph {
    /// Filter stages between the producer and the consumer.
    pub filters: u32,
    /// Copies of each filter stage.
    pub copies: u32,
}

/// A stream between a copy of one stage and a copy of the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edge {
    /// The upstream copy.
    pub up: u32,
    /// The downstream copy.
    pub down: u32,
}

impl Graph {
    /// Stages, producer and consumer included.
    pub(crate) fn stages(&self) -> u32 {
        self.filters + 2
    }

    /// Copies of the whole group.
    pub(crate) fn total(&self) -> u32 {
        2 + self.filters * self.copies
    }

    /// The copies of `stage`.
    pub(crate) fn copies_of(&self, stage: u32) -> Range<u32> {
        if stage == 0 {
            0..1
        } else if stage <= self.filters {
            let first = 1 + (stage - 1) * self.copies;
            first..first + self.copies
        } else {
            let last = self.total() - 1;
            last..last + 1
        }
    }

    /// The stage of `copy`.
    pub(crate) fn stage_of(&self, copy: u32) -> u32 {
        if copy == 0 {
            0
        } else if copy >= self.total() - 1 {
            self.filters + 1
        } else {
            1 + (copy - 1) / self.copies
        }
    }

    /// The name of `stage` in figures: `producer`, `filter1`..,
    /// `consumer`.
    pub(crate) fn stage_name(&self, stage: u32) -> String {
        match stage {
            0 => "producer".into(),
            s if s <= self.filters => format!("filter{s}"),
            _ => "consumer".into(),
        }
    }

    /// Every stream, stage by stage, upstream copy by upstream copy.
    pub(crate) fn edges(&self) -> Vec<Edge> {
        let mut out = Vec::new();
        for s in 0..self.stages() - 1 {
            for up in self.copies_of(s) {
                for down in self.copies_of(s + 1) {
                    out.push(Edge { up, down });
                }
            }
        }
        out
    }
}

/// How one role of a staged placement takes part in each stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoleLinks {
    /// Streams this role listens for (announced, in this order): both
    /// ends on different roles, this one prepared first.
    pub listens: Vec<usize>,
    /// Streams this role dials: `(edge, earlier role, index among that
    /// role's announced addresses)`.
    pub dials: Vec<(usize, usize, usize)>,
    /// Streams with both ends on this role: it listens for and dials
    /// them itself.
    pub internal: Vec<usize>,
}

/// The part role `me` plays in every stream, given the role of each copy
/// (`role_of[copy]`).
pub(crate) fn role_links(edges: &[Edge], role_of: &[usize], me: usize) -> RoleLinks {
    let mut links = RoleLinks {
        listens: Vec::new(),
        dials: Vec::new(),
        internal: Vec::new(),
    };
    // How many streams each role has announced so far, in edge order.
    let mut announced = vec![0usize; role_of.iter().copied().max().map_or(0, |m| m + 1)];
    for (e, edge) in edges.iter().enumerate() {
        let (ru, rd) = (role_of[edge.up as usize], role_of[edge.down as usize]);
        if ru == rd {
            if ru == me {
                links.internal.push(e);
            }
            continue;
        }
        let (lo, hi) = (ru.min(rd), ru.max(rd));
        if lo == me {
            links.listens.push(e);
        }
        if hi == me {
            links.dials.push((e, lo, announced[lo]));
        }
        announced[lo] += 1;
    }
    links
}

/// Copy `i` on host `i % hosts` (cyclic), or every copy on the first
/// host (co-located).
pub(crate) fn host_of(copy: u32, hosts: usize, colocate: bool) -> usize {
    if colocate || hosts == 0 {
        0
    } else {
        copy as usize % hosts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_numbered_stage_by_stage() {
        let g = Graph {
            filters: 2,
            copies: 3,
        };
        assert_eq!(g.total(), 8);
        assert_eq!(g.copies_of(0), 0..1);
        assert_eq!(g.copies_of(1), 1..4);
        assert_eq!(g.copies_of(2), 4..7);
        assert_eq!(g.copies_of(3), 7..8);
        for s in 0..g.stages() {
            for c in g.copies_of(s) {
                assert_eq!(g.stage_of(c), s);
            }
        }
        // 1x3 + 3x3 + 3x1 streams.
        assert_eq!(g.edges().len(), 15);
        assert_eq!(g.stage_name(2), "filter2");
    }

    #[test]
    fn a_later_role_dials_an_earlier_one_whichever_way_data_moves() {
        // Producer and consumer on role 0, two filter copies on roles 1, 2.
        let g = Graph {
            filters: 1,
            copies: 2,
        };
        let edges = g.edges();
        let role_of = [0, 1, 2, 0];
        let r0 = role_links(&edges, &role_of, 0);
        assert_eq!(r0.listens, vec![0, 1, 2, 3]);
        assert!(r0.dials.is_empty() && r0.internal.is_empty());
        let r1 = role_links(&edges, &role_of, 1);
        // Producer -> copy 1 (edge 0) and copy 1 -> consumer (edge 2).
        assert_eq!(r1.dials, vec![(0, 0, 0), (2, 0, 2)]);
        let r2 = role_links(&edges, &role_of, 2);
        assert_eq!(r2.dials, vec![(1, 0, 1), (3, 0, 3)]);
        // Co-located: everything internal.
        let one = role_links(&edges, &[0, 0, 0, 0], 0);
        assert_eq!(one.internal, vec![0, 1, 2, 3]);
    }
}
