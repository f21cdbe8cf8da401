//! From what the user typed to what will be measured. [`RunArgs`] holds the
//! raw flags of `netgap run`; [`Plan::from_args`] validates them into the
//! points, the method and the outputs, or fails with one line naming the
//! offending input.

use crate::bench;
use crate::control::ControlAddr;
use crate::runner::{CiTarget, IterationPolicy, Method};
use netgap_core::spec::{check_size, Mode, PointSpec, TransportOptions, MAX_ITERATIONS};
use netgap_core::units::{parse_duration, parse_size_bytes, parse_size_list};
use netgap_transport as transport;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// The agent's control port when `--peer` names none.
pub const DEFAULT_PORT: u16 = 7100;
/// Default repetitions per point (the seeds' method).
pub const DEFAULT_REPS: u32 = 10;
/// Default time budget of one repetition.
pub const DEFAULT_REP_TIME: &str = "100ms";
/// Default data-path inactivity timeout.
pub const DEFAULT_TIMEOUT: &str = "3s";
/// Most repetitions per point.
pub const MAX_REPS: u32 = 10_000;
/// Iterations per repetition of `--paper` (the seeds' setting).
pub const PAPER_ITERATIONS: u64 = 100_000;

/// The tests of the default battery, in order.
pub const BATTERY_TESTS: &str = "pingpong,stream,bibw-pingpong,bibw";

/// Raw flags of a run, as typed.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Tests to run, comma separated (see `netgap list`).
    #[arg(value_name = "TEST[,TEST...]")]
    pub test: String,
    /// Agent to drive, `HOST[:PORT]` (default port 7100) or `unix:PATH`;
    /// without it an agent runs in-process on loopback.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub peer: Option<String>,
    /// Shared key file of the agent (see `netgap key new`), or of every
    /// agent of `--hosts` (default: the hosts file's `key_file`).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Transports, comma separated.
    #[arg(long, short = 't', default_value = "tcp", value_name = "T[,T...]")]
    pub transport: String,
    /// Completion modes, comma separated: event (block), poll (spin).
    #[arg(long, default_value = "event", value_name = "event|poll")]
    pub mode: String,
    /// Message sizes: a list 1,64,1K, a range of powers of two 1..4M, or a
    /// range with a factor 1..4M:x4.
    #[arg(long, short = 's', default_value = "1,64,1K,16K,64K,1M")]
    pub sizes: String,
    /// Measured repetitions per point; the highest and lowest are dropped
    /// from the headline.
    #[arg(long, default_value_t = DEFAULT_REPS)]
    pub reps: u32,
    /// Fixed iterations per repetition (instead of --rep-time).
    #[arg(long, short = 'n', conflicts_with = "rep_time")]
    pub iterations: Option<u64>,
    /// Time budget per repetition; the iteration count is calibrated to fill it.
    #[arg(long, value_name = "DUR")]
    pub rep_time: Option<String>,
    /// Uncounted warm-up iterations before each point.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// The seeds' setting: 10 repetitions of 100,000 iterations.
    #[arg(long, conflicts_with_all = ["iterations", "rep_time", "reps"])]
    pub paper: bool,
    /// Use IPv6 loopback for the in-process agent.
    #[arg(long, short = '6')]
    pub ipv6: bool,
    /// Turn TCP_NODELAY off (Nagle's algorithm on).
    #[arg(long)]
    pub no_nodelay: bool,
    /// SO_SNDBUF of the data flow, e.g. 512K.
    #[arg(long, value_name = "BYTES")]
    pub sndbuf: Option<String>,
    /// SO_RCVBUF of the data flow, e.g. 512K.
    #[arg(long, value_name = "BYTES")]
    pub rcvbuf: Option<String>,
    /// Pin the client and server roles: CLIENT_CPU,SERVER_CPU (e.g. 0,1).
    #[arg(long, value_name = "C,S")]
    pub pin: Option<String>,
    /// MSG_ZEROCOPY sends with their completions reaped (tcp).
    #[arg(long)]
    pub zerocopy: bool,
    /// SO_BUSY_POLL: busy-wait this many microseconds in the kernel on receive (tcp).
    #[arg(long, value_name = "USECS")]
    pub busy_poll: Option<u32>,
    /// TCP_QUICKACK: acknowledge at once instead of delaying ACKs (tcp).
    #[arg(long)]
    pub quickack: bool,
    /// TCP_CORK around each message: send full segments only (tcp).
    #[arg(long)]
    pub cork: bool,
    /// TCP congestion control algorithm, e.g. cubic or bbr (tcp).
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// io_uring kernel-side submission polling (uring).
    #[arg(long)]
    pub sqpoll: bool,
    /// Check every payload byte received against the pattern sent.
    #[arg(long)]
    pub verify: bool,
    /// Data-path inactivity timeout: a peer silent this long is gone.
    #[arg(long, default_value = DEFAULT_TIMEOUT, value_name = "DUR")]
    pub timeout: String,
    /// Append one JSON line per measured point to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Append one CSV row per measured point to FILE.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Repeat each point until the LEVEL% confidence interval of the mean is
    /// within ±WIDTH% of it (e.g. 99,2), between the --ci-reps bounds;
    /// results record whether it was met. Without it, --reps repetitions.
    #[arg(long, value_name = "LEVEL,WIDTH", conflicts_with = "paper")]
    pub ci: Option<String>,
    /// Fewest and most repetitions of a --ci point.
    #[arg(long, value_name = "MIN,MAX", default_value = "3,30", requires = "ci")]
    pub ci_reps: String,
    /// Multi-host tests: the hosts, `@FILE` (a hosts file) or
    /// `ADDR,ADDR,...` (agents' control addresses, IP:PORT or unix:PATH);
    /// the first is the server, the rest client hosts. Without it,
    /// in-process agents on loopback stand in for the hosts.
    #[arg(long, value_name = "@FILE|ADDR,...")]
    pub hosts: Option<String>,
    /// Multi-host tests without --hosts: in-process client hosts on
    /// loopback (127.0.0.2, 127.0.0.3, ...).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub client_hosts: u32,
    /// Multi-host tests: concurrent clients, one point per count (e.g.
    /// 3,6,9,12); default one per client host.
    #[arg(long, value_name = "N[,N...]")]
    pub clients: Option<String>,
    /// multistream: parallel streams, one point per count.
    #[arg(long, short = 'P', default_value = "4", value_name = "N[,N...]")]
    pub streams: String,
    /// Multi-host tests: measured window of each repetition.
    #[arg(long, default_value = "1s", value_name = "DUR")]
    pub duration: String,
    /// multirail without --hosts: parallel loopback links (address pairs).
    #[arg(long, default_value_t = 3, value_name = "K")]
    pub links: u32,
}

