//! `dsprep pack --lineage`: the stream a daemon served, changes of course included
//! (`lineage.json`), packed; and its ledger per segment: what each recipe drew, by source,
//! against its targets, and what each change dropped.

use crate::driver::lineage::Segments;
use crate::driver::load_parsed;
use dsprep_client::format::{DroppedDocuments, LineageSegment, Manifest, SegmentSource};
use dsprep_mixers::EngineChoice;
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
    Ok(Segments::load(lineage, &loaded))
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
                }
            })
            .collect(),
    );
    manifest
}
