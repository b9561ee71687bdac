//! The export path, built so that a span never waits for the collector: the SDK's batch span
//! processor (a thread of its own, a bounded queue) behind [`Bounded`], which drops a span at
//! once when that queue is full and counts it, and in front of [`Counting`], which counts the
//! spans of a batch the collector did not take (down, slow past the export timeout, or
//! refusing). Both counts are one counter: `te_otlp_spans_dropped_total`.

use crate::metrics::Metrics;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The counter of spans lost, in `/metrics`.
pub const DROPPED_METRIC: &str = "te_otlp_spans_dropped_total";

/// What the two ends share: spans on their way, and where spans lost are counted.
#[derive(Debug)]
pub struct ExportCounts {
    /// Spans handed to the batch processor and not yet handed to the exporter: what its queue
    /// holds, or a little more (the batch it is gathering).
    queued: AtomicUsize,
    metrics: Arc<Metrics>,
}

impl ExportCounts {
    /// Counts in `metrics`, where the counter shows from the start (at 0).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        metrics.counter_add(DROPPED_METRIC, &[], 0);
        Self {
            queued: AtomicUsize::new(0),
            metrics,
        }
    }

    fn drop_spans(&self, n: usize) {
        self.metrics.counter_add(DROPPED_METRIC, &[], n as u64);
    }
}

/// A span processor that hands spans to `inner` (the batch processor) while fewer than
/// `max_queued` wait for export, and drops (and counts) the others. Counting here, rather than
/// letting the batch processor drop them, is what makes the drops visible: the SDK keeps its
/// own count private.
#[derive(Debug)]
pub struct Bounded<P> {
    pub inner: P,
    pub max_queued: usize,
    pub counts: Arc<ExportCounts>,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let queued = self.counts.queued.fetch_add(1, Ordering::Relaxed);
        if queued >= self.max_queued {
            self.counts.queued.fetch_sub(1, Ordering::Relaxed);
            self.counts.drop_spans(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that counts the spans of every batch `inner` fails to deliver.
#[derive(Debug)]
pub struct Counting<E> {
    pub inner: E,
    pub counts: Arc<ExportCounts>,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        // Out of the queue: room for as many new spans.
        self.counts.queued.fetch_sub(n, Ordering::Relaxed);
        let result = self.inner.export(batch).await;
        if result.is_err() {
            self.counts.drop_spans(n);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
