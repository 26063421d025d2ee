//! Where a daemon starts serving, in one place for the single daemon and the node daemons: step
//! 0, or (resuming) the first step a rank asks for, holding the [`HISTORY_STEPS`] below it as an
//! uninterrupted daemon holds them, as far as the checkpoint it continues from reaches.

use super::store::{HISTORY_STEPS, StepStore};
use dsprep_mixers::lineage::Lineage;

/// The step the ranks start at: 0, or when resuming the first step a rank asks for. `None` when
/// the daemon is shut down while waiting.
pub fn first_request(resume: bool, store: &StepStore) -> Option<u64> {
    if !resume {
        return Some(0);
    }
    store.wait_first_request().ok()
}

/// The first step a daemon starting at `start` (the lowest step asked for) holds, with the
/// pipeline at `windows` (restored from a checkpoint, or 0) of `global_batch` windows per step:
/// up to [`HISTORY_STEPS`] below `start`, as an uninterrupted daemon holds them, as far as the
/// checkpoint reaches and no lower than where the stream's steps took `global_batch` windows
/// (a change of course may have changed it). A rank whose request was lost with a killed
/// daemon asks again only after its timeout, when the others may have placed the new daemon
/// above its step: it still finds its step. Node daemons recompute each lane from its own
/// checkpoint (`windows` 0).
pub fn first_held_step(lineage: &Lineage, start: u64, windows: u64, global_batch: u64) -> u64 {
    let lowest =
        (lineage.step_at_window(windows)).max(lineage.first_step_of_batch(start, global_batch));
    held_from(start, lowest)
}

/// Up to [`HISTORY_STEPS`] below `start`, none below `lowest`.
pub fn held_from(start: u64, lowest: u64) -> u64 {
    start.saturating_sub(HISTORY_STEPS).max(lowest).min(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lineage of one recipe at 4 windows a step.
    fn plain() -> Lineage {
        Lineage::start(dsprep_mixers::test_fixtures::recipe(), "/r".into(), 2, 2)
    }

    #[test]
    fn a_resumed_daemon_keeps_the_history_its_checkpoint_reaches() {
        let l = plain();
        assert_eq!(
            first_held_step(&l, 123, 0, 4),
            123 - HISTORY_STEPS,
            "no checkpoint"
        );
        assert_eq!(
            first_held_step(&l, 123, 470, 4),
            118,
            "a checkpoint at window 470"
        );
        assert_eq!(
            first_held_step(&l, 123, 492, 4),
            123,
            "a checkpoint at the step asked for"
        );
        assert_eq!(first_held_step(&l, 3, 0, 4), 0);
        assert_eq!(first_held_step(&l, 0, 0, 4), 0);
    }

    #[test]
    fn no_step_is_held_below_a_change_of_the_global_batch() {
        let mut first = plain().segments[0].recipe.clone();
        first.sources[0].weight = 2.0;
        let l = plain().changed(first, "/r".into(), 120, 480, 900, 4, 2);
        assert_eq!(first_held_step(&l, 123, 0, 8), 120);
        assert_eq!(
            first_held_step(&l, 119, 0, 4),
            111,
            "below the change, as before"
        );
    }
}
