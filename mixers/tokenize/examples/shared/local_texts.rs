//! Documents from local files, for the examples that encode text from disk (`tokenize_bench`,
//! `engine_diff`): gzip JSON lines (`.json.gz`, field `text`) by row, any other file cut into
//! documents of about `doc_bytes` at line ends (invalid UTF-8 replaced by U+FFFD).

use std::error::Error;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// The extensions `tokenize_bench` reads as plain text, besides `.json.gz`.
pub const TEXT_EXTENSIONS: &[&str] = &["txt", "py", "md", "rs", "rst", "c", "h", "json"];

/// Which files under a folder are read.
#[derive(Clone, Copy)]
pub enum Files {
    /// `.json.gz` and [`TEXT_EXTENSIONS`].
    Text,
    /// Every file but those that look binary (a NUL byte in their first 8 KiB), `.json.gz`
    /// among them.
    All,
}

/// Every file `path` names (itself, or the files under it, in name order) that `files` takes.
/// Links under `path` are not followed: a library folder may hold loops.
pub fn collect_files(path: &Path, files: Files, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if path.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        let kind = std::fs::symlink_metadata(&entry)?.file_type();
        if kind.is_dir() {
            collect_files(&entry, files, out)?;
        } else if kind.is_file() && takes(&entry, files) {
            out.push(entry);
        }
    }
    Ok(())
}

fn takes(path: &Path, files: Files) -> bool {
    let name = path.to_string_lossy();
    match files {
        Files::Text => {
            name.ends_with(".json.gz")
                || path
                    .extension()
                    .is_some_and(|e| TEXT_EXTENSIONS.iter().any(|t| e == *t))
        }
        // Compressed files look binary too: only a file named on its own is read as rows. A
        // file that cannot be read is taken, so that reading it says which and why.
        Files::All => {
            use std::io::Read;
            let mut head = [0u8; 8192];
            match std::fs::File::open(path).and_then(|mut f| f.read(&mut head)) {
                Ok(read) => !head[..read].contains(&0),
                Err(_) => true,
            }
        }
    }
}

/// Documents from one file: gzip JSON lines by row, anything else cut at line ends once a
/// document reaches `doc_bytes` (0: the whole file is one document).
pub fn read_docs(
    path: &Path,
    doc_bytes: usize,
    docs: &mut Vec<String>,
) -> Result<(), Box<dyn Error>> {
    if path.to_string_lossy().ends_with(".json.gz") {
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(path)?);
        for (n, line) in BufReader::new(gz).lines().enumerate() {
            let row: serde_json::Value = serde_json::from_str(&line?)?;
            let text = row["text"].as_str().ok_or_else(|| {
                format!("{} line {}: no string field `text`", path.display(), n + 1)
            })?;
            docs.push(text.to_string());
        }
        return Ok(());
    }
    let text = String::from_utf8_lossy(&std::fs::read(path)?).into_owned();
    if doc_bytes == 0 {
        docs.push(text);
        return Ok(());
    }
    let mut doc = String::new();
    for line in text.split_inclusive('\n') {
        doc.push_str(line);
        if doc.len() >= doc_bytes {
            docs.push(std::mem::take(&mut doc));
        }
    }
    if !doc.is_empty() {
        docs.push(doc);
    }
    Ok(())
}
