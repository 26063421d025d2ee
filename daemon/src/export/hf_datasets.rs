//! A Hugging Face `datasets` directory, as `Dataset.save_to_disk` writes it and
//! `datasets.load_from_disk` reads it: `data-00000-of-00001.arrow` (Arrow IPC stream), then
//! `dataset_info.json` and `state.json`. Rows are what `run_clm`-style `group_texts` (and the
//! NeuronX Distributed Llama examples' `get_dataset.py`) produce: the token stream cut into
//! blocks of `seq_len` in stream order, `input_ids` and `labels` the same block (the model shifts
//! them), `attention_mask` all ones. The stream is the packed windows concatenated; the last
//! partial block is left out. The features are those of the Arrow schema (`int32` ids, `int8`
//! mask).
//!
//! A padded pack (`best_fit`, format 5) keeps its windows: one row per window, its first
//! `seq_len` tokens, `attention_mask` 0 and `labels` -100 on the padding (models shift `labels`
//! themselves, so a window's last token, a label only, is not in its row). No document is cut
//! across rows.

use super::{commit, partial, report_progress};
use crate::progress::Progress;
use anyhow::{Context, anyhow};
use arrow_array::builder::{Int8Builder, Int32Builder, ListBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use dsprep_client::PackedDataset;
use std::path::Path;
use std::sync::Arc;

const DATA_FILE: &str = "data-00000-of-00001.arrow";
/// Rows per Arrow record batch (what memory holds at once).
const ROWS_PER_BATCH: usize = 1024;
/// What torch's cross-entropy (and `transformers`' models) ignore in `labels`.
const IGNORE_INDEX: i32 = -100;

/// Write the directory `out`; returns (rows, bytes of the Arrow file).
pub fn write(
    dataset: &PackedDataset,
    out: &Path,
    progress: &Progress,
) -> anyhow::Result<(u64, u64)> {
    let tmp = partial(out);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot clear {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let result = write_dir(dataset, &tmp, progress);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    let written = result?;
    commit(out)?;
    Ok(written)
}

fn write_dir(
    dataset: &PackedDataset,
    dir: &Path,
    progress: &Progress,
) -> anyhow::Result<(u64, u64)> {
    let m = dataset.manifest();
    let seq_len = m.seq_len as usize;
    let path = dir.join(DATA_FILE);
    let file = std::fs::File::create(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let mut rows = Rows::new(seq_len);
    let schema = rows.finish_batch()?.schema();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(
        std::io::BufWriter::with_capacity(1 << 20, file),
        &schema,
    )
    .with_context(|| format!("cannot write {}", path.display()))?;
    let mut block: Vec<i32> = Vec::with_capacity(seq_len);
    let mut total = 0u64;
    let padded = m.real_tokens.is_some();
    for index in 0..dataset.num_windows() {
        report_progress(progress, index, dataset.num_windows());
        let window = dataset.window(index)?;
        let take = if padded { seq_len } else { window.tokens.len() };
        for i in 0..take {
            let id = window.tokens.get(i).unwrap_or(0);
            block.push(i32::try_from(id).map_err(|_| {
                anyhow!("window {index}: token id {id} does not fit the datasets' int32 ids")
            })?);
            if block.len() == seq_len {
                let real = match padded {
                    true => (window.real_tokens as usize).min(seq_len),
                    false => seq_len,
                };
                rows.push(&block, real);
                block.clear();
                total += 1;
                if rows.len() == ROWS_PER_BATCH {
                    writer.write(&rows.finish_batch()?)?;
                }
            }
        }
    }
    if rows.len() > 0 {
        writer.write(&rows.finish_batch()?)?;
    }
    writer
        .finish()
        .with_context(|| format!("cannot write {}", path.display()))?;
    let file = writer
        .into_inner()
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    file.into_inner()
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?
        .sync_all()
        .with_context(|| format!("cannot write {}", path.display()))?;
    let bytes = std::fs::metadata(&path)?.len();

    let info = serde_json::json!({
        "description": format!(
            "dsprep export of a packed directory: recipe {}, {}",
            m.recipe_hash,
            match padded {
                true => format!("one row per window: its first {seq_len} tokens, padding masked"),
                false => format!("blocks of {seq_len} tokens in stream order"),
            }
        ),
        "citation": "",
        "homepage": "",
        "license": "",
    });
    let state = serde_json::json!({
        "_data_files": [{"filename": DATA_FILE}],
        "_fingerprint": &m.recipe_hash[..16.min(m.recipe_hash.len())],
        "_format_columns": null,
        "_format_kwargs": {},
        "_format_type": null,
        "_output_all_columns": false,
        "_split": null,
    });
    for (name, value) in [("dataset_info.json", info), ("state.json", state)] {
        let text = serde_json::to_string_pretty(&value)?;
        std::fs::write(dir.join(name), text + "\n")
            .with_context(|| format!("cannot write {}", dir.join(name).display()))?;
    }
    Ok((total, bytes))
}

/// The columns of the rows not yet written.
struct Rows {
    seq_len: usize,
    input_ids: ListBuilder<Int32Builder>,
    attention_mask: ListBuilder<Int8Builder>,
    labels: ListBuilder<Int32Builder>,
    len: usize,
}

impl Rows {
    fn new(seq_len: usize) -> Self {
        let ids = || ListBuilder::new(Int32Builder::with_capacity(seq_len * ROWS_PER_BATCH));
        Rows {
            seq_len,
            input_ids: ids(),
            attention_mask: ListBuilder::new(Int8Builder::with_capacity(seq_len * ROWS_PER_BATCH)),
            labels: ids(),
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// A row of `seq_len` ids whose first `real` are tokens and the rest padding.
    fn push(&mut self, block: &[i32], real: usize) {
        self.input_ids.values().append_slice(block);
        self.input_ids.append(true);
        let labels = self.labels.values();
        labels.append_slice(&block[..real]);
        for _ in real..self.seq_len {
            labels.append_value(IGNORE_INDEX);
        }
        self.labels.append(true);
        let mask = self.attention_mask.values();
        for i in 0..self.seq_len {
            mask.append_value(i8::from(i < real));
        }
        self.attention_mask.append(true);
        self.len += 1;
    }

    /// The rows so far as a record batch (empty columns keep the schema), and a fresh start.
    fn finish_batch(&mut self) -> anyhow::Result<RecordBatch> {
        self.len = 0;
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("input_ids", Arc::new(self.input_ids.finish())),
            ("attention_mask", Arc::new(self.attention_mask.finish())),
            ("labels", Arc::new(self.labels.finish())),
        ];
        RecordBatch::try_from_iter(columns).context("cannot build an Arrow record batch")
    }
}
