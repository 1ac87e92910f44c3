//! `legate mock`: a scripted fake provider speaking the Anthropic Messages, OpenAI Chat
//! Completions and OpenAI Responses APIs, with fault injection (error statuses, delays, hangs,
//! mid-stream errors, cuts and stalls). Tests, benchmarks and the offline quick start run legate against it, and
//! users drill their agents with it.
//!
//! Data plane: `POST /v1/messages`, `POST /v1/messages/count_tokens`, `GET /v1/models`,
//! `POST /v1/chat/completions`, `POST /v1/responses`, `POST /v1/responses/input_tokens`,
//! `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`,
//! `GET /v1/responses/{id}/input_items` (the mock keeps no conversations: a stored response
//! is the default reply under the asked id); anything else is a 404 in the matching shape.
//! Control plane on the same listener: `GET /_mock/requests`, `GET /_mock/stats`, `POST /_mock/reset`,
//! `PUT /_mock/script`.
//!
//! Script rules beyond the format itself:
//! - Queued replies apply to `/v1/messages`, `/v1/chat/completions` and `/v1/responses`.
//!   `count_tokens`, `input_tokens`, the stored-response endpoints and `models` take only
//!   queued replies whose `match.path` names them, and otherwise answer normally; the `default` reply never applies to them.
//! - `match` may also hold `"stream": true|false`.
//! - A `body` that is a JSON string is sent verbatim as text (an HTML error page, say); any
//!   other JSON value is sent as `application/json`. Scripted `headers` override the mock's.
//! - Content blocks: `text`, `tool_use` (`id` optional) and `thinking` (Anthropic; a
//!   reasoning summary in the Responses API).
//! - Missing `usage` fields default to input 10, output 5, cache 0.
//! - On a non-streaming response, `cut_after` / `hang_after` (whatever N) send the first half
//!   of the document and then cut or stall; `stream_error_after` does not apply there. At most
//!   one of the three may be set. A fault whose N exceeds the stream's event count never fires.
//! - A mid-stream error is `overloaded_error` / "Overloaded" unless `error_type` /
//!   `error_message` say otherwise.
//! - A Responses stream error is an `error` event followed by `response.failed`.
//!   `"drop_terminal": true` ends a stream cleanly without its terminal event (`message_stop`,
//!   `[DONE]`, `response.completed`).
//! - `POST /_mock/reset` clears the recorded requests and the counters (not `inflight`, and not
//!   the script's remaining uses); setting a script re-arms every entry.
mod anthropic;
mod body;
mod cloud;
mod control;
mod handler;
mod openai;
mod parse;
mod render;
mod reply;
mod responses;
mod script;
mod server;
mod state;

#[cfg(test)]
mod tests;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use cloud::CloudOptions;
pub use script::Script;
pub use server::MockServer;
pub use state::{MockStats, RecordedRequest};

/// Where `legate mock` listens when not told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8790";

/// `legate mock [--listen ADDR] [--script FILE]`: serves until SIGTERM or Ctrl-C. Prints exactly
/// one line, `legate mock listening on http://ADDR`, once the port is bound.
pub async fn run(
    listen: SocketAddr,
    script_file: Option<PathBuf>,
    cloud: Option<CloudOptions>,
) -> Result<(), String> {
    let script = match &script_file {
        Some(path) => {
            let text = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| format!("cannot read script {}: {e}", path.display()))?;
            Script::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Script::default(),
    };
    // Signal handlers go in before the line is printed: whoever reads it may signal at once.
    let stop = StopSignal::install()?;
    let server = MockServer::start_with(listen, script, None, cloud)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "legate mock listening on http://{}", server.addr())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(out);
    stop.wait().await;
    server.shutdown().await;
    Ok(())
}

/// SIGTERM or Ctrl-C.
struct StopSignal {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignal {
    #[cfg(unix)]
    fn install() -> Result<StopSignal, String> {
        use tokio::signal::unix::{SignalKind, signal};
        let failed = |e: std::io::Error| format!("cannot install signal handlers: {e}");
        Ok(StopSignal {
            term: signal(SignalKind::terminate()).map_err(failed)?,
            interrupt: signal(SignalKind::interrupt()).map_err(failed)?,
        })
    }

    #[cfg(not(unix))]
    fn install() -> Result<StopSignal, String> {
        Ok(StopSignal {})
    }

    #[cfg(unix)]
    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }

    #[cfg(not(unix))]
    async fn wait(self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}
