//! Hostile files for the tests of bounded reading: FIFOs, sparse files past
//! a cap, and running a command that must end at once on them.

/// Runs `cmd` to its end, which must come within `limit` (a read that
/// blocks on a FIFO would never end): its output.
pub(crate) fn output_within(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
) -> std::process::Output {
    use std::process::Stdio;
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let pid = i32::try_from(child.id()).expect("pid");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => {
            let _ = waiter.join();
            out.expect("waits")
        }
        Err(_) => {
            // SAFETY: `pid` is our child, not yet reaped (its waiter is
            // still waiting), so the number cannot name another process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = waiter.join();
            panic!("{cmd:?} still running after {limit:?}");
        }
    }
}

/// A FIFO at `path`, with no writer.
pub(crate) fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().expect("UTF-8 path")).expect("no NUL");
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A sparse file of `len_bytes` at `path`: its length without its blocks.
pub(crate) fn sparse(path: &std::path::Path, len_bytes: u64) {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(len_bytes))
        .expect("sparse file");
}

/// Standard error of a failed command (exit status 1) that must be one
/// line, no panic.
pub(crate) fn one_error_line(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    super::one_line_error(out, "the command", "")
}
