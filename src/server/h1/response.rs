//! A response head written for an HTTP/1 caller (RFC 9112 §4–§6): the status line, the
//! handler's headers less the hop-by-hop ones the connection owns, the framing, `date`, and
//! whether the connection stays open.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{Method, StatusCode, header};

/// How the response body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Out {
    /// No body bytes are written (HEAD, 1xx, 204, 304).
    None,
    /// This many bytes are left to write.
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 caller, length unknown).
    Close,
}

/// Appends the head of a response to `method` to `out`, and says how its body is framed.
/// `length` is the body's exact size if known; `keep_alive` is cleared when the framing needs
/// the connection to close, or the handler's `connection` header says `close`.
pub(super) fn encode(
    parts: &http::response::Parts,
    method: &Method,
    http10: bool,
    length: Option<u64>,
    keep_alive: &mut bool,
    out: &mut Vec<u8>,
) -> Out {
    let status = parts.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    let reason = parts
        .extensions
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| r.as_bytes())
        .or_else(|| status.canonical_reason().map(str::as_bytes));
    out.extend_from_slice(reason.unwrap_or(b""));
    out.extend_from_slice(b"\r\n");
    let mut has_date = false;
    let mut declared = None;
    // RFC 9110 §8.6: no length on a 1xx or a 204.
    let lengthless = status.is_informational() || status == StatusCode::NO_CONTENT;
    for (name, value) in &parts.headers {
        // The connection frames the body and decides on keep-alive itself, but a handler may
        // end it (the caller's body too slow to wait for): `close` is the one token it takes.
        if name == header::CONNECTION {
            *keep_alive &= !value
                .as_bytes()
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            continue;
        }
        if name == header::TRANSFER_ENCODING {
            continue;
        }
        if lengthless && name == header::CONTENT_LENGTH {
            continue;
        }
        if name == header::CONTENT_LENGTH {
            if declared.is_some() {
                continue;
            }
            declared = crate::upstream::h1::head::parse_length(value.as_bytes());
            if declared.is_none() {
                continue;
            }
        }
        has_date |= name == header::DATE;
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let bodiless = *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        if declared.is_none()
            && *method == Method::HEAD
            && let Some(n) = length.filter(|n| *n > 0)
        {
            content_length(n, out);
        }
        Out::None
    } else if let Some(n) = declared.or(length) {
        if declared.is_none() {
            content_length(n, out);
        }
        Out::Length(n)
    } else if http10 {
        *keep_alive = false;
        Out::Close
    } else {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Out::Chunked
    };
    if !has_date {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&date());
        out.extend_from_slice(b"\r\n");
    }
    match (*keep_alive, http10) {
        (false, false) => out.extend_from_slice(b"connection: close\r\n"),
        (true, true) => out.extend_from_slice(b"connection: keep-alive\r\n"),
        _ => {}
    }
    out.extend_from_slice(b"\r\n");
    framing
}

/// A whole response for a request head that was refused; the connection closes after it.
pub(super) fn refusal(
    status: StatusCode,
    body: &[u8],
    request_id: Option<&str>,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: application/json\r\n");
    if let Some(id) = request_id {
        // legate's own id (`lgt_` and hex digits): nothing in it needs escaping.
        out.extend_from_slice(b"x-legate-request-id: ");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    content_length(body.len() as u64, out);
    out.extend_from_slice(b"connection: close\r\ndate: ");
    out.extend_from_slice(&date());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body);
}

fn content_length(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// An IMF-fixdate is always this long.
const DATE_LEN: usize = 29;

thread_local! {
    /// The `date` value of the current second, made once per second per thread.
    static DATE: Cell<(u64, [u8; DATE_LEN])> = const { Cell::new((u64::MAX, [0; DATE_LEN])) };
}

fn date() -> [u8; DATE_LEN] {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (at, text) = DATE.get();
    if at == second {
        return text;
    }
    let mut text = [b' '; DATE_LEN];
    let made = httpdate::fmt_http_date(now);
    let n = made.len().min(DATE_LEN);
    text[..n].copy_from_slice(&made.as_bytes()[..n]);
    DATE.set((second, text));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(
        parts: &http::response::Parts,
        method: Method,
        http10: bool,
        len: Option<u64>,
    ) -> (String, Out, bool) {
        let mut out = Vec::new();
        let mut keep = true;
        let framing = encode(parts, &method, http10, len, &mut keep, &mut out);
        (String::from_utf8(out).unwrap(), framing, keep)
    }

    fn parts(status: u16, headers: &[(&str, &str)]) -> http::response::Parts {
        let mut b = http::Response::builder().status(status);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_known_length_is_declared_and_hop_by_hop_headers_are_the_connections() {
        let p = parts(
            200,
            &[
                ("content-type", "application/json"),
                ("connection", "x"),
                ("transfer-encoding", "chunked"),
            ],
        );
        let (text, framing, keep) = head(&p, Method::POST, false, Some(12));
        assert!(
            text.starts_with(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\ndate: "
            ),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");
        assert!(
            !text.contains("connection") && !text.contains("transfer-encoding"),
            "{text}"
        );
        assert_eq!((framing, keep), (Out::Length(12), true));
    }

    #[test]
    fn an_unknown_length_is_chunked_or_closes_for_http10() {
        let p = parts(200, &[("content-type", "text/event-stream")]);
        let (text, framing, keep) = head(&p, Method::POST, false, None);
        assert!(
            text.contains("\r\ntransfer-encoding: chunked\r\n"),
            "{text}"
        );
        assert_eq!((framing, keep), (Out::Chunked, true));
        let (text, framing, keep) = head(&p, Method::POST, true, None);
        assert!(
            !text.contains("transfer-encoding") && !text.contains("connection"),
            "{text}"
        );
        assert_eq!((framing, keep), (Out::Close, false));
        let (text, _, _) = head(&p, Method::GET, true, Some(0));
        assert!(text.contains("\r\nconnection: keep-alive\r\n"), "{text}");
    }

    #[test]
    fn bodiless_answers_write_no_body_and_reason_phrases_can_be_set() {
        let (text, framing, _) = head(
            &parts(204, &[("content-length", "0")]),
            Method::GET,
            false,
            Some(0),
        );
        assert!(
            text.starts_with("HTTP/1.1 204 No Content\r\ndate: "),
            "{text}"
        );
        assert_eq!(framing, Out::None);
        let (text, framing, _) = head(&parts(200, &[]), Method::HEAD, false, Some(5));
        assert!(text.contains("\r\ncontent-length: 5\r\n"), "{text}");
        assert_eq!(framing, Out::None);
        let mut p = parts(529, &[("content-length", "2")]);
        p.extensions
            .insert(hyper::ext::ReasonPhrase::from_static(b"Overloaded"));
        let (text, framing, _) = head(&p, Method::POST, false, Some(2));
        assert!(
            text.starts_with("HTTP/1.1 529 Overloaded\r\ncontent-length: 2\r\n"),
            "{text}"
        );
        assert_eq!(framing, Out::Length(2));
    }

    #[test]
    fn a_refusal_closes() {
        let mut out = Vec::new();
        refusal(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            b"{}",
            None,
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\ndate: "), "{text}");
        assert!(text.ends_with("\r\n\r\n{}"), "{text}");
        let mut out = Vec::new();
        refusal(StatusCode::BAD_REQUEST, b"{}", Some("lgt_1"), &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("\r\nx-legate-request-id: lgt_1\r\n"),
            "{text}"
        );
    }
}
