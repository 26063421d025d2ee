//! `dsprep serve`: the loader daemon. Runs the same pipeline as `dsprep pack` and serves each
//! data-parallel rank its slice of every global step over ZeroMQ (wire protocol v1, PROTOCOL.md).
//!
//! Threads: the pipeline (reader, tokenizers, and a producer that packs windows into global
//! steps) fills the [`store::StepStore`]; one server thread owns the ROUTER socket; a metrics
//! thread answers `/metrics`. Graceful shutdown on SIGINT/SIGTERM.

pub mod endpoint;
mod metrics;
mod server;
pub mod store;

use crate::pack::pipeline::{self, PipelineConfig};
use crate::pack::{build_mixer, load_recipe_with};
use anyhow::{Context, anyhow};
use dsprep_client::format::Dtype;
use dsprep_mixers::doc::DocPos;
use dsprep_mixers::{EngineChoice, Packer, Shuffler};
use metrics::Metrics;
use server::{Layout, Server};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use store::{StepData, StepStore};

const WAKE_ENDPOINT: &str = "inproc://dsprep-step-ready";

pub struct ServeOptions {
    pub recipe: PathBuf,
    pub world_size: u32,
    pub micro_batch: u32,
    pub endpoint: String,
    /// Steps the pipeline may run ahead of the slowest rank.
    pub prefetch: u64,
    pub threads: usize,
    pub metrics: Option<SocketAddr>,
    pub engine: EngineChoice,
}

pub fn serve(options: &ServeOptions, shutdown: Arc<AtomicBool>) -> anyhow::Result<()> {
    anyhow::ensure!(
        options.world_size >= 1 && options.micro_batch >= 1,
        "--world-size and --micro-batch must be at least 1"
    );
    let loaded = load_recipe_with(&options.recipe, options.engine)?;
    tracing::info!("tokenizer engine: {}", loaded.stage.engine_description());
    let mixer = build_mixer(&loaded)?;
    let recipe = &loaded.recipe;
    let recipe_hash_hex = recipe.hash();
    let dtype = Dtype::for_vocab(loaded.stage.vocab_size());
    let mut recipe_hash = [0u8; 32];
    hex::decode_to_slice(&recipe_hash_hex, &mut recipe_hash).context("recipe hash is hex")?;
    let layout = Layout {
        world_size: options.world_size,
        micro_batch: options.micro_batch,
        window_tokens: recipe.packing.window_tokens() as u32,
        dtype_bytes: dtype.size_bytes() as u8,
        recipe_hash,
    };

    endpoint::prepare(&options.endpoint)?;
    let context = zmq::Context::new();
    let router = context.socket(zmq::ROUTER)?;
    router.set_linger(0)?;
    router
        .bind(&options.endpoint)
        .map_err(|e| endpoint::bind_error(&options.endpoint, e))?;
    let wake = context.socket(zmq::PULL)?;
    wake.bind(WAKE_ENDPOINT)?;

    let store = Arc::new(StepStore::new(options.world_size, options.prefetch));
    let total_weight: f64 = recipe.sources.iter().map(|s| s.weight).sum();
    let metrics = Arc::new(Metrics::new(
        recipe.sources.iter().map(|s| s.name.clone()).collect(),
        recipe
            .sources
            .iter()
            .map(|s| s.weight / total_weight)
            .collect(),
        recipe.shuffle.buffer_size as u64,
    ));
    let shuffle_fill = Arc::new(AtomicU64::new(0));
    if let Some(addr) = options.metrics {
        let bound = metrics::spawn_http(
            addr,
            Arc::clone(&metrics),
            Arc::clone(&store),
            Arc::clone(&shuffle_fill),
        )?;
        tracing::info!("metrics on http://{bound}/metrics");
    }

    let producer = {
        let (store, metrics, shutdown, context) = (
            Arc::clone(&store),
            Arc::clone(&metrics),
            Arc::clone(&shutdown),
            context.clone(),
        );
        let config = PipelineConfig {
            threads: options.threads,
            shuffle_fill: Some(shuffle_fill),
        };
        let global_batch = options.world_size as usize * options.micro_batch as usize;
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
                let result = produce(
                    &loaded,
                    mixer,
                    &store,
                    &metrics,
                    &config,
                    global_batch,
                    dtype,
                    &wake,
                );
                match result {
                    Ok(num_steps) => {
                        store.finish();
                        tracing::info!(num_steps, "end of data: every rank gets {num_steps} steps");
                    }
                    Err(_) if shutdown.load(Ordering::Relaxed) => {}
                    Err(e) => {
                        tracing::error!("the pipeline failed: {e:#}");
                        store.fail(format!("{e:#}"));
                    }
                }
                let _ = wake.send(&b""[..], zmq::DONTWAIT);
            })?
    };

    tracing::info!(
        "serving recipe {} to {} ranks × micro batch {} ({} tokens per row) on {}; prefetch {} steps",
        recipe_hash_hex,
        options.world_size,
        options.micro_batch,
        layout.window_tokens,
        options.endpoint,
        options.prefetch
    );
    let served = Server {
        router,
        wake,
        store: Arc::clone(&store),
        metrics,
        layout,
        shutdown,
    }
    .run();
    store.shutdown();
    producer
        .join()
        .map_err(|_| anyhow!("the producer thread panicked"))?;
    if let Some(path) = options.endpoint.strip_prefix("ipc://") {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("shut down");
    served
}

