//! Parquet shards, read row group by row group with column projection: only the leaves a source
//! needs (its text column or list field, its filter column) are decoded, a batch of rows at a
//! time (on the shard's own thread, as every shard reader: `read_ahead.rs`). Before anything is
//! decoded, the footer's column chunks are checked against the file's size and every page header of the chunks to be read against its chunk and
//! for decompression bombs (`page_check.rs`); strings are read as views, and a row's text is
//! copied out only when it is within what the source reads. Where the batches come from — a local
//! file, or range reads from the Hub (`hub_parquet.rs`) — is a [`BatchSource`]; turning rows into
//! documents is shared.

use super::page_check::{Crc, PageFault, PagesChecked, ReadAt, check_chunk};
use super::{RowText, ShardError, ShardReader};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::Field;
use arrow_schema::{DataType, Schema};
use dsprep_mixers::recipe::{RowFilter, SourceSpec, TextField};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::file::metadata::ParquetMetaData;
use parquet::schema::types::SchemaDescriptor;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows decoded per batch: small enough to keep memory flat with 100 KB documents.
pub(crate) const BATCH_ROWS: usize = 256;

/// Batches of one shard, in row order.
pub(crate) trait BatchSource: Send {
    /// The next batch; `next_row` (the index of its first row) is for error messages.
    fn next_batch(&mut self, next_row: u64) -> Result<Option<RecordBatch>, ShardError>;
}

/// A local parquet file.
pub(crate) struct LocalBatches {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
}

impl LocalBatches {
    /// Open `path` at the start of the row group that holds row `from_row` (row groups before it
    /// are never read: resume skips most of a shard this way). Returns the batches and the index
    /// of their first row; a `from_row` at the end gives no batches. With `only_group`, just that
    /// row group is read (from its start), whatever `from_row`.
    pub(crate) fn open(
        path: &Path,
        spec: &SourceSpec,
        batch_rows: usize,
        from_row: u64,
        only_group: Option<usize>,
    ) -> Result<(Self, u64), ShardError> {
        let file = File::open(path)
            .map_err(|e| ShardError::new(path, None, format!("cannot open: {e}")))?;
        Self::open_file(path, file, spec, batch_rows, from_row, only_group)
    }

    /// [`LocalBatches::open`] over a file already open (a Hub file spooled to a local copy);
    /// `path` names it in messages.
    pub(crate) fn open_file(
        path: &Path,
        mut file: File,
        spec: &SourceSpec,
        batch_rows: usize,
        from_row: u64,
        only_group: Option<usize>,
    ) -> Result<(Self, u64), ShardError> {
        let fail = |message: String| ShardError::new(path, None, message);
        let mut pages = file
            .try_clone()
            .map_err(|e| fail(format!("cannot open: {e}")))?;
        let mut magic = [0u8; 4];
        if file.read_exact(&mut magic).is_err() || &magic != b"PAR1" {
            return Err(fail(
                "not a parquet file (it does not start with PAR1)".into(),
            ));
        }
        let builder = checked_builder(path, file)?;
        let mask = projection(builder.schema(), builder.parquet_schema(), spec).map_err(fail)?;
        let groups_meta = builder.metadata().row_groups();
        let found = match only_group {
            Some(g) if g < groups_meta.len() => Some((
                vec![g],
                groups_meta[..g]
                    .iter()
                    .map(|m| m.num_rows().max(0) as u64)
                    .sum(),
            )),
            Some(g) => {
                return Err(fail(format!(
                    "has {} row groups, row group {g} was asked for (has the file changed?)",
                    groups_meta.len()
                )));
            }
            None => row_groups_from(groups_meta, from_row),
        };
        let (groups, first_row) = found.ok_or_else(|| {
            fail(format!(
                "has {} rows, row {from_row} was asked for (has the file changed?)",
                builder.metadata().file_metadata().num_rows()
            ))
        })?;
        for &g in &groups {
            check_pages(builder.metadata(), g, &mask, &mut pages, Crc::Off)
                .map_err(|fault| fail(fault.to_string()))?;
        }
        let reader = builder
            .with_row_groups(groups)
            .with_projection(mask)
            .with_batch_size(batch_rows)
            .build()
            .map_err(|e| fail(format!("cannot read: {e}")))?;
        Ok((
            Self {
                path: path.to_path_buf(),
                reader,
            },
            first_row,
        ))
    }
}

