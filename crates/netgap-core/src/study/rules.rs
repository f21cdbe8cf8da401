//! A claim's rules: which keys each kind of claim takes, and how its raw
//! keys become the typed test, direction and size it is judged by.

use super::raw::RawClaim;
use super::validate::lookup;
use super::{At, Attr, Claim, ClaimTest, Expect, Quantity, Selector, Size};
use std::collections::BTreeMap;

fn selector(
    what: &str,
    claim: &str,
    m: Option<BTreeMap<String, String>>,
) -> Result<Selector, String> {
    let m = m.ok_or_else(|| format!("claim {claim:?}: no {what}"))?;
    m.into_iter()
        .map(|(k, v)| {
            lookup(&Attr::ALL, &k)
                .map(|a| (a, v))
                .ok_or_else(|| format!("claim {claim:?}: {what}: unknown attribute {k:?}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Selector)
}

impl RawClaim {
    /// The claim's `metric`, when it names one: a quantity
    /// ([`Quantity`]), or the claim is refused.
    fn quantity(&self, text: &str) -> Result<Option<Quantity>, String> {
        self.metric
            .as_deref()
            .map(Quantity::parse)
            .transpose()
            .map_err(|e| format!("claim {text:?}: metric {e}"))
    }

    fn at(&self) -> Result<At, String> {
        self.at_text(self.at.as_deref())
    }

    fn x_value(&self, x: Option<&str>) -> Result<Option<f64>, String> {
        match x {
            None => Ok(None),
            Some(_) => match self.at_text(x)? {
                At::X(v) => Ok(Some(v)),
                _ => Err(format!(
                    "claim {:?}: from_x, to_x and a knee's at are x values",
                    self.text
                )),
            },
        }
    }

    fn at_text(&self, at: Option<&str>) -> Result<At, String> {
        match at {
            None | Some("largest") => Ok(At::Largest),
            Some("smallest") => Ok(At::Smallest),
            Some("peak") => Ok(At::Peak),
            Some("lowest") => Ok(At::Lowest),
            Some(x) => crate::units::parse_size_bytes(x)
                .map(|b| At::X(b as f64))
                .or_else(|_| x.parse::<f64>().map(At::X))
                .map_err(|_| {
                    format!(
                        "claim {:?}: at {x:?}: want largest, smallest, peak, lowest or an x value",
                        self.text
                    )
                }),
        }
    }

    fn expect(&self) -> Result<Expect, String> {
        match (self.above, self.below) {
            (Some(a), Some(b)) if a < b => Ok(Expect::Between(a, b)),
            (Some(a), None) => Ok(Expect::Above(a)),
            (None, Some(b)) => Ok(Expect::Below(b)),
            _ => Err(format!(
                "claim {:?}: give above, below, or both with above < below",
                self.text
            )),
        }
    }

    /// The published size, all three keys or none, agreeing with the
    /// claim's direction.
    fn size(&self, test: &ClaimTest) -> Result<Option<Size>, String> {
        let text = &self.text;
        let (published, tolerance_pct, why) = match (
            self.published_value,
            self.size_tolerance_pct,
            &self.size_why,
        ) {
            (None, None, None) => return Ok(None),
            (Some(p), Some(t), Some(w)) => (p, t, w.trim()),
            _ => {
                return Err(format!(
                "claim {text:?}: give published_value, size_tolerance_pct and size_why together"
            ))
            }
        };
        if !(published.is_finite() && published > 0.0) {
            return Err(format!(
                "claim {text:?}: published_value {published}: want a positive number"
            ));
        }
        if !(tolerance_pct > 0.0 && tolerance_pct < 100.0) {
            return Err(format!(
                "claim {text:?}: size_tolerance_pct {tolerance_pct}: want a percent above 0 and below 100"
            ));
        }
        if why.is_empty() {
            return Err(format!(
                "claim {text:?}: size_why is empty: say why the tolerance"
            ));
        }
        let expect = match test {
            ClaimTest::Falls { .. } | ClaimTest::Dropouts { .. } | ClaimTest::Unmeasurable(_) => {
                return Err(format!(
                    "claim {text:?}: a claim of kind {} has no size to judge; leave out published_value",
                    self.kind
                ))
            }
            t => t.expect().ok_or_else(|| format!("claim {text:?}: no direction"))?,
        };
        if !expect.admits(published) {
            return Err(format!(
                "claim {text:?}: published_value {published} contradicts the claim's direction (above/below)"
            ));
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
    fn expect_or_band(&self) -> Result<Expect, String> {
        match self.tolerance_pct {
            Some(t) if t > 0.0 && t < 100.0 && self.above.is_none() && self.below.is_none() => {
                Ok(Expect::Between(1.0 - t / 100.0, 1.0 + t / 100.0))
            }
            Some(_) => Err(format!(
                "claim {:?}: tolerance_pct is a percent above 0 and below 100, without above or below",
                self.text
            )),
            None => self.expect(),
        }
    }

    /// `at` (or `vs_at`) of a kind that compares two x: an x value, the
    /// smallest or the largest.
    fn end(&self, key: &str, at: Option<&str>) -> Result<At, String> {
        match self.at_text(at)? {
            At::Peak | At::Lowest => Err(format!(
                "claim {:?}: {key} of a ratio_change is an x value, smallest or largest",
                self.text
            )),
            a => Ok(a),
        }
    }

    pub(crate) fn validate(self) -> Result<Claim, String> {
        let text = self.text.clone();
        const SIZE: [&str; 3] = ["published_value", "size_tolerance_pct", "size_why"];
        let unknown = |k: &str| {
            format!(
                "claim {text:?}: kind {k:?}: want ratio, trend, value, ratio_change, trends, knee, falls, dropouts or unmeasurable"
            )
        };
        let takes: &[&str] = match self.kind.as_str() {
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
            k => return Err(unknown(k)),
        };
        let sized = !matches!(self.kind.as_str(), "falls" | "dropouts" | "unmeasurable");
        if let Some(k) = self
            .given()
            .into_iter()
            .find(|k| !(takes.contains(k) || (sized && SIZE.contains(k))))
        {
            return Err(format!(
                "claim {text:?}: a claim of kind {} takes no {k}",
                self.kind
            ));
        }
        let test = match self.kind.as_str() {
            "ratio" => ClaimTest::Ratio {
                a: selector("a", &text, self.a.clone())?,
                b: selector("b", &text, self.b.clone())?,
                at: self.at()?,
                metric: self.quantity(&text)?,
                expect: self.expect_or_band()?,
            },
            "trend" => ClaimTest::Trend {
                series: selector("series", &text, self.series.clone())?,
                from_x: self.x_value(self.from_x.as_deref())?,
                to_x: self.x_value(self.to_x.as_deref())?,
                expect: self.expect_or_band()?,
            },
            "value" => ClaimTest::Value {
                series: selector("series", &text, self.series.clone())?,
                at: self.at()?,
                metric: self.quantity(&text)?,
                expect: self.expect()?,
            },
            "ratio_change" => {
                ClaimTest::RatioChange {
                    a: selector("a", &text, self.a.clone())?,
                    b: selector("b", &text, self.b.clone())?,
                    at: self.end("at", self.at.as_deref())?,
                    vs: self.end(
                        "vs_at",
                        Some(self.vs_at.as_deref().ok_or_else(|| {
                            format!("claim {text:?}: a ratio_change needs vs_at")
                        })?),
                    )?,
                    expect: self.expect_or_band()?,
                }
            }
            "trends" => ClaimTest::Trends {
                a: selector("a", &text, self.a.clone())?,
                b: selector("b", &text, self.b.clone())?,
                from_x: self.x_value(self.from_x.as_deref())?,
                to_x: self.x_value(self.to_x.as_deref())?,
                expect: self.expect_or_band()?,
            },
            "knee" => ClaimTest::Knee {
                series: selector("series", &text, self.series.clone())?,
                x: self
                    .x_value(Some(self.at.as_deref().ok_or_else(|| {
                        format!("claim {text:?}: a knee needs at, the x where the slope changes")
                    })?))?
                    .ok_or_else(|| format!("claim {text:?}: a knee's at is an x value"))?,
                expect: self.expect()?,
            },
            "falls" => ClaimTest::Falls {
                series: selector("series", &text, self.series.clone())?,
                metric: self.quantity(&text)?,
                expect: self.expect()?,
            },
            "dropouts" => ClaimTest::Dropouts {
                with: selector("a", &text, self.a.clone())?,
                without: selector("b", &text, self.b.clone())?,
            },
            "unmeasurable" => ClaimTest::Unmeasurable(
                self.why
                    .clone()
                    .ok_or_else(|| format!("claim {text:?}: unmeasurable needs `why`"))?,
            ),
            k => return Err(unknown(k)),
        };
        let size = self.size(&test)?;
        let from = if self.from.is_empty() {
            vec![self.figure.clone()]
        } else {
            self.from.clone()
        };
        Ok(Claim {
            from,
            figure: self.figure,
            text: self.text,
            published: self.published,
            where_: self.where_,
            test,
            size,
            no_mechanism: match self.no_mechanism {
                Some(why) if why.trim().is_empty() => {
                    return Err(format!(
                        "claim {text:?}: no_mechanism says why the stand-in lacks the claim's mechanism; it is empty"
                    ))
                }
                m => m,
            },
        })
    }
}
