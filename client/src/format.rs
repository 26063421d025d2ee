//! The packed-output format, version 5 (documented for users in FORMAT.md); versions 1 (no
//! stream chain), 2 (no document sources), 3 (no phase ledger) and 4 (no padding) are still
//! read. A pack without padding (`[packing] strategy = "concat"`) is written as version 4.
//!
//! A packed directory holds:
//! - `tokens-NNNNN.bin`: little-endian token ids (`u16` when every id fits, else `u32`), nothing
//!   else. Concatenated in name order they are the windows in order, each `seq_len + 1` tokens;
//!   a shard always holds whole windows.
//! - `doc_starts.u32`: for every window in order, the offsets inside the window where a document
//!   begins (little-endian `u32`).
//! - `doc_starts_offsets.u64`: `num_windows + 1` little-endian `u64`: window `i`'s starts are
//!   `doc_starts[offsets[i]..offsets[i + 1]]`.
//! - `doc_sources.u16` (v3): the recipe source index of every document start, aligned with
//!   `doc_starts.u32` (the same offsets).
//! - `lead_sources.u16` (v3): per window, the source of the document holding its first token.
//! - `real_tokens.u32` (v5, `best_fit` only): per window, the tokens before its padding.
//! - `tokenizer.json`: a copy of the tokenizer that produced the ids.
//! - `manifest.json`: [`Manifest`], written last: a directory without it is not a packed output.

use serde::{Deserialize, Serialize};

pub const FORMAT_NAME: &str = "dsprep-packed";
/// The newest version: 2 adds the stream chain (`Manifest::chain`), 3 the document sources
/// (`Manifest::doc_sources`, `Manifest::lead_sources`), 4 the ledger of every phase
/// (`Manifest::phases`), 5 padded windows (`Manifest::real_tokens`, `Manifest::packing`), 6 the
/// mixing position of every document start (`Manifest::doc_positions`), which a `best_fit` pack
/// with phases counts its phases by, 7 each lineage segment's packing
/// ([`LineageSegment::packing`]: a lineage whose packing changed at a change of course). A pack
/// is written at the oldest version that holds it.
pub const FORMAT_VERSION: u32 = 7;
/// The version of a `best_fit` pack with phases (mixing positions), one packing throughout:
/// version 6, byte for byte.
pub const POSITIONS_FORMAT_VERSION: u32 = 6;
/// The version of a padded pack without mixing positions: version 5, byte for byte.
pub const PADDED_FORMAT_VERSION: u32 = 5;
/// The version of a pack without padding: version 4, byte for byte, so that every reader of
/// version 4 reads it; a padded pack is version 5, which they refuse.
pub const UNPADDED_FORMAT_VERSION: u32 = 4;
/// The oldest version readers still read.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
pub const MANIFEST_FILE: &str = "manifest.json";
pub const DOC_STARTS_FILE: &str = "doc_starts.u32";
pub const DOC_STARTS_OFFSETS_FILE: &str = "doc_starts_offsets.u64";
pub const DOC_SOURCES_FILE: &str = "doc_sources.u16";
pub const LEAD_SOURCES_FILE: &str = "lead_sources.u16";
pub const REAL_TOKENS_FILE: &str = "real_tokens.u32";
pub const DOC_POSITIONS_FILE: &str = "doc_positions.u64";
pub const TOKENIZER_FILE: &str = "tokenizer.json";

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub fn shard_file_name(index: usize) -> String {
    format!("tokens-{index:05}.bin")
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    U16,
    U32,
}

impl Dtype {
    /// The smallest dtype that holds every id below `vocab_size`.
    pub fn for_vocab(vocab_size: u32) -> Dtype {
        if vocab_size <= 1 << 16 {
            Dtype::U16
        } else {
            Dtype::U32
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::U16 => 2,
            Dtype::U32 => 4,
        }
    }

