//! The report page: one HTML file with inline CSS and inline SVG plots, so
//! it opens anywhere without a network. The page is a pure function of the
//! [`Report`] (no clock, no randomness), which the snapshot tests rely on.
//! It opens with a table of contents; each test has its section with its
//! plots (a metric and its CPU side by side) and its gap table.

use super::gap::GapEntry;
use super::svg::escape;
use super::{Report, HOST_COLUMNS};
use std::fmt::Write as _;

const CSS: &str = "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:24px auto;max-width:1240px;color:#222}\
h1{font-size:24px}h2{font-size:19px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:16px}\
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.ref td{font-weight:bold}\
.row{display:flex;gap:12px;align-items:flex-start}.row figure{flex:1 1 0;min-width:0}\
figure{margin:16px 0}svg.plot{max-width:100%;height:auto;border:1px solid #eee}\
nav.toc ul{margin:4px 0}.warn li{color:#8a4b00}.warn details{color:#444;font-size:12px}\
code{font-size:12px;word-break:break-all}";

/// An HTML id for a test's section: `test-sweep-pingpong`.
fn anchor(test: &str) -> String {
    let mut id = String::from("test-");
    for c in test.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '-' };
        if !(c == '-' && id.ends_with('-')) {
            id.push(c);
        }
    }
    id.trim_end_matches('-').to_string()
}

/// The page of a report.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    o.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    o.push_str("<title>netgap report</title>\n");
    let _ = writeln!(o, "<style>{CSS}</style>\n</head>\n<body>");
    o.push_str("<h1>netgap report</h1>\n");
    let files: Vec<String> = r
        .files
        .iter()
        .map(|f| format!("<code>{}</code>", escape(&f.display().to_string())))
        .collect();
    let _ = writeln!(
        o,
        "<p>{} records from {}; made by {}. Gap tables measure every stack against {}.</p>",
        r.records,
        files.join(", "),
        escape(&r.makers.join(", ")),
        escape(&r.baseline)
    );
    contents(&mut o, r);
    o.push_str("<h2 id=\"conclusions\">Each stack against the baseline</h2>\n");
    summary_table(&mut o, r);
    let mut n = 0;
    for s in &r.sections {
        let id = anchor(&s.test);
        let _ = writeln!(o, "<h2 id=\"{id}\">Test: {}</h2>", escape(&s.test));
        for f in &s.figures {
            let row = f.panels.len() > 1;
            if row {
                o.push_str("<div class=\"row\">\n");
            }
            for p in &f.panels {
                n += 1;
                let _ = writeln!(
                    o,
                    "<figure id=\"plot-{n:02}\">\n{}<figcaption>Figure {n}: {}</figcaption>\n</figure>",
                    p.to_svg(),
                    escape(p.title())
                );
            }
            if row {
                o.push_str("</div>\n");
            }
        }
        let _ = writeln!(o, "<h3 id=\"{id}-gap\">Gap table: {}</h3>", escape(&s.test));
        gap_table(&mut o, &s.gap);
    }
    gap_method(&mut o, r);
    stacks(&mut o, r);
    environment(&mut o, r);
    warnings(&mut o, r);
    o.push_str("</body>\n</html>\n");
    o
}

/// Each stack against the baseline as one table: a row per test, metric,
/// band and stack, with its ratio to the reference in words and whether
/// the difference is real; the reference (the baseline, or the best where
/// no baseline stack was measured) named in its own column.
fn summary_table(o: &mut String, r: &Report) {
    let entries: Vec<&GapEntry> = r
        .sections
        .iter()
        .flat_map(|s| s.gap.iter())
        .filter(|e| e.rows.len() > 1)
        .collect();
    if entries.is_empty() {
        o.push_str("<p>Only one stack per test: nothing to compare.</p>\n");
        return;
    }
    o.push_str("<table class=\"summary\">\n<tr><th>test</th><th>metric</th><th>band</th><th>against</th><th>stack</th><th>value against the reference</th><th>gap</th></tr>\n");
    for e in entries {
        let against = if e.against_baseline {
            format!("baseline: {}", e.reference)
        } else {
            format!("best (no baseline here): {}", e.reference)
        };
        for row in e.rows.iter().skip(1) {
            let ratio = if row.ratio.is_finite() {
                super::gap::ratio_words(row.ratio, &e.metric)
            } else {
                "-".to_string()
            };
            let best = if row.best { " (best)" } else { "" };
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}{best}</td></tr>",
                escape(&e.test),
                escape(&e.metric),
                escape(e.band.as_str()),
                escape(&against),
                escape(&row.stack),
                escape(&ratio),
                escape(&row.verdict),
            );
        }
    }
    o.push_str("</table>\n");
}

fn contents(o: &mut String, r: &Report) {
    o.push_str("<nav class=\"toc\" id=\"contents\">\n<h2>Contents</h2>\n<ul>\n");
    o.push_str("<li><a href=\"#conclusions\">Each stack against the baseline</a></li>\n");
    for s in &r.sections {
        let id = anchor(&s.test);
        let plots: usize = s.figures.iter().map(|f| f.panels.len()).sum();
        let _ = writeln!(
            o,
            "<li><a href=\"#{id}\">Test: {t}</a> ({plots} plot{}; <a href=\"#{id}-gap\">gap table</a>)</li>",
            if plots == 1 { "" } else { "s" },
            t = escape(&s.test)
        );
    }
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let _ = writeln!(
        o,
        "<li><a href=\"#gap-method\">How the gap tables decide</a></li>\n\
         <li><a href=\"#stacks\">Stacks</a> ({})</li>\n\
         <li><a href=\"#environment\">Environment</a> ({})</li>\n\
         <li><a href=\"#warnings\">Warnings</a> ({})</li>\n</ul>\n</nav>",
        r.stacks.len(),
        plural(r.hosts.len(), "host row", "host rows"),
        plural(r.warnings.len(), "kind", "kinds")
    );
}

