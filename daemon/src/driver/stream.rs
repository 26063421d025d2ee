//! The recipe, built into the pipeline core's document stream: load and check a recipe (its
//! tokenizer engine chosen), list each source's shards, and build the mixer and the shuffle buffer
//! over them (in the recipe's `[mix] unit`). `dsprep pack`, `dsprep serve` and `dsprep plan` all
//! start here.

use super::frozen_plan::FrozenPlan;
use super::inputs::source_shards;
use super::pretokenize::{Pretokenized, TokenizePool};
use crate::hub::HubClient;
use crate::sources::{LocalSource, SourceContext};
use crate::tokenizer_cache::EngineCacheDir;
use anyhow::{Context, anyhow};
use dsprep_mixers::doc::DocPos;
use dsprep_mixers::lanes::lane_buffer_size;
use dsprep_mixers::mixer::MixInput;
use dsprep_mixers::recipe::{MixUnit, PackStrategy, Recipe};
use dsprep_mixers::tokenize::SharedEngineCache;
use dsprep_mixers::{DocStream, EngineChoice, Mixer, PackerConfig, Shuffler, TokenizeStage};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A recipe loaded and checked, with everything resolved that needs IO.
pub struct LoadedRecipe {
    pub recipe: Recipe,
    /// The recipe file's folder: relative paths in it are resolved from here.
    pub base: PathBuf,
    pub tokenizer_json: Arc<Vec<u8>>,
    pub stage: Arc<TokenizeStage>,
    /// The frozen plan the run was given (`--plan`): sources' shards come from it, not listed.
    pub plan: Option<Arc<FrozenPlan>>,
    /// What `best_fit` pads windows with (the EOS unless `[packing] pad` names another token).
    pub pad_id: u32,
    /// With `[lanes]`, a segment of a lineage: the sources whose units are dealt to the lanes,
    /// in dealing order ([`crate::driver::lineage::Segments::load`]); `None`: those that take
    /// part, in recipe order.
    pub dealt_sources: Option<Vec<usize>>,
}

impl LoadedRecipe {
    /// The sources dealt to the lanes, in dealing order (see [`Self::dealt_sources`]): a source
    /// that does not take part has no units, so dealing it changes nothing.
    pub fn deal_order(&self) -> Vec<usize> {
        (self.dealt_sources.clone()).unwrap_or_else(|| (0..self.recipe.sources.len()).collect())
    }

    /// Whether source `index` is dealt to the lanes though it may not take part (a lineage
    /// segment after a change stopped drawing from it).
    pub fn deals(&self, index: usize) -> bool {
        (self.dealt_sources.as_ref()).is_some_and(|order| order.contains(&index))
    }

    /// How the packer of a stream is built: the recipe's strategy, with the whole `best_fit`
    /// pool, or with lane `lane`'s share of it (split as the shuffle buffer is).
    pub fn packer(&self, lane: Option<u32>) -> PackerConfig {
        let packing = &self.recipe.packing;
        let pool = packing.pool_documents().unwrap_or(1);
        let share = match (lane, self.recipe.lanes) {
            (Some(lane), Some(spec)) => lane_buffer_size(pool, spec.count, lane),
            _ => pool,
        };
        PackerConfig::new(packing, share, self.pad_id)
    }
}

/// Load a recipe with the tokenizer engine chosen automatically (the fast path where exact).
pub fn load_recipe(path: &Path) -> anyhow::Result<LoadedRecipe> {
    load_recipe_with(path, EngineChoice::Auto, None)
}

/// Load a recipe with the given tokenizer engine and, when `plan` names one, its frozen plan
/// (checked against the recipe: see [`FrozenPlan::load`]).
pub fn load_recipe_with(
    path: &Path,
    engine: EngineChoice,
    plan: Option<&Path>,
) -> anyhow::Result<LoadedRecipe> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read recipe {}", path.display()))?;
    let recipe = Recipe::parse(&text).with_context(|| format!("recipe {}", path.display()))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut loaded = load_parsed(recipe, base, path, engine)?;
    if let Some(plan) = plan {
        loaded.plan = Some(Arc::new(FrozenPlan::load(plan, &loaded, path)?));
    }
    Ok(loaded)
}

