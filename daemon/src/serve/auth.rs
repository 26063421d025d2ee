//! Authenticated serving (PROTOCOL.md "Security"): with `--curve-secret-key` and `--curve-allow`
//! the ROUTER is a CURVE server, and a ZAP handler (ZeroMQ RFC 27) bound at
//! `inproc://zeromq.zap.01` in the daemon's context, on its own thread, admits only CURVE
//! clients whose public key is in the allow list. Invariants: ZAP is enforced, so a missing or
//! dead handler refuses every handshake instead of letting it through; every refusal is counted
//! (`dsprep_auth_refused_total`) and logged at most once a second with the count since, naming
//! the peer and the client's public key when libzmq knows them; a secret key is never logged.

use super::metrics::Metrics;
use anyhow::{Context, bail};
use dsprep_client::curve::{self, KeyPair, PublicKey};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where libzmq sends its ZAP requests (fixed by RFC 27).
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";
/// The ZAP domain of the ROUTER: a domain is what makes libzmq ask the handler at all.
const ZAP_DOMAIN: &str = "dsprep";
/// Where the ROUTER's monitor publishes failed handshakes (refusals the handler never sees).
const MONITOR_ENDPOINT: &str = "inproc://dsprep-router-monitor";
/// libzmq's `ZMQ_ZAP_ENFORCE_DOMAIN` (zmq.h 4.3.5; libzmq accepts it in every build, but the
/// zmq crate has no setter for it).
const ZMQ_ZAP_ENFORCE_DOMAIN: std::ffi::c_int = 93;
/// How often the handler thread looks at the stop flag and at refusals not yet logged.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Refusals are logged at most this often, saying how many came since the last line: a flood
/// of unwanted peers must not become a flood of log lines.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// The public keys the daemon admits: every `*.key` file of the `--curve-allow` directory (as
/// pyzmq's `zmq.auth` allow lists are), each with its file name for the logs.
#[derive(Debug, Clone)]
pub struct AllowList {
    dir: PathBuf,
    keys: BTreeMap<PublicKey, String>,
}

impl AllowList {
    /// Read every `*.key` file of `dir`. An unreadable or empty directory, or a file that is not
    /// a certificate, is an error naming it.
    pub fn read(dir: &Path) -> anyhow::Result<AllowList> {
        let entries = std::fs::read_dir(dir).with_context(|| {
            format!(
                "cannot read the --curve-allow directory {}: it must hold the public key file \
                 (NAME.key) of every client allowed in",
                dir.display()
            )
        })?;
        let mut keys = BTreeMap::new();
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
            names.push(entry.path());
        }
        names.sort();
        for path in names {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.ends_with(".key_secret") {
                tracing::warn!(
                    "{} is a secret key file in the --curve-allow directory: the daemon needs only \
                     the clients' public NAME.key files; keep secret keys with their owners",
                    path.display()
                );
                continue;
            }
            if !name.ends_with(".key") || path.is_dir() {
                continue;
            }
            let key = curve::read_public_key(&path)?;
            keys.entry(key).or_insert(name);
        }
        if keys.is_empty() {
            bail!(
                "the --curve-allow directory {} holds no *.key file: put there the public key file \
                 of every client allowed in (`dsprep keygen --out NAME` writes NAME.key and \
                 NAME.key_secret; the client keeps NAME.key_secret)",
                dir.display()
            );
        }
        Ok(AllowList {
            dir: dir.to_path_buf(),
            keys,
        })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The file a key came from, when it is allowed.
    pub fn file_of(&self, key: &PublicKey) -> Option<&str> {
        self.keys.get(key).map(String::as_str)
    }
}

/// The daemon's CURVE identity and the clients it admits.
#[derive(Debug)]
pub struct CurveServer {
    keys: KeyPair,
    pub allowed: AllowList,
}

impl CurveServer {
    /// From `--curve-secret-key` (the daemon's `NAME.key_secret`) and `--curve-allow`.
    pub fn load(secret_key: &Path, allow_dir: &Path) -> anyhow::Result<CurveServer> {
        if !curve::available() {
            bail!(
                "this dsprep's libzmq was built without CURVE (zmq_has(\"curve\") is false): \
                 rebuild it from this repository (client/zmq-sys links libsodium)"
            );
        }
        let keys = curve::read_key_pair(secret_key).context("--curve-secret-key")?;
        warn_if_readable_by_others(secret_key);
        let allowed = AllowList::read(allow_dir)?;
        Ok(CurveServer { keys, allowed })
    }

