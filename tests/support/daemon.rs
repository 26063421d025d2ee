//! A real `dsprep serve` process for tests: started on an ipc socket in a temp dir, ready once
//! it logs that it serves, killed on drop.

use dsprep_client::PackedDataset;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub child: Child,
    pub endpoint: String,
    pub metrics: Option<String>,
    pub log: Arc<Mutex<Vec<String>>>,
    /// The thread copying stderr into `log`: it ends when the daemon's stderr closes.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// `dsprep serve --recipe R --world-size W --micro-batch M --prefetch P` on `dir/d.sock`.
    pub fn start(
        dir: &Path,
        recipe: &Path,
        world_size: u32,
        micro_batch: u32,
        prefetch: u64,
    ) -> Daemon {
        let endpoint = format!("ipc://{}", dir.join("d.sock").display());
        Self::start_with(
            recipe,
            &endpoint,
            &[
                "--world-size",
                &world_size.to_string(),
                "--micro-batch",
                &micro_batch.to_string(),
                "--prefetch",
                &prefetch.to_string(),
                "--metrics",
                "127.0.0.1:0",
            ],
        )
        .expect("the daemon starts")
    }

    /// Start with explicit arguments; `Err(stderr)` if it exits before it is ready.
    pub fn start_with(recipe: &Path, endpoint: &str, args: &[&str]) -> Result<Daemon, String> {
        Self::start_cmd(
            Command::new(env!("CARGO_BIN_EXE_dsprep")),
            recipe,
            endpoint,
            args,
        )
    }

    /// [`Daemon::start_with`] on a prepared command (its environment set by the caller).
    pub fn start_cmd(
        mut command: Command,
        recipe: &Path,
        endpoint: &str,
        args: &[&str],
    ) -> Result<Daemon, String> {
        let mut child = command
            .args([
                "serve",
                "--recipe",
                recipe.to_str().unwrap(),
                "--endpoint",
                endpoint,
            ])
            .args(args)
            .env("DSPREP_LOG", "info")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn dsprep serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let reader = {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("serving recipe") {
                        let _ = ready_tx.send(());
                    }
                    log.lock().unwrap().push(line);
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if ready_rx.recv_timeout(Duration::from_millis(50)).is_ok() {
                break;
            }
            if let Some(status) = child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return Err(format!(
                    "exited with {status}: {}",
                    log.lock().unwrap().join("\n")
                ));
            }
            assert!(Instant::now() < deadline, "the daemon did not get ready");
        }
        let metrics = log.lock().unwrap().iter().find_map(|l| {
            let rest = l.split("metrics on ").nth(1)?;
            rest.split_whitespace().next().map(str::to_string)
        });
        Ok(Daemon {
            child,
            endpoint: endpoint.to_string(),
            metrics,
            log,
            reader: Some(reader),
        })
    }

    /// One metric's value from `/metrics`, e.g. `dsprep_steps{kind="held"}`.
    pub fn metric(&self, series: &str) -> f64 {
        let (value, body) = self.metric_if_any(series);
        value.unwrap_or_else(|| panic!("{series} not in:\n{body}"))
    }

    /// One metric's value from `/metrics` if the series is there, and the whole scrape.
    pub fn metric_if_any(&self, series: &str) -> (Option<f64>, String) {
        let url = self.metrics.as_ref().expect("metrics enabled");
        let body = http_get(url);
        let value = body.lines().find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        });
        (value, body)
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// SIGTERM, then wait: the daemon must exit successfully.
    pub fn terminate(&mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let status = self.child.wait().unwrap();
        // Every line the daemon wrote before it exited is in the log once this returns.
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        assert!(status.success(), "{status}: {}", self.log_text());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET over a TCP socket (the metrics endpoint is on loopback): the body.
pub fn http_get(url: &str) -> String {
    http_request(url, &[]).1
}

/// A GET with extra header lines (`"Authorization: Bearer …"`): the status line and the body.
pub fn http_request(url: &str, headers: &[&str]) -> (String, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http url");
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let mut stream = std::net::TcpStream::connect(host).expect("connect to metrics");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n").unwrap();
    for header in headers {
        write!(stream, "{header}\r\n").unwrap();
    }
    write!(stream, "\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

/// `dsprep tap` as a child process.
pub fn tap(
    endpoint: &str,
    rank: u32,
    world_size: u32,
    start_step: u64,
    steps: u64,
    out: &Path,
) -> Child {
    tap_with(endpoint, rank, world_size, start_step, steps, out, &[])
}

/// [`tap`] with more arguments (`--expect-chain HEX`, …).
pub fn tap_with(
    endpoint: &str,
    rank: u32,
    world_size: u32,
    start_step: u64,
    steps: u64,
    out: &Path,
    extra: &[&str],
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dsprep"))
        .args([
            "tap",
            "--endpoint",
            endpoint,
            "--rank",
            &rank.to_string(),
            "--world-size",
            &world_size.to_string(),
        ])
        .args([
            "--start-step",
            &start_step.to_string(),
            "--steps",
            &steps.to_string(),
            "--out",
            out.to_str().unwrap(),
        ])
        .args(["--timeout-s", "10"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dsprep tap")
}

pub fn headers(out: &Path) -> Vec<serde_json::Value> {
    let path = PathBuf::from(format!("{}.jsonl", out.display()));
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The stream chain before each window boundary `0..=windows` of a packed output, in hex,
/// computed here with sha2 from the packed bytes (FORMAT.md "Stream chain"): the reference a
/// served step's chain is held to.
pub fn chain_marks(packed: &dsprep_client::PackedDataset, windows: u64) -> Vec<String> {
    use sha2::{Digest, Sha256};
    let mut at = [0u8; 32];
    let mut marks = vec![hex::encode(at)];
    for w in 0..windows {
        let window = packed.window(w).unwrap();
        let digest = Sha256::digest(window.tokens.as_bytes());
        at = Sha256::digest([&at[..], &digest[..]].concat()).into();
        marks.push(hex::encode(at));
    }
    marks
}

/// Every step a tap wrote to `out` (its `.jsonl`) carries the chain of the packed stream at the
/// same windows (`marks` from [`chain_marks`]); returns how many steps were checked.
pub fn assert_tap_chains(out: &Path, marks: &[String]) -> usize {
    let lines = headers(out);
    let mut checked = 0;
    for h in lines.iter().filter(|h| h.get("chain").is_some()) {
        let at = |key: &str| h["chain"][key].as_str().unwrap().to_string();
        let (step, world, mb) = (
            h["step"].as_u64().unwrap(),
            h["world_size"].as_u64().unwrap(),
            h["micro_batch"].as_u64().unwrap(),
        );
        let first = h["first_window"].as_u64().unwrap() as usize;
        let step_first = (step * world * mb) as usize;
        let step_end = ((step + 1) * world * mb) as usize;
        assert_eq!(
            [
                at("step_start"),
                at("rows_start"),
                at("rows_end"),
                at("step_end")
            ],
            [
                marks[step_first].clone(),
                marks[first].clone(),
                marks[first + mb as usize].clone(),
                marks[step_end].clone()
            ],
            "{}: step {step}'s chain",
            out.display()
        );
        checked += 1;
    }
    checked
}

/// The token bytes rank `rank` must receive: its micro batch of every complete global step.
pub fn expected_rank_bytes(
    data: &PackedDataset,
    world: u64,
    micro_batch: u64,
    rank: u64,
) -> Vec<u8> {
    let steps = data.num_windows() / (world * micro_batch);
    let mut bytes = Vec::new();
    for step in 0..steps {
        for row in 0..micro_batch {
            let index = (step * world + rank) * micro_batch + row;
            bytes.extend_from_slice(data.window(index).unwrap().tokens.as_bytes());
        }
    }
    bytes
}

/// A `dsprep tap` for every rank of `world`, each on its node's daemon (ranks laid out node by
/// node over `daemons`), from step `start` for `steps` steps, all at once; waits for them, checks
/// each succeeded, and returns each rank's output file (raw token bytes; headers beside it).
/// `extra` goes to every tap (`--expect-chain HEX`, …).
pub fn tap_all(
    dir: &Path,
    daemons: &[&Daemon],
    world: u32,
    start: u64,
    steps: u64,
    tag: &str,
    extra: &[&str],
) -> Vec<PathBuf> {
    let per_node = world / daemons.len() as u32;
    let taps: Vec<_> = (0..world)
        .map(|rank| {
            let out = dir.join(format!("{tag}-r{rank}.bin"));
            let node = daemons[(rank / per_node) as usize];
            let child = tap_with(&node.endpoint, rank, world, start, steps, &out, extra);
            (rank, out, child)
        })
        .collect();
    taps.into_iter()
        .map(|(rank, out, child)| {
            let result = child.wait_with_output().unwrap();
            assert!(
                result.status.success(),
                "{tag}: rank {rank}: {}",
                String::from_utf8_lossy(&result.stderr)
            );
            out
        })
        .collect()
}

/// A protocol v3 batch request for rank 0 of `world_size` to `daemon`, which a daemon whose
/// windows may end in padding refuses (status 10): its message.
pub fn refused_v3(daemon: &Daemon, world_size: u32) -> String {
    use dsprep_client::protocol::{ReplyHeader, Request, RequestKind, Status};
    let context = zmq::Context::new();
    let socket = context.socket(zmq::DEALER).unwrap();
    socket.set_rcvtimeo(10_000).unwrap();
    socket.connect(&daemon.endpoint).unwrap();
    let request = Request {
        version: 3,
        kind: RequestKind::Batch,
        request_id: 7,
        rank: 0,
        world_size,
        step: 0,
        recipe_hash: None,
        owner: None,
    };
    socket.send(request.encode(), 0).unwrap();
    let frames = socket.recv_multipart(0).unwrap();
    let header = ReplyHeader::decode(&frames[0]).unwrap();
    assert_eq!(header.status, Status::UnsupportedVersion);
    String::from_utf8_lossy(&frames[1]).into_owned()
}
