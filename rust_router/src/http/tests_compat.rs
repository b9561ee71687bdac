//! The Cohere/Jina rerank routes and the quantized encodings, over the fake backend.

use super::quantize::pack_bits;
use super::test_util::*;
use crate::backend::fake::{logits, FakeBackend};
use crate::backend::ScoreActivation;
use crate::infer::activate;
use serde_json::{json, Value};

fn reranker() -> Options {
    Options {
        info: FakeBackend::classifier_info(1),
        ..Default::default()
    }
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn compat_rerank_matches_tei_rerank() {
    let app = test_app(reranker());
    let docs = json!(["a", {"text": "h", "title": "x"}, "b"]);
    for (uri, version) in [("/v1/rerank", "1"), ("/v2/rerank", "2")] {
        let r = app
            .post(
                uri,
                json!({"model": "m", "query": "what", "documents": docs, "top_n": 2,
                       "return_documents": true}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let results = r.json["results"].as_array().unwrap();
        // As `/rerank`: "h" > "b" > "a", sigmoid of the logit; top_n keeps two.
        let order: Vec<u64> = results
            .iter()
            .map(|x| x["index"].as_u64().unwrap())
            .collect();
        assert_eq!(order, vec![1, 2]);
        assert_eq!(results[0]["document"], json!({"text": "h"}));
        let mut expected = logits(&[2, 6, 3, 19, 3], 1);
        activate(&mut expected, ScoreActivation::Sigmoid);
        let score = results[0]["relevance_score"].as_f64().unwrap() as f32;
        assert!(
            (score - expected[0]).abs() < 1e-5,
            "{score} vs {expected:?}"
        );
        assert_eq!(r.json["meta"]["api_version"]["version"], version);
        assert_eq!(r.json["meta"]["billed_units"]["search_units"], 1);
        let tokens = r.json["usage"]["total_tokens"].as_u64().unwrap();
        assert!(tokens > 0);
        assert_eq!(r.json["meta"]["tokens"]["input_tokens"], tokens);
        assert_eq!(r.json["model"], "fake/model");
        assert_eq!(r.json["id"].as_str().unwrap().len(), 36);
    }
    // Without return_documents (Cohere's default) there is no `document`; no top_n is all.
    let r = app
        .post(
            "/v1/rerank",
            json!({"query": "what", "documents": ["a", "b"]}),
        )
        .await;
    let results = r.json["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert!(
        results.iter().all(|x| x.get("document").is_none()),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn compat_rerank_bad_inputs() {
    let app = test_app(reranker());
    let cases = [
        (
            json!({"query": "q", "documents": ["a"], "top_n": 0}),
            422,
            "`top_n`",
        ),
        (
            json!({"query": "q", "documents": ["a"], "top_n": -3}),
            422,
            "`top_n` must be at least 1, got -3",
        ),
        (
            json!({"query": "q", "documents": []}),
            400,
            "`documents` cannot be empty",
        ),
        (
            json!({"query": "q", "documents": ["a", ""]}),
            400,
            "`documents[1]` cannot be empty",
        ),
        (
            json!({"query": "", "documents": ["a"]}),
            400,
            "`query` cannot be empty",
        ),
        (
            json!({"query": "q", "documents": [1]}),
            422,
            "`documents[0]`",
        ),
        (
            json!({"query": "q", "documents": "a"}),
            422,
            "must be a list",
        ),
        (
            json!({"query": "q", "documents": [{"title": "a"}]}),
            422,
            "`text`",
        ),
        (
            json!({"query": "q", "documents": ["a"], "rank_fields": ["title"]}),
            422,
            "rank_fields",
        ),
        (json!({"documents": ["a"]}), 422, "query"),
    ];
    for uri in ["/v1/rerank", "/v2/rerank"] {
        for (body, status, expected) in &cases {
            let r = app.post(uri, body.clone()).await;
            assert_eq!(r.status, *status, "{uri} {body}: {}", r.text);
            let message = r.json["error"]["message"].as_str().unwrap();
            assert!(message.contains(expected), "{uri} {body}: {message}");
            assert_eq!(r.json["error"]["code"], *status);
        }
    }
    // An embedding model is no reranker: 400 naming what it serves.
    let app = test_app(Options::default());
    let r = app
        .post("/v2/rerank", json!({"query": "q", "documents": ["a"]}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("an embedding model"), "{message}");
    assert!(message.contains("/embed"), "{message}");
}

#[tokio::test]
async fn quantized_encodings_on_embed_and_openai() {
    let app = test_app(Options::default());
    let float = app
        .post("/embed", json!({"inputs": "hello world", "dimensions": 6}))
        .await;
    let float = as_vec(&float.json[0]);
    let bucket = |x: f32| ((x + 1.0) / (2.0f32 / 255.0)).floor().clamp(0.0, 255.0) as i64;
    let uint8: Vec<i64> = float.iter().map(|x| bucket(*x)).collect();
    let int8: Vec<i64> = uint8.iter().map(|b| b - 128).collect();
    let ubinary: Vec<i64> = pack_bits(&float).into_iter().map(i64::from).collect();
    let binary: Vec<i64> = ubinary.iter().map(|b| b - 128).collect();
    for (format, expected) in [
        ("uint8", &uint8),
        ("int8", &int8),
        ("ubinary", &ubinary),
        ("binary", &binary),
    ] {
        let r = app
            .post(
                "/embed",
                json!({"inputs": ["hello world"], "dimensions": 6, "encoding_format": format}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(&ints(&r.json[0]), expected, "{format}");
        let r = app
            .post(
                "/v1/embeddings",
                json!({"input": "hello world", "dimensions": 6, "encoding_format": format}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(&ints(&r.json["data"][0]["embedding"]), expected, "{format}");
    }
    assert_eq!(ubinary.len(), 1, "6 dimensions pack into 1 byte");
    // Client ranges, shared by every dimension.
    let r = app
        .post(
            "/embed",
            json!({"inputs": "hello world", "dimensions": 6, "encoding_format": "uint8",
                   "quantization_ranges": [-0.5, 0.5]}),
        )
        .await;
    let step = 1.0f32 / 255.0;
    let expected: Vec<i64> = float
        .iter()
        .map(|x| ((x + 0.5) / step).floor().clamp(0.0, 255.0) as i64)
        .collect();
    assert_eq!(ints(&r.json[0]), expected);
}

#[tokio::test]
async fn bad_encodings_are_422() {
    let app = test_app(Options::default());
    let cases = [
        (
            "/embed",
            json!({"inputs": "a", "encoding_format": "int4"}),
            "unknown variant",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "encoding_format": "int4"}),
            "unknown variant",
        ),
        (
            "/embed",
            json!({"inputs": "a", "encoding_format": "int8", "normalize": false}),
            "unnormalized",
        ),
        (
            "/embed",
            json!({"inputs": "a", "encoding_format": "float", "quantization_ranges": [0, 1]}),
            "`int8` and `uint8`",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "encoding_format": "uint8", "dimensions": 3,
                   "quantization_ranges": [[0, 0], [1, 1]]}),
            "3 dimensions",
        ),
        (
            "/embed",
            json!({"inputs": "a", "encoding_format": "uint8", "quantization_ranges": [1]}),
            "quantization_ranges",
        ),
    ];
    for (uri, body, expected) in cases {
        let r = app.post(uri, body.clone()).await;
        assert_eq!(r.status, 422, "{uri} {body}: {}", r.text);
        let message = r.json["error"]
            .as_str()
            .or_else(|| r.json["error"]["message"].as_str())
            .unwrap();
        assert!(message.contains(expected), "{uri} {body}: {message}");
    }
}

#[tokio::test]
async fn openapi_documents_the_routes_and_fields() {
    let app = test_app(Options::default());
    let spec = app.get("/api-doc/openapi.json").await.json;
    for path in ["/v1/rerank", "/v2/rerank"] {
        let body = &spec["paths"][path]["post"]["requestBody"]["content"]["application/json"];
        assert_eq!(
            body["schema"]["$ref"], "#/components/schemas/CompatRerankRequest",
            "{path}"
        );
    }
    let schemas = &spec["components"]["schemas"];
    let formats: Vec<&str> = schemas["EncodingFormat"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        formats,
        ["float", "base64", "int8", "uint8", "binary", "ubinary"]
    );
    for request in ["EmbedRequest", "OpenAICompatRequest"] {
        let props = &schemas[request]["properties"];
        assert!(props.get("encoding_format").is_some(), "{request}");
        assert!(props.get("quantization_ranges").is_some(), "{request}");
    }
    // Integer codes are numbers too: the branches must be `anyOf`, not `oneOf`.
    assert_eq!(schemas["Embedding"]["anyOf"].as_array().unwrap().len(), 3);
    // Within what the server parses (i64): a larger `top_n` is refused, as the spec says.
    let top_n = &schemas["CompatRerankRequest"]["properties"]["top_n"];
    assert_eq!(top_n["format"], "int64", "{top_n}");
    assert_eq!(top_n["minimum"], 1, "{top_n}");
    let result = &schemas["CompatRerankResult"]["properties"];
    for field in ["index", "relevance_score", "document"] {
        assert!(result.get(field).is_some(), "{field}");
    }
}

#[tokio::test]
async fn openapi_documents_text_and_image_input_objects() {
    let app = test_app(Options::default());
    let spec = app.get("/api-doc/openapi.json").await.json;
    let input = &spec["components"]["schemas"]["InputDoc"];
    let branches = |schema: &Value| -> Vec<Value> {
        let list = schema.get("oneOf").or_else(|| schema.get("anyOf"));
        list.and_then(Value::as_array).cloned().unwrap_or_default()
    };
    let keys = |branches: &[Value]| -> Vec<String> {
        branches
            .iter()
            .filter_map(|b| b["properties"].as_object())
            .flat_map(|p| p.keys().cloned())
            .collect()
    };
    let top = branches(input);
    assert_eq!(keys(&top), ["text", "image"], "{input}");
    let batch = top
        .iter()
        .find(|b| b["type"] == "array" && !branches(&b["items"]).is_empty())
        .expect("a batch branch");
    assert_eq!(
        keys(&branches(&batch["items"])),
        ["text", "image"],
        "{batch}"
    );
}
