//! Model-controlled text made safe to show on a terminal: control characters (and the Unicode
//! marks that reorder or hide text) are written out visibly, so a tool call cannot move the
//! cursor, erase a line or pose as something else in the approval prompt or the `[tool]` log.

use std::fmt::Write as _;

/// `text` on one line, every control character escaped: `\n`, `\r`, `\t`, `\\x1b`, `\u{202e}`.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

/// The model's text as it is printed: lines and tabs kept, every other control character
/// (an escape sequence that would hide the approval prompt after it, a carriage return that
/// would write over a line) escaped as [`escape`] does.
pub(super) fn reply_text(text: &str) -> std::borrow::Cow<'_, str> {
    let plain =
        |c: char| matches!(c, '\n' | '\t' | '\r') || !(c.is_control() || hides_or_reorders(c));
    // A carriage return is kept where it ends a line (CRLF), where it writes over nothing.
    let lone_cr = |s: &str| {
        s.match_indices('\r')
            .any(|(i, _)| !s[i + 1..].starts_with('\n'))
    };
    if text.chars().all(plain) && !lone_cr(text) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => out.push(c),
            '\r' if chars.peek() == Some(&'\n') => out.push(c),
            c => push_escaped(&mut out, c),
        }
    }
    std::borrow::Cow::Owned(out)
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x20 || c == '\u{7f}' => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if c.is_control() || hides_or_reorders(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// Bidirectional overrides and isolates, zero-width characters and line separators: printable
/// in name, but they reorder or hide what a reader sees.
fn hides_or_reorders(c: char) -> bool {
    matches!(
        c,
        '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// At most `max` bytes of `text` (cut on a character boundary), escaped, with a note of what
/// was left out.
pub(super) fn bounded(text: &str, max: usize) -> String {
    let (head, rest) = split_at_most(text, max);
    let mut out = escape(head);
    if !rest.is_empty() {
        let _ = write!(out, " … ({} more bytes not shown)", rest.len());
    }
    out
}

/// A multi-line preview for a prompt: each line of `text` escaped and prefixed with `  | `, so
/// none can pose as the prompt itself, at most `max_lines` lines and `max_bytes` bytes.
pub(super) fn preview(text: &str, max_lines: usize, max_bytes: usize) -> String {
    let (head, _) = split_at_most(text, max_bytes);
    let mut out = String::new();
    let mut shown = 0;
    for line in head.split_inclusive('\n').take(max_lines) {
        out.push_str("  | ");
        out.push_str(&escape(line.strip_suffix('\n').unwrap_or(line)));
        out.push('\n');
        shown += line.len();
    }
    let left = text.len() - shown;
    if left > 0 {
        let _ = writeln!(out, "  … ({left} more bytes not shown)");
    }
    out
}

fn split_at_most(text: &str, max: usize) -> (&str, &str) {
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.split_at(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert_eq!(
            escape("touch x #\r\x1b[2K\x1b[1Als\n\t\x07\u{7f}"),
            "touch x #\\r\\x1b[2K\\x1b[1Als\\n\\t\\x07\\x7f"
        );
        assert_eq!(escape("a\u{202e}b\u{9b}c"), "a\\u{202e}b\\u{9b}c");
        assert_eq!(escape("plain, ünïcode → ok"), "plain, ünïcode → ok");
    }

    /// The model's own text keeps its lines and tabs, but nothing that would hide or write
    /// over what follows it (the approval prompt).
    #[test]
    fn reply_text_keeps_lines_and_shows_the_rest() {
        assert!(matches!(
            reply_text("two\nlines\tand ünïcode"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            reply_text("Listing.\x1b[8m\nnext\r\u{202e}"),
            "Listing.\\x1b[8m\nnext\\r\\u{202e}"
        );
        assert!(matches!(
            reply_text("windows\r\nlines\r\n"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(reply_text("a\r\nb\rc"), "a\r\nb\\rc");
    }

    #[test]
    fn bounded_text_says_what_it_left_out() {
        assert_eq!(bounded("abcdef", 10), "abcdef");
        assert_eq!(bounded("abcdef", 4), "abcd … (2 more bytes not shown)");
        assert_eq!(bounded("éé", 3), "é … (2 more bytes not shown)");
    }

    #[test]
    fn previews_prefix_every_line_and_stay_bounded() {
        assert_eq!(
            preview("one\ntwo\x1b[1A\n", 10, 100),
            "  | one\n  | two\\x1b[1A\n"
        );
        let long = "line\n".repeat(1000);
        let shown = preview(&long, 5, 100);
        assert_eq!(shown.lines().count(), 6, "{shown}");
        assert!(
            shown.ends_with("  … (4975 more bytes not shown)\n"),
            "{shown}"
        );
        let one_line = "x".repeat(10_000);
        let shown = preview(&one_line, 5, 100);
        assert!(shown.len() < 200, "{shown}");
        assert!(shown.contains("(9900 more bytes not shown)"), "{shown}");
    }
}
