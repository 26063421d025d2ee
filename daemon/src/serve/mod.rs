//! `dsprep serve`: the loader daemon. Runs the same pipeline as `dsprep pack` and serves each
//! data-parallel rank its slice of every global step over ZeroMQ (wire protocol v3, PROTOCOL.md),
//! each trainer rank to one process (`owners.rs`).
//!
//! Threads: the pipeline (reader, tokenizers, and a producer that packs windows into global
//! steps) fills the [`store::StepStore`]; one server thread owns the ROUTER socket; a metrics
//! thread answers `/metrics`; with CURVE, a ZAP handler thread admits the allowed clients
//! (`auth.rs`). Graceful shutdown on SIGINT/SIGTERM.

mod adaptive;
pub mod args;
pub mod auth;
mod course;
pub mod endpoint;
mod metrics;
mod nodes;
mod owners;
mod placement;
mod producer;
mod reports;
mod server;
pub mod store;

pub use args::ServeArgs;
pub use course::read_lineage;
pub use nodes::{NodeOrigin, NodePlace};

use crate::checkpoint::LaneCheckpoints;
use crate::driver::load_recipe_with;
use crate::driver::pipeline::{MixDecider, PipelineConfig};
use anyhow::{Context, anyhow, bail};
use dsprep_client::format::Dtype;
use dsprep_mixers::EngineChoice;
use metrics::Metrics;
use producer::{Ended, Producer};
use server::{Layout, Server};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use store::StepStore;

const WAKE_ENDPOINT: &str = "inproc://dsprep-step-ready";
/// The largest frame the daemon reads from a rank (a request is 64 or 80 bytes; the rest is room
/// for later versions). ZeroMQ disconnects a peer that sends a larger one.
pub const MAX_REQUEST_FRAME_BYTES: usize = 4096;

pub struct ServeOptions {
    pub recipe: PathBuf,
    pub world_size: u32,
    pub micro_batch: u32,
    pub endpoint: String,
    /// Allow a non-loopback `tcp://` endpoint without CURVE (unauthenticated).
    pub insecure_tcp: bool,
    /// Serve with CURVE: the daemon's key pair and the clients it admits.
    pub curve: Option<CurveFiles>,
    /// How long a rank's owner may be silent before another trainer process takes it over.
    pub owner_timeout: std::time::Duration,
    /// Steps the pipeline may run ahead of the slowest rank.
    pub prefetch: u64,
    pub threads: usize,
    pub metrics: Option<SocketAddr>,
    /// A bearer token `/metrics` requires (`--metrics-token-file`).
    pub metrics_token: Option<PathBuf>,
    /// Allow `--metrics` beyond loopback without a token.
    pub insecure_metrics: bool,
    pub engine: EngineChoice,
    /// Where checkpoints go (none: no checkpoints).
    pub state_dir: Option<PathBuf>,
    /// Checkpoint every this many steps produced (and on graceful shutdown).
    pub checkpoint_every: u64,
    /// Checkpoints kept in the state directory.
    pub keep_checkpoints: usize,
    /// Continue from the state directory's checkpoints, at the step the trainers ask for.
    pub resume: bool,
    /// With `resume`: continue the stream under `recipe` (or another global batch) from the step
    /// the trainers resume at (`course.rs`).
    pub change_course: bool,
    /// With `change_course`, on a node other than 0: the longest wait for node 0's change.
    pub change_course_timeout: std::time::Duration,
    /// Which node this daemon serves, of how many (flags, Slurm or torchrun's environment).
    pub node: NodePlace,
    /// The job's tensor/context/pipeline parallel sizes and rank order (flags, else the
    /// clients' `DSPREP_TP`, `DSPREP_CP`, `DSPREP_PP`, `DSPREP_RANK_ORDER`): node daemons check
    /// that each node's ranks are the data-parallel ranks it serves.
    pub parallel: dsprep_client::Parallelism,
    /// A frozen plan (`dsprep plan --out`) to read instead of listing the sources.
    pub plan: Option<PathBuf>,
}

/// `--curve-secret-key FILE` (the daemon's `NAME.key_secret`) and `--curve-allow DIR` (the
/// allowed clients' `NAME.key` files).
#[derive(Clone, Debug)]
pub struct CurveFiles {
    pub secret_key: PathBuf,
    pub allow_dir: PathBuf,
}

/// Serve `options` until a shutdown (SIGINT/SIGTERM sets `shutdown`) or the end of the data.
pub fn serve(options: &ServeOptions, shutdown: Arc<AtomicBool>) -> anyhow::Result<()> {
    Served::build(options)?.run(options, shutdown)
}

