//! CPU cost of a measurement: system-wide busy percent from /proc/stat and
//! the CPU time of netgap's own threads doing a role; and the process's
//! peak memory ([`peak_rss_kib`]).
//!
//! One [`CpuMeter`] covers one measured interval (one repetition of a test
//! role) on one host. It records (a) the busy share of all CPUs from the
//! aggregate `cpu` line of `/proc/stat`, and of it the share the kernel
//! spent in softirq (its packet processing: on a testbed, the forwarding
//! and shaping of every namespace on the machine, since they all share its
//! CPUs; the time of `ksoftirqd` is counted there too), and (b) the CPU time of the threads
//! doing the role: the calling thread's own CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) plus what helper threads report through
//! [`CpuMeter::stop`]. Measuring threads rather than the whole process is
//! deliberate: the coordinator and an in-process agent can share a process.
//! Starting and stopping each cost one clock read and one short read of
//! `/proc/stat`. A window whose edges are read on other threads than the
//! ones doing the work (a workload role's) is two [`HostMark`]s and the CPU
//! time the role counted between them.

use netgap_core::cpu::CpuUsage;
use std::io::BufRead;
use std::time::Instant;

/// Path of the kernel's CPU time counters.
const PROC_STAT: &str = "/proc/stat";
/// Read buffer for the first line of `/proc/stat`; the aggregate line is
/// about 100 bytes, so one read normally suffices.
const PROC_STAT_BUF_BYTES: usize = 256;

/// One edge of a measured window: the clock and the host's CPU counters
/// (the aggregate line of `/proc/stat`) at one instant. A window's two
/// edges may be read on different threads, so a mark holds no thread's
/// own clock: the CPU time over the window comes with it to
/// [`HostMark::usage_to`].
#[derive(Debug, Clone, Copy)]
pub struct HostMark {
    /// Aggregate jiffies, if `/proc/stat` was readable.
    jiffies: Option<Jiffies>,
    /// When the mark was read.
    at: Instant,
}

impl HostMark {
    /// Reads the clock and the host's counters now.
    pub fn now() -> HostMark {
        HostMark {
            jiffies: read_proc_stat_jiffies(),
            at: Instant::now(),
        }
    }

    /// When the mark was read.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The usage over the window from this mark to `end` (read later) of
    /// a role whose threads and processes used `cpu_ns` of CPU time in it.
    ///
    /// `system_busy_percent` and `softirq_percent` are 0 when `/proc/stat`
    /// did not advance (windows shorter than one jiffy); when it was
    /// unreadable, busy is 0 and softirq `None`; `process_percent` is 0
    /// when no wall time elapsed; `end` before this mark is a window of no
    /// time.
    pub fn usage_to(&self, end: &HostMark, cpu_ns: u64) -> CpuUsage {
        let wall_ns =
            u64::try_from(end.at.saturating_duration_since(self.at).as_nanos()).unwrap_or(u64::MAX);
        let process_percent = if wall_ns == 0 {
            0.0
        } else {
            100.0 * cpu_ns as f64 / wall_ns as f64
        };
        let (system_busy_percent, softirq_percent) = match (self.jiffies, end.jiffies) {
            // A window shorter than a jiffy shows no time of either kind: 0
            // of both, as busy always was, so one short repetition does not
            // take the softirq share from the mean of a point.
            (Some(start), Some(end)) => {
                let (busy, softirq) = shares(start, end).unwrap_or((0.0, 0.0));
                (busy, Some(softirq))
            }
            _ => (0.0, None),
        };
        CpuUsage {
            system_busy_percent,
            process_percent,
            cpu_ns,
            wall_ns,
            softirq_percent,
        }
    }
}

/// Starts measuring on the calling thread.
///
/// Invariant: [`CpuMeter::stop`] is called on the thread that called
/// [`CpuMeter::start`], since the thread CPU clock is per thread (checked by a
/// debug assertion).
#[derive(Debug, Clone)]
pub struct CpuMeter {
    /// The host's counters and the clock at start.
    start: HostMark,
    /// CPU time of the starting thread at start, in nanoseconds.
    start_thread_cpu_ns: u64,
    /// Thread that started the meter.
    thread: std::thread::ThreadId,
}

impl CpuMeter {
    /// Starts measuring on the calling thread.
    pub fn start() -> CpuMeter {
        let start_thread_cpu_ns = thread_cpu_ns();
        CpuMeter {
            start: HostMark::now(),
            start_thread_cpu_ns,
            thread: std::thread::current().id(),
        }
    }