    /// Append `tokens` to `out` as this dtype's little-endian ids: a window's bytes as packed
    /// shards store them, the daemon serves them and the stream chain hashes them.
    pub fn extend_bytes(self, tokens: &[u32], out: &mut Vec<u8>) {
        match self {
            Dtype::U16 => out.extend(tokens.iter().flat_map(|&t| (t as u16).to_le_bytes())),
            Dtype::U32 => out.extend(tokens.iter().flat_map(|&t| t.to_le_bytes())),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    pub format_version: u32,
    /// The dsprep version that wrote it.
    pub created_by: String,
    pub recipe_hash: String,
    /// The recipe in canonical form (every default filled in).
    pub recipe: serde_json::Value,
    pub tokenizer: TokenizerInfo,
    pub dtype: Dtype,
    pub seq_len: u32,
    /// `seq_len + 1`
    pub window_tokens: u32,
    pub num_windows: u64,
    /// Tokens produced but left over at the end, fewer than a window: not written.
    pub dropped_tail_tokens: u64,
    pub windows_per_shard: u64,
    pub shards: Vec<OutputFile>,
    pub doc_starts: OutputFile,
    pub doc_starts_offsets: OutputFile,
    pub num_doc_starts: u64,
    /// The source of every document start (v3; absent before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc_sources: Option<OutputFile>,
    /// The source of every window's first token (v3; absent before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead_sources: Option<OutputFile>,
    /// Every file read, with its size and checksum.
    pub inputs: Vec<InputFile>,
    /// Per source, in recipe order.
    pub sources: Vec<SourceStats>,
    /// The stream chain (`crate::chain`) after every closed token shard and after the last
    /// window: what a served step's chain must equal at the same window. Empty in version 1.
    #[serde(default)]
    pub chain: Vec<ChainMark>,
    /// Per phase (one, the whole stream, for a recipe without phases): what the windows hold
    /// against the targets (v4; empty before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseStats>,
    /// Per window, the tokens before its padding (v5, `best_fit`; absent: no padding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub real_tokens: Option<OutputFile>,
    /// Per document start, its mixing position in its lane's own stream (`doc_positions.u64`):
    /// written by `best_fit` with `[[mix.phase]]`, whose windows do not keep the mixing order;
    /// the phase ledger counts by it. Absent: a start's position is where it lies in the windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc_positions: Option<OutputFile>,
    /// How `best_fit` packed (v5; absent with `concat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<PackingStats>,
    /// A pack of a lineage (`dsprep pack --lineage`): where each recipe took over. Absent in
    /// a pack of one recipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Vec<LineageSegment>>,
}

/// One recipe of a packed lineage, the step, window and document from which it holds, and its
/// ledger: what it drew, by source.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LineageSegment {
    pub recipe_hash: String,
    pub from_step: u64,
    pub from_window: u64,
    pub from_documents: u64,
    pub global_batch: u64,
    /// Per source of the lineage: its target share in this recipe (in the recipe's `[mix]
    /// unit`; its `[[source]]` weights, phase 0), the realized share, and the documents and
    /// tokens the packer took while this recipe drew them.
    #[serde(default)]
    pub sources: Vec<SegmentSource>,
    /// The documents of sources this segment's recipe stopped drawing from that had been drawn
    /// but not emitted: dropped at the change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<DroppedDocuments>,
    /// Format 7 (a lineage whose packing changed): how this segment's windows are packed.
    /// Absent when every segment packs alike (the manifest's `packing`, or none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<SegmentPacking>,
}

/// How one segment of a format 7 lineage pack packs its windows.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentPacking {
    /// `"concat"` or `"best_fit"`.
    pub strategy: String,
    /// With `best_fit`, the id after each window's real tokens; absent with `concat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_id: Option<u32>,
    /// The first window its packer made: at or past `from_window` (the windows the previous
    /// packer made at the document where this recipe takes over are the previous packing's).
    /// Its windows run to the next segment's `first_window`. With `[lanes]`: the first window
    /// of the stream that any lane's packer of this segment made (the lanes take over apart).
    pub first_window: u64,
    /// With `[lanes]` only: per lane (`lane_first_windows[l]` is lane `l`'s), the first of the
    /// lane's own windows this segment's packer made. Window `i` of the stream is window
    /// `(b div count)·block_windows + i mod block_windows` of lane `b mod count`, with
    /// `b = i div block_windows`; its packing is the last segment's whose entry for its lane is
    /// at or below that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane_first_windows: Option<Vec<u64>>,
}

/// One source in one segment of a packed lineage.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SegmentSource {
    pub name: String,
    pub target_fraction: f64,
    pub realized_fraction: f64,
    pub documents: u64,
    pub tokens: u64,
}

/// Documents a change of course dropped, of one source.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DroppedDocuments {
    pub source: String,
    pub documents: u64,
}

/// What `best_fit` did, in the manifest (v5).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PackingStats {
    /// `"best_fit"`.
    pub strategy: String,
    /// The pool of the whole stream (lanes share it).
    pub pool_documents: u64,
    /// The id after each window's real tokens.
    pub pad_id: u32,
    /// Tokens of padding in the windows.
    pub padding_tokens: u64,
    /// Documents longer than a window, cut into window-sized pieces (each a document start);
    /// no other document is cut.
    pub documents_cut: u64,
    pub cut_pieces: u64,
    /// The most documents and tokens one pool held at once (with lanes: the largest lane's).
    pub pool_peak_documents: u64,
    pub pool_peak_tokens: u64,
}
/// One phase of the mix in the manifest's ledger, counted over the windows (the dropped tail is
/// not in them): a document belongs to the phase in force where it starts (FORMAT.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseStats {
    /// 0: the `[[source]]` weights; `k`: the recipe's `k`-th `[[mix.phase]]`.
    pub phase: u32,
    /// The recipe's point for it (0 for phase 0).
    pub at_tokens: u64,
    /// The token of the stream where its first document starts (with lanes, the first lane's);
    /// absent when the stream ended before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub began_at_tokens: Option<u64>,
    /// With `[lanes]`: where the last lane's first document of it starts (absent until every
    /// lane has begun it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_lanes_began_at_tokens: Option<u64>,
    /// Its tokens and document starts in the windows.
    pub tokens: u64,
    pub documents: u64,
    /// Per source, in recipe order.
    pub sources: Vec<PhaseSourceStats>,
}

