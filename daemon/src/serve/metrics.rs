//! What the daemon is doing, as Prometheus text on an HTTP endpoint (`/metrics`): documents and
//! tokens per source (and split rows' pieces), realized vs target mix (per phase too),
//! shuffle-buffer fill, steps produced and held, per-rank step and lag, requests by outcome,
//! CURVE clients admitted and refused. Loopback unless asked; beyond loopback it needs a bearer
//! token (`--metrics-token-file`, compared in constant time; 401 without) or `--insecure-metrics`.

use super::store::StepStore;
use crate::driver::pipeline::ProducedDoc;
use dsprep_mixers::ledger::{Counts, PhasePoints, share_lines};
use dsprep_mixers::mixer::share;
use dsprep_mixers::recipe::{MixUnit, Recipe};
use sha2::{Digest, Sha256};
use std::fmt::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

pub struct Metrics {
    pub source_names: Vec<String>,
    pub target_fractions: Vec<f64>,
    /// What the targets are shares of (`[mix] unit`).
    pub unit: MixUnit,
    pub documents: Vec<AtomicU64>,
    pub tokens: Vec<AtomicU64>,
    /// Per source: rows cut into pieces (`oversize = "split"`) and the pieces, as produced.
    pub rows_split: Vec<AtomicU64>,
    pub split_pieces: Vec<AtomicU64>,
    pub shuffle_capacity: u64,
    /// Requests answered, by reply status name.
    pub replies: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    pub started: Instant,
    /// (node rank, node count) of this daemon.
    pub node: (u32, u32),
    /// The first rank this node serves (ranks are labelled globally).
    pub first_rank: u32,
    /// With `[lanes]`: the lanes this node runs and the bytes of their input units.
    pub lanes: Vec<u32>,
    pub input_bytes_assigned: u64,
    /// Where each phase begins in every lane's stream, each phase's targets, and per phase and
    /// source the documents this daemon produced and their tokens (a document counts in the
    /// phase in force where it starts: `dsprep_mixers::ledger`).
    pub phases: PhasePoints,
    pub phase_targets: Vec<Vec<f64>>,
    pub phase_documents: Vec<Vec<AtomicU64>>,
    pub phase_tokens: Vec<Vec<AtomicU64>>,
    /// CURVE handshakes admitted and refused (`serve/auth.rs`).
    pub auth: AuthCounters,
}

/// What the CURVE authenticator decided.
#[derive(Default)]
pub struct AuthCounters {
    /// Whether the daemon serves with CURVE (the counters stay 0 without).
    pub curve: bool,
    accepted: AtomicU64,
    /// ZAP refusals: a key not in the allow list (or a request that is not CURVE).
    refused_key: AtomicU64,
    /// Handshakes that failed before ZAP: no CURVE, or another server public key.
    refused_handshake: AtomicU64,
}

impl AuthCounters {
    pub fn count_accepted(&self) {
        self.accepted.fetch_add(1, Relaxed);
    }

    pub fn count_refused_key(&self) {
        self.refused_key.fetch_add(1, Relaxed);
    }

    pub fn count_refused_handshake(&self) {
        self.refused_handshake.fetch_add(1, Relaxed);
    }
}

impl Metrics {
    pub fn new(recipe: &Recipe) -> Self {
        let n = recipe.sources.len();
        let phases = PhasePoints::new(recipe);
        let counters = |_| (0..n).map(|_| AtomicU64::new(0)).collect();
        let phase_targets = recipe.phase_targets();
        Self {
            source_names: recipe.sources.iter().map(|s| s.name.clone()).collect(),
            target_fractions: phase_targets[0].clone(),
            unit: recipe.mix.unit,
            phase_documents: (0..phases.num_phases()).map(counters).collect(),
            phase_tokens: (0..phases.num_phases()).map(counters).collect(),
            phases,
            phase_targets,
            documents: (0..n).map(|_| AtomicU64::new(0)).collect(),
            tokens: (0..n).map(|_| AtomicU64::new(0)).collect(),
            rows_split: (0..n).map(|_| AtomicU64::new(0)).collect(),
            split_pieces: (0..n).map(|_| AtomicU64::new(0)).collect(),
            shuffle_capacity: recipe.shuffle.buffer_size as u64,
            replies: Default::default(),
            started: Instant::now(),
            node: (0, 1),
            first_rank: 0,
            lanes: Vec::new(),
            input_bytes_assigned: 0,
            auth: AuthCounters::default(),
        }
    }

