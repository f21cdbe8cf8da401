//! A connection's flow control as plain data: on the receiving side, the
//! bytes from the other relay that wait for the program's ring, the
//! credit they hold and return (`netgap_proto::relay::Inflow`), and the
//! end; on the sending side, the credit in hand and the answer to this
//! end's `OPEN`. The connection ([`crate::conn`]) keeps each under a lock
//! and moves the bytes; these types only decide, so tests drive them
//! with plain calls.

use netgap_proto::relay::{CreditError, Inflow, Outflow};
use std::collections::VecDeque;
use thiserror::Error;

/// Bytes from the other relay waiting for the program's ring.
///
/// A `DATA` frame goes straight into the ring only while nothing waits
/// before it and the connection's receiving thread is not putting a
/// chunk into the ring, so bytes reach the program in the order they
/// came; what the ring has no room for waits here, in order, and its
/// credit comes back only as it leaves.
#[derive(Default)]
pub(crate) struct Inbox {
    chunks: VecDeque<Vec<u8>>,
    flow: Inflow,
    end: bool,
    /// The connection's receiving thread is putting a chunk it took
    /// into the ring: the link's reader must queue, not write.
    writing: bool,
}

/// What the connection's receiving thread does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Put this chunk into the ring, then say [`Inbox::written`].
    Chunk(Vec<u8>),
    /// Everything queued went: the other relay's end comes now.
    End,
    /// Nothing to do yet.
    Idle,
}

impl Inbox {
    /// A `DATA` of `len` bytes arrived, charged against the credit the
    /// other relay had. Ok(true): nothing waits before it, so it may go
    /// straight into the ring; Err: past the credit (the other relay
    /// broke the protocol).
    pub(crate) fn arrive(&mut self, len: u32) -> Result<bool, CreditError> {
        self.flow.arrive(len)?;
        Ok(self.chunks.is_empty() && !self.writing)
    }

    /// `n` bytes that arrived left for the program (into its ring, or
    /// discarded): the credit to return now, once a batch is due.
    pub(crate) fn moved(&mut self, n: u32) -> Option<u32> {
        self.flow.moved(n)
    }

    /// Bytes that arrived and found no room (or bytes before them) wait
    /// for the receiving thread.
    pub(crate) fn queue(&mut self, rest: Vec<u8>) {
        self.chunks.push_back(rest);
    }

    /// The other relay's `END`: it comes after what is queued.
    pub(crate) fn end(&mut self) {
        self.end = true;
    }

    /// The receiving thread's next step; a chunk taken is being written
    /// until [`Inbox::written`].
    pub(crate) fn next(&mut self) -> Next {
        if let Some(v) = self.chunks.pop_front() {
            self.writing = true;
            return Next::Chunk(v);
        }
        if self.end {
            Next::End
        } else {
            Next::Idle
        }
    }

    /// The chunk [`Inbox::next`] gave is done with (`moved`: its bytes
    /// went, None: the connection broke): the credit to return now.
    pub(crate) fn written(&mut self, moved: Option<u32>) -> Option<u32> {
        self.writing = false;
        self.flow.moved(moved?)
    }

    /// Bytes waiting for the ring.
    #[cfg(test)]
    pub(crate) fn queued_bytes(&self) -> u32 {
        self.flow.queued_bytes()
    }

    /// The queued bytes, in order (for tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> Vec<u8> {
        self.chunks.iter().flatten().copied().collect()
    }

    /// Whether the other relay's `END` came.
    #[cfg(test)]
    pub(crate) fn ended(&self) -> bool {
        self.end
    }
}

/// Where this end's `OPEN` stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// No answer yet.
    Waiting,
    /// `OPEN_OK`, or a connection the other relay opened.
    Open,
    /// `OPEN_REFUSED`: no listen waits with the key there.
    Refused,
}

/// A second answer to one `OPEN`: the other relay broke the protocol.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("a second answer to its OPEN")]
pub(crate) struct SecondAnswer;

/// The sending side: credit, and the answer to this end's `OPEN`.
pub(crate) struct SendSide {
    pub(crate) flow: Outflow,
    pub(crate) open: Opening,
}

