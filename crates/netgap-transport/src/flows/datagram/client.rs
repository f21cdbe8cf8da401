//! A client flow's workings: its request, the replies it takes or drops,
//! its re-sends, and the queue of the worker's re-send deadlines.

use super::*;

impl DatagramClient {
    /// A machine for `size_bytes`-byte requests and replies
    /// (`1..=MAX_MESSAGE_BYTES`, checked by the caller).
    pub(crate) fn new(size_bytes: usize) -> DatagramClient {
        DatagramClient {
            size: size_bytes.max(1),
            issued: 0,
            waiting: false,
            retried: false,
            moved: Moved::default(),
            stats: DatagramStats::default(),
        }
    }

    /// The message size, bytes.
    pub(crate) fn size_bytes(&self) -> usize {
        self.size
    }

    /// Whether a request waits for its reply.
    pub(crate) fn waiting(&self) -> bool {
        self.waiting
    }

    /// Whether the current (or last) request was re-sent.
    pub(crate) fn retried(&self) -> bool {
        self.retried
    }

    /// Sends the current request's datagram, flagged RETRY when `retry`;
    /// true if the kernel took it. A full socket buffer drops it, as the
    /// network could: the retry timer sends it again.
    pub(super) fn send_current(
        &mut self,
        io: &mut impl Write,
        bufs: &mut WorkerBuffers,
        retry: bool,
    ) -> Result<bool, MachineError> {
        let size = self.size_bytes() as u64;
        let seq = self.issued.saturating_sub(1);
        let header = Header {
            kind: Kind::Data,
            flags: if retry { FLAG_RETRY } else { 0 },
            seq,
            offset_bytes: seq.saturating_mul(size),
        };
        let len = HEADER_BYTES + self.size;
        let datagram = &mut bufs.send[..len];
        datagram[..HEADER_BYTES].copy_from_slice(&header.encode());
        match io.write(datagram) {
            Ok(n) if n == len => {
                self.stats.datagrams_sent += 1;
                Ok(true)
            }
            Ok(n) => Err(MachineError::Io(io::Error::other(format!(
                "the kernel sent {n} of a {len}-byte datagram"
            )))),
            Err(e) if is_transient(&e) => Ok(false),
            Err(e) => Err(MachineError::Io(e)),
        }
    }

    /// Issues the next request. Its bytes count as sent whether or not
    /// this first datagram leaves (a re-send carries the same request).
    pub(crate) fn start(
        &mut self,
        io: &mut impl Write,
        bufs: &mut WorkerBuffers,
    ) -> Result<(), MachineError> {
        self.issued += 1;
        self.waiting = true;
        self.retried = false;
        self.moved.tx_bytes += self.size_bytes() as u64;
        self.send_current(io, bufs, false).map(|_| ())
    }

    /// Sends the current request again, if it still waits.
    pub(crate) fn resend(
        &mut self,
        io: &mut impl Write,
        bufs: &mut WorkerBuffers,
    ) -> Result<(), MachineError> {
        if !self.waiting {
            return Ok(());
        }
        self.retried = true;
        if self.send_current(io, bufs, true)? {
            self.stats.retries += 1;
        }
        Ok(())
    }

    /// Reads the datagrams that are there (at most [`BATCH`]): `Done` when
    /// the current request's reply arrived, else `WantRead`. Datagrams that
    /// are not netgap's are ignored; a data datagram from the future, or
    /// of the wrong size for the current request, is the server breaking
    /// the protocol.
    pub(crate) fn pump(
        &mut self,
        io: &mut impl Read,
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        let size = self.size_bytes();
        let buf = &mut bufs.recv[..HEADER_BYTES + size + 1];
        for _ in 0..BATCH {
            let n = match io.read(buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Progress::WantRead),
                Err(e) => return Err(MachineError::Io(e)),
            };
            let Ok(h) = Header::decode(&buf[..n]) else {
                continue;
            };
            if h.kind != Kind::Data {
                // A late hello-ack of the opening, or control we do not use.
                continue;
            }
            self.stats.datagrams_received += 1;
            let current = self.issued.wrapping_sub(1);
            if self.issued == 0 || h.seq > current {
                return Err(MachineError::Unexpected);
            }
            if h.seq < current || !self.waiting {
                self.stats.duplicates += 1;
                continue;
            }
            if n != HEADER_BYTES + size {
                return Err(MachineError::Unexpected);
            }
            self.waiting = false;
            self.moved.rx_bytes += size as u64;
            return Ok(Progress::Done);
        }
        Ok(Progress::WantRead)
    }
}

impl RetryQueue {
    /// The earliest entry, if any.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Queues `slot` at `at`.
    pub(crate) fn push(&mut self, at: Instant, slot: usize) {
        self.heap.push(Reverse((at, slot)));
    }

    /// Takes the earliest entry if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<usize> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse((_, s))| s),
            _ => None,
        }
    }
}
