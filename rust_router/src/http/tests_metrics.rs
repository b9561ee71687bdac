//! The metrics as dashboards and alerts read them: a request is counted once, whatever its
//! number of inputs or `/vertex` instances (also when its client leaves), and `/metrics` is
//! strict Prometheus text, every family with `# HELP` and `# TYPE`.

use super::test_util::*;
use crate::backend::fake::Gate;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Sends `body` to `uri` and leaves (drops the request) once its `inputs` inputs are queued
/// behind a batch the gate holds.
async fn leave_while_queued(app: &TestApp, uri: &'static str, body: Value, inputs: f64) {
    let queued = app.sample("te_request_input_length_count") + inputs;
    let client = tokio::spawn({
        let app = app.clone();
        async move { app.post(uri, body).await }
    });
    until("its inputs are queued", || {
        app.sample("te_request_input_length_count") == queued
    })
    .await;
    assert_eq!(
        app.sample("te_queue_size"),
        inputs,
        "they wait in the queue"
    );
    client.abort();
    assert!(client.await.is_err_and(|e| e.is_cancelled()));
}

#[tokio::test]
async fn a_request_whose_client_left_counts_once_however_many_inputs() {
    let gate = Arc::new(Gate::default());
    let app = test_app(Options {
        gate: Some(gate.clone()),
        interactive_max_tokens: 0,
        ..Default::default()
    });
    // "g" holds the backend thread at the gate, "a" is packed as the next batch: what comes
    // after them waits in the queue.
    let post = |body: Value| {
        let app = app.clone();
        tokio::spawn(async move { app.post("/embed", body).await })
    };
    let g = post(json!({"inputs": "g"}));
    until("the backend is held", || gate.held() == 1).await;
    let held = [g, post(json!({"inputs": "a"}))];
    until("the next batch is packed", || {
        app.sample("te_batch_next_size_count{lane=\"bulk\"}") == 2.0
    })
    .await;
    let inputs = json!({"inputs": ["hello", "world", "a b", "c"]});
    leave_while_queued(&app, "/embed", inputs, 4.0).await;
    assert_eq!(app.sample("te_request_failure{err=\"dropped\"}"), 1.0);
    let instances = json!({"instances": [
        {"inputs": ["hello", "world"]}, {"inputs": "a"}, {"inputs": ["b", "c"]}
    ]});
    leave_while_queued(&app, "/vertex", instances, 5.0).await;
    assert_eq!(app.sample("te_request_failure{err=\"dropped\"}"), 2.0);
    gate.open();
    for request in held {
        assert_eq!(request.await.unwrap().status, 200);
    }
    // The sequences of the requests that left were taken out of the queue.
    until("the queue is empty", || app.sample("te_queue_size") == 0.0).await;
}

