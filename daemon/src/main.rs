//! The `dsprep` command: argument parsing and dispatch only.

use anyhow::Context;
use clap::{Parser, Subcommand};
use dsprep::pack::{self, PackOptions};
use dsprep::serve::ServeOptions;
use dsprep::tap::TapOptions;
use dsprep_mixers::EngineChoice;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "dsprep",
    version,
    about = "Deterministic data plane for LLM pretraining: mix, shuffle, tokenize, pack."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a recipe and write memory-mappable token shards.
    Pack {
        /// The recipe (TOML).
        #[arg(long)]
        recipe: PathBuf,
        /// Output directory; written under a temporary name and renamed when complete.
        #[arg(long)]
        out: PathBuf,
        /// Tokenizer threads (default: every core). The output does not depend on it.
        #[arg(long)]
        threads: Option<usize>,
        /// Target size of one token shard, MiB.
        #[arg(long, default_value_t = 256)]
        shard_mib: u64,
        /// Replace an existing output directory.
        #[arg(long)]
        force: bool,
        /// Seconds between checkpoints in OUT.partial; a killed pack continues from the last one
        /// when run again with the same recipe and output.
        #[arg(long, default_value_t = 60)]
        checkpoint_secs: u64,
        /// Start over instead of continuing an interrupted pack to the same output.
        #[arg(long)]
        fresh: bool,
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
        /// Tokenizer engine: "auto" uses the fast byte-level BPE path when it reproduces the
        /// tokenizer exactly (else HF, and says why); "hf" always uses HF tokenizers.
        #[arg(long, default_value = "auto", value_parser = ["auto", "hf"])]
        tokenizer_engine: String,
    },
    /// Serve every data-parallel rank its batches over ZeroMQ (the loader daemon).
    Serve {
        #[arg(long)]
        recipe: PathBuf,
        #[arg(long)]
        world_size: u32,
        /// Windows per rank per step; a global step is world size × micro batch windows.
        #[arg(long)]
        micro_batch: u32,
        /// ipc://PATH (default) or tcp://HOST:PORT; a non-loopback host is logged loudly.
        #[arg(long, default_value = "ipc://dsprep.sock")]
        endpoint: String,
        /// Steps the pipeline may run ahead of the slowest rank (bounds memory).
        #[arg(long, default_value_t = 8)]
        prefetch: u64,
        /// Tokenizer threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Prometheus endpoint, loopback (port 0 picks one); "off" disables it.
        #[arg(long, default_value = "127.0.0.1:9187")]
        metrics: String,
        /// Tokenizer engine: "auto" uses the fast byte-level BPE path when it reproduces the
        /// tokenizer exactly (else HF, and says why); "hf" always uses HF tokenizers.
        #[arg(long, default_value = "auto", value_parser = ["auto", "hf"])]
        tokenizer_engine: String,
        /// Directory for checkpoints (exact resume); none: no checkpoints.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Write a checkpoint every N steps produced, and on SIGINT/SIGTERM.
        #[arg(long, default_value_t = 500)]
        checkpoint_every: u64,
        /// Checkpoints kept in --state-dir. Keep enough to reach back to the trainers' own
        /// checkpoint interval: the daemon runs up to --prefetch steps ahead of them.
        #[arg(long, default_value_t = 4)]
        keep_checkpoints: usize,
        /// "latest": continue from --state-dir. The daemon starts at the step the trainers ask
        /// for first, from the newest checkpoint at or below it.
        #[arg(long, value_parser = ["latest"], requires = "state_dir")]
        resume: Option<String>,
    },
    /// Pull one rank's steps from a daemon and write their raw tokens (a trainer stand-in).
    Tap {
        #[arg(long, default_value = "ipc://dsprep.sock")]
        endpoint: String,
        #[arg(long)]
        rank: u32,
        #[arg(long)]
        world_size: u32,
        #[arg(long, default_value_t = 0)]
        start_step: u64,
        #[arg(long)]
        steps: u64,
        /// Raw token bytes of every step, in order; headers go to OUT.jsonl.
        #[arg(long)]
        out: PathBuf,
        /// Refuse a daemon serving another recipe (hex hash).
        #[arg(long)]
        recipe_hash: Option<String>,
        /// Seconds to wait for each reply before reconnecting.
        #[arg(long, default_value_t = 30)]
        timeout_s: u64,
    },
    /// Show what a recipe would read: Hub revisions resolved, shards and sizes listed, nothing
    /// downloaded.
    Plan {
        /// The recipe (TOML).
        #[arg(long)]
        recipe: PathBuf,
    },
    /// Check a packed directory against its manifest (sizes, checksums, index, token ids).
    Verify { dir: PathBuf },
    /// Print the decoded text of one packed window, with document boundaries.
    Inspect {
        dir: PathBuf,
        #[arg(long, default_value_t = 0)]
        window: u64,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DSPREP_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Pack {
            recipe,
            out,
            threads,
            shard_mib,
            force,
            quiet,
            tokenizer_engine,
            checkpoint_secs,
            fresh,
        } => {
            let threads = default_threads(threads)?;
            let options = PackOptions {
                checkpoint_secs,
                fresh,
                recipe,
                out,
                threads,
                shard_bytes: shard_mib << 20,
                force,
                progress: !quiet,
                engine: engine_choice(&tokenizer_engine),
            };
            let report = pack::pack(&options)?;
            pack::print_summary(&report);
        }
        Command::Serve {
            recipe,
            world_size,
            micro_batch,
            endpoint,
            prefetch,
            threads,
            metrics,
            tokenizer_engine,
            state_dir,
            checkpoint_every,
            keep_checkpoints,
            resume,
        } => {
            let metrics =
                match metrics.as_str() {
                    "off" => None,
                    addr => Some(addr.parse().with_context(|| {
                        format!("--metrics {addr:?} is not HOST:PORT or \"off\"")
                    })?),
                };
            let shutdown = Arc::new(AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(signal, Arc::clone(&shutdown))
                    .context("cannot install signal handlers")?;
            }
            let threads = default_threads(threads)?;
            let engine = engine_choice(&tokenizer_engine);
            let options = ServeOptions {
                recipe,
                world_size,
                micro_batch,
                endpoint,
                prefetch,
                threads,
                metrics,
                engine,
                state_dir,
                checkpoint_every,
                keep_checkpoints,
                resume: resume.is_some(),
            };
            dsprep::serve::serve(&options, shutdown)?;
        }
        Command::Tap {
            endpoint,
            rank,
            world_size,
            start_step,
            steps,
            out,
            recipe_hash,
            timeout_s,
        } => {
            let options = TapOptions {
                endpoint,
                rank,
                world_size,
                start_step,
                steps,
                out,
                recipe_hash,
                timeout: Duration::from_secs(timeout_s),
            };
            let written = dsprep::tap::tap(&options)?;
            println!(
                "rank {rank}: wrote {written} steps to {}",
                options.out.display()
            );
        }
        Command::Plan { recipe } => print!("{}", dsprep::plan::plan(&recipe)?),
        Command::Verify { dir } => {
            let report = dsprep::verify::verify(&dir)?;
            println!(
                "ok: {} — {} windows, {} tokens, {} files match the manifest",
                dir.display(),
                report.num_windows,
                report.num_tokens,
                report.num_files
            );
        }
        Command::Inspect { dir, window } => {
            let text = dsprep::inspect::inspect_window(&dir, window)
                .with_context(|| format!("inspect {}", dir.display()))?;
            print!("{text}");
        }
    }
    Ok(())
}

/// `--threads`: at least 1; by default every core.
fn default_threads(threads: Option<usize>) -> anyhow::Result<usize> {
    match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)),
    }
}

/// `--tokenizer-engine` (clap has already restricted it to "auto" or "hf").
fn engine_choice(name: &str) -> EngineChoice {
    if name == "hf" {
        EngineChoice::Hf
    } else {
        EngineChoice::Auto
    }
}
