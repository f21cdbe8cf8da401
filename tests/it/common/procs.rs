//! The processes a test started and what they started: the tree under a
//! process, which of them still run, and a child killed when dropped.

/// One process: its pid, its start time (so that a reused pid is not
/// taken for it) and its command line.
pub(crate) type Proc = (u32, u64, String);

/// The processes descended from `pid`, each with its start time (so a
/// reused pid is not taken for it), its state and its command line.
pub(crate) fn descendants(pid: u32) -> Vec<Proc> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // After the command in brackets: state, ppid, ... starttime (the
        // 20th field after the brackets).
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ppid = fields.get(1).and_then(|f| f.parse::<u32>().ok());
        let start = fields.get(19).and_then(|f| f.parse::<u64>().ok());
        if let (Some(ppid), Some(start)) = (ppid, start) {
            all.push((p, ppid, start));
        }
    }
    let mut out = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for &(p, ppid, start) in &all {
            if ppid == parent {
                let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                out.push((p, start, cmdline));
                parents.push(p);
            }
        }
    }
    out
}

/// Those of `procs` that still run (a zombie has ended).
pub(crate) fn still_running(procs: &[Proc]) -> Vec<Proc> {
    procs
        .iter()
        .filter(|(p, start, _)| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.first() != Some(&"Z") && fields.get(19) == Some(&start.to_string().as_str())
        })
        .cloned()
        .collect()
}

/// A process of a test, killed and reaped when dropped (also when the test
/// fails).
pub(crate) struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child asked to stop (TERM, then KILL after five seconds) and reaped
/// when dropped, so a server under test can end as it would.
#[cfg(feature = "xdp")]
pub(crate) struct Terminated(pub std::process::Child);

#[cfg(feature = "xdp")]
impl Drop for Terminated {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, not yet reaped.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
