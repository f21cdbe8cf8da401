//! `netgap relay`: the per-host process that carries the preload library's
//! connections to other hosts over xdp's reliable transport.
//!
//! An unprivileged program cannot open AF_XDP sockets, and one such socket
//! per interface queue cannot be shared by many processes, so the relay, a
//! root process, owns the xdp side for its host (network namespace), as a
//! kernel module owns SDP's offload. It listens on the abstract Unix
//! socket `netgap-relay` (private to the namespace); a wrapped program's
//! library hands it, per connection, the region it made (the ring pair of
//! a same-host connection, in a sealed memfd) and a duplicate of the
//! connection's TCP socket, and asks it either to listen for the
//! connection's xdp flow (the accepting side: the reply is the target
//! `IP/MAC/FLOW`) or to open one to a target (the connecting side). Both
//! relays key the flow with the key the connector drew and sent in its
//! hello over the TCP connection: whoever can read that connection can
//! forge the flow's frames, as for xdp's own setup.
//!
//! Then the relay pumps: the program's ring to the flow, the flow to the
//! program's ring, in frames of its own (data, a wake-up request, the
//! end, a keep-alive). The program's doorbells arrive on its socket to
//! the relay; the relay wakes its program by asking the other relay to
//! send one byte on the TCP connection, the only thing that makes the
//! program's descriptor readable. The end: the program's last close
//! closes its relay socket; the relay sends what is left and an end
//! frame; the other relay delivers everything, then shuts the receiving
//! side of its TCP socket, which its program reads as the end of the
//! stream. A broken flow (the other relay gone: no frame, not even a
//! keep-alive, for the timeout) resets the TCP connection, which both
//! programs see as an error.
//!
//! Limits: clients are authenticated with `SO_PEERCRED` (uid recorded),
//! connections are capped per uid and in total, every request is one
//! fixed-size record, and a client that sends anything else is dropped
//! with one log line. The xdp flow must not use the interface the TCP
//! connection uses (while a flow is open, every frame of that interface's
//! queue goes to the relay), so a host needs a second link; and one xdp
//! socket per queue means one relayed connection at a time per host (a
//! second is refused and stays on the kernel's TCP).

use thiserror::Error;

/// Flags of `netgap relay`.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayArgs {
    /// Most connections one user's programs may have through the relay.
    #[arg(long, default_value_t = 16)]
    pub max_per_uid: u32,
    /// Most connections through the relay in all.
    #[arg(long, default_value_t = 64)]
    pub max_total: u32,
    /// A flow with no frame from the other relay for this long is broken
    /// (the relays send a keep-alive every third of it), in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// Why the relay could not run.
#[derive(Debug, Error)]
pub enum RelayError {
    /// Built without the xdp feature.
    #[error("relay: this netgap was built without the xdp feature (cargo build --features xdp)")]
    NoXdp,
    /// Not root.
    #[error("relay: must run as root (it opens AF_XDP sockets)")]
    NotRoot,
    /// A bad flag.
    #[error("relay: {0}")]
    Flag(String),
    /// The relay's socket.
    #[error("relay: cannot listen on @netgap-relay: {0} (is another relay running in this network namespace?)")]
    Listen(std::io::Error),
}

/// Runs the relay in the foreground until killed.
pub fn run(args: &RelayArgs) -> Result<(), RelayError> {
    if args.max_per_uid == 0 || args.max_total == 0 {
        return Err(RelayError::Flag(
            "--max-per-uid and --max-total must be at least 1".into(),
        ));
    }
    if !(300..=600_000).contains(&args.timeout_ms) {
        return Err(RelayError::Flag(format!(
            "--timeout-ms {}: want 300 to 600000",
            args.timeout_ms
        )));
    }
    imp::run(args)
}

#[cfg(not(feature = "xdp"))]
mod imp {
    use super::*;

    pub(super) fn run(_: &RelayArgs) -> Result<(), RelayError> {
        Err(RelayError::NoXdp)
    }
}

#[cfg(feature = "xdp")]
mod imp {
    use super::*;
    use crate::transport::xdp::Xdp;
    use crate::transport::{Flow, FlowConfig, FlowError, Receiver, Sender, Transport};
    use netgap_core::spec::{Mode, TransportOptions};
    use netgap_proto::dataproof::FlowKey;
    use netgap_proto::preload::{RelayReply, RelayRequest, PRELOAD_VERSION, RELAY_REQUEST_BYTES};
    use std::collections::HashMap;
    use std::io;
    use std::net::IpAddr;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// The abstract socket the libraries reach.
    const SOCKET_NAME: &str = "netgap-relay";
    /// How long a client has to send its request.
    const REQUEST_WAIT: Duration = Duration::from_secs(5);
    /// How long a reservation waits for the connection before to end.
    const RESERVE_WAIT: Duration = Duration::from_millis(1000);
    /// How long a listen waits for the connection before to end (the
    /// program waits meanwhile).
    const LISTEN_WAIT: Duration = Duration::from_millis(500);
    /// How long a reservation waits for its connect.
    const CONNECT_WAIT: Duration = Duration::from_secs(15);
    /// How long a listen waits for the other relay's flow.
    const ACCEPT_WAIT: Duration = Duration::from_secs(10);
    /// Largest data frame's payload.
    const CHUNK_BYTES: usize = 16 * 1024;
    /// Bytes of a frame header: kind, zero, payload length (u16).
    const FRAME_HEADER_BYTES: usize = 4;
    const KIND_DATA: u8 = 1;
    const KIND_BELL: u8 = 2;
    const KIND_END: u8 = 3;
    const KIND_PING: u8 = 4;

