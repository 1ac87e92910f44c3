//! Pieces shared by both API shapes: what a generated reply is rendered from, how text is
//! split into deltas, and SSE framing.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::Value;

use super::script::Reply;

/// Everything a generated body depends on.
pub(crate) struct Render<'a> {
    /// The response number, also used in ids.
    pub id: u64,
    /// The model the response names.
    pub model: &'a str,
    pub reply: &'a Reply,
}

/// At most this many deltas per text, so streams look like real ones without growing long.
const MAX_PIECES: usize = 3;

/// Splits `text` into up to three non-empty pieces of about equal length on char boundaries;
/// an empty text is one empty piece, so every block still gets a delta.
pub(crate) fn split_pieces(text: &str) -> Vec<&str> {
    let chars = text.chars().count();
    if chars == 0 {
        return vec![""];
    }
    let pieces = chars.min(MAX_PIECES);
    let per_piece = chars.div_ceil(pieces);
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    for (n, (offset, _)) in text.char_indices().enumerate() {
        if n > 0 && n % per_piece == 0 {
            out.push(&text[start..offset]);
            start = offset;
        }
    }
    out.push(&text[start..]);
    out
}

/// One SSE event with an `event:` line (Anthropic) or without (OpenAI).
pub(crate) fn sse(event: Option<&str>, data: &Value) -> Bytes {
    let data = data.to_string();
    let text = match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    };
    Bytes::from(text)
}

pub(crate) fn json_bytes(value: &Value) -> Bytes {
    Bytes::from(value.to_string())
}

/// Seconds since the epoch, for OpenAI's `created`.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn split_examples() {
        assert_eq!(split_pieces(""), vec![""]);
        assert_eq!(split_pieces("a"), vec!["a"]);
        assert_eq!(split_pieces("ab"), vec!["a", "b"]);
        assert_eq!(split_pieces("Hello world"), vec!["Hell", "o wo", "rld"]);
        assert_eq!(split_pieces("héllo"), vec!["hé", "ll", "o"]);
    }

    proptest! {
        #[test]
        fn split_rejoins_to_the_text(text in "\\PC*") {
            let pieces = split_pieces(&text);
            prop_assert_eq!(pieces.concat(), text.clone());
            prop_assert!(!pieces.is_empty() && pieces.len() <= MAX_PIECES);
            if !text.is_empty() {
                prop_assert!(pieces.iter().all(|p| !p.is_empty()));
            }
        }
    }
}
