//! CPU placement of the roles. On a small machine, one CPU or two changes
//! loopback latency by almost 2×, so the placement is chosen with `--pin` and
//! recorded in every result.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Why a thread could not be pinned.
#[derive(Debug, thiserror::Error)]
#[error("cannot pin to CPU {cpu}: {detail}")]
pub struct PinError {
    /// The CPU asked for.
    pub cpu: u32,
    /// What went wrong.
    pub detail: String,
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: u32) -> Result<(), PinError> {
    let err = |detail: String| PinError { cpu, detail };
    let mut set = CpuSet::new();
    set.set(cpu as usize).map_err(|_| {
        err(format!(
            "beyond the {} CPUs a set can hold",
            CpuSet::count()
        ))
    })?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| {
        err(format!(
            "{e} (this host has {} CPUs online)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ))
    })
}

/// The CPUs this process may run on, in increasing order; empty when the
/// kernel does not say.
pub fn allowed_cpus() -> Vec<u32> {
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .filter_map(|cpu| u32::try_from(cpu).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_to_a_missing_cpu_fails_with_the_cpu_named() {
        let e = std::thread::spawn(|| pin_current_thread(4000))
            .join()
            .expect("thread ran");
        assert!(e.unwrap_err().to_string().contains("CPU 4000"));
    }

    #[test]
    fn this_process_may_run_on_some_cpu() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]), "{cpus:?}");
    }

    #[test]
    fn pinning_to_cpu_zero_works() {
        std::thread::spawn(|| pin_current_thread(0))
            .join()
            .expect("thread ran")
            .expect("cpu 0 exists");
    }
}
