//! Prometheus metrics with TEI's `te_*` names and buckets.
//!
//! A small registry owned by the app rather than a process-global recorder: every test builds
//! its own app, and the exposition format is simple enough not to need a dependency.
//!
//! Every request updates several series on its way to the GPU, and a query's must never wait
//! for a backfill's: values are atomics, and the registry's lock is taken exclusively only to
//! add a series (once per name and label set), so updates share it and never block each other.
//!
//! Every family is rendered with `# HELP` (from [`help`]) and `# TYPE`: `promtool check
//! metrics` and some scrapers refuse families without help text.
//!
//! One registry serves the whole server. What a model's requests, queue and batches update
//! goes through its [`ModelMetrics`], which labels it with the model where the server serves
//! several; connections and the allocator are the server's own.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// An `f64` updated atomically through its bits.
#[derive(Debug, Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn store(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    fn add(&self, value: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

#[derive(Debug)]
struct Histogram {
    bounds: Vec<f64>,
    /// Observations per bucket, not cumulated: the first bound at or above the value, the
    /// last slot for values above every bound. An observation touches one counter, and a
    /// scrape cumulates them, so its buckets, `+Inf` and count always agree.
    counts: Vec<AtomicU64>,
    sum: AtomicF64,
}

impl Histogram {
    fn new(bounds: Vec<f64>) -> Self {
        Self {
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            bounds,
            sum: AtomicF64::default(),
        }
    }

    fn observe(&self, value: f64) {
        let bucket = if value.is_nan() {
            self.bounds.len()
        } else {
            self.bounds.partition_point(|bound| *bound < value)
        };
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.add(value);
    }
}

/// The `# HELP` text of every family the router exposes (TEI's names; TEI's own exposition
/// has no help text). A family missing here is rendered without it, which the exposition
/// tests refuse.
pub fn help(name: &str) -> Option<&'static str> {
    Some(match name {
        "te_request_count" => {
            "Inference requests that reached admission (those refused with 429 included), by \
             method: single (one input) or batch (a list); a /vertex request counts once"
        }
        "te_request_success" => "Inference requests answered with success, by method",
        "te_request_failure" => {
            "Requests answered with an error, by err (the error_type); err=dropped: requests \
             whose client left before the answer, one per request"
        }
        "te_request_duration" => "Seconds from the start of a successful request to its answer",
        "te_request_tokenization_duration" => {
            "Seconds a successful request spent being tokenized (average over its inputs)"
        }
        "te_request_queue_duration" => {
            "Seconds a successful request's inputs waited from queueing to their forward pass \
             (average over its inputs)"
        }
        "te_request_inference_duration" => {
            "Seconds of the forward passes that ran a successful request's inputs (average \
             over its inputs)"
        }
        "te_request_input_length" => "Tokens of each input queued for inference",
        "te_queue_size" => "Sequences waiting in the queue, both lanes",
        "te_queue_timeout_count" => {
            "Requests answered 503 queue_timeout: none of them had started when their queue \
             deadline (X-Max-Queue-Ms, --max-queue-ms) passed, and they never ran"
        }
        "te_otlp_spans_dropped_total" => {
            "Request spans not delivered to the OTLP collector (--otlp-endpoint): dropped \
             because the export queue was full, or in an export that failed or timed out"
        }
        "te_batch_next_size" => "Sequences in each batch packed for the backend, by lane",
        "te_batch_next_tokens" => "Tokens in each batch packed for the backend, by lane",
        "te_batch_inference_success" => "Forward passes that returned a result",
        "te_batch_inference_failure" => "Forward passes that raised",
        "te_batch_inference_duration" => "Seconds of each forward pass that returned a result",
        "te_batch_inference_size" => "Sequences in each forward pass that returned a result",
        "te_batch_isolation_pass" => {
            "Extra forward passes run to find which request of a failed batch made it fail"
        }
        "te_inference_non_finite" => {
            "Sequences whose output held NaN or infinite values (their request failed)"
        }
        "te_connection_open" => "HTTP connections open",
        "te_connection_refused" => "Connections refused because --max-connections were open",
        "te_connection_timeout" => {
            "Connections closed by a timeout, by phase: header (a request head too slow), \
             idle (no request) or send (an answer not taken in time)"
        }
        "te_response_unsent_bytes" => {
            "Bytes of answers produced and not yet taken by their clients' sockets, over every \
             connection"
        }
        _ => return None,
    })
}

