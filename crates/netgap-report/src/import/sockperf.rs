//! sockperf's summary, as printed on the client's standard output. A
//! `ping-pong` run gives a `pingpong` latency point: sockperf reports half
//! the round trip (one-way) in µs, with percentiles; a `throughput` run gives
//! a `stream` bandwidth point from its "BandWidth is ... Mbps" line (10^6
//! bit/s of payload). The transport comes from the `# TCP`/`# UDP` tag of the
//! address line; the ping-pong summary does not print the message size, so
//! it must be given (`--size`), while throughput prints it in its note.

use super::{number, ImportContext, Imported, Importer, ParseError};
use netgap_core::record::ResultRecord;
use netgap_core::stats::Percentiles;

/// sockperf client output.
pub(crate) struct Sockperf;

impl Importer for Sockperf {
    fn name(&self) -> &'static str {
        "sockperf"
    }

    fn summary(&self) -> &'static str {
        "sockperf ping-pong or throughput client output (give --size for ping-pong)"
    }

    fn parse(&self, text: &str, ctx: &ImportContext) -> Result<Vec<ResultRecord>, ParseError> {
        let mut transport = None;
        let mut latency_us = None;
        let mut mbps = None;
        let mut note_size = None;
        let (mut p50, mut p90, mut p99, mut p999, mut max) = (None, None, None, None, None);
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = strip_ansi(raw);
            let line = line.trim();
            if line.starts_with("[ 0] IP =") || line.contains("PORT =") {
                if line.ends_with("# UDP") {
                    transport = Some("udp");
                } else if line.ends_with("# TCP") {
                    transport = Some("tcp");
                }
            } else if let Some(rest) = line.strip_prefix("sockperf: Summary: Latency is ") {
                latency_us = Some(number(first_word(rest), "a latency in usec", n)?);
            } else if let Some(rest) = line.strip_prefix("sockperf: Summary: BandWidth is ") {
                // "673.751 MBps (5390.009 Mbps)"
                let inner = rest
                    .split_once('(')
                    .map(|(_, r)| first_word(r))
                    .ok_or_else(|| ParseError::at(n, "expected \"(... Mbps)\" after BandWidth"))?;
                mbps = Some(number(inner, "a bandwidth in Mbps", n)?);
            } else if let Some(rest) = line.split_once("msg-size=").map(|(_, r)| r) {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                note_size = digits.parse::<u64>().ok();
            } else if let Some(rest) = line.strip_prefix("sockperf: ---> percentile ") {
                let (which, value) = rest
                    .split_once('=')
                    .ok_or_else(|| ParseError::at(n, "expected \"percentile P = VALUE\""))?;
                let v = number(value, "a percentile in usec", n)?;
                match which.trim() {
                    "50.000" => p50 = Some(v),
                    "90.000" => p90 = Some(v),
                    "99.000" => p99 = Some(v),
                    "99.900" => p999 = Some(v),
                    _ => {}
                }
            } else if let Some(rest) = line.strip_prefix("sockperf: ---> <MAX> observation =") {
                max = Some(number(rest, "the largest observation in usec", n)?);
            }
        }
        let transport = transport.unwrap_or("tcp");
        if let Some(value) = latency_us {
            let size_bytes = ctx.size_bytes.ok_or_else(|| {
                ParseError::whole(
                    "sockperf's ping-pong summary does not state the message size; give it with --size BYTES",
                )
            })?;
            let percentiles = match (p50, p90, p99, p999, max) {
                (Some(p50), Some(p90), Some(p99), Some(p999), Some(max)) => Some(Percentiles {
                    p50,
                    p90,
                    p99,
                    p999,
                    max,
                }),
                _ => None,
            };
            return Ok(vec![Imported {
                tool: "sockperf",
                test: "pingpong",
                transport,
                size_bytes,
                metric: "latency_us",
                value,
                reps: None,
                percentiles,
                time: &ctx.time,
            }
            .record()]);
        }
        if let Some(mbps) = mbps {
            let size_bytes = note_size.or(ctx.size_bytes).ok_or_else(|| {
                ParseError::whole(
                    "sockperf's throughput summary does not state the message size; give it with --size BYTES",
                )
            })?;
            return Ok(vec![Imported {
                tool: "sockperf",
                test: "stream",
                transport,
                size_bytes,
                metric: "bandwidth_gbps",
                value: mbps / 1000.0,
                reps: None,
                percentiles: None,
                time: &ctx.time,
            }
            .record()]);
        }
        Err(ParseError::whole(
            "no \"Summary: Latency is\" or \"Summary: BandWidth is\" line: not a sockperf client summary",
        ))
    }
}

fn first_word(s: &str) -> &str {
    s.split_whitespace().next().unwrap_or("")
}

/// The line without ANSI colour sequences (`ESC [ ... m`), which sockperf
/// prints even into files.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_sequences_are_removed() {
        assert_eq!(strip_ansi("a\u{1b}[2;35mb\u{1b}[0mc"), "abc");
    }
}
