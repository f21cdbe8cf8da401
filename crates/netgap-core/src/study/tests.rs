//! The study file's parsing and checks, end to end through [`Study::parse`].

use super::*;

const MINIMAL: &str = r#"
id = "009"
[citation]
authors = ["A. Author", "B. Author"]
title = "T"
venue = "V"
year = 2000
[method]
reps = 10
drop_each_side = 1
text = "10 runs"
[testbed]
hosts = 2
topology = "switch"
text = "two hosts"
[[figure]]
id = "1"
caption = "Latency"
tests = ["pingpong"]
x = "size"
y = "latency_us"
series = ["transport"]
hosts = 2
paper = "p"
here = "h"
[[claim]]
figure = "1"
text = "tcp below udp"
published = "x"
where = "Fig 1"
kind = "ratio"
a = { transport = "tcp" }
b = { transport = "udp" }
below = 1.0
"#;

#[test]
fn a_minimal_study_parses() {
    let s = Study::parse("min", MINIMAL).expect("parses");
    assert_eq!(s.figures[0].x, XAxis::Size);
    assert_eq!(s.citation.line(), "A. Author and B. Author. T. V, 2000.");
    assert!(matches!(
        s.claims[0].test,
        ClaimTest::Ratio {
            expect: Expect::Below(_),
            ..
        }
    ));
}

#[test]
fn a_published_size_is_read_with_its_tolerance_and_refused_when_incomplete_or_contrary() {
    let sized = MINIMAL.replace(
        "below = 1.0\n",
        "below = 1.0\npublished_value = 0.86\nsize_tolerance_pct = 10\nsize_why = \"read off a figure\"\n",
    );
    let s = Study::parse("x", &sized).expect("parses");
    let size = s.claims[0].size.as_ref().expect("a size");
    let (lo, hi) = size.band();
    assert!((lo - 0.774).abs() < 1e-9 && (hi - 0.946).abs() < 1e-9);
    assert!(Study::parse("x", MINIMAL).expect("parses").claims[0]
        .size
        .is_none());
    for (bad, needle) in [
        (
            sized.replace("size_why = \"read off a figure\"\n", ""),
            "together",
        ),
        (
            sized.replace("published_value = 0.86", "published_value = 1.5"),
            "contradicts the claim's direction",
        ),
        (
            sized.replace("size_tolerance_pct = 10", "size_tolerance_pct = 100"),
            "below 100",
        ),
        (
            sized.replace("published_value = 0.86", "published_value = -1"),
            "positive",
        ),
        (sized.replace("\"read off a figure\"", "\" \""), "size_why"),
    ] {
        let e = Study::parse("x", &bad).expect_err(needle);
        let line = e.to_string();
        assert!(line.contains(needle) && !line.contains('\n'), "{line}");
    }
}

/// MINIMAL with its claim's rule (from `kind` on) replaced by `rule`.
fn with_rule(rule: &str) -> String {
    let at = MINIMAL.find("kind = ").expect("a kind");
    format!("{}{rule}\n", &MINIMAL[..at])
}

