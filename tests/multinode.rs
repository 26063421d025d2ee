//! Many nodes, one stream: a recipe with `[lanes]` (config/quickstart-multinode.toml) packed in
//! one process, packed as array-task parts plus a finish, and served by 1, 2 and 4 node daemons
//! (real processes on ipc sockets, each with its node rank) to 8 `dsprep tap` ranks. Every way
//! gives the same windows, byte for byte; each node runs only its own lanes.

#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose
mod support;

use dsprep_client::PackedDataset;
use std::path::Path;
use std::process::Command;
use support::daemon::{
    Daemon, assert_tap_chains, chain_marks, expected_rank_bytes, headers, tap, tap_all, tap_with,
};
use support::nodes::{
    multinode, node_args, packed_multinode, start_node, start_nodes, tap_all_bytes,
};
use support::{dir_bytes, dsprep, dsprep_fails, dsprep_ok, repo_root};

fn pack_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let recipe = Box::leak(multinode().to_str().unwrap().to_string().into_boxed_str());
    let mut args = vec!["pack", "--recipe", recipe, "--out", out, "--quiet"];
    args.extend_from_slice(extra);
    args
}

#[test]
fn array_task_parts_and_a_finish_equal_one_pack_even_after_a_killed_part() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = packed_multinode(tmp.path());
    assert!(whole.num_windows() > 100, "{} windows", whole.num_windows());
    let out = tmp.path().join("parts");
    let out_s = out.to_str().unwrap();

    for part in ["0", "1", "3"] {
        let stdout = dsprep_ok(&pack_args(out_s, &["--part", part, "--parts", "4"]));
        assert!(
            stdout.contains(&format!("part {part} of 4: packed lanes")),
            "{stdout}"
        );
    }
    let early = dsprep_fails(&pack_args(out_s, &["--finish"]));
    assert!(
        early.contains("lane(s) 4-5 of 8 are not packed"),
        "the finish names the missing lanes: {early}"
    );
    // Part 2 as a Slurm array task (id 12 of 10..13): it packs lanes 4 and 5, then is "killed"
    // mid-way through lane 5: its finished directory removed, a torn partial one left behind.
    let run = Command::new(env!("CARGO_BIN_EXE_dsprep"))
        .args(pack_args(out_s, &[]))
        .env("SLURM_ARRAY_TASK_ID", "12")
        .env("SLURM_ARRAY_TASK_MIN", "10")
        .env("SLURM_ARRAY_TASK_COUNT", "4")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("part 2 of 4: packed lanes [4, 5]"),
        "{stdout}"
    );
    let lanes = tmp.path().join("parts.lanes");
    std::fs::remove_dir_all(lanes.join("lane-00005")).unwrap();
    std::fs::create_dir_all(lanes.join("lane-00005.partial")).unwrap();
    std::fs::write(lanes.join("lane-00005.partial/tokens-00000.bin"), b"torn").unwrap();
    let rerun = dsprep_ok(&pack_args(out_s, &["--part", "2", "--parts", "4"]));
    assert!(
        rerun.contains("packed lanes [5] (kept [4], complete from an earlier run)"),
        "the rerun continues at its unfinished lane: {rerun}"
    );

    let summary = dsprep_ok(&pack_args(out_s, &["--finish"]));
    assert!(summary.contains("packed"), "{summary}");
    assert!(!lanes.exists(), "the finish removes OUT.lanes");
    assert!(
        dir_bytes(&out) == dir_bytes(&tmp.path().join("whole")),
        "parts + finish wrote other bytes than one pack"
    );
    let verified = dsprep_ok(&["verify", out_s]);
    assert!(verified.starts_with("ok: "), "{verified}");
}

