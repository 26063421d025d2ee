//! `[packing] strategy = "best_fit"` end to end, on every driver: the same windows at any thread
//! count, served == packed for 8 ranks, 2 and 4 node daemons and lane parts + finish == one pack,
//! SIGKILL + `--resume latest` and a world-size change == the uninterrupted stream; old clients
//! refused; bad settings refused with the field named. `best_fit` with `[[mix.phase]]`:
//! `best_fit_phases.rs`.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::{PackedDataset, ReadError};
use sha2::Digest;
use std::path::{Path, PathBuf};
use support::daemon::{
    Daemon, assert_tap_chains, chain_marks, expected_rank_bytes, headers, tap_all,
};
use support::nodes::{multinode, node_args};
use support::serve_run::{Run, global_batches};
use support::*;

const BEST_FIT: &str = "seq_len = 512\nstrategy = \"best_fit\"\npool_documents = 300\n";

/// The quickstart (or `base`) packed best-fit with a pool of 300 documents.
fn best_fit_recipe(base: &Path, dir: &Path, name: &str) -> PathBuf {
    let replace = [("seq_len = 512", BEST_FIT.trim_end())];
    recipe_variant(base, dir, name, &replace)
}

/// Every window of `data` with its real-token count, as the ranks' headers list them.
fn real_tokens(data: &PackedDataset) -> Vec<u32> {
    (0..data.num_windows())
        .map(|w| data.window(w).unwrap().real_tokens)
        .collect()
}

#[test]
fn best_fit_packs_whole_documents_the_same_at_any_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = best_fit_recipe(&quickstart(), tmp.path(), "bf.toml");
    let (one, two) = (tmp.path().join("t1"), tmp.path().join("t2"));
    let said = dsprep_ok(&pack_args(&recipe, &one, &["--threads", "1"]));
    dsprep_ok(&pack_args(&recipe, &two, &["--threads", "2"]));
    assert!(dir_bytes(&one) == dir_bytes(&two), "1 and 2 threads differ");
    assert!(
        said.contains("packing: best_fit, pool of 300 documents: padding "),
        "{said}"
    );
    assert!(said.contains("dropped tail: 0 tokens"), "{said}");

    let data = PackedDataset::open(&one).unwrap();
    let m = data.manifest();
    assert_eq!(m.format_version, 5);
    let packing = m.packing.clone().unwrap();
    assert_eq!(
        (packing.strategy.as_str(), packing.pool_documents),
        ("best_fit", 300)
    );
    assert_eq!(packing.pad_id, 50256, "the EOS pads by default");
    let window = u64::from(m.window_tokens);
    let reals = real_tokens(&data);
    let padding: u64 = reals.iter().map(|&r| window - u64::from(r)).sum();
    assert_eq!(padding, packing.padding_tokens);
    assert!(
        reals.iter().any(|&r| u64::from(r) < window),
        "some window is padded"
    );
    assert!(
        padding * 100 < m.num_windows * window,
        "padding under 1 %: {padding} of {}",
        m.num_windows * window
    );
    // Only documents longer than a window are cut, into pieces: the-stack-v2 has such files.
    assert!(packing.documents_cut > 0 && packing.cut_pieces > packing.documents_cut);
    assert!(packing.pool_peak_documents <= 300);
    // Every token the sources produced is in a window: nothing is dropped at the end.
    let produced: u64 = m.sources.iter().map(|s| s.tokens).sum();
    assert_eq!(produced, reals.iter().map(|&r| u64::from(r)).sum::<u64>());
    assert!(dsprep_ok(&["verify", one.to_str().unwrap()]).starts_with("ok: "));
    let inspect = dsprep_ok(&["inspect", one.to_str().unwrap(), "--mix"]);
    assert!(
        inspect.contains(", cut across windows: 0 (0.0%)"),
        "{inspect}"
    );
    // The concat pack of the same quickstart cuts documents that would fit a window.
    let concat = tmp.path().join("concat");
    dsprep_ok(&pack_args(&quickstart(), &concat, &[]));
    let inspect = dsprep_ok(&["inspect", concat.to_str().unwrap(), "--mix"]);
    assert!(
        inspect.contains("documents that fit in a window: 751, cut across windows: 392 (52.2%)"),
        "{inspect}"
    );
}

