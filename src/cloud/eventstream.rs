//! Bedrock's binary event stream (`application/vnd.amazon.eventstream`) turned into ordinary
//! Anthropic SSE, event by event, with the official `aws-smithy-eventstream` frame decoder.
//!
//! A `chunk` event carries `{"bytes": base64(Anthropic stream event JSON)}` and becomes that
//! event. An exception becomes an Anthropic `error` event whose type carries the exception's
//! retry meaning (throttling → `rate_limit_error`, unavailable → `overloaded_error`, a bad
//! request → `invalid_request_error`), so that before the commit point it is judged like the
//! matching status and after it reaches the caller as any mid-stream error does. A frame that
//! fails its checksum ends the stream with an `api_error` event.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::upstream::{BodyError, ResponseBody};
use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder, write_message_to};
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// A frame's bytes besides its event's base64: the prelude, the headers, the JSON wrapper
/// and the checksums (a few hundred in Bedrock's; a generous bound).
const FRAME_OVERHEAD: usize = 16 << 10;

/// The content type of Bedrock's streaming answer.
pub const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// The Anthropic error type and HTTP status an exception stands for.
pub fn exception_meaning(exception: &str) -> (&'static str, u16) {
    match exception {
        "throttlingException" | "ThrottlingException" => ("rate_limit_error", 429),
        "serviceUnavailableException" | "ServiceUnavailableException" => ("overloaded_error", 529),
        "validationException" | "ValidationException" => ("invalid_request_error", 400),
        "modelTimeoutException" | "ModelTimeoutException" => ("timeout_error", 504),
        "accessDeniedException" | "AccessDeniedException" => ("permission_error", 403),
        "resourceNotFoundException" | "ResourceNotFoundException" => ("not_found_error", 404),
        // internalServerException, modelStreamErrorException and anything new: the provider
        // failed.
        _ => ("api_error", 500),
    }
}

/// An Anthropic `error` SSE event.
pub fn error_event(kind: &str, message: &str) -> Bytes {
    let data = serde_json::json!({"type": "error", "error": {"type": kind, "message": message}});
    Bytes::from(format!("event: error\ndata: {data}\n\n"))
}

/// The SSE text of one decoded message, whose event may be at most `max_event` bytes; `Err`
/// carries the final error event (empty: the stream ends as if cut).
fn to_sse(msg: &Message, max_event: usize) -> Result<Option<Bytes>, Bytes> {
    let header = |name: &str| {
        msg.headers()
            .iter()
            .find(|h| h.name().as_str() == name)
            .and_then(|h| h.value().as_string().ok())
            .map(|s| s.as_str().to_owned())
    };
    let message_type = header(":message-type").unwrap_or_default();
    if message_type == "exception" || message_type == "error" {
        let kind = header(":exception-type")
            .or_else(|| header(":error-code"))
            .unwrap_or_default();
        let payload: serde_json::Value = serde_json::from_slice(msg.payload()).unwrap_or_default();
        let text = payload["message"]
            .as_str()
            .or_else(|| payload["Message"].as_str())
            .map(str::to_owned)
            // An error message (rather than an exception) says what went wrong in a header.
            .or_else(|| header(":error-message"))
            .unwrap_or_default();
        let (anthropic_type, _) = exception_meaning(&kind);
        let message = if text.is_empty() {
            format!("Bedrock {kind}")
        } else {
            format!("Bedrock {kind}: {text}")
        };
        return Err(error_event(anthropic_type, &message));
    }
    if header(":event-type").as_deref() != Some("chunk") {
        // Events Bedrock may add later carry nothing the caller's API has.
        return Ok(None);
    }
    let bad = || {
        error_event(
            "api_error",
            "Bedrock sent a chunk that is not an Anthropic event",
        )
    };
    let payload: serde_json::Value = serde_json::from_slice(msg.payload()).map_err(|_| bad())?;
    let raw = STANDARD
        .decode(payload["bytes"].as_str().ok_or_else(bad)?)
        .map_err(|_| bad())?;
    if raw.len() > max_event {
        // Broken as an oversized SSE event is (SPEC §14): the stream ends as if cut, with no
        // event after it, and is judged a broken stream like any other provider's.
        tracing::warn!("upstream stream event larger than server.max_event_bytes");
        return Err(Bytes::new());
    }
    let event: serde_json::Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let name = event["type"].as_str().ok_or_else(bad)?;
    let data = std::str::from_utf8(&raw).map_err(|_| bad())?;
    // One data line: the event JSON must not span lines.
    let data = if data.contains('\n') {
        event.to_string()
    } else {
        data.to_owned()
    };
    Ok(Some(Bytes::from(format!(
        "event: {name}\ndata: {data}\n\n"
    ))))
}

