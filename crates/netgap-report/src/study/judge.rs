//! Judging a claim from the records: its direction, by the rule of its
//! kind read with the 95% interval, and its size against the paper's
//! figure within the study file's tolerance; and, in a run, why a claim
//! read from a figure that was not measured is not judged.

use super::format::{fmt_num, fmt_trim, fmt_x, fmt_xs, unit_label};
use super::series::{
    absent_x, common_x, dropouts_of, pick, point_at, records_of, xs, PickError, Point,
};
use super::{Judged, Outcome, SizeVerdict, Verdict};
use netgap_core::record::ResultRecord;
use netgap_core::study::{
    At, Attr, Claim, ClaimTest, Expect, Figure, Quantity, Selector, Size, Study, XAxis,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Half-width of a point's interval relative to its value.
fn rel_half(p: &Point) -> Option<f64> {
    p.ci.filter(|_| p.y != 0.0)
        .map(|(lo, hi)| ((hi - lo) / 2.0 / p.y).abs())
}

/// `a / b` with an interval propagated from the two relative half-widths.
pub(crate) fn ratio(a: &Point, b: &Point) -> (f64, Option<(f64, f64)>) {
    let r = a.y / b.y;
    let ci = rel_half(a)
        .zip(rel_half(b))
        .map(|(ra, rb)| (ra * ra + rb * rb).sqrt())
        .map(|rel| (r * (1.0 - rel), r * (1.0 + rel)));
    (r, ci)
}

/// Whether `value` with its 95% interval meets `expect`: past a threshold,
/// or inside a band, with the whole interval; a value without an interval
/// is judged on itself, and says so.
pub(crate) fn verdict(value: f64, ci: Option<(f64, f64)>, expect: Expect) -> Verdict {
    let Some((lo, hi)) = ci else {
        let meets = match expect {
            Expect::Above(t) => value > t,
            Expect::Below(t) => value < t,
            Expect::Between(a, b) => value >= a && value <= b,
        };
        return if meets {
            Verdict::HoldsOnValue
        } else {
            Verdict::DoesNotHold(format!("{} (no interval)", missed(expect)))
        };
    };
    match expect {
        Expect::Above(t) if lo > t => Verdict::Holds,
        Expect::Above(t) if value > t => Verdict::DoesNotHold(format!(
            "above {} but its interval reaches down to {}",
            fmt_num(t),
            fmt_num(lo)
        )),
        Expect::Below(t) if hi < t => Verdict::Holds,
        Expect::Below(t) if value < t => Verdict::DoesNotHold(format!(
            "below {} but its interval reaches up to {}",
            fmt_num(t),
            fmt_num(hi)
        )),
        Expect::Between(a, b) if lo >= a && hi <= b => Verdict::Holds,
        Expect::Between(a, b) if value >= a && value <= b => Verdict::DoesNotHold(format!(
            "within {} to {} but its interval, {} to {}, is not",
            fmt_num(a),
            fmt_num(b),
            fmt_num(lo),
            fmt_num(hi)
        )),
        e => Verdict::DoesNotHold(missed(e)),
    }
}

/// What a value that misses `expect` misses.
fn missed(expect: Expect) -> String {
    match expect {
        Expect::Above(t) => format!("not above {}", fmt_num(t)),
        Expect::Below(t) => format!("not below {}", fmt_num(t)),
        Expect::Between(a, b) => format!("outside {} to {}", fmt_num(a), fmt_num(b)),
    }
}

/// The size of a measured figure against the paper's, judged as the
/// direction is, by the whole 95% interval: inside `size`'s band it holds,
/// wholly outside it it does not, and across an edge it is undecided (an
/// interval wide enough to hold any size must not confirm the paper's); a
/// value without an interval is not judged.
fn size_verdict(size: &Size, measured: Option<f64>, ci: Option<(f64, f64)>) -> SizeVerdict {
    let Some(value) = measured else {
        return SizeVerdict::NotJudged;
    };
    let (bl, bh) = size.band();
    let band = format!("{} to {}", fmt_trim(bl), fmt_trim(bh));
    let Some((lo, hi)) = ci else {
        let place = if value < bl {
            "below"
        } else if value > bh {
            "above"
        } else {
            "inside"
        };
        return SizeVerdict::NoInterval(format!("its value lies {place} {band}"));
    };
    if hi < bl {
        SizeVerdict::DoesNotHold(format!(
            "its interval, {} to {}, lies below {band}",
            fmt_num(lo),
            fmt_num(hi)
        ))
    } else if lo > bh {
        SizeVerdict::DoesNotHold(format!(
            "its interval, {} to {}, lies above {band}",
            fmt_num(lo),
            fmt_num(hi)
        ))
    } else if lo >= bl && hi <= bh {
        SizeVerdict::Holds
    } else {
        SizeVerdict::Undecided(format!(
            "its interval, {} to {}, reaches past {band}; more repetitions or a quieter host would narrow it",
            fmt_num(lo),
            fmt_num(hi)
        ))
    }
}

pub(crate) fn cannot(why: String) -> Judged {
    Judged {
        measured: None,
        ci: None,
        how: String::new(),
        direction: Verdict::CannotMeasure(why),
        size: SizeVerdict::NotJudged,
    }
}

/// Judges `claim` from the records of the figures it reads: its
/// direction, and its size when the paper gives one.
pub fn judge(study: &Study, claim: &Claim, records: &[ResultRecord]) -> Judged {
    let mut j = judge_direction(study, claim, records);
    if let Some(why) = &claim.no_mechanism {
        j.direction = Verdict::NoMechanism(why.clone());
        j.size = SizeVerdict::NotJudged;
        return j;
    }
    j.size = match (&claim.size, &j.direction) {
        (None, _) => SizeVerdict::DirectionOnly,
        (Some(_), Verdict::CannotMeasure(_)) => SizeVerdict::NotJudged,
        (Some(s), _) => size_verdict(s, j.measured, j.ci),
    };
    j
}

/// A ratio as a point, to be divided again.
fn as_point(r: (f64, Option<(f64, f64)>)) -> Point {
    Point {
        x: 0.0,
        y: r.0,
        ci: r.1,
    }
}

/// The knee factor of a slope `above` past the knee over a slope `below`
/// up to it: their quotient when the series rises up to the knee,
/// infinite when it does not but rises past it, 0 when it does not rise
/// past it. It grows with `above` and shrinks with `below`, so an interval
/// of each bounds it.
fn knee_factor(above: f64, below: f64) -> f64 {
    if above <= 0.0 {
        0.0
    } else if below <= 0.0 {
        f64::INFINITY
    } else {
        above / below
    }
}

/// The places where `pts` falls from one point to the next: the x pairs,
/// and whether every pair compared had intervals.
fn falls_of(pts: &[Point]) -> (Vec<(f64, f64)>, bool) {
    let mut places = Vec::new();
    let mut all_intervals = true;
    for w in pts.windows(2) {
        let (p, q) = (w[0], w[1]);
        let fell = match (p.ci, q.ci) {
            (Some((p_lo, _)), Some((_, q_hi))) => q_hi < p_lo,
            _ => {
                all_intervals = false;
                q.y < p.y
            }
        };
        if fell {
            places.push((p.x, q.x));
        }
    }
    (places, all_intervals)
}

/// What every rule of a claim reads: the figure it is read on, the records
/// of the figures it is read from, and those figures named, to open the
/// reason a rule cannot judge.
struct Reading<'a> {
    fig: &'a Figure,
    recs: Vec<&'a ResultRecord>,
    /// `figure 2`, or `figures 2 and 3`.
    figures: String,
}

