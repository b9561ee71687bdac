//! `priority` and `X-Max-Queue-Ms` through HTTP: the lane each request takes, the 422s, the
//! 503 `queue_timeout` and its counter, and the OpenAPI document.

use super::test_util::*;
use crate::backend::fake::Gate;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn packed(app: &TestApp, lane: &str) -> f64 {
    app.sample(&format!("te_batch_next_size_count{{lane=\"{lane}\"}}"))
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Every POST route that runs the model, with a body it takes (on the fake embedding model,
/// or refused as the wrong model type after the body and header are read).
fn inference_bodies() -> Vec<(&'static str, Value)> {
    vec![
        ("/embed", json!({"inputs": "hello"})),
        ("/embed_all", json!({"inputs": "hello"})),
        ("/embed_sparse", json!({"inputs": "hello"})),
        (
            "/similarity",
            json!({"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
        ),
        ("/predict", json!({"inputs": "hello"})),
        ("/rerank", json!({"query": "a", "texts": ["b"]})),
        ("/v1/rerank", json!({"query": "a", "documents": ["b"]})),
        ("/v2/rerank", json!({"query": "a", "documents": ["b"]})),
        ("/v1/embeddings", json!({"input": "hello"})),
        ("/embeddings", json!({"input": "hello"})),
        ("/", json!({"inputs": "hello"})),
        ("/invocations", json!({"inputs": "hello"})),
    ]
}

fn message(r: &Reply) -> String {
    let e = &r.json["error"];
    e.as_str()
        .or_else(|| e["message"].as_str())
        .unwrap_or_else(|| panic!("no error message: {}", r.text))
        .to_string()
}

#[tokio::test]
async fn every_inference_route_takes_priority_and_refuses_other_values() {
    let app = test_app(Options::default());
    for (uri, body) in inference_bodies() {
        for bad in [json!("urgent"), json!("HIGH"), json!(1), json!(true)] {
            let mut body = body.clone();
            body["priority"] = bad.clone();
            let r = app.post(uri, body).await;
            assert_eq!(r.status, 422, "{uri} {bad}: {}", r.text);
            let m = message(&r);
            assert!(
                m.contains("`priority` must be \"high\", \"low\" or null"),
                "{uri} {bad}: {m}"
            );
        }
        // The accepted values are read (the route may still refuse the model type).
        for good in [json!("high"), json!("low"), Value::Null] {
            let mut body = body.clone();
            body["priority"] = good.clone();
            let r = app.post(uri, body).await;
            assert_ne!(r.status, 422, "{uri} {good}: {}", r.text);
        }
    }
    let vertex = json!({"instances": [{"inputs": "a", "priority": "urgent"}]});
    assert_eq!(app.post("/vertex", vertex).await.status, 422);
}

#[tokio::test]
async fn priority_picks_the_lane() {
    let app = test_app(Options {
        interactive_max_tokens: 8,
        ..Default::default()
    });
    // 12 tokens: bulk by size, interactive when high (within the 64-token batch).
    let large = json!({"inputs": ["a b c d e f", "a b c d e f"]});
    assert_eq!(app.post("/embed", large.clone()).await.status, 200);
    assert_eq!(
        (packed(&app, "interactive"), packed(&app, "bulk")),
        (0.0, 1.0)
    );
    let mut high = large;
    high["priority"] = json!("high");
    assert_eq!(app.post("/embed", high).await.status, 200);
    assert_eq!(
        (packed(&app, "interactive"), packed(&app, "bulk")),
        (1.0, 1.0)
    );
    // 3 tokens: interactive by size, bulk when low (on the OpenAI route too).
    let small = json!({"input": "hello", "priority": "low"});
    assert_eq!(app.post("/v1/embeddings", small).await.status, 200);
    assert_eq!(
        (packed(&app, "interactive"), packed(&app, "bulk")),
        (1.0, 2.0)
    );
    let null = json!({"inputs": "hello", "priority": null});
    assert_eq!(app.post("/embed", null).await.status, 200);
    assert_eq!(
        (packed(&app, "interactive"), packed(&app, "bulk")),
        (2.0, 2.0)
    );
    // Over one batch (64 tokens): high runs in the bulk lane rather than failing.
    let texts: Vec<String> = (0..8).map(|_| "a b c d e f g h i".to_string()).collect();
    let huge = json!({"inputs": texts, "priority": "high"});
    assert_eq!(app.post("/embed", huge).await.status, 200);
    assert_eq!(packed(&app, "interactive"), 2.0);
    assert!(packed(&app, "bulk") >= 3.0);
}

#[tokio::test]
async fn bad_queue_deadlines_are_422_in_the_route_shape() {
    let app = test_app(Options::default());
    for bad in [
        "0",
        "-1",
        "1.5",
        "abc",
        "",
        "3600001",
        "18446744073709551616",
    ] {
        for (uri, body) in inference_bodies() {
            let r = app
                .post_raw(uri, body.to_string(), &[("X-Max-Queue-Ms", bad)])
                .await;
            assert_eq!(r.status, 422, "{uri} {bad:?}: {}", r.text);
            let m = message(&r);
            assert!(
                m.contains("`X-Max-Queue-Ms`") && m.contains("3600000"),
                "{m}"
            );
            let openai = uri.starts_with("/v") && uri != "/vertex" || uri == "/embeddings";
            assert_eq!(r.json["error"].is_object(), openai, "{uri}: {}", r.text);
            if !openai {
                assert_eq!(r.json["error_type"], "validation", "{uri}");
            }
        }
    }
    let ok = app
        .post_raw(
            "/embed",
            json!({"inputs": "hello"}).to_string(),
            &[("x-max-queue-ms", "3600000")],
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    // Routes that run no model ignore it.
    let r = app
        .post_raw(
            "/tokenize",
            json!({"inputs": "hello"}).to_string(),
            &[("X-Max-Queue-Ms", "0")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.sample("te_request_failure{err=\"validation\"}"), 84.0);
}

#[tokio::test]
async fn a_request_past_its_queue_deadline_is_503_queue_timeout_and_counted() {
    let gate = Arc::new(Gate::default());
    let app = test_app(Options {
        gate: Some(gate.clone()),
        interactive_max_tokens: 8,
        ..Default::default()
    });
    let post = |uri: &'static str, body: Value, headers: Vec<(&'static str, &'static str)>| {
        let app = app.clone();
        tokio::spawn(async move { app.post_raw(uri, body.to_string(), &headers).await })
    };
    // "g" holds the bulk thread at the gate, the next bulk request is packed behind it: a
    // bulk request after them waits in the queue.
    let held = post("/embed", json!({"inputs": "g a b c d e f h i"}), vec![]);
    until("the backend is held", || gate.held() == 1).await;
    let next = post("/embed", json!({"inputs": "a b c d e f h i j"}), vec![]);
    until("the next batch is packed", || packed(&app, "bulk") == 2.0).await;
    let tei = post(
        "/embed",
        json!({"inputs": "hello", "priority": "low"}),
        vec![("X-Max-Queue-Ms", "1")],
    );
    let openai = post(
        "/v1/embeddings",
        json!({"input": ["hello", "world"], "priority": "low"}),
        vec![("X-Max-Queue-Ms", "5")],
    );
    let tei = tei.await.unwrap();
    assert_eq!(tei.status, 503, "{}", tei.text);
    assert_eq!(tei.json["error_type"], "queue_timeout", "{}", tei.text);
    assert!(message(&tei).contains("1 ms"), "{}", tei.text);
    let openai = openai.await.unwrap();
    assert_eq!(openai.status, 503, "{}", openai.text);
    assert_eq!(openai.json["error"]["type"], "queue_timeout");
    assert_eq!(openai.json["error"]["code"], 503);
    assert_eq!(app.sample("te_queue_timeout_count"), 2.0);
    assert_eq!(app.sample("te_request_failure{err=\"queue_timeout\"}"), 2.0);
    assert_eq!(app.sample("te_queue_size"), 0.0);
    // A deadline the request meets changes nothing.
    let patient = post(
        "/embed",
        json!({"inputs": "hello"}),
        vec![("X-Max-Queue-Ms", "60000")],
    );
    until("the patient request is queued", || {
        app.sample("te_queue_size") == 1.0
    })
    .await;
    gate.open();
    assert_eq!(held.await.unwrap().status, 200);
    assert_eq!(next.await.unwrap().status, 200);
    assert_eq!(patient.await.unwrap().status, 200);
    // The timed-out requests never reached the backend.
    assert_eq!(app.seen.lock().unwrap().len(), 3);
    assert_eq!(app.sample("te_queue_timeout_count"), 2.0);
    let help = app.get("/metrics").await.text;
    assert!(help.contains("# HELP te_queue_timeout_count "), "{help}");
}

#[tokio::test]
async fn openapi_documents_priority_and_the_queue_header() {
    let app = test_app(Options::default());
    let spec = app.get("/api-doc/openapi.json").await.json;
    let schemas = &spec["components"]["schemas"];
    assert_eq!(schemas["PriorityDoc"]["enum"], json!(["high", "low"]));
    for request in [
        "EmbedRequest",
        "EmbedAllRequest",
        "PredictRequest",
        "RerankRequest",
        "SimilarityRequest",
        "OpenAICompatRequest",
        "CompatRerankRequest",
        "EmbedSparseRequest",
    ] {
        assert!(
            schemas[request]["properties"].get("priority").is_some(),
            "{request}"
        );
    }
    let mut documented = 0;
    for route in super::openapi::INFERENCE_ROUTES {
        // `/embeddings` is an alias the document leaves out.
        if spec["paths"][route].is_null() {
            continue;
        }
        documented += 1;
        let params = spec["paths"][route]["post"]["parameters"]
            .as_array()
            .unwrap_or_else(|| panic!("{route} has no parameters"));
        assert!(
            params
                .iter()
                .any(|p| p["name"] == "X-Max-Queue-Ms" && p["in"] == "header"),
            "{route}: {params:?}"
        );
    }
    assert_eq!(documented, super::openapi::INFERENCE_ROUTES.len() - 1);
    assert!(spec["paths"]["/tokenize"]["post"]["parameters"].is_null());
}
