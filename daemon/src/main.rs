//! The `dsprep` command: argument parsing and dispatch only.

use anyhow::Context;
use clap::{Parser, Subcommand};
use dsprep::pack::{self, PackOptions};
use std::path::PathBuf;

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
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
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
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
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
        } => {
            let threads = match threads {
                Some(0) => anyhow::bail!("--threads must be at least 1"),
                Some(n) => n,
                None => std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1),
            };
            let options = PackOptions {
                recipe,
                out,
                threads,
                shard_bytes: shard_mib << 20,
                force,
                progress: !quiet,
            };
            let report = pack::pack(&options)?;
            pack::print_summary(&report);
        }
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
