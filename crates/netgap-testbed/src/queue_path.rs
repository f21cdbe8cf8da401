//! Each host's link has [`HOST_QUEUES`] queues, and a netgap frame crosses
//! the switch on the queue it left its host on, shaped or not, so that it
//! arrives on that queue at the other host: the xdp transport's direct
//! connections, one queue each, rely on it (an XDP program can hand a
//! frame only to a socket bound to the queue it arrived on). The bridge
//! alone would lose one queue per hop and hash queue 0, and a shaped
//! port's uplink (its ingress redirected to an IFB device, `shaping.rs`)
//! would send every frame on with queue 0; the programs that prevent both,
//! at the ingress and the egress of every bridge port, and the measurement
//! behind them, are `netgap_transport::xdp::queue_path`'s. A kernel that
//! refuses the programs (no tcx, before 6.6) keeps one queue per link.
//! The programs go with the ports, when `down` deletes the namespaces.

use crate::netns_ops::in_netns;
use crate::TestbedError;
use netgap_transport::xdp::queue_path::{keep_queue_here, kernel_keeps_queues_here};

/// Queues of every host's link, each way: every queue a direct
/// connection's queue offer can name (`netgap_proto::direct::MAX_QUEUES`,
/// one bit each of a `u32` mask), so the testbed never holds a host to
/// fewer direct connections than the relays can agree on. Queue 0 is the
/// port a process (the relay, or the xdp transport itself) holds for every
/// netgap frame of the interface; each other queue can carry one direct
/// connection, so a host has 31 at once beside it. A veth queue costs
/// nothing until an XDP program is attached to the link end (then a ring
/// of 256 pointers and a NAPI context each).
pub const HOST_QUEUES: u32 = netgap_proto::direct::MAX_QUEUES as u32;

/// Keeps netgap frames' queue across the bridge at switch port `port` of
/// namespace `ns`; an error when the kernel refuses.
pub(crate) fn keep_queue(ns: &str, port: &str) -> Result<(), TestbedError> {
    let port = port.to_string();
    let ns_name = ns.to_string();
    in_netns(ns, move || {
        keep_queue_here(&port).map_err(|source| TestbedError::Io {
            what: format!("attaching the queue-keeping programs to {port} (in {ns_name})"),
            source,
        })
    })
}

/// Whether this kernel takes the queue-keeping programs, tried (and
/// taken off again) on the loopback of namespace `ns`.
pub(crate) fn kernel_keeps_queues(ns: &str) -> bool {
    in_netns(ns, || Ok(kernel_keeps_queues_here())).unwrap_or(false)
}
