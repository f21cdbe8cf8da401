//! The session proof of [`netgap_proto::dataproof`] as non-blocking state
//! machines, so the engine's thousands of connections prove they belong to
//! the point's session without a thread or a blocking wait each. A
//! connector sends its nonce and nothing more unless the far end answers
//! with the token's tag; a listener serves no byte of its role before the
//! connector proved the token too. The proof's bytes are not payload: they
//! are counted nowhere and move by plain system calls whatever the data
//! path, before the flow's first exchange.

use super::machine::Progress;
use netgap_proto::dataproof::{
    ConnectorProof, DataProofError, DataToken, ListenerProof, ANSWER_BYTES, CONFIRM_BYTES,
    HELLO_BYTES, NONCE_BYTES,
};
use std::io::{self, ErrorKind, Read, Write};

/// Why a proof failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProofError {
    /// The far end answered, but not as a netgap end of this session.
    #[error("{0}; no payload was sent")]
    Refused(DataProofError),
    /// The far end closed before the proof was done.
    #[error("the far end closed before proving it belongs to this session; no payload was sent")]
    Closed,
    /// A read or write failed (or no random bytes for the nonce).
    #[error("the far end did not prove it belongs to this session ({0}); no payload was sent")]
    Io(io::Error),
}

/// A fresh nonce from the kernel's random source.
fn nonce() -> io::Result<[u8; NONCE_BYTES]> {
    let mut n = [0u8; NONCE_BYTES];
    crate::random::fill_random(&mut n)?;
    Ok(n)
}

/// Writes `buf[*off..]` as far as the socket takes it; `false` if it
/// would block before the end.
fn write_rest(io: &mut impl Write, buf: &[u8], off: &mut usize) -> Result<bool, ProofError> {
    while *off < buf.len() {
        match io.write(&buf[*off..]) {
            Ok(0) => return Err(ProofError::Closed),
            Ok(n) => *off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(ProofError::Io(e)),
        }
    }
    Ok(true)
}

/// Reads into `buf[*off..]`, never past its end (the bytes after a proof
/// message belong to the flow); `false` if it would block before the end.
fn read_rest(io: &mut impl Read, buf: &mut [u8], off: &mut usize) -> Result<bool, ProofError> {
    while *off < buf.len() {
        match io.read(&mut buf[*off..]) {
            Ok(0) => return Err(ProofError::Closed),
            Ok(n) => *off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(ProofError::Io(e)),
        }
    }
    Ok(true)
}

/// Where a connector is in the proof.
#[derive(Debug)]
enum ConnectorStage {
    /// Sending the hello, `off` bytes of it sent.
    Hello { off: usize },
    /// Reading the listener's answer, `off` bytes of it read.
    Answer { buf: [u8; ANSWER_BYTES], off: usize },
    /// Sending the confirmation, `off` bytes of it sent.
    Confirm {
        buf: [u8; CONFIRM_BYTES],
        off: usize,
    },
    /// Proven both ways.
    Done,
}

/// The connecting end of one connection's proof.
#[derive(Debug)]
pub(crate) struct ConnectorHandshake {
    proof: ConnectorProof,
    stage: ConnectorStage,
}

impl ConnectorHandshake {
    /// A proof of `token` with a fresh nonce.
    pub(super) fn new(token: &DataToken) -> io::Result<ConnectorHandshake> {
        Ok(ConnectorHandshake {
            proof: ConnectorProof::new(token.clone(), nonce()?),
            stage: ConnectorStage::Hello { off: 0 },
        })
    }

    /// Moves the proof on as far as the socket allows: `Done` once the far
    /// end proved the token and the confirmation is sent.
    pub(super) fn pump(&mut self, io: &mut (impl Read + Write)) -> Result<Progress, ProofError> {
        loop {
            match &mut self.stage {
                ConnectorStage::Hello { off } => {
                    if !write_rest(io, &self.proof.hello(), off)? {
                        return Ok(Progress::WantWrite);
                    }
                    self.stage = ConnectorStage::Answer {
                        buf: [0; ANSWER_BYTES],
                        off: 0,
                    };
                    // The answer cannot be in yet.
                    return Ok(Progress::WantRead);
                }
                ConnectorStage::Answer { buf, off } => {
                    if !read_rest(io, buf, off)? {
                        return Ok(Progress::WantRead);
                    }
                    let confirm = self.proof.on_answer(buf).map_err(ProofError::Refused)?;
                    self.stage = ConnectorStage::Confirm {
                        buf: confirm,
                        off: 0,
                    };
                }
                ConnectorStage::Confirm { buf, off } => {
                    if !write_rest(io, buf, off)? {
                        return Ok(Progress::WantWrite);
                    }
                    self.stage = ConnectorStage::Done;
                }
                ConnectorStage::Done => return Ok(Progress::Done),
            }
        }
    }
}

