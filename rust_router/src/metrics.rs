//! Prometheus metrics with TEI's `te_*` names and buckets.
//!
//! A small registry owned by the app rather than a process-global recorder: every test builds
//! its own app, and the exposition format is simple enough not to need a dependency.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

#[derive(Debug, Clone)]
struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// Metric name, then rendered label set (`""` for none). Nested so that updating an existing
/// series looks it up by `&str`, allocating nothing (these run several times per request).
type Series<V> = BTreeMap<String, BTreeMap<String, V>>;

#[derive(Debug, Default)]
struct Registry {
    counters: Series<u64>,
    gauges: Series<f64>,
    histograms: Series<Histogram>,
}

/// The series `name{labels}` of `map`, created with `init` if new.
fn series<'a, V>(
    map: &'a mut Series<V>,
    name: &str,
    labels: &str,
    init: impl FnOnce() -> V,
) -> &'a mut V {
    if !map.contains_key(name) {
        map.insert(name.to_string(), BTreeMap::new());
    }
    let by_labels = map.get_mut(name).expect("inserted above");
    if !by_labels.contains_key(labels) {
        by_labels.insert(labels.to_string(), init());
    }
    by_labels.get_mut(labels).expect("inserted above")
}

#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
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
            registry: Mutex::default(),
            max_input_length,
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
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
        let labels = render_labels(labels);
        *series(&mut self.registry().counters, name, &labels, || 0) += n;
    }

    pub fn inc(&self, name: &str, labels: &[(&str, &str)]) {
        self.counter_add(name, labels, 1);
    }

    pub fn gauge_set(&self, name: &str, value: f64) {
        *series(&mut self.registry().gauges, name, "", || 0.0) = value;
    }

    pub fn observe(&self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels = render_labels(labels);
        let mut reg = self.registry();
        let h = series(&mut reg.histograms, name, &labels, || {
            let bounds = self.bounds_for(name);
            Histogram {
                counts: vec![0; bounds.len()],
                bounds,
                sum: 0.0,
                count: 0,
            }
        });
        // Cumulative buckets, as the exposition format wants them.
        for (bound, count) in h.bounds.iter().zip(h.counts.iter_mut()) {
            if value <= *bound {
                *count += 1;
            }
        }
        h.sum += value;
        h.count += 1;
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let reg = self.registry();
        let mut out = String::new();
        for (name, by_labels) in &reg.counters {
            let _ = writeln!(out, "# TYPE {name} counter");
            for (labels, v) in by_labels {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        }
        for (name, by_labels) in &reg.gauges {
            for (labels, v) in by_labels {
                let _ = writeln!(out, "# TYPE {name} gauge\n{name}{labels} {v}");
            }
        }
        for (name, by_labels) in &reg.histograms {
            let _ = writeln!(out, "# TYPE {name} histogram");
            for (labels, h) in by_labels {
                // Splice `le` into the existing label set.
                let with_le = |le: &str| {
                    if labels.is_empty() {
                        format!("{{le=\"{le}\"}}")
                    } else {
                        format!("{},le=\"{le}\"}}", &labels[..labels.len() - 1])
                    }
                };
                for (bound, count) in h.bounds.iter().zip(&h.counts) {
                    let _ = writeln!(out, "{name}_bucket{} {count}", with_le(&bound.to_string()));
                }
                let _ = writeln!(out, "{name}_bucket{} {}", with_le("+Inf"), h.count);
                let _ = writeln!(out, "{name}_sum{labels} {}", h.sum);
                let _ = writeln!(out, "{name}_count{labels} {}", h.count);
            }
        }
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
}
