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
        /// For a recipe with [lanes]: pack only this part's lanes into OUT.lanes/ (a Slurm array
        /// task). Default with --parts absent: SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN when
        /// SLURM_ARRAY_TASK_COUNT is set, else every lane and the finish in one run.
        #[arg(long, requires = "parts")]
        part: Option<u32>,
        /// How many parts the lanes are split into (see --part).
        #[arg(long, requires = "part")]
        parts: Option<u32>,
        /// Put the lanes in OUT.lanes/ (packed by every part) together into OUT.
        #[arg(long, conflicts_with_all = ["part", "parts"])]
        finish: bool,
        /// A frozen plan of this recipe (`dsprep plan --out`): list nothing, read the files it
        /// names (give every part of a job the same plan).
        #[arg(long)]
        plan: Option<PathBuf>,
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
        /// ipc://PATH (default) or tcp://HOST:PORT; a non-loopback host needs CURVE
        /// (--curve-secret-key and --curve-allow) or --insecure-tcp.
        #[arg(long, default_value = "ipc://dsprep.sock")]
        endpoint: String,
        /// Allow a non-loopback tcp:// endpoint without CURVE: it is not authenticated, so any
        /// host that can reach it reads the token stream and can move what the daemon holds.
        #[arg(long)]
        insecure_tcp: bool,
        /// Serve with CURVE: the daemon's secret key file (NAME.key_secret from `dsprep keygen`);
        /// its clients are given NAME.key.
        #[arg(long, requires = "curve_allow")]
        curve_secret_key: Option<PathBuf>,
        /// With CURVE: a directory of the public key files (NAME.key) of the clients let in; any
        /// other client is refused.
        #[arg(long, requires = "curve_secret_key")]
        curve_allow: Option<PathBuf>,
        /// A trainer rank belongs to the process that first asks for it; another process asking
        /// for it is refused until the owner has been silent this many seconds.
        #[arg(long, default_value_t = 10)]
        owner_timeout: u64,
        /// Steps the pipeline may run ahead of the slowest rank (bounds memory).
        #[arg(long, default_value_t = 8)]
        prefetch: u64,
        /// Tokenizer threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Prometheus endpoint, loopback (port 0 picks one); "off" disables it. Beyond loopback
        /// it needs --metrics-token-file or --insecure-metrics.
        #[arg(long, default_value = "127.0.0.1:9187")]
        metrics: String,
        /// A file holding a bearer token /metrics requires (Prometheus' `authorization:
        /// credentials_file`); without it a request gets 401.
        #[arg(long)]
        metrics_token_file: Option<PathBuf>,
        /// Allow --metrics beyond loopback without a token: any host that reaches it reads the
        /// daemon's counters.
        #[arg(long)]
        insecure_metrics: bool,
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
        /// This daemon's node (0-based), for a recipe with [lanes] served by one daemon per node.
        /// Default: SLURM_NODEID, else NODE_RANK or GROUP_RANK (torchrun), else 0.
        #[arg(long, requires = "nodes")]
        node_rank: Option<u32>,
        /// How many node daemons serve the job. Default: SLURM_NNODES, else NNODES, else 1.
        #[arg(long, requires = "node_rank")]
        nodes: Option<u32>,
        /// A frozen plan of this recipe (`dsprep plan --out`): list nothing, read the files it
        /// names (give every node daemon of a job the same plan).
        #[arg(long)]
        plan: Option<PathBuf>,
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
        /// Tensor parallel size: ranks of one TP group get the same batches.
        #[arg(long, default_value_t = 1)]
        tensor_parallel: u32,
        /// Context parallel size.
        #[arg(long, default_value_t = 1)]
        context_parallel: u32,
        /// Pipeline parallel size.
        #[arg(long, default_value_t = 1)]
        pipeline_parallel: u32,
        /// How global ranks are laid out, fastest dimension first: "tp-cp-dp-pp" (Megatron,
        /// torchtitan, NxD) or "tp-cp-pp-dp".
        #[arg(long, default_value = "tp-cp-dp-pp")]
        rank_order: String,
        /// The stream chain before --start-step (hex, from an earlier tap's `step_end`): the
        /// daemon's stream must continue it, as a resumed trainer checks.
        #[arg(long)]
        expect_chain: Option<String>,
        /// A CURVE daemon's public key file (its NAME.key). Default: DSPREP_CURVE_SERVER_KEY.
        #[arg(long, requires = "curve_client_key")]
        curve_server_key: Option<PathBuf>,
        /// This client's secret key file (NAME.key_secret; NAME.key is in the daemon's
        /// --curve-allow directory). Default: DSPREP_CURVE_CLIENT_KEY.
        #[arg(long, requires = "curve_server_key")]
        curve_client_key: Option<PathBuf>,
        /// Milliseconds to wait after each step, as a trainer computes between batches (0: pull
        /// as fast as the daemon serves).
        #[arg(long, default_value_t = 0)]
        step_ms: u64,
    },
    /// Write a CURVE key pair for authenticated serving: PATH.key (the public key, to share) and
    /// PATH.key_secret (public and secret, to keep), both mode 0600, in the certificate format
    /// of pyzmq's zmq.auth.
    Keygen {
        /// The files' path without suffix: writes PATH.key and PATH.key_secret.
        #[arg(long)]
        out: PathBuf,
        /// Replace existing key files (every side holding the old public key needs the new one).
        #[arg(long)]
        force: bool,
    },
    /// Show what a recipe would read: Hub revisions resolved, shards and sizes listed, nothing
    /// downloaded.
    Plan {
        /// The recipe (TOML).
        #[arg(long)]
        recipe: PathBuf,
        /// Also freeze the plan into this JSON file (written atomically), for `dsprep pack
        /// --plan` and `dsprep serve --plan`: list once per job, not once per node.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Check a packed directory against its manifest (sizes, checksums, index, token ids).
    Verify { dir: PathBuf },
    /// Write a packed directory in a format other trainers read: Megatron-LM's IndexedDataset
    /// (`OUT.bin` + `OUT.idx`) or a Hugging Face `datasets` directory (`load_from_disk`).
    Export {
        dir: PathBuf,
        #[arg(long, value_enum)]
        to: dsprep::export::Target,
        /// The output: a path prefix for megatron, a directory for hf-datasets.
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing output.
        #[arg(long)]
        force: bool,
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Print the decoded text of one packed window, with document boundaries; or with --mix,
    /// each source's realized share of the tokens and documents against its target.
    Inspect {
        dir: PathBuf,
        #[arg(long, default_value_t = 0)]
        window: u64,
        /// Print the mix ledger (per source, and per phase): target, realized shares, deviation.
        #[arg(long)]
        mix: bool,
        /// The realized share along the stream, one row every this many tokens (for --csv and
        /// --plot; --plot takes about 200 rows when not given).
        #[arg(long, default_value_t = 0)]
        every: u64,
        /// Write the realized shares along the stream as CSV (needs --every).
        #[arg(long, requires = "every")]
        csv: Option<PathBuf>,
        /// Draw the shares along the stream and each source's document lengths as SVG.
        #[arg(long)]
        plot: Option<PathBuf>,
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
            part,
            parts,
            finish,
            plan,
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
                plan,
            };
            let parts = match (part, parts) {
                (Some(part), Some(parts)) => Some(pack::Parts { part, parts }),
                _ => None,
            };
            let from_slurm = slurm_array_parts()?;
            if finish || parts.is_some() || from_slurm.is_some() {
                let loaded = dsprep::driver::load_recipe_with(
                    &options.recipe,
                    options.engine,
                    options.plan.as_deref(),
                )?;
                if finish {
                    pack::print_summary(&pack::finish(&options, &loaded)?);
                    return Ok(());
                }
                // An array task's environment makes a part only of a recipe with lanes.
                let from_slurm = from_slurm.filter(|_| loaded.recipe.lanes.is_some());
                if let Some(parts) = parts.or(from_slurm) {
                    let report = pack::pack_part(&options, &loaded, parts)?;
                    println!(
                        "part {} of {}: packed lanes {:?}{} ({} input bytes) into {} in {:.2} s; \
                         run `dsprep pack --finish` with the same --recipe and --out once every \
                         part is done",
                        report.parts.part,
                        report.parts.parts,
                        report.packed,
                        if report.kept.is_empty() {
                            String::new()
                        } else {
                            format!(" (kept {:?}, complete from an earlier run)", report.kept)
                        },
                        report.input_bytes,
                        report.lanes_dir.display(),
                        report.wall.as_secs_f64()
                    );
                    return Ok(());
                }
            }
            let report = pack::pack(&options)?;
            pack::print_summary(&report);
        }
        Command::Serve {
            recipe,
            world_size,
            micro_batch,
            endpoint,
            insecure_tcp,
            curve_secret_key,
            curve_allow,
            owner_timeout,
            prefetch,
            threads,
            metrics,
            metrics_token_file,
            insecure_metrics,
            tokenizer_engine,
            state_dir,
            checkpoint_every,
            keep_checkpoints,
            resume,
            node_rank,
            nodes,
            plan,
        } => {
            let node = dsprep::serve::NodePlace::resolve(node_rank, nodes, |name| {
                std::env::var(name).ok()
            })?;
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
                insecure_tcp,
                curve: match (curve_secret_key, curve_allow) {
                    (Some(secret_key), Some(allow_dir)) => Some(dsprep::serve::CurveFiles {
                        secret_key,
                        allow_dir,
                    }),
                    _ => None,
                },
                owner_timeout: std::time::Duration::from_secs(owner_timeout),
                prefetch,
                threads,
                metrics,
                metrics_token: metrics_token_file,
                insecure_metrics,
                engine,
                state_dir,
                checkpoint_every,
                keep_checkpoints,
                resume: resume.is_some(),
                node,
                plan,
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
            tensor_parallel,
            context_parallel,
            pipeline_parallel,
            rank_order,
            expect_chain,
            curve_server_key,
            curve_client_key,
            step_ms,
        } => {
            let parallel = dsprep_client::Parallelism {
                tensor: tensor_parallel,
                context: context_parallel,
                pipeline: pipeline_parallel,
                order: dsprep_client::RankOrder::parse(&rank_order)
                    .map_err(|e| anyhow::anyhow!("--rank-order: {e}"))?,
            };
            let options = TapOptions {
                endpoint,
                rank,
                world_size,
                start_step,
                steps,
                out,
                recipe_hash,
                timeout: Duration::from_secs(timeout_s),
                parallel,
                expect_chain,
                curve: match (curve_server_key, curve_client_key) {
                    (Some(server), Some(client)) => Some(
                        dsprep_client::curve::ClientKeys::from_files(&server, &client)
                            .context("--curve-server-key/--curve-client-key")?,
                    ),
                    _ => {
                        dsprep_client::curve::ClientKeys::from_env().map_err(anyhow::Error::msg)?
                    }
                },
                step_time: Duration::from_millis(step_ms),
            };
            let written = dsprep::tap::tap(&options)?;
            println!(
                "rank {rank}: wrote {written} steps to {}",
                options.out.display()
            );
        }
        Command::Keygen { out, force } => {
            use dsprep_client::curve;
            let pair = curve::KeyPair::generate()?;
            let (public, secret) = curve::write_key_files(&out, &pair, force)?;
            println!(
                "wrote {} (public key {}: share it) and {} (keep it: mode 0600)",
                public.display(),
                pair.public,
                secret.display()
            );
        }
        Command::Plan { recipe, out } => {
            print!("{}", dsprep::plan::plan(&recipe, out.as_deref())?);
            if let Some(out) = out {
                println!(
                    "plan frozen into {}: pass --plan {} to every pack part and node daemon",
                    out.display(),
                    out.display()
                );
            }
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
        Command::Export {
            dir,
            to,
            out,
            force,
            quiet,
        } => {
            let options = dsprep::export::ExportOptions {
                dir,
                to,
                out,
                force,
                progress: !quiet,
            };
            let report = dsprep::export::export(&options)?;
            let what = match to {
                dsprep::export::Target::Megatron => "documents",
                dsprep::export::Target::HfDatasets => "rows",
            };
            let names: Vec<String> = report
                .written
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            println!(
                "exported {} {what} ({} bytes written) to {} in {:.2} s ({:.0} MB/s, verify included)",
                report.records,
                report.bytes,
                names.join(" + "),
                report.seconds,
                report.bytes as f64 / report.seconds.max(1e-9) / 1e6
            );
        }
        Command::Inspect {
            dir,
            window,
            mix,
            every,
            csv,
            plot,
        } => {
            if mix || csv.is_some() || plot.is_some() {
                let every = match (every, &plot) {
                    (0, Some(_)) => dsprep::inspect::auto_every(&dir)?,
                    _ => every,
                };
                let ledger = dsprep::inspect::mix_ledger(&dir, every)
                    .with_context(|| format!("inspect {}", dir.display()))?;
                print!("{}", ledger.table());
                if let Some(path) = csv {
                    std::fs::write(&path, ledger.csv())
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    println!(
                        "wrote the realized shares every {every} tokens to {}",
                        path.display()
                    );
                }
                if let Some(path) = plot {
                    let title = format!("dsprep inspect {}", dir.display());
                    std::fs::write(&path, dsprep::inspect::render_svg(&ledger, &title))
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    println!(
                        "drew {}×{} SVG of the shares every {every} tokens and the document \
                         lengths to {}",
                        dsprep::inspect::WIDTH,
                        dsprep::inspect::HEIGHT,
                        path.display()
                    );
                }
            } else {
                let text = dsprep::inspect::inspect_window(&dir, window)
                    .with_context(|| format!("inspect {}", dir.display()))?;
                print!("{text}");
            }
        }
    }
    Ok(())
}

/// The part of a Slurm array task (`SLURM_ARRAY_TASK_ID` counted from `SLURM_ARRAY_TASK_MIN`,
/// of `SLURM_ARRAY_TASK_COUNT`), when it runs in one.
fn slurm_array_parts() -> anyhow::Result<Option<pack::Parts>> {
    let var = |name: &str| -> anyhow::Result<Option<u32>> {
        match std::env::var(name) {
            Ok(v) => v
                .trim()
                .parse()
                .map(Some)
                .with_context(|| format!("{name}={v:?} is not a whole number")),
            Err(_) => Ok(None),
        }
    };
    let (Some(id), Some(count)) = (var("SLURM_ARRAY_TASK_ID")?, var("SLURM_ARRAY_TASK_COUNT")?)
    else {
        return Ok(None);
    };
    let min = var("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
    Ok(Some(pack::Parts {
        part: id.saturating_sub(min),
        parts: count,
    }))
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
