//! Image URLs: fetched over HTTP(S) only from the hosts `--allowed-image-hosts` lists (none by
//! default), within `--image-fetch-timeout` and `--max-image-bytes`. Redirects are followed
//! only to allowed hosts; no cookies are kept, no credentials sent, no proxy taken from the
//! environment: the server reaches nothing but the hosts its operator named.

use super::source::ImageError;
use reqwest::redirect::{Attempt, Policy};
use reqwest::Url;
use std::sync::Arc;
use std::time::Duration;

/// Default `--image-fetch-timeout`, in seconds: connection, headers and body together.
pub const DEFAULT_IMAGE_FETCH_TIMEOUT_SECS: u64 = 10;
/// Redirects followed before a fetch is refused: a CDN takes one or two.
const MAX_REDIRECTS: usize = 5;

/// The hosts image URLs may name: exact names, and `*.example.com` for any subdomain of
/// `example.com` (not `example.com` itself: list it too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    exact: Vec<String>,
    /// `.example.com` for `*.example.com`.
    suffixes: Vec<String>,
}

/// A host name as DNS compares it: lower case, no trailing dot.
fn normalized(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Checks one `--allowed-image-hosts` entry: a host name (or IP address), or `*.` and one.
pub fn parse_host_pattern(entry: &str) -> Result<String, String> {
    let entry = entry.trim();
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    let bracketed_ipv6 = name.starts_with('[') && name.ends_with(']');
    let bad = name.is_empty()
        || name.contains(['/', '@', '*', '?', '#'])
        || name.chars().any(char::is_whitespace)
        || (name.contains(':') && !bracketed_ipv6);
    if bad {
        return Err(format!(
            "`{entry}` is not a host name: list names like `images.example.com` or \
             `*.example.com`, without scheme, port or path"
        ));
    }
    Ok(normalized(entry))
}

impl AllowedHosts {
    /// The hosts of `entries`, each checked by [`parse_host_pattern`]; empty ones are skipped
    /// (an empty `ALLOWED_IMAGE_HOSTS` allows none).
    pub fn new(entries: &[String]) -> Result<Self, String> {
        let mut hosts = Self::default();
        for entry in entries.iter().filter(|e| !e.trim().is_empty()) {
            let pattern = parse_host_pattern(entry)?;
            match pattern.strip_prefix('*') {
                Some(suffix) => hosts.suffixes.push(suffix.to_string()),
                None => hosts.exact.push(pattern),
            }
        }
        Ok(hosts)
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.suffixes.is_empty()
    }

    pub fn allows(&self, host: &str) -> bool {
        let host = normalized(host);
        self.exact.contains(&host)
            || self
                .suffixes
                .iter()
                .any(|suffix| host.len() > suffix.len() && host.ends_with(suffix.as_str()))
    }

    /// `url` if it may be fetched: http or https, no credentials, an allowed host.
    fn check(&self, url: &Url) -> Result<(), ImageError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ImageError::BadUrl(format!(
                "only http and https URLs are fetched, not `{}`",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ImageError::BadUrl(
                "a URL with credentials (`user:password@`) is not fetched".into(),
            ));
        }
        let host = url.host_str().unwrap_or_default();
        if !self.allows(host) {
            return Err(ImageError::HostNotAllowed(host.to_string()));
        }
        Ok(())
    }
}

/// Why the image fetcher could not be built (TLS setup), at startup.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up fetching image URLs: {0}")]
pub struct FetcherSetupError(String);

/// Fetches image URLs from the allowed hosts; one client (connection pool) per model.
#[derive(Clone, Default)]
pub struct ImageFetcher {
    hosts: Arc<AllowedHosts>,
    /// None while no host is allowed: nothing is ever fetched.
    client: Option<reqwest::Client>,
    timeout: Duration,
}

/// TLS with webpki's roots (Mozilla's), through ring: the same on every machine.
fn tls_config() -> Result<rustls::ClientConfig, FetcherSetupError> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| FetcherSetupError(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(config)
}

/// Follows a redirect only to an allowed host, at most [`MAX_REDIRECTS`] times.
fn redirect_policy(hosts: Arc<AllowedHosts>) -> Policy {
    Policy::custom(move |attempt: Attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        match hosts.check(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(refused) => attempt.error(format!("a redirect was refused: {refused}")),
        }
    })
}

/// The innermost message of `error`'s chain worth showing: reqwest's own says only
/// "error sending request".
fn described(error: &reqwest::Error, timeout: Duration) -> String {
    if error.is_timeout() {
        return format!(
            "no complete answer within --image-fetch-timeout ({} s)",
            timeout.as_secs_f64()
        );
    }
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message = format!("{message}: {cause}");
        source = cause.source();
    }
    message
}

impl ImageFetcher {
    /// A fetcher for `hosts`; with none, one that refuses every URL.
    pub fn new(hosts: AllowedHosts, timeout: Duration) -> Result<Self, FetcherSetupError> {
        let hosts = Arc::new(hosts);
        let client = if hosts.is_empty() {
            None
        } else {
            crate::tls::install_crypto_provider();
            let client = reqwest::Client::builder()
                .tls_backend_preconfigured(tls_config()?)
                .redirect(redirect_policy(hosts.clone()))
                .timeout(timeout)
                .no_proxy()
                .build()
                .map_err(|e| FetcherSetupError(e.to_string()))?;
            Some(client)
        };
        Ok(Self {
            hosts,
            client,
            timeout,
        })
    }

    /// The bytes at `url`, at most `max_bytes` of them: refused from a host not allowed,
    /// a status other than 2xx, past the timeout, or past `max_bytes` (from Content-Length
    /// when the server sends one, else as the body streams in).
    pub async fn fetch(&self, url: &str, max_bytes: usize) -> Result<Vec<u8>, ImageError> {
        let Some(client) = &self.client else {
            return Err(ImageError::Url);
        };
        let parsed = Url::parse(url).map_err(|e| ImageError::BadUrl(e.to_string()))?;
        self.hosts.check(&parsed)?;
        let fetch_error = |e: reqwest::Error| ImageError::Fetch(described(&e, self.timeout));
        let mut response = client.get(parsed).send().await.map_err(fetch_error)?;
        let status = response.status();
        if !status.is_success() {
            return Err(ImageError::Fetch(format!("the server answered {status}")));
        }
        let too_many = |given: usize| ImageError::TooManyBytes {
            given,
            max: max_bytes,
        };
        if let Some(length) = response.content_length() {
            let length = usize::try_from(length).unwrap_or(usize::MAX);
            if length > max_bytes {
                return Err(too_many(length));
            }
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(fetch_error)? {
            if bytes.len() + chunk.len() > max_bytes {
                return Err(too_many(bytes.len() + chunk.len()));
            }
            bytes.extend_from_slice(&chunk);
        }
        if bytes.is_empty() {
            return Err(ImageError::Empty);
        }
        Ok(bytes)
    }
}
