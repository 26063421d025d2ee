//! `[mix.adaptive]` on node daemons: the multinode recipe (`[lanes]`, 8 lanes) mixed in tokens,
//! served by 2 and 4 node daemons to 8 real `dsprep tap` ranks that report a synthetic loss
//! after each step. Node 0 decides from every node's reports (pooled through the state
//! directory once per decision); each lane takes the decision at its own share of the token
//! point with the lanes' share solver's weights. The daemons are SIGKILLed at pseudo-random steps
//! and resumed on another node count: every rank's bytes equal `dsprep pack --lineage`.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use std::path::{Path, PathBuf};
use support::adaptive::*;
use support::daemon::{Daemon, tap_all};
use support::lineage::*;
use support::nodes::{multinode, node_args};
use support::recipe_variant;

/// Ranks (world 8 × micro batch 1: a step is 4 blocks of 2 windows, so 1, 2 or 4 nodes).
const WORLD: u32 = 8;
/// Bytes of one rank's row (513 u16 tokens).
const ROW: usize = 513 * 2;

/// The multinode recipe mixed in tokens with `[mix.adaptive]` (`extra` lines in its table).
fn adaptive_multinode(dir: &Path, algorithm: &str, extra: &str, best_fit: bool) -> PathBuf {
    let mut replace = vec![("[mix]\n", "[mix]\nunit = \"tokens\"\n")];
    if best_fit {
        replace.push(("[packing]\n", "[packing]\nstrategy = \"best_fit\"\n"));
    }
    let path = recipe_variant(&multinode(), dir, "adaptive.toml", &replace);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&adaptive_table(algorithm, extra));
    // With ranks slow to start, the stream runs ahead to fill the prefetch (4 steps), what each
    // lane holds (3 blocks of 2 windows: 6 steps of 8 windows over 8 lanes) and the tokenizing
    // pipeline (about 6 more): a lag of 20 lets the reports come first.
    text = text.replace("lag = 6\n", "lag = 20\n");
    if best_fit {
        // best_fit's pool reads further ahead: 8 documents, a few steps of a lane's share.
        text = text.replace(
            "strategy = \"best_fit\"\n",
            "strategy = \"best_fit\"\npool_documents = 8\n",
        );
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// `count` node daemons of `recipe` sharing `dir/state` (resumed when `resume`).
fn start_nodes(dir: &Path, recipe: &Path, count: u32, resume: bool) -> Vec<Daemon> {
    let mut extra = vec![
        "--prefetch",
        "4",
        "--checkpoint-every",
        "3",
        "--metrics",
        "off",
    ];
    if resume {
        extra.extend(["--resume", "latest"]);
    }
    (0..count)
        .map(|node| {
            let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
            let args = node_args(dir, node, count, WORLD, 1, &extra);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Daemon::start_with(recipe, &endpoint, &args).unwrap()
        })
        .collect()
}

/// Every rank pulls `steps` from `from`, reporting its loss: the global batches, in step order.
fn pull(dir: &Path, daemons: &[Daemon], from: u64, steps: u64) -> Vec<u8> {
    let refs: Vec<&Daemon> = daemons.iter().collect();
    let tag = format!("from{from}");
    let outs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap_all(
            dir,
            &refs,
            WORLD,
            from,
            steps,
            &tag,
            &["--report-loss", LOSS],
        )
    }))
    .unwrap_or_else(|panic| {
        for (node, daemon) in daemons.iter().enumerate() {
            eprintln!("node {node}'s log:\n{}", daemon.log_text());
        }
        std::panic::resume_unwind(panic)
    });
    let ranks: Vec<Vec<u8>> = outs.iter().map(|o| std::fs::read(o).unwrap()).collect();
    (0..steps as usize)
        .flat_map(|s| {
            let ranks = &ranks;
            (0..WORLD as usize).flat_map(move |r| ranks[r][s * ROW..(s + 1) * ROW].to_vec())
        })
        .collect()
}

