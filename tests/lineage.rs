//! Changing course mid-run, end to end: real daemons SIGKILLed and resumed with an edited recipe
//! (`--change-course`), real `dsprep tap` ranks, and `dsprep pack --lineage` of the state
//! directory. What the ranks received across the changes must be exactly the packed lineage,
//! and every step below a change exactly what the old recipe served.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use std::path::{Path, PathBuf};
use support::lineage::*;
use support::serve_run::Run;
use support::*;

/// A: four sources (no finemath), a buffer of 100. B: reweighted, finemath added, a buffer of
/// 200. C: c4 removed, a buffer of 50 (its extra residents leave first).
fn three_recipes(dir: &Path) -> [PathBuf; 3] {
    let (fineweb, c4) = (
        ("weight = 0.40", "weight = 0.20"),
        ("weight = 0.15", "weight = 0.30"),
    );
    let buffer = "buffer_size = 1000";
    let a = quickstart_edit(
        dir,
        "a.toml",
        &[(buffer, "buffer_size = 100")],
        &["finemath"],
    );
    let b = quickstart_edit(
        dir,
        "b.toml",
        &[fineweb, c4, (buffer, "buffer_size = 200")],
        &[],
    );
    let c = quickstart_edit(
        dir,
        "c.toml",
        &[fineweb, c4, (buffer, "buffer_size = 50")],
        &["c4"],
    );
    [a, b, c]
}

/// A temporary folder with the three recipes and a state directory's path in it.
struct Setup {
    tmp: tempfile::TempDir,
    recipes: [PathBuf; 3],
    state: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let recipes = three_recipes(tmp.path());
        let state = tmp.path().join("state");
        Setup {
            tmp,
            recipes,
            state,
        }
    }

    /// Daemons of recipe A on the state directory, a checkpoint every `every` steps.
    fn run(&self, every: u64) -> Run<'_> {
        Run {
            dir: self.tmp.path(),
            recipe: &self.recipes[0],
            state: self.state.clone(),
            every,
        }
    }
}

