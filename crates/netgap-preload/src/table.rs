//! The descriptor table: what the library knows about each of the
//! program's descriptor numbers it took an interest in, and the epoll
//! registrations of the program (so `epoll_wait` can report a taken-over
//! connection whose ring holds data).
//!
//! A descriptor absent from the table is the kernel's alone and every call
//! on it goes straight to the C library. The table is per process: after
//! `fork` each process has its copy, which points at the same shared
//! mappings.

use crate::conn::Conn;
use crate::pending::Pending;
use crate::real;
use libc::c_int;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// What a descriptor is to the library.
#[derive(Clone)]
pub(crate) enum Entry {
    /// A listening TCP socket whose accepted connections may be taken
    /// over; holds the presence beacon that tells connectors so.
    Listener {
        /// Kept open while the listener is; drained as it accepts.
        beacon: Arc<crate::beacon::Beacon>,
    },
    /// An accepted connection whose first bytes (a hello or the program's
    /// own data) have not been seen yet.
    Pending(Arc<Pending>),
    /// A connection on a shared-memory channel.
    Shm(Arc<Conn>),
    /// A connection to another host on an AF_XDP socket of its own.
    #[cfg(feature = "xdp")]
    Direct(Arc<crate::direct::Direct>),
    /// The region file a connection keeps open (see `Conn::new`): if the
    /// program closes this number, the connection must not close it again.
    Region(Weak<Conn>),
}

/// Descriptor number → entry.
static TABLE: RwLock<Vec<Option<Entry>>> = RwLock::new(Vec::new());
/// Entries in [`TABLE`]: zero lets every call skip the lock.
static ENTRIES: AtomicUsize = AtomicUsize::new(0);

/// The entry of `fd`, if any.
pub(crate) fn get(fd: c_int) -> Option<Entry> {
    if ENTRIES.load(Ordering::Relaxed) == 0 || fd < 0 {
        return None;
    }
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.get(fd as usize).cloned().flatten()
}

/// Sets the entry of `fd` (replacing any).
pub(crate) fn set(fd: c_int, e: Entry) {
    if fd < 0 {
        return;
    }
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    let i = fd as usize;
    if t.len() <= i {
        t.resize(i + 1, None);
    }
    let old = t[i].replace(e);
    if old.is_none() {
        ENTRIES.fetch_add(1, Ordering::Relaxed);
    }
    // A connection dropped here takes its region's entry: not under the
    // lock.
    drop(t);
    drop(old);
}

/// Records the region file of the connection `c`.
pub(crate) fn set_region(c: &Arc<Conn>) {
    set(c.region_fd(), Entry::Region(Arc::downgrade(c)));
}

/// Removes and returns the entry of `fd`.
pub(crate) fn take(fd: c_int) -> Option<Entry> {
    if ENTRIES.load(Ordering::Relaxed) == 0 || fd < 0 {
        return None;
    }
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    let e = t.get_mut(fd as usize).and_then(Option::take);
    if e.is_some() {
        ENTRIES.fetch_sub(1, Ordering::Relaxed);
    }
    e
}

