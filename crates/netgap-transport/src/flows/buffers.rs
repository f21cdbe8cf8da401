//! The flow engine's message buffers: one set per worker, which every flow
//! of the worker sends from and reads into, instead of a buffer per flow.
//!
//! A worker pumps one flow at a time, and no flow needs what it read once
//! it has handled it: a pingpong client only counts the bytes of its
//! reply, a connect-mode end only counts the other end's, and a datagram
//! client reads only its reply's header and length. What flows send is the
//! work's payload pattern, the same for every flow of the worker (a
//! datagram client writes its own header in front of it before each send).
//! So a flow holds offsets and counters, not bytes, and a worker's few
//! buffers are sized to the message and placed at the point's layout
//! (`--align`, `--offset`): a 1-byte hotspot flow costs no page of its own,
//! and a large message keeps the page alignment its copies want.
//!
//! The one exception is an echo (a pingpong flow's server side) that the
//! socket did not take whole: what is left of it must wait for the socket
//! while other flows use the worker's buffers, so it goes to a buffer of
//! the flow's own, of its message size at the point's layout, which the
//! flow keeps from then on and reads into instead of the worker's. A
//! small echo is nearly always taken whole (a 1-byte one is taken or
//! refused, and only by a full socket buffer), so small-message flows
//! seldom have one; large-message flows under back-pressure do, and so
//! stay as they were before the buffers were shared.
//!
//! Every buffer is counted, while it lives, by its side's [`BufferGauge`]
//! (its footprint, [`AlignedBuffer::footprint_bytes`]), so a side can say
//! what its buffers hold: [`super::PreparedClients::buffer_bytes`],
//! [`super::FlowServer::peak_buffer_bytes`].

use super::{EngineConfig, EngineError, FlowWork};
use crate::buffer::{AlignedBuffer, BufferLayout, LayoutError};
use crate::udp::HEADER_BYTES;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What one side of an engine (a client's flows, a server's workers) holds
/// in message buffers now and has held at most, in bytes of their
/// footprints. Shared by the side's workers.
#[derive(Debug, Default)]
pub(crate) struct BufferGauge {
    held: AtomicU64,
    peak: AtomicU64,
}

impl BufferGauge {
    fn charge(&self, bytes: u64) {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn release(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub(super) fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The most bytes held at once so far.
    pub(super) fn peak_bytes(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// A message buffer counted by a [`BufferGauge`] while it lives; it reads
/// and writes as a `[u8]`.
pub(crate) struct CountedBuffer {
    buf: AlignedBuffer,
    gauge: Arc<BufferGauge>,
}

impl CountedBuffer {
    /// `len_bytes` zero bytes at `layout`, counted by `gauge`.
    pub(super) fn new(
        len_bytes: usize,
        layout: BufferLayout,
        gauge: &Arc<BufferGauge>,
    ) -> Result<CountedBuffer, LayoutError> {
        let buf = AlignedBuffer::try_zeroed(len_bytes, layout)?;
        gauge.charge(buf.footprint_bytes() as u64);
        Ok(CountedBuffer {
            buf,
            gauge: Arc::clone(gauge),
        })
    }
}

impl Deref for CountedBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl DerefMut for CountedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for CountedBuffer {
    fn drop(&mut self) {
        self.gauge.release(self.buf.footprint_bytes() as u64);
    }
}

impl fmt::Debug for CountedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.buf.fmt(f)
    }
}

/// Which end of the work a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Client,
    Server,
}

/// One worker's message buffers, shared by its flows (see the module
/// docs).
#[derive(Debug)]
pub(crate) struct WorkerBuffers {
    /// What the worker's flows send: the work's payload pattern, which no
    /// flow changes except a datagram client's header in front of it.
    /// Empty for an echo, which sends back what it read.
    pub send: CountedBuffer,
    /// Where the worker's flows read into: a read's bytes are the reading
    /// flow's only until it hands the worker back.
    pub recv: CountedBuffer,
    layout: BufferLayout,
    gauge: Arc<BufferGauge>,
}

/// The largest connect-mode buffer; longer requests and replies pass
/// through it in pieces.
pub(crate) const CONNECT_BUF_MAX_BYTES: usize = 64 * 1024;

/// The buffer a connect-mode end moves its request and reply through:
/// the larger of the two, at least 1 byte and at most
/// [`CONNECT_BUF_MAX_BYTES`].
pub(crate) fn connect_chunk_bytes(request_bytes: usize, reply_bytes: usize) -> usize {
    request_bytes
        .max(reply_bytes)
        .clamp(1, CONNECT_BUF_MAX_BYTES)
}

impl WorkerBuffers {
    /// The buffers a worker on `side` of `work` needs (`datagrams`: over a
    /// datagram path, whose messages carry netgap's udp header), at
    /// `layout`, counted by `gauge`. Sizes were checked with the work.
    pub(super) fn for_work(
        work: FlowWork,
        side: Side,
        datagrams: bool,
        layout: BufferLayout,
        gauge: &Arc<BufferGauge>,
    ) -> Result<WorkerBuffers, LayoutError> {
        // (send bytes, receive bytes, the payload pattern and where it
        // starts in the send buffer)
        let (send, recv, fill, from): (usize, usize, fn(usize) -> u8, usize) = match (work, side) {
            (FlowWork::PingPong { size_bytes }, Side::Client) if datagrams => {
                let size = size_bytes.max(1);
                // One spare byte catches a datagram too long.
                (
                    HEADER_BYTES + size,
                    HEADER_BYTES + size + 1,
                    count,
                    HEADER_BYTES,
                )
            }
            // A recognisable payload makes captures readable; its value
            // is not checked.
            (FlowWork::PingPong { size_bytes }, Side::Client) => {
                (size_bytes.max(1), size_bytes.max(1), count, 0)
            }
            (FlowWork::PingPong { size_bytes }, Side::Server) => (0, size_bytes.max(1), count, 0),
            (
                FlowWork::Connect {
                    request_bytes,
                    reply_bytes,
                },
                side,
            ) => {
                let chunk = connect_chunk_bytes(request_bytes, reply_bytes);
                let fill: fn(usize) -> u8 = match side {
                    Side::Client => |_| b'q',
                    Side::Server => |_| b'r',
                };
                (chunk, chunk, fill, 0)
            }
        };
        WorkerBuffers::new(send, recv, layout, gauge).map(|mut b| {
            for (i, byte) in b.send[from..].iter_mut().enumerate() {
                *byte = fill(i);
            }
            b
        })
    }

