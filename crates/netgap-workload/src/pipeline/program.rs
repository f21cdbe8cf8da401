//! `--stages program`: a pipeline role's stages in a process of their own
//! (`netgap pipeline-stages`) on the kernel's TCP sockets, the way an
//! unmodified sockets application runs: as it is over tcp, and under
//! netgap's preload library over shm (one host) or xdp (across hosts,
//! through the hosts' relays), which carries its connections.
//!
//! The agent starts the program, hands it the role on standard input (one
//! JSON line) and steps it through the role's phases, one line each way:
//! the program dials the earlier roles and announces its listeners'
//! addresses ([`Said::Listening`]); told `ready`, it accepts its streams
//! and says so; told `go`, it runs the query exactly as the agent's own
//! stages do (every UOW checked byte for byte) and reports the role's
//! result ([`Said::Done`]); it exits when its standard input closes. The
//! role's CPU is the agent's, the program's and the relay's the run
//! started, over the query; the record gets the library log's counts
//! (`preload_*`) and a service entry naming the program, its stack and
//! the relay.

use super::graph::Graph;
use super::{PipeParams, NAME};
use crate::preload::{LogSummary, RelayGuard};
use crate::role::{
    OpenRole, ReadyRole, RoleContext, RoleError, RoleResult, Stop, WindowEdge, ACCEPT_TIMEOUT,
    STOP_TICK,
};
use crate::service::{self, RunDir};
use crate::staged;
use netgap_core::record::ServiceRecord;
use netgap_proto::dataproof::DataToken;
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadSpec};
use netgap_transport::Programs;
use serde::{Deserialize, Serialize};
use std::io::{BufRead as _, Read as _, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ExitStatus};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The hidden command that runs a role's stages.
pub(crate) const COMMAND: &str = "pipeline-stages";

/// What the agent tells the program after the job: accept the streams.
const READY: &str = "ready";
/// What the agent tells the program at the barrier: run the query.
const GO: &str = "go";

/// Time past the role's window the program has to report, and to exit
/// once told to.
const REPORT_SLACK: Duration = Duration::from_secs(5);

/// The longest line the program may say, bytes (its result's flows and
/// histogram are far smaller).
const MAX_LINE_BYTES: u64 = 16 << 20;

/// What the agent hands its stages' program on standard input, one line:
/// the role as the coordinator sent it and what the agent decided for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StagesJob {
    /// The role.
    pub(crate) spec: WorkloadSpec,
    /// The point's data token, proved on every stream.
    pub(crate) token: DataToken,
    /// Where the role listens.
    pub(crate) listen_ip: IpAddr,
    /// The agent's `--max-rate`, Gbit/s: the program's streams are paced
    /// to it as the agent's would be.
    pub(crate) rate_gbps: f64,
}

/// What the program says on standard output, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Said {
    /// It dialled the earlier roles; its listeners' addresses.
    Listening(Vec<String>),
    /// Every stream of the role is connected.
    Ready,
    /// The role's result.
    Done(Box<StagesReport>),
}

/// A role's result as the program reports it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StagesReport {
    pub(crate) flows: Vec<FlowReport>,
    pub(crate) buckets: Vec<[u64; 2]>,
    pub(crate) outcome: WorkloadOutcome,
}

fn refused(detail: impl std::fmt::Display) -> RoleError {
    RoleError::Refused {
        workload: NAME,
        detail: detail.to_string(),
    }
}

/// Why `--stages program` cannot run over `transport`, one line.
pub(super) fn no_programs(transport: &str) -> String {
    format!(
        "--stages program runs the stages on the kernel's TCP sockets, as they are or under the preload library; use -t {}, not {transport}",
        netgap_transport::program_transports()
    )
}

