//! `netgap report` on fixed results files: snapshots of the gap tables and
//! the whole page (set NETGAP_UPDATE_SNAPSHOTS=1 to rewrite them after an
//! intended change), the structure of the page (a series per stack, error
//! bars, CPU beside each metric, log axes, poll beside event, grouped
//! warnings), `--baseline`, `--images`, and the errors a user meets.

use crate::common;
use netgap::report::stacks::{self, Baseline, SeriesKey, StackSelector};
use netgap::report::svg::Plot;
use netgap::report::{gap, load, Report, ReportOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary, run from the repository so the fixtures' relative paths
/// resolve.
fn netgap() -> Command {
    let mut c = common::netgap();
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// The fixtures, as relative paths so the page does not depend on where the
/// repository is checked out.
const FIXTURES: [&str; 5] = [
    "tests/fixtures/report/p2p.jsonl",
    "tests/fixtures/report/sweep.jsonl",
    "tests/fixtures/report/logp.jsonl",
    "tests/fixtures/report/multihost.jsonl",
    "tests/fixtures/report/stacks.jsonl",
];

/// The fixture with several stacks of one test: `stream` over a 2-host
/// testbed at MTU 1500 and 9000 with offloads on and off (one interleaved
/// run), tcp in poll mode beside event, shm at 400 Gbit/s on loopback;
/// `pingpong` under two labels and on another pair of hosts, one point of
/// which has a single repetition.
const STACKS: &str = "tests/fixtures/report/stacks.jsonl";

fn fixtures() -> Vec<PathBuf> {
    FIXTURES.iter().map(PathBuf::from).collect()
}

fn loaded() -> Vec<load::Loaded> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let abs: Vec<PathBuf> = FIXTURES.iter().map(|f| root.join(f)).collect();
    let mut recs = load::load_files(&abs).expect("fixtures load");
    for r in &mut recs {
        r.file = r.file.strip_prefix(root).expect("under root").to_path_buf();
    }
    recs
}

/// Compares `actual` with the snapshot file, or rewrites it when asked.
fn snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("NETGAP_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with NETGAP_UPDATE_SNAPSHOTS=1)",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| "length".to_string(), |i| format!("line {}", i + 1));
        panic!(
            "{} differs from the snapshot at {line}; rerun with NETGAP_UPDATE_SNAPSHOTS=1 if the change is intended",
            path.display()
        );
    }
}

fn report(recs: &[load::Loaded]) -> Report {
    Report::build(&fixtures(), recs, &ReportOptions::default())
}

fn all_gaps(r: &Report) -> Vec<gap::GapEntry> {
    r.sections.iter().flat_map(|s| s.gap.clone()).collect()
}

#[test]
fn gap_table_snapshot() {
    let table = all_gaps(&report(&loaded()));
    snapshot("gap.txt", &gap::render_text(&table));
    // The reference first, at ratio 1; the best stack marked once.
    for e in &table {
        assert!(
            e.rows[0].verdict == "baseline" || e.rows[0].verdict == "best",
            "{e:?}"
        );
        assert_eq!(e.rows[0].ratio, 1.0);
        assert_eq!(e.rows.iter().filter(|r| r.best).count(), 1, "{e:?}");
    }
    // Every test with two stacks has its table: workloads (by
    // clients), sweeps and LogP among them.
    for test in [
        "connect",
        "multistream",
        "sweep (pingpong)",
        "logp",
        "pingpong",
        "stream",
    ] {
        assert!(
            table.iter().any(|e| e.test == test),
            "no gap table for {test}"
        );
    }
    assert!(table.iter().any(|e| e.test == "multistream"
        && e.band == gap::Band::Clients
        && e.sizes == [1, 2, 4, 8]));
}