/// Replaces every entry that is the pending connection `p` (the descriptor
/// and its duplicates) with `to` (or removes them).
pub(crate) fn resolve(p: &Arc<Pending>, to: Option<Entry>) {
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    for slot in t.iter_mut() {
        if matches!(slot, Some(Entry::Pending(q)) if Arc::ptr_eq(p, q)) {
            *slot = to.clone();
            if to.is_none() {
                ENTRIES.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// Removes every entry that is the connection `c` (the descriptor and its
/// duplicates): it went back to the kernel's TCP.
pub(crate) fn resolve_conn(c: &Arc<Conn>) {
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    for slot in t.iter_mut() {
        if matches!(slot, Some(Entry::Shm(d)) if Arc::ptr_eq(c, d)) {
            *slot = None;
            ENTRIES.fetch_sub(1, Ordering::Relaxed);
        }
    }
    // The caller's `c` keeps the connection alive past the lock.
}

/// Every descriptor of the offered connection `c` is the direct
/// connection `d` from now on.
#[cfg(feature = "xdp")]
pub(crate) fn conn_went_direct(c: &Arc<Conn>, d: &Arc<crate::direct::Direct>) {
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    for slot in t.iter_mut() {
        if matches!(slot, Some(Entry::Shm(e)) if Arc::ptr_eq(c, e)) {
            *slot = Some(Entry::Direct(d.clone()));
        }
    }
}

/// Takes every direct connection out of the table, each once with the
/// lowest of its descriptors: the process exits with them open.
#[cfg(feature = "xdp")]
pub(crate) fn take_every_direct() -> Vec<(c_int, Arc<crate::direct::Direct>)> {
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<(c_int, Arc<crate::direct::Direct>)> = Vec::new();
    for (fd, slot) in t.iter_mut().enumerate() {
        if let Some(Entry::Direct(d)) = slot.take_if(|e| matches!(e, Entry::Direct(_))) {
            ENTRIES.fetch_sub(1, Ordering::Relaxed);
            if !out.iter().any(|(_, e)| Arc::ptr_eq(e, &d)) {
                out.push((fd as c_int, d));
            }
        }
    }
    out
}

/// The descriptors of the direct connection `d`.
#[cfg(feature = "xdp")]
pub(crate) fn direct_descriptors(d: &Arc<crate::direct::Direct>) -> Vec<c_int> {
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Some(Entry::Direct(e)) if Arc::ptr_eq(d, e)))
        .map(|(fd, _)| fd as c_int)
        .collect()
}

/// Whether a descriptor of this process still holds the direct
/// connection `d` (asked once the closing one was taken out).
#[cfg(feature = "xdp")]
pub(crate) fn direct_shared_elsewhere(d: &Arc<crate::direct::Direct>) -> bool {
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.iter()
        .any(|s| matches!(s, Some(Entry::Direct(e)) if Arc::ptr_eq(d, e)))
}

/// Whether a descriptor other than `fd` holds the pending connection `p`
/// in this process (a dup of it).
#[cfg(feature = "xdp")]
pub(crate) fn pending_shared_elsewhere(fd: c_int, p: &Arc<Pending>) -> bool {
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.iter()
        .enumerate()
        .any(|(i, s)| i != fd as usize && matches!(s, Some(Entry::Pending(q)) if Arc::ptr_eq(p, q)))
}

/// The descriptors that are listeners.
pub(crate) fn listeners() -> Vec<c_int> {
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Some(Entry::Listener { .. })))
        .filter_map(|(fd, _)| c_int::try_from(fd).ok())
        .collect()
}

/// The descriptors of this process that are the connection `c`.
pub(crate) fn descriptors_of(c: &Arc<Conn>) -> Vec<c_int> {
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Some(Entry::Shm(d)) if Arc::ptr_eq(c, d)))
        .filter_map(|(fd, _)| c_int::try_from(fd).ok())
        .collect()
}

/// Every taken-over connection of this process.
pub(crate) fn connections() -> Vec<Arc<Conn>> {
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<Arc<Conn>> = Vec::new();
    for s in t.iter() {
        if let Some(Entry::Shm(c)) = s {
            if !out.iter().any(|d| Arc::ptr_eq(c, d)) {
                out.push(c.clone());
            }
        }
    }
    out
}

/// Whether another descriptor of this process holds the same connection.
pub(crate) fn shared_elsewhere(c: &Arc<Conn>) -> bool {
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.iter()
        .any(|s| matches!(s, Some(Entry::Shm(d)) if Arc::ptr_eq(c, d)))
}

/// One epoll registration: the events asked for and the program's data.
#[derive(Clone, Copy)]
pub(crate) struct Interest {
    pub(crate) events: u32,
    pub(crate) data: u64,
    /// A relayed connection's socket to its relay is registered in the
    /// same epoll with the same data, so the relay can wake a wait on it
    /// from this host.
    pub(crate) bell: bool,
}

/// epoll descriptor → (descriptor → registration).
static EPOLL: Mutex<Option<HashMap<c_int, HashMap<c_int, Interest>>>> = Mutex::new(None);