impl Reading<'_> {
    /// The figure's x-axis, which every rule reads along unless it names
    /// its own.
    fn x(&self) -> XAxis {
        self.fig.x
    }

    /// The claim cannot be judged: these records lack what its rule reads.
    fn missing(&self, why: String) -> Judged {
        cannot(format!("{}: {why}", self.figures))
    }

    /// The two series `a` and `b` of `metric` a two-sided rule compares.
    fn both(
        &self,
        a: &Selector,
        b: &Selector,
        x: XAxis,
        metric: &Quantity,
    ) -> Result<(Vec<Point>, Vec<Point>), PickError> {
        Ok((
            pick(&self.recs, a, x, metric)?,
            pick(&self.recs, b, x, metric)?,
        ))
    }
}

/// `claim`'s direction; its size is left to [`judge`].
fn judge_direction(study: &Study, claim: &Claim, records: &[ResultRecord]) -> Judged {
    let Some(fig) = study.figure(&claim.figure) else {
        return cannot(format!("the study has no figure {}", claim.figure));
    };
    let recs: Vec<&ResultRecord> = claim
        .from
        .iter()
        .flat_map(|f| records_of(records, &study.id, f))
        .collect();
    let figure_s = if claim.from.len() == 1 {
        "figure"
    } else {
        "figures"
    };
    let figures = format!("{figure_s} {}", claim.from.join(" and "));
    if recs.is_empty() && !matches!(claim.test, ClaimTest::Unmeasurable(_)) {
        return cannot(format!("the results hold no record of {figures}"));
    }
    if let Some(r) = recs.iter().find(|r| {
        r.warnings
            .iter()
            .any(|w| w == netgap_core::record::WITHOUT_LIBRARY_WARNING)
    }) {
        return cannot(format!(
            "{figures}: the {} points ran without the preload library, on the kernel's TCP",
            r.transport
        ));
    }
    let r = Reading { fig, recs, figures };
    match &claim.test {
        ClaimTest::Unmeasurable(why) => cannot(why.clone()),
        ClaimTest::RatioChange {
            a,
            b,
            at,
            vs,
            expect,
        } => judge_ratio_change(&r, a, b, (*at, *vs), *expect),
        ClaimTest::Trends {
            a,
            b,
            from_x,
            to_x,
            expect,
        } => judge_trends(&r, a, b, (*from_x, *to_x), *expect),
        ClaimTest::Dropouts { with, without } => judge_dropouts(&r, with, without),
        ClaimTest::Knee {
            series,
            x: k,
            expect,
        } => judge_knee(&r, series, *k, *expect),
        ClaimTest::Falls {
            series,
            metric,
            expect,
        } => judge_falls(&r, series, metric.as_ref(), *expect),
        ClaimTest::Ratio {
            a,
            b,
            at,
            metric,
            expect,
        } => judge_ratio(&r, a, b, *at, metric.as_ref(), *expect),
        ClaimTest::Trend {
            series,
            from_x,
            to_x,
            expect,
        } => judge_trend(&r, series, (*from_x, *to_x), *expect),
        ClaimTest::Value {
            series,
            at,
            metric,
            expect,
        } => judge_value(&r, series, *at, metric.as_ref(), *expect),
    }
}

/// `ratio_change`: how the ratio of `a` to `b` at one x (`at.0`) stands
/// against their ratio at another (`at.1`), both read at x the two series
/// share.
fn judge_ratio_change(
    r: &Reading<'_>,
    a: &Selector,
    b: &Selector,
    (at, vs): (At, At),
    expect: Expect,
) -> Judged {
    let x = r.x();
    let (pa, pb) = match r.both(a, b, x, &r.fig.y) {
        Ok(both) => both,
        Err(e) => return r.missing(e.to_string()),
    };
    let common = common_x(&pa, &pb);
    let ends = (
        point_at(&pa, at, &common),
        point_at(&pb, at, &common),
        point_at(&pa, vs, &common),
        point_at(&pb, vs, &common),
    );
    let (Some(a1), Some(b1), Some(a2), Some(b2)) = ends else {
        return r.missing(format!(
            "{a} and {b} do not both have the two x the claim compares (both have {})",
            fmt_xs(&common.iter().map(|v| fmt_x(*v, x)).collect::<Vec<_>>(), 8)
        ));
    };
    if a1.x == a2.x || b1.x != a1.x || b2.x != a2.x {
        return r.missing(format!(
            "{a} and {b} have fewer than two x in common to compare"
        ));
    }
    if b1.y == 0.0 || b2.y == 0.0 || a2.y == 0.0 {
        return r.missing(format!("{b} or {a} measured 0"));
    }
    let (r1, r2) = (ratio(&a1, &b1), ratio(&a2, &b2));
    let (value, ci) = ratio(&as_point(r1), &as_point(r2));
    Judged {
        measured: Some(value),
        ci,
        how: format!(
            "{a} / {b}: {} at {} over {} at {}",
            fmt_num(r1.0),
            fmt_x(a1.x, x),
            fmt_num(r2.0),
            fmt_x(a2.x, x)
        ),
        direction: verdict(value, ci, expect),
        size: SizeVerdict::NotJudged,
    }
}

/// `trends`: how `a` grows from one x to another over how `b` grows
/// between the same two x (the first and last both share, unless named).
fn judge_trends(
    r: &Reading<'_>,
    a: &Selector,
    b: &Selector,
    (from_x, to_x): (Option<f64>, Option<f64>),
    expect: Expect,
) -> Judged {
    let x = r.x();
    let (pa, pb) = match r.both(a, b, x, &r.fig.y) {
        Ok(both) => both,
        Err(e) => return r.missing(e.to_string()),
    };
    let common = common_x(&pa, &pb);
    let (Some(x0), Some(x1)) = (
        from_x.or(common.first().copied()),
        to_x.or(common.last().copied()),
    ) else {
        return r.missing(format!("{a} and {b} have no x in common"));
    };
    let at = |pts: &[Point], v: f64| pts.iter().find(|p| p.x == v).copied();
    let (Some(a0), Some(a1), Some(b0), Some(b1)) =
        (at(&pa, x0), at(&pa, x1), at(&pb, x0), at(&pb, x1))
    else {
        return r.missing(format!(
            "{a} and {b} do not both have x = {} and x = {} (both have {})",
            fmt_x(x0, x),
            fmt_x(x1, x),
            fmt_xs(&common.iter().map(|v| fmt_x(*v, x)).collect::<Vec<_>>(), 8)
        ));
    };
    if x0 == x1 || a0.y == 0.0 || b0.y == 0.0 {
        return r.missing(format!(
            "{a} and {b} have too few points in common to show a trend here"
        ));
    }
    let (ta, tb) = (ratio(&a1, &a0), ratio(&b1, &b0));
    if tb.0 == 0.0 {
        return r.missing(format!("{b} measured 0 at x = {}", fmt_x(x1, x)));
    }
    let (value, ci) = ratio(&as_point(ta), &as_point(tb));
    Judged {
        measured: Some(value),
        ci,
        how: format!(
            "from {} to {}: {a} × {} / {b} × {}",
            fmt_x(x0, x),
            fmt_x(x1, x),
            fmt_num(ta.0),
            fmt_num(tb.0)
        ),
        direction: verdict(value, ci, expect),
        size: SizeVerdict::NotJudged,
    }
}

