//! `dsprep pack`: runs the pipeline over a recipe and writes a packed directory (format v1, see
//! FORMAT.md). Parse → validate → list shards → run → write manifest → rename.

pub mod args;
mod failure;
mod lanes;
mod ledger;
mod lineage;
mod output;
mod part_list;
mod records;
mod resume;
pub mod status;
mod summary;
mod token_shards;

pub use args::{PackArgs, PackCommand};
pub use lanes::{PartReport, Parts, finish, pack_parts};
pub use summary::{mix_unit_line, print_part, print_summary};

use crate::checkpoint::lineage as lineage_file;
use crate::driver::lineage::{SegmentSink, Segments};
use crate::driver::pipeline::{self, PipelineConfig, ProducedDoc};
use crate::driver::run::{Flow, Snapshots, StreamStart, WindowSink};
use crate::driver::{LoadedRecipe, Locator, build_stream, load_recipe_with};
use crate::files::sha256_file;
use crate::progress::Progress;
use crate::sources::Shard;
use anyhow::{Context, anyhow};
use dsprep_client::format::{
    self, Dtype, InputFile, Manifest, OutputFile, PackingStats, SourceStats, TokenizerInfo,
};
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::doc::SourceCounters;
use dsprep_mixers::lineage::Lineage;
use dsprep_mixers::mixer::{share, target_shares};
use dsprep_mixers::packer::PackingCounters;
use dsprep_mixers::recipe::Recipe;
use dsprep_mixers::{EngineChoice, PackedWindow};
use failure::failed;
use ledger::PackLedger;
use output::PackWriter;
use output::WriterProgress;
use resume::PackCheckpoint;
use std::path::{Path, PathBuf};
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
    /// A frozen plan (`dsprep plan --out`) to read instead of listing the sources.
    pub plan: Option<PathBuf>,
    /// A lineage (`lineage.json`, or the daemon's state directory holding it) to pack instead
    /// of `recipe`: the stream the daemon served, every change of course included.
    pub lineage: Option<PathBuf>,
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

/// What a `dsprep pack` run did.
pub enum Packed {
    /// The whole recipe, or the finish of its lanes.
    Whole(Box<PackReport>),
    /// Parts of its lanes, one after another.
    Parts(Vec<PartReport>),
    /// `--status`: where each part stands.
    Status(Box<status::Status>),
}

/// Run `dsprep pack` as asked: the whole recipe, parts of its lanes, the finish or the status.
/// An array task's environment makes a part only of a recipe with lanes.
pub fn command(command: &PackCommand) -> anyhow::Result<Packed> {
    let options = &command.options;
    let split = command.finish || command.status || command.parts.is_some();
    if split || command.slurm.is_some() {
        let loaded = load_recipe_with(&options.recipe, options.engine, options.plan.as_deref())?;
        if let (true, Some(resubmit)) = (command.status, &command.resubmit) {
            let spec = lanes::spec_of(&loaded)?;
            let job = status::Job {
                recipe: &options.recipe,
                out: &options.out,
                plan: options.plan.as_deref(),
                recipe_hash: &loaded.recipe.hash(),
                lanes: spec.count,
            };
            return Ok(Packed::Status(Box::new(status::status(&job, resubmit)?)));
        }
        if command.finish {
            let report = finish(options, &loaded, command.resubmit.as_ref())?;
            return Ok(Packed::Whole(Box::new(report)));
        }
        if let Some(list) = &command.parts {
            return Ok(Packed::Parts(pack_parts(options, &loaded, list)?));
        }
        if let Some(parts) = command.slurm.filter(|_| loaded.recipe.lanes.is_some()) {
            return Ok(Packed::Parts(pack_parts(options, &loaded, &[parts])?));
        }
    }
    Ok(Packed::Whole(Box::new(pack(options)?)))
}