#[tokio::test]
async fn a_handler_that_panics_is_not_a_client_that_left() {
    use axum::body::Body;
    use axum::http::Request;
    use futures_util::FutureExt as _;
    use tower::ServiceExt;
    let app = test_app(Options::default());
    let state = app.state.clone();
    let router = axum::Router::new()
        .route(
            "/boom",
            axum::routing::post(|| async { panic!("a bug") as &'static str }),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::guard,
        ))
        .with_state(state);
    let req = Request::post("/boom").body(Body::empty()).unwrap();
    // The panic reaches the caller, as it reaches the HTTP layer that answers it.
    let answered = std::panic::AssertUnwindSafe(router.oneshot(req))
        .catch_unwind()
        .await;
    assert!(answered.is_err());
    assert_eq!(app.sample("te_request_failure{err=\"dropped\"}"), 0.0);
}

#[tokio::test]
async fn vertex_counts_one_request_however_many_instances() {
    let app = test_app(Options::default());
    let body = json!({"instances": [
        {"inputs": "hello"}, {"inputs": ["hello", "world"]}, {"inputs": "world"}
    ]});
    let r = app.post("/vertex", body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.sample("te_request_count{method=\"batch\"}"), 1.0);
    assert_eq!(app.sample("te_request_count{method=\"single\"}"), 0.0);
    assert_eq!(app.sample("te_request_success{method=\"batch\"}"), 1.0);
    assert_eq!(app.sample("te_request_success{method=\"single\"}"), 0.0);
    for histogram in [
        "te_request_duration",
        "te_request_tokenization_duration",
        "te_request_queue_duration",
        "te_request_inference_duration",
    ] {
        assert_eq!(
            app.sample(&format!("{histogram}_count")),
            1.0,
            "{histogram}"
        );
    }
    // Per input, as on every route.
    assert_eq!(app.sample("te_request_input_length_count"), 4.0);
    // The answer's headers add up the instances: "[CLS] word [SEP]" is 3 tokens each.
    assert_eq!(r.headers["x-compute-tokens"], "12");
    assert_eq!(r.headers["x-compute-characters"], "20");
    // One failing instance fails the request, once; nothing of it counts as a success.
    let body = json!({"instances": [{"inputs": "hello"}, {"inputs": ""}]});
    let r = app.post("/vertex", body).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(app.sample("te_request_count{method=\"batch\"}"), 2.0);
    assert_eq!(app.sample("te_request_count{method=\"single\"}"), 0.0);
    assert_eq!(app.sample("te_request_failure{err=\"empty\"}"), 1.0);
    assert_eq!(app.sample("te_request_success{method=\"batch\"}"), 1.0);
    assert_eq!(app.sample("te_request_success{method=\"single\"}"), 0.0);
}

/// A metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*` (no `:` in label names).
fn valid_name(name: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// `{k="v",...}` → the label pairs (escapes `\\`, `\"`, `\n` undone); the rest of the line.
fn parse_labels(line: &str) -> (Vec<(String, String)>, &str) {
    let Some(mut rest) = line.strip_prefix('{') else {
        return (vec![], line);
    };
    let mut labels = vec![];
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after);
        }
        let (name, after) = rest.split_once("=\"").expect("label without =\"");
        assert!(valid_name(name, false), "label name {name:?}: {line}");
        let (mut value, mut chars) = (String::new(), after.char_indices());
        let end = loop {
            match chars.next().expect("unterminated label value") {
                (_, '\\') => match chars.next().expect("dangling escape").1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    c => panic!("bad escape \\{c}: {line}"),
                },
                (i, '"') => break i + 1,
                (_, c) => value.push(c),
            }
        };
        labels.push((name.to_string(), value));
        rest = &after[end..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn parse_value(v: &str) -> f64 {
    match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => v.parse().unwrap_or_else(|_| panic!("value {v:?}")),
    }
}

/// Checks `text` as Prometheus' text format 0.0.4, strictly, and returns its families: each
/// has one `# HELP` and then one `# TYPE` line before its samples, its samples follow them
/// together, names, labels and values are well formed, no series appears twice, and each
/// histogram's buckets rise to `+Inf`, which is its `_count`.
fn check_exposition(text: &str) -> Vec<String> {
    let mut families: Vec<(String, String)> = vec![];
    let mut seen_series = HashSet::new();
    // Per histogram series (labels without `le`): its last bucket value, `+Inf` one, count.
    let mut buckets: HashMap<String, (f64, Option<f64>, Option<f64>)> = HashMap::new();
    let mut help_for: Option<String> = None;
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP without text");
            assert!(valid_name(name, true) && !help.trim().is_empty(), "{line}");
            assert!(
                families.iter().all(|(f, _)| f != name),
                "second HELP: {line}"
            );
            help_for = Some(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE without kind");
            assert_eq!(
                help_for.take().as_deref(),
                Some(name),
                "no HELP before {line}"
            );
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            families.push((name.to_string(), kind.to_string()));
            continue;
        }
        assert!(!line.starts_with('#'), "stray comment: {line}");
        assert!(help_for.is_none(), "HELP without TYPE before {line}");
        let end = line.find(['{', ' ']).expect("sample without value");
        let (name, rest) = line.split_at(end);
        let (labels, rest) = parse_labels(rest);
        let value = parse_value(rest.strip_prefix(' ').expect("no space before the value"));
        let (family, kind) = families.last().expect("sample before any TYPE");
        let suffix = name
            .strip_prefix(family.as_str())
            .expect("sample of another family");
        let allowed: &[&str] = match kind.as_str() {
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        assert!(
            allowed.contains(&suffix),
            "{name} in family {family}: {line}"
        );
        assert!(
            seen_series.insert(format!("{name}{labels:?}")),
            "twice: {line}"
        );
        if kind == "histogram" {
            let key: Vec<_> = labels.iter().filter(|(k, _)| k != "le").collect();
            let entry = buckets
                .entry(format!("{family}{key:?}"))
                .or_insert((0.0, None, None));
            match suffix {
                "_bucket" => {
                    let le = &labels.iter().find(|(k, _)| k == "le").expect("no le").1;
                    assert!(value >= entry.0, "buckets must not decrease: {line}");
                    entry.0 = value;
                    if le == "+Inf" {
                        entry.1 = Some(value);
                    }
                }
                "_count" => entry.2 = Some(value),
                _ => {}
            }
        } else if kind == "counter" {
            assert!(value >= 0.0, "{line}");
        }
    }
    assert!(help_for.is_none(), "HELP without TYPE at the end");
    for (series, (_, inf, count)) in buckets {
        assert!(
            inf.is_some() && inf == count,
            "{series}: +Inf {inf:?}, count {count:?}"
        );
    }
    families.into_iter().map(|(name, _)| name).collect()
}

