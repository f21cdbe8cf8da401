//! The library's progress thread: one per process, started with the
//! process's first direct connection (`direct`), and again, lazily, in a
//! child after `fork` with the first direct connection the child opens
//! (threads do not survive `fork`, and a child drives only the
//! connections it opened).
//!
//! A direct connection's engine moves only when someone pumps it: a peer
//! is acknowledged, and a lost frame sent again, only from a call into
//! the library. A program that computes, or sleeps in a wait on other
//! descriptors, would leave its peer unanswered: the peer's window stays
//! full, its lost frames are never asked for again, and after the
//! transport's silence limit it gives the connection up. The thread pumps
//! each connection no program call pumped for [`QUIET`] (and that no
//! program thread is waiting on): it sleeps in epoll on those
//! connections' sockets (armed one-shot, so frames a busy program is
//! about to reap wake it at most once) for at most their earliest timer.
//!
//! The thread and the program never wait on each other for long: both
//! pump through the engine, which holds the connection's port lock for
//! one pump at a time, and the thread takes no lock of the program's
//! (the read-ahead buffer, the descriptor table) at all.
//!
//! The thread takes frames off the connection's AF_XDP socket, so that
//! socket's readiness no longer says whether the connection has news: a
//! connection's wait descriptor ([`Link::wait_fd`]) is an epoll of its
//! socket and an eventfd the thread signals after each pump of its own,
//! and every wait of the program on the connection (a blocking call, a
//! poll, an epoll) sleeps on it.
//!
//! A close returns at once, as the kernel's does: the closing frame goes
//! in the program's call (a reset instead when bytes are left unread),
//! and the thread lingers for its acknowledgment (and that of everything
//! sent before it, and the opening's answer first if the program closed
//! before it came) and for the peer's own closing frame, which it
//! acknowledges, for at most the transport's `CLOSE_LINGER` (its
//! `OPENING_LINGER` for a close before the opening was answered), then drops
//! the connection, which lets its relay socket go and the relay free its
//! queue. A close still unfinished then (the opening never answered, what
//! it sent unacknowledged) ends with a reset, so the peer learns at once
//! and frees its own queue, instead of waiting out its silence limit; a
//! reset from the peer, or bytes arriving after the close (a reset from
//! this end), end the linger at once. A process that exits while closes
//! linger waits for them (at most twice `CLOSE_LINGER`) in an `atexit`
//! handler, so a program that writes, closes and exits still delivers its
//! last bytes; closes still lingering then are given up with a reset (for
//! at most [`EXIT_GIVE_UP`] more), so their peers learn at once. The same
//! handler first closes every direct connection the program left open, as
//! the kernel closes an exiting process's sockets, so a peer that reads
//! sees the end rather than waiting for it for good.

use crate::log::log_line;
use crate::pid::pid;
use crate::real;
use libc::{c_int, epoll_event};
use netgap_transport::xdp::direct::{DirectConn, CLOSE_LINGER, OPENING_LINGER};
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long no program call may have pumped a connection before the
/// thread does: long enough that a program calling in a loop (a
/// ping-pong's round trip is tens of microseconds) never shares its
/// frames with the thread, short against the engine's timers (the
/// retransmission timeout's floor, the delayed acknowledgment).
const QUIET: Duration = Duration::from_millis(2);
/// How often the thread looks again at a connection a program thread
/// waits on (that wait pumps it meanwhile).
const WAITED_RECHECK: Duration = Duration::from_millis(50);
/// The epoll data of the thread's own eventfd (connections count from 1).
const KICK_DATA: u64 = 0;
/// How long the process's exit waits, past its wait for the closes, for
/// the thread to give the closes still lingering up (a reset each).
const EXIT_GIVE_UP: Duration = Duration::from_millis(20);