/// `dropouts`: the change removes NetPIPE's dropouts when the series
/// `with` has some and `without` has none.
fn judge_dropouts(r: &Reading<'_>, with: &Selector, without: &Selector) -> Judged {
    let x = r.x();
    let (w, wo) = match (
        dropouts_of(&r.recs, with, x),
        dropouts_of(&r.recs, without, x),
    ) {
        (Ok(w), Ok(wo)) => (w, wo),
        (Err(e), _) | (_, Err(e)) => return r.missing(e.to_string()),
    };
    let how = format!(
        "{with}: {}; {without}: {}",
        dropout_list(&w, x),
        dropout_list(&wo, x)
    );
    let direction = match (w.0.is_empty(), wo.0.is_empty()) {
        (false, true) => Verdict::Holds,
        (_, false) => Verdict::DoesNotHold(format!("{without} has dropouts too")),
        (true, true) => Verdict::DoesNotHold(format!(
            "{with} has no dropout either: nothing here for the change to remove"
        )),
    };
    Judged {
        measured: None,
        ci: None,
        how,
        direction,
        size: SizeVerdict::NotJudged,
    }
}

/// A series' dropouts and unstable points ([`dropouts_of`]) in words:
/// how many and where.
fn dropout_list((drops, unstable): &(Vec<f64>, Vec<f64>), x: XAxis) -> String {
    let mut s = if drops.is_empty() {
        "no dropout".to_string()
    } else {
        format!(
            "{} dropout{} (at {})",
            drops.len(),
            if drops.len() == 1 { "" } else { "s" },
            fmt_xs(&drops.iter().map(|v| fmt_x(*v, x)).collect::<Vec<_>>(), 6)
        )
    };
    if !unstable.is_empty() {
        let _ = write!(
            s,
            ", {} unstable point{} not judged",
            unstable.len(),
            if unstable.len() == 1 { "" } else { "s" }
        );
    }
    s
}

/// `knee`: how much steeper `series` rises past x = `k` than up to it.
fn judge_knee(r: &Reading<'_>, series: &Selector, k: f64, expect: Expect) -> Judged {
    let x = r.x();
    let pts = match pick(&r.recs, series, x, &r.fig.y) {
        Ok(p) => p,
        Err(e) => return r.missing(e.to_string()),
    };
    let (Some(first), Some(last)) = (pts.first().copied(), pts.last().copied()) else {
        return r.missing(format!("no record of {series} was measured here"));
    };
    let Some(knee) = pts.iter().find(|p| p.x == k).copied() else {
        return r.missing(format!(
            "{series} has no point at x = {} (it has {})",
            fmt_x(k, x),
            fmt_xs(&pts.iter().map(|p| fmt_x(p.x, x)).collect::<Vec<_>>(), 8)
        ));
    };
    if !(first.x < knee.x && knee.x < last.x) {
        return r.missing(format!(
            "{series} needs points below and above x = {} to show a knee there",
            fmt_x(k, x)
        ));
    }
    let slope = |p: Point, q: Point| (q.y - p.y) / (q.x - p.x);
    let factor = knee_factor(slope(knee, last), slope(first, knee));
    let ci = knee_interval(first, knee, last);
    Judged {
        measured: Some(factor),
        ci,
        how: format!(
            "{series}: slope {} per unit x from {} to {}, over {} from {} to {}",
            fmt_num(slope(knee, last)),
            fmt_x(knee.x, x),
            fmt_x(last.x, x),
            fmt_num(slope(first, knee)),
            fmt_x(first.x, x),
            fmt_x(knee.x, x)
        ),
        direction: verdict(factor, ci, expect),
        size: SizeVerdict::NotJudged,
    }
}

/// The interval of a knee factor: the shallowest rise past the knee over
/// the steepest up to it, and the other way round; none unless all three
/// points have intervals.
fn knee_interval(first: Point, knee: Point, last: Point) -> Option<(f64, f64)> {
    let ((f_lo, f_hi), (k_lo, k_hi), (l_lo, l_hi)) = (first.ci?, knee.ci?, last.ci?);
    let below = |ky: f64, fy: f64| (ky - fy) / (knee.x - first.x);
    let above = |ly: f64, ky: f64| (ly - ky) / (last.x - knee.x);
    Some((
        knee_factor(above(l_lo, k_hi), below(k_hi, f_lo)),
        knee_factor(above(l_hi, k_lo), below(k_lo, f_hi)),
    ))
}

/// `falls`: how many times `series` falls from one point to the next,
/// beyond both points' intervals; along the block size when the claim
/// names a metric of its own.
fn judge_falls(
    r: &Reading<'_>,
    series: &Selector,
    metric: Option<&Quantity>,
    expect: Expect,
) -> Judged {
    // Another metric than the figure's y falls along the block size,
    // whatever the figure plots it against.
    let (x, metric, what) = match metric {
        Some(m) => (XAxis::Size, m, format!(" {}", unit_label(m))),
        None => (r.x(), &r.fig.y, String::new()),
    };
    let pts = match pick(&r.recs, series, x, metric) {
        Ok(p) => p,
        Err(e) => return r.missing(e.to_string()),
    };
    if pts.len() < 2 {
        return r.missing(format!(
            "{series} has too few points to show where it falls"
        ));
    }
    let (places, all_intervals) = falls_of(&pts);
    let count = places.len() as f64;
    let shown: Vec<String> = places
        .iter()
        .map(|(p, q)| format!("{} to {}", fmt_x(*p, x), fmt_x(*q, x)))
        .collect();
    let mut how = format!(
        "{series}:{what} falls {} time{} over {} points",
        places.len(),
        if places.len() == 1 { "" } else { "s" },
        pts.len()
    );
    if !shown.is_empty() {
        let _ = write!(how, " ({})", fmt_xs(&shown, 6));
    }
    // A count of falls beyond both points' intervals is judged by the
    // intervals; where a point had none, on values alone.
    let direction = match verdict(count, None, expect) {
        Verdict::HoldsOnValue if all_intervals => Verdict::Holds,
        Verdict::DoesNotHold(_) => Verdict::DoesNotHold(missed(expect)),
        v => v,
    };
    if !all_intervals {
        how.push_str("; some points have no interval, so their falls are on values");
    }
    Judged {
        measured: Some(count),
        ci: None,
        how,
        direction,
        size: SizeVerdict::NotJudged,
    }
}

