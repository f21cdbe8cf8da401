//! The report page: one HTML file with inline CSS and inline SVG plots, so
//! it opens anywhere without a network. The page is a pure function of the
//! [`Report`] (no clock, no randomness), which the snapshot tests rely on.

use super::svg::escape;
use super::Report;
use std::fmt::Write as _;

const CSS: &str = "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:24px auto;max-width:1100px;color:#222}\
h1{font-size:24px}h2{font-size:19px;margin-top:32px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.best td{font-weight:bold}\
figure{margin:16px 0}svg.plot{max-width:100%;height:auto;border:1px solid #eee}\
.warn li{color:#8a4b00}code{font-size:12px;word-break:break-all}";

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
        "<p>{} records from {}; made by {}.</p>",
        r.records,
        files.join(", "),
        escape(&r.makers.join(", "))
    );
    o.push_str("<h2 id=\"conclusions\">Who wins, by how much, where</h2>\n<ul>\n");
    if r.conclusions.is_empty() {
        o.push_str("<li>Only one stack per test: nothing to compare.</li>\n");
    }
    for c in &r.conclusions {
        let _ = writeln!(o, "<li>{}</li>", escape(c));
    }
    o.push_str("</ul>\n");
    o.push_str("<h2 id=\"plots\">Plots</h2>\n");
    for (i, p) in r.plots.iter().enumerate() {
        let _ = writeln!(
            o,
            "<figure id=\"plot-{:02}\">\n{}<figcaption>Figure {}: {}</figcaption>\n</figure>",
            i + 1,
            p.to_svg(),
            i + 1,
            escape(p.title())
        );
    }
    gap_table(&mut o, r);
    environment(&mut o, r);
    o.push_str("<h2 id=\"warnings\">Warnings</h2>\n");
    if r.warnings.is_empty() {
        o.push_str("<p>None.</p>\n");
    } else {
        o.push_str("<ul class=\"warn\">\n");
        for w in &r.warnings {
            let _ = writeln!(o, "<li>{}</li>", escape(w));
        }
        o.push_str("</ul>\n");
    }
    o.push_str("</body>\n</html>\n");
    o
}

fn gap_table(o: &mut String, r: &Report) {
    o.push_str("<h2 id=\"gap\">Gap table</h2>\n");
    let _ = writeln!(
        o,
        "<p>Per test and size band (small &lt;1 KiB, medium &lt;64 KiB, large above), each stack as a ratio to the best: the geometric \
         mean of per-size ratios on the sizes both measured. The best beats the most others in such direct comparisons; the \
         value is the stack's geometric mean over the sizes it shares with the best. A gap is \
         <em>real</em> when the 95% confidence intervals of the repetitions are disjoint at every size shared with the best, \
         <em>within noise</em> when they overlap at every one.</p>"
    );
    if r.gap.is_empty() {
        o.push_str("<p>No test has two stacks to compare.</p>\n");
        return;
    }
    o.push_str("<table>\n<tr><th>test</th><th>metric</th><th>band</th><th>stack</th><th>value</th><th>ratio to best</th><th>gap</th></tr>\n");
    for e in &r.gap {
        for row in &e.rows {
            let class = if row.verdict == "best" {
                " class=\"best\""
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{:.4}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                escape(&e.test),
                escape(&e.metric),
                e.band.as_str(),
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

fn environment(o: &mut String, r: &Report) {
    o.push_str("<h2 id=\"environment\">Environment</h2>\n");
    if r.hosts.is_empty() {
        o.push_str("<p>No host facts in the records (imported results do not carry them).</p>\n");
    }
    for h in &r.hosts {
        let _ = writeln!(o, "<h3>{}</h3>\n<table>", escape(&h.hostname));
        for (k, v) in &h.facts {
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
