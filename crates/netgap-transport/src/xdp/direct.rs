//! A direct connection: one connection of an unmodified program to a
//! program on another host, carried by netgap's own reliable xdp
//! transport on an AF_XDP socket of the program's own (issue 44). The
//! host's relay (root) makes the socket and its UMEM on a queue of its own
//! ([`super::handover::make`]), registers the connection (the peer's MAC,
//! this end's flow id) for that queue in its steering program, so only
//! this connection's frames reach the socket, and hands the port to the
//! program ([`super::handover::send`]). The preload library inside the
//! program opens a [`DirectConn`] on it with the ids and the key the relays
//! fixed ([`DirectSetup`]) and drives it from the program's own calls.
//!
//! The session is the flow engine's (`flow/`: the same windows,
//! retransmission, credit, authentication and reassembly as every xdp
//! flow), opened with fixed ids (`flow/fixed.rs`) on a port that carries
//! this one connection. Nothing here blocks on the peer: every call pumps
//! the port once and returns; a full window is [`DirectError::WouldBlock`],
//! and so is an empty receive buffer. A caller that must wait sleeps in
//! poll or epoll on [`DirectConn::wait_fd`] (readable when frames arrived)
//! for at most [`DirectConn::next_timer`], then calls again; another
//! thread's call may have reaped the frames already, so
//! [`DirectConn::readiness`] is asked before sleeping. A peer that stops
//! answering while this end waits on it (its opening unanswered, or what
//! it sent unacknowledged) is given up after [`PEER_SILENCE_LIMIT`], while
//! the library keeps calling: every call then fails with
//! [`DirectError::Timeout`]. Frames that are not this connection's (another
//! MAC or flow id, or failing authentication under the connection's key)
//! are dropped and counted ([`DirectStats::refused_frames`]), never
//! delivered.
//!
//! A close ends the connection as the kernel ends a TCP connection: in
//! order (the closing frame after every byte sent, acknowledged within
//! [`CLOSE_LINGER`]) when nothing is left unread, else with a reset
//! ([`DirectConn::reset`]): a close with bytes unread, bytes arriving
//! after the close, and a close that cannot finish within its linger (the
//! opening never answered, what it sent unacknowledged) all reset it, so
//! the peer learns at once ([`DirectError::Reset`], `ECONNRESET`) instead
//! of waiting out [`PEER_SILENCE_LIMIT`]. A close before the opening was
//! answered lingers for the opening, then ends in order.
//!
//! Frames are sealed from the opening on: both programs hold the
//! connection's key before the first frame, and the direction keys are
//! derived from it under a label of their own
//! ([`super::auth::FrameKeys::derive_direct`]), bound to both ends' MACs
//! and flow ids.
//!
//! After `fork`: the UMEM and the rings are shared mappings, in both
//! processes alike, but the engine's state (windows, sequence numbers,
//! what is in flight) is the opener's alone, copied in the child. Only one
//! process may use a connection; the library decides which. The value
//! holds no thread and nothing bound to the opener but its pid: dropped in
//! another process (a child that never used it), it only unmaps its
//! mappings and closes its descriptors (all close-on-exec), sending
//! nothing, and the opener's connection goes on.

use super::auth::{End, FrameKeys, Side};
use super::flow::{FixedOpening, FixedState, Peer, Port, PortIo};
use super::handover::HandedPort;
use super::reliable::{Mac, ETH_HEADER_BYTES, FRAME_OVERHEAD_BYTES};
use super::sys::{Shape, Xsk};
use crate::FlowError;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the peer may be silent while this end waits on it (the
/// answer to its opening, an acknowledgment of what it sent) before the
/// connection is given up. The peer's library acknowledges only from the
/// program's own calls, so a peer busy computing for a while must not be
/// taken for a dead one: this is generous, far above the retransmission
/// timeout's ceiling ([`super::reliable::MAX_RTO_NS`]).
pub const PEER_SILENCE_LIMIT: Duration = Duration::from_secs(10);
/// How long dropping a connection keeps pumping for its closing frame and
/// what it sent before to be acknowledged, at most (the flow engine's own
/// linger).
pub const CLOSE_LINGER: Duration = Duration::from_millis(300);
/// How long a close before the opening was answered waits for it, at
/// most (a caller that runs the linger itself): the peer's library opens
/// its end when its relay's grant comes, which a busy host may delay past
/// [`CLOSE_LINGER`]; answered, the opening lets the close end in order,
/// or with a reset the peer is sure to take.
pub const OPENING_LINGER: Duration = Duration::from_secs(2);
/// Bytes this end's receiver holds unread at most.
const WINDOW_BYTES: usize = 1 << 20;

/// What the relays fixed for one direct connection.
#[derive(Clone)]
pub struct DirectSetup {
    /// The queue the handed socket is bound to (as its geometry says).
    pub queue: u32,
    /// This end's flow id (not 0): the steering takes frames to it.
    pub local_flow: u16,
    /// The other end's flow id (not 0).
    pub peer_flow: u16,
    /// The other end's interface MAC.
    pub peer_mac: [u8; 6],
    /// The connection's key, which both programs have from the hello.
    pub key: [u8; netgap_proto::preload::RELAY_KEY_BYTES],
    /// This end sends the opening; the other takes only an opening from
    /// exactly (`peer_mac`, `peer_flow`) to `local_flow`.
    pub connector: bool,
}

impl std::fmt::Debug for DirectSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectSetup")
            .field("queue", &self.queue)
            .field("local_flow", &self.local_flow)
            .field("peer_flow", &self.peer_flow)
            .field("peer_mac", &self.peer_mac)
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

/// Why a direct connection failed or cannot go on now; each maps to the
/// errno a TCP socket's call would give.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    /// Nothing can be taken or given now (`EAGAIN`): the window or the
    /// peer's credit is full, nothing has arrived, or the opening is not
    /// answered yet.
    #[error("the direct connection cannot move bytes now")]
    WouldBlock,
    /// This end shut its sending down (`EPIPE`).
    #[error("the direct connection's sending was shut down")]
    Closed,
    /// The connection was reset, by the peer or by this end's close
    /// (`ECONNRESET`).
    #[error("the direct connection was reset")]
    Reset,
    /// The peer stopped answering while this end waited on it
    /// (`ETIMEDOUT`).
    #[error("the peer of the direct connection was silent for {timeout_ms} ms")]
    Timeout {
        /// The silence limit that passed, in milliseconds.
        timeout_ms: u128,
    },
    /// A flow id of the setup is 0, which no session may have.
    #[error("a direct connection's flow ids must not be 0 (local {local}, peer {peer})")]
    ZeroFlow {
        /// This end's flow id as given.
        local: u16,
        /// The peer's flow id as given.
        peer: u16,
    },
    /// The setup names another queue than the handed socket's.
    #[error("the setup names queue {setup} but the handed socket is bound to queue {socket}")]
    QueueMismatch {
        /// The setup's queue.
        setup: u32,
        /// The socket's queue, from its geometry.
        socket: u32,
    },
    /// The handed port's interface is not in this thread's namespace, or
    /// its MAC or MTU cannot be read.
    #[error("interface {ifindex} of the handed port: {source}")]
    Interface {
        /// The interface's index, from the port's geometry.
        ifindex: u32,
        /// Why it cannot be used.
        source: io::Error,
    },
    /// The interface's frames do not fit the handed port's UMEM frames.
    #[error("interface MTU {mtu_bytes} does not fit the handed port's {frame_bytes}-byte frames")]
    FrameTooSmall {
        /// The interface's MTU.
        mtu_bytes: usize,
        /// Bytes of a UMEM frame.
        frame_bytes: u32,
    },
    /// A system call on the port failed (mapping it, ringing its
    /// doorbell).
    #[error("the direct connection's port: {0}")]
    Io(#[from] io::Error),
}

impl From<FlowError> for DirectError {
    fn from(e: FlowError) -> DirectError {
        match e {
            FlowError::TimedOut { timeout_ms } => DirectError::Timeout { timeout_ms },
            FlowError::Closed => DirectError::Reset,
            FlowError::Io(e) => DirectError::Io(e),
            other => DirectError::Io(io::Error::other(other.to_string())),
        }
    }
}

/// A direct connection's readiness, as poll(2) says it of a TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Readiness {
    /// A read would not block: bytes arrived, the peer ended its stream,
    /// or the connection failed (`POLLIN`).
    pub readable: bool,
    /// A write would not block: open with room in the window, or it would
    /// fail at once (shut down, failed) (`POLLOUT`).
    pub writable: bool,
    /// The peer ended its stream and every byte before the end was read
    /// (`POLLRDHUP`).
    pub read_closed: bool,
    /// Both directions ended, or the connection failed (`POLLHUP`).
    pub hang_up: bool,
    /// The connection failed (`POLLERR`).
    pub error: bool,
}

