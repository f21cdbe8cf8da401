//! `netgap report`: turns results files into one self-contained HTML page
//! (inline SVG plots and CSS, nothing fetched), optionally with every plot
//! written as SVG and PNG beside it. The report reads results files only
//! ([`load`]), so it works on old runs and on results imported from peer
//! tools; [`plots`] picks the plots, [`gap`] builds the gap table, [`svg`]
//! draws, [`html`] writes the page and [`png`] rasterizes for `--images`.

pub mod compare;
pub mod figure;
pub mod gap;
pub mod html;
pub mod import;
pub mod load;
pub mod loaded;
pub mod plots;
pub mod png;
pub mod stacks;
pub mod study;
pub mod svg;

use load::Loaded;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
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
    /// `--baseline` names no stack of the results.
    #[error(transparent)]
    Baseline(#[from] stacks::SelectError),
}

/// Facts of one host as the report shows them: one row of the environment
/// table per distinct set of facts, so a host measured at two MTUs shows
/// both.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostRow {
    /// Host name.
    pub hostname: String,
    /// `(column, value)` facts in [`HOST_COLUMNS`] order; `-` when unknown.
    pub facts: Vec<(String, String)>,
}

/// The environment table's columns after the host name.
pub const HOST_COLUMNS: [&str; 8] = [
    "kernel",
    "cpu",
    "cores",
    "interface",
    "mtu",
    "offloads",
    "qdisc",
    "netgap",
];

/// One stack of the results, described in full.
#[derive(Debug, Clone, PartialEq)]
pub struct StackRow {
    /// The stack's whole description ([`netgap_core::stack::Stack::describe`]).
    pub description: String,
    /// Where it ran (`node2 -> node1`), or `-`.
    pub hosts: String,
    /// The tests that measured it.
    pub tests: Vec<String>,
    /// Its number of records.
    pub points: usize,
}

/// One kind of warning with every point it concerns.
#[derive(Debug, Clone, PartialEq)]
pub struct WarningGroup {
    /// The warning, with each number that varies between points shown as
    /// its range (`repetitions vary by 11-35% ...`).
    pub text: String,
    /// The points it concerns, as `file:line test stack size`; empty for a
    /// warning about the results as a whole.
    pub points: Vec<String>,
}

/// One test: its plots and its gap table.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    /// The test as the report names it (`stream`, `sweep (pingpong)`).
    pub test: String,
    /// The figures, each one plot or a plot with its CPU beside it.
    pub figures: Vec<figure::Figure>,
    /// The gap table: every stack against the baseline, per metric and band.
    pub gap: Vec<gap::GapEntry>,
}

/// How the report is made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReportOptions {
    /// The stack the gap tables measure every other against.
    pub baseline: stacks::Baseline,
}

/// Everything the page shows, computed from the records.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The results files read.
    pub files: Vec<PathBuf>,
    /// Number of records.
    pub records: usize,
    /// One section per test, in the order the records first show them.
    pub sections: Vec<Section>,
    /// The baseline, as the page names it.
    pub baseline: String,
    /// One sentence per gap-table entry: each stack against the baseline.
    pub conclusions: Vec<String>,
    /// Every stack of the results.
    pub stacks: Vec<StackRow>,
    /// Every host seen, as coordinator or agent.
    pub hosts: Vec<HostRow>,
    /// Socket-buffer and other sysctls per host name.
    pub sysctls: Sysctls,
    /// Distinct option sets (JSON) with the number of points using each.
    pub options: Vec<(String, usize)>,
    /// netgap versions and peer tools that made the records.
    pub makers: Vec<String>,
    /// Warnings carried from the records, and the report's own, grouped by
    /// kind.
    pub warnings: Vec<WarningGroup>,
}

