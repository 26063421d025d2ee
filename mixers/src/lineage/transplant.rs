//! A change of course made to the pipeline's state ([`transplant()`]): the state at the document
//! where one recipe stops, made the next recipe's, in either `[mix] unit` and across a change of
//! unit. What it keeps and moves, exactly (so a replay of the lineage makes the same move):
//!
//! - **Cursors.** Every source keeps its cursor: what it read before the change is either emitted
//!   already or still held (below), so none of its documents comes twice or is skipped. A source
//!   the change adds gets a fresh cursor and starts at its beginning (the mixer reads its first
//!   document when restored). A source it stops drawing from keeps its cursor (for a later change
//!   that adds it back); one whose own buffer was draining (its pass read to the end) is counted
//!   as run out, so that such a change starts its next pass.
//! - **Dropped.** The documents of the sources the change stops drawing from that were drawn but
//!   not emitted (the mixer's look-ahead, the global buffer, a source's own buffer and the
//!   documents out of it) leave, counted per source ([`Transplant::dropped`]).
//! - **Documents → documents**: the global buffer keeps its residents in their slots.
//! - **Documents → tokens**: the global buffer's documents go to their sources' own buffers as
//!   residents, each source's in the order they stood in the global buffer (slot by slot, or the
//!   drain's order). Each source's buffer starts its random stream there. The stream's tokens so
//!   far (the packer's position: a mix in documents counts none per source) are the mixer's
//!   [`MixerState::earlier_tokens`], so phases count from the stream's start.
//! - **Tokens → documents**: the sources' buffers are merged into the global buffer source by
//!   source in index order, each source's residents (slot by slot, or its drain in order) then
//!   the documents already out of its buffer (in emission order): the order the state lists them.
//! - **Tokens → tokens**: each source's buffer keeps its residents, its drain and the documents
//!   out of it as they were.
//! - **A smaller buffer** (its size, or in tokens its share of it: `buffer_size` split between
//!   the sources that take part, which adding or removing one changes too) keeps its documents
//!   and lets its extra residents out first, one uniformly drawn resident at a time, reading
//!   nothing, until it holds no more than its slots (`Shuffler::shrink_one`); a larger one fills
//!   up from its source's next documents.
//! - **In tokens**, the new shares count from the change, as when a phase begins, in the phase of
//!   the new recipe that the stream's tokens have reached.
//! - **After the mix ended** (`first_exhausted` out, or every source out once), the stream goes on
//!   if the new recipe stops at `all_exhausted`: the drain becomes the buffers' residents again,
//!   and the source whose run-out ended the mix starts its next pass.
//! - **The packer's state** is kept whole: what it holds was emitted already (made the next
//!   packing's by [`crate::packer::transplant_packer`]).

use crate::checkpoint::PipelineState;
use crate::doc::DocPos;
use crate::mixer::{MixerState, SourceShuffleState};
use crate::packer::PackerState;
use crate::recipe::{MixUnit, Recipe, Stopping};
use crate::stream::StreamState;

/// What a change did to the pipeline's state: per source index, the documents dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transplant {
    pub dropped: Vec<(u16, u64)>,
}

/// A source's own buffer in a mix in tokens: its state, its residents (or drain) and the
/// documents out of it, by position.
#[derive(Clone, Debug, Default)]
struct OwnBuffer {
    state: SourceShuffleState,
    held: Vec<DocPos>,
    ready: Vec<DocPos>,
}

