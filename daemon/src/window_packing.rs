//! How each window of a packed directory is packed, from its manifest alone: padded (`best_fit`,
//! with its pad id) or not (`concat`). One packing for the whole pack, or (format 7) each lineage
//! segment's from its first window on, per lane in a laned pack. `verify` holds every window to
//! it; `inspect` counts by it.

use anyhow::Context;
use dsprep_client::format;
use dsprep_mixers::lanes::window_lane;
use dsprep_mixers::recipe::LanesSpec;

/// How each window is packed: the pack's one packing, or (format 7) each lineage segment's from
/// its first window on; in a laned pack, from each lane's first window on in that lane's own
/// windows (`lane_first_windows`).
pub struct WindowPacking {
    /// The lanes that interleave the stream, when the segments' packings are per lane.
    lanes: Option<LanesSpec>,
    /// Per lane (one list without lanes): `(first window, pad id)`, increasing, in the lane's own
    /// windows; `None`: `concat`, no padding.
    spans: Vec<Vec<(u64, Option<u32>)>>,
}

impl WindowPacking {
    /// The packing of `m`'s windows; fails when a laned pack's packings do not cover its lanes.
    pub fn of(m: &format::Manifest) -> anyhow::Result<WindowPacking> {
        let packings: Vec<&format::SegmentPacking> = (m.lineage.iter().flatten())
            .filter_map(|s| s.packing.as_ref())
            .collect();
        if packings.is_empty() {
            let pad = m.packing.as_ref().map(|p| p.pad_id);
            return Ok(WindowPacking {
                lanes: None,
                spans: vec![vec![(0, pad)]],
            });
        }
        if packings.iter().all(|p| p.lane_first_windows.is_none()) {
            let spans = packings
                .iter()
                .map(|p| (p.first_window, p.pad_id))
                .collect();
            return Ok(WindowPacking {
                lanes: None,
                spans: vec![spans],
            });
        }
        let lanes = (m.recipe.get("lanes").cloned())
            .and_then(|v| serde_json::from_value::<LanesSpec>(v).ok())
            .context("the lineage's packings are per lane, but the recipe has no [lanes]")?;
        let spans = (0..lanes.count as usize)
            .map(|lane| {
                (packings.iter())
                    .map(|p| {
                        let first = p.lane_first_windows.as_ref().and_then(|f| f.get(lane));
                        let first = first.with_context(|| {
                            format!(
                                "the packing from window {} has no first window for lane {lane} \
                                 of {}",
                                p.first_window, lanes.count
                            )
                        })?;
                        Ok((*first, p.pad_id))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(WindowPacking {
            lanes: Some(lanes),
            spans,
        })
    }

    /// Window `index`'s pad id; `None` when it is not padded.
    pub fn pad_at(&self, index: u64) -> Option<u32> {
        let (lane, index) = match &self.lanes {
            Some(spec) => window_lane(spec, index),
            None => (0, index),
        };
        let spans = self.spans.get(lane as usize)?;
        let k = spans.partition_point(|&(first, _)| first <= index);
        spans.get(k.saturating_sub(1)).and_then(|&(_, pad)| pad)
    }
}
