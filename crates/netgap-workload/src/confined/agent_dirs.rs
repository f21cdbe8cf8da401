//! The agent's run directory under the base: one per agent, named by its
//! process, removed when unused, and the directories and stripe files
//! of dead agents swept.

use super::{euid, ConfinedError, Dir};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Whether a process `pid` runs (or exists as another user's).
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// The pid a name `PREFIX<pid>-...` carries, if it has that form.
pub(crate) fn pid_in_name(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}

/// The default base of an agent's run directory: `/var/lib/netgap` as
/// root; else `$XDG_RUNTIME_DIR/netgap` when that is set, or
/// `/tmp/netgap-<uid>`.
pub fn default_run_base() -> PathBuf {
    let uid = euid();
    if uid == 0 {
        return PathBuf::from("/var/lib/netgap");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_absolute() => Path::new(&d).join("netgap"),
        _ => PathBuf::from(format!("/tmp/netgap-{uid}")),
    }
}

/// The prefix of an agent's directory under the base.
const AGENT_PREFIX: &str = "agent-";

/// An agent's directories: its run directory (`agent-<pid>-<nonce>` under
/// the base, made when first needed and removed when nothing of the
/// agent's is in it any more) and the directory pio's stripes go under.
#[derive(Debug)]
pub struct AgentDirs {
    base_path: PathBuf,
    /// The base, opened and checked once; what dead agents left in it was
    /// removed then.
    base: Mutex<Option<Arc<Dir>>>,
    /// The run directory while something holds it.
    current: Mutex<Weak<Dir>>,
    /// `--io-dir`, when the operator named one.
    io_dir: Option<Arc<Dir>>,
}

/// What a refused run directory base tells the operator to do.
const RUN_DIR_REMEDY: &str = "remove it or pass --run-dir DIR";

impl AgentDirs {
    /// Directories under `base` (nothing is opened yet).
    pub fn new(base: PathBuf) -> AgentDirs {
        AgentDirs {
            base_path: base,
            base: Mutex::new(None),
            current: Mutex::new(Weak::new()),
            io_dir: None,
        }
    }

    /// Puts pio's stripes under the operator's `dir` instead of the run
    /// directory, removing the stripes of agents that no longer run there.
    pub fn with_io_dir(mut self, dir: &Path) -> Result<AgentDirs, ConfinedError> {
        let d = Dir::open_operator(dir)?;
        sweep_stale_stripes(&d, 0);
        self.io_dir = Some(Arc::new(d));
        Ok(self)
    }

    /// Opens and checks the base now (making it 0711 if missing) and
    /// removes what agents that no longer run left in it; a refusal is one
    /// line. Returns how many directories of dead agents were removed.
    pub fn open_base(&self) -> Result<usize, ConfinedError> {
        let mut slot = self.base.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Ok(0);
        }
        // 0711: others may pass through to a service's own directory
        // (whose name they cannot list) but neither list nor write.
        let base = Dir::open_base(
            &self.base_path,
            "the agent's run directory base",
            RUN_DIR_REMEDY,
            0o711,
        )?;
        let mut removed = 0;
        for (name, _) in base.entries()? {
            if let Some(pid) = pid_in_name(&name, AGENT_PREFIX) {
                if !pid_alive(pid) && base.remove_all(&name).is_ok() {
                    removed += 1;
                }
            }
        }
        *slot = Some(Arc::new(base));
        Ok(removed)
    }

    /// The agent's run directory, made (0711) if nothing holds it now.
    pub(crate) fn run_dir(&self) -> Result<Arc<Dir>, ConfinedError> {
        self.open_base()?;
        let base = self
            .base
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ConfinedError::Io {
                what: "opening",
                path: self.base_path.clone(),
                source: io::Error::other("the base is not open"),
            })?;
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = cur.upgrade() {
            return Ok(d);
        }
        let name = fresh_name(&format!("{AGENT_PREFIX}{}", std::process::id()));
        let dir = Arc::new(base.fresh_subdir(&name, 0o711)?);
        *cur = Arc::downgrade(&dir);
        Ok(dir)
    }

    /// The directory pio's stripes go under: `--io-dir`, else the run
    /// directory.
    pub(crate) fn io_dir(&self) -> Result<Arc<Dir>, ConfinedError> {
        match &self.io_dir {
            Some(d) => Ok(Arc::clone(d)),
            None => self.run_dir(),
        }
    }
}

/// A name `PREFIX-<nonce>` not used before by this process (the nonce
/// mixes the clock with a counter; `mkdirat` refuses one that exists).
pub(crate) fn fresh_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{prefix}-{:x}{:x}",
        nanos & 0xffff_ffff_ffff,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The prefix of pio's stripe files: `netgap-pio-<agentpid>-<n>`.
pub(crate) const STRIPE_PREFIX: &str = "netgap-pio-";

/// Removes, in `dir` and its subdirectories (a few levels, never following
/// a link), the stripe files of agents that no longer run. Returns how
/// many were removed.
pub(crate) fn sweep_stale_stripes(dir: &Dir, depth: usize) -> usize {
    let Ok(entries) = dir.entries() else {
        return 0;
    };
    let mut removed = 0;
    for (name, is_dir) in entries {
        if is_dir {
            if depth < 8 {
                if let Ok(sub) = dir.open_subdir(&name) {
                    removed += sweep_stale_stripes(&sub, depth + 1);
                }
            }
        } else if let Some(pid) = pid_in_name(&name, STRIPE_PREFIX) {
            if !pid_alive(pid) && dir.remove_file(&name).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn an_agents_run_directory_goes_when_unused_and_dead_agents_directories_are_swept() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("runs");
        std::fs::create_dir(&base).unwrap();
        // What an agent that no longer runs left (pid 0 never names one;
        // a pid past the kernel's maximum never runs).
        let dead = base.join("agent-4194999-1");
        std::fs::create_dir_all(dead.join("nginx-1")).unwrap();
        std::fs::write(dead.join("nginx-1/nginx.conf"), b"x").unwrap();
        let dirs = AgentDirs::new(base.clone());
        let run = dirs.run_dir().unwrap();
        assert!(!dead.exists());
        let again = dirs.run_dir().unwrap();
        assert_eq!(run.path(), again.path());
        let md = std::fs::metadata(run.path()).unwrap();
        assert_eq!(md.uid(), euid());
        let path = run.path().to_path_buf();
        drop((run, again));
        assert!(!path.exists());
        assert!(base.exists());
    }

    #[test]
    fn stale_stripes_of_dead_agents_are_removed_and_live_ones_kept() {
        let t = tempfile::tempdir().unwrap();
        let io = t.path();
        std::fs::create_dir(io.join("sub")).unwrap();
        std::fs::write(io.join("sub/netgap-pio-4194999-0"), b"x").unwrap();
        let mine = format!("netgap-pio-{}-0", std::process::id());
        std::fs::write(io.join(&mine), b"x").unwrap();
        std::fs::write(io.join("unrelated"), b"x").unwrap();
        let d = Dir::open_operator(io).unwrap();
        assert_eq!(sweep_stale_stripes(&d, 0), 1);
        assert!(io.join(&mine).exists() && io.join("unrelated").exists());
        assert!(!io.join("sub/netgap-pio-4194999-0").exists());
    }
}
