//! What node daemons cost the shared filesystem's metadata server: opens, creates, renames,
//! unlinks and stats on the state directory, counted by `strace` attached to each real daemon
//! while its ranks pull steps. A cluster filesystem (Lustre, GPFS) serves every such operation
//! from one metadata server for the whole job, so the count per node and step must stay small and
//! must not grow with the number of lanes: the lanes' progress and window digests are written
//! and read in place, in files each daemon opens once.
//!
//! `cargo test -p dsprep --test shared_fs -- --ignored --nocapture` prints the table of
//! BENCHMARKS.md ("Shared state directory") for 1, 2, 4 and 8 nodes × 8, 32 and 128 lanes.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use support::daemon::{Daemon, tap_all};

/// The system calls that reach a cluster filesystem's metadata server.
const METADATA_CALLS: &str = "trace=open,openat,creat,rename,renameat,renameat2,unlink,unlinkat,\
                              stat,lstat,newfstatat,statx,fstat,mkdir,mkdirat,rmdir";

/// 2048 real documents (the FineWeb-Edu sample's texts, repeated) in row groups of 8: 256 units,
/// enough for every lane of 128 to have two.
fn corpus(dir: &Path) -> PathBuf {
    let sample =
        support::repo_root().join("config/samples/fineweb-edu/sample/10BT/000_00000.parquet");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(sample).unwrap(),
    )
    .unwrap()
    .build()
    .unwrap();
    let mut texts = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let column = batch.column_by_name("text").unwrap();
        let strings = column.as_any().downcast_ref::<StringArray>().unwrap();
        texts.extend(strings.iter().map(|s| s.unwrap().to_string()));
    }
    let rows: Vec<&str> = (0..2048).map(|i| texts[i % texts.len()].as_str()).collect();
    let path = dir.join("docs.parquet");
    let batch =
        RecordBatch::try_from_iter([("text", Arc::new(StringArray::from(rows)) as ArrayRef)])
            .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(8))
        .build();
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    path
}

fn recipe(dir: &Path, corpus: &Path, lanes: u32) -> PathBuf {
    let text = format!(
        "version = 1\n[tokenizer]\npath = {:?}\neos = \"<|endoftext|>\"\n[packing]\nseq_len = 64\n\
         [shuffle]\nseed = 7\nbuffer_size = 0\n[mix]\nstopping = \"first_exhausted\"\n\
         [lanes]\ncount = {lanes}\nblock_windows = 1\n[[source]]\nname = \"fw\"\nfiles = [{:?}]\n\
         format = \"parquet\"\n",
        support::gpt2_tokenizer().display().to_string(),
        corpus.display().to_string()
    );
    let path = dir.join(format!("lanes-{lanes}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `strace` attached to every thread of a running daemon, logging the metadata calls.
fn attach(pid: u32, log: &Path) -> Child {
    let child = Command::new("strace")
        .args(["-f", "-qq", "-y", "-e", METADATA_CALLS, "-o"])
        .arg(log)
        .args(["-p", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(
            "strace runs (the metadata-operation count needs it: install the `strace` package)",
        );
    std::thread::sleep(Duration::from_millis(500)); // attached to every thread by then
    child
}

/// Detach `strace` (SIGINT) and count the logged calls that name the state directory.
fn detach_and_count(mut strace: Child, log: &Path, state: &Path) -> usize {
    let pid = strace.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert!(strace.wait().unwrap().success() || log.exists());
    let text = std::fs::read_to_string(log).unwrap();
    let state = state.display().to_string();
    text.lines().filter(|l| l.contains(&state)).count()
}

/// Metadata operations on the state directory per node per step: `nodes` node daemons of a
/// recipe with `lanes` lanes serve `world` ranks `steps` steps (counted from the first step
/// served: start-up opens, done once per process, are not per step).
fn ops_per_node_step(
    dir: &Path,
    corpus: &Path,
    lanes: u32,
    nodes: u32,
    world: u32,
    steps: u64,
) -> Vec<f64> {
    let run = dir.join(format!("run-{lanes}-{nodes}"));
    let state = run.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let recipe = recipe(&run, corpus, lanes);
    let mut daemons: Vec<Daemon> = (0..nodes)
        .map(|node| {
            let endpoint = format!("ipc://{}", run.join(format!("n{node}.sock")).display());
            let args = [
                "--world-size".to_string(),
                world.to_string(),
                "--micro-batch".into(),
                "1".into(),
                "--node-rank".into(),
                node.to_string(),
                "--nodes".into(),
                nodes.to_string(),
                "--state-dir".into(),
                state.display().to_string(),
                "--metrics".into(),
                "off".into(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Daemon::start_with(&recipe, &endpoint, &args).unwrap()
        })
        .collect();
    let logs: Vec<PathBuf> = (0..nodes)
        .map(|n| run.join(format!("strace-{n}.txt")))
        .collect();
    let tracers: Vec<Child> = daemons
        .iter()
        .zip(&logs)
        .map(|(d, log)| attach(d.child.id(), log))
        .collect();
    let refs: Vec<&Daemon> = daemons.iter().collect();
    tap_all(&run, &refs, world, 0, steps, "t", &[]);
    let counts: Vec<f64> = tracers
        .into_iter()
        .zip(&logs)
        .map(|(t, log)| detach_and_count(t, log, &state) as f64 / steps as f64)
        .collect();
    for d in &mut daemons {
        d.terminate();
    }
    counts
}

#[test]
fn metadata_operations_per_node_and_step_stay_small_and_do_not_grow_with_the_lanes() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = corpus(tmp.path());
    let few = ops_per_node_step(tmp.path(), &corpus, 8, 2, 4, 40);
    let many = ops_per_node_step(tmp.path(), &corpus, 32, 2, 4, 40);
    for (lanes, per_node) in [(8, &few), (32, &many)] {
        for (node, &ops) in per_node.iter().enumerate() {
            assert!(
                ops <= 2.0,
                "{lanes} lanes, node {node}: {ops:.2} metadata operations per step (at most 2)"
            );
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    eprintln!("metadata operations per node and step: 8 lanes {few:?}, 32 lanes {many:?}");
    assert!(
        mean(&many) <= mean(&few) + 0.25,
        "4× the lanes cost {:.2} metadata operations per node and step against {:.2}: the \
         count grows with the lanes",
        mean(&many),
        mean(&few)
    );
}

/// The table of BENCHMARKS.md: world 8, micro batch 1, 200 steps.
#[test]
#[ignore = "benchmark: prints the table of BENCHMARKS.md (about a minute)"]
fn bench_metadata_operations_per_node_and_step() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = corpus(tmp.path());
    println!("| lanes | nodes | metadata ops per node per step (each node) | mean |");
    println!("|---|---|---|---|");
    for lanes in [8, 32, 128] {
        for nodes in [1, 2, 4, 8] {
            let per_node = ops_per_node_step(tmp.path(), &corpus, lanes, nodes, 8, 200);
            let shown: Vec<String> = per_node.iter().map(|o| format!("{o:.2}")).collect();
            let mean = per_node.iter().sum::<f64>() / per_node.len() as f64;
            println!("| {lanes} | {nodes} | {} | {mean:.2} |", shown.join(" / "));
        }
    }
}
