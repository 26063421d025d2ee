//! `oversize = "split"` end to end, with the real binary: a row over `max_document_bytes` is cut
//! at the stated boundary into pieces that are packed in order and counted; the bytes do not
//! depend on the thread count; a pack killed, or a daemon killed, in the middle of a split row
//! resumes exactly; and in a mix in tokens, split pieces hold every span of the stream near its
//! share, where whole long documents cannot.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use arrow_array::{ArrayRef, StringArray};
use dsprep_client::PackedDataset;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use support::daemon::{Daemon, tap};
use support::*;

/// The piece size of the code source below.
const LIMIT: usize = 4096;
const EOS: u32 = 50256;

/// A small deterministic generator (xorshift64*), so the corpus is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: [&str; 12] = [
    "fn", "let", "self", "return", "match", "value", "index", "parse", "error", "Ok", "=>", "{}",
];

/// About `bytes` bytes of code-like text: lines of 2 to 9 words.
fn code_text(rng: &mut Rng, bytes: usize) -> String {
    let mut text = String::new();
    while text.len() < bytes {
        let words = 2 + rng.below(8);
        let line: Vec<&str> = (0..words)
            .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
            .collect();
        text.push_str(&"    ".repeat(rng.below(3) as usize));
        text.push_str(&line.join(" "));
        text.push('\n');
    }
    text.pop(); // no trailing newline: the last piece ends mid-line
    text
}

/// The code rows: most over [`LIMIT`] (up to 16 pieces), a few that fit whole.
fn code_rows(rng: &mut Rng, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let bytes = match rng.below(4) {
                0 => 200 + rng.below(3000),
                _ => 5_000 + rng.below(25_000),
            };
            code_text(rng, bytes as usize)
        })
        .collect()
}

