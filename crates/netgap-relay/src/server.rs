//! The relay's Unix-socket server: the abstract socket `@netgap-relay`,
//! each client's `SO_PEERCRED` credentials, the requests a second and the
//! connections per uid, the refusals, and one request with the
//! descriptors beside it. Each admitted client gets a thread (`serve`)
//! that hands its request to the link table ([`crate::open`]) and then
//! pumps its connection ([`crate::conn`]).

use crate::conn::{queue_to_ring, ring_to_flow, Conn, PumpError};
use crate::host::read_interface;
use crate::hub::Hub;
use crate::journal::Journal;
use crate::limits::RequestRate;
use crate::link::Link;
use crate::open::{before, connect, listen, Asker, OpenError};
use crate::request::{direct_fd, read_request, reply, with_fds, Asked, RequestError};
use crate::table::LinkTable;
use crate::{RelayConfig, RelayError};
use netgap_proto::direct::DirectRole;
use netgap_proto::preload::{RelayReply, RelayRequest};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The abstract socket the libraries reach.
pub(crate) const SOCKET_NAME: &str = "netgap-relay";
/// How long a client has to send its request.
pub(crate) const REQUEST_WAIT: Duration = Duration::from_secs(5);
/// How long a reservation waits for its connect.
pub(crate) const CONNECT_WAIT: Duration = Duration::from_secs(15);

/// Connections per uid and in all, against the relay's limits
/// (`--max-per-uid`, `--max-total`).
pub(crate) struct Counts {
    per_uid: HashMap<u32, u32>,
    total: u32,
    max_per_uid: u32,
    max_total: u32,
}

impl Counts {
    /// No connection yet, under these limits.
    pub(crate) fn new(max_per_uid: u32, max_total: u32) -> Arc<Mutex<Counts>> {
        Arc::new(Mutex::new(Counts {
            per_uid: HashMap::new(),
            total: 0,
            max_per_uid,
            max_total,
        }))
    }

    /// A place for one more connection of `uid`, if both limits allow
    /// it; it is given back when the slot drops.
    pub(crate) fn take(counts: &Arc<Mutex<Counts>>, uid: u32) -> Option<Slot> {
        let mut n = counts.lock().unwrap_or_else(|e| e.into_inner());
        let mine = n.per_uid.get(&uid).copied().unwrap_or(0);
        if mine >= n.max_per_uid || n.total >= n.max_total {
            return None;
        }
        n.total += 1;
        *n.per_uid.entry(uid).or_insert(0) += 1;
        Some(Slot {
            counts: Arc::clone(counts),
            uid,
        })
    }
}

/// One connection's place in the counts, given back on drop.
pub(crate) struct Slot {
    counts: Arc<Mutex<Counts>>,
    uid: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_uid.remove(&self.uid);
            }
        }
    }
}

pub(crate) fn errno_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

pub(crate) fn listen_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation, checked and owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno_err("socket"));
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero bytes are a valid sockaddr_un.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path[1..].iter_mut().zip(SOCKET_NAME.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + SOCKET_NAME.len();
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const a).cast(),
            len as libc::socklen_t,
        )
    } != 0
    {
        return Err(errno_err("bind"));
    }
    // SAFETY: a plain listen on our socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
        return Err(errno_err("listen"));
    }
    Ok(fd)
}

