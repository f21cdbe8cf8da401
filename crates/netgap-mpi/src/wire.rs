//! What the coordinator tells the ranks (a [`RankPlan`], as the arguments
//! of `netgap mpi-rank`) and what rank 0 tells the coordinator (one
//! [`RankLine`] per line of its standard output, which mpirun forwards).
//!
//! Both directions cross a process boundary, so each side checks what it
//! reads: the plan's ranges in [`RankPlan::check`], every line's size and
//! fields in [`parse_line`] and the run's order in `run`. A line rank 0 did
//! not write (mpirun's own notes) does not carry the prefix and is skipped.

use crate::kind::MpiTest;
use netgap_core::cpu::CpuUsage;
use serde::{Deserialize, Serialize};

/// Prefix of every line rank 0 writes for the coordinator.
pub const LINE_PREFIX: &str = "netgap-mpi ";
/// Longest line the coordinator reads, in bytes; a longer one is refused.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Most latency buckets a point's histogram may carry (a histogram of one
/// hour at 0.1% precision has far fewer).
pub const MAX_BUCKETS: usize = 100_000;
/// Largest message an MPI test takes: a bandwidth window holds 64 of them
/// in memory at once.
pub const MAX_MPI_SIZE_BYTES: u64 = 4 << 20;
/// Most iterations in one repetition.
pub const MAX_ITERATIONS: u64 = 1_000_000_000;
/// Most repetitions of one point.
pub const MAX_REPS: u32 = 10_000;
/// Most points in one launch.
pub const MAX_POINTS: usize = 10_000;

/// One point of a launch: a test at a message size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankPoint {
    /// The test.
    pub test: MpiTest,
    /// Message size in bytes, 1 to [`MAX_MPI_SIZE_BYTES`].
    pub size_bytes: u64,
}

/// How many iterations each repetition runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankIterations {
    /// Exactly this many.
    Fixed(u64),
    /// As many as fill this many microseconds, calibrated after warm-up.
    BudgetUs(u64),
}

/// Everything both ranks need to run the same points in the same order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    /// Points in order.
    pub points: Vec<RankPoint>,
    /// Measured repetitions per point.
    pub reps: u32,
    /// Iterations per repetition.
    pub iterations: RankIterations,
    /// Uncounted warm-up iterations per point; `None`: OSU's skip counts
    /// (see [`default_warmup`]).
    pub warmup: Option<u64>,
}

/// Why a plan or a line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A plan argument out of range or malformed.
    #[error("{what}: {detail}")]
    Plan {
        /// The argument.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A line of rank 0 that does not parse or is out of range.
    #[error("bad line from rank 0: {0}")]
    Line(String),
}

fn plan_err(what: &'static str, detail: impl Into<String>) -> WireError {
    WireError::Plan {
        what,
        detail: detail.into(),
    }
}

/// OSU's warm-up ("skip") count: 100 iterations for latency and 10 for
/// bandwidth up to 8 KiB, 10 and 2 beyond.
pub fn default_warmup(test: MpiTest, size_bytes: u64) -> u64 {
    let large = size_bytes > 8 * 1024;
    match (test, large) {
        (MpiTest::Latency, false) => 100,
        (MpiTest::Latency, true) => 10,
        (_, false) => 10,
        (_, true) => 2,
    }
}

impl RankPlan {
    /// Checks every range: at least one point, known sizes, repetitions
    /// and iterations within their limits.
    pub fn check(&self) -> Result<(), WireError> {
        if self.points.is_empty() || self.points.len() > MAX_POINTS {
            return Err(plan_err(
                "--points",
                format!("want 1 to {MAX_POINTS} points"),
            ));
        }
        if let Some(p) = self
            .points
            .iter()
            .find(|p| p.size_bytes == 0 || p.size_bytes > MAX_MPI_SIZE_BYTES)
        {
            return Err(plan_err(
                "--points",
                format!(
                    "size {} is out of range 1..={MAX_MPI_SIZE_BYTES}",
                    p.size_bytes
                ),
            ));
        }
        if self.reps == 0 || self.reps > MAX_REPS {
            return Err(plan_err("--reps", format!("want 1 to {MAX_REPS}")));
        }
        match self.iterations {
            RankIterations::Fixed(n) if n == 0 || n > MAX_ITERATIONS => {
                return Err(plan_err(
                    "--iterations",
                    format!("want 1 to {MAX_ITERATIONS}"),
                ))
            }
            RankIterations::BudgetUs(us) if us == 0 || us > 3_600_000_000 => {
                return Err(plan_err("--rep-time-us", "want 1 µs to 1 hour"))
            }
            _ => {}
        }
        if self.warmup.is_some_and(|w| w > MAX_ITERATIONS) {
            return Err(plan_err("--warmup", format!("at most {MAX_ITERATIONS}")));
        }
        Ok(())
    }

