//! Writes a packed directory: token shards, the document-start index, the documents' sources
//! and, last, the manifest.
//!
//! Everything goes into `<out>.partial` beside the destination; only a complete, fsynced
//! directory is renamed to `<out>`. A failed or interrupted pack therefore never leaves a
//! directory that looks complete (no `manifest.json` under the final name). A lock on
//! `<out>.partial/.lock` keeps two packs from writing it at once. An interrupted pack leaves
//! its checkpoint there, and the next pack to `<out>` continues from it ([`PackWriter::resume`]).

use super::failure::leave_partial;
use super::ledger::PackLedger;
use super::token_shards::{ShardFiles, ShardHashes, StreamChain, TokenShards};
use crate::files::{HashingWriter, LockError, SyncedWriter, sha256_prefix, try_lock_file};
use anyhow::{Context, bail};
use dsprep_client::chain;
use dsprep_client::format::{self, ChainMark, Dtype, Manifest, OutputFile};
use dsprep_mixers::PackedWindow;
use dsprep_mixers::ledger::PhaseLedger;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The checkpoint's name inside the partial directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.ckpt";
const LOCK_FILE: &str = ".lock";

/// How far the files in the partial directory go, as of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterProgress {
    pub num_windows: u64,
    pub num_doc_starts: u64,
    /// Closed token shards (the open one is cut back to the windows after them).
    pub closed_shards: Vec<OutputFile>,
    /// The stream chain after `num_windows` (hex); absent in checkpoints of older versions,
    /// which are then not continued.
    #[serde(default)]
    pub chain: Option<String>,
    /// The chain after each closed shard.
    #[serde(default)]
    pub chain_marks: Vec<ChainMark>,
    /// Whether the directory holds the documents' sources (format 3); checkpoints of older
    /// versions do not, and are not continued.
    #[serde(default)]
    pub doc_sources: bool,
    /// The phase ledger of the windows written (format 4); absent in checkpoints of older
    /// versions, which are not continued.
    #[serde(default)]
    pub ledger: Option<PhaseLedger>,
    /// Whether the directory holds `real_tokens.u32` (format 5: `best_fit`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub padded: bool,
    /// Whether it holds `doc_positions.u64` (`best_fit` with phases).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub positions: bool,
}

/// The optional columns a pack writes besides tokens, document starts and sources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Columns {
    /// `real_tokens.u32`: the windows may end in padding (`best_fit`: format 5).
    pub padded: bool,
    /// `doc_positions.u64`: each start's mixing position. Written by `best_fit` with
    /// `[[mix.phase]]`, whose windows do not keep the mixing order the phase ledger counts by
    /// (`dsprep_mixers::ledger`); a pack that keeps it (`concat`), or has one phase, needs none.
    pub positions: bool,
}

impl Columns {
    pub fn of(recipe: &dsprep_mixers::recipe::Recipe) -> Columns {
        Columns::of_lineage(std::slice::from_ref(recipe))
    }

    /// A lineage's (its segments' recipes in order, the last one's ledger): padded when any
    /// segment pads (format 7 when not all do), with mixing positions when the last recipe has
    /// phases.
    pub fn of_lineage(recipes: &[dsprep_mixers::recipe::Recipe]) -> Columns {
        let padded = recipes.iter().any(|r| r.packing.pads());
        let phased = recipes.last().is_some_and(|r| !r.mix.phases.is_empty());
        Columns {
            padded,
            positions: padded && phased,
        }
    }
}

/// An existing `out` is an error unless `force` (then [`PackWriter::finish`] replaces it).
pub fn refuse_existing(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.exists() && !force {
        bail!(
            "output {} already exists (pass --force to replace it)",
            out.display()
        );
    }
    Ok(())
}

/// Whether the partial directory `tmp` holds a whole output: its manifest written and synced,
/// and its checkpoint and lock removed (what [`PackWriter::finish`] does last before the rename).
pub fn is_whole(tmp: &Path) -> bool {
    tmp.join(format::MANIFEST_FILE).is_file()
        && !tmp.join(CHECKPOINT_FILE).exists()
        && !tmp.join(LOCK_FILE).exists()
}