    /// Count one produced document (the packer's, in lane `lane`) in its source, its phase and,
    /// when it is a piece of a split row, the split counters.
    pub fn count_document(&self, lane: u32, doc: &ProducedDoc) {
        let i = doc.source as usize;
        let phase = self.phases.phase_at(lane, doc.start_tokens);
        self.documents[i].fetch_add(1, Relaxed);
        self.tokens[i].fetch_add(doc.tokens, Relaxed);
        self.phase_documents[phase][i].fetch_add(1, Relaxed);
        self.phase_tokens[phase][i].fetch_add(doc.tokens, Relaxed);
        if doc.piece == 1 {
            self.rows_split[i].fetch_add(1, Relaxed);
        }
        if doc.piece >= 1 {
            self.split_pieces[i].fetch_add(1, Relaxed);
        }
    }

    pub fn count_reply(&self, status: &'static str) {
        let mut replies = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        *replies.entry(status).or_insert(0) += 1;
    }

    pub fn render(&self, store: &StepStore, shuffle_fill: u64) -> String {
        let mut out = String::new();
        let docs: Vec<u64> = self.documents.iter().map(|d| d.load(Relaxed)).collect();
        let total_tokens: u64 = self.tokens.iter().map(|t| t.load(Relaxed)).sum();
        let gauge = |out: &mut String, name: &str, help: &str, kind: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        gauge(
            &mut out,
            "dsprep_node",
            "This daemon's node rank and the node count (always 1).",
            "gauge",
        );
        let _ = writeln!(
            out,
            "dsprep_node{{rank=\"{}\",count=\"{}\"}} 1",
            self.node.0, self.node.1
        );
        gauge(
            &mut out,
            "dsprep_lanes_run",
            "Lanes of the recipe this node runs (0 without [lanes]).",
            "gauge",
        );
        let _ = writeln!(out, "dsprep_lanes_run {}", self.lanes.len());
        gauge(
            &mut out,
            "dsprep_input_bytes_assigned",
            "Bytes of the input units dealt to this node's lanes (0 without [lanes]).",
            "gauge",
        );
        let _ = writeln!(
            out,
            "dsprep_input_bytes_assigned {}",
            self.input_bytes_assigned
        );
        gauge(
            &mut out,
            "dsprep_documents_total",
            "Documents tokenized, per source.",
            "counter",
        );
        for (name, d) in self.source_names.iter().zip(&docs) {
            let _ = writeln!(out, "dsprep_documents_total{{source=\"{name}\"}} {d}");
        }
        gauge(
            &mut out,
            "dsprep_tokens_total",
            "Tokens produced, per source (BOS/EOS included).",
            "counter",
        );
        for (name, t) in self.source_names.iter().zip(&self.tokens) {
            let _ = writeln!(
                out,
                "dsprep_tokens_total{{source=\"{name}\"}} {}",
                t.load(Relaxed)
            );
        }
        for (metric, help, counts) in [
            (
                "dsprep_rows_split_total",
                "Rows over max_document_bytes cut into pieces (oversize = \"split\"), per source.",
                &self.rows_split,
            ),
            (
                "dsprep_split_pieces_total",
                "Pieces of split rows produced, per source (each also one of \
                 dsprep_documents_total).",
                &self.split_pieces,
            ),
        ] {
            gauge(&mut out, metric, help, "counter");
            for (name, n) in self.source_names.iter().zip(counts) {
                let _ = writeln!(out, "{metric}{{source=\"{name}\"}} {}", n.load(Relaxed));
            }
        }
        let tokens: Vec<u64> = self.tokens.iter().map(|t| t.load(Relaxed)).collect();
        for (metric, help, counts, unit) in [
            (
                "dsprep_mix_fraction",
                "Share of documents per source: realized, and the target where the recipe mixes \
                 in documents.",
                &docs,
                MixUnit::Documents,
            ),
            (
                "dsprep_mix_token_fraction",
                "Share of tokens per source: realized, and the target where the recipe mixes in \
                 tokens.",
                &tokens,
                MixUnit::Tokens,
            ),
        ] {
            gauge(&mut out, metric, help, "gauge");
            let total: u64 = counts.iter().sum();
            for (i, name) in self.source_names.iter().enumerate() {
                let realized = share(counts[i], total);
                let _ = writeln!(
                    out,
                    "{metric}{{source=\"{name}\",kind=\"realized\"}} {realized}"
                );
                if self.unit == unit {
                    let _ = writeln!(
                        out,
                        "{metric}{{source=\"{name}\",kind=\"target\"}} {}",
                        self.target_fractions[i]
                    );
                }
            }
        }
        self.render_phases(&mut out);
        gauge(
            &mut out,
            "dsprep_tokens_per_second",
            "Tokens produced per second since start.",
            "gauge",
        );
        let _ = writeln!(
            out,
            "dsprep_tokens_per_second {}",
            total_tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
        );
        gauge(
            &mut out,
            "dsprep_shuffle_buffer_documents",
            "Documents in the shuffle buffer, and its capacity.",
            "gauge",
        );
        let _ = writeln!(
            out,
            "dsprep_shuffle_buffer_documents{{kind=\"fill\"}} {shuffle_fill}"
        );
        let _ = writeln!(
            out,
            "dsprep_shuffle_buffer_documents{{kind=\"capacity\"}} {}",
            self.shuffle_capacity
        );
        let s = store.snapshot();
        gauge(
            &mut out,
            "dsprep_steps",
            "Global steps: produced so far, held in memory (the queue depth), total once known (-1 before).",
            "gauge",
        );
        let _ = writeln!(out, "dsprep_steps{{kind=\"produced\"}} {}", s.produced);
        let _ = writeln!(out, "dsprep_steps{{kind=\"held\"}} {}", s.held);
        let _ = writeln!(
            out,
            "dsprep_steps{{kind=\"total\"}} {}",
            s.num_steps.map(|n| n as i64).unwrap_or(-1)
        );
        gauge(
            &mut out,
            "dsprep_rank_step",
            "The step each rank asked for last.",
            "gauge",
        );
        for (rank, p) in s.positions.iter().enumerate() {
            let rank = rank + self.first_rank as usize;
            let _ = writeln!(out, "dsprep_rank_step{{rank=\"{rank}\"}} {p}");
        }
        gauge(
            &mut out,
            "dsprep_rank_lag_steps",
            "Steps each rank is behind the fastest rank.",
            "gauge",
        );
        let fastest = s.positions.iter().copied().max().unwrap_or(0);
        for (rank, p) in s.positions.iter().enumerate() {
            let rank = rank + self.first_rank as usize;
            let _ = writeln!(
                out,
                "dsprep_rank_lag_steps{{rank=\"{rank}\"}} {}",
                fastest - p
            );
        }
        gauge(
            &mut out,
            "dsprep_replies_total",
            "Requests answered, by status.",
            "counter",
        );
        for (status, n) in self
            .replies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(out, "dsprep_replies_total{{status=\"{status}\"}} {n}");
        }
        let auth = &self.auth;
        gauge(
            &mut out,
            "dsprep_auth_curve",
            "1 when the daemon serves with CURVE (--curve-secret-key), else 0.",
            "gauge",
        );
        let _ = writeln!(out, "dsprep_auth_curve {}", u8::from(auth.curve));
        gauge(
            &mut out,
            "dsprep_auth_accepted_total",
            "CURVE handshakes the ZAP handler let in (an allowed client public key).",
            "counter",
        );
        let _ = writeln!(
            out,
            "dsprep_auth_accepted_total {}",
            auth.accepted.load(Relaxed)
        );
        gauge(
            &mut out,
            "dsprep_auth_refused_total",
            "Clients refused: key_not_allowed (a CURVE public key not in --curve-allow), \
             handshake_failed (no CURVE, or another server public key).",
            "counter",
        );
        let _ = writeln!(
            out,
            "dsprep_auth_refused_total{{reason=\"key_not_allowed\"}} {}",
            auth.refused_key.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "dsprep_auth_refused_total{{reason=\"handshake_failed\"}} {}",
            auth.refused_handshake.load(Relaxed)
        );
        out
    }
}

