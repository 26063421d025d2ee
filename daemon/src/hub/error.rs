//! Errors of Hub and blob requests: transient ones (retried with backoff) and permanent ones,
//! whose messages say which repo or file and what to do. No message ever holds a token or a
//! presigned URL.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The configuration (endpoint, token file) is unusable.
    #[error("hub configuration: {0}")]
    Config(String),
    /// An HTTP status that may pass: 408, 429, 5xx.
    #[error("{what}: HTTP {status}")]
    Status {
        what: String,
        status: u16,
        /// From `Retry-After` or the `RateLimit` header's `t=`.
        retry_after: Option<Duration>,
    },
    /// Connect errors, resets, timeouts.
    #[error("{what}: {message}")]
    Network { what: String, message: String },
    /// The body ended before its announced length.
    #[error("{what}: the body ended after {got} of {want} bytes")]
    Truncated { what: String, got: u64, want: u64 },
    /// A 200 (the whole file) to a ranged request: never used as data.
    #[error("{what}: the server ignored the Range header (HTTP 200 to a ranged request)")]
    RangeIgnored { what: String },
    /// A 403 from the download host: its presigned URL expired; resolved again and retried.
    #[error("{what}: the download URL was refused (HTTP 403; expired?)")]
    Expired { what: String },
    /// 401/403/gated: permanent, with what to do.
    #[error("{0}")]
    Denied(String),
    /// 404 and friends: permanent.
    #[error("{0}")]
    NotFound(String),
    /// A response that is not what the Hub API documents (bad JSON, bad Content-Range, …).
    #[error("{what}: {message}")]
    Protocol { what: String, message: String },
    /// The spool folder (`DSPREP_SPOOL_DIR`) cannot take a file: missing, not writable, full.
    #[error("{0}")]
    Spool(String),
    /// A file's bytes did not hash to what the Hub says, on every download tried.
    #[error("{0}")]
    Corrupt(Box<HashMismatch>),
    /// A transient error that lasted through every retry.
    #[error("{last} (gave up after {attempts} attempts)")]
    GaveUp { attempts: u32, last: Box<HubError> },
}

impl HubError {
    /// Whether retrying the same request may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            HubError::Status { status, .. } => is_transient_status(*status),
            HubError::Network { .. }
            | HubError::Truncated { .. }
            | HubError::RangeIgnored { .. }
            | HubError::Expired { .. } => true,
            HubError::Config(_)
            | HubError::Denied(_)
            | HubError::NotFound(_)
            | HubError::Protocol { .. }
            | HubError::Spool(_)
            | HubError::Corrupt(_)
            | HubError::GaveUp { .. } => false,
        }
    }

    /// How long the server asked us to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            HubError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    pub(crate) fn network(what: &str, error: reqwest::Error) -> HubError {
        // reqwest's Display names the URL; ours names the repo and file instead (a download URL
        // is presigned: it is a credential of sorts and stays out of messages).
        let error = error.without_url();
        let kind = if error.is_timeout() {
            "timed out"
        } else if error.is_connect() {
            "cannot connect"
        } else if error.is_body() || error.is_decode() {
            "the body was cut"
        } else {
            "request failed"
        };
        let mut message = format!("{kind}: {error}");
        let mut source = std::error::Error::source(&error);
        while let Some(inner) = source {
            message.push_str(&format!(": {inner}"));
            source = inner.source();
        }
        HubError::Network {
            what: what.to_string(),
            message,
        }
    }
}

/// 408, 429 and 5xx are worth retrying; other statuses are answers.
pub fn is_transient_status(status: u16) -> bool {
    status == 408 || status == 429 || (500..=599).contains(&status)
}

/// A whole file whose bytes never hashed to what the Hub says (boxed: errors stay small).
#[derive(Debug, thiserror::Error)]
#[error(
    "{what}: the bytes downloaded do not match the Hub's {kind} ({attempts} downloads): expected \
     {expected}, got {got}; nothing of the file was used. A proxy or cache between here and the \
     Hub may be changing bytes"
)]
pub struct HashMismatch {
    pub what: String,
    pub kind: &'static str,
    pub expected: String,
    pub got: String,
    pub attempts: u32,
}
