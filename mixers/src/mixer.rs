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

use crate::doc::{Doc, DocSource, SourceError};
use crate::recipe::Stopping;
use crate::rng::StageRng;

#[derive(Debug, thiserror::Error)]
pub enum MixError {
    #[error("source {name:?}: {error}")]
    Source { name: String, error: SourceError },
    #[error("source {name:?} has no documents (every row was empty or filtered out)")]
    EmptySource { name: String },
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
}

#[cfg(test)]
mod tests;
