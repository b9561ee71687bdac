//! Process lifecycle: parse flags, load the model, build the app, serve until SIGINT/SIGTERM,
//! drain, exit.

use crate::backend::share::{DeviceShares, Sharing};
use crate::backend::wait::{LaneWaits, WarmHook};
use crate::backend::{BackendFactory, BackendHandle, BackendThreads, ModelInfo, ModelType};
use crate::cli::Args;
use crate::connections;
use crate::grpc;
use crate::http::types::{ClassifierModel, EmbeddingModel, Info, ModelTypeInfo};
use crate::http::{app, AppState, ModelDirectory, ModelEntry, ServeConfig};
use crate::http_thread::{self, Handlers, HotPoll};
use crate::images::{AllowedHosts, ImageFetcher, ImageLimits};
use crate::infer::Infer;
use crate::metrics::{Metrics, ModelMetrics};
use crate::schedule::{BackendFacts, ServingProfile};
use crate::shutdown::{Phase, Shutdown};
use crate::telemetry::RequestTracing;
use crate::tokenization::{
    load_tokenizer, PoolLoad, PoolPriority, Tokenization, TokenizerConfig, TokenizerPool,
};
use clap::Parser;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokenizers::Tokenizer;

/// Builds the backend factory of one model (the flags as [`Args::for_model`] gives them; the
/// Python bridge supplies it). Called once per served model.
pub type MakeBackend = Box<dyn Fn(&Args) -> Result<BackendFactory, String> + Send>;

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

/// The adapter of requests without a prompt name: the default prompt name's, if it names one.
fn default_adapter(args: &Args, info: &ModelInfo) -> u32 {
    let adapters = info.adapters.clone().unwrap_or_default();
    args.default_prompt_name
        .as_ref()
        .or(info.default_prompt_name.as_ref())
        .and_then(|name| adapters.get(name).copied())
        .unwrap_or(0)
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
        // TEI shows a SPLADE model as an embedding model with `splade` pooling.
        ModelType::Embedding | ModelType::Sparse => ModelTypeInfo::Embedding(EmbeddingModel {
            pooling: info.pooling.clone().unwrap_or_else(|| "unknown".into()),
        }),
        ModelType::Classifier => ModelTypeInfo::Classifier(classifier()),
        ModelType::Reranker => ModelTypeInfo::Reranker(classifier()),
    };
    Info {
        model_id: args.model_id().to_string(),
        model_sha: args.revision.clone(),
        model_dtype: info
            .dtype
            .clone()
            .or_else(|| args.dtype.clone())
            .unwrap_or_else(|| "float32".into()),
        model_type,
        served_model_name: args.served_name(),
        max_concurrent_requests: args.max_concurrent_requests,
        max_input_length: info.max_input_length,
        max_batch_tokens: args.max_batch_tokens,
        max_batch_requests: args.max_batch_requests,
        max_client_batch_size: args.max_client_batch_size,
        auto_truncate: args.auto_truncate,
        long_input: args.long_input,
        max_chunks: args.max_chunks,
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
        devices: Vec::new(),
        image_input: info.image_input,
        multivector: info.late_interaction.clone(),
    }
}

/// File descriptors kept for everything but client connections (the model's files, the
/// tokenizer, Python's imports, logs).
const RESERVED_FDS: u64 = 256;

/// Raises the soft open-file limit to the hard one and returns it (or the current soft limit
/// where it cannot be raised).
fn raise_open_file_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!("cannot raise the open-file limit: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(1024)
        }
    }
}

/// `--max-connections`, lowered to what `open_files` leaves after [`RESERVED_FDS`]: past the
/// file limit, new connections would wait in the kernel's backlog instead of being refused.
fn effective_max_connections(requested: usize, open_files: u64) -> usize {
    let allowed = open_files
        .saturating_sub(RESERVED_FDS)
        .max(open_files / 2)
        .max(1);
    requested.min(usize::try_from(allowed).unwrap_or(usize::MAX))
}