    /// The daemon's public key: what its clients are given (`DSPREP_CURVE_SERVER_KEY`).
    pub fn public_key(&self) -> PublicKey {
        self.keys.public
    }

    /// Make `router` a CURVE server whose every handshake is decided by the ZAP handler, and
    /// refused when no handler answers. Call before it binds.
    pub fn secure(&self, router: &mut zmq::Socket) -> anyhow::Result<()> {
        router.set_curve_server(true)?;
        router.set_curve_secretkey(self.keys.secret.as_bytes())?;
        router.set_zap_domain(ZAP_DOMAIN)?;
        enforce_zap(router)
    }
}

/// A secret key others can read is not secret: say so (the daemon still starts; the key files
/// `dsprep keygen` writes are 0600).
fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                "the secret key file {} is readable by other users (mode {:o}): chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
    }
}

/// Set `ZMQ_ZAP_ENFORCE_DOMAIN`: without it, libzmq lets a CURVE handshake through when no
/// ZAP handler is bound ("legacy" Stonehouse), so a handler that failed would mean "allow".
#[allow(unsafe_code)] // the zmq crate has no setter for this option: one int set on a socket we own
fn enforce_zap(router: &mut zmq::Socket) -> anyhow::Result<()> {
    let on: std::ffi::c_int = 1;
    // SAFETY: `router` is a live socket (we hold it mutably); libzmq copies the int it reads
    // through the pointer, whose size is given, before returning.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            router.as_mut_ptr(),
            ZMQ_ZAP_ENFORCE_DOMAIN,
            (&on as *const std::ffi::c_int).cast(),
            std::mem::size_of::<std::ffi::c_int>(),
        )
    };
    if rc != 0 {
        bail!(
            "libzmq refused ZMQ_ZAP_ENFORCE_DOMAIN: cannot make CURVE refuse when no ZAP handler answers"
        );
    }
    Ok(())
}

/// What the handler decided about one ZAP request.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Refused(String),
}

/// The reply to one ZAP request (RFC 27 frames: version, request id, domain, address, identity,
/// mechanism, credentials…), and the verdict. Only CURVE in the `dsprep` domain with an
/// allowed public key is let in; anything else, a malformed request included, is refused.
fn decide(frames: &[Vec<u8>], allowed: &AllowList) -> (Vec<Vec<u8>>, Verdict) {
    let request_id = frames.get(1).cloned().unwrap_or_default();
    let reply = |code: &str, text: &str| {
        vec![
            b"1.0".to_vec(),
            request_id.clone(),
            code.as_bytes().to_vec(),
            text.as_bytes().to_vec(),
            Vec::new(),
            Vec::new(),
        ]
    };
    if frames.len() < 6 || frames[0] != b"1.0" {
        let why = format!("a malformed ZAP request ({} frames)", frames.len());
        return (reply("500", "malformed ZAP request"), Verdict::Refused(why));
    }
    let peer = match String::from_utf8_lossy(&frames[3]).into_owned() {
        address if address.is_empty() => "a local peer".to_string(),
        address => format!("peer {address}"),
    };
    if frames[2] != ZAP_DOMAIN.as_bytes() {
        let why = format!(
            "{peer}: ZAP domain {:?} is not {ZAP_DOMAIN:?}",
            String::from_utf8_lossy(&frames[2])
        );
        return (reply("400", "unknown domain"), Verdict::Refused(why));
    }
    if frames[5] != b"CURVE" || frames.len() != 7 {
        let why = format!(
            "{peer}: mechanism {} is not CURVE",
            String::from_utf8_lossy(&frames[5])
        );
        return (reply("400", "CURVE only"), Verdict::Refused(why));
    }
    let Ok(bytes) = <[u8; 32]>::try_from(frames[6].as_slice()) else {
        let why = format!("{peer}: a CURVE key of {} bytes", frames[6].len());
        return (reply("400", "bad key"), Verdict::Refused(why));
    };
    let key = PublicKey::from_bytes(bytes);
    match allowed.file_of(&key) {
        Some(_) => (reply("200", "OK"), Verdict::Allowed),
        None => {
            let why = format!(
                "{peer}, CURVE public key {key}: not in the --curve-allow directory {}",
                allowed.dir.display()
            );
            (reply("400", "key not allowed"), Verdict::Refused(why))
        }
    }
}

