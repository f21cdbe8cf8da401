//! The claim tables: the study's answer before its figures and each
//! figure's claims under its plot, a row per claim with its rule, the
//! paper's figure, netgap's with its interval, and both verdicts.

use super::format::{fmt_num, fmt_trim, fmt_x, unit_label};
use super::{Judged, SizeVerdict, Verdict};
use crate::svg::escape;
use netgap_core::study::{At, Claim, ClaimTest, Expect, Figure, Study, XAxis};
use std::fmt::Write as _;

fn fmt_expect(e: Expect) -> String {
    match e {
        Expect::Above(t) => format!("holds above {}", fmt_trim(t)),
        Expect::Below(t) => format!("holds below {}", fmt_trim(t)),
        Expect::Between(a, b) => format!("holds within {} to {}", fmt_trim(a), fmt_trim(b)),
    }
}

fn fmt_at(at: At, x: XAxis) -> String {
    match at {
        At::Largest => "the largest x".into(),
        At::Smallest => "the smallest x".into(),
        At::Peak => "each series' peak".into(),
        At::Lowest => "each series' lowest".into(),
        At::X(v) => format!("x = {}", fmt_x(v, x)),
    }
}

fn claim_rule(c: &Claim, x: XAxis) -> String {
    let at =
        |v: &Option<f64>, end: &str| v.map_or(end.to_string(), |v| format!("x = {}", fmt_x(v, x)));
    match &c.test {
        ClaimTest::Ratio {
            metric: Some(m),
            expect,
            ..
        } => format!("ratio of {}; {}", unit_label(m), fmt_expect(*expect)),
        ClaimTest::Ratio { expect, .. } => format!("ratio; {}", fmt_expect(*expect)),
        ClaimTest::Trend {
            from_x,
            to_x,
            expect,
            ..
        } => format!(
            "value at {} over value at {}; {}",
            at(to_x, "the last x"),
            at(from_x, "the first x"),
            fmt_expect(*expect)
        ),
        ClaimTest::Value { expect, .. } => format!("value; {}", fmt_expect(*expect)),
        ClaimTest::RatioChange {
            at: top,
            vs,
            expect,
            ..
        } => format!(
            "ratio at {} over ratio at {}; {}",
            fmt_at(*top, x),
            fmt_at(*vs, x),
            fmt_expect(*expect)
        ),
        ClaimTest::Trends {
            from_x,
            to_x,
            expect,
            ..
        } => format!(
            "one series' trend (value at {} over value at {}) over the other's; {}",
            at(to_x, "the last x both have"),
            at(from_x, "the first"),
            fmt_expect(*expect)
        ),
        ClaimTest::Dropouts { with, without } => {
            format!("dropouts in {with}, none in {without}")
        }
        ClaimTest::Knee { x: k, expect, .. } => format!(
            "knee factor: the slope past x = {} over the slope up to it; {}",
            fmt_x(*k, x),
            fmt_expect(*expect)
        ),
        ClaimTest::Falls {
            metric: Some(m),
            expect,
            ..
        } => format!(
            "times the series' {} falls as the message size grows, beyond the intervals; {}",
            unit_label(m),
            fmt_expect(*expect)
        ),
        ClaimTest::Falls { expect, .. } => format!(
            "times the series falls as x grows, beyond the intervals; {}",
            fmt_expect(*expect)
        ),
        ClaimTest::Unmeasurable(_) => String::new(),
    }
}

/// The measured figure with its interval, as a cell shows it.
fn fmt_measured(j: &Judged) -> String {
    match (j.measured, j.ci) {
        (Some(v), Some((lo, hi))) => {
            format!("{} [{}, {}]", fmt_num(v), fmt_num(lo), fmt_num(hi))
        }
        (Some(v), None) => format!("{} (no interval)", fmt_num(v)),
        // A count of places (dropouts) is told in how it was read.
        (None, _) if !j.how.is_empty() => String::new(),
        _ => "—".into(),
    }
}

/// The direction verdict's class and words.
fn direction_cell(v: &Verdict) -> (&'static str, String) {
    match v {
        Verdict::Holds => ("holds", "holds".to_string()),
        Verdict::HoldsOnValue => (
            "holds",
            "holds on its value alone: it has no interval".to_string(),
        ),
        Verdict::DoesNotHold(why) => ("fails", format!("does not hold: {why}")),
        Verdict::CannotMeasure(why) => ("na", format!("cannot be measured here: {why}")),
        Verdict::NoMechanism(why) => ("na", format!("no mechanism here: {why}")),
    }
}

