//! Real server programs on a host: nginx, Apache httpd and gmond, started
//! by an agent for a workload's role (`web`, `gather`) and stopped with it.
//!
//! An agent starts only the programs named here, and only when it was
//! started with `--allow-services`: the wire carries a service's name from
//! this fixed list and typed, range-checked parameters, never a command or
//! a configuration. The agent writes each configuration itself into a
//! fresh directory of its own ([`RunDir`], in the agent's run directory,
//! every file made relative to the directory's descriptor and, as root,
//! handed to the unprivileged [`ServiceUser`] the program runs as), runs the
//! program in the foreground in a process group of its own (killed as a
//! group, with `PR_SET_PDEATHSIG` so the program dies with the thread that
//! keeps it), waits until it answers, and on [`Running`]'s drop stops the
//! group and removes the directory. A program that is not installed is one
//! line naming the Debian package to install.
//!
//! A web server is one module implementing [`WebServer`] plus one line in
//! [`web_servers`]: `web`'s `--server` choices, its help, the refusals of
//! a server's own limits and the start all come from there.

pub(crate) mod apache;
pub(crate) mod gmond;
pub(crate) mod nginx;
pub(crate) mod user;

use crate::confined::{AgentDirs, Dir};
use netgap_core::record::ServiceRecord;
use netgap_proto::workload::{MAX_OUTCOME_EVIDENCE_LINES, MAX_OUTCOME_EVIDENCE_LINE_BYTES};
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use user::ServiceUser;

/// How long a started program may take to answer.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a program may take to exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a service could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    /// The agent was not started with `--allow-services`.
    #[error("this agent does not start server programs; start it with `netgap serve --allow-services` (a testbed's agents have it)")]
    NotAllowed,
    /// The program is not installed.
    #[error("{program} is not installed on this host; install the Debian package {package} (apt-get install {package})")]
    NotInstalled {
        /// The program looked for.
        program: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// A file or directory of the run could not be made, or a system call
    /// failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: io::Error,
    },
    /// The program exited before it answered.
    #[error("{name} exited at start ({status}); its log says: {log}")]
    Exited {
        /// The service.
        name: &'static str,
        /// Its exit status.
        status: String,
        /// The end of its log.
        log: String,
    },
    /// The program cannot serve the point as asked (a limit of the
    /// host, or of its configuration).
    #[error("{0}")]
    Refused(String),
    /// The program did not answer in time.
    #[error("{name} did not answer on {addr} within {secs} s ({detail}); its log says: {log}")]
    NoAnswer {
        /// The service.
        name: &'static str,
        /// Where it was asked.
        addr: SocketAddr,
        /// The time allowed, s.
        secs: u64,
        /// The last failure.
        detail: ProbeError,
        /// The end of its log.
        log: String,
    },
}

/// What a web server is started with for one `web` point.
#[derive(Debug)]
pub(crate) struct WebStart<'a> {
    /// Its fresh run directory (it holds the file set's directory too).
    pub dir: RunDir,
    /// The directory of the file set it serves.
    pub docroot: &'a Path,
    /// Where it listens.
    pub listen: SocketAddr,
    /// Worker processes (children) asked for, at least 1.
    pub workers: u32,
    /// Whether the run named the workers (`--server-workers`), so the
    /// server may not add more.
    pub workers_fixed: bool,
    /// Most workers a run may ask for.
    pub max_workers: u32,
    /// Clients of the point.
    pub clients: u64,
    /// Files of the set.
    pub files: u64,
}

