//! What the daemon is doing, as OpenMetrics text (`prometheus-client`) on an HTTP endpoint
//! (`/metrics`): documents and
//! tokens per source (and split rows' pieces), realized vs target mix (per phase too),
//! shuffle-buffer fill, steps produced and held, per-rank step and lag, requests by outcome,
//! CURVE clients admitted and refused, and per Hub file read what it was checked against. Loopback unless asked; beyond loopback it needs a bearer
//! token (`--metrics-token-file`, compared in constant time; 401 without) or `--insecure-metrics`.

use super::owners::RefusalReason;
use super::store::StepStore;
use crate::driver::pipeline::ProducedDoc;
use crate::hub::VerificationLog;
use dsprep_mixers::ledger::{Counts, PhasePoints, share_lines};
use dsprep_mixers::mixer::share;
use dsprep_mixers::packer::PackingCounters;
use dsprep_mixers::recipe::{MixUnit, Recipe};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
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
    /// Requests refused their rank (`serve/owners.rs`): another live session owns it, or a
    /// later session superseded the asker's.
    pub owner_refused_owned: AtomicU64,
    pub owner_refused_superseded: AtomicU64,
    /// `best_fit`: the pool's capacity (the whole stream's), and per stream its packer; `None`
    /// with `concat`.
    pub packing: Option<(u64, PackerStates)>,
    /// The lineage segment whose recipe makes the documents now (`lineage.json`), and per
    /// source the documents that changes of course dropped (drawn, never emitted).
    pub segment: AtomicU64,
    pub dropped: std::sync::Mutex<BTreeMap<String, u64>>,
    /// Per (segment, source): the documents and tokens this daemon produced while that
    /// segment's recipe drew them.
    pub segment_counts: std::sync::Mutex<BTreeMap<(u64, usize), (u64, u64)>>,
    /// The trainers' loss reports (protocol v7) and `[mix.adaptive]`'s decisions.
    pub reports: Option<Arc<super::reports::Reports>>,
}

