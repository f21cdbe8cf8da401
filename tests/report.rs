//! `netgap report` on fixed results files: snapshots of the gap table and the
//! whole page (set NETGAP_UPDATE_SNAPSHOTS=1 to rewrite them after an
//! intended change), the structure of the page, `--images`, and the errors
//! a user meets.

mod common;
use netgap::report::{gap, load, Report};
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
const FIXTURES: [&str; 4] = [
    "tests/fixtures/report/p2p.jsonl",
    "tests/fixtures/report/sweep.jsonl",
    "tests/fixtures/report/logp.jsonl",
    "tests/fixtures/report/multihost.jsonl",
];

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

#[test]
fn gap_table_snapshot() {
    let table = gap::gap_table(&loaded());
    snapshot("gap.txt", &gap::render_text(&table));
    // Best first, ratios to it, and the best is 1.
    for e in &table {
        assert_eq!(e.rows[0].verdict, "best");
        assert_eq!(e.rows[0].ratio, 1.0);
        let lower = load::lower_is_better(&e.metric);
        for r in &e.rows[1..] {
            assert!(
                if lower {
                    r.ratio >= 1.0
                } else {
                    r.ratio <= 1.0
                },
                "{e:?}"
            );
        }
    }
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
            c.record.value *= 1.001;
            c
        })
        .collect();
    recs.extend(near);
    let table = gap::gap_table(&recs);
    let find = |test: &str, band: gap::Band| {
        table
            .iter()
            .find(|e| e.test == test && e.band == band)
            .unwrap_or_else(|| panic!("{test} {band:?} in the table"))
    };
    // The LogP fixture's unix stack is half of tcp's at every size, with 2% spread.
    let logp = find("logp", gap::Band::Small);
    let row = |stack: &str| {
        logp.rows
            .iter()
            .find(|r| r.stack.starts_with(stack))
            .unwrap_or_else(|| panic!("{stack} in {logp:?}"))
    };
    assert_eq!(row("tcp/").verdict, "real");
    assert!((row("tcp/").ratio - 2.0).abs() < 1e-9);
    assert_eq!(row("shm/").verdict, "within noise");
    // Both multistream stacks scale alike; uring is faster by a fixed factor.
    let ms = find("multistream x8 clients", gap::Band::Large);
    assert_eq!(ms.rows[0].stack, "uring/event @node2");
}

#[test]
fn report_page_snapshot_and_structure() {
    let recs = loaded();
    let report = Report::build(&fixtures(), &recs);
    let html = netgap::report::html::render(&report);
    snapshot("report.html", &html);
    // One figure per plot, each with its SVG, and the plots the fixtures call for.
    assert_eq!(html.matches("<figure").count(), report.plots.len());
    assert_eq!(html.matches("<svg").count(), report.plots.len());
    for title in [
        "pingpong: latency (µs, one-way) against size",
        "pingpong: latency percentiles against size",
        "stream: bandwidth (Gbit/s of payload) against size",
        "stream: service demand against size",
        "sweep: bandwidth (Gbit/s of payload) against size, dropouts circled",
        "sweep: signature graph (bandwidth (Gbit/s of payload) against block time)",
        "multistream: bandwidth (Gbit/s of payload) against clients",
        "connect: connections per second against clients",
        "logp: LogP parameters (o_s, o_r, g, L) against size",
        "CPU per stack (mean over its points)",
    ] {
        assert!(
            report.plots.iter().any(|p| p.title() == title),
            "no plot {title:?}"
        );
    }
    // Self-contained: nothing is fetched.
    for external in ["<script src", "<link", "http://", "https://", "@import"] {
        let outside_svg_ns = html.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !outside_svg_ns.contains(external),
            "page refers to {external}"
        );
    }
    // The environment names both kernels of the multi-host fixture and warns.
    assert!(html.contains("6.8.0") && html.contains("6.1.0"));
    assert!(report
        .warnings
        .iter()
        .any(|w| w.contains("different kernel/CPU combinations")));
    assert!(report
        .warnings
        .iter()
        .any(|w| w.contains("throughput drops 40%")));
    assert!(report
        .warnings
        .iter()
        .any(|w| w.contains("not the ±1.0% asked for")));
}

#[test]
fn every_series_has_its_own_marker_and_colour() {
    let report = Report::build(&fixtures(), &loaded());
    for plot in &report.plots {
        let svg = plot.to_svg();
        let legends: Vec<&str> = svg
            .split("<g class=\"series\"")
            .skip(1)
            .map(|g| {
                // The legend entry is the last marker of the group.
                let end = g.find("</g>").unwrap_or(g.len());
                let body = &g[..end];
                let tail = &body[body.rfind("<line").unwrap_or(0)..];
                tail.split("<text").next().unwrap_or("")
            })
            .collect();
        let mut seen = legends.clone();
        seen.sort();
        seen.dedup();
        // Same shape at different positions differs as text only by the
        // coordinates, so compare shape and colour alone.
        let style = |s: &str| {
            s.split(['"', ' '])
                .filter(|t| t.starts_with('#') || t.starts_with('<'))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut styles: Vec<String> = legends.iter().map(|l| style(l)).collect();
        let n = styles.len();
        styles.sort();
        styles.dedup();
        assert_eq!(styles.len(), n, "{}: two series look alike", plot.title());
    }
}

#[test]
fn the_binary_writes_the_page_and_images() {
    if netgap::report::png::Rasterizer::new().is_err() {
        if std::env::var("NETGAP_REQUIRE_SYSTEM_TESTS").as_deref() == Ok("1") {
            panic!("a font is required for PNG plots (NETGAP_REQUIRE_SYSTEM_TESTS=1) but none is installed");
        }
        eprintln!("skipping: no font installed for PNG plots (apt-get install fonts-dejavu-core)");
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
        .filter(|l| l.record.test == "pingpong")
        .collect();
    let np = netgap::import::import_file(
        "netpipe",
        &root.join("tests/fixtures/import/nptcp.out"),
        None,
    )
    .expect("NetPIPE fixture imports");
    recs.extend(np.into_iter().map(|record| load::Loaded {
        record,
        extras: load::Extras::default(),
        file: PathBuf::from("nptcp.out"),
    }));
    let table = gap::gap_table(&recs);
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
            .find(|r| r.stack == "tcp [NPtcp]")
            .expect("NPtcp row");
        assert!(np.ratio.is_finite() && np.ratio > 0.0);
        if np.verdict != "best" {
            assert_eq!(np.verdict, "no confidence interval");
        }
    }
}
