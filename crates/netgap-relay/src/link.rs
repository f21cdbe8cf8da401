//! One link: the xdp flow to another host's relay that carries every
//! relayed connection between the two hosts. Its hello, its writing
//! thread (queued frames, keep-alives, the close after the linger) and its
//! receiving thread, which dispatches frames by connection id and never
//! waits on a program.

use crate::conn::{ArriveError, Conn};
use crate::host::reset_tcp;
use crate::hub::{Ends, Hub};
use crate::outbox::{Out, Outbox, Via};
use crate::table::LinkState;
use crate::TICK;
use netgap_proto::relay::{self as frame, Kind};
use netgap_transport::xdp::parse_addr;
use netgap_transport::{Flow, Receiver};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
        }
    }

    /// Says hello both ways on a keyed flow, then runs the link's
    /// writing and receiving threads; the hub's state is `Up` with it.
    pub(crate) fn start(
        hub: &Arc<Hub>,
        flow: Box<dyn Flow>,
        local_name: String,
        (my_bit, flow_id): (u32, u16),
        peer_tcp_ip: IpAddr,
    ) -> Result<Arc<Link>, String> {
        let (mut tx, mut rx) = flow.into_halves();
        tx.send_all(&frame::frame(Kind::LinkHello, 0, local_name.as_bytes()))
            .map_err(|e| format!("the link's hello: {e}"))?;
        let mut h = [0u8; frame::HEADER_BYTES];
        rx.recv_exact(&mut h)
            .map_err(|e| format!("the other relay's hello: {e}"))?;
        let hd = frame::decode(&h).map_err(|e| format!("the other relay's hello: {e}"))?;
        if hd.kind != Kind::LinkHello {
            return Err(format!(
                "the other relay began with {:?}, not its hello",
                hd.kind
            ));
        }
        let mut name = vec![0u8; hd.len];
        rx.recv_exact(&mut name)
            .map_err(|e| format!("the other relay's hello: {e}"))?;
        let peer_name = String::from_utf8(name)
            .ok()
            .filter(|n| netgap_proto::preload::valid_target(n))
            .ok_or("the other relay's hello names no valid address")?;
        let peer = parse_addr(&peer_name)
            .map_err(|e| format!("the other relay's hello: {peer_name}: {e}"))?;
        let (out, out_rx) = mpsc::channel();
        let link = Arc::new(Link::new(
            Arc::new(Outbox::new(out, Some(tx))),
            local_name,
            peer_name,
            (peer.ip, peer_tcp_ip),
            flow_id,
            my_bit,
        ));
        hub.up(peer_tcp_ip, Arc::clone(&link));
        log!(
            "link up: {} {} (this end {})",
            if my_bit == 0 {
                "accepted from"
            } else {
                "connected to"
            },
            link.peer_name,
            link.local_name
        );
        let ping = ping_every(hub.timeout);
        let (l, h) = (Arc::clone(&link), Arc::clone(hub));
        let w = std::thread::Builder::new()
            .name("relay-link-out".into())
            .spawn(move || {
                if let Err(e) = writer(&l, &out_rx, ping) {
                    l.shut(&e);
                } else {
                    l.shut("closed");
                }
                drop(out_rx);
                // The flow's sending half goes with the thread: later
                // sends fail.
                drop(l.out.sender().take());
                l.thread_done(&h);
            });
        if let Err(e) = w {
            link.shut(&format!("no thread for the link: {e}"));
            link.thread_done(hub);
        }
        let (l, h) = (Arc::clone(&link), Arc::clone(hub));
        let r = std::thread::Builder::new()
            .name("relay-link-in".into())
            .spawn(move || {
                let why = match reader(&l, &h, &mut *rx) {
                    Ok(()) => "closed by the other relay".to_string(),
                    Err(e) => e,
                };
                l.shut(&why);
                drop(rx);
                l.thread_done(&h);
            });
        if let Err(e) = r {
            link.shut(&format!("no thread for the link: {e}"));
            link.thread_done(hub);
        }
        Ok(link)
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

    /// Whether the link had no connection for the linger: then it
    /// closes (no new connection on it from now).
    pub(crate) fn linger_over(&self) -> bool {
        let c = self.lock();
        if c.map.is_empty() && c.idle_since.elapsed() >= LINGER {
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
    ) -> Result<Arc<Conn>, Option<String>> {
        let conn = {
            let mut c = self.lock();
            if self.closing() {
                return Err(None);
            }
            let Some(ends) = parts.take() else {
                return Err(Some("the connection is gone".into()));
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

    /// The other relay's `OPEN`: the listen waiting with that key gets
    /// its connection, or the other relay hears `OPEN_REFUSED`.
    pub(crate) fn take_open(
        self: &Arc<Self>,
        hub: &Hub,
        id: u32,
        key: [u8; frame::KEY_BYTES],
    ) -> Result<(), String> {
        if id & frame::CONNECTOR_BIT == self.my_bit {
            return Err(format!("an OPEN with an id of this end ({id:#x})"));
        }
        let Some(p) = hub.pending().remove(&key) else {
            hub.journal.link(
                self.flow_id,
                &format!(
                    "link to {}: an OPEN ({id:#x}) with a key no connection here waits with: refused",
                    self.peer_name
                ),
            );
            self.push(Kind::OpenRefused, id, &[]);
            return Ok(());
        };
        let mut c = self.lock();
        if c.map.contains_key(&id) || self.closing() {
            drop(c);
            reset_tcp(p.ends.tcp.as_raw_fd());
            p.ends.ring.closing();
            if self.closing() {
                self.push(Kind::OpenRefused, id, &[]);
                return Ok(());
            }
            return Err(format!("an OPEN with an id in use ({id:#x})"));
        }
        let conn = Arc::new(Conn::new(id, p.ends, Arc::clone(&self.out), true));
        c.map.insert(id, Arc::clone(&conn));
        self.conns_total.fetch_add(1, Ordering::Relaxed);
        drop(c);
        self.push(Kind::OpenOk, id, &[]);
        if p.give.send((Arc::clone(&conn), Arc::clone(self))).is_err() {
            self.unregister(id);
            conn.reset(true);
        }
        Ok(())
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

    /// One of the link's two threads ended; the last one (the flow is
    /// released by now) puts the hub down.
    pub(crate) fn thread_done(self: &Arc<Self>, hub: &Hub) {
        if self.live_threads.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        hub.gone(self.peer_tcp_ip, self);
        let why = self
            .why
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default();
        log!(
            "link to {} closed after {} ms ({why}): connections={} frames_in={} frames_out={} unknown_id_frames={}",
            self.peer_name,
            self.t0.elapsed().as_millis(),
            self.conns_total.load(Ordering::Relaxed),
            self.frames_in.load(Ordering::Relaxed),
            self.out.frames_out.load(Ordering::Relaxed),
            self.unknown_id_frames.load(Ordering::Relaxed),
        );
    }
}

impl LinkState for Link {
    fn closing(&self) -> bool {
        Link::closing(self)
    }
}

/// The link's writing thread: the frames queued for it in order, a
/// keep-alive when the link is idle, the close after the linger.
pub(crate) fn writer(link: &Link, rx: &mpsc::Receiver<Out>, ping: Duration) -> Result<(), String> {
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

/// The link's receiving thread: every frame to its connection, never
/// waiting on a program (connections queue within their credit).
/// Ok: the other relay closed the link; Err: it broke.
pub(crate) fn reader(link: &Arc<Link>, hub: &Hub, rx: &mut dyn Receiver) -> Result<(), String> {
    let recv = |rx: &mut dyn Receiver, buf: &mut [u8]| {
        rx.recv_exact(buf)
            .map_err(|e| format!("the other relay: {e}"))
    };
    let mut h = [0u8; frame::HEADER_BYTES];
    // One buffer for every DATA payload (a frame's is at most a chunk):
    // what the program's ring takes is copied once, from here.
    let mut payload = vec![0u8; frame::CHUNK_BYTES];
    loop {
        recv(rx, &mut h)?;
        let hd = frame::decode(&h).map_err(|e| format!("a bad frame from the other relay: {e}"))?;
        link.frames_in.fetch_add(1, Ordering::Relaxed);
        let fault = |e: String| format!("connection {:#x}: {e}", hd.id);
        match hd.kind {
            Kind::Data => {
                let v = payload
                    .get_mut(..hd.len)
                    .ok_or_else(|| fault("DATA longer than a chunk".into()))?;
                recv(rx, v)?;
                if let Some(c) = link.find(hd.id) {
                    match c.arrive(v) {
                        Ok(Some(n)) => {
                            // A closed link's writer is gone; the
                            // reader ends with the link anyway.
                            let _ = c.push(Kind::Credit, &n.to_le_bytes(), Via::Queue);
                        }
                        Ok(None) => {}
                        Err(ArriveError::Credit(e)) => return Err(fault(e.to_string())),
                        Err(ArriveError::Corrupt) => {
                            // The program broke its ring: its
                            // connection is reset, not the link.
                            c.reset(true);
                        }
                        Err(ArriveError::Closed) => {}
                    }
                }
            }
            Kind::Bell => {
                if let Some(c) = link.find(hd.id) {
                    c.ring_tcp();
                }
            }
            Kind::End => {
                if let Some(c) = link.find(hd.id) {
                    c.end();
                }
            }
            Kind::Credit => {
                let mut b = [0u8; 4];
                recv(rx, &mut b)?;
                let n = frame::credit_of(b).map_err(|e| fault(e.to_string()))?;
                if let Some(c) = link.find(hd.id) {
                    c.grant(n).map_err(|e| fault(e.to_string()))?;
                }
            }
            Kind::Open => {
                let mut key = [0u8; frame::KEY_BYTES];
                recv(rx, &mut key)?;
                link.take_open(hub, hd.id, key)?;
            }
            Kind::OpenOk | Kind::OpenRefused => {
                if hd.id & frame::CONNECTOR_BIT != link.my_bit {
                    return Err(fault("an answer to an OPEN this end did not send".into()));
                }
                if let Some(c) = link.find(hd.id) {
                    c.opened(hd.kind == Kind::OpenOk).map_err(fault)?;
                }
            }
            Kind::Reset => {
                if let Some(c) = link.find(hd.id) {
                    c.reset(false);
                }
            }
            Kind::Ping => {}
            Kind::LinkHello => return Err("a second hello from the other relay".into()),
            Kind::LinkClose => return Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
