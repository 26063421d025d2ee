//! `dsprep pack --lineage`: the stream a daemon served, changes of course included
//! (`lineage.json`), packed; and its ledger per segment: what each recipe drew, by source,
//! against its targets, and what each change dropped. A laned stream's ledger is its lanes'
//! (each lane's pack counts its own, [`lane_counts`] sums them).

use crate::driver::lineage::Segments;
use crate::driver::{LoadedRecipe, load_parsed};
use anyhow::bail;
use dsprep_client::format::{
    DroppedDocuments, LineageSegment, Manifest, SegmentPacking, SegmentSource,
};
use dsprep_mixers::EngineChoice;
use dsprep_mixers::lanes::stream_window;
use dsprep_mixers::mixer::{share, target_shares};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A lineage (a file, or a state directory holding one) with its recipes loaded, the first's
/// tokenizer shared by all (a laned stream's is packed lane by lane: `lanes::pack_lineage`).
pub fn load(path: &Path, engine: EngineChoice) -> anyhow::Result<Segments> {
    let lineage = crate::serve::read_lineage(path)?;
    let first = &lineage.segments[0];
    let label = path.join(format!("segment 0 (recipe {})", first.recipe_hash));
    let loaded = load_parsed(
        first.recipe.clone(),
        first.base.clone().into(),
        &label,
        engine,
    )?;
    Segments::load(lineage, &loaded)
}

/// One segment's count: per source (over the whole lineage) the documents and tokens the
/// packer took while its recipe drew them, and what the change to it dropped. Kept in the
/// pack's checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SegmentCounts {
    pub documents: Vec<u64>,
    pub tokens: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<(String, u64)>,
    /// The first window its packer made (told at the change; absent for the first segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_window: Option<u64>,
    /// A laned lineage's finish: per lane, the first of the lane's own windows its packer made
    /// (from each lane's manifest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lane_first_windows: Vec<u64>,
}

impl SegmentCounts {
    pub fn add(&mut self, source: u16, tokens: u64) {
        let i = usize::from(source);
        if let (Some(d), Some(t)) = (self.documents.get_mut(i), self.tokens.get_mut(i)) {
            *d += 1;
            *t += tokens;
        }
    }
}

/// Empty counts for every segment of `segments`.
pub fn counts(segments: &Segments) -> Vec<SegmentCounts> {
    let sources = segments.lineage.source_names().len();
    let empty = SegmentCounts {
        documents: vec![0; sources],
        tokens: vec![0; sources],
        dropped: Vec::new(),
        first_window: None,
        lane_first_windows: Vec::new(),
    };
    vec![empty; segments.lineage.segments.len()]
}

/// The manifest of a lineage's pack: its segments with their ledgers, and the last recipe's
/// hash.
pub fn into_manifest(
    mut manifest: Manifest,
    segments: &Segments,
    counts: &[SegmentCounts],
) -> Manifest {
    let lineage = &segments.lineage;
    let names = lineage.source_names();
    let last = lineage.segments.last().expect("a lineage has a segment");
    manifest.recipe_hash = last.recipe_hash.clone();
    let packings = segment_packings(segments, counts);
    let listed = (lineage.segments.iter()).zip(&segments.loaded).zip(counts);
    manifest.lineage = Some(
        listed
            .map(|((s, loaded), count)| {
                let weights: Vec<f64> = loaded.recipe.sources.iter().map(|s| s.weight).collect();
                let targets = target_shares(&weights);
                let in_tokens = !loaded.recipe.mix.unit.is_documents();
                let total = |v: &[u64]| v.iter().sum::<u64>();
                let (all_docs, all_tokens) = (total(&count.documents), total(&count.tokens));
                LineageSegment {
                    recipe_hash: s.recipe_hash.clone(),
                    from_step: s.from_step,
                    from_window: s.from_window,
                    from_documents: s.from_documents,
                    global_batch: s.global_batch,
                    sources: (names.iter().enumerate())
                        .map(|(i, name)| SegmentSource {
                            name: name.clone(),
                            target_fraction: targets.get(i).copied().unwrap_or(0.0),
                            realized_fraction: match in_tokens {
                                true => share(count.tokens[i], all_tokens),
                                false => share(count.documents[i], all_docs),
                            },
                            documents: count.documents[i],
                            tokens: count.tokens[i],
                        })
                        .collect(),
                    dropped: (count.dropped.iter())
                        .map(|(source, documents)| DroppedDocuments {
                            source: source.clone(),
                            documents: *documents,
                        })
                        .collect(),
                    packing: None,
                }
            })
            .zip(packings)
            .map(|(segment, packing)| LineageSegment { packing, ..segment })
            .collect(),
    );
    manifest
}

