//! Socket options of a TCP socket, as the transports built on kernel TCP
//! (tcp, uring) and the multi-client flow engine apply them: the ones set
//! before connect or listen, and the ones of a connected stream.

use crate::TransportError;
use netgap_core::spec::TransportOptions;
use socket2::Socket;
use std::net::TcpStream;

/// The error of setting `option` on a socket of `transport`.
pub(crate) fn opt_err(
    transport: &'static str,
    option: &'static str,
) -> impl FnOnce(std::io::Error) -> TransportError {
    move |source| TransportError::Option {
        transport,
        option,
        source,
    }
}

/// Applies the options that must be set before connect or listen: buffer
/// sizes (so the window scale is negotiated for them) and the congestion
/// control algorithm.
pub(crate) fn apply_before_connect(
    transport: &'static str,
    socket: &Socket,
    options: &TransportOptions,
) -> Result<(), TransportError> {
    if let Some(b) = options.sndbuf_bytes {
        socket
            .set_send_buffer_size(b as usize)
            .map_err(opt_err(transport, "SO_SNDBUF"))?;
    }
    if let Some(b) = options.rcvbuf_bytes {
        socket
            .set_recv_buffer_size(b as usize)
            .map_err(opt_err(transport, "SO_RCVBUF"))?;
    }
    if let Some(name) = &options.congestion {
        socket
            .set_tcp_congestion(name.as_bytes())
            .map_err(opt_err(transport, "TCP_CONGESTION"))?;
    }
    Ok(())
}

fn set_int_opt(
    transport: &'static str,
    stream: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
    option: &'static str,
    value: libc::c_int,
) -> Result<(), TransportError> {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live local.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(opt_err(transport, option)(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Applies the options of a connected stream: TCP_NODELAY, SO_BUSY_POLL,
/// SO_ZEROCOPY.
pub(crate) fn apply_connected(
    transport: &'static str,
    stream: &TcpStream,
    options: &TransportOptions,
) -> Result<(), TransportError> {
    stream
        .set_nodelay(options.nodelay)
        .map_err(opt_err(transport, "TCP_NODELAY"))?;
    if let Some(us) = options.busy_poll_us {
        set_int_opt(
            transport,
            stream,
            libc::SOL_SOCKET,
            libc::SO_BUSY_POLL,
            "SO_BUSY_POLL",
            us as libc::c_int,
        )?;
    }
    if options.zerocopy {
        set_int_opt(
            transport,
            stream,
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            "SO_ZEROCOPY",
            1,
        )?;
    }
    if options.quickack {
        set_int_opt(
            transport,
            stream,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            "TCP_QUICKACK",
            1,
        )?;
    }
    Ok(())
}
