//! One relayed connection on a link: the bytes from the other relay
//! waiting for the program's ring and the credit they return, the credit
//! to send and the answer to its `OPEN`, the program's wake-ups, and the
//! two pumps (the program's ring to the link, the queue to the ring).

use crate::credit::{Inbox, Next, Opening, SecondAnswer, SendSide};
use crate::host::{reset_tcp, send_byte};
use crate::outbox::{Outbox, SendError, Via};
use crate::ring::{Corrupt, FarEnd, Moved};
use crate::TICK;
use netgap_proto::relay::{self as frame, Kind};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why the other relay's answer to this end's `OPEN` is not a yes.
#[derive(Debug, Error)]
pub(crate) enum AnswerError {
    /// `OPEN_REFUSED`: no listen there waits with the key.
    #[error("the other relay has no connection waiting with its key")]
    Refused,
    /// The link broke while the connection waited.
    #[error("the link broke before the other relay answered")]
    Broke,
    /// No answer within the wait.
    #[error("no answer to its OPEN from the other relay in time")]
    Late,
    /// The connection's descriptors were already taken by an earlier try.
    #[error("the connection is gone")]
    Gone,
}

/// Why a connection's pump stopped before the end of its stream.
#[derive(Debug, Error)]
pub(crate) enum PumpError {
    /// The connection was reset (by the other relay, the link, or the
    /// other pump).
    #[error("the connection broke")]
    Broken,
    /// The program broke its ring's invariants.
    #[error("the program's ring is corrupt")]
    Corrupt,
    /// A frame could not leave on the link.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The receiving thread panicked.
    #[error("the receiving thread panicked")]
    Panicked,
    /// No thread for the receiving side.
    #[error("no receiving thread: {0}")]
    NoThread(io::Error),
}

/// Why a `DATA` frame could not be taken.
pub(crate) enum ArriveError {
    /// Past the connection's credit: the other relay broke the
    /// protocol, and the link breaks.
    Credit(frame::CreditError),
    /// The program's ring is corrupt: its connection is reset.
    Corrupt,
    /// The link closed meanwhile.
    Closed,
}

/// One relayed connection on the link.
pub(crate) struct Conn {
    pub(crate) id: u32,
    pub(crate) ring: FarEnd,
    pub(crate) tcp: OwnedFd,
    /// The client socket: a byte on it wakes the program where it
    /// waits in an epoll that watches it.
    pub(crate) client: OwnedFd,
    pub(crate) out: Arc<Outbox>,
    pub(crate) inbox: Mutex<Inbox>,
    pub(crate) inbox_cv: Condvar,
    pub(crate) send: Mutex<SendSide>,
    pub(crate) send_cv: Condvar,
    /// The connection broke: both threads stop.
    pub(crate) broken: AtomicBool,
    /// The program closed its last descriptor of the connection (or
    /// died): what still arrives for it is dropped, as the kernel
    /// drops data for a closed socket.
    pub(crate) program_gone: AtomicBool,
    pub(crate) discarded_bytes: AtomicU64,
    pub(crate) relayed_out_bytes: AtomicU64,
    pub(crate) relayed_in_bytes: AtomicU64,
    pub(crate) bells_asked: AtomicU64,
    pub(crate) bells_rung: AtomicU64,
    /// Wake-ups sent on the client socket.
    pub(crate) bells_here: AtomicU64,
}

impl Conn {
    pub(crate) fn new(id: u32, ends: Ends, out: Arc<Outbox>, open: bool) -> Conn {
        let Ends { ring, tcp, client } = ends;
        Conn {
            id,
            ring,
            tcp,
            client,
            out,
            inbox: Mutex::new(Inbox::default()),
            inbox_cv: Condvar::new(),
            send: Mutex::new(SendSide::new(open)),
            send_cv: Condvar::new(),
            broken: AtomicBool::new(false),
            program_gone: AtomicBool::new(false),
            discarded_bytes: AtomicU64::new(0),
            relayed_out_bytes: AtomicU64::new(0),
            relayed_in_bytes: AtomicU64::new(0),
            bells_asked: AtomicU64::new(0),
            bells_rung: AtomicU64::new(0),
            bells_here: AtomicU64::new(0),
        }
    }

