//! A link at work on the hub: its hello and its two threads (the writing
//! thread is [`crate::link::writer`]; the receiving one dispatches frames
//! by connection id and never waits on a program), the other relay's
//! `OPEN` matched to the listen waiting with its key, and the link's end
//! put down in the hub's table.

use crate::conn::{ArriveError, Conn};
use crate::host::reset_tcp;
use crate::hub::{Event, Hub, Parked};
use crate::link::{ping_every, writer, ConnFault, Link, LinkError};
use crate::outbox::{Outbox, Via};
use crate::rendezvous::OfferStep;
use netgap_proto::direct::{KeyedAnswer, QueueAnswer, QueueOffer};
use netgap_proto::relay::{self as frame, Kind};
use netgap_transport::xdp::parse_addr;
use netgap_transport::{Flow, FlowError, Receiver};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::TrySendError;
use std::sync::{mpsc, Arc};
use std::time::Instant;
use thiserror::Error;

/// Why a link did not start: the hellos both ways failed or the other
/// relay's was not one.
#[derive(Debug, Error)]
pub(crate) enum HelloError {
    /// This end's hello could not be sent.
    #[error("the link's hello: {0}")]
    Send(FlowError),
    /// The other relay's hello did not come.
    #[error("the other relay's hello: {0}")]
    Recv(FlowError),
    /// The other relay's first header is no frame.
    #[error("the other relay's hello: {0}")]
    Frame(frame::FrameError),
    /// The other relay began with another frame.
    #[error("the other relay began with {0:?}, not its hello")]
    NotHello(Kind),
    /// The hello's name is no `IP/MAC/FLOW`.
    #[error("the other relay's hello names no valid address")]
    NoName,
    /// The hello's name does not parse as an xdp address.
    #[error("the other relay's hello: {name}: {why}")]
    Addr {
        /// The name the hello gave.
        name: String,
        /// Why it is no address.
        why: netgap_transport::xdp::AddrError,
    },
}

