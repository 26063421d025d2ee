//! The example trainer end to end (client/examples/train/): a real daemon serves a 64-token
//! variant of the quickstart recipe, `train --launch 2` starts two rank processes that pull their
//! batches through `dsprep_client::Client` and train a tiny candle transformer, and the loss of
//! every rank falls. Deterministic: a fixed seed, and the same data for the same recipe.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::daemon::Daemon;
use support::*;

/// The example binary. `cargo test` builds the examples beside the test binaries
/// (`<target>/<profile>/examples/`); when it is missing or older than the client's sources (a run
/// of this test alone), the cargo running this test builds it.
fn train_example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let binary = profile_dir.join("examples").join("train");
    let client = repo_root().join("client");
    let sources = [
        client.join("Cargo.toml"),
        client.join("examples/train"),
        client.join("src"),
    ];
    let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
    if built.is_some_and(|built| sources.iter().all(|s| newest(s) <= built)) {
        return binary;
    }
    let mut build = Command::new(env!("CARGO"));
    build.args([
        "build",
        "--quiet",
        "-p",
        "dsprep-client",
        "--example",
        "train",
    ]);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let target_dir = profile_dir.parent().unwrap();
    let out = build
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "building the train example failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    binary
}

/// The newest modification time of a file or of the files under a folder.
fn newest(path: &Path) -> std::time::SystemTime {
    let meta = std::fs::metadata(path).unwrap();
    if !meta.is_dir() {
        return meta.modified().unwrap();
    }
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| newest(&e.unwrap().path()))
        .max()
        .unwrap_or(std::time::UNIX_EPOCH)
}

/// The quickstart recipe with 64-token windows, its paths made absolute.
fn small_recipe(dir: &Path) -> PathBuf {
    let config = repo_root().join("config");
    let text = std::fs::read_to_string(quickstart()).unwrap();
    assert!(
        text.contains("seq_len = 512")
            && text.contains("\"samples/")
            && text.contains("\"tokenizers/")
    );
    let text = text
        .replace("seq_len = 512", "seq_len = 64")
        .replace("\"samples/", &format!("\"{}/samples/", config.display()))
        .replace(
            "\"tokenizers/",
            &format!("\"{}/tokenizers/", config.display()),
        );
    write_recipe(dir, &text)
}

/// Every `loss=` of rank `rank`'s step lines, in step order.
fn losses(stdout: &str, rank: u32) -> Vec<f64> {
    let tag = format!("[rank {rank}/2] step=");
    stdout
        .lines()
        .filter(|l| l.starts_with(&tag))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("loss="))
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn two_launched_ranks_train_on_served_batches_and_their_loss_falls() {
    let exe = train_example();
    let tmp = tempfile::tempdir().unwrap();
    let recipe = small_recipe(tmp.path());
    let daemon = Daemon::start(tmp.path(), &recipe, 2, 2, 8);
    let steps = 30;
    let out = Command::new(&exe)
        .args([
            "--launch",
            "2",
            "--endpoint",
            &daemon.endpoint,
            "--steps",
            &steps.to_string(),
        ])
        .args([
            "--d-model",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
            "--lr",
            "0.01",
            "--seed",
            "7",
            "--timeout-s",
            "20",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for rank in 0..2 {
        let tag = format!("[rank {rank}/2]");
        assert!(
            stdout.contains(&format!(
                "{tag} each rank trains its own replica on its shard"
            )),
            "{stdout}"
        );
        let loss = losses(&stdout, rank);
        assert_eq!(loss.len(), steps, "rank {rank} ran every step:\n{stdout}");
        assert!(
            (9.0..12.0).contains(&loss[0]),
            "an untrained model starts near ln(50257) ≈ 10.8: {}",
            loss[0]
        );
        let (first, last) = (mean(&loss[..5]), mean(&loss[steps - 5..]));
        assert!(
            last < first - 0.5,
            "rank {rank}'s loss falls: first 5 {first:.3}, last 5 {last:.3}\n{stdout}"
        );
        let summary = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{tag} done: {steps} steps")))
            .unwrap();
        assert!(
            summary.contains("% of step time after 5 warm-up steps"),
            "{summary}"
        );
    }
    // The ranks trained on different shards of the same stream: their losses differ.
    assert_ne!(losses(&stdout, 0), losses(&stdout, 1));
    assert_eq!(
        daemon.metric("dsprep_rank_step{rank=\"1\"}"),
        (steps - 1) as f64
    );
}
