//! Closing a connection so that the client reads its last answer: the 503 past
//! `--max-connections`, a 413 for a body never read, any answer with `connection: close`.
//!
//! Closing a socket with unread bytes in it makes the kernel send a reset, and a reset makes
//! the client's kernel drop what it received and has not been read yet: the answer. So the
//! server first sends its FIN (the client reads the answer to its end), then reads and
//! discards what the client still sends, for a short while, before it closes.

use crate::metrics::Metrics;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How long a closing connection may still send bytes the server discards.
pub const LINGER: Duration = Duration::from_secs(2);

/// Refused connections that may linger at once; past them a refused connection is closed at
/// once (a flood of connections must not hold more than this).
pub const REFUSED_LINGERING: usize = 256;

/// Sends the FIN (if hyper has not), then discards what the client still sends until it
/// closes too, or for `linger` at most.
pub async fn linger(mut stream: TcpStream, linger: Duration) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(linger, drain).await;
}

/// Logs refused connections at most every few seconds, with how many since the last line.
#[derive(Debug, Default)]
pub struct RefusalLog {
    last: Option<Instant>,
    unlogged: u64,
}

const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// The answer to a connection past the cap: a complete HTTP response, so clients see why.
static REFUSAL: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = r#"{"error":"Too many open connections (--max-connections), retry later","error_type":"overloaded"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// The connections refused and still lingering.
#[derive(Debug)]
pub struct Refusals {
    log: Mutex<RefusalLog>,
    lingering: Arc<Semaphore>,
}

impl Default for Refusals {
    fn default() -> Self {
        Self {
            log: Mutex::default(),
            lingering: Arc::new(Semaphore::new(REFUSED_LINGERING)),
        }
    }
}

/// Past `--max-connections`: answer 503 and close, never wait in the accept loop. The close
/// lingers (see the module) on a task of its own, so the client reads the 503 whether its
/// request arrived before or after it.
pub fn refuse(stream: TcpStream, refusals: &Refusals, metrics: &Metrics, max_connections: usize) {
    let _ = stream.try_write(&REFUSAL);
    if let Ok(slot) = refusals.lingering.clone().try_acquire_owned() {
        tokio::spawn(async move {
            linger(stream, LINGER / 2).await;
            drop(slot);
        });
    }
    metrics.inc("te_connection_refused", &[]);
    let mut log = refusals.log.lock().unwrap_or_else(|p| p.into_inner());
    log.unlogged += 1;
    let now = Instant::now();
    if log.last.is_none_or(|t| now - t >= REFUSAL_LOG_EVERY) {
        tracing::warn!(
            refused = log.unlogged,
            max_connections,
            "refused connections: --max-connections are open"
        );
        log.last = Some(now);
        log.unlogged = 0;
    }
}
