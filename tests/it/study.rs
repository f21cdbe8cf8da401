//! `netgap study`: every study file parses into figures of netgap's own
//! tests and claims of its own figures; bad input is refused in one line
//! before anything runs; and a study measured on the testbed it builds
//! (root) yields a report with every figure's section and claim table,
//! and leaves no testbed behind.

use crate::common;
use crate::common::{netgap, ok, read_records, system_ready};
use netgap::study;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// No namespace of a study's testbed is left.
fn assert_study_testbed_gone() {
    let list = ok(Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns"));
    assert!(
        !list.contains("ngtb-study-"),
        "the study's testbed is down: {list}"
    );
}

/// The report's section of figure `id`.
#[cfg(feature = "xdp")]
fn figure_section<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!("<h3>Figure {id}: "))
        .unwrap_or_else(|| panic!("figure {id}'s section"));
    let section = &html[at..];
    &section[..section.find("</section>").expect("section ends")]
}

/// `netgap study 000 --figures FIGURES --quick --budget BUDGET -o DIR`
/// (the preload library named): its output, records and report.
#[cfg(feature = "xdp")]
fn study_000_quick(
    figures: &str,
    budget: &str,
    dir: &std::path::Path,
) -> (String, Vec<serde_json::Value>, String) {
    let out = ok(netgap()
        .args([
            "study",
            "000",
            "--figures",
            figures,
            "--quick",
            "--budget",
            budget,
            "-o",
        ])
        .arg(dir)
        .env("NETGAP_PRELOAD", common::preload_library())
        .output()
        .expect("netgap study"));
    let records = read_records(&dir.join("netgap-study-000.jsonl"));
    let html = std::fs::read_to_string(dir.join("netgap-study-000.html")).expect("report");
    (out, records, html)
}

#[test]
fn every_study_file_parses_into_known_tests_and_claims_of_its_figures() {
    let studies = study::all().expect("every study file is valid");
    assert_eq!(
        studies.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        study::ids()
    );
    for s in &studies {
        assert!(!s.citation.authors.is_empty() && !s.citation.venue.is_empty());
        assert_eq!(s.method.reps, 10, "study {}: the paper's 10 runs", s.id);
        assert!(!s.claims.is_empty(), "study {} has claims", s.id);
        for c in &s.claims {
            for f in c.from.iter().chain([&c.figure]) {
                assert!(s.figure(f).is_some(), "study {} claim {:?}", s.id, c.text);
            }
        }
        for f in &s.figures {
            assert!(!f.caption.is_empty() && f.hosts <= s.testbed.hosts);
            // Every test is netgap's (load checks it; so does this).
            for t in &f.tests {
                assert!(
                    netgap::bench::find(t).is_some()
                        || netgap::workload::find(t).is_some()
                        || netgap::mpi::MpiTest::by_name(t).is_some(),
                    "study {} figure {}: {t}",
                    s.id,
                    f.id
                );
            }
        }
    }
}