impl Metrics {
    /// The ledger per phase: the documents and tokens produced in it per source (counters), and
    /// per source its target, realized shares of tokens and of documents, and the deviation (in
    /// the recipe's unit) as `dsprep_phase_mix{phase,source,kind}`.
    fn render_phases(&self, out: &mut String) {
        let load = |counters: &Vec<AtomicU64>| counters.iter().map(|c| c.load(Relaxed)).collect();
        let counts: Vec<Counts> = (self.phase_tokens.iter().zip(&self.phase_documents))
            .map(|(tokens, documents)| Counts {
                tokens: load(tokens),
                documents: load(documents),
            })
            .collect();
        for (metric, help, documents) in [
            (
                "dsprep_phase_documents_total",
                "Documents produced per phase and source (a document is in the phase in force \
                 where it starts).",
                true,
            ),
            (
                "dsprep_phase_tokens_total",
                "Tokens produced per phase and source (BOS/EOS included).",
                false,
            ),
        ] {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} counter");
            for (phase, c) in counts.iter().enumerate() {
                let values = if documents { &c.documents } else { &c.tokens };
                for (name, v) in self.source_names.iter().zip(values) {
                    let _ = writeln!(out, "{metric}{{phase=\"{phase}\",source=\"{name}\"}} {v}");
                }
            }
        }
        let metric = "dsprep_phase_mix";
        let _ = writeln!(
            out,
            "# HELP {metric} Per phase and source: the target share (in the recipe's unit), the \
             realized share of tokens and of documents, and the deviation (realized minus target, \
             in the recipe's unit).\n# TYPE {metric} gauge"
        );
        for (phase, c) in counts.iter().enumerate() {
            let lines = share_lines(c, &self.phase_targets[phase], self.unit);
            for (name, line) in self.source_names.iter().zip(lines) {
                for (kind, value) in [
                    ("target", line.target),
                    ("tokens", line.token_share),
                    ("documents", line.document_share),
                    ("deviation", line.deviation),
                ] {
                    let _ = writeln!(
                        out,
                        "{metric}{{phase=\"{phase}\",source=\"{name}\",kind=\"{kind}\"}} {value}"
                    );
                }
            }
        }
    }
}

