//! A stream's lineage: the recipe it started with, then each change of course and the exact
//! point from which it holds. Plain data and the rules on it (IO-free): which edits a change may
//! make, how steps map to windows across changes of the global batch, the order of sources over
//! the whole lineage, and how the pipeline's state at a change becomes the next recipe's
//! ([`transplant()`]). The daemon keeps the lineage in its state directory (`lineage.json`);
//! `dsprep pack --lineage` replays it.
//!
//! A change made at step `T` takes over at a document boundary: the first one at which the old
//! recipe's packer has emitted every window below `T` (window `from_window`). The documents the
//! old recipe had drawn by then (`from_documents`) are its; every later draw is the new recipe's.
//! So steps below `T` are exactly what the old recipe served, and what the packer still holds at
//! the boundary (the end of the document that crossed it, a `best_fit` pool) opens step `T`,
//! made the next packing's when `[packing]` changes (`packer/transplant.rs`).
//!
//! Sources keep one index over the whole lineage: those of the first recipe in its order, then
//! each source a change adds, in the order it is listed. A segment's stream is built over all of
//! them, those its recipe lacks at weight 0 (never drawn, never read), so a source's cursor,
//! its documents in the shuffle buffer and its id in every served window keep their meaning.

use crate::adaptive::Decision;
use crate::recipe::{Recipe, SourceSpec};
use serde::{Deserialize, Serialize};

/// The newest lineage format this build reads and writes: 2 adds the decisions of
/// `[mix.adaptive]` ([`Segment::decisions`]). A lineage without decisions is written as format 1,
/// byte for byte as before.
pub const LINEAGE_FORMAT: u32 = 2;
/// The format of a lineage without decisions.
pub const LINEAGE_FORMAT_PLAIN: u32 = 1;

/// The recipes of one stream, in the order they took over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lineage {
    pub format: u32,
    /// The segments in force, in stream order; the first starts at step 0.
    pub segments: Vec<Segment>,
    /// Branches replaced by a change made below them (the trainers rolled back): kept for the
    /// record, never served.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abandoned: Vec<Segment>,
}

/// One recipe's stretch of the stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// The recipe as written (its canonical form), and its hash.
    pub recipe: Recipe,
    pub recipe_hash: String,
    /// The folder its relative paths are resolved from.
    pub base: String,
    /// The first step, window and document of the stream that this segment's recipe makes (its
    /// first windows may still hold the previous recipe's documents: see the module's doc).
    pub from_step: u64,
    pub from_window: u64,
    pub from_documents: u64,
    /// Windows per step from `from_step` on, and the layout that set it.
    pub global_batch: u64,
    pub world_size: u32,
    pub micro_batch: u32,
    /// `[mix.adaptive]`: the decisions made in this segment, in step order. Each is a phase of
    /// the segment's mix from its token point on ([`Lineage::effective_recipe`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
}

/// Why an edited recipe cannot continue a stream: the field and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub field: String,
    pub why: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

impl Lineage {
    /// A stream's lineage at its start: one recipe from step 0.
    pub fn start(recipe: Recipe, base: String, world_size: u32, micro_batch: u32) -> Lineage {
        Lineage {
            format: LINEAGE_FORMAT_PLAIN,
            segments: vec![Segment {
                recipe_hash: recipe.hash(),
                recipe,
                base,
                from_step: 0,
                from_window: 0,
                from_documents: 0,
                global_batch: u64::from(world_size) * u64::from(micro_batch),
                world_size,
                micro_batch,
                decisions: Vec::new(),
            }],
            abandoned: Vec::new(),
        }
    }

    /// The format this lineage is written in: [`LINEAGE_FORMAT_PLAIN`] unless it holds decisions.
    pub fn needed_format(&self) -> u32 {
        let decided =
            (self.segments.iter().chain(&self.abandoned)).any(|s| !s.decisions.is_empty());
        if decided {
            LINEAGE_FORMAT
        } else {
            LINEAGE_FORMAT_PLAIN
        }
    }

    /// Every decision of `[mix.adaptive]` in stream order, with its segment.
    pub fn decisions(&self) -> impl Iterator<Item = (usize, &Decision)> {
        (self.segments.iter().enumerate())
            .flat_map(|(k, s)| s.decisions.iter().map(move |d| (k, d)))
    }

    /// The segment in force at `step`.
    pub fn segment_at_step(&self, step: u64) -> usize {
        self.segments
            .iter()
            .rposition(|s| s.from_step <= step)
            .unwrap_or(0)
    }

    /// The first window of `step`.
    pub fn window_of_step(&self, step: u64) -> u64 {
        let s = &self.segments[self.segment_at_step(step)];
        // Saturating: a step asked for far past any stream's end has no window either.
        (step - s.from_step)
            .saturating_mul(s.global_batch)
            .saturating_add(s.from_window)
    }

    /// The first step served entirely from window `windows` on (a checkpoint after `windows`
    /// windows serves it and every later one).
    pub fn step_at_window(&self, windows: u64) -> u64 {
        let s = self
            .segments
            .iter()
            .rfind(|s| s.from_window <= windows)
            .unwrap_or(&self.segments[0]);
        s.from_step + (windows - s.from_window).div_ceil(s.global_batch)
    }

    /// The lowest step that a daemon of `global_batch` windows per step serving `step` can
    /// hold: where the run of segments with that global batch around `step` begins (steps below
    /// it were cut otherwise).
    pub fn first_step_of_batch(&self, step: u64, global_batch: u64) -> u64 {
        let at = self.segment_at_step(step);
        let mut first = self.segments[at].from_step;
        for s in self.segments[..=at].iter().rev() {
            if s.global_batch != global_batch {
                break;
            }
            first = s.from_step;
        }
        first
    }

