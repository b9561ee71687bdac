//! Command line flags: TEI's names and environment variables, plus the backend choice.

use crate::backend::process::DeviceWorkers;
use crate::infer::parse_max_queue_ms;
use crate::models::{LoraSpec, ModelSpec};
use crate::models_file::{FileModel, ModelOptions, ModelsFile};
use crate::schedule::{PolicyFlags, DEFAULT_WARM_EVERY_US};
use crate::telemetry::{OtlpProtocol, OtlpSettings, DEFAULT_SERVICE_NAME};
use crate::tokenization::{LongInput, PoolPriority};
use clap::{Parser, ValueEnum};
use std::time::Duration;

/// A positive number of seconds (fractions allowed).
fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(v > 0.0 && v.is_finite() && v < 1e9) {
        return Err(format!("must be a positive number of seconds, got `{s}`"));
    }
    Ok(Duration::from_secs_f64(v))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The `trt_tei_runtime` Python runtime (or any class with its contract), in-process.
    Python,
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "text-embeddings-router",
    version,
    about = "TEI- and OpenAI-compatible embedding, reranking and classification server"
)]
pub struct Args {
    /// Hub model id or local folder of a model to serve, as `ID` or `NAME=ID` (the name
    /// requests select it by with `model`; default: the id's last path component). Give it
    /// once per model, or list models in `--models`: the first is the default, which answers
    /// requests that name none.
    #[arg(
        long = "model-id",
        env = "MODEL_ID",
        value_name = "MODEL_ID",
        required_unless_present = "models_file",
        value_parser = ModelSpec::parse
    )]
    pub models: Vec<ModelSpec>,

    /// A YAML file of models to serve after the `--model-id`s (the first of its entries is the
    /// default when no `--model-id` is given), each with its own options: a list of entries
    /// with `model_id` and optionally `name`, `revision`, `dtype`, `pooling`, `task`,
    /// `max_active_dims`, `default_prompt_name` or `default_prompt`, `max_batch_tokens`,
    /// `max_batch_requests`, `max_client_batch_size`, `auto_truncate`, `long_input`,
    /// `max_chunks`, `lora_adapters` (name: folder) and `weight` (its share of a device's backfill time, default 1). An
    /// entry's option overrides the flag of the same name for that model only.
    #[arg(
        long = "models",
        env = "MODELS_FILE",
        value_name = "FILE",
        value_parser = ModelsFile::read
    )]
    pub models_file: Option<ModelsFile>,

    /// The model these flags load: the `model_index`-th of [`Args::served_models`] (set by
    /// [`Args::for_model`]).
    #[arg(skip)]
    pub model_index: usize,

    /// A PEFT LoRA adapter folder to serve, as `NAME=PATH`; requests select it with
    /// `model: NAME`. It loads onto the served model its `adapter_config.json`'s
    /// `base_model_name_or_path` names (by id or name), else onto the default model. Give it
    /// once per adapter; requests for several adapters of one model and for the model itself
    /// share batches.
    #[arg(long = "lora-adapter", value_name = "NAME=PATH", value_parser = LoraSpec::parse)]
    pub lora_adapters: Vec<LoraSpec>,

    /// The adapters of the model these flags load (set by [`Args::for_model`]).
    #[arg(skip)]
    pub model_adapters: Vec<LoraSpec>,

    /// Hub revision (branch, tag or commit) of the model.
    #[arg(long, env = "REVISION")]
    pub revision: Option<String>,

    /// Threads that tokenize requests, one pool for every served model, and decode and resize
    /// their images where the router matches the model's steps [default: number of CPU
    /// cores]. Where the runtime has an interactive lane (a GPU), 3/8 of them stand aside
    /// while full bulk batches leave entries waiting (the GPU bounds the backfill), leaving
    /// their cores to queries.
    #[arg(long, env = "TOKENIZATION_WORKERS")]
    pub tokenization_workers: Option<usize>,

    /// How the tokenization threads share the CPU with the threads that answer queries:
    /// `idle` lets any other thread that wakes up take a core from them at once (a query is
    /// not slowed by a backfill's tokenization), `low` runs them at nice 19, `normal` at the
    /// default. Linux only; elsewhere every value is `normal`. [default: `idle` where the
    /// runtime has an interactive lane (a GPU), else `normal`]
    #[arg(long, env = "TOKENIZATION_PRIORITY", value_enum)]
    pub tokenization_priority: Option<PoolPriority>,

    /// Weights dtype (float32, float16, bfloat16, ...) [default: the runtime's choice].
    #[arg(long, env = "DTYPE")]
    pub dtype: Option<String>,

    /// Pooling override for embedding models: cls, mean or last-token (`splade` is the only
    /// pooling of a SPLADE model, and its default).
    #[arg(long, env = "POOLING")]
    pub pooling: Option<String>,

    /// SPLADE models: keep at most this many active dimensions (the largest) per sparse
    /// vector, as sentence-transformers' `max_active_dims` [default: all].
    #[arg(long, env = "MAX_ACTIVE_DIMS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_active_dims: Option<u32>,

    /// Load the checkpoint for another task than its architecture's, e.g. `rerank-yes-no`
    /// for a Qwen3-Reranker `*ForCausalLM` (scored as logit("yes") - logit("no")).
    #[arg(long, env = "TASK")]
    pub task: Option<String>,

    /// Requests in flight at once; more are refused with 429.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 512)]
    pub max_concurrent_requests: usize,

    /// Most tokens in one forward pass (packed, no padding).
    #[arg(long, env = "MAX_BATCH_TOKENS", default_value_t = 16384)]
    pub max_batch_tokens: usize,

    /// Most sequences in one forward pass [default: no limit beyond the token budget].
    #[arg(long, env = "MAX_BATCH_REQUESTS")]
    pub max_batch_requests: Option<usize>,

    /// Requests of at most this many tokens in all (every input, after truncation) are
    /// interactive: they get their own queue, and their own backend thread when the runtime
    /// has one, so queries are not stuck behind corpus backfills. 0 turns the lane off.
    #[arg(long, env = "INTERACTIVE_MAX_TOKENS", default_value_t = 256)]
    pub interactive_max_tokens: usize,

    /// Longest a request may wait in the queue before it starts running, in milliseconds (1 to
    /// 3600000); past it the request is answered 503 `queue_timeout` without running. A
    /// request's `X-Max-Queue-Ms` header overrides it. A request of which some inputs have
    /// started runs to the end. [default: no limit]
    #[arg(long, env = "MAX_QUEUE_MS", value_parser = parse_max_queue_ms)]
    pub max_queue_ms: Option<Duration>,

    /// Where the runtime has no interactive lane (CPU), one backend thread runs both queues
    /// and a query waits for the bulk batch in progress: bulk batches are then bounded to
    /// about this many milliseconds of forward pass (their token budget follows the measured
    /// speed), and none is prefetched behind the one in progress, so queries stay fast during
    /// a backfill; a batch of queries is topped up with bulk entries to that budget. 0:
    /// bounded by tokens only, prefetched, and queries in batches of their own.
    #[arg(long, env = "MAX_BULK_BATCH_MS", default_value_t = 40)]
    pub max_bulk_batch_ms: u64,

    /// On a GPU with the interactive lane, a query waits for about two steps of the bulk
    /// batch in progress, a step being one layer. Where a layer of a full bulk batch takes
    /// longer than this or than 0.5 ms (measured at start-up), queries may also pass between
    /// the linears of a layer (free on the GPU), and where one linear is longer than this,
    /// bulk batches run in parts of whole sequences, so that a step takes about this long.
    /// 0: steps are whole layers.
    /// [default: the runtime's, 6]
    #[arg(long, env = "MAX_BULK_STEP_MS", allow_negative_numbers = true)]
    pub max_bulk_step_ms: Option<f64>,

    /// The share of each device's memory the served models may fill, counting what is in use
    /// already (other models, other processes). Before each model loads, the runtime
    /// estimates its weights and batch buffers and refuses, with the figures, a model that
    /// does not fit what is left of this share.
    #[arg(
        long,
        env = "MEMORY_FRACTION",
        default_value_t = 0.95,
        allow_negative_numbers = true
    )]
    pub memory_fraction: f64,

    /// After each batch, a backend thread busy-waits this many microseconds for the next one
    /// before it sleeps. A thread that slept wakes on a cold core and the next query's host
    /// work runs slower (0.3-0.5 ms measured on a GPU machine); spinning costs a busy core
    /// while requests keep arriving within the window. Default: the interactive lane's
    /// threads (GPU only) spin 25,000 µs, bulk threads sleep at once. Given: every backend
    /// thread spins that long; 0 never spins.
    #[arg(long, env = "BACKEND_SPIN_US")]
    pub backend_spin_us: Option<u64>,

    /// While an interactive thread spins for the next query (`--backend-spin-us`), it re-runs
    /// the host side of a query every this many microseconds: tokenizing a short text and the
    /// runtime's `warm_query` (the last query's checks, staging buffer and copies, without the
    /// model), unless the device's bulk thread is running batches. The next query then finds
    /// that code and data in the CPU's caches (0.12-0.2 ms less per query every 20 ms on a GPU
    /// machine). 0: never.
    #[arg(long, env = "QUERY_WARM_US", default_value_t = DEFAULT_WARM_EVERY_US)]
    pub query_warm_us: u64,

    /// A query's handler (interactive lane) polls for its result this many microseconds,
    /// keeping its thread on its core, before it sleeps: the reply then does not wait
    /// for a woken thread to be scheduled, which took 1-1.7 ms at p99 under a backfill that
    /// kept every core busy. Two handlers poll at a time at most. Default: 5,000 where the
    /// runtime has an interactive lane (a GPU), else 0 (never).
    #[arg(long, env = "QUERY_SPIN_US")]
    pub query_spin_us: Option<u64>,

    /// After each request's start, the thread that reads the HTTP connections polls its
    /// sockets without sleeping for this many microseconds, unless documents wait for a
    /// free tokenizer thread (then the cores are the tokenizers'): a request arriving
    /// meanwhile does not wait for that thread to wake (~0.1 ms on a GPU machine after a
    /// pause). Costs a busy core while requests keep arriving within the
    /// window. Default: 25,000 where the runtime has an interactive lane (a GPU), else 0
    /// (the thread sleeps whenever it has nothing to read).
    #[arg(long, env = "HTTP_SPIN_US")]
    pub http_spin_us: Option<u64>,

    /// Most inputs in one client request; more are refused with 422.
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 32)]
    pub max_client_batch_size: usize,

    /// Truncate inputs longer than the model's limit instead of refusing them (422), unless a
    /// request says `truncate: false`.
    #[arg(long, env = "AUTO_TRUNCATE")]
    pub auto_truncate: bool,

    /// What an embedding input longer than the model's limit gets when its request sets
    /// neither `long_input` nor `truncate`: `error` (422; `truncate` with --auto-truncate),
    /// `truncate`, or `chunk` (embedded whole as the weighted mean of windows).
    #[arg(long, env = "LONG_INPUT", default_value = "error", value_parser = LongInput::parse_flag)]
    pub long_input: LongInput,

    /// Most windows one input is cut into under `long_input: chunk`; an input needing more is
    /// refused with 413.
    #[arg(long, env = "MAX_CHUNKS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_chunks: u32,

    /// Most bytes of one image input (`{"image": ...}`, after base64 decoding); a larger one
    /// is refused with 422 naming the input.
    #[arg(long, env = "MAX_IMAGE_BYTES", default_value_t = crate::images::DEFAULT_MAX_IMAGE_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_image_bytes: usize,

    /// Most pixels (width × height) of one decoded image input; a larger one is refused with
    /// 422 naming the input, before it is resized.
    #[arg(long, env = "MAX_IMAGE_PIXELS", default_value_t = crate::images::DEFAULT_MAX_IMAGE_PIXELS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,

    /// Hosts whose `http(s)://` image URLs are fetched (comma-separated; `*.example.com` allows
    /// its subdomains); none by default, and an image URL is refused with 422.
    #[arg(long, env = "ALLOWED_IMAGE_HOSTS", value_delimiter = ',', value_parser = crate::images::parse_host_pattern)]
    pub allowed_image_hosts: Vec<String>,

    /// Seconds one image URL's fetch may take (connection, headers and body together); past
    /// them, 422 naming the input.
    #[arg(long, env = "IMAGE_FETCH_TIMEOUT", default_value_t = crate::images::DEFAULT_IMAGE_FETCH_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub image_fetch_timeout: u64,

    /// Name of a prompt from config_sentence_transformers.json to prepend to every embedding
    /// input that names none.
    #[arg(long, env = "DEFAULT_PROMPT_NAME", conflicts_with = "default_prompt")]
    pub default_prompt_name: Option<String>,

    /// Text to prepend to every embedding input that names no prompt.
    #[arg(long, env = "DEFAULT_PROMPT")]
    pub default_prompt: Option<String>,

    /// Hugging Face Hub token, for private or gated models.
    #[arg(long, env = "HF_TOKEN", alias = "hf-api-token", hide_env_values = true)]
    pub hf_token: Option<String>,

    /// Address to listen on.
    #[arg(long, env = "HOSTNAME", default_value = "0.0.0.0")]
    pub hostname: String,

    /// Port to listen on. It serves the gRPC API too (HTTP/2 clients; docs/grpc.md).
    #[arg(short, long, env = "PORT", default_value_t = 3000)]
    pub port: u16,

    /// A second port, on the same addresses, that serves only the gRPC API (HTTP/2). gRPC is
    /// served on `--port` with or without it.
    #[arg(long, env = "GRPC_PORT")]
    pub grpc_port: Option<u16>,

    /// Hugging Face Hub cache folder.
    #[arg(long, env = "HUGGINGFACE_HUB_CACHE")]
    pub huggingface_hub_cache: Option<String>,

    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000)]
    pub payload_limit: usize,

    /// Seconds a client has to send a request's headers, from its first byte; slower
    /// connections are closed. A load balancer forwards headers at once.
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value = "10", value_parser = seconds)]
    pub header_read_timeout: Duration,

    /// Seconds a client has to send a request's body once its headers are in; slower requests
    /// get 408 and their connection is closed.
    #[arg(long, env = "BODY_READ_TIMEOUT", default_value = "60", value_parser = seconds)]
    pub body_read_timeout: Duration,

    /// Seconds an idle keep-alive connection stays open. Longer than a load balancer's own
    /// idle timeout (60 s on the common cloud ones), so the balancer, not the server, closes
    /// idle connections and never sends on one the server is closing.
    #[arg(long, env = "KEEP_ALIVE_TIMEOUT", default_value = "75", value_parser = seconds)]
    pub keep_alive_timeout: Duration,

    /// Seconds an answer may wait for its client to read any of it; a client that reads
    /// nothing for this long is disconnected. A slow download that keeps reading is not cut.
    #[arg(long, env = "SEND_TIMEOUT", default_value = "30", value_parser = seconds)]
    pub send_timeout: Duration,

    /// Bytes of answers the server may hold for clients that have not read them yet, over all
    /// connections; past it new POST requests get 503 until those are sent or cut
    /// (`--send-timeout`).
    #[arg(long, env = "RESPONSE_BUFFER_LIMIT", default_value_t = 512 * 1024 * 1024)]
    pub response_buffer_limit: u64,

    /// Most open connections; past it a new connection gets 503 and is closed at once. Lowered
    /// at start to what the open-file limit allows.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// Seconds from SIGTERM/SIGINT to exit: /health answers 503 at once, accepted requests
    /// finish, and what still runs at the deadline is answered 503.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "30", value_parser = seconds)]
    pub shutdown_timeout: Duration,

    /// Require `Authorization: Bearer <key>` on every route except the probes (GET /, /health,
    /// /ping), /metrics and the docs, and on every `tei.v1` gRPC call (`authorization`
    /// metadata).
    #[arg(long, env = "API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Log as JSON lines instead of text.
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,

    /// Leave span fields out of JSON logs.
    #[arg(long, env = "DISABLE_SPANS")]
    pub disable_spans: bool,

    /// OpenTelemetry collector to send request spans to (docs/tracing.md), e.g.
    /// `http://localhost:4317`. Unset: no tracing at all.
    #[arg(long, env = "OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// How spans reach `--otlp-endpoint`: OTLP over gRPC, or over HTTP (`http/protobuf`; an
    /// endpoint without a path gets `/v1/traces`).
    #[arg(long, env = "OTLP_PROTOCOL", value_enum, default_value_t = OtlpProtocol::Grpc)]
    pub otlp_protocol: OtlpProtocol,

    /// The `service.name` of the exported spans.
    #[arg(long, env = "OTLP_SERVICE_NAME", default_value = DEFAULT_SERVICE_NAME)]
    pub otlp_service_name: String,

    /// Origins allowed by CORS, comma separated [default: any].
    #[arg(long, env = "CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    pub cors_allow_origin: Option<Vec<String>>,

    /// Model name reported by /info and the OpenAI route [default: --model-id].
    #[arg(long, env = "SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,

    /// Inference backend.
    #[arg(long, value_enum, default_value = "python")]
    pub backend: BackendKind,

    /// Python class implementing the backend contract, as `module:Class`.
    #[arg(
        long,
        env = "PYTHON_BACKEND_CLASS",
        default_value = "trt_tei_runtime.backend:Backend"
    )]
    pub python_backend_class: String,

    /// One device for the runtime (e.g. cuda, cuda:1, cpu) [default: the runtime's choice:
    /// every visible GPU, else the CPU]. The one-device form of `--devices`: give one or the
    /// other.
    #[arg(long, env = "DEVICE")]
    pub device: Option<String>,

    /// Devices to serve from one process, one executor each (own batches, own interactive
    /// lane) fed by one queue: a list (`cuda:0,cuda:1`, `cpu,cpu`), or `all` (every visible
    /// GPU; the runtime's default when it sees more than one). Passed to the backend class as
    /// `devices=`, so it must accept that argument. A device that fails (the runtime raises
    /// `DeviceError`) takes no more batches; /health answers 200 while one device is healthy.
    #[arg(long, env = "DEVICES")]
    pub devices: Option<String>,

    /// How several devices are run: `processes` starts one runtime worker process per device
    /// (batches cross in shared memory; the router still queues and batches for all), so the
    /// devices do not share one Python interpreter; `threads` runs them all in this process;
    /// `auto` picks processes when more than one GPU is served. Processes need the backend
    /// class to name its devices (`device_names(devices)`, as the built-in one does).
    #[arg(long, env = "DEVICE_WORKERS", value_enum, default_value_t = DeviceWorkers::Auto)]
    pub device_workers: DeviceWorkers,
}