/// Per stream (lane; 0 without lanes), its packer's counters and pool fill as of its last chunk.
pub type PackerStates = std::sync::Mutex<BTreeMap<u32, (PackingCounters, u64)>>;

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
            owner_refused_owned: AtomicU64::new(0),
            owner_refused_superseded: AtomicU64::new(0),
            packing: (recipe.packing.pool_documents())
                .map(|pool| (pool as u64, Default::default())),
            segment: AtomicU64::new(0),
            dropped: Default::default(),
            segment_counts: Default::default(),
            reports: None,
        }
    }

    /// Lineage segment `k` has taken over, dropping `dropped` (per source name).
    pub fn segment_began(&self, k: usize, dropped: &[(String, u64)]) {
        self.segment.store(k as u64, Relaxed);
        self.count_dropped(dropped);
    }

    /// One of this node's lanes runs lineage segment `k` (from its start, or taking over there,
    /// dropping `dropped`): the node's segment is its lanes' newest.
    pub fn lane_segment_began(&self, k: usize, dropped: &[(String, u64)]) {
        self.segment.fetch_max(k as u64, Relaxed);
        self.count_dropped(dropped);
    }

    fn count_dropped(&self, dropped: &[(String, u64)]) {
        let mut all = self.dropped.lock().unwrap_or_else(|p| p.into_inner());
        for (name, n) in dropped {
            *all.entry(name.clone()).or_insert(0) += n;
        }
    }

    /// Lane `lane`'s packer as of its last chunk (`best_fit`).
    pub fn set_packing(&self, lane: u32, counters: &PackingCounters, pool_documents: usize) {
        if let Some((_, streams)) = &self.packing {
            let mut streams = streams.lock().unwrap_or_else(|p| p.into_inner());
            streams.insert(lane, (*counters, pool_documents as u64));
        }
    }

    /// Count one produced document (the packer's, in lane `lane`) in its source, its phase and,
    /// when it is a piece of a split row, the split counters.
    pub fn count_document(&self, lane: u32, doc: &ProducedDoc) {
        self.count_document_in(lane, self.segment.load(Relaxed), doc);
    }

    /// [`Metrics::count_document`] of a document lineage segment `segment` drew (a lane's: a
    /// node's lanes may run different segments).
    pub fn count_document_in(&self, lane: u32, segment: u64, doc: &ProducedDoc) {
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
        let mut counts = self
            .segment_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (documents, tokens) = counts.entry((segment, i)).or_insert((0, 0));
        *documents += 1;
        *tokens += doc.tokens;
    }

    /// A request refused its rank, for `reason`.
    pub fn count_owner_refused(&self, reason: RefusalReason) {
        match reason {
            RefusalReason::Owned => &self.owner_refused_owned,
            RefusalReason::Superseded => &self.owner_refused_superseded,
        }
        .fetch_add(1, Relaxed);
    }

    pub fn count_reply(&self, status: &'static str) {
        let mut replies = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        *replies.entry(status).or_insert(0) += 1;
    }

    /// The exposition of one scrape, in OpenMetrics text (`prometheus-client` encodes it: names,
    /// label escaping, `# EOF`). Counters are registered without their `_total`, which the
    /// encoding adds back: the series are `dsprep_documents_total{source="…"}` and so on.
    pub fn render(&self, store: &StepStore, shuffle_fill: u64) -> String {
        let mut scrape = Scrape::default();
        let docs: Vec<u64> = self.documents.iter().map(|d| d.load(Relaxed)).collect();
        let tokens: Vec<u64> = self.tokens.iter().map(|t| t.load(Relaxed)).collect();
        let per_source = |values: &[u64]| -> Vec<(Labels, u64)> {
            (self.source_names.iter().zip(values))
                .map(|(name, &v)| (labels(&[("source", name)]), v))
                .collect()
        };
        let loaded = |counters: &[AtomicU64]| -> Vec<u64> {
            counters.iter().map(|c| c.load(Relaxed)).collect()
        };
        let (node, count) = (self.node.0.to_string(), self.node.1.to_string());
        scrape.gauge(
            "dsprep_node",
            "This daemon's node rank and the node count (always 1)",
            [(labels(&[("rank", &node), ("count", &count)]), 1)],
        );
        scrape.gauge(
            "dsprep_lanes_run",
            "Lanes of the recipe this node runs (0 without [lanes])",
            [(Labels::new(), self.lanes.len() as i64)],
        );
        scrape.gauge(
            "dsprep_input_bytes_assigned",
            "Bytes of the input units dealt to this node's lanes (0 without [lanes])",
            [(Labels::new(), self.input_bytes_assigned as i64)],
        );
        let verified: Vec<(Labels, i64)> = (VerificationLog::process().all().iter())
            .map(|(file, word)| (labels(&[("file", file), ("verified", word)]), 1))
            .collect();
        scrape.gauge(
            "dsprep_hub_input_verified",
            "Hub files read so far, one series each, labelled with what their bytes were checked \
             against, as the manifest's inputs say it (sha256, git-blob-sha1, page-crc, page-crc \
             M/N, none)",
            verified,
        );
        scrape.gauge(
            "dsprep_lineage_segment",
            "The lineage segment (0: the first recipe) whose recipe makes the documents now",
            [(Labels::new(), self.segment.load(Relaxed) as i64)],
        );
        let dropped: Vec<(Labels, u64)> = {
            let dropped = self.dropped.lock().unwrap_or_else(|p| p.into_inner());
            (self.source_names.iter())
                .map(|name| {
                    let n = dropped.get(name).copied().unwrap_or(0);
                    (labels(&[("source", name)]), n)
                })
                .collect()
        };
        let (segment_documents, segment_tokens): (Series, Series) = {
            let counts = self
                .segment_counts
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            (counts.iter())
                .filter_map(|(&(segment, i), &(documents, tokens))| {
                    let name = self.source_names.get(i)?;
                    let l = labels(&[("segment", &segment.to_string()), ("source", name)]);
                    Some(((l.clone(), documents), (l, tokens)))
                })
                .unzip()
        };
        scrape.counter(
            "dsprep_segment_documents",
            "Documents produced per lineage segment (whose recipe drew them) and source",
            segment_documents,
        );
        scrape.counter(
            "dsprep_segment_tokens",
            "Tokens produced per lineage segment and source (BOS/EOS included)",
            segment_tokens,
        );
        scrape.counter(
            "dsprep_lineage_dropped_documents",
            "Documents drawn but never emitted because a change of course stopped their source",
            dropped,
        );
        scrape.counter(
            "dsprep_documents",
            "Documents tokenized, per source",
            per_source(&docs),
        );
        scrape.counter(
            "dsprep_tokens",
            "Tokens produced, per source (BOS/EOS included)",
            per_source(&tokens),
        );
        scrape.counter(
            "dsprep_rows_split",
            "Rows over max_document_bytes cut into pieces (oversize = \"split\"), per source",
            per_source(&loaded(&self.rows_split)),
        );
        scrape.counter(
            "dsprep_split_pieces",
            "Pieces of split rows produced, per source (each also one of dsprep_documents_total)",
            per_source(&loaded(&self.split_pieces)),
        );
        for (metric, help, counts, unit) in [
            (
                "dsprep_mix_fraction",
                "Share of documents per source: realized, and the target where the recipe mixes \
                 in documents",
                &docs,
                MixUnit::Documents,
            ),
            (
                "dsprep_mix_token_fraction",
                "Share of tokens per source: realized, and the target where the recipe mixes in \
                 tokens",
                &tokens,
                MixUnit::Tokens,
            ),
        ] {
            let total: u64 = counts.iter().sum();
            let mut samples = Vec::new();
            for (i, name) in self.source_names.iter().enumerate() {
                let realized = share(counts[i], total);
                samples.push((labels(&[("source", name), ("kind", "realized")]), realized));
                if self.unit == unit {
                    let target = self.target_fractions[i];
                    samples.push((labels(&[("source", name), ("kind", "target")]), target));
                }
            }
            scrape.fraction(metric, help, samples);
        }
        self.render_phases(&mut scrape);
        if let Some(reports) = &self.reports {
            reports.render(&mut scrape);
        }
        let total_tokens: u64 = tokens.iter().sum();
        scrape.value(
            "dsprep_tokens_per_second",
            "Tokens produced per second since start",
            total_tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9),
        );
        scrape.gauge(
            "dsprep_shuffle_buffer_documents",
            "Documents in the shuffle buffer, and its capacity",
            [
                (labels(&[("kind", "fill")]), shuffle_fill as i64),
                (
                    labels(&[("kind", "capacity")]),
                    self.shuffle_capacity as i64,
                ),
            ],
        );
        self.render_packing(&mut scrape);
        let s = store.snapshot();
        scrape.gauge(
            "dsprep_steps",
            "Global steps: produced so far, held in memory (the queue depth), total once known \
             (-1 before)",
            [
                (labels(&[("kind", "produced")]), s.produced as i64),
                (labels(&[("kind", "held")]), s.held as i64),
                (
                    labels(&[("kind", "total")]),
                    s.num_steps.map_or(-1, |n| n as i64),
                ),
            ],
        );
        let fastest = s.positions.iter().copied().max().unwrap_or(0);
        let per_rank = |value: &dyn Fn(u64) -> u64| -> Vec<(Labels, i64)> {
            (s.positions.iter().enumerate())
                .map(|(rank, &p)| {
                    let rank = (rank + self.first_rank as usize).to_string();
                    (labels(&[("rank", &rank)]), value(p) as i64)
                })
                .collect()
        };
        scrape.gauge(
            "dsprep_rank_step",
            "The step each rank asked for last",
            per_rank(&|p| p),
        );
        scrape.gauge(
            "dsprep_rank_lag_steps",
            "Steps each rank is behind the fastest rank",
            per_rank(&|p| fastest - p),
        );
        let replies: Vec<(Labels, u64)> = self
            .replies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(status, &n)| (labels(&[("status", status)]), n))
            .collect();
        scrape.counter("dsprep_replies", "Requests answered, by status.", replies);
        scrape.counter(
            "dsprep_owner_refused",
            "Requests refused their rank: owned (another live trainer session holds it), \
             superseded (a session that started later holds it: the asker's job was replaced)",
            [RefusalReason::Owned, RefusalReason::Superseded].map(|reason| {
                let count = match reason {
                    RefusalReason::Owned => &self.owner_refused_owned,
                    RefusalReason::Superseded => &self.owner_refused_superseded,
                };
                (labels(&[("reason", reason.label())]), count.load(Relaxed))
            }),
        );
        let auth = &self.auth;
        scrape.gauge(
            "dsprep_auth_curve",
            "1 when the daemon serves with CURVE (--curve-secret-key), else 0",
            [(Labels::new(), i64::from(auth.curve))],
        );
        scrape.counter(
            "dsprep_auth_accepted",
            "CURVE handshakes the ZAP handler let in (an allowed client public key)",
            [(Labels::new(), auth.accepted.load(Relaxed))],
        );
        scrape.counter(
            "dsprep_auth_refused",
            "Clients refused: key_not_allowed (a CURVE public key not in --curve-allow), \
             handshake_failed (no CURVE, or another server public key)",
            [
                (
                    labels(&[("reason", "key_not_allowed")]),
                    auth.refused_key.load(Relaxed),
                ),
                (
                    labels(&[("reason", "handshake_failed")]),
                    auth.refused_handshake.load(Relaxed),
                ),
            ],
        );
        scrape.encode()
    }
}