/// Parses `--ci LEVEL,WIDTH` and `--ci-reps MIN,MAX` into a target; `None`
/// without `--ci`.
pub fn parse_ci(ci: Option<&str>, ci_reps: &str) -> Result<Option<CiTarget>, PlanError> {
    let Some(ci) = ci else { return Ok(None) };
    let pair = |flag: &str, text: &str| -> Result<(String, String), PlanError> {
        match text
            .split(',')
            .map(str::trim)
            .collect::<Vec<_>>()
            .as_slice()
        {
            [a, b] => Ok((a.to_string(), b.to_string())),
            _ => Err(bad(format!(
                "{flag} {text}: expected two numbers separated by a comma"
            ))),
        }
    };
    let (level, width) = pair("--ci", ci)?;
    let num = |t: &str| {
        t.trim_end_matches('%')
            .parse::<f64>()
            .map_err(|_| bad(format!("--ci {ci}: {t:?} is not a number")))
    };
    let (min, max) = pair("--ci-reps", ci_reps)?;
    let count = |t: &str| {
        t.parse::<u32>()
            .ok()
            .filter(|&n| n <= MAX_REPS)
            .ok_or_else(|| {
                bad(format!(
                    "--ci-reps {ci_reps}: {t:?} is not a count up to {MAX_REPS}"
                ))
            })
    };
    CiTarget::new(num(&level)?, num(&width)?, count(&min)?, count(&max)?)
        .map(Some)
        .map_err(|e| bad(format!("--ci {ci} --ci-reps {ci_reps}: {e}")))
}

/// Parses `RunArgs` alone, so defaults come from one place: the flags.
#[derive(clap::Parser)]
struct RunArgsOnly {
    #[command(flatten)]
    args: RunArgs,
}

