//! Plan once per job, not once per node: `dsprep plan --out` lists the Hub once, and pack parts
//! (simulated nodes: N = 1, 2, 4) and node daemons given `--plan` list nothing, resolve only the
//! files of their own lanes, and together download what one node downloads — with the same bytes
//! out as a pack without a plan. A plan for another recipe or of an unknown version is refused.

use super::*;
use std::collections::BTreeSet;
use support::daemon::{Daemon, expected_rank_bytes, tap_all};

/// The five Hub datasets in 4 lanes (10 files: every unit a whole file).
fn lanes_recipe(dir: &Path, hub: &FakeHub, root: &Path) -> PathBuf {
    let all: Vec<&Dataset> = DATASETS.iter().collect();
    let sources = format!(
        "[lanes]\ncount = 4\nblock_windows = 2\n{}",
        sources(&all, Some(hub), root, "repository")
    );
    let recipe = dir.join("lanes.toml");
    std::fs::write(&recipe, support::recipe(128, 50, "all_exhausted", &sources)).unwrap();
    recipe
}

fn run_ok(args: &[&str], env: &[(&str, String)]) -> String {
    let output = dsprep_env(args, env);
    assert!(
        output.status.success(),
        "dsprep {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn run_fails(args: &[&str], env: &[(&str, String)]) -> String {
    let output = dsprep_env(args, env);
    assert!(!output.status.success(), "dsprep {args:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// What one simulated node asked of the fake Hub.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Requests {
    revisions: usize,
    trees: usize,
    resolves: usize,
    /// Every request, to every host.
    all: usize,
    /// Body bytes sent, every host.
    bytes: u64,
}

fn requests(log: &[Logged]) -> Requests {
    Requests {
        revisions: count(log, |l| l.target.contains("/revision/")),
        trees: count(log, |l| l.target.contains("/tree/")),
        resolves: count(log, |l| {
            l.host == Host::Hub && l.target.contains("/resolve/")
        }),
        all: log.len(),
        bytes: log.iter().map(|l| l.bytes).sum(),
    }
}

/// The lanes a part's stdout says it packed: `part P of N: packed lanes [a, b]`.
fn packed_lanes(stdout: &str) -> Vec<usize> {
    let list = stdout
        .split("packed lanes [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap();
    list.split(", ").map(|n| n.parse().unwrap()).collect()
}

/// The distinct Hub files (repo, path) the plan deals to `lanes` (a Hub unit is a whole file).
fn planned_files(plan: &serde_json::Value, lanes: &[usize]) -> BTreeSet<(String, String)> {
    let mut files = BTreeSet::new();
    for &lane in lanes {
        let units = plan["lanes"]["lanes"][lane]["units"].as_array().unwrap();
        for (source, picks) in units.iter().enumerate() {
            for unit in picks.as_array().unwrap() {
                let shard = &plan["sources"][source]["shards"][unit.as_u64().unwrap() as usize];
                assert_eq!(shard["kind"], "hub");
                files.insert((
                    shard["repo"].as_str().unwrap().to_string(),
                    shard["path"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    files
}

/// Pack `recipe` as `parts` parts into `out` (each part's requests logged apart), then finish.
/// Returns each part's requests and the finish's.
fn pack_in_parts(
    hub: &FakeHub,
    recipe: &Path,
    out: &Path,
    parts: u32,
    plan: Option<(&Path, &serde_json::Value)>,
) -> (Vec<Requests>, Requests) {
    let mut args = vec![
        "pack".to_string(),
        "--recipe".into(),
        recipe.to_str().unwrap().into(),
        "--out".into(),
        out.to_str().unwrap().into(),
        "--threads".into(),
        "2".into(),
        "--quiet".into(),
    ];
    if let Some((path, _)) = plan {
        args.extend(["--plan".into(), path.to_str().unwrap().into()]);
    }
    let env = [endpoint(hub)];
    let mut per_part = Vec::new();
    for part in 0..parts {
        let mut part_args = args.clone();
        part_args.extend([
            "--part".into(),
            part.to_string(),
            "--parts".into(),
            parts.to_string(),
        ]);
        let part_args: Vec<&str> = part_args.iter().map(String::as_str).collect();
        hub.clear_log();
        let stdout = run_ok(&part_args, &env);
        let log = hub.log();
        let got = requests(&log);
        let resolves = resolves_per_file(&log);
        assert!(resolves.values().all(|&n| n == 1), "{resolves:?}");
        if let Some((_, frozen)) = plan {
            let files = planned_files(frozen, &packed_lanes(&stdout));
            assert_eq!(
                got.resolves,
                files.len(),
                "part {part} of {parts}: {files:?}"
            );
            for (repo, path) in &files {
                assert!(
                    resolves
                        .keys()
                        .any(|t| t.contains(repo.as_str()) && t.ends_with(path.as_str())),
                    "part {part} of {parts} resolved {repo}/{path}: {resolves:?}"
                );
            }
        }
        per_part.push(got);
    }
    let mut finish = args.clone();
    finish.push("--finish".into());
    let finish: Vec<&str> = finish.iter().map(String::as_str).collect();
    hub.clear_log();
    run_ok(&finish, &env);
    (per_part, requests(&hub.log()))
}

fn sum(parts: &[Requests]) -> Requests {
    parts.iter().fold(Requests::default(), |a, p| Requests {
        revisions: a.revisions + p.revisions,
        trees: a.trees + p.trees,
        resolves: a.resolves + p.resolves,
        all: a.all + p.all,
        bytes: a.bytes + p.bytes,
    })
}

#[test]
fn with_a_frozen_plan_no_node_lists_and_n_nodes_download_what_one_does() {
    let (hub, tmp, root) = setup();
    let recipe = lanes_recipe(tmp.path(), &hub, &root);
    let plan_file = tmp.path().join("plan.json");

    // The plan: one revision lookup per repo, one listing per source, nothing downloaded.
    hub.clear_log();
    let stdout = run_ok(
        &[
            "plan",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            plan_file.to_str().unwrap(),
        ],
        &[endpoint(&hub)],
    );
    assert!(
        stdout.contains(&format!("plan frozen into {}", plan_file.display())),
        "{stdout}"
    );
    let planning = requests(&hub.log());
    assert_eq!(
        (planning.revisions, planning.trees, planning.resolves),
        (5, 5, 0)
    );
    assert_eq!(planning.all, 10, "{:?}", hub.log());
    let frozen: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&plan_file).unwrap()).unwrap();
    assert_eq!(frozen["format"], "dsprep-plan");
    assert_eq!(frozen["version"], 1);
    assert_eq!(frozen["lanes"]["count"], 4);

    // The reference: one plain pack (it lists), and its requests.
    hub.clear_log();
    let whole = tmp.path().join("whole");
    run_ok(
        &[
            "pack",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            whole.to_str().unwrap(),
            "--threads",
            "2",
            "--quiet",
        ],
        &[endpoint(&hub)],
    );
    let plain = requests(&hub.log());
    assert_eq!((plain.revisions, plain.trees, plain.resolves), (5, 5, 10));

    let mut table = Vec::new();
    let mut one_node = None;
    for parts in [1u32, 2, 4] {
        let out = tmp.path().join(format!("planned-{parts}"));
        let (per_part, finish) =
            pack_in_parts(&hub, &recipe, &out, parts, Some((&plan_file, &frozen)));
        for (part, got) in per_part.iter().enumerate() {
            assert_eq!(
                (got.revisions, got.trees),
                (0, 0),
                "part {part} of {parts} listed: {got:?}"
            );
        }
        assert_eq!(
            finish,
            Requests::default(),
            "the finish asks the Hub nothing"
        );
        let total = sum(&per_part);
        assert_eq!(
            total.resolves, 10,
            "{parts} parts: every file resolved once"
        );
        let one = *one_node.get_or_insert(total);
        assert_eq!(
            (total.resolves, total.bytes, total.all),
            (one.resolves, one.bytes, one.all),
            "{parts} parts together ask what one part asks"
        );
        assert_eq!(
            support::dir_bytes(&out),
            support::dir_bytes(&whole),
            "{parts} parts with a plan wrote other bytes than one pack without"
        );

        // Without the plan every part lists everything again.
        let out = tmp.path().join(format!("listed-{parts}"));
        let (unplanned, _) = pack_in_parts(&hub, &recipe, &out, parts, None);
        for got in &unplanned {
            assert_eq!((got.revisions, got.trees), (5, 5));
        }
        assert_eq!(support::dir_bytes(&out), support::dir_bytes(&whole));
        table.push((parts, per_part, unplanned));
    }
    for (parts, planned, unplanned) in &table {
        for (part, (p, u)) in planned.iter().zip(unplanned).enumerate() {
            eprintln!(
                "N={parts} part {part}: with plan {} revision + {} tree + {} resolve, {} requests, \
                 {} bytes; without {} revision + {} tree + {} resolve, {} requests, {} bytes",
                p.revisions,
                p.trees,
                p.resolves,
                p.all,
                p.bytes,
                u.revisions,
                u.trees,
                u.resolves,
                u.all,
                u.bytes
            );
        }
    }
}

#[test]
fn node_daemons_with_a_plan_list_nothing_and_serve_the_packed_stream() {
    let (hub, tmp, root) = setup();
    let recipe = lanes_recipe(tmp.path(), &hub, &root);
    let plan_file = tmp.path().join("plan.json");
    run_ok(
        &[
            "plan",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            plan_file.to_str().unwrap(),
        ],
        &[endpoint(&hub)],
    );
    let out = tmp.path().join("whole");
    run_ok(
        &[
            "pack",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--plan",
            plan_file.to_str().unwrap(),
            "--quiet",
        ],
        &[endpoint(&hub)],
    );
    let whole = dsprep_client::PackedDataset::open(&out).unwrap();

    // 4 lanes, blocks of 2 windows: world 4 × micro batch 2 is 4 blocks a step, 2 per node.
    let (world, mb, nodes) = (4u32, 2u32, 2u32);
    let num_steps = whole.num_windows() / u64::from(world * mb);
    hub.clear_log();
    let state = tmp.path().join("state");
    let daemons: Vec<Daemon> = (0..nodes)
        .map(|node| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_dsprep"));
            command.env("HF_ENDPOINT", &hub.endpoint);
            command.env("HF_TOKEN_PATH", "/nonexistent/dsprep-test/token");
            command.env_remove("HF_TOKEN");
            let endpoint = format!(
                "ipc://{}",
                tmp.path().join(format!("node{node}.sock")).display()
            );
            let args = [
                "--world-size".to_string(),
                world.to_string(),
                "--micro-batch".into(),
                mb.to_string(),
                "--node-rank".into(),
                node.to_string(),
                "--nodes".into(),
                nodes.to_string(),
                "--state-dir".into(),
                state.to_str().unwrap().into(),
                "--metrics".into(),
                if node == 0 { "127.0.0.1:0" } else { "off" }.into(),
                "--threads".into(),
                "1".into(),
                "--plan".into(),
                plan_file.to_str().unwrap().into(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Daemon::start_cmd(command, &recipe, &endpoint, &args).unwrap()
        })
        .collect();
    let of: Vec<&Daemon> = daemons.iter().collect();
    let outs = tap_all(tmp.path(), &of, world, 0, num_steps + 3, "rank", &[]);
    for (rank, out) in (0..world).zip(outs) {
        let want = expected_rank_bytes(&whole, u64::from(world), u64::from(mb), u64::from(rank));
        assert!(std::fs::read(&out).unwrap() == want, "rank {rank}");
    }
    // Verified by default, and said so per Hub file in /metrics and in the log.
    let body = support::daemon::http_get(daemons[0].metrics.as_ref().unwrap());
    let series: Vec<&str> = (body.lines())
        .filter(|l| l.starts_with("dsprep_hub_input_verified{"))
        .collect();
    assert!(!series.is_empty(), "{body}");
    for line in &series {
        let file = line
            .split("file=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(
            *line,
            format!("dsprep_hub_input_verified{{file=\"{file}\",verified=\"sha256\"}} 1"),
        );
        assert!(
            daemons[0]
                .log_text()
                .contains(&format!("hub input {file}: verified sha256")),
            "{}",
            daemons[0].log_text()
        );
    }
    let logged = |d: &Daemon| d.log_text().matches("hub input hf://").count();
    assert_eq!(logged(&daemons[0]), series.len());
    assert_eq!(logged(&daemons[0]) + logged(&daemons[1]), 10);
    drop(daemons);
    let served = requests(&hub.log());
    assert_eq!((served.revisions, served.trees), (0, 0), "{served:?}");
    let resolves = resolves_per_file(&hub.log());
    assert_eq!(resolves.len(), 10, "{resolves:?}");
    assert!(resolves.values().all(|&n| n == 1), "{resolves:?}");
}

#[test]
fn a_plan_for_another_recipe_or_of_an_unknown_version_is_refused() {
    let (hub, tmp, root) = setup();
    let recipe = lanes_recipe(tmp.path(), &hub, &root);
    let plan_file = tmp.path().join("plan.json");
    let (recipe_s, plan_s) = (recipe.to_str().unwrap(), plan_file.to_str().unwrap());
    run_ok(
        &["plan", "--recipe", recipe_s, "--out", plan_s],
        &[endpoint(&hub)],
    );
    let text = std::fs::read_to_string(&plan_file).unwrap();
    let frozen: serde_json::Value = serde_json::from_str(&text).unwrap();
    let hash = frozen["recipe_hash"].as_str().unwrap().to_string();
    let out = tmp.path().join("out");
    let again = format!("write it again with `dsprep plan --recipe {recipe_s} --out {plan_s}`");
    let out_s = out.to_str().unwrap();
    let pack_with_plan = [
        "pack", "--recipe", recipe_s, "--out", out_s, "--plan", plan_s,
    ];
    let serve_with_plan = [
        "serve",
        "--recipe",
        recipe_s,
        "--world-size",
        "4",
        "--micro-batch",
        "2",
        "--metrics",
        "off",
        "--plan",
        plan_s,
    ];

    // Another recipe: the same sources with another seed.
    let other = tmp.path().join("other.toml");
    std::fs::write(
        &other,
        std::fs::read_to_string(&recipe)
            .unwrap()
            .replace("seed = 7", "seed = 8"),
    )
    .unwrap();
    let other_hash = run_ok(
        &["plan", "--recipe", other.to_str().unwrap()],
        &[endpoint(&hub)],
    )
    .split(['(', ')'])
    .nth(1)
    .unwrap()
    .to_string();
    hub.clear_log();
    let e = run_fails(
        &[
            "pack",
            "--recipe",
            other.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--plan",
            plan_s,
        ],
        &[endpoint(&hub)],
    );
    assert_eq!(
        e.trim_end(),
        format!(
            "error: plan {plan_s} was made for recipe hash {hash}, but recipe {} has hash \
             {other_hash}: the recipe changed since (or it is another recipe); write it again \
             with `dsprep plan --recipe {} --out {plan_s}`",
            other.display(),
            other.display()
        )
    );
    assert!(
        hub.log().is_empty(),
        "refused before asking the Hub anything"
    );

    // A version this dsprep does not know, for serve as for pack.
    std::fs::write(
        &plan_file,
        text.replace("\"version\": 1,", "\"version\": 2,"),
    )
    .unwrap();
    let expected = format!(
        "error: plan {plan_s}: version 2 is not one this dsprep {} reads (it reads version 1); \
         {again}",
        env!("CARGO_PKG_VERSION")
    );
    let e = run_fails(&pack_with_plan, &[endpoint(&hub)]);
    assert_eq!(e.trim_end(), expected);
    let e = run_fails(&serve_with_plan, &[endpoint(&hub)]);
    assert_eq!(e.trim_end(), expected);

    // A partition that is not what dealing the plan's sizes gives.
    let mut edited = frozen.clone();
    let lanes = edited["lanes"]["lanes"].as_array_mut().unwrap();
    let moved = lanes[0]["units"][0].clone();
    lanes[0]["units"][0] = lanes[1]["units"][0].clone();
    lanes[1]["units"][0] = moved;
    std::fs::write(&plan_file, serde_json::to_vec(&edited).unwrap()).unwrap();
    let e = run_fails(&pack_with_plan, &[endpoint(&hub)]);
    assert_eq!(
        e.trim_end(),
        format!(
            "error: plan {plan_s}: lane 0 reads units [1] of source \"fineweb-edu\", but dealing \
             the plan's unit sizes to 4 lanes gives it [0]; {again}"
        )
    );
}
