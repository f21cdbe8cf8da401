//! The message buffers the tests and workloads send from and receive into.

/// A message buffer of `size_bytes` filled with a fixed pattern, so its
/// pages are touched before timing starts.
pub fn message_buffer(size_bytes: usize) -> Vec<u8> {
    (0..size_bytes).map(|i| (i % 251) as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_has_the_size_asked_and_the_pattern() {
        let b = message_buffer(300);
        assert_eq!(b.len(), 300);
        assert_eq!((b[0], b[250], b[251]), (0, 250, 0));
    }
}