pub(crate) fn run(config: RelayConfig) -> Result<(), RelayError> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(RelayError::NotRoot);
    }
    let iface = read_interface(&config.interface).map_err(|why| RelayError::Interface {
        name: config.interface.clone(),
        why,
    })?;
    let lfd = listen_socket().map_err(RelayError::Listen)?;
    let rx_queues = crate::host::rx_queues(&config.interface);
    if config.direct {
        log!(
            "direct connections on: {} receive queues on {} (queue 0 is the relay's own), at most {} held per uid",
            rx_queues,
            config.interface,
            config.max_direct_per_uid
        );
    } else {
        log!("direct connections off (--no-direct): every connection stays on the relay's path");
    }
    if let Err(why) = crate::probe::spawn() {
        log!("{why}");
    }
    log!(
        "listening on @{SOCKET_NAME} for connections to {} over {} ({}/{}) (at most {} connections per uid, {} in all, {} requests a second per uid; timeout {} ms)",
        config.served,
        iface.name,
        iface.ip,
        iface.prefix_len,
        config.max_per_uid,
        config.max_total,
        config.max_requests_per_uid,
        config.timeout.as_millis()
    );
    let counts = Counts::new(config.max_per_uid, config.max_total);
    let journal = Journal::new();
    journal.spawn_summaries();
    let direct = config
        .direct
        .then(|| crate::direct::hub_part(&config, rx_queues));
    let hub = Arc::new(Hub {
        links: Mutex::new(LinkTable::new(config.max_links)),
        cv: Condvar::new(),
        pending: Mutex::new(HashMap::new()),
        timeout: config.timeout,
        iface,
        served: config.served,
        relay_key: config.key,
        journal,
        direct,
    });
    crate::direct::spawn_sweeper(&hub);
    let mut rate = RequestRate::new(config.max_requests_per_uid);
    let refuser = Refuser::spawn(Arc::clone(&hub));
    loop {
        // SAFETY: accept on our listening socket; the result is checked
        // and owned at once.
        let c = unsafe {
            libc::accept4(
                lfd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if c < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                log!("accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        // SAFETY: a new descriptor nothing else owns.
        let client = unsafe { OwnedFd::from_raw_fd(c) };
        let Some(cred) = peer_cred(client.as_raw_fd()) else {
            // The kernel always has a Unix socket's peer's
            // credentials: this is not a client's doing.
            log!("a client without credentials: dropped");
            continue;
        };
        if !rate.admit(cred.uid, Instant::now()) {
            hub.journal.client(
                cred.uid,
                &format!(
                    "uid {} (pid {}): refused: more than {} requests a second (--max-requests-per-uid)",
                    cred.uid, cred.pid, config.max_requests_per_uid
                ),
            );
            refuser.refuse(
                client,
                format!(
                    "more than {} requests a second",
                    config.max_requests_per_uid
                ),
            );
            continue;
        }
        let Some(slot) = Counts::take(&counts, cred.uid) else {
            hub.journal.client(
                cred.uid,
                &format!(
                    "uid {} (pid {}): refused: connection limit ({} per uid, {} in all)",
                    cred.uid, cred.pid, config.max_per_uid, config.max_total
                ),
            );
            refuser.refuse(client, "connection limit".into());
            continue;
        };
        let hub = Arc::clone(&hub);
        let spawned = std::thread::Builder::new()
            .name("relay-conn".into())
            .spawn(move || serve(&hub, client, cred, slot));
        if let Err(e) = spawned {
            log!("no thread for a client: {e}");
        }
    }
}

/// How long the refusing thread waits for a refused client's request.
pub(crate) const REFUSE_WAIT: Duration = Duration::from_millis(100);
/// Refused clients waiting for the refusing thread.
pub(crate) const REFUSALS_QUEUED: usize = 256;

/// The refusals made in the accepting loop, before a client has a
/// thread (past the requests a second, or the connection limits): one
/// thread reads each client's request (waiting at most
/// [`REFUSE_WAIT`]; its descriptors are closed) and only then replies
/// and closes, since a Unix socket closed with a message unread resets
/// its peer, which then never reads the reply. Past
/// [`REFUSALS_QUEUED`] waiting, a client gets its reply at once, and
/// may see its connection reset instead.
pub(crate) struct Refuser {
    pub(crate) queue: Option<mpsc::SyncSender<(OwnedFd, String)>>,
}

impl Refuser {
    /// The refusing thread; an accepting program's direct request it
    /// refuses is refused on `hub`'s rendezvous too, so that the
    /// connecting side's offer is answered at once.
    pub(crate) fn spawn(hub: Arc<Hub>) -> Refuser {
        let (tx, rx) = mpsc::sync_channel::<(OwnedFd, String)>(REFUSALS_QUEUED);
        let spawned = std::thread::Builder::new()
            .name("relay-refuse".into())
            .spawn(move || {
                for (client, why) in rx {
                    // Whatever came (or nothing in time), the reply
                    // follows; only a direct accept's key is looked at.
                    let asked = read_request(client.as_raw_fd(), REFUSE_WAIT);
                    if let (Ok(Some((Asked::Direct(req), _))), Some(d)) = (&asked, &hub.direct) {
                        if req.role == DirectRole::Accept {
                            crate::direct::refuse_offer(d, req.key);
                        }
                    }
                    reply(client.as_raw_fd(), &RelayReply::Refused(why));
                }
            });
        match spawned {
            Ok(_) => Refuser { queue: Some(tx) },
            Err(e) => {
                log!("no thread for refusals (each is replied at once): {e}");
                Refuser { queue: None }
            }
        }
    }

    /// Refuses `client` for `why` (its line is the caller's).
    pub(crate) fn refuse(&self, client: OwnedFd, why: String) {
        let queued = match &self.queue {
            Some(q) => q.try_send((client, why)),
            None => Err(mpsc::TrySendError::Full((client, why))),
        };
        if let Err(mpsc::TrySendError::Full((client, why)))
        | Err(mpsc::TrySendError::Disconnected((client, why))) = queued
        {
            reply(client.as_raw_fd(), &RelayReply::Refused(why));
        }
    }
}

/// A client's credentials.
#[derive(Clone, Copy)]
pub(crate) struct Cred {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
}

pub(crate) fn peer_cred(fd: RawFd) -> Option<Cred> {
    // SAFETY: all-zero bytes are a valid ucred.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` is valid for writes of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut c).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(Cred {
        pid: c.pid,
        uid: c.uid,
    })
}

