//! A pio I/O server as a role: its clients' streams accepted, a thread per
//! stream storing and serving the stripes of its file over the job, and
//! the phases and bytes reduced to the role's outcome.

use super::{join_all, ms, phase_ns, server, Common, PioError, NAME};
use crate::role::{OpenRole, ReadyRole, RoleError, RoleResult};
use crate::staged::{self, Inbound};
use netgap_proto::workload::{FlowReport, WorkloadOutcome};
use netgap_transport as transport;
use netgap_transport::cpu::peak_rss_kib;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

pub(super) struct ServerOpen {
    pub(super) common: Common,
    pub(super) inbound: Inbound,
    pub(super) file: server::ServerFile,
    pub(super) limit: u64,
    pub(super) index: usize,
}

impl OpenRole for ServerOpen {
    fn addrs(&self) -> Vec<String> {
        self.inbound.addrs.clone()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        let flows = self.inbound.join()?;
        let buffer =
            netgap_transport::buffer::BufferLayout::of_options(&self.common.spec.point.options)
                .map_err(|e| RoleError::Params {
                    workload: NAME,
                    detail: format!("message buffers: {e}"),
                })?;
        Ok(Box::new(ServerReady {
            shared: Arc::new(server::Shared::new(
                self.file,
                self.common.layout.stripe_bytes,
                self.limit,
                flows.len(),
                buffer,
            )),
            common: self.common,
            flows,
            index: self.index,
        }))
    }
}

struct ServerReady {
    common: Common,
    shared: Arc<server::Shared>,
    flows: Vec<Box<dyn transport::Flow>>,
    index: usize,
}

impl ReadyRole for ServerReady {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let deadline = staged::job_deadline(&self.common.spec, Instant::now());
        let mut handles = Vec::with_capacity(self.flows.len());
        for (i, mut flow) in self.flows.into_iter().enumerate() {
            let shared = Arc::clone(&self.shared);
            let stop = self.common.stop.clone();
            let h = std::thread::Builder::new()
                .name(format!("pio server {i}"))
                .spawn(move || {
                    let r = server::serve(flow.as_mut(), &shared, deadline, &stop);
                    if r.is_err() {
                        shared.fail();
                    }
                    r
                })
                .map_err(|source| RoleError::Thread {
                    what: "a pio server thread",
                    source,
                })?;
            handles.push(h);
        }
        let served = join_all(handles)?;
        let sh = &self.shared;
        let phases = sh.phases().ok_or_else(|| {
            PioError("a client was done before both phases; this is a bug in the client".into())
        })?;
        let head = if self.common.headline_read {
            phases.read
        } else {
            phases.write
        };
        let cpu = head.0.usage_to(&head.1);
        let written: u64 = served.iter().map(|s| s.written).sum();
        let read: u64 = served.iter().map(|s| s.read).sum();
        let mut metrics = BTreeMap::new();
        metrics.insert(
            format!("server{}_bytes", self.index),
            (written + read) as f64,
        );
        for (key, (start, end)) in [
            ("servers_write_cpu_ms", phases.write),
            ("servers_read_cpu_ms", phases.read),
        ] {
            metrics.insert(key.into(), ms(start.usage_to(&end).cpu_ns));
        }
        metrics.insert(
            "disk_write_ms".into(),
            ms(sh.write_ns.load(std::sync::atomic::Ordering::Relaxed)),
        );
        metrics.insert(
            "disk_read_ms".into(),
            ms(sh.read_ns.load(std::sync::atomic::Ordering::Relaxed)),
        );
        metrics.insert(
            "disk_flush_ms".into(),
            ms(sh.flush_ns.load(std::sync::atomic::Ordering::Relaxed)),
        );
        let cache = sh.file.cache;
        for (key, on) in [
            ("servers_direct_io", cache == server::CacheUse::Direct),
            (
                "servers_flushed",
                matches!(cache, server::CacheUse::Direct | server::CacheUse::Flush),
            ),
            ("servers_on_tmpfs", cache == server::CacheUse::Memory),
            ("servers_cache_kept", cache == server::CacheUse::Kept),
        ] {
            metrics.insert(key.into(), if on { 1.0 } else { 0.0 });
        }
        let flows = served
            .iter()
            .enumerate()
            .map(|(i, s)| FlowReport {
                index: i as u32,
                bytes_tx: s.read,
                bytes_rx: s.written,
                window_bytes_rx: 0,
                round_trips: s.requests,
                percentiles: None,
                errors: 0,
            })
            .collect();
        Ok(RoleResult {
            flows,
            buckets: Vec::new(),
            outcome: WorkloadOutcome {
                window_ns: phase_ns(head),
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: written,
                bytes_tx: read,
                datagrams: None,
                metrics,
                services: Vec::new(),
                last_error: None,
                data_window_ns: None,
                evidence: Vec::new(),
            },
        })
    }
}
