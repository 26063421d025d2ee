//! The fast path (or HF `tokenizers` 1.x) against HF `tokenizers` 0.23, document by document, on
//! local files: an exactness soak over any text at hand, beyond the texts the differential tests
//! carry.
//!
//! ```text
//! cargo run --release -p dsprep-tokenize --example engine_diff -- \
//!     --tokenizer PATH --text DIR-or-FILE [--engine fast|auto|hf1] [--doc-bytes N] [--threads N] \
//!     [--max-mb M] [--report K]
//! ```
//!
//! `--engine fast` (the default) checks dsprep's own engine (`Own`); `--engine auto` the engine
//! a pack runs (HF 1.x or dsprep's, `Auto`), learnt and from its entry alike; with `--engine hf1`
//! HF 1.x's stage alone stands where the two engines do below (exit 2 if 1.x does not read the
//! file).
//!
//! Takes every file under the folder that does not look binary (and `.json.gz` by row), cut
//! into documents of about `--doc-bytes` at line ends (default 4096; 0: a file is one
//! document), and encodes each with HF and with the fast path twice: as learnt from the file,
//! and as built from its engine-cache entry (what `pack` and `serve` run once the entry
//! exists). A document differs where either fast engine's ids are not HF's. Each (the first
//! `--report`, default 10) is shrunk to a short text that still differs and printed as a JSON
//! line; a summary line follows, with the files that could not be read. Exits 1 if any document
//! differed or any file could not be read, 2 if the tokenizer has no fast path.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dsprep_tokenize::{EngineChoice, SharedEngineCache, TokenizeStage};

#[path = "shared/mod.rs"]
mod shared;
use shared::{local_texts, memory_cache::MemoryCache};

/// Encodings of a differing text's candidates, at most, while shrinking it.
const SHRINK_TRIES: usize = 4000;

struct Args {
    tokenizer: PathBuf,
    text: PathBuf,
    engine: String,
    doc_bytes: usize,
    threads: usize,
    max_bytes: usize,
    report: usize,
}

fn parse_args() -> Result<Args, Box<dyn Error>> {
    let (mut tokenizer, mut text, mut engine) = (None, None, "fast".to_string());
    let (mut doc_bytes, mut threads, mut max_mb, mut report) = (4096, 1, f64::INFINITY, 10);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--tokenizer" => tokenizer = Some(PathBuf::from(value()?)),
            "--text" => text = Some(PathBuf::from(value()?)),
            "--engine" => engine = value()?,
            "--doc-bytes" => doc_bytes = value()?.parse()?,
            "--threads" => threads = value()?.parse()?,
            "--max-mb" => max_mb = value()?.parse()?,
            "--report" => report = value()?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if !["fast", "hf1", "auto"].contains(&engine.as_str()) {
        return Err(format!("--engine {engine}: expected fast or hf1").into());
    }
    Ok(Args {
        tokenizer: tokenizer.ok_or("--tokenizer PATH is required")?,
        text: text.ok_or("--text DIR-or-FILE is required")?,
        engine,
        doc_bytes,
        threads: threads.max(1),
        max_bytes: (max_mb * 1e6).min(usize::MAX as f64) as usize,
        report,
    })
}

/// The stages compared: HF 0.23's, and those checked against it (the fast engine learnt from
/// the file and the one built from its engine-cache entry, or HF 1.x's).
struct Engines {
    checked: Vec<TokenizeStage>,
    hf: TokenizeStage,
}

impl Engines {
    /// The checked engines' ids for `text` (the first that differs from HF's, else the last
    /// one's) and HF's. An error is an answer too: `u32::MAX` marks it, so an error on one side
    /// differs.
    fn ids(&self, text: &str) -> (Vec<u32>, Vec<u32>) {
        let encode = |stage: &TokenizeStage| {
            let mut ids = Vec::new();
            match stage.encode_doc(text, &mut ids) {
                Ok(()) => ids,
                Err(_) => vec![u32::MAX],
            }
        };
        let hf = encode(&self.hf);
        let mut checked = Vec::new();
        for stage in &self.checked {
            checked = encode(stage);
            if checked != hf {
                break;
            }
        }
        (checked, hf)
    }

    fn differ(&self, text: &str) -> bool {
        let (fast, hf) = self.ids(text);
        fast != hf
    }
}

/// A shorter text on which the engines still differ: pieces of lines, then of characters, are
/// dropped while they do (at most [`SHRINK_TRIES`] encodings).
fn shrink(engines: &Engines, text: &str) -> String {
    let mut tries = 0;
    let mut units: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
    for by_chars in [false, true] {
        if by_chars {
            units = units.concat().chars().map(String::from).collect();
        }
        let mut size = units.len().div_ceil(2).max(1);
        loop {
            let mut at = 0;
            while at < units.len() && tries < SHRINK_TRIES {
                let end = (at + size).min(units.len());
                let candidate: String = units[..at].concat() + &units[end..].concat();
                tries += 1;
                if engines.differ(&candidate) {
                    units.drain(at..end);
                } else {
                    at = end;
                }
            }
            if size == 1 || tries >= SHRINK_TRIES {
                break;
            }
            size = size.div_ceil(2);
        }
    }
    units.concat()
}

