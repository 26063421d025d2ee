//! `dsprep pack --status`: where every part of a job split into parts stands, from one listing
//! of `OUT.lanes/` and one small file per part that needs one (its record, [`super::records`],
//! or its lane's lock): O(parts) metadata operations, whatever the lanes and their files. Then
//! the exact `sbatch` commands that resubmit only the parts to run again, each array's indices
//! below the site's `MaxArraySize` (part = `PART_OFFSET` + array index). The finish, run before
//! every part is complete, says the same.
//!
//! A part is, in this order: complete (its `.done` record, or all its lanes there), running (a
//! lane's partial directory locked by a live task), failed (its `.failed` record, with the
//! error), stale (a lane's partial directory no task holds: the task was killed), or missing.

use super::output;
use super::part_list;
use super::records::{self, Ended};
use anyhow::{Context, anyhow, bail};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Slurm's default `MaxArraySize`: array indices run below it.
pub const DEFAULT_MAX_ARRAY_SIZE: u32 = 1001;

/// How the resubmission is written: the job's part count and the site's array limit, with the
/// part script and extra `sbatch` flags (`config/slurm/pack.sh` passes its own on).
#[derive(Clone, Debug)]
pub struct Resubmit {
    /// `--parts`: the job's part count (default: one part per lane).
    pub parts: Option<u32>,
    /// `DSPREP_MAX_ARRAY_SIZE`, else `MaxArraySize` of `scontrol show config`, else
    /// [`DEFAULT_MAX_ARRAY_SIZE`].
    pub max_array_size: u32,
    /// `DSPREP_PART_SCRIPT`, else `config/slurm/pack-part.sbatch`.
    pub script: String,
    /// `DSPREP_SBATCH_FLAGS`: written into each command as given (shell words).
    pub sbatch_flags: String,
}

/// Where one part stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartState {
    Complete,
    Running { partial: PathBuf },
    Failed { reason: String },
    Stale { partial: PathBuf },
    Missing { complete: u32, lanes: u32 },
}

impl PartState {
    /// Whether a resubmission runs it again (not complete, and no task on it).
    fn to_rerun(&self) -> bool {
        !matches!(self, PartState::Complete | PartState::Running { .. })
    }
}

/// The job in `OUT.lanes/`, part by part.
pub struct Status {
    pub out: PathBuf,
    pub lanes_dir: PathBuf,
    pub lanes: u32,
    pub parts: u32,
    /// `OUT` is there: the finish has run.
    pub finished: bool,
    pub states: Vec<PartState>,
    /// The commands that run the parts to rerun again.
    pub commands: Vec<String>,
    pub max_array_size: u32,
}

/// What the command line said, to write the resubmission with.
pub struct Job<'a> {
    pub recipe: &'a Path,
    pub out: &'a Path,
    pub plan: Option<&'a Path>,
    pub recipe_hash: &'a str,
    pub lanes: u32,
}

/// The lanes of part `part` of `parts` over `lanes` lanes: those `l` with `l × parts div lanes
/// = part`, a run of consecutive lanes.
pub fn part_lanes(part: u32, parts: u32, lanes: u32) -> std::ops::Range<u32> {
    let first = |p: u32| (u64::from(p) * u64::from(lanes)).div_ceil(u64::from(parts)) as u32;
    first(part)..first(part + 1)
}

/// Where every part of `job` stands.
pub fn status(job: &Job, resubmit: &Resubmit) -> anyhow::Result<Status> {
    let parts = resubmit.parts.unwrap_or(job.lanes);
    if parts == 0 || parts > job.lanes {
        bail!(
            "--parts {parts} is not a part count of this plan: its recipe has lanes.count = {}, \
             so parts run from 1 to {}",
            job.lanes,
            job.lanes
        );
    }
    let lanes_dir = output::sibling_dir(job.out, "lanes")?;
    let finished = job.out.join("manifest.json").is_file();
    let names = listing(&lanes_dir)?;
    let mut states = Vec::with_capacity(parts as usize);
    for part in 0..parts {
        states.push(match finished {
            true => PartState::Complete,
            false => part_state(&lanes_dir, &names, job, part, parts)?,
        });
    }
    let rerun: Vec<u32> = (0..parts)
        .filter(|&p| states[p as usize].to_rerun())
        .collect();
    let commands = commands(job, resubmit, parts, &rerun);
    Ok(Status {
        out: job.out.to_path_buf(),
        lanes_dir,
        lanes: job.lanes,
        parts,
        finished,
        states,
        commands,
        max_array_size: resubmit.max_array_size,
    })
}

