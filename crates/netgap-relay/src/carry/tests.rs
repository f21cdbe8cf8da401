use super::*;
use crate::conn::Ends;
use crate::journal::Journal;
use crate::link::Pending;
use crate::outbox::Out;
use crate::policy::{self, XdpInterface};
use crate::ring::FarEnd;
use crate::table::LinkTable;
use netgap_shm::Waits;
use netgap_transport::{FlowError, Sender};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A receiver that replays `bytes`, then says the flow closed.
struct Script(VecDeque<u8>);

impl Receiver for Script {
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        if self.0.is_empty() {
            return Err(FlowError::Closed);
        }
        let n = buf.len().min(self.0.len());
        for (d, s) in buf.iter_mut().zip(self.0.drain(..n)) {
            *d = s;
        }
        Ok(n)
    }
}

const RING_BYTES: usize = 4096;

/// A region as the library makes it: a sealed memfd with the
/// header, mapped as the relay maps it.
fn region() -> FarEnd {
    region_pair().0
}

/// [`region`], and the same region as the program maps it.
fn region_pair() -> (FarEnd, netgap_shm::Region) {
    // SAFETY: a NUL-terminated name and plain flags.
    let fd =
        unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: our own new descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let header = netgap_shm::HeaderFields {
        waits: Waits::Sleep,
        capacity: RING_BYTES as u64,
        connector_ino: 0,
        listener_ino: 0,
    }
    .to_bytes();
    // SAFETY: plain calls on our own memfd; `header` is valid for
    // reads of its length.
    unsafe {
        assert_eq!(
            libc::ftruncate(
                fd.as_raw_fd(),
                netgap_shm::region_bytes(RING_BYTES) as libc::off_t
            ),
            0
        );
        assert_eq!(
            libc::pwrite(fd.as_raw_fd(), header.as_ptr().cast(), header.len(), 0),
            header.len() as isize
        );
        assert_eq!(
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            ),
            0
        );
    }
    let expect = netgap_shm::Expect {
        capacity: Some(RING_BYTES),
        waits: Waits::Sleep,
    };
    let program = netgap_shm::Region::open(fd.as_raw_fd(), &expect, false).unwrap();
    (FarEnd::map(fd.as_raw_fd(), RING_BYTES).unwrap(), program)
}

/// Some descriptor standing for the TCP socket (a reset or a bell
/// on it fails harmlessly).
fn not_a_socket() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

/// A connection's ends: a ring and stand-ins for both sockets.
fn ends() -> Ends {
    Ends {
        ring: region(),
        tcp: not_a_socket(),
        client: not_a_socket(),
    }
}

fn hub() -> Arc<Hub> {
    Arc::new(Hub {
        links: Mutex::new(LinkTable::new(64)),
        cv: Condvar::new(),
        pending: Mutex::new(HashMap::new()),
        timeout: Duration::from_secs(1),
        iface: XdpInterface {
            name: "eth1".into(),
            ip: "10.0.0.1".parse().unwrap(),
            prefix_len: 24,
            mac: [2, 0, 0, 0, 0, 1],
        },
        served: policy::Served::parse(&["10.0.1.0/24".into()]).unwrap(),
        relay_key: netgap_proto::auth::Key::from_bytes(vec![9; 32]).unwrap(),
        journal: Journal::new(),
        direct: None,
    })
}

/// A link of the listening end (its ids have the top bit clear)
/// and what it sends.
fn link() -> (Arc<Link>, mpsc::Receiver<Out>) {
    let (out, rx) = mpsc::channel();
    let link = Arc::new(Link::new(
        Arc::new(Outbox::new(out, None)),
        "10.0.0.2/02:00:00:00:00:02/7".into(),
        "10.0.0.1/02:00:00:00:00:01/7".into(),
        ("10.0.0.1".parse().unwrap(), "10.0.1.1".parse().unwrap()),
        7,
        0,
    ));
    (link, rx)
}

/// An open connection `id` on `link`.
fn conn(link: &Link, id: u32) -> Arc<Conn> {
    let c = Arc::new(Conn::new(id, ends(), Arc::clone(&link.out), true));
    link.lock().map.insert(id, Arc::clone(&c));
    c
}

fn script(frames: &[Vec<u8>]) -> Script {
    Script(frames.iter().flatten().copied().collect())
}

/// The frames the link sent: (kind, id).
fn sent(rx: &mpsc::Receiver<Out>) -> Vec<(Kind, u32)> {
    rx.try_iter()
        .filter_map(|o| match o {
            Out::Frame(f) => {
                let h = frame::decode(&f[..frame::HEADER_BYTES].try_into().unwrap()).unwrap();
                Some((h.kind, h.id))
            }
            Out::Close | Out::Broken(_) => None,
        })
        .collect()
}

