//! Control messages between a coordinator and an agent. Plain data: the codec
//! turns them into frames, the session machines decide which may come when.

use super::dataproof::DataToken;
use super::workload::{
    FlowReport, WorkloadOutcome, WorkloadSpec, BUCKETS_PER_CHUNK, FLOWS_PER_CHUNK,
};
use netgap_core::cpu::CpuUsage;
use netgap_core::datagram::DatagramStats;
use netgap_core::host::HostFacts;
use netgap_core::spec::{PointSpec, RangeError, MAX_ITERATIONS};
use serde::{Deserialize, Serialize};

/// Version of the control protocol; both ends must speak the same one.
/// Version 2: a workload role names its workload and carries its parameters
/// (`params`) instead of a fixed kind of work. Version 3: `open` and
/// `group_prepare` carry the point's data token, which every data
/// connection proves before payload moves ([`crate::dataproof`]).
/// Version 4: a point's transport options may carry its message buffers'
/// alignment and offset (`buffer_align_bytes`, `buffer_offset_bytes`).
/// Version 5: a role's CPU reading carries the host's softirq share
/// (`softirq_percent`). Version 6: an agent may play a point's client role
/// (`client_open`, `client_run`), so a point-to-point point runs between
/// two agents while the coordinator only coordinates. Version 7: a point's
/// transport options may ask the programs a workload runs under the
/// preload library for direct connections (`preload_direct`). Version 8:
/// they ask by default, and the options may keep them on the relays
/// instead (`preload_relayed`).
pub const PROTOCOL_VERSION: u32 = 8;

/// Which part of a point a repetition belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Warm-up and calibration: timed by nobody.
    Warmup,
    /// A counted repetition.
    Measure,
}

/// Messages the coordinator sends to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Request {
    /// First message of every session.
    Hello {
        /// [`PROTOCOL_VERSION`] of the coordinator.
        protocol: u32,
        /// netgap version of the coordinator, for the log.
        version: String,
    },
    /// Prepare a point: the agent opens a data listener and answers
    /// [`Reply::Listening`], then accepts one flow and answers [`Reply::Accepted`].
    Open {
        /// The point.
        spec: PointSpec,
        /// The secret the point's data connection proves.
        data_token: DataToken,
    },
    /// Run the server role for `iterations` iterations, then answer [`Reply::Done`].
    Run {
        /// Iterations in this repetition, 1..=[`MAX_ITERATIONS`].
        iterations: u64,
        /// Warm-up or measured.
        phase: Phase,
    },
    /// Close the point's flow; the agent answers [`Reply::Closed`].
    Close,
    /// End of session.
    Bye,
    /// Prepare this agent's role in a workload point: a server opens its
    /// listeners and answers [`Reply::WorkloadListening`], then
    /// [`Reply::WorkloadReady`] once every flow is accepted; a client connects
    /// its flows and answers [`Reply::WorkloadReady`].
    // The wire keeps the names of protocol version 2 (`group_*`),
    // so the frames of these messages are unchanged.
    #[serde(rename = "group_prepare")]
    WorkloadPrepare {
        /// The role and its flows.
        spec: WorkloadSpec,
        /// The secret every data connection of the point proves, the same
        /// for every role of the point.
        data_token: DataToken,
    },
    /// The barrier has passed: run every prepared flow for the warm-up and
    /// the window, then answer with [`Reply::WorkloadFlows`] chunks,
    /// [`Reply::WorkloadBuckets`] chunks and [`Reply::WorkloadFinished`].
    #[serde(rename = "group_go")]
    WorkloadGo,
    /// Play the client role of a point: connect one flow to the server
    /// role another agent opened at `target`, prove `data_token` over it,
    /// set up the test's client role and answer
    /// [`Reply::ClientConnected`].
    ClientOpen {
        /// The point.
        spec: PointSpec,
        /// The secret the point's data connection proves.
        data_token: DataToken,
        /// The server role's data address (transport-specific, at most
        /// [`MAX_TEXT_BYTES`] bytes).
        target: String,
        /// The CPU the client role runs on (`--pin`), at most
        /// [`netgap_core::spec::MAX_CPU_INDEX`]; none: where the kernel
        /// puts it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_cpu: Option<u32>,
    },
    /// Run one repetition of the client role, timing it and metering its
    /// CPU, then answer with [`Reply::ClientBuckets`] chunks (a latency
    /// test's round trips) and [`Reply::ClientDone`]; while it runs the
    /// agent says [`Reply::WorkloadAlive`] every
    /// [`WORKLOAD_ALIVE_INTERVAL`].
    ClientRun {
        /// Iterations in this repetition, 1..=[`MAX_ITERATIONS`].
        iterations: u64,
        /// Warm-up or measured.
        phase: Phase,
    },
}