/// Load a recipe already parsed (a lineage's, say), its relative paths resolved from `base`;
/// `path` names it in messages.
pub fn load_parsed(
    recipe: Recipe,
    base: PathBuf,
    path: &Path,
    engine: EngineChoice,
) -> anyhow::Result<LoadedRecipe> {
    let tokenizer_path = base.join(&recipe.tokenizer.path);
    let tokenizer_json = std::fs::read(&tokenizer_path)
        .map(Arc::new)
        .with_context(|| {
            format!(
                "recipe {}: tokenizer.path: cannot read {}",
                path.display(),
                tokenizer_path.display()
            )
        })?;
    // The fast engine's tables come from the engine cache when it holds this file's.
    let engine_cache = EngineCacheDir::from_env().map(|c| Arc::new(c) as SharedEngineCache);
    let stage = TokenizeStage::from_json_bytes_cached(
        Arc::clone(&tokenizer_json),
        &recipe.tokenizer,
        &tokenizer_path.display().to_string(),
        engine,
        engine_cache,
    )
    .with_context(|| format!("recipe {}", path.display()))?;
    let pad_id = match recipe.packing.strategy {
        PackStrategy::Concat => stage.eos_id(),
        PackStrategy::BestFit => stage
            .resolve_pad(recipe.packing.pad.as_ref())
            .map_err(|e| anyhow!("recipe {}: {e}", path.display()))?,
    };
    release_freed_heap();
    let stage = Arc::new(stage);
    build_engine_beside(&stage);
    Ok(LoadedRecipe {
        recipe,
        base,
        tokenizer_json,
        stage,
        plan: None,
        pad_id,
        dealt_sources: None,
    })
}

/// Build the stage's engine (from its engine-cache entry) on a thread of its own while the run
/// starts (shards listed, the shuffle buffer filled), so the first document does not wait for all
/// of it. Should no thread start, the first document builds it.
fn build_engine_beside(stage: &Arc<TokenizeStage>) {
    let stage = Arc::clone(stage);
    let started = std::thread::Builder::new()
        .name("dsprep-engine".into())
        .spawn(move || stage.build_engine());
    if let Err(e) = started {
        tracing::debug!("no thread to build the tokenizer engine beside the run: {e}");
    }
}

/// The mixer over the recipe's sources (0-weight sources are not listed or read). A Hub client
/// (from the environment: `HF_ENDPOINT`, `HF_TOKEN`, …) is made only when a source reads the
/// network; Hub revisions are resolved and folders listed here (unless the run has a frozen
/// plan), nothing is downloaded yet.
pub fn build_mixer(loaded: &LoadedRecipe) -> anyhow::Result<Mixer<LocalSource>> {
    build_mixer_with(loaded, hub_client(loaded)?)
}

/// A Hub client from the environment when the recipe reads the network, else none.
pub fn hub_client(loaded: &LoadedRecipe) -> anyhow::Result<Option<Arc<HubClient>>> {
    Ok(if loaded.recipe.needs_network() {
        Some(Arc::new(HubClient::from_env()?))
    } else {
        None
    })
}

/// [`build_mixer`] with a given Hub client (or none: then a Hub source is an error).
pub fn build_mixer_with(
    loaded: &LoadedRecipe,
    hub: Option<Arc<HubClient>>,
) -> anyhow::Result<Mixer<LocalSource>> {
    let recipe = &loaded.recipe;
    let context = SourceContext {
        base: loaded.base.clone(),
        hub,
    };
    let mut inputs = Vec::with_capacity(recipe.sources.len());
    for (i, spec) in recipe.sources.iter().enumerate() {
        let shards = source_shards(loaded, i, context.hub.as_ref())?;
        let source = LocalSource::with_shards(i as u16, spec.clone(), shards, &context)
            .map_err(|e| anyhow!(e))?;
        inputs.push(MixInput {
            name: spec.name.clone(),
            weight: spec.weight,
            source,
        });
    }
    Ok(Mixer::new(inputs, recipe.mix.stopping, recipe.shuffle.seed))
}