    /// Ends the interval; `extra_thread_cpu_ns` is CPU time of helper threads
    /// of the role, measured by those threads with [`thread_cpu_ns`].
    ///
    /// The shares as for [`HostMark::usage_to`]. May be called more than
    /// once; each call measures from [`CpuMeter::start`].
    pub fn stop(&self, extra_thread_cpu_ns: u64) -> CpuUsage {
        let end = HostMark::now();
        let end_thread_cpu_ns = thread_cpu_ns();
        debug_assert_eq!(
            self.thread,
            std::thread::current().id(),
            "CpuMeter stopped on a different thread than it was started on"
        );
        let cpu_ns = end_thread_cpu_ns
            .saturating_sub(self.start_thread_cpu_ns)
            .saturating_add(extra_thread_cpu_ns);
        self.start.usage_to(&end, cpu_ns)
    }
}

/// The CPU time counters of one `cpu` line of `/proc/stat`, in jiffies.
/// Invariant: `softirq <= busy <= total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Jiffies {
    /// Busy time, softirq included.
    pub busy: u64,
    /// Time in softirq.
    pub softirq: u64,
    /// Busy, idle and iowait time.
    pub total: u64,
}

/// The busy percent and the softirq percent, each 0..=100, between two
/// readings; `None` when the total did not advance. Counters that went
/// backwards (iowait can) count as no progress, and the results are
/// clamped to 100, the softirq share to the busy one.
fn shares(start: Jiffies, end: Jiffies) -> Option<(f64, f64)> {
    let total = end.total.saturating_sub(start.total);
    if total == 0 {
        return None;
    }
    let pct =
        |a: u64, b: u64| (100.0 * b.saturating_sub(a) as f64 / total as f64).clamp(0.0, 100.0);
    let busy = pct(start.busy, end.busy);
    Some((busy, pct(start.softirq, end.softirq).min(busy)))
}

/// Reads the aggregate line (the first) of `/proc/stat`; `None` if it
/// cannot be read or parsed.
fn read_proc_stat_jiffies() -> Option<Jiffies> {
    let file = std::fs::File::open(PROC_STAT).ok()?;
    let mut reader = std::io::BufReader::with_capacity(PROC_STAT_BUF_BYTES, file);
    let mut line = String::with_capacity(PROC_STAT_BUF_BYTES);
    reader.read_line(&mut line).ok()?;
    parse_proc_stat_line(&line)
}

/// Parses a `cpu` line of `/proc/stat` (`cpu  user nice system idle iowait
/// irq softirq steal guest guest_nice`, in jiffies), where busy = user +
/// nice + system + irq + softirq + steal and total = busy + idle + iowait.
/// Guest time is already part of user and nice, so it is not added again.
/// Fields missing on old kernels count as 0; at least user, nice, system
/// and idle must be present. `None` when the label does not start with
/// `cpu` or a field is not a number.
pub(crate) fn parse_proc_stat_line(line: &str) -> Option<Jiffies> {
    let mut fields = line.split_whitespace();
    if !fields.next()?.starts_with("cpu") {
        return None;
    }
    let mut values = [0u64; 8];
    let mut count = 0;
    for (slot, field) in values.iter_mut().zip(fields) {
        *slot = field.parse().ok()?;
        count += 1;
    }
    if count < 4 {
        return None;
    }
    let [user, nice, system, idle, iowait, irq, softirq, steal] = values;
    let busy = [user, nice, system, irq, softirq, steal]
        .iter()
        .fold(0u64, |acc, v| acc.saturating_add(*v));
    let total = busy.saturating_add(idle).saturating_add(iowait);
    Some(Jiffies {
        busy,
        softirq,
        total,
    })
}

