//! Several models in one server: the body's `model` (and `/info?model=`) picks one, the
//! default answers requests that name none, `/v1/models` lists them.

use super::test_util::{test_app, Options, TestApp};
use crate::backend::fake::FakeBackend;
use serde_json::json;

/// The default embedder (`fake/model`, named `model`), a classifier and a reranker.
fn three_models() -> TestApp {
    test_app(Options {
        more_models: vec![
            ("clf=fake/classifier", FakeBackend::classifier_info(3)),
            ("fake/reranker", FakeBackend::classifier_info(1)),
        ],
        ..Default::default()
    })
}

#[tokio::test]
async fn the_body_model_picks_the_model_and_the_default_answers_the_rest() {
    let app = three_models();
    let plain = app.post("/embed", json!({"inputs": "hello"})).await;
    assert_eq!(plain.status, 200, "{}", plain.text);
    for name in ["model", "fake/model"] {
        let named = app
            .post("/embed", json!({"inputs": "hello", "model": name}))
            .await;
        assert_eq!(named.status, 200, "{name}: {}", named.text);
        assert_eq!(named.json, plain.json, "{name}");
    }
    // The classifier's own route, by name; the default (an embedder) does not serve it.
    let predicted = app
        .post("/predict", json!({"inputs": "hello", "model": "clf"}))
        .await;
    assert_eq!(predicted.status, 200, "{}", predicted.text);
    assert_eq!(predicted.json.as_array().unwrap().len(), 3);
    assert_eq!(
        app.post("/predict", json!({"inputs": "hello"}))
            .await
            .status,
        424
    );
    // A route the named model does not serve answers as it does for one model.
    let wrong = app
        .post("/embed", json!({"inputs": "hello", "model": "clf"}))
        .await;
    assert_eq!(wrong.status, 424, "{}", wrong.text);
    // The reranker is named after its id's last path component.
    let body = json!({"query": "q", "texts": ["a", "b"], "model": "reranker"});
    let ranked = app.post("/rerank", body).await;
    assert_eq!(ranked.status, 200, "{}", ranked.text);
    // POST / dispatches by the named model's type.
    let root = app
        .post("/", json!({"inputs": "hello", "model": "clf"}))
        .await;
    assert_eq!(root.json, predicted.json);
}

