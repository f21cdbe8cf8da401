//! Real server programs on a host: nginx, Apache httpd and gmond, started
//! by an agent for a workload's role (`web`, `gather`) and stopped with it.
//!
//! An agent starts only the programs named here, and only when it was
//! started with `--allow-services`: the wire carries a service's name from
//! this fixed list and typed, range-checked parameters, never a command or
//! a configuration. The agent writes each configuration itself into a
//! fresh directory of its own ([`RunDir`], under [`base_dir`]), runs the
//! program in the foreground in a process group of its own (killed as a
//! group, with `PR_SET_PDEATHSIG` so the program dies with the thread that
//! keeps it), waits until it answers, and on [`Running`]'s drop stops the
//! group and removes the directory. A program that is not installed is one
//! line naming the Debian package to install.

pub mod apache;
pub mod gmond;
pub mod nginx;
pub mod user;

use netgap_core::record::ServiceRecord;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a started program may take to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a program may take to exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a service could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
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
        detail: String,
        /// The end of its log.
        log: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ServiceError {
    let what = what.into();
    move |source| ServiceError::Io { what, source }
}

/// The directory under which an agent makes its services' run
/// directories: `netgap-services` in the system's temporary directory,
/// readable by all (the servers' workers read their files as `www-data`).
pub fn base_dir() -> PathBuf {
    std::env::temp_dir().join("netgap-services")
}

