//! Memory-mapped reader of a `dsprep pack` output directory.
//!
//! Opening checks the manifest and that every file has the size it promises (cheap); `dsprep
//! verify` checks the checksums. Windows and batches are slices of the maps: nothing is copied.

use crate::batch::{Batch, BatchLayout, cu_seqlens, masked_labels, token_sources};
use crate::format::{self, Dtype, Manifest, OutputFile};
use memmap2::Mmap;
use std::fs::File;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a dsprep manifest: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error(
        "{path}: format version {found} is not supported (this reader reads versions {} to {})",
        format::OLDEST_FORMAT_VERSION,
        format::FORMAT_VERSION
    )]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: is {actual} bytes, the manifest says {expected}")]
    Size {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("window {index} does not exist: the dataset has {num_windows} windows")]
    WindowOutOfRange { index: u64, num_windows: u64 },
    #[error("rank {rank} is not below world size {world_size}")]
    RankOutOfRange { rank: u32, world_size: u32 },
    #[error(
        "step {step} does not exist: {num_steps} steps at world size {world_size} × micro batch {micro_batch}"
    )]
    StepOutOfRange {
        step: u64,
        num_steps: u64,
        world_size: u32,
        micro_batch: u32,
    },
    #[error("world size and micro batch must be at least 1")]
    EmptyLayout,
}

/// A window's token ids, in the dtype they are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSlice<'a> {
    U16(&'a [u16]),
    U32(&'a [u32]),
}

impl TokenSlice<'_> {
    pub fn len(&self) -> usize {
        match self {
            TokenSlice::U16(s) => s.len(),
            TokenSlice::U32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<u32> {
        match self {
            TokenSlice::U16(s) => s.get(i).map(|&t| u32::from(t)),
            TokenSlice::U32(s) => s.get(i).copied(),
        }
    }

    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenSlice::U16(s) => s.iter().map(|&t| u32::from(t)).collect(),
            TokenSlice::U32(s) => s.to_vec(),
        }
    }

    /// The raw little-endian bytes, as stored.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            TokenSlice::U16(s) => bytemuck::cast_slice(s),
            TokenSlice::U32(s) => bytemuck::cast_slice(s),
        }
    }
}

/// One packed window: `seq_len + 1` tokens, where documents start in it, and which source each
/// came from.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a> {
    pub index: u64,
    pub tokens: TokenSlice<'a>,
    pub doc_starts: &'a [u32],
    /// The recipe source index of each document start (`None` in a pack of format 1 or 2).
    pub doc_sources: Option<&'a [u16]>,
    /// The source of the document that holds the first token (`None` in format 1 or 2).
    pub lead_source: Option<u16>,
    /// Tokens before the padding: `tokens[real_tokens..]` are padding (format 5, `best_fit`);
    /// the whole window in a pack without padding.
    pub real_tokens: u32,
    /// Each start's mixing position in its lane's own stream (`doc_positions.u64`: `best_fit`
    /// with phases); `None`: where it lies in the windows.
    pub doc_positions: Option<&'a [u64]>,
}

impl Window<'_> {
    /// The labels as a loss takes them: the next token, or `ignore_index` (-100 in torch) where
    /// that is padding.
    pub fn masked_labels(&self, ignore_index: i64) -> Vec<i64> {
        masked_labels(self.tokens, self.real_tokens, ignore_index)
    }

    /// Cumulative sequence lengths over the real inputs (see [`crate::batch::cu_seqlens`]).
    pub fn cu_seqlens(&self) -> Vec<u32> {
        let seq_len = self.tokens.len().saturating_sub(1) as u32;
        cu_seqlens(self.doc_starts, self.real_tokens, seq_len)
    }

    /// The source of each input token (the first `seq_len`), for a loss per source; `None` in a
    /// pack of format 1 or 2.
    pub fn input_sources(&self) -> Option<Vec<u16>> {
        let len = self.tokens.len().saturating_sub(1);
        Some(token_sources(
            len,
            self.doc_starts,
            self.doc_sources?,
            self.lead_source?,
        ))
    }
}

pub struct PackedDataset {
    dir: PathBuf,
    manifest: Manifest,
    shards: Vec<Mmap>,
    doc_starts: Mmap,
    doc_starts_offsets: Mmap,
    /// Format 3: `doc_sources.u16` and `lead_sources.u16`.
    sources: Option<(Mmap, Mmap)>,
    /// Format 5 with padding: `real_tokens.u32`.
    real_tokens: Option<Mmap>,
    /// `doc_positions.u64`, where the manifest lists it.
    doc_positions: Option<Mmap>,
}

