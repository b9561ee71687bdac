//! The gRPC service on the wire: length-prefixed frames through the HTTP/2 service, streams,
//! routing by content type, reflection.

use super::pb;
use super::routes::http2_service;
use super::tests::embed_request;
use crate::backend::fake::FakeBackend;
use crate::http::test_util::{as_vec, assert_close, test_app, Options, TestApp};
use axum::body::Body;
use http_body_util::BodyExt as _;
use serde_json::json;
use tonic::Code;
use tower::ServiceExt as _;

/// `messages` as a gRPC request body: each one length-prefixed, uncompressed.
fn frames<M: prost::Message>(messages: &[M]) -> Vec<u8> {
    let mut body = Vec::new();
    for message in messages {
        let bytes = message.encode_to_vec();
        body.push(0);
        body.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        body.extend_from_slice(&bytes);
    }
    body
}

/// The answers of a gRPC call of `path` with `messages`, through the HTTP/2 service, and its
/// status code and message.
async fn call<M: prost::Message, R: prost::Message + Default>(
    app: &TestApp,
    path: &str,
    messages: &[M],
) -> (Vec<R>, i32, String) {
    let service = http2_service(app.state.clone(), app.router.clone());
    let req = axum::http::Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::from(frames(messages)))
        .unwrap();
    let response = service.oneshot(req).await.unwrap();
    let headers = response.headers().clone();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let bytes = collected.to_bytes();
    let field = |name: &str| {
        trailers
            .get(name)
            .or_else(|| headers.get(name))
            .map(|v| v.to_str().unwrap().to_string())
    };
    let code = field("grpc-status")
        .expect("a grpc-status")
        .parse()
        .unwrap();
    let message = percent_decoded(&field("grpc-message").unwrap_or_default());
    let mut answers = Vec::new();
    let mut rest = &bytes[..];
    while rest.len() >= 5 {
        let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
        answers.push(R::decode(&rest[5..5 + len]).unwrap());
        rest = &rest[5 + len..];
    }
    (answers, code, message)
}

/// A `grpc-message` as its sender wrote it (gRPC percent-encodes it).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn a_stream_answers_each_message_in_order() {
    let app = test_app(Options::default());
    let texts = ["hello", "a b c d e f g h i j", "world", "x y"];
    let messages: Vec<_> = texts.iter().map(|t| embed_request(t)).collect();
    let (answers, code, _) =
        call::<_, pb::EmbedResponse>(&app, "/tei.v1.Embed/EmbedStream", &messages).await;
    assert_eq!(code, 0);
    assert_eq!(answers.len(), texts.len());
    for (answer, text) in answers.iter().zip(texts) {
        let http = app.post("/embed", json!({"inputs": text})).await;
        assert_close(&answer.embeddings, &as_vec(&http.json[0]));
    }
    // A bad message ends the stream with its status, after the answers before it.
    let messages = vec![
        embed_request("hello"),
        embed_request(""),
        embed_request("x"),
    ];
    let (answers, code, message) =
        call::<_, pb::EmbedResponse>(&app, "/tei.v1.Embed/EmbedStream", &messages).await;
    assert_eq!(answers.len(), 1);
    assert_eq!(code, Code::InvalidArgument as i32);
    assert_eq!(message, "`inputs` cannot be empty");
}

#[tokio::test]
async fn rerank_stream_ranks_its_pairs_as_rerank() {
    let app = test_app(Options {
        info: FakeBackend::classifier_info(1),
        ..Default::default()
    });
    let texts = ["a b", "what", "c d e"];
    let messages: Vec<_> = texts
        .iter()
        .map(|text| pb::RerankStreamRequest {
            query: "what is".into(),
            text: (*text).into(),
            return_text: true,
            ..Default::default()
        })
        .collect();
    let (answers, code, message) =
        call::<_, pb::RerankResponse>(&app, "/tei.v1.Rerank/RerankStream", &messages).await;
    assert_eq!(code, 0, "{message}");
    let http = app
        .post(
            "/rerank",
            json!({"query": "what is", "texts": texts, "return_text": true}),
        )
        .await;
    let ranks = &answers[0].ranks;
    let expected = http.json.as_array().unwrap();
    assert_eq!(ranks.len(), expected.len());
    for (rank, e) in ranks.iter().zip(expected) {
        assert_eq!(u64::from(rank.index), e["index"].as_u64().unwrap());
        assert_eq!(rank.text.as_deref(), e["text"].as_str());
    }
    // More pairs than one request may hold.
    let many = vec![messages[0].clone(); 9];
    let (_, code, message) =
        call::<_, pb::RerankResponse>(&app, "/tei.v1.Rerank/RerankStream", &many).await;
    assert_eq!(code, Code::InvalidArgument as i32);
    assert!(message.contains("batch size 9"), "{message}");
    let (_, code, _) = call::<pb::RerankStreamRequest, pb::RerankResponse>(
        &app,
        "/tei.v1.Rerank/RerankStream",
        &[],
    )
    .await;
    assert_eq!(code, Code::InvalidArgument as i32);
}

#[tokio::test]
async fn http2_requests_reach_grpc_or_the_routes_by_content_type() {
    let app = test_app(Options::default());
    let service = http2_service(app.state.clone(), app.router.clone());
    let health = axum::http::Request::get("/health")
        .body(Body::empty())
        .unwrap();
    let response = service.clone().oneshot(health).await.unwrap();
    assert_eq!(response.status(), 200);
    let (_, code, _) =
        call::<_, pb::EmbedResponse>(&app, "/tei.v1.Embed/Nope", &[embed_request("x")]).await;
    assert_eq!(code, Code::Unimplemented as i32);
    let (answers, code, _) =
        call::<_, pb::InfoResponse>(&app, "/tei.v1.Info/Info", &[pb::InfoRequest::default()]).await;
    assert_eq!(code, 0);
    assert_eq!(answers[0].model_id, "fake/model");
    assert_eq!(answers[0].max_input_length, 16);
}

#[tokio::test]
async fn reflection_lists_every_service() {
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};
    let app = test_app(Options::default());
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let (answers, code, _) = call::<_, ServerReflectionResponse>(
        &app,
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        &[list],
    )
    .await;
    assert_eq!(code, 0);
    let Some(MessageResponse::ListServicesResponse(services)) = &answers[0].message_response else {
        panic!("not a list: {:?}", answers[0]);
    };
    let names: Vec<&str> = services.service.iter().map(|s| s.name.as_str()).collect();
    for name in [
        "tei.v1.Info",
        "tei.v1.Embed",
        "tei.v1.Predict",
        "tei.v1.Rerank",
        "tei.v1.Tokenize",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
}
