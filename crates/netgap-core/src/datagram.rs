//! Counters of an unreliable flow (datagrams sent, received, lost,
//! reordered, duplicated, retried), as the data path keeps them and results
//! record them.

use serde::{Deserialize, Serialize};

/// Largest payload of one datagram message, in bytes: 65,507 bytes of IPv4
/// UDP payload less the udp transport's 24-byte header. The udp transport
/// checks at compile time that its own limit is this one.
pub const MAX_MESSAGE_BYTES: usize = 65_483;

/// Counters of an unreliable flow as one end sees them: cumulative since the
/// flow connected from the transport's flow monitor, per repetition in the runner,
/// summed over a point's measured repetitions in results. Only data
/// datagrams count, not the rendezvous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DatagramStats {
    /// Data datagrams this end put on the wire, re-sends included.
    pub datagrams_sent: u64,
    /// Data datagrams that reached this end: new, late and duplicate alike.
    pub datagrams_received: u64,
    /// Datagrams from the peer this end never delivered because a later one
    /// arrived first; a late arrival of one stays counted here.
    pub lost: u64,
    /// Payload bytes of the `lost` datagrams.
    pub lost_bytes: u64,
    /// Late arrivals of datagrams already counted lost; not delivered.
    pub reordered: u64,
    /// Further copies of datagrams already delivered; not delivered again.
    pub duplicates: u64,
    /// Re-sends this end made (after its retry timeout, or to answer a peer
    /// that asked); included in `datagrams_sent`.
    pub retries: u64,
    /// Frames that reached this end's receiver and no flow took: the
    /// kernel's drops on the way to an xdp socket (its receive ring full,
    /// no buffer to fill), and the port's own (for no open session, from
    /// the wrong peer, failing authentication). Counted for the whole
    /// port: with several flows on one, each reports them all. Not among
    /// `datagrams_received`.
    #[serde(default)]
    pub dropped: u64,
}

impl DatagramStats {
    /// The counts since `earlier`, a previous reading of the same counters.
    pub fn since(&self, earlier: &DatagramStats) -> DatagramStats {
        DatagramStats {
            datagrams_sent: self.datagrams_sent.saturating_sub(earlier.datagrams_sent),
            datagrams_received: self
                .datagrams_received
                .saturating_sub(earlier.datagrams_received),
            lost: self.lost.saturating_sub(earlier.lost),
            lost_bytes: self.lost_bytes.saturating_sub(earlier.lost_bytes),
            reordered: self.reordered.saturating_sub(earlier.reordered),
            duplicates: self.duplicates.saturating_sub(earlier.duplicates),
            retries: self.retries.saturating_sub(earlier.retries),
            dropped: self.dropped.saturating_sub(earlier.dropped),
        }
    }

    /// The sum of two sets of counts, saturating.
    pub fn plus(&self, other: &DatagramStats) -> DatagramStats {
        DatagramStats {
            datagrams_sent: self.datagrams_sent.saturating_add(other.datagrams_sent),
            datagrams_received: self
                .datagrams_received
                .saturating_add(other.datagrams_received),
            lost: self.lost.saturating_add(other.lost),
            lost_bytes: self.lost_bytes.saturating_add(other.lost_bytes),
            reordered: self.reordered.saturating_add(other.reordered),
            duplicates: self.duplicates.saturating_add(other.duplicates),
            retries: self.retries.saturating_add(other.retries),
            dropped: self.dropped.saturating_add(other.dropped),
        }
    }

    /// Checks the invariants of counts taken over one interval: re-sends
    /// are among the datagrams sent, late and duplicate arrivals among the
    /// datagrams received, and no lost datagram held more than a datagram's
    /// payload ([`MAX_MESSAGE_BYTES`]).
    pub fn validate(&self) -> Result<(), DatagramCountsError> {
        if self.retries > self.datagrams_sent {
            return Err(DatagramCountsError::Retries {
                retries: self.retries,
                sent: self.datagrams_sent,
            });
        }
        if self.reordered.saturating_add(self.duplicates) > self.datagrams_received {
            return Err(DatagramCountsError::Arrivals {
                reordered: self.reordered,
                duplicates: self.duplicates,
                received: self.datagrams_received,
            });
        }
        if self.lost_bytes > self.lost.saturating_mul(MAX_MESSAGE_BYTES as u64) {
            return Err(DatagramCountsError::LostBytes {
                lost_bytes: self.lost_bytes,
                lost: self.lost,
            });
        }
        Ok(())
    }
}

/// Counts that break an invariant of [`DatagramStats::validate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatagramCountsError {
    /// More re-sends than datagrams sent.
    #[error("{retries} retries > {sent} datagrams sent")]
    Retries {
        /// Re-sends counted.
        retries: u64,
        /// Datagrams sent.
        sent: u64,
    },
    /// More late and duplicate arrivals than arrivals.
    #[error("{reordered} reordered + {duplicates} duplicates > {received} datagrams received")]
    Arrivals {
        /// Late arrivals.
        reordered: u64,
        /// Duplicate arrivals.
        duplicates: u64,
        /// All arrivals.
        received: u64,
    },
    /// More bytes lost than the lost datagrams could hold.
    #[error("{lost_bytes} lost bytes in {lost} lost datagrams")]
    LostBytes {
        /// Payload bytes counted lost.
        lost_bytes: u64,
        /// Datagrams counted lost.
        lost: u64,
    },
}
