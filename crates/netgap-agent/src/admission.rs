//! Admission of control connections that have not yet proven the key (or,
//! on a keyless agent, said hello): a small pool that strangers cannot fill
//! to keep a coordinator out.
//!
//! Every new connection gets a place at once. When its source address
//! already holds [`MAX_UNPROVEN_PER_SOURCE`] places, that source's oldest
//! connection is closed to make room; when the pool holds
//! [`MAX_UNPROVEN`], the oldest connection of the source holding the most
//! places is closed. Connections that have sent nothing that parses yet go
//! first: a coordinator starts its proof at once, so strangers that stay
//! silent, drip bytes or churn new connections push out each other, not it. A connection leaves the pool as soon as it has proven
//! itself, and is closed by its own thread at its proof deadline. So silent,
//! slow or garbage connections only ever push out each other: a coordinator
//! that proves the key in less time than it takes strangers to open
//! [`MAX_UNPROVEN`] new connections always gets in, and the agent never
//! holds more than [`MAX_UNPROVEN`] threads and buffers for strangers.
//!
//! The connections refused before proving themselves are logged by
//! [`RefusalLog`]: one summary line per [`REFUSAL_LOG_INTERVAL`] at most,
//! naming the busiest few sources, so strangers cannot fill the agent's
//! log (often on a tmpfs) one line per connection.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Most connections at once that have not proven themselves.
pub(crate) const MAX_UNPROVEN: usize = 64;
/// Most unproven connections from one source address; a Unix-socket client
/// counts as one source.
pub(crate) const MAX_UNPROVEN_PER_SOURCE: usize = 32;

/// Closes a connection from outside its thread (shutting its socket down
/// wakes the thread's blocked read).
pub(crate) type Closer = Box<dyn FnOnce() + Send>;

struct Entry {
    id: u64,
    source: Option<IpAddr>,
    since: Instant,
    /// Sent a first well-formed frame (the start of a proof or a hello).
    started: bool,
    closer: Option<Closer>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    entries: Vec<Entry>,
}

/// The unproven connections of one agent.
#[derive(Default)]
pub(crate) struct Pool {
    inner: Mutex<Inner>,
}

/// A connection's place in the pool; gives it up when dropped.
pub(crate) struct Ticket {
    pool: Arc<Pool>,
    id: u64,
}

impl Pool {
    /// Admits a connection from `source`, closing another one first when
    /// the pool or the source is full.
    pub(crate) fn admit(self: &Arc<Self>, source: Option<IpAddr>, closer: Closer) -> Ticket {
        let evicted = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let keys: Vec<Key> = inner
                .entries
                .iter()
                .map(|e| (e.source, e.since, e.started))
                .collect();
            let evicted = victim(&keys, source).map(|i| inner.entries.remove(i));
            inner.next_id += 1;
            let id = inner.next_id;
            inner.entries.push(Entry {
                id,
                source,
                since: Instant::now(),
                started: false,
                closer: Some(closer),
            });
            (evicted, id)
        };
        let (evicted, id) = evicted;
        // Closed outside the lock: a shutdown is a system call.
        if let Some(close) = evicted.and_then(|mut e| e.closer.take()) {
            close();
        }
        Ticket {
            pool: Arc::clone(self),
            id,
        }
    }

    /// Connections in the pool now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .len()
    }
}

impl Ticket {
    /// Marks the connection as having sent a well-formed first frame: it
    /// is closed for room only after every silent one.
    pub(crate) fn started(&self) {
        let mut inner = self
            .pool
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = inner.entries.iter_mut().find(|e| e.id == self.id) {
            e.started = true;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self
            .pool
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        inner.entries.retain(|e| e.id != self.id);
    }
}

/// Shortest time between two summaries of refused connections.
pub(crate) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Most sources one summary names; the rest are counted.
pub(crate) const REFUSAL_LOG_SOURCES: usize = 3;
/// Longest reason quoted in a summary, in characters.
const REFUSAL_REASON_CHARS: usize = 160;

/// Counts the connections refused before proving themselves and turns
/// them into at most one summary line per interval. Plain code: the caller
/// passes the time, so tests drive it with a clock of their own.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    interval: Duration,
    /// When the current window opened: its first refusal.
    since: Option<Instant>,
    /// When the last summary was given.
    last_line: Option<Instant>,
    /// Refusals per source in the window; `None`: a Unix-socket client.
    counts: BTreeMap<Option<IpAddr>, u64>,
    /// The last refusal's reason, escaped and cut short.
    last_reason: String,
}

