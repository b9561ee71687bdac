//! Tests of `http_thread`: where handlers run, and when the HTTP thread polls.
use super::*;
use axum::body::Body;
use axum::http::Request;
use axum::routing::{get, post};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime for the handlers that do not run inline, whose workers have their own name.
fn elsewhere() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("elsewhere")
        .enable_all()
        .build()
        .unwrap()
}

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("").to_string()
}

/// Answers with the name of the thread its handler ran on.
fn where_app() -> Router {
    Router::new()
        .route("/where", get(|| async { thread_name() }))
        .route("/where", post(|| async { thread_name() }))
        .route(
            "/panic",
            post(|| async { panic!("a handler's bug") as String }),
        )
}

fn post_with(path: &str, body: Body) -> axum::extract::Request {
    Request::post(path).body(body).unwrap()
}

async fn answer(handlers: &Handlers, req: axum::extract::Request) -> (u16, String) {
    let response = handlers.respond(where_app(), req, false).await;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Runs `test` on a current-thread runtime, on a thread named `http-test`.
fn on_http_test_thread<F: Future<Output = ()>>(test: impl FnOnce() -> F + Send + 'static) {
    std::thread::Builder::new()
        .name("http-test".into())
        .spawn(move || current_thread().block_on(test()))
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn only_bodies_of_known_small_length_fit_inline() {
    assert!(fits_inline(Some(0)));
    assert!(fits_inline(Some(INLINE_BODY_BYTES)));
    assert!(!fits_inline(Some(INLINE_BODY_BYTES + 1)));
    assert!(!fits_inline(None));
}

#[test]
fn small_requests_run_inline_and_large_or_unsized_ones_elsewhere() {
    let other = elsewhere();
    let handle = other.handle().clone();
    on_http_test_thread(move || async move {
        let handlers = Handlers::new(Some(handle), None);
        let small = Request::get("/where").body(Body::empty()).unwrap();
        assert_eq!(answer(&handlers, small).await, (200, "http-test".into()));
        let body = vec![b' '; INLINE_BODY_BYTES as usize + 1];
        let (status, name) = answer(&handlers, post_with("/where", Body::from(body))).await;
        assert_eq!(
            (status, name.starts_with("elsewhere")),
            (200, true),
            "{name}"
        );
        // A streamed body has no length until it ends: it may be large.
        let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>("x")]);
        let (_, name) = answer(&handlers, post_with("/where", Body::from_stream(chunks))).await;
        assert!(name.starts_with("elsewhere"), "{name}");
    });
}

#[test]
fn small_requests_run_elsewhere_while_the_inline_slots_are_taken() {
    let other = elsewhere();
    let handle = other.handle().clone();
    on_http_test_thread(move || async move {
        let handlers = Handlers::new(Some(handle), None);
        let held: Vec<_> = (0..INLINE_HANDLERS)
            .map(|_| handlers.inline.take().unwrap())
            .collect();
        let small = || Request::get("/where").body(Body::empty()).unwrap();
        let (_, name) = answer(&handlers, small()).await;
        assert!(name.starts_with("elsewhere"), "{name}");
        drop(held);
        assert_eq!(answer(&handlers, small()).await.1, "http-test");
    });
}

#[test]
fn without_another_runtime_every_handler_runs_inline() {
    on_http_test_thread(|| async {
        let handlers = Handlers::default();
        let body = vec![b' '; INLINE_BODY_BYTES as usize * 4];
        let (_, name) = answer(&handlers, post_with("/where", Body::from(body))).await;
        assert_eq!(name, "http-test");
    });
}

#[test]
fn a_handler_that_panics_elsewhere_is_answered_as_a_server_failure() {
    let other = elsewhere();
    let handle = other.handle().clone();
    on_http_test_thread(move || async move {
        let handlers = Handlers::new(Some(handle), None);
        let body = Body::from(vec![b' '; INLINE_BODY_BYTES as usize + 1]);
        let (status, text) = answer(&handlers, post_with("/panic", body)).await;
        assert_eq!(status, 424, "TEI's status for a server-side failure");
        assert!(text.contains("handler failed"), "{text}");
        // The runtime is still there for the next request.
        let body = Body::from(vec![b' '; INLINE_BODY_BYTES as usize + 1]);
        assert_eq!(answer(&handlers, post_with("/where", body)).await.0, 200);
    });
}

