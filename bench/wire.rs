//! The load generator's HTTP side: a deliberately small HTTP/1.1 client over one TCP connection
//! (TCP_NODELAY, keep-alive, one request at a time), with the request bytes encoded once.
//!
//! Why not a full client library: the load generator shares the machine's cores with the
//! processes it measures, so whatever it spends per request is taken from them, and a heavier
//! client compresses the difference between the sides (a side can never be faster than the
//! client feeding it). Writing prepared bytes and parsing only the status line, the framing
//! headers and the body framing keeps the client's own cost to a few system calls per request,
//! like an outside load generator's.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::BenchError;

/// Largest response head or body the client accepts; the benchmark's answers are far smaller.
const MAX_RESPONSE: usize = 1 << 20;

/// One keep-alive connection.
pub(crate) struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// What came back: the status and when the first body byte was seen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reply {
    pub status: u16,
    pub first_byte: Option<Instant>,
}

/// How the body of a response is delimited.
enum Framing {
    Length(usize),
    Chunked,
    /// No body (`content-length: 0`, or a status without one).
    Empty,
}

impl Conn {
    pub(crate) async fn open(addr: SocketAddr) -> Result<Conn, BenchError> {
        let stream = TcpStream::connect(addr).await.map_err(BenchError::Wire)?;
        // Without it Nagle's algorithm would hold small writes and dwarf what is measured.
        stream.set_nodelay(true).map_err(BenchError::Wire)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 << 10),
        })
    }

    /// Writes `request` and reads the whole response.
    pub(crate) async fn exchange(&mut self, request: &[u8]) -> Result<Reply, BenchError> {
        self.stream
            .write_all(request)
            .await
            .map_err(BenchError::Wire)?;
        self.buf.clear();
        let head_end = loop {
            if let Some(p) = find(&self.buf, b"\r\n\r\n") {
                break p + 4;
            }
            self.fill().await?;
        };
        let (status, framing) = parse_head(&self.buf[..head_end])?;
        let mut first_byte = (self.buf.len() > head_end).then(Instant::now);
        match framing {
            Framing::Empty => {}
            Framing::Length(n) => {
                while self.buf.len() < head_end + n {
                    self.fill().await?;
                    first_byte.get_or_insert_with(Instant::now);
                }
            }
            Framing::Chunked => self.read_chunks(head_end, &mut first_byte).await?,
        }
        Ok(Reply { status, first_byte })
    }

    /// Reads a chunked body that starts at `pos` to its last chunk.
    async fn read_chunks(
        &mut self,
        mut pos: usize,
        first_byte: &mut Option<Instant>,
    ) -> Result<(), BenchError> {
        loop {
            let line_end = loop {
                if let Some(p) = find(&self.buf[pos..], b"\r\n") {
                    break pos + p;
                }
                self.fill().await?;
            };
            let size = chunk_size(&self.buf[pos..line_end])?;
            pos = line_end + 2;
            if size == 0 {
                // No trailers are expected: the last chunk ends with an empty line.
                while self.buf.len() < pos + 2 {
                    self.fill().await?;
                }
                return Ok(());
            }
            while self.buf.len() < pos + 1 {
                self.fill().await?;
            }
            first_byte.get_or_insert_with(Instant::now);
            while self.buf.len() < pos + size + 2 {
                self.fill().await?;
            }
            pos += size + 2;
        }
    }

    async fn fill(&mut self) -> Result<(), BenchError> {
        if self.buf.len() >= MAX_RESPONSE {
            return Err(BenchError::Protocol("response larger than 1 MiB"));
        }
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 << 10);
        }
        let n = self
            .stream
            .read_buf(&mut self.buf)
            .await
            .map_err(BenchError::Wire)?;
        if n == 0 {
            return Err(BenchError::Protocol("connection closed mid-response"));
        }
        Ok(())
    }
}

/// Encodes a request once: `host` is the `Host` header, `headers` are `name: value` pairs.
pub(crate) fn request(
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Bytes {
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n");
    for (name, value) in headers {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    if !body.is_empty() || method != "GET" {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    out.push_str(body);
    Bytes::from(out)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The status code and body framing of a response head (status line and headers, CRLF-ended).
fn parse_head(head: &[u8]) -> Result<(u16, Framing), BenchError> {
    let text = std::str::from_utf8(head).map_err(|_| BenchError::Protocol("head not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.strip_prefix("HTTP/1.1 "))
        .and_then(|l| l.get(..3))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or(BenchError::Protocol("bad status line"))?;
    let mut framing = Framing::Empty;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| BenchError::Protocol("bad content-length"))?;
            framing = if n == 0 {
                Framing::Empty
            } else {
                Framing::Length(n)
            };
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.eq_ignore_ascii_case("chunked")
        {
            framing = Framing::Chunked;
        }
    }
    Ok((status, framing))
}

fn chunk_size(line: &[u8]) -> Result<usize, BenchError> {
    let text = std::str::from_utf8(line).map_err(|_| BenchError::Protocol("bad chunk size"))?;
    let hex = text.split(';').next().unwrap_or("").trim();
    let size =
        usize::from_str_radix(hex, 16).map_err(|_| BenchError::Protocol("bad chunk size"))?;
    if size > MAX_RESPONSE {
        return Err(BenchError::Protocol("chunk larger than 1 MiB"));
    }
    Ok(size)
}

/// Checks of the parser, run by the benchmark at start-up.
pub(crate) fn self_check() -> Result<(), String> {
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n";
    match parse_head(head) {
        Ok((200, Framing::Length(12))) => {}
        _ => return Err("content-length head misparsed".to_owned()),
    }
    let head = b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n";
    match parse_head(head) {
        Ok((201, Framing::Chunked)) => {}
        _ => return Err("chunked head misparsed".to_owned()),
    }
    if chunk_size(b"1a;ext=1").ok() != Some(26) || find(b"ab\r\n\r\ncd", b"\r\n\r\n") != Some(2) {
        return Err("chunk size or head end misparsed".to_owned());
    }
    Ok(())
}

/// Resolves `http://127.0.0.1:PORT` to its socket address.
pub(crate) fn address(base_url: &str) -> Result<SocketAddr, BenchError> {
    base_url
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .ok_or(BenchError::Protocol("base URL is not http://IP:PORT"))
}
