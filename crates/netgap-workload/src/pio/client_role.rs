//! A host's pio clients as a role: each client's streams to every server,
//! the job's write and read phases run and checked, and their phases and
//! bytes reduced to the role's outcome.

use super::layout::Piece;
use super::{client, join_all, layout, ms, phase_ns, span, Common, Phase, PioError, NAME};
use crate::role::{OpenRole, ReadyRole, RoleError, RoleResult};
use crate::staged;
use netgap_proto::workload::{FlowReport, WorkloadOutcome};
use netgap_transport as transport;
use netgap_transport::buffer::BufferLayout;
use netgap_transport::cpu::peak_rss_kib;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// A client role: each client's flows to every server, in server order.
pub(super) struct ClientRole {
    pub(super) common: Common,
    pub(super) conns: Vec<(u32, Vec<Box<dyn transport::Flow>>)>,
}

impl OpenRole for ClientRole {
    fn addrs(&self) -> Vec<String> {
        Vec::new()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

impl ReadyRole for ClientRole {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let c = &self.common;
        let t0 = Instant::now();
        let deadline = staged::job_deadline(&c.spec, t0);
        let buffer = netgap_transport::buffer::BufferLayout::of_options(&c.spec.point.options)
            .map_err(|e| RoleError::Params {
                workload: NAME,
                detail: format!("message buffers: {e}"),
            })?;
        // A fresh seed per repetition: a read can only match this
        // repetition's writes.
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(t0.elapsed().as_nanos() ^ u128::from(std::process::id()));
            h.finish()
        };
        let mut per_client = Vec::with_capacity(self.conns.len());
        for (client, flows) in self.conns {
            per_client.push(start_client(c, client, flows, seed, buffer, deadline)?);
        }
        let mut moved = Vec::with_capacity(per_client.len());
        let mut first_err = None;
        for handles in per_client {
            match join_all(handles) {
                Ok(m) => moved.push(m),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        summary(c, &moved)
    }
}

/// Starts the threads of one client, one per server it reaches over
/// `flows` (in server order), each moving that server's pieces of the
/// client's requests.
fn start_client(
    c: &Common,
    client: u32,
    flows: Vec<Box<dyn transport::Flow>>,
    seed: u64,
    buffer: BufferLayout,
    deadline: Instant,
) -> Result<Vec<JoinHandle<Result<client::Moved, PioError>>>, RoleError> {
    let stripe = usize::try_from(c.layout.stripe_bytes).unwrap_or(usize::MAX);
    let mut pieces: Vec<Vec<Piece>> = vec![Vec::new(); flows.len()];
    let mut all = Vec::new();
    for (off, len) in c.pattern.requests(client, c.clients) {
        c.layout.pieces(off, len, &mut all);
    }
    for p in all {
        if let Some(list) = pieces.get_mut(p.server as usize) {
            list.push(p);
        }
    }
    let gate = Arc::new(client::Gate::new(flows.len()));
    let contents = Arc::new(layout::Contents::new(
        seed ^ u64::from(client).wrapping_mul(0x9e37_79b9),
        stripe,
    ));
    let mut handles = Vec::with_capacity(flows.len());
    for (s, (mut flow, list)) in flows.into_iter().zip(pieces).enumerate() {
        let gate = Arc::clone(&gate);
        let stop = c.stop.clone();
        let contents = Arc::clone(&contents);
        let h = std::thread::Builder::new()
            .name(format!("pio client {client} server {s}"))
            .spawn(move || {
                client::run(client::Job {
                    flow: flow.as_mut(),
                    pieces: &list,
                    gate: &gate,
                    contents: &contents,
                    stripe_bytes: stripe,
                    buffer,
                    deadline,
                    stop: &stop,
                })
            })
            .map_err(|source| RoleError::Thread {
                what: "a pio client thread",
                source,
            })?;
        handles.push(h);
    }
    Ok(handles)
}

/// The role's result from what each client's threads moved: a flow
/// report per client, the phases' times and bytes, and the CPU of the
/// headline's phase.
fn summary(c: &Common, moved: &[Vec<client::Moved>]) -> Result<RoleResult, RoleError> {
    let mut flows = Vec::with_capacity(moved.len());
    let (mut write_ns, mut read_ns, mut written, mut read) = (0u64, 0u64, 0u64, 0u64);
    // Each phase of the role, from its first client's start to its
    // last client's end.
    let (mut write, mut read_phase): (Option<Phase>, Option<Phase>) = (None, None);
    for (i, m) in moved.iter().enumerate() {
        let w: u64 = m.iter().map(|x| x.written).sum();
        let r: u64 = m.iter().map(|x| x.read).sum();
        // Every flow of a client passed the same gates.
        if let Some(x) = m.first() {
            write_ns = write_ns.max(phase_ns(x.write));
            read_ns = read_ns.max(phase_ns(x.read_phase));
            write = Some(span(write, x.write));
            read_phase = Some(span(read_phase, x.read_phase));
        }
        written += w;
        read += r;
        flows.push(FlowReport {
            index: i as u32,
            bytes_tx: w,
            bytes_rx: r,
            window_bytes_rx: if c.headline_read { r } else { w },
            round_trips: m.iter().map(|x| x.requests).sum(),
            percentiles: None,
            errors: 0,
        });
    }
    let (Some(write), Some(read_phase)) = (write, read_phase) else {
        return Err(PioError("a client role with no client".into()).into());
    };
    let cpu = if c.headline_read {
        read_phase.0.usage_to(&read_phase.1)
    } else {
        write.0.usage_to(&write.1)
    };
    let (head_bytes, head_ns) = if c.headline_read {
        (read, read_ns)
    } else {
        (written, write_ns)
    };
    let metrics = BTreeMap::from([
        ("write_bytes".to_string(), written as f64),
        ("read_bytes".to_string(), read as f64),
        ("write_time_ms".to_string(), ms(write_ns)),
        ("read_time_ms".to_string(), ms(read_ns)),
        ("headline_bytes".to_string(), head_bytes as f64),
        ("headline_time_ms".to_string(), ms(head_ns)),
        (
            "clients_write_cpu_ms".to_string(),
            ms(write.0.usage_to(&write.1).cpu_ns),
        ),
        (
            "clients_read_cpu_ms".to_string(),
            ms(read_phase.0.usage_to(&read_phase.1).cpu_ns),
        ),
    ]);
    Ok(RoleResult {
        flows,
        buckets: Vec::new(),
        outcome: WorkloadOutcome {
            window_ns: head_ns.max(1),
            cpu,
            peak_rss_kib: peak_rss_kib(),
            processes: None,
            bytes_rx: read,
            bytes_tx: written,
            datagrams: None,
            metrics,
            services: Vec::new(),
            last_error: None,
            data_window_ns: None,
            evidence: Vec::new(),
        },
    })
}
