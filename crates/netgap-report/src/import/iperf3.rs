//! iperf3's `-J` JSON report: one bulk-transfer point. The headline is what
//! the receiver got (`end.sum_received`, or `end.sum` for UDP) in Gbit/s of
//! payload; the per-interval throughputs become the repetitions, since
//! iperf3 measured each of them. Message size is `test_start.blksize`.

use super::{ImportContext, Imported, Importer, ParseError};
use netgap_core::record::ResultRecord;
use serde_json::Value;

/// iperf3 `-J` output.
pub(crate) struct Iperf3;

impl Importer for Iperf3 {
    fn name(&self) -> &'static str {
        "iperf3"
    }

    fn summary(&self) -> &'static str {
        "iperf3 -J JSON (client or server side)"
    }

    fn parse(&self, text: &str, ctx: &ImportContext) -> Result<Vec<ResultRecord>, ParseError> {
        let doc: Value = serde_json::from_str(text)
            .map_err(|e| ParseError::at(e.line().max(1), format!("not iperf3 JSON: {e}")))?;
        if let Some(err) = doc.get("error").and_then(Value::as_str) {
            return Err(ParseError::whole(format!(
                "iperf3 reported an error: {err}"
            )));
        }
        let start = doc
            .get("start")
            .ok_or_else(|| ParseError::whole("no \"start\" object: not an iperf3 -J report"))?;
        let test_start = start
            .get("test_start")
            .ok_or_else(|| ParseError::whole("no \"start.test_start\" object"))?;
        let protocol = test_start
            .get("protocol")
            .and_then(Value::as_str)
            .unwrap_or("TCP")
            .to_ascii_lowercase();
        let size_bytes = test_start
            .get("blksize")
            .and_then(Value::as_u64)
            .ok_or_else(|| ParseError::whole("no \"start.test_start.blksize\" (message size)"))?;
        let end = doc
            .get("end")
            .ok_or_else(|| ParseError::whole("no \"end\" object: the test did not finish"))?;
        let summary = if protocol == "udp" {
            end.get("sum")
        } else {
            end.get("sum_received")
        };
        let bps = summary
            .and_then(|s| s.get("bits_per_second"))
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| ParseError::whole("no receiver throughput in \"end\""))?;
        let time = start
            .get("timestamp")
            .and_then(|t| t.get("timesecs"))
            .and_then(Value::as_u64)
            .map(|s| {
                let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
                humantime::format_rfc3339_seconds(t).to_string()
            })
            .unwrap_or_else(|| ctx.time.clone());
        let reps = interval_gbps(&doc);
        Ok(vec![Imported {
            tool: "iperf3",
            test: "stream",
            transport: &protocol,
            size_bytes,
            metric: "bandwidth_gbps",
            // A second's bytes over a second.
            value: netgap_core::units::gbps(bps / 8.0, 1e9),
            reps: (reps.len() >= 2).then_some(reps.as_slice()),
            percentiles: None,
            time: &time,
        }
        .record()])
    }
}

/// Throughput of each full interval in Gbit/s; omitted (warm-up) intervals
/// and a trailing stub shorter than half an interval are left out.
fn interval_gbps(doc: &Value) -> Vec<f64> {
    let sums: Vec<(f64, f64)> = doc
        .get("intervals")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("sum"))
        .filter(|s| !s.get("omitted").and_then(Value::as_bool).unwrap_or(false))
        .filter_map(|s| {
            let secs = s.get("seconds")?.as_f64()?;
            let bps = s.get("bits_per_second")?.as_f64()?;
            (secs.is_finite() && bps.is_finite())
                .then_some((secs, netgap_core::units::gbps(bps / 8.0, 1e9)))
        })
        .collect();
    let longest = sums.iter().map(|(s, _)| *s).fold(0.0, f64::max);
    sums.into_iter()
        .filter(|(s, _)| *s >= longest / 2.0)
        .map(|(_, g)| g)
        .collect()
}
