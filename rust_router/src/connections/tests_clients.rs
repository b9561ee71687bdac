//! Tests of `connections` against misbehaving clients on a loopback socket: a trickled head,
//! answers never read or read slowly, a half-close, a client that leaves, a declared
//! oversize body, connections past the cap.
use super::*;
use axum::routing;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const BIG: usize = 16 << 20;

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_millis(300),
        keep_alive_timeout: Duration::from_secs(30),
        send_timeout: Duration::from_millis(500),
        response_buffer_limit: 1 << 20,
        max_connections: 8,
    }
}

/// Set by [`SlowHandler`] when its future is dropped before it finished.
struct DroppedEarly(Arc<AtomicBool>, bool);

impl Drop for DroppedEarly {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// `GET /big` answers 16 MiB, `POST /slow` after 400 ms, `POST /small` at once.
fn app(dropped: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/big", routing::get(|| async { vec![b'x'; BIG] }))
        .route("/small", routing::post(|| async { "ok" }))
        .route(
            "/slow",
            routing::post(move || {
                let guard = DroppedEarly(dropped.clone(), false);
                async move {
                    let mut guard = guard;
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    guard.1 = true;
                    "slow ok"
                }
            }),
        )
}

struct Server {
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    dropped: Arc<AtomicBool>,
}

async fn start(limits: ConnectionLimits) -> Server {
    let dropped = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(Metrics::new(16));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        Endpoints::http1(vec![listener], app(dropped.clone())),
        limits,
        Shutdown::default(),
        metrics.clone(),
        Handlers::default(),
    ));
    Server {
        addr,
        metrics,
        dropped,
    }
}

/// A client whose receive buffer is small, so that an answer it does not read stays in the
/// server.
async fn connect_small(addr: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(addr).await.unwrap()
}

fn post(path: &str) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{{}}").into_bytes()
}

/// Reads until the server closes; (what it sent, whether it closed within `limit`).
async fn read_all(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let read = stream.read_to_end(&mut out);
    let closed = matches!(tokio::time::timeout(limit, read).await, Ok(Ok(_)));
    (out, closed)
}

fn rendered(metrics: &Metrics) -> String {
    metrics.render()
}

#[tokio::test]
async fn a_trickled_head_is_cut_at_the_header_deadline_whatever_the_keep_alive() {
    let server = start(limits()).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let head = b"POST /small HTTP/1.1\r\nhost: t\r\n";
    let mut closed = false;
    for byte in head.iter().cycle().take(400) {
        if stream.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    let (_, eof) = read_all(&mut stream, Duration::from_millis(100)).await;
    assert!(closed || eof, "the trickled head held the connection");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "cut after {took:?}");
    assert!(rendered(&server.metrics).contains(r#"te_connection_timeout{phase="header"} 1"#));
}

#[tokio::test]
async fn an_answer_the_client_does_not_read_is_cut_at_the_send_deadline() {
    let server = start(limits()).await;
    let mut stream = connect_small(server.addr).await;
    stream
        .write_all(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (received, closed) = read_all(&mut stream, Duration::from_secs(2)).await;
    assert!(closed, "the connection outlived the send deadline");
    assert!(received.len() < BIG, "the whole answer was sent");
    let metrics = rendered(&server.metrics);
    assert!(
        metrics.contains(r#"te_connection_timeout{phase="send"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("te_response_unsent_bytes 0"), "{metrics}");
}

#[tokio::test]
async fn a_slow_reader_gets_the_whole_answer_past_the_keep_alive_timeout() {
    let server = start(ConnectionLimits {
        keep_alive_timeout: Duration::from_millis(200),
        send_timeout: Duration::from_secs(1),
        ..limits()
    })
    .await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"GET /big HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut received = 0;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        received += n;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(received > BIG, "cut after {received} bytes");
    assert!(
        started.elapsed() > Duration::from_millis(200),
        "not slow enough to test"
    );
}

#[tokio::test]
async fn past_the_buffer_limit_new_work_is_503_until_the_unread_answer_is_cut() {
    let server = start(limits()).await;
    let mut unread = connect_small(server.addr).await;
    unread
        .write_all(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut other = TcpStream::connect(server.addr).await.unwrap();
    other.write_all(&post("/small")).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = other.read(&mut buf).await.unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("congested"), "{answer}");
    assert!(answer.contains("--response-buffer-limit"), "{answer}");
    assert!(rendered(&server.metrics).contains(r#"te_request_failure{err="congested"} 1"#));
    // Once the unread answer is cut, work is taken again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    other.write_all(&post("/small")).await.unwrap();
    let n = other.read(&mut buf).await.unwrap();
    let again = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let server = start(limits()).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(&post("/slow")).await.unwrap();
    stream.shutdown().await.unwrap();
    let (received, closed) = read_all(&mut stream, Duration::from_secs(3)).await;
    let received = String::from_utf8_lossy(&received).into_owned();
    assert!(closed, "{received}");
    assert!(received.contains("HTTP/1.1 200"), "{received}");
    assert!(received.ends_with("slow ok"), "{received}");
    assert!(!server.dropped.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_client_that_leaves_mid_request_frees_its_handler() {
    let server = start(limits()).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(&post("/slow")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        server.dropped.load(Ordering::SeqCst),
        "the handler of a client that left kept running"
    );
}

#[tokio::test]
async fn a_declared_oversize_body_is_refused_before_it_is_sent() {
    use crate::http::test_util::{test_app, Options};
    let test = test_app(Options::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        Endpoints::http1(vec![listener], test.router.clone()),
        limits(),
        Shutdown::default(),
        test.metrics.clone(),
        Handlers::default(),
    ));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /embed HTTP/1.1\r\nhost: t\r\ncontent-length: 100000000\r\n\r\n{")
        .await
        .unwrap();
    let (answer, closed) = read_all(&mut stream, Duration::from_secs(2)).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(closed, "{answer}");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("--payload-limit"), "{answer}");
}

#[tokio::test]
async fn clients_past_the_connection_cap_read_the_503_not_a_reset() {
    let server = start(ConnectionLimits {
        max_connections: 1,
        ..limits()
    })
    .await;
    let _held = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..20 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        if i % 2 == 1 {
            // The request arrives after the 503 was written.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stream.write_all(&post("/small")).await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut out))
            .await
            .expect("the refused connection stayed open");
        assert!(read.is_ok(), "client {i}: {read:?}");
        let answer = String::from_utf8_lossy(&out).into_owned();
        assert!(answer.starts_with("HTTP/1.1 503"), "client {i}: {answer}");
    }
}
