//! JSON-lines shards (plain or gzip, e.g. C4's `.json.gz`), streamed line by line: a gzip shard is
//! never decompressed whole, and a line is held only while its document is taken out. A line
//! longer than a document within what the source reads can need ([`max_line_bytes`] of its
//! `max_document_bytes`, or of 1 GiB under `split`) is read to its end without being kept, so a
//! gzip bomb of one line costs at most that allowance; a long line's buffer is given back once
//! its document is out. The line reader works over any `BufRead`: a local file, or a Hub
//! download streamed through gzip.

use super::{RowText, ShardError, ShardReader};
use dsprep_mixers::recipe::{RowFilter, SourceSpec, TextField};
use flate2::read::MultiGzDecoder;
use serde_json::{Map, Value};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

pub(crate) struct JsonlShard {
    path: PathBuf,
    lines: Box<dyn BufRead + Send>,
    text: TextField,
    filter: Option<RowFilter>,
    buf: Vec<u8>,
    /// 0-based index of the next line.
    row: u64,
    /// The longest line kept ([`max_line_bytes`]); a longer one is an oversize row.
    max_line: usize,
    /// The longest text taken out of a line ([`SourceSpec::read_limit`]); a longer one is an
    /// oversize row.
    read_limit: u64,
}

/// The line buffer's capacity kept from one line to the next: a longer line's buffer is given
/// back once its document is out, so one huge line does not keep its memory for the whole shard.
const KEPT_LINE_CAPACITY: usize = 4 << 20;

/// The longest JSON line a document of `limit` text bytes needs, with room for escapes and the
/// row's other fields: a longer line is not kept.
pub(crate) fn max_line_bytes(limit: u64) -> usize {
    usize::try_from(limit.saturating_mul(2).saturating_add(1 << 20)).unwrap_or(usize::MAX)
}

impl JsonlShard {
    pub(crate) fn open(path: &Path, spec: &SourceSpec, gzip: bool) -> Result<Self, ShardError> {
        let fail = |message: String| ShardError::new(path, None, message);
        let mut file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
        let lines: Box<dyn BufRead + Send> = if gzip {
            let mut magic = [0u8; 2];
            if file.read_exact(&mut magic).is_err() || magic != [0x1f, 0x8b] {
                return Err(fail(
                    "not a gzip file (it does not start with the gzip magic bytes 1f 8b)".into(),
                ));
            }
            let file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
            Box::new(BufReader::with_capacity(
                1 << 16,
                MultiGzDecoder::new(BufReader::with_capacity(1 << 16, file)),
            ))
        } else {
            Box::new(BufReader::with_capacity(1 << 16, file))
        };
        Ok(Self::from_reader(path.to_path_buf(), lines, spec))
    }

    /// Lines from any reader; `path` names the shard in messages.
    pub(crate) fn from_reader(
        path: PathBuf,
        lines: Box<dyn BufRead + Send>,
        spec: &SourceSpec,
    ) -> Self {
        Self {
            path,
            lines,
            text: spec.text.clone(),
            filter: spec.filter.clone(),
            buf: Vec::new(),
            row: 0,
            max_line: max_line_bytes(spec.read_limit()),
            read_limit: spec.read_limit(),
        }
    }

    /// Gzip-compressed lines from any byte reader (a streamed download).
    pub(crate) fn from_gzip(path: PathBuf, bytes: Box<dyn Read + Send>, spec: &SourceSpec) -> Self {
        let lines = BufReader::with_capacity(
            1 << 16,
            MultiGzDecoder::new(BufReader::with_capacity(1 << 16, bytes)),
        );
        Self::from_reader(path, Box::new(lines), spec)
    }

    fn at_line(&self, message: impl Into<String>) -> ShardError {
        ShardError::new(&self.path, Some(format!("line {}", self.row + 1)), message)
    }

