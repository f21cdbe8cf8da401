//! `bibw`: both sides send N×X bytes at the same time; bandwidth is all bytes
//! both ways over the time until the client has sent its share and received
//! the server's (seeds 002, 004). Each side keeps a sender thread for the
//! whole point and receives on its own thread: starting a thread per
//! repetition costs hundreds of microseconds on a small virtual machine,
//! which would land inside the measured time.
//!
//! The two threads of a side share one clock of no progress: the first to
//! fail (a silent peer: no byte moved for `--timeout`) ends the flow, so the
//! other wakes at once instead of waiting out a timeout of its own, and a
//! stopped peer is named within one `--timeout` of the flow's silence.

use super::payload::{recv_checked, PatternCursor};
use super::{ClientRole, Metric, RepOutcome, RoleParams, ServerOutcome, ServerRole, Test};
use netgap_core::stats::LatencyHistogram;
use netgap_core::units::gbps;
use netgap_transport::buffer::AlignedBuffer;
use netgap_transport::cpu::thread_cpu_ns;
use netgap_transport::{AbortHandle, Flow, FlowError, Receiver, Sender};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

/// The simultaneous bidirectional bandwidth test.
pub(crate) struct Bibw;

/// Smallest receive buffer in bytes; a byte stream has no boundaries.
const MIN_RECV_BUFFER_BYTES: usize = 256 * 1024;

/// One end of a bibw point: a receiver here, a sender on a helper thread.
struct Side {
    rx: Box<dyn Receiver>,
    recv_buf: AlignedBuffer,
    size_bytes: u64,
    rx_pattern: PatternCursor,
    /// Iteration counts for the sender thread; dropping it ends the thread.
    to_sender: Option<mpsc::Sender<u64>>,
    /// Per repetition: the sender's CPU time in nanoseconds, or its error.
    from_sender: mpsc::Receiver<Result<u64, FlowError>>,
    sender: Option<JoinHandle<()>>,
    /// Ends the flow for both threads when either fails; `None` for a flow
    /// that cannot be ended from outside.
    abort: Option<AbortHandle>,
    /// A reliable flow: every byte sent arrives, so the first message can
    /// be waited for ([`Side::exchange`]).
    reliable: bool,
}

/// The sender thread's own: its half, its buffer and pattern, and the
/// handle that ends the flow for the receiving thread when a send fails.
struct SenderParts {
    tx: Box<dyn Sender>,
    buf: AlignedBuffer,
    pattern: PatternCursor,
    abort: Option<AbortHandle>,
}

fn sender_loop(
    parts: SenderParts,
    work: mpsc::Receiver<u64>,
    done: mpsc::Sender<Result<u64, FlowError>>,
) {
    let SenderParts {
        mut tx,
        mut buf,
        mut pattern,
        abort,
    } = parts;
    for iterations in work {
        let cpu0 = thread_cpu_ns();
        let mut result = Ok(());
        for _ in 0..iterations {
            pattern.fill(&mut buf);
            result = tx.send_all(&buf);
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = tx.end_burst();
        }
        let report = result.map(|()| thread_cpu_ns().saturating_sub(cpu0));
        let failed = report.is_err();
        if failed {
            // The receiving thread may wait on the same silent peer with a
            // clock of its own: end its wait now.
            if let Some(a) = &abort {
                a.abort();
            }
        }
        if done.send(report).is_err() || failed {
            return;
        }
    }
}

impl Side {
    fn new(params: RoleParams, flow: Box<dyn Flow>) -> Result<Side, FlowError> {
        let size_bytes = params.size_bytes;
        let abort = flow.abort_handle();
        let reliable = flow.reliable();
        let (tx, rx) = flow.into_halves();
        let (to_sender, work) = mpsc::channel();
        let (done, from_sender) = mpsc::channel();
        let parts = SenderParts {
            tx,
            buf: netgap_transport::buffer::message_buffer(size_bytes, params.buffer),
            pattern: PatternCursor::new(params.verify),
            abort: abort.clone(),
        };
        let sender = std::thread::Builder::new()
            .name("bibw sender".into())
            .spawn(move || sender_loop(parts, work, done))
            .map_err(FlowError::Io)?;
        Ok(Side {
            rx,
            recv_buf: AlignedBuffer::zeroed(size_bytes.max(MIN_RECV_BUFFER_BYTES), params.buffer),
            size_bytes: size_bytes as u64,
            rx_pattern: PatternCursor::new(params.verify),
            to_sender: Some(to_sender),
            from_sender,
            sender: Some(sender),
            abort,
            reliable,
        })
    }

