//! Starting a mock provider and legate for one test (in process, or the real binary as its own
//! process), and reading what they saw.

use std::collections::HashMap;
use std::process::Stdio;

use legate::mock::{MockServer, Script};
use legate::server::RunningServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub(crate) const ANTHROPIC_KEY: &str = "sk-ant-CANARY-provider-4f9a1c";
pub(crate) const OPENAI_KEY: &str = "sk-CANARY-openai-77b2e0";

pub(crate) struct Env {
    pub mock: MockServer,
    pub legate: RunningServer,
    pub registry: prometheus::Registry,
    pub http: reqwest::Client,
}

/// A config with both providers pointing at the mock. `extra` is appended (models, clients,
/// prices...). `{MOCK}` in `extra` is replaced by the mock's base URL.
pub(crate) fn config_toml(mock_url: &str, extra: &str) -> String {
    config_toml_with(mock_url, "", "", extra)
}

/// Like `config_toml`, with extra `[server]` keys and extra keys for both providers.
pub(crate) fn config_toml_with(
    mock_url: &str,
    server: &str,
    provider: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
shutdown_grace = "5s"
{server}

[providers.anthropic]
kind = "anthropic"
base_url = "{mock_url}"
api_key_env = "ANTHROPIC_API_KEY"
first_byte_timeout = "5s"
idle_timeout = "5s"
{provider}

[providers.openai]
kind = "openai"
base_url = "{mock_url}"
api_key_env = "OPENAI_API_KEY"
first_byte_timeout = "5s"
idle_timeout = "5s"
{provider}

[routing]
anthropic = "anthropic"
openai = "openai"

{extra}
"#,
        extra = extra.replace("{MOCK}", mock_url)
    )
}

pub(crate) fn test_env_vars() -> HashMap<String, String> {
    HashMap::from([
        ("ANTHROPIC_API_KEY".to_string(), ANTHROPIC_KEY.to_string()),
        ("OPENAI_API_KEY".to_string(), OPENAI_KEY.to_string()),
    ])
}

pub(crate) async fn start_with(script: Script, extra: &str) -> Env {
    let mock = MockServer::start(([127, 0, 0, 1], 0).into(), script, None)
        .await
        .expect("mock starts");
    start_against(mock, extra).await
}

pub(crate) async fn start_against(mock: MockServer, extra: &str) -> Env {
    let toml = config_toml(&mock.base_url(), extra);
    start_toml(mock, &toml).await
}

/// Starts legate on a full config text against an already running mock.
/// legate on `toml`, whose providers point at an upstream of the test's own (a raw or
/// HTTP/2 stand-in): the harness's mock stands by unused.
pub(crate) async fn start_alone(toml: &str) -> Env {
    start_toml(start_mock(legate::mock::Script::default()).await, toml).await
}

pub(crate) async fn start_toml(mock: MockServer, toml: &str) -> Env {
    let cfg = legate::config::load_str(toml, &test_env_vars()).expect("test config is valid");
    let registry = prometheus::Registry::new();
    let legate = legate::server::start(cfg, registry.clone())
        .await
        .expect("legate starts");
    Env {
        mock,
        legate,
        registry,
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client builds"),
    }
}

pub(crate) async fn start_mock(script: Script) -> MockServer {
    MockServer::start(([127, 0, 0, 1], 0).into(), script, None)
        .await
        .expect("mock starts")
}

pub(crate) async fn start(extra: &str) -> Env {
    start_with(Script::default(), extra).await
}

