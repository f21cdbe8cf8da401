//! Tests of the `shm` transport through its public traits: a listener and a
//! connector in one process (two threads), and hand-built pairs for the
//! failure cases.

use super::*;
use netgap_core::spec::TransportOptions;
use netgap_shm::{region_bytes, RingId};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

fn config(mode: Mode, io_timeout: Duration) -> FlowConfig {
    FlowConfig {
        mode,
        options: TransportOptions::default(),
        io_timeout,
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(31))
        .collect()
}

/// A listener-side and a connector-side flow, connected through the real
/// rendezvous.
fn pair(mode: Mode, io_timeout: Duration) -> (Box<dyn Flow>, Box<dyn Flow>) {
    let cfg = config(mode, io_timeout);
    let localhost = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut listener = Shm.listen(&cfg, localhost).unwrap();
    let addr = listener.addr();
    let connector = std::thread::spawn({
        let cfg = cfg.clone();
        move || Shm.connect(&cfg, &addr)
    });
    let server = listener.accept(Duration::from_secs(5)).unwrap();
    let client = connector.join().unwrap().unwrap();
    (server, client)
}

/// Client sends each size, server checks and echoes it, client checks the
/// echo: every byte of 1 B, 4 KiB and 8 MiB (twice the ring) both ways.
fn echo_sizes(mode: Mode) {
    let (mut server, mut client) = pair(mode, Duration::from_secs(10));
    let sizes = [1usize, 4096, 8 << 20, 1, 64 * 1024 + 3];
    let echo = std::thread::spawn(move || {
        for (i, &n) in sizes.iter().enumerate() {
            let mut buf = vec![0u8; n];
            server.recv_exact(&mut buf).unwrap();
            assert!(
                buf == pattern(n, i as u8),
                "server got wrong bytes for {n} B"
            );
            server.send_all(&buf).unwrap();
        }
    });
    for (i, &n) in sizes.iter().enumerate() {
        let msg = pattern(n, i as u8);
        client.send_all(&msg).unwrap();
        let mut back = vec![0u8; n];
        client.recv_exact(&mut back).unwrap();
        assert!(back == msg, "client got wrong echo for {n} B");
    }
    echo.join().unwrap();
}

#[test]
fn echoes_every_byte_in_event_mode() {
    echo_sizes(Mode::Event);
}

#[test]
fn echoes_every_byte_in_poll_mode() {
    echo_sizes(Mode::Poll);
}

/// Both directions at once from four threads, as `bibw` does.
fn halves_both_ways(mode: Mode) {
    let (server, client) = pair(mode, Duration::from_secs(10));
    let (stx, mut srx) = server.into_halves();
    let (ctx, mut crx) = client.into_halves();
    let total = 24 << 20;
    let send = |mut tx: Box<dyn Sender>, seed: u8| {
        std::thread::spawn(move || {
            let data = pattern(total, seed);
            for piece in data.chunks(100_000) {
                tx.send_all(piece).unwrap();
            }
        })
    };
    let a = send(stx, 1);
    let b = send(ctx, 2);
    let check = std::thread::spawn(move || {
        let mut got = vec![0u8; total];
        crx.recv_exact(&mut got).unwrap();
        assert!(got == pattern(total, 1));
    });
    let mut got = vec![0u8; total];
    srx.recv_exact(&mut got).unwrap();
    assert!(got == pattern(total, 2));
    check.join().unwrap();
    a.join().unwrap();
    b.join().unwrap();
}

#[test]
fn halves_work_both_ways_at_once_event() {
    halves_both_ways(Mode::Event);
}

#[test]
fn halves_work_both_ways_at_once_poll() {
    halves_both_ways(Mode::Poll);
}

/// The peer drops its flow while we wait: `Closed` well within a second,
/// after any bytes it sent before.
fn drop_is_seen(mode: Mode) {
    let (mut server, mut client) = pair(mode, Duration::from_secs(30));
    client.send_all(b"last").unwrap();
    let dropper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(client);
    });
    let mut buf = [0u8; 4];
    server.recv_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"last");
    let t0 = Instant::now();
    let r = server.recv_exact(&mut buf);
    let waited = t0.elapsed();
    assert!(matches!(r, Err(FlowError::Closed)), "{r:?}");
    assert!(waited < Duration::from_secs(1), "took {waited:?}");
    dropper.join().unwrap();
    // Sending into a full ring whose reader is gone fails too.
    let big = vec![0u8; 2 * RING_CAPACITY_BYTES];
    let t0 = Instant::now();
    let r = server.send_all(&big);
    assert!(matches!(r, Err(FlowError::Closed)), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(1));
}

