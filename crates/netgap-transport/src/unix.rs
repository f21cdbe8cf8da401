//! Stream Unix-domain sockets: the same host only. The agent's data listener
//! is a socket file in the temporary directory, removed as soon as the flow
//! is accepted (or the listener dropped).

use super::stream_socket::StreamFlow;
use super::tcp::wait_readable;
use super::{Capabilities, Flow, FlowConfig, Listener, Transport, TransportError};
use netgap_core::spec::TransportOptions;
use socket2::SockRef;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

const NAME: &str = "unix";

/// Stream Unix-domain sockets.
pub struct Unix;

struct UnixDataListener {
    listener: UnixListener,
    /// Its socket file, in this process's own directory; removed when the
    /// listener goes.
    path: crate::sockdir::SocketPath,
    config: FlowConfig,
}

fn into_flow(stream: UnixStream, config: &FlowConfig) -> Result<Box<dyn Flow>, TransportError> {
    apply_buffers(&stream, &config.options)?;
    let flow = StreamFlow::new(stream, config.mode, config.io_timeout).map_err(|source| {
        TransportError::Option {
            transport: NAME,
            option: "O_NONBLOCK/SO_RCVTIMEO",
            source,
        }
    })?;
    Ok(Box::new(flow))
}

fn apply_buffers(stream: &UnixStream, options: &TransportOptions) -> Result<(), TransportError> {
    let sock = SockRef::from(stream);
    let err = |option| {
        move |source| TransportError::Option {
            transport: NAME,
            option,
            source,
        }
    };
    if let Some(b) = options.sndbuf_bytes {
        sock.set_send_buffer_size(b as usize)
            .map_err(err("SO_SNDBUF"))?;
    }
    if let Some(b) = options.rcvbuf_bytes {
        sock.set_recv_buffer_size(b as usize)
            .map_err(err("SO_RCVBUF"))?;
    }
    Ok(())
}

impl Listener for UnixDataListener {
    fn addr(&self) -> String {
        self.path.path().display().to_string()
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
        // One peer per listener: its name can go now, in this process's
        // own directory.
        let _ = std::fs::remove_file(self.path.path());
        into_flow(stream, &self.config)
    }
}

impl Transport for Unix {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "stream Unix-domain sockets (same host only)"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::local_stream(crate::options::SOCKET_BUFFERS)
    }

    fn listen(
        &self,
        config: &FlowConfig,
        _local_ip: std::net::IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let listen_err = |source| TransportError::Listen {
            transport: NAME,
            source,
        };
        let path = crate::sockdir::SocketPath::new("unix").map_err(listen_err)?;
        let listener = UnixListener::bind(path.path()).map_err(listen_err)?;
        Ok(Box::new(UnixDataListener {
            listener,
            path,
            config: config.clone(),
        }))
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        let stream = UnixStream::connect(addr).map_err(|source| TransportError::Connect {
            transport: NAME,
            addr: format!("{addr} (unix sockets need the agent on this host)"),
            source,
        })?;
        into_flow(stream, config)
    }
}
