//! A full app over the fake backend and a word-level tokenizer, driven with `oneshot`.

use super::{app, AppState, ModelDirectory, ModelEntry, ServeConfig};
use crate::backend::fake::{FakeBackend, Gate, SeenBatch};
use crate::backend::{BackendHandle, ModelInfo};
use crate::cli::Args;
use crate::infer::Infer;
use crate::metrics::{Metrics, ModelMetrics};
use crate::schedule::{BackendFacts, PolicyFlags, ServingProfile};
use crate::server::build_info;
use crate::shutdown::Shutdown;
use crate::tokenization::tests::test_tokenizer;
use crate::tokenization::{Tokenization, TokenizerConfig};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

pub struct Options {
    pub info: ModelInfo,
    pub max_batch_tokens: usize,
    pub max_batch_requests: Option<usize>,
    pub max_concurrent_requests: usize,
    pub max_client_batch_size: usize,
    pub auto_truncate: bool,
    pub long_input: crate::tokenization::LongInput,
    pub max_chunks: usize,
    pub api_key: Option<String>,
    pub payload_limit: usize,
    pub delay: Duration,
    pub healthy: bool,
    pub interactive_max_tokens: usize,
    pub gate: Option<Arc<Gate>>,
    pub body_read_timeout: Duration,
    pub shutdown: Shutdown,
    /// Fake devices, one executor each (named `fake:<i>` when more than one).
    pub devices: usize,
    /// More served models after the default one (`fake/model`): `NAME=ID` and its info.
    pub more_models: Vec<(&'static str, ModelInfo)>,
    /// The default model's LoRA adapters, with their indexes.
    pub adapters: Vec<(crate::models::LoraSpec, u32)>,
    /// `--max-queue-ms`.
    pub max_queue: Option<Duration>,
    /// `--otlp-endpoint` and its settings.
    pub otlp: Option<crate::telemetry::OtlpSettings>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            info: FakeBackend::info(),
            max_batch_tokens: 64,
            max_batch_requests: None,
            max_concurrent_requests: 16,
            max_client_batch_size: 8,
            auto_truncate: false,
            long_input: crate::tokenization::LongInput::Error,
            max_chunks: 64,
            api_key: None,
            payload_limit: 10_000,
            delay: Duration::ZERO,
            healthy: true,
            interactive_max_tokens: 256,
            gate: None,
            body_read_timeout: Duration::from_secs(30),
            shutdown: Shutdown::default(),
            devices: 1,
            more_models: Vec::new(),
            adapters: Vec::new(),
            max_queue: None,
            otlp: None,
        }
    }
}

#[derive(Clone)]
pub struct TestApp {
    pub router: Router,
    /// What the router's handlers share, for tests that build routes of their own.
    pub state: AppState,
    pub seen: Arc<Mutex<Vec<SeenBatch>>>,
    pub metrics: Arc<Metrics>,
    /// Each device's switch to fail as a lost GPU would (`DeviceError`).
    pub broken: Vec<Arc<AtomicBool>>,
}

/// Must run inside a tokio runtime (the batching task is spawned).
pub fn test_app(opts: Options) -> TestApp {
    let mut fake = FakeBackend::new(opts.info.clone());
    fake.delay = opts.delay;
    fake.healthy = opts.healthy;
    fake.gate = opts.gate;
    let seen = fake.seen.clone();
    let fakes = match opts.devices {
        1 => vec![fake],
        n => fake.on_devices(n),
    };
    let broken = fakes.iter().map(|f| f.broken.clone()).collect();
    let (backend, info, _threads) =
        BackendHandle::spawn(FakeBackend::devices_factory(fakes)).unwrap();
    let tokenization = Tokenization::new(test_tokenizer(), 2, tokenizer_config(&info));
    let metrics = Arc::new(Metrics::new(info.max_input_length));
    let args = Args::try_parse_from(["router", "--model-id", "fake/model"]).unwrap();
    let body = build_info(&args, &info, 2);
    let flags = PolicyFlags {
        max_batch_tokens: opts.max_batch_tokens,
        max_batch_requests: opts.max_batch_requests,
        interactive_max_tokens: opts.interactive_max_tokens,
        max_bulk_batch_ms: 0,
        max_queue: opts.max_queue,
        ..args.policy_flags()
    };
    let profile = ServingProfile::resolve(&flags, BackendFacts::of(&backend));
    let spec = crate::models::ModelSpec::parse("fake/model").expect("a model spec");
    // As the server labels them: by model only where it serves several.
    let model_metrics = if opts.more_models.is_empty() {
        ModelMetrics::only(metrics.clone())
    } else {
        ModelMetrics::named(metrics.clone(), &spec.name)
    };
    let (infer, _task) = Infer::new(
        tokenization,
        backend,
        Arc::new(info),
        &profile,
        opts.max_concurrent_requests,
        model_metrics,
    );
    let metrics_handle = metrics.clone();
    let entry = ModelEntry {
        spec,
        adapters: opts.adapters,
        infer,
        info: Arc::new(body),
        config: Arc::new(ServeConfig {
            max_client_batch_size: opts.max_client_batch_size,
            auto_truncate: opts.auto_truncate,
            long_input: opts.long_input,
            max_chunks: opts.max_chunks,
            served_model_name: "fake/model".into(),
            api_key: opts.api_key,
            payload_limit: opts.payload_limit,
            cors_allow_origin: None,
            compute_type: "cpu".into(),
            body_read_timeout: opts.body_read_timeout,
            tracing: opts.otlp.map(|otlp| {
                crate::telemetry::RequestTracing::start(&otlp, metrics.clone())
                    .expect("a valid OTLP endpoint")
            }),
        }),
    };
    let mut entries = vec![entry];
    for (spec, info) in opts.more_models {
        entries.push(another_model(spec, info, &metrics, &entries[0].config));
    }
    let directory = Arc::new(ModelDirectory::new(entries));
    let state = AppState::for_default(directory, metrics, opts.shutdown.clone());
    TestApp {
        router: app(state.clone()),
        state,
        seen,
        metrics: metrics_handle,
        broken,
    }
}

