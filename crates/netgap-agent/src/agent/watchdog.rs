//! The watchdog of a session's point-to-point repetitions: one thread for
//! the whole session, started with its first repetition, that ends the
//! repetition's flow if it runs past its limit. A sweep of thousands of
//! repetitions costs one thread, not one each.

use netgap_transport::AbortHandle;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the session asks of the watchdog thread, and what it found.
#[derive(Default)]
struct State {
    /// The repetition being watched: when to end it, and how.
    armed: Option<(Instant, AbortHandle)>,
    /// Whether the watched repetition was ended at its limit.
    fired: bool,
    /// The session is over; the thread returns.
    closing: bool,
}

/// The state and the condition variable the thread sleeps on.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Watches one repetition at a time (a session runs them in turn).
#[derive(Default)]
pub(super) struct Watchdog {
    shared: std::sync::Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Ends the flow of `abort` once `limit` passes, unless
    /// [`Watchdog::disarm`] comes first. Starts the thread the first time;
    /// if it cannot start, the repetition is not watched and ends at its
    /// I/O timeout instead.
    pub(super) fn arm(&mut self, abort: AbortHandle, limit: Duration) {
        if self.thread.is_none() {
            let shared = std::sync::Arc::clone(&self.shared);
            self.thread = std::thread::Builder::new()
                .name("netgap-watchdog".into())
                .spawn(move || watch(&shared))
                .ok();
        }
        let mut state = self.shared.lock();
        state.armed = Some((Instant::now() + limit, abort));
        state.fired = false;
        drop(state);
        self.shared.changed.notify_one();
    }

    /// Stops watching; `true` if the limit passed first and the flow was
    /// ended.
    pub(super) fn disarm(&mut self) -> bool {
        let mut state = self.shared.lock();
        state.armed = None;
        std::mem::take(&mut state.fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.changed.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: sleeps until the armed deadline (or a change), ends the
/// flow when the deadline passes, and returns when the session closes.
fn watch(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if state.closing {
            return;
        }
        let deadline = state.armed.as_ref().map(|(d, _)| *d);
        state = match deadline {
            None => shared
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    if let Some((_, abort)) = state.armed.take() {
                        abort.abort();
                        state.fired = true;
                    }
                    continue;
                }
                shared
                    .changed
                    .wait_timeout(state, d - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts how often it was asked to end its flow.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl netgap_transport::Abort for Count {
        fn abort(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn one_thread_watches_many_repetitions_and_ends_only_the_late_one() {
        let count = Arc::new(Count::default());
        let handle = AbortHandle::new(count.clone());
        let mut dog = Watchdog::default();
        for _ in 0..1000 {
            dog.arm(handle.clone(), Duration::from_secs(10));
            assert!(!dog.disarm());
        }
        assert_eq!(count.0.load(Ordering::Relaxed), 0);
        let t0 = Instant::now();
        dog.arm(handle.clone(), Duration::from_millis(50));
        while count.0.load(Ordering::Relaxed) == 0 {
            assert!(t0.elapsed() < Duration::from_secs(5), "never fired");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert!(dog.disarm());
        // The next repetition starts unfired.
        dog.arm(handle, Duration::from_secs(10));
        assert!(!dog.disarm());
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }
}
