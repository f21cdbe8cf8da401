//! A gather host's server role: real gmond started through the agent, or
//! the built-in responder answering every connection with the same
//! regenerable bytes, kept serving over the window.

use super::{refused, Params, Responder, MAX_GMOND_BYTES, SERVER_GRACE};
use crate::role::{
    find_transport, meter_window_counting, metered, window, OpenRole, ReadyRole, RoleContext,
    RoleError, RoleResult, Stop, STOP_TICK,
};
use crate::service::{self, gmond, RunDir, Running};
use crate::web::fileset::mix64;
use netgap_proto::dataproof::DataToken;
use netgap_proto::workload::WorkloadOutcome;
use netgap_transport::buffer::{AlignedBuffer, BufferLayout};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::{FlowConfig, Programs, TransportError};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The answer of the built-in responder: `size` bytes anyone can
/// regenerate.
pub(super) fn answer(size: u64) -> Vec<u8> {
    (0..size)
        .map(|i| mix64(i / 8).to_le_bytes()[(i % 8) as usize])
        .collect()
}

/// A responder on one host.
enum Serving {
    /// gmond, running, and for `-t xdp` the host's relay.
    Gmond(Box<Running>, Option<crate::preload::RelayGuard>),
    /// netgap's responder: its listener, answered from a thread in `run`.
    Builtin {
        listener: Box<dyn netgap_transport::Listener>,
        /// Sent from a message buffer placed as the point asks.
        answer: AlignedBuffer,
        token: DataToken,
    },
}

struct ServerRole {
    serving: Serving,
    addr: String,
    warmup: Duration,
    duration: Duration,
    stop: Stop,
}

pub(super) fn open_server(
    p: &Params,
    ctx: &RoleContext<'_>,
) -> Result<Box<dyn OpenRole>, RoleError> {
    let ip: IpAddr = ctx
        .spec
        .listen_ips
        .first()
        .copied()
        .unwrap_or(ctx.control_ip);
    let (warmup, duration) = window(ctx.spec);
    let (serving, addr) = match p.responder {
        Responder::Gmond => {
            if !ctx.services {
                return Err(refused(service::ServiceError::NotAllowed));
            }
            let mut dir = RunDir::new(ctx.dirs, gmond::NAME).map_err(refused)?;
            if p.preload {
                dir.preload(&crate::preload::LibraryStack::of(&ctx.spec.point))
                    .map_err(refused)?;
            }
            let relay = if p.preload
                && netgap_transport::programs(&ctx.spec.point.transport)
                    == Programs::LibraryWithRelay
            {
                Some(crate::web::server_role::relay_for(
                    ctx,
                    &dir,
                    ctx.spec.flows,
                )?)
            } else {
                None
            };
            let port = service::free_tcp_port(ip).map_err(refused)?;
            let addr = SocketAddr::new(ip, port);
            let running = gmond::start(dir, addr).map_err(refused)?;
            running
                .wait_answering(addr, ctx.stop, None, |a| {
                    let xml = service::read_all(a, MAX_GMOND_BYTES)?;
                    let answer = gmond::parse(&xml)?;
                    if answer.hosts.is_empty() || answer.metrics == 0 {
                        return Err(service::ProbeError::NoMetrics);
                    }
                    Ok(())
                })
                .map_err(refused)?;
            (Serving::Gmond(Box::new(running), relay), addr.to_string())
        }
        Responder::Builtin => {
            let t = find_transport(ctx.spec)?;
            let cfg = FlowConfig::from_spec(&ctx.spec.point);
            let listener = t
                .listen(&cfg, ip)
                .map_err(|source| RoleError::Open { index: 0, source })?;
            let addr = listener.addr();
            let size = usize::try_from(p.answer_bytes).map_err(|_| refused("answer too large"))?;
            let layout = BufferLayout::of_options(&ctx.spec.point.options)
                .map_err(|e| refused(format!("message buffers: {e}")))?;
            let mut sent = AlignedBuffer::zeroed(size, layout);
            sent.copy_from_slice(&answer(size as u64));
            let serving = Serving::Builtin {
                listener,
                answer: sent,
                token: ctx.data_token.clone(),
            };
            (serving, addr)
        }
    };
    Ok(Box::new(ServerRole {
        serving,
        addr,
        warmup,
        duration,
        stop: ctx.stop.clone(),
    }))
}

impl OpenRole for ServerRole {
    fn addrs(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

/// Answers every connection of the built-in responder until `end` or the
/// stop: the connector proves the point's token, gets the answer, and the
/// responder closes. Returns (connections answered, bytes sent).
fn respond(
    listener: &mut dyn netgap_transport::Listener,
    answer: &[u8],
    token: &DataToken,
    end: Instant,
    stop: &Stop,
) -> (u64, u64) {
    let (mut answered, mut sent) = (0u64, 0u64);
    while Instant::now() < end && !stop.is_set() {
        let mut flow = match listener.accept(STOP_TICK) {
            Ok(f) => f,
            Err(TransportError::AcceptTimeout { .. }) => continue,
            Err(_) => {
                stop.sleep_until(Instant::now() + STOP_TICK);
                continue;
            }
        };
        // A stranger that cannot prove the token gets nothing.
        if netgap_transport::preamble::listener(flow.as_mut(), token).is_err() {
            continue;
        }
        if flow.send_all(answer).is_ok() {
            answered += 1;
            sent += answer.len() as u64;
        }
    }
    (answered, sent)
}

impl ReadyRole for ServerRole {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let ServerRole {
            serving,
            addr: _,
            warmup,
            duration,
            stop,
        } = *self;
        let t0 = Instant::now();
        let end = t0 + warmup + duration + SERVER_GRACE;
        let (cpu, services, sent, evidence) = match serving {
            Serving::Gmond(running, relay) => {
                // gmond answers the gathers (and the relay carries them
                // under -t xdp): their processes' CPU is the role's.
                let (cpu, _) =
                    meter_window_counting(t0 + warmup, t0 + warmup + duration, &stop, &|| {
                        running.cpu_ns() + relay.as_ref().map_or(0, |r| r.cpu_ns())
                    });
                stop.sleep_until(end);
                let record = running.record().clone();
                let evidence = running.evidence(None);
                drop(running);
                drop(relay);
                (cpu, vec![record], 0, evidence)
            }
            Serving::Builtin {
                mut listener,
                answer,
                token,
            } => {
                let (cpu, (_, sent)) = metered(t0, warmup, duration, &stop, || {
                    respond(listener.as_mut(), &answer, &token, end, &stop)
                })?;
                (cpu, Vec::new(), sent, Vec::new())
            }
        };
        Ok(RoleResult {
            flows: Vec::new(),
            buckets: Vec::new(),
            outcome: WorkloadOutcome {
                window_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: 0,
                bytes_tx: sent,
                datagrams: None,
                metrics: BTreeMap::new(),
                services,
                last_error: None,
                data_window_ns: None,
                evidence,
            },
        })
    }
}
