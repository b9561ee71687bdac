//! Request spans reach a real OTLP receiver, over gRPC and over HTTP, in the caller's trace;
//! a collector that is down changes nothing for clients and its spans are counted as dropped.
//! (gRPC calls' spans: `grpc/tests_tracing.rs`.)

use super::tests_receivers::{
    assert_request_children, dead_endpoint, flush, grpc_receiver, http_receiver, named, traced_app,
    Caller, Spans,
};
use super::{OtlpProtocol, OtlpSettings, RequestTracing};
use crate::metrics::Metrics;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::json;
use std::sync::Arc;

/// One `/embed` with the caller's `traceparent`: the receiver gets the request's span under
/// the caller's, and its children under it.
async fn embed_is_traced(endpoint: String, protocol: OtlpProtocol, spans: &Spans) {
    let app = traced_app(endpoint, protocol);
    let caller = Caller::new(protocol as u8);
    let reply = app
        .post_raw(
            "/embed",
            json!({"inputs": "hello world"}).to_string(),
            &[
                ("traceparent", &caller.traceparent()),
                ("tracestate", "vendor=1"),
            ],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let tokens: i64 = reply.headers["x-compute-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    flush(&app).await;
    let spans = spans.at_least(4).await;
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let root = named(&spans, "POST /embed");
    assert_eq!(root.span.trace_id, caller.trace_id);
    assert_eq!(root.span.parent_span_id, caller.span_id);
    assert_eq!(root.span.trace_state, "vendor=1");
    assert_eq!(root.span.kind, SpanKind::Server as i32);
    assert_eq!(root.string("http.route"), "/embed");
    assert_eq!(root.string("http.request.method"), "POST");
    assert_eq!(root.int("http.response.status_code"), 200);
    assert_eq!(
        root.span.status.as_ref().map(|s| s.code),
        Some(StatusCode::Ok as i32)
    );
    assert_request_children(&spans, root, tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_request_is_traced_over_otlp_grpc() {
    let spans = Spans::default();
    let endpoint = grpc_receiver(spans.clone()).await;
    embed_is_traced(endpoint, OtlpProtocol::Grpc, &spans).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_request_is_traced_over_otlp_http() {
    let spans = Spans::default();
    let endpoint = http_receiver(spans.clone()).await;
    embed_is_traced(endpoint, OtlpProtocol::HttpProtobuf, &spans).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_traceparent_starts_a_trace_and_a_refusal_is_an_error_span() {
    let spans = Spans::default();
    let app = traced_app(grpc_receiver(spans.clone()).await, OtlpProtocol::Grpc);
    let reply = app.post("/embed", json!({"inputs": ""})).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    flush(&app).await;
    let spans = spans.at_least(1).await;
    assert_eq!(
        spans.len(),
        1,
        "no child for a request that never ran: {spans:#?}"
    );
    let root = &spans[0];
    assert_eq!(root.span.name, "POST /embed");
    assert!(root.span.parent_span_id.is_empty());
    assert_ne!(root.span.trace_id, [0; 16]);
    assert_eq!(root.int("http.response.status_code"), 400);
    let status = root.span.status.clone().expect("a status");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert_eq!(status.message, "empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_changes_nothing_for_clients_and_counts_the_spans_dropped() {
    let untraced = crate::http::test_util::test_app(Default::default());
    let expected = untraced
        .post("/embed", json!({"inputs": "hello world"}))
        .await;
    for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
        let app = traced_app(dead_endpoint(), protocol);
        assert!(app
            .metrics
            .render()
            .contains("te_otlp_spans_dropped_total 0"));
        let caller = Caller::new(9);
        let reply = app
            .post_raw(
                "/embed",
                json!({"inputs": "hello world"}).to_string(),
                &[("traceparent", &caller.traceparent())],
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        assert_eq!(reply.json, expected.json);
        flush(&app).await;
        assert_eq!(
            app.sample("te_otlp_spans_dropped_total"),
            4.0,
            "{protocol:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_export_queue_drops_and_counts_instead_of_waiting() {
    let metrics = Arc::new(Metrics::new(16));
    let settings = OtlpSettings {
        endpoint: silent_endpoint().await,
        protocol: OtlpProtocol::Grpc,
        service_name: "s".into(),
    };
    let tracing = RequestTracing::start(&settings, metrics.clone()).unwrap();
    let many = 3 * super::MAX_QUEUED_SPANS;
    let started = std::time::Instant::now();
    for _ in 0..many {
        let root = super::spans::RootSpan {
            name: "POST /embed".into(),
            parent: opentelemetry::Context::new(),
            start: std::time::Instant::now(),
            attributes: Vec::new(),
        };
        tracing.export(root, "m", &Default::default(), &super::spans::Outcome::Ok);
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "ending spans waited for the exporter"
    );
    let dropped = |m: &Metrics| {
        m.render()
            .lines()
            .find_map(|l| l.strip_prefix("te_otlp_spans_dropped_total "))
            .map(|v| v.parse::<u64>().unwrap())
            .unwrap()
    };
    // Waiting for the collector, the processor holds its queue and the batch it exports
    // (512 spans); the rest were dropped at once.
    let held = super::MAX_QUEUED_SPANS + 512;
    assert!(
        dropped(&metrics) >= (many - held) as u64,
        "{} dropped",
        dropped(&metrics)
    );
}

/// A loopback collector that takes connections and never answers.
async fn silent_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

#[test]
fn bad_endpoints_are_refused_clearly() {
    let metrics = Arc::new(Metrics::new(16));
    for endpoint in [
        "localhost:4317",
        "not a url",
        "ftp://collector:4317",
        "https://c:4317",
    ] {
        let settings = OtlpSettings {
            endpoint: endpoint.into(),
            protocol: OtlpProtocol::Grpc,
            service_name: "s".into(),
        };
        let err = RequestTracing::start(&settings, metrics.clone()).unwrap_err();
        assert!(err.to_string().contains(endpoint), "{err}");
    }
}

#[test]
fn an_http_endpoint_without_a_path_gets_the_traces_path() {
    let url = |s: &str| super::traces_url(&s.parse().unwrap());
    assert_eq!(
        url("http://collector:4318"),
        "http://collector:4318/v1/traces"
    );
    assert_eq!(
        url("http://collector:4318/"),
        "http://collector:4318/v1/traces"
    );
    assert_eq!(
        url("http://collector/otlp/v1/traces"),
        "http://collector/otlp/v1/traces"
    );
}