pub(crate) fn serve(hub: &Arc<Hub>, client: OwnedFd, cred: Cred, slot: Slot) {
    let asker = Asker {
        uid: cred.uid,
        who: format!("uid {} (pid {})", cred.uid, cred.pid),
    };
    let fd = client.as_raw_fd();
    let refuse = |why: &dyn std::fmt::Display| {
        asker.say(hub, &format!("refused: {why}"));
        reply(fd, &RelayReply::Refused(why.to_string()));
    };
    let first = match read_request(fd, REQUEST_WAIT) {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(why) => return refuse(&why),
    };
    let first = match first {
        (Asked::Direct(d), fds) => {
            match direct_fd(fds) {
                Ok(tcp) => crate::direct::serve(hub, d, tcp, &client, &asker, slot),
                Err(why) => refuse(&why),
            }
            return;
        }
        (Asked::Relay(r), fds) => (r, fds),
    };
    let r = match first {
        (RelayRequest::Reserve { key, .. }, fds) if fds.is_empty() => {
            // Every connection shares the link: a reservation only
            // says the relay runs and has room under the limits.
            reply(fd, &RelayReply::Ok("reserved".into()));
            // The connect follows once the listener answered the
            // hello (which it may take a while to read).
            match read_request(fd, CONNECT_WAIT) {
                Ok(Some((Asked::Relay(req @ RelayRequest::Connect { key: k, .. }), fds)))
                    if k == key =>
                {
                    with_fds(req, fds)
                }
                Ok(Some(_)) => Err(RequestError::NotItsConnect),
                Ok(None) => return,
                Err(why) => Err(why),
            }
        }
        (req @ (RelayRequest::Listen { .. } | RelayRequest::Connect { .. }), fds) => {
            with_fds(req, fds)
        }
        (RelayRequest::Reserve { .. }, _) => Err(RequestError::ReserveWithDescriptors),
    };
    let r = match r {
        Ok(r) => r,
        Err(why) => return refuse(&why),
    };
    let opened = match &r.req {
        RelayRequest::Listen { .. } => listen(hub, r, &client, &asker),
        RelayRequest::Connect { .. } => connect(hub, r, &client, &asker),
        RelayRequest::Reserve { .. } => Err(before(OpenError::Reservation)),
    };
    match opened {
        Ok((conn, link)) => pump(&conn, &link, &client, &asker.who),
        // Its direct grant said so already.
        Err(f) if matches!(f.why, OpenError::WentDirect) => {}
        // The library already has its reply: a refusal now would only
        // be noise on its doorbell socket.
        Err(f) if f.replied => asker.say(hub, &format!("refused: {}", f.why)),
        Err(f) => refuse(&f.why),
    }
    drop(slot);
}

pub(crate) fn pump(conn: &Arc<Conn>, link: &Link, client: &OwnedFd, who: &str) {
    let who = format!("{who} [{:#x}]", conn.id);
    let t0 = Instant::now();
    let c2 = Arc::clone(conn);
    let incoming = std::thread::Builder::new()
        .name("relay-in".into())
        .spawn(move || {
            let r = queue_to_ring(&c2);
            if r.is_err() {
                // The sending side stops at once, and both programs
                // see the reset.
                c2.reset(true);
            }
            r
        });
    if incoming.is_err() {
        conn.reset(true);
    }
    let out = ring_to_flow(conn, client.as_raw_fd());
    if let Err(e) = &out {
        log!("{who}: sending: {e}");
        conn.reset(true);
    }
    let inn = match incoming {
        Ok(h) => h.join().unwrap_or(Err(PumpError::Panicked)),
        Err(e) => Err(PumpError::NoThread(e)),
    };
    if let Err(e) = &inn {
        log!("{who}: receiving: {e}");
        conn.reset(true);
    }
    if out.is_ok() && inn.is_ok() {
        conn.drain_tcp();
    }
    link.unregister(conn.id);
    log!(
        "{who}: connection {} after {} ms: relayed_out_bytes={} relayed_in_bytes={} discarded_bytes={} bells_asked={} bells_rung={} bells_here={}",
        if out.is_ok() && inn.is_ok() { "closed" } else { "reset" },
        t0.elapsed().as_millis(),
        conn.relayed_out_bytes.load(Ordering::Relaxed),
        conn.relayed_in_bytes.load(Ordering::Relaxed),
        conn.discarded_bytes.load(Ordering::Relaxed),
        conn.bells_asked.load(Ordering::Relaxed),
        conn.bells_rung.load(Ordering::Relaxed),
        conn.bells_here.load(Ordering::Relaxed),
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn connections_are_held_to_both_limits_and_given_back_on_drop() {
        let counts = Counts::new(2, 3);
        let a1 = Counts::take(&counts, 1).unwrap();
        let a2 = Counts::take(&counts, 1).unwrap();
        // Past its own limit, one uid is refused; another is not.
        assert!(Counts::take(&counts, 1).is_none());
        let b1 = Counts::take(&counts, 2).unwrap();
        // Past the limit in all, every uid is refused.
        assert!(Counts::take(&counts, 3).is_none());
        drop(a1);
        let c1 = Counts::take(&counts, 3).unwrap();
        drop((a2, b1, c1));
        let n = counts.lock().unwrap();
        assert_eq!(n.total, 0);
        assert!(n.per_uid.is_empty());
    }
}