/// Starts the role's stages in their program and waits until it has
/// dialled the earlier roles and listens.
pub(super) fn open_program(
    ctx: &RoleContext<'_>,
    params: PipeParams,
    graph: Graph,
) -> Result<Box<dyn OpenRole>, RoleError> {
    let stack = crate::preload::LibraryStack::of(&ctx.spec.point);
    let programs = netgap_transport::programs(&stack.name);
    if programs == Programs::No {
        return Err(refused(no_programs(&stack.name)));
    }
    let library = if programs.under_library() {
        Some(crate::preload::library_path().map_err(refused)?)
    } else {
        None
    };
    let tcp = netgap_transport::find("tcp")
        .ok_or_else(|| refused("this build has no tcp transport for the stages' program"))?;
    let ip = staged::listen_ip(NAME, ctx, tcp)?;
    // The placement and the earlier roles' addresses are checked here too,
    // so a bad one is the agent's line, not the program's.
    staged::view(NAME, params.staged.clone(), ctx.spec, tcp)?;
    let dir = RunDir::new(ctx.dirs, COMMAND).map_err(refused)?;
    let relay = if programs == Programs::LibraryWithRelay {
        let streams = u32::try_from(graph.edges().len()).unwrap_or(u32::MAX);
        Some(crate::web::server_role::relay_for(ctx, &dir, streams)?)
    } else {
        None
    };
    let job = StagesJob {
        spec: ctx.spec.clone(),
        token: ctx.data_token.clone(),
        listen_ip: ip,
        rate_gbps: ctx.rate.rate_gbps(),
    };
    let log = match library {
        Some(_) => Some(dir.service_file("preload.log").map_err(refused)?),
        None => None,
    };
    dir.hand_over().map_err(refused)?;
    let mut child = StagesChild::start(library.as_deref(), &stack, &dir, &job)?;
    let addrs = match child.next("its listeners", Instant::now() + ACCEPT_TIMEOUT, ctx.stop)? {
        Said::Listening(addrs) => addrs,
        other => return Err(child.unexpected("its listeners", &other)),
    };
    let service = ServiceRecord {
        name: COMMAND.into(),
        host: service::host_name(),
        program: child.exe.display().to_string(),
        version: env!("CARGO_PKG_VERSION").into(),
        listen: addrs.join(","),
        workers: None,
        config: String::new(),
        facts: facts(&stack, library.as_deref(), relay.as_ref(), &params, &job),
    };
    Ok(Box::new(ProgramRole {
        child,
        addrs,
        spec: ctx.spec.clone(),
        stop: ctx.stop.clone(),
        relay,
        log,
        service,
        _dir: dir,
    }))
}

/// What the record says of the program: its stack, the library it ran
/// under, the relay, and the copies it held.
fn facts(
    stack: &crate::preload::LibraryStack,
    library: Option<&Path>,
    relay: Option<&RelayGuard>,
    params: &PipeParams,
    job: &StagesJob,
) -> std::collections::BTreeMap<String, String> {
    let mut f = std::collections::BTreeMap::new();
    let sockets = match library {
        Some(l) => {
            f.insert("library".into(), l.display().to_string());
            format!("kernel TCP sockets under the preload library, stack {stack}")
        }
        None => "kernel TCP sockets".into(),
    };
    f.insert("sockets".into(), sockets);
    if let Some(r) = relay {
        f.insert(
            "relay".into(),
            if r.started() {
                "started for the run; its CPU counts as the stages'"
            } else {
                "already running; its CPU is not counted"
            }
            .into(),
        );
    }
    if let Some(s) = &params.staged {
        if let Some(role) = s.roles.get(s.role) {
            let copies: Vec<String> = role.flows.iter().map(u32::to_string).collect();
            f.insert("copies".into(), copies.join(","));
        }
    }
    f.insert("listen_ip".into(), job.listen_ip.to_string());
    f
}

/// The program of a role, started, and what the agent keeps for its run.
struct ProgramRole {
    child: StagesChild,
    addrs: Vec<String>,
    spec: WorkloadSpec,
    stop: Stop,
    /// The host's relay, for `-t xdp`: its CPU counts as the stages'.
    relay: Option<RelayGuard>,
    /// The library's log, read through the descriptor the agent opened
    /// before handing the directory over; none off the library.
    log: Option<std::fs::File>,
    service: ServiceRecord,
    /// The program's run directory, removed when the role ends.
    _dir: RunDir,
}

impl OpenRole for ProgramRole {
    fn addrs(&self) -> Vec<String> {
        self.addrs.clone()
    }

    fn ready(mut self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        self.child.tell(READY)?;
        let deadline = Instant::now() + ACCEPT_TIMEOUT + REPORT_SLACK;
        match self.child.next("that it is ready", deadline, &self.stop)? {
            Said::Ready => Ok(self),
            other => Err(self.child.unexpected("that it is ready", &other)),
        }
    }
}