impl Report {
    /// Builds the report of `records` read from `files`.
    pub fn build(files: &[PathBuf], records: &[Loaded], options: &ReportOptions) -> Report {
        // Tests in the order the results first show them: the order the
        // user ran them in.
        let mut by_section: Vec<(String, Vec<&Loaded>)> = Vec::new();
        for l in records {
            let section = l.section();
            match by_section.iter_mut().find(|(s, _)| *s == section) {
                Some((_, recs)) => recs.push(l),
                None => by_section.push((section, vec![l])),
            }
        }
        let mut sections = Vec::new();
        let mut all_labels: BTreeMap<String, plots::Labels> = BTreeMap::new();
        for (test, recs) in &by_section {
            let keys: Vec<stacks::SeriesKey> =
                recs.iter().map(|l| stacks::SeriesKey::of(l)).collect();
            let labels = stacks::labels(&keys);
            sections.push(Section {
                test: test.clone(),
                figures: plots::figures(test, recs),
                gap: gap::gap_table(recs, &labels, &options.baseline),
            });
            all_labels.insert(test.clone(), labels);
        }
        let entries: Vec<gap::GapEntry> = sections.iter().flat_map(|s| s.gap.clone()).collect();
        let (hosts, sysctls) = hosts(records);
        let mut option_sets: BTreeMap<String, usize> = BTreeMap::new();
        for o in records.iter().filter_map(|l| l.record.options.as_ref()) {
            let text = serde_json::to_string(o).unwrap_or_default();
            *option_sets.entry(text).or_default() += 1;
        }
        let mut makers: Vec<String> = records
            .iter()
            .map(|l| match l.record.tool() {
                Some(t) => format!("{t} (imported by netgap {})", l.record.version),
                None => format!("netgap {}", l.record.version),
            })
            .collect();
        makers.sort();
        makers.dedup();
        Report {
            files: files.to_vec(),
            records: records.len(),
            baseline: options.baseline.describe(),
            conclusions: gap::conclusions(&entries),
            sections,
            stacks: stack_rows(records),
            warnings: warnings(records, &all_labels, &hosts),
            hosts,
            sysctls,
            options: option_sets.into_iter().collect(),
            makers,
        }
    }

    /// Every plot of the page, in page order.
    pub fn plots(&self) -> impl Iterator<Item = &svg::Plot> {
        self.sections
            .iter()
            .flat_map(|s| s.figures.iter().flat_map(|f| f.panels.iter()))
    }
}

/// Each host's sysctls by name, per host name.
pub type Sysctls = Vec<(String, Vec<(String, String)>)>;