/// Removes the run directories under [`base_dir`] left by an agent that
/// was killed (its programs died with it, in their PID namespaces): each
/// directory is named after its agent's pid, and one whose agent no longer
/// runs is removed. Returns how many were removed.
pub fn sweep_stale() -> usize {
    let Ok(entries) = std::fs::read_dir(base_dir()) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if !alive && is_dir && std::fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// A fresh directory for one service of one role, removed with everything
/// in it when dropped.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Makes a new directory for `service` under [`base_dir`]; it never
    /// reuses one that exists.
    pub fn new(service: &str) -> Result<RunDir, ServiceError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = base_dir();
        std::fs::create_dir_all(&base).map_err(io_err(format!("making {}", base.display())))?;
        set_mode(&base, 0o755)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = base.join(format!(
            "{service}-{}-{}-{nanos:x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path).map_err(io_err(format!("making {}", path.display())))?;
        let dir = RunDir { path };
        set_mode(&dir.path, 0o755)?;
        Ok(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `text` to `name` in the directory, readable by all.
    pub fn write(&self, name: &str, text: &[u8]) -> Result<PathBuf, ServiceError> {
        let p = self.path.join(name);
        std::fs::write(&p, text).map_err(io_err(format!("writing {}", p.display())))?;
        set_mode(&p, 0o644)?;
        Ok(p)
    }

    /// Makes the subdirectory `name`, readable by all.
    pub fn subdir(&self, name: &str) -> Result<PathBuf, ServiceError> {
        let p = self.path.join(name);
        std::fs::create_dir(&p).map_err(io_err(format!("making {}", p.display())))?;
        set_mode(&p, 0o755)?;
        Ok(p)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Sets the permission bits of `path`.
pub fn set_mode(path: &Path, mode: u32) -> Result<(), ServiceError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_err(format!("setting the mode of {}", path.display())))
}

/// An installed program: its path and version line.
#[derive(Debug, Clone)]
pub struct Program {
    /// Where it is.
    pub path: PathBuf,
    /// Its version line (`nginx version: nginx/1.22.1`).
    pub version: String,
}

/// Finds `program` on the usual system paths and reads its version with
/// `version_arg`; not found is one line naming `package`.
pub fn find_program(
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
pub fn free_tcp_port(ip: IpAddr) -> Result<u16, ServiceError> {
    let l = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(io_err(format!("finding a free TCP port on {ip}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(io_err("reading a free port"))
}

/// A UDP port on `ip` that nothing uses now.
pub fn free_udp_port(ip: IpAddr) -> Result<u16, ServiceError> {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0))
        .map_err(io_err(format!("finding a free UDP port on {ip}")))?;
    s.local_addr()
        .map(|a| a.port())
        .map_err(io_err("reading a free port"))
}

/// This host's name as it knows itself (a testbed host's UTS name).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().chars().take(64).collect::<String>())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// How to run a service's program: its path, its arguments, and the
/// signal that stops it cleanly.
#[derive(Debug, Clone)]
pub struct Launch {
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
pub struct Running {
    name: &'static str,
    /// The signal that asks the program to stop.
    stop_signal: libc::c_int,
    /// The program's pid, which is also its process group's id.
    pgid: i32,
    /// The program's exit status, from the thread that keeps it.
    exited: mpsc::Receiver<ExitStatus>,
    /// What the record says of it.
    record: ServiceRecord,
    /// The program's log (its stdout and stderr) in the run directory.
    log: PathBuf,
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
    /// as long as it does, confined as [`crate::confine`] says: in a PID
    /// namespace of its own (as root; a user and PID namespace when not
    /// root, where the host allows it), so that when the agent ends, even
    /// killed, the kernel ends the program and every worker it started. A
    /// root agent's program runs as [`user::ServiceUser`].
    pub fn spawn(
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
            .map(|u| crate::confine::RunAs {
                uid: u.uid,
                gid: u.gid,
            });
        let mut cmd = crate::confine::command(&launch.program, &launch.args, run_as);
        let log = dir.path().join(format!("{name}.log"));
        let out =
            std::fs::File::create(&log).map_err(io_err(format!("making {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err(format!("opening {}", log.display())))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.current_dir(dir.path());
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
            record,
            log,
            dir,
        })
    }

    /// What the record says of the program.
    pub fn record(&self) -> &ServiceRecord {
        &self.record
    }

    /// The record's facts, for what the workload prepared for the program.
    pub fn facts_mut(&mut self) -> &mut std::collections::BTreeMap<String, String> {
        &mut self.record.facts
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of the program's log, for an error.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        if tail.is_empty() {
            "(nothing)".into()
        } else {
            tail.chars().take(600).collect()
        }
    }

    /// Waits until `probe` succeeds against `addr` (at most
    /// [`START_TIMEOUT`], or until `stop`), failing early when the program
    /// exits. `extra_log` names another log file to quote on failure.
    pub fn wait_answering(
        &self,
        addr: SocketAddr,
        stop: &crate::workload::role::Stop,
        extra_log: Option<&Path>,
        mut probe: impl FnMut(SocketAddr) -> Result<(), String>,
    ) -> Result<(), ServiceError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let log = |this: &Running| {
            let mut t = this.log_tail();
            if let Some(p) = extra_log {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                if let Some(l) = text.lines().rev().find(|l| !l.trim().is_empty()) {
                    t = format!("{t} | {}", l.chars().take(300).collect::<String>());
                }
            }
            t
        };
        let mut last;
        loop {
            if let Ok(status) = self.exited.try_recv() {
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
        let ended = self.exited.recv_timeout(STOP_TIMEOUT).is_ok();
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

/// Sends an HTTP/1.1 GET of `path` to `addr` and checks for a 200 answer:
/// the probe that says a web server is up.
pub fn http_probe(addr: SocketAddr, path: &str) -> Result<(), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&head[..n]);
    if line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(format!(
            "answered {:?}",
            line.lines().next().unwrap_or_default()
        ))
    }
}

/// Reads everything `addr` sends until it closes, at most `max_bytes`.
pub fn read_all(addr: SocketAddr, max_bytes: usize) -> Result<Vec<u8>, String> {
    let s =
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.take(max_bytes as u64)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_one_line_naming_its_package() {
        let e = find_program("netgap-no-such-server", "netgap-pkg", "-v").unwrap_err();
        let line = e.to_string();
        assert!(line.contains("apt-get install netgap-pkg"), "{line}");
        assert_eq!(line.lines().count(), 1);
    }

    #[test]
    fn a_run_directory_is_fresh_readable_and_removed_with_everything_in_it() {
        let a = RunDir::new("test").unwrap();
        let b = RunDir::new("test").unwrap();
        assert_ne!(a.path(), b.path());
        let f = a.write("x.conf", b"x").unwrap();
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(a.path().starts_with(base_dir()));
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!f.exists() && !path.exists());
        // A live agent's directory (this process's) is not swept.
        sweep_stale();
        assert!(b.path().exists());
    }
}