/// `<out>.partial`, beside `out`.
pub fn partial_dir(out: &Path) -> anyhow::Result<PathBuf> {
    sibling_dir(out, "partial")
}

/// `<out>.<suffix>`, beside `out`.
pub fn sibling_dir(out: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    let name = out
        .file_name()
        .with_context(|| format!("output {} has no directory name", out.display()))?;
    Ok(out.with_file_name(format!("{}.{suffix}", name.to_string_lossy())))
}

pub struct PackWriter {
    out: PathBuf,
    tmp: PathBuf,
    /// Held for the writer's life: another pack to the same output fails to take it.
    _lock: std::fs::File,
    windows_per_shard: u64,
    /// The token shards and the stream chain, written on their own thread.
    tokens: TokenShards,
    doc_starts: HashingWriter,
    doc_starts_offsets: HashingWriter,
    doc_sources: HashingWriter,
    lead_sources: HashingWriter,
    /// Format 5 (`best_fit`): each window's tokens before its padding.
    real_tokens: Option<HashingWriter>,
    /// `best_fit` with phases: each start's mixing position.
    doc_positions: Option<HashingWriter>,
    num_windows: u64,
    num_doc_starts: u64,
    bytes: Vec<u8>,
    /// The manifest's phase ledger, counted window by window (not in a lane's own directory).
    ledger: Option<PackLedger>,
}

impl PackWriter {
    /// Start a packed directory for `out` (check [`refuse_existing`] first: an existing `out` is
    /// replaced only once the new one is complete), counting its windows into `ledger`;
    /// `columns`: whether the windows may end in padding (`best_fit`: format 5,
    /// `real_tokens.u32`) and whether their starts' mixing positions are kept.
    ///
    /// A failure once the partial directory is this pack's (its lock taken) removes it, and the
    /// error's last line says so ([`super::failure`]).
    pub fn create(
        out: &Path,
        dtype: Dtype,
        windows_per_shard: u64,
        ledger: Option<PackLedger>,
        columns: Columns,
    ) -> anyhow::Result<Self> {
        let tmp = partial_dir(out)?;
        let lock = lock_partial(&tmp)?;
        Self::create_locked(
            out,
            tmp.clone(),
            lock,
            dtype,
            windows_per_shard,
            ledger,
            columns,
        )
        .map_err(|e| leave_partial(&tmp, None, e))
    }

    fn create_locked(
        out: &Path,
        tmp: PathBuf,
        lock: std::fs::File,
        dtype: Dtype,
        windows_per_shard: u64,
        ledger: Option<PackLedger>,
        columns: Columns,
    ) -> anyhow::Result<Self> {
        for entry in
            std::fs::read_dir(&tmp).with_context(|| format!("cannot list {}", tmp.display()))?
        {
            let path = entry?.path();
            if path.file_name().is_some_and(|n| n != LOCK_FILE) {
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot clear {}", path.display()))?;
            }
        }
        let create = |file: &str| {
            HashingWriter::create(&tmp.join(file))
                .with_context(|| format!("cannot create {}", tmp.join(file).display()))
        };
        let doc_starts = create(format::DOC_STARTS_FILE)?;
        let mut doc_starts_offsets = create(format::DOC_STARTS_OFFSETS_FILE)?;
        doc_starts_offsets.write_all(&0u64.to_le_bytes())?;
        let doc_sources = create(format::DOC_SOURCES_FILE)?;
        let lead_sources = create(format::LEAD_SOURCES_FILE)?;
        let real_tokens = match columns.padded {
            true => Some(create(format::REAL_TOKENS_FILE)?),
            false => None,
        };
        let doc_positions = match columns.positions {
            true => Some(create(format::DOC_POSITIONS_FILE)?),
            false => None,
        };
        let windows_per_shard = windows_per_shard.max(1);
        Ok(Self {
            out: out.to_path_buf(),
            tokens: TokenShards::start(
                ShardFiles::new(tmp.clone(), windows_per_shard),
                ShardHashes::new(windows_per_shard),
                StreamChain::new(windows_per_shard),
                dtype,
            ),
            tmp,
            _lock: lock,
            windows_per_shard,
            doc_starts,
            doc_starts_offsets,
            doc_sources,
            lead_sources,
            real_tokens,
            doc_positions,
            num_windows: 0,
            num_doc_starts: 0,
            bytes: Vec::new(),
            ledger,
        })
    }

