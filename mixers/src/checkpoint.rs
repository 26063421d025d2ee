//! The checkpoint's bytes: the pipeline's whole state (the document stream and the packer) plus a
//! driver's metadata, in one self-checking blob. Encoding only; writing files is the drivers'.
//!
//! ```text
//! b"DSPCKPT2"                      magic and format version
//! u32 LE  n, then n bytes          JSON: the driver's metadata and every small state field
//! u64 LE  n, then n × 18 bytes     buffered documents: source u16, pass u32, shard u32, row u64
//! u64 LE  n, then n × u32 LE       the packer's pending tokens
//! u64 LE  n, then n × u32 LE       their document starts
//! 32 bytes                         sha256 of everything above
//! ```
//! Buffered documents are references, never text: a 100k buffer costs 1.8 MB.
//!
//! Version 2 (`DSPCKPT2`) can name the pieces of split rows (`oversize = "split"`): a source's
//! cursor and the mixer's look-ahead positions carry `piece` in the JSON part when it is not 0.
//! Pieces never enter a shuffle buffer, but in a mix in tokens the documents taken out of a
//! source's buffer and waiting for their tokens (`crate::mixer`) are listed with the buffered
//! positions, and pieces do pass through there: the JSON's `buffered_pieces` lists them as
//! `[index, piece]` pairs (absent when there are none), so the binary positions stay 18 bytes.
//! Version 3 (`DSPCKPT3`) is written only by `[packing] strategy = "best_fit"`: its pool follows
//! the pending starts (the JSON's `pool` has its arrival counter, tokens pushed and counters):
//!
//! ```text
//! u64 LE  n, then n × 14 bytes     pooled documents in arrival order: seq u64, source u16, len u32
//! u64 LE  n, then n × u32 LE       their tokens, concatenated
//! ```
//! Pooled documents are tokens, not references: re-reading and re-tokenizing them would put a
//! tokenizer pass on every resume. A `concat` stream still writes version 2, byte for byte as
//! before; a dsprep without pools refuses a version 3 file (bad magic).
//!
//! Version 1 (`DSPCKPT1`, the same layout, no piece anywhere) is still
//! read. The magic changed so that a dsprep that knows no pieces refuses a version 2 file
//! instead of dropping the piece it cannot read and resuming at the wrong document.

use crate::doc::{DocPos, SourceCursor};
use crate::mixer::MixerState;
use crate::packer::{PackerState, PackingCounters, PoolState, PooledDoc, UNKNOWN_SOURCE};
use crate::stream::StreamState;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"DSPCKPT2";
/// Version 1: the same layout, written before split rows had pieces.
const MAGIC_V1: &[u8; 8] = b"DSPCKPT1";
/// Version 3: version 2 and a `best_fit` pool.
const MAGIC_V3: &[u8; 8] = b"DSPCKPT3";
const POS_BYTES: usize = 18;
const POOLED_DOC_BYTES: usize = 14;

/// The pipeline's state at a document boundary: what comes next, and the packer's leftover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineState {
    pub stream: StreamState,
    pub packer: PackerState,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckpointError {
    #[error("not a dsprep checkpoint (bad magic)")]
    Magic,
    #[error("truncated ({0} bytes)")]
    Truncated(usize),
    #[error("checksum mismatch: the file is torn or corrupt")]
    Checksum,
    #[error("malformed: {0}")]
    Malformed(String),
}

/// The JSON part: small fields of the state, with the driver's metadata beside them.
#[derive(Serialize, Deserialize)]
struct Header<M> {
    meta: M,
    sources: Vec<SourceCursor>,
    mixer: MixerState,
    shuffle_rng_word_pos: u64,
    draining: bool,
    emitted: u64,
    windows_emitted: u64,
    /// The pending documents' sources and the source of the pending window's first token.
    /// Absent in checkpoints written before sources were recorded: then unknown
    /// ([`UNKNOWN_SOURCE`]).
    #[serde(default)]
    pending_sources: Option<Vec<u16>>,
    #[serde(default)]
    lead_source: Option<u16>,
    /// `[index, piece]` for each buffered position that is a piece of a split row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    buffered_pieces: Vec<(u64, u32)>,
    /// Version 3: the `best_fit` pool's small fields (its documents are binary sections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pool: Option<PoolHeader>,
}

