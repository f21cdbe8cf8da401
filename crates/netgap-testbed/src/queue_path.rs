//! Each host's link has [`HOST_QUEUES`] queues, and a netgap frame crosses
//! the switch on the queue it left its host on, so that it arrives on that
//! queue at the other host: the xdp transport's direct connections, one
//! queue each, rely on it (an XDP program can hand a frame only to a socket
//! bound to the queue it arrived on). The bridge alone would lose one
//! queue per hop and hash queue 0; the program that prevents it, and the
//! measurement behind it, are `netgap_transport::xdp::queue_path`'s. A
//! kernel that refuses the program (no tcx, before 6.6) keeps one queue per
//! link, as before.

use crate::netns_ops::in_netns;
use crate::TestbedError;
use netgap_transport::xdp::queue_path::{keep_queue_here, kernel_keeps_queues_here};

/// Queues of every host's link, each way. Queue 0 is the port a process
/// (the relay, or the xdp transport itself) holds for every netgap frame
/// of the interface; each other queue can carry one direct connection, so
/// a host has 15 at once beside it. A queue costs nothing until an XDP
/// program is attached (then a ring of 256 pointers and a NAPI context).
pub const HOST_QUEUES: u32 = 16;

/// Keeps netgap frames' queue across the bridge at switch port `port` of
/// namespace `ns`; an error when the kernel refuses.
pub(crate) fn keep_queue(ns: &str, port: &str) -> Result<(), TestbedError> {
    let port = port.to_string();
    let ns_name = ns.to_string();
    in_netns(ns, move || {
        keep_queue_here(&port).map_err(|source| TestbedError::Io {
            what: format!("attaching the queue-keeping program to {port} (in {ns_name})"),
            source,
        })
    })
}

/// Whether this kernel takes the queue-keeping program, tried (and
/// taken off again) on the loopback of namespace `ns`.
pub(crate) fn kernel_keeps_queues(ns: &str) -> bool {
    in_netns(ns, || Ok(kernel_keeps_queues_here())).unwrap_or(false)
}
