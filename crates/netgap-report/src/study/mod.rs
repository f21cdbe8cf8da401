//! The report of `netgap study`: one section per figure of each study,
//! titled with the paper's figure number and caption, plotted against the
//! figure's own x-axis with one series per value of what the figure
//! compares, and under each figure the study's claims judged from the
//! records: the published figure, the measured one with its confidence
//! interval, and two verdicts, each judged with the interval: the
//! claim's direction (the way the paper says the figure goes) and its
//! size (netgap's interval against the paper's number, within the
//! tolerance the study file states, or "the paper gives a direction
//! only").
//!
//! It reads only records: each carries the study and figure in its label
//! (`stack.label`, [`figure_label`]).
//!
//! This module writes the page (its sections and the line under each
//! figure's title); `series` reads a figure's records into series and
//! picks the one a claim names; `judge` judges a claim, a rule per kind;
//! `table` writes the claim tables; `plot` draws a figure; `format`
//! writes numbers and x values as the page shows them.

mod format;
mod judge;
mod plot;
mod series;
mod table;

pub use judge::judge;
pub use series::attr;

use crate::svg::escape;
use judge::judged_in;
use netgap_core::record::ResultRecord;
use netgap_core::stats::DROPPED_EACH_SIDE;
use netgap_core::study::{Claim, Study, StudyMethod};
use plot::{cpu_plot, figure_plot};
use series::records_of;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use table::{answer_table, claim_table};

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
    /// The measured figure meets the claim, but has no interval to judge
    /// it by (an application's own figure, a sum).
    HoldsOnValue,
    /// The measured figure does not meet it; why (e.g. the interval spans
    /// the threshold).
    DoesNotHold(String),
    /// It cannot be judged from these records; why.
    CannotMeasure(String),
    /// The stand-in here lacks the mechanism the claim rests on; why
    /// ([`Claim::no_mechanism`]). Not judged, whatever was measured.
    NoMechanism(String),
}

/// The size of a claim as judged: netgap's 95% interval against the
/// paper's figure within the study file's tolerance
/// ([`Size::band`](netgap_core::study::Size::band)).
#[derive(Debug, Clone, PartialEq)]
pub enum SizeVerdict {
    /// The whole interval lies inside the band around the paper's figure.
    Holds,
    /// The whole interval lies outside the band; where.
    DoesNotHold(String),
    /// The interval reaches both into the band and past it: the
    /// measurement is too loose to say; where it reaches.
    Undecided(String),
    /// The measured figure has no interval to judge it by; where the value
    /// lies.
    NoInterval(String),
    /// The paper gives a direction only.
    DirectionOnly,
    /// Nothing was measured to judge the size by.
    NotJudged,
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
    /// Whether the measured figure goes the way the paper states.
    pub direction: Verdict,
    /// Whether it is as large as the paper's.
    pub size: SizeVerdict,
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
td.holds{background:#e3f4e3}td.fails{background:#fbe3e3}td.na{background:#eee}\
table.answer{margin-bottom:1em}.summary{font-weight:bold}\
.rule,.where,.how,.why{color:#666;font-size:85%}.status{color:#444}.plots svg{max-width:100%;height:auto}";

/// The HTML report of the studies of one `netgap study` run over its
/// records.
pub fn render(runs: &[StudyRun<'_>], records: &[ResultRecord]) -> String {
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
        for n in &run.notes {
            let _ = writeln!(out, "<p class=\"status\">{}</p>", escape(n));
        }
        // Every claim of the figures shown, judged once: the answer
        // first, then each under its figure.
        let shown = |f: &str| {
            !matches!(
                run.outcomes.get(f).unwrap_or(&Outcome::NotAsked),
                Outcome::NotAsked
            )
        };
        let judged: Vec<(&Claim, Judged)> = s
            .claims
            .iter()
            .filter(|c| shown(&c.figure))
            .map(|c| (c, judged_in(s, c, &run.outcomes, records)))
            .collect();
        answer_table(&mut out, s, &judged);
        let _ = writeln!(
            out,
            "<p><b>Method.</b> {}</p>\n<p><b>Testbed.</b> {}</p>",
            escape(&s.method.text),
            escape(&s.testbed.text)
        );
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
            claim_table(&mut out, fig, &judged);
            out.push_str("</section>\n");
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod fixtures;

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

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
        assert!(html.contains("<th>direction</th><th>size</th>"), "{html}");
        // The study's answer opens the study: every claim, before the
        // figures, each linking to its figure.
        let answer = html.find("The study's answer").expect("an answer");
        let first_figure = html.find("<section class=\"figure\"").expect("a figure");
        assert!(answer < first_figure, "the answer comes first");
        let table = &html[answer..first_figure];
        assert!(table.contains("table class=\"claims answer\""), "{table}");
        for c in &s.claims {
            assert_eq!(
                table
                    .matches(&format!("<td>{}<div", escape(&c.text)))
                    .count(),
                1,
                "{}",
                c.text
            );
        }
        assert!(table.contains("<a href=\"#fig-009-1\">1</a>"), "{table}");
        assert!(
            table.contains("4 claims: the direction holds for"),
            "{table}"
        );
        assert!(html.contains("the paper gives a direction only"));
        assert!(html.contains("published 1.52 ± 17% (1.262 to 1.778): half to one"));
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