/// The size verdict's class, words and the tolerance it was judged with.
fn size_cell(c: &Claim, v: &SizeVerdict) -> (&'static str, String, String) {
    let tolerance = c.size.as_ref().map_or(String::new(), |s| {
        let (lo, hi) = s.band();
        format!(
            "published {} ± {}% ({} to {}): {}",
            fmt_trim(s.published),
            fmt_trim(s.tolerance_pct),
            fmt_trim(lo),
            fmt_trim(hi),
            s.why
        )
    });
    let (class, words) = match v {
        SizeVerdict::Holds => ("holds", "holds".to_string()),
        SizeVerdict::DoesNotHold(why) => ("fails", format!("does not hold: {why}")),
        SizeVerdict::Undecided(why) => ("na", format!("undecided: {why}")),
        SizeVerdict::NoInterval(where_) => (
            "na",
            format!("not judged: no interval to judge it by ({where_})"),
        ),
        SizeVerdict::DirectionOnly => ("na", "the paper gives a direction only".to_string()),
        SizeVerdict::NotJudged => ("na", "not judged: nothing was measured".to_string()),
    };
    (class, words, tolerance)
}

/// One claim's row: the claim and its rule, the paper's figure and where,
/// netgap's with its interval and how it was read, the direction and the
/// size with its tolerance; `figure` prefixes a cell linking to the
/// figure's section.
fn claim_row(out: &mut String, c: &Claim, x: XAxis, j: &Judged, figure: Option<&str>) {
    let (class, direction) = direction_cell(&j.direction);
    let (size_class, size, tolerance) = size_cell(c, &j.size);
    let _ = write!(out, "<tr class=\"{class}\">");
    if let Some(link) = figure {
        let _ = write!(out, "<td>{link}</td>");
    }
    let _ = writeln!(
        out,
        "<td>{}<div class=\"rule\">{}</div></td><td>{}<div class=\"where\">{}</div></td><td>{}<div class=\"how\">{}</div></td><td class=\"{class}\">{}</td><td class=\"{size_class}\">{}<div class=\"why\">{}</div></td></tr>",
        escape(&c.text),
        escape(&claim_rule(c, x)),
        escape(&c.published),
        escape(&c.where_),
        escape(&fmt_measured(j)),
        escape(&j.how),
        escape(&direction),
        escape(&size),
        escape(&tolerance)
    );
}

const CLAIM_HEADS: &str =
    "<th>claim</th><th>published</th><th>measured (95% CI)</th><th>direction</th><th>size</th>";

/// The study's answer: every claim of the figures shown, judged, before
/// the figures, with a line counting the verdicts.
pub(crate) fn answer_table(out: &mut String, study: &Study, judged: &[(&Claim, Judged)]) {
    let _ = writeln!(
        out,
        "<h3 id=\"answer-{sid}\">The study's answer</h3>",
        sid = escape(&study.id)
    );
    if judged.is_empty() {
        out.push_str("<p class=\"none\">No claim of the figures measured here.</p>\n");
        return;
    }
    let count = |f: &dyn Fn(&Judged) -> bool| judged.iter().filter(|(_, j)| f(j)).count();
    let held = count(&|j| matches!(j.direction, Verdict::Holds | Verdict::HoldsOnValue));
    let on_value = match count(&|j| j.direction == Verdict::HoldsOnValue) {
        0 => String::new(),
        n => format!(" ({n} on its value alone, without an interval)"),
    };
    let failed = count(&|j| matches!(j.direction, Verdict::DoesNotHold(_)));
    let sized = judged.iter().filter(|(c, _)| c.size.is_some()).count();
    let size_held = count(&|j| j.size == SizeVerdict::Holds);
    let size_failed = count(&|j| matches!(j.size, SizeVerdict::DoesNotHold(_)));
    let size_open = count(&|j| matches!(j.size, SizeVerdict::Undecided(_)));
    let _ = writeln!(
        out,
        "<p class=\"summary\">{} claims: the direction holds for {held}{on_value}, does not hold for {failed}, and cannot be judged for {}. {sized} state the paper's size: it holds for {size_held}, does not hold for {size_failed}, is undecided (the interval across the band's edge) for {size_open}, and is not judged for {}.</p>",
        judged.len(),
        judged.len() - held - failed,
        sized - size_held - size_failed - size_open
    );
    let _ = writeln!(
        out,
        "<table class=\"claims answer\"><tr><th>figure</th>{CLAIM_HEADS}</tr>"
    );
    for (c, j) in judged {
        let link = format!(
            "<a href=\"#fig-{}-{}\">{}</a>",
            escape(&study.id),
            escape(&c.figure),
            escape(&c.figure)
        );
        let x = study.figure(&c.figure).map_or(XAxis::Size, |f| f.x);
        claim_row(out, c, x, j, Some(&link));
    }
    out.push_str("</table>\n");
}

/// The claims of `fig` under its plot.
pub(crate) fn claim_table(out: &mut String, fig: &Figure, judged: &[(&Claim, Judged)]) {
    let claims: Vec<&(&Claim, Judged)> =
        judged.iter().filter(|(c, _)| c.figure == fig.id).collect();
    if claims.is_empty() {
        out.push_str(
            "<p class=\"none\">The paper states no claim of its own on this figure.</p>\n",
        );
        return;
    }
    let _ = writeln!(out, "<table class=\"claims\"><tr>{CLAIM_HEADS}</tr>");
    for (c, j) in claims {
        claim_row(out, c, fig.x, j, None);
    }
    out.push_str("</table>\n");
}
