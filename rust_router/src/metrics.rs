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

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

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

    pub fn gauge_set(&self, name: &str, value: f64) {
        self.update(
            |r| &r.gauges,
            |r| &mut r.gauges,
            name,
            "",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let m = Metrics::new(512);
        m.inc("te_request_count", &[("method", "single")]);
        m.inc("te_request_count", &[("method", "single")]);
        m.inc("te_request_count", &[("method", "batch")]);
        m.gauge_set("te_queue_size", 3.0);
        m.observe("te_request_input_length", &[], 7.0);
        m.observe("te_request_duration", &[("method", "x")], 0.5);
        let text = m.render();
        assert!(text.contains("# TYPE te_request_count counter"));
        assert!(text.contains("te_request_count{method=\"single\"} 2"));
        assert!(text.contains("te_request_count{method=\"batch\"} 1"));
        assert!(text.contains("te_queue_size 3"));
        // 7 tokens fall in the 8 bucket, not the 4 bucket; buckets stop at the model's limit.
        assert!(text.contains("te_request_input_length_bucket{le=\"4\"} 0"));
        assert!(text.contains("te_request_input_length_bucket{le=\"8\"} 1"));
        assert!(text.contains("te_request_input_length_bucket{le=\"512\"} 1"));
        assert!(!text.contains("te_request_input_length_bucket{le=\"1024\"}"));
        assert!(text.contains("te_request_input_length_count 1"));
        assert!(text.contains("te_request_duration_bucket{method=\"x\",le=\"+Inf\"} 1"));
        assert!(text.contains("te_request_duration_sum{method=\"x\"} 0.5"));
    }

    /// The `"te_..."` string literals of the crate's sources, tests left out: the names of
    /// the families the router updates (directly or through a constant).
    fn names_in_sources(dir: &std::path::Path, names: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let file = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                names_in_sources(&path, names);
                continue;
            }
            // Tests make up series; the allocator renders its gauges with their own help.
            let skip = file.starts_with("test") || file.ends_with("_tests.rs");
            if skip || file == "allocator.rs" || !file.ends_with(".rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("\"te_") {
                let name: String = text[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                // `"te_"` alone is this scan's own pattern.
                if name.len() > 3 && text[at + 1 + name.len()..].starts_with('"') {
                    names.push((name, file.clone()));
                }
            }
        }
    }

    #[test]
    fn every_family_the_router_updates_has_help() {
        let mut names = vec![];
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        names_in_sources(&src, &mut names);
        assert!(names.iter().any(|(n, _)| n == "te_request_failure"));
        for (name, file) in names {
            assert!(help(&name).is_some(), "{name} ({file}) has no help text");
        }
    }

    #[test]
    fn every_family_is_rendered_with_help_and_type_once() {
        let m = Metrics::new(512);
        m.inc("te_request_count", &[("method", "single")]);
        m.inc("te_request_count", &[("method", "batch")]);
        m.gauge_set("te_queue_size", 3.0);
        m.observe("te_request_duration", &[("method", "x")], 0.5);
        m.observe("te_request_duration", &[("method", "y")], 0.5);
        let text = m.render();
        for (name, kind) in [
            ("te_request_count", "counter"),
            ("te_queue_size", "gauge"),
            ("te_request_duration", "histogram"),
        ] {
            let help = format!(
                "# HELP {name} {}\n# TYPE {name} {kind}\n",
                help(name).unwrap()
            );
            assert_eq!(text.matches(&help).count(), 1, "{name}: {text}");
            assert_eq!(
                text.matches(&format!("# TYPE {name} ")).count(),
                1,
                "{text}"
            );
        }
    }

    #[test]
    fn updates_from_many_threads_all_count() {
        let m = Metrics::new(512);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for i in 0..1000 {
                        m.observe("te_batch_next_size", &[("lane", "bulk")], (i % 4) as f64);
                        m.inc("te_request_count", &[("method", "batch")]);
                    }
                });
            }
        });
        let text = m.render();
        assert!(text.contains("te_request_count{method=\"batch\"} 8000"));
        // 0, 1, 2, 3 once each per four: two in the `le="1"` bucket, all by `le="4"`.
        assert!(text.contains("te_batch_next_size_bucket{lane=\"bulk\",le=\"1\"} 4000"));
        assert!(text.contains("te_batch_next_size_bucket{lane=\"bulk\",le=\"4\"} 8000"));
        assert!(text.contains("te_batch_next_size_count{lane=\"bulk\"} 8000"));
        assert!(text.contains("te_batch_next_size_sum{lane=\"bulk\"} 12000"));
    }

    #[test]
    fn values_above_every_bound_count_only_in_inf() {
        let m = Metrics::new(512);
        m.observe("te_batch_next_size", &[], 1e6);
        let text = m.render();
        assert!(text.contains("te_batch_next_size_bucket{le=\"4096\"} 0"));
        assert!(text.contains("te_batch_next_size_bucket{le=\"+Inf\"} 1"));
        assert!(text.contains("te_batch_next_size_count 1"));
    }

    #[test]
    fn updates_do_not_wait_for_a_scrape() {
        let m = Metrics::new(512);
        m.observe("te_request_input_length", &[], 3.0);
        // A scrape in progress holds the registry for reading; a request's update of a
        // series that exists goes through beside it rather than after it.
        let scrape = m.read();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                m.observe("te_request_input_length", &[], 5.0);
                let _ = done_tx.send(());
            });
            let updated = done_rx.recv_timeout(std::time::Duration::from_secs(5));
            drop(scrape);
            assert!(updated.is_ok(), "the update waited for the scrape");
        });
        assert!(m.render().contains("te_request_input_length_count 2"));
    }

    /// `name value` lines of a scrape, for the allocator's gauges.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn scraped(text: &str, name: &str) -> usize {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in the scrape:\n{text}"))
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_scrape_shows_every_gauge_with_help_and_plausible_values() {
        let text = Metrics::new(512).render();
        let stats = crate::allocator::stats().expect("glibc >= 2.33");
        for (name, _, _) in crate::allocator::gauges(&stats) {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no help"
            );
            assert!(
                text.contains(&format!("# TYPE {name} gauge")),
                "{name} not a gauge"
            );
        }
        // In the order `gauges` lists them (named through it: a `"te_..."` literal here would
        // be taken for a family of the registry by the help check above).
        let [arenas, arena, in_use, free, mmap] =
            crate::allocator::gauges(&stats).map(|(name, _, _)| scraped(&text, name));
        assert!(arenas >= 1);
        // A test process has allocated something; what is free in the arenas is part of
        // them, and what is in use is in the arenas or mapped on its own (each read is a
        // snapshot, and other tests allocate beside this one: a margin, not equality).
        assert!(arena > 0 && in_use > 0);
        assert!(free <= arena + (64 << 20), "free {free} > arena {arena}");
        assert!(
            in_use <= arena + mmap + (64 << 20),
            "{in_use} > {arena} + {mmap}"
        );
    }
}
