//! The preload library (`netgap wrap -t shm`) against the kernel, call by
//! call: a scripted client and a scripted server (this binary's ignored
//! tests `client` and `server`, run as child processes) make a fixed
//! sequence of socket calls on TCP connections over 127.0.0.1 and write
//! what each call returned (its value, the errno's name, whether the bytes
//! read are the bytes the other end sent, the revents of a poll) to a
//! trace, one line a call. Each scenario runs with neither end wrapped
//! (the kernel's own answers: the reference), both ends wrapped, only the
//! client wrapped and only the server wrapped (an unwrapped peer keeps the
//! connection on the kernel's TCP, so these two check that the library
//! stays out of the way), and every trace must equal the kernel's. With
//! both ends wrapped the library's log must say that every connection
//! moved to shm, so a run cannot pass by staying on TCP.
//!
//! Whatever one end does after the other acted is ordered by a side
//! channel the library does not touch: two FIFOs, one each way, carrying
//! one named line per step. Where the kernel's answer would depend on
//! when a packet lands (the peer's data, FIN or reset), the end first waits
//! for it, and records what it waited on as one line: the bytes readable
//! (`FIONREAD`) or the kernel socket's TCP state (`TCP_INFO`, which the
//! library passes to the kernel socket under the descriptor, the one that
//! carries the FIN or the reset in every configuration). A bulk transfer
//! is one line (its total, whether every byte was the one sent, and the
//! call that ended it), since how a stream splits into reads is the
//! scheduler's choice. A helper the library leaves blocked is killed after
//! [`RUN_DEADLINE`], and its trace ends where it stopped.

use crate::common;
use libc::c_int;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::IntoRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes a single read asks for.
const BUF: usize = 65536;
/// How long an end waits for the kernel's packets (data, FIN, reset) to
/// land before it records what it sees. The kernel's own run never waits
/// this long; a configuration that does already differs.
const LAND_WAIT: Duration = Duration::from_secs(1);
/// How long one configuration of one scenario may run before both helpers
/// are killed (a helper the library leaves blocked forever).
const RUN_DEADLINE: Duration = Duration::from_secs(5);
/// The environment variables that tell a helper what to run.
const SCENARIO_ENV: &str = "NETGAP_CONFORMANCE_SCENARIO";
const DIR_ENV: &str = "NETGAP_CONFORMANCE_DIR";

