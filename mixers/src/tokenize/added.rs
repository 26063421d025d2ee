//! Added-token splitting for the fast path, as HF's `AddedVocabulary::find_matches` does it:
//! the same Aho-Corasick crate (daachorse) in leftmost-longest mode over the same patterns, and a
//! match of a token HF skips (`encode_special_tokens`) is stepped over, not retried shorter.

use daachorse::{DoubleArrayAhoCorasick, DoubleArrayAhoCorasickBuilder, MatchKind};
use rustc_hash::FxHashSet;

use super::pipeline::{AddedSpec, Refusal};

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
    /// mostly start with '<'): no match starts before the first of them in a text, so the
    /// trie walks only from there, and not at all through a text without one.
    first_bytes: Option<Vec<u8>>,
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
            });
        }
        let mut patterns = FxHashSet::default();
        if let Some(dup) = chosen.iter().find(|s| !patterns.insert(s.pattern.as_str())) {
            return Err(Refusal::new(format!(
                "two added tokens match {:?}",
                dup.pattern
            )));
        }
        let trie = DoubleArrayAhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build_with_values(chosen.iter().map(|s| (s.pattern.as_str(), s.id)))
            .map_err(|e| Refusal::new(format!("added tokens do not build a trie: {e}")))?;
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
        })
    }

    /// Where the first match can start at the earliest (the text's length if nowhere).
    fn first_candidate(&self, text: &str) -> usize {
        let bytes = text.as_bytes();
        let found = match self.first_bytes.as_deref() {
            Some([a]) => memchr::memchr(*a, bytes),
            Some([a, b]) => memchr::memchr2(*a, *b, bytes),
            Some([a, b, c]) => memchr::memchr3(*a, *b, *c, bytes),
            _ => Some(0),
        };
        found.unwrap_or(bytes.len())
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
        let mut start = 0;
        // A pattern's first byte starts a character, so `from` is a char boundary.
        let from = self.first_candidate(text);
        let searched = text.get(from..).unwrap_or_default();
        for found in trie.leftmost_find_iter(searched) {
            let id = found.value();
            let (found_start, found_end) = (from + found.start(), from + found.end());
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
}
