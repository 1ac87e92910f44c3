//! The chunked transfer coding read off a connection's buffer (RFC 9112 §7.1), in any split of
//! the bytes. Chunk extensions and trailer fields are read past and dropped; a size line or
//! the trailer section beyond its bound is an error, so a hostile peer cannot make it buffer.

use bytes::{Bytes, BytesMut};

/// The longest chunk-size line (with extensions) accepted.
const MAX_LINE: usize = 4 << 10;
/// The most trailer bytes accepted.
const MAX_TRAILERS: usize = 16 << 10;
/// The most chunk-extension bytes accepted over a whole body, size digits beyond
/// [`FREE_DIGITS`] on a line included: beyond it a peer is making legate parse more than it
/// sends data.
const MAX_EXTENSIONS: usize = 16 << 10;
/// Size digits a line may have without counting as extension bytes: a size written at a fixed
/// width (up to a 64-bit value's 16) is a sender's habit, while thousands of leading zeros
/// before each byte of data are a way to make a body cost far more to read than it holds.
const FREE_DIGITS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size,
    Data(u64),
    DataEnd,
    Trailers(usize),
    Done,
}

/// What one step of decoding gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Chunk data, a view of the buffer.
    Data(Bytes),
    /// The body is complete.
    Done,
    /// The buffer holds no further step: read more.
    More,
}

#[derive(Debug)]
pub(crate) struct Decoder {
    state: State,
    /// Chunk-extension bytes seen so far.
    extensions: usize,
}

impl Decoder {
    pub(crate) fn new() -> Self {
        Decoder {
            state: State::Size,
            extensions: 0,
        }
    }

    /// Takes what it can from the front of `buf`.
    pub(crate) fn step(&mut self, buf: &mut BytesMut) -> Result<Step, &'static str> {
        loop {
            match self.state {
                State::Done => return Ok(Step::Done),
                State::Size => {
                    let Some(line) = take_line(buf, MAX_LINE)? else {
                        return Ok(Step::More);
                    };
                    let size = chunk_size(&line)?;
                    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
                    self.extensions += line.len() - digits.min(FREE_DIGITS);
                    if self.extensions > MAX_EXTENSIONS {
                        return Err("too many chunk extensions");
                    }
                    self.state = if size == 0 {
                        State::Trailers(0)
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let n = left.min(buf.len() as u64);
                    let data = buf.split_to(n as usize).freeze();
                    self.state = match left - n {
                        0 => State::DataEnd,
                        rest => State::Data(rest),
                    };
                    return Ok(Step::Data(data));
                }
                State::DataEnd => match buf.first() {
                    None => return Ok(Step::More),
                    Some(b'\n') => {
                        let _ = buf.split_to(1);
                        self.state = State::Size;
                    }
                    Some(b'\r') if buf.len() < 2 => return Ok(Step::More),
                    Some(b'\r') if buf[1] == b'\n' => {
                        let _ = buf.split_to(2);
                        self.state = State::Size;
                    }
                    Some(_) => return Err("chunk data longer than its size"),
                },
                State::Trailers(seen) => {
                    let Some(line) = take_line(buf, MAX_TRAILERS.saturating_sub(seen))? else {
                        return Ok(Step::More);
                    };
                    self.state = if line.is_empty() {
                        State::Done
                    } else {
                        State::Trailers(seen + line.len() + 2)
                    };
                }
            }
        }
    }
}

/// The next line (without its CRLF or LF) off the front of `buf`; `None` until it is whole.
fn take_line(buf: &mut BytesMut, max: usize) -> Result<Option<BytesMut>, &'static str> {
    match memchr::memchr(b'\n', buf) {
        Some(i) if i > max => Err("chunked line too long"),
        Some(i) => {
            let mut line = buf.split_to(i + 1);
            line.truncate(i);
            if line.last() == Some(&b'\r') {
                line.truncate(i - 1);
            }
            Ok(Some(line))
        }
        None if buf.len() > max => Err("chunked line too long"),
        None => Ok(None),
    }
}

/// The hex size at the start of a chunk-size line (extensions after `;` ignored).
fn chunk_size(line: &[u8]) -> Result<u64, &'static str> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = line[digits..].trim_ascii_start();
    // Leading zeros do not count towards the 15 digits a size may have.
    let zeros = line[..digits].iter().take_while(|b| **b == b'0').count();
    let significant = &line[zeros..digits];
    if digits == 0 || significant.len() > 15 || !(rest.is_empty() || rest[0] == b';') {
        return Err("invalid chunk size");
    }
    let mut n = 0u64;
    for &d in significant {
        n = n * 16 + u64::from((d as char).to_digit(16).unwrap_or(0));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `raw` fed in pieces of `split` bytes; the data, and whether it completed.
    fn decode(raw: &[u8], split: usize) -> Result<(Vec<u8>, bool), &'static str> {
        let mut dec = Decoder::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in raw.chunks(split) {
            buf.extend_from_slice(piece);
            loop {
                match dec.step(&mut buf)? {
                    Step::Data(d) => out.extend_from_slice(&d),
                    Step::Done => return Ok((out, true)),
                    Step::More => break,
                }
            }
        }
        Ok((out, false))
    }

    #[test]
    fn any_split_decodes_the_same() {
        let raw =
            b"5;ext=1\r\nhello\r\n000000000000000000A\r\n0123456789\r\n0\r\nx-trailer: t\r\n\r\n";
        for split in 1..raw.len() {
            let (data, done) = decode(raw, split).unwrap();
            assert_eq!(data, b"hello0123456789", "split {split}");
            assert!(done);
        }
    }

    #[test]
    fn a_cut_body_is_not_complete() {
        let (data, done) = decode(b"5\r\nhel", 64).unwrap();
        assert_eq!(data, b"hel");
        assert!(!done);
        let (_, done) = decode(b"5\r\nhello\r\n0\r\n", 64).unwrap();
        assert!(!done, "no end of trailers yet");
    }

    #[test]
    fn bad_and_oversize_input_is_an_error() {
        assert!(decode(b"zz\r\n", 64).is_err());
        assert!(decode(b"5\r\nhelloXX", 64).is_err());
        assert!(decode(b"ffffffffffffffff\r\n", 64).is_err());
        let long = vec![b'1'; MAX_LINE + 2];
        assert!(decode(&long, 1024).is_err());
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(std::iter::repeat_n(b"x: y\r\n".as_slice(), 4000).flatten());
        assert!(decode(&trailers, 512).is_err());
        let mut chatty = Vec::new();
        for _ in 0..20 {
            chatty.extend_from_slice(format!("1;{}\r\na\r\n", "x".repeat(1000)).as_bytes());
        }
        assert_eq!(
            decode(&chatty, 4096).err(),
            Some("too many chunk extensions")
        );
    }

    #[test]
    fn sizes_padded_past_sixteen_digits_count_as_extensions() {
        // A fixed-width size (16 digits) costs nothing, however many chunks carry one.
        let mut fixed = Vec::new();
        for _ in 0..5000 {
            fixed.extend_from_slice(b"0000000000000001\r\na\r\n");
        }
        fixed.extend_from_slice(b"0\r\n\r\n");
        let (data, done) = decode(&fixed, 4096).unwrap();
        assert_eq!((data.len(), done), (5000, true));
        // 4,000 zeros before each byte: a few lines in, the body is refused.
        let mut padded = Vec::new();
        for _ in 0..20 {
            padded.extend_from_slice(format!("{}1\r\na\r\n", "0".repeat(4000)).as_bytes());
        }
        assert_eq!(
            decode(&padded, 4096).err(),
            Some("too many chunk extensions")
        );
    }
}
