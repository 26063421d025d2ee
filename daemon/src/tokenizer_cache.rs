//! The engine cache on disk: one file per tokenizer file, `<sha256 of tokenizer.json>.engine`, in
//! `DSPREP_ENGINE_CACHE` (a directory, or `off`), else `$XDG_CACHE_HOME/dsprep/engines`, else
//! `~/.cache/dsprep/engines`. What an entry holds and how it is checked is
//! `mixers/tokenize/src/cache/entry.rs`; here are only the files. A cache that cannot be read or
//! written costs a rebuild, never a run: failures are logged at debug level and otherwise ignored.

use std::io::Write;
use std::path::{Path, PathBuf};

use dsprep_mixers::tokenize::EngineCache;

/// The environment variable naming the cache directory (or `off`).
pub const ENV: &str = "DSPREP_ENGINE_CACHE";

/// Entries larger than this are not read (Llama 3's is about 5 MB).
const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// Engine-cache entries kept as files in one directory.
pub struct EngineCacheDir {
    dir: PathBuf,
}

impl EngineCacheDir {
    /// The cache the environment names, if any (`DSPREP_ENGINE_CACHE=off`, or no home, is none).
    pub fn from_env() -> Option<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let dir = match var(ENV) {
            Some(value) if value == "off" => return None,
            Some(dir) => PathBuf::from(dir),
            None => var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|home| Path::new(&home).join(".cache")))?
                .join("dsprep/engines"),
        };
        Some(Self { dir })
    }

    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn path(&self, tokenizer_sha256: &str) -> PathBuf {
        self.dir.join(format!("{tokenizer_sha256}.engine"))
    }

    fn write(&self, tokenizer_sha256: &str, entry: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        // Whole or not at all, and a temporary name of this process's own: other processes (a
        // node's daemons starting together) may read or write the same entry meanwhile.
        let tmp = self
            .dir
            .join(format!(".{tokenizer_sha256}.{}.tmp", std::process::id()));
        let written = std::fs::File::create(&tmp)
            .and_then(|mut file| file.write_all(entry))
            .and_then(|()| std::fs::rename(&tmp, self.path(tokenizer_sha256)));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

impl EngineCache for EngineCacheDir {
    fn load(&self, tokenizer_sha256: &str) -> Option<Vec<u8>> {
        let path = self.path(tokenizer_sha256);
        let len = std::fs::metadata(&path).ok()?.len();
        if len > MAX_ENTRY_BYTES {
            tracing::debug!(
                "engine cache {}: {len} bytes, more than {MAX_ENTRY_BYTES}; not read",
                path.display()
            );
            return None;
        }
        std::fs::read(&path).ok()
    }

    fn store(&self, tokenizer_sha256: &str, entry: &[u8]) {
        if let Err(e) = self.write(tokenizer_sha256, entry) {
            tracing::debug!(
                "engine cache {}: not written: {e}",
                self.path(tokenizer_sha256).display()
            );
        }
    }
}
