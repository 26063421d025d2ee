//! The node daemons' parts of `dsprep serve`, together: which node a daemon serves (its node
//! rank and the node count, from flags, else Slurm's or torchrun's environment, read once here),
//! the ranks it answers for (laid out node by node), and for a recipe with `[lanes]` the lanes it
//! runs, their progress files and their locks (here); the lanes' producer (`lanes.rs`), the
//! stream chain across nodes (`lane_chain.rs`) and the lanes' progress (`progress.rs`). Lane
//! checkpoints are `crate::checkpoint::lane`'s; the lineage they serve, changes of course
//! included, is `course.rs`'s.

pub mod course;
pub mod lane_chain;
pub mod lanes;
pub mod layout;
pub mod progress;

use crate::driver::LoadedRecipe;
use crate::driver::lanes::LaneInputs;
use crate::files::{LockError, try_lock_file};
use crate::serve::ServeOptions;
use anyhow::{Context, anyhow, bail};
use course::NodeCourse;
use dsprep_mixers::lanes::NodeSlice;
use dsprep_mixers::recipe::MixUnit;
use progress::LaneProgress;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Where the node rank and count came from (said in messages and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeOrigin {
    /// Nothing set: one node.
    Default,
    /// `--node-rank` / `--nodes`.
    Flags,
    /// `SLURM_NODEID` / `SLURM_NNODES`.
    Slurm,
    /// `NODE_RANK` or `GROUP_RANK` / `NNODES`.
    Torchrun,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePlace {
    pub rank: u32,
    pub count: u32,
    pub origin: NodeOrigin,
}

impl NodePlace {
    pub const SINGLE: NodePlace = NodePlace {
        rank: 0,
        count: 1,
        origin: NodeOrigin::Default,
    };

    /// Flags first; else the environment (`env` looks a variable up): Slurm, then torchrun.
    pub fn resolve(
        rank: Option<u32>,
        count: Option<u32>,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<NodePlace> {
        let number = |name: &str| -> anyhow::Result<Option<u32>> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse()
                        .with_context(|| format!("{name}={v:?} is not a whole number"))
                })
                .transpose()
        };
        let place = match (rank, count) {
            (Some(rank), Some(count)) => NodePlace {
                rank,
                count,
                origin: NodeOrigin::Flags,
            },
            (None, None) => {
                if let (Some(rank), Some(count)) =
                    (number("SLURM_NODEID")?, number("SLURM_NNODES")?)
                {
                    NodePlace {
                        rank,
                        count,
                        origin: NodeOrigin::Slurm,
                    }
                } else if let (Some(rank), Some(count)) = (
                    number("NODE_RANK")?.or(number("GROUP_RANK")?),
                    number("NNODES")?,
                ) {
                    NodePlace {
                        rank,
                        count,
                        origin: NodeOrigin::Torchrun,
                    }
                } else {
                    NodePlace::SINGLE
                }
            }
            _ => bail!("--node-rank and --nodes go together"),
        };
        if place.count == 0 || place.rank >= place.count {
            bail!(
                "node rank {} is not below the node count {} ({}): node ranks are 0..{}",
                place.rank,
                place.count,
                place.origin.describe(),
                place.count.saturating_sub(1)
            );
        }
        Ok(place)
    }
}

impl NodeOrigin {
    fn describe(self) -> &'static str {
        match self {
            NodeOrigin::Default => "the default",
            NodeOrigin::Flags => "from --node-rank/--nodes",
            NodeOrigin::Slurm => "from SLURM_NODEID/SLURM_NNODES",
            NodeOrigin::Torchrun => "from NODE_RANK or GROUP_RANK/NNODES",
        }
    }
}

/// The ranks one node's daemon answers: `local_ranks` of them from `first_rank`.
#[derive(Clone, Copy, Debug)]
pub struct NodeRanks {
    pub first_rank: u32,
    pub local_ranks: u32,
}