#[test]
fn every_rule_kind_parses_with_its_keys() {
    type Case = (&'static str, fn(&ClaimTest) -> bool);
    let cases: [Case; 7] = [
        (
            "kind = \"ratio_change\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"smallest\"\nvs_at = \"largest\"\nabove = 1.0",
            |t: &ClaimTest| matches!(t, ClaimTest::RatioChange { at: At::Smallest, vs: At::Largest, .. }),
        ),
        (
            "kind = \"trends\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\ntolerance_pct = 20",
            |t: &ClaimTest| matches!(t, ClaimTest::Trends { expect: Expect::Between(..), .. }),
        ),
        (
            "kind = \"dropouts\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }",
            |t: &ClaimTest| matches!(t, ClaimTest::Dropouts { .. }),
        ),
        (
            "kind = \"knee\"\nseries = { transport = \"tcp\" }\nat = \"1K\"\nabove = 2.0",
            |t: &ClaimTest| matches!(t, ClaimTest::Knee { x, .. } if *x == 1024.0),
        ),
        (
            "kind = \"falls\"\nseries = { transport = \"tcp\" }\nabove = 0.5",
            |t: &ClaimTest| matches!(t, ClaimTest::Falls { metric: None, .. }),
        ),
        (
            "kind = \"falls\"\nseries = { transport = \"tcp\" }\nmetric = \"block_time_us\"\nabove = 0.5",
            |t: &ClaimTest| matches!(t, ClaimTest::Falls { metric: Some(m), .. } if *m == Quantity::BlockTime),
        ),
        (
            "kind = \"ratio\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"largest\"\nmetric = \"cpu.local.process_percent\"\nbelow = 1.0",
            |t: &ClaimTest| matches!(t, ClaimTest::Ratio { metric: Some(m), .. } if *m == Quantity::Cpu(CpuEnd::Local, CpuShare::Process)),
        ),
    ];
    for (rule, ok) in cases {
        let s = Study::parse("x", &with_rule(rule)).unwrap_or_else(|e| panic!("{rule}: {e}"));
        assert!(ok(&s.claims[0].test), "{rule}: {:?}", s.claims[0].test);
    }
}

#[test]
fn a_rule_with_a_key_its_kind_does_not_read_is_refused_in_one_line() {
    for (rule, needle) in [
        (
            "kind = \"trend\"\na = { transport = \"tcp\" }\nseries = { transport = \"tcp\" }\nabove = 1.0",
            "kind trend takes no a",
        ),
        (
            "kind = \"ratio_change\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nabove = 1.0",
            "needs vs_at",
        ),
        (
            "kind = \"ratio_change\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"peak\"\nvs_at = \"1K\"\nabove = 1.0",
            "smallest or largest",
        ),
        (
            "kind = \"knee\"\nseries = { transport = \"tcp\" }\nat = \"peak\"\nabove = 2.0",
            "x values",
        ),
        (
            "kind = \"dropouts\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nbelow = 0.5",
            "kind dropouts takes no below",
        ),
        (
            "kind = \"falls\"\nseries = { transport = \"tcp\" }\nabove = 0.5\npublished_value = 2.0\nsize_tolerance_pct = 10\nsize_why = \"w\"",
            "takes no published_value",
        ),
        ("kind = \"slope\"", "kind \"slope\": want ratio"),
        (
            "kind = \"value\"\nseries = { transport = \"tcp\" }\nat = \"largest\"\nmetric = \"connect_time\"\nabove = 1.0",
            "metric \"connect_time\" is no quantity",
        ),
        (
            "kind = \"falls\"\nseries = { transport = \"tcp\" }\nmetric = \"cpu.local.busy\"\nabove = 0.5",
            "metric \"cpu.local.busy\" is no quantity",
        ),
    ] {
        let e = Study::parse("x", &with_rule(rule)).expect_err(rule);
        let line = e.to_string();
        assert!(line.contains(needle) && !line.contains('\n'), "{rule}: {line}");
    }
}

/// MINIMAL whose figure names its transports, sizes and offloads.
fn declared() -> String {
    MINIMAL.replace(
        "tests = [\"pingpong\"]\n",
        "tests = [\"pingpong\"]\ntransports = [\"tcp\", \"udp\"]\nsizes = \"1,1K,64K\"\nconditions = [\"offload=on,off\"]\nflags = [\"--no-nodelay\", \"--sndbuf\", \"512K\"]\n",
    )
}

#[test]
fn a_claim_naming_a_value_or_x_its_figure_does_not_measure_is_refused_in_one_line() {
    let ok = Study::parse("x", &declared()).expect("parses");
    assert_eq!(
        ok.figures[0].values_of(Attr::Transport),
        Some(vec!["tcp".to_string(), "udp".to_string()])
    );
    let with = |rule: &str| {
        let text = declared();
        let at = text.find("kind = ").expect("a kind");
        format!("{}{rule}\n", &text[..at])
    };
    for (bad, needle) in [
        (
            declared().replace("b = { transport = \"udp\" }", "b = { transport = \"udpp\" }"),
            "b: transport \"udpp\" is not a value figure 1 measures (tcp, udp)",
        ),
        (
            with("kind = \"ratio\"\na = { offload = \"yes\" }\nb = { offload = \"off\" }\nabove = 1.0"),
            "offload \"yes\"",
        ),
        (
            with("kind = \"ratio\"\na = { options = \"quickack\" }\nb = { options = \"no_nodelay\" }\nabove = 1.0"),
            "options \"quickack\"",
        ),
        (
            with("kind = \"ratio\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"4K\"\nabove = 1.0"),
            "x = 4096 is not a point figure 1 measures",
        ),
        (
            with("kind = \"trend\"\nseries = { transport = \"tcp\" }\nfrom_x = \"1\"\nto_x = \"2K\"\nabove = 1.0"),
            "x = 2048",
        ),
    ] {
        let e = Study::parse("x", &bad).expect_err(needle);
        let line = e.to_string();
        assert!(line.contains(needle) && !line.contains('\n'), "{line}");
    }
    // What the figure declares is accepted: an option it sets, with
    // its value, and the defaults.
    for good in [
        "kind = \"ratio\"\na = { options = \"no_nodelay,sndbuf_bytes=524288\" }\nb = { options = \"defaults\" }\nat = \"64K\"\nabove = 1.0",
        "kind = \"trend\"\nseries = { offload = \"on\", transport = \"tcp\" }\nfrom_x = \"1\"\nto_x = \"1K\"\nabove = 1.0",
    ] {
        Study::parse("x", &with(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

#[test]
fn the_x_values_a_claim_reads_are_listed() {
    let s = Study::parse(
        "x",
        &with_rule("kind = \"trend\"\nseries = { transport = \"tcp\" }\nfrom_x = \"1\"\nto_x = \"2\"\nabove = 1.0"),
    )
    .expect("parses");
    assert_eq!(s.claims[0].x_values(), vec![1.0, 2.0]);
    assert!(Study::parse("x", MINIMAL).expect("parses").claims[0]
        .x_values()
        .is_empty());
}

/// A figure of rates (`rate=` conditions) and of links plotted against
/// size names them as series; a claim naming a link count keeps it in
/// a `--quick` run as it keeps an x it reads, and one naming a rate or
/// a link count the figure does not measure is refused.
#[test]
fn rates_and_link_counts_are_series_a_claim_can_name() {
    let text = MINIMAL
        .replace(
            "tests = [\"pingpong\"]\n",
            "tests = [\"multirail\"]\nsizes = \"1K,64K\"\nlinks = [1, 2, 3]\nconditions = [\"rate=10M,1G\"]\n",
        )
        .replace("series = [\"transport\"]", "series = [\"links\", \"rate\"]")
        .replace(
            "a = { transport = \"tcp\" }\nb = { transport = \"udp\" }",
            "a = { links = \"2\", rate = \"1G\" }\nb = { links = \"1\", rate = \"1G\" }",
        );
    let s = Study::parse("x", &text).expect("parses");
    let fig = &s.figures[0];
    assert_eq!(
        fig.values_of(Attr::Rate),
        Some(vec!["10M".to_string(), "1G".to_string()])
    );
    assert_eq!(
        fig.values_of(Attr::Links),
        Some(vec!["1".to_string(), "2".to_string(), "3".to_string()])
    );
    assert!(fig.claim_counts.contains(&2), "{:?}", fig.claim_counts);
    for (from, to, needle) in [
        (
            "links = \"2\", rate",
            "links = \"4\", rate",
            "links \"4\" is not a value",
        ),
        (
            "rate = \"1G\" }\nb",
            "rate = \"100M\" }\nb",
            "rate \"100M\" is not a value",
        ),
    ] {
        let e = Study::parse("x", &text.replace(from, to)).expect_err(needle);
        assert!(e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn a_figure_whose_y_is_no_quantity_is_refused_in_one_line() {
    let bad = MINIMAL.replacen("y = \"latency_us\"", "y = \"latency\"", 1);
    assert_ne!(bad, MINIMAL, "MINIMAL names its y");
    let e = Study::parse("x", &bad).expect_err("no unit").to_string();
    assert!(
        e.contains("y \"latency\" is no quantity") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn unknown_keys_and_dangling_claims_are_refused() {
    let extra = MINIMAL.replace("hosts = 2\npaper", "hosts = 2\ncolour = 1\npaper");
    let e = Study::parse("x", &extra).expect_err("unknown key");
    assert!(e.to_string().contains("colour"), "{e}");
    let dangling = MINIMAL.replace("figure = \"1\"\ntext", "figure = \"2\"\ntext");
    let e = Study::parse("x", &dangling).expect_err("dangling");
    assert!(e.to_string().contains("figure 2"), "{e}");
}

/// Each refusal is its own typed cause, under the study and the figure or
/// claim it names, so a caller can tell them apart without reading text.
#[test]
fn refusals_are_typed_by_cause() {
    let e = Study::parse("x", &with_rule("kind = \"ratio_change\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nabove = 1.0"))
        .expect_err("no vs_at");
    assert!(
        matches!(
            &e,
            StudyError::Invalid {
                what: InvalidStudy::Claim(c),
                ..
            } if matches!(c.cause, ClaimCause::NoVsAt)
        ),
        "{e:?}"
    );
    let e = Study::parse("x", &MINIMAL.replacen("x = \"size\"", "x = \"colour\"", 1))
        .expect_err("no such axis");
    assert!(
        matches!(
            &e,
            StudyError::Invalid {
                what: InvalidStudy::Figure(f),
                ..
            } if matches!(f.cause, FigureCause::XAxis(_))
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "study 009: figure 1: x-axis \"colour\": want one of size, clients, streams, links, \
         file_size, alpha, unit_bytes, hosts, shape, block_time"
    );
}
