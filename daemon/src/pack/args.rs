//! `dsprep pack`'s flags, and their check into the [`PackCommand`] it runs: the options, and
//! whether it packs the whole recipe, parts of its lanes, the finish or the status. The defaults
//! that come from the machine or the environment (every core; a Slurm task's parts, from
//! `SLURM_ARRAY_TASK_ID`/`_MIN`/`_COUNT` or `SLURM_PROCID`; the resubmission's
//! `DSPREP_MAX_ARRAY_SIZE`, `DSPREP_PART_SCRIPT` and `DSPREP_SBATCH_FLAGS`, named in `--help`)
//! are read here, once.

use super::status::{DEFAULT_MAX_ARRAY_SIZE, Resubmit};
use super::{PackOptions, Parts, part_list};
use anyhow::{Context, bail};
use dsprep_mixers::EngineChoice;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// The recipe (TOML).
    #[arg(long, required_unless_present = "lineage", conflicts_with = "lineage")]
    pub recipe: Option<PathBuf>,
    /// Pack the stream a daemon served, changes of course included: its state directory's
    /// lineage.json (or that directory), instead of --recipe.
    #[arg(long, conflicts_with_all = ["part", "parts", "finish", "plan", "status"])]
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
    /// For a recipe with `[lanes]`: pack only these parts' lanes into OUT.lanes/, one part after
    /// another: a part number, or a list as Slurm writes array indices (3,17,40-42). Default
    /// with --parts absent: SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN of SLURM_ARRAY_TASK_COUNT
    /// when that is set, else every lane and the finish in one run.
    #[arg(long, requires = "parts")]
    pub part: Option<String>,
    /// How many parts the lanes are split into. Without --part, in a Slurm task: the task's
    /// parts, --part-offset + task × --parts-per-task and the next ones (task: SLURM_ARRAY_TASK_ID
    /// in an array task, else SLURM_PROCID: an srun task of one allocation). With --status and
    /// --finish: the job's part count (default: one part per lane).
    #[arg(long)]
    pub parts: Option<u32>,
    /// Parts each Slurm task packs in turn (with --parts, without --part).
    #[arg(long, requires = "parts", conflicts_with = "part")]
    pub parts_per_task: Option<u32>,
    /// The part of task 0 (with --parts, without --part): a resubmission's array indices start
    /// at 0 below MaxArraySize, its parts at this offset.
    #[arg(long, requires = "parts", conflicts_with = "part")]
    pub part_offset: Option<u32>,
    /// Put the lanes in OUT.lanes/ (packed by every part) together into OUT. Run before every
    /// part is complete, it names the parts to run again, as --status does.
    #[arg(long, conflicts_with_all = ["part", "parts_per_task", "part_offset"])]
    pub finish: bool,
    /// Say where each part of OUT stands (complete, running, failed with its error, stale: its
    /// task killed, missing) and print the sbatch commands that resubmit only the parts to run
    /// again, each array below MaxArraySize (DSPREP_MAX_ARRAY_SIZE, else `scontrol show config`'s,
    /// else 1001), with the part script DSPREP_PART_SCRIPT (default
    /// config/slurm/pack-part.sbatch) and the sbatch flags DSPREP_SBATCH_FLAGS.
    #[arg(long, conflicts_with_all = ["part", "parts_per_task", "part_offset", "finish"])]
    pub status: bool,
    /// A frozen plan of this recipe (`dsprep plan --out`): list nothing, read the files it
    /// names (give every part of a job the same plan).
    #[arg(long)]
    pub plan: Option<PathBuf>,
}

/// What `dsprep pack` was asked to do.
pub struct PackCommand {
    pub options: PackOptions,
    /// `--part`/`--parts`, or a Slurm task's parts from `--parts`: packed in turn.
    pub parts: Option<Vec<Parts>>,
    /// The part of the Slurm array task this runs in (used for a recipe with `[lanes]` only).
    pub slurm: Option<Parts>,
    /// `--finish`.
    pub finish: bool,
    /// `--status`.
    pub status: bool,
    /// How `--status` and the finish write the resubmission (read for those only).
    pub resubmit: Option<Resubmit>,
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
        let list = match (&args.part, args.parts) {
            _ if args.status || args.finish => None,
            (Some(part), Some(_)) => Some(part_list::parse(part)?),
            (None, Some(parts)) => Some(task_parts(
                parts,
                args.parts_per_task.unwrap_or(1),
                args.part_offset.unwrap_or(0),
            )?),
            _ => None,
        };
        let parts = list.map(|list| {
            (list.into_iter())
                .map(|part| Parts {
                    part,
                    parts: args.parts.unwrap_or_default(),
                })
                .collect()
        });
        Ok(PackCommand {
            options,
            parts,
            slurm: slurm_array_parts()?,
            finish: args.finish,
            status: args.status,
            resubmit: match args.status || args.finish {
                true => Some(resubmit(args.parts)?),
                false => None,
            },
        })
    }
}