impl Args {
    /// Every model to serve, in order: the `--model-id`s, then the `--models` file's. The
    /// first is the default.
    pub fn served_models(&self) -> Vec<ModelSpec> {
        let from_file = self.file_models().iter().map(|m| m.spec.clone());
        self.models.iter().cloned().chain(from_file).collect()
    }

    fn file_models(&self) -> &[FileModel] {
        self.models_file.as_ref().map_or(&[], |f| &f.models)
    }

    /// The `--models` entry of [`Args::model`], if it comes from the file.
    fn file_model(&self) -> Option<&FileModel> {
        let index = self.model_index.checked_sub(self.models.len())?;
        self.file_models().get(index)
    }

    /// The model these flags load (the default one unless [`Args::for_model`] chose another).
    pub fn model(&self) -> &ModelSpec {
        match self.file_model() {
            Some(from_file) => &from_file.spec,
            None => &self.models[self.model_index],
        }
    }

    /// The hub id or folder of [`Args::model`].
    pub fn model_id(&self) -> &str {
        &self.model().id
    }

    /// The share of a device's backfill time that [`Args::model`] gets against the other
    /// models on it: its `weight` in the `--models` file, else 1.
    pub fn share_weight(&self) -> f64 {
        self.file_model().map_or(1.0, |m| m.weight)
    }

