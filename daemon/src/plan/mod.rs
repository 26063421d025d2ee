//! `dsprep plan`: what a recipe would read, without reading it. Resolves every Hub revision to
//! its commit, lists every source's shards in reading order with their sizes, downloads nothing
//! (a Hub shard's size and checksum come from the listing). For a recipe with `[lanes]`, also how
//! the input is dealt: units and bytes per lane, and per source. With `--out`, the same listing
//! (and deal) is frozen into a plan file that `dsprep pack` and `dsprep serve` take as `--plan`
//! (`crate::driver::frozen_plan`). Listing shows its progress source by source (`crate::progress`).
//! For a recipe mixed in tokens it also estimates each source's tokens and where the stream ends,
//! and warns of a phase the stream would never reach (`estimate.rs`).

mod estimate;
mod lineage;

pub use lineage::plan_lineage;

use crate::driver::frozen_plan::FrozenPlan;
use crate::driver::inputs::{ShardSize, shard_sizes, source_shards};
use crate::driver::lanes::deal_inputs;
use crate::driver::{hub_client, load_recipe};
use crate::progress::Progress;
use crate::sources::Shard;
use anyhow::Context;
use dsprep_mixers::recipe::{MixUnit, Recipe};
use std::fmt::Write;
use std::path::Path;

/// The plan as text, one line per shard; with `plan_file`, also frozen into that file (see
/// [`FrozenPlan`]) for `--plan`.
pub fn plan(recipe_path: &Path, plan_file: Option<&Path>) -> anyhow::Result<String> {
    let loaded = load_recipe(recipe_path)?;
    let recipe = &loaded.recipe;
    let context = || format!("recipe {}", recipe_path.display());
    let hub = hub_client(&loaded)?;
    // One listing: the lanes' deal when the recipe has lanes, else each source's shards.
    let (lists, sizes, dealt) = match recipe.lanes {
        Some(_) => {
            let inputs = deal_inputs(&loaded, hub).with_context(context)?;
            (inputs.sources.clone(), inputs.sizes.clone(), Some(inputs))
        }
        None => {
            let mut lists = Vec::with_capacity(recipe.sources.len());
            let mut sizes: Vec<Vec<ShardSize>> = Vec::with_capacity(recipe.sources.len());
            // Listing a large Hub dataset takes a while: say which source is done.
            let progress = Progress::new("plan", true);
            for (index, spec) in recipe.sources.iter().enumerate() {
                let shards = source_shards(&loaded, index, hub.as_ref()).with_context(context)?;
                sizes.push(shard_sizes(&loaded, index, &shards, false).with_context(context)?);
                progress.update(|| {
                    format!(
                        "listed source {:?} ({} of {}): {} shards",
                        spec.name,
                        index + 1,
                        recipe.sources.len(),
                        shards.len()
                    )
                });
                lists.push(shards);
            }
            progress.finish();
            (lists, sizes, None)
        }
    };
    if let Some(plan_file) = plan_file {
        FrozenPlan::new(&loaded, &lists, &sizes, dealt.as_ref())?.write(plan_file)?;
    }
    let total_weight: f64 = recipe.sources.iter().map(|s| s.weight).sum();
    let mut out = String::new();
    let mut all_shards = 0usize;
    let mut all_bytes = 0u64;
    let _ = writeln!(out, "recipe {} ({})", recipe_path.display(), recipe.hash());
    for ((input, shards), shard_sizes) in recipe.sources.iter().zip(&lists).zip(&sizes) {
        let mut lines = String::new();
        let mut bytes = 0u64;
        for (i, (shard, size)) in shards.iter().zip(shard_sizes).enumerate() {
            let (size, detail) = match shard {
                Shard::Local(_) | Shard::LocalRowGroup { .. } => (size.bytes, String::new()),
                Shard::Hub(file) => (
                    file.size,
                    match (&file.sha256, &file.oid) {
                        (Some(sha256), _) => format!("  sha256 {sha256}"),
                        (None, Some(oid)) => format!("  etag {oid}"),
                        (None, None) => String::new(),
                    },
                ),
            };
            bytes += size;
            let _ = writeln!(
                lines,
                "  {i:>4}  {}  {size} bytes{detail}",
                shard.display_path().display()
            );
        }
        let share = if total_weight > 0.0 {
            100.0 * input.weight / total_weight
        } else {
            0.0
        };
        let unit = match recipe.mix.unit {
            MixUnit::Documents => "documents",
            MixUnit::Tokens => "tokens",
        };
        let _ = writeln!(
            out,
            "source {:?}: weight {} ({share:.1} % of {unit}), {} shards, {bytes} bytes{}",
            input.name,
            input.weight,
            shards.len(),
            if !shards.is_empty() {
                ""
            } else if input.weight > 0.0 {
                " (no shards)"
            } else {
                " (not read)"
            }
        );
        out.push_str(&lines);
        all_shards += shards.len();
        all_bytes += bytes;
    }
    let _ = writeln!(
        out,
        "{all_shards} shards, {all_bytes} bytes; nothing was downloaded"
    );
    if !recipe.mix.phases.is_empty() {
        out.push_str(&phase_table(recipe));
    }
    if recipe.mix.unit == MixUnit::Tokens {
        let estimates =
            estimate::estimate_sources(&loaded, &lists, &sizes).with_context(context)?;
        out.push_str(&estimate::estimate_text(&loaded, &estimates));
    }
    if let Some(inputs) = dealt {
        let spec = inputs.spec;
        let _ = writeln!(
            out,
            "lanes: {}, {} windows per block; units (a local parquet row group, else a file) \
             and bytes per lane, then units per source:",
            spec.count, spec.block_windows
        );
        for (lane, sources) in inputs.lanes.iter().enumerate() {
            let units: Vec<String> = sources.iter().map(|u| u.len().to_string()).collect();
            let _ = writeln!(
                out,
                "  lane {lane:>4}  {:>6} units  {:>14} bytes  [{}]",
                sources.iter().map(Vec::len).sum::<usize>(),
                inputs.lane_bytes[lane],
                units.join(", ")
            );
        }
        for warning in inputs.warnings(recipe) {
            let _ = writeln!(out, "warning: {warning}");
        }
    }
    Ok(out)
}

/// The recipe's phases: where each begins and ends, and the tokens each source is expected to
/// give in it (its share of the phase's span; the last phase runs to the end of the data).
fn phase_table(recipe: &Recipe) -> String {
    let weights = recipe.phase_weights();
    let starts: Vec<u64> = std::iter::once(0)
        .chain(recipe.mix.phases.iter().map(|p| p.at_tokens))
        .collect();
    let mut out = String::from(
        "phases (a phase begins with the first document drawn once the stream holds its tokens):\n",
    );
    let _ = write!(
        out,
        "  {:<8} {:>15} {:>15}",
        "phase", "from token", "to token"
    );
    for source in &recipe.sources {
        let _ = write!(out, " {:>16}", source.name);
    }
    out.push('\n');
    for (k, phase) in weights.iter().enumerate() {
        let (from, to) = (starts[k], starts.get(k + 1).copied());
        let to_text = to.map_or("the end".to_string(), |t| t.to_string());
        let _ = write!(out, "  {k:<8} {from:>15} {to_text:>15}");
        for share in dsprep_mixers::mixer::target_shares(phase) {
            let cell = match to {
                Some(to) => format!("{:.0} ({:.1}%)", share * (to - from) as f64, 100.0 * share),
                None => format!("{:.1}%", 100.0 * share),
            };
            let _ = write!(out, " {cell:>16}");
        }
        out.push('\n');
    }
    out
}
