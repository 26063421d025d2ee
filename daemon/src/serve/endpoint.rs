//! Endpoint checks before binding: `ipc://` by default, `tcp://` on request. A socket file left by
//! a dead daemon is removed; one a live daemon answers on is an error (ZeroMQ would silently take
//! it over). A non-loopback TCP address is unauthenticated (this build's libzmq has no CURVE):
//! binding one is refused unless asked for with `--insecure-tcp`, and then logged loudly.

use anyhow::bail;
use std::net::IpAddr;
use std::path::Path;

pub fn prepare(endpoint: &str, insecure_tcp: bool) -> anyhow::Result<()> {
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
        if !loopback && !insecure_tcp {
            bail!(
                "endpoint {endpoint} is not a loopback address: anyone who can reach {host} \
                 could read the token stream and ask for any rank's steps, moving what the daemon \
                 holds, and nothing authenticates them. Bind 127.0.0.1 or an ipc:// path, or pass \
                 --insecure-tcp to accept that (on a network only trusted hosts reach)"
            );
        }
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
