//! The node daemons' course: a laned stream's lineage, shared by every node daemon, and each
//! lane's own lineage under it.
//!
//! - **One lineage, one writer.** The stream's lineage is the state directory's `lineage.json`
//!   (as a single daemon's), written by node 0 only: at its first start, and at a change of
//!   course, at the step node 0's ranks ask for first. Another node given `--change-course`
//!   waits (at its start, never per step) until `lineage.json` holds that change, and takes its
//!   step: every node serves the same lineage.
//! - **Per lane.** A change at stream window `W` takes over in lane `l` after the lane's own
//!   windows before `W` (`lineage::lane_window`), at the first document boundary there, which the
//!   lane's node finds by running the lane and keeps in `lineage.lanes/lane-NNNNN.json`
//!   (`checkpoint::lane_lineage`). The lane then runs its own lineage through the one lineage
//!   path ([`Segments::for_lane`]).
//! - **Branches.** Each change opens a branch of the stream: its window digests, chain and lane
//!   progress are kept in `lanes-<stream id>/branch-<changes>/` (seeded with what the stream
//!   holds below the change), so no fact of a replaced branch is read as this one's. Lane
//!   checkpoints stay in `lanes-<stream id>/`, each naming its segment and branch.
//!
//! A lane's own lineage and where it starts are `lanes.rs`'s.

mod lanes;

pub use lanes::{LaneStart, lane_start, tag};

