//! A connection moved onto a shared-memory channel: the program's reads and
//! writes on its descriptor, with the kernel TCP socket under that
//! descriptor kept for wake-ups (doorbell bytes) and for the end of the
//! connection (its FIN or reset, which the kernel sends when the last
//! process holding the socket closes it or dies). A relayed connection's
//! end of the stream is its relay's mark in the ring's header instead,
//! behind the bytes the relays carry; its reset is still the kernel's.

use crate::channel::{Channel, Corrupt, Moved, Role};
use crate::errno::{errno, Errno};
use crate::log::log_line;
use crate::real;
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;

/// A taken-over connection.
pub(crate) struct Conn {
    channel: Channel,
    role: Role,
    /// The program asked for non-blocking I/O on the descriptor.
    nonblocking: AtomicBool,
    /// The kernel socket reached end of file (the peer closed or shut
    /// down its sending side).
    peer_eof: AtomicBool,
    /// Serialises readers (the ring has one consumer).
    read_lock: Mutex<()>,
    /// Serialises writers (the ring has one producer).
    write_lock: Mutex<()>,
    sent_bytes: AtomicU64,
    received_bytes: AtomicU64,
    doorbells_sent: AtomicU64,
    /// The program's `TCP_NODELAY` and `TCP_CORK` values, recorded but
    /// not applied: the kernel socket carries only doorbells, which must
    /// go at once.
    nodelay: AtomicBool,
    cork: AtomicBool,
    /// The connector sent its hello and has not read the listener's last
    /// answer yet: its writes fill the ring but ring no doorbell (on a
    /// refusal the kernel stream must hold only the program's bytes).
    offered: AtomicBool,
    /// The offer was refused or broke: the connection is the kernel's
    /// again. Set under the writers' lock after the ring's bytes went to
    /// the kernel socket, so a writer that waited for the lock meanwhile
    /// sends there too ([`Sent::Kernel`]), after them.
    given_back: AtomicBool,
    /// The program closed its last descriptor while the connection was
    /// offered: a library thread ends it (`setup::close_offered`).
    orphaned: AtomicBool,
    /// While offered: where the exchange stands. The lock serialises the
    /// reading of the answers.
    offer: Mutex<Option<Offer>>,
    /// The program shut down its sending side: its writes fail with EPIPE.
    wr_shut: AtomicBool,
    /// The program shut down its receiving side: its reads end at what the
    /// ring holds.
    rd_shut: AtomicBool,
    /// An error the kernel socket reported while the library drained it
    /// (in a poll), kept for the program's next read, as the kernel keeps
    /// it until a read takes it.
    pending_err: AtomicI32,
    /// The process forked while the connection lived: another process may
    /// hold it, so this one's last close is not the kernel's.
    shared: AtomicBool,
    /// A corrupt peer was logged once already.
    corrupt_logged: AtomicBool,
    /// The region's file, kept open without close-on-exec for as long as
    /// the connection lives: a program that keeps the connection's
    /// descriptor across `exec` keeps this too, and the library in the new
    /// image maps it again (`inherit`). -1 once closed (by the program,
    /// which owns every descriptor number).
    pub(crate) region_fd: AtomicI32,
    /// Through a relay (`relay`): the socket to the host's relay, which
    /// takes the doorbells and sees the connection end when the last
    /// process holding it closes it; -1 for shm. A relayed connection has
    /// no region file of its own (`region_fd` is -1): it does not survive
    /// `exec` (the bell is close-on-exec, so the relay sees the program
    /// gone and ends the connection). A relayed connector's offer sets it
    /// once the listener answered and the relay took the connection.
    bell: AtomicI32,
    /// The offer went direct: set under the writers' lock, after the
    /// bytes in the ring went out on the direct connection, so a writer
    /// that found this connection in the table before the switch writes
    /// on the direct connection, after those bytes, never into the ring
    /// nobody reads any more.
    #[cfg(feature = "xdp")]
    direct: std::sync::OnceLock<std::sync::Arc<crate::direct::Direct>>,
    /// A relayed offer's end, told to a program asleep in poll or select:
    /// an eventfd made readable for good when the offer ends. The
    /// library's thread that watches the answer (`setup`) may take the
    /// answer off the kernel socket before the program's wait sees it, and
    /// then only this wakes the wait to look at the connection's new path.
    /// None for a shm offer (no thread takes its answer) or when no
    /// eventfd could be made (the wait then sees the answer only).
    offer_end: Option<std::os::fd::OwnedFd>,
}

