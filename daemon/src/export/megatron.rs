//! Megatron-LM's `IndexedDataset` (megatron/core/datasets/indexed_dataset.py), the MMIDIDX
//! version-1 layout, one sequence per document of the stream, in stream order:
//!
//! - `PREFIX.bin`: the token ids, little-endian, no header. dsprep's `u16` ids are Megatron's
//!   `uint16` (code 8) and its `u32` ids are `int32` (code 4), so the file is the packed windows'
//!   bytes concatenated.
//! - `PREFIX.idx`: `MMIDIDX\0\0`, u64 version 1, u8 dtype code, u64 sequence count, u64 document
//!   count, then int32 sequence lengths, int64 sequence byte offsets, int64 document indices
//!   (`0, 1, …, n`: every sequence is a document).
//!
//! A document is cut where the index says one begins; the first sequence starts the stream and
//! the last ends with the last window (the packed output's dropped tail is not in it). A padded
//! pack (`best_fit`, format 5) gives its windows' real tokens only: every sequence is a whole
//! document (a document longer than a window is its pieces, one sequence each), and no padding.

use super::{commit, partial, report_progress};
use crate::progress::Progress;
use anyhow::{Context, bail};
use dsprep_client::PackedDataset;
use dsprep_client::format::Dtype;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
const VERSION: u64 = 1;
/// Megatron's dtype codes for the two dsprep writes.
const CODE_UINT16: u8 = 8;
const CODE_INT32: u8 = 4;

/// `PREFIX.bin` and `PREFIX.idx`.
pub fn outputs(prefix: &Path) -> Vec<PathBuf> {
    ["bin", "idx"]
        .iter()
        .map(|ext| {
            let mut name = prefix.file_name().unwrap_or_default().to_os_string();
            name.push(format!(".{ext}"));
            prefix.with_file_name(name)
        })
        .collect()
}

/// Write both files; returns (documents, bytes of `.bin`).
pub fn write(
    dataset: &PackedDataset,
    prefix: &Path,
    progress: &Progress,
) -> anyhow::Result<(u64, u64)> {
    let m = dataset.manifest();
    let code = match m.dtype {
        Dtype::U16 => CODE_UINT16,
        Dtype::U32 if m.tokenizer.vocab_size <= i32::MAX as u32 => CODE_INT32,
        Dtype::U32 => bail!(
            "a vocabulary of {} ids does not fit Megatron's int32 token ids",
            m.tokenizer.vocab_size
        ),
    };
    let [bin, idx] = <[PathBuf; 2]>::try_from(outputs(prefix))
        .map_err(|_| anyhow::anyhow!("internal error: two outputs"))?;
    let result = write_files(dataset, code, &partial(&bin), &partial(&idx), progress);
    if result.is_err() {
        let _ = std::fs::remove_file(partial(&bin));
        let _ = std::fs::remove_file(partial(&idx));
    }
    let (documents, bytes) = result?;
    // The index last: a complete .idx only ever names a complete .bin.
    commit(&bin)?;
    commit(&idx)?;
    Ok((documents, bytes))
}

fn write_files(
    dataset: &PackedDataset,
    code: u8,
    bin: &Path,
    idx: &Path,
    progress: &Progress,
) -> anyhow::Result<(u64, u64)> {
    let create = |path: &Path| {
        std::fs::File::create(path)
            .map(|f| std::io::BufWriter::with_capacity(1 << 20, f))
            .with_context(|| format!("cannot create {}", path.display()))
    };
    let m = dataset.manifest();
    let mut out = create(bin)?;
    let mut lengths: Vec<u64> = Vec::new();
    let mut current = 0u64;
    let mut bytes = 0u64;
    for index in 0..dataset.num_windows() {
        report_progress(progress, index, dataset.num_windows());
        let window = dataset.window(index)?;
        let real = window.real_tokens as usize;
        let raw = &window.tokens.as_bytes()[..real * m.dtype.size_bytes()];
        out.write_all(raw)
            .with_context(|| format!("cannot write {}", bin.display()))?;
        bytes += raw.len() as u64;
        let mut at = 0u64;
        for &start in window.doc_starts {
            let start = u64::from(start);
            current += start - at;
            at = start;
            if current > 0 {
                lengths.push(current);
            }
            current = 0;
        }
        current += real as u64 - at;
    }
    if current > 0 {
        lengths.push(current);
    }
    out.flush()
        .and_then(|()| out.get_ref().sync_all())
        .with_context(|| format!("cannot write {}", bin.display()))?;

    let token_bytes = dataset.manifest().dtype.size_bytes() as u64;
    let mut index = Vec::with_capacity(34 + lengths.len() * 20 + 8);
    index.extend_from_slice(MAGIC);
    index.extend_from_slice(&VERSION.to_le_bytes());
    index.push(code);
    index.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
    index.extend_from_slice(&(lengths.len() as u64 + 1).to_le_bytes());
    for (i, &len) in lengths.iter().enumerate() {
        let len = i32::try_from(len).with_context(|| {
            format!("document {i} has {len} tokens, more than Megatron's int32 lengths hold")
        })?;
        index.extend_from_slice(&len.to_le_bytes());
    }
    let mut pointer = 0u64;
    for &len in &lengths {
        index.extend_from_slice(&pointer.to_le_bytes());
        pointer += len * token_bytes;
    }
    for document in 0..=lengths.len() as u64 {
        index.extend_from_slice(&document.to_le_bytes());
    }
    let mut out = create(idx)?;
    out.write_all(&index)
        .and_then(|()| out.flush())
        .and_then(|()| out.get_ref().sync_all())
        .with_context(|| format!("cannot write {}", idx.display()))?;
    Ok((lengths.len() as u64, bytes))
}
