//! A claim's rules: which keys each kind of claim takes, and how its raw
//! keys become the typed test, direction and size it is judged by.

use super::error::{ClaimCause, ClaimError};
use super::raw::RawClaim;
use super::validate::lookup;
use super::{At, Attr, Claim, ClaimTest, Expect, Quantity, Selector, Size};
use std::collections::BTreeMap;

/// The keys of a claim's published size; a kind that judges a size takes
/// them beside its own.
const SIZE_KEYS: [&str; 3] = ["published_value", "size_tolerance_pct", "size_why"];

/// The optional keys a claim of `kind` reads (beside [`SIZE_KEYS`] where
/// it judges a size).
fn keys_of(kind: &str) -> Result<&'static [&'static str], ClaimCause> {
    Ok(match kind {
        "ratio" => &["a", "b", "at", "metric", "above", "below", "tolerance_pct"],
        "trend" => &[
            "series",
            "from_x",
            "to_x",
            "above",
            "below",
            "tolerance_pct",
        ],
        "trends" => &[
            "a",
            "b",
            "from_x",
            "to_x",
            "above",
            "below",
            "tolerance_pct",
        ],
        "value" => &["series", "at", "metric", "above", "below"],
        "ratio_change" => &["a", "b", "at", "vs_at", "above", "below", "tolerance_pct"],
        "knee" => &["series", "at", "above", "below"],
        "falls" => &["series", "metric", "above", "below"],
        "dropouts" => &["a", "b"],
        "unmeasurable" => &["why"],
        k => return Err(ClaimCause::UnknownKind(k.to_string())),
    })
}