/// Where a write on a connection went.
pub(crate) enum Sent {
    /// Into the ring: this many bytes.
    Bytes(usize),
    /// Nowhere yet: the offer was refused while this write waited for the
    /// ring; the write is the kernel socket's.
    Kernel,
    /// Nowhere yet: the connection went direct (see [`Conn::went_direct`]);
    /// the write is the direct connection's.
    #[cfg(feature = "xdp")]
    Direct(std::sync::Arc<crate::direct::Direct>),
}

mod offer;
pub(crate) use offer::{Offer, OfferOnClose, OfferPath, RelayOffer};

/// How long a closing end waits for doorbells already on their way to it.
const QUIESCE_LIMIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Reads a boolean TCP option of the kernel socket.
fn tcp_flag(fd: c_int, opt: c_int) -> bool {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: `v` is valid for writes of `len` bytes; getsockopt is not
    // interposed.
    let r = unsafe {
        real::getsockopt()(
            fd,
            libc::IPPROTO_TCP,
            opt,
            std::ptr::from_mut(&mut v).cast(),
            &mut len,
        )
    };
    r == 0 && v != 0
}

/// Sets a boolean TCP option of the kernel socket.
fn set_tcp_flag(fd: c_int, opt: c_int, on: bool) {
    let v = c_int::from(on);
    // SAFETY: `v` is valid for reads of its size; setsockopt is not
    // interposed. A failure leaves the doorbells possibly delayed, not
    // wrong.
    unsafe {
        real::setsockopt()(
            fd,
            libc::IPPROTO_TCP,
            opt,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<c_int>() as libc::socklen_t,
        )
    };
}

impl Conn {
    /// The connection on `fd` over `channel`; the kernel socket's Nagle
    /// and cork are turned off (and the program's settings of them kept
    /// for `getsockopt`).
    ///
    /// `region_fd` is the region's file, which the connection keeps (see
    /// [`Conn::region_closed`]); its inode and the socket's are recorded
    /// in the region for a program that execs with the descriptor. -1: no
    /// file kept (a relayed connection, which does not survive `exec`).
    pub(crate) fn new(
        fd: c_int,
        channel: Channel,
        role: Role,
        nonblocking: bool,
        region_fd: c_int,
    ) -> Conn {
        channel.set_socket_ino(socket_ino(fd));
        let nodelay = tcp_flag(fd, libc::TCP_NODELAY);
        let cork = tcp_flag(fd, libc::TCP_CORK);
        set_tcp_flag(fd, libc::TCP_CORK, false);
        set_tcp_flag(fd, libc::TCP_NODELAY, true);
        Conn {
            nodelay: AtomicBool::new(nodelay),
            cork: AtomicBool::new(cork),
            channel,
            role,
            nonblocking: AtomicBool::new(nonblocking),
            peer_eof: AtomicBool::new(false),
            read_lock: Mutex::new(()),
            write_lock: Mutex::new(()),
            sent_bytes: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
            doorbells_sent: AtomicU64::new(0),
            offered: AtomicBool::new(false),
            given_back: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            offer: Mutex::new(None),
            wr_shut: AtomicBool::new(false),
            rd_shut: AtomicBool::new(false),
            pending_err: AtomicI32::new(0),
            shared: AtomicBool::new(false),
            corrupt_logged: AtomicBool::new(false),
            region_fd: AtomicI32::new(region_fd),
            bell: AtomicI32::new(-1),
            #[cfg(feature = "xdp")]
            direct: std::sync::OnceLock::new(),
            offer_end: None,
        }
    }

    /// The library's `errno` for a corrupt peer, logged once per
    /// connection (a peer that breaks the ring on every call must not
    /// fill the log).
    fn corrupt(&self, fd: c_int) -> Errno {
        if !self.corrupt_logged.swap(true, Ordering::Relaxed) {
            log_line!(
                "fd {fd}: the peer broke the shared ring's invariants; the connection fails with EIO"
            );
        }
        libc::EIO
    }

    /// Another process may hold the connection from now on (the process
    /// forks, or the connection was kept across exec).
    pub(crate) fn set_shared(&self) {
        self.shared.store(true, Ordering::Relaxed);
    }

    /// The connection goes through the host's relay, reached on `bell`
    /// (which it now owns).
    pub(crate) fn with_bell(self, bell: c_int) -> Conn {
        self.bell.store(bell, Ordering::SeqCst);
        self
    }

