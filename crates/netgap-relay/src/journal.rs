//! The relay's log lines: those a client's requests cause, held to a few
//! a second per uid, and those the other relay's `OPEN`s cause, per link
//! ([`crate::limits::LogLimit`]); what passes the limit is counted and
//! said in one line.

use crate::limits::{LogLimit, Verdict};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

macro_rules! log {
    ($($t:tt)*) => {
        eprintln!("netgap relay: {}", format!($($t)*))
    };
}

/// The log lines a client's requests cause (refusals, drops, the
/// links they open), held to a few a second per uid
/// ([`LogLimit`]); what passes the limit is counted and said in one
/// line. Lines of connections the other relay accepted are written
/// as they come (each needed a request).
pub(crate) struct Journal {
    pub(crate) limit: Mutex<LogLimit>,
    /// The lines the other relay's requests cause on a link (an
    /// `OPEN` no listen waits for), per link: the other relay's
    /// programs' requests make them.
    pub(crate) links: Mutex<LogLimit>,
}

impl Journal {
    pub(crate) fn new() -> Arc<Journal> {
        Arc::new(Journal {
            limit: Mutex::new(LogLimit::new("uid")),
            links: Mutex::new(LogLimit::new("link with flow")),
        })
    }

    /// Writes `line` (from a client of `uid`) if the uid's lines are
    /// within the limit. What a client wrote in it is printable ASCII
    /// (the request's decoder refuses anything else).
    pub(crate) fn client(&self, uid: u32, line: &str) {
        Self::write(&self.limit, uid, line);
    }

    /// Writes `line` (about the link with flow id `flow`) if the
    /// link's lines are within the limit.
    pub(crate) fn link(&self, flow: u16, line: &str) {
        Self::write(&self.links, u32::from(flow), line);
    }

    pub(crate) fn write(limit: &Mutex<LogLimit>, key: u32, line: &str) {
        let v = limit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .line(key, Instant::now());
        if let Verdict::Write(dropped) = v {
            if let Some(d) = dropped {
                log!("{d}");
            }
            log!("{line}");
        }
    }

    /// Says, about every second, the counts of lines not written
    /// whose uid may write again (a client that stopped).
    pub(crate) fn spawn_summaries(self: &Arc<Self>) {
        let j = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("relay-log".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(j) = j.upgrade() else { return };
                for limit in [&j.limit, &j.links] {
                    let due = limit
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .due(Instant::now());
                    for d in due {
                        log!("{d}");
                    }
                }
            });
        // Without the thread, a count still comes out with the key's
        // next line.
        if let Err(e) = spawned {
            log!("no thread for the log's counts: {e}");
        }
    }
}