#[test]
fn gap_table_calls_distinct_stacks_real_and_near_ones_noise() {
    let mut recs = loaded();
    // A third LogP stack within 0.1% of unix: inside its 2% spread.
    let near: Vec<load::Loaded> = recs
        .iter()
        .filter(|l| l.record.test == "logp" && l.record.transport == "unix")
        .map(|l| {
            let mut c = l.clone();
            c.record.transport = "shm".into();
            c.stack.transport = "shm".into();
            c.record.value *= 1.001;
            c
        })
        .collect();
    recs.extend(near);
    let logp: Vec<&load::Loaded> = recs.iter().filter(|l| l.record.test == "logp").collect();
    let keys: Vec<SeriesKey> = logp.iter().map(|l| SeriesKey::of(l)).collect();
    let labels = stacks::labels(&keys);
    let default = gap::gap_table(&logp, &labels, &Baseline::default());
    let unix = Baseline::Select(StackSelector::parse("unix").expect("parses"));
    let table = gap::gap_table(&logp, &labels, &unix);
    let small = table
        .iter()
        .find(|e| e.metric == "gap_us" && e.band == gap::Band::Small)
        .expect("logp gap_us small");
    let row = |stack: &str| {
        small
            .rows
            .iter()
            .find(|r| r.stack == stack)
            .unwrap_or_else(|| panic!("{stack} in {small:?}"))
    };
    // The LogP fixture's tcp is twice unix at every size, with 2% spread.
    assert_eq!(row("unix").verdict, "baseline");
    assert_eq!(row("tcp").verdict, "real");
    assert!((row("tcp").ratio - 2.0).abs() < 1e-9);
    assert_eq!(row("shm").verdict, "within noise");
    // By default tcp with event completion is the baseline.
    let first = default
        .iter()
        .find(|e| e.metric == "gap_us" && e.band == gap::Band::Small)
        .expect("logp gap_us small");
    assert_eq!(first.rows[0].stack, "tcp");
    assert_eq!(first.rows[0].verdict, "baseline");
}

fn plot<'a>(r: &'a Report, title: &str) -> &'a netgap::report::svg::LinePlot {
    r.plots()
        .find_map(|p| match p {
            Plot::Line(l) if l.title == title => Some(l),
            _ => None,
        })
        .unwrap_or_else(|| {
            let titles: Vec<&str> = r.plots().map(Plot::title).collect();
            panic!("no plot {title:?} in {titles:?}")
        })
}

#[test]
fn report_page_snapshot_and_structure() {
    let recs = loaded();
    let report = report(&recs);
    let html = netgap::report::html::render(&report);
    snapshot("report.html", &html);
    // One figure per plot, each with its SVG, and the plots the fixtures call for.
    let plots = report.plots().count();
    assert_eq!(html.matches("<figure").count(), plots);
    assert_eq!(html.matches("<svg").count(), plots);
    for title in [
        "pingpong: latency (µs, one-way) against size",
        "pingpong: CPU of both ends against size",
        "pingpong: latency percentiles against size",
        "stream: bandwidth (Gbit/s of payload) against size",
        "stream: CPU of both ends against size",
        "stream: service demand against size",
        "sweep (pingpong): bandwidth (Gbit/s of payload) against size, dropouts circled",
        "sweep (pingpong): signature graph (bandwidth (Gbit/s of payload) against block time)",
        "multistream: bandwidth (Gbit/s of payload) against streams",
        "multistream: CPU of server and client hosts against streams",
        "connect: connections per second against clients",
        "logp: LogP parameters (o_s, o_r, g, L) against size",
    ] {
        plot(&report, title);
    }
    // A table of contents linking every test's section and gap table.
    assert!(html.contains("<nav class=\"toc\""));
    for s in &report.sections {
        let id = format!("test-{}", s.test.replace([' ', '(', ')'], "-"));
        let id = id.trim_end_matches('-').replace("--", "-");
        assert!(html.contains(&format!("href=\"#{id}\"")), "{id}");
        assert!(html.contains(&format!("href=\"#{id}-gap\"")), "{id}");
    }
    // Self-contained: nothing is fetched.
    for external in ["<script src", "<link", "http://", "https://", "@import"] {
        let outside_svg_ns = html.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !outside_svg_ns.contains(external),
            "page refers to {external}"
        );
    }
    // The environment names both kernels of the multi-host fixture, the
    // offloads of the testbed's hosts, and warns.
    assert!(html.contains("6.8.0") && html.contains("6.1.0"));
    assert!(html.contains("<th>offloads</th>") && html.contains("<th>qdisc</th>"));
    let warn = |needle: &str| {
        report
            .warnings
            .iter()
            .find(|w| w.text.contains(needle))
            .unwrap_or_else(|| panic!("no warning {needle:?}"))
    };
    assert!(warn("different kernel/CPU combinations").points.is_empty());
    let drop = warn("throughput drops 40%");
    assert_eq!(
        drop.points,
        ["tests/fixtures/report/sweep.jsonl:16 sweep (pingpong) tcp 32K"]
    );
    warn("not the ±1.0% asked for");
}

