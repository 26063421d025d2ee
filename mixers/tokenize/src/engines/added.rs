//! Added-token splitting for the fast path, as HF's `AddedVocabulary::find_matches` does it:
//! the same Aho-Corasick crate (daachorse) in leftmost-longest mode over the same patterns, and a
//! match of a token HF skips (`encode_special_tokens`) is stepped over, not retried shorter.
//!
//! Added tokens mostly start with '<', and code is full of '<' that starts none: where the
//! patterns start with at most three distinct bytes, the trie is asked only at those bytes
//! (found by `memchr`), over the next [`AddedSplitter::longest`] bytes. A match can start
//! nowhere else, so the first place where one starts is the leftmost, and the trie's
//! leftmost-longest answer there is HF's.

use daachorse::{DoubleArrayAhoCorasick, DoubleArrayAhoCorasickBuilder, MatchKind};
use rustc_hash::FxHashSet;

use crate::read::Refusal;
use crate::read::pipeline::AddedSpec;

/// A stretch of text between added tokens, or one added token's id.
pub(crate) enum Segment<'a> {
    Text(&'a str),
    Added(u32),
}

/// One of HF's two tries: patterns → ids, plus the ids HF matches and then drops.
pub(crate) struct AddedSplitter {
    trie: Option<DoubleArrayAhoCorasick<u32>>,
    skipped: FxHashSet<u32>,
    /// The distinct first bytes of the patterns when there are at most three (added tokens
    /// mostly start with '<'): a match starts only at one of them.
    first_bytes: Option<Vec<u8>>,
    /// The longest pattern's bytes: a match that starts at a byte ends within this many.
    longest: usize,
}

impl AddedSplitter {
    /// The trie for the `normalized` (or the non-normalized) added tokens of `specs`.
    pub fn new(specs: &[AddedSpec], normalized: bool) -> Result<Self, Refusal> {
        let chosen: Vec<&AddedSpec> = specs
            .iter()
            .filter(|s| s.normalized == normalized)
            .collect();
        let skipped = chosen.iter().filter(|s| s.skip).map(|s| s.id).collect();
        if chosen.is_empty() {
            return Ok(Self {
                trie: None,
                skipped,
                first_bytes: None,
                longest: 0,
            });
        }
        if chosen.iter().any(|s| s.pattern.is_empty()) {
            return Err(Refusal::EmptyAddedToken);
        }
        let mut patterns = FxHashSet::default();
        if let Some(dup) = chosen.iter().find(|s| !patterns.insert(s.pattern.as_str())) {
            return Err(Refusal::SameAddedTokens {
                pattern: dup.pattern.clone(),
            });
        }
        let trie = DoubleArrayAhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build_with_values(chosen.iter().map(|s| (s.pattern.as_str(), s.id)))
            .map_err(|e| Refusal::AddedTrie {
                message: e.to_string(),
            })?;
        let mut first_bytes: Vec<u8> = chosen
            .iter()
            .filter_map(|s| s.pattern.as_bytes().first().copied())
            .collect();
        first_bytes.sort_unstable();
        first_bytes.dedup();
        Ok(Self {
            trie: Some(trie),
            skipped,
            first_bytes: (first_bytes.len() <= 3).then_some(first_bytes),
            longest: chosen.iter().map(|s| s.pattern.len()).max().unwrap_or(0),
        })
    }

    /// The leftmost-longest match in `bytes` at or after `from`: its start, end and id.
    fn next_match(
        &self,
        trie: &DoubleArrayAhoCorasick<u32>,
        bytes: &[u8],
        mut from: usize,
    ) -> Option<(usize, usize, u32)> {
        let Some(first) = self.first_bytes.as_deref() else {
            let found = trie.leftmost_find_iter(bytes.get(from..)?).next()?;
            return Some((from + found.start(), from + found.end(), found.value()));
        };
        loop {
            let rest = bytes.get(from..)?;
            let at = from
                + match first {
                    [a] => memchr::memchr(*a, rest),
                    [a, b] => memchr::memchr2(*a, *b, rest),
                    [a, b, c] => memchr::memchr3(*a, *b, *c, rest),
                    _ => Some(0),
                }?;
            let window = &bytes[at..bytes.len().min(at + self.longest)];
            if let Some(found) = trie.leftmost_find_iter(window).next()
                && found.start() == 0
            {
                return Some((at, at + found.end(), found.value()));
            }
            from = at + 1;
        }
    }

