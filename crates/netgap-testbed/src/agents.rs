//! The testbed's agents: started in their namespaces, probed, and stopped
//! when the testbed goes.

use crate::error::io_err;
use crate::layout::relay_interface;
use crate::state::{KEY_FILE, STATE_FILE_MODE};
use crate::{AgentProbe, AgentProbeError, Params, TestbedError};
use netgap_core::hosts::HostEntry;
use netgap_workload::confined::Dir;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `up` waits for each agent to answer on its socket.
const AGENT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the agent of host `h` in its namespace, detached (own session,
/// output to its log), and records its pid.
pub(crate) fn start_agent(dir: &Dir, p: &Params, h: &HostEntry) -> Result<u32, TestbedError> {
    let log_path = dir.path().join(format!("{}.log", h.name));
    let log = dir.create_file(&format!("{}.log", h.name), STATE_FILE_MODE)?;
    let log2 = log
        .try_clone()
        .map_err(io_err(format!("opening {}", log_path.display())))?;
    let ns = h.netns.as_deref().unwrap_or_default();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(&p.agent_exe)
        .args(["serve", "--bind", &h.control, "--data-bind"])
        .arg(h.address.to_string())
        .arg("--key")
        .arg(dir.path().join(KEY_FILE))
        // The testbed's hosts are this machine's: its agents take the
        // largest workload point there is, so the scale of a run is the
        // run's choice (each agent raises its descriptor limit as needed).
        .args([
            "--max-flows",
            &netgap_proto::workload::MAX_WORKLOAD_FLOWS.to_string(),
        ])
        .arg("--allow-services");
    if let Some(dev) = relay_interface(h) {
        cmd.args(["--relay-interface", &dev]);
    }
    cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
    // The agent gets a UTS namespace of its own named after its host, so the
    // host facts it records (and every report's environment table) tell the
    // testbed's hosts apart.
    let hostname = h.name.clone().into_bytes();
    // SAFETY: setsid, unshare and sethostname are async-signal-safe system
    // calls; `hostname` was allocated before the fork and is only read. They
    // detach the agent from our terminal and process group and give it its
    // own host name; the namespace needs root, which the testbed has.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::unshare(libc::CLONE_NEWUTS) != 0
                || libc::sethostname(hostname.as_ptr().cast(), hostname.len()) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| TestbedError::Command {
        cmd: format!("ip netns exec {ns} netgap serve"),
        detail: e.to_string(),
    })?;
    let pid = child.id();
    // `ip netns exec` replaces itself with the agent: this pid is the agent.
    // The child is not waited for; it outlives `up` and init reaps it.
    drop(child);
    dir.write_file(
        &format!("{}.pid", h.name),
        format!("{pid}\n").as_bytes(),
        STATE_FILE_MODE,
    )?;
    Ok(pid)
}

/// Connects to a testbed agent with the key and shakes hands: whether it
/// answers, or why not.
pub fn probe_agent(
    h: &HostEntry,
    key_file: Option<&Path>,
    probe: &dyn AgentProbe,
) -> Result<(), AgentProbeError> {
    let addr = h
        .control_addr()
        .ok_or_else(|| AgentProbeError::BadAddress(h.control.clone()))?;
    probe
        .probe(&addr, key_file)
        .map_err(AgentProbeError::Failed)
}

pub(crate) fn wait_for_agent(
    h: &HostEntry,
    key_file: &Path,
    pid: u32,
    probe: &dyn AgentProbe,
) -> Result<(), AgentProbeError> {
    let t0 = Instant::now();
    loop {
        if !pid_alive(pid) {
            return Err(AgentProbeError::Exited);
        }
        match probe_agent(h, Some(key_file), probe) {
            Ok(()) => return Ok(()),
            Err(e) if t0.elapsed() > AGENT_START_TIMEOUT => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // A zombie still answers kill(0); /proc tells the states apart.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = state
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'));
    // SAFETY: signal 0 only checks that the process exists.
    running && unsafe { libc::kill(pid, 0) } == 0
}

/// Whether `pid` is a netgap agent serving on a socket in `dir`.
pub(crate) fn is_our_agent(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let dir = dir.to_string_lossy();
    args.iter().any(|a| *a == b"serve")
        && args
            .iter()
            .any(|a| String::from_utf8_lossy(a).contains(dir.as_ref()))
}

/// SIGTERM, up to 2 s to exit, then SIGKILL.
pub(crate) fn stop_processes(pids: &[i32]) {
    for &p in pids {
        // SAFETY: sending a signal has no memory effects here.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2)
        && pids.iter().any(|&p| u32::try_from(p).is_ok_and(pid_alive))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in pids {
        if u32::try_from(p).is_ok_and(pid_alive) {
            // SAFETY: as above.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}