#[derive(Default)]
struct Tally {
    files: AtomicUsize,
    docs: AtomicUsize,
    bytes: AtomicUsize,
    tokens: AtomicUsize,
    differing: AtomicUsize,
}

fn check_file(
    path: &Path,
    args: &Args,
    engines: &Engines,
    tally: &Tally,
    out: &Mutex<()>,
) -> Result<(), String> {
    let mut docs = Vec::new();
    local_texts::read_docs(path, args.doc_bytes, &mut docs)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    tally.files.fetch_add(1, Ordering::Relaxed);
    for (index, doc) in docs.iter().enumerate() {
        let (a, b) = engines.ids(doc);
        tally.docs.fetch_add(1, Ordering::Relaxed);
        tally.bytes.fetch_add(doc.len(), Ordering::Relaxed);
        tally.tokens.fetch_add(b.len(), Ordering::Relaxed);
        if a == b {
            continue;
        }
        if tally.differing.fetch_add(1, Ordering::Relaxed) >= args.report {
            continue;
        }
        let first = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let small = shrink(engines, doc);
        let (small_fast, small_hf) = engines.ids(&small);
        let line = serde_json::json!({
            "file": path.display().to_string(),
            "document": index,
            "first_difference": first,
            // The checked engine's ids under "fast" whichever it is (`--engine` says).
            "checked_engine": args.engine,
            "fast": &a[first..(first + 8).min(a.len())],
            "hf": &b[first..(first + 8).min(b.len())],
            "shrunk": small,
            "shrunk_fast": small_fast,
            "shrunk_hf": small_hf,
        });
        let _held = out.lock().unwrap_or_else(|e| e.into_inner());
        println!("{line}");
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let json = Arc::new(std::fs::read(&args.tokenizer)?);
    let spec = shared::tokenizer_spec(&args.tokenizer);
    let cache: SharedEngineCache = Arc::new(MemoryCache::default());
    let stage = |choice, cache: Option<&SharedEngineCache>| {
        let (json, cache) = (Arc::clone(&json), cache.map(Arc::clone));
        TokenizeStage::from_json_bytes_cached(json, &spec, &spec.path, choice, cache)
    };
    let engines = if args.engine == "hf1" {
        Engines {
            checked: vec![stage(EngineChoice::Hf1, None)?],
            hf: stage(EngineChoice::Hf, None)?,
        }
    } else {
        // The first build chooses (and learns) the engine and keeps its entry; the second is
        // built from it.
        let choice = match args.engine.as_str() {
            "auto" => EngineChoice::Auto,
            _ => EngineChoice::Own,
        };
        Engines {
            checked: vec![stage(choice, Some(&cache))?, stage(choice, Some(&cache))?],
            hf: stage(EngineChoice::Hf, None)?,
        }
    };
    let description = engines.checked[0].engine_description();
    let wanted = match args.engine.as_str() {
        "hf1" => "HF tokenizers 1.",
        "auto" if description.starts_with("HF tokenizers 1.") => "HF tokenizers 1.",
        _ => "fast path",
    };
    if !description.starts_with(wanted) {
        eprintln!("{wanted} does not encode here: {description}");
        std::process::exit(2);
    }
    if args.engine != "hf1" {
        let from_entry = engines.checked[1].engine_description();
        if !from_entry.ends_with("(tables from the engine cache)")
            && !from_entry.ends_with("(chosen by the engine cache)")
        {
            return Err(
                format!("the second stage was not built from the entry: {from_entry}").into(),
            );
        }
    }
    let mut files = Vec::new();
    local_texts::collect_files(&args.text, local_texts::Files::All, &mut files)?;

    let started = Instant::now();
    let (tally, out, next) = (Tally::default(), Mutex::new(()), AtomicUsize::new(0));
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut unread = Vec::new();
                    while tally.bytes.load(Ordering::Relaxed) < args.max_bytes {
                        let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            break;
                        };
                        // A file that cannot be read is reported; the others are still compared.
                        if let Err(e) = check_file(path, &args, &engines, &tally, &out) {
                            unread.push(e);
                        }
                    }
                    unread
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|_| vec!["a thread panicked".to_string()])
            })
            .collect()
    });
    let differing = tally.differing.load(Ordering::Relaxed);
    let clean = differing == 0 && failures.is_empty();
    let line = serde_json::json!({
        "tokenizer": args.tokenizer.display().to_string(),
        "text": args.text.display().to_string(),
        "doc_bytes": args.doc_bytes,
        "files": tally.files.load(Ordering::Relaxed),
        "documents": tally.docs.load(Ordering::Relaxed),
        "bytes": tally.bytes.load(Ordering::Relaxed),
        "tokens": tally.tokens.load(Ordering::Relaxed),
        "differing": differing,
        "seconds": started.elapsed().as_secs_f64(),
        "engine": description,
        "errors": failures,
    });
    println!("{line}");
    if !clean {
        std::process::exit(1);
    }
    Ok(())
}
