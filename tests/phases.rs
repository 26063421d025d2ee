//! Phases of a mix in tokens (`[[mix.phase]]`): the switch at its point, without lanes and with
//! them (every lane at its own share of the point, on any number of nodes, across kill -9 and
//! resume), and the ledger of every phase in the manifest, the pack summary and `inspect --mix`.
//! Also what lanes do with a source that some lanes hold no unit of. Real `dsprep` processes on
//! the shipped samples.

#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose
mod support;

use dsprep_client::PackedDataset;
use std::path::{Path, PathBuf};
use support::daemon::{Daemon, chain_marks, expected_rank_bytes, tap_all};
use support::nodes::{multinode, node_args, tap_all_bytes};
use support::*;

/// `[[mix.phase]]`: `dsprep plan` prints the phase table; the pack switches with the first
/// document that starts at or after the point (c4 and zyda-2 leave the mix there); `inspect
/// --mix` gives each phase's ledger.
#[test]
fn a_phase_switches_at_its_point_and_plan_and_inspect_show_it() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = quickstart_with_a_phase(tmp.path(), 400_000);
    let plan = dsprep_ok(&["plan", "--recipe", recipe.to_str().unwrap()]);
    assert!(
        plan.contains("source \"c4\": weight 0.15 (15.0 % of tokens)"),
        "{plan}"
    );
    let rows: Vec<&str> = plan
        .lines()
        .skip_while(|l| !l.starts_with("phases"))
        .collect();
    assert_eq!(
        rows[2].split_whitespace().collect::<Vec<_>>(),
        [
            "0", "0", "400000", "160000", "(40.0%)", "60000", "(15.0%)", "120000", "(30.0%)",
            "40000", "(10.0%)", "20000", "(5.0%)"
        ]
    );
    assert_eq!(
        rows[3].split_whitespace().collect::<Vec<_>>(),
        [
            "1", "400000", "the", "end", "40.0%", "0.0%", "0.0%", "30.0%", "30.0%"
        ]
    );
    let out = tmp.path().join("p");
    let dataset = pack_dataset(&recipe, &out);
    // A phase the data never reaches is reported, not silently skipped.
    let late = quickstart_with_a_phase(tmp.path(), 50_000_000);
    let late_out = tmp.path().join("late");
    let summary = dsprep_ok(&pack_args(&late, &late_out, &[]));
    assert!(
        summary.contains(
            "before phase 1's point (50000000 tokens): that phase never began (under \
             all_exhausted the sources ran out first)"
        ),
        "{summary}"
    );
    let table = dsprep_ok(&["inspect", out.to_str().unwrap(), "--mix"]);
    let phase1 = table
        .lines()
        .find(|l| l.starts_with("phase 1: tokens "))
        .unwrap();
    let from: u64 = phase1["phase 1: tokens ".len()..]
        .split("..")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((400_000..410_000).contains(&from), "{phase1}");
    // The first document starting at or after 400,000 tokens is phase 1's, and none after it
    // comes from c4 (1) or zyda-2 (2).
    let mut at = 0u64;
    for w in 0..dataset.num_windows() {
        let window = dataset.window(w).unwrap();
        for (&start, &source) in window.doc_starts.iter().zip(window.doc_sources.unwrap()) {
            let pos = at + u64::from(start);
            if pos >= 400_000 {
                assert!(
                    pos >= from,
                    "a document starts at {pos}, before phase 1's {from}"
                );
                assert!(source != 1 && source != 2, "source {source} at {pos}");
            }
        }
        at += 513;
    }
    let after: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("phase 1"))
        .collect();
    for name in ["c4", "zyda-2"] {
        let line = after.iter().find(|l| l.starts_with(name)).unwrap();
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            [name, "0.00%", "0.00%", "0.00%", "+0.00"]
        );
    }
    for line in after
        .iter()
        .filter(|l| l.starts_with("fineweb-edu") || l.starts_with("finemath"))
    {
        let off: f64 = line.split_whitespace().last().unwrap().parse().unwrap();
        assert!(off.abs() < 3.0, "{line}");
    }
}