/// `ratio`: `a` over `b` at one place (an x, the ends they share, each
/// one's peak or lowest), of the figure's y or of the metric it names.
fn judge_ratio(
    r: &Reading<'_>,
    a: &Selector,
    b: &Selector,
    at: At,
    metric: Option<&Quantity>,
    expect: Expect,
) -> Judged {
    let x = r.x();
    let y = metric.unwrap_or(&r.fig.y);
    let (pa, pb) = match r.both(a, b, x, y) {
        Ok(both) => both,
        Err(e) => return r.missing(e.to_string()),
    };
    let common = common_x(&pa, &pb);
    let (Some(va), Some(vb)) = (point_at(&pa, at, &common), point_at(&pb, at, &common)) else {
        return r.missing(match at {
            At::X(want) if !pa.iter().any(|p| p.x == want) => {
                absent_x(r.fig, &a.to_string(), &xs(&pa), want)
            }
            At::X(want) => absent_x(r.fig, &b.to_string(), &xs(&pb), want),
            _ => format!("{a} and {b} have no point in common"),
        });
    };
    if vb.y == 0.0 {
        return r.missing(format!("{b} measured 0"));
    }
    let (value, ci) = ratio(&va, &vb);
    let of = metric.map_or(String::new(), |m| format!("{}, ", unit_label(m)));
    Judged {
        measured: Some(value),
        ci,
        how: format!(
            "{of}{a}: {} at {} / {b}: {} at {}",
            fmt_num(va.y),
            fmt_x(va.x, x),
            fmt_num(vb.y),
            fmt_x(vb.x, x)
        ),
        direction: verdict(value, ci, expect),
        size: SizeVerdict::NotJudged,
    }
}

/// `trend`: `series` at one x over itself at another (its last and first,
/// unless named).
fn judge_trend(
    r: &Reading<'_>,
    series: &Selector,
    (from_x, to_x): (Option<f64>, Option<f64>),
    expect: Expect,
) -> Judged {
    let x = r.x();
    let pts = match pick(&r.recs, series, x, &r.fig.y) {
        Ok(p) => p,
        Err(e) => return r.missing(e.to_string()),
    };
    let from = from_x.map_or(pts.first().copied(), |fx| {
        pts.iter().find(|p| p.x == fx).copied()
    });
    let to = to_x.map_or(pts.last().copied(), |tx| {
        pts.iter().find(|p| p.x == tx).copied()
    });
    let (Some(from), Some(to)) = (from, to) else {
        // Only an x the claim names can be missing.
        let want = if from.is_none() { from_x } else { to_x };
        return r.missing(match want {
            Some(want) => absent_x(r.fig, &series.to_string(), &xs(&pts), want),
            None => format!("{series} has too few points to show a trend here"),
        });
    };
    if pts.len() < 2 || from.x == to.x || from.y == 0.0 {
        return r.missing(format!("{series} has too few points to show a trend here"));
    }
    let (value, ci) = ratio(&to, &from);
    Judged {
        measured: Some(value),
        ci,
        how: format!(
            "{series}: {} at {} / {} at {}",
            fmt_num(to.y),
            fmt_x(to.x, x),
            fmt_num(from.y),
            fmt_x(from.x, x)
        ),
        direction: verdict(value, ci, expect),
        size: SizeVerdict::NotJudged,
    }
}

/// `value`: `series` itself at one place, of the figure's y or of the
/// metric it names; a count of dropouts is summed over the whole series.
fn judge_value(
    r: &Reading<'_>,
    series: &Selector,
    at: At,
    metric: Option<&Quantity>,
    expect: Expect,
) -> Judged {
    let metric = metric.unwrap_or(&r.fig.y);
    let pts = match pick(&r.recs, series, r.x(), metric) {
        Ok(p) => p,
        Err(e) => return r.missing(e.to_string()),
    };
    let all: Vec<f64> = pts.iter().map(|p| p.x).collect();
    let value = if *metric == Quantity::Dropouts {
        // Counted over the whole series, not at one point.
        Some(Point {
            x: 0.0,
            y: pts.iter().map(|p| p.y).sum(),
            ci: None,
        })
    } else {
        point_at(&pts, at, &all)
    };
    let Some(p) = value else {
        return r.missing(match at {
            At::X(want) => absent_x(r.fig, &series.to_string(), &all, want),
            _ => format!("{series} has no point there"),
        });
    };
    let direction = match verdict(p.y, p.ci, expect) {
        // The detector flagged each dropout past its points' noise: the
        // count is judged with it.
        Verdict::HoldsOnValue if *metric == Quantity::Dropouts => Verdict::Holds,
        v => v,
    };
    Judged {
        measured: Some(p.y),
        ci: p.ci,
        how: format!("{series}: {metric}"),
        direction,
        size: SizeVerdict::NotJudged,
    }
}

/// `claim` judged in a run: a claim read from a figure that was not
/// measured, or from a stack its figure left out (`xdp` in a build
/// without it), says why instead.
pub(crate) fn judged_in(
    study: &Study,
    claim: &Claim,
    outcomes: &BTreeMap<String, Outcome>,
    records: &[ResultRecord],
) -> Judged {
    let unmeasured = claim.from.iter().find_map(|f| match outcomes.get(f) {
        Some(Outcome::Skipped(why)) => Some(format!("figure {f} was not measured: {why}")),
        Some(Outcome::Failed(e)) => Some(format!("figure {f}'s run failed: {e}")),
        Some(Outcome::NotAsked) => Some(format!("figure {f} was not asked for")),
        Some(Outcome::Ran { missing, .. }) => left_out(claim, missing)
            .map(|(t, why)| format!("figure {f} did not measure {t}: {why}")),
        None => None,
    });
    match unmeasured {
        Some(why) if !matches!(claim.test, ClaimTest::Unmeasurable(_)) => Judged {
            size: if claim.size.is_some() {
                SizeVerdict::NotJudged
            } else {
                SizeVerdict::DirectionOnly
            },
            ..cannot(why)
        },
        _ => judge(study, claim, records),
    }
}

