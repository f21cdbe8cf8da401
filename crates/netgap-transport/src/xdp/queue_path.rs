//! A switch that keeps a netgap frame's queue: a program at the ingress of
//! each bridge port that writes the queue the frame arrived on into its
//! mark, under a tag of netgap's, and one at the egress of each port that
//! gives the frame that queue back just before the port picks its transmit
//! queue, so the other host's XDP program sees it on the queue it was sent
//! on. Plain instructions and a few `bpf` system calls: no libbpf, no tc
//! modules, so the testbed (which builds without the `xdp` feature)
//! attaches them too.
//!
//! Why it is needed (measured on Linux 6.18, four-queue veths through a
//! bridge, a frame sent on queue q of one host and the other host's native
//! XDP reading `rx_queue_index`): without it q 1, 2, 3 arrived on 0, 1, 2,
//! and q 0 on a queue of the flow hash. A veth passes the sender's queue on
//! as the frame's queue mapping; the bridge's port picks its transmit queue
//! by taking that mapping for a recorded receive queue, which the kernel
//! stores plus one, so every bridge loses one, and 0 (nothing recorded)
//! falls to the hash. A shaped port loses more: the testbed holds a host's
//! uplink by redirecting the port's ingress to a one-queue IFB device
//! (`netgap-testbed`'s `shaping.rs`), whose transmit sets the mapping to
//! its own queue 0, so every queue arrived on the one queue of the flow
//! hash, whatever the ingress had recorded. The mark survives that round
//! trip (and the bridge), so the queue is set at the egress, after it.
//! Writing the mapping at a tcx egress is read the same way, as a recorded
//! receive queue: the egress writes the queue plus one (a frame whose
//! egress wrote q went out on q - 1, checked on a bare veth pair). With
//! both programs every queue arrives as sent, shaped or not
//! (`tests::a_frame_keeps_its_queue_across_a_switch` and
//! `a_frame_keeps_its_queue_across_a_shaped_switch` in `sys/mod.rs`). The
//! last hop needs the receiver's program at the driver's hook (native XDP,
//! which veth has): the generic hook reads the recorded queue, one less.
//!
//! Only netgap's EtherType is touched: every other frame crosses the switch
//! as before, its mark included. A netgap frame's mark is netgap's inside
//! the switch's namespace (nothing else there marks frames, and a frame
//! crossing into a namespace arrives with none), and the egress clears it.
//!
//! The programs are attached with `BPF_PROG_ATTACH` (tcx), not links, so
//! they stay on the port after the attaching process exits, until the port
//! goes with its namespace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::reliable::ETHERTYPE;

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// Offsets in `struct __sk_buff`.
const SKB_MARK: i16 = 8;
const SKB_QUEUE_MAPPING: i16 = 12;
const SKB_PROTOCOL: i16 = 16;
/// `TCX_NEXT`: the frame goes on to whatever else the port runs.
const TCX_NEXT: i32 = -1;
/// The upper half of a netgap frame's mark while it crosses the switch
/// ("ng"); the lower half is the queue it arrived on.
const MARK_TAG: i32 = 0x6e67_0000;

/// netgap's EtherType as `skb->protocol` loads it (network order).
fn ethertype_as_loaded() -> i32 {
    i32::from(u16::from_ne_bytes(ETHERTYPE.to_be_bytes()))
}

/// The ingress program: for a netgap frame, mark = tag | queue mapping
/// (the queue the sending host sent it on).
fn ingress_program() -> [Insn; 7] {
    [
        // r2 = skb->protocol
        insn(0x61, 2, 1, SKB_PROTOCOL, 0),
        // if r2 != netgap's EtherType: skip three
        insn(0x55, 2, 0, 3, ethertype_as_loaded()),
        // skb->mark = skb->queue_mapping | tag
        insn(0x61, 2, 1, SKB_QUEUE_MAPPING, 0),
        insn(0x47, 2, 0, 0, MARK_TAG),
        insn(0x63, 1, 2, SKB_MARK, 0),
        // return TCX_NEXT
        insn(0xb7, 0, 0, 0, TCX_NEXT),
        insn(0x95, 0, 0, 0, 0),
    ]
}

/// The egress program: for a netgap frame whose mark has the tag, queue
/// mapping = the marked queue + 1 (recorded as its receive queue, which
/// the port's pick takes less one), and the mark cleared.
fn egress_program() -> [Insn; 13] {
    [
        // r2 = skb->protocol
        insn(0x61, 2, 1, SKB_PROTOCOL, 0),
        // if r2 != netgap's EtherType: skip nine
        insn(0x55, 2, 0, 9, ethertype_as_loaded()),
        // r2 = skb->mark; r3 = r2 >> 16
        insn(0x61, 2, 1, SKB_MARK, 0),
        insn(0xbf, 3, 2, 0, 0),
        insn(0x77, 3, 0, 0, 16),
        // if r3 != the tag: skip five
        insn(0x55, 3, 0, 5, MARK_TAG >> 16),
        // skb->queue_mapping = (r2 & 0xffff) + 1
        insn(0x57, 2, 0, 0, 0xffff),
        insn(0x07, 2, 0, 0, 1),
        insn(0x63, 1, 2, SKB_QUEUE_MAPPING, 0),
        // skb->mark = 0
        insn(0xb7, 3, 0, 0, 0),
        insn(0x63, 1, 3, SKB_MARK, 0),
        // return TCX_NEXT
        insn(0xb7, 0, 0, 0, TCX_NEXT),
        insn(0x95, 0, 0, 0, 0),
    ]
}

