//! The single daemon's course: the stream's lineage, kept in the state directory from the first
//! start (`lineage.json`, before any checkpoint), continued as it is at a plain resume, or
//! changed (`--change-course`) at the step the trainers resume from. Every edit that cannot be
//! honoured is refused when the daemon starts, before anything is served or written; the change
//! itself is made at the first request, written to the lineage before any window of its step is
//! made.

use super::ServeOptions;
use crate::checkpoint::lineage as lineage_file;
use crate::checkpoint::{CheckpointDir, CheckpointMeta, Loaded, RunIdentity};
use crate::driver::LoadedRecipe;
use crate::driver::lineage::Segments;
use crate::driver::pipeline::PipelineConfig;
use crate::driver::pretokenize::Pretokenized;
use crate::driver::run::StreamStart;
use anyhow::{Context, bail};
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::lineage::{Lineage, check_edit};
use dsprep_mixers::{DocStream, Recipe};
use std::path::{Path, PathBuf};

/// The stream a single daemon serves, and where its lineage and checkpoints are kept.
pub struct Course {
    pub segments: Segments,
    /// Per segment, per source, its shards (what a checkpoint of the segment must match).
    pub shards: Vec<Vec<Vec<String>>>,
    pub world_size: u32,
    pub micro_batch: u32,
    /// A change of course to make at the first request.
    pub change: Option<Change>,
    /// The state directory's lineage file and checkpoints (none without `--state-dir`).
    pub kept: Option<(PathBuf, CheckpointDir)>,
    /// The stream of one segment, built to list its sources: the first run takes it when it
    /// starts in that segment.
    listed: Option<(usize, Box<DocStream<Pretokenized>>)>,
}

/// `--change-course`: the recipe to take over at the step the trainers resume from.
pub struct Change {
    pub recipe: Recipe,
    pub base: String,
}

/// Where production starts: the step asked for first, and the checkpoint (of which segment) to
/// get there from.
pub struct Placed {
    pub step: u64,
    pub segment: usize,
    pub resume: Option<Loaded<CheckpointMeta>>,
    /// A change of course to make on the way, from `resume` (below the step).
    pub change: Option<PreparedChange>,
    /// The segment's stream, built already (its sources listed when the daemon opened).
    pub built: Option<Box<DocStream<Pretokenized>>>,
}

/// The folder a recipe's relative paths resolve from, as the lineage records it (absolute, so
/// that a replay from another folder reads the same files).
pub fn base_of(loaded: &LoadedRecipe) -> String {
    std::fs::canonicalize(&loaded.base)
        .unwrap_or_else(|_| loaded.base.clone())
        .display()
        .to_string()
}

impl Course {
    /// The run's identity for checkpoints.
    pub fn identity(&self) -> RunIdentity {
        RunIdentity {
            lineage: self.segments.lineage.clone(),
            shards: self.shards.clone(),
            world_size: self.world_size,
            micro_batch: self.micro_batch,
        }
    }

    /// The recipe whose sources the daemon counts: the lineage's last effective recipe, with
    /// the change of course to be made (sources in lineage order, see
    /// [`Lineage::effective_recipe`]).
    pub fn served_recipe(&self) -> Recipe {
        let lineage = &self.segments.lineage;
        match &self.change {
            None => lineage.effective_recipe(lineage.segments.len() - 1),
            Some(change) => {
                let next = lineage.changed(
                    change.recipe.clone(),
                    change.base.clone(),
                    u64::MAX,
                    0,
                    0,
                    self.world_size,
                    self.micro_batch,
                );
                next.effective_recipe(next.segments.len() - 1)
            }
        }
    }

