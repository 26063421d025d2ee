//! What the Hub says a file's bytes hash to, hashing bytes as they arrive, and the record of
//! what each file read was actually checked against (the manifest's `verified` field).
//!
//! The Hub gives two hashes: the LFS sha256 of every large file (the tree listing's `lfs.oid`,
//! also the download's `X-Linked-Etag`) and the git blob id of a file kept in git (its `oid`,
//! the `ETag`): sha1 of `"blob {size}\0"` and the bytes. A file read whole is checked against
//! one of them before any of its bytes is used; a parquet file read by ranges has its pages
//! checked against the CRCs in their headers where the writer put them there.

use super::HubFile;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Downloads of one file (or one parquet row group) tried before bytes that do not match their
/// hash stop the run.
pub const VERIFY_DOWNLOADS: u32 = 3;

/// The hash the Hub gives for a file's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpectedHash {
    /// LFS files: sha256 of the bytes, hex.
    Sha256(String),
    /// Files kept in git: the git blob id, hex.
    GitBlob(String),
}

impl ExpectedHash {
    /// The LFS sha256 when the file has one, else its git blob id; none when the listing gave
    /// neither (or a malformed one: a claim that cannot be checked is not used).
    pub fn of(file: &HubFile) -> Option<ExpectedHash> {
        let hex_of = |len: usize, s: &str| {
            (s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_lowercase())
        };
        if let Some(sha) = file.sha256.as_deref().and_then(|s| hex_of(64, s)) {
            return Some(ExpectedHash::Sha256(sha));
        }
        file.oid
            .as_deref()
            .and_then(|s| hex_of(40, s))
            .map(ExpectedHash::GitBlob)
    }

    pub fn hex(&self) -> &str {
        match self {
            ExpectedHash::Sha256(h) | ExpectedHash::GitBlob(h) => h,
        }
    }

    /// How the hash is named in messages and in the manifest.
    pub fn kind(&self) -> &'static str {
        match self {
            ExpectedHash::Sha256(_) => "sha256",
            ExpectedHash::GitBlob(_) => "git-blob-sha1",
        }
    }

    /// A hasher for a file of `size` bytes, to compare with this hash at the end.
    pub fn hasher(&self, size: u64) -> FileHasher {
        match self {
            ExpectedHash::Sha256(_) => FileHasher::Sha256(Sha256::new()),
            ExpectedHash::GitBlob(_) => {
                let mut h = Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                FileHasher::GitBlob(h)
            }
        }
    }
}

/// A running hash of a file's bytes, of the kind its [`ExpectedHash`] needs.
pub enum FileHasher {
    Sha256(Sha256),
    GitBlob(Sha1),
}

impl FileHasher {
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            FileHasher::Sha256(h) => h.update(bytes),
            FileHasher::GitBlob(h) => h.update(bytes),
        }
    }

    pub fn finish_hex(self) -> String {
        match self {
            FileHasher::Sha256(h) => hex::encode(h.finalize()),
            FileHasher::GitBlob(h) => hex::encode(h.finalize()),
        }
    }
}

/// What one file's bytes were checked against, as the manifest records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// Read whole and equal to the Hub's hash of this kind (`sha256`, `git-blob-sha1`).
    WholeFile(&'static str),
    /// Read by ranges: of the pages read, `with_crc` carried a CRC and matched it.
    Pages { read: u64, with_crc: u64 },
    /// Read, with nothing to check it against (the Hub gave no hash).
    Nothing,
}

impl Verified {
    /// The manifest's words: `sha256`, `git-blob-sha1`, `page-crc` (every page read carried a
    /// CRC), `page-crc M/N` (M of the N pages read did), `none`.
    pub fn describe(&self) -> String {
        match *self {
            Verified::WholeFile(kind) => kind.to_string(),
            Verified::Pages { read, with_crc } if read > 0 && with_crc == read => {
                "page-crc".to_string()
            }
            Verified::Pages { with_crc: 0, .. } | Verified::Nothing => "none".to_string(),
            Verified::Pages { read, with_crc } => format!("page-crc {with_crc}/{read}"),
        }
    }

