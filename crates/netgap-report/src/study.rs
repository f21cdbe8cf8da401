//! The report of `netgap study`: one section per figure of each study,
//! titled with the paper's figure number and caption, plotted against the
//! figure's own x-axis with one series per value of what the figure
//! compares, and under each figure the study's claims judged from the
//! records: the published figure, the measured one with its confidence
//! interval, and whether the claim holds here.
//!
//! It reads only records: each carries the study and figure in its label
//! (`stack.label`, [`figure_label`]).

use crate::svg::{escape, Axis, LinePlot, Plot, RefLine, Series};
use netgap_core::stats::DROPPED_EACH_SIDE;
use netgap_core::study::{
    At, Attr, Claim, ClaimTest, Expect, Figure, Selector, Study, StudyMethod, XAxis,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The label that tags the records of one figure of a study.
pub fn figure_label(study: &str, figure: &str) -> String {
    format!("study {study} figure {figure}")
}

/// What became of one figure in a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Measured.
    Ran {
        /// Repetitions of each point.
        reps: u32,
        /// Time of one repetition, milliseconds.
        rep_ms: u64,
        /// Stacks of the figure this host does not have, with why.
        missing: Vec<String>,
    },
    /// Not measured: the hosts cannot make it.
    Skipped(String),
    /// Its run failed; the error.
    Failed(String),
    /// Not asked for (`--figures`).
    NotAsked,
}

/// One study of a report with what became of each of its figures.
#[derive(Debug, Clone)]
pub struct StudyRun<'a> {
    /// The study.
    pub study: &'a Study,
    /// Figure id to outcome.
    pub outcomes: BTreeMap<String, Outcome>,
    /// Run-wide notes (the budget, `--quick`).
    pub notes: Vec<String>,
}

/// A claim as judged from the records.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The measured figure meets the claim, its confidence interval too.
    Holds,
    /// The measured figure does not meet it; why (e.g. the interval spans
    /// the threshold).
    DoesNotHold(String),
    /// It cannot be judged from these records; why.
    CannotMeasure(String),
}

/// A judged claim: the measured figure, its interval, how it was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// Measured value (a ratio, or a value in the metric's unit).
    pub measured: Option<f64>,
    /// Its 95% confidence interval, when the records have one.
    pub ci: Option<(f64, f64)>,
    /// What was compared, e.g. `offload=on 7.1 / offload=off 4.9 at 1M`.
    pub how: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// One point of a series: x, y and y's 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    x: f64,
    y: f64,
    ci: Option<(f64, f64)>,
}

fn field<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "on" } else { "off" }.to_string()),
        _ => None,
    }
}

/// A record's value of `attr`, as a study file's selectors name it.
pub fn attr(rec: &Value, attr: Attr) -> Option<String> {
    let app = |k: &str| field(rec, &["app", "options", k]).and_then(text_of);
    match attr {
        Attr::Test => field(rec, &["test"]).and_then(text_of),
        Attr::Transport => field(rec, &["transport"]).and_then(text_of),
        Attr::Mode => field(rec, &["mode"]).and_then(text_of),
        Attr::Mtu => field(rec, &["stack", "path", "mtu_bytes"]).and_then(text_of),
        Attr::Offload => field(rec, &["stack", "path", "offload"]).and_then(text_of),
        Attr::Server => app("server"),
        Attr::Trace => app("trace"),
        Attr::Preset => app("preset"),
        Attr::Op => app("op"),
        Attr::Pattern => app("pattern"),
        Attr::Responder => app("responder"),
        Attr::Kind => field(rec, &["sweep_kind"]).and_then(text_of),
        Attr::Metric => field(rec, &["metric"]).and_then(text_of),
        Attr::Options => {
            let opts: Vec<String> = field(rec, &["stack", "options"])
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(option_name).collect())
                .unwrap_or_default();
            Some(if opts.is_empty() {
                "defaults".to_string()
            } else {
                opts.join(",")
            })
        }
    }
}

