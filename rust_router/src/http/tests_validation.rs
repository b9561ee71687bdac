//! The small contracts of request validation: integers written as floats, `null` for a
//! default, messages that name the field and index at fault, 405 answers, the API key's
//! scheme, and the docs page calling no outside service.

use super::test_util::*;
use crate::backend::fake::FakeBackend;
use serde_json::{json, Value};

fn reranker() -> Options {
    Options {
        info: FakeBackend::classifier_info(1),
        ..Default::default()
    }
}

/// The message of a TEI or OpenAI error body.
fn message(r: &Reply) -> String {
    let m = r.json["error"]["message"]
        .as_str()
        .or_else(|| r.json["error"].as_str());
    m.unwrap_or_else(|| panic!("no error message: {}", r.text))
        .to_string()
}

fn refused(r: &Reply, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text);
    let m = message(r);
    assert!(m.contains(needle), "{needle:?} not in {m:?}");
}

#[tokio::test]
async fn integers_written_as_floats_are_integers() {
    let app = test_app(Options::default());
    let r = app
        .post("/embed", json!({"inputs": "hello", "dimensions": 4.0}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json[0].as_array().unwrap().len(), 4);
    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": "hello", "dimensions": 3e0}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["data"][0]["embedding"].as_array().unwrap().len(), 3);
    let r = app
        .post("/embed", json!({"inputs": "hello", "dimensions": 4.5}))
        .await;
    refused(&r, 422, "`dimensions` must be an integer, got 4.5");
    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": "hello", "dimensions": -2}),
        )
        .await;
    refused(&r, 422, "`dimensions` must be an integer from 0 to");
    let app = test_app(reranker());
    let body = |top_n: Value| json!({"query": "what", "texts": ["a", "h", "b"], "top_n": top_n});
    let r = app.post("/rerank", body(json!(2.0))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json.as_array().unwrap().len(), 2);
    let r = app.post("/rerank", body(json!(1390.0))).await;
    assert_eq!(r.json.as_array().unwrap().len(), 3, "{}", r.text);
    refused(
        &app.post("/rerank", body(json!(0.5))).await,
        422,
        "`top_n` must be an integer",
    );
    let docs = |top_n: Value| json!({"query": "what", "documents": ["a", "h"], "top_n": top_n});
    let r = app.post("/v1/rerank", docs(json!(1.0))).await;
    assert_eq!(r.json["results"].as_array().unwrap().len(), 1, "{}", r.text);
    refused(
        &app.post("/v2/rerank", docs(json!("1"))).await,
        422,
        "`top_n` must be an integer",
    );
}

#[tokio::test]
async fn top_n_zero_is_refused_on_every_rerank_route() {
    let app = test_app(reranker());
    let r = app
        .post("/rerank", json!({"query": "q", "texts": ["a"], "top_n": 0}))
        .await;
    refused(&r, 422, "`top_n` must be at least 1, got 0");
    assert_eq!(r.json["error_type"], "validation");
    let r = app
        .post(
            "/rerank",
            json!({"query": "q", "texts": ["a"], "top_n": -1}),
        )
        .await;
    refused(&r, 422, "`top_n` must be at least 1, got -1");
    let r = app
        .post(
            "/v1/rerank",
            json!({"query": "q", "documents": ["a"], "top_n": 0}),
        )
        .await;
    refused(&r, 422, "`top_n` must be at least 1, got 0");
}

