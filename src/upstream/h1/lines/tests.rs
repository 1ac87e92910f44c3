use bytes::Bytes;
use http::HeaderName;

use super::{BadName, Spans, name};

#[test]
fn every_name_in_the_table_is_the_name_http_makes_of_it_in_any_case() {
    let mut names = 0;
    for len in 0..64 {
        for n in super::bucket(len) {
            names += 1;
            let s = n.as_str();
            assert_eq!(s.len(), len, "{s} is in the bucket of its length");
            assert_eq!(name(s.as_bytes()).as_ref(), Some(n));
            assert_eq!(name(s.to_ascii_uppercase().as_bytes()).as_ref(), Some(n));
        }
    }
    assert!(names > 50, "the table holds the names ({names})");
    let spelled = [
        "host",
        "Content-Type",
        "X-Stainless-Retry-Count",
        "x-api-key",
        "Anthropic-Version",
        "request-id",
        "anthropic-ratelimit-output-tokens-remaining",
        "X-RateLimit-Remaining-Requests",
        "traceparent",
    ];
    for raw in spelled {
        let from_table =
            super::known(raw.as_bytes()).unwrap_or_else(|| panic!("{raw} is in the table"));
        let parsed = HeaderName::from_bytes(raw.as_bytes()).expect("a valid name");
        assert_eq!(from_table, parsed);
        assert_eq!(name(raw.as_bytes()), Some(parsed));
    }
}

#[test]
fn a_name_the_table_lacks_is_parsed_and_a_bad_one_refused() {
    assert_eq!(
        name(b"X-Custom-Thing"),
        Some(HeaderName::from_static("x-custom-thing"))
    );
    // Longer than any name in the table.
    let long = "x-".repeat(40) + "z";
    assert_eq!(
        name(long.as_bytes()),
        HeaderName::from_bytes(long.as_bytes()).ok()
    );
    assert_eq!(name(b"bad name"), None);
    assert_eq!(name(b""), None);
    // Same length as a name in the table, one byte off.
    assert_eq!(name(b"x-api-ke\xff"), None);
}

fn lines_of(head: &'static [u8]) -> (Bytes, Spans) {
    let mut lines = [httparse::EMPTY_HEADER; 8];
    let mut resp = httparse::Response::new(&mut lines);
    assert!(resp.parse(head).expect("a head").is_complete());
    let mut spans = Spans::EMPTY;
    spans.fill(head, resp.headers);
    (Bytes::from_static(head), spans)
}

#[test]
fn values_are_views_of_the_head_and_each_line_is_noted() {
    let (head, spans) =
        lines_of(b"HTTP/1.1 200 OK\r\nRequest-Id: req_1\r\nx-other: a\r\nx-other: b\r\n\r\n");
    let mut noted = Vec::new();
    let map = spans
        .to_map(
            &head,
            0,
            |n, v| {
                noted.push((n.as_str().to_owned(), v.to_vec()));
                Ok::<(), BadName>(())
            },
            |b| b,
        )
        .expect("valid lines");
    assert_eq!(map["request-id"], "req_1");
    let others: Vec<_> = map.get_all("x-other").iter().collect();
    assert_eq!(others, ["a", "b"]);
    assert_eq!(noted.len(), 3);
    assert_eq!(noted[0], ("request-id".to_owned(), b"req_1".to_vec()));
    let value = map["request-id"].as_bytes().as_ptr() as usize;
    let start = head.as_ptr() as usize;
    assert!((start..start + head.len()).contains(&value));
}

#[test]
fn what_note_refuses_stops_the_map() {
    let (head, spans) = lines_of(b"HTTP/1.1 200 OK\r\na: 1\r\nb: 2\r\n\r\n");
    let out = spans.to_map(
        &head,
        0,
        |n, _| if n == "b" { Err("b refused") } else { Ok(()) },
        |_| "bad name",
    );
    assert_eq!(out.err(), Some("b refused"));
}