#[tokio::test]
async fn every_family_has_help_and_type_in_strict_text_format() {
    let app = test_app(Options::default());
    // Successes, failures of several kinds, and a `/vertex` request: the families a server
    // that works and refuses exposes.
    for (uri, body) in [
        ("/embed", json!({"inputs": ["hello", "world"]})),
        ("/v1/embeddings", json!({"input": "hello"})),
        ("/embed", json!({"inputs": ""})),
        ("/embed", json!({"inputs": "poison"})),
        ("/embed", json!({"inputs": "nan"})),
        ("/predict", json!({"inputs": "hello"})),
        ("/vertex", json!({"instances": [{"inputs": "a"}]})),
        ("/nowhere", json!({})),
    ] {
        app.post(uri, body).await;
    }
    let r = app.get("/metrics").await;
    assert_eq!(r.headers["content-type"], "text/plain; version=0.0.4");
    let families = check_exposition(&r.text);
    for family in [
        "te_request_count",
        "te_request_success",
        "te_request_failure",
        "te_request_duration",
        "te_request_input_length",
        "te_queue_size",
        "te_batch_next_size",
        "te_batch_inference_success",
        "te_batch_inference_failure",
        "te_inference_non_finite",
    ] {
        assert!(families.iter().any(|f| f == family), "{family}: {}", r.text);
    }
}

/// Requests of every kind a model's series count: successes (single, batch, OpenAI,
/// `/vertex`) and refusals, each for `model` where given.
async fn requests_of_every_kind(app: &TestApp, model: Option<&str>) {
    let with_model = |mut body: Value| {
        if let Some(model) = model {
            body["model"] = json!(model);
        }
        body
    };
    for (uri, body, status) in [
        ("/embed", json!({"inputs": "hello"}), 200),
        ("/embed", json!({"inputs": ["hello", "world"]}), 200),
        ("/v1/embeddings", json!({"input": "hello"}), 200),
        (
            "/vertex",
            json!({"instances": [with_model(json!({"inputs": "a"}))]}),
            200,
        ),
        ("/embed", json!({"inputs": ""}), 400),
        (
            "/embed",
            json!({"inputs": "hello", "dimensions": 1000}),
            422,
        ),
    ] {
        let body = if uri == "/vertex" {
            body
        } else {
            with_model(body)
        };
        let r = app.post(uri, body).await;
        assert_eq!(r.status, status, "{uri}: {}", r.text);
    }
}

#[tokio::test]
async fn with_one_model_no_series_has_a_model_label() {
    let app = test_app(Options::default());
    requests_of_every_kind(&app, Some("any-name")).await;
    let text = app.get("/metrics").await.text;
    check_exposition(&text);
    assert!(!text.contains("model=\""), "{text}");
    assert_eq!(app.sample("te_request_count{method=\"single\"}"), 2.0);
    assert_eq!(app.sample("te_request_count{method=\"batch\"}"), 2.0);
    assert_eq!(app.sample("te_request_success{method=\"batch\"}"), 2.0);
    assert_eq!(app.sample("te_request_failure{err=\"empty\"}"), 1.0);
    assert_eq!(app.sample("te_request_failure{err=\"validation\"}"), 1.0);
    assert!(text.contains("\nte_queue_size 0\n"), "{text}");
}

/// The default model (`fake/model`, named `model`) and another embedder, `other`.
fn two_embedders() -> TestApp {
    test_app(Options {
        more_models: vec![(
            "other=fake/other",
            crate::backend::fake::FakeBackend::info(),
        )],
        ..Default::default()
    })
}