/// A study file whose claim names a series value, an x, a figure or a
/// rule kind that does not exist is refused in one line when it is read,
/// before anything runs: each planted in study 004's own text.
#[test]
fn a_claim_naming_what_its_study_does_not_have_is_refused_in_one_line() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("studies/004.toml");
    let text = std::fs::read_to_string(&file).expect("studies/004.toml");
    study::data::Study::parse("004.toml", &text).expect("the file as it is parses");
    for (from, to, needle) in [
        (
            "b = { transport = \"xdp\" }",
            "b = { transport = \"xpd\" }",
            "b: transport \"xpd\" is not a value figure 2 measures (tcp, xdp)",
        ),
        (
            "a = { test = \"bibw\", transport = \"xdp\" }",
            "a = { test = \"bibw-pp\", transport = \"xdp\" }",
            "test \"bibw-pp\" is not a value figure 3 measures",
        ),
        (
            "a = { links = \"2\", transport = \"xdp\" }",
            "a = { links = \"4\", transport = \"xdp\" }",
            "a: links \"4\" is not a value figure 5 measures (1, 2, 3)",
        ),
        (
            "at = \"largest\"\nabove = 1.0\npublished_value = 2.0",
            "at = \"2K\"\nabove = 1.0\npublished_value = 2.0",
            "x = 2048 is not a point figure 5 measures",
        ),
        (
            "series = { metric = \"recv_overhead_us\", transport = \"xdp\" }\nat = \"1K\"",
            "series = { metric = \"recv_overhead_us\", transport = \"xdp\" }\nat = \"2K\"",
            "x = 2048 is not a point figure 4 measures",
        ),
        (
            "kind = \"knee\"",
            "kind = \"elbow\"",
            "kind \"elbow\": want ratio",
        ),
        (
            "figure = \"5\"\ntext = \"The aggregated bandwidth of two",
            "figure = \"6\"\ntext = \"The aggregated bandwidth of two",
            "which the study does not have",
        ),
        (
            "at = \"largest\"\nbelow = 3.0",
            "at = \"largest\"\nvs_at = \"smallest\"\nbelow = 3.0",
            "a claim of kind ratio takes no vs_at",
        ),
    ] {
        assert!(text.contains(from), "004.toml has {from:?}");
        let e =
            study::data::Study::parse("004.toml", &text.replacen(from, to, 1)).expect_err(needle);
        let line = e.to_string();
        assert!(line.contains(needle), "{line}");
        assert!(!line.contains('\n'), "one line: {line}");
    }
}

#[test]
fn the_budget_is_spread_into_repetitions_and_a_too_small_one_refused() {
    let s = study::load("004").expect("004");
    let figs: Vec<_> = s.figures.iter().collect();
    let to = study::Destination {
        hosts: netgap::cluster::HostsArg::parse("@testbed").expect("hosts"),
        key_file: None,
        json: "netgap-study-004.jsonl".into(),
    };
    let runs = study::plan(&s, &figs, Duration::from_secs(3600), false, &to).expect("plan");
    assert_eq!(runs.len(), s.figures.len());
    for r in &runs {
        assert_eq!(
            r.reps, 10,
            "a large budget keeps the study's 10 repetitions"
        );
        for run in &r.runs {
            assert_eq!(run.reps, r.reps);
            let argv = run.argv();
            let reps = ["--reps", "--trials"].map(|flag| {
                argv.windows(2)
                    .any(|w| w[0] == flag && w[1] == r.reps.to_string())
            });
            assert!(reps.contains(&true), "{argv:?}");
        }
    }
    let small = study::plan(&s, &figs, Duration::from_millis(100), true, &to)
        .expect_err("100ms cannot hold a repetition of every point");
    assert!(small.to_string().contains("too small"), "{small}");
}

/// A study reads its results file back as typed records and judges them
/// as JSON again: every kind of record a study writes (point-to-point,
/// sweep, LogP, a workload's) is, read typed and written again, the line
/// it was written as, so nothing a claim reads is lost on the way.
#[test]
fn a_record_read_back_typed_is_the_json_it_was_written_as() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let j = json.to_str().expect("utf-8");
    for args in [
        "run pingpong,stream -t tcp,unix -s 1,1K --reps 3 --rep-time 5ms",
        "sweep --start 1 --end 64 --trials 3 --trial-time 5ms",
        "logp -s 1 --reps 3 --rep-time 5ms",
        "run multistream -P 1,2 --reps 3 --duration 300ms",
    ] {
        common::run_ok(netgap().args(args.split(' ')).args(["--json", j]));
    }
    let text = std::fs::read_to_string(&json).expect("results");
    assert!(text.lines().count() >= 4, "{text}");
    for line in text.lines() {
        let written: serde_json::Value = serde_json::from_str(line).expect("json");
        let typed: netgap::record::ResultRecord = serde_json::from_str(line).expect("a record");
        assert_eq!(
            serde_json::to_value(&typed).expect("writes"),
            written,
            "{line}"
        );
    }
}

