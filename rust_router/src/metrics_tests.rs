//! The registry and its Prometheus text; the per-model view ([`ModelMetrics`]).

use super::*;

#[test]
fn renders_counters_gauges_and_histograms() {
    let m = Metrics::new(512);
    m.inc("te_request_count", &[("method", "single")]);
    m.inc("te_request_count", &[("method", "single")]);
    m.inc("te_request_count", &[("method", "batch")]);
    m.gauge_set("te_queue_size", &[], 3.0);
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
    m.gauge_set("te_queue_size", &[], 3.0);
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

#[test]
fn a_models_series_carry_its_name_first_where_the_server_serves_several() {
    let registry = Arc::new(Metrics::new(512));
    let model = ModelMetrics::named(registry.clone(), "rr");
    model.inc("te_request_count", &[]);
    model.inc("te_request_success", &[("method", "batch")]);
    model.gauge_set("te_queue_size", 2.0);
    model.observe(
        "te_batch_next_size",
        &[("lane", "bulk"), ("device", "1")],
        3.0,
    );
    model.inc(
        "te_batch_isolation_pass",
        &[("a", "1"), ("b", "2"), ("c", "3")],
    );
    let text = registry.render();
    assert!(text.contains("te_request_count{model=\"rr\"} 1"), "{text}");
    assert!(text.contains("te_request_success{model=\"rr\",method=\"batch\"} 1"));
    assert!(text.contains("te_queue_size{model=\"rr\"} 2"));
    assert!(text
        .contains("te_batch_next_size_bucket{model=\"rr\",lane=\"bulk\",device=\"1\",le=\"4\"} 1"));
    assert!(text.contains("te_batch_next_size_count{model=\"rr\",lane=\"bulk\",device=\"1\"} 1"));
    assert!(text.contains("te_batch_isolation_pass{model=\"rr\",a=\"1\",b=\"2\",c=\"3\"} 1"));
}

#[test]
fn the_only_models_series_are_the_registrys_own() {
    let direct = Metrics::new(512);
    let registry = Arc::new(Metrics::new(512));
    let only = ModelMetrics::only(registry.clone());
    for (name, labels) in [
        ("te_request_count", &[][..]),
        ("te_request_success", &[("method", "single")][..]),
    ] {
        only.inc(name, labels);
        direct.inc(name, labels);
    }
    only.gauge_set("te_queue_size", 4.0);
    direct.gauge_set("te_queue_size", &[], 4.0);
    only.observe("te_batch_next_size", &[("lane", "bulk")], 2.0);
    direct.observe("te_batch_next_size", &[("lane", "bulk")], 2.0);
    // The allocator's gauges, read at each scrape, differ from one scrape to the next.
    let registry_lines = |m: &Metrics| {
        m.render()
            .lines()
            .filter(|l| !l.contains("te_allocator_"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(registry_lines(&registry), registry_lines(&direct));
    assert!(!registry.render().contains("model="));
}
