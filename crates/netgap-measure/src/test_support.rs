//! Fixtures the crate's unit tests share.

use netgap_core::record::ResultRecord;

/// A minimal pingpong record whose headline is `value`.
pub(crate) fn record(value: f64) -> ResultRecord {
    serde_json::from_value(serde_json::json!({
        "test": "pingpong", "transport": "tcp", "mode": "event", "size_bytes": 1,
        "metric": "latency_us", "value": value, "warnings": [], "version": "0",
        "time": "2026-01-01T00:00:00Z",
    }))
    .expect("a minimal record parses")
}