/// The names in `dir` (none when it is not there): one listing for every part.
fn listing(dir: &Path) -> anyhow::Result<HashSet<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let mut names = HashSet::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        names.insert(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

fn part_state(
    dir: &Path,
    names: &HashSet<String>,
    job: &Job,
    part: u32,
    parts: u32,
) -> anyhow::Result<PartState> {
    let record = |ended| -> anyhow::Result<Option<records::PartRecord>> {
        if !names.contains(&records::name(part, parts, ended)) {
            return Ok(None);
        }
        let path = records::path(dir, part, parts, ended);
        let record = records::read(&path)?;
        if record.recipe_hash != job.recipe_hash {
            bail!(
                "{} was written for recipe hash {}, but recipe {} has hash {}: {} holds another \
                 recipe's parts (remove it, or give the recipe and plan its parts ran with)",
                path.display(),
                record.recipe_hash,
                job.recipe.display(),
                job.recipe_hash,
                dir.display()
            );
        }
        Ok(Some(record))
    };
    if record(Ended::Done)?.is_some() {
        return Ok(PartState::Complete);
    }
    let lanes = part_lanes(part, parts, job.lanes);
    let mut stale = None;
    for lane in lanes.clone() {
        let name = format!("lane-{lane:05}.partial");
        if names.contains(&name) {
            let partial = dir.join(name);
            if output::partial_held(&partial)? {
                return Ok(PartState::Running { partial });
            }
            stale.get_or_insert(partial);
        }
    }
    if let Some(failed) = record(Ended::Failed)? {
        let reason = failed.error.unwrap_or_else(|| "no error recorded".into());
        return Ok(PartState::Failed { reason });
    }
    if let Some(partial) = stale {
        return Ok(PartState::Stale { partial });
    }
    let complete = lanes
        .clone()
        .filter(|l| names.contains(&format!("lane-{l:05}")))
        .count() as u32;
    Ok(match complete == lanes.len() as u32 {
        true => PartState::Complete,
        false => PartState::Missing {
            complete,
            lanes: lanes.len() as u32,
        },
    })
}

/// The `sbatch` commands that run `rerun` (sorted part numbers) again, one task a part: parts
/// `k × M … (k + 1) × M − 1` go in one array with `PART_OFFSET = k × M` (M: `MaxArraySize`), so
/// every index is below M.
fn commands(job: &Job, resubmit: &Resubmit, parts: u32, rerun: &[u32]) -> Vec<String> {
    let m = resubmit.max_array_size.max(1);
    let mut commands = Vec::new();
    let mut rest = rerun;
    while let Some(&first) = rest.first() {
        let offset = first / m * m;
        let n = rest.iter().take_while(|&&p| p / m == first / m).count();
        let indices: Vec<u32> = rest[..n].iter().map(|p| p - offset).collect();
        let mut command = format!(
            "sbatch --array={} --export=ALL,PARTS={parts},PARTS_PER_TASK=1,PART_OFFSET={offset}",
            part_list::compress(&indices)
        );
        if !resubmit.sbatch_flags.trim().is_empty() {
            command.push(' ');
            command.push_str(resubmit.sbatch_flags.trim());
        }
        let mut words = vec![resubmit.script.clone()];
        words.push(job.recipe.display().to_string());
        words.push(job.out.display().to_string());
        words.extend(job.plan.map(|p| p.display().to_string()));
        for word in words {
            command.push(' ');
            command.push_str(&shell_word(&word));
        }
        commands.push(command);
        rest = &rest[n..];
    }
    commands
}

/// "lane 5" or "lanes 2-3".
fn lanes_word(lanes: &[u32]) -> String {
    match lanes {
        [lane] => format!("lane {lane}"),
        _ => format!("lanes {}", part_list::compress(lanes)),
    }
}

/// `word` as one shell word: as is when plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./,:=+@%".contains(c);
    match !word.is_empty() && word.chars().all(plain) {
        true => word.to_string(),
        false => format!("'{}'", word.replace('\'', r"'\''")),
    }
}

/// Why the finish of `job` cannot run: the lanes `missing` from `lanes_dir` on the first line,
/// then, with `resubmit`, the parts to run again and their resubmission, as `--status` says them.
pub fn not_finished(
    job: &Job,
    lanes_dir: &Path,
    missing: &[u32],
    resubmit: Option<&Resubmit>,
) -> anyhow::Error {
    let head = format!(
        "cannot finish {}: lane(s) {} of {} are not packed in {} (or belong to another recipe)",
        job.out.display(),
        part_list::compress(missing),
        job.lanes,
        lanes_dir.display()
    );
    match resubmit.map(|r| status(job, r).map(|s| s.what_is_left())) {
        Some(Ok(left)) if !left.is_empty() => anyhow!("{head}:\n{}", left.trim_end()),
        Some(Err(e)) => e.context(head),
        _ => anyhow!("{head}; run the parts that pack them (dsprep pack --part I --parts P)"),
    }
}