#[test]
fn changes_of_course_continue_the_stream_exactly_and_pack_lineage_replays_them() {
    let setup = Setup::new();
    let (tmp, state) = (&setup.tmp, &setup.state);
    let [a, b, c] = &setup.recipes;
    let run = setup.run(7);
    let mut got = Vec::new();
    // A to step 40, SIGKILL.
    let daemon = run.start(2, 2, false).unwrap();
    assert!(state.join("lineage.json").exists(), "written at the start");
    got.extend(run.pull(&daemon, 2, 0, 40));
    drop(daemon);
    // B from step 40 (weights changed, finemath added), SIGKILL at step 67.
    let daemon = change(&run, b, 2, 2);
    got.extend(run.pull(&daemon, 2, 40, 27));
    let log = daemon.log_text();
    assert!(
        log.contains("changed course at step 40 (window 160, document "),
        "{log}"
    );
    assert!(
        !log.contains("no checkpoint near below"),
        "made on the way: {log}"
    );
    drop(daemon);
    // B again (a plain resume), to step 100.
    let daemon = run.start_with(b, 2, 2, &["--resume", "latest"]).unwrap();
    got.extend(run.pull(&daemon, 2, 67, 33));
    drop(daemon);
    // C from step 100 (c4 removed) with the global batch grown from 4 to 8 windows.
    let daemon = change(&run, c, 4, 2);
    got.extend(run.pull(&daemon, 4, 100, 30));
    let log = daemon.log_text();
    assert!(
        log.contains(
            "documents drawn but not emitted of sources it no longer draws from, dropped: \"c4\" "
        ),
        "{log}"
    );
    drop(daemon);

    let lineage: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("lineage.json")).unwrap()).unwrap();
    let segments = lineage["lineage"]["segments"].as_array().unwrap();
    let starts: Vec<(u64, u64, u64)> = (segments.iter())
        .map(|s| {
            let n = |k: &str| s[k].as_u64().unwrap();
            (n("from_step"), n("from_window"), n("global_batch"))
        })
        .collect();
    assert_eq!(starts, [(0, 0, 4), (40, 160, 4), (100, 400, 8)]);

    // Offline equals served: the packed lineage is what the ranks got, window for window.
    let packed = tmp.path().join("packed");
    let data = pack_lineage(state, &packed);
    assert_eq!(got.len(), 640 * 513 * 2);
    assert!(
        got == windows(&data, 0..640),
        "the served stream differs from the packed lineage"
    );
    let manifest = data.manifest();
    let recorded: Vec<u64> = (manifest.lineage.as_ref().unwrap().iter())
        .map(|s| s.from_window)
        .collect();
    assert_eq!(recorded, [0, 160, 400]);
    // The ledger per segment: what each recipe drew, and what the change to C dropped (the
    // log's count), all of it adding up to the whole stream's counts.
    let segments = manifest.lineage.as_ref().unwrap();
    let documents = |k: usize, name: &str| -> u64 {
        let source = segments[k].sources.iter().find(|s| s.name == name);
        source.unwrap().documents
    };
    assert_eq!(documents(0, "finemath"), 0);
    assert!(documents(1, "finemath") > 0);
    assert_eq!(documents(2, "c4"), 0);
    assert!(documents(2, "fineweb-edu") > 0);
    let dropped: u64 = log
        .split("dropped: \"c4\" ")
        .nth(1)
        .and_then(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    assert_eq!(
        segments[2].dropped,
        [dsprep_client::format::DroppedDocuments {
            source: "c4".into(),
            documents: dropped
        }]
    );
    let all: u64 = (segments.iter())
        .flat_map(|s| s.sources.iter().map(|x| x.documents))
        .sum();
    assert_eq!(
        all,
        manifest.sources.iter().map(|s| s.documents).sum::<u64>()
    );
    let verified = dsprep_ok(&[
        "verify",
        packed.to_str().unwrap(),
        "--lineage",
        state.to_str().unwrap(),
    ]);
    assert!(verified.contains("packs the lineage"), "{verified}");
    let shown = dsprep_ok(&["plan", "--lineage", state.to_str().unwrap()]);
    assert!(
        shown.contains("segment 2: recipe ") && shown.contains(" from step 100 (window 400, "),
        "{shown}"
    );
    let mix = dsprep_ok(&["inspect", packed.to_str().unwrap(), "--mix"]);
    assert!(mix.contains("segment 2 (from step 100)"), "{mix}");
    // Steps below the first change are exactly recipe A's stream; after it, they are not.
    let plain = pack_dataset(a, &tmp.path().join("packed-a"));
    let err = dsprep_fails(&[
        "verify",
        tmp.path().join("packed-a").to_str().unwrap(),
        "--lineage",
        state.to_str().unwrap(),
    ]);
    assert!(err.contains("packs one recipe, not a lineage"), "{err}");
    assert!(windows(&plain, 0..160) == windows(&data, 0..160));
    assert!(windows(&plain, 160..200) != windows(&data, 160..200));
    // The sources' ids hold over the lineage: c4 is still source 1, finemath came in as 4.
    let names: Vec<&str> = manifest.sources.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["fineweb-edu", "c4", "zyda-2", "the-stack-v2", "finemath"]
    );

    // A rollback below the change at step 100 (to step 90, in B's stretch at 4 windows a
    // step) reproduces the lineage's bytes, recomputed from its start through the first change.
    let daemon = run.start_with(c, 2, 2, &["--resume", "latest"]).unwrap();
    let again = run.pull(&daemon, 2, 90, 10);
    assert!(again == windows(&data, 360..400), "the rollback differs");
}