/// At most one log line per [`REFUSAL_LOG_EVERY`]: the first refusal at once, then the ones
/// held back, each distinct kind with its count (at most [`REFUSAL_KINDS`] named, so a flood of
/// distinct keys stays one bounded line).
#[derive(Default)]
struct RefusalLog {
    last_line: Option<Instant>,
    held: BTreeMap<String, u64>,
    /// Refusals held back whose kind did not fit in `held`.
    others: u64,
}

/// Distinct refusals named in one log line.
const REFUSAL_KINDS: usize = 8;

impl RefusalLog {
    fn note(&mut self, what: String, now: Instant) {
        let quiet = self
            .last_line
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_EVERY);
        if quiet && self.held.is_empty() && self.others == 0 {
            self.last_line = Some(now);
            tracing::warn!("refused a client: {what}");
            return;
        }
        if let Some(n) = self.held.get_mut(&what) {
            *n += 1;
        } else if self.held.len() < REFUSAL_KINDS {
            self.held.insert(what, 1);
        } else {
            self.others += 1;
        }
        if quiet {
            self.flush(now);
        }
    }

    /// Log the refusals held back, once the interval has passed.
    fn flush(&mut self, now: Instant) {
        if self
            .last_line
            .is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_EVERY)
        {
            return;
        }
        if self.flush_held() {
            self.last_line = Some(now);
        }
    }

    /// One line for the refusals held back, if any.
    fn flush_held(&mut self) -> bool {
        let total: u64 = self.held.values().sum::<u64>() + self.others;
        if total == 0 {
            return false;
        }
        let mut kinds: Vec<String> = std::mem::take(&mut self.held)
            .into_iter()
            .map(|(what, n)| format!("{n} × {what}"))
            .collect();
        match std::mem::take(&mut self.others) {
            0 => {}
            n => kinds.push(format!("{n} of other kinds")),
        }
        tracing::warn!(
            "refused {total} clients since the last line: {}",
            kinds.join("; ")
        );
        true
    }

    #[cfg(test)]
    fn held_back(&self) -> u64 {
        self.held.values().sum::<u64>() + self.others
    }
}

/// A failed handshake the ROUTER's monitor reported (the handler never sees those: a client
/// without CURVE, or one with another server public key, fails before ZAP). libzmq names the
/// daemon's endpoint in these events, not the peer.
fn handshake_failure(event: u16, value: u32, endpoint: &str) -> Option<String> {
    let what = match u32::from(event) {
        zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL => match value {
            zmq_sys::ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH => {
                "the client does not speak CURVE (a client without keys)".to_string()
            }
            zmq_sys::ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC => {
                "its CURVE HELLO does not open with this daemon's key (the client has another \
                 server public key)"
                    .to_string()
            }
            code => format!("ZMTP protocol error {code:#x}"),
        },
        zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL => {
            format!("the handshake broke off (errno {value})")
        }
        // ZAP refusals also raise HANDSHAKE_FAILED_AUTH: counted by the handler already.
        _ => return None,
    };
    Some(format!(
        "a peer of {endpoint} (libzmq does not name it): {what}"
    ))
}

/// The ZAP handler thread, and how to stop it.
pub struct Authenticator {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Authenticator {
    /// Bind the ZAP handler and watch `router`'s handshakes, in `context` (the ROUTER's own).
    /// Call before `router` binds, so that no handshake comes before the handler.
    pub fn start(
        context: &zmq::Context,
        router: &zmq::Socket,
        endpoint: &str,
        allowed: AllowList,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Authenticator> {
        let zap = context.socket(zmq::REP)?;
        zap.set_linger(0)?;
        zap.bind(ZAP_ENDPOINT)
            .map_err(|e| anyhow::anyhow!("cannot bind the ZAP handler at {ZAP_ENDPOINT}: {e}"))?;
        let events = zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
        router.monitor(MONITOR_ENDPOINT, events as i32)?;
        let monitor = context.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(MONITOR_ENDPOINT)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, endpoint) = (Arc::clone(&stop), endpoint.to_string());
            std::thread::Builder::new()
                .name("dsprep-auth".into())
                .spawn(move || handle(zap, monitor, &allowed, &metrics, &endpoint, &stop))?
        };
        Ok(Authenticator {
            stop,
            thread: Some(thread),
        })
    }

