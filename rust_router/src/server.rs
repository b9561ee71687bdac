//! Process lifecycle: parse flags, load the model, build the app, serve until SIGINT/SIGTERM,
//! drain, exit.

use crate::backend::wait::WaitPolicy;
use crate::backend::{BackendFactory, BackendHandle, ModelInfo, ModelType};
use crate::cli::Args;
use crate::http::types::{ClassifierModel, EmbeddingModel, Info, ModelTypeInfo};
use crate::http::{app, AppState, ServeConfig};
use crate::infer::Infer;
use crate::metrics::Metrics;
use crate::tokenization::{load_tokenizer, Tokenization, TokenizerConfig};
use clap::Parser;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

/// Builds the backend factory for the parsed flags (the Python bridge supplies it).
pub type MakeBackend = Box<dyn FnOnce(&Args) -> Result<BackendFactory, String> + Send>;

/// Entry point behind `text-embeddings-router`; returns the process exit code.
pub fn main_with_args(argv: Vec<String>, make_backend: MakeBackend) -> i32 {
    let args = match Args::try_parse_from(argv) {
        Ok(args) => args,
        Err(err) => {
            // --help and --version land here too, with exit code 0.
            let _ = err.print();
            return err.exit_code();
        }
    };
    crate::logging::init(args.json_output, args.disable_spans);
    match run(args, make_backend) {
        Ok(()) => 0,
        Err(message) => {
            tracing::error!("{message}");
            1
        }
    }
}

/// The default prompt text: `--default-prompt`, else the prompt named by
/// `--default-prompt-name` or by the model's own config.
fn default_prompt(args: &Args, info: &ModelInfo) -> Result<Option<String>, String> {
    if let Some(p) = &args.default_prompt {
        return Ok(Some(p.clone()));
    }
    let prompts = info.prompts.clone().unwrap_or_default();
    match args
        .default_prompt_name
        .as_ref()
        .or(info.default_prompt_name.as_ref())
    {
        None => Ok(None),
        Some(name) => prompts.get(name).cloned().map(Some).ok_or_else(|| {
            let mut names: Vec<&String> = prompts.keys().collect();
            names.sort();
            format!(
                "default prompt name `{name}` is not a prompt of this model; available: {names:?}"
            )
        }),
    }
}

pub fn build_info(args: &Args, info: &ModelInfo, workers: usize) -> Info {
    let classifier = || {
        let id2label: std::collections::BTreeMap<String, String> = (0..info.num_labels)
            .map(|i| (i.to_string(), info.label(i)))
            .collect();
        let label2id = id2label
            .iter()
            .filter_map(|(i, l)| Some((l.clone(), i.parse().ok()?)))
            .collect();
        ClassifierModel { id2label, label2id }
    };
    let model_type = match info.model_type {
        ModelType::Embedding => ModelTypeInfo::Embedding(EmbeddingModel {
            pooling: info.pooling.clone().unwrap_or_else(|| "unknown".into()),
        }),
        ModelType::Classifier => ModelTypeInfo::Classifier(classifier()),
        ModelType::Reranker => ModelTypeInfo::Reranker(classifier()),
    };
    Info {
        model_id: args.model_id.clone(),
        model_sha: args.revision.clone(),
        model_dtype: info
            .dtype
            .clone()
            .or_else(|| args.dtype.clone())
            .unwrap_or_else(|| "float32".into()),
        model_type,
        served_model_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| args.model_id.clone()),
        max_concurrent_requests: args.max_concurrent_requests,
        max_input_length: info.max_input_length,
        max_batch_tokens: args.max_batch_tokens,
        max_batch_requests: args.max_batch_requests,
        max_client_batch_size: args.max_client_batch_size,
        auto_truncate: args.auto_truncate,
        tokenization_workers: workers,
        hidden_size: info.hidden_size,
        prompts: info
            .prompts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        version: env!("CARGO_PKG_VERSION"),
        sha: option_env!("VERGEN_GIT_SHA"),
        docker_label: option_env!("DOCKER_LABEL"),
    }
}

fn listen_addr(hostname: &str, port: u16) -> SocketAddr {
    let ip = hostname.parse::<IpAddr>().unwrap_or_else(|_| {
        // `HOSTNAME` is often the container's name, not an address: TEI's fallback.
        tracing::warn!("invalid hostname `{hostname}`, listening on 0.0.0.0");
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    });
    SocketAddr::new(ip, port)
}

/// How small requests are served, for the start-up log.
fn describe_interactive_lane(args: &Args, backend: &BackendHandle) -> String {
    let max = args.interactive_max_tokens;
    if max == 0 {
        "off".into()
    } else if backend.has_interactive_lane() {
        format!("requests of <= {max} tokens on their own backend thread")
    } else {
        format!("requests of <= {max} tokens first in the shared queue (the runtime has no interactive lane)")
    }
}

