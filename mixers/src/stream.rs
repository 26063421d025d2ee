//! The document stream: the mixer feeding the shuffle buffer, then the buffer's drain once the
//! mixer has ended. This is what the reader thread runs, and its [`StreamState`] is the part of a
//! checkpoint that says which documents come next: source cursors, the mixer's and the shuffler's
//! RNG positions, and every buffered document as a reference ([`DocPos`]), never as text. The
//! pieces of split rows pass the buffer by, so a buffered position is never a piece.

use crate::doc::{Doc, DocPos, DocSource, SourceCursor};
use crate::mixer::{MixError, Mixer, MixerState};
use crate::shuffle::Shuffler;
use std::collections::{HashMap, VecDeque};

/// Everything needed to continue a [`DocStream`] exactly, given the same recipe and inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamState {
    pub sources: Vec<SourceCursor>,
    pub mixer: MixerState,
    pub shuffle_rng_word_pos: u64,
    /// The shuffle buffer's residents slot by slot; while draining, the documents still to emit,
    /// in order. Then, in a mix in tokens, the documents each source's own buffer holds
    /// ([`crate::mixer::Mixer::held_positions`]; their counts are in the mixer's state).
    pub buffered: Vec<DocPos>,
    pub draining: bool,
    /// Documents the stream has emitted.
    pub emitted: u64,
}

pub struct DocStream<S: DocSource> {
    mixer: Mixer<S>,
    shuffler: Shuffler<Doc>,
    /// After the mixer's end: the residents in their final order, still to emit.
    draining: Option<VecDeque<Doc>>,
    emitted: u64,
    /// The cursors of sources the recipe never draws from, as restored: kept for the next
    /// change of course, which may draw from them again (they are not opened here).
    parked: Vec<Option<SourceCursor>>,
}

impl<S: DocSource> DocStream<S> {
    pub fn new(mixer: Mixer<S>, shuffler: Shuffler<Doc>) -> Self {
        Self {
            mixer,
            shuffler,
            draining: None,
            emitted: 0,
            parked: Vec::new(),
        }
    }

    /// The next document of the mixed and shuffled stream, or `None` at its end.
    pub fn next_doc(&mut self) -> Result<Option<Doc>, MixError> {
        loop {
            if let Some(rest) = &mut self.draining {
                let doc = rest.pop_front();
                self.emitted += u64::from(doc.is_some());
                return Ok(doc);
            }
            // A buffer made smaller at a change of course lets its extra residents out first.
            if let Some(out) = self.shuffler.shrink_one() {
                self.emitted += 1;
                return Ok(Some(out));
            }
            match self.mixer.next_doc()? {
                // A split row's pieces pass the buffer by (see `crate::mixer`).
                Some(doc) if doc.pos.is_piece() => {
                    self.emitted += 1;
                    return Ok(Some(doc));
                }
                Some(doc) => {
                    if let Some(out) = self.shuffler.push(doc) {
                        self.emitted += 1;
                        return Ok(Some(out));
                    }
                }
                None => self.draining = Some(self.shuffler.flush().into()),
            }
        }
    }

    /// Documents held in the shuffle buffer (or still to drain from it).
    pub fn buffered(&self) -> usize {
        match &self.draining {
            Some(rest) => rest.len(),
            None => self.shuffler.len(),
        }
    }

    pub fn emitted(&self) -> u64 {
        self.emitted
    }

    pub fn mixer(&self) -> &Mixer<S> {
        &self.mixer
    }

    /// The mixer, to add a phase decided while the stream runs ([`Mixer::push_phase`]).
    pub fn mixer_mut(&mut self) -> &mut Mixer<S> {
        &mut self.mixer
    }

    pub fn state(&self) -> StreamState {
        let (mut buffered, draining): (Vec<DocPos>, bool) = match &self.draining {
            Some(rest) => (rest.iter().map(|d| d.pos).collect(), true),
            None => (
                self.shuffler.residents().iter().map(|d| d.pos).collect(),
                false,
            ),
        };
        buffered.extend(self.mixer.held_positions());
        StreamState {
            sources: (self.mixer.inputs().iter().enumerate())
                .map(|(k, i)| match self.parked.get(k) {
                    Some(Some(parked)) => *parked,
                    _ => i.source.cursor(),
                })
                .collect(),
            mixer: self.mixer.state(),
            shuffle_rng_word_pos: self.shuffler.rng_word_pos(),
            buffered,
            draining,
            emitted: self.emitted,
        }
    }

    /// Continue from `state`: move every source to its cursor, re-read the look-ahead and buffered
    /// documents by reference, and take the RNG positions over. Call on a stream built from the
    /// same recipe that has not been read yet.
    pub fn restore(&mut self, state: &StreamState) -> Result<(), MixError> {
        self.restore_from(state, HashMap::new())
    }