/// The manifest (format 4) and the pack summary give every phase's ledger, counted over the
/// windows as `inspect --mix` counts them: exact numbers of the pinned quickstart stream.
#[test]
fn the_manifest_and_the_summary_give_every_phase_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = quickstart_with_a_phase(tmp.path(), 400_000);
    let out = tmp.path().join("p");
    let summary = dsprep_ok(&pack_args(&recipe, &out, &[]));
    let m = PackedDataset::open(&out).unwrap().manifest().clone();
    assert_eq!(m.format_version, 4);
    let got: Vec<_> = (m.phases.iter())
        .map(|p| {
            (
                p.phase,
                p.at_tokens,
                p.began_at_tokens,
                p.tokens,
                p.documents,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, 0, Some(0), 401_454, 559),
            (1, 400_000, Some(401_454), 351_117, 359)
        ]
    );
    assert_eq!(m.phases[1].all_lanes_began_at_tokens, None, "no lanes");
    assert_eq!(
        m.phases.iter().map(|p| p.tokens).sum::<u64>(),
        m.num_windows * 513
    );
    let tokens =
        |phase: usize| -> Vec<u64> { m.phases[phase].sources.iter().map(|s| s.tokens).collect() };
    let documents = |phase: usize| -> Vec<u64> {
        m.phases[phase]
            .sources
            .iter()
            .map(|s| s.documents)
            .collect()
    };
    assert_eq!(tokens(0), [158_541, 58_554, 120_633, 45_247, 18_479]);
    assert_eq!(documents(0), [214, 149, 168, 3, 25]);
    assert_eq!(tokens(1), [135_615, 0, 0, 112_845, 102_657]);
    assert_eq!(documents(1), [190, 0, 0, 17, 152]);
    // The shares as the counts give them (serde_json reads floats to within an ulp or so).
    let close = |a: f64, b: f64| (a - b).abs() < 1e-15;
    for phase in &m.phases {
        for s in &phase.sources {
            let share = s.tokens as f64 / phase.tokens as f64;
            assert!(close(s.realized_token_fraction, share), "{s:?}");
            let docs = s.documents as f64 / phase.documents as f64;
            assert!(close(s.realized_fraction, docs), "{s:?}");
            assert!(
                close(s.deviation, share - s.target_fraction),
                "in tokens: {s:?}"
            );
        }
    }
    let targets: Vec<f64> = (m.phases[1].sources.iter())
        .map(|s| s.target_fraction)
        .collect();
    assert_eq!(targets, [0.4, 0.0, 0.0, 0.3, 0.3]);
    // The summary prints each phase's table; inspect --mix counts the same.
    assert!(
        summary.contains(
            "phase 1 (at 400000 tokens; its first document at 401454): 351117 tokens and 359 \
             document starts in windows"
        ),
        "{summary}"
    );
    let table = dsprep_ok(&["inspect", out.to_str().unwrap(), "--mix"]);
    for (k, phase) in m.phases.iter().enumerate() {
        let head = format!("phase {k}: tokens {}..", phase.began_at_tokens.unwrap());
        let at = table
            .find(&head)
            .unwrap_or_else(|| panic!("{head}: {table}"));
        let line = table[at..].lines().next().unwrap();
        assert!(
            line.contains(&format!(
                ", {} tokens and {} document starts in windows",
                phase.tokens, phase.documents
            )),
            "{line}"
        );
        let rows: Vec<&str> = table[at..].lines().skip(2).take(5).collect();
        let in_summary = summary[summary.find(&format!("phase {k} (at")).unwrap()..]
            .lines()
            .skip(2)
            .take(5)
            .collect::<Vec<_>>();
        assert_eq!(rows, in_summary, "phase {k}: the same table");
        let fineweb = rows[0].split_whitespace().collect::<Vec<_>>();
        assert_eq!(
            fineweb[2],
            format!("{:.2}%", 100.0 * phase.sources[0].realized_token_fraction)
        );
    }
    // verify recounts the ledger from the windows.
    dsprep_ok(&["verify", out.to_str().unwrap()]);
    let path = out.join("manifest.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json["phases"][1]["sources"][0]["tokens"] = 135_616.into();
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let err = dsprep_fails(&["verify", out.to_str().unwrap()]);
    assert!(
        err.contains(
            "manifest.json: phase 1, source \"fineweb-edu\": the windows hold 135615 tokens and \
             190 document starts, the manifest says 135616 and 190"
        ),
        "{err}"
    );
}

