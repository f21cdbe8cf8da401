//! The socket edge of the control protocol: frames in and out of a TCP or
//! Unix-domain stream, with a deadline on every read. Everything above it
//! (messages, codec, session machines) is plain code in [`netgap_proto`].
//!
//! A control address is `HOST:PORT` for TCP or `unix:PATH` for a Unix-domain
//! socket (the testbed's agents listen on those, so a coordinator outside the
//! testbed's network namespaces reaches them through the file system).

use netgap_proto::codec::{encode, CodecError, FrameDecoder};
use serde::Serialize;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

pub use netgap_core::hosts::ControlAddr;

/// Connecting to a [`ControlAddr`]: the socket side of the address, which
/// is plain data in core.
pub trait Connect {
    /// Connects, waiting at most `timeout` for a TCP handshake.
    fn connect(&self, timeout: Duration) -> io::Result<ControlStream>;
}

impl Connect for ControlAddr {
    fn connect(&self, timeout: Duration) -> io::Result<ControlStream> {
        match self {
            ControlAddr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, timeout)?;
                s.set_nodelay(true)?;
                Ok(ControlStream::Tcp(s))
            }
            ControlAddr::Unix(p) => UnixStream::connect(p).map(ControlStream::Unix),
        }
    }
}

/// A connected control stream of either family.
#[derive(Debug)]
pub enum ControlStream {
    /// Over TCP.
    Tcp(TcpStream),
    /// Over a Unix-domain socket.
    Unix(UnixStream),
}

impl ControlStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            ControlStream::Tcp(s) => s.set_read_timeout(t),
            ControlStream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            ControlStream::Tcp(s) => s.set_write_timeout(t),
            ControlStream::Unix(s) => s.set_write_timeout(t),
        }
    }

    /// The local IP address of a TCP stream; `None` over a Unix socket.
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            ControlStream::Tcp(s) => s.local_addr().ok().map(|a| a.ip()),
            ControlStream::Unix(_) => None,
        }
    }

    /// The peer's IP address of a TCP stream; `None` over a Unix socket.
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            ControlStream::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
            ControlStream::Unix(_) => None,
        }
    }

    /// A second handle on the same connection.
    pub fn try_clone(&self) -> io::Result<ControlStream> {
        match self {
            ControlStream::Tcp(s) => s.try_clone().map(ControlStream::Tcp),
            ControlStream::Unix(s) => s.try_clone().map(ControlStream::Unix),
        }
    }

    /// Shuts the connection down both ways: a read blocked on another
    /// handle returns at once.
    pub fn shutdown(&self) -> io::Result<()> {
        match self {
            ControlStream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            ControlStream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        }
    }
}

impl AsFd for ControlStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            ControlStream::Tcp(s) => s.as_fd(),
            ControlStream::Unix(s) => s.as_fd(),
        }
    }
}

impl Read for ControlStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ControlStream::Tcp(s) => s.read(buf),
            ControlStream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for ControlStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ControlStream::Tcp(s) => s.write(buf),
            ControlStream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl From<TcpStream> for ControlStream {
    fn from(s: TcpStream) -> Self {
        ControlStream::Tcp(s)
    }
}

impl From<UnixStream> for ControlStream {
    fn from(s: UnixStream) -> Self {
        ControlStream::Unix(s)
    }
}

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
    stream: ControlStream,
    decoder: FrameDecoder,
}

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 4096;

impl ControlConn {
    /// Wraps a connected stream (TCP streams get `TCP_NODELAY`).
    pub fn new(stream: impl Into<ControlStream>) -> io::Result<ControlConn> {
        let stream = stream.into();
        if let ControlStream::Tcp(s) = &stream {
            s.set_nodelay(true)?;
        }
        Ok(ControlConn {
            stream,
            decoder: FrameDecoder::new(),
        })
    }

    /// The underlying stream.
    pub fn stream(&self) -> &ControlStream {
        &self.stream
    }

    /// A second handle on the underlying stream, for a writer on another
    /// thread while this one reads.
    pub fn try_clone_stream(&self) -> io::Result<ControlStream> {
        self.stream.try_clone()
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

    /// Sends one frame carrying `payload` as is (the authentication
    /// handshake's fixed binary frames).
    pub fn send_payload(&mut self, payload: &[u8]) -> Result<(), ControlError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&n| n > 0 && n as usize <= netgap_proto::codec::MAX_FRAME_BYTES)
            .ok_or_else(|| {
                ControlError::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "frame payload out of range",
                ))
            })?;
        let mut frame = len.to_be_bytes().to_vec();
        frame.extend_from_slice(payload);
        self.stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .and_then(|()| self.stream.write_all(&frame))
            .map_err(|e| match e.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => ControlError::Closed,
                _ => ControlError::Io(e),
            })
    }

    /// The agent's receive: one frame's payload, waiting at most
    /// `timeout`; a frame that breaks the framing (too large, empty, an
    /// overrun) is answered with one error line before the session ends,
    /// so the peer learns why it was closed.
    pub(crate) fn recv_or_tell(&mut self, timeout: Duration) -> Result<Vec<u8>, ControlError> {
        self.recv_payload(timeout).inspect_err(|e| {
            if let ControlError::Codec(c) = e {
                let _ = self.send(&netgap_proto::message::Reply::Error {
                    message: format!("bad control frame: {c}; closing the connection"),
                });
            }
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

/// What a failed control exchange means to the user: a closed connection is
/// most often an agent that died.
pub fn control_detail(e: &ControlError) -> String {
    match e {
        ControlError::Closed => "the agent closed the control connection (did it die?)".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_addresses_parse_and_print_back() {
        for s in ["127.0.0.1:7100", "[::1]:7100", "unix:/run/netgap/h1.sock"] {
            assert_eq!(
                ControlAddr::parse(s).map(|a| a.to_string()).as_deref(),
                Some(s)
            );
        }
        assert_eq!(ControlAddr::parse("unix:"), None);
        assert_eq!(ControlAddr::parse("localhost"), None);
    }

    #[test]
    fn frames_cross_a_unix_socket() {
        let (a, b) = UnixStream::pair().expect("pair");
        let (mut a, mut b) = (
            ControlConn::new(a).expect("a"),
            ControlConn::new(b).expect("b"),
        );
        a.send(&"hello").expect("send");
        let payload = b.recv_payload(Duration::from_secs(2)).expect("recv");
        assert_eq!(
            serde_json::from_slice::<String>(&payload).ok().as_deref(),
            Some("hello")
        );
        drop(a);
        assert!(matches!(
            b.recv_payload(Duration::from_secs(2)),
            Err(ControlError::Closed)
        ));
    }
}