    /// The arguments of `netgap mpi-rank` that carry this plan: plain
    /// words only, so they survive every launcher unquoted.
    pub fn to_args(&self) -> Vec<String> {
        let points = self
            .points
            .iter()
            .map(|p| format!("{}:{}", p.test.name(), p.size_bytes))
            .collect::<Vec<_>>()
            .join(",");
        let mut args = vec![
            "--points".into(),
            points,
            "--reps".into(),
            self.reps.to_string(),
        ];
        match self.iterations {
            RankIterations::Fixed(n) => args.extend(["--iterations".into(), n.to_string()]),
            RankIterations::BudgetUs(us) => args.extend(["--rep-time-us".into(), us.to_string()]),
        }
        if let Some(w) = self.warmup {
            args.extend(["--warmup".into(), w.to_string()]);
        }
        args
    }

    /// The plan from the values of `netgap mpi-rank`'s flags, checked.
    pub fn from_args(
        points: &str,
        reps: u32,
        iterations: Option<u64>,
        rep_time_us: Option<u64>,
        warmup: Option<u64>,
    ) -> Result<RankPlan, WireError> {
        let mut parsed = Vec::new();
        for part in points.split(',') {
            let (name, size) = part
                .split_once(':')
                .ok_or_else(|| plan_err("--points", format!("{part:?} is not TEST:SIZE")))?;
            let test = MpiTest::by_name(name)
                .ok_or_else(|| plan_err("--points", format!("unknown MPI test {name:?}")))?;
            let size_bytes = size
                .parse()
                .map_err(|_| plan_err("--points", format!("size {size:?} is not a number")))?;
            parsed.push(RankPoint { test, size_bytes });
        }
        let iterations = match (iterations, rep_time_us) {
            (Some(n), None) => RankIterations::Fixed(n),
            (None, Some(us)) => RankIterations::BudgetUs(us),
            _ => {
                return Err(plan_err(
                    "--iterations",
                    "give exactly one of --iterations and --rep-time-us",
                ))
            }
        };
        let plan = RankPlan {
            points: parsed,
            reps,
            iterations,
            warmup,
        };
        plan.check()?;
        Ok(plan)
    }
}

/// One line rank 0 writes (after [`LINE_PREFIX`]), as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RankLine {
    /// First: what the ranks run on.
    Hello {
        /// `MPI_Get_library_version`'s text (its first line).
        library: String,
        /// The MPI standard version, `MAJOR.MINOR`.
        mpi_version: String,
        /// Processor name (`MPI_Get_processor_name`) of rank 0 and rank 1.
        processors: Vec<String>,
    },
    /// One measured repetition of a point.
    Rep {
        /// The point's index in the plan.
        point: u32,
        /// The repetition, from 0.
        rep: u32,
        /// Iterations it ran.
        iterations: u64,
        /// Its duration on rank 0, in nanoseconds.
        elapsed_ns: u64,
        /// CPU of rank 0's host and process over it.
        cpu_rank0: CpuUsage,
        /// CPU of rank 1's host and process over it.
        cpu_rank1: CpuUsage,
    },
    /// A point is done.
    Done {
        /// The point's index in the plan.
        point: u32,
        /// Warm-up iterations run before the measured ones (calibration
        /// included).
        warmup_iterations: u64,
        /// Round trips of every measured iteration of a latency point, as
        /// `[ns, count]` pairs; empty for bandwidth points.
        rtt_buckets: Vec<[u64; 2]>,
    },
}

impl RankLine {
    /// The line as rank 0 writes it, prefix included, no newline.
    pub fn to_line(&self) -> String {
        // Serializing these plain fields cannot fail.
        format!(
            "{LINE_PREFIX}{}",
            serde_json::to_string(self).unwrap_or_default()
        )
    }
}

