//! The XDP program a port attaches to its interface, as eBPF instructions:
//! a frame of netgap's own EtherType ([`ETHERTYPE`]) goes to the AF_XDP
//! socket of the queue it arrived on, every other frame to the kernel's
//! stack (`XDP_PASS`). Plain code: the instructions are built here and
//! loaded by `sys/steering.rs`.
//!
//! libxdp's default program redirects *every* frame of the socket's queue
//! to the socket, so while a port was open the interface's IP traffic
//! (TCP, ARP) went to netgap's demultiplexer, which drops what is not its
//! own: an agent whose control connection shared the interface with its
//! xdp flows heard nothing from its coordinator until the port closed,
//! and the coordinator gave up on it. This program leaves that traffic to
//! the kernel.
//!
//! Queue 0 is the port of the process that attached the program (the
//! relay's, or a transport's own): every netgap frame arriving on it goes
//! to its socket, as it always has. Any other queue `q` carries one
//! connection of one process, whose socket sits at `q` of the `XSKMAP`
//! (a program's own socket, handed over by the relay, `handover.rs`): a
//! frame on `q` goes to it only if it belongs to the connection registered
//! for `q` in the connection map (a hash map from queue to [`ConnId`]: the
//! peer's MAC, the frame's source, and this end's flow id, the frame's
//! destination flow), so one process never reads another's frames. A
//! frame on such a queue that is not the registered connection's (or one
//! too short to tell) is dropped and counted in the drop counter, a
//! per-CPU array of one `u64` the relay reads ([`DROPS_KEY`]).
//!
//! Queues and hops: an XDP program can redirect a frame only to a socket
//! bound to the queue it arrived on, so a connection's frames must arrive
//! on its queue at both hosts. On a veth, the receiving end's queue is the
//! queue the sender transmitted on (an AF_XDP socket's copy-mode transmit
//! sends on the socket's own queue), but a frame that crosses a bridge
//! leaves the bridge's port on whatever queue the kernel picks there; see
//! ARCHITECTURE.md ("xdp queues across a switch") for what the testbed does
//! about it.
//!
//! The program is a few dozen instructions, so it is written here rather
//! than compiled from C: no BPF compiler is needed to build netgap.

use super::reliable::{Mac, ETHERTYPE, ETH_HEADER_BYTES};

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

/// `XDP_DROP`: the frame is dropped.
pub(crate) const XDP_DROP: u32 = 1;
/// `XDP_PASS`: the frame goes on to the kernel's stack.
pub(crate) const XDP_PASS: u32 = 2;
/// `XDP_REDIRECT`: the frame goes where a redirect helper said.
#[cfg(test)]
pub(crate) const XDP_REDIRECT: u32 = 4;

/// The key of the drop counter's one entry.
pub(crate) const DROPS_KEY: u32 = 0;

/// Bytes of a frame the program reads: up to the destination flow id of
/// netgap's header (its bytes 4 and 5).
const IDENTITY_BYTES: i32 = ETH_HEADER_BYTES as i32 + 6;
/// Where in a frame the destination flow id is.
const DST_FLOW_AT: i16 = ETH_HEADER_BYTES as i16 + 4;

/// What identifies a connection's frames arriving at this end: the peer's
/// MAC (the frames' source) and this end's flow id (their destination
/// flow). Eight bytes in the connection map, laid out as the frame carries
/// them, so the program compares them load for load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnId {
    /// The peer's MAC.
    pub peer_mac: Mac,
    /// This end's flow id.
    pub local_flow: u16,
}

impl ConnId {
    /// The map value: the MAC's six bytes, then the flow id big-endian.
    pub(crate) fn to_value(self) -> [u8; 8] {
        let mut v = [0u8; 8];
        v[..6].copy_from_slice(&self.peer_mac);
        v[6..].copy_from_slice(&self.local_flow.to_be_bytes());
        v
    }
}

