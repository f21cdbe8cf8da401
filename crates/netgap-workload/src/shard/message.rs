//! What travels between the agent and a shard, one JSON line each: the
//! configuration on the shard's stdin (checked into a `ValidShard`
//! before use), the agent's orders, and the shard's reports and totals on
//! its stdout; lines are bounded.

use super::{ShardError, MAX_IO_TIMEOUT_MS, MAX_LINE_BYTES, MAX_SHARD_WORKERS};
use netgap_core::spec::{Mode, TransportOptions};
use netgap_proto::dataproof::DataToken;
use netgap_transport::flows::{EngineConfig, FlowWork, ServerTotals};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read, Write};
use std::time::Duration;

/// What each flow of a shard does (the engine's [`FlowWork`], as it travels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ShardWork {
    /// Pingpong round trips of `size_bytes` each way.
    PingPong {
        /// Message size, bytes.
        size_bytes: u64,
    },
    /// A connection per request and reply.
    Connect {
        /// Request size, bytes.
        request_bytes: u64,
        /// Reply size, bytes.
        reply_bytes: u64,
    },
}

impl From<FlowWork> for ShardWork {
    fn from(w: FlowWork) -> ShardWork {
        match w {
            FlowWork::PingPong { size_bytes } => ShardWork::PingPong {
                size_bytes: size_bytes as u64,
            },
            FlowWork::Connect {
                request_bytes,
                reply_bytes,
            } => ShardWork::Connect {
                request_bytes: request_bytes as u64,
                reply_bytes: reply_bytes as u64,
            },
        }
    }
}

/// A shard's configuration as it travels from the agent (raw: range-checked
/// by [`ShardConfig::validate`] before use).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardConfig {
    /// The transport whose engine data path the flows use.
    pub transport: String,
    /// Engine workers.
    pub workers: u32,
    /// The engine's I/O timeout, ms.
    pub io_timeout_ms: u64,
    /// Completion mode.
    pub mode: Mode,
    /// Socket options of every connection.
    pub options: TransportOptions,
    /// The point's session token, which every connection proves.
    pub token: Option<DataToken>,
    /// What each flow does.
    pub work: ShardWork,
    /// Most connections this shard holds open at once.
    pub max_open: u64,
    /// This shard's share of the agent's highest data rate, Gbit/s (the
    /// agent's `--max-rate` over its shards); `None`: unpaced.
    #[serde(default)]
    pub rate_gbps: Option<f64>,
}

/// A shard's configuration, checked: what [`FlowServer::on_listener`](netgap_transport::flows::FlowServer::on_listener)
/// takes.
#[derive(Debug, Clone)]
pub(crate) struct ValidShard {
    /// The engine's configuration.
    pub cfg: EngineConfig,
    /// What each flow does.
    pub work: FlowWork,
    /// Most connections held open at once.
    pub max_open: usize,
}

impl ShardConfig {
    /// The configuration of a shard of a server with `cfg` doing `work`,
    /// holding at most `max_open` connections.
    pub(crate) fn new(cfg: &EngineConfig, work: FlowWork, max_open: u64) -> ShardConfig {
        ShardConfig {
            transport: cfg.path.name().to_string(),
            workers: u32::try_from(cfg.workers).unwrap_or(u32::MAX),
            io_timeout_ms: u64::try_from(cfg.io_timeout.as_millis()).unwrap_or(u64::MAX),
            mode: cfg.mode,
            options: cfg.options.clone(),
            token: cfg.token.clone(),
            work: work.into(),
            max_open,
            rate_gbps: cfg.rate.as_ref().map(|r| r.rate_gbps()),
        }
    }

    /// The same configuration for one of `count` shards that share the
    /// agent's rate budget equally.
    pub(crate) fn sharing_rate(mut self, count: u32) -> ShardConfig {
        self.rate_gbps = self.rate_gbps.map(|r| r / f64::from(count.max(1)));
        self
    }

