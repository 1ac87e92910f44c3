//! The admin plane: health, readiness, metrics and state. It never calls a model: upstream
//! health comes from live traffic. Nothing here renders a secret.
//!
//! The data plane may run on a single runtime worker, so what takes more than a moment here —
//! rendering `/metrics`, the usage ledger or the journal, re-reading the config — runs on the
//! blocking pool: a scrape or a reload never holds up the requests in flight.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::server::CallerBody;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use prometheus::Registry;

use crate::proxy::Proxy;
use crate::proxy::buffers::{self, AnswerShare, BufferBudget, BufferShare};

pub struct Admin {
    pub proxy: Arc<Proxy>,
    pub registry: Registry,
    /// True once the data plane listens; false again when draining.
    pub ready: AtomicBool,
    pub reloader: Arc<crate::server::Reloader>,
    /// Answers of this plane held until their last byte is written ([`HELD_MAX`]).
    pub held: Arc<BufferBudget>,
    /// The address the plane listens on: on loopback, a request must name this machine in
    /// its `Host` ([`foreign_host`]).
    pub listen_ip: std::net::IpAddr,
}

/// The admin plane's answers held at once, over all its connections: past 64 KiB each (a
/// large journal or usage ledger, a scrape of many series) until the connection has written
/// its last byte. Over HTTP/2 one connection may ask for the same large answer on a hundred
/// streams and read none of them; each would be a copy held until the idle timeout. Past this,
/// an answer is refused with 503 instead.
const HELD_MAX: usize = 32 << 20;

/// A request to a loopback admin plane whose `Host` names another machine: a web page that
/// had a browser on this machine resolve its own name to 127.0.0.1 (DNS rebinding), whose
/// reads count as same-origin and carry no `Origin`; it would read the journal's captured
/// prompts or reload the config. On a plane listening beyond loopback (the pod network, for
/// the kubelet's probes and Prometheus, which name the pod's address) any `Host` is served:
/// the network reaches it anyway.
fn foreign_host<B>(req: &Request<B>, listen_ip: std::net::IpAddr) -> bool {
    if !crate::loopback::is_loopback_ip(listen_ip) {
        return false;
    }
    let foreign = |h: &str| !crate::proxy::inbound::host_is_local(h, listen_ip);
    // An absolute-form target's authority stands for `Host` (RFC 9112 §3.2.2): both must be
    // this machine.
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    host.is_some_and(foreign) || req.uri().authority().is_some_and(|a| foreign(a.as_str()))
}

