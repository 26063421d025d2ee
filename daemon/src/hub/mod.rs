//! Hugging Face Hub access over plain HTTP (reqwest on a tokio runtime owned here): revision
//! pinning, tree listing, resolve-and-redirect, range reads and streamed bodies, with retries.
//! The sources' reader thread stays a plain thread: it calls [`HubClient::block_on`] and gets
//! bytes; decoding never runs on the runtime.
//!
//! The token (`HF_TOKEN`, else the file at `HF_TOKEN_PATH`, else `$HF_HOME/token`, else
//! `~/.cache/huggingface/token`) is sent only to the endpoint's own origin, never to the host a
//! download redirects to, and never logged.

mod api;
mod download;
mod error;
mod retry;
mod verify;

pub use api::{HubFile, TreeEntry, location};
pub use download::{Download, RangeBytes};
pub use error::{HashMismatch, HubError, is_transient_status};
pub use retry::{RetryPolicy, rate_limit_reset, server_wait};
pub use verify::{ExpectedHash, FileHasher, VERIFY_DOWNLOADS, VerificationLog, Verified};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{ACCEPT_ENCODING, HeaderMap};
use reqwest::{Method, RequestBuilder, Url};
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The environment a Hub source reads, as `pack --help` and `serve --help` show it (read once,
/// in [`HubConfig::from_env`]; docs/settings.md has the whole table).
pub const ENV_HELP: &str = "Hub sources (hf://) read: HF_ENDPOINT (default https://huggingface.co); \
the token from HF_TOKEN, else the file at HF_TOKEN_PATH, else $HF_HOME/token, else \
~/.cache/huggingface/token; DSPREP_HUB_READAHEAD (row groups fetched ahead per open file, \
default 4), DSPREP_HUB_READ_TIMEOUT_MS (30000), DSPREP_HUB_RETRIES (attempts, 8), \
DSPREP_HUB_BACKOFF_MS (1000); DSPREP_SPOOL_DIR (where a file read whole is checked before use; \
default the system's temporary folder).";

/// Everything that decides how (not what) the Hub is read: from the environment, with defaults.
#[derive(Clone)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    token: Option<String>,
    /// Where the token came from (`HF_TOKEN` or a file path), for messages.
    token_source: Option<String>,
    /// `DSPREP_HUB_READ_TIMEOUT_MS`: longest silence while waiting for bytes (default 30 s).
    pub read_timeout: Duration,
    pub connect_timeout: Duration,
    /// Longest whole request for API calls and range reads (bodies streamed whole have only the
    /// read timeout).
    pub request_timeout: Duration,
    /// `DSPREP_HUB_RETRIES` (attempts, default 8) and `DSPREP_HUB_BACKOFF_MS` (default 1000).
    pub retry: RetryPolicy,
    /// `DSPREP_HUB_READAHEAD`: row groups fetched ahead of the decoder per open shard (default 4).
    pub readahead_row_groups: usize,
    /// `DSPREP_SPOOL_DIR`: where a file read whole is kept while its hash is checked, before any
    /// of its bytes is used (default: the system's temporary folder). Up to two files per
    /// source at once; each is deleted when read.
    pub spool_dir: PathBuf,
}

impl std::fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_source", &self.token_source)
            .field("read_timeout", &self.read_timeout)
            .field("retry", &self.retry)
            .field("readahead_row_groups", &self.readahead_row_groups)
            .field("spool_dir", &self.spool_dir)
            .finish()
    }
}

