//! nginx as a plain L7 reverse proxy in front of the same mock, the yardstick for what a
//! proxy hop costs: used when an `nginx` binary is installed, skipped (and said so) when not.
//! Its configuration and all its files live in the benchmark's temporary directory; it
//! listens on a loopback port chosen by the kernel and runs in the foreground as a child of
//! the benchmark, so the system's own nginx service is never touched.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// How long nginx may take to accept connections.
const STARTUP_LIMIT: Duration = Duration::from_secs(10);
/// How long a stopping nginx may take before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(5);

/// A running nginx master process (its workers are its children).
pub(crate) struct Nginx {
    child: Child,
    pub base_url: String,
}

/// The nginx binary, if one is installed.
pub(crate) fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
}

/// Starts nginx proxying every request to `mock_url`, with its files under `dir`.
pub(crate) fn start(bin: &Path, dir: &Path, mock_url: &str) -> Result<Nginx, BenchError> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |source| BenchError::Io { what, source }
    };
    let mock = mock_url
        .strip_prefix("http://")
        .ok_or(BenchError::Protocol("mock URL is not http://"))?;
    let addr = free_port().map_err(io("cannot find a free loopback port"))?;
    let root = dir.join("nginx");
    std::fs::create_dir_all(&root).map_err(io("cannot create the nginx directory"))?;
    let conf = root.join("nginx.conf");
    std::fs::write(&conf, config_text(&root, addr, mock)).map_err(io("cannot write nginx.conf"))?;
    let child = Command::new(bin)
        .arg("-p")
        .arg(&root)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(root.join("error.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| BenchError::Spawn {
            what: "nginx",
            source,
        })?;
    let mut nginx = Nginx {
        child,
        base_url: format!("http://{addr}"),
    };
    let until = Instant::now() + STARTUP_LIMIT;
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > until || matches!(nginx.child.try_wait(), Ok(Some(_))) {
            let log = std::fs::read_to_string(root.join("error.log")).unwrap_or_default();
            return Err(BenchError::Startup {
                what: "nginx",
                detail: format!("not accepting on {addr}: {}", log.trim()),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    nginx.settle();
    Ok(nginx)
}

impl Nginx {
    /// The master process; its workers are found through `/proc`.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the workers exist, so the CPU reading covers them from the start.
    fn settle(&mut self) {
        let until = Instant::now() + Duration::from_secs(2);
        while crate::children::children_of(self.pid()).len() < 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Fast shutdown (SIGTERM to the master, which stops its workers), then a kill if it
    /// lingers.
    pub(crate) fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let until = Instant::now() + STOP_LIMIT;
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// A loopback port the kernel just handed out (bound and released at once).
fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// nginx's worker processes, one per core of the benchmark machine; legate gets as many
/// workers (`server.worker_threads`), so that both proxies may use the same cores.
pub(crate) const WORKERS: usize = 2;

/// [`WORKERS`] workers, keep-alive on both sides, responses passed through unbuffered so
/// streams flow event by event, no access log.
fn config_text(root: &Path, addr: SocketAddr, mock: &str) -> String {
    let r = root.display();
    format!(
        r#"daemon off;
master_process on;
worker_processes {WORKERS};
pid {r}/nginx.pid;
error_log {r}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {r}/client_body;
    proxy_temp_path {r}/proxy;
    fastcgi_temp_path {r}/fastcgi;
    uwsgi_temp_path {r}/uwsgi;
    scgi_temp_path {r}/scgi;
    upstream mock {{
        server {mock};
        keepalive 256;
        keepalive_requests 100000000;
    }}
    server {{
        listen {addr};
        keepalive_requests 100000000;
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            tcp_nodelay on;
        }}
    }}
}}
"#
    )
}
