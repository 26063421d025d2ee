//! A pre-tokenizer pattern compiled in a few copies, with HF's own regex type, each copy
//! compiled the first time a thread asks for it. fancy-regex searches take scratch space from a
//! pool inside the regex, and threads sharing one regex contend for it (tiktoken's performance
//! notes), so threads spread over [`COPIES`] copies. Where a scanner cuts the pieces the regex is
//! asked for only past a 64 KiB whitespace run, so most copies are never compiled: building
//! Llama 3's engine spent 19 ms compiling eight, on the path of the run's first document.

use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use tokenizers::utils::SysRegex;

use crate::read::Refusal;

/// How many copies threads spread over.
const COPIES: usize = 8;

pub(crate) struct RegexCopies {
    pattern: String,
    /// Compiled with the engine, so a pattern that does not compile refuses the fast path there.
    first: SysRegex,
    /// The other copies, compiled on first use. `None` should a copy not compile as the first
    /// did; that thread then shares the first.
    more: Box<[OnceLock<Option<SysRegex>>; COPIES - 1]>,
}

impl RegexCopies {
    /// The pattern's copies, the first compiled now; a pattern that does not compile refuses the
    /// fast path.
    pub fn new(pattern: &str) -> Result<Self, Refusal> {
        Ok(Self {
            pattern: pattern.to_string(),
            first: SysRegex::new(pattern).map_err(|e| Refusal::Regex {
                message: e.to_string(),
            })?,
            more: Box::new(std::array::from_fn(|_| OnceLock::new())),
        })
    }

    /// This thread's copy, compiled now if no thread has asked for it before.
    pub fn for_this_thread(&self) -> &SysRegex {
        match thread_slot().checked_sub(1).and_then(|i| self.more.get(i)) {
            None => &self.first,
            Some(copy) => copy
                .get_or_init(|| SysRegex::new(&self.pattern).ok())
                .as_ref()
                .unwrap_or(&self.first),
        }
    }

    /// How many copies are compiled so far.
    #[cfg(test)]
    fn compiled(&self) -> usize {
        1 + self.more.iter().filter(|c| c.get().is_some()).count()
    }
}

/// This thread's copy: its id's hash, so threads spread over the copies.
fn thread_slot() -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut hasher);
    (hasher.finish() % COPIES as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One copy is compiled with the engine; threads compile theirs as they ask, and every copy
    /// finds what the first does.
    #[test]
    fn copies_compile_when_asked_for_and_match_alike() {
        let copies = RegexCopies::new(r"\p{L}+|\s+").expect("compiles");
        assert_eq!(copies.compiled(), 1);
        let found: Vec<Vec<(usize, usize)>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..32)
                .map(|_| scope.spawn(|| copies.for_this_thread().find_iter("ab cd").collect()))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("no panic"))
                .collect()
        });
        assert!(found.iter().all(|f| f == &[(0, 2), (2, 3), (3, 5)]));
        assert!(copies.compiled() > 1, "32 threads asked for one copy only");
        assert!(copies.compiled() <= COPIES);
    }

    /// A pattern that does not compile is an error when the copies are made, not at first use.
    #[test]
    fn a_bad_pattern_is_refused_at_once() {
        assert!(RegexCopies::new("(unclosed").is_err());
    }
}
