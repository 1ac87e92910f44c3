//! A caller's HTTP/1 request head read (RFC 9112 §2–§6): its parts, how its body is delimited,
//! and what the connection owes it (a `100 Continue`, closing after the answer).

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::{HeaderName, Method, StatusCode, Uri, Version, header};

use crate::api::ApiKind;
use crate::error::ProxyError;
use crate::upstream::h1::head::parse_length;
use crate::upstream::h1::lines::{MAX_HEADERS, Spans};
use crate::verbatim::Verbatim;

/// How the request body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    Length(u64),
    Chunked,
}

/// A request head and what the connection must do about it.
pub(super) struct Head {
    pub parts: http::request::Parts,
    pub framing: Framing,
    /// The caller allows another request on the connection after this one's answer.
    pub keep_alive: bool,
    /// The caller waits for `100 Continue` before it sends the body.
    pub expects_continue: bool,
    /// The lines that go upstream as the caller wrote them, when they all can. Boxed: the
    /// head, and the request it becomes, are moved several times on the way to the handler,
    /// and 64 bytes more in each move cost more than the allocation (bench/README.md).
    pub verbatim: Option<Box<Verbatim>>,
}

/// Why a request head is refused; the connection answers with the status and closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// 400: not an HTTP/1 request, or framing RFC 9112 does not allow.
    Malformed,
    /// 431: more bytes, or more header lines, than the limits.
    TooLarge,
    /// 505: a version other than 1.0 and 1.1.
    Version,
    /// 501: a chunked body in another transfer coding too (gzip, …), which legate does not
    /// decode (RFC 9112 §6.1).
    Coding,
}

impl Refused {
    /// The refusal as the caller is told it.
    pub(super) fn error(&self) -> ProxyError {
        let (status, message) = match self {
            Refused::Malformed => (
                StatusCode::BAD_REQUEST,
                "the request is not valid HTTP/1.1: a malformed request line or header line, a missing or repeated host line, or a body whose framing RFC 9112 does not allow (content-length and transfer-encoding together, conflicting lengths, a coding other than chunked); the connection is closed",
            ),
            Refused::TooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "the request head is larger than legate reads: at most 64 KiB and 100 header lines; the connection is closed",
            ),
            Refused::Coding => (
                StatusCode::NOT_IMPLEMENTED,
                "legate reads a request body as it is or chunked, in no other transfer coding: send it uncompressed; the connection is closed",
            ),
            Refused::Version => (
                StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                "legate speaks HTTP/1.0, HTTP/1.1 and HTTP/2; the connection is closed",
            ),
        };
        ProxyError::BadHead { status, message }
    }
}

/// The API whose error shape a head legate could not read gets: the Anthropic API's for a
/// `/v1/messages` target or an `anthropic-version` line (which Anthropic SDKs always send and
/// OpenAI SDKs never do), else the OpenAI APIs'. Only the first 64 KiB are looked at.
pub(super) fn api_of(head: &[u8]) -> ApiKind {
    let head = &head[..head.len().min(64 << 10)];
    let target = head.splitn(3, |b| *b == b' ').nth(1).unwrap_or_default();
    if target.starts_with(b"/v1/messages") {
        return ApiKind::Anthropic;
    }
    if target.starts_with(b"/v1/chat/") || target.starts_with(b"/v1/responses") {
        return ApiKind::OpenAi;
    }
    let named = head
        .split(|b| *b == b'\n')
        .any(|line| line.len() > 18 && line[..18].eq_ignore_ascii_case(b"anthropic-version:"));
    if named {
        ApiKind::Anthropic
    } else {
        ApiKind::OpenAi
    }
}

/// Parses a request head of at most `max` bytes from the front of `buf`, taking it out when
/// complete; `Ok(None)` when more bytes are needed. Empty lines before a request are skipped
/// (RFC 9112 §2.2).
pub(super) fn parse(buf: &mut BytesMut, max: usize) -> Result<Option<Head>, Refusal> {
    Spans::with(|spans| parse_with(buf, max, spans))
}