impl Link {
    /// Says hello both ways on a keyed flow, then runs the link's
    /// writing and receiving threads; the hub's state is `Up` with it.
    pub(crate) fn start(
        hub: &Arc<Hub>,
        flow: Box<dyn Flow>,
        local_name: String,
        (my_bit, flow_id): (u32, u16),
        peer_tcp_ip: IpAddr,
    ) -> Result<Arc<Link>, HelloError> {
        let (mut tx, mut rx) = flow.into_halves();
        tx.send_all(&frame::frame(Kind::LinkHello, 0, local_name.as_bytes()))
            .map_err(HelloError::Send)?;
        let mut h = [0u8; frame::HEADER_BYTES];
        rx.recv_exact(&mut h).map_err(HelloError::Recv)?;
        let hd = frame::decode(&h).map_err(HelloError::Frame)?;
        if hd.kind != Kind::LinkHello {
            return Err(HelloError::NotHello(hd.kind));
        }
        let mut name = vec![0u8; hd.len];
        rx.recv_exact(&mut name).map_err(HelloError::Recv)?;
        let peer_name = String::from_utf8(name)
            .ok()
            .filter(|n| netgap_proto::preload::valid_target(n))
            .ok_or(HelloError::NoName)?;
        let peer = parse_addr(&peer_name).map_err(|why| HelloError::Addr {
            name: peer_name.clone(),
            why,
        })?;
        let (out, out_rx) = mpsc::channel();
        let link = Arc::new(Link::new(
            Arc::new(Outbox::new(out, Some(tx))),
            local_name,
            peer_name,
            (peer.ip, peer_tcp_ip),
            flow_id,
            my_bit,
        ));
        let aside = hub.up(peer_tcp_ip, Arc::clone(&link));
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
        if let Some(a) = aside {
            // Both relays opened a link at once (or the other relay
            // opened one anew): one is named from now on, the other
            // carries what was opened on it until its linger closes it.
            let named = if Arc::ptr_eq(&a, &link) {
                "the older one"
            } else {
                "this one"
            };
            log!(
                "two links to {peer_tcp_ip}: listens name {named}; the one with this end {} carries only the connections opened on it, until its linger closes it",
                a.local_name
            );
        }
        let ping = ping_every(hub.timeout);
        let (l, h) = (Arc::clone(&link), Arc::clone(hub));
        let w = std::thread::Builder::new()
            .name("relay-link-out".into())
            .spawn(move || {
                if let Err(e) = writer(&l, &out_rx, ping) {
                    l.shut(&e.to_string());
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
                    Err(e) => e.to_string(),
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

    /// The other relay's `OPEN`: the listen waiting with that key gets
    /// its connection, or the other relay hears `OPEN_REFUSED`.
    pub(crate) fn take_open(
        self: &Arc<Self>,
        hub: &Hub,
        id: u32,
        key: [u8; frame::KEY_BYTES],
    ) -> Result<(), LinkError> {
        if id & frame::CONNECTOR_BIT == self.my_bit {
            return Err(LinkError::OwnId(id));
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
            return Err(LinkError::IdInUse(id));
        }
        let conn = Arc::new(Conn::new(id, p.ends, Arc::clone(&self.out), true));
        c.map.insert(id, Arc::clone(&conn));
        self.conns_total.fetch_add(1, Ordering::Relaxed);
        drop(c);
        self.push(Kind::OpenOk, id, &[]);
        if p.give
            .send(Some((Arc::clone(&conn), Arc::clone(self))))
            .is_err()
        {
            self.unregister(id);
            conn.reset(true);
        }
        Ok(())
    }

    /// Answers the other relay's offer for the connection `key`.
    pub(crate) fn answer(&self, key: [u8; frame::KEY_BYTES], answer: QueueAnswer) {
        self.push(Kind::QueueAnswer, 0, &KeyedAnswer { key, answer }.encode());
    }

    /// The other relay's offer of queues for a direct connection: to the
    /// `Accept` waiting with its key, or parked for it; answered
    /// `NoQueue` where direct connections are off or the table is full.
    pub(crate) fn take_offer(self: &Arc<Self>, hub: &Hub, offer: QueueOffer) {
        let Some(d) = &hub.direct else {
            self.answer(offer.key, QueueAnswer::NoQueue);
            return;
        };
        let now = Instant::now();
        let key = offer.key;
        let parked = Parked {
            offer,
            link: self.hold(),
        };
        let (step, expired) = {
            let mut meet = d.meet();
            let expired = meet.expired(now);
            (meet.offer(key, parked, now), expired)
        };
        for p in expired {
            p.link.0.answer(p.offer.key, QueueAnswer::NoQueue);
        }
        match step {
            OfferStep::Parked => {}
            OfferStep::Matched(mailbox, parked) => {
                if let Err(TrySendError::Full(Event::Offer(p)))
                | Err(TrySendError::Disconnected(Event::Offer(p))) =
                    mailbox.try_send(Event::Offer(parked))
                {
                    p.link.0.answer(key, QueueAnswer::NoQueue);
                }
            }
            OfferStep::Refused(p, why) => {
                hub.journal.link(
                    self.flow_id,
                    &format!("link to {}: a queue offer refused: {why}", self.peer_name),
                );
                p.link.0.answer(key, QueueAnswer::NoQueue);
            }
        }
    }

    /// The other relay's answer to an offer: to the `Connect` waiting
    /// with its key; one no request waits for is dropped with a line.
    pub(crate) fn take_answer(&self, hub: &Hub, a: KeyedAnswer) {
        let mailbox = hub.direct.as_ref().and_then(|d| d.meet().answer(&a.key));
        match mailbox {
            // A mailbox holds one event and gets only this one.
            Some(m) => {
                let _ = m.try_send(Event::Answer(a.answer));
            }
            None => hub.journal.link(
                self.flow_id,
                &format!(
                    "link to {}: a queue answer no direct request waits for: dropped",
                    self.peer_name
                ),
            ),
        }
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

/// The link's receiving thread: every frame to its connection, never
/// waiting on a program (connections queue within their credit).
/// Ok: the other relay closed the link; Err: it broke.
pub(crate) fn reader(link: &Arc<Link>, hub: &Hub, rx: &mut dyn Receiver) -> Result<(), LinkError> {
    let recv = |rx: &mut dyn Receiver, buf: &mut [u8]| rx.recv_exact(buf).map_err(LinkError::Recv);
    let mut h = [0u8; frame::HEADER_BYTES];
    // One buffer for every DATA payload (a frame's is at most a chunk):
    // what the program's ring takes is copied once, from here.
    let mut payload = vec![0u8; frame::CHUNK_BYTES];
    loop {
        recv(rx, &mut h)?;
        let hd = frame::decode(&h).map_err(LinkError::BadFrame)?;
        link.frames_in.fetch_add(1, Ordering::Relaxed);
        let fault = |e: ConnFault| LinkError::Conn {
            id: hd.id,
            fault: e,
        };
        match hd.kind {
            Kind::Data => {
                let v = payload
                    .get_mut(..hd.len)
                    .ok_or_else(|| fault(ConnFault::Long))?;
                recv(rx, v)?;
                if let Some(c) = link.find(hd.id) {
                    match c.arrive(v) {
                        Ok(Some(n)) => {
                            // A closed link's writer is gone; the
                            // reader ends with the link anyway.
                            let _ = c.push(Kind::Credit, &n.to_le_bytes(), Via::Queue);
                        }
                        Ok(None) => {}
                        Err(ArriveError::Credit(e)) => return Err(fault(e.into())),
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
                let n = frame::credit_of(b).map_err(|e| fault(e.into()))?;
                if let Some(c) = link.find(hd.id) {
                    c.grant(n).map_err(|e| fault(e.into()))?;
                }
            }
            Kind::Open => {
                let mut key = [0u8; frame::KEY_BYTES];
                recv(rx, &mut key)?;
                link.take_open(hub, hd.id, key)?;
            }
            Kind::OpenOk | Kind::OpenRefused => {
                if hd.id & frame::CONNECTOR_BIT != link.my_bit {
                    return Err(fault(ConnFault::Unasked));
                }
                if let Some(c) = link.find(hd.id) {
                    c.opened(hd.kind == Kind::OpenOk)
                        .map_err(|e| fault(e.into()))?;
                }
            }
            Kind::Reset => {
                if let Some(c) = link.find(hd.id) {
                    c.reset(false);
                }
            }
            Kind::QueueOffer => {
                let mut b = [0u8; netgap_proto::direct::QUEUE_OFFER_BYTES];
                recv(rx, &mut b)?;
                let offer = QueueOffer::decode(&b).map_err(LinkError::Direct)?;
                link.take_offer(hub, offer);
            }
            Kind::QueueAnswer => {
                let mut b = [0u8; netgap_proto::direct::KEYED_ANSWER_BYTES];
                recv(rx, &mut b)?;
                let a = KeyedAnswer::decode(&b).map_err(LinkError::Direct)?;
                link.take_answer(hub, a);
            }
            Kind::Ping => {}
            Kind::LinkHello => return Err(LinkError::SecondHello),
            Kind::LinkClose => return Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
