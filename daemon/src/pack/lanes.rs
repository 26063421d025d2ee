//! `dsprep pack` for a recipe with `[lanes]`, in parts that separate processes can run (Slurm
//! array tasks) and a finish that puts them together.
//!
//! - A **part** (`--part i --parts P`) packs the lanes `l` with `l × P div count = i`, one after
//!   another, each with every tokenizer thread, each into its own packed directory
//!   `OUT.lanes/lane-NNNNN/` (format v1, written under a temporary name and renamed when
//!   complete, plus `lane.json`). A rerun skips the lanes already complete, so a killed task
//!   continues at its first unfinished lane. One process may pack several parts in turn (a
//!   Slurm task's); each leaves a record of how it ended (`super::records`) for the status.
//! - The **finish** (`--finish`) checks that every lane is there and belongs to this recipe,
//!   interleaves their windows block by block (`dsprep_mixers::lanes`), and writes `OUT`: the
//!   same bytes, manifest included, that one `dsprep pack` of the recipe writes (which is a
//!   part 0 of 1 followed by the finish). Then it removes `OUT.lanes`.
//! - A **lineage** (`--lineage` of a laned stream, [`pack_lineage`]): each lane runs its own
//!   lineage (the stream's, at the lane's points that its node daemon recorded), then the
//!   finish, as the node daemons served it.

use super::failure::{self, failed};
use super::ledger::PackLedger;
use super::lineage::{self as ledger_of, SegmentCounts};
use super::output::{self, PackWriter};
use super::records;
use super::status::{self, Resubmit};
use super::{
    PackOptions, PackReport, hash_inputs, join_hashing, new_manifest, output_layout, source_stats,
    with_packing,
};
use crate::checkpoint::lane_lineage;
use crate::checkpoint::lineage as lineage_file;
use crate::driver::lanes::{LaneInputs, deal_inputs, deal_segments};
use crate::driver::lineage::{SegmentSink, Segments};
use crate::driver::pipeline::{CHUNK_TEXT_BYTES, PipelineConfig, ProducedDoc};
use crate::driver::run::{Flow, Snapshots, StreamStart, WindowSink, run_stream};
use crate::driver::{LoadedRecipe, hub_client};
use crate::sources::Shard;
use anyhow::{Context, anyhow, bail};
use dsprep_client::format::{InputFile, Manifest};
use dsprep_client::packed::PackedDataset;
use dsprep_mixers::PackedWindow;
use dsprep_mixers::doc::SourceCounters;
use dsprep_mixers::lanes::{block_lane, blocks_known};
use dsprep_mixers::packer::{PackingCounters, UNKNOWN_SOURCE};
use dsprep_mixers::recipe::LanesSpec;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `--part i --parts P`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    pub part: u32,
    pub parts: u32,
}

impl Parts {
    /// The lanes this part packs.
    fn lanes(&self, spec: &LanesSpec) -> Vec<u32> {
        status::part_lanes(self.part, self.parts, spec.count).collect()
    }
}

/// What a part did.
pub struct PartReport {
    pub parts: Parts,
    pub lanes_dir: PathBuf,
    pub packed: Vec<u32>,
    /// Lanes found complete from an earlier run and kept.
    pub kept: Vec<u32>,
    /// Bytes of the input units of this part's lanes.
    pub input_bytes: u64,
    pub wall: Duration,
}

/// Beside every lane's packed directory: which lane of which recipe it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct LaneInfo {
    recipe_hash: String,
    lane: u32,
    count: u32,
    block_windows: u32,
    /// Bytes of the input units dealt to this lane.
    input_bytes: u64,
    /// Packing a lineage: its identity (`checkpoint::lineage::hash`), so a lane of another
    /// lineage, or of its last recipe alone, is not taken for this one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lineage: Option<String>,
}

const LANE_INFO_FILE: &str = "lane.json";

impl LaneInfo {
    fn new(
        loaded: &LoadedRecipe,
        inputs: &LaneInputs,
        lane: u32,
        lineage: Option<&str>,
    ) -> LaneInfo {
        LaneInfo {
            recipe_hash: loaded.recipe.hash(),
            lane,
            count: inputs.spec.count,
            block_windows: inputs.spec.block_windows,
            input_bytes: inputs.lane_bytes[lane as usize],
            lineage: lineage.map(str::to_string),
        }
    }
}