impl NodeRanks {
    /// The ranks node `place` serves of a data-parallel world of `world_size`, for a job laid out
    /// as `parallel` says (refused when its data-parallel replicas span nodes: [`layout`]).
    pub fn new(
        place: &NodePlace,
        world_size: u32,
        has_lanes: bool,
        parallel: &dsprep_client::Parallelism,
    ) -> anyhow::Result<NodeRanks> {
        layout::check(place, world_size, parallel).map_err(|e| anyhow!(e))?;
        if place.count > 1 && !has_lanes {
            bail!(
                "{} nodes ({}), but the recipe has no [lanes]: every node daemon would read and \
                 tokenize the whole stream. Add [lanes] to the recipe (see \
                 config/quickstart-multinode.toml), or pass --nodes 1 --node-rank 0 to serve every \
                 rank from this one daemon",
                place.count,
                place.origin.describe()
            );
        }
        if !world_size.is_multiple_of(place.count) {
            bail!(
                "world size {world_size} cannot be split over {} nodes ({}): ranks are laid out \
                 node by node, the same number on each; use a world size that is a multiple of {} \
                 (with tensor or pipeline parallel groups across nodes, give the daemon the \
                 layout, --tensor-parallel/--pipeline-parallel or DSPREP_TP/DSPREP_PP, and it \
                 says how to serve it)",
                place.count,
                place.origin.describe(),
                place.count
            );
        }
        let local_ranks = world_size / place.count;
        Ok(NodeRanks {
            first_rank: place.rank * local_ranks,
            local_ranks,
        })
    }
}

/// A node's share of a laned recipe.
pub struct NodeLanes {
    /// The input of the segment served last, dealt to the lanes.
    pub inputs: Arc<LaneInputs>,
    pub course: NodeCourse,
    pub slice: NodeSlice,
    /// With more than one node: the lanes' shared progress (the end of the stream).
    pub progress: Option<Arc<LaneProgress>>,
    /// With a state directory: where this stream's locks and lane checkpoints are, and the
    /// folder of the branch served (progress, digests, chain: [`branch_dir`]).
    pub stream_dir: Option<std::path::PathBuf>,
    pub branch_dir: Option<std::path::PathBuf>,
    /// One lock per lane this node runs, held for the daemon's life.
    _locks: Vec<std::fs::File>,
}

impl NodeLanes {
    pub fn open(
        loaded: &LoadedRecipe,
        options: &ServeOptions,
        global_batch: u64,
    ) -> anyhow::Result<NodeLanes> {
        let spec = loaded.recipe.lanes.context("a recipe with [lanes]")?;
        let place = &options.node;
        let slice = NodeSlice::new(&spec, global_batch, place.rank, place.count).map_err(|e| {
            anyhow!(
                "recipe {}: {e} (world size {} × micro batch {}, node {} of {}, {})",
                options.recipe.display(),
                options.world_size,
                options.micro_batch,
                place.rank,
                place.count,
                place.origin.describe()
            )
        })?;
        let course = NodeCourse::open(options, loaded)?;
        let inputs = Arc::clone(course.inputs.last().context("a lineage has a segment")?);
        for warning in inputs.warnings(course.served_recipe()) {
            tracing::warn!("{warning}");
        }
        let (shared, locks) = match (&options.state_dir, place.count) {
            (None, 1) => (None, Vec::new()),
            (None, n) => bail!(
                "{n} node daemons learn where the stream ends from each other's files: pass \
                 --state-dir on a filesystem every node shares"
            ),
            (Some(dir), _) => {
                // The stream is named by its first recipe: a change of course keeps its folder.
                let id = stream_id(&course.lineage.segments[0].recipe, &course.inputs[0]);
                let stream_dir = dir.join(format!("lanes-{id}"));
                let branch = branch_dir(&stream_dir, course.branch());
                let progress = LaneProgress::in_dir(spec, &branch)
                    .with_context(|| format!("cannot use --state-dir {}", dir.display()))?;
                let locks = lock_lanes(&stream_dir, &slice, place.rank)?;
                (Some((Arc::new(progress), (stream_dir, branch))), locks)
            }
        };
        let (progress, dirs) = shared.unzip();
        let (stream_dir, branch_dir) = dirs.unzip();
        let lanes = NodeLanes {
            inputs,
            course,
            progress: progress.filter(|_| place.count > 1),
            stream_dir,
            branch_dir,
            slice,
            _locks: locks,
        };
        tracing::info!(
            "node {} of {} ({}): lanes {:?} of {}, {} input bytes",
            place.rank,
            place.count,
            place.origin.describe(),
            lanes.slice.lanes(),
            spec.count,
            lanes.input_bytes()
        );
        Ok(lanes)
    }

    /// Bytes of the input units of this node's lanes.
    pub fn input_bytes(&self) -> u64 {
        self.slice
            .lanes()
            .iter()
            .map(|&l| self.inputs.lane_bytes[l as usize])
            .sum()
    }
}