impl Metrics {
    /// The ledger per phase: the documents and tokens produced in it per source (counters), and
    /// per source its target, realized shares of tokens and of documents, and the deviation (in
    /// the recipe's unit) as `dsprep_phase_mix{phase,source,kind}`.
    /// `best_fit`'s counters over this daemon's streams, and its pools' fill.
    fn render_packing(&self, scrape: &mut Scrape) {
        let Some((capacity, streams)) = &self.packing else {
            return;
        };
        let streams = streams.lock().unwrap_or_else(|p| p.into_inner());
        let mut total = PackingCounters::default();
        let mut fill = 0;
        for (counters, pool) in streams.values() {
            total.add(counters);
            fill += pool;
        }
        for (name, help, value) in [
            (
                "dsprep_documents_cut",
                "Documents longer than a window cut into window-sized pieces (best_fit cuts no \
                 other), in the streams this daemon runs",
                total.documents_cut,
            ),
            (
                "dsprep_padding_tokens",
                "Pad tokens written after windows' last documents (best_fit)",
                total.padding_tokens,
            ),
        ] {
            scrape.counter(name, help, [(Labels::new(), value)]);
        }
        scrape.gauge(
            "dsprep_packing_pool_documents",
            "Documents waiting in the best_fit pools of this daemon's streams, and the recipe's \
             pool (the whole stream's)",
            [
                (labels(&[("kind", "fill")]), fill as i64),
                (labels(&[("kind", "capacity")]), *capacity as i64),
            ],
        );
    }