/// A head refused, and the API whose shape the refusal takes ([`api_of`], read off the head's
/// bytes only once it is refused).
#[derive(Debug)]
pub(super) struct Refusal {
    pub why: Refused,
    pub api: ApiKind,
    /// The method and path as far as the head's first line gives them (`-` where it does
    /// not), for the access log.
    pub method: Method,
    pub path: String,
}

impl Refusal {
    fn of(why: Refused, head: &[u8]) -> Refusal {
        let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
        let mut words = line.trim_ascii().splitn(3, |b| *b == b' ');
        let method = words
            .next()
            .filter(|m| m.len() <= 16)
            .and_then(|m| Method::from_bytes(m).ok());
        let target = words.next().unwrap_or_default();
        let path = target.split(|b| *b == b'?').next().unwrap_or_default();
        let path = &path[..path.len().min(256)];
        Refusal {
            why,
            api: api_of(head),
            method: method
                .or_else(|| Method::from_bytes(b"-").ok())
                .unwrap_or(Method::GET),
            path: match path.first() {
                Some(b'/') => String::from_utf8_lossy(path).into_owned(),
                _ => "-".to_owned(),
            },
        }
    }
}

fn parse_with(buf: &mut BytesMut, max: usize, spans: &mut Spans) -> Result<Option<Head>, Refusal> {
    let blank = buf
        .iter()
        .take_while(|b| matches!(b, b'\r' | b'\n'))
        .count();
    if blank > 0 {
        let _ = buf.split_to(blank);
    }
    if buf.is_empty() {
        return Ok(None);
    }
    let (len, method, version, target) = match locate(buf, max, spans) {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(None),
        Err(why) => return Err(Refusal::of(why, buf)),
    };
    let head: Bytes = buf.split_to(len).freeze();
    finish(&head, method, version, target, spans)
        .map(Some)
        .map_err(|why| Refusal::of(why, &head))
}

/// Where a complete head is: its length, method, version and target (as offsets into it).
type Located = (usize, Method, Version, std::ops::Range<usize>);

/// The head's length, method, version and target, its lines noted in `spans`; `None` while
/// it is incomplete.
fn locate(buf: &BytesMut, max: usize, spans: &mut Spans) -> Result<Option<Located>, Refused> {
    // Left uninitialised: httparse writes as many as the head has.
    let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, &mut lines)
    {
        Ok(httparse::Status::Complete(n)) if n <= max => n,
        Ok(httparse::Status::Complete(_)) => return Err(Refused::TooLarge),
        Ok(httparse::Status::Partial) if buf.len() >= max => return Err(Refused::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Refused::TooLarge),
        Err(httparse::Error::Version) if names_other_version(buf) => return Err(Refused::Version),
        Err(_) => return Err(Refused::Malformed),
    };
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return Err(Refused::Version),
    };
    let method =
        Method::from_bytes(req.method.unwrap_or("").as_bytes()).map_err(|_| Refused::Malformed)?;
    // The target's offsets, taken before the head is frozen, as the lines' are: all become
    // views of it.
    let base = buf.as_ptr() as usize;
    let path = req.path.unwrap_or("").as_bytes();
    let target = (path.as_ptr() as usize - base)..(path.as_ptr() as usize - base + path.len());
    spans.fill(buf, req.headers);
    Ok(Some((len, method, version, target)))
}