#[test]
fn a_change_far_from_a_checkpoint_and_one_below_an_earlier_change_replay_exactly() {
    let setup = Setup::new();
    let (tmp, state) = (&setup.tmp, &setup.state);
    let [_, b, c] = &setup.recipes;
    let d = quickstart_edit(
        tmp.path(),
        "d.toml",
        &[
            ("weight = 0.30", "weight = 0.60"),
            ("buffer_size = 1000", "buffer_size = 100"),
        ],
        &["finemath"],
    );
    let run = setup.run(7);
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 40);
    drop(daemon);
    let daemon = change(&run, b, 2, 2);
    run.pull(&daemon, 2, 40, 30);
    drop(daemon);
    // At step 45 no checkpoint of B's is below the step (its first is at 47): the change is
    // found by a run through the change at 40 first.
    let daemon = change(&run, c, 2, 2);
    run.pull(&daemon, 2, 45, 15);
    let log = daemon.log_text();
    assert!(
        log.contains("changed course at step 45 (window 180, "),
        "{log}"
    );
    assert!(log.contains("no checkpoint near below step 45"), "{log}");
    drop(daemon);
    // The trainers roll back to step 30, below the change at 40, with recipe D: the branch
    // from 40 on is replaced (kept in the file, its checkpoints removed).
    let daemon = change(&run, &d, 2, 2);
    got.truncate(30 * 4 * 513 * 2);
    got.extend(run.pull(&daemon, 2, 30, 20));
    drop(daemon);
    let text = std::fs::read_to_string(state.join("lineage.json")).unwrap();
    let lineage: serde_json::Value = serde_json::from_str(&text).unwrap();
    let steps = |key: &str| -> Vec<u64> {
        (lineage["lineage"][key].as_array().unwrap().iter())
            .map(|s| s["from_step"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        (steps("segments"), steps("abandoned")),
        (vec![0, 30], vec![40, 45])
    );
    let packed = tmp.path().join("packed");
    let lineage_file = state.join("lineage.json");
    let data = pack_lineage(&lineage_file, &packed);
    assert!(
        got == windows(&data, 0..200),
        "the replaced branch's stream differs"
    );
}

#[test]
fn best_fit_changes_course_with_its_pool_and_packs_the_same_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let best_fit = (
        "seq_len = 512",
        "seq_len = 512\nstrategy = \"best_fit\"\npool_documents = 64",
    );
    let buffer = ("buffer_size = 1000", "buffer_size = 100");
    let a = quickstart_edit(tmp.path(), "a.toml", &[best_fit, buffer], &["finemath"]);
    let b = quickstart_edit(
        tmp.path(),
        "b.toml",
        &[best_fit, buffer, ("weight = 0.40", "weight = 0.10")],
        &[],
    );
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 3,
    };
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 25);
    drop(daemon);
    let daemon = change(&run, &b, 2, 2);
    got.extend(run.pull(&daemon, 2, 25, 25));
    let log = daemon.log_text();
    assert!(
        log.contains("changed course at step 25 (window 100, "),
        "{log}"
    );
    drop(daemon);
    let packed = tmp.path().join("packed");
    let data = pack_lineage(&run.state, &packed);
    assert!(
        got == windows(&data, 0..200),
        "best_fit: served and packed differ"
    );
    assert!(
        data.manifest().packing.is_some(),
        "padded windows (format 5)"
    );
    // Its windows do not say where each document was mixed (no doc_positions.u64), and A's pool
    // carries A's documents past window 100: `inspect --mix` shows each segment as the pack's
    // ledger counted it while its recipe drew, from the window it takes over at.
    let mix = dsprep_ok(&["inspect", packed.to_str().unwrap(), "--mix"]);
    let segment = |k: usize| -> (u64, u64) {
        let s = &data.manifest().lineage.as_ref().unwrap()[k];
        (
            s.sources.iter().map(|x| x.tokens).sum(),
            s.sources.iter().map(|x| x.documents).sum(),
        )
    };
    let as_drawn = "documents as its recipe drew them (the pack's ledger: its windows do not say \
                    where a best_fit document was mixed) (targets are shares of documents)";
    let spans: Vec<&str> = mix.lines().filter(|l| l.starts_with("segment ")).collect();
    let ((t0, d0), (t1, d1)) = (segment(0), segment(1));
    assert_eq!(
        spans,
        [
            format!("segment 0 (from step 0): tokens 0..51300, {t0} tokens and {d0} {as_drawn}"),
            format!(
                "segment 1 (from step 25): tokens 51300..the end, {t1} tokens and {d1} {as_drawn}"
            ),
        ],
        "{mix}"
    );
}