    fn row_text(&self, object: &mut Map<String, Value>) -> Result<RowText, ShardError> {
        if let Some(filter) = &self.filter {
            let value = match object.get(&filter.column) {
                None => {
                    return Err(self.at_line(format!(
                        "has no field `{}` (needed by the filter `{filter}`)",
                        filter.column
                    )));
                }
                Some(Value::Null) => None,
                Some(Value::Number(n)) => n.as_f64(),
                Some(other) => {
                    return Err(self.at_line(format!(
                        "field `{}` is {}, the filter `{filter}` needs a number",
                        filter.column,
                        kind(other)
                    )));
                }
            };
            if !filter.keeps(value) {
                return Ok(RowText::Filtered);
            }
        }
        let text = match &self.text {
            TextField::Column(name) => match object.remove(name) {
                None => return Err(self.at_line(format!("has no field `{name}`"))),
                Some(Value::Null) => String::new(),
                Some(Value::String(s)) if s.len() as u64 > self.read_limit => {
                    return Ok(RowText::Oversize(s.len() as u64));
                }
                Some(Value::String(s)) => s,
                Some(other) => {
                    return Err(self.at_line(format!(
                        "field `{name}` is {}, expected a string",
                        kind(&other)
                    )));
                }
            },
            TextField::Join(join) => {
                let items = match object.get(&join.list) {
                    None => return Err(self.at_line(format!("has no field `{}`", join.list))),
                    Some(Value::Null) => return Ok(RowText::Empty),
                    Some(Value::Array(items)) => items,
                    Some(other) => {
                        return Err(self.at_line(format!(
                            "field `{}` is {}, expected a list",
                            join.list,
                            kind(other)
                        )));
                    }
                };
                let mut parts = Vec::with_capacity(items.len());
                for (k, item) in items.iter().enumerate() {
                    match item.get(&join.field) {
                        Some(Value::String(s)) if !s.is_empty() => parts.push(s.as_str()),
                        Some(Value::String(_)) | Some(Value::Null) => {}
                        other => {
                            let what = other.map(kind).unwrap_or("missing");
                            return Err(self.at_line(format!(
                                "`{}[{k}].{}` is {what}, expected a string",
                                join.list, join.field
                            )));
                        }
                    }
                }
                let bytes = super::parquet::joined_bytes(&parts, &join.separator);
                if bytes > self.read_limit {
                    return Ok(RowText::Oversize(bytes));
                }
                parts.join(&join.separator)
            }
        };
        Ok(if text.is_empty() {
            RowText::Empty
        } else {
            RowText::Text(text)
        })
    }
}

/// Read one line (through its `\n`, if any) into `buf`, keeping at most `max` bytes: a longer
/// line is read to its end and dropped. Returns the line's length and whether `buf` holds it.
fn read_line_bounded(
    reader: &mut dyn BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<(usize, bool)> {
    buf.clear();
    let (mut total, mut kept) = (0usize, true);
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok((total, kept));
        }
        let (take, done) = match memchr::memchr(b'\n', available) {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        if kept && buf.len() + take <= max {
            buf.extend_from_slice(&available[..take]);
        } else if kept {
            kept = false;
            *buf = Vec::new(); // give the memory back: the line is not kept
        }
        total += take;
        reader.consume(take);
        if done {
            return Ok((total, kept));
        }
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

impl ShardReader for JsonlShard {
    fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError> {
        let (read, kept) = read_line_bounded(&mut *self.lines, &mut self.buf, self.max_line)
            .map_err(|e| self.at_line(format!("cannot read (corrupt or truncated file?): {e}")))?;
        if read == 0 {
            return Ok(None);
        }
        if !kept {
            let row = self.row;
            self.row += 1;
            return Ok(Some((row, RowText::LongLine(read as u64))));
        }
        let mut line = self.buf.as_slice();
        while let Some((b'\n' | b'\r', rest)) = line.split_last() {
            line = rest;
        }
        let line = std::str::from_utf8(line).map_err(|e| {
            self.at_line(format!(
                "is not valid UTF-8 (byte {} of the line)",
                e.valid_up_to()
            ))
        })?;
        if line.trim().is_empty() {
            return Err(self.at_line("is empty, expected a JSON object"));
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|e| self.at_line(format!("is not valid JSON: {e}")))?;
        if self.buf.capacity() > KEPT_LINE_CAPACITY {
            self.buf = Vec::new();
        }
        let Value::Object(mut object) = value else {
            return Err(self.at_line(format!("is {}, expected a JSON object", kind(&value))));
        };
        let outcome = self.row_text(&mut object)?;
        let row = self.row;
        self.row += 1;
        Ok(Some((row, outcome)))
    }
}