/// What the client role measured in one repetition, as an agent playing it
/// reports it: the same figures the runner takes from a client role that
/// runs in the coordinator's own process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientRep {
    /// Wall time of the repetition in nanoseconds, as the test defines it.
    pub elapsed_ns: u64,
    /// The repetition's headline value in the test's unit; finite.
    pub value: f64,
    /// Payload bytes the client sent.
    pub bytes_tx: u64,
    /// Payload bytes the client received.
    pub bytes_rx: u64,
    /// CPU usage of the client side over the repetition.
    pub cpu: CpuUsage,
    /// The client end's datagram counters over the repetition, for an
    /// unreliable flow; absent for a reliable one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagrams: Option<DatagramStats>,
}

impl ClientRep {
    /// Range-checks every field; never panics.
    pub fn validate(&self) -> Result<(), RangeError> {
        if !self.value.is_finite() {
            return Err(RangeError {
                field: "value",
                detail: "not a finite number".into(),
            });
        }
        if !self.cpu.is_finite() {
            return Err(RangeError {
                field: "cpu",
                detail: "not a finite number".into(),
            });
        }
        if let Some(d) = &self.datagrams {
            d.validate().map_err(|e| RangeError {
                field: "datagrams",
                detail: e.to_string(),
            })?;
        }
        Ok(())
    }
}

/// Most choices an agent playing a client role reports of its flow's data
/// path ([`Reply::ClientConnected`]).
pub const MAX_PATH_CHOICES: usize = 32;

/// Messages an agent sends to the coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Reply {
    /// Handshake accepted.
    Welcome {
        /// [`PROTOCOL_VERSION`] of the agent.
        protocol: u32,
        /// netgap version of the agent.
        version: String,
        /// Facts of the agent's host.
        host: HostFacts,
    },
    /// The agent speaks another protocol version.
    VersionMismatch {
        /// The version the agent speaks.
        supported: u32,
    },
    /// The agent is already serving another session.
    Busy,
    /// The data listener for the opened point is at `addr`.
    Listening {
        /// Transport-specific address (`IP:PORT`, a socket path, ...).
        addr: String,
    },
    /// The data flow is connected.
    Accepted,
    /// The server role finished a repetition.
    Done {
        /// Payload bytes the server received.
        bytes_rx: u64,
        /// Payload bytes the server sent.
        bytes_tx: u64,
        /// CPU usage of the server side over the repetition.
        cpu: CpuUsage,
        /// The server end's datagram counters since its previous report,
        /// for an unreliable flow; absent for a reliable one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        datagrams: Option<DatagramStats>,
    },
    /// The point's flow is closed.
    Closed,
    /// The server role of a workload point listens at these data addresses
    /// (one per flow, or one for all).
    #[serde(rename = "group_listening")]
    WorkloadListening {
        /// Transport-specific addresses.
        addrs: Vec<String>,
    },
    /// Every flow of this agent's workload role is prepared.
    #[serde(rename = "group_ready")]
    WorkloadReady,
    /// Reports of some flows of the workload repetition (at most
    /// [`FLOWS_PER_CHUNK`]).
    #[serde(rename = "group_flows")]
    WorkloadFlows {
        /// Per-flow reports.
        flows: Vec<FlowReport>,
    },
    /// Some buckets of the agent's latency histogram over all its flows:
    /// `[value_ns, count]` pairs (at most [`BUCKETS_PER_CHUNK`]).
    #[serde(rename = "group_buckets")]
    WorkloadBuckets {
        /// Histogram buckets.
        buckets: Vec<[u64; 2]>,
    },
    /// The agent is still running its role (a workload role, or a
    /// point's client role): sent every [`WORKLOAD_ALIVE_INTERVAL`] while
    /// it runs, so a silent agent is noticed long before the repetition's
    /// results are due.
    #[serde(rename = "group_alive")]
    WorkloadAlive,
    /// The workload repetition is over; the flows are closed.
    #[serde(rename = "group_finished")]
    WorkloadFinished {
        /// Window, CPU and memory of the agent.
        outcome: WorkloadOutcome,
    },
    /// The client role's flow is connected and proven, and the role set
    /// up over it.
    ClientConnected {
        /// Choices the transport made in setting up the flow's data path,
        /// for the record's stack (at most [`MAX_PATH_CHOICES`], each at
        /// most [`MAX_TEXT_BYTES`] bytes).
        path_choices: Vec<String>,
    },
    /// Some buckets of the client role's round trips over the repetition:
    /// `[value_ns, count]` pairs (at most [`BUCKETS_PER_CHUNK`]).
    ClientBuckets {
        /// Histogram buckets.
        buckets: Vec<[u64; 2]>,
    },
    /// The client role finished a repetition.
    ClientDone {
        /// What it measured.
        rep: ClientRep,
    },
    /// The request could not be carried out; the session stays usable only
    /// if the error came before any flow was opened.
    Error {
        /// One line for the user.
        message: String,
    },
}

