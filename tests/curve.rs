//! Authenticated serving end to end (issue 13, point 2): real `dsprep serve` processes with
//! CURVE keys from real `dsprep keygen` runs, real `dsprep tap` processes and the Rust client on
//! real ZeroMQ sockets (tcp://127.0.0.1 on a free port, and ipc). An allowed client gets exactly
//! the packed windows; a client without CURVE, one whose key is not allowed and one with the
//! wrong server public key get no data, a typed error, and move nothing the daemon holds.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::curve::{ClientKeys, read_key_pair, read_public_key};
use dsprep_client::{Client, ClientConfig, ClientError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::daemon::{Daemon, expected_rank_bytes, http_request, tap_with};
use support::*;

/// `dsprep keygen --out dir/name`: returns the base path (name.key, name.key_secret beside it).
fn keygen(dir: &Path, name: &str) -> PathBuf {
    let base = dir.join(name);
    let stdout = dsprep_ok(&["keygen", "--out", base.to_str().unwrap()]);
    let public = read_public_key(&key(&base)).unwrap();
    assert_eq!(
        stdout.trim(),
        format!(
            "wrote {} (public key {public}: share it) and {} (keep it: mode 0600)",
            key(&base).display(),
            secret(&base).display()
        )
    );
    base
}

fn key(base: &Path) -> PathBuf {
    PathBuf::from(format!("{}.key", base.display()))
}

fn secret(base: &Path) -> PathBuf {
    PathBuf::from(format!("{}.key_secret", base.display()))
}

/// The Z85 text of a key file's secret key, to check it never reaches a log.
fn secret_text(base: &Path) -> String {
    let text = std::fs::read_to_string(secret(base)).unwrap();
    let line = text.lines().find(|l| l.contains("secret-key")).unwrap();
    line.split('"').nth(1).unwrap().to_string()
}

/// The daemon's key pair, an allowed trainer and a stranger; the allow directory holds only the
/// trainer's public key.
struct Keys {
    server: PathBuf,
    trainer: PathBuf,
    stranger: PathBuf,
    allow: PathBuf,
}

fn keys(dir: &Path) -> Keys {
    let server = keygen(dir, "server");
    let trainer = keygen(dir, "trainer");
    let stranger = keygen(dir, "stranger");
    let allow = dir.join("allow");
    std::fs::create_dir(&allow).unwrap();
    std::fs::copy(key(&trainer), allow.join("trainer.key")).unwrap();
    Keys {
        server,
        trainer,
        stranger,
        allow,
    }
}

fn curve_args(keys: &Keys) -> Vec<String> {
    vec![
        "--curve-secret-key".into(),
        secret(&keys.server).display().to_string(),
        "--curve-allow".into(),
        keys.allow.display().to_string(),
    ]
}

fn free_tcp_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("tcp://{}", listener.local_addr().unwrap())
}

fn client_config(endpoint: &str, rank: u32, curve: Option<ClientKeys>) -> ClientConfig {
    ClientConfig {
        endpoint: endpoint.into(),
        rank,
        world_size: 2,
        recipe_hash: None,
        timeout: Duration::from_secs(5),
        attempts: 2,
        parallel: Default::default(),
        session: None,
        curve,
    }
}

/// What the daemon holds and where its ranks stand, from `/metrics`.
fn positions(daemon: &Daemon) -> [f64; 6] {
    [
        daemon.metric("dsprep_rank_step{rank=\"0\"}"),
        daemon.metric("dsprep_rank_step{rank=\"1\"}"),
        daemon.metric("dsprep_rank_lag_steps{rank=\"0\"}"),
        daemon.metric("dsprep_rank_lag_steps{rank=\"1\"}"),
        daemon.metric("dsprep_steps{kind=\"held\"}"),
        daemon.metric("dsprep_steps{kind=\"produced\"}"),
    ]
}