    /// Add a window. An error writing its tokens is returned by the next [`Self::sync`] or
    /// [`Self::finish`] (the token shards are written on their own thread).
    pub fn write_window(&mut self, window: &PackedWindow) -> anyhow::Result<()> {
        self.tokens.push(&window.tokens)?;
        self.bytes.clear();
        self.bytes
            .extend(window.doc_starts.iter().flat_map(|s| s.to_le_bytes()));
        self.doc_starts
            .write_all(&self.bytes)
            .context("cannot write the document index")?;
        self.num_doc_starts += window.doc_starts.len() as u64;
        self.doc_starts_offsets
            .write_all(&self.num_doc_starts.to_le_bytes())
            .context("cannot write the document index")?;
        self.bytes.clear();
        self.bytes
            .extend(window.doc_sources.iter().flat_map(|s| s.to_le_bytes()));
        self.doc_sources
            .write_all(&self.bytes)
            .context("cannot write the document sources")?;
        self.lead_sources
            .write_all(&window.lead_source.to_le_bytes())
            .context("cannot write the document sources")?;
        match &mut self.real_tokens {
            Some(file) => file
                .write_all(&window.real_tokens.to_le_bytes())
                .context("cannot write the real-token counts")?,
            None if window.real_tokens as usize != window.tokens.len() => {
                bail!("internal error: a padded window for a directory without padding")
            }
            None => {}
        }
        if let Some(file) = &mut self.doc_positions {
            // A window that keeps the mixing order carries none: its own places are its starts'.
            let at = self.num_windows * window.tokens.len() as u64;
            self.bytes.clear();
            for (k, &start) in window.doc_starts.iter().enumerate() {
                let position =
                    (window.doc_positions.get(k).copied()).unwrap_or(at + u64::from(start));
                self.bytes.extend(position.to_le_bytes());
            }
            file.write_all(&self.bytes)
                .context("cannot write the documents' mixing positions")?;
        }
        if let Some(ledger) = &mut self.ledger {
            ledger.add(self.num_windows, window);
        }
        self.num_windows += 1;
        Ok(())
    }

    pub fn num_windows(&self) -> u64 {
        self.num_windows
    }

    /// The output directory this writer finishes into.
    pub fn out(&self) -> &Path {
        &self.out
    }

    pub fn partial_dir(&self) -> &Path {
        &self.tmp
    }

    /// Flush and fsync every file, and say how far they go: what a checkpoint records.
    pub fn sync(&mut self) -> anyhow::Result<WriterProgress> {
        let context = || format!("cannot sync {}", self.tmp.display());
        let tokens = self.tokens.sync()?;
        self.doc_starts.sync().with_context(context)?;
        self.doc_starts_offsets.sync().with_context(context)?;
        self.doc_sources.sync().with_context(context)?;
        self.lead_sources.sync().with_context(context)?;
        for file in [&mut self.real_tokens, &mut self.doc_positions]
            .into_iter()
            .flatten()
        {
            file.sync().with_context(context)?;
        }
        Ok(WriterProgress {
            num_windows: self.num_windows,
            num_doc_starts: self.num_doc_starts,
            closed_shards: tokens.closed,
            chain: Some(chain::to_hex(&tokens.chain)),
            chain_marks: tokens.chain_marks,
            doc_sources: true,
            ledger: self.ledger.as_ref().map(|l| l.counts().clone()),
            padded: self.real_tokens.is_some(),
            positions: self.doc_positions.is_some(),
        })
    }

