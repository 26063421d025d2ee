//! The keepalive of a client's rank (protocol v6): a thread with its own DEALER socket sends the
//! rank's keepalive request every [`KEEPALIVE_INTERVAL`] while the client lives, so the rank
//! stays this trainer process's at the daemon however long a step takes (a 244 s step of a 70B
//! model included), and passes once the process dies and the keepalives stop (PROTOCOL.md "One
//! owner per rank"). It never blocks the trainer: sends never wait (a full queue drops the
//! keepalive; at most [`QUEUED`] wait while the daemon is away), the daemon never answers, and
//! stopping wakes the thread at once.

use crate::curve::ClientKeys;
use crate::protocol::KEEPALIVE_INTERVAL;
use crate::served::ClientError;
use std::sync::mpsc::{RecvTimeoutError, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Keepalives queued at most on the socket while the daemon is unreachable.
const QUEUED: i32 = 4;

/// A running keepalive thread; [`Keepalive::stop`] ends it.
pub(crate) struct Keepalive {
    stop: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Keepalive {
    /// Connect a socket to `endpoint` (with `keys`, as the client's) and send `beat`, the
    /// encoded keepalive request, every [`KEEPALIVE_INTERVAL`] from a thread.
    pub fn start(
        context: &zmq::Context,
        endpoint: &str,
        keys: Option<&ClientKeys>,
        beat: Vec<u8>,
    ) -> Result<Keepalive, ClientError> {
        let socket = context.socket(zmq::DEALER)?;
        socket.set_linger(0)?;
        socket.set_sndhwm(QUEUED)?;
        if let Some(keys) = keys {
            keys.apply(&socket)?;
        }
        socket
            .connect(endpoint)
            .map_err(|e| ClientError::Config(format!("cannot connect to {endpoint}: {e}")))?;
        let (stop, stopped) = sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("dsprep-keepalive".into())
            .spawn(move || {
                loop {
                    // Best effort: a keepalive the queue cannot take is dropped; the next follows.
                    let _ = socket.send(&beat[..], zmq::DONTWAIT);
                    match stopped.recv_timeout(KEEPALIVE_INTERVAL) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .map_err(|e| ClientError::Config(format!("cannot start the keepalive thread: {e}")))?;
        Ok(Keepalive { stop, thread })
    }

    /// Stop sending keepalives, and wait for the thread (it wakes at once) to close its socket.
    pub fn stop(self) {
        let _ = self.stop.try_send(());
        let _ = self.thread.join();
    }
}
