//! Bad input: each case gets a clear error naming the file (and row or line) or the recipe field,
//! and leaves no output behind.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use std::sync::Arc;
use support::*;

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Self {
        Case {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    /// Pack `sources` and return stderr; asserts that nothing was left at the output path.
    fn pack_fails(&self, recipe_text: &str) -> String {
        let recipe = write_recipe(self.dir.path(), recipe_text);
        let out = self.path("out");
        let err = dsprep_fails(&pack_args(&recipe, &out, &[]));
        assert!(!out.exists(), "a failed pack left {}", out.display());
        let leftovers: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".partial"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "a failed pack left a partial directory"
        );
        err
    }

    /// [`Self::pack_fails`] with the one source `source(name, files, format, extra)`.
    fn one_source_fails(&self, name: &str, files: &str, format: &str, extra: &str) -> String {
        self.pack_fails(&recipe(
            8,
            0,
            "first_exhausted",
            &source(name, files, format, extra),
        ))
    }

    /// That `err` names the shard `file` (a path in the case's directory) and then says `what`.
    fn assert_names_shard(&self, err: &str, file: &str, what: &str) {
        let named = format!("shard {}{what}", self.path(file).display());
        assert!(err.contains(&named), "{named:?} not in {err}");
    }

    fn pack_ok(&self, recipe_text: &str) -> dsprep_client::Manifest {
        let recipe = write_recipe(self.dir.path(), recipe_text);
        let out = self.path("out");
        dsprep_ok(&pack_args(&recipe, &out, &["--force"]));
        dsprep_client::PackedDataset::open(&out)
            .unwrap()
            .manifest()
            .clone()
    }
}

fn source(name: &str, files: &str, format: &str, extra: &str) -> String {
    format!("[[source]]\nname = {name:?}\nfiles = [{files:?}]\nformat = {format:?}\n{extra}\n")
}

#[test]
fn a_glob_matching_nothing_names_the_source_and_pattern() {
    let c = Case::new();
    let err = c.one_source_fails("fw", "nowhere/*.parquet", "parquet", "");
    let resolved = c.path("nowhere/*.parquet");
    assert_eq!(
        err.trim(),
        format!(
            "error: source \"fw\": files[0] \"nowhere/*.parquet\" matches no file (looked for {})",
            resolved.display()
        )
    );
}

#[test]
fn a_file_that_is_not_parquet() {
    let c = Case::new();
    std::fs::write(c.path("bad.parquet"), b"this is text, not parquet").unwrap();
    let err = c.one_source_fails("fw", "bad.parquet", "parquet", "");
    c.assert_names_shard(
        &err,
        "bad.parquet",
        ": not a parquet file (it does not start with PAR1)",
    );
    assert!(err.contains("source \"fw\""), "{err}");
}

#[test]
fn a_file_that_is_not_gzip() {
    let c = Case::new();
    std::fs::write(c.path("c4.json.gz"), "{\"text\": \"plain\"}\n").unwrap();
    let err = c.one_source_fails("c4", "c4.json.gz", "jsonl.gz", "");
    c.assert_names_shard(
        &err,
        "c4.json.gz",
        ": not a gzip file (it does not start with the gzip magic bytes 1f 8b)",
    );
}

#[test]
fn a_truncated_gzip_names_the_line() {
    let c = Case::new();
    let texts: Vec<String> = (0..2000)
        .map(|i| format!("document number {i} with some words"))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    write_c4_gz(&c.path("c4.json.gz"), &refs);
    let bytes = std::fs::read(c.path("c4.json.gz")).unwrap();
    std::fs::write(c.path("c4.json.gz"), &bytes[..bytes.len() / 2]).unwrap();
    let err = c.one_source_fails("c4", "c4.json.gz", "jsonl.gz", "");
    c.assert_names_shard(&err, "c4.json.gz", " line ");
    assert!(
        err.contains("cannot read (corrupt or truncated file?)"),
        "{err}"
    );
}

#[test]
fn a_missing_text_column_lists_the_columns() {
    use arrow_array::{ArrayRef, StringArray};
    let c = Case::new();
    write_parquet(
        &c.path("x.parquet"),
        vec![(
            "content",
            Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
        )],
        16,
    );
    let err = c.one_source_fails("fw", "x.parquet", "parquet", "");
    c.assert_names_shard(
        &err,
        "x.parquet",
        ": has no column `text` (columns: content)",
    );
}