/// The line rank 0 wrote, or `None` for a line that is not rank 0's
/// (mpirun's or the library's own output). Checks the size and the
/// fields' ranges; never panics.
pub fn parse_line(line: &str) -> Result<Option<RankLine>, WireError> {
    let Some(body) = line.trim_end().strip_prefix(LINE_PREFIX) else {
        return Ok(None);
    };
    if line.len() > MAX_LINE_BYTES {
        return Err(WireError::Line(format!(
            "{} bytes, over the limit of {MAX_LINE_BYTES}",
            line.len()
        )));
    }
    let parsed: RankLine =
        serde_json::from_str(body).map_err(|e| WireError::Line(e.to_string()))?;
    let bad = |d: &str| Err(WireError::Line(d.to_string()));
    match &parsed {
        RankLine::Hello {
            library,
            mpi_version,
            processors,
        } => {
            if library.len() > 4096 || mpi_version.len() > 32 || processors.len() != 2 {
                return bad("hello out of range");
            }
            if processors.iter().any(|p| p.len() > 256) {
                return bad("processor name too long");
            }
        }
        RankLine::Rep {
            iterations,
            elapsed_ns,
            cpu_rank0,
            cpu_rank1,
            ..
        } => {
            if *iterations == 0 || *iterations > MAX_ITERATIONS || *elapsed_ns == 0 {
                return bad("repetition out of range");
            }
            let pct_ok = |p: f64| p.is_finite() && (0.0..=100_000.0).contains(&p);
            if [cpu_rank0, cpu_rank1].iter().any(|c| {
                !pct_ok(c.system_busy_percent)
                    || !pct_ok(c.process_percent)
                    || c.softirq_percent.is_some_and(|s| !pct_ok(s))
            }) {
                return bad("CPU reading out of range");
            }
        }
        RankLine::Done {
            warmup_iterations,
            rtt_buckets,
            ..
        } => {
            if *warmup_iterations > 4 * MAX_ITERATIONS || rtt_buckets.len() > MAX_BUCKETS {
                return bad("point summary out of range");
            }
        }
    }
    Ok(Some(parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> RankPlan {
        RankPlan {
            points: vec![
                RankPoint {
                    test: MpiTest::Latency,
                    size_bytes: 1,
                },
                RankPoint {
                    test: MpiTest::Bidirectional,
                    size_bytes: 65536,
                },
            ],
            reps: 3,
            iterations: RankIterations::BudgetUs(20_000),
            warmup: Some(5),
        }
    }

    #[test]
    fn a_plan_round_trips_through_the_rank_arguments() {
        let p = plan();
        let args = p.to_args();
        let get = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        let back = RankPlan::from_args(
            &get("--points").expect("points"),
            get("--reps").expect("reps").parse().expect("n"),
            get("--iterations").map(|s| s.parse().expect("n")),
            get("--rep-time-us").map(|s| s.parse().expect("n")),
            get("--warmup").map(|s| s.parse().expect("n")),
        )
        .expect("parses");
        assert_eq!(back, p);
    }

    #[test]
    fn bad_plans_are_refused() {
        let e = |pts: &str| RankPlan::from_args(pts, 1, Some(1), None, None).expect_err("bad");
        assert!(e("mpi-latency").to_string().contains("TEST:SIZE"));
        assert!(e("nope:1").to_string().contains("unknown MPI test"));
        assert!(e("mpi-bw:0").to_string().contains("out of range"));
        assert!(e("mpi-bw:99999999999").to_string().contains("out of range"));
        assert!(RankPlan::from_args("mpi-bw:1", 0, Some(1), None, None).is_err());
        assert!(RankPlan::from_args("mpi-bw:1", 1, Some(1), Some(1), None).is_err());
    }

    #[test]
    fn lines_round_trip_and_foreign_or_bad_lines_are_told_apart() {
        let cpu = CpuUsage {
            system_busy_percent: 50.0,
            process_percent: 99.5,
            cpu_ns: 995,
            wall_ns: 1000,
            softirq_percent: Some(12.5),
        };
        let line = RankLine::Rep {
            point: 1,
            rep: 0,
            iterations: 10,
            elapsed_ns: 1000,
            cpu_rank0: cpu,
            cpu_rank1: cpu,
        };
        assert_eq!(parse_line(&line.to_line()), Ok(Some(line.clone())));
        let nan = line
            .to_line()
            .replace("\"process_percent\":99.5", "\"process_percent\":1e300");
        assert!(parse_line(&nan).is_err(), "{nan}");
        assert_eq!(parse_line("[node:123] some warning"), Ok(None));
        assert!(parse_line("netgap-mpi {").is_err());
        assert!(parse_line(
            r#"netgap-mpi {"rep":{"point":0,"rep":0,"iterations":0,"elapsed_ns":1}}"#
        )
        .is_err());
        assert!(parse_line(
            r#"netgap-mpi {"hello":{"library":"x","mpi_version":"3.1","processors":["a"]}}"#
        )
        .is_err());
        let long = format!("netgap-mpi {}", "x".repeat(MAX_LINE_BYTES));
        assert!(parse_line(&long).is_err());
    }
}
