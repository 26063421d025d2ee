//! Parquet decoding a few batches ahead of the reader, on a thread per open shard: the reader
//! thread gets the same batches in the same order with the same errors, and spends its time on
//! documents (mixing, shuffling), not in snappy and zstd. Bounded: [`BATCHES_AHEAD`] batches wait
//! in the channel and one is being decoded, besides the one the reader holds.

use super::ShardError;
use super::parquet::BatchSource;
use crate::waits::{self, Wait};
use arrow_array::RecordBatch;
use crossbeam_channel::{Receiver, bounded};
use std::path::PathBuf;

/// Decoded batches waiting for the reader at most. The mixer draws a source's documents in
/// bursts, and at 16 tokenizer threads the decoding threads share the cores with them: with one
/// waiting, the reader waited on them (BENCHMARKS.md, "16 cores, where the threads wait").
const BATCHES_AHEAD: usize = 3;

/// What the decoding thread sends: a batch, `None` at the shard's end, or the error that ended it.
type Decoded = Result<Option<RecordBatch>, ShardError>;

/// A shard's batches, decoded on a thread of their own.
pub(crate) struct DecodeAhead {
    label: PathBuf,
    decoded: Option<Receiver<Decoded>>,
    /// Why no thread decodes this shard (it could not start, or it stopped with an error): every
    /// call after says so again.
    failed: Option<ShardError>,
    ended: bool,
}

/// Decode `batches` (whose first row is row `first_row` of `label`) on a thread of their own.
pub(crate) fn start(
    mut batches: Box<dyn BatchSource>,
    label: PathBuf,
    first_row: u64,
) -> Box<dyn BatchSource> {
    let (tx, rx) = bounded::<Decoded>(BATCHES_AHEAD);
    let spawned = std::thread::Builder::new()
        .name("dsprep-decode".into())
        .spawn(move || {
            let mut row = first_row;
            loop {
                let decoded = batches.next_batch(row);
                let last = !matches!(decoded, Ok(Some(_)));
                if let Ok(Some(batch)) = &decoded {
                    row += batch.num_rows() as u64;
                }
                // A closed channel: the reader has dropped the shard.
                if tx.send(decoded).is_err() || last {
                    return;
                }
            }
        });
    let failed = spawned.as_ref().err().map(|e| {
        ShardError::new(
            &label,
            None,
            format!("cannot start a thread to decode it: {e}"),
        )
    });
    Box::new(DecodeAhead {
        label,
        decoded: spawned.ok().map(|_| rx),
        failed,
        ended: false,
    })
}

impl BatchSource for DecodeAhead {
    fn next_batch(&mut self, next_row: u64) -> Result<Option<RecordBatch>, ShardError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let Some(decoded) = self.decoded.as_ref().filter(|_| !self.ended) else {
            return Ok(None);
        };
        let outcome =
            waits::timed(Wait::ReaderForDecoded, || decoded.recv()).unwrap_or_else(|_| {
                Err(ShardError::new(
                    &self.label,
                    Some(format!("row {next_row}")),
                    "the thread decoding it stopped before the shard's end",
                ))
            });
        match &outcome {
            Ok(Some(_)) => {}
            Ok(None) => self.ended = true,
            Err(e) => self.failed = Some(e.clone()),
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int32Array};
    use std::sync::Arc;

    /// Batches of the given row counts, then `Ok(None)` or, with `fail`, an error naming the
    /// row it was asked for.
    struct Scripted {
        rows: Vec<usize>,
        fail: bool,
    }

    impl BatchSource for Scripted {
        fn next_batch(&mut self, next_row: u64) -> Result<Option<RecordBatch>, ShardError> {
            if self.rows.is_empty() && self.fail {
                return Err(ShardError::new(
                    std::path::Path::new("s.parquet"),
                    Some(format!("row {next_row}")),
                    "cannot decode: bad page",
                ));
            }
            if self.rows.is_empty() {
                return Ok(None);
            }
            let n = self.rows.remove(0);
            let column: ArrayRef = Arc::new(Int32Array::from_iter_values(0..n as i32));
            Ok(Some(
                RecordBatch::try_from_iter([("x", column)]).expect("batch"),
            ))
        }
    }

    /// A source whose decoder panics on its second batch.
    struct Panicking {
        batches: usize,
    }

    impl BatchSource for Panicking {
        fn next_batch(&mut self, _next_row: u64) -> Result<Option<RecordBatch>, ShardError> {
            self.batches += 1;
            assert!(self.batches < 2, "the decoder's own bug");
            let column: ArrayRef = Arc::new(Int32Array::from_iter_values(0..256));
            Ok(Some(
                RecordBatch::try_from_iter([("x", column)]).expect("batch"),
            ))
        }
    }

    /// A decoding thread that dies is an error naming the shard and the row, never the shard's
    /// end (which would drop its rows unnoticed).
    #[test]
    fn a_thread_that_dies_is_an_error_not_the_end() {
        let mut ahead = start(Box::new(Panicking { batches: 0 }), "s.parquet".into(), 0);
        assert_eq!(drain(ahead.as_mut(), 0), (vec![256], Some(
            "shard s.parquet row 256: the thread decoding it stopped before the shard's end"
                .to_string()
        )));
    }

    fn drain(batches: &mut dyn BatchSource, mut row: u64) -> (Vec<usize>, Option<String>) {
        let mut sizes = Vec::new();
        loop {
            match batches.next_batch(row) {
                Ok(Some(batch)) => {
                    sizes.push(batch.num_rows());
                    row += batch.num_rows() as u64;
                }
                Ok(None) => return (sizes, None),
                Err(e) => return (sizes, Some(e.to_string())),
            }
        }
    }

    /// The same batches in the same order, the end, and the same error at the same row as the
    /// source read on the caller's thread; an error or the end is said again when asked again.
    #[test]
    fn gives_what_the_source_gives() {
        for fail in [false, true] {
            let scripted = || Scripted {
                rows: vec![256, 256, 17],
                fail,
            };
            let mut direct = scripted();
            let expected = drain(&mut direct, 40);
            let mut ahead = start(Box::new(scripted()), "s.parquet".into(), 40);
            let got = drain(ahead.as_mut(), 40);
            assert_eq!(got, expected);
            assert_eq!(got.0, [256, 256, 17]);
            let again = ahead
                .next_batch(569)
                .map(|b| b.is_some())
                .map_err(|e| e.to_string());
            if fail {
                let message = "shard s.parquet row 569: cannot decode: bad page".to_string();
                assert_eq!(expected.1.as_deref(), Some(message.as_str()));
                assert_eq!(again, Err(message));
            } else {
                assert_eq!(again, Ok(false));
            }
        }
    }
}
