//! The five seed datasets for the fake Hub, from the repo's real sample files (config/samples):
//! the same bytes are served by the fake Hub and laid out on disk, so a pack through the Hub can
//! be compared byte for byte with a local pack. The Stack v2 sample (which carries content) is
//! turned into the Hub's smol-ids form: repository rows whose `files` hold blob ids and no
//! content, plus one gzip blob per file for the S3 fake and the local mirror.
#![allow(dead_code)]

use super::fake_hub::{FakeHub, Repo, sha_of};
use super::support::repo_root;
use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Int64Array, ListArray, StringArray};
use arrow_schema::{DataType, Field, Fields};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

pub struct Dataset {
    pub source: &'static str,
    pub repo: &'static str,
    pub pattern: &'static str,
    pub format: &'static str,
    pub extra: &'static str,
    /// About the source's share of the samples' documents, so `all_exhausted` reads each about
    /// once (short tests).
    pub weight: f64,
}

pub const DATASETS: [Dataset; 5] = [
    Dataset {
        source: "fineweb-edu",
        weight: 0.36,
        repo: "HuggingFaceFW/fineweb-edu",
        pattern: "sample/10BT/*.parquet",
        format: "parquet",
        extra: "filter = \"int_score >= 3\"\n",
    },
    Dataset {
        source: "c4",
        weight: 0.09,
        repo: "allenai/c4",
        pattern: "en/c4-train.*.json.gz",
        format: "jsonl.gz",
        extra: "",
    },
    Dataset {
        source: "zyda-2",
        weight: 0.24,
        repo: "Zyphra/Zyda-2",
        pattern: "data/*/*.parquet",
        format: "parquet",
        extra: "",
    },
    Dataset {
        source: "the-stack-v2",
        weight: 0.06,
        repo: "bigcode/the-stack-v2-train-smol-ids",
        pattern: "data/*.parquet",
        format: "parquet",
        extra: "text = { list = \"files\", field = \"blob_id\", separator = \"\\n\\n\" }\n",
    },
    Dataset {
        source: "finemath",
        weight: 0.25,
        repo: "HuggingFaceTB/finemath",
        pattern: "finemath-3plus/*.parquet",
        format: "parquet",
        extra: "filter = \"int_score >= 3\"\n",
    },
];