    /// Continue the partial directory of `out` from a checkpoint's `progress`: files are cut
    /// back to it (an interrupted pack may have written past its checkpoint) and hashed again;
    /// `ledger` continues from the checkpoint's counts. A failure once the lock is taken keeps
    /// the directory (it holds the checkpoint) and says so last.
    pub fn resume(
        out: &Path,
        dtype: Dtype,
        window_tokens: u64,
        windows_per_shard: u64,
        progress: &WriterProgress,
        ledger: Option<PackLedger>,
    ) -> anyhow::Result<Self> {
        let tmp = partial_dir(out)?;
        let lock = lock_partial(&tmp)?;
        let windows = progress.num_windows;
        Self::resume_locked(
            out,
            tmp.clone(),
            lock,
            dtype,
            window_tokens,
            windows_per_shard,
            progress,
        )
        .map(|writer| Self { ledger, ..writer })
        .map_err(|e| leave_partial(&tmp, Some(windows), e))
    }

    fn resume_locked(
        out: &Path,
        tmp: PathBuf,
        lock: std::fs::File,
        dtype: Dtype,
        window_tokens: u64,
        windows_per_shard: u64,
        progress: &WriterProgress,
    ) -> anyhow::Result<Self> {
        let wps = windows_per_shard.max(1);
        let closed = progress.closed_shards.len() as u64;
        let full = closed * wps;
        if progress.num_windows < full || progress.num_windows - full >= wps {
            bail!(
                "{}: the checkpoint's {} windows do not match its {closed} closed shards of {wps}",
                tmp.display(),
                progress.num_windows
            );
        }
        let in_shard = progress.num_windows - full;
        let Some(chain_at) = progress.chain.as_deref().and_then(chain::from_hex) else {
            bail!(
                "{}: the checkpoint does not hold the stream chain (an older dsprep wrote it)",
                tmp.display()
            );
        };
        if !progress.doc_sources {
            bail!(
                "{}: the checkpoint's directory has no document sources (an older dsprep wrote it)",
                tmp.display()
            );
        }
        let window_bytes = window_tokens * dtype.size_bytes() as u64;
        let reopen = |file: &str, keep: u64| {
            HashingWriter::append_after(&tmp.join(file), keep)
                .with_context(|| format!("cannot continue {}", tmp.join(file).display()))
        };
        // The open shard: continued by the files' thread, its kept bytes hashed again for the
        // hashes' thread.
        let (shard, shard_hash) = if in_shard > 0 {
            let path = tmp.join(format::shard_file_name(progress.closed_shards.len()));
            let keep = in_shard * window_bytes;
            let continue_error = || format!("cannot continue {}", path.display());
            (
                Some(SyncedWriter::append_after(&path, keep).with_context(continue_error)?),
                Some(sha256_prefix(&path, keep).with_context(continue_error)?),
            )
        } else {
            (None, None)
        };
        let mut shards = progress.closed_shards.clone();
        if shard.is_some() {
            shards.push(OutputFile {
                file: format::shard_file_name(progress.closed_shards.len()),
                size_bytes: 0,
                sha256: String::new(),
            });
        }
        // Files after the open shard were never part of the checkpoint.
        let mut next = shards.len();
        while tmp.join(format::shard_file_name(next)).exists() {
            std::fs::remove_file(tmp.join(format::shard_file_name(next)))?;
            next += 1;
        }
        let files = ShardFiles {
            dir: tmp.clone(),
            windows_per_shard: wps,
            open: shard,
            windows_in_shard: in_shard,
            shards,
        };
        let hashes = ShardHashes {
            windows_per_shard: wps,
            open: shard_hash,
            windows_in_shard: in_shard,
            closed: progress
                .closed_shards
                .iter()
                .map(|s| s.sha256.clone())
                .collect(),
        };
        let chain = StreamChain {
            windows_per_shard: wps,
            num_windows: progress.num_windows,
            chain: chain_at,
            chain_marks: progress.chain_marks.clone(),
        };
        Ok(Self {
            out: out.to_path_buf(),
            tokens: TokenShards::start(files, hashes, chain, dtype),
            doc_starts: reopen(format::DOC_STARTS_FILE, progress.num_doc_starts * 4)?,
            doc_starts_offsets: reopen(
                format::DOC_STARTS_OFFSETS_FILE,
                (progress.num_windows + 1) * 8,
            )?,
            doc_sources: reopen(format::DOC_SOURCES_FILE, progress.num_doc_starts * 2)?,
            lead_sources: reopen(format::LEAD_SOURCES_FILE, progress.num_windows * 2)?,
            real_tokens: match progress.padded {
                true => Some(reopen(format::REAL_TOKENS_FILE, progress.num_windows * 4)?),
                false => None,
            },
            doc_positions: match progress.positions {
                true => Some(reopen(
                    format::DOC_POSITIONS_FILE,
                    progress.num_doc_starts * 8,
                )?),
                false => None,
            },
            tmp,
            _lock: lock,
            windows_per_shard: wps,
            num_windows: progress.num_windows,
            num_doc_starts: progress.num_doc_starts,
            bytes: Vec::new(),
            ledger: None, // the caller's, set by `resume`
        })
    }

