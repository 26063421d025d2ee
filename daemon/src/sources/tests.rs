//! The oversize policies on rows a reader measured but did not copy: what `split` reads at most
//! ([`MAX_SPLIT_READ_BYTES`]) and a JSON line too long for any document.

use super::*;
use dsprep_mixers::recipe::Recipe;

/// Rows handed out as given.
struct Rows(std::vec::IntoIter<RowText>, u64);

impl ShardReader for Rows {
    fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError> {
        let row = self.1;
        self.1 += 1;
        Ok(self.0.next().map(|outcome| (row, outcome)))
    }
}

/// A source of `format` whose only shard (`shard.jsonl`, never opened) yields `rows`.
fn source(format: &str, extra: &str, rows: Vec<RowText>) -> LocalSource {
    let text = format!(
        "version = 1\n[tokenizer]\npath = \"t.json\"\neos = 0\n[packing]\nseq_len = 8\n\
         [[source]]\nname = \"big\"\nfiles = [\"x\"]\nformat = {format:?}\n{extra}\n"
    );
    let spec = Recipe::parse(&text).unwrap().sources.remove(0);
    let mut source = LocalSource::new(0, spec, vec![PathBuf::from("shard.jsonl")]);
    source.current = Some((0, Box::new(Rows(rows.into_iter(), 0))));
    source.next_shard = 1;
    source
}

fn error(source: &mut LocalSource) -> String {
    source.next_doc().unwrap_err().to_string()
}

#[test]
fn a_row_over_what_split_reads_stops_the_run_naming_it() {
    let split = "max_document_bytes = 4096\noversize = \"split\"";
    let rows = vec![
        RowText::Text("fits".into()),
        RowText::Oversize(MAX_SPLIT_READ_BYTES + 1),
    ];
    let mut parquet = source("parquet", split, rows);
    assert_eq!(parquet.next_doc().unwrap().unwrap().text, "fits");
    assert_eq!(
        error(&mut parquet),
        "shard shard.jsonl row 1: a document of 1073741825 bytes is over what oversize = \
         \"split\" reads (1073741824 bytes, 1 GiB): set oversize = \"skip\" to leave such \
         documents out, counted"
    );
    let mut jsonl = source("jsonl", split, vec![RowText::LongLine(3 << 30)]);
    assert_eq!(
        error(&mut jsonl),
        "shard shard.jsonl line 1: a line of 3221225472 bytes is longer than any document \
         oversize = \"split\" reads can need (2 × 1073741824 + 1 MiB): set oversize = \"skip\" \
         to leave such documents out, counted"
    );
}

#[test]
fn skip_counts_rows_measured_and_not_copied() {
    let rows = vec![
        RowText::Oversize(5000),
        RowText::LongLine(1 << 40),
        RowText::Text("x".repeat(4097)),
        RowText::Text("kept".into()),
    ];
    let mut skipping = source(
        "jsonl",
        "max_document_bytes = 4096\noversize = \"skip\"",
        rows,
    );
    assert_eq!(skipping.next_doc().unwrap().unwrap().text, "kept");
    let c = skipping.counters();
    assert_eq!((c.rows_read, c.rows_oversize, c.documents), (4, 3, 1));
}

#[test]
fn a_split_row_is_handed_out_piece_by_piece_and_its_cursor_names_the_next_piece() {
    let text = "line one\n".repeat(20); // 180 bytes: pieces of ≤ 64 end after a newline
    let rows = vec![RowText::Text(text.clone()), RowText::Text("after".into())];
    let mut s = source(
        "jsonl",
        "max_document_bytes = 64\noversize = \"split\"",
        rows,
    );
    let mut pieces = Vec::new();
    loop {
        let doc = s.next_doc().unwrap().unwrap();
        if !doc.pos.is_piece() {
            assert_eq!((doc.pos.row, doc.text.as_str()), (1, "after"));
            break;
        }
        assert_eq!(doc.pos.piece as usize, pieces.len() + 1);
        let cursor = s.cursor();
        let last = doc.text.len() + pieces.iter().map(String::len).sum::<usize>() == text.len();
        let want = if last { (1, 0) } else { (0, doc.pos.piece + 1) };
        assert_eq!((cursor.row, cursor.piece), want);
        pieces.push(doc.text);
    }
    let line = "line one\n";
    assert_eq!(pieces, [line.repeat(7), line.repeat(7), line.repeat(6)]);
    let c = s.counters();
    assert_eq!(
        (c.rows_read, c.rows_split, c.split_pieces, c.documents),
        (2, 1, 3, 4)
    );
}