/// How often an agent running a workload role or a client role says it is
/// alive.
pub const WORKLOAD_ALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Longest free-text field accepted in a message, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;

fn text(field: &'static str, s: &str) -> Result<(), RangeError> {
    if s.len() > MAX_TEXT_BYTES {
        return Err(RangeError {
            field,
            detail: format!("{} bytes > {MAX_TEXT_BYTES}", s.len()),
        });
    }
    Ok(())
}

fn iterations_in_range(iterations: u64) -> Result<(), RangeError> {
    if iterations == 0 || iterations > MAX_ITERATIONS {
        return Err(RangeError {
            field: "iterations",
            detail: format!("{iterations} not in 1..={MAX_ITERATIONS}"),
        });
    }
    Ok(())
}

impl Request {
    /// Range-checks every parameter; never panics.
    pub fn validate(&self) -> Result<(), RangeError> {
        match self {
            Request::Hello { version, .. } => text("version", version),
            Request::Open { spec, .. } => spec.validate(),
            Request::Run { iterations, .. } => iterations_in_range(*iterations),
            Request::WorkloadPrepare { spec, .. } => spec.validate(),
            Request::ClientOpen {
                spec,
                target,
                client_cpu,
                ..
            } => {
                spec.validate()?;
                if let Some(cpu) = client_cpu.filter(|&c| c > netgap_core::spec::MAX_CPU_INDEX) {
                    return Err(RangeError {
                        field: "client_cpu",
                        detail: format!("{cpu} > {}", netgap_core::spec::MAX_CPU_INDEX),
                    });
                }
                text("target", target)
            }
            Request::ClientRun { iterations, .. } => iterations_in_range(*iterations),
            Request::Close | Request::Bye | Request::WorkloadGo => Ok(()),
        }
    }
}

impl Reply {
    /// Range-checks every field; never panics.
    pub fn validate(&self) -> Result<(), RangeError> {
        match self {
            Reply::Welcome { version, host, .. } => {
                text("version", version)?;
                host.validate()
            }
            Reply::Listening { addr } => text("addr", addr),
            Reply::Error { message } => text("message", message),
            Reply::Done { cpu, datagrams, .. } => {
                if !cpu.is_finite() {
                    return Err(RangeError {
                        field: "cpu",
                        detail: "not a finite number".into(),
                    });
                }
                if let Some(d) = datagrams {
                    d.validate().map_err(|e| RangeError {
                        field: "datagrams",
                        detail: e.to_string(),
                    })?;
                }
                Ok(())
            }
            Reply::WorkloadListening { addrs } => {
                if addrs.len() > super::workload::MAX_FLOW_ADDRS {
                    return Err(RangeError {
                        field: "addrs",
                        detail: format!("more than {}", super::workload::MAX_FLOW_ADDRS),
                    });
                }
                addrs.iter().try_for_each(|a| text("addr", a))
            }
            Reply::WorkloadFlows { flows } => {
                if flows.len() > FLOWS_PER_CHUNK {
                    return Err(RangeError {
                        field: "flows",
                        detail: format!("more than {FLOWS_PER_CHUNK} in one chunk"),
                    });
                }
                flows.iter().try_for_each(FlowReport::validate)
            }
            Reply::WorkloadBuckets { buckets } => {
                if buckets.len() > BUCKETS_PER_CHUNK {
                    return Err(RangeError {
                        field: "buckets",
                        detail: format!("more than {BUCKETS_PER_CHUNK} in one chunk"),
                    });
                }
                Ok(())
            }
            Reply::WorkloadFinished { outcome } => outcome.validate(),
            Reply::ClientConnected { path_choices } => {
                if path_choices.len() > MAX_PATH_CHOICES {
                    return Err(RangeError {
                        field: "path_choices",
                        detail: format!("more than {MAX_PATH_CHOICES}"),
                    });
                }
                path_choices
                    .iter()
                    .try_for_each(|c| text("path_choices", c))
            }
            Reply::ClientBuckets { buckets } => {
                if buckets.len() > BUCKETS_PER_CHUNK {
                    return Err(RangeError {
                        field: "buckets",
                        detail: format!("more than {BUCKETS_PER_CHUNK} in one chunk"),
                    });
                }
                Ok(())
            }
            Reply::ClientDone { rep } => rep.validate(),
            Reply::VersionMismatch { .. }
            | Reply::Busy
            | Reply::Accepted
            | Reply::Closed
            | Reply::WorkloadReady
            | Reply::WorkloadAlive => Ok(()),
        }
    }
}
