//! The global shuffle buffer, with the semantics of HF `IterableDataset.shuffle(buffer_size=…)`:
//! the first `buffer_size` documents fill the buffer; after that each incoming document takes the
//! place of a uniformly drawn resident, which is emitted; at the end the residents are shuffled
//! and emitted. `buffer_size = 0` passes documents through unchanged.
//!
//! Memory: at most `buffer_size` documents (their text) are held.

use crate::rng::StageRng;

pub struct Shuffler<T> {
    capacity: usize,
    buffer: Vec<T>,
    rng: StageRng,
}

impl<T> Shuffler<T> {
    pub fn new(capacity: usize, seed: u64) -> Self {
        Self::with_label(capacity, seed, "shuffle")
    }

    /// A buffer whose random stream is the seed's stream `label` (one per buffer of a run).
    pub fn with_label(capacity: usize, seed: u64, label: &str) -> Self {
        Self {
            capacity,
            buffer: Vec::with_capacity(capacity.min(1 << 20)),
            rng: StageRng::new(seed, label),
        }
    }

    /// Take one item; return the item it displaces, if the buffer was full.
    pub fn push(&mut self, item: T) -> Option<T> {
        if self.capacity == 0 {
            return Some(item);
        }
        if self.buffer.len() < self.capacity {
            self.buffer.push(item);
            return None;
        }
        let slot = self.rng.below(self.capacity as u64) as usize;
        Some(std::mem::replace(&mut self.buffer[slot], item))
    }

    /// The end of the input: the residents, in shuffled order.
    pub fn flush(&mut self) -> Vec<T> {
        let mut rest = std::mem::take(&mut self.buffer);
        self.rng.shuffle(&mut rest);
        rest
    }

    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The residents, slot by slot: with [`Shuffler::rng_word_pos`], the whole state.
    pub fn residents(&self) -> &[T] {
        &self.buffer
    }

    /// The residents, taken out (the buffer is empty after).
    pub fn take_residents(&mut self) -> Vec<T> {
        std::mem::take(&mut self.buffer)
    }

    pub fn rng_word_pos(&self) -> u64 {
        u64::try_from(self.rng.word_pos()).expect("2^64 random words are never drawn")
    }

    /// Take over a state taken with [`Shuffler::residents`] and [`Shuffler::rng_word_pos`]. A
    /// buffer made smaller at a change of course may take more residents than it has slots:
    /// [`Shuffler::shrink_one`] lets them out first.
    pub fn restore(&mut self, rng_word_pos: u64, residents: Vec<T>) {
        self.rng.set_word_pos(u128::from(rng_word_pos));
        self.buffer = residents;
    }

    /// While the buffer holds more residents than it has slots (it was made smaller at a change
    /// of course): one resident, uniformly drawn, taken out without a new one coming in.
    pub fn shrink_one(&mut self) -> Option<T> {
        if self.buffer.len() <= self.capacity {
            return None;
        }
        let slot = self.rng.below(self.buffer.len() as u64) as usize;
        Some(self.buffer.swap_remove(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(items: &[u32], capacity: usize, seed: u64) -> Vec<u32> {
        let mut s = Shuffler::new(capacity, seed);
        let mut out: Vec<u32> = items.iter().filter_map(|&i| s.push(i)).collect();
        out.extend(s.flush());
        out
    }

    #[test]
    fn zero_capacity_is_the_identity() {
        assert_eq!(run(&[3, 1, 2], 0, 9), vec![3, 1, 2]);
    }

    #[test]
    fn it_shuffles() {
        let items: Vec<u32> = (0..1000).collect();
        let out = run(&items, 100, 1);
        assert_ne!(out, items);
        assert_ne!(out, run(&items, 100, 2), "the seed matters");
        assert_eq!(out, run(&items, 100, 1), "and decides");
    }

    #[test]
    fn emits_nothing_until_full() {
        let mut s = Shuffler::new(3, 0);
        assert_eq!(s.push(1), None);
        assert_eq!(s.push(2), None);
        assert_eq!(s.push(3), None);
        assert!(s.push(4).is_some());
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn a_buffer_made_smaller_lets_its_extra_residents_out_first() {
        let mut s = Shuffler::new(2, 5);
        s.restore(0, vec![10, 11, 12, 13]);
        let out: Vec<u32> = std::iter::from_fn(|| s.shrink_one()).collect();
        assert_eq!(out.len(), 2);
        assert_eq!(s.len(), 2);
        let mut all: Vec<u32> = out.iter().chain(s.residents()).copied().collect();
        all.sort_unstable();
        assert_eq!(all, vec![10, 11, 12, 13], "none lost, none twice");
        assert_eq!(s.shrink_one(), None);
        assert!(s.push(14).is_some(), "full again: a push displaces one");
    }

    proptest! {
        #[test]
        fn is_a_permutation(items in proptest::collection::vec(any::<u32>(), 0..300), capacity in 0usize..64, seed in any::<u64>()) {
            let mut out = run(&items, capacity, seed);
            let mut want = items.clone();
            out.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(out, want);
        }
    }
}
