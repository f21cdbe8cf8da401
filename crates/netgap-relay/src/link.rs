//! One link: the xdp flow to another host's relay that carries every
//! relayed connection between the two hosts. Its hello, its writing
//! thread (queued frames, keep-alives, the close after the linger) and its
//! receiving thread, which dispatches frames by connection id and never
//! waits on a program.

use crate::conn::{AnswerError, Conn, Ends};
use crate::credit::SecondAnswer;
use crate::outbox::{Out, Outbox, SendError, Via};
use crate::table::LinkState;
use crate::TICK;
use netgap_proto::relay::{self as frame, Kind};
use netgap_transport::FlowError;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a link broke (its threads stop and every connection on it is
/// reset).
#[derive(Debug, Error)]
pub(crate) enum LinkError {
    /// The flow failed while reading: the other relay is gone.
    #[error("the other relay: {0}")]
    Recv(FlowError),
    /// A header that is no frame.
    #[error("a bad frame from the other relay: {0}")]
    BadFrame(frame::FrameError),
    /// A frame that breaks the protocol on one connection.
    #[error("connection {id:#x}: {fault}")]
    Conn {
        /// The frame's connection id.
        id: u32,
        /// What the frame broke.
        fault: ConnFault,
    },
    /// An `OPEN` with an id of this end's half.
    #[error("an OPEN with an id of this end ({0:#x})")]
    OwnId(u32),
    /// An `OPEN` with the id of a connection on the link.
    #[error("an OPEN with an id in use ({0:#x})")]
    IdInUse(u32),
    /// `LINK_HELLO` after the link's start.
    #[error("a second hello from the other relay")]
    SecondHello,
    /// A queue offer or answer that is no such record.
    #[error("a bad queue offer or answer from the other relay: {0}")]
    Direct(netgap_proto::preload::HelloError),
}

/// How one frame broke the protocol on its connection.
#[derive(Debug, Error)]
pub(crate) enum ConnFault {
    /// A `DATA` payload past a chunk.
    #[error("DATA longer than a chunk")]
    Long,
    /// Data past the connection's credit, or a credit frame past the
    /// window.
    #[error(transparent)]
    Credit(#[from] frame::CreditError),
    /// A credit frame's payload is out of range.
    #[error(transparent)]
    Frame(#[from] frame::FrameError),
    /// A second answer to one `OPEN`.
    #[error(transparent)]
    Answer(#[from] SecondAnswer),
    /// An answer to an `OPEN` of the other end's half.
    #[error("an answer to an OPEN this end did not send")]
    Unasked,
}

/// How long a connect waits for the answer to its `OPEN` (the other
/// relay answers at once from its receiving thread).
pub(crate) const OPEN_WAIT: Duration = Duration::from_secs(3);

/// A link with no connection for this long closes, releasing its
/// flow on the port.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// The keep-alive interval for a timeout.
pub(crate) fn ping_every(timeout: Duration) -> Duration {
    timeout / 3
}

/// A queue agreement under way on a link ([`Link::hold`]).
pub(crate) struct Hold(pub(crate) Arc<Link>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.touch();
        self.0.agreeing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The link's connections, and since when it has none.
pub(crate) struct Conns {
    pub(crate) map: HashMap<u32, Arc<Conn>>,
    pub(crate) idle_since: Instant,
}

/// One xdp flow to the other host's relay, carrying every relayed
/// connection between the two hosts.
pub(crate) struct Link {
    pub(crate) out: Arc<Outbox>,
    /// This relay's end, `IP/MAC/FLOW`: the target a listen names.
    pub(crate) local_name: String,
    /// The other relay's end, from its `LINK_HELLO`.
    pub(crate) peer_name: String,
    pub(crate) peer_ip: IpAddr,
    /// The TCP peer address of the connection that opened the link:
    /// the other host as its programs' connections come from it. A
    /// listen for a connection from any other address is not this
    /// link's.
    pub(crate) peer_tcp_ip: IpAddr,
    /// The listening end's flow id: both ends name it.
    pub(crate) flow_id: u16,
    /// The id bit of the connections this end opens.
    pub(crate) my_bit: u32,
    pub(crate) next_id: AtomicU32,
    pub(crate) conns: Mutex<Conns>,
    /// No new connection: the link is closing or broken.
    pub(crate) closing: AtomicBool,
    pub(crate) shut_once: AtomicBool,
    pub(crate) why: Mutex<Option<String>>,
    pub(crate) live_threads: AtomicU32,
    pub(crate) t0: Instant,
    pub(crate) conns_total: AtomicU64,
    pub(crate) frames_in: AtomicU64,
    pub(crate) unknown_id_frames: AtomicU64,
    /// Direct connections' queue agreements under way on the link (an
    /// offer sent and not answered, or parked here): the link stays
    /// while any is.
    pub(crate) agreeing: AtomicU32,
}

impl Link {
    /// A link just up, with no connection yet, its two threads about
    /// to start.
    pub(crate) fn new(
        out: Arc<Outbox>,
        local_name: String,
        peer_name: String,
        (peer_ip, peer_tcp_ip): (IpAddr, IpAddr),
        flow_id: u16,
        my_bit: u32,
    ) -> Link {
        Link {
            out,
            local_name,
            peer_name,
            peer_ip,
            peer_tcp_ip,
            flow_id,
            my_bit,
            next_id: AtomicU32::new(1),
            conns: Mutex::new(Conns {
                map: HashMap::new(),
                idle_since: Instant::now(),
            }),
            closing: AtomicBool::new(false),
            shut_once: AtomicBool::new(false),
            why: Mutex::new(None),
            live_threads: AtomicU32::new(2),
            t0: Instant::now(),
            conns_total: AtomicU64::new(0),
            frames_in: AtomicU64::new(0),
            unknown_id_frames: AtomicU64::new(0),
            agreeing: AtomicU32::new(0),
        }
    }

    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection is about to come: the linger starts again.
    pub(crate) fn touch(&self) {
        self.lock().idle_since = Instant::now();
    }

    pub(crate) fn idle(&self) -> bool {
        self.lock().map.is_empty()
    }

    pub(crate) fn find(&self, id: u32) -> Option<Arc<Conn>> {
        let c = self.lock().map.get(&id).cloned();
        if c.is_none() {
            self.unknown_id_frames.fetch_add(1, Ordering::Relaxed);
        }
        c
    }

    pub(crate) fn unregister(&self, id: u32) {
        let mut c = self.lock();
        if c.map.remove(&id).is_some() && c.map.is_empty() {
            c.idle_since = Instant::now();
        }
    }

    /// Queues a frame of the link's own (never waits).
    pub(crate) fn push(&self, kind: Kind, id: u32, payload: &[u8]) {
        // A closed link's writer is gone: nothing more to say.
        let _ = self.out.send(&frame::frame(kind, id, payload), Via::Queue);
    }

    /// A queue agreement begins on the link: it stays (and its linger
    /// starts again after) until the returned hold drops.
    pub(crate) fn hold(self: &Arc<Self>) -> Hold {
        self.agreeing.fetch_add(1, Ordering::SeqCst);
        Hold(Arc::clone(self))
    }

    /// Whether the link had no connection for the linger: then it
    /// closes (no new connection on it from now).
    pub(crate) fn linger_over(&self) -> bool {
        let c = self.lock();
        if c.map.is_empty()
            && self.agreeing.load(Ordering::SeqCst) == 0
            && c.idle_since.elapsed() >= LINGER
        {
            self.closing.store(true, Ordering::SeqCst);
            true
        } else {
            false
        }
    }

    /// Opens a connection on the link: an id of this end, `OPEN` with
    /// the key, then the other relay's answer. Err(None): the link is
    /// closing (wait for the next); Err(Some): refused or broken.
    pub(crate) fn open_conn(
        self: &Arc<Self>,
        key: [u8; frame::KEY_BYTES],
        parts: &mut Option<Ends>,
    ) -> Result<Arc<Conn>, Option<AnswerError>> {
        let conn = {
            let mut c = self.lock();
            if self.closing() {
                return Err(None);
            }
            let Some(ends) = parts.take() else {
                return Err(Some(AnswerError::Gone));
            };
            let id = loop {
                let n = self.next_id.fetch_add(1, Ordering::Relaxed) & !frame::CONNECTOR_BIT;
                let id = n | self.my_bit;
                if n != 0 && !c.map.contains_key(&id) {
                    break id;
                }
            };
            let conn = Arc::new(Conn::new(id, ends, Arc::clone(&self.out), false));
            c.map.insert(id, Arc::clone(&conn));
            self.conns_total.fetch_add(1, Ordering::Relaxed);
            self.push(Kind::Open, id, &key);
            conn
        };
        match conn.wait_open(OPEN_WAIT) {
            Ok(()) => Ok(conn),
            Err(why) => {
                self.unregister(conn.id);
                // A late OPEN_OK would leave the other relay's side
                // waiting for an end that never comes: RESET it.
                conn.reset(true);
                Err(Some(why))
            }
        }
    }

    /// Stops the link (once): no new connection, every connection on
    /// it reset, `LINK_CLOSE` to the other relay.
    pub(crate) fn shut(&self, why: &str) {
        let conns: Vec<Arc<Conn>> = {
            let mut c = self.lock();
            self.closing.store(true, Ordering::SeqCst);
            if self.shut_once.swap(true, Ordering::SeqCst) {
                return;
            }
            self.why
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| why.to_string());
            c.map.drain().map(|(_, v)| v).collect()
        };
        if !conns.is_empty() {
            log!(
                "link to {}: {why}: resetting its {} connections",
                self.peer_name,
                conns.len()
            );
        }
        for c in conns {
            c.reset(false);
        }
        self.out.close();
    }
}

impl LinkState for Link {
    fn closing(&self) -> bool {
        Link::closing(self)
    }

    fn connected_here(&self) -> bool {
        self.my_bit != 0
    }

    fn lower_here(&self) -> bool {
        // This end's name is the relay's own `IP/MAC/FLOW`: it parses.
        netgap_transport::xdp::parse_addr(&self.local_name).is_ok_and(|own| own.ip < self.peer_ip)
    }

    fn settled(&self) -> bool {
        // Two crossing links both come up while one listen waits for
        // its flow.
        self.t0.elapsed() >= crate::open::ACCEPT_WAIT
    }
}

/// The link's writing thread: the frames queued for it in order, a
/// keep-alive when the link is idle, the close after the linger.
pub(crate) fn writer(
    link: &Link,
    rx: &mpsc::Receiver<Out>,
    ping: Duration,
) -> Result<(), SendError> {
    let out = &link.out;
    let mut last_sent = Instant::now();
    let mut frames_seen = 0;
    loop {
        match rx.recv_timeout(TICK) {
            Ok(Out::Frame(f)) => {
                out.send_queued(&f)?;
                last_sent = Instant::now();
                continue;
            }
            Ok(Out::Broken(e)) => return Err(e),
            Ok(Out::Close) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = out.send_control(Kind::LinkClose);
                return Ok(());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if link.linger_over() {
            link.why
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| format!("no connection for {} ms", LINGER.as_millis()));
            out.send_control(Kind::LinkClose)?;
            return Ok(());
        }
        // What the connections' threads sent themselves keeps the
        // link alive too.
        let frames = out.frames_out.load(Ordering::Relaxed);
        if frames != frames_seen {
            frames_seen = frames;
            last_sent = Instant::now();
        }
        if last_sent.elapsed() >= ping {
            out.send_control(Kind::Ping)?;
            last_sent = Instant::now();
            frames_seen = out.frames_out.load(Ordering::Relaxed);
        }
    }
}

/// A listen waiting for the other relay's `OPEN` with its key.
pub(crate) struct Pending {
    pub(crate) ends: Ends,
    pub(crate) give: mpsc::SyncSender<Given>,
}

/// What a waiting listen is given: the connection and its link, or none
/// when the connection went direct (no `OPEN` will come).
pub(crate) type Given = Option<(Arc<Conn>, Arc<Link>)>;
