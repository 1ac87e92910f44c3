//! An HTTP/1.1 request head written, a response head read (RFC 9112 §3–§6).

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::{HeaderName, Method, Request, StatusCode, Version, header};

use super::lines::{MAX_HEADERS, Spans};
use crate::verbatim::Verbatim;

/// More interim (1xx) responses than this before the answer is an error.
const MAX_INTERIM: usize = 8;

/// How the response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body: a `HEAD` request, 204, 304, or a length of 0.
    Empty,
    /// `content-length` bytes.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Everything until the server closes the connection.
    Close,
}

/// A response head: its parts, how its body is delimited, and whether the connection can carry
/// another request once that body is read.
pub(crate) struct Head {
    pub parts: http::response::Parts,
    pub framing: Framing,
    pub keep_alive: bool,
}

/// Why a response head could not be read.
#[derive(Debug)]
pub enum HeadError {
    /// Not HTTP, or not what RFC 9112 allows.
    Malformed(&'static str),
    /// More bytes, or more header lines, than the limits.
    TooLarge,
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::Malformed(why) => write!(f, "malformed response head: {why}"),
            HeadError::TooLarge => f.write_str("response head too large"),
        }
    }
}

/// Appends `req`'s head (origin-form target, the caller's `verbatim` lines as they came, the
/// map's lines, a `content-length` for `body_len` unless one is set) to `out`.
pub(crate) fn encode<B>(
    req: &Request<B>,
    verbatim: Option<&Verbatim>,
    body_len: usize,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    match req.uri().path_and_query() {
        Some(p) if !p.as_str().is_empty() => out.extend_from_slice(p.as_str().as_bytes()),
        _ => out.push(b'/'),
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    // The caller's lines first, as a map made of them and legate's would have them.
    if let Some(lines) = verbatim {
        lines.write_to(out);
    }
    for (name, value) in req.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let bodiless = matches!(*req.method(), Method::GET | Method::HEAD) && body_len == 0;
    if !bodiless && !req.headers().contains_key(header::CONTENT_LENGTH) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Parses a response head of at most `max` bytes from the front of `buf`, taking it out when
/// complete; `Ok(None)` when more bytes are needed. Interim (1xx) responses are taken out and
/// skipped.
pub(crate) fn parse(
    buf: &mut BytesMut,
    method: &Method,
    max: usize,
) -> Result<Option<Head>, HeadError> {
    Spans::with(|spans| parse_with(buf, method, max, spans))
}

fn parse_with(
    buf: &mut BytesMut,
    method: &Method,
    max: usize,
    spans: &mut Spans,
) -> Result<Option<Head>, HeadError> {
    let mut interim = 0;
    loop {
        // Left uninitialised: httparse writes as many as the head has (zeroing all of them was
        // 3 KiB of stores per answer).
        let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut lines)
        {
            Ok(httparse::Status::Complete(n)) if n <= max => n,
            Ok(httparse::Status::Complete(_)) => return Err(HeadError::TooLarge),
            Ok(httparse::Status::Partial) if buf.len() >= max => return Err(HeadError::TooLarge),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
            Err(_) => return Err(HeadError::Malformed("not an HTTP/1 response")),
        };
        let code = resp.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| HeadError::Malformed("invalid status code"))?;
        if status.is_informational() {
            if code == 101 {
                return Err(HeadError::Malformed("an upgrade nobody asked for"));
            }
            interim += 1;
            if interim > MAX_INTERIM {
                return Err(HeadError::Malformed("too many interim responses"));
            }
            let _ = buf.split_to(len);
            continue;
        }
        let version = match resp.version {
            Some(1) => Version::HTTP_11,
            _ => Version::HTTP_10,
        };
        spans.fill(buf, resp.headers);
        let head: Bytes = buf.split_to(len).freeze();
        // What framing needs is noted as the lines are added, not looked up in the map after.
        let mut seen = Framed::default();
        // Room for the headers legate adds to the answer on its way to the caller: a map that
        // grows rehashes every line.
        let headers = spans.to_map(
            &head,
            crate::proxy::response::OWN_HEADERS,
            |n, v| seen.note(n, v),
            |_| HeadError::Malformed("invalid header name"),
        )?;
        let framing = seen.framing(status, method);
        // Both a transfer coding and a length is how a response is split (RFC 9112 §6.3): the
        // answer is read by its coding, and the connection not trusted again.
        // A 204 that names a body (a coding, or a length above zero), or a 304 that names a
        // coding, has none by the RFC, but its peer may send one: read as the next request's
        // answer, it made that request fail and be sent again, or answered it with this one's.
        let named_body = match status {
            StatusCode::NO_CONTENT => {
                seen.chunked_last.is_some() || seen.length.is_some_and(|n| n > 0)
            }
            StatusCode::NOT_MODIFIED => seen.chunked_last.is_some(),
            _ => false,
        };
        let keep_alive = version == Version::HTTP_11
            && framing != Framing::Close
            && !(framing == Framing::Chunked && seen.length.is_some())
            && !named_body
            && !seen.close;
        let mut headers = headers;
        if seen.chunked_last.is_some() && seen.length.is_some() {
            // The length is not the body's (RFC 9112 §6.3: a recipient removes it before
            // passing the message on): relayed, the caller read that many bytes of a longer
            // answer as the whole of it.
            headers.remove(http::header::CONTENT_LENGTH);
        }
        let (mut parts, ()) = http::Response::new(()).into_parts();
        parts.status = status;
        parts.version = version;
        parts.headers = headers;
        return Ok(Some(Head {
            parts,
            framing,
            keep_alive,
        }));
    }
}