    /// Open the course of a daemon serving `loaded` (its `--recipe`): a fresh stream (its
    /// lineage written now), or the state directory's lineage continued or, with
    /// `--change-course`, checked for a change. Refuses what cannot be honoured, changing
    /// nothing in the state directory.
    pub fn open(options: &ServeOptions, loaded: &LoadedRecipe) -> anyhow::Result<Course> {
        let (world_size, micro_batch) = (options.world_size, options.micro_batch);
        let global_batch = u64::from(world_size) * u64::from(micro_batch);
        let now = Lineage::start(
            loaded.recipe.clone(),
            base_of(loaded),
            world_size,
            micro_batch,
        );
        let segments = Segments::load(now.clone(), loaded)?;
        // The new recipe's own listing: the stream of a fresh start, or what a change checks.
        let (own_shards, own_stream) = segments.list(0, options.threads)?;
        let fresh = |kept| Course {
            segments,
            shards: vec![own_shards.clone()],
            world_size,
            micro_batch,
            change: None,
            kept,
            listed: Some((0, Box::new(own_stream))),
        };
        let Some(dir) = &options.state_dir else {
            if options.resume {
                bail!("--resume needs --state-dir (where the checkpoints are)");
            }
            if options.change_course {
                bail!("--change-course needs --resume latest and --state-dir");
            }
            return Ok(fresh(None));
        };
        let checkpoints = CheckpointDir::open(dir, options.keep_checkpoints)?;
        let existing = checkpoints.list()?;
        let path = lineage_file::path_in(dir);
        let stored = lineage_file::read(&path)?;
        if !options.resume {
            if options.change_course {
                bail!("--change-course changes the course of a stream: it needs --resume latest");
            }
            if let Some((step, _)) = existing.last() {
                bail!(
                    "{} holds checkpoints of an earlier run (newest: step {step}); pass --resume \
                     latest to continue it, or give an empty --state-dir",
                    dir.display()
                );
            }
            if stored.is_some() {
                bail!(
                    "{} holds the lineage of an earlier stream ({}); pass --resume latest to \
                     continue it, or give an empty --state-dir",
                    dir.display(),
                    path.display()
                );
            }
            lineage_file::write(&path, &now)?;
            return Ok(fresh(Some((path, checkpoints))));
        }
        match existing.last() {
            Some((step, newest)) => tracing::info!(
                "{} checkpoints in {} (newest: step {step}, {})",
                existing.len(),
                dir.display(),
                newest.display()
            ),
            None => tracing::info!(
                "--resume: {} holds no checkpoint yet; the stream is recomputed from its start",
                dir.display()
            ),
        }
        let Some(stored) = stored else {
            // A state directory from before lineages (or of a daemon killed before it wrote
            // one): its checkpoints say which recipe made them.
            if options.change_course {
                bail!(
                    "{} has no lineage (it predates them): its recipe is known only by its hash. \
                     Resume once with the recipe it was made with (that writes the lineage), \
                     then change course",
                    dir.display()
                );
            }
            let course = fresh(Some((path.clone(), checkpoints)));
            if let Some((_, dir)) = &course.kept {
                dir.check_newest(&course.identity())?;
            }
            lineage_file::write(&path, &now)?;
            return Ok(course);
        };
        let last = stored
            .segments
            .last()
            .expect("a read lineage has a segment");
        // The trainers may resume below a change of the global batch (they rolled back): the
        // layout is checked against the step they ask for first (`place`).
        let same = last.recipe_hash == loaded.recipe.hash()
            && (stored.segments.iter()).any(|s| s.global_batch == global_batch);
        let segments = Segments::load(stored.clone(), loaded)?;
        // Every segment's listing (a checkpoint of any may be resumed from); the last one's
        // stream kept, where a resume usually starts.
        let last_k = segments.loaded.len() - 1;
        let mut shards = Vec::with_capacity(segments.loaded.len());
        let mut listed = None;
        for k in 0..=last_k {
            let (names, stream) =
                segments.list(k, if k == last_k { options.threads } else { 1 })?;
            shards.push(names);
            listed = (k == last_k && same).then(|| (k, Box::new(stream)));
        }
        let mut course = Course {
            segments,
            shards,
            world_size,
            micro_batch,
            change: None,
            kept: None,
            listed,
        };
        if same {
            checkpoints.check_newest(&course.identity())?;
            course.kept = Some((path, checkpoints));
            return Ok(course);
        }
        if !options.change_course {
            // The newest checkpoint's layout, where there is one (the segment may have been
            // served since at another world size with the same global batch).
            let (world, micro) = (existing.last())
                .and_then(|(_, newest)| CheckpointDir::read(newest).ok())
                .map_or((last.world_size, last.micro_batch), |(meta, _)| {
                    (meta.world_size, meta.micro_batch)
                });
            let why = match last.recipe_hash == loaded.recipe.hash() {
                false => format!(
                    "the stream's recipe (from step {}) is {}, --recipe {} is {}: the recipe (or \
                     a default it fills in) has changed",
                    last.from_step,
                    last.recipe_hash,
                    options.recipe.display(),
                    loaded.recipe.hash()
                ),
                true => format!(
                    "its global batch is {} windows (world size {world} × micro batch {micro}), \
                     this run's is {global_batch} ({world_size} × {micro_batch}): steps would \
                     cover other windows; keep world size × micro batch = {}",
                    last.global_batch, last.global_batch
                ),
            };
            let at = match existing.last() {
                Some((_, newest)) => format!("checkpoint {}", newest.display()),
                None => format!("the stream in {}", dir.display()),
            };
            bail!(
                "cannot resume from {at}: {why}. To continue the stream under the new recipe or \
                 batch from the step the trainers resume at, add --change-course \
                 (docs/serving.md#changing-course)"
            );
        }
        let k = course.segments.loaded.len() - 1;
        let old = &course.segments.loaded[k].recipe;
        let mut refusals = check_edit(old, &loaded.recipe);
        if options.plan.is_some() {
            refusals.push(dsprep_mixers::lineage::Refusal {
                field: "--plan".into(),
                why: "a frozen plan holds one recipe's listing: change course without --plan"
                    .into(),
            });
        }
        // A source that goes on must read the very files it read (a relative path in a recipe
        // moved to another folder names other files).
        for (name, files) in (loaded.recipe.sources.iter().map(|s| &s.name)).zip(&own_shards) {
            let field = format!("source {name:?}");
            let Some(i) = old.sources.iter().position(|s| &s.name == name) else {
                continue;
            };
            if refusals.iter().any(|r| r.field == field) {
                continue; // its spec changed: said once
            }
            let had = &course.shards[k][i];
            // As sets: their order is the seed's (refused above when it changes).
            let sorted = |list: &[String]| {
                let mut list = list.to_vec();
                list.sort();
                list
            };
            if !had.is_empty() && !files.is_empty() && sorted(had) != sorted(files) {
                refusals.push(dsprep_mixers::lineage::Refusal {
                    field,
                    why: format!(
                        "its files are not the ones it read ({} shards listed now, {} before; \
                         first now {:?}, before {:?}): a source whose input changes is a new \
                         source (give it a new name)",
                        files.len(),
                        had.len(),
                        files.first(),
                        had.first()
                    ),
                });
            }
        }
        if !refusals.is_empty() {
            bail!(
                "cannot change course to recipe {} ({}): {} edit(s) cannot be honoured:\n{}\n\
                 nothing was served and the state directory is unchanged",
                options.recipe.display(),
                loaded.recipe.hash(),
                refusals.len(),
                (refusals.iter())
                    .map(|r| format!("  {r}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        checkpoints.check_newest(&course.identity())?;
        course.change = Some(Change {
            recipe: loaded.recipe.clone(),
            base: base_of(loaded),
        });
        course.kept = Some((path, checkpoints));
        tracing::info!(
            "changing course: recipe {} takes over from the step the trainers resume at",
            loaded.recipe.hash()
        );
        Ok(course)
    }

    /// Where to start for the first request, at `step`. A change of course is made there: on
    /// the producer's thread up to the step when a checkpoint is near below it
    /// ([`Placed::change`], then [`Course::commit_change`]), else found by a run of its own
    /// first and written here. Then the newest checkpoint that serves `step`.
    pub fn place(
        &mut self,
        step: u64,
        loaded: &LoadedRecipe,
        config: &PipelineConfig,
    ) -> anyhow::Result<Placed> {
        let mut inline = None;
        if let Some(change) = self.change.take() {
            let prepared = self.prepare_change(change, step, loaded)?;
            if prepared.near {
                inline = Some(prepared);
            } else {
                let PreparedChange {
                    from, window, base, ..
                } = &prepared;
                tracing::info!(
                    "no checkpoint near below step {step} in the recipe that makes it: a run of \
                     its own finds where the change of course takes over first"
                );
                let (k, start) = start_of(from.as_ref());
                let began = std::time::Instant::now();
                let documents = base.documents_at_window(k, start, *window, config)?;
                let (segments, shards) = self.commit_change(&prepared, documents, began)?;
                self.segments = segments;
                self.shards = shards;
                self.listed = None;
            }
        }
        let lineage = match &inline {
            Some(change) => &change.prospective,
            None => &self.segments.lineage,
        };
        let at = lineage.segment_at_step(step);
        let global_batch = u64::from(self.world_size) * u64::from(self.micro_batch);
        if lineage.segments[at].global_batch != global_batch {
            let s = &lineage.segments[at];
            bail!(
                "step {step} is in the stretch of the stream from step {} with a global batch of \
                 {} windows (world size {} × micro batch {}); this daemon serves {global_batch}: \
                 start it with world size × micro batch = {}",
                s.from_step,
                s.global_batch,
                s.world_size,
                s.micro_batch,
                s.global_batch
            );
        }
        let resume = match (&mut inline, &self.kept) {
            (Some(change), _) => change.from.take(),
            (None, Some((_, dir))) => dir.newest_for(step, &self.identity())?,
            (None, None) => None,
        };
        let segment = resume.as_ref().map_or(0, |r| r.meta.segment);
        let built = match (self.listed.take(), &inline) {
            (Some((k, stream)), None) if k == segment => Some(stream),
            _ => None,
        };
        Ok(Placed {
            step,
            segment,
            resume,
            change: inline,
            built,
        })
    }

    /// What a change to `change` at `step` starts from: the lineage below the step, the window
    /// the change takes over at, and the newest checkpoint below the step.
    fn prepare_change(
        &self,
        change: Change,
        step: u64,
        loaded: &LoadedRecipe,
    ) -> anyhow::Result<PreparedChange> {
        if step == 0 {
            bail!(
                "the trainers ask for step 0: a change of course at the stream's start is a new \
                 stream; give an empty --state-dir"
            );
        }
        let stored = self.segments.lineage.clone();
        let kept = (stored.segments.iter())
            .take_while(|s| s.from_step < step)
            .count();
        let mut below = stored.clone();
        below.segments.truncate(kept);
        let window = below.window_of_step(step);
        let identity = RunIdentity {
            lineage: below.clone(),
            shards: self.shards[..kept].to_vec(),
            world_size: self.world_size,
            micro_batch: self.micro_batch,
        };
        let from = match &self.kept {
            Some((_, dir)) => match dir.newest_for(step, &identity)? {
                Some(c) if at_or_before_change(&c.state, window) => Some(c),
                _ => dir.newest_for(step - 1, &identity)?,
            },
            None => None,
        };
        // Near: in the last segment below the step, few tokens before it (one thread packs
        // them without the pipeline's threads, and nothing is read twice).
        let (at, windows) = from
            .as_ref()
            .map_or((0, 0), |c| (c.meta.segment, c.state.packer.windows_emitted));
        let window_tokens = loaded.recipe.packing.window_tokens() as u64;
        let near = at + 1 == kept
            && window.saturating_sub(windows).saturating_mul(window_tokens) <= NEAR_TOKENS;
        let prospective = stored.changed(
            change.recipe.clone(),
            change.base.clone(),
            step,
            window,
            0,
            self.world_size,
            self.micro_batch,
        );
        Ok(PreparedChange {
            step,
            window,
            kept,
            near,
            base: Segments::load(below, loaded)?,
            prospective,
            stored,
            change,
            from,
        })
    }

    /// Write the change `prepared` now that it takes over at document `documents`: the branch
    /// at and past its step replaced (its checkpoints removed), the lineage written. Returns the
    /// new lineage loaded and its segments' shards.
    pub fn commit_change(
        &self,
        prepared: &PreparedChange,
        documents: u64,
        began: std::time::Instant,
    ) -> anyhow::Result<(Segments, Vec<Vec<Vec<String>>>)> {
        let PreparedChange {
            step,
            window,
            kept,
            change,
            stored,
            base,
            ..
        } = prepared;
        let next = stored.changed(
            change.recipe.clone(),
            change.base.clone(),
            *step,
            *window,
            documents,
            self.world_size,
            self.micro_batch,
        );
        let segments = Segments::load(next.clone(), &base.loaded[0])?;
        let mut shards = self.shards[..*kept].to_vec();
        shards.push(segments.list(*kept, 1)?.0);
        if let Some((path, dir)) = &self.kept {
            // The checkpoints at and past the step that the new lineage cannot use: the
            // replaced branch's (one at the change itself, before it, stays).
            let identity = RunIdentity {
                lineage: next.clone(),
                shards: shards.clone(),
                world_size: self.world_size,
                micro_batch: self.micro_batch,
            };
            let removed = dir.remove_from(*step, |meta| identity.mismatch(meta).is_none())?;
            lineage_file::write(path, &next)
                .with_context(|| "the change of course is not made".to_string())?;
            tracing::info!(
                "changed course at step {step} (window {window}, document {documents}; found in \
                 {:.2} s): lineage {} now has {} segments{}",
                began.elapsed().as_secs_f64(),
                path.display(),
                next.segments.len(),
                match removed {
                    0 => String::new(),
                    n => format!(", {n} checkpoints of the replaced branch removed"),
                }
            );
        }
        Ok((segments, shards))
    }
}

/// Below this many tokens between the newest checkpoint and a change of course, the change is
/// made on the producer's thread as it runs (one pass, nothing read twice); beyond, a run of
/// its own finds where it takes over first.
const NEAR_TOKENS: u64 = 64 << 20;

/// A change of course ready to be made at its step.
pub struct PreparedChange {
    pub step: u64,
    /// The window the change takes over at, and the segments below its step.
    pub window: u64,
    pub kept: usize,
    /// Whether the newest checkpoint is near below the step (see [`NEAR_TOKENS`]).
    near: bool,
    /// The lineage below the step, loaded: what runs up to the change.
    pub base: Segments,
    /// The lineage as it will be (where the change takes over not known yet): steps and windows.
    pub prospective: Lineage,
    stored: Lineage,
    change: Change,
    from: Option<Loaded<CheckpointMeta>>,
}

/// Whether a change at `window` can start from `state`: it lies before the document where the
/// change takes over (fewer windows), or exactly there (`concat`, the windows all emitted and no
/// document begun since the one that completed the last: what it holds is that document's end).
fn at_or_before_change(state: &PipelineState, window: u64) -> bool {
    let packer = &state.packer;
    packer.windows_emitted < window
        || (packer.windows_emitted == window
            && packer.pool.is_none()
            && packer.pending_starts.is_empty())
}

/// The segment and start of a run from checkpoint `from` (or the stream's start).
fn start_of(from: Option<&Loaded<CheckpointMeta>>) -> (usize, StreamStart) {
    match from {
        Some(c) => (
            c.meta.segment,
            StreamStart::Restore {
                what: format!("change of course from {}", c.path.display()),
                state: Box::new(c.state.clone()),
            },
        ),
        None => (0, StreamStart::Fresh),
    }
}

/// The lineage a pack replays: a lineage file, or a state directory's.
pub fn read_lineage(path: &Path) -> anyhow::Result<Lineage> {
    if !path.exists() {
        bail!(
            "{} does not exist: give a daemon's --state-dir, or the {} in it",
            path.display(),
            lineage_file::LINEAGE_FILE
        );
    }
    lineage_file::read(path)?.ok_or_else(|| {
        anyhow::anyhow!(
            "{} holds no lineage ({} is written by `dsprep serve --state-dir`)",
            path.display(),
            lineage_file::LINEAGE_FILE
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsprep_mixers::packer::{PackerState, PoolState};

    fn at(windows: u64, pending_starts: Vec<u32>, pool: bool) -> PipelineState {
        let mixer = serde_json::json!({"rng_word_pos": 0, "peeked": [], "exhausted": [],
            "emitted": [], "started": true, "done": false});
        PipelineState {
            stream: dsprep_mixers::StreamState {
                sources: Vec::new(),
                mixer: serde_json::from_value(mixer).expect("a mixer state"),
                shuffle_rng_word_pos: 0,
                buffered: Vec::new(),
                draining: false,
                emitted: 9,
            },
            packer: PackerState {
                windows_emitted: windows,
                pending: vec![1; pending_starts.len() + 3],
                pending_sources: vec![0; pending_starts.len()],
                pending_starts,
                pool: pool.then(|| PoolState {
                    docs: Vec::new(),
                    next_seq: 0,
                    pushed_tokens: 0,
                    counters: Default::default(),
                }),
                ..PackerState::default()
            },
        }
    }

    #[test]
    fn a_change_starts_from_a_state_before_it_or_exactly_where_it_takes_over() {
        assert!(at_or_before_change(&at(7, vec![0], false), 8), "before it");
        assert!(
            at_or_before_change(&at(8, vec![], false), 8),
            "the document that completed window 8 is the last packed"
        );
        assert!(
            !at_or_before_change(&at(8, vec![2], false), 8),
            "a document begun after it"
        );
        assert!(!at_or_before_change(&at(8, vec![], true), 8), "a pool");
        assert!(!at_or_before_change(&at(9, vec![], false), 8), "past it");
    }
}