impl ReadyRole for ProgramRole {
    fn run(mut self: Box<Self>) -> Result<RoleResult, RoleError> {
        let pid = self.child.pid;
        let relay = self.relay.as_ref();
        let extra = || service::tree_cpu_ns(pid) + relay.map_or(0, RelayGuard::cpu_ns);
        let started = WindowEdge::counting(&extra);
        self.child.tell(GO)?;
        let deadline = staged::job_deadline(&self.spec, Instant::now()) + REPORT_SLACK;
        let said = self.child.next("its result", deadline, &self.stop)?;
        // The program waits for its standard input to close before it
        // exits, so its CPU is still there to read.
        let ended = WindowEdge::counting(&extra);
        let Said::Done(report) = said else {
            return Err(self.child.unexpected("its result", &said));
        };
        self.child.finish()?;
        let mut report = *report;
        report.outcome.cpu = started.usage_to(&ended);
        if let Some(log) = &self.log {
            let summary = LogSummary::read(log);
            for (k, v) in summary.record_metrics() {
                report.outcome.metrics.insert(k.into(), v);
            }
            report.outcome.evidence = summary
                .notes
                .iter()
                .map(|l| crate::service::evidence_line("the stages' preload.log", l))
                .collect();
        }
        report.outcome.services = vec![self.service.clone()];
        Ok(RoleResult {
            flows: report.flows,
            buckets: report.buckets,
            outcome: report.outcome,
        })
    }
}

/// The stages' program, running in a process group of its own, tethered
/// to a thread that waits for it; killed with its group when dropped
/// before it exited.
struct StagesChild {
    exe: PathBuf,
    pid: u32,
    stdin: Option<ChildStdin>,
    /// Its standard output, a line at a time.
    said: mpsc::Receiver<String>,
    /// Its standard error, read to its end (the last 64 KiB kept).
    stderr: Option<JoinHandle<Vec<u8>>>,
    /// The thread that started it and waits for it (the program dies
    /// with that thread: `PR_SET_PDEATHSIG`).
    waiter: Option<JoinHandle<Option<ExitStatus>>>,
}

