//! Kernel TCP over IPv4 or IPv6, with TCP_NODELAY on unless asked otherwise,
//! optional SO_SNDBUF/SO_RCVBUF, and the fast-path options: MSG_ZEROCOPY
//! sends, SO_BUSY_POLL, TCP_QUICKACK, TCP_CORK and a congestion control
//! algorithm. The data listener binds the address the control connection
//! arrived on, on an ephemeral port.
//!
//! `listen_socket`, `accept_stream` and `connect_stream` set a TCP
//! socket up with every option; other transports that carry TCP (uring) use
//! them and drive the socket their own way.

use super::options::{bad_value, number, OptionDecl, OptionKind, OptionValue, RCVBUF, SNDBUF};
use super::sockopt::{apply_before_connect, apply_connected, opt_err};
use super::stream_socket::StreamFlow;
use super::zerocopy::ZeroCopyFlow;
use super::{Capabilities, Flow, FlowConfig, Listener, Transport, TransportError};
use netgap_core::spec::{
    check_name, TransportOptions, MAX_BUSY_POLL_US, MAX_CONGESTION_NAME_BYTES,
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

const NAME: &str = "tcp";

/// How long a coordinator waits for the TCP handshake of a data flow.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Kernel TCP.
pub struct Tcp;

/// `--no-nodelay`: TCP_NODELAY off, Nagle's algorithm on; applied to each
/// connected stream by `apply_connected`.
pub(crate) static NO_NODELAY: OptionDecl = OptionDecl {
    flag: "no-nodelay",
    kind: OptionKind::Switch,
    value_name: "",
    help: "Turn TCP_NODELAY off (Nagle's algorithm on).",
    record: |o, _| {
        o.nodelay = false;
        Ok(())
    },
};

/// `--zerocopy`: MSG_ZEROCOPY sends with their completions reaped (the
/// zero-copy flow), SO_ZEROCOPY set by `apply_connected`.
pub(crate) static ZEROCOPY: OptionDecl = OptionDecl {
    flag: "zerocopy",
    kind: OptionKind::Switch,
    value_name: "",
    help: "MSG_ZEROCOPY sends with their completions reaped.",
    record: |o, _| {
        o.zerocopy = true;
        Ok(())
    },
};

/// `--busy-poll USECS`: SO_BUSY_POLL, set by `apply_connected`.
pub(crate) static BUSY_POLL: OptionDecl = OptionDecl {
    flag: "busy-poll",
    kind: OptionKind::Count,
    value_name: "USECS",
    help: "SO_BUSY_POLL: busy-wait this many microseconds in the kernel on receive.",
    record: |o, v| {
        let us = number("busy-poll", v)?;
        o.busy_poll_us = Some(
            u32::try_from(us)
                .ok()
                .filter(|&us| us <= MAX_BUSY_POLL_US)
                .ok_or_else(|| bad_value("busy-poll", v, "at most 1000000 microseconds (1 s)"))?,
        );
        Ok(())
    },
};

/// `--quickack`: TCP_QUICKACK, set by `apply_connected` and re-armed after
/// every receive.
pub(crate) static QUICKACK: OptionDecl = OptionDecl {
    flag: "quickack",
    kind: OptionKind::Switch,
    value_name: "",
    help: "TCP_QUICKACK: acknowledge at once instead of delaying ACKs.",
    record: |o, _| {
        o.quickack = true;
        Ok(())
    },
};

/// `--cork`: TCP_CORK set before and cleared after each message.
pub(crate) static CORK: OptionDecl = OptionDecl {
    flag: "cork",
    kind: OptionKind::Switch,
    value_name: "",
    help: "TCP_CORK around each message: send full segments only.",
    record: |o, _| {
        o.cork = true;
        Ok(())
    },
};

/// `--congestion NAME`: TCP_CONGESTION, set by `apply_before_connect`.
pub(crate) static CONGESTION: OptionDecl = OptionDecl {
    flag: "congestion",
    kind: OptionKind::Name,
    value_name: "NAME",
    help: "TCP congestion control algorithm, e.g. cubic or bbr.",
    record: |o, v| {
        let OptionValue::Name(name) = v else {
            return Err(bad_value("congestion", v, "expected a name"));
        };
        if check_name("congestion", name).is_err() || name.len() > MAX_CONGESTION_NAME_BYTES {
            return Err(bad_value(
                "congestion",
                v,
                "expected an algorithm name of at most 16 characters a-z, 0-9, '-', '_'",
            ));
        }
        o.congestion = Some(name.clone());
        Ok(())
    },
};

/// The options tcp honours, in the order help shows them.
pub(crate) static OPTIONS: &[&OptionDecl] = &[
    &NO_NODELAY,
    &SNDBUF,
    &RCVBUF,
    &ZEROCOPY,
    &BUSY_POLL,
    &QUICKACK,
    &CORK,
    &CONGESTION,
];

/// Opens a listening TCP socket on `local_ip`, ephemeral port, with the
/// options that must precede the connection.
pub(super) fn listen_socket(
    transport: &'static str,
    protocol: Protocol,
    options: &TransportOptions,
    local_ip: IpAddr,
) -> Result<TcpListener, TransportError> {
    let listen_err = |source| TransportError::Listen { transport, source };
    let addr = SocketAddr::new(local_ip, 0);
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(protocol)).map_err(listen_err)?;
    apply_before_connect(transport, &socket, options)?;
    socket.bind(&addr.into()).map_err(listen_err)?;
    socket.listen(8).map_err(listen_err)?;
    Ok(socket.into())
}

