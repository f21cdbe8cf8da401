//! `netgap logp`: the LogP parameters of a stack per message size (seed 004,
//! "Host Overheads"), all measured from the client end:
//!
//! - o_s, the send overhead: time of the send call while the receiver is
//!   blocked waiting (test `logp-send`);
//! - o_r, the receive overhead: time of the receive call once the whole
//!   message is in the receive buffer (test `logp-recv`);
//! - g, the gap: time per message in a long back-to-back stream (test
//!   `stream`, its bandwidth turned into microseconds per message);
//! - L, the latency: half the round trip minus o_s minus o_r (test
//!   `logp-rtt` for the half round trip), repetition by repetition.
//!
//! Each parameter is one record (`test: "logp"`, metric `send_overhead_us`,
//! `recv_overhead_us`, `gap_us` or `latency_us`) with the full spread of
//! its repetitions, written as soon as it is known.

use crate::coordinator::{open_session, CoordError, PointError};
use crate::plan::{bench_tests, Plan, PlanError, RunRequest};
use crate::point_loop::{run_points, Observer};
use crate::sink::RecordSink;
use netgap_core::diagnose::diagnose;
use netgap_core::record::{RecordStats, ResultRecord};
use netgap_core::spec::PointSpec;
use netgap_core::stats::Summary;
use netgap_core::units::format_size;
use std::io::Write;
use std::time::Duration;

/// The method, shown by `netgap logp --help`.
pub const HELP: &str = "\
Measures the LogP parameters of each transport per message size, from the \
client end, with the spread of each over the repetitions:

  o_s  send overhead: time of the send call while the server is blocked in its receive \
(the client pauses half a round trip after each reply before sending)
  o_r  receive overhead: time of the receive call once the whole reply is already in \
the receive buffer (sockets: polled with FIONREAD; other transports: a generous wait \
of twice the round trip plus 200 us)
  g    gap: time per message in a long back-to-back stream (the stream test)
  L    latency: half the round trip minus o_s minus o_r, per repetition

o_s and o_r are the median call of each repetition; the headline is the trimmed \
mean of the repetitions. Pin the client and server to different CPUs (--pin 0,1): \
unpinned, the server woken by a send may run on the client's CPU before the send \
call returns, and its work then lands in o_s.

Limits: L is meaningful for small messages only. On loopback and shared memory \
there is no wire: the send call itself carries the data to the receiver (and may \
wake it), so o_s takes most of the round trip and L comes out near zero or below \
it. Messages larger than the socket buffers cannot leave in one send call nor sit \
whole in the receive buffer, so there o_s includes waiting for the receiver and \
o_r the rest of the transfer.";

/// Default `--sizes` of logp, bytes.
pub(crate) const DEFAULT_SIZES_BYTES: [u64; 4] = [1, 1024, 64 * 1024, 1024 * 1024];
/// Default `--rep-time` of logp.
pub(crate) const DEFAULT_REP_TIME: Duration = Duration::from_millis(50);

/// The tests behind the parameters, in measurement order per size.
const TESTS: [&str; 4] = ["logp-send", "logp-recv", "stream", "logp-rtt"];

/// A validated `netgap logp` run.
#[derive(Debug, Clone)]
pub struct LogpPlan {
    /// The points, grouped by transport, mode and size, the four tests in order
    /// within each group.
    pub run: Plan,
}

impl LogpPlan {
    /// Validates a logp request: target, key, transports, method and
    /// outputs as for a run, with logp's own default sizes and time budget;
    /// its tests are logp's.
    pub fn from_request(r: &RunRequest) -> Result<LogpPlan, PlanError> {
        let tests: Vec<String> = TESTS.iter().map(|t| t.to_string()).collect();
        let mut run = Plan::point_to_point(
            r,
            &bench_tests(&tests)?,
            &DEFAULT_SIZES_BYTES,
            DEFAULT_REP_TIME,
            "logp",
        )?;
        let order = |s: &PointSpec| {
            (
                s.transport.clone(),
                s.mode.as_str(),
                s.size_bytes,
                TESTS.iter().position(|t| *t == s.test),
            )
        };
        // Plans are test-major; a size's four parameters belong together.
        let transports = &r.transport.transports;
        let mut keyed: Vec<_> = run.points.drain(..).enumerate().collect();
        keyed.sort_by_key(|(i, s)| (order_transport(transports, &s.transport), order(s), *i));
        run.points = keyed.into_iter().map(|(_, s)| s).collect();
        Ok(LogpPlan { run })
    }
}

/// Position of `name` in the user's transport list, so output follows it.
fn order_transport(list: &[String], name: &str) -> usize {
    list.iter().position(|t| t == name).unwrap_or(usize::MAX)
}

/// The parameter's metric key for a test.
fn metric_of(test: &str) -> &'static str {
    match test {
        "logp-send" => "send_overhead_us",
        "logp-recv" => "recv_overhead_us",
        "stream" => "gap_us",
        _ => "latency_us",
    }
}

/// A logp record from a measured point's record and its per-repetition
/// parameter values (µs).
fn logp_record(
    mut base: ResultRecord,
    metric: &str,
    values: &[f64],
) -> Result<ResultRecord, PointError> {
    let summary = Summary::from_reps(values)?;
    base.test = "logp".into();
    base.metric = metric.into();
    base.value = summary.value;
    base.stats = Some(RecordStats::from(&summary));
    base.percentiles = None;
    base.service_demand_us_per_kib = None;
    // The parameter's own repetitions, diagnosed (not the round trips').
    diagnose(&mut base);
    Ok(base)
}