impl StagesChild {
    /// Starts `netgap pipeline-stages`, under the library when given, and
    /// hands it `job`.
    fn start(
        library: Option<&Path>,
        stack: &crate::preload::LibraryStack,
        dir: &RunDir,
        job: &StagesJob,
    ) -> Result<StagesChild, RoleError> {
        let exe = std::env::current_exe()
            .map_err(|e| refused(format!("finding netgap's own binary: {e}")))?;
        let run_as = service::user::ServiceUser::for_agent()
            .map_err(refused)?
            .map(|u| crate::tether::RunAs {
                uid: u.uid,
                gid: u.gid,
            });
        let mut cmd = crate::tether::command_in_group(&exe, &[COMMAND], run_as);
        if let Some(library) = library {
            cmd.envs(stack.env(library, &dir.path().join("preload.log")));
        }
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .current_dir(dir.path());
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::Builder::new()
            .name("pipeline stages".into())
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let pipes = (
                        child.id(),
                        child.stdin.take(),
                        child.stdout.take(),
                        child.stderr.take(),
                    );
                    let _ = tx.send(Ok(pipes));
                    child.wait().ok()
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    None
                }
            })
            .map_err(|source| RoleError::Thread {
                what: "the pipeline stages' waiter",
                source,
            })?;
        let (pid, stdin, stdout, stderr) = match rx.recv() {
            Ok(Ok(pipes)) => pipes,
            Ok(Err(e)) => {
                let _ = waiter.join();
                return Err(refused(format!(
                    "starting the stages' program {}: {e}",
                    exe.display()
                )));
            }
            Err(_) => {
                let _ = waiter.join();
                return Err(refused("the stages' program's thread ended"));
            }
        };
        let (line_tx, said) = mpsc::channel();
        if let Some(out) = stdout {
            std::thread::Builder::new()
                .name("pipeline stages out".into())
                .spawn(move || {
                    let mut r = std::io::BufReader::new(out.take(MAX_LINE_BYTES));
                    let mut line = String::new();
                    while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                        if line_tx.send(std::mem::take(&mut line)).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|source| RoleError::Thread {
                    what: "the pipeline stages' reader",
                    source,
                })?;
        }
        let stderr = stderr.and_then(|mut err| {
            std::thread::Builder::new()
                .name("pipeline stages err".into())
                .spawn(move || {
                    let mut out = Vec::new();
                    let _ = (&mut err).take(64 << 10).read_to_end(&mut out);
                    // Past the kept part, read on so the program never
                    // blocks on a full pipe.
                    let _ = std::io::copy(&mut err, &mut std::io::sink());
                    out
                })
                .ok()
        });
        let mut child = StagesChild {
            exe,
            pid,
            stdin,
            said,
            stderr,
            waiter: Some(waiter),
        };
        let mut text =
            serde_json::to_vec(job).map_err(|e| refused(format!("the stages' job: {e}")))?;
        text.push(b'\n');
        child.write(&text)?;
        Ok(child)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), RoleError> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(refused("the stages' program's input is closed"));
        };
        if stdin.write_all(bytes).and_then(|()| stdin.flush()).is_err() {
            return Err(self.failed());
        }
        Ok(())
    }

    /// Tells the program `word`, one line.
    fn tell(&mut self, word: &str) -> Result<(), RoleError> {
        self.write(format!("{word}\n").as_bytes())
    }

    /// The program's next line, read by `deadline` unless the role is
    /// stopped; `what` names what it should say, for the error.
    fn next(&mut self, what: &str, deadline: Instant, stop: &Stop) -> Result<Said, RoleError> {
        loop {
            match self.said.recv_timeout(STOP_TICK) {
                Ok(line) => {
                    return serde_json::from_str(&line).map_err(|e| {
                        refused(format!(
                            "the stages' program said something other than {what}: {e}"
                        ))
                    })
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if stop.is_set() {
                        return Err(refused("stopped"));
                    }
                    if Instant::now() >= deadline {
                        return Err(refused(format!(
                            "the stages' program did not say {what} in time"
                        )));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.failed()),
            }
        }
    }

    /// The error for a line that is not the one the phase expects.
    fn unexpected(&mut self, what: &str, said: &Said) -> RoleError {
        let got = match said {
            Said::Listening(_) => "its listeners",
            Said::Ready => "that it is ready",
            Said::Done(_) => "its result",
        };
        refused(format!(
            "the stages' program said {got} when the agent waited for {what}"
        ))
    }

    /// The program ended early: its exit and the last line it wrote.
    fn failed(&mut self) -> RoleError {
        self.stdin = None;
        let status = self.wait(REPORT_SLACK);
        let err = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let err = String::from_utf8_lossy(&err);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let status = status.map_or_else(|| "killed".to_string(), |s| s.to_string());
        refused(format!(
            "the stages' program failed ({status}): {}",
            netgap_core::text::escape_control(last.trim())
                .chars()
                .take(400)
                .collect::<String>()
        ))
    }

    /// Closes the program's input, which ends it, and waits for it.
    fn finish(&mut self) -> Result<(), RoleError> {
        self.stdin = None;
        match self.wait(REPORT_SLACK) {
            Some(s) if s.success() => Ok(()),
            Some(s) => Err(refused(format!(
                "the stages' program exited with {s} after its result"
            ))),
            None => Err(refused(
                "the stages' program did not exit after its result; it was killed",
            )),
        }
    }

    /// Its exit, waited for up to `limit`, then killed with its group;
    /// `None` when it had to be killed or was not waited for.
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        while self.waiter.as_ref().is_some_and(|w| !w.is_finished()) && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        self.waiter.take().and_then(|w| w.join().ok()).flatten()
    }

    /// Kills the program's group unless it was reaped.
    fn kill(&self) {
        if self.waiter.as_ref().is_some_and(|w| !w.is_finished()) {
            if let Ok(pid) = i32::try_from(self.pid) {
                // SAFETY: a signal to the process group of the program
                // this value started, still unreaped (its waiter holds it).
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
    }
}

impl Drop for StagesChild {
    fn drop(&mut self) {
        self.stdin = None;
        self.kill();
        if let Some(w) = self.waiter.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use netgap_core::spec::{Mode, PointSpec, TransportOptions};
    use netgap_proto::workload::WorkloadRole;

    fn job() -> StagesJob {
        StagesJob {
            spec: WorkloadSpec {
                point: PointSpec {
                    test: "pipeline".into(),
                    transport: "xdp".into(),
                    mode: Mode::Event,
                    size_bytes: 16384,
                    options: TransportOptions::default(),
                    server_cpu: None,
                    io_timeout_ms: 3000,
                    verify: false,
                },
                role: WorkloadRole::Server,
                params: serde_json::json!({}),
                flows: 2,
                listen_ips: vec![],
                targets: vec![],
                bind_ips: vec![],
                session_hosts: vec![],
                warmup_ms: 0,
                duration_ms: 1000,
            },
            token: netgap_transport::preamble::new_token().unwrap(),
            listen_ip: IpAddr::from([10, 77, 0, 2]),
            rate_gbps: 40.0,
        }
    }

    #[test]
    fn the_agent_and_its_program_speak_one_json_line_each_way() {
        let text = serde_json::to_string(&job()).unwrap();
        assert!(!text.contains('\n'));
        let back: StagesJob = serde_json::from_str(&text).unwrap();
        assert_eq!(back.spec, job().spec);
        assert_eq!(back.listen_ip, job().listen_ip);
        let report = StagesReport {
            flows: Vec::new(),
            buckets: vec![[1000, 2]],
            outcome: WorkloadOutcome {
                window_ns: 1,
                cpu: netgap_core::cpu::CpuUsage::default(),
                peak_rss_kib: None,
                processes: None,
                bytes_rx: 0,
                bytes_tx: 0,
                datagrams: None,
                metrics: std::collections::BTreeMap::new(),
                services: Vec::new(),
                last_error: None,
                data_window_ns: None,
                evidence: Vec::new(),
            },
        };
        for said in [
            Said::Listening(vec!["10.77.0.2:4000".into()]),
            Said::Ready,
            Said::Done(Box::new(report)),
        ] {
            let line = serde_json::to_string(&said).unwrap();
            assert!(!line.contains('\n'), "{line}");
            let back: Said = serde_json::from_str(&line).unwrap();
            assert_eq!(std::mem::discriminant(&back), std::mem::discriminant(&said));
        }
        assert_eq!(serde_json::to_string(&Said::Ready).unwrap(), "\"ready\"");
        // A line of anything else is refused, never taken for a phase.
        assert!(serde_json::from_str::<Said>("\"go\"").is_err());
        assert!(serde_json::from_str::<Said>("{\"listening\":[],\"x\":1}").is_err());
    }

    #[test]
    fn the_service_entry_names_the_sockets_and_the_library_only_when_used() {
        let mut params: PipeParams = serde_json::from_value(serde_json::json!({
            "preset": "vm", "query_bytes": 4096, "filters": 1, "copies": 1,
            "credits": 4, "compute_us": 0, "colocate": false,
            "staged": {"role": 1, "roles": [
                {"side": "server", "flows": [0, 2]},
                {"side": "server", "flows": [1]}
            ], "peers": [[]]},
            "stages": "program"
        }))
        .unwrap();
        let lib = Path::new("/opt/libnetgap_preload.so");
        let stack = |name: &str, direct: bool| crate::preload::LibraryStack {
            name: name.into(),
            direct,
        };
        let f = facts(&stack("xdp", true), Some(lib), None, &params, &job());
        assert_eq!(
            f["sockets"],
            "kernel TCP sockets under the preload library, stack xdp with direct connections"
        );
        let f = facts(&stack("shm", false), Some(lib), None, &params, &job());
        assert_eq!(
            f["sockets"],
            "kernel TCP sockets under the preload library, stack shm"
        );
        assert_eq!(f["library"], "/opt/libnetgap_preload.so");
        assert_eq!(f["copies"], "1");
        assert_eq!(f["listen_ip"], "10.77.0.2");
        assert!(!f.contains_key("relay"));
        params.staged = None;
        let f = facts(&stack("tcp", false), None, None, &params, &job());
        assert_eq!(f["sockets"], "kernel TCP sockets");
        assert!(!f.contains_key("library") && !f.contains_key("copies"));
    }
}
