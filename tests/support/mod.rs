//! Shared helpers for the integration tests: paths into the repo, fixture writers that produce
//! files with the real Hub schemas, and a runner for the real `dsprep` binary.
#![allow(dead_code)]

pub mod adaptive;
pub mod daemon;
mod fetched_tokenizer;
pub mod lineage;
pub mod nodes;
pub mod parquet_pages;
pub mod raw_rank;
pub mod serve_run;
pub mod taps;
pub mod watch;

#[allow(unused_imports)] // each test binary includes this module; not all of them fetch
pub use fetched_tokenizer::fetched_tokenizer;

use arrow_array::{ArrayRef, RecordBatch};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("daemon/ has a parent")
        .to_path_buf()
}

pub fn gpt2_tokenizer() -> PathBuf {
    repo_root().join("config/tokenizers/gpt2/tokenizer.json")
}

pub fn quickstart() -> PathBuf {
    repo_root().join("config/quickstart.toml")
}

/// The quickstart with each `(from, to)` replaced, written as `dir/name` with absolute paths
/// to the shipped tokenizer and samples.
pub fn quickstart_variant(dir: &Path, name: &str, replace: &[(&str, &str)]) -> PathBuf {
    recipe_variant(&quickstart(), dir, name, replace)
}

/// A shipped recipe of `config/` (`recipe`) written into `dir` as `name`, its relative paths made
/// absolute and each `(from, to)` of `replace` applied (each must be there).
pub fn recipe_variant(recipe: &Path, dir: &Path, name: &str, replace: &[(&str, &str)]) -> PathBuf {
    let config = repo_root().join("config");
    let mut text = std::fs::read_to_string(recipe)
        .expect("the recipe is shipped")
        .replace(
            "\"tokenizers/",
            &format!("\"{}/tokenizers/", config.display()),
        )
        .replace("\"samples/", &format!("\"{}/samples/", config.display()));
    for (from, to) in replace {
        assert!(text.contains(from), "{} has no {from:?}", recipe.display());
        text = text.replace(from, to);
    }
    let path = dir.join(name);
    std::fs::write(&path, text).expect("the recipe is written");
    path
}

/// The quickstart mixed in tokens (`[mix] unit = "tokens"`), written into `dir`.
pub fn quickstart_in_tokens(dir: &Path) -> PathBuf {
    quickstart_variant(
        dir,
        "quickstart-tokens.toml",
        &[("[mix]\n", "[mix]\nunit = \"tokens\"\n")],
    )
}

/// The quickstart mixed in tokens with a second phase from `at_tokens` on (more math and code,
/// no c4 or zyda-2), written into `dir`.
pub fn quickstart_with_a_phase(dir: &Path, at_tokens: u64) -> PathBuf {
    let path = quickstart_in_tokens(dir);
    let mut text = std::fs::read_to_string(&path).expect("just written");
    text.push_str(&format!(
        "\n[[mix.phase]]\nat_tokens = {at_tokens}\n\
         weights = {{ finemath = 0.3, the-stack-v2 = 0.3, fineweb-edu = 0.4 }}\n"
    ));
    let phased = dir.join(format!("quickstart-phase-{at_tokens}.toml"));
    std::fs::write(&phased, text).expect("the recipe is written");
    phased
}

/// Pack `recipe` into `out` in-process (2 threads, one token shard) and open the result.
pub fn pack_dataset(recipe: &Path, out: &Path) -> dsprep_client::PackedDataset {
    let options = dsprep::pack::PackOptions {
        recipe: recipe.to_path_buf(),
        out: out.to_path_buf(),
        threads: 2,
        shard_bytes: 1 << 30,
        force: false,
        progress: false,
        engine: dsprep_mixers::EngineChoice::Auto,
        checkpoint_secs: 60,
        fresh: false,
        plan: None,
        lineage: None,
    };
    dsprep::pack::pack(&options).expect("the pack succeeds");
    dsprep_client::PackedDataset::open(out).expect("the packed directory opens")
}

pub fn dsprep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dsprep"))
        .args(args)
        .output()
        .expect("the dsprep binary runs")
}