impl Env {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.legate.data_addr, path)
    }

    pub(crate) fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.legate.admin_addr, path)
    }

    /// Writes `raw` on a connection of its own and returns all legate writes until it closes
    /// the connection (within 10 s, or the test fails): for a request that asks for the close,
    /// or one legate closes the connection after.
    pub(crate) async fn raw_exchange(&self, raw: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut sock = tokio::net::TcpStream::connect(self.legate.data_addr)
            .await
            .unwrap();
        sock.write_all(raw.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            sock.read_to_end(&mut got),
        )
        .await
        .expect("legate answers and closes")
        .unwrap();
        String::from_utf8_lossy(&got).into_owned()
    }

    pub(crate) fn script(&self, json: &str) {
        self.mock
            .set_script(Script::from_json(json).expect("test script is valid"));
    }

    /// POST /v1/messages with Anthropic-SDK-like headers.
    pub(crate) async fn messages(&self, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.messages_via(&self.http, body).await
    }

    /// [`Env::messages`] through another client (its own connections).
    pub(crate) async fn messages_via(
        &self,
        http: &reqwest::Client,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        http.post(self.url("/v1/messages"))
            .header("x-api-key", "dummy-client-key")
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request reaches legate")
    }

    pub(crate) async fn chat(&self, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.openai("/v1/chat/completions", body).await
    }

    pub(crate) async fn responses(&self, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.openai("/v1/responses", body).await
    }

    /// A JSON POST to `path` as an OpenAI SDK sends it (a bearer credential).
    async fn openai(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .header("authorization", "Bearer dummy-client-key")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request reaches legate")
    }

    pub(crate) async fn metrics_text(&self) -> String {
        legate::telemetry::render(&self.registry)
    }

    /// Value of one sample of `name` whose labels include all of `labels`.
    pub(crate) async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = self.metrics_text().await;
        metric_value(&text, name, labels)
    }

    /// Waits (up to 10 s) until the sample of `name` with `labels` reads `want`: a poll of
    /// the condition itself, pausing 10 ms between looks.
    pub(crate) async fn wait_metric(&self, name: &str, labels: &[(&str, &str)], want: f64) {
        let wait = async {
            while self.metric(name, labels).await != Some(want) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("{name}{labels:?} never reached {want}"));
    }
}

pub(crate) fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("metrics parse");
    let mut total = None;
    for s in scrape.samples {
        if s.metric != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| s.labels.get(k).is_some_and(|x| x == *v))
        {
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => continue,
            };
            total = Some(total.unwrap_or(0.0) + v);
        }
    }
    total
}

pub(crate) fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// All values of a header (lowercase name) in a recorded upstream request.
pub(crate) fn header_values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Starts legate on a config file that reload re-reads (the test env vars apply).
pub(crate) async fn start_file(mock: MockServer, path: &std::path::Path) -> Env {
    let env = test_env_vars();
    let p = path.to_path_buf();
    let source: legate::server::ConfigSource = std::sync::Arc::new(move || {
        legate::config::load_with_env(Some(&p), &env).map(|(cfg, _)| cfg)
    });
    let cfg = source().expect("test config is valid");
    let registry = prometheus::Registry::new();
    let legate = legate::server::start_reloadable(cfg, registry.clone(), Some(source))
        .await
        .expect("legate starts");
    Env {
        mock,
        legate,
        registry,
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client builds"),
    }
}

impl Env {
    /// GET an admin-plane JSON document (`/admin/state`, `/admin/usage`).
    pub(crate) async fn admin_json(&self, path: &str) -> serde_json::Value {
        self.http
            .get(self.admin_url(path))
            .send()
            .await
            .expect("admin plane answers")
            .json()
            .await
            .expect("admin documents are JSON")
    }
}

// The real binary as a separate process (binary, check, access_log, cloud_secrets).

/// GET a JSON document from a spawned binary (`{admin}/admin/state`).
pub(crate) async fn get_json(url: &str) -> serde_json::Value {
    reqwest::get(url)
        .await
        .expect("the binary answers")
        .json()
        .await
        .expect("a JSON document")
}

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_legate");

/// Spawns the binary and returns it with the first stdout line (the listening line).
pub(crate) async fn spawn(
    args: &[&str],
    envs: &[(&str, &str)],
    stderr_to: Option<&std::path::Path>,
) -> (Child, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("LEGATE_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("TOKIO_WORKER_THREADS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    match stderr_to {
        Some(p) => cmd.stderr(std::fs::File::create(p).unwrap()),
        None => cmd.stderr(Stdio::null()),
    };
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next_line().await.unwrap().expect("a listening line");
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, line)
}

/// "legate listening on http://A (admin http://B)" -> (A, B)
pub(crate) fn addrs(line: &str) -> (String, String) {
    let mut urls = line
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter(|w| w.starts_with("http://"));
    let data = urls.next().unwrap().to_string();
    let admin = urls.next().unwrap().to_string();
    (data, admin)
}

/// `legate mock --listen 127.0.0.1:0` and `args` as its own process, with its base URL.
pub(crate) async fn spawn_mock(args: &[&str]) -> (Child, String) {
    let mut all = vec!["mock", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let (child, line) = spawn(&all, &[], None).await;
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    (child, url)
}

pub(crate) fn sigterm(child: &Child) {
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// One HTTP/1 message off `sock` (a request or an answer, its body framed by its
/// `content-length`, none meaning empty): its head as text and its body. What came after it
/// stays in `buf` for the next one; `None` if the peer closed first.
pub(crate) async fn read_message(
    sock: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[end..end + len].to_vec();
    buf.drain(..end + len);
    Some((head, body))
}