/// The multinode recipe with `lanes` lanes, mixed in tokens with a phase from `at_tokens` on
/// (more math and code, no c4 or zyda-2), written into `dir` with absolute paths.
fn phased_multinode(dir: &Path, at_tokens: u64, lanes: u32) -> PathBuf {
    let config = repo_root().join("config");
    let text = std::fs::read_to_string(multinode())
        .unwrap()
        .replace("count = 8 ", &format!("count = {lanes} "))
        .replace("[mix]\n", "[mix]\nunit = \"tokens\"\n")
        .replace(
            "\"tokenizers/",
            &format!("\"{}/tokenizers/", config.display()),
        )
        .replace("\"samples/", &format!("\"{}/samples/", config.display()))
        + &format!(
            "\n[[mix.phase]]\nat_tokens = {at_tokens}\n\
             weights = {{ finemath = 0.3, the-stack-v2 = 0.3, fineweb-edu = 0.4 }}\n"
        );
    let recipe = dir.join("multinode-phase.toml");
    std::fs::write(&recipe, text).unwrap();
    recipe
}

/// Where a phase from `at` on begins in every lane of `data` (8 lanes of 2-window blocks),
/// worked out from the interleave alone: each lane's point is its own tokens before `at`, no
/// document of c4 (1) or zyda-2 (2) starts in a lane at or after its point, and the lane's first
/// document there starts at or after `at` in the stream. Returns where each lane's first document
/// of the phase starts in the stream.
fn lane_switches(data: &PackedDataset, at: u64) -> Vec<u64> {
    let (w, lanes) = (513u64, 8usize);
    let lane_of = |i: u64| ((i / 2) % 8) as usize;
    let mut point = vec![0u64; lanes];
    for i in 0..data.num_windows() {
        point[lane_of(i)] += at.saturating_sub(i * w).min(w);
    }
    assert_eq!(point.iter().sum::<u64>(), at);
    let mut own = vec![0u64; lanes];
    let mut switched = vec![None; lanes];
    let mut dropped_before = 0;
    for i in 0..data.num_windows() {
        let (lane, window) = (lane_of(i), data.window(i).unwrap());
        for (&start, &source) in window.doc_starts.iter().zip(window.doc_sources.unwrap()) {
            let (mine, stream) = (own[lane] + u64::from(start), i * w + u64::from(start));
            if mine >= point[lane] {
                assert!(
                    stream >= at,
                    "lane {lane}: its point {} is at {stream}",
                    point[lane]
                );
                switched[lane].get_or_insert(stream);
                assert!(
                    source != 1 && source != 2,
                    "lane {lane}: source {source} starts at its token {mine}, past its point {}",
                    point[lane]
                );
            } else if source == 1 || source == 2 {
                dropped_before += 1;
            }
        }
        own[lane] += w;
    }
    assert!(
        dropped_before > 0,
        "c4 and zyda-2 take part before the point"
    );
    switched
        .into_iter()
        .enumerate()
        .map(|(lane, s)| s.unwrap_or_else(|| panic!("lane {lane} never began the phase")))
        .collect()
}

/// Phase point of the laned tests: about step 29 of 76 (of 4 windows), where every lane of the
/// quickstart samples gets past its crossing document before its data ends.
const LANED_PHASE_AT: u64 = 60_000;

