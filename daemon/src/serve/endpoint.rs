//! Endpoint checks before binding: `ipc://` by default, `tcp://` on request. A socket file left by
//! a dead daemon is removed; one a live daemon answers on is an error (ZeroMQ would silently take
//! it over). Binding a non-loopback TCP address is an explicit choice, logged loudly.

use anyhow::bail;
use std::net::IpAddr;
use std::path::Path;

pub fn prepare(endpoint: &str) -> anyhow::Result<()> {
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        let path = Path::new(path);
        if path.exists() {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => bail!("endpoint {endpoint} is already in use by another process"),
                Err(_) => {
                    tracing::warn!(path = %path.display(), "removing a stale socket file left by an earlier daemon");
                    std::fs::remove_file(path).map_err(|e| {
                        anyhow::anyhow!("cannot remove the stale socket {}: {e}", path.display())
                    })?;
                }
            }
        }
        return Ok(());
    }
    if let Some(address) = endpoint.strip_prefix("tcp://") {
        let host = address
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or(address)
            .trim_matches(['[', ']']);
        let loopback =
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            tracing::warn!(
                endpoint,
                "BINDING A NON-LOOPBACK ADDRESS: any host that can reach {host} can read the token stream; \
                 bind 127.0.0.1 or an ipc:// path unless trainers on other hosts need it"
            );
        }
        return Ok(());
    }
    bail!("endpoint {endpoint:?} must start with ipc:// or tcp://")
}

/// A clear message for a failed bind.
pub fn bind_error(endpoint: &str, error: zmq::Error) -> anyhow::Error {
    match error {
        zmq::Error::EADDRINUSE => anyhow::anyhow!("endpoint {endpoint} is already in use"),
        other => anyhow::anyhow!("cannot bind {endpoint}: {other}"),
    }
}
