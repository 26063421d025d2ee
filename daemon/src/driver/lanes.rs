//! The lanes of a recipe with `[lanes]` (the arithmetic is `dsprep_mixers::lanes`): each
//! source's input listed once (or taken from the frozen plan) and dealt to the lanes by size — a
//! local parquet file by row group, any other file whole — and one lane built into its own
//! document stream (run by `run.rs`, as every stream is). `dsprep pack` (all lanes, or a
//! part's) and the node daemons of `dsprep serve` (their own lanes) build lanes with these
//! functions, so they read the same units.

use super::inputs::{ShardSize, shard_sizes, source_shards, source_units};
use super::pretokenize::Pretokenized;
use super::stream::{LoadedRecipe, mix_stream};
use crate::hub::HubClient;
use crate::sources::{LocalSource, Shard, SourceContext};
use anyhow::{Context, anyhow, bail};
use dsprep_mixers::DocStream;
use dsprep_mixers::lanes::{LaneShares, deal_units, lane_buffer_size, lane_seed, lane_shares};
use dsprep_mixers::ledger::PhasePoints;
use dsprep_mixers::mixer::MixInput;
use dsprep_mixers::recipe::{LanesSpec, MixUnit};
use std::sync::Arc;

/// A recipe's input, listed once and dealt to its lanes.
pub struct LaneInputs {
    pub spec: LanesSpec,
    /// Per source (recipe order), its shards in reading order, undivided: what manifests hash.
    pub sources: Vec<Vec<Shard>>,
    /// Per source, its shards' sizes (row groups of split parquet files), as `sources`.
    pub sizes: Vec<Vec<ShardSize>>,
    /// `dealt[source][lane]`: the indices of that source's units the lane reads.
    pub dealt: Vec<Vec<Vec<usize>>>,
    /// `lanes[lane][source]`: the units that lane reads of that source, in reading order.
    pub lanes: Vec<Vec<Vec<Shard>>>,
    /// Per lane, the bytes of its units (compressed row groups, whole files).
    pub lane_bytes: Vec<u64>,
    /// Per phase (0: the `[[source]]` weights), the lanes' weights that hold the recipe's shares
    /// of the stream (`dsprep_mixers::lanes::shares`). A mix in tokens uses them; a mix in
    /// documents mixes each lane's sources by the recipe's weights (`global` then estimates
    /// where the shares drift to).
    pub shares: Vec<LaneShares>,
    context: SourceContext,
}

/// List every source (or take it from the run's frozen plan) and deal its units to the lanes.
/// Fails, naming the lane, when a lane would get no input at all.
pub fn deal_inputs(
    loaded: &LoadedRecipe,
    hub: Option<Arc<HubClient>>,
) -> anyhow::Result<LaneInputs> {
    let recipe = &loaded.recipe;
    let Some(spec) = recipe.lanes else {
        bail!("internal error: the recipe has no [lanes]");
    };
    let mut sources = Vec::with_capacity(recipe.sources.len());
    let mut sizes = Vec::with_capacity(recipe.sources.len());
    let mut units: Vec<Vec<(Shard, u64)>> = Vec::with_capacity(recipe.sources.len());
    for index in 0..recipe.sources.len() {
        let shards = source_shards(loaded, index, hub.as_ref())?;
        let shard_sizes = shard_sizes(loaded, index, &shards, true)?;
        units.push(source_units(&shards, &shard_sizes));
        sources.push(shards);
        sizes.push(shard_sizes);
    }
    let unit_bytes: Vec<Vec<u64>> = units
        .iter()
        .map(|u| u.iter().map(|(_, bytes)| *bytes).collect())
        .collect();
    // In the lineage's dealing order, so that a source's units fall in the same lanes in every
    // segment (a source that starts or stops taking part at a change moves no other's).
    let order = loaded.deal_order();
    let ordered: Vec<Vec<u64>> = order.iter().map(|&i| unit_bytes[i].clone()).collect();
    let mut dealt = vec![vec![Vec::new(); spec.count as usize]; recipe.sources.len()];
    for (&source, per_lane) in order.iter().zip(deal_units(&ordered, spec.count)) {
        dealt[source] = per_lane;
    }
    let mut lanes = vec![vec![Vec::new(); recipe.sources.len()]; spec.count as usize];
    let mut lane_bytes = vec![0u64; spec.count as usize];
    for (source, per_lane) in dealt.iter().enumerate() {
        for (lane, picks) in per_lane.iter().enumerate() {
            for &unit in picks {
                let (shard, bytes) = &units[source][unit];
                lanes[lane][source].push(shard.clone());
                lane_bytes[lane] += bytes;
            }
        }
    }
    let total: usize = units.iter().map(Vec::len).sum();
    if let Some(empty) = lanes.iter().position(|l| l.iter().all(Vec::is_empty)) {
        bail!(
            "lanes.count = {} but the sources have {total} units of input in all (row groups of \
             local parquet files, other files whole): lane {empty} would read nothing; lower \
             lanes.count to at most {total}",
            spec.count
        );
    }
    let shares = phase_shares(recipe, &lanes)?;
    Ok(LaneInputs {
        spec,
        sources,
        sizes,
        dealt,
        lanes,
        lane_bytes,
        shares,
        context: SourceContext {
            base: loaded.base.clone(),
            hub,
        },
    })
}

