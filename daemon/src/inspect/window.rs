//! `dsprep inspect DIR --window N`: the decoded text of one packed window, with a marker where
//! each document begins, using the tokenizer copy inside the directory.

use anyhow::{Context, anyhow};
use dsprep_client::PackedDataset;
use std::fmt::Write;
use std::path::Path;
use tokenizers::Tokenizer;

/// The text of window `index`, split at document starts.
pub fn inspect_window(dir: &Path, index: u64) -> anyhow::Result<String> {
    let dataset = PackedDataset::open(dir)
        .with_context(|| format!("{} is not a valid packed directory", dir.display()))?;
    let m = dataset.manifest();
    let window = dataset.window(index)?;
    let tokenizer_path = dir.join(&m.tokenizer.file);
    let tokenizer = Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| anyhow!("{}: {e}", tokenizer_path.display()))?;
    let tokens = window.tokens.to_vec();
    let mut cuts: Vec<usize> = window.doc_starts.iter().map(|&s| s as usize).collect();
    if cuts.first() != Some(&0) {
        cuts.insert(0, 0);
    }
    cuts.push(tokens.len());
    let mut out = String::new();
    writeln!(
        out,
        "window {index} of {} ({} tokens, {} document start(s))",
        m.num_windows,
        tokens.len(),
        window.doc_starts.len()
    )?;
    for pair in cuts.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let marker = if window.doc_starts.contains(&(from as u32)) {
            "document starts"
        } else {
            "continues from the previous window"
        };
        writeln!(out, "──── tokens {from}..{to}: {marker} ────")?;
        let text = tokenizer
            .decode(&tokens[from..to], false)
            .map_err(|e| anyhow!("cannot decode window {index}: {e}"))?;
        writeln!(out, "{text}")?;
    }
    Ok(out)
}