impl RefusalLog {
    /// A log giving at most one line per `interval`.
    pub(crate) fn new(interval: Duration) -> RefusalLog {
        RefusalLog {
            interval,
            since: None,
            last_line: None,
            counts: BTreeMap::new(),
            last_reason: String::new(),
        }
    }

    /// Counts one refused connection from `source`, refused for `reason`
    /// (a peer's text may be in it: it is escaped).
    pub(crate) fn record(&mut self, source: Option<IpAddr>, reason: &str, now: Instant) {
        self.since.get_or_insert(now);
        *self.counts.entry(source).or_insert(0) += 1;
        let reason = netgap_core::text::escape_control(reason);
        self.last_reason = reason.chars().take(REFUSAL_REASON_CHARS).collect();
        if reason.chars().count() > REFUSAL_REASON_CHARS {
            self.last_reason.push_str("...");
        }
    }

    /// The summary of the refusals counted since the last one, when there
    /// are some and the last summary was at least an interval ago; the
    /// counts start again after it.
    pub(crate) fn summary(&mut self, now: Instant) -> Option<String> {
        let since = self.since?;
        if self
            .last_line
            .is_some_and(|t| now.saturating_duration_since(t) < self.interval)
        {
            return None;
        }
        let total: u64 = self.counts.values().sum();
        let mut sources: Vec<(Option<IpAddr>, u64)> =
            self.counts.iter().map(|(s, n)| (*s, *n)).collect();
        // Busiest first; ties by address, for a stable line.
        sources.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let named: Vec<String> = sources
            .iter()
            .take(REFUSAL_LOG_SOURCES)
            .map(|(s, n)| match s {
                Some(ip) => format!("{ip} x {n}"),
                None => format!("local clients x {n}"),
            })
            .collect();
        let more = sources.len().saturating_sub(REFUSAL_LOG_SOURCES);
        let more = if more > 0 {
            format!(", {more} more")
        } else {
            String::new()
        };
        let secs = now.saturating_duration_since(since).as_secs().max(1);
        let line = format!(
            "{total} unauthenticated connection{} refused from {} source{} in the last {secs} s: {}{more} (last: {})",
            if total == 1 { "" } else { "s" },
            sources.len(),
            if sources.len() == 1 { "" } else { "s" },
            named.join(", "),
            self.last_reason
        );
        self.counts.clear();
        self.since = None;
        self.last_line = Some(now);
        Some(line)
    }
}

/// A connection as eviction sees it: its source, when it came, whether it
/// started a proof.
type Key = (Option<IpAddr>, Instant, bool);