/// `BPF_PROG_LOAD`'s attributes, up to the fields used.
#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `BPF_PROG_ATTACH`'s attributes.
#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_ifindex: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    relative_fd: u32,
    expected_revision: u64,
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// Where on a port each of the two programs runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hook {
    /// Frames the port takes from its host: the queue is marked.
    Ingress,
    /// Frames the port sends to its host: the queue is set from the mark.
    Egress,
}

impl Hook {
    const BOTH: [Hook; 2] = [Hook::Ingress, Hook::Egress];

    fn attach_type(self) -> u32 {
        match self {
            Hook::Ingress => BPF_TCX_INGRESS,
            Hook::Egress => BPF_TCX_EGRESS,
        }
    }

    /// The program's name, as `bpftool prog` lists it (15 bytes at most).
    fn program_name(self) -> &'static [u8] {
        match self {
            Hook::Ingress => b"netgap_queue_in",
            Hook::Egress => b"netgap_queue_eg",
        }
    }
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live `bpf_attr` prefix of the size given, whose
    // pointers (set by the callers) point to live buffers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            std::mem::size_of::<T>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// The program for `hook`, loaded.
fn load(hook: Hook) -> io::Result<OwnedFd> {
    let ingress;
    let egress;
    let insns: &[Insn] = match hook {
        Hook::Ingress => {
            ingress = ingress_program();
            &ingress
        }
        Hook::Egress => {
            egress = egress_program();
            &egress
        }
    };
    let mut name = [0u8; 16];
    let given = hook.program_name();
    name[..given.len()].copy_from_slice(given);
    let mut load = LoadAttr {
        prog_type: BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: c"Dual MIT/GPL".as_ptr() as u64,
        prog_name: name,
        ..LoadAttr::default()
    };
    let fd = bpf(BPF_PROG_LOAD, &mut load)?;
    // SAFETY: a new descriptor the load returned; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `BPF_PROG_ATTACH` or `BPF_PROG_DETACH` of `prog` at the tcx `hook` of
/// interface `ifname` in this thread's namespace.
fn at_hook(cmd: libc::c_long, hook: Hook, prog: &OwnedFd, ifname: &str) -> io::Result<()> {
    let name = std::ffi::CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
    // SAFETY: a NUL-terminated name alive for the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    let mut attr = AttachAttr {
        target_ifindex: ifindex,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: hook.attach_type(),
        ..AttachAttr::default()
    };
    bpf(cmd, &mut attr)?;
    Ok(())
}

/// Attaches the queue-keeping programs at the ingress and the egress of
/// bridge port `port` in this thread's namespace; they stay until the
/// port goes. An error when the kernel has no tcx (before 6.6) or refuses.
pub fn keep_queue_here(port: &str) -> io::Result<()> {
    for hook in Hook::BOTH {
        at_hook(BPF_PROG_ATTACH, hook, &load(hook)?, port)?;
    }
    Ok(())
}

/// Whether this kernel takes the queue-keeping programs: each attached to
/// the loopback of this thread's namespace and detached again, so nothing
/// stays.
pub fn kernel_keeps_queues_here() -> bool {
    Hook::BOTH.into_iter().all(|hook| {
        let Ok(prog) = load(hook) else {
            return false;
        };
        at_hook(BPF_PROG_ATTACH, hook, &prog, "lo").is_ok()
            && at_hook(BPF_PROG_DETACH, hook, &prog, "lo").is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where each conditional jump of `p` lands.
    fn jump_targets(p: &[Insn]) -> Vec<usize> {
        p.iter()
            .enumerate()
            .filter(|(_, i)| i.code == 0x55)
            .map(|(at, i)| (at as i64 + 1 + i64::from(i.off)) as usize)
            .collect()
    }

    #[test]
    fn both_programs_let_other_frames_through_untouched() {
        let netgap = i32::from(u16::from_ne_bytes([0x88, 0xb5]));
        for p in [&ingress_program()[..], &egress_program()[..]] {
            assert_eq!(
                (p[0].off, p[1].code, p[1].imm),
                (SKB_PROTOCOL, 0x55, netgap)
            );
            let verdict = p.len() - 2;
            assert_eq!((p[verdict].code, p[verdict].imm), (0xb7, TCX_NEXT));
            for target in jump_targets(p) {
                assert_eq!(target, verdict, "every skip goes to the verdict");
            }
        }
    }

    #[test]
    fn the_ingress_marks_the_queue_under_the_tag() {
        let p = ingress_program();
        assert_eq!(p[2].off, SKB_QUEUE_MAPPING);
        assert_eq!((p[3].code, p[3].imm), (0x47, MARK_TAG));
        assert_eq!((p[4].code, p[4].off), (0x63, SKB_MARK));
    }

    /// A tcx egress's mapping is a recorded receive queue: the program
    /// writes the marked queue plus one, only under the tag, and clears
    /// the mark.
    #[test]
    fn the_egress_sets_the_marked_queue_plus_one_and_clears_the_mark() {
        let p = egress_program();
        assert_eq!((p[2].off, p[4].imm), (SKB_MARK, 16));
        assert_eq!((p[5].code, p[5].imm), (0x55, MARK_TAG >> 16));
        assert_eq!((p[6].code, p[6].imm), (0x57, 0xffff));
        assert_eq!((p[7].code, p[7].imm), (0x07, 1));
        assert_eq!((p[8].code, p[8].off), (0x63, SKB_QUEUE_MAPPING));
        assert_eq!((p[9].imm, p[10].code, p[10].off), (0, 0x63, SKB_MARK));
    }

    #[test]
    fn the_program_names_fit_the_kernels_sixteen_bytes() {
        for hook in Hook::BOTH {
            assert!(hook.program_name().len() < 16, "{hook:?}");
        }
    }
}
