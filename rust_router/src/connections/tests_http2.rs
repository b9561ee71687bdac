//! HTTP/2 connections: told from HTTP/1.1 on the HTTP port by their preface (both served
//! there), HTTP/2 only on `--grpc-port`, served on the workers' runtime, closed by the drain.
use super::http2::protocol_of;
use super::*;
use crate::http::test_util::{test_app, Options};
use axum::body::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(5),
        keep_alive_timeout: Duration::from_secs(30),
        send_timeout: Duration::from_secs(5),
        response_buffer_limit: 1 << 20,
        max_connections: 8,
    }
}

#[test]
fn the_first_bytes_tell_the_protocol() {
    assert_eq!(
        protocol_of(b"PRI * HTTP/2.0\r\n\r\nSM"),
        Some(Protocol::Http2)
    );
    assert_eq!(protocol_of(b"PRI"), Some(Protocol::Http2));
    assert_eq!(protocol_of(b"POST /embed HTTP/1.1"), Some(Protocol::Http1));
    assert_eq!(protocol_of(b"GET"), Some(Protocol::Http1));
    assert_eq!(protocol_of(b"X"), Some(Protocol::Http1));
    // Not enough yet: `POST` and `PUT` start with `P` too.
    assert_eq!(protocol_of(b"P"), None);
    assert_eq!(protocol_of(b"PR"), None);
}

struct Ports {
    http: std::net::SocketAddr,
    grpc: std::net::SocketAddr,
    served: tokio::task::JoinHandle<()>,
    metrics: Arc<Metrics>,
}

/// The fake model's app with gRPC on an HTTP port and a gRPC port, HTTP/2 connections
/// handed to this runtime as they are to the workers'.
async fn start(shutdown: Shutdown) -> Ports {
    start_with(shutdown, limits()).await
}

async fn start_with(shutdown: Shutdown, limits: ConnectionLimits) -> Ports {
    let app = test_app(Options {
        shutdown: shutdown.clone(),
        ..Default::default()
    });
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ports = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
    let endpoints = Endpoints {
        http: vec![http],
        grpc: vec![grpc],
        app: app.router.clone(),
        http2: Some(crate::grpc::http2_service(
            app.state.clone(),
            app.router.clone(),
        )),
    };
    let handlers = Handlers::new(Some(tokio::runtime::Handle::current()), None);
    let served = tokio::spawn(serve(
        endpoints,
        limits,
        shutdown,
        app.metrics.clone(),
        handlers,
    ));
    Ports {
        http: ports.0,
        grpc: ports.1,
        served,
        metrics: app.metrics.clone(),
    }
}

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

async fn h2_connect(addr: std::net::SocketAddr) -> Sender {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

async fn h2_health(sender: &mut Sender) -> u16 {
    let req = hyper::Request::get("http://t/health")
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.send_request(req).await.unwrap().status().as_u16()
}

/// `tei.v1.Info/Info` with an empty message: its `grpc-status`.
async fn grpc_info(sender: &mut Sender) -> String {
    let req = hyper::Request::post("http://t/tei.v1.Info/Info")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers");
    assert!(collected.to_bytes().len() > 5, "an InfoResponse");
    trailers["grpc-status"].to_str().unwrap().to_string()
}

async fn http1_health(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    answer
}

#[tokio::test]
async fn the_http_port_serves_both_protocols() {
    let ports = start(Shutdown::default()).await;
    assert!(http1_health(ports.http).await.starts_with("HTTP/1.1 200"));
    let mut h2 = h2_connect(ports.http).await;
    assert_eq!(h2_health(&mut h2).await, 200);
    assert_eq!(grpc_info(&mut h2).await, "0");
    // Many requests on one connection, as gRPC clients send them.
    for _ in 0..3 {
        assert_eq!(grpc_info(&mut h2).await, "0");
    }
}

#[tokio::test]
async fn the_grpc_port_serves_http2_only() {
    let ports = start(Shutdown::default()).await;
    let mut h2 = h2_connect(ports.grpc).await;
    assert_eq!(grpc_info(&mut h2).await, "0");
    let answer = http1_health(ports.grpc).await;
    assert!(!answer.contains("200"), "{answer}");
}

#[tokio::test]
async fn the_drain_closes_http2_connections() {
    let shutdown = Shutdown::default();
    let ports = start(shutdown.clone()).await;
    let mut idle = h2_connect(ports.grpc).await;
    assert_eq!(grpc_info(&mut idle).await, "0");
    shutdown.advance(Phase::Draining);
    // An idle HTTP/2 connection does not hold the shutdown: it is told to go (GOAWAY).
    tokio::time::timeout(Duration::from_secs(5), ports.served)
        .await
        .expect("served until drained")
        .unwrap();
    let req = hyper::Request::get("http://t/health")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert!(idle.send_request(req).await.is_err());
}

#[tokio::test]
async fn a_client_that_stops_inside_the_preface_is_cut_at_the_header_timeout() {
    let ports = start_with(
        Shutdown::default(),
        ConnectionLimits {
            header_read_timeout: Duration::from_millis(200),
            ..limits()
        },
    )
    .await;
    let mut stream = TcpStream::connect(ports.http).await.unwrap();
    stream.write_all(b"P").await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "still open");
    assert!(ports
        .metrics
        .render()
        .contains("te_connection_timeout{phase=\"header\"} 1"));
    // `P` and more is still HTTP/1.1 (`POST`, `PUT`, ...).
    let mut stream = TcpStream::connect(ports.http).await.unwrap();
    stream.write_all(b"P").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    stream
        .write_all(
            b"OST /embed HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        )
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
}
