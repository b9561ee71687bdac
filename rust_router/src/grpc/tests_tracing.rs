//! A `tei.v1` call with `traceparent` metadata is traced as an HTTP request is
//! (`telemetry/tests.rs`): its span in the caller's trace, with the same children.

use super::pb::embed_server::Embed as _;
use super::tests::{api, embed_request};
use crate::telemetry::tests_receivers::{
    assert_request_children, flush, grpc_receiver, named, traced_app, Caller, Spans,
};
use crate::telemetry::OtlpProtocol;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use tonic::Request;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_is_traced_in_the_callers_trace() {
    let spans = Spans::default();
    let app = traced_app(grpc_receiver(spans.clone()).await, OtlpProtocol::Grpc);
    let caller = Caller::new(42);
    let mut request = Request::new(embed_request("hello world"));
    request
        .metadata_mut()
        .insert("traceparent", caller.traceparent().parse().unwrap());
    let answer = api(&app).embed(request).await.unwrap();
    let tokens = i64::from(answer.into_inner().metadata.unwrap().compute_tokens);
    flush(&app).await;
    let spans = spans.at_least(4).await;
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let root = named(&spans, "tei.v1.Embed/Embed");
    assert_eq!(root.span.trace_id, caller.trace_id);
    assert_eq!(root.span.parent_span_id, caller.span_id);
    assert_eq!(root.span.kind, SpanKind::Server as i32);
    assert_eq!(root.string("rpc.system"), "grpc");
    assert_eq!(root.string("rpc.service"), "tei.v1.Embed");
    assert_eq!(root.string("rpc.method"), "Embed");
    assert_eq!(root.int("rpc.grpc.status_code"), 0);
    assert_request_children(&spans, root, tokens);
}