/// The series under key `key` (`a`, `b`, `series`), every attribute it
/// names known.
fn selector(
    key: &'static str,
    m: Option<&BTreeMap<String, String>>,
) -> Result<Selector, ClaimCause> {
    let m = m.ok_or(ClaimCause::NoSeries(key))?;
    m.iter()
        .map(|(k, v)| {
            lookup(&Attr::ALL, k)
                .map(|a| (a, v.clone()))
                .ok_or_else(|| ClaimCause::UnknownAttribute {
                    key,
                    attr: k.clone(),
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Selector)
}

impl RawClaim {
    /// The validated claim, or what is wrong with it.
    pub(crate) fn validate(self) -> Result<Claim, ClaimError> {
        let claim = self.text.clone();
        self.checked().map_err(|cause| ClaimError { claim, cause })
    }

    fn checked(self) -> Result<Claim, ClaimCause> {
        self.check_keys()?;
        let test = self.test()?;
        let size = self.size(&test)?;
        let from = if self.from.is_empty() {
            vec![self.figure.clone()]
        } else {
            self.from.clone()
        };
        let no_mechanism = match self.no_mechanism {
            Some(why) if why.trim().is_empty() => return Err(ClaimCause::EmptyNoMechanism),
            m => m,
        };
        Ok(Claim {
            from,
            figure: self.figure,
            text: self.text,
            published: self.published,
            where_: self.where_,
            test,
            size,
            no_mechanism,
        })
    }

    /// A known kind, given only keys it reads.
    fn check_keys(&self) -> Result<(), ClaimCause> {
        let takes = keys_of(&self.kind)?;
        let sized = !matches!(self.kind.as_str(), "falls" | "dropouts" | "unmeasurable");
        match self
            .given()
            .into_iter()
            .find(|k| !(takes.contains(k) || (sized && SIZE_KEYS.contains(k))))
        {
            Some(key) => Err(ClaimCause::KeyNotTaken {
                kind: self.kind.clone(),
                key,
            }),
            None => Ok(()),
        }
    }

    /// The test of the claim's kind, from the keys it reads.
    fn test(&self) -> Result<ClaimTest, ClaimCause> {
        Ok(match self.kind.as_str() {
            "ratio" => ClaimTest::Ratio {
                a: selector("a", self.a.as_ref())?,
                b: selector("b", self.b.as_ref())?,
                at: self.at()?,
                metric: self.quantity()?,
                expect: self.expect_or_band()?,
            },
            "trend" => ClaimTest::Trend {
                series: selector("series", self.series.as_ref())?,
                from_x: self.x_value(self.from_x.as_deref())?,
                to_x: self.x_value(self.to_x.as_deref())?,
                expect: self.expect_or_band()?,
            },
            "value" => ClaimTest::Value {
                series: selector("series", self.series.as_ref())?,
                at: self.at()?,
                metric: self.quantity()?,
                expect: self.expect()?,
            },
            "ratio_change" => ClaimTest::RatioChange {
                a: selector("a", self.a.as_ref())?,
                b: selector("b", self.b.as_ref())?,
                at: self.end("at", self.at.as_deref())?,
                vs: self.end(
                    "vs_at",
                    Some(self.vs_at.as_deref().ok_or(ClaimCause::NoVsAt)?),
                )?,
                expect: self.expect_or_band()?,
            },
            "trends" => ClaimTest::Trends {
                a: selector("a", self.a.as_ref())?,
                b: selector("b", self.b.as_ref())?,
                from_x: self.x_value(self.from_x.as_deref())?,
                to_x: self.x_value(self.to_x.as_deref())?,
                expect: self.expect_or_band()?,
            },
            "knee" => ClaimTest::Knee {
                series: selector("series", self.series.as_ref())?,
                x: self.x_at(self.at.as_deref().ok_or(ClaimCause::KneeNoAt)?)?,
                expect: self.expect()?,
            },
            "falls" => ClaimTest::Falls {
                series: selector("series", self.series.as_ref())?,
                metric: self.quantity()?,
                expect: self.expect()?,
            },
            "dropouts" => ClaimTest::Dropouts {
                with: selector("a", self.a.as_ref())?,
                without: selector("b", self.b.as_ref())?,
            },
            "unmeasurable" => ClaimTest::Unmeasurable(self.why.clone().ok_or(ClaimCause::NoWhy)?),
            k => return Err(ClaimCause::UnknownKind(k.to_string())),
        })
    }

    /// The claim's `metric`, when it names one: a quantity
    /// ([`Quantity`]), or the claim is refused.
    fn quantity(&self) -> Result<Option<Quantity>, ClaimCause> {
        self.metric
            .as_deref()
            .map(Quantity::parse)
            .transpose()
            .map_err(ClaimCause::Metric)
    }

    fn at(&self) -> Result<At, ClaimCause> {
        self.at_text(self.at.as_deref())
    }

    /// `from_x` or `to_x`, when given: an x value.
    fn x_value(&self, x: Option<&str>) -> Result<Option<f64>, ClaimCause> {
        x.map(|x| self.x_at(x)).transpose()
    }

    /// `x`, which must name an x value (not `largest`, `peak`, ...).
    fn x_at(&self, x: &str) -> Result<f64, ClaimCause> {
        match self.at_text(Some(x))? {
            At::X(v) => Ok(v),
            _ => Err(ClaimCause::NotAnX),
        }
    }

    fn at_text(&self, at: Option<&str>) -> Result<At, ClaimCause> {
        match at {
            None | Some("largest") => Ok(At::Largest),
            Some("smallest") => Ok(At::Smallest),
            Some("peak") => Ok(At::Peak),
            Some("lowest") => Ok(At::Lowest),
            Some(x) => crate::units::parse_size_bytes(x)
                .map(|b| At::X(b as f64))
                .or_else(|_| x.parse::<f64>().map(At::X))
                .map_err(|_| ClaimCause::At(x.to_string())),
        }
    }

    fn expect(&self) -> Result<Expect, ClaimCause> {
        match (self.above, self.below) {
            (Some(a), Some(b)) if a < b => Ok(Expect::Between(a, b)),
            (Some(a), None) => Ok(Expect::Above(a)),
            (None, Some(b)) => Ok(Expect::Below(b)),
            _ => Err(ClaimCause::Expect),
        }
    }

    /// The published size, all three keys or none, agreeing with the
    /// claim's direction.
    fn size(&self, test: &ClaimTest) -> Result<Option<Size>, ClaimCause> {
        let (published, tolerance_pct, why) = match (
            self.published_value,
            self.size_tolerance_pct,
            &self.size_why,
        ) {
            (None, None, None) => return Ok(None),
            (Some(p), Some(t), Some(w)) => (p, t, w.trim()),
            _ => return Err(ClaimCause::SizeIncomplete),
        };
        if !(published.is_finite() && published > 0.0) {
            return Err(ClaimCause::SizeNotPositive(published));
        }
        if !(tolerance_pct > 0.0 && tolerance_pct < 100.0) {
            return Err(ClaimCause::SizeTolerance(tolerance_pct));
        }
        if why.is_empty() {
            return Err(ClaimCause::SizeWhyEmpty);
        }
        let expect = match test {
            ClaimTest::Falls { .. } | ClaimTest::Dropouts { .. } | ClaimTest::Unmeasurable(_) => {
                return Err(ClaimCause::SizeUnjudged(self.kind.clone()))
            }
            t => t.expect().ok_or(ClaimCause::NoDirection)?,
        };
        if !expect.admits(published) {
            return Err(ClaimCause::SizeContradicts(published));
        }
        Ok(Some(Size {
            published,
            tolerance_pct,
            why: why.to_string(),
        }))
    }

    /// The optional keys this claim gives.
    fn given(&self) -> Vec<&'static str> {
        [
            ("a", self.a.is_some()),
            ("b", self.b.is_some()),
            ("series", self.series.is_some()),
            ("at", self.at.is_some()),
            ("vs_at", self.vs_at.is_some()),
            ("metric", self.metric.is_some()),
            ("above", self.above.is_some()),
            ("below", self.below.is_some()),
            ("tolerance_pct", self.tolerance_pct.is_some()),
            ("from_x", self.from_x.is_some()),
            ("to_x", self.to_x.is_some()),
            ("why", self.why.is_some()),
            ("published_value", self.published_value.is_some()),
            ("size_tolerance_pct", self.size_tolerance_pct.is_some()),
            ("size_why", self.size_why.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, given)| given.then_some(k))
        .collect()
    }

    /// `above`/`below`, or `tolerance_pct` for a band around 1 (no
    /// change).
    fn expect_or_band(&self) -> Result<Expect, ClaimCause> {
        match self.tolerance_pct {
            Some(t) if t > 0.0 && t < 100.0 && self.above.is_none() && self.below.is_none() => {
                Ok(Expect::Between(1.0 - t / 100.0, 1.0 + t / 100.0))
            }
            Some(_) => Err(ClaimCause::Band),
            None => self.expect(),
        }
    }

    /// `at` (or `vs_at`) of a kind that compares two x: an x value, the
    /// smallest or the largest.
    fn end(&self, key: &'static str, at: Option<&str>) -> Result<At, ClaimCause> {
        match self.at_text(at)? {
            At::Peak | At::Lowest => Err(ClaimCause::EndNotX(key)),
            a => Ok(a),
        }
    }
}
