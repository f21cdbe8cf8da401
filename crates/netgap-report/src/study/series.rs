//! Reading a figure's records: the records of one figure of a study (by
//! their label), their series by what the figure compares, and the one
//! series a claim's selector picks, or why it picks none.

use super::figure_label;
use super::format::{fmt_num, fmt_x, fmt_xs};
use netgap_core::record::ResultRecord;
use netgap_core::study::{At, Attr, Figure, Quantity, Selector, XAxis};
use std::collections::BTreeMap;

/// One point of a series: x, y and y's 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) ci: Option<(f64, f64)>,
}

/// Why a claim's selector picks no series of a figure's records: the
/// reason the claim cannot be judged, as its row says it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum PickError {
    /// Two records it picks sit at one x.
    #[error("{selector} picks more than one series (two records at x = {})", fmt_num(*.x))]
    SeveralSeries {
        /// The selector.
        selector: Selector,
        /// The x both records sit at.
        x: f64,
    },
    /// No record names the attribute at all.
    #[error("no record has {attr}={want}: none names a {attr}")]
    NoneNames {
        /// The attribute's name.
        attr: &'static str,
        /// The value the selector wants.
        want: String,
    },
    /// The records name the attribute, but none has the value wanted.
    #[error("no record has {attr}={want} (they have {attr} {have})")]
    OtherValues {
        /// The attribute's name.
        attr: &'static str,
        /// The value the selector wants.
        want: String,
        /// The values the records have, a few of them.
        have: String,
    },
    /// The records it picks lack the quantity or a place on the x-axis.
    #[error("the records of {selector} carry no {metric} or no place on the figure's x-axis")]
    NoValue {
        /// The selector.
        selector: Selector,
        /// The quantity read.
        metric: Quantity,
    },
    /// Each value it wants is there, but no record has them all.
    #[error("no record has all of {selector} at once")]
    NoCombination {
        /// The selector.
        selector: Selector,
    },
}

/// A record's value of `attr`, as a study file's selectors name it
/// ([`Attr::of`]).
pub fn attr(rec: &ResultRecord, attr: Attr) -> Option<String> {
    attr.of(rec)
}

/// Where a record's point comes along its series: its x, except on NetPIPE's
/// signature graph (x the block time), whose line follows the sweep from
/// block to block, so a larger block that took less time than the one
/// before shows as the curve doubling back.
fn order_of(rec: &ResultRecord, x: XAxis) -> Option<f64> {
    match x {
        XAxis::BlockTime => XAxis::Size.of(rec),
        _ => x.of(rec),
    }
}

