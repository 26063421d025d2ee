//! Lanes: how a recipe with `[lanes]` is split into independent pipelines, and how their windows
//! are put back together into one stream. Pure arithmetic, no IO: every driver (one `pack`,
//! `pack` parts plus their finish, one daemon, N node daemons) asks this module, so they agree.
//!
//! - **Input.** Each source's units (a local parquet row group, or a whole file otherwise), in
//!   the source's seeded shard order, are dealt to the lanes by size: each unit goes to the lane
//!   holding the fewest bytes of that source so far (ties: the fewest bytes of all sources, then
//!   the lowest lane). Every lane gets about `1/count` of every source, so the lanes' mixes run
//!   out at about the same point; a source with fewer units than lanes still spreads.
//! - **Each lane** is the recipe's whole pipeline (mix → shuffle → tokenize → pack) over its
//!   units, with its own seed ([`lane_seed`]) and `buffer_size / count` of the shuffle buffer.
//! - **Interleave.** The stream is made of blocks of `block_windows` windows: block `b` is lane
//!   `b mod count`'s block number `b div count`. The stream ends at the first block whose lane
//!   cannot fill it (a lane ends where its own mix ends, by the recipe's stopping strategy).
//!   None of this depends on how many processes run the lanes.
//! - **Nodes.** A global step of `G` windows holds `B = G / block_windows` blocks. With `N`
//!   nodes, node `n` serves the ranks whose windows are the `n`-th `1/N` of every step; when `N`
//!   divides `B` and `B` divides `count`, those windows come from the lanes `l` with
//!   `(l mod B) div (B / N) = n` and no others ([`NodeSlice`]). Steps count from an origin (a
//!   step and its first window: 0 and 0, or where a change of course set this global batch),
//!   whose block must begin a round of `B` blocks.

mod shares;

pub use shares::{LaneShares, lane_shares};

use crate::recipe::LanesSpec;
use sha2::{Digest, Sha256};

/// The seed of lane `lane`'s mixer and shuffler: derived from the recipe seed, so lanes are
/// independent streams and none equals the unpartitioned stream.
pub fn lane_seed(seed: u64, lane: u32) -> u64 {
    let digest = Sha256::digest(format!("dsprep/lane/{lane}/{seed}").as_bytes());
    u64::from_le_bytes(digest[..8].try_into().expect("sha256 has 32 bytes"))
}

/// Lane `lane`'s share of a shuffle buffer of `buffer_size` documents (the shares add up to it).
pub fn lane_buffer_size(buffer_size: usize, count: u32, lane: u32) -> usize {
    let count = count as usize;
    buffer_size / count + usize::from((lane as usize) < buffer_size % count)
}

/// Deal each source's units to the lanes (`unit_bytes[source][unit]`, in reading order):
/// `result[source][lane]` lists the unit indices that lane reads of that source, in reading order.
pub fn deal_units(unit_bytes: &[Vec<u64>], count: u32) -> Vec<Vec<Vec<usize>>> {
    let count = count.max(1) as usize;
    let mut total = vec![0u64; count];
    unit_bytes
        .iter()
        .map(|units| {
            let mut lanes = vec![Vec::new(); count];
            let mut bytes = vec![0u64; count];
            for (unit, &size) in units.iter().enumerate() {
                let lane = (0..count)
                    .min_by_key(|&l| (bytes[l], total[l], l))
                    .expect("at least one lane");
                lanes[lane].push(unit);
                bytes[lane] += size;
                total[lane] += size;
            }
            lanes
        })
        .collect()
}

/// Block `block` of the stream: (its lane, its index among that lane's blocks).
pub fn block_lane(spec: &LanesSpec, block: u64) -> (u32, u64) {
    let count = u64::from(spec.count);
    ((block % count) as u32, block / count)
}

/// Windows lane `lane` contributes before stream block `block` (whole blocks of it): where the
/// lane must start to serve from that block.
pub fn lane_windows_before(spec: &LanesSpec, lane: u32, block: u64) -> u64 {
    let (count, lane) = (u64::from(spec.count), u64::from(lane));
    let blocks = if block > lane {
        (block - lane - 1) / count + 1
    } else {
        0
    };
    blocks * u64::from(spec.block_windows)
}

