//! The requests between a pio client and an I/O server over one flow: a
//! 16-byte header (operation, length, local offset; little-endian) and,
//! for a write, the bytes; the server answers a read with the bytes and
//! every other request with one status byte. A server that cannot serve a
//! read fails its role, which closes the flow.

/// Waits until every client has arrived at barrier `offset` (0: before the
/// writes; 1: after them, when the server flushes its file).
pub(crate) const OP_BARRIER: u8 = 1;
/// Writes `len` bytes at local `offset`; the bytes follow.
pub(crate) const OP_WRITE: u8 = 2;
/// Reads `len` bytes at local `offset`.
pub(crate) const OP_READ: u8 = 3;
/// Makes the file's data durable (`fdatasync`).
pub(crate) const OP_SYNC: u8 = 4;
/// The client is done; the server's flow ends.
pub(crate) const OP_DONE: u8 = 5;

/// Bytes of a request header.
pub(crate) const HEADER_BYTES: usize = 16;

/// The status byte of a request done.
pub(crate) const STATUS_OK: u8 = 0;
/// The status byte of a request the server refused or failed.
pub(crate) const STATUS_FAILED: u8 = 1;

/// One request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// One of the `OP_*` codes.
    pub op: u8,
    /// Bytes to write or read.
    pub len: u32,
    /// Offset in the server's local file (the barrier's number for
    /// [`OP_BARRIER`]).
    pub offset: u64,
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0] = self.op;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    /// A header from its bytes; the caller range-checks the fields.
    pub(crate) fn decode(b: &[u8; HEADER_BYTES]) -> Header {
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[4..8]);
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&b[8..16]);
        Header {
            op: b[0],
            len: u32::from_le_bytes(len),
            offset: u64::from_le_bytes(offset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let h = Header {
            op: OP_WRITE,
            len: 65536,
            offset: 1 << 40,
        };
        assert_eq!(Header::decode(&h.encode()), h);
    }
}