/// Files of each repo: (repo, path in repo, bytes); blobs: (id, gzip bytes).
pub struct Seed {
    pub files: Vec<(&'static str, String, Vec<u8>)>,
    pub blobs: Vec<(String, Vec<u8>)>,
}

fn sample(rel: &str) -> Vec<u8> {
    std::fs::read(repo_root().join("config/samples").join(rel)).expect("a shipped sample")
}

pub fn seed() -> Seed {
    let mut files = Vec::new();
    for name in ["000_00000.parquet", "001_00000.parquet"] {
        files.push((
            "HuggingFaceFW/fineweb-edu",
            format!("sample/10BT/{name}"),
            sample(&format!("fineweb-edu/sample/10BT/{name}")),
        ));
    }
    for i in 0..3 {
        let name = format!("c4-train.0000{i}-of-00003.json.gz");
        files.push((
            "allenai/c4",
            format!("en/{name}"),
            sample(&format!("c4/en/{name}")),
        ));
    }
    files.push((
        "allenai/c4",
        "en/c4-validation.00000-of-00008.json.gz".into(),
        sample("c4/en/c4-validation.00000-of-00008.json.gz"),
    ));
    for (component, name) in [
        ("dclm_crossdeduped", "dclm_0000.parquet"),
        ("fwe3", "fwe3_0000.parquet"),
    ] {
        files.push((
            "Zyphra/Zyda-2",
            format!("data/{component}/{name}"),
            sample(&format!("zyda-2/data/{component}/{name}")),
        ));
    }
    for name in [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ] {
        files.push((
            "HuggingFaceTB/finemath",
            format!("finemath-3plus/{name}"),
            sample(&format!("finemath/finemath-3plus/{name}")),
        ));
    }
    let (ids_parquet, blobs) =
        stack_ids(&repo_root().join("config/samples/the-stack-v2/data/smol_0000.parquet"));
    files.push((
        "bigcode/the-stack-v2-train-smol-ids",
        "data/smol_0000.parquet".into(),
        ids_parquet,
    ));
    Seed { files, blobs }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

/// The resolved Stack v2 sample → smol-ids rows (no content) and gzip blobs. One extra file,
/// in ISO-8859-1, is added to the first repository.
pub fn stack_ids(path: &Path) -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let file = std::fs::File::open(path).expect("the stack sample");
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader");
    let (mut names, mut lengths) = (Vec::new(), Vec::new());
    let (mut ids, mut paths, mut encodings, mut sizes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut blobs = Vec::new();
    for batch in reader {
        let batch = batch.expect("batch");
        let repo_names = batch
            .column_by_name("repo_name")
            .expect("repo_name")
            .as_string::<i32>()
            .clone();
        let list = batch
            .column_by_name("files")
            .expect("files")
            .as_list::<i32>()
            .clone();
        for row in 0..batch.num_rows() {
            names.push(repo_names.value(row).to_string());
            let items = list.value(row);
            let items = items.as_struct();
            let col = |n: &str| items.column_by_name(n).expect(n).as_string::<i32>().clone();
            let (blob, p, enc, content) = (
                col("blob_id"),
                col("path"),
                col("src_encoding"),
                col("content"),
            );
            let mut n = items.len();
            for k in 0..items.len() {
                ids.push(blob.value(k).to_string());
                paths.push(p.value(k).to_string());
                encodings.push(enc.value(k).to_string());
                sizes.push(content.value(k).len() as i64);
                blobs.push((blob.value(k).to_string(), gzip(content.value(k).as_bytes())));
            }
            if names.len() == 1 {
                let latin1 = b"# caf\xe9 cr\xe8me br\xfbl\xe9e\n".to_vec();
                ids.push("0000000000000000000000000000000000a71e01".into());
                paths.push("/NOTES.latin1".into());
                encodings.push("ISO-8859-1".into());
                sizes.push(latin1.len() as i64);
                blobs.push((
                    "0000000000000000000000000000000000a71e01".into(),
                    gzip(&latin1),
                ));
                n += 1;
            }
            lengths.push(n);
        }
    }
    let fields = Fields::from(vec![
        Field::new("blob_id", DataType::Utf8, true),
        Field::new("path", DataType::Utf8, true),
        Field::new("src_encoding", DataType::Utf8, true),
        Field::new("length_bytes", DataType::Int64, true),
    ]);
    let mut builder = ListBuilder::new(StructBuilder::from_fields(fields, ids.len()));
    let mut k = 0;
    for &n in &lengths {
        let items = builder.values();
        for _ in 0..n {
            for (i, text) in [&ids[k], &paths[k], &encodings[k]].into_iter().enumerate() {
                items
                    .field_builder::<StringBuilder>(i)
                    .expect("a string field")
                    .append_value(text);
            }
            items
                .field_builder::<Int64Builder>(3)
                .expect("an int field")
                .append_value(sizes[k]);
            items.append(true);
            k += 1;
        }
        builder.append(true);
    }
    let list: ListArray = builder.finish();
    let num_files: Vec<i64> = lengths.iter().map(|&n| n as i64).collect();
    let tmp = tempfile::NamedTempFile::new().expect("tmp");
    super::support::write_parquet(
        tmp.path(),
        vec![
            ("repo_name", Arc::new(StringArray::from(names)) as ArrayRef),
            ("files", Arc::new(list)),
            ("num_files", Arc::new(Int64Array::from(num_files))),
        ],
        8,
    );
    (std::fs::read(tmp.path()).expect("read back"), blobs)
}

/// Serve `seed` from `hub` (every repo at `sha_of(repo)`, also reachable as `main`).
pub fn serve(hub: &FakeHub, seed: &Seed) {
    let mut repos: BTreeMap<&str, Repo> = BTreeMap::new();
    for (repo, path, bytes) in &seed.files {
        let entry = repos.entry(repo).or_insert_with(|| Repo {
            sha: sha_of(repo),
            ..Repo::default()
        });
        entry.files.insert(path.clone(), Arc::new(bytes.clone()));
    }
    for (id, repo) in repos {
        hub.add_repo(id, repo);
    }
    for (id, bytes) in &seed.blobs {
        hub.add_blob(id, bytes.clone());
    }
}

/// Lay `seed` out under `root` as `{repo}/{path}`, blobs under `root/blobs/{id}`.
pub fn lay_out(root: &Path, seed: &Seed) {
    for (repo, path, bytes) in &seed.files {
        let file = root.join(repo).join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(file, bytes).expect("write");
    }
    std::fs::create_dir_all(root.join("blobs")).expect("mkdir");
    for (id, bytes) in &seed.blobs {
        std::fs::write(root.join("blobs").join(id), bytes).expect("write blob");
    }
}

/// `[[source]]` tables for `datasets`: from the Hub (`hub`) or from `root` on disk.
pub fn sources(datasets: &[&Dataset], hub: Option<&FakeHub>, root: &Path, per: &str) -> String {
    let mut out = String::new();
    for d in datasets {
        let files = match hub {
            Some(_) => format!("hf://datasets/{}@main/{}", d.repo, d.pattern),
            None => format!("{}/{}/{}", root.display(), d.repo, d.pattern),
        };
        out.push_str(&format!(
            "[[source]]\nname = \"{}\"\nweight = {}\nfiles = [{files:?}]\nformat = \"{}\"\n{}",
            d.source, d.weight, d.format, d.extra
        ));
        if d.source == "the-stack-v2" {
            match hub {
                Some(hub) => out.push_str(&format!("[source.content]\nurl_template = \"{}/content/{{blob_id}}\"\nper = \"{per}\"\nconcurrency = 4\n", hub.s3)),
                None => out.push_str(&format!("[source.content]\nmirror_dir = {:?}\nper = \"{per}\"\n", root.join("blobs").display().to_string())),
            }
        }
    }
    out
}