    /// Each served model's LoRA adapters, in [`Args::served_models`] order: every
    /// `--lora-adapter` goes to the model its config names (`models::assign_adapters`), and
    /// a `--models` entry's `lora_adapters` to that entry's model.
    pub fn adapters_by_model(&self) -> Result<Vec<Vec<LoraSpec>>, String> {
        let mut assigned =
            crate::models::assign_adapters(&self.served_models(), &self.lora_adapters)?;
        for (own, from_file) in assigned[self.models.len()..]
            .iter_mut()
            .zip(self.file_models())
        {
            own.extend(from_file.adapters.iter().cloned());
        }
        Ok(assigned)
    }

    /// These flags for the `index`-th of [`Args::served_models`]: its id and adapters, and the
    /// options its `--models` entry sets in place of the flags; every other flag shared.
    pub fn for_model(&self, index: usize, adapters: Vec<LoraSpec>) -> Args {
        let mut args = Args {
            model_index: index,
            model_adapters: adapters,
            ..self.clone()
        };
        if let Some(options) = args.file_model().map(|m| m.options.clone()) {
            args.override_with(&options);
        }
        args
    }

    /// The flags an entry of the `--models` file sets, in place of the command line's.
    fn override_with(&mut self, options: &ModelOptions) {
        fn set<T: Clone>(flag: &mut Option<T>, value: &Option<T>) {
            if value.is_some() {
                flag.clone_from(value);
            }
        }
        set(&mut self.revision, &options.revision);
        set(&mut self.dtype, &options.dtype);
        set(&mut self.pooling, &options.pooling);
        set(&mut self.task, &options.task);
        set(&mut self.max_active_dims, &options.max_active_dims);
        set(&mut self.max_batch_requests, &options.max_batch_requests);
        // The two prompt flags exclude each other: the entry's replaces both.
        if options.default_prompt_name.is_some() || options.default_prompt.is_some() {
            self.default_prompt_name
                .clone_from(&options.default_prompt_name);
            self.default_prompt.clone_from(&options.default_prompt);
        }
        if let Some(tokens) = options.max_batch_tokens {
            self.max_batch_tokens = tokens;
        }
        if let Some(size) = options.max_client_batch_size {
            self.max_client_batch_size = size;
        }
        if let Some(truncate) = options.auto_truncate {
            self.auto_truncate = truncate;
        }
        if let Some(mode) = options.long_input {
            self.long_input = mode;
        }
        if let Some(chunks) = options.max_chunks {
            self.max_chunks = chunks;
        }
    }

