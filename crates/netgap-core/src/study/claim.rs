//! A claim of a study: which series it reads, where along x, what the
//! paper says they show (its direction, and its size when it gives one),
//! and whether what it names is something its figures measure.

use super::error::{ClaimCause, ClaimError, FigureIds};
use super::{Attr, Figure, Quantity};

/// Which records a claim reads: every attribute named must match.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selector(pub Vec<(Attr, String)>);

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(a, v)| format!("{}={v}", a.name()))
            .collect();
        if parts.is_empty() {
            f.write_str("every series")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

/// Where along x a claim reads its series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum At {
    /// The largest x both series have.
    Largest,
    /// The smallest x both series have.
    Smallest,
    /// Each series' highest value ("maximum bandwidth").
    Peak,
    /// Each series' lowest value ("lowest latency").
    Lowest,
    /// This x.
    X(f64),
}

/// What the measured figure must be for the claim to hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// Above this.
    Above(f64),
    /// Below this.
    Below(f64),
    /// Within `[lo, hi]`.
    Between(f64, f64),
}

impl Expect {
    /// Whether `v` meets it.
    pub fn admits(self, v: f64) -> bool {
        match self {
            Expect::Above(t) => v > t,
            Expect::Below(t) => v < t,
            Expect::Between(a, b) => v >= a && v <= b,
        }
    }
}

/// The size of the effect a paper publishes and how near netgap's figure
/// must come to it: the claim's size holds when netgap's 95% interval
/// overlaps [`Size::band`].
#[derive(Debug, Clone, PartialEq)]
pub struct Size {
    /// The paper's figure, in the unit of the claim's measured figure (a
    /// ratio for ratio and trend claims); finite and positive.
    pub published: f64,
    /// How far from it, in percent of it, still counts as the same size;
    /// above 0 and below 100.
    pub tolerance_pct: f64,
    /// Why that tolerance, in the study file's words.
    pub why: String,
}

impl Size {
    /// `[published × (1 − tolerance), published × (1 + tolerance)]`.
    pub fn band(&self) -> (f64, f64) {
        let t = self.tolerance_pct / 100.0;
        (self.published * (1.0 - t), self.published * (1.0 + t))
    }
}

/// How a claim is evaluated from the records.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimTest {
    /// `a`'s value over `b`'s at `at`.
    Ratio {
        /// Numerator series.
        a: Selector,
        /// Denominator series.
        b: Selector,
        /// Where.
        at: At,
        /// What both series are read in instead of the figure's y: an
        /// application metric (`connect_time_us`) or a field of the record
        /// by its path (`cpu.local.process_percent`, the CPU a bandwidth
        /// figure shows beside it).
        metric: Option<Quantity>,
        /// What holds.
        expect: Expect,
    },
    /// A series' value at one x over its value at another (by default
    /// the last x over the first): growth, flatness, doubling.
    Trend {
        /// The series.
        series: Selector,
        /// The x of the denominator; `None`: the first.
        from_x: Option<f64>,
        /// The x of the numerator; `None`: the last.
        to_x: Option<f64>,
        /// What holds.
        expect: Expect,
    },
    /// A series' value (or a metric of the application's) at `at`.
    Value {
        /// The series.
        series: Selector,
        /// Where.
        at: At,
        /// An application metric (`app.metrics`) instead of the headline.
        metric: Option<Quantity>,
        /// What holds.
        expect: Expect,
    },
    /// How the ratio of two series changes along x: `a / b` at `at` over
    /// `a / b` at `vs` ("the improvement is smaller at high alpha": above
    /// 1 with `at` the smallest alpha and `vs` the largest).
    RatioChange {
        /// Numerator series.
        a: Selector,
        /// Denominator series.
        b: Selector,
        /// The x of the ratio on top: an x value, the smallest or the
        /// largest x both series have.
        at: At,
        /// The x of the ratio below.
        vs: At,
        /// What holds.
        expect: Expect,
    },
    /// Two series' trends compared: `a`'s value at `to_x` over its value
    /// at `from_x`, over the same of `b` ("similar scalability": within a
    /// tolerance of 1).
    Trends {
        /// The series on top.
        a: Selector,
        /// The series below.
        b: Selector,
        /// The x of each trend's start; `None`: the first x both have.
        from_x: Option<f64>,
        /// The x of each trend's end; `None`: the last x both have.
        to_x: Option<f64>,
        /// What holds.
        expect: Expect,
    },
    /// Dropouts (sweep points NetPIPE's detector flagged: throughput
    /// below that of a smaller block beyond the noise) in one curve and
    /// none in another. Holds when `with` has at least one and `without`
    /// has none; both must have been measured.
    Dropouts {
        /// The curve that shows dropouts.
        with: Selector,
        /// The curve free from them.
        without: Selector,
    },
    /// A knee at `x`: the knee factor, the series' slope from `x` to its
    /// last point over its slope from its first point to `x` (infinite
    /// when it does not rise up to `x` but does past it, 0 when it does
    /// not rise past `x`). `x` must be a measured point between the first
    /// and the last.
    Knee {
        /// The series.
        series: Selector,
        /// Where the slope changes, on the figure's x-axis.
        x: f64,
        /// What the knee factor must be.
        expect: Expect,
    },
    /// How many times the series falls as x grows (from one point to the
    /// next, the whole of the next point's interval below the whole of
    /// the previous one's).
    Falls {
        /// The series.
        series: Selector,
        /// What falls instead of the figure's y, read along the records'
        /// message size whatever the figure's x: on NetPIPE's signature
        /// graph (x the block time) a larger block that took less time
        /// than the one before is a fall of `block_time_us` along size.
        metric: Option<Quantity>,
        /// What the count must be.
        expect: Expect,
    },
    /// Cannot be measured with netgap; why.
    Unmeasurable(String),
}