impl RunArgs {
    /// The flags of `netgap run TESTS` with every other flag at its default.
    pub fn with_defaults(tests: &str) -> RunArgs {
        use clap::Parser;
        match RunArgsOnly::try_parse_from(["netgap", tests]) {
            Ok(p) => p.args,
            // Only a test list starting with '-' fails to parse; keep it as
            // the test name so validation reports it as unknown.
            Err(_) => RunArgs {
                test: tests.to_string(),
                ..RunArgsOnly::parse_from(["netgap", "x"]).args
            },
        }
    }
}

/// Where the agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// An agent started in this process on loopback.
    Embedded {
        /// Use ::1 instead of 127.0.0.1.
        ipv6: bool,
    },
    /// A running `netgap serve`.
    Remote {
        /// As typed.
        label: String,
        /// Resolved control address.
        addr: ControlAddr,
    },
}

/// A validated run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Points in measurement order.
    pub points: Vec<PointSpec>,
    /// Repetitions, iterations, warm-up.
    pub method: Method,
    /// The agent.
    pub peer: Peer,
    /// CPU of the client role, if pinned.
    pub client_cpu: Option<u32>,
    /// JSON Lines output.
    pub json: Option<PathBuf>,
    /// CSV output.
    pub csv: Option<PathBuf>,
    /// Shared key file the agent requires.
    pub key_file: Option<PathBuf>,
}

/// Bad input: one line naming what was wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

fn bad(msg: impl Into<String>) -> PlanError {
    PlanError(msg.into())
}

fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

