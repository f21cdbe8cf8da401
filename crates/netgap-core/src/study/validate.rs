//! The one check of a study file: its raw types ([`super::raw`]) into the
//! validated [`Study`], each part by its own check: the study's own keys,
//! its testbed, its figures, its claims (by their rules, [`super::rules`])
//! and the counts along x its claims read.

use super::error::{FigureCause, FigureError, InvalidStudy};
use super::raw::{RawClaim, RawFigure, RawMethod, RawStudy, RawTestbed};
use super::{
    Attr, Citation, Claim, Figure, FigureCommand, Quantity, Study, StudyError, StudyMethod,
    TestbedNeed, Topology, XAxis,
};

impl RawStudy {
    /// The validated study, or the first thing wrong with it.
    pub(crate) fn validate(self) -> Result<Study, StudyError> {
        let study = self.id.clone();
        self.checked()
            .map_err(|what| StudyError::Invalid { study, what })
    }

    fn checked(self) -> Result<Study, InvalidStudy> {
        check_id(&self.id)?;
        check_citation(&self.citation)?;
        let method = method(self.method)?;
        let testbed = testbed(self.testbed)?;
        let mut figures = figures(self.figure, &testbed)?;
        let claims = claims(self.claim, &figures)?;
        for fig in &mut figures {
            fig.claim_counts = claim_counts(&fig.id, &claims);
        }
        Ok(Study {
            id: self.id,
            citation: self.citation,
            method,
            testbed,
            figures,
            claims,
        })
    }
}

/// A study's id is three digits.
fn check_id(id: &str) -> Result<(), InvalidStudy> {
    if id.len() != 3 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(InvalidStudy::Id(id.to_string()));
    }
    Ok(())
}

/// A citation names its authors and title.
fn check_citation(citation: &Citation) -> Result<(), InvalidStudy> {
    if citation.authors.is_empty() || citation.title.trim().is_empty() {
        return Err(InvalidStudy::Citation);
    }
    Ok(())
}

/// The method, with repetitions left after the highest and lowest are
/// dropped.
fn method(raw: RawMethod) -> Result<StudyMethod, InvalidStudy> {
    if raw.reps <= 2 * raw.drop_each_side {
        return Err(InvalidStudy::NoRepsLeft {
            reps: raw.reps,
            drop_each_side: raw.drop_each_side,
        });
    }
    Ok(StudyMethod {
        reps: raw.reps,
        drop_each_side: raw.drop_each_side,
        iterations: raw.iterations,
        text: raw.text,
    })
}

/// The testbed: a known topology, two hosts and a link at least.
fn testbed(raw: RawTestbed) -> Result<TestbedNeed, InvalidStudy> {
    let topology = match raw.topology.as_str() {
        "switch" => Topology::Switch,
        "mesh" => Topology::Mesh,
        t => return Err(InvalidStudy::Topology(t.to_string())),
    };
    if raw.hosts < 2 || raw.links == 0 {
        return Err(InvalidStudy::TestbedTooSmall);
    }
    Ok(TestbedNeed {
        hosts: raw.hosts,
        topology,
        links: raw.links,
        rate: raw.rate,
        text: raw.text,
    })
}

/// The figures, at least one, each valid, each id once, none needing more
/// hosts than `testbed` has.
fn figures(raw: Vec<RawFigure>, testbed: &TestbedNeed) -> Result<Vec<Figure>, InvalidStudy> {
    if raw.is_empty() {
        return Err(InvalidStudy::NoFigure);
    }
    let mut figures: Vec<Figure> = Vec::new();
    for f in raw {
        let fig = f.validate()?;
        if figures.iter().any(|g| g.id == fig.id) {
            return Err(InvalidStudy::FigureTwice(fig.id));
        }
        if fig.hosts > testbed.hosts {
            return Err(InvalidStudy::FigureHosts {
                figure: fig.id,
                needs: fig.hosts,
                has: testbed.hosts,
            });
        }
        figures.push(fig);
    }
    Ok(figures)
}

/// The claims, each under and reading figures the study has, valid by its
/// rules, and naming only series and x values those figures measure.
fn claims(raw: Vec<RawClaim>, figures: &[Figure]) -> Result<Vec<Claim>, InvalidStudy> {
    let mut claims = Vec::new();
    for c in raw {
        if let Some(f) = c.from.iter().find(|f| !figures.iter().any(|g| &g.id == *f)) {
            return Err(InvalidStudy::ReadsNoFigure {
                claim: c.text.clone(),
                figure: f.clone(),
            });
        }
        if !figures.iter().any(|f| f.id == c.figure) {
            return Err(InvalidStudy::UnderNoFigure {
                claim: c.text,
                figure: c.figure,
            });
        }
        let claim = c.validate()?;
        claim.check_against(figures)?;
        claims.push(claim);
    }
    Ok(claims)
}

/// The counts along figure `id`'s clients, streams or links axis that the
/// claims reading it name ([`Figure::claim_counts`]).
fn claim_counts(id: &str, claims: &[Claim]) -> Vec<u32> {
    let mine = || claims.iter().filter(|c| c.from.iter().any(|f| f == id));
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
    counts
}

/// The value `name` has in `table`.
pub(crate) fn lookup<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

impl RawFigure {
    /// The validated figure, or what is wrong with it.
    fn validate(self) -> Result<Figure, FigureError> {
        let figure = self.id.clone();
        self.checked()
            .map_err(|cause| FigureError { figure, cause })
    }

    fn checked(self) -> Result<Figure, FigureCause> {
        let command = match self.command.as_str() {
            "run" => FigureCommand::Run,
            "sweep" => FigureCommand::Sweep,
            "logp" => FigureCommand::Logp,
            c => return Err(FigureCause::Command(c.to_string())),
        };
        let x = lookup(&XAxis::ALL, &self.x).ok_or_else(|| FigureCause::XAxis(self.x.clone()))?;
        let series = self
            .series
            .iter()
            .map(|s| lookup(&Attr::ALL, s).ok_or_else(|| FigureCause::Series(s.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        if self.tests.is_empty() && command == FigureCommand::Run {
            return Err(FigureCause::NoTest);
        }
        if self.caption.trim().is_empty() {
            return Err(FigureCause::NoCaption);
        }
        if self.hosts < 2 {
            return Err(FigureCause::TooFewHosts);
        }
        if let Some(c) = self.conditions.iter().find(|c| !c.contains('=')) {
            return Err(FigureCause::Condition(c.clone()));
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
            y: Quantity::parse(&self.y).map_err(FigureCause::Y)?,
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