/// `[[mix.phase]]` with `[lanes]`: every lane switches at its own share of the point (exact
/// arithmetic on the interleave), and one pack, parts plus a finish, and 1 or 4 node daemons
/// give the same bytes. The manifest and `inspect --mix` give each phase's ledger with where the
/// first and the last lane switched.
#[test]
fn a_phase_with_lanes_switches_every_lane_at_its_share_of_the_point_however_it_is_run() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = phased_multinode(tmp.path(), LANED_PHASE_AT, 8);
    let whole = tmp.path().join("whole");
    let summary = dsprep_ok(&pack_args(&recipe, &whole, &[]));
    let parts = tmp.path().join("parts");
    for part in ["0", "1"] {
        dsprep_ok(&pack_args(
            &recipe,
            &parts,
            &["--part", part, "--parts", "2"],
        ));
    }
    dsprep_ok(&pack_args(&recipe, &parts, &["--finish"]));
    assert!(
        dir_bytes(&parts) == dir_bytes(&whole),
        "parts + finish wrote other bytes than one pack"
    );
    let data = PackedDataset::open(&whole).unwrap();
    let switches = lane_switches(&data, LANED_PHASE_AT);
    let (first, last) = (
        *switches.iter().min().unwrap(),
        *switches.iter().max().unwrap(),
    );
    let m = data.manifest();
    assert_eq!(m.phases[1].began_at_tokens, Some(first));
    assert_eq!(m.phases[1].all_lanes_began_at_tokens, Some(last));
    assert!(
        summary.contains(&format!(
            "phase 1 (at {LANED_PHASE_AT} tokens; its first document at {first}, the last \
             lane's from {last}): {} tokens",
            m.phases[1].tokens
        )),
        "{summary}"
    );
    let table = dsprep_ok(&["inspect", whole.to_str().unwrap(), "--mix"]);
    let head = format!(
        "phase 1: tokens {first}..the end (each lane from its own share of the point: the last \
         from {last}), {} tokens and {} document starts in windows",
        m.phases[1].tokens, m.phases[1].documents
    );
    assert!(table.contains(&head), "{head}\n{table}");
    for (k, phase) in m.phases.iter().enumerate() {
        let at = table.find(&format!("phase {k}: ")).unwrap();
        for (line, s) in table[at..].lines().skip(2).zip(&phase.sources) {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells[0], s.name);
            assert_eq!(
                cells[2],
                format!("{:.2}%", 100.0 * s.realized_token_fraction)
            );
            assert_eq!(cells[4], format!("{:+.2}", 100.0 * s.deviation));
        }
    }
    dsprep_ok(&["verify", whole.to_str().unwrap()]);
    for (nodes, world, mb) in [(1u32, 4u32, 1u32), (4, 8, 2)] {
        let dir = tmp.path().join(format!("n{nodes}"));
        std::fs::create_dir_all(&dir).unwrap();
        let daemons: Vec<Daemon> = (0..nodes)
            .map(|node| {
                let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
                let args = node_args(&dir, node, nodes, world, mb, &["--metrics", "off"]);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Daemon::start_with(&recipe, &endpoint, &args).unwrap()
            })
            .collect();
        let all: Vec<&Daemon> = daemons.iter().collect();
        let steps = data.num_windows() / u64::from(world * mb);
        let outs = tap_all(&dir, &all, world, 0, steps + 1, "t", &[]);
        for (rank, out) in outs.iter().enumerate() {
            let want = expected_rank_bytes(&data, world.into(), mb.into(), rank as u64);
            assert!(
                std::fs::read(out).unwrap() == want,
                "{nodes} node(s), rank {rank}"
            );
        }
    }
}