fn run(args: Args, make_backend: MakeBackend) -> Result<(), String> {
    args.validate()?;
    tracing::info!(model_id = %args.model_id, backend = ?args.backend, "loading model");
    let factory = make_backend(&args)?;
    let (backend, info, backend_threads) =
        BackendHandle::spawn_with(factory, WaitPolicy::spin_micros(args.backend_spin_us))
            .map_err(|e| e.to_string())?;
    tracing::info!(
        model_type = ?info.model_type,
        architecture = %info.architecture,
        max_input_length = info.max_input_length,
        hidden_size = info.hidden_size,
        device = info.device.as_deref().unwrap_or("?"),
        interactive_lane = describe_interactive_lane(&args, &backend),
        backend_spin_us = args.backend_spin_us,
        "model loaded"
    );
    if info.max_input_length > args.max_batch_tokens {
        return Err(format!(
            "`--max-batch-tokens` ({}) must be at least the model's max input length ({}): \
             one full-length input must fit in a batch",
            args.max_batch_tokens, info.max_input_length
        ));
    }
    let prompt = default_prompt(&args, &info)?;
    let tokenizer = load_tokenizer(Path::new(&info.tokenizer_path)).map_err(|e| e.to_string())?;
    let workers = args.tokenization_workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let tokenization = Tokenization::new(
        tokenizer,
        workers,
        TokenizerConfig {
            max_input_length: info.max_input_length,
            position_offset: info.position_offset,
            prompts: info.prompts.clone().unwrap_or_default(),
            default_prompt: prompt,
            pair_template: info.pair_template.clone(),
        },
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("router-worker")
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let result = runtime.block_on(serve(args, info, tokenization, backend, workers));
    // Every backend handle is gone once `serve` returns; the threads then drop the model and
    // end. Join them so nothing runs during interpreter teardown.
    drop(runtime);
    let _ = backend_threads.join();
    tracing::info!("stopped");
    result
}

async fn serve(
    args: Args,
    info: ModelInfo,
    tokenization: Tokenization,
    backend: BackendHandle,
    workers: usize,
) -> Result<(), String> {
    let metrics = Arc::new(Metrics::new(info.max_input_length));
    let info_body = build_info(&args, &info, workers);
    let compute_type = info.device.clone().unwrap_or_else(|| "cpu".into());
    let (infer, batching_task) = Infer::new(
        tokenization,
        backend,
        Arc::new(info),
        args.infer_config(),
        metrics.clone(),
    );
    let state = AppState {
        infer: infer.clone(),
        info: Arc::new(info_body.clone()),
        metrics,
        config: Arc::new(ServeConfig {
            max_client_batch_size: args.max_client_batch_size,
            auto_truncate: args.auto_truncate,
            served_model_name: info_body.served_model_name.clone(),
            api_key: args.api_key.clone(),
            payload_limit: args.payload_limit,
            cors_allow_origin: args.cors_allow_origin.clone(),
            compute_type,
        }),
    };
    let addr = listen_addr(&args.hostname, args.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    tracing::info!("listening on {addr}");
    tracing::info!("Ready");
    let served = axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown_signal())
        .await;
    // axum has stopped accepting and every in-flight request has been answered; let the
    // batching task finish and release the backend.
    infer.shutdown();
    drop(infer);
    let _ = batching_task.await;
    served.map_err(|e| format!("server error: {e}"))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for SIGINT: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("signal received, draining in-flight requests");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::FakeBackend;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["text-embeddings-router", "--model-id", "m"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn default_prompt_resolution() {
        let info = FakeBackend::info();
        assert_eq!(default_prompt(&args(&[]), &info), Ok(None));
        assert_eq!(
            default_prompt(&args(&["--default-prompt-name", "query"]), &info),
            Ok(Some("query : ".into()))
        );
        assert_eq!(
            default_prompt(&args(&["--default-prompt", "x: "]), &info),
            Ok(Some("x: ".into()))
        );
        let err = default_prompt(&args(&["--default-prompt-name", "nope"]), &info).unwrap_err();
        assert!(err.contains("[\"query\"]"), "{err}");
    }

    #[test]
    fn info_body_for_a_classifier() {
        let info = FakeBackend::classifier_info(3);
        let body = build_info(&args(&["--served-model-name", "clf"]), &info, 2);
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["model_type"]["classifier"]["id2label"]["2"], "LABEL_2");
        assert_eq!(json["model_type"]["classifier"]["label2id"]["LABEL_1"], 1);
        assert_eq!(json["served_model_name"], "clf");
    }

    #[test]
    fn bad_hostname_falls_back() {
        assert_eq!(listen_addr("127.0.0.1", 5).to_string(), "127.0.0.1:5");
        assert_eq!(listen_addr("my-container", 5).to_string(), "0.0.0.0:5");
    }

    #[test]
    fn help_exits_zero_and_bad_flags_two() {
        let none = || -> MakeBackend { Box::new(|_| Err("unused".into())) };
        let code = main_with_args(vec!["x".into(), "--help".into()], none());
        assert_eq!(code, 0);
        let code = main_with_args(vec!["x".into(), "--bogus".into()], none());
        assert_eq!(code, 2);
    }
}