// Opcodes: class | size or operation | source, as linux/bpf.h builds them.
/// `BPF_LDX | BPF_MEM | BPF_W`: dst = *(u32 *)(src + off).
const LDX_W: u8 = 0x61;
/// `BPF_LDX | BPF_MEM | BPF_H`: dst = *(u16 *)(src + off).
const LDX_H: u8 = 0x69;
/// `BPF_LDX | BPF_MEM | BPF_DW`: dst = *(u64 *)(src + off).
const LDX_DW: u8 = 0x79;
/// `BPF_STX | BPF_MEM | BPF_W`: *(u32 *)(dst + off) = src.
const STX_W: u8 = 0x63;
/// `BPF_STX | BPF_MEM | BPF_DW`: *(u64 *)(dst + off) = src.
const STX_DW: u8 = 0x7b;
/// `BPF_ST | BPF_MEM | BPF_W`: *(u32 *)(dst + off) = imm.
const ST_W: u8 = 0x62;
/// `BPF_ALU64 | BPF_MOV | BPF_X`: dst = src.
const MOV_X: u8 = 0xbf;
/// `BPF_ALU64 | BPF_MOV | BPF_K`: dst = imm.
const MOV_K: u8 = 0xb7;
/// `BPF_ALU64 | BPF_ADD | BPF_K`: dst += imm.
const ADD_K: u8 = 0x07;
/// `BPF_JMP | BPF_JGT | BPF_X`: if dst > src (unsigned) jump by off.
const JGT_X: u8 = 0x2d;
/// `BPF_JMP | BPF_JEQ | BPF_K`: if dst == imm jump by off.
const JEQ_K: u8 = 0x15;
/// `BPF_JMP | BPF_JNE | BPF_K`: if dst != imm jump by off.
const JNE_K: u8 = 0x55;
/// `BPF_JMP | BPF_JNE | BPF_X`: if dst != src jump by off.
const JNE_X: u8 = 0x5d;
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
/// `BPF_FUNC_map_lookup_elem`.
const FUNC_MAP_LOOKUP: i32 = 1;
/// `BPF_FUNC_redirect_map`.
const FUNC_REDIRECT_MAP: i32 = 51;

/// Offsets in `struct xdp_md`, the program's context.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;

/// Where the stack slot of a map key is (below the frame pointer, r10).
const KEY_SLOT: i16 = -4;

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

/// The places a jump can go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Redirect,
    Drop,
    DropVerdict,
    Pass,
}

/// Instructions with jumps to labels, resolved once the program is whole.
#[derive(Default)]
struct Asm {
    insns: Vec<Insn>,
    jumps: Vec<(usize, Label)>,
    labels: Vec<(Label, usize)>,
}

impl Asm {
    fn op(&mut self, i: Insn) {
        self.insns.push(i);
    }

    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.insns.push(insn(code, dst, src, 0, imm));
    }

    fn label(&mut self, l: Label) {
        self.labels.push((l, self.insns.len()));
    }

    /// `dst = map` (the two-instruction load of a map's descriptor).
    fn map(&mut self, dst: u8, map_fd: i32) {
        self.op(insn(LD_DW_IMM, dst, PSEUDO_MAP_FD, 0, map_fd));
        self.op(insn(0, 0, 0, 0, 0));
    }

    /// `r2 = the address of the key slot`, the slot holding `src`.
    fn key_from(&mut self, src: u8) {
        self.op(insn(STX_W, 10, src, KEY_SLOT, 0));
        self.op(insn(MOV_X, 2, 10, 0, 0));
        self.op(insn(ADD_K, 2, 0, 0, i32::from(KEY_SLOT)));
    }

    fn finish(mut self) -> Vec<Insn> {
        for &(at, to) in &self.jumps {
            let target = self
                .labels
                .iter()
                .find(|(l, _)| *l == to)
                .map_or(at + 1, |&(_, i)| i);
            // Jump offsets count from the instruction after the jump; a
            // program of a few dozen instructions fits an i16.
            self.insns[at].off = (target as i64 - at as i64 - 1) as i16;
        }
        self.insns
    }
}

