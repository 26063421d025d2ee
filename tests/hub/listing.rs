//! Listing without reading: `dsprep plan` against the fake Hub (pages, exact %-encoding, no
//! download), the shipped presets, the exact messages of gated, missing and unmatched repos, and
//! where the token comes from.

use super::*;

#[test]
fn plan_resolves_revisions_lists_every_page_and_downloads_nothing() {
    let hub = FakeHub::start();
    hub.set_page_size(2);
    let parquet = Arc::new(
        std::fs::read(
            support::repo_root()
                .join("config/samples/finemath/finemath-3plus/train-00000-of-00002.parquet"),
        )
        .unwrap(),
    );
    let mut finemath = Repo {
        sha: sha_of("finemath-convert"),
        revisions: vec!["refs/convert/parquet".into()],
        ..Repo::default()
    };
    for path in [
        "finemath-3plus/train/0000.parquet",
        "finemath-3plus/train/0001.parquet",
        "finemath-4plus/train/0000.parquet",
    ] {
        finemath.files.insert(path.into(), parquet.clone());
    }
    hub.add_repo("HuggingFaceTB/finemath", finemath);
    let mut zyda = Repo {
        sha: sha_of("zyda"),
        ..Repo::default()
    };
    for i in 0..5 {
        zyda.files.insert(
            format!("data/zyda_crossdeduped-filtered /zyda_c4-en/{i:03}.parquet"),
            parquet.clone(),
        );
    }
    zyda.files.insert(
        "data/zyda_crossdeduped-filtered /README.md".into(),
        Arc::new(b"not data".to_vec()),
    );
    hub.add_repo("Zyphra/Zyda-2", zyda);
    let tmp = tempfile::tempdir().unwrap();
    let recipe = tmp.path().join("plan.toml");
    std::fs::write(&recipe, support::recipe(64, 0, "first_exhausted",
        "[[source]]\nname = \"finemath\"\nweight = 0.25\nfiles = [\"hf://datasets/HuggingFaceTB/finemath@refs%2Fconvert%2Fparquet/finemath-3plus/train/*.parquet\"]\nformat = \"parquet\"\n\
         [[source]]\nname = \"zyda\"\nweight = 0.75\nfiles = [\"hf://datasets/Zyphra/Zyda-2/data/zyda_crossdeduped-filtered /**/*.parquet\"]\nformat = \"parquet\"\n")).unwrap();
    // Progress lines at every page (a real listing logs one every 30 s).
    let output = dsprep_env(
        &["plan", "--recipe", recipe.to_str().unwrap()],
        &[endpoint(&hub), ("DSPREP_PROGRESS_SECS", "0".into())],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let zyda_listing = format!(
        "listing of dataset Zyphra/Zyda-2@{}/data/zyda_crossdeduped-filtered ",
        sha_of("zyda")
    );
    for so_far in ["2 files in 1 page(s) so far", "4 files in 2 page(s) so far"] {
        assert!(
            stderr.contains(&format!("{zyda_listing}: {so_far}")),
            "{stderr}"
        );
    }
    assert!(!stderr.contains("6 files in 3 page(s) so far"), "{stderr}");
    let size = parquet.len() as u64;
    let fm_sha = sha_of("finemath-convert");
    assert!(
        stdout.contains(&format!(
            "source \"finemath\": weight 0.25 (25.0 % of documents), 2 shards, {} bytes\n",
            2 * size
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "source \"zyda\": weight 0.75 (75.0 % of documents), 5 shards, {} bytes\n",
            5 * size
        )),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("hf://datasets/HuggingFaceTB/finemath@{fm_sha}/finemath-3plus/train/0001.parquet  {size} bytes  sha256 ")), "{stdout}");
    assert!(stdout.contains(&format!("hf://datasets/Zyphra/Zyda-2@{}/data/zyda_crossdeduped-filtered /zyda_c4-en/004.parquet", sha_of("zyda"))), "{stdout}");
    assert!(
        stdout.ends_with(&format!(
            "7 shards, {} bytes; nothing was downloaded\n",
            7 * size
        )),
        "{stdout}"
    );

    let log = hub.log();
    let targets: Vec<&str> = log.iter().map(|l| l.target.as_str()).collect();
    assert!(
        targets.contains(&"/api/datasets/HuggingFaceTB/finemath/revision/refs%2Fconvert%2Fparquet"),
        "{targets:#?}"
    );
    assert!(targets.contains(&format!("/api/datasets/HuggingFaceTB/finemath/tree/{fm_sha}/finemath-3plus/train?recursive=true&expand=false").as_str()), "{targets:#?}");
    let zyda_pages: Vec<&&str> = targets
        .iter()
        .filter(|t| t.contains("Zyda-2/tree/"))
        .collect();
    assert_eq!(zyda_pages.len(), 3, "6 files, 2 per page: {zyda_pages:#?}");
    assert!(
        zyda_pages
            .iter()
            .all(|t| t.contains("/data/zyda_crossdeduped-filtered%20?")),
        "{zyda_pages:#?}"
    );
    assert!(zyda_pages[2].contains("cursor=4"), "{zyda_pages:#?}");
    assert!(
        log.iter()
            .all(|l| l.host == Host::Hub && !l.target.contains("/resolve/")),
        "nothing downloaded: {targets:#?}"
    );
}

