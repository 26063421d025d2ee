//! Checkpoints where the docs promise them: `--checkpoint-every N` writes one within N steps
//! below every multiple of N that the slowest rank reaches, from the stream's first steps to its
//! end (a real daemon and `dsprep tap` ranks). SIGTERM's checkpoint, early in the stream too, and
//! the resume from it are tests/resume.rs's.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use support::serve_run::{Run, global_batches};
use support::*;

/// The steps of the checkpoints a daemon's log says it wrote, in order.
fn written_steps(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|line| line.split(" written: step ").nth(1))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn a_checkpoint_lies_within_every_steps_below_each_multiple_from_start_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    // 16 windows of 513 tokens a step: the quickstart's longest documents span under 4 steps.
    let (world, mb, every) = (2u32, 8u64, 4u64);
    let gb = u64::from(world) * mb;
    let num_steps = dataset.num_windows() / gb;
    let run = Run {
        dir: tmp.path(),
        recipe: &quickstart(),
        state: tmp.path().join("state"),
        every,
    };
    let mut daemon = run.start(world, mb as u32, false).unwrap();
    let got = run.pull(&daemon, world, 0, num_steps);
    assert!(got == global_batches(&dataset, gb, 0..num_steps));
    daemon.terminate();
    let log = daemon.log_text();
    let written = written_steps(&log);
    // The ranks asked for every step up to the last: each multiple of 4 up to it has a
    // checkpoint at most 3 steps below it, the first one included.
    let last = num_steps - 1;
    for multiple in (every..=last).step_by(every as usize) {
        assert!(
            written
                .iter()
                .any(|&s| s <= multiple && s + every > multiple),
            "no checkpoint within {every} steps below step {multiple}: {written:?}\n{log}"
        );
    }
    assert!(written.windows(2).all(|w| w[0] < w[1]), "{written:?}");
    assert!(written.iter().all(|&s| s <= last), "{written:?}");
}
