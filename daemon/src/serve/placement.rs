//! Where a daemon starts serving, in one place for the single daemon and the node daemons: step
//! 0, or (resuming) the first step a rank asks for, holding the [`HISTORY_STEPS`] below it as an
//! uninterrupted daemon holds them, as far as the checkpoint it continues from reaches.

use super::store::{HISTORY_STEPS, StepStore};

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
/// checkpoint reaches. A rank whose request was lost with a killed daemon asks again only after
/// its timeout, when the others may have placed the new daemon above its step: it still finds
/// its step. Node daemons recompute each lane from its own checkpoint (`windows` 0).
pub fn first_held_step(start: u64, windows: u64, global_batch: u64) -> u64 {
    start
        .saturating_sub(HISTORY_STEPS)
        .max(windows.div_ceil(global_batch))
        .min(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_daemon_keeps_the_history_its_checkpoint_reaches() {
        assert_eq!(
            first_held_step(123, 0, 4),
            123 - HISTORY_STEPS,
            "no checkpoint"
        );
        assert_eq!(
            first_held_step(123, 470, 4),
            118,
            "a checkpoint at window 470"
        );
        assert_eq!(
            first_held_step(123, 492, 4),
            123,
            "a checkpoint at the step asked for"
        );
        assert_eq!(first_held_step(3, 0, 4), 0);
        assert_eq!(first_held_step(0, 0, 4), 0);
    }
}