impl Admin {
    pub async fn handle(
        self: Arc<Self>,
        req: Request<CallerBody>,
        peer: std::net::SocketAddr,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        if crate::proxy::inbound::check_origin(req.headers()).is_err() {
            // A web page must not reload the config or read the state.
            return Ok(json(
                StatusCode::FORBIDDEN,
                &serde_json::json!({"error": "requests from web pages (a non-loopback Origin) are refused"}),
            ));
        }
        if foreign_host(&req, self.listen_ip) {
            return Ok(json(
                StatusCode::FORBIDDEN,
                &serde_json::json!({"error": "the Host header names another machine (DNS rebinding is refused)"}),
            ));
        }
        let probe = matches!(req.uri().path(), "/healthz" | "/readyz");
        if !probe && self.held.used() + buffers::UNCHARGED > HELD_MAX {
            // Full already: refused before it is rendered (a journal list is megabytes of
            // transient work), not after.
            return Ok(held_full());
        }
        // HEAD is GET without the body (RFC 9110 §9.3.2): the connection leaves it out.
        let method = match *req.method() {
            Method::HEAD => &Method::GET,
            ref m => m,
        };
        let resp = match (method, req.uri().path()) {
            (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
            (&Method::GET, "/readyz") => {
                if self.ready.load(Ordering::SeqCst) {
                    text(StatusCode::OK, "ready\n")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }
            (&Method::GET, "/metrics") => {
                // Rate-limit readings whose reset has passed are not exported as current.
                for up in self.proxy.snapshot.load().upstreams.values() {
                    up.pacer.refresh();
                }
                let registry = self.registry.clone();
                let mut r =
                    off_worker(move || text(StatusCode::OK, &crate::telemetry::render(&registry)))
                        .await;
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                r
            }
            (&Method::GET, "/admin/state") => json(StatusCode::OK, &self.state()),
            (&Method::GET, "/admin/usage") => {
                let me = Arc::clone(&self);
                off_worker(move || json(StatusCode::OK, &me.proxy.ledger.to_json())).await
            }
            (&Method::POST, "/admin/reload") => {
                let me = Arc::clone(&self);
                off_worker(move || me.reload(peer)).await
            }
            (&Method::GET, "/admin/requests") => {
                match crate::observe::journal::parse_query(req.uri().query()) {
                    Ok(q) => {
                        let me = Arc::clone(&self);
                        off_worker(move || {
                            json(StatusCode::OK, &me.proxy.observer.journal().list(&q))
                        })
                        .await
                    }
                    Err(e) => json(StatusCode::BAD_REQUEST, &serde_json::json!({"error": e})),
                }
            }
            (&Method::GET, path) if path.starts_with("/admin/requests/") => {
                let id = path["/admin/requests/".len()..].to_owned();
                let me = Arc::clone(&self);
                off_worker(move || match me.proxy.observer.journal().get(&id) {
                    Some(doc) => json(StatusCode::OK, &doc),
                    None => json(
                        StatusCode::NOT_FOUND,
                        &serde_json::json!({"error": "no such request in the journal (it holds the last [journal] size requests)"}),
                    ),
                })
                .await
            }
            (_, path) => {
                // A known path asked with another method is 405 with the one it takes.
                let allowed = match path {
                    "/admin/reload" => Some("POST"),
                    "/healthz" | "/readyz" | "/metrics" | "/admin/state" | "/admin/usage"
                    | "/admin/requests" => Some("GET, HEAD"),
                    p if p.starts_with("/admin/requests/") => Some("GET, HEAD"),
                    _ => None,
                };
                match allowed {
                    Some(allow) => {
                        let mut r = json(
                            StatusCode::METHOD_NOT_ALLOWED,
                            &serde_json::json!({"error": format!("{path} takes {allow}, not {}", crate::error::shown(req.method().as_str()))}),
                        );
                        r.headers_mut()
                            .insert(header::ALLOW, HeaderValue::from_static(allow));
                        r
                    }
                    None => json(
                        StatusCode::NOT_FOUND,
                        &serde_json::json!({"error": "admin endpoints: GET /healthz, /readyz, /metrics, /admin/state, /admin/usage, /admin/requests, /admin/requests/{id}; POST /admin/reload"}),
                    ),
                }
            }
        };
        Ok(self.held(resp).await)
    }

    /// `resp`, its body counted in [`HELD_MAX`] until the last view of it goes; a 503 when it
    /// would pass it.
    async fn held(&self, resp: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
        let (parts, body) = resp.into_parts();
        let bytes = match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(never) => match never {},
        };
        let mut share = AnswerShare::new(&self.held, HELD_MAX);
        let share = if share.grow(bytes.len()) {
            share.into_share()
        } else if bytes.len() > HELD_MAX && self.held.used() == 0 {
            // One answer larger than the whole bound (a journal of many thousand entries) is
            // served when nothing else is held, counted past the bound until it is written.
            Some(BufferShare::new(self.held.clone()))
        } else {
            return held_full();
        };
        Response::from_parts(parts, Full::new(buffers::hold(bytes, share)))
    }

    /// Reload is a write: only callers on this host may ask for it, even when the admin plane
    /// listens on the pod network for probes and scrapes.
    fn reload(&self, peer: std::net::SocketAddr) -> Response<Full<Bytes>> {
        if !crate::loopback::is_loopback_ip(peer.ip()) {
            return json(
                StatusCode::FORBIDDEN,
                &serde_json::json!({"result": "error", "errors": ["POST /admin/reload is accepted from loopback callers only"]}),
            );
        }
        match self.reloader.reload() {
            crate::server::ReloadOutcome::Applied {
                config_hash,
                restart_required,
            } => json(
                StatusCode::OK,
                &serde_json::json!({"result": "ok", "config_hash": config_hash, "restart_required": restart_required}),
            ),
            crate::server::ReloadOutcome::Refused(errors) => json(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({"result": "error", "errors": errors}),
            ),
        }
    }

    fn state(&self) -> serde_json::Value {
        let snap = self.proxy.snapshot.load();
        let mut providers = serde_json::Map::new();
        for (name, p) in &snap.cfg.providers {
            let up = snap.upstreams.get(name);
            providers.insert(
                name.clone(),
                serde_json::json!({
                    "kind": p.platform.kind_name().unwrap_or(p.kind.as_str()),
                    "api": p.kind.as_str(),
                    "base_url": crate::config::adapt::mask_userinfo(&p.base_url),
                    // Source and expiry of a cloud credential, never its value.
                    "credential": up.and_then(|u| u.cloud.as_ref()).and_then(|c| c.state()),
                    "max_concurrency": p.max_concurrency,
                    "inflight": up.map(|u| u.gate.inflight()),
                    "queued": up.map(|u| {
                        let q = u.gate.queued();
                        serde_json::json!({"interactive": q[0], "background": q[1], "batch": q[2]})
                    }),
                    "pacing": up.map(|u| u.pacer.snapshot()),
                    "key_loaded": up.map(|u| u.has_key()),
                }),
            );
        }
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "config_hash": snap.hash,
            "ready": self.ready.load(Ordering::SeqCst),
            "runtime": {
                "worker_threads": self.reloader.worker_threads(),
            },
            "providers": providers,
            "breakers": self.breakers(),
            "buckets": {
                "store": if self.proxy.limiter.is_shared() { "redis" } else { "memory" },
                "degraded": self.proxy.limiter.is_degraded(),
                "local": self.proxy.limiter.local_snapshot(),
            },
        })
    }
}