/// A direct connection's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirectStats {
    /// Frames that reached the socket and were not this connection's
    /// (another source MAC or flow id, or failing authentication): dropped.
    /// The steering program drops most strangers before the socket; its
    /// count is the relay's ([`super::Steering::drops`]), whose map the
    /// program does not hold.
    pub refused_frames: u64,
    /// Frames the kernel dropped on their way to the socket (no fill
    /// buffer, the receive ring full).
    pub kernel_drops: u64,
    /// Data and closing frames sent, retransmissions included.
    pub frames_sent: u64,
    /// Data and closing frames received, duplicates included.
    pub frames_received: u64,
    /// Frames sent again (after a timeout, or to fill a hole the peer
    /// showed).
    pub retransmissions: u64,
    /// Retransmission timeouts that expired: losses no later arrival
    /// revealed, each recovered only after a wait of at least the
    /// retransmission timeout.
    pub timeouts: u64,
    /// Bytes the program handed to the connection.
    pub bytes_sent: u64,
    /// Bytes the program read from it.
    pub bytes_received: u64,
}

/// One direct connection on a handed port. `Send + Sync`: a program's
/// threads may read and write it at once (each call takes the port's lock
/// for one pump).
pub struct DirectConn {
    port: Arc<Port>,
    id: u16,
    /// The process that opened it: only it sends the closing frame.
    opener_pid: u32,
    write_shut: AtomicBool,
    /// The close's linger was run by the caller ([`DirectConn::end_linger`]):
    /// dropping the connection waits for nothing.
    linger_ended: AtomicBool,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
}

impl DirectConn {
    /// The shape the relay gives a direct port: one connection's, smaller
    /// than a transport port's (2 MiB of UMEM, not 16). Half the frames
    /// receive: after the pump's reserve, 96 frames of credit (some 140
    /// KB at a 1500-byte MTU, a 64 KiB response and more in flight, and
    /// some 280 µs of the veth path's 4 Gbit/s); half transmit: up to
    /// 128 data frames in flight. A 1-byte ping-pong needs two frames.
    /// 512 frames, not 1,024: the kernel pins every page of a UMEM at each
    /// connection's setup, and 1,024 frames made a direct connection's
    /// setup a quarter slower with no more bytes per second in nginx's
    /// 64 KiB responses (BENCHMARKS.md). Frames of 4096
    /// bytes hold any MTU up to 4082 bytes; each ring holds every receive
    /// buffer at once (the fill ring takes them all at the start).
    pub const SHAPE: Shape = Shape {
        frames: 512,
        frame_bytes: 4096,
        ring_entries: 512,
    };

    /// The shape of a direct port on an interface whose MTU is
    /// `mtu_bytes`: [`DirectConn::SHAPE`], with frames of 2048 bytes where
    /// a frame of that MTU fits in one (1500, the common case), for half
    /// the UMEM at the same frames and window. The kernel faults in and
    /// pins every page of a UMEM at its registration, one by one, and
    /// frees them at its close: each connection's setup pays that at both
    /// ends, in proportion to the UMEM's size. A frame received is at
    /// most the interface's MTU and its Ethernet header (a veth drops a
    /// longer one, and the port's opening checks the same bound).
    pub fn shape_for_mtu(mtu_bytes: u32) -> Shape {
        const SMALL_FRAME_BYTES: u32 = 2048;
        if frame_holds(SMALL_FRAME_BYTES, mtu_bytes as usize) {
            Shape {
                frame_bytes: SMALL_FRAME_BYTES,
                ..Self::SHAPE
            }
        } else {
            Self::SHAPE
        }
    }

    /// [`DirectConn::shape_for_mtu`] of the interface `ifname` in this
    /// thread's network namespace; None if its MTU cannot be read.
    pub fn shape_for_interface(ifname: &str) -> Option<Shape> {
        crate::host::read_mtu_ioctl(ifname).map(Self::shape_for_mtu)
    }

    /// Maps the handed port (`Xsk::from_handed`) and opens the one
    /// session; the connector's opening is sent here and completed by later
    /// calls (and sent again every 50 ms until answered). Never blocks.
    /// The calling thread must be in the network namespace of the port's
    /// interface (its MAC and MTU are read here).
    pub fn open(port: HandedPort, setup: DirectSetup) -> Result<DirectConn, DirectError> {
        if setup.local_flow == 0 || setup.peer_flow == 0 {
            return Err(DirectError::ZeroFlow {
                local: setup.local_flow,
                peer: setup.peer_flow,
            });
        }
        let g = port.geometry;
        if g.queue != setup.queue {
            return Err(DirectError::QueueMismatch {
                setup: setup.queue,
                socket: g.queue,
            });
        }
        let (local_mac, mtu_bytes) =
            interface(g.ifindex).map_err(|source| DirectError::Interface {
                ifindex: g.ifindex,
                source,
            })?;
        if !frame_holds(g.frame_bytes, mtu_bytes) {
            return Err(DirectError::FrameTooSmall {
                mtu_bytes,
                frame_bytes: g.frame_bytes,
            });
        }
        let xsk = Xsk::from_handed(port)?;
        let io = PortIo::new(xsk, g.frames, local_mac)?;
        let mss = mtu_bytes + ETH_HEADER_BYTES - FRAME_OVERHEAD_BYTES;
        let port = Port::alone(io, mss, WINDOW_BYTES, random_u32);
        let keys = keys(&setup, local_mac);
        let id = port.open_fixed(FixedOpening {
            local_flow: setup.local_flow,
            peer: Peer {
                mac: setup.peer_mac,
                flow: setup.peer_flow,
            },
            connector: setup.connector,
            keys,
            silence_limit: PEER_SILENCE_LIMIT,
        })?;
        Ok(DirectConn {
            port,
            id,
            opener_pid: std::process::id(),
            write_shut: AtomicBool::new(false),
            linger_ended: AtomicBool::new(false),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
        })
    }

