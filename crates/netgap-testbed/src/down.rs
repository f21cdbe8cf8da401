//! `testbed down`: everything of a testbed found and removed.

use crate::agents::{is_our_agent, stop_processes};
use crate::command::{ip, own_netns, preflight};
use crate::request::check_name;
use crate::state::{check_state, read_state, state_root};
use crate::{state_dir, TestbedError, TestbedLock};

/// Removes the testbed (`netgap testbed down`), and its lock file once
/// everything else is gone.
pub fn down(name: &str) -> Result<Removed, TestbedError> {
    check_name(name)?;
    preflight()?;
    let lock = TestbedLock::acquire(name, "netgap testbed down")?;
    let removed = teardown(name)?;
    lock.remove_file_on_release();
    Ok(removed)
}

/// What `down` removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Namespaces deleted.
    pub namespaces: usize,
    /// Processes stopped (agents, and anything else left in a namespace).
    pub processes: usize,
    /// Whether the state directory is gone.
    pub state_dir_gone: bool,
}

/// Stops the agents (their pid files, then any process left in a testbed
/// namespace), deletes the namespaces (which deletes their links) and the
/// state directory. Works from what exists, so also after a crash.
pub(crate) fn teardown(name: &str) -> Result<Removed, TestbedError> {
    let dir = state_dir(name);
    check_state(name)?;
    let mut pids: Vec<i32> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "pid") {
                let pid = read_state(&path)
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok());
                // Only a netgap agent of this testbed: the pid may have been
                // reused since a crash.
                if let Some(pid) = pid.filter(|&p| is_our_agent(p, &dir)) {
                    pids.push(pid);
                }
            }
        }
    }
    let namespaces = own_netns(name)?;
    for ns in &namespaces {
        if let Ok(out) = ip(&["netns", "pids", ns]) {
            pids.extend(out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    // This process may have a thread in a host's namespace (a run that
    // played a testbed host); it never stops itself.
    let own = i32::try_from(std::process::id()).unwrap_or(-1);
    pids.retain(|&p| p != own);
    stop_processes(&pids);
    let mut errors = Vec::new();
    for ns in &namespaces {
        if let Err(e) = ip(&["netns", "del", ns]) {
            errors.push(e.to_string());
        }
    }
    if dir.exists() {
        // Relative to the root's descriptor, never following a link.
        let removed = state_root().and_then(|root| root.remove_all(name).map_err(Into::into));
        if let Err(e) = removed {
            errors.push(e.to_string());
        }
    }
    match errors.first() {
        None => Ok(Removed {
            namespaces: namespaces.len(),
            processes: pids.len(),
            state_dir_gone: !dir.exists(),
        }),
        Some(e) => Err(TestbedError::Command {
            cmd: "testbed down".into(),
            detail: e.clone(),
        }),
    }
}
