//! `dsprep export`: the quickstart packed, then exported as Megatron's IndexedDataset (read back
//! here by a reader that follows megatron/core/datasets/indexed_dataset.py's `_IndexReader`
//! byte for byte) and as a Hugging Face `datasets` directory (its Arrow stream read back; the
//! Python tests load it with `datasets.load_from_disk`). Every document and every row is
//! compared with the packed windows; bad input leaves nothing behind.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::PackedDataset;
use std::path::Path;
use support::{dsprep_fails, dsprep_ok, pack_dataset, quickstart, recipe_variant};

/// The packed stream's token ids, and where each document starts in it.
fn stream(packed: &PackedDataset) -> (Vec<u32>, Vec<usize>) {
    let m = packed.manifest();
    let mut tokens = Vec::new();
    let mut starts = Vec::new();
    for w in 0..packed.num_windows() {
        let window = packed.window(w).unwrap();
        starts.extend(
            window
                .doc_starts
                .iter()
                .map(|&s| (w * u64::from(m.window_tokens)) as usize + s as usize),
        );
        tokens.extend(window.tokens.to_vec());
    }
    (tokens, starts)
}

/// Megatron's MMIDIDX v1 index, read as megatron-core's `_IndexReader` does.
struct MegatronIndex {
    dtype_code: u8,
    lengths: Vec<i32>,
    pointers: Vec<i64>,
    documents: Vec<i64>,
}

fn read_index(path: &Path) -> MegatronIndex {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..9], b"MMIDIDX\x00\x00", "magic");
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    assert_eq!(u64_at(9), 1, "version");
    let dtype_code = bytes[17];
    let (sequences, documents) = (u64_at(18) as usize, u64_at(26) as usize);
    let mut at = 34;
    let mut take = |n: usize, size: usize| {
        let slice = &bytes[at..at + n * size];
        at += n * size;
        slice.to_vec()
    };
    let lengths = take(sequences, 4)
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let pointers = take(sequences, 8)
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let documents_read = take(documents, 8)
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(at, bytes.len(), "nothing after the document indices");
    MegatronIndex {
        dtype_code,
        lengths,
        pointers,
        documents: documents_read,
    }
}

#[test]
fn megatron_export_holds_every_document_in_stream_order() {
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let (tokens, starts) = stream(&packed);
    let prefix = tmp.path().join("mega/quickstart");
    std::fs::create_dir_all(prefix.parent().unwrap()).unwrap();
    let dir = tmp.path().join("packed");
    let out = dsprep_ok(&[
        "export",
        dir.to_str().unwrap(),
        "--to",
        "megatron",
        "--out",
        prefix.to_str().unwrap(),
    ]);
    assert!(
        out.starts_with(&format!("exported {} documents", starts.len())),
        "{out}"
    );

    let index = read_index(&prefix.with_extension("idx"));
    assert_eq!(
        index.dtype_code, 8,
        "u16 ids are Megatron's uint16 (code 8)"
    );
    let mut ends: Vec<usize> = starts[1..].to_vec();
    ends.push(tokens.len());
    let want: Vec<i32> = starts
        .iter()
        .zip(&ends)
        .map(|(s, e)| (e - s) as i32)
        .collect();
    assert_eq!(index.lengths, want, "one sequence per document");
    let mut pointer = 0i64;
    for (p, len) in index.pointers.iter().zip(&index.lengths) {
        assert_eq!(*p, pointer);
        pointer += i64::from(*len) * 2;
    }
    assert_eq!(
        index.documents,
        (0..=starts.len() as i64).collect::<Vec<_>>()
    );
    let bin = std::fs::read(prefix.with_extension("bin")).unwrap();
    assert_eq!(bin.len(), tokens.len() * 2);
    // Each sequence, read at its pointer, is its document's ids.
    for (i, (&p, &len)) in index
        .pointers
        .iter()
        .zip(&index.lengths)
        .enumerate()
        .step_by(7)
    {
        let ids: Vec<u32> = bin[p as usize..p as usize + len as usize * 2]
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        assert_eq!(ids, tokens[starts[i]..ends[i]], "document {i}");
    }

    // An existing output is kept unless --force.
    let err = dsprep_fails(&[
        "export",
        dir.to_str().unwrap(),
        "--to",
        "megatron",
        "--out",
        prefix.to_str().unwrap(),
    ]);
    assert!(
        err.contains(&format!(
            "{} exists: pass --force to replace it (nothing was written)",
            prefix.with_extension("bin").display()
        )),
        "{err}"
    );
}

