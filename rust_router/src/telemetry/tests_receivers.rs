//! Real OTLP receivers for the tracing tests: the collector's gRPC trace service (from
//! `opentelemetry-proto`'s definitions) and its HTTP endpoint (`POST /v1/traces`, protobuf),
//! each keeping the spans it is sent; and a test app that exports to one.

use crate::http::test_util::{test_app, Options, TestApp};
use crate::telemetry::{OtlpProtocol, OtlpSettings};
use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A received span, with the `service.name` of the resource it came under.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    pub fn attribute(&self, key: &str) -> Option<Value> {
        attribute(&self.span.attributes, key)
    }

    pub fn string(&self, key: &str) -> String {
        match self.attribute(key) {
            Some(Value::StringValue(s)) => s,
            other => panic!("{}: `{key}` is {other:?}, not a string", self.span.name),
        }
    }

    pub fn int(&self, key: &str) -> i64 {
        match self.attribute(key) {
            Some(Value::IntValue(i)) => i,
            other => panic!("{}: `{key}` is {other:?}, not an integer", self.span.name),
        }
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone()?.value)
}

/// What a receiver was sent.
#[derive(Debug, Clone, Default)]
pub struct Spans(Arc<Mutex<Vec<Received>>>);

impl Spans {
    fn keep(&self, request: ExportTraceServiceRequest) {
        let mut kept = self.0.lock().unwrap();
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .and_then(|r| attribute(&r.attributes, "service.name"))
                .map(|v| match v {
                    Value::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    kept.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
    }

    /// The spans received so far once there are at least `n` (waiting up to 10 s).
    pub async fn at_least(&self, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.0.lock().unwrap().clone();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver got {} spans, expected {n}: {spans:#?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tonic::async_trait]
impl TraceService for Spans {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A collector's OTLP/gRPC trace service on a loopback port; returns its URL.
pub async fn grpc_receiver(spans: Spans) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(spans))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    url
}

/// A collector's OTLP/HTTP traces endpoint (`POST /v1/traces`, protobuf) on a loopback
/// port; returns its base URL (no path).
pub async fn http_receiver(spans: Spans) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let spans = spans.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                spans.keep(request);
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A loopback URL nothing listens on.
pub fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// The fake-backend app, exporting its spans to `endpoint` over `protocol`.
pub fn traced_app(endpoint: String, protocol: OtlpProtocol) -> TestApp {
    test_app(Options {
        otlp: Some(OtlpSettings {
            endpoint,
            protocol,
            service_name: "embeddings-under-test".into(),
        }),
        ..Options::default()
    })
}

/// Exports every span the app has ended (off the runtime's workers: it blocks).
pub async fn flush(app: &TestApp) {
    let tracing = app.state.config.tracing.clone().expect("a traced app");
    tokio::task::spawn_blocking(move || tracing.flush())
        .await
        .unwrap();
}

/// A caller's span: its trace id and span id in hex, and its `traceparent`.
pub struct Caller {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl Caller {
    pub fn new(seed: u8) -> Self {
        Self {
            trace_id: std::array::from_fn(|i| seed.wrapping_add(i as u8 * 7 + 1)),
            span_id: std::array::from_fn(|i| seed.wrapping_add(i as u8 * 13 + 3)),
        }
    }

    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", hex(&self.trace_id), hex(&self.span_id))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The one span named `name` among `spans`.
pub fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let found: Vec<_> = spans.iter().filter(|s| s.span.name == name).collect();
    assert_eq!(found.len(), 1, "one `{name}` span expected in {spans:#?}");
    found[0]
}

/// Checks the children every traced inference request has under `root`: one tokenization,
/// one queue wait and one forward pass (a one-input request runs in one batch), in the
/// root's trace, in time order, with their attributes.
pub fn assert_request_children(spans: &[Received], root: &Received, tokens: i64) {
    for name in ["tokenize", "queue", "inference"] {
        let child = named(spans, name);
        assert_eq!(child.span.trace_id, root.span.trace_id, "{name}");
        assert_eq!(child.span.parent_span_id, root.span.span_id, "{name}");
        assert_eq!(child.string("model"), "fake/model", "{name}");
        assert_eq!(child.string("lane"), "interactive", "{name}");
        assert!(child.span.start_time_unix_nano >= root.span.start_time_unix_nano);
        assert!(child.span.end_time_unix_nano <= root.span.end_time_unix_nano);
        assert!(child.span.start_time_unix_nano <= child.span.end_time_unix_nano);
    }
    let tokenize = named(spans, "tokenize");
    assert_eq!(tokenize.int("tokens"), tokens);
    assert_eq!(tokenize.int("inputs"), 1);
    let queue = named(spans, "queue");
    let inference = named(spans, "inference");
    assert!(tokenize.span.end_time_unix_nano <= queue.span.start_time_unix_nano);
    assert_eq!(
        queue.span.end_time_unix_nano,
        inference.span.start_time_unix_nano
    );
    assert_eq!(inference.string("device"), "cpu");
    assert_eq!(inference.int("tokens"), tokens);
    assert_eq!(inference.int("batch_size"), 1);
    assert_eq!(inference.int("batch_tokens"), tokens);
    assert_eq!(root.string("model"), "fake/model");
    assert_eq!(root.string("lane"), "interactive");
    assert_eq!(root.int("tokens"), tokens);
    assert!(spans.iter().all(|s| s.service == "embeddings-under-test"));
}