#[test]
fn a_text_column_that_is_not_a_string() {
    use arrow_array::{ArrayRef, Int64Array};
    let c = Case::new();
    write_parquet(
        &c.path("x.parquet"),
        vec![("text", Arc::new(Int64Array::from(vec![1])) as ArrayRef)],
        16,
    );
    let err = c.one_source_fails("fw", "x.parquet", "parquet", "");
    c.assert_names_shard(
        &err,
        "x.parquet",
        ": column `text` has type Int64, expected a string",
    );
}

#[test]
fn a_jsonl_text_field_that_is_not_a_string_names_the_line() {
    let c = Case::new();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"ok\"}\n{\"text\": 42}\n").unwrap();
    let err = c.one_source_fails("d", "d.jsonl", "jsonl", "");
    c.assert_names_shard(
        &err,
        "d.jsonl",
        " line 2: field `text` is a number, expected a string",
    );
}

#[test]
fn invalid_utf8_in_json_lines_names_the_line() {
    let c = Case::new();
    let mut bytes = b"{\"text\": \"fine\"}\n{\"text\": \"caf".to_vec();
    bytes.extend([0xff, 0xfe]);
    bytes.extend(b"\"}\n");
    write_gz(&c.path("c4.json.gz"), &bytes);
    let err = c.one_source_fails("c4", "c4.json.gz", "jsonl.gz", "");
    c.assert_names_shard(
        &err,
        "c4.json.gz",
        " line 2: is not valid UTF-8 (byte 13 of the line)",
    );
}

#[test]
fn malformed_json_names_the_line() {
    let c = Case::new();
    std::fs::write(
        c.path("d.jsonl"),
        "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n",
    )
    .unwrap();
    let err = c.one_source_fails("d", "d.jsonl", "jsonl", "");
    c.assert_names_shard(&err, "d.jsonl", " line 2: is not valid JSON: ");
}

#[test]
fn a_missing_field_names_the_line() {
    let c = Case::new();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n").unwrap();
    let err = c.one_source_fails("d", "d.jsonl", "jsonl", "");
    c.assert_names_shard(&err, "d.jsonl", " line 2: has no field `text`");
}

#[test]
fn empty_documents_are_counted_and_skipped() {
    let c = Case::new();
    write_fineweb_edu(
        &c.path("fw/000_00000.parquet"),
        &[Some("first"), Some(""), None, Some("fourth")],
        &[3, 3, 3, 3],
    );
    std::fs::write(
        c.path("d.jsonl"),
        "{\"text\": \"\"}\n{\"text\": \"kept\"}\n{\"text\": null}\n",
    )
    .unwrap();
    let sources =
        source("fw", "fw/*.parquet", "parquet", "") + &source("d", "d.jsonl", "jsonl", "");
    let m = c.pack_ok(&recipe(2, 0, "all_exhausted", &sources));
    let (fw, d) = (&m.sources[0], &m.sources[1]);
    assert_eq!(
        (fw.rows_empty, d.rows_empty),
        (
            2 * fw.passes_completed as u64,
            2 * d.passes_completed as u64
        )
    );
    assert_eq!(
        fw.documents % 2,
        0,
        "only the two non-empty rows become documents"
    );
}

#[test]
fn a_filter_on_a_missing_column_names_it() {
    let c = Case::new();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"ok\"}\n").unwrap();
    let err = c.one_source_fails("d", "d.jsonl", "jsonl", "filter = \"int_score >= 3\"");
    c.assert_names_shard(
        &err,
        "d.jsonl",
        " line 1: has no field `int_score` (needed by the filter `int_score >= 3`)",
    );
}

#[test]
fn a_source_with_every_row_filtered_out_is_an_error() {
    let c = Case::new();
    write_fineweb_edu(
        &c.path("fw/000_00000.parquet"),
        &[Some("a"), Some("b")],
        &[1, 2],
    );
    let err = c.one_source_fails(
        "fw",
        "fw/*.parquet",
        "parquet",
        "filter = \"int_score >= 3\"",
    );
    assert_eq!(
        err.trim(),
        format!(
            "error: source \"fw\" has no documents (every row was empty or filtered out)\n\
             removed {}: it held no checkpoint to continue from",
            c.path("out.partial").display()
        )
    );
}