#[tokio::test]
async fn an_unknown_model_is_404_listing_the_served_names() {
    let app = three_models();
    for (route, body) in [
        ("/embed", json!({"inputs": "x", "model": "nope"})),
        ("/tokenize", json!({"inputs": "x", "model": "nope"})),
        ("/v1/embeddings", json!({"input": "x", "model": "nope"})),
        (
            "/v1/rerank",
            json!({"query": "q", "documents": ["a"], "model": "nope"}),
        ),
    ] {
        let r = app.post(route, body).await;
        assert_eq!(r.status, 404, "{route}: {}", r.text);
        let message = r.text.to_string();
        assert!(message.contains("model_not_found"), "{route}: {message}");
        assert!(
            message.contains(r#"[\"model\", \"clf\", \"reranker\"]"#),
            "{route}: {message}"
        );
    }
    assert_eq!(app.get("/info?model=nope").await.status, 404);
}

#[tokio::test]
async fn models_are_listed_and_described() {
    let app = three_models();
    let list = app.get("/v1/models").await;
    assert_eq!(list.status, 200, "{}", list.text);
    assert_eq!(list.json["object"], "list");
    let data = list.json["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["model", "clf", "reranker"]);
    assert_eq!(data[0]["default"], true);
    assert_eq!(data[1]["default"], false);
    assert_eq!(data[1]["root"], "fake/classifier");
    assert_eq!(data[1]["object"], "model");
    let types: Vec<&str> = data
        .iter()
        .map(|m| m["model_type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["embedding", "classifier", "reranker"]);

    let default = app.get("/info").await;
    assert_eq!(default.json["model_id"], "fake/model");
    let clf = app.get("/info?model=clf").await;
    assert_eq!(clf.status, 200, "{}", clf.text);
    assert_eq!(clf.json["model_id"], "fake/classifier");
    assert_eq!(clf.json["served_model_name"], "clf");
    assert!(
        clf.json["model_type"]["classifier"].is_object(),
        "{}",
        clf.text
    );
    // The OpenAI route reports the model that answered.
    let e = app
        .post(
            "/v1/embeddings",
            json!({"input": "x", "model": "fake/model"}),
        )
        .await;
    assert_eq!(e.json["model"], "fake/model");
}

#[tokio::test]
async fn with_one_model_any_name_is_that_model() {
    // OpenAI's SDKs always send a model name: a one-model server answers whatever it is.
    let app = test_app(Options::default());
    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": "x", "model": "text-embedding-3-small"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        app.post("/embed", json!({"inputs": "x", "model": "other"}))
            .await
            .status,
        200
    );
    let list = app.get("/v1/models").await;
    assert_eq!(list.json["data"].as_array().unwrap().len(), 1);
    assert_eq!(list.json["data"][0]["id"], "model");
}

/// The default model with two LoRA adapters (indexes 1 and 2) and BERT's type-id stride 2.
fn with_adapters() -> TestApp {
    let adapter = |spec: &str, index| (crate::models::LoraSpec::parse(spec).unwrap(), index);
    test_app(Options {
        info: crate::backend::ModelInfo {
            lora_adapters: Some([("a".to_string(), 1), ("b".to_string(), 2)].into()),
            adapter_type_stride: Some(2),
            ..FakeBackend::info()
        },
        adapters: vec![adapter("a=/peft/a", 1), adapter("b=/peft/b", 2)],
        more_models: vec![("clf=fake/classifier", FakeBackend::classifier_info(3))],
        ..Default::default()
    })
}

#[tokio::test]
async fn an_adapter_name_runs_its_model_with_the_adapter_index_in_every_type_id() {
    let app = with_adapters();
    let seen = |app: &TestApp| app.seen.lock().unwrap().last().cloned().unwrap();
    let base = app.post("/embed", json!({"inputs": "hello world"})).await;
    assert_eq!(base.status, 200, "{}", base.text);
    assert!(seen(&app).token_type_ids.iter().all(|&t| t == 0));
    for (name, index) in [("a", 1), ("b", 2)] {
        let r = app
            .post("/embed", json!({"inputs": "hello world", "model": name}))
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        // index * stride + the token's own type (0 for a single text).
        let types = seen(&app).token_type_ids;
        assert!(
            !types.is_empty() && types.iter().all(|&t| t == 2 * index),
            "{types:?}"
        );
        // Token ids as input carry the adapter too.
        let ids = json!({"inputs": [[2, 4, 3]], "model": name});
        let r = app.post("/embed", ids).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(seen(&app).token_type_ids, [2 * index; 3]);
    }
    // An adapter of the default model does not select the other model.
    let r = app
        .post("/predict", json!({"inputs": "x", "model": "a"}))
        .await;
    assert_eq!(r.status, 424, "{}", r.text);
    // Unknown names list the adapters too.
    let r = app
        .post("/embed", json!({"inputs": "x", "model": "c"}))
        .await;
    assert_eq!(r.status, 404);
    assert!(
        r.text.contains(r#"[\"model\", \"clf\", \"a\", \"b\"]"#),
        "{}",
        r.text
    );
    // /v1/models lists each adapter under its base model.
    let list = app.get("/v1/models").await.json;
    let data = list["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["model", "clf", "a", "b"]);
    assert_eq!(data[2]["parent"], "model");
    assert_eq!(data[2]["root"], "/peft/a");
    assert_eq!(data[2]["model_type"], "embedding");
    assert!(data[0]["parent"].is_null());
}