/// A web server `web` can start on its first host.
pub(crate) trait WebServer: Sync {
    /// Its name on the command line (`--server`), on the wire and in
    /// records.
    fn name(&self) -> &'static str;
    /// How `web --server`'s help names it (with its Debian package).
    fn help(&self) -> &'static str;
    /// How `web --server-workers`'s help names its workers.
    fn workers_help(&self) -> &'static str;
    /// Refuses, in one line without the workload's name, `clients` past
    /// what its configuration can serve with `workers` workers (0: as many
    /// as it sizes for the clients); `None` when it serves them.
    fn refuse_clients(&self, clients: u64, workers: u32) -> Option<String> {
        let _ = (clients, workers);
        None
    }
    /// Starts it; returns once it runs (not yet answering).
    fn start(&self, start: WebStart<'_>) -> Result<Running, ServiceError>;
}

/// Every web server, the default first.
pub(crate) fn web_servers() -> &'static [&'static dyn WebServer] {
    &[&nginx::Nginx, &apache::Apache]
}

/// The web server called `name`, if there is one.
pub(crate) fn web_server(name: &str) -> Option<&'static dyn WebServer> {
    web_servers().iter().copied().find(|s| s.name() == name)
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ServiceError {
    let what = what.into();
    move |source| ServiceError::Io { what, source }
}

/// A fresh directory for one service of one role, in the agent's run
/// directory ([`crate::confined::AgentDirs`]), removed with everything in
/// it when dropped. The agent writes every file in it relative to the
/// directory's descriptor; when the agent is root the directory is then
/// handed (`fchown` on the descriptor) to the [`ServiceUser`] the program
/// runs as, mode 0700, so the program reads only what the agent wrote.
#[derive(Debug)]
pub(crate) struct RunDir {
    dir: Dir,
    /// Who the program runs as: `None`, the agent's own user.
    user: Option<ServiceUser>,
    /// The agent's run directory, held while this one is in it.
    _agent: Arc<Dir>,
    /// Environment the program starts with ([`RunDir::preload`]).
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The preload library's log, when the program runs under it
    /// ([`RunDir::preload`]), read through this descriptor.
    library_log: Option<File>,
}

impl RunDir {
    /// Makes a new directory (0700) for `service` in the agent's run
    /// directory; it never reuses one that exists.
    pub(crate) fn new(dirs: &AgentDirs, service: &str) -> Result<RunDir, ServiceError> {
        let user = ServiceUser::for_agent().map_err(|e| ServiceError::Io {
            what: format!("choosing the user {service} runs as"),
            source: io::Error::other(e),
        })?;
        let agent = dirs.run_dir().map_err(confined_err)?;
        let dir = agent
            .fresh_subdir(&crate::confined::fresh_name(service), 0o700)
            .map_err(confined_err)?;
        Ok(RunDir {
            dir,
            user,
            _agent: agent,
            env: Vec::new(),
            library_log: None,
        })
    }

    /// The directory's path: for the program's command line and its
    /// configuration, never reopened by the agent.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The user the program runs as, when not the agent's own.
    #[cfg(test)]
    pub(crate) fn user(&self) -> Option<&ServiceUser> {
        self.user.as_ref()
    }