    /// Checks every field: a known transport with a connection data path,
    /// 1 to [`MAX_SHARD_WORKERS`] workers, an I/O timeout of 1 ms to an
    /// hour, a cap of at least one connection and message sizes that fit
    /// this host's words (the engine checks their own limits when it binds).
    pub(crate) fn validate(&self) -> Result<ValidShard, ShardError> {
        let bad = |m: String| Err(ShardError::Config(m));
        let Some(t) = netgap_transport::find(&self.transport) else {
            return bad(format!("unknown transport {:?}", self.transport));
        };
        let Some(path) = t.engine_path() else {
            return bad(format!("{} has no engine data path", self.transport));
        };
        if path.datagrams() {
            return bad(format!(
                "{} flows are served from one process",
                self.transport
            ));
        }
        if !(1..=MAX_SHARD_WORKERS).contains(&self.workers) {
            return bad(format!(
                "{} workers is not 1 to {MAX_SHARD_WORKERS}",
                self.workers
            ));
        }
        if !(1..=MAX_IO_TIMEOUT_MS).contains(&self.io_timeout_ms) {
            return bad(format!(
                "an I/O timeout of {} ms is not 1 ms to an hour",
                self.io_timeout_ms
            ));
        }
        if let Some(r) = self.rate_gbps.filter(|r| !(r.is_finite() && *r > 0.0)) {
            return bad(format!("a rate of {r} Gbit/s"));
        }
        let max_open = usize::try_from(self.max_open).unwrap_or(0);
        if max_open == 0 {
            return bad(format!("a cap of {} connections", self.max_open));
        }
        let size =
            |b: u64| usize::try_from(b).map_err(|_| ShardError::Config(format!("{b} bytes")));
        let work = match self.work {
            ShardWork::PingPong { size_bytes } => FlowWork::PingPong {
                size_bytes: size(size_bytes)?,
            },
            ShardWork::Connect {
                request_bytes,
                reply_bytes,
            } => FlowWork::Connect {
                request_bytes: size(request_bytes)?,
                reply_bytes: size(reply_bytes)?,
            },
        };
        Ok(ValidShard {
            cfg: EngineConfig {
                workers: self.workers as usize,
                io_timeout: Duration::from_millis(self.io_timeout_ms),
                mode: self.mode,
                options: self.options.clone(),
                path,
                token: self.token.clone(),
                rate: self
                    .rate_gbps
                    .map(|r| std::sync::Arc::new(netgap_transport::rate::RateBudget::new(r))),
            },
            work,
            max_open,
        })
    }
}

/// What the agent tells a shard after its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToShard {
    /// Stop accepting, drain, report and exit.
    Stop,
}

/// A shard's [`ServerTotals`] as they travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardTotals {
    /// Payload bytes read from clients.
    pub bytes_rx: u64,
    /// Payload bytes written to clients.
    pub bytes_tx: u64,
    /// Connections accepted.
    pub connections_accepted: u64,
    /// Connections that ended cleanly.
    pub connections_completed: u64,
    /// Connections that ended with an error.
    pub errors: u64,
    /// Connections that did not prove the session.
    pub strangers: u64,
}

impl From<&ServerTotals> for ShardTotals {
    fn from(t: &ServerTotals) -> ShardTotals {
        ShardTotals {
            bytes_rx: t.bytes_rx,
            bytes_tx: t.bytes_tx,
            connections_accepted: t.connections_accepted,
            connections_completed: t.connections_completed,
            errors: t.errors,
            strangers: t.strangers,
        }
    }
}

impl ShardTotals {
    /// The totals as the engine keeps them.
    pub(crate) fn to_server(self) -> ServerTotals {
        ServerTotals {
            bytes_rx: self.bytes_rx,
            bytes_tx: self.bytes_tx,
            connections_accepted: self.connections_accepted,
            connections_completed: self.connections_completed,
            errors: self.errors,
            strangers: self.strangers,
            datagrams: None,
        }
    }

    pub(super) fn add(&mut self, o: &ShardTotals) {
        self.bytes_rx += o.bytes_rx;
        self.bytes_tx += o.bytes_tx;
        self.connections_accepted += o.connections_accepted;
        self.connections_completed += o.connections_completed;
        self.errors += o.errors;
        self.strangers += o.strangers;
    }
}

