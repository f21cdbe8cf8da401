//! One fetch of one host's answer: connect, read the whole answer,
//! disconnect, timed in its parts (connection and transfer), over the
//! point's transport or a plain TCP socket for gmond.

use super::{Responder, MAX_GMOND_BYTES};
use netgap_proto::dataproof::DataToken;
use netgap_transport::preamble::PreambleError;
use netgap_transport::{FlowConfig, FlowError, Transport, TransportError};
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Instant;

/// How the client reaches one host.
#[derive(Clone)]
pub(super) struct Source {
    pub(super) addr: String,
    pub(super) bind_ip: Option<IpAddr>,
}

/// What the client needs to ask any host.
#[derive(Clone)]
pub(super) struct Asker {
    pub(super) responder: Responder,
    pub(super) transport: &'static dyn Transport,
    pub(super) cfg: FlowConfig,
    pub(super) token: DataToken,
    /// The built-in responder's answer, to check against.
    pub(super) expect: std::sync::Arc<Vec<u8>>,
}

/// One host's exchange.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Fetch {
    /// From the start to an open connection, ns: the stack's connect
    /// alone, as the papers timed it.
    pub(super) connect_ns: u64,
    /// netgap's own authentication of the data connection after it opened
    /// (the preamble, builtin responder only), ns: no part of the
    /// connection a program like Ganglia makes, so timed apart and left out
    /// of the exchange's time and of the connect share.
    pub(super) handshake_ns: u64,
    /// From the start to the host's close, ns.
    pub(super) total_ns: u64,
    /// Answer bytes.
    pub(super) bytes: u64,
}

/// Why one host's answer could not be fetched, one line naming the host.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// gmond's address does not parse.
    #[error("bad address {addr}")]
    BadAddress {
        /// The address given.
        addr: String,
    },
    /// Connecting to gmond failed.
    #[error("connecting to {addr}: {source}")]
    ConnectGmond {
        /// gmond's address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The connection's read timeout could not be set.
    #[error(transparent)]
    Timeout(std::io::Error),
    /// Reading gmond's answer failed.
    #[error("reading from {addr}: {source}")]
    ReadGmond {
        /// gmond's address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// gmond's answer is not XML.
    #[error("{addr} answered something other than XML")]
    NotXml {
        /// gmond's address.
        addr: SocketAddr,
    },
    /// Connecting to the built-in responder failed.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The responder's address.
        addr: String,
        /// Why.
        source: TransportError,
    },
    /// The data connection's preamble failed.
    #[error("{addr}: {source}")]
    Preamble {
        /// The responder's address.
        addr: String,
        /// Why.
        source: PreambleError,
    },
    /// The responder sent more than its answer.
    #[error("{addr} answered more than {want} bytes")]
    TooLong {
        /// The responder's address.
        addr: String,
        /// The answer's bytes.
        want: usize,
    },
    /// Reading the responder's answer failed.
    #[error("reading from {addr}: {source}")]
    Read {
        /// The responder's address.
        addr: String,
        /// Why.
        source: FlowError,
    },
    /// The responder's answer is not the one it was to send.
    #[error("{addr} answered {have} bytes that are not the {want} it was to send")]
    Wrong {
        /// The responder's address.
        addr: String,
        /// Bytes it sent.
        have: usize,
        /// The answer's bytes.
        want: usize,
    },
}

impl Asker {
    /// Connects to `src`, reads its whole answer into `buf` until it
    /// closes, and disconnects.
    pub(super) fn fetch(&self, src: &Source, buf: &mut Vec<u8>) -> Result<Fetch, FetchError> {
        buf.clear();
        let t0 = Instant::now();
        let connect_ns;
        let mut handshake_ns = 0;
        match self.responder {
            Responder::Gmond => {
                let sa: SocketAddr = src.addr.parse().map_err(|_| FetchError::BadAddress {
                    addr: src.addr.clone(),
                })?;
                let s = TcpStream::connect_timeout(&sa, self.cfg.io_timeout)
                    .map_err(|source| FetchError::ConnectGmond { addr: sa, source })?;
                connect_ns = elapsed_ns(t0);
                s.set_read_timeout(Some(self.cfg.io_timeout))
                    .map_err(FetchError::Timeout)?;
                s.take(MAX_GMOND_BYTES as u64)
                    .read_to_end(buf)
                    .map_err(|source| FetchError::ReadGmond { addr: sa, source })?;
                if !buf.starts_with(b"<?xml") {
                    return Err(FetchError::NotXml { addr: sa });
                }
            }
            Responder::Builtin => {
                let mut flow = match src.bind_ip {
                    Some(ip) if self.transport.capabilities().binds_local => {
                        self.transport.connect_from(&self.cfg, &src.addr, ip)
                    }
                    _ => self.transport.connect(&self.cfg, &src.addr),
                }
                .map_err(|source| FetchError::Connect {
                    addr: src.addr.clone(),
                    source,
                })?;
                connect_ns = elapsed_ns(t0);
                netgap_transport::preamble::connector(flow.as_mut(), &self.token).map_err(
                    |source| FetchError::Preamble {
                        addr: src.addr.clone(),
                        source,
                    },
                )?;
                handshake_ns = elapsed_ns(t0).saturating_sub(connect_ns);
                let (_, rx) = flow.split();
                let want = self.expect.len();
                buf.resize(want + 1, 0);
                let mut have = 0;
                loop {
                    if have > want {
                        return Err(FetchError::TooLong {
                            addr: src.addr.clone(),
                            want,
                        });
                    }
                    match rx.recv_some(&mut buf[have..]) {
                        Ok(n) => have += n,
                        Err(FlowError::Closed) => break,
                        Err(source) => {
                            return Err(FetchError::Read {
                                addr: src.addr.clone(),
                                source,
                            })
                        }
                    }
                }
                buf.truncate(have);
                if buf.as_slice() != self.expect.as_slice() {
                    return Err(FetchError::Wrong {
                        addr: src.addr.clone(),
                        have,
                        want,
                    });
                }
            }
        }
        Ok(Fetch {
            connect_ns,
            handshake_ns,
            total_ns: elapsed_ns(t0),
            bytes: buf.len() as u64,
        })
    }
}

fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