    /// Call `f` on the segments of `text` in order. Empty text segments are not reported (HF
    /// drops empty splits).
    pub fn split<'a, E>(
        &self,
        text: &'a str,
        mut f: impl FnMut(Segment<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(trie) = &self.trie else {
            return if text.is_empty() {
                Ok(())
            } else {
                f(Segment::Text(text))
            };
        };
        let (mut start, mut from) = (0, 0);
        while let Some((found_start, found_end, id)) = self.next_match(trie, text.as_bytes(), from)
        {
            from = found_end;
            if self.skipped.contains(&id) {
                continue;
            }
            // Matches of valid UTF-8 patterns in a str start and end on char boundaries.
            if let Some(before) = text.get(start..found_start).filter(|s| !s.is_empty()) {
                f(Segment::Text(before))?;
            }
            f(Segment::Added(id))?;
            start = found_end;
        }
        match text.get(start..) {
            Some(rest) if !rest.is_empty() => f(Segment::Text(rest)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: u32, pattern: &str, skip: bool) -> AddedSpec {
        AddedSpec {
            id,
            pattern: pattern.to_string(),
            normalized: false,
            skip,
        }
    }

    fn segments(splitter: &AddedSplitter, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        splitter
            .split(text, |s| {
                out.push(match s {
                    Segment::Text(t) => format!("T{t}"),
                    Segment::Added(id) => format!("A{id}"),
                });
                Ok::<(), ()>(())
            })
            .expect("infallible");
        out
    }

    #[test]
    fn leftmost_longest_and_skipped_matches() {
        let specs = [
            spec(1, "<a>", false),
            spec(2, "<a><b>", false),
            spec(3, "<s>", true),
        ];
        let splitter = AddedSplitter::new(&specs, false).expect("trie");
        assert_eq!(segments(&splitter, "x<a><b>y<a>"), ["Tx", "A2", "Ty", "A1"]);
        // A skipped token's text stays in the text around it.
        assert_eq!(segments(&splitter, "<s><a>"), ["T<s>", "A1"]);
        assert_eq!(segments(&splitter, ""), Vec::<String>::new());
        assert_eq!(segments(&splitter, "no tokens here"), ["Tno tokens here"]);
        assert_eq!(segments(&splitter, "é x < <a>"), ["Té x < ", "A1"]);
        let none = AddedSplitter::new(&specs, true).expect("no trie");
        assert_eq!(segments(&none, "<a>"), ["T<a>"]);
    }

    /// Asked only where a pattern's first byte stands, the trie gives what its own walk over
    /// the whole text gives, on texts full of first bytes that start no match, overlapping
    /// patterns, a skipped token, and patterns longer than what is left of the text.
    #[test]
    fn asked_at_first_bytes_it_finds_what_the_whole_walk_finds() {
        let specs = [
            spec(1, "<|a|>", false),
            spec(2, "<|a|><|b|>", false),
            spec(3, "<|s|>", true),
            spec(4, "|>x", false),
            spec(5, "x", false),
        ];
        let splitter = AddedSplitter::new(&specs, false).expect("trie");
        assert_eq!(splitter.first_bytes.as_deref(), Some(&b"<x|"[..]));
        let mut whole = AddedSplitter::new(&specs, false).expect("trie");
        whole.first_bytes = None;
        let pieces = [
            "<", "|", "a", "|>", "<|a|>", "<|b|>", "<|s|>", "x", "é", " ", "<<", "<|",
        ];
        let mut state = 7u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let mut cut = 0;
        for _ in 0..3000 {
            let text: String = (0..next() % 12)
                .map(|_| pieces[next() % pieces.len()])
                .collect();
            cut += usize::from(segments(&whole, &text).len() > 1);
            assert_eq!(
                segments(&splitter, &text),
                segments(&whole, &text),
                "{text:?}"
            );
        }
        assert!(cut > 1000, "only {cut} texts had an added token");
    }
}