    /// The user and group names the program's configuration switches to,
    /// when the agent is root: ([`ServiceUser`]'s name, its group's name).
    pub(crate) fn user_names(&self) -> Option<(String, String)> {
        let u = self.user.as_ref()?;
        let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(u.gid))
            .ok()
            .flatten()
            .map_or_else(|| format!("#{}", u.gid), |g| g.name);
        Some((u.name.clone(), group))
    }

    /// Writes `text` to the new file `name` in the directory, readable by
    /// all and owned by the agent.
    pub(crate) fn write(&self, name: &str, text: &[u8]) -> Result<PathBuf, ServiceError> {
        self.dir
            .write_file(name, text, 0o644)
            .map_err(confined_err)?;
        Ok(self.dir.path().join(name))
    }

    /// Makes the new subdirectory `name`, readable by all and owned by the
    /// agent, for files the agent writes into it.
    pub(crate) fn subdir(&self, name: &str) -> Result<Dir, ServiceError> {
        let mut d = self.dir.fresh_subdir(name, 0o755).map_err(confined_err)?;
        // It goes with the run directory.
        d.keep();
        Ok(d)
    }

    /// Creates the new file `name` (0600) that the program writes to (its
    /// own log), owned by the user it runs as; the agent keeps the
    /// descriptor to read it.
    pub(crate) fn service_file(&self, name: &str) -> Result<File, ServiceError> {
        let f = self.dir.create_file(name, 0o600).map_err(confined_err)?;
        if let Some(u) = &self.user {
            rustix::fs::fchown(
                &f,
                Some(rustix::fs::Uid::from_raw(u.uid)),
                Some(rustix::fs::Gid::from_raw(u.gid)),
            )
            .map_err(|e| ServiceError::Io {
                what: format!(
                    "handing {} to {}",
                    self.dir.path().join(name).display(),
                    u.name
                ),
                source: e.into(),
            })?;
        }
        Ok(f)
    }

    /// Creates the program's output log `NAME.log` (0600, the agent's): the
    /// program writes it through the descriptor it inherits.
    pub(crate) fn log_file(&self, name: &str) -> Result<File, ServiceError> {
        self.dir
            .create_file(&format!("{name}.log"), 0o600)
            .map_err(confined_err)
    }

    /// Runs the program under netgap's preload sockets library for
    /// `stack` (`shm`, or `xdp`: also through the host's relay, directly
    /// when it asks): it starts with the library's environment
    /// ([`crate::preload::LibraryStack::env`]), its log in this directory
    /// (`preload.log`, the program's user's). Refused in one line when the
    /// library is missing.
    pub(crate) fn preload(
        &mut self,
        stack: &crate::preload::LibraryStack,
    ) -> Result<(), ServiceError> {
        let library =
            crate::preload::library_path().map_err(|e| ServiceError::Refused(e.to_string()))?;
        self.library_log = Some(self.service_file("preload.log")?);
        self.env
            .extend(stack.env(&library, &self.dir.path().join("preload.log")));
        Ok(())
    }

    /// Hands the directory to the user the program runs as, once the agent
    /// wrote everything in it; nothing to do when that is the agent's user.
    pub(crate) fn hand_over(&self) -> Result<(), ServiceError> {
        if let Some(u) = &self.user {
            self.dir.chown(u.uid, u.gid).map_err(confined_err)?;
        }
        Ok(())
    }
}

fn confined_err(e: crate::confined::ConfinedError) -> ServiceError {
    ServiceError::Io {
        what: "the service's run directory".into(),
        source: io::Error::other(e.to_string()),
    }
}

/// The last non-empty lines of a log read through its descriptor (from
/// its last 64 KiB), joined, for an error.
fn tail_of(file: &File) -> String {
    last_lines(file, 3).join(" | ")
}

/// The last `most` non-empty lines of a log read through its descriptor
/// (from its last 64 KiB), in its order.
fn last_lines(file: &File, most: usize) -> Vec<String> {
    use std::os::unix::fs::FileExt;
    const WINDOW: u64 = 64 * 1024;
    let len = file.metadata().map_or(0, |m| m.len());
    let start = len.saturating_sub(WINDOW);
    let mut buf = vec![0u8; (len - start) as usize];
    let n = file.read_at(&mut buf, start).unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(most)..]
        .iter()
        .map(|l| (*l).to_string())
        .collect()
}

/// One line of a role's evidence (`WorkloadOutcome::evidence`): `line`
/// of the log `log`, cut on a character's edge to what an outcome may
/// carry.
pub(crate) fn evidence_line(log: &str, line: &str) -> String {
    format!("{log}: {line}")
        .char_indices()
        .take_while(|(i, c)| i + c.len_utf8() <= MAX_OUTCOME_EVIDENCE_LINE_BYTES)
        .map(|(_, c)| c)
        .collect()
}

/// Lines of a server's own error log in its evidence.
const EVIDENCE_ERROR_LOG_LINES: usize = 4;
/// Lines of a program's output (its stdout and stderr) in its evidence.
const EVIDENCE_OUTPUT_LINES: usize = 1;

