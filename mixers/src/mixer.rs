//! The mixer: interleaves sources by weight, one document at a time. `[mix] unit` says what a
//! weight is a share of.
//!
//! **Documents** (the default): the semantics of HF `interleave_datasets(probabilities=…,
//! stopping_strategy=…)` for iterable datasets. Each step draws a source with probability
//! `weight / Σ weights` (sources of weight 0 take no part and are never read) and emits that
//! source's next document.
//!
//! **Tokens**: weights are shares of the tokens emitted (BOS/EOS included). Each source is
//! shuffled in its own buffer (the recipe's `buffer_size` split evenly between the sources that
//! take part; one made smaller at a change of course, `crate::lineage::transplant`, lets its
//! extra residents out first, reading nothing meanwhile). The documents leaving a source's
//! buffer are tokenized ahead, in batches, by the source ([`DocSource::tokenize_ahead`]: the
//! driver's pool of threads), a batch beyond the one being emitted: so only documents about to
//! be emitted are tokenized, not the buffers' residents (at a `first_exhausted` end, at most two
//! batches per source are thrown away). The next document comes from the source furthest below
//! its share so far, `argmax p_i·T − t_i` (`T` tokens emitted, `t_i` of them from source `i`;
//! ties go to the source listed first): no random draw, so at every point of the stream each
//! source's realized token count is within about one of its documents of `p_i·T`. A global
//! buffer after this mixer would undo that (it samples documents, not tokens), so there is none.
//!
//! The pieces of a row cut by `oversize = "split"` (`crate::split`) never enter a shuffle buffer:
//! each is the source's next document the moment its source hands it over, so a row's pieces
//! leave their source in order, one after the other, and the mix puts other sources' documents
//! between them as between any documents (in tokens, that is what keeps a long document from
//! taking a span of the stream to itself).
//!
//! Both units hold one document of look-ahead per source, so the mixer knows a source is
//! exhausted as soon as its last document has been emitted:
//! - `first_exhausted`: the stream ends right after the last document of the first source to
//!   run out. Later draws never happen.
//! - `all_exhausted`: a source that runs out is restarted at once from its first document, in
//!   the same shard order (its next *pass*), and keeps being drawn with its weight; the stream
//!   ends right after the moment every source has emitted its last document at least once.
//!   Sources that ran out early are therefore oversampled, as in HF.

use crate::doc::{Doc, DocPos, DocSource, SourceError};
use crate::recipe::{MixUnit, Stopping};
use crate::rng::StageRng;
use crate::shuffle::Shuffler;
use std::collections::VecDeque;

/// A mix in tokens: batches of documents out of a source's buffer and tokenizing, at most (the
/// one being emitted and the next), each up to [`AHEAD_DOCS`] documents or [`AHEAD_TEXT_BYTES`]
/// of text.
pub const AHEAD_BATCHES: usize = 2;
pub const AHEAD_DOCS: usize = 64;
pub const AHEAD_TEXT_BYTES: usize = 256 << 10;

#[derive(Debug, thiserror::Error)]
pub enum MixError {
    #[error("source {name:?}: {error}")]
    Source { name: String, error: SourceError },
    #[error("source {name:?} has no documents (every row was empty or filtered out)")]
    EmptySource { name: String },
    #[error("cannot restore the stream: {0}")]
    Restore(String),
    #[error(
        "source {name:?}: a mix in tokens needs sources that tokenize ahead (internal error: \
         {error})"
    )]
    Untokenized { name: String, error: SourceError },
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
    /// Tokens unit: tokens emitted per input (BOS/EOS included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub emitted_tokens: Vec<u64>,
    /// Tokens unit: each input's shuffle buffer. The documents it holds are listed after the
    /// global buffer's in the stream state's `buffered`, input by input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shuffles: Vec<SourceShuffleState>,
    /// Tokens unit with phases: the phases entered (0: the `[[source]]` weights), and the tokens
    /// per input when the current one began.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub phase: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_start: Vec<u64>,
    /// Tokens unit, a mix whose phases carry their deficits (`[mix.adaptive]`): per input, the
    /// tokens it was owed (target minus realized, rounded) when the current phase began; empty
    /// when none is owed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owed: Vec<i64>,
    /// Tokens unit: the tokens the stream emitted before it mixed in tokens (a change of course
    /// from a mix in documents, which counts none per input; `crate::lineage::transplant`).
    /// Phases count the stream's tokens from its start, these included.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub earlier_tokens: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One input's shuffle buffer in a mix in tokens, besides the documents it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceShuffleState {
    pub rng_word_pos: u64,
    /// Documents held (residents, or while draining the ones still to emit).
    pub held: u64,
    /// Whether the input's pass has been read to its end and the buffer is draining.
    pub draining: bool,
    /// Documents out of the buffer, to emit after the look-ahead one, in order (they follow the
    /// held ones in the stream state's positions), and whether the pass's end follows them.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub ready: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready_ends: bool,
    /// When two batches are out of the buffer ([`AHEAD_BATCHES`]): the documents the older one
    /// still has (the newer has the rest of `ready`). 0: one batch, or none. With it a restored
    /// mixer takes the next batch out when an uninterrupted one would, so the state at every
    /// document (what a change of course moves: `crate::lineage::transplant`) is the same
    /// whatever the stream was resumed from. A state without it (written before it) restores
    /// `ready` as one batch: the same documents, the next batch taken out earlier.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub ready_batch: u64,
}