    /// The region file's descriptor (-1 once closed).
    pub(crate) fn region_fd(&self) -> c_int {
        self.region_fd.load(Ordering::Acquire)
    }

    /// The program closed (or replaced) the region's descriptor number:
    /// the connection no longer owns it.
    pub(crate) fn region_closed(&self, fd: c_int) {
        let _ = self
            .region_fd
            .compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// The program sets a TCP option: `TCP_NODELAY` and `TCP_CORK` are
    /// recorded only (true: handled here).
    pub(crate) fn set_tcp_option(&self, opt: c_int, on: bool) -> bool {
        match opt {
            libc::TCP_NODELAY => self.nodelay.store(on, Ordering::Relaxed),
            libc::TCP_CORK => self.cork.store(on, Ordering::Relaxed),
            _ => return false,
        }
        true
    }

    /// The recorded value of `TCP_NODELAY` or `TCP_CORK`.
    pub(crate) fn tcp_option(&self, opt: c_int) -> Option<bool> {
        match opt {
            libc::TCP_NODELAY => Some(self.nodelay.load(Ordering::Relaxed)),
            libc::TCP_CORK => Some(self.cork.load(Ordering::Relaxed)),
            _ => None,
        }
    }

    /// Whether the program asked for non-blocking I/O.
    pub(crate) fn nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    /// Records the program's `O_NONBLOCK` choice.
    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    /// Bytes a read would return now (FIONREAD).
    pub(crate) fn readable(&self, fd: c_int) -> Result<usize, Errno> {
        self.channel.readable().map_err(|Corrupt| self.corrupt(fd))
    }

    /// Whether the ring toward the peer has no room (a corrupt ring counts
    /// as room: the write then reports it).
    pub(crate) fn write_full(&self) -> bool {
        self.channel.tx_full().unwrap_or(false)
    }

    /// Whether a reader would not block: data, the end of the stream, or
    /// an error to report.
    pub(crate) fn read_ready(&self) -> bool {
        self.channel.readable().map_or(true, |n| n > 0)
            || self.peer_eof.load(Ordering::Relaxed)
            || self.rd_shut.load(Ordering::Relaxed)
            || self.pending_err.load(Ordering::Relaxed) != 0
    }

    /// The kernel socket's error kept from a drain, if any: it is the
    /// program's to read once (as the kernel reports an error once).
    fn take_err(&self) -> Option<Errno> {
        if self.pending_err.load(Ordering::Relaxed) == 0 {
            return None;
        }
        match self.pending_err.swap(0, Ordering::AcqRel) {
            0 => None,
            e => Some(e),
        }
    }

    /// Whether an error waits for the program's next read (a poll reports
    /// it as POLLERR, as the kernel does until a read takes it).
    pub(crate) fn has_error(&self) -> bool {
        self.pending_err.load(Ordering::Relaxed) != 0
    }

    /// Announces a wait for data (before the program sleeps in poll or
    /// epoll); returns whether data came meanwhile.
    pub(crate) fn arm_read(&self) -> bool {
        self.channel.want_data();
        self.read_ready()
    }

    /// The socket to the relay of a relayed connection (-1 for shm).
    pub(crate) fn bell(&self) -> c_int {
        self.bell.load(Ordering::SeqCst)
    }

    /// [`Conn::arm_read`] for a wait in an epoll where the relay socket is
    /// registered beside the connection: the relay wakes it on this host.
    pub(crate) fn arm_read_bell(&self) -> bool {
        self.channel.want_data_bell();
        self.read_ready()
    }

    /// [`Conn::arm_read_bell`] when the wait watches the relay socket,
    /// else [`Conn::arm_read`].
    pub(crate) fn arm_read_watched(&self, bell_watched: bool) -> bool {
        if bell_watched {
            self.arm_read_bell()
        } else {
            self.arm_read()
        }
    }

    /// Drains the bytes the relay sent on its socket to wake this end.
    fn drain_bell(&self) {
        let mut scratch = [0u8; 64];
        loop {
            // SAFETY: `scratch` is valid for writes of its length; the
            // relay socket is this connection's own.
            let r = unsafe {
                real::recv()(
                    self.bell(),
                    scratch.as_mut_ptr().cast(),
                    scratch.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if r <= 0 {
                return;
            }
        }
    }

    /// Whether the descriptor is really readable when the kernel socket
    /// says so: doorbells with an empty ring are drained and the answer is
    /// no (a program told "readable" must find data or the end of the
    /// stream, or it may take the EAGAIN for an error).
    pub(crate) fn settle(&self, fd: c_int) -> bool {
        // Given back to the kernel while the caller waited (a relayed
        // offer refused, seen by the library's thread that watches the
        // answer): the socket's bytes are the program's, never doorbells.
        if self.given_back.load(Ordering::SeqCst) {
            return true;
        }
        if self.bell() >= 0 {
            self.drain_bell();
        }
        if self.read_ready() {
            return true;
        }
        self.drain(fd);
        self.read_ready()
    }

    /// Sends one doorbell byte to the peer, or to the relay for a relayed
    /// connection (none while offered: see [`Conn::offer_accepted`]).
    fn ring(&self, fd: c_int) {
        if self.offered.load(Ordering::SeqCst) {
            return;
        }
        let bell = self.bell();
        self.ring_on(if bell >= 0 { bell } else { fd });
    }

    /// Sends one doorbell byte on `fd`.
    fn ring_on(&self, fd: c_int) {
        let b = [1u8];
        // SAFETY: a one-byte buffer on the stack; a failure (the peer gone)
        // is seen by the next read or write as the socket's end or error.
        let r = unsafe {
            real::send()(
                fd,
                b.as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r == 1 {
            self.doorbells_sent.fetch_add(1, Ordering::Relaxed);
        } else if r < 0 && errno() == libc::ECONNRESET {
            // The send took the socket's reset, which is the program's to
            // read: it is kept for its next read.
            let _ = self.pending_err.compare_exchange(
                0,
                libc::ECONNRESET,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Drains doorbell bytes from the kernel socket; notes its end of file,
    /// and keeps its error for the program's next read. A reset after the
    /// peer closed or shut down its sending side is the end of the stream:
    /// such a reset comes from a doorbell that raced the peer's close.
    fn drain(&self, fd: c_int) {
        if self.given_back.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.drain_bytes(fd) {
            if e == libc::ECONNRESET && self.channel.peer_end().fin {
                self.peer_eof.store(true, Ordering::Relaxed);
            } else {
                let _ =
                    self.pending_err
                        .compare_exchange(0, e, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }

    /// Reads every byte waiting on the kernel socket; notes its end of
    /// file. Err: the socket's error.
    fn drain_bytes(&self, fd: c_int) -> Result<(), Errno> {
        let mut scratch = [0u8; 256];
        loop {
            // SAFETY: `scratch` is valid for writes of its length.
            let r = unsafe {
                real::recv()(
                    fd,
                    scratch.as_mut_ptr().cast(),
                    scratch.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            // Read on to EAGAIN even after a short read: a FIN behind the
            // doorbells must be seen now, as an edge-triggered epoll
            // (nginx) reports it only once.
            if r > 0 {
                continue;
            }
            if r == 0 {
                if self.kernel_end_counts() {
                    self.peer_eof.store(true, Ordering::Relaxed);
                }
                return Ok(());
            }
            let e = errno();
            return match e {
                libc::EAGAIN | libc::EINTR => Ok(()),
                _ => Err(e),
            };
        }
    }

    /// Whether the kernel socket's end of file is the end of the stream.
    /// A relayed connection's bytes cross the relays while its FIN
    /// crosses the kernel's TCP, which can be first: its end is the
    /// relay's mark, made once every byte before it is in the ring (the
    /// relay shuts down the socket's receiving side then, to wake a
    /// poller). With its relay gone no mark can come, and the socket's
    /// end stands.
    fn kernel_end_counts(&self) -> bool {
        let bell = self.bell();
        bell < 0 || self.channel.peer_end().fin || hung_up(bell)
    }

    /// `recv` on the channel into `iov`: data if any, 0 at the end of the
    /// stream, else EAGAIN or a wait, as the descriptor's mode says.
    ///
    /// # Safety
    ///
    /// Every iovec valid for writes of its length.
    pub(crate) unsafe fn recv(
        &self,
        fd: c_int,
        iov: &[libc::iovec],
        flags: c_int,
    ) -> Result<usize, Errno> {
        let peek = flags & libc::MSG_PEEK != 0;
        let dontwait = flags & libc::MSG_DONTWAIT != 0;
        let want: usize = iov.iter().map(|v| v.iov_len).sum();
        if want == 0 {
            return Ok(0);
        }
        let mut round = 0;
        let mut spun = false;
        loop {
            {
                let g = self.read_lock.lock().unwrap_or_else(|p| p.into_inner());
                // SAFETY: the caller's contract.
                let m =
                    unsafe { self.channel.read(iov, peek) }.map_err(|Corrupt| self.corrupt(fd))?;
                if m.bytes > 0 {
                    self.after_read(fd, &m, peek);
                    return Ok(m.bytes);
                }
                if self.peer_eof.load(Ordering::Relaxed) || self.rd_shut.load(Ordering::Relaxed) {
                    return Ok(0);
                }
                if let Some(e) = self.take_err() {
                    return Err(e);
                }
                let may_wait = !dontwait && !self.nonblocking.load(Ordering::Relaxed);
                if may_wait && !spun {
                    // Before announcing a wait (which costs the peer a
                    // doorbell and this end a sleep), look at the ring a
                    // little while: an answer a few microseconds away then
                    // crosses with no system call at either end.
                    spun = true;
                    drop(g);
                    spin_until(|| self.read_ready());
                    continue;
                }
                if may_wait && round == 0 && !self.channel.peer_closing() {
                    // A blocking reader sleeps on the ring's waiter word:
                    // the writer's futex wake costs far less than a
                    // doorbell and its wake-up. The kernel socket (for its
                    // end) is looked at after each sleep that brought no
                    // data, and before the first when the peer hinted it
                    // is closing (see `Conn::closing`).
                    let armed = self.channel.want_data_futex();
                    if self
                        .channel
                        .readable()
                        .map_err(|Corrupt| self.corrupt(fd))?
                        > 0
                    {
                        continue;
                    }
                    drop(g);
                    self.channel.sleep_data(armed, 1);
                    round += 1;
                    continue;
                }
                self.drain(fd);
                if let Some(e) = self.take_err() {
                    return Err(e);
                }
                if may_wait {
                    if self.peer_eof.load(Ordering::Relaxed) {
                        if self
                            .channel
                            .readable()
                            .map_err(|Corrupt| self.corrupt(fd))?
                            > 0
                        {
                            continue;
                        }
                        return Ok(0);
                    }
                    let armed = self.channel.want_data_futex();
                    if self
                        .channel
                        .readable()
                        .map_err(|Corrupt| self.corrupt(fd))?
                        > 0
                    {
                        continue;
                    }
                    drop(g);
                    let ms = 1u32 << round.min(6);
                    round += 1;
                    self.channel.sleep_data(armed, ms);
                    continue;
                }
                self.channel.want_data();
                if self
                    .channel
                    .readable()
                    .map_err(|Corrupt| self.corrupt(fd))?
                    > 0
                {
                    continue;
                }
                if self.peer_eof.load(Ordering::Relaxed) {
                    // Everything the peer wrote before its FIN is in the
                    // ring already (published before the close).
                    if self
                        .channel
                        .readable()
                        .map_err(|Corrupt| self.corrupt(fd))?
                        > 0
                    {
                        continue;
                    }
                    return Ok(0);
                }
                // Non-blocking: the program's poll or epoll waits.
                return Err(libc::EAGAIN);
            }
        }
    }

    fn after_read(&self, fd: c_int, m: &Moved, peek: bool) {
        if !peek {
            self.received_bytes
                .fetch_add(m.bytes as u64, Ordering::Relaxed);
        }
        self.ring_moved(fd, m);
    }

    /// The doorbell a move asked for, if any.
    fn ring_moved(&self, fd: c_int, m: &Moved) {
        if m.wake_peer {
            self.ring(fd);
            self.channel.rang();
        }
    }

    /// `send` of `iov` on the channel: as much as fits, else EAGAIN or a
    /// wait for space; EPIPE once the peer is gone; nothing when the
    /// connection went direct meanwhile ([`Sent::Direct`]).
    ///
    /// # Safety
    ///
    /// Every iovec valid for reads of its length.
    pub(crate) unsafe fn send(
        &self,
        fd: c_int,
        iov: &[libc::iovec],
        flags: c_int,
    ) -> Result<Sent, Errno> {
        let want: usize = iov.iter().map(|v| v.iov_len).sum();
        if want == 0 {
            return Ok(Sent::Bytes(0));
        }
        let dontwait = flags & libc::MSG_DONTWAIT != 0;
        self.send_with(fd, dontwait, |ch| {
            // SAFETY: the caller's contract.
            unsafe { ch.write(iov) }.map(Ok)
        })
    }

    /// `sendfile` from `in_fd` (at `*offset`, or its file position) of at
    /// most `count` bytes, read straight into the ring ([`Sent::Direct`]
    /// when the connection went direct meanwhile: nothing read).
    pub(crate) fn sendfile(
        &self,
        fd: c_int,
        in_fd: c_int,
        offset: Option<&mut libc::off_t>,
        count: usize,
    ) -> Result<Sent, Errno> {
        if count == 0 {
            return Ok(Sent::Bytes(0));
        }
        let mut offset = offset;
        self.send_with(fd, false, |ch| {
            ch.write_with(count, |dst, n| {
                // SAFETY: `dst` is valid for writes of `n` bytes (the ring's
                // free space); pread/read are not interposed.
                let r = unsafe {
                    match offset.as_deref() {
                        Some(&off) => libc::pread(in_fd, dst.cast(), n, off),
                        None => libc::read(in_fd, dst.cast(), n),
                    }
                };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let k = r as usize;
                if let Some(off) = offset.as_deref_mut() {
                    *off += r as libc::off_t;
                }
                Ok(k)
            })
        })
    }

    /// The write loop shared by `send` and `sendfile`: `put` moves bytes
    /// into the ring (zero when full).
    fn send_with(
        &self,
        fd: c_int,
        dontwait: bool,
        mut put: impl FnMut(&Channel) -> Result<std::io::Result<Moved>, Corrupt>,
    ) -> Result<Sent, Errno> {
        if self.wr_shut.load(Ordering::Relaxed) || self.shut_down_elsewhere() {
            return Err(libc::EPIPE);
        }
        let mut round = 0;
        let mut had_room = false;
        loop {
            {
                let g = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
                if self.given_back.load(Ordering::SeqCst) {
                    return Ok(Sent::Kernel);
                }
                #[cfg(feature = "xdp")]
                if let Some(d) = self.direct.get() {
                    return Ok(Sent::Direct(d.clone()));
                }
                let m = put(&self.channel)
                    .map_err(|Corrupt| self.corrupt(fd))?
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                if m.bytes > 0 {
                    self.sent_bytes.fetch_add(m.bytes as u64, Ordering::Relaxed);
                    self.ring_moved(fd, &m);
                    return Ok(Sent::Bytes(m.bytes));
                }
                if !self.channel.tx_full().map_err(|Corrupt| self.corrupt(fd))? {
                    // Room now: either the input file ended, or the ring
                    // was full when `put` looked and the consumer made
                    // room since. Only this side produces, so a second
                    // `put` sees the room: nothing moved then is the end
                    // of the input file.
                    if had_room {
                        return Ok(Sent::Bytes(0));
                    }
                    had_room = true;
                    continue;
                }
                if self.peer_gone(fd) {
                    return Err(libc::EPIPE);
                }
                if !dontwait && !self.nonblocking.load(Ordering::Relaxed) {
                    // A blocking writer sleeps on the ring's waiter word
                    // (see `Conn::recv`), looking at the peer's socket
                    // between sleeps (`peer_gone` above).
                    let armed = self.channel.want_space_futex();
                    if !self.channel.tx_full().map_err(|Corrupt| self.corrupt(fd))? {
                        continue;
                    }
                    drop(g);
                    let ms = 1u32 << round.min(6);
                    round += 1;
                    self.channel.sleep_space(armed, ms);
                    continue;
                }
                self.channel.want_space();
                if !self.channel.tx_full().map_err(|Corrupt| self.corrupt(fd))? {
                    continue;
                }
                // Non-blocking: the program's poll or epoll waits.
                return Err(libc::EAGAIN);
            }
        }
    }

    /// Whether another process that holds this relayed connection shut
    /// down its sending side (its mark in the ring): a write then fails
    /// as the kernel's would, rather than go into a ring whose end the
    /// relay has sent.
    fn shut_down_elsewhere(&self) -> bool {
        self.bell() >= 0 && self.channel.own_end().fin
    }

    /// Whether the peer's socket is closed for good (a reset or a full
    /// hang-up), seen without reading anything. Asked only when the ring is
    /// full: a peer that sent its FIN gets a doorbell as a probe, which a
    /// closed socket answers with a reset, so a writer to a dead peer ends
    /// with EPIPE instead of waiting for space forever.
    fn peer_gone(&self, fd: c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        let r = unsafe { real::poll()(&mut p, 1, 0) };
        if r > 0 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            return true;
        }
        // The probe goes on the kernel socket itself (not a relay's bell),
        // and never while offered (see `Conn::offer_accepted`).
        if r > 0 && p.revents & libc::POLLRDHUP != 0 && !self.offered.load(Ordering::SeqCst) {
            self.ring_on(fd);
        }
        false
    }

    /// The program closes its last descriptor `fd` of the connection in
    /// this process (the caller then closes it), as the kernel would: a
    /// ring left with unread bytes resets the connection; otherwise the
    /// doorbells already sent to this end are drained first, so that none
    /// is left unread on the socket (which makes the kernel send a reset
    /// where the program's close sends a FIN). Where another process may
    /// hold the connection (after a fork) it is its last close that counts:
    /// this one only marks the side as ended for the peer. A relayed
    /// connection's close is its relay's to carry, when the relay socket
    /// hangs up at the last close in any process: nothing is marked. The
    /// peer's blocking sleepers are woken to look at the kernel socket.
    pub(crate) fn last_close(&self, fd: c_int) {
        // Gone direct: the ring is no longer the connection's, and the
        // direct connection's close is its own (`Direct`'s drop).
        #[cfg(feature = "xdp")]
        if self.went_direct().is_some() {
            return;
        }
        let shared = self.shared.load(Ordering::Relaxed);
        if lingers_zero(fd) {
            // The program asked for a reset: its peer reads one.
            self.channel.mark_end(false, !shared);
        } else if self.bell() >= 0 {
            // A relayed connection's end is its relay socket's hang-up,
            // at the last close in any process; a mark would end it for
            // a process that still holds it (the relay takes the mark
            // as a shutdown).
        } else if shared {
            self.channel.mark_end(true, false);
        } else if self.channel.readable().is_ok_and(|n| n > 0) {
            abortive(fd);
            self.channel.mark_end(false, true);
        } else {
            self.channel.mark_end(true, true);
            self.channel.quiesce(QUIESCE_LIMIT);
            let _ = self.drain_bytes(fd);
        }
    }

    /// Wakes the peer's blocking sleepers to look at the kernel socket
    /// (after this end's close: a FIN does not wake a futex).
    pub(crate) fn wake_peer(&self) {
        self.channel.wake_peer_sleepers();
    }

    /// The program shut down the connection: its sending side (`how`
    /// SHUT_WR or SHUT_RDWR) ends for the peer, its receiving side (SHUT_RD
    /// or SHUT_RDWR) ends its reads.
    pub(crate) fn shut(&self, how: c_int) {
        if how == libc::SHUT_RD || how == libc::SHUT_RDWR {
            self.rd_shut.store(true, Ordering::Relaxed);
        }
        if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
            self.wr_shut.store(true, Ordering::Relaxed);
            self.channel.mark_end(true, false);
            self.channel.wake_peer_sleepers();
            let bell = self.bell();
            if bell >= 0 {
                // The relay looks at the mark when woken: the end
                // follows the ring's last bytes at once.
                self.ring_on(bell);
            }
        }
    }

    /// Whether the peer closed the connection for good (in the one process
    /// that held it) and the kernel socket shows its end: the program's
    /// writes then go to the kernel socket, which answers them as the
    /// kernel answers writes to a closed peer (a reset, then EPIPE).
    pub(crate) fn peer_closed_for_writes(&self, fd: c_int) -> bool {
        self.channel.peer_end().closed && hung_up(fd)
    }

    /// One line with the connection's counters and what the kernel socket
    /// carried (the hello, the answer and the doorbells), when the
    /// program closes its last descriptor of it. A relayed connection's
    /// line says "relayed" (its `shm_` counters are the ring it shares
    /// with the relay), so a reader of the log never counts it as a
    /// same-host shm connection.
    pub(crate) fn log_close(&self, fd: c_int) {
        // A close that raced the offer's move to a direct connection (the
        // offer over, the descriptor not yet the direct one's): the
        // connection is the direct one, whose bytes go there.
        #[cfg(feature = "xdp")]
        if let Some(d) = self.went_direct() {
            log_line!(
                "fd {fd}: connection closed as it moved to direct on queue {}: its bytes and its close go there",
                d.queue()
            );
            return;
        }
        let (tcp_out, tcp_in) = tcp_bytes(fd);
        let role = match self.role {
            Role::Connector => "connector",
            Role::Listener => "listener",
        };
        let kind = if self.bell() >= 0 { "relayed" } else { "shm" };
        log_line!(
            "fd {fd}: {kind} connection closed ({role}): shm_sent_bytes={} shm_received_bytes={} doorbells_sent={} kernel_tcp_sent_bytes={tcp_out} kernel_tcp_received_bytes={tcp_in}",
            self.sent_bytes.load(Ordering::Relaxed),
            self.received_bytes.load(Ordering::Relaxed),
            self.doorbells_sent.load(Ordering::Relaxed),
        );
    }
}

/// Whether the other end of the socket `fd` (a relay socket, or the
/// connection's own) hung up.
fn hung_up(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    let r = unsafe { real::poll()(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Whether the program set a zero linger on the socket `fd` (its close
/// then resets the connection).
pub(crate) fn lingers_zero(fd: c_int) -> bool {
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: `l` is valid for writes of `len` bytes.
    let r = unsafe {
        real::getsockopt()(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_mut(&mut l).cast(),
            &mut len,
        )
    };
    r == 0 && l.l_onoff != 0 && l.l_linger == 0
}

/// Makes the next close of the socket `fd` send a reset, as the kernel's
/// close of a connection with unread bytes does.
fn abortive(fd: c_int) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` is valid for reads of its size; setsockopt is not
    // interposed for SOL_SOCKET options of the library's own.
    unsafe {
        real::setsockopt()(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&l).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// The kernel socket's byte counters (`tcpi_bytes_acked`,
/// `tcpi_bytes_received` of `TCP_INFO`, at offsets 120 and 128 of
/// `struct tcp_info` since Linux 4.1); zeros if unavailable.
fn tcp_bytes(fd: c_int) -> (u64, u64) {
    let mut buf = [0u8; 232];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is valid for writes of `len` bytes; getsockopt is not
    // interposed.
    let r = unsafe {
        real::getsockopt()(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 || (len as usize) < 136 {
        return (0, 0);
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&buf[at..at + 8]);
        u64::from_ne_bytes(w)
    };
    (word(120), word(128))
}

/// The inode of the socket `fd` (0 if unknown): the same in every process
/// that holds the socket, before and after `exec`.
pub(crate) fn socket_ino(fd: c_int) -> u64 {
    // SAFETY: all-zero bytes are a valid stat; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes.
    if unsafe { libc::fstat(fd, &mut st) } == 0 {
        st.st_ino
    } else {
        0
    }
}

/// How often a spinning reader gives up its CPU once (`sched_yield`): on
/// a machine with more runnable threads than cores the peer it waits for
/// may need that CPU to answer; with a core idle the call returns at once.
const SPIN_YIELD_NS: u128 = 5_000;

/// Spins until `ready` or the library's spin time (`NETGAP_PRELOAD_SPIN_US`)
/// passes, reading the clock every few dozen looks and yielding the CPU
/// every [`SPIN_YIELD_NS`]; returns the last answer of `ready`.
pub(crate) fn spin_until(mut ready: impl FnMut() -> bool) -> bool {
    let budget_ns = u128::from(crate::settings().spin_ns);
    if budget_ns == 0 || !SPIN_GATE.open() {
        return ready();
    }
    let ok = spin_for(budget_ns, &mut ready);
    SPIN_GATE.record(ok);
    ok
}

/// Whether spinning pays in this process: after [`SPIN_MISSES_TO_CLOSE`]
/// spins in a row that ran out without the peer answering (on a machine
/// with more runnable threads than cores the peer often cannot run while
/// this end spins, and the spin only delays it), waits sleep at once, with
/// one spin in [`SPIN_PROBE_EVERY`] to notice when spinning pays again.
struct SpinGate {
    misses: std::sync::atomic::AtomicU32,
    skipped: std::sync::atomic::AtomicU32,
}

/// Failed spins in a row after which waits stop spinning.
const SPIN_MISSES_TO_CLOSE: u32 = 4;
/// While closed, one wait in this many spins.
const SPIN_PROBE_EVERY: u32 = 64;

static SPIN_GATE: SpinGate = SpinGate {
    misses: std::sync::atomic::AtomicU32::new(0),
    skipped: std::sync::atomic::AtomicU32::new(0),
};

impl SpinGate {
    fn open(&self) -> bool {
        if self.misses.load(Ordering::Relaxed) < SPIN_MISSES_TO_CLOSE {
            return true;
        }
        self.skipped
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SPIN_PROBE_EVERY)
    }

    fn record(&self, ok: bool) {
        if ok {
            self.misses.store(0, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn spin_for(budget_ns: u128, ready: &mut impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    let mut next_yield = SPIN_YIELD_NS;
    loop {
        for _ in 0..32 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        let spent = start.elapsed().as_nanos();
        if spent >= budget_ns {
            return ready();
        }
        if spent >= next_yield {
            next_yield = spent + SPIN_YIELD_NS;
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
}