#[test]
fn bad_input_is_refused_in_one_line_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().to_str().expect("utf-8");
    common::fails_with_one_line(&["study", "009", "-o", out], "no study \"009\"");
    common::fails_with_one_line(
        &["study", "000", "--figures", "99", "-o", out],
        "study 000 has no figure 99",
    );
    common::fails_with_one_line(
        &["study", "all", "--figures", "3a", "-o", out],
        "--figures picks figures of one study",
    );
    // One host can make no figure: every figure needs two.
    let hosts = dir.path().join("one.json");
    std::fs::write(
        &hosts,
        r#"{"version":1,"topology":"list","hosts":[{"name":"a","control":"127.0.0.1:7100","address":"127.0.0.1"}]}"#,
    )
    .expect("hosts file");
    let at = format!("@{}", hosts.display());
    common::fails_with_one_line(
        &["study", "004", "--hosts", &at, "-o", out],
        "these hosts can make no figure of study 004",
    );
    // Two plain hosts (no namespaces) make point-to-point figures too
    // (both roles on their agents, the key passed to every run), but no
    // figure that switches link conditions: one line says why.
    let two = dir.path().join("two.json");
    std::fs::write(
        &two,
        r#"{"version":1,"topology":"list","hosts":[{"name":"a","control":"127.0.0.1:7100","address":"127.0.0.1"},{"name":"b","control":"127.0.0.1:7101","address":"127.0.0.1"}]}"#,
    )
    .expect("hosts file");
    let plan = ok(netgap()
        .args(["study", "003", "--quick", "--plan", "--hosts"])
        .arg(format!("@{}", two.display()))
        .args(["--key", "/etc/netgap/key", "-o", out])
        .output()
        .expect("study --plan"));
    assert!(
        plan.contains("figure 1: skipped: switches link conditions (rate=10M,100M,1G), which needs root and testbed hosts"),
        "{plan}"
    );
    assert!(
        plan.contains("  figure 2: ") && !plan.contains("figure 2: skipped"),
        "{plan}"
    );
    assert!(plan.contains("--key /etc/netgap/key"), "{plan}");
    if system_ready("study::bad_input (budget)") {
        common::fails_with_one_line(
            &["study", "004", "--budget", "100ms", "-o", out],
            "--budget 100ms: too small",
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        2,
        "nothing was written but the hosts files"
    );
}

/// `netgap study ID --quick --plan -o OUT` (OUT missing): it succeeds, and
/// for each study of `ids` it states the budget `--quick` derives and
/// lists every figure, planned (points, repetitions, their time and a
/// command line) or skipped with why; OUT is not made. Its output.
fn quick_plan_lists_every_figure(id: &str, ids: &[&str], out: &Path) -> String {
    let text = ok(netgap()
        .args(["study", id, "--quick", "--plan", "-o"])
        .arg(out)
        .output()
        .expect("netgap study --plan"));
    assert!(!out.exists(), "study {id} --plan made {}", out.display());
    // A study's section runs from its "study ID: " line to the next.
    let mut sections: Vec<String> = Vec::new();
    for line in text.lines() {
        match sections.last_mut() {
            Some(s) if line.starts_with(' ') => {
                s.push_str(line);
                s.push('\n');
            }
            _ if line.starts_with("study ") => sections.push(format!("{line}\n")),
            _ => {}
        }
    }
    assert_eq!(sections.len(), ids.len(), "{text}");
    for (sid, section) in ids.iter().zip(&sections) {
        let s = study::load(sid).expect("study");
        assert!(section.starts_with(&format!("study {sid}: ")), "{section}");
        assert!(
            section.contains("  budget: ") && section.contains("(--quick: the least its "),
            "study {sid}: the derived budget: {section}"
        );
        for f in &s.figures {
            let head = format!("  figure {}: ", f.id);
            let line = section
                .lines()
                .find(|l| l.starts_with(&head))
                .unwrap_or_else(|| panic!("study {sid} figure {}: {section}", f.id));
            let rest = &line[head.len()..];
            if let Some(why) = rest.strip_prefix("skipped: ") {
                assert!(!why.trim().is_empty(), "{line}");
            } else {
                assert!(
                    rest.contains(" repetitions of ") && rest.contains(" ms (the paper"),
                    "{line}"
                );
                let label = netgap::report::study::figure_label(sid, &f.id);
                assert!(section.contains(&format!("--label '{label}'")), "{section}");
            }
        }
    }
    text
}