/// The pipeline's state at a change, made the next segment's (`next`: its effective recipe, see
/// [`crate::lineage::Lineage::effective_recipe`]), by the rules of this module's doc.
pub fn transplant(
    mut state: PipelineState,
    next: &Recipe,
) -> Result<(PipelineState, Transplant), String> {
    let n = next.sources.len();
    let mut active = vec![false; n];
    for (i, _) in next.active_sources() {
        active[i] = true;
    }
    let position = position_tokens(&state.packer, next.packing.window_tokens() as u64);
    let stream = &mut state.stream;
    if stream.sources.len() > n || stream.mixer.peeked.len() > n {
        return Err(format!(
            "the state has {} sources, the lineage {n}",
            stream.sources.len()
        ));
    }
    if stream.draining || stream.mixer.done {
        // The mix had ended (every source out at least once, or one out under
        // `first_exhausted`): it goes on under the next recipe if that recipe says every source
        // runs out at least once; the documents still to drain are the buffers' again.
        if next.mix.stopping == Stopping::FirstExhausted {
            return Err(
                "the stream's mix had ended there and the new recipe stops at the first source \
                 that runs out: nothing would come; set [mix] stopping = \"all_exhausted\" to go \
                 on"
                .into(),
            );
        }
        stream.draining = false;
        stream.mixer.done = false;
    }
    let was_in_tokens = !stream.mixer.emitted_tokens.is_empty();
    let (mut global, mut own) = split_buffered(stream)?;
    own.resize(n, OwnBuffer::default());
    stream.sources.resize(n, Default::default());
    let mixer = &mut stream.mixer;
    mixer.peeked.resize(n, None);
    mixer.exhausted.resize(n, false);
    mixer.emitted.resize(n, 0);

    let mut dropped = vec![0u64; n];
    let mut keep_active = |positions: &mut Vec<DocPos>| {
        positions.retain(|p| {
            let i = usize::from(p.source);
            let keep = active.get(i).copied().unwrap_or(false);
            if let Some(count) = dropped.get_mut(i).filter(|_| !keep) {
                *count += 1;
            }
            keep
        })
    };
    keep_active(&mut global);
    for (i, buffer) in own.iter_mut().enumerate() {
        keep_active(&mut buffer.held);
        keep_active(&mut buffer.ready);
        if !active[i] {
            // Its pass read to the end: a later change that adds it back starts the next one.
            mixer.exhausted[i] |= buffer.state.draining;
            buffer.state = SourceShuffleState {
                rng_word_pos: buffer.state.rng_word_pos,
                ..SourceShuffleState::default()
            };
        }
    }
    for (i, peek) in mixer.peeked.iter_mut().enumerate() {
        if !active[i] && peek.take().is_some() {
            dropped[i] += 1;
        }
    }

    match next.mix.unit {
        MixUnit::Documents => {
            global.extend(
                own.drain(..)
                    .flat_map(|b| b.held.into_iter().chain(b.ready)),
            );
            into_documents(mixer);
        }
        MixUnit::Tokens => {
            if !was_in_tokens {
                for p in global.drain(..) {
                    own[usize::from(p.source)].held.push(p);
                }
                mixer.earlier_tokens = position;
                mixer.emitted_tokens = vec![0; n];
            }
            mixer.emitted_tokens.resize(n, 0);
            for (i, buffer) in own.iter_mut().enumerate() {
                if mixer.peeked[i].is_none() && buffer.held.is_empty() && buffer.ready.is_empty() {
                    // The source whose run-out ended the mix (or one that is not drawn): its
                    // buffer starts afresh, as at the next pass of a source that runs out.
                    buffer.state = SourceShuffleState {
                        rng_word_pos: buffer.state.rng_word_pos,
                        ..SourceShuffleState::default()
                    };
                }
                buffer.state.held = buffer.held.len() as u64;
                buffer.state.ready = buffer.ready.len() as u64;
            }
            mixer.shuffles = own.iter().map(|b| b.state).collect();
            let tokens = mixer.earlier_tokens + mixer.emitted_tokens.iter().sum::<u64>();
            mixer.phase = (next.mix.phases.iter())
                .filter(|p| p.at_tokens <= tokens)
                .count();
            mixer.phase_start = mixer.emitted_tokens.clone();
            // The new recipe owes nothing: its shares count from the change.
            mixer.owed.clear();
            global.extend(
                own.drain(..)
                    .flat_map(|b| b.held.into_iter().chain(b.ready)),
            );
        }
    }
    stream.buffered = global;
    let dropped = (dropped.into_iter().enumerate())
        .filter(|&(_, d)| d > 0)
        .map(|(i, d)| (i as u16, d))
        .collect();
    Ok((state, Transplant { dropped }))
}

/// A mixer's state made a mix in documents': no per-source buffers, counts or phases.
fn into_documents(mixer: &mut MixerState) {
    mixer.emitted_tokens.clear();
    mixer.shuffles.clear();
    mixer.phase = 0;
    mixer.phase_start.clear();
    mixer.owed.clear();
    mixer.earlier_tokens = 0;
}

/// The stream's buffered positions, by buffer: the global buffer's, then (a mix in tokens) each
/// source's own, as [`StreamState::buffered`] lists them.
fn split_buffered(stream: &StreamState) -> Result<(Vec<DocPos>, Vec<OwnBuffer>), String> {
    let shuffles = &stream.mixer.shuffles;
    let held: u64 = shuffles.iter().map(|s| s.held + s.ready).sum();
    let global = (stream.buffered.len() as u64)
        .checked_sub(held)
        .ok_or_else(|| {
            format!(
                "the state lists {} buffered documents, its sources' buffers hold {held}",
                stream.buffered.len()
            )
        })? as usize;
    let mut rest = stream.buffered[global..].iter().copied();
    let own = (shuffles.iter())
        .map(|&state| OwnBuffer {
            state,
            held: rest.by_ref().take(state.held as usize).collect(),
            ready: rest.by_ref().take(state.ready as usize).collect(),
        })
        .collect();
    Ok((stream.buffered[..global].to_vec(), own))
}

/// Tokens the stream has pushed to its packer: where the next document starts in the stream (what
/// phases count), from the packer's state.
fn position_tokens(packer: &PackerState, window_tokens: u64) -> u64 {
    match &packer.pool {
        Some(pool) => pool.pushed_tokens,
        None => packer.windows_emitted * window_tokens + packer.pending.len() as u64,
    }
}