#[test]
fn dropped_peer_is_closed_event() {
    drop_is_seen(Mode::Event);
}

#[test]
fn dropped_peer_is_closed_poll() {
    drop_is_seen(Mode::Poll);
}

fn timeout_is_honoured(mode: Mode) {
    let limit = Duration::from_millis(200);
    let (mut server, _client) = pair(mode, limit);
    let mut buf = [0u8; 1];
    let t0 = Instant::now();
    let r = server.recv_exact(&mut buf);
    let waited = t0.elapsed();
    assert!(
        matches!(r, Err(FlowError::TimedOut { timeout_ms: 200 })),
        "{r:?}"
    );
    assert!(
        waited >= limit && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    // A full ring nobody reads times out as well.
    let big = vec![0u8; 2 * RING_CAPACITY_BYTES];
    let r = server.send_all(&big);
    assert!(matches!(r, Err(FlowError::TimedOut { .. })), "{r:?}");
}

#[test]
fn timeout_is_honoured_event() {
    timeout_is_honoured(Mode::Event);
}

#[test]
fn timeout_is_honoured_poll() {
    timeout_is_honoured(Mode::Poll);
}

#[test]
fn socket_file_is_removed_on_accept_and_on_drop() {
    let cfg = config(Mode::Event, Duration::from_secs(5));
    let ip = std::net::IpAddr::from([127, 0, 0, 1]);
    let unused = Shm.listen(&cfg, ip).unwrap();
    let path = PathBuf::from(unused.addr());
    assert!(path.exists());
    drop(unused);
    assert!(!path.exists());

    let mut listener = Shm.listen(&cfg, ip).unwrap();
    let path = PathBuf::from(listener.addr());
    let c = std::thread::spawn({
        let (cfg, addr) = (cfg.clone(), listener.addr());
        move || Shm.connect(&cfg, &addr).map(drop)
    });
    let _flow = listener.accept(Duration::from_secs(5)).unwrap();
    assert!(!path.exists());
    c.join().unwrap().unwrap();
    // One region, one peer.
    assert!(listener.accept(Duration::from_millis(10)).is_err());
}

#[test]
fn accept_times_out() {
    let cfg = config(Mode::Poll, Duration::from_secs(5));
    let mut l = Shm
        .listen(&cfg, std::net::IpAddr::from([127, 0, 0, 1]))
        .unwrap();
    let r = l.accept(Duration::from_millis(50));
    assert!(matches!(r, Err(TransportError::AcceptTimeout { .. })));
}

#[test]
fn connect_rejects_a_mode_mismatch() {
    let ip = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut l = Shm
        .listen(&config(Mode::Event, Duration::from_secs(5)), ip)
        .unwrap();
    let addr = l.addr();
    let c = std::thread::spawn(move || {
        Shm.connect(&config(Mode::Poll, Duration::from_secs(5)), &addr)
            .map(drop)
    });
    let _ = l.accept(Duration::from_secs(5));
    let e = c.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("mode"), "{e}");
}

#[test]
fn connect_to_nothing_names_the_address() {
    let cfg = config(Mode::Event, Duration::from_secs(1));
    let e = Shm
        .connect(&cfg, "/nonexistent/netgap-shm.sock")
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/netgap-shm.sock"), "{e}");
}

/// A fake listener that hands out `fd` with the right greeting.
fn connect_to_fake(fd: OwnedFd) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        sys::send_fd(&s, fd.as_fd(), HELLO).unwrap();
        // Keep the socket open until the connector has looked.
        let mut b = [0u8; 1];
        let _ = std::io::Read::read(&mut &s, &mut b);
    });
    let cfg = config(Mode::Event, Duration::from_secs(5));
    let e = Shm
        .connect(&cfg, path.to_str().unwrap())
        .map(drop)
        .unwrap_err()
        .to_string();
    server.join().unwrap();
    e
}

fn memfd(sealed: bool, len: usize) -> OwnedFd {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use std::os::fd::AsRawFd;
    let fd = memfd_create(
        c"netgap-shm-test",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .unwrap();
    nix::unistd::ftruncate(&fd, len as libc::off_t).unwrap();
    if sealed {
        fcntl(
            fd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK),
        )
        .unwrap();
    }
    fd
}

#[test]
fn connect_rejects_an_unsealed_memfd() {
    let e = connect_to_fake(memfd(false, region_bytes(4096)));
    assert!(e.contains("F_SEAL_SHRINK"), "{e}");
}