// `SourceShuffleState::ready_batch` describes at most two batches.
const _: () = assert!(AHEAD_BATCHES == 2);

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// A source's share of the stream, `part / total` (0 for an empty stream): the ledger's one
/// formula (pack summary, manifest, `/metrics`).
/// Each weight's share of their sum (0 for all when the sum is 0): a mix's target shares, the one
/// place they are computed.
pub fn target_shares(weights: &[f64]) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    weights
        .iter()
        .map(|w| if total > 0.0 { w / total } else { 0.0 })
        .collect()
}

pub fn share(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 / total as f64
    }
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
    unit: MixUnit,
    /// Whether each input is read at all: weight > 0 in some phase.
    opened: Vec<bool>,
    /// Tokens unit: each input's share `p_i`, and its own shuffle buffer (empty otherwise).
    shares: Vec<f64>,
    shuffles: Vec<SourceShuffle>,
    /// Tokens unit: tokens emitted per input.
    emitted_tokens: Vec<u64>,
    /// Tokens unit: the later phases (from how many tokens on, each input's share), the phases
    /// entered so far (0: `shares`), and the tokens per input when the current one began.
    phases: Vec<(u64, Vec<f64>)>,
    phase: usize,
    phase_start: Vec<u64>,
    /// Tokens unit: whether a phase begins owing each input what the one before left unmet
    /// (`[mix.adaptive]`'s decisions: shares held over any span), and what it owes; else each
    /// phase counts from zero (`[[mix.phase]]`).
    carry: bool,
    owed: Vec<i64>,
    /// Tokens unit: the stream's tokens before it mixed in tokens
    /// ([`MixerState::earlier_tokens`]).
    earlier_tokens: u64,
}

/// An input's own shuffle buffer (tokens unit).
struct SourceShuffle {
    buffer: Shuffler<Doc>,
    /// After the pass's last document was read: the residents in their final order, to emit.
    draining: Option<VecDeque<Doc>>,
    /// Out of the buffer and given to the source to tokenize, in emission order (`None`: the
    /// pass's end). Their tokens are taken as each is emitted.
    ready: VecDeque<Option<Doc>>,
    /// How many of `ready`'s documents each batch given to the source still has, oldest first.
    batches: VecDeque<usize>,
}

/// A mix in tokens: hand `batch` (the next documents `input` emits, in order) to its source to
/// tokenize ahead. Nothing to do for an empty batch.
fn give_to_tokenize<S: DocSource>(
    input: &mut MixInput<S>,
    batch: Vec<(DocPos, String)>,
) -> Result<(), MixError> {
    if batch.is_empty() {
        return Ok(());
    }
    input
        .source
        .tokenize_ahead(batch)
        .map_err(|error| MixError::Untokenized {
            name: input.name.clone(),
            error,
        })
}

