//! What clients cannot break: every failure is counted, probes stay public, a half-sent body
//! or a request still running at the shutdown deadline gets an answer, and the smaller
//! contracts (`/decode` ids, the OpenAI over-length message, `POST /` similarity).

use super::test_util::*;
use crate::shutdown::{Phase, Shutdown};
use axum::body::{Body, Bytes};
use axum::http::Request;
use serde_json::json;
use std::time::Duration;

fn failures(app: &TestApp, err: &str) -> u64 {
    app.sample(&format!("te_request_failure{{err=\"{err}\"}}")) as u64
}

#[tokio::test]
async fn every_failure_is_counted_whichever_layer_answers() {
    let app = test_app(Options {
        api_key: Some("k".into()),
        payload_limit: 100,
        ..Default::default()
    });
    let auth = [("authorization", "Bearer k")];
    let r = app.post_raw("/embed", "{not json".into(), &auth).await;
    assert_eq!(r.status, 422);
    let r = app.post_raw("/embed", "x".repeat(200), &auth).await;
    assert_eq!(r.status, 413);
    let r = app.post_raw("/embed", "{}".into(), &[]).await;
    assert_eq!(r.status, 401);
    let r = app.get("/nowhere").await;
    assert_eq!(r.status, 404);
    assert_eq!(failures(&app, "validation"), 1);
    assert_eq!(failures(&app, "payload_too_large"), 1);
    assert_eq!(failures(&app, "unauthorized"), 1);
    assert_eq!(failures(&app, "not_found"), 1);
    // The probe at the base URL needs no key; the inference route there does.
    assert_eq!(app.get("/").await.status, 200);
    let r = app
        .post_raw("/", json!({"inputs": "a"}).to_string(), &[])
        .await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn decode_refuses_ids_outside_the_vocabulary() {
    let app = test_app(Options::default());
    let r = app.post("/decode", json!({"ids": [4, 999]})).await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.json["error"].as_str().unwrap().contains("token id 999"));
    let r = app
        .post("/decode", json!({"ids": [4, 4294967296u64]}))
        .await;
    assert_eq!(r.status, 422);
    let message = r.json["error"].as_str().unwrap();
    assert!(message.contains("from 0 to 4294967295"), "{message}");
    assert!(!message.contains("untagged"), "{message}");
    let r = app.post("/decode", json!({"ids": [[4], [5]]})).await;
    assert_eq!(r.json, json!(["hello", "world"]));
}

#[tokio::test]
async fn openai_over_length_message_fits_the_route() {
    let app = test_app(Options::default());
    let long = "a ".repeat(40);
    let r = app.post("/v1/embeddings", json!({"input": long})).await;
    assert_eq!(r.status, 422);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(!message.contains("truncate: true"), "{message}");
    assert!(message.contains("--auto-truncate"), "{message}");
    assert!(message.contains("`input`"), "{message}");
    let r = app.post("/embed", json!({"inputs": long})).await;
    assert!(r.json["error"].as_str().unwrap().contains("truncate: true"));
}

#[tokio::test]
async fn root_takes_the_sentence_similarity_body() {
    let app = test_app(Options::default());
    let body = json!({"inputs": {"source_sentence": "hello", "sentences": ["hello", "world"]}});
    let root = app.post("/", body.clone()).await;
    assert_eq!(root.status, 200, "{}", root.text);
    let direct = app.post("/similarity", body).await;
    assert_eq!(root.json, direct.json);
    assert!((root.json[0].as_f64().unwrap() - 1.0).abs() < 1e-5);
    let bad = app
        .post("/", json!({"inputs": {"source_sentence": "a"}}))
        .await;
    assert_eq!(bad.status, 422, "{}", bad.text);
}

#[tokio::test]
async fn health_answers_503_once_draining() {
    let shutdown = Shutdown::default();
    let app = test_app(Options {
        shutdown: shutdown.clone(),
        ..Default::default()
    });
    assert_eq!(app.get("/health").await.status, 200);
    shutdown.advance(Phase::Draining);
    let r = app.get("/health").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json["error_type"], "shutting_down");
    // A request that arrives while draining starts no work; scrapes still work.
    let r = app.post("/embed", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["connection"], "close");
    let r = app.post("/v1/embeddings", json!({"input": "hello"})).await;
    assert_eq!(r.json["error"]["type"], "shutting_down");
    assert_eq!(app.get("/metrics").await.status, 200);
    assert!(app.seen.lock().unwrap().is_empty());
}

/// A body that sends one chunk and then never ends.
fn stalled_body() -> Body {
    let first = futures_util::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("{")) });
    Body::from_stream(futures_util::StreamExt::chain(
        first,
        futures_util::stream::pending(),
    ))
}

#[tokio::test]
async fn a_body_that_stalls_gets_408_and_a_closed_connection() {
    let app = test_app(Options {
        body_read_timeout: Duration::from_millis(200),
        ..Default::default()
    });
    let req = Request::post("/embed").body(stalled_body()).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), app.send(req))
        .await
        .expect("the stalled body held the handler");
    assert_eq!(r.status, 408, "{}", r.text);
    assert_eq!(r.json["error_type"], "timeout");
    assert_eq!(r.headers["connection"], "close");
    assert_eq!(failures(&app, "timeout"), 1);
}

#[tokio::test]
async fn a_half_sent_body_is_answered_503_when_draining() {
    let shutdown = Shutdown::default();
    let app = test_app(Options {
        shutdown: shutdown.clone(),
        ..Default::default()
    });
    let req = Request::post("/v1/embeddings")
        .body(stalled_body())
        .unwrap();
    let pending = tokio::spawn(async move { app.send(req).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    shutdown.advance(Phase::Draining);
    let r = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("draining waited for the half-sent body")
        .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.json["error"]["type"], "shutting_down");
}

/// Bodies over `BLOCKING_PARSE_BYTES` are parsed off the tokio workers, with the same answers
/// as small ones: the embeddings, or a 422 in the route's own error shape.
#[tokio::test]
async fn large_bodies_parse_off_the_workers_with_the_same_answers() {
    let app = test_app(Options {
        payload_limit: 1_000_000,
        ..Default::default()
    });
    let padding = " ".repeat(super::body::BLOCKING_PARSE_BYTES);
    let body = format!("{{\"inputs\": [\"hello world\", \"hello\"]{padding}}}");
    let r = app.post_raw("/embed", body, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json.as_array().unwrap().len(), 2);
    let body = format!("{{\"input\": \"hello\", \"model\": \"m\"{padding}}}");
    let r = app.post_raw("/v1/embeddings", body, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .post_raw("/v1/embeddings", format!("{{\"input\": {padding}"), &[])
        .await;
    assert_eq!(r.status, 422);
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Failed to parse the JSON body"));
}
