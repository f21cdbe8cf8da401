//! `netgap report`: turns results files into one self-contained HTML page
//! (inline SVG plots and CSS, nothing fetched), optionally with every plot
//! written as SVG and PNG beside it. The report reads results files only
//! ([`load`]), so it works on old runs and on results imported from peer
//! tools; [`plots`] picks the plots, [`gap`] builds the gap table, [`svg`]
//! draws, [`html`] writes the page and [`png`] rasterizes for `--images`.

pub mod compare;
pub mod gap;
pub mod html;
pub mod import;
pub mod load;
pub mod plots;
pub mod png;
pub mod svg;

use load::Loaded;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A results file could not be loaded.
    #[error(transparent)]
    Load(#[from] load::LoadError),
    /// The inputs hold no records.
    #[error("no result records in {0}")]
    Empty(String),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A plot could not be rasterized.
    #[error(transparent)]
    Png(#[from] png::PngError),
}

/// Facts of one host as the report shows them.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRow {
    /// Host name.
    pub hostname: String,
    /// `key: value` facts, in a fixed order.
    pub facts: Vec<(String, String)>,
}

/// Everything the page shows, computed from the records.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The results files read.
    pub files: Vec<PathBuf>,
    /// Number of records.
    pub records: usize,
    /// The plots.
    pub plots: Vec<svg::Plot>,
    /// The gap table.
    pub gap: Vec<gap::GapEntry>,
    /// Who wins, by how much, where: one sentence per gap-table entry.
    pub conclusions: Vec<String>,
    /// Every host seen, as coordinator or agent.
    pub hosts: Vec<HostRow>,
    /// Distinct option sets (JSON) with the number of points using each.
    pub options: Vec<(String, usize)>,
    /// netgap versions and peer tools that made the records.
    pub makers: Vec<String>,
    /// Warnings carried from the records, and the report's own.
    pub warnings: Vec<String>,
}

impl Report {
    /// Builds the report of `records` read from `files`.
    pub fn build(files: &[PathBuf], records: &[Loaded]) -> Report {
        let gap = gap::gap_table(records);
        let mut hosts: BTreeMap<String, HostRow> = BTreeMap::new();
        for h in records
            .iter()
            .flat_map(|l| [&l.record.host, &l.record.peer_host])
            .flatten()
        {
            let mut facts = vec![
                ("kernel".to_string(), h.kernel.clone()),
                ("cpu".to_string(), h.cpu_model.clone()),
                ("cores".to_string(), h.cores.to_string()),
                (
                    "interface".to_string(),
                    h.interface.clone().unwrap_or_else(|| "-".into()),
                ),
                (
                    "mtu".to_string(),
                    h.mtu_bytes
                        .map_or_else(|| "-".into(), |m| format!("{m} bytes")),
                ),
                ("netgap".to_string(), h.netgap_version.clone()),
            ];
            facts.extend(h.sysctls.iter().map(|(k, v)| (k.clone(), v.clone())));
            hosts.insert(
                h.hostname.clone(),
                HostRow {
                    hostname: h.hostname.clone(),
                    facts,
                },
            );
        }
        let mut options: BTreeMap<String, usize> = BTreeMap::new();
        for o in records.iter().filter_map(|l| l.record.options.as_ref()) {
            let text = serde_json::to_string(o).unwrap_or_default();
            *options.entry(text).or_default() += 1;
        }
        let mut makers: Vec<String> = records
            .iter()
            .map(|l| match &l.record.tool {
                Some(t) => format!("{t} (imported by netgap {})", l.record.version),
                None => format!("netgap {}", l.record.version),
            })
            .collect();
        makers.sort();
        makers.dedup();
        Report {
            files: files.to_vec(),
            records: records.len(),
            plots: plots::plots(records),
            conclusions: gap::conclusions(&gap),
            gap,
            warnings: warnings(records, &hosts),
            hosts: hosts.into_values().collect(),
            options: options.into_iter().collect(),
            makers,
        }
    }
}

/// The records' own warnings, unmet `--ci` targets, dropouts, and a
/// warning when the hosts differ in kernel or CPU.
fn warnings(records: &[Loaded], hosts: &BTreeMap<String, HostRow>) -> Vec<String> {
    let mut out = Vec::new();
    for l in records {
        let r = &l.record;
        let point = format!(
            "{} {} {}",
            r.test,
            plots::stack_label(l, false),
            netgap_core::units::format_size(r.size_bytes)
        );
        for w in &r.warnings {
            out.push(format!("{point}: {w}"));
        }
        if let Some(ci) = l.extras.ci_target.as_ref().filter(|c| !c.met) {
            out.push(format!(
                "{point}: the {}% confidence interval reached ±{:.1}%, not the ±{:.1}% asked for.",
                ci.confidence_pct, ci.achieved_half_width_pct, ci.half_width_pct
            ));
        }
        if let Some(d) = &l.extras.dropout {
            out.push(format!(
                "{point}: throughput drops {:.0}% below its value at {} ({:.3} {}).",
                d.depth_pct,
                netgap_core::units::format_size(d.reference_size_bytes),
                d.reference_value,
                r.metric
            ));
        }
    }
    out.dedup();
    let machines: std::collections::BTreeSet<(String, String)> = hosts
        .values()
        .map(|h| {
            let get = |k: &str| {
                h.facts
                    .iter()
                    .find(|f| f.0 == k)
                    .map(|f| f.1.clone())
                    .unwrap_or_default()
            };
            (get("kernel"), get("cpu"))
        })
        .collect();
    if machines.len() > 1 {
        out.push(format!(
            "The results come from {} different kernel/CPU combinations; differences between them may be the machines', not the stacks'.",
            machines.len()
        ));
    }
    out
}

/// What `netgap report` wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The HTML file.
    pub html: PathBuf,
    /// SVG and PNG files written for `--images`.
    pub images: Vec<PathBuf>,
}

/// Reads `inputs`, writes the HTML report to `out` and, with `images`, each
/// plot as `plot-NN.svg` and `plot-NN.png` in that directory (created if
/// missing).
pub fn write_report(
    inputs: &[PathBuf],
    out: &Path,
    images: Option<&Path>,
) -> Result<Written, ReportError> {
    let records = load::load_files(inputs)?;
    if records.is_empty() {
        let names: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
        return Err(ReportError::Empty(names.join(", ")));
    }
    let report = Report::build(inputs, &records);
    let write = |path: &Path, bytes: &[u8]| {
        std::fs::write(path, bytes).map_err(|source| ReportError::Write {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut written = Vec::new();
    if let Some(dir) = images {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let raster = png::Rasterizer::new()?;
        for (i, plot) in report.plots.iter().enumerate() {
            let svg = plot.to_svg();
            let svg_path = dir.join(format!("plot-{:02}.svg", i + 1));
            write(&svg_path, svg.as_bytes())?;
            let png_path = dir.join(format!("plot-{:02}.png", i + 1));
            write(&png_path, &raster.png(&svg)?)?;
            written.push(svg_path);
            written.push(png_path);
        }
    }
    write(out, html::render(&report).as_bytes())?;
    Ok(Written {
        html: out.to_path_buf(),
        images: written,
    })
}