/// `[mix.adaptive]`'s decider for a daemon serving `work`, refused where it cannot decide: a
/// `lag` not above the prefetch, no state directory, lanes that cannot give the shares.
fn adaptive_decider(
    spec: &dsprep_mixers::recipe::AdaptiveSpec,
    options: &ServeOptions,
    work: &Work,
    reports: &Arc<reports::Reports>,
    store: &Arc<StepStore>,
    window_tokens: u64,
) -> anyhow::Result<adaptive::Decider> {
    if spec.lag <= options.prefetch {
        bail!(
            "mix.adaptive.lag = {} must be above the daemon's prefetch (--prefetch {}): a \
             decision for step d uses the reports up to step d − lag, and the ranks may be \
             --prefetch steps behind the stream; raise lag or lower --prefetch",
            spec.lag,
            options.prefetch
        );
    }
    let Some(state_dir) = &options.state_dir else {
        bail!(
            "[mix.adaptive] needs --state-dir: its decisions are written to the stream's lineage \
             there before they take effect"
        );
    };
    let lanes = match work {
        Work::Single(_) => None,
        Work::Lanes(lanes) => {
            let recipe = lanes.course.served_recipe();
            lanes.inputs.check_adaptive(recipe, spec)?;
            // Each lane holds blocks ready beyond the one the node consumes, and builds one:
            // the stream reaches a decision's token point that many steps' worth sooner.
            let spec_lanes = lanes.inputs.spec;
            let held = (nodes::lanes::LANE_QUEUE_BLOCKS as u64 + 1)
                * u64::from(spec_lanes.block_windows)
                * u64::from(spec_lanes.count);
            let ahead = held.div_ceil(lanes.slice.global_batch);
            if spec.lag <= options.prefetch + ahead {
                bail!(
                    "mix.adaptive.lag = {} must be above the daemon's prefetch and what its lanes \
                     hold ahead: --prefetch {} + {ahead} steps ({} blocks of {} windows in each \
                     of {} lanes, {} windows a step); raise lag above {} or lower --prefetch",
                    spec.lag,
                    options.prefetch,
                    nodes::lanes::LANE_QUEUE_BLOCKS + 1,
                    spec_lanes.block_windows,
                    spec_lanes.count,
                    lanes.slice.global_batch,
                    options.prefetch + ahead
                );
            }
            Some(adaptive::LaneShape {
                spec: lanes.inputs.spec,
                present: lanes.inputs.present(),
                global_batch: lanes.slice.global_batch,
                progress: lanes.progress.clone(),
                ended: Default::default(),
            })
        }
    };
    let pool = adaptive::pool::Pool::of_node(state_dir, options.node.rank, options.node.count)?;
    Ok(adaptive::Decider::new(
        crate::checkpoint::lineage::path_in(state_dir),
        Arc::clone(reports),
        Arc::clone(store),
        window_tokens,
        pool,
        lanes,
    ))
}

/// The course is placed on `lineage` (at the first request): the loss reports count by its
/// segments and phases, and `[mix.adaptive]`'s decisions begin from it. Both producers call it.
fn course_placed(
    metrics: &Metrics,
    decider: Option<&adaptive::Decider>,
    lineage: &dsprep_mixers::lineage::Lineage,
    window_tokens: u64,
) -> anyhow::Result<()> {
    if let Some(reports) = &metrics.reports {
        reports.set_lineage(lineage, window_tokens);
    }
    match decider {
        Some(decider) => decider.begin(lineage),
        None => Ok(()),
    }
}

/// What a daemon serves, built and checked before anything is bound or started: who may
/// connect, the recipe, the layout of its replies, its work (the stream or this node's lanes),
/// the step store and the metrics.
struct Served {
    curve: Option<auth::CurveServer>,
    metrics_token: Option<metrics::MetricsToken>,
    loaded: crate::driver::LoadedRecipe,
    recipe_hash_hex: String,
    dtype: Dtype,
    global_batch: u64,
    layout: Layout,
    work: Work,
    store: Arc<StepStore>,
    metrics: Arc<Metrics>,
    /// The lineage's earlier recipes, which trainers that pinned them are served.
    earlier_recipes: Vec<[u8; 32]>,
    /// The trainers' loss reports, and `[mix.adaptive]`'s decider over them.
    reports: Arc<reports::Reports>,
    decider: Option<Arc<adaptive::Decider>>,
}

