//! Kernel TCP over IPv4 or IPv6, with TCP_NODELAY on unless asked otherwise
//! and optional SO_SNDBUF/SO_RCVBUF. The data listener binds the address the
//! control connection arrived on, on an ephemeral port.

use super::stream_socket::StreamFlow;
use super::{Capabilities, Flow, FlowConfig, Listener, Transport, TransportError};
use crate::spec::{Mode, TransportOptions};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

const NAME: &str = "tcp";

/// How long a coordinator waits for the TCP handshake of a data flow.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Kernel TCP.
pub struct Tcp;

fn opt_err(option: &'static str) -> impl FnOnce(std::io::Error) -> TransportError {
    move |source| TransportError::Option {
        transport: NAME,
        option,
        source,
    }
}

/// Applies the buffer sizes; done before connect or listen so the window
/// scale is negotiated for them.
fn apply_buffers(socket: &Socket, options: &TransportOptions) -> Result<(), TransportError> {
    if let Some(b) = options.sndbuf_bytes {
        socket
            .set_send_buffer_size(b as usize)
            .map_err(opt_err("SO_SNDBUF"))?;
    }
    if let Some(b) = options.rcvbuf_bytes {
        socket
            .set_recv_buffer_size(b as usize)
            .map_err(opt_err("SO_RCVBUF"))?;
    }
    Ok(())
}

fn into_flow(stream: TcpStream, config: &FlowConfig) -> Result<Box<dyn Flow>, TransportError> {
    stream
        .set_nodelay(config.options.nodelay)
        .map_err(opt_err("TCP_NODELAY"))?;
    let flow = StreamFlow::new(stream, config.mode, config.io_timeout)
        .map_err(opt_err("O_NONBLOCK/SO_RCVTIMEO"))?;
    Ok(Box::new(flow))
}

struct TcpDataListener {
    listener: TcpListener,
    config: FlowConfig,
}

impl Listener for TcpDataListener {
    fn addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError> {
        wait_readable(&self.listener, timeout).map_err(|e| match e {
            None => TransportError::AcceptTimeout {
                transport: NAME,
                timeout_ms: timeout.as_millis(),
            },
            Some(source) => TransportError::Listen {
                transport: NAME,
                source,
            },
        })?;
        let (stream, _) = self
            .listener
            .accept()
            .map_err(|source| TransportError::Listen {
                transport: NAME,
                source,
            })?;
        stream
            .set_nonblocking(false)
            .map_err(opt_err("O_NONBLOCK"))?;
        into_flow(stream, &self.config)
    }
}

/// Waits until `fd` is readable: `Err(None)` on timeout.
pub(super) fn wait_readable(
    fd: &impl AsFd,
    timeout: Duration,
) -> Result<(), Option<std::io::Error>> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(None);
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(Some(e.into())),
        }
    }
}

impl Transport for Tcp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "kernel TCP over IPv4 or IPv6 (TCP_NODELAY unless --no-nodelay)"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: true,
            message_boundaries: false,
            cross_host: true,
            modes: &Mode::ALL,
        }
    }

    fn listen(
        &self,
        config: &FlowConfig,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let listen_err = |source| TransportError::Listen {
            transport: NAME,
            source,
        };
        let addr = SocketAddr::new(local_ip, 0);
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(listen_err)?;
        apply_buffers(&socket, &config.options)?;
        socket.bind(&addr.into()).map_err(listen_err)?;
        socket.listen(8).map_err(listen_err)?;
        Ok(Box::new(TcpDataListener {
            listener: socket.into(),
            config: config.clone(),
        }))
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        let sa: SocketAddr = addr.parse().map_err(|e| TransportError::BadAddress {
            transport: NAME,
            addr: addr.to_string(),
            detail: format!("{e}"),
        })?;
        let connect_err = |source| TransportError::Connect {
            transport: NAME,
            addr: addr.to_string(),
            source,
        };
        let socket = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))
            .map_err(connect_err)?;
        apply_buffers(&socket, &config.options)?;
        socket
            .connect_timeout(&SockAddr::from(sa), CONNECT_TIMEOUT)
            .map_err(connect_err)?;
        into_flow(socket.into(), config)
    }
}