    /// The name /info and the OpenAI routes report for [`Args::model`]:
    /// `--served-model-name` or the id for the default model (as TEI does), the model's name
    /// for the others.
    pub fn served_name(&self) -> String {
        if self.model_index > 0 {
            return self.model().name.clone();
        }
        self.served_model_name
            .clone()
            .unwrap_or_else(|| self.model_id().to_string())
    }

    /// The flags that the batching and latency policy is resolved from
    /// (`schedule::ServingProfile::resolve`).
    pub fn policy_flags(&self) -> PolicyFlags {
        PolicyFlags {
            max_batch_tokens: self.max_batch_tokens,
            max_batch_requests: self.max_batch_requests,
            interactive_max_tokens: self.interactive_max_tokens,
            max_bulk_batch_ms: self.max_bulk_batch_ms,
            backend_spin_us: self.backend_spin_us,
            query_warm_us: self.query_warm_us,
            query_spin_us: self.query_spin_us,
            http_spin_us: self.http_spin_us,
            tokenization_priority: self.tokenization_priority,
            max_queue: self.max_queue_ms,
        }
    }

    /// Where request spans go (`--otlp-*`), if anywhere.
    pub fn otlp(&self) -> Option<OtlpSettings> {
        Some(OtlpSettings {
            endpoint: self.otlp_endpoint.clone()?,
            protocol: self.otlp_protocol,
            service_name: self.otlp_service_name.clone(),
        })
    }