    /// Sends from `buf` after one pump: the bytes taken (0 < n <=
    /// `buf.len()`; 0 only for an empty `buf`), or
    /// [`DirectError::WouldBlock`] when the window or the peer's credit is
    /// full or the opening is not answered yet; [`DirectError::Closed`]
    /// after [`DirectConn::shutdown_write`], [`DirectError::Timeout`] once
    /// the peer was given up.
    pub fn try_send(&self, buf: &[u8]) -> Result<usize, DirectError> {
        if self.write_shut.load(Ordering::Relaxed) {
            return Err(DirectError::Closed);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        match self.port.fixed_send(self.id, buf)? {
            0 => Err(DirectError::WouldBlock),
            n => {
                self.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
        }
    }

    /// Reads into `buf` after one pump: the bytes read, `Ok(0)` at the
    /// peer's orderly end of stream (or for an empty `buf`),
    /// [`DirectError::WouldBlock`] when nothing has arrived,
    /// [`DirectError::Timeout`] once the peer was given up.
    pub fn try_recv(&self, buf: &mut [u8]) -> Result<usize, DirectError> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.port.fixed_recv(self.id, buf)? {
            Some(n) => {
                self.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
            None => Err(DirectError::WouldBlock),
        }
    }

    /// Readiness as poll(2) would say it for a TCP socket, after one pump.
    pub fn readiness(&self) -> Readiness {
        let Ok(s) = self.port.fixed_state(self.id, true) else {
            return Readiness {
                readable: true,
                writable: true,
                read_closed: true,
                hang_up: true,
                error: true,
            };
        };
        readiness_of(&s, self.write_shut.load(Ordering::Relaxed))
    }

    /// One pump: reaps arrivals, acknowledges, resends what timed out,
    /// sends the opening or the closing frame when due. The library calls
    /// it from any call, and after every wait.
    pub fn pump(&self) -> Result<(), DirectError> {
        let s = self.port.fixed_state(self.id, true)?;
        if s.silent {
            return Err(DirectError::Timeout {
                timeout_ms: PEER_SILENCE_LIMIT.as_millis(),
            });
        }
        if s.reset_by_peer || s.reset_sent {
            return Err(DirectError::Reset);
        }
        Ok(())
    }

    /// The descriptor a waiter sleeps on (poll, epoll): readable when
    /// frames arrived for the port (the AF_XDP socket, close-on-exec),
    /// until a pump reaps them.
    pub fn wait_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the socket belongs to the port, which `self` holds; it
        // stays open as long as the borrow of `self`.
        unsafe { BorrowedFd::borrow_raw(self.port.socket_fd()) }
    }

    /// How long a waiter may sleep before [`DirectConn::pump`] must run
    /// even without frames (a retransmission, a delayed acknowledgment, a
    /// probe, the opening again, the silence limit; zero while frames wait
    /// to be sent); `None` when no timer is armed. Reads the clock, not
    /// the rings.
    pub fn next_timer(&self) -> Option<Duration> {
        self.port
            .fixed_state(self.id, false)
            .ok()
            .and_then(|s| s.next_timer)
    }

    /// shutdown(SHUT_WR): the closing frame goes after what was sent (now
    /// if credit allows, else from a later pump); the peer reads its end
    /// of stream, and this end still receives.
    pub fn shutdown_write(&self) -> Result<(), DirectError> {
        self.write_shut.store(true, Ordering::Relaxed);
        self.port.fixed_shutdown(self.id)?;
        Ok(())
    }

    /// Orderly close: as dropping the connection (see its `Drop`).
    pub fn close(self) {
        drop(self);
    }

    /// Starts a close and returns at once: with bytes unread, a reset (as
    /// the kernel's close with unread data); else the closing frame after
    /// what was sent (now if credit allows, else from a later pump, after
    /// the opening if it is still unanswered). A caller that runs the
    /// linger itself (a progress thread) pumps with
    /// [`DirectConn::close_settled`] until it is over, gives it up with
    /// [`DirectConn::give_up_close`] when its time passed, then calls
    /// [`DirectConn::end_linger`] before dropping the connection.
    pub fn start_close(&self) -> Result<(), DirectError> {
        let s = self.port.fixed_state(self.id, true)?;
        if s.reset_by_peer || s.reset_sent || s.silent {
            // Over already: nothing to end.
            self.write_shut.store(true, Ordering::Relaxed);
            return Ok(());
        }
        if s.ready_bytes > 0 {
            self.reset();
            return Ok(());
        }
        if self.write_shut.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        self.port.fixed_shutdown(self.id)?;
        Ok(())
    }

    /// Ends the connection at once with a reset, as the kernel's close
    /// does with bytes unread (or `SO_LINGER` of 0): what was not
    /// delivered is dropped, and the peer's calls fail with
    /// `ECONNRESET` as soon as the reset arrives. Nothing if the
    /// connection was reset or given up already.
    pub fn reset(&self) {
        self.write_shut.store(true, Ordering::Relaxed);
        let _ = self.port.fixed_reset(self.id);
    }

    /// One pump of a started close: whether its linger is over (the
    /// closing frame and everything before it acknowledged, the peer given
    /// up, the connection reset, or the session gone). Bytes that arrived
    /// since the close are never read: they reset the connection, as the
    /// kernel resets a closed socket that receives data. Never blocks.
    pub fn close_settled(&self) -> bool {
        match self.port.fixed_state(self.id, true) {
            Ok(s) if s.reset_sent || s.reset_by_peer || s.silent => true,
            Ok(s) if s.ready_bytes > 0 => {
                self.reset();
                true
            }
            Ok(s) => s.all_acknowledged,
            Err(_) => true,
        }
    }

    /// The linger's time passed: a close that did not settle (the opening
    /// never answered, or what it sent unacknowledged) resets the
    /// connection, so the peer is told rather than left to wait out its
    /// silence limit.
    pub fn give_up_close(&self) {
        if !self.close_settled() {
            self.reset();
        }
    }

    /// Whether the opening was answered (the handshake is done). Reads no
    /// ring.
    pub fn is_open(&self) -> bool {
        self.port.fixed_state(self.id, false).is_ok_and(|s| s.open)
    }

    /// The close's linger is over (run by the caller, or given up):
    /// dropping the connection sends and waits for nothing more.
    pub fn end_linger(&self) {
        self.linger_ended.store(true, Ordering::Relaxed);
    }

    /// Whether dropping the connection sends and waits for nothing: its
    /// linger ended ([`DirectConn::end_linger`]), or this process is not
    /// the one that opened it.
    pub fn drop_sends_nothing(&self) -> bool {
        std::process::id() != self.opener_pid || self.linger_ended.load(Ordering::Relaxed)
    }

    /// The connection's counts now.
    pub fn stats(&self) -> DirectStats {
        let c = self.port.fixed_counts(self.id).ok();
        let stats = c.map(|c| c.stats).unwrap_or_default();
        DirectStats {
            refused_frames: c.map_or(0, |c| c.refused_frames),
            kernel_drops: c.map_or(0, |c| c.kernel_drops),
            frames_sent: stats.datagrams_sent,
            frames_received: stats.datagrams_received,
            retransmissions: stats.retries,
            timeouts: c.map_or(0, |c| c.timeouts),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
        }
    }

    /// The linger of a close in the opening process: the closing frame,
    /// then pumps until it and everything before it are acknowledged, the
    /// peer is given up, or [`CLOSE_LINGER`] passed. Sleeps in poll on the
    /// socket between pumps, never spins.
    fn linger(&self) {
        if self.start_close().is_err() {
            return;
        }
        let t0 = Instant::now();
        while let Ok(s) = self.port.fixed_state(self.id, true) {
            let left = CLOSE_LINGER.saturating_sub(t0.elapsed());
            if self.close_settled() {
                return;
            }
            if left.is_zero() {
                self.give_up_close();
                return;
            }
            let sleep = s
                .next_timer
                .unwrap_or(left)
                .min(left)
                .min(Duration::from_millis(1));
            wait_readable(self.port.socket_fd(), sleep);
        }
    }
}

impl Drop for DirectConn {
    /// In the opening process: the closing frame, and what was sent
    /// delivered, for at most [`CLOSE_LINGER`] (only while something is
    /// unacknowledged and the peer answers; a caller with a thread of its
    /// own runs this linger there instead, with
    /// [`DirectConn::start_close`], so that its close returns at once as
    /// a TCP close does).
    /// In any other process (a forked child), or after
    /// [`DirectConn::end_linger`]: nothing sent, the mappings and
    /// descriptors of this process let go.
    fn drop(&mut self) {
        if !self.drop_sends_nothing() {
            self.linger();
        }
    }
}

/// Readiness from a session's state and whether this end shut its
/// sending down.
fn readiness_of(s: &FixedState, write_shut: bool) -> Readiness {
    if s.silent || s.reset_by_peer || s.reset_sent {
        return Readiness {
            readable: true,
            writable: true,
            read_closed: true,
            hang_up: true,
            error: true,
        };
    }
    Readiness {
        readable: s.ready_bytes > 0 || s.peer_finished,
        writable: s.open && (s.room || write_shut),
        read_closed: s.peer_finished,
        hang_up: s.peer_finished && write_shut,
        error: false,
    }
}

/// The frame keys of this end of the connection `setup` describes, on an
/// interface of MAC `local_mac`: the connector is the client.
fn keys(setup: &DirectSetup, local_mac: Mac) -> FrameKeys {
    let local = End {
        mac: local_mac,
        flow: setup.local_flow,
        isn: 0,
    };
    let peer = End {
        mac: setup.peer_mac,
        flow: setup.peer_flow,
        isn: 0,
    };
    let (side, client, server) = if setup.connector {
        (Side::Client, local, peer)
    } else {
        (Side::Server, peer, local)
    };
    FrameKeys::derive_direct(&setup.key, side, &client, &server)
}

/// The MAC and MTU of interface `ifindex` in this thread's namespace,
/// each from one ioctl (at every direct connection's setup: a walk of
/// every interface's addresses, as `getifaddrs` makes, took a netlink
/// dump of them all).
fn interface(ifindex: u32) -> io::Result<(Mac, usize)> {
    let name = nix::net::if_::if_indextoname(ifindex)
        .map_err(io::Error::from)?
        .into_string()
        .map_err(|_| io::Error::other("the interface's name is not UTF-8"))?;
    let mac = crate::host::read_mac_ioctl(&name)
        .ok_or_else(|| io::Error::other(format!("cannot read the MAC address of {name}")))?;
    let mtu = crate::host::read_mtu_ioctl(&name)
        .ok_or_else(|| io::Error::other(format!("cannot read the MTU of {name}")))?;
    Ok((mac, mtu as usize))
}

/// Whether a UMEM frame of `frame_bytes` holds a frame of an interface
/// whose MTU is `mtu_bytes`, with its Ethernet header.
fn frame_holds(frame_bytes: u32, mtu_bytes: usize) -> bool {
    mtu_bytes + ETH_HEADER_BYTES <= frame_bytes as usize
}

/// Four bytes from the kernel's random source (initial sequence numbers).
fn random_u32() -> io::Result<u32> {
    let mut b = [0u8; 4];
    crate::random::fill_random(&mut b)?;
    Ok(u32::from_ne_bytes(b))
}

/// Sleeps until `fd` is readable or `max` passes.
fn wait_readable(fd: std::os::fd::RawFd, max: Duration) {
    let ms = libc::c_int::try_from(max.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let _ = unsafe { libc::poll(&mut pfd, 1, ms) };
}

// The tests make each host's steering, the maker's part, through libbpf.
#[cfg(feature = "xdp")]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
#[cfg(test)]
mod tests {
    use super::super::handover;
    use super::super::reliable::{self, Header, Kind};
    use super::super::steer::ConnId;
    use super::super::sys::{in_ns, index_of, sh, switch_of_two, Namespaces};
    use super::super::sys::{ring_doorbell, Steering};
    use super::*;
    use std::os::fd::AsRawFd;

    const A_MAC: Mac = [0x02, 0, 0, 0, 0, 0xa1];
    const B_MAC: Mac = [0x02, 0, 0, 0, 0, 0xb1];
    const STRANGER: Mac = [0x02, 0, 0, 0, 0, 0xee];
    /// The connections' queue on both hosts.
    const Q: u32 = 2;
    const A_FLOW: u16 = 0x1a1a;
    const B_FLOW: u16 = 0x2b2b;
    const KEY: [u8; 32] = [0x5c; 32];
    /// Longest any helper waits before it fails the test.
    const PATIENCE: Duration = Duration::from_secs(30);

    #[test]
    fn a_port_for_a_common_mtu_has_half_the_umem_and_the_same_frames() {
        for mtu in [1280, 1500, 2034] {
            let s = DirectConn::shape_for_mtu(mtu);
            assert_eq!(s.frame_bytes, 2048, "MTU {mtu}");
            assert_eq!(
                (s.frames, s.ring_entries),
                (DirectConn::SHAPE.frames, DirectConn::SHAPE.ring_entries),
                "MTU {mtu}"
            );
        }
        // One byte more, and a frame of the MTU no longer fits in 2048.
        for mtu in [2035, 4082, 9000] {
            assert_eq!(
                DirectConn::shape_for_mtu(mtu).frame_bytes,
                4096,
                "MTU {mtu}"
            );
        }
    }

    /// A user's setup on one host: host `a` connects to `b`.
    fn setup_of(on_a: bool) -> DirectSetup {
        let (local_flow, peer_flow, peer_mac) = if on_a {
            (A_FLOW, B_FLOW, B_MAC)
        } else {
            (B_FLOW, A_FLOW, A_MAC)
        };
        DirectSetup {
            queue: Q,
            local_flow,
            peer_flow,
            peer_mac,
            key: KEY,
            connector: on_a,
        }
    }

    /// The test's switch and its hosts' steerings (the relays' part),
    /// gone with the value.
    struct Bed {
        steerings: Vec<Steering>,
        hosts: [String; 2],
        _made: Namespaces,
    }

    /// Hosts `a` and `b` behind a switch, MACs `A_MAC` and `B_MAC`, each
    /// with the steering on its link; skips (None) without root.
    fn bed(tag: &str) -> Option<Bed> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: namespaces and AF_XDP sockets need root");
            return None;
        }
        let tag = format!("ngd{}{tag}", std::process::id());
        let (made, [a, _, b]) = switch_of_two(&tag, false);
        sh(&[
            "-n",
            &a,
            "link",
            "set",
            "a0",
            "address",
            "02:00:00:00:00:a1",
        ]);
        sh(&[
            "-n",
            &b,
            "link",
            "set",
            "b0",
            "address",
            "02:00:00:00:00:b1",
        ]);
        let mut steerings = Vec::new();
        for (ns, dev) in [(&a, "a0"), (&b, "b0")] {
            steerings.push(in_ns(ns, move || Steering::attach(dev, 4).unwrap()));
        }
        Some(Bed {
            steerings,
            hosts: [a, b],
            _made: made,
        })
    }