#[test]
fn hf_datasets_export_is_the_stream_in_seq_len_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let (tokens, _) = stream(&packed);
    let seq_len = packed.manifest().seq_len as usize;
    let out = tmp.path().join("hf");
    let dir = tmp.path().join("packed");
    dsprep_ok(&[
        "export",
        dir.to_str().unwrap(),
        "--to",
        "hf-datasets",
        "--out",
        out.to_str().unwrap(),
    ]);
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "data-00000-of-00001.arrow",
            "dataset_info.json",
            "state.json"
        ]
    );
    let file = std::fs::File::open(out.join("data-00000-of-00001.arrow")).unwrap();
    let reader = arrow_ipc::reader::StreamReader::try_new(file, None).unwrap();
    let mut rows = 0usize;
    for batch in reader {
        let batch = batch.unwrap();
        let ids = batch
            .column_by_name("input_ids")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::ListArray>()
            .unwrap();
        for r in 0..batch.num_rows() {
            let row = ids.value(r);
            let row = row
                .as_any()
                .downcast_ref::<arrow_array::Int32Array>()
                .unwrap();
            let want: Vec<i32> = tokens[rows * seq_len..(rows + 1) * seq_len]
                .iter()
                .map(|&t| t as i32)
                .collect();
            assert_eq!(row.values().to_vec(), want, "row {rows}");
            rows += 1;
        }
    }
    assert_eq!(rows, tokens.len() / seq_len, "every whole block, in order");
}

/// Column `name` of an Arrow batch, row `r`, as i64s.
fn row_of(batch: &arrow_array::RecordBatch, name: &str, r: usize) -> Vec<i64> {
    use arrow_array::cast::AsArray;
    let list = batch
        .column_by_name(name)
        .unwrap()
        .as_list::<i32>()
        .value(r);
    match list.data_type() {
        arrow_schema::DataType::Int8 => (list.as_primitive::<arrow_array::types::Int8Type>())
            .values()
            .iter()
            .map(|&v| i64::from(v))
            .collect(),
        _ => (list.as_primitive::<arrow_array::types::Int32Type>())
            .values()
            .iter()
            .map(|&v| i64::from(v))
            .collect(),
    }
}

