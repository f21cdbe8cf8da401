//! The main job (`netgap` with no command): the default battery on this
//! machine, its gap table, results file and report.

use super::measure::{execute, Job, Results};
use anyhow::{Context, Result};
use netgap::plan::Plan;
use netgap::text::escape_control;
use netgap::text::escape_control_lines;
use std::path::PathBuf;

/// `netgap`: the main job, into `json` (a name with the time when none)
/// and `csv`, labelled `label`, at `reps` repetitions.
pub(crate) fn battery(
    json: Option<PathBuf>,
    csv: Option<PathBuf>,
    label: Option<String>,
    reps: Option<u32>,
) -> Result<()> {
    let json = json.unwrap_or_else(|| {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace([':', '-'], "");
        PathBuf::from(format!("netgap-results-{stamp}.jsonl"))
    });
    let battery = Plan::battery(json.clone(), reps)?;
    for (name, why) in &battery.unavailable {
        eprintln!("netgap: note: skipping {name}: {}", escape_control(why));
    }
    let mut plan = battery.plan;
    plan.settings.csv = csv;
    plan.settings.label = label;
    let mut stacks: Vec<&str> = Vec::new();
    for p in &plan.points {
        if !stacks.contains(&p.transport.as_str()) {
            stacks.push(&p.transport);
        }
    }
    let pinned = match (plan.settings.client_cpu, plan.settings.server_cpu) {
        (Some(c), Some(s)) => format!(", client on CPU {c}, server on CPU {s}"),
        _ => String::new(),
    };
    eprintln!(
        "netgap: main job: {} points ({} over {} on loopback, interleaved{pinned})",
        plan.points.len(),
        netgap::plan::BATTERY_TESTS.join(" and "),
        stacks.join(", ")
    );
    execute(&Job::Points(plan), Results::Flags)?;
    print!("{}", escape_control_lines(&gap_summary(&json)?));
    println!("results: {}", json.display());
    let html = json.with_extension("html");
    netgap::report::write_report(std::slice::from_ref(&json), &html, None)
        .with_context(|| format!("writing the report of {}", json.display()))?;
    println!("report: {}", html.display());
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        println!("next: `netgap study 000 --quick` runs a study's figures on a testbed it builds");
    }
    Ok(())
}

/// Each stack of a results file against tcp, per test and size band, with
/// whether each gap is real (Welch's t-test) or noise: the report's gap
/// tables, as text.
fn gap_summary(json: &std::path::Path) -> Result<String> {
    let records = netgap::report::load::load_file(json)?;
    let report = netgap::report::Report::build(
        &[json.to_path_buf()],
        &records,
        &netgap::report::ReportOptions::default(),
    );
    let mut text = format!("\neach stack against {}:\n", report.baseline);
    for s in &report.sections {
        text.push_str(&netgap::report::gap::render_text(&s.gap));
    }
    Ok(text)
}