/// The addresses `--hostname` names: an IP as given, else every address the name resolves to
/// (`localhost` is 127.0.0.1 and ::1). A name that does not resolve is an error, never a
/// silent 0.0.0.0.
fn listen_addrs(hostname: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    if let Ok(ip) = hostname.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let mut addrs: Vec<SocketAddr> = (hostname, port)
        .to_socket_addrs()
        .map_err(|e| {
            format!(
                "`--hostname {hostname}` is neither an IP address nor a name that resolves \
                 ({e}); use 0.0.0.0 to listen on every interface"
            )
        })?
        .collect();
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        return Err(format!("`--hostname {hostname}` resolves to no address"));
    }
    Ok(addrs)
}

/// Binds every address before the model loads, so a port in use is reported at once. With
/// `--port 0` the later addresses take the port the first one got.
fn bind(addrs: &[SocketAddr]) -> Result<Vec<std::net::TcpListener>, String> {
    let mut listeners: Vec<std::net::TcpListener> = Vec::new();
    for addr in addrs {
        let mut addr = *addr;
        if let Some(first) = listeners.first() {
            addr.set_port(first.local_addr().map_err(|e| e.to_string())?.port());
        }
        let listener = std::net::TcpListener::bind(addr).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                ": the port is in use (another server? choose one with --port)"
            } else {
                ""
            };
            format!("cannot listen on {addr}: {e}{hint}")
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        listeners.push(listener);
    }
    Ok(listeners)
}

fn run(mut args: Args, make_backend: MakeBackend) -> Result<(), String> {
    args.validate()?;
    let open_files = raise_open_file_limit();
    let max_connections = effective_max_connections(args.max_connections, open_files);
    if max_connections < args.max_connections {
        tracing::warn!(
            "--max-connections lowered from {} to {max_connections}: the open-file limit is \
             {open_files}",
            args.max_connections
        );
        args.max_connections = max_connections;
    }
    tracing::info!(open_files, max_connections, "open-file limit raised");
    let listeners = bind(&listen_addrs(&args.hostname, args.port)?)?;
    let grpc_listeners = match args.grpc_port {
        Some(port) => bind(&listen_addrs(&args.hostname, port)?)?,
        None => Vec::new(),
    };
    let adapters = args.adapters_by_model()?;
    let several = adapters.len() > 1;
    // With several models, their bulk batches take turns on each device they share.
    let shares = several.then(DeviceShares::default);
    let mut models = Vec::with_capacity(adapters.len());
    let mut backend_threads = Vec::with_capacity(adapters.len());
    for (index, adapters) in adapters.into_iter().enumerate() {
        let model_args = args.for_model(index, adapters);
        let name = model_args.model().name.clone();
        // A model that does not load stops the start-up, named.
        let sharing = shares.as_ref().map(|shares| Sharing {
            shares: shares.clone(),
            model: index,
            weight: model_args.share_weight(),
        });
        let (model, threads) = load_model(model_args, &make_backend, sharing).map_err(|e| {
            if several {
                format!("model `{name}`: {e}")
            } else {
                e
            }
        })?;
        models.push(model);
        backend_threads.push(threads);
    }
    let pool = tokenizer_pool(&args, &models);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("router-worker")
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let shutdown_timeout = args.shutdown_timeout;
    let signal_at = Arc::new(OnceLock::new());
    let serving = Serving {
        args,
        models,
        pool,
        listeners,
        grpc_listeners,
    };
    let result = runtime.block_on(serving.serve(signal_at.clone()));
    // Every backend handle is gone once the runtime is dropped; the threads then drop the
    // model and end. Join them so nothing runs during interpreter teardown, but never past
    // the shutdown deadline: a forward pass that does not return must not keep the process.
    drop(runtime);
    let exit_by = signal_at.get().copied().unwrap_or_else(Instant::now) + shutdown_timeout;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let joined: Vec<_> = backend_threads.into_iter().map(|t| t.join()).collect();
        let _ = done_tx.send(joined);
    });
    let wait = exit_by
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    if done_rx.recv_timeout(wait).is_err() {
        tracing::error!(
            "the backend did not stop by the shutdown deadline (a forward pass is still \
             running); exiting without waiting for it"
        );
        result?;
        exit_now(0);
    }
    tracing::info!("stopped");
    result
}