/// Wait until the producer has filled its prefetch window (it then stands still until a rank
/// moves): the state the hostile clients must not change.
fn wait_full(daemon: &Daemon, prefetch: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while daemon.metric("dsprep_steps{kind=\"produced\"}") < prefetch {
        assert!(Instant::now() < deadline, "{}", daemon.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until a counter reaches `value` (the daemon's auth thread counts what libzmq reports,
/// a moment after the client has seen its own side of the handshake fail).
fn wait_at_least(daemon: &Daemon, series: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.metric(series) < value {
        assert!(Instant::now() < deadline, "{series} stays below {value}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn unauthorized(result: Result<Option<dsprep_client::ServedBatch>, ClientError>) -> String {
    match result {
        Err(ClientError::Unauthorized(message)) => message,
        other => panic!("expected Unauthorized, got {other:?}"),
    }
}

#[test]
fn keygen_writes_0600_certificates_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let base = keygen(tmp.path(), "node0");
    for path in [key(&base), secret(&base)] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    }
    let public = std::fs::read_to_string(key(&base)).unwrap();
    let pair = read_key_pair(&secret(&base)).unwrap();
    assert!(
        public.ends_with(&format!(
            "\nmetadata\ncurve\n    public-key = \"{}\"\n",
            pair.public
        )),
        "{public}"
    );
    assert!(!public.contains("secret-key"), "{public}");

    let err = dsprep_fails(&["keygen", "--out", base.to_str().unwrap()]);
    assert_eq!(
        err.trim(),
        format!(
            "error: {}: already exists: pass --force to replace it (then give the new public key \
             to every side that has the old one)",
            key(&base).display()
        )
    );
    assert_eq!(read_public_key(&key(&base)).unwrap(), pair.public);
    dsprep_ok(&["keygen", "--out", base.to_str().unwrap(), "--force"]);
    assert_ne!(read_public_key(&key(&base)).unwrap(), pair.public);
    assert_ne!(
        read_public_key(&secret(&base)).unwrap(),
        pair.public,
        "both files replaced"
    );
}

#[test]
fn over_tcp_only_allowed_curve_clients_get_data_and_the_others_move_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keys(tmp.path());
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let endpoint = free_tcp_endpoint();
    let mut args: Vec<String> = [
        "--world-size",
        "2",
        "--micro-batch",
        "2",
        "--prefetch",
        "4",
        "--metrics",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(curve_args(&keys));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&quickstart(), &endpoint, &args).unwrap();
    let server_public = read_public_key(&key(&keys.server)).unwrap();
    assert!(
        daemon.log_text().contains(&format!(
            "CURVE on: server public key {server_public} (give the clients its NAME.key); 1 \
             client keys allowed from {}",
            keys.allow.display()
        )),
        "{}",
        daemon.log_text()
    );
    assert_eq!(daemon.metric("dsprep_auth_curve"), 1.0);
    wait_full(&daemon, 4.0);
    let before = positions(&daemon);
    assert_eq!(before, [0.0, 0.0, 0.0, 0.0, 4.0, 4.0]);

    // Each asks for step 3 of both ranks: served, it would move both ranks' positions.
    let stranger = ClientKeys::from_files(&key(&keys.server), &secret(&keys.stranger)).unwrap();
    let wrong_server =
        ClientKeys::from_files(&key(&keys.stranger), &secret(&keys.trainer)).unwrap();
    for rank in 0..2 {
        let mut plain = Client::with_config(client_config(&endpoint, rank, None)).unwrap();
        assert_eq!(
            unauthorized(plain.batch_at(3)),
            format!(
                "the daemon at {endpoint} serves with CURVE and this client has no keys: set \
                 DSPREP_CURVE_SERVER_KEY (the daemon's NAME.key) and DSPREP_CURVE_CLIENT_KEY \
                 (this client's NAME.key_secret, whose NAME.key is in the daemon's --curve-allow \
                 directory)"
            )
        );
        let mut refused =
            Client::with_config(client_config(&endpoint, rank, Some(stranger.clone()))).unwrap();
        assert_eq!(
            unauthorized(refused.batch_at(3)),
            format!(
                "the daemon at {endpoint} refused this client's CURVE key (ZAP status 400): its \
                 public key (the NAME.key beside the NAME.key_secret given) is not in the \
                 daemon's --curve-allow directory; check DSPREP_CURVE_CLIENT_KEY"
            )
        );
        let mut misdirected =
            Client::with_config(client_config(&endpoint, rank, Some(wrong_server.clone())))
                .unwrap();
        assert_eq!(
            unauthorized(misdirected.batch_at(3)),
            format!(
                "the daemon at {endpoint} broke off 3 CURVE handshakes in a row: it cannot open \
                 this client's HELLO, so the server public key given is not the daemon's (or the \
                 daemon refused this client); check DSPREP_CURVE_SERVER_KEY / \
                 DSPREP_CURVE_CLIENT_KEY"
            )
        );
    }
    // A raw DEALER without CURVE sending well-formed requests: nothing reaches the daemon.
    let context = zmq::Context::new();
    let raw = context.socket(zmq::DEALER).unwrap();
    raw.set_linger(0).unwrap();
    raw.connect(&endpoint).unwrap();
    for rank in 0..2 {
        let request = dsprep_client::protocol::Request {
            version: dsprep_client::protocol::PROTOCOL_VERSION,
            kind: dsprep_client::protocol::RequestKind::Batch,
            request_id: 1,
            rank,
            world_size: 2,
            step: 3,
            recipe_hash: None,
            owner: None,
        };
        raw.send(&request.encode()[..], 0).unwrap();
    }
    assert_eq!(
        raw.poll(zmq::POLLIN, 1000).unwrap(),
        0,
        "no reply to a plain DEALER"
    );
    drop(raw);

    // Every refusal is counted: two keys not allowed; at least one failed handshake per client
    // without CURVE (two, and the raw DEALER) and three per client with the wrong server key.
    wait_at_least(
        &daemon,
        "dsprep_auth_refused_total{reason=\"key_not_allowed\"}",
        2.0,
    );
    wait_at_least(
        &daemon,
        "dsprep_auth_refused_total{reason=\"handshake_failed\"}",
        9.0,
    );
    assert_eq!(positions(&daemon), before, "nothing moved");
    let body = http_request(daemon.metrics.as_ref().unwrap(), &[]).1;
    assert!(
        !body.contains("dsprep_replies_total{status="),
        "no request answered: {body}"
    );
    assert_eq!(daemon.metric("dsprep_auth_accepted_total"), 0.0);

    // The allowed trainer: rank 0 with flags, rank 1 from the environment.
    let num_steps = dataset.num_windows() / 4;
    let outs = [tmp.path().join("r0.bin"), tmp.path().join("r1.bin")];
    let (server_key, trainer_key) = (key(&keys.server), secret(&keys.trainer));
    let flags = [
        "--curve-server-key",
        server_key.to_str().unwrap(),
        "--curve-client-key",
        trainer_key.to_str().unwrap(),
    ];
    let rank0 = tap_with(&endpoint, 0, 2, 0, num_steps + 2, &outs[0], &flags);
    let rank1 = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"))
        .args([
            "tap",
            "--endpoint",
            &endpoint,
            "--rank",
            "1",
            "--world-size",
            "2",
        ])
        .args(["--steps", &(num_steps + 2).to_string(), "--timeout-s", "10"])
        .args(["--out", outs[1].to_str().unwrap()])
        .env("DSPREP_CURVE_SERVER_KEY", &server_key)
        .env("DSPREP_CURVE_CLIENT_KEY", &trainer_key)
        .output()
        .unwrap();
    let rank0 = rank0.wait_with_output().unwrap();
    for (rank, out) in [(0, &rank0), (1, &rank1)] {
        assert!(
            out.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read(&outs[rank]).unwrap(),
            expected_rank_bytes(&dataset, 2, 2, rank as u64),
            "rank {rank} receives exactly the packed windows"
        );
    }
    assert!(daemon.metric("dsprep_auth_accepted_total") >= 2.0);

    let log = daemon.log_text();
    let stranger_public = read_public_key(&key(&keys.stranger)).unwrap();
    assert!(
        log.contains(&format!(
            "peer 127.0.0.1, CURVE public key {stranger_public}: not in the --curve-allow \
             directory {}",
            keys.allow.display()
        )),
        "{log}"
    );
    assert!(log.contains("(libzmq does not name it)"), "{log}");
    for base in [&keys.server, &keys.trainer, &keys.stranger] {
        assert!(
            !log.contains(&secret_text(base)),
            "a secret key in the log:\n{log}"
        );
    }
}

/// CURVE on an ipc endpoint, on a node daemon of a recipe with lanes: the same flags, the same
/// refusal, and the allowed client gets the windows `dsprep pack` writes.
#[test]
fn a_node_daemon_on_ipc_serves_curve_clients_the_same_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keys(tmp.path());
    let recipe = repo_root().join("config/quickstart-multinode.toml");
    let dataset = pack_dataset(&recipe, &tmp.path().join("packed"));
    let endpoint = format!("ipc://{}", tmp.path().join("node0.sock").display());
    let state = tmp.path().join("state");
    let mut args: Vec<String> = [
        "--world-size",
        "2",
        "--micro-batch",
        "2",
        "--node-rank",
        "0",
        "--nodes",
        "1",
        "--state-dir",
        state.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(curve_args(&keys));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&recipe, &endpoint, &args).unwrap();

    let mut plain = Client::with_config(client_config(&endpoint, 0, None)).unwrap();
    assert!(
        unauthorized(plain.batch_at(0)).contains("serves with CURVE and this client has no keys")
    );
    assert_eq!(daemon.metric("dsprep_rank_step{rank=\"0\"}"), 0.0);

    let steps = 6;
    let trainer = ClientKeys::from_files(&key(&keys.server), &secret(&keys.trainer)).unwrap();
    let mut expected = Vec::new();
    let mut received = Vec::new();
    let mut clients: Vec<Client> = (0..2)
        .map(|rank| {
            Client::with_config(client_config(&endpoint, rank, Some(trainer.clone()))).unwrap()
        })
        .collect();
    for step in 0..steps {
        for (rank, client) in clients.iter_mut().enumerate() {
            let batch = client.batch_at(step).unwrap().unwrap();
            received.extend_from_slice(batch.tokens().as_bytes());
            for row in 0..2 {
                let window = (step * 2 + rank as u64) * 2 + row;
                expected.extend_from_slice(dataset.window(window).unwrap().tokens.as_bytes());
            }
        }
    }
    assert_eq!(received, expected);
    wait_at_least(
        &daemon,
        "dsprep_auth_refused_total{reason=\"handshake_failed\"}",
        1.0,
    );
}

#[test]
fn bad_curve_settings_are_refused_before_serving_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keys(tmp.path());
    let endpoint = free_tcp_endpoint();
    let base = [
        "--world-size",
        "1",
        "--micro-batch",
        "1",
        "--metrics",
        "off",
    ];
    let start = |extra: &[&str]| {
        Daemon::start_with(&quickstart(), &endpoint, &[&base[..], extra].concat())
            .err()
            .unwrap()
    };
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let server_secret = secret(&keys.server);
    let err = start(&[
        "--curve-secret-key",
        server_secret.to_str().unwrap(),
        "--curve-allow",
        empty.to_str().unwrap(),
    ]);
    assert!(
        err.contains(&format!(
            "error: the --curve-allow directory {} holds no *.key file",
            empty.display()
        )),
        "{err}"
    );
    let public = key(&keys.server);
    let err = start(&[
        "--curve-secret-key",
        public.to_str().unwrap(),
        "--curve-allow",
        keys.allow.to_str().unwrap(),
    ]);
    assert!(
        err.contains(&format!(
            "error: --curve-secret-key: {}: holds no secret-key: give the NAME.key_secret file \
             that `dsprep keygen` wrote, not the public NAME.key",
            public.display()
        )),
        "{err}"
    );
    let err = Daemon::start_with(
        &quickstart(),
        &endpoint,
        &[
            &base[..],
            &["--curve-secret-key", server_secret.to_str().unwrap()],
        ]
        .concat(),
    )
    .err()
    .unwrap();
    assert!(err.contains("--curve-allow"), "{err}");
}

/// `--metrics-token-file`: every request needs `Authorization: Bearer <token>` (401 without);
/// beyond loopback, metrics need a token or `--insecure-metrics`.
#[test]
fn metrics_with_a_token_file_answer_only_the_bearer_of_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("metrics.token");
    std::fs::write(&token, "3f9a-not-guessable\n").unwrap();
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let args = ["--world-size", "1", "--micro-batch", "1", "--metrics"];
    let daemon = Daemon::start_with(
        &quickstart(),
        &endpoint,
        &[
            &args[..],
            &[
                "127.0.0.1:0",
                "--metrics-token-file",
                token.to_str().unwrap(),
            ],
        ]
        .concat(),
    )
    .unwrap();
    assert!(
        daemon
            .log_text()
            .contains("/metrics (bearer token required)"),
        "{}",
        daemon.log_text()
    );
    let url = daemon.metrics.clone().unwrap();
    for headers in [
        vec![],
        vec!["Authorization: Bearer wrong"],
        vec!["Authorization: Basic 3f9a-not-guessable"],
    ] {
        let (status, body) = http_request(&url, &headers);
        assert_eq!(status, "HTTP/1.0 401 Unauthorized", "{headers:?}");
        assert!(!body.contains("dsprep_steps"), "{body}");
    }
    let (status, body) = http_request(&url, &["Authorization: Bearer 3f9a-not-guessable"]);
    assert_eq!(status, "HTTP/1.0 200 OK");
    assert!(body.contains("dsprep_steps{kind=\"produced\"}"), "{body}");
    drop(daemon);

    let err = Daemon::start_with(
        &quickstart(),
        &endpoint,
        &[&args[..], &["0.0.0.0:0"]].concat(),
    )
    .err()
    .unwrap();
    assert!(
        err.contains(
            "error: --metrics 0.0.0.0:0 is not a loopback address: anyone who can reach it would \
             read the daemon's counters (recipe hash, rank positions, sources). Give \
             --metrics-token-file FILE (scrapers then send `Authorization: Bearer <token>`, as \
             Prometheus' `authorization: credentials_file` does), bind 127.0.0.1, or pass \
             --insecure-metrics to accept that"
        ),
        "{err}"
    );
}