impl Admin {
    fn breakers(&self) -> serde_json::Value {
        use crate::policy::breaker::State;
        let now = tokio::time::Instant::now();
        let list: Vec<serde_json::Value> = self
            .proxy
            .breakers
            .snapshot()
            .into_iter()
            .map(|(upstream, state)| match state {
                State::Closed => serde_json::json!({"upstream": upstream, "state": "closed"}),
                State::Open { until } => serde_json::json!({
                    "upstream": upstream,
                    "state": "open",
                    "probe_in_ms": until.saturating_duration_since(now).as_millis() as u64,
                }),
                State::HalfOpen { probe_out } => serde_json::json!({
                    "upstream": upstream,
                    "state": "half_open",
                    "probe_in_flight": probe_out,
                }),
            })
            .collect();
        serde_json::Value::Array(list)
    }
}

/// The 503 for an answer past [`HELD_MAX`].
fn held_full() -> Response<Full<Bytes>> {
    tracing::warn!("admin answer refused: the admin plane holds 32 MiB of answers not yet taken");
    let mut r = json(
        StatusCode::SERVICE_UNAVAILABLE,
        &serde_json::json!({"error": "the admin plane holds 32 MiB of answers its callers have not taken yet; read those first, or retry in a second"}),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Runs `answer` on the blocking pool and waits for it without holding the runtime worker.
async fn off_worker(
    answer: impl FnOnce() -> Response<Full<Bytes>> + Send + 'static,
) -> Response<Full<Bytes>> {
    match tokio::task::spawn_blocking(answer).await {
        Ok(r) => r,
        Err(_) => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({"error": "the admin request failed inside legate"}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_host(host: &str) -> Request<()> {
        Request::builder()
            .uri("/healthz")
            .header(header::HOST, host)
            .body(())
            .unwrap()
    }

    #[test]
    fn only_a_loopback_plane_checks_the_host() {
        let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        assert!(foreign_host(&with_host("evil.example:9787"), loopback));
        assert!(!foreign_host(&with_host("localhost:9787"), loopback));
        assert!(!foreign_host(&with_host("[::1]:9787"), loopback));
        // An absolute-form target names the host too.
        let absolute = |target: &str| {
            Request::builder()
                .uri(target)
                .header(header::HOST, "127.0.0.1:9787")
                .body(())
                .unwrap()
        };
        assert!(foreign_host(
            &absolute("http://evil.example/admin/state"),
            loopback
        ));
        assert!(!foreign_host(
            &absolute("http://127.0.0.1:9787/admin/state"),
            loopback
        ));
        // On the pod network the kubelet and Prometheus name the pod's address.
        let pod: std::net::IpAddr = "0.0.0.0".parse().unwrap();
        assert!(!foreign_host(&with_host("10.1.2.3:9787"), pod));
        assert!(!foreign_host(&with_host("evil.example"), pod));
    }
}
