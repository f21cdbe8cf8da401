//! netgap characterizes communication stacks and shows the gap between them.
//!
//! This crate is the edge: the `netgap` binary's commands, and where the
//! testbed meets the measurement crate (`testbed_seams`). The work lives in
//! the layer crates, re-exported here under the names the rest of netgap
//! uses:
//!
//! - `netgap-core`: units, statistics, point specs, host facts, the result
//!   model, the hosts file and the link conditions; plain data with no
//!   I/O.
//! - `netgap-proto`: the control protocol (codec, messages, session
//!   machines, key proofs); no I/O, and it cannot import the transports.
//! - `netgap-transport`: the transport trait, every transport, the
//!   multi-client flow engine.
//! - `netgap-workload`: the multi-host workloads, the real servers they
//!   run, and the agent's shards.
//! - `netgap-bench`: the point-to-point tests, each a client role and a
//!   server role over a flow; the agent plays them and the runner times
//!   them.
//! - `netgap-agent`: the agent and its control: control connections on
//!   sockets, key proofs, the coordinator's side of the handshake,
//!   admission, and the daemon that serves sessions.
//! - `netgap-measure`: tests and plans: the runner, plans, the
//!   coordinators, workload runs, sweep and LogP, interleaving, host lists,
//!   sinks and the table (it re-exports the agent's modules and the tests
//!   under their old paths).
//! - `netgap-testbed`: the virtual cluster of network namespaces (links,
//!   shapers, agents, its state and lock), behind typed requests; it sees
//!   neither the measurement crate nor the command line.
//! - `netgap-mpi`: the MPI tests and launching mpirun.
//! - `netgap-report`: the report, compare, and import of peer tools' output.
//! - `netgap-shm`: the shared-memory channel of the preload library, the
//!   relay and the `shm` transport.
//! - `netgap-relay`: `netgap relay`, the per-host root process that
//!   carries the preload library's connections to other hosts over xdp
//!   (its server, links, per-connection credit, limits and policy, and
//!   its answer to other hosts' probes), as `netgap::relay`.
//!
//! See `ARCHITECTURE.md` for the map.

pub use netgap_agent::{agent, auth, control};
pub use netgap_bench as bench;
pub use netgap_core::{
    datagram, dropout, files, host, record, sizing, spec, stats, text, units, VERSION,
};
pub use netgap_measure::{
    cluster, conditions, coordinator, hostlist, interleave, logp, output, plan, run, runner, sink,
    sweep, workload_run,
};
pub use netgap_mpi as mpi;
pub use netgap_proto as proto;
pub use netgap_proto::limits;
pub use netgap_relay as relay;
pub use netgap_report as report;
pub use netgap_report::{compare, import};
pub use netgap_shm as shm;
pub use netgap_testbed as testbed;
pub use netgap_transport as transport;
pub use netgap_transport::{flows, preamble};
pub use netgap_workload as workload;
pub use netgap_workload::{confined, shard};

pub mod study;
pub mod testbed_seams;
pub mod wrap;