/// The folder of branch `branch` of the stream in `stream_dir` (the stream's own for branch 0;
/// each change of course opens the next).
pub fn branch_dir(stream_dir: &std::path::Path, branch: usize) -> std::path::PathBuf {
    match branch {
        0 => stream_dir.to_path_buf(),
        n => stream_dir.join(format!("branch-{n}")),
    }
}

/// Names the stream on disk: its first recipe (as written: `[mix.adaptive]`'s decisions, phases
/// of its effective recipe, are not part of the name) and every unit each lane reads.
fn stream_id(recipe: &dsprep_mixers::Recipe, inputs: &LaneInputs) -> String {
    let mut hasher = Sha256::new();
    hasher.update(recipe.hash().as_bytes());
    for (lane, sources) in inputs.lanes.iter().enumerate() {
        for (source, shards) in sources.iter().enumerate() {
            for shard in shards {
                hasher.update(format!(
                    "\n{lane} {source} {}",
                    shard.display_path().display()
                ));
            }
        }
    }
    // Lanes that mix by their own weights (a source missing from some lanes) make another stream
    // than the same units did before those weights existed.
    let own_phases = 1 + recipe.mix.phases.len();
    let own = || inputs.shares.iter().take(own_phases);
    if recipe.mix.unit == MixUnit::Tokens && own().any(|s| s.adjusted) {
        for (phase, shares) in own().enumerate() {
            for (lane, weights) in shares.weights.iter().enumerate() {
                hasher.update(format!("\nweights {phase} {lane} {weights:?}"));
            }
        }
    }
    hex::encode(&hasher.finalize()[..8])
}

/// Take a lock per lane: a second daemon that would run one of them (two daemons given the same
/// node rank) is refused, naming the lane.
fn lock_lanes(
    dir: &std::path::Path,
    slice: &NodeSlice,
    node: u32,
) -> anyhow::Result<Vec<std::fs::File>> {
    slice
        .lanes()
        .into_iter()
        .map(|lane| {
            let path = dir.join(format!("lane-{lane:05}.lock"));
            match try_lock_file(&path) {
                Ok(file) => Ok(file),
                Err(LockError::Held) => bail!(
                    "lane {lane} is already served by another daemon on this state directory (it \
                     holds {}): is node rank {node} given to two daemons?",
                    path.display()
                ),
                Err(LockError::Io(e)) => {
                    Err(e).with_context(|| format!("cannot lock {}", path.display()))
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn flags_then_slurm_then_torchrun() {
        let slurm = [
            ("SLURM_NODEID", "1"),
            ("SLURM_NNODES", "4"),
            ("NODE_RANK", "0"),
            ("NNODES", "2"),
        ];
        let p = NodePlace::resolve(None, None, env(&slurm)).unwrap();
        assert_eq!((p.rank, p.count, p.origin), (1, 4, NodeOrigin::Slurm));
        let p = NodePlace::resolve(Some(0), Some(2), env(&slurm)).unwrap();
        assert_eq!((p.rank, p.count, p.origin), (0, 2, NodeOrigin::Flags));
        let torch = [("GROUP_RANK", "1"), ("NNODES", "2")];
        let p = NodePlace::resolve(None, None, env(&torch)).unwrap();
        assert_eq!((p.rank, p.count, p.origin), (1, 2, NodeOrigin::Torchrun));
        assert_eq!(
            NodePlace::resolve(None, None, env(&[])).unwrap(),
            NodePlace::SINGLE
        );
    }

    #[test]
    fn bad_places_are_refused_with_their_values() {
        let e = NodePlace::resolve(
            None,
            None,
            env(&[("SLURM_NODEID", "4"), ("SLURM_NNODES", "4")]),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "node rank 4 is not below the node count 4 (from SLURM_NODEID/SLURM_NNODES): node \
             ranks are 0..3"
        );
        let e = NodePlace::resolve(
            None,
            None,
            env(&[("SLURM_NODEID", "x"), ("SLURM_NNODES", "2")]),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "SLURM_NODEID=\"x\" is not a whole number");
        let two = NodePlace {
            rank: 1,
            count: 2,
            origin: NodeOrigin::Flags,
        };
        let e = NodeRanks::new(&two, 5, true, &Default::default())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("world size 5 cannot be split over 2 nodes"),
            "{e}"
        );
        let e = NodeRanks::new(&two, 8, false, &Default::default())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("the recipe has no [lanes]"), "{e}");
        let r = NodeRanks::new(&two, 8, true, &Default::default()).unwrap();
        assert_eq!((r.first_rank, r.local_ranks), (4, 4));
    }
}