/// Node daemons on `counts[0]`, then `counts[1]`, then `counts[2]` nodes, SIGKILLed between at
/// pseudo-random steps: what the ranks got is `pack --lineage`'s, and node 0's decisions
/// counted every rank's reports.
fn nodes_killed_and_resumed(counts: [u32; 3], algorithm: &str, extra: &str, best_fit: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let recipe = adaptive_multinode(dir, algorithm, extra, best_fit);
    let seed = seed();
    let first = 10 + seed % 8;
    let second = first + 8 + (seed / 8) % 8;
    let end = 48;
    let why = format!("DSPREP_TEST_SEED={seed}: kills at steps {first} and {second}");
    let mut got = Vec::new();
    for (i, (from, to)) in [(0, first), (first, second), (second, end)]
        .into_iter()
        .enumerate()
    {
        let daemons = start_nodes(dir, &recipe, counts[i], i > 0);
        got.extend(pull(dir, &daemons, from, to - from));
        drop(daemons); // SIGKILL
    }
    let state = dir.join("state");
    let decided = decision_values(&state);
    let steps: Vec<u64> = decided
        .iter()
        .map(|d| d["step"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = (0..steps.len() as u64).map(|k| 21 + 3 * k).collect();
    assert_eq!(
        steps, expected,
        "{why}: a decision every 3 steps from step 21 (lag 20)"
    );
    // Decisions for steps 21 to 36 at least (with best_fit's padding a decision's token point
    // comes a little after its step).
    assert!(steps.len() >= 6, "{why}: {steps:?}");
    // A decision from reports counted every rank's tokens of its 3 steps (512 labels a row with
    // concat; fewer with best_fit's padding): node 0 heard the other nodes.
    // (tokens counted, the tokens of every rank's rows of the steps it used) per decision.
    let pooled: Vec<(u64, u64)> = (decided.iter())
        .filter(|d| d.get("held").is_none())
        .map(|d| {
            let observed = d["observed"].as_object().unwrap();
            let tokens = observed.values().map(|o| o["tokens"].as_u64().unwrap());
            let used = d["reports_to"].as_u64().unwrap() - d["reports_from"].as_u64().unwrap();
            (tokens.sum(), used * u64::from(WORLD) * 512)
        })
        .collect();
    // Decisions right after a restart may hold: the killed daemons' unused reports are gone,
    // and the trainers do not report below where they resumed.
    assert!(
        !pooled.is_empty(),
        "{why}: decisions from reports: {decided:?}"
    );
    for &(tokens, all) in &pooled {
        match best_fit {
            false => assert_eq!(tokens, all, "{why}: every rank's reports, {pooled:?}"),
            true => assert!(tokens > all / 2 && tokens <= all, "{why}: {pooled:?}"),
        }
    }
    let data = pack_lineage(&state, &dir.join("packed"));
    assert_eq!(got.len(), end as usize * WORLD as usize * ROW, "{why}");
    assert!(
        got == windows(&data, 0..end * u64::from(WORLD)),
        "{why}: the served stream differs from the packed lineage of its decisions"
    );
}

#[test]
fn exp3_on_two_then_four_then_two_node_daemons_replays_exactly() {
    nodes_killed_and_resumed([2, 4, 2], "exp3", "", false);
}

#[test]
fn softmax_with_best_fit_on_four_then_two_then_one_node_daemons_replays_exactly() {
    nodes_killed_and_resumed([4, 2, 1], "softmax", "temperature = 0.5\n", true);
}

/// Node 1's ranks never report, on node daemons whose recipe says `on_missing`: node 0 waits
/// `wait_seconds` for node 1's file, which says which of its ranks were silent. With `"hold"`
/// every decision keeps the shares, naming them; with `"reported"` every decision is made from
/// node 0's ranks' reports and records what it lacked. Either way the stream replays exactly.
fn a_silent_node(on_missing: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let extra = format!("on_missing = \"{on_missing}\"\n");
    let recipe = adaptive_multinode(dir, "exp3", &extra, false);
    let recipe_text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("wait_seconds = 2", "wait_seconds = 1");
    std::fs::write(&recipe, recipe_text).unwrap();
    let daemons = start_nodes(dir, &recipe, 2, false);
    let steps = 30;
    let taps: Vec<_> = (0..WORLD)
        .map(|rank| {
            let node = &daemons[(rank / 4) as usize];
            let out = dir.join(format!("r{rank}.bin"));
            let report: &[&str] = if rank < 4 {
                &["--report-loss", LOSS]
            } else {
                &[]
            };
            support::daemon::tap_with(&node.endpoint, rank, WORLD, 0, steps, &out, report)
        })
        .collect();
    for child in taps {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = daemons[0].log_text();
    drop(daemons);
    let state = dir.join("state");
    let decided = decision_values(&state);
    assert!(decided.len() >= 2, "{decided:?}");
    // The first decision (step 21) uses the reports of step 0; the next, of steps 1..4.
    let lacked = "step 0 from every rank of node 1";
    match on_missing {
        "hold" => {
            assert!(
                decided.iter().all(|d| d.get("held").is_some()),
                "{decided:?}"
            );
            let line = format!(
                "mix decision for step 21 holds the shares: on_missing = \"hold\": after 1.0 s \
                 no report of {lacked}"
            );
            assert!(log.contains(&line), "{log}");
        }
        _ => {
            assert!(
                decided.iter().all(|d| d.get("held").is_none()),
                "{decided:?}"
            );
            assert_eq!(decided[0]["missing"], lacked, "{decided:?}");
            // Node 0's 4 ranks' step 0, of 512 counted labels each.
            let observed = decided[0]["observed"].as_object().unwrap();
            let tokens: u64 = observed
                .values()
                .map(|o| o["tokens"].as_u64().unwrap())
                .sum();
            assert_eq!(tokens, 4 * 512);
            let table = support::dsprep_ok(&["inspect", state.to_str().unwrap(), "--decisions"]);
            assert!(table.contains(&format!("without: {lacked}")), "{table}");
        }
    }
    let ranks: Vec<Vec<u8>> = (0..WORLD)
        .map(|r| std::fs::read(dir.join(format!("r{r}.bin"))).unwrap())
        .collect();
    let got: Vec<u8> = (0..steps as usize)
        .flat_map(|s| {
            ranks
                .iter()
                .flat_map(move |b| b[s * ROW..(s + 1) * ROW].to_vec())
        })
        .collect();
    let data = pack_lineage(&state, &dir.join("packed"));
    assert!(
        got == windows(&data, 0..steps * u64::from(WORLD)),
        "the decisions replay exactly"
    );
}

#[test]
fn a_node_whose_ranks_never_report_makes_decisions_hold_naming_them() {
    a_silent_node("hold");
}

#[test]
fn on_missing_reported_decides_from_the_nodes_that_reported() {
    a_silent_node("reported");
}

/// Node daemons serve an adaptive stream to its end: the lanes that read past the end (to a
/// decision point node 0's lanes, stopped at the end, never reach) stop waiting for node 0, so
/// every node says the end, and the ranks got exactly `pack --lineage`.
#[test]
fn node_daemons_serve_an_adaptive_stream_to_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let recipe = adaptive_multinode(dir, "softmax", "", false);
    let daemons = start_nodes(dir, &recipe, 2, false);
    let refs: Vec<&Daemon> = daemons.iter().collect();
    let outs = tap_all(dir, &refs, WORLD, 0, 1000, "all", &["--report-loss", LOSS]);
    let ranks: Vec<Vec<u8>> = outs.iter().map(|o| std::fs::read(o).unwrap()).collect();
    let steps = ranks[0].len() / ROW;
    assert!(steps > 50, "{steps} steps");
    let got: Vec<u8> = (0..steps)
        .flat_map(|s| {
            ranks
                .iter()
                .flat_map(move |b| b[s * ROW..(s + 1) * ROW].to_vec())
        })
        .collect();
    for daemon in &daemons {
        let log = daemon.log_text();
        assert!(
            log.contains(&format!("every rank gets {steps} steps")),
            "{log}"
        );
    }
    drop(daemons);
    // Without kills, node 0 hears every rank: a decision from reports counts all of them.
    let decided = decision_values(&dir.join("state"));
    let from_reports: Vec<_> = decided.iter().filter(|d| d.get("held").is_none()).collect();
    assert!(from_reports.len() >= decided.len() / 2, "{decided:?}");
    for d in from_reports {
        let observed = d["observed"].as_object().unwrap();
        let tokens: u64 = observed
            .values()
            .map(|o| o["tokens"].as_u64().unwrap())
            .sum();
        let used = d["reports_to"].as_u64().unwrap() - d["reports_from"].as_u64().unwrap();
        assert_eq!(tokens, used * u64::from(WORLD) * 512, "{d}");
    }
    let data = pack_lineage(&dir.join("state"), &dir.join("packed"));
    let served = steps as u64 * u64::from(WORLD);
    assert!(data.num_windows() >= served && data.num_windows() < served + u64::from(WORLD));
    assert!(got == windows(&data, 0..served));
}

/// A lag the lanes' read-ahead would overtake is refused before serving, with the arithmetic.
#[test]
fn a_lag_within_what_the_lanes_hold_ahead_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let recipe = adaptive_multinode(dir, "exp3", "", false);
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(&recipe, text.replace("lag = 20\n", "lag = 10\n")).unwrap();
    let endpoint = format!("ipc://{}", dir.join("node0.sock").display());
    let args = node_args(
        dir,
        0,
        2,
        WORLD,
        1,
        &["--prefetch", "4", "--metrics", "off"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = Daemon::start_with(&recipe, &endpoint, &args).err().unwrap();
    assert!(
        err.contains(
            "mix.adaptive.lag = 10 must be above the daemon's prefetch and what its lanes hold \
             ahead: --prefetch 4 + 6 steps (3 blocks of 2 windows in each of 8 lanes, 8 windows a \
             step); raise lag above 10 or lower --prefetch"
        ),
        "{err}"
    );
}
