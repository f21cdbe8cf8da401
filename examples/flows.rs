//! Measures the flow engine with many concurrent flows and reports each
//! process's peak memory, for BENCHMARKS.md:
//!
//! ```text
//! cargo run --release --example flows -- serve pingpong 127.0.0.1:7300 &
//! cargo run --release --example flows -- client pingpong 127.0.0.1:7300 10000 5
//! ```
//!
//! `serve MODE ADDR [WORKERS]` runs a flow server until its standard input
//! closes (or a line arrives), then prints its totals and peak memory.
//! `client MODE ADDR FLOWS SECONDS [WORKERS]` opens FLOWS flows, runs them
//! for SECONDS after a 1 s warm-up, and prints round trips (or connections)
//! per second, latency percentiles and peak memory. MODE is `pingpong`
//! (1-byte round trips, as `hotspot`) or `connect` (16-byte request, 64-byte
//! reply, as `connect`).

use anyhow::{bail, Context, Result};
use netgap::flows::{self, ClientSpec, EngineConfig, FlowServer, FlowWork};
use netgap::stats::LatencyHistogram;
use std::time::{Duration, Instant};

fn work(mode: &str) -> Result<FlowWork> {
    Ok(match mode {
        "pingpong" => FlowWork::PingPong { size_bytes: 1 },
        "connect" => FlowWork::Connect {
            request_bytes: 16,
            reply_bytes: 64,
        },
        other => bail!("unknown mode {other:?}: use pingpong or connect"),
    })
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, what: &str| {
        args.get(i)
            .cloned()
            .with_context(|| format!("missing {what}"))
    };
    let workers = |i: usize| -> Result<usize> {
        Ok(args.get(i).map(|w| w.parse()).transpose()?.unwrap_or(2))
    };
    match arg(0, "serve or client")?.as_str() {
        "serve" => {
            let work = work(&arg(1, "mode")?)?;
            let addr = arg(2, "address")?.parse().context("address")?;
            let cfg = EngineConfig::tcp(workers(3)?, Duration::from_secs(10));
            let server = FlowServer::bind(addr, work, cfg)?;
            println!("listening on {}", server.local_addr());
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            let t = server.stop()?;
            println!(
                "server: accepted {} connections, rx {} B, tx {} B, {} errors; peak RSS {:.1} MiB",
                t.connections_accepted,
                t.bytes_rx,
                t.bytes_tx,
                t.errors,
                peak_rss_mib()
            );
        }
        "client" => {
            let work = work(&arg(1, "mode")?)?;
            let target = arg(2, "address")?.parse().context("address")?;
            let flows: usize = arg(3, "flows")?.parse().context("flows")?;
            let seconds: f64 = arg(4, "seconds")?.parse().context("seconds")?;
            let cfg = EngineConfig::tcp(workers(5)?, Duration::from_secs(10));
            let spec = ClientSpec {
                target,
                flows,
                work,
                bind_ip: None,
            };
            let t0 = Instant::now();
            let clients = flows::prepare_clients(&spec, &cfg)?;
            let opened = t0.elapsed();
            let report = clients.run(Duration::from_secs(1), Duration::from_secs_f64(seconds))?;
            let mut hist = LatencyHistogram::new();
            for f in &report.flows {
                f.hist.merge_into(&mut hist);
            }
            let done: u64 = report.flows.iter().map(|f| f.round_trips).sum();
            let errors: u64 = report.flows.iter().map(|f| f.errors).sum();
            let idle = report.flows.iter().filter(|f| f.round_trips == 0).count();
            let per_s = done as f64 / (report.elapsed_ns as f64 / 1e9);
            let p = hist
                .percentiles_us(1.0)
                .context("no exchange completed in the window")?;
            println!(
                "client: {flows} flows opened in {:.2} s; {done} exchanges ({per_s:.0}/s), {errors} errors, \
                 {idle} flows idle in the window; latency us p50 {:.0} p90 {:.0} p99 {:.0} max {:.0}; \
                 peak RSS {:.1} MiB",
                opened.as_secs_f64(),
                p.p50,
                p.p90,
                p.p99,
                p.max,
                peak_rss_mib()
            );
        }
        other => bail!("unknown command {other:?}: use serve or client"),
    }
    Ok(())
}