    /// Two reads of one file (passes, lanes): a whole-file check covers every read; pages add.
    fn merge(self, other: Verified) -> Verified {
        match (self, other) {
            (whole @ Verified::WholeFile(_), _) | (_, whole @ Verified::WholeFile(_)) => whole,
            (
                Verified::Pages { read, with_crc },
                Verified::Pages {
                    read: r,
                    with_crc: c,
                },
            ) => Verified::Pages {
                read: read + r,
                with_crc: with_crc + c,
            },
            (pages @ Verified::Pages { .. }, Verified::Nothing)
            | (Verified::Nothing, pages @ Verified::Pages { .. }) => pages,
            (Verified::Nothing, Verified::Nothing) => Verified::Nothing,
        }
    }
}

/// Per file location (`hf://datasets/…`), what its reads were checked against: one per
/// process ([`VerificationLog::process`]), whichever Hub client read the file, read when a
/// manifest is written and by `serve`'s `/metrics`.
#[derive(Default)]
pub struct VerificationLog {
    files: Mutex<BTreeMap<String, Verified>>,
}

/// The process's log (see [`VerificationLog::process`]).
static PROCESS_LOG: VerificationLog = VerificationLog {
    files: Mutex::new(BTreeMap::new()),
};

impl VerificationLog {
    /// The log of this process: every Hub client records there.
    pub fn process() -> &'static VerificationLog {
        &PROCESS_LOG
    }

    /// Note a read of `location`. The first read of a file is logged with the manifest's word
    /// for it (a warning when nothing was checked).
    pub fn record(&self, location: &str, verified: Verified) {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        let merged = match files.get(location) {
            Some(before) => before.merge(verified),
            None => {
                match verified.describe().as_str() {
                    "none" => {
                        tracing::warn!("hub input {location}: verified none (read unchecked)")
                    }
                    word => tracing::info!("hub input {location}: verified {word}"),
                }
                verified
            }
        };
        files.insert(location.to_string(), merged);
    }

    /// Every file read so far with what it was checked against (the manifest's words), in
    /// location order.
    pub fn all(&self) -> Vec<(String, String)> {
        let files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        (files.iter())
            .map(|(location, v)| (location.clone(), v.describe()))
            .collect()
    }

    /// What the reads of `location` were checked against; none when it was never read.
    pub fn get(&self, location: &str) -> Option<Verified> {
        let files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        files.get(location).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sha256: Option<&str>, oid: Option<&str>) -> HubFile {
        HubFile {
            repo: "o/n".into(),
            commit: "c".repeat(40),
            path: "f".into(),
            size: 5,
            sha256: sha256.map(str::to_string),
            oid: oid.map(str::to_string),
        }
    }

    #[test]
    fn the_lfs_sha256_is_preferred_and_a_malformed_claim_is_not_used() {
        let sha = "ab".repeat(32);
        let oid = "cd".repeat(20);
        assert_eq!(
            ExpectedHash::of(&file(Some(&sha), Some(&oid))),
            Some(ExpectedHash::Sha256(sha.clone()))
        );
        assert_eq!(
            ExpectedHash::of(&file(None, Some(&oid))),
            Some(ExpectedHash::GitBlob(oid.clone()))
        );
        assert_eq!(ExpectedHash::of(&file(Some("abc"), Some("xyz"))), None);
    }

    #[test]
    fn a_git_blob_id_is_sha1_of_the_header_and_the_bytes() {
        // `printf hello | git hash-object --stdin`
        let expected = ExpectedHash::GitBlob("b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0".into());
        let mut h = expected.hasher(5);
        h.update(b"hello");
        assert_eq!(h.finish_hex(), expected.hex());
    }

    #[test]
    fn reads_of_one_file_merge() {
        let log = VerificationLog::default();
        log.record(
            "a",
            Verified::Pages {
                read: 3,
                with_crc: 3,
            },
        );
        log.record(
            "a",
            Verified::Pages {
                read: 2,
                with_crc: 0,
            },
        );
        assert_eq!(
            log.get("a").map(|v| v.describe()).as_deref(),
            Some("page-crc 3/5")
        );
        log.record("b", Verified::Nothing);
        log.record("b", Verified::WholeFile("sha256"));
        assert_eq!(
            log.get("b").map(|v| v.describe()).as_deref(),
            Some("sha256")
        );
        assert_eq!(log.get("c"), None);
        assert_eq!(
            Verified::Pages {
                read: 0,
                with_crc: 0
            }
            .describe(),
            "none"
        );
    }
}