/// The recipe that names a lineage pack's packing: the last segment's that pads (none pads:
/// none).
pub fn padded(segments: &Segments) -> Option<&LoadedRecipe> {
    (segments.loaded.iter().rev()).find(|l| l.recipe.packing.pads())
}

/// Each segment's packing (format 7) when the lineage's segments do not all pack alike (the
/// strategy, and the pad of those that pad); else none. A laned stream's finish has each lane's
/// first window of each segment (`lane_first_windows`): the segment's `first_window` is the
/// first window of the stream any of them is.
fn segment_packings(segments: &Segments, counts: &[SegmentCounts]) -> Vec<Option<SegmentPacking>> {
    let packing = |k: usize| {
        let loaded = &segments.loaded[k];
        let pads = loaded.recipe.packing.pads();
        let lanes = counts.get(k).map(|c| &c.lane_first_windows);
        let lanes = lanes.filter(|l| !l.is_empty()).zip(loaded.recipe.lanes);
        let first_window = match (k, lanes) {
            (0, _) => 0,
            (_, Some((firsts, spec))) => (firsts.iter().zip(0u32..))
                .map(|(&w, lane)| stream_window(&spec, lane, w))
                .min()
                .unwrap_or(segments.lineage.segments[k].from_window),
            (_, None) => (counts.get(k).and_then(|c| c.first_window))
                .unwrap_or(segments.lineage.segments[k].from_window),
        };
        SegmentPacking {
            strategy: loaded.recipe.packing.strategy.name().to_string(),
            pad_id: pads.then_some(loaded.pad_id),
            first_window,
            lane_first_windows: lanes.map(|(firsts, _)| firsts.clone()),
        }
    };
    let all: Vec<SegmentPacking> = (0..segments.loaded.len()).map(packing).collect();
    let alike =
        (all.windows(2)).all(|p| (&p[0].strategy, p[0].pad_id) == (&p[1].strategy, p[1].pad_id));
    all.into_iter().map(|p| (!alike).then_some(p)).collect()
}

/// The counts of a laned lineage's pack: per segment and source, the lanes' ledgers (each lane's
/// manifest `lineage`, `lanes[i]` being lane `i`'s) summed; what the changes dropped summed per
/// source. A lane packed without the lineage (or another one) is refused, naming it.
pub fn lane_counts(
    segments: &Segments,
    lanes: &[(&Path, Option<&[LineageSegment]>)],
) -> anyhow::Result<Vec<SegmentCounts>> {
    let names = segments.lineage.source_names();
    let mut all = counts(segments);
    for (lane, (dir, ledger)) in lanes.iter().enumerate() {
        let Some(ledger) = ledger else {
            bail!(
                "lane {lane} in {} was packed without the lineage (its manifest has no \
                 `lineage`): pack the lineage again with --fresh",
                dir.display()
            );
        };
        if ledger.len() != all.len() {
            bail!(
                "lane {lane} in {} packs {} segments, the lineage has {}: pack it again with \
                 --fresh",
                dir.display(),
                ledger.len(),
                all.len()
            );
        }
        for (count, segment) in all.iter_mut().zip(ledger.iter()) {
            // The lane's own first window of the segment's packing (its point's window when the
            // lane's segments all pack alike, as then the stream's do too).
            let first = segment.packing.as_ref().map(|p| p.first_window);
            (count.lane_first_windows).push(first.unwrap_or(segment.from_window));
            for source in &segment.sources {
                let Some(i) = names.iter().position(|n| *n == source.name) else {
                    bail!(
                        "lane {lane} in {}: source {:?} is not in the lineage",
                        dir.display(),
                        source.name
                    );
                };
                count.documents[i] += source.documents;
                count.tokens[i] += source.tokens;
            }
            for dropped in &segment.dropped {
                match count.dropped.iter_mut().find(|(n, _)| *n == dropped.source) {
                    Some((_, n)) => *n += dropped.documents,
                    None => count
                        .dropped
                        .push((dropped.source.clone(), dropped.documents)),
                }
            }
        }
    }
    for count in &mut all {
        count
            .dropped
            .sort_by_key(|(name, _)| names.iter().position(|n| n == name));
    }
    Ok(all)
}
