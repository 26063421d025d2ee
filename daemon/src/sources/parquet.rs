//! Parquet shards, read row group by row group with column projection: only the text column (and
//! the filter column) is decoded, and at most one batch of rows is held at a time.

use super::{RowText, ShardError, ShardReader};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema};
use dsprep_mixers::recipe::{RowFilter, SourceSpec, TextField};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Rows decoded per batch: small enough to keep memory flat with 100 KB documents.
const BATCH_ROWS: usize = 256;

pub(crate) struct ParquetShard {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
    text: TextField,
    filter: Option<RowFilter>,
    batch: Option<RecordBatch>,
    batch_row: usize,
    /// Index in the file of the next row.
    row: u64,
}

impl ParquetShard {
    pub(crate) fn open(path: &Path, spec: &SourceSpec) -> Result<Self, ShardError> {
        let fail = |message: String| ShardError::new(path, None, message);
        let mut file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
        let mut magic = [0u8; 4];
        if file.read_exact(&mut magic).is_err() || &magic != b"PAR1" {
            return Err(fail(
                "not a parquet file (it does not start with PAR1)".into(),
            ));
        }
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| fail(format!("not a readable parquet file: {e}")))?;
        let schema = builder.schema().clone();
        let mut wanted = vec![text_column_index(&schema, &spec.text).map_err(fail)?];
        if let Some(filter) = &spec.filter {
            wanted.push(filter_column_index(&schema, filter).map_err(fail)?);
        }
        wanted.sort_unstable();
        wanted.dedup();
        let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| fail(format!("cannot read: {e}")))?;
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            text: spec.text.clone(),
            filter: spec.filter.clone(),
            batch: None,
            batch_row: 0,
            row: 0,
        })
    }
}

fn text_column_index(schema: &Schema, text: &TextField) -> Result<usize, String> {
    let name = match text {
        TextField::Column(name) => name,
        TextField::Join(join) => &join.list,
    };
    let (index, field) = schema.column_with_name(name).ok_or_else(|| {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        format!("has no column `{name}` (columns: {})", names.join(", "))
    })?;
    match text {
        TextField::Column(_) if is_string(field.data_type()) => Ok(index),
        TextField::Column(_) => Err(format!(
            "column `{name}` has type {}, expected a string",
            field.data_type()
        )),
        TextField::Join(join) => {
            let item = match field.data_type() {
                DataType::List(item) | DataType::LargeList(item) => item.data_type(),
                other => {
                    return Err(format!(
                        "column `{name}` has type {other}, expected a list of structs"
                    ));
                }
            };
            let DataType::Struct(members) = item else {
                return Err(format!(
                    "column `{name}` holds {item}, expected structs with a string field `{}`",
                    join.field
                ));
            };
            match members.iter().find(|m| m.name() == &join.field) {
                Some(m) if is_string(m.data_type()) => Ok(index),
                Some(m) => Err(format!(
                    "field `{name}[].{}` has type {}, expected a string",
                    join.field,
                    m.data_type()
                )),
                None => Err(format!(
                    "the structs in column `{name}` have no field `{}`",
                    join.field
                )),
            }
        }
    }
}

fn filter_column_index(schema: &Schema, filter: &RowFilter) -> Result<usize, String> {
    let (index, field) = schema.column_with_name(&filter.column).ok_or_else(|| {
        format!(
            "has no column `{}` (needed by the filter `{filter}`)",
            filter.column
        )
    })?;
    if field.data_type().is_numeric() {
        Ok(index)
    } else {
        Err(format!(
            "column `{}` has type {}, the filter `{filter}` needs a number",
            filter.column,
            field.data_type()
        ))
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// The string at `row`, or `None` for a null.
fn string_at(array: &dyn Array, row: usize) -> Option<&str> {
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Some(array.as_string::<i64>().value(row)),
        DataType::Utf8View => Some(array.as_string_view().value(row)),
        _ => None, // types are checked when the shard is opened
    }
}

fn number_at(array: &dyn Array, row: usize) -> Option<f64> {
    if array.is_null(row) {
        return None;
    }
    Some(match array.data_type() {
        DataType::Int8 => array.as_primitive::<Int8Type>().value(row) as f64,
        DataType::Int16 => array.as_primitive::<Int16Type>().value(row) as f64,
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row) as f64,
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row) as f64,
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(row) as f64,
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(row) as f64,
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(row) as f64,
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(row) as f64,
        DataType::Float32 => array.as_primitive::<Float32Type>().value(row) as f64,
        DataType::Float64 => array.as_primitive::<Float64Type>().value(row),
        _ => return None,
    })
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    batch
        .column_by_name(name)
        .expect("projected columns are present in every batch")
}

impl ParquetShard {
    fn row_text(&self, batch: &RecordBatch, i: usize) -> RowText {
        if let Some(filter) = &self.filter
            && !filter.keeps(number_at(column(batch, &filter.column).as_ref(), i))
        {
            return RowText::Filtered;
        }
        let text = match &self.text {
            TextField::Column(name) => string_at(column(batch, name).as_ref(), i)
                .unwrap_or_default()
                .to_string(),
            TextField::Join(join) => {
                let list = column(batch, &join.list);
                if list.is_null(i) {
                    return RowText::Empty;
                }
                let items = match list.data_type() {
                    DataType::LargeList(_) => list.as_list::<i64>().value(i),
                    _ => list.as_list::<i32>().value(i),
                };
                let members = items
                    .as_struct()
                    .column_by_name(&join.field)
                    .expect("checked when the shard is opened");
                let parts: Vec<&str> = (0..members.len())
                    .filter_map(|k| string_at(members.as_ref(), k))
                    .filter(|s| !s.is_empty())
                    .collect();
                parts.join(&join.separator)
            }
        };
        if text.is_empty() {
            RowText::Empty
        } else {
            RowText::Text(text)
        }
    }
}

impl ShardReader for ParquetShard {
    fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError> {
        loop {
            if let Some(batch) = &self.batch
                && self.batch_row < batch.num_rows()
            {
                let outcome = self.row_text(batch, self.batch_row);
                let row = self.row;
                self.batch_row += 1;
                self.row += 1;
                return Ok(Some((row, outcome)));
            }
            match self.reader.next() {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(ShardError::new(
                        &self.path,
                        Some(format!("row {}", self.row)),
                        format!("cannot decode: {e}"),
                    ));
                }
                Some(Ok(batch)) => {
                    self.batch = Some(batch);
                    self.batch_row = 0;
                }
            }
        }
    }
}