/// Per phase, the lanes' weights ([`LaneShares`]); fails, naming the lane and the phase, when a
/// lane holds no unit of any source of a phase (it would have nothing to give in it).
fn phase_shares(
    recipe: &dsprep_mixers::Recipe,
    lanes: &[Vec<Vec<Shard>>],
) -> anyhow::Result<Vec<LaneShares>> {
    let present: Vec<Vec<bool>> = lanes
        .iter()
        .map(|l| l.iter().map(|units| !units.is_empty()).collect())
        .collect();
    let mut shares = Vec::new();
    for (phase, weights) in recipe.phase_weights().iter().enumerate() {
        match lane_shares(&present, weights) {
            Ok(s) => shares.push(s),
            Err(lane) => {
                let names: Vec<&str> = recipe
                    .sources
                    .iter()
                    .zip(weights)
                    .filter(|(_, w)| **w > 0.0)
                    .map(|(s, _)| s.name.as_str())
                    .collect();
                bail!(
                    "lane {lane} of lanes.count = {} holds no unit of any source of {} ({}): it \
                     would have nothing to give there; give those sources at least {} units \
                     each (more files, or more row groups) or lower lanes.count",
                    lanes.len(),
                    phase_name(phase),
                    names.join(", "),
                    lanes.len()
                );
            }
        }
    }
    Ok(shares)
}

/// How messages name phase `phase`: `mix.phase[k]` for the recipe's phases.
pub fn phase_name(phase: usize) -> String {
    match phase {
        0 => "the [[source]] weights".to_string(),
        k => format!("mix.phase[{}]", k - 1),
    }
}

impl LaneInputs {
    /// The Hub client the lanes read through, if the recipe reads the Hub.
    pub fn hub(&self) -> Option<&Arc<HubClient>> {
        self.context.hub.as_ref()
    }
    /// Lane `lane`'s document stream: the recipe's mixer over the lane's units (a source with no
    /// unit in this lane takes no part in its mix), with the lane's seed and share of the shuffle
    /// buffer, and `threads` tokenizing ahead in a mix in tokens. In tokens, the lane mixes by its
    /// weights of [`LaneInputs::shares`] and enters each phase at its own share of the phase's
    /// point ([`PhasePoints`]).
    pub fn stream(
        &self,
        loaded: &LoadedRecipe,
        lane: u32,
        threads: usize,
    ) -> anyhow::Result<DocStream<Pretokenized>> {
        let recipe = &loaded.recipe;
        let seed = lane_seed(recipe.shuffle.seed, lane);
        let in_tokens = recipe.mix.unit == MixUnit::Tokens;
        let weight = |phase: usize, i: usize| match in_tokens {
            true => self.shares[phase].weights[lane as usize][i],
            false => recipe.phase_weights()[phase][i],
        };
        let mut inputs = Vec::with_capacity(recipe.sources.len());
        for (i, spec) in recipe.sources.iter().enumerate() {
            let shards = self.lanes[lane as usize][i].clone();
            let weight = if shards.is_empty() { 0.0 } else { weight(0, i) };
            let source = LocalSource::with_shards(i as u16, spec.clone(), shards, &self.context)
                .map_err(|e| anyhow!(e))?;
            inputs.push(MixInput {
                name: spec.name.clone(),
                weight,
                source,
            });
        }
        let buffer = lane_buffer_size(recipe.shuffle.buffer_size, self.spec.count, lane);
        let points = PhasePoints::new(recipe);
        let phases = (points.lane(lane).iter().enumerate())
            .map(|(k, &at)| {
                let weights = (0..recipe.sources.len()).map(|i| weight(k + 1, i));
                (at, weights.collect())
            })
            .collect();
        mix_stream(loaded, inputs, seed, buffer, threads, phases)
    }

    /// `present[lane][source]`: whether the lane holds units of the source.
    pub fn present(&self) -> Vec<Vec<bool>> {
        (self.lanes.iter())
            .map(|l| l.iter().map(|units| !units.is_empty()).collect())
            .collect()
    }

