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

/// [`Unsettled::expect`] for a relayed answer, as `exchange` calls it.
fn expect(u: &Unsettled, body: &[u8], sink: UsageSink) -> bool {
    running_id(body).is_some_and(|id| u.expect(&id, sink, None))
}

fn tokens(ledger: &Ledger) -> Vec<(u64, u64, u64)> {
    ledger
        .snapshot()
        .into_iter()
        .map(|(_, _, e)| (e.requests, e.usage.input, e.usage.output))
        .collect()
}

const QUEUED: &[u8] = br#"{"id":"resp_bg1","object":"response","status":"queued","background":true,"output":[],"usage":null}"#;
const DONE: &str = r#"{"id":"resp_bg1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"\"status\":\"queued\""}]}],"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":20},"output_tokens":30,"total_tokens":150}}"#;

#[test]
fn a_running_response_is_metered_once_by_the_poll_that_finds_it_final() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    assert!(expect(&u, QUEUED, sink(&metrics, &ledger)));
    assert!(u.waits_for("resp_bg1"));
    // Still running: nothing metered, still waited for.
    let running = br#"{"id":"resp_bg1","status":"in_progress","usage":null}"#;
    assert_eq!(u.settle("resp_bg1", running, false), None);
    assert!(u.waits_for("resp_bg1"));
    assert!(tokens(&ledger).is_empty());
    assert_eq!(
        u.settle("resp_bg1", DONE.as_bytes(), false)
            .map(|(u, c)| (u.output, c)),
        Some((30, 0))
    );
    // Tokens, no second request (the request was counted when it was answered).
    assert_eq!(tokens(&ledger), vec![(0, 100, 30)]);
    let series = metrics.series.usage("t1", "openai", "gpt-x");
    let [input, output, cache_read, _] = series.tokens(&metrics);
    assert_eq!((input.get(), output.get(), cache_read.get()), (100, 30, 20));
    // Once per id.
    assert_eq!(u.settle("resp_bg1", DONE.as_bytes(), false), None);
    assert_eq!(tokens(&ledger), vec![(0, 100, 30)]);
    assert!(u.is_empty());
}

#[test]
fn a_final_state_without_usage_forgets_the_id_and_meters_nothing() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    assert!(expect(&u, QUEUED, sink(&metrics, &ledger)));
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
    assert!(expect(&u, QUEUED, sink(&metrics, &ledger)));
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
    assert!(
        !expect(&u, DONE.as_bytes(), sink(&metrics, &ledger)),
        "final already"
    );
    assert!(!expect(
        &u,
        br#"{"id":"a/b","status":"queued"}"#,
        sink(&metrics, &ledger)
    ));
    assert!(!expect(
        &u,
        br#"{"status":"queued"}"#,
        sink(&metrics, &ledger)
    ));
    assert!(!expect(
        &u,
        br#"{"id":"resp_1","status":"queued""#,
        sink(&metrics, &ledger)
    ));
    assert!(!expect(&u, b"[1]", sink(&metrics, &ledger)));
    assert!(u.is_empty());
    // An unknown id costs nothing and meters nothing.
    assert_eq!(u.settle("resp_other", DONE.as_bytes(), false), None);
}

#[test]
fn past_the_bound_the_busiest_tenants_oldest_is_forgotten() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    let other = || UsageSink {
        tenant: "t2".into(),
        ..sink(&metrics, &ledger)
    };
    // Two of another tenant's, the oldest of all among them.
    assert!(u.expect("resp_t2_a", other(), None));
    assert!(u.expect("resp_t2_b", other(), None));
    for i in 0..MAX_UNSETTLED - 1 {
        assert!(u.expect(&format!("resp_{i}"), sink(&metrics, &ledger), None));
    }
    assert_eq!(u.len(), MAX_UNSETTLED);
    assert!(!u.waits_for("resp_0"), "t1's oldest went, not t2's");
    assert!(u.waits_for("resp_t2_a") && u.waits_for("resp_t2_b"));
    assert!(u.waits_for("resp_1"));
    let inner = u.inner.lock();
    assert_eq!(inner.order.len(), MAX_UNSETTLED);
    assert_eq!(inner.per_tenant["t2"], 2);
    assert_eq!(inner.per_tenant["t1"], MAX_UNSETTLED - 2);
}

#[test]
fn an_id_given_again_is_the_later_requests() {
    let (metrics, ledger) = parts();
    let u = Unsettled::default();
    let other = UsageSink {
        tenant: "t2".into(),
        ..sink(&metrics, &ledger)
    };
    assert!(u.expect("resp_same", sink(&metrics, &ledger), None));
    assert!(u.expect("resp_same", other, None));
    assert_eq!(u.len(), 1);
    assert_eq!(u.inner.lock().order.len(), 1);
    let done = DONE.replace("resp_bg1", "resp_same");
    assert!(u.settle("resp_same", done.as_bytes(), false).is_some());
    let tenants: Vec<String> = ledger.snapshot().into_iter().map(|(t, _, _)| t).collect();
    assert_eq!(tenants, ["t2"]);
    assert!(u.inner.lock().per_tenant.is_empty());
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
