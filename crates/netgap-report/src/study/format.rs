//! Numbers, x values and metrics as the study report writes them.

use netgap_core::study::{Quantity, XAxis};
use std::fmt::Write as _;

pub(crate) fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if v.is_infinite() {
        if v > 0.0 { "∞" } else { "−∞" }.to_string()
    } else if a != 0.0 && !(0.01..1e6).contains(&a) {
        format!("{v:.3e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// [`fmt_num`] without trailing zeros: a figure a study file gives, or a
/// band made from one.
pub(crate) fn fmt_trim(v: f64) -> String {
    let s = fmt_num(v);
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

pub(crate) fn fmt_x(v: f64, x: XAxis) -> String {
    if x.is_bytes() && v >= 1.0 {
        netgap_core::units::format_size(v as u64)
    } else if v.fract() == 0.0 && v.abs() < 1e6 {
        // Counts (clients, links) are whole.
        format!("{v:.0}")
    } else {
        fmt_num(v)
    }
}

/// A list of x values, at most `n` of them shown.
pub(crate) fn fmt_xs(xs: &[String], n: usize) -> String {
    let mut s = xs.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if xs.len() > n {
        let _ = write!(s, " and {} more", xs.len() - n);
    }
    s
}

pub(crate) fn unit_label(metric: &Quantity) -> String {
    match metric.name().as_str() {
        "latency_us" => "latency (µs)".into(),
        "bandwidth_gbps" => "bandwidth (Gbit/s)".into(),
        "transactions_per_s" => "transactions/s".into(),
        "query_time_ms" => "query time (ms)".into(),
        "gather_time_ms" => "gather time (ms)".into(),
        "block_time_us" => "block time (µs)".into(),
        "connect_time_us" => "connection time (µs)".into(),
        "cpu.local.process_percent" => "client CPU (% of one core)".into(),
        "cpu.remote.process_percent" => "server CPU (% of one core)".into(),
        "value" => "µs".into(),
        m => m.replace('_', " "),
    }
}
