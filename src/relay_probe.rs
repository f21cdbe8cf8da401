//! The relay's answer to probes from other hosts: does a program under
//! the preload library listen on this TCP port here?
//!
//! A connector's library on another host asks before it sends its relay
//! hello on a new connection, since a server without the library would
//! read the hello as its own data (a request it cannot parse, or worse).
//! The answer comes from the listeners' beacons: a listener under the
//! library holds an abstract Unix socket `netgap-preload.UID.FAMILY.PORT`
//! for as long as it listens, which `/proc/net/unix` shows (to root, for
//! the network namespace).
//!
//! Limits: a probe is one datagram of exactly [`PROBE_BYTES`] and so is
//! the answer (no amplification); `/proc/net/unix` is read at most every
//! 50 ms and at most 4 MiB of it; at most 5000 answers a second, the rest
//! dropped.

use netgap_proto::preload::{Probe, ProbeAnswer, PROBE_BYTES, PROBE_PORT};
use std::collections::HashSet;
use std::io::Read;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// How old the listeners read from `/proc/net/unix` may be.
const SCAN_EVERY: Duration = Duration::from_millis(50);
/// Most bytes of `/proc/net/unix` read (about 40 000 sockets).
const MAX_SCAN_BYTES: u64 = 4 << 20;
/// Most answers a second.
const MAX_ANSWERS_PER_S: u32 = 5000;

/// Starts answering probes on UDP port [`PROBE_PORT`] (IPv6 and IPv4),
/// in a thread of its own; `Err` is one line saying why not (connectors
/// on other hosts then keep the kernel's TCP, safely).
pub fn spawn() -> Result<(), String> {
    let sock = UdpSocket::bind(("::", PROBE_PORT))
        .or_else(|_| UdpSocket::bind(("0.0.0.0", PROBE_PORT)))
        .map_err(|e| format!("cannot answer probes on UDP port {PROBE_PORT}: {e}"))?;
    std::thread::Builder::new()
        .name("relay-probe".into())
        .spawn(move || serve(&sock))
        .map_err(|e| format!("no thread to answer probes: {e}"))?;
    Ok(())
}

fn serve(sock: &UdpSocket) {
    let mut listening: HashSet<(u8, u16)> = HashSet::new();
    let mut scanned: Option<Instant> = None;
    let mut second = Instant::now();
    let mut answered = 0u32;
    let mut buf = [0u8; PROBE_BYTES + 1];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Ok(probe) = Probe::decode(&buf[..n]) else {
            continue;
        };
        if second.elapsed() >= Duration::from_secs(1) {
            second = Instant::now();
            answered = 0;
        }
        if answered >= MAX_ANSWERS_PER_S {
            continue;
        }
        answered += 1;
        if scanned.is_none_or(|t| t.elapsed() >= SCAN_EVERY) {
            listening = read_listeners();
            scanned = Some(Instant::now());
        }
        let answer = ProbeAnswer {
            port: probe.port,
            listening: listening.contains(&(probe.family, probe.port)),
            nonce: probe.nonce,
        };
        let _ = sock.send_to(&answer.encode(), from);
    }
}

/// The (family, port) pairs with a listener's beacon in this network
/// namespace; empty if `/proc/net/unix` cannot be read.
fn read_listeners() -> HashSet<(u8, u16)> {
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open("/proc/net/unix") {
        let _ = f.take(MAX_SCAN_BYTES).read_to_string(&mut text);
    }
    beacons(&text)
}

/// The beacons in `/proc/net/unix`'s text: the last field of a line is the
/// socket's path, `@` first for an abstract name.
fn beacons(text: &str) -> HashSet<(u8, u16)> {
    text.lines()
        .filter_map(|line| {
            let name = line.split_whitespace().last()?;
            let rest = name.strip_prefix("@netgap-preload.")?;
            let mut parts = rest.split('.');
            let (Some(uid), Some(family), Some(port), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return None;
            };
            uid.parse::<u32>().ok()?;
            let family: u8 = family.parse().ok().filter(|f| *f == 4 || *f == 6)?;
            let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
            Some((family, port))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn the_beacons_are_read_from_proc_net_unix_and_nothing_else() {
        let text = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00000000 0002 01 27446 @netgap-preload.0.4.8080
0000000000000000: 00000002 00000000 00000000 0002 01 27447 @netgap-preload.33.6.443
0000000000000000: 00000002 00000000 00000000 0002 01 27448 @netgap-preload.33.5.1
0000000000000000: 00000002 00000000 00000000 0002 01 27449 @netgap-preload.x.4.2
0000000000000000: 00000002 00000000 00000000 0002 01 27450 @netgap-relay
0000000000000000: 00000002 00000000 00000000 0002 01 27451 /run/netgap-preload.0.4.9
0000000000000000: 00000002 00000000 00000000 0002 01 27452
";
        let b = beacons(text);
        assert_eq!(b, HashSet::from([(4, 8080), (6, 443)]));
        assert!(beacons("").is_empty());
    }
}
