//! Cutting a document over its source's `max_document_bytes` into pieces (`oversize = "split"`).
//! Pure and deterministic: the pieces depend only on the text and the limit.
//!
//! **The boundary.** With `L = max_document_bytes`, a text longer than `L` bytes is cut into
//! pieces of at most `L` bytes, front to back. A piece ends at the first rule that finds a cut
//! in its final quarter (a piece length `c` with `L − ⌊L/4⌋ ≤ c ≤ L`):
//! 1. after the last `\n` there;
//! 2. else after the last Unicode whitespace character (`char::is_whitespace`) there;
//! 3. else at the last UTF-8 character boundary at or below `L`.
//!
//! The rest, once it holds at most `L` bytes, is the last piece. Pieces concatenate to the text,
//! none is empty (`L ≥ 4`, the longest UTF-8 character, is the recipe's minimum for `split`),
//! and every one but the last holds at least `L − 3` bytes (rule 3) or `L − ⌊L/4⌋` (rules 1, 2).
//!
//! **Numbering.** Piece `k` (1-based) is what [`crate::doc::DocPos::piece`] holds; 0 means the
//! row's text whole. A position names a piece exactly because the cut depends on nothing else.

/// The smallest `max_document_bytes` a source that splits may set: one piece must be able to hold
/// any character.
pub const MIN_SPLIT_LIMIT_BYTES: u64 = 4;

/// The length of the first piece of `text` for pieces of at most `limit_bytes` (see the module
/// doc): `text.len()` when the text fits.
pub fn piece_end(text: &str, limit_bytes: usize) -> usize {
    let limit = limit_bytes.max(MIN_SPLIT_LIMIT_BYTES as usize);
    if text.len() <= limit {
        return text.len();
    }
    let last = floor_char_boundary(text, limit);
    let first = limit - limit / 4; // the shortest cut of the final quarter
    let bytes = text.as_bytes();
    // Rule 1: after the last '\n' (ASCII, so always a character boundary).
    if let Some(at) = bytes[first - 1..limit].iter().rposition(|&b| b == b'\n') {
        return first + at;
    }
    // Rule 2: after the last whitespace character that ends inside the quarter.
    for (start, ch) in text[..last].char_indices().rev() {
        let end = start + ch.len_utf8();
        if end < first {
            break;
        }
        if ch.is_whitespace() {
            return end;
        }
    }
    // Rule 3: the last character boundary.
    last
}

/// The largest character boundary of `text` at or below `at`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The pieces of `text`, in order (one, the text itself, when it fits in `limit_bytes`).
pub fn pieces(text: &str, limit_bytes: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (piece, after) = rest.split_at(piece_end(rest, limit_bytes));
        rest = after;
        Some(piece)
    })
}

/// Piece `k` (1-based) of `text`, or `None` when it has fewer pieces.
pub fn piece(text: &str, limit_bytes: usize, k: u32) -> Option<&str> {
    pieces(text, limit_bytes).nth((k as usize).checked_sub(1)?)
}

/// A document being cut, handed out piece by piece: what a source holds while it splits. Holds
/// the whole text until its last piece has been taken.
#[derive(Clone, Debug)]
pub struct SplitDoc {
    text: String,
    limit_bytes: usize,
    /// Where the next piece begins.
    offset: usize,
    /// The number of the next piece (1-based).
    next: u32,
}

impl SplitDoc {
    /// `text`, to be cut from its first piece on.
    pub fn new(text: String, limit_bytes: usize) -> Self {
        Self {
            text,
            limit_bytes,
            offset: 0,
            next: 1,
        }
    }

    /// `text`, with pieces `1 .. k` already taken (resume); `None` when it has no piece `k`.
    pub fn at_piece(text: String, limit_bytes: usize, k: u32) -> Option<Self> {
        let mut doc = Self::new(text, limit_bytes);
        while doc.next < k {
            doc.skip()?;
        }
        (k >= 1 && doc.offset < doc.text.len()).then_some(doc)
    }

    fn skip(&mut self) -> Option<()> {
        if self.offset >= self.text.len() {
            return None;
        }
        self.offset += piece_end(&self.text[self.offset..], self.limit_bytes);
        self.next += 1;
        Some(())
    }

    /// The number of the piece [`SplitDoc::take`] gives next.
    pub fn next_piece(&self) -> u32 {
        self.next
    }

    /// The next piece and its number, or `None` once every piece has been taken.
    pub fn take(&mut self) -> Option<(u32, String)> {
        let (k, start) = (self.next, self.offset);
        self.skip()?;
        Some((k, self.text[start..self.offset].to_string()))
    }

