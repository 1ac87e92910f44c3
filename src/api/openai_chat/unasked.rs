//! Usage for a stream whose caller did not ask for it (SPEC §6): the upstream request gets
//! `stream_options.include_usage: true` spliced in, and what that adds to the stream is taken
//! out again before the caller sees it — the usage-only chunk (`choices: []`) and the
//! `"usage": null` member that every other chunk then carries — so the caller's bytes are the
//! ones the provider would have sent without it.

use crate::splice;

/// The request body asking for the usage chunk, every other byte as the caller sent it; None
/// when the body cannot be edited (it is then sent as it is, and the stream is not edited).
pub(crate) fn ask_for_usage(body: &[u8]) -> Option<Vec<u8>> {
    const OPTIONS: &str = r#"{"include_usage":true}"#;
    let Some(span) = splice::top_level_value_span(body, "stream_options") else {
        return splice::insert_top_level(body, "stream_options", OPTIONS);
    };
    let options = &body[span];
    let edited = if options == b"null" {
        OPTIONS.as_bytes().to_vec()
    } else {
        splice::replace_top_level(options, "include_usage", "true")
            .or_else(|| splice::insert_top_level(options, "include_usage", "true"))?
    };
    splice::replace_top_level(body, "stream_options", std::str::from_utf8(&edited).ok()?)
}

/// How one chunk's data changes for a caller that did not ask for usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChunkEdit {
    /// The usage-only chunk: it goes.
    Drop,
    /// The chunk without its top-level `usage` member.
    Rewrite(String),
}

/// The edit a chunk needs, if any: chunks without a top-level `usage` stay as they are.
pub(crate) fn edit_chunk(data: &str) -> Option<ChunkEdit> {
    let bytes = data.as_bytes();
    let usage = splice::top_level_value_span(bytes, "usage")?;
    let choices = splice::top_level_value_span(bytes, "choices");
    let no_choices = choices.is_some_and(|c| {
        let inner = &bytes[c.start + 1..c.end.saturating_sub(1)];
        bytes[c.start] == b'[' && inner.iter().all(u8::is_ascii_whitespace)
    });
    if no_choices && &bytes[usage] != b"null" {
        return Some(ChunkEdit::Drop);
    }
    let rest = splice::remove_top_level(bytes, "usage")?;
    String::from_utf8(rest).ok().map(ChunkEdit::Rewrite)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(body: &str) -> Option<String> {
        ask_for_usage(body.as_bytes()).map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    #[test]
    fn the_request_asks_for_usage_with_every_other_byte_kept() {
        assert_eq!(
            ask(r#"{"model":"m", "stream":true,"messages":[]}"#).as_deref(),
            Some(
                r#"{"model":"m", "stream":true,"messages":[],"stream_options":{"include_usage":true}}"#
            )
        );
        assert_eq!(
            ask(r#"{"stream_options": null,"stream":true}"#).as_deref(),
            Some(r#"{"stream_options": {"include_usage":true},"stream":true}"#)
        );
        assert_eq!(
            ask(r#"{"stream_options":{ "include_usage" : false },"stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{ "include_usage" : true },"stream":true}"#)
        );
        assert_eq!(
            ask(r#"{"stream_options":{"include_obfuscation":false}}"#).as_deref(),
            Some(r#"{"stream_options":{"include_obfuscation":false,"include_usage":true}}"#)
        );
        assert_eq!(
            ask(r#"{"stream_options":{}}"#).as_deref(),
            Some(r#"{"stream_options":{"include_usage":true}}"#)
        );
        assert_eq!(ask(r#"{"stream":true"#), None);
    }

    #[test]
    fn the_usage_chunk_goes_and_null_usage_members_are_removed() {
        let usage_only = r#"{"id":"c","choices":[ ],"usage":{"prompt_tokens":9}}"#;
        assert_eq!(edit_chunk(usage_only), Some(ChunkEdit::Drop));
        let content = r#"{"id":"c","choices":[{"index":0,"delta":{"content":"usage"}}],"usage":null,"obfuscation":"x"}"#;
        assert_eq!(
            edit_chunk(content),
            Some(ChunkEdit::Rewrite(
                r#"{"id":"c","choices":[{"index":0,"delta":{"content":"usage"}}],"obfuscation":"x"}"#
                    .to_owned()
            ))
        );
        assert_eq!(edit_chunk(r#"{"id":"c","choices":[]}"#), None);
        assert_eq!(edit_chunk("[DONE]"), None);
        assert_eq!(
            edit_chunk(r#"{"choices":[],"usage":null}"#),
            Some(ChunkEdit::Rewrite(r#"{"choices":[]}"#.to_owned()))
        );
    }
}