/// An installed program: its path and version line.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    /// Where it is.
    pub path: PathBuf,
    /// Its version line (`nginx version: nginx/1.22.1`).
    pub version: String,
}

/// Finds `program` on the usual system paths and reads its version with
/// `version_arg`; not found is one line naming `package`.
pub(crate) fn find_program(
    program: &'static str,
    package: &'static str,
    version_arg: &str,
) -> Result<Program, ServiceError> {
    let mut dirs: Vec<PathBuf> = ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    let path = dirs
        .into_iter()
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or(ServiceError::NotInstalled { program, package })?;
    let out = Command::new(&path)
        .arg(version_arg)
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("running {} {version_arg}", path.display())))?;
    let text = [out.stdout, out.stderr].concat();
    let version = String::from_utf8_lossy(&text)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("unknown")
        .chars()
        .take(200)
        .collect();
    Ok(Program { path, version })
}

/// A TCP port on `ip` that nothing listens on now (the system picks it;
/// the program binds it a moment later).
pub(crate) fn free_tcp_port(ip: IpAddr) -> Result<u16, ServiceError> {
    let l = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(io_err(format!("finding a free TCP port on {ip}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(io_err("reading a free port"))
}

/// A UDP port on `ip` that nothing uses now.
pub(crate) fn free_udp_port(ip: IpAddr) -> Result<u16, ServiceError> {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0))
        .map_err(io_err(format!("finding a free UDP port on {ip}")))?;
    s.local_addr()
        .map(|a| a.port())
        .map_err(io_err("reading a free port"))
}

/// This host's name as it knows itself (a testbed host's UTS name).
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().chars().take(64).collect::<String>())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// How to run a service's program: its path, its arguments, and the
/// signal that stops it cleanly.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<std::ffi::OsString>,
    /// SIGTERM for a program that shuts down on it; SIGKILL for one with
    /// nothing to save (gmond), which as a namespace's first process would
    /// ignore a signal it has no handler for.
    pub stop_signal: libc::c_int,
}

/// A program running for a role. Dropping it stops its process group
/// (SIGTERM, then SIGKILL) and removes its run directory.
pub(crate) struct Running {
    name: &'static str,
    /// The signal that asks the program to stop.
    stop_signal: libc::c_int,
    /// The program's pid, which is also its process group's id.
    pgid: i32,
    /// The program's exit status, from the thread that keeps it.
    exited: mpsc::Receiver<ExitStatus>,
    /// That status, once taken from `exited`.
    exit: std::sync::Mutex<Option<ExitStatus>>,
    /// What the record says of it.
    record: ServiceRecord,
    /// The program's log (its stdout and stderr) in the run directory,
    /// read through this descriptor, never reopened by path.
    log: File,
    /// Removed after the program stopped.
    dir: RunDir,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("name", &self.name)
            .field("pgid", &self.pgid)
            .field("dir", &self.dir)
            .finish()
    }
}