/// Held across each change the library makes to the program's epolls: the
/// kernel's registrations (a descriptor's and its relay socket's beside
/// it) and their record in [`EPOLL`] change together. A wait that woke
/// looks at the records only once the changes begun before it woke are
/// whole ([`registrations_settled`]); else a registration the kernel
/// already reported (the relay socket's and the connection's, with the
/// same data) could be missing from the records, and reach the program as
/// two events, or a removal could miss a relay socket registered a moment
/// before it was recorded, leaving it to wake the epoll later with the
/// data of a descriptor the program had taken out (and reuses).
///
/// A pthread mutex, not a `Mutex`, so that `fork` can hold it across
/// (see [`hold_registrations_across_fork`]): a child forked while another
/// thread held it would otherwise find it held forever.
struct RegistrationLock(std::cell::UnsafeCell<libc::pthread_mutex_t>);

// SAFETY: a pthread mutex is made to be locked and unlocked from any
// thread; the cell is only ever handed to the pthread calls.
unsafe impl Sync for RegistrationLock {}

static REGISTRATIONS: RegistrationLock =
    RegistrationLock(std::cell::UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER));

/// The lock on the program's epoll registrations, held while this lives
/// (see [`REGISTRATIONS`]). Never taken twice by one thread: nothing done
/// under it asks for it again.
#[must_use]
pub(crate) struct Registering(());

/// Takes the lock on the program's epoll registrations.
pub(crate) fn registering() -> Registering {
    // SAFETY: a statically initialised default mutex, locked here and
    // unlocked by the guard's drop in the same thread.
    unsafe { libc::pthread_mutex_lock(REGISTRATIONS.0.get()) };
    Registering(())
}

impl Drop for Registering {
    fn drop(&mut self) {
        // SAFETY: locked by this thread in `registering`.
        unsafe { libc::pthread_mutex_unlock(REGISTRATIONS.0.get()) };
    }
}

/// Waits until every change to the program's epolls begun before now is
/// whole, kernel and records alike.
fn registrations_settled() {
    drop(registering());
}

/// Keeps the registrations' lock held across `fork` (taken before it,
/// let go after it in both processes), so that the child never inherits
/// it held by a thread it does not have.
pub(crate) fn hold_registrations_across_fork() {
    extern "C" fn before() {
        std::mem::forget(registering());
    }
    extern "C" fn after() {
        // SAFETY: locked by this thread in `before`, the fork's own
        // preparation; in the child this thread is the one that forked.
        unsafe { libc::pthread_mutex_unlock(REGISTRATIONS.0.get()) };
    }
    // SAFETY: registers plain extern "C" functions that only lock and
    // unlock the mutex above.
    unsafe { libc::pthread_atfork(Some(before), Some(after), Some(after)) };
}

/// Records an `epoll_ctl` that the kernel accepted.
pub(crate) fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: Option<Interest>) {
    let mut g = EPOLL.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    match (op, ev) {
        (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, Some(i)) => {
            map.entry(epfd).or_default().insert(fd, i);
        }
        (libc::EPOLL_CTL_DEL, _) => {
            if let Some(s) = map.get_mut(&epfd) {
                s.remove(&fd);
            }
        }
        _ => {}
    }
}

/// Whether the registration of `fd` in `epfd` has the relay socket beside
/// it.
pub(crate) fn epoll_bell(epfd: c_int, fd: c_int) -> bool {
    let g = EPOLL.lock().unwrap_or_else(|p| p.into_inner());
    g.as_ref()
        .and_then(|m| m.get(&epfd))
        .and_then(|s| s.get(&fd))
        .is_some_and(|i| i.bell)
}

/// The epolls where `fd` is registered without the relay socket beside
/// it, with the registration.
pub(crate) fn epoll_regs_without_bell(fd: c_int) -> Vec<(c_int, Interest)> {
    let g = EPOLL.lock().unwrap_or_else(|p| p.into_inner());
    g.as_ref().map_or_else(Vec::new, |m| {
        m.iter()
            .filter_map(|(&epfd, s)| s.get(&fd).filter(|i| !i.bell).map(|&i| (epfd, i)))
            .collect()
    })
}

/// Notes that the relay socket is now registered beside `fd` in `epfd`.
pub(crate) fn epoll_set_bell(epfd: c_int, fd: c_int) {
    let mut g = EPOLL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = g
        .as_mut()
        .and_then(|m| m.get_mut(&epfd))
        .and_then(|s| s.get_mut(&fd))
    {
        i.bell = true;
    }
}

