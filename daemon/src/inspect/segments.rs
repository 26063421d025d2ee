//! `dsprep inspect --mix` of a packed lineage: each segment's span. A document belongs to the
//! segment whose recipe drew it, as the pack's ledger counts it (FORMAT.md `lineage`). Where
//! the windows keep the mixing order (`concat`) that is the segment in force where it starts:
//! each recipe's first document starts at or after its first window. A `best_fit` pool carries
//! the previous recipe's documents past that window, so there the document's mixing position
//! decides (`doc_positions.u64`, format 6): segment `k`'s first document was mixed after every
//! token of the segments before it (each segment's `tokens` in the manifest's ledger). A
//! `best_fit` pack without mixing positions (format 5), or a laned one (mixing positions count
//! in each lane's own stream), cannot be recounted from its windows: its segments are the
//! manifest's ledger.

use super::mix::Span;
use dsprep_client::Manifest;
use dsprep_mixers::ledger::{Counts, PhaseLedger, PhasePoints};

/// How a packed lineage's segments are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentCount {
    /// By where each document starts in the windows (`concat`: they keep the mixing order).
    Windows,
    /// By each start's mixing position (`best_fit` with `doc_positions.u64`, no lanes).
    Positions,
    /// As the manifest's ledger counted them while each recipe drew (`best_fit` otherwise).
    Ledger,
}

impl SegmentCount {
    /// A window's mixing positions as the segment ledger takes them (none: by window).
    pub fn positions(self, positions: &[u64]) -> &[u64] {
        match self {
            SegmentCount::Positions => positions,
            _ => &[],
        }
    }
}

/// Where each segment after the first begins (by window, or by mixing position), and how the
/// segments are counted; `None` for a pack of one recipe.
pub fn segment_points(m: &Manifest, lanes: bool) -> Option<(PhasePoints, SegmentCount)> {
    let segments = m.lineage.as_ref()?;
    let wt = u64::from(m.window_tokens);
    let ledgers = segments.iter().all(|s| !s.sources.is_empty());
    let count = match (&m.packing, &m.doc_positions) {
        (None, _) => SegmentCount::Windows,
        (Some(_), Some(_)) if !lanes && ledgers => SegmentCount::Positions,
        (Some(_), _) if ledgers => SegmentCount::Ledger,
        (Some(_), _) => SegmentCount::Windows,
    };
    let at = match count {
        SegmentCount::Positions => (segments.iter())
            .scan(0u64, |mixed, s| {
                *mixed += s.sources.iter().map(|x| x.tokens).sum::<u64>();
                Some(*mixed)
            })
            .take(segments.len().saturating_sub(1))
            .collect(),
        _ => (segments.iter().skip(1))
            .map(|s| s.from_window * wt)
            .collect(),
    };
    Some((PhasePoints::from_parts(at, wt, None), count))
}

/// A packed lineage's segments as spans: each recipe's targets and counts, from the window it
/// takes over at (by mixing position: from where its first document lies in the windows).
pub fn segment_spans(m: &Manifest, ledger: &PhaseLedger, count: SegmentCount) -> Vec<Span> {
    let segments = m.lineage.as_deref().unwrap_or_default();
    let wt = u64::from(m.window_tokens);
    let from = |k: usize| match (k, count) {
        (0, _) => 0,
        (_, SegmentCount::Positions) => ledger.began(k).0.unwrap_or(segments[k].from_window * wt),
        _ => segments[k].from_window * wt,
    };
    (segments.iter().enumerate())
        .map(|(k, s)| {
            let mine = |name: &str| s.sources.iter().find(|x| x.name == name);
            let counts = match count {
                SegmentCount::Ledger => Counts {
                    tokens: (m.sources.iter())
                        .map(|x| mine(&x.name).map_or(0, |x| x.tokens))
                        .collect(),
                    documents: (m.sources.iter())
                        .map(|x| mine(&x.name).map_or(0, |x| x.documents))
                        .collect(),
                },
                _ => ledger.phases[k].clone(),
            };
            Span {
                name: format!("segment {k} (from step {})", s.from_step),
                from: from(k),
                to: (k + 1 < segments.len()).then(|| from(k + 1)),
                all_lanes_from: None,
                targets: (m.sources.iter())
                    .map(|x| mine(&x.name).map_or(0.0, |x| x.target_fraction))
                    .collect(),
                counts,
                as_drawn: count == SegmentCount::Ledger,
            }
        })
        .collect()
}