/// The environment rows and each host's sysctls.
fn hosts(records: &[Loaded]) -> (Vec<HostRow>, Sysctls) {
    let mut rows: BTreeSet<HostRow> = BTreeSet::new();
    let mut sysctls: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for h in records
        .iter()
        .flat_map(|l| [&l.record.host, &l.record.peer_host])
        .flatten()
    {
        let dash = || "-".to_string();
        let offloads = h
            .offloads
            .as_ref()
            .map_or_else(dash, |o| netgap_core::host::Offloads::summary(&[o]));
        let values = [
            h.kernel.clone(),
            h.cpu_model.clone(),
            h.cores.to_string(),
            h.interface.clone().unwrap_or_else(dash),
            h.mtu_bytes.map_or_else(dash, |m| format!("{m} bytes")),
            offloads,
            h.qdisc.clone().unwrap_or_else(dash),
            h.netgap_version.clone(),
        ];
        rows.insert(HostRow {
            hostname: h.hostname.clone(),
            facts: HOST_COLUMNS
                .iter()
                .map(|c| c.to_string())
                .zip(values)
                .collect(),
        });
        let s = sysctls.entry(h.hostname.clone()).or_default();
        s.extend(h.sysctls.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    (
        rows.into_iter().collect(),
        sysctls
            .into_iter()
            .filter(|(_, s)| !s.is_empty())
            .map(|(h, s)| (h, s.into_iter().collect()))
            .collect(),
    )
}

/// Every stack of the records, in stack order.
fn stack_rows(records: &[Loaded]) -> Vec<StackRow> {
    let mut by: BTreeMap<stacks::SeriesKey, (BTreeSet<String>, usize)> = BTreeMap::new();
    for l in records {
        let e = by.entry(stacks::SeriesKey::of(l)).or_default();
        e.0.insert(l.section());
        e.1 += 1;
    }
    by.into_iter()
        .map(|(k, (tests, points))| StackRow {
            description: k.stack.describe(),
            hosts: k.hosts.unwrap_or_else(|| "-".into()),
            tests: tests.into_iter().collect(),
            points,
        })
        .collect()
}

/// The records' own warnings, unmet `--ci` targets, dropouts, and a
/// warning when the hosts differ in kernel or CPU, grouped by kind: the
/// same sentence with other numbers is the same kind.
fn warnings(
    records: &[Loaded],
    labels: &BTreeMap<String, plots::Labels>,
    hosts: &[HostRow],
) -> Vec<WarningGroup> {
    let mut found: Vec<(String, String)> = Vec::new();
    for l in records {
        let r = &l.record;
        let section = l.section();
        let stack = labels
            .get(&section)
            .and_then(|m| m.get(&stacks::SeriesKey::of(l)))
            .cloned()
            .unwrap_or_else(|| l.stack.describe());
        let point = format!(
            "{}:{} {section} {stack} {}",
            l.file.display(),
            l.line,
            netgap_core::units::format_size(r.size_bytes)
        );
        for w in &r.warnings {
            found.push((w.clone(), point.clone()));
        }
        if let Some(ci) = l.record.ci_target.as_ref().filter(|c| !c.met) {
            found.push((
                format!(
                    "the {}% confidence interval reached ±{:.1}%, not the ±{:.1}% asked for.",
                    ci.confidence_pct, ci.achieved_half_width_pct, ci.half_width_pct
                ),
                point.clone(),
            ));
        }
        if let Some(d) = l.record.dropout() {
            found.push((
                format!(
                    "throughput drops {:.0}% below its value at {} ({:.3} {}).",
                    d.depth_pct,
                    netgap_core::units::format_size(d.reference_size_bytes),
                    d.reference_value,
                    r.metric
                ),
                point.clone(),
            ));
        }
    }
    let mut groups = group_warnings(found);
    // The same point of the same stack measured more than once: plots and
    // tables keep the later record, so say which were set aside.
    let mut seen: BTreeMap<(String, stacks::SeriesKey, String, u64, Option<u32>), &Loaded> =
        BTreeMap::new();
    let mut shadowed = Vec::new();
    for l in records {
        let key = (
            l.section(),
            stacks::SeriesKey::of(l),
            l.record.metric.clone(),
            l.record.size_bytes,
            l.record.clients(),
        );
        if let Some(earlier) = seen.insert(key, l) {
            shadowed.push(format!(
                "{}:{} (by {}:{})",
                earlier.file.display(),
                earlier.line,
                l.file.display(),
                l.line
            ));
        }
    }
    if !shadowed.is_empty() {
        groups.push(WarningGroup {
            text: "The same point of the same series (stack, hosts and workload options alike) appears in more than one file; plots and tables keep the later record and set the earlier one aside. Give separate runs a --label to keep them apart.".into(),
            points: shadowed,
        });
    }
    let machines: BTreeSet<(&str, &str)> = hosts
        .iter()
        .map(|h| {
            let get = |k: &str| {
                h.facts
                    .iter()
                    .find(|f| f.0 == k)
                    .map_or("", |f| f.1.as_str())
            };
            (get("kernel"), get("cpu"))
        })
        .collect();
    if machines.len() > 1 {
        groups.push(WarningGroup {
            text: format!(
                "The results come from {} different kernel/CPU combinations; differences between them may be the machines', not the stacks'.",
                machines.len()
            ),
            points: Vec::new(),
        });
    }
    groups
}

/// Splits a warning into its text with numbers blanked and the numbers.
fn template(text: &str) -> (String, Vec<String>) {
    let mut shape = String::new();
    let mut numbers = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let in_number = c.is_ascii_digit()
            || (c == '.'
                && !current.is_empty()
                && chars.get(i + 1).is_some_and(char::is_ascii_digit));
        if in_number {
            current.push(c);
            continue;
        }
        if !current.is_empty() {
            numbers.push(std::mem::take(&mut current));
            shape.push('\u{0}');
        }
        shape.push(c);
    }
    if !current.is_empty() {
        numbers.push(current);
        shape.push('\u{0}');
    }
    (shape, numbers)
}

/// Groups `(warning, point)` pairs by the warning's shape, in order of
/// first appearance; each number that varies is shown as its range.
fn group_warnings(found: Vec<(String, String)>) -> Vec<WarningGroup> {
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, (Vec<Vec<String>>, Vec<String>)> = BTreeMap::new();
    for (text, point) in found {
        let (shape, numbers) = template(&text);
        let e = by.entry(shape.clone()).or_insert_with(|| {
            order.push(shape.clone());
            Default::default()
        });
        e.0.push(numbers);
        if !e.1.contains(&point) {
            e.1.push(point);
        }
    }
    order
        .into_iter()
        .filter_map(|shape| {
            let (numbers, points) = by.remove(&shape)?;
            let mut text = String::new();
            let mut slot = 0;
            for c in shape.chars() {
                if c != '\u{0}' {
                    text.push(c);
                    continue;
                }
                let values: Vec<&String> = numbers.iter().filter_map(|v| v.get(slot)).collect();
                let parsed = |s: &&String| s.parse::<f64>().unwrap_or(0.0);
                let lo = values
                    .iter()
                    .copied()
                    .min_by(|a, b| parsed(a).total_cmp(&parsed(b)));
                let hi = values
                    .iter()
                    .copied()
                    .max_by(|a, b| parsed(a).total_cmp(&parsed(b)));
                match (lo, hi) {
                    (Some(lo), Some(hi)) if parsed(&lo) != parsed(&hi) => {
                        let _ = write!(text, "{lo}-{hi}");
                    }
                    (Some(v), _) => text.push_str(v),
                    _ => {}
                }
                slot += 1;
            }
            Some(WarningGroup { text, points })
        })
        .collect()
}

/// What `netgap report` wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The HTML file.
    pub html: PathBuf,
    /// SVG and PNG files written for `--images`.
    pub images: Vec<PathBuf>,
}