/// `OUT.lanes`, beside `out`.
fn lanes_dir(out: &Path) -> anyhow::Result<PathBuf> {
    output::sibling_dir(out, "lanes")
}

fn lane_dir(lanes_dir: &Path, lane: u32) -> PathBuf {
    lanes_dir.join(format!("lane-{lane:05}"))
}

pub(super) fn spec_of(loaded: &LoadedRecipe) -> anyhow::Result<LanesSpec> {
    loaded.recipe.lanes.ok_or_else(|| {
        anyhow!(
            "--part/--parts and --finish need a recipe with [lanes] (the recipe's stream is one \
             pipeline; see config/quickstart-multinode.toml)"
        )
    })
}

/// A lane's complete directory, if it holds this lane of this recipe.
fn complete_lane(dir: &Path, want: &LaneInfo) -> Option<PackedDataset> {
    let info: LaneInfo =
        serde_json::from_slice(&std::fs::read(dir.join(LANE_INFO_FILE)).ok()?).ok()?;
    if info != *want {
        return None;
    }
    PackedDataset::open(dir).ok()
}

/// The Hub files lane `lane` reads, each with what its reads in this process were checked
/// against: the lane's manifest keeps them for the finish, which may run in another process.
fn lane_hub_inputs(
    loaded: &LoadedRecipe,
    inputs: &LaneInputs,
    lane: u32,
) -> anyhow::Result<Vec<InputFile>> {
    let Some(hub) = inputs.hub() else {
        return Ok(Vec::new());
    };
    let lists: Vec<(String, Vec<Shard>)> = loaded
        .recipe
        .sources
        .iter()
        .zip(&inputs.lanes[lane as usize])
        .map(|(spec, shards)| {
            let hub_shards = shards.iter().filter(|s| matches!(s, Shard::Hub(_)));
            (spec.name.clone(), hub_shards.cloned().collect())
        })
        .collect();
    let mut read = hash_inputs(&lists, &loaded.base)?;
    hub.mark_verified(&mut read);
    Ok(read)
}

/// Each Hub input's `verified` as the lane that read it recorded it (lanes written by an older
/// dsprep record nothing: the input's `verified` stays absent).
fn verified_from_lanes(inputs: &mut [InputFile], lanes: &[PackedDataset]) {
    let key = |i: &InputFile| (i.repo.clone(), i.commit.clone(), i.path.clone());
    let recorded: std::collections::HashMap<_, _> = lanes
        .iter()
        .flat_map(|lane| lane.manifest().inputs.iter())
        .filter(|i| i.repo.is_some())
        .map(|i| (key(i), i.verified.clone()))
        .collect();
    for input in inputs.iter_mut().filter(|i| i.repo.is_some()) {
        input.verified = recorded.get(&key(input)).cloned().flatten();
    }
}

/// Pack the lanes of each of `list`'s parts into `OUT.lanes/`, one part after another (the
/// input listed once), each part's end recorded beside its lanes; stops at the first that fails.
pub fn pack_parts(
    options: &PackOptions,
    loaded: &LoadedRecipe,
    list: &[Parts],
) -> anyhow::Result<Vec<PartReport>> {
    let spec = spec_of(loaded)?;
    for &parts in list {
        check_parts(spec, parts)?;
    }
    let inputs = deal_inputs(loaded, hub_client(loaded)?)?;
    for warning in inputs.warnings(&loaded.recipe) {
        tracing::warn!("{warning}");
    }
    let mut reports = Vec::with_capacity(list.len());
    for &parts in list {
        let started = Instant::now();
        let report = pack_dealt_part(options, loaded, &inputs, parts, None, started, true)?;
        reports.push(report);
    }
    if list.is_empty() {
        tracing::info!("this task has no parts to pack");
    }
    Ok(reports)
}