/// What leaves the program's epolls with a descriptor the library
/// forgets ([`take_registered`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leaving {
    /// The socket the library registered beside the descriptor (a relay
    /// socket, a direct connection's socket), from each epoll where it
    /// did: its wake-ups would name a closed descriptor's data.
    pub(crate) beside: Option<c_int>,
    /// The descriptor itself, from every epoll it is registered in: a
    /// duplicate of the library's keeps its file open, and with it the
    /// kernel's registrations, which the kernel's close of the file's last
    /// descriptor would take.
    pub(crate) itself: bool,
}

/// Takes `fd`'s entry out of the table and its registrations out of the
/// records of the program's epolls, as one step that a woken wait sees
/// whole (see [`registering`]); what `leaving` says, from the entry
/// taken, leaves the kernel's registrations in the same step.
pub(crate) fn take_registered(
    fd: c_int,
    leaving: impl FnOnce(Option<&Entry>) -> Leaving,
) -> Option<Entry> {
    let _registering = registering();
    let taken = take(fd);
    let leaving = leaving(taken.as_ref());
    for (epfd, bell) in epoll_forget(fd) {
        let gone = [
            leaving.beside.filter(|_| bell),
            leaving.itself.then_some(fd),
        ];
        for s in gone.into_iter().flatten() {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: a plain epoll_ctl on the program's epoll and a
            // descriptor registered there, still open.
            unsafe { real::epoll_ctl()(epfd, libc::EPOLL_CTL_DEL, s, &mut ev) };
        }
    }
    taken
}

/// Forgets `fd` as a registered descriptor and as an epoll instance;
/// returns the epolls where it was registered, each with whether the
/// library's socket was beside it there.
fn epoll_forget(fd: c_int) -> Vec<(c_int, bool)> {
    let mut g = EPOLL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(map) = g.as_mut() else {
        return Vec::new();
    };
    map.remove(&fd);
    map.iter_mut()
        .filter_map(|(&epfd, s)| s.remove(&fd).map(|i| (epfd, i.bell)))
        .collect()
}

/// The registrations of `epfd` whose descriptor the library holds: the
/// taken-over connections, and the accepted ones not yet resolved, one
/// pass over the registrations for both.
pub(crate) type EpollEntries = (
    Vec<(c_int, Interest, Arc<Conn>)>,
    Vec<(c_int, Interest, Arc<Pending>)>,
);

/// The registrations of `epfd` as recorded once every change begun before
/// the call is whole; None if it has none.
fn epoll_regs(epfd: c_int) -> Option<Vec<(c_int, Interest)>> {
    registrations_settled();
    let g = EPOLL.lock().unwrap_or_else(|p| p.into_inner());
    let s = g.as_ref()?.get(&epfd)?;
    Some(s.iter().map(|(&fd, &i)| (fd, i)).collect())
}

/// The registrations of `epfd` that are direct connections.
#[cfg(feature = "xdp")]
pub(crate) fn epoll_direct(epfd: c_int) -> Vec<(c_int, Interest, Arc<crate::direct::Direct>)> {
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    let Some(regs) = epoll_regs(epfd) else {
        return Vec::new();
    };
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    regs.into_iter()
        .filter_map(|(fd, i)| match t.get(fd as usize) {
            Some(Some(Entry::Direct(d))) => Some((fd, i, d.clone())),
            _ => None,
        })
        .collect()
}

pub(crate) fn epoll_entries(epfd: c_int) -> EpollEntries {
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return (Vec::new(), Vec::new());
    }
    let Some(regs) = epoll_regs(epfd) else {
        return (Vec::new(), Vec::new());
    };
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    let (mut shm, mut pend) = (Vec::new(), Vec::new());
    for (fd, i) in regs {
        match t.get(fd as usize) {
            Some(Some(Entry::Shm(c))) => shm.push((fd, i, c.clone())),
            Some(Some(Entry::Pending(p))) => pend.push((fd, i, p.clone())),
            _ => {}
        }
    }
    (shm, pend)
}

