//! A shard's rows read ahead of the reader, on a thread per open shard: everything that turns a
//! shard into texts (parquet decoding, snappy and zstd, each row's text copied out of its batch,
//! JSON lines parsed, a Hub file's bytes waited for) runs there, and the reader thread gets the
//! same rows in the same order with the same errors. It spends its time on documents (mixing,
//! shuffling), and it is the one thread every document passes: on 2 cores the copies alone were
//! two thirds of its time (tests/bench/runs/2026-11-27-2core-vm/NOTES.md,
//! "the reader's copies on the shards' threads").
//!
//! Bounded: rows travel in groups of at most [`GROUP_ROWS`] rows and [`GROUP_TEXT_BYTES`] of text
//! (one row may pass it alone, up to the source's `max_document_bytes`); [`GROUPS_AHEAD`] groups
//! wait in the channel and one is being read, besides the one the reader holds.

use super::{RowText, ShardError, ShardReader};
use crate::waits::{self, Wait};
use crossbeam_channel::{Receiver, bounded};
use std::path::PathBuf;

/// Rows per group at most: a parquet batch's.
const GROUP_ROWS: usize = super::parquet::BATCH_ROWS;
/// Text per group: a group closes once its rows' text reaches this.
const GROUP_TEXT_BYTES: usize = 1 << 20;
/// Groups waiting for the reader at most. The mixer draws a source's documents in bursts (and
/// the shuffle buffer's fill draws 10,000s at once), and at 16 tokenizer threads the shards'
/// threads share the cores with them: with one waiting, the reader waited on them
/// (tests/bench/runs/2026-11-27-device-16core/NOTES.md, "16 cores, where the threads wait").
const GROUPS_AHEAD: usize = 3;

/// What the shard's thread sends: rows (never none), the shard's end as an empty group, or the
/// error that ended it.
type Group = Result<Vec<(u64, RowText)>, ShardError>;

/// A shard's rows, read on a thread of their own.
pub(crate) struct ReadAhead {
    label: PathBuf,
    groups: Option<Receiver<Group>>,
    /// The group being handed out.
    rows: std::vec::IntoIter<(u64, RowText)>,
    /// The row after the last one handed out, for the message should the thread die.
    next_row: Option<u64>,
    /// Why no thread reads this shard (it could not start, or it stopped with an error): every
    /// call after says so again.
    failed: Option<ShardError>,
    ended: bool,
}

/// Read `reader`'s rows on a thread of their own; `label` names the shard should that thread not
/// start or die.
pub(crate) fn start(mut reader: Box<dyn ShardReader>, label: PathBuf) -> Box<dyn ShardReader> {
    let (tx, rx) = bounded::<Group>(GROUPS_AHEAD);
    let spawned = std::thread::Builder::new()
        .name("dsprep-decode".into())
        .spawn(move || {
            loop {
                let (group, last) = next_group(reader.as_mut());
                // A closed channel: the reader has dropped the shard.
                let sent = match group {
                    Ok(rows) if rows.is_empty() => tx.send(Ok(rows)).is_ok(),
                    Ok(rows) => {
                        tx.send(Ok(rows)).is_ok() && (!last || tx.send(Ok(Vec::new())).is_ok())
                    }
                    Err((rows, e)) => {
                        (rows.is_empty() || tx.send(Ok(rows)).is_ok()) && tx.send(Err(e)).is_ok()
                    }
                };
                if !sent || last {
                    return;
                }
            }
        });
    let failed = spawned.as_ref().err().map(|e| {
        ShardError::new(
            &label,
            None,
            format!("cannot start a thread to read it: {e}"),
        )
    });
    Box::new(ReadAhead {
        label,
        groups: spawned.ok().map(|_| rx),
        rows: Vec::new().into_iter(),
        next_row: None,
        failed,
        ended: false,
    })
}

/// The next group of rows and whether the shard ended with it (its end or an error; an error
/// comes with the rows read before it).
#[allow(clippy::type_complexity)]
fn next_group(
    reader: &mut dyn ShardReader,
) -> (
    Result<Vec<(u64, RowText)>, (Vec<(u64, RowText)>, ShardError)>,
    bool,
) {
    let mut rows = Vec::with_capacity(GROUP_ROWS);
    let mut text_bytes = 0;
    while rows.len() < GROUP_ROWS && text_bytes < GROUP_TEXT_BYTES {
        match reader.next_row() {
            Ok(Some(row)) => {
                if let RowText::Text(text) = &row.1 {
                    text_bytes += text.len();
                }
                rows.push(row);
            }
            Ok(None) => return (Ok(rows), true),
            Err(e) => return (Err((rows, e)), true),
        }
    }
    (Ok(rows), false)
}