/// Where a listener is in the proof.
#[derive(Debug)]
enum ListenerStage {
    /// Reading the connector's hello.
    Hello { buf: [u8; HELLO_BYTES], off: usize },
    /// Sending the answer.
    Answer { buf: [u8; ANSWER_BYTES], off: usize },
    /// Reading the connector's confirmation.
    Confirm {
        buf: [u8; CONFIRM_BYTES],
        off: usize,
    },
    /// Proven both ways.
    Done,
}

/// The listening end of one connection's proof.
#[derive(Debug)]
pub(crate) struct ListenerHandshake {
    proof: ListenerProof,
    stage: ListenerStage,
}

impl ListenerHandshake {
    /// A proof of `token` with a fresh nonce.
    pub(super) fn new(token: &DataToken) -> io::Result<ListenerHandshake> {
        Ok(ListenerHandshake {
            proof: ListenerProof::new(token.clone(), nonce()?),
            stage: ListenerStage::Hello {
                buf: [0; HELLO_BYTES],
                off: 0,
            },
        })
    }

    /// Moves the proof on as far as the socket allows: `Done` once the
    /// connector proved the token; any other answer is an error.
    pub(super) fn pump(&mut self, io: &mut (impl Read + Write)) -> Result<Progress, ProofError> {
        loop {
            match &mut self.stage {
                ListenerStage::Hello { buf, off } => {
                    if !read_rest(io, buf, off)? {
                        return Ok(Progress::WantRead);
                    }
                    let answer = self.proof.on_hello(buf).map_err(ProofError::Refused)?;
                    self.stage = ListenerStage::Answer {
                        buf: answer,
                        off: 0,
                    };
                }
                ListenerStage::Answer { buf, off } => {
                    if !write_rest(io, buf, off)? {
                        return Ok(Progress::WantWrite);
                    }
                    self.stage = ListenerStage::Confirm {
                        buf: [0; CONFIRM_BYTES],
                        off: 0,
                    };
                }
                ListenerStage::Confirm { buf, off } => {
                    if !read_rest(io, buf, off)? {
                        return Ok(Progress::WantRead);
                    }
                    self.proof.on_confirm(buf).map_err(ProofError::Refused)?;
                    self.stage = ListenerStage::Done;
                }
                ListenerStage::Done => return Ok(Progress::Done),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// One direction of an in-memory connection that takes `room` bytes per
    /// write at most, to exercise partial writes.
    #[derive(Default)]
    struct Pipe {
        inbox: VecDeque<u8>,
        outbox: Vec<u8>,
        room: usize,
    }

    impl Read for Pipe {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.inbox.is_empty() {
                return Err(ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.inbox.len());
            for b in buf.iter_mut().take(n) {
                *b = self.inbox.pop_front().unwrap();
            }
            Ok(n)
        }
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.room);
            if n == 0 {
                return Err(ErrorKind::WouldBlock.into());
            }
            self.outbox.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn token(b: u8) -> DataToken {
        DataToken::from_bytes([b; 32])
    }

    /// How one end of an [`exchange`] did not finish.
    #[derive(Debug, thiserror::Error)]
    enum Unfinished {
        /// Its proof failed.
        #[error(transparent)]
        Failed(#[from] ProofError),
        /// It still waited when the exchange gave up.
        #[error("{0} stuck")]
        Stuck(&'static str),
    }

    /// Runs both ends against each other, `room` bytes per write; the
    /// results of the connector and the listener.
    fn exchange(
        c_token: &DataToken,
        l_token: &DataToken,
        room: usize,
    ) -> (Result<(), Unfinished>, Result<(), Unfinished>) {
        let mut c = ConnectorHandshake::new(c_token).unwrap();
        let mut l = ListenerHandshake::new(l_token).unwrap();
        let mut cp = Pipe {
            room,
            ..Pipe::default()
        };
        let mut lp = Pipe {
            room,
            ..Pipe::default()
        };
        let (mut c_done, mut l_done) = (None, None);
        for _ in 0..1000 {
            if c_done.is_none() {
                match c.pump(&mut cp) {
                    Ok(Progress::Done) => c_done = Some(Ok(())),
                    Ok(_) => {}
                    Err(e) => c_done = Some(Err(e.into())),
                }
            }
            lp.inbox.extend(cp.outbox.drain(..));
            if l_done.is_none() {
                match l.pump(&mut lp) {
                    Ok(Progress::Done) => l_done = Some(Ok(())),
                    Ok(_) => {}
                    Err(e) => l_done = Some(Err(e.into())),
                }
            }
            cp.inbox.extend(lp.outbox.drain(..));
            if c_done.is_some() && l_done.is_some() {
                break;
            }
        }
        (
            c_done.unwrap_or(Err(Unfinished::Stuck("connector"))),
            l_done.unwrap_or(Err(Unfinished::Stuck("listener"))),
        )
    }

    #[test]
    fn ends_of_one_session_prove_it_whole_or_a_byte_at_a_time() {
        for room in [1, 7, 1 << 16] {
            let (c, l) = exchange(&token(1), &token(1), room);
            assert!(c.is_ok(), "room {room}: {c:?}");
            assert!(l.is_ok(), "room {room}: {l:?}");
        }
    }

    #[test]
    fn ends_of_different_sessions_fail_before_any_payload() {
        let (c, l) = exchange(&token(1), &token(2), 1 << 16);
        let c = c.unwrap_err().to_string();
        assert!(
            c.contains("does not belong") && c.contains("no payload"),
            "{c}"
        );
        // The listener never got a confirmation, so it never finished.
        assert!(l.is_err());
    }

    #[test]
    fn a_stranger_answering_garbage_is_not_netgap() {
        let mut c = ConnectorHandshake::new(&token(1)).unwrap();
        let mut p = Pipe {
            room: 1 << 16,
            ..Pipe::default()
        };
        assert_eq!(c.pump(&mut p).unwrap(), Progress::WantRead);
        assert_eq!(p.outbox.len(), HELLO_BYTES);
        p.inbox
            .extend(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        p.inbox.resize(ANSWER_BYTES, b'.');
        let e = c.pump(&mut p).unwrap_err().to_string();
        assert!(e.contains("did not answer as a netgap end"), "{e}");
        // Nothing but the hello left.
        assert_eq!(p.outbox.len(), HELLO_BYTES);
    }

    #[test]
    fn a_listener_reads_no_byte_past_the_confirmation() {
        let t = token(3);
        let mut c = ConnectorHandshake::new(&t).unwrap();
        let mut l = ListenerHandshake::new(&t).unwrap();
        let (mut cp, mut lp) = (
            Pipe {
                room: 1 << 16,
                ..Pipe::default()
            },
            Pipe {
                room: 1 << 16,
                ..Pipe::default()
            },
        );
        c.pump(&mut cp).unwrap();
        lp.inbox.extend(cp.outbox.drain(..));
        l.pump(&mut lp).unwrap();
        cp.inbox.extend(lp.outbox.drain(..));
        assert_eq!(c.pump(&mut cp).unwrap(), Progress::Done);
        lp.inbox.extend(cp.outbox.drain(..));
        // Payload right behind the confirmation stays for the flow.
        lp.inbox.extend(b"payload");
        assert_eq!(l.pump(&mut lp).unwrap(), Progress::Done);
        assert_eq!(lp.inbox.len(), 7);
    }

    #[test]
    fn a_connector_closed_on_is_an_error_not_a_hang() {
        struct Eof;
        impl Read for Eof {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Ok(0)
            }
        }
        impl Write for Eof {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut c = ConnectorHandshake::new(&token(1)).unwrap();
        assert_eq!(c.pump(&mut Eof).unwrap(), Progress::WantRead);
        assert!(matches!(c.pump(&mut Eof), Err(ProofError::Closed)));
        let mut l = ListenerHandshake::new(&token(1)).unwrap();
        assert!(matches!(l.pump(&mut Eof), Err(ProofError::Closed)));
    }
}
