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