fn close() -> Vec<u8> {
    frame::frame(Kind::LinkClose, 0, &[])
}

#[test]
fn frames_for_unknown_connections_are_counted_and_dropped() {
    let (link, _rx) = link();
    let c = conn(&link, 0x8000_0001);
    let mut s = script(&[
        frame::frame(Kind::Data, 0x8000_0009, b"late"),
        frame::frame(Kind::Bell, 0x8000_0009, &[]),
        frame::frame(Kind::End, 0x8000_0009, &[]),
        frame::frame(Kind::Credit, 0x8000_0009, &100u32.to_le_bytes()),
        frame::frame(Kind::Data, 0x8000_0001, b"hello"),
        frame::frame(Kind::Ping, 0, &[]),
        frame::frame(Kind::End, 0x8000_0001, &[]),
        close(),
    ]);
    reader(&link, &hub(), &mut s).unwrap();
    assert_eq!(link.unknown_id_frames.load(Ordering::Relaxed), 4);
    // Nothing was queued before it: straight into the ring.
    assert_eq!(program_input(&c.ring), b"hello");
    let i = c.inbox();
    assert_eq!(i.queued_bytes(), 0);
    assert!(i.ended());
}

/// What the relay put in the program's ring (ring 1) and the
/// program has not read, taken as the program would read it.
fn program_input(r: &FarEnd) -> Vec<u8> {
    r.tx.take_back().ok().unwrap()
}

/// Data that finds the ring full queues behind what fills it, in
/// order; the reader never waits.
#[test]
fn data_past_the_rings_room_queues_in_order() {
    let (link, _rx) = link();
    let c = conn(&link, 0x8000_0001);
    let a: Vec<u8> = (0..RING_BYTES + 100).map(|k| k as u8).collect();
    let mut s = script(&[
        frame::frame(Kind::Data, 0x8000_0001, &a),
        frame::frame(Kind::Data, 0x8000_0001, b"next"),
        close(),
    ]);
    reader(&link, &hub(), &mut s).unwrap();
    assert_eq!(program_input(&c.ring), a[..RING_BYTES]);
    let i = c.inbox();
    let queued = i.queued();
    assert_eq!(queued[..100], a[RING_BYTES..]);
    assert_eq!(&queued[100..], b"next");
    assert_eq!(i.queued_bytes(), 104);
}

#[test]
fn data_past_a_connections_credit_breaks_the_link() {
    let (link, _rx) = link();
    let _c = conn(&link, 0x8000_0001);
    let chunk = vec![7u8; frame::CHUNK_BYTES];
    let mut frames: Vec<Vec<u8>> = (0..frame::WINDOW_BYTES as usize / frame::CHUNK_BYTES)
        .map(|_| frame::frame(Kind::Data, 0x8000_0001, &chunk))
        .collect();
    // The first chunk's first RING_BYTES went to the ring and are
    // not queued: this is one byte past the window.
    frames.push(frame::frame(
        Kind::Data,
        0x8000_0001,
        &vec![7u8; RING_BYTES + 1],
    ));
    let e = reader(&link, &hub(), &mut script(&frames)).unwrap_err();
    assert!(e.to_string().contains("past the"), "{e}");
}

#[test]
fn credit_past_the_window_and_malformed_frames_break_the_link() {
    let (link, _rx) = link();
    let _c = conn(&link, 0x8000_0001);
    let over = frame::frame(Kind::Credit, 0x8000_0001, &1u32.to_le_bytes());
    let e = reader(&link, &hub(), &mut script(&[over])).unwrap_err();
    assert!(e.to_string().contains("past the"), "{e}");
    let mut bad = frame::frame(Kind::Bell, 0x8000_0001, &[]);
    bad[1] = 9;
    let e = reader(&link, &hub(), &mut script(&[bad])).unwrap_err();
    assert!(e.to_string().contains("a bad frame"), "{e}");
    let hello = frame::frame(Kind::LinkHello, 0, b"10.0.0.1/02:00:00:00:00:01/7");
    let e = reader(&link, &hub(), &mut script(&[hello])).unwrap_err();
    assert!(e.to_string().contains("second hello"), "{e}");
    // The flow ending without LINK_CLOSE is a broken link.
    assert!(reader(&link, &hub(), &mut script(&[])).is_err());
}