pub(crate) fn series_name(rec: &ResultRecord, attrs: &[Attr]) -> String {
    if attrs.is_empty() {
        return "measured".to_string();
    }
    attrs
        .iter()
        .map(|a| {
            format!(
                "{}={}",
                a.name(),
                attr(rec, *a).unwrap_or_else(|| "?".into())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The records of a study's figure.
pub(crate) fn records_of<'a>(
    records: &'a [ResultRecord],
    study: &str,
    figure: &str,
) -> Vec<&'a ResultRecord> {
    let label = figure_label(study, figure);
    records
        .iter()
        .filter(|r| r.stack.as_ref().and_then(|s| s.label.as_deref()) == Some(label.as_str()))
        .collect()
}

/// Series of `recs` by `attrs`, each sorted by x; records without x or y
/// are left out.
pub(crate) fn series_of(
    recs: &[&ResultRecord],
    attrs: &[Attr],
    x: XAxis,
    metric: &Quantity,
) -> BTreeMap<String, Vec<Point>> {
    let mut out: BTreeMap<String, Vec<(f64, Point)>> = BTreeMap::new();
    for r in recs {
        let (Some(xv), Some(order), Some((y, ci))) = (x.of(r), order_of(r, x), metric.of(r)) else {
            continue;
        };
        out.entry(series_name(r, attrs))
            .or_default()
            .push((order, Point { x: xv, y, ci }));
    }
    out.into_iter()
        .map(|(name, mut pts)| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (name, pts.into_iter().map(|(_, p)| p).collect())
        })
        .collect()
}

pub(crate) fn matches(rec: &ResultRecord, sel: &Selector) -> bool {
    sel.0
        .iter()
        .all(|(a, want)| attr(rec, *a).as_deref() == Some(want.as_str()))
}

/// The one series of `recs` that `sel` picks, by x; an error when it
/// picks none or several points at one x.
pub(crate) fn pick(
    recs: &[&ResultRecord],
    sel: &Selector,
    x: XAxis,
    metric: &Quantity,
) -> Result<Vec<Point>, PickError> {
    let mut pts: Vec<Point> = Vec::new();
    for r in recs.iter().filter(|r| matches(r, sel)) {
        let (Some(xv), Some((y, ci))) = (x.of(r), metric.of(r)) else {
            continue;
        };
        if pts.iter().any(|p| p.x == xv) {
            return Err(PickError::SeveralSeries {
                selector: sel.clone(),
                x: xv,
            });
        }
        pts.push(Point { x: xv, y, ci });
    }
    if pts.is_empty() {
        return Err(no_record(recs, sel, metric));
    }
    pts.sort_by(|a, b| a.x.total_cmp(&b.x));
    Ok(pts)
}

/// Why `sel` picks no point of `recs`: the first attribute no record has
/// the value of, with the values they do have; or that the records it
/// picks carry no x or no `metric`.
fn no_record(recs: &[&ResultRecord], sel: &Selector, metric: &Quantity) -> PickError {
    for (a, want) in &sel.0 {
        let mut have: Vec<String> = recs.iter().filter_map(|r| attr(r, *a)).collect();
        have.sort();
        have.dedup();
        if !have.contains(want) {
            let attr = a.name();
            let want = want.clone();
            return if have.is_empty() {
                PickError::NoneNames { attr, want }
            } else {
                PickError::OtherValues {
                    attr,
                    want,
                    have: fmt_xs(&have, 8),
                }
            };
        }
    }
    if recs.iter().any(|r| matches(r, sel)) {
        PickError::NoValue {
            selector: sel.clone(),
            metric: metric.clone(),
        }
    } else {
        PickError::NoCombination {
            selector: sel.clone(),
        }
    }
}

/// Why a series lacks the point at `want` a claim reads: the x it has,
/// and when the figure lists `want`, that this run left it out.
pub(crate) fn absent_x(fig: &Figure, what: &str, have: &[f64], want: f64) -> String {
    let have: Vec<String> = have.iter().map(|v| fmt_x(*v, fig.x)).collect();
    let mut s = format!(
        "{what} has no point at x = {} (it has {})",
        fmt_x(want, fig.x),
        fmt_xs(&have, 8)
    );
    if fig.x_values().is_some_and(|l| l.contains(&want)) {
        s.push_str(
            "; the figure lists that x, but this run did not measure it (a --quick run measures only the ends of a count axis and the quick sizes)",
        );
    }
    s
}

/// The x values of `pts`.
pub(crate) fn xs(pts: &[Point]) -> Vec<f64> {
    pts.iter().map(|p| p.x).collect()
}

/// The point of `pts` at `at`, given the x both series share.
pub(crate) fn point_at(pts: &[Point], at: At, common: &[f64]) -> Option<Point> {
    match at {
        At::Largest => common
            .last()
            .and_then(|x| pts.iter().find(|p| p.x == *x))
            .copied(),
        At::Smallest => common
            .first()
            .and_then(|x| pts.iter().find(|p| p.x == *x))
            .copied(),
        At::Peak => pts.iter().copied().max_by(|a, b| a.y.total_cmp(&b.y)),
        At::Lowest => pts.iter().copied().min_by(|a, b| a.y.total_cmp(&b.y)),
        At::X(x) => pts.iter().find(|p| p.x == x).copied(),
    }
}

pub(crate) fn common_x(a: &[Point], b: &[Point]) -> Vec<f64> {
    a.iter()
        .map(|p| p.x)
        .filter(|x| b.iter().any(|q| q.x == *x))
        .collect()
}

/// The sweep points `sel` picks that NetPIPE's detector flagged as
/// dropouts, and those it left unjudged as unstable, by x.
pub(crate) fn dropouts_of(
    recs: &[&ResultRecord],
    sel: &Selector,
    x: XAxis,
) -> Result<(Vec<f64>, Vec<f64>), PickError> {
    let picked: Vec<&&ResultRecord> = recs.iter().filter(|r| matches(r, sel)).collect();
    if picked.is_empty() {
        return Err(no_record(recs, sel, &Quantity::Dropouts));
    }
    let flagged = |is: &dyn Fn(&ResultRecord) -> bool| -> Vec<f64> {
        let mut xs: Vec<f64> = picked
            .iter()
            .filter(|r| is(r))
            .filter_map(|r| x.of(r))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs
    };
    let dropout = |r: &ResultRecord| r.dropout().is_some();
    let unstable = |r: &ResultRecord| r.sweep.as_ref().is_some_and(|s| s.unstable.is_some());
    Ok((flagged(&dropout), flagged(&unstable)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::fixtures::*;

    #[test]
    fn a_record_names_its_link_rate_and_its_links() {
        let mut r = rec("1", "on", 1024, 1.0);
        if let Some(s) = r.stack.as_mut() {
            s.path.rate_bps = Some(10_000_000);
        }
        workload(&mut r, 2).links = vec![link(1.0); 2];
        assert_eq!(attr(&r, Attr::Rate).as_deref(), Some("10M"));
        assert_eq!(attr(&r, Attr::Links).as_deref(), Some("2"));
        if let Some(s) = r.stack.as_mut() {
            s.path.rate_bps = Some(1_000_000_000);
        }
        assert_eq!(attr(&r, Attr::Rate).as_deref(), Some("1G"));
    }
}
