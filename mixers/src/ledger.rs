//! The mix ledger: where each phase of a recipe begins, and per phase and source the tokens and
//! documents a packed stream's windows hold, with the target, realized shares and deviation.
//! `dsprep pack` (its manifest and summary), `dsprep serve` (`/metrics`) and `dsprep inspect
//! --mix` all count with this module, so they agree.
//!
//! **Where a phase begins.** A mixer enters a phase with the first document it draws once its
//! stream holds the phase's `at_tokens`, so a document belongs to the last phase whose point is
//! at or below the token where it starts ([`PhasePoints::phase_at`]). With `[lanes]` each lane is
//! its own mixer and counts its own tokens: lane `l`'s point is the number of its tokens before
//! `at_tokens` of the whole stream (`crate::lanes::lane_tokens_before`, exact arithmetic on the
//! fixed interleave). So no document of a phase starts before its point in the stream, and every
//! lane's first document of it comes within one round of blocks (`count × block_windows`
//! windows) plus the lane's document that crosses the point, on any number of nodes.
//!
//! **By mixing position, whatever the packing.** The mixer decides a document's phase where it
//! draws it: at its mixing position (the tokens of its lane's stream before it, as mixed). So a
//! document is counted in the phase of its mixing position, never of the window it lands in.
//! With `concat` the windows keep the mixing order, and a start's mixing position is where it
//! lies in its lane's windows; `best_fit` reorders documents across windows, so its windows carry
//! each start's mixing position (`PackedWindow::doc_positions`, and a pack's
//! `doc_positions.u64`), given here to [`PhaseLedger::add_window_at`]. One rule, two ways of
//! knowing the position.
//!
//! **Counting windows** ([`PhaseLedger::add_window`]): a window's tokens up to its first
//! document start belong to its lead source, in the phase of that document; then each start's
//! tokens to its source, in the start's phase. Sources unknown (65535: pending in a checkpoint of
//! an older dsprep) count in no source.

use crate::lanes::{lane_tokens_before, window_lane};
use crate::recipe::{LanesSpec, MixUnit, Recipe};
use serde::{Deserialize, Serialize};

/// Where each phase after the first begins, in every lane's own stream (the stream's, without
/// lanes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhasePoints {
    window_tokens: u64,
    lanes: Option<LanesSpec>,
    /// Per lane (one without lanes): the lane's own token from which each later phase holds.
    points: Vec<Vec<u64>>,
}

impl PhasePoints {
    pub fn new(recipe: &Recipe) -> Self {
        let at = recipe.mix.phases.iter().map(|p| p.at_tokens).collect();
        Self::from_parts(at, recipe.packing.window_tokens() as u64, recipe.lanes)
    }

    /// From the phases' `at_tokens` (in the whole stream), the window size and the lanes.
    pub fn from_parts(at_tokens: Vec<u64>, window_tokens: u64, lanes: Option<LanesSpec>) -> Self {
        let points = match lanes {
            None => vec![at_tokens],
            Some(spec) => (0..spec.count)
                .map(|lane| {
                    at_tokens
                        .iter()
                        .map(|&at| lane_tokens_before(&spec, window_tokens, lane, at))
                        .collect()
                })
                .collect(),
        };
        PhasePoints {
            window_tokens,
            lanes,
            points,
        }
    }

    /// Phases in all, the `[[source]]` weights' included.
    pub fn num_phases(&self) -> usize {
        self.points[0].len() + 1
    }

    /// Lanes (1 without `[lanes]`).
    pub fn num_lanes(&self) -> usize {
        self.points.len()
    }

    /// Lane `lane`'s points: from which of its own tokens on each phase after the first holds
    /// (what its mixer is given).
    pub fn lane(&self, lane: u32) -> &[u64] {
        &self.points[lane as usize]
    }

    /// The phase of a document that starts `start_tokens` into lane `lane`'s own stream.
    pub fn phase_at(&self, lane: u32, start_tokens: u64) -> usize {
        self.points[lane as usize].partition_point(|&p| p <= start_tokens)
    }

    /// Window `window` of the stream: its lane and its index among the lane's own windows.
    pub fn window_lane(&self, window: u64) -> (u32, u64) {
        match &self.lanes {
            None => (0, window),
            Some(spec) => window_lane(spec, window),
        }
    }
}

/// Per source: tokens and document starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub tokens: Vec<u64>,
    pub documents: Vec<u64>,
}

