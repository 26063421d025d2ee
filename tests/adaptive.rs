//! Mixing by what the model is learning (`[mix.adaptive]`), end to end: real daemons, real
//! `dsprep tap` ranks that report a synthetic loss per source after each step (protocol v7),
//! SIGKILLs at pseudo-random steps and resumes (at another world size too), and `dsprep pack
//! --lineage` of the state directory: what the ranks received equals the packed lineage of the
//! logged decisions, window for window.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::protocol::report::SourceLoss;
use dsprep_client::{Client, ClientConfig};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::adaptive::*;
use support::daemon::Daemon;
use support::lineage::*;
use support::serve_run::Run;
use support::*;

/// The quickstart mixed in tokens with `[mix.adaptive]` and `extra` lines in that table.
fn adaptive_recipe(dir: &Path, name: &str, algorithm: &str, extra: &str) -> PathBuf {
    let path = quickstart_in_tokens(dir);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&adaptive_table(algorithm, extra));
    let out = dir.join(name);
    std::fs::write(&out, text).unwrap();
    out
}

/// Ranks report, the daemon is SIGKILLed at two pseudo-random steps and resumed (the second time
/// at world size 4 with the same global batch): the stream they got is `pack --lineage`'s.
fn killed_and_resumed_equals_pack_lineage(recipe_extra: &str, algorithm: &str, best_fit: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let mut recipe = adaptive_recipe(tmp.path(), "adaptive.toml", algorithm, recipe_extra);
    if best_fit {
        let packing = ("[packing]\n", "[packing]\nstrategy = \"best_fit\"\n");
        recipe = recipe_variant(&recipe, tmp.path(), "best-fit.toml", &[packing]);
    }
    let run = Run {
        dir: tmp.path(),
        recipe: &recipe,
        state: tmp.path().join("state"),
        every: 4,
    };
    let seed = seed();
    let first = 10 + seed % 8;
    let second = first + 8 + (seed / 8) % 8;
    let end = 48;
    let why = format!("DSPREP_TEST_SEED={seed}: kills at steps {first} and {second}");
    let report = ["--report-loss", LOSS];
    let mut got = Vec::new();
    let daemon = run.start(8, 1, false).unwrap();
    got.extend(run.pull_with(&daemon, 8, 0, first, &report));
    drop(daemon); // SIGKILL
    let daemon = run.start(8, 1, true).unwrap();
    got.extend(run.pull_with(&daemon, 8, first, second - first, &report));
    drop(daemon);
    let daemon = run.start(4, 2, true).unwrap();
    got.extend(run.pull_with(&daemon, 4, second, end - second, &report));
    let log = daemon.log_text();
    drop(daemon);

    let decided = decisions(&run.state);
    assert!(decided.len() >= 8, "{why}: {decided:?}\n{log}");
    let steps: Vec<u64> = decided.iter().map(|d| d.0).collect();
    let expected: Vec<u64> = (0..steps.len() as u64).map(|k| 9 + 3 * k).collect();
    assert_eq!(
        steps, expected,
        "{why}: a decision every 3 steps from step 9 (lag 6)"
    );
    assert!(
        decided.iter().any(|d| !d.1),
        "{why}: some decisions come from reports: {decided:?}"
    );
    // The decisions as `inspect` shows them: one row each, and per source a line of its shares
    // and one of its reported loss.
    let svg = tmp.path().join("decisions.svg");
    let state = run.state.to_str().unwrap();
    let table = dsprep_ok(&[
        "inspect",
        state,
        "--decisions",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(table.lines().count(), 1 + decided.len() + 1, "{table}");
    assert!(
        table.lines().nth(1).unwrap().trim_start().starts_with("9 "),
        "{table}"
    );
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(
        drawn.matches("<polyline").count(),
        2 * 5,
        "two lines per source"
    );
    let data = pack_lineage(&run.state, &tmp.path().join("packed"));
    assert_eq!(got.len(), (end * 8) as usize * 513 * 2, "{why}");
    assert!(
        got == windows(&data, 0..end * 8),
        "{why}: the served stream differs from the packed lineage of its decisions"
    );
}

#[test]
fn exp3_decisions_survive_kills_and_a_smaller_world_and_pack_lineage_replays_them() {
    killed_and_resumed_equals_pack_lineage("", "exp3", false);
}

#[test]
fn softmax_decisions_with_best_fit_replay_exactly() {
    killed_and_resumed_equals_pack_lineage("temperature = 0.5\n", "softmax", true);
}

/// Reports a daemon must not take: each refused and counted by its reason, never summed.
#[test]
fn bad_reports_are_refused_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = adaptive_recipe(tmp.path(), "adaptive.toml", "exp3", "");
    let state = tmp.path().join("state");
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let daemon = Daemon::start_with(
        &recipe,
        &endpoint,
        &[
            "--world-size",
            "2",
            "--micro-batch",
            "1",
            "--prefetch",
            "4",
            "--metrics",
            "127.0.0.1:0",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )
    .unwrap();
    let client = |rank: u32, session: u64| {
        Client::with_config(ClientConfig {
            session: Some(session),
            ..ClientConfig::from_env(&endpoint)
                .map(|c| ClientConfig {
                    rank,
                    world_size: 2,
                    ..c
                })
                .unwrap()
        })
        .unwrap()
    };
    let mut rank0 = client(0, 11);
    let batch = rank0.batch_at(0).unwrap().unwrap();
    let loss = vec![2.5f32; 512];
    let good = batch.per_source_loss(&loss).unwrap();
    let tokens: u64 = good.iter().map(|e| e.tokens).sum();
    assert_eq!(tokens, 512, "every label of a concat row counts");
    let entry = |source: u16, loss_sum: f64| SourceLoss {
        source,
        loss_sum,
        tokens: 1,
    };
    assert!(rank0.report(0, &good).unwrap());
    assert!(rank0.report(0, &good).unwrap()); // again: duplicate
    assert!(rank0.report(0, &[entry(5, 1.0)]).unwrap()); // the quickstart has sources 0..5
    assert!(rank0.report(0, &[entry(0, f64::NAN)]).unwrap());
    assert!(rank0.report(0, &[entry(0, -1.0)]).unwrap());
    assert!(rank0.report(3, &good).unwrap()); // never fetched
    // Rank 1's step 0 from a session that does not own rank 1.
    let mut stranger = client(1, 12);
    assert!(stranger.report(0, &good).unwrap());

    let series = |reason: &str| format!("dsprep_loss_reports_refused_total{{reason=\"{reason}\"}}");
    let expected = [
        ("duplicate", 1.0),
        ("unknown_source", 1.0),
        ("bad_value", 2.0),
        ("not_fetched", 2.0),
        ("decided", 0.0),
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.metric(&series("not_fetched")) < 2.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (reason, n) in expected {
        assert_eq!(daemon.metric(&series(reason)), n, "{reason}");
    }
    assert_eq!(daemon.metric("dsprep_loss_reports_total"), 1.0);
    let tokens_of =
        |source: &str| daemon.metric(&format!("dsprep_source_loss_tokens{{source=\"{source}\"}}"));
    let names = ["fineweb-edu", "c4", "zyda-2", "the-stack-v2", "finemath"];
    let counted: f64 = names.iter().map(|n| tokens_of(n)).sum();
    assert_eq!(counted, 512.0, "only the good report is summed");
}

/// Without `[mix.adaptive]`, reports are still counted: in `/metrics` per source, and per segment
/// of the lineage and phase of its recipe (a `[[mix.phase]]` from step 2's first token): a step's
/// reports count in the phase in force at its first token.
#[test]
fn loss_is_counted_per_segment_and_phase() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = quickstart_with_a_phase(tmp.path(), 2 * 513);
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let args = [
        "--world-size",
        "1",
        "--micro-batch",
        "1",
        "--metrics",
        "127.0.0.1:0",
    ];
    let daemon = Daemon::start_with(&recipe, &endpoint, &args).unwrap();
    let mut client = Client::with_config(ClientConfig::from_env(&endpoint).unwrap()).unwrap();
    for step in 0..4 {
        let batch = client.batch_at(step).unwrap().unwrap();
        let losses = batch.per_source_loss(&vec![2.0f32; 512]).unwrap();
        assert!(client.report(step, &losses).unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.metric("dsprep_loss_reports_total") < 4.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let series = |family: &str, phase: u32, source: &str| {
        let name = format!("{family}{{segment=\"0\",phase=\"{phase}\",source=\"{source}\"}}");
        daemon.metric_if_any(&name).0
    };
    let names = ["fineweb-edu", "c4", "zyda-2", "the-stack-v2", "finemath"];
    let tokens_in = |phase: u32| -> f64 {
        (names.iter())
            .filter_map(|n| series("dsprep_source_phase_loss_tokens", phase, n))
            .sum()
    };
    assert_eq!(
        (tokens_in(0), tokens_in(1)),
        (1024.0, 1024.0),
        "two steps in each phase"
    );
    let mean = series("dsprep_source_phase_loss_mean", 1, "fineweb-edu");
    assert_eq!(mean, Some(2.0));
}

/// Settings a daemon cannot honour are refused before anything is served, each by name.
#[test]
fn settings_that_cannot_be_met_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let state = tmp.path().join("state");
    let start = |recipe: &Path, prefetch: &str, state_dir: bool| {
        let mut args = vec![
            "--world-size",
            "2",
            "--micro-batch",
            "1",
            "--prefetch",
            prefetch,
        ];
        if state_dir {
            args.extend(["--state-dir", state.to_str().unwrap()]);
        }
        Daemon::start_with(recipe, &endpoint, &args).err().unwrap()
    };
    let recipe = adaptive_recipe(tmp.path(), "lag.toml", "exp3", "");
    let err = start(&recipe, "6", true);
    assert!(
        err.contains(
            "mix.adaptive.lag = 6 must be above the daemon's prefetch (--prefetch 6): a decision \
             for step d uses the reports up to step d − lag"
        ),
        "{err}"
    );
    let err = start(&recipe, "4", false);
    assert!(
        err.contains(
            "[mix.adaptive] needs --state-dir: its decisions are written to the stream's lineage"
        ),
        "{err}"
    );
    let unknown = adaptive_recipe(tmp.path(), "unknown.toml", "ucb", "");
    let err = start(&unknown, "4", true);
    assert!(
        err.contains("unknown variant `ucb`, expected `exp3` or `softmax`"),
        "{err}"
    );
    // Lanes: 16 of them deal the quickstart's units so that c4 is in 3 lanes and fineweb-edu
    // in 8; what those lanes can give bounds the shares. (A refused daemon may have written
    // its lineage: each starts on an empty state directory.)
    std::fs::remove_dir_all(&state).ok();
    let lanes = (
        "[mix]\n",
        "[lanes]\ncount = 16\nblock_windows = 1\n\n[mix]\n",
    );
    let floor = adaptive_recipe(tmp.path(), "floor.toml", "exp3", "min_weight = 0.19\n");
    let floor = recipe_variant(&floor, tmp.path(), "floor-lanes.toml", &[lanes]);
    let err = start(&floor, "4", true);
    assert!(
        err.contains(
            "mix.adaptive.min_weight = 0.19 cannot be met by the lanes: source \"c4\" is in 3 of \
             16 lanes, which give it at most 18.8 % of the tokens; give it at least 16 units \
             (more files, or smaller row groups) or lower lanes.count, or lower min_weight to \
             0.1875"
        ),
        "{err}"
    );
    std::fs::remove_dir_all(&state).ok();
    let heavy = ("weight = 0.40", "weight = 2.0");
    let heavy = recipe_variant(&recipe, tmp.path(), "heavy-lanes.toml", &[lanes, heavy]);
    let err = start(&heavy, "4", true);
    assert!(
        err.contains(
            "[mix.adaptive] starts from weights the lanes cannot meet: source \"fineweb-edu\" \
             wants 76.9 % of the tokens but is in 8 of 16 lanes, which give it at most 50.0 %; \
             give it at least 16 units"
        ),
        "{err}"
    );
    let in_documents = recipe_variant(
        &recipe,
        tmp.path(),
        "docs.toml",
        &[("unit = \"tokens\"\n", "")],
    );
    let err = start(&in_documents, "4", true);
    assert!(
        err.contains("mix.adaptive: decides shares of tokens: it needs [mix] unit = \"tokens\""),
        "{err}"
    );
}

/// A graceful stop (SIGTERM) keeps the reports no decision has used yet, and the daemon resumed
/// on the same ranks takes them back: the decisions right after the restart are made from them
/// (after a SIGKILL they would hold), and the stream replays exactly.
#[test]
fn a_graceful_stop_keeps_the_unused_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = adaptive_recipe(tmp.path(), "adaptive.toml", "exp3", "");
    let run = Run {
        dir: tmp.path(),
        recipe: &recipe,
        state: tmp.path().join("state"),
        every: 4,
    };
    let report = ["--report-loss", LOSS];
    let mut daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull_with(&daemon, 2, 0, 20, &report);
    daemon.terminate();
    let stopped = daemon.log_text();
    assert!(
        stopped.contains("kept the unused loss reports of "),
        "{stopped}"
    );
    let daemon = run.start(2, 2, true).unwrap();
    got.extend(run.pull_with(&daemon, 2, 20, 16, &report));
    let log = daemon.log_text();
    drop(daemon);
    assert!(
        log.contains("took back the unused loss reports of "),
        "{log}"
    );
    let decided = decisions(&run.state);
    assert!(decided.len() >= 8, "{decided:?}");
    assert!(
        decided.iter().all(|d| !d.1),
        "no decision held, across the restart: {decided:?}\n{log}"
    );
    let data = pack_lineage(&run.state, &tmp.path().join("packed"));
    assert!(
        got == windows(&data, 0..36 * 4),
        "the stream replays exactly"
    );
}

/// A rank that never reports: each decision waits `wait_seconds`, keeps the shares, and says
/// which reports it lacked; the ranks get every step (no hang), and the replay is exact.
#[test]
fn a_silent_rank_makes_decisions_hold_and_they_replay() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = adaptive_recipe(tmp.path(), "adaptive.toml", "softmax", "");
    let recipe = recipe_variant(
        &recipe,
        tmp.path(),
        "quick.toml",
        &[("wait_seconds = 2", "wait_seconds = 0.5")],
    );
    let run = Run {
        dir: tmp.path(),
        recipe: &recipe,
        state: tmp.path().join("state"),
        every: 4,
    };
    let daemon = run.start(2, 2, false).unwrap();
    let endpoint = daemon.endpoint.clone();
    let reporter = support::daemon::tap_with(
        &endpoint,
        0,
        2,
        0,
        24,
        &tmp.path().join("r0.bin"),
        &["--report-loss", LOSS],
    );
    let silent = support::daemon::tap(&endpoint, 1, 2, 0, 24, &tmp.path().join("r1.bin"));
    for child in [reporter, silent] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = daemon.log_text();
    drop(daemon);
    let decided = decisions(&run.state);
    assert!(decided.len() >= 4, "{decided:?}");
    assert!(
        decided.iter().all(|d| d.1),
        "every decision held: {decided:?}"
    );
    assert!(
        log.contains(
            "mix decision for step 9 holds the shares: on_missing = \"hold\": after 0.5 s no \
             report of step 0 from ranks [1], step 1 from ranks [1], step 2 from ranks [1]"
        ),
        "{log}"
    );
    let ranks: Vec<Vec<u8>> = (0..2)
        .map(|r| std::fs::read(tmp.path().join(format!("r{r}.bin"))).unwrap())
        .collect();
    let slice = 2 * 513 * 2;
    let got: Vec<u8> = (0..24)
        .flat_map(|s| {
            ranks
                .iter()
                .flat_map(move |b| b[s * slice..(s + 1) * slice].to_vec())
        })
        .collect();
    let data = pack_lineage(&run.state, &tmp.path().join("packed"));
    assert!(
        got == windows(&data, 0..24 * 4),
        "the held decisions replay exactly"
    );
}

/// `inspect --decisions` of a stream that made none says so, by its file.
#[test]
fn inspecting_a_lineage_without_decisions_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let args = ["--world-size", "1", "--micro-batch", "1", "--state-dir"];
    let mut args = args.to_vec();
    args.push(state.to_str().unwrap());
    drop(Daemon::start_with(&quickstart(), &endpoint, &args).unwrap());
    let out = dsprep(&["inspect", state.to_str().unwrap(), "--decisions"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!(
            "error: {} holds no [mix.adaptive] decisions (its lineage has 1 segments)",
            state.display()
        )
    );
}