/// A transport option of a record's stack: its name, with its value
/// unless it is a switch.
fn option_name(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => {
            let name = o.get("name").and_then(text_of)?;
            match o.get("value").and_then(text_of) {
                Some(val) if val != "on" && val != "true" => Some(format!("{name}={val}")),
                _ => Some(name),
            }
        }
        _ => None,
    }
}

/// A record's place on the figure's x-axis.
fn x_of(rec: &Value, x: XAxis) -> Option<f64> {
    let num = |p: &[&str]| field(rec, p).and_then(Value::as_f64);
    match x {
        XAxis::Size | XAxis::FileSize | XAxis::UnitBytes => num(&["size_bytes"]),
        XAxis::Clients | XAxis::Streams => num(&["clients"]),
        XAxis::Links => field(rec, &["links"])
            .and_then(Value::as_array)
            .map(|l| l.len() as f64)
            .filter(|n| *n > 0.0)
            .or_else(|| num(&["clients"])),
        XAxis::Alpha => num(&["app", "options", "alpha"]),
        XAxis::Hosts => num(&["app", "metrics", "hosts"]).or_else(|| num(&["clients"])),
        XAxis::Shape => num(&["app", "options", "servers"]),
    }
}

/// A record's value of `metric` with its interval: the headline when it is
/// the record's metric (or `metric` is `value`), else a field of its own (a sweep's block time) or
/// an application metric; `dropouts` counts a flagged dropout as 1.
fn y_of(rec: &Value, metric: &str) -> Option<(f64, Option<(f64, f64)>)> {
    if metric == "dropouts" {
        let has = field(rec, &["dropout"]).is_some_and(|d| !d.is_null());
        return Some((if has { 1.0 } else { 0.0 }, None));
    }
    if metric == "value" || field(rec, &["metric"]).and_then(Value::as_str) == Some(metric) {
        let v = field(rec, &["value"]).and_then(Value::as_f64)?;
        let lo = field(rec, &["stats", "ci95_low"]).and_then(Value::as_f64);
        let hi = field(rec, &["stats", "ci95_high"]).and_then(Value::as_f64);
        return Some((v, lo.zip(hi)));
    }
    field(rec, &[metric])
        .and_then(Value::as_f64)
        .or_else(|| field(rec, &["app", "metrics", metric]).and_then(Value::as_f64))
        .map(|v| (v, None))
}

fn series_name(rec: &Value, attrs: &[Attr]) -> String {
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
fn records_of<'a>(records: &'a [Value], study: &str, figure: &str) -> Vec<&'a Value> {
    let label = figure_label(study, figure);
    records
        .iter()
        .filter(|r| field(r, &["stack", "label"]).and_then(Value::as_str) == Some(label.as_str()))
        .collect()
}

/// Series of `recs` by `attrs`, each sorted by x; records without x or y
/// are left out.
fn series_of(
    recs: &[&Value],
    attrs: &[Attr],
    x: XAxis,
    metric: &str,
) -> BTreeMap<String, Vec<Point>> {
    let mut out: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for r in recs {
        let (Some(xv), Some((y, ci))) = (x_of(r, x), y_of(r, metric)) else {
            continue;
        };
        out.entry(series_name(r, attrs))
            .or_default()
            .push(Point { x: xv, y, ci });
    }
    for pts in out.values_mut() {
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
    }
    out
}

fn matches(rec: &Value, sel: &Selector) -> bool {
    sel.0
        .iter()
        .all(|(a, want)| attr(rec, *a).as_deref() == Some(want.as_str()))
}