#[test]
fn bad_part_settings_are_refused_with_their_values() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let out_s = out.to_str().unwrap();
    let e = dsprep_fails(&pack_args(out_s, &["--part", "4", "--parts", "4"]));
    assert!(e.contains("--part 4 is not below --parts 4"), "{e}");
    let e = dsprep_fails(&pack_args(out_s, &["--part", "0", "--parts", "9"]));
    assert!(
        e.contains("--parts 9 is more than the recipe's lanes.count = 8"),
        "{e}"
    );
    let quickstart = repo_root().join("config/quickstart.toml");
    let e = dsprep_fails(&[
        "pack",
        "--recipe",
        quickstart.to_str().unwrap(),
        "--out",
        out_s,
        "--part",
        "0",
        "--parts",
        "2",
    ]);
    assert!(e.contains("need a recipe with [lanes]"), "{e}");
}

/// N node daemons (N = 1, 2, 4) serving world 8 × micro batch 2; a tap per rank on its node's
/// socket. Every rank gets exactly the packed windows, and the end of data at the same step.
#[test]
fn one_two_and_four_node_daemons_serve_exactly_the_packed_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = packed_multinode(tmp.path());
    let (world, mb) = (8u32, 2u32);
    let num_steps = whole.num_windows() / u64::from(world * mb);
    let marks = chain_marks(&whole, whole.num_windows());
    let recorded = whole.manifest().chain.last().unwrap();
    assert_eq!(
        (recorded.windows, &recorded.chain),
        (whole.num_windows(), &marks[whole.num_windows() as usize]),
        "the manifest records the chain after the last window"
    );
    for nodes in [1u32, 2, 4] {
        let dir = tmp.path().join(format!("n{nodes}"));
        std::fs::create_dir_all(&dir).unwrap();
        let daemons = start_nodes(
            &dir,
            nodes,
            world,
            mb,
            &["--metrics", "127.0.0.1:0", "--threads", "1"],
        );
        let nodes_of: Vec<&Daemon> = daemons.iter().collect();
        let outs = tap_all(&dir, &nodes_of, world, 0, num_steps + 3, "rank", &[]);
        for (rank, out) in (0..world).zip(outs) {
            assert_eq!(
                assert_tap_chains(&out, &marks),
                num_steps as usize,
                "{nodes} nodes, rank {rank}: every step carries the packed stream's chain"
            );
            let got = std::fs::read(&out).unwrap();
            let want =
                expected_rank_bytes(&whole, u64::from(world), u64::from(mb), u64::from(rank));
            assert!(
                got == want,
                "{nodes} nodes, rank {rank}: {} bytes received, {} expected",
                got.len(),
                want.len()
            );
            let last = headers(&out).last().cloned().unwrap();
            assert_eq!(last["end_of_data"], true, "rank {rank}: {last}");
            assert_eq!(last["step"], num_steps, "every rank ends at the same step");
        }
        let lanes: Vec<f64> = daemons
            .iter()
            .map(|d| d.metric("dsprep_lanes_run"))
            .collect();
        assert_eq!(
            lanes,
            vec![f64::from(8 / nodes); nodes as usize],
            "{nodes} nodes"
        );
        let bytes: Vec<f64> = daemons
            .iter()
            .map(|d| d.metric("dsprep_input_bytes_assigned"))
            .collect();
        eprintln!("{nodes} node(s): input bytes per node {bytes:?}");
        assert!(bytes.iter().all(|&b| b > 0.0));
        for (node, mut d) in daemons.into_iter().enumerate() {
            let series = format!("dsprep_node{{rank=\"{node}\",count=\"{nodes}\"}}");
            assert_eq!(d.metric(&series), 1.0);
            d.terminate();
            let summary = format!("shut down: node {node} of {nodes} tokenized ");
            assert!(d.log_text().contains(&summary), "{}", d.log_text());
            assert!(d.log_text().contains("input bytes assigned"));
        }
    }
}