#[tokio::test]
async fn with_several_models_each_models_series_carry_its_name() {
    let app = two_embedders();
    requests_of_every_kind(&app, Some("other")).await;
    requests_of_every_kind(&app, None).await;
    let r = app.post("/embed", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Refusals before any model was chosen stay the server's.
    let r = app
        .post("/embed", json!({"inputs": "x", "model": "nope"}))
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(app.post("/nowhere", json!({})).await.status, 404);
    let text = app.get("/metrics").await.text;
    let families = check_exposition(&text);
    for (model, singles) in [("other", 2.0), ("model", 3.0)] {
        let sample = |series: &str, labels: &str| {
            app.sample(&format!("{series}{{model=\"{model}\"{labels}}}"))
        };
        assert_eq!(
            sample("te_request_count", ",method=\"single\""),
            singles,
            "{model}"
        );
        assert_eq!(
            sample("te_request_count", ",method=\"batch\""),
            2.0,
            "{model}"
        );
        assert_eq!(sample("te_request_success", ",method=\"batch\""), 2.0);
        // Every single and batch request succeeded; the batches hold 3 inputs in all.
        assert_eq!(sample("te_request_duration_count", ""), singles + 2.0);
        assert_eq!(sample("te_request_input_length_count", ""), singles + 3.0);
        assert_eq!(sample("te_request_failure", ",err=\"empty\""), 1.0);
        assert_eq!(sample("te_request_failure", ",err=\"validation\""), 1.0);
        assert!(sample("te_batch_inference_success", "") >= 1.0, "{model}");
        assert!(text.contains(&format!("te_queue_size{{model=\"{model}\"}} 0\n")));
    }
    assert_eq!(
        app.sample("te_request_failure{err=\"model_not_found\"}"),
        1.0
    );
    assert_eq!(app.sample("te_request_failure{err=\"not_found\"}"), 1.0);
    // Every other series of the families a model updates is some model's.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let family = families.iter().find(|f| line.starts_with(f.as_str()));
        let per_model = family.is_some_and(|f| {
            f.starts_with("te_request_")
                || f.starts_with("te_batch_")
                || f.starts_with("te_queue_")
                || f == "te_inference_non_finite"
        });
        if per_model && !line.starts_with("te_request_failure") {
            assert!(line.contains("{model=\""), "{line}");
        }
    }
}

/// Runs `handler` as the only route of `app`'s state, behind the layers the app's routes have.
fn only_route<H, T>(app: &TestApp, handler: H) -> axum::Router
where
    H: axum::handler::Handler<T, super::AppState>,
    T: 'static,
{
    let state = app.state.clone();
    axum::Router::new()
        .route("/only", axum::routing::post(handler))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::record_failures,
        ))
        .with_state(state)
}

#[tokio::test]
async fn a_request_whose_client_left_counts_in_the_series_of_its_model() {
    use axum::extract::State;
    use tower::ServiceExt;
    let app = two_embedders();
    let routed = Arc::new(tokio::sync::Notify::new());
    let router = only_route(&app, {
        let routed = routed.clone();
        move |State(state): State<super::AppState>| async move {
            let _other = state.for_model(Some("other")).unwrap();
            routed.notify_one();
            std::future::pending::<()>().await;
        }
    });
    let request = axum::http::Request::post("/only")
        .body(axum::body::Body::empty())
        .unwrap();
    let client = tokio::spawn(router.oneshot(request));
    routed.notified().await;
    client.abort();
    assert!(client.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(
        app.sample("te_request_failure{model=\"other\",err=\"dropped\"}"),
        1.0
    );
    assert_eq!(app.sample("te_request_failure{err=\"dropped\"}"), 0.0);
}

#[test]
fn the_checker_refuses_what_promtool_refuses() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n";
    assert_eq!(check_exposition(good), ["a_total"]);
    for bad in [
        "# TYPE a counter\na 1\n",                   // no HELP
        "# HELP a A.\na 1\n",                        // no TYPE
        "# HELP a A.\n# TYPE a counter\nb 1\n",      // a sample of no family
        "# HELP a A.\n# TYPE a counter\na{x=1} 1\n", // unquoted label value
        "# HELP a A.\n# TYPE a counter\na 1\na 2\n", // a series twice
        "# HELP a A.\n# TYPE a histogram\na_bucket{le=\"1\"} 1\na_count 1\n", // no +Inf
    ] {
        let refused = std::panic::catch_unwind(|| check_exposition(bad)).is_err();
        assert!(refused, "accepted: {bad}");
    }
}