#[test]
fn edits_that_cannot_be_honoured_are_refused_and_change_nothing() {
    let setup = Setup::new();
    let (tmp, state) = (&setup.tmp, &setup.state);
    let [_, b, _] = &setup.recipes;
    let run = setup.run(500);
    // Killed before its first checkpoint: the lineage still knows what was served.
    let daemon = run.start(2, 2, false).unwrap();
    run.pull(&daemon, 2, 0, 12);
    drop(daemon);
    let files = || dir_bytes(state);
    let before = files();
    assert!(before.iter().all(|(name, _)| !name.ends_with(".ckpt")));

    let err = run
        .start_with(b, 2, 2, &["--resume", "latest"])
        .err()
        .unwrap();
    assert!(
        err.contains(&format!(
            "error: cannot resume from the stream in {}: the stream's recipe (from step 0) is ",
            state.display()
        )) && err.contains("add --change-course (docs/serving.md#changing-course)"),
        "{err}"
    );
    let bad = quickstart_edit(
        tmp.path(),
        "bad.toml",
        &[
            ("seq_len = 512", "seq_len = 1024"),
            ("seed = 1234", "seed = 99"),
            ("buffer_size = 1000", "buffer_size = 100"),
        ],
        &["finemath"],
    );
    let err = change_fails(&run, &bad);
    assert!(
        err.contains(&format!(
            "cannot change course to recipe {} (",
            bad.display()
        )) && err.contains(
            "): 2 edit(s) cannot be honoured:\n  packing.seq_len: 512 → 1024: a window's size is \
             fixed for the stream (checkpoints, steps and the trainers' batches are counted in \
             windows)\n  shuffle.seed: 1234 → 99: the seed decides every draw of the stream so \
             far; keep 1234\nnothing was served and the state directory is unchanged"
        ),
        "{err}"
    );
    let moved = quickstart_edit(
        tmp.path(),
        "moved.toml",
        &[
            ("c4-train.*.json.gz", "c4-train.00000-of-00003.json.gz"),
            ("buffer_size = 1000", "buffer_size = 100"),
        ],
        &["finemath"],
    );
    let err = change_fails(&run, &moved);
    assert!(
        err.contains("1 edit(s) cannot be honoured:\n  source \"c4\": its files, format, text field or content are how its cursor counts"),
        "{err}"
    );
    assert!(
        files() == before,
        "a refused attempt changed the state directory"
    );

    // A pack of a lineage that is not there says so.
    let missing = tmp.path().join("no-state");
    let err = dsprep_fails(&[
        "pack",
        "--lineage",
        missing.to_str().unwrap(),
        "--out",
        tmp.path().join("never").to_str().unwrap(),
    ]);
    assert!(
        err.contains(&format!(
            "error: {} does not exist: give a daemon's --state-dir, or the lineage.json in it",
            missing.display()
        )),
        "{err}"
    );
    // A lineage torn or edited by hand is refused by name.
    let path = state.join("lineage.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"weight\": 0.15", "\"weight\": 0.16")).unwrap();
    let err = run.start(2, 2, true).err().unwrap();
    assert!(
        err.contains(&format!(
            "lineage {} is not usable: its content does not match its sha256",
            path.display()
        )),
        "{err}"
    );
}