/// Byte `at` of the stream in direction `dir` (0: client to server, 1:
/// server to client): a sequence that repeats nowhere near the sizes used,
/// so a lost, doubled or shifted piece shows.
fn pattern(dir: u8, at: u64) -> u8 {
    let x = (at ^ (u64::from(dir) << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8
}

/// The name of an errno value.
fn errno_name(e: c_int) -> String {
    let name = match e {
        libc::EAGAIN => "EAGAIN",
        libc::EPIPE => "EPIPE",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOTCONN => "ENOTCONN",
        libc::EINVAL => "EINVAL",
        libc::EBADF => "EBADF",
        libc::EIO => "EIO",
        libc::EINTR => "EINTR",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::EFAULT => "EFAULT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESHUTDOWN => "ESHUTDOWN",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

fn last_errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A call's return value as the trace shows it: the value, or -1 and the
/// errno's name (read at once after the call).
fn outcome(r: isize) -> String {
    if r < 0 {
        format!("-1 {}", errno_name(last_errno()))
    } else {
        r.to_string()
    }
}

/// Poll revents by name.
fn revents_text(ev: i16) -> String {
    let names = [
        (libc::POLLIN, "IN"),
        (libc::POLLPRI, "PRI"),
        (libc::POLLOUT, "OUT"),
        (libc::POLLERR, "ERR"),
        (libc::POLLHUP, "HUP"),
        (libc::POLLNVAL, "NVAL"),
        (libc::POLLRDHUP, "RDHUP"),
    ];
    let set: Vec<&str> = names
        .iter()
        .filter(|(bit, _)| ev & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    if set.is_empty() {
        "none".into()
    } else {
        set.join("|")
    }
}

/// The name of a TCP state (`tcpi_state`).
fn state_name(s: u8) -> String {
    let name = match s {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        _ => return format!("state {s}"),
    };
    name.to_string()
}

const TIME_WAIT: u8 = 6;
const CLOSE: u8 = 7;
const CLOSE_WAIT: u8 = 8;

/// The kernel socket's TCP state (0 if it cannot be read).
fn tcp_state(fd: c_int) -> u8 {
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is valid for writes of `len` bytes; TCP_INFO fills at
    // most that many.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r == 0 {
        info[0]
    } else {
        0
    }
}

/// One end of a connection in a helper.
struct Conn {
    fd: c_int,
    /// Its number in this run (from 1), the prefix of its trace lines.
    id: u32,
    /// The direction of the bytes this end sends (see [`pattern`]).
    out_dir: u8,
    /// Bytes sent and received so far: where the pattern continues.
    sent: u64,
    received: u64,
}

/// A helper's side of a run: its trace, the side channel to the other
/// helper, and its connections.
struct Side {
    trace: File,
    tx: File,
    rx: BufReader<File>,
    conns: u32,
    /// The server's listener, or the client's port to connect to.
    listener: Option<TcpListener>,
    port: u16,
}

impl Side {
    fn line(&mut self, c: &Conn, text: &str) {
        writeln!(self.trace, "#{} {text}", c.id).expect("trace written");
    }

    /// Tells the other helper that step `tag` is done.
    fn signal(&mut self, tag: &str) {
        writeln!(self.tx, "{tag}").expect("side channel written");
    }

    /// Waits until the other helper says step `tag` is done.
    fn wait(&mut self, tag: &str) {
        let mut got = String::new();
        let n = self.rx.read_line(&mut got).expect("side channel read");
        assert!(n > 0, "the other helper ended before step {tag:?}");
        assert_eq!(got.trim_end(), tag, "steps out of order");
    }

    fn new_conn(&mut self, fd: c_int, out_dir: u8) -> Conn {
        self.conns += 1;
        Conn {
            fd,
            id: self.conns,
            out_dir,
            sent: 0,
            received: 0,
        }
    }

    /// The client connects to the server's port.
    fn connect(&mut self) -> Conn {
        let r = TcpStream::connect(("127.0.0.1", self.port));
        let fd = match r {
            Ok(s) => s.into_raw_fd(),
            Err(e) => panic!("connect: {e}"),
        };
        let c = self.new_conn(fd, 0);
        self.line(&c, "connect -> ok");
        c
    }

    /// The server accepts the next connection.
    fn accept(&mut self) -> Conn {
        let l = self.listener.as_ref().expect("the server's listener");
        let fd = match l.accept() {
            Ok((s, _)) => s.into_raw_fd(),
            Err(e) => panic!("accept: {e}"),
        };
        let c = self.new_conn(fd, 1);
        self.line(&c, "accept -> ok");
        c
    }

    /// Checks `buf` against what the other end sent from `c.received` on,
    /// and moves past it.
    fn take_in(c: &mut Conn, buf: &[u8]) -> bool {
        let dir = 1 - c.out_dir;
        let ok = buf
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(dir, c.received + i as u64));
        c.received += buf.len() as u64;
        ok
    }

    /// The next `n` bytes this end sends.
    fn next_out(c: &Conn, n: usize) -> Vec<u8> {
        (0..n as u64)
            .map(|i| pattern(c.out_dir, c.sent + i))
            .collect()
    }

    /// One `read` of up to `cap` bytes.
    fn read(&mut self, c: &mut Conn, cap: usize) {
        self.recv_as(c, cap, None);
    }

    /// One `recv` of up to `cap` bytes with `flags` (named `flag_names`).
    fn recv(&mut self, c: &mut Conn, cap: usize, flags: c_int, flag_names: &str) {
        self.recv_as(c, cap, Some((flags, flag_names)));
    }

    fn recv_as(&mut self, c: &mut Conn, cap: usize, flags: Option<(c_int, &str)>) {
        let mut buf = vec![0u8; cap];
        let r = match flags {
            // SAFETY: `buf` is valid for writes of `cap` bytes.
            None => unsafe { libc::read(c.fd, buf.as_mut_ptr().cast(), cap) },
            // SAFETY: as above.
            Some((f, _)) => unsafe { libc::recv(c.fd, buf.as_mut_ptr().cast(), cap, f) },
        };
        let out = outcome(r);
        let call = match flags {
            None => format!("read({cap})"),
            Some((_, names)) => format!("recv({cap}, {names})"),
        };
        let mut text = format!("{call} -> {out}");
        if r > 0 {
            let peek = flags.is_some_and(|(f, _)| f & libc::MSG_PEEK != 0);
            let at = c.received;
            let ok = Self::take_in(c, &buf[..r as usize]);
            if peek {
                c.received = at;
            }
            text.push_str(if ok {
                " (the bytes sent)"
            } else {
                " (NOT the bytes sent)"
            });
        }
        self.line(c, &text);
    }

    /// Reads until a read returns 0 or fails: one line with the total,
    /// whether it is what the other end sent, and how the last read ended.
    fn read_to_end(&mut self, c: &mut Conn) {
        let mut buf = vec![0u8; BUF];
        let mut total = 0u64;
        let mut ok = true;
        let last = loop {
            // SAFETY: `buf` is valid for writes of its length.
            let r = unsafe { libc::read(c.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                break outcome(r);
            }
            ok &= Self::take_in(c, &buf[..r as usize]);
            total += r as u64;
        };
        let bytes = if ok {
            "the bytes sent"
        } else {
            "NOT the bytes sent"
        };
        self.line(
            c,
            &format!("read until the end -> {total} ({bytes}), then {last}"),
        );
    }

    /// One `write` of `n` bytes.
    fn write(&mut self, c: &mut Conn, n: usize) {
        let buf = Self::next_out(c, n);
        // SAFETY: `buf` is valid for reads of its length.
        let r = unsafe { libc::write(c.fd, buf.as_ptr().cast(), buf.len()) };
        let out = outcome(r);
        if r > 0 {
            c.sent += r as u64;
        }
        self.line(c, &format!("write({n}) -> {out}"));
    }

    /// One `send` of `n` bytes with `MSG_NOSIGNAL`.
    fn send(&mut self, c: &mut Conn, n: usize) {
        let buf = Self::next_out(c, n);
        // SAFETY: `buf` is valid for reads of its length.
        let r = unsafe { libc::send(c.fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        let out = outcome(r);
        if r > 0 {
            c.sent += r as u64;
        }
        self.line(c, &format!("send({n}, MSG_NOSIGNAL) -> {out}"));
    }

    /// One `writev` of pieces of `sizes` bytes.
    fn writev(&mut self, c: &mut Conn, sizes: &[usize]) {
        let total: usize = sizes.iter().sum();
        let buf = Self::next_out(c, total);
        let mut iov = Vec::new();
        let mut at = 0;
        for &n in sizes {
            iov.push(libc::iovec {
                iov_base: buf[at..].as_ptr().cast_mut().cast(),
                iov_len: n,
            });
            at += n;
        }
        // SAFETY: each iovec points into `buf`, valid for reads of its
        // length (the pieces add up to its length).
        let r = unsafe { libc::writev(c.fd, iov.as_ptr(), iov.len() as c_int) };
        let out = outcome(r);
        if r > 0 {
            c.sent += r as u64;
        }
        self.line(c, &format!("writev({sizes:?}) -> {out}"));
    }

    /// Writes `n` bytes however many writes it takes: one line.
    fn write_all(&mut self, c: &mut Conn, n: usize) {
        let goal = c.sent + n as u64;
        self.write_until(c, goal, &format!("write all {n}"));
    }

    /// Writes until `goal` bytes have been sent on `c` in all: one line.
    fn write_until(&mut self, c: &mut Conn, goal: u64, what: &str) {
        let end = loop {
            if c.sent >= goal {
                break "done".to_string();
            }
            let n = (goal - c.sent).min(BUF as u64) as usize;
            let buf = Self::next_out(c, n);
            // SAFETY: `buf` is valid for reads of its length.
            let r = unsafe { libc::write(c.fd, buf.as_ptr().cast(), buf.len()) };
            if r <= 0 {
                break format!("{} sent, then {}", c.sent, outcome(r));
            }
            c.sent += r as u64;
        };
        self.line(c, &format!("{what} -> {end}"));
    }

    /// `poll` for input, output and the peer's hang-up, without waiting.
    fn poll(&mut self, c: &Conn) {
        let mut p = libc::pollfd {
            fd: c.fd,
            events: libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        let out = outcome(r as isize);
        let ev = revents_text(p.revents);
        self.line(c, &format!("poll(IN|OUT|RDHUP, 0) -> {out} {ev}"));
    }

    /// `poll` for input, waiting as long as it takes: whether input is
    /// reported (what else is depends on when the wait ends).
    fn poll_for_input(&mut self, c: &Conn) {
        let mut p = libc::pollfd {
            fd: c.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        let out = outcome(r as isize);
        let has_in = if p.revents & libc::POLLIN != 0 {
            "IN"
        } else {
            "no IN"
        };
        self.line(c, &format!("poll(IN, -1) -> {out} {has_in}"));
    }

    fn shutdown(&mut self, c: &Conn, how: c_int, name: &str) {
        // SAFETY: a plain shutdown of this end's socket.
        let r = unsafe { libc::shutdown(c.fd, how) };
        let out = outcome(r as isize);
        self.line(c, &format!("shutdown({name}) -> {out}"));
    }

    /// `SO_LINGER` on with a zero timeout: the close that follows resets
    /// the connection.
    fn linger_zero(&mut self, c: &Conn) {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: `l` is valid for reads of its size.
        let r = unsafe {
            libc::setsockopt(
                c.fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                std::ptr::from_ref(&l).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        let out = outcome(r as isize);
        self.line(c, &format!("setsockopt(SO_LINGER on 0 s) -> {out}"));
    }

    fn close(&mut self, c: Conn) {
        // SAFETY: this end's own descriptor, closed once (`c` is consumed).
        let r = unsafe { libc::close(c.fd) };
        let out = outcome(r as isize);
        self.line(&c, &format!("close -> {out}"));
    }

    fn fionread_value(c: &Conn) -> (c_int, isize) {
        let mut n: c_int = 0;
        // SAFETY: FIONREAD writes one int, which `n` is.
        let r = unsafe { libc::ioctl(c.fd, libc::FIONREAD, &mut n) };
        (n, r as isize)
    }

    /// `ioctl(FIONREAD)` once.
    fn fionread(&mut self, c: &Conn) {
        let (n, r) = Self::fionread_value(c);
        let out = outcome(r);
        self.line(c, &format!("ioctl(FIONREAD) -> {out}, {n} bytes"));
    }

    /// Waits (up to [`LAND_WAIT`]) until `ioctl(FIONREAD)` says `want`
    /// bytes are readable; records the last answer.
    fn fionread_until(&mut self, c: &Conn, want: c_int) {
        let t0 = Instant::now();
        let (n, r) = loop {
            let (n, r) = Self::fionread_value(c);
            if (r == 0 && n >= want) || t0.elapsed() > LAND_WAIT {
                break (n, r);
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let out = if r == 0 {
            format!("{n} bytes")
        } else {
            outcome(-1)
        };
        self.line(c, &format!("wait for {want} readable: FIONREAD -> {out}"));
    }

    /// Waits (up to [`LAND_WAIT`]) until the kernel socket is in one of
    /// `states` (the peer's FIN or reset landed); records the state.
    fn state_until(&mut self, c: &Conn, states: &[u8]) {
        let t0 = Instant::now();
        let s = loop {
            let s = tcp_state(c.fd);
            if states.contains(&s) || t0.elapsed() > LAND_WAIT {
                break s;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let want: Vec<String> = states.iter().map(|&s| state_name(s)).collect();
        let got = state_name(s);
        self.line(
            c,
            &format!("wait for TCP state {}: {got}", want.join(" or ")),
        );
    }
}

/// A scenario: its name and the two helpers' scripts.
struct Scenario {
    name: &'static str,
    client: fn(&mut Side),
    server: fn(&mut Side),
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "eof_after_data",
        client: eof_after_data_client,
        server: eof_after_data_server,
    },
    Scenario {
        name: "server_closes_first",
        client: server_closes_first_client,
        server: server_closes_first_server,
    },
    Scenario {
        name: "half_close",
        client: half_close_client,
        server: half_close_server,
    },
    Scenario {
        name: "shutdown_read",
        client: shutdown_read_client,
        server: shutdown_read_server,
    },
    Scenario {
        name: "linger_zero_reset",
        client: linger_zero_reset_client,
        server: linger_zero_reset_server,
    },
    Scenario {
        name: "peer_gone",
        client: peer_gone_client,
        server: peer_gone_server,
    },
    Scenario {
        name: "poll_steps",
        client: poll_steps_client,
        server: poll_steps_server,
    },
    Scenario {
        name: "close_with_unread_data",
        client: close_with_unread_data_client,
        server: close_with_unread_data_server,
    },
    Scenario {
        name: "large_blocking_write",
        client: large_blocking_write_client,
        server: large_blocking_write_server,
    },
    Scenario {
        name: "fresh_connection_nonblocking",
        client: fresh_connection_nonblocking_client,
        server: fresh_connection_nonblocking_server,
    },
];

// 1. End of file after data: the server writes N bytes (one byte, less
// than a ring, several rings' worth so that writes wrap and wait) and
// closes; the client reads them all, then 0, and 0 again.

const EOF_SIZES: [usize; 3] = [1, 100_000, 1_000_003];

fn eof_after_data_client(s: &mut Side) {
    for _ in EOF_SIZES {
        let mut c = s.connect();
        s.signal("connected");
        s.read_to_end(&mut c);
        s.read(&mut c, BUF);
        s.read(&mut c, BUF);
        s.close(c);
    }
}

fn eof_after_data_server(s: &mut Side) {
    for n in EOF_SIZES {
        s.wait("connected");
        let mut c = s.accept();
        s.write_all(&mut c, n);
        s.close(c);
    }
}

// 2. The server closes first, HTTP/1.0 style, on fresh connections: the
// client sends a request and reads the response to its end; the server
// reads the request, answers and closes. No reset anywhere. The rounds
// take turns: the client waits in poll before reading in odd rounds, as an
// event loop does; in the third of each four the server reads the request
// in pieces, as a parser reading a line at a time does, and in the fourth
// it does so with a poll of the client's between its first piece and the
// rest (a moment at which a library that moved the connection has bytes of
// the request still unread on the server's side).

const HTTP_ROUNDS: u32 = 50;
const REQUEST: usize = 18;
const REQUEST_PIECE: usize = 8;
const RESPONSE: usize = 1200;

fn server_closes_first_client(s: &mut Side) {
    for round in 0..HTTP_ROUNDS {
        let mut c = s.connect();
        s.write(&mut c, REQUEST);
        if round % 4 == 3 {
            s.wait("first piece read");
            s.poll(&c);
            s.signal("polled");
        }
        if round % 2 == 1 {
            s.poll_for_input(&c);
        }
        s.read(&mut c, BUF);
        s.read(&mut c, BUF);
        s.read(&mut c, BUF);
        s.close(c);
    }
}

fn server_closes_first_server(s: &mut Side) {
    for round in 0..HTTP_ROUNDS {
        let mut c = s.accept();
        if round % 4 < 2 {
            s.read(&mut c, BUF);
        } else {
            for piece in 0..REQUEST.div_ceil(REQUEST_PIECE) {
                if piece == 1 && round % 4 == 3 {
                    s.signal("first piece read");
                    s.wait("polled");
                }
                s.read(&mut c, REQUEST_PIECE);
            }
        }
        s.write(&mut c, RESPONSE);
        s.close(c);
    }
}

// 3. Half-close with data in flight both ways: the server greets; the
// client, the greeting unread, uploads more than a ring and shuts down its
// sending side (a send after that fails); the server reads to the end,
// replies and closes; the client reads greeting and reply, then the end.

const GREETING: usize = 1000;
const UPLOAD: usize = 300_000;
const REPLY: usize = 5000;

fn half_close_client(s: &mut Side) {
    let mut c = s.connect();
    s.signal("connected");
    s.wait("greeted");
    s.fionread_until(&c, GREETING as c_int);
    s.write_all(&mut c, UPLOAD);
    s.shutdown(&c, libc::SHUT_WR, "SHUT_WR");
    s.send(&mut c, 10);
    s.signal("shut");
    s.wait("closed");
    s.state_until(&c, &[CLOSE, TIME_WAIT]);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.read(&mut c, BUF);
    s.read(&mut c, BUF);
    s.close(c);
}

fn half_close_server(s: &mut Side) {
    s.wait("connected");
    let mut c = s.accept();
    s.write(&mut c, GREETING);
    s.signal("greeted");
    s.read_to_end(&mut c);
    s.read(&mut c, BUF);
    s.wait("shut");
    s.poll(&c);
    s.write(&mut c, REPLY);
    s.close(c);
    s.signal("closed");
}

// 4. shutdown(SHUT_RD) on the server: what its reads return (the bytes
// already in, then 0, and bytes the client sends afterwards), what the
// client's writes return, and that the server still sends.

fn shutdown_read_client(s: &mut Side) {
    let mut c = s.connect();
    s.write(&mut c, 100);
    s.signal("sent");
    s.wait("shut");
    s.poll(&c);
    s.write(&mut c, 200);
    s.signal("sent again");
    s.wait("replied");
    s.fionread_until(&c, 300);
    s.read(&mut c, BUF);
    s.close(c);
    s.signal("closed");
}

fn shutdown_read_server(s: &mut Side) {
    let mut c = s.accept();
    s.wait("sent");
    s.fionread_until(&c, 100);
    s.shutdown(&c, libc::SHUT_RD, "SHUT_RD");
    s.poll(&c);
    s.read(&mut c, BUF);
    s.read(&mut c, BUF);
    s.signal("shut");
    s.wait("sent again");
    s.fionread_until(&c, 200);
    s.read(&mut c, BUF);
    s.read(&mut c, BUF);
    s.write(&mut c, 300);
    s.signal("replied");
    s.wait("closed");
    s.state_until(&c, &[CLOSE_WAIT]);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.close(c);
}

// 5. SO_LINGER {on, 0} then close on the server, with data the client has
// not read yet: what the client's polls, reads and writes return, the
// reads first on one connection, a write first on the other.

fn linger_zero_reset_client(s: &mut Side) {
    for write_first in [false, true] {
        let mut c = s.connect();
        s.write(&mut c, 10);
        s.wait("sent");
        s.fionread_until(&c, 1000);
        s.signal("ready");
        s.wait("reset");
        s.state_until(&c, &[CLOSE]);
        s.poll(&c);
        s.poll(&c);
        if write_first {
            s.send(&mut c, 10);
        }
        s.read(&mut c, BUF);
        s.read(&mut c, BUF);
        s.read(&mut c, BUF);
        s.send(&mut c, 10);
        s.close(c);
    }
}

fn linger_zero_reset_server(s: &mut Side) {
    for _ in 0..2 {
        let mut c = s.accept();
        s.read(&mut c, BUF);
        s.write(&mut c, 1000);
        s.signal("sent");
        s.wait("ready");
        s.linger_zero(&c);
        s.close(c);
        s.signal("reset");
    }
}

// 6. A peer that is gone: writes after the server closed (the first is
// taken, the reset it draws makes later ones fail), and reads after a
// reset with nothing left to read.

fn peer_gone_client(s: &mut Side) {
    let mut c = s.connect();
    s.write(&mut c, 10);
    s.wait("closed");
    s.state_until(&c, &[CLOSE_WAIT]);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.send(&mut c, 100);
    s.state_until(&c, &[CLOSE]);
    s.poll(&c);
    s.send(&mut c, 100);
    s.send(&mut c, 100);
    s.read(&mut c, BUF);
    s.close(c);

    let mut c = s.connect();
    s.write(&mut c, 10);
    s.wait("reset");
    s.state_until(&c, &[CLOSE]);
    s.read(&mut c, BUF);
    s.read(&mut c, BUF);
    s.send(&mut c, 100);
    s.poll(&c);
    s.close(c);
}

fn peer_gone_server(s: &mut Side) {
    let mut c = s.accept();
    s.read(&mut c, BUF);
    s.close(c);
    s.signal("closed");

    let mut c = s.accept();
    s.read(&mut c, BUF);
    s.linger_zero(&c);
    s.close(c);
    s.signal("reset");
}

// 7. poll's revents at each step of a connection's life: data in, peeked,
// read; the peer's FIN; a half-closed end receiving; both ends shut; and
// a reset, polled twice before the read that reports it.

fn poll_steps_client(s: &mut Side) {
    let mut c = s.connect();
    s.write(&mut c, 10);
    s.wait("sent");
    s.fionread_until(&c, 100);
    s.poll(&c);
    s.recv(&mut c, BUF, libc::MSG_PEEK, "MSG_PEEK");
    s.poll(&c);
    s.read(&mut c, BUF);
    s.poll(&c);
    s.recv(&mut c, BUF, libc::MSG_DONTWAIT, "MSG_DONTWAIT");
    s.signal("read");
    s.wait("shut");
    s.state_until(&c, &[CLOSE_WAIT]);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.poll(&c);
    s.write(&mut c, 50);
    s.signal("sent back");
    s.wait("read back");
    s.close(c);
    s.signal("closed");

    let mut c = s.connect();
    s.write(&mut c, 10);
    s.wait("reset");
    s.state_until(&c, &[CLOSE]);
    s.poll(&c);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.close(c);
}

fn poll_steps_server(s: &mut Side) {
    let mut c = s.accept();
    s.read(&mut c, BUF);
    s.poll(&c);
    s.write(&mut c, 100);
    s.signal("sent");
    s.wait("read");
    s.shutdown(&c, libc::SHUT_WR, "SHUT_WR");
    s.signal("shut");
    s.wait("sent back");
    s.fionread_until(&c, 50);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.poll(&c);
    s.signal("read back");
    s.wait("closed");
    s.state_until(&c, &[CLOSE, TIME_WAIT]);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.close(c);

    let mut c = s.accept();
    s.read(&mut c, BUF);
    s.linger_zero(&c);
    s.close(c);
    s.signal("reset");
}

// 8. A close with unread data on the closing side resets the connection:
// the server closes with the client's bytes unread, then the client with
// the server's.

fn close_with_unread_data_client(s: &mut Side) {
    let mut c = s.connect();
    s.write(&mut c, 500);
    s.signal("sent");
    s.wait("closed");
    s.state_until(&c, &[CLOSE]);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.read(&mut c, BUF);
    s.send(&mut c, 10);
    s.close(c);

    let mut c = s.connect();
    s.write(&mut c, 10);
    s.wait("sent");
    s.fionread_until(&c, 500);
    s.close(c);
    s.signal("closed");
}

fn close_with_unread_data_server(s: &mut Side) {
    let c = s.accept();
    s.wait("sent");
    s.fionread_until(&c, 500);
    s.close(c);
    s.signal("closed");

    let mut c = s.accept();
    s.read(&mut c, BUF);
    s.write(&mut c, 500);
    s.signal("sent");
    s.wait("closed");
    s.state_until(&c, &[CLOSE]);
    s.poll(&c);
    s.read(&mut c, BUF);
    s.read(&mut c, BUF);
    s.send(&mut c, 10);
    s.close(c);
}

// 9. A blocking write (and writev) of more than a ring returns only when
// all of it is taken, as a blocking write on a kernel TCP socket does.

const LARGE: usize = 2 << 20;
const LARGE_PIECES: [usize; 2] = [300_000, 300_001];

fn large_blocking_write_client(s: &mut Side) {
    let mut c = s.connect();
    s.write(&mut c, 1);
    s.read_to_end(&mut c);
    s.read(&mut c, BUF);
    s.close(c);
}

fn large_blocking_write_server(s: &mut Side) {
    let mut c = s.accept();
    s.read(&mut c, BUF);
    s.write(&mut c, LARGE);
    s.write_until(&mut c, LARGE as u64, &format!("write until {LARGE} sent"));
    s.writev(&mut c, &LARGE_PIECES);
    let goal = (LARGE + LARGE_PIECES.iter().sum::<usize>()) as u64;
    s.write_until(&mut c, goal, &format!("write until {goal} sent"));
    s.close(c);
}

// 10. A fresh connection that has carried nothing yet: poll, a
// non-blocking recv and FIONREAD on both ends return at once (nothing to
// read), then the first bytes go through.

fn fresh_connection_nonblocking_client(s: &mut Side) {
    let mut c = s.connect();
    s.poll(&c);
    s.recv(&mut c, BUF, libc::MSG_DONTWAIT, "MSG_DONTWAIT");
    s.fionread(&c);
    s.signal("connected");
    s.wait("looked");
    s.write(&mut c, 10);
    s.signal("sent");
    s.wait("closed");
    s.state_until(&c, &[CLOSE_WAIT]);
    s.read(&mut c, BUF);
    s.close(c);
}

fn fresh_connection_nonblocking_server(s: &mut Side) {
    s.wait("connected");
    let mut c = s.accept();
    s.poll(&c);
    s.recv(&mut c, BUF, libc::MSG_DONTWAIT, "MSG_DONTWAIT");
    s.fionread(&c);
    s.signal("looked");
    s.wait("sent");
    s.fionread_until(&c, 10);
    s.read(&mut c, BUF);
    s.close(c);
    s.signal("closed");
}

/// Which helper a child process is.
#[derive(Clone, Copy)]
enum Role {
    Client,
    Server,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Server => "server",
        }
    }
}

/// A helper's body: opens the side channel (both helpers open the
/// server-to-client FIFO first, so neither open waits for ever), sets up
/// the listener or learns its port, and runs its script of the scenario
/// the environment names, writing its trace to `DIR/ROLE.trace`.
fn helper(role: Role) {
    let name = std::env::var(SCENARIO_ENV).expect("the scenario is named");
    let dir = std::path::PathBuf::from(std::env::var_os(DIR_ENV).expect("the directory is named"));
    let scenario = SCENARIOS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name}"));
    let open = |path: &str, write: bool| {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open(dir.join(path))
            .unwrap_or_else(|e| panic!("opening the FIFO {path}: {e}"))
    };
    let (tx, rx) = match role {
        Role::Server => {
            let tx = open("s2c", true);
            (tx, open("c2s", false))
        }
        Role::Client => {
            let rx = open("s2c", false);
            (open("c2s", true), rx)
        }
    };
    let trace = File::create(dir.join(format!("{}.trace", role.name()))).expect("trace file");
    let mut side = Side {
        trace,
        tx,
        rx: BufReader::new(rx),
        conns: 0,
        listener: None,
        port: 0,
    };
    match role {
        Role::Server => {
            let l = TcpListener::bind("127.0.0.1:0").expect("listener");
            let port = l.local_addr().expect("its address").port();
            side.listener = Some(l);
            side.signal(&format!("port {port}"));
            (scenario.server)(&mut side);
        }
        Role::Client => {
            let mut got = String::new();
            side.rx.read_line(&mut got).expect("the server's port");
            side.port = got
                .trim_end()
                .strip_prefix("port ")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("a port line, not {got:?}"));
            (scenario.client)(&mut side);
        }
    }
}

#[test]
#[ignore = "helper run in a child process by this module's tests"]
fn client() {
    helper(Role::Client);
}

#[test]
#[ignore = "helper run in a child process by this module's tests"]
fn server() {
    helper(Role::Server);
}

/// Which ends run under the library.
struct Config {
    name: &'static str,
    client_wrapped: bool,
    server_wrapped: bool,
}

/// The kernel's run first: the reference.
const CONFIGS: [Config; 4] = [
    Config {
        name: "neither end wrapped",
        client_wrapped: false,
        server_wrapped: false,
    },
    Config {
        name: "both ends wrapped",
        client_wrapped: true,
        server_wrapped: true,
    },
    Config {
        name: "only the client wrapped",
        client_wrapped: true,
        server_wrapped: false,
    },
    Config {
        name: "only the server wrapped",
        client_wrapped: false,
        server_wrapped: true,
    },
];

/// What one configuration of a scenario produced.
struct Run {
    client: Vec<String>,
    server: Vec<String>,
    client_log: String,
    server_log: String,
    /// A helper that failed or was killed, with its output.
    trouble: Vec<String>,
}

/// Starts the helper `role` for `scenario` in `dir`, under the library or
/// not, its output to `DIR/ROLE.out`.
fn start_helper(role: Role, wrapped: bool, scenario: &str, dir: &Path) -> Child {
    let exe = std::env::current_exe().expect("the test binary");
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, rest)| rest);
    let mut cmd = if wrapped {
        let mut c = common::netgap();
        c.env("NETGAP_PRELOAD", common::preload_library())
            .args(["wrap", "-t", "shm", "--"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = File::create(dir.join(format!("{}.out", role.name()))).expect("output file");
    let err = out.try_clone().expect("output file");
    cmd.arg(format!("{module}::{}", role.name()))
        .args(["--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(SCENARIO_ENV, scenario)
        .env(DIR_ENV, dir)
        .env(
            "NETGAP_PRELOAD_LOG",
            dir.join(format!("{}.log", role.name())),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("the helper starts")
}

/// Runs `scenario` in configuration `config` in the empty directory `dir`.
fn run(scenario: &str, config: &Config, dir: &Path) -> Run {
    std::fs::create_dir_all(dir).expect("run directory");
    common::files::mkfifo(&dir.join("s2c"));
    common::files::mkfifo(&dir.join("c2s"));
    let mut helpers = [
        (
            Role::Server,
            start_helper(Role::Server, config.server_wrapped, scenario, dir),
        ),
        (
            Role::Client,
            start_helper(Role::Client, config.client_wrapped, scenario, dir),
        ),
    ];
    let t0 = Instant::now();
    let mut trouble = Vec::new();
    let mut done: [Option<std::process::ExitStatus>; 2] = [None, None];
    while done.iter().any(Option::is_none) {
        let late = t0.elapsed() > RUN_DEADLINE;
        for (k, (role, child)) in helpers.iter_mut().enumerate() {
            if done[k].is_some() {
                continue;
            }
            done[k] = child.try_wait().expect("wait for a helper");
            if done[k].is_none() && late {
                // Our own child, by its id.
                let _ = child.kill();
                let _ = child.wait();
                trouble.push(format!(
                    "the {} was still running after {RUN_DEADLINE:?} and was killed",
                    role.name()
                ));
                // Finished, as a success: the kill is the trouble.
                done[k] = Some(std::process::ExitStatus::default());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "{scenario}, {}: {} ms",
        config.name,
        t0.elapsed().as_millis()
    );
    let read = |name: String| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    for (k, (role, _)) in helpers.iter().enumerate() {
        if let Some(status) = done[k].filter(|s| !s.success()) {
            trouble.push(format!(
                "the {} failed ({status}): {}",
                role.name(),
                read(format!("{}.out", role.name()))
            ));
        }
    }
    let lines = |name: &str| {
        read(format!("{name}.trace"))
            .lines()
            .map(String::from)
            .collect()
    };
    Run {
        client: lines("client"),
        server: lines("server"),
        client_log: read("client.log".into()),
        server_log: read("server.log".into()),
        trouble,
    }
}

/// A line diff of `want` (the kernel's trace) against `got`: `-` lines
/// only the kernel's has, `+` lines only `got` has, two lines of context.
fn diff(want: &[String], got: &[String]) -> String {
    let (n, m) = (want.len(), got.len());
    // lcs[i][j]: the longest common subsequence of want[i..] and got[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if want[i] == got[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && want[i] == got[j] {
            ops.push((' ', &want[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', &want[i]));
            i += 1;
        } else {
            ops.push(('+', &got[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| {
        let lo = k.saturating_sub(2);
        let hi = (k + 3).min(ops.len());
        ops[lo..hi].iter().any(|(op, _)| *op != ' ')
    };
    let mut out = String::new();
    let mut shown = 0;
    let mut skipped = false;
    for (k, (op, text)) in ops.iter().enumerate() {
        if !near_change(k) {
            skipped = true;
            continue;
        }
        if skipped {
            out.push_str("    ...\n");
            skipped = false;
        }
        shown += 1;
        if shown > 120 {
            out.push_str("    (more differences left out)\n");
            break;
        }
        out.push_str(&format!("  {op} {text}\n"));
    }
    out
}

/// The connections (a trace line's `#N`) whose lines in one trace differ
/// from the other's, and how many connections there are.
fn connections_differing(want: &[String], got: &[String]) -> (Vec<String>, usize) {
    let by_conn = |t: &[String]| {
        let mut m: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
        for l in t {
            let id = l
                .strip_prefix('#')
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            m.entry(id).or_default().push(l.clone());
        }
        m
    };
    let (w, g) = (by_conn(want), by_conn(got));
    let ids: std::collections::BTreeSet<u32> = w.keys().chain(g.keys()).copied().collect();
    let differ = ids
        .iter()
        .filter(|id| w.get(*id) != g.get(*id))
        .map(|id| format!("#{id}"))
        .collect();
    (differ, ids.len())
}

/// Runs `scenario` in every configuration and asserts that each trace is
/// the kernel's, and that with both ends wrapped every connection moved to
/// shm (and with one end wrapped none did).
fn conform(scenario: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let runs: Vec<(&Config, Run)> = CONFIGS
        .iter()
        .enumerate()
        .map(|(k, c)| (c, run(scenario, c, &dir.path().join(format!("config{k}")))))
        .collect();
    let (kernel_config, kernel) = &runs[0];
    assert!(
        kernel.trouble.is_empty() && !kernel.client.is_empty(),
        "{scenario}: the run with {} did not finish, so there is no reference: {}",
        kernel_config.name,
        kernel.trouble.join("\n")
    );
    let mut failures = Vec::new();
    for (config, run) in &runs[1..] {
        for t in &run.trouble {
            failures.push(format!("{}: {t}", config.name));
        }
        for (end, want, got) in [
            ("client", &kernel.client, &run.client),
            ("server", &kernel.server, &run.server),
        ] {
            if want != got {
                let (differ, of) = connections_differing(want, got);
                failures.push(format!(
                    "{}: the {end}'s trace differs from the kernel's on {} of {of} connections ({}) (- kernel, + this run):\n{}",
                    config.name,
                    differ.len(),
                    differ.join(" "),
                    diff(want, got)
                ));
            }
        }
        let connections = kernel
            .client
            .iter()
            .filter(|l| l.ends_with(" connect -> ok"))
            .count();
        if config.client_wrapped && config.server_wrapped {
            let moved = run.client_log.matches("moved to shm").count();
            let accepted = run
                .server_log
                .matches("accepted connection moved to shm")
                .count();
            if moved != connections || accepted != connections {
                failures.push(format!(
                    "{}: of {connections} connections the client's library log says {moved} and the server's {accepted} moved to shm\nclient's log:\n{}server's log:\n{}",
                    config.name, run.client_log, run.server_log
                ));
            }
        } else if run.client_log.contains("moved to shm") || run.server_log.contains("moved to shm")
        {
            failures.push(format!(
                "{}: a connection with an unwrapped end moved to shm:\n{}{}",
                config.name, run.client_log, run.server_log
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{scenario}: the library does not answer as the kernel does:\n\n{}\n\nthe kernel's traces:\nclient:\n{}\nserver:\n{}",
        failures.join("\n\n"),
        kernel.client.join("\n"),
        kernel.server.join("\n")
    );
}

#[test]
fn eof_after_data_reads_as_on_the_kernel() {
    conform("eof_after_data");
}

#[test]
fn server_closing_first_after_its_response_never_resets_the_client() {
    conform("server_closes_first");
}

#[test]
fn half_close_with_data_in_flight_both_ways() {
    conform("half_close");
}

#[test]
fn shutdown_of_the_reading_side() {
    conform("shutdown_read");
}

#[test]
fn close_with_linger_zero_resets_the_peer() {
    conform("linger_zero_reset");
}

#[test]
fn writes_and_reads_after_the_peer_is_gone() {
    conform("peer_gone");
}

#[test]
fn poll_revents_at_each_step() {
    conform("poll_steps");
}

#[test]
fn close_with_unread_data_resets_the_peer() {
    conform("close_with_unread_data");
}

#[test]
fn a_blocking_write_larger_than_the_ring_returns_all_of_it() {
    conform("large_blocking_write");
}

#[test]
fn nonblocking_calls_on_a_fresh_connection_return_at_once() {
    conform("fresh_connection_nonblocking");
}
