//! The header lines of an HTTP/1 head, as httparse found them, made into a `HeaderMap` whose
//! values are views of the head's bytes. Both sides read heads this way: a caller's request
//! (`server::h1::request`) and an upstream's answer (`head`).
//!
//! Names the APIs' peers send on nearly every message — the SDKs' `x-api-key`,
//! `anthropic-version` and `x-stainless-*` telemetry, the providers' request ids and rate-limit
//! headers — are not among the standard names `http` knows without an allocation: each would
//! be copied into a string of its own, per line, per message. They are looked up here in a
//! table of names made at compile time, in any case the peer wrote them in, and only a name
//! the table does not hold goes through `HeaderName::from_bytes`.

use std::cell::RefCell;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue};

/// More header lines than this in one head is refused (hyper's limit too).
pub(crate) const MAX_HEADERS: usize = 100;

/// A line whose name is not a token (RFC 9110 §5.1). Its value needs no such check: see
/// [`value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadName;

/// Where each line's name and value sit in the head: offsets taken before the head is frozen
/// (a head is at most its limit, well under 4 GiB), so that no list of them goes on the heap.
pub(crate) struct Spans {
    at: [[u32; 4]; MAX_HEADERS],
    count: usize,
    /// Where the buffer `fill` read starts: `to_map`'s head must start there (checked in
    /// debug builds, as every test runs).
    base: usize,
}

impl Spans {
    const EMPTY: Spans = Spans {
        at: [[0; 4]; MAX_HEADERS],
        count: 0,
        base: 0,
    };

    /// Runs `read` with this thread's list of spans. A head is read from its first byte to its
    /// map without an await, so one list per thread serves every connection on it; a list made
    /// per head was zeroed and then moved, 3.2 KiB of stores per message.
    pub(crate) fn with<R>(read: impl FnOnce(&mut Spans) -> R) -> R {
        thread_local! {
            static SCRATCH: RefCell<Spans> = const { RefCell::new(Spans::EMPTY) };
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut spans) => read(&mut spans),
            // Not while heads are read one at a time; a list of its own keeps it correct if
            // one is ever read inside another.
            Err(_) => {
                let mut own = Spans::EMPTY;
                read(&mut own)
            }
        })
    }

    /// Takes the lines httparse found in `buf`, which they point into; what an earlier head
    /// left beyond them is never read.
    pub(crate) fn fill(&mut self, buf: &[u8], lines: &[httparse::Header<'_>]) {
        let base = buf.as_ptr() as usize;
        self.base = base;
        let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        self.count = lines.len().min(MAX_HEADERS);
        for (span, h) in self.at.iter_mut().zip(lines) {
            let (name, value) = (offset(h.name.as_bytes()), offset(h.value));
            *span = [
                name,
                name + h.name.len() as u32,
                value,
                value + h.value.len() as u32,
            ];
        }
    }

    /// How many lines `fill` took.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Line `i`'s name start and end and value start and end, as offsets into the head.
    pub(crate) fn line(&self, i: usize) -> [usize; 4] {
        self.at[i].map(|at| at as usize)
    }

    /// The lines as a map over `head`, with room for `room` more; `note` sees each line as it
    /// is added, for what the connection must know of the head (framing, keep-alive).
    ///
    /// `head` must be the bytes `fill` was given, frozen and unchanged: the values are taken
    /// as httparse found them there, without a second check ([`value`]).
    pub(crate) fn to_map<E>(
        &self,
        head: &Bytes,
        room: usize,
        mut note: impl FnMut(&HeaderName, &[u8]) -> Result<(), E>,
        bad: impl Fn(BadName) -> E,
    ) -> Result<HeaderMap, E> {
        debug_assert_eq!(
            head.as_ptr() as usize,
            self.base,
            "to_map reads the head fill read"
        );
        let mut headers = crate::header_maps::take(self.count + room);
        for &[ns, ne, vs, ve] in self.at.iter().take(self.count) {
            let (ns, ne, vs, ve) = (ns as usize, ne as usize, vs as usize, ve as usize);
            let name = name(&head[ns..ne]).ok_or_else(|| bad(BadName))?;
            let value = value(head, vs..ve);
            note(&name, value.as_bytes())?;
            headers.append(name, value);
        }
        Ok(headers)
    }
}

