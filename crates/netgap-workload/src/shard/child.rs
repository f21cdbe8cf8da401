//! The shard's side: this binary run as a shard process, serving on the
//! listener it inherited until the agent stops it or closes its stdin.

use super::message::{read_line, write_line, FromShard, ShardConfig, ShardTotals};
use super::{ShardError, LISTENER_FD, STATUS_EVERY};
use netgap_transport::flows::FlowServer;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Runs this process as a shard (the binary's hidden `SUBCOMMAND`):
/// reads its configuration from stdin, serves on the listener it inherited
/// until told to stop or its stdin closes, and reports on stdout. A
/// failure is reported as `FromShard::Failed` and returned.
pub fn run_shard() -> Result<(), ShardError> {
    let mut out = std::io::stdout().lock();
    let result = serve_shard(&mut out);
    if let Err(e) = &result {
        let _ = write_line(
            &mut out,
            &FromShard::Failed {
                message: e.to_string(),
            },
        );
    }
    result
}

fn serve_shard(out: &mut impl Write) -> Result<(), ShardError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ShardError::Io { what, source }
    };
    let mut stdin = BufReader::new(std::io::stdin());
    let line = read_line(&mut stdin)
        .map_err(io("reading the configuration"))?
        .ok_or_else(|| ShardError::Config("no configuration on stdin".into()))?;
    let config: ShardConfig =
        serde_json::from_str(&line).map_err(|e| ShardError::Config(e.to_string()))?;
    let valid = config.validate()?;
    let listener = inherited_listener()?;
    let server = FlowServer::on_listener(listener, valid.work, valid.cfg, valid.max_open)?;
    write_line(out, &FromShard::Serving).map_err(io("reporting"))?;
    // Any line (a stop), the end of stdin or an unreadable stdin: stop.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("shard control".into())
        .spawn(move || {
            let _ = read_line(&mut stdin);
            flag.store(true, Ordering::Relaxed);
        })
        .map_err(io("starting the control reader"))?;
    while !stop.load(Ordering::Relaxed) {
        let status = FromShard::Status {
            accepted: server.accepted_connections(),
            open: server.open_connections() as u64,
        };
        if write_line(out, &status).is_err() {
            // The agent is gone: stop serving.
            break;
        }
        std::thread::sleep(STATUS_EVERY);
    }
    let totals = server.stop()?;
    let done = FromShard::Done {
        totals: ShardTotals::from(&totals),
        peak_rss_kib: netgap_transport::cpu::peak_rss_kib(),
    };
    write_line(out, &done).map_err(io("reporting"))?;
    Ok(())
}

/// Takes [`LISTENER_FD`] as the shared listener, once it is seen to be a
/// listening TCP socket.
fn inherited_listener() -> Result<TcpListener, ShardError> {
    use nix::sys::socket::{getsockopt, sockopt};
    // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags; it fails
    // (EBADF) when the descriptor is not open.
    if unsafe { libc::fcntl(LISTENER_FD, libc::F_GETFD) } < 0 {
        return Err(ShardError::NoListener);
    }
    // SAFETY: the descriptor is open (checked above) and nothing else in
    // this process owns it: the agent put it there for this process, and
    // the standard streams are 0 to 2.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(LISTENER_FD) };
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    let stream =
        getsockopt(&fd, sockopt::SockType).is_ok_and(|t| t == nix::sys::socket::SockType::Stream);
    if !listening || !stream {
        return Err(ShardError::NoListener);
    }
    let listener = TcpListener::from(fd);
    match listener.local_addr() {
        Ok(_) => Ok(listener),
        Err(_) => Err(ShardError::NoListener),
    }
}
