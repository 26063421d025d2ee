//! The `dsprep` command: argument parsing and dispatch only.

use anyhow::Context;
use clap::{Parser, Subcommand};
use dsprep::pack::{self, PackArgs, PackCommand};
use dsprep::serve::{ServeArgs, ServeOptions};
use dsprep::tap::TapOptions;
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
    #[command(after_help = dsprep::hub::ENV_HELP)]
    Pack(PackArgs),
    /// Serve every data-parallel rank its batches over ZeroMQ (the loader daemon).
    #[command(after_help = dsprep::hub::ENV_HELP)]
    Serve(ServeArgs),
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
        /// After each step, report a synthetic loss per source (protocol v7), as a trainer
        /// reports its own for `[mix.adaptive]`: `SOURCE=START[:SLOPE],…` gives the per-token
        /// loss of source index SOURCE at step s as START + SLOPE × s (1.0 for sources not named).
        #[arg(long)]
        report_loss: Option<String>,
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
        #[arg(long, required_unless_present = "lineage", conflicts_with = "lineage")]
        recipe: Option<PathBuf>,
        /// Show a daemon's lineage instead (its state directory, or its lineage.json): each
        /// segment, its recipe, where it takes over, and its sources' targets.
        #[arg(long, conflicts_with = "out")]
        lineage: Option<PathBuf>,
        /// Also freeze the plan into this JSON file (written atomically), for `dsprep pack
        /// --plan` and `dsprep serve --plan`: list once per job, not once per node.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Check a packed directory against its manifest (sizes, checksums, index, token ids).
    Verify {
        dir: PathBuf,
        /// Also check that the directory packs this lineage (a daemon's state directory, or
        /// its lineage.json): the same segments, taking over at the same places.
        #[arg(long)]
        lineage: Option<PathBuf>,
    },
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
        /// Draw the shares along the stream and each source's document lengths as SVG (with
        /// --decisions: the decided shares and the reported loss per source along the steps).
        #[arg(long)]
        plot: Option<PathBuf>,
        /// DIR is a state directory (or its lineage.json): print `[mix.adaptive]`'s decisions,
        /// each with the reports it used, per source its mean loss and its share.
        #[arg(long, conflicts_with_all = ["mix", "csv"])]
        decisions: bool,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DSPREP_LOG")
                // HF tokenizers' encoder logs how it built its tables at info: not the user's news.
                .unwrap_or_else(|_| "info,tk_encode=warn".into()),
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
        Command::Pack(args) => match pack::command(&PackCommand::try_from(args)?)? {
            pack::Packed::Whole(report) => pack::print_summary(&report),
            pack::Packed::Parts(reports) => reports.iter().for_each(pack::print_part),
            pack::Packed::Status(status) => print!("{}", status.report()),
        },
        Command::Serve(args) => {
            let options = ServeOptions::try_from(args)?;
            let shutdown = Arc::new(AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(signal, Arc::clone(&shutdown))
                    .context("cannot install signal handlers")?;
            }
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
            report_loss,
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
                report_loss: report_loss
                    .as_deref()
                    .map(dsprep::tap::SyntheticLoss::parse)
                    .transpose()?,
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
        Command::Plan {
            recipe,
            lineage,
            out,
        } => {
            let shown = match (&recipe, &lineage) {
                (_, Some(lineage)) => dsprep::plan::plan_lineage(lineage)?,
                (Some(recipe), None) => dsprep::plan::plan(recipe, out.as_deref())?,
                (None, None) => anyhow::bail!("dsprep plan needs --recipe FILE or --lineage PATH"),
            };
            print!("{shown}");
            if let Some(out) = out {
                println!(
                    "plan frozen into {}: pass --plan {} to every pack part and node daemon",
                    out.display(),
                    out.display()
                );
            }
        }
        Command::Verify { dir, lineage } => {
            let report = dsprep::verify::verify(&dir)?;
            if let Some(lineage) = &lineage {
                dsprep::verify::verify_lineage(&dir, lineage)?;
                println!(
                    "ok: {} packs the lineage {} segment for segment",
                    dir.display(),
                    lineage.display()
                );
            }
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
            decisions,
        } => {
            if decisions {
                let decided = dsprep::inspect::Decisions::read(&dir)?;
                print!("{}", decided.table());
                if let Some(path) = plot {
                    let title = format!("dsprep inspect --decisions {}", dir.display());
                    std::fs::write(
                        &path,
                        dsprep::inspect::render_decisions_svg(&decided, &title),
                    )
                    .with_context(|| format!("cannot write {}", path.display()))?;
                    println!(
                        "drew {}×{} SVG of {} decisions (shares and reported loss per source) to {}",
                        dsprep::inspect::WIDTH,
                        dsprep::inspect::HEIGHT,
                        decided.decisions.len(),
                        path.display()
                    );
                }
            } else if mix || csv.is_some() || plot.is_some() {
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
