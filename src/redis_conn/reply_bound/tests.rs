use super::*;

/// Feeds `bytes` in pieces of every size from 1 up, so that no split point is missed.
fn feed_split(max: usize, bytes: &[u8]) -> Result<(), &'static str> {
    let mut result = Ok(());
    for piece in 1..=bytes.len().max(1) {
        let mut bound = ReplyBound::new(max);
        let fed = bytes.chunks(piece).try_for_each(|c| bound.feed(c));
        if piece > 1 {
            assert_eq!(fed, result, "piece {piece} judged otherwise than piece 1");
        }
        if fed.is_ok() {
            assert!(matches!(bound.state, State::Type), "{:?}", bound.state);
            assert!(bound.open.is_empty(), "{:?}", bound.open);
            assert_eq!(bound.used, 0, "a whole reply ends its count");
        }
        result = fed;
    }
    result
}

#[test]
fn every_kind_of_reply_is_followed_to_its_end() {
    let replies: &[&[u8]] = &[
        b"+OK\r\n",
        b"-ERR no such key\r\n",
        b":42\r\n:-7\r\n",
        b"$5\r\nhello\r\n",
        b"$0\r\n\r\n",
        b"$-1\r\n",
        b"*-1\r\n*0\r\n",
        b"*2\r\n:0\r\n:1500\r\n",
        // A bulk body may hold CRLF and type bytes: it is skipped by its length.
        b"$5\r\n*9\r\n$\r\n",
        b"*3\r\n*2\r\n$1\r\na\r\n$-1\r\n*0\r\n+x\r\n",
        // RESP3: null, double, boolean, big number, blob error, verbatim, map, set, push,
        // and an attribute ahead of the value it describes.
        b"_\r\n,1.5\r\n#t\r\n(123456789012345678901234567890\r\n",
        b"!3\r\nERR\r\n=8\r\ntxt:hiya\r\n",
        b"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n:2\r\n",
        b"~2\r\n:1\r\n:2\r\n>3\r\n+message\r\n+ch\r\n$2\r\nhi\r\n",
        b"|1\r\n+ttl\r\n:3\r\n$2\r\nok\r\n",
    ];
    for reply in replies {
        assert_eq!(
            feed_split(4096, reply),
            Ok(()),
            "{}",
            String::from_utf8_lossy(reply)
        );
    }
}

#[test]
fn a_reply_past_its_bound_is_refused_and_the_bound_is_per_reply() {
    // 5 + 10 + 2 = 17 bytes.
    let reply = b"$10\r\n0123456789\r\n";
    assert_eq!(feed_split(17, reply), Ok(()));
    assert!(feed_split(16, reply).is_err());
    // Many replies, each within the bound, however many in all.
    assert_eq!(feed_split(17, &reply.repeat(20)), Ok(()));
    // A simple string with no end is cut at the bound.
    let mut endless = ReplyBound::new(1000);
    endless.feed(b"+").unwrap();
    assert!((0..100).any(|_| endless.feed(&[b'a'; 64]).is_err()));
    // Small items add up within an aggregate, each with the value it becomes.
    let many = [b"*50\r\n".as_slice(), &b":1\r\n".repeat(50)].concat();
    let cost = many.len() + 50 * ITEM_COST as usize;
    assert_eq!(feed_split(cost, &many), Ok(()));
    assert!(feed_split(cost - 1, &many).is_err());
    // A million nulls are 3 MB on the wire and far more once parsed: refused at the count.
    let mut nulls = ReplyBound::new(4 << 20);
    assert!(nulls.feed(b"*1000000\r\n").is_err());
}

#[test]
fn a_line_ends_at_crlf_only() {
    // `+a\n` repeated is one line that never ends, as the client's parser reads it: cut at
    // the bound, not taken as many small replies.
    let mut flood = ReplyBound::new(64 * 1024);
    assert!((0..100_000).any(|_| flood.feed(b"+a\n").is_err()));
    // A bare `\n` inside a simple string is content; a `\r` alone too.
    assert_eq!(feed_split(64, b"+a\nb\rc\r\n"), Ok(()));
    // In a length it is not a number.
    assert!(ReplyBound::new(64).feed(b"$3\n").is_err());
}

#[test]
fn a_size_declared_past_the_bound_is_refused_before_its_bytes_arrive() {
    for head in [
        b"$1073741824\r\n".as_slice(),
        b"*2147483647\r\n",
        b"*9223372036854775807\r\n",
        b"%100000\r\n",
        b"|100000\r\n",
        b"!99999\r\n",
        b"$99999999999999999999999\r\n",
    ] {
        let mut bound = ReplyBound::new(64 * 1024);
        assert!(
            bound.feed(head).is_err(),
            "{}",
            String::from_utf8_lossy(head)
        );
    }
}

#[test]
fn what_is_not_resp_is_refused() {
    for bad in [
        b"\x00\xffGARBAGE\r\n".as_slice(),
        b"$abc\r\n",
        b"*\r\n",
        b"$--1\r\n",
        b"!-1\r\n",
        b"%-1\r\n",
        b"$?\r\n",
    ] {
        let mut bound = ReplyBound::new(1 << 20);
        assert!(bound.feed(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    let mut deep = ReplyBound::new(1 << 20);
    assert!(deep.feed(&b"*1\r\n".repeat(MAX_DEPTH + 1)).is_err());
    let mut ok = ReplyBound::new(1 << 20);
    let nested = [b"*1\r\n".repeat(MAX_DEPTH).as_slice(), b":1\r\n"].concat();
    assert_eq!(ok.feed(&nested), Ok(()));
    assert!(ok.open.is_empty());
}

#[tokio::test]
async fn the_stream_fails_once_a_reply_passes_its_bound() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (client, mut server) = tokio::io::duplex(1 << 16);
    let too_large = Arc::new(AtomicBool::new(false));
    let mut capped = Capped::new(client, 1024, too_large.clone());
    server.write_all(b"+OK\r\n$2000\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let err = loop {
        match capped.read(&mut buf).await {
            Ok(0) => panic!("the stream ended instead of failing"),
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(
        too_large.load(Ordering::Acquire),
        "a refusal for size is told apart"
    );
    // Writes pass through untouched.
    capped.write_all(b"PING\r\n").await.unwrap();
    let mut got = [0u8; 6];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"PING\r\n");
}