#[test]
fn eight_served_ranks_get_the_packed_best_fit_windows_and_old_clients_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = best_fit_recipe(&quickstart(), tmp.path(), "bf.toml");
    let data = pack_dataset(&recipe, &tmp.path().join("packed"));
    let daemon = Daemon::start(tmp.path(), &recipe, 8, 1, 4);
    let num_steps = data.num_windows() / 8;
    let outs = tap_all(tmp.path(), &[&daemon], 8, 0, num_steps + 1, "rank", &[]);
    let marks = chain_marks(&data, data.num_windows());
    let reals = real_tokens(&data);
    for (rank, out) in outs.iter().enumerate() {
        assert_eq!(assert_tap_chains(out, &marks), num_steps as usize);
        let got = std::fs::read(out).unwrap();
        assert!(
            got == expected_rank_bytes(&data, 8, 1, rank as u64),
            "rank {rank}"
        );
        for h in headers(out).iter().filter(|h| h["end_of_data"] != true) {
            let w = h["first_window"].as_u64().unwrap() as usize;
            assert_eq!(
                h["real_tokens"],
                serde_json::json!([reals[w]]),
                "window {w}"
            );
        }
    }
    let padding = daemon.metric("dsprep_padding_tokens_total");
    assert_eq!(
        padding,
        data.manifest().packing.as_ref().unwrap().padding_tokens as f64
    );
    assert!(daemon.metric("dsprep_documents_cut_total") > 0.0);

    // A protocol v3 client would train on the padding: refused, with what to do.
    let message = support::daemon::refused_v3(&daemon, 8);
    assert!(
        message.contains("best_fit windows that end in padding, which a protocol v3 client would train on as tokens"),
        "{message}"
    );
}

#[test]
fn node_daemons_and_lane_parts_give_exactly_the_packed_best_fit_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = best_fit_recipe(&multinode(), tmp.path(), "bf-lanes.toml");
    let whole = tmp.path().join("whole");
    dsprep_ok(&pack_args(&recipe, &whole, &[]));
    let data = PackedDataset::open(&whole).unwrap();
    let (world, mb) = (8u32, 2u32);
    let num_steps = data.num_windows() / u64::from(world * mb);
    let marks = chain_marks(&data, data.num_windows());
    for nodes in [2u32, 4] {
        let dir = tmp.path().join(format!("n{nodes}"));
        std::fs::create_dir_all(&dir).unwrap();
        let daemons: Vec<Daemon> = (0..nodes)
            .map(|node| {
                let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
                let extra = ["--threads", "1", "--metrics", "off"];
                let args = node_args(&dir, node, nodes, world, mb, &extra);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Daemon::start_with(&recipe, &endpoint, &args).unwrap()
            })
            .collect();
        let of: Vec<&Daemon> = daemons.iter().collect();
        let outs = tap_all(&dir, &of, world, 0, num_steps + 1, "rank", &[]);
        for (rank, out) in outs.iter().enumerate() {
            assert_eq!(
                assert_tap_chains(out, &marks),
                num_steps as usize,
                "{nodes} nodes"
            );
            let want = expected_rank_bytes(&data, u64::from(world), u64::from(mb), rank as u64);
            assert!(
                std::fs::read(out).unwrap() == want,
                "{nodes} nodes, rank {rank}"
            );
        }
    }
    let parts = tmp.path().join("parts");
    for part in 0..4 {
        dsprep_ok(&pack_args(
            &recipe,
            &parts,
            &["--part", &part.to_string(), "--parts", "4"],
        ));
    }
    dsprep_ok(&pack_args(&recipe, &parts, &["--finish"]));
    assert!(
        dir_bytes(&parts) == dir_bytes(&whole),
        "parts + finish differ from one pack"
    );
    assert!(dsprep_ok(&["verify", parts.to_str().unwrap()]).starts_with("ok: "));
}