/// Parses `HOST[:PORT]`, `[V6]:PORT` or a bare IPv6 address.
pub fn resolve_peer(s: &str) -> Result<SocketAddr, PlanError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(bad("empty --peer"));
    }
    let with_port = if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        SocketAddr::new(ip, DEFAULT_PORT).to_string()
    } else if s.starts_with('[') && s.ends_with(']') {
        format!("{s}:{DEFAULT_PORT}")
    } else if s.contains(':') {
        s.to_string()
    } else {
        format!("{s}:{DEFAULT_PORT}")
    };
    let mut addrs = with_port
        .to_socket_addrs()
        .map_err(|e| bad(format!("bad peer {s:?}: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| bad(format!("bad peer {s:?}: the name resolves to no address")))
}

fn parse_buffer(flag: &str, v: &Option<String>) -> Result<Option<u32>, PlanError> {
    let Some(v) = v else { return Ok(None) };
    let bytes = parse_size_bytes(v).map_err(|e| bad(format!("{flag}: {e}")))?;
    if bytes == 0 || bytes > u64::from(netgap_core::spec::MAX_SOCKET_BUFFER_BYTES) {
        return Err(bad(format!("{flag} {v}: must be between 1 byte and 1G")));
    }
    Ok(Some(bytes as u32))
}

fn parse_pin(v: &Option<String>) -> Result<(Option<u32>, Option<u32>), PlanError> {
    let Some(v) = v else { return Ok((None, None)) };
    let cpus: Vec<&str> = v.split(',').map(str::trim).collect();
    let parse = |c: &str| {
        c.parse::<u32>()
            .ok()
            .filter(|&c| c <= netgap_core::spec::MAX_CPU_INDEX)
            .ok_or_else(|| bad(format!("--pin {v}: {c:?} is not a CPU number")))
    };
    match cpus.as_slice() {
        [c, s] => Ok((Some(parse(c)?), Some(parse(s)?))),
        [c] => Ok((Some(parse(c)?), Some(parse(c)?))),
        _ => Err(bad(format!(
            "--pin {v}: expected CLIENT_CPU,SERVER_CPU such as 0,1"
        ))),
    }
}

impl Plan {
    /// Validates the raw flags of a run.
    pub fn from_args(a: &RunArgs) -> Result<Plan, PlanError> {
        if a.key.is_some() && a.peer.is_none() && a.hosts.is_none() {
            return Err(bad(
                "--key needs --peer or --hosts: in-process agents run without a key",
            ));
        }
        let mut tests = Vec::new();
        for name in split_list(&a.test) {
            let t = bench::find(name).ok_or_else(|| {
                bad(format!(
                    "unknown test {name:?}; available: {}",
                    bench::names()
                ))
            })?;
            tests.push(t);
        }
        if tests.is_empty() {
            return Err(bad("no test given; see `netgap list`"));
        }
        let mut transports = Vec::new();
        for name in split_list(&a.transport) {
            let t = transport::find(name).ok_or_else(|| {
                bad(format!(
                    "unknown transport {name:?}; available: {}",
                    transport::names()
                ))
            })?;
            if let Err(why) = t.availability() {
                return Err(bad(format!(
                    "transport {name} is not available here: {why}"
                )));
            }
            transports.push(t);
        }
        if transports.is_empty() {
            return Err(bad("no transport given; see `netgap list`"));
        }
        let mut modes = Vec::new();
        for m in split_list(&a.mode) {
            modes.push(match m {
                "event" => Mode::Event,
                "poll" => Mode::Poll,
                other => return Err(bad(format!("unknown mode {other:?}; use event or poll"))),
            });
        }
        if modes.is_empty() {
            return Err(bad("no mode given; use event or poll"));
        }
        let sizes = parse_size_list(&a.sizes).map_err(|e| bad(format!("--sizes: {e}")))?;
        for &s in &sizes {
            check_size(s).map_err(|_| {
                bad(format!(
                    "--sizes: size {s} is out of range: sizes go from 1 byte to {}",
                    netgap_core::units::format_size(netgap_core::spec::MAX_SIZE_BYTES)
                ))
            })?;
        }
        for t in &transports {
            let max = t.max_message_bytes().unwrap_or(u64::MAX);
            if let Some(&s) = sizes.iter().find(|&&s| s > max) {
                return Err(bad(format!(
                    "--sizes: size {} is larger than the largest message transport {} carries, {max} bytes",
                    netgap_core::units::format_size(s),
                    t.name()
                )));
            }
        }

        let (reps, iterations) = if a.paper {
            (DEFAULT_REPS, IterationPolicy::Fixed(PAPER_ITERATIONS))
        } else {
            let it = match (a.iterations, &a.rep_time) {
                (Some(n), _) => {
                    if n == 0 || n > MAX_ITERATIONS {
                        return Err(bad(format!(
                            "--iterations {n}: must be between 1 and {MAX_ITERATIONS}"
                        )));
                    }
                    IterationPolicy::Fixed(n)
                }
                (None, rt) => {
                    let text = rt.as_deref().unwrap_or(DEFAULT_REP_TIME);
                    let d = parse_duration(text).map_err(|e| bad(format!("--rep-time: {e}")))?;
                    if d < Duration::from_micros(100) || d > Duration::from_secs(3600) {
                        return Err(bad(format!(
                            "--rep-time {text}: must be between 100us and 1h"
                        )));
                    }
                    IterationPolicy::Budget(d)
                }
            };
            (a.reps, it)
        };
        if reps == 0 || reps > MAX_REPS {
            return Err(bad(format!(
                "--reps {reps}: must be between 1 and {MAX_REPS}"
            )));
        }
        if let Some(w) = a.warmup {
            if w > MAX_ITERATIONS {
                return Err(bad(format!("--warmup {w}: at most {MAX_ITERATIONS}")));
            }
        }
        let timeout = parse_duration(&a.timeout).map_err(|e| bad(format!("--timeout: {e}")))?;
        if timeout < Duration::from_millis(10)
            || timeout.as_millis() > u128::from(netgap_core::spec::MAX_IO_TIMEOUT_MS)
        {
            return Err(bad(format!(
                "--timeout {}: must be between 10ms and 10m",
                a.timeout
            )));
        }
        let options = TransportOptions {
            nodelay: !a.no_nodelay,
            sndbuf_bytes: parse_buffer("--sndbuf", &a.sndbuf)?,
            rcvbuf_bytes: parse_buffer("--rcvbuf", &a.rcvbuf)?,
            zerocopy: a.zerocopy,
            busy_poll_us: a.busy_poll,
            quickack: a.quickack,
            cork: a.cork,
            congestion: a.congestion.clone(),
            sqpoll: a.sqpoll,
        };
        let (client_cpu, server_cpu) = parse_pin(&a.pin)?;
        for tr in &transports {
            let honoured = tr.capabilities().options;
            if let Some(flag) = options
                .flags_set()
                .into_iter()
                .find(|f| !honoured.contains(f))
            {
                let which = if honoured.is_empty() {
                    "it takes no options".to_string()
                } else {
                    format!("it takes {}", honoured.join(", "))
                };
                return Err(bad(format!(
                    "{flag} does not apply to transport {} ({which})",
                    tr.name()
                )));
            }
        }
        let ci = parse_ci(a.ci.as_deref(), &a.ci_reps)?;

        let peer = match &a.peer {
            None => Peer::Embedded { ipv6: a.ipv6 },
            Some(p) => {
                let addr = match ControlAddr::parse(p.trim()) {
                    Some(a @ ControlAddr::Unix(_)) => a,
                    _ => ControlAddr::Tcp(resolve_peer(p)?),
                };
                Peer::Remote {
                    label: p.clone(),
                    addr,
                }
            }
        };
        if let Peer::Remote {
            addr: ControlAddr::Tcp(addr),
            label,
        } = &peer
        {
            if !addr.ip().is_loopback() {
                if let Some(t) = transports.iter().find(|t| !t.capabilities().cross_host) {
                    return Err(bad(format!(
                        "transport {} works only on one host, but --peer {label} is not a loopback address",
                        t.name()
                    )));
                }
            }
        }

        let mut points = Vec::new();
        for t in &tests {
            for tr in &transports {
                for &mode in &modes {
                    if !tr.capabilities().modes.contains(&mode) {
                        return Err(bad(format!("transport {} has no {mode} mode", tr.name())));
                    }
                    for &size in &sizes {
                        let point = PointSpec {
                            test: t.name().to_string(),
                            transport: tr.name().to_string(),
                            mode,
                            size_bytes: size,
                            options: options.clone(),
                            server_cpu,
                            io_timeout_ms: timeout.as_millis() as u32,
                            verify: a.verify,
                        };
                        point
                            .validate()
                            .map_err(|e| bad(format!("invalid option: {e}")))?;
                        points.push(point);
                    }
                }
            }
        }
        Ok(Plan {
            points,
            method: Method {
                reps,
                iterations,
                warmup: a.warmup,
                ci,
            },
            peer,
            client_cpu,
            json: a.json.clone(),
            csv: a.csv.clone(),
            key_file: a.key.clone(),
        })
    }

    /// The default battery, plain `netgap`: the four point-to-point tests over
    /// tcp and unix on loopback, sizes 1 B to 4 MiB in steps of 4, with a
    /// short time budget so the whole battery runs in well under a minute.
    pub fn battery(json: PathBuf) -> Plan {
        // The point-to-point tests only: others in the registry (logp's
        // overhead probes) belong to their own commands.
        let mut args = RunArgs::with_defaults(BATTERY_TESTS);
        args.transport = "tcp,unix".into();
        args.sizes = "1..4M:x4".into();
        args.rep_time = Some("15ms".into());
        args.json = Some(json);
        // The battery's flags are fixed and valid; a failure here is a bug in
        // this function, caught by its unit test.
        #[allow(clippy::expect_used, reason = "constant, unit-tested input")]
        Plan::from_args(&args).expect("battery plan is valid")
    }

    /// Options as recorded in results.
    pub fn record_options(&self, spec: &PointSpec) -> netgap_core::record::RecordOptions {
        let (iterations, rep_time_ms) = match self.method.iterations {
            IterationPolicy::Fixed(n) => (Some(n), None),
            IterationPolicy::Budget(d) => (None, Some(d.as_millis() as u64)),
        };
        netgap_core::record::RecordOptions {
            peer: match &self.peer {
                Peer::Embedded { .. } => "embedded".into(),
                Peer::Remote { addr, .. } => addr.to_string(),
            },
            transport: spec.options.clone(),
            verify: spec.verify,
            placement: netgap_core::record::Placement {
                client_cpu: self.client_cpu,
                server_cpu: spec.server_cpu,
            },
            reps: self.method.reps,
            iterations,
            rep_time_ms,
            warmup: self.method.warmup,
            io_timeout_ms: spec.io_timeout_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(test: &str) -> RunArgs {
        let mut a = RunArgs::with_defaults(test);
        a.sizes = "1".into();
        a
    }

    #[test]
    fn battery_covers_four_tests_two_transports_twelve_sizes() {
        let p = Plan::battery(PathBuf::from("x.jsonl"));
        assert_eq!(p.points.len(), 4 * 2 * 12);
        assert_eq!(p.points.last().map(|s| s.size_bytes), Some(4 << 20));
    }

    #[test]
    fn unknown_names_are_refused_with_the_list() {
        let e = Plan::from_args(&args("pingpnog")).unwrap_err().0;
        assert!(
            e.contains("unknown test \"pingpnog\"") && e.contains("pingpong"),
            "{e}"
        );
        let mut a = args("pingpong");
        a.transport = "carrier-pigeon".into();
        assert!(Plan::from_args(&a)
            .unwrap_err()
            .0
            .contains("unknown transport"));
    }

    #[test]
    fn size_zero_and_oversize_are_refused() {
        let mut a = args("pingpong");
        a.sizes = "0".into();
        assert!(Plan::from_args(&a).unwrap_err().0.contains("out of range"));
        a.sizes = "1G".into();
        assert!(Plan::from_args(&a).unwrap_err().0.contains("out of range"));
    }

    #[test]
    fn pin_and_paper_resolve() {
        let mut a = args("pingpong");
        a.pin = Some("0,1".into());
        a.paper = true;
        let p = Plan::from_args(&a).expect("valid");
        assert_eq!(p.client_cpu, Some(0));
        assert_eq!(p.points[0].server_cpu, Some(1));
        assert_eq!(
            p.method.iterations,
            IterationPolicy::Fixed(PAPER_ITERATIONS)
        );
        a.pin = Some("x".into());
        assert!(Plan::from_args(&a).is_err());
    }

    #[test]
    fn peer_forms_resolve() {
        assert_eq!(
            resolve_peer("127.0.0.1").map(|a| a.port()).ok(),
            Some(DEFAULT_PORT)
        );
        assert_eq!(resolve_peer("127.0.0.1:9").map(|a| a.port()).ok(), Some(9));
        assert_eq!(resolve_peer("::1").map(|a| a.is_ipv6()).ok(), Some(true));
        assert_eq!(resolve_peer("[::1]:9").map(|a| a.port()).ok(), Some(9));
        assert!(resolve_peer("no such host.invalid").is_err());
    }

    #[test]
    fn sizes_above_a_transports_largest_message_are_refused() {
        let mut a = args("pingpong");
        a.transport = "tcp,udp".into();
        a.sizes = "1,60K".into();
        assert!(Plan::from_args(&a).is_ok());
        a.sizes = "1,100K".into();
        let e = Plan::from_args(&a).unwrap_err().0;
        assert!(
            e.contains("100K") && e.contains("udp") && e.contains("65483 bytes"),
            "{e}"
        );
    }

    #[test]
    fn ci_flags_parse_and_bad_ones_are_refused() {
        let t = parse_ci(Some("99,2"), "3,30")
            .expect("valid")
            .expect("some");
        assert_eq!((t.confidence_pct, t.half_width_pct), (99.0, 2.0));
        assert_eq!((t.min_reps, t.max_reps), (3, 30));
        assert!(parse_ci(None, "3,30").expect("valid").is_none());
        for (ci, reps) in [
            ("99", "3,30"),
            ("x,2", "3,30"),
            ("99,2", "1,30"),
            ("100,2", "3,30"),
            ("99,2", "9,3"),
        ] {
            assert!(parse_ci(Some(ci), reps).is_err(), "{ci} {reps}");
        }
    }

    #[test]
    fn unix_is_refused_for_a_remote_peer() {
        let mut a = args("pingpong");
        a.transport = "unix".into();
        a.peer = Some("192.0.2.1".into());
        assert!(Plan::from_args(&a).unwrap_err().0.contains("one host"));
    }

    #[test]
    fn an_option_a_transport_ignores_is_refused() {
        let mut a = args("pingpong");
        a.transport = "unix".into();
        a.cork = true;
        let e = Plan::from_args(&a).unwrap_err().0;
        assert!(e.contains("--cork does not apply to transport unix"), "{e}");
        a.transport = "tcp".into();
        assert!(Plan::from_args(&a).is_ok());
        a.cork = false;
        a.transport = "shm".into();
        a.sndbuf = Some("64K".into());
        let e = Plan::from_args(&a).unwrap_err().0;
        assert!(e.contains("takes no options"), "{e}");
    }
}
