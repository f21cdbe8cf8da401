//! `netgap import` on real output of iperf3, NPtcp and sockperf recorded on
//! loopback, and an OSU sample written to the benchmarks' documented format:
//! units converted, tool named, what the tool did not measure left empty,
//! malformed input rejected in one line naming file and line.

use crate::common;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn import(args: &[&str], file: &Path) -> Output {
    common::netgap()
        .arg("import")
        .args(args)
        .arg(file)
        .output()
        .expect("runs")
}

fn records(format: &str, name: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![format];
    args.extend_from_slice(extra);
    let o = import(&args, &fixture(name));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record per line"))
        .collect()
}

/// Fields no peer tool measures here must be empty, not invented.
fn assert_unmeasured_empty(r: &Value) {
    for key in [
        "host",
        "peer_host",
        "options",
        "cpu",
        "bytes",
        "iterations_per_rep",
    ] {
        assert!(r[key].is_null(), "{key} should be empty in {r}");
    }
    // Every imported record parses as a netgap record.
    let _: netgap::record::ResultRecord = serde_json::from_value(r.clone()).expect("a record");
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn iperf3_json_gives_receiver_throughput_with_intervals_as_repetitions() {
    let raw: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("import/iperf3-tcp.json")).expect("fixture"),
    )
    .expect("iperf3 JSON");
    let recs = records("iperf3", "import/iperf3-tcp.json", &[]);
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r["tool"], "iperf3");
    assert_eq!(r["test"], "stream");
    assert_eq!(r["transport"], "tcp");
    assert_eq!(r["metric"], "bandwidth_gbps");
    assert_eq!(r["size_bytes"], raw["start"]["test_start"]["blksize"]);
    let bps = raw["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap();
    assert!(close(r["value"].as_f64().unwrap(), bps / 1e9));
    let intervals = raw["intervals"].as_array().unwrap().len();
    let reps = r["stats"]["reps"].as_array().unwrap();
    assert!(reps.len() >= intervals - 1 && reps.len() <= intervals);
    assert_unmeasured_empty(r);
    let udp = records("iperf3", "import/iperf3-udp.json", &[]);
    assert_eq!(udp[0]["transport"], "udp");
    assert_eq!(udp[0]["size_bytes"], 1400);
}

#[test]
fn netpipe_lines_give_one_way_latency_and_payload_bandwidth() {
    let text = std::fs::read_to_string(fixture("import/nptcp.out")).expect("fixture");
    let lines: Vec<Vec<f64>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(|f| f.parse().unwrap()).collect())
        .collect();
    let recs = records("netpipe", "import/nptcp.out", &[]);
    assert_eq!(recs.len(), 2 * lines.len());
    for (pair, line) in recs.chunks(2).zip(&lines) {
        let (size, seconds) = (line[0], line[2]);
        assert_eq!(pair[0]["metric"], "latency_us");
        assert!(close(pair[0]["value"].as_f64().unwrap(), seconds * 1e6));
        assert_eq!(pair[1]["metric"], "bandwidth_gbps");
        assert!(close(
            pair[1]["value"].as_f64().unwrap(),
            size * 8.0 / seconds / 1e9
        ));
        for r in pair {
            assert_eq!(r["tool"], "NPtcp");
            assert_eq!(r["size_bytes"].as_f64().unwrap(), size);
            assert!(r["stats"].is_null(), "NetPIPE reports no repetitions");
            assert_unmeasured_empty(r);
        }
    }
}