/// `# HELP` and `# TYPE` of the family `name` (help text escaped as the format asks).
fn family_header(out: &mut String, name: &str, kind: &str) {
    if let Some(help) = help(name) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(out, "# HELP {name} {help}");
    }
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Metric name, then rendered label set (`""` for none). Nested so that updating an existing
/// series looks it up by `&str`, allocating nothing (these run several times per request).
type Series<V> = BTreeMap<String, BTreeMap<String, V>>;

#[derive(Debug, Default)]
struct Registry {
    counters: Series<AtomicU64>,
    gauges: Series<AtomicF64>,
    histograms: Series<Histogram>,
}

/// The series `name{labels}` of `map`, if it exists yet.
fn existing<'a, V>(map: &'a Series<V>, name: &str, labels: &str) -> Option<&'a V> {
    map.get(name)?.get(labels)
}

#[derive(Debug)]
pub struct Metrics {
    registry: RwLock<Registry>,
    max_input_length: usize,
}

fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    if let [(k, v)] = labels {
        if !v.contains(['\\', '"']) {
            return format!("{{{k}=\"{v}\"}}");
        }
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", inner.join(","))
}

impl Metrics {
    pub fn new(max_input_length: usize) -> Self {
        Self {
            registry: RwLock::default(),
            max_input_length,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `update` on the series `name{labels}` of the map `pick` chooses, adding the series
    /// (made by `init`) first if it is new.
    fn update<V>(
        &self,
        pick: impl FnOnce(&Registry) -> &Series<V>,
        pick_mut: impl FnOnce(&mut Registry) -> &mut Series<V>,
        name: &str,
        labels: &str,
        init: impl FnOnce() -> V,
        update: impl FnOnce(&V),
    ) {
        if let Some(value) = existing(pick(&self.read()), name, labels) {
            return update(value);
        }
        let mut registry = self.registry.write().unwrap_or_else(|p| p.into_inner());
        let value = pick_mut(&mut registry)
            .entry(name.to_string())
            .or_default()
            .entry(labels.to_string())
            .or_insert_with(init);
        update(value);
    }

    /// TEI's bucket layout, chosen by metric name.
    fn bounds_for(&self, name: &str) -> Vec<f64> {
        match name {
            "te_request_input_length" => (0..20)
                .map(|x| 2f64.powi(x))
                .filter(|x| *x as usize <= self.max_input_length)
                .collect(),
            "te_batch_next_size" | "te_batch_inference_size" => {
                (0..13).map(|x| 2f64.powi(x)).collect()
            }
            "te_batch_next_tokens" => (0..21).map(|x| 2f64.powi(x)).collect(),
            // Durations (seconds): a geometric ladder from 15µs.
            _ => std::iter::successors(Some(0.00001 * 1.5), |v| Some(v * 1.5))
                .take(35)
                .collect(),
        }
    }

    pub fn counter_add(&self, name: &str, labels: &[(&str, &str)], n: u64) {
        self.update(
            |r| &r.counters,
            |r| &mut r.counters,
            name,
            &render_labels(labels),
            || AtomicU64::new(0),
            |v| {
                v.fetch_add(n, Ordering::Relaxed);
            },
        );
    }

    pub fn inc(&self, name: &str, labels: &[(&str, &str)]) {
        self.counter_add(name, labels, 1);
    }

    pub fn gauge_set(&self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.update(
            |r| &r.gauges,
            |r| &mut r.gauges,
            name,
            &render_labels(labels),
            AtomicF64::default,
            |v| v.store(value),
        );
    }

    pub fn observe(&self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.update(
            |r| &r.histograms,
            |r| &mut r.histograms,
            name,
            &render_labels(labels),
            || Histogram::new(self.bounds_for(name)),
            |h| h.observe(value),
        );
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let reg = self.read();
        let mut out = String::new();
        for (name, by_labels) in &reg.counters {
            family_header(&mut out, name, "counter");
            for (labels, v) in by_labels {
                let _ = writeln!(out, "{name}{labels} {}", v.load(Ordering::Relaxed));
            }
        }
        for (name, by_labels) in &reg.gauges {
            family_header(&mut out, name, "gauge");
            for (labels, v) in by_labels {
                let _ = writeln!(out, "{name}{labels} {}", v.load());
            }
        }
        for (name, by_labels) in &reg.histograms {
            family_header(&mut out, name, "histogram");
            for (labels, h) in by_labels {
                // Splice `le` into the existing label set.
                let with_le = |le: &str| {
                    if labels.is_empty() {
                        format!("{{le=\"{le}\"}}")
                    } else {
                        format!("{},le=\"{le}\"}}", &labels[..labels.len() - 1])
                    }
                };
                let mut count = 0;
                for (bound, bucket) in h.bounds.iter().zip(&h.counts) {
                    count += bucket.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}_bucket{} {count}", with_le(&bound.to_string()));
                }
                count += h.counts[h.bounds.len()].load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}_bucket{} {count}", with_le("+Inf"));
                let _ = writeln!(out, "{name}_sum{labels} {}", h.sum.load());
                let _ = writeln!(out, "{name}_count{labels} {count}");
            }
        }
        // Read at the scrape, not kept in the registry (see `allocator`).
        crate::allocator::render(&mut out);
        out
    }
}

