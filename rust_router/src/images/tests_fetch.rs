//! The image fetcher against a local server: allowed hosts, redirects, size and time limits.

use super::*;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\nnot really the rest of a png";
const MAX_BYTES: usize = 1000;
const TIMEOUT: Duration = Duration::from_secs(1);

fn streamed(chunks: Vec<Vec<u8>>, pause: Duration) -> Response {
    let stream = futures_util::stream::unfold(
        (chunks.into_iter(), true),
        move |(mut chunks, first)| async move {
            if !first {
                tokio::time::sleep(pause).await;
            }
            let chunk = chunks.next()?;
            Some((Ok::<_, std::io::Error>(chunk), (chunks, false)))
        },
    );
    Body::from_stream(stream).into_response()
}

/// Serves on 127.0.0.1; `localhost`, the same server, is the host tests leave unlisted.
async fn image_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/cat.png", get(|| async { PNG }))
        .route(
            "/to-allowed",
            get(move || async move { Redirect::temporary(&format!("http://{addr}/cat.png")) }),
        )
        .route(
            "/to-refused",
            get(move || async move {
                Redirect::temporary(&format!("http://localhost:{}/cat.png", addr.port()))
            }),
        )
        .route("/loop", get(|| async { Redirect::temporary("/loop") }))
        .route(
            "/big-declared",
            get(|| async { ([(header::CONTENT_TYPE, "image/png")], vec![0u8; 5000]) }),
        )
        .route(
            "/big-streamed",
            get(|| async { streamed(vec![vec![0u8; 600]; 4], Duration::ZERO) }),
        )
        .route(
            "/slow-headers",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                PNG
            }),
        )
        .route(
            "/slow-body",
            get(|| async { streamed(vec![PNG.to_vec(), PNG.to_vec()], Duration::from_secs(5)) }),
        )
        .route("/empty", get(|| async { "" }))
        .route("/gone", get(|| async { StatusCode::NOT_FOUND }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn fetcher(hosts: &[&str]) -> ImageFetcher {
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    ImageFetcher::new(AllowedHosts::new(&hosts).unwrap(), TIMEOUT).unwrap()
}

#[tokio::test]
async fn an_allowed_host_gives_the_bytes_and_redirects_stay_on_allowed_hosts() {
    let addr = image_server().await;
    let fetcher = fetcher(&["127.0.0.1"]);
    let url = format!("http://{addr}/cat.png");
    assert_eq!(fetcher.fetch(&url, MAX_BYTES).await.unwrap(), PNG);
    let redirected = format!("http://{addr}/to-allowed");
    assert_eq!(fetcher.fetch(&redirected, MAX_BYTES).await.unwrap(), PNG);

    let refused = fetcher
        .fetch(&format!("http://{addr}/to-refused"), MAX_BYTES)
        .await
        .unwrap_err();
    let ImageError::Fetch(message) = refused else {
        panic!("{refused:?}")
    };
    assert!(
        message.contains("`localhost` is not listed by --allowed-image-hosts"),
        "{message}"
    );
    let looped = fetcher
        .fetch(&format!("http://{addr}/loop"), MAX_BYTES)
        .await
        .unwrap_err();
    assert!(
        looped.to_string().contains("more than 5 redirects"),
        "{looped}"
    );
}

#[tokio::test]
async fn unlisted_hosts_other_schemes_and_credentials_are_refused_before_any_request() {
    let addr = image_server().await;
    let fetcher = fetcher(&["127.0.0.1"]);
    let unlisted = format!("http://localhost:{}/cat.png", addr.port());
    assert_eq!(
        fetcher.fetch(&unlisted, MAX_BYTES).await,
        Err(ImageError::HostNotAllowed("localhost".into()))
    );
    let with_credentials = format!("http://user:secret@{addr}/cat.png");
    let refused = fetcher
        .fetch(&with_credentials, MAX_BYTES)
        .await
        .unwrap_err();
    assert!(matches!(refused, ImageError::BadUrl(ref m) if m.contains("credentials")));
    for other in ["file:///etc/passwd", "ftp://127.0.0.1/cat.png"] {
        let refused = fetcher.fetch(other, MAX_BYTES).await.unwrap_err();
        assert!(
            matches!(refused, ImageError::BadUrl(ref m) if m.contains("only http and https")),
            "{other}: {refused:?}"
        );
    }
    // With no host listed, nothing is fetched, and the error names the flag.
    let none = ImageFetcher::default();
    let refused = none
        .fetch(&format!("http://{addr}/cat.png"), MAX_BYTES)
        .await;
    assert_eq!(refused, Err(ImageError::Url));
    assert!(ImageError::Url
        .to_string()
        .contains("--allowed-image-hosts"));
}

#[tokio::test]
async fn bodies_past_max_bytes_are_refused_with_or_without_content_length() {
    let addr = image_server().await;
    let fetcher = fetcher(&["127.0.0.1"]);
    let declared = fetcher
        .fetch(&format!("http://{addr}/big-declared"), MAX_BYTES)
        .await;
    assert_eq!(
        declared,
        Err(ImageError::TooManyBytes {
            given: 5000,
            max: MAX_BYTES
        })
    );
    let streamed = fetcher
        .fetch(&format!("http://{addr}/big-streamed"), MAX_BYTES)
        .await;
    assert_eq!(
        streamed,
        Err(ImageError::TooManyBytes {
            given: 1200,
            max: MAX_BYTES
        })
    );
    let empty = fetcher
        .fetch(&format!("http://{addr}/empty"), MAX_BYTES)
        .await;
    assert_eq!(empty, Err(ImageError::Empty));
}

#[tokio::test]
async fn slow_servers_time_out_and_error_statuses_are_refused() {
    let addr = image_server().await;
    let fetcher = fetcher(&["127.0.0.1"]);
    for path in ["slow-headers", "slow-body"] {
        let started = Instant::now();
        let refused = fetcher
            .fetch(&format!("http://{addr}/{path}"), MAX_BYTES)
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("--image-fetch-timeout (1 s)"),
            "{path}: {refused}"
        );
        assert!(started.elapsed() < Duration::from_secs(4), "{path}");
    }
    let gone = fetcher
        .fetch(&format!("http://{addr}/gone"), MAX_BYTES)
        .await;
    assert_eq!(
        gone,
        Err(ImageError::Fetch(
            "the server answered 404 Not Found".into()
        ))
    );
    let closed = closed_port().await;
    let refused = fetcher
        .fetch(&format!("http://127.0.0.1:{closed}/cat.png"), MAX_BYTES)
        .await
        .unwrap_err();
    assert!(matches!(refused, ImageError::Fetch(_)), "{refused:?}");
}

/// A port nothing listens on: bound, then let go.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn wildcards_allow_subdomains_only() {
    let hosts =
        AllowedHosts::new(&["*.example.com".into(), "images.test".into(), "".into()]).unwrap();
    for allowed in [
        "a.example.com",
        "b.a.example.com",
        "A.Example.COM.",
        "images.test",
    ] {
        assert!(hosts.allows(allowed), "{allowed}");
    }
    for refused in ["example.com", "badexample.com", "example.com.evil", "test"] {
        assert!(!hosts.allows(refused), "{refused}");
    }
    assert!(AllowedHosts::new(&["".into()]).unwrap().is_empty());
}

#[test]
fn host_patterns_without_scheme_port_or_path_are_the_only_ones_taken() {
    for bad in [
        "http://example.com",
        "example.com:80",
        "example.com/x",
        "a*.com",
        "*",
        "",
    ] {
        assert!(parse_host_pattern(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_host_pattern(" Images.Test ").unwrap(), "images.test");
    assert_eq!(parse_host_pattern("[::1]").unwrap(), "[::1]");
}

#[test]
fn urls_of_any_scheme_are_told_from_base64_and_data_urls() {
    assert_eq!(
        image_url(" https://a.test/x.png "),
        Some("https://a.test/x.png")
    );
    assert_eq!(
        image_url("HTTP://a.test/x.png"),
        Some("HTTP://a.test/x.png")
    );
    assert_eq!(image_url("file:///etc/passwd"), Some("file:///etc/passwd"));
    assert_eq!(image_url("data:image/png;base64,iVBORw0KGgo="), None);
    assert_eq!(image_url("iVBORw0KGgo="), None);
}
