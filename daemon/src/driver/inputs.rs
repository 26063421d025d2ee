//! A source's input, the one place both the mixer and the lanes get it from: its shards in
//! reading order and their sizes — from the frozen plan when the run was given one (no listing,
//! no file opened), else listed (Hub revisions resolved, folders listed) and measured.

use super::stream::LoadedRecipe;
use crate::hub::HubClient;
use crate::sources::{Shard, list_source, local_row_groups};
use anyhow::anyhow;
use dsprep_mixers::recipe::Format;
use std::sync::Arc;

/// A shard's size, and for a local parquet file that lanes split, its row groups' sizes
/// (compressed bytes, what dealing weighs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSize {
    pub bytes: u64,
    pub row_groups: Option<Vec<u64>>,
}

/// Source `index`'s shards in reading order: the plan's when there is one, else listed. A source
/// of weight 0 in every phase is not listed (none).
pub fn source_shards(
    loaded: &LoadedRecipe,
    index: usize,
    hub: Option<&Arc<HubClient>>,
) -> anyhow::Result<Vec<Shard>> {
    let recipe = &loaded.recipe;
    let spec = recipe
        .sources
        .get(index)
        .ok_or_else(|| anyhow!("internal error: no source {index}"))?;
    if !recipe.takes_part(index) && !loaded.deals(index) {
        return Ok(Vec::new());
    }
    match &loaded.plan {
        Some(plan) => plan.shards(index, &loaded.base),
        None => Ok(list_source(recipe, spec, &loaded.base, hub)?),
    }
}

/// The sizes of source `index`'s `shards` (from [`source_shards`]): the plan's when there is one,
/// else measured — a local file's length, a Hub file's listed size, and with `split` (a recipe
/// with lanes) a local parquet file's row groups, read from its footer.
pub fn shard_sizes(
    loaded: &LoadedRecipe,
    index: usize,
    shards: &[Shard],
    split: bool,
) -> anyhow::Result<Vec<ShardSize>> {
    if let Some(plan) = &loaded.plan {
        return plan.sizes(index);
    }
    let spec = loaded
        .recipe
        .sources
        .get(index)
        .ok_or_else(|| anyhow!("internal error: no source {index}"))?;
    let splits = split && spec.format == Format::Parquet && spec.content.is_none();
    shards
        .iter()
        .map(|shard| match shard {
            Shard::Local(path) | Shard::LocalRowGroup { path, .. } => {
                let bytes = std::fs::metadata(path)
                    .map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?
                    .len();
                let row_groups = match shard {
                    Shard::Local(_) if splits => Some(local_row_groups(path)?),
                    _ => None,
                };
                Ok(ShardSize { bytes, row_groups })
            }
            Shard::Hub(file) => Ok(ShardSize {
                bytes: file.size,
                row_groups: None,
            }),
        })
        .collect()
}

/// The units lanes deal of one shard, with their bytes: its row groups when it has them (see
/// [`ShardSize`]), else the shard whole.
pub fn units(shard: &Shard, size: &ShardSize) -> Vec<(Shard, u64)> {
    match (&size.row_groups, shard) {
        (Some(groups), Shard::Local(path)) => groups
            .iter()
            .enumerate()
            .map(|(row_group, &bytes)| {
                let unit = Shard::LocalRowGroup {
                    path: path.clone(),
                    row_group,
                };
                (unit, bytes)
            })
            .collect(),
        _ => vec![(shard.clone(), size.bytes)],
    }
}

/// Every unit of one source's `shards`, in reading order (see [`units`]).
pub fn source_units(shards: &[Shard], sizes: &[ShardSize]) -> Vec<(Shard, u64)> {
    shards
        .iter()
        .zip(sizes)
        .flat_map(|(shard, size)| units(shard, size))
        .collect()
}
