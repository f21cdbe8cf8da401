//! netgap's steering program on an interface ([`Steering`]): its maps
//! made, the program ([`steer::program`]) loaded over them and attached
//! through a BPF link, sockets put in its `XSKMAP`, connections registered
//! for their queues, its drops read. libbpf's calls, no libxdp.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::{Arc, Mutex, Weak};

use super::super::steer::{self, ConnId, Insn};
use super::Attach;

extern "C" {
    fn bpf_map_create(
        map_type: c_int,
        map_name: *const c_char,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        opts: *const c_void,
    ) -> c_int;
    fn bpf_map_update_elem(
        fd: c_int,
        key: *const c_void,
        value: *const c_void,
        flags: u64,
    ) -> c_int;
    fn bpf_map_delete_elem(fd: c_int, key: *const c_void) -> c_int;
    fn bpf_map_lookup_elem(fd: c_int, key: *const c_void, value: *mut c_void) -> c_int;
    fn libbpf_num_possible_cpus() -> c_int;
    fn bpf_prog_load(
        prog_type: c_int,
        prog_name: *const c_char,
        license: *const c_char,
        insns: *const Insn,
        insn_cnt: usize,
        opts: *const c_void,
    ) -> c_int;
    fn netgap_xdp_link(prog_fd: c_int, ifindex: c_int, xdp_flags: u32) -> c_int;
}

/// `BPF_MAP_TYPE_XSKMAP`: a map of AF_XDP sockets, keyed by queue.
const BPF_MAP_TYPE_XSKMAP: c_int = 17;
/// `BPF_MAP_TYPE_HASH`.
const BPF_MAP_TYPE_HASH: c_int = 1;
/// `BPF_MAP_TYPE_PERCPU_ARRAY`.
const BPF_MAP_TYPE_PERCPU_ARRAY: c_int = 6;
/// `BPF_PROG_TYPE_XDP`.
const BPF_PROG_TYPE_XDP: c_int = 6;
/// `XDP_FLAGS_SKB_MODE`: the generic XDP hook, in the stack after the
/// driver made an skb; works on every interface.
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: the driver's own XDP hook.
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

impl Attach {
    /// The mode's `XDP_FLAGS_*`.
    fn flags(self) -> u32 {
        match self {
            Attach::Native => XDP_FLAGS_DRV_MODE,
            Attach::Generic => XDP_FLAGS_SKB_MODE,
        }
    }
}

/// netgap's steering program (`steer::program`) attached to an
/// interface, with its maps: the `XSKMAP` of the sockets by queue, the
/// connection registered for each queue but 0, and the drop counter.
/// Dropping it detaches the program (the link is its only holder) and
/// frees the maps once no socket's process holds them.
pub struct Steering {
    /// The BPF link that holds the program on the interface.
    link: OwnedFd,
    /// The loaded program.
    prog: OwnedFd,
    /// The `XSKMAP` the program redirects into.
    xsks: OwnedFd,
    /// Queue to [`ConnId`], for every queue but 0.
    conns: OwnedFd,
    /// The per-CPU drop counter.
    drops: OwnedFd,
    /// Queues the `XSKMAP` has room for (`0..queues`).
    queues: u32,
    /// Where the link attached it.
    attach: Attach,
}

/// A `bpf_map_create` of `kind` named `name`, `entries` long.
fn map_create(
    kind: c_int,
    name: &std::ffi::CStr,
    key_bytes: u32,
    value_bytes: u32,
    entries: u32,
) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name alive for the call; no options (a null
    // pointer is the defaults).
    let rc = unsafe {
        bpf_map_create(
            kind,
            name.as_ptr(),
            key_bytes,
            value_bytes,
            entries,
            ptr::null(),
        )
    };
    bpf_fd(rc, &format!("making the map {}", name.to_string_lossy()))
}