/// Window `window` of the stream: its lane, and its index among that lane's own windows.
pub fn window_lane(spec: &LanesSpec, window: u64) -> (u32, u64) {
    let k = u64::from(spec.block_windows);
    let (lane, lane_block) = block_lane(spec, window / k);
    (lane, lane_block * k + window % k)
}

/// Window `window` of lane `lane`'s own windows: its window of the stream ([`window_lane`]'s
/// inverse).
pub fn stream_window(spec: &LanesSpec, lane: u32, window: u64) -> u64 {
    let k = u64::from(spec.block_windows);
    let block = (window / k) * u64::from(spec.count) + u64::from(lane);
    block * k + window % k
}

/// Lane `lane`'s own tokens before token `tokens` of the stream (windows of `window_tokens`):
/// its windows that come before that point in the interleave, and, when the point falls inside
/// one of its windows, that window's tokens before it. Exact: a token of the lane's own stream
/// is before the point of the stream if and only if it is before this many of the lane's tokens,
/// and the lanes' values add up to `tokens`.
pub fn lane_tokens_before(spec: &LanesSpec, window_tokens: u64, lane: u32, tokens: u64) -> u64 {
    let (window, offset) = (tokens / window_tokens, tokens % window_tokens);
    let k = u64::from(spec.block_windows);
    let block = window / k;
    let windows = lane_windows_before(spec, lane, block);
    match block_lane(spec, block) {
        (owner, _) if owner == lane => (windows + window % k) * window_tokens + offset,
        _ => windows * window_tokens,
    }
}

/// Where the stream ends, in blocks: given, per lane, how many complete blocks it has and
/// whether that is all it will ever have, the number of blocks of the stream known to exist
/// and whether that is its end (`(blocks, true)`), or only a lower bound (`(blocks, false)`).
pub fn blocks_known(spec: &LanesSpec, lanes: &[(u64, bool)]) -> (u64, bool) {
    let count = u64::from(spec.count);
    lanes
        .iter()
        .enumerate()
        .map(|(lane, &(blocks, ended))| (blocks * count + lane as u64, ended))
        .min_by_key(|&(first_missing, _)| first_missing)
        .unwrap_or((0, false))
}

/// The part of every global step one node serves, and the lanes it needs for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSlice {
    pub node: u32,
    pub nodes: u32,
    pub count: u32,
    pub block_windows: u64,
    /// Windows in one global step (world size × micro batch).
    pub global_batch: u64,
    /// The step from which steps are of `global_batch` windows, and its first window.
    pub origin_step: u64,
    pub origin_window: u64,
}

impl NodeSlice {
    /// Check that `nodes` nodes can split steps of `global_batch` windows of this recipe, each
    /// node reading only its own lanes. The message says which values conflict and what to change.
    pub fn new(
        spec: &LanesSpec,
        global_batch: u64,
        node: u32,
        nodes: u32,
    ) -> Result<NodeSlice, String> {
        let (count, k) = (u64::from(spec.count), u64::from(spec.block_windows));
        if nodes == 0 || node >= nodes {
            return Err(format!(
                "node rank {node} is not below the node count {nodes}: node ranks are 0..{}",
                nodes.saturating_sub(1)
            ));
        }
        let slice = NodeSlice {
            node,
            nodes,
            count: spec.count,
            block_windows: k,
            global_batch,
            origin_step: 0,
            origin_window: 0,
        };
        if nodes == 1 {
            return Ok(slice);
        }
        let n = u64::from(nodes);
        if !global_batch.is_multiple_of(k * n) {
            return Err(format!(
                "{nodes} nodes cannot split a global batch of {global_batch} windows into whole \
                 blocks of lanes.block_windows = {k}: the global batch (world size × micro batch) \
                 must be a multiple of {}",
                k * n
            ));
        }
        let blocks = global_batch / k;
        if !count.is_multiple_of(blocks) {
            return Err(format!(
                "a global step of {global_batch} windows is {blocks} blocks of {k}; with \
                 lanes.count = {count} the nodes would need each other's lanes: lanes.count must \
                 be a multiple of {blocks} (or the global batch a divisor of {})",
                count * k
            ));
        }
        Ok(slice)
    }

