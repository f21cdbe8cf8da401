//! The wake rule: how an end announces a wait in a waiter word, sleeps on
//! it, and how the other end, after it moved an index, takes the waiters
//! and wakes them. The futexes are shared ones (no `FUTEX_PRIVATE_FLAG`):
//! the sleeper and the waker are in different processes that map the same
//! file.

use std::io;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

/// A waiter sleeps on a descriptor (`poll`, `epoll`): it is woken by a
/// doorbell byte on the connection's kernel socket.
pub const WAIT_FD: u32 = 1;

/// A waiter sleeps on the waiter word itself (a blocking read or write,
/// the `shm` transport's event mode): it is woken by `FUTEX_WAKE`, which
/// costs far less than a doorbell.
pub const WAIT_FUTEX: u32 = 2;

/// A waiter sleeps in an epoll where the connection's socket to its relay
/// is registered beside the connection (a relayed connection only): the
/// relay wakes it with a byte on that socket, on its own host, instead of
/// asking the other host's relay for a doorbell on the TCP connection.
/// Only the relay reads it: a same-host peer never sees it set.
pub const WAIT_BELL: u32 = 4;

/// Sleeps while `word` holds `expected`, at most `timeout`. Returns `Ok`
/// when woken, when the word no longer holds `expected`, on a signal and
/// on the timeout alike: the caller looks at the ring again whatever
/// happened.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned word (a reference) with a
    // relative timeout on this stack frame; the kernel only reads both.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &raw const ts,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::ETIMEDOUT | libc::EINTR) => Ok(()),
        _ => Err(io::Error::new(e.kind(), format!("futex wait failed: {e}"))),
    }
}

/// Wakes every thread, in any process, sleeping in [`futex_wait`] on
/// `word`. It can fail only for an address the kernel cannot look up,
/// which a word of a live mapping never is.
pub fn futex_wake(word: &AtomicU32) -> io::Result<()> {
    // SAFETY: FUTEX_WAKE on a valid, aligned word (a reference); it only
    // looks the address up, and ignores the unused arguments.
    let r = unsafe {
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
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("futex wake failed: {e}")));
    }
    Ok(())
}

/// Announces a wait: sets `bit` in `word`, ordered before the caller's
/// next look at the ring, and returns the word as it now is (the value a
/// futex sleeper passes to [`futex_wait`]). The caller must look at the
/// ring again before it sleeps.
#[inline]
pub fn arm(word: &AtomicU32, bit: u32) -> u32 {
    let v = word.fetch_or(bit, Ordering::Relaxed) | bit;
    fence(Ordering::SeqCst);
    v
}

/// Withdraws `bit` from `word`: a waiter that found what it waited for
/// without sleeping spares the other end a needless wake-up.
#[inline]
pub fn disarm(word: &AtomicU32, bit: u32) {
    word.fetch_and(!bit, Ordering::Relaxed);
}

/// Takes the waiters of `word` after the index they wait on moved (the
/// caller fenced after its store): None if nobody waits; otherwise runs
/// `claim` (before the bits are gone: the preload library counts a
/// doorbell as on its way there), clears the word, wakes its futex
/// sleepers and returns the bits it held, for the caller to wake the
/// others.
#[inline]
pub fn take(word: &AtomicU32, claim: impl FnOnce()) -> Option<u32> {
    if word.load(Ordering::Relaxed) == 0 {
        return None;
    }
    claim();
    let old = word.swap(0, Ordering::SeqCst);
    if old & WAIT_FUTEX != 0 {
        // A word of the region: the wake cannot fail (see `futex_wake`).
        let _ = futex_wake(word);
    }
    Some(old)
}

/// Wakes the futex sleepers of `word` without taking the word: an end
/// that closes wakes its peer's blocking waits, which then look at
/// whatever says the connection ended.
pub fn wake_sleepers(word: &AtomicU32) {
    if word.load(Ordering::Acquire) & WAIT_FUTEX != 0 {
        // As in `take`: the wake cannot fail.
        let _ = futex_wake(word);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_taken_word_wakes_its_sleeper_and_says_its_bits() {
        let word = AtomicU32::new(0);
        let mut claimed = 0;
        assert_eq!(take(&word, || claimed += 1), None);
        assert_eq!(claimed, 0);
        let armed = arm(&word, WAIT_FUTEX);
        assert_eq!(arm(&word, WAIT_FD), WAIT_FUTEX | WAIT_FD);
        std::thread::scope(|s| {
            let sleeper = s.spawn(|| {
                let t0 = Instant::now();
                // The word moves on from `armed` (WAIT_FD joined it), so
                // this returns at once or at the wake below.
                futex_wait(&word, armed, Duration::from_secs(5)).unwrap();
                t0.elapsed()
            });
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(take(&word, || claimed += 1), Some(WAIT_FUTEX | WAIT_FD));
            assert!(sleeper.join().unwrap() < Duration::from_secs(2));
        });
        assert_eq!(claimed, 1);
        assert_eq!(word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_sleeper_on_the_armed_value_is_woken_by_take() {
        let word = AtomicU32::new(0);
        let armed = arm(&word, WAIT_FUTEX);
        std::thread::scope(|s| {
            let sleeper = s.spawn(|| {
                let t0 = Instant::now();
                futex_wait(&word, armed, Duration::from_secs(5)).unwrap();
                t0.elapsed()
            });
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(take(&word, || ()), Some(WAIT_FUTEX));
            assert!(sleeper.join().unwrap() < Duration::from_secs(2));
        });
        disarm(&word, WAIT_FUTEX);
        let t0 = Instant::now();
        futex_wait(&word, 1234, Duration::from_secs(5)).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "a changed word");
    }
}
