//! Results files as every netgap version wrote them load into
//! `ResultRecord` and render in the report: one file per generation of the
//! record's layout (`tests/data/generations/`, numbered in the order the
//! layout changed), and one of the hand edits the report has always read
//! leniently. The last generation's lines are this netgap's own output and
//! must come back byte for byte.

use netgap_core::diagnose::diagnose;
use netgap_core::record::ResultRecord;
use netgap_report::load::{load_file, Loaded};
use netgap_report::{html, Report, ReportOptions};
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/generations")
        .join(name)
}

/// Loads `name`, checks it has `records` records and renders its report,
/// whose page names every test of the file.
fn loads_and_renders(name: &str, records: usize) -> Vec<Loaded> {
    let path = data(name);
    let loaded = load_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(loaded.len(), records, "{name}");
    let report = Report::build(&[path], &loaded, &ReportOptions::default());
    assert_eq!(report.records, records, "{name}");
    let page = html::render(&report);
    for l in &loaded {
        assert!(page.contains(&l.section()), "{name}: no {}", l.section());
    }
    loaded
}

#[test]
fn the_first_records_keep_their_socket_options() {
    let recs = loads_and_renders("1-first-records.jsonl", 2);
    for l in &recs {
        let o = l.record.options.as_ref().expect("options");
        assert!(!o.transport.nodelay, "{o:?}");
        assert_eq!(o.transport.sndbuf_bytes, Some(262144));
        assert!(!o.verify);
        assert!(l.record.datagrams.is_none());
        assert_eq!(l.reps().len(), 5);
        assert!(l.ci95().is_some());
    }
    // Their stack, derived from the options, says nodelay was off.
    assert!(
        recs[0].stack.options.iter().any(|o| o.contains("nodelay")),
        "{:?}",
        recs[0].stack
    );
}

#[test]
fn transport_options_and_datagram_counters_load() {
    let recs = loads_and_renders("2-transport-options-and-datagrams.jsonl", 3);
    let udp = &recs[2].record;
    let d = udp.datagrams.expect("datagrams");
    assert_eq!((d.client.lost, d.client.dropped), (10, 0));
    assert!(recs
        .iter()
        .all(|l| l.record.options.as_ref().is_some_and(|o| o.verify)));
}

#[test]
fn imported_records_without_sections_load() {
    let recs = loads_and_renders("3-optional-sections-and-imports.jsonl", 3);
    assert_eq!(recs[1].record.tool(), Some("iperf3"));
    assert!(recs[1].record.stats.is_none() && recs[1].record.host.is_none());
    assert_eq!(recs[1].ci95(), None);
    assert_eq!(recs[2].record.tool(), Some("NPtcp"));
    assert_eq!(recs[2].section(), "pingpong");
}

#[test]
fn sweep_ci_and_workload_fields_load_into_their_sections() {
    let recs = loads_and_renders("4-sweep-ci-and-workload-fields.jsonl", 8);
    assert_eq!(recs[0].section(), "sweep (stream)");
    let dropout = recs[2].record.dropout().expect("dropout");
    assert_eq!(dropout.reference_size_bytes, 2048);
    assert!(recs[0].record.dropout().is_none());
    let ci = recs[4].record.ci_target.expect("ci target");
    assert!(!ci.met);
    // One repetition: no interval, whatever the record says.
    assert_eq!(recs[5].ci95(), None);
    assert_eq!(recs[6].record.clients(), Some(2));
    assert_eq!(recs[6].record.hosts_cpu().len(), 2);
    let w = recs[7].record.workload.as_ref().expect("workload");
    assert_eq!((w.links.len(), w.flows.len()), (2, 2));
}

#[test]
fn stacks_interleaving_and_applications_load() {
    let recs = loads_and_renders("5-stack-interleaving-and-applications.jsonl", 5);
    for l in &recs[..3] {
        assert_eq!(l.record.interleaved_group(), Some("20261122T200000-4242-0"));
        assert_eq!(
            l.record
                .options
                .as_ref()
                .and_then(|o| o.interleaved.as_ref())
                .and_then(|i| i.with),
            Some(3)
        );
    }
    assert_ne!(recs[0].stack, recs[1].stack);
    let app = recs[3]
        .record
        .workload
        .as_ref()
        .and_then(|w| w.app.as_ref());
    assert_eq!(app.map(|a| a.services.len()), Some(1));
    assert_eq!(recs[3].stack.label.as_deref(), Some("web-zipf"));
    assert!(recs[4].variant.contains(&"bidir".to_string()));
}