/// The bug: `netgap study 000 --quick`, the command the main job names
/// next, stopped at once ("--budget 2m 30s: too small ..."), as did `all`.
/// Under `--quick` each study's budget now comes from its own points, so
/// every study plans, in every build: CI runs this with `--features
/// mpi,xdp` too, where more stacks make more points. The plans write
/// nothing.
#[test]
fn plan_of_every_study_under_quick_lists_every_figure_and_writes_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let all = quick_plan_lists_every_figure("all", &study::ids(), &t.path().join("all"));
    assert!(
        all.lines()
            .last()
            .is_some_and(|l| l.starts_with("all: about ")),
        "{all}"
    );
    for id in study::ids() {
        quick_plan_lists_every_figure(id, &[id], &t.path().join(id));
    }
    // A budget given stands, and one too small is still refused.
    common::fails_with_one_line(
        &["study", "000", "--quick", "--plan", "--budget", "2m30s"],
        "--budget 2m 30s: too small for 3 repetitions of every point of study 000; give at least",
    );
    assert!(names_in(t.path()).is_empty(), "nothing was written");
}

/// `--plan` runs nothing: it needs no root (as root, it plans while the
/// study's testbed is held by another and builds none), and writes
/// nothing in its `-o` directory, even one only root may enter.
#[test]
fn plan_needs_no_root_and_builds_no_testbed() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("out");
    std::fs::create_dir(&out).expect("out");
    let plan = |cmd: &mut Command| {
        let text = ok(cmd
            .args(["study", "004", "--plan", "-o"])
            .arg(&out)
            .output()
            .expect("netgap study --plan"));
        assert!(text.contains("  figure 5: "), "{text}");
        assert!(names_in(&out).is_empty(), "--plan wrote nothing in -o");
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        plan(&mut netgap());
        return;
    }
    // The study testbed's lock held here: a plan that built the testbed
    // would be refused, and no other process builds it meanwhile.
    let _one = one_testbed_at_a_time();
    let lock = hold_the_study_lock("the --plan test");
    assert_study_testbed_gone();
    plan(&mut netgap());
    // As nobody, where the binary is within nobody's reach.
    let mut as_nobody = netgap();
    {
        use std::os::unix::process::CommandExt;
        as_nobody.uid(65534).gid(65534);
    }
    match as_nobody
        .args(["study", "004", "--plan", "-o"])
        .arg(&out)
        .output()
    {
        Ok(o) => {
            let text = ok(o);
            assert!(text.contains("  figure 5: "), "{text}");
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!("not run as nobody: the binary is out of its reach ({e})");
        }
        Err(e) => panic!("netgap study --plan as nobody: {e}"),
    }
    assert!(names_in(&out).is_empty(), "--plan wrote nothing in -o");
    assert_study_testbed_gone();
    let held = lock_file_id();
    drop(lock);
    assert_lock_file_gone(held);
}

/// The study testbed's lock file.
const STUDY_LOCK: &str = "/run/netgap/study.lock";

/// The device and inode of the study's lock file, which this process
/// holds.
fn lock_file_id() -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(STUDY_LOCK).expect("the held lock file");
    (m.dev(), m.ino())
}

/// The bug: CI's study steps left an empty `/run/netgap/study.lock`
/// behind. The lock file `held` (device and inode) that was just let go,
/// with no study testbed built, is gone: the name is free, or names the
/// file of a holder that came since.
fn assert_lock_file_gone(held: (u64, u64)) {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(STUDY_LOCK) {
        Ok(m) => assert_ne!((m.dev(), m.ino()), held, "{STUDY_LOCK} was left behind"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}"),
    }
}