/// The request made of a whole head taken off the buffer.
fn finish(
    head: &Bytes,
    method: Method,
    version: Version,
    target: std::ops::Range<usize>,
    spans: &mut Spans,
) -> Result<Head, Refused> {
    let uri = Uri::from_maybe_shared(head.slice(target)).map_err(|_| Refused::Malformed)?;
    // What the connection needs from the head is noted as the lines are added, instead of
    // looked up in the map after.
    let mut seen = Framed::default();
    // Which lines go upstream as they are (bit `i`: line `i`; a head has at most
    // `MAX_HEADERS`, fewer than 128), told by their names as the map is made.
    let (mut keep, mut line) = (0u128, 0);
    let headers = spans.to_map(
        head,
        0,
        |n, v| {
            seen.note(n, v)?;
            if crate::upstream::verbatim_name(n) {
                keep |= 1 << line;
            }
            line += 1;
            Ok(())
        },
        |_| Refused::Malformed,
    )?;
    seen.host(version)?;
    // A `Connection` line naming other lines drops those, whatever their names.
    let verbatim = if seen.names_lines {
        None
    } else {
        Verbatim::of(head, spans, keep).map(Box::new)
    };
    let framing = seen.framing(version)?;
    // What follows a CONNECT is the tunnel the client expects, never a request: it is
    // refused (SPEC §14: legate is no open proxy), and the connection ends with it.
    let keep_alive = method != Method::CONNECT
        && match version {
            Version::HTTP_11 => !seen.close,
            _ => seen.keep_alive,
        };
    let expects_continue = version == Version::HTTP_11 && seen.expects_continue;
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Head {
        parts,
        framing,
        keep_alive,
        expects_continue,
        verbatim,
    })
}

/// Whether the request line ends in a well-formed version other than HTTP/1.0 and 1.1 (505),
/// rather than in something that is no version at all (400). httparse refuses both alike.
fn names_other_version(buf: &[u8]) -> bool {
    let line = buf.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // Method, target and version: a line with more parts is malformed whatever it ends in.
    if line.iter().filter(|b| **b == b' ').count() != 2 {
        return false;
    }
    match line.rsplit(|b| *b == b' ').next() {
        Some([b'H', b'T', b'T', b'P', b'/', major, b'.', minor]) => {
            major.is_ascii_digit() && minor.is_ascii_digit()
        }
        _ => false,
    }
}

/// The header lines that decide framing and keep-alive, as they were read.
#[derive(Default)]
struct Framed {
    length: Option<u64>,
    /// Whether the last transfer coding named so far is chunked (`None`: none named).
    chunked_last: Option<bool>,
    /// Transfer codings named: chunked ones, and others.
    chunked: u8,
    other_codings: bool,
    close: bool,
    keep_alive: bool,
    /// A `Connection` line names something other than `close` and `keep-alive`: header lines
    /// that are this hop's only.
    names_lines: bool,
    expects_continue: bool,
    /// `Host` lines seen.
    hosts: u8,
}

