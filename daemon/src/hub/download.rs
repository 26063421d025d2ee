//! Reading one Hub file: resolve it once (`HEAD …/resolve/{sha}/{path}`, redirect not
//! followed), then read the redirect's target, without the token, for every range of the file.
//! A 403 from that host means the presigned URL expired: resolve again and retry. Every range is
//! delivered whole (length and `Content-Range` checked) or fetched again; a streamed body that is
//! cut resumes at the exact byte it stopped at, so nothing is lost or duplicated.

use super::{HubError, HubFile, HubInner};
use bytes::{Bytes, BytesMut};
use reqwest::header::{CONTENT_RANGE, HeaderMap, LOCATION, RANGE};
use reqwest::{Method, Url};
use std::ops::Range;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc};

/// Redirects followed on the Hub's own origin (repo renames) before giving up.
const MAX_HUB_REDIRECTS: usize = 5;

/// Bytes of one range, with its first offset in the file.
#[derive(Clone, Debug)]
pub struct RangeBytes {
    pub start: u64,
    pub bytes: Bytes,
}

/// Where the bytes of a file are read from, once resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    url: Url,
    /// Off the Hub's origin: a presigned download URL (403 = expired).
    external: bool,
}

/// One file being read; cheap to share between the tasks that read its ranges.
pub struct Download {
    hub: Arc<HubInner>,
    file: Arc<HubFile>,
    target: Mutex<Option<Target>>,
}

impl Download {
    pub fn new(hub: Arc<HubInner>, file: Arc<HubFile>) -> Download {
        Download {
            hub,
            file,
            target: Mutex::new(None),
        }
    }

    pub fn file(&self) -> &HubFile {
        &self.file
    }

    /// Note what this file's bytes were checked against (the manifest's `verified` field).
    pub fn record(&self, verified: super::Verified) {
        super::VerificationLog::process().record(&self.file.location(), verified);
    }

    /// How the Hub is read (the spool folder, read-ahead, retries).
    pub fn config(&self) -> &super::HubConfig {
        &self.hub.config
    }

    fn what(&self) -> String {
        self.file.location()
    }

    /// The download target, resolved on first use (one resolve request per file).
    async fn target(&self) -> Result<Target, HubError> {
        let mut guard = self.target.lock().await;
        if let Some(target) = guard.as_ref() {
            return Ok(target.clone());
        }
        let target = self.resolve().await?;
        *guard = Some(target.clone());
        Ok(target)
    }

    /// Forget `stale` (a refused download URL) so the next read resolves again.
    async fn forget(&self, stale: &Target) {
        let mut guard = self.target.lock().await;
        if guard.as_ref() == Some(stale) {
            *guard = None;
        }
    }

    async fn resolve(&self) -> Result<Target, HubError> {
        let what = format!("resolving {}", self.what());
        let start = self.file.resolve_url(&self.hub)?;
        let hub = &self.hub;
        let timeout = hub.config.request_timeout;
        hub.config
            .retry
            .run(&what, |_| {
                let mut url = start.clone();
                let what = &what;
                async move {
                    for _ in 0..=MAX_HUB_REDIRECTS {
                        let response = hub
                            .request(Method::HEAD, &url)
                            .timeout(timeout)
                            .send()
                            .await
                            .map_err(|e| HubError::network(what, e))?;
                        let status = response.status();
                        if status.is_success() {
                            // Served by the Hub itself (a small file kept in git).
                            return Ok(Target {
                                url,
                                external: false,
                            });
                        }
                        if !status.is_redirection() {
                            return Err(hub.status_error(
                                what,
                                self.file.subject(),
                                status.as_u16(),
                                response.headers(),
                            ));
                        }
                        let location = response
                            .headers()
                            .get(LOCATION)
                            .and_then(|v| v.to_str().ok())
                            .ok_or_else(|| HubError::Protocol {
                                what: what.clone(),
                                message: format!("HTTP {status} without a Location"),
                            })?;
                        let next = url.join(location).map_err(|e| HubError::Protocol {
                            what: what.clone(),
                            message: format!("bad redirect target: {e}"),
                        })?;
                        if !hub.is_hub_origin(&next) {
                            tracing::debug!("{what}: redirected off the hub");
                            return Ok(Target {
                                url: next,
                                external: true,
                            });
                        }
                        url = next;
                    }
                    Err(HubError::Protocol {
                        what: what.clone(),
                        message: format!("more than {MAX_HUB_REDIRECTS} redirects"),
                    })
                }
            })
            .await
    }

    /// Bytes `range` of the file, whole, with retries (re-resolving an expired download URL).
    pub async fn range(&self, range: Range<u64>) -> Result<Bytes, HubError> {
        let what = format!("{} bytes {}..{}", self.what(), range.start, range.end);
        if range.start >= range.end {
            return Ok(Bytes::new());
        }
        self.hub
            .config
            .retry
            .run(&what, |_| {
                let range = range.clone();
                let what = &what;
                async move {
                    let target = self.target().await?;
                    let result = self.try_range(&target, range, what).await;
                    if let Err(HubError::Expired { .. }) = &result {
                        self.forget(&target).await;
                    }
                    result
                }
            })
            .await
    }

    /// Why a GET for part of the file did not give that part: a 200 is the whole file (the
    /// server ignored the range), a 403 from the storage URL is its signature expired, anything
    /// else is the Hub's status error.
    fn not_a_range(
        &self,
        target: &Target,
        what: &str,
        status: u16,
        headers: &HeaderMap,
    ) -> HubError {
        match status {
            200 => HubError::RangeIgnored { what: what.into() },
            403 if target.external => HubError::Expired { what: what.into() },
            _ => self
                .hub
                .status_error(what, self.file.subject(), status, headers),
        }
    }

