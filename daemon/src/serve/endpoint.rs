//! Endpoint checks before binding: `ipc://` by default, `tcp://` on request. A socket file left by
//! a dead daemon is removed; one a live daemon answers on is an error (ZeroMQ would silently take
//! it over). A non-loopback TCP address needs CURVE (`--curve-secret-key` and `--curve-allow`):
//! without it, binding one is refused unless asked for with `--insecure-tcp`, and then logged
//! loudly.

use anyhow::bail;
use std::net::IpAddr;
use std::path::Path;

/// Whether the daemon may bind `endpoint` as configured (no IO): the scheme is known, and a
/// non-loopback TCP host is authenticated with CURVE or its exposure accepted.
pub fn check(endpoint: &str, insecure_tcp: bool, curve: bool) -> anyhow::Result<()> {
    if endpoint.starts_with("ipc://") {
        return Ok(());
    }
    let Some(address) = endpoint.strip_prefix("tcp://") else {
        bail!("endpoint {endpoint:?} must start with ipc:// or tcp://");
    };
    let host = address
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(address)
        .trim_matches(['[', ']']);
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback || curve {
        return Ok(());
    }
    if !insecure_tcp {
        bail!(
            "endpoint {endpoint} is not a loopback address and the daemon has no CURVE keys: \
             anyone who can reach {host} could read the token stream and ask for any rank's \
             steps, moving what the daemon holds. Serve with --curve-secret-key FILE and \
             --curve-allow DIR (`dsprep keygen`; README \"Serving over TCP\"), bind 127.0.0.1 or \
             an ipc:// path, or pass --insecure-tcp to accept that (on a network only trusted \
             hosts reach)"
        );
    }
    tracing::warn!(
        endpoint,
        "BINDING A NON-LOOPBACK ADDRESS WITHOUT CURVE: any host that can reach {host} can read the \
         token stream; serve with --curve-secret-key and --curve-allow, or bind 127.0.0.1 or an \
         ipc:// path"
    );
    Ok(())
}

/// Before binding: remove a socket file a dead daemon left; refuse one a live daemon answers on.
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
    }
    Ok(())
}

/// A clear message for a failed bind.
pub fn bind_error(endpoint: &str, error: zmq::Error) -> anyhow::Error {
    match error {
        zmq::Error::EADDRINUSE => anyhow::anyhow!("endpoint {endpoint} is already in use"),
        other => anyhow::anyhow!("cannot bind {endpoint}: {other}"),
    }
}
