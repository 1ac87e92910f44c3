//! Turns a scripted reply into a response for one API request: status, headers, a generated
//! or raw body, pacing and faults, all in the caller's API shape.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Response, StatusCode};

use super::body::MockBody;
use super::render::Render;
use super::script::{Fault, FaultKind, RawBody, Reply};
use super::state::RequestGuard;
use super::{anthropic, openai, responses};

/// Which provider's shapes a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Anthropic,
    OpenAi,
    /// The OpenAI Responses API: OpenAI's headers and error envelope, its own bodies.
    Responses,
}

fn json_type() -> HeaderValue {
    HeaderValue::from_static("application/json")
}

fn event_stream_type() -> HeaderValue {
    HeaderValue::from_static("text/event-stream; charset=utf-8")
}

fn text_type() -> HeaderValue {
    HeaderValue::from_static("text/plain; charset=utf-8")
}

/// An API request waiting for its response: who asked, under which id, and its counting guard.
pub(crate) struct Answer {
    pub api: Api,
    /// The response number (`req_mock_<id>`).
    pub id: u64,
    pub guard: RequestGuard,
}

/// What the request asked for that shapes a generated body.
pub(crate) struct Asked<'a> {
    pub model: &'a str,
    pub stream: bool,
    pub include_usage: bool,
}

impl Answer {
    fn request_id(&self) -> String {
        format!("req_mock_{}", self.id)
    }

    /// Sends `body` with the id header of the API, then the reply's own headers on top.
    pub(super) fn send(
        self,
        status: StatusCode,
        content_type: HeaderValue,
        body: MockBody,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Response<MockBody> {
        let id_header = match self.api {
            Api::Anthropic => HeaderName::from_static("request-id"),
            Api::OpenAi | Api::Responses => HeaderName::from_static("x-request-id"),
        };
        let id_value = HeaderValue::from_str(&self.request_id());
        let mut response = Response::new(body.with_guard(self.guard));
        *response.status_mut() = status;
        if status.as_u16() == 529 {
            // No standard reason phrase exists for 529; hyper would write a placeholder.
            let phrase = hyper::ext::ReasonPhrase::from_static(b"Overloaded");
            response.extensions_mut().insert(phrase);
        }
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, content_type);
        if let Ok(value) = id_value {
            headers.insert(id_header, value);
        }
        for (name, value) in extra {
            headers.insert(name.clone(), value.clone());
        }
        response
    }

    /// An error in the API's shape.
    pub(super) fn error(
        self,
        status: StatusCode,
        error_type: &str,
        message: &str,
    ) -> Response<MockBody> {
        let body = self.error_body(error_type, message);
        self.send(status, json_type(), MockBody::full(body), &[])
    }

    fn error_body(&self, error_type: &str, message: &str) -> Bytes {
        match self.api {
            Api::Anthropic => anthropic::error(error_type, message, &self.request_id()),
            Api::OpenAi | Api::Responses => openai::error(error_type, message),
        }
    }

    /// A successful JSON document (count_tokens, models), unless the reply says otherwise.
    pub(super) fn document(self, reply: Option<&Reply>, natural: Bytes) -> Response<MockBody> {
        match reply {
            None => self.send(StatusCode::OK, json_type(), MockBody::full(natural), &[]),
            Some(reply) if reply.body.is_some() || !reply.status.is_success() => {
                self.scripted_document(reply)
            }
            Some(reply) => {
                let body = whole(natural, reply.fault);
                self.send(reply.status, json_type(), body, &reply.headers)
            }
        }
    }

    /// A generated Message / chat.completion / response, or its stream.
    pub(super) fn generated(self, reply: &Reply, asked: &Asked<'_>) -> Response<MockBody> {
        if reply.body.is_some() || !reply.status.is_success() {
            return self.scripted_document(reply);
        }
        let model = reply.model.as_deref().unwrap_or(asked.model);
        let render = Render {
            id: self.id,
            model,
            reply,
        };
        if !asked.stream {
            let data = match self.api {
                Api::Anthropic => anthropic::message(&render),
                Api::OpenAi => openai::completion(&render),
                Api::Responses => responses::response(&render),
            };
            return self.send(
                reply.status,
                json_type(),
                whole(data, reply.fault),
                &reply.headers,
            );
        }
        let (error_type, message) = reply.stream_error();
        let (mut events, error_event) = match self.api {
            Api::Anthropic => (
                anthropic::events(&render),
                anthropic::error_event(error_type, message),
            ),
            Api::OpenAi => (
                openai::chunks(&render, asked.include_usage),
                openai::error_event(error_type, message),
            ),
            Api::Responses => {
                let at = reply.fault.map_or(0, |f| f.after);
                (
                    responses::events(&render),
                    responses::error_events(&render, at, error_type, message),
                )
            }
        };
        if reply.drop_terminal {
            // A stream that ends cleanly but without its terminal event.
            events.pop();
        }
        let body = MockBody::events(events)
            .with_gap(reply.event_gap)
            .with_fault(reply.fault, error_event);
        let mut headers = vec![(CACHE_CONTROL, HeaderValue::from_static("no-cache"))];
        headers.extend(reply.headers.iter().cloned());
        self.send(reply.status, event_stream_type(), body, &headers)
    }

    /// The reply's raw body, or an error body for its non-2xx status.
    fn scripted_document(self, reply: &Reply) -> Response<MockBody> {
        let (content_type, data) = match &reply.body {
            Some(RawBody::Json(data)) => (json_type(), data.clone()),
            Some(RawBody::Text(data)) => (text_type(), data.clone()),
            None => (
                json_type(),
                self.error_body(reply.error_type(), reply.error_message()),
            ),
        };
        self.send(
            reply.status,
            content_type,
            whole(data, reply.fault),
            &reply.headers,
        )
    }
}

/// A non-streaming body: a cut or hang fault breaks it in the middle; an error event has no
/// place in a JSON document, so that fault leaves it whole.
fn whole(data: Bytes, fault: Option<Fault>) -> MockBody {
    match fault.map(|f| f.kind) {
        Some(kind @ (FaultKind::Cut | FaultKind::Hang)) => MockBody::halved(data, kind),
        Some(FaultKind::StreamError) | None => MockBody::full(data),
    }
}

/// Waits as scripted before the response headers: `delay_ms`, then forever if `hang`.
pub(crate) async fn wait(reply: &Reply) {
    if reply.delay > Duration::ZERO {
        tokio::time::sleep(reply.delay).await;
    }
    if reply.hang {
        std::future::pending::<()>().await;
    }
}