/// A laned recipe with a phase (2 lanes, so that each holds enough windows for checkpoints well
/// before the point), served by two node daemons: one is killed with SIGKILL before the boundary
/// and resumes alone (`--resume latest`) while the other serves on; both are killed past the
/// boundary and the job resumes on one node. Every rank gets the packed bytes.
#[test]
fn a_phase_with_lanes_resumes_exactly_on_both_sides_of_the_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = phased_multinode(tmp.path(), 200_000, 2);
    let out = tmp.path().join("whole");
    dsprep_ok(&pack_args(&recipe, &out, &[]));
    let data = PackedDataset::open(&out).unwrap();
    let steps = data.num_windows() / 4;
    let boundary = data.manifest().phases[1].began_at_tokens.unwrap() / (4 * 513);
    assert!((80..110).contains(&boundary), "step {boundary} of {steps}");
    let marks = chain_marks(&data, steps * 4);
    let start = |node: u32, nodes: u32, extra: &[&str]| {
        let endpoint = format!(
            "ipc://{}",
            tmp.path().join(format!("node{node}.sock")).display()
        );
        let args = node_args(tmp.path(), node, nodes, 4, 1, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Daemon::start_with(&recipe, &endpoint, &args).unwrap()
    };
    let every = ["--metrics", "off", "--checkpoint-every", "3"];
    let resume = [
        "--metrics",
        "off",
        "--checkpoint-every",
        "3",
        "--resume",
        "latest",
    ];
    let mut daemons = vec![start(0, 2, &every), start(1, 2, &every)];
    let (a, b) = (boundary - 12, boundary + 20);
    let first = tap_all_bytes(tmp.path(), &[&daemons[0], &daemons[1]], 0, a, "a", &marks);
    daemons[1].child.kill().unwrap();
    daemons[1].child.wait().unwrap();
    daemons[1] = start(1, 2, &resume);
    let second = tap_all_bytes(
        tmp.path(),
        &[&daemons[0], &daemons[1]],
        a,
        b - a,
        "b",
        &marks,
    );
    assert!(
        daemons[1].log_text().contains(": resuming from"),
        "{}",
        daemons[1].log_text()
    );
    for d in &mut daemons {
        d.child.kill().unwrap();
        d.child.wait().unwrap();
    }
    drop(daemons);
    let one = start(0, 1, &resume);
    let third = tap_all_bytes(tmp.path(), &[&one], b, steps - b, "c", &marks);
    let log = one.log_text();
    assert!(
        log.contains(&format!("the first request is for step {b}")),
        "{log}"
    );
    assert!(log.contains(": resuming from"), "{log}");
    for rank in 0..4u64 {
        let got = [
            &first[rank as usize][..],
            &second[rank as usize][..],
            &third[rank as usize][..],
        ]
        .concat();
        assert!(
            got == expected_rank_bytes(&data, 4, 1, rank),
            "rank {rank}: the resumed bytes differ"
        );
    }
}

