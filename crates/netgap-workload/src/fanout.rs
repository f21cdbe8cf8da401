//! `fanout`: one server streams to N clients, spread cyclically over the
//! client hosts, at once; the headline is the aggregate bandwidth the
//! clients receive (seeds 000, 001, 002).

use super::place;
use super::stream::{Direction, StreamWorkload};
use super::CountFlag;

/// The `fanout` workload.
pub(crate) const FANOUT: StreamWorkload = StreamWorkload {
    about: StreamWorkload::about(
        "fanout",
        "one server streams to N clients at once; aggregate and per-flow bandwidth",
        CountFlag::Clients,
        false,
    ),
    direction: Direction::FromServer,
    place: place::spread,
};
