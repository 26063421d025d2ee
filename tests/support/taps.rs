//! What a `dsprep tap` process recorded, for the soaks: each ends a rank's life (a clean close,
//! a kill, a failure) and the next one starts at the step after the last complete one, holding
//! the daemon to the chain saved from it, as a restarted trainer does.

use std::path::Path;

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