/// `bpf_map_update_elem(map, key, value, BPF_ANY)`.
fn map_update(map: &OwnedFd, key: &[u8], value: &[u8], what: &str) -> io::Result<()> {
    // SAFETY: `key` and `value` are live buffers of the sizes the map was
    // made with (the callers' types fix them); BPF_ANY is 0.
    let rc = unsafe {
        bpf_map_update_elem(
            map.as_raw_fd(),
            key.as_ptr().cast(),
            value.as_ptr().cast(),
            0,
        )
    };
    if rc < 0 {
        let e = io::Error::from_raw_os_error(rc.saturating_neg());
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

impl Steering {
    /// Makes the maps for queues `0..queues`, loads the steering program
    /// over them, and attaches it to interface `ifname` through a BPF
    /// link: at the driver's hook where the driver has one, else at the
    /// generic hook.
    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "the relay's direct connections use it (issue 44's next step)"
        )
    )]
    pub(crate) fn attach(ifname: &str, queues: u32) -> io::Result<Steering> {
        // A socket being made meanwhile would take this steering's new
        // descriptors for libxdp's leftovers, and close them with itself.
        let _serial = super::LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
        Steering::attach_serialized(ifname, queues)
    }

    /// [`Steering::attach`], for a caller that holds
    /// [`super::LIFECYCLE`].
    pub(super) fn attach_serialized(ifname: &str, queues: u32) -> io::Result<Steering> {
        let name = CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
        let ifindex = ifindex(&name)?;
        let u32_bytes = std::mem::size_of::<u32>() as u32;
        let xsks = map_create(
            BPF_MAP_TYPE_XSKMAP,
            c"netgap_xsks",
            u32_bytes,
            u32_bytes,
            queues.max(1),
        )?;
        let conns = map_create(
            BPF_MAP_TYPE_HASH,
            c"netgap_conns",
            u32_bytes,
            std::mem::size_of::<[u8; 8]>() as u32,
            queues.max(1),
        )?;
        let drops = map_create(
            BPF_MAP_TYPE_PERCPU_ARRAY,
            c"netgap_drops",
            u32_bytes,
            std::mem::size_of::<u64>() as u32,
            1,
        )?;
        let insns = steer::program(steer::Maps {
            xsks: xsks.as_raw_fd(),
            conns: conns.as_raw_fd(),
            drops: drops.as_raw_fd(),
        });
        // SAFETY: `insns` is a live slice of `insns.len()` instructions laid
        // out as `struct bpf_insn`; the names are NUL-terminated constants;
        // no options.
        let prog = bpf_fd(
            unsafe {
                bpf_prog_load(
                    BPF_PROG_TYPE_XDP,
                    c"netgap_steer".as_ptr(),
                    c"Dual MIT/GPL".as_ptr(),
                    insns.as_ptr(),
                    insns.len(),
                    ptr::null(),
                )
            },
            "loading the XDP program",
        )?;
        let mut tried = Vec::new();
        for attach in [Attach::Native, Attach::Generic] {
            // SAFETY: plain descriptors and flags; the shim fills in libbpf's
            // options structure for this libbpf.
            let rc = unsafe { netgap_xdp_link(prog.as_raw_fd(), ifindex, attach.flags()) };
            match bpf_fd(rc, attach.name()) {
                Ok(link) => {
                    return Ok(Steering {
                        link,
                        prog,
                        xsks,
                        conns,
                        drops,
                        queues: queues.max(1),
                        attach,
                    })
                }
                Err(e) => tried.push(e),
            }
        }
        let kind = if tried
            .iter()
            .any(|e| e.kind() == io::ErrorKind::ResourceBusy)
        {
            io::ErrorKind::ResourceBusy
        } else {
            io::ErrorKind::Unsupported
        };
        let why: Vec<String> = tried.iter().map(ToString::to_string).collect();
        Err(io::Error::new(
            kind,
            format!("attaching the XDP program ({})", why.join("; ")),
        ))
    }

    pub(super) fn owns(&self, fd: RawFd) -> bool {
        [&self.link, &self.prog, &self.xsks, &self.conns, &self.drops]
            .iter()
            .any(|o| o.as_raw_fd() == fd)
    }

    fn check_queue(&self, queue: u32) -> io::Result<()> {
        if queue >= self.queues {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "queue {queue} is past the steering's {} queues",
                    self.queues
                ),
            ));
        }
        Ok(())
    }

    /// Puts AF_XDP socket `socket`, bound to `queue` of the interface, at
    /// `queue` of the `XSKMAP`. The map holds no reference on the socket:
    /// the entry goes when the socket closes.
    pub fn put_socket(&self, queue: u32, socket: RawFd) -> io::Result<()> {
        self.check_queue(queue)?;
        map_update(
            &self.xsks,
            &queue.to_ne_bytes(),
            &socket.to_ne_bytes(),
            "putting the socket in the XSKMAP",
        )
    }

    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "the relay's direct connections use it (issue 44's next step)"
        )
    )]
    /// Registers connection `conn` for `queue` (not 0): from now on only
    /// its frames go to the queue's socket.
    pub(crate) fn register(&self, queue: u32, conn: ConnId) -> io::Result<()> {
        self.check_queue(queue)?;
        if queue == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queue 0 is the port's own and takes every netgap frame",
            ));
        }
        map_update(
            &self.conns,
            &queue.to_ne_bytes(),
            &conn.to_value(),
            "registering the connection",
        )
    }

    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "the relay's direct connections use it (issue 44's next step)"
        )
    )]
    /// Forgets the connection of `queue`: its frames are dropped from now
    /// on. Forgetting a queue with none is no error.
    pub(crate) fn unregister(&self, queue: u32) -> io::Result<()> {
        let key = queue.to_ne_bytes();
        // SAFETY: `key` is a live u32, the map's key size.
        let rc = unsafe { bpf_map_delete_elem(self.conns.as_raw_fd(), key.as_ptr().cast()) };
        if rc < 0 && rc != -libc::ENOENT {
            let e = io::Error::from_raw_os_error(rc.saturating_neg());
            return Err(io::Error::new(
                e.kind(),
                format!("unregistering queue {queue}'s connection: {e}"),
            ));
        }
        Ok(())
    }

    /// Frames the program dropped since it was loaded (not the registered
    /// connection's on their queue), summed over the CPUs.
    pub fn drops(&self) -> io::Result<u64> {
        // SAFETY: no arguments; libbpf reads the possible CPUs from sysfs.
        let cpus = unsafe { libbpf_num_possible_cpus() };
        let cpus = usize::try_from(cpus)
            .map_err(|_| io::Error::from_raw_os_error(cpus.saturating_neg()))?;
        let mut per_cpu = vec![0u64; cpus.max(1)];
        let key = steer::DROPS_KEY.to_ne_bytes();
        // SAFETY: a per-CPU map's lookup writes one value per possible CPU,
        // which `per_cpu` holds; `key` is a live u32.
        let rc = unsafe {
            bpf_map_lookup_elem(
                self.drops.as_raw_fd(),
                key.as_ptr().cast(),
                per_cpu.as_mut_ptr().cast(),
            )
        };
        if rc < 0 {
            let e = io::Error::from_raw_os_error(rc.saturating_neg());
            return Err(io::Error::new(
                e.kind(),
                format!("reading the drop counter: {e}"),
            ));
        }
        Ok(per_cpu.iter().fold(0u64, |a, &n| a.saturating_add(n)))
    }

    /// Where the link attached the program.
    pub(crate) fn attach_mode(&self) -> Attach {
        self.attach
    }

    /// The loaded program (for a test run).
    #[cfg(test)]
    pub(crate) fn prog(&self) -> &OwnedFd {
        &self.prog
    }
}