/// The part of a direct connection the progress thread drives too.
pub(crate) struct Link {
    /// The library's socket to its relay: the grant's steering
    /// registration (and the connection's queue) lives while it is open.
    /// Closed before `conn` once nothing more is to be sent on it (its
    /// linger ended, or another process drives it): the relay frees the
    /// queue at once, where the close of the AF_XDP socket that follows
    /// waits for the kernel's grace period (6 to 12 ms on a busy guest),
    /// during which the queue would count against the uid's cap for
    /// nothing (the relay passes over a queue freed a moment ago while
    /// another is free). Otherwise after `conn`, whose drop lingers for
    /// the peer's acknowledgments, which need the registration.
    relay: Option<OwnedFd>,
    /// Dropped by [`Link`]'s drop only, on a thread of its own.
    pub(crate) conn: ManuallyDrop<DirectConn>,
    /// Signalled by the thread after it pumped the connection.
    wake: OwnedFd,
    /// `wake` was signalled since a waiter last took it: set after the
    /// signal, so a waiter that finds it clear may find `wake` signalled
    /// still (one early return of its next wait), never the reverse (a
    /// wait that sleeps through the thread's news).
    signalled: AtomicBool,
    /// An epoll of the connection's socket and `wake`: what every wait of
    /// the program on the connection sleeps on.
    waitset: OwnedFd,
    /// When a program call last pumped the connection, ns on [`clock_ns`].
    called_ns: AtomicU64,
    /// Program threads in a blocking call's wait on the connection.
    waiting: AtomicU32,
}

impl Drop for Link {
    /// The connection's last hold goes: its AF_XDP socket closes on a
    /// thread of its own ([`close_apart`]), whichever thread let go last
    /// (the progress thread after a close's linger, or the program's own
    /// `close` when the linger ended before it let go).
    fn drop(&mut self) {
        let mut relay = self.relay.take();
        if self.conn.drop_sends_nothing() {
            drop(relay.take());
        }
        // SAFETY: taken once, here, in the drop; never used again.
        let conn = unsafe { ManuallyDrop::take(&mut self.conn) };
        close_apart(conn, relay);
    }
}