impl PackedDataset {
    pub fn open(dir: impl AsRef<Path>) -> Result<PackedDataset, ReadError> {
        let dir = dir.as_ref().to_path_buf();
        if cfg!(target_endian = "big") {
            return Err(ReadError::Corrupt {
                path: dir,
                message: "packed shards are little-endian; this host is big-endian".into(),
            });
        }
        let manifest = read_manifest(&dir)?;
        let shards = manifest
            .shards
            .iter()
            .map(|f| map_file(&dir, f))
            .collect::<Result<Vec<_>, _>>()?;
        let doc_starts = map_file(&dir, &manifest.doc_starts)?;
        let doc_starts_offsets = map_file(&dir, &manifest.doc_starts_offsets)?;
        let window_bytes = manifest.window_tokens as u64 * manifest.dtype.size_bytes() as u64;
        let shard_windows: u64 = shards
            .iter()
            .map(|m| m.len() as u64 / window_bytes.max(1))
            .sum();
        if shard_windows != manifest.num_windows {
            return Err(ReadError::Corrupt {
                path: dir,
                message: format!(
                    "shards hold {shard_windows} windows, the manifest says {}",
                    manifest.num_windows
                ),
            });
        }
        if doc_starts_offsets.len() as u64 != (manifest.num_windows + 1) * 8 {
            return Err(ReadError::Corrupt {
                path: dir.join(format::DOC_STARTS_OFFSETS_FILE),
                message: "does not hold num_windows + 1 offsets".into(),
            });
        }
        let sources = match (&manifest.doc_sources, &manifest.lead_sources) {
            (Some(docs), Some(leads)) => {
                let (docs, leads) = (map_file(&dir, docs)?, map_file(&dir, leads)?);
                for (map, count, file) in [
                    (&docs, manifest.num_doc_starts, format::DOC_SOURCES_FILE),
                    (&leads, manifest.num_windows, format::LEAD_SOURCES_FILE),
                ] {
                    if map.len() as u64 != count * 2 {
                        return Err(ReadError::Corrupt {
                            path: dir.join(file),
                            message: format!("holds {} bytes, not {count} sources", map.len()),
                        });
                    }
                }
                Some((docs, leads))
            }
            _ => None,
        };
        let real_tokens = match &manifest.real_tokens {
            Some(file) => Some(map_real_tokens(&dir, file, &manifest)?),
            None => None,
        };
        let doc_positions = match &manifest.doc_positions {
            Some(file) => {
                let map = map_file(&dir, file)?;
                if map.len() as u64 != manifest.num_doc_starts * 8 {
                    return Err(ReadError::Corrupt {
                        path: dir.join(format::DOC_POSITIONS_FILE),
                        message: format!(
                            "holds {} bytes, not {} positions",
                            map.len(),
                            manifest.num_doc_starts
                        ),
                    });
                }
                Some(map)
            }
            None => None,
        };
        Ok(PackedDataset {
            dir,
            manifest,
            shards,
            doc_starts,
            doc_starts_offsets,
            sources,
            real_tokens,
            doc_positions,
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn num_windows(&self) -> u64 {
        self.manifest.num_windows
    }

    pub fn window(&self, index: u64) -> Result<Window<'_>, ReadError> {
        let num_windows = self.num_windows();
        if index >= num_windows {
            return Err(ReadError::WindowOutOfRange { index, num_windows });
        }
        let per_shard = self.manifest.windows_per_shard;
        let shard = &self.shards[(index / per_shard) as usize];
        let window_tokens = self.manifest.window_tokens as usize;
        let start = (index % per_shard) as usize * window_tokens;
        let range = start..start + window_tokens;
        let tokens = match self.manifest.dtype {
            Dtype::U16 => cast::<u16>(shard).get(range).map(TokenSlice::U16),
            Dtype::U32 => cast::<u32>(shard).get(range).map(TokenSlice::U32),
        };
        let tokens = tokens.ok_or_else(|| ReadError::Corrupt {
            path: self
                .dir
                .join(format::shard_file_name((index / per_shard) as usize)),
            message: format!("window {index} lies past the end of its shard"),
        })?;
        let offsets = cast::<u64>(&self.doc_starts_offsets);
        let starts = cast::<u32>(&self.doc_starts);
        let (lo, hi) = (
            offsets[index as usize] as usize,
            offsets[index as usize + 1] as usize,
        );
        let doc_starts = starts.get(lo..hi).ok_or_else(|| ReadError::Corrupt {
            path: self.dir.join(format::DOC_STARTS_OFFSETS_FILE),
            message: format!(
                "window {index} points at doc starts {lo}..{hi}, past the end ({})",
                starts.len()
            ),
        })?;
        let (doc_sources, lead_source) = match &self.sources {
            Some((docs, leads)) => (
                cast::<u16>(docs).get(lo..hi),
                cast::<u16>(leads).get(index as usize).copied(),
            ),
            None => (None, None),
        };
        let real_tokens = match &self.real_tokens {
            Some(map) => cast::<u32>(map)[index as usize],
            None => self.manifest.window_tokens,
        };
        let doc_positions = (self.doc_positions.as_ref()).and_then(|m| cast::<u64>(m).get(lo..hi));
        Ok(Window {
            index,
            tokens,
            doc_starts,
            doc_sources,
            lead_source,
            real_tokens,
            doc_positions,
        })
    }

    pub fn num_steps(&self, layout: BatchLayout) -> u64 {
        layout.num_steps(self.num_windows())
    }

    /// Rank `rank`'s rows at global step `step`.
    pub fn batch(&self, step: u64, rank: u32, layout: BatchLayout) -> Result<Batch<'_>, ReadError> {
        if layout.world_size == 0 || layout.micro_batch == 0 {
            return Err(ReadError::EmptyLayout);
        }
        if rank >= layout.world_size {
            return Err(ReadError::RankOutOfRange {
                rank,
                world_size: layout.world_size,
            });
        }
        let num_steps = self.num_steps(layout);
        if step >= num_steps {
            return Err(ReadError::StepOutOfRange {
                step,
                num_steps,
                world_size: layout.world_size,
                micro_batch: layout.micro_batch,
            });
        }
        let rows = layout
            .windows(step, rank)
            .map(|i| self.window(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Batch { step, rank, rows })
    }
}

/// `real_tokens.u32`, checked: one count per window, each 1 to a window's tokens. (That every
/// window starts a document and all its starts lie before its real tokens is `dsprep verify`'s
/// to check, with the tokens.)
fn map_real_tokens(dir: &Path, file: &OutputFile, manifest: &Manifest) -> Result<Mmap, ReadError> {
    let map = map_file(dir, file)?;
    let corrupt = |message: String| ReadError::Corrupt {
        path: dir.join(format::REAL_TOKENS_FILE),
        message,
    };
    if map.len() as u64 != manifest.num_windows * 4 {
        return Err(corrupt(format!(
            "holds {} bytes, not {} counts",
            map.len(),
            manifest.num_windows
        )));
    }
    if let Some((i, &n)) =
        (cast::<u32>(&map).iter().enumerate()).find(|&(_, &n)| n == 0 || n > manifest.window_tokens)
    {
        return Err(corrupt(format!(
            "window {i} has {n} real tokens; a window holds 1 to {}",
            manifest.window_tokens
        )));
    }
    Ok(map)
}

pub fn read_manifest(dir: &Path) -> Result<Manifest, ReadError> {
    let path = dir.join(format::MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| ReadError::Io {
        path: path.clone(),
        source,
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ReadError::Manifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
    if value.get("format").and_then(|f| f.as_str()) != Some(format::FORMAT_NAME) {
        return Err(ReadError::Manifest {
            path,
            message: format!("field `format` is not {:?}", format::FORMAT_NAME),
        });
    }
    let found = value
        .get("format_version")
        .and_then(|v| v.as_u64())
        .unwrap_or(0) as u32;
    if !(format::OLDEST_FORMAT_VERSION..=format::FORMAT_VERSION).contains(&found) {
        return Err(ReadError::Version { path, found });
    }
    serde_json::from_value(value).map_err(|e| ReadError::Manifest {
        path,
        message: e.to_string(),
    })
}

#[allow(unsafe_code)]
fn map_file(dir: &Path, entry: &OutputFile) -> Result<Mmap, ReadError> {
    let path = dir.join(&entry.file);
    let file = File::open(&path).map_err(|source| ReadError::Io {
        path: path.clone(),
        source,
    })?;
    // SAFETY: the map is read-only and packed outputs are never modified in place (a new pack
    // writes a new directory and renames it). A file truncated underneath us by another process
    // is outside what any reader of mapped files can defend against.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| ReadError::Io {
        path: path.clone(),
        source,
    })?;
    if map.len() as u64 != entry.size_bytes {
        return Err(ReadError::Size {
            path,
            expected: entry.size_bytes,
            actual: map.len() as u64,
        });
    }
    Ok(map)
}

/// Reinterpret a mapped file as little-endian integers. Maps are page-aligned and every file
/// holds whole elements (checked against the manifest), so this cannot fail on a valid dataset;
/// a file with a ragged length is cut to whole elements, which the size checks above reject.
fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> &[T] {
    let whole = bytes.len() / std::mem::size_of::<T>() * std::mem::size_of::<T>();
    bytemuck::cast_slice(&bytes[..whole])
}