impl HubConfig {
    pub fn from_env() -> Result<HubConfig, HubError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| -> Result<u64, HubError> {
            match var(name) {
                None => Ok(default),
                Some(v) => v.trim().parse().map_err(|_| {
                    HubError::Config(format!("{name} must be a whole number, got {v:?}"))
                }),
            }
        };
        let endpoint = var("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
            .trim()
            .trim_end_matches('/')
            .to_string();
        let (token, token_source) = match var("HF_TOKEN") {
            Some(token) => (Some(token.trim().to_string()), Some("HF_TOKEN".to_string())),
            None => {
                let path = token_path(&var);
                match path.as_ref().map(std::fs::read_to_string) {
                    Some(Ok(text)) if !text.trim().is_empty() => (
                        Some(text.trim().to_string()),
                        path.map(|p| p.display().to_string()),
                    ),
                    _ => (None, None),
                }
            }
        };
        let attempts = number("DSPREP_HUB_RETRIES", 8)?.clamp(1, 100) as u32;
        Ok(HubConfig {
            endpoint,
            token,
            token_source,
            read_timeout: Duration::from_millis(number("DSPREP_HUB_READ_TIMEOUT_MS", 30_000)?),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            retry: RetryPolicy {
                max_attempts: attempts,
                base: Duration::from_millis(number("DSPREP_HUB_BACKOFF_MS", 1000)?),
                max: Duration::from_secs(30),
            },
            readahead_row_groups: number("DSPREP_HUB_READAHEAD", 4)?.clamp(1, 64) as usize,
            spool_dir: var("DSPREP_SPOOL_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir),
        })
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }
}

/// `HF_TOKEN_PATH`, else `$HF_HOME/token`, else `~/.cache/huggingface/token`.
fn token_path(var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(path) = var("HF_TOKEN_PATH") {
        return Some(PathBuf::from(path));
    }
    if let Some(home) = var("HF_HOME") {
        return Some(PathBuf::from(home).join("token"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache/huggingface/token"))
}

/// What IO tasks share: the HTTP client and the configuration. Tasks hold this, never the
/// [`HubClient`], so the runtime is never dropped from inside itself.
pub struct HubInner {
    pub config: HubConfig,
    endpoint: Url,
    http: reqwest::Client,
    /// (repo, revision) → commit sha: every revision is resolved once per process.
    revisions: Mutex<HashMap<(String, String), String>>,
}

/// The Hub client of one process: its runtime and its shared state.
pub struct HubClient {
    runtime: tokio::runtime::Runtime,
    inner: Arc<HubInner>,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl HubClient {
    pub fn from_env() -> Result<HubClient, HubError> {
        HubClient::new(HubConfig::from_env()?)
    }

    pub fn new(config: HubConfig) -> Result<HubClient, HubError> {
        let endpoint = Url::parse(&config.endpoint).map_err(|e| {
            HubError::Config(format!(
                "HF_ENDPOINT {:?} is not a URL: {e}",
                config.endpoint
            ))
        })?;
        // rustls without a provider compiled in: ring, installed once per process (an error
        // means another one is installed already, which is as good).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("dsprep/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none()) // followed by hand: see download.rs
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| HubError::Config(format!("cannot build the HTTP client: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dsprep-hub")
            .enable_all()
            .build()
            .map_err(|e| HubError::Config(format!("cannot start the IO runtime: {e}")))?;
        tracing::debug!(
            "hub client: endpoint {}, token {}",
            config.endpoint,
            match &config.token_source {
                Some(source) => format!("from {source}"),
                None => "none".to_string(),
            }
        );
        Ok(HubClient {
            runtime,
            inner: Arc::new(HubInner {
                config,
                endpoint,
                http,
                revisions: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn inner(&self) -> &Arc<HubInner> {
        &self.inner
    }

    pub fn config(&self) -> &HubConfig {
        &self.inner.config
    }

    /// Each Hub input's `verified` (the manifest's words): what this process's reads of it were
    /// checked against, `not-read` when it never opened it. Local inputs are left as they are.
    pub fn mark_verified(&self, inputs: &mut [dsprep_client::format::InputFile]) {
        for input in inputs.iter_mut() {
            let (Some(repo), Some(commit)) = (&input.repo, &input.commit) else {
                continue;
            };
            let read = VerificationLog::process().get(&location(repo, commit, &input.path));
            input.verified = Some(read.map_or_else(|| "not-read".to_string(), |v| v.describe()));
        }
    }

    /// Run a future to completion from a plain thread. From inside another runtime (a caller
    /// that is itself async) it runs on a scoped helper thread instead of panicking.
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.runtime.block_on(future);
        }
        std::thread::scope(
            |scope| match scope.spawn(|| self.runtime.block_on(future)).join() {
                Ok(output) => output,
                Err(panic) => std::panic::resume_unwind(panic),
            },
        )
    }

    /// The IO runtime's handle, for starting tasks from threads that hold no client.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime.handle().clone()
    }

    /// Start an IO task on the runtime.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.spawn(future)
    }
}

/// Characters kept as they are in one URL path segment; everything else is %-encoded (the Hub
/// clients' `quote(…, safe="")`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One path segment, %-encoded: a revision `refs/convert/parquet` becomes `refs%2Fconvert%2Fparquet`.
pub fn encode_segment(segment: &str) -> String {
    utf8_percent_encode(segment, SEGMENT).to_string()
}

/// A path inside a repo: each segment %-encoded, the slashes kept.
pub fn encode_path(path: &str) -> String {
    path.split('/')
        .map(encode_segment)
        .collect::<Vec<_>>()
        .join("/")
}

/// What a request is about, for the messages of permanent errors.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    pub repo: &'a str,
    pub revision: Option<&'a str>,
    pub path: Option<&'a str>,
}

impl HubInner {
    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// A URL under the endpoint, from already-encoded path text.
    pub fn url(&self, encoded_path: &str) -> Result<Url, HubError> {
        let text = format!("{}/{encoded_path}", self.config.endpoint);
        Url::parse(&text).map_err(|e| HubError::Config(format!("bad URL {text:?}: {e}")))
    }

    /// Whether `url` is on the endpoint's own origin (scheme, host, port): only there does the
    /// token go.
    pub fn is_hub_origin(&self, url: &Url) -> bool {
        url.scheme() == self.endpoint.scheme()
            && url.host_str() == self.endpoint.host_str()
            && url.port_or_known_default() == self.endpoint.port_or_known_default()
    }

    /// A request with `Accept-Encoding: identity` (so ranges are honoured and sizes are real),
    /// and the token only when `url` is the Hub's own origin.
    pub fn request(&self, method: Method, url: &Url) -> RequestBuilder {
        let mut builder = self
            .http
            .request(method, url.clone())
            .header(ACCEPT_ENCODING, "identity");
        if let Some(token) = &self.config.token
            && self.is_hub_origin(url)
        {
            builder = builder.bearer_auth(token); // marked sensitive: never printed by reqwest
        }
        builder
    }

    /// The error for a non-success status: transient ones carry the server's wait; 401/403/404
    /// say which repo and what to do.
    pub fn status_error(
        &self,
        what: &str,
        subject: Subject<'_>,
        status: u16,
        headers: &HeaderMap,
    ) -> HubError {
        if is_transient_status(status) {
            return HubError::Status {
                what: what.to_string(),
                status,
                retry_after: server_wait(headers),
            };
        }
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let code = header("x-error-code");
        let repo = subject.repo;
        let link = format!("{}/datasets/{repo}", self.config.endpoint);
        match (status, code.as_str()) {
            (401, "GatedRepo") | (403, "GatedRepo") if !self.config.has_token() => {
                HubError::Denied(format!(
                    "dataset {repo} is gated (HTTP {status}): accept its terms at {link} and set HF_TOKEN to a token of that account"
                ))
            }
            (401, _) if !self.config.has_token() => HubError::Denied(format!(
                "dataset {repo}: HTTP 401 without a token (it is private, gated or does not exist): if it is gated, accept its terms at {link} and set HF_TOKEN"
            )),
            (401, _) => HubError::Denied(format!(
                "dataset {repo}: HTTP 401 with the token from {}: the token is invalid or its account cannot read this dataset (if it is gated, accept its terms at {link})",
                self.config.token_source.as_deref().unwrap_or("HF_TOKEN")
            )),
            (403, _) => HubError::Denied(format!(
                "dataset {repo}: HTTP 403: the token's account may not read it: accept its terms at {link} with that account, or use a token with read access"
            )),
            (404, "RepoNotFound") => HubError::NotFound(format!(
                "dataset {repo} not found (HTTP 404): check the repo id"
            )),
            (404, "RevisionNotFound") => HubError::NotFound(format!(
                "dataset {repo}: revision {:?} not found (HTTP 404)",
                subject.revision.unwrap_or("")
            )),
            (404, _) => HubError::NotFound(format!(
                "dataset {repo}{}: {} not found (HTTP 404)",
                subject
                    .revision
                    .map(|r| format!("@{r}"))
                    .unwrap_or_default(),
                subject.path.unwrap_or(what)
            )),
            _ => {
                let message = header("x-error-message");
                HubError::Protocol {
                    what: what.to_string(),
                    message: format!(
                        "unexpected HTTP {status}{}",
                        if message.is_empty() {
                            String::new()
                        } else {
                            format!(": {message}")
                        }
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded_exactly() {
        assert_eq!(
            encode_segment("refs/convert/parquet"),
            "refs%2Fconvert%2Fparquet"
        );
        assert_eq!(encode_segment("v1.4.0"), "v1.4.0");
        assert_eq!(
            encode_path("data/zyda_crossdeduped-filtered /zyda_c4-en/x~1.parquet"),
            "data/zyda_crossdeduped-filtered%20/zyda_c4-en/x~1.parquet"
        );
        assert_eq!(encode_path("a+b/c#d?.parquet"), "a%2Bb/c%23d%3F.parquet");
    }
}