#[test]
fn a_killed_best_fit_daemon_resumes_exactly_and_at_another_world_size() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = best_fit_recipe(&quickstart(), tmp.path(), "bf.toml");
    let data = pack_dataset(&recipe, &tmp.path().join("packed"));
    let run = Run {
        dir: tmp.path(),
        recipe: &recipe,
        state: tmp.path().join("state"),
        every: 7,
    };
    let num_steps = data.num_windows() / 8;
    // SIGKILLed before the first checkpoint, in the middle, near the end; then at world 4
    // (micro batch 2, the same global batch of 8) to the end.
    let mut got = Vec::new();
    let mut from = 0;
    let layouts = [
        (8u32, 1u32, 3u64),
        (8, 1, 151),
        (8, 1, num_steps * 4 / 5),
        (4, 2, num_steps),
    ];
    for (k, (world, mb, to)) in layouts.into_iter().enumerate() {
        let daemon = run.start(world, mb, k > 0).unwrap();
        got.extend(run.pull(&daemon, world, from, to - from));
        if k > 1 {
            assert!(
                daemon.log_text().contains("resuming from checkpoint"),
                "{}",
                daemon.log_text()
            );
        }
        drop(daemon); // SIGKILL
        from = to;
    }
    assert!(
        got == global_batches(&data, 8, 0..num_steps),
        "the resumed best_fit stream differs from the uninterrupted one"
    );
    // The checkpoints carry the pool (version 3).
    let newest = std::fs::read_dir(&run.state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .max()
        .unwrap();
    assert_eq!(&std::fs::read(&newest).unwrap()[..8], b"DSPCKPT3");
}

/// Node daemons of a best_fit lanes recipe: one SIGKILLed and resumed from its lanes'
/// checkpoints (their pools in them), then the whole job restarted on one node: every rank's
/// bytes are the packed stream's.
#[test]
fn a_killed_best_fit_node_daemon_resumes_and_the_job_resumes_on_another_node_count() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = best_fit_recipe(&multinode(), tmp.path(), "bf-lanes.toml");
    let whole = tmp.path().join("whole");
    dsprep_ok(&pack_args(&recipe, &whole, &[]));
    let data = PackedDataset::open(&whole).unwrap();
    let marks = chain_marks(&data, data.num_windows());
    let node = |node: u32, nodes: u32, resume: bool| {
        let endpoint = format!(
            "ipc://{}",
            tmp.path().join(format!("node{node}.sock")).display()
        );
        let mut extra = vec!["--metrics", "off", "--checkpoint-every", "3"];
        if resume {
            extra.extend(["--resume", "latest"]);
        }
        let args = node_args(tmp.path(), node, nodes, 4, 1, &extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Daemon::start_with(&recipe, &endpoint, &args).unwrap()
    };
    let pull = |daemons: &[&Daemon], from: u64, steps: u64, tag: &str| -> Vec<Vec<u8>> {
        let expect = ["--expect-chain", &marks[from as usize * 4]];
        let outs = tap_all(tmp.path(), daemons, 4, from, steps, tag, &expect);
        (outs.iter())
            .map(|out| {
                assert_eq!(assert_tap_chains(out, &marks), steps as usize, "{tag}");
                std::fs::read(out).unwrap()
            })
            .collect()
    };
    let (node0, mut node1) = (node(0, 2, false), node(1, 2, false));
    let first = pull(&[&node0, &node1], 0, 40, "a");
    node1.child.kill().unwrap();
    node1.child.wait().unwrap();
    let mut node1 = node(1, 2, true);
    let second = pull(&[&node0, &node1], 40, 30, "b");
    assert!(
        node1.log_text().contains(": resuming from"),
        "{}",
        node1.log_text()
    );
    node1.terminate();
    let mut node0 = node0;
    node0.terminate();
    let one = node(0, 1, true);
    let third = pull(&[&one], 70, 30, "c");
    for rank in 0..4u64 {
        let got = [
            &first[rank as usize][..],
            &second[rank as usize],
            &third[rank as usize],
        ]
        .concat();
        let want = expected_rank_bytes(&data, 4, 1, rank);
        assert!(
            got == want[..got.len()],
            "rank {rank}: the resumed bytes differ"
        );
        assert_eq!(got.len(), 100 * 513 * 2);
    }
}

