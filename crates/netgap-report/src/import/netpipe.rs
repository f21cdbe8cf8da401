//! NetPIPE's output file (`NPtcp -o FILE`): one line per message size with
//! the size in bytes, the throughput and the time of one transfer in
//! seconds. NetPIPE times a ping-pong and halves it, so the time is one-way;
//! each line gives a `pingpong` latency point and the ping-pong bandwidth
//! computed from size and time (NetPIPE's own "Mbps" column counts 2^20 bit
//! units, so it is not reused).

use super::{number, size, ImportContext, Imported, Importer, ParseError};
use netgap_core::record::ResultRecord;

/// NetPIPE (`NPtcp`, `NPmpi`, ...) output file.
pub(super) struct NetPipe;

impl Importer for NetPipe {
    fn name(&self) -> &'static str {
        "netpipe"
    }

    fn summary(&self) -> &'static str {
        "NetPIPE output file (NPtcp -o FILE): bytes, Mbps, seconds per line"
    }

    fn parse(&self, text: &str, ctx: &ImportContext) -> Result<Vec<ResultRecord>, ParseError> {
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.is_empty() {
                continue;
            }
            if fields.len() < 3 {
                return Err(ParseError::at(
                    n,
                    format!(
                        "expected 3 columns (bytes, Mbps, seconds), found {}",
                        fields.len()
                    ),
                ));
            }
            let size_bytes = size(fields[0], n)?;
            number(fields[1], "a throughput in Mbps", n)?;
            let seconds = number(fields[2], "a time in seconds", n)?;
            if seconds == 0.0 {
                return Err(ParseError::at(n, "the transfer time is zero"));
            }
            let latency_us = seconds * 1e6;
            let gbps = netgap_core::units::gbps(size_bytes as f64, seconds * 1e9);
            for (metric, value) in [("latency_us", latency_us), ("bandwidth_gbps", gbps)] {
                records.push(
                    Imported {
                        tool: "NPtcp",
                        test: "pingpong",
                        transport: "tcp",
                        size_bytes,
                        metric,
                        value,
                        reps: None,
                        percentiles: None,
                        time: &ctx.time,
                    }
                    .record(),
                );
            }
        }
        Ok(records)
    }
}