/// `dsprep pack --recipe RECIPE --out OUT --quiet EXTRA…`: the arguments most pack tests run.
pub fn pack_args<'a>(recipe: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "pack",
        "--recipe",
        recipe.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    args
}

/// Run dsprep expecting failure; return its stderr.
pub fn dsprep_fails(args: &[&str]) -> String {
    let out = dsprep(args);
    assert!(
        !out.status.success(),
        "dsprep {args:?} succeeded but should have failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run dsprep expecting success; return its stdout.
pub fn dsprep_ok(args: &[&str]) -> String {
    let out = dsprep(args);
    assert!(
        out.status.success(),
        "dsprep {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Write a parquet file with the given columns (snappy, `row_group_rows` rows per row group).
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>, row_group_rows: usize) {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;
    std::fs::create_dir_all(path.parent().expect("a file has a parent")).expect("mkdir");
    let batch = RecordBatch::try_from_iter(columns).expect("columns make a batch");
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(row_group_rows))
        .build();
    let file = std::fs::File::create(path).expect("create parquet");
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

/// A FineWeb-Edu shard with the real 10-column schema.
pub fn write_fineweb_edu(path: &Path, texts: &[Option<&str>], int_scores: &[i64]) {
    use arrow_array::{Float64Array, Int64Array, StringArray};
    let n = texts.len();
    let s = |f: &dyn Fn(usize) -> String| -> ArrayRef {
        Arc::new(StringArray::from(
            (0..n).map(|i| Some(f(i))).collect::<Vec<_>>(),
        ))
    };
    write_parquet(
        path,
        vec![
            (
                "text",
                Arc::new(StringArray::from(texts.to_vec())) as ArrayRef,
            ),
            (
                "id",
                s(&|i| format!("<urn:uuid:00000000-0000-0000-0000-{i:012}>")),
            ),
            ("dump", s(&|_| "CC-MAIN-2019-30".into())),
            ("url", s(&|i| format!("https://example.org/{i}"))),
            (
                "file_path",
                s(&|_| "s3://commoncrawl/crawl-data/x.warc.gz".into()),
            ),
            ("language", s(&|_| "en".into())),
            ("language_score", Arc::new(Float64Array::from(vec![0.9; n]))),
            ("token_count", Arc::new(Int64Array::from(vec![100; n]))),
            (
                "score",
                Arc::new(Float64Array::from(
                    int_scores.iter().map(|&s| s as f64).collect::<Vec<_>>(),
                )),
            ),
            ("int_score", Arc::new(Int64Array::from(int_scores.to_vec()))),
        ],
        16,
    );
}

/// A C4-style `.json.gz` shard (keys `text`, `timestamp`, `url`, compact, in that order).
pub fn write_c4_gz(path: &Path, texts: &[&str]) {
    let lines: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"text": t, "timestamp": "2019-04-25T12:57:54Z", "url": format!("https://example.com/{i}")}).to_string())
        .collect();
    write_gz(path, (lines.join("\n") + "\n").as_bytes());
}

pub fn write_gz(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("a file has a parent")).expect("mkdir");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(path).expect("create"),
        flate2::Compression::default(),
    );
    enc.write_all(bytes).expect("write gz");
    enc.finish().expect("finish gz");
}

/// A recipe using the shipped GPT-2 tokenizer; `sources` is the `[[source]]` TOML.
pub fn recipe(seq_len: u32, buffer_size: usize, stopping: &str, sources: &str) -> String {
    format!(
        "version = 1\n[tokenizer]\npath = {:?}\neos = \"<|endoftext|>\"\n[packing]\nseq_len = {seq_len}\n\
         [shuffle]\nseed = 7\nbuffer_size = {buffer_size}\n[mix]\nstopping = {stopping:?}\n{sources}",
        gpt2_tokenizer().display().to_string()
    )
}

pub fn write_recipe(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("recipe.toml");
    std::fs::write(&path, text).expect("write recipe");
    path
}

/// Every file of a directory, by name, with its bytes.
pub fn dir_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("dir entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read file"),
            )
        })
        .collect();
    files.sort();
    files
}
