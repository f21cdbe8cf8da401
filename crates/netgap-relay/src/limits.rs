//! What one user may make the relay do over time, as plain code (the
//! caller passes the time): requests a second ([`RequestRate`]) and log
//! lines a second ([`LogLimit`]), each per uid, so a client sending
//! garbage, or asking again and again, neither keeps the relay busy nor
//! fills its log. A line past the limit is counted, and the count comes
//! out as one line once the uid may write again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Log lines one uid may have written a second, on average.
pub(crate) const LOG_LINES_PER_S: u32 = 5;
/// Log lines one uid may have written at once.
pub(crate) const LOG_BURST_LINES: u32 = 20;
/// Most uids whose state is kept: past it, those idle (a full bucket,
/// nothing counted) go first, and while none is idle a new uid is held
/// back (its request refused, its line not written). A uid is a user of
/// this host, so their number is bounded anyway; this bounds the maps
/// even against clients of root's that change their uid.
const MAX_TRACKED_UIDS: usize = 4096;

/// A token bucket: `rate` tokens a second, at most `burst` in hand.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            at: now,
        }
    }

    /// Refills to `now`; whether a token was taken.
    fn take(&mut self, rate: u32, burst: u32, now: Instant) -> bool {
        self.refill(rate, burst, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn refill(&mut self, rate: u32, burst: u32, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * f64::from(rate)).min(f64::from(burst));
        self.at = now;
    }

    fn is_full(&mut self, rate: u32, burst: u32, now: Instant) -> bool {
        self.refill(rate, burst, now);
        self.tokens >= f64::from(burst)
    }
}

/// Requests per uid and second (`--max-requests-per-uid`): a bucket of a
/// second's worth per uid.
#[derive(Debug)]
pub(crate) struct RequestRate {
    per_s: u32,
    uids: HashMap<u32, Bucket>,
}

impl RequestRate {
    /// At most `per_s` requests a second per uid (and as many at once).
    pub(crate) fn new(per_s: u32) -> RequestRate {
        RequestRate {
            per_s: per_s.max(1),
            uids: HashMap::new(),
        }
    }

    /// Whether `uid` may make a request at `now` (it is counted if so).
    pub(crate) fn admit(&mut self, uid: u32, now: Instant) -> bool {
        let (rate, burst) = (self.per_s, self.per_s);
        if self.uids.len() >= MAX_TRACKED_UIDS && !self.uids.contains_key(&uid) {
            self.uids.retain(|_, b| !b.is_full(rate, burst, now));
            if self.uids.len() >= MAX_TRACKED_UIDS {
                return false;
            }
        }
        self.uids
            .entry(uid)
            .or_insert_with(|| Bucket::full(burst, now))
            .take(rate, burst, now)
    }
}

/// One uid's log state: its bucket, and the lines not written since the
/// last one that was.
#[derive(Debug)]
struct UidLog {
    bucket: Bucket,
    dropped: u64,
    since: Option<Instant>,
}

/// Lines not written for a uid (or another key), to say in one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// What the key is (`uid`).
    pub(crate) label: &'static str,
    /// The client's uid (or the other key).
    pub(crate) uid: u32,
    /// Lines not written.
    pub(crate) lines: u64,
    /// Since the first of them.
    pub(crate) over: Duration,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {} more line{} not written in the last {} s (at most {LOG_LINES_PER_S} a second per {})",
            self.label,
            self.uid,
            self.lines,
            if self.lines == 1 { "" } else { "s" },
            self.over.as_secs().max(1),
            self.label
        )
    }
}

/// What to do with a line for a uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Write it, after the line saying what was dropped before it, if any.
    Write(Option<Dropped>),
    /// Count it, do not write it.
    Drop,
}

/// Log lines per uid (or per another key, such as a link's):
/// [`LOG_BURST_LINES`] at once, [`LOG_LINES_PER_S`] a second after that;
/// what passes the limit is counted and said in one line when the uid may
/// write again ([`LogLimit::line`] or [`LogLimit::due`]).
#[derive(Debug)]
pub(crate) struct LogLimit {
    label: &'static str,
    uids: HashMap<u32, UidLog>,
}

impl LogLimit {
    /// Lines held per key, which the lines counting the rest call
    /// `label` (`uid`).
    pub(crate) fn new(label: &'static str) -> LogLimit {
        LogLimit {
            label,
            uids: HashMap::new(),
        }
    }

    /// Whether a line for `uid` is written at `now`.
    pub(crate) fn line(&mut self, uid: u32, now: Instant) -> Verdict {
        let (rate, burst) = (LOG_LINES_PER_S, LOG_BURST_LINES);
        if self.uids.len() >= MAX_TRACKED_UIDS && !self.uids.contains_key(&uid) {
            self.uids
                .retain(|_, u| u.dropped > 0 || !u.bucket.is_full(rate, burst, now));
            if self.uids.len() >= MAX_TRACKED_UIDS {
                return Verdict::Drop;
            }
        }
        let u = self.uids.entry(uid).or_insert_with(|| UidLog {
            bucket: Bucket::full(burst, now),
            dropped: 0,
            since: None,
        });
        // A pending count takes a token of its own: its line is written
        // too.
        let need = if u.dropped > 0 { 2.0 } else { 1.0 };
        u.bucket.refill(rate, burst, now);
        if u.bucket.tokens < need {
            u.dropped += 1;
            u.since.get_or_insert(now);
            return Verdict::Drop;
        }
        u.bucket.tokens -= need;
        Verdict::Write(take_dropped(self.label, uid, u, now))
    }