/// A bearer token `/metrics` requires (`--metrics-token-file`): kept as its sha256, so the
/// comparison takes the same time whatever the bytes sent.
pub struct MetricsToken {
    digest: [u8; 32],
}

impl MetricsToken {
    /// The file's text, blanks around it trimmed (as Prometheus reads `credentials_file`).
    pub fn read(path: &Path) -> anyhow::Result<MetricsToken> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("--metrics-token-file {}: cannot read: {e}", path.display())
        })?;
        let token = text.trim();
        anyhow::ensure!(
            !token.is_empty(),
            "--metrics-token-file {} is empty: put a long random token in it (e.g. `openssl rand \
             -hex 32`), the same file the scraper sends as its bearer token",
            path.display()
        );
        Ok(MetricsToken {
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    /// Whether an `Authorization` header value carries the token (`Bearer TOKEN`).
    fn admits(&self, authorization: Option<&str>) -> bool {
        let Some((scheme, credentials)) = authorization.and_then(|v| v.trim().split_once(' '))
        else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(credentials.trim().as_bytes()).into();
        let differing = digest
            .iter()
            .zip(&self.digest)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        scheme.eq_ignore_ascii_case("bearer") & (differing == 0)
    }
}

/// A metrics address beyond loopback must be protected by a token, or its exposure accepted
/// with `--insecure-metrics`: checked before anything is bound.
pub fn check_address(addr: SocketAddr, token: bool, insecure: bool) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || token || insecure {
        return Ok(());
    }
    anyhow::bail!(
        "--metrics {addr} is not a loopback address: anyone who can reach it would read the \
         daemon's counters (recipe hash, rank positions, sources). Give --metrics-token-file FILE \
         (scrapers then send `Authorization: Bearer <token>`, as Prometheus' `authorization: \
         credentials_file` does), bind 127.0.0.1, or pass --insecure-metrics to accept that"
    )
}

