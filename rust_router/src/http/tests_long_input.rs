//! `long_input`: inputs over the model's limit embedded whole as the weighted mean of their
//! windows, recomputed here from the fake model's pooling; the server default; the refusals.

use super::test_util::*;
use crate::backend::fake::{pooled, FakeBackend};
use crate::infer::l2_normalize;
use crate::tokenization::LongInput;
use serde_json::{json, Value};

/// The fake model's limit is 16 tokens, [CLS] and [SEP] included: windows of 14.
const WINDOW: usize = 14;
const CLS: u32 = 2;
const SEP: u32 = 3;

/// `n` one-token words of the test vocabulary ("a" .. "h", ids 12 .. 19), and their ids.
fn document(n: usize) -> (String, Vec<u32>) {
    let words: Vec<usize> = (0..n).map(|i| (i * 7 + i / 3) % 8).collect();
    let text = words
        .iter()
        .map(|&w| ((b'a' + w as u8) as char).to_string())
        .collect::<Vec<_>>()
        .join(" ");
    (text, words.iter().map(|&w| 12 + w as u32).collect())
}

/// The rule computed here: each window framed by [CLS] .. [SEP], pooled, averaged weighted
/// by its token count, normalized; and the tokens the windows ran.
fn expected(ids: &[u32], overlap: usize) -> (Vec<f32>, usize) {
    let offset = FakeBackend::info().position_offset;
    let step = WINDOW - overlap;
    let mut starts = vec![0];
    while starts.last().unwrap() + WINDOW < ids.len() {
        starts.push(starts.last().unwrap() + step);
    }
    let mut sum = vec![0f64; pooled(&[CLS], &[offset]).len()];
    let (mut weight, mut tokens) = (0, 0);
    for start in starts {
        let window = &ids[start..(start + WINDOW).min(ids.len())];
        let mut seq = vec![CLS];
        seq.extend_from_slice(window);
        seq.push(SEP);
        let positions: Vec<u32> = (offset..offset + seq.len() as u32).collect();
        for (s, x) in sum.iter_mut().zip(pooled(&seq, &positions)) {
            *s += x as f64 * window.len() as f64;
        }
        weight += window.len();
        tokens += seq.len();
    }
    let mut mean: Vec<f32> = sum.iter().map(|s| (s / weight as f64) as f32).collect();
    l2_normalize(&mut mean);
    (mean, tokens)
}

fn vector(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{got:?} != {want:?}");
    }
}

#[tokio::test]
async fn chunked_inputs_are_the_weighted_mean_of_their_windows() {
    let app = test_app(Options::default());
    for (n, overlap) in [(40, 0), (40, 4), (28, 0), (15, 13), (3, 0)] {
        let (text, ids) = document(n);
        let r = app
            .post(
                "/embed",
                json!({"inputs": [text, "hello world"], "long_input": "chunk", "chunk_overlap": overlap}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_close(&vector(&r.json[0]), &expected(&ids, overlap).0);
        // A short input beside it is embedded as always.
        let short = app.post("/embed", json!({"inputs": "hello world"})).await;
        assert_close(&vector(&r.json[1]), &vector(&short.json[0]));
    }
}

#[tokio::test]
async fn usage_counts_every_window_and_openai_and_similarity_chunk_too() {
    let app = test_app(Options::default());
    let (text, ids) = document(40);
    let (want, tokens) = expected(&ids, 2);
    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": [text.clone(), "hello"], "long_input": "chunk", "chunk_overlap": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_close(&vector(&r.json["data"][0]["embedding"]), &want);
    assert_eq!(r.json["usage"]["prompt_tokens"], json!(tokens + 3));
    let r = app
        .post(
            "/similarity",
            json!({"inputs": {"source_sentence": text, "sentences": [text.clone()]},
                   "parameters": {"long_input": "chunk"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        (r.json[0].as_f64().unwrap() - 1.0).abs() < 1e-5,
        "{}",
        r.text
    );
}

#[tokio::test]
async fn long_input_modes_and_the_server_default() {
    let (text, ids) = document(20);
    let app = test_app(Options::default());
    let r = app.post("/embed", json!({"inputs": text.clone()})).await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("long_input"), "{}", r.text);
    let truncated = app
        .post("/embed", json!({"inputs": text.clone(), "truncate": true}))
        .await;
    let r = app
        .post(
            "/embed",
            json!({"inputs": text.clone(), "long_input": "truncate"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, truncated.json);
    // `long_input` wins over `truncate`.
    let r = app
        .post(
            "/embed",
            json!({"inputs": text.clone(), "truncate": true, "long_input": "error"}),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text);

    let app = test_app(Options {
        long_input: LongInput::Chunk,
        ..Default::default()
    });
    let r = app.post("/embed", json!({"inputs": text.clone()})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_close(&vector(&r.json[0]), &expected(&ids, 0).0);
    let r = app
        .post("/embed", json!({"inputs": text, "truncate": true}))
        .await;
    assert_eq!(r.json, truncated.json);
}

#[tokio::test]
async fn an_input_over_max_chunks_is_refused_413_by_name() {
    let app = test_app(Options {
        max_chunks: 2,
        ..Default::default()
    });
    let (ok, _) = document(2 * WINDOW);
    let (over, _) = document(2 * WINDOW + 1);
    let r = app
        .post(
            "/embed",
            json!({"inputs": [ok, over], "long_input": "chunk"}),
        )
        .await;
    assert_eq!(r.status, 413, "{}", r.text);
    let m = r.json["error"].as_str().unwrap();
    assert!(
        m.contains("`inputs[1]` needs 3 windows of 14 tokens"),
        "{m}"
    );
    assert!(m.contains("`--max-chunks` (2)"), "{m}");
    let r = app
        .post(
            "/v1/embeddings",
            json!({"input": over_text(), "long_input": "chunk"}),
        )
        .await;
    assert_eq!(r.status, 413, "{}", r.text);
    assert!(r.text.contains("`input` needs"), "{}", r.text);
}

fn over_text() -> String {
    document(3 * WINDOW).0
}

#[tokio::test]
async fn bad_long_input_values_and_overlaps_are_refused_422() {
    let app = test_app(Options::default());
    let cases = [
        (
            json!({"long_input": "split"}),
            "`long_input` must be \"error\", \"truncate\" or \"chunk\", got \"split\"",
        ),
        (
            json!({"long_input": "chunk", "chunk_overlap": -1}),
            "`chunk_overlap` must be at least 0, got -1",
        ),
        (
            json!({"long_input": "chunk", "chunk_overlap": 1.5}),
            "`chunk_overlap` must be an integer",
        ),
        (
            json!({"long_input": "chunk", "chunk_overlap": 14}),
            "`chunk_overlap` (14) must be smaller than the window (14 tokens",
        ),
    ];
    for (fields, needle) in cases {
        let mut body = json!({"inputs": "hello world"});
        body.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let r = app.post("/embed", body).await;
        assert_eq!(r.status, 422, "{}", r.text);
        let m = r.json["error"].as_str().unwrap();
        assert!(m.contains(needle), "{needle:?} not in {m}");
    }
}
