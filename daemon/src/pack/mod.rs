//! `dsprep pack`: runs the pipeline over a recipe and writes a packed directory (format v1, see
//! FORMAT.md). Parse → validate → list shards → run → write manifest → rename.

mod output;
pub mod pipeline;
mod resume;
mod summary;

pub use summary::print_summary;

use crate::files::sha256_file;
use crate::hub::HubClient;
use crate::sources::{LocalSource, Shard, SourceContext, list_source};
use anyhow::{Context, anyhow};
use dsprep_client::format::{
    self, Dtype, InputFile, Manifest, OutputFile, SourceStats, TokenizerInfo,
};
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::doc::DocPos;
use dsprep_mixers::mixer::MixInput;
use dsprep_mixers::recipe::Recipe;
use dsprep_mixers::{DocStream, EngineChoice, Mixer, Packer, Shuffler, TokenizeStage};
use indicatif::{ProgressBar, ProgressStyle};
use output::PackWriter;
use output::WriterProgress;
use pipeline::PipelineConfig;
use resume::PackCheckpoint;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Default target size of one token shard.
pub const DEFAULT_SHARD_BYTES: u64 = 256 << 20;

pub struct PackOptions {
    pub recipe: PathBuf,
    pub out: PathBuf,
    /// Tokenizer threads.
    pub threads: usize,
    /// Target size of one token shard (rounded down to whole windows, at least one).
    pub shard_bytes: u64,
    pub force: bool,
    pub progress: bool,
    /// Which tokenizer engine runs (the output is the same with either).
    pub engine: EngineChoice,
    /// Seconds between checkpoints in the partial directory (0: at every chunk).
    pub checkpoint_secs: u64,
    /// Discard an interrupted pack to the same output instead of continuing it.
    pub fresh: bool,
}

pub struct PackReport {
    pub manifest: Manifest,
    pub out: PathBuf,
    pub wall: Duration,
    pub time_to_first_window: Option<Duration>,
    pub threads: usize,
    /// Which tokenizer engine ran, and why.
    pub engine: String,
    /// Windows an interrupted pack had written before this run continued it.
    pub continued_from: Option<u64>,
}

/// A recipe loaded and checked, with everything resolved that needs IO.
pub struct LoadedRecipe {
    pub recipe: Recipe,
    /// The recipe file's folder: relative paths in it are resolved from here.
    pub base: PathBuf,
    pub tokenizer_json: Vec<u8>,
    pub stage: TokenizeStage,
}

/// Load a recipe with the tokenizer engine chosen automatically (the fast path where exact).
pub fn load_recipe(path: &Path) -> anyhow::Result<LoadedRecipe> {
    load_recipe_with(path, EngineChoice::Auto)
}

pub fn load_recipe_with(path: &Path, engine: EngineChoice) -> anyhow::Result<LoadedRecipe> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read recipe {}", path.display()))?;
    let recipe = Recipe::parse(&text).with_context(|| format!("recipe {}", path.display()))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let tokenizer_path = base.join(&recipe.tokenizer.path);
    let tokenizer_json = std::fs::read(&tokenizer_path).with_context(|| {
        format!(
            "recipe {}: tokenizer.path: cannot read {}",
            path.display(),
            tokenizer_path.display()
        )
    })?;
    let stage = TokenizeStage::from_json_bytes_with(
        &tokenizer_json,
        &recipe.tokenizer,
        &tokenizer_path.display().to_string(),
        engine,
    )
    .with_context(|| format!("recipe {}", path.display()))?;
    Ok(LoadedRecipe {
        recipe,
        base,
        tokenizer_json,
        stage,
    })
}

