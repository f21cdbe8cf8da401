//! The XDP program a port attaches to its interface, as eBPF instructions:
//! a frame of netgap's own EtherType ([`ETHERTYPE`]) goes to the AF_XDP
//! socket of the queue it arrived on, every other frame to the kernel's
//! stack (`XDP_PASS`). Plain code: the instructions are built here and
//! loaded by `sys.rs`.
//!
//! libxdp's default program redirects *every* frame of the socket's queue
//! to the socket, so while a port was open the interface's IP traffic
//! (TCP, ARP) went to netgap's demultiplexer, which drops what is not its
//! own: an agent whose control connection shared the interface with its
//! xdp flows heard nothing from its coordinator until the port closed,
//! and the coordinator gave up on it. This program leaves that traffic to
//! the kernel.
//!
//! The program is a few instructions, so it is written here rather than
//! compiled from C: no BPF compiler is needed to build netgap.

use super::reliable::{ETHERTYPE, ETH_HEADER_BYTES};

/// One eBPF instruction (`struct bpf_insn` of linux/bpf.h): the opcode,
/// the destination register in the low four bits of `regs` and the source
/// register in the high four, a signed offset and a signed immediate.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// `XDP_PASS`: the frame goes on to the kernel's stack.
pub(crate) const XDP_PASS: u32 = 2;
/// `XDP_REDIRECT`: the frame goes where a redirect helper said.
#[cfg(test)]
pub(crate) const XDP_REDIRECT: u32 = 4;

// Opcodes: class | size or operation | source, as linux/bpf.h builds them.
/// `BPF_LDX | BPF_MEM | BPF_W`: dst = *(u32 *)(src + off).
const LDX_W: u8 = 0x61;
/// `BPF_LDX | BPF_MEM | BPF_H`: dst = *(u16 *)(src + off).
const LDX_H: u8 = 0x69;
/// `BPF_ALU64 | BPF_MOV | BPF_X`: dst = src.
const MOV_X: u8 = 0xbf;
/// `BPF_ALU64 | BPF_MOV | BPF_K`: dst = imm.
const MOV_K: u8 = 0xb7;
/// `BPF_ALU64 | BPF_ADD | BPF_K`: dst += imm.
const ADD_K: u8 = 0x07;
/// `BPF_JMP | BPF_JGT | BPF_X`: if dst > src (unsigned) jump by off.
const JGT_X: u8 = 0x2d;
/// `BPF_JMP | BPF_JNE | BPF_K`: if dst != imm jump by off.
const JNE_K: u8 = 0x55;
/// `BPF_LD | BPF_DW | BPF_IMM`: a 64-bit immediate over two instructions;
/// with the source register [`PSEUDO_MAP_FD`], the map whose descriptor
/// is the immediate.
const LD_DW_IMM: u8 = 0x18;
/// `BPF_JMP | BPF_CALL`: call helper number imm.
const CALL: u8 = 0x85;
/// `BPF_JMP | BPF_EXIT`: return r0.
const EXIT: u8 = 0x95;
/// `BPF_PSEUDO_MAP_FD`.
const PSEUDO_MAP_FD: u8 = 1;
/// `BPF_FUNC_redirect_map`.
const FUNC_REDIRECT_MAP: i32 = 51;

/// Offsets in `struct xdp_md`, the program's context.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// The EtherType as the program's 16-bit load of the frame's bytes 12 and
/// 13 reads it: in the host's byte order.
fn ethertype_as_loaded() -> i32 {
    i32::from(u16::from_ne_bytes(ETHERTYPE.to_be_bytes()))
}

/// The program, steering netgap's frames to the AF_XDP socket that map
/// `xsks_map_fd` (an `XSKMAP` keyed by queue) holds for the frame's queue,
/// passing the rest to the kernel. A netgap frame on a queue with no
/// socket goes to the kernel too (`bpf_redirect_map`'s fallback action),
/// which has no use for it.
pub(crate) fn program(xsks_map_fd: i32) -> Vec<Insn> {
    let frame_header = i32::try_from(ETH_HEADER_BYTES).unwrap_or(i32::MAX);
    vec![
        // r2 = data, r3 = data_end
        insn(LDX_W, 2, 1, MD_DATA, 0),
        insn(LDX_W, 3, 1, MD_DATA_END, 0),
        // A frame shorter than an Ethernet header is not netgap's.
        insn(MOV_X, 4, 2, 0, 0),
        insn(ADD_K, 4, 0, 0, frame_header),
        insn(JGT_X, 4, 3, PASS_FROM_BOUNDS, 0),
        // r4 = the EtherType
        insn(LDX_H, 4, 2, 12, 0),
        insn(JNE_K, 4, 0, PASS_FROM_ETHERTYPE, ethertype_as_loaded()),
        // return bpf_redirect_map(xsks_map, rx_queue_index, XDP_PASS)
        insn(LDX_W, 2, 1, MD_RX_QUEUE_INDEX, 0),
        insn(LD_DW_IMM, 1, PSEUDO_MAP_FD, 0, xsks_map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV_K, 3, 0, 0, XDP_PASS as i32),
        insn(CALL, 0, 0, 0, FUNC_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
        // PASS_AT: return XDP_PASS
        insn(MOV_K, 0, 0, 0, XDP_PASS as i32),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// Index of the instruction that returns `XDP_PASS`.
const PASS_AT: i16 = 13;
/// Jump offsets are counted from the instruction after the jump.
const PASS_FROM_BOUNDS: i16 = PASS_AT - 5;
const PASS_FROM_ETHERTYPE: i16 = PASS_AT - 7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jumps_land_on_the_pass_verdict() {
        let p = program(7);
        assert_eq!(p.len(), 15);
        assert_eq!(p[usize::from(PASS_AT as u16)], insn(MOV_K, 0, 0, 0, 2));
        for (at, code) in [(4usize, JGT_X), (6, JNE_K)] {
            assert_eq!(p[at].code, code);
            let target = at as i16 + 1 + p[at].off;
            assert_eq!(target, PASS_AT, "the jump at {at}");
        }
        // Every path ends in an exit: the redirect's and the pass's.
        assert_eq!(p[12].code, EXIT);
        assert_eq!(p[14].code, EXIT);
    }

    #[test]
    fn the_program_compares_the_ethertype_as_a_frame_carries_it() {
        let p = program(7);
        let frame_bytes = ETHERTYPE.to_be_bytes();
        let loaded = u16::from_ne_bytes(frame_bytes);
        assert_eq!(p[6].imm, i32::from(loaded));
        assert_eq!(p[5].off, 12, "the EtherType follows the two MACs");
        assert_eq!(p[3].imm, 14);
    }

    #[test]
    fn the_map_is_named_by_its_descriptor_in_a_wide_load() {
        let p = program(42);
        assert_eq!(p[8].code, LD_DW_IMM);
        assert_eq!(p[8].regs, (PSEUDO_MAP_FD << 4) | 1, "r1 = map");
        assert_eq!(p[8].imm, 42);
        assert_eq!(p[9], insn(0, 0, 0, 0, 0));
        assert_eq!(p[11].imm, FUNC_REDIRECT_MAP);
        assert_eq!(p[10].imm, XDP_PASS as i32, "the fallback action");
    }
}