/// A part's failure, with what `OUT.lanes` holds said last: kept with the lanes complete there
/// (a rerun keeps them) or with the part's record of the failure (`recorded`), or removed when
/// it holds nothing at all.
fn lanes_left(
    dir: &Path,
    loaded: &LoadedRecipe,
    inputs: &LaneInputs,
    lineage: Option<&str>,
    recorded: Option<&Path>,
    cause: anyhow::Error,
) -> anyhow::Error {
    let complete: Vec<u32> = (0..inputs.spec.count)
        .filter(|&l| {
            let info = LaneInfo::new(loaded, inputs, l, lineage);
            complete_lane(&lane_dir(dir, l), &info).is_some()
        })
        .collect();
    let shown = dir.display();
    let outcome = match (complete.len(), recorded) {
        (0, Some(record)) => format!(
            "kept {shown}: no lane is complete there; the failure is recorded in {} (`dsprep \
             pack --status` shows it)",
            record.display()
        ),
        (n, Some(record)) => format!(
            "kept {shown}: {n} of {} lanes are complete there ({complete:?}); the same command \
             keeps them and packs the rest; the failure is recorded in {}",
            inputs.spec.count,
            record.display()
        ),
        (0, None) => match std::fs::remove_dir(dir) {
            Ok(()) => format!("removed {shown}: no lane was complete"),
            Err(_) => format!(
                "kept {shown}: no lane is complete, but it is not empty (other parts write there)"
            ),
        },
        (n, None) => format!(
            "kept {shown}: {n} of {} lanes are complete there ({complete:?}); the same command \
             keeps them and packs the rest",
            inputs.spec.count
        ),
    };
    failure::with_outcome(cause, outcome)
}

/// `--part` and `--parts` against the recipe's lanes.
fn check_parts(spec: LanesSpec, parts: Parts) -> anyhow::Result<()> {
    if parts.parts == 0 || parts.part >= parts.parts {
        bail!(
            "--part {} is not below --parts {}: parts are numbered 0..{}",
            parts.part,
            parts.parts,
            parts.parts.saturating_sub(1)
        );
    }
    if parts.parts > spec.count {
        bail!(
            "--parts {} is more than the recipe's lanes.count = {}: a part packs whole lanes, \
             so use at most {} parts (or raise lanes.count, which changes the stream)",
            parts.parts,
            spec.count,
            spec.count
        );
    }
    Ok(())
}

/// One part of input already dealt ([`pack_parts`]); with `record`, the part's end is recorded
/// in `OUT.lanes/` for the status.
fn pack_dealt_part(
    options: &PackOptions,
    loaded: &LoadedRecipe,
    inputs: &LaneInputs,
    parts: Parts,
    lineage: Option<(&str, &[Segments])>,
    started: Instant,
    record: bool,
) -> anyhow::Result<PartReport> {
    let stream = lineage.map(|(hash, _)| hash);
    let spec = inputs.spec;
    let dir = lanes_dir(&options.out)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let recipe_hash = loaded.recipe.hash();
    if record {
        records::clear(&dir, parts.part, parts.parts)?;
    }
    let mut report = PartReport {
        parts,
        lanes_dir: dir.clone(),
        packed: Vec::new(),
        kept: Vec::new(),
        input_bytes: parts
            .lanes(&spec)
            .iter()
            .map(|&l| inputs.lane_bytes[l as usize])
            .sum(),
        wall: Duration::ZERO,
    };
    for lane in parts.lanes(&spec) {
        let info = LaneInfo::new(loaded, inputs, lane, stream);
        let out = lane_dir(&dir, lane);
        if complete_lane(&out, &info).is_some() && !options.fresh {
            tracing::info!("lane {lane}: {} is complete, kept", out.display());
            report.kept.push(lane);
            continue;
        }
        // A lane another task is packing (the part submitted twice) is left to it, unrecorded.
        let partial = output::partial_dir(&out)?;
        if output::partial_held(&partial)? {
            bail!(
                "part {} of {}: lane {lane}'s {} is locked by another running task (this part \
                 runs twice?): left to it, nothing removed; `dsprep pack --status` shows the \
                 part as running",
                parts.part,
                parts.parts,
                partial.display()
            );
        }
        let segments = lineage.and_then(|(_, l)| l.get(lane as usize));
        if let Err(e) = pack_lane(options, loaded, inputs, &info, segments, &out) {
            let e = e.context(format!("lane {lane} of {}", spec.count));
            let recorded = match record {
                true => records::write(&dir, parts.part, parts.parts, &recipe_hash, Some(&e))
                    .map_err(|r| tracing::warn!("{r:#}"))
                    .ok(),
                false => None,
            };
            return Err(lanes_left(
                &dir,
                loaded,
                inputs,
                stream,
                recorded.as_deref(),
                e,
            ));
        }
        report.packed.push(lane);
    }
    if record {
        records::write(&dir, parts.part, parts.parts, &recipe_hash, None)?;
    }
    report.wall = started.elapsed();
    Ok(report)
}