    /// The documents this stream holds in memory (its look-ahead and its shuffle buffer), by
    /// position, for [`DocStream::restore_from`] of the next recipe at a change of course: they
    /// are moved, not read again. None in a mix in tokens (their texts went to be tokenized).
    pub fn into_docs(self) -> HashMap<DocPos, Doc> {
        let DocStream {
            mut mixer,
            mut shuffler,
            draining,
            ..
        } = self;
        if !mixer.emitted_tokens().is_empty() {
            return HashMap::new();
        }
        (mixer.take_peeked().into_iter().flatten())
            .chain(shuffler.take_residents())
            .chain(draining.into_iter().flatten())
            .map(|doc| (doc.pos, doc))
            .collect()
    }

    /// [`DocStream::restore`], taking the documents `state` refers to from `known` where they
    /// are there (by position) and re-reading only the others.
    pub fn restore_from(
        &mut self,
        state: &StreamState,
        mut known: HashMap<DocPos, Doc>,
    ) -> Result<(), MixError> {
        let n = self.mixer.inputs().len();
        if state.sources.len() != n || state.mixer.peeked.len() != n {
            return Err(MixError::Restore(format!(
                "the state has {} sources, the recipe {n}",
                state.sources.len()
            )));
        }
        let held: usize = Mixer::<S>::held_counts(&state.mixer).sum();
        let Some(global) = state.buffered.len().checked_sub(held) else {
            return Err(MixError::Restore(format!(
                "the state lists {} buffered documents, its sources' buffers hold {held}",
                state.buffered.len()
            )));
        };
        // More than the buffer's slots: it was made smaller at a change of course, and lets the
        // extra residents out first (`Shuffler::shrink_one`).
        // Every referenced document, read source by source: look-ahead first, then the buffer.
        let wanted: Vec<DocPos> = state
            .mixer
            .peeked
            .iter()
            .flatten()
            .chain(&state.buffered)
            .copied()
            .collect();
        let mut read: Vec<Option<Doc>> = vec![None; wanted.len()];
        let active: Vec<bool> = (0..n).map(|i| self.mixer.is_active(i)).collect();
        for (i, input) in self.mixer.inputs_mut().iter_mut().enumerate() {
            let fail = |error| MixError::Source {
                name: input.name.clone(),
                error,
            };
            let (slots, positions): (Vec<usize>, Vec<DocPos>) = wanted
                .iter()
                .enumerate()
                .filter(|(_, p)| usize::from(p.source) == i)
                .map(|(k, p)| (k, *p))
                .unzip();
            // A source the recipe never draws from (one a change of course removed) is not
            // opened: it is neither listed nor read.
            if positions.is_empty() && !active[i] {
                self.parked.resize(n, None);
                self.parked[i] = Some(state.sources[i]);
                continue;
            }
            input.source.seek(&state.sources[i]).map_err(fail)?;
            let (mut slots_to_read, mut to_read) = (Vec::new(), Vec::new());
            for (slot, pos) in slots.into_iter().zip(positions) {
                match known.remove(&pos) {
                    Some(doc) => read[slot] = Some(doc),
                    None => {
                        slots_to_read.push(slot);
                        to_read.push(pos);
                    }
                }
            }
            if to_read.is_empty() {
                continue;
            }
            let docs = input
                .source
                .reread(&to_read)
                .map_err(|error| MixError::Source {
                    name: input.name.clone(),
                    error,
                })?;
            for (slot, doc) in slots_to_read.into_iter().zip(docs) {
                read[slot] = Some(doc);
            }
        }
        let mut docs = wanted.into_iter().zip(read).map(|(pos, doc)| {
            doc.ok_or_else(|| {
                MixError::Restore(format!(
                    "the state refers to source {} which the recipe does not have",
                    pos.source
                ))
            })
        });
        let mut peeked = Vec::with_capacity(n);
        for p in &state.mixer.peeked {
            peeked.push(match p {
                Some(_) => Some(docs.next().expect("one document per reference")?),
                None => None,
            });
        }
        let buffered = docs
            .by_ref()
            .take(global)
            .collect::<Result<Vec<Doc>, MixError>>()?;
        let held = docs.collect::<Result<Vec<Doc>, MixError>>()?;
        self.mixer.restore(&state.mixer, peeked, held)?;
        if state.draining {
            self.shuffler
                .restore(state.shuffle_rng_word_pos, Vec::new());
            self.draining = Some(buffered.into());
        } else {
            self.shuffler.restore(state.shuffle_rng_word_pos, buffered);
        }
        self.emitted = state.emitted;
        Ok(())
    }
}

#[cfg(test)]
mod split_tests;
#[cfg(test)]
mod tests;