fn plan_fails(hub: &FakeHub, sources: &str, env: &[(&str, String)]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = tmp.path().join("r.toml");
    std::fs::write(&recipe, support::recipe(64, 0, "first_exhausted", sources)).unwrap();
    let mut env = env.to_vec();
    env.push(endpoint(hub));
    let output = dsprep_env(&["plan", "--recipe", recipe.to_str().unwrap()], &env);
    assert!(
        !output.status.success(),
        "plan succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn gated_missing_and_unmatched_repos_fail_with_exact_messages() {
    let hub = FakeHub::start();
    let seed = seed();
    serve(&hub, &seed);
    let stack = "bigcode/the-stack-v2-train-smol-ids";
    let mut gated = Repo {
        sha: sha_of(stack),
        gated: true,
        ..Repo::default()
    };
    gated
        .files
        .insert("data/smol_0000.parquet".into(), Arc::new(b"PAR1".to_vec()));
    hub.add_repo(stack, gated);
    hub.set_token("hf_accepted");
    let source = |files: &str| {
        format!("[[source]]\nname = \"s\"\nfiles = [\"{files}\"]\nformat = \"parquet\"\n")
    };
    let stack_source = source(&format!("hf://datasets/{stack}/data/*.parquet"));
    let prefix = format!("source \"s\": files[0] \"hf://datasets/{stack}/data/*.parquet\": ");
    let link = format!("{}/datasets/{stack}", hub.endpoint);

    let err = plan_fails(&hub, &stack_source, &[]);
    assert!(err.contains(&format!("{prefix}dataset {stack} is gated (HTTP 401): accept its terms at {link} and set HF_TOKEN to a token of that account\n")), "{err}");
    let err = plan_fails(&hub, &stack_source, &[("HF_TOKEN", "hf_refused".into())]);
    assert!(err.contains(&format!("{prefix}dataset {stack}: HTTP 401 with the token from HF_TOKEN: the token is invalid or its account cannot read this dataset (if it is gated, accept its terms at {link})\n")), "{err}");
    assert!(!err.contains("hf_refused"), "{err}");

    let err = plan_fails(
        &hub,
        &source("hf://datasets/nobody/nothing/data/*.parquet"),
        &[],
    );
    assert!(err.contains("files[0] \"hf://datasets/nobody/nothing/data/*.parquet\": dataset nobody/nothing not found (HTTP 404): check the repo id\n"), "{err}");
    let err = plan_fails(
        &hub,
        &source("hf://datasets/allenai/c4@v9/en/*.json.gz"),
        &[],
    );
    assert!(
        err.contains(": dataset allenai/c4: revision \"v9\" not found (HTTP 404)\n"),
        "{err}"
    );
    let err = plan_fails(&hub, &source("hf://datasets/allenai/c4/en/*.parquet"), &[]);
    assert!(err.contains(&format!("source \"s\": files[0] \"hf://datasets/allenai/c4/en/*.parquet\" matches no file of dataset allenai/c4@{} (4 files listed under \"en\")\n", sha_of("allenai/c4"))), "{err}");
    let log = hub.log();
    assert_eq!(
        count(&log, |l| l.target.contains("/revision/v9")),
        1,
        "a 404 is not retried"
    );
}

#[test]
fn the_token_comes_from_hf_token_path_or_hf_home() {
    let hub = FakeHub::start();
    let stack = "bigcode/the-stack-v2-train-smol-ids";
    let mut gated = Repo {
        sha: sha_of(stack),
        gated: true,
        ..Repo::default()
    };
    gated
        .files
        .insert("data/smol_0000.parquet".into(), Arc::new(b"PAR1".to_vec()));
    hub.add_repo(stack, gated);
    hub.set_token("hf_from_a_file");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("token"), "hf_from_a_file\n").unwrap();
    let recipe = tmp.path().join("r.toml");
    std::fs::write(&recipe, support::recipe(64, 0, "first_exhausted", &format!("[[source]]\nname = \"s\"\nfiles = [\"hf://datasets/{stack}/data/*.parquet\"]\nformat = \"parquet\"\n"))).unwrap();
    let token_file = tmp.path().join("token").display().to_string();
    for env in [
        vec![endpoint(&hub), ("HF_TOKEN_PATH", token_file)],
        vec![
            endpoint(&hub),
            ("HF_TOKEN_PATH", String::new()),
            ("HF_HOME", tmp.path().display().to_string()),
        ],
    ] {
        let output = dsprep_env(&["plan", "--recipe", recipe.to_str().unwrap()], &env);
        assert!(
            output.status.success(),
            "{env:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn shipped_presets_resolve_against_the_fake_hub() {
    use dsprep_mixers::recipe::{HubLocation, Recipe};
    let parquet = Arc::new(
        std::fs::read(
            support::repo_root().join("config/samples/fineweb-edu/sample/10BT/000_00000.parquet"),
        )
        .unwrap(),
    );
    let mut checked = Vec::new();
    for name in ["frontier-mix.toml", "fineweb-edu-10BT.toml", "c4-en.toml"] {
        let path = support::repo_root().join("config").join(name);
        let recipe = Recipe::parse(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let hub = FakeHub::start();
        let mut repos: BTreeMap<String, Repo> = BTreeMap::new();
        for source in &recipe.sources {
            for pattern in &source.files {
                let location = HubLocation::parse(pattern).unwrap();
                let repo = repos.entry(location.repo.clone()).or_insert_with(|| Repo {
                    sha: sha_of(&location.repo),
                    ..Repo::default()
                });
                if location.revision.len() == 40 {
                    repo.sha = location.revision.clone();
                } else {
                    repo.revisions.push(location.revision.clone());
                }
                // One file the glob matches: `**/` matches no folder, `*` matches "00000".
                let file = location.pattern.replace("**/", "").replace('*', "00000");
                repo.files.insert(file, parquet.clone());
            }
        }
        let num_repos = repos.len();
        for (id, repo) in repos {
            hub.add_repo(&id, repo);
        }
        let output = dsprep_env(
            &["plan", "--recipe", path.to_str().unwrap()],
            &[endpoint(&hub)],
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        for source in &recipe.sources {
            assert!(
                stdout.contains(&format!(
                    "source {:?}: weight {}",
                    source.name, source.weight
                )),
                "{name}: {stdout}"
            );
        }
        let log = hub.log();
        assert_eq!(
            count(&log, |l| l.target.contains("/revision/")),
            num_repos,
            "{name}: one revision lookup per repo"
        );
        assert!(
            log.iter()
                .all(|l| l.host == Host::Hub && !l.target.contains("/resolve/")),
            "{name}: nothing downloaded"
        );
        checked.push((name, recipe.sources.len()));
    }
    assert_eq!(
        checked.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![6, 1, 1],
        "{checked:?}"
    );
}
