//! The manifest's phase ledger (format 4, `phases`): every window the pack writes is counted,
//! each document in the phase of its mixing position (a `best_fit` window carries it), into a
//! [`PhaseLedger`] (`dsprep_mixers::ledger`, the same counting `inspect --mix` and the
//! daemon use), which becomes per phase and source the target, the realized shares of tokens and
//! of documents, and the deviation. Its counts travel in the pack's checkpoints, so a pack that
//! continues after a kill writes the same manifest.

use dsprep_client::format::{PhaseSourceStats, PhaseStats};
use dsprep_mixers::PackedWindow;
use dsprep_mixers::ledger::{PhaseLedger, PhasePoints, share_lines};
use dsprep_mixers::recipe::{MixUnit, Recipe};

/// A recipe's phases and what the windows written so far hold.
pub struct PackLedger {
    points: PhasePoints,
    counts: PhaseLedger,
    names: Vec<String>,
    /// Per phase, each source's target share.
    targets: Vec<Vec<f64>>,
    at_tokens: Vec<u64>,
    unit: MixUnit,
    lanes: bool,
}

impl PackLedger {
    pub fn new(recipe: &Recipe) -> Self {
        let points = PhasePoints::new(recipe);
        let counts = PhaseLedger::new(&points, recipe.sources.len());
        PackLedger {
            points,
            counts,
            names: recipe.sources.iter().map(|s| s.name.clone()).collect(),
            targets: recipe.phase_targets(),
            at_tokens: std::iter::once(0)
                .chain(recipe.mix.phases.iter().map(|p| p.at_tokens))
                .collect(),
            unit: recipe.mix.unit,
            lanes: recipe.lanes.is_some(),
        }
    }

    /// A ledger continuing from a checkpoint's counts; `None` when they are not this recipe's
    /// (another number of phases, lanes or sources).
    pub fn resume(recipe: &Recipe, counts: PhaseLedger) -> Option<Self> {
        let mut ledger = Self::new(recipe);
        let fits = counts.phases.len() == ledger.counts.phases.len()
            && counts.began.first().map(Vec::len) == ledger.counts.began.first().map(Vec::len)
            && counts
                .phases
                .iter()
                .all(|c| c.tokens.len() == ledger.names.len());
        fits.then(|| {
            ledger.counts = counts;
            ledger
        })
    }

    /// Count window `index` of the stream.
    pub fn add(&mut self, index: u64, window: &PackedWindow) {
        self.counts.add_window_at(
            &self.points,
            index,
            u64::from(window.real_tokens),
            &window.doc_starts,
            &window.doc_sources,
            window.lead_source,
            &window.doc_positions,
        );
    }

    /// The counts so far (what a checkpoint carries).
    pub fn counts(&self) -> &PhaseLedger {
        &self.counts
    }

    /// The manifest's `phases`.
    pub fn stats(&self) -> Vec<PhaseStats> {
        (self.counts.phases.iter().enumerate())
            .map(|(phase, counts)| {
                let lines = share_lines(counts, &self.targets[phase], self.unit);
                let (first, last) = self.counts.began(phase);
                PhaseStats {
                    phase: phase as u32,
                    at_tokens: self.at_tokens[phase],
                    began_at_tokens: first,
                    all_lanes_began_at_tokens: last.filter(|_| self.lanes && phase > 0),
                    tokens: counts.total_tokens(),
                    documents: counts.total_documents(),
                    sources: (self.names.iter().zip(lines).enumerate())
                        .map(|(i, (name, line))| PhaseSourceStats {
                            name: name.clone(),
                            target_fraction: line.target,
                            realized_token_fraction: line.token_share,
                            realized_fraction: line.document_share,
                            deviation: line.deviation,
                            tokens: counts.tokens[i],
                            documents: counts.documents[i],
                        })
                        .collect(),
                }
            })
            .collect()
    }
}