/// A best_fit pack: Megatron gets every whole document and no padding; the datasets directory
/// one row per window with `attention_mask` 0 and `labels` -100 exactly on the padding.
#[test]
fn a_best_fit_pack_exports_whole_documents_and_masked_padding() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = recipe_variant(
        &quickstart(),
        tmp.path(),
        "bf.toml",
        &[("seq_len = 512", "seq_len = 512\nstrategy = \"best_fit\"")],
    );
    let dir = tmp.path().join("packed");
    let packed = pack_dataset(&recipe, &dir);
    let seq_len = packed.manifest().seq_len as usize;
    let mut documents = Vec::new();
    let mut windows = Vec::new();
    for w in 0..packed.num_windows() {
        let window = packed.window(w).unwrap();
        let (tokens, real) = (window.tokens.to_vec(), window.real_tokens as usize);
        let ends = window.doc_starts.iter().skip(1).map(|&s| s as usize);
        for (&start, end) in window.doc_starts.iter().zip(ends.chain([real])) {
            documents.push(tokens[start as usize..end].to_vec());
        }
        windows.push((tokens, real));
    }
    let prefix = tmp.path().join("mega");
    let export = |to: &str, out: &Path| {
        let args = [
            "export",
            dir.to_str().unwrap(),
            "--to",
            to,
            "--out",
            out.to_str().unwrap(),
        ];
        dsprep_ok(&args)
    };
    export("megatron", &prefix);
    let index = read_index(&tmp.path().join("mega.idx"));
    let bin = std::fs::read(tmp.path().join("mega.bin")).unwrap();
    let ids: Vec<u32> = bin
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    let mut at = 0;
    let got: Vec<Vec<u32>> = (index.lengths.iter())
        .map(|&n| {
            at += n as usize;
            ids[at - n as usize..at].to_vec()
        })
        .collect();
    assert!(
        got == documents,
        "Megatron's sequences are the windows' documents"
    );

    let out = tmp.path().join("hf");
    export("hf-datasets", &out);
    let file = std::fs::File::open(out.join("data-00000-of-00001.arrow")).unwrap();
    let mut rows = 0;
    for batch in arrow_ipc::reader::StreamReader::try_new(file, None).unwrap() {
        let batch = batch.unwrap();
        for r in 0..batch.num_rows() {
            let (tokens, real) = &windows[rows];
            let real = (*real).min(seq_len);
            let want: Vec<i64> = tokens[..seq_len].iter().map(|&t| i64::from(t)).collect();
            assert_eq!(row_of(&batch, "input_ids", r), want, "row {rows}");
            let mask: Vec<i64> = (0..seq_len).map(|i| i64::from(i < real)).collect();
            assert_eq!(row_of(&batch, "attention_mask", r), mask, "row {rows}");
            let labels: Vec<i64> = (0..seq_len)
                .map(|i| if i < real { want[i] } else { -100 })
                .collect();
            assert_eq!(row_of(&batch, "labels", r), labels, "row {rows}");
            rows += 1;
        }
    }
    assert_eq!(rows, windows.len(), "one row per window");
}

#[test]
fn a_packed_directory_that_fails_verify_is_not_exported() {
    let tmp = tempfile::tempdir().unwrap();
    pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let shard = tmp.path().join("packed/tokens-00000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let out = tmp.path().join("hf");
    let err = dsprep_fails(&[
        "export",
        tmp.path().join("packed").to_str().unwrap(),
        "--to",
        "hf-datasets",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        err.contains("fails `dsprep verify`; nothing was exported") && err.contains("sha256 is"),
        "{err}"
    );
    assert!(!out.exists() && !tmp.path().join("hf.partial").exists());
}

/// Off a terminal (a Slurm log), `pack` and `export` log a plain progress line at an interval
/// (`DSPREP_PROGRESS_SECS`; 0 logs every update); `--quiet` logs none.
#[test]
fn progress_is_logged_as_plain_lines_off_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"))
            .args(args)
            .env("DSPREP_PROGRESS_SECS", "0")
            .env("DSPREP_LOG", "info")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let packed = tmp.path().join("packed");
    let log = run(&[
        "pack",
        "--recipe",
        quickstart().to_str().unwrap(),
        "--out",
        packed.to_str().unwrap(),
    ]);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pack progress: "))
        .collect();
    assert!(
        !lines.is_empty()
            && lines
                .iter()
                .all(|l| l.contains(" docs · ") && l.contains(" windows")),
        "{log}"
    );
    let num_windows = PackedDataset::open(&packed).unwrap().num_windows();
    let prefix = tmp.path().join("mega");
    let log = run(&[
        "export",
        packed.to_str().unwrap(),
        "--to",
        "megatron",
        "--out",
        prefix.to_str().unwrap(),
    ]);
    assert!(
        log.contains(&format!("export progress: 0 of {num_windows} windows")),
        "{log}"
    );
    let log = run(&[
        "export",
        packed.to_str().unwrap(),
        "--to",
        "megatron",
        "--out",
        prefix.to_str().unwrap(),
        "--force",
        "--quiet",
    ]);
    assert!(!log.contains("progress"), "{log}");
}
