//! What a run's first document waits for when the engine `Auto` runs comes from its engine-cache
//! entry (dsprep's tables, or HF 1.x's choice):
//!
//! ```text
//! cargo run --release -p dsprep-tokenize --example engine_start_bench -- --tokenizer PATH [--rounds R]
//! ```
//!
//! Learns the engine from the file once and keeps its entry in memory, then R times (default 9)
//! builds a new stage from the file's bytes and that entry, as `dsprep pack` and `serve` do, and
//! times two steps: the stage (the file's sha256, the entry's check and head) and the first
//! document's ids (the engine built from the entry, then one short text encoded: the most a
//! first document waits, when no thread of the caller's built it beside the run's start). Prints one JSON line with each step's median and range,
//! in milliseconds.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dsprep_tokenize::{EngineChoice, SharedEngineCache, TokenizeStage};

#[path = "shared/mod.rs"]
mod shared;
use shared::memory_cache::MemoryCache;

/// Median, least and most of `values`, in milliseconds.
fn summary(mut values: Vec<f64>) -> serde_json::Value {
    values.sort_by(f64::total_cmp);
    serde_json::json!({
        "median_ms": values[values.len() / 2] * 1e3,
        "min_ms": values[0] * 1e3,
        "max_ms": values[values.len() - 1] * 1e3,
    })
}

fn main() -> Result<(), Box<dyn Error>> {
    let (mut tokenizer, mut rounds) = (None, 9usize);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--tokenizer" => tokenizer = Some(PathBuf::from(value()?)),
            "--rounds" => rounds = value()?.parse::<usize>()?.max(1),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let tokenizer = tokenizer.ok_or("--tokenizer PATH is required")?;
    let json = Arc::new(std::fs::read(&tokenizer)?);
    let origin = tokenizer.display().to_string();
    let spec = shared::tokenizer_spec(&tokenizer);
    let cache: SharedEngineCache = Arc::new(MemoryCache::default());
    let build = |cache: &SharedEngineCache| {
        let cache = Some(Arc::clone(cache));
        let json = Arc::clone(&json);
        TokenizeStage::from_json_bytes_cached(json, &spec, &origin, EngineChoice::Auto, cache)
    };
    // The first build learns the engine from the file and keeps its entry.
    let learnt = build(&cache)?;
    let description = learnt.engine_description().to_string();
    drop(learnt);

    let (mut stage_s, mut first_s) = (Vec::new(), Vec::new());
    let mut ids = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let stage = build(&cache)?;
        stage_s.push(started.elapsed().as_secs_f64());
        let asked = Instant::now();
        ids.clear();
        stage.encode_doc("The first document of the run.", &mut ids)?;
        first_s.push(asked.elapsed().as_secs_f64());
        let line = stage.engine_description();
        if !line.contains("(tables from the engine cache)")
            && !line.contains("(chosen by the engine cache)")
        {
            return Err(format!("not built from the entry: {}", stage.engine_description()).into());
        }
    }
    let line = serde_json::json!({
        "tokenizer": origin,
        "engine": description,
        "rounds": rounds,
        "stage": summary(stage_s),
        "first_document": summary(first_s),
    });
    println!("{line}");
    Ok(())
}
