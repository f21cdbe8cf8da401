//! Tying the programs netgap starts (server programs, mpirun) and every
//! process they start to the process that started them, so that they all
//! end when it ends, however it ends (SIGKILL included).
//!
//! The first process started is in a process group of its own and has
//! `PR_SET_PDEATHSIG` (SIGKILL), so it ends with the thread that spawned
//! it. That alone does not reach the workers, daemons and ranks it starts:
//! they would be orphaned and keep running. So the program runs as the
//! first process of a PID namespace of its own, made by util-linux's
//! `unshare --pid --fork --kill-child=SIGKILL`: when `unshare` ends, its
//! child (the namespace's first process) is killed, and with it the kernel
//! kills everything in the namespace.
//!
//! - As root: a PID namespace. When the program is to run as another user,
//!   a second `unshare` inside the namespace stays root as its first
//!   process and starts the program as that user (`--setgid`, which also
//!   drops the supplementary groups, and `--setuid`); a change of user
//!   clears `PR_SET_PDEATHSIG`, so the program itself cannot be the
//!   namespace's first process.
//! - Not root: a user namespace that maps the user to itself, and a PID
//!   namespace in it (`unshare --user --map-current-user --pid`), where the
//!   kernel allows unprivileged user namespaces.
//! - Where neither can be had: the process group and `PR_SET_PDEATHSIG`
//!   only, which end the program with its starter but may leave what it
//!   started running.
//!
//! Which of these this host allows is found once, by trying it, and kept.

use std::ffi::OsStr;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// util-linux's `unshare`.
const UNSHARE: &str = "/usr/bin/unshare";

/// How the processes a program starts are tied to the process that
/// started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Confinement {
    /// A PID namespace of its own (root).
    PidNamespace,
    /// A user namespace mapping the user to itself and a PID namespace in
    /// it (not root, where unprivileged user namespaces are allowed).
    UserPidNamespace,
    /// Only a process group, its first process killed with its starter:
    /// what that process started may outlive a starter that was killed.
    ProcessGroup,
}

impl Confinement {
    /// Whether every process the program starts ends with its starter,
    /// even when the starter is killed with SIGKILL.
    #[cfg(test)]
    fn covers_descendants(self) -> bool {
        self != Confinement::ProcessGroup
    }

    /// `unshare`'s flags for it (none for a process group).
    fn unshare_flags(self) -> &'static [&'static str] {
        match self {
            Confinement::PidNamespace => &["--pid", "--fork", "--kill-child=SIGKILL"],
            Confinement::UserPidNamespace => &[
                "--user",
                "--map-current-user",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
            ],
            Confinement::ProcessGroup => &[],
        }
    }
}

/// What this host allows this process, found on the first call by running
/// `unshare` with the flags it would use, and kept.
pub(crate) fn confinement() -> Confinement {
    static FOUND: OnceLock<Confinement> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let wanted = if nix::unistd::geteuid().is_root() {
            Confinement::PidNamespace
        } else {
            Confinement::UserPidNamespace
        };
        if works(wanted) {
            wanted
        } else {
            Confinement::ProcessGroup
        }
    })
}

