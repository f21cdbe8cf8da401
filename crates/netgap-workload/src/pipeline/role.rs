//! A pipeline role on its agent: the stream ends it accepted and dialled
//! handed to its copies, one thread per copy over the query, and what
//! they did reduced to the role's outcome and flow reports.

use super::copy::run_copy;
use super::graph::{Edge, Graph};
use super::{graph, PipeError, PipeParams, NAME};
use crate::role::{OpenRole, ReadyRole, RoleError, RoleResult, Stop, WindowEdge};
use crate::staged::{self, Inbound};
use netgap_core::stats::LatencyHistogram;
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadSpec};
use netgap_transport as transport;
use netgap_transport::buffer::BufferLayout;
use netgap_transport::cpu::peak_rss_kib;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A role whose listeners are open and whose dialled streams are connected.
pub(super) struct PipeOpen {
    pub(super) spec: WorkloadSpec,
    pub(super) stop: Stop,
    pub(super) params: PipeParams,
    pub(super) graph: Graph,
    pub(super) edges: Vec<Edge>,
    pub(super) role_of: Vec<usize>,
    pub(super) me: usize,
    pub(super) my_copies: Vec<u32>,
    pub(super) links: graph::RoleLinks,
    pub(super) listening: Inbound,
    pub(super) internal: Inbound,
    pub(super) dialed: Vec<(usize, Box<dyn transport::Flow>)>,
}

impl OpenRole for PipeOpen {
    fn addrs(&self) -> Vec<String> {
        self.listening.addrs.clone()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        let accepted = self.listening.join()?;
        let accepted_internal = self.internal.join()?;
        // Each stream end this role holds, as (edge, upstream end?, flow).
        let mut ends: Vec<(usize, bool, Box<dyn transport::Flow>)> = Vec::new();
        for (&e, f) in self.links.listens.iter().zip(accepted) {
            let up = self.role_of[self.edges[e].up as usize] == self.me;
            ends.push((e, up, f));
        }
        let internal_count = self.links.internal.len();
        let dial_count = self.dialed.len() - internal_count;
        for (k, (e, f)) in self.dialed.into_iter().enumerate() {
            // A dialled internal stream is its upstream end.
            let up = k >= dial_count || self.role_of[self.edges[e].up as usize] == self.me;
            ends.push((e, up, f));
        }
        for (&e, f) in self.links.internal.iter().zip(accepted_internal) {
            ends.push((e, false, f));
        }
        let mut copies: Vec<CopyEnds> = self
            .my_copies
            .iter()
            .map(|&c| CopyEnds {
                copy: c,
                inbound: Vec::new(),
                outbound: Vec::new(),
            })
            .collect();
        for (e, up, f) in ends {
            let edge = self.edges[e];
            let owner = if up { edge.up } else { edge.down };
            let Some(c) = copies.iter_mut().find(|c| c.copy == owner) else {
                return Err(PipeError(format!("stream {e} ends on a copy of another role")).into());
            };
            if up {
                c.outbound.push(f);
            } else {
                c.inbound.push(f);
            }
        }
        Ok(Box::new(PipeReady {
            spec: self.spec,
            stop: self.stop,
            params: self.params,
            graph: self.graph,
            copies,
        }))
    }
}

/// The stream ends of one copy.
pub(super) struct CopyEnds {
    pub(super) copy: u32,
    pub(super) inbound: Vec<Box<dyn transport::Flow>>,
    pub(super) outbound: Vec<Box<dyn transport::Flow>>,
}

struct PipeReady {
    spec: WorkloadSpec,
    stop: Stop,
    params: PipeParams,
    graph: Graph,
    copies: Vec<CopyEnds>,
}

/// What every copy of a role shares.
#[derive(Clone)]
pub(super) struct Env {
    pub(super) graph: Graph,
    pub(super) uow_bytes: u64,
    pub(super) query_bytes: u64,
    pub(super) credits: u32,
    pub(super) compute: Duration,
    pub(super) t0: Instant,
    pub(super) deadline: Instant,
    pub(super) stop: Stop,
    /// Where every UOW buffer's data starts (`--align`, `--offset`).
    pub(super) layout: BufferLayout,
}