/// A transport `claim` reads that its figure's run left out, with why:
/// `missing` lists them as `NAME: why` ([`Outcome::Ran`]).
fn left_out<'a>(claim: &'a Claim, missing: &'a [String]) -> Option<(&'a str, &'a str)> {
    claim
        .selectors()
        .into_iter()
        .flat_map(|(_, sel)| sel.0.iter())
        .filter(|(a, _)| *a == Attr::Transport)
        .find_map(|(_, t)| {
            missing.iter().find_map(|m| {
                m.strip_prefix(t.as_str())
                    .and_then(|rest| rest.strip_prefix(": "))
                    .map(|why| (t.as_str(), why))
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::fixtures::*;
    use crate::study::series::series_of;
    use crate::study::{figure_label, render, StudyRun};
    use netgap_core::cpu::CpuUsage;
    use netgap_core::record::{AppResult, CpuPair, Dropout};
    use netgap_core::stack::PathIdentity;
    use netgap_core::study::Selector;

    #[test]
    fn claims_are_judged_with_their_interval() {
        let s = Study::parse("t", STUDY).expect("study");
        let recs = vec![
            rec("1", "on", 1024, 2.0),
            rec("1", "on", 65536, 8.0),
            rec("1", "off", 1024, 1.0),
            rec("1", "off", 65536, 4.0),
        ];
        let j = judge(&s, &s.claims[0], &recs);
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        assert!((j.measured.expect("measured") - 2.0).abs() < 1e-9);
        let (lo, hi) = j.ci.expect("ci");
        assert!(lo < 2.0 && hi > 2.0);
        let t = judge(&s, &s.claims[1], &recs);
        assert_eq!(t.direction, Verdict::Holds, "{t:?}");
        let none = judge(&s, &s.claims[0], &recs[..2]);
        assert!(
            matches!(none.direction, Verdict::CannotMeasure(_)),
            "{none:?}"
        );
    }

    /// A claim whose stand-in lacks its mechanism is shown with why and
    /// not judged, whatever its records say; an empty reason is refused.
    #[test]
    fn a_claim_without_its_mechanism_here_is_not_judged() {
        let text = STUDY.replacen(
            "at = \"peak\"\nabove = 1.0\n",
            "at = \"peak\"\nabove = 1.0\nno_mechanism = \"one segment: no offload has work to do\"\n",
            1,
        );
        assert_ne!(text, STUDY, "the fixture's first claim changed");
        let s = Study::parse("t", &text).expect("study");
        let recs = vec![
            rec("1", "on", 1024, 2.0),
            rec("1", "on", 65536, 8.0),
            rec("1", "off", 1024, 1.0),
            rec("1", "off", 65536, 4.0),
        ];
        let j = judge(&s, &s.claims[0], &recs);
        assert_eq!(
            j.direction,
            Verdict::NoMechanism("one segment: no offload has work to do".into())
        );
        assert_eq!(j.size, SizeVerdict::NotJudged);
        assert!(j.measured.is_some(), "what was measured is still shown");
        let outcomes = BTreeMap::from([(
            "1".to_string(),
            Outcome::Ran {
                reps: 10,
                rep_ms: 5,
                missing: Vec::new(),
            },
        )]);
        let html = render(
            &[StudyRun {
                study: &s,
                outcomes,
                notes: Vec::new(),
            }],
            &recs,
        );
        assert!(
            html.contains("no mechanism here: one segment: no offload has work to do"),
            "{html}"
        );
        let empty = STUDY.replacen(
            "at = \"peak\"\nabove = 1.0\n",
            "at = \"peak\"\nabove = 1.0\nno_mechanism = \" \"\n",
            1,
        );
        let e = Study::parse("t", &empty).expect_err("empty reason");
        assert!(e.to_string().contains("no_mechanism"), "{e}");
    }

    /// The bug: a band (`tolerance_pct`, or `above` with `below`) judged
    /// the point value only, so a flat series held on noise.
    #[test]
    fn a_band_holds_only_when_the_whole_interval_is_inside_it() {
        let s = Study::parse("t", STUDY).expect("study");
        let flat = &s.claims[2];
        let tight = [rec("1", "on", 1024, 4.0), rec("1", "on", 65536, 4.1)];
        assert_eq!(judge(&s, flat, &tight).direction, Verdict::Holds);
        let noisy = [
            rec_ci("1", "on", 1024, 4.0, 0.3),
            rec_ci("1", "on", 65536, 4.1, 0.3),
        ];
        let j = judge(&s, flat, &noisy);
        assert!(
            matches!(&j.direction, Verdict::DoesNotHold(w) if w.contains("its interval")),
            "{j:?}"
        );
        let grown = [rec("1", "on", 1024, 4.0), rec("1", "on", 65536, 8.0)];
        assert!(matches!(
            judge(&s, flat, &grown).direction,
            Verdict::DoesNotHold(_)
        ));
        // Without an interval the value alone is judged, and says so.
        let mut bare = tight.clone();
        for r in &mut bare {
            r.stats = None;
        }
        assert_eq!(judge(&s, flat, &bare).direction, Verdict::HoldsOnValue);
    }

    /// The bug: a measured 1.01 showed as "holds" beside "published 1.52".
    /// Now the size is judged apart: the interval against the published
    /// figure's band.
    #[test]
    fn a_claim_has_a_direction_and_a_size_each_judged_with_the_interval() {
        let s = Study::parse("t", STUDY).expect("study");
        let sized = &s.claims[3];
        let pair = |on: f64, half: f64| {
            vec![
                rec_ci("1", "on", 65536, on, half),
                rec_ci("1", "off", 65536, 1.0, half),
            ]
        };
        // Barely above: the direction holds, the size does not.
        let small = judge(&s, sized, &pair(1.1, 0.01));
        assert_eq!(small.direction, Verdict::Holds, "{small:?}");
        assert!(
            matches!(&small.size, SizeVerdict::DoesNotHold(w) if w.contains("below 1.262 to 1.778")),
            "{small:?}"
        );
        // The paper's size: both hold.
        let like = judge(&s, sized, &pair(1.5, 0.02));
        assert_eq!(
            (like.direction.clone(), like.size.clone()),
            (Verdict::Holds, SizeVerdict::Holds)
        );
        // Far larger than the paper's: the size does not hold.
        let large = judge(&s, sized, &pair(3.0, 0.02));
        assert!(
            matches!(&large.size, SizeVerdict::DoesNotHold(w) if w.contains("above")),
            "{large:?}"
        );
        // An interval across the band's edge decides nothing: neither
        // holds nor fails, and says where it reaches.
        let wide = judge(&s, sized, &pair(1.15, 0.08));
        assert!(
            matches!(&wide.size, SizeVerdict::Undecided(w) if w.contains("reaches past 1.262 to 1.778")),
            "{wide:?}"
        );
        // The bug: an interval wide enough to hold any size (34.3, from
        // -66.8 to 135, against 0.31 to 0.59) was shown as holding.
        let loose = judge(&s, sized, &pair(1.5, 2.0));
        assert!(matches!(loose.size, SizeVerdict::Undecided(_)), "{loose:?}");
        // No interval: the size is not judged, and says where the value is.
        let mut bare = pair(1.5, 0.0);
        for r in &mut bare {
            r.stats = None;
        }
        let j = judge(&s, sized, &bare);
        assert!(
            matches!(&j.size, SizeVerdict::NoInterval(w) if w.contains("inside")),
            "{j:?}"
        );
        // Nothing measured: neither is judged.
        let none = judge(&s, sized, &[]);
        assert!(matches!(none.direction, Verdict::CannotMeasure(_)));
        assert_eq!(none.size, SizeVerdict::NotJudged);
        // Where the paper gives a direction only, the size says so.
        let direction_only = judge(&s, &s.claims[0], &pair(1.5, 0.02));
        assert_eq!(direction_only.size, SizeVerdict::DirectionOnly);
    }

    /// A study of three figures for the rule kinds: two stacks against
    /// size, a sweep with variants, and LogP's parameters.
    const KINDS: &str = r#"
id = "009"
[citation]
authors = ["A"]
title = "T"
venue = "V"
[method]
reps = 10
drop_each_side = 1
text = "m"
[testbed]
hosts = 2
topology = "switch"
text = "t"
[[figure]]
id = "1"
caption = "Bandwidth"
tests = ["stream"]
x = "size"
y = "bandwidth_gbps"
series = ["offload"]
hosts = 2
paper = "p"
here = "h"
[[figure]]
id = "2"
caption = "Sweep"
command = "sweep"
tests = []
flags = ["--no-nodelay"]
variants = [[], ["--quickack"]]
x = "size"
y = "bandwidth_gbps"
series = ["options"]
hosts = 2
paper = "p"
here = "h"
[[figure]]
id = "3"
caption = "Block time"
command = "sweep"
tests = []
x = "size"
y = "block_time_us"
series = ["transport"]
hosts = 2
paper = "p"
here = "h"
[[figure]]
id = "4"
caption = "LogP"
command = "logp"
tests = []
x = "size"
y = "value"
series = ["metric"]
hosts = 2
paper = "p"
here = "h"
[[claim]]
figure = "1"
text = "the gain is larger at small sizes"
published = "-"
where = "w"
kind = "ratio_change"
a = { offload = "on" }
b = { offload = "off" }
at = "smallest"
vs_at = "largest"
above = 1.0
[[claim]]
figure = "1"
text = "similar scalability"
published = "-"
where = "w"
kind = "trends"
a = { offload = "on" }
b = { offload = "off" }
tolerance_pct = 20
[[claim]]
figure = "2"
text = "quick acknowledgments remove the dropouts"
published = "-"
where = "w"
kind = "dropouts"
a = { options = "no_nodelay" }
b = { options = "no_nodelay,quickack" }
[[claim]]
figure = "4"
text = "the receive overhead has a knee at 1K"
published = "-"
where = "w"
kind = "knee"
series = { metric = "recv_overhead_us" }
at = "1K"
above = 2.0
[[claim]]
figure = "3"
text = "block time falls somewhere as blocks grow"
published = "-"
where = "w"
kind = "falls"
series = { transport = "tcp" }
above = 0.5
"#;

    /// Two series of figure 1 by offload, each `(size, value)`.
    fn pairs(on: &[(u64, f64)], off: &[(u64, f64)], half: f64) -> Vec<ResultRecord> {
        on.iter()
            .map(|(x, v)| rec_ci("1", "on", *x, *v, half))
            .chain(off.iter().map(|(x, v)| rec_ci("1", "off", *x, *v, half)))
            .collect()
    }

    fn fails(j: &Judged) -> bool {
        matches!(j.direction, Verdict::DoesNotHold(_))
    }

    #[test]
    fn a_ratio_change_compares_the_ratio_at_one_x_with_that_at_another() {
        let s = Study::parse("t", KINDS).expect("study");
        let c = &s.claims[0];
        let larger_small = pairs(
            &[(1024, 4.0), (65536, 6.0)],
            &[(1024, 2.0), (65536, 5.0)],
            0.02,
        );
        let j = judge(&s, c, &larger_small);
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        assert!((j.measured.expect("measured") - 2.0 / 1.2).abs() < 1e-9);
        let larger_large = pairs(
            &[(1024, 2.4), (65536, 10.0)],
            &[(1024, 2.0), (65536, 5.0)],
            0.02,
        );
        assert!(fails(&judge(&s, c, &larger_large)));
        // The same gain at both ends, within the noise, does not hold.
        let noisy = pairs(
            &[(1024, 2.1), (65536, 10.0)],
            &[(1024, 2.0), (65536, 10.0)],
            0.1,
        );
        let j = judge(&s, c, &noisy);
        assert!(fails(&j), "{j:?}");
        // One series missing: cannot be measured, never holds.
        let j = judge(&s, c, &larger_small[..2]);
        assert!(matches!(j.direction, Verdict::CannotMeasure(_)), "{j:?}");
    }

    #[test]
    fn two_trends_compared_hold_only_when_both_series_scale_alike() {
        let s = Study::parse("t", KINDS).expect("study");
        let c = &s.claims[1];
        let alike = pairs(
            &[(1024, 10.0), (4096, 15.0), (65536, 20.0)],
            &[(1024, 12.0), (4096, 17.0), (65536, 24.0)],
            0.02,
        );
        let j = judge(&s, c, &alike);
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        assert!((j.measured.expect("measured") - 1.0).abs() < 1e-9);
        let apart = pairs(
            &[(1024, 10.0), (65536, 20.0)],
            &[(1024, 12.0), (65536, 48.0)],
            0.02,
        );
        let j = judge(&s, c, &apart);
        assert!(fails(&j), "{j:?}");
        assert!((j.measured.expect("measured") - 0.5).abs() < 1e-9);
    }

    fn sweep_point(options: &[&str], size: u64, dropout: bool) -> ResultRecord {
        let path = PathIdentity {
            mtu_bytes: Some(1500),
            ..PathIdentity::default()
        };
        let mut r = record("2", path, size, 0.5, 0.01);
        r.test = "sweep".into();
        if let Some(s) = r.stack.as_mut() {
            s.options = options.iter().map(|o| o.to_string()).collect();
        }
        let dropout = dropout.then_some(Dropout {
            depth_pct: 20.0,
            reference_size_bytes: size / 2,
            reference_value: 0.6,
        });
        r.sweep = Some(sweep_of(&r, dropout));
        r
    }

    /// The bug: 003 Figure 3 held when neither curve had a dropout.
    #[test]
    fn dropouts_hold_only_when_one_curve_has_them_and_the_other_has_none() {
        let s = Study::parse("t", KINDS).expect("study");
        let c = &s.claims[2];
        let curves = |delayed: &[bool], quick: &[bool]| -> Vec<ResultRecord> {
            let sizes = [1024u64, 2048, 4096];
            sizes
                .iter()
                .zip(delayed)
                .map(|(x, d)| sweep_point(&["no_nodelay"], *x, *d))
                .chain(
                    sizes
                        .iter()
                        .zip(quick)
                        .map(|(x, d)| sweep_point(&["no_nodelay", "quickack"], *x, *d)),
                )
                .collect()
        };
        let j = judge(&s, c, &curves(&[false, true, false], &[false; 3]));
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        assert!(j.how.contains("1 dropout (at 2K)"), "{}", j.how);
        let j = judge(&s, c, &curves(&[false; 3], &[false; 3]));
        assert!(
            matches!(&j.direction, Verdict::DoesNotHold(w) if w.contains("no dropout either")),
            "{j:?}"
        );
        let j = judge(&s, c, &curves(&[false, true, false], &[true, false, false]));
        assert!(
            matches!(&j.direction, Verdict::DoesNotHold(w) if w.contains("dropouts too")),
            "{j:?}"
        );
        // The curve that must be free of them was not measured: never holds.
        let only = curves(&[false, true, false], &[false; 3]);
        let j = judge(&s, c, &only[..3]);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w) if w.contains("no_nodelay,quickack")),
            "{j:?}"
        );
        assert_eq!(j.size, SizeVerdict::DirectionOnly);
    }

    fn logp(metric: &str, size: u64, v: f64) -> ResultRecord {
        let mut r = record("4", PathIdentity::default(), size, v, 0.01);
        r.test = "logp".into();
        r.metric = metric.into();
        r
    }

    #[test]
    fn a_knee_holds_when_the_slope_past_it_is_steeper_by_the_factor() {
        let s = Study::parse("t", KINDS).expect("study");
        let c = &s.claims[3];
        let series = |ys: [f64; 3]| -> Vec<ResultRecord> {
            [1u64, 1024, 65536]
                .iter()
                .zip(ys)
                .map(|(x, y)| logp("recv_overhead_us", *x, y))
                .chain([logp("send_overhead_us", 1024, 1.0)])
                .collect()
        };
        let kneed = judge(&s, c, &series([1.0, 1.2, 60.0]));
        assert_eq!(kneed.direction, Verdict::Holds, "{kneed:?}");
        let (lo, hi) = kneed.ci.expect("interval");
        assert!(lo > 2.0 && lo <= kneed.measured.expect("factor") && hi >= lo);
        // A straight line has no knee.
        let line = judge(
            &s,
            c,
            &series([1.0, 1.0 + 1023.0 * 0.01, 1.0 + 65535.0 * 0.01]),
        );
        assert!(fails(&line), "{line:?}");
        assert!((line.measured.expect("factor") - 1.0).abs() < 1e-6);
        // Flat up to the knee and rising past it: an infinite factor.
        let flat = judge(&s, c, &series([1.0, 1.0, 30.0]));
        assert_eq!(flat.direction, Verdict::Holds, "{flat:?}");
        assert_eq!(flat.measured, Some(f64::INFINITY));
        // Flat past it too: no knee, whatever the noise.
        let none = judge(&s, c, &series([1.0, 1.0, 1.0]));
        assert!(fails(&none), "{none:?}");
        // No point at the knee: cannot be measured.
        let missing: Vec<ResultRecord> = [1u64, 4096, 65536]
            .iter()
            .map(|x| logp("recv_overhead_us", *x, 1.0))
            .collect();
        let j = judge(&s, c, &missing);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w) if w.contains("no point at x = 1K")),
            "{j:?}"
        );
    }

    fn block(size: u64, gbps: f64, half: f64) -> ResultRecord {
        let mut r = record("3", PathIdentity::default(), size, gbps, half);
        r.test = "sweep".into();
        r.sweep = Some(sweep_of(&r, None));
        r
    }

    /// Throughput that falls at 2K and rebounds at 3K (so the block time
    /// falls at 3K).
    fn dropped_at_2k() -> [ResultRecord; 3] {
        [
            block(1024, 0.5, 0.01),
            block(2048, 0.1, 0.01),
            block(3072, 0.9, 0.01),
        ]
    }

    /// Throughput that rises block by block.
    fn rising_blocks() -> [ResultRecord; 3] {
        [
            block(1024, 0.5, 0.01),
            block(2048, 0.6, 0.01),
            block(3072, 0.7, 0.01),
        ]
    }

    #[test]
    fn falls_count_only_drops_beyond_both_intervals() {
        let s = Study::parse("t", KINDS).expect("study");
        let c = &s.claims[4];
        // Block time is size over throughput: a throughput that falls
        // at 2K and rebounds at 3K makes the block time fall at 3K.
        let dropped = dropped_at_2k();
        let j = judge(&s, c, &dropped);
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        assert!(j.how.contains("2K to 3K"), "{}", j.how);
        let rising = rising_blocks();
        assert!(fails(&judge(&s, c, &rising)));
        // A fall within the noise is not counted.
        let noisy = [
            block(1024, 0.5, 0.3),
            block(2048, 0.3, 0.3),
            block(3072, 0.4, 0.3),
        ];
        let j = judge(&s, c, &noisy);
        assert!(fails(&j), "{j:?}");
    }

    /// NetPIPE's signature graph: throughput against the block time. Its
    /// line follows the sweep from block to block, and a claim that the
    /// block time falls as blocks grow reads it along the block size, so
    /// a larger block that took less time is counted however the figure
    /// is drawn.
    #[test]
    fn falls_of_a_metric_are_read_along_the_block_size_on_a_signature_graph() {
        let text = KINDS
            .replace(
                "caption = \"Block time\"\ncommand = \"sweep\"\ntests = []\nx = \"size\"\ny = \"block_time_us\"",
                "caption = \"Block time\"\ncommand = \"sweep\"\ntests = []\nx = \"block_time\"\ny = \"bandwidth_gbps\"",
            )
            .replace(
                "series = { transport = \"tcp\" }\nabove = 0.5",
                "series = { transport = \"tcp\" }\nmetric = \"block_time_us\"\nabove = 0.5",
            );
        assert_ne!(text, KINDS);
        let s = Study::parse("t", &text).expect("study");
        let fig = s.figure("3").expect("figure 3");
        assert_eq!(fig.x, XAxis::BlockTime);
        let c = &s.claims[4];
        // 3K after 2K: its throughput rebounds so far that it takes less
        // time than the smaller block.
        let dropped = dropped_at_2k();
        let j = judge(&s, c, &dropped);
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        assert!(j.how.contains("block time (µs) falls 1 time"), "{}", j.how);
        assert!(j.how.contains("2K to 3K"), "{}", j.how);
        let rising = rising_blocks();
        assert!(fails(&judge(&s, c, &rising)));
        // The plot's line goes from block to block: x goes back at 3K.
        let recs: Vec<&ResultRecord> = dropped.iter().collect();
        let bandwidth = Quantity::Metric("bandwidth_gbps".into());
        let series = series_of(&recs, &[], XAxis::BlockTime, &bandwidth);
        let xs: Vec<f64> = series["measured"].iter().map(|p| p.x).collect();
        assert_eq!(xs.len(), 3);
        assert!(xs[0] < xs[1] && xs[2] < xs[1], "{xs:?}");
    }

    /// A ratio of what a figure shows beside its y: the CPU of a bandwidth
    /// figure, an application's own metric.
    #[test]
    fn a_ratio_reads_the_metric_it_names_instead_of_the_figures_y() {
        let text = STUDY.replacen(
            "at = \"peak\"\nabove = 1.0\n",
            "at = \"largest\"\nmetric = \"cpu.local.process_percent\"\nbelow = 1.0\n",
            1,
        );
        assert_ne!(text, STUDY);
        let s = Study::parse("t", &text).expect("study");
        let c = &s.claims[0];
        let with_cpu = |on: f64, off: f64| -> Vec<ResultRecord> {
            let mut recs = vec![
                rec("1", "on", 1024, 2.0),
                rec("1", "on", 65536, 8.0),
                rec("1", "off", 1024, 1.0),
                rec("1", "off", 65536, 4.0),
            ];
            for r in &mut recs {
                let cpu = if offload_of(r) == Some("on") { on } else { off };
                r.cpu = Some(CpuPair {
                    local: CpuUsage {
                        process_percent: cpu,
                        ..CpuUsage::default()
                    },
                    remote: CpuUsage::default(),
                });
            }
            recs
        };
        // The TOE's 38% against the host stack's 52%: the CPU, not the
        // bandwidth (which is above 1), is read, and it has no interval.
        let j = judge(&s, c, &with_cpu(38.0, 52.0));
        assert_eq!(j.direction, Verdict::HoldsOnValue, "{j:?}");
        assert!((j.measured.expect("measured") - 38.0 / 52.0).abs() < 1e-9);
        assert!(
            j.how.starts_with("client CPU (% of one core), "),
            "{}",
            j.how
        );
        assert!(fails(&judge(&s, c, &with_cpu(60.0, 52.0))));
        // Records without it cannot judge it.
        let none = judge(&s, c, &with_cpu(38.0, 52.0)[..0]);
        assert!(matches!(none.direction, Verdict::CannotMeasure(_)));
        let bare = [rec("1", "on", 1024, 2.0), rec("1", "off", 1024, 1.0)];
        let j = judge(&s, c, &bare);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w) if w.contains("carry no cpu.local.process_percent")),
            "{j:?}"
        );
        // An application metric, by its name.
        let mut s = s;
        if let ClaimTest::Ratio { metric, .. } = &mut s.claims[0].test {
            *metric = Some(Quantity::Metric("connect_time_us".into()));
        }
        let mut recs = with_cpu(1.0, 1.0);
        for r in &mut recs {
            let t = if offload_of(r) == Some("on") {
                60.0
            } else {
                1000.0
            };
            workload(r, 1).app = Some(AppResult {
                metrics: [("connect_time_us".to_string(), t)].into(),
                ..AppResult::default()
            });
        }
        let j = judge(&s, &s.claims[0], &recs);
        assert_eq!(j.direction, Verdict::HoldsOnValue, "{j:?}");
    }

    /// A claim on a stack this build does not have (xdp without the `xdp`
    /// feature) says so, naming the stack and why, rather than that no
    /// record has it.
    #[test]
    fn a_claim_on_a_stack_its_figure_left_out_says_which_and_why() {
        let text = STUDY
            .replace(
                "tests = [\"stream\"]\n",
                "tests = [\"stream\"]\ntransports = [\"tcp\", \"xdp\"]\n",
            )
            .replacen(
                "a = { offload = \"on\" }\nb = { offload = \"off\" }",
                "a = { transport = \"tcp\" }\nb = { transport = \"xdp\" }",
                1,
            );
        let s = Study::parse("t", &text).expect("study");
        let recs = vec![
            rec("1", "on", 1024, 2.0),
            rec("1", "on", 65536, 8.0),
            rec("1", "off", 1024, 1.0),
            rec("1", "off", 65536, 4.0),
        ];
        let why = "netgap was built without the xdp feature";
        let ran = |missing: Vec<String>| {
            BTreeMap::from([(
                "1".to_string(),
                Outcome::Ran {
                    reps: 10,
                    rep_ms: 5,
                    missing,
                },
            )])
        };
        let j = judged_in(&s, &s.claims[0], &ran(vec![format!("xdp: {why}")]), &recs);
        assert_eq!(
            j.direction,
            Verdict::CannotMeasure(format!("figure 1 did not measure xdp: {why}"))
        );
        // A claim of stacks the run had is judged from its records.
        let j = judged_in(&s, &s.claims[1], &ran(vec![format!("xdp: {why}")]), &recs);
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        // Without the note, the records alone say what is missing.
        let j = judged_in(&s, &s.claims[0], &ran(Vec::new()), &recs[..2]);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w) if w.contains("no record has transport=xdp")),
            "{j:?}"
        );
    }

    #[test]
    fn a_count_of_dropouts_is_judged_as_the_detector_flagged_them() {
        let mut s = Study::parse("t", KINDS).expect("study");
        s.claims[4].test = ClaimTest::Value {
            series: Selector(vec![(Attr::Options, "no_nodelay".into())]),
            at: At::Largest,
            metric: Some(Quantity::Dropouts),
            expect: Expect::Above(0.5),
        };
        s.claims[4].figure = "2".into();
        s.claims[4].from = vec!["2".into()];
        let c = &s.claims[4];
        let curve = |d: [bool; 3]| -> Vec<ResultRecord> {
            [1024u64, 2048, 4096]
                .iter()
                .zip(d)
                .map(|(x, d)| sweep_point(&["no_nodelay"], *x, d))
                .collect()
        };
        let j = judge(&s, c, &curve([false, true, true]));
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
        assert_eq!(j.measured, Some(2.0));
        assert!(fails(&judge(&s, c, &curve([false; 3]))));
    }

    /// The bug: 004's "two connections double one" said "transport=tcp
    /// lacks a point the claim needs" after a `--quick` run that measured
    /// links 1 and 3 only. Now it names the x it lacks, the x it has, and
    /// why a run can leave a listed x out.
    #[test]
    fn a_claim_whose_x_was_not_measured_says_which_and_why() {
        let text = STUDY.replace(
            "x = \"size\"\ny = \"bandwidth_gbps\"\nseries = [\"offload\"]",
            "links = [1, 2, 3]\nx = \"links\"\ny = \"bandwidth_gbps\"\nseries = [\"offload\"]",
        );
        let text = text.replace(
            "series = { offload = \"off\" }\nabove = 1.0",
            "series = { offload = \"off\" }\nfrom_x = \"1\"\nto_x = \"2\"\nabove = 1.8",
        );
        let s = Study::parse("t", &text).expect("study");
        let rail = |links: usize, v: f64| {
            let mut r = rec("1", "off", 65536, v);
            workload(&mut r, links as u32).links = vec![link(v / links as f64); links];
            r
        };
        let quick = [rail(1, 1.0), rail(3, 2.5)];
        let j = judge(&s, &s.claims[1], &quick);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w)
                if w.contains("offload=off has no point at x = 2 (it has 1, 3)")
                    && w.contains("--quick")),
            "{j:?}"
        );
        let full = [rail(1, 1.0), rail(2, 1.98), rail(3, 2.5)];
        let j = judge(&s, &s.claims[1], &full);
        assert_eq!(j.direction, Verdict::Holds, "{j:?}");
    }

    #[test]
    fn a_claim_whose_records_are_missing_says_which_and_why_and_never_holds() {
        let s = Study::parse("t", STUDY).expect("study");
        let j = judge(&s, &s.claims[0], &[]);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w) if w.contains("no record of figure 1")),
            "{j:?}"
        );
        let off_only = [rec("1", "off", 1024, 1.0), rec("1", "off", 65536, 4.0)];
        let j = judge(&s, &s.claims[0], &off_only);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w)
                if w.contains("figure 1: no record has offload=on (they have offload off)")),
            "{j:?}"
        );
        let mut other = rec("1", "on", 1024, 1.0);
        if let Some(s) = other.stack.as_mut() {
            s.label = Some(figure_label("009", "2"));
        }
        let j = judge(&s, &s.claims[0], &[other]);
        assert!(matches!(j.direction, Verdict::CannotMeasure(_)), "{j:?}");
    }

    /// A record whose programs ran without the preload library judges no
    /// claim: it names a stack that did not carry it.
    #[test]
    fn a_point_run_without_the_preload_library_judges_nothing() {
        let s = Study::parse("t", STUDY).expect("study");
        let mut recs = vec![
            rec("1", "on", 1024, 2.0),
            rec("1", "on", 65536, 8.0),
            rec("1", "off", 1024, 1.0),
            rec("1", "off", 65536, 4.0),
        ];
        assert_eq!(judge(&s, &s.claims[1], &recs).direction, Verdict::Holds);
        recs[0]
            .warnings
            .push(netgap_core::record::WITHOUT_LIBRARY_WARNING.to_string());
        let j = judge(&s, &s.claims[1], &recs);
        assert!(
            matches!(&j.direction, Verdict::CannotMeasure(w) if w.contains("without the preload library")),
            "{j:?}"
        );
    }
}
