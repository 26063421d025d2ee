//! A lane's course: its points (where each segment of the stream's lineage takes over in it),
//! found by running the lane and kept in the state directory, its own lineage
//! ([`Lineage::for_lane`]), and where a run of it starts (its newest checkpoint of this
//! lineage's branch and segment).

use super::NodeCourse;
use crate::checkpoint::lane::{LaneMeta, SegmentTag};
use crate::checkpoint::lane_lineage;
use crate::checkpoint::{Header, LaneCheckpoints, Loaded};
use crate::driver::lineage::Segments;
use crate::driver::pipeline::PipelineConfig;
use crate::driver::run::StreamStart;
use crate::files::patiently;
use dsprep_mixers::LanesSpec;
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::lineage::{LanePoint, Lineage, lane_window};
use std::path::PathBuf;
use std::time::Instant;

impl NodeCourse {
    /// Lane `lane`'s segments: its points known (those the lineage's changes lack found by
    /// running the lane from its newest checkpoint below each, and written), its own lineage.
    pub fn lane_segments(
        &self,
        lane: u32,
        spec: &LanesSpec,
        checkpoints: Option<&LaneCheckpoints>,
        config: &PipelineConfig,
    ) -> anyhow::Result<Segments> {
        let lineage = &self.lineage;
        let mut points = match &self.state_dir {
            Some(dir) => lane_lineage::read(dir, lane)?,
            None => Vec::new(),
        };
        points.truncate(lineage.valid_points(&points));
        let first = &self.segments.loaded[0];
        let found = points.len();
        if points.is_empty() {
            points.push(point(lineage, 0, 0, 0));
        }
        while points.len() < lineage.segments.len() {
            let j = points.len();
            let window = lane_window(spec, lineage.segments[j].from_window, lane);
            let below = Segments::for_lane(
                lineage.for_lane(&points),
                first,
                lane,
                self.inputs[..j].to_vec(),
            )?;
            let documents = match window {
                0 => 0,
                _ => {
                    let from = lane_start(&below, lane, checkpoints, window - 1)?;
                    let began = Instant::now();
                    let documents =
                        below.documents_at_window(from.segment, from.start, window, config)?;
                    tracing::info!(
                        "lane {lane}: the change at step {} takes over at its window {window}, \
                         document {documents} (found in {:.2} s)",
                        lineage.segments[j].from_step,
                        began.elapsed().as_secs_f64()
                    );
                    documents
                }
            };
            points.push(point(lineage, j, window, documents));
        }
        // A lineage of one recipe needs no points (every lane starts at its start).
        if points.len() > found.max(1)
            && let Some(dir) = &self.state_dir
        {
            let path = lane_lineage::path_in(dir, lane);
            patiently(&path, "write", || {
                lane_lineage::write(dir, lane, &points)
                    .map_err(|e| std::io::Error::other(format!("{e:#}")))
            })?;
        }
        Segments::for_lane(
            lineage.for_lane(&points),
            first,
            lane,
            self.inputs[..lineage.segments.len()].to_vec(),
        )
    }
}

fn point(lineage: &Lineage, k: usize, window: u64, documents: u64) -> LanePoint {
    let s = &lineage.segments[k];
    LanePoint {
        recipe_hash: s.recipe_hash.clone(),
        from_step: s.from_step,
        window,
        documents,
    }
}

/// Segment `k`'s tag in a lane's checkpoints.
pub fn tag(lineage: &Lineage, k: usize) -> SegmentTag {
    SegmentTag {
        recipe_hash: lineage.segments[k].recipe_hash.clone(),
        lineage: lineage.prefix_key(k),
    }
}

/// The segment of `lineage` (a lane's) that a lane checkpoint was taken in, if it is one of its
/// own: its tag, and its documents within the segment's.
fn segment_of(lineage: &Lineage, meta: &LaneMeta, state: &PipelineState) -> Option<usize> {
    let documents = state.stream.emitted;
    (0..lineage.segments.len()).find(|&k| {
        let after = lineage.segments[k].from_documents <= documents;
        let before = (lineage.segments.get(k + 1)).is_none_or(|n| documents < n.from_documents);
        let t = tag(lineage, k);
        t.recipe_hash == meta.recipe_hash && t.lineage == meta.lineage && after && before
    })
}

/// Where a lane run starts: its segment, its start, the lane's windows there, and the
/// checkpoint it restores (none: the lane's start).
pub struct LaneStart {
    pub segment: usize,
    pub start: StreamStart,
    pub windows: u64,
    pub checkpoint: Option<PathBuf>,
}

/// Where a lane of `segments` starts to reach its window `windows`: its newest checkpoint at
/// or below it that is of this lineage (segment and start), else its start.
pub fn lane_start(
    segments: &Segments,
    lane: u32,
    checkpoints: Option<&LaneCheckpoints>,
    windows: u64,
) -> anyhow::Result<LaneStart> {
    let lineage = &segments.lineage;
    let found: Option<Loaded<LaneMeta>> = match checkpoints {
        Some(c) => c.newest_at_or_below(lane, windows, |meta, state| {
            segment_of(lineage, meta, state).is_some()
        })?,
        None => None,
    };
    Ok(match found {
        Some(c) => LaneStart {
            segment: segment_of(lineage, &c.meta, &c.state).unwrap_or(0),
            windows: c.meta.position(),
            start: StreamStart::Restore {
                state: Box::new(c.state),
                what: format!("resume from {}", c.path.display()),
            },
            checkpoint: Some(c.path),
        },
        None => LaneStart {
            segment: lineage.first_segment(),
            start: StreamStart::Fresh,
            windows: 0,
            checkpoint: None,
        },
    })
}