/// A value httparse found in `head`, as a view of it, not checked again.
///
/// httparse lets into a value exactly the bytes `http` allows there: HTAB, SP to `~`, and
/// 0x80–0xFF (RFC 9110 §5.5's field-vchar and obs-text), never CR, LF, NUL, another control
/// byte or DEL; and with `ParserConfig::default()`, as both heads are parsed, no folded line
/// either. `HeaderValue::from_maybe_shared` would walk every byte again to find nothing: 960
/// instructions per request on the caller's head and 810 on the answer's in the benchmark,
/// 2,000 on the caller's head alone with an SDK's headers (bench/README.md). Its unchecked
/// twin, which hyper's HTTP/1 parser uses on httparse's values for the same reason, is
/// `unsafe` only for that promise about the bytes; the test
/// `every_byte_httparse_lets_into_a_value_is_one_http_allows` holds the two sets together for
/// the httparse the lock file names, and debug builds check each value anyway (`http` does
/// under `debug_assertions`), so every test run checks them too.
#[expect(
    unsafe_code,
    reason = "HeaderValue has no safe constructor that trusts httparse's check of the bytes"
)]
fn value(head: &Bytes, at: std::ops::Range<usize>) -> HeaderValue {
    // SAFETY: `from_maybe_shared_unchecked` asks for bytes valid in a header value. `at` is a
    // value httparse accepted in these bytes: `fill` took it from httparse's lines over the
    // buffer `head` was frozen from, unchanged since (`to_map`'s contract), and httparse's
    // value grammar admits no byte `http` refuses (above). What a bad byte would break is the
    // heads legate writes (both sides write values as they are: a CR or LF would inject a
    // line), not memory safety: `HeaderValue::to_str` checks for itself.
    unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(at)) }
}

/// A header line's name: from the table when it is there (no allocation), else parsed.
pub(crate) fn name(raw: &[u8]) -> Option<HeaderName> {
    known(raw).or_else(|| HeaderName::from_bytes(raw).ok())
}

/// The table's name spelled `raw` in any case, if it has it, compared in place with the few
/// names of its length.
fn known(raw: &[u8]) -> Option<HeaderName> {
    bucket(raw.len())
        .iter()
        .find(|n| same_name(n.as_str().as_bytes(), raw))
        .cloned()
}

/// Whether `raw`, a name as a peer spelled it, is `lower`, a table name (lower-case letters,
/// digits and `-`), in any case: `eq_ignore_ascii_case`, eight bytes at a time. Setting bit
/// 0x20 of a byte folds an upper-case letter onto its lower case and leaves `-` and the digits
/// as they are; the only other bytes it folds onto those are below 0x20 (CR onto `-`,
/// 0x10–0x19 onto the digits), so a word holding one of those is no match. A byte by byte
/// comparison ignoring case cost about as much per line as the rest of its parse.
///
/// The bytes past the last whole word are compared as the name's last eight (or, in a name of
/// four to seven, as its first and last four), overlapping what was compared already, instead
/// of one at a time: a byte compared twice is the same answer twice.
fn same_name(lower: &[u8], raw: &[u8]) -> bool {
    if lower.len() != raw.len() {
        return false;
    }
    let n = raw.len();
    if n >= 8 {
        let whole = lower
            .chunks_exact(8)
            .zip(raw.chunks_exact(8))
            .all(|(l, r)| same_word(l, r));
        whole && same_word(&lower[n - 8..], &raw[n - 8..])
    } else if n >= 4 {
        // The first four bytes and the last four (overlapping below eight) as one word.
        let ends = |s: &[u8]| {
            let mut w = [0u8; 8];
            w[..4].copy_from_slice(&s[..4]);
            w[4..].copy_from_slice(&s[n - 4..]);
            w
        };
        same_word(&ends(lower), &ends(raw))
    } else {
        lower
            .iter()
            .zip(raw)
            .all(|(l, r)| *r | 0x20 == *l && *r >= 0x20)
    }
}