#[test]
fn an_open_takes_only_the_connection_waiting_with_its_key() {
    let (link, rx) = link();
    let hub = hub();
    let (give, take) = mpsc::sync_channel(1);
    hub.register([5u8; frame::KEY_BYTES], Pending { ends: ends(), give })
        .unwrap();
    let mut s = script(&[
        frame::frame(Kind::Open, 0x8000_0001, &[6u8; frame::KEY_BYTES]),
        frame::frame(Kind::Open, 0x8000_0002, &[5u8; frame::KEY_BYTES]),
        close(),
    ]);
    reader(&link, &hub, &mut s).unwrap();
    assert_eq!(
        sent(&rx),
        [
            (Kind::OpenRefused, 0x8000_0001),
            (Kind::OpenOk, 0x8000_0002)
        ]
    );
    let (c, _) = take.try_recv().unwrap().expect("the connection");
    assert_eq!(c.id, 0x8000_0002);
    assert!(hub.pending().is_empty());
    // An OPEN with one of this end's own ids is a fault.
    let own = frame::frame(Kind::Open, 3, &[5u8; frame::KEY_BYTES]);
    let e = reader(&link, &hub, &mut script(&[own])).unwrap_err();
    assert!(e.to_string().contains("an id of this end"), "{e}");
}

#[test]
fn a_listen_whose_connection_went_direct_ends_at_once_and_takes_no_open() {
    let (link, rx) = link();
    let hub = hub();
    let (give, take) = mpsc::sync_channel(1);
    hub.register([5u8; frame::KEY_BYTES], Pending { ends: ends(), give })
        .unwrap();
    hub.went_direct(&[5u8; frame::KEY_BYTES]);
    assert!(matches!(take.try_recv(), Ok(None)), "told at once");
    assert!(hub.pending().is_empty());
    // Another key's grant ends nothing.
    hub.went_direct(&[6u8; frame::KEY_BYTES]);
    // An OPEN for it now is refused: nothing waits with its key.
    let mut s = script(&[
        frame::frame(Kind::Open, 0x8000_0001, &[5u8; frame::KEY_BYTES]),
        close(),
    ]);
    reader(&link, &hub, &mut s).unwrap();
    assert_eq!(sent(&rx), [(Kind::OpenRefused, 0x8000_0001)]);
}

/// A flow's sending half that keeps what it is given.
struct Wire(Arc<Mutex<Vec<u8>>>);

impl Sender for Wire {
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, netgap_transport::FlowError> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
}

/// A connection's frame goes out on its own thread only when
/// nothing waits in the writing thread's queue: it never overtakes
/// a queued frame.
#[test]
fn a_frame_sent_at_once_never_overtakes_a_queued_one() {
    let wire = Arc::new(Mutex::new(Vec::new()));
    let (q, rx) = mpsc::channel();
    let out = Outbox::new(q, Some(Box::new(Wire(Arc::clone(&wire)))));
    let f = |id| frame::frame(Kind::Bell, id, &[]);
    out.send(&f(1), Via::Now).unwrap();
    assert_eq!(*wire.lock().unwrap(), f(1));
    // The receiving thread's frame waits for the writing thread;
    // what a connection sends after it waits behind it.
    out.send(&f(2), Via::Queue).unwrap();
    out.send(&f(3), Via::Now).unwrap();
    assert_eq!(*wire.lock().unwrap(), f(1));
    for o in rx.try_iter() {
        let Out::Frame(fr) = o else { panic!() };
        out.send_queued(&fr).unwrap();
    }
    out.send(&f(4), Via::Now).unwrap();
    assert_eq!(*wire.lock().unwrap(), [f(1), f(2), f(3), f(4)].concat());
    assert_eq!(out.frames_out.load(Ordering::Relaxed), 4);
    // The writing thread gone with the flow's half: a send fails
    // and says the link is broken.
    drop(out.sender().take());
    assert!(out.send(&f(5), Via::Now).is_err());
    assert!(matches!(rx.try_recv(), Ok(Out::Broken(_))));
}

#[test]
fn a_broken_link_resets_every_connection_and_says_close() {
    let (link, rx) = link();
    let a = conn(&link, 0x8000_0001);
    let b = conn(&link, 0x8000_0002);
    link.shut("test");
    assert!(a.broken() && b.broken());
    assert!(link.closing() && link.idle());
    assert!(matches!(rx.try_iter().last(), Some(Out::Close)));
    // A second shut is a no-op.
    link.shut("again");
    assert_eq!(link.why.lock().unwrap().as_deref(), Some("test"));
}

/// The frames on `wire`: (kind, id, payload).
fn frames_on(wire: &Mutex<Vec<u8>>) -> Vec<(Kind, u32, Vec<u8>)> {
    let bytes = wire.lock().unwrap().clone();
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let h = frame::decode(&bytes[at..at + frame::HEADER_BYTES].try_into().unwrap()).unwrap();
        at += frame::HEADER_BYTES;
        out.push((h.kind, h.id, bytes[at..at + h.len].to_vec()));
        at += h.len;
    }
    out
}