    /// A send buffer of `send_bytes` and a receive buffer of `recv_bytes`,
    /// zeroed, at `layout`.
    pub(super) fn new(
        send_bytes: usize,
        recv_bytes: usize,
        layout: BufferLayout,
        gauge: &Arc<BufferGauge>,
    ) -> Result<WorkerBuffers, LayoutError> {
        Ok(WorkerBuffers {
            send: CountedBuffer::new(send_bytes, layout, gauge)?,
            recv: CountedBuffer::new(recv_bytes, layout, gauge)?,
            layout,
            gauge: Arc::clone(gauge),
        })
    }

    /// A buffer of one flow's own, of `len_bytes` at the worker's layout,
    /// counted with the worker's.
    pub(super) fn flow_buffer(&self, len_bytes: usize) -> Result<CountedBuffer, LayoutError> {
        CountedBuffer::new(len_bytes, self.layout, &self.gauge)
    }
}

/// The buffers of one worker on `side` of `work` under `cfg` (its data
/// path and layout), counted by `gauge`; a layout `cfg` did not check, or
/// no memory for the buffers, is an error.
pub(crate) fn for_worker(
    work: FlowWork,
    side: Side,
    cfg: &EngineConfig,
    gauge: &Arc<BufferGauge>,
) -> Result<WorkerBuffers, EngineError> {
    let layout = cfg.buffer_layout()?;
    WorkerBuffers::for_work(work, side, cfg.path.datagrams(), layout, gauge).map_err(|e| {
        EngineError::Sys {
            what: "allocating a flow worker's message buffers".into(),
            source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, e),
        }
    })
}

/// The pingpong payload: byte `i` is `i` modulo 256.
fn count(i: usize) -> u8 {
    i as u8
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::buffer::page_bytes;

    #[test]
    fn a_gauge_counts_buffers_while_they_live_and_keeps_its_peak() {
        let gauge = Arc::new(BufferGauge::default());
        let layout = BufferLayout::default();
        let b = WorkerBuffers::new(10, 20, layout, &gauge).unwrap();
        assert_eq!(gauge.held_bytes(), 2 * page_bytes() as u64);
        let own = b.flow_buffer(page_bytes() + 1).unwrap();
        assert_eq!(gauge.held_bytes(), 4 * page_bytes() as u64);
        drop(own);
        drop(b);
        assert_eq!(gauge.held_bytes(), 0);
        assert_eq!(gauge.peak_bytes(), 4 * page_bytes() as u64);
    }

    #[test]
    fn each_work_gets_its_pattern_and_sizes() {
        let gauge = Arc::new(BufferGauge::default());
        let layout = BufferLayout::default();
        let pp = FlowWork::PingPong { size_bytes: 300 };
        let b = WorkerBuffers::for_work(pp, Side::Client, false, layout, &gauge).unwrap();
        assert_eq!((b.send.len(), b.recv.len()), (300, 300));
        assert_eq!((b.send[0], b.send[255], b.send[256]), (0, 255, 0));
        let b = WorkerBuffers::for_work(pp, Side::Client, true, layout, &gauge).unwrap();
        assert_eq!(
            (b.send.len(), b.recv.len()),
            (HEADER_BYTES + 300, HEADER_BYTES + 301)
        );
        assert_eq!(b.send[HEADER_BYTES + 1], 1);
        let b = WorkerBuffers::for_work(pp, Side::Server, false, layout, &gauge).unwrap();
        assert_eq!((b.send.len(), b.recv.len()), (0, 300));
        let c = FlowWork::Connect {
            request_bytes: 16,
            reply_bytes: 100_000,
        };
        let b = WorkerBuffers::for_work(c, Side::Server, false, layout, &gauge).unwrap();
        assert_eq!(b.send.len(), CONNECT_BUF_MAX_BYTES);
        assert!(b.send.iter().all(|&x| x == b'r'));
        // The buffers are where the layout puts them.
        let offset = BufferLayout::new(None, 16).unwrap();
        let b = WorkerBuffers::for_work(pp, Side::Client, false, offset, &gauge).unwrap();
        assert_eq!(b.send.as_ptr() as usize % page_bytes(), 16);
        assert_eq!(b.recv.as_ptr() as usize % page_bytes(), 16);
    }
}