#[test]
fn bad_best_fit_settings_name_the_field_and_what_to_change() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, &str); 6] = [
        (
            "pool_documents = 300",
            "pool_documents = 0",
            "packing.pool_documents: must be at least 1",
        ),
        (
            "pool_documents = 300",
            "pool_documents = 5000000",
            "packing.pool_documents: 5000000 documents of up to 513 tokens may hold 9 GiB, over \
             the pool's cap of 4 GiB: use at most 2093063 documents at this seq_len",
        ),
        (
            "seq_len = 512",
            "seq_len = 1",
            "packing.seq_len: a window of 2 tokens holds nothing but the BOS/EOS every document \
             carries: best_fit needs seq_len of at least 2",
        ),
        (
            "pool_documents = 300",
            "pool_documents = 300\npad = 60000",
            "packing.pad = 60000 is not an id of",
        ),
        (
            "pool_documents = 300",
            "pool_documents = 300\npad = \"the\"",
            "packing.pad = \"the\" is the ordinary token \"the\" (id 1169), which text itself \
             becomes: name a special token of",
        ),
        (
            "strategy = \"best_fit\"",
            "strategy = \"concat\"",
            "packing.pool_documents: only applies to strategy = \"best_fit\"",
        ),
    ];
    let base = best_fit_recipe(&quickstart(), tmp.path(), "bf.toml");
    let with_bos = recipe_variant(
        &base,
        tmp.path(),
        "bos.toml",
        &[(
            "eos = \"<|endoftext|>\"",
            "eos = \"<|endoftext|>\"\nbos = \"<|endoftext|>\"",
        )],
    );
    for (k, (from, to, want)) in cases.into_iter().enumerate() {
        let recipe = recipe_variant(
            &with_bos,
            tmp.path(),
            &format!("bad{k}.toml"),
            &[(from, to)],
        );
        let out = tmp.path().join(format!("out{k}"));
        let err = dsprep_fails(&pack_args(&recipe, &out, &[]));
        assert!(err.contains(want), "case {k}: {err}");
        assert!(!out.exists());
    }
}

/// `verify` finds a padding token that is not the pad id, even with the shard's checksum made
/// good again.
#[test]
fn verify_finds_a_changed_pad_token() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = best_fit_recipe(&quickstart(), tmp.path(), "bf.toml");
    let out = tmp.path().join("packed");
    dsprep_ok(&pack_args(&recipe, &out, &[]));
    let data = PackedDataset::open(&out).unwrap();
    let w = (0..data.num_windows() - 1)
        .find(|&w| data.window(w).unwrap().real_tokens < 513)
        .unwrap();
    let real = u64::from(data.window(w).unwrap().real_tokens);
    drop(data);
    let shard = out.join("tokens-00000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = ((w * 513 + real) * 2) as usize;
    bytes[at..at + 2].copy_from_slice(&7u16.to_le_bytes());
    std::fs::write(&shard, &bytes).unwrap();
    let manifest = out.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    m["shards"][0]["sha256"] = digest.into();
    std::fs::write(&manifest, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let err = dsprep_fails(&["verify", out.to_str().unwrap()]);
    assert!(
        err.contains(&format!(
            "window {w}: a token after its {real} real tokens is not the pad id 50256"
        )),
        "{err}"
    );
}

#[test]
fn readers_refuse_a_newer_format_and_a_torn_real_token_file() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = best_fit_recipe(&quickstart(), tmp.path(), "bf.toml");
    let out = tmp.path().join("packed");
    dsprep_ok(&pack_args(&recipe, &out, &[]));
    let manifest = out.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace("\"format_version\": 5", "\"format_version\": 8"),
    )
    .unwrap();
    let err = PackedDataset::open(&out).err().unwrap();
    assert!(err.to_string().contains("format version 8"), "{err}");
    std::fs::write(&manifest, &text).unwrap();
    let file = out.join("real_tokens.u32");
    let mut bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 4]).unwrap();
    match PackedDataset::open(&out) {
        Err(ReadError::Size { path, .. }) => assert_eq!(path, file),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A count of 0 (the file's size intact): no window is without a document.
    bytes[..4].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    match PackedDataset::open(&out) {
        Err(ReadError::Corrupt { path, message }) => {
            assert_eq!(path, file);
            assert_eq!(
                message,
                "window 0 has 0 real tokens; a window holds 1 to 513"
            );
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}
