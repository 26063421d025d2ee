//! One DEALER connection to the daemon and a watch on its handshakes: the socket (a CURVE
//! client when keys are given) and a monitor of its handshake events. A handshake the daemon
//! refuses never produces a reply, so without the watch a refused client would only time out;
//! with it, a refusal becomes [`ClientError::Unauthorized`] at once, saying which setting to
//! check. Invariant: a handshake failure is an error only when it cannot be a passing network
//! fault (an explicit refusal, a mechanism mismatch, or the same failure several times in a
//! row with no handshake completed between).

use crate::curve::{CLIENT_KEY_ENV, ClientKeys, SERVER_KEY_ENV};
use crate::served::ClientError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// CURVE handshakes broken off with no detail, in a row, before the client stops waiting: a
/// daemon that cannot open this client's HELLO (another server public key) closes every one.
const NO_DETAIL_FAILURES: u32 = 3;

/// Makes each connection's monitor endpoint unique within the process.
static NEXT_MONITOR: AtomicU64 = AtomicU64::new(0);

pub(crate) struct Connection {
    pub socket: zmq::Socket,
    monitor: zmq::Socket,
    endpoint: String,
    curve: bool,
    /// A handshake completed on this connection (a reply can come).
    succeeded: bool,
    /// Handshakes broken off with no detail since the last one that completed.
    no_detail_failures: u32,
    /// Without keys: connections made before any handshake completed.
    connected_before_handshake: u32,
}

impl Connection {
    pub fn open(
        context: &zmq::Context,
        endpoint: &str,
        keys: Option<&ClientKeys>,
    ) -> Result<Connection, ClientError> {
        let socket = context.socket(zmq::DEALER)?;
        socket.set_linger(0)?;
        if let Some(keys) = keys {
            keys.apply(&socket)?;
        }
        let monitor_endpoint = format!(
            "inproc://dsprep-client-handshakes-{}",
            NEXT_MONITOR.fetch_add(1, Ordering::Relaxed)
        );
        let events = zmq_sys::ZMQ_EVENT_HANDSHAKE_SUCCEEDED
            | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
            | zmq_sys::ZMQ_EVENT_CONNECTED;
        socket.monitor(&monitor_endpoint, events as i32)?;
        let monitor = context.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(&monitor_endpoint)?;
        socket
            .connect(endpoint)
            .map_err(|e| ClientError::Config(format!("cannot connect to {endpoint}: {e}")))?;
        Ok(Connection {
            socket,
            monitor,
            endpoint: endpoint.to_string(),
            curve: keys.is_some(),
            succeeded: false,
            no_detail_failures: 0,
            connected_before_handshake: 0,
        })
    }

    /// Whether a handshake has completed on this connection.
    pub fn handshake_succeeded(&self) -> bool {
        self.succeeded
    }

    /// Wait up to `timeout` for something to read: `Ok(true)` when a reply is there, `Ok(false)`
    /// at the timeout, an error as soon as the daemon is known to refuse this client.
    pub fn wait_readable(&mut self, timeout: Duration) -> Result<bool, ClientError> {
        let (readable, events) = {
            let mut items = [
                self.socket.as_poll_item(zmq::POLLIN),
                self.monitor.as_poll_item(zmq::POLLIN),
            ];
            zmq::poll(&mut items, timeout.as_millis().max(1) as i64)?;
            (items[0].is_readable(), items[1].is_readable())
        };
        if events {
            self.read_events()?;
        }
        Ok(readable)
    }

    fn read_events(&mut self) -> Result<(), ClientError> {
        while let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let Some(head) = frames.first().filter(|f| f.len() == 6) else {
                continue;
            };
            let event = u32::from(u16::from_ne_bytes([head[0], head[1]]));
            let value = u32::from_ne_bytes([head[2], head[3], head[4], head[5]]);
            match event {
                zmq_sys::ZMQ_EVENT_HANDSHAKE_SUCCEEDED => {
                    self.succeeded = true;
                    self.no_detail_failures = 0;
                }
                zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH => {
                    return Err(ClientError::Unauthorized(format!(
                        "the daemon at {} refused this client's CURVE key (ZAP status {value}): \
                         its public key (the NAME.key beside the NAME.key_secret given) is not \
                         in the daemon's --curve-allow directory; check {CLIENT_KEY_ENV}",
                        self.endpoint
                    )));
                }
                zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL => {
                    return Err(ClientError::Unauthorized(self.protocol_failure(value)));
                }
                // A CURVE daemon closes a plain client's connection at the greeting; when it
                // closes before this side has read the daemon's mechanism, no protocol event
                // comes, and the socket connects again. (Not ZMQ_EVENT_DISCONNECTED: with it in
                // the mask, the Python client's later sockets went unanswered in the tests.)
                zmq_sys::ZMQ_EVENT_CONNECTED if !self.succeeded && !self.curve => {
                    self.connected_before_handshake += 1;
                    if self.connected_before_handshake > NO_DETAIL_FAILURES {
                        return Err(ClientError::Unauthorized(self.protocol_failure(
                            zmq_sys::ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
                        )));
                    }
                }
                zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL if self.curve => {
                    self.no_detail_failures += 1;
                    if self.no_detail_failures >= NO_DETAIL_FAILURES {
                        return Err(ClientError::Unauthorized(format!(
                            "the daemon at {} broke off {} CURVE handshakes in a row: it cannot \
                             open this client's HELLO, so the server public key given is not the \
                             daemon's (or the daemon refused this client); check \
                             {SERVER_KEY_ENV} / {CLIENT_KEY_ENV}",
                            self.endpoint, self.no_detail_failures
                        )));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn protocol_failure(&self, code: u32) -> String {
        let endpoint = &self.endpoint;
        match (code, self.curve) {
            (zmq_sys::ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, false) => format!(
                "the daemon at {endpoint} serves with CURVE and this client has no keys: set \
                 {SERVER_KEY_ENV} (the daemon's NAME.key) and {CLIENT_KEY_ENV} (this client's \
                 NAME.key_secret, whose NAME.key is in the daemon's --curve-allow directory)"
            ),
            (zmq_sys::ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, true) => format!(
                "the daemon at {endpoint} does not serve with CURVE but this client has CURVE \
                 keys: unset {SERVER_KEY_ENV} / {CLIENT_KEY_ENV}, or serve with \
                 --curve-secret-key and --curve-allow"
            ),
            (code, _) => format!(
                "the handshake with the daemon at {endpoint} failed (ZMTP protocol error \
                 {code:#x}): check {SERVER_KEY_ENV} / {CLIENT_KEY_ENV}"
            ),
        }
    }
}
