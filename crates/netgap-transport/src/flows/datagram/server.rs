//! A server worker's workings: what it answers to each datagram of its
//! flows, and the flows' counts it reports.

use super::*;

impl Server {
    pub(super) fn new(
        size_bytes: usize,
        proof: Option<DatagramListenerProof>,
        layout: BufferLayout,
        gauge: &Arc<BufferGauge>,
    ) -> Result<Server, LayoutError> {
        // Room for a proof's hello too, whatever the message size, and the
        // spare byte that shows a datagram too long.
        let room = size_bytes.max(1).max(DATAGRAM_HELLO_BYTES);
        Ok(Server {
            buf: CountedBuffer::new(HEADER_BYTES + room + 1, layout, gauge)?,
            size_bytes: size_bytes.max(1),
            peers: HashMap::new(),
            proof,
            reply: [0u8; HEADER_BYTES + DATAGRAM_ANSWER_BYTES],
            totals: ServerTotals::default(),
            stats: DatagramStats::default(),
        })
    }

    pub(super) fn totals(mut self) -> ServerTotals {
        self.totals.datagrams = Some(self.stats);
        self.totals
    }

    /// Answers what is queued on `socket`, at most [`BATCH`] datagrams,
    /// and fewer once `rate` is ahead (every datagram is charged to it);
    /// how many datagrams it read, whoever sent them.
    pub(super) fn drain(
        &mut self,
        socket: &UdpSocket,
        rate: Option<&crate::rate::RateBudget>,
    ) -> u64 {
        let mut read = 0;
        for _ in 0..BATCH {
            if crate::flows::io::ahead(rate) {
                return read;
            }
            let (n, from) = match socket.recv_from(&mut self.buf) {
                Ok(got) => got,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if is_transient(&e) => return read,
                Err(_) => {
                    self.totals.errors += 1;
                    return read;
                }
            };
            read += 1;
            if let Some(r) = rate {
                r.charge(n as u64);
            }
            match self.answer(n, from) {
                Answer::None => {}
                Answer::Reply(len) => {
                    // A lost answer is asked for again by the next hello
                    // or confirmation.
                    let _ = socket.send_to(&self.reply[..len], from);
                }
                Answer::Echo { again } => {
                    // The retry flag is the client's; the reply is plain.
                    self.buf[4] = 0;
                    if socket.send_to(&self.buf[..n], from).is_ok() {
                        if let Some(r) = rate {
                            r.charge(n as u64);
                        }
                        self.stats.datagrams_sent += 1;
                        if again {
                            self.stats.retries += 1;
                        }
                    }
                }
            }
        }
        read
    }

    /// Accounts for the `n`-byte datagram in `buf` from `from` and says
    /// what to send back. Never panics on what a peer sends.
    pub(super) fn answer(&mut self, n: usize, from: SocketAddr) -> Answer {
        let Ok(h) = Header::decode(&self.buf[..n]) else {
            self.totals.errors += 1;
            return Answer::None;
        };
        match h.kind {
            Kind::Hello => match &self.proof {
                None => {
                    if !self.register(from) {
                        return Answer::None;
                    }
                    self.control(Kind::HelloAck, &[])
                }
                // Answered from the hello alone, nothing kept: the answer
                // is no bigger than the hello.
                Some(proof) => match proof.on_hello(from, &self.buf[HEADER_BYTES..n]) {
                    Ok(answer) => self.control(Kind::HelloAck, &answer),
                    Err(_) => self.stranger(),
                },
            },
            Kind::Confirm => match &self.proof {
                Some(proof) => match proof.on_confirm(from, &self.buf[HEADER_BYTES..n]) {
                    Ok(()) => {
                        if !self.register(from) {
                            return Answer::None;
                        }
                        self.control(Kind::ConfirmAck, &[])
                    }
                    Err(_) => self.stranger(),
                },
                None => {
                    self.totals.errors += 1;
                    Answer::None
                }
            },
            Kind::Data => {
                let Some(next) = self.peers.get_mut(&from) else {
                    // A sender that has not proven the session (or, with
                    // no proof, said hello): never answered.
                    if self.proof.is_some() {
                        return self.stranger();
                    }
                    self.totals.errors += 1;
                    return Answer::None;
                };
                if n != HEADER_BYTES + self.size_bytes {
                    self.totals.errors += 1;
                    return Answer::None;
                }
                self.stats.datagrams_received += 1;
                if h.seq < *next {
                    self.stats.duplicates += 1;
                    return Answer::Echo { again: true };
                }
                // Clients never skip a request; a gap is requests lost
                // before a re-send could carry them, kept for the record.
                let gap = h.seq - *next;
                self.stats.lost += gap;
                self.stats.lost_bytes += gap.saturating_mul(self.size_bytes as u64);
                *next = h.seq.saturating_add(1);
                let size = self.size_bytes as u64;
                self.totals.bytes_rx += size;
                self.totals.bytes_tx += size;
                Answer::Echo { again: false }
            }
            Kind::HelloAck | Kind::Probe | Kind::Nack | Kind::ConfirmAck | Kind::Ack => {
                Answer::None
            }
        }
    }

    /// Keeps state for the flow at `from`, if not kept yet; false (an
    /// error counted) when the worker holds [`MAX_PEERS_PER_WORKER`].
    pub(super) fn register(&mut self, from: SocketAddr) -> bool {
        if !self.peers.contains_key(&from) {
            if self.peers.len() >= MAX_PEERS_PER_WORKER {
                self.totals.errors += 1;
                return false;
            }
            self.peers.insert(from, 0);
            self.totals.connections_accepted += 1;
        }
        true
    }

    /// A datagram of a sender that has not proven the session: counted,
    /// never answered.
    pub(super) fn stranger(&mut self) -> Answer {
        self.totals.errors += 1;
        self.totals.strangers += 1;
        Answer::None
    }

    /// Puts `kind`'s header and `payload` in `reply`.
    pub(super) fn control(&mut self, kind: Kind, payload: &[u8]) -> Answer {
        let len = HEADER_BYTES + payload.len();
        self.reply[..HEADER_BYTES].copy_from_slice(&Header::control(kind).encode());
        self.reply[HEADER_BYTES..len].copy_from_slice(payload);
        Answer::Reply(len)
    }
}
