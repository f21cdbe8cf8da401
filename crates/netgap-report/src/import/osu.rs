//! Text output of the OSU micro-benchmarks: a `# OSU MPI ... Test` title, a
//! `# Size ...` header, then one line per size whose second column is the
//! value. `osu_latency` reports one-way latency in µs (half the round trip)
//! and becomes `pingpong` points; `osu_bw` and `osu_bibw` report MB/s (10^6
//! bytes/s) and become `stream` and `bibw` points in Gbit/s. The transport
//! is recorded as `mpi`, the tool as the benchmark's program name.

use super::{number, size, ImportContext, Imported, Importer, ParseError};
use netgap_core::record::ResultRecord;

/// OSU micro-benchmark text output.
pub(crate) struct Osu;

/// What a title line says the benchmark measured.
#[derive(Clone, Copy)]
struct Kind {
    tool: &'static str,
    test: &'static str,
    metric: &'static str,
    /// Multiplier from the printed unit to netgap's.
    scale: f64,
}

fn kind_of(title: &str) -> Option<Kind> {
    let t = title.to_ascii_lowercase();
    let (tool, test, metric, scale) = if t.contains("bi-directional bandwidth") {
        ("osu_bibw", "bibw", "bandwidth_gbps", 8.0 / 1000.0)
    } else if t.contains("bandwidth") {
        ("osu_bw", "stream", "bandwidth_gbps", 8.0 / 1000.0)
    } else if t.contains("latency") {
        ("osu_latency", "pingpong", "latency_us", 1.0)
    } else {
        return None;
    };
    Some(Kind {
        tool,
        test,
        metric,
        scale,
    })
}

impl Importer for Osu {
    fn name(&self) -> &'static str {
        "osu"
    }

    fn summary(&self) -> &'static str {
        "OSU micro-benchmarks text output (osu_latency, osu_bw, osu_bibw)"
    }

    fn parse(&self, text: &str, ctx: &ImportContext) -> Result<Vec<ResultRecord>, ParseError> {
        let mut kind = None;
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                if comment.contains("OSU") {
                    kind = Some(kind_of(comment).ok_or_else(|| {
                        ParseError::at(
                            n,
                            format!("unsupported OSU benchmark {:?}: expected a latency, bandwidth or bi-directional bandwidth test", comment.trim()),
                        )
                    })?);
                }
                continue;
            }
            let k = kind.ok_or_else(|| {
                ParseError::at(n, "data before the \"# OSU MPI ... Test\" title line")
            })?;
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 2 {
                return Err(ParseError::at(
                    n,
                    format!("expected a size and a value, found {:?}", line),
                ));
            }
            let size_bytes = size(fields[0], n)?;
            let value = number(fields[1], "the measured value", n)? * k.scale;
            records.push(
                Imported {
                    tool: k.tool,
                    test: k.test,
                    transport: "mpi",
                    size_bytes,
                    metric: k.metric,
                    value,
                    reps: None,
                    percentiles: None,
                    time: &ctx.time,
                }
                .record(),
            );
        }
        if kind.is_none() {
            return Err(ParseError::whole(
                "no \"# OSU MPI ... Test\" title line: not OSU micro-benchmark output",
            ));
        }
        Ok(records)
    }
}