impl Served {
    fn build(options: &ServeOptions) -> anyhow::Result<Served> {
        // Who may connect, checked before the recipe is loaded: a refused setting fails fast.
        let curve = match &options.curve {
            Some(files) => Some(auth::CurveServer::load(
                &files.secret_key,
                &files.allow_dir,
            )?),
            None => None,
        };
        endpoint::check(&options.endpoint, options.insecure_tcp, curve.is_some())?;
        let metrics_token = match &options.metrics_token {
            Some(path) => Some(metrics::MetricsToken::read(path)?),
            None => None,
        };
        if let Some(addr) = options.metrics {
            metrics::check_address(addr, metrics_token.is_some(), options.insecure_metrics)?;
        }
        let loaded = load_recipe_with(&options.recipe, options.engine, options.plan.as_deref())?;
        let recipe = &loaded.recipe;
        tracing::info!(
            "{}",
            crate::pack::mix_unit_line(!recipe.mix.unit.is_documents())
        );
        let recipe_hash_hex = recipe.hash();
        let dtype = Dtype::for_vocab(loaded.stage.vocab_size());
        let mut recipe_hash = [0u8; 32];
        hex::decode_to_slice(&recipe_hash_hex, &mut recipe_hash).context("recipe hash is hex")?;
        let global_batch = u64::from(options.world_size) * u64::from(options.micro_batch);
        let node = nodes::NodeRanks::new(
            &options.node,
            options.world_size,
            recipe.lanes.is_some(),
            &options.parallel,
        )?;
        let mut layout = Layout {
            world_size: options.world_size,
            micro_batch: options.micro_batch,
            window_tokens: recipe.packing.window_tokens() as u32,
            dtype_bytes: dtype.size_bytes() as u8,
            recipe_hash,
            first_rank: node.first_rank,
            local_ranks: node.local_ranks,
            pads: recipe.packing.pads(),
        };
        let work = match recipe.lanes {
            Some(_) => Work::Lanes(Box::new(nodes::NodeLanes::open(
                &loaded,
                options,
                global_batch,
            )?)),
            None => Work::Single(Box::new(course::Course::open(options, &loaded)?)),
        };
        // A stream with padding in any of its segments pads throughout, on the wire: requests
        // of versions 1 to 3 are refused from its first step (PROTOCOL.md v4).
        let lineage = match &work {
            Work::Single(course) => &course.segments.lineage,
            Work::Lanes(lanes) => &lanes.course.segments.lineage,
        };
        layout.pads |= (lineage.segments.iter()).any(|s| s.recipe.packing.pads());
        // Sources are counted over the whole lineage (those of earlier recipes first).
        let counted = match &work {
            Work::Single(course) => course.served_recipe(),
            Work::Lanes(lanes) => lanes.course.served_recipe().clone(),
        };
        let hashes: Vec<String> = match &work {
            Work::Single(course) => (course.segments.lineage.segments.iter())
                .map(|s| s.recipe_hash.clone())
                .collect(),
            Work::Lanes(lanes) => lanes.course.recipe_hashes(),
        };
        let earlier_recipes = (hashes.iter())
            .filter_map(|h| {
                let mut hash = [0u8; 32];
                hex::decode_to_slice(h, &mut hash).ok()?;
                (hash != recipe_hash).then_some(hash)
            })
            .collect();

        let store = Arc::new(if options.resume {
            StepStore::unplaced(node.local_ranks, options.prefetch)
        } else {
            StepStore::new(node.local_ranks, options.prefetch)
        });
        let adaptive = counted.mix.adaptive.clone();
        let mut reports = reports::Reports::new(
            counted.sources.iter().map(|s| s.name.clone()).collect(),
            node.local_ranks,
            adaptive.as_ref().map(|_| 0),
        );
        if options.node.count > 1 {
            reports = reports.of_node(options.node.rank, node.first_rank);
        }
        let reports = Arc::new(reports);
        let decider = match &adaptive {
            Some(spec) => Some(Arc::new(adaptive_decider(
                spec,
                options,
                &work,
                &reports,
                &store,
                u64::from(layout.window_tokens),
            )?)),
            None => None,
        };
        let mut metrics = Metrics::new(&counted);
        metrics.reports = Some(Arc::clone(&reports));
        metrics.node = (options.node.rank, options.node.count);
        metrics.first_rank = node.first_rank;
        metrics.auth.curve = curve.is_some();
        if let Work::Lanes(lanes) = &work {
            metrics.lanes = lanes.slice.lanes();
            metrics.input_bytes_assigned = lanes.input_bytes();
        }
        let metrics = Arc::new(metrics);
        Ok(Served {
            curve,
            metrics_token,
            recipe_hash_hex,
            dtype,
            global_batch,
            layout,
            work,
            store,
            metrics,
            loaded,
            earlier_recipes,
            reports,
            decider,
        })
    }

