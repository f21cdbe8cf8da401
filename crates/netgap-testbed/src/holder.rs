//! Who holds a testbed's lock: what the lock file records and how an
//! error names it, below both the lock and the errors.

/// Who holds a testbed's lock, as the holder recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its process id.
    pub pid: u32,
    /// Its command (`netgap study 000`).
    pub command: String,
}

impl Holder {
    /// The record a holder writes in the lock file: `PID COMMAND`, one line.
    pub(crate) fn record(&self) -> String {
        format!("{} {}\n", self.pid, self.command.replace('\n', " "))
    }

    /// The holder a lock file's text records, if it records one.
    pub(crate) fn parse(text: &str) -> Option<Holder> {
        let (pid, command) = text.lines().next()?.split_once(' ')?;
        Some(Holder {
            pid: pid.parse().ok()?,
            command: command.to_string(),
        })
    }
}

/// How a refusal names the holder of a testbed's lock.
pub(crate) fn holder_text(holder: &Option<Holder>) -> String {
    match holder {
        Some(h) => format!("`{}` (pid {})", h.command, h.pid),
        None => "another netgap process".to_string(),
    }
}