/// The tokenizer rules of a model with `info` (prompts, adapters' type ids).
fn tokenizer_config(info: &ModelInfo) -> TokenizerConfig {
    TokenizerConfig {
        max_input_length: info.max_input_length,
        position_offset: info.position_offset,
        prompts: info.prompts.clone().unwrap_or_default(),
        adapter_type_stride: info.adapter_type_stride.unwrap_or(1),
        ..Default::default()
    }
}

/// A second (third, ...) served model over its own fake backend, with the default model's
/// settings.
fn another_model(
    spec: &str,
    info: ModelInfo,
    metrics: &Arc<Metrics>,
    config: &ServeConfig,
) -> ModelEntry {
    let spec = crate::models::ModelSpec::parse(spec).expect("a model spec");
    let (backend, info, _threads) =
        BackendHandle::spawn(FakeBackend::devices_factory(vec![FakeBackend::new(info)])).unwrap();
    let tokenization = Tokenization::new(test_tokenizer(), 2, tokenizer_config(&info));
    let args = Args::try_parse_from([
        "router",
        "--model-id",
        "fake/model",
        "--model-id",
        &format!("{}={}", spec.name, spec.id),
    ])
    .unwrap()
    .for_model(1, Vec::new());
    let body = build_info(&args, &info, 2);
    let profile = ServingProfile::resolve(&args.policy_flags(), BackendFacts::of(&backend));
    let (infer, _task) = Infer::new(
        tokenization,
        backend,
        Arc::new(info),
        &profile,
        16,
        ModelMetrics::named(metrics.clone(), &spec.name),
    );
    ModelEntry {
        adapters: Vec::new(),
        config: Arc::new(ServeConfig {
            served_model_name: body.served_model_name.clone(),
            ..config.clone()
        }),
        spec,
        infer,
        info: Arc::new(body),
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub json: Value,
    pub text: String,
}

impl TestApp {
    /// The value of the series `series` (name and labels as rendered), 0 if it does not exist.
    pub fn sample(&self, series: &str) -> f64 {
        let prefix = format!("{series} ");
        self.metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(|v| v.parse().unwrap()))
            .unwrap_or(0.0)
    }

    pub async fn send(&self, req: Request<Body>) -> Reply {
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).to_string();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            json,
            text,
        }
    }

    pub async fn post(&self, uri: &str, body: Value) -> Reply {
        self.post_raw(uri, body.to_string(), &[]).await
    }

    pub async fn post_raw(&self, uri: &str, body: String, headers: &[(&str, &str)]) -> Reply {
        let mut req = Request::post(uri).header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req.body(Body::from(body)).unwrap()).await
    }

    pub async fn get(&self, uri: &str) -> Reply {
        self.send(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }
}

/// The fake backend's normalized embedding of a token sequence (positions from 0).
pub fn expected_embedding(ids: &[u32], dims: Option<usize>, normalize: bool) -> Vec<f32> {
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    let mut v = crate::backend::fake::pooled(ids, &positions);
    if let Some(d) = dims {
        v.truncate(d);
    }
    if normalize {
        crate::infer::l2_normalize(&mut v);
    }
    v
}

pub fn as_vec(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

pub fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}