#[test]
fn several_stacks_of_one_test_are_several_series_labelled_by_what_differs() {
    let recs = loaded();
    let report = report(&recs);
    let bw = plot(
        &report,
        "stream: bandwidth (Gbit/s of payload) against size",
    );
    let names: Vec<&str> = bw.series.iter().map(|s| s.name.as_str()).collect();
    // The loopback fixture's two stacks, then the testbed's six: never merged.
    assert_eq!(names.len(), 8, "{names:?}");
    let mut distinct = names.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    for (mtu, offload) in [
        ("1500", "off"),
        ("9000", "off"),
        ("1500", "on"),
        ("9000", "on"),
    ] {
        let want = format!("tcp, event, testbed, switch, MTU {mtu}, offload {offload}");
        assert!(
            names.iter().any(|n| n.starts_with(&want)),
            "no series {want:?} in {names:?}"
        );
    }
    // shm at 400 Gbit/s against tcp at a few: the axis is logarithmic.
    assert!(bw.y.log, "bandwidth spans four decades on a linear axis");
    // Poll is drawn beside event of the same stack: adjacent, each series
    // in a colour of its own.
    let at = |mode: &str| {
        names
            .iter()
            .position(|n| {
                n.starts_with(&format!(
                    "tcp, {mode}, testbed, switch, MTU 9000, offload on"
                ))
            })
            .expect("series")
    };
    let (e, p) = (at("event"), at("poll"));
    assert_eq!(p, e + 1, "{names:?}");
    assert_ne!(bw.series[e].colour, bw.series[p].colour);
    // Every point with a confidence interval carries its bar; the one with a
    // single repetition has none.
    let ping = plot(&report, "pingpong: latency (µs, one-way) against size");
    let bars = |p: &netgap::report::svg::LinePlot| -> usize {
        p.series
            .iter()
            .map(|s| s.errors.iter().flatten().count())
            .sum()
    };
    let points: usize = ping.series.iter().map(|s| s.points.len()).sum();
    assert_eq!(bars(ping), points - 1);
    let svg = Plot::Line(ping.clone()).to_svg();
    assert_eq!(svg.matches("class=\"errorbar\"").count(), points - 1);
    // CPU of both ends beside the bandwidth plot, per stack and size.
    let section = report
        .sections
        .iter()
        .find(|s| s.test == "stream")
        .expect("stream section");
    let first = &section.figures[0].panels;
    assert_eq!(first.len(), 2);
    assert_eq!(first[1].title(), "stream: CPU of both ends against size");
    let cpu = plot(&report, "stream: CPU of both ends against size");
    assert_eq!(cpu.series.len(), 2 * names.len());
    assert!(cpu.series.iter().any(|s| s.name.ends_with(" client")));
    assert!(cpu.series.iter().any(|s| s.name.ends_with(" server")));
    // Two hosts pairs under pingpong: the labels name the hosts.
    let ping_names: Vec<&str> = ping.series.iter().map(|s| s.name.as_str()).collect();
    assert!(
        ping_names.iter().any(|n| n.ends_with("@h4 -> h3")),
        "{ping_names:?}"
    );
    assert!(
        ping_names.iter().any(|n| n.contains("[before]")),
        "{ping_names:?}"
    );
    assert!(
        ping_names.iter().any(|n| n.contains("[after]")),
        "{ping_names:?}"
    );
}

#[test]
fn warnings_are_grouped_by_kind_with_the_points_they_concern() {
    let report = report(&loaded());
    let noisy: Vec<_> = report
        .warnings
        .iter()
        .filter(|w| w.text.starts_with("repetitions vary by"))
        .collect();
    assert_eq!(noisy.len(), 1, "{noisy:?}");
    let w = noisy[0];
    // The numbers that vary between points are shown as their range.
    assert!(
        w.text.starts_with("repetitions vary by 5.7-71% "),
        "{}",
        w.text
    );
    // p2p's noisy points and the testbed's two.
    assert!(w.points.len() > 2);
    assert!(
        w.points
            .iter()
            .any(|p| p
                .starts_with("tests/fixtures/report/stacks.jsonl:11 stream tcp, event, testbed"))
    );
}

#[test]
fn a_point_measured_twice_is_drawn_once_and_warned_about() {
    let mut recs = loaded();
    let again: Vec<load::Loaded> = recs
        .iter()
        .filter(|l| l.file.ends_with("stacks.jsonl"))
        .cloned()
        .collect();
    let n = again.len();
    recs.extend(again);
    let report = report(&recs);
    let w = report
        .warnings
        .iter()
        .find(|w| w.text.starts_with("The same point of the same series"))
        .expect("a warning about repeated points");
    assert_eq!(w.points.len(), n);
    let bw = plot(
        &report,
        "stream: bandwidth (Gbit/s of payload) against size",
    );
    assert_eq!(bw.series.len(), 8);
}