#[test]
fn a_handler_that_panics_inline_is_answered_as_a_server_failure_too() {
    on_http_test_thread(|| async {
        for handlers in [
            Handlers::default(),
            Handlers::new(Some(Handle::current()), None),
        ] {
            let (status, text) = answer(&handlers, post_with("/panic", Body::empty())).await;
            assert_eq!(status, 424, "{text}");
            assert_eq!(
                answer(&handlers, post_with("/where", Body::empty()))
                    .await
                    .1,
                "http-test"
            );
        }
    });
}

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_handler_elsewhere_is_aborted_when_its_answer_is_no_longer_awaited() {
    let other = elsewhere();
    let handle = other.handle().clone();
    let dropped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Notify::new());
    let (flag, began) = (dropped.clone(), started.clone());
    let app = Router::new().route(
        "/forever",
        post(move || {
            let flag = DropFlag(flag.clone());
            let began = began.clone();
            async move {
                let _flag = flag;
                began.notify_one();
                std::future::pending::<()>().await;
            }
        }),
    );
    on_http_test_thread(move || async move {
        let handlers = Handlers::new(Some(handle), None);
        let body = Body::from(vec![b' '; INLINE_BODY_BYTES as usize + 1]);
        let answer = handlers.respond(app, post_with("/forever", body), false);
        // The client goes away once the handler runs: its future is dropped.
        tokio::select! {
            _ = answer => panic!("a handler that never ends answered"),
            _ = started.notified() => {}
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dropped.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the handler kept running");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How many times `hot` polled in `wait`, on a current-thread runtime, after `setup`.
fn polls_during(hot: Arc<HotPoll>, setup: impl FnOnce(&HotPoll), wait: Duration) -> u64 {
    let polls = Arc::new(AtomicU64::new(0));
    let counted = polls.clone();
    current_thread().block_on(async move {
        tokio::spawn(hot.clone().keep_polling(Some(counted)));
        setup(&hot);
        tokio::time::sleep(wait).await;
    });
    polls.load(Ordering::Relaxed)
}

#[test]
fn the_thread_polls_after_a_request_within_the_window() {
    let hot = Arc::new(HotPoll::new(Duration::from_secs(10), || true));
    let polls = polls_during(hot, HotPoll::request_started, Duration::from_millis(30));
    // Each poll is a zero-timeout check of the sockets: thousands in 30 ms.
    assert!(polls > 100, "{polls} polls");
}

#[test]
fn the_thread_does_not_poll_before_any_request() {
    let hot = Arc::new(HotPoll::new(Duration::from_secs(10), || true));
    assert_eq!(polls_during(hot, |_| {}, Duration::from_millis(30)), 0);
}

#[test]
fn the_thread_stops_polling_when_the_window_closes() {
    let hot = Arc::new(HotPoll::new(Duration::from_millis(20), || true));
    let polls = Arc::new(AtomicU64::new(0));
    let counted = polls.clone();
    let (during, after) = current_thread().block_on(async move {
        tokio::spawn(hot.clone().keep_polling(Some(counted)));
        hot.request_started();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let during = polls.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(60)).await;
        (during, polls.load(Ordering::Relaxed))
    });
    assert!(during > 0);
    assert_eq!(during, after, "polled after the window closed");
}

#[test]
fn the_thread_does_not_poll_while_told_not_to() {
    let allowed = Arc::new(AtomicBool::new(false));
    let check = allowed.clone();
    let hot = Arc::new(HotPoll::new(Duration::from_secs(10), move || {
        check.load(Ordering::Relaxed)
    }));
    let hot2 = hot.clone();
    assert_eq!(
        polls_during(hot, HotPoll::request_started, Duration::from_millis(30)),
        0
    );
    allowed.store(true, Ordering::Relaxed);
    // Within the window it asks again by itself, without another request.
    let polls = polls_during(hot2, |_| {}, Duration::from_millis(30));
    assert!(polls > 0);
}

#[test]
fn run_serves_on_a_thread_of_its_own_and_returns_what_serve_returns() {
    let name = current_thread()
        .block_on(run(None, || async { thread_name() }))
        .unwrap();
    assert_eq!(name, "router-http");
}
