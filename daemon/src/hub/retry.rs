//! Retrying transient failures: exponential backoff with full jitter, capped, unless the server
//! said how long to wait (`Retry-After`, or the reset `t=` of an exhausted `RateLimit` bucket).
//! Jitter never affects bytes: every retried request asks for exactly the same bytes again.

use super::HubError;
use reqwest::header::HeaderMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest wait accepted from a server header; longer asks are clamped.
const MAX_SERVER_WAIT: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles after each failure.
    pub base: Duration,
    /// Largest backoff between two attempts.
    pub max: Duration,
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1` (1-based `attempt` just failed): full jitter over
    /// `[0, min(max, base · 2^(attempt-1))]`, or what the server asked for.
    pub fn delay(&self, attempt: u32, error: &HubError) -> Duration {
        if let Some(wait) = error.retry_after() {
            return wait.min(MAX_SERVER_WAIT);
        }
        let exp = self
            .base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(self.max);
        exp.mul_f64(jitter_unit())
    }

    /// Run `op` until it succeeds, fails permanently, or `max_attempts` transient failures have
    /// passed. `op` gets the 1-based attempt number.
    pub async fn run<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, HubError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, HubError>>,
    {
        let mut attempt = 1;
        loop {
            match op(attempt).await {
                Ok(value) => return Ok(value),
                Err(error) if error.is_transient() && attempt < self.max_attempts => {
                    let wait = self.delay(attempt, &error);
                    tracing::debug!(
                        "{what}: attempt {attempt}/{} failed ({error}); retrying in {wait:?}",
                        self.max_attempts
                    );
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(error) if error.is_transient() => {
                    return Err(HubError::GaveUp {
                        attempts: attempt,
                        last: Box::new(error),
                    });
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// The server's requested wait: `Retry-After` (seconds, or an HTTP date), else the reset time of
/// a `RateLimit` header whose remaining count is 0 (`"api";r=0;t=55` → 55 s).
pub fn server_wait(headers: &HeaderMap) -> Option<Duration> {
    if let Some(value) = headers.get("retry-after").and_then(|v| v.to_str().ok()) {
        let value = value.trim();
        if let Ok(seconds) = value.parse::<u64>() {
            return Some(Duration::from_secs(seconds));
        }
        if let Ok(when) = httpdate_parse(value) {
            return Some(when.duration_since(SystemTime::now()).unwrap_or_default());
        }
    }
    let value = headers.get("ratelimit")?.to_str().ok()?;
    rate_limit_reset(value)
}

/// `"api";r=0;t=55` → `Some(55 s)`; a bucket with requests left (`r>0`) asks for no wait.
pub fn rate_limit_reset(value: &str) -> Option<Duration> {
    let mut remaining = None;
    let mut reset = None;
    for param in value.split(';').map(str::trim) {
        if let Some(r) = param.strip_prefix("r=") {
            remaining = r.trim().parse::<u64>().ok();
        } else if let Some(t) = param.strip_prefix("t=") {
            reset = t.trim().parse::<u64>().ok();
        }
    }
    match (remaining, reset) {
        (Some(0), Some(t)) => Some(Duration::from_secs(t)),
        _ => None,
    }
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the only form servers send today.
fn httpdate_parse(text: &str) -> Result<SystemTime, ()> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return Err(());
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month).ok_or(())? as i64 + 1;
    let day: i64 = day.parse().map_err(|_| ())?;
    let year: i64 = year.parse().map_err(|_| ())?;
    let hms: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().map_err(|_| ()))
        .collect::<Result<_, _>>()?;
    let [h, m, s] = hms.as_slice() else {
        return Err(());
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    u64::try_from(secs)
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
        .map_err(|_| ())
}

/// A number in [0, 1) from a process-wide SplitMix64 stream seeded by the clock: jitter only
/// spreads retries out, it never decides bytes.
fn jitter_unit() -> f64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = STATE
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(seed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn server_waits_come_from_retry_after_or_an_exhausted_rate_limit() {
        let mut headers = HeaderMap::new();
        headers.insert("ratelimit", HeaderValue::from_static("\"api\";r=0;t=55"));
        assert_eq!(server_wait(&headers), Some(Duration::from_secs(55)));
        headers.insert("ratelimit", HeaderValue::from_static("\"api\";r=12;t=55"));
        assert_eq!(server_wait(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(server_wait(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            "retry-after",
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(server_wait(&headers), Some(Duration::ZERO), "a past date");
        assert_eq!(
            httpdate_parse("Sun, 06 Nov 1994 08:49:37 GMT"),
            Ok(UNIX_EPOCH + Duration::from_secs(784_111_777))
        );
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let policy = RetryPolicy {
            max_attempts: 8,
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let error = HubError::Status {
            what: "x".into(),
            status: 500,
            retry_after: None,
        };
        for attempt in 1..10 {
            let cap = Duration::from_millis(100 * (1 << (attempt - 1))).min(Duration::from_secs(1));
            assert!(policy.delay(attempt, &error) <= cap);
        }
        let told = HubError::Status {
            what: "x".into(),
            status: 429,
            retry_after: Some(Duration::from_secs(2)),
        };
        assert_eq!(policy.delay(1, &told), Duration::from_secs(2));
    }
}
