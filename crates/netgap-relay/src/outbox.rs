//! A link's way out: every frame in order on the flow's one sending half,
//! sent at once by the thread that has it while nothing is queued, or
//! queued for the link's writing thread.

use netgap_proto::relay::{self as frame, Kind};
use netgap_transport::{FlowError, Sender};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use thiserror::Error;

/// Why a frame could not leave on the link.
#[derive(Debug, Clone, Error)]
pub(crate) enum SendError {
    /// The link's writing thread ended (and took the flow's sending half
    /// with it).
    #[error("the link closed")]
    Closed,
    /// The flow failed: the other relay is gone or the link broke. Shared,
    /// so the writing thread hears of it as the sender does.
    #[error("sending to the other relay: {0}")]
    Flow(Arc<FlowError>),
}

/// What a link's writing thread is given.
pub(crate) enum Out {
    /// A whole frame to send.
    Frame(Vec<u8>),
    /// Say `LINK_CLOSE` and stop.
    Close,
    /// A connection's thread could not send on the flow: the link is
    /// broken.
    Broken(SendError),
}

/// How a connection's frame leaves.
#[derive(Clone, Copy)]
pub(crate) enum Via {
    /// On this thread when nothing waits in the writing thread's
    /// queue, waiting for the flow's window if need be: one thread's
    /// wake-up fewer per message. A connection's own threads.
    Now,
    /// Through the writing thread's queue, never waiting: the link's
    /// receiving thread, which must not wait on the flow (the other
    /// relay's window opens only as this end reads).
    Queue,
}

/// The link's way out: every frame in order on the flow's one sending
/// half, sent by the thread that has it or queued for the writing
/// thread.
pub(crate) struct Outbox {
    pub(crate) queue: mpsc::Sender<Out>,
    /// Frames in `queue` not yet sent: while any waits, a frame sent
    /// at once would overtake it (and a connection's `DATA` its own
    /// earlier frames).
    pub(crate) queued: AtomicUsize,
    /// The flow's sending half while the writing thread runs (it takes
    /// it when it ends, releasing the flow).
    pub(crate) tx: Mutex<Option<Box<dyn Sender>>>,
    pub(crate) frames_out: AtomicU64,
}

impl Outbox {
    pub(crate) fn new(queue: mpsc::Sender<Out>, tx: Option<Box<dyn Sender>>) -> Outbox {
        Outbox {
            queue,
            queued: AtomicUsize::new(0),
            tx: Mutex::new(tx),
            frames_out: AtomicU64::new(0),
        }
    }

    pub(crate) fn sender(&self) -> MutexGuard<'_, Option<Box<dyn Sender>>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends frame `f` on the flow, whose sending half `tx` is locked.
    pub(crate) fn put(&self, tx: &mut Option<Box<dyn Sender>>, f: &[u8]) -> Result<(), SendError> {
        tx.as_mut()
            .ok_or(SendError::Closed)?
            .send_all(f)
            .map_err(|e| SendError::Flow(Arc::new(e)))?;
        self.frames_out.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Frame `f` leaves `via` that way (copied only if queued).
    pub(crate) fn send(&self, f: &[u8], via: Via) -> Result<(), SendError> {
        if let Via::Now = via {
            let mut tx = self.sender();
            // Checked under the lock the writing thread sends under,
            // and counted down only once a queued frame is sent.
            if self.queued.load(Ordering::SeqCst) == 0 {
                return self.put(&mut tx, f).inspect_err(|e| {
                    let _ = self.queue.send(Out::Broken(e.clone()));
                });
            }
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.queue.send(Out::Frame(f.to_vec())).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            SendError::Closed
        })
    }

    /// The writing thread's send of a frame from its queue.
    pub(crate) fn send_queued(&self, f: &[u8]) -> Result<(), SendError> {
        let mut tx = self.sender();
        self.put(&mut tx, f)?;
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// The writing thread's own frame (a keep-alive, the close).
    pub(crate) fn send_control(&self, kind: Kind) -> Result<(), SendError> {
        self.put(&mut self.sender(), &frame::frame(kind, 0, &[]))
    }

    /// Tells the writing thread to say `LINK_CLOSE` and stop.
    pub(crate) fn close(&self) {
        // A closed link's writer is gone: nothing more to say.
        let _ = self.queue.send(Out::Close);
    }
}
