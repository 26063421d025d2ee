//! How windows become per-rank batches: global step `s` is the `world_size × micro_batch`
//! consecutive windows starting at `s × world_size × micro_batch`, and rank `r` takes the
//! contiguous `micro_batch` windows at offset `r × micro_batch` inside it. Every rank gets the
//! same number of steps: a last, incomplete global batch is not served.

use crate::packed::Window;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLayout {
    pub world_size: u32,
    pub micro_batch: u32,
}

impl BatchLayout {
    pub fn global_batch(&self) -> u64 {
        u64::from(self.world_size) * u64::from(self.micro_batch)
    }

    /// Steps every rank gets out of `num_windows` windows.
    pub fn num_steps(&self, num_windows: u64) -> u64 {
        num_windows / self.global_batch()
    }

    /// The window indices rank `rank` reads at step `step`.
    pub fn windows(&self, step: u64, rank: u32) -> std::ops::Range<u64> {
        let first = step * self.global_batch() + u64::from(rank) * u64::from(self.micro_batch);
        first..first + u64::from(self.micro_batch)
    }
}

/// One rank's rows for one step, borrowed from the memory map.
#[derive(Debug)]
pub struct Batch<'a> {
    pub step: u64,
    pub rank: u32,
    pub rows: Vec<Window<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_tile_the_global_batch() {
        let layout = BatchLayout {
            world_size: 4,
            micro_batch: 2,
        };
        let all: Vec<u64> = (0..4).flat_map(|r| layout.windows(3, r)).collect();
        assert_eq!(all, (24..32).collect::<Vec<_>>());
        assert_eq!(layout.num_steps(31), 3);
        assert_eq!(layout.num_steps(32), 4);
    }
}
