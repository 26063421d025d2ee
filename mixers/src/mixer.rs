//! The mixer: interleaves sources by weight, one document at a time, with the semantics of HF
//! `interleave_datasets(probabilities=…, stopping_strategy=…)` for iterable datasets.
//!
//! Each step draws a source with probability `weight / Σ weights` (sources of weight 0 take no
//! part and are never read) and emits that source's next document. Like HF, the mixer holds one
//! document of look-ahead per source, so it knows a source is exhausted as soon as its last
//! document has been emitted:
//! - `first_exhausted`: the stream ends right after the last document of the first source to
//!   run out. Later draws never happen.
//! - `all_exhausted`: a source that runs out is restarted at once from its first document, in
//!   the same shard order (its next *pass*), and keeps being drawn with its weight; the stream
//!   ends right after the moment every source has emitted its last document at least once.
//!   Sources that ran out early are therefore oversampled, as in HF.

use crate::doc::{Doc, DocPos, DocSource, SourceError};
use crate::recipe::Stopping;
use crate::rng::StageRng;

#[derive(Debug, thiserror::Error)]
pub enum MixError {
    #[error("source {name:?}: {error}")]
    Source { name: String, error: SourceError },
    #[error("source {name:?} has no documents (every row was empty or filtered out)")]
    EmptySource { name: String },
    #[error("cannot restore the stream: {0}")]
    Restore(String),
}

/// The mixer's state besides its sources' cursors: its documents of look-ahead are kept as
/// references (re-read on restore), not text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MixerState {
    pub rng_word_pos: u64,
    pub peeked: Vec<Option<DocPos>>,
    pub exhausted: Vec<bool>,
    pub emitted: Vec<u64>,
    pub started: bool,
    pub done: bool,
}

/// One source as the mixer sees it.
pub struct MixInput<S> {
    pub name: String,
    pub weight: f64,
    pub source: S,
}

pub struct Mixer<S: DocSource> {
    inputs: Vec<MixInput<S>>,
    /// `cumulative[i]` = Σ_{j ≤ i} p_j over all inputs (0-weight inputs add nothing).
    cumulative: Vec<f64>,
    stopping: Stopping,
    rng: StageRng,
    peeked: Vec<Option<Doc>>,
    exhausted: Vec<bool>,
    /// Documents emitted per input.
    emitted: Vec<u64>,
    started: bool,
    done: bool,
}

impl<S: DocSource> Mixer<S> {
    pub fn new(inputs: Vec<MixInput<S>>, stopping: Stopping, seed: u64) -> Self {
        let total: f64 = inputs.iter().map(|i| i.weight).sum();
        let mut running = 0.0;
        let cumulative = inputs
            .iter()
            .map(|i| {
                running += i.weight / total;
                running
            })
            .collect();
        let n = inputs.len();
        Self {
            inputs,
            cumulative,
            stopping,
            rng: StageRng::new(seed, "mix"),
            peeked: vec![None; n],
            exhausted: vec![false; n],
            emitted: vec![0; n],
            started: false,
            done: false,
        }
    }

    fn is_active(&self, i: usize) -> bool {
        self.inputs[i].weight > 0.0
    }

    fn read(&mut self, i: usize) -> Result<Option<Doc>, MixError> {
        let input = &mut self.inputs[i];
        input.source.next_doc().map_err(|error| MixError::Source {
            name: input.name.clone(),
            error,
        })
    }

    fn start(&mut self) -> Result<(), MixError> {
        for i in 0..self.inputs.len() {
            if self.is_active(i) {
                self.peeked[i] = self.read(i)?;
                if self.peeked[i].is_none() {
                    return Err(MixError::EmptySource {
                        name: self.inputs[i].name.clone(),
                    });
                }
            }
        }
        self.started = true;
        Ok(())
    }

    fn draw(&mut self) -> usize {
        let u = self.rng.unit_f64();
        let last_active = (0..self.inputs.len())
            .rev()
            .find(|&i| self.is_active(i))
            .unwrap_or(0);
        // Rounding can leave the last cumulative value a hair under 1.0: fall back to the last
        // active input, never to a 0-weight one.
        (0..self.inputs.len())
            .find(|&i| self.is_active(i) && u < self.cumulative[i])
            .unwrap_or(last_active)
    }

    /// The next document of the mixed stream, or `None` once it has ended.
    pub fn next_doc(&mut self) -> Result<Option<Doc>, MixError> {
        if self.done {
            return Ok(None);
        }
        if !self.started {
            self.start()?;
        }
        let i = self.draw();
        let doc = self.peeked[i]
            .take()
            .expect("an active input always holds its next document");
        self.emitted[i] += 1;
        self.peeked[i] = self.read(i)?;
        if self.peeked[i].is_none() {
            self.exhausted[i] = true;
            let all = (0..self.inputs.len()).all(|j| !self.is_active(j) || self.exhausted[j]);
            match self.stopping {
                Stopping::FirstExhausted => self.done = true,
                Stopping::AllExhausted if all => self.done = true,
                Stopping::AllExhausted => {
                    let input = &mut self.inputs[i];
                    input.source.restart().map_err(|error| MixError::Source {
                        name: input.name.clone(),
                        error,
                    })?;
                    self.peeked[i] = self.read(i)?;
                    if self.peeked[i].is_none() {
                        return Err(MixError::EmptySource {
                            name: self.inputs[i].name.clone(),
                        });
                    }
                }
            }
        }
        Ok(Some(doc))
    }

    /// Documents emitted so far, per input, in recipe order.
    pub fn emitted(&self) -> &[u64] {
        &self.emitted
    }

    pub fn inputs(&self) -> &[MixInput<S>] {
        &self.inputs
    }

    pub fn inputs_mut(&mut self) -> &mut [MixInput<S>] {
        &mut self.inputs
    }

    pub fn state(&self) -> MixerState {
        MixerState {
            rng_word_pos: u64::try_from(self.rng.word_pos())
                .expect("2^64 random words are never drawn"),
            peeked: self
                .peeked
                .iter()
                .map(|d| d.as_ref().map(|d| d.pos))
                .collect(),
            exhausted: self.exhausted.clone(),
            emitted: self.emitted.clone(),
            started: self.started,
            done: self.done,
        }
    }

    /// Take `state` over, with the look-ahead documents it refers to (already re-read, in input
    /// order). The sources must already be at their cursors.
    pub fn restore(&mut self, state: &MixerState, peeked: Vec<Option<Doc>>) {
        let n = self.inputs.len();
        assert!(
            state.peeked.len() == n
                && peeked.len() == n
                && state.exhausted.len() == n
                && state.emitted.len() == n,
            "a mixer state for {n} inputs"
        );
        self.rng.set_word_pos(u128::from(state.rng_word_pos));
        self.peeked = peeked;
        self.exhausted = state.exhausted.clone();
        self.emitted = state.emitted.clone();
        self.started = state.started;
        self.done = state.done;
    }
}

#[cfg(test)]
mod tests;
