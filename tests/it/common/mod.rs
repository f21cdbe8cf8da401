//! Pieces the integration tests share: the binary, a real agent process on
//! loopback that is killed on drop, keys, reading a results file, checking
//! a run's outcome, and whether the system can run a testbed.

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub(crate) mod files;
pub(crate) mod procs;
pub(crate) mod testbed;

/// The `netgap` binary under test.
pub(crate) fn netgap() -> Command {
    Command::cargo_bin("netgap").expect("binary built")
}

/// The control address a `netgap serve` started with its stdout piped
/// prints first ("netgap agent VERSION listening on ADDR[ (key
/// required)]").
pub(crate) fn agent_addr(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("stdout piped");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("agent prints its address");
    line.split_once("listening on ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("address in {line:?}"))
        .to_string()
}

/// A `netgap serve` on an ephemeral port of a loopback address, killed on
/// drop.
pub(crate) struct AgentProc {
    pub child: Child,
    /// Its control address, as it printed it.
    pub addr: String,
}

impl AgentProc {
    /// An agent bound to `bind`.
    pub(crate) fn start(bind: &str) -> AgentProc {
        AgentProc::start_with(bind, &[])
    }

    /// An agent with extra `serve` flags (limits, a key).
    pub(crate) fn start_with(bind: &str, flags: &[&str]) -> AgentProc {
        let mut child = netgap()
            .args(["serve", "--bind", bind, "--port", "0"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts");
        let addr = agent_addr(&mut child);
        AgentProc { child, addr }
    }

    /// Kills the agent and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every record of a JSON Lines results file (none when it is missing).
pub(crate) fn read_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

/// Whether a results file being written holds at least one whole record: a
/// poll may catch the first line half written, which is not yet a record.
pub(crate) fn has_whole_record(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains('\n')
}

/// The path of the `netgap` binary under test, for commands run through
/// another program (`ip netns exec`).
pub(crate) fn netgap_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_netgap"))
}

/// The preload library next to the netgap binary, built once per test
/// process (a `cargo test --test it` builds only the root package).
pub(crate) fn preload_library() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let netgap = netgap_path();
            let dir = netgap.parent().expect("the binary's directory");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = std::process::Command::new(cargo);
            cmd.args(["build", "--quiet", "-p", "netgap-preload"]);
            // A test binary with the xdp transport tests the library's
            // direct path too, which the library has only with its own
            // `xdp` feature.
            if cfg!(feature = "xdp") {
                cmd.args(["--features", "xdp"]);
            }
            if dir.ends_with("release") {
                cmd.arg("--release");
            }
            assert!(cmd.status().expect("cargo runs").success());
            let lib = dir.join("libnetgap_preload.so");
            assert!(lib.exists(), "{} after the build", lib.display());
            lib
        })
        .clone()
}

/// A new key file `name` in `dir`, made by `netgap key new`.
pub(crate) fn new_key_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = netgap()
        .args(["key", "new"])
        .arg(&path)
        .output()
        .expect("netgap key new");
    assert!(out.status.success(), "{out:?}");
    path
}

/// Runs `cmd`, which must succeed; its output.
pub(crate) fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The standard output of a command that must have succeeded.
pub(crate) fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `netgap ARGS`, which must fail with one line on standard error
/// that holds `needle`, and no panic.
pub(crate) fn fails_with_one_line(args: &[&str], needle: &str) {
    let out = netgap().args(args).output().expect("runs");
    one_line_error(&out, &format!("{args:?}"), needle);
}

/// The standard error of `what`, a command that must have failed with one
/// line there that holds `needle`, and no panic.
pub(crate) fn one_line_error(out: &Output, what: &str, needle: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{what} should fail");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{what}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{what}: {stderr:?} lacks {needle:?}"
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    stderr
}

/// A record's field that must be an unsigned integer.
pub(crate) fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("an unsigned number: {v}"))
}

/// A record's field that must be a number.
pub(crate) fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number: {v}"))
}

/// A workload's own figure `name` in a record (`app.metrics`), which must
/// be there.
pub(crate) fn metric(r: &Value, name: &str) -> f64 {
    r["app"]["metrics"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("metric {name} in {}", r["app"]))
}

