use super::*;

use crate::meter::{Ledger, Named};
use crate::telemetry::Metrics;

fn sink(metrics: &Arc<Metrics>, ledger: &Arc<Ledger>) -> UsageSink {
    UsageSink {
        series: metrics.series.usage("t1", "openai", "gpt-x"),
        step: metrics.series.step("openai", "gpt-x"),
        metrics: metrics.clone(),
        ledger: ledger.clone(),
        tenant: "t1".into(),
        price: None,
        target: Arc::from("openai:gpt-x"),
        named: Named::Configured,
        max_output: Some(1000),
        generation: true,
    }
}

fn parts() -> (Arc<Metrics>, Arc<Ledger>) {
    let registry = prometheus::Registry::new();
    (
        Arc::new(Metrics::new(&registry).unwrap()),
        Arc::new(Ledger::default()),
    )
}

fn tokens(ledger: &Ledger) -> Vec<(u64, u64, u64)> {
    ledger
        .snapshot()
        .into_iter()
        .map(|(_, _, e)| (e.requests, e.usage.input, e.usage.output))
        .collect()
}

const QUEUED: &[u8] = br#"{"id":"resp_bg1","object":"response","status":"queued","background":true,"output":[],"usage":null}"#;
const DONE: &[u8] = br#"{"id":"resp_bg1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"\"status\":\"queued\""}]}],"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":20},"output_tokens":30,"total_tokens":150}}"#;

#[test]
fn a_running_response_is_metered_once_by_the_poll_that_finds_it_final() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    assert!(u.expect(QUEUED, sink(&metrics, &ledger)));
    assert!(u.waits_for("resp_bg1"));
    // Still running: nothing metered, still waited for.
    let running = br#"{"id":"resp_bg1","status":"in_progress","usage":null}"#;
    assert_eq!(u.settle("resp_bg1", running, false), None);
    assert!(u.waits_for("resp_bg1"));
    assert!(tokens(&ledger).is_empty());
    assert_eq!(
        u.settle("resp_bg1", DONE, false)
            .map(|(u, c)| (u.output, c)),
        Some((30, 0))
    );
    // Tokens, no second request (the request was counted when it was answered).
    assert_eq!(tokens(&ledger), vec![(0, 100, 30)]);
    let series = metrics.series.usage("t1", "openai", "gpt-x");
    let [input, output, cache_read, _] = series.tokens(&metrics);
    assert_eq!((input.get(), output.get(), cache_read.get()), (100, 30, 20));
    // Once per id.
    assert_eq!(u.settle("resp_bg1", DONE, false), None);
    assert_eq!(tokens(&ledger), vec![(0, 100, 30)]);
    assert!(u.is_empty());
}

#[test]
fn a_final_state_without_usage_forgets_the_id_and_meters_nothing() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    assert!(u.expect(QUEUED, sink(&metrics, &ledger)));
    let failed =
        br#"{"id":"resp_bg1","status":"failed","error":{"code":"server_error"},"usage":null}"#;
    assert_eq!(u.settle("resp_bg1", failed, false), None);
    assert!(!u.waits_for("resp_bg1"));
    assert!(tokens(&ledger).is_empty());
}

#[test]
fn a_replayed_stream_is_read_for_its_final_event() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    assert!(u.expect(QUEUED, sink(&metrics, &ledger)));
    let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_bg1\",\"status\":\"queued\",\"usage\":null}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_bg1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":7,\"output_tokens\":3}}}\n\n";
    assert_eq!(
        u.settle("resp_bg1", stream, true)
            .map(|(u, c)| (u.input, c)),
        Some((7, 0))
    );
    assert_eq!(tokens(&ledger), vec![(0, 7, 3)]);
}

#[test]
fn only_running_responses_with_a_path_id_are_remembered() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    assert!(!u.expect(DONE, sink(&metrics, &ledger)), "final already");
    assert!(!u.expect(
        br#"{"id":"a/b","status":"queued"}"#,
        sink(&metrics, &ledger)
    ));
    assert!(!u.expect(br#"{"status":"queued"}"#, sink(&metrics, &ledger)));
    assert!(!u.expect(
        br#"{"id":"resp_1","status":"queued""#,
        sink(&metrics, &ledger)
    ));
    assert!(!u.expect(b"[1]", sink(&metrics, &ledger)));
    assert!(u.is_empty());
    // An unknown id costs nothing and meters nothing.
    assert_eq!(u.settle("resp_other", DONE, false), None);
}

#[test]
fn the_oldest_are_forgotten_past_the_bound() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    for i in 0..=MAX_UNSETTLED {
        let body = format!(r#"{{"id":"resp_{i}","status":"queued"}}"#);
        assert!(u.expect(body.as_bytes(), sink(&metrics, &ledger)));
    }
    assert_eq!(u.len(), MAX_UNSETTLED);
    assert!(!u.waits_for("resp_0"));
    assert!(u.waits_for("resp_1"));
    assert!(u.waits_for(&format!("resp_{MAX_UNSETTLED}")));
    assert_eq!(u.inner.lock().order.len(), MAX_UNSETTLED);
}

#[test]
fn a_stream_is_known_as_background_by_its_first_event() {
    let ev = |name: &str, response: &str| crate::sse::SseEvent {
        event: Some(name.to_owned()),
        data: format!(r#"{{"type":"{name}","response":{response}}}"#),
        end_offset: 0,
    };
    let queued = r#"{"id":"resp_s1","status":"queued","background":true,"usage":null}"#;
    assert_eq!(
        started(&ev("response.created", queued)).as_deref(),
        Some("resp_s1")
    );
    let running = r#"{"id":"resp_s1","status":"in_progress","background":true}"#;
    assert_eq!(
        started(&ev("response.created", running)).as_deref(),
        Some("resp_s1")
    );
    // Not in background, not the first event, already final, or no readable id.
    let plain = r#"{"id":"resp_s1","status":"in_progress","background":false}"#;
    assert_eq!(started(&ev("response.created", plain)), None);
    assert_eq!(started(&ev("response.in_progress", queued)), None);
    let done = r#"{"id":"resp_s1","status":"completed","background":true}"#;
    assert_eq!(started(&ev("response.created", done)), None);
    let no_id = r#"{"id":7,"status":"queued","background":true}"#;
    assert_eq!(started(&ev("response.created", no_id)), None);
}