/// `same_name` for eight bytes of each (`l` from the table).
fn same_word(l: &[u8], r: &[u8]) -> bool {
    const FOLD: u64 = 0x2020_2020_2020_2020;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let (mut lw, mut rw) = ([0u8; 8], [0u8; 8]);
    lw.copy_from_slice(l);
    rw.copy_from_slice(r);
    let (l, r) = (u64::from_le_bytes(lw), u64::from_le_bytes(rw));
    // Exact as a yes/no for "some byte is below 0x20": a borrow may flag a byte above one
    // that is, never a word that holds none.
    let control = r.wrapping_sub(FOLD) & !r & HIGH;
    r | FOLD == l && control == 0
}

/// A bucket of the table: a static array of the names (a `const` one may not hold their shared
/// bytes).
macro_rules! bucket {
    ($($name:expr),+ $(,)?) => {{
        static NAMES: [HeaderName; [$(stringify!($name)),+].len()] = [$($name),+];
        &NAMES
    }};
}

/// The names in the table, by length: a lookup compares a few names of its length only.
fn bucket(len: usize) -> &'static [HeaderName] {
    match len {
        4 => bucket![header::HOST, header::DATE],
        6 => bucket![header::ACCEPT, header::SERVER, header::ORIGIN],
        7 => bucket![header::TRAILER],
        9 => bucket![X_API_KEY],
        10 => bucket![header::USER_AGENT, header::CONNECTION, REQUEST_ID],
        11 => bucket![header::RETRY_AFTER, TRACEPARENT],
        12 => bucket![header::CONTENT_TYPE, X_REQUEST_ID],
        13 => bucket![header::AUTHORIZATION, header::CACHE_CONTROL],
        14 => bucket![
            header::CONTENT_LENGTH,
            ANTHROPIC_BETA,
            OPENAI_PROJECT,
            X_STAINLESS_OS,
            SEC_FETCH_MODE,
            X_SHOULD_RETRY,
            OPENAI_VERSION
        ],
        15 => bucket![header::ACCEPT_ENCODING, header::ACCEPT_LANGUAGE],
        16 => bucket![header::CONTENT_ENCODING, X_STAINLESS_LANG, X_STAINLESS_ARCH],
        17 => bucket![
            header::TRANSFER_ENCODING,
            ANTHROPIC_VERSION,
            X_STAINLESS_ASYNC
        ],
        18 => bucket![X_STAINLESS_HELPER],
        19 => bucket![
            OPENAI_ORGANIZATION,
            X_STAINLESS_RUNTIME,
            X_STAINLESS_TIMEOUT
        ],
        20 => bucket![OPENAI_PROCESSING_MS],
        23 => bucket![X_STAINLESS_RETRY_COUNT],
        24 => bucket![
            X_STAINLESS_READ_TIMEOUT,
            X_STAINLESS_RAW_RESPONSE,
            X_RATELIMIT_LIMIT_TOKENS,
            X_RATELIMIT_RESET_TOKENS
        ],
        25 => bucket![
            header::STRICT_TRANSPORT_SECURITY,
            X_STAINLESS_HELPER_METHOD,
            X_STAINLESS_STREAM_HELPER,
            ANTHROPIC_ORGANIZATION_ID
        ],
        26 => bucket![X_RATELIMIT_LIMIT_REQUESTS, X_RATELIMIT_RESET_REQUESTS],
        27 => bucket![X_STAINLESS_PACKAGE_VERSION, X_STAINLESS_RUNTIME_VERSION],
        28 => bucket![X_RATELIMIT_REMAINING_TOKENS],
        30 => bucket![X_RATELIMIT_REMAINING_REQUESTS],
        32 => bucket![
            ANTHROPIC_RATELIMIT_TOKENS_LIMIT,
            ANTHROPIC_RATELIMIT_TOKENS_RESET
        ],
        34 => bucket![
            ANTHROPIC_RATELIMIT_REQUESTS_LIMIT,
            ANTHROPIC_RATELIMIT_REQUESTS_RESET
        ],
        36 => bucket![ANTHROPIC_RATELIMIT_TOKENS_REMAINING],
        38 => bucket![
            ANTHROPIC_RATELIMIT_REQUESTS_REMAINING,
            ANTHROPIC_RATELIMIT_INPUT_TOKENS_LIMIT,
            ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET
        ],
        39 => bucket![
            ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_LIMIT,
            ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_RESET
        ],
        41 => bucket![ANTHROPIC_DANGEROUS_DIRECT_BROWSER_ACCESS],
        42 => bucket![ANTHROPIC_RATELIMIT_INPUT_TOKENS_REMAINING],
        43 => bucket![ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_REMAINING],
        _ => &[],
    }
}