    /// The keep-alive interval for a timeout.
    fn ping_every(timeout: Duration) -> Duration {
        timeout / 3
    }

    macro_rules! log {
        ($($t:tt)*) => {
            eprintln!("netgap relay: {}", format!($($t)*))
        };
    }

    /// Connections per uid and in all.
    struct Counts {
        per_uid: HashMap<u32, u32>,
        total: u32,
    }

    /// One connection's place in the counts, given back on drop.
    struct Slot {
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

    fn errno_err(what: &str) -> io::Error {
        let e = io::Error::last_os_error();
        io::Error::new(e.kind(), format!("{what}: {e}"))
    }

    fn listen_socket() -> io::Result<OwnedFd> {
        // SAFETY: plain socket creation, checked and owned at once.
        let fd =
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
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

    pub(super) fn run(args: &RelayArgs) -> Result<(), RelayError> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(RelayError::NotRoot);
        }
        let lfd = listen_socket().map_err(RelayError::Listen)?;
        if let Err(why) = crate::relay_probe::spawn() {
            log!("{why}");
        }
        log!(
            "listening on @{SOCKET_NAME} (at most {} connections per uid, {} in all; timeout {} ms)",
            args.max_per_uid,
            args.max_total,
            args.timeout_ms
        );
        let counts = Arc::new(Mutex::new(Counts {
            per_uid: HashMap::new(),
            total: 0,
        }));
        let timeout = Duration::from_millis(args.timeout_ms);
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
                log!("a client without credentials: dropped");
                continue;
            };
            let slot = {
                let mut n = counts.lock().unwrap_or_else(|e| e.into_inner());
                let mine = n.per_uid.get(&cred.uid).copied().unwrap_or(0);
                if mine >= args.max_per_uid || n.total >= args.max_total {
                    drop(n);
                    log!(
                        "uid {} (pid {}): refused: connection limit ({} per uid, {} in all)",
                        cred.uid,
                        cred.pid,
                        args.max_per_uid,
                        args.max_total
                    );
                    reply(
                        client.as_raw_fd(),
                        &RelayReply::Refused("connection limit".into()),
                    );
                    continue;
                }
                n.total += 1;
                *n.per_uid.entry(cred.uid).or_insert(0) += 1;
                Slot {
                    counts: Arc::clone(&counts),
                    uid: cred.uid,
                }
            };
            let spawned = std::thread::Builder::new()
                .name("relay-conn".into())
                .spawn(move || serve(client, cred, slot, timeout));
            if let Err(e) = spawned {
                log!("no thread for a client: {e}");
            }
        }
    }

    /// A client's credentials.
    #[derive(Clone, Copy)]
    struct Cred {
        pid: i32,
        uid: u32,
    }

    fn peer_cred(fd: RawFd) -> Option<Cred> {
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

    fn reply(fd: RawFd, r: &RelayReply) {
        let b = r.encode();
        // SAFETY: `b` is valid for reads of its length.
        let _ = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
    }

    /// The request and its two descriptors (the region, the TCP socket).
    struct Request {
        req: RelayRequest,
        region: OwnedFd,
        tcp: OwnedFd,
    }

    /// Reads one request and the descriptors beside it, waiting at most
    /// `wait`; Ok(None): the client closed without one (a library checking
    /// that the relay runs, or giving up a reservation).
    fn read_request(
        fd: RawFd,
        wait: Duration,
    ) -> Result<Option<(RelayRequest, Vec<OwnedFd>)>, String> {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis() as libc::c_int;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
            return Err("no request in time".into());
        }
        let mut buf = [0u8; RELAY_REQUEST_BYTES + 1];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for a few descriptors, so that too many are seen (and
        // closed), not cut.
        let mut control = [0u8; 128];
        // SAFETY: all-zero bytes are a valid msghdr.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len();
        // SAFETY: a complete msghdr over live buffers.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(format!("recvmsg: {}", io::Error::last_os_error()));
        }
        // Every descriptor received is owned (and so closed) whatever
        // follows.
        let mut fds: Vec<OwnedFd> = Vec::new();
        // SAFETY: walking the control buffer the kernel filled, with the
        // CMSG macros over `msg`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                        let fd = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 {
            return Err("a request or its descriptors were cut".into());
        }
        let req =
            RelayRequest::decode(&buf[..n as usize]).map_err(|e| format!("bad request: {e}"))?;
        Ok(Some((req, fds)))
    }

    /// A request that must come with the region and the TCP socket.
    fn with_fds(req: RelayRequest, mut fds: Vec<OwnedFd>) -> Result<Request, String> {
        if fds.len() != 2 {
            return Err(format!(
                "{} descriptors with the request, want 2",
                fds.len()
            ));
        }
        let tcp = fds.pop().ok_or("no socket")?;
        let region = fds.pop().ok_or("no region")?;
        Ok(Request { req, region, tcp })
    }

    /// One relayed connection at a time: a host's xdp socket holds its
    /// interface's queue.
    struct Gate {
        busy: Mutex<bool>,
        cv: std::sync::Condvar,
    }

    /// The gate, held until dropped.
    struct Held<'a>(&'a Gate);

    impl Drop for Held<'_> {
        fn drop(&mut self) {
            *self.0.busy.lock().unwrap_or_else(|e| e.into_inner()) = false;
            self.0.cv.notify_one();
        }
    }

    static GATE: Gate = Gate {
        busy: Mutex::new(false),
        cv: std::sync::Condvar::new(),
    };

    impl Gate {
        /// Takes the gate, waiting at most `wait` for the connection
        /// before to end.
        fn take(&self, wait: Duration) -> Option<Held<'_>> {
            let deadline = Instant::now() + wait;
            let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            while *busy {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                busy = self
                    .cv
                    .wait_timeout(busy, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            *busy = true;
            Some(Held(self))
        }
    }

    fn serve(client: OwnedFd, cred: Cred, slot: Slot, timeout: Duration) {
        let who = format!("uid {} (pid {})", cred.uid, cred.pid);
        let fd = client.as_raw_fd();
        let busy = |what: &str| {
            let why = format!("busy: one relayed connection at a time ({what})");
            log!("{who}: refused: {why}");
            reply(fd, &RelayReply::Refused(why));
        };
        let first = match read_request(fd, REQUEST_WAIT) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(why) => {
                log!("{who}: dropped: {why}");
                return;
            }
        };
        let (r, _held) = match first {
            (RelayRequest::Reserve { key, .. }, fds) if fds.is_empty() => {
                let Some(held) = GATE.take(RESERVE_WAIT) else {
                    return busy("reserve");
                };
                reply(fd, &RelayReply::Ok("reserved".into()));
                // The connect follows once the listener answered the
                // hello (which it may take a while to read).
                let next = match read_request(fd, CONNECT_WAIT) {
                    Ok(Some(r)) => r,
                    Ok(None) => return,
                    Err(why) => {
                        log!("{who}: dropped: {why}");
                        return;
                    }
                };
                let r = match next {
                    (req @ RelayRequest::Connect { key: k, .. }, fds) if k == key => {
                        with_fds(req, fds)
                    }
                    _ => Err("after a reservation, anything but its connect".into()),
                };
                match r {
                    Ok(r) => (r, held),
                    Err(why) => {
                        log!("{who}: dropped: {why}");
                        return;
                    }
                }
            }
            (req @ (RelayRequest::Listen { .. } | RelayRequest::Connect { .. }), fds) => {
                let r = match with_fds(req, fds) {
                    Ok(r) => r,
                    Err(why) => {
                        log!("{who}: dropped: {why}");
                        return;
                    }
                };
                let Some(held) = GATE.take(LISTEN_WAIT) else {
                    return busy("listen or connect");
                };
                (r, held)
            }
            (RelayRequest::Reserve { .. }, _) => {
                log!("{who}: dropped: descriptors with a reservation");
                return;
            }
        };
        let conn = match open(&r, timeout, client.as_raw_fd(), &who) {
            Ok(c) => c,
            Err(why) => {
                log!("{who}: refused: {why}");
                reply(client.as_raw_fd(), &RelayReply::Refused(why));
                return;
            }
        };
        pump(conn, client, &who, timeout);
        drop(slot);
    }

    /// A relayed connection once its flow is open.
    struct Relayed {
        ring: FarEnd,
        tcp: OwnedFd,
        flow: Box<dyn Flow>,
    }

    fn ring_of(req: &RelayRequest) -> u32 {
        match req {
            RelayRequest::Listen { ring_bytes, .. }
            | RelayRequest::Reserve { ring_bytes, .. }
            | RelayRequest::Connect { ring_bytes, .. } => *ring_bytes,
        }
    }

    fn key_of(req: &RelayRequest) -> FlowKey {
        match req {
            RelayRequest::Listen { key, .. }
            | RelayRequest::Reserve { key, .. }
            | RelayRequest::Connect { key, .. } => FlowKey::from_bytes(*key),
        }
    }

    /// Checks the descriptors, maps the region, opens and keys the flow.
    fn open(r: &Request, timeout: Duration, client: RawFd, who: &str) -> Result<Relayed, String> {
        let ring_bytes = ring_of(&r.req) as usize;
        check_tcp(r.tcp.as_raw_fd())?;
        let ring = FarEnd::map(r.region.as_raw_fd(), ring_bytes)?;
        let config = FlowConfig {
            mode: Mode::Event,
            options: TransportOptions::default(),
            io_timeout: timeout,
        };
        let (tcp_local, tcp_peer) = tcp_addrs(r.tcp.as_raw_fd())?;
        let mut flow = match &r.req {
            RelayRequest::Reserve { .. } => {
                return Err("a reservation names no flow".into());
            }
            RelayRequest::Listen { .. } => {
                let ip = other_interface_ip(tcp_local)?;
                let mut l = Xdp
                    .listen(&config, ip)
                    .map_err(|e| format!("xdp listen: {e}"))?;
                let target = l.addr();
                log!("{who}: listening for the flow of a connection from {tcp_peer} at {target}");
                reply(client, &RelayReply::Ok(target));
                // The library has moved the connection here: a flow that
                // never comes resets it, or the program would wait on its
                // ring for ever.
                l.accept(ACCEPT_WAIT).map_err(|e| {
                    reset_tcp(r.tcp.as_raw_fd());
                    format!("xdp accept: {e}")
                })?
            }
            RelayRequest::Connect { target, .. } => {
                let t = crate::transport::xdp::parse_addr(target)
                    .map_err(|e| format!("target {target}: {e}"))?;
                if t.ip == tcp_peer {
                    return Err(format!(
                        "target {target} is the TCP connection's own peer address: the flow would take that interface's frames"
                    ));
                }
                let f = Xdp
                    .connect(&config, target)
                    .map_err(|e| format!("xdp connect to {target}: {e}"))?;
                log!("{who}: flow open to {target} for a connection to {tcp_peer}");
                f
            }
        };
        flow.bind_session(&key_of(&r.req)).map_err(|e| {
            reset_tcp(r.tcp.as_raw_fd());
            format!("keying the flow: {e}")
        })?;
        if matches!(r.req, RelayRequest::Connect { .. }) {
            reply(client, &RelayReply::Ok("-".into()));
        }
        let tcp = r
            .tcp
            .try_clone()
            .map_err(|e| format!("keeping the TCP socket: {e}"))?;
        Ok(Relayed { ring, tcp, flow })
    }

    /// The descriptor must be a TCP stream socket.
    fn check_tcp(fd: RawFd) -> Result<(), String> {
        let opt = |name| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `v` is valid for writes of `len` bytes.
            let r = unsafe {
                libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut len)
            };
            (r == 0).then_some(v)
        };
        if opt(libc::SO_TYPE) != Some(libc::SOCK_STREAM)
            || opt(libc::SO_PROTOCOL) != Some(libc::IPPROTO_TCP)
        {
            return Err("the connection's descriptor is not a TCP socket".into());
        }
        Ok(())
    }

    fn tcp_addrs(fd: RawFd) -> Result<(IpAddr, IpAddr), String> {
        let local = nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(fd)
            .map_err(|e| format!("getsockname: {e}"))?;
        let peer = nix::sys::socket::getpeername::<nix::sys::socket::SockaddrStorage>(fd)
            .map_err(|e| format!("getpeername: {e}"))?;
        let ip = |a: &nix::sys::socket::SockaddrStorage| -> Option<IpAddr> {
            if let Some(v4) = a.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            let v6 = a.as_sockaddr_in6()?.ip();
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        };
        match (ip(&local), ip(&peer)) {
            (Some(l), Some(p)) => Ok((l, p)),
            _ => Err("the TCP socket is not an IP connection".into()),
        }
    }

    /// An IPv4 address of this host on another interface than the one
    /// holding `tcp_local` (the flow's frames must not take the TCP
    /// connection's interface), not loopback.
    fn other_interface_ip(tcp_local: IpAddr) -> Result<IpAddr, String> {
        let addrs: Vec<_> = nix::ifaddrs::getifaddrs()
            .map_err(|e| format!("getifaddrs: {e}"))?
            .collect();
        let ip_of = |a: &nix::ifaddrs::InterfaceAddress| -> Option<IpAddr> {
            a.address
                .as_ref()?
                .as_sockaddr_in()
                .map(|s| IpAddr::V4(s.ip()))
        };
        let tcp_iface = addrs
            .iter()
            .find(|a| ip_of(a) == Some(tcp_local))
            .map(|a| a.interface_name.clone());
        let mut found: Vec<(String, IpAddr)> = addrs
            .iter()
            .filter_map(|a| Some((a.interface_name.clone(), ip_of(a)?)))
            .filter(|(name, ip)| !ip.is_loopback() && Some(name) != tcp_iface.as_ref())
            .collect();
        found.sort();
        found.first().map(|(_, ip)| *ip).ok_or_else(|| {
            "no interface besides the TCP connection's own for the flow (a host needs a second link)"
                .into()
        })
    }

    /// State both pumping threads share.
    struct Shared {
        ring: FarEnd,
        tcp: OwnedFd,
        tx: Mutex<Box<dyn Sender>>,
        /// The program waits on its ring: the other relay must ring its
        /// TCP socket.
        bell_pending: AtomicBool,
        /// The connection broke: both threads stop.
        broken: AtomicBool,
        /// The program closed its last descriptor of the connection (or
        /// died): what still arrives for it is dropped, as the kernel
        /// drops data for a closed socket.
        program_gone: AtomicBool,
        discarded_bytes: AtomicU64,
        relayed_out_bytes: AtomicU64,
        relayed_in_bytes: AtomicU64,
        bells_asked: AtomicU64,
        bells_rung: AtomicU64,
    }

    impl Shared {
        fn send_frame(tx: &mut Box<dyn Sender>, kind: u8, payload: &[u8]) -> Result<(), FlowError> {
            let mut h = [0u8; FRAME_HEADER_BYTES];
            h[0] = kind;
            h[2..4].copy_from_slice(&(payload.len() as u16).to_le_bytes());
            tx.send_all(&h)?;
            if !payload.is_empty() {
                tx.send_all(payload)?;
            }
            Ok(())
        }

        /// Asks the other relay to wake this side's program: at once if the
        /// sender is free, else by the thread that holds it.
        fn ask_bell(&self) -> Result<(), FlowError> {
            self.bell_pending.store(true, Ordering::SeqCst);
            if let Ok(mut tx) = self.tx.try_lock() {
                self.flush_bell(&mut tx)?;
            }
            Ok(())
        }

        fn flush_bell(&self, tx: &mut Box<dyn Sender>) -> Result<(), FlowError> {
            if self.bell_pending.swap(false, Ordering::SeqCst) {
                self.bells_asked.fetch_add(1, Ordering::Relaxed);
                Self::send_frame(tx, KIND_BELL, &[])?;
            }
            Ok(())
        }

        /// Sends a byte on the TCP connection: the other host's program
        /// wakes.
        fn ring_tcp(&self) {
            let b = [1u8];
            // SAFETY: a one-byte buffer; a failure (the connection gone)
            // shows up in the programs' own calls.
            let r = unsafe {
                libc::send(
                    self.tcp.as_raw_fd(),
                    b.as_ptr().cast(),
                    1,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r == 1 {
                self.bells_rung.fetch_add(1, Ordering::Relaxed);
            }
        }

        /// Resets the TCP connection: both programs see an error.
        fn reset(&self) {
            if self.broken.swap(true, Ordering::SeqCst) {
                return;
            }
            reset_tcp(self.tcp.as_raw_fd());
            self.ring.closing();
        }
    }

    /// Resets the TCP connection on `fd` (shared with the program): both
    /// programs see an error.
    fn reset_tcp(fd: RawFd) {
        // SAFETY: all-zero bytes are a valid sockaddr; AF_UNSPEC
        // disconnects a TCP socket, sending a reset.
        let mut a: libc::sockaddr = unsafe { std::mem::zeroed() };
        a.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        // SAFETY: `a` is a valid sockaddr of its size.
        unsafe {
            libc::connect(
                fd,
                &raw const a,
                std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
            )
        };
    }

    fn pump(conn: Relayed, client: OwnedFd, who: &str, timeout: Duration) {
        let t0 = Instant::now();
        let Relayed { ring, tcp, flow } = conn;
        let (tx, mut rx) = flow.into_halves();
        let shared = Arc::new(Shared {
            ring,
            tcp,
            tx: Mutex::new(tx),
            bell_pending: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            program_gone: AtomicBool::new(false),
            discarded_bytes: AtomicU64::new(0),
            relayed_out_bytes: AtomicU64::new(0),
            relayed_in_bytes: AtomicU64::new(0),
            bells_asked: AtomicU64::new(0),
            bells_rung: AtomicU64::new(0),
        });
        let s2 = Arc::clone(&shared);
        let incoming = std::thread::Builder::new()
            .name("relay-in".into())
            .spawn(move || {
                let r = flow_to_ring(&s2, &mut *rx);
                if r.is_err() {
                    // The sending side stops at once, and both programs
                    // see the reset.
                    s2.reset();
                }
                r
            });
        let out = ring_to_flow(&shared, client.as_raw_fd(), timeout);
        if let Err(e) = &out {
            log!("{who}: sending: {e}");
            shared.reset();
        }
        let inn = match incoming {
            Ok(h) => h
                .join()
                .unwrap_or_else(|_| Err("the receiving thread panicked".into())),
            Err(e) => Err(format!("no receiving thread: {e}")),
        };
        if let Err(e) = &inn {
            log!("{who}: receiving: {e}");
            shared.reset();
        }
        log!(
            "{who}: connection {} after {} ms: relayed_out_bytes={} relayed_in_bytes={} discarded_bytes={} bells_asked={} bells_rung={}",
            if out.is_ok() && inn.is_ok() { "closed" } else { "reset" },
            t0.elapsed().as_millis(),
            shared.relayed_out_bytes.load(Ordering::Relaxed),
            shared.relayed_in_bytes.load(Ordering::Relaxed),
            shared.discarded_bytes.load(Ordering::Relaxed),
            shared.bells_asked.load(Ordering::Relaxed),
            shared.bells_rung.load(Ordering::Relaxed),
        );
    }

    /// Whether `fd` (the client socket) is readable within `ms`, and
    /// drains it; Err: the program closed its last descriptor of the
    /// connection (end of file or hang-up).
    fn wait_client(fd: RawFd, ms: libc::c_int) -> Result<(), ()> {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r <= 0 {
            return Ok(());
        }
        let mut scratch = [0u8; 256];
        loop {
            // SAFETY: `scratch` is valid for writes of its length.
            let n = unsafe {
                libc::recv(
                    fd,
                    scratch.as_mut_ptr().cast(),
                    scratch.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                continue;
            }
            if n == 0 {
                return Err(());
            }
            let e = io::Error::last_os_error().raw_os_error();
            return if matches!(e, Some(libc::EAGAIN) | Some(libc::EINTR)) {
                Ok(())
            } else {
                Err(())
            };
        }
    }

    /// The program's ring to the flow, until the program is done with the
    /// connection (then what is left and the end frame) or the flow
    /// breaks.
    fn ring_to_flow(s: &Shared, client: RawFd, timeout: Duration) -> Result<(), String> {
        let mut buf = vec![0u8; CHUNK_BYTES];
        let ping = ping_every(timeout);
        let mut last_sent = Instant::now();
        let mut closing = false;
        loop {
            if s.broken.load(Ordering::SeqCst) {
                return Err("the connection broke".into());
            }
            let m = s
                .ring
                .read(&mut buf)
                .map_err(|Corrupt| "the program's ring is corrupt")?;
            if m.bytes > 0 {
                let mut tx = s.tx.lock().unwrap_or_else(|e| e.into_inner());
                Shared::send_frame(&mut tx, KIND_DATA, &buf[..m.bytes])
                    .map_err(|e| e.to_string())?;
                s.relayed_out_bytes
                    .fetch_add(m.bytes as u64, Ordering::Relaxed);
                if m.wake_peer {
                    s.bell_pending.store(true, Ordering::SeqCst);
                }
                s.flush_bell(&mut tx).map_err(|e| e.to_string())?;
                last_sent = Instant::now();
                continue;
            }
            if closing {
                let mut tx = s.tx.lock().unwrap_or_else(|e| e.into_inner());
                s.flush_bell(&mut tx).map_err(|e| e.to_string())?;
                Shared::send_frame(&mut tx, KIND_END, &[]).map_err(|e| e.to_string())?;
                return Ok(());
            }
            if s.bell_pending.load(Ordering::SeqCst) {
                let mut tx = s.tx.lock().unwrap_or_else(|e| e.into_inner());
                s.flush_bell(&mut tx).map_err(|e| e.to_string())?;
                last_sent = Instant::now();
            }
            if last_sent.elapsed() >= ping {
                let mut tx = s.tx.lock().unwrap_or_else(|e| e.into_inner());
                Shared::send_frame(&mut tx, KIND_PING, &[]).map_err(|e| e.to_string())?;
                last_sent = Instant::now();
            }
            s.ring.want_data();
            if s.ring
                .readable()
                .map_err(|Corrupt| "the program's ring is corrupt")?
                > 0
            {
                continue;
            }
            let left = ping.saturating_sub(last_sent.elapsed());
            // Also look at the sender's queue of bells now and then.
            let ms = left.as_millis().clamp(1, 50) as libc::c_int;
            if wait_client(client, ms).is_err() {
                // Every byte the program wrote was published before its
                // close: one more pass sends them.
                closing = true;
                s.program_gone.store(true, Ordering::SeqCst);
            }
        }
    }

    /// The flow to the program's ring, until the other relay's end frame
    /// (then the program reads the end of the stream) or the flow breaks.
    fn flow_to_ring(s: &Shared, rx: &mut dyn Receiver) -> Result<(), String> {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let mut h = [0u8; FRAME_HEADER_BYTES];
            match rx.recv_exact(&mut h) {
                Ok(()) => {}
                Err(e) => return Err(format!("the other relay: {e}")),
            }
            let len = usize::from(u16::from_le_bytes([h[2], h[3]]));
            let kind = h[0];
            let ok_len = match kind {
                KIND_DATA => (1..=CHUNK_BYTES).contains(&len),
                KIND_BELL | KIND_END | KIND_PING => len == 0,
                _ => false,
            };
            if !ok_len || h[1] != 0 {
                return Err(format!(
                    "a bad frame from the other relay (kind {kind}, {len} bytes)"
                ));
            }
            match kind {
                KIND_DATA => {
                    rx.recv_exact(&mut buf[..len])
                        .map_err(|e| format!("the other relay: {e}"))?;
                    put_all(s, &buf[..len])?;
                    s.relayed_in_bytes.fetch_add(len as u64, Ordering::Relaxed);
                }
                KIND_BELL => s.ring_tcp(),
                KIND_PING => {}
                _ => {
                    // The end: everything is in the ring; the program reads
                    // the end of the stream once it has read it.
                    // SAFETY: a plain shutdown of our duplicate of the
                    // connection's socket.
                    unsafe { libc::shutdown(s.tcp.as_raw_fd(), libc::SHUT_RD) };
                    s.ring.closing();
                    return Ok(());
                }
            }
        }
    }

    /// Puts all of `data` into the program's ring, waiting for room.
    fn put_all(s: &Shared, mut data: &[u8]) -> Result<(), String> {
        let mut round = 0u32;
        while !data.is_empty() {
            if s.broken.load(Ordering::SeqCst) {
                return Err("the connection broke".into());
            }
            if s.program_gone.load(Ordering::SeqCst) {
                s.discarded_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok(());
            }
            let m = s
                .ring
                .write(data)
                .map_err(|Corrupt| "the program's ring is corrupt")?;
            if m.wake_peer {
                s.ask_bell().map_err(|e| e.to_string())?;
            }
            if m.bytes > 0 {
                data = &data[m.bytes..];
                round = 0;
                continue;
            }
            // The program reads slower than the flow: look again after 1,
            // 2, 4 … 16 ms (its doorbells go to the other thread).
            std::thread::sleep(Duration::from_millis(1 << round.min(4)));
            round += 1;
        }
        Ok(())
    }

    /// The program broke the ring's invariants.
    struct Corrupt;

    /// Bytes moved and whether the program waits for them.
    struct Moved {
        bytes: usize,
        wake_peer: bool,
    }

    /// The relay's end of a library's region (the layout of the library's
    /// `channel` module: a 4096-byte header, two 4096-byte control
    /// blocks, the two rings' data): the relay consumes ring 0 (the
    /// program's output) and produces ring 1.
    struct FarEnd {
        base: *mut u8,
        len: usize,
        capacity: u64,
    }

    // SAFETY: addresses into a shared mapping, used through atomics and
    // the ring protocol; one thread consumes ring 0, one produces ring 1.
    unsafe impl Send for FarEnd {}
    // SAFETY: as above.
    unsafe impl Sync for FarEnd {}

    impl Drop for FarEnd {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `map`, unmapped once.
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
    }

    const PAGE_BYTES: usize = 4096;
    const REGION_MAGIC: u64 = u64::from_le_bytes(*b"NGPRSHM\0");
    /// Offsets in a control block: head, tail, data waiter, space waiter,
    /// the producer's closing hint, each on its own 128-byte line (the
    /// library's `channel` tests pin the same values).
    const HEAD: usize = 0;
    const TAIL: usize = 128;
    const DATA_WAITER: usize = 256;
    const SPACE_WAITER: usize = 384;
    const CLOSING: usize = 512;
    /// Waiter word bits: a waiter in poll or epoll (woken by a doorbell on
    /// the TCP connection), a blocking waiter asleep on the word itself
    /// (woken by `FUTEX_WAKE`).
    const WAIT_FD: u32 = 1;
    const WAIT_FUTEX: u32 = 2;

    /// Wakes every thread, in any process, asleep on `word`.
    fn futex_wake(word: &AtomicU32) {
        // SAFETY: FUTEX_WAKE on a valid, aligned word of a shared mapping
        // (a shared futex: the program's sleepers are in another process);
        // it only reads the address.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            )
        };
    }

    /// Clears a waiter word after the index it waits on moved: wakes the
    /// program's blocking sleepers at once and says whether a waiter in
    /// poll or epoll needs a doorbell (as the library's channel does).
    fn take_waiters(word: &AtomicU32) -> bool {
        if word.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let old = word.swap(0, Ordering::AcqRel);
        if old & WAIT_FUTEX != 0 {
            futex_wake(word);
        }
        old & WAIT_FD != 0
    }

    impl FarEnd {
        /// Checks the region (a memfd sealed against shrinking and
        /// growing, of exactly the size its rings need, with the library's
        /// header) and maps it.
        fn map(fd: RawFd, capacity: usize) -> Result<FarEnd, String> {
            let len = 3 * PAGE_BYTES + 2 * capacity;
            // SAFETY: all-zero bytes are a valid stat; fstat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `st` is valid for writes.
            let r = unsafe { libc::fstat(fd, &mut st) };
            // SAFETY: a plain fcntl on our descriptor.
            let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
            let sealed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
            if r != 0
                || st.st_mode & libc::S_IFMT != libc::S_IFREG
                || st.st_size != len as libc::off_t
                || seals < 0
                || seals & sealed != sealed
            {
                return Err("the region is not a sealed memfd of the announced size".into());
            }
            // SAFETY: a fresh shared mapping of `len` bytes of a file that
            // is exactly `len` bytes and cannot shrink.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(format!(
                    "mapping the region: {}",
                    io::Error::last_os_error()
                ));
            }
            let end = FarEnd {
                base: p.cast(),
                len,
                capacity: capacity as u64,
            };
            let ok = end.u64_at(0).load(Ordering::Acquire) == REGION_MAGIC
                && end.u32_at(8).load(Ordering::Relaxed) == u32::from(PRELOAD_VERSION)
                && end.u64_at(16).load(Ordering::Relaxed) == capacity as u64;
            if !ok {
                return Err("the region's header is not as announced".into());
            }
            Ok(end)
        }

        fn u64_at(&self, off: usize) -> &AtomicU64 {
            // SAFETY: every offset used is 8-aligned inside the first three
            // pages of the mapping, which lives as long as `self`.
            unsafe { &*self.base.add(off).cast::<AtomicU64>() }
        }

        fn u32_at(&self, off: usize) -> &AtomicU32 {
            // SAFETY: as `u64_at`, 4-aligned.
            unsafe { &*self.base.add(off).cast::<AtomicU32>() }
        }

        fn ctl(ring: usize, field: usize) -> usize {
            PAGE_BYTES * (1 + ring) + field
        }

        fn data(&self, ring: usize) -> *mut u8 {
            // SAFETY: the data regions lie inside the mapping.
            unsafe {
                self.base
                    .add(3 * PAGE_BYTES + ring * self.capacity as usize)
            }
        }

        fn filled(&self, ring: usize) -> Result<(u64, u64), Corrupt> {
            let tail = self.u64_at(Self::ctl(ring, TAIL)).load(Ordering::Acquire);
            let head = self.u64_at(Self::ctl(ring, HEAD)).load(Ordering::Acquire);
            if head < tail || head - tail > self.capacity {
                return Err(Corrupt);
            }
            Ok((head - tail, tail))
        }

        fn readable(&self) -> Result<usize, Corrupt> {
            self.filled(0).map(|(n, _)| n as usize)
        }

        /// Copies up to `buf.len()` bytes of the program's output out.
        fn read(&self, buf: &mut [u8]) -> Result<Moved, Corrupt> {
            let (filled, tail) = self.filled(0)?;
            let n = (buf.len() as u64).min(filled) as usize;
            if n == 0 {
                return Ok(Moved {
                    bytes: 0,
                    wake_peer: false,
                });
            }
            let cap = self.capacity as usize;
            let off = (tail & (self.capacity - 1)) as usize;
            let first = n.min(cap - off);
            // SAFETY: `off + first ≤ cap` and `n - first ≤ cap`: both
            // pieces lie in ring 0's data; `buf` holds `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(self.data(0).add(off), buf.as_mut_ptr(), first);
                std::ptr::copy_nonoverlapping(self.data(0), buf.as_mut_ptr().add(first), n - first);
            }
            self.u64_at(Self::ctl(0, TAIL))
                .store(tail + n as u64, Ordering::Release);
            fence(Ordering::SeqCst);
            let wake_peer = take_waiters(self.u32_at(Self::ctl(0, SPACE_WAITER)));
            Ok(Moved {
                bytes: n,
                wake_peer,
            })
        }

        /// Copies as much of `data` as fits into the program's input.
        fn write(&self, data: &[u8]) -> Result<Moved, Corrupt> {
            let (filled, _) = self.filled(1)?;
            let head = self.u64_at(Self::ctl(1, HEAD)).load(Ordering::Relaxed);
            let n = ((self.capacity - filled) as usize).min(data.len());
            if n == 0 {
                return Ok(Moved {
                    bytes: 0,
                    wake_peer: false,
                });
            }
            let cap = self.capacity as usize;
            let off = (head & (self.capacity - 1)) as usize;
            let first = n.min(cap - off);
            // SAFETY: both pieces lie in ring 1's data and in free space
            // the program will not read before the head moves.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), self.data(1).add(off), first);
                std::ptr::copy_nonoverlapping(data.as_ptr().add(first), self.data(1), n - first);
            }
            self.u64_at(Self::ctl(1, HEAD))
                .store(head + n as u64, Ordering::Release);
            fence(Ordering::SeqCst);
            let wake_peer = take_waiters(self.u32_at(Self::ctl(1, DATA_WAITER)));
            Ok(Moved {
                bytes: n,
                wake_peer,
            })
        }

        /// Announces a wait for the program's output (the program's
        /// doorbell comes on the client socket).
        fn want_data(&self) {
            self.u32_at(Self::ctl(0, DATA_WAITER))
                .fetch_or(WAIT_FD, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }

        /// The far side ended or the connection broke: the closing hint on
        /// the program's input ring, and its blocking sleepers woken, so
        /// they look at the TCP socket (for its end or reset) at once
        /// instead of after their sleep's time limit.
        fn closing(&self) {
            self.u32_at(Self::ctl(1, CLOSING))
                .store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            for w in [
                self.u32_at(Self::ctl(1, DATA_WAITER)),
                self.u32_at(Self::ctl(0, SPACE_WAITER)),
            ] {
                if w.load(Ordering::Acquire) & WAIT_FUTEX != 0 {
                    futex_wake(w);
                }
            }
        }
    }
}
