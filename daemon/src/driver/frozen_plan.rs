//! The frozen plan (`dsprep plan --out plan.json`, read by `--plan`): a recipe's listing — every
//! source's shards in reading order with their sizes, Hub files pinned to their commit — and, for
//! a recipe with `[lanes]`, the deal of units to lanes, written once per job so that node daemons
//! and array tasks list nothing and open only their own files. Format: FORMAT.md "Plan file".

use super::inputs::{ShardSize, source_units};
use super::lanes::LaneInputs;
use super::stream::LoadedRecipe;
use crate::files::write_atomic;
use crate::hub::HubFile;
use crate::sources::Shard;
use anyhow::{Context, anyhow, bail};
use dsprep_mixers::lanes::deal_units;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// `format` of a plan file.
pub const PLAN_FORMAT: &str = "dsprep-plan";
/// The plan file version this dsprep writes and reads.
pub const PLAN_VERSION: u32 = 1;

/// A plan file, as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenPlan {
    pub format: String,
    pub version: u32,
    pub created_by: String,
    /// `Recipe::hash()` of the recipe it was made from.
    pub recipe_hash: String,
    /// Per source, in recipe order.
    pub sources: Vec<PlannedSource>,
    /// For a recipe with `[lanes]`: which units each lane reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<PlannedLanes>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedSource {
    pub name: String,
    /// In reading order; none for a source of weight 0 (not read).
    pub shards: Vec<PlannedShard>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlannedShard {
    /// A local file: `path` relative to the recipe's folder, or absolute.
    Local {
        path: String,
        size: u64,
        /// Compressed bytes of each row group, for a parquet file the lanes deal by row group.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        row_groups: Option<Vec<u64>>,
    },
    Hub {
        repo: String,
        commit: String,
        path: String,
        size: u64,
        sha256: Option<String>,
        oid: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedLanes {
    pub count: u32,
    /// Per lane.
    pub lanes: Vec<PlannedLane>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedLane {
    /// Per source, the indices of the units this lane reads (units of a source numbered in
    /// reading order: a split parquet file's row groups, else whole files).
    pub units: Vec<Vec<usize>>,
    /// The bytes of those units.
    pub bytes: u64,
}

/// What a plan file's first fields say, read before the rest.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<serde_json::Value>,
}

impl FrozenPlan {
    /// The plan of a listing: per source its shards and their sizes (paths made relative to
    /// `loaded.base` where they start with it), plus the deal for a recipe with lanes.
    pub fn new(
        loaded: &LoadedRecipe,
        shards: &[Vec<Shard>],
        sizes: &[Vec<ShardSize>],
        dealt: Option<&LaneInputs>,
    ) -> anyhow::Result<FrozenPlan> {
        let recipe = &loaded.recipe;
        let mut sources = Vec::with_capacity(recipe.sources.len());
        for ((spec, shards), sizes) in recipe.sources.iter().zip(shards).zip(sizes) {
            let planned = shards
                .iter()
                .zip(sizes)
                .map(|(shard, size)| planned_shard(&loaded.base, shard, size))
                .collect::<anyhow::Result<_>>()?;
            sources.push(PlannedSource {
                name: spec.name.clone(),
                shards: planned,
            });
        }
        let lanes = match (recipe.lanes, dealt) {
            (Some(spec), Some(inputs)) => Some(PlannedLanes {
                count: spec.count,
                lanes: inputs
                    .lane_bytes
                    .iter()
                    .enumerate()
                    .map(|(lane, &bytes)| PlannedLane {
                        units: inputs
                            .dealt
                            .iter()
                            .map(|per_lane| per_lane.get(lane).cloned().unwrap_or_default())
                            .collect(),
                        bytes,
                    })
                    .collect(),
            }),
            _ => None,
        };
        Ok(FrozenPlan {
            format: PLAN_FORMAT.into(),
            version: PLAN_VERSION,
            created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
            recipe_hash: recipe.hash(),
            sources,
            lanes,
        })
    }

    /// Write to `path` atomically (a crash leaves the old file or the whole new one).
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let mut json = serde_json::to_vec_pretty(self).context("cannot encode the plan")?;
        json.push(b'\n');
        write_atomic(path, &json).with_context(|| format!("cannot write plan {}", path.display()))
    }

    /// Read the plan at `path` for `loaded` (given as `recipe_path`), refusing one of another
    /// format or version, one made for another recipe, and one whose lanes differ from dealing
    /// its own unit sizes.
    pub fn load(path: &Path, loaded: &LoadedRecipe, recipe_path: &Path) -> anyhow::Result<Self> {
        let again = format!(
            "write it again with `dsprep plan --recipe {} --out {}`",
            recipe_path.display(),
            path.display()
        );
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read plan {}", path.display()))?;
        let header: Header = serde_json::from_slice(&bytes)
            .with_context(|| format!("plan {} is not a JSON object", path.display()))?;
        if header.format.as_deref() != Some(PLAN_FORMAT) {
            bail!(
                "plan {}: format is {}, not {PLAN_FORMAT:?}: not a dsprep plan file; {again}",
                path.display(),
                header
                    .format
                    .map_or_else(|| "missing".to_string(), |f| format!("{f:?}"))
            );
        }
        let version = header.version.map(|v| v.to_string());
        if version.as_deref() != Some(&PLAN_VERSION.to_string()) {
            bail!(
                "plan {}: version {} is not one this dsprep {} reads (it reads version \
                 {PLAN_VERSION}); {again}",
                path.display(),
                version.as_deref().unwrap_or("missing"),
                env!("CARGO_PKG_VERSION")
            );
        }
        let plan: FrozenPlan = serde_json::from_slice(&bytes)
            .with_context(|| format!("plan {} is not a readable plan; {again}", path.display()))?;
        let hash = loaded.recipe.hash();
        if plan.recipe_hash != hash {
            bail!(
                "plan {} was made for recipe hash {}, but recipe {} has hash {hash}: the recipe \
                 changed since (or it is another recipe); {again}",
                path.display(),
                plan.recipe_hash,
                recipe_path.display()
            );
        }
        let names: Vec<&str> = plan.sources.iter().map(|s| s.name.as_str()).collect();
        let expected: Vec<&str> = loaded
            .recipe
            .sources
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        if names != expected {
            bail!(
                "plan {} lists sources {names:?}, but recipe {} has {expected:?}; {again}",
                path.display(),
                recipe_path.display()
            );
        }
        plan.check_lanes(loaded)
            .map_err(|e| anyhow!("plan {}: {e}; {again}", path.display()))?;
        Ok(plan)
    }

    /// Source `index`'s shards, local paths joined to `base` (the recipe's folder).
    pub fn shards(&self, index: usize, base: &Path) -> anyhow::Result<Vec<Shard>> {
        Ok(self
            .source(index)?
            .shards
            .iter()
            .map(|shard| match shard {
                PlannedShard::Local { path, .. } => Shard::Local(base.join(path)),
                PlannedShard::Hub {
                    repo,
                    commit,
                    path,
                    size,
                    sha256,
                    oid,
                } => Shard::Hub(Arc::new(HubFile {
                    repo: repo.clone(),
                    commit: commit.clone(),
                    path: path.clone(),
                    size: *size,
                    sha256: sha256.clone(),
                    oid: oid.clone(),
                })),
            })
            .collect())
    }

    /// Source `index`'s shard sizes, in the order of [`FrozenPlan::shards`].
    pub fn sizes(&self, index: usize) -> anyhow::Result<Vec<ShardSize>> {
        Ok(self
            .source(index)?
            .shards
            .iter()
            .map(|shard| match shard {
                PlannedShard::Local {
                    size, row_groups, ..
                } => ShardSize {
                    bytes: *size,
                    row_groups: row_groups.clone(),
                },
                PlannedShard::Hub { size, .. } => ShardSize {
                    bytes: *size,
                    row_groups: None,
                },
            })
            .collect())
    }

    fn source(&self, index: usize) -> anyhow::Result<&PlannedSource> {
        self.sources
            .get(index)
            .ok_or_else(|| anyhow!("the plan has no source {index}"))
    }

    /// The frozen partition must be what dealing the plan's own unit sizes gives (no IO).
    fn check_lanes(&self, loaded: &LoadedRecipe) -> anyhow::Result<()> {
        let (spec, lanes) = match (loaded.recipe.lanes, &self.lanes) {
            (None, None) => return Ok(()),
            (Some(spec), Some(lanes)) => (spec, lanes),
            (Some(spec), None) => bail!(
                "it has no lanes, but the recipe has lanes.count = {}",
                spec.count
            ),
            (None, Some(lanes)) => bail!(
                "it deals {} lanes, but the recipe has no [lanes]",
                lanes.count
            ),
        };
        if lanes.count != spec.count || lanes.lanes.len() != spec.count as usize {
            bail!(
                "it deals {} lanes ({} listed), but the recipe has lanes.count = {}",
                lanes.count,
                lanes.lanes.len(),
                spec.count
            );
        }
        let base = Path::new("");
        let mut unit_bytes = Vec::with_capacity(self.sources.len());
        for index in 0..self.sources.len() {
            let units = source_units(&self.shards(index, base)?, &self.sizes(index)?);
            unit_bytes.push(
                units
                    .into_iter()
                    .map(|(_, bytes)| bytes)
                    .collect::<Vec<_>>(),
            );
        }
        let dealt = deal_units(&unit_bytes, spec.count);
        for (lane, planned) in lanes.lanes.iter().enumerate() {
            let mut bytes = 0u64;
            for (source, per_lane) in dealt.iter().enumerate() {
                let expected = per_lane.get(lane).map(Vec::as_slice).unwrap_or_default();
                let frozen = planned
                    .units
                    .get(source)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                if frozen != expected {
                    bail!(
                        "lane {lane} reads units {frozen:?} of source {:?}, but dealing the \
                         plan's unit sizes to {} lanes gives it {expected:?}",
                        self.sources[source].name,
                        spec.count
                    );
                }
                bytes += expected.iter().map(|&u| unit_bytes[source][u]).sum::<u64>();
            }
            if planned.bytes != bytes {
                bail!(
                    "lane {lane} has {} bytes, but its units add up to {bytes}",
                    planned.bytes
                );
            }
            if planned.units.len() != dealt.len() {
                bail!(
                    "lane {lane} lists units of {} sources, but there are {}",
                    planned.units.len(),
                    dealt.len()
                );
            }
        }
        Ok(())
    }
}

/// One shard of a listing as the plan records it.
fn planned_shard(base: &Path, shard: &Shard, size: &ShardSize) -> anyhow::Result<PlannedShard> {
    Ok(match shard {
        Shard::Local(path) | Shard::LocalRowGroup { path, .. } => PlannedShard::Local {
            path: relative_to(base, path)?,
            size: size.bytes,
            row_groups: size.row_groups.clone(),
        },
        Shard::Hub(file) => PlannedShard::Hub {
            repo: file.repo.clone(),
            commit: file.commit.clone(),
            path: file.path.clone(),
            size: file.size,
            sha256: file.sha256.clone(),
            oid: file.oid.clone(),
        },
    })
}

/// `path` relative to `base` when `base.join` of it gives back exactly `path` (the path listing
/// gives, which manifests and checkpoints name), else `path` itself when that is absolute.
fn relative_to(base: &Path, path: &Path) -> anyhow::Result<String> {
    let text = |p: &Path| {
        p.to_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{} is not UTF-8: a plan cannot name it", p.display()))
    };
    if let Ok(rel) = path.strip_prefix(base)
        && base.join(rel).as_os_str() == path.as_os_str()
    {
        return text(rel);
    }
    if path.is_absolute() {
        return text(path);
    }
    bail!(
        "{} is neither under the recipe's folder {} nor absolute: a plan cannot name it",
        path.display(),
        base.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::inputs::{shard_sizes, source_shards};
    use crate::driver::lanes::deal_inputs;
    use crate::driver::{load_recipe, load_recipe_with};
    use dsprep_mixers::EngineChoice;

    fn multinode() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/quickstart-multinode.toml")
    }

    #[test]
    fn a_written_plan_reads_back_as_the_same_shards_sizes_and_deal() {
        let recipe = multinode();
        let loaded = load_recipe(&recipe).unwrap();
        let listed = deal_inputs(&loaded, None).unwrap();
        let plan = FrozenPlan::new(&loaded, &listed.sources, &listed.sizes, Some(&listed)).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plan.json");
        plan.write(&file).unwrap();

        let planned = load_recipe_with(&recipe, EngineChoice::Auto, Some(&file)).unwrap();
        assert_eq!(planned.plan.as_deref(), Some(&plan));
        // Paths are stored relative to the recipe's folder and come back exactly as listed.
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("\"path\": \"samples/c4/en/c4-train."),
            "{text}"
        );
        for index in 0..loaded.recipe.sources.len() {
            let shards = source_shards(&planned, index, None).unwrap();
            assert_eq!(shards, listed.sources[index]);
            let display: Vec<_> = shards.iter().map(Shard::display_path).collect();
            let want: Vec<_> = listed.sources[index]
                .iter()
                .map(Shard::display_path)
                .collect();
            assert_eq!(
                display.iter().map(|p| p.as_os_str()).collect::<Vec<_>>(),
                want.iter().map(|p| p.as_os_str()).collect::<Vec<_>>()
            );
            assert_eq!(
                shard_sizes(&planned, index, &shards, true).unwrap(),
                listed.sizes[index]
            );
        }
        let dealt = deal_inputs(&planned, None).unwrap();
        assert_eq!(dealt.lanes, listed.lanes);
        assert_eq!(dealt.lane_bytes, listed.lane_bytes);
    }

    #[test]
    fn paths_under_the_recipe_folder_are_stored_relative_and_others_absolute() {
        let base = Path::new("cfg/../jobs");
        assert_eq!(
            relative_to(base, Path::new("cfg/../jobs/data/a.parquet")).unwrap(),
            "data/a.parquet"
        );
        assert_eq!(
            relative_to(base, Path::new("/data/b.parquet")).unwrap(),
            "/data/b.parquet"
        );
        assert_eq!(
            relative_to(Path::new(""), Path::new("x/c.jsonl")).unwrap(),
            "x/c.jsonl"
        );
        assert!(relative_to(base, Path::new("elsewhere/d.parquet")).is_err());
    }
}
