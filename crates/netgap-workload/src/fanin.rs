//! `fanin`: clients, spread cyclically over the client hosts, stream to one
//! server at once; the headline is the aggregate bandwidth the server
//! receives (seeds 000, 001, 002).

use super::place;
use super::stream::{Direction, StreamWorkload};
use super::CountFlag;

/// The `fanin` workload.
pub(crate) const FANIN: StreamWorkload = StreamWorkload {
    name: "fanin",
    summary: "N clients stream to one server at once; aggregate and per-flow bandwidth",
    direction: Direction::ToServer,
    count: CountFlag::Clients,
    place: place::spread,
    bidir: false,
};
