//! `[mix.adaptive]` over lanes: which sources each lane holds, the shares the lanes can give
//! (the lanes' share solver's), and where the stream ends as this daemon knows it.

use super::Decider;
use crate::serve::nodes::progress::{Gate, LaneProgress};
use dsprep_mixers::lanes::lane_shares;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The lanes a node's streams are: which sources each lane holds (`present[lane][source]`),
/// and how the daemon learns where the stream ends (its own lanes that ended, and with more
/// nodes the lanes' shared progress): a decision past the end is never waited for.
pub struct LaneShape {
    pub spec: dsprep_mixers::LanesSpec,
    pub present: Vec<Vec<bool>>,
    pub global_batch: u64,
    pub progress: Option<Arc<LaneProgress>>,
    /// Per lane this daemon runs that ended: its blocks.
    pub ended: Mutex<BTreeMap<u32, u64>>,
}

impl LaneShape {
    /// The first stream window past the end, as far as this daemon's own lanes know it.
    fn end_window(&self) -> Option<u64> {
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        let (count, k) = (
            u64::from(self.spec.count),
            u64::from(self.spec.block_windows),
        );
        (ended.iter())
            .map(|(&lane, &blocks)| (blocks * count + u64::from(lane)) * k)
            .min()
    }
}

impl Decider {
    /// Whether the stream is known to end before `step` (no rank trains on it, so no report of
    /// it comes, and no decision for it is needed).
    pub(super) fn past_end(&self, step: u64) -> bool {
        let (Some(lanes), Some(start)) = (&self.lanes, self.lock().start.clone()) else {
            return false;
        };
        if lanes
            .end_window()
            .is_some_and(|end| start.window_of_step(step) >= end)
        {
            return true;
        }
        (lanes.progress.as_ref())
            .is_some_and(|p| matches!(p.gate(step, lanes.global_batch), Gate::End(_)))
    }

    /// With `[lanes]`, the shares nearest to `wanted` that the lanes can give: a source held by
    /// few lanes cannot have more than those lanes' tokens. The lanes' share solver's shares of
    /// the stream for `wanted` (`wanted` itself when every lane holds every source).
    /// `Err` says why it cannot (a lane left without a source of positive share: the decision
    /// then holds).
    pub(super) fn lanes_can_give(&self, wanted: Vec<f64>) -> Result<Vec<f64>, String> {
        let Some(lanes) = &self.lanes else {
            return Ok(wanted);
        };
        match lane_shares(&lanes.present, &wanted) {
            Ok(s) if s.adjusted => Ok(s.global),
            Ok(_) => Ok(wanted),
            Err(lane) => Err(format!(
                "shares that leave lane {lane} no source to draw from"
            )),
        }
    }
}