    fn blocks_per_step(&self) -> u64 {
        self.global_batch / self.block_windows
    }

    /// The slice with steps of its global batch from step `step`, which starts at stream window
    /// `window` (a change of course set the global batch there). Nodes split a step only from a
    /// block that begins a round of blocks: refused otherwise, with the values.
    pub fn with_origin(mut self, step: u64, window: u64) -> Result<NodeSlice, String> {
        (self.origin_step, self.origin_window) = (step, window);
        if self.nodes == 1 {
            return Ok(self);
        }
        let round = self.blocks_per_step() * self.block_windows;
        if !window.is_multiple_of(round) {
            return Err(format!(
                "step {step} starts at window {window} of the stream, which {} nodes cannot \
                 split into steps of {} windows (each node reading its own lanes): the window \
                 where a global batch takes over must be a multiple of {round}; change the \
                 global batch at another step",
                self.nodes, self.global_batch
            ));
        }
        Ok(self)
    }

    /// Global step `step`'s first window (at or past the origin).
    pub fn step_window(&self, step: u64) -> u64 {
        let steps = step.saturating_sub(self.origin_step);
        self.origin_window + steps * self.global_batch
    }

    /// The step that holds stream window `window` (the origin's for a window before it).
    pub fn step_of_window(&self, window: u64) -> u64 {
        self.origin_step + window.saturating_sub(self.origin_window) / self.global_batch
    }

    /// This node's own windows before step `step`, counted as [`NodeSlice::first_block_of_step`]
    /// counts its blocks.
    pub fn own_windows_before(&self, step: u64) -> u64 {
        self.first_block_of_step(step) * self.block_windows
            + match self.nodes {
                1 => self.step_window(step) % self.block_windows,
                _ => 0,
            }
    }

    /// Whether this node reads lane `lane`.
    pub fn owns_lane(&self, lane: u32) -> bool {
        if self.nodes == 1 {
            return true;
        }
        let b = self.blocks_per_step();
        (u64::from(lane) % b) / (b / u64::from(self.nodes)) == u64::from(self.node)
    }

    pub fn lanes(&self) -> Vec<u32> {
        (0..self.count).filter(|&l| self.owns_lane(l)).collect()
    }

    /// Windows of every global step this node serves.
    pub fn windows_per_step(&self) -> u64 {
        self.global_batch / u64::from(self.nodes)
    }

    /// The stream block that holds global step `step`'s first window.
    pub fn step_block(&self, step: u64) -> u64 {
        self.step_window(step) / self.block_windows
    }

    /// This node's own block index (see [`NodeSlice::block`]) of its first block of `step`.
    pub fn first_block_of_step(&self, step: u64) -> u64 {
        if self.nodes == 1 {
            return self.step_block(step);
        }
        step.saturating_sub(self.origin_step) * (self.blocks_per_step() / u64::from(self.nodes))
    }

