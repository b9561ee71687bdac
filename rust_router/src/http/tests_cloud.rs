//! `POST /`, SageMaker's `/invocations` + `/ping` and Vertex AI's `/vertex`: the body of the
//! route the model serves, by its shape, and 424 for a body of a route it does not serve.

use super::test_util::*;
use crate::backend::fake::FakeBackend;
use serde_json::json;

fn reranker() -> Options {
    Options {
        info: FakeBackend::classifier_info(1),
        ..Default::default()
    }
}

#[tokio::test]
async fn invocations_answer_like_the_models_own_routes() {
    let app = test_app(Options::default());
    for (body, route) in [
        (json!({"inputs": ["hello", "world"]}), "/embed"),
        (
            json!({"inputs": {"source_sentence": "hello", "sentences": ["world"]}}),
            "/similarity",
        ),
    ] {
        let direct = app.post(route, body.clone()).await;
        for via in ["/invocations", "/"] {
            let r = app.post(via, body.clone()).await;
            assert_eq!(r.status, 200, "{via} {body}: {}", r.text);
            assert_eq!(r.json, direct.json, "{via} {body}");
        }
    }
    assert_eq!(app.get("/ping").await.status, 200);

    let app = test_app(reranker());
    for (body, route) in [
        (json!({"query": "a", "texts": ["b", "c"]}), "/rerank"),
        (json!({"inputs": [["a", "b"]]}), "/predict"),
    ] {
        let direct = app.post(route, body.clone()).await;
        let r = app.post("/invocations", body.clone()).await;
        assert_eq!(r.status, 200, "{body}: {}", r.text);
        assert_eq!(r.json, direct.json);
    }
}

#[tokio::test]
async fn a_body_for_a_route_the_model_does_not_serve_is_424() {
    let app = test_app(Options::default());
    let r = app
        .post("/invocations", json!({"query": "a", "texts": ["b"]}))
        .await;
    assert_eq!(r.status, 424, "{}", r.text);
    assert_eq!(r.json["error_type"], "model_type");
    assert!(r.json["error"].as_str().unwrap().contains("/rerank"));
    let r = app
        .post("/invocations", json!({"inputs": [["a", "b"], ["c"]]}))
        .await;
    assert_eq!(r.status, 424, "{}", r.text);

    let app = test_app(reranker());
    let body = json!({"inputs": {"source_sentence": "a", "sentences": ["b"]}});
    assert_eq!(app.post("/invocations", body).await.status, 424);
    let r = app.post("/invocations", json!({"inputs": [[4, 5]]})).await;
    assert_eq!(r.status, 424, "{}", r.text);
}

#[tokio::test]
async fn bad_invocation_bodies_are_422_or_400() {
    let app = test_app(Options::default());
    let r = app.post("/invocations", json!({"nothing": 1})).await;
    assert_eq!(r.status, 422, "{}", r.text);
    let r = app.post("/invocations", json!({"inputs": ""})).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let r = app.post_raw("/invocations", "{not json".into(), &[]).await;
    assert_eq!(r.status, 422);
}

#[tokio::test]
async fn vertex_runs_every_instance_in_order() {
    let app = test_app(Options::default());
    let instances = [
        json!({"inputs": "hello"}),
        json!({"inputs": ["world", "hello"], "dimensions": 4}),
        json!({"inputs": {"source_sentence": "hello", "sentences": ["hello"]}}),
    ];
    let r = app
        .post("/vertex", json!({"instances": instances.clone()}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let predictions = r.json["predictions"].as_array().unwrap();
    assert_eq!(predictions.len(), 3);
    for (instance, prediction) in instances.iter().zip(predictions) {
        assert_eq!(&app.post("/", instance.clone()).await.json, prediction);
    }
    assert_eq!(predictions[1][0].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn vertex_refuses_bad_requests_with_the_first_failure() {
    let app = test_app(Options::default());
    let r = app.post("/vertex", json!({"instances": []})).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.json["error"].as_str().unwrap().contains("`instances`"));
    let r = app.post("/vertex", json!({"inputs": "a"})).await;
    assert_eq!(r.status, 422, "{}", r.text);
    let too_many: Vec<_> = (0..9).map(|_| json!({"inputs": "a"})).collect();
    let r = app.post("/vertex", json!({"instances": too_many})).await;
    assert_eq!(r.status, 422, "{}", r.text);
    let r = app
        .post(
            "/vertex",
            json!({"instances": [{"inputs": "hello"}, {"inputs": "poison"}]}),
        )
        .await;
    assert_eq!(r.status, 424, "{}", r.text);
    assert!(r.json["error"].as_str().unwrap().contains("poison"));
    let r = app
        .post(
            "/vertex",
            json!({"instances": [{"query": "a", "texts": ["b"]}]}),
        )
        .await;
    assert_eq!(r.json["error_type"], "model_type");
}