impl ClaimTest {
    /// What the measured figure must be, for the kinds that judge one
    /// figure against a threshold or band.
    pub fn expect(&self) -> Option<Expect> {
        match self {
            ClaimTest::Ratio { expect, .. }
            | ClaimTest::Trend { expect, .. }
            | ClaimTest::Value { expect, .. }
            | ClaimTest::RatioChange { expect, .. }
            | ClaimTest::Trends { expect, .. }
            | ClaimTest::Knee { expect, .. }
            | ClaimTest::Falls { expect, .. } => Some(*expect),
            ClaimTest::Dropouts { .. } | ClaimTest::Unmeasurable(_) => None,
        }
    }
}

/// A claim of the paper.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The figure it is shown under.
    pub figure: String,
    /// The figures whose records judge it (the figure itself unless the
    /// claim compares two figures, such as MTU 1500 against 9000).
    pub from: Vec<String>,
    /// The claim, in words.
    pub text: String,
    /// The published figure.
    pub published: String,
    /// Where in the paper.
    pub where_: String,
    /// How it is judged: the direction the paper states.
    pub test: ClaimTest,
    /// The size of the effect the paper publishes, when it gives one;
    /// `None`: the paper gives a direction only.
    pub size: Option<Size>,
    /// Why the stand-in here lacks the mechanism the claim rests on (a
    /// segmentation offload has nothing to do for a one-segment message;
    /// the emulated links have no PCI bus): the claim is shown with this
    /// sentence and not judged. `None`: the stand-in has it.
    pub no_mechanism: Option<String>,
}

impl Claim {
    /// The series the claim picks, each under its key in the study file
    /// (`a`, `b`, `series`).
    pub fn selectors(&self) -> Vec<(&'static str, &Selector)> {
        match &self.test {
            ClaimTest::Ratio { a, b, .. }
            | ClaimTest::RatioChange { a, b, .. }
            | ClaimTest::Trends { a, b, .. } => vec![("a", a), ("b", b)],
            ClaimTest::Dropouts { with, without } => vec![("a", with), ("b", without)],
            ClaimTest::Trend { series, .. }
            | ClaimTest::Value { series, .. }
            | ClaimTest::Knee { series, .. }
            | ClaimTest::Falls { series, .. } => vec![("series", series)],
            ClaimTest::Unmeasurable(_) => Vec::new(),
        }
    }

    /// The x values the claim reads by name (`at`, `vs_at`, `from_x`,
    /// `to_x`), each of which its figures must measure for it to be
    /// judged; a run that leaves one out (a `--quick` run keeps only the
    /// ends of a count axis) cannot judge it.
    pub fn x_values(&self) -> Vec<f64> {
        let at = |a: &At| match a {
            At::X(v) => Some(*v),
            _ => None,
        };
        match &self.test {
            ClaimTest::Ratio { at: a, .. } | ClaimTest::Value { at: a, .. } => {
                at(a).into_iter().collect()
            }
            ClaimTest::RatioChange { at: a, vs, .. } => at(a).into_iter().chain(at(vs)).collect(),
            ClaimTest::Trend { from_x, to_x, .. } | ClaimTest::Trends { from_x, to_x, .. } => {
                from_x.iter().chain(to_x.iter()).copied().collect()
            }
            ClaimTest::Knee { x, .. } => vec![*x],
            ClaimTest::Dropouts { .. } | ClaimTest::Falls { .. } | ClaimTest::Unmeasurable(_) => {
                Vec::new()
            }
        }
    }

    /// Whether the claim's series and x values are ones its figures
    /// measure, as far as their declarations name them; what is not, in
    /// one line.
    pub(crate) fn check_against(&self, figures: &[Figure]) -> Result<(), ClaimError> {
        self.check_measured(figures).map_err(|cause| ClaimError {
            claim: self.text.clone(),
            cause,
        })
    }

    fn check_measured(&self, figures: &[Figure]) -> Result<(), ClaimCause> {
        let from: Vec<&Figure> = figures
            .iter()
            .filter(|f| self.from.contains(&f.id))
            .collect();
        let ids = || FigureIds(from.iter().map(|f| f.id.clone()).collect());
        for (key, sel) in self.selectors() {
            for (attr, want) in &sel.0 {
                if *attr == Attr::Options {
                    if !from.iter().any(|f| f.admits_options(want)) {
                        return Err(ClaimCause::OptionsNotSet {
                            key,
                            options: want.clone(),
                            figures: ids(),
                        });
                    }
                    continue;
                }
                let Some(known) = from
                    .iter()
                    .map(|f| f.values_of(*attr))
                    .collect::<Option<Vec<Vec<String>>>>()
                else {
                    continue;
                };
                let mut known: Vec<String> = known.concat();
                if !known.contains(want) {
                    known.sort();
                    known.dedup();
                    return Err(ClaimCause::NotAValue {
                        key,
                        attr: *attr,
                        value: want.clone(),
                        figures: ids(),
                        known,
                    });
                }
            }
        }
        for x in self.x_values() {
            let Some(known) = from
                .iter()
                .map(|f| f.x_values())
                .collect::<Option<Vec<Vec<f64>>>>()
            else {
                continue;
            };
            if !known.concat().contains(&x) {
                return Err(ClaimCause::NotAPoint { x, figures: ids() });
            }
        }
        Ok(())
    }
}