    /// Bind the endpoint, start the producer, the metrics and (with CURVE) the handler threads,
    /// and serve until shut down.
    fn run(self, options: &ServeOptions, shutdown: Arc<AtomicBool>) -> anyhow::Result<()> {
        let Served {
            curve,
            metrics_token,
            loaded,
            recipe_hash_hex,
            dtype,
            global_batch,
            layout,
            work,
            store,
            metrics,
            earlier_recipes,
            reports,
            decider,
        } = self;
        endpoint::prepare(&options.endpoint)?;
        let context = zmq::Context::new();
        let mut router = context.socket(zmq::ROUTER)?;
        router.set_linger(0)?;
        // A frame larger than any request drops its peer's connection before it is allocated: a
        // hostile or broken peer cannot make the daemon hold a frame of its choosing.
        router.set_maxmsgsize(MAX_REQUEST_FRAME_BYTES as i64)?;
        // The handler is bound before the ROUTER, so no handshake comes before it.
        let authenticator = match &curve {
            None => None,
            Some(curve) => {
                curve.secure(&mut router)?;
                let authenticator = auth::Authenticator::start(
                    &context,
                    &router,
                    &options.endpoint,
                    curve.allowed.clone(),
                    Arc::clone(&metrics),
                )?;
                tracing::info!(
                    "CURVE on: server public key {} (give the clients its NAME.key); {} client keys \
                     allowed from {}",
                    curve.public_key(),
                    curve.allowed.len(),
                    options
                        .curve
                        .as_ref()
                        .map(|f| f.allow_dir.display().to_string())
                        .unwrap_or_default()
                );
                Some(authenticator)
            }
        };
        router
            .bind(&options.endpoint)
            .map_err(|e| endpoint::bind_error(&options.endpoint, e))?;
        let wake = context.socket(zmq::PULL)?;
        wake.bind(WAKE_ENDPOINT)?;
        let gate = match &work {
            Work::Lanes(lanes) => lanes.progress.clone().map(|p| (p, global_batch)),
            Work::Single(_) => None,
        };
        let shuffle_fill = Arc::new(AtomicU64::new(0));
        if let Some(addr) = options.metrics {
            let protected = metrics_token.is_some();
            let bound = metrics::spawn_http(
                addr,
                metrics_token,
                Arc::clone(&metrics),
                Arc::clone(&store),
                Arc::clone(&shuffle_fill),
            )?;
            tracing::info!(
                "metrics on http://{bound}/metrics{}",
                if protected {
                    " (bearer token required)"
                } else {
                    ""
                }
            );
        }

        // Said once the producer runs: an engine still being built from the engine cache is
        // waited for here, while the shuffle buffer fills.
        let stage = Arc::clone(&loaded.stage);
        let resume = options.resume;
        let (keep_checkpoints, checkpoint_every) =
            (options.keep_checkpoints, options.checkpoint_every);
        let fatal: Arc<std::sync::Mutex<Option<String>>> = Default::default();
        let kept_decider = decider.clone();
        let producer = {
            let (store, metrics, shutdown, context, fatal) = (
                Arc::clone(&store),
                Arc::clone(&metrics),
                Arc::clone(&shutdown),
                context.clone(),
                Arc::clone(&fatal),
            );
            let window_tokens = layout.window_tokens;
            let step_tokens = global_batch * u64::from(window_tokens);
            let config = PipelineConfig {
                shuffle_fill: Some(shuffle_fill),
                decider: match (&work, &decider) {
                    (Work::Single(_), Some(d)) => {
                        Some(Arc::new(adaptive::Planner::new(Arc::clone(d), None))
                            as Arc<dyn MixDecider>)
                    }
                    _ => None,
                },
                ..PipelineConfig::for_steps(options.threads, step_tokens, 1)
            };
            std::thread::Builder::new()
                .name("dsprep-producer".into())
                .spawn(move || {
                    let wake = context
                        .socket(zmq::PUSH)
                        .and_then(|s| s.connect(WAKE_ENDPOINT).map(|()| s));
                    let wake = match wake {
                        Ok(wake) => wake,
                        Err(e) => {
                            store.fail(format!("internal error: cannot signal the server: {e}"));
                            return;
                        }
                    };
                    let result = match work {
                        Work::Single(mut course) => {
                            let placed = match placement::first_request(resume, &store) {
                                None => Ok(None),
                                Some(step) => {
                                    tracing::info!("the first request is for step {step}");
                                    course.place(step, &loaded, &config).and_then(|placed| {
                                        let lineage = &course.segments.lineage;
                                        let tokens = u64::from(window_tokens);
                                        course_placed(
                                            &metrics,
                                            decider.as_deref(),
                                            lineage,
                                            tokens,
                                        )?;
                                        Ok(Some(placed))
                                    })
                                }
                            };
                            match placed {
                                Ok(None) => Ok(Ended::Stopped),
                                Ok(Some(placed)) => Producer {
                                    store: &store,
                                    metrics: &metrics,
                                    config,
                                    global_batch,
                                    dtype,
                                    wake: &wake,
                                    course: &course,
                                    checkpoint_every,
                                }
                                .run(placed),
                                Err(e) => Err(e),
                            }
                        }
                        Work::Lanes(lanes) => nodes::lanes::LaneProducer {
                            loaded: &loaded,
                            spec: lanes.inputs.spec,
                            slice: lanes.slice.clone(),
                            store: &store,
                            metrics: &metrics,
                            progress: lanes.progress.clone(),
                            threads: config.threads,
                            dtype,
                            wake: &wake,
                            resume,
                            checkpoints: (lanes.stream_dir.as_deref())
                                .map(|dir| LaneCheckpoints::new(dir, keep_checkpoints)),
                            checkpoint_every,
                            stream_dir: lanes.stream_dir.clone(),
                            branch_dir: lanes.branch_dir.clone(),
                            course: lanes.course,
                            decider,
                        }
                        .run(),
                    };
                    match result {
                        Ok(Ended::EndOfData) => store.finish(),
                        Ok(Ended::Stopped) => {}
                        Err(_) if shutdown.load(Ordering::Relaxed) => {}
                        Err(e) => {
                            tracing::error!("the pipeline failed: {e:#}");
                            store.fail(format!("{e:#}"));
                            if e.downcast_ref::<Fatal>().is_some() {
                                let mut slot = fatal.lock().unwrap_or_else(|p| p.into_inner());
                                *slot = Some(format!("{e:#}"));
                            }
                        }
                    }
                    let _ = wake.send(&b""[..], zmq::DONTWAIT);
                    if fatal.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                        // The ranks asking are answered with the failure, then the daemon exits.
                        std::thread::sleep(std::time::Duration::from_millis(500));
                        shutdown.store(true, Ordering::Relaxed);
                    }
                })?
        };
        tracing::info!("tokenizer engine: {}", stage.engine_description());

