//! Bytes from the kernel's random source, for nonces, tokens and initial
//! sequence numbers: the one place netgap calls `getrandom`.

use std::io;

/// Fills `buf` from the kernel's random source, retrying when a signal
/// interrupts the call.
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: the pointer and length describe the writable slice `rest`.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += got.cast_unsigned();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_fills_differ() {
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        assert!(fill_random(&mut a).is_ok());
        assert!(fill_random(&mut b).is_ok());
        assert_ne!(a, b);
    }
}
