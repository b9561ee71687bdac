//! Tests of `connections`: deadlines, the connection cap and the drain.
use super::*;
use crate::shutdown::DRAIN_GRACE;
use activity::{verdict, Activity, Close};

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(10),
        keep_alive_timeout: Duration::from_secs(60),
        send_timeout: Duration::from_secs(30),
        response_buffer_limit: 1 << 20,
        max_connections: 4,
    }
}

fn activity(in_handler: usize, head_started: Option<Instant>, idle_since: Instant) -> Activity {
    Activity {
        in_handler,
        head_started,
        idle_since,
        ..Activity::new(idle_since)
    }
}

#[test]
fn idle_connections_close_after_the_keep_alive_timeout() {
    let t0 = Instant::now();
    let a = activity(0, None, t0);
    // Looked at again every header deadline, in case a head has started meanwhile.
    assert_eq!(
        verdict(&a, t0, &limits(), None, None),
        Ok(t0 + Duration::from_secs(10))
    );
    let near = t0 + Duration::from_secs(55);
    assert_eq!(
        verdict(&a, near, &limits(), None, None),
        Ok(t0 + Duration::from_secs(60))
    );
    let late = t0 + Duration::from_secs(60);
    assert_eq!(
        verdict(&a, late, &limits(), None, None),
        Err(Close::IdleTimeout)
    );
}

#[test]
fn a_head_must_arrive_within_the_header_deadline() {
    let t0 = Instant::now();
    let head = t0 + Duration::from_secs(30);
    let a = activity(0, Some(head), t0);
    assert_eq!(
        verdict(&a, head, &limits(), None, None),
        Ok(head + Duration::from_secs(10))
    );
    let late = head + Duration::from_secs(10);
    assert_eq!(
        verdict(&a, late, &limits(), None, None),
        Err(Close::HeaderTimeout)
    );
}

#[test]
fn a_running_handler_keeps_the_connection_until_the_deadline_flush() {
    let t0 = Instant::now();
    let a = activity(1, None, t0);
    let much_later = t0 + Duration::from_secs(3600);
    assert!(verdict(&a, much_later, &limits(), Some(t0), None).is_ok());
    let deadline = t0 + Duration::from_secs(30);
    assert_eq!(
        verdict(&a, deadline, &limits(), Some(t0), Some(deadline)),
        Ok(deadline + DEADLINE_FLUSH)
    );
    assert_eq!(
        verdict(
            &a,
            deadline + DEADLINE_FLUSH,
            &limits(),
            Some(t0),
            Some(deadline)
        ),
        Err(Close::Deadline)
    );
}

#[test]
fn draining_closes_idle_and_half_sent_connections_after_the_grace() {
    let t0 = Instant::now();
    let drain = t0 + Duration::from_secs(5);
    for a in [activity(0, None, t0), activity(0, Some(t0), t0)] {
        assert_eq!(
            verdict(&a, drain, &limits(), Some(drain), None),
            Ok(drain + DRAIN_GRACE)
        );
        assert_eq!(
            verdict(&a, drain + DRAIN_GRACE, &limits(), Some(drain), None),
            Err(Close::Draining)
        );
    }
}

/// The server on a loopback port over the fake backend, whose forward passes take
/// `delay`.
async fn serve_fake(
    delay: Duration,
) -> (std::net::SocketAddr, Shutdown, tokio::task::JoinHandle<()>) {
    use crate::http::test_util::{test_app, Options};
    let shutdown = Shutdown::default();
    let app = test_app(Options {
        shutdown: shutdown.clone(),
        delay,
        ..Default::default()
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve(
        Endpoints::http1(vec![listener], app.router.clone()),
        limits(),
        shutdown.clone(),
        app.metrics.clone(),
        Handlers::default(),
    ));
    (addr, shutdown, server)
}

async fn post_embed(addr: std::net::SocketAddr) -> TcpStream {
    use tokio::io::AsyncWriteExt;
    let body = r#"{"inputs": "hello"}"#;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /embed HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

async fn read_to_close(mut stream: TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let read = stream.read_to_end(&mut out);
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("the connection stayed open")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_request_still_running_at_the_deadline_is_answered_503() {
    let (addr, shutdown, server) = serve_fake(Duration::from_secs(3)).await;
    let stream = post_embed(addr).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    shutdown.advance(Phase::Draining);
    shutdown.advance(Phase::Deadline);
    let answer = read_to_close(stream).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("shutting_down"), "{answer}");
    assert!(answer.contains("--shutdown-timeout"), "{answer}");
    tokio::time::timeout(DEADLINE_FLUSH * 3, server)
        .await
        .expect("serve outlived the deadline")
        .unwrap();
}

#[tokio::test]
async fn draining_finishes_accepted_requests_then_stops_accepting() {
    let (addr, shutdown, server) = serve_fake(Duration::from_millis(300)).await;
    let stream = post_embed(addr).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    shutdown.advance(Phase::Draining);
    // A late request on a new connection is answered, not refused or reset.
    let late = read_to_close(post_embed(addr).await).await;
    assert!(late.starts_with("HTTP/1.1 503"), "{late}");
    let answer = read_to_close(stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    tokio::time::timeout(Duration::from_secs(3), server)
        .await
        .expect("serve did not end once the accepted request was answered")
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
}

#[tokio::test]
async fn a_client_reconnecting_right_after_the_drain_is_answered_not_reset() {
    let (addr, shutdown, server) = serve_fake(Duration::from_millis(10)).await;
    shutdown.advance(Phase::Draining);
    // Nothing was in flight: the drain is over at once, and clients that reconnect
    // within the quiet period, one after the other, still get their 503.
    for _ in 0..3 {
        tokio::time::sleep(LISTEN_QUIET / 4).await;
        let late = read_to_close(post_embed(addr).await).await;
        assert!(late.starts_with("HTTP/1.1 503"), "{late}");
    }
    tokio::time::timeout(Duration::from_secs(3), server)
        .await
        .expect("serve did not end once the listeners were quiet")
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
}

#[test]
fn an_answer_being_sent_has_the_send_deadline_not_the_idle_or_drain_ones() {
    let t0 = Instant::now();
    let mut a = activity(0, None, t0);
    a.unsent = 1000;
    a.last_sent = t0;
    let send = t0 + Duration::from_secs(30);
    assert_eq!(verdict(&a, t0, &limits(), Some(t0), None), Ok(send));
    assert_eq!(
        verdict(&a, send, &limits(), Some(t0), None),
        Err(Close::SendTimeout)
    );
    // Progress moves the deadline.
    a.last_sent = t0 + Duration::from_secs(20);
    assert_eq!(
        verdict(&a, send, &limits(), None, None),
        Ok(send + Duration::from_secs(20))
    );
}
