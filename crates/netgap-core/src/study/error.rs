//! Why a study file is refused: one typed cause per check, each read as one
//! line that names the study and the figure or claim that failed.

use super::quantity::QuantityError;
use super::{Attr, XAxis};

/// Why a study file was refused; one line naming the study and what failed.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// Not TOML of the study schema (an unknown key, a missing one).
    #[error("study file {file}: {message}")]
    Syntax {
        /// Which file.
        file: String,
        /// The parser's complaint, on one line.
        message: String,
    },
    /// A value that parses but means nothing.
    #[error("study {study}: {what}")]
    Invalid {
        /// The study's id.
        study: String,
        /// What is wrong, naming the figure or claim.
        what: InvalidStudy,
    },
}

/// What is wrong with a study file that parses: the study's own keys, or
/// one of its figures or claims.
#[derive(Debug, thiserror::Error)]
pub enum InvalidStudy {
    /// An id that is not three digits.
    #[error("id {0:?}: want three digits")]
    Id(String),
    /// A citation without authors or title.
    #[error("the citation names no authors or no title")]
    Citation,
    /// Too few repetitions for the ones dropped.
    #[error("method: {reps} repetitions leave none after dropping {drop_each_side} each side")]
    NoRepsLeft {
        /// Repetitions.
        reps: u32,
        /// Dropped each side.
        drop_each_side: u32,
    },
    /// A topology that is neither `switch` nor `mesh`.
    #[error("testbed topology {0:?}: want switch or mesh")]
    Topology(String),
    /// A testbed of fewer than two hosts or no link.
    #[error("testbed: at least two hosts and one link")]
    TestbedTooSmall,
    /// A study without figures.
    #[error("no figure")]
    NoFigure,
    /// Two figures with one id.
    #[error("figure {0} appears twice")]
    FigureTwice(String),
    /// A figure that needs more hosts than the study's testbed has.
    #[error("figure {figure} needs {needs} hosts, the study's testbed has {has}")]
    FigureHosts {
        /// The figure.
        figure: String,
        /// Hosts it needs.
        needs: u32,
        /// Hosts of the testbed.
        has: u32,
    },
    /// A claim whose `from` names a figure the study does not have.
    #[error("claim {claim:?} reads figure {figure}, which the study does not have")]
    ReadsNoFigure {
        /// The claim's text.
        claim: String,
        /// The figure named.
        figure: String,
    },
    /// A claim shown under a figure the study does not have.
    #[error("claim {claim:?} refers to figure {figure}, which the study does not have")]
    UnderNoFigure {
        /// The claim's text.
        claim: String,
        /// The figure named.
        figure: String,
    },
    /// A figure is wrong.
    #[error(transparent)]
    Figure(Box<FigureError>),
    /// A claim is wrong.
    #[error(transparent)]
    Claim(Box<ClaimError>),
}

impl From<FigureError> for InvalidStudy {
    fn from(e: FigureError) -> InvalidStudy {
        InvalidStudy::Figure(Box::new(e))
    }
}

impl From<ClaimError> for InvalidStudy {
    fn from(e: ClaimError) -> InvalidStudy {
        InvalidStudy::Claim(Box::new(e))
    }
}

/// A figure refused, by its id.
#[derive(Debug, thiserror::Error)]
#[error("figure {figure}: {cause}")]
pub struct FigureError {
    /// The figure's id.
    pub figure: String,
    /// What is wrong with it.
    pub cause: FigureCause,
}

/// What is wrong with a figure.
#[derive(Debug, thiserror::Error)]
pub enum FigureCause {
    /// A command that is not `run`, `sweep` or `logp`.
    #[error("command {0:?}: want run, sweep or logp")]
    Command(String),
    /// An x-axis that is none of [`XAxis`].
    #[error("x-axis {0:?}: want one of {names}", names = names(&XAxis::ALL))]
    XAxis(String),
    /// A series attribute that is none of [`Attr`].
    #[error("series {0:?}: want one of {names}", names = names(&Attr::ALL))]
    Series(String),
    /// A `run` figure without tests.
    #[error("no test")]
    NoTest,
    /// An empty caption.
    #[error("no caption")]
    NoCaption,
    /// Fewer than two hosts.
    #[error("a figure needs at least two hosts")]
    TooFewHosts,
    /// A condition that is not `KEY=V,V`.
    #[error("condition {0:?}: want KEY=V,V")]
    Condition(String),
    /// A y that is no quantity.
    #[error("y {0}")]
    Y(QuantityError),
}

/// A claim refused, by its text.
#[derive(Debug, thiserror::Error)]
#[error("claim {claim:?}: {cause}")]
pub struct ClaimError {
    /// The claim's text.
    pub claim: String,
    /// What is wrong with it.
    pub cause: ClaimCause,
}

/// The figures a claim reads, as its messages name them ("figure 3a",
/// "figures 5a and 5b").
#[derive(Debug, Clone, PartialEq)]
pub struct FigureIds(pub Vec<String>);

