//! `multistream`: -P N simultaneous streams from the first client host to
//! the server; the headline is their aggregate bandwidth (seeds 000, 001,
//! 002); with `--bidir` every stream sends both ways at once.

use super::place;
use super::stream::{Direction, StreamWorkload};
use super::CountFlag;

/// The `multistream` workload.
pub(crate) const MULTISTREAM: StreamWorkload = StreamWorkload {
    about: StreamWorkload::about(
        "multistream",
        "-P N parallel streams from one client host to the server; aggregate bandwidth",
        CountFlag::Streams,
        true,
    ),
    direction: Direction::ToServer,
    place: place::streams,
};