/// Whether `unshare` with `kind`'s flags can run `true` here.
fn works(kind: Confinement) -> bool {
    Path::new(UNSHARE).exists()
        && Command::new(UNSHARE)
            .args(kind.unshare_flags())
            .args(["--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// The user and group a program runs as, when not its starter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    /// The user id.
    pub uid: u32,
    /// The primary group id; the supplementary groups are dropped.
    pub gid: u32,
}

/// A command that runs `program` with `args` confined as `confinement`
/// allows, as `run_as` when given (only root can give it), in a process
/// group of its own whose id is the spawned process's pid.
///
/// The spawned process has `PR_SET_PDEATHSIG` (SIGKILL): it must be
/// spawned from a thread that lives as long as the program is to run. To
/// stop the program, signal the process group: `unshare`, which is the
/// spawned process when the program runs in a namespace, ignores SIGTERM
/// and SIGINT and passes on the program's exit status.
pub fn command<A: AsRef<OsStr>>(program: &Path, args: &[A], run_as: Option<RunAs>) -> Command {
    command_as(confinement(), program, args, run_as)
}

/// A command that runs `program` with `args` in a process group of its
/// own, as `run_as` when given, ended with the thread that spawns it
/// (`PR_SET_PDEATHSIG`), but in this process's PID namespace: for a
/// program that starts no processes of its own (netgap's load generator
/// under the preload library), whose peers must be allowed to take its
/// descriptors: the library's listener takes the connector's region with
/// `pidfd_getfd`, which the kernel allows only where it may trace the
/// connector (a user namespace of the connector's own would forbid it).
/// The user is set before `exec`, so the program is dumpable.
pub fn command_in_group<A: AsRef<OsStr>>(
    program: &Path,
    args: &[A],
    run_as: Option<RunAs>,
) -> Command {
    command_as(Confinement::ProcessGroup, program, args, run_as)
}

/// [`command`] with the confinement given.
fn command_as<A: AsRef<OsStr>>(
    kind: Confinement,
    program: &Path,
    args: &[A],
    run_as: Option<RunAs>,
) -> Command {
    let mut cmd;
    if kind == Confinement::ProcessGroup {
        cmd = Command::new(program);
    } else {
        cmd = Command::new(UNSHARE);
        cmd.args(kind.unshare_flags()).arg("--");
        if let Some(u) = run_as {
            // The namespace's first process stays root (its PDEATHSIG
            // survives) and starts the program as the user.
            cmd.arg(UNSHARE).args([
                "--fork".to_string(),
                "--kill-child=SIGKILL".to_string(),
                format!("--setgid={}", u.gid),
                format!("--setuid={}", u.uid),
                "--".to_string(),
            ]);
        }
        cmd.arg(program);
    }
    cmd.args(args);
    // Only in a process group of its own is the user dropped here: in a
    // namespace the inner unshare drops it.
    let drop_to = run_as.filter(|_| kind == Confinement::ProcessGroup);
    // SAFETY: between fork and exec the closure makes only system calls
    // that are async-signal-safe (setpgid, setgroups, setgid, setuid,
    // prctl), touching only the child's own attributes, and allocates
    // nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(u) = drop_to {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(u.gid) != 0
                    || libc::setuid(u.uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            // After the change of user, which would clear it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn argv(cmd: &Command) -> Vec<String> {
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn each_confinement_wraps_the_program_as_it_says() {
        let p = Path::new("/usr/sbin/nginx");
        let u = RunAs {
            uid: 65534,
            gid: 65533,
        };
        assert_eq!(
            argv(&command_as(
                Confinement::PidNamespace,
                p,
                &["-c", "x"],
                None
            )),
            [UNSHARE, "--pid", "--fork", "--kill-child=SIGKILL", "--"]
                .into_iter()
                .chain(["/usr/sbin/nginx", "-c", "x"])
                .collect::<Vec<_>>()
        );
        let as_user = argv(&command_as(Confinement::PidNamespace, p, &["-c"], Some(u)));
        assert_eq!(
            as_user[5..],
            [
                UNSHARE,
                "--fork",
                "--kill-child=SIGKILL",
                "--setgid=65533",
                "--setuid=65534",
                "--",
                "/usr/sbin/nginx",
                "-c"
            ]
        );
        let user_ns = argv(&command_as(Confinement::UserPidNamespace, p, &["-c"], None));
        assert_eq!(user_ns[1..3], ["--user", "--map-current-user"]);
        assert_eq!(user_ns[user_ns.len() - 2..], ["/usr/sbin/nginx", "-c"]);
        assert_eq!(
            argv(&command_as(Confinement::ProcessGroup, p, &["-c"], Some(u))),
            ["/usr/sbin/nginx", "-c"]
        );
    }

    #[test]
    fn a_program_in_a_group_keeps_this_pid_namespace_and_runs_as_the_user_given() {
        let root = nix::unistd::geteuid().is_root();
        let run_as = root.then_some(RunAs {
            uid: 65534,
            gid: 65534,
        });
        let out = std::thread::spawn(move || {
            command_in_group(
                Path::new("/bin/sh"),
                &["-c", "id -u; readlink /proc/self/ns/pid"],
                run_as,
            )
            .output()
            .unwrap()
        })
        .join()
        .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        let uid = lines.next().unwrap().trim().to_string();
        let expected = if root {
            "65534".to_string()
        } else {
            nix::unistd::geteuid().as_raw().to_string()
        };
        assert_eq!(uid, expected, "{text}");
        let own = std::fs::read_link("/proc/self/ns/pid").unwrap();
        assert_eq!(
            lines.next().unwrap().trim(),
            own.to_string_lossy(),
            "{text}"
        );
    }

    #[test]
    fn the_probe_finds_what_the_host_allows_and_a_confined_program_runs() {
        let kind = confinement();
        assert_eq!(kind, confinement(), "kept");
        if nix::unistd::geteuid().is_root() && Path::new(UNSHARE).exists() {
            // Root in a container without CAP_SYS_ADMIN gets no namespace.
            assert_ne!(kind, Confinement::UserPidNamespace);
        }
        // The program sees itself as the first process of its namespace.
        let out = std::thread::spawn(|| {
            command(Path::new("/bin/sh"), &["-c", "echo $$"], None)
                .output()
                .unwrap()
        })
        .join()
        .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let pid = text.lines().next().unwrap().trim();
        if kind.covers_descendants() {
            assert_eq!(pid, "1", "{text}");
        } else {
            assert_ne!(pid, "1", "{text}");
        }
    }
}
