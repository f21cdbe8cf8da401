//! `fanin`: clients, spread cyclically over the client hosts, stream to one
//! server at once; the headline is the aggregate bandwidth the server
//! receives (seeds 000, 001, 002).

use super::place;
use super::stream::{Direction, StreamWorkload};
use super::CountFlag;

/// The `fanin` workload.
pub(crate) const FANIN: StreamWorkload = StreamWorkload {
    about: StreamWorkload::about(
        "fanin",
        "N clients stream to one server at once; aggregate and per-flow bandwidth",
        CountFlag::Clients,
        false,
    ),
    direction: Direction::ToServer,
    place: place::spread,
};
