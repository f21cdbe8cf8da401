//! One fetch of one host's answer: connect, read the whole answer,
//! disconnect, timed in its parts (connection and transfer), over the
//! point's transport or a plain TCP socket for gmond.

use super::Responder;
use super::MAX_GMOND_BYTES;
use netgap_proto::dataproof::DataToken;
use netgap_transport::{FlowConfig, FlowError, Transport};
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

impl Asker {
    /// Connects to `src`, reads its whole answer into `buf` until it
    /// closes, and disconnects.
    pub(super) fn fetch(&self, src: &Source, buf: &mut Vec<u8>) -> Result<Fetch, String> {
        buf.clear();
        let t0 = Instant::now();
        let connect_ns;
        let mut handshake_ns = 0;
        match self.responder {
            Responder::Gmond => {
                let sa: SocketAddr = src
                    .addr
                    .parse()
                    .map_err(|_| format!("bad address {}", src.addr))?;
                let s = TcpStream::connect_timeout(&sa, self.cfg.io_timeout)
                    .map_err(|e| format!("connecting to {sa}: {e}"))?;
                connect_ns = elapsed_ns(t0);
                s.set_read_timeout(Some(self.cfg.io_timeout))
                    .map_err(|e| e.to_string())?;
                s.take(MAX_GMOND_BYTES as u64)
                    .read_to_end(buf)
                    .map_err(|e| format!("reading from {sa}: {e}"))?;
                if !buf.starts_with(b"<?xml") {
                    return Err(format!("{sa} answered something other than XML"));
                }
            }
            Responder::Builtin => {
                let mut flow = match src.bind_ip {
                    Some(ip) if self.transport.capabilities().binds_local => {
                        self.transport.connect_from(&self.cfg, &src.addr, ip)
                    }
                    _ => self.transport.connect(&self.cfg, &src.addr),
                }
                .map_err(|e| format!("connecting to {}: {e}", src.addr))?;
                connect_ns = elapsed_ns(t0);
                netgap_transport::preamble::connector(flow.as_mut(), &self.token)
                    .map_err(|e| format!("{}: {e}", src.addr))?;
                handshake_ns = elapsed_ns(t0).saturating_sub(connect_ns);
                let (_, rx) = flow.split();
                let want = self.expect.len();
                buf.resize(want + 1, 0);
                let mut have = 0;
                loop {
                    if have > want {
                        return Err(format!("{} answered more than {want} bytes", src.addr));
                    }
                    match rx.recv_some(&mut buf[have..]) {
                        Ok(n) => have += n,
                        Err(FlowError::Closed) => break,
                        Err(e) => return Err(format!("reading from {}: {e}", src.addr)),
                    }
                }
                buf.truncate(have);
                if buf.as_slice() != self.expect.as_slice() {
                    return Err(format!(
                        "{} answered {have} bytes that are not the {want} it was to send",
                        src.addr
                    ));
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

pub(super) fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
