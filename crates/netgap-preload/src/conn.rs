//! A connection moved onto a shared-memory channel: the program's reads and
//! writes on its descriptor, with the kernel TCP socket under that
//! descriptor kept for wake-ups (doorbell bytes) and for the end of the
//! connection (its FIN or reset, which the kernel sends when the last
//! process holding the socket closes it or dies).

use crate::channel::{Channel, Corrupt, Moved, Role};
use crate::log::log_line;
use crate::real;
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Through a relay (`relay`): the socket to the host's relay, which
    /// takes the doorbells and sees the connection end when the last
    /// process holding it closes it; -1 for shm.
    bell: c_int,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.bell >= 0 {
            // SAFETY: the relay socket this connection owns, closed once.
            unsafe { real::close()(self.bell) };
        }
    }
}

/// An `errno` value.
pub(crate) type Errno = c_int;

/// The library's `errno` for a corrupt peer.
fn corrupt(fd: c_int) -> Errno {
    log_line!(
        "fd {fd}: the peer broke the shared ring's invariants; the connection fails with EIO"
    );
    libc::EIO
}

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
    pub(crate) fn new(fd: c_int, channel: Channel, role: Role, nonblocking: bool) -> Conn {
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
            bell: -1,
        }
    }

    /// The connection goes through the host's relay, reached on `bell`
    /// (which it now owns).
    pub(crate) fn with_bell(mut self, bell: c_int) -> Conn {
        self.bell = bell;
        self
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

    /// Records the program's `O_NONBLOCK` choice.
    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    /// Bytes a read would return now (FIONREAD).
    pub(crate) fn readable(&self, fd: c_int) -> Result<usize, Errno> {
        self.channel.readable().map_err(|Corrupt| corrupt(fd))
    }

    /// Whether a reader would not block: data, or the end of the stream.
    pub(crate) fn read_ready(&self) -> bool {
        self.channel.readable().map_or(true, |n| n > 0) || self.peer_eof.load(Ordering::Relaxed)
    }

    /// Announces a wait for data (before the program sleeps in poll or
    /// epoll); returns whether data came meanwhile.
    pub(crate) fn arm_read(&self) -> bool {
        self.channel.want_data();
        self.read_ready()
    }

    /// Whether the descriptor is really readable when the kernel socket
    /// says so: doorbells with an empty ring are drained and the answer is
    /// no (a program told "readable" must find data or the end of the
    /// stream, or it may take the EAGAIN for an error).
    pub(crate) fn settle(&self, fd: c_int) -> bool {
        if self.read_ready() {
            return true;
        }
        if self.drain(fd).is_err() {
            // The socket's error: a read reports it.
            return true;
        }
        self.read_ready()
    }

    /// Sends one doorbell byte to the peer (or the relay).
    fn ring(&self, fd: c_int) {
        self.ring_on(if self.bell >= 0 { self.bell } else { fd });
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
        }
    }

    /// Drains doorbell bytes from the kernel socket; notes its end of file.
    /// Err: the socket's error (a reset).
    fn drain(&self, fd: c_int) -> Result<(), Errno> {
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
            if r > 0 {
                continue;
            }
            if r == 0 {
                self.peer_eof.store(true, Ordering::Relaxed);
                return Ok(());
            }
            let e = errno();
            return match e {
                libc::EAGAIN | libc::EINTR => Ok(()),
                _ => Err(e),
            };
        }
    }

    /// Waits until the kernel socket has something to read (a doorbell or
    /// its end), a signal interrupts, or a bounded time passes: in a
    /// program with two threads on one connection (one reading, one
    /// writing) either may drain the doorbell meant for the other, so a
    /// blocked call also looks at the ring again after 1, 2, 4 … 64 ms.
    fn wait_readable(fd: c_int, round: &mut u32) -> Result<(), Errno> {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms: c_int = 1 << (*round).min(6);
        *round += 1;
        // SAFETY: one valid pollfd.
        let r = unsafe { real::poll()(&mut p, 1, ms) };
        if r < 0 {
            return Err(errno());
        }
        Ok(())
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
        loop {
            {
                let _g = self.read_lock.lock().unwrap_or_else(|p| p.into_inner());
                // SAFETY: the caller's contract.
                let m = unsafe { self.channel.read(iov, peek) }.map_err(|Corrupt| corrupt(fd))?;
                if m.bytes > 0 {
                    self.after_read(fd, &m, peek);
                    return Ok(m.bytes);
                }
                if self.peer_eof.load(Ordering::Relaxed) {
                    return Ok(0);
                }
                self.drain(fd)?;
                self.channel.want_data();
                if self.channel.readable().map_err(|Corrupt| corrupt(fd))? > 0 {
                    continue;
                }
                if self.peer_eof.load(Ordering::Relaxed) {
                    // Everything the peer wrote before its FIN is in the
                    // ring already (published before the close).
                    if self.channel.readable().map_err(|Corrupt| corrupt(fd))? > 0 {
                        continue;
                    }
                    return Ok(0);
                }
                if dontwait || self.nonblocking.load(Ordering::Relaxed) {
                    return Err(libc::EAGAIN);
                }
            }
            Self::wait_readable(fd, &mut round)?;
        }
    }

    fn after_read(&self, fd: c_int, m: &Moved, peek: bool) {
        if !peek {
            self.received_bytes
                .fetch_add(m.bytes as u64, Ordering::Relaxed);
        }
        if m.wake_peer {
            self.ring(fd);
        }
    }

    /// `send` of `iov` on the channel: as much as fits, else EAGAIN or a
    /// wait for space; EPIPE once the peer is gone.
    ///
    /// # Safety
    ///
    /// Every iovec valid for reads of its length.
    pub(crate) unsafe fn send(
        &self,
        fd: c_int,
        iov: &[libc::iovec],
        flags: c_int,
    ) -> Result<usize, Errno> {
        let want: usize = iov.iter().map(|v| v.iov_len).sum();
        if want == 0 {
            return Ok(0);
        }
        let dontwait = flags & libc::MSG_DONTWAIT != 0;
        self.send_with(fd, dontwait, |ch| {
            // SAFETY: the caller's contract.
            unsafe { ch.write(iov) }.map(Ok)
        })
    }

    /// `sendfile` from `in_fd` (at `*offset`, or its file position) of at
    /// most `count` bytes, read straight into the ring.
    pub(crate) fn sendfile(
        &self,
        fd: c_int,
        in_fd: c_int,
        offset: Option<&mut libc::off_t>,
        count: usize,
    ) -> Result<usize, Errno> {
        if count == 0 {
            return Ok(0);
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
    ) -> Result<usize, Errno> {
        let mut round = 0;
        let mut had_room = false;
        loop {
            {
                let _g = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
                let m = put(&self.channel)
                    .map_err(|Corrupt| corrupt(fd))?
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                if m.bytes > 0 {
                    self.sent_bytes.fetch_add(m.bytes as u64, Ordering::Relaxed);
                    if m.wake_peer {
                        self.ring(fd);
                    }
                    return Ok(m.bytes);
                }
                if !self.channel.tx_full().map_err(|Corrupt| corrupt(fd))? {
                    // Room now: either the input file ended, or the ring
                    // was full when `put` looked and the consumer made
                    // room since. Only this side produces, so a second
                    // `put` sees the room: nothing moved then is the end
                    // of the input file.
                    if had_room {
                        return Ok(0);
                    }
                    had_room = true;
                    continue;
                }
                if self.peer_gone(fd) {
                    return Err(libc::EPIPE);
                }
                self.channel.want_space();
                if !self.channel.tx_full().map_err(|Corrupt| corrupt(fd))? {
                    continue;
                }
                if dontwait || self.nonblocking.load(Ordering::Relaxed) {
                    return Err(libc::EAGAIN);
                }
                self.drain(fd)?;
            }
            Self::wait_readable(fd, &mut round)?;
        }
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
        if r > 0 && p.revents & libc::POLLRDHUP != 0 {
            self.ring_on(fd);
        }
        false
    }

    /// One line with the connection's counters and what the kernel socket
    /// carried (the hello, the answer and the doorbells), when the
    /// program closes its last descriptor of it.
    pub(crate) fn log_close(&self, fd: c_int) {
        let (tcp_out, tcp_in) = tcp_bytes(fd);
        let role = match self.role {
            Role::Connector => "connector",
            Role::Listener => "listener",
        };
        log_line!(
            "fd {fd}: shm connection closed ({role}): shm_sent_bytes={} shm_received_bytes={} doorbells_sent={} kernel_tcp_sent_bytes={tcp_out} kernel_tcp_received_bytes={tcp_in}",
            self.sent_bytes.load(Ordering::Relaxed),
            self.received_bytes.load(Ordering::Relaxed),
            self.doorbells_sent.load(Ordering::Relaxed),
        );
    }
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

/// The calling thread's `errno`.
pub(crate) fn errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}