impl Env {
    pub(super) fn uows(&self) -> u64 {
        self.query_bytes.div_ceil(self.uow_bytes)
    }
}

/// What one copy did.
#[derive(Default)]
pub(super) struct CopyDone {
    pub(super) uows: u64,
    pub(super) bytes_rx: u64,
    pub(super) bytes_tx: u64,
    /// ns from the role's start until the copy passed on its last marker
    /// (the consumer: received it).
    pub(super) done_ns: u64,
    pub(super) hist: Option<LatencyHistogram>,
}

impl ReadyRole for PipeReady {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let t0 = Instant::now();
        let env = Env {
            graph: self.graph,
            uow_bytes: self.spec.point.size_bytes,
            query_bytes: self.params.query_bytes,
            credits: self.params.credits,
            compute: Duration::from_micros(self.params.compute_us),
            t0,
            deadline: staged::job_deadline(&self.spec, t0),
            stop: self.stop.clone(),
            layout: BufferLayout::of_options(&self.spec.point.options).map_err(|e| {
                RoleError::Params {
                    workload: NAME,
                    detail: format!("message buffers: {e}"),
                }
            })?,
        };
        // The role's CPU is its agent's, every copy's threads and their
        // readers', over the role's run: from before the copies start to
        // after the last has ended.
        let started = WindowEdge::now();
        let mut handles = Vec::with_capacity(self.copies.len());
        let mut names = Vec::with_capacity(self.copies.len());
        for ends in self.copies {
            let env = env.clone();
            let stage = env.graph.stage_of(ends.copy);
            names.push((ends.copy, stage));
            let h = std::thread::Builder::new()
                .name(format!("pipeline copy {}", ends.copy))
                .spawn(move || run_copy(ends, &env))
                .map_err(|source| RoleError::Thread {
                    what: "a pipeline copy",
                    source,
                })?;
            handles.push(h);
        }
        let mut done = Vec::with_capacity(handles.len());
        let mut first_err = None;
        for (i, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(d)) => done.push(d),
                Ok(Err(e)) => {
                    self.stop.set();
                    first_err.get_or_insert(RoleError::from(e));
                }
                Err(_) => {
                    first_err.get_or_insert(RoleError::Panicked {
                        what: format!("pipeline copy {i}"),
                    });
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let ended = WindowEdge::now();
        let window_ns =
            u64::try_from(ended.at().saturating_duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
        let cpu = started.usage_to(&ended);
        let mut metrics = BTreeMap::new();
        let mut hist = LatencyHistogram::new();
        let mut flows = Vec::with_capacity(done.len());
        for (i, (d, &(copy, stage))) in done.iter().zip(&names).enumerate() {
            *metrics
                .entry(format!("{}_uows", self.graph.stage_name(stage)))
                .or_insert(0.0) += d.uows as f64;
            let mut percentiles = None;
            if let Some(h) = &d.hist {
                hist.merge(h);
                percentiles = h.percentiles_us(1.0);
                metrics.insert("query_time_ms".into(), d.done_ns as f64 / 1e6);
                metrics.insert("verified_bytes".into(), d.bytes_rx as f64);
            }
            let _ = copy;
            flows.push(FlowReport {
                index: i as u32,
                bytes_tx: d.bytes_tx,
                bytes_rx: d.bytes_rx,
                window_bytes_rx: 0,
                round_trips: d.uows,
                percentiles,
                errors: 0,
            });
        }
        Ok(RoleResult {
            buckets: hist.buckets(),
            outcome: WorkloadOutcome {
                window_ns,
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: done.iter().map(|d| d.bytes_rx).sum(),
                bytes_tx: done.iter().map(|d| d.bytes_tx).sum(),
                datagrams: None,
                metrics,
                services: Vec::new(),
                last_error: None,
                data_window_ns: None,
                evidence: Vec::new(),
            },
            flows,
        })
    }
}