impl<S: DocSource> Mixer<S> {
    /// A mix in documents (HF `interleave_datasets`); the caller shuffles its output.
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
        let opened = inputs.iter().map(|i| i.weight > 0.0).collect();
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
            unit: MixUnit::Documents,
            opened,
            shares: Vec::new(),
            shuffles: Vec::new(),
            emitted_tokens: Vec::new(),
            phases: Vec::new(),
            phase: 0,
            phase_start: Vec::new(),
            carry: false,
            owed: Vec::new(),
            earlier_tokens: 0,
        }
    }

    /// A mix in tokens over sources that hand documents over tokenized, each source shuffled
    /// in its own buffer: `buffer_size` documents split evenly between the inputs that take
    /// part (0: no shuffle). `phases`: from how many tokens on which weights (one per input)
    /// hold, in increasing order; the inputs' weights hold before the first.
    pub fn by_tokens(
        inputs: Vec<MixInput<S>>,
        stopping: Stopping,
        seed: u64,
        buffer_size: usize,
        phases: Vec<(u64, Vec<f64>)>,
    ) -> Self {
        let mut mixer = Self::new(inputs, stopping, seed);
        let n = mixer.inputs.len();
        for (_, weights) in &phases {
            for (open, &w) in mixer.opened.iter_mut().zip(weights) {
                *open |= w > 0.0;
            }
        }
        let active = (0..n).filter(|&i| mixer.is_active(i)).count().max(1);
        let weights: Vec<f64> = mixer.inputs.iter().map(|i| i.weight).collect();
        mixer.unit = MixUnit::Tokens;
        mixer.shares = target_shares(&weights);
        mixer.phases = phases
            .into_iter()
            .map(|(at, weights)| (at, target_shares(&weights)))
            .collect();
        mixer.phase_start = vec![0; n];
        mixer.owed = vec![0; n];
        mixer.shuffles = (0..n)
            .map(|i| SourceShuffle {
                buffer: Shuffler::with_label(
                    if mixer.is_active(i) {
                        buffer_size.div_ceil(active)
                    } else {
                        0
                    },
                    seed,
                    &format!("shuffle/source{i}"),
                ),
                draining: None,
                ready: VecDeque::new(),
                batches: VecDeque::new(),
            })
            .collect();
        mixer.emitted_tokens = vec![0; n];
        mixer
    }

    /// Whether input `i` is read at all (weight > 0 in some phase).
    pub fn is_active(&self, i: usize) -> bool {
        self.opened[i]
    }

    /// Whether input `i` is drawn from now: weight > 0 (in the current phase).
    fn takes_part_now(&self, i: usize) -> bool {
        match self.unit {
            MixUnit::Documents => self.inputs[i].weight > 0.0,
            MixUnit::Tokens => self.current_shares()[i] > 0.0,
        }
    }

    /// Tokens unit: the shares of the phase in force.
    fn current_shares(&self) -> &[f64] {
        match self.phase {
            0 => &self.shares,
            k => &self.phases[k - 1].1,
        }
    }

    /// Tokens unit: enter every phase whose point the stream has reached.
    fn enter_phases(&mut self) {
        let total = self.total_tokens();
        while self
            .phases
            .get(self.phase)
            .is_some_and(|&(at, _)| total >= at)
        {
            if self.carry {
                self.owed = (0..self.inputs.len())
                    .map(|i| self.deficit(i).round() as i64)
                    .collect();
            }
            self.phase += 1;
            self.phase_start = self.emitted_tokens.clone();
        }
    }

    /// Tokens unit: a mix whose phases carry their deficits (`[mix.adaptive]`): a phase begins
    /// owing each input what the phases before left unmet, so the shares hold over any span of
    /// the stream, not only within each phase.
    pub fn carry_deficits(&mut self) {
        self.carry = true;
    }

    /// Tokens unit: how far input `i` is below its share since the phase began (plus what it
    /// was owed then), in tokens.
    fn deficit(&self, i: usize) -> f64 {
        let since = |i: usize| self.emitted_tokens[i] - self.phase_start[i];
        let total = (0..self.inputs.len()).map(since).sum::<u64>() as f64;
        let owed = self.owed.get(i).copied().unwrap_or(0) as f64;
        self.current_shares()[i] * total - since(i) as f64 + owed
    }

    /// The phase in force (0: the `[[source]]` weights).
    pub fn phase(&self) -> usize {
        self.phase
    }

    /// Tokens unit: the stream's tokens so far, the count phases switch at.
    pub fn total_tokens(&self) -> u64 {
        self.earlier_tokens + self.emitted_tokens.iter().sum::<u64>()
    }

    /// Tokens unit: one more phase after the last, `weights` (one per input) from `at` tokens on:
    /// exactly as if the mixer had been made with it (`[mix.adaptive]` decides them while the
    /// stream runs). `at` must not be below the last phase's; an input not read (weight 0 in
    /// every phase before) stays out.
    pub fn push_phase(&mut self, at: u64, weights: &[f64]) {
        debug_assert!(self.phases.last().is_none_or(|(last, _)| *last <= at));
        let weights: Vec<f64> = (weights.iter().enumerate())
            .map(|(i, &w)| if self.opened[i] { w } else { 0.0 })
            .collect();
        self.phases.push((at, target_shares(&weights)));
    }

    /// Input `i`'s next document, or `None` at the end of its pass. In a mix in tokens it comes
    /// out of the input's own shuffle buffer, its tokens asked for ahead (taken when emitted).
    fn read(&mut self, i: usize) -> Result<Option<Doc>, MixError> {
        if self.shuffles.is_empty() {
            let input = &mut self.inputs[i];
            return input.source.next_doc().map_err(|error| MixError::Source {
                name: input.name.clone(),
                error,
            });
        }
        self.read_ahead(i)?;
        let shuffle = &mut self.shuffles[i];
        let next = shuffle.ready.pop_front().flatten();
        if next.is_some()
            && let Some(left) = shuffle.batches.front_mut()
        {
            *left -= 1;
            if *left == 0 {
                shuffle.batches.pop_front();
            }
        }
        Ok(next)
    }

    /// Tokens unit: unless [`AHEAD_BATCHES`] batches (or the pass's end) are out of input `i`'s
    /// buffer already, take the next batch out and give the source the texts to tokenize.
    fn read_ahead(&mut self, i: usize) -> Result<(), MixError> {
        let (input, shuffle) = (&mut self.inputs[i], &mut self.shuffles[i]);
        let fail = |error| MixError::Source {
            name: input.name.clone(),
            error,
        };
        if shuffle.batches.len() >= AHEAD_BATCHES || matches!(shuffle.ready.back(), Some(None)) {
            return Ok(());
        }
        let mut docs = 0usize;
        let (mut batch, mut text_bytes) = (Vec::new(), 0usize);
        while docs < AHEAD_DOCS && text_bytes < AHEAD_TEXT_BYTES {
            let next = match &mut shuffle.draining {
                Some(rest) => rest.pop_front(),
                // A buffer made smaller at a change of course lets its extra residents out
                // first, reading nothing meanwhile.
                None if shuffle.buffer.len() > shuffle.buffer.capacity() => {
                    shuffle.buffer.shrink_one()
                }
                None => match input.source.next_doc().map_err(fail)? {
                    // A split row's pieces pass the buffer by, so they leave in order.
                    Some(doc) if doc.pos.is_piece() => Some(doc),
                    Some(doc) => match shuffle.buffer.push(doc) {
                        Some(out) => Some(out),
                        None => continue,
                    },
                    None => {
                        shuffle.draining = Some(shuffle.buffer.flush().into());
                        continue;
                    }
                },
            };
            let Some(mut doc) = next else {
                shuffle.ready.push_back(None);
                break;
            };
            if doc.tokens.is_none() {
                text_bytes += doc.text.len();
                batch.push((doc.pos, std::mem::take(&mut doc.text)));
            }
            shuffle.ready.push_back(Some(doc));
            docs += 1;
        }
        if docs > 0 {
            shuffle.batches.push_back(docs);
        }
        give_to_tokenize(input, batch)
    }

    fn start(&mut self) -> Result<(), MixError> {
        for i in 0..self.inputs.len() {
            if self.is_active(i) {
                self.peek_first(i)?;
            }
        }
        self.started = true;
        Ok(())
    }

    /// Read input `i`'s look-ahead document: the first of its pass, which it must have.
    fn peek_first(&mut self, i: usize) -> Result<(), MixError> {
        self.peeked[i] = self.read(i)?;
        if self.peeked[i].is_none() {
            return Err(MixError::EmptySource {
                name: self.inputs[i].name.clone(),
            });
        }
        Ok(())
    }

    /// Input `i`'s next pass (`all_exhausted`): its source restarted, its first document read.
    fn next_pass(&mut self, i: usize) -> Result<(), MixError> {
        let input = &mut self.inputs[i];
        input.source.restart().map_err(|error| MixError::Source {
            name: input.name.clone(),
            error,
        })?;
        self.peek_first(i)
    }

    fn draw(&mut self) -> usize {
        match self.unit {
            MixUnit::Documents => self.draw_by_probability(),
            MixUnit::Tokens => self.furthest_below_share(),
        }
    }

    /// Tokens unit: the input taking part in the current phase with the largest `p_i·T − t_i`
    /// (counted since the phase began), the first on ties.
    fn furthest_below_share(&mut self) -> usize {
        self.enter_phases();
        let shares = self.current_shares();
        let mut best: Option<(usize, f64)> = None;
        for i in (0..self.inputs.len()).filter(|&i| shares[i] > 0.0) {
            let deficit = self.deficit(i);
            if best.is_none_or(|(_, d)| deficit > d) {
                best = Some((i, deficit));
            }
        }
        best.map_or(0, |(i, _)| i)
    }

    fn draw_by_probability(&mut self) -> usize {
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
        let mut doc = self.peeked[i]
            .take()
            .expect("an active input always holds its next document");
        if self.unit == MixUnit::Tokens && doc.tokens.is_none() {
            let input = &mut self.inputs[i];
            let tokens = input
                .source
                .take_tokens()
                .map_err(|error| MixError::Source {
                    name: input.name.clone(),
                    error,
                })?;
            doc.tokens = Some(tokens);
        }
        self.emitted[i] += 1;
        if let Some(tokens) = self.emitted_tokens.get_mut(i) {
            *tokens += doc.tokens.as_ref().map_or(0, |t| t.len() as u64);
        }
        self.peeked[i] = self.read(i)?;
        if self.peeked[i].is_none() {
            self.exhausted[i] = true;
            let all = (0..self.inputs.len()).all(|j| !self.takes_part_now(j) || self.exhausted[j]);
            match self.stopping {
                Stopping::FirstExhausted => self.done = true,
                Stopping::AllExhausted if all => self.done = true,
                Stopping::AllExhausted => {
                    if let Some(shuffle) = self.shuffles.get_mut(i) {
                        shuffle.draining = None;
                        shuffle.ready.clear(); // only the pass's end was left in it
                        shuffle.batches.clear();
                    }
                    self.next_pass(i)?;
                }
            }
        }
        Ok(Some(doc))
    }

    /// The documents of look-ahead, taken out (the mixer is not drawn from again).
    pub fn take_peeked(&mut self) -> Vec<Option<Doc>> {
        std::mem::take(&mut self.peeked)
    }

    /// Documents emitted so far, per input, in recipe order.
    pub fn emitted(&self) -> &[u64] {
        &self.emitted
    }

    /// Tokens emitted so far per input (a mix in tokens; empty in documents).
    pub fn emitted_tokens(&self) -> &[u64] {
        &self.emitted_tokens
    }

    /// What the weights are shares of.
    pub fn unit(&self) -> MixUnit {
        self.unit
    }

    /// Tokens unit: the documents every input's own shuffle buffer holds, input by input (the
    /// residents slot by slot, or while draining the ones still to emit, in order), each
    /// input's followed by those out of its buffer, to emit after its look-ahead one.
    pub fn held_positions(&self) -> Vec<DocPos> {
        self.shuffles
            .iter()
            .flat_map(|s| {
                let held: Vec<DocPos> = match &s.draining {
                    Some(rest) => rest.iter().map(|d| d.pos).collect(),
                    None => s.buffer.residents().iter().map(|d| d.pos).collect(),
                };
                held.into_iter()
                    .chain(s.ready.iter().flatten().map(|d| d.pos))
            })
            .collect()
    }

    /// How many documents each input's own shuffle buffer holds, and those out of it (tokens
    /// unit).
    pub fn held_counts(state: &MixerState) -> impl Iterator<Item = usize> + '_ {
        state.shuffles.iter().map(|s| (s.held + s.ready) as usize)
    }

    /// The inputs back, unread: how a driver wraps its sources before mixing.
    pub fn into_inputs(self) -> Vec<MixInput<S>> {
        self.inputs
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
            emitted_tokens: self.emitted_tokens.clone(),
            shuffles: self
                .shuffles
                .iter()
                .map(|s| SourceShuffleState {
                    rng_word_pos: s.buffer.rng_word_pos(),
                    held: match &s.draining {
                        Some(rest) => rest.len(),
                        None => s.buffer.len(),
                    } as u64,
                    draining: s.draining.is_some(),
                    ready: s.ready.iter().flatten().count() as u64,
                    ready_ends: matches!(s.ready.back(), Some(None)),
                    ready_batch: match s.batches.len() {
                        2 => s.batches[0] as u64,
                        _ => 0,
                    },
                })
                .collect(),
            phase: self.phase,
            phase_start: self.phase_start.clone(),
            owed: match self.owed.iter().all(|&o| o == 0) {
                true => Vec::new(),
                false => self.owed.clone(),
            },
            earlier_tokens: self.earlier_tokens,
        }
    }

    /// Take `state` over, with the look-ahead documents it refers to and the documents its
    /// inputs' own shuffle buffers hold and those out of them (already re-read, in the order of
    /// [`Mixer::held_positions`]). The sources must already be at their cursors. In a mix in
    /// tokens, the look-ahead documents and those out of the buffers are given to their sources
    /// to tokenize again.
    pub fn restore(
        &mut self,
        state: &MixerState,
        peeked: Vec<Option<Doc>>,
        held: Vec<Doc>,
    ) -> Result<(), MixError> {
        let n = self.inputs.len();
        assert!(
            state.peeked.len() == n
                && peeked.len() == n
                && state.exhausted.len() == n
                && state.emitted.len() == n,
            "a mixer state for {n} inputs"
        );
        if state.shuffles.len() != self.shuffles.len()
            || state.emitted_tokens.len() != self.emitted_tokens.len()
            || state.phase_start.len() != self.phase_start.len()
        {
            return Err(MixError::Restore(format!(
                "the state is of a mix in {}, the recipe's in {}",
                if state.shuffles.is_empty() {
                    "documents"
                } else {
                    "tokens"
                },
                if self.shuffles.is_empty() {
                    "documents"
                } else {
                    "tokens"
                },
            )));
        }
        if state.phase > self.phases.len() {
            return Err(MixError::Restore(format!(
                "the state is in phase {}, the recipe has {} phases after the first",
                state.phase,
                self.phases.len()
            )));
        }
        let mut held = held.into_iter();
        for (shuffle, s) in self.shuffles.iter_mut().zip(&state.shuffles) {
            let docs: Vec<Doc> = held.by_ref().take(s.held as usize).collect();
            shuffle.ready = held.by_ref().take(s.ready as usize).map(Some).collect();
            shuffle.batches = match (s.ready as usize, s.ready_batch as usize) {
                (0, _) => VecDeque::new(),
                (n, older) if older > 0 && older < n => VecDeque::from([older, n - older]),
                (n, _) => VecDeque::from([n]),
            };
            if s.ready_ends {
                shuffle.ready.push_back(None);
            }
            if s.draining {
                shuffle.buffer.restore(s.rng_word_pos, Vec::new());
                shuffle.draining = Some(docs.into());
            } else {
                // More than its slots: it was made smaller at a change of course, and lets the
                // extra residents out first (`read_ahead`).
                shuffle.buffer.restore(s.rng_word_pos, docs);
                shuffle.draining = None;
            }
        }
        self.rng.set_word_pos(u128::from(state.rng_word_pos));
        self.peeked = peeked;
        // Their tokens, asked for again in emission order: the look-ahead document first.
        for (i, shuffle) in self.shuffles.iter_mut().enumerate() {
            let waiting = self.peeked[i]
                .iter_mut()
                .chain(shuffle.ready.iter_mut().flatten());
            let batch: Vec<(DocPos, String)> = waiting
                .filter(|d| d.tokens.is_none())
                .map(|d| (d.pos, std::mem::take(&mut d.text)))
                .collect();
            give_to_tokenize(&mut self.inputs[i], batch)?;
        }
        self.exhausted = state.exhausted.clone();
        self.emitted = state.emitted.clone();
        self.emitted_tokens = state.emitted_tokens.clone();
        self.phase_start = state.phase_start.clone();
        self.owed = match state.owed.len() {
            0 => vec![0; self.phase_start.len()],
            _ => state.owed.clone(),
        };
        self.phase = state.phase;
        self.earlier_tokens = state.earlier_tokens;
        self.started = state.started;
        self.done = state.done;
        // A source a change of course added, or one that ended the mix before the change made
        // it go on (its next pass): its next document, read now (a started mixer holds one for
        // every source it draws from).
        for i in 0..n {
            if self.started && !self.done && self.is_active(i) && self.peeked[i].is_none() {
                match self.exhausted[i] {
                    true => self.next_pass(i)?,
                    false => self.peek_first(i)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod token_tests;
