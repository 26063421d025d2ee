//! Parquet files with pages as a test wants them: one column `text`, one big page per column
//! chunk, and a page header that claims another uncompressed size than its page has (the
//! hostile inputs of `tests/hostile.rs` and the Hub's copy of one in `tests/hub.rs`).

use arrow_array::ArrayRef;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::basic::Compression;
use parquet::file::metadata::{ParquetMetaDataReader, ParquetMetaDataWriter};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use std::path::Path;

/// One column `text`, one row group, pages as `props` make them; no arrow schema in the footer
/// (a plain parquet string column, as most writers leave it).
pub fn write_text_parquet(path: &Path, texts: ArrayRef, props: WriterProperties) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let batch = arrow_array::RecordBatch::try_from_iter([("text", texts)]).unwrap();
    let options = ArrowWriterOptions::new()
        .with_properties(props)
        .with_skip_arrow_metadata(true);
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new_with_options(file, batch.schema(), options).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// Writer settings for one big page per column chunk and no page index to keep in step.
pub fn one_page(compression: Compression, dictionary: bool) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(compression)
        .set_dictionary_enabled(dictionary)
        .set_dictionary_page_size_limit(1 << 30)
        .set_data_page_size_limit(1 << 30)
        .set_data_page_row_count_limit(usize::MAX)
        .set_write_batch_size(1 << 20)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_offset_index_disabled(true)
        .build()
}

/// Rewrite the parquet file at `path` so that its first page header claims `uncompressed`
/// bytes: the varint of `uncompressed_page_size` (field 2, right after the page type) is
/// replaced, and the footer's column chunk sizes and offsets follow the shift.
pub fn claim_uncompressed(path: &Path, uncompressed: i32) {
    let bytes = std::fs::read(path).unwrap();
    let metadata = ParquetMetaDataReader::new()
        .parse_and_finish(&bytes::Bytes::from(bytes.clone()))
        .unwrap();
    let column = metadata.row_group(0).column(0);
    let page = column.byte_range().0 as usize;
    let varint_end =
        |from: usize| from + bytes[from..].iter().position(|b| b & 0x80 == 0).unwrap() + 1;
    assert_eq!(bytes[page], 0x15, "field 1, an i32: the page type");
    let field2 = varint_end(page + 1);
    assert_eq!(
        bytes[field2], 0x15,
        "field 2, an i32: uncompressed_page_size"
    );
    let (from, to) = (field2 + 1, varint_end(field2 + 1));
    let mut zigzag = ((i64::from(uncompressed) << 1) ^ (i64::from(uncompressed) >> 63)) as u64;
    let mut varint = Vec::new();
    loop {
        let b = (zigzag & 0x7f) as u8;
        zigzag >>= 7;
        if zigzag == 0 {
            varint.push(b);
            break;
        }
        varint.push(b | 0x80);
    }
    let shift = varint.len() as i64 - (to - from) as i64;
    let footer_len =
        u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap());
    let data_end = bytes.len() - 8 - footer_len as usize;
    let mut out = bytes[..from].to_vec();
    out.extend(&varint);
    out.extend(&bytes[to..data_end]);
    let moved = |offset: i64| {
        if offset > page as i64 {
            offset + shift
        } else {
            offset
        }
    };
    let mut builder = metadata.clone().into_builder();
    let groups = builder.take_row_groups();
    for group in groups {
        let columns = group
            .columns()
            .iter()
            .map(|c| {
                c.clone()
                    .into_builder()
                    .set_total_compressed_size(c.compressed_size() + shift)
                    .set_data_page_offset(moved(c.data_page_offset()))
                    .set_dictionary_page_offset(c.dictionary_page_offset().map(moved))
                    .build()
                    .unwrap()
            })
            .collect();
        builder = builder.add_row_group(
            group
                .into_builder()
                .set_column_metadata(columns)
                .build()
                .unwrap(),
        );
    }
    ParquetMetaDataWriter::new(&mut out, &builder.build())
        .finish()
        .unwrap();
    std::fs::write(path, out).unwrap();
}
