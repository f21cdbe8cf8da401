//! Text that came from a file or a peer, made safe to print: a results
//! file's label, a host name, a peer's error message may hold escape
//! sequences that would drive the terminal (move the cursor, retitle the
//! window, hide what follows). Everything such text reaches a terminal or
//! a log through goes through [`escape_control`].

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every control character (C0, DEL and C1, Unicode's `Cc`)
/// written as a Rust escape, `\u{1b}` for ESC; line ends included, so
/// the result is one line. Text without control characters is returned
/// as it is.
pub fn escape_control(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`escape_control`] line by line: the line ends of `text` stay, every
/// other control character (a carriage return included) is escaped. For a
/// table or a report of several lines.
pub fn escape_control_lines(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n') {
        return Cow::Borrowed(text);
    }
    let lines: Vec<Cow<'_, str>> = text.split('\n').map(escape_control).collect();
    Cow::Owned(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escape_control("tcp, MTU 9000 µs"), "tcp, MTU 9000 µs");
        assert!(matches!(escape_control("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape_control("a\u{1b}[2Jb\u{7f}c\u{9b}d\te\nf\rg\0"),
            "a\\u{1b}[2Jb\\u{7f}c\\u{9b}d\\u{9}e\\u{a}f\\u{d}g\\u{0}"
        );
    }

    #[test]
    fn line_by_line_keeps_the_line_ends_only() {
        assert_eq!(escape_control_lines("a\nb\n"), "a\nb\n");
        assert_eq!(
            escape_control_lines("x\u{1b}]0;t\u{7}\ny\r\n"),
            "x\\u{1b}]0;t\\u{7}\ny\\u{d}\n"
        );
    }

    proptest::proptest! {
        #[test]
        fn nothing_escaped_holds_a_control_character(s in ".*") {
            proptest::prop_assert!(!escape_control(&s).chars().any(char::is_control));
            proptest::prop_assert!(!escape_control_lines(&s).chars().any(|c| c.is_control() && c != '\n'));
        }
    }
}