/// The number of row groups of a local parquet file and each one's compressed size in bytes:
/// what lanes deal out.
pub fn local_row_groups(path: &Path) -> Result<Vec<u64>, ShardError> {
    let fail = |message: String| ShardError::new(path, None, message);
    let file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
    let builder = checked_builder(path, file)?;
    Ok(builder
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.compressed_size().max(0) as u64)
        .collect())
}

/// The rows of a local parquet file, from its footer.
pub(crate) fn local_num_rows(path: &Path) -> Result<u64, ShardError> {
    let fail = |message: String| ShardError::new(path, None, message);
    let file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
    let builder = checked_builder(path, file)?;
    Ok(builder.metadata().file_metadata().num_rows().max(0) as u64)
}

/// The reader of the open parquet `file` at `path`, its footer read and checked
/// ([`check_column_chunks`]) against the file's real size, strings read as views
/// ([`string_views`]).
fn checked_builder(
    path: &Path,
    file: File,
) -> Result<ParquetRecordBatchReaderBuilder<File>, ShardError> {
    let fail = |message: String| ShardError::new(path, None, message);
    let file_size = file
        .metadata()
        .map_err(|e| fail(format!("cannot stat: {e}")))?
        .len();
    let unreadable =
        |e: parquet::errors::ParquetError| fail(format!("not a readable parquet file: {e}"));
    let metadata =
        ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(unreadable)?;
    check_column_chunks(metadata.metadata(), file_size).map_err(fail)?;
    let metadata = with_string_views(metadata).map_err(unreadable)?;
    Ok(ParquetRecordBatchReaderBuilder::new_with_metadata(
        file, metadata,
    ))
}

/// `metadata` with every string column (inside lists and structs too) read as a string view:
/// a dictionary-encoded page then decodes to views into its dictionary, where plain strings
/// would copy a dictionary value once per row (a 10 MB value on 256 rows is a 2.5 GB batch
/// from a file of a few KB). Rows are copied out one at a time, and only when they fit.
pub(crate) fn with_string_views(
    metadata: ArrowReaderMetadata,
) -> parquet::errors::Result<ArrowReaderMetadata> {
    let fields: Vec<Field> = metadata
        .schema()
        .fields()
        .iter()
        .map(|f| string_views(f))
        .collect();
    let schema = Arc::new(Schema::new_with_metadata(
        fields,
        metadata.schema().metadata().clone(),
    ));
    let options = ArrowReaderOptions::new().with_schema(schema);
    ArrowReaderMetadata::try_new(metadata.metadata().clone(), options)
}

/// `field` with its strings as views, recursively.
fn string_views(field: &Field) -> Field {
    let data_type = match field.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
        DataType::List(item) => DataType::List(Arc::new(string_views(item))),
        DataType::LargeList(item) => DataType::LargeList(Arc::new(string_views(item))),
        DataType::Struct(members) => {
            DataType::Struct(members.iter().map(|m| string_views(m)).collect())
        }
        other => other.clone(),
    };
    field.clone().with_data_type(data_type)
}

/// Check the page headers ([`check_chunk`]) of every projected column chunk of row group
/// `group`, reading them from `file`, and their CRCs as `crc` says.
pub(crate) fn check_pages(
    metadata: &ParquetMetaData,
    group: usize,
    mask: &ProjectionMask,
    file: &mut dyn ReadAt,
    crc: Crc,
) -> Result<PagesChecked, PageFault> {
    let mut checked = PagesChecked::default();
    let Some(row_group) = metadata.row_groups().get(group) else {
        return Ok(checked);
    };
    for (leaf, column) in row_group.columns().iter().enumerate() {
        if mask.leaf_included(leaf) {
            let (start, len) = column.byte_range();
            let name = column.column_path().string();
            let named = |why: String| format!("row group {group} column {name:?}: {why}");
            let pages = check_chunk(file, start, len, crc).map_err(|fault| match fault {
                PageFault::Refused(why) => PageFault::Refused(named(why)),
                PageFault::Crc(why) => PageFault::Crc(named(why)),
                PageFault::NoCrc(why) => PageFault::NoCrc(named(why)),
            })?;
            checked.add(pages);
        }
    }
    Ok(checked)
}