/// One source's line of a phase's ledger.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseSourceStats {
    pub name: String,
    /// Its share in the recipe's `[mix] unit` (0 when it takes no part in the phase).
    pub target_fraction: f64,
    /// Its share of the phase's tokens and of its document starts.
    pub realized_token_fraction: f64,
    pub realized_fraction: f64,
    /// The realized share in the recipe's unit minus the target.
    pub deviation: f64,
    pub tokens: u64,
    pub documents: u64,
}

/// The stream chain after the first `windows` windows, in hex.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChainMark {
    pub windows: u64,
    pub chain: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TokenizerInfo {
    /// The copy inside the packed directory.
    pub file: String,
    pub sha256: String,
    /// One more than the largest id.
    pub vocab_size: u32,
    pub eos_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_id: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OutputFile {
    pub file: String,
    pub size_bytes: u64,
    pub sha256: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct InputFile {
    pub source: String,
    /// As matched by the recipe's glob, relative to the recipe's folder when below it; for a Hub
    /// file, its path inside `repo`.
    pub path: String,
    pub size_bytes: u64,
    /// sha256 of the bytes; for a Hub file, its LFS sha256 (empty for a small file kept in git,
    /// which `etag` identifies).
    pub sha256: String,
    /// Hub files only: the dataset repo (`owner/name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// Hub files only: the commit sha the recipe's revision resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Hub files only: the git blob id (the Hub's `ETag` for files kept in git).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Hub files only: what the bytes this run read were checked against — `sha256` or
    /// `git-blob-sha1` (read whole and equal to the Hub's hash), `page-crc` (parquet read by
    /// ranges, every page read carried a CRC and matched it), `page-crc M/N` (M of the N pages
    /// read carried one), `none` (read, nothing to check against), `not-read`. Absent for local
    /// files (`sha256` is then computed from the file). With lanes, from the lanes' manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SourceStats {
    pub name: String,
    pub weight: f64,
    /// `weight / Σ weights`
    pub target_fraction: f64,
    /// Share of the stream's documents that came from this source.
    pub realized_fraction: f64,
    /// Share of the stream's tokens (BOS/EOS included) that came from this source (absent in
    /// manifests written before it was recorded: read as 0).
    #[serde(default)]
    pub realized_token_fraction: f64,
    /// Documents of this source in the stream.
    pub documents: u64,
    /// Tokens of those documents, BOS/EOS included.
    pub tokens: u64,
    pub rows_read: u64,
    pub rows_filtered: u64,
    pub rows_empty: u64,
    /// Rows larger than the source's `max_document_bytes`, skipped (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows_oversize: u64,
    /// Rows over the source's `max_document_bytes` cut into pieces (`oversize = "split"`),
    /// and the pieces they became, each one of `documents` (both absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows_split: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub split_pieces: u64,
    /// Times the source reached its end (more than 1 only under `all_exhausted`).
    pub passes_completed: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Little-endian ids of the dtype's width, after what `out` held (a `u16` keeps the low half).
    #[test]
    fn window_bytes_are_little_endian_ids_appended() {
        let tokens = [0, 1, 0x1234, 0xABCD, 0xFFFF, 0x0001_0002];
        let mut out = vec![9];
        Dtype::U16.extend_bytes(&tokens, &mut out);
        assert_eq!(
            out,
            [
                9, 0, 0, 1, 0, 0x34, 0x12, 0xCD, 0xAB, 0xFF, 0xFF, 0x02, 0x00
            ]
        );
        let mut out = vec![9];
        Dtype::U32.extend_bytes(&[0x0102_0304, 70_000], &mut out);
        assert_eq!(out, [9, 4, 3, 2, 1, 0x70, 0x11, 0x01, 0x00]);
        let long: Vec<u32> = (0..10_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) >> 7)
            .collect();
        let mut out = Vec::new();
        Dtype::U32.extend_bytes(&long, &mut out);
        let again: Vec<u32> = out
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(again, long);
    }
}
