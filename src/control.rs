//! The socket edge of the control protocol: frames in and out of a TCP
//! stream, with a deadline on every read. Everything above it (messages,
//! codec, session machines) is plain code in [`crate::proto`].

use crate::proto::codec::{encode, CodecError, FrameDecoder};
use serde::Serialize;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Why a control exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The peer closed the control connection.
    #[error("the peer closed the control connection")]
    Closed,
    /// Nothing arrived before the deadline.
    #[error("no control message within {0:?}")]
    TimedOut(Duration),
    /// The peer sent a frame that does not decode.
    #[error("bad control frame: {0}")]
    Codec(#[from] CodecError),
    /// Any other socket error.
    #[error("control connection: {0}")]
    Io(#[from] io::Error),
}

/// One control connection, either end.
pub struct ControlConn {
    stream: TcpStream,
    decoder: FrameDecoder,
}

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 4096;

impl ControlConn {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> io::Result<ControlConn> {
        stream.set_nodelay(true)?;
        Ok(ControlConn {
            stream,
            decoder: FrameDecoder::new(),
        })
    }

    /// The underlying stream.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Encodes and sends one message.
    pub fn send<M: Serialize>(&mut self, msg: &M) -> Result<(), ControlError> {
        let frame = encode(msg)?;
        self.stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .and_then(|()| self.stream.write_all(&frame))
            .map_err(|e| match e.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => ControlError::Closed,
                _ => ControlError::Io(e),
            })
    }

    /// Receives one frame's payload, waiting at most `timeout`.
    pub fn recv_payload(&mut self, timeout: Duration) -> Result<Vec<u8>, ControlError> {
        let deadline = Instant::now() + timeout;
        let mut chunk = [0u8; READ_CHUNK_BYTES];
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Ok(frame);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ControlError::TimedOut(timeout));
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ControlError::Closed),
                Ok(n) => self.decoder.push(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ControlError::TimedOut(timeout))
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    return Err(ControlError::Closed)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