    pub(crate) fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn sending(&self) -> MutexGuard<'_, SendSide> {
        self.send.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, kind: Kind, payload: &[u8], via: Via) -> Result<(), SendError> {
        self.out.send(&frame::frame(kind, self.id, payload), via)
    }

    pub(crate) fn broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    /// `DATA` from the other relay, within the credit it had. With
    /// nothing queued before it, it goes straight into the program's
    /// ring as far as the ring has room (the ring never blocks, so the
    /// link's reader still never waits on a program), sparing a
    /// thread's wake-up per message; the rest is queued for the
    /// connection's receiving thread. Err: past the credit; Ok(Some):
    /// credit to return.
    pub(crate) fn arrive(&self, v: &[u8]) -> Result<Option<u32>, ArriveError> {
        let mut i = self.inbox();
        let direct = i.arrive(v.len() as u32).map_err(ArriveError::Credit)?;
        let mut put = 0;
        let mut back = None;
        if direct && !self.broken() {
            if self.program_gone.load(Ordering::SeqCst) {
                // Counted as relayed and discarded, as `put_all` does.
                self.discarded_bytes
                    .fetch_add(v.len() as u64, Ordering::Relaxed);
                self.relayed_in_bytes
                    .fetch_add(v.len() as u64, Ordering::Relaxed);
                put = v.len();
            } else {
                let m = self.ring.write(v).map_err(|_| ArriveError::Corrupt)?;
                self.wake(&m, Via::Queue).map_err(|_| ArriveError::Closed)?;
                self.relayed_in_bytes
                    .fetch_add(m.bytes as u64, Ordering::Relaxed);
                put = m.bytes;
            }
            back = i.moved(put as u32);
        }
        if put < v.len() {
            i.queue(v[put..].to_vec());
            self.inbox_cv.notify_one();
        }
        Ok(back)
    }

    /// The other relay's `END`: after what is queued, the end.
    pub(crate) fn end(&self) {
        self.inbox().end();
        self.inbox_cv.notify_one();
    }

    pub(crate) fn grant(&self, n: u32) -> Result<(), frame::CreditError> {
        self.sending().flow.grant(n)?;
        self.send_cv.notify_one();
        Ok(())
    }

    /// The other relay's answer to this end's `OPEN`.
    pub(crate) fn opened(&self, ok: bool) -> Result<(), SecondAnswer> {
        self.sending().answer(ok)?;
        self.send_cv.notify_all();
        Ok(())
    }

    pub(crate) fn wait_open(&self, wait: Duration) -> Result<(), AnswerError> {
        let deadline = Instant::now() + wait;
        let mut s = self.sending();
        loop {
            match s.open {
                Opening::Open => return Ok(()),
                Opening::Refused => return Err(AnswerError::Refused),
                Opening::Waiting => {}
            }
            if self.broken() {
                return Err(AnswerError::Broke);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(AnswerError::Late);
            }
            s = self
                .send_cv
                .wait_timeout(s, left.min(TICK))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits a little for credit; the credit in hand.
    pub(crate) fn credit(&self, wait: Option<Duration>) -> u32 {
        let s = self.sending();
        let s = match wait {
            Some(w) if s.flow.credit_bytes() == 0 && !self.broken() => {
                self.send_cv
                    .wait_timeout(s, w)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            _ => s,
        };
        s.flow.credit_bytes()
    }

    /// Wakes the program waiting for what `m` moved: on this host by a
    /// byte on its client socket, and through the other relay by a
    /// doorbell on the TCP connection, as its waiters asked (asked
    /// `via` that way).
    pub(crate) fn wake(&self, m: &Moved, via: Via) -> Result<(), SendError> {
        // A full client socket is already readable, and a closed one
        // means the program is gone.
        if m.wake_here && send_byte(self.client.as_raw_fd()) {
            self.bells_here.fetch_add(1, Ordering::Relaxed);
        }
        if m.wake_peer {
            self.bells_asked.fetch_add(1, Ordering::Relaxed);
            self.push(Kind::Bell, &[], via)?;
        }
        Ok(())
    }

    /// Sends a byte on the TCP connection: the other host's program
    /// wakes.
    pub(crate) fn ring_tcp(&self) {
        // A failure (the connection gone) shows up in the programs'
        // own calls.
        if send_byte(self.tcp.as_raw_fd()) {
            self.bells_rung.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads what waits on the TCP connection once the program closed
    /// it and both ways ended: doorbells the program left unread. This
    /// relay's duplicate is the socket's last, and a close with unread
    /// bytes would make the kernel reset the connection where it sends
    /// a FIN; the other program, half-closed and still reading what the
    /// other relay holds for it, would take the reset for an error.
    pub(crate) fn drain_tcp(&self) {
        let mut scratch = [0u8; 256];
        loop {
            // SAFETY: `scratch` is valid for writes of its length; the
            // socket is this connection's own duplicate.
            let n = unsafe {
                libc::recv(
                    self.tcp.as_raw_fd(),
                    scratch.as_mut_ptr().cast(),
                    scratch.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                return;
            }
        }
    }

    /// Resets the TCP connection (both programs see an error), once;
    /// `tell_peer`: the break is this side's, so the other relay
    /// resets its side too.
    pub(crate) fn reset(&self, tell_peer: bool) {
        if !self.broken.swap(true, Ordering::SeqCst) {
            if tell_peer {
                let _ = self.push(Kind::Reset, &[], Via::Queue);
            }
            reset_tcp(self.tcp.as_raw_fd());
            self.ring.closing();
        }
        // Under each lock, so a waiter between its check and its
        // sleep cannot miss it.
        drop(self.inbox());
        self.inbox_cv.notify_all();
        drop(self.sending());
        self.send_cv.notify_all();
    }
}

/// Most doorbell messages [`wait_client`] reads in one call.
pub(crate) const MAX_DOORBELLS_A_WAKE: usize = 64;

/// Whether `fd` (the client socket) is readable within `ms`, and
/// drains it; Err: the program closed its last descriptor of the
/// connection (end of file or hang-up).
pub(crate) fn wait_client(fd: RawFd, ms: libc::c_int) -> Result<(), ()> {
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
    // The program's doorbells, at most a bounded number a call: a
    // program flooding its socket wakes only its own connection's
    // thread, which still looks at its ring between calls.
    for _ in 0..MAX_DOORBELLS_A_WAKE {
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
    Ok(())
}

/// The program's ring to the link, within the connection's credit,
/// until the program is done sending (then what is left and `END`),
/// then until it closes its last descriptor of the connection (or
/// dies), or the connection breaks. Done sending: it shut down its
/// sending side (its mark in the ring's header), or closed.
pub(crate) fn ring_to_flow(c: &Conn, client: RawFd) -> Result<(), PumpError> {
    if send_ring(c, client)? == Sending::ShutDown {
        wait_close(c, client)?;
    }
    Ok(())
}

/// How a program's sending ended.
#[derive(Debug, PartialEq, Eq)]
enum Sending {
    /// It shut down its sending side; it still holds the connection.
    ShutDown,
    /// It closed its last descriptor of the connection, or died.
    Closed,
}

/// The program's ring to the link until the program is done sending:
/// every byte it published before its shutdown or its close, then
/// `END`.
fn send_ring(c: &Conn, client: RawFd) -> Result<Sending, PumpError> {
    // A DATA frame is built in place: the ring is read behind room for
    // its header.
    let mut buf = vec![0u8; frame::HEADER_BYTES + frame::CHUNK_BYTES];
    let mut closing = false;
    let corrupt = |Corrupt| PumpError::Corrupt;
    loop {
        if c.broken() {
            return Err(PumpError::Broken);
        }
        let credit = c.credit(None) as usize;
        if credit > 0 {
            let room = frame::HEADER_BYTES + credit.min(frame::CHUNK_BYTES);
            let m = c
                .ring
                .read(&mut buf[frame::HEADER_BYTES..room])
                .map_err(corrupt)?;
            if m.bytes > 0 {
                c.sending().flow.spend(m.bytes as u32);
                buf[..frame::HEADER_BYTES].copy_from_slice(&frame::encode(
                    Kind::Data,
                    c.id,
                    m.bytes,
                ));
                c.out
                    .send(&buf[..frame::HEADER_BYTES + m.bytes], Via::Now)?;
                c.relayed_out_bytes
                    .fetch_add(m.bytes as u64, Ordering::Relaxed);
                c.wake(&m, Via::Now)?;
                continue;
            }
        }
        c.ring.want_data();
        // The shutdown's mark is read before the ring's index: the
        // library marks after publishing its last bytes, so an empty
        // ring after the mark is the whole stream.
        let shut_down = !closing && c.ring.program_shut_down();
        if c.ring.readable().map_err(corrupt)? > 0 {
            if credit == 0 {
                // The other program reads slower: its relay's queue
                // is full. Only this connection waits.
                c.credit(Some(TICK));
            }
            continue;
        }
        if closing || shut_down {
            // Every byte the program wrote was published before its
            // close or its shutdown, and is sent.
            c.push(Kind::End, &[], Via::Now)?;
            return Ok(if closing {
                Sending::Closed
            } else {
                Sending::ShutDown
            });
        }
        if wait_client(client, TICK.as_millis() as libc::c_int).is_err() {
            closing = true;
            c.program_gone.store(true, Ordering::SeqCst);
        }
    }
}

/// After the program's shutdown: its doorbells drained until it closes
/// its last descriptor of the connection (or dies), so what still
/// arrives for it after that is dropped; nothing of its ring goes out
/// any more (its library refuses writes after a shutdown, in every
/// process that holds the connection).
fn wait_close(c: &Conn, client: RawFd) -> Result<(), PumpError> {
    loop {
        if c.broken() {
            return Err(PumpError::Broken);
        }
        if wait_client(client, TICK.as_millis() as libc::c_int).is_err() {
            c.program_gone.store(true, Ordering::SeqCst);
            return Ok(());
        }
    }
}

/// The connection's queue to the program's ring, returning credit as
/// bytes leave it, until the other relay's `END` (the other program
/// shut down its sending side or closed: the ring's end is marked, and
/// the program reads the end of the stream) or the connection breaks.
pub(crate) fn queue_to_ring(c: &Conn) -> Result<(), PumpError> {
    loop {
        let chunk = {
            let mut i = c.inbox();
            loop {
                if c.broken() {
                    return Err(PumpError::Broken);
                }
                match i.next() {
                    Next::Chunk(v) => break Some(v),
                    Next::End => break None,
                    Next::Idle => {}
                }
                i = c
                    .inbox_cv
                    .wait_timeout(i, TICK)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let Some(v) = chunk else {
            // The end: everything is in the ring; the program reads
            // the end of the stream once it has read it. The library
            // takes the end from the ring's mark (a FIN on the TCP
            // connection can come before the bytes, which cross the
            // relays); the shutdown of the socket's receiving side
            // wakes a program that waits in poll or epoll to see it.
            c.ring.mark_end();
            // SAFETY: a plain shutdown of our duplicate of the
            // connection's socket.
            unsafe { libc::shutdown(c.tcp.as_raw_fd(), libc::SHUT_RD) };
            c.ring.closing();
            return Ok(());
        };
        let put = put_all(c, &v);
        let back = c.inbox().written(put.is_ok().then_some(v.len() as u32));
        put?;
        c.relayed_in_bytes
            .fetch_add(v.len() as u64, Ordering::Relaxed);
        if let Some(n) = back {
            c.push(Kind::Credit, &n.to_le_bytes(), Via::Now)?;
        }
    }
}

/// Puts all of `data` into the program's ring, waiting for room.
pub(crate) fn put_all(c: &Conn, mut data: &[u8]) -> Result<(), PumpError> {
    let mut round = 0u32;
    while !data.is_empty() {
        if c.broken() {
            return Err(PumpError::Broken);
        }
        if c.program_gone.load(Ordering::SeqCst) {
            c.discarded_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            return Ok(());
        }
        let m = c.ring.write(data).map_err(|Corrupt| PumpError::Corrupt)?;
        c.wake(&m, Via::Now)?;
        if m.bytes > 0 {
            data = &data[m.bytes..];
            round = 0;
            continue;
        }
        // The program reads slower than the link: look again after
        // 1, 2, 4 … 16 ms (its doorbells go to the other thread).
        std::thread::sleep(Duration::from_millis(1 << round.min(4)));
        round += 1;
    }
    Ok(())
}

/// What the relay holds of one program's connection: the ring, a
/// duplicate of its TCP socket, and a duplicate of the client socket
/// (to wake the program on this host; see `netgap_shm::wait::WAIT_BELL`).
pub(crate) struct Ends {
    pub(crate) ring: FarEnd,
    pub(crate) tcp: OwnedFd,
    pub(crate) client: OwnedFd,
}
