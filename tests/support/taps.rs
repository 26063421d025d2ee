//! What a `dsprep tap` process recorded, for the soaks: each ends a rank's life (a clean close,
//! a kill, a failure) and the next one starts at the step after the last complete one, holding
//! the daemon to the chain saved from it, as a restarted trainer does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The steps a tap recorded so far: its complete `.jsonl` lines (a killed one may leave half a
/// line), each a step's header or the end of data.
pub fn recorded(out: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(format!("{}.jsonl", out.display())).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What an ended tap of one rank (micro batch 1) added to the rank's stream.
pub struct Taken {
    /// Complete steps, from the one the tap started at.
    pub steps: u64,
    /// The chain after its last complete step (`step_end`), to expect from the next tap.
    pub chain: Option<String>,
    /// Whether it reached the end of data.
    pub end: bool,
    /// The token bytes of those steps.
    pub bytes: Vec<u8>,
}

/// The complete steps the tap writing `out` recorded for `rank` of `world`, starting at `next`:
/// in order, each row's chain checked against the packed stream's `marks`, the end of data at
/// `num_steps`; with their `step_bytes` each.
pub fn take(
    out: &Path,
    rank: u32,
    world: u32,
    next: u64,
    num_steps: u64,
    step_bytes: usize,
    marks: &[String],
) -> Taken {
    let bytes = std::fs::read(out).unwrap_or_default();
    let mut taken = Taken {
        steps: 0,
        chain: None,
        end: false,
        bytes: Vec::new(),
    };
    for line in recorded(out) {
        let step = line["step"].as_u64().unwrap();
        assert_eq!(step, next + taken.steps, "rank {rank}: steps in order");
        if line.get("end_of_data").is_some() {
            assert_eq!(step, num_steps, "rank {rank}: the end is the end");
            taken.end = true;
            break;
        }
        let (first, chain) = (line["first_window"].as_u64().unwrap(), &line["chain"]);
        assert_eq!(first, step * u64::from(world) + u64::from(rank));
        let hex = |key: &str| chain[key].as_str().unwrap().to_string();
        assert_eq!(
            [hex("rows_start"), hex("rows_end")],
            [
                marks[first as usize].clone(),
                marks[first as usize + 1].clone()
            ],
            "rank {rank} step {step}: the stream chain"
        );
        taken.chain = Some(hex("step_end"));
        taken.steps += 1;
    }
    let kept = taken.steps as usize * step_bytes;
    assert!(bytes.len() >= kept, "rank {rank}: tokens behind headers");
    taken.bytes = bytes[..kept].to_vec();
    taken
}

/// One rank of a soak: its tap processes, one after another, and what they received.
pub struct TapRank {
    pub rank: u32,
    pub child: Option<Child>,
    /// The current process's output (raw tokens; `.jsonl` headers beside it; `.err` stderr).
    pub out: PathBuf,
    pub lives: u32,
    /// Steps complete over all earlier processes: the next process starts here.
    pub next: u64,
    /// The stream chain before `next`, as a trainer saves it.
    pub chain: Option<String>,
    pub received: Vec<u8>,
    pub done: bool,
}

impl TapRank {
    pub fn new(rank: u32) -> TapRank {
        TapRank {
            rank,
            child: None,
            out: PathBuf::new(),
            lives: 0,
            next: 0,
            chain: None,
            received: Vec::new(),
            done: false,
        }
    }

    /// Start the rank's next tap on `endpoint` (`world` ranks) for `steps` steps from `next`,
    /// holding the daemon to the saved chain; `extra` goes to the tap (`--timeout-s`, …).
    pub fn spawn(&mut self, dir: &Path, endpoint: &str, world: u32, steps: u64, extra: &[&str]) {
        self.lives += 1;
        self.out = dir.join(format!("rank{}-life{}.bin", self.rank, self.lives));
        let mut command = Command::new(env!("CARGO_BIN_EXE_dsprep"));
        command
            .args(["tap", "--endpoint", endpoint])
            .args(["--world-size", &world.to_string()])
            .args(["--rank", &self.rank.to_string()])
            .args(["--start-step", &self.next.to_string()])
            .args(["--steps", &steps.to_string()])
            .args(extra)
            .arg("--out")
            .arg(&self.out);
        if let Some(chain) = &self.chain {
            command.args(["--expect-chain", chain]);
        }
        let stderr = std::fs::File::create(format!("{}.err", self.out.display())).unwrap();
        self.child = Some(
            command
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("spawn dsprep tap"),
        );
    }

    /// Take what the rank's ended tap recorded ([`take`]) into what the rank received.
    pub fn collect(&mut self, world: u32, num_steps: u64, step_bytes: usize, marks: &[String]) {
        let taken = take(
            &self.out, self.rank, world, self.next, num_steps, step_bytes, marks,
        );
        self.next += taken.steps;
        self.chain = taken.chain.or(self.chain.take());
        self.done |= taken.end;
        self.received.extend_from_slice(&taken.bytes);
    }
}