#[derive(Serialize, Deserialize)]
struct PoolHeader {
    next_seq: u64,
    pushed_tokens: u64,
    counters: PackingCounters,
}

pub fn encode<M: Serialize>(meta: &M, state: &PipelineState) -> Vec<u8> {
    let stream = &state.stream;
    let header = Header {
        meta,
        sources: stream.sources.clone(),
        mixer: stream.mixer.clone(),
        shuffle_rng_word_pos: stream.shuffle_rng_word_pos,
        draining: stream.draining,
        emitted: stream.emitted,
        windows_emitted: state.packer.windows_emitted,
        pending_sources: Some(state.packer.pending_sources.clone()),
        lead_source: Some(state.packer.lead_source),
        buffered_pieces: (stream.buffered.iter().enumerate())
            .filter(|(_, p)| p.is_piece())
            .map(|(i, p)| (i as u64, p.piece))
            .collect(),
        pool: state.packer.pool.as_ref().map(|pool| PoolHeader {
            next_seq: pool.next_seq,
            pushed_tokens: pool.pushed_tokens,
            counters: pool.counters,
        }),
    };
    let json = serde_json::to_vec(&header).expect("plain data serializes");
    let mut out = Vec::with_capacity(
        64 + json.len() + stream.buffered.len() * POS_BYTES + state.packer.pending.len() * 4,
    );
    out.extend_from_slice(match state.packer.pool {
        Some(_) => MAGIC_V3,
        None => MAGIC,
    });
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&(stream.buffered.len() as u64).to_le_bytes());
    for p in &stream.buffered {
        out.extend_from_slice(&p.source.to_le_bytes());
        out.extend_from_slice(&p.pass.to_le_bytes());
        out.extend_from_slice(&p.shard.to_le_bytes());
        out.extend_from_slice(&p.row.to_le_bytes());
    }
    for ids in [&state.packer.pending, &state.packer.pending_starts] {
        out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
        out.extend(ids.iter().flat_map(|t| t.to_le_bytes()));
    }
    if let Some(pool) = &state.packer.pool {
        out.extend_from_slice(&(pool.docs.len() as u64).to_le_bytes());
        for doc in &pool.docs {
            out.extend_from_slice(&doc.seq.to_le_bytes());
            out.extend_from_slice(&doc.source.to_le_bytes());
            out.extend_from_slice(&(doc.tokens.len() as u32).to_le_bytes());
        }
        let tokens: usize = pool.docs.iter().map(|d| d.tokens.len()).sum();
        out.extend_from_slice(&(tokens as u64).to_le_bytes());
        for doc in &pool.docs {
            out.extend(doc.tokens.iter().flat_map(|t| t.to_le_bytes()));
        }
    }
    let digest: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&digest);
    out
}