/// The one series of `recs` that `sel` picks, by x; an error when it
/// picks none or several points at one x.
fn pick(recs: &[&Value], sel: &Selector, x: XAxis, metric: &str) -> Result<Vec<Point>, String> {
    let mut pts: Vec<Point> = Vec::new();
    for r in recs.iter().filter(|r| matches(r, sel)) {
        let (Some(xv), Some((y, ci))) = (x_of(r, x), y_of(r, metric)) else {
            continue;
        };
        if pts.iter().any(|p| p.x == xv) {
            return Err(format!(
                "{sel} picks more than one series (two records at x = {})",
                fmt_num(xv)
            ));
        }
        pts.push(Point { x: xv, y, ci });
    }
    if pts.is_empty() {
        return Err(format!("no record of {sel} was measured here"));
    }
    pts.sort_by(|a, b| a.x.total_cmp(&b.x));
    Ok(pts)
}

fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(0.01..1e6).contains(&a) {
        format!("{v:.3e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn fmt_x(v: f64, x: XAxis) -> String {
    if x.is_bytes() && v >= 1.0 {
        netgap_core::units::format_size(v as u64)
    } else {
        fmt_num(v)
    }
}

/// The point of `pts` at `at`, given the x both series share.
fn point_at(pts: &[Point], at: At, common: &[f64]) -> Option<Point> {
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

fn common_x(a: &[Point], b: &[Point]) -> Vec<f64> {
    a.iter()
        .map(|p| p.x)
        .filter(|x| b.iter().any(|q| q.x == *x))
        .collect()
}

/// Half-width of a point's interval relative to its value.
fn rel_half(p: &Point) -> Option<f64> {
    p.ci.filter(|_| p.y != 0.0)
        .map(|(lo, hi)| ((hi - lo) / 2.0 / p.y).abs())
}

/// `a / b` with an interval propagated from the two relative half-widths.
fn ratio(a: &Point, b: &Point) -> (f64, Option<(f64, f64)>) {
    let r = a.y / b.y;
    let ci = rel_half(a)
        .zip(rel_half(b))
        .map(|(ra, rb)| (ra * ra + rb * rb).sqrt())
        .map(|rel| (r * (1.0 - rel), r * (1.0 + rel)));
    (r, ci)
}

fn verdict(value: f64, ci: Option<(f64, f64)>, expect: Expect) -> Verdict {
    let (lo, hi) = ci.unwrap_or((value, value));
    match expect {
        Expect::Above(t) if lo > t => Verdict::Holds,
        Expect::Above(t) if value > t => Verdict::DoesNotHold(format!(
            "above {} but its interval reaches down to {}",
            fmt_num(t),
            fmt_num(lo)
        )),
        Expect::Above(t) => Verdict::DoesNotHold(format!("not above {}", fmt_num(t))),
        Expect::Below(t) if hi < t => Verdict::Holds,
        Expect::Below(t) if value < t => Verdict::DoesNotHold(format!(
            "below {} but its interval reaches up to {}",
            fmt_num(t),
            fmt_num(hi)
        )),
        Expect::Below(t) => Verdict::DoesNotHold(format!("not below {}", fmt_num(t))),
        Expect::Between(a, b) if value >= a && value <= b => Verdict::Holds,
        Expect::Between(a, b) => {
            Verdict::DoesNotHold(format!("outside {} to {}", fmt_num(a), fmt_num(b)))
        }
    }
}

fn cannot(why: String) -> Judged {
    Judged {
        measured: None,
        ci: None,
        how: String::new(),
        verdict: Verdict::CannotMeasure(why),
    }
}

/// Judges `claim` from the records of the figures it reads.
pub fn judge(study: &Study, claim: &Claim, records: &[Value]) -> Judged {
    let Some(fig) = study.figure(&claim.figure) else {
        return cannot(format!("the study has no figure {}", claim.figure));
    };
    let recs: Vec<&Value> = claim
        .from
        .iter()
        .flat_map(|f| records_of(records, &study.id, f))
        .collect();
    let x = fig.x;
    match &claim.test {
        ClaimTest::Unmeasurable(why) => cannot(why.clone()),
        ClaimTest::Ratio { a, b, at, expect } => {
            let (pa, pb) = match (pick(&recs, a, x, &fig.y), pick(&recs, b, x, &fig.y)) {
                (Ok(pa), Ok(pb)) => (pa, pb),
                (Err(e), _) | (_, Err(e)) => return cannot(e),
            };
            let common = common_x(&pa, &pb);
            let (Some(va), Some(vb)) = (point_at(&pa, *at, &common), point_at(&pb, *at, &common))
            else {
                return cannot(format!("{a} and {b} have no point in common"));
            };
            if vb.y == 0.0 {
                return cannot(format!("{b} measured 0"));
            }
            let (r, ci) = ratio(&va, &vb);
            Judged {
                measured: Some(r),
                ci,
                how: format!(
                    "{a}: {} at {} / {b}: {} at {}",
                    fmt_num(va.y),
                    fmt_x(va.x, x),
                    fmt_num(vb.y),
                    fmt_x(vb.x, x)
                ),
                verdict: verdict(r, ci, *expect),
            }
        }
        ClaimTest::Trend {
            series,
            from_x,
            to_x,
            expect,
        } => {
            let pts = match pick(&recs, series, x, &fig.y) {
                Ok(p) => p,
                Err(e) => return cannot(e),
            };
            let from = from_x.map_or(pts.first().copied(), |fx| {
                pts.iter().find(|p| p.x == fx).copied()
            });
            let to = to_x.map_or(pts.last().copied(), |tx| {
                pts.iter().find(|p| p.x == tx).copied()
            });
            let (Some(from), Some(to)) = (from, to) else {
                return cannot(format!("{series} lacks a point the claim reads"));
            };
            if pts.len() < 2 || from.x == to.x || from.y == 0.0 {
                return cannot(format!("{series} has too few points to show a trend here"));
            }
            let (r, ci) = ratio(&to, &from);
            Judged {
                measured: Some(r),
                ci,
                how: format!(
                    "{series}: {} at {} / {} at {}",
                    fmt_num(to.y),
                    fmt_x(to.x, x),
                    fmt_num(from.y),
                    fmt_x(from.x, x)
                ),
                verdict: verdict(r, ci, *expect),
            }
        }
        ClaimTest::Value {
            series,
            at,
            metric,
            expect,
        } => {
            let metric = metric.as_deref().unwrap_or(&fig.y);
            let pts = match pick(&recs, series, x, metric) {
                Ok(p) => p,
                Err(e) => return cannot(e),
            };
            let all: Vec<f64> = pts.iter().map(|p| p.x).collect();
            let value = if metric == "dropouts" {
                // Counted over the whole series, not at one point.
                Some(Point {
                    x: 0.0,
                    y: pts.iter().map(|p| p.y).sum(),
                    ci: None,
                })
            } else {
                point_at(&pts, *at, &all)
            };
            let Some(p) = value else {
                return cannot(format!("{series} has no point there"));
            };
            Judged {
                measured: Some(p.y),
                ci: p.ci,
                how: format!("{series}: {metric}"),
                verdict: verdict(p.y, p.ci, *expect),
            }
        }
    }
}

fn unit_label(metric: &str) -> String {
    match metric {
        "latency_us" => "latency (µs)".into(),
        "bandwidth_gbps" => "bandwidth (Gbit/s)".into(),
        "transactions_per_s" => "transactions/s".into(),
        "query_time_ms" => "query time (ms)".into(),
        "gather_time_ms" => "gather time (ms)".into(),
        "block_time_us" => "block time (µs)".into(),
        "value" => "µs".into(),
        m => m.replace('_', " "),
    }
}

/// The figure's plot: its series against its x-axis; a log axis where the
/// values span more than a decade, interval bars clipped at the axis, and
/// the path's payload limit drawn as a reference line.
fn figure_plot(fig: &Figure, recs: &[&Value]) -> Option<Plot> {
    let series = series_of(recs, &fig.series, fig.x, &fig.y);
    if series.is_empty() {
        return None;
    }
    let ys: Vec<f64> = series.values().flatten().map(|p| p.y).collect();
    let y_axis = Axis::auto(&unit_label(&fig.y), ys.iter().copied());
    let x_axis = if fig.x.is_bytes() {
        Axis {
            label: fig.x.title().to_string(),
            ..Axis::size()
        }
    } else {
        Axis::auto(fig.x.title(), series.values().flatten().map(|p| p.x))
    };
    let floor = ys
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::MAX, f64::min);
    let lines: Vec<Series> = series
        .iter()
        .enumerate()
        .map(|(k, (name, pts))| Series {
            name: name.clone(),
            points: pts.iter().map(|p| (p.x, p.y)).collect(),
            errors: pts
                .iter()
                .map(|p| {
                    p.ci.map(|(lo, hi)| {
                        // A log axis cannot show a bar below zero: clip
                        // it at the axis' floor instead of dropping it.
                        let lo = if y_axis.log { lo.max(floor / 2.0) } else { lo };
                        (lo, hi)
                    })
                })
                .collect(),
            marks: Vec::new(),
            colour: k,
            dash: 0,
        })
        .collect();
    // The path's physical limit, drawn as the report's other figures
    // draw it: a reference line at the largest limit of the figure's
    // records.
    let mut refs = Vec::new();
    if fig.y == "bandwidth_gbps" {
        if let Some(l) = recs
            .iter()
            .filter_map(|r| field(r, &["physics", "payload_limit_gbps"]).and_then(Value::as_f64))
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        {
            refs.push(RefLine {
                y: l,
                label: format!("path limit {} Gbit/s", fmt_num(l)),
            });
        }
    }
    Some(Plot::Line(LinePlot {
        title: format!("Figure {}", fig.id),
        x: x_axis,
        y: y_axis,
        series: lines,
        refs,
    }))
}

/// CPU beside bandwidth: each series' client and server process CPU.
fn cpu_plot(fig: &Figure, recs: &[&Value]) -> Option<Plot> {
    let mut lines = Vec::new();
    // One colour per series, solid for the client, dashed for the server.
    let names: Vec<String> = series_of(recs, &fig.series, fig.x, &fig.y)
        .into_keys()
        .collect();
    for (side, key) in [("client", "local"), ("server", "remote")] {
        let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for r in recs {
            let (Some(x), Some(c)) = (
                x_of(r, fig.x),
                field(r, &["cpu", key, "process_percent"]).and_then(Value::as_f64),
            ) else {
                continue;
            };
            by.entry(series_name(r, &fig.series))
                .or_default()
                .push((x, c));
        }
        for (name, mut pts) in by {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            lines.push(Series {
                colour: names.iter().position(|n| *n == name).unwrap_or(0),
                name: format!("{name} {side}"),
                points: pts,
                dash: usize::from(side == "server"),
                ..Series::default()
            });
        }
    }
    if lines.is_empty() {
        return None;
    }
    let x_axis = if fig.x.is_bytes() {
        Axis {
            label: fig.x.title().to_string(),
            ..Axis::size()
        }
    } else {
        Axis::linear(fig.x.title())
    };
    Some(Plot::Line(LinePlot {
        title: format!("Figure {}: CPU", fig.id),
        x: x_axis,
        y: Axis::linear("CPU (% of one core)"),
        series: lines,
        refs: Vec::new(),
    }))
}

fn fmt_expect(e: Expect) -> String {
    match e {
        Expect::Above(t) => format!("holds above {}", fmt_num(t)),
        Expect::Below(t) => format!("holds below {}", fmt_num(t)),
        Expect::Between(a, b) => format!("holds within {} to {}", fmt_num(a), fmt_num(b)),
    }
}

fn claim_rule(c: &Claim) -> String {
    match &c.test {
        ClaimTest::Ratio { expect, .. } => format!("ratio; {}", fmt_expect(*expect)),
        ClaimTest::Trend {
            from_x,
            to_x,
            expect,
            ..
        } => {
            let at = |x: &Option<f64>, end: &str| {
                x.map_or(end.to_string(), |v| format!("x = {}", fmt_num(v)))
            };
            format!(
                "value at {} over value at {}; {}",
                at(to_x, "the last x"),
                at(from_x, "the first x"),
                fmt_expect(*expect)
            )
        }
        ClaimTest::Value { expect, .. } => format!("value; {}", fmt_expect(*expect)),
        ClaimTest::Unmeasurable(_) => String::new(),
    }
}

fn claim_table(
    out: &mut String,
    study: &Study,
    fig: &Figure,
    outcomes: &BTreeMap<String, Outcome>,
    records: &[Value],
) {
    let claims: Vec<&Claim> = study.claims_of(&fig.id).collect();
    if claims.is_empty() {
        out.push_str(
            "<p class=\"none\">The paper states no claim of its own on this figure.</p>\n",
        );
        return;
    }
    out.push_str("<table class=\"claims\"><tr><th>claim</th><th>published</th><th>measured (95% CI)</th><th>here</th></tr>\n");
    for c in claims {
        // A claim read from a figure that was not measured says why.
        let unmeasured = c.from.iter().find_map(|f| match outcomes.get(f) {
            Some(Outcome::Skipped(why)) => Some(format!("figure {f} was not measured: {why}")),
            Some(Outcome::Failed(e)) => Some(format!("figure {f}'s run failed: {e}")),
            Some(Outcome::NotAsked) => Some(format!("figure {f} was not asked for")),
            _ => None,
        });
        let j = match unmeasured {
            Some(why) if !matches!(c.test, ClaimTest::Unmeasurable(_)) => cannot(why),
            _ => judge(study, c, records),
        };
        let measured = match (j.measured, j.ci) {
            (Some(v), Some((lo, hi))) => {
                format!("{} [{}, {}]", fmt_num(v), fmt_num(lo), fmt_num(hi))
            }
            (Some(v), None) => format!("{} (no interval)", fmt_num(v)),
            _ => "—".into(),
        };
        let (class, verdict) = match &j.verdict {
            Verdict::Holds => ("holds", "holds".to_string()),
            Verdict::DoesNotHold(why) => ("fails", format!("does not hold: {why}")),
            Verdict::CannotMeasure(why) => ("na", format!("cannot be measured here: {why}")),
        };
        let _ = writeln!(
            out,
            "<tr class=\"{class}\"><td>{}<div class=\"rule\">{}</div></td><td>{}<div class=\"where\">{}</div></td><td>{}<div class=\"how\">{}</div></td><td>{}</td></tr>",
            escape(&c.text),
            escape(&claim_rule(c)),
            escape(&c.published),
            escape(&c.where_),
            escape(&measured),
            escape(&j.how),
            escape(&verdict)
        );
    }
    out.push_str("</table>\n");
}

/// The line under a figure's title that says what became of it: how it
/// was measured beside the paper's `method`, or why it was not.
fn outcome_line(outcome: &Outcome, method: &StudyMethod) -> String {
    match outcome {
        Outcome::Ran {
            reps,
            rep_ms,
            missing,
        } => {
            let mut t = format!(
                "{reps} repetitions of {rep_ms} ms per point: {}",
                beside_paper(*reps, method)
            );
            for m in missing {
                let _ = write!(t, "; not measured: {m}");
            }
            t
        }
        Outcome::Skipped(why) => format!("not measured: {why}"),
        Outcome::Failed(e) => format!("the run failed: {e}"),
        Outcome::NotAsked => String::new(),
    }
}

/// How `reps` repetitions of a figure's points stand beside the paper's
/// `method`, one clause: the paper's count and how many it dropped at
/// each end; when fewer ran (or run), that the budget has room for no more; and
/// when the paper dropped other than netgap's headline does
/// ([`DROPPED_EACH_SIDE`]), that netgap did not drop as it did.
pub fn beside_paper(reps: u32, method: &StudyMethod) -> String {
    let drop = method.drop_each_side;
    let dropping = match drop {
        0 => "dropping none".to_string(),
        n => format!("dropping {n} each side"),
    };
    let mut t = if reps >= method.reps {
        format!("the paper's {}, {dropping}", method.reps)
    } else {
        format!(
            "the paper used {}, {dropping}; the budget has room for {reps}",
            method.reps
        )
    };
    if drop != DROPPED_EACH_SIDE {
        let _ = write!(
            t,
            "; netgap's headline drops {DROPPED_EACH_SIDE} each side, not {drop}"
        );
    } else if reps >= method.reps {
        t.push_str(", as netgap's headline does");
    }
    t
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1000px;margin:auto;padding:1em}\
section.figure{border-top:1px solid #ccc;margin-top:1.5em}\
table.claims{border-collapse:collapse;width:100%;font-size:90%}\
table.claims td,table.claims th{border:1px solid #ccc;padding:4px;vertical-align:top;text-align:left}\
tr.holds td:last-child{background:#e3f4e3}tr.fails td:last-child{background:#fbe3e3}tr.na td:last-child{background:#eee}\
.rule,.where,.how{color:#666;font-size:85%}.status{color:#444}.plots svg{max-width:100%;height:auto}";

/// The HTML report of the studies of one `netgap study` run over its
/// records.
pub fn render(runs: &[StudyRun<'_>], records: &[Value]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>netgap study</title><style>{STYLE}</style></head><body>\n<h1>netgap study</h1>\n"
    );
    for run in runs {
        let s = run.study;
        let _ = writeln!(
            out,
            "<h2 id=\"study-{id}\">Study {id}: {}</h2>\n<p class=\"cite\">{}</p>",
            escape(&s.citation.title),
            escape(&s.citation.line()),
            id = escape(&s.id)
        );
        if let Some(note) = &s.citation.note {
            let _ = writeln!(out, "<p class=\"status\">{}</p>", escape(note));
        }
        let _ = writeln!(
            out,
            "<p><b>Method.</b> {}</p>\n<p><b>Testbed.</b> {}</p>",
            escape(&s.method.text),
            escape(&s.testbed.text)
        );
        for n in &run.notes {
            let _ = writeln!(out, "<p class=\"status\">{}</p>", escape(n));
        }
        for fig in &s.figures {
            let outcome = run.outcomes.get(&fig.id).unwrap_or(&Outcome::NotAsked);
            if *outcome == Outcome::NotAsked {
                continue;
            }
            let _ = writeln!(
                out,
                "<section class=\"figure\" id=\"fig-{sid}-{fid}\">\n<h3>Figure {fid}: {}</h3>\n<p><b>Paper:</b> {}. <b>Here:</b> {}.</p>",
                escape(&fig.caption),
                escape(&fig.paper),
                escape(&fig.here),
                sid = escape(&s.id),
                fid = escape(&fig.id)
            );
            let _ = writeln!(
                out,
                "<p class=\"status\">{}</p>",
                escape(&outcome_line(outcome, &s.method))
            );
            let recs = records_of(records, &s.id, &fig.id);
            out.push_str("<div class=\"plots\">\n");
            match figure_plot(fig, &recs) {
                Some(p) => out.push_str(&p.to_svg()),
                None => out.push_str("<p class=\"none\">No record of this figure.</p>"),
            }
            if fig.cpu {
                if let Some(p) = cpu_plot(fig, &recs) {
                    out.push_str(&p.to_svg());
                }
            }
            out.push_str("</div>\n");
            claim_table(&mut out, s, fig, &run.outcomes, records);
            out.push_str("</section>\n");
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(fig: &str, offload: &str, size: u64, v: f64) -> Value {
        json!({
            "test": "stream", "transport": "tcp", "mode": "event", "size_bytes": size,
            "metric": "bandwidth_gbps", "value": v,
            "stats": {"ci95_low": v * 0.95, "ci95_high": v * 1.05},
            "stack": {"label": figure_label("009", fig), "options": [],
                      "path": {"mtu_bytes": 1500, "offload": offload}}
        })
    }

    const STUDY: &str = r#"
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
[[claim]]
figure = "1"
text = "offload raises bandwidth"
published = "1.52"
where = "Fig 1"
kind = "ratio"
a = { offload = "on" }
b = { offload = "off" }
at = "peak"
above = 1.0
[[claim]]
figure = "1"
text = "grows"
published = "-"
where = "Fig 1"
kind = "trend"
series = { offload = "off" }
above = 1.0
"#;

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
        assert_eq!(j.verdict, Verdict::Holds, "{j:?}");
        assert!((j.measured.expect("measured") - 2.0).abs() < 1e-9);
        let (lo, hi) = j.ci.expect("ci");
        assert!(lo < 2.0 && hi > 2.0);
        let t = judge(&s, &s.claims[1], &recs);
        assert_eq!(t.verdict, Verdict::Holds, "{t:?}");
        let none = judge(&s, &s.claims[0], &recs[..2]);
        assert!(
            matches!(none.verdict, Verdict::CannotMeasure(_)),
            "{none:?}"
        );
    }

    #[test]
    fn the_report_has_a_section_and_a_claim_table_per_figure() {
        let s = Study::parse("t", STUDY).expect("study");
        let recs = vec![rec("1", "on", 1024, 2.0), rec("1", "off", 1024, 1.0)];
        let mut outcomes = BTreeMap::new();
        outcomes.insert(
            "1".to_string(),
            Outcome::Ran {
                reps: 10,
                rep_ms: 5,
                missing: Vec::new(),
            },
        );
        let html = render(
            &[StudyRun {
                study: &s,
                outcomes,
                notes: Vec::new(),
            }],
            &recs,
        );
        assert!(html.contains("<h3>Figure 1: Bandwidth</h3>"), "{html}");
        assert!(html.contains("table class=\"claims\""));
        assert!(html.contains("<svg"));
        assert!(html.contains("offload=on"));
        assert!(
            html.contains("10 repetitions of 5 ms per point: the paper's 10, dropping 1 each side"),
            "{html}"
        );
    }

    #[test]
    fn a_figure_says_how_its_repetitions_stand_beside_the_papers() {
        let method = |reps, drop_each_side| StudyMethod {
            reps,
            drop_each_side,
            iterations: None,
            text: "m".into(),
        };
        let ran = |reps| Outcome::Ran {
            reps,
            rep_ms: 400,
            missing: vec!["xdp: not built".into()],
        };
        assert_eq!(
            outcome_line(&ran(3), &method(10, 1)),
            "3 repetitions of 400 ms per point: the paper used 10, dropping 1 each side; \
             the budget has room for 3; not measured: xdp: not built"
        );
        assert_eq!(
            outcome_line(&ran(10), &method(10, 1)),
            "10 repetitions of 400 ms per point: the paper's 10, dropping 1 each side, \
             as netgap's headline does; not measured: xdp: not built"
        );
        // netgap's headline drops one at each end whatever the paper did.
        assert_eq!(
            beside_paper(10, &method(10, 2)),
            "the paper's 10, dropping 2 each side; netgap's headline drops 1 each side, not 2"
        );
        assert_eq!(
            beside_paper(5, &method(8, 0)),
            "the paper used 8, dropping none; the budget has room for 5; \
             netgap's headline drops 1 each side, not 0"
        );
    }
}
