//! The packer: tokenized documents in, windows of `seq_len + 1` tokens out (inputs
//! `w[..seq_len]`, labels `w[1..]`, as torchtitan does), by the recipe's `[packing] strategy`:
//! - `concat` (`concat.rs`): documents concatenated and cut wherever a window ends; no padding,
//!   the tail that fills no window dropped;
//! - `best_fit` (`best_fit.rs`): documents wait in a bounded pool and each window is filled
//!   best-fit-decreasing from it; only a document longer than a window is cut; the rest of a
//!   window is padding, marked by its [`PackedWindow::real_tokens`].
//!
//! At a change of course the state of one packing becomes the next one's
//! ([`transplant_packer`], `transplant.rs`): the strategy, the pool and the pad may change.
//!
//! [`WindowPacker`] is the one interface the drivers use. Each window records where documents
//! start inside it (offsets in `0..seq_len+1`), the source each came from, and the source of the
//! document that holds its first token (a `concat` window that begins in the middle of a document
//! has no start at 0).

mod best_fit;
mod concat;
mod transplant;

pub use best_fit::BestFitPacker;
pub use concat::Packer;
pub use transplant::{PackerTransplant, transplant_packer};

use crate::recipe::{PackStrategy, PackingSpec};
use serde::{Deserialize, Serialize};

/// The source index of documents whose source is not known: those pending in a checkpoint
/// written before sources were recorded (FORMAT.md v3).
pub const UNKNOWN_SOURCE: u16 = u16::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedWindow {
    pub tokens: Vec<u32>,
    /// Tokens before the padding: `tokens[real_tokens..]` are the pad id. Always
    /// `tokens.len()` with `concat`.
    pub real_tokens: u32,
    /// Offsets in `tokens` where a document begins, strictly increasing.
    pub doc_starts: Vec<u32>,
    /// The recipe index of each starting document's source, one per `doc_starts`.
    pub doc_sources: Vec<u16>,
    /// The source of the document that holds `tokens[0]`.
    pub lead_source: u16,
    /// `best_fit`: per start, the document's mixing position (tokens pushed before it in its
    /// stream, BOS/EOS included; every piece of a cut document has its document's). Empty with
    /// `concat`, whose windows keep the mixing order: there a start's position is the window's
    /// first token in its stream plus the start. The ledger counts phases by it.
    pub doc_positions: Vec<u64>,
}

/// The packer's whole state. With `concat`: the tokens of the window being filled, their
/// document starts and sources. With `best_fit`: `pending` is empty and `pool` holds the waiting
/// documents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackerState {
    pub pending: Vec<u32>,
    pub pending_starts: Vec<u32>,
    pub pending_sources: Vec<u16>,
    /// The source of the document that holds `pending[0]`.
    pub lead_source: u16,
    pub windows_emitted: u64,
    /// `best_fit` only.
    pub pool: Option<PoolState>,
}

/// A `best_fit` pool: its documents in arrival order, with what the packer has counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolState {
    pub docs: Vec<PooledDoc>,
    /// The arrival number the next document gets.
    pub next_seq: u64,
    /// Tokens pushed so far (documents whole, in stream order).
    pub pushed_tokens: u64,
    pub counters: PackingCounters,
}

/// A document waiting in a `best_fit` pool: under a window of tokens, shared between the packer
/// and its snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PooledDoc {
    /// Its arrival number: of two documents of one length the earlier is taken first. It is the
    /// document's mixing position (tokens pushed before it); a pool written by an older dsprep
    /// numbered arrivals 0, 1, 2, … instead.
    pub seq: u64,
    pub source: u16,
    pub tokens: std::sync::Arc<[u32]>,
}

/// What `best_fit` did, for the summary, the manifest and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackingCounters {
    /// Documents longer than a window, cut into window-sized pieces (the only documents cut).
    pub documents_cut: u64,
    /// The pieces they were cut into (each a document start).
    pub cut_pieces: u64,
    /// Pad tokens written after windows' last documents.
    pub padding_tokens: u64,
    /// The most documents and tokens the pool held at once.
    pub pool_peak_documents: u64,
    pub pool_peak_tokens: u64,
}

impl PackingCounters {
    /// Counts of two streams (lanes) together; the pool peaks are the largest single pool's.
    pub fn add(&mut self, other: &PackingCounters) {
        self.documents_cut += other.documents_cut;
        self.cut_pieces += other.cut_pieces;
        self.padding_tokens += other.padding_tokens;
        self.pool_peak_documents = self.pool_peak_documents.max(other.pool_peak_documents);
        self.pool_peak_tokens = self.pool_peak_tokens.max(other.pool_peak_tokens);
    }
}