    fn render_phases(&self, scrape: &mut Scrape) {
        let load = |counters: &Vec<AtomicU64>| counters.iter().map(|c| c.load(Relaxed)).collect();
        let counts: Vec<Counts> = (self.phase_tokens.iter().zip(&self.phase_documents))
            .map(|(tokens, documents)| Counts {
                tokens: load(tokens),
                documents: load(documents),
            })
            .collect();
        for (metric, help, documents) in [
            (
                "dsprep_phase_documents",
                "Documents produced per phase and source (a document is in the phase in force \
                 where it starts)",
                true,
            ),
            (
                "dsprep_phase_tokens",
                "Tokens produced per phase and source (BOS/EOS included)",
                false,
            ),
        ] {
            let mut samples = Vec::new();
            for (phase, c) in counts.iter().enumerate() {
                let values = if documents { &c.documents } else { &c.tokens };
                let phase = phase.to_string();
                for (name, &v) in self.source_names.iter().zip(values) {
                    samples.push((labels(&[("phase", &phase), ("source", name)]), v));
                }
            }
            scrape.counter(metric, help, samples);
        }
        let mut samples = Vec::new();
        for (phase, c) in counts.iter().enumerate() {
            let lines = share_lines(c, &self.phase_targets[phase], self.unit);
            let phase = phase.to_string();
            for (name, line) in self.source_names.iter().zip(lines) {
                for (kind, value) in [
                    ("target", line.target),
                    ("tokens", line.token_share),
                    ("documents", line.document_share),
                    ("deviation", line.deviation),
                ] {
                    let set = labels(&[("phase", &phase), ("source", name), ("kind", kind)]);
                    samples.push((set, value));
                }
            }
        }
        scrape.fraction(
            "dsprep_phase_mix",
            "Per phase and source: the target share (in the recipe's unit), the realized share of \
             tokens and of documents, and the deviation (realized minus target, in the recipe's \
             unit)",
            samples,
        );
    }
}

