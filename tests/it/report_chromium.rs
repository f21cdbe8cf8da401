//! The report page in a real browser: Debian's chromium, headless, loads the
//! page written by `netgap report` with no console messages (the page has
//! no script, so any message is an error: a failed load, a blocked request),
//! its DOM holds every plot, the table of contents, confidence bars on the
//! points, CPU panels beside the metrics, log axes where the values span
//! decades, the path's limit drawn on a bandwidth plot, and a screenshot is
//! kept in
//! `target/test-output/report-chromium/` for a person to look at.
//!
//! Without chromium the test says why it skips, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 (set by `.ci/run`, which installs it).

use crate::common;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn output_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("test-output").join("report-chromium");
    std::fs::create_dir_all(&dir).expect("output dir");
    dir
}

/// What chromium printed.
struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs headless chromium on `url` with `args`, killing it after a minute.
/// Its output goes to files, not pipes, so a large DOM cannot block it.
fn run_chromium(bin: &Path, url: &str, args: &[String]) -> Output {
    let profile = tempfile::tempdir().expect("profile dir");
    let out_path = profile.path().join("stdout");
    let err_path = profile.path().join("stderr");
    let file = |p: &Path| std::fs::File::create(p).expect("output file");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .args(args)
        .arg(url)
        .arg(format!(
            "--user-data-dir={}",
            profile.path().join("profile").display()
        ))
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .spawn()
        .expect("chromium starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        success: status.success(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

#[test]
fn the_report_opens_in_headless_chromium_with_every_plot() {
    let Some(bin) = chromium() else {
        common::skip(
            "the_report_opens_in_headless_chromium_with_every_plot",
            "chromium is not installed (apt-get install chromium)",
        );
        return;
    };
    let dir = output_dir();
    let html = dir.join("report.html");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let peers = dir.join("peers.jsonl");
    let _ = std::fs::remove_file(&peers);
    let o = common::netgap()
        .args(["import", "netpipe"])
        .arg(root.join("tests/fixtures/import/nptcp.out"))
        .arg("-o")
        .arg(&peers)
        .output()
        .expect("import runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = common::netgap()
        .current_dir(root)
        .args(["report", "-o"])
        .arg(&html)
        .args([
            "tests/fixtures/report/p2p.jsonl",
            "tests/fixtures/report/sweep.jsonl",
            "tests/fixtures/report/logp.jsonl",
            "tests/fixtures/report/multihost.jsonl",
            "tests/fixtures/report/stacks.jsonl",
            "tests/fixtures/report/apps.jsonl",
        ])
        .arg(&peers)
        .output()
        .expect("report runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).expect("page");
    let plots = page.matches("<figure id=\"plot-").count();
    assert!(plots >= 10, "{plots} plots");

    let url = format!("file://{}", html.display());
    let dom = run_chromium(&bin, &url, &["--dump-dom".to_string()]);
    assert!(dom.success, "chromium --dump-dom failed: {}", dom.stderr);
    let dom_text = &dom.stdout;
    let log = &dom.stderr;
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    for i in 1..=plots {
        let id = format!("id=\"plot-{i:02}\"");
        let figure = dom_text
            .split("<figure ")
            .find(|f| f.starts_with(&id))
            .unwrap_or_else(|| panic!("plot {i} missing from the DOM"));
        assert!(figure.contains("<svg"), "plot {i} has no SVG");
        assert!(
            figure.contains("<polyline") || figure.contains("class=\"bar\""),
            "plot {i} draws nothing"
        );
    }

    // The table of contents links every test's section, and each target
    // exists.
    let toc = dom_text
        .split("<nav class=\"toc\"")
        .nth(1)
        .and_then(|t| t.split("</nav>").next())
        .expect("a table of contents in the DOM");
    let links: Vec<&str> = toc
        .split("href=\"#")
        .skip(1)
        .filter_map(|l| l.split('"').next())
        .collect();
    assert!(links.len() >= 10, "{links:?}");
    for id in &links {
        assert!(
            dom_text.contains(&format!("id=\"{id}\"")),
            "no target for #{id}"
        );
    }
    // Confidence bars on the points.
    let bars = dom_text.matches("class=\"errorbar\"").count();
    assert!(bars > 50, "{bars} error bars");
    // CPU of both ends beside the metric: a row of two figures, the second
    // the CPU panel with client and server series.
    let rows: Vec<&str> = dom_text.split("<div class=\"row\">").skip(1).collect();
    assert!(!rows.is_empty(), "no paired panels");
    let stream_row = rows
        .iter()
        .find(|r| r.contains("stream: CPU of both ends against size"))
        .expect("stream's CPU panel beside its bandwidth");
    let before_cpu = stream_row
        .split("stream: CPU of both ends against size")
        .next()
        .unwrap_or("");
    assert!(before_cpu.contains("stream: bandwidth (Gbit/s of payload) against size"));
    assert!(stream_row.contains(" client\"") && stream_row.contains(" server\""));

    // The figures' axes as the browser has them: the stream bandwidth plot
    // (shm at 400 Gbit/s beside tcp at a few) is log against log size; the
    // pio plot is against its shapes, with the path's payload limit drawn.
    let figure_of = |caption: &str| -> &str {
        dom_text
            .split("<figure ")
            .find(|f| f.contains(&format!(": {caption}</figcaption>")))
            .unwrap_or_else(|| panic!("no figure {caption:?} in the DOM"))
    };
    let stream = figure_of("stream: bandwidth (Gbit/s of payload) against size");
    assert!(
        stream.contains("data-x-scale=\"log\" data-y-scale=\"log\""),
        "stream bandwidth axes are not log/log"
    );
    let pio = figure_of("pio: bandwidth (Gbit/s of payload) against servers/clients");
    assert!(pio.contains("data-x-scale=\"category\""), "pio x axis");
    assert!(
        pio.contains(">1S/3C</text>") && pio.contains(">3S/1C</text>"),
        "pio shapes as categories"
    );
    let reference = pio
        .split("<g class=\"reference\"")
        .nth(1)
        .expect("the path's limit on the pio bandwidth plot");
    assert!(reference.contains("<line") && reference.contains("path limit"));
    // Web against file size and alpha, never the zipf points at "1K".
    figure_of("web: transactions per second against file size");
    let alpha = figure_of("web: transactions per second against alpha");
    assert!(alpha.contains(">0.6</text>") || alpha.contains(">0.8</text>"));

    let shot = dir.join("report.png");
    let _ = std::fs::remove_file(&shot);
    let s = run_chromium(
        &bin,
        &url,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,2400".to_string(),
            "--hide-scrollbars".to_string(),
        ],
    );
    assert!(s.success, "chromium --screenshot failed: {}", s.stderr);
    let png = std::fs::read(&shot).expect("screenshot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        png.len() > 10_000,
        "screenshot is blank-sized: {} bytes",
        png.len()
    );
    eprintln!("screenshot: {}", shot.display());
}
