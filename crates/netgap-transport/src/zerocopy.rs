//! MSG_ZEROCOPY sends for tcp (`--zerocopy`). The kernel may keep reading a
//! zero-copy buffer after `send` returns, until it posts a completion on the
//! socket's error queue; a test reuses its buffers, so every `send_all` waits
//! for the completions of its own sends before it returns. On loopback the
//! kernel copies anyway (and says so in the completion), so the option shows
//! its cost there rather than its gain.

use super::stream_socket::{Half, StreamFlow};
use super::{Flow, FlowConfig, FlowError, Receiver, Sender};
use netgap_core::spec::Mode;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

/// `SO_EE_ORIGIN_ZEROCOPY` from linux/errqueue.h (not in the libc crate).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;

/// A tcp flow whose sends use MSG_ZEROCOPY.
pub(crate) struct ZeroCopyFlow {
    tx: ZeroCopySender,
    rx: Half<TcpStream>,
}

/// Sending half: zero-copy sends plus completion reaping.
pub(crate) struct ZeroCopySender {
    stream: TcpStream,
    mode: Mode,
    timeout: Duration,
    /// Zero-copy send calls that succeeded so far (the kernel numbers them
    /// from 0, wrapping at 2^32).
    issued: u32,
    /// Sends whose completion has arrived: every number below this.
    completed: u32,
}

impl ZeroCopyFlow {
    /// Wraps a connected stream that has SO_ZEROCOPY set.
    pub(crate) fn new(stream: TcpStream, config: &FlowConfig) -> io::Result<ZeroCopyFlow> {
        let tx_stream = stream.try_clone()?;
        let (_, rx) = StreamFlow::new(stream, config.mode, config.io_timeout)?.into_parts();
        Ok(ZeroCopyFlow {
            tx: ZeroCopySender {
                stream: tx_stream,
                mode: config.mode,
                timeout: config.io_timeout,
                issued: 0,
                completed: 0,
            },
            rx,
        })
    }
}

impl ZeroCopySender {
    fn send_zc(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let flags = libc::MSG_ZEROCOPY
            | libc::MSG_NOSIGNAL
            | if self.mode == Mode::Poll {
                libc::MSG_DONTWAIT
            } else {
                0
            };
        let deadline = Instant::now() + self.timeout;
        loop {
            // SAFETY: the pointer and length come from a live slice; send
            // does not keep them past the call except as MSG_ZEROCOPY pages,
            // which `send_all` waits for before the caller can reuse them.
            let rc = unsafe {
                libc::send(
                    self.stream.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    flags,
                )
            };
            if rc > 0 {
                self.issued = self.issued.wrapping_add(1);
                return Ok(rc as usize);
            }
            if rc == 0 {
                return Err(FlowError::Closed);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if self.mode == Mode::Poll => {
                    // The error queue can fill and stall sends: reap as we wait.
                    self.reap()?;
                    if Instant::now() >= deadline {
                        return Err(FlowError::TimedOut {
                            timeout_ms: self.timeout.as_millis(),
                        });
                    }
                    std::hint::spin_loop();
                }
                io::ErrorKind::OutOfMemory => {
                    // ENOBUFS: too many pages pinned; reap and retry.
                    self.wait_completions(self.issued)?;
                }
                _ => return Err(FlowError::from_io(e, self.timeout)),
            }
        }
    }

    /// Reads every completion queued now, without blocking.
    fn reap(&mut self) -> Result<(), FlowError> {
        loop {
            let mut control = [0u64; 16];
            let mut msg: libc::msghdr = unsafe {
                // SAFETY: msghdr is plain data; all-zero is a valid empty header.
                std::mem::zeroed()
            };
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: msg points at a live, correctly sized control buffer.
            let rc = unsafe {
                libc::recvmsg(
                    self.stream.as_raw_fd(),
                    &mut msg,
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(FlowError::Io(e)),
                };
            }
            // SAFETY: the CMSG_* helpers walk the control buffer the kernel
            // filled, within msg_controllen.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
                while !cmsg.is_null() {
                    let level = (*cmsg).cmsg_level;
                    let kind = (*cmsg).cmsg_type;
                    let is_recverr = (level == libc::SOL_IP && kind == libc::IP_RECVERR)
                        || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR);
                    if is_recverr {
                        let err: libc::sock_extended_err =
                            std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                        if err.ee_origin == SO_EE_ORIGIN_ZEROCOPY && err.ee_errno == 0 {
                            // [ee_info, ee_data] is an inclusive range of
                            // completed sends, reported in order.
                            self.completed = err.ee_data.wrapping_add(1);
                        }
                    }
                    cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
                }
            }
        }
    }

    /// Waits until every send numbered below `upto` has completed.
    fn wait_completions(&mut self, upto: u32) -> Result<(), FlowError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            self.reap()?;
            if self.completed == upto {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(FlowError::TimedOut {
                    timeout_ms: self.timeout.as_millis(),
                });
            }
            if self.mode == Mode::Poll {
                std::hint::spin_loop();
            } else {
                use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
                // The error queue signals readiness as POLLERR.
                let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::empty())];
                let _ = poll(&mut fds, PollTimeout::from(10u8));
            }
        }
    }
}

impl Sender for ZeroCopySender {
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let n = self.send_zc(buf)?;
        self.wait_completions(self.issued)?;
        Ok(n)
    }

    fn send_all(&mut self, mut buf: &[u8]) -> Result<(), FlowError> {
        while !buf.is_empty() {
            let n = self.send_zc(buf)?;
            buf = &buf[n..];
        }
        self.wait_completions(self.issued)
    }
}

impl Flow for ZeroCopyFlow {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn data_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.tx.stream.as_fd())
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }
}
