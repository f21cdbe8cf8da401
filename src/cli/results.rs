//! The commands that read results files only: `report`, `compare` and
//! `import` of peer tools' output.

use super::{CompareArgs, ImportArgs, ReportArgs};
use crate::warn;
use anyhow::{anyhow, Context, Result};
use netgap::sink::{JsonlSink, RecordSink};

/// `netgap report`.
pub(crate) fn report(args: &ReportArgs) -> Result<()> {
    let mut options = netgap::report::ReportOptions::default();
    if let Some(b) = &args.baseline {
        options.baseline = netgap::report::stacks::Baseline::Select(
            netgap::report::stacks::StackSelector::parse(b).context("--baseline")?,
        );
    }
    let written = netgap::report::write_report_with(
        &args.results,
        &args.output,
        args.images.as_deref(),
        &options,
    )?;
    println!("report: {}", written.html.display());
    for p in &written.images {
        println!("image: {}", p.display());
    }
    Ok(())
}

/// Prints the comparison; `Ok(true)` when a regression passes the threshold.
pub(crate) fn compare(args: &CompareArgs) -> Result<bool> {
    if !(args.threshold.is_finite() && args.threshold >= 0.0) {
        return Err(anyhow!(
            "--threshold {} is not a non-negative percentage",
            args.threshold
        ));
    }
    let select = |text: &Option<String>, flag: &str| -> Result<_> {
        text.as_deref()
            .map(netgap::report::stacks::StackSelector::parse)
            .transpose()
            .with_context(|| flag.to_string())
    };
    let options = netgap::compare::CompareOptions {
        threshold_pct: args.threshold,
        base_stack: select(&args.base_stack, "--base-stack")?,
        new_stack: select(&args.new_stack, "--new-stack")?,
    };
    // Torn records (a crash, a full disk) are skipped with a warning; the
    // intact ones are compared.
    let load = |path: &std::path::Path| -> Result<Vec<netgap::report::load::Loaded>> {
        let f = netgap::report::load::load_file_parts(path)?;
        for t in &f.torn {
            warn(&t);
        }
        Ok(f.records)
    };
    let base = load(&args.base)?;
    let (new, sides) = match &args.new {
        Some(path) => (
            load(path)?,
            format!("{} and {}", args.base.display(), path.display()),
        ),
        None if options.base_stack.is_some() && options.new_stack.is_some() => (
            base.clone(),
            format!("the two stacks of {}", args.base.display()),
        ),
        None => {
            return Err(anyhow!(
                "compare needs a second results file, or --base-stack and --new-stack to compare two stacks of {}",
                args.base.display()
            ))
        }
    };
    let c = netgap::compare::compare(&base, &new, &options)
        .with_context(|| format!("comparing {sides}"))?;
    for w in &c.warnings {
        warn(&w);
    }
    print!(
        "{}",
        netgap::text::escape_control_lines(&netgap::compare::render(&c))
    );
    let regressed = c.regressions().next().is_some();
    Ok(regressed)
}

/// `netgap import`.
pub(crate) fn import(args: &ImportArgs) -> Result<()> {
    use std::io::Write;
    let mut records = netgap::import::import_file(&args.format, &args.file, args.size)?;
    if let Some(label) = &args.label {
        netgap::import::label_records(&mut records, label);
    }
    match &args.output {
        Some(out) => {
            // Appended as a run appends: never through a link, each record
            // whole or not at all.
            let mut sink = JsonlSink::open(out)?;
            for r in &records {
                sink.append(r)
                    .with_context(|| format!("writing {}", out.display()))?;
            }
            eprintln!(
                "netgap: imported {} records from {} into {}",
                records.len(),
                args.file.display(),
                out.display()
            );
        }
        None => {
            let mut text = String::new();
            for r in &records {
                text.push_str(&serde_json::to_string(r).context("encoding a record")?);
                text.push('\n');
            }
            std::io::stdout()
                .write_all(text.as_bytes())
                .context("writing to standard output")?
        }
    }
    Ok(())
}
