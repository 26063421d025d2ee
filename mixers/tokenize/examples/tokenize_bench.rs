//! Tokenize-stage throughput of one engine on local text: `auto` (the engine a pack runs), `fast`
//! (dsprep's own engine; an error where it does not reproduce the file), `hf1` (HF tokenizers 1.x),
//! `hf` (HF tokenizers 0.23):
//!
//! ```text
//! cargo run --release -p dsprep-tokenize --example tokenize_bench -- \
//!     --tokenizer PATH --text-dir DIR-or-FILE --engine auto|fast|hf1|hf --threads N --max-mb M
//! ```
//!
//! Reads JSON-lines gzip files (`.json.gz`, field `text`, one document per row) and plain text
//! files (cut into ~4 KB documents at line ends), encodes every document with `encode_doc` on
//! N threads (documents dealt round-robin), and prints one JSON line. Only encoding is timed.
//! `--rounds R` encodes everything R times, each round on new threads (so with cold piece
//! caches), and reports the median round: for profiles longer than one pass.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use dsprep_tokenize::{EngineChoice, TokenizeStage};

#[path = "shared/mod.rs"]
mod shared;
use shared::local_texts;

const DOC_BYTES: usize = 4096;

struct Args {
    tokenizer: PathBuf,
    text: PathBuf,
    engine: String,
    threads: usize,
    max_bytes: usize,
    rounds: usize,
}

fn parse_args() -> Result<Args, Box<dyn Error>> {
    let mut tokenizer = None;
    let mut text = None;
    let mut engine = "fast".to_string();
    let mut threads = 1;
    let mut max_mb = 20.0;
    let mut rounds = 1;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--tokenizer" => tokenizer = Some(PathBuf::from(value()?)),
            "--text-dir" => text = Some(PathBuf::from(value()?)),
            "--engine" => engine = value()?,
            "--threads" => threads = value()?.parse()?,
            "--max-mb" => max_mb = value()?.parse()?,
            "--rounds" => rounds = value()?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if !["auto", "hf", "hf1", "fast"].contains(&engine.as_str()) {
        return Err(format!("--engine {engine}: expected auto, hf, hf1 or fast").into());
    }
    Ok(Args {
        tokenizer: tokenizer.ok_or("--tokenizer PATH is required")?,
        text: text.ok_or("--text-dir DIR-or-FILE is required")?,
        engine,
        threads: threads.max(1),
        max_bytes: (max_mb * 1e6) as usize,
        rounds: rounds.max(1),
    })
}

/// This thread's time on a CPU so far, in seconds (`CLOCK_THREAD_CPUTIME_ID`, what Python's
/// `time.thread_time` reads in the GigaToken script). Not `/proc/thread-self/schedstat`: the
/// kernel updates a running thread's figure there only at a tick or a switch, so a 20 ms run
/// read 1–4 ms short.
fn thread_cpu_seconds() -> f64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// Encode every document once on `threads` new threads; (seconds, tokens, CPU seconds).
fn encode_round(
    stage: &TokenizeStage,
    docs: &[String],
    threads: usize,
) -> Result<(f64, usize, f64), Box<dyn Error>> {
    let started = Instant::now();
    let per_thread: Vec<Result<(usize, f64), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let cpu = thread_cpu_seconds();
                    let mut ids = Vec::new();
                    let mut tokens = 0;
                    for doc in docs.iter().skip(t).step_by(threads) {
                        ids.clear();
                        stage.encode_doc(doc, &mut ids).map_err(|e| e.to_string())?;
                        tokens += ids.len();
                    }
                    Ok((tokens, thread_cpu_seconds() - cpu))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a thread panicked".to_string()))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let (mut tokens, mut cpu) = (0, 0.0);
    for result in per_thread {
        let (counted, spent) = result?;
        tokens += counted;
        cpu += spent;
    }
    Ok((seconds, tokens, cpu))
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let json = std::fs::read(&args.tokenizer)?;
    let spec = shared::tokenizer_spec(&args.tokenizer);
    let choice = match args.engine.as_str() {
        "hf" => EngineChoice::Hf,
        "hf1" => EngineChoice::Hf1,
        "fast" => EngineChoice::Own,
        _ => EngineChoice::Auto,
    };
    // HF's own parse of the file, alone: the part of start-up no engine of ours can skip.
    let parsed = Instant::now();
    tokenizers::Tokenizer::from_bytes(&json).map_err(|e| e.to_string())?;
    let hf_parse_seconds = parsed.elapsed().as_secs_f64();
    let built = Instant::now();
    let stage = TokenizeStage::from_json_bytes_with(&json, &spec, &spec.path, choice)?;
    let build_seconds = built.elapsed().as_secs_f64();
    let description = stage.engine_description();
    if args.engine == "fast" && !description.starts_with("fast path") {
        return Err(format!("no fast path for this tokenizer: {description}").into());
    }
    if args.engine == "hf1" && !description.starts_with("HF tokenizers 1.") {
        return Err(format!("HF tokenizers 1.x does not encode here: {description}").into());
    }

    let mut files = Vec::new();
    local_texts::collect_files(&args.text, local_texts::Files::Text, &mut files)?;
    let mut docs = Vec::new();
    for file in &files {
        local_texts::read_docs(file, DOC_BYTES, &mut docs)?;
        if docs.iter().map(String::len).sum::<usize>() >= args.max_bytes {
            break;
        }
    }
    let mut total = 0;
    docs.retain(|d| {
        total += d.len();
        total <= args.max_bytes
    });
    let bytes: usize = docs.iter().map(String::len).sum();

    let (mut rounds, mut cpu_rounds) = (Vec::new(), Vec::new());
    let mut tokens = 0;
    for _ in 0..args.rounds {
        let (seconds, counted, cpu) = encode_round(&stage, &docs, args.threads)?;
        rounds.push(seconds);
        cpu_rounds.push(cpu);
        tokens = counted;
    }
    rounds.sort_by(f64::total_cmp);
    cpu_rounds.sort_by(f64::total_cmp);
    let seconds = rounds[rounds.len() / 2];
    let cpu_seconds = cpu_rounds[cpu_rounds.len() / 2];
    let line = serde_json::json!({
        "engine": args.engine,
        "threads": args.threads,
        "docs": docs.len(),
        "bytes": bytes,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens as f64 / seconds,
        "cpu_seconds": cpu_seconds,
        "tokens_per_cpu_s": tokens as f64 / cpu_seconds,
        "mb_per_s": bytes as f64 / 1e6 / seconds,
        "build_seconds": build_seconds,
        "hf_parse_seconds": hf_parse_seconds,
        "tokenizer": args.tokenizer.display().to_string(),
        "engine_line": description,
    });
    println!("{line}");
    Ok(())
}