pub fn decode<M: for<'de> Deserialize<'de>>(
    bytes: &[u8],
) -> Result<(M, PipelineState), CheckpointError> {
    if bytes.len() < MAGIC.len() + 32 {
        return Err(CheckpointError::Truncated(bytes.len()));
    }
    let magic = &bytes[..MAGIC.len()];
    if magic != MAGIC && magic != MAGIC_V1 && magic != MAGIC_V3 {
        return Err(CheckpointError::Magic);
    }
    let (body, digest) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return Err(CheckpointError::Checksum);
    }
    let mut r = Reader {
        bytes: &body[MAGIC.len()..],
    };
    let json_len = u32::from_le_bytes(r.take_array()?) as usize;
    let header: Header<M> = serde_json::from_slice(r.take(json_len)?)
        .map_err(|e| CheckpointError::Malformed(format!("header: {e}")))?;
    let count = r.count(POS_BYTES)?;
    let mut buffered = Vec::with_capacity(count);
    for _ in 0..count {
        buffered.push(DocPos {
            source: u16::from_le_bytes(r.take_array()?),
            pass: u32::from_le_bytes(r.take_array()?),
            shard: u32::from_le_bytes(r.take_array()?),
            row: u64::from_le_bytes(r.take_array()?),
            piece: 0,
        });
    }
    for &(index, piece) in &header.buffered_pieces {
        let pos = usize::try_from(index)
            .ok()
            .and_then(|i| buffered.get_mut(i))
            .ok_or_else(|| {
                CheckpointError::Malformed(format!(
                    "buffered_pieces names position {index} of {count}"
                ))
            })?;
        pos.piece = piece;
    }
    let pending = r.u32s()?;
    let pending_starts = r.u32s()?;
    let pool = match (magic == MAGIC_V3, header.pool) {
        (false, None) => None,
        (true, Some(pool)) => Some(read_pool(&mut r, pool)?),
        (true, None) => {
            return Err(CheckpointError::Malformed(
                "a version 3 file without its pool".into(),
            ));
        }
        (false, Some(_)) => {
            return Err(CheckpointError::Malformed(
                "a pool in a version 1 or 2 file".into(),
            ));
        }
    };
    if !r.bytes.is_empty() {
        return Err(CheckpointError::Malformed(format!(
            "{} bytes after the last section",
            r.bytes.len()
        )));
    }
    let state = PipelineState {
        stream: StreamState {
            sources: header.sources,
            mixer: header.mixer,
            shuffle_rng_word_pos: header.shuffle_rng_word_pos,
            buffered,
            draining: header.draining,
            emitted: header.emitted,
        },
        packer: PackerState {
            pending,
            pending_sources: header
                .pending_sources
                .unwrap_or_else(|| vec![UNKNOWN_SOURCE; pending_starts.len()]),
            pending_starts,
            lead_source: header.lead_source.unwrap_or(UNKNOWN_SOURCE),
            windows_emitted: header.windows_emitted,
            pool,
        },
    };
    Ok((header.meta, state))
}

