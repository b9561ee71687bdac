//! `/embed_sparse` over the fake backend's SPLADE model, and the errors of the other routes.

use super::test_util::{test_app, Options, Reply, TestApp};
use crate::backend::fake::{sparse, FakeBackend};
use serde_json::{json, Value};

fn sparse_app() -> TestApp {
    test_app(Options {
        info: FakeBackend::sparse_info(),
        ..Default::default()
    })
}

fn error(r: &Reply) -> &str {
    r.json["error"].as_str().unwrap_or_default()
}

/// Token ids of `text` as the server feeds them to the model.
async fn ids(app: &TestApp, text: &str) -> Vec<u32> {
    let r = app.post("/tokenize", json!({ "inputs": text })).await;
    r.json[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap() as u32)
        .collect()
}

/// One answered vector as (index, value) pairs, read back as the f32 the server sent.
fn pairs(row: &Value) -> Vec<(u32, f32)> {
    row.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["index"].as_u64().unwrap() as u32,
                p["value"].as_f64().unwrap() as f32,
            )
        })
        .collect()
}

#[tokio::test]
async fn embed_sparse_answers_index_value_pairs_per_input() {
    let app = sparse_app();
    // Inputs with different numbers of active dimensions share a batch: the shorter rows'
    // padding (value 0) never reaches the client.
    let texts = ["hello hello world", "hello", "the quick brown fox jumps"];
    let r = app.post("/embed_sparse", json!({ "inputs": texts })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let rows = r.json.as_array().unwrap();
    assert_eq!(rows.len(), texts.len());
    let mut tokens = 0;
    for (row, text) in rows.iter().zip(texts) {
        let ids = ids(&app, text).await;
        tokens += ids.len();
        assert_eq!(pairs(row), sparse(&ids), "{text}");
    }
    assert_eq!(r.headers["x-compute-tokens"], tokens.to_string().as_str());

    // A single string is a batch of one, as on /embed.
    let r = app.post("/embed_sparse", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json.as_array().unwrap().len(), 1);
    assert_eq!(pairs(&r.json[0]), sparse(&ids(&app, "hello").await));
}

#[tokio::test]
async fn sparse_model_on_dense_routes_is_424_naming_embed_sparse() {
    let app = sparse_app();
    for (route, body) in [
        ("/embed", json!({"inputs": "a"})),
        ("/embed_all", json!({"inputs": "a"})),
        ("/predict", json!({"inputs": "a"})),
        (
            "/similarity",
            json!({"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
        ),
    ] {
        let r = app.post(route, body).await;
        assert_eq!(r.status, 424, "{route}: {}", r.text);
        assert!(
            error(&r).contains("SPLADE") && error(&r).contains("/embed_sparse"),
            "{route}: {}",
            r.text
        );
        assert_eq!(r.json["error_type"], "model_type");
    }
    let r = app.post("/v1/embeddings", json!({"input": "a"})).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/embed_sparse"));
}

#[tokio::test]
async fn dense_model_on_embed_sparse_is_424_with_the_reason() {
    let app = test_app(Options::default());
    let r = app.post("/embed_sparse", json!({"inputs": "a"})).await;
    assert_eq!(r.status, 424);
    assert_eq!(r.json["error_type"], "model_type");
    assert!(
        error(&r).contains("an embedding model") && error(&r).contains("needs a SPLADE model"),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn embed_sparse_validates_like_embed() {
    let app = sparse_app();
    let r = app.post("/embed_sparse", json!({"inputs": []})).await;
    assert_eq!(r.status, 400);
    let r = app.post("/embed_sparse", json!({"inputs": [""]})).await;
    assert_eq!(r.status, 400);
    let r = app
        .post("/embed_sparse", json!({"inputs": vec!["a"; 9]}))
        .await;
    assert_eq!(r.status, 422, "over --max-client-batch-size");
    let r = app
        .post(
            "/embed_sparse",
            json!({"inputs": "a", "prompt_name": "nope"}),
        )
        .await;
    assert_eq!(r.status, 422);
    let r = app.post("/embed_sparse", json!({"input": "a"})).await;
    assert_eq!(r.status, 422, "{}", r.text);
    let long = vec!["word"; 40].join(" ");
    let r = app.post("/embed_sparse", json!({ "inputs": long })).await;
    assert_eq!(r.status, 422, "too long without truncation");
    let r = app
        .post("/embed_sparse", json!({"inputs": long, "truncate": true}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn root_route_and_info_of_a_sparse_model() {
    let app = sparse_app();
    let r = app.post("/", json!({"inputs": ["hello", "world"]})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(pairs(&r.json[0]), sparse(&ids(&app, "hello").await));
    let info = app.get("/info").await;
    assert_eq!(
        info.json["model_type"],
        json!({"embedding": {"pooling": "splade"}})
    );
    let spec = app.get("/api-doc/openapi.json").await;
    let path = &spec.json["paths"]["/embed_sparse"]["post"];
    assert!(path["requestBody"].is_object(), "{}", path);
    assert!(spec.json["components"]["schemas"]["SparseValue"].is_object());
}