impl SendSide {
    /// A connection this end opened (`opened`: false, waiting for the
    /// answer) or the other relay opened (true), with a whole window.
    pub(crate) fn new(opened: bool) -> SendSide {
        SendSide {
            flow: Outflow::default(),
            open: if opened {
                Opening::Open
            } else {
                Opening::Waiting
            },
        }
    }

    /// The other relay's answer to this end's `OPEN`; a second answer
    /// is a fault.
    pub(crate) fn answer(&mut self, ok: bool) -> Result<(), SecondAnswer> {
        if self.open != Opening::Waiting {
            return Err(SecondAnswer);
        }
        self.open = if ok { Opening::Open } else { Opening::Refused };
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use netgap_proto::relay::{CHUNK_BYTES, CREDIT_BATCH_BYTES, WINDOW_BYTES};

    const CHUNK: u32 = CHUNK_BYTES as u32;

    #[test]
    fn data_goes_straight_to_the_ring_only_with_nothing_before_it() {
        let mut i = Inbox::default();
        assert!(i.arrive(10).unwrap());
        // The ring took 4 of the 10: the rest waits.
        assert_eq!(i.moved(4), None);
        i.queue(vec![1; 6]);
        // What comes next waits behind it.
        assert!(!i.arrive(3).unwrap());
        i.queue(vec![2; 3]);
        assert_eq!(i.next(), Next::Chunk(vec![1; 6]));
        assert_eq!(i.next(), Next::Chunk(vec![2; 3]));
        // The receiving thread still writes its last chunk: a new frame
        // must not overtake it.
        assert!(!i.arrive(1).unwrap());
        i.queue(vec![3]);
        assert_eq!(i.written(Some(3)), None);
        assert_eq!(i.next(), Next::Chunk(vec![3]));
        assert_eq!(i.written(Some(1)), None);
        assert_eq!(i.next(), Next::Idle);
        assert!(i.arrive(1).unwrap());
    }

    #[test]
    fn credit_comes_back_in_batches_as_bytes_leave() {
        let mut i = Inbox::default();
        for _ in 0..CREDIT_BATCH_BYTES / CHUNK - 1 {
            assert!(i.arrive(CHUNK).unwrap());
            assert_eq!(i.moved(CHUNK), None);
        }
        assert!(i.arrive(CHUNK).unwrap());
        assert_eq!(i.moved(CHUNK), Some(CREDIT_BATCH_BYTES));
        assert_eq!(i.queued_bytes(), 0);
    }

    #[test]
    fn a_sender_past_the_window_is_refused_and_queued_bytes_hold_their_credit() {
        let mut i = Inbox::default();
        for k in 0..WINDOW_BYTES / CHUNK {
            assert_eq!(i.arrive(CHUNK).unwrap(), k == 0);
            i.queue(vec![0; CHUNK_BYTES]);
        }
        assert_eq!(i.queued_bytes(), WINDOW_BYTES);
        assert!(matches!(i.arrive(1), Err(CreditError::Overrun { .. })));
        // A chunk leaves the queue: its credit is owed, and the window
        // has room for it again.
        assert!(matches!(i.next(), Next::Chunk(_)));
        assert_eq!(i.written(Some(CHUNK)), None);
        assert!(!i.arrive(CHUNK).unwrap());
        // A chunk that broke the connection returns nothing.
        assert!(matches!(i.next(), Next::Chunk(_)));
        assert_eq!(i.written(None), None);
    }

    #[test]
    fn the_end_comes_after_everything_queued() {
        let mut i = Inbox::default();
        assert!(i.arrive(2).unwrap());
        i.queue(vec![7, 8]);
        i.end();
        assert!(i.ended());
        assert_eq!(i.next(), Next::Chunk(vec![7, 8]));
        i.written(Some(2));
        assert_eq!(i.next(), Next::End);
        assert!(i.queued().is_empty());
    }

    #[test]
    fn an_open_takes_one_answer() {
        let mut s = SendSide::new(false);
        assert_eq!(s.open, Opening::Waiting);
        s.answer(false).unwrap();
        assert_eq!(s.open, Opening::Refused);
        assert_eq!(s.answer(true), Err(SecondAnswer));
        let mut theirs = SendSide::new(true);
        assert_eq!(theirs.flow.credit_bytes(), WINDOW_BYTES);
        assert!(theirs.answer(true).is_err());
    }
}
