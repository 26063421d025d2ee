//! Hostile files, small on disk, through the real `dsprep pack`: gzip bombs (one line, many
//! lines) and parquet files whose pages claim, or inflate to, huge sizes, or whose dictionary
//! would be copied into every row. Each run asserts the exact error (or the finished pack), the
//! exit code, that neither `OUT` nor `OUT.partial` is left, and the child's peak RSS (its
//! `ru_maxrss` from `wait4`) under the bound ARCHITECTURE.md states ("Memory, at most"). The
//! bounds are behaviours, not timings: about twice what a debug build measures here.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, Int32Array, StringArray};
use parquet::basic::{Compression, ZstdLevel};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use support::parquet_pages::{claim_uncompressed, one_page, write_text_parquet};
use support::*;

const MIB: u64 = 1 << 20;

/// One test at a time: a child's peak includes what this process holds when it forks, so no
/// other test's fixture may be in memory then. Every test holds this from its start.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A finished `dsprep` run: exit code, stderr, and its peak resident memory.
struct Run {
    code: i32,
    stderr: String,
    peak_rss_bytes: u64,
}

/// `dsprep ARGS`, waited for with `wait4` to read its own peak RSS (`getrusage` of all children
/// would mix in the other tests' children; polling `/proc/PID/status` could miss a last peak).
#[allow(unsafe_code)] // wait4: the one call that gives one child's peak RSS
fn run_measured(args: &[&str]) -> Run {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"));
    command
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // A pre-exec hook makes std fork instead of posix_spawn's shared address space: the child's
    // peak is then its own, not this test process's whole-life peak (which `exec` would carry
    // into `ru_maxrss`). Nothing runs in the hook.
    // SAFETY: the hook does nothing, so it is async-signal-safe.
    unsafe {
        command.pre_exec(|| Ok(()));
    }
    let mut child = command.spawn().unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        pipe.read_to_string(&mut text).unwrap();
        text
    });
    let pid = child.id() as libc::pid_t;
    let (mut status, mut usage): (libc::c_int, libc::rusage) = (0, unsafe { std::mem::zeroed() });
    // SAFETY: `pid` is our own child, not waited for by anything else; both pointers are valid.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child); // reaped above
    assert!(
        libc::WIFEXITED(status),
        "dsprep was killed: status {status}"
    );
    Run {
        code: libc::WEXITSTATUS(status),
        stderr: reader.join().unwrap(),
        peak_rss_bytes: usage.ru_maxrss as u64 * 1024, // kilobytes on Linux
    }
}

/// Pack `recipe_text` (written into `dir`) to `dir/out`, measured. Asserts that a failed pack
/// leaves neither `out` nor `out.partial`.
fn pack(dir: &Path, recipe_text: &str) -> Run {
    let recipe = write_recipe(dir, recipe_text);
    let out = dir.join("out");
    let run = run_measured(&pack_args(&recipe, &out, &["--threads", "2"]));
    if run.code != 0 {
        assert!(!out.exists(), "a failed pack left {}", out.display());
        assert!(
            !dir.join("out.partial").exists(),
            "a failed pack left out.partial: {}",
            run.stderr
        );
    }
    run
}

fn source(name: &str, files: &str, format: &str, extra: &str) -> String {
    format!("[[source]]\nname = {name:?}\nfiles = [{files:?}]\nformat = {format:?}\n{extra}\n")
}

fn assert_peak_under(run: &Run, bound_mib: u64, what: &str) {
    assert!(
        run.peak_rss_bytes < bound_mib * MIB,
        "{what}: peak RSS {} MiB, over the bound of {bound_mib} MiB",
        run.peak_rss_bytes / MIB
    );
}

/// The error's last line: what became of the partial output.
fn assert_removed_partial(run: &Run, dir: &Path) {
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        run.stderr.trim_end().lines().last().unwrap_or_default(),
        format!(
            "removed {}: it held no checkpoint to continue from",
            dir.join("out.partial").display()
        ),
        "{}",
        run.stderr
    );
}

