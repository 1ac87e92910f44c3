//! An upstream event (or a line that never ends) larger than `max_event_bytes` is a broken
//! stream (SPEC §14): before the commit point it is retried, after it the caller gets an error
//! event at once — legate never buffers it, and never waits for it to end.

use std::time::{Duration, Instant};

use crate::harness::{self, Env};
use crate::rawup::{self, Action};

const STREAM: &str = r#"{"model":"claude-r","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// 2 MiB of a `data:` line without an end, against a 1 MiB limit.
fn endless_line() -> Vec<u8> {
    let mut v = b"data: ".to_vec();
    v.extend(std::iter::repeat_n(b'x', 2 << 20));
    v
}

/// legate with a 1 MiB event limit in front of `url`, `extra` config added.
async fn legate_against(url: &str, extra: &str) -> Env {
    let toml = harness::config_toml_with(url, "max_event_bytes = 1048576\n", "", extra);
    harness::start_alone(&toml).await
}

/// A stream that carried `partial` and then ended with the error event naming the limit,
/// nothing of the oversized event relayed.
fn cut_at_the_limit(text: &str) {
    assert!(text.contains("partial"), "{text}");
    assert!(
        text.contains("event: error") && text.contains("max_event_bytes"),
        "{text}"
    );
    assert!(!text.contains("xxxx"));
}

#[tokio::test]
async fn an_oversized_event_before_content_is_retried_and_the_caller_sees_one_clean_stream() {
    let up = rawup::start(|req| async move {
        if req.conn == 0 {
            let mut bytes = rawup::sse_head();
            bytes.extend_from_slice(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
            bytes.extend(endless_line());
            Action::ReplyAndHang(bytes)
        } else {
            let mut bytes = rawup::sse_head();
            bytes.extend_from_slice(rawup::anthropic_stream("fine").as_bytes());
            Action::ReplyAndClose(bytes)
        }
    })
    .await;
    let env = legate_against(&up.url, "").await;
    let started = Instant::now();
    let resp = env.messages(STREAM).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("fine") && text.contains("message_stop"),
        "{text}"
    );
    assert!(!text.contains("xxxx") && !text.contains("event: error"));
    // Not the 5 s idle timeout: the oversized event itself broke the first attempt.
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_oversized_event_after_content_ends_the_stream_with_an_error_at_once() {
    let up = rawup::start(|_req| async move {
        let full = rawup::anthropic_stream("partial");
        // Everything up to the content delta, then a line that never ends.
        let cut = full.find("event: content_block_stop").unwrap();
        let mut bytes = rawup::sse_head();
        bytes.extend_from_slice(&full.as_bytes()[..cut]);
        bytes.extend(endless_line());
        Action::ReplyAndHang(bytes)
    })
    .await;
    let env = legate_against(&up.url, "").await;
    let started = Instant::now();
    let resp = env.messages(STREAM).await;
    assert_eq!(resp.status(), 200);
    cut_at_the_limit(&resp.text().await.unwrap());
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The same on a translated stream: its error event says what happened. It said "the upstream
/// stream ended before its final event", as for a cut.
#[tokio::test]
async fn an_oversized_event_on_a_translated_stream_is_named_as_one() {
    let up = rawup::start(|_req| async move {
        let mut bytes = rawup::sse_head();
        bytes.extend_from_slice(
            rawup::chat_chunk(r#"{"role":"assistant","content":"partial"}"#, "null").as_bytes(),
        );
        bytes.extend(endless_line());
        Action::ReplyAndHang(bytes)
    })
    .await;
    let chain = "[[models]]\nname = \"via-openai\"\nchain = [\"openai:gpt-backend\"]\n";
    let env = legate_against(&up.url, chain).await;
    let resp = env
        .messages(r#"{"model":"via-openai","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    cut_at_the_limit(&resp.text().await.unwrap());
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// What an upstream sends after its final event is not the caller's: the start of a line
/// longer than `max_event_bytes` right behind the final event, in the same read, neither
/// turns the whole answer into a failure (an error event after `message_stop`, or a retry that
/// made the call again) nor, on a translated stream, loses the final event.
#[tokio::test]
async fn an_oversized_line_after_the_final_event_takes_nothing_from_the_answer() {
    for translated in [false, true] {
        let up = rawup::start(move |_req| async move {
            let mut bytes = rawup::sse_head();
            if translated {
                bytes.extend_from_slice(rawup::chat_stream_hi().as_bytes());
            } else {
                bytes.extend_from_slice(rawup::anthropic_stream("whole").as_bytes());
            }
            // A comment line of 3,000 bytes against a limit of 1,024, in the same write.
            bytes.extend_from_slice(b": ");
            bytes.extend(std::iter::repeat_n(b'x', 3000));
            Action::ReplyAndHang(bytes)
        })
        .await;
        let chain = "[[models]]\nname = \"via-openai\"\nchain = [\"openai:gpt-backend\"]\n";
        let toml = harness::config_toml_with(&up.url, "max_event_bytes = 1024\n", "", chain);
        let env = harness::start_alone(&toml).await;
        let model = if translated { "via-openai" } else { "claude-r" };
        let body = STREAM.replace("claude-r", model);
        let resp = env.messages(body).await;
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        assert!(text.contains("event: message_stop"), "{translated}: {text}");
        assert!(!text.contains("event: error"), "{translated}: {text}");
        assert!(!text.contains("xxxx"));
        assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