/// `[mix] unit = "tokens"` with lanes: each lane mixes its own units in tokens; two node daemons
/// serve exactly what one pack writes, documents' sources included.
#[test]
fn node_daemons_serve_a_lanes_recipe_mixed_in_tokens_as_packed() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo_root().join("config");
    let text = std::fs::read_to_string(multinode())
        .unwrap()
        .replace("[mix]\n", "[mix]\nunit = \"tokens\"\n")
        .replace(
            "\"tokenizers/",
            &format!("\"{}/tokenizers/", config.display()),
        )
        .replace("\"samples/", &format!("\"{}/samples/", config.display()));
    let recipe = tmp.path().join("multinode-tokens.toml");
    std::fs::write(&recipe, text).unwrap();
    let out = tmp.path().join("whole");
    let recipe_arg = recipe.to_str().unwrap();
    dsprep_ok(&[
        "pack",
        "--recipe",
        recipe_arg,
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let whole = PackedDataset::open(&out).unwrap();
    assert_eq!(whole.manifest().recipe["mix"]["unit"], "tokens");
    let daemons: Vec<Daemon> = (0..2)
        .map(|node| {
            let endpoint = format!(
                "ipc://{}",
                tmp.path().join(format!("node{node}.sock")).display()
            );
            let args = node_args(tmp.path(), node, 2, 4, 1, &["--metrics", "off"]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Daemon::start_with(&recipe, &endpoint, &args).unwrap()
        })
        .collect();
    let num_steps = whole.num_windows() / 4;
    let outs = tap_all(
        tmp.path(),
        &[&daemons[0], &daemons[1]],
        4,
        0,
        num_steps + 1,
        "t",
        &[],
    );
    for (rank, out) in outs.iter().enumerate() {
        let got = std::fs::read(out).unwrap();
        assert!(
            got == expected_rank_bytes(&whole, 4, 1, rank as u64),
            "rank {rank}"
        );
        let h = headers(out);
        for (step, line) in h[..num_steps as usize].iter().enumerate() {
            let window = whole.window(step as u64 * 4 + rank as u64).unwrap();
            assert_eq!(
                line["doc_sources"][0],
                serde_json::json!(window.doc_sources.unwrap())
            );
        }
    }
}

/// The launch docs/many-nodes.md shows: `SLURM_NNODES=2 SLURM_NODEID=i dsprep serve … --world-size 4
/// --micro-batch 1`, ranks 0–1 on node 0 and 2–3 on node 1.
#[test]
fn slurm_environment_places_node_daemons_and_a_rank_on_the_wrong_node_is_told_where_to_go() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = packed_multinode(tmp.path());
    let state = tmp.path().join("state");
    let daemons: Vec<Daemon> = (0..2)
        .map(|node| {
            let endpoint = format!(
                "ipc://{}",
                tmp.path().join(format!("n{node}.sock")).display()
            );
            let mut child = Command::new(env!("CARGO_BIN_EXE_dsprep"));
            child
                .env("SLURM_NNODES", "2")
                .env("SLURM_NODEID", node.to_string());
            Daemon::start_cmd(
                child,
                &multinode(),
                &endpoint,
                &[
                    "--world-size",
                    "4",
                    "--micro-batch",
                    "1",
                    "--state-dir",
                    state.to_str().unwrap(),
                    "--metrics",
                    "off",
                ],
            )
            .unwrap()
        })
        .collect();
    assert!(
        daemons[1]
            .log_text()
            .contains("node 1 of 2 (from SLURM_NODEID/SLURM_NNODES)")
    );
    let steps = 20;
    let outs = tap_all(
        tmp.path(),
        &[&daemons[0], &daemons[1]],
        4,
        0,
        steps,
        "r",
        &[],
    );
    for (rank, out) in (0..4u32).zip(outs) {
        let want = expected_rank_bytes(&whole, 4, 1, u64::from(rank));
        let got = std::fs::read(&out).unwrap();
        assert!(
            got.len() <= want.len() && got == want[..got.len()],
            "rank {rank}"
        );
        assert_eq!(headers(&out).len() as u64, steps);
    }
    let out = tmp.path().join("wrong.bin");
    let result = tap(&daemons[0].endpoint, 3, 4, 0, 1, &out)
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains(
            "rank 3 is not served here: this node daemon serves ranks 0..=1 of world size 4"
        ),
        "{stderr}"
    );
    // A second daemon given node rank 1 on the same state directory (`tmp/state`).
    let e = start_node(tmp.path(), 1, 2, 4, 1, &[])
        .map(|_| ())
        .unwrap_err();
    assert!(
        e.contains("is already served by another daemon on this state directory")
            && e.contains("node rank 1"),
        "{e}"
    );
}

