//! What this machine forwards through a testbed's shapers.
//!
//! A testbed's hosts, the bridges that join them and the shapers on its
//! links all run on the one machine's CPUs. A link at its rate costs that
//! machine CPU; several links at once cost it several times over. Links
//! whose limits sum past what the machine moves cannot all be at their
//! rate at once, whatever stack runs over them: the emulator, not the
//! links, would bound such a figure.
//!
//! [`calibrate`] measures it once, when a testbed is first shaped: kernel
//! TCP streams across the testbed's first host's links, both ways (each
//! direction of a link has a shaper of its own), with offloads on and the
//! shapers in place but set to [`CALIBRATION_RATE_BPS`], above anything a
//! veth moves, so that only the CPUs bound them. The best of a few windows
//! after a warm-up is what the machine forwards; other work on a busy
//! machine lowers it, never raises it.

use crate::shaping::{condition_links, resolve};
use crate::{Params, TestbedError};
use netgap_core::hosts::{Forwarding, HostsFile};
use netgap_core::link::LinkConditions;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shapers' rate while the machine is calibrated: above what any veth
/// path here moves, so the shapers' work is counted and their rate never
/// binds.
pub const CALIBRATION_RATE_BPS: u64 = 100_000_000_000;
/// Time the streams run before the first window: slow start and the
/// shapers' buckets behind them.
const WARMUP: Duration = Duration::from_millis(300);
/// One window of the calibration.
const WINDOW: Duration = Duration::from_millis(250);
/// Windows measured; the best is kept.
const WINDOWS: u32 = 3;
/// Most streams at once: more than the CPUs only adds their switching.
const MAX_STREAMS: usize = 8;
/// Bytes each stream writes per call.
const WRITE_BYTES: usize = 128 * 1024;
/// How long a stream's socket waits on its peer before the calibration
/// gives up on it.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The share of what the machine forwards that a figure's links may sum
/// to (the physics check's own).
pub use netgap_core::physics::FORWARDING_CARRY_SHARE as CARRY_SHARE;

/// One stream of the calibration: from the namespace `from` to `to_addr`
/// in the namespace `to`.
struct StreamPlan {
    from: String,
    to: String,
    to_addr: IpAddr,
}

/// The streams: every link of the first host to each other host, one each
/// way, up to [`MAX_STREAMS`] and at least one each way.
fn stream_plans(hosts: &HostsFile, cores: usize) -> Vec<StreamPlan> {
    let Some(first) = hosts.hosts.first() else {
        return Vec::new();
    };
    let ns = |name: &str| {
        hosts
            .host(name)
            .and_then(|h| h.netns.clone())
            .unwrap_or_default()
    };
    let mut pairs: Vec<(String, IpAddr, String, IpAddr)> = first
        .links
        .iter()
        .map(|l| (first.name.clone(), l.local, l.peer.clone(), l.remote))
        .collect();
    if pairs.is_empty() {
        // A switch with one link: the second host over it.
        if let Some(second) = hosts.hosts.get(1) {
            pairs.push((
                first.name.clone(),
                first.address,
                second.name.clone(),
                second.address,
            ));
        }
    }
    let wanted = (2 * pairs.len()).clamp(2, cores.clamp(2, MAX_STREAMS));
    let mut plans = Vec::new();
    for i in 0..wanted {
        let Some((a, a_addr, b, b_addr)) = pairs.get((i / 2) % pairs.len().max(1)) else {
            break;
        };
        plans.push(if i % 2 == 0 {
            StreamPlan {
                from: ns(a),
                to: ns(b),
                to_addr: *b_addr,
            }
        } else {
            StreamPlan {
                from: ns(b),
                to: ns(a),
                to_addr: *a_addr,
            }
        });
    }
    plans
}

/// A thread in namespace `ns` running `f`.
fn spawn_in<T: Send + 'static>(
    ns: String,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<std::io::Result<T>>> {
    std::thread::Builder::new()
        .name(format!("calibrate {ns}"))
        .spawn(move || {
            netgap_transport::netns::enter(&ns).map_err(std::io::Error::other)?;
            f()
        })
}

/// The calibration's failure, as one line.
fn failed(detail: impl std::fmt::Display) -> TestbedError {
    TestbedError::Io {
        what: "calibrating what this machine forwards through the testbed's shapers".into(),
        source: std::io::Error::other(detail.to_string()),
    }
}