/// Accepts one connection within `timeout`, with every option applied; the
/// stream is left blocking.
pub(super) fn accept_stream(
    transport: &'static str,
    listener: &TcpListener,
    options: &TransportOptions,
    timeout: Duration,
) -> Result<TcpStream, TransportError> {
    wait_readable(listener, timeout).map_err(|e| match e {
        None => TransportError::AcceptTimeout {
            transport,
            timeout_ms: timeout.as_millis(),
        },
        Some(source) => TransportError::Listen { transport, source },
    })?;
    let (stream, _) = listener
        .accept()
        .map_err(|source| TransportError::Listen { transport, source })?;
    stream
        .set_nonblocking(false)
        .map_err(opt_err(transport, "O_NONBLOCK"))?;
    apply_connected(transport, &stream, options)?;
    Ok(stream)
}

/// Connects to `addr` (`IP:PORT`) with every option applied; the stream is
/// left blocking.
pub(super) fn connect_stream(
    transport: &'static str,
    protocol: Protocol,
    options: &TransportOptions,
    addr: &str,
) -> Result<TcpStream, TransportError> {
    let sa: SocketAddr = addr.parse().map_err(|e| TransportError::BadAddress {
        transport,
        addr: addr.to_string(),
        detail: format!("{e}"),
    })?;
    let connect_err = |source| TransportError::Connect {
        transport,
        addr: addr.to_string(),
        source,
    };
    let socket =
        Socket::new(Domain::for_address(sa), Type::STREAM, Some(protocol)).map_err(connect_err)?;
    apply_before_connect(transport, &socket, options)?;
    socket
        .connect_timeout(&SockAddr::from(sa), CONNECT_TIMEOUT)
        .map_err(connect_err)?;
    let stream: TcpStream = socket.into();
    apply_connected(transport, &stream, options)?;
    Ok(stream)
}

/// TCP_QUICKACK is cleared by the kernel as it sees fit, so a flow that
/// wants it re-arms it after every receive; TCP_CORK is set before a
/// message's bytes and cleared after them. This wraps a flow to do both.
pub(super) fn into_flow(
    transport: &'static str,
    stream: TcpStream,
    config: &FlowConfig,
) -> Result<Box<dyn Flow>, TransportError> {
    let o = &config.options;
    if o.zerocopy {
        let flow = ZeroCopyFlow::new(stream, config).map_err(opt_err(transport, "MSG_ZEROCOPY"))?;
        return Ok(Box::new(flow));
    }
    let flow = StreamFlow::new(stream, config.mode, config.io_timeout)
        .map_err(opt_err(transport, "O_NONBLOCK/SO_RCVTIMEO"))?;
    if o.quickack || o.cork {
        return Ok(Box::new(flow.with_tcp_hooks(o.quickack, o.cork)));
    }
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
        let stream = accept_stream(NAME, &self.listener, &self.config.options, timeout)?;
        into_flow(NAME, stream, &self.config)
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
            binds_local: true,
            programs: crate::Programs::Kernel,
            framing: Some(crate::Framing::Tcp),
            ..Capabilities::cross_host_stream(OPTIONS)
        }
    }

    fn listen(
        &self,
        config: &FlowConfig,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        Ok(Box::new(TcpDataListener {
            listener: listen_socket(NAME, Protocol::TCP, &config.options, local_ip)?,
            config: config.clone(),
        }))
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        into_flow(
            NAME,
            connect_stream(NAME, Protocol::TCP, &config.options, addr)?,
            config,
        )
    }

    fn connect_from(
        &self,
        config: &FlowConfig,
        addr: &str,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Flow>, TransportError> {
        into_flow(
            NAME,
            connect_stream_from(NAME, Protocol::TCP, &config.options, addr, local_ip)?,
            config,
        )
    }

    fn engine_path(&self) -> Option<&'static dyn crate::flows::DataPath> {
        Some(&crate::flows::SYSCALLS)
    }
}

/// Connects to `addr` (`IP:PORT`) from `local_ip` with every option
/// applied; the stream is left blocking.
pub(super) fn connect_stream_from(
    transport: &'static str,
    protocol: Protocol,
    options: &TransportOptions,
    addr: &str,
    local_ip: IpAddr,
) -> Result<TcpStream, TransportError> {
    let sa: SocketAddr = addr.parse().map_err(|e| TransportError::BadAddress {
        transport,
        addr: addr.to_string(),
        detail: format!("{e}"),
    })?;
    let connect_err = |source| TransportError::Connect {
        transport,
        addr: addr.to_string(),
        source,
    };
    let socket =
        Socket::new(Domain::for_address(sa), Type::STREAM, Some(protocol)).map_err(connect_err)?;
    apply_before_connect(transport, &socket, options)?;
    socket
        .bind(&SockAddr::from(SocketAddr::new(local_ip, 0)))
        .map_err(connect_err)?;
    socket
        .connect_timeout(&SockAddr::from(sa), CONNECT_TIMEOUT)
        .map_err(connect_err)?;
    let stream: TcpStream = socket.into();
    apply_connected(transport, &stream, options)?;
    Ok(stream)
}