#[tokio::test]
async fn encoding_format_null_is_the_default() {
    let app = test_app(Options::default());
    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": "hello", "encoding_format": null}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json["data"][0]["embedding"][0].is_f64(), "{}", r.text);
    let r = app
        .post(
            "/embed",
            json!({"inputs": "hello", "encoding_format": null}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json[0][0].is_f64(), "{}", r.text);
    // `null` for an optional integer is left out too.
    let r = app
        .post("/embed", json!({"inputs": "hello", "dimensions": null}))
        .await;
    assert_eq!(r.json[0].as_array().unwrap().len(), 8, "{}", r.text);
}

#[tokio::test]
async fn ranges_empty_in_every_dimension_are_refused() {
    let app = test_app(Options::default());
    let body = |ranges: Value| json!({"input": "hello", "encoding_format": "uint8", "quantization_ranges": ranges});
    let r = app.post("/v1/embeddings", body(json!([0, 0]))).await;
    refused(&r, 422, "`quantization_ranges` is empty in every dimension");
    let flat = vec![0.5; 8];
    let r = app.post("/v1/embeddings", body(json!([flat, flat]))).await;
    refused(&r, 422, "`quantization_ranges` is empty in every dimension");
    // One dimension that never varies is a calibration set's, and kept.
    let mut hi = vec![1.0; 8];
    hi[0] = -1.0;
    let r = app
        .post("/v1/embeddings", body(json!([vec![-1.0; 8], hi])))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn over_long_inputs_are_named_by_field_and_index() {
    // 16 tokens at most: 20 words are over the limit.
    let long = "a ".repeat(20);
    let app = test_app(Options::default());
    let r = app.post("/embed", json!({"inputs": ["hello", long]})).await;
    refused(&r, 422, "`inputs[1]` must have at most 16 tokens");
    assert!(message(&r).contains("truncate: true"), "{}", r.text);
    let r = app.post("/embed", json!({"inputs": long})).await;
    refused(&r, 422, "`inputs` must have at most 16 tokens");
    let r = app
        .post("/v1/embeddings", json!({"input": ["hello", "world", long]}))
        .await;
    refused(&r, 422, "`input[2]` must have at most 16 tokens");
    assert!(message(&r).contains("--auto-truncate"), "{}", r.text);
    let body = json!({"inputs": {"source_sentence": "hello", "sentences": ["world", long]}});
    let r = app.post("/similarity", body).await;
    refused(&r, 422, "`inputs.sentences[1]` must have at most 16 tokens");
    let app = test_app(reranker());
    let r = app
        .post(
            "/rerank",
            json!({"query": "what", "texts": ["a", "b", "c", long]}),
        )
        .await;
    refused(
        &r,
        422,
        "`texts[3]` (paired with `query`) must have at most 16 tokens",
    );
    let body = json!({"query": "what", "documents": [long], "truncate": false});
    let r = app.post("/v1/rerank", body).await;
    refused(
        &r,
        422,
        "`documents[0]` (paired with `query`) must have at most",
    );
    let r = app
        .post("/predict", json!({"inputs": [["a"], ["b"], ["c", long]]}))
        .await;
    refused(&r, 422, "`inputs[2]` must have at most 16 tokens");
}

#[tokio::test]
async fn an_empty_item_is_named_by_its_index() {
    let app = test_app(reranker());
    let r = app
        .post("/v1/rerank", json!({"query": "q", "documents": [""]}))
        .await;
    refused(&r, 400, "`documents[0]` cannot be empty");
    let r = app
        .post("/rerank", json!({"query": "q", "texts": ["a", ""]}))
        .await;
    refused(&r, 400, "`texts[1]` cannot be empty");
    let r = app
        .post("/predict", json!({"inputs": [["a"], ["b", ""]]}))
        .await;
    refused(&r, 400, "`inputs[1]` cannot be empty");
    // An empty list is the list's own fault.
    let r = app
        .post("/v1/rerank", json!({"query": "q", "documents": []}))
        .await;
    refused(&r, 400, "`documents` cannot be empty");
    let app = test_app(Options::default());
    let r = app.post("/embed", json!({"inputs": ["a", ""]})).await;
    refused(&r, 400, "`inputs[1]` cannot be empty");
    let body = json!({"inputs": {"source_sentence": "", "sentences": ["a"]}});
    let r = app.post("/similarity", body).await;
    refused(&r, 400, "`inputs.source_sentence` cannot be empty");
}

#[tokio::test]
async fn a_wrong_method_gets_405_in_the_routes_shape_with_allow() {
    let app = test_app(Options::default());
    let r = app.get("/embed").await;
    assert_eq!(r.status, 405, "{}", r.text);
    assert_eq!(r.headers["allow"], "POST");
    assert_eq!(r.json["error_type"], "method_not_allowed", "{}", r.text);
    assert!(message(&r).contains("GET"), "{}", r.text);
    let r = app.get("/v1/embeddings").await;
    assert_eq!(r.status, 405, "{}", r.text);
    assert_eq!(r.headers["allow"], "POST");
    assert_eq!(r.json["error"]["type"], "method_not_allowed", "{}", r.text);
    assert_eq!(r.json["error"]["code"], 405);
    let r = app.post("/health", json!({})).await;
    assert_eq!(r.status, 405, "{}", r.text);
    assert!(r.headers["allow"].to_str().unwrap().contains("GET"));
    assert_eq!(r.json["error_type"], "method_not_allowed", "{}", r.text);
    let metrics = app.get("/metrics").await.text;
    assert!(
        metrics.contains("te_request_failure{err=\"method_not_allowed\"} 3"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let app = test_app(Options {
        api_key: Some("k3y".into()),
        ..Default::default()
    });
    let body = json!({"inputs": "hello"}).to_string();
    for auth in ["Bearer k3y", "bearer k3y", "BEARER k3y", "bEaReR  k3y"] {
        let r = app
            .post_raw("/embed", body.clone(), &[("authorization", auth)])
            .await;
        assert_eq!(r.status, 200, "{auth}: {}", r.text);
    }
    // The key itself is compared exactly.
    for auth in ["Bearer K3Y", "Basic k3y", "Bearerk3y", "k3y", "Bearer"] {
        let r = app
            .post_raw("/embed", body.clone(), &[("authorization", auth)])
            .await;
        assert_eq!(r.status, 401, "{auth}: {}", r.text);
    }
}

#[tokio::test]
async fn the_docs_page_calls_no_outside_validator() {
    let app = test_app(Options::default());
    let r = app.get("/docs/swagger-initializer.js").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("\"validatorUrl\": \"none\""), "{}", r.text);
    // And the page still loads the server's own spec.
    assert!(r.text.contains("/api-doc/openapi.json"), "{}", r.text);
}