    /// Whether every piece has been taken.
    pub fn is_done(&self) -> bool {
        self.offset >= self.text.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cut(text: &str, limit: usize) -> Vec<&str> {
        pieces(text, limit).collect()
    }

    #[test]
    fn a_text_that_fits_is_one_piece() {
        assert_eq!(cut("abcdefgh", 8), ["abcdefgh"]);
        assert_eq!(piece_end("abc", 8), 3);
    }

    #[test]
    fn rule_1_cuts_after_the_last_newline_of_the_final_quarter() {
        // L = 12: the final quarter is piece lengths 9..=12.
        let text = "aaaaaaa\nbb\ncc dd ee";
        // '\n' at byte 10 gives a cut of 11 (in 9..=12); the one at 7 gives 8 (outside).
        assert_eq!(cut(text, 12), ["aaaaaaa\nbb\n", "cc dd ee"]);
        // A newline only before the quarter does not count: whitespace (rule 2) decides.
        assert_eq!(cut("aaaaaaa\nbbb ccccc", 12), ["aaaaaaa\nbbb ", "ccccc"]);
    }

    #[test]
    fn rule_2_cuts_after_the_last_unicode_whitespace_of_the_final_quarter() {
        // U+3000 IDEOGRAPHIC SPACE (3 bytes) ends at byte 11, in the quarter 9..=12.
        let text = "aaaaaaaa\u{3000}bbbbbb";
        assert_eq!(cut(text, 12), ["aaaaaaaa\u{3000}", "bbbbbb"]);
        // A tab beats an earlier space, and a space past L does not count.
        assert_eq!(cut("aaaaaaaaa b\tcc dd", 12), ["aaaaaaaaa b\t", "cc dd"]);
    }

    #[test]
    fn rule_3_cuts_at_the_last_character_boundary() {
        assert_eq!(cut("abcdefghijklmnop", 12), ["abcdefghijkl", "mnop"]);
        // "é" is 2 bytes: byte 12 is inside the 6th one, so the piece holds 5 (10 bytes)…
        let text = "ééééééé";
        assert_eq!(cut(text, 11), ["ééééé", "éé"]);
        // …and a 4-byte character over a limit of 4 is a piece of its own.
        assert_eq!(cut("a😀b", 4), ["a", "😀", "b"]);
    }

    #[test]
    fn a_whitespace_run_past_the_quarter_start_is_cut_at_its_last_character() {
        let text = format!("{}{}", "x".repeat(700), " ".repeat(600));
        let got = cut(&text, 1000);
        assert_eq!(got.iter().map(|p| p.len()).collect::<Vec<_>>(), [1000, 300]);
    }

    #[test]
    fn split_doc_hands_out_the_pieces_and_resumes_at_any_of_them() {
        let text = "one two\nthree four five\nsix seven eight nine ten".to_string();
        let want: Vec<String> = cut(&text, 10).into_iter().map(String::from).collect();
        let mut doc = SplitDoc::new(text.clone(), 10);
        let mut got = Vec::new();
        while let Some((k, p)) = doc.take() {
            assert_eq!(k as usize, got.len() + 1);
            got.push(p);
        }
        assert!(doc.is_done());
        assert_eq!(got, want);
        for k in 1..=want.len() as u32 {
            let mut at = SplitDoc::at_piece(text.clone(), 10, k).unwrap();
            assert_eq!(at.next_piece(), k);
            assert_eq!(at.take().unwrap().1, want[k as usize - 1]);
            assert_eq!(piece(&text, 10, k), Some(want[k as usize - 1].as_str()));
        }
        let past = want.len() as u32 + 1;
        assert!(SplitDoc::at_piece(text.clone(), 10, past).is_none());
        assert!(SplitDoc::at_piece(text.clone(), 10, 0).is_none());
        assert_eq!(piece(&text, 10, past), None);
        assert_eq!(piece(&text, 10, 0), None);
    }

    proptest! {
        #[test]
        fn pieces_concatenate_to_the_text_and_each_obeys_the_rules(
            text in "([a-z]{0,9}[ \n\t\u{3000}é😀]{0,2}){0,120}",
            limit in 4usize..64,
        ) {
            let got = cut(&text, limit);
            prop_assert_eq!(got.concat(), text.clone());
            let first = limit - limit / 4;
            let mut offset = 0;
            for (k, p) in got.iter().enumerate() {
                prop_assert!(!p.is_empty() && p.len() <= limit);
                let window = &text[offset..];
                offset += p.len();
                if k + 1 == got.len() {
                    prop_assert!(window.len() <= limit);
                    continue;
                }
                // The cut points of the final quarter, by rule, each the largest.
                let last = floor_char_boundary(window, limit);
                let ends: Vec<(usize, char)> = window[..last]
                    .char_indices()
                    .map(|(i, c)| (i + c.len_utf8(), c))
                    .filter(|&(end, _)| end >= first)
                    .collect();
                let newline = ends.iter().rev().find(|(_, c)| *c == '\n');
                let space = ends.iter().rev().find(|(_, c)| c.is_whitespace());
                let want = newline.or(space).map_or(last, |&(end, _)| end);
                prop_assert_eq!(p.len(), want, "piece {} of {:?}", k + 1, text);
            }
        }
    }
}