impl Link {
    /// The link of `conn`, whose grant came on `relay`.
    pub(crate) fn new(conn: DirectConn, relay: OwnedFd) -> std::io::Result<Link> {
        let wake = crate::unix::eventfd()?;
        let waitset = crate::unix::epoll()?;
        let ep = waitset.as_raw_fd();
        for fd in [conn.wait_fd().as_raw_fd(), wake.as_raw_fd()] {
            let mut ev = epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 0,
            };
            // SAFETY: the set and descriptors just made, an event on the
            // stack.
            let r = unsafe { real::epoll_ctl()(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(Link {
            conn: ManuallyDrop::new(conn),
            relay: Some(relay),
            wake,
            signalled: AtomicBool::new(false),
            waitset,
            called_ns: AtomicU64::new(clock_ns()),
            waiting: AtomicU32::new(0),
        })
    }

    /// The descriptor a waiter sleeps on: readable when frames arrived on
    /// the connection's socket or the thread moved the connection.
    pub(crate) fn wait_fd(&self) -> c_int {
        self.waitset.as_raw_fd()
    }

    /// What [`Link::wait_fd`] gathers, for a wait that watches them
    /// itself: the connection's socket and the thread's eventfd. A poll
    /// of both wakes a level sooner than a poll of the epoll of both.
    pub(crate) fn wait_fds(&self) -> [c_int; 2] {
        [self.conn.wait_fd().as_raw_fd(), self.wake.as_raw_fd()]
    }

    /// A program call is about to pump the connection: the thread leaves
    /// it alone for [`QUIET`].
    pub(crate) fn called(&self) {
        self.called_ns.store(clock_ns(), Ordering::Relaxed);
    }

    /// Takes the thread's signal, before a look at the connection that
    /// may be followed by a wait on [`Link::wait_fd`] (else that wait
    /// would return at once, for news the look has seen already).
    pub(crate) fn take_signal(&self) {
        if !self.signalled.swap(false, Ordering::Acquire) {
            return;
        }
        let mut n = 0u64;
        // SAFETY: `n` is valid for writes of its 8 bytes; a nonblocking
        // eventfd of the link's own.
        unsafe { real::read()(self.wake.as_raw_fd(), std::ptr::from_mut(&mut n).cast(), 8) };
    }

    /// A program thread starts (`true`) or ends a wait on the connection.
    pub(crate) fn waiting(&self, starts: bool) {
        if starts {
            self.waiting.fetch_add(1, Ordering::Relaxed);
        } else {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            self.called_ns.store(clock_ns(), Ordering::Relaxed);
        }
    }

    /// Wakes the program's waits on the connection.
    fn signal(&self) {
        let one = 1u64;
        // SAFETY: `one` is valid for reads of its 8 bytes.
        unsafe { real::write()(self.wake.as_raw_fd(), std::ptr::from_ref(&one).cast(), 8) };
        self.signalled.store(true, Ordering::Release);
    }

    /// Whether no program call pumped the connection lately and none
    /// waits on it; else when to look again.
    fn quiet(&self, now_ns: u64) -> Result<(), Duration> {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            return Err(WAITED_RECHECK);
        }
        let quiet_ns = QUIET.as_nanos() as u64;
        let idle_ns = now_ns.saturating_sub(self.called_ns.load(Ordering::Relaxed));
        if idle_ns >= quiet_ns {
            Ok(())
        } else {
            Err(Duration::from_nanos(quiet_ns - idle_ns))
        }
    }
}

/// Nanoseconds since the library's first look at its clock.
fn clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What the program's calls hand the thread.
enum Handed {
    /// A connection to watch.
    Watch(Weak<Link>),
    /// A connection whose program closed it: its linger, then its drop.
    Close(Arc<Link>),
}

/// The thread of one process, and what its program's calls hand it.
struct Progress {
    /// The process the thread runs in.
    pid: u32,
    /// Wakes the thread when something was handed to it.
    kick: OwnedFd,
    handed: Mutex<Vec<Handed>>,
    /// Closes handed over and not finished yet.
    lingering: AtomicUsize,
    /// The process exits: the thread gives every lingering close up.
    exiting: AtomicBool,
}

/// This process's thread. A child after `fork` finds its parent's here
/// (copied, its thread gone) and starts its own: the parent's copy is
/// left alone (leaked), since the parent's thread may have held its lock
/// at the fork. No lock guards the start either, for the same reason: the
/// threads that race to start one swap it in, and the losers' are
/// dropped unstarted.
static PROGRESS: AtomicPtr<Progress> = AtomicPtr::new(std::ptr::null_mut());
/// The `atexit` handler is registered (once; a child inherits it).
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// This process's thread, started if it has none (yet).
fn progress() -> Option<&'static Progress> {
    let pid = pid();
    let old = PROGRESS.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is a leaked `Progress`, never freed.
    if let Some(p) = unsafe { old.as_ref() } {
        if p.pid == pid {
            return Some(p);
        }
    }
    let made = match made(pid) {
        Ok(made) => made,
        Err(e) => {
            log_line!("no progress thread ({e}): direct connections move only from the program's calls, and a close lingers in its call");
            return None;
        }
    };
    let (p, ep) = made;
    let p = Box::into_raw(Box::new(p));
    if let Err(now) = PROGRESS.compare_exchange(old, p, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `p` was never shared: it is ours to free.
        drop(unsafe { Box::from_raw(p) });
        // SAFETY: a non-null pointer is a leaked `Progress`, never freed.
        return unsafe { now.as_ref() }.filter(|p| p.pid == pid);
    }
    // SAFETY: swapped in, never freed from now on.
    let p: &'static Progress = unsafe { &*p };
    let spawned = std::thread::Builder::new()
        .name("netgap-progress".into())
        .spawn(move || Thread::new(p, ep).run());
    if let Err(e) = spawned {
        log_line!("no progress thread ({e}): direct connections move only from the program's calls, and their closes wait for the process's exit");
    }
    if !AT_EXIT.swap(true, Ordering::Relaxed) {
        // SAFETY: registers a plain extern "C" function.
        unsafe { libc::atexit(finish_closes) };
    }
    Some(p)
}