/// The quickstart samples have fewer units than lanes for four sources: `plan`, `pack` and
/// `serve` say which, with their units and the lanes without them. Mixed in documents the
/// shares drift (plan says about how far); mixed in tokens the lanes that hold a source take
/// more of it, and the stream keeps every source near its share (6.0 % of tokens for c4 without
/// that, by the lanes' arithmetic).
#[test]
fn sources_missing_from_lanes_are_named_and_in_tokens_the_other_lanes_make_up_for_them() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = dsprep_ok(&["plan", "--recipe", multinode().to_str().unwrap()]);
    let c4 = "source \"c4\" has 3 unit(s) of input (row groups of local parquet files, other \
              files whole) for lanes.count = 8: lane(s) 0, 1, 2, 4, 5 have none of it";
    assert!(
        plan.contains(&format!(
            "warning: {c4}, so they mix without it and its share of the stream's documents \
             drifts: about 6.0 % against 15.0 % (the mean of the lanes' shares); give it at \
             least 8 units (more files, or smaller row groups) or lower lanes.count, or mix in \
             tokens ([mix] unit = \"tokens\"), where the lanes that hold it make up for the \
             others"
        )),
        "{plan}"
    );
    let warned: Vec<&str> = plan
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    assert_eq!(
        warned.len(),
        4,
        "c4, zyda-2, the-stack-v2, finemath: {plan}"
    );
    assert!(
        warned[2].contains("\"the-stack-v2\" has 3 unit(s)"),
        "{}",
        warned[2]
    );
    assert!(
        warned[2].contains("lane(s) 1, 2, 3, 4, 6 have none"),
        "{}",
        warned[2]
    );

    // With a phase the stream never reaches: the whole stream is phase 0.
    let recipe = phased_multinode(tmp.path(), 1 << 40, 8);
    let out = tmp.path().join("t");
    let packed = dsprep(&[
        "pack",
        "--recipe",
        recipe.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(packed.status.success());
    let log = String::from_utf8_lossy(&packed.stderr);
    assert!(
        log.contains(&format!(
            "{c4}; the lanes that hold it take more of it, so the stream keeps its share of \
             tokens (15.0 % in the [[source]] weights), but a span shorter than a round of \
             blocks (16 windows) can differ"
        )),
        "{log}"
    );
    let summary = String::from_utf8_lossy(&packed.stdout);
    assert!(
        summary.contains("before phase 1's point (1099511627776 tokens): that phase never began"),
        "{summary}"
    );
    let m = PackedDataset::open(&out).unwrap().manifest().clone();
    for s in &m.phases[0].sources {
        assert!(
            s.deviation.abs() < 0.025,
            "{}: {:.2} % of tokens against {:.2} %",
            s.name,
            100.0 * s.realized_token_fraction,
            100.0 * s.target_fraction
        );
    }
    let dir = tmp.path().join("serve");
    std::fs::create_dir_all(&dir).unwrap();
    let endpoint = format!("ipc://{}", dir.join("node0.sock").display());
    let args = node_args(&dir, 0, 2, 4, 1, &["--metrics", "off"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&recipe, &endpoint, &args).unwrap();
    assert!(daemon.log_text().contains(c4), "{}", daemon.log_text());
}

/// `dsprep plan` of a recipe mixed in tokens estimates each source's tokens (its bytes × its
/// tokens per byte, measured on its first documents; exact for the samples, whose shards are
/// read whole) and where the stream ends. Under `first_exhausted` a phase past that end is
/// warned about with the numbers, and the pack indeed never reaches it; a nearer one is reached.
#[test]
fn plan_warns_of_a_phase_first_exhausted_never_reaches() {
    let tmp = tempfile::tempdir().unwrap();
    let first_exhausted = |at: u64| {
        let phased = quickstart_with_a_phase(tmp.path(), at);
        let text = std::fs::read_to_string(&phased).unwrap();
        assert!(text.contains("stopping = \"all_exhausted\""));
        let path = tmp.path().join(format!("first-{at}.toml"));
        std::fs::write(&path, text.replace("all_exhausted", "first_exhausted")).unwrap();
        path
    };
    let far = first_exhausted(400_000);
    let plan = dsprep_ok(&["plan", "--recipe", far.to_str().unwrap()]);
    assert!(
        plan.contains(
            "  source \"c4\": 25565 bytes × 0.461 tokens/byte (30 documents, 100 % of the 3 \
             shard(s) sampled) ≈ 12 k tokens\n"
        ),
        "{plan}"
    );
    let ends = "the sources hold about 358 k tokens by the estimate; under first_exhausted the \
                stream ends near 79 k tokens, when source \"c4\" runs out";
    assert!(plan.contains(&format!("{ends}\n")), "{plan}");
    assert!(
        plan.contains(&format!(
            "warning: phase 1 at 400,000 tokens: {ends}, so phase 1 never begins: lower its \
             at_tokens, or give the sources more data, or mix with stopping = \"all_exhausted\"\n"
        )),
        "{plan}"
    );
    let out = tmp.path().join("far");
    let summary = dsprep_ok(&pack_args(&far, &out, &[]));
    assert!(
        summary.contains("that phase never began (under first_exhausted"),
        "{summary}"
    );
    let m = PackedDataset::open(&out).unwrap().manifest().clone();
    let c4 = m.sources.iter().find(|s| s.name == "c4").unwrap();
    assert_eq!(
        (c4.tokens, c4.passes_completed),
        (11_786, 1),
        "c4 ran out, all of it in the stream: 25565 bytes × 0.461 tokens/byte"
    );
    // The stream ran longer than the estimate (a 26 k-token document of the-stack-v2 came
    // first, 25 % of so short a stream), but nowhere near the point.
    let stream = m.num_windows * 513 + m.dropped_tail_tokens;
    assert!((79_000..200_000).contains(&stream), "{stream}");

    let near = first_exhausted(50_000);
    let plan = dsprep_ok(&["plan", "--recipe", near.to_str().unwrap()]);
    assert!(
        plan.contains("\n  phase 1 at 50,000 tokens: reached by the estimate\n"),
        "{plan}"
    );
    assert!(!plan.contains("warning: phase"), "{plan}");
    let out = tmp.path().join("near");
    dsprep_ok(&pack_args(&near, &out, &[]));
    let m = PackedDataset::open(&out).unwrap().manifest().clone();
    assert!(m.phases[1].began_at_tokens.is_some(), "{:?}", m.phases[1]);
}