/// A lane's windows into its packed directory, with its documents and tokens per source (and,
/// packing a lineage, per segment: the lane's ledger, the single daemon's counts).
struct LaneSink {
    writer: PackWriter,
    docs: Vec<u64>,
    tokens: Vec<u64>,
    segment: usize,
    segments: Vec<SegmentCounts>,
    /// The counters of the `best_fit` packings a `concat` one followed (packing a lineage).
    packing_done: Option<PackingCounters>,
}

impl SegmentSink for LaneSink {
    fn segment_began(&mut self, k: usize, dropped: &[(String, u64)]) {
        self.segment = k;
        if let Some(counts) = self.segments.get_mut(k) {
            counts.dropped = dropped.to_vec();
        }
    }

    fn packer_took_over(&mut self, k: usize, first_window: u64, ended: Option<&PackingCounters>) {
        if let Some(counts) = self.segments.get_mut(k) {
            counts.first_window = Some(first_window);
        }
        if let Some(ended) = ended {
            (self.packing_done.get_or_insert_with(Default::default)).add(ended);
        }
    }
}

impl WindowSink for LaneSink {
    fn keeps_snapshots(&self) -> bool {
        false // a lane of a pack has no checkpoints
    }

    fn document(&mut self, doc: ProducedDoc) {
        self.docs[doc.source as usize] += 1;
        self.tokens[doc.source as usize] += doc.tokens;
        if let Some(counts) = self.segments.get_mut(self.segment) {
            counts.add(doc.source, doc.tokens);
        }
    }

    fn window(&mut self, window: PackedWindow, _: &Snapshots) -> anyhow::Result<Flow> {
        self.writer.write_window(&window)?;
        Ok(Flow::Continue)
    }
}