/// The thread's state of process `pid` and its epoll, made (the thread
/// not started).
fn made(pid: u32) -> std::io::Result<(Progress, OwnedFd)> {
    let kick = crate::unix::eventfd()?;
    let ep = crate::unix::epoll()?;
    let mut ev = epoll_event {
        events: libc::EPOLLIN as u32,
        u64: KICK_DATA,
    };
    // SAFETY: the epoll and eventfd just made, an event on the stack.
    if unsafe {
        real::epoll_ctl()(
            ep.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            kick.as_raw_fd(),
            &mut ev,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    let p = Progress {
        pid,
        kick,
        handed: Mutex::new(Vec::new()),
        lingering: AtomicUsize::new(0),
        exiting: AtomicBool::new(false),
    };
    Ok((p, ep))
}

/// The thread watches `link` (a connection this process opened).
pub(crate) fn watch(link: &Arc<Link>) {
    if let Some(p) = progress() {
        p.hand(Handed::Watch(Arc::downgrade(link)));
    }
}

/// The program closed `link`'s last descriptor in the process that opened
/// it: the closing frame goes now (a reset if `reset`: bytes were left
/// unread), and the thread lingers for its acknowledgment. Without a
/// thread the close lingers here.
pub(crate) fn close(link: Arc<Link>, reset: bool) {
    if reset {
        link.conn.reset();
    } else {
        let _ = link.conn.start_close();
    }
    match progress() {
        Some(p) => {
            p.lingering.fetch_add(1, Ordering::Relaxed);
            p.hand(Handed::Close(link));
        }
        None => drop(link),
    }
}

impl Progress {
    fn hand(&self, h: Handed) {
        self.handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(h);
        self.kick();
    }

    /// Wakes the thread.
    fn kick(&self) {
        let one = 1u64;
        // SAFETY: `one` is valid for reads of its 8 bytes.
        unsafe { real::write()(self.kick.as_raw_fd(), std::ptr::from_ref(&one).cast(), 8) };
    }
}

/// At the process's exit: the closes still lingering finish first (at
/// most `CLOSE_LINGER` and a little), so the last bytes of a program that
/// writes, closes and exits are delivered.
extern "C" fn finish_closes() {
    let p = PROGRESS.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is a leaked `Progress`, never freed.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return;
    };
    if p.pid != pid() {
        return;
    }
    // The connections the program never closed close now, as the kernel
    // closes an exiting process's sockets: their peers see the end (a
    // reader would otherwise wait for it for good), a reset where the
    // socket's `SO_LINGER` is 0.
    for (fd, d) in crate::table::take_every_direct() {
        d.closing(fd);
        d.end();
    }
    let t0 = Instant::now();
    while p.lingering.load(Ordering::Relaxed) > 0 && t0.elapsed() < CLOSE_LINGER * 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    if p.lingering.load(Ordering::Relaxed) == 0 {
        return;
    }
    // Closes still lingering (the thread was starved, or a close waits
    // for an opening): given up with a reset each, so their peers learn
    // now rather than after their silence limit. A moment for it, no
    // more.
    p.exiting.store(true, Ordering::Release);
    p.kick();
    let t1 = Instant::now();
    while p.lingering.load(Ordering::Relaxed) > 0 && t1.elapsed() < EXIT_GIVE_UP {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How long the close of `conn` may linger: a close before the opening
/// was answered waits for it longer (the peer's end may open late), so
/// that it ends in order or with a reset the peer takes, not in a silence
/// the peer waits out.
fn linger_of(conn: &DirectConn) -> Duration {
    if conn.is_open() {
        CLOSE_LINGER
    } else {
        OPENING_LINGER
    }
}

/// A connection the thread watches.
struct Watched {
    link: Weak<Link>,
    /// Its socket is armed in the thread's epoll (one-shot).
    armed: bool,
    /// Its socket fired since the last look.
    fired: bool,
    /// The socket is in the thread's epoll at all.
    added: bool,
}

/// A connection whose close lingers.
struct Closing {
    link: Arc<Link>,
    deadline: Instant,
    armed: bool,
}

impl Closing {
    /// Whether the close's linger is over: the closing frame and what went
    /// before it acknowledged (or the peer given up), and the peer's own
    /// end arrived and acknowledged too, or the peer failed. The peer's
    /// end is waited for as well because the peer closes after this end
    /// as a rule (it reads the end, then closes): were this end gone by
    /// then, nothing would acknowledge the peer's closing frame, and the
    /// peer's close would linger its whole time, holding its queue (a
    /// gatherer that opens a connection per answer then ran out of the
    /// queues its relay grants a uid, and went through the relays).
    fn settled(&self) -> bool {
        let conn = &self.link.conn;
        if !conn.close_settled() {
            return false;
        }
        let r = conn.readiness();
        r.error || r.read_closed && conn.next_timer().is_none()
    }
}

/// The thread's own state.
struct Thread {
    p: &'static Progress,
    ep: OwnedFd,
    next_id: u64,
    watched: HashMap<u64, Watched>,
    closing: HashMap<u64, Closing>,
}

impl Thread {
    fn new(p: &'static Progress, ep: OwnedFd) -> Thread {
        Thread {
            p,
            ep,
            next_id: KICK_DATA + 1,
            watched: HashMap::new(),
            closing: HashMap::new(),
        }
    }

    fn run(mut self) {
        let _ = block_signals();
        let mut events = [epoll_event { events: 0, u64: 0 }; 64];
        loop {
            self.take_handed();
            let sleep = self.round();
            // At least a millisecond: a timer that stays due (frames the
            // kernel has not taken off the ring yet) is served by the
            // thread a thousand times a second at most, never in a spin.
            let ms = sleep.map_or(-1, |d| {
                c_int::try_from(d.as_nanos().div_ceil(1_000_000))
                    .unwrap_or(c_int::MAX)
                    .max(1)
            });
            // SAFETY: the thread's epoll, `events` valid for its length.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as c_int,
                    ms,
                )
            };
            for e in &events[..n.max(0) as usize] {
                let data = e.u64;
                if data == KICK_DATA {
                    let mut n = 0u64;
                    // SAFETY: `n` is valid for writes of its 8 bytes.
                    unsafe {
                        real::read()(
                            self.p.kick.as_raw_fd(),
                            std::ptr::from_mut(&mut n).cast(),
                            8,
                        )
                    };
                } else if let Some(w) = self.watched.get_mut(&data) {
                    w.armed = false;
                    w.fired = true;
                } else if let Some(c) = self.closing.get_mut(&data) {
                    c.armed = false;
                }
            }
        }
    }

    /// Takes what the program's calls handed over.
    fn take_handed(&mut self) {
        let handed = std::mem::take(&mut *self.p.handed.lock().unwrap_or_else(|p| p.into_inner()));
        for h in handed {
            match h {
                Handed::Watch(link) => {
                    let id = self.next_id;
                    self.next_id += 1;
                    self.watched.insert(
                        id,
                        Watched {
                            link,
                            armed: false,
                            fired: false,
                            added: false,
                        },
                    );
                }
                Handed::Close(link) => {
                    let known = self
                        .watched
                        .iter()
                        .find(|(_, w)| std::ptr::eq(w.link.as_ptr(), Arc::as_ptr(&link)))
                        .map(|(&id, w)| (id, w.added, w.armed));
                    let (id, added, mut armed) = known.unwrap_or_else(|| {
                        self.next_id += 1;
                        (self.next_id - 1, false, false)
                    });
                    self.watched.remove(&id);
                    if !added {
                        self.arm(id, &link, true);
                        armed = true;
                    }
                    let deadline = Instant::now() + linger_of(&link.conn);
                    self.closing.insert(
                        id,
                        Closing {
                            link,
                            deadline,
                            armed,
                        },
                    );
                }
            }
        }
    }

    /// Pumps what is due; how long the thread may sleep (`None`: until
    /// something is handed over).
    fn round(&mut self) -> Option<Duration> {
        let mut sleep: Option<Duration> = None;
        let mut shorter = |d: Duration| sleep = Some(sleep.map_or(d, |s| s.min(d)));
        let now_ns = clock_ns();
        let mut gone = Vec::new();
        let mut arm = Vec::new();
        for (&id, w) in &mut self.watched {
            let Some(link) = w.link.upgrade() else {
                gone.push(id);
                continue;
            };
            if let Err(again) = link.quiet(now_ns) {
                shorter(again);
                continue;
            }
            let due = link.conn.next_timer().is_some_and(|d| d.is_zero());
            if w.fired || due {
                w.fired = false;
                let _ = link.conn.pump();
                link.signal();
            }
            if let Some(d) = link.conn.next_timer() {
                shorter(d);
            }
            if !w.armed {
                arm.push((id, link, w.added));
                w.armed = true;
                w.added = true;
            }
        }
        for id in gone {
            self.watched.remove(&id);
        }
        for (id, link, added) in arm {
            self.arm(id, &link, !added);
        }
        let now = Instant::now();
        let exiting = self.p.exiting.load(Ordering::Acquire);
        let mut done = Vec::new();
        let mut arm = Vec::new();
        for (&id, c) in &mut self.closing {
            if exiting || c.settled() || now >= c.deadline {
                done.push(id);
                continue;
            }
            shorter(
                c.link
                    .conn
                    .next_timer()
                    .unwrap_or(CLOSE_LINGER)
                    .min(c.deadline - now),
            );
            if !c.armed {
                c.armed = true;
                arm.push((id, c.link.clone()));
            }
        }
        for (id, link) in arm {
            self.arm(id, &link, false);
        }
        for id in done {
            if let Some(c) = self.closing.remove(&id) {
                self.disarm(&c.link);
                // A close that did not finish in its time tells the peer
                // with a reset, rather than leave it to its silence limit.
                c.link.conn.give_up_close();
                c.link.conn.end_linger();
                self.p.lingering.fetch_sub(1, Ordering::Relaxed);
                // The last hold's drop closes it apart (see `Link`).
                drop(c.link);
            }
        }
        sleep
    }

    /// Arms `link`'s socket in the thread's epoll, one-shot, as `id`
    /// (adding it first if `add`).
    fn arm(&self, id: u64, link: &Link, add: bool) {
        let mut ev = epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            u64: id,
        };
        let op = if add {
            libc::EPOLL_CTL_ADD
        } else {
            libc::EPOLL_CTL_MOD
        };
        let fd = link.conn.wait_fd().as_raw_fd();
        // SAFETY: the thread's epoll and the connection's socket, which
        // `link` keeps open; an event on the stack.
        unsafe { real::epoll_ctl()(self.ep.as_raw_fd(), op, fd, &mut ev) };
    }

    /// Takes `link`'s socket out of the thread's epoll.
    fn disarm(&self, link: &Link) {
        let mut ev = epoll_event { events: 0, u64: 0 };
        let fd = link.conn.wait_fd().as_raw_fd();
        // SAFETY: as in `arm`.
        unsafe { real::epoll_ctl()(self.ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }
}

/// How much stack a thread that drops a closed connection needs.
const REAP_STACK_BYTES: usize = 64 << 10;

/// Drops `conn`, then `relay`, on a thread of its own: closing the AF_XDP
/// socket waits for the kernel's grace period (6 to 12 ms on a busy
/// guest), and neither the thread that drives every other connection nor
/// a program thread must wait with it. A program that opens and closes
/// connections one after another would otherwise queue those waits in the
/// progress thread, each connection's queue held at its relay until the
/// closes before it were done (90 ms at the median, measured, for
/// connections that lived 8 ms); or wait in its own `close` (or its next
/// call) when its drop was the last, as a server did for 9 ms in one
/// connection of five, between two accepts. The thread starts with
/// every signal blocked, whoever calls: the program's signals go to its
/// own threads. Without a thread, both are dropped here.
fn close_apart<C: Send + 'static>(conn: C, relay: Option<OwnedFd>) {
    let close = move || {
        drop(conn);
        drop(relay);
    };
    // The thread inherits the blocked mask; the caller's own is put back
    // once it started.
    let was = block_signals();
    let spawned = std::thread::Builder::new()
        .name("netgap-reap".into())
        .stack_size(REAP_STACK_BYTES)
        .spawn(close);
    // SAFETY: the mask saved above, on the same thread.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &was, std::ptr::null_mut()) };
    // Without a thread, the closure (and `conn` with it) is dropped here.
    drop(spawned);
}

/// Blocks every signal in the calling thread: the program's
/// process-directed signals (its alarms, its children's ends) go to its
/// own threads, whose handlers expect them. Returns the mask before.
fn block_signals() -> libc::sigset_t {
    // SAFETY: an all-zero sigset is valid storage; sigfillset and
    // pthread_sigmask on it and the calling thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut was: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut was);
        was
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use std::sync::mpsc;

    /// Whether `sig` is blocked in the calling thread.
    fn blocked(sig: c_int) -> bool {
        // SAFETY: an all-zero sigset is valid storage; a null new set
        // only reads the calling thread's mask.
        unsafe {
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask);
            libc::sigismember(&mask, sig) == 1
        }
    }

    /// What the thread that dropped a [`Witness`] saw.
    struct Seen {
        thread: Option<String>,
        signals_blocked: bool,
        relay_open: bool,
    }

    /// Stands for a connection: says, when dropped, on which thread,
    /// with which signals blocked, and whether the relay socket (the
    /// write end of a pipe whose read end is `far`) was still open.
    struct Witness {
        far: c_int,
        said: mpsc::Sender<Seen>,
    }

    impl Drop for Witness {
        fn drop(&mut self) {
            let mut p = libc::pollfd {
                fd: self.far,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; a zero timeout never blocks.
            unsafe { libc::poll(&mut p, 1, 0) };
            let _ = self.said.send(Seen {
                thread: std::thread::current().name().map(str::to_owned),
                signals_blocked: [libc::SIGALRM, libc::SIGCHLD, libc::SIGTERM, libc::SIGUSR1]
                    .into_iter()
                    .all(blocked),
                relay_open: p.revents & libc::POLLHUP == 0,
            });
        }
    }

    /// A closed connection's socket is dropped on a thread of its own,
    /// which the program's signals never reach, and its relay socket only
    /// after it; the caller's own mask is as it was.
    #[test]
    fn a_closed_connection_goes_on_a_thread_of_its_own_with_every_signal_blocked_relay_last() {
        let mut ends = [0 as c_int; 2];
        // SAFETY: `ends` is valid for two descriptors.
        let made = unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(made, 0);
        // SAFETY: both fresh descriptors, owned here.
        let (far, relay) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        let (said, seen) = mpsc::channel();
        assert!(!blocked(libc::SIGUSR1), "the test thread blocks nothing");
        close_apart(
            Witness {
                far: far.as_raw_fd(),
                said,
            },
            Some(relay),
        );
        assert!(
            !blocked(libc::SIGUSR1),
            "the caller's mask is its own again"
        );
        let s = seen.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(s.thread.as_deref(), Some("netgap-reap"));
        assert!(s.signals_blocked, "the closing thread blocks every signal");
        assert!(s.relay_open, "the relay socket closes after the connection");
        // And then it does close.
        let mut p = libc::pollfd {
            fd: far.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 10_000) };
        assert!(
            n == 1 && p.revents & libc::POLLHUP != 0,
            "the relay socket closed"
        );
    }
}