/// `value` takes httparse's values without checking them again (`unsafe`): every byte that
/// httparse lets into a value, requests and answers alike, must be one `http` allows there.
/// Each byte is tried at the start, in the middle and at the end of a 40-byte value, so that
/// more than one of httparse's scans sees it: its first byte read alone, a wide block (32
/// bytes with AVX2), and a narrower one after it (8 bytes). It covers the scan the machine
/// running it picks; debug builds check every value besides.
#[test]
fn every_byte_httparse_lets_into_a_value_is_one_http_allows() {
    let mut allowed = 0;
    for b in 0..=255u8 {
        for at in [0, 20, 39] {
            let mut value = vec![b'v'; 40];
            value[at] = b;
            let head = |first: &[u8]| [first, b"x: ", &value, b"\r\n\r\n"].concat();
            let (request, answer) = (head(b"GET / HTTP/1.1\r\n"), head(b"HTTP/1.1 200 OK\r\n"));
            let config = httparse::ParserConfig::default();
            let mut lines = [httparse::EMPTY_HEADER; 4];
            let mut req = httparse::Request::new(&mut lines);
            let req_value = match config.parse_request(&mut req, &request) {
                Ok(httparse::Status::Complete(_)) => Some(req.headers[0].value.to_vec()),
                _ => None,
            };
            let mut lines = [httparse::EMPTY_HEADER; 4];
            let mut resp = httparse::Response::new(&mut lines);
            let resp_value = match config.parse_response(&mut resp, &answer) {
                Ok(httparse::Status::Complete(_)) => Some(resp.headers[0].value.to_vec()),
                _ => None,
            };
            for found in [req_value, resp_value].into_iter().flatten() {
                allowed += 1;
                assert!(
                    http::HeaderValue::from_bytes(&found).is_ok(),
                    "httparse let byte {b:#04x} into a value at {at}, which http refuses"
                );
            }
        }
    }
    // HTAB, SP to `~` and 0x80–0xFF, minus the spaces and tabs trimmed off either end: the
    // test would pass vacuously if httparse refused everything.
    assert!(allowed > 2 * 3 * 200, "httparse accepted {allowed} values");
}

fn map_of(head: &'static [u8]) -> http::HeaderMap {
    let mut lines = [httparse::EMPTY_HEADER; 8];
    let mut resp = httparse::Response::new(&mut lines);
    assert!(resp.parse(head).expect("a head").is_complete());
    Spans::with(|spans| {
        spans.fill(head, resp.headers);
        spans.to_map(&Bytes::from_static(head), 0, |_, _| Ok(()), |b| b)
    })
    .expect("valid lines")
}

#[test]
fn the_thread_list_holds_only_the_last_head_and_serves_a_head_read_inside_another() {
    let long = map_of(b"HTTP/1.1 200 OK\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n");
    assert_eq!(long.len(), 3);
    let short = map_of(b"HTTP/1.1 200 OK\r\nd: 4\r\n\r\n");
    assert_eq!(short.len(), 1);
    assert_eq!(short["d"], "4");
    // The list is in use: the inner read gets one of its own and both maps are whole.
    let (outer, inner) = Spans::with(|spans| {
        let head = b"HTTP/1.1 200 OK\r\ne: 5\r\nf: 6\r\n\r\n";
        let mut lines = [httparse::EMPTY_HEADER; 8];
        let mut resp = httparse::Response::new(&mut lines);
        assert!(resp.parse(head).expect("a head").is_complete());
        spans.fill(head, resp.headers);
        let inner = map_of(b"HTTP/1.1 200 OK\r\ng: 7\r\n\r\n");
        let outer = spans.to_map(&Bytes::from_static(head), 0, |_, _| Ok(()), |b: BadName| b);
        (outer.expect("valid lines"), inner)
    });
    assert_eq!((outer.len(), outer["f"].as_bytes()), (2, &b"6"[..]));
    assert_eq!((inner.len(), inner["g"].as_bytes()), (1, &b"7"[..]));
}

#[test]
fn names_compare_as_eq_ignore_ascii_case_for_every_byte_in_every_place() {
    let mut compared = 0;
    // Beside the table's names, one of each length the word and half-word paths split at.
    let extra = [
        "t",
        "te",
        "x-1",
        "ab-c",
        "abcd5",
        "abcdefg",
        "abcdefgh",
        "abcdefghi",
    ];
    let names = (0..64)
        .flat_map(|len| super::bucket(len).iter().map(|n| n.as_str()))
        .chain(extra);
    for name in names {
        let lower = name.as_bytes();
        assert!(
            lower
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-'),
            "{name} holds only what the comparison folds"
        );
        for at in 0..lower.len() {
            let mut raw = lower.to_vec();
            for b in 0..=255u8 {
                raw[at] = b;
                assert_eq!(
                    super::same_name(lower, &raw),
                    lower.eq_ignore_ascii_case(&raw),
                    "{name} with byte {b:#04x} at {at}"
                );
                compared += 1;
            }
        }
    }
    assert!(compared > 100_000);
    assert!(super::same_name(b"x-api-key", b"X-API-KEY"));
    assert!(!super::same_name(b"x-api-key", b"x-api-ke"));
}