/// The mixer over the recipe's sources (0-weight sources are not listed or read). A Hub client
/// (from the environment: `HF_ENDPOINT`, `HF_TOKEN`, …) is made only when a source reads the
/// network; Hub revisions are resolved and folders listed here, nothing is downloaded yet.
pub fn build_mixer(loaded: &LoadedRecipe) -> anyhow::Result<Mixer<LocalSource>> {
    let hub = if loaded.recipe.needs_network() {
        Some(Arc::new(HubClient::from_env()?))
    } else {
        None
    };
    build_mixer_with(loaded, hub)
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
        let shards = if spec.weight > 0.0 {
            list_source(recipe, spec, &loaded.base, context.hub.as_ref())?
        } else {
            Vec::new()
        };
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

/// The recipe's document stream: its mixer (see [`build_mixer`]) feeding its shuffle buffer.
pub fn build_stream(loaded: &LoadedRecipe) -> anyhow::Result<DocStream<LocalSource>> {
    let shuffle = &loaded.recipe.shuffle;
    Ok(DocStream::new(
        build_mixer(loaded)?,
        Shuffler::new(shuffle.buffer_size, shuffle.seed),
    ))
}

/// Names a document's origin in messages: `source "c4" shard PATH row N`.
pub struct Locator {
    shards: Vec<(String, Vec<PathBuf>)>,
}

impl Locator {
    pub fn new(mixer: &Mixer<LocalSource>) -> Self {
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
        format!("source {name:?} shard {shard} row {}", pos.row)
    }

    /// Per source, its shards' display paths in reading order (what a checkpoint must match).
    pub fn shard_names(&self) -> Vec<Vec<String>> {
        self.shards
            .iter()
            .map(|(_, shards)| shards.iter().map(|p| p.display().to_string()).collect())
            .collect()
    }
}

pub fn pack(options: &PackOptions) -> anyhow::Result<PackReport> {
    let started = Instant::now();
    let loaded = load_recipe_with(&options.recipe, options.engine)?;
    let recipe = &loaded.recipe;
    let stage = &loaded.stage;
    let stream = build_stream(&loaded)?;
    let locator = Locator::new(stream.mixer());
    let input_lists: Vec<(String, Vec<Shard>)> = stream
        .mixer()
        .inputs()
        .iter()
        .map(|i| (i.name.clone(), i.source.shard_list().to_vec()))
        .collect();
    // Input checksums are computed beside the pipeline: same bytes, no extra wall time.
    let hashing = std::thread::Builder::new()
        .name("dsprep-hash-inputs".into())
        .spawn({
            let lists = input_lists;
            let base = loaded.base.clone();
            move || hash_inputs(&lists, &base)
        })
        .context("cannot start the input-hashing thread")?;

    let dtype = Dtype::for_vocab(stage.vocab_size());
    let window_tokens = recipe.packing.window_tokens();
    let window_bytes = (window_tokens * dtype.size_bytes()) as u64;
    let windows_per_shard = (options.shard_bytes / window_bytes).max(1);
    let mut meta = PackCheckpoint {
        created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
        recipe_hash: recipe.hash(),
        shards: locator.shard_names(),
        window_tokens: window_tokens as u64,
        dtype,
        windows_per_shard,
        writer: WriterProgress {
            num_windows: 0,
            num_doc_starts: 0,
            closed_shards: Vec::new(),
        },
        docs_per_source: vec![0; recipe.sources.len()],
        tokens_per_source: vec![0; recipe.sources.len()],
    };
    output::refuse_existing(&options.out, options.force)?;
    let partial = output::partial_dir(&options.out)?;
    let interrupted = if options.fresh {
        None
    } else {
        resume::load(&partial, &meta)
    };
    let mut stream = stream;
    let mut packer = Packer::new(window_tokens);
    let (mut writer, continued_from) = match interrupted {
        Some((saved, state)) => {
            stream.restore(&state.stream).with_context(|| {
                format!("continue the interrupted pack in {}", partial.display())
            })?;
            packer = Packer::from_state(window_tokens, state.packer)
                .context("the checkpoint's packer state does not fit this recipe")?;
            let writer = PackWriter::resume(
                &options.out,
                dtype,
                window_tokens as u64,
                windows_per_shard,
                &saved.writer,
            )?;
            tracing::info!(
                "continuing the interrupted pack in {} at window {}",
                partial.display(),
                saved.writer.num_windows
            );
            let from = saved.writer.num_windows;
            meta = saved;
            (writer, Some(from))
        }
        None => {
            let writer = PackWriter::create(&options.out, dtype, windows_per_shard)?;
            writer.add_tokenizer(&loaded.tokenizer_json)?;
            (writer, None)
        }
    };
    let progress = progress_bar(options.progress);
    let mut windows = Vec::new();
    let mut first_window = None;
    let mut num_docs: u64 = meta.docs_per_source.iter().sum();
    let mut num_tokens: u64 = meta.tokens_per_source.iter().sum();
    let locate = |pos: &DocPos| locator.locate(pos);
    let snapshot = Arc::new(AtomicBool::new(false));
    let config = PipelineConfig {
        threads: options.threads,
        shuffle_fill: None,
        snapshot: Some(Arc::clone(&snapshot)),
        chunk_text_bytes: pipeline::CHUNK_TEXT_BYTES,
    };
    let checkpoint_every = Duration::from_secs(options.checkpoint_secs);
    let mut last_checkpoint = Instant::now();
    let run = pipeline::run(stream, stage, &config, &locate, |chunk| {
        let mut at = 0usize;
        for (&source, &len) in chunk.doc_sources.iter().zip(&chunk.doc_lens) {
            let len = len as usize;
            packer.push_doc(&chunk.tokens[at..at + len], &mut windows);
            at += len;
            meta.docs_per_source[source as usize] += 1;
            meta.tokens_per_source[source as usize] += len as u64;
        }
        num_docs += chunk.doc_lens.len() as u64;
        num_tokens += chunk.tokens.len() as u64;
        for window in windows.drain(..) {
            writer.write_window(&window)?;
        }
        if let Some(state) = chunk.state {
            meta.writer = writer.sync()?;
            let state = PipelineState {
                stream: *state,
                packer: packer.state(),
            };
            resume::write(writer.partial_dir(), &meta, &state)?;
            last_checkpoint = Instant::now();
        }
        if last_checkpoint.elapsed() >= checkpoint_every {
            snapshot.store(true, Ordering::Release);
        }
        if first_window.is_none() && writer.num_windows() > 0 {
            first_window = Some(started.elapsed());
        }
        let rate = num_tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
        progress.set_message(format!(
            "{num_docs} docs · {num_tokens} tokens · {:.0}k tokens/s · {} windows",
            rate / 1e3,
            writer.num_windows()
        ));
        Ok(())
    });
    let counters = match run {
        Ok(counters) => counters,
        Err(e) => {
            progress.finish_and_clear();
            writer.abandon();
            return Err(e);
        }
    };
    let (docs_per_source, tokens_per_source) = (&meta.docs_per_source, &meta.tokens_per_source);
    progress.finish_and_clear();
    let inputs = match hashing
        .join()
        .map_err(|_| anyhow!("the input-hashing thread panicked"))
        .and_then(|r| r)
    {
        Ok(inputs) => inputs,
        Err(e) => {
            writer.abandon();
            return Err(e);
        }
    };

    let total_weight: f64 = recipe.sources.iter().map(|s| s.weight).sum();
    let sources = recipe
        .sources
        .iter()
        .enumerate()
        .map(|(i, spec)| SourceStats {
            name: spec.name.clone(),
            weight: spec.weight,
            target_fraction: spec.weight / total_weight,
            realized_fraction: if num_docs == 0 {
                0.0
            } else {
                docs_per_source[i] as f64 / num_docs as f64
            },
            documents: docs_per_source[i],
            tokens: tokens_per_source[i],
            rows_read: counters[i].rows_read,
            rows_filtered: counters[i].rows_filtered,
            rows_empty: counters[i].rows_empty,
            passes_completed: counters[i].passes_completed,
        })
        .collect();
    let placeholder = OutputFile {
        file: String::new(),
        size_bytes: 0,
        sha256: String::new(),
    };
    let manifest = Manifest {
        format: format::FORMAT_NAME.into(),
        format_version: format::FORMAT_VERSION,
        created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
        recipe_hash: recipe.hash(),
        recipe: serde_json::from_str(&recipe.canonical_json())
            .context("cannot encode the recipe")?,
        tokenizer: TokenizerInfo {
            file: format::TOKENIZER_FILE.into(),
            sha256: stage.sha256().to_string(),
            vocab_size: stage.vocab_size(),
            eos_id: stage.eos_id(),
            bos_id: stage.bos_id(),
        },
        dtype,
        seq_len: recipe.packing.seq_len,
        window_tokens: window_tokens as u32,
        num_windows: 0,
        dropped_tail_tokens: packer.leftover().len() as u64,
        windows_per_shard: 0,
        shards: Vec::new(),
        doc_starts: placeholder.clone(),
        doc_starts_offsets: placeholder,
        num_doc_starts: 0,
        inputs,
        sources,
    };
    let manifest = writer.finish(manifest)?;
    Ok(PackReport {
        manifest,
        out: options.out.clone(),
        wall: started.elapsed(),
        time_to_first_window: first_window,
        threads: options.threads,
        engine: loaded.stage.engine_description(),
        continued_from,
    })
}

/// Every input with its size and checksum: local files are hashed (on their own thread, beside
/// the pipeline); Hub files are recorded as listed (repo, commit, path, size, LFS sha256, etag),
/// which pins the exact bytes without downloading them twice.
fn hash_inputs(lists: &[(String, Vec<Shard>)], base: &Path) -> anyhow::Result<Vec<InputFile>> {
    let mut inputs = Vec::new();
    for (source, shards) in lists {
        let mut sorted: Vec<&Shard> = shards.iter().collect();
        sorted.sort_by_cached_key(|s| s.display_path());
        for shard in sorted {
            let path = match shard {
                Shard::Local(path) => path.clone(),
                Shard::Hub(file) => {
                    inputs.push(InputFile {
                        source: source.clone(),
                        path: file.path.clone(),
                        size_bytes: file.size,
                        sha256: file.sha256.clone().unwrap_or_default(),
                        repo: Some(file.repo.clone()),
                        commit: Some(file.commit.clone()),
                        etag: file.oid.clone(),
                    });
                    continue;
                }
            };
            let (size_bytes, sha256) = sha256_file(&path)
                .with_context(|| format!("cannot read input {}", path.display()))?;
            let shown = path
                .strip_prefix(base)
                .unwrap_or(&path)
                .display()
                .to_string();
            inputs.push(InputFile {
                source: source.clone(),
                path: shown,
                size_bytes,
                sha256,
                repo: None,
                commit: None,
                etag: None,
            });
        }
    }
    Ok(inputs)
}

fn progress_bar(enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