/// `dir/code/*.parquet` (two files of `code` rows, column `content`) and `dir/web.jsonl.gz`
/// (`web` short documents). Returns the code rows, file by file.
fn write_corpus(dir: &Path, code: usize, web: usize) -> Vec<Vec<String>> {
    let mut rng = Rng(0x5eed);
    let files: Vec<Vec<String>> = (0..2).map(|_| code_rows(&mut rng, code / 2)).collect();
    for (k, rows) in files.iter().enumerate() {
        let column: ArrayRef = Arc::new(StringArray::from(rows.clone()));
        write_parquet(
            &dir.join(format!("code/part-{k}.parquet")),
            vec![("content", column)],
            64,
        );
    }
    let texts: Vec<String> = (0..web)
        .map(|i| {
            let words = 8 + rng.below(60) as usize;
            let w: Vec<&str> = (0..words)
                .map(|_| ["the", "a", "page", "of", "web", "text", "and", "more"][i % 8])
                .collect();
            format!("{i}: {}", w.join(" "))
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    write_c4_gz(&dir.join("web.json.gz"), &refs);
    files
}

/// The recipe over [`write_corpus`]'s files: `code` (source 0) with `code_extra`, `web`.
fn write_split_recipe(dir: &Path, unit: &str, buffer: usize, code_extra: &str) -> PathBuf {
    let sources = format!(
        "[[source]]\nname = \"code\"\nweight = 0.5\nfiles = [\"code/*.parquet\"]\n\
         format = \"parquet\"\ntext = \"content\"\n{code_extra}\n\
         [[source]]\nname = \"web\"\nweight = 0.5\nfiles = [\"web.json.gz\"]\nformat = \"jsonl.gz\"\n"
    );
    let text = recipe(256, buffer, "first_exhausted", &sources)
        .replace("[mix]\n", &format!("[mix]\nunit = {unit:?}\n"));
    let path = dir.join(format!("split-{unit}-{buffer}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn splitting() -> String {
    format!("max_document_bytes = {LIMIT}\noversize = \"split\"")
}

fn pack(recipe: &Path, out: &Path, threads: &str) -> String {
    dsprep_ok(&[
        "pack",
        "--recipe",
        recipe.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--threads",
        threads,
        "--force",
    ])
}

/// Every whole document of the stream, in order: (its source, its token ids without the EOS).
/// The last one is left out when the dropped tail cut it.
fn documents(packed: &PackedDataset) -> Vec<(u16, Vec<u32>)> {
    let mut docs: Vec<(u16, Vec<u32>)> = Vec::new();
    for w in 0..packed.num_windows() {
        let window = packed.window(w).unwrap();
        let tokens = window.tokens.to_vec();
        let (starts, sources) = (window.doc_starts, window.doc_sources.unwrap());
        // Up to the first start, the window continues the document before it.
        let first = starts.first().map_or(tokens.len(), |&s| s as usize);
        if let Some(last) = docs.last_mut() {
            last.1.extend_from_slice(&tokens[..first]);
        }
        for (k, &start) in starts.iter().enumerate() {
            let end = starts.get(k + 1).map_or(tokens.len(), |&s| s as usize);
            docs.push((sources[k], tokens[start as usize..end].to_vec()));
        }
    }
    if docs.last().is_some_and(|(_, t)| t.last() != Some(&EOS)) {
        docs.pop();
    }
    for (_, tokens) in &mut docs {
        assert_eq!(tokens.pop(), Some(EOS), "every document ends with its EOS");
    }
    docs
}

#[test]
fn split_rows_are_cut_at_the_boundary_packed_in_order_and_counted_whatever_the_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let files = write_corpus(tmp.path(), 80, 12000);
    let recipe = write_split_recipe(tmp.path(), "tokens", 32, &splitting());
    let summary = pack(&recipe, &tmp.path().join("one"), "1");
    pack(&recipe, &tmp.path().join("two"), "2");
    assert!(
        dir_bytes(&tmp.path().join("one")) == dir_bytes(&tmp.path().join("two")),
        "1 and 2 threads give the same bytes"
    );

    let rows: Vec<&String> = files.iter().flatten().collect();
    let split: Vec<&&String> = rows.iter().filter(|r| r.len() > LIMIT).collect();
    let pieces_of = |row: &str| -> Vec<String> {
        dsprep_mixers::split::pieces(row, LIMIT)
            .map(str::to_string)
            .collect()
    };
    let num_pieces: usize = split.iter().map(|r| pieces_of(r).len()).sum();
    assert!(split.len() > 40 && num_pieces > 3 * split.len());

    let packed = PackedDataset::open(tmp.path().join("one")).unwrap();
    let m = packed.manifest();
    let code = &m.sources[0];
    assert_eq!(code.rows_read, rows.len() as u64);
    assert_eq!(
        (code.rows_split, code.split_pieces),
        (split.len() as u64, num_pieces as u64),
        "every code row is read: code runs out first"
    );
    assert_eq!(
        code.documents,
        (rows.len() - split.len() + num_pieces) as u64
    );
    assert!(
        summary.contains(&format!(
            "source \"code\": {} rows over max_document_bytes split into {num_pieces} pieces \
             (oversize = \"split\"; each piece one document)",
            split.len()
        )),
        "{summary}"
    );

    // The code documents of the stream, decoded: each whole row once, or each split row's
    // pieces one after the other, in order, each ending after a newline of its final quarter
    // (code lines are short: rule 1 always finds one).
    let tokenizer = tokenizers::Tokenizer::from_file(gpt2_tokenizer()).unwrap();
    let texts: Vec<String> = documents(&packed)
        .into_iter()
        .filter(|(source, _)| *source == 0)
        .map(|(_, ids)| tokenizer.decode(&ids, false).unwrap())
        .collect();
    let by_first: HashMap<String, &String> = rows
        .iter()
        .map(|r| (pieces_of(r).swap_remove(0), *r))
        .collect();
    let mut seen = 0;
    let mut at = 0;
    while at < texts.len() {
        let row = by_first
            .get(&texts[at])
            .unwrap_or_else(|| panic!("document {at} is no row's first piece"));
        let want = pieces_of(row);
        // The stream's last document (code's last) is in the dropped tail, not in `texts`.
        let end = (at + want.len()).min(texts.len());
        assert_eq!(
            &texts[at..end],
            &want[..end - at],
            "a row's pieces, in order"
        );
        for piece in &want[..want.len() - 1] {
            assert!(piece.len() <= LIMIT && piece.len() >= LIMIT - LIMIT / 4);
            assert!(piece.ends_with('\n'), "{:?}", &piece[piece.len() - 20..]);
        }
        assert_eq!(want.concat(), **row);
        at += want.len();
        seen += 1;
    }
    // Every row once; a whole last row may be all in the dropped tail.
    let tail_row = usize::from(m.dropped_tail_tokens > 0);
    assert!(
        seen == rows.len() || seen + tail_row == rows.len(),
        "{seen} of {} rows",
        rows.len()
    );
}

/// The pack killed once its checkpoint stands in the middle of a split row (a source's cursor
/// at a piece), in both mix units: the next run continues there and writes the same bytes.
#[test]
fn a_pack_killed_in_the_middle_of_a_split_row_continues_with_the_same_bytes() {
    for unit in ["documents", "tokens"] {
        let tmp = tempfile::tempdir().unwrap();
        // Large enough for a few dozen pipeline chunks, each a checkpoint.
        write_corpus(tmp.path(), 300, 15000);
        let recipe = write_split_recipe(tmp.path(), unit, 64, &splitting());
        let whole = tmp.path().join("whole");
        pack(&recipe, &whole, "2");
        let out = tmp.path().join("out");
        let mid_split = kill_pack_mid_split(&recipe, &out);
        let stderr = dsprep_stderr_ok(&pack_args(&recipe, &out, &[]));
        assert!(
            stderr.contains(&format!(
                "continuing the interrupted pack in {}.partial at window {}",
                out.display(),
                mid_split
            )),
            "{unit}: {stderr}"
        );
        assert!(
            dir_bytes(&out) == dir_bytes(&whole),
            "{unit}: the continued pack differs from the uninterrupted one"
        );
    }
}

/// `dsprep …`, which must succeed; returns its stderr.
fn dsprep_stderr_ok(args: &[&str]) -> String {
    let out = dsprep(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// Run a pack that checkpoints after every chunk and SIGKILL it once its checkpoint stands in
/// the middle of a split row; returns the checkpoint's window count.
fn kill_pack_mid_split(recipe: &Path, out: &Path) -> u64 {
    let checkpoint = PathBuf::from(format!("{}.partial/checkpoint.ckpt", out.display()));
    for _attempt in 0..5 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"))
            .args(["pack", "--recipe", recipe.to_str().unwrap()])
            .args(["--out", out.to_str().unwrap(), "--quiet", "--fresh"])
            .args(["--checkpoint-secs", "0", "--threads", "1"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut at = None;
        while child.try_wait().unwrap().is_none() {
            if let Some(windows) = mid_split_windows(&checkpoint) {
                at = Some(windows);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // The file may have moved on between the look and the kill: look again.
        if at.is_some()
            && !out.exists()
            && let Some(windows) = mid_split_windows(&checkpoint)
        {
            return windows;
        }
        let _ = std::fs::remove_dir_all(out);
    }
    panic!("no checkpoint in the middle of a split row in 5 attempts");
}

/// The window count of the pack checkpoint at `path` if it stands in the middle of a split row.
fn mid_split_windows(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let (meta, state) = dsprep_mixers::checkpoint::decode::<serde_json::Value>(&bytes).ok()?;
    let windows = meta["writer"]["num_windows"].as_u64()?;
    let mid = state.stream.sources.iter().any(|c| c.piece > 0);
    (mid && windows > 0).then_some(windows)
}

/// A daemon killed (SIGKILL) after checkpoints taken in the middle of split rows, resumed with
/// `--resume latest`: the ranks get exactly the packed stream, and `/metrics` counts the split
/// rows and their pieces.
#[test]
fn a_daemon_killed_in_the_middle_of_a_split_row_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    write_corpus(tmp.path(), 120, 6000);
    let recipe = write_split_recipe(tmp.path(), "tokens", 64, &splitting());
    let packed = pack_dataset(&recipe, &tmp.path().join("packed"));
    let (world, gb) = (2u32, 2u64);
    let num_steps = packed.num_windows() / gb;
    let state = tmp.path().join("state");
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let start = |resume: bool| {
        let mut args = vec!["--world-size", "2", "--micro-batch", "1", "--prefetch", "4"];
        args.extend(["--metrics", "127.0.0.1:0"]);
        args.extend(["--state-dir", state.to_str().unwrap()]);
        args.extend(["--checkpoint-every", "3", "--keep-checkpoints", "50"]);
        if resume {
            args.extend(["--resume", "latest"]);
        }
        Daemon::start_with(&recipe, &endpoint, &args).unwrap()
    };
    let pull = |daemon: &Daemon, from: u64, steps: u64| -> Vec<Vec<u8>> {
        let outs: Vec<PathBuf> = (0..world)
            .map(|r| tmp.path().join(format!("rank{r}-{from}.bin")))
            .collect();
        let taps: Vec<_> = (0..world)
            .map(|r| tap(&daemon.endpoint, r, world, from, steps, &outs[r as usize]))
            .collect();
        for child in taps {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", daemon.log_text());
        }
        outs.iter().map(|o| std::fs::read(o).unwrap()).collect()
    };
    let cut = num_steps / 2;
    let daemon = start(false);
    let mut got = pull(&daemon, 0, cut);
    let rows_split = daemon.metric("dsprep_rows_split_total{source=\"code\"}");
    let pieces = daemon.metric("dsprep_split_pieces_total{source=\"code\"}");
    assert!(
        rows_split >= 5.0 && pieces > 3.0 * rows_split,
        "{rows_split} {pieces}"
    );
    assert_eq!(
        daemon.metric("dsprep_rows_split_total{source=\"web\"}"),
        0.0
    );
    drop(daemon); // SIGKILL

    // Some checkpoint at or below the cut stands in the middle of a split row; the newest
    // such one is kept, and the rest removed, so that resume starts from it.
    let dir = dsprep::checkpoint::CheckpointDir::open(&state, 50).unwrap();
    let listed = dir.list().unwrap();
    let (step, _) = listed
        .iter()
        .rev()
        .find(|(_, path)| {
            let (_, s) = dsprep::checkpoint::CheckpointDir::read(path).unwrap();
            s.stream.sources.iter().any(|c| c.piece > 0)
        })
        .cloned()
        .expect("a checkpoint in the middle of a split row");
    for (later, path) in &listed {
        if *later > step {
            std::fs::remove_file(path).unwrap();
        }
    }
    let daemon = start(true);
    let rest = pull(&daemon, step, num_steps - step);
    let log = daemon.log_text();
    assert!(
        log.contains("resuming from checkpoint") && log.contains(&format!("(step {step}, ")),
        "{log}"
    );
    let slice = packed.window(0).unwrap().tokens.as_bytes().len() as u64;
    for (r, bytes) in got.iter_mut().enumerate() {
        bytes.truncate((step * slice) as usize);
        bytes.extend_from_slice(&rest[r]);
    }
    for (r, bytes) in got.iter().enumerate() {
        let want: Vec<u8> = (0..num_steps)
            .flat_map(|s| {
                let w = packed.window(s * gb + r as u64).unwrap();
                w.tokens.as_bytes().to_vec()
            })
            .collect();
        assert!(*bytes == want, "rank {r} differs from the packed stream");
    }
}

/// Issue 14's span bound, scaled down: a source whose documents run to ~6 k tokens, mixed 50/50
/// in tokens with short documents, read back with `dsprep inspect --mix --every`. Whole, its
/// documents take much of a 20 k-token span to themselves; split into 512-byte pieces (about
/// 100 tokens), every 20 k-token span is within 2 points (the mix holds each source within one
/// document of its share at every point, so a span is off by at most two pieces' worth).
#[test]
fn split_pieces_keep_every_span_of_a_mix_in_tokens_within_two_points() {
    let tmp = tempfile::tempdir().unwrap();
    write_corpus(tmp.path(), 120, 12000);
    let worst = |extra: &str, name: &str| -> f64 {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let recipe = write_split_recipe(tmp.path(), "tokens", 0, extra);
        let out = dir.join("packed");
        pack(&recipe, &out, "2");
        let csv = dir.join("mix.csv");
        dsprep_ok(&[
            "inspect",
            out.to_str().unwrap(),
            "--mix",
            "--every",
            "20000",
            "--csv",
            csv.to_str().unwrap(),
        ]);
        let text = std::fs::read_to_string(&csv).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("tokens,span:code,span:web,total:code,total:web")
        );
        let spans: Vec<f64> = lines
            .map(|l| l.split(',').nth(1).unwrap().parse::<f64>().unwrap())
            .collect();
        assert!(spans.len() >= 20, "{} spans", spans.len());
        // The last span may be short (the stream's end): every full one counts.
        spans[..spans.len() - 1]
            .iter()
            .map(|s| (s - 0.5).abs())
            .fold(0.0, f64::max)
    };
    let whole = worst("", "whole");
    let split = worst("max_document_bytes = 512\noversize = \"split\"", "split");
    assert!(whole > 0.1, "whole documents: a span {whole:.3} off");
    assert!(split <= 0.02, "split: a span {split:.3} off");
}
