//! `dsprep export DIR --to megatron|hf-datasets --out OUT`: a packed directory in the formats
//! other trainers read unchanged — Megatron-LM/NeMo's `IndexedDataset` (`megatron.rs`) and a
//! Hugging Face `datasets` directory for `load_from_disk` (`hf_datasets.rs`, what the NeuronX
//! Distributed Llama examples read). The directory is checked with `dsprep verify` first; the
//! output is written beside its final name and renamed into place only when complete.

mod hf_datasets;
mod megatron;

use crate::progress::Progress;
use crate::verify::verify;
use anyhow::{Context, bail};
use dsprep_client::PackedDataset;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// `OUT.bin` + `OUT.idx`: Megatron's `IndexedDataset` (MMIDIDX v1), one sequence per document.
    Megatron,
    /// A `datasets.load_from_disk` directory: `input_ids`, `attention_mask`, `labels` rows of
    /// `seq_len` tokens cut from the stream in order.
    HfDatasets,
}

pub struct ExportOptions {
    pub dir: PathBuf,
    pub to: Target,
    pub out: PathBuf,
    pub force: bool,
    /// Show progress (a spinner on a terminal, a periodic log line otherwise).
    pub progress: bool,
}

/// What an export wrote.
pub struct ExportReport {
    /// The files or directory written.
    pub written: Vec<PathBuf>,
    /// Documents (Megatron) or rows (datasets).
    pub records: u64,
    pub bytes: u64,
    pub seconds: f64,
}

pub fn export(options: &ExportOptions) -> anyhow::Result<ExportReport> {
    let began = Instant::now();
    verify(&options.dir).with_context(|| {
        format!(
            "{} fails `dsprep verify`; nothing was exported",
            options.dir.display()
        )
    })?;
    let dataset = PackedDataset::open(&options.dir)?;
    let finals = match options.to {
        Target::Megatron => megatron::outputs(&options.out),
        Target::HfDatasets => vec![options.out.clone()],
    };
    for path in &finals {
        if path.exists() && !options.force {
            bail!(
                "{} exists: pass --force to replace it (nothing was written)",
                path.display()
            );
        }
    }
    let progress = Progress::new("export", options.progress);
    let written = match options.to {
        Target::Megatron => megatron::write(&dataset, &options.out, &progress),
        Target::HfDatasets => hf_datasets::write(&dataset, &options.out, &progress),
    };
    progress.finish();
    let (records, bytes) = written?;
    Ok(ExportReport {
        written: finals,
        records,
        bytes,
        seconds: began.elapsed().as_secs_f64(),
    })
}

/// `path` with `.partial` appended to its file name: where a file is written before it is
/// renamed into place.
fn partial(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// Move finished `partial(path)` to `path`, replacing what was there (a file or a directory).
fn commit(path: &Path) -> anyhow::Result<()> {
    let from = partial(path);
    if path.is_dir() {
        std::fs::remove_dir_all(path)
            .with_context(|| format!("cannot replace {}", path.display()))?;
    }
    std::fs::rename(&from, path)
        .with_context(|| format!("cannot rename {} to {}", from.display(), path.display()))
}

/// Windows between progress updates.
const PROGRESS_EVERY_WINDOWS: u64 = 1024;

/// Report that `done` of `total` windows are exported.
fn report_progress(progress: &Progress, done: u64, total: u64) {
    if done.is_multiple_of(PROGRESS_EVERY_WINDOWS) {
        progress.update(|| format!("{done} of {total} windows"));
    }
}