/// Peak resident set size of this process (VmHWM), in KiB, if readable:
/// the memory reading that goes with a role's CPU time.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time consumed so far by the calling thread, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`). Only differences between two calls on the
/// same thread are meaningful. Returns 0 if the clock cannot be read, which
/// does not happen on Linux.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock id every Linux kernel supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Spins on the calling thread for `duration`.
    fn spin(duration: Duration) {
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < duration {
            for i in 0..1000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        std::hint::black_box(x);
    }

    #[test]
    fn busy_loop_counts_thread_cpu() {
        // Spin until the thread itself has used 30 ms of CPU, however busy
        // the machine is: the meter must see at least that much, and never
        // more CPU than wall time.
        let meter = CpuMeter::start();
        let cpu0 = thread_cpu_ns();
        while thread_cpu_ns() - cpu0 < 30_000_000 {
            std::hint::spin_loop();
        }
        let usage = meter.stop(0);
        assert!(usage.cpu_ns >= 30_000_000, "{usage:?}");
        // The thread's CPU clock and the wall clock are read one after the
        // other, and a virtual machine's CPU accounting can run a little
        // ahead of the wall clock (seen: 30.20 ms of CPU in 30.02 ms): no
        // more CPU than wall time, within 2%.
        assert!(
            usage.cpu_ns <= usage.wall_ns + usage.wall_ns / 50,
            "{usage:?}"
        );
        assert!((0.0..=102.0).contains(&usage.process_percent), "{usage:?}");
        assert!(
            (0.0..=100.0).contains(&usage.system_busy_percent),
            "{usage:?}"
        );
    }

    #[test]
    fn sleeping_uses_little_cpu() {
        let meter = CpuMeter::start();
        std::thread::sleep(Duration::from_millis(50));
        let usage = meter.stop(0);
        assert!(usage.wall_ns >= 50_000_000);
        assert!(usage.process_percent < 20.0, "{usage:?}");
        assert!(
            (0.0..=100.0).contains(&usage.system_busy_percent),
            "{usage:?}"
        );
    }

    #[test]
    fn helper_thread_cpu_is_added() {
        let meter = CpuMeter::start();
        let helper = std::thread::spawn(|| {
            let start = thread_cpu_ns();
            spin(Duration::from_millis(30));
            thread_cpu_ns() - start
        });
        let helper_ns = helper.join().expect("helper thread panicked");
        assert!(helper_ns > 0);
        let usage = meter.stop(helper_ns);
        assert!(usage.cpu_ns >= helper_ns);
        assert!(usage.process_percent > 0.0);
    }

    #[test]
    fn thread_cpu_clock_is_monotonic() {
        let a = thread_cpu_ns();
        spin(Duration::from_millis(2));
        let b = thread_cpu_ns();
        assert!(a > 0);
        assert!(b > a);
    }

    #[test]
    fn parses_fixed_proc_stat_line() {
        let line = "cpu  6647 0 2565 232350 267 0 23 24 0 0\n";
        // busy = 6647 + 0 + 2565 + 0 + 23 + 24; total = busy + 232350 + 267.
        let j = |busy, softirq, total| {
            Some(Jiffies {
                busy,
                softirq,
                total,
            })
        };
        assert_eq!(parse_proc_stat_line(line), j(9259, 23, 241_876));
        // Per-CPU lines and short old-kernel lines parse too.
        assert_eq!(parse_proc_stat_line("cpu0 1 2 3 4"), j(6, 0, 10));
        assert_eq!(parse_proc_stat_line("intr 1 2 3 4"), None);
        assert_eq!(parse_proc_stat_line("cpu 1 2 3"), None);
        assert_eq!(parse_proc_stat_line("cpu 1 x 3 4"), None);
        assert_eq!(parse_proc_stat_line(""), None);
    }

    #[test]
    fn reads_live_proc_stat() {
        let j = read_proc_stat_jiffies().expect("/proc/stat readable");
        assert!(j.total > 0);
        assert!(j.softirq <= j.busy && j.busy <= j.total, "{j:?}");
    }

    #[test]
    fn a_window_between_marks_is_the_cpu_given_over_the_time_between_them() {
        let start = HostMark::now();
        std::thread::sleep(Duration::from_millis(20));
        let end = HostMark::now();
        let usage = start.usage_to(&end, 10_000_000);
        assert!(usage.wall_ns >= 20_000_000, "{usage:?}");
        assert_eq!(usage.cpu_ns, 10_000_000);
        let want = 100.0 * 1e7 / usage.wall_ns as f64;
        assert!((usage.process_percent - want).abs() < 1e-9, "{usage:?}");
        assert!((0.0..=100.0).contains(&usage.system_busy_percent));
        // Marks given the wrong way round are a window of no time.
        let back = end.usage_to(&start, 10_000_000);
        assert_eq!((back.wall_ns, back.process_percent), (0, 0.0));
    }

    #[test]
    fn shares_edges() {
        let j = |busy, softirq, total| Jiffies {
            busy,
            softirq,
            total,
        };
        assert_eq!(shares(j(10, 1, 100), j(10, 1, 100)), None);
        assert_eq!(shares(j(10, 1, 100), j(35, 11, 200)), Some((25.0, 10.0)));
        // A total that went backwards is no progress, not a huge number.
        assert_eq!(shares(j(10, 1, 100), j(20, 2, 90)), None);
        assert_eq!(shares(j(10, 1, 100), j(30, 40, 110)), Some((100.0, 100.0)));
        // Counters that went backwards count as nothing.
        assert_eq!(shares(j(10, 5, 100), j(20, 2, 200)), Some((10.0, 0.0)));
    }
}
