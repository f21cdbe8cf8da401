//! Multipath TCP (RFC 8684) from the kernel: a stream socket of protocol
//! `IPPROTO_MPTCP`, which the application drives exactly like TCP while the
//! kernel's path manager opens a subflow over each path it is told of. On a
//! mesh testbed with several links per host pair, the testbed gives each
//! namespace an MPTCP endpoint per link and limits that allow a subflow per
//! link, so one connection uses every link.
//!
//! The listener, the connection and every socket option go through the tcp
//! transport's helpers with the protocol swapped; the options are the ones
//! the kernel honours on an MPTCP socket (it applies them to every subflow).
//! MSG_ZEROCOPY and TCP_QUICKACK are not among them.

use super::options::{OptionDecl, RCVBUF, SNDBUF};
use super::tcp::{
    accept_stream, connect_stream, connect_stream_from, into_flow, listen_socket, BUSY_POLL,
    CONGESTION, CORK, NO_NODELAY,
};
use super::{Capabilities, Flow, FlowConfig, Listener, Transport, TransportError, Unavailable};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Duration;

const NAME: &str = "mptcp";

/// `IPPROTO_MPTCP` (linux/in.h); the libc crate does not name it on every
/// target.
const IPPROTO_MPTCP: libc::c_int = 262;

/// Where the kernel says whether MPTCP sockets may be made in this network
/// namespace.
const ENABLED_SYSCTL: &str = "/proc/sys/net/mptcp/enabled";

/// Kernel multipath TCP.
pub struct Mptcp;

/// The options mptcp honours, in the order help shows them.
static OPTIONS: &[&OptionDecl] = &[
    &NO_NODELAY,
    &SNDBUF,
    &RCVBUF,
    &BUSY_POLL,
    &CORK,
    &CONGESTION,
];

fn protocol() -> Protocol {
    Protocol::from(IPPROTO_MPTCP)
}

/// Listens on every address of the host, but names the address the control
/// connection arrived on: the peer's extra subflows join the connection at
/// the host's other addresses, which the path manager announces, so the
/// listener must be found there too.
struct MptcpListener {
    listener: TcpListener,
    local_ip: IpAddr,
    config: FlowConfig,
}

impl Listener for MptcpListener {
    fn addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| SocketAddr::new(self.local_ip, a.port()).to_string())
            .unwrap_or_default()
    }

    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError> {
        let stream = accept_stream(NAME, &self.listener, &self.config.options, timeout)?;
        into_flow(NAME, stream, &self.config)
    }
}

/// Whether this kernel makes MPTCP sockets here, or why not.
fn probe() -> Result<(), Unavailable> {
    match std::fs::read_to_string(ENABLED_SYSCTL) {
        Ok(v) if v.trim() == "1" => {}
        Ok(v) => {
            return Err(Unavailable(format!(
                "MPTCP is turned off in this network namespace (net.mptcp.enabled = {}); \
                 sysctl -w net.mptcp.enabled=1 turns it on",
                v.trim()
            )))
        }
        Err(_) => {
            return Err(Unavailable(
                "this kernel has no multipath TCP (no net.mptcp.enabled; CONFIG_MPTCP is off)"
                    .into(),
            ))
        }
    }
    Socket::new(Domain::IPV4, Type::STREAM, Some(protocol()))
        .map(drop)
        .map_err(|e| Unavailable(format!("the kernel refuses an MPTCP socket: {e}")))
}

impl Transport for Mptcp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "kernel multipath TCP: one connection, a subflow per path the path manager knows"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            binds_local: true,
            framing: Some(crate::Framing::Mptcp),
            ..Capabilities::cross_host_stream(OPTIONS)
        }
    }

    fn availability(&self) -> Result<(), Unavailable> {
        probe()
    }

    fn listen(
        &self,
        config: &FlowConfig,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let any = match local_ip {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        Ok(Box::new(MptcpListener {
            listener: listen_socket(NAME, protocol(), &config.options, any)?,
            local_ip,
            config: config.clone(),
        }))
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        into_flow(
            NAME,
            connect_stream(NAME, protocol(), &config.options, addr)?,
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
            connect_stream_from(NAME, protocol(), &config.options, addr, local_ip)?,
            config,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netgap_core::spec::{Mode, TransportOptions};

    #[test]
    fn a_flow_over_loopback_carries_bytes_both_ways() {
        if let Err(why) = Mptcp.availability() {
            eprintln!("skipping: {why}");
            return;
        }
        let config = FlowConfig {
            mode: Mode::Event,
            options: TransportOptions::default(),
            io_timeout: Duration::from_secs(5),
        };
        let mut listener = Mptcp
            .listen(&config, IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("listen");
        let addr = listener.addr();
        let cfg = config.clone();
        let client = std::thread::spawn(move || {
            let mut flow = Mptcp.connect(&cfg, &addr).expect("connect");
            flow.send_all(b"multipath").expect("send");
            let mut back = [0u8; 4];
            flow.recv_exact(&mut back).expect("recv");
            back
        });
        let mut flow = listener.accept(Duration::from_secs(5)).expect("accept");
        let mut got = [0u8; 9];
        flow.recv_exact(&mut got).expect("recv");
        assert_eq!(&got, b"multipath");
        flow.send_all(b"done").expect("send");
        assert_eq!(&client.join().expect("client"), b"done");
    }
}