pub fn pack(options: &PackOptions) -> anyhow::Result<PackReport> {
    let started = Instant::now();
    let segments = match &options.lineage {
        Some(path) => {
            let segments = lineage::load(path, options.engine)?;
            if segments.loaded[0].recipe.lanes.is_some() {
                return lanes::pack_lineage(options, &segments, path, started);
            }
            segments
        }
        None => {
            let loaded =
                load_recipe_with(&options.recipe, options.engine, options.plan.as_deref())?;
            if loaded.recipe.lanes.is_some() {
                return lanes::pack_all(options, &loaded, started);
            }
            let lineage = Lineage::start(loaded.recipe.clone(), String::new(), 1, 1);
            Segments {
                lineage,
                loaded: vec![loaded],
                lane: None,
            }
        }
    };
    // The last recipe's sources are the lineage's (see `dsprep_mixers::lineage`): the counts,
    // the manifest and the layout are its.
    let loaded = segments.loaded.last().expect("a lineage has a segment");
    let recipe = &loaded.recipe;
    let stream = build_stream(loaded, options.threads)?;
    let locator = Locator::new(stream.mixer());
    let hub = stream
        .mixer()
        .inputs()
        .iter()
        .find_map(|i| i.source.local().hub().cloned());
    let input_lists: Vec<(String, Vec<Shard>)> = stream
        .mixer()
        .inputs()
        .iter()
        .map(|i| (i.name.clone(), i.source.local().shard_list().to_vec()))
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

    let (dtype, windows_per_shard) = output_layout(loaded, options);
    let window_tokens = recipe.packing.window_tokens();
    let mut meta = PackCheckpoint {
        created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
        recipe_hash: match &options.lineage {
            Some(_) => format!("lineage {}", lineage_file::hash(&segments.lineage)),
            None => recipe.hash(),
        },
        segment: 0,
        segments: match &options.lineage {
            Some(_) => lineage::counts(&segments),
            None => Vec::new(),
        },
        shards: locator.shard_names(),
        window_tokens: window_tokens as u64,
        dtype,
        windows_per_shard,
        writer: WriterProgress {
            num_windows: 0,
            num_doc_starts: 0,
            closed_shards: Vec::new(),
            chain: None,
            chain_marks: Vec::new(),
            doc_sources: true,
            ledger: None,
            padded: false,
            positions: false,
        },
        docs_per_source: vec![0; recipe.sources.len()],
        tokens_per_source: vec![0; recipe.sources.len()],
        packing_done: None,
    };
    output::refuse_existing(&options.out, options.force)?;
    let partial = output::partial_dir(&options.out)?;
    let interrupted = if options.fresh {
        None
    } else {
        resume::load(&partial, &meta)
    };
    let (writer, start, continued_from) = match interrupted {
        Some((saved, state)) => {
            let ledger = (saved.writer.ledger.clone())
                .and_then(|counts| PackLedger::resume(recipe, counts))
                .with_context(|| {
                    format!(
                        "{}: the checkpoint's phase ledger is not this recipe's",
                        partial.display()
                    )
                })?;
            // The directory's lock next: what a failure to continue leaves is then this pack's
            // to say (kept: it holds the checkpoint).
            let writer = PackWriter::resume(
                &options.out,
                dtype,
                window_tokens as u64,
                windows_per_shard,
                &saved.writer,
                Some(ledger),
            )?;
            tracing::info!(
                "continuing the interrupted pack in {} at window {}",
                partial.display(),
                saved.writer.num_windows
            );
            let from = saved.writer.num_windows;
            meta = saved;
            let start = StreamStart::Restore {
                state: Box::new(state),
                what: format!("continue the interrupted pack in {}", partial.display()),
            };
            (writer, (meta.segment, start), Some(from))
        }
        None => {
            let ledger = PackLedger::new(recipe);
            let recipes: Vec<Recipe> = (segments.loaded.iter()).map(|l| l.recipe.clone()).collect();
            let columns = output::Columns::of_lineage(&recipes);
            let writer = PackWriter::create(
                &options.out,
                dtype,
                windows_per_shard,
                Some(ledger),
                columns,
            )?;
            if let Err(e) = writer.add_tokenizer(&loaded.tokenizer_json) {
                return Err(failed(writer, &partial, None, e));
            }
            (writer, (0, StreamStart::Fresh), None)
        }
    };
    let mut sink = PackSink {
        num_docs: meta.docs_per_source.iter().sum(),
        num_tokens: meta.tokens_per_source.iter().sum(),
        meta,
        writer,
        progress: Progress::new("pack", options.progress),
        started,
        first_window: None,
        checkpoint_every: Duration::from_secs(options.checkpoint_secs),
        last_checkpoint: Instant::now(),
        checkpointed: continued_from,
    };
    let config = PipelineConfig::new(options.threads, pipeline::CHUNK_TEXT_BYTES);
    let (segment, start) = start;
    // The stream built above runs when the pack starts in the last segment (its sources, and
    // the Hub client that marks what it verified, are this pack's); else it is dropped.
    let built = (segment + 1 == segments.loaded.len()).then_some(stream);
    let run = segments.run(segment, start, built, &config, &mut sink);
    let PackSink {
        meta,
        writer,
        progress,
        first_window,
        checkpointed,
        ..
    } = sink;
    let run = match run {
        Ok(run) => run,
        Err(e) => {
            progress.finish();
            return Err(failed(writer, &partial, checkpointed, e));
        }
    };
    let counters = run.counters;
    let (docs_per_source, tokens_per_source) = (&meta.docs_per_source, &meta.tokens_per_source);
    progress.finish();
    let mut inputs = match join_hashing(hashing) {
        Ok(inputs) => inputs,
        Err(e) => return Err(failed(writer, &partial, checkpointed, e)),
    };
    if let Some(hub) = &hub {
        hub.mark_verified(&mut inputs);
    }

    let sources = source_stats(recipe, docs_per_source, tokens_per_source, &counters);
    // The padding of every `best_fit` packing of the stream: those a `concat` one followed, and
    // the one in force at the end; the last padded segment's recipe names the packing.
    let padding = match (meta.packing_done, run.packing) {
        (Some(mut done), Some(now)) => {
            done.add(&now);
            Some(done)
        }
        (done, now) => done.or(now),
    };
    let padded = lineage::padded(&segments);
    let made = new_manifest(loaded, dtype, run.leftover_tokens, inputs, sources)
        .map(|m| with_packing(m, padded, padding.as_ref()))
        .map(|m| match &options.lineage {
            Some(_) => lineage::into_manifest(m, &segments, &meta.segments),
            None => m,
        });
    let manifest = match made {
        Ok(manifest) => manifest,
        Err(e) => return Err(failed(writer, &partial, checkpointed, e)),
    };
    let manifest = failure::finish(writer, manifest, &partial, checkpointed)?;
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

/// The pack's sink: windows into the output, a checkpoint into the partial directory with every
/// snapshot (asked for every `checkpoint_every`), counts and progress.
struct PackSink {
    meta: PackCheckpoint,
    writer: PackWriter,
    progress: Progress,
    started: Instant,
    num_docs: u64,
    num_tokens: u64,
    first_window: Option<Duration>,
    checkpoint_every: Duration,
    last_checkpoint: Instant,
    /// Windows up to the newest checkpoint in the partial directory: what a failure keeps.
    checkpointed: Option<u64>,
}

impl SegmentSink for PackSink {
    fn segment_began(&mut self, k: usize, dropped: &[(String, u64)]) {
        self.meta.segment = k;
        if let Some(counts) = self.meta.segments.get_mut(k) {
            counts.dropped = dropped.to_vec();
        }
    }

    fn packer_took_over(&mut self, k: usize, first_window: u64, ended: Option<&PackingCounters>) {
        if let Some(counts) = self.meta.segments.get_mut(k) {
            counts.first_window = Some(first_window);
        }
        if let Some(ended) = ended {
            (self.meta.packing_done.get_or_insert_with(Default::default)).add(ended);
        }
    }
}

impl WindowSink for PackSink {
    fn document(&mut self, doc: ProducedDoc) {
        self.meta.docs_per_source[doc.source as usize] += 1;
        self.meta.tokens_per_source[doc.source as usize] += doc.tokens;
        if let Some(counts) = self.meta.segments.get_mut(self.meta.segment) {
            counts.add(doc.source, doc.tokens);
        }
        self.num_docs += 1;
        self.num_tokens += doc.tokens;
    }

    fn window(&mut self, window: PackedWindow, _: &Snapshots) -> anyhow::Result<Flow> {
        self.writer.write_window(&window)?;
        Ok(Flow::Continue)
    }

    fn snapshot(&mut self, state: PipelineState) -> anyhow::Result<()> {
        self.meta.writer = self.writer.sync()?;
        resume::write(self.writer.partial_dir(), &self.meta, &state)?;
        self.checkpointed = Some(self.meta.writer.num_windows);
        self.last_checkpoint = Instant::now();
        Ok(())
    }

    fn chunk_end(&mut self, _: bool, snapshots: &Snapshots) -> anyhow::Result<Flow> {
        if self.last_checkpoint.elapsed() >= self.checkpoint_every {
            snapshots.ask();
        }
        if self.first_window.is_none() && self.writer.num_windows() > 0 {
            self.first_window = Some(self.started.elapsed());
        }
        let (num_docs, num_tokens) = (self.num_docs, self.num_tokens);
        let rate = num_tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        let windows = self.writer.num_windows();
        self.progress.update(|| {
            format!(
                "{num_docs} docs · {num_tokens} tokens · {:.0}k tokens/s · {windows} windows",
                rate / 1e3,
            )
        });
        Ok(Flow::Continue)
    }
}

/// The token dtype of this recipe's output, and whole windows per token shard (at least one)
/// for `--shard-mib`.
fn output_layout(loaded: &LoadedRecipe, options: &PackOptions) -> (Dtype, u64) {
    let dtype = Dtype::for_vocab(loaded.stage.vocab_size());
    let window_bytes = (loaded.recipe.packing.window_tokens() * dtype.size_bytes()) as u64;
    (dtype, (options.shard_bytes / window_bytes).max(1))
}

/// The result of the input-hashing thread.
fn join_hashing(
    hashing: std::thread::JoinHandle<anyhow::Result<Vec<InputFile>>>,
) -> anyhow::Result<Vec<InputFile>> {
    hashing
        .join()
        .map_err(|_| anyhow!("the input-hashing thread panicked"))
        .and_then(|r| r)
}

/// The manifest's per-source table.
fn source_stats(
    recipe: &Recipe,
    docs_per_source: &[u64],
    tokens_per_source: &[u64],
    counters: &[SourceCounters],
) -> Vec<SourceStats> {
    let targets = target_shares(&recipe.phase_weights()[0]);
    let num_docs: u64 = docs_per_source.iter().sum();
    let num_tokens: u64 = tokens_per_source.iter().sum();
    recipe
        .sources
        .iter()
        .enumerate()
        .map(|(i, spec)| SourceStats {
            name: spec.name.clone(),
            weight: spec.weight,
            target_fraction: targets[i],
            realized_fraction: share(docs_per_source[i], num_docs),
            realized_token_fraction: share(tokens_per_source[i], num_tokens),
            documents: docs_per_source[i],
            tokens: tokens_per_source[i],
            rows_read: counters[i].rows_read,
            rows_filtered: counters[i].rows_filtered,
            rows_empty: counters[i].rows_empty,
            rows_oversize: counters[i].rows_oversize,
            rows_split: counters[i].rows_split,
            split_pieces: counters[i].split_pieces,
            passes_completed: counters[i].passes_completed,
        })
        .collect()
}

/// A manifest for this recipe's output; [`PackWriter::finish`] fills in the files and counts.
fn new_manifest(
    loaded: &LoadedRecipe,
    dtype: Dtype,
    dropped_tail_tokens: u64,
    inputs: Vec<InputFile>,
    sources: Vec<SourceStats>,
) -> anyhow::Result<Manifest> {
    let (recipe, stage) = (&loaded.recipe, &loaded.stage);
    let placeholder = OutputFile {
        file: String::new(),
        size_bytes: 0,
        sha256: String::new(),
    };
    Ok(Manifest {
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
        window_tokens: recipe.packing.window_tokens() as u32,
        num_windows: 0,
        dropped_tail_tokens,
        windows_per_shard: 0,
        shards: Vec::new(),
        doc_starts: placeholder.clone(),
        doc_starts_offsets: placeholder,
        num_doc_starts: 0,
        doc_sources: None,
        lead_sources: None,
        inputs,
        sources,
        chain: Vec::new(),
        phases: Vec::new(),
        real_tokens: None,
        doc_positions: None,
        packing: None,
        lineage: None,
    })
}

/// The manifest's `packing` (format 5) from `best_fit`'s counters, named by `loaded`'s recipe
/// (the last that pads); unchanged without padding.
fn with_packing(
    mut manifest: Manifest,
    loaded: Option<&LoadedRecipe>,
    counters: Option<&PackingCounters>,
) -> Manifest {
    let Some(loaded) = loaded else {
        return manifest;
    };
    let packing = &loaded.recipe.packing;
    if let (Some(pool), Some(c)) = (packing.pool_documents(), counters) {
        manifest.packing = Some(PackingStats {
            strategy: packing.strategy.name().to_string(),
            pool_documents: pool as u64,
            pad_id: loaded.pad_id,
            padding_tokens: c.padding_tokens,
            documents_cut: c.documents_cut,
            cut_pieces: c.cut_pieces,
            pool_peak_documents: c.pool_peak_documents,
            pool_peak_tokens: c.pool_peak_tokens,
        });
    }
    manifest
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
                Shard::Local(path) | Shard::LocalRowGroup { path, .. } => path.clone(),
                Shard::Hub(file) => {
                    inputs.push(InputFile {
                        source: source.clone(),
                        path: file.path.clone(),
                        size_bytes: file.size,
                        sha256: file.sha256.clone().unwrap_or_default(),
                        repo: Some(file.repo.clone()),
                        commit: Some(file.commit.clone()),
                        etag: file.oid.clone(),
                        verified: None,
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
                verified: None,
            });
        }
    }
    Ok(inputs)
}
