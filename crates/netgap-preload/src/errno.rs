//! The calling thread's `errno`: read, set, and its type, for every file
//! that answers the program the way the C library would.

use libc::c_int;

/// An `errno` value.
pub(crate) type Errno = c_int;

/// The calling thread's `errno`.
pub(crate) fn errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}
