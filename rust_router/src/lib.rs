//! `trt_tei_router`: the Rust half of trt-tei-runtime.
//!
//! An axum server with TEI's and OpenAI's embedding API that tokenizes on worker threads, packs
//! requests into token-budget batches and runs them on the Python runtime through PyO3, with
//! one OS thread owning the interpreter. Built by maturin as `trt_tei_runtime._router` (with
//! the `pyo3` feature); `cargo test` builds and tests everything else without Python.

pub mod allocator;
pub mod backend;
pub mod capped;
pub mod cli;
pub mod connections;
pub mod grpc;
pub mod http;
pub mod http_thread;
pub mod images;
pub mod infer;
pub mod logging;
pub mod metrics;
pub mod models;
pub mod models_file;
pub mod panics;
#[cfg(feature = "pyo3")]
pub mod python_module;
#[cfg(feature = "pyo3")]
pub mod python_tokenizer;
pub mod queue;
pub mod schedule;
pub mod server;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod tokenization;