/// What a shard tells the agent, one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum FromShard {
    /// Its server runs on the shared listener.
    Serving,
    /// Its connections so far and now.
    Status {
        /// Accepted so far.
        accepted: u64,
        /// Open now.
        open: u64,
    },
    /// It stopped: what it moved and its peak resident memory.
    Done {
        /// Its server's totals.
        totals: ShardTotals,
        /// Its VmHWM, KiB, if readable.
        peak_rss_kib: Option<u64>,
    },
    /// It could not serve.
    Failed {
        /// Why, one line.
        message: String,
    },
}

/// Reads one line of at most [`MAX_LINE_BYTES`]; `None` at end of stream.
pub(super) fn read_line(r: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    let n = r.by_ref().take(MAX_LINE_BYTES).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with('\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a line too long or cut short",
        ));
    }
    Ok(Some(line))
}

pub(super) fn write_line<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn config() -> ShardConfig {
        let mut cfg = EngineConfig::tcp(2, Duration::from_secs(3));
        cfg.token = Some(DataToken::from_bytes([7; 32]));
        ShardConfig::new(
            &cfg,
            FlowWork::Connect {
                request_bytes: 1,
                reply_bytes: 2,
            },
            500,
        )
    }

    #[test]
    fn a_configuration_travels_and_validates() {
        let c = config();
        let line = serde_json::to_string(&c).unwrap();
        let back: ShardConfig = serde_json::from_str(&line).unwrap();
        assert_eq!(back, c);
        let v = back.validate().unwrap();
        assert_eq!(v.max_open, 500);
        assert_eq!(v.cfg.workers, 2);
        assert_eq!(v.cfg.io_timeout, Duration::from_secs(3));
        assert!(v.cfg.token.is_some());
        assert_eq!(
            v.work,
            FlowWork::Connect {
                request_bytes: 1,
                reply_bytes: 2
            }
        );
    }

    #[test]
    fn a_configuration_out_of_range_is_refused() {
        let bad = |f: fn(&mut ShardConfig)| {
            let mut c = config();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.workers = 0).contains("workers"));
        assert!(bad(|c| c.workers = MAX_SHARD_WORKERS + 1).contains("workers"));
        assert!(bad(|c| c.io_timeout_ms = 0).contains("timeout"));
        assert!(bad(|c| c.max_open = 0).contains("cap"));
        assert!(bad(|c| c.transport = "carrier-pigeon".into()).contains("unknown transport"));
        assert!(bad(|c| c.transport = "udp".into()).contains("one process"));
        // Unknown fields and kinds do not parse.
        let mut v = serde_json::to_value(config()).unwrap();
        v["extra"] = 1.into();
        assert!(serde_json::from_value::<ShardConfig>(v).is_err());
        assert!(serde_json::from_str::<FromShard>(r#"{"kind":"exec","cmd":"sh"}"#).is_err());
    }

    #[test]
    fn lines_are_bounded() {
        let long = vec![b'x'; MAX_LINE_BYTES as usize + 10];
        assert!(read_line(&mut &long[..]).is_err());
        assert_eq!(read_line(&mut &b""[..]).unwrap(), None);
        assert_eq!(
            read_line(&mut &b"{}\n"[..]).unwrap().as_deref(),
            Some("{}\n")
        );
    }

    #[test]
    fn totals_travel_and_sum() {
        let t = ServerTotals {
            bytes_rx: 5,
            bytes_tx: 6,
            connections_accepted: 2,
            connections_completed: 1,
            errors: 1,
            strangers: 1,
            datagrams: None,
        };
        let mut s = ShardTotals::from(&t);
        s.add(&ShardTotals::from(&t));
        assert_eq!(s.to_server().bytes_rx, 10);
        assert_eq!(s.to_server().connections_accepted, 4);
        let msg = FromShard::Done {
            totals: s,
            peak_rss_kib: Some(7),
        };
        let line = serde_json::to_string(&msg).unwrap();
        assert_eq!(serde_json::from_str::<FromShard>(&line).unwrap(), msg);
    }
}