impl Counts {
    pub fn new(sources: usize) -> Self {
        Counts {
            tokens: vec![0; sources],
            documents: vec![0; sources],
        }
    }

    pub fn total_tokens(&self) -> u64 {
        self.tokens.iter().sum()
    }

    pub fn total_documents(&self) -> u64 {
        self.documents.iter().sum()
    }
}

/// What a stream's windows hold, phase by phase. Its state is plain data (a pack checkpoint
/// carries it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseLedger {
    /// Per phase: tokens and document starts per source.
    pub phases: Vec<Counts>,
    /// Per phase, per lane: the token of the stream where the lane's first document of the phase
    /// starts (none yet).
    pub began: Vec<Vec<Option<u64>>>,
    /// Per lane: the phase of its last document started.
    lane_phase: Vec<usize>,
}

impl PhaseLedger {
    pub fn new(points: &PhasePoints, sources: usize) -> Self {
        let lanes = points.num_lanes();
        PhaseLedger {
            phases: vec![Counts::new(sources); points.num_phases()],
            began: vec![vec![None; lanes]; points.num_phases()],
            lane_phase: vec![0; lanes],
        }
    }

    /// Count window `window` of the stream: `len` tokens, its document starts and their sources,
    /// and the source of its first token.
    pub fn add_window(
        &mut self,
        points: &PhasePoints,
        window: u64,
        len: u64,
        doc_starts: &[u32],
        doc_sources: &[u16],
        lead_source: u16,
    ) {
        self.add_window_at(
            points,
            window,
            len,
            doc_starts,
            doc_sources,
            lead_source,
            &[],
        );
    }

    /// [`Self::add_window`] of a window that says where each of its starts was mixed
    /// (`positions`, one per start, in its lane's own stream: `best_fit`); empty: where it lies
    /// in the windows (`concat`). A start without a position (a list too short) takes its place.
    #[allow(clippy::too_many_arguments)] // one window's columns, each its own
    pub fn add_window_at(
        &mut self,
        points: &PhasePoints,
        window: u64,
        len: u64,
        doc_starts: &[u32],
        doc_sources: &[u16],
        lead_source: u16,
        positions: &[u64],
    ) {
        let (lane, lane_window) = points.window_lane(window);
        let l = lane as usize;
        let at = window * points.window_tokens;
        let lane_at = lane_window * points.window_tokens;
        let first = doc_starts.first().map_or(len, |&s| u64::from(s));
        self.count(self.lane_phase[l], lead_source, first, false);
        for (k, (&start, &source)) in doc_starts.iter().zip(doc_sources).enumerate() {
            let start = u64::from(start);
            let end = doc_starts.get(k + 1).map_or(len, |&s| u64::from(s));
            let mixed = positions.get(k).copied().unwrap_or(lane_at + start);
            let phase = points.phase_at(lane, mixed);
            self.lane_phase[l] = phase;
            self.began[phase][l].get_or_insert(at + start);
            self.count(phase, source, end - start, true);
        }
    }

    fn count(&mut self, phase: usize, source: u16, tokens: u64, starts: bool) {
        let counts = &mut self.phases[phase];
        let source = usize::from(source);
        if source < counts.tokens.len() {
            counts.tokens[source] += tokens;
            counts.documents[source] += u64::from(starts);
        }
    }

    /// Phase `phase`'s first document in the stream, and with lanes the last lane's (`None`
    /// until every lane has begun it).
    pub fn began(&self, phase: usize) -> (Option<u64>, Option<u64>) {
        let lanes = &self.began[phase];
        let first = lanes.iter().flatten().min().copied();
        let last = match lanes.iter().all(Option::is_some) {
            true => lanes.iter().flatten().max().copied(),
            false => None,
        };
        (first, last)
    }

    /// Every phase's counts together.
    pub fn whole(&self) -> Counts {
        let mut whole = Counts::new(self.phases[0].tokens.len());
        for counts in &self.phases {
            for (i, (t, d)) in counts.tokens.iter().zip(&counts.documents).enumerate() {
                whole.tokens[i] += t;
                whole.documents[i] += d;
            }
        }
        whole
    }
}

/// One source's line of a phase's ledger.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShareLine {
    /// Its share in the recipe's unit (0 when it takes no part in the phase).
    pub target: f64,
    /// Its share of the phase's tokens and of its document starts.
    pub token_share: f64,
    pub document_share: f64,
    /// The realized share in the recipe's unit minus the target.
    pub deviation: f64,
}