/// This test binary again, running only the ignored test `name` of the
/// module at `module` (its `module_path!()`), with its output captured by
/// nobody: for a test whose process must hold nothing of any other test
/// (its memory measured), or a helper that plays another host.
pub(crate) fn child_test(module: &str, name: &str) -> Command {
    // Test names leave out the crate: `it::flows_scale` runs as
    // `flows_scale::NAME`.
    let path = module.split_once("::").map_or(module, |(_, rest)| rest);
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.arg(format!("{path}::{name}")).args([
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd
}

/// `netgap run ARGS --json JSON` with the preload library built next to
/// the test's netgap (`NETGAP_PRELOAD`): its success, its output (standard
/// output then error) and the records.
pub(crate) fn run_preloaded(args: &[&str], json: &Path) -> (bool, String, Vec<Value>) {
    let out = netgap()
        .arg("run")
        .args(args)
        .arg("--json")
        .arg(json)
        .env("NETGAP_PRELOAD", preload_library())
        .output()
        .expect("netgap run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, read_records(json))
}

/// Whether every program is installed, each given as its path and the
/// package that has it; if not, skips `test` naming the first missing one
/// and its package.
pub(crate) fn installed(test: &str, programs: &[(&str, &str)]) -> bool {
    for (path, package) in programs {
        if !Path::new(path).exists() {
            skip(
                test,
                &format!("{path} is missing (apt-get install {package})"),
            );
            return false;
        }
    }
    true
}

/// The test program `source` (C, its text) written to `DIR/NAME.c` and
/// built with `compiler` (`cc`, `mpicc`) into `DIR/NAME`; its path.
pub(crate) fn build_c(dir: &Path, name: &str, source: &str, compiler: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("the program's source");
    let exe = dir.join(name);
    let built = Command::new(compiler)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("the compiler runs");
    assert!(built.status.success(), "{built:?}");
    exe
}

/// What a library log across hosts (`text`) must say of a connection
/// between two wrapped programs: it moved to xdp through the relays at the
/// connector's end and at the accepting one, and no connection failed.
#[cfg(feature = "xdp")]
pub(crate) fn assert_relayed_at_both_ends(text: &str) {
    assert!(
        text.lines()
            .any(|l| l.contains("connection to port") && l.ends_with("moved to xdp via the relay")),
        "{text}"
    );
    assert!(
        text.contains("accepted connection moved to xdp via the relay"),
        "{text}"
    );
    assert!(!text.contains("fails"), "{text}");
}

/// Whether the system can run a testbed (root, network namespaces,
/// iproute2); if not, says why, and fails when system tests are required
/// (`NETGAP_REQUIRE_SYSTEM_TESTS=1`, as CI sets it).
pub(crate) fn system_ready(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let missing = if unsafe { libc::geteuid() } != 0 {
        Some("not root")
    } else if !Path::new("/proc/self/ns/net").exists() {
        Some("no network namespaces")
    } else if Command::new("ip").arg("-V").output().is_err() {
        Some("iproute2 (ip) is not installed")
    } else if Command::new("tc").arg("-V").output().is_err() {
        Some("iproute2 (tc) is not installed")
    } else {
        None
    };
    match missing {
        None => true,
        Some(why) => {
            skip(test, why);
            false
        }
    }
}

/// Skips `test` because `why` (what the system lacks), saying so; when CI
/// requires the system tests (`NETGAP_REQUIRE_SYSTEM_TESTS=1`, as `.ci/run`
/// sets it), fails it instead, so a sandbox short of something cannot pass
/// with the test unrun. The one place a test decides that.
pub(crate) fn skip(test: &str, why: &str) {
    if std::env::var("NETGAP_REQUIRE_SYSTEM_TESTS").as_deref() == Ok("1") {
        panic!("{test}: {why}, but NETGAP_REQUIRE_SYSTEM_TESTS=1");
    }
    eprintln!("skipping {test}: {why}");
}

/// Polls `left` every 20 ms until it names nothing (processes, threads);
/// what it still names after `within`, if anything.
pub(crate) fn gone_within<T>(
    within: std::time::Duration,
    mut left: impl FnMut() -> Vec<T>,
) -> Result<(), Vec<T>> {
    let t0 = std::time::Instant::now();
    loop {
        let now = left();
        if now.is_empty() {
            return Ok(());
        }
        if t0.elapsed() > within {
            return Err(now);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The warnings of record `r`.
pub(crate) fn warnings(r: &serde_json::Value) -> Vec<&str> {
    r["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(serde_json::Value::as_str)
        .collect()
}