/// best_fit mixed in tokens: a change at step 25 grows the pool (64 → 256) and adds a phase;
/// the ranks get exactly `pack --lineage`'s windows, whose ledger counts each document in the
/// phase of its mixing position. (A switch of packing strategy and a smaller pool are allowed:
/// tests/lineage_packing.rs.)
#[test]
fn a_best_fit_change_grows_its_pool_and_adds_a_phase() {
    let tmp = tempfile::tempdir().unwrap();
    let in_tokens = ("[mix]\n", "[mix]\nunit = \"tokens\"\n");
    let pool = |n: u32| {
        (
            "seq_len = 512",
            format!("seq_len = 512\nstrategy = \"best_fit\"\npool_documents = {n}"),
        )
    };
    let edit = |name: &str, packing: (&str, String), phase: bool| -> PathBuf {
        let path = quickstart_edit(tmp.path(), name, &[in_tokens, (packing.0, &packing.1)], &[]);
        if phase {
            let mut text = std::fs::read_to_string(&path).unwrap();
            text.push_str(
                "\n[[mix.phase]]\nat_tokens = 300000\n\
                 weights = { finemath = 0.3, the-stack-v2 = 0.3, fineweb-edu = 0.4 }\n",
            );
            std::fs::write(&path, text).unwrap();
        }
        path
    };
    let a = edit("a.toml", pool(64), false);
    let b = edit("b.toml", pool(256), true);
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 3,
    };
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 25);
    drop(daemon);
    let daemon = change(&run, &b, 2, 2);
    got.extend(run.pull(&daemon, 2, 25, 200));
    let log = daemon.log_text();
    assert!(
        log.contains("changed course at step 25 (window 100, "),
        "{log}"
    );
    drop(daemon);
    let data = pack_lineage(&run.state, &tmp.path().join("packed"));
    // Steps 0..225: past the phase's point (300 000 tokens, about window 585).
    assert!(
        got == windows(&data, 0..900),
        "best_fit with a larger pool and a phase: served and packed differ"
    );
    let m = data.manifest();
    assert_eq!(m.packing.as_ref().unwrap().pool_documents, 256);
    assert!(m.packing.as_ref().unwrap().pool_peak_documents > 64);
    assert!(m.doc_positions.is_some());
    assert_eq!(m.phases.len(), 2);
    // c4 and zyda-2 leave the mix at the phase: none of their documents counts in it.
    for name in ["c4", "zyda-2"] {
        let s = (m.phases[1].sources.iter())
            .find(|s| s.name == name)
            .unwrap();
        assert_eq!((s.tokens, s.documents), (0, 0), "{name}");
    }
    let tokens: u64 = m.phases.iter().map(|p| p.tokens).sum();
    assert_eq!(tokens, m.sources.iter().map(|s| s.tokens).sum::<u64>());
    assert!(
        dsprep_ok(&["verify", tmp.path().join("packed").to_str().unwrap()]).starts_with("ok: ")
    );
    // `inspect --mix` counts each segment's documents by mixing position, as the pack's ledger
    // did while each recipe drew them: A's pool carries A's documents past window 100, and
    // they stay A's (each segment's tokens are its ledger's). B's span begins where its first
    // document lies: window 101, the pool's A documents filling window 100.
    let mix = dsprep_ok(&[
        "inspect",
        tmp.path().join("packed").to_str().unwrap(),
        "--mix",
    ]);
    let segment_tokens = |k: usize| -> u64 {
        let segment = &m.lineage.as_ref().unwrap()[k];
        segment.sources.iter().map(|s| s.tokens).sum()
    };
    let spans: Vec<&str> = mix.lines().filter(|l| l.starts_with("segment ")).collect();
    assert_eq!(
        spans,
        [
            format!(
                "segment 0 (from step 0): tokens 0..51813, {} tokens and 153 \
                 document starts in windows (targets are shares of tokens)",
                segment_tokens(0)
            ),
            format!(
                "segment 1 (from step 25): tokens 51813..the end, {} tokens and \
                 1474 document starts in windows (targets are shares of tokens)",
                segment_tokens(1)
            ),
        ],
        "{mix}"
    );
}