/// Version 3's pool sections: the documents' arrival numbers, sources and lengths, then their
/// tokens.
fn read_pool(r: &mut Reader<'_>, header: PoolHeader) -> Result<PoolState, CheckpointError> {
    let count = r.count(POOLED_DOC_BYTES)?;
    let mut docs = Vec::with_capacity(count);
    let mut lens = Vec::with_capacity(count);
    for _ in 0..count {
        let seq = u64::from_le_bytes(r.take_array()?);
        let source = u16::from_le_bytes(r.take_array()?);
        lens.push(u32::from_le_bytes(r.take_array()?) as usize);
        docs.push((seq, source));
    }
    let tokens = r.u32s()?;
    if lens.iter().sum::<usize>() != tokens.len() {
        return Err(CheckpointError::Malformed(format!(
            "the pooled documents' lengths add up to {}, their tokens are {}",
            lens.iter().sum::<usize>(),
            tokens.len()
        )));
    }
    let mut at = 0;
    let docs = (docs.into_iter().zip(lens))
        .map(|((seq, source), len)| {
            at += len;
            PooledDoc {
                seq,
                source,
                tokens: tokens[at - len..at].into(),
            }
        })
        .collect();
    Ok(PoolState {
        docs,
        next_seq: header.next_seq,
        pushed_tokens: header.pushed_tokens,
        counters: header.counters,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CheckpointError> {
        if self.bytes.len() < n {
            return Err(CheckpointError::Malformed(format!(
                "a section needs {n} bytes, {} are left",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], CheckpointError> {
        Ok(self.take(N)?.try_into().expect("take returns N bytes"))
    }

    /// A section's item count, checked against the bytes left.
    fn count(&mut self, item_bytes: usize) -> Result<usize, CheckpointError> {
        let n = u64::from_le_bytes(self.take_array()?);
        match usize::try_from(n) {
            Ok(n)
                if n.checked_mul(item_bytes)
                    .is_some_and(|b| b <= self.bytes.len()) =>
            {
                Ok(n)
            }
            _ => Err(CheckpointError::Malformed(format!(
                "a section of {n} items does not fit in {} bytes",
                self.bytes.len()
            ))),
        }
    }

    fn u32s(&mut self) -> Result<Vec<u32>, CheckpointError> {
        let n = self.count(4)?;
        Ok(self
            .take(n * 4)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("chunks of 4")))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::SourceCounters;

    fn state() -> PipelineState {
        PipelineState {
            stream: StreamState {
                sources: vec![SourceCursor {
                    pass: 1,
                    shard: 3,
                    row: 69_999,
                    piece: 4,
                    counters: SourceCounters {
                        rows_read: 9,
                        rows_split: 1,
                        split_pieces: 3,
                        ..Default::default()
                    },
                }],
                mixer: MixerState {
                    rng_word_pos: 12,
                    peeked: vec![Some(DocPos {
                        source: 0,
                        pass: 1,
                        shard: 3,
                        row: 69_999,
                        piece: 3,
                    })],
                    exhausted: vec![true],
                    emitted: vec![5],
                    started: true,
                    done: false,
                    emitted_tokens: vec![4_000],
                    shuffles: vec![crate::mixer::SourceShuffleState {
                        rng_word_pos: 9,
                        held: 336,
                        draining: false,
                        ready: 64,
                        ready_ends: true,
                        ready_batch: 20,
                    }],
                    phase: 1,
                    phase_start: vec![3_000],
                    owed: Vec::new(),
                    earlier_tokens: 1_000,
                },
                shuffle_rng_word_pos: 40,
                buffered: (0..1000)
                    .map(|i| DocPos {
                        source: 0,
                        pass: 1,
                        shard: i % 7,
                        row: u64::from(i) * 3,
                        // In a mix in tokens, documents out of a buffer may be pieces.
                        piece: u32::from(i % 500 == 7),
                    })
                    .collect(),
                draining: false,
                emitted: 77,
            },
            packer: PackerState {
                pending: vec![1, 2, 3, 50_000],
                pending_starts: vec![0, 2],
                pending_sources: vec![4, 1],
                lead_source: 4,
                windows_emitted: 11,
                pool: None,
            },
        }
    }

    /// A `best_fit` state: no pending window, two pooled documents.
    fn pooled_state() -> PipelineState {
        let mut state = state();
        state.packer = PackerState {
            windows_emitted: 3,
            pool: Some(PoolState {
                docs: vec![
                    PooledDoc {
                        seq: 4,
                        source: 1,
                        tokens: vec![7, 8, 9].into(),
                    },
                    PooledDoc {
                        seq: 9,
                        source: 0,
                        tokens: vec![70_000].into(),
                    },
                ],
                next_seq: 10,
                pushed_tokens: 4_321,
                counters: PackingCounters {
                    documents_cut: 2,
                    cut_pieces: 5,
                    padding_tokens: 17,
                    pool_peak_documents: 6,
                    pool_peak_tokens: 900,
                },
            }),
            ..PackerState::default()
        };
        state
    }

    #[test]
    fn a_pool_round_trips_as_version_3_and_concat_stays_version_2() {
        let bytes = encode(&"meta", &pooled_state());
        assert_eq!(&bytes[..8], b"DSPCKPT3");
        let (_, back): (String, PipelineState) = decode(&bytes).unwrap();
        assert_eq!(back, pooled_state());
        assert_eq!(&encode(&"meta", &state())[..8], b"DSPCKPT2");
        // A version 2 magic on a pooled file, after its checksum is made good again: refused.
        let mut forged = bytes.clone();
        forged[..8].copy_from_slice(b"DSPCKPT2");
        let body = forged.len() - 32;
        let digest: [u8; 32] = Sha256::digest(&forged[..body]).into();
        forged[body..].copy_from_slice(&digest);
        assert!(matches!(
            decode::<String>(&forged),
            Err(CheckpointError::Malformed(_))
        ));
    }

    #[test]
    fn round_trips_and_stores_references_compactly() {
        let bytes = encode(&"meta", &state());
        let (meta, back): (String, PipelineState) = decode(&bytes).unwrap();
        assert_eq!(meta, "meta");
        assert_eq!(back, state());
        let fixed = 8 + 4 + 3 * 8 + 32;
        let json = bytes.len() - fixed - 1000 * POS_BYTES - 6 * 4;
        assert!(json < 750, "the header stays small: {json} bytes");
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_detected() {
        let bytes = encode(&"meta", &state());
        for at in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(decode::<String>(&bad).is_err(), "flip at {at}");
        }
        for len in [0, 10, 39, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode::<String>(&bytes[..len]).is_err(), "cut at {len}");
        }
        assert_eq!(
            decode::<String>(&bytes[..bytes.len() - 1]).unwrap_err(),
            CheckpointError::Checksum
        );
        let mut other = bytes.clone();
        other[0] = b'X';
        assert_eq!(
            decode::<String>(&other).unwrap_err(),
            CheckpointError::Magic
        );
    }

    /// A real version 1 checkpoint: `dsprep pack` of the quickstart mixed in tokens (`unit =
    /// "tokens"`, five sources, each with its own shuffle buffer), by dsprep at ba5d15f, killed
    /// after its first checkpoints. Version 2 reads it, and writes the same state back.
    #[test]
    fn a_piece_named_past_the_buffered_positions_is_refused() {
        let bytes = encode(&"meta", &state());
        let json_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let mut header: serde_json::Value =
            serde_json::from_slice(&bytes[12..12 + json_len]).unwrap();
        assert_eq!(
            header["buffered_pieces"],
            serde_json::json!([[7, 1], [507, 1]])
        );
        header["buffered_pieces"] = serde_json::json!([[1000, 2]]);
        let json = serde_json::to_vec(&header).unwrap();
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&(json.len() as u32).to_le_bytes());
        bad.extend_from_slice(&json);
        bad.extend_from_slice(&bytes[12 + json_len..bytes.len() - 32]);
        let digest: [u8; 32] = Sha256::digest(&bad).into();
        bad.extend_from_slice(&digest);
        let err = decode::<String>(&bad).unwrap_err();
        assert_eq!(
            err,
            CheckpointError::Malformed("buffered_pieces names position 1000 of 1000".into())
        );
    }

    #[test]
    fn a_version_1_checkpoint_is_still_read() {
        let v1 = include_bytes!("../tests/data/checkpoint-v1.ckpt");
        assert_eq!(&v1[..8], MAGIC_V1);
        let (meta, state): (serde_json::Value, PipelineState) = decode(v1).unwrap();
        assert_eq!(
            meta["recipe_hash"],
            "a11e16366bce8b0bea325f96fa77098ed417e06145ac7fbf02f100cd0c25f694"
        );
        let s = &state.stream;
        assert_eq!(s.sources.len(), 5);
        assert_eq!(s.mixer.shuffles.len(), 5, "a mix in tokens");
        let held: u64 = s.mixer.shuffles.iter().map(|b| b.held).sum();
        assert_eq!((s.buffered.len(), held, s.emitted), (210, 210, 935));
        assert_eq!(
            s.mixer.emitted_tokens,
            [263_094, 97_907, 196_481, 80_343, 32_740]
        );
        assert_eq!(
            (state.packer.windows_emitted, state.packer.pending.len()),
            (1307, 74)
        );
        assert!(s.sources.iter().all(|c| c.piece == 0));
        assert!(
            s.buffered
                .iter()
                .chain(s.mixer.peeked.iter().flatten())
                .all(|p| p.piece == 0)
        );
        let v2 = encode(&meta, &state);
        assert_eq!(&v2[..8], MAGIC);
        let (_, back): (serde_json::Value, PipelineState) = decode(&v2).unwrap();
        assert_eq!(back, state);
    }
}