    /// Sends and receives `iterations` messages each way at once; returns the
    /// sending thread's CPU time in nanoseconds and the bytes an unreliable
    /// flow counted lost on the way in.
    /// One repetition: `iterations` messages each way. With `after_first`
    /// (the server) the side sends only once the other side's first message
    /// has come: the client's clock starts before it sends, so nothing the
    /// server sends can wait in the client's receive buffer before the
    /// client's clock starts and be counted as if the link had carried it
    /// inside the window (with a receive buffer autotuned to megabytes, a
    /// whole repetition's worth could). An unreliable flow, whose first
    /// message may be lost, starts at once.
    fn exchange(&mut self, iterations: u64, after_first: bool) -> Result<(u64, u64), FlowError> {
        let gone = || FlowError::Io(std::io::Error::other("bibw sender thread ended"));
        let mut total = self.size_bytes * iterations;
        let mut lost_first = 0;
        if after_first && self.reliable && iterations > 0 {
            let first = recv_checked(
                self.rx.as_mut(),
                self.size_bytes,
                &mut self.recv_buf,
                &mut self.rx_pattern,
            );
            match first {
                Ok(lost) => lost_first = lost,
                Err(e) => {
                    if let Some(a) = &self.abort {
                        a.abort();
                    }
                    return Err(e);
                }
            }
            total -= self.size_bytes;
        }
        self.to_sender
            .as_ref()
            .ok_or_else(gone)?
            .send(iterations)
            .map_err(|_| gone())?;
        let received = recv_checked(
            self.rx.as_mut(),
            total,
            &mut self.recv_buf,
            &mut self.rx_pattern,
        )
        .map(|lost| lost + lost_first);
        if received.is_err() {
            // The sender may wait on the same silent peer: end its wait now.
            if let Some(a) = &self.abort {
                a.abort();
            }
        }
        let sent = self.from_sender.recv().map_err(|_| gone())?;
        match (received, sent) {
            (Ok(lost), Ok(cpu_ns)) => Ok((cpu_ns, lost)),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
            // Whichever failed first ended the flow under the other: a
            // timeout is the cause, the other's broken flow its effect.
            (Err(r), Err(s)) => Err(if matches!(s, FlowError::TimedOut { .. }) {
                s
            } else {
                r
            }),
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        self.to_sender = None;
        if let Some(h) = self.sender.take() {
            let _ = h.join();
        }
    }
}

struct Client(Side);
struct Server(Side);

impl ClientRole for Client {
    fn run(
        &mut self,
        iterations: u64,
        _rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        let t0 = Instant::now();
        let (helper_cpu_ns, lost) = self.0.exchange(iterations, false)?;
        let elapsed_ns = netgap_core::units::ns_since(t0);
        let bytes = self.0.size_bytes * iterations;
        Ok(RepOutcome {
            elapsed_ns,
            value: gbps((2 * bytes) as f64, elapsed_ns as f64),
            bytes_tx: bytes,
            bytes_rx: bytes.saturating_sub(lost),
            helper_cpu_ns,
        })
    }
}

impl ServerRole for Server {
    fn run(&mut self, iterations: u64) -> Result<ServerOutcome, FlowError> {
        let (helper_cpu_ns, lost) = self.0.exchange(iterations, true)?;
        let bytes = self.0.size_bytes * iterations;
        Ok(ServerOutcome {
            bytes_rx: bytes.saturating_sub(lost),
            bytes_tx: bytes,
            helper_cpu_ns,
        })
    }
}

impl Test for Bibw {
    fn name(&self) -> &'static str {
        "bibw"
    }
    fn summary(&self) -> &'static str {
        "simultaneous bidirectional bandwidth: both sides send N×X bytes at once"
    }
    fn metric(&self) -> Metric {
        Metric::BandwidthGbps
    }
    fn client(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ClientRole>, FlowError> {
        Ok(Box::new(Client(Side::new(params, flow)?)))
    }
    fn server(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ServerRole>, FlowError> {
        Ok(Box::new(Server(Side::new(params, flow)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netgap_core::spec::{Mode, TransportOptions};
    use netgap_transport::buffer::BufferLayout;
    use netgap_transport::FlowConfig;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A tcp flow pair on loopback with `timeout` as its I/O timeout.
    fn tcp_pair(timeout: Duration) -> (Box<dyn Flow>, Box<dyn Flow>) {
        let tcp = netgap_transport::find("tcp").expect("tcp");
        let config = FlowConfig {
            mode: Mode::Event,
            options: TransportOptions::default(),
            io_timeout: timeout,
        };
        let mut listener = tcp
            .listen(&config, std::net::IpAddr::from([127, 0, 0, 1]))
            .expect("listen");
        let addr = listener.addr();
        let connecting = std::thread::spawn(move || tcp.connect(&config, &addr));
        let server = listener.accept(Duration::from_secs(5)).expect("accept");
        (server, connecting.join().expect("join").expect("connect"))
    }

    #[test]
    fn a_side_whose_peer_reads_but_never_sends_fails_at_one_timeout() {
        // The receiving thread hears nothing for the timeout while the
        // sending thread still moves bytes: the repetition fails then,
        // instead of when the sender has sent its whole (long) share.
        let (flow, mut peer) = tcp_pair(Duration::from_millis(500));
        let draining = Arc::new(AtomicBool::new(true));
        let drain = std::thread::spawn({
            let draining = Arc::clone(&draining);
            move || {
                let mut buf = vec![0u8; 1 << 16];
                while draining.load(Ordering::Relaxed) {
                    if peer.split().1.recv_some(&mut buf).is_err() {
                        break;
                    }
                }
            }
        });
        let params = RoleParams {
            size_bytes: 64 << 10,
            verify: false,
            buffer: BufferLayout::default(),
        };
        let mut side = Side::new(params, flow).expect("side");
        let t0 = Instant::now();
        let result = side.exchange(u64::MAX / (128 << 10), false);
        let took = t0.elapsed();
        draining.store(false, Ordering::Relaxed);
        drop(side);
        drain.join().expect("join");
        assert!(
            matches!(result, Err(FlowError::TimedOut { .. })),
            "{result:?}"
        );
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }
}