    /// The counts of lines not written that may be said now (their uid
    /// has a token again), for a caller that looks every second or so.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Dropped> {
        let mut out = Vec::new();
        for (uid, u) in &mut self.uids {
            if u.dropped > 0 && u.bucket.take(LOG_LINES_PER_S, LOG_BURST_LINES, now) {
                out.extend(take_dropped(self.label, *uid, u, now));
            }
        }
        out.sort_by_key(|d| d.uid);
        out
    }
}

fn take_dropped(label: &'static str, uid: u32, u: &mut UidLog, now: Instant) -> Option<Dropped> {
    let since = u.since.take()?;
    let lines = std::mem::take(&mut u.dropped);
    Some(Dropped {
        label,
        uid,
        lines,
        over: now.saturating_duration_since(since),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_held_to_the_rate_per_uid() {
        let t0 = Instant::now();
        let mut r = RequestRate::new(10);
        let passed = (0..100).filter(|_| r.admit(7, t0)).count();
        assert_eq!(passed, 10);
        // Another uid has its own.
        assert!(r.admit(8, t0));
        // A tenth of a second gives one more.
        let t1 = t0 + Duration::from_millis(100);
        assert!(r.admit(7, t1));
        assert!(!r.admit(7, t1));
        // A long pause fills the bucket, not past a second's worth.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!((0..100).filter(|_| r.admit(7, t2)).count(), 10);
    }

    #[test]
    fn the_tracked_uids_stay_bounded() {
        let t0 = Instant::now();
        let mut r = RequestRate::new(1);
        // All at once: the first ones are tracked, the rest held back.
        let admitted = (0..(MAX_TRACKED_UIDS as u32 * 3))
            .filter(|uid| r.admit(*uid, t0))
            .count();
        assert_eq!(admitted, MAX_TRACKED_UIDS);
        assert_eq!(r.uids.len(), MAX_TRACKED_UIDS);
        // Once they are idle again, new uids take their place.
        assert!(r.admit(u32::MAX, t0 + Duration::from_secs(5)));
        assert_eq!(r.uids.len(), 1);
        let mut l = LogLimit::new("uid");
        for uid in 0..(MAX_TRACKED_UIDS as u32 * 3) {
            let _ = l.line(uid, t0 + Duration::from_secs(u64::from(uid)));
        }
        assert!(l.uids.len() <= MAX_TRACKED_UIDS, "{}", l.uids.len());
    }

    /// A client sending garbage as fast as it can writes a burst of
    /// lines, then a few a second, each later one after a line counting
    /// what was not written.
    #[test]
    fn a_flood_of_lines_is_a_burst_then_a_few_a_second_and_a_count() {
        let t0 = Instant::now();
        let mut l = LogLimit::new("uid");
        let mut written = 0;
        for _ in 0..1000 {
            if let Verdict::Write(d) = l.line(65534, t0) {
                assert_eq!(d, None);
                written += 1;
            }
        }
        assert_eq!(written, LOG_BURST_LINES);
        // Another uid is not held back by it.
        assert_eq!(l.line(0, t0), Verdict::Write(None));
        // A second later the count is due, once.
        let t1 = t0 + Duration::from_secs(1);
        let due = l.due(t1);
        assert_eq!(
            due,
            vec![Dropped {
                label: "uid",
                uid: 65534,
                lines: 1000 - u64::from(LOG_BURST_LINES),
                over: Duration::from_secs(1),
            }]
        );
        assert!(due[0].to_string().starts_with("uid 65534: 980 more lines"));
        assert!(l.due(t1).is_empty());
        // Over ten more seconds of flood, about five lines a second are
        // written, each with the count before it.
        let mut lines = 0;
        for ms in (0..10_000).step_by(10) {
            let now = t1 + Duration::from_millis(ms);
            if let Verdict::Write(d) = l.line(65534, now) {
                lines += 1 + usize::from(d.is_some());
            }
        }
        assert!((40..=60).contains(&lines), "{lines} lines in 10 s of flood");
    }

    #[test]
    fn a_pending_count_comes_out_with_the_next_line_written() {
        let t0 = Instant::now();
        let mut l = LogLimit::new("uid");
        for _ in 0..LOG_BURST_LINES + 3 {
            let _ = l.line(5, t0);
        }
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(
            l.line(5, t1),
            Verdict::Write(Some(Dropped {
                label: "uid",
                uid: 5,
                lines: 3,
                over: Duration::from_secs(2)
            }))
        );
        assert_eq!(l.line(5, t1), Verdict::Write(None));
        assert!(l.due(t1).is_empty());
    }
}