/// Serve `/metrics` on `addr` from a thread; returns the bound address (port 0 picks one).
/// With a token, a request without it gets 401 and nothing else.
pub fn spawn_http(
    addr: SocketAddr,
    token: Option<MetricsToken>,
    metrics: Arc<Metrics>,
    store: Arc<StepStore>,
    shuffle_fill: Arc<AtomicU64>,
) -> anyhow::Result<SocketAddr> {
    if !addr.ip().is_loopback() && token.is_none() {
        tracing::warn!(
            "METRICS ON A NON-LOOPBACK ADDRESS ({addr}) WITHOUT A TOKEN: any host that can reach \
             it reads the daemon's counters (recipe hash, rank positions, sources); bind \
             127.0.0.1 or give --metrics-token-file unless a scraper on a trusted network needs it"
        );
    }
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow::anyhow!("metrics server has no IP address"))?;
    std::thread::Builder::new()
        .name("dsprep-metrics".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                if let Some(token) = &token {
                    let authorization = request
                        .headers()
                        .iter()
                        .find(|h| h.field.equiv("Authorization"))
                        .map(|h| h.value.as_str());
                    if !token.admits(authorization) {
                        let challenge = tiny_http::Header::from_bytes(
                            "WWW-Authenticate",
                            "Bearer realm=\"dsprep metrics\"",
                        )
                        .expect("a valid static header");
                        let body = "401 unauthorized: send `Authorization: Bearer <token>` with \
                                    the token of the daemon's --metrics-token-file\n";
                        let _ = request.respond(
                            tiny_http::Response::from_string(body)
                                .with_status_code(401)
                                .with_header(challenge),
                        );
                        continue;
                    }
                }
                let body = metrics.render(&store, shuffle_fill.load(Relaxed));
                let header =
                    tiny_http::Header::from_bytes("Content-Type", "text/plain; version=0.0.4")
                        .expect("a valid static header");
                let _ = request.respond(tiny_http::Response::from_string(body).with_header(header));
            }
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_a_bearer_token_compared_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret-token\n").expect("write");
        let token = MetricsToken::read(&path).expect("token");
        assert!(token.admits(Some("Bearer s3cret-token")));
        assert!(token.admits(Some("bearer s3cret-token")));
        for refused in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer s3cret"),
            Some("Bearer s3cret-token2"),
            Some("Basic s3cret-token"),
        ] {
            assert!(!token.admits(refused), "{refused:?}");
        }
        std::fs::write(&path, " \n").expect("write");
        let err = MetricsToken::read(&path).err().expect("empty");
        assert!(err.to_string().contains("is empty"), "{err}");
    }

    #[test]
    fn beyond_loopback_metrics_need_a_token_or_insecure_metrics() {
        let open: SocketAddr = "0.0.0.0:9187".parse().expect("addr");
        let local: SocketAddr = "127.0.0.1:9187".parse().expect("addr");
        assert!(check_address(local, false, false).is_ok());
        assert!(check_address(open, true, false).is_ok());
        assert!(check_address(open, false, true).is_ok());
        let err = check_address(open, false, false).expect_err("refused");
        assert!(
            err.to_string().starts_with(
                "--metrics 0.0.0.0:9187 is not a loopback address: anyone who can reach it would \
                 read the daemon's counters"
            ),
            "{err}"
        );
    }
}