#[test]
fn sockperf_ping_pong_needs_the_size_and_keeps_percentiles() {
    let o = import(&["sockperf"], &fixture("import/sockperf-pingpong.txt"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("sockperf-pingpong.txt") && err.contains("--size"),
        "{err}"
    );

    let recs = records(
        "sockperf",
        "import/sockperf-pingpong.txt",
        &["--size", "64"],
    );
    let r = &recs[0];
    assert_eq!(
        (r["tool"].as_str(), r["test"].as_str()),
        (Some("sockperf"), Some("pingpong"))
    );
    assert_eq!(r["size_bytes"], 64);
    assert_eq!(r["transport"], "tcp");
    assert!(close(r["value"].as_f64().unwrap(), 8.295));
    let p = &r["percentiles"];
    assert!(close(p["p50"].as_f64().unwrap(), 8.121));
    assert!(close(p["p999"].as_f64().unwrap(), 25.317));
    assert!(close(p["max"].as_f64().unwrap(), 1806.735));
    assert_unmeasured_empty(r);

    let t = &records("sockperf", "import/sockperf-throughput.txt", &[])[0];
    assert_eq!(t["test"], "stream");
    assert_eq!(t["size_bytes"], 1400);
    assert!(close(t["value"].as_f64().unwrap(), 5.390009));
}

#[test]
fn osu_latency_and_bandwidth_in_netgap_units() {
    let lat = records("osu", "import/osu_latency.txt", &[]);
    assert_eq!(lat.len(), 23);
    assert_eq!(lat[0]["tool"], "osu_latency");
    assert_eq!(lat[0]["metric"], "latency_us");
    assert!(close(lat[22]["value"].as_f64().unwrap(), 457.81));
    let bw = records("osu", "import/osu_bw.txt", &[]);
    assert_eq!(bw[22]["size_bytes"], 4194304);
    // 12185.03 MB/s (10^6 bytes) is 97.48024 Gbit/s.
    assert!(close(bw[22]["value"].as_f64().unwrap(), 97.48024));
    assert_eq!(bw[22]["test"], "stream");
    assert_unmeasured_empty(&bw[0]);
}

#[test]
fn malformed_files_give_one_line_naming_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let truncated = dir.path().join("cut.json");
    let full = std::fs::read_to_string(fixture("import/iperf3-tcp.json")).expect("fixture");
    std::fs::write(&truncated, &full[..full.len() / 2]).expect("write");
    let osu = dir.path().join("osu.txt");
    std::fs::write(
        &osu,
        "# OSU MPI Latency Test v7.3\n# Size Latency (us)\n1 0.2\n2 fast\n",
    )
    .expect("write");
    for (format, file, wanted) in [
        (
            "netpipe",
            fixture("import-malformed/nptcp-bad.out"),
            "nptcp-bad.out:2:",
        ),
        ("iperf3", truncated.clone(), "cut.json:"),
        ("osu", osu.clone(), "osu.txt:4:"),
        ("sockperf", fixture("import/osu_bw.txt"), "osu_bw.txt:"),
        ("iperf3", dir.path().join("missing.json"), "missing.json"),
    ] {
        let o = import(&[format], &file);
        assert_eq!(o.status.code(), Some(1), "{format} {}", file.display());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(wanted), "{err} should name {wanted}");
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn imported_records_plot_beside_netgaps_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("peers.jsonl");
    for (format, name) in [
        ("netpipe", "import/nptcp.out"),
        ("iperf3", "import/iperf3-tcp.json"),
    ] {
        let o = common::netgap()
            .args(["import", format])
            .arg(fixture(name))
            .arg("-o")
            .arg(&out)
            .output()
            .expect("runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let html = dir.path().join("r.html");
    let o = common::netgap()
        .args(["report", "-o"])
        .arg(&html)
        .arg(fixture("report/p2p.jsonl"))
        .arg(&out)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).expect("page");
    // NetPIPE's latency series sits in the same plot as netgap's tcp and unix.
    let plot = page
        .split("<figure")
        .find(|f| f.contains("pingpong: latency (µs, one-way) against size"))
        .expect("pingpong latency plot");
    for series in [
        "data-name=\"tcp [NPtcp]",
        "data-name=\"tcp, ",
        "data-name=\"unix, ",
    ] {
        assert!(plot.contains(series), "{series} missing");
    }
    // iperf3's throughput sits beside netgap's stream.
    let plot = page
        .split("<figure")
        .find(|f| f.contains("stream: bandwidth (Gbit/s of payload) against size"))
        .expect("stream bandwidth plot");
    assert!(plot.contains("[iperf3]"), "iperf3 missing beside stream");
    assert!(page.contains("NPtcp (imported by netgap"));
}

/// Every format reads only a regular file of at most 256 MiB: a device
/// (`/dev/zero`, endless), a FIFO with no writer (would block forever) and
/// a file past the cap are refused at once in one line naming the file.
#[test]
fn devices_fifos_and_oversize_files_are_refused_at_once() {
    use common::files::{mkfifo, one_error_line, output_within, sparse};
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("tool.fifo");
    mkfifo(&fifo);
    let big = dir.path().join("big.out");
    sparse(&big, (256 << 20) + 1);
    let cases = [
        (
            PathBuf::from("/dev/zero"),
            "/dev/zero is a character device, not a regular file".to_string(),
        ),
        (
            fifo.clone(),
            format!("{} is a FIFO, not a regular file", fifo.display()),
        ),
        (
            big.clone(),
            format!(
                "{} holds 268435457 bytes, more than the 256M (268435456 bytes)",
                big.display()
            ),
        ),
    ];
    for format in ["iperf3", "netpipe", "sockperf", "osu"] {
        for (file, wanted) in &cases {
            let out = output_within(
                common::netgap().args(["import", format]).arg(file),
                std::time::Duration::from_secs(30),
            );
            let err = one_error_line(&out);
            assert!(err.contains(wanted.as_str()), "{format}: {err}");
            assert!(out.stdout.is_empty());
        }
    }
}

#[test]
fn import_help_names_every_format_of_the_registry_with_what_it_reads() {
    let short = common::ok(
        common::netgap()
            .args(["import", "-h"])
            .output()
            .expect("help"),
    );
    let long = common::ok(
        common::netgap()
            .args(["import", "--help"])
            .output()
            .expect("help"),
    );
    for i in netgap::import::registry() {
        assert!(
            short.contains(i.name()),
            "import -h leaves out {}: {short}",
            i.name()
        );
        let line = long
            .lines()
            .find(|l| l.trim_start().starts_with(i.name()))
            .unwrap_or_else(|| panic!("import --help leaves out {}: {long}", i.name()));
        // clap wraps long lines: the summary's first words are on the name's line.
        let first_words: String = i.summary().split(' ').take(2).collect::<Vec<_>>().join(" ");
        assert!(
            line.contains(&first_words),
            "{line:?} lacks {first_words:?}"
        );
    }
}

/// Two imports of the same NPtcp output under two `--label`s are two
/// series of the report, with every record kept; an empty label is refused
/// in one line.
#[test]
fn two_labelled_imports_are_two_series() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("peers.jsonl");
    for label in ["kernel A", "kernel B"] {
        let o = common::netgap()
            .args(["import", "netpipe", "--label", label])
            .arg(fixture("import/nptcp.out"))
            .arg("-o")
            .arg(&out)
            .output()
            .expect("runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let lines = std::fs::read_to_string(&out).expect("records");
    let labels: Vec<String> = lines
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("json");
            v["stack"]["label"].as_str().unwrap_or("").to_string()
        })
        .collect();
    let n = labels.len();
    assert_eq!(labels.iter().filter(|l| *l == "kernel A").count(), n / 2);
    assert_eq!(labels.iter().filter(|l| *l == "kernel B").count(), n / 2);
    let recs = netgap::report::load::load_files(std::slice::from_ref(&out)).expect("loads");
    let report =
        netgap::report::Report::build(&[out], &recs, &netgap::report::ReportOptions::default());
    assert!(
        !report
            .warnings
            .iter()
            .any(|w| w.text.starts_with("The same point")),
        "no record set aside: {:?}",
        report.warnings
    );
    let latency = report
        .plots()
        .find(|p| p.title() == "pingpong: latency (µs, one-way) against size")
        .expect("latency plot");
    let netgap::report::svg::Plot::Line(latency) = latency else {
        panic!("a line plot")
    };
    let names: Vec<&str> = latency.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["tcp [NPtcp], [kernel A]", "tcp [NPtcp], [kernel B]"]
    );
    let o = import(&["netpipe", "--label", " "], &fixture("import/nptcp.out"));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("empty label"), "{err}");
}