    /// `[mix.adaptive]` over these lanes, refused where the lanes cannot give what it needs: the
    /// recipe's own shares (where the decisions start), or `min_weight` of a source that few
    /// lanes hold (a source in `k` of `L` lanes has at most `k / L` of the tokens). Decisions
    /// are then kept to what the lanes can give (`serve::adaptive`).
    pub fn check_adaptive(
        &self,
        recipe: &dsprep_mixers::Recipe,
        spec: &dsprep_mixers::recipe::AdaptiveSpec,
    ) -> anyhow::Result<()> {
        let count = self.spec.count as usize;
        let targets = &recipe.phase_targets()[0];
        let fix = format!(
            "give it at least {count} units (more files, or smaller row groups) or lower \
             lanes.count"
        );
        for (i, source) in recipe.sources.iter().enumerate() {
            if targets[i] <= 0.0 {
                continue;
            }
            let held = (0..count).filter(|&l| !self.lanes[l][i].is_empty()).count();
            let most = held as f64 / count as f64;
            let got = self.shares[0].global[i];
            if (got - targets[i]).abs() >= 5e-4 {
                bail!(
                    "[mix.adaptive] starts from weights the lanes cannot meet: source {:?} wants \
                     {:.1} % of the tokens but is in {held} of {count} lanes, which give it at \
                     most {:.1} %; {fix}",
                    source.name,
                    100.0 * targets[i],
                    100.0 * most
                );
            }
            if most < spec.min_weight {
                bail!(
                    "mix.adaptive.min_weight = {} cannot be met by the lanes: source {:?} is in \
                     {held} of {count} lanes, which give it at most {:.1} % of the tokens; {fix}, \
                     or lower min_weight to {most}",
                    spec.min_weight,
                    source.name,
                    100.0 * most
                );
            }
        }
        Ok(())
    }

    /// One message per source that some lanes hold no unit of: its units, the lanes without
    /// it, what that does to its share of the stream (per phase), and what to do. `plan`,
    /// `pack` and `serve` say them.
    pub fn warnings(&self, recipe: &dsprep_mixers::Recipe) -> Vec<String> {
        let count = self.spec.count as usize;
        let in_tokens = recipe.mix.unit == MixUnit::Tokens;
        let targets = recipe.phase_targets();
        let mut out = Vec::new();
        for (i, source) in recipe.sources.iter().enumerate() {
            let without: Vec<String> = (0..count)
                .filter(|&l| self.lanes[l][i].is_empty())
                .map(|l| l.to_string())
                .collect();
            if !recipe.takes_part(i) || without.is_empty() {
                continue;
            }
            let units: usize = self.dealt[i].iter().map(Vec::len).sum();
            let mut shares = Vec::new();
            let mut short = false;
            for (phase, t) in targets.iter().enumerate().filter(|(_, t)| t[i] > 0.0) {
                let got = match in_tokens {
                    true => self.shares[phase].global[i],
                    false => self.shares[phase].as_dealt[i],
                };
                let near = (got - t[i]).abs() < 5e-4;
                short |= !near;
                let name = match targets.len() {
                    1 => String::new(),
                    _ => format!(" in {}", phase_name(phase)),
                };
                shares.push(match (in_tokens, near) {
                    (true, true) => format!("{:.1} %{name}", 100.0 * t[i]),
                    _ => format!(
                        "about {:.1} % against {:.1} %{name}",
                        100.0 * got,
                        100.0 * t[i]
                    ),
                });
            }
            let head = format!(
                "source {:?} has {units} unit(s) of input (row groups of local parquet files, \
                 other files whole) for lanes.count = {count}: lane(s) {} have none of it",
                source.name,
                without.join(", ")
            );
            let fix = format!(
                "give it at least {count} units (more files, or smaller row groups) or lower \
                 lanes.count"
            );
            out.push(match (in_tokens, short) {
                (true, false) => format!(
                    "{head}; the lanes that hold it take more of it, so the stream keeps its share \
                     of tokens ({}), but a span shorter than a round of blocks ({} windows) can \
                     differ; to spread it evenly, {fix}",
                    shares.join(", "),
                    count * self.spec.block_windows as usize
                ),
                (true, true) => format!(
                    "{head}; even taking more of it in the lanes that hold it, the stream cannot \
                     keep its share of tokens: {}; {fix}",
                    shares.join(", ")
                ),
                (false, _) => format!(
                    "{head}, so they mix without it and its share of the stream's documents \
                     drifts: {} (the mean of the lanes' shares); {fix}, or mix in tokens ([mix] \
                     unit = \"tokens\"), where the lanes that hold it make up for the others",
                    shares.join(", ")
                ),
            });
        }
        out
    }
}

/// Each segment of a lineage's input dealt to the lanes (its effective recipe's sources, so a
/// source keeps its units in every segment: sources are dealt one after another, in lineage
/// order).
pub fn deal_segments(segments: &super::lineage::Segments) -> anyhow::Result<Vec<Arc<LaneInputs>>> {
    (segments.loaded.iter().enumerate())
        .map(|(k, loaded)| {
            let inputs = deal_inputs(loaded, crate::driver::hub_client(loaded)?)
                .with_context(|| format!("segment {k} of the lineage"))?;
            Ok(Arc::new(inputs))
        })
        .collect()
}
