//! Structured logs: text for people, JSON lines (`--json-output`) for log pipelines.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. The level comes from `LOG_LEVEL` or `RUST_LOG` (default
/// `info`). A second call (a second `run` in one Python process) keeps the first subscriber.
pub fn init(json: bool, disable_spans: bool) {
    let filter = std::env::var("LOG_LEVEL")
        .or_else(|_| std::env::var("RUST_LOG"))
        .map(EnvFilter::new)
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(!disable_spans)
            .with_span_list(!disable_spans)
            .try_init()
    } else {
        // Colors only for a terminal: escape codes in a log file or pipeline are noise.
        builder
            .with_target(false)
            .with_ansi(std::io::stdout().is_terminal())
            .try_init()
    };
}
