//! A laned stream's lineage, lane by lane. The stream's lineage (one for every node daemon)
//! places each change at a window of the whole stream; each lane is its own deterministic
//! stream, so there the change takes over at that lane's own place: its windows before the
//! stream's window ([`lane_window`]), then the first document boundary at which the lane's
//! packer has emitted them ([`LanePoint::documents`], found by running the lane). A lane's
//! runnable lineage ([`Lineage::for_lane`]) is the stream's with each segment's window and
//! documents made the lane's, so the lane changes course through the one mechanism
//! ([`super::transplant()`]) as a single stream does.

use super::Lineage;
use crate::lanes::lane_tokens_before;
use crate::recipe::LanesSpec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where one segment of the stream's lineage takes over in one lane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LanePoint {
    /// The segment it is for: its recipe and first step (what names it in the lineage).
    pub recipe_hash: String,
    pub from_step: u64,
    /// The lane's own windows before the segment, and its documents drawn before it.
    pub window: u64,
    pub documents: u64,
}

/// Lane `lane`'s own windows before window `window` of the stream.
pub fn lane_window(spec: &LanesSpec, window: u64, lane: u32) -> u64 {
    lane_tokens_before(spec, 1, lane, window)
}

impl Lineage {
    /// The changes of course ever made (abandoned ones included): each names its own branch of
    /// the stream.
    pub fn changes(&self) -> usize {
        self.segments.len() - 1 + self.abandoned.len()
    }

    /// What names segments `0..=k` (empty for the first alone): a lane checkpoint made in
    /// segment `k` of one branch is good for another exactly when this is the same.
    pub fn prefix_key(&self, k: usize) -> String {
        if k == 0 {
            return String::new();
        }
        let mut hasher = Sha256::new();
        for s in &self.segments[..=k] {
            hasher.update(format!("{} {}\n", s.recipe_hash, s.from_step));
        }
        hex::encode(&hasher.finalize()[..8])
    }

    /// How many of `points` (a lane's, in segment order) are this lineage's: the longest prefix
    /// whose segments match (a change made below a point replaces it).
    pub fn valid_points(&self, points: &[LanePoint]) -> usize {
        (self.segments.iter().zip(points))
            .take_while(|(s, p)| s.recipe_hash == p.recipe_hash && s.from_step == p.from_step)
            .count()
    }

    /// The lineage of one lane, given its points for the first `points.len()` segments (the
    /// segments past them left out): each segment's window and documents are the lane's own.
    pub fn for_lane(&self, points: &[LanePoint]) -> Lineage {
        let mut lane = self.clone();
        lane.segments.truncate(points.len());
        for (s, p) in lane.segments.iter_mut().zip(points) {
            (s.from_window, s.from_documents) = (p.window, p.documents);
        }
        lane
    }

    /// The segment a lane run from its start begins in: the last one that takes over before
    /// the lane's first document.
    pub fn first_segment(&self) -> usize {
        (self.segments.iter())
            .rposition(|s| s.from_documents == 0)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::lineage;

    #[test]
    fn a_lane_takes_its_own_windows_and_documents_and_stale_points_are_dropped() {
        let spec = LanesSpec {
            count: 4,
            block_windows: 2,
        };
        // 40 windows = 20 blocks: 5 rounds of 4 lanes, 10 windows each.
        assert_eq!(lane_window(&spec, 40, 3), 10);
        assert_eq!(lane_window(&spec, 41, 0), 11);
        let l = lineage();
        let point = |k: usize, window, documents| LanePoint {
            recipe_hash: l.segments[k].recipe_hash.clone(),
            from_step: l.segments[k].from_step,
            window,
            documents,
        };
        let points = vec![point(0, 0, 0), point(1, 10, 33)];
        assert_eq!(l.valid_points(&points), 2);
        let lane = l.for_lane(&points);
        assert_eq!(
            (
                lane.segments[1].from_window,
                lane.segments[1].from_documents
            ),
            (10, 33)
        );
        assert_eq!(lane.first_segment(), 0);
        let mut stale = points.clone();
        stale[1].from_step = 6;
        assert_eq!(l.valid_points(&stale), 1);
        assert_eq!(l.for_lane(&stale[..1]).segments.len(), 1);
        assert_eq!(l.prefix_key(0), "");
        let mut later = l.clone();
        later.segments[1].from_step = 6;
        assert_ne!(
            l.prefix_key(1),
            later.prefix_key(1),
            "another step, another branch"
        );
        assert_eq!(l.changes(), 1);
    }
}
