//! Every route through the real router, queue and backend thread, over the fake backend.

use super::test_util::*;
use crate::backend::fake::{logits, FakeBackend, HIDDEN};
use crate::backend::ScoreActivation;
use crate::infer::activate;
use base64::Engine;
use serde_json::json;

const HELLO_WORLD: [u32; 4] = [2, 4, 5, 3];

#[tokio::test]
async fn embed_single_and_batch() {
    let app = test_app(Options::default());
    let r = app.post("/embed", json!({"inputs": "hello world"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json.as_array().unwrap().len(), 1);
    assert_close(
        &as_vec(&r.json[0]),
        &expected_embedding(&HELLO_WORLD, None, true),
    );
    for h in [
        "x-compute-type",
        "x-compute-time",
        "x-compute-characters",
        "x-compute-tokens",
        "x-total-time",
        "x-tokenization-time",
        "x-queue-time",
        "x-inference-time",
    ] {
        assert!(r.headers.contains_key(h), "missing {h}");
    }
    assert_eq!(r.headers["x-compute-tokens"], "4");
    assert_eq!(r.headers["x-compute-characters"], "11");

    let r = app
        .post(
            "/embed",
            json!({"inputs": ["hello", "world"], "normalize": false}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_close(
        &as_vec(&r.json[0]),
        &expected_embedding(&[2, 4, 3], None, false),
    );
    assert_close(
        &as_vec(&r.json[1]),
        &expected_embedding(&[2, 5, 3], None, false),
    );
}

#[tokio::test]
async fn embed_token_ids_dimensions_and_prompts() {
    let app = test_app(Options::default());
    let r = app.post("/embed", json!({"inputs": [2, 4, 5, 3]})).await;
    assert_close(
        &as_vec(&r.json[0]),
        &expected_embedding(&HELLO_WORLD, None, true),
    );
    let r = app
        .post("/embed", json!({"inputs": [[2, 4, 3], [2, 5, 3]]}))
        .await;
    assert_eq!(r.json.as_array().unwrap().len(), 2);

    // Matryoshka: truncate first, then normalize.
    let r = app
        .post("/embed", json!({"inputs": "hello world", "dimensions": 3}))
        .await;
    assert_close(
        &as_vec(&r.json[0]),
        &expected_embedding(&HELLO_WORLD, Some(3), true),
    );

    let r = app
        .post("/embed", json!({"inputs": "hello", "prompt_name": "query"}))
        .await;
    assert_close(
        &as_vec(&r.json[0]),
        &expected_embedding(&[2, 10, 11, 4, 3], None, true),
    );
}

#[tokio::test]
async fn large_request_is_split_across_batches_and_reassembled() {
    let app = test_app(Options {
        max_batch_tokens: 10,
        ..Default::default()
    });
    let words = ["hello", "world", "what", "is", "deep", "learning", "a", "b"];
    let ids = [4, 5, 6, 7, 8, 9, 12, 13];
    let inputs: Vec<String> = words.iter().map(|w| format!("{w} {w}")).collect();
    let r = app.post("/embed", json!({"inputs": inputs})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for (i, id) in ids.into_iter().enumerate() {
        let expected = expected_embedding(&[2, id, id, 3], None, true);
        assert_close(&as_vec(&r.json[i]), &expected);
    }
    // 8 sequences of 4 tokens under a 10-token budget: at least 4 forward passes, none over.
    let seen = app.seen.lock().unwrap().clone();
    assert!(seen.len() >= 4, "{seen:?}");
    assert!(seen.iter().all(|b| b.num_tokens <= 10), "{seen:?}");
    assert_eq!(seen.iter().map(|b| b.num_seqs).sum::<usize>(), 8);
}

#[tokio::test]
async fn max_batch_requests_caps_forward_passes() {
    let app = test_app(Options {
        max_batch_requests: Some(2),
        ..Default::default()
    });
    let r = app
        .post("/embed", json!({"inputs": ["a", "b", "c", "d", "e"]}))
        .await;
    assert_eq!(r.status, 200);
    let seen = app.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|b| b.num_seqs <= 2), "{seen:?}");
}

#[tokio::test]
async fn embed_all_returns_one_row_per_token() {
    let app = test_app(Options::default());
    let r = app
        .post("/embed_all", json!({"inputs": ["hello", "a b"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let first = r.json[0].as_array().unwrap();
    assert_eq!(first.len(), 3);
    assert_eq!(r.json[1].as_array().unwrap().len(), 4);
    let expected: Vec<f32> = (0..HIDDEN)
        .map(|c| crate::backend::fake::token_state(4, 1, c))
        .collect();
    assert_close(&as_vec(&first[1]), &expected);
}

#[tokio::test]
async fn similarity_is_cosine() {
    let app = test_app(Options::default());
    let r = app
        .post(
            "/similarity",
            json!({"inputs": {"source_sentence": "hello", "sentences": ["hello", "world"]}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let s = as_vec(&r.json);
    assert!((s[0] - 1.0).abs() < 1e-5);
    assert!(s[1] < 0.9999);
}

#[tokio::test]
async fn openai_float_base64_dimensions_usage() {
    let app = test_app(Options::default());
    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": ["hello world", "hello"], "model": "x"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["object"], "list");
    assert_eq!(r.json["model"], "fake/model");
    assert_eq!(r.json["usage"]["prompt_tokens"], 7);
    assert_eq!(r.json["usage"]["total_tokens"], 7);
    assert_eq!(r.json["data"][1]["index"], 1);
    assert_eq!(r.json["data"][0]["object"], "embedding");
    let float = as_vec(&r.json["data"][0]["embedding"]);
    assert_close(&float, &expected_embedding(&HELLO_WORLD, None, true));

    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": "hello world", "encoding_format": "base64", "dimensions": 4}),
        )
        .await;
    let b64 = r.json["data"][0]["embedding"].as_str().unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_close(&decoded, &expected_embedding(&HELLO_WORLD, Some(4), true));
}

fn classifier(num_labels: usize) -> Options {
    Options {
        info: FakeBackend::classifier_info(num_labels),
        ..Default::default()
    }
}

#[tokio::test]
async fn predict_single_pair_and_batch() {
    let app = test_app(classifier(3));
    let r = app.post("/predict", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let preds = r.json.as_array().unwrap();
    assert_eq!(preds.len(), 3);
    let mut expected = logits(&[2, 4, 3], 3);
    activate(&mut expected, ScoreActivation::Softmax);
    let total: f64 = preds.iter().map(|p| p["score"].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-5);
    // Best first, labels from id2label.
    let scores: Vec<f64> = preds.iter().map(|p| p["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]));
    let best = expected
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap();
    assert_eq!(preds[0]["label"], format!("LABEL_{}", best.0));

    let r = app
        .post(
            "/predict",
            json!({"inputs": ["hello", "world"], "raw_scores": true}),
        )
        .await;
    let raw = logits(&[2, 4, 3, 5, 3], 3);
    let got = r.json.as_array().unwrap();
    for p in got {
        let i: usize = p["label"].as_str().unwrap()[6..].parse().unwrap();
        assert!((p["score"].as_f64().unwrap() as f32 - raw[i]).abs() < 1e-5);
    }

    let r = app
        .post(
            "/predict",
            json!({"inputs": [["hello"], ["hello", "world"]]}),
        )
        .await;
    assert_eq!(r.json.as_array().unwrap().len(), 2);
    assert_eq!(r.json[1].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn rerank_sorts_and_honours_top_n_and_return_text() {
    let app = test_app(classifier(1));
    let r = app
        .post(
            "/rerank",
            json!({"query": "what", "texts": ["a", "h", "b"], "return_text": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ranks = r.json.as_array().unwrap();
    assert_eq!(ranks.len(), 3);
    // Logit grows with the mean id: "h" (19) > "b" (13) > "a" (12).
    let order: Vec<u64> = ranks.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(order, vec![1, 2, 0]);
    assert_eq!(ranks[0]["text"], "h");
    let mut expected = logits(&[2, 6, 3, 19, 3], 1);
    activate(&mut expected, ScoreActivation::Sigmoid);
    assert!((ranks[0]["score"].as_f64().unwrap() as f32 - expected[0]).abs() < 1e-5);

    let r = app
        .post(
            "/rerank",
            json!({"query": "what", "texts": ["a", "h", "b"], "top_n": 1, "raw_scores": true}),
        )
        .await;
    let ranks = r.json.as_array().unwrap();
    assert_eq!(ranks.len(), 1);
    assert!(ranks[0].get("text").is_none());
    assert!(
        (ranks[0]["score"].as_f64().unwrap() as f32 - logits(&[2, 6, 3, 19, 3], 1)[0]).abs() < 1e-5
    );
}

#[tokio::test]
async fn root_dispatches_by_model_type() {
    let app = test_app(Options::default());
    let r = app.post("/", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json[0].as_array().unwrap().len(), HIDDEN);

    let app = test_app(classifier(3));
    let r = app.post("/", json!({"inputs": "hello"})).await;
    assert_eq!(r.json[0]["label"].as_str().unwrap().len(), 7);

    let app = test_app(classifier(1));
    let r = app.post("/", json!({"query": "a", "texts": ["b"]})).await;
    assert_eq!(r.json[0]["index"], 0);
}

#[tokio::test]
async fn tokenize_and_decode() {
    let app = test_app(Options::default());
    let r = app
        .post("/tokenize", json!({"inputs": "hello world"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let toks = r.json[0].as_array().unwrap();
    assert_eq!(toks.len(), 4);
    assert_eq!(
        toks[1],
        json!({"id": 4, "text": "hello", "special": false, "start": 0, "stop": 5})
    );
    assert_eq!(toks[0]["special"], true);
    let r = app
        .post(
            "/tokenize",
            json!({"inputs": ["a", "b"], "add_special_tokens": false}),
        )
        .await;
    assert_eq!(r.json[1].as_array().unwrap().len(), 1);

    let r = app.post("/decode", json!({"ids": [2, 4, 5, 3]})).await;
    assert_eq!(r.json, json!(["hello world"]));
    let r = app
        .post(
            "/decode",
            json!({"ids": [[2, 4, 3]], "skip_special_tokens": false}),
        )
        .await;
    assert_eq!(r.json, json!(["[CLS] hello [SEP]"]));
}

#[tokio::test]
async fn info_health_metrics_and_docs() {
    let app = test_app(Options::default());
    let r = app.get("/info").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["model_id"], "fake/model");
    assert_eq!(r.json["model_type"]["embedding"]["pooling"], "mean");
    assert_eq!(r.json["max_input_length"], 16);
    assert_eq!(r.json["prompts"]["query"], "query : ");
    assert_eq!(app.get("/health").await.status, 200);
    assert_eq!(app.get("/ping").await.status, 200);

    app.post("/embed", json!({"inputs": "hello"})).await;
    let r = app.get("/metrics").await;
    assert_eq!(r.status, 200);
    for name in [
        "te_request_count{method=\"single\"} 1",
        "te_request_success{method=\"single\"} 1",
        "te_request_duration_bucket",
        "te_request_tokenization_duration_count 1",
        "te_request_queue_duration_count 1",
        "te_request_inference_duration_count 1",
        "te_request_input_length_bucket{le=\"4\"} 1",
        "te_batch_next_size_count{lane=\"interactive\"} 1",
        "te_batch_next_tokens_count{lane=\"interactive\"} 1",
        "te_batch_inference_duration_count 1",
        "te_batch_inference_success 1",
        "te_queue_size 0",
    ] {
        assert!(r.text.contains(name), "missing {name} in\n{}", r.text);
    }

    let r = app.get("/api-doc/openapi.json").await;
    assert_eq!(r.status, 200);
    for path in [
        "/embed",
        "/rerank",
        "/predict",
        "/v1/embeddings",
        "/tokenize",
    ] {
        assert!(
            r.json["paths"].get(path).is_some(),
            "{path} missing from OpenAPI"
        );
    }
    let r = app.get("/docs").await;
    assert!(r.status.is_redirection(), "{}", r.status);
    assert_eq!(r.headers["location"], "/docs/");
    // The page and its assets come from the binary: nothing is loaded from a CDN.
    let page = app.get("/docs/").await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("swagger-ui"), "{}", page.text);
    assert!(!page.text.contains("https://"), "{}", page.text);
    for asset in [
        "swagger-ui.css",
        "swagger-ui-bundle.js",
        "swagger-initializer.js",
    ] {
        let r = app.get(&format!("/docs/{asset}")).await;
        assert_eq!(r.status, 200, "{asset}");
        assert!(!r.text.contains("cdn."), "{asset} loads from a CDN");
    }
    let init = app.get("/docs/swagger-initializer.js").await;
    assert!(init.text.contains("/api-doc/openapi.json"), "{}", init.text);
}

#[tokio::test]
async fn unhealthy_backend_gives_503() {
    let app = test_app(Options {
        healthy: false,
        ..Default::default()
    });
    let r = app.get("/health").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json["error_type"], "unhealthy");
    assert!(r.json["error"].as_str().unwrap().contains("CUDA error"));
}

#[tokio::test]
async fn queries_and_bulk_requests_answer_on_two_lanes() {
    let app = test_app(Options {
        info: crate::backend::ModelInfo {
            interactive_lane: true,
            ..FakeBackend::info()
        },
        interactive_max_tokens: 8,
        ..Default::default()
    });
    let r = app.post("/embed", json!({"inputs": "hello world"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_close(
        &as_vec(&r.json[0]),
        &expected_embedding(&HELLO_WORLD, None, true),
    );
    // 3 × 4 tokens: over the 8-token limit, so bulk, and queued together into one batch.
    let r = app
        .post("/embed", json!({"inputs": ["a b", "a b", "hello world"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_close(
        &as_vec(&r.json[2]),
        &expected_embedding(&HELLO_WORLD, None, true),
    );
    let threads: Vec<String> = app
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|b| b.thread.clone())
        .collect();
    assert_eq!(threads, ["model-interactive", "model-backend"]);
    let r = app.get("/metrics").await;
    for line in [
        "te_batch_next_size_count{lane=\"interactive\"} 1",
        "te_batch_next_size_count{lane=\"bulk\"} 1",
        "te_batch_next_tokens_sum{lane=\"bulk\"} 12",
        "te_queue_size 0",
    ] {
        assert!(r.text.contains(line), "missing {line} in\n{}", r.text);
    }
}
