//! The library's log: one line per event worth knowing (a connection
//! moved to shared memory or left on the kernel's TCP and why, a
//! connection's counters when it closes), appended to the file
//! `NETGAP_PRELOAD_LOG` names, or standard error without it.
//!
//! The file is opened for each line: a program may close or reuse any
//! descriptor number (daemons close everything they did not open), so the
//! library keeps none of its own open for the log.

use std::fmt::Write as _;

/// Appends one line, prefixed with the library's name and the process id.
pub(crate) fn line(args: std::fmt::Arguments<'_>) {
    let mut text = String::with_capacity(160);
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    let _ = write!(text, "netgap-preload[{pid}]: ");
    let _ = text.write_fmt(args);
    text.retain(|c| c != '\n');
    text.push('\n');
    let (fd, opened) = match crate::settings().log_path.as_deref() {
        Some(p) => {
            // SAFETY: `p` is a NUL-terminated path; the flags and mode are
            // plain integers. `open` is not interposed by this library.
            let fd = unsafe {
                libc::open(
                    p.as_ptr(),
                    libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd < 0 {
                (2, false)
            } else {
                (fd, true)
            }
        }
        None => (2, false),
    };
    // SAFETY: `text` is valid for reads of its length; an O_APPEND write of
    // one short line lands whole, so lines of concurrent processes do not
    // mix. A failed write is ignored: the log must never break the program.
    unsafe {
        crate::real::write()(fd, text.as_ptr().cast(), text.len());
        if opened {
            crate::real::close()(fd);
        }
    }
}

/// Logs one line, formatted as by `format!`.
macro_rules! log_line {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!($($arg)*))
    };
}
pub(crate) use log_line;
