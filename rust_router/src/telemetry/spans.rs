//! A finished request's spans, built from its [`RequestRecord`] with explicit start and end
//! times: the root (`POST /embed`, `tei.v1.Embed/Embed`), child of the caller's span when the
//! request carried a W3C `traceparent`; under it a `tokenize` span per tokenization, and per
//! batch that ran its sequences a `queue` span (queued to the batch's start) and an
//! `inference` span (the batch's forward pass).

use super::record::{RequestRecord, SequenceRun};
use super::RequestTracing;
use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span, SpanBuilder, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::time::{Instant, SystemTime};

/// A request's root span, as the transport knows it before the request runs.
#[derive(Debug)]
pub struct RootSpan {
    pub name: String,
    /// The caller's span (from `traceparent` / `tracestate`), or none.
    pub parent: Context,
    pub start: Instant,
    pub attributes: Vec<KeyValue>,
}

/// How the request ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Ok,
    Error(String),
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The caller's span context from W3C `traceparent` and `tracestate` headers (gRPC metadata
/// is the same map); an empty context when there is none or it is malformed.
pub fn caller_context(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// Converts the monotonic instants the router measures into wall-clock times, from one
/// reading of both clocks.
struct Clock {
    now: Instant,
    wall: SystemTime,
}

impl Clock {
    fn new() -> Self {
        Self {
            now: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.now) {
            Some(ahead) => self.wall + ahead,
            None => self.wall - self.now.duration_since(at),
        }
    }
}

/// The root's request-wide attributes: its tokens, and its lane where it ran.
fn lane_and_tokens(record: &RequestRecord) -> Vec<KeyValue> {
    let mut attributes = vec![KeyValue::new("tokens", record.tokens() as i64)];
    if let Some(lane) = record.lane() {
        attributes.push(KeyValue::new("lane", lane));
    }
    attributes
}

impl RequestTracing {
    /// Builds and ends the request's spans; the export happens later, off the request's path.
    /// `model` is the served model's name, on every span.
    pub fn export(&self, root: RootSpan, model: &str, record: &RequestRecord, outcome: &Outcome) {
        let clock = Clock::new();
        let model = KeyValue::new("model", model.to_string());
        let mut attributes = root.attributes;
        attributes.push(model.clone());
        attributes.extend(lane_and_tokens(record));
        let mut span = self
            .tracer
            .span_builder(root.name)
            .with_kind(SpanKind::Server)
            .with_start_time(clock.wall(root.start))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &root.parent);
        span.set_status(match outcome {
            Outcome::Ok => Status::Ok,
            Outcome::Error(why) => Status::error(why.clone()),
        });
        let cx = root.parent.with_span(span);
        for t in &record.tokenized {
            self.child("tokenize", clock.wall(t.start))
                .with_attributes(vec![
                    model.clone(),
                    KeyValue::new("inputs", t.inputs as i64),
                    KeyValue::new("tokens", t.tokens as i64),
                    KeyValue::new("lane", t.lane),
                ])
                .start_with_context(&self.tracer, &cx)
                .end_with_timestamp(clock.wall(t.end));
        }
        for batch in by_batch(&record.sequences) {
            let first = &batch[0];
            let queued_at = batch
                .iter()
                .map(|s| s.queued_at)
                .min()
                .unwrap_or(first.queued_at);
            let run = &first.batch;
            let tokens: usize = batch.iter().map(|s| s.tokens).sum();
            let lane = KeyValue::new("lane", first.lane);
            self.child("queue", clock.wall(queued_at))
                .with_attributes(vec![model.clone(), lane.clone()])
                .start_with_context(&self.tracer, &cx)
                .end_with_timestamp(clock.wall(run.started));
            let ended = clock.wall(run.started + run.duration);
            self.child("inference", clock.wall(run.started))
                .with_attributes(vec![
                    model.clone(),
                    lane,
                    KeyValue::new("device", run.device.clone()),
                    KeyValue::new("tokens", tokens as i64),
                    KeyValue::new("sequences", batch.len() as i64),
                    KeyValue::new("batch_size", run.size as i64),
                    KeyValue::new("batch_tokens", run.tokens as i64),
                ])
                .start_with_context(&self.tracer, &cx)
                .end_with_timestamp(ended);
        }
        cx.span().end_with_timestamp(clock.wall(clock.now));
    }

    fn child(&self, name: &'static str, start: SystemTime) -> SpanBuilder {
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
    }
}

/// The request's sequences grouped by the batch that ran them, in order of first run.
fn by_batch(sequences: &[SequenceRun]) -> Vec<Vec<&SequenceRun>> {
    let mut batches: Vec<Vec<&SequenceRun>> = Vec::new();
    for s in sequences {
        match batches.iter_mut().find(|b| b[0].batch == s.batch) {
            Some(batch) => batch.push(s),
            None => batches.push(vec![s]),
        }
    }
    batches
}