/// Run the pipeline, cutting windows into global steps for the store. Returns the step count.
#[allow(clippy::too_many_arguments)]
fn produce(
    loaded: &crate::pack::LoadedRecipe,
    mixer: dsprep_mixers::Mixer<crate::sources::LocalSource>,
    store: &StepStore,
    metrics: &Metrics,
    config: &PipelineConfig,
    global_batch: usize,
    dtype: Dtype,
    wake: &zmq::Socket,
) -> anyhow::Result<u64> {
    let recipe = &loaded.recipe;
    let shard_lists: Vec<(String, Vec<PathBuf>)> = mixer
        .inputs()
        .iter()
        .map(|i| (i.name.clone(), i.source.shards().to_vec()))
        .collect();
    let locate = |pos: &DocPos| {
        let (name, shards) = &shard_lists[pos.source as usize];
        let shard = shards
            .get(pos.shard as usize)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        format!("source {name:?} shard {shard} row {}", pos.row)
    };
    let shuffler = Shuffler::new(recipe.shuffle.buffer_size, recipe.shuffle.seed);
    let mut packer = Packer::new(recipe.packing.window_tokens());
    let mut windows = Vec::new();
    let mut step = StepData {
        step: 0,
        tokens: Vec::new(),
        doc_starts: Vec::new(),
    };
    pipeline::run(mixer, shuffler, &loaded.stage, config, &locate, |chunk| {
        let mut at = 0usize;
        for (&source, &len) in chunk.doc_sources.iter().zip(&chunk.doc_lens) {
            let len = len as usize;
            packer.push_doc(&chunk.tokens[at..at + len], &mut windows);
            at += len;
            metrics.documents[source as usize].fetch_add(1, Ordering::Relaxed);
            metrics.tokens[source as usize].fetch_add(len as u64, Ordering::Relaxed);
        }
        for window in windows.drain(..) {
            match dtype {
                Dtype::U16 => step
                    .tokens
                    .extend(window.tokens.iter().flat_map(|&t| (t as u16).to_le_bytes())),
                Dtype::U32 => step
                    .tokens
                    .extend(window.tokens.iter().flat_map(|&t| t.to_le_bytes())),
            }
            step.doc_starts.push(window.doc_starts);
            if step.doc_starts.len() == global_batch {
                let next = StepData {
                    step: step.step + 1,
                    tokens: Vec::with_capacity(step.tokens.len()),
                    doc_starts: Vec::with_capacity(global_batch),
                };
                store
                    .push(std::mem::replace(&mut step, next))
                    .map_err(|_| anyhow!("stopped"))?;
                let _ = wake.send(&b""[..], zmq::DONTWAIT);
            }
        }
        Ok(())
    })?;
    if !step.doc_starts.is_empty() {
        tracing::info!(
            windows = step.doc_starts.len(),
            "the last, incomplete global batch is not served (every rank gets the same steps)"
        );
    }
    Ok(step.step)
}