/// The label a model's series carry where the server serves several.
pub const MODEL_LABEL: &str = "model";

/// One served model's series in the server's [`Metrics`]. Where the server serves several
/// models, every update carries `model="<name>"` (the name requests select it by) before its
/// own labels, so each family holds every model's series side by side; where it serves one,
/// the series carry no such label, exactly as a one-model server's always did.
#[derive(Debug, Clone)]
pub struct ModelMetrics {
    metrics: Arc<Metrics>,
    /// `None`: the server serves this model alone.
    model: Option<Arc<str>>,
}

impl ModelMetrics {
    /// The series of the one model a server serves: unlabelled.
    pub fn only(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            model: None,
        }
    }

    /// The series of the model `name`, one of several the server serves.
    pub fn named(metrics: Arc<Metrics>, name: &str) -> Self {
        Self {
            metrics,
            model: Some(name.into()),
        }
    }

    /// Runs `update` with `labels`, the model's label first where it has one. Without it, no
    /// copy: a one-model server updates its series as it always did.
    fn labelled<R>(&self, labels: &[(&str, &str)], update: impl FnOnce(&[(&str, &str)]) -> R) -> R {
        let Some(model) = self.model.as_deref() else {
            return update(labels);
        };
        let model = (MODEL_LABEL, model);
        match *labels {
            [] => update(&[model]),
            [a] => update(&[model, a]),
            [a, b] => update(&[model, a, b]),
            _ => update(&[&[model][..], labels].concat()),
        }
    }

    pub fn inc(&self, name: &str, labels: &[(&str, &str)]) {
        self.labelled(labels, |labels| self.metrics.inc(name, labels));
    }

    pub fn gauge_set(&self, name: &str, value: f64) {
        self.labelled(&[], |labels| self.metrics.gauge_set(name, labels, value));
    }

    pub fn observe(&self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.labelled(labels, |labels| self.metrics.observe(name, labels, value));
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