/// Refuse a footer whose column chunks lie beyond the file: readers allocate what the footer
/// claims (a 3 KB file could ask for a terabyte), so every claim is checked against the real size
/// before anything is read. Local files and Hub objects alike.
pub(crate) fn check_column_chunks(
    metadata: &ParquetMetaData,
    file_size: u64,
) -> Result<(), String> {
    for (g, group) in metadata.row_groups().iter().enumerate() {
        for column in group.columns() {
            let (start, len) = column.byte_range();
            if start.checked_add(len).is_none_or(|end| end > file_size) {
                return Err(format!(
                    "row group {g} column {:?} claims bytes {start}..{} beyond the file's end \
                     ({file_size} bytes): a corrupt or hostile footer",
                    column.column_path().string(),
                    start.saturating_add(len)
                ));
            }
        }
    }
    Ok(())
}

/// The row groups from the one holding `row` to the end, and the index of its first row; `None`
/// when the file has fewer than `row` rows.
fn row_groups_from(
    groups: &[parquet::file::metadata::RowGroupMetaData],
    row: u64,
) -> Option<(Vec<usize>, u64)> {
    let mut start = 0u64;
    for (i, group) in groups.iter().enumerate() {
        let rows = group.num_rows().max(0) as u64;
        if row < start + rows {
            return Some(((i..groups.len()).collect(), start));
        }
        start += rows;
    }
    (row == start).then_some((Vec::new(), start))
}

impl BatchSource for LocalBatches {
    fn next_batch(&mut self, next_row: u64) -> Result<Option<RecordBatch>, ShardError> {
        self.reader.next().transpose().map_err(|e| {
            ShardError::new(
                &self.path,
                Some(format!("row {next_row}")),
                format!("cannot decode: {e}"),
            )
        })
    }
}

/// The leaves of `spec`'s columns (text or list field, filter, content encoding), checked
/// against the file's schema. Nothing else is fetched or decoded: Zyda-2's components and
/// FineMath's configs differ in their other columns, and that never matters.
pub(crate) fn projection(
    schema: &Schema,
    parquet_schema: &SchemaDescriptor,
    spec: &SourceSpec,
) -> Result<ProjectionMask, String> {
    check_text_column(schema, &spec.text)?;
    let mut leaves = Vec::new();
    match &spec.text {
        TextField::Column(name) => leaves.extend(leaves_of(parquet_schema, name, None)),
        TextField::Join(join) => {
            leaves.extend(leaves_of(parquet_schema, &join.list, Some(&join.field)));
            if let Some(content) = &spec.content {
                // Optional: without an encoding field every blob is read as UTF-8.
                leaves.extend(leaves_of(
                    parquet_schema,
                    &join.list,
                    Some(&content.encoding_field),
                ));
            }
        }
    }
    if let Some(filter) = &spec.filter {
        check_filter_column(schema, filter)?;
        leaves.extend(leaves_of(parquet_schema, &filter.column, None));
    }
    leaves.sort_unstable();
    leaves.dedup();
    Ok(ProjectionMask::leaves(parquet_schema, leaves))
}

/// Leaf indices of root column `root`, or of its nested field `field` (the shallowest match).
fn leaves_of(schema: &SchemaDescriptor, root: &str, field: Option<&str>) -> Vec<usize> {
    let matches: Vec<(usize, usize)> = schema
        .columns()
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let parts = c.path().parts();
            let hit = parts.first().is_some_and(|p| p == root)
                && field.is_none_or(|f| parts.len() > 1 && parts.last().is_some_and(|p| p == f));
            hit.then_some((i, parts.len()))
        })
        .collect();
    match field {
        None => matches.into_iter().map(|(i, _)| i).collect(),
        Some(_) => {
            let depth = matches.iter().map(|&(_, d)| d).min().unwrap_or(0);
            matches
                .into_iter()
                .filter(|&(_, d)| d == depth)
                .map(|(i, _)| i)
                .collect()
        }
    }
}

