//! A study as data: the paper it reproduces (cited), the figures it shows
//! (each figure's netgap tests and options, its x-axis and series, the
//! hosts it needs) and the claims it makes (the published number, where in
//! the paper, and how to judge it from records). A study file is TOML; it
//! is read into raw types that refuse unknown keys, then checked once into
//! the validated [`Study`]. Whether each figure's tests exist is checked
//! where the registries are (the `netgap` crate).

mod claim;
mod error;
mod figure;
mod quantity;
mod raw;
mod rules;
mod validate;

pub use claim::{At, Claim, ClaimTest, Expect, Selector, Size};
pub use error::{
    ClaimCause, ClaimError, FigureCause, FigureError, FigureIds, InvalidStudy, StudyError,
};
pub use figure::{Attr, Figure, FigureCommand, XAxis};
pub use quantity::{CpuEnd, CpuShare, Quantity, QuantityError};

use raw::RawStudy;
use serde::Deserialize;

/// The paper a study reproduces, cited as its text gives it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Citation {
    /// Authors, in the paper's order.
    pub authors: Vec<String>,
    /// Title.
    pub title: String,
    /// Where it appeared (journal, proceedings, slides, web page).
    pub venue: String,
    /// Year of publication, when known.
    #[serde(default)]
    pub year: Option<u16>,
    /// What of the citation the text itself does not give, and so where
    /// it comes from.
    #[serde(default)]
    pub note: Option<String>,
}

impl Citation {
    /// "A, B and C. Title. Venue, year."
    pub fn line(&self) -> String {
        let authors = match self.authors.as_slice() {
            [] => String::new(),
            [one] => one.clone(),
            [init @ .., last] => format!("{} and {last}", init.join(", ")),
        };
        match self.year {
            Some(y) => format!("{authors}. {}. {}, {y}.", self.title, self.venue),
            None => format!("{authors}. {}. {}.", self.title, self.venue),
        }
    }
}

/// A study, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Study {
    /// Its id, `000` .. `004`.
    pub id: String,
    /// The paper.
    pub citation: Citation,
    /// The paper's method.
    pub method: StudyMethod,
    /// The testbed that makes every figure of the study.
    pub testbed: TestbedNeed,
    /// Its figures, in the paper's order.
    pub figures: Vec<Figure>,
    /// Its claims.
    pub claims: Vec<Claim>,
}

/// The paper's method: repetitions, how many of the highest and lowest
/// are dropped, iterations per repetition.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyMethod {
    /// Repetitions of every experiment.
    pub reps: u32,
    /// Highest and lowest values dropped (each).
    pub drop_each_side: u32,
    /// Iterations of one repetition, when the paper states them.
    pub iterations: Option<u64>,
    /// The method in the paper's words.
    pub text: String,
}

/// How the hosts are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Every host on one switch.
    Switch,
    /// Direct links between the hosts.
    Mesh,
}

/// The testbed a study's figures need.
#[derive(Debug, Clone, PartialEq)]
pub struct TestbedNeed {
    /// Hosts.
    pub hosts: u32,
    /// Wiring.
    pub topology: Topology,
    /// Links per host pair (mesh).
    pub links: u32,
    /// Link rate, as `netgap testbed up --rate` takes it.
    pub rate: Option<String>,
    /// The paper's testbed and what stands in for it.
    pub text: String,
}

impl Study {
    /// Parses and checks a study file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Study, StudyError> {
        let raw: RawStudy = toml::from_str(text).map_err(|e| StudyError::Syntax {
            file: file.to_string(),
            message: e.to_string().replace('\n', " "),
        })?;
        raw.validate()
    }

    /// The figure `id`.
    pub fn figure(&self, id: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.id == id)
    }

    /// The claims judged from figure `id`.
    pub fn claims_of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Claim> + 'a {
        self.claims.iter().filter(move |c| c.figure == id)
    }
}

#[cfg(test)]
mod tests;