impl Running {
    /// Starts `launch` (the program in the foreground, with its own
    /// configuration from `dir`) in a process group of its own, its output
    /// to a log in `dir`. The program is spawned from a thread that lives
    /// as long as it does, confined as [`crate::tether`] says: in a PID
    /// namespace of its own (as root; a user and PID namespace when not
    /// root, where the host allows it), so that when the agent ends, even
    /// killed, the kernel ends the program and every worker it started. A
    /// root agent's program runs as [`user::ServiceUser`].
    pub(crate) fn spawn(
        name: &'static str,
        launch: Launch,
        dir: RunDir,
        record: ServiceRecord,
    ) -> Result<Running, ServiceError> {
        let run_as = user::ServiceUser::for_agent()
            .map_err(|e| ServiceError::Io {
                what: format!("choosing the user {name} runs as"),
                source: io::Error::other(e),
            })?
            .map(|u| crate::tether::RunAs {
                uid: u.uid,
                gid: u.gid,
            });
        let mut cmd = crate::tether::command(&launch.program, &launch.args, run_as);
        let log = dir.log_file(name)?;
        let out = log
            .try_clone()
            .map_err(io_err(format!("opening {name}'s log")))?;
        let err = log
            .try_clone()
            .map_err(io_err(format!("opening {name}'s log")))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.current_dir(dir.path());
        cmd.envs(dir.env.iter().map(|(k, v)| (k, v)));
        let (pid_tx, pid_rx) = mpsc::channel();
        let (exit_tx, exited) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("{name} keeper"))
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = pid_tx.send(Ok(child.id()));
                    if let Ok(status) = child.wait() {
                        let _ = exit_tx.send(status);
                    }
                }
                Err(e) => {
                    let _ = pid_tx.send(Err(e));
                }
            })
            .map_err(io_err(format!("starting the thread that keeps {name}")))?;
        let pid = pid_rx
            .recv()
            .map_err(|_| ServiceError::Io {
                what: format!("starting {name}"),
                source: io::Error::other("the keeper thread ended"),
            })?
            .map_err(io_err(format!("starting {}", record.program)))?;
        Ok(Running {
            name,
            stop_signal: launch.stop_signal,
            pgid: i32::try_from(pid).unwrap_or(i32::MAX),
            exited,
            exit: std::sync::Mutex::new(None),
            record,
            log,
            dir,
        })
    }

    /// What the record says of the program.
    pub(crate) fn record(&self) -> &ServiceRecord {
        &self.record
    }

    /// The record's facts, for what the workload prepared for the program.
    pub(crate) fn facts_mut(&mut self) -> &mut std::collections::BTreeMap<String, String> {
        &mut self.record.facts
    }

    /// The run directory.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the program's logs say at the end of a repetition, for the
    /// coordinator to show with a point whose transactions failed: its exit
    /// status if it ended, the last lines of `error_log` (the program's
    /// own, made with [`RunDir::service_file`]) and of its output, and the
    /// preload library's notes ([`crate::preload::LogSummary::notes`]) when
    /// it runs under the library; at most [`MAX_OUTCOME_EVIDENCE_LINES`],
    /// each naming its log. Read through the descriptors the agent kept.
    pub(crate) fn evidence(&self, error_log: Option<&File>) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(status) = self.exit_status() {
            let ended = format!("exited before the run's end ({status})");
            lines.push(evidence_line(self.name, &ended));
        }
        if let Some(f) = error_log {
            for l in last_lines(f, EVIDENCE_ERROR_LOG_LINES) {
                lines.push(evidence_line("error.log", &l));
            }
        }
        for l in last_lines(&self.log, EVIDENCE_OUTPUT_LINES) {
            lines.push(evidence_line(&format!("{} output", self.name), &l));
        }
        if let Some(f) = &self.dir.library_log {
            for l in crate::preload::LogSummary::read(f).notes {
                lines.push(evidence_line("preload.log", &l));
            }
        }
        lines.truncate(MAX_OUTCOME_EVIDENCE_LINES);
        lines
    }

    /// The program's exit status, if it exited.
    fn exit_status(&self) -> Option<ExitStatus> {
        let mut seen = self
            .exit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.is_none() {
            *seen = self.exited.try_recv().ok();
        }
        *seen
    }

    /// The last lines of the program's log, for an error.
    pub(crate) fn log_tail(&self) -> String {
        let tail = tail_of(&self.log);
        if tail.is_empty() {
            "(nothing)".into()
        } else {
            tail.chars().take(600).collect()
        }
    }

    /// Waits until `probe` succeeds against `addr` (at most
    /// [`START_TIMEOUT`], or until `stop`), failing early when the program
    /// exits. `extra_log` is another log (the program's own, made with
    /// [`RunDir::service_file`]) to quote on failure, read through its
    /// descriptor.
    pub(crate) fn wait_answering(
        &self,
        addr: SocketAddr,
        stop: &crate::role::Stop,
        extra_log: Option<&File>,
        mut probe: impl FnMut(SocketAddr) -> Result<(), ProbeError>,
    ) -> Result<(), ServiceError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let log = |this: &Running| {
            let mut t = this.log_tail();
            if let Some(f) = extra_log {
                if let Some(l) = tail_of(f).rsplit(" | ").next().filter(|l| !l.is_empty()) {
                    t = format!("{t} | {}", l.chars().take(300).collect::<String>());
                }
            }
            t
        };
        let mut last;
        loop {
            if let Some(status) = self.exit_status() {
                return Err(ServiceError::Exited {
                    name: self.name,
                    status: status.to_string(),
                    log: log(self),
                });
            }
            match probe(addr) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            if Instant::now() >= deadline || stop.is_set() {
                return Err(ServiceError::NoAnswer {
                    name: self.name,
                    addr,
                    secs: START_TIMEOUT.as_secs(),
                    detail: last,
                    log: log(self),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// CPU time, ns, the kernel has accounted so far to the program's
    /// processes ([`tree_cpu_ns`] from the process that started it): every
    /// worker and child, whichever user they switched to.
    pub(crate) fn cpu_ns(&self) -> u64 {
        u32::try_from(self.pgid).map_or(0, tree_cpu_ns)
    }

    fn signal(&self, sig: libc::c_int) {
        if self.pgid > 1 {
            // SAFETY: killpg only sends a signal; the group is the one the
            // program made for itself at start (its pid), so no other
            // process group is named.
            unsafe {
                libc::killpg(self.pgid, sig);
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal(self.stop_signal);
        let ended = self.exit_status().is_some() || self.exited.recv_timeout(STOP_TIMEOUT).is_ok();
        // Workers the program left behind (or a program that did not
        // stop) go with the whole group.
        self.signal(libc::SIGKILL);
        if !ended {
            let _ = self.exited.recv_timeout(STOP_TIMEOUT);
        }
        // Give the group's last workers a moment to go before their files
        // are removed.
        let deadline = Instant::now() + STOP_TIMEOUT;
        // SAFETY: kill with signal 0 only checks whether the group exists.
        while unsafe { libc::killpg(self.pgid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One process as `/proc/PID/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    pid: u32,
    ppid: u32,
    /// utime + stime + cutime + cstime, clock ticks: its own CPU and that
    /// of the children it has reaped.
    ticks: u64,
}

/// Parses a `/proc/PID/stat` line; the command name may hold spaces and
/// parentheses, so the fields are counted after its last `)`.
fn parse_stat(stat: &str) -> Option<ProcStat> {
    let open = stat.find(" (")?;
    let pid = stat[..open].trim().parse().ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let num = |i: usize| -> Option<u64> { fields.get(i)?.parse().ok() };
    // After the name: state, ppid, ..., utime (12th), stime, cutime, cstime.
    let ticks = (11..=14).try_fold(0u64, |acc, i| Some(acc.saturating_add(num(i)?)))?;
    Some(ProcStat {
        pid,
        ppid: u32::try_from(num(1)?).ok()?,
        ticks,
    })
}

/// The clock ticks of `root` and every descendant of it among `procs`.
/// A live process's own time and what its reaped children left in its
/// `cutime`/`cstime` together count a process that ended (an Apache child
/// replaced, a worker restarted) once, in its parent.
fn tree_ticks(procs: &[ProcStat], root: u32) -> u64 {
    let mut ours = vec![root];
    let mut next = 0;
    while next < ours.len() {
        let parent = ours[next];
        ours.extend(procs.iter().filter(|p| p.ppid == parent).map(|p| p.pid));
        next += 1;
    }
    procs
        .iter()
        .filter(|p| ours.contains(&p.pid))
        .fold(0, |acc, p| acc.saturating_add(p.ticks))
}

/// CPU time, ns, of process `root` and every process it started, from
/// the kernel's accounting in `/proc` (user and system time of each live
/// process, and of the children each has reaped); 0 if none is found.
pub(crate) fn tree_cpu_ns(root: u32) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(0);
    if ticks_per_s == 0 || root == 0 {
        return 0;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let procs: Vec<ProcStat> = dir
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s))
        .collect();
    tree_ticks(&procs, root).saturating_mul(1_000_000_000) / ticks_per_s
}

/// Why one probe of a starting program failed; it is probed again until
/// it answers or its start times out ([`ServiceError::NoAnswer`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// Connecting to it failed.
    #[error(transparent)]
    Connect(io::Error),
    /// The connection's read timeout could not be set.
    #[error(transparent)]
    Timeout(io::Error),
    /// Sending the request failed.
    #[error(transparent)]
    Send(io::Error),
    /// Reading its answer failed.
    #[error(transparent)]
    Read(io::Error),
    /// A web server answered, but not 200.
    #[error("answered {line:?}")]
    NotOk {
        /// Its status line.
        line: String,
    },
    /// gmond's answer is not its XML.
    #[error(transparent)]
    Gmond(#[from] gmond::GmondError),
    /// gmond answers, but has no host with metrics yet.
    #[error("its answer names no host with metrics yet")]
    NoMetrics,
}

/// Sends an HTTP/1.1 GET of `path` to `addr` and checks for a 200 answer:
/// the probe that says a web server is up.
pub(crate) fn http_probe(addr: SocketAddr, path: &str) -> Result<(), ProbeError> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(ProbeError::Connect)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(ProbeError::Timeout)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(ProbeError::Send)?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).map_err(ProbeError::Read)?;
    let line = String::from_utf8_lossy(&head[..n]);
    if line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(ProbeError::NotOk {
            line: line.lines().next().unwrap_or_default().to_string(),
        })
    }
}

/// Reads everything `addr` sends until it closes, at most `max_bytes`.
pub(crate) fn read_all(addr: SocketAddr, max_bytes: usize) -> Result<Vec<u8>, ProbeError> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(ProbeError::Connect)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(ProbeError::Timeout)?;
    let mut out = Vec::new();
    s.take(max_bytes as u64)
        .read_to_end(&mut out)
        .map_err(ProbeError::Read)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_tree_counts_every_descendant_and_what_they_reaped_once() {
        let stat = "42 (a (b) c) S 7 42 42 0 -1 4194560 100 0 0 0 7 5 3 1 20 0 1 0 9 1000 200";
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                pid: 42,
                ppid: 7,
                ticks: 16
            })
        );
        assert_eq!(parse_stat("42 (x) S 1"), None);
        let p = |pid, ppid, ticks| ProcStat { pid, ppid, ticks };
        // 10 starts 11, which starts 12 and 13; 20 is someone else's.
        let procs = [
            p(10, 1, 1),
            p(11, 10, 2),
            p(12, 11, 4),
            p(13, 11, 8),
            p(20, 1, 100),
            p(21, 20, 200),
        ];
        assert_eq!(tree_ticks(&procs, 10), 15);
        assert_eq!(tree_ticks(&procs, 11), 14);
        assert_eq!(tree_ticks(&procs, 99), 0);
        // A shell that does nothing itself but wait for a busy child of
        // its own, then sleep: its tree holds the child's CPU, live and
        // once reaped.
        let mut sh = std::process::Command::new("/bin/sh")
            .args([
                "-c",
                "(i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done); sleep 2",
            ])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut ns = 0;
        while Instant::now() < deadline {
            ns = tree_cpu_ns(sh.id());
            if ns >= 50_000_000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = sh.kill();
        sh.wait().unwrap();
        assert!(ns >= 50_000_000, "{ns} ns");
    }

    #[test]
    fn a_programs_evidence_is_the_end_of_its_logs_and_the_librarys_notes() {
        use std::io::Write;
        let t = tempfile::tempdir().unwrap();
        let dirs = AgentDirs::new(t.path().join("runs"));
        let mut dir = RunDir::new(&dirs, "test").unwrap();
        let error_log = dir.service_file("error.log").unwrap();
        (&error_log)
            .write_all(b"one\ntwo\n\nthree\nfour\nfive\n")
            .unwrap();
        let library = dir.service_file("preload.log").unwrap();
        (&library)
            .write_all(
                b"netgap-preload[9]: fd 5: accepted connection moved to xdp via the relay\n\
                  netgap-preload[9]: fd 5: read: the relay hung up\n",
            )
            .unwrap();
        dir.library_log = Some(library);
        dir.hand_over().unwrap();
        let long = "x".repeat(2 * MAX_OUTCOME_EVIDENCE_LINE_BYTES);
        let launch = Launch {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!("echo started; echo {long}; exec sleep 30").into(),
            ],
            stop_signal: libc::SIGKILL,
        };
        let record = ServiceRecord {
            name: "test".into(),
            host: String::new(),
            program: "/bin/sh".into(),
            version: String::new(),
            listen: String::new(),
            workers: None,
            config: String::new(),
            facts: Default::default(),
        };
        let running = Running::spawn("test", launch, dir, record).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while last_lines(&running.log, 2).len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let evidence = running.evidence(Some(&error_log));
        assert_eq!(
            evidence[..4],
            [
                "error.log: two",
                "error.log: three",
                "error.log: four",
                "error.log: five"
            ]
        );
        assert!(evidence[4].starts_with("test output: xxx"), "{evidence:?}");
        assert_eq!(evidence[4].len(), MAX_OUTCOME_EVIDENCE_LINE_BYTES);
        assert_eq!(
            evidence[5..],
            ["preload.log: netgap-preload[9]: fd 5: read: the relay hung up"]
        );
        // A program that ended before the run did says so first, every
        // time it is asked.
        running.signal(libc::SIGKILL);
        while running.exit_status().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for _ in 0..2 {
            let evidence = running.evidence(Some(&error_log));
            assert!(
                evidence[0].starts_with("test: exited before the run's end ("),
                "{evidence:?}"
            );
            assert_eq!(evidence.len(), 7);
        }
    }

    #[test]
    fn a_missing_program_is_one_line_naming_its_package() {
        let e = find_program("netgap-no-such-server", "netgap-pkg", "-v").unwrap_err();
        let line = e.to_string();
        assert!(line.contains("apt-get install netgap-pkg"), "{line}");
        assert_eq!(line.lines().count(), 1);
    }

    #[test]
    fn a_run_directory_is_fresh_private_and_removed_with_everything_in_it() {
        let t = tempfile::tempdir().unwrap();
        let dirs = AgentDirs::new(t.path().join("runs"));
        let a = RunDir::new(&dirs, "test").unwrap();
        let b = RunDir::new(&dirs, "test").unwrap();
        assert_ne!(a.path(), b.path());
        let f = a.write("x.conf", b"x").unwrap();
        assert!(a.write("x.conf", b"y").is_err(), "never overwritten");
        let www = a.subdir("www").unwrap();
        assert!(www.path().starts_with(a.path()));
        let log = a.service_file("error.log").unwrap();
        {
            use std::io::Write;
            (&log).write_all(b"first\n\nlast line\n").unwrap();
        }
        assert_eq!(tail_of(&log), "first | last line");
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        a.hand_over().unwrap();
        if let Some(u) = a.user() {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(a.path()).unwrap();
            assert_eq!((m.uid(), m.gid()), (u.uid, u.gid));
            assert_eq!(std::fs::metadata(&f).unwrap().uid(), 0, "the agent's");
            assert!(a.user_names().is_some());
        }
        assert!(a.path().starts_with(t.path().join("runs")));
        let path = a.path().to_path_buf();
        drop((a, www));
        assert!(!f.exists() && !path.exists());
        assert!(b.path().exists());
        let agent = b.path().parent().unwrap().to_path_buf();
        drop(b);
        // The agent's run directory goes with the last thing in it.
        assert!(!agent.exists());
    }
}
