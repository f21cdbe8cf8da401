//! Results files survive a full disk: a record is written whole or not at
//! all, the run stops with one line naming the file, and a later run
//! appends cleanly. The disk is a small tmpfs mounted for the test (root);
//! without root the test says why and passes, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1.

use crate::common;
use crate::common::{netgap, read_records};
use std::path::Path;
use std::process::Command;

/// A tmpfs of `size` mounted on `dir`, unmounted on drop.
struct Tmpfs<'a> {
    dir: &'a Path,
}

impl<'a> Tmpfs<'a> {
    fn mount(dir: &'a Path, size: &str) -> Option<Tmpfs<'a>> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs { dir })
    }
}

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir).status();
    }
}

#[test]
fn a_full_disk_leaves_no_torn_record_and_a_later_run_appends_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(_fs) = Tmpfs::mount(dir.path(), "64k") else {
        common::skip(
            "a_full_disk_leaves_no_torn_record_and_a_later_run_appends_cleanly",
            "mounting a tmpfs needs root",
        );
        return;
    };
    // Leave room for a few records only.
    let filler = dir.path().join("filler");
    std::fs::write(&filler, vec![0u8; 48 * 1024]).expect("filler");
    let json = dir.path().join("r.jsonl");
    let run = || {
        netgap()
            .args(["run", "pingpong", "-s", "1..64K", "--reps", "2", "-n", "20"])
            .arg("--json")
            .arg(&json)
            .output()
            .expect("netgap run")
    };
    let out = run();
    assert!(!out.status.success(), "the disk filled up");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("r.jsonl") && errors[0].contains("No space left"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&json).expect("results file");
    assert!(text.is_empty() || text.ends_with('\n'), "no torn line");
    let first = read_records(&json).len();
    assert!(
        first > 0,
        "some points were measured before the disk filled"
    );

    // With room again, the next run appends whole records after them.
    std::fs::remove_file(&filler).expect("rm filler");
    common::run_ok(
        netgap()
            .args(["run", "pingpong", "-s", "1", "--reps", "2", "-n", "20"])
            .arg("--json")
            .arg(&json),
    );
    assert_eq!(read_records(&json).len(), first + 1);
}

#[test]
fn a_torn_last_record_is_skipped_by_report_and_compare_and_never_joined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let run = || {
        common::run_ok(
            netgap()
                .args(["run", "pingpong", "-s", "1", "--reps", "2", "-n", "20"])
                .arg("--json")
                .arg(&json),
        );
    };
    run();
    // A crash mid-write left the beginning of a record.
    let mut text = std::fs::read_to_string(&json).expect("read");
    text.push_str("{\"test\":\"pingpong\",\"transport\":\"tc");
    std::fs::write(&json, text).expect("write");
    // The next run keeps it on its own line.
    run();
    let html = dir.path().join("r.html");
    common::run_ok(netgap().arg("report").arg(&json).arg("-o").arg(&html));
    let page = std::fs::read_to_string(&html).expect("page");
    assert!(
        page.contains("1 torn record"),
        "the report says what it skipped"
    );
    let out = netgap()
        .arg("compare")
        .arg(&json)
        .arg(&json)
        .output()
        .expect("compare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("r.jsonl:2: a torn record"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

#[test]
fn a_file_that_is_no_results_file_is_refused_without_reading_it_all() {
    let out = netgap()
        .args(["report", "/dev/zero", "-o"])
        .arg(std::env::temp_dir().join("netgap-never-written.html"))
        .output()
        .expect("report");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("/dev/zero is a character device, not a regular file"),
        "{stderr}"
    );
}