/// Peak RSS of packing a few small documents: the tokenizer and the pipeline, no big input.
/// Every bound below is this plus what the input may cost.
fn baseline(dir: &Path) -> u64 {
    let small = dir.join("baseline");
    std::fs::create_dir_all(&small).unwrap();
    write_c4_gz(
        &small.join("c4.json.gz"),
        &["a small document", "another one"],
    );
    let run = pack(
        &small,
        &recipe(
            16,
            0,
            "first_exhausted",
            &source("c4", "c4.json.gz", "jsonl.gz", ""),
        ),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.peak_rss_bytes
}

/// A gzip bomb of one line: a 1 GiB document in a 1 MB `.jsonl.gz` (the case of issue 13 that
/// aborted at 3.2 GB RSS). The line is longer than any document within 64 MiB can need, so it is
/// read to its end and never held: refused with its line and size, or skipped.
#[test]
fn a_gzip_bomb_of_one_line_is_refused_or_skipped_in_bounded_memory() {
    let _serial = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let base = baseline(tmp.path());
    write_gz_streamed(
        &tmp.path().join("bomb.json.gz"),
        [
            Chunk(b"{\"text\": \"", 1),
            Chunk(&[b'a'; 1 << 20], 1024),
            Chunk(b"\"}\n{\"text\": \"after the bomb\"}\n", 1),
        ],
    );
    assert!(
        std::fs::metadata(tmp.path().join("bomb.json.gz"))
            .unwrap()
            .len()
            < 2 * MIB
    );
    let line = (1u64 << 30) + 13;
    let run = pack(
        tmp.path(),
        &recipe(
            16,
            0,
            "first_exhausted",
            &source("c4", "bomb.json.gz", "jsonl.gz", ""),
        ),
    );
    assert!(
        run.stderr.contains(&format!(
            "shard {} line 1: a line of {line} bytes is longer than any document within source \
             \"c4\"'s max_document_bytes = 67108864 can need (2 × max_document_bytes + 1 MiB): \
             raise max_document_bytes (at most 1 GiB), set oversize = \"skip\" to leave such \
             documents out, counted, or oversize = \"split\" to cut them into pieces",
            tmp.path().join("bomb.json.gz").display()
        )),
        "{}",
        run.stderr
    );
    assert_removed_partial(&run, tmp.path());
    // The line buffer grows to 2 × 64 MiB + 1 MiB before the line is known to be too long.
    assert_peak_under(&run, base / MIB + 129 + 64, "a refused 1 GiB line");

    let run = pack(
        tmp.path(),
        &recipe(
            16,
            0,
            "first_exhausted",
            &source("c4", "bomb.json.gz", "jsonl.gz", "oversize = \"skip\""),
        ),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_peak_under(&run, base / MIB + 129 + 64, "a skipped 1 GiB line");
}

/// A gzip bomb of many lines: 512 MiB of 2 MiB lines from a file of about 0.5 MB. Each line is
/// streamed through (2 MiB is past what a 1000-byte document can need) and skipped: memory does
/// not grow with the lines.
#[test]
fn a_gzip_bomb_of_many_lines_streams_through_in_bounded_memory() {
    let _serial = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let base = baseline(tmp.path());
    let line = {
        let mut line = b"{\"text\": \"".to_vec();
        line.resize(2 << 20, b'b');
        line.extend(b"\"}\n");
        line
    };
    write_gz_streamed(
        &tmp.path().join("lines.json.gz"),
        [
            Chunk(&line, 256),
            Chunk(b"{\"text\": \"the one document\"}\n", 1),
        ],
    );
    let skipping = source(
        "c4",
        "lines.json.gz",
        "jsonl.gz",
        "max_document_bytes = 1000\noversize = \"skip\"",
    );
    let run = pack(tmp.path(), &recipe(16, 0, "first_exhausted", &skipping));
    assert_eq!(run.code, 0, "{}", run.stderr);
    let m = dsprep_client::PackedDataset::open(tmp.path().join("out"))
        .unwrap()
        .manifest()
        .clone();
    assert_eq!(
        (m.sources[0].rows_read, m.sources[0].rows_oversize),
        (257, 256)
    );
    assert_peak_under(&run, base / MIB + 64, "512 MiB of skipped lines");
}

/// Bytes written `.1` times.
struct Chunk<'a>(&'a [u8], usize);

/// A gzip file of `chunks`, written as it is compressed (never whole in memory).
fn write_gz_streamed<const N: usize>(path: &Path, chunks: [Chunk<'_>; N]) {
    use std::io::Write;
    let file = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    for Chunk(bytes, times) in chunks {
        for _ in 0..times {
            gz.write_all(bytes).unwrap();
        }
    }
    gz.finish().unwrap();
}

fn strings(texts: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(texts.to_vec()))
}

fn parquet_recipe(extra: &str) -> String {
    recipe(
        16,
        0,
        "first_exhausted",
        &source("fw", "fw/*.parquet", "parquet", extra),
    )
}

/// A page header that claims 2 GiB uncompressed for a few KB: parquet's snappy path zero-fills
/// the claimed size before it decodes (2 GiB of RSS). Refused before any page is read, naming
/// the file, row group, column, page and sizes, for every codec.
#[test]
fn a_parquet_page_claiming_2_gib_is_refused_before_it_is_read() {
    let _serial = one_at_a_time();
    for (codec, compression) in [
        ("snappy", Compression::SNAPPY),
        ("zstd", Compression::ZSTD(ZstdLevel::default())),
        ("none", Compression::UNCOMPRESSED),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let base = baseline(tmp.path());
        let path = tmp.path().join("fw/000_00000.parquet");
        write_text_parquet(
            &path,
            strings(&["a document", "another"]),
            one_page(compression, false),
        );
        claim_uncompressed(&path, i32::MAX);
        let run = pack(tmp.path(), &parquet_recipe(""));
        let bytes = std::fs::metadata(&path).unwrap().len();
        assert!(bytes < 1024, "{bytes}");
        let want = format!(
            "shard {}: row group 0 column \"text\": page 0 at byte 4 claims 2147483647 bytes \
             uncompressed from ",
            path.display()
        );
        assert!(run.stderr.contains(&want), "{codec}: {}", run.stderr);
        assert!(
            run.stderr.contains(
                " compressed (over 100 times, and over 64 MiB): a decompression bomb or a \
                 corrupt file"
            ),
            "{codec}: {}",
            run.stderr
        );
        assert_removed_partial(&run, tmp.path());
        assert_peak_under(&run, base / MIB + 32, codec);
    }
}

/// A real bomb: a 100 MiB document of one repeated byte, a few KB once compressed with zstd.
/// Its page honestly claims 100 MiB; past 64 MiB and 100 times its compressed size, it is refused.
#[test]
fn a_parquet_page_inflating_100_mib_from_a_few_kb_is_refused() {
    let _serial = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let base = baseline(tmp.path());
    let path = tmp.path().join("fw/000_00000.parquet");
    let huge = "z".repeat(100 << 20);
    let zstd = Compression::ZSTD(ZstdLevel::default());
    write_text_parquet(&path, strings(&["first", &huge]), one_page(zstd, false));
    drop(huge);
    assert!(std::fs::metadata(&path).unwrap().len() < 64 * 1024);
    let run = pack(tmp.path(), &parquet_recipe("oversize = \"skip\""));
    assert!(
        run.stderr.contains(&format!(
            "shard {}: row group 0 column \"text\": page 0 at byte 4 claims 104857613 bytes \
             uncompressed from",
            path.display()
        )),
        "{}",
        run.stderr
    );
    assert_removed_partial(&run, tmp.path());
    assert_peak_under(&run, base / MIB + 32, "a 100 MiB zstd bomb");
}

/// Pages that inflate to more than they claim (1 MiB of text claiming 64 KiB): the decoders
/// write into the claimed buffer and stop at its end, so memory stays bounded by the claim;
/// the run stops naming the file and the row.
#[test]
fn a_parquet_page_inflating_past_its_claim_fails_in_bounded_memory() {
    let _serial = one_at_a_time();
    for (codec, compression, why) in [
        (
            "snappy",
            Compression::SNAPPY,
            "snappy: output buffer (size = 65536) is smaller than required (size = 1048589)",
        ),
        (
            "zstd",
            Compression::ZSTD(ZstdLevel::default()),
            "Destination buffer is too small",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let base = baseline(tmp.path());
        let path = tmp.path().join("fw/000_00000.parquet");
        let big = "y".repeat(1 << 20);
        write_text_parquet(
            &path,
            strings(&["first", &big]),
            one_page(compression, false),
        );
        claim_uncompressed(&path, 64 << 10);
        let run = pack(tmp.path(), &parquet_recipe(""));
        assert!(
            run.stderr
                .contains(&format!("shard {} row 0: cannot decode: ", path.display()))
                && run.stderr.contains(why),
            "{codec}: {}",
            run.stderr
        );
        assert_removed_partial(&run, tmp.path());
        assert_peak_under(&run, base / MIB + 32, codec);
    }
}

/// A dictionary bomb: one 4 MiB dictionary value (a few KB with zstd) that 1,024 rows refer
/// to. Read as plain strings, every batch of 256 rows would copy it 256 times (1 GiB); read as
/// views, a row is the dictionary's bytes, and each one is measured and skipped without a copy.
#[test]
fn a_dictionary_value_every_row_refers_to_is_never_copied_into_each_row() {
    let _serial = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let base = baseline(tmp.path());
    let path = tmp.path().join("fw/000_00000.parquet");
    let value = "d".repeat(4 << 20);
    let mut keys = vec![0i32; 1024];
    keys.push(1);
    // Written from a dictionary array: the file holds a dictionary page with the two values
    // and a data page of 1,025 indices; with no arrow type in the footer, it reads as strings.
    let dictionary = DictionaryArray::<Int32Type>::try_new(
        Int32Array::from(keys),
        strings(&[&value, "the one document that fits"]),
    )
    .unwrap();
    drop(value);
    let zstd = Compression::ZSTD(ZstdLevel::default());
    write_text_parquet(&path, Arc::new(dictionary), one_page(zstd, true));
    assert!(std::fs::metadata(&path).unwrap().len() < 64 * 1024);
    let run = pack(
        tmp.path(),
        &parquet_recipe("max_document_bytes = 1048576\noversize = \"skip\""),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let m = dsprep_client::PackedDataset::open(tmp.path().join("out"))
        .unwrap()
        .manifest()
        .clone();
    assert_eq!(
        (
            m.sources[0].rows_read,
            m.sources[0].rows_oversize,
            m.sources[0].documents
        ),
        (1025, 1024, 1)
    );
    assert_peak_under(
        &run,
        base / MIB + 64,
        "a 4 MiB dictionary value on 1,024 rows",
    );
}