/// The recipe's document stream (see [`mix_stream`]), with `threads` tokenizing ahead in a mix
/// in tokens.
pub fn build_stream(
    loaded: &LoadedRecipe,
    threads: usize,
) -> anyhow::Result<DocStream<Pretokenized>> {
    let recipe = &loaded.recipe;
    let mixer = build_mixer(loaded)?;
    let inputs = mixer.into_inputs();
    let weights = recipe.phase_weights();
    let phases = (recipe.mix.phases.iter().map(|p| p.at_tokens))
        .zip(weights.into_iter().skip(1))
        .collect();
    let shuffle = &recipe.shuffle;
    mix_stream(
        loaded,
        inputs,
        shuffle.seed,
        shuffle.buffer_size,
        threads,
        phases,
    )
}

/// The document stream over `inputs` in the recipe's `[mix] unit`: in documents, the mixer
/// feeding one shuffle buffer of `buffer_size`; in tokens, sources that tokenize ahead on a pool
/// of `threads`, each shuffled in its share of `buffer_size`, mixed by tokens with `phases` (from
/// which of the stream's tokens on which weights hold; a lane's own, see `driver::lanes`) and no
/// global buffer.
pub fn mix_stream(
    loaded: &LoadedRecipe,
    inputs: Vec<MixInput<LocalSource>>,
    seed: u64,
    buffer_size: usize,
    threads: usize,
    phases: Vec<(u64, Vec<f64>)>,
) -> anyhow::Result<DocStream<Pretokenized>> {
    let mix = &loaded.recipe.mix;
    let pool = match mix.unit {
        MixUnit::Documents => None,
        MixUnit::Tokens => Some(TokenizePool::start(loaded.stage.clone(), threads)?),
    };
    let inputs = inputs
        .into_iter()
        .map(|i| MixInput {
            name: i.name,
            weight: i.weight,
            source: Pretokenized::new(i.source, pool.clone()),
        })
        .collect();
    Ok(match mix.unit {
        MixUnit::Documents => DocStream::new(
            Mixer::new(inputs, mix.stopping, seed),
            Shuffler::new(buffer_size, seed),
        ),
        MixUnit::Tokens => {
            let mut mixer = Mixer::by_tokens(inputs, mix.stopping, seed, buffer_size, phases);
            if mix.adaptive.is_some() {
                mixer.carry_deficits(); // its decisions' shares hold over any span
            }
            DocStream::new(mixer, Shuffler::new(0, seed))
        }
    })
}

/// Names a document's origin in messages: `source "c4" shard PATH row N`.
/// ` piece K` for a piece of a split row, else nothing: how messages name a document.
pub fn piece_label(pos: &DocPos) -> String {
    if pos.is_piece() {
        format!(" piece {}", pos.piece)
    } else {
        String::new()
    }
}

pub struct Locator {
    shards: Vec<(String, Vec<PathBuf>)>,
}

impl Locator {
    pub fn new(mixer: &Mixer<Pretokenized>) -> Self {
        Self {
            shards: mixer
                .inputs()
                .iter()
                .map(|i| (i.name.clone(), i.source.shards().to_vec()))
                .collect(),
        }
    }

    pub fn locate(&self, pos: &DocPos) -> String {
        let Some((name, shards)) = self.shards.get(pos.source as usize) else {
            return format!("source {} row {}", pos.source, pos.row);
        };
        let shard = shards
            .get(pos.shard as usize)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        format!(
            "source {name:?} shard {shard} row {}{}",
            pos.row,
            piece_label(pos)
        )
    }

    /// Per source, its shards' display paths in reading order (what a checkpoint must match).
    pub fn shard_names(&self) -> Vec<Vec<String>> {
        self.shards
            .iter()
            .map(|(_, shards)| shards.iter().map(|p| p.display().to_string()).collect())
            .collect()
    }
}

/// Hands the heap's free pages back to the system. Learning the fast engine from the file (no
/// engine-cache entry yet, or `DSPREP_ENGINE_CACHE=off`) parses HF's tokenizer and proves the
/// tables on this thread, and a `best_fit` pad is looked up in HF's parse: hundreds of
/// thousands of small allocations, freed by now, that glibc would otherwise keep in this
/// thread's arena for the whole run, where the other threads' allocations never reuse them
/// (GPT-2: 20–30 MB of RSS over a run from an entry). Elsewhere a no-op.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)] // glibc's call: no argument to get wrong, it only frees free pages
    // SAFETY: malloc_trim takes the arenas' locks itself and touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