/// Waits until this process holds the study testbed's lock, so that no
/// study runs meanwhile.
fn hold_the_study_lock(why: &str) -> netgap::testbed::TestbedLock {
    let t0 = Instant::now();
    loop {
        match netgap::testbed::TestbedLock::acquire("study", why) {
            Ok(l) => return l,
            Err(e) if t0.elapsed() > Duration::from_secs(300) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

/// A study refused after it took its testbed's lock (its results file
/// exists) leaves no lock file behind: the bug left an empty one.
#[test]
fn a_study_refused_after_taking_its_lock_leaves_no_lock_file() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not run: a study without --hosts needs root");
        return;
    }
    let _one = one_testbed_at_a_time();
    // No other study runs: the lock is free, and then its file is gone.
    let lock = hold_the_study_lock("the refused-study test");
    assert_study_testbed_gone();
    let held = lock_file_id();
    drop(lock);
    assert_lock_file_gone(held);
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("out");
    std::fs::create_dir(&out).expect("out");
    std::fs::write(out.join("netgap-study-004.jsonl"), b"kept\n").expect("old results");
    common::one_line_error(
        &netgap()
            .args(["study", "004", "--quick", "-o"])
            .arg(&out)
            .output()
            .expect("netgap study"),
        "study 004 into a directory with its results file",
        "netgap-study-004.jsonl: it exists",
    );
    // The file the refused study made and locked was removed before it
    // let go; a file there now is another holder's, which holds it.
    if let Ok(file) = std::fs::File::open(STUDY_LOCK) {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(_) => panic!("{STUDY_LOCK} was left behind by the refused study"),
            Err((_, e)) => assert_eq!(e, nix::errno::Errno::EWOULDBLOCK),
        }
    }
    assert_study_testbed_gone();
}

/// A hosts file of two plain agents (none runs): study 002 can make a
/// figure on them, so a study gets past its checks to its output files.
fn two_plain_hosts(dir: &Path) -> String {
    let two = dir.join("two.json");
    std::fs::write(
        &two,
        r#"{"version":1,"topology":"list","hosts":[{"name":"a","control":"127.0.0.1:9","address":"127.0.0.1"},{"name":"b","control":"127.0.0.1:9","address":"127.0.0.1"}]}"#,
    )
    .expect("hosts file");
    format!("@{}", two.display())
}

/// `netgap study 002 --hosts HOSTS -o OUT` fails in one line holding
/// `needle`.
fn study_refused(hosts: &str, out: &Path, needle: &str) -> String {
    common::one_line_error(
        &netgap()
            .args(["study", "002", "--hosts", hosts, "-o"])
            .arg(out)
            .output()
            .expect("netgap study"),
        &format!("study -o {}", out.display()),
        needle,
    )
}

/// The names in `dir`.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The bug: `study -o DIR` followed a link planted in DIR and wrote the
/// report over the file it named (a root 0600 file), and appended its
/// results to another. Now each file is made new without following a
/// link, so a link (or any file) already there is refused in one line,
/// the file it names is untouched, and nothing else is left in DIR.
#[test]
fn study_output_is_not_written_through_a_link_planted_in_its_directory() {
    let t = tempfile::tempdir().expect("tempdir");
    let hosts = two_plain_hosts(t.path());
    let secret = t.path().join("secret");
    std::fs::write(&secret, b"root's own").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    for planted in ["netgap-study-002.jsonl", "netgap-study-002.html"] {
        let out = t.path().join(format!("out-{planted}"));
        std::fs::create_dir(&out).expect("out");
        std::os::unix::fs::symlink(&secret, out.join(planted)).expect("link");
        let line = study_refused(&hosts, &out, "it exists");
        assert!(
            line.contains(planted) && line.contains("never through a link"),
            "{line}"
        );
        assert_eq!(names_in(&out), [planted], "nothing else was made");
        assert_eq!(std::fs::read(&secret).expect("secret"), b"root's own");
        let mode = std::fs::metadata(&secret)
            .expect("secret")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // A results file already there is refused too, not appended to.
    let out = t.path().join("out-kept");
    std::fs::create_dir(&out).expect("out");
    std::fs::write(out.join("netgap-study-002.jsonl"), b"kept\n").expect("old results");
    study_refused(&hosts, &out, "netgap-study-002.jsonl: it exists");
    assert_eq!(
        std::fs::read(out.join("netgap-study-002.jsonl")).expect("kept"),
        b"kept\n"
    );
}

/// A study writes only in a directory of its user that no other user can
/// write: one another user owns, one its group or everyone may write, and
/// a link to a good one are refused in one line, nothing written in them.
#[test]
fn study_output_refuses_a_directory_another_user_owns_or_can_write() {
    let t = tempfile::tempdir().expect("tempdir");
    let hosts = two_plain_hosts(t.path());
    for (mode, needle) in [
        (0o777, "writable by every user"),
        (0o1777, "writable by every user"),
        (0o770, "writable by its group"),
    ] {
        let out = t.path().join(format!("mode-{mode:o}"));
        std::fs::create_dir(&out).expect("out");
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let line = study_refused(&hosts, &out, needle);
        assert!(line.contains("pass -o a directory of yours"), "{line}");
        assert!(names_in(&out).is_empty(), "nothing was written");
    }
    let good = t.path().join("good");
    std::fs::create_dir(&good).expect("good");
    std::os::unix::fs::symlink(&good, t.path().join("link")).expect("link");
    study_refused(&hosts, &t.path().join("link"), "it is a symbolic link");
    assert!(names_in(&good).is_empty(), "nothing was written");
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = t.path().join("theirs");
        std::fs::create_dir(&theirs).expect("theirs");
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
        study_refused(&hosts, &theirs, "owned by uid 65534");
        assert!(names_in(&theirs).is_empty(), "nothing was written");
    }
}