        tracing::info!(
            "serving recipe {} to {} ranks × micro batch {} ({} tokens per row) on {}; prefetch {} steps{}",
            recipe_hash_hex,
            options.world_size,
            options.micro_batch,
            layout.window_tokens,
            options.endpoint,
            options.prefetch,
            if options.resume {
                "; resuming at the first step asked for"
            } else {
                ""
            }
        );
        let served = Server {
            router,
            wake,
            store: Arc::clone(&store),
            metrics: Arc::clone(&metrics),
            layout,
            shutdown,
            gate,
            malformed_log: Default::default(),
            owners: owners::Owners::new(options.owner_timeout),
            earlier_recipes,
            reports: Arc::clone(&reports),
        }
        .run();
        reports.close();
        if let Some(authenticator) = authenticator {
            authenticator.stop();
        }
        store.shutdown();
        producer
            .join()
            .map_err(|_| anyhow!("the producer thread panicked"))?;
        if let Some(decider) = kept_decider {
            decider.keep_pending();
        }
        if let Some(path) = options.endpoint.strip_prefix("ipc://") {
            let _ = std::fs::remove_file(path);
        }
        let documents: u64 = metrics
            .documents
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .sum();
        let tokens: u64 = metrics
            .tokens
            .iter()
            .map(|t| t.load(Ordering::Relaxed))
            .sum();
        tracing::info!(
            "shut down: node {} of {} tokenized {documents} documents, {tokens} tokens{}",
            options.node.rank,
            options.node.count,
            if metrics.lanes.is_empty() {
                String::new()
            } else {
                format!(
                    " in lanes {:?} ({} input bytes assigned)",
                    metrics.lanes, metrics.input_bytes_assigned
                )
            }
        );
        if let Some(message) = fatal.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(anyhow!(message));
        }
        served
    }
}

/// A pipeline failure after which the daemon exits (non-zero, with this message, once its
/// ranks asking have been told) instead of answering every request with it until stopped:
/// another start is needed to serve anything.
#[derive(Debug)]
pub struct Fatal(pub String);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fatal {}

/// What the producer runs: the recipe's one stream (its lineage, with checkpoints), or this
/// node's lanes.
enum Work {
    Single(Box<course::Course>),
    Lanes(Box<nodes::NodeLanes>),
}
