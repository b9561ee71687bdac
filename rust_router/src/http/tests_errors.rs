//! Every bad input gets its status and a message that says what to fix.

use super::test_util::*;
use crate::backend::fake::FakeBackend;
use serde_json::{json, Value};
use std::time::Duration;

fn error(r: &Reply) -> &str {
    r.json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not a TEI error: {}", r.text))
}

fn openai_error(r: &Reply) -> &Value {
    let e = &r.json["error"];
    assert!(
        e["message"].is_string() && e["type"].is_string(),
        "{}",
        r.text
    );
    assert_eq!(e["code"], r.status.as_u16());
    e
}

#[tokio::test]
async fn empty_inputs_are_400() {
    let app = test_app(Options::default());
    for (uri, body) in [
        ("/embed", json!({"inputs": ""})),
        ("/embed", json!({"inputs": []})),
        ("/embed", json!({"inputs": ["a", ""]})),
        ("/embed_all", json!({"inputs": []})),
        (
            "/similarity",
            json!({"inputs": {"source_sentence": "a", "sentences": []}}),
        ),
        ("/tokenize", json!({"inputs": []})),
        ("/decode", json!({"ids": []})),
    ] {
        let r = app.post(uri, body.clone()).await;
        assert_eq!(r.status, 400, "{uri} {body}: {}", r.text);
        assert_eq!(r.json["error_type"], "empty");
        assert!(error(&r).contains("cannot be empty"));
    }
    let r = app.post("/v1/embeddings", json!({"input": []})).await;
    assert_eq!(r.status, 400);
    assert!(openai_error(&r)["message"]
        .as_str()
        .unwrap()
        .contains("`input`"));

    let app = test_app(Options {
        info: FakeBackend::classifier_info(1),
        ..Default::default()
    });
    let r = app
        .post("/rerank", json!({"query": "a", "texts": []}))
        .await;
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("`texts`"));
    let r = app.post("/predict", json!({"inputs": []})).await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn over_length_is_422_with_limit_and_length_unless_truncated() {
    let app = test_app(Options::default());
    let long = vec!["a"; 20].join(" ");
    let r = app.post("/embed", json!({"inputs": long})).await;
    assert_eq!(r.status, 422, "{}", r.text);
    let msg = error(&r);
    assert!(msg.contains("16") && msg.contains("Given: 22"), "{msg}");
    let r = app
        .post("/embed", json!({"inputs": long, "truncate": true}))
        .await;
    assert_eq!(r.status, 200);
    let r = app.post("/v1/embeddings", json!({"input": long})).await;
    assert_eq!(r.status, 422);
    assert!(openai_error(&r)["message"]
        .as_str()
        .unwrap()
        .contains("Given: 22"));

    // --auto-truncate makes truncation the default.
    let app = test_app(Options {
        auto_truncate: true,
        ..Default::default()
    });
    assert_eq!(
        app.post("/embed", json!({"inputs": long})).await.status,
        200
    );
    let r = app
        .post("/embed", json!({"inputs": long, "truncate": false}))
        .await;
    assert_eq!(r.status, 422);
}

#[tokio::test]
async fn client_batch_over_limit_is_422() {
    let app = test_app(Options::default());
    let r = app.post("/embed", json!({"inputs": vec!["a"; 9]})).await;
    assert_eq!(r.status, 422);
    assert!(error(&r).contains("batch size 9 > maximum allowed batch size 8"));
    let r = app
        .post("/v1/embeddings", json!({"input": vec!["a"; 9]}))
        .await;
    assert_eq!(r.status, 422);
    openai_error(&r);
    let r = app.post("/tokenize", json!({"inputs": vec!["a"; 9]})).await;
    assert_eq!(r.status, 422);
}

#[tokio::test]
async fn bad_dimensions_are_422() {
    let app = test_app(Options::default());
    for d in [0, 9] {
        let r = app
            .post("/embed", json!({"inputs": "a", "dimensions": d}))
            .await;
        assert_eq!(r.status, 422);
        assert!(error(&r).contains("between 1 and 8"), "{}", r.text);
        let r = app
            .post("/v1/embeddings", json!({"input": "a", "dimensions": d}))
            .await;
        assert_eq!(r.status, 422);
    }
}

#[tokio::test]
async fn wrong_json_unknown_route_and_prompt() {
    let app = test_app(Options::default());
    for body in [
        json!({"inputs": 3}),
        json!({"inputs": "a", "normalize": "yes"}),
        json!({"text": "a"}),
        json!({"inputs": [-1]}),
    ] {
        let r = app.post("/embed", body.clone()).await;
        assert_eq!(r.status, 422, "{body}: {}", r.text);
        assert_eq!(r.json["error_type"], "validation");
    }
    let r = app.post_raw("/embed", "{not json".into(), &[]).await;
    assert_eq!(r.status, 422);
    let r = app
        .post_raw("/v1/embeddings", "{\"input\": 1.5}".into(), &[])
        .await;
    assert_eq!(r.status, 422);
    openai_error(&r);

    let r = app.post("/nope", json!({})).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json["error_type"], "not_found");
    let r = app.post("/v1/nope", json!({})).await;
    assert_eq!(r.status, 404);
    openai_error(&r);

    let r = app
        .post("/embed", json!({"inputs": "a", "prompt_name": "passage"}))
        .await;
    assert_eq!(r.status, 422);
    assert!(error(&r).contains("Available prompts: [\"query\"]"));
    let r = app.post("/embed", json!({"inputs": [2, 400, 3]})).await;
    assert_eq!(r.status, 422);
    assert!(error(&r).contains("outside the vocabulary"));
}