/// The header lines that decide a response's framing and keep-alive, as they were read.
#[derive(Default)]
struct Framed {
    length: Option<u64>,
    /// Whether the last transfer coding named so far is chunked (`None`: none named).
    chunked_last: Option<bool>,
    close: bool,
}

impl Framed {
    fn note(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), HeadError> {
        if name == header::CONTENT_LENGTH {
            for part in value.split(|b| *b == b',') {
                let n = parse_length(part.trim_ascii())
                    .ok_or(HeadError::Malformed("invalid content-length"))?;
                if self.length.is_some_and(|l| l != n) {
                    return Err(HeadError::Malformed("conflicting content-length"));
                }
                self.length = Some(n);
            }
        } else if name == header::TRANSFER_ENCODING {
            let last = value
                .split(|b| *b == b',')
                .map(<[u8]>::trim_ascii)
                .rfind(|t| !t.is_empty());
            if let Some(t) = last {
                self.chunked_last = Some(t.eq_ignore_ascii_case(b"chunked"));
            } else if self.chunked_last.is_none() {
                self.chunked_last = Some(false);
            }
        } else if name == header::CONNECTION {
            self.close |= value
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
        Ok(())
    }

    /// RFC 9112 §6.3: how a response to `method` with `status` ends.
    fn framing(&self, status: StatusCode, method: &Method) -> Framing {
        if *method == Method::HEAD
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Framing::Empty;
        }
        // A final encoding other than chunked: the body runs until the connection closes.
        match (self.chunked_last, self.length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(0)) => Framing::Empty,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    }
}

pub(crate) fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Result<Option<Head>, HeadError> {
        parse(&mut BytesMut::from(raw), &Method::POST, 64 << 10)
    }

    #[test]
    fn a_request_head_is_origin_form_with_a_length() {
        let req = Request::post("http://p.example/v1/messages?beta=true")
            .header("host", "p.example")
            .header("x-api-key", "k")
            .body(())
            .unwrap();
        let mut out = Vec::new();
        encode(&req, None, 12, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/messages?beta=true HTTP/1.1\r\nhost: p.example\r\nx-api-key: k\r\ncontent-length: 12\r\n\r\n"
        );
        let get = Request::get("/v1/models").body(()).unwrap();
        let mut out = Vec::new();
        encode(&get, None, 0, &mut out);
        assert_eq!(out, b"GET /v1/models HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn a_response_head_is_taken_off_the_buffer() {
        let mut buf =
            BytesMut::from("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello");
        let head = parse(&mut buf, &Method::POST, 64 << 10).unwrap().unwrap();
        assert_eq!(head.parts.status, 200);
        assert_eq!(head.framing, Framing::Length(5));
        assert!(head.keep_alive);
        assert_eq!(head.parts.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(&buf[..], b"hello");
    }

    #[test]
    fn partial_heads_wait_and_interim_responses_are_skipped() {
        assert!(parsed("HTTP/1.1 200 OK\r\ncontent-le").unwrap().is_none());
        let head =
            parsed("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 529 x\r\ncontent-length: 0\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!(head.parts.status, 529);
        assert_eq!(head.framing, Framing::Empty);
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let f = |raw: &str| parsed(raw).unwrap().unwrap();
        let chunked =
            f("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(chunked.framing, Framing::Chunked);
        assert!(
            !chunked.keep_alive,
            "a coding and a length: not trusted again"
        );
        // Nor is the length passed on: it is not the body's.
        assert!(chunked.parts.headers.get("content-length").is_none());
        let coded = f("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ncontent-length: 3\r\n\r\n");
        assert!(coded.parts.headers.get("content-length").is_none());
        let length = f("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(length.parts.headers["content-length"], "3");
        let plain = f("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        assert!(plain.keep_alive);
        let gz = f("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!(gz.framing, Framing::Close);
        assert!(!gz.keep_alive);
        let none = f("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(none.framing, Framing::Close);
        let closing =
            f("HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 2\r\n\r\n");
        assert!(!closing.keep_alive);
        let old = f("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n");
        assert!(!old.keep_alive);
        let empty = f("HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n");
        assert_eq!(empty.framing, Framing::Empty);
        // A body named where none may be: its bytes may follow, so the connection goes.
        assert!(!empty.keep_alive);
        assert!(!f("HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n").keep_alive);
        assert!(!f("HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n").keep_alive);
        assert!(f("HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").keep_alive);
        assert!(f("HTTP/1.1 204 No Content\r\n\r\n").keep_alive);
        assert!(f("HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n").keep_alive);
        let same = f("HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\ncontent-length: 4\r\n\r\n");
        assert_eq!(same.framing, Framing::Length(4));
        let head = parse(
            &mut BytesMut::from("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n"),
            &Method::HEAD,
            64 << 10,
        );
        assert_eq!(head.unwrap().unwrap().framing, Framing::Empty);
    }

    #[test]
    fn bad_heads_are_errors() {
        for raw in [
            "HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
            // What `HeaderValue` refuses.
            "HTTP/1.1 200 OK\r\nx-a: a\x7fb\r\n\r\n",
            "HTTP/1.1 200 OK\r\nx-a: a\x00b\r\n\r\n",
        ] {
            assert!(parsed(raw).is_err(), "{raw:?}");
        }
        let interim = "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM + 1);
        let raw = format!("{interim}HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert!(parsed(&raw).is_err(), "too many interim responses");
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(matches!(parsed(&raw), Err(HeadError::TooLarge)));
    }
}
