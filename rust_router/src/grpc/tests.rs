//! The gRPC API over the fake backend: each call against its HTTP route's answer, the errors
//! and their codes, the API key, the drain, deadlines and health, calling the services
//! themselves (the wire, streams and reflection: `tests_wire.rs`).

use super::call::TeiApi;
use super::health::HealthService;
use super::pb;
use super::pb::embed_server::Embed as _;
use super::pb::info_server::Info as _;
use super::pb::predict_server::Predict as _;
use super::pb::rerank_server::Rerank as _;
use super::pb::tokenize_server::Tokenize as _;
use crate::backend::fake::{FakeBackend, Gate};
use crate::http::test_util::{as_vec, assert_close, test_app, Options, TestApp};
use crate::shutdown::Phase;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Code, Request};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health as _;
use tonic_health::pb::HealthCheckRequest;

pub(super) fn api(app: &TestApp) -> TeiApi {
    TeiApi::new(app.state.clone())
}

fn request<T>(message: T, metadata: &[(&'static str, &str)]) -> Request<T> {
    let mut request = Request::new(message);
    for (key, value) in metadata {
        request
            .metadata_mut()
            .insert(*key, value.parse().expect("ascii metadata"));
    }
    request
}

pub(super) fn embed_request(text: &str) -> pb::EmbedRequest {
    pb::EmbedRequest {
        inputs: text.into(),
        normalize: true,
        ..Default::default()
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn embed_answers_as_the_http_route() {
    let app = test_app(Options::default());
    for normalize in [true, false] {
        let http = app
            .post(
                "/embed",
                json!({"inputs": "hello world", "normalize": normalize}),
            )
            .await;
        assert_eq!(http.status, 200, "{}", http.text);
        let message = pb::EmbedRequest {
            normalize,
            ..embed_request("hello world")
        };
        let answer = api(&app).embed(request(message, &[])).await.unwrap();
        let tokens = answer.metadata().get("x-compute-tokens").unwrap().clone();
        let answer = answer.into_inner();
        assert_close(&answer.embeddings, &as_vec(&http.json[0]));
        let metadata = answer.metadata.unwrap();
        assert_eq!(
            tokens.to_str().unwrap(),
            metadata.compute_tokens.to_string()
        );
        assert_eq!(
            http.headers["x-compute-tokens"].to_str().unwrap(),
            tokens.to_str().unwrap()
        );
        assert_eq!(metadata.compute_chars, 11);
        assert!(metadata.total_time_ns >= metadata.inference_time_ns);
    }
    // Counted as the HTTP requests are.
    assert_eq!(app.sample("te_request_success{method=\"single\"}"), 4.0);
}

#[tokio::test]
async fn extensions_reach_the_route() {
    let app = test_app(Options::default());
    let message = pb::EmbedRequest {
        dimensions: Some(2),
        priority: pb::Priority::Low.into(),
        ..embed_request("hello world")
    };
    let answer = api(&app).embed(request(message, &[])).await.unwrap();
    assert_eq!(answer.into_inner().embeddings.len(), 2);
    let http = app
        .post("/embed", json!({"inputs": "hello world", "dimensions": 2}))
        .await;
    let message = pb::EmbedRequest {
        dimensions: Some(2),
        ..embed_request("hello world")
    };
    let answer = api(&app).embed(request(message, &[])).await.unwrap();
    assert_close(&answer.into_inner().embeddings, &as_vec(&http.json[0]));
    let too_many = pb::EmbedRequest {
        dimensions: Some(10_000),
        ..embed_request("hello")
    };
    let e = api(&app).embed(request(too_many, &[])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("`dimensions`"), "{}", e.message());
}

#[tokio::test]
async fn bad_input_has_the_http_message_and_teis_code() {
    let app = test_app(Options::default());
    let e = api(&app)
        .embed(request(embed_request(""), &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "`inputs` cannot be empty");
    assert_eq!(e.metadata().get("error-type").unwrap(), "empty");
    assert_eq!(app.sample("te_request_failure{err=\"empty\"}"), 1.0);
    let long = vec!["word"; 40].join(" ");
    let e = api(&app)
        .embed(request(embed_request(&long), &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let http = app.post("/embed", json!({"inputs": long})).await;
    assert_eq!(e.message(), http.json["error"].as_str().unwrap());
    let bad_direction = pb::EmbedRequest {
        truncation_direction: 9,
        ..embed_request("hello")
    };
    let e = api(&app)
        .embed(request(bad_direction, &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("truncation_direction"),
        "{}",
        e.message()
    );
    // A call the model does not serve: TEI's code, the HTTP route's message.
    let predict = pb::PredictRequest {
        inputs: "hello".into(),
        ..Default::default()
    };
    let e = api(&app).predict(request(predict, &[])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let http = app.post("/predict", json!({"inputs": "hello"})).await;
    assert_eq!(e.message(), http.json["error"].as_str().unwrap());
    let pair = pb::PredictPairRequest {
        inputs: vec!["a".into(), "b".into(), "c".into()],
        ..Default::default()
    };
    let e = api(&app)
        .predict_pair(request(pair, &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("got 3"), "{}", e.message());
}

#[tokio::test]
async fn truncation_follows_the_flag_and_the_field() {
    let long = vec!["word"; 40].join(" ");
    let app = test_app(Options::default());
    let truncated = pb::EmbedRequest {
        truncate: true,
        ..embed_request(&long)
    };
    let answer = api(&app).embed(request(truncated, &[])).await.unwrap();
    assert_eq!(answer.into_inner().metadata.unwrap().compute_tokens, 16);
    // `truncate: false` is the server's default, which `--auto-truncate` sets.
    let app = test_app(Options {
        auto_truncate: true,
        ..Default::default()
    });
    let answer = api(&app).embed(request(embed_request(&long), &[])).await;
    assert!(answer.is_ok(), "{answer:?}");
}

#[tokio::test]
async fn the_api_key_is_checked_on_every_call() {
    let app = test_app(Options {
        api_key: Some("s3cret".into()),
        ..Default::default()
    });
    let e = api(&app)
        .embed(request(embed_request("hello"), &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("missing"), "{}", e.message());
    let wrong = [("authorization", "Bearer nope")];
    let e = api(&app)
        .info(request(pb::InfoRequest::default(), &wrong))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(app.sample("te_request_failure{err=\"unauthorized\"}"), 2.0);
    let right = [("authorization", "Bearer s3cret")];
    assert!(api(&app)
        .embed(request(embed_request("hello"), &right))
        .await
        .is_ok());
    // The probes need no key.
    let health = HealthService::new(app.state.clone());
    let status = health
        .check(Request::new(HealthCheckRequest::default()))
        .await
        .unwrap();
    assert_eq!(status.into_inner().status, ServingStatus::Serving as i32);
}

#[tokio::test]
async fn a_draining_server_takes_no_new_call() {
    let app = test_app(Options::default());
    app.state.shutdown.advance(Phase::Draining);
    let e = api(&app)
        .embed(request(embed_request("hello"), &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("shutting down"), "{}", e.message());
    let health = HealthService::new(app.state.clone());
    let status = health
        .check(Request::new(HealthCheckRequest::default()))
        .await
        .unwrap();
    assert_eq!(status.into_inner().status, ServingStatus::NotServing as i32);
}

#[tokio::test]
async fn a_malformed_deadline_is_refused() {
    let app = test_app(Options::default());
    let e = api(&app)
        .embed(request(embed_request("hello"), &[("grpc-timeout", "10x")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("grpc-timeout"), "{}", e.message());
    for far in ["5S", "99999999H"] {
        assert!(api(&app)
            .embed(request(embed_request("hello"), &[("grpc-timeout", far)]))
            .await
            .is_ok());
    }
}

#[tokio::test]
async fn the_deadline_bounds_the_queue_wait_and_the_answer() {
    let gate = Arc::new(Gate::default());
    let app = test_app(Options {
        gate: Some(gate.clone()),
        interactive_max_tokens: 8,
        ..Default::default()
    });
    let spawn_embed = |text: &'static str, metadata: Vec<(&'static str, &'static str)>| {
        let api = api(&app);
        tokio::spawn(async move {
            let message = pb::EmbedRequest {
                priority: pb::Priority::Low.into(),
                ..embed_request(text)
            };
            api.embed(request(message, &metadata)).await
        })
    };
    // "g" holds the bulk thread at the gate: the call has started, so only its whole
    // deadline applies to it.
    let held = spawn_embed("g a b c d e f h i", vec![("grpc-timeout", "300m")]);
    until("the backend is held", || gate.held() == 1).await;
    let next = spawn_embed("a b c d e f h i j", vec![]);
    until("the next batch is packed", || {
        app.sample("te_batch_next_size_count{lane=\"bulk\"}") == 2.0
    })
    .await;
    // Behind both, in the queue: its deadline passes there, and it never runs.
    let queued = spawn_embed("hello", vec![("grpc-timeout", "20m")]);
    let e = queued.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert_eq!(e.metadata().get("error-type").unwrap(), "queue_timeout");
    assert_eq!(app.sample("te_queue_timeout_count"), 1.0);
    let e = held.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(e.message().contains("Deadline exceeded"), "{}", e.message());
    gate.open();
    assert!(next.await.unwrap().is_ok());
    assert_eq!(app.sample("te_queue_size"), 0.0);
}

#[tokio::test]
async fn the_servers_shorter_queue_limit_answers_unavailable() {
    let gate = Arc::new(Gate::default());
    let app = test_app(Options {
        gate: Some(gate.clone()),
        interactive_max_tokens: 8,
        max_queue: Some(Duration::from_millis(20)),
        ..Default::default()
    });
    let spawn_embed = |text: &'static str, metadata: Vec<(&'static str, &'static str)>| {
        let api = api(&app);
        tokio::spawn(async move {
            let message = pb::EmbedRequest {
                priority: pb::Priority::Low.into(),
                ..embed_request(text)
            };
            api.embed(request(message, &metadata)).await
        })
    };
    let held = spawn_embed("g a b c d e f h i", vec![]);
    until("the backend is held", || gate.held() == 1).await;
    let next = spawn_embed("a b c d e f h i j", vec![]);
    until("the next batch is packed", || {
        app.sample("te_batch_next_size_count{lane=\"bulk\"}") == 2.0
    })
    .await;
    // The call's own deadline is longer than --max-queue-ms: the server's limit passes first,
    // and says "busy, retry elsewhere" as the HTTP route's 503 does.
    let queued = spawn_embed("hello", vec![("grpc-timeout", "10S")]);
    let e = queued.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(e.metadata().get("error-type").unwrap(), "queue_timeout");
    assert!(e.message().contains("20 ms"), "{}", e.message());
    gate.open();
    assert!(held.await.unwrap().is_ok());
    assert!(next.await.unwrap().is_ok());
}

#[tokio::test]
async fn several_models_are_chosen_by_model() {
    let app = test_app(Options {
        more_models: vec![("rr=fake/reranker", FakeBackend::classifier_info(1))],
        ..Default::default()
    });
    let info = api(&app)
        .info(request(
            pb::InfoRequest {
                model: Some("rr".into()),
            },
            &[],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.model_type, pb::ModelType::Reranker as i32);
    assert_eq!(info.model_id, "fake/reranker");
    let default = api(&app)
        .info(request(pb::InfoRequest::default(), &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(default.model_type, pb::ModelType::Embedding as i32);
    let message = pb::RerankRequest {
        model: Some("rr".into()),
        query: "what".into(),
        texts: vec!["a b".into(), "c".into(), "what is".into()],
        return_text: true,
        top_n: Some(2),
        ..Default::default()
    };
    let ranks = api(&app)
        .rerank(request(message, &[]))
        .await
        .unwrap()
        .into_inner()
        .ranks;
    let http = app
        .post(
            "/rerank",
            json!({"model": "rr", "query": "what", "texts": ["a b", "c", "what is"],
                   "return_text": true, "top_n": 2}),
        )
        .await;
    assert_eq!(ranks.len(), 2);
    for (rank, expected) in ranks.iter().zip(http.json.as_array().unwrap()) {
        assert_eq!(u64::from(rank.index), expected["index"].as_u64().unwrap());
        assert_eq!(rank.text.as_deref(), expected["text"].as_str());
        assert!((f64::from(rank.score) - expected["score"].as_f64().unwrap()).abs() < 1e-6);
    }
    let unknown = pb::EmbedRequest {
        model: Some("nope".into()),
        ..embed_request("hello")
    };
    let e = api(&app).embed(request(unknown, &[])).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("nope"), "{}", e.message());
}

#[tokio::test]
async fn tokenize_and_decode_answer_as_the_http_routes() {
    let app = test_app(Options::default());
    let message = pb::EncodeRequest {
        inputs: "hello world".into(),
        add_special_tokens: true,
        ..Default::default()
    };
    let tokens = api(&app)
        .tokenize(request(message, &[]))
        .await
        .unwrap()
        .into_inner()
        .tokens;
    let http = app
        .post("/tokenize", json!({"inputs": "hello world"}))
        .await;
    let expected = http.json[0].as_array().unwrap();
    assert_eq!(tokens.len(), expected.len());
    for (token, e) in tokens.iter().zip(expected) {
        assert_eq!(u64::from(token.id), e["id"].as_u64().unwrap());
        assert_eq!(token.text, e["text"].as_str().unwrap());
        assert_eq!(token.start.map(u64::from), e["start"].as_u64());
    }
    let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
    let decoded = api(&app)
        .decode(request(
            pb::DecodeRequest {
                ids: ids.clone(),
                skip_special_tokens: true,
                ..Default::default()
            },
            &[],
        ))
        .await
        .unwrap()
        .into_inner();
    let http = app
        .post("/decode", json!({"ids": ids, "skip_special_tokens": true}))
        .await;
    assert_eq!(decoded.text, http.json[0].as_str().unwrap());
    let e = api(&app)
        .decode(request(pb::DecodeRequest::default(), &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn health_names_what_each_service_can_do() {
    let app = test_app(Options::default());
    let health = HealthService::new(app.state.clone());
    let check = |service: &str| {
        let health = &health;
        let service = service.to_string();
        async move {
            health
                .check(Request::new(HealthCheckRequest { service }))
                .await
                .map(|r| r.into_inner().status)
        }
    };
    assert_eq!(check("").await.unwrap(), ServingStatus::Serving as i32);
    assert_eq!(
        check("tei.v1.Embed").await.unwrap(),
        ServingStatus::Serving as i32
    );
    assert_eq!(
        check("tei.v1.Rerank").await.unwrap(),
        ServingStatus::NotServing as i32
    );
    assert_eq!(
        check("tei.v1.Nope").await.unwrap_err().code(),
        Code::NotFound
    );
    let unhealthy = test_app(Options {
        healthy: false,
        ..Default::default()
    });
    let health = HealthService::new(unhealthy.state.clone());
    let status = health
        .check(Request::new(HealthCheckRequest::default()))
        .await
        .unwrap();
    assert_eq!(status.into_inner().status, ServingStatus::NotServing as i32);
}
