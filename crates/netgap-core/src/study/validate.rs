//! The one check of a study file: its raw types ([`super::raw`]) into the
//! validated [`Study`], its figures and claims each by their own rules
//! ([`super::rules`] for a claim's).

use super::raw::{RawFigure, RawStudy};
use super::{
    Attr, Claim, Figure, FigureCommand, Quantity, Study, StudyError, StudyMethod, TestbedNeed,
    Topology, XAxis,
};

impl RawStudy {
    pub(crate) fn validate(self) -> Result<Study, StudyError> {
        let study = self.id.clone();
        let bad = |what: String| StudyError::Invalid {
            study: study.clone(),
            what,
        };
        if self.id.len() != 3 || !self.id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("id {:?}: want three digits", self.id)));
        }
        if self.citation.authors.is_empty() || self.citation.title.trim().is_empty() {
            return Err(bad("the citation names no authors or no title".into()));
        }
        if self.method.reps <= 2 * self.method.drop_each_side {
            return Err(bad(format!(
                "method: {} repetitions leave none after dropping {} each side",
                self.method.reps, self.method.drop_each_side
            )));
        }
        let topology = match self.testbed.topology.as_str() {
            "switch" => Topology::Switch,
            "mesh" => Topology::Mesh,
            t => return Err(bad(format!("testbed topology {t:?}: want switch or mesh"))),
        };
        if self.testbed.hosts < 2 || self.testbed.links == 0 {
            return Err(bad("testbed: at least two hosts and one link".into()));
        }
        if self.figure.is_empty() {
            return Err(bad("no figure".into()));
        }
        let mut figures: Vec<Figure> = Vec::new();
        for f in self.figure {
            let fig = f.validate().map_err(&bad)?;
            if figures.iter().any(|g| g.id == fig.id) {
                return Err(bad(format!("figure {} appears twice", fig.id)));
            }
            if fig.hosts > self.testbed.hosts {
                return Err(bad(format!(
                    "figure {} needs {} hosts, the study's testbed has {}",
                    fig.id, fig.hosts, self.testbed.hosts
                )));
            }
            figures.push(fig);
        }
        let mut claims = Vec::new();
        for c in self.claim {
            if let Some(f) = c.from.iter().find(|f| !figures.iter().any(|g| &g.id == *f)) {
                return Err(bad(format!(
                    "claim {:?} reads figure {f}, which the study does not have",
                    c.text
                )));
            }
            if !figures.iter().any(|f| f.id == c.figure) {
                return Err(bad(format!(
                    "claim {:?} refers to figure {}, which the study does not have",
                    c.text, c.figure
                )));
            }
            let claim = c.validate().map_err(&bad)?;
            claim.check_against(&figures).map_err(&bad)?;
            claims.push(claim);
        }
        for fig in &mut figures {
            let mine = || claims.iter().filter(|c| c.from.contains(&fig.id));
            let mut counts: Vec<u32> = mine()
                .flat_map(Claim::x_values)
                .filter(|x| x.fract() == 0.0 && *x >= 1.0 && *x <= f64::from(u32::MAX))
                .map(|x| x as u32)
                .collect();
            // A figure plotted against size names its link counts in its
            // series (`links = "2"`): those are kept as an x would be.
            counts.extend(mine().flat_map(|c| {
                c.selectors()
                    .into_iter()
                    .flat_map(|(_, sel)| sel.0.iter())
                    .filter(|(a, _)| *a == Attr::Links)
                    .filter_map(|(_, v)| v.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            }));
            counts.sort_unstable();
            counts.dedup();
            fig.claim_counts = counts;
        }
        Ok(Study {
            id: self.id,
            citation: self.citation,
            method: StudyMethod {
                reps: self.method.reps,
                drop_each_side: self.method.drop_each_side,
                iterations: self.method.iterations,
                text: self.method.text,
            },
            testbed: TestbedNeed {
                hosts: self.testbed.hosts,
                topology,
                links: self.testbed.links,
                rate: self.testbed.rate,
                text: self.testbed.text,
            },
            figures,
            claims,
        })
    }
}

pub(crate) fn lookup<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

pub(crate) fn names<T>(table: &[(&str, T)]) -> String {
    table.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

impl RawFigure {
    fn validate(self) -> Result<Figure, String> {
        let id = self.id.clone();
        let command = match self.command.as_str() {
            "run" => FigureCommand::Run,
            "sweep" => FigureCommand::Sweep,
            "logp" => FigureCommand::Logp,
            c => {
                return Err(format!(
                    "figure {id}: command {c:?}: want run, sweep or logp"
                ))
            }
        };
        let x = lookup(&XAxis::ALL, &self.x).ok_or_else(|| {
            format!(
                "figure {id}: x-axis {:?}: want one of {}",
                self.x,
                names(&XAxis::ALL)
            )
        })?;
        let series = self
            .series
            .iter()
            .map(|s| {
                lookup(&Attr::ALL, s).ok_or_else(|| {
                    format!(
                        "figure {id}: series {s:?}: want one of {}",
                        names(&Attr::ALL)
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.tests.is_empty() && command == FigureCommand::Run {
            return Err(format!("figure {id}: no test"));
        }
        if self.caption.trim().is_empty() {
            return Err(format!("figure {id}: no caption"));
        }
        if self.hosts < 2 {
            return Err(format!("figure {id}: a figure needs at least two hosts"));
        }
        for c in &self.conditions {
            if !c.contains('=') {
                return Err(format!("figure {id}: condition {c:?}: want KEY=V,V"));
            }
        }
        Ok(Figure {
            id: self.id,
            caption: self.caption,
            command,
            tests: self.tests,
            transports: self.transports,
            modes: self.modes,
            sizes: self.sizes,
            conditions: self.conditions,
            clients: self.clients,
            streams: self.streams,
            links: self.links,
            flags: self.flags,
            quick_flags: self.quick_flags,
            quick_sizes: self.quick_sizes,
            variants: self.variants,
            x,
            y: Quantity::parse(&self.y).map_err(|e| format!("figure {id}: y {e}"))?,
            series,
            cpu: self.cpu,
            hosts: self.hosts,
            min_rep_ms: self.min_rep_ms,
            paper: self.paper,
            here: self.here,
            claim_counts: Vec::new(),
        })
    }
}