#[test]
fn the_baseline_is_the_host_tcp_stack_unless_named() {
    let recs = loaded();
    let default = report(&recs);
    let stream = |r: &Report| {
        all_gaps(r)
            .into_iter()
            .filter(|e| e.test == "stream" && e.band == gap::Band::Large)
            .collect::<Vec<_>>()
    };
    let e = &stream(&default)[0];
    assert!(e.against_baseline);
    assert!(e.reference.starts_with("tcp, event,"), "{}", e.reference);
    let named = Report::build(
        &fixtures(),
        &recs,
        &ReportOptions {
            baseline: Baseline::Select(
                StackSelector::parse("MTU 9000, offload off").expect("parses"),
            ),
        },
    );
    let e = &stream(&named)[0];
    assert!(
        e.reference.contains("MTU 9000, offload off"),
        "{}",
        e.reference
    );
    // Offload off: MTU 1500 well below 9000, and really so.
    let row = e
        .rows
        .iter()
        .find(|r| r.stack.contains("MTU 1500, offload off"))
        .expect("MTU 1500 row");
    // Both from one interleaved run, so drift between runs is ruled out.
    assert!(
        row.ratio < 0.5 && row.verdict == "real, interleaved",
        "{row:?}"
    );
    let shm = e
        .rows
        .iter()
        .find(|r| r.stack.starts_with("shm"))
        .expect("shm row");
    assert_eq!(shm.verdict, "real", "{shm:?}");
    // A baseline that names no stack is one line naming the stacks.
    let dir = tempfile::tempdir().expect("tempdir");
    let o = netgap()
        .args(["report", "--baseline", "MTU 4000", "-o"])
        .arg(dir.path().join("r.html"))
        .arg(STACKS)
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--baseline \"MTU 4000\" matches no stack") && err.contains("MTU 9000"),
        "{err}"
    );
}

#[test]
fn every_series_has_its_own_marker_colour_and_dash() {
    let report = report(&loaded());
    for plot in report.plots() {
        let Plot::Line(p) = plot else { continue };
        // The look of a series: colour, dash and marker shape (the SVG
        // writer gives series k marker k of its eight).
        let mut looks: Vec<(usize, usize, usize)> = p
            .series
            .iter()
            .enumerate()
            .map(|(k, s)| (s.colour % 8, s.dash % 4, k % 8))
            .collect();
        let n = looks.len();
        looks.sort();
        looks.dedup();
        assert_eq!(looks.len(), n, "{}: two series look alike", p.title);
    }
}

#[test]
fn the_binary_writes_the_page_and_images() {
    if netgap::report::png::Rasterizer::new().is_err() {
        common::skip(
            "the_binary_writes_the_page_and_images",
            "no font installed for PNG plots (apt-get install fonts-dejavu-core)",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("r.html");
    let images = dir.path().join("img");
    let o = netgap()
        .args(["report", "-o"])
        .arg(&out)
        .arg("--images")
        .arg(&images)
        .args(FIXTURES)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&out).expect("page written");
    let figures = html.matches("<figure").count();
    assert!(figures >= 10);
    for i in 1..=figures {
        let svg = std::fs::read_to_string(images.join(format!("plot-{i:02}.svg"))).expect("svg");
        assert!(svg.starts_with("<svg"));
        let png = std::fs::read(images.join(format!("plot-{i:02}.png"))).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}

#[test]
fn bad_results_files_give_one_line_naming_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.jsonl");
    let good = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURES[0]))
        .expect("fixture");
    let first = good.lines().next().expect("a line");
    std::fs::write(&bad, format!("{first}\n{{\"test\": 3}}\n")).expect("write");
    let o = netgap()
        .args(["report", "-o"])
        .arg(dir.path().join("r.html"))
        .arg(&bad)
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad.jsonl:2:"), "{err}");
    let missing = netgap()
        .args(["report", "-o"])
        .arg(dir.path().join("r.html"))
        .arg(dir.path().join("none.jsonl"))
        .output()
        .expect("runs");
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("none.jsonl"));
    assert!(!dir.path().join("r.html").exists());
}