impl Status {
    /// The parts that are not complete, in order.
    pub fn incomplete(&self) -> Vec<u32> {
        (0..self.parts)
            .filter(|&p| self.states[p as usize] != PartState::Complete)
            .collect()
    }

    /// One line per part that is not complete (the parts not started at all together on one),
    /// then the resubmission.
    pub fn what_is_left(&self) -> String {
        let mut text = String::new();
        let mut not_started = Vec::new();
        for part in self.incomplete() {
            let lanes: Vec<u32> = part_lanes(part, self.parts, self.lanes).collect();
            let said = match &self.states[part as usize] {
                PartState::Complete => continue,
                PartState::Missing { complete: 0, .. } => {
                    not_started.push(part);
                    continue;
                }
                PartState::Running { partial } => {
                    format!("running ({} is locked by its task)", partial.display())
                }
                PartState::Failed { reason } => format!("failed: {reason}"),
                PartState::Stale { partial } => format!(
                    "stale ({} is held by no task: its task was killed)",
                    partial.display()
                ),
                PartState::Missing { complete, lanes } => {
                    format!("missing ({complete} of {lanes} lanes complete)")
                }
            };
            let _ = writeln!(text, "part {part} ({}): {said}", lanes_word(&lanes));
        }
        if !not_started.is_empty() {
            let _ = writeln!(
                text,
                "part(s) {}: missing (no lane packed)",
                part_list::compress(&not_started)
            );
        }
        let rerun: Vec<u32> = (0..self.parts)
            .filter(|&p| self.states[p as usize].to_rerun())
            .collect();
        if !rerun.is_empty() {
            let _ = writeln!(
                text,
                "resubmit the {} part(s) {} (array indices below MaxArraySize {}; part = \
                 PART_OFFSET + index):",
                rerun.len(),
                part_list::compress(&rerun),
                self.max_array_size
            );
            for command in &self.commands {
                let _ = writeln!(text, "  {command}");
            }
        }
        text
    }

    /// `--status`'s report.
    pub fn report(&self) -> String {
        let complete = self.parts as usize - self.incomplete().len();
        let mut text = format!(
            "{}: {} lanes in {} parts; {complete} of {} parts complete",
            self.out.display(),
            self.lanes,
            self.parts,
            self.parts
        );
        if self.finished {
            text.push_str(" (finished: the output is there)\n");
            return text;
        }
        let _ = writeln!(text, " (in {})", self.lanes_dir.display());
        text.push_str(&self.what_is_left());
        if complete == self.parts as usize {
            text.push_str("every part is complete: run the finish (dsprep pack --finish)\n");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_lanes_are_the_division_of_lanes() {
        for (lanes, parts) in [(8, 4), (8, 3), (4096, 64), (7, 7), (10, 1)] {
            let mut all = Vec::new();
            for part in 0..parts {
                for lane in part_lanes(part, parts, lanes) {
                    assert_eq!(
                        u64::from(lane) * u64::from(parts) / u64::from(lanes),
                        u64::from(part)
                    );
                    all.push(lane);
                }
            }
            assert_eq!(all, (0..lanes).collect::<Vec<_>>());
        }
    }

    #[test]
    fn resubmissions_stay_below_max_array_size() {
        let job = Job {
            recipe: Path::new("r.toml"),
            out: Path::new("my out"),
            plan: Some(Path::new("p.json")),
            recipe_hash: "h",
            lanes: 4096,
        };
        let resubmit = Resubmit {
            parts: Some(4096),
            max_array_size: 1001,
            script: "pack-part.sbatch".into(),
            sbatch_flags: "-o log-%A_%a.out".into(),
        };
        let got = commands(&job, &resubmit, 4096, &[3, 4, 5, 17, 1000, 1001, 4095]);
        assert_eq!(
            got,
            vec![
                "sbatch --array=3-5,17,1000 --export=ALL,PARTS=4096,PARTS_PER_TASK=1,\
                 PART_OFFSET=0 -o log-%A_%a.out pack-part.sbatch r.toml 'my out' p.json",
                "sbatch --array=0 --export=ALL,PARTS=4096,PARTS_PER_TASK=1,PART_OFFSET=1001 \
                 -o log-%A_%a.out pack-part.sbatch r.toml 'my out' p.json",
                "sbatch --array=91 --export=ALL,PARTS=4096,PARTS_PER_TASK=1,PART_OFFSET=4004 \
                 -o log-%A_%a.out pack-part.sbatch r.toml 'my out' p.json",
            ]
        );
    }
}