    impl Bed {
        /// A port on queue `Q` of host `a` (`on_a`) or `b`, made and
        /// registered for the connection from `peer_mac` to `local_flow`
        /// as the relay does, handed over a Unix socket, and taken by
        /// `user` in that host's namespace.
        fn hand<T: Send + 'static>(
            &self,
            on_a: bool,
            user: impl FnOnce(HandedPort) -> T + Send + 'static,
        ) -> T {
            let i = usize::from(!on_a);
            let dev = if on_a { "a0" } else { "b0" };
            let setup = setup_of(on_a);
            let conn = ConnId {
                peer_mac: setup.peer_mac,
                local_flow: setup.local_flow,
            };
            let socket = {
                let (maker, user_end) = std::os::unix::net::UnixStream::pair().unwrap();
                let made = in_ns(&self.hosts[i], move || {
                    handover::make(index_of(dev), Q, DirectConn::SHAPE).unwrap()
                });
                self.steerings[i]
                    .put_socket(Q, made.socket.as_raw_fd())
                    .unwrap();
                self.steerings[i].register(Q, conn).unwrap();
                handover::send(&maker, made).unwrap();
                user_end
            };
            in_ns(&self.hosts[i], move || {
                user(handover::receive(&socket).unwrap())
            })
        }

        /// The connector on `a` and the acceptor on `b`, opened.
        fn pair(&self) -> (DirectConn, DirectConn) {
            let b = self.hand(false, |p| DirectConn::open(p, setup_of(false)).unwrap());
            let a = self.hand(true, |p| DirectConn::open(p, setup_of(true)).unwrap());
            (a, b)
        }
    }

    /// Sleeps on `c`'s descriptor until frames arrive or its next timer
    /// (at most 5 ms), as the library's waits do.
    fn wait(c: &DirectConn) {
        let max = c
            .next_timer()
            .unwrap_or(Duration::from_millis(5))
            .min(Duration::from_millis(5));
        if !max.is_zero() {
            wait_readable(c.wait_fd().as_raw_fd(), max);
        }
    }

    /// Sends all of `buf`, waiting out full windows.
    fn send_all(c: &DirectConn, buf: &[u8]) {
        let t0 = Instant::now();
        let mut off = 0;
        while off < buf.len() {
            match c.try_send(&buf[off..]) {
                Ok(n) => off += n,
                Err(DirectError::WouldBlock) => wait(c),
                Err(e) => panic!("send: {e}"),
            }
            assert!(t0.elapsed() < PATIENCE, "sending stalled at {off}");
        }
    }

    /// Fills `buf` from `c`; fails at an early end of stream.
    fn recv_exact(c: &DirectConn, buf: &mut [u8]) {
        let t0 = Instant::now();
        let mut off = 0;
        while off < buf.len() {
            match c.try_recv(&mut buf[off..]) {
                Ok(0) => panic!("end of stream after {off} bytes"),
                Ok(n) => off += n,
                Err(DirectError::WouldBlock) => wait(c),
                Err(e) => panic!("recv: {e}"),
            }
            assert!(t0.elapsed() < PATIENCE, "receiving stalled at {off}");
        }
    }

    /// Waits for `c`'s end of stream; what arrived before it is an error.
    fn recv_eof(c: &DirectConn) {
        let t0 = Instant::now();
        let mut b = [0u8; 64];
        loop {
            match c.try_recv(&mut b) {
                Ok(0) => return,
                Ok(n) => panic!("{n} bytes before the end of stream"),
                Err(DirectError::WouldBlock) => wait(c),
                Err(e) => panic!("recv: {e}"),
            }
            assert!(t0.elapsed() < PATIENCE, "no end of stream");
        }
    }

    /// `n` bytes of a pattern that differs from offset to offset and
    /// from `seed` to `seed`.
    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i % 251) as u8 ^ (i >> 12) as u8 ^ seed)
            .collect()
    }

    /// Runs `f` while another thread pumps `c` (a program's later calls
    /// on the sending side: its retransmissions and acknowledgments).
    fn while_pumping<T>(c: &DirectConn, f: impl FnOnce() -> T) -> T {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    c.pump().unwrap();
                    wait(c);
                }
            });
            let out = f();
            done.store(true, Ordering::Relaxed);
            out
        })
    }

    /// `rounds` round trips of one byte from `a` through `b` and back.
    fn ping_pong(a: &DirectConn, b: &DirectConn, rounds: u32) {
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut x = [0u8; 1];
                for _ in 0..rounds {
                    recv_exact(b, &mut x);
                    send_all(b, &x);
                }
            });
            for i in 0..rounds {
                let out = [i as u8];
                send_all(a, &out);
                let mut back = [0u8; 1];
                recv_exact(a, &mut back);
                assert_eq!(back, out, "round {i}");
            }
        });
    }

    /// A close run by its caller (a progress thread): started without
    /// waiting, it settles once the closing frame and what went before it
    /// are acknowledged, and the peer reads every byte, then the end.
    #[test]
    fn a_close_started_without_waiting_settles_once_the_peer_acknowledged_it() {
        let Some(bed) = bed("cs") else { return };
        let (a, b) = bed.pair();
        ping_pong(&a, &b, 1);
        let data = pattern(200_000, 7);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut got = vec![0u8; data.len()];
                recv_exact(&b, &mut got);
                assert!(got == data, "the bytes before the close differ");
                recv_eof(&b);
            });
            send_all(&a, &data);
            a.start_close().unwrap();
            let t0 = Instant::now();
            while !a.close_settled() {
                assert!(t0.elapsed() < PATIENCE, "the close never settled");
                wait(&a);
            }
        });
        assert!(matches!(a.try_send(b"x"), Err(DirectError::Closed)));
        a.end_linger();
        drop(a);
    }

    /// Waits until `c`'s calls fail with a reset; how long it took.
    fn until_reset(c: &DirectConn) -> Duration {
        let t0 = Instant::now();
        loop {
            match c.pump() {
                Err(DirectError::Reset) => return t0.elapsed(),
                Ok(()) => {}
                Err(e) => panic!("pump: {e}"),
            }
            assert!(t0.elapsed() < PATIENCE, "never reset");
            wait(c);
        }
    }

    /// A regression test: a close before the opening was answered (an
    /// acceptor whose program closed at once) sent nothing, and its peer
    /// waited out the silence limit for an answer that never came. A
    /// close with bytes unread resets the connection, as the kernel's
    /// does, and so does a close that could not finish: the peer's calls
    /// fail with a reset at once, its reads and writes alike, and the
    /// closing end's linger is over.
    #[test]
    fn a_close_with_bytes_unread_or_before_the_opening_resets_the_peer_at_once() {
        let Some(bed) = bed("r") else { return };
        let (a, b) = bed.pair();
        ping_pong(&a, &b, 1);
        send_all(&a, b"unread");
        let t0 = Instant::now();
        while !b.readiness().readable {
            assert!(t0.elapsed() < PATIENCE, "the bytes never arrived");
            wait(&b);
        }
        // What b sent before its close is still read before the reset, as
        // the kernel's reads take it.
        send_all(&b, b"tail");
        b.start_close().unwrap();
        assert!(b.close_settled(), "a reset needs no linger");
        let waited = until_reset(&a);
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        let mut buf = [0u8; 8];
        assert!(matches!(a.try_recv(&mut buf), Ok(4)), "{buf:?}");
        assert_eq!(&buf[..4], b"tail");
        assert!(matches!(a.try_recv(&mut buf), Err(DirectError::Reset)));
        assert!(matches!(a.try_send(b"x"), Err(DirectError::Reset)));
        let r = a.readiness();
        assert!(r.error && r.hang_up && r.readable, "{r:?}");
        // The reset peer's own close is over at once, and says nothing back.
        a.start_close().unwrap();
        assert!(a.close_settled());
        drop((a, b, bed));

        // The acceptor's program closes before the connector's opening
        // came; the close's linger passes unfinished, and the connector is
        // told. (Hosts of their own: a socket just closed may hold its
        // queue a moment longer.)
        let Some(bed) = self::bed("r2") else { return };
        let (a, b) = {
            let b = bed.hand(false, |p| DirectConn::open(p, setup_of(false)).unwrap());
            b.start_close().unwrap();
            assert!(!b.close_settled(), "a close waits for the opening first");
            let a = bed.hand(true, |p| DirectConn::open(p, setup_of(true)).unwrap());
            (a, b)
        };
        b.give_up_close();
        assert!(b.close_settled());
        let waited = until_reset(&a);
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        assert!(matches!(a.try_send(b"x"), Err(DirectError::Reset)));
    }

    /// A close before the opening still answers an opening that comes
    /// after [`CLOSE_LINGER`] (a caller lingers up to [`OPENING_LINGER`]
    /// for it): the connector opens, and the bytes it sends to the closed
    /// end reset the connection, as the kernel resets a closed socket that
    /// receives data, so the connector learns at once.
    #[test]
    fn a_close_before_the_opening_answers_a_late_one_and_resets_the_bytes_that_follow() {
        let Some(bed) = bed("l") else { return };
        let b = bed.hand(false, |p| DirectConn::open(p, setup_of(false)).unwrap());
        b.start_close().unwrap();
        let t0 = Instant::now();
        while t0.elapsed() < CLOSE_LINGER + Duration::from_millis(100) {
            assert!(!b.close_settled(), "settled with nobody there");
            wait(&b);
        }
        let a = bed.hand(true, |p| DirectConn::open(p, setup_of(true)).unwrap());
        let t1 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                while !b.close_settled() {
                    assert!(t1.elapsed() < OPENING_LINGER, "the close never settled");
                    wait(&b);
                }
            });
            send_all(&a, b"late");
            let waited = until_reset(&a);
            assert!(waited < Duration::from_secs(2), "{waited:?}");
        });
        assert!(matches!(a.try_send(b"x"), Err(DirectError::Reset)));
    }

    /// When the unanswered connector `a` sends its opening again, after
    /// up to `pumps` pumps: a pump runs on the clock its caller's wait
    /// read last, so a timer it found not yet due may be due (0) by the
    /// time it is read, and the next pump serves it.
    fn opening_again_in(a: &DirectConn, pumps: u32) -> Duration {
        let mut t = Duration::ZERO;
        for _ in 0..pumps {
            a.pump().unwrap();
            t = a.next_timer().expect("the opening again");
            if t > Duration::ZERO {
                break;
            }
        }
        t
    }

    /// Until its opening is answered a connection's next timer is the
    /// connector's opening again or the silence limit, never due at once:
    /// a waiter sleeps until the peer's opening arrives, not in a spin of
    /// zero-length waits.
    #[test]
    fn a_connection_waiting_for_its_opening_has_no_timer_due_at_once() {
        let Some(bed) = bed("o") else { return };
        // The connector first: its opening goes to an acceptor not there
        // yet, and goes again within 50 ms.
        let a = bed.hand(true, |p| DirectConn::open(p, setup_of(true)).unwrap());
        for _ in 0..3 {
            // Due again at once after a second pump would be the spin.
            let t = opening_again_in(&a, 2);
            assert!(
                t > Duration::ZERO && t <= Duration::from_millis(50),
                "{t:?}"
            );
        }
        let b = bed.hand(false, |p| DirectConn::open(p, setup_of(false)).unwrap());
        b.pump().unwrap();
        if !b.readiness().writable {
            let t = b.next_timer().expect("the silence limit");
            assert!(t > Duration::from_secs(1), "{t:?}");
        }
        ping_pong(&a, &b, 10);
    }

    /// An unanswered opening goes again after 1 ms, then after twice the
    /// last wait, up to 50 ms: an opening the acceptor's kernel dropped
    /// because its program was not ready yet costs a millisecond or two,
    /// not the transport's 50 ms resend.
    #[test]
    fn an_unanswered_opening_goes_again_soon_then_less_often() {
        let Some(bed) = bed("s") else { return };
        let a = bed.hand(true, |p| DirectConn::open(p, setup_of(true)).unwrap());
        let mut waits = Vec::new();
        for _ in 0..8 {
            let t = opening_again_in(&a, 3);
            waits.push(t);
            std::thread::sleep(t + Duration::from_micros(300));
        }
        let ms = Duration::from_millis;
        for (i, t) in waits.iter().enumerate() {
            let at_most = ms(1 << i).min(ms(50));
            assert!(*t > Duration::ZERO && *t <= at_most, "try {i}: {waits:?}");
        }
        // Not every millisecond for good: the later waits are long.
        assert!(waits[6] > ms(25) && waits[7] > ms(25), "{waits:?}");
    }

    /// An opening the acceptor's kernel dropped (its program was not
    /// ready) goes again as soon as the acceptor says it is ready, not at
    /// the connector's next resend, which by then waits tens of
    /// milliseconds.
    #[test]
    fn a_dropped_opening_goes_again_as_soon_as_the_acceptor_is_ready() {
        let Some(bed) = bed("r") else { return };
        let a = bed.hand(true, |p| DirectConn::open(p, setup_of(true)).unwrap());
        // Its openings go to an acceptor not there yet until the resend
        // waits its longest (50 ms); the acceptor comes just after one.
        let t0 = Instant::now();
        loop {
            a.pump().unwrap();
            let wait = a.next_timer().expect("the opening again");
            if t0.elapsed() > Duration::from_millis(70) && wait > Duration::from_millis(40) {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let b = bed.hand(false, |p| DirectConn::open(p, setup_of(false)).unwrap());
        // Read without a pump: the acceptor's word is still unread.
        let resend_at = Instant::now() + a.next_timer().expect("the opening again");
        while !a.is_open() {
            assert!(Instant::now() < resend_at, "open only at the resend");
            a.pump().unwrap();
            b.pump().unwrap();
            std::thread::sleep(Duration::from_micros(100));
        }
        ping_pong(&a, &b, 10);
    }

    #[test]
    fn a_direct_connection_is_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<DirectConn>();
    }

    /// The claim of the module: two programs' connection across a switch
    /// on queue 2 of each host, each on a port the host's relay made and
    /// handed over, carries a 1-byte ping-pong, 4 MiB one way with every
    /// byte checked, both ways at once, and one direction's end of stream
    /// while the other still carries bytes.
    #[test]
    fn a_direct_connection_carries_bytes_each_way_and_ends_each_way() {
        let Some(bed) = bed("c") else { return };
        let (a, b) = bed.pair();
        ping_pong(&a, &b, 1000);

        let stream = pattern(4 << 20, 1);
        let got = while_pumping(&a, || {
            std::thread::scope(|s| {
                s.spawn(|| send_all(&a, &stream));
                let mut got = vec![0u8; stream.len()];
                recv_exact(&b, &mut got);
                got
            })
        });
        assert!(got == stream, "the stream arrived altered");

        let (to_b, to_a) = (pattern(1 << 20, 2), pattern(1 << 20, 3));
        std::thread::scope(|s| {
            s.spawn(|| send_all(&a, &to_b));
            s.spawn(|| send_all(&b, &to_a));
            let from_b = s.spawn(|| {
                let mut got = vec![0u8; to_a.len()];
                recv_exact(&a, &mut got);
                got
            });
            let mut got = vec![0u8; to_b.len()];
            recv_exact(&b, &mut got);
            assert!(got == to_b, "a to b arrived altered");
            assert!(from_b.join().unwrap() == to_a, "b to a arrived altered");
        });

        a.shutdown_write().unwrap();
        assert!(matches!(a.try_send(b"x"), Err(DirectError::Closed)));
        recv_eof(&b);
        assert!(b.readiness().read_closed);
        let after = pattern(64 << 10, 4);
        let got = while_pumping(&b, || {
            std::thread::scope(|s| {
                s.spawn(|| send_all(&b, &after));
                let mut got = vec![0u8; after.len()];
                recv_exact(&a, &mut got);
                got
            })
        });
        assert!(got == after, "bytes after the end of the other way");
        b.shutdown_write().unwrap();
        recv_eof(&a);
        let st = b.stats();
        assert_eq!(st.bytes_received, 1000 + (4 << 20) + (1 << 20));
        assert_eq!(st.refused_frames, 0, "{st:?}");
        drop((a, b));
        drop(bed);
    }

    /// Neither call waits on the peer: before the opening is answered and
    /// with nothing sent, a receive would block; with a peer that does not
    /// read, sends fill the window and then would block, each call
    /// returning at once; once the peer reads, sending goes on.
    #[test]
    fn the_calls_never_block_on_the_peer() {
        let Some(bed) = bed("w") else { return };
        let (a, b) = bed.pair();
        let mut buf = [0u8; 16];
        assert!(matches!(b.try_recv(&mut buf), Err(DirectError::WouldBlock)));
        let t0 = Instant::now();
        while !(a.readiness().writable && b.readiness().writable) {
            assert!(t0.elapsed() < PATIENCE, "the connection never opened");
            wait(&a);
            wait(&b);
        }
        assert!(matches!(a.try_recv(&mut buf), Err(DirectError::WouldBlock)));
        assert!(!a.readiness().readable);
        let chunk = pattern(64 << 10, 5);
        let mut sent = 0usize;
        let blocked = loop {
            let t = Instant::now();
            let r = a.try_send(&chunk);
            assert!(t.elapsed() < Duration::from_millis(500), "a send waited");
            match r {
                Ok(n) => sent += n,
                Err(DirectError::WouldBlock) => break true,
                Err(e) => panic!("send: {e}"),
            }
            // Let the acknowledgments of what b holds unread come back.
            b.pump().unwrap();
            assert!(sent < 64 << 20, "the window never filled");
        };
        assert!(blocked && sent > 0);
        assert!(!a.readiness().writable, "a full window is not writable");
        while_pumping(&a, || {
            let mut got = vec![0u8; sent];
            recv_exact(&b, &mut got);
            send_all(&a, b"more");
            let mut more = [0u8; 4];
            recv_exact(&b, &mut more);
            assert_eq!(&more, b"more");
        });
    }

    /// Sends one raw frame from `x` (a port on host a's queue `Q`).
    fn send_raw(x: &mut Xsk, src: Mac, header: Header) {
        let mut done = Vec::new();
        x.completed(8, &mut done);
        let slot = RAW_SHAPE.frames - 1;
        let frame = x.frame_mut(slot);
        let len = reliable::write_headers(frame, &B_MAC, &src, &header);
        assert!(x.queue_tx(slot, len as u32));
        ring_doorbell(x.fd()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }

    const RAW_SHAPE: Shape = Shape {
        frames: 64,
        frame_bytes: 4096,
        ring_entries: 32,
    };

    /// Frames that are not the connection's never reach the program: on
    /// the connection's queue, another source MAC or flow id is dropped
    /// by the steering (the relay's count); one that reaches the socket
    /// with another source flow, or without the connection's seal, is
    /// dropped by the engine and counted; none is delivered, and the
    /// connection does not open on any of them.
    #[test]
    fn frames_of_another_connection_are_dropped_counted_never_delivered() {
        let Some(bed) = bed("s") else { return };
        let b = bed.hand(false, |p| DirectConn::open(p, setup_of(false)).unwrap());
        let mut raw = bed.hand(true, |p| {
            let mut x = Xsk::from_handed(p).unwrap();
            let rx: Vec<u32> = (0..RAW_SHAPE.frames / 2).collect();
            x.fill(&rx);
            x
        });
        let h = |kind, dst_flow, src_flow| Header {
            kind,
            len: 0,
            dst_flow,
            src_flow,
            seq: 1,
            ack: 0,
            credit: 100,
            sack: 1400,
        };
        let steered_before = bed.steerings[1].drops().unwrap();
        // Dropped by the steering: another MAC, another flow.
        send_raw(&mut raw, STRANGER, h(Kind::Syn, B_FLOW, A_FLOW));
        send_raw(&mut raw, A_MAC, h(Kind::Syn, B_FLOW + 1, A_FLOW));
        // Reach the socket: another source flow, an unsealed opening, an
        // unsealed data frame.
        send_raw(&mut raw, A_MAC, h(Kind::Syn, B_FLOW, A_FLOW + 1));
        send_raw(&mut raw, A_MAC, h(Kind::Syn, B_FLOW, A_FLOW));
        send_raw(&mut raw, A_MAC, h(Kind::Data, B_FLOW, A_FLOW));
        // An unsealed reset from the peer's own MAC and flow: a stranger's
        // reset must not end the connection.
        send_raw(&mut raw, A_MAC, h(Kind::Reset, B_FLOW, A_FLOW));
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            let mut buf = [0u8; 16];
            assert!(matches!(b.try_recv(&mut buf), Err(DirectError::WouldBlock)));
            let r = b.readiness();
            assert!(!r.readable && !r.writable, "{r:?}");
            wait(&b);
        }
        assert_eq!(bed.steerings[1].drops().unwrap() - steered_before, 2);
        let st = b.stats();
        assert_eq!(st.refused_frames, 4, "{st:?}");
        assert!(b.pump().is_ok(), "a forged reset ended the connection");
        assert_eq!((st.frames_received, st.bytes_received), (0, 0));
    }

    /// A peer that dies (its socket closed, nothing sent, as when its
    /// process is killed) is given up within the silence limit while the
    /// survivor keeps calling, each call returning at once.
    #[test]
    fn a_dead_peer_surfaces_as_a_timeout_while_pumping() {
        let Some(bed) = bed("k") else { return };
        let (a, mut b) = bed.pair();
        ping_pong(&a, &b, 1);
        // As dropped in another process: nothing sent, the port let go.
        b.opener_pid = 0;
        drop(b);
        send_all(&a, b"anyone?");
        let t0 = Instant::now();
        let err = loop {
            let t = Instant::now();
            let r = a.pump();
            assert!(t.elapsed() < Duration::from_millis(500), "a pump waited");
            if let Err(e) = r {
                break e;
            }
            assert!(
                t0.elapsed() < PEER_SILENCE_LIMIT + Duration::from_secs(3),
                "the dead peer was never given up"
            );
            wait(&a);
        };
        assert!(matches!(err, DirectError::Timeout { .. }), "{err}");
        assert!(t0.elapsed() >= PEER_SILENCE_LIMIT - Duration::from_secs(1));
        assert!(matches!(a.try_send(b"x"), Err(DirectError::Timeout { .. })));
        let r = a.readiness();
        assert!(r.error && r.hang_up && r.readable);
        // Nothing came back to show a hole: every frame sent again went
        // on the retransmission timer, and the counts say so.
        let s = a.stats();
        assert!(s.timeouts >= 1, "{s:?}");
        assert_eq!(s.retransmissions, s.timeouts, "{s:?}");
        assert_eq!(s.kernel_drops, 0, "{s:?}");
    }

    /// A forked child that drops the connection it never used sends
    /// nothing: the peer sees no end of stream and the parent's
    /// connection goes on.
    #[test]
    fn a_forked_child_dropping_the_connection_sends_nothing() {
        let Some(bed) = bed("f") else { return };
        let (mut a, b) = bed.pair();
        ping_pong(&a, &b, 3);
        // SAFETY: fork; the child only drops its copy of the connection
        // (unmapping, closing, freeing) and exits at once.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: the child's own copy of `a`, dropped once; the child
            // exits without returning, so nothing drops it again.
            unsafe {
                std::ptr::drop_in_place(&raw mut a);
                libc::_exit(0)
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child made above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            let mut buf = [0u8; 4];
            assert!(
                matches!(b.try_recv(&mut buf), Err(DirectError::WouldBlock)),
                "the peer heard something of the child's drop"
            );
            wait(&b);
        }
        ping_pong(&a, &b, 100);
    }

    /// Mean round trip of `rounds` 1-byte ping-pongs, µs, both ends
    /// spinning on their calls (as the transport's poll mode does).
    fn spun_round_trip_us(a: &DirectConn, b: &DirectConn, rounds: u32) -> f64 {
        fn spin_byte(c: &DirectConn) -> u8 {
            let mut x = [0u8; 1];
            loop {
                match c.try_recv(&mut x) {
                    Ok(1) => return x[0],
                    Err(DirectError::WouldBlock) => {}
                    other => panic!("recv: {other:?}"),
                }
            }
        }
        fn spin_send(c: &DirectConn, x: u8) {
            while matches!(c.try_send(&[x]), Err(DirectError::WouldBlock)) {}
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..rounds {
                    let x = spin_byte(b);
                    spin_send(b, x);
                }
            });
            let t0 = Instant::now();
            for i in 0..rounds {
                spin_send(a, i as u8);
                assert_eq!(spin_byte(a), i as u8);
            }
            t0.elapsed().as_secs_f64() * 1e6 / f64::from(rounds)
        })
    }

    /// The same ping-pong over the transport's own flow (poll mode) on
    /// queue 0 of the same hosts, through ports handed over as the relay
    /// would, each a process's port; the mean round trip, µs.
    fn transport_round_trip_us(bed: &Bed, rounds: u32) -> f64 {
        use super::super::flow::{PortKey, Shared, XdpFlow};
        use crate::Flow;
        use netgap_core::spec::Mode;
        let mut ports = Vec::new();
        for (i, (dev, mac)) in [("a0", A_MAC), ("b0", B_MAC)].into_iter().enumerate() {
            let made = in_ns(&bed.hosts[i], move || {
                handover::make(index_of(dev), 0, DirectConn::SHAPE).unwrap()
            });
            bed.steerings[i]
                .put_socket(0, made.socket.as_raw_fd())
                .unwrap();
            ports.push(in_ns(&bed.hosts[i], move || {
                let (mac_now, mtu) = interface(made.geometry.ifindex).unwrap();
                assert_eq!(mac_now, mac);
                let key = PortKey::here(dev).unwrap();
                Port::get(
                    key,
                    || {
                        let io =
                            PortIo::new(Xsk::from_handed(made)?, DirectConn::SHAPE.frames, mac)?;
                        Ok((
                            io,
                            mtu + ETH_HEADER_BYTES - FRAME_OVERHEAD_BYTES,
                            WINDOW_BYTES,
                        ))
                    },
                    random_u32,
                )
                .unwrap()
            }));
        }
        let listener = ports[1].listen().unwrap();
        let client = ports[0]
            .open_session(Peer {
                mac: B_MAC,
                flow: listener,
            })
            .unwrap();
        let t0 = Instant::now();
        let accepted = loop {
            ports[0].pump().unwrap();
            ports[1].pump().unwrap();
            if let Some(id) = ports[1].accept(listener) {
                break id;
            }
            assert!(t0.elapsed() < PATIENCE, "no flow opened");
            std::thread::sleep(Duration::from_millis(1));
        };
        let timeout = Duration::from_secs(10);
        let mut server =
            XdpFlow::new(Shared::new(ports[1].clone(), accepted, Mode::Poll, timeout).unwrap());
        let mut client =
            XdpFlow::new(Shared::new(ports[0].clone(), client, Mode::Poll, timeout).unwrap());
        let echo = std::thread::spawn(move || {
            let mut x = [0u8; 1];
            for _ in 0..rounds {
                server.recv_exact(&mut x).unwrap();
                server.send_all(&x).unwrap();
            }
            server
        });
        let t0 = Instant::now();
        for i in 0..rounds {
            client.send_all(&[i as u8]).unwrap();
            let mut x = [0u8; 1];
            client.recv_exact(&mut x).unwrap();
            assert_eq!(x[0], i as u8);
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
        drop((echo.join().unwrap(), client));
        us
    }

    /// The cost of a round trip on a direct connection against the
    /// transport's own flow on the same switch: three runs each,
    /// alternating, the medians printed. A timing loop, run by hand:
    /// `cargo test -p netgap-transport --features xdp --lib -- --ignored
    /// --nocapture direct_round_trip_cost`.
    #[test]
    #[ignore = "a timing loop, run by hand"]
    fn direct_round_trip_cost() {
        let Some(bed) = bed("m") else { return };
        let (a, b) = bed.pair();
        ping_pong(&a, &b, 100);
        const ROUNDS: u32 = 20_000;
        let (mut direct, mut flow) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            direct.push(spun_round_trip_us(&a, &b, ROUNDS));
            flow.push(transport_round_trip_us(&bed, ROUNDS));
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[1]
        };
        eprintln!(
            "1-byte round trip, mean of {ROUNDS}, µs: direct {direct:.2?} median {:.2}; transport flow {flow:.2?} median {:.2}",
            median(&mut direct.clone()),
            median(&mut flow.clone())
        );
    }
}