impl Drop for Conn {
    fn drop(&mut self) {
        let fd = self.region_fd.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            crate::table::take(fd);
            // SAFETY: the region file this connection owns, closed once
            // (the swap); the mapping goes with the channel.
            unsafe { real::close()(fd) };
        }
        let bell = self.bell();
        if bell >= 0 {
            // SAFETY: the relay socket this connection owns, closed once.
            unsafe { real::close()(bell) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A wait that woke looks at the records only once a change begun
    /// before it is whole: the registration recorded after the kernel's
    /// (here, after a pause) is in what it sees.
    #[test]
    fn a_look_at_the_registrations_waits_for_a_change_under_way() {
        // An epoll number no other test uses: the records are the
        // process's.
        let (epfd, fd) = (-1_000_001, 5);
        let (held, holding) = mpsc::channel();
        let changer = std::thread::spawn(move || {
            let registering = registering();
            held.send(()).expect("the test waits");
            std::thread::sleep(Duration::from_millis(100));
            let interest = Interest {
                events: libc::EPOLLIN as u32,
                data: 7,
                bell: true,
            };
            epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, Some(interest));
            drop(registering);
        });
        holding.recv().expect("the change began");
        let regs = epoll_regs(epfd).expect("the registration recorded");
        assert_eq!(regs.len(), 1);
        assert_eq!((regs[0].0, regs[0].1.data, regs[0].1.bell), (fd, 7, true));
        changer.join().expect("the change");
        epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, None);
        assert!(epoll_regs(epfd).is_some_and(|r| r.is_empty()));
    }

    /// Whether `fd` is registered in the kernel's `epfd`: a change of it
    /// is refused with ENOENT when it is not.
    fn in_kernel_epoll(epfd: c_int, fd: c_int) -> bool {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: plain epoll_ctl on the test's own descriptors (the C
        // library's: this crate's own `epoll_ctl` is the test binary's).
        let r = unsafe { real::epoll_ctl()(epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) };
        r == 0
    }

    /// A descriptor taken with its registrations leaves, as asked, every
    /// epoll it was registered in (with or without the library's socket
    /// beside it), and the socket beside it leaves only those where the
    /// library put it.
    #[test]
    fn a_descriptor_taken_leaves_every_epoll_it_was_in_and_its_socket_only_where_beside_it() {
        use std::os::fd::AsRawFd;
        let with_bell = epoll_instance();
        let without_bell = epoll_instance();
        let eventfd = || crate::unix::eventfd().expect("an eventfd");
        let (conn, bell) = (eventfd(), eventfd());
        let (fd, sock) = (conn.as_raw_fd(), bell.as_raw_fd());
        for (ep, fd, data, beside) in [
            (with_bell.as_raw_fd(), fd, 1, true),
            (with_bell.as_raw_fd(), sock, 1, false),
            (without_bell.as_raw_fd(), fd, 2, false),
            // The same socket in the other epoll for something else of
            // the program's: not the library's, it stays.
            (without_bell.as_raw_fd(), sock, 3, false),
        ] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: data,
            };
            // SAFETY: as in `in_kernel_epoll`.
            let r = unsafe { real::epoll_ctl()(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
            assert_eq!(r, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
            if fd != sock {
                let interest = Interest {
                    events: libc::EPOLLIN as u32,
                    data,
                    bell: beside,
                };
                epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, Some(interest));
            }
        }
        let leaving = Leaving {
            beside: Some(sock),
            itself: true,
        };
        assert!(take_registered(fd, |_| leaving).is_none());
        assert!(!in_kernel_epoll(with_bell.as_raw_fd(), fd));
        assert!(!in_kernel_epoll(with_bell.as_raw_fd(), sock));
        assert!(!in_kernel_epoll(without_bell.as_raw_fd(), fd));
        assert!(in_kernel_epoll(without_bell.as_raw_fd(), sock));
        for ep in [&with_bell, &without_bell] {
            assert!(epoll_regs(ep.as_raw_fd()).is_none_or(|r| r.is_empty()));
        }
    }

    /// A fresh epoll, closed when dropped.
    fn epoll_instance() -> std::os::fd::OwnedFd {
        use std::os::fd::FromRawFd;
        // SAFETY: plain epoll_create1; the result is checked and owned at
        // once.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(
            fd >= 0,
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a new descriptor nothing else owns.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
    }
}