/// Microseconds per message of `size_bytes` at `gbps`.
fn gap_us(size_bytes: u64, gbps: f64) -> f64 {
    if gbps > 0.0 {
        size_bytes as f64 * 8.0 / (gbps * 1e3)
    } else {
        f64::INFINITY
    }
}

/// L per repetition: half round trip minus o_s minus o_r, paired by
/// repetition index (the shortest series sets the count).
pub(crate) fn latency_reps(half_rtt_us: &[f64], send_us: &[f64], recv_us: &[f64]) -> Vec<f64> {
    half_rtt_us
        .iter()
        .zip(send_us)
        .zip(recv_us)
        .map(|((h, s), r)| h - s - r)
        .collect()
}

/// The table header.
pub(crate) fn table_header() -> String {
    format!(
        "{:<9}  {:<5}  {:>6}  {:>16}  {:>16}  {:>16}  {:>16}",
        "transport", "mode", "size", "o_s_us", "o_r_us", "g_us", "L_us"
    )
}

fn cell(r: Option<&ResultRecord>) -> String {
    match r {
        Some(r) => {
            let sd = r.stats.as_ref().map_or(0.0, |s| s.stdev);
            format!(
                "{} ±{}",
                crate::output::fmt_num(r.value),
                crate::output::fmt_num(sd)
            )
        }
        None => "-".into(),
    }
}

/// Prints a row per size once its last parameter, L, is written; o_s, o_r
/// and g wait in `row` until then.
struct LogpTable<'a> {
    out: &'a mut dyn Write,
    row: Vec<ResultRecord>,
}

impl Observer for LogpTable<'_> {
    fn point_done(&mut self, record: &ResultRecord) {
        if record.metric != "latency_us" {
            self.row.push(record.clone());
            return;
        }
        let _ = writeln!(
            self.out,
            "{:<9}  {:<5}  {:>6}  {:>16}  {:>16}  {:>16}  {:>16}",
            record.transport,
            record.mode.as_str(),
            format_size(record.size_bytes),
            cell(self.row.first()),
            cell(self.row.get(1)),
            cell(self.row.get(2)),
            cell(Some(record)),
        );
        let _ = self.out.flush();
        self.row.clear();
    }
}

/// Runs the plan, writing each parameter's record as soon as it is known and
/// a table row per size (value ± standard deviation of the repetitions).
pub fn run_logp(
    plan: &LogpPlan,
    sinks: &mut [Box<dyn RecordSink>],
    out: &mut dyn Write,
) -> Result<usize, CoordError> {
    let mut coord = open_session(&plan.run)?;
    let _ = writeln!(out, "{}", table_header());
    // Per size: the per-repetition series of o_s and o_r, for L.
    let mut series: Vec<Vec<f64>> = Vec::new();
    let mut table = LogpTable {
        out,
        row: Vec::new(),
    };
    let written = run_points(
        &plan.run.points,
        |spec| spec,
        sinks,
        &mut table,
        |spec, _| -> Result<Vec<ResultRecord>, CoordError> {
            let point_err =
                |detail| CoordError::point(spec, &format!("logp ({})", spec.test), detail);
            let (m, base) = coord
                .measure_record(spec, &plan.run, &mut |_| {})
                .map_err(point_err)?;
            let reps: Vec<f64> = m.reps.iter().map(|r| r.client.value).collect();
            if spec.test == "logp-rtt" {
                let l = latency_reps(
                    &reps,
                    series.first().map_or(&[][..], |v| v),
                    series.get(1).map_or(&[][..], |v| v),
                );
                let mut r = logp_record(base, "latency_us", &l).map_err(point_err)?;
                if r.value <= 0.0 {
                    r.warnings.push(
                        "L is not positive: the send call carried the message itself (as on loopback or shared memory), or the message exceeds the socket buffers; see `netgap logp --help`".into(),
                    );
                }
                series.clear();
                return Ok(vec![r]);
            }
            let values: Vec<f64> = if spec.test == "stream" {
                reps.iter().map(|&g| gap_us(spec.size_bytes, g)).collect()
            } else {
                reps.clone()
            };
            let r = logp_record(base, metric_of(&spec.test), &values).map_err(point_err)?;
            series.push(values);
            Ok(vec![r])
        },
    )?;
    coord.bye();
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l_is_half_the_round_trip_minus_both_overheads_per_repetition() {
        let l = latency_reps(&[10.0, 12.0, 11.0], &[3.0, 4.0], &[1.0, 1.5, 9.0]);
        assert_eq!(l, [6.0, 6.5]);
    }

    #[test]
    fn the_gap_is_the_time_per_message() {
        // 1000 bytes at 1 Gbit/s: 8 µs per message.
        assert!((gap_us(1000, 1.0) - 8.0).abs() < 1e-12);
        assert!(gap_us(1000, 0.0).is_infinite());
    }

    #[test]
    fn points_are_grouped_by_size_in_parameter_order() {
        let mut r = RunRequest::default();
        r.method.sizes = Some(vec![1, 1024]);
        r.transport.transports = vec!["unix".into(), "tcp".into()];
        let p = LogpPlan::from_request(&r).expect("valid");
        let got: Vec<(String, u64, String)> = p
            .run
            .points
            .iter()
            .map(|s| (s.transport.clone(), s.size_bytes, s.test.clone()))
            .collect();
        assert_eq!(got.len(), 16);
        assert_eq!(got[0], ("unix".into(), 1, "logp-send".into()));
        assert_eq!(got[3], ("unix".into(), 1, "logp-rtt".into()));
        assert_eq!(got[4], ("unix".into(), 1024, "logp-send".into()));
        assert_eq!(got[8], ("tcp".into(), 1, "logp-send".into()));
    }
}