/// `written` is `line`, byte for byte, but for the last digit of a number
/// that serde_json's default float parser read one unit in the last place
/// off (it is not exact on every input; the writer then prints the value
/// it was given).
fn assert_same_text(written: &str, line: &str) {
    fn tokens(s: &str) -> Vec<(bool, &str)> {
        let is_num = |c: char| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E');
        let mut out = Vec::new();
        let mut start = 0;
        let mut in_string = false;
        let mut prev_num = false;
        for (i, c) in s.char_indices() {
            if c == '"' {
                in_string = !in_string;
            }
            let num = !in_string && c != '"' && is_num(c);
            if i > 0 && num != prev_num {
                out.push((prev_num, &s[start..i]));
                start = i;
            }
            prev_num = num;
        }
        out.push((prev_num, &s[start..]));
        out
    }
    let (a, b) = (tokens(written), tokens(line));
    assert_eq!(a.len(), b.len(), "{written}\n{line}");
    for ((num_a, x), (_, y)) in a.iter().zip(&b) {
        if *num_a && x != y {
            let (x, y): (f64, f64) = (x.parse().expect("a number"), y.parse().expect("a number"));
            assert!((x - y).abs() <= 2.0 * f64::EPSILON * y.abs(), "{x} != {y}");
        } else {
            assert_eq!(x, y, "{written}\n{line}");
        }
    }
}

/// Records written before stacks carried their framing read it from their
/// transport's name, and judging them again gives the physics they hold.
#[test]
fn stacks_without_their_framing_are_judged_as_when_written() {
    let recs = loads_and_renders("6-physics-and-cpu-load.jsonl", 2);
    let text = std::fs::read_to_string(data("6-physics-and-cpu-load.jsonl")).expect("reads");
    for (line, l) in text.lines().zip(&recs) {
        assert!(!line.contains("\"framing\""));
        assert_eq!(l.stack.framing, Some(netgap_core::framing::Framing::Tcp));
        let read: ResultRecord = serde_json::from_str(line).expect("reads");
        let mut again = read.clone();
        diagnose(&mut again);
        assert_eq!(again.physics, read.physics);
        assert!(read.physics.is_some());
    }
}

/// This netgap's own records come back byte for byte, and judging them
/// again changes nothing: what a run writes is fixed by its measurements.
#[test]
fn records_of_this_version_come_back_byte_for_byte() {
    let recs = loads_and_renders("7-stack-framing.jsonl", 2);
    let text = std::fs::read_to_string(data("7-stack-framing.jsonl")).expect("reads");
    for (line, l) in text.lines().zip(&recs) {
        let written = serde_json::to_string(&l.record).expect("writes");
        assert_same_text(&written, line);
        let read: ResultRecord = serde_json::from_str(line).expect("reads");
        let mut again = read.clone();
        diagnose(&mut again);
        assert_eq!(again, read);
        assert!(l.record.cpu_load.is_some() && l.record.physics.is_some());
    }
}

/// Hand edits the report has always accepted: a top-level interleaving
/// group, a group size, dropout, confidence target or statistics of
/// another shape. The field reads as absent; the record loads.
#[test]
fn hand_edited_fields_of_another_shape_read_as_absent() {
    let recs = loads_and_renders("hand-edited.jsonl", 5);
    assert_eq!(recs[0].record.interleaved_group(), Some("by-hand"));
    assert_eq!(
        recs[0].record.interleaved.as_ref().and_then(|i| i.with),
        None
    );
    assert_eq!(
        recs[1].record.interleaved.as_ref().and_then(|i| i.with),
        Some(2)
    );
    assert_eq!(recs[2].section(), "sweep (stream)");
    assert!(recs[2].record.dropout().is_none() && recs[2].record.ci_target.is_none());
    assert!(recs[3].record.stats.is_none());
    assert_eq!(recs[4].record.interleaved_group(), Some("g"));
}