/// Which of the pool's connections to close before admitting one from
/// `new_source`, if any: the new source's oldest when it is at its share,
/// else, in a full pool, the oldest of the source holding the most (ties:
/// the oldest of those). Connections that have not started are chosen
/// before any that has.
fn victim(entries: &[Key], new_source: Option<IpAddr>) -> Option<usize> {
    let count = |s: Option<IpAddr>| entries.iter().filter(|e| e.0 == s).count();
    let idle_left = entries.iter().any(|e| !e.2);
    // Among the connections that may go first: not started, when any is.
    let first = |e: &Key| !idle_left || !e.2;
    let oldest_of = |s: Option<IpAddr>| {
        let of_source = || entries.iter().enumerate().filter(move |(_, e)| e.0 == s);
        of_source()
            .filter(|(_, e)| first(e))
            .min_by_key(|(_, e)| e.1)
            .or_else(|| of_source().min_by_key(|(_, e)| e.1))
            .map(|(i, _)| i)
    };
    if count(new_source) >= MAX_UNPROVEN_PER_SOURCE {
        return oldest_of(new_source);
    }
    if entries.len() < MAX_UNPROVEN {
        return None;
    }
    entries
        .iter()
        .filter(|e| first(e))
        .max_by(|a, b| count(a.0).cmp(&count(b.0)).then(b.1.cmp(&a.1)))
        .and_then(|e| oldest_of(e.0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_full_pool_closes_the_oldest_of_the_busiest_source() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut entries: Vec<_> = (0..MAX_UNPROVEN as u64 - 2)
            .map(|i| (ip(1 + u8::from(i % 2 == 0)), at(i + 10), false))
            .collect();
        entries.push((ip(3), at(0), false));
        entries.push((ip(4), at(1), false));
        // The lone connections of other sources are older, but a busy
        // source gives up its oldest.
        assert_eq!(victim(&entries, ip(5)), Some(0));
        assert_eq!(victim(&entries[1..], ip(5)), None);
    }

    #[test]
    fn a_source_at_its_share_closes_its_own_oldest() {
        let t0 = Instant::now();
        let mut entries: Vec<_> = (0..MAX_UNPROVEN_PER_SOURCE as u64)
            .map(|i| (ip(1), t0 + Duration::from_millis(100 - i), false))
            .collect();
        entries.insert(0, (ip(2), t0, false));
        // The last admitted is the oldest by time here.
        assert_eq!(victim(&entries, ip(1)), Some(MAX_UNPROVEN_PER_SOURCE));
        assert_eq!(victim(&entries, ip(2)), None);
    }

    #[test]
    fn a_connection_that_started_its_proof_goes_after_every_silent_one() {
        let t0 = Instant::now();
        let mut entries: Vec<_> = (0..MAX_UNPROVEN_PER_SOURCE as u64)
            .map(|i| (ip(1), t0 + Duration::from_millis(i), false))
            .collect();
        // The oldest of the source has started: the next oldest goes.
        entries[0].2 = true;
        assert_eq!(victim(&entries, ip(1)), Some(1));
        // When every one has started, the oldest goes.
        for e in &mut entries {
            e.2 = true;
        }
        assert_eq!(victim(&entries, ip(1)), Some(0));
    }

    #[test]
    fn refusals_give_at_most_one_summary_per_interval() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut log = RefusalLog::new(Duration::from_secs(10));
        assert_eq!(log.summary(at(0)), None, "nothing refused yet");
        // A first refusal is told at once.
        log.record(ip(9), "wrong key", at(0));
        let first = log.summary(at(0)).unwrap();
        assert!(
            first.starts_with("1 unauthenticated connection refused from 1 source"),
            "{first}"
        );
        // Then a flood, from many sources: nothing until the interval ends.
        let mut lines = Vec::new();
        for i in 0..10_000u64 {
            // Half from one source, half spread over nine others.
            let source = if i % 2 == 0 {
                ip(20)
            } else {
                ip(1 + u8::try_from((i / 2) % 9).unwrap())
            };
            log.record(source, "bad \u{1b}[2J frame", at(1 + i));
            lines.extend(log.summary(at(1 + i)));
        }
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert!(
            line.starts_with("10000 unauthenticated connections refused from 10 sources"),
            "{line}"
        );
        // The busiest few sources by name, the rest counted, the peer's
        // text escaped.
        assert!(
            line.contains(": 10.0.0.20 x 5000, 10.0.0.1 x 556, 10.0.0.2 x 556, 7 more"),
            "{line}"
        );
        assert!(
            !line.contains('\u{1b}') && line.contains("\\u{1b}"),
            "{line}"
        );
        // A quiet interval gives no line; the next refusal after it is told.
        assert_eq!(log.summary(at(40_000)), None);
        log.record(None, "no hello", at(50_000));
        let last = log.summary(at(50_000)).unwrap();
        assert!(last.contains("local clients x 1"), "{last}");
    }

    #[test]
    fn admitting_past_the_pool_closes_others_and_tickets_free_their_place() {
        let pool = Arc::new(Pool::default());
        let closed = Arc::new(AtomicUsize::new(0));
        let mut tickets = Vec::new();
        for i in 0..MAX_UNPROVEN + 10 {
            let c = Arc::clone(&closed);
            let source = ip(u8::try_from(i % 7).unwrap());
            tickets.push(pool.admit(
                source,
                Box::new(move || {
                    c.fetch_add(1, Ordering::SeqCst);
                }),
            ));
        }
        assert_eq!(pool.len(), MAX_UNPROVEN);
        assert_eq!(closed.load(Ordering::SeqCst), 10);
        tickets[0].started();
        tickets.clear();
        assert_eq!(pool.len(), 0);
    }
}