    /// Copy the tokenizer into the directory, so it is self-describing.
    pub fn add_tokenizer(&self, json: &[u8]) -> anyhow::Result<()> {
        std::fs::write(self.tmp.join(format::TOKENIZER_FILE), json)
            .context("cannot write tokenizer.json")
    }

    /// Add a small file beside the packed data (written with the directory, renamed with it).
    pub fn add_file(&self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        std::fs::write(self.tmp.join(name), bytes).with_context(|| format!("cannot write {name}"))
    }

    /// Close every file, fill the output part of `manifest`, write it, and move the directory to
    /// its final name.
    pub fn finish(self, mut manifest: Manifest) -> anyhow::Result<Manifest> {
        let tokens = self.tokens.finish()?;
        let (size_bytes, sha256) = self
            .doc_starts
            .finish()
            .context("cannot finish the document index")?;
        manifest.doc_starts = OutputFile {
            file: format::DOC_STARTS_FILE.into(),
            size_bytes,
            sha256,
        };
        let (size_bytes, sha256) = self
            .doc_starts_offsets
            .finish()
            .context("cannot finish the document index")?;
        manifest.doc_starts_offsets = OutputFile {
            file: format::DOC_STARTS_OFFSETS_FILE.into(),
            size_bytes,
            sha256,
        };
        for (writer, name, field) in [
            (
                self.doc_sources,
                format::DOC_SOURCES_FILE,
                &mut manifest.doc_sources,
            ),
            (
                self.lead_sources,
                format::LEAD_SOURCES_FILE,
                &mut manifest.lead_sources,
            ),
        ] {
            let (size_bytes, sha256) = writer
                .finish()
                .context("cannot finish the document sources")?;
            *field = Some(OutputFile {
                file: name.into(),
                size_bytes,
                sha256,
            });
        }
        manifest.real_tokens = match self.real_tokens {
            Some(writer) => {
                let (size_bytes, sha256) = writer
                    .finish()
                    .context("cannot finish the real-token counts")?;
                Some(OutputFile {
                    file: format::REAL_TOKENS_FILE.into(),
                    size_bytes,
                    sha256,
                })
            }
            None => None,
        };
        manifest.doc_positions = match self.doc_positions {
            Some(writer) => {
                let (size_bytes, sha256) = writer
                    .finish()
                    .context("cannot finish the documents' mixing positions")?;
                Some(OutputFile {
                    file: format::DOC_POSITIONS_FILE.into(),
                    size_bytes,
                    sha256,
                })
            }
            None => None,
        };
        // The oldest version that holds the pack: a reader of 5 would count a best_fit pack's
        // phases by window, not by the mixing positions only version 6 has; a reader of 6 would
        // hold a lineage's concat windows to the padded windows' rules, or pad with one id.
        let per_segment = (manifest.lineage.iter().flatten()).any(|s| s.packing.is_some());
        manifest.format_version =
            match (per_segment, &manifest.doc_positions, &manifest.real_tokens) {
                (true, _, _) => format::FORMAT_VERSION,
                (false, Some(_), _) => format::POSITIONS_FORMAT_VERSION,
                (false, None, Some(_)) => format::PADDED_FORMAT_VERSION,
                (false, None, None) => format::UNPADDED_FORMAT_VERSION,
            };
        manifest.shards = tokens.closed;
        manifest.num_windows = self.num_windows;
        manifest.num_doc_starts = self.num_doc_starts;
        manifest.windows_per_shard = self.windows_per_shard;
        manifest.chain = tokens.chain_marks;
        manifest.phases = self.ledger.map(|l| l.stats()).unwrap_or_default();
        let mut json =
            serde_json::to_vec_pretty(&manifest).context("cannot encode the manifest")?;
        json.push(b'\n');
        let manifest_path = self.tmp.join(format::MANIFEST_FILE);
        let mut writer =
            HashingWriter::create(&manifest_path).context("cannot create manifest.json")?;
        writer.write_all(&json)?;
        writer.finish().context("cannot write manifest.json")?;
        for leftover in [CHECKPOINT_FILE, LOCK_FILE] {
            let path = self.tmp.join(leftover);
            if path.exists() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot remove {}", path.display()))?;
            }
        }
        // An output of the same name is moved aside, replaced, then removed.
        let replaced = match self.out.exists() {
            true => {
                let old = self.out.with_file_name(format!(
                    "{}.replaced-{}",
                    self.out.file_name().unwrap_or_default().to_string_lossy(),
                    std::process::id()
                ));
                std::fs::rename(&self.out, &old)
                    .with_context(|| format!("cannot move the old {} aside", self.out.display()))?;
                Some(old)
            }
            false => None,
        };
        std::fs::rename(&self.tmp, &self.out).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.tmp.display(),
                self.out.display()
            )
        })?;
        if let Some(old) = replaced {
            std::fs::remove_dir_all(&old)
                .with_context(|| format!("cannot remove the old output {}", old.display()))?;
        }
        if let Some(parent) = self.out.parent().filter(|p| !p.as_os_str().is_empty())
            && let Ok(dir) = std::fs::File::open(parent)
        {
            let _ = dir.sync_all(); // make the rename durable where the platform allows
        }
        Ok(manifest)
    }
}

/// Whether a live process holds the lock of the partial directory `tmp` (a pack writing it),
/// asked without creating anything: a directory without its lock file is held by no one. The
/// lock is taken and let go at once when free, so a pack starting that instant may be refused.
pub fn partial_held(tmp: &Path) -> anyhow::Result<bool> {
    let path = tmp.join(LOCK_FILE);
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
    };
    match file.try_lock() {
        Ok(()) => Ok(false),
        Err(std::fs::TryLockError::WouldBlock) => Ok(true),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot probe the lock {}", path.display()))
        }
    }
}

/// Create `tmp` if needed and take its lock, or say which pack holds it. A lock held for less
/// than 250 ms (a [`partial_held`] probe) is waited for.
fn lock_partial(tmp: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let path = tmp.join(LOCK_FILE);
    let mut tries = 0;
    let taken = loop {
        match try_lock_file(&path) {
            Err(LockError::Held) if tries < 5 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            taken => break taken,
        }
    };
    match taken {
        Ok(file) => Ok(file),
        Err(LockError::Held) => bail!(
            "another dsprep pack is writing {} (it holds {})",
            tmp.display(),
            path.display()
        ),
        Err(LockError::Io(e)) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
    }
}
