//! The control plane under `/_mock/`: read what was recorded and counted, reset it, and
//! replace the script while the mock runs.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::json;

use super::body::MockBody;
use super::script::Script;
use super::state::{RecordedRequest, Shared};

/// One recorded request as the control plane lists it.
#[derive(Serialize)]
struct RequestView<'a> {
    method: &'a str,
    path: &'a str,
    headers: Vec<[&'a str; 2]>,
    body_sha256: &'a str,
    /// UTF-8 lossy, so a binary body still lists.
    body: String,
}

impl<'a> RequestView<'a> {
    fn of(request: &'a RecordedRequest) -> RequestView<'a> {
        RequestView {
            method: &request.method,
            path: &request.path,
            headers: request
                .headers
                .iter()
                .map(|(n, v)| [n.as_str(), v.as_str()])
                .collect(),
            body_sha256: &request.body_sha256,
            body: String::from_utf8_lossy(&request.body).into_owned(),
        }
    }
}

fn json_response(status: StatusCode, value: &impl Serialize) -> Response<MockBody> {
    let data = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(MockBody::full(Bytes::from(data)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Serves one control-plane request.
pub(crate) async fn handle(shared: &Shared, request: Request<Incoming>) -> Response<MockBody> {
    let method = request.method().clone();
    match (method, request.uri().path()) {
        (Method::GET, "/_mock/requests") => {
            let requests = shared.requests();
            let views: Vec<RequestView<'_>> = requests.iter().map(RequestView::of).collect();
            json_response(StatusCode::OK, &views)
        }
        (Method::GET, "/_mock/stats") => json_response(StatusCode::OK, &shared.stats()),
        (Method::POST, "/_mock/reset") => {
            shared.reset();
            json_response(StatusCode::OK, &json!({"reset": true}))
        }
        (Method::PUT, "/_mock/script") => {
            let Ok(body) = request.into_body().collect().await else {
                let error = json!({"error": "the script upload broke off"});
                return json_response(StatusCode::BAD_REQUEST, &error);
            };
            let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
            match Script::from_json(&text) {
                Ok(script) => {
                    shared.set_script(script);
                    json_response(StatusCode::OK, &json!({"ok": true}))
                }
                Err(message) => json_response(StatusCode::BAD_REQUEST, &json!({"error": message})),
            }
        }
        (method, path) => {
            let message = format!(
                "no control endpoint {method} {path}; try GET /_mock/requests, GET /_mock/stats, \
                 POST /_mock/reset or PUT /_mock/script"
            );
            json_response(StatusCode::NOT_FOUND, &json!({"error": message}))
        }
    }
}
