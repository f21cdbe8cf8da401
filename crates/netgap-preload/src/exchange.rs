//! The setup exchange's pieces every data path shares (the shm channel
//! and the relay, and the next beside them): sending the library's bytes
//! whole, waiting for the socket, peeking and consuming, reading the
//! listener's answer, the ring size, and why a connection did not move.
//! Plain calls on the kernel socket; nothing here knows a connection.

use crate::errno::{errno, Errno};
use crate::real;
use libc::c_int;
use netgap_proto::preload::{answer_bytes, could_be_answer, Answer, ANSWER_BYTES};
use std::time::{Duration, Instant};

/// Bytes of each ring unless `NETGAP_PRELOAD_RING_BYTES` says otherwise.
const DEFAULT_RING_BYTES: u32 = 1 << 18;

/// How long a connector waits for the listener's answer: the listener
/// answers when its program first reads, which a busy server may take a
/// while to do.
pub(crate) const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Sends all of `buf` on a connected socket, waiting for room at most
/// [`ANSWER_WAIT`] (the setup's records are a few dozen bytes on a fresh
/// connection: the wait is for a full send buffer, never a peer's bytes).
pub(crate) fn send_all(fd: c_int, buf: &[u8]) -> Result<(), Errno> {
    let mut off = 0;
    let deadline = Instant::now() + ANSWER_WAIT;
    while off < buf.len() {
        // SAFETY: `buf[off..]` is valid for reads.
        let r = unsafe {
            real::send()(
                fd,
                buf[off..].as_ptr().cast(),
                buf.len() - off,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            off += r as usize;
            continue;
        }
        let e = errno();
        if e == libc::EAGAIN || e == libc::EINTR {
            if Instant::now() > deadline || !wait_for(fd, libc::POLLOUT, deadline) {
                return Err(libc::ETIMEDOUT);
            }
            continue;
        }
        return Err(e);
    }
    Ok(())
}

/// The socket `fd`'s timeout option `opt` (`SO_RCVTIMEO` or
/// `SO_SNDTIMEO`), None when it has none (or cannot say).
pub(crate) fn socket_timeout(fd: c_int, opt: c_int) -> Option<Duration> {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: `tv` is valid for writes of `len` bytes.
    let r = unsafe {
        real::getsockopt()(
            fd,
            libc::SOL_SOCKET,
            opt,
            std::ptr::from_mut(&mut tv).cast(),
            &mut len,
        )
    };
    (r == 0 && (tv.tv_sec > 0 || tv.tv_usec > 0))
        .then(|| Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.max(0) as u32) * 1000))
}

/// Waits until `fd` shows `events` or `deadline` passes; false on timeout.
pub(crate) fn wait_for(fd: c_int, events: i16, deadline: Instant) -> bool {
    wait_any(fd, events, -1, deadline)
}

/// Waits until `fd` is readable or `also` (an eventfd; -1: none) is, or
/// `deadline` passes; true when either is readable.
pub(crate) fn wait_for_either(fd: c_int, also: c_int, deadline: Instant) -> bool {
    wait_any(fd, libc::POLLIN, also, deadline)
}

/// Waits for `events` on `fd`, or `also` readable (poll ignores a
/// negative descriptor), until `deadline`.
fn wait_any(fd: c_int, events: i16, also: c_int, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = [
            libc::pollfd {
                fd,
                events,
                revents: 0,
            },
            libc::pollfd {
                fd: also,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX);
        // SAFETY: two valid pollfds.
        let r = unsafe { real::poll()(p.as_mut_ptr(), 2, ms) };
        if r > 0 {
            return true;
        }
        if r < 0 && errno() != libc::EINTR {
            return false;
        }
    }
}

/// Peeks at up to `buf.len()` bytes without waiting; Ok(0) at end of file.
pub(crate) fn peek(fd: c_int, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for writes of its length.
    let r = unsafe {
        real::recv()(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Consumes `n` bytes already known to be in the socket.
pub(crate) fn consume(fd: c_int, n: usize) {
    let mut buf = [0u8; ANSWER_BYTES];
    let n = n.min(buf.len());
    // SAFETY: `buf` is valid for writes of `n` bytes; the bytes were peeked,
    // so the read does not block.
    unsafe { real::recv()(fd, buf.as_mut_ptr().cast(), n, libc::MSG_DONTWAIT) };
}

pub(crate) fn ring_bytes() -> u32 {
    crate::settings()
        .ring_bytes
        .filter(|v| {
            v.is_power_of_two()
                && (netgap_proto::preload::MIN_RING_BYTES..=netgap_proto::preload::MAX_RING_BYTES)
                    .contains(v)
        })
        .unwrap_or(DEFAULT_RING_BYTES)
}

/// Why a connection was not moved.
pub(crate) enum NotMoved {
    /// The stream is intact: it stays on the kernel's TCP.
    Kept(String),
    /// The library's bytes went out and the stream cannot be given back
    /// to the program intact.
    Broken(String),
}

/// What the first bytes from the listener are, as far as they arrived.
pub(crate) enum Heard {
    /// Not all of the answer yet.
    NotYet,
    /// The whole answer (consumed).
    Answer(Answer),
    /// The listener's program data: it committed to the kernel's TCP
    /// before it saw the hello, which it drops unanswered.
    ProgramData,
    /// The listener closed.
    Eof,
    /// The stream cannot be used.
    Broken(String),
}

/// Reads the listener's answer if all of it is in, without waiting.
pub(crate) fn hear_answer(fd: c_int) -> Heard {
    let mut buf = [0u8; ANSWER_BYTES];
    match peek(fd, &mut buf) {
        Ok(0) => Heard::Eof,
        Ok(n) if !could_be_answer(&buf[..n]) => Heard::ProgramData,
        Ok(n) if answer_bytes(&buf[..n]).is_some_and(|w| n >= w) => {
            // Only the answer's own bytes: program data may follow.
            let w = answer_bytes(&buf[..n]).unwrap_or(ANSWER_BYTES);
            match Answer::decode(&buf[..w]) {
                Ok(a) => {
                    consume(fd, w);
                    Heard::Answer(a)
                }
                Err(e) => Heard::Broken(format!("the listener's answer: {e}")),
            }
        }
        Ok(_) | Err(libc::EAGAIN) | Err(libc::EINTR) => Heard::NotYet,
        Err(e) => Heard::Broken(format!(
            "reading the answer: {}",
            std::io::Error::from_raw_os_error(e)
        )),
    }
}