fn pack_lane(
    options: &PackOptions,
    loaded: &LoadedRecipe,
    inputs: &LaneInputs,
    info: &LaneInfo,
    segments: Option<&Segments>,
    out: &Path,
) -> anyhow::Result<()> {
    let began = Instant::now();
    let (dtype, per_shard) = output_layout(loaded, options);
    let stream = match segments {
        None => Some(inputs.stream(loaded, info.lane, options.threads)?),
        Some(_) => None,
    };
    let columns = columns_of(loaded, segments);
    let writer = PackWriter::create(out, dtype, per_shard, None, columns)?;
    // A lane has no checkpoints: a failure removes its partial directory.
    let partial = writer.partial_dir().to_path_buf();
    if let Err(e) = writer.add_tokenizer(&loaded.tokenizer_json) {
        return Err(failed(writer, &partial, None, e));
    }
    let n = loaded.recipe.sources.len();
    let mut sink = LaneSink {
        writer,
        docs: vec![0u64; n],
        tokens: vec![0u64; n],
        segment: segments.map_or(0, |s| s.lineage.first_segment()),
        segments: segments.map(ledger_of::counts).unwrap_or_default(),
        packing_done: None,
    };
    let config = PipelineConfig::new(options.threads, CHUNK_TEXT_BYTES);
    let packing = loaded.packer(Some(info.lane));
    let run = match (segments, stream) {
        (Some(s), _) => s.run(
            s.lineage.first_segment(),
            StreamStart::Fresh,
            None,
            &config,
            &mut sink,
        ),
        (None, Some(stream)) => run_stream(
            loaded,
            stream,
            StreamStart::Fresh,
            config,
            packing,
            &mut sink,
        ),
        (None, None) => Err(anyhow!("internal error: lane {} has no stream", info.lane)),
    };
    let LaneSink {
        writer,
        docs,
        tokens,
        segments: counts,
        packing_done,
        ..
    } = sink;
    let run = match run {
        Ok(run) => run,
        Err(e) => return Err(failed(writer, &partial, None, e)),
    };
    let sources = source_stats(&loaded.recipe, &docs, &tokens, &run.counters);
    let read = match lane_hub_inputs(loaded, inputs, info.lane) {
        Ok(read) => read,
        Err(e) => return Err(failed(writer, &partial, None, e)),
    };
    // Packing a lineage: the padding of every `best_fit` packing of the lane, named by the last
    // that pads (as a single stream's pack).
    let padding = match (packing_done, run.packing) {
        (Some(mut done), Some(now)) => {
            done.add(&now);
            Some(done)
        }
        (done, now) => done.or(now),
    };
    let padded = segments.map_or(Some(loaded), ledger_of::padded);
    let finished = new_manifest(loaded, dtype, run.leftover_tokens, read, sources)
        .map(|m| with_packing(m, padded, padding.as_ref()))
        .map(|m| match segments {
            Some(s) => ledger_of::into_manifest(m, s, &counts),
            None => m,
        })
        .and_then(|manifest| {
            let json = serde_json::to_vec_pretty(info).context("cannot encode lane.json")?;
            writer.add_file(LANE_INFO_FILE, &json)?;
            Ok(manifest)
        });
    let manifest = match finished {
        Ok(manifest) => manifest,
        Err(e) => return Err(failed(writer, &partial, None, e)),
    };
    let manifest = failure::finish(writer, manifest, &partial, None)?;
    tracing::info!(
        "lane {}: {} windows, {} input bytes, {:.2} s",
        info.lane,
        manifest.num_windows,
        info.input_bytes,
        began.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The columns of a lane's pack or the finish: a lineage's (padded when any segment pads), or
/// the recipe's.
fn columns_of(loaded: &LoadedRecipe, lineage: Option<&Segments>) -> output::Columns {
    match lineage {
        Some(segments) => {
            let recipes: Vec<_> = (segments.loaded.iter()).map(|l| l.recipe.clone()).collect();
            output::Columns::of_lineage(&recipes)
        }
        None => output::Columns::of(&loaded.recipe),
    }
}

/// Put every lane of `OUT.lanes/` together into `OUT`; with `resubmit`, one that finds lanes
/// missing names the parts to run again as `--status` does.
pub fn finish(
    options: &PackOptions,
    loaded: &LoadedRecipe,
    resubmit: Option<&Resubmit>,
) -> anyhow::Result<PackReport> {
    let started = Instant::now();
    spec_of(loaded)?;
    output::refuse_existing(&options.out, options.force)?;
    let inputs = deal_inputs(loaded, hub_client(loaded)?)?;
    finish_dealt(options, loaded, &inputs, None, started, resubmit)
}

/// [`finish`] of input already dealt; packing a lineage (`lineage`), the manifest carries its
/// segments with the lanes' ledgers summed.
fn finish_dealt(
    options: &PackOptions,
    loaded: &LoadedRecipe,
    inputs: &LaneInputs,
    lineage: Option<&Segments>,
    started: Instant,
    resubmit: Option<&Resubmit>,
) -> anyhow::Result<PackReport> {
    let spec = inputs.spec;
    let dir = lanes_dir(&options.out)?;
    let stream = lineage.map(|s| lineage_file::hash(&s.lineage));
    let mut lanes = Vec::with_capacity(spec.count as usize);
    let mut missing = Vec::new();
    for lane in 0..spec.count {
        let info = LaneInfo::new(loaded, inputs, lane, stream.as_deref());
        match complete_lane(&lane_dir(&dir, lane), &info) {
            Some(data) => lanes.push(data),
            None => missing.push(lane),
        }
    }
    if !missing.is_empty() {
        let job = status::Job {
            recipe: &options.recipe,
            out: &options.out,
            plan: options.plan.as_deref(),
            recipe_hash: &loaded.recipe.hash(),
            lanes: spec.count,
        };
        return Err(status::not_finished(&job, &dir, &missing, resubmit));
    }
    let (dtype, per_shard) = output_layout(loaded, options);
    let k = u64::from(spec.block_windows);
    let ended: Vec<(u64, bool)> = lanes.iter().map(|d| (d.num_windows() / k, true)).collect();
    let (blocks, _) = blocks_known(&spec, &ended);
    let hashing = {
        let lists: Vec<(String, Vec<_>)> = loaded
            .recipe
            .sources
            .iter()
            .map(|s| s.name.clone())
            .zip(inputs.sources.iter().cloned())
            .collect();
        let base = loaded.base.clone();
        std::thread::Builder::new()
            .name("dsprep-hash-inputs".into())
            .spawn(move || hash_inputs(&lists, &base))
            .context("cannot start the input-hashing thread")?
    };
    let ledger = PackLedger::new(&loaded.recipe);
    let columns = columns_of(loaded, lineage);
    let mut writer = PackWriter::create(&options.out, dtype, per_shard, Some(ledger), columns)?;
    // The finish has no checkpoints (the lanes are its input): a failure removes its partial.
    let partial = writer.partial_dir().to_path_buf();
    let written = match copy_blocks(&mut writer, &spec, &lanes, blocks, loaded) {
        Ok(written) => written,
        Err(e) => return Err(failed(writer, &partial, None, e)),
    };
    let mut inputs_hashed = match join_hashing(hashing) {
        Ok(inputs) => inputs,
        Err(e) => return Err(failed(writer, &partial, None, e)),
    };
    // From the lanes' manifests, not this process: the lanes may have been packed by others.
    verified_from_lanes(&mut inputs_hashed, &lanes);
    let (docs, tokens, counters) = lane_totals(&lanes);
    let sources = source_stats(&loaded.recipe, &docs, &tokens, &counters);
    let dropped = tokens.iter().sum::<u64>() - written;
    let window_tokens = loaded.recipe.packing.window_tokens() as u64;
    let packing = lane_packing(&lanes, blocks * k * window_tokens - written);
    let padded = lineage.map_or(Some(loaded), ledger_of::padded);
    let made = new_manifest(loaded, dtype, dropped, inputs_hashed, sources)
        .map(|m| with_packing(m, padded, packing.as_ref()))
        .and_then(|m| match lineage {
            Some(segments) => {
                let ledgers: Vec<_> = (0..spec.count)
                    .map(|l| lane_dir(&dir, l))
                    .zip(&lanes)
                    .map(|(d, data)| (d, data.manifest().lineage.as_deref()))
                    .collect();
                let ledgers: Vec<_> = (ledgers.iter()).map(|(d, l)| (d.as_path(), *l)).collect();
                let counts = ledger_of::lane_counts(segments, &ledgers)?;
                Ok(ledger_of::into_manifest(m, segments, &counts))
            }
            None => Ok(m),
        });
    let manifest = match made {
        Ok(manifest) => manifest,
        Err(e) => return Err(failed(writer, &partial, None, e)),
    };
    let manifest = failure::finish(writer, manifest, &partial, None)?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    Ok(PackReport {
        manifest,
        out: options.out.clone(),
        wall: started.elapsed(),
        time_to_first_window: None,
        threads: options.threads,
        engine: loaded.stage.engine_description(),
        continued_from: None,
    })
}

/// Write the first `blocks` blocks of the interleave from the lanes; returns the tokens written
/// before padding.
fn copy_blocks(
    writer: &mut PackWriter,
    spec: &LanesSpec,
    lanes: &[PackedDataset],
    blocks: u64,
    loaded: &LoadedRecipe,
) -> anyhow::Result<u64> {
    writer.add_tokenizer(&loaded.tokenizer_json)?;
    let k = u64::from(spec.block_windows);
    let mut real_tokens = 0;
    for block in 0..blocks {
        let (lane, lane_block) = block_lane(spec, block);
        let data = &lanes[lane as usize];
        for w in lane_block * k..(lane_block + 1) * k {
            let window = data
                .window(w)
                .with_context(|| format!("lane {lane}: window {w}"))?;
            real_tokens += u64::from(window.real_tokens);
            writer.write_window(&PackedWindow {
                tokens: window.tokens.to_vec(),
                real_tokens: window.real_tokens,
                doc_starts: window.doc_starts.to_vec(),
                doc_sources: window.doc_sources.map_or_else(
                    || vec![UNKNOWN_SOURCE; window.doc_starts.len()],
                    <[u16]>::to_vec,
                ),
                lead_source: window.lead_source.unwrap_or(UNKNOWN_SOURCE),
                doc_positions: window
                    .doc_positions
                    .map(<[u64]>::to_vec)
                    .unwrap_or_default(),
            })?;
        }
    }
    Ok(real_tokens)
}

/// `best_fit`'s counters of the whole stream: the lanes' cuts and pool peaks, and the padding of
/// the windows written (`padding_tokens`); `None` when the lanes have none (`concat`).
fn lane_packing(lanes: &[PackedDataset], padding_tokens: u64) -> Option<PackingCounters> {
    let mut total: Option<PackingCounters> = None;
    for stats in lanes.iter().filter_map(|d| d.manifest().packing.as_ref()) {
        total.get_or_insert_default().add(&PackingCounters {
            documents_cut: stats.documents_cut,
            cut_pieces: stats.cut_pieces,
            padding_tokens: 0,
            pool_peak_documents: stats.pool_peak_documents,
            pool_peak_tokens: stats.pool_peak_tokens,
        });
    }
    total.map(|t| PackingCounters {
        padding_tokens,
        ..t
    })
}

/// Per source, the documents, tokens and counters of every lane together.
fn lane_totals(lanes: &[PackedDataset]) -> (Vec<u64>, Vec<u64>, Vec<SourceCounters>) {
    let n = lanes.first().map_or(0, |d| d.manifest().sources.len());
    let (mut docs, mut tokens) = (vec![0u64; n], vec![0u64; n]);
    let mut counters = vec![SourceCounters::default(); n];
    for manifest in lanes.iter().map(PackedDataset::manifest) {
        let manifest: &Manifest = manifest;
        for (i, s) in manifest.sources.iter().enumerate().take(n) {
            docs[i] += s.documents;
            tokens[i] += s.tokens;
            counters[i].rows_read += s.rows_read;
            counters[i].rows_filtered += s.rows_filtered;
            counters[i].rows_empty += s.rows_empty;
            counters[i].rows_oversize += s.rows_oversize;
            counters[i].rows_split += s.rows_split;
            counters[i].split_pieces += s.split_pieces;
            counters[i].documents += s.documents;
            counters[i].passes_completed += s.passes_completed;
        }
    }
    (docs, tokens, counters)
}

/// One `dsprep pack` of a recipe with lanes: every lane (part 0 of 1), then the finish.
pub fn pack_all(
    options: &PackOptions,
    loaded: &LoadedRecipe,
    started: Instant,
) -> anyhow::Result<PackReport> {
    output::refuse_existing(&options.out, options.force)?;
    // Listed once for both steps.
    let inputs = deal_inputs(loaded, hub_client(loaded)?)?;
    for warning in inputs.warnings(&loaded.recipe) {
        tracing::warn!("{warning}");
    }
    pack_dealt_part(
        options,
        loaded,
        &inputs,
        Parts { part: 0, parts: 1 },
        None,
        started,
        false,
    )?;
    let mut report = finish_dealt(options, loaded, &inputs, None, started, None)?;
    report.wall = started.elapsed();
    Ok(report)
}

/// `dsprep pack --lineage` of a laned stream (`segments`, read from `path`: a state directory
/// or its `lineage.json`): each lane's points read from the state directory
/// (`checkpoint::lane_lineage`), each lane run through its own lineage, then the finish, so the
/// pack holds the windows the node daemons served.
pub fn pack_lineage(
    options: &PackOptions,
    segments: &Segments,
    path: &Path,
    started: Instant,
) -> anyhow::Result<PackReport> {
    output::refuse_existing(&options.out, options.force)?;
    let spec = spec_of(&segments.loaded[0])?;
    let state_dir = match path.is_dir() {
        true => path,
        false => path.parent().unwrap_or(Path::new(".")),
    };
    let inputs = deal_segments(segments)?;
    let lineage = &segments.lineage;
    let mut lanes = Vec::with_capacity(spec.count as usize);
    for lane in 0..spec.count {
        let mut points = lane_lineage::read(state_dir, lane)?;
        if lineage.segments.len() == 1 && points.is_empty() {
            points.push(dsprep_mixers::lineage::LanePoint {
                recipe_hash: lineage.segments[0].recipe_hash.clone(),
                from_step: 0,
                window: 0,
                documents: 0,
            });
        }
        let valid = lineage.valid_points(&points);
        if valid < lineage.segments.len() {
            let s = &lineage.segments[valid];
            bail!(
                "{}: lane {lane} has no point for segment {valid} (recipe {} from step {}): the \
                 node daemon that runs lane {lane} has not served past that change of course \
                 yet, so where it takes over in that lane is not known; resume that node daemon \
                 once, then pack",
                lane_lineage::path_in(state_dir, lane).display(),
                s.recipe_hash,
                s.from_step
            );
        }
        lanes.push(Segments::for_lane(
            lineage.for_lane(&points[..valid]),
            &segments.loaded[0],
            lane,
            inputs.clone(),
        )?);
    }
    let last = segments.loaded.last().context("a lineage has a segment")?;
    let dealt = inputs.last().context("a lineage has a segment")?;
    let stream = lineage_file::hash(lineage);
    pack_dealt_part(
        options,
        last,
        dealt,
        Parts { part: 0, parts: 1 },
        Some((&stream, &lanes)),
        started,
        false,
    )?;
    let mut report = finish_dealt(options, last, dealt, Some(segments), started, None)?;
    report.wall = started.elapsed();
    Ok(report)
}