/// Starts the backend of the model `args` name ([`Args::for_model`]) and loads its tokenizer;
/// returns the model and its backend's threads (joined at exit). `sharing`: its place at the
/// devices other models use too.
fn load_model(
    args: Args,
    make_backend: &MakeBackend,
    sharing: Option<Sharing>,
) -> Result<(ServedModel, BackendThreads), String> {
    tracing::info!(
        model = %args.model().name,
        model_id = %args.model_id(),
        backend = ?args.backend,
        weight = args.share_weight(),
        "loading model"
    );
    let factory = make_backend(&args)?;
    let flags = args.policy_flags();
    // The backend threads' waits are the one part of the policy needed before the backend
    // starts; the rest depends on what the started backend says it is.
    let waits = ServingProfile::backend_waits(&flags);
    let warm_hook = WarmHook::default();
    let lane_waits = LaneWaits {
        bulk: waits.bulk,
        interactive: waits.interactive,
        warm_hook: warm_hook.clone(),
    };
    let (backend, info, backend_threads) =
        BackendHandle::spawn_with(factory, lane_waits, sharing).map_err(|e| e.to_string())?;
    let profile = ServingProfile::resolve(&flags, BackendFacts::of(&backend));
    tracing::info!(
        model_type = ?info.model_type,
        architecture = %info.architecture,
        max_input_length = info.max_input_length,
        hidden_size = info.hidden_size,
        device = info.device.as_deref().unwrap_or("?"),
        devices = %info.device_names().join(","),
        interactive_lane = profile.describe_interactive_lane(),
        backend_spin_us = ?args.backend_spin_us,
        query_warm_us = args.query_warm_us,
        model = %args.model().name,
        "model loaded"
    );
    check_batch_tokens(args.max_batch_tokens, info.max_input_length)?;
    let prompt = default_prompt(&args, &info)?;
    let tokenizer = load_tokenizer(Path::new(&info.tokenizer_path)).map_err(|e| e.to_string())?;
    let tokenizer = ModelTokenizer {
        tokenizer,
        config: TokenizerConfig {
            max_input_length: info.max_input_length,
            position_offset: info.position_offset,
            prompts: info.prompts.clone().unwrap_or_default(),
            default_prompt: prompt,
            pair_template: info.pair_template.clone(),
            adapters: info.adapters.clone().unwrap_or_default(),
            default_adapter: default_adapter(&args, &info),
            adapter_type_stride: info.adapter_type_stride.unwrap_or(1),
            text_padding: info.text_padding,
        },
        warm_hook,
    };
    let adapters = adapter_indexes(&args, &info)?;
    let model = ServedModel {
        adapters,
        args,
        profile,
        info,
        tokenizer,
        backend,
    };
    Ok((model, backend_threads))
}

/// The tokenizer threads every model shares: `--tokenization-workers` of them (one per core by
/// default), in the class the models' profiles ask for (see [`PoolPriority::for_models`]).
fn tokenizer_pool(args: &Args, models: &[ServedModel]) -> TokenizerPool {
    let workers = args.tokenization_workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let asked = models.iter().map(|m| m.profile.tokenizer_pool.priority);
    let priority = PoolPriority::for_models(asked).unwrap_or(PoolPriority::Normal);
    tracing::info!(
        workers,
        ?priority,
        models = models.len(),
        "tokenization threads"
    );
    TokenizerPool::spawn(workers, priority)
}

/// Each `--lora-adapter` of the model with the index its backend gave it.
fn adapter_indexes(
    args: &Args,
    info: &ModelInfo,
) -> Result<Vec<(crate::models::LoraSpec, u32)>, String> {
    let none = std::collections::HashMap::new();
    let loaded = info.lora_adapters.as_ref().unwrap_or(&none);
    args.model_adapters
        .iter()
        .map(|adapter| match loaded.get(&adapter.name) {
            Some(&index) => Ok((adapter.clone(), index)),
            None => Err(format!(
                "--lora-adapter {}: the backend loaded it under no index (its `lora_adapters` \
                 in info(): {loaded:?})",
                adapter.name
            )),
        })
        .collect()
}

/// Ends the process at once, without `exit`'s atexit handlers and C++ static destructors: a
/// forward pass still runs on a backend thread, and tearing down the libraries it is using
/// under it (torch's thread pools) crashes the process instead of exiting with `code`.
/// The fetcher of `--allowed-image-hosts`'s image URLs, within `--image-fetch-timeout`.
fn image_fetcher(args: &Args) -> Result<ImageFetcher, String> {
    let hosts = AllowedHosts::new(&args.allowed_image_hosts)?;
    let timeout = Duration::from_secs(args.image_fetch_timeout);
    ImageFetcher::new(hosts, timeout).map_err(|e| e.to_string())
}

fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` only ends the process; nothing runs after it in this or any thread.
    unsafe { libc::_exit(code) }
}

/// One full-length input must fit in a batch.
fn check_batch_tokens(max_batch_tokens: usize, max_input_length: usize) -> Result<(), String> {
    if max_input_length > max_batch_tokens {
        return Err(format!(
            "`--max-batch-tokens` ({max_batch_tokens}) must be at least the model's max input \
             length ({max_input_length}): one full-length input must fit in a batch"
        ));
    }
    Ok(())
}

/// One served model: its flags, policy, tokenizer and backend.
struct ServedModel {
    args: Args,
    /// Its LoRA adapters with their indexes in the model.
    adapters: Vec<(crate::models::LoraSpec, u32)>,
    /// The batching and latency policy, resolved once the backend started.
    profile: ServingProfile,
    info: ModelInfo,
    tokenizer: ModelTokenizer,
    backend: BackendHandle,
}

/// A model's tokenizer and its rules, until its tokenization starts on the shared pool.
struct ModelTokenizer {
    tokenizer: Tokenizer,
    config: TokenizerConfig,
    /// Where the model's spinning backend thread takes its warming step from.
    warm_hook: WarmHook,
}

impl ModelTokenizer {
    /// The model's tokenization on `pool`, which its backend's interactive thread keeps warm.
    fn start(self, pool: &TokenizerPool) -> Tokenization {
        let tokenization = Tokenization::on_pool(pool, self.tokenizer, self.config);
        self.warm_hook.set(tokenization.warmer());
        tokenization
    }
}

/// What `serve` runs: the loaded models (the default first), their tokenizer pool and the
/// bound sockets.
struct Serving {
    args: Args,
    models: Vec<ServedModel>,
    pool: TokenizerPool,
    listeners: Vec<std::net::TcpListener>,
    /// `--grpc-port`'s.
    grpc_listeners: Vec<std::net::TcpListener>,
}

impl Serving {
    /// Serves until the shutdown sequence ends; notes when the signal came in `signal_at`.
    async fn serve(self, signal_at: Arc<OnceLock<Instant>>) -> Result<(), String> {
        let default = &self.models[0];
        // One bucket layout for every model's input lengths, up to the longest model's.
        let max_input_length = self.models.iter().map(|m| m.info.max_input_length).max();
        let metrics = Arc::new(Metrics::new(max_input_length.unwrap_or_default()));
        let hot = hot_poll(default.profile.http_spin, self.pool.load());
        let several = self.models.len() > 1;
        let shutdown = Shutdown::default();
        let tracing = match self.args.otlp() {
            Some(otlp) => {
                let tracing =
                    RequestTracing::start(&otlp, metrics.clone()).map_err(|e| e.to_string())?;
                tracing::info!(
                    endpoint = otlp.endpoint,
                    protocol = ?otlp.protocol,
                    "exporting request spans over OTLP"
                );
                Some(tracing)
            }
            None => None,
        };
        let mut entries = Vec::with_capacity(self.models.len());
        let mut batching_tasks = Vec::with_capacity(self.models.len());
        for model in self.models {
            let info_body = build_info(&model.args, &model.info, self.pool.workers());
            let compute_type = model.info.device.clone().unwrap_or_else(|| "cpu".into());
            let model_metrics = if several {
                ModelMetrics::named(metrics.clone(), &model.args.model().name)
            } else {
                ModelMetrics::only(metrics.clone())
            };
            let (infer, batching_task) = Infer::new(
                model.tokenizer.start(&self.pool),
                model.backend,
                Arc::new(model.info),
                &model.profile,
                self.args.max_concurrent_requests,
                model_metrics,
            );
            let infer = infer.with_image_limits(ImageLimits {
                max_bytes: model.args.max_image_bytes,
                max_pixels: model.args.max_image_pixels,
            });
            let infer = infer.with_image_fetcher(image_fetcher(&model.args)?);
            batching_tasks.push(batching_task);
            entries.push(ModelEntry {
                spec: model.args.model().clone(),
                adapters: model.adapters,
                infer,
                info: Arc::new(info_body.clone()),
                config: Arc::new(ServeConfig {
                    max_client_batch_size: model.args.max_client_batch_size,
                    auto_truncate: model.args.auto_truncate,
                    long_input: model.args.long_input,
                    max_chunks: model.args.max_chunks as usize,
                    served_model_name: info_body.served_model_name.clone(),
                    api_key: self.args.api_key.clone(),
                    payload_limit: self.args.payload_limit,
                    cors_allow_origin: self.args.cors_allow_origin.clone(),
                    compute_type,
                    body_read_timeout: self.args.body_read_timeout,
                    tracing: tracing.clone(),
                }),
            });
        }
        let directory = Arc::new(ModelDirectory::new(entries));
        let state = AppState::for_default(directory.clone(), metrics.clone(), shutdown.clone());
        for listener in &self.listeners {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!("listening on {addr} (HTTP and gRPC)");
            }
        }
        for listener in &self.grpc_listeners {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!("listening on {addr} (gRPC)");
            }
        }
        tracing::info!(
            http_spin_us = hot.as_ref().map_or(0, |h| h.window().as_micros() as u64),
            "Ready"
        );
        tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                shutdown.reached(Phase::Draining).await;
                let _ = signal_at.set(Instant::now());
            }
        });
        tokio::spawn(
            shutdown
                .clone()
                .on_signal(answer_deadline(self.args.shutdown_timeout)),
        );
        // Connections are served on a thread of their own; handlers of large requests come
        // back to this runtime (see `http_thread`).
        let handlers = Handlers::new(Some(tokio::runtime::Handle::current()), hot.clone());
        let limits = self.args.connection_limits();
        let app = app(state.clone());
        let http2 = grpc::http2_service(state, app.clone());
        let (listeners, grpc_listeners) = (self.listeners, self.grpc_listeners);
        http_thread::run(hot, move || async move {
            let endpoints = connections::Endpoints {
                http: async_listeners(listeners)?,
                grpc: async_listeners(grpc_listeners)?,
                app,
                http2: Some(http2),
            };
            connections::serve(endpoints, limits, shutdown, metrics, handlers).await;
            Ok::<(), String>(())
        })
        .await??;
        // Every connection is closed and every handler has returned; let the batching tasks
        // finish and release the backends.
        directory.shutdown();
        drop(directory);
        for task in batching_tasks {
            let _ = task.await;
        }
        if let Some(tracing) = tracing {
            // Sends the last spans; bounded by the export timeout, collector down or not.
            let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
        }
        Ok(())
    }
}

/// Bound sockets as the runtime's listeners (on the runtime that will accept from them).
fn async_listeners(
    listeners: Vec<std::net::TcpListener>,
) -> Result<Vec<tokio::net::TcpListener>, String> {
    listeners
        .into_iter()
        .map(tokio::net::TcpListener::from_std)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot listen: {e}"))
}

/// How the HTTP thread polls its sockets: for `window` after each request's start
/// (`ServingProfile::http_spin`), or `None` when that is zero and it sleeps whenever it has
/// nothing to read. By default it polls only where the runtime has an interactive lane, as
/// long as that lane's thread spins: a query then finds both awake.
///
/// It polls only while the tokenizer pool leaves cores free ([`PoolLoad`]): under a backfill
/// that keeps every pool thread busy with documents waiting, the core is the tokenizers',
/// and requests reach a host that is awake anyway. Under a backfill the GPU bounds (part of
/// the pool stands aside) or one whose tokenization keeps up, it polls, and a query is
/// spared the thread's wake-up.
fn hot_poll(window: Duration, pool: PoolLoad) -> Option<Arc<HotPoll>> {
    (!window.is_zero()).then(|| Arc::new(HotPoll::new(window, move || pool.leaves_cores_free())))
}

/// When, after the signal, still-running requests are answered 503: early enough that the
/// answers are written and the process has exited by `--shutdown-timeout`.
fn answer_deadline(shutdown_timeout: Duration) -> Duration {
    let margin = (connections::DEADLINE_FLUSH * 2).min(shutdown_timeout / 4);
    shutdown_timeout - margin
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