fn check_text_column(schema: &Schema, text: &TextField) -> Result<(), String> {
    let name = match text {
        TextField::Column(name) => name,
        TextField::Join(join) => &join.list,
    };
    let (_, field) = schema.column_with_name(name).ok_or_else(|| {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        format!("has no column `{name}` (columns: {})", names.join(", "))
    })?;
    match text {
        TextField::Column(_) if is_string(field.data_type()) => Ok(()),
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
                Some(m) if is_string(m.data_type()) => Ok(()),
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

fn check_filter_column(schema: &Schema, filter: &RowFilter) -> Result<(), String> {
    let (_, field) = schema.column_with_name(&filter.column).ok_or_else(|| {
        format!(
            "has no column `{}` (needed by the filter `{filter}`)",
            filter.column
        )
    })?;
    if field.data_type().is_numeric() {
        Ok(())
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
pub(crate) fn string_at(array: &dyn Array, row: usize) -> Option<&str> {
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

pub(crate) fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    batch
        .column_by_name(name)
        .expect("projected columns are present in every batch")
}

/// Whether row `i` passes `filter` (always, without one).
pub(crate) fn keeps(filter: Option<&RowFilter>, batch: &RecordBatch, i: usize) -> bool {
    filter.is_none_or(|f| f.keeps(number_at(column(batch, &f.column).as_ref(), i)))
}

/// The items of list column `list` at row `i`, as a struct array (`None` for a null list).
pub(crate) fn list_items(batch: &RecordBatch, list: &str, i: usize) -> Option<ArrayRef> {
    let list = column(batch, list);
    if list.is_null(i) {
        return None;
    }
    Some(match list.data_type() {
        DataType::LargeList(_) => list.as_list::<i64>().value(i),
        _ => list.as_list::<i32>().value(i),
    })
}

/// Rows of a parquet shard as documents: a text column, or a list of structs whose string field
/// is joined (a Stack v2 repository row with its files' contents).
pub(crate) struct ParquetShard<B> {
    batches: B,
    text: TextField,
    filter: Option<RowFilter>,
    batch: Option<RecordBatch>,
    batch_row: usize,
    /// Index in the file of the next row.
    row: u64,
    /// The longest text copied out of a batch ([`SourceSpec::read_limit`]); a longer one is an
    /// oversize row, measured but never copied.
    read_limit: u64,
}

impl<B: BatchSource> ParquetShard<B> {
    pub(crate) fn new(batches: B, spec: &SourceSpec) -> Self {
        Self {
            batches,
            text: spec.text.clone(),
            filter: spec.filter.clone(),
            batch: None,
            batch_row: 0,
            row: 0,
            read_limit: spec.read_limit(),
        }
    }

    /// The batches begin at row `row` of the file (not at its first row).
    pub(crate) fn starting_at(mut self, row: u64) -> Self {
        self.row = row;
        self
    }

    fn row_text(&self, batch: &RecordBatch, i: usize) -> RowText {
        if !keeps(self.filter.as_ref(), batch, i) {
            return RowText::Filtered;
        }
        let text = match &self.text {
            TextField::Column(name) => {
                let text = string_at(column(batch, name).as_ref(), i).unwrap_or_default();
                if text.len() as u64 > self.read_limit {
                    return RowText::Oversize(text.len() as u64);
                }
                text.to_string()
            }
            TextField::Join(join) => {
                let Some(items) = list_items(batch, &join.list, i) else {
                    return RowText::Empty;
                };
                let members = items
                    .as_struct()
                    .column_by_name(&join.field)
                    .expect("checked when the shard is opened");
                let parts: Vec<&str> = (0..members.len())
                    .filter_map(|k| string_at(members.as_ref(), k))
                    .filter(|s| !s.is_empty())
                    .collect();
                let bytes = joined_bytes(&parts, &join.separator);
                if bytes > self.read_limit {
                    return RowText::Oversize(bytes);
                }
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

/// The length of `parts` joined with `separator`, measured before anything is copied.
pub(crate) fn joined_bytes(parts: &[&str], separator: &str) -> u64 {
    let text: u64 = parts.iter().map(|p| p.len() as u64).sum();
    text + (separator.len() as u64) * (parts.len().saturating_sub(1) as u64)
}

impl<B: BatchSource> ShardReader for ParquetShard<B> {
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
            match self.batches.next_batch(self.row)? {
                None => return Ok(None),
                Some(batch) => {
                    self.batch = Some(batch);
                    self.batch_row = 0;
                }
            }
        }
    }
}