/// The maps the program uses, by descriptor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Maps {
    /// The `XSKMAP`, keyed by queue.
    pub xsks: i32,
    /// The connection map: a hash from queue (`u32`) to a [`ConnId`]'s
    /// eight bytes.
    pub conns: i32,
    /// The drop counter: a per-CPU array of one `u64`.
    pub drops: i32,
}

/// The program: netgap's frames on queue 0 to the socket at 0 of the
/// `XSKMAP`; on any other queue to the socket of that queue if the frame
/// belongs to the connection registered for it, else dropped and counted;
/// every other frame passed to the kernel. A netgap frame for a queue
/// with no socket goes to the kernel too (`bpf_redirect_map`'s fallback
/// action), which has no use for it.
pub(crate) fn program(maps: Maps) -> Vec<Insn> {
    let mut a = Asm::default();
    // r2 = data, r3 = data_end
    a.op(insn(LDX_W, 2, 1, MD_DATA, 0));
    a.op(insn(LDX_W, 3, 1, MD_DATA_END, 0));
    // A frame shorter than an Ethernet header is not netgap's.
    a.op(insn(MOV_X, 4, 2, 0, 0));
    a.op(insn(ADD_K, 4, 0, 0, ETH_HEADER_BYTES as i32));
    a.jump(JGT_X, 4, 3, 0, Label::Pass);
    // r4 = the EtherType
    a.op(insn(LDX_H, 4, 2, 12, 0));
    a.jump(JNE_K, 4, 0, ethertype_as_loaded(), Label::Pass);
    // r6 = the queue; queue 0 takes every netgap frame.
    a.op(insn(LDX_W, 6, 1, MD_RX_QUEUE_INDEX, 0));
    a.jump(JEQ_K, 6, 0, 0, Label::Redirect);
    // Another queue's frame must be long enough to name its connection.
    a.op(insn(MOV_X, 4, 2, 0, 0));
    a.op(insn(ADD_K, 4, 0, 0, IDENTITY_BYTES));
    a.jump(JGT_X, 4, 3, 0, Label::Drop);
    // r7, r8 = the source MAC; r9 = the destination flow id (callee-saved
    // registers, kept across the lookup).
    a.op(insn(LDX_W, 7, 2, 6, 0));
    a.op(insn(LDX_H, 8, 2, 10, 0));
    a.op(insn(LDX_H, 9, 2, DST_FLOW_AT, 0));
    // r0 = conns[queue]
    a.key_from(6);
    a.map(1, maps.conns);
    a.op(insn(CALL, 0, 0, 0, FUNC_MAP_LOOKUP));
    a.jump(JEQ_K, 0, 0, 0, Label::Drop);
    for (off, reg, code) in [(0, 7, LDX_W), (4, 8, LDX_H), (6, 9, LDX_H)] {
        a.op(insn(code, 1, 0, off, 0));
        a.jump(JNE_X, 1, reg, 0, Label::Drop);
    }
    // return bpf_redirect_map(xsks, queue, XDP_PASS)
    a.label(Label::Redirect);
    a.op(insn(MOV_X, 2, 6, 0, 0));
    a.map(1, maps.xsks);
    a.op(insn(MOV_K, 3, 0, 0, XDP_PASS as i32));
    a.op(insn(CALL, 0, 0, 0, FUNC_REDIRECT_MAP));
    a.op(insn(EXIT, 0, 0, 0, 0));
    // drops[0] += 1 (this CPU's own slot: no atomic needed); XDP_DROP
    a.label(Label::Drop);
    a.op(insn(ST_W, 10, 0, KEY_SLOT, DROPS_KEY as i32));
    a.op(insn(MOV_X, 2, 10, 0, 0));
    a.op(insn(ADD_K, 2, 0, 0, i32::from(KEY_SLOT)));
    a.map(1, maps.drops);
    a.op(insn(CALL, 0, 0, 0, FUNC_MAP_LOOKUP));
    a.jump(JEQ_K, 0, 0, 0, Label::DropVerdict);
    a.op(insn(LDX_DW, 1, 0, 0, 0));
    a.op(insn(ADD_K, 1, 0, 0, 1));
    a.op(insn(STX_DW, 0, 1, 0, 0));
    a.label(Label::DropVerdict);
    a.op(insn(MOV_K, 0, 0, 0, XDP_DROP as i32));
    a.op(insn(EXIT, 0, 0, 0, 0));
    // return XDP_PASS
    a.label(Label::Pass);
    a.op(insn(MOV_K, 0, 0, 0, XDP_PASS as i32));
    a.op(insn(EXIT, 0, 0, 0, 0));
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: Maps = Maps {
        xsks: 41,
        conns: 42,
        drops: 43,
    };

    /// Where each jump of `p` lands.
    fn targets(p: &[Insn]) -> Vec<(usize, usize)> {
        p.iter()
            .enumerate()
            .filter(|(_, i)| matches!(i.code, JGT_X | JEQ_K | JNE_K | JNE_X))
            .map(|(at, i)| (at, (at as i64 + 1 + i64::from(i.off)) as usize))
            .collect()
    }

    #[test]
    fn every_jump_lands_inside_the_program_and_every_path_exits() {
        let p = program(MAPS);
        for (at, to) in targets(&p) {
            assert!(to > at && to < p.len(), "the jump at {at} to {to}");
        }
        assert_eq!(p.last().map(|i| i.code), Some(EXIT));
        let pass = p.len() - 2;
        assert_eq!(p[pass], insn(MOV_K, 0, 0, 0, XDP_PASS as i32));
        // The two checks before the EtherType is known pass the frame.
        let t = targets(&p);
        assert_eq!(t[0].1, pass, "a short frame");
        assert_eq!(t[1].1, pass, "another EtherType");
    }

    #[test]
    fn the_program_compares_the_ethertype_as_a_frame_carries_it() {
        let p = program(MAPS);
        let loaded = u16::from_ne_bytes(ETHERTYPE.to_be_bytes());
        assert_eq!(p[6].imm, i32::from(loaded));
        assert_eq!(p[5].off, 12, "the EtherType follows the two MACs");
        assert_eq!(p[3].imm, 14);
    }

    #[test]
    fn each_map_is_named_by_its_descriptor_in_a_wide_load() {
        let p = program(MAPS);
        let loads: Vec<i32> = p
            .iter()
            .filter(|i| i.code == LD_DW_IMM)
            .map(|i| {
                assert_eq!(i.regs, (PSEUDO_MAP_FD << 4) | 1, "r1 = map");
                i.imm
            })
            .collect();
        assert_eq!(loads, [42, 41, 43], "connections, sockets, drops");
        let redirect = p
            .iter()
            .position(|i| i.code == CALL && i.imm == FUNC_REDIRECT_MAP)
            .unwrap_or(0);
        assert_eq!(p[redirect - 1].imm, XDP_PASS as i32, "the fallback action");
    }

    #[test]
    fn a_connection_is_compared_as_its_frames_carry_it() {
        let id = ConnId {
            peer_mac: [2, 0xab, 0, 0x10, 0xff, 1],
            local_flow: 0x1234,
        };
        let mut frame = [0u8; 20];
        frame[6..12].copy_from_slice(&id.peer_mac);
        frame[18..20].copy_from_slice(&id.local_flow.to_be_bytes());
        let v = id.to_value();
        assert_eq!(v[..6], frame[6..12]);
        assert_eq!(v[6..], frame[usize::from(DST_FLOW_AT as u16)..20]);
    }
}
