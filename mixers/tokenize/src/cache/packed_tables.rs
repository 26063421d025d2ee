//! The engine cache's two large tables, an engine's merges and whole tokens, as little-endian
//! words after the tables' JSON, not in it. Reading Llama 3's entry (280,147 merges, 128,000
//! tokens) as JSON numbers took about 50 ms, and the first document waits for it
//! (tests/bench/runs/2026-11-27-2core-vm/NOTES.md, "An entry that is bytes"). Bytes that do not
//! make whole records are an error, so the entry is ignored, rebuilt and replaced.
//!
//! Layout: the merges' count, then each merge's left, right and merged ids; the whole tokens'
//! count, then each token's id, its length in bytes and its bytes. Every number a `u32`.

use super::TablesError;
use crate::read::token_list::TokenList;

/// The two tables, as each engine's tables hold them (the byte-level and the SentencePiece-style
/// engine alike): the merges in rank order (left, right, merged id) and the pieces that are one
/// token whole (bytes, id).
pub(crate) struct LargeTables<'a> {
    pub merges: &'a [(u32, u32, u32)],
    pub whole: &'a TokenList,
}

/// Append the large tables to `out`; `None` (HF 1.x's entry, which has none) as two zero counts.
pub(crate) fn write(tables: Option<LargeTables<'_>>, out: &mut Vec<u8>) -> Result<(), TablesError> {
    let Some(LargeTables { merges, whole }) = tables else {
        out.extend_from_slice(&[0; 8]);
        return Ok(());
    };
    let count =
        |entries: usize| u32::try_from(entries).map_err(|_| TablesError::TooLarge { entries });
    out.extend_from_slice(&count(merges.len())?.to_le_bytes());
    for &(left, right, merged) in merges {
        for word in [left, right, merged] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    out.extend_from_slice(&count(whole.len())?.to_le_bytes());
    for (token, id) in whole.iter() {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&count(token.len())?.to_le_bytes());
        out.extend_from_slice(token);
    }
    Ok(())
}

/// The merges (left, right, merged id, in rank order) and the whole tokens, owned.
pub(crate) type OwnedTables = (Vec<(u32, u32, u32)>, TokenList);

/// The two tables in `bytes`, which must hold them and nothing more.
pub(crate) fn read(bytes: &[u8]) -> Result<OwnedTables, TablesError> {
    let mut words = Words { bytes, at: 0 };
    let count = words.next("the merges' count")? as usize;
    // Three words a merge, read as one run of bytes.
    let run = words.take(count.saturating_mul(12), "the merges")?;
    let merges: Vec<(u32, u32, u32)> = run
        .chunks_exact(12)
        .map(|m| (le_word(&m[0..4]), le_word(&m[4..8]), le_word(&m[8..12])))
        .collect();
    let count = words.next("the whole tokens' count")? as usize;
    let mut whole = TokenList::with_capacity(count.min(bytes.len() / 8), bytes.len() - words.at);
    for _ in 0..count {
        let id = words.next("a whole token's id")?;
        let len = words.next("a whole token's length")? as usize;
        whole.push(words.take(len, "a whole token's bytes")?, id);
    }
    if words.at < bytes.len() {
        return Err(TablesError::Trailing {
            bytes: bytes.len() - words.at,
        });
    }
    Ok((merges, whole))
}

/// Reads words and byte runs from the front of the tables' bytes.
struct Words<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Words<'a> {
    fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], TablesError> {
        let taken = self
            .at
            .checked_add(len)
            .and_then(|end| self.bytes.get(self.at..end))
            .ok_or(TablesError::CutShort { what, at: self.at })?;
        self.at += len;
        Ok(taken)
    }

    fn next(&mut self, what: &'static str) -> Result<u32, TablesError> {
        self.take(4, what).map(le_word)
    }
}

/// The `u32` of four little-endian bytes.
fn le_word(at: &[u8]) -> u32 {
    u32::from_le_bytes([at[0], at[1], at[2], at[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::EngineTables;
    use crate::engines::FastEngine;

    /// GPT-2's tables, learnt from the shipped file.
    fn gpt2() -> EngineTables {
        let hf = tokenizers::Tokenizer::from_file("../../config/tokenizers/gpt2/tokenizer.json")
            .expect("gpt2");
        FastEngine::learn(&hf).expect("fast path")
    }

    /// GPT-2's tables and their large tables' bytes.
    fn written() -> (EngineTables, Vec<u8>) {
        let learnt = gpt2();
        let mut bytes = Vec::new();
        write(learnt.large_tables(), &mut bytes).expect("writes");
        (learnt, bytes)
    }

    /// Written and read back, the merges and whole tokens are what was learnt, in order.
    #[test]
    fn the_large_tables_read_back_as_written() {
        let (learnt, bytes) = written();
        let (merges, whole) = read(&bytes).expect("reads");
        let learnt = learnt.large_tables().expect("dsprep's engine's tables");
        assert_eq!(merges.len(), 50_000);
        assert_eq!(learnt.merges, merges.as_slice());
        assert_eq!(whole.len(), 50_256);
        assert_eq!(*learnt.whole, whole);
    }

    /// Bytes cut short anywhere, or with bytes after the last table, are an error naming where.
    #[test]
    fn bytes_that_are_not_the_tables_are_errors() {
        let (_, bytes) = written();
        let error = |bytes: &[u8]| read(bytes).map(|_| ()).expect_err("refused").to_string();
        assert_eq!(error(&[]), "cut short in the merges' count, at byte 0");
        assert_eq!(error(&bytes[..10]), "cut short in the merges, at byte 4");
        let merges_end = 4 + 50_000 * 12;
        assert_eq!(
            error(&bytes[..merges_end + 6]),
            "cut short in a whole token's id, at byte 600008"
        );
        assert_eq!(
            error(&bytes[..bytes.len() - 1]).split(", at").next(),
            Some("cut short in a whole token's bytes")
        );
        let longer = [bytes.as_slice(), b"\0\0"].concat();
        assert_eq!(error(&longer), "2 bytes after the last table");
    }

    /// HF 1.x's entry has no tables: two zero counts, read back as none.
    #[test]
    fn hf1_entries_hold_no_tables() {
        let mut bytes = Vec::new();
        write(EngineTables::Hf1.large_tables(), &mut bytes).expect("writes");
        assert_eq!(bytes, [0; 8]);
        let (merges, whole) = read(&bytes).expect("reads");
        assert!(merges.is_empty() && whole.len() == 0);
    }
}