#[test]
fn a_peer_tool_with_other_sizes_is_compared_on_the_sizes_it_shares() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut recs: Vec<load::Loaded> = loaded()
        .into_iter()
        .filter(|l| l.record.test == "pingpong" && l.file.ends_with("p2p.jsonl"))
        .collect();
    let np = netgap::import::import_file(
        "netpipe",
        &root.join("tests/fixtures/import/nptcp.out"),
        None,
    )
    .expect("NetPIPE fixture imports");
    recs.extend(
        np.into_iter().enumerate().map(|(i, record)| {
            load::Loaded::from_record(record, PathBuf::from("nptcp.out"), i + 1)
        }),
    );
    let refs: Vec<&load::Loaded> = recs.iter().filter(|l| l.section() == "pingpong").collect();
    let keys: Vec<SeriesKey> = refs.iter().map(|l| SeriesKey::of(l)).collect();
    let table = gap::gap_table(&refs, &stacks::labels(&keys), &Baseline::default());
    for band in [gap::Band::Small, gap::Band::Medium, gap::Band::Large] {
        let e = table
            .iter()
            .find(|e| e.test == "pingpong" && e.metric == "latency_us" && e.band == band)
            .unwrap_or_else(|| panic!("pingpong latency {band:?}"));
        // NetPIPE measured many sizes netgap did not: it is the reference,
        // and netgap's stacks still compare on the sizes they share with it.
        assert_eq!(e.rows.len(), 3, "{e:?}");
        let np = e
            .rows
            .iter()
            .find(|r| r.stack.starts_with("tcp [NPtcp]"))
            .expect("NPtcp row");
        assert!(np.ratio.is_finite() && np.ratio > 0.0);
        assert_eq!(np.verdict, "no confidence interval");
    }
}

/// Application records of one run with several servers, Zipf alphas, pio
/// shapes, operations and patterns, gather responders and modes, pipeline
/// presets, pinned and unpinned points, two MTUs, and two NPtcp imports of
/// the same file under two labels.
const APPS: &str = "tests/fixtures/report/apps.jsonl";

#[test]
fn application_records_of_one_run_are_never_merged_or_dropped() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut recs = load::load_files(&[root.join(APPS)]).expect("fixture loads");
    for r in &mut recs {
        r.file = r.file.strip_prefix(root).expect("under root").to_path_buf();
    }
    let report = Report::build(&[PathBuf::from(APPS)], &recs, &ReportOptions::default());
    assert!(
        !report
            .warnings
            .iter()
            .any(|w| w.text.starts_with("The same point")),
        "no record set aside: {:?}",
        report.warnings
    );
    // Every record is a point of a value plot (CPU plots aside), and the
    // plots are listed with their axes and series.
    let mut listing = String::new();
    let mut plotted = 0;
    for p in report.plots() {
        let Plot::Line(p) = p else { continue };
        if p.title.contains(": CPU of ") {
            continue;
        }
        let scale = |a: &netgap::report::svg::Axis| {
            if !a.categories.is_empty() {
                format!("category {}", a.categories.join(" "))
            } else if a.log {
                "log".to_string()
            } else {
                "linear".to_string()
            }
        };
        listing.push_str(&format!(
            "{}\n  x: {} ({}), y: {}\n",
            p.title,
            p.x.label,
            scale(&p.x),
            scale(&p.y)
        ));
        let colours: std::collections::BTreeSet<usize> =
            p.series.iter().map(|s| s.colour).collect();
        assert_eq!(colours.len(), p.series.len(), "{}: a colour each", p.title);
        for s in &p.series {
            plotted += s.points.len() + s.marks.iter().filter(|m| m.fault).count();
            listing.push_str(&format!("  {} points: {}\n", s.points.len(), s.name));
        }
        for r in &p.refs {
            listing.push_str(&format!("  reference: {}\n", r.label));
        }
    }
    assert_eq!(plotted, recs.len(), "{listing}");
    snapshot("apps-series.txt", &listing);
    // The web plots are against file size and alpha, never at "1K".
    let alpha = plot(&report, "web: transactions per second against alpha");
    assert_eq!(alpha.series.len(), 2);
    assert!(alpha
        .series
        .iter()
        .all(|s| s.points.iter().map(|p| p.0).eq([0.6, 0.8, 1.0])));
    // The pio bandwidth plot draws the path's limit.
    let pio = plot(
        &report,
        "pio: bandwidth (Gbit/s of payload) against servers/clients",
    );
    assert_eq!(pio.refs.len(), 1);
    assert_eq!(pio.x.categories, ["1S/3C", "3S/1C"]);
}