impl FigureIds {
    /// The verb that goes with them: "measures" for one, "measure" for more.
    fn measure(&self) -> &'static str {
        if self.0.len() == 1 {
            "measures"
        } else {
            "measure"
        }
    }
}

impl std::fmt::Display for FigureIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let figure_s = if self.0.len() == 1 {
            "figure"
        } else {
            "figures"
        };
        write!(f, "{figure_s} {}", self.0.join(" and "))
    }
}

/// What is wrong with a claim.
#[derive(Debug, thiserror::Error)]
pub enum ClaimCause {
    /// A kind that is none of the rules.
    #[error("kind {0:?}: want ratio, trend, value, ratio_change, trends, knee, falls, dropouts or unmeasurable")]
    UnknownKind(String),
    /// A key the claim's kind does not read.
    #[error("a claim of kind {kind} takes no {key}")]
    KeyNotTaken {
        /// The claim's kind.
        kind: String,
        /// The key.
        key: &'static str,
    },
    /// A series the claim's kind reads is missing (`a`, `b`, `series`).
    #[error("no {0}")]
    NoSeries(&'static str),
    /// A series names an attribute that is none of [`Attr`].
    #[error("{key}: unknown attribute {attr:?}")]
    UnknownAttribute {
        /// The series' key.
        key: &'static str,
        /// The attribute named.
        attr: String,
    },
    /// A `metric` that is no quantity.
    #[error("metric {0}")]
    Metric(QuantityError),
    /// An `at` that is no place along x.
    #[error("at {0:?}: want largest, smallest, peak, lowest or an x value")]
    At(String),
    /// `from_x`, `to_x` or a knee's `at` that is not an x value.
    #[error("from_x, to_x and a knee's at are x values")]
    NotAnX,
    /// A ratio_change's end that is a peak or lowest.
    #[error("{0} of a ratio_change is an x value, smallest or largest")]
    EndNotX(&'static str),
    /// A ratio_change without `vs_at`.
    #[error("a ratio_change needs vs_at")]
    NoVsAt,
    /// A knee without `at`.
    #[error("a knee needs at, the x where the slope changes")]
    KneeNoAt,
    /// An unmeasurable claim that does not say why.
    #[error("unmeasurable needs `why`")]
    NoWhy,
    /// No threshold, or `above` not below `below`.
    #[error("give above, below, or both with above < below")]
    Expect,
    /// A `tolerance_pct` out of range or beside `above`/`below`.
    #[error("tolerance_pct is a percent above 0 and below 100, without above or below")]
    Band,
    /// Some of the published size's keys without the others.
    #[error("give published_value, size_tolerance_pct and size_why together")]
    SizeIncomplete,
    /// A published value that is not a positive number.
    #[error("published_value {0}: want a positive number")]
    SizeNotPositive(f64),
    /// A size tolerance out of range.
    #[error("size_tolerance_pct {0}: want a percent above 0 and below 100")]
    SizeTolerance(f64),
    /// An empty `size_why`.
    #[error("size_why is empty: say why the tolerance")]
    SizeWhyEmpty,
    /// A size on a kind that judges none.
    #[error("a claim of kind {0} has no size to judge; leave out published_value")]
    SizeUnjudged(String),
    /// A size on a claim without a direction.
    #[error("no direction")]
    NoDirection,
    /// A published value the claim's own direction refuses.
    #[error("published_value {0} contradicts the claim's direction (above/below)")]
    SizeContradicts(f64),
    /// An empty `no_mechanism`.
    #[error("no_mechanism says why the stand-in lacks the claim's mechanism; it is empty")]
    EmptyNoMechanism,
    /// A series names options its figures do not set.
    #[error("{key}: options {options:?} are none that {figures} set")]
    OptionsNotSet {
        /// The series' key.
        key: &'static str,
        /// The options named.
        options: String,
        /// The figures the claim reads.
        figures: FigureIds,
    },
    /// A series names a value its figures do not measure.
    #[error(
        "{key}: {attr_name} {value:?} is not a value {figures} {verb} ({listed})",
        attr_name = .attr.name(),
        verb = .figures.measure(),
        listed = .known.join(", ")
    )]
    NotAValue {
        /// The series' key.
        key: &'static str,
        /// The attribute.
        attr: Attr,
        /// The value named.
        value: String,
        /// The figures the claim reads.
        figures: FigureIds,
        /// The values they measure, sorted.
        known: Vec<String>,
    },
    /// An x the claim reads that its figures do not measure.
    #[error("x = {x} is not a point {figures} {verb}", verb = .figures.measure())]
    NotAPoint {
        /// The x.
        x: f64,
        /// The figures the claim reads.
        figures: FigureIds,
    },
}

/// The names of `table`, comma separated.
pub(crate) fn names<T>(table: &[(&str, T)]) -> String {
    table.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}
