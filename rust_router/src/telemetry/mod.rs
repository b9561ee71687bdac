//! OpenTelemetry traces of requests (`--otlp-endpoint`), as TEI exports them: a span per HTTP
//! request or gRPC call, with children for its tokenization, its queue wait and the forward
//! pass of each batch that ran it (docs/tracing.md).
//!
//! The inference layer only notes timings ([`record`]); the transport layer turns them into
//! spans with explicit start and end times once the request is answered ([`spans`]). A batch
//! serves many requests on a backend thread, so no span is entered there: each request's
//! `inference` child is made from its batch's measured start and end. Without an endpoint
//! nothing is recorded or built.

pub mod export;
pub mod record;
pub mod spans;

use crate::metrics::Metrics;
use export::{Bounded, Counting, ExportCounts};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use std::sync::Arc;
use std::time::Duration;

/// TEI's service name, so that dashboards and queries written for TEI find the router's spans.
pub const DEFAULT_SERVICE_NAME: &str = "text-embeddings-inference.server";

/// Spans that may wait for export; past it new ones are dropped (and counted).
const MAX_QUEUED_SPANS: usize = 2048;
/// How long one export may take before its spans count as dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// How spans travel to the collector (`--otlp-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (the collector's port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318, `POST /v1/traces`).
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

/// Where and as whom spans are exported.
#[derive(Debug, Clone)]
pub struct OtlpSettings {
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    pub service_name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("--otlp-endpoint `{endpoint}`: {why}")]
    Endpoint { endpoint: String, why: String },
}

/// The server's tracer: cheap to clone, shared by every model's handlers.
#[derive(Debug, Clone)]
pub struct RequestTracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
}

impl RequestTracing {
    /// Starts the exporter. Nothing connects yet: a collector that is down (or comes up
    /// later) never keeps the server from starting. Must run inside a tokio runtime (the gRPC
    /// channel's worker runs there).
    pub fn start(settings: &OtlpSettings, metrics: Arc<Metrics>) -> Result<Self, TelemetryError> {
        let uri = collector_uri(&settings.endpoint)?;
        let invalid = |why: String| TelemetryError::Endpoint {
            endpoint: settings.endpoint.clone(),
            why,
        };
        crate::tls::install_crypto_provider();
        let exporter = match settings.protocol {
            OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(EXPORT_TIMEOUT)
                .build(),
            OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(traces_url(&uri))
                .with_timeout(EXPORT_TIMEOUT)
                .build(),
        }
        .map_err(|e| invalid(e.to_string()))?;
        let counts = Arc::new(ExportCounts::new(metrics));
        let batches = BatchSpanProcessor::builder(Counting {
            inner: exporter,
            counts: counts.clone(),
        })
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(MAX_QUEUED_SPANS)
                .build(),
        )
        .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded {
                inner: batches,
                max_queued: MAX_QUEUED_SPANS,
                counts,
            })
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer(env!("CARGO_PKG_NAME"));
        Ok(Self { tracer, provider })
    }

    /// Exports what is queued, waiting for it (tests; shutdown). Blocks: not on a runtime's
    /// worker.
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }

    /// Exports what is queued and stops the export thread, waiting at most a few seconds.
    /// Blocks: not on a runtime's worker.
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown_with_timeout(EXPORT_TIMEOUT);
    }
}

/// `--otlp-endpoint` as a URL: `http://` with a host (checked at start, before the model
/// loads). No TLS client is built in: a collector is reached in plain text, as a local agent
/// or sidecar is.
pub fn collector_uri(endpoint: &str) -> Result<axum::http::Uri, TelemetryError> {
    let invalid = |why: &str| TelemetryError::Endpoint {
        endpoint: endpoint.to_string(),
        why: why.to_string(),
    };
    let uri: axum::http::Uri = endpoint.parse().map_err(|_| invalid("not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(invalid(
            "must be an http:// URL with a host, e.g. http://localhost:4317 (TLS is not built \
             in: use a local collector or agent)",
        ));
    }
    Ok(uri)
}

/// OTLP/HTTP's traces URL: an endpoint given without a path (`http://collector:4318`) gets
/// the standard `/v1/traces`, as the collector's base address conventionally is given.
fn traces_url(uri: &axum::http::Uri) -> String {
    let text = uri.to_string();
    match uri.path() {
        "" | "/" => format!("{}/v1/traces", text.trim_end_matches('/')),
        _ => text,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod tests_receivers;
