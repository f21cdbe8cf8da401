//! A switch that keeps a netgap frame's queue: a program at the ingress of
//! each bridge port that records the queue the frame arrived on as its
//! receive queue, so the port toward the other host sends it on that same
//! queue, and the other host's XDP program sees it there. Plain
//! instructions and two `bpf` system calls: no libbpf, no tc modules, so
//! the testbed (which builds without the `xdp` feature) attaches it too.
//!
//! Why it is needed (measured on Linux 6.18, four-queue veths through a
//! bridge, an AF_XDP socket sending on queue q of one host and the other
//! host's native XDP reading `rx_queue_index`): without it q 1, 2, 3
//! arrived on 0, 1, 2, and q 0 on a queue of the flow hash. A veth passes
//! the sender's queue on as the frame's queue mapping; the bridge's port
//! picks its transmit queue by taking that mapping for a recorded receive
//! queue, which the kernel stores plus one, so every bridge loses one, and
//! 0 (nothing recorded) falls to the hash. With the program every queue
//! arrives as sent (`tests::a_frame_keeps_its_queue_across_a_switch` in
//! `sys/mod.rs`). The last hop needs the receiver's program at the driver's
//! hook (native XDP, which veth has): the generic hook reads the recorded
//! queue, one less. Only netgap's EtherType is touched: every other frame
//! crosses the switch as before.
//!
//! The program is attached with `BPF_PROG_ATTACH` (tcx ingress), not a
//! link, so it stays on the port after the attaching process exits, until
//! the port goes with its namespace.

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
const SKB_QUEUE_MAPPING: i16 = 12;
const SKB_PROTOCOL: i16 = 16;
/// `TCX_NEXT`: the frame goes on to whatever else the port runs.
const TCX_NEXT: i32 = -1;

/// The program: for a netgap frame, queue mapping = queue mapping + 1
/// (the sender's queue recorded as the frame's receive queue).
fn program() -> [Insn; 7] {
    let proto = i32::from(u16::from_ne_bytes(ETHERTYPE.to_be_bytes()));
    [
        // r2 = skb->protocol (network order, as loaded)
        insn(0x61, 2, 1, SKB_PROTOCOL, 0),
        // if r2 != netgap's EtherType: skip three
        insn(0x55, 2, 0, 3, proto),
        // skb->queue_mapping += 1
        insn(0x61, 2, 1, SKB_QUEUE_MAPPING, 0),
        insn(0x07, 2, 0, 0, 1),
        insn(0x63, 1, 2, SKB_QUEUE_MAPPING, 0),
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

/// The queue-keeping program, loaded.
fn load() -> io::Result<OwnedFd> {
    let insns = program();
    let mut name = [0u8; 16];
    name[..12].copy_from_slice(b"netgap_queue");
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

/// `BPF_PROG_ATTACH` or `BPF_PROG_DETACH` of `prog` at the tcx ingress of
/// interface `ifname` in this thread's namespace.
fn at_ingress(cmd: libc::c_long, prog: &OwnedFd, ifname: &str) -> io::Result<()> {
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
        attach_type: BPF_TCX_INGRESS,
        ..AttachAttr::default()
    };
    bpf(cmd, &mut attr)?;
    Ok(())
}

/// Attaches the queue-keeping program at the ingress of bridge port
/// `port` in this thread's namespace; it stays until the port goes. An
/// error when the kernel has no tcx (before 6.6) or refuses.
pub fn keep_queue_here(port: &str) -> io::Result<()> {
    at_ingress(BPF_PROG_ATTACH, &load()?, port)
}

/// Whether this kernel takes the queue-keeping program: attached to the
/// loopback of this thread's namespace and detached again, so nothing
/// stays.
pub fn kernel_keeps_queues_here() -> bool {
    let Ok(prog) = load() else {
        return false;
    };
    at_ingress(BPF_PROG_ATTACH, &prog, "lo").is_ok()
        && at_ingress(BPF_PROG_DETACH, &prog, "lo").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_skips_to_the_verdict_for_other_frames() {
        let p = program();
        assert_eq!(p[1].code, 0x55);
        let target = 1 + 1 + usize::from(p[1].off as u16);
        assert_eq!(p[target].imm, TCX_NEXT, "a frame of another EtherType");
        assert_eq!(p[1].imm, i32::from(u16::from_ne_bytes([0x88, 0xb5])));
        assert_eq!((p[2].off, p[4].off), (SKB_QUEUE_MAPPING, SKB_QUEUE_MAPPING));
    }
}