    /// Every source's name over the whole lineage, in index order (see the module's doc).
    pub fn source_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for s in &self.segments {
            for spec in &s.recipe.sources {
                if !names.contains(&spec.name) {
                    names.push(spec.name.clone());
                }
            }
        }
        names
    }

    /// The recipe segment `k`'s stream is built from: its own, with the sources in lineage
    /// order and every source of an earlier segment that it lacks at weight 0.
    pub fn effective_recipe(&self, k: usize) -> Recipe {
        let mut recipe = self.segments[k].recipe.clone();
        let own = std::mem::take(&mut recipe.sources);
        recipe.sources = self.segments[..=k]
            .iter()
            .flat_map(|s| &s.recipe.sources)
            .fold(Vec::<SourceSpec>::new(), |mut all, spec| {
                if !all.iter().any(|s| s.name == spec.name) {
                    all.push(spec.clone());
                }
                all
            })
            .into_iter()
            .map(|spec| match own.iter().find(|s| s.name == spec.name) {
                Some(mine) => mine.clone(),
                None => SourceSpec {
                    weight: 0.0,
                    ..spec
                },
            })
            .collect();
        // `[mix.adaptive]`'s decisions are the mix's phases (the recipe has none of its own).
        (recipe.mix.phases).extend(self.segments[k].decisions.iter().map(Decision::phase));
        recipe
    }

    /// The lineage with a change to `recipe` at `step` (window `from_window`, document
    /// `from_documents`): segments from `step` on are replaced (kept in `abandoned`).
    #[allow(clippy::too_many_arguments)] // the change's place, each a number of its own
    pub fn changed(
        &self,
        recipe: Recipe,
        base: String,
        step: u64,
        from_window: u64,
        from_documents: u64,
        world_size: u32,
        micro_batch: u32,
    ) -> Lineage {
        let mut next = self.clone();
        let keep = next
            .segments
            .iter()
            .take_while(|s| s.from_step < step)
            .count();
        let replaced = next.segments.split_off(keep.max(1));
        next.abandoned.extend(replaced);
        // Decisions for the change's step and later were the replaced course's.
        if let Some(last) = next.segments.last_mut() {
            let later = last.decisions.iter().position(|d| d.step >= step);
            if let Some(at) = later {
                last.decisions.truncate(at);
            }
        }
        next.segments.push(Segment {
            recipe_hash: recipe.hash(),
            recipe,
            base,
            from_step: step,
            from_window,
            from_documents,
            global_batch: u64::from(world_size) * u64::from(micro_batch),
            world_size,
            micro_batch,
            decisions: Vec::new(),
        });
        next
    }
}

/// Why `new` cannot take over a stream made so far by `old` (every reason, each with its field).
/// Allowed: weights, phases, `[mix] unit` (documents ↔ tokens), sources added or removed,
/// filters and document limits, the shuffle buffer's size, the stopping strategy, the packing
/// strategy, the `best_fit` pool and pad, and the global batch (not a recipe field), in either
/// unit: [`transplant()`] moves the state over, and the packer's state is made the next
/// packing's ([`crate::packer::transplant_packer`]; with `[lanes]` in each lane, at the lane's own
/// take-over point: [`LanePoint`]). Refused: whatever changes what an id means or how the input
/// is dealt (the tokenizer, `seq_len`, the seed, `shuffle_shards`, `[lanes]`, a source's files,
/// format, text field or content).
pub fn check_edit(old: &Recipe, new: &Recipe) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    let mut refuse = |field: &str, why: String| {
        refusals.push(Refusal {
            field: field.to_string(),
            why,
        })
    };
    if old.tokenizer != new.tokenizer {
        refuse(
            "tokenizer",
            "a change of tokenizer changes what every id means: start a new stream (an empty \
             --state-dir) for another tokenizer"
                .into(),
        );
    }
    if old.packing.seq_len != new.packing.seq_len {
        refuse(
            "packing.seq_len",
            format!(
                "{} → {}: a window's size is fixed for the stream (checkpoints, steps and the \
                 trainers' batches are counted in windows)",
                old.packing.seq_len, new.packing.seq_len
            ),
        );
    }
    if old.shuffle.seed != new.shuffle.seed {
        refuse(
            "shuffle.seed",
            format!(
                "{} → {}: the seed decides every draw of the stream so far; keep {}",
                old.shuffle.seed, new.shuffle.seed, old.shuffle.seed
            ),
        );
    }
    if old.shuffle.shuffle_shards != new.shuffle.shuffle_shards {
        refuse(
            "shuffle.shuffle_shards",
            "the shard order of every source is fixed for the stream (the cursors count in it)"
                .into(),
        );
    }
    if old.lanes != new.lanes {
        let name = |l: Option<crate::LanesSpec>| match l {
            Some(l) => format!("count {} × block_windows {}", l.count, l.block_windows),
            None => "none".into(),
        };
        refuse(
            "lanes",
            format!(
                "{} → {}: the lanes deal the input and interleave the stream, so they are fixed \
                 for the stream; keep [lanes] as it was",
                name(old.lanes),
                name(new.lanes)
            ),
        );
    }
    for spec in &new.sources {
        let Some(was) = old.sources.iter().find(|s| s.name == spec.name) else {
            continue;
        };
        let dealt_alike = was.files == spec.files
            && was.format == spec.format
            && was.text == spec.text
            && was.content == spec.content;
        if !dealt_alike {
            refuse(
                &format!("source {:?}", spec.name),
                "its files, format, text field or content are how its cursor counts: a source \
                 whose input changes is a new source (give it a new name)"
                    .into(),
            );
        }
    }
    refusals
}

mod lanes;
mod transplant;
pub use lanes::{LanePoint, lane_window};
pub use transplant::{Transplant, transplant};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tokens_tests;