/// Writes `bytes` as the file `path`: first into a file made new beside it
/// (`O_CREAT | O_EXCL`, which never follows a link), then renamed over
/// `path`. A link at `path` (one another user planted in a shared
/// directory) is replaced, never written through, so the file it names is
/// untouched; and a reader sees the old file or the new one whole. In a
/// sticky directory another user's file or link there is theirs to keep:
/// the rename fails and says so.
fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("it names no file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut attempts = 0;
    let (tmp, mut file) = loop {
        let tmp = dir.join(format!(
            ".{}.{}-{nanos:x}-{}.new",
            name.to_string_lossy(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            // A name someone else took: the next one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 100 => {
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let done = file
        .write_all(bytes)
        .and_then(|()| file.flush())
        .and_then(|()| std::fs::rename(&tmp, path));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Reads `inputs`, writes the HTML report to `out` and, with `images`, each
/// plot as `plot-NN.svg` and `plot-NN.png` in that directory (created if
/// missing), with the default options. Each file is written new and renamed
/// into place, never through a link.
pub fn write_report(
    inputs: &[PathBuf],
    out: &Path,
    images: Option<&Path>,
) -> Result<Written, ReportError> {
    write_report_with(inputs, out, images, &ReportOptions::default())
}

/// [`write_report`] with `options`; a `--baseline` that names no stack of
/// the results is an error listing the stacks.
pub fn write_report_with(
    inputs: &[PathBuf],
    out: &Path,
    images: Option<&Path>,
    options: &ReportOptions,
) -> Result<Written, ReportError> {
    let load::LoadedFile { records, torn } = load::load_files_parts(inputs)?;
    if records.is_empty() {
        let names: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
        return Err(ReportError::Empty(names.join(", ")));
    }
    if let stacks::Baseline::Select(sel) = &options.baseline {
        if !records.iter().any(|l| sel.matches(&l.stack)) {
            return Err(sel
                .no_match("--baseline", records.iter().map(|l| &l.stack))
                .into());
        }
    }
    let mut report = Report::build(inputs, &records, options);
    if !torn.is_empty() {
        report.warnings.insert(
            0,
            WarningGroup {
                text: format!(
                    "{} torn record{} (cut short by a crash or a full disk) skipped; the intact records are reported.",
                    torn.len(),
                    if torn.len() == 1 { "" } else { "s" }
                ),
                points: torn
                    .iter()
                    .map(|t| format!("{}:{}", t.path.display(), t.line))
                    .collect(),
            },
        );
    }
    let write = |path: &Path, bytes: &[u8]| {
        write_replacing(path, bytes).map_err(|source| ReportError::Write {
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
        for (i, plot) in report.plots().enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_replaces_a_link_at_its_name_and_leaves_what_it_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"keep").expect("secret");
        let link = dir.path().join("report.html");
        std::os::unix::fs::symlink(&secret, &link).expect("link");
        write_replacing(&link, b"<html>").expect("written");
        assert_eq!(std::fs::read(&secret).expect("secret"), b"keep");
        let meta = std::fs::symlink_metadata(&link).expect("report");
        assert!(meta.file_type().is_file(), "the link was replaced");
        assert_eq!(std::fs::read(&link).expect("report"), b"<html>");
        write_replacing(&link, b"<html>2").expect("again");
        assert_eq!(std::fs::read(&link).expect("report"), b"<html>2");
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert_eq!(names.len(), 2, "no temporary file is left");
        // A name that is a directory is an error, and nothing is left.
        assert!(write_replacing(dir.path(), b"x").is_err());
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("sub");
        assert!(write_replacing(&sub, b"x").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 3);
    }

    #[test]
    fn warnings_of_one_kind_are_one_line_with_the_range_of_their_numbers() {
        let found = vec![
            (
                "repetitions vary by 12% (cv); pin".to_string(),
                "a:1".to_string(),
            ),
            ("dropout at 16K".to_string(), "a:2".to_string()),
            (
                "repetitions vary by 35% (cv); pin".to_string(),
                "a:3".to_string(),
            ),
            (
                "repetitions vary by 5.5% (cv); pin".to_string(),
                "a:3".to_string(),
            ),
        ];
        let groups = group_warnings(found);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].text, "repetitions vary by 5.5-35% (cv); pin");
        assert_eq!(groups[0].points, ["a:1", "a:3"]);
        assert_eq!(groups[1].text, "dropout at 16K");
        // A sentence's full stop is not a decimal point.
        assert_eq!(template("at 16. Then").1, ["16"]);
    }
}