/// The upstream body of a Bedrock stream, read as Anthropic SSE.
pub struct EventStreamSse {
    inner: ResponseBody,
    dec: Decoder,
}

/// Frames in, SSE out, without I/O.
struct Decoder {
    decoder: MessageFrameDecoder,
    buf: BytesMut,
    /// `server.max_event_bytes`: the largest event a frame may carry.
    max_event: usize,
    /// Set after an exception or a broken frame: nothing follows the error event.
    ended: bool,
}

impl EventStreamSse {
    /// `max_event`: `server.max_event_bytes`, the largest event a frame may carry.
    pub fn new(inner: ResponseBody, max_event: usize) -> Self {
        EventStreamSse {
            inner,
            dec: Decoder::new(max_event),
        }
    }

    /// See [`ResponseBody::retire_connection`].
    pub fn retire_connection(&self) {
        self.inner.retire_connection();
    }
}

impl Decoder {
    fn new(max_event: usize) -> Self {
        Decoder {
            decoder: MessageFrameDecoder::new(),
            buf: BytesMut::new(),
            max_event,
            ended: false,
        }
    }

    /// The most a frame may take: its event, base64-encoded, and the rest of the frame. Past
    /// it the buffered bytes cannot be a frame legate accepts, and are not held longer.
    fn frame_limit(&self) -> usize {
        self.max_event
            .saturating_add(2)
            .saturating_div(3)
            .saturating_mul(4)
            .saturating_add(FRAME_OVERHEAD)
    }

    /// Decodes every complete frame in the buffer into SSE text.
    fn drain(&mut self) -> BytesMut {
        let mut out = BytesMut::new();
        while !self.ended {
            match self.decoder.decode_frame(&mut self.buf) {
                Ok(DecodedFrame::Incomplete) => {
                    if self.buf.len() > self.frame_limit() {
                        // An event past max_event_bytes, on its way: a broken stream, ended
                        // as if cut (see `to_sse`).
                        tracing::warn!("upstream stream event larger than server.max_event_bytes");
                        self.ended = true;
                    }
                    break;
                }
                Ok(DecodedFrame::Complete(msg)) => match to_sse(&msg, self.max_event) {
                    Ok(Some(b)) => out.extend_from_slice(&b),
                    Ok(None) => {}
                    Err(e) => {
                        out.extend_from_slice(&e);
                        self.ended = true;
                    }
                },
                Err(_) => {
                    out.extend_from_slice(&error_event(
                        "api_error",
                        "Bedrock sent a corrupt event-stream frame",
                    ));
                    self.ended = true;
                }
            }
        }
        out
    }
}

impl Body for EventStreamSse {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            if this.dec.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.dec.buf.extend_from_slice(&data);
                        let out = this.dec.drain();
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                // A frame cut in half stays a cut: the stream simply ends without its terminal
                // event, which the proxy already treats as a broken stream.
                Poll::Ready(None) => {
                    this.dec.ended = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.dec.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A `chunk` frame carrying one Anthropic stream event (for fakes and tests).
pub fn chunk_frame(event_json: &str) -> Bytes {
    let payload = serde_json::json!({"bytes": STANDARD.encode(event_json)}).to_string();
    frame(
        vec![
            Header::new(":message-type", HeaderValue::String("event".into())),
            Header::new(":event-type", HeaderValue::String("chunk".into())),
            Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ),
        ],
        payload,
    )
}

/// An exception frame (for fakes and tests).
pub fn exception_frame(exception: &str, message: &str) -> Bytes {
    let payload = serde_json::json!({"message": message}).to_string();
    frame(
        vec![
            Header::new(":message-type", HeaderValue::String("exception".into())),
            Header::new(
                ":exception-type",
                HeaderValue::String(exception.to_owned().into()),
            ),
            Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ),
        ],
        payload,
    )
}