/// Per source, its line of the ledger of `counts` against `targets` (shares in `unit`).
pub fn share_lines(counts: &Counts, targets: &[f64], unit: MixUnit) -> Vec<ShareLine> {
    let (tokens, documents) = (counts.total_tokens(), counts.total_documents());
    targets
        .iter()
        .enumerate()
        .map(|(i, &target)| {
            let token_share = crate::mixer::share(counts.tokens[i], tokens);
            let document_share = crate::mixer::share(counts.documents[i], documents);
            let realized = match unit {
                MixUnit::Tokens => token_share,
                MixUnit::Documents => document_share,
            };
            ShareLine {
                target,
                token_share,
                document_share,
                deviation: realized - target,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without lanes a document's phase is the last point at or below its start; windows are
    /// counted segment by segment, the lead in the phase of the document it continues.
    #[test]
    fn documents_count_in_the_phase_of_their_start() {
        let points = PhasePoints::from_parts(vec![10], 8, None);
        assert_eq!((points.phase_at(0, 9), points.phase_at(0, 10)), (0, 1));
        let mut ledger = PhaseLedger::new(&points, 2);
        // Window 0: source 0 from 0, source 1 from 5. Window 1 (tokens 8..16): source 1
        // continues to 11 (it started at 5, phase 0), then source 0 from 11 (phase 1).
        ledger.add_window(&points, 0, 8, &[0, 5], &[0, 1], 0);
        ledger.add_window(&points, 1, 8, &[3], &[0], 1);
        assert_eq!(ledger.phases[0].tokens, vec![5, 6]);
        assert_eq!(ledger.phases[0].documents, vec![1, 1]);
        assert_eq!(ledger.phases[1].tokens, vec![5, 0]);
        assert_eq!(ledger.phases[1].documents, vec![1, 0]);
        assert_eq!(ledger.began(1), (Some(11), Some(11)));
        assert_eq!(ledger.whole().tokens, vec![10, 6]);
        let lines = share_lines(&ledger.phases[0], &[0.5, 0.5], MixUnit::Tokens);
        assert_eq!(lines[1].token_share, 6.0 / 11.0);
        assert_eq!(lines[1].deviation, 6.0 / 11.0 - 0.5);
    }

    /// A `best_fit` window counts each start in the phase of its mixing position, not of where
    /// it landed: a document mixed at 12 (phase 1) packed into window 0 is phase 1's, one mixed
    /// at 3 packed after it phase 0's.
    #[test]
    fn reordered_documents_count_in_the_phase_they_were_mixed_in() {
        let points = PhasePoints::from_parts(vec![10], 8, None);
        let mut ledger = PhaseLedger::new(&points, 2);
        ledger.add_window_at(&points, 0, 7, &[0, 4], &[1, 0], 1, &[12, 3]);
        ledger.add_window_at(&points, 1, 6, &[0], &[0], 0, &[7]);
        assert_eq!(ledger.phases[0].documents, vec![2, 0]);
        assert_eq!(ledger.phases[0].tokens, vec![9, 0]);
        assert_eq!(ledger.phases[1].documents, vec![0, 1]);
        assert_eq!(ledger.phases[1].tokens, vec![0, 4]);
        // Where the phase's first document landed in the stream.
        assert_eq!(ledger.began(1), (Some(0), Some(0)));
    }

    /// With 2 lanes of blocks of 1 window of 4 tokens, the point 6 is lane 1's token 2 and lane
    /// 0's token 4 (its second window starts at the stream's token 8).
    #[test]
    fn each_lane_switches_at_its_own_share_of_the_point() {
        let spec = LanesSpec {
            count: 2,
            block_windows: 1,
        };
        let points = PhasePoints::from_parts(vec![6], 4, Some(spec));
        assert_eq!((points.lane(0), points.lane(1)), (&[4][..], &[2][..]));
        let mut ledger = PhaseLedger::new(&points, 1);
        for w in 0..4 {
            // Every window starts one document at 0 and one at 2.
            ledger.add_window(&points, w, 4, &[0, 2], &[0, 0], 0);
        }
        // Lane 1's window 0 (stream 4..8): its start at 2 is stream token 6, phase 1.
        // Lane 0's window 1 (stream 8..12): its start at 0 is its own token 4, phase 1.
        assert_eq!(ledger.began(1), (Some(6), Some(8)));
        assert_eq!(ledger.phases[0].tokens, vec![6]);
        assert_eq!(ledger.phases[1].tokens, vec![10]);
    }
}