/// `report` and `compare` read only regular results files of at most
/// 1 GiB: a FIFO with no writer is refused at once (not after a wait for
/// one), a longer file before any of it is read, each in one line naming
/// the file.
#[test]
fn a_fifo_or_a_results_file_past_the_cap_is_refused_at_once() {
    use common::files::{mkfifo, one_error_line, output_within, sparse};
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("results.fifo");
    mkfifo(&fifo);
    let big = dir.path().join("big.jsonl");
    sparse(&big, (1 << 30) + 1);
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, "").expect("write");
    let html = dir.path().join("never.html");
    let fifo_says = format!("{} is a FIFO, not a regular file", fifo.display());
    let big_says = format!(
        "{} holds 1073741825 bytes, more than the 1G (1073741824 bytes) netgap reads from a results file",
        big.display()
    );
    for (file, wanted) in [(&fifo, &fifo_says), (&big, &big_says)] {
        let report = output_within(
            netgap().arg("report").arg(file).arg("-o").arg(&html),
            Duration::from_secs(30),
        );
        let err = one_error_line(&report);
        assert!(err.contains(wanted.as_str()), "report: {err}");
        // As either side of a comparison.
        for pair in [[file, &good], [&good, file]] {
            let compare =
                output_within(netgap().arg("compare").args(pair), Duration::from_secs(30));
            let err = one_error_line(&compare);
            assert!(err.contains(wanted.as_str()), "compare: {err}");
        }
    }
    assert!(!html.exists());
}

/// The bug `study -o` had, in the commands that append records to a file
/// they are given (`run`, `sweep`, `logp` and the main job's `--json` and
/// `--csv`, `import -o`): a link planted where they write (a shared
/// directory) is not followed, nor is a second name of another file, and
/// each is refused in one line before anything is measured; the file they
/// name is untouched.
#[test]
fn results_files_are_not_appended_to_through_a_planted_link() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, b"root's own\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&secret, &link).expect("link");
    let hard = dir.path().join("hard");
    std::fs::hard_link(&secret, &hard).expect("hard link");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import/nptcp.out");
    for (file, why) in [(&link, "symbolic link"), (&hard, "2 hard links")] {
        let run = |flag: &str| {
            netgap()
                .args([
                    "run", "pingpong", "-s", "1", "--reps", "2", "-n", "20", flag,
                ])
                .arg(file)
                .output()
                .expect("netgap run")
        };
        let sweep = netgap()
            .args(["sweep", "--end", "64", "--trials", "2", "--json"])
            .arg(file)
            .output()
            .expect("netgap sweep");
        let import = netgap()
            .args(["import", "netpipe"])
            .arg(&fixture)
            .arg("-o")
            .arg(file)
            .output()
            .expect("netgap import");
        for (what, out) in [
            ("run --json", run("--json")),
            ("run --csv", run("--csv")),
            ("sweep --json", sweep),
            ("import -o", import),
        ] {
            let line = common::one_line_error(&out, what, why);
            assert!(
                line.contains(&file.display().to_string()) && line.contains("never through a link"),
                "{what}: {line}"
            );
        }
    }
    assert_eq!(std::fs::read(&secret).expect("secret"), b"root's own\n");
}

/// `report -o FILE` and `--images DIR` wrote through a link at their names
/// too; now each file is written new and renamed into place, so a link
/// planted there is replaced and the file it named is untouched.
#[test]
fn a_report_is_not_written_through_a_planted_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    common::run_ok(
        netgap()
            .args(["run", "pingpong", "-s", "1", "--reps", "2", "-n", "20"])
            .arg("--json")
            .arg(&json),
    );
    let secret = dir.path().join("secret");
    std::fs::write(&secret, b"root's own\n").expect("secret");
    let html = dir.path().join("report.html");
    std::os::unix::fs::symlink(&secret, &html).expect("link");
    let images = dir.path().join("plots");
    std::fs::create_dir(&images).expect("plots");
    std::os::unix::fs::symlink(&secret, images.join("plot-01.svg")).expect("link");
    common::run_ok(
        netgap()
            .arg("report")
            .arg(&json)
            .arg("-o")
            .arg(&html)
            .arg("--images")
            .arg(&images),
    );
    assert_eq!(std::fs::read(&secret).expect("secret"), b"root's own\n");
    for written in [html, images.join("plot-01.svg")] {
        let meta = std::fs::symlink_metadata(&written).expect("written");
        assert!(meta.file_type().is_file(), "{}", written.display());
        assert!(meta.len() > 100, "{}", written.display());
    }
}