/// What [`wired_conn`] gives: the connection, the program's view of its
/// region, what the wire carries, and the writing thread's queue.
type Wired = (
    Arc<Conn>,
    netgap_shm::Region,
    Arc<Mutex<Vec<u8>>>,
    mpsc::Receiver<Out>,
);

/// A connection `id` whose frames go out on a [`Wire`].
fn wired_conn(id: u32) -> Wired {
    let wire = Arc::new(Mutex::new(Vec::new()));
    let (q, queue) = mpsc::channel();
    let out = Arc::new(Outbox::new(q, Some(Box::new(Wire(Arc::clone(&wire))))));
    let (ring, program) = region_pair();
    let ends = Ends {
        ring,
        tcp: not_a_socket(),
        client: not_a_socket(),
    };
    (
        Arc::new(Conn::new(id, ends, out, true)),
        program,
        wire,
        queue,
    )
}

fn has_end(wire: &Mutex<Vec<u8>>) -> bool {
    frames_on(wire).iter().any(|(k, _, _)| *k == Kind::End)
}

/// A program's shutdown (its library's mark after its last bytes) goes
/// out as `END` behind those bytes while the program still holds the
/// connection; its close later sends no second `END`.
#[test]
fn a_programs_shutdown_goes_out_as_end_behind_its_last_bytes_and_its_close_adds_none() {
    let (c, program, wire, _queue) = wired_conn(0x8000_0001);
    let (tx, _rx) = program.ends(netgap_shm::Role::Connector);
    assert_eq!(tx.try_write(b"last bytes", usize::MAX).unwrap(), 10);
    program.header().ends[netgap_shm::Role::Connector.index()]
        .fetch_or(netgap_shm::layout::END_FIN, Ordering::SeqCst);
    let mut pair = [0; 2];
    // SAFETY: `pair` is valid for two descriptors.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) };
    assert_eq!(r, 0);
    // SAFETY: the new descriptors are ours, each owned once.
    let (relay_side, program_side) =
        unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    let c2 = Arc::clone(&c);
    let pump = std::thread::spawn(move || {
        crate::conn::ring_to_flow(&c2, relay_side.as_raw_fd()).map_err(|e| e.to_string())
    });
    let t0 = std::time::Instant::now();
    while !has_end(&wire) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no END after the shutdown"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        frames_on(&wire),
        [
            (Kind::Data, 0x8000_0001, b"last bytes".to_vec()),
            (Kind::End, 0x8000_0001, Vec::new())
        ]
    );
    // The program still holds the connection: the pump waits for its
    // close, which it sees as its socket's hang-up.
    std::thread::sleep(Duration::from_millis(120));
    assert!(!pump.is_finished());
    assert!(!c.program_gone.load(Ordering::SeqCst));
    drop(program_side);
    pump.join().unwrap().unwrap();
    assert!(c.program_gone.load(Ordering::SeqCst));
    assert_eq!(frames_on(&wire).len(), 2);
}

/// The other relay's `END` marks the program's ring only once every
/// byte before it is in the ring, the queued ones too.
#[test]
fn the_other_relays_end_marks_the_ring_behind_every_byte() {
    let (c, program, _wire, _queue) = wired_conn(0x8000_0001);
    let marked = || {
        program.header().ends[netgap_shm::Role::Listener.index()].load(Ordering::SeqCst)
            & netgap_shm::layout::END_FIN
            != 0
    };
    let a: Vec<u8> = (0..RING_BYTES + 100).map(|k| k as u8).collect();
    assert!(c.arrive(&a).is_ok());
    c.end();
    let c2 = Arc::clone(&c);
    let pump = std::thread::spawn(move || crate::conn::queue_to_ring(&c2).is_ok());
    // The ring is full and 100 bytes wait behind it: no end yet.
    std::thread::sleep(Duration::from_millis(50));
    assert!(!marked());
    let (_tx, rx) = program.ends(netgap_shm::Role::Connector);
    let mut got = vec![0u8; RING_BYTES];
    assert_eq!(rx.try_read(&mut got, usize::MAX).unwrap(), RING_BYTES);
    assert!(pump.join().unwrap());
    assert!(marked());
    let mut rest = vec![0u8; 200];
    assert_eq!(rx.try_read(&mut rest, usize::MAX).unwrap(), 100);
    got.extend_from_slice(&rest[..100]);
    assert_eq!(got, a);
}