/// The recipe's packer: `concat` or `best_fit`, behind one interface.
pub enum WindowPacker {
    Concat(Packer),
    BestFit(BestFitPacker),
}

/// How a stream's packer is built: the window, and for `best_fit` its pool and pad id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackerConfig {
    pub window_tokens: usize,
    /// `best_fit`: the pool (a lane's share of the recipe's) and the pad id; `None`: `concat`.
    pub best_fit: Option<(usize, u32)>,
}

impl PackerConfig {
    /// The recipe's packing for a stream holding `pool_documents` of the pool (the whole of it,
    /// or a lane's share), padding with `pad_id`.
    pub fn new(spec: &PackingSpec, pool_documents: usize, pad_id: u32) -> Self {
        PackerConfig {
            window_tokens: spec.window_tokens(),
            best_fit: match spec.strategy {
                PackStrategy::Concat => None,
                PackStrategy::BestFit => Some((pool_documents.max(1), pad_id)),
            },
        }
    }
}

impl WindowPacker {
    pub fn new(config: PackerConfig) -> Self {
        match config.best_fit {
            None => WindowPacker::Concat(Packer::new(config.window_tokens)),
            Some((pool, pad)) => {
                WindowPacker::BestFit(BestFitPacker::new(config.window_tokens, pool, pad))
            }
        }
    }

    /// A packer that continues from `state`; `None` if the state cannot belong to this packer
    /// (another strategy, window size or pool).
    pub fn from_state(config: PackerConfig, state: PackerState) -> Option<Self> {
        match config.best_fit {
            None => Packer::from_state(config.window_tokens, state).map(WindowPacker::Concat),
            Some((pool, pad)) => BestFitPacker::from_state(config.window_tokens, pool, pad, state)
                .map(WindowPacker::BestFit),
        }
    }

    /// Append one document's tokens (BOS/EOS already applied) from recipe source `source`;
    /// completed windows go to `out`.
    pub fn push_doc(&mut self, tokens: &[u32], source: u16, out: &mut Vec<PackedWindow>) {
        match self {
            WindowPacker::Concat(p) => p.push_doc(tokens, source, out),
            WindowPacker::BestFit(p) => p.push_doc(tokens, source, out),
        }
    }

    /// The stream has ended: `best_fit` packs its whole pool into windows; `concat` keeps its
    /// tail, which fills no window ([`WindowPacker::leftover_tokens`]), once the whole windows a
    /// transplanted state held are out.
    pub fn finish(&mut self, out: &mut Vec<PackedWindow>) {
        match self {
            WindowPacker::Concat(p) => p.drain(out),
            WindowPacker::BestFit(p) => p.finish(out),
        }
    }

    /// Tokens held that no window has taken: at the end of the stream, the dropped tail.
    pub fn leftover_tokens(&self) -> u64 {
        match self {
            WindowPacker::Concat(p) => p.leftover().len() as u64,
            WindowPacker::BestFit(p) => p.pool_tokens(),
        }
    }

    /// Tokens pushed so far: where the next document starts in the stream, documents whole and
    /// in stream order.
    pub fn position_tokens(&self) -> u64 {
        match self {
            WindowPacker::Concat(p) => p.position_tokens(),
            WindowPacker::BestFit(p) => p.pushed_tokens(),
        }
    }

    /// Windows emitted so far.
    pub fn windows_emitted(&self) -> u64 {
        match self {
            WindowPacker::Concat(p) => p.windows_emitted(),
            WindowPacker::BestFit(p) => p.windows_emitted(),
        }
    }

    /// Documents waiting in the pool (0 with `concat`).
    pub fn pool_documents(&self) -> usize {
        match self {
            WindowPacker::Concat(_) => 0,
            WindowPacker::BestFit(p) => p.pool_len(),
        }
    }

    /// `best_fit`'s counters; `None` with `concat`.
    pub fn counters(&self) -> Option<PackingCounters> {
        match self {
            WindowPacker::Concat(_) => None,
            WindowPacker::BestFit(p) => Some(p.counters()),
        }
    }

    pub fn state(&self) -> PackerState {
        match self {
            WindowPacker::Concat(p) => p.state(),
            WindowPacker::BestFit(p) => p.state(),
        }
    }
}