use super::lane_chain::seed_branch;
use crate::checkpoint::lineage as lineage_file;
use crate::driver::LoadedRecipe;
use crate::driver::lanes::{LaneInputs, deal_segments};
use crate::driver::lineage::Segments;
use crate::files::patiently;
use crate::serve::ServeOptions;
use crate::serve::store::StepStore;
use anyhow::{Context, anyhow, bail};
use dsprep_mixers::lanes::NodeSlice;
use dsprep_mixers::lineage::{Lineage, Refusal, check_edit};
use dsprep_mixers::{LanesSpec, Recipe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The course of one node daemon's lanes.
pub struct NodeCourse {
    /// The stream's lineage as known now (a change to come is in `change`).
    pub lineage: Lineage,
    /// Per segment (the change's last), its effective recipe loaded and its input dealt.
    pub segments: Segments,
    pub inputs: Vec<Arc<LaneInputs>>,
    /// `--change-course`: made (node 0) or taken from node 0 at the first request.
    change: Option<Change>,
    /// Node 0's lineage, to write at the first request.
    unwritten: bool,
    state_dir: Option<PathBuf>,
    /// The longest wait for node 0's change (another node with `--change-course`).
    wait_limit: Duration,
    node: u32,
    nodes: u32,
    world_size: u32,
    micro_batch: u32,
}

struct Change {
    recipe: Recipe,
    base: String,
}

impl NodeCourse {
    /// Open the course of node daemon `options.node` serving `loaded`: a fresh stream, the
    /// state directory's lineage continued, or (`--change-course`) checked for a change. What
    /// cannot be honoured is refused here, before anything is served or written.
    pub fn open(options: &ServeOptions, loaded: &LoadedRecipe) -> anyhow::Result<NodeCourse> {
        let (world_size, micro_batch) = (options.world_size, options.micro_batch);
        let global_batch = u64::from(world_size) * u64::from(micro_batch);
        let node = options.node.rank;
        let base = super::super::course::base_of(loaded);
        let fresh = Lineage::start(loaded.recipe.clone(), base.clone(), world_size, micro_batch);
        let hash = loaded.recipe.hash();
        let stored = match &options.state_dir {
            Some(dir) => lineage_file::read(&lineage_file::path_in(dir))?,
            None => None,
        };
        let path = (options.state_dir.as_deref()).map(lineage_file::path_in);
        if options.change_course && !(options.resume && options.state_dir.is_some()) {
            bail!("--change-course needs --resume latest and --state-dir");
        }
        // Node 0 writes the lineage at the first request (on the producer's thread, as it
        // writes every other file of the shared state directory: a full one is waited on).
        let writer = path.is_some() && node == 0;
        let mut unwritten = false;
        let (lineage, change) = match stored {
            None if options.change_course => bail!(
                "{} has no lineage (it predates them, or no daemon of the stream ever started): \
                 resume once with the recipe it was made with (node 0 writes the lineage), then \
                 change course",
                (options.state_dir.as_deref()).map_or(String::new(), |d| d.display().to_string())
            ),
            None => {
                unwritten = writer;
                (fresh, None)
            }
            Some(stored) if !options.resume => {
                if stored.segments.len() > 1 || stored.segments[0].recipe_hash != hash {
                    bail!(
                        "{} holds the lineage of an earlier stream (last recipe {}); pass \
                         --resume latest to continue it, or give an empty --state-dir",
                        path.as_deref()
                            .map_or(String::new(), |p| p.display().to_string()),
                        stored
                            .segments
                            .last()
                            .map_or("", |s| s.recipe_hash.as_str())
                    );
                }
                unwritten = writer;
                (fresh, None)
            }
            Some(mut stored) => {
                let last = stored
                    .segments
                    .last()
                    .expect("a read lineage has a segment");
                if last.recipe_hash == hash {
                    if stored.segments.len() == 1 && last.global_batch != global_batch {
                        // One recipe: steps of any global batch cover the same stream.
                        stored = fresh.clone();
                        unwritten = writer;
                    }
                    (stored, None)
                } else if !options.change_course {
                    bail!(
                        "cannot resume the stream in {}: its recipe (from step {}) is {}, \
                         --recipe {} is {}. To continue it under the new recipe from the step \
                         the trainers resume at, add --change-course \
                         (docs/serving.md#changing-course)",
                        path.as_deref()
                            .map_or(String::new(), |p| p.display().to_string()),
                        last.from_step,
                        last.recipe_hash,
                        options.recipe.display(),
                        hash
                    );
                } else {
                    let change = Change {
                        recipe: loaded.recipe.clone(),
                        base: base.clone(),
                    };
                    (stored, Some(change))
                }
            }
        };
        if change.is_none() && !(lineage.segments.iter()).any(|s| s.global_batch == global_batch) {
            let last = lineage.segments.last().expect("a lineage has a segment");
            bail!(
                "global batch: the stream serves {} windows a step from step {} (world size {} × \
                 micro batch {}), this run {global_batch} ({world_size} × {micro_batch}): steps \
                 would cover other windows; keep world size × micro batch = {}, or change the \
                 global batch with --change-course (docs/serving.md#changing-course)",
                last.global_batch,
                last.from_step,
                last.world_size,
                last.micro_batch,
                last.global_batch
            );
        }
        let prospective = match &change {
            None => lineage.clone(),
            Some(c) => lineage.changed(
                c.recipe.clone(),
                c.base.clone(),
                u64::MAX,
                0,
                0,
                world_size,
                micro_batch,
            ),
        };
        let mut segments = Segments::load(prospective, loaded)?;
        if let [only] = &mut segments.loaded[..] {
            // One recipe: `--plan`'s (a change of course refuses a plan).
            only.plan = loaded.plan.clone();
        }
        let inputs = deal_segments(&segments)?;
        let course = NodeCourse {
            segments,
            inputs,
            lineage,
            change,
            unwritten,
            state_dir: options.state_dir.clone(),
            wait_limit: options.change_course_timeout,
            node,
            nodes: options.node.count,
            world_size,
            micro_batch,
        };
        if course.change.is_some() {
            course.check_change(options)?;
            tracing::info!(
                "changing course: recipe {hash} takes over from the step the trainers resume at{}",
                match node {
                    0 => String::new(),
                    _ => " (node 0 makes the change; this node takes it from lineage.json)".into(),
                }
            );
        }
        Ok(course)
    }

    /// Every edit of the change that cannot be honoured, refused at once (nothing written).
    fn check_change(&self, options: &ServeOptions) -> anyhow::Result<()> {
        let k = self.segments.loaded.len() - 1;
        let (old, new) = (&self.segments.loaded[k - 1], &self.segments.loaded[k]);
        let own = &self.segments.lineage.segments[k].recipe;
        let mut refusals = check_edit(&old.recipe, own);
        if options.plan.is_some() {
            refusals.push(Refusal {
                field: "--plan".into(),
                why: "a frozen plan holds one recipe's listing: change course without --plan"
                    .into(),
            });
        }
        if own.lanes.is_some() && !own.mix.unit.is_documents() && !own.mix.phases.is_empty() {
            refusals.push(Refusal {
                field: "mix.phase".into(),
                why: "node daemons cannot take phases of a mix in tokens at a change yet (each \
                      lane enters a phase at its own share of it): change weights, or mix in \
                      documents"
                    .into(),
            });
        }
        // A source that goes on must read the very files it read (as sets: their order is the
        // seed's).
        let (was, now) = (&self.inputs[k - 1], &self.inputs[k]);
        for (i, spec) in new
            .recipe
            .sources
            .iter()
            .enumerate()
            .take(was.sources.len())
        {
            let field = format!("source {:?}", spec.name);
            if refusals.iter().any(|r| r.field == field) {
                continue;
            }
            let names = |shards: &[crate::sources::Shard]| {
                let mut names: Vec<PathBuf> = shards.iter().map(|s| s.display_path()).collect();
                names.sort();
                names
            };
            let (had, has) = (names(&was.sources[i]), names(&now.sources[i]));
            if !had.is_empty() && !has.is_empty() && had != has {
                refusals.push(Refusal {
                    field,
                    why: format!(
                        "its files are not the ones it read ({} listed now, {} before): a \
                         source whose input changes is a new source (give it a new name)",
                        has.len(),
                        had.len()
                    ),
                });
            }
        }
        if refusals.is_empty() {
            return Ok(());
        }
        bail!(
            "cannot change course to recipe {} ({}): {} edit(s) cannot be honoured:\n{}\n\
             nothing was served and the state directory is unchanged",
            options.recipe.display(),
            own.hash(),
            refusals.len(),
            (refusals.iter())
                .map(|r| format!("  {r}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    }

    /// The recipe whose sources the daemon counts: the last effective one (change included).
    pub fn served_recipe(&self) -> &Recipe {
        &self.segments.loaded[self.segments.loaded.len() - 1].recipe
    }

    /// The branch this daemon serves (the changes made, the one to come included).
    pub fn branch(&self) -> usize {
        self.lineage.changes() + usize::from(self.change.is_some())
    }

    /// The lineage's recipes (a change to come included), for trainers that pinned one.
    pub fn recipe_hashes(&self) -> Vec<String> {
        let lineage = &self.segments.lineage;
        (lineage.segments.iter())
            .map(|s| s.recipe_hash.clone())
            .collect()
    }

    /// Where steps of `global_batch` windows begin around step `step` (the trainers' first):
    /// the step and its first window. Refused, naming the global batch to serve it with, when
    /// `step` is in a stretch of the stream with another global batch (the trainers rolled
    /// back below a change of it).
    pub fn origin(&self, step: u64, global_batch: u64) -> anyhow::Result<(u64, u64)> {
        let lineage = &self.lineage;
        let s = &lineage.segments[lineage.segment_at_step(step)];
        if s.global_batch != global_batch {
            bail!(
                "step {step} is in the stretch of the stream from step {} with a global batch of \
                 {} windows (world size {} × micro batch {}); these node daemons serve \
                 {global_batch}: start them with world size × micro batch = {}",
                s.from_step,
                s.global_batch,
                s.world_size,
                s.micro_batch,
                s.global_batch
            );
        }
        let first = lineage.first_step_of_batch(step, global_batch);
        Ok((first, lineage.window_of_step(first)))
    }

    /// Make the change of course (node 0: at step `asked`, written to `lineage.json`; another
    /// node: taken from it once node 0 has made it). `branch_dir(n)` is branch `n`'s folder,
    /// seeded here from the branch below with what the stream holds below the change. Returns
    /// false when the daemon stops while waiting.
    pub fn settle(
        &mut self,
        asked: u64,
        spec: &LanesSpec,
        branch_dir: impl Fn(usize) -> Option<PathBuf>,
        store: &StepStore,
    ) -> anyhow::Result<bool> {
        if std::mem::take(&mut self.unwritten)
            && let Some(dir) = &self.state_dir
        {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
            write_lineage(&lineage_file::path_in(dir), &self.lineage)?;
        }
        let Some(change) = self.change.take() else {
            return Ok(true);
        };
        let Some(dir) = self.state_dir.clone() else {
            bail!("internal error: a change of course without a state directory");
        };
        let path = lineage_file::path_in(&dir);
        let hash = change.recipe.hash();
        let next = if self.node == 0 {
            if asked == 0 {
                bail!(
                    "the trainers ask for step 0: a change of course at the stream's start is a \
                     new stream; give an empty --state-dir"
                );
            }
            let window = self.lineage.window_of_step(asked);
            let next = self.lineage.changed(
                change.recipe,
                change.base,
                asked,
                window,
                0,
                self.world_size,
                self.micro_batch,
            );
            let g = u64::from(self.world_size) * u64::from(self.micro_batch);
            let first = next.first_step_of_batch(asked, g);
            let slice = NodeSlice::new(spec, g, self.node, self.nodes).map_err(|e| anyhow!(e))?;
            (slice.with_origin(first, next.window_of_step(first)))
                .map_err(|e| anyhow!("cannot change course at step {asked}: {e}"))?;
            if let (Some(from), Some(to)) = (
                branch_dir(self.lineage.changes()),
                branch_dir(next.changes()),
            ) {
                seed_branch(&from, &to, window, u64::from(spec.block_windows))?;
            }
            lineage_file::write(&path, &next).context("the change of course is not made")?;
            tracing::info!(
                "changed course at step {asked} (window {window}): {} now has {} segments",
                path.display(),
                next.segments.len()
            );
            next
        } else {
            match self.wait_for_node0(&path, &hash, store)? {
                Some(next) => next,
                None => return Ok(false),
            }
        };
        let kept = next.segments.len() - 1;
        let mut inputs = self.inputs[..kept].to_vec();
        inputs.push(Arc::clone(&self.inputs[self.inputs.len() - 1]));
        self.segments = Segments::load(next.clone(), &self.segments.loaded[0])?;
        self.inputs = inputs;
        self.lineage = next;
        Ok(true)
    }

    /// `lineage.json` once node 0 has made the change to `hash` (waiting, re-reading it every
    /// 100 ms, at most `--change-course-timeout`); `None` when the daemon stops first.
    fn wait_for_node0(
        &self,
        path: &Path,
        hash: &str,
        store: &StepStore,
    ) -> anyhow::Result<Option<Lineage>> {
        let began = Instant::now();
        let mut said = false;
        loop {
            if let Some(read) = lineage_file::read(path)?
                && read.changes() > self.lineage.changes()
            {
                let last = read.segments.last().expect("a read lineage has a segment");
                if read.changes() != self.lineage.changes() + 1 || last.recipe_hash != hash {
                    bail!(
                        "{} changed under this daemon: node 0 made it recipe {} from step {} \
                         (this daemon was to change course to {hash}); restart every node \
                         daemon with one recipe",
                        path.display(),
                        last.recipe_hash,
                        last.from_step
                    );
                }
                tracing::info!(
                    "node 0 changed course at step {}: this node takes it",
                    last.from_step
                );
                return Ok(Some(read));
            }
            if store.is_shut_down() {
                return Ok(None);
            }
            if began.elapsed() >= self.wait_limit {
                return Err(anyhow!(crate::serve::Fatal(format!(
                    "node 0 did not change course within {} s (--change-course-timeout): {} \
                     still holds no change to recipe {hash}. Node {} was started with \
                     --change-course, so node 0 must be too: restart every node daemon with \
                     --resume latest --change-course and that recipe, or every one without \
                     --change-course to continue the stream as it was",
                    self.wait_limit.as_secs(),
                    path.display(),
                    self.node
                ))));
            }
            if !said && began.elapsed() > Duration::from_secs(10) {
                said = true;
                tracing::warn!(
                    "waiting for node 0 to change course in {} (is it running, with \
                     --change-course?)",
                    path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Write `lineage.json` as the shared state directory allows (a full or stalled filesystem is
/// waited on, as every file the node daemons share).
fn write_lineage(path: &Path, lineage: &Lineage) -> anyhow::Result<()> {
    patiently(path, "write", || {
        lineage_file::write(path, lineage).map_err(|e| std::io::Error::other(format!("{e:#}")))
    })
}
