//! `dsprep pack`'s flags, and their check into the [`PackCommand`] it runs: the options, and
//! whether it packs the whole recipe, a part of its lanes or the finish. The defaults that come
//! from the machine or the environment (every core; a Slurm array task's part, from
//! `SLURM_ARRAY_TASK_ID`/`_MIN`/`_COUNT`, named in `--help`) are read here, once.

use super::{PackOptions, Parts};
use anyhow::Context;
use dsprep_mixers::EngineChoice;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// The recipe (TOML).
    #[arg(long, required_unless_present = "lineage", conflicts_with = "lineage")]
    pub recipe: Option<PathBuf>,
    /// Pack the stream a daemon served, changes of course included: its state directory's
    /// lineage.json (or that directory), instead of --recipe.
    #[arg(long, conflicts_with_all = ["part", "parts", "finish", "plan"])]
    pub lineage: Option<PathBuf>,
    /// Output directory; written under a temporary name and renamed when complete.
    #[arg(long)]
    pub out: PathBuf,
    /// Tokenizer threads (default: every core). The output does not depend on it.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Target size of one token shard, MiB.
    #[arg(long, default_value_t = 256)]
    pub shard_mib: u64,
    /// Replace an existing output directory.
    #[arg(long)]
    pub force: bool,
    /// Seconds between checkpoints in OUT.partial; a killed pack continues from the last one
    /// when run again with the same recipe and output.
    #[arg(long, default_value_t = 60)]
    pub checkpoint_secs: u64,
    /// Start over instead of continuing an interrupted pack to the same output.
    #[arg(long)]
    pub fresh: bool,
    /// No progress display.
    #[arg(long, short)]
    pub quiet: bool,
    /// Tokenizer engine; every engine gives the same ids. "auto": the fastest measured for the
    /// file's family (HF tokenizers 1.x for byte-level BPE; dsprep's own for SentencePiece-style
    /// BPE and for files 1.x does not encode exactly; else HF 0.23), the log's engine line says
    /// which and why. "own": dsprep's own engine where it reproduces the file (else HF 0.23);
    /// "hf": HF tokenizers 0.23; "hf1": HF tokenizers 1.x (a release candidate; HF 0.23 when
    /// 1.x does not read the file). What "auto" chose, and dsprep's engine's tables, are kept per
    /// tokenizer file in DSPREP_ENGINE_CACHE (a directory, or "off"; default
    /// $XDG_CACHE_HOME/dsprep/engines, else ~/.cache/dsprep/engines).
    #[arg(long, default_value = "auto", value_parser = ["auto", "own", "hf", "hf1"])]
    pub tokenizer_engine: String,
    /// For a recipe with `[lanes]`: pack only this part's lanes into OUT.lanes/ (a Slurm array
    /// task). Default with --parts absent: SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN when
    /// SLURM_ARRAY_TASK_COUNT is set, else every lane and the finish in one run.
    #[arg(long, requires = "parts")]
    pub part: Option<u32>,
    /// How many parts the lanes are split into (see --part).
    #[arg(long, requires = "part")]
    pub parts: Option<u32>,
    /// Put the lanes in OUT.lanes/ (packed by every part) together into OUT.
    #[arg(long, conflicts_with_all = ["part", "parts"])]
    pub finish: bool,
    /// A frozen plan of this recipe (`dsprep plan --out`): list nothing, read the files it
    /// names (give every part of a job the same plan).
    #[arg(long)]
    pub plan: Option<PathBuf>,
}

/// What `dsprep pack` was asked to do.
pub struct PackCommand {
    pub options: PackOptions,
    /// `--part`/`--parts`.
    pub parts: Option<Parts>,
    /// The part of the Slurm array task this runs in (used for a recipe with `[lanes]` only).
    pub slurm: Option<Parts>,
    /// `--finish`.
    pub finish: bool,
}

impl TryFrom<PackArgs> for PackCommand {
    type Error = anyhow::Error;

    fn try_from(args: PackArgs) -> anyhow::Result<PackCommand> {
        let threads = default_threads(args.threads)?;
        let options = PackOptions {
            checkpoint_secs: args.checkpoint_secs,
            fresh: args.fresh,
            recipe: args.recipe.unwrap_or_default(),
            lineage: args.lineage,
            out: args.out,
            threads,
            shard_bytes: args.shard_mib << 20,
            force: args.force,
            progress: !args.quiet,
            engine: engine_choice(&args.tokenizer_engine),
            plan: args.plan,
        };
        let parts = match (args.part, args.parts) {
            (Some(part), Some(parts)) => Some(Parts { part, parts }),
            _ => None,
        };
        Ok(PackCommand {
            options,
            parts,
            slurm: slurm_array_parts()?,
            finish: args.finish,
        })
    }
}

/// The part of a Slurm array task (`SLURM_ARRAY_TASK_ID` counted from `SLURM_ARRAY_TASK_MIN`,
/// of `SLURM_ARRAY_TASK_COUNT`), when it runs in one.
fn slurm_array_parts() -> anyhow::Result<Option<Parts>> {
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
    Ok(Some(Parts {
        part: id.saturating_sub(min),
        parts: count,
    }))
}

/// `--threads`: at least 1; by default every core.
pub fn default_threads(threads: Option<usize>) -> anyhow::Result<usize> {
    match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)),
    }
}

/// `--tokenizer-engine` (clap has already restricted it to "auto", "own", "hf" or "hf1").
pub fn engine_choice(name: &str) -> EngineChoice {
    match name {
        "own" => EngineChoice::Own,
        "hf" => EngineChoice::Hf,
        "hf1" => EngineChoice::Hf1,
        _ => EngineChoice::Auto,
    }
}