/// A series' labels, in the order they are written.
pub(super) type Labels = Vec<(String, String)>;
/// One family's series: each one's labels and value.
type Series = Vec<(Labels, u64)>;

pub(super) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One scrape: a registry filled with this moment's values, then encoded.
#[derive(Default)]
pub(super) struct Scrape {
    registry: Registry,
}

impl Scrape {
    /// A counter family (`name` without `_total`).
    pub(super) fn counter(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let family = Family::<Labels, Counter>::default();
        for (set, value) in samples {
            family.get_or_create(&set).inc_by(value);
        }
        self.registry.register(name, help, family);
    }

    /// A gauge family of whole numbers.
    fn gauge(&mut self, name: &str, help: &str, samples: impl IntoIterator<Item = (Labels, i64)>) {
        let family = Family::<Labels, Gauge>::default();
        for (set, value) in samples {
            family.get_or_create(&set).set(value);
        }
        self.registry.register(name, help, family);
    }

    /// A gauge family of fractions.
    pub(super) fn fraction(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for (set, value) in samples {
            family.get_or_create(&set).set(value);
        }
        self.registry.register(name, help, family);
    }

    /// One gauge without labels.
    fn value(&mut self, name: &str, help: &str, value: f64) {
        let gauge = Gauge::<f64, AtomicU64>::default();
        gauge.set(value);
        self.registry.register(name, help, gauge);
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
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
                let header = tiny_http::Header::from_bytes(
                    "Content-Type",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
                .expect("a valid static header");
                let _ = request.respond(tiny_http::Response::from_string(body).with_header(header));
            }
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_scrape_encodes_counters_with_total_and_escapes_label_values() {
        let mut scrape = Scrape::default();
        scrape.counter(
            "dsprep_documents",
            "Documents tokenized, per source",
            [(labels(&[("source", "we\"b\\x")]), 7)],
        );
        scrape.gauge("dsprep_lanes_run", "Lanes", [(Labels::new(), 3)]);
        assert_eq!(
            scrape.encode(),
            "# HELP dsprep_documents Documents tokenized, per source.\n\
             # TYPE dsprep_documents counter\n\
             dsprep_documents_total{source=\"we\\\"b\\\\x\"} 7\n\
             # HELP dsprep_lanes_run Lanes.\n\
             # TYPE dsprep_lanes_run gauge\n\
             dsprep_lanes_run 3\n\
             # EOF\n"
        );
    }

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