fn gap_table(o: &mut String, entries: &[GapEntry]) {
    if entries.is_empty() {
        o.push_str("<p>One stack only: nothing to compare.</p>\n");
        return;
    }
    o.push_str("<table class=\"gap\">\n<tr><th>metric</th><th>band</th><th>points</th><th>stack</th><th>value</th><th>ratio to reference</th><th>gap</th></tr>\n");
    for e in entries {
        for row in &e.rows {
            let reference = row.verdict == "baseline" || row.verdict == "best";
            let class = if reference { " class=\"ref\"" } else { "" };
            let best = if row.best && !reference {
                " (best)"
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{:.4}</td><td class=\"num\">{}</td><td>{}{best}</td></tr>",
                escape(&e.metric),
                e.band.as_str(),
                escape(&super::gap::points_text(e)),
                escape(&row.stack),
                row.value,
                if row.ratio.is_finite() {
                    format!("{:.3}", row.ratio)
                } else {
                    "-".to_string()
                },
                escape(&row.verdict)
            );
        }
    }
    o.push_str("</table>\n");
}

fn gap_method(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "<h2 id=\"gap-method\">How the gap tables decide</h2>\n<p>Per test, metric and size band (small &lt;1 KiB, medium \
         &lt;64 KiB, large above; multi-client tests over their numbers of clients), every stack against {}: the ratio is \
         the geometric mean of per-point ratios on the points both measured, and the value the stack's geometric mean over \
         those points. A gap at one point is <em>real</em> when Welch's t-test on the two stacks' repetitions finds a \
         difference (p &lt; 0.05), or, without repetitions, when the 95% confidence intervals are disjoint; the row is \
         <em>real</em> or <em>within noise</em> when every shared point agrees, and adds <em>interleaved</em> when both \
         stacks were measured in one interleaved run. Records with fewer than two repetitions \
         have no confidence interval and are not judged. Where a band has no baseline stack, its rows are against the \
         best stack (the one that beats the most others in direct comparisons). Stacks measured in separate runs also \
         differ by whatever drifted between the runs, which no test inside a run sees: interleave them in one run to \
         compare them directly.</p>",
        escape(&r.baseline)
    );
}

fn stacks(o: &mut String, r: &Report) {
    o.push_str("<h2 id=\"stacks\">Stacks</h2>\n<p>Every stack of the results in full; plots and tables label each by what sets it apart from the others of its test.</p>\n");
    o.push_str("<table>\n<tr><th>stack</th><th>hosts</th><th>tests</th><th>points</th></tr>\n");
    for s in &r.stacks {
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            escape(&s.description),
            escape(&s.hosts),
            escape(&s.tests.join(", ")),
            s.points
        );
    }
    o.push_str("</table>\n");
}

fn environment(o: &mut String, r: &Report) {
    o.push_str("<h2 id=\"environment\">Environment</h2>\n");
    if r.hosts.is_empty() {
        o.push_str("<p>No host facts in the records (imported results do not carry them).</p>\n");
    } else {
        o.push_str("<table>\n<tr><th>host</th>");
        for c in HOST_COLUMNS {
            let _ = write!(o, "<th>{c}</th>");
        }
        o.push_str("</tr>\n");
        for h in &r.hosts {
            let _ = write!(o, "<tr><td>{}</td>", escape(&h.hostname));
            for (_, v) in &h.facts {
                let _ = write!(o, "<td>{}</td>", escape(v));
            }
            o.push_str("</tr>\n");
        }
        o.push_str("</table>\n");
    }
    for (host, sysctls) in &r.sysctls {
        let _ = writeln!(o, "<h3>Sysctls of {}</h3>\n<table>", escape(host));
        for (k, v) in sysctls {
            let _ = writeln!(o, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
        }
        o.push_str("</table>\n");
    }
    o.push_str("<h3>Options</h3>\n");
    if r.options.is_empty() {
        o.push_str("<p>No recorded options.</p>\n");
    } else {
        o.push_str("<table>\n<tr><th>points</th><th>resolved options</th></tr>\n");
        for (opts, n) in &r.options {
            let _ = writeln!(
                o,
                "<tr><td class=\"num\">{n}</td><td><code>{}</code></td></tr>",
                escape(opts)
            );
        }
        o.push_str("</table>\n");
    }
}

fn warnings(o: &mut String, r: &Report) {
    o.push_str("<h2 id=\"warnings\">Warnings</h2>\n");
    if r.warnings.is_empty() {
        o.push_str("<p>None.</p>\n");
        return;
    }
    o.push_str("<ul class=\"warn\">\n");
    for w in &r.warnings {
        if w.points.is_empty() {
            let _ = writeln!(o, "<li>{}</li>", escape(&w.text));
            continue;
        }
        let n = w.points.len();
        let _ = writeln!(
            o,
            "<li>{n} point{}: {}\n<details><summary>the points (file:line test stack size)</summary>{}</details></li>",
            if n == 1 { "" } else { "s" },
            escape(&w.text),
            w.points
                .iter()
                .map(|p| escape(p))
                .collect::<Vec<_>>()
                .join("<br>")
        );
    }
    o.push_str("</ul>\n");
}
