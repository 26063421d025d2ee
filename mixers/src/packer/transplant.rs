//! The packer's state at a change of course made the next recipe's packing's
//! ([`transplant_packer`]; `dsprep_mixers::lineage` makes the rest of the pipeline's state the
//! next recipe's). The window size never changes at a change; the rest of `[packing]` may:
//! - the same strategy: the state goes on whole. A `best_fit` pool made smaller holds more
//!   documents than its capacity: the packer takes no new document until it is below it
//!   (`best_fit.rs`). Another pad pads the windows made from the change on.
//! - `concat` → `best_fit`: every window below the change was made by `concat`; the tokens of
//!   the window it was filling (the end of the document that crossed the change, and any
//!   documents after it) enter the pool as documents of their own, each piece at the mixing
//!   position of its first token (its place in the `concat` stream), so that it starts a padded
//!   window like any other. A piece longer than a window (only after a `best_fit` → `concat`
//!   change that emitted no window yet) is cut into window-sized pieces.
//! - `best_fit` → `concat`: the documents the pool holds are concatenated in arrival order (their
//!   mixing order) and open the `concat` stream, before any new document; the whole windows they
//!   fill leave before the next document is taken (`concat.rs` `drain`), or at the stream's end.
//!
//! No token is lost or repeated: the tokens held before the change are the tokens held after it,
//! in windows to come.

use super::{PackerConfig, PackerState, PackingCounters, PoolState, PooledDoc};
use std::sync::Arc;

/// A packer's state made the next recipe's, and what of the old packer ended there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackerTransplant {
    pub state: PackerState,
    /// The counters of a `best_fit` packer a `concat` one follows (they go on whole from one
    /// `best_fit` packing to the next, and a `best_fit` one after `concat` counts from 0).
    pub ended: Option<PackingCounters>,
}

/// `state` (the packer's at a change) made the state of a packer built by `next` (see the
/// module's doc). The first window the next packer makes is `state.windows_emitted`.
pub fn transplant_packer(state: PackerState, next: &PackerConfig) -> PackerTransplant {
    match (state.pool.is_some(), next.best_fit.is_some()) {
        (true, true) | (false, false) => PackerTransplant { state, ended: None },
        (false, true) => PackerTransplant {
            state: concat_to_pool(state, next.window_tokens),
            ended: None,
        },
        (true, false) => {
            let ended = state.pool.as_ref().map(|p| p.counters);
            PackerTransplant {
                state: pool_to_concat(state),
                ended,
            }
        }
    }
}

/// A `concat` state's pending tokens as a `best_fit` pool: one document per piece between its
/// document starts (the first continuing the document that crossed the change), each cut into
/// pieces of at most a window.
fn concat_to_pool(state: PackerState, window_tokens: usize) -> PackerState {
    let window = window_tokens.max(1);
    let pending = &state.pending;
    // The mixing position of `pending[0]`: the concat stream's place of the change.
    let base = state.windows_emitted.saturating_mul(window as u64);
    let mut bounds: Vec<(usize, u16)> = Vec::with_capacity(state.pending_starts.len() + 1);
    if state.pending_starts.first() != Some(&0) && !pending.is_empty() {
        bounds.push((0, state.lead_source));
    }
    bounds.extend(
        (state.pending_starts.iter().zip(&state.pending_sources))
            .map(|(&s, &src)| (s as usize, src)),
    );
    let mut docs = Vec::new();
    for (k, &(start, source)) in bounds.iter().enumerate() {
        let end = bounds.get(k + 1).map_or(pending.len(), |b| b.0);
        let piece = &pending[start.min(end)..end];
        for (c, chunk) in piece.chunks(window).enumerate() {
            docs.push(PooledDoc {
                seq: base + (start + c * window) as u64,
                source,
                tokens: Arc::from(chunk),
            });
        }
    }
    let pushed_tokens = base + pending.len() as u64;
    let counters = PackingCounters {
        pool_peak_documents: docs.len() as u64,
        pool_peak_tokens: pending.len() as u64,
        ..PackingCounters::default()
    };
    PackerState {
        windows_emitted: state.windows_emitted,
        pool: Some(PoolState {
            docs,
            next_seq: pushed_tokens,
            pushed_tokens,
            counters,
        }),
        ..PackerState::default()
    }
}

/// A `best_fit` pool as a `concat` state: its documents concatenated in arrival order, each a
/// document start.
fn pool_to_concat(state: PackerState) -> PackerState {
    let mut next = PackerState {
        windows_emitted: state.windows_emitted,
        ..PackerState::default()
    };
    let Some(mut pool) = state.pool else {
        return next;
    };
    pool.docs.sort_by_key(|d| d.seq);
    next.lead_source = pool.docs.first().map_or(0, |d| d.source);
    for doc in &pool.docs {
        next.pending_starts.push(next.pending.len() as u32);
        next.pending_sources.push(doc.source);
        next.pending.extend_from_slice(&doc.tokens);
    }
    next
}

#[cfg(test)]
mod tests;