    pub fn connection_limits(&self) -> crate::connections::ConnectionLimits {
        crate::connections::ConnectionLimits {
            header_read_timeout: self.header_read_timeout,
            keep_alive_timeout: self.keep_alive_timeout,
            send_timeout: self.send_timeout,
            response_buffer_limit: self.response_buffer_limit,
            max_connections: self.max_connections,
        }
    }

    /// Checks that need no model; model-dependent checks happen once the model is loaded.
    pub fn validate(&self) -> Result<(), String> {
        let file_adapters = self.file_models().iter().flat_map(|m| m.adapters.clone());
        let adapters: Vec<LoraSpec> = self
            .lora_adapters
            .iter()
            .cloned()
            .chain(file_adapters)
            .collect();
        crate::models::check_unique(&self.served_models(), &adapters)?;
        if let Some(endpoint) = &self.otlp_endpoint {
            crate::telemetry::collector_uri(endpoint).map_err(|e| e.to_string())?;
        }
        let positive = [
            ("--max-concurrent-requests", self.max_concurrent_requests),
            ("--max-batch-tokens", self.max_batch_tokens),
            ("--max-client-batch-size", self.max_client_batch_size),
            ("--payload-limit", self.payload_limit),
            (
                "--tokenization-workers",
                self.tokenization_workers.unwrap_or(1),
            ),
            ("--max-batch-requests", self.max_batch_requests.unwrap_or(1)),
            ("--max-connections", self.max_connections),
        ];
        for (flag, value) in positive {
            if value == 0 {
                return Err(format!("`{flag}` must be at least 1"));
            }
        }
        if !(self.memory_fraction > 0.0 && self.memory_fraction <= 1.0) {
            return Err(format!(
                "`--memory-fraction` must be more than 0 and at most 1; got {}",
                self.memory_fraction
            ));
        }
        if self.grpc_port == Some(self.port) && self.port != 0 {
            return Err(format!(
                "`--grpc-port {}` is `--port` itself, which serves gRPC already: give another \
                 port, or leave `--grpc-port` out",
                self.port
            ));
        }
        if let Some(ms) = self.max_bulk_step_ms {
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(format!(
                    "`--max-bulk-step-ms` must be a number of milliseconds, 0 or more; got {ms}"
                ));
            }
        }
        if let (Some(device), Some(devices)) = (&self.device, &self.devices) {
            return Err(format!(
                "`--device {device}` and `--devices {devices}` (or DEVICE and DEVICES) were both \
                 given: `--device` is the one-device form of `--devices`; give only one"
            ));
        }
        if self.devices.as_ref().is_some_and(|d| d.trim().is_empty()) {
            return Err(
                "`--devices` is empty: give a list (`cuda:0,cuda:1`), `all` or `cpu`".into(),
            );
        }
        if !self.python_backend_class.contains(':') {
            return Err(format!(
                "`--python-backend-class` must look like `module:Class`, got `{}`",
                self.python_backend_class
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