    /// Stop the handler and close its sockets (before the context is dropped).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Authenticator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn handle(
    zap: zmq::Socket,
    monitor: zmq::Socket,
    allowed: &AllowList,
    metrics: &Metrics,
    endpoint: &str,
    stop: &AtomicBool,
) {
    let mut log = RefusalLog::default();
    while !stop.load(Ordering::Relaxed) {
        let (zap_ready, monitor_ready) = {
            let mut items = [
                zap.as_poll_item(zmq::POLLIN),
                monitor.as_poll_item(zmq::POLLIN),
            ];
            match zmq::poll(&mut items, POLL_INTERVAL.as_millis() as i64) {
                Ok(_) | Err(zmq::Error::EINTR) => {}
                Err(e) => {
                    // Enforced ZAP: with this thread gone every handshake is refused.
                    tracing::error!("the ZAP handler stops, every new client will be refused: {e}");
                    return;
                }
            }
            (items[0].is_readable(), items[1].is_readable())
        };
        let now = Instant::now();
        if zap_ready {
            while let Ok(frames) = zap.recv_multipart(zmq::DONTWAIT) {
                let (reply, verdict) = decide(&frames, allowed);
                match verdict {
                    Verdict::Allowed => metrics.auth.count_accepted(),
                    Verdict::Refused(why) => {
                        metrics.auth.count_refused_key();
                        log.note(why, now);
                    }
                }
                if let Err(e) = zap.send_multipart(reply, 0) {
                    tracing::error!("the ZAP handler cannot reply: {e}");
                }
            }
        }
        if monitor_ready {
            while let Ok(frames) = monitor.recv_multipart(zmq::DONTWAIT) {
                let Some(head) = frames.first().filter(|f| f.len() == 6) else {
                    continue;
                };
                let event = u16::from_ne_bytes([head[0], head[1]]);
                let value = u32::from_ne_bytes([head[2], head[3], head[4], head[5]]);
                if let Some(why) = handshake_failure(event, value, endpoint) {
                    metrics.auth.count_refused_handshake();
                    log.note(why, now);
                }
            }
        }
        log.flush(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(dir: &Path, name: &str) -> PublicKey {
        let pair = KeyPair::generate().expect("key pair");
        curve::write_key_files(&dir.join(name), &pair, false).expect("written");
        pair.public
    }

    fn request(domain: &str, mechanism: &str, credentials: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut frames = vec![
            b"1.0".to_vec(),
            b"7".to_vec(),
            domain.as_bytes().to_vec(),
            b"10.1.2.3".to_vec(),
            Vec::new(),
            mechanism.as_bytes().to_vec(),
        ];
        frames.extend(credentials.iter().map(|c| c.to_vec()));
        frames
    }

    #[test]
    fn only_allowed_curve_keys_in_the_dsprep_domain_are_let_in() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = allow(dir.path(), "trainer");
        let allowed = AllowList::read(dir.path()).expect("allow list");
        assert_eq!(allowed.len(), 1);
        let (reply, verdict) = decide(&request("dsprep", "CURVE", &[key.as_bytes()]), &allowed);
        assert_eq!(verdict, Verdict::Allowed);
        assert_eq!(
            reply[..3],
            [b"1.0".to_vec(), b"7".to_vec(), b"200".to_vec()]
        );

        let stranger = KeyPair::generate().expect("key pair").public;
        let (reply, verdict) = decide(
            &request("dsprep", "CURVE", &[stranger.as_bytes()]),
            &allowed,
        );
        assert_eq!(reply[2], b"400");
        assert_eq!(
            verdict,
            Verdict::Refused(format!(
                "peer 10.1.2.3, CURVE public key {stranger}: not in the --curve-allow directory {}",
                dir.path().display()
            ))
        );
        for frames in [
            request("other", "CURVE", &[key.as_bytes()]),
            request("dsprep", "NULL", &[]),
            request("dsprep", "PLAIN", &[b"user", b"password"]),
            request("dsprep", "CURVE", &[b"short"]),
            vec![b"1.0".to_vec()],
        ] {
            let (reply, verdict) = decide(&frames, &allowed);
            assert!(matches!(verdict, Verdict::Refused(_)), "{frames:?}");
            assert_ne!(reply[2], b"200");
        }
    }

    #[test]
    fn an_empty_or_missing_allow_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let err = AllowList::read(dir.path()).expect_err("empty");
        assert_eq!(
            err.to_string(),
            format!(
                "the --curve-allow directory {} holds no *.key file: put there the public key \
                 file of every client allowed in (`dsprep keygen --out NAME` writes NAME.key and \
                 NAME.key_secret; the client keeps NAME.key_secret)",
                dir.path().display()
            )
        );
        let missing = dir.path().join("nowhere");
        let err = AllowList::read(&missing).expect_err("missing");
        assert!(
            format!("{err:#}").starts_with(&format!(
                "cannot read the --curve-allow directory {}: it must hold the public key file \
                 (NAME.key) of every client allowed in: ",
                missing.display()
            )),
            "{err:#}"
        );
        std::fs::write(dir.path().join("broken.key"), "not a key\n").expect("write");
        let err = AllowList::read(dir.path()).expect_err("broken");
        assert!(
            err.to_string().contains("broken.key: holds no public-key"),
            "{err}"
        );
    }

    /// What `ZMQ_ZAP_ENFORCE_DOMAIN` is for: a CURVE server whose ZAP handler is missing lets a
    /// client with the right server key in unless enforcement is on. Both halves run, so the
    /// test fails if the option stops working.
    #[test]
    fn enforced_zap_refuses_when_no_handler_answers() {
        let server = KeyPair::generate().expect("key pair");
        let client = KeyPair::generate().expect("key pair");
        for enforce in [false, true] {
            let context = zmq::Context::new();
            let mut router = context.socket(zmq::ROUTER).expect("router");
            router.set_linger(0).expect("linger");
            router.set_curve_server(true).expect("curve");
            router
                .set_curve_secretkey(server.secret.as_bytes())
                .expect("key");
            router.set_zap_domain(ZAP_DOMAIN).expect("domain");
            if enforce {
                enforce_zap(&mut router).expect("enforce");
            }
            router.bind("tcp://127.0.0.1:*").expect("bind");
            let endpoint = router
                .get_last_endpoint()
                .expect("endpoint")
                .expect("utf-8");
            let dealer = context.socket(zmq::DEALER).expect("dealer");
            dealer.set_linger(0).expect("linger");
            curve::ClientKeys {
                server: server.public,
                client: client.clone(),
            }
            .apply(&dealer)
            .expect("keys");
            dealer
                .monitor("inproc://test-dealer", zmq_sys::ZMQ_EVENT_ALL as i32)
                .expect("monitor");
            let events = context.socket(zmq::PAIR).expect("pair");
            events.connect("inproc://test-dealer").expect("connect");
            dealer.connect(&endpoint).expect("connect");
            let deadline = Instant::now() + Duration::from_secs(20);
            let outcome = loop {
                assert!(
                    Instant::now() < deadline,
                    "no handshake event (enforce {enforce})"
                );
                if events.poll(zmq::POLLIN, 100).expect("poll") == 0 {
                    continue;
                }
                let frames = events.recv_multipart(0).expect("event");
                let event = u32::from(u16::from_ne_bytes([frames[0][0], frames[0][1]]));
                match event {
                    zmq_sys::ZMQ_EVENT_HANDSHAKE_SUCCEEDED => break "succeeded",
                    zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH => break "failed",
                    _ => {}
                }
            };
            assert_eq!(outcome, if enforce { "failed" } else { "succeeded" });
        }
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_second_with_the_count_since() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        log.note("a".into(), t0);
        assert_eq!((log.held_back(), log.last_line), (0, Some(t0)));
        for i in 0..20 {
            log.note(format!("b{}", i % 10), t0 + Duration::from_millis(40 * i));
        }
        assert_eq!(log.held_back(), 20);
        assert_eq!(log.held.len(), REFUSAL_KINDS, "kinds named are bounded");
        assert_eq!(log.others, 4, "b8 and b9, twice each");
        log.flush(t0 + Duration::from_millis(900));
        assert_eq!(log.held_back(), 20, "not before a second has passed");
        log.flush(t0 + Duration::from_millis(1000));
        assert_eq!(log.held_back(), 0);
        assert_eq!(log.last_line, Some(t0 + Duration::from_millis(1000)));
        log.flush(t0 + Duration::from_millis(3000));
        assert_eq!(
            log.last_line,
            Some(t0 + Duration::from_millis(1000)),
            "nothing to log"
        );
    }
}