fn frame(headers: Vec<Header>, payload: String) -> Bytes {
    let msg = Message::new_from_parts(headers, Bytes::from(payload));
    let mut out = Vec::new();
    // Writing to a Vec fails only for headers or payloads beyond the format's limits.
    let _ = write_message_to(&msg, &mut out);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::read_message_from;

    fn sse(frame: Bytes) -> Result<Option<Bytes>, Bytes> {
        to_sse(&read_message_from(frame).unwrap(), 4 << 20)
    }

    #[test]
    fn chunk_becomes_its_anthropic_event() {
        let ev =
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#;
        let out = sse(chunk_frame(ev)).unwrap().unwrap();
        assert_eq!(out, format!("event: content_block_delta\ndata: {ev}\n\n"));
    }

    #[test]
    fn exceptions_become_error_events_with_their_retry_meaning() {
        for (exc, kind) in [
            ("throttlingException", "rate_limit_error"),
            ("serviceUnavailableException", "overloaded_error"),
            ("validationException", "invalid_request_error"),
            ("internalServerException", "api_error"),
            ("modelStreamErrorException", "api_error"),
        ] {
            let out = sse(exception_frame(exc, "nope")).unwrap_err();
            let text = std::str::from_utf8(&out).unwrap();
            assert!(text.starts_with("event: error\ndata: "), "{text}");
            assert!(
                text.contains(&format!("\"type\":\"{kind}\"")),
                "{exc}: {text}"
            );
            assert!(text.contains(&format!("Bedrock {exc}: nope")), "{text}");
        }
    }

    #[test]
    fn decoder_handles_frames_split_anywhere() {
        let ev1 = r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":3}}}"#;
        let ev2 = r#"{"type":"message_stop"}"#;
        let mut all = chunk_frame(ev1).to_vec();
        all.extend_from_slice(&chunk_frame(ev2));
        for split in 1..all.len() {
            let mut s = Decoder::new(4 << 20);
            s.buf.extend_from_slice(&all[..split]);
            let mut out = s.drain();
            s.buf.extend_from_slice(&all[split..]);
            out.extend_from_slice(&s.drain());
            assert_eq!(
                out,
                format!(
                    "event: message_start\ndata: {ev1}\n\nevent: message_stop\ndata: {ev2}\n\n"
                )
                .as_bytes()
            );
        }
    }

    #[test]
    fn events_are_held_to_max_event_bytes_whatever_the_frame() {
        let event = |len: usize| {
            format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{}"}}}}"#,
                "x".repeat(len)
            )
        };
        // An event of 800 KB (a frame over 1 MiB) under the default 4 MiB: passed on.
        let big = event(800_000);
        let mut s = Decoder::new(4 << 20);
        s.buf.extend_from_slice(&chunk_frame(&big));
        let out = s.drain();
        assert_eq!(
            out.len(),
            "event: content_block_delta\ndata: \n\n".len() + big.len()
        );
        assert!(!s.ended);
        // An event of 20 KB under a 4 KiB bound: broken, as an SSE event that size would be.
        let mut s = Decoder::new(4096);
        s.buf.extend_from_slice(&chunk_frame(&event(20_000)));
        // Nothing after it: a cut, judged a broken stream like an oversized SSE event.
        assert!(s.drain().is_empty());
        assert!(s.ended);
        // A frame that cannot complete within the bound is not waited for.
        let mut s = Decoder::new(4096);
        let frame = chunk_frame(&event(40_000));
        s.buf.extend_from_slice(&frame[..30_000]);
        assert!(s.drain().is_empty());
        assert!(s.ended);
    }

    #[test]
    fn an_error_message_header_is_kept() {
        let msg = frame(
            vec![
                Header::new(":message-type", HeaderValue::String("error".into())),
                Header::new(":error-code", HeaderValue::String("InternalFailure".into())),
                Header::new(
                    ":error-message",
                    HeaderValue::String("The request processing has failed".into()),
                ),
            ],
            String::new(),
        );
        let out = sse(msg).unwrap_err();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(
            text.contains("Bedrock InternalFailure: The request processing has failed"),
            "{text}"
        );
    }

    #[test]
    fn corrupt_frame_ends_with_an_api_error() {
        let mut bad = chunk_frame(r#"{"type":"ping"}"#).to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let mut s = Decoder::new(4 << 20);
        s.buf.extend_from_slice(&bad);
        let out = s.drain();
        assert!(std::str::from_utf8(&out).unwrap().contains("api_error"));
        assert!(s.ended);
    }
}