    /// The stream block that is this node's `i`-th block (counting only its own blocks).
    pub fn block(&self, i: u64) -> u64 {
        if self.nodes == 1 {
            return i;
        }
        let per_node = self.blocks_per_step() / u64::from(self.nodes);
        let step = i / per_node;
        self.origin_window / self.block_windows
            + step * self.blocks_per_step()
            + u64::from(self.node) * per_node
            + i % per_node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(count: u32, block_windows: u32) -> LanesSpec {
        LanesSpec {
            count,
            block_windows,
        }
    }

    #[test]
    fn units_are_dealt_by_size_and_single_units_spread() {
        // Row groups alternating full and partial would split 2:1 by count; by size they even out.
        let dealt = deal_units(&[vec![10, 2, 10, 2, 10, 2, 10, 2], vec![5], vec![5]], 2);
        assert_eq!(dealt[0], vec![vec![0, 3, 4, 7], vec![1, 2, 5, 6]]);
        // Lane 0 holds 24 bytes and lane 1 24: the lone unit goes to lane 0, the next to lane 1.
        assert_eq!(dealt[1], vec![vec![0], vec![]]);
        assert_eq!(dealt[2], vec![vec![], vec![0]]);
    }

    #[test]
    fn a_lane_window_is_placed_in_the_stream_and_back() {
        let s = spec(3, 4);
        // Blocks 0..3 are lanes 0, 1, 2; block 4 is lane 1's second: its window 5 (4 + 1).
        assert_eq!(stream_window(&s, 1, 5), 4 * 4 + 1);
        for window in 0..100 {
            let (lane, own) = window_lane(&s, window);
            assert_eq!(stream_window(&s, lane, own), window);
        }
    }

    #[test]
    fn buffer_shares_add_up() {
        for (size, count) in [(1000, 4), (1001, 4), (3, 8), (0, 2)] {
            let total: usize = (0..count).map(|l| lane_buffer_size(size, count, l)).sum();
            assert_eq!(total, size);
        }
    }

    #[test]
    fn lane_seeds_differ_and_are_pinned() {
        assert_ne!(lane_seed(1234, 0), lane_seed(1234, 1));
        assert_ne!(lane_seed(1234, 0), lane_seed(1235, 0));
        assert_eq!(lane_seed(7, 3), lane_seed(7, 3));
    }

    /// Every node's blocks, merged by step, are the stream's blocks in order, and each node
    /// only ever touches its own lanes.
    #[test]
    fn nodes_split_every_step_and_read_only_their_lanes() {
        for (count, k, gb, nodes) in [(4, 2, 8, 2), (4, 2, 8, 4), (8, 1, 4, 2), (4, 4, 16, 1)] {
            let s = spec(count, k);
            let slices: Vec<NodeSlice> = (0..nodes)
                .map(|n| NodeSlice::new(&s, gb, n, nodes).unwrap())
                .collect();
            let per_node = gb / u64::from(k) / u64::from(nodes);
            let mut merged = Vec::new();
            for step in 0..5u64 {
                for slice in &slices {
                    for i in 0..per_node {
                        let block = slice.block(step * per_node + i);
                        let (lane, _) = block_lane(&s, block);
                        assert!(slice.owns_lane(lane), "{slice:?} block {block} lane {lane}");
                        merged.push(block);
                    }
                }
            }
            let want: Vec<u64> = (0..merged.len() as u64).collect();
            assert_eq!(merged, want, "count {count} k {k} gb {gb} nodes {nodes}");
            let mut all: Vec<u32> = slices.iter().flat_map(NodeSlice::lanes).collect();
            all.sort_unstable();
            assert_eq!(all, (0..count).collect::<Vec<_>>(), "each lane on one node");
        }
    }

    #[test]
    fn a_lane_starts_where_its_blocks_before_a_step_end() {
        let s = spec(4, 2);
        // Blocks 0..9 before block 9: lane 0 has 0, 4, 8 (3 blocks), lane 1 has 1, 5 (2 blocks).
        assert_eq!(lane_windows_before(&s, 0, 9), 6);
        assert_eq!(lane_windows_before(&s, 1, 9), 4);
        assert_eq!(lane_windows_before(&s, 3, 3), 0);
        let slice = NodeSlice::new(&s, 8, 1, 2).unwrap();
        // Step 3 of 4 blocks: stream block 12; node 1's own blocks 2 per step, so index 6.
        assert_eq!((slice.step_block(3), slice.first_block_of_step(3)), (12, 6));
        assert_eq!(slice.block(6), 14);
        let one = NodeSlice::new(&s, 3, 0, 1).unwrap();
        assert_eq!(
            one.first_block_of_step(3),
            4,
            "9 windows in: block 4 holds window 9"
        );
    }

    /// From an origin (a change of the global batch at step 10, window 40) the nodes' blocks are
    /// still the stream's in order, each node on its own lanes; an origin inside a round is
    /// refused.
    #[test]
    fn steps_from_an_origin_split_as_from_the_start() {
        let s = spec(8, 2);
        let slices: Vec<NodeSlice> = (0..2)
            .map(|n| (NodeSlice::new(&s, 8, n, 2).unwrap().with_origin(10, 40)).unwrap())
            .collect();
        let mut merged = Vec::new();
        for step in 10..14u64 {
            for slice in &slices {
                let first = slice.first_block_of_step(step);
                for i in first..first + 2 {
                    let block = slice.block(i);
                    assert!(
                        slice.owns_lane(block_lane(&s, block).0),
                        "{slice:?} {block}"
                    );
                    merged.push(block);
                }
            }
        }
        assert_eq!(merged, (20..36).collect::<Vec<u64>>());
        assert_eq!(
            (slices[0].step_window(12), slices[0].step_of_window(57)),
            (56, 12)
        );
        assert_eq!(slices[1].own_windows_before(12), 8);
        let e = NodeSlice::new(&s, 8, 0, 2)
            .unwrap()
            .with_origin(3, 12)
            .unwrap_err();
        assert!(e.contains("must be a multiple of 8"), "{e}");
        let one = NodeSlice::new(&s, 3, 0, 1)
            .unwrap()
            .with_origin(4, 9)
            .unwrap();
        assert_eq!((one.step_block(5), one.own_windows_before(5)), (6, 12));
    }

    #[test]
    fn impossible_splits_are_refused_with_the_values() {
        let s = spec(4, 2);
        let e = NodeSlice::new(&s, 6, 0, 2).unwrap_err();
        assert!(e.contains("multiple of 4"), "{e}");
        let e = NodeSlice::new(&s, 24, 0, 2).unwrap_err();
        assert!(e.contains("lanes.count must be a multiple of 12"), "{e}");
        let e = NodeSlice::new(&s, 8, 2, 2).unwrap_err();
        assert!(
            e.contains("node rank 2 is not below the node count 2"),
            "{e}"
        );
        assert!(
            NodeSlice::new(&s, 6, 0, 1).is_ok(),
            "one node serves any batch"
        );
    }

    /// A point of the stream falls into every lane's own stream exactly: the lanes' tokens before
    /// it add up to it, and a lane's token is before it in the interleave exactly when it is
    /// before the lane's share.
    #[test]
    fn every_point_of_the_stream_falls_exactly_into_every_lane() {
        for (count, k, window_tokens) in [(3u32, 2u32, 5u64), (4, 1, 3), (1, 3, 4), (8, 2, 7)] {
            let s = spec(count, k);
            // Walk the stream token by token, counting each lane's tokens so far.
            let mut seen = vec![0u64; count as usize];
            for tokens in 0..(3 * u64::from(count * k) * window_tokens) {
                let before: Vec<u64> = (0..count)
                    .map(|l| lane_tokens_before(&s, window_tokens, l, tokens))
                    .collect();
                assert_eq!(before, seen, "{count} lanes, k {k}, point {tokens}");
                assert_eq!(before.iter().sum::<u64>(), tokens);
                let (lane, lane_window) = window_lane(&s, tokens / window_tokens);
                assert_eq!(
                    lane_window * window_tokens + tokens % window_tokens,
                    seen[lane as usize],
                    "window {} is lane {lane}'s window {lane_window}",
                    tokens / window_tokens
                );
                seen[lane as usize] += 1;
            }
        }
    }

    #[test]
    fn the_end_is_the_first_block_a_lane_cannot_fill() {
        let s = spec(3, 1);
        // lane 1 ended with 2 blocks: blocks 0..=6 exist (lane 1's third block would be 7).
        assert_eq!(
            blocks_known(&s, &[(5, false), (2, true), (4, false)]),
            (7, true)
        );
        // lane 2 is known only to block 1 (stream block 5): not yet the end.
        assert_eq!(
            blocks_known(&s, &[(5, false), (2, true), (1, false)]),
            (5, false)
        );
    }
}