#[test]
fn node_settings_that_cannot_work_are_refused_before_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let endpoint = format!("ipc://{}", tmp.path().join("x.sock").display());
    let serve = |recipe: &Path, extra: &[&str]| -> String {
        let mut args = vec![
            "serve",
            "--recipe",
            recipe.to_str().unwrap(),
            "--endpoint",
            &endpoint,
            "--metrics",
            "off",
        ];
        args.extend_from_slice(extra);
        let out = dsprep(&args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let state = tmp.path().join("s");
    let state = state.to_str().unwrap();
    let e = serve(
        &multinode(),
        &[
            "--world-size",
            "4",
            "--micro-batch",
            "1",
            "--node-rank",
            "0",
            "--nodes",
            "4",
            "--state-dir",
            state,
        ],
    );
    assert!(
        e.contains("4 nodes cannot split a global batch of 4 windows into whole blocks of lanes.block_windows = 2"),
        "{e}"
    );
    let e = serve(
        &multinode(),
        &[
            "--world-size",
            "8",
            "--micro-batch",
            "1",
            "--node-rank",
            "0",
            "--nodes",
            "2",
        ],
    );
    assert!(
        e.contains("pass --state-dir on a filesystem every node shares"),
        "{e}"
    );
    let e = serve(
        &repo_root().join("config/quickstart.toml"),
        &[
            "--world-size",
            "8",
            "--micro-batch",
            "1",
            "--node-rank",
            "1",
            "--nodes",
            "2",
        ],
    );
    assert!(e.contains("the recipe has no [lanes]"), "{e}");
    let e = serve(
        &multinode(),
        &[
            "--world-size",
            "6",
            "--micro-batch",
            "1",
            "--node-rank",
            "1",
            "--nodes",
            "4",
            "--state-dir",
            state,
        ],
    );
    assert!(
        e.contains("world size 6 cannot be split over 4 nodes"),
        "{e}"
    );
}

/// World 8 with tensor parallel 2: four data-parallel ranks, on two node daemons. Both ranks of a
/// TP group receive identical bytes, and the four DP ranks together receive the stream.
#[test]
fn tensor_parallel_ranks_share_their_data_parallel_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = packed_multinode(tmp.path());
    let daemons = start_nodes(tmp.path(), 2, 4, 2, &["--metrics", "off"]);
    // Eight trainer ranks in lock step (a barrier per step stands in for the collectives that
    // keep model-parallel peers together), each with the Rust client.
    let steps = 10u64;
    let barrier = std::sync::Barrier::new(8);
    let received: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8u32)
            .map(|rank| {
                // Ranks 0–3 are DP ranks 0–1, on node 0; ranks 4–7 are DP ranks 2–3, on node 1.
                let endpoint = daemons[(rank / 4) as usize].endpoint.clone();
                let barrier = &barrier;
                scope.spawn(move || {
                    let config = dsprep_client::ClientConfig {
                        endpoint,
                        rank,
                        world_size: 8,
                        recipe_hash: None,
                        timeout: std::time::Duration::from_secs(10),
                        attempts: 3,
                        parallel: dsprep_client::Parallelism {
                            tensor: 2,
                            ..Default::default()
                        },
                        session: None,
                        curve: None,
                    };
                    let mut client = dsprep_client::Client::with_config(config).unwrap();
                    assert_eq!(client.data_parallel(), (rank / 2, 4));
                    let mut bytes = Vec::new();
                    for _ in 0..steps {
                        let batch = client.next_batch().unwrap().expect("a step");
                        bytes.extend_from_slice(batch.tokens().as_bytes());
                        barrier.wait();
                    }
                    bytes
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for dp in 0..4usize {
        assert!(
            received[2 * dp] == received[2 * dp + 1],
            "TP pair of DP rank {dp} differs"
        );
        let mut want = expected_rank_bytes(&whole, 4, 2, dp as u64);
        want.truncate(received[2 * dp].len());
        assert_eq!(received[2 * dp].len() as u64, steps * 2 * 513 * 2);
        assert!(
            received[2 * dp] == want,
            "DP rank {dp} is not its slice of the stream"
        );
    }
}

#[test]
fn plan_shows_how_the_input_is_dealt_to_the_lanes() {
    let text = dsprep_ok(&["plan", "--recipe", multinode().to_str().unwrap()]);
    assert!(text.contains("lanes: 8, 2 windows per block"), "{text}");
    let lanes: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("lane "))
        .collect();
    assert_eq!(lanes.len(), 8, "{text}");
    // Every unit is dealt once: the units per lane add up to the sources' row groups and files.
    let units: usize = lanes
        .iter()
        .map(|l| {
            l.split_whitespace()
                .nth(2)
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert_eq!(units, 26, "{text}");
}

/// One of two node daemons is killed with SIGKILL and restarted alone with `--resume latest`
/// while the other keeps serving; then the whole job restarts on one node. Every rank's bytes
/// are the uninterrupted stream's.
#[test]
fn a_killed_node_daemon_resumes_alone_and_the_job_resumes_on_another_node_count() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = packed_multinode(tmp.path());
    let want: Vec<Vec<u8>> = (0..4)
        .map(|r| expected_rank_bytes(&whole, 4, 1, r))
        .collect();
    let row = 513 * 2;
    let marks = chain_marks(&whole, 120 * 4);
    let every = ["--metrics", "off", "--checkpoint-every", "3"];
    let mut daemons = start_nodes(tmp.path(), 2, 4, 1, &every);
    let first = tap_all_bytes(tmp.path(), &[&daemons[0], &daemons[1]], 0, 60, "a", &marks);
    daemons[1].child.kill().unwrap();
    daemons[1].child.wait().unwrap();
    let resume = [
        "--metrics",
        "off",
        "--resume",
        "latest",
        "--checkpoint-every",
        "3",
    ];
    let node1 = start_node(tmp.path(), 1, 2, 4, 1, &resume).unwrap();
    let second = tap_all_bytes(tmp.path(), &[&daemons[0], &node1], 60, 40, "b", &marks);
    // Node 1 runs the odd lanes (2 blocks per step of 4 windows, 2 nodes); those that had
    // written a checkpoint by the kill continue from it, the others recompute from their start.
    let log = node1.log_text();
    assert!(log.contains("lanes [1, 3, 5, 7] of 8"), "{log}");
    assert!(
        log.contains(": resuming from"),
        "no lane checkpoint was used: {log}"
    );
    // A graceful stop this time (SIGTERM): each lane writes its newest reached snapshot.
    let mut node1 = node1;
    node1.terminate();
    daemons[0].terminate();
    drop(daemons);
    let one = start_node(tmp.path(), 0, 1, 4, 1, &resume).unwrap();
    let mut third = tap_all_bytes(tmp.path(), &[&one], 100, 4, "c", &marks);
    // A rank whose request was lost with the stopped job and asks late, below where the others
    // placed the resumed daemon (step 100), still finds its steps: the 8 below the first step
    // asked for are held, as an uninterrupted daemon holds them.
    let late = tmp.path().join("late.bin");
    let result = tap_with(&one.endpoint, 2, 4, 96, 3, &late, &[])
        .wait_with_output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(std::fs::read(&late).unwrap() == want[2][96 * row..99 * row]);
    let rest = tap_all_bytes(tmp.path(), &[&one], 104, 16, "d", &marks);
    for (rank, bytes) in rest.into_iter().enumerate() {
        third[rank].extend(bytes);
    }
    // A trainer whose stream stood elsewhere before step 119 is refused, loudly.
    let out = tmp.path().join("wrong.bin");
    let wrong = ["--expect-chain", &marks[118 * 4]];
    let result = tap_with(&one.endpoint, 0, 4, 119, 1, &out, &wrong)
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    let message = format!(
        "stream chain: the stream this trainer consumed stands at {} before step 119, the \
         daemon's step 119 starts from {}: the daemon is not continuing the same stream",
        marks[118 * 4],
        marks[119 * 4]
    );
    assert!(
        !result.status.success() && stderr.contains(&message),
        "{stderr}"
    );
    // One node runs all 8 lanes, from the checkpoints the two nodes left.
    let log = one.log_text();
    assert!(log.contains("the first request is for step 100"), "{log}");
    let resumed = (0..8)
        .filter(|lane| log.contains(&format!("lane {lane}: resuming from")))
        .count();
    assert!(
        resumed >= 4,
        "{resumed} of 8 lanes used a checkpoint: {log}"
    );
    for rank in 0..4 {
        let got = [&first[rank][..], &second[rank][..], &third[rank][..]].concat();
        assert_eq!(got.len(), 120 * row, "rank {rank}");
        assert!(
            got == want[rank][..120 * row],
            "rank {rank}: the resumed bytes differ"
        );
    }
}

/// The state directory records every window's digest: a node whose recomputed windows differ
/// from that record (here the record is damaged; in life the inputs changed under the same state
/// directory) serves nothing and says which file and window.
#[test]
fn a_node_whose_windows_differ_from_the_recorded_digests_refuses_to_serve() {
    let tmp = tempfile::tempdir().unwrap();
    let every = ["--metrics", "off", "--checkpoint-every", "2"];
    let daemons = start_nodes(tmp.path(), 2, 4, 1, &every);
    tap_all(tmp.path(), &[&daemons[0], &daemons[1]], 4, 0, 10, "a", &[]);
    for mut d in daemons {
        d.terminate();
    }
    let stream = std::fs::read_dir(tmp.path().join("state"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("lanes-")
        })
        .unwrap();
    // Step 5 is blocks 10 and 11 (4 windows, 2 per block): node 1 serves block 11, lane 3's.
    // Lane 3's first block is block 3: windows 6 and 7 of the stream.
    let digests = stream.join("windows.bin");
    let len = std::fs::metadata(&digests).unwrap().len() as usize;
    assert!(len >= 40 * 32, "10 steps of 4 windows, 32 bytes each");
    let mut bytes = std::fs::read(&digests).unwrap();
    bytes[6 * 32..8 * 32].fill(0x5a);
    std::fs::write(&digests, bytes).unwrap();

    let resume = ["--metrics", "off", "--resume", "latest"];
    let node1 = start_node(tmp.path(), 1, 2, 4, 1, &resume).unwrap();
    let out = tmp.path().join("after.bin");
    let result = tap(&node1.endpoint, 2, 4, 5, 1, &out)
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    // The resumed node holds 8 steps below the first step asked for (a rank that asks late is
    // still served), so it recomputes from the stream's start and meets lane 3's first window.
    let message = format!(
        "the daemon's pipeline failed: {}: window 6 of the stream (window 0 of lane 3) is ",
        digests.display()
    );
    assert!(!result.status.success(), "{stderr}");
    assert!(stderr.contains(&message), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "but the file holds {} from an earlier one: this is not the stream served before \
             under this state directory",
            "5a".repeat(32)
        )),
        "{stderr}"
    );
}
