//! `[server]` keys that are more than a type: the runtime's worker threads.

use super::{TestResult, errors_of, message_at, no_env, refused_at};
use crate::config::load::env_of;
use crate::config::load_str;

#[test]
fn worker_threads_default_to_one_and_are_bounded() -> TestResult {
    assert_eq!(load_str("", &no_env())?.server.worker_threads, 1);
    assert_eq!(
        load_str("[server]\nworker_threads = 256", &no_env())?
            .server
            .worker_threads,
        256
    );
    for bad in ["0", "257", "-1", "\"two\"", "2.5"] {
        refused_at(
            &format!("[server]\nworker_threads = {bad}"),
            "server.worker_threads",
        );
    }
    Ok(())
}

#[test]
fn tokio_worker_threads_overrides_the_file_and_is_checked_alike() -> TestResult {
    let file = "[server]\nworker_threads = 4";
    let cfg = load_str(file, &env_of(&[("TOKIO_WORKER_THREADS", "2")]))?;
    assert_eq!(cfg.server.worker_threads, 2);
    let cfg = load_str(file, &env_of(&[("LEGATE__SERVER__WORKER_THREADS", "3")]))?;
    assert_eq!(cfg.server.worker_threads, 3);
    for bad in ["0", "300", "", "x"] {
        let Err(errs) = load_str(file, &env_of(&[("TOKIO_WORKER_THREADS", bad)])) else {
            return Err(format!("TOKIO_WORKER_THREADS={bad:?} accepted").into());
        };
        let msg = message_at(&errs, "server.worker_threads");
        assert!(msg.contains("TOKIO_WORKER_THREADS"), "{msg}");
    }
    Ok(())
}

/// A collector's URL with credentials in it is refused (the exporter never sends them, and a
/// URL reaches logs whole), from the file and from the environment, without echoing them.
#[test]
fn an_otlp_url_with_credentials_is_refused_without_echo() {
    let file = "[telemetry]\notlp_endpoint = \"http://otel:SECRET42@127.0.0.1:4318\"";
    let msg = message_at(&errors_of(file), "telemetry.otlp_endpoint");
    assert!(msg.contains("must not carry credentials"), "{msg}");
    assert!(!msg.contains("SECRET42"), "{msg}");
    let env = env_of(&[(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "https://u:SECRET42@collector.example/v1/traces",
    )]);
    let Err(errs) = load_str("", &env) else {
        panic!("credentials in OTEL_EXPORTER_OTLP_TRACES_ENDPOINT accepted");
    };
    let msg = message_at(&errs, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    assert!(msg.contains("must not carry credentials"), "{msg}");
    assert!(!msg.contains("SECRET42"), "{msg}");
    // Without them, the same URLs are taken.
    assert!(
        load_str(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"",
            &no_env()
        )
        .is_ok()
    );
}

/// The path and message of each error an empty config finds under the environment `vars`
/// (none when it loads).
fn env_errors(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    match load_str("", &env_of(vars)) {
        Err(e) => {
            e.0.iter()
                .map(|e| (e.path.clone(), e.message.clone()))
                .collect()
        }
        Ok(_) => Vec::new(),
    }
}

/// Each collector URL is checked under the variable that was set; a base URL takes no query
/// (the signal's path would follow it); and an `OTEL_EXPORTER_OTLP_HEADERS` entry that is no
/// header is refused by position, never dropped in silence nor quoted.
#[test]
fn otlp_variables_are_checked_under_their_own_names() {
    let errs = env_errors;
    let got = errs(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "OTEL_EXPORTER_OTLP_ENDPOINT");
    let got = errs(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://c:4318/?api_key=SECRET42",
    )]);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].1.contains("takes no query") && !got[0].1.contains("SECRET42"),
        "{got:?}"
    );
    let got = errs(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-org=7,Authorization: Bearer SECRET42,,k=v",
        ),
    ]);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "OTEL_EXPORTER_OTLP_HEADERS");
    assert!(
        got[0].1.contains("entry 2 ") && !got[0].1.contains("SECRET42"),
        "{got:?}"
    );
    assert!(
        errs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20x,"),
        ])
        .is_empty()
    );
}

/// A signal's own protocol variable overrides the general one (OpenTelemetry's spec): gRPC
/// asked for there is refused under its name, as the general variable's is; with nothing
/// exported, neither is looked at.
#[test]
fn a_signals_own_otlp_protocol_is_checked_too() {
    let errs = |vars: &[(&str, &str)]| -> Vec<String> {
        env_errors(vars).into_iter().map(|(path, _)| path).collect()
    };
    let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
    for var in [
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    ] {
        assert_eq!(errs(&[base, (var, "grpc")]), vec![var.to_owned()]);
        assert!(errs(&[base, (var, "http/protobuf")]).is_empty(), "{var}");
        assert!(errs(&[(var, "grpc")]).is_empty(), "{var}");
    }
}