impl ShardReader for ReadAhead {
    fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError> {
        loop {
            if let Some(row) = self.rows.next() {
                self.next_row = Some(row.0 + 1);
                return Ok(Some(row));
            }
            if let Some(e) = &self.failed {
                return Err(e.clone());
            }
            let Some(groups) = self.groups.as_ref().filter(|_| !self.ended) else {
                return Ok(None);
            };
            let group = waits::timed(Wait::ReaderForRows, || groups.recv()).unwrap_or_else(|_| {
                Err(ShardError::new(
                    &self.label,
                    self.next_row.map(|row| format!("row {row}")),
                    "the thread reading it stopped before the shard's end",
                ))
            });
            match group {
                Ok(rows) if rows.is_empty() => self.ended = true,
                Ok(rows) => self.rows = rows.into_iter(),
                Err(e) => self.failed = Some(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows with the given text lengths (`None`: a filtered row), from row `first`, then the end
    /// or, with `fail`, an error naming the row it was asked for.
    struct Scripted {
        texts: Vec<Option<usize>>,
        row: u64,
        fail: bool,
    }

    impl ShardReader for Scripted {
        fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError> {
            if self.texts.is_empty() {
                return match self.fail {
                    true => Err(ShardError::new(
                        std::path::Path::new("s.parquet"),
                        Some(format!("row {}", self.row)),
                        "cannot decode: bad page",
                    )),
                    false => Ok(None),
                };
            }
            let text = match self.texts.remove(0) {
                Some(len) => RowText::Text(format!("{}{}", self.row, "x".repeat(len))),
                None => RowText::Filtered,
            };
            self.row += 1;
            Ok(Some((self.row - 1, text)))
        }
    }

    /// A reader that panics on row 300, in its second group (rows 296 on).
    struct Panicking {
        row: u64,
    }

    impl ShardReader for Panicking {
        fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError> {
            assert!(self.row < 300, "the reader's own bug");
            self.row += 1;
            Ok(Some((self.row - 1, RowText::Empty)))
        }
    }

    /// Each row as (index, text or "-"), then the error, if one ended it.
    fn drain(reader: &mut dyn ShardReader) -> (Vec<(u64, String)>, Option<String>) {
        let mut rows = Vec::new();
        loop {
            match reader.next_row() {
                Ok(Some((at, RowText::Text(text)))) => rows.push((at, text)),
                Ok(Some((at, _))) => rows.push((at, "-".to_string())),
                Ok(None) => return (rows, None),
                Err(e) => return (rows, Some(e.to_string())),
            }
        }
    }

    /// A reading thread that dies is an error naming the shard and the row after the last one
    /// given, never the shard's end (which would drop its rows unnoticed).
    #[test]
    fn a_thread_that_dies_is_an_error_not_the_end() {
        let mut ahead = start(Box::new(Panicking { row: 40 }), "s.parquet".into());
        let (rows, error) = drain(ahead.as_mut());
        assert_eq!(rows.len(), GROUP_ROWS);
        assert_eq!(
            error.as_deref(),
            Some("shard s.parquet row 296: the thread reading it stopped before the shard's end")
        );
        let mut at_once = start(Box::new(Panicking { row: 300 }), "s.parquet".into());
        assert_eq!(
            drain(at_once.as_mut()),
            (
                Vec::new(),
                Some(
                    "shard s.parquet: the thread reading it stopped before the shard's end".into()
                )
            )
        );
    }

    /// The same rows in the same order, the end, and the same error at the same row as the
    /// reader read on the caller's thread, whether groups close by rows (600 short rows) or by
    /// text (a row of 3 MiB, rows of 400 KiB); an error or the end is said again when asked again.
    #[test]
    fn gives_what_the_reader_gives() {
        let lengths: [Vec<Option<usize>>; 3] = [
            (0..600).map(|i| (i % 7 != 0).then_some(i % 50)).collect(),
            vec![Some(3 << 20), None, Some(5)],
            (0..9).map(|_| Some(400 << 10)).collect(),
        ];
        for texts in lengths {
            for fail in [false, true] {
                let scripted = || Scripted {
                    texts: texts.clone(),
                    row: 40,
                    fail,
                };
                let expected = drain(&mut scripted());
                let mut ahead = start(Box::new(scripted()), "s.parquet".into());
                let got = drain(ahead.as_mut());
                assert_eq!(got, expected);
                assert_eq!(got.0.len(), texts.len());
                let again = ahead
                    .next_row()
                    .map(|r| r.is_some())
                    .map_err(|e| e.to_string());
                if fail {
                    let message = format!(
                        "shard s.parquet row {}: cannot decode: bad page",
                        40 + texts.len()
                    );
                    assert_eq!(expected.1.as_deref(), Some(message.as_str()));
                    assert_eq!(again, Err(message));
                } else {
                    assert_eq!(again, Ok(false));
                }
            }
        }
    }
}
