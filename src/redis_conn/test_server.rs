//! A real `redis-server` for unit tests (skipped when none is installed, unless `CI` is set).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A `redis-server` child on a free loopback port, killed when dropped.
pub(crate) struct RedisServer {
    child: Child,
    pub(crate) port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// None (after saying so) when redis-server is not installed; under CI that is a failure.
    pub(crate) fn start() -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(
                std::env::var_os("CI").is_none(),
                "redis-server is not installed (apt-get install -y redis-server); CI needs it"
            );
            eprintln!("redis-server is not installed: skipping the Redis tests");
            return None;
        }
        Some(Self::start_on(free_port()))
    }

    pub(crate) fn start_on(port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = RedisServer {
            child,
            port,
            _dir: dir,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        for _ in 0..200 {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "redis-server exited"
            );
            if pong(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not answer PING within 5 s");
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

fn pong(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut buf = [0u8; 5];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG"
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stand-in Redis on a loopback port: each command it reads (its arguments) is answered, in
/// order, with what `answer` returns for it, or with nothing when that is None.
pub(crate) async fn stand_in<F>(answer: F) -> u16
where
    F: Fn(&[Vec<u8>]) -> Option<Vec<u8>> + Send + Sync + 'static,
{
    use tokio::io::{AsyncWriteExt, BufReader};
    let answer = std::sync::Arc::new(answer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut r = BufReader::new(r);
                while let Some(args) = read_command(&mut r).await {
                    if let Some(reply) = answer(&args)
                        && w.write_all(&reply).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// One command: an array of bulk strings. None at the end of the stream, or on anything else.
async fn read_command<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Option<Vec<Vec<u8>>> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut line = String::new();
    r.read_line(&mut line).await.ok().filter(|&n| n > 0)?;
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).await.ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0u8; len + 2];
        r.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        args.push(arg);
    }
    Some(args)
}