#[test]
fn a_ten_megabyte_document_packs() {
    let c = Case::new();
    let big = "The quick brown fox jumps over the lazy dog. ".repeat(10 * 1024 * 1024 / 45);
    std::fs::write(
        c.path("d.jsonl"),
        serde_json::json!({"text": big}).to_string() + "\n",
    )
    .unwrap();
    let m = c.pack_ok(&recipe(
        2048,
        0,
        "first_exhausted",
        &source("d", "d.jsonl", "jsonl", ""),
    ));
    // GPT-2: 10 tokens per sentence (9 words and the period), one for the final trailing space,
    // one EOS.
    let sentences = (10 * 1024 * 1024 / 45) as u64;
    assert_eq!(m.sources[0].tokens, sentences * 10 + 2);
    assert_eq!(m.num_windows, (sentences * 10 + 2) / 2049);
}

#[test]
fn a_tokenizer_that_does_not_parse() {
    let c = Case::new();
    std::fs::write(c.path("tok.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"ok\"}\n").unwrap();
    let text = recipe(
        8,
        0,
        "first_exhausted",
        &source("d", "d.jsonl", "jsonl", ""),
    )
    .replace(&gpt2_tokenizer().display().to_string(), "tok.json");
    let err = c.pack_fails(&text);
    assert!(
        err.contains(&format!(
            "tokenizer {}: does not parse as a tokenizer.json: ",
            c.path("tok.json").display()
        )),
        "{err}"
    );
}

#[test]
fn an_eos_token_not_in_the_vocabulary() {
    let c = Case::new();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"ok\"}\n").unwrap();
    let text = recipe(
        8,
        0,
        "first_exhausted",
        &source("d", "d.jsonl", "jsonl", ""),
    )
    .replace("<|endoftext|>", "</s>");
    let err = c.pack_fails(&text);
    assert!(
        err.contains(&format!(
            "tokenizer.eos: token \"</s>\" is not in the vocabulary of {}",
            gpt2_tokenizer().display()
        )),
        "{err}"
    );
    let by_id = recipe(
        8,
        0,
        "first_exhausted",
        &source("d", "d.jsonl", "jsonl", ""),
    )
    .replace("\"<|endoftext|>\"", "99999");
    let err = c.pack_fails(&by_id);
    assert!(
        err.contains("tokenizer.eos: token id 99999 is not in the vocabulary of "),
        "{err}"
    );
}

#[test]
fn negative_and_all_zero_weights_name_the_field() {
    let c = Case::new();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"ok\"}\n").unwrap();
    let err = c.one_source_fails("d", "d.jsonl", "jsonl", "weight = -0.5");
    assert!(
        err.contains("source[0].weight: must be a finite number >= 0, got -0.5"),
        "{err}"
    );
    let zero = source("d", "d.jsonl", "jsonl", "weight = 0")
        + &source("e", "d.jsonl", "jsonl", "weight = 0.0");
    let err = c.pack_fails(&recipe(8, 0, "first_exhausted", &zero));
    assert!(
        err.contains("source: all weights are zero: at least one source needs weight > 0"),
        "{err}"
    );
    assert!(
        err.contains(&format!("recipe {}", c.path("recipe.toml").display())),
        "{err}"
    );
}