impl Framed {
    fn note(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), Refused> {
        if name == header::CONTENT_LENGTH {
            for part in value.split(|b| *b == b',') {
                let n = parse_length(part.trim_ascii()).ok_or(Refused::Malformed)?;
                if self.length.is_some_and(|l| l != n) {
                    return Err(Refused::Malformed);
                }
                self.length = Some(n);
            }
        } else if name == header::TRANSFER_ENCODING {
            let mut last = None;
            for coding in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if coding.eq_ignore_ascii_case(b"chunked") {
                    self.chunked = self.chunked.saturating_add(1);
                } else if !coding.is_empty() {
                    self.other_codings = true;
                }
                if !coding.is_empty() {
                    last = Some(coding);
                }
            }
            // A line with no coding in it still says a coding applies.
            self.chunked_last = Some(last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")));
        } else if name == header::CONNECTION {
            for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                let close = token.eq_ignore_ascii_case(b"close");
                let keep_alive = token.eq_ignore_ascii_case(b"keep-alive");
                self.close |= close;
                self.keep_alive |= keep_alive;
                self.names_lines |= !token.is_empty() && !close && !keep_alive;
            }
        } else if name == header::EXPECT {
            self.expects_continue = value.eq_ignore_ascii_case(b"100-continue");
        } else if name == header::HOST {
            self.hosts = self.hosts.saturating_add(1);
        }
        Ok(())
    }

    /// RFC 9112 §3.2: an HTTP/1.1 request has exactly one `Host` line, and no request has
    /// more than one. legate's Host check (DNS rebinding, `proxy::inbound`) reads the first:
    /// a second one must not be there to mean something else to anyone.
    fn host(&self, version: Version) -> Result<(), Refused> {
        match (self.hosts, version) {
            (0, Version::HTTP_10) | (1, _) => Ok(()),
            _ => Err(Refused::Malformed),
        }
    }

    /// RFC 9112 §6.3 for requests: chunked if a transfer coding is named (and it must end in
    /// chunked, applied once), else the content length, else no body. A request naming both a
    /// coding and a length is how requests are smuggled past proxies: it is refused, as are
    /// codings over HTTP/1.0 and conflicting lengths. A well-framed chunked body in another
    /// coding too is 501 (§6.1): legate would pass its bytes on undecoded.
    fn framing(&self, version: Version) -> Result<Framing, Refused> {
        match self.chunked_last {
            None => Ok(Framing::Length(self.length.unwrap_or(0))),
            Some(true)
                if version == Version::HTTP_11 && self.length.is_none() && self.chunked == 1 =>
            {
                if self.other_codings {
                    Err(Refused::Coding)
                } else {
                    Ok(Framing::Chunked)
                }
            }
            Some(_) => Err(Refused::Malformed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Result<Option<Head>, Refused> {
        parse(&mut BytesMut::from(raw), 64 << 10).map_err(|r| r.why)
    }

    #[test]
    fn a_request_head_becomes_its_parts_and_leaves_the_body_in_the_buffer() {
        let mut buf = BytesMut::from(
            "\r\nPOST /v1/messages?beta=true HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\ncontent-length: 2\r\n\r\n{}",
        );
        let head = parse(&mut buf, 64 << 10).unwrap().unwrap();
        assert_eq!(head.parts.method, Method::POST);
        assert_eq!(head.parts.uri.path(), "/v1/messages");
        assert_eq!(head.parts.uri.query(), Some("beta=true"));
        assert_eq!(head.parts.version, Version::HTTP_11);
        assert_eq!(head.parts.headers["x-api-key"], "k");
        assert_eq!(head.framing, Framing::Length(2));
        assert!(head.keep_alive);
        assert!(!head.expects_continue);
        assert_eq!(&buf[..], b"{}");
    }

    /// A head's verbatim lines as the upstream head gets them, and as an HTTP/2 map does.
    fn verbatim_of(raw: &str) -> Option<(String, http::HeaderMap)> {
        let v = parsed(raw).unwrap().unwrap().verbatim?;
        let mut written = Vec::new();
        v.write_to(&mut written);
        let mut map = http::HeaderMap::new();
        v.append_to(&mut map);
        Some((String::from_utf8(written).unwrap(), map))
    }

    #[test]
    fn lines_that_go_on_as_they_came_are_kept_as_runs_of_the_head() {
        let head = "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:1\r\nAccept: application/json\r\n\
            Accept-Encoding: gzip\r\nConnection: keep-alive\r\nUser-Agent: Anthropic/Python 2.14.0\r\n\
            X-Stainless-Lang:python\r\nanthropic-version:  2023-06-01\r\nX-API-KEY: caller-secret\r\n\
            X-Legate-Priority: batch\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\
            x-stainless-retry-count: 0\r\nAuthorization: Bearer caller-secret\r\nx-empty:\r\n\
            Content-Length: 2\r\n\r\n{}";
        let (written, map) = verbatim_of(head).unwrap();
        // As written (case, spacing), in order; never a credential, a hop's line, legate's
        // own, or `traceparent` (which goes through the map, for legate to replace).
        assert_eq!(
            written,
            "Accept: application/json\r\nUser-Agent: Anthropic/Python 2.14.0\r\n\
             X-Stainless-Lang:python\r\nanthropic-version:  2023-06-01\r\n\
             x-stainless-retry-count: 0\r\nx-empty:\r\n"
        );
        let lines: Vec<(&str, &str)> = map
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            lines,
            [
                ("accept", "application/json"),
                ("user-agent", "Anthropic/Python 2.14.0"),
                ("x-stainless-lang", "python"),
                ("anthropic-version", "2023-06-01"),
                ("x-stainless-retry-count", "0"),
                ("x-empty", ""),
            ]
        );
        // Only the runs' places are shown, never a value.
        let v = parsed(head).unwrap().unwrap().verbatim.unwrap();
        assert!(!format!("{v:?}").contains("python"));
        // A head with nothing to forward as written has an empty set, not none.
        let (written, map) =
            verbatim_of("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\n").unwrap();
        assert_eq!((written.as_str(), map.len()), ("", 0));
    }

    #[test]
    fn a_head_whose_lines_cannot_all_go_as_written_has_none_kept() {
        // A `Connection` line naming a line drops it whatever its name.
        let named =
            "GET / HTTP/1.1\r\nhost: a\r\nconnection: keep-alive, x-hop\r\nx-hop: 1\r\n\r\n";
        assert!(verbatim_of(named).is_none());
        let plain = "GET / HTTP/1.1\r\nhost: a\r\nconnection: Keep-Alive, close\r\nx-a: 1\r\n\r\n";
        assert!(verbatim_of(plain).is_some());
        // A line ended by a bare LF, or by spaces after its value, is not copied as it is.
        assert!(verbatim_of("GET / HTTP/1.1\r\nhost: a\r\nx-a: 1\n\r\n").is_none());
        let spaced = parsed("GET / HTTP/1.1\r\nhost: a\r\nx-a: 1 \r\n\r\n").unwrap();
        assert!(spaced.unwrap().verbatim.is_none());
        // Runs up to the limit, and not one more: each kept line between two dropped ones.
        let runs = |n: usize| {
            let mut h = String::from("GET / HTTP/1.1\r\nhost: a\r\n");
            for i in 0..n {
                h.push_str(&format!("x-a-{i}: 1\r\nx-api-key: k\r\n"));
            }
            h + "\r\n"
        };
        let (written, _) = verbatim_of(&runs(crate::verbatim::MAX_RUNS)).unwrap();
        assert_eq!(written.lines().count(), crate::verbatim::MAX_RUNS);
        assert!(verbatim_of(&runs(crate::verbatim::MAX_RUNS + 1)).is_none());
    }

    #[test]
    fn keep_alive_and_continue_follow_the_version_and_the_connection_header() {
        // HTTP/1.0 may leave Host out.
        let h = parsed("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        assert_eq!(h.framing, Framing::Length(0));
        let h = parsed("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        let h = parsed("GET / HTTP/1.1\r\nhost: a\r\nconnection: te, close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let h = parsed(
            "POST / HTTP/1.1\r\nhost: a\r\nexpect: 100-Continue\r\ncontent-length: 5\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(h.expects_continue);
    }

    #[test]
    fn framing_is_chunked_or_a_single_length_and_never_both() {
        let h = parsed("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: Chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        // A coding legate does not decode, under chunked: 501 (RFC 9112 §6.1).
        for coded in [
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(parsed(coded).err(), Some(Refused::Coding), "{coded}");
        }
        let h = parsed("POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 7, 7\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(7));
        for bad in [
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "NOT HTTP\r\n\r\n",
            "GET /a b HTTP/1.1\r\nhost: a\r\n\r\n",
            // RFC 9112 §3.2: HTTP/1.1 needs its one Host line; no request may have two.
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nhost: localhost\r\nHost: evil.example\r\n\r\n",
            // Chunked applied twice (RFC 9112 §6.1: never more than once).
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "GET / HTTP/1.0\r\nhost: localhost\r\nhost: evil.example\r\n\r\n",
        ] {
            assert_eq!(parsed(bad).err(), Some(Refused::Malformed), "{bad}");
        }
        assert_eq!(
            parsed("GET / HTTP/2.0\r\n\r\n").err(),
            Some(Refused::Version)
        );
    }

    #[test]
    fn a_partial_head_waits_and_an_oversize_one_is_refused() {
        assert!(
            parsed("POST /v1/messages HTTP/1.1\r\nhost: a\r\n")
                .unwrap()
                .is_none()
        );
        assert!(parsed("\r\n\r\n").unwrap().is_none());
        let long = format!("GET / HTTP/1.1\r\nx: {}\r\n", "a".repeat(100));
        assert_eq!(
            parse(&mut BytesMut::from(long.as_str()), 64)
                .err()
                .map(|r| r.why),
            Some(Refused::TooLarge)
        );
        let many: String = (0..101).map(|i| format!("x{i}: y\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parsed(&many).err(), Some(Refused::TooLarge));
    }
}