#[test]
fn connect_rejects_a_descriptor_that_is_no_memfd() {
    let (r, _w) = nix::unistd::pipe().unwrap();
    let e = connect_to_fake(r);
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn connect_rejects_a_bad_header() {
    let e = connect_to_fake(memfd(true, region_bytes(4096)));
    assert!(e.contains("magic"), "{e}");
    let e = connect_to_fake(memfd(true, 100));
    assert!(e.contains("not the size"), "{e}");
}

#[test]
fn corrupt_peer_index_is_an_error_not_a_panic() {
    for mode in Mode::ALL {
        // A flow built by hand, with a second mapping of its region standing
        // in for a misbehaving peer.
        let (region, fd) = region::create(4096, mode).unwrap();
        let peer = region::open(fd, mode).unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        let cfg = config(mode, Duration::from_secs(5));
        let mut flow = ShmFlow::new(region, a, Role::Listener, &cfg);
        // The peer claims to have published more than the ring holds.
        peer.ctl(RingId::ToListener)
            .head
            .0
            .store(1 << 40, Ordering::Release);
        let mut buf = [0u8; 8];
        match flow.recv_exact(&mut buf) {
            Err(FlowError::Io(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                assert!(e.to_string().contains("corrupt"), "{e}");
            }
            other => panic!("expected a corrupt-ring error, got {other:?}"),
        }
        // The peer claims to have consumed bytes that were never sent.
        peer.ctl(RingId::ToConnector)
            .tail
            .0
            .store(5, Ordering::Release);
        let r = flow.send_all(&[0u8; 8192]);
        assert!(matches!(r, Err(FlowError::Io(_))), "{r:?}");
    }
}

/// Sends one byte at a time until a send fails; the number of sends that
/// went through first, or `None` if none failed within `most` sends.
fn sends_before_failing(flow: &mut dyn Flow, most: u32) -> Option<u32> {
    (0..most).find(|_| flow.send_all(b"x").is_err())
}

/// An abort from another thread wakes a receive that waits on a silent
/// peer, fails this end's later calls (a call that need not wait looks at
/// the abort every [`CALLS_PER_ABORT_CHECK`] calls), and ends the peer's
/// wait.
#[test]
fn an_abort_ends_a_waiting_receive_and_the_peers_flow() {
    for mode in Mode::ALL {
        let (mut server, mut client) = pair(mode, Duration::from_secs(20));
        let abort = server.abort_handle().expect("an shm flow can be aborted");
        let waiting = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut buf = [0u8; 16];
            let got = server.recv_exact(&mut buf);
            let later = sends_before_failing(server.as_mut(), CALLS_PER_ABORT_CHECK);
            (got, later, t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        abort.abort();
        let (got, later, took) = waiting.join().unwrap();
        assert!(got.is_err() && later.is_some(), "{mode:?}: {later:?}");
        assert!(took < Duration::from_secs(2), "{mode:?}: {took:?}");
        // The peer sees the end instead of waiting its whole timeout,
        // after the bytes the aborted end sent before it looked.
        let t0 = Instant::now();
        let mut buf = [0u8; 1];
        let mut bytes = 0u32;
        let end = loop {
            match client.recv_exact(&mut buf) {
                Ok(()) => bytes += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(end, FlowError::Closed), "{mode:?}: {end:?}");
        assert_eq!(Some(bytes), later, "{mode:?}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{mode:?}");
    }
}

/// A flow whose data never waits (each byte sent is there before it is
/// received) still ends within [`CALLS_PER_ABORT_CHECK`] calls of an abort,
/// on both halves, and not before it.
#[test]
fn an_abort_ends_a_flow_whose_data_keeps_moving() {
    for mode in Mode::ALL {
        let (mut server, mut client) = pair(mode, Duration::from_secs(20));
        let abort = server.abort_handle().expect("an shm flow can be aborted");
        let mut buf = [0u8; 1];
        for _ in 0..3 * CALLS_PER_ABORT_CHECK {
            server.send_all(b"x").unwrap();
            client.recv_exact(&mut buf).unwrap();
            client.send_all(b"y").unwrap();
            server.recv_exact(&mut buf).unwrap();
        }
        abort.abort();
        let sent = sends_before_failing(server.as_mut(), CALLS_PER_ABORT_CHECK);
        assert!(sent.is_some(), "{mode:?}: sends went on after the abort");
        // Bytes the peer sent before it saw the end are still there, but
        // the aborted receiver stops within the same number of calls.
        for _ in 0..CALLS_PER_ABORT_CHECK {
            if client.send_all(b"y").is_err() {
                break;
            }
        }
        let stopped = (0..CALLS_PER_ABORT_CHECK).any(|_| server.recv_exact(&mut buf).is_err());
        assert!(stopped, "{mode:?}: receives went on after the abort");
    }
}