/// A whole-number environment variable, when set.
fn env_number(name: &str) -> anyhow::Result<Option<u32>> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .with_context(|| format!("{name}={v:?} is not a whole number")),
        Err(_) => Ok(None),
    }
}

/// The parts of this Slurm task, `offset + task × per_task` and the `per_task − 1` after it
/// (below `parts`): the task is `SLURM_ARRAY_TASK_ID` in an array task, else `SLURM_PROCID`.
fn task_parts(parts: u32, per_task: u32, offset: u32) -> anyhow::Result<Vec<u32>> {
    let (name, task) = match env_number("SLURM_ARRAY_TASK_ID")? {
        Some(task) => ("SLURM_ARRAY_TASK_ID", task),
        None => match env_number("SLURM_PROCID")? {
            Some(task) => ("SLURM_PROCID", task),
            None => bail!(
                "--parts {parts} without --part packs a Slurm task's parts, but neither \
                 SLURM_ARRAY_TASK_ID nor SLURM_PROCID is set: give --part"
            ),
        },
    };
    if per_task == 0 {
        bail!("--parts-per-task must be at least 1");
    }
    let first = u64::from(offset) + u64::from(task) * u64::from(per_task);
    if first >= u64::from(parts) {
        bail!(
            "{name}={task} with --part-offset {offset} and --parts-per-task {per_task} starts at \
             part {first}, which is not below --parts {parts}: parts are numbered 0..{}",
            parts.saturating_sub(1)
        );
    }
    let end = (first + u64::from(per_task)).min(u64::from(parts));
    Ok((first as u32..end as u32).collect())
}

/// How the resubmission is written (`--status`, the finish): the job's `--parts`, and the site's
/// `DSPREP_MAX_ARRAY_SIZE` (else `MaxArraySize` of `scontrol show config`, else Slurm's default),
/// `DSPREP_PART_SCRIPT` and `DSPREP_SBATCH_FLAGS`.
fn resubmit(parts: Option<u32>) -> anyhow::Result<Resubmit> {
    let max_array_size = match env_number("DSPREP_MAX_ARRAY_SIZE")? {
        Some(max) => max,
        None => scontrol_max_array_size().unwrap_or(DEFAULT_MAX_ARRAY_SIZE),
    };
    if max_array_size == 0 {
        bail!("DSPREP_MAX_ARRAY_SIZE=0: Slurm's MaxArraySize is at least 1");
    }
    Ok(Resubmit {
        parts,
        max_array_size,
        script: std::env::var("DSPREP_PART_SCRIPT")
            .unwrap_or_else(|_| "config/slurm/pack-part.sbatch".into()),
        sbatch_flags: std::env::var("DSPREP_SBATCH_FLAGS").unwrap_or_default(),
    })
}

/// The cluster's `MaxArraySize`, from `scontrol show config` where it answers within a second
/// (without its controller, `scontrol` retries for about 9 s: then Slurm's default is used).
fn scontrol_max_array_size() -> Option<u32> {
    use std::io::Read;
    let mut child = std::process::Command::new("scontrol")
        .args(["show", "config"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    // The whole configuration (about 10 KiB) fits the pipe: it was written before the exit.
    let mut text = String::new();
    child.stdout.take()?.read_to_string(&mut text).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "MaxArraySize").then(|| value.trim().parse().ok())?
    })
}

/// The part of a Slurm array task (`SLURM_ARRAY_TASK_ID` counted from `SLURM_ARRAY_TASK_MIN`,
/// of `SLURM_ARRAY_TASK_COUNT`), when it runs in one.
fn slurm_array_parts() -> anyhow::Result<Option<Parts>> {
    let var = env_number;
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