// The SDKs' own (wire-protocol §C3): the credential, the API version and the telemetry every
// request carries.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");
const ANTHROPIC_DANGEROUS_DIRECT_BROWSER_ACCESS: HeaderName =
    HeaderName::from_static("anthropic-dangerous-direct-browser-access");
const OPENAI_ORGANIZATION: HeaderName = HeaderName::from_static("openai-organization");
const OPENAI_PROJECT: HeaderName = HeaderName::from_static("openai-project");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const X_STAINLESS_LANG: HeaderName = HeaderName::from_static("x-stainless-lang");
const X_STAINLESS_PACKAGE_VERSION: HeaderName =
    HeaderName::from_static("x-stainless-package-version");
const X_STAINLESS_OS: HeaderName = HeaderName::from_static("x-stainless-os");
const X_STAINLESS_ARCH: HeaderName = HeaderName::from_static("x-stainless-arch");
const X_STAINLESS_RUNTIME: HeaderName = HeaderName::from_static("x-stainless-runtime");
const X_STAINLESS_RUNTIME_VERSION: HeaderName =
    HeaderName::from_static("x-stainless-runtime-version");
const X_STAINLESS_ASYNC: HeaderName = HeaderName::from_static("x-stainless-async");
const X_STAINLESS_RETRY_COUNT: HeaderName = HeaderName::from_static("x-stainless-retry-count");
const X_STAINLESS_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-timeout");
const X_STAINLESS_READ_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-read-timeout");
const X_STAINLESS_HELPER_METHOD: HeaderName = HeaderName::from_static("x-stainless-helper-method");
const X_STAINLESS_HELPER: HeaderName = HeaderName::from_static("x-stainless-helper");
const X_STAINLESS_STREAM_HELPER: HeaderName = HeaderName::from_static("x-stainless-stream-helper");
const X_STAINLESS_RAW_RESPONSE: HeaderName = HeaderName::from_static("x-stainless-raw-response");
// Node's fetch (undici) adds it to the SDKs' requests there.
const SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");

// The providers' answers (wire-protocol §B, §D): request ids, retry advice and rate limits.
const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
const OPENAI_VERSION: HeaderName = HeaderName::from_static("openai-version");
const OPENAI_PROCESSING_MS: HeaderName = HeaderName::from_static("openai-processing-ms");
const ANTHROPIC_ORGANIZATION_ID: HeaderName = HeaderName::from_static("anthropic-organization-id");
const X_RATELIMIT_LIMIT_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-limit-requests");
const X_RATELIMIT_LIMIT_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-limit-tokens");
const X_RATELIMIT_REMAINING_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-requests");
const X_RATELIMIT_REMAINING_TOKENS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-tokens");
const X_RATELIMIT_RESET_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-reset-requests");
const X_RATELIMIT_RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");
const ANTHROPIC_RATELIMIT_REQUESTS_LIMIT: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-limit");
const ANTHROPIC_RATELIMIT_REQUESTS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-remaining");
const ANTHROPIC_RATELIMIT_REQUESTS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-reset");
const ANTHROPIC_RATELIMIT_TOKENS_LIMIT: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-tokens-limit");
const ANTHROPIC_RATELIMIT_TOKENS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-tokens-remaining");
const ANTHROPIC_RATELIMIT_TOKENS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-tokens-reset");
const ANTHROPIC_RATELIMIT_INPUT_TOKENS_LIMIT: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-input-tokens-limit");
const ANTHROPIC_RATELIMIT_INPUT_TOKENS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-input-tokens-remaining");
const ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-input-tokens-reset");
const ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_LIMIT: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-output-tokens-limit");
const ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-output-tokens-remaining");
const ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-output-tokens-reset");

#[cfg(test)]
mod tests;