    async fn try_range(
        &self,
        target: &Target,
        range: Range<u64>,
        what: &str,
    ) -> Result<Bytes, HubError> {
        let want = range.end - range.start;
        let mut response = self
            .hub
            .request(Method::GET, &target.url)
            .header(RANGE, format!("bytes={}-{}", range.start, range.end - 1))
            .timeout(self.hub.config.request_timeout)
            .send()
            .await
            .map_err(|e| HubError::network(what, e))?;
        let status = response.status().as_u16();
        if status != 206 {
            return Err(self.not_a_range(target, what, status, response.headers()));
        }
        let content_range = response
            .headers()
            .get(CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if content_range_start(content_range) != Some(range.start) {
            return Err(HubError::Protocol {
                what: what.into(),
                message: format!("answered Content-Range {content_range:?}"),
            });
        }
        let mut body = BytesMut::with_capacity(want as usize);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| HubError::network(what, e))?
        {
            body.extend_from_slice(&chunk);
            if body.len() as u64 > want {
                return Err(HubError::Protocol {
                    what: what.into(),
                    message: format!("sent more than the {want} bytes asked for"),
                });
            }
        }
        if (body.len() as u64) < want {
            return Err(HubError::Truncated {
                what: what.into(),
                got: body.len() as u64,
                want,
            });
        }
        Ok(body.freeze())
    }

    /// Stream the whole file into `chunks` (a bounded channel: the reader's pace sets ours). A
    /// cut body resumes with `Range: bytes={received}-`. Ends when the file is complete, on a
    /// permanent error (sent as the last item), or when the receiver is gone.
    pub async fn stream_into(self: Arc<Self>, chunks: mpsc::Sender<Result<Bytes, HubError>>) {
        let size = self.file.size;
        let mut received = 0u64;
        let mut failures = 0u32;
        let policy = self.hub.config.retry;
        loop {
            let before = received;
            let what = format!("{} from byte {received}", self.what());
            let outcome = match self.target().await {
                Ok(target) => {
                    let result = self.pump(&target, &what, &chunks, &mut received).await;
                    if let Err(HubError::Expired { .. }) = &result {
                        self.forget(&target).await;
                    }
                    result
                }
                Err(e) => Err(e),
            };
            let error = match outcome {
                Ok(false) => return, // the reader is gone
                Ok(true) if received == size => return,
                Ok(true) => HubError::Truncated {
                    what,
                    got: received,
                    want: size,
                },
                Err(error) => error,
            };
            if received > before {
                failures = 0; // progress: a long download may be cut many times
            }
            if !self
                .retry_or_fail(&policy, &mut failures, error, &chunks)
                .await
            {
                return;
            }
        }
    }

    /// Back off before the next attempt; false (after sending the error) when it is permanent or
    /// retries are spent.
    async fn retry_or_fail(
        &self,
        policy: &super::RetryPolicy,
        failures: &mut u32,
        error: HubError,
        chunks: &mpsc::Sender<Result<Bytes, HubError>>,
    ) -> bool {
        *failures += 1;
        if !error.is_transient() || *failures >= policy.max_attempts {
            let error = if error.is_transient() {
                HubError::GaveUp {
                    attempts: *failures,
                    last: Box::new(error),
                }
            } else {
                error
            };
            let _ = chunks.send(Err(error)).await;
            return false;
        }
        let wait = policy.delay(*failures, &error);
        tracing::debug!("{error}; resuming in {wait:?}");
        tokio::time::sleep(wait).await;
        true
    }

    /// One GET from `from`; forwards every chunk. Ok(true) when the body ended, Ok(false) when
    /// the receiver hung up.
    async fn pump(
        &self,
        target: &Target,
        what: &str,
        chunks: &mpsc::Sender<Result<Bytes, HubError>>,
        received: &mut u64,
    ) -> Result<bool, HubError> {
        let from = *received;
        let mut request = self.hub.request(Method::GET, &target.url);
        if from > 0 {
            request = request.header(RANGE, format!("bytes={from}-"));
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| HubError::network(what, e))?;
        let status = response.status().as_u16();
        match (status, from) {
            (200, 0) => {}
            (206, _) => {
                let content_range = response
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if content_range_start(content_range) != Some(from) {
                    return Err(HubError::Protocol {
                        what: what.into(),
                        message: format!("answered Content-Range {content_range:?}"),
                    });
                }
            }
            _ => return Err(self.not_a_range(target, what, status, response.headers())),
        }
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let end = *received + chunk.len() as u64;
                    if end > self.file.size {
                        return Err(HubError::Protocol {
                            what: what.into(),
                            message: format!("longer than the listed {} bytes", self.file.size),
                        });
                    }
                    *received = end;
                    if chunks.send(Ok(chunk)).await.is_err() {
                        return Ok(false);
                    }
                }
                Ok(None) => return Ok(true),
                Err(e) => return Err(HubError::network(what, e)),
            }
        }
    }
}

/// `bytes 100-199/1000` → 100.
fn content_range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes ")?;
    range.split(['-', '/']).next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::content_range_start;

    #[test]
    fn content_range_start_is_read() {
        assert_eq!(content_range_start("bytes 100-199/1000"), Some(100));
        assert_eq!(content_range_start("bytes 0-0/*"), Some(0));
        assert_eq!(content_range_start("bytes */1000"), None);
        assert_eq!(content_range_start(""), None);
    }
}