#[tokio::test]
async fn body_over_payload_limit_is_413() {
    let app = test_app(Options {
        payload_limit: 100,
        ..Default::default()
    });
    let big = json!({"inputs": "a ".repeat(100)});
    let r = app.post("/embed", big.clone()).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json["error_type"], "payload_too_large");
    let r = app
        .post("/v1/embeddings", json!({"input": "a ".repeat(100)}))
        .await;
    assert_eq!(r.status, 413);
    openai_error(&r);
}

#[tokio::test]
async fn wrong_model_type_is_424_and_names_the_routes() {
    let app = test_app(Options::default());
    let r = app
        .post("/rerank", json!({"query": "a", "texts": ["b"]}))
        .await;
    assert_eq!(r.status, 424);
    assert!(error(&r).contains("/embed"), "{}", r.text);
    assert_eq!(
        app.post("/predict", json!({"inputs": "a"})).await.status,
        424
    );
    assert_eq!(
        app.post("/embed_sparse", json!({"inputs": "a"}))
            .await
            .status,
        424
    );

    let app = test_app(Options {
        info: FakeBackend::classifier_info(3),
        ..Default::default()
    });
    let r = app.post("/embed", json!({"inputs": "a"})).await;
    assert_eq!(r.status, 424);
    assert!(error(&r).contains("classifier") && error(&r).contains("/predict"));
    let r = app
        .post("/rerank", json!({"query": "a", "texts": ["b"]}))
        .await;
    assert_eq!(r.status, 424, "a 3-label classifier is not a reranker");
    let r = app.post("/v1/embeddings", json!({"input": "a"})).await;
    assert_eq!(r.status, 400);
    assert!(openai_error(&r)["message"]
        .as_str()
        .unwrap()
        .contains("/predict"));
}

#[tokio::test]
async fn api_key_is_required_except_on_probes() {
    let app = test_app(Options {
        api_key: Some("secret".into()),
        ..Default::default()
    });
    let body = json!({"inputs": "a"}).to_string();
    let r = app.post_raw("/embed", body.clone(), &[]).await;
    assert_eq!(r.status, 401);
    assert!(error(&r).contains("missing"));
    let r = app
        .post_raw("/embed", body.clone(), &[("authorization", "Bearer wrong")])
        .await;
    assert_eq!(r.status, 401);
    assert!(error(&r).contains("invalid"));
    let r = app
        .post_raw("/embed", body, &[("authorization", "Bearer secret")])
        .await;
    assert_eq!(r.status, 200);
    let r = app
        .post_raw("/v1/embeddings", json!({"input": "a"}).to_string(), &[])
        .await;
    assert_eq!(r.status, 401);
    openai_error(&r);
    assert_eq!(app.get("/info").await.status, 401);
    assert_eq!(app.get("/health").await.status, 200);
    assert_eq!(app.get("/metrics").await.status, 200);
}

#[tokio::test]
async fn more_than_max_concurrent_is_429() {
    let app = test_app(Options {
        max_concurrent_requests: 1,
        delay: Duration::from_millis(300),
        ..Default::default()
    });
    let (a, b) = tokio::join!(app.post("/embed", json!({"inputs": "a"})), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        app.post("/v1/embeddings", json!({"input": "b"})).await
    });
    assert_eq!(a.status, 200);
    assert_eq!(b.status, 429);
    assert!(openai_error(&b)["message"]
        .as_str()
        .unwrap()
        .contains("overloaded"));
    // The permit is returned with the response.
    assert_eq!(app.post("/embed", json!({"inputs": "a"})).await.status, 200);
}

#[tokio::test]
async fn backend_failure_fails_its_batch_only() {
    let app = test_app(Options::default());
    let r = app.post("/embed", json!({"inputs": "poison"})).await;
    assert_eq!(r.status, 424);
    assert_eq!(r.json["error_type"], "backend");
    assert!(error(&r).contains("ValueError: poison token"));
    let r = app.post("/v1/embeddings", json!({"input": "poison"})).await;
    assert_eq!(r.status, 500);
    openai_error(&r);
    // The server keeps serving.
    let r = app.post("/embed", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 200);
    let r = app.get("/metrics").await;
    assert!(
        r.text.contains("te_batch_inference_failure 2"),
        "{}",
        r.text
    );
    assert!(r.text.contains("te_request_failure{err=\"inference\"} 2"));
}

#[tokio::test]
async fn a_client_that_went_away_costs_no_compute() {
    let app = test_app(Options {
        delay: Duration::from_millis(400),
        ..Default::default()
    });
    let later = |ms: u64, text: &'static str| {
        let app = &app;
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            app.post("/embed", json!({"inputs": text})).await
        }
    };
    // First runs, second is packed as the prefetched batch, third waits in the queue and its
    // client gives up before the backend gets to it.
    let gone = async {
        let r = tokio::time::timeout(Duration::from_millis(250), later(100, "c")).await;
        assert!(r.is_err());
    };
    let (a, b, ()) = tokio::join!(later(0, "a"), later(50, "b"), gone);
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (200, 200));
    let r = app.get("/metrics").await;
    assert!(
        r.text.contains("te_request_failure{err=\"dropped\"} 1"),
        "{}",
        r.text
    );
    assert_eq!(app.seen.lock().unwrap().len(), 2);
}