/// Which interface a steering is on: the network namespace's inode and
/// the interface's index there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Where {
    netns: u64,
    ifindex: c_int,
}

impl Where {
    fn here(ifname: &str) -> io::Result<Where> {
        use std::os::unix::fs::MetadataExt;
        let name = CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
        Ok(Where {
            netns: std::fs::metadata("/proc/thread-self/ns/net")?.ino(),
            ifindex: ifindex(&name)?,
        })
    }
}

/// The steerings this process attached, by interface: an interface holds
/// one XDP program, so the process's own port on it and the sockets it
/// makes for other processes there share it.
static ATTACHED: Mutex<Vec<(Where, Weak<Steering>)>> = Mutex::new(Vec::new());

/// Queues every shared steering has room for: as many as a direct
/// connection's setup can name.
pub(crate) const SHARED_QUEUES: u32 = netgap_proto::direct::MAX_QUEUES as u32;

impl Steering {
    /// The steering of interface `ifname` in this thread's namespace: the
    /// one this process attached there if it still stands, else a new one
    /// for `SHARED_QUEUES` (32) queues, attached. The program stays while any
    /// holder (a port, a registration) keeps it.
    pub fn shared(ifname: &str) -> io::Result<Arc<Steering>> {
        let _serial = super::LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
        Steering::shared_serialized(ifname)
    }

    /// [`Steering::shared`], for a caller that holds [`super::LIFECYCLE`].
    pub(super) fn shared_serialized(ifname: &str) -> io::Result<Arc<Steering>> {
        let at = Where::here(ifname)?;
        let mut attached = ATTACHED.lock().unwrap_or_else(|e| e.into_inner());
        attached.retain(|(_, w)| w.strong_count() > 0);
        if let Some(s) = attached
            .iter()
            .find(|(w, _)| *w == at)
            .and_then(|(_, s)| s.upgrade())
        {
            return Ok(s);
        }
        let s = Arc::new(Steering::attach_serialized(ifname, SHARED_QUEUES)?);
        attached.push((at, Arc::downgrade(&s)));
        Ok(s)
    }

    /// Registers `conn` for `queue` (`Steering::register`) for as long as
    /// the returned registration lives: dropping it forgets the connection
    /// (its queue's frames are dropped from then on).
    pub fn register_while(
        self: &Arc<Steering>,
        queue: u32,
        conn: ConnId,
    ) -> io::Result<Registration> {
        self.register(queue, conn)?;
        Ok(Registration {
            steering: Arc::clone(self),
            queue,
        })
    }
}

/// A connection registered for a queue of a steering, which it keeps
/// attached; dropping it forgets the connection.
pub struct Registration {
    steering: Arc<Steering>,
    queue: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Nothing to do about a failure here: the map is gone with the
        // program once no holder is left.
        let _ = self.steering.unregister(self.queue);
    }
}

/// The index of interface `name` in this thread's network namespace.
pub(super) fn ifindex(name: &CString) -> io::Result<c_int> {
    // SAFETY: `name` is NUL-terminated and alive for the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    c_int::try_from(ifindex)
        .ok()
        .filter(|&i| i > 0)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {}", name.to_string_lossy()),
            )
        })
}

/// A descriptor a libbpf call returned, or the error it stands for (libbpf
/// 1.x returns `-errno`).
pub(super) fn bpf_fd(rc: c_int, what: &str) -> io::Result<OwnedFd> {
    if rc < 0 {
        let e = io::Error::from_raw_os_error(rc.saturating_neg());
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    // SAFETY: a non-negative return of a libbpf call that makes a
    // descriptor is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc) })
}