/// Runs `plans` at once and returns the best window's payload in Mbit/s.
fn measure(plans: Vec<StreamPlan>) -> Result<u64, TestbedError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut counters = Vec::new();
    let mut threads = Vec::new();
    let result = (|| -> Result<u64, TestbedError> {
        for p in plans {
            let received = Arc::new(AtomicU64::new(0));
            counters.push(Arc::clone(&received));
            let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<SocketAddr>>();
            let to_addr = p.to_addr;
            threads.push(
                spawn_in(p.to.clone(), move || {
                    let listener = TcpListener::bind((to_addr, 0));
                    let listener = match listener {
                        Ok(l) => {
                            let _ = tx.send(l.local_addr());
                            l
                        }
                        Err(e) => {
                            let _ = tx.send(Err(std::io::Error::new(e.kind(), e.to_string())));
                            return Err(e);
                        }
                    };
                    let (mut conn, _) = listener.accept()?;
                    conn.set_read_timeout(Some(IO_TIMEOUT))?;
                    let mut buf = vec![0u8; 4 * WRITE_BYTES];
                    loop {
                        match conn.read(&mut buf)? {
                            0 => return Ok(()),
                            n => received.fetch_add(n as u64, Ordering::Relaxed),
                        };
                    }
                })
                .map_err(failed)?,
            );
            let addr = rx
                .recv_timeout(IO_TIMEOUT)
                .map_err(|_| failed("a receiver did not start"))?
                .map_err(failed)?;
            let stop = Arc::clone(&stop);
            threads.push(
                spawn_in(p.from.clone(), move || {
                    let mut conn = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
                    conn.set_write_timeout(Some(IO_TIMEOUT))?;
                    let buf = vec![0x5au8; WRITE_BYTES];
                    while !stop.load(Ordering::Relaxed) {
                        conn.write_all(&buf)?;
                    }
                    conn.shutdown(std::net::Shutdown::Write)
                })
                .map_err(failed)?,
            );
        }
        let total = || -> u64 { counters.iter().map(|c| c.load(Ordering::Relaxed)).sum() };
        std::thread::sleep(WARMUP);
        let mut best_mbps = 0u64;
        for _ in 0..WINDOWS {
            let (t0, b0) = (Instant::now(), total());
            std::thread::sleep(WINDOW);
            let bits = (total() - b0) as f64 * 8.0;
            let mbps = bits / t0.elapsed().as_secs_f64() / 1e6;
            best_mbps = best_mbps.max(mbps as u64);
        }
        Ok(best_mbps)
    })();
    stop.store(true, Ordering::Relaxed);
    let mut first_error = None;
    for t in threads {
        match t.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
            Err(_) => {
                first_error.get_or_insert_with(|| "a stream's thread panicked".into());
            }
        }
    }
    let mbps = result?;
    match first_error {
        Some(e) => Err(failed(e)),
        None if mbps == 0 => Err(failed("no stream moved a byte")),
        None => Ok(mbps),
    }
}

/// Measures what testbed `name` (built with `p`, its links under
/// `applied`) forwards through its shapers, and puts its links back under
/// `applied`, also when the measurement failed.
pub fn calibrate(
    name: &str,
    p: &Params,
    hosts: &HostsFile,
    applied: &LinkConditions,
) -> Result<Forwarding, TestbedError> {
    let lifted = resolve(
        name,
        &LinkConditions {
            rate_bps: Some(CALIBRATION_RATE_BPS),
            bucket_bytes: None,
            delay_us: None,
            loss_ppm: None,
            loss_by: None,
            // Offloads off cost the forwarding per frame rather than per
            // segment: the machine's capacity is measured at its best, and a
            // stack without offloads pays its own frames.
            offload: applied.offload.map(|_| true),
            ..*applied
        },
    )?;
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let plans = stream_plans(hosts, cores);
    let streams = u32::try_from(plans.len()).unwrap_or(u32::MAX);
    condition_links(name, p, Some(applied), &lifted)?;
    let measured = measure(plans);
    condition_links(name, p, Some(&lifted), applied)?;
    Ok(Forwarding {
        payload_mbps: measured?,
        mtu_bytes: applied.mtu_bytes,
        streams,
        declared: false,
    })
}

/// What the operator declared the machine forwards (`--forwarding`), in
/// bit/s of payload, at links of `mtu_bytes`.
pub fn declared(payload_bps: u64, mtu_bytes: u32) -> Forwarding {
    Forwarding {
        payload_mbps: payload_bps / 1_000_000,
        mtu_bytes,
        streams: 0,
        declared: true,
    }
}

/// The fastest link rate the machine `forwarding` carries for `shapers`
/// shaped link directions at once ([`netgap_core::physics::carried_rate_bps`]).
pub fn carried_rate_bps(forwarding: &Forwarding, shapers: u32, mtu_bytes: u32) -> u64 {
    netgap_core::physics::carried_rate_bps(forwarding.payload_mbps, shapers, mtu_bytes)
}

pub use netgap_core::units::rate_text;