/// Text as the report escapes it.
fn html_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Every study builds its testbed under one name (`study`): the tests
/// that build one take turns.
fn one_testbed_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// While study `first` runs on the testbed it built, a second study and
/// `testbed down` or `up` of that testbed by hand are refused in one line
/// naming it, and its testbed stays up (the first then ends well, which
/// its caller checks). The bug: the second study took the first's testbed
/// down and built its own.
fn a_second_user_of_the_study_testbed_is_refused(first: &mut std::process::Child, tmp: &Path) {
    let t0 = Instant::now();
    let up = || {
        ok(Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns"))
        .contains("ngtb-study-h1")
    };
    while !up() {
        assert!(
            first.try_wait().expect("wait").is_none(),
            "the first study ended before its testbed was up"
        );
        assert!(t0.elapsed() < Duration::from_secs(60), "no study testbed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let named = format!(
        "testbed study is in use by `netgap study 004` (pid {})",
        first.id()
    );
    let second = tmp.join("second");
    std::fs::create_dir(&second).expect("second");
    for args in [
        &["study", "004", "--quick", "-o"][..],
        &["testbed", "down", "--name", "study"],
        &["testbed", "up", "--name", "study", "--hosts", "2"],
    ] {
        let mut cmd = netgap();
        cmd.args(args);
        if args[0] == "study" {
            cmd.arg(&second);
        }
        let line =
            common::one_line_error(&cmd.output().expect("runs"), &format!("{args:?}"), &named);
        assert!(line.contains("nothing was changed"), "{line}");
    }
    assert!(
        names_in(&second).is_empty(),
        "the second study wrote nothing"
    );
    assert!(up(), "the first study's testbed is still up");
}

#[test]
fn a_study_on_its_own_testbed_reports_every_figure_and_claim() {
    let _one = one_testbed_at_a_time();
    if !system_ready("study::a_study_on_its_own_testbed") {
        return;
    }
    let t = tempfile::tempdir().expect("tempdir");
    // A directory the study makes itself, mode 0700.
    let dir = t.path().join("made");
    let log = |name: &str| std::fs::File::create(t.path().join(name)).expect("log");
    // A machine declared to forward 3 Gbit/s through the shapers: figure
    // 5's three links both ways at 1 Gbit/s (5.7 Gbit/s of payload) run at
    // the rate it carries for them, every other figure at the study's. The
    // budget is the one --quick derives from the points of this build's
    // stacks, which a fixed one would not hold in every build.
    let mut first = common::procs::Reaped(
        netgap()
            .args(["study", "004", "--quick"])
            .args(["--forwarding", "3G", "-o"])
            .arg(&dir)
            .stdout(Stdio::from(log("stdout")))
            .stderr(Stdio::from(log("stderr")))
            .spawn()
            .expect("netgap study"),
    );
    a_second_user_of_the_study_testbed_is_refused(&mut first.0, t.path());
    let status = first.0.wait().expect("netgap study");
    let read = |name: &str| std::fs::read_to_string(t.path().join(name)).expect("log");
    let out = read("stdout");
    assert!(status.success(), "{out}{}", read("stderr"));
    assert!(out.contains("report:"), "{out}");
    let mode = std::fs::metadata(&dir).expect("made").permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the study made its directory 0700");
    let dir = dir.as_path();
    let s = study::load("004").expect("004");
    let html = std::fs::read_to_string(dir.join("netgap-study-004.html")).expect("report");
    for f in &s.figures {
        let title = format!("<h3>Figure {}: ", f.id);
        let at = html
            .find(&title)
            .unwrap_or_else(|| panic!("no section {title}"));
        let section = &html[at..];
        let section = &section[..section.find("</section>").expect("section ends")];
        assert!(section.contains("<svg"), "figure {} has a plot", f.id);
        assert!(
            section.contains("class=\"claims\""),
            "figure {} has claims",
            f.id
        );
        for c in s.claims_of(&f.id) {
            assert!(
                section.contains(&html_text(&c.text)),
                "figure {}: claim {:?}",
                f.id,
                c.text
            );
        }
    }
    let records = read_records(&dir.join("netgap-study-004.jsonl"));
    for f in &s.figures {
        let label = netgap::report::study::figure_label("004", &f.id);
        assert!(
            records
                .iter()
                .any(|r| r["stack"]["label"] == label.as_str()),
            "records of figure {}",
            f.id
        );
    }
    // 80% of 3 Gbit/s over six shaped link directions of tcp at MTU 1500:
    // 418 Mbit/s of line each, down to 410M. No point of it passed the
    // limit of the rate it ran at (its value, the median of its
    // repetitions: one repetition passed it by 0.2% once, on a machine
    // whose CPUs the testbed's forwarding kept 72% busy, cause not yet
    // known; the record says so as a fault, which is the product's to
    // say, not this test's to forbid),
    // and none of the study's took more than the machine carries.
    let fig5 = netgap::report::study::figure_label("004", "5");
    for r in &records {
        let path = &r["stack"]["path"];
        if r["stack"]["label"] == fig5.as_str() {
            assert_eq!(path["rate_bps"], 410_000_000u64, "{r:#}");
            assert_eq!(path["rate_scaled_from_bps"], 1_000_000_000u64, "{r:#}");
            let limit = r["physics"]["payload_limit_gbps"].as_f64().expect("limit");
            assert!(limit < 0.8 * 3.0, "{r:#}");
            // The model's own tolerance (netgap_core::physics::TOLERANCE).
            let most = limit * 1.01;
            assert!(r["value"].as_f64().is_some_and(|v| v <= most), "{r:#}");
            if !r["physics"]["fault"].is_null() {
                assert!(
                    r["warnings"].as_array().is_some_and(|w| w
                        .iter()
                        .any(|w| w.as_str().is_some_and(|w| w.contains("measurement fault")))),
                    "{r:#}"
                );
            }
        } else if !path["rate_bps"].is_null() {
            assert_eq!(path["rate_bps"], 1_000_000_000u64, "{r:#}");
            assert!(path["rate_scaled_from_bps"].is_null(), "{r:#}");
        }
        assert!(r["physics"]["past_forwarding_gbps"].is_null(), "{r:#}");
    }
    assert!(
        html.contains("Figure 5: links at 410M instead of the study"),
        "the report says figure 5 ran at a scaled rate"
    );
    assert!(
        read("stderr").contains("figure 5: links at 410M"),
        "{}",
        read("stderr")
    );
    assert_study_testbed_gone();
}

/// Study 000's user-level row (Figure 13u): real gmond gathered over the
/// kernel's TCP and over xdp through the preload library on direct
/// connections, on the study's own testbed with its second switch; both
/// records are there, the xdp one with every connection on xdp and direct
/// ones among them, and the claim is judged from them.
#[cfg(feature = "xdp")]
#[test]
fn study_000_puts_gmond_over_xdp_beside_tcp_in_figure_13u() {
    let test = "study_000_puts_gmond_over_xdp_beside_tcp_in_figure_13u";
    let _one = one_testbed_at_a_time();
    if !system_ready(test) {
        return;
    }
    if !std::path::Path::new("/usr/sbin/gmond").exists() {
        common::skip(test, "/usr/sbin/gmond is missing");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, records, html) = study_000_quick("13u", "20s", dir.path());
    let by = |t: &str| {
        records
            .iter()
            .find(|r| r["transport"] == t)
            .unwrap_or_else(|| panic!("no {t} record: {out}"))
    };
    let (tcp, xdp) = (by("tcp"), by("xdp"));
    for r in [tcp, xdp] {
        assert_eq!(r["test"], "gather");
        assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        assert!(r["app"]["metrics"]["xml_metrics"].as_f64() > Some(0.0));
    }
    let m = &xdp["app"]["metrics"];
    assert!(m["preload_xdp_connections"].as_f64() > Some(0.0), "{m}");
    assert!(m["preload_direct"].as_f64() > Some(0.0), "{m}");
    assert_eq!(m["preload_kernel_connections"].as_f64(), Some(0.0), "{m}");
    let section = figure_section(&html, "13u");
    assert!(section.contains("<svg"), "a plot");
    assert!(section.contains("transport=xdp"), "the claim compares xdp");
    assert_study_testbed_gone();
}

/// Study 000's user-level row of Figures 9a, 11 and 12: netgap's pipeline
/// (three hosts; its stages an unmodified sockets program, under the
/// preload library on direct xdp connections) and striped I/O (four
/// hosts) over xdp beside the kernel's stacks, on the study's own testbed;
/// every figure has xdp records, the pipeline's with every stream on xdp
/// and direct ones among them, the
/// tile-against-contiguous claim is judged for each network, and the
/// testbed goes.
#[cfg(feature = "xdp")]
#[test]
fn study_000_puts_pipeline_and_pio_over_xdp_beside_tcp_in_figures_9a_11_12() {
    let test = "study_000_puts_pipeline_and_pio_over_xdp_beside_tcp_in_figures_9a_11_12";
    let _one = one_testbed_at_a_time();
    if !system_ready(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, records, html) = study_000_quick("9a,11,12", "171s", dir.path());
    for (fig, test) in [("9a", "pipeline"), ("11", "pio"), ("12", "pio")] {
        let label = netgap::report::study::figure_label("000", fig);
        let of = |t: &str| {
            records
                .iter()
                .filter(|r| r["stack"]["label"] == label.as_str() && r["transport"] == t)
                .count()
        };
        assert!(of("tcp") > 0, "figure {fig}: no tcp records: {out}");
        assert!(of("xdp") > 0, "figure {fig}: no xdp records: {out}");
        assert!(records
            .iter()
            .filter(|r| r["stack"]["label"] == label.as_str())
            .all(|r| r["test"] == test && r["value"].as_f64().is_some_and(|v| v > 0.0)));
    }
    let label = netgap::report::study::figure_label("000", "9a");
    for r in records
        .iter()
        .filter(|r| r["stack"]["label"] == label.as_str() && r["transport"] == "xdp")
    {
        let m = &r["app"]["metrics"];
        assert_eq!(r["app"]["options"]["stages"], "program", "{}", r["app"]);
        assert!(m["preload_xdp_connections"].as_f64() > Some(0.0), "{m}");
        assert!(m["preload_direct"].as_f64() > Some(0.0), "{m}");
        assert_eq!(m["preload_kernel_connections"].as_f64(), Some(0.0), "{m}");
    }
    let section = figure_section(&html, "12");
    for t in ["transport=tcp: ", "transport=xdp: "] {
        assert!(section.contains(t), "the claim is judged on {t}");
    }
    assert_study_testbed_gone();
}