#[test]
fn an_existing_output_is_not_overwritten_without_force() {
    let c = Case::new();
    std::fs::create_dir(c.path("out")).unwrap();
    std::fs::write(c.path("out/keep.txt"), "mine").unwrap();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"ok\"}\n").unwrap();
    let recipe = write_recipe(
        c.dir.path(),
        &recipe(
            2,
            0,
            "first_exhausted",
            &source("d", "d.jsonl", "jsonl", ""),
        ),
    );
    let err = dsprep_fails(&[
        "pack",
        "--recipe",
        recipe.to_str().unwrap(),
        "--out",
        c.path("out").to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(
        err.trim(),
        format!(
            "error: output {} already exists (pass --force to replace it)",
            c.path("out").display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(c.path("out/keep.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn a_failure_mid_stream_leaves_no_output() {
    let c = Case::new();
    // The second shard is corrupt: the pack starts, writes, then fails.
    let texts: Vec<String> = (0..3000)
        .map(|i| format!("document {i} has a few words in it"))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    write_c4_gz(&c.path("c4/a.json.gz"), &refs);
    std::fs::write(c.path("c4/b.json.gz"), b"garbage").unwrap();
    let text = recipe(
        8,
        0,
        "first_exhausted",
        &source("c4", "c4/*.json.gz", "jsonl.gz", ""),
    )
    .replace("seed = 7", "seed = 7\nshuffle_shards = false");
    let err = c.pack_fails(&text);
    c.assert_names_shard(&err, "c4/b.json.gz", ": not a gzip file");
}

#[test]
fn a_document_over_max_document_bytes_stops_the_pack_naming_the_line_and_size() {
    let c = Case::new();
    let lines = [
        serde_json::json!({"text": "small"}),
        serde_json::json!({"text": "x".repeat(2000)}),
        serde_json::json!({"text": "small again"}),
    ];
    let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    std::fs::write(c.path("d.jsonl"), text).unwrap();
    let limited = source("d", "d.jsonl", "jsonl", "max_document_bytes = 1000");
    let err = c.pack_fails(&recipe(16, 0, "first_exhausted", &limited));
    assert!(
        err.contains(&format!(
            "shard {} line 2: a document of 2000 bytes is over source \"d\"'s \
             max_document_bytes = 1000: raise max_document_bytes (at most 1 GiB), set oversize \
             = \"skip\" to leave such documents out, counted, or oversize = \"split\" to cut \
             them into pieces",
            c.path("d.jsonl").display()
        )),
        "{err}"
    );
    // What became of the partial output is said last.
    assert!(
        err.trim_end().ends_with(&format!(
            "removed {}: it held no checkpoint to continue from",
            c.path("out.partial").display()
        )),
        "{err}"
    );

    // Skipped instead: counted, and the other documents packed.
    let skipping = source(
        "d",
        "d.jsonl",
        "jsonl",
        "max_document_bytes = 1000\noversize = \"skip\"",
    );
    let m = c.pack_ok(&recipe(16, 0, "first_exhausted", &skipping));
    let d = &m.sources[0];
    assert_eq!((d.rows_read, d.rows_oversize, d.documents), (3, 1, 2));
    let written = std::fs::read_to_string(c.path("out/manifest.json")).unwrap();
    assert!(written.contains("\"rows_oversize\": 1"), "{written}");

    // The same limit holds for parquet rows.
    let big = "y".repeat(1500);
    write_fineweb_edu(
        &c.path("fw/000_00000.parquet"),
        &[Some("first"), Some(&big), Some("third")],
        &[3, 3, 3],
    );
    let parquet = source(
        "fw",
        "fw/*.parquet",
        "parquet",
        "max_document_bytes = 1000\noversize = \"skip\"",
    );
    let m = c.pack_ok(&recipe(16, 0, "first_exhausted", &parquet));
    assert_eq!((m.sources[0].rows_oversize, m.sources[0].documents), (1, 2));
    let parquet = source("fw", "fw/*.parquet", "parquet", "max_document_bytes = 1000");
    std::fs::remove_dir_all(c.path("out")).unwrap();
    let err = c.pack_fails(&recipe(16, 0, "first_exhausted", &parquet));
    assert!(
        err.contains(&format!(
            "shard {} row 1: a document of 1500 bytes is over source \"fw\"'s",
            c.path("fw/000_00000.parquet").display()
        )),
        "{err}"
    );
}

/// A gzip bomb of one line: 64 MiB of text in a few hundred KB. With a 1000-byte limit the line
/// is never held: read to its end, refused (or skipped), and the pack after it goes on.
#[test]
fn a_line_too_long_for_any_allowed_document_is_never_held() {
    let c = Case::new();
    let mut bytes = b"{\"text\": \"ok\"}\n{\"text\": \"".to_vec();
    bytes.extend(std::iter::repeat_n(b'z', 64 << 20));
    bytes.extend(b"\"}\n{\"text\": \"after\"}\n");
    write_gz(&c.path("c4.json.gz"), &bytes);
    let long = (64 << 20) + 13;
    let limited = source("c4", "c4.json.gz", "jsonl.gz", "max_document_bytes = 1000");
    let err = c.pack_fails(&recipe(16, 0, "first_exhausted", &limited));
    assert!(
        err.contains(&format!(
            "shard {} line 2: a line of {long} bytes is longer than any document within source \
             \"c4\"'s max_document_bytes = 1000 can need (2 × max_document_bytes + 1 MiB)",
            c.path("c4.json.gz").display()
        )),
        "{err}"
    );
    let skipping = source(
        "c4",
        "c4.json.gz",
        "jsonl.gz",
        "max_document_bytes = 1000\noversize = \"skip\"",
    );
    let m = c.pack_ok(&recipe(16, 0, "first_exhausted", &skipping));
    assert_eq!((m.sources[0].rows_oversize, m.sources[0].documents), (1, 2));
}

#[test]
fn a_max_document_bytes_out_of_range_names_the_field() {
    let c = Case::new();
    std::fs::write(c.path("d.jsonl"), "{\"text\": \"a\"}\n").unwrap();
    let err = c.pack_fails(&recipe(
        16,
        0,
        "first_exhausted",
        &source("d", "d.jsonl", "jsonl", "max_document_bytes = 0"),
    ));
    assert!(
        err.contains("source[0].max_document_bytes: must be 1 to 1073741824 (1 GiB), got 0"),
        "{err}"
    );
}

/// A pack that fails after it wrote a checkpoint keeps `OUT.partial` and says so: the same command
/// continues from the checkpoint (and here meets the same bad document again).
#[test]
fn a_failure_after_a_checkpoint_keeps_the_partial_output_and_says_so() {
    let c = Case::new();
    // About 6 MB of documents (two dozen pipeline chunks), then one over the limit.
    let mut text = String::new();
    for i in 0..6000 {
        let doc = format!("document {i}: {}", "lorem ipsum dolor sit amet ".repeat(37));
        text.push_str(&serde_json::json!({ "text": doc }).to_string());
        text.push('\n');
    }
    text.push_str(&serde_json::json!({ "text": "x".repeat(5000) }).to_string());
    text.push('\n');
    std::fs::write(c.path("d.jsonl"), text).unwrap();
    let limited = source("d", "d.jsonl", "jsonl", "max_document_bytes = 2000");
    let recipe_path = write_recipe(c.dir.path(), &recipe(64, 0, "first_exhausted", &limited));
    let out = c.path("out");
    let partial = c.path("out.partial");
    let args = [
        "pack",
        "--recipe",
        recipe_path.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
        "--checkpoint-secs",
        "0",
    ];
    for attempt in 0..2 {
        let err = dsprep_fails(&args);
        assert!(err.contains("line 6001: a document of 5000 bytes"), "{err}");
        let last = err
            .trim_end()
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        assert!(
            last.starts_with(&format!(
                "kept {}: it holds a checkpoint after ",
                partial.display()
            )) && last
                .ends_with("windows; the same command continues from there (--fresh starts over)"),
            "attempt {attempt}: {err}"
        );
        assert!(!out.exists(), "a failed pack left {}", out.display());
        assert!(partial.join("checkpoint.ckpt").is_file(), "{err}");
        if attempt == 1 {
            assert!(err.contains("continuing the interrupted pack"), "{err}");
        }
    }
}

/// A parquet footer that claims column chunks of 1 TiB (a corrupt or hostile file, a few KB on
/// disk). Unchecked, the local reader fails later with a misleading "row 12: eof decoding byte
/// array", and the Hub reader would ask for the ranges the footer states. It is refused, naming
/// the file, the row group and the column, before anything is read.
#[test]
fn a_parquet_footer_claiming_huge_column_chunks_is_refused() {
    use parquet::file::metadata::{ParquetMetaDataReader, ParquetMetaDataWriter};
    let c = Case::new();
    let honest = c.path("honest.parquet");
    write_fineweb_edu(&honest, &[Some("a document"), Some("another")], &[3, 3]);
    let bytes = std::fs::read(&honest).unwrap();
    let metadata = ParquetMetaDataReader::new()
        .parse_and_finish(&bytes::Bytes::from(bytes.clone()))
        .unwrap();
    let footer_len =
        u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap());
    let data_end = bytes.len() - 8 - footer_len as usize;
    let mut builder = metadata.clone().into_builder();
    let groups: Vec<_> = builder.take_row_groups();
    for group in groups {
        let columns = group
            .columns()
            .iter()
            .map(|column| {
                column
                    .clone()
                    .into_builder()
                    .set_total_compressed_size(1 << 40)
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
    let hostile = builder.build();
    let mut out = bytes[..data_end].to_vec();
    ParquetMetaDataWriter::new(&mut out, &hostile)
        .finish()
        .unwrap();
    std::fs::create_dir_all(c.path("fw")).unwrap();
    std::fs::write(c.path("fw/000_00000.parquet"), &out).unwrap();
    std::fs::remove_file(&honest).unwrap();

    let err = c.pack_fails(&recipe(
        16,
        0,
        "first_exhausted",
        &source("fw", "fw/*.parquet", "parquet", ""),
    ));
    assert!(
        err.contains(&format!(
            "shard {}: row group 0 column \"text\" claims bytes",
            c.path("fw/000_00000.parquet").display()
        )) && err.contains("beyond the file's end"),
        "{err}"
    );
}
