//! The Hub streaming benchmark (ignored by default; release build).

use super::*;

/// The five sources of the benchmark corpus: name, weight, files, format, text column.
pub(super) const MIX: [(&str, f64, &str, &str, &str); 5] = [
    (
        "fineweb-edu",
        0.40,
        "fineweb-edu/*.parquet",
        "parquet",
        "text",
    ),
    ("c4", 0.15, "c4-json/en/*.json.gz", "jsonl.gz", "text"),
    ("zyda-2", 0.30, "zyda-2/*.parquet", "parquet", "text"),
    (
        "the-stack-v2",
        0.10,
        "the-stack-v2/*.parquet",
        "parquet",
        "content",
    ),
    ("finemath", 0.05, "finemath/*.parquet", "parquet", "text"),
];

/// The corpus at `DSPREP_BENCH_CORPUS` as one repo of the fake Hub: the repo, its bytes.
pub(super) fn corpus_repo(corpus: &Path) -> (Repo, u64) {
    let mut repo = Repo {
        sha: sha_of("bench"),
        ..Repo::default()
    };
    let mut corpus_bytes = 0u64;
    for (_, _, pattern, _, _) in &MIX {
        let dir = corpus.join(Path::new(pattern).parent().unwrap());
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(corpus)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            let bytes = std::fs::read(&path).unwrap();
            corpus_bytes += bytes.len() as u64;
            repo.files.insert(rel, Arc::new(bytes));
        }
    }
    (repo, corpus_bytes)
}

/// The benchmark recipe over the corpus, from disk or (`remote`) from `bench/corpus` on the
/// fake Hub, each source with `extra` lines (e.g. `verify = "pages"`).
pub(super) fn bench_recipe(corpus: &Path, remote: bool, extra: &str) -> String {
    let mut text = format!(
        "version = 1\n[tokenizer]\npath = {:?}\neos = \"<|endoftext|>\"\n[packing]\nseq_len = 2048\n[shuffle]\nseed = 0\nbuffer_size = 10000\n[mix]\nstopping = \"first_exhausted\"\n",
        support::gpt2_tokenizer().display().to_string()
    );
    for (name, weight, pattern, format, column) in &MIX {
        let files = if remote {
            format!("hf://datasets/bench/corpus/{pattern}")
        } else {
            corpus.join(pattern).display().to_string()
        };
        text.push_str(&format!("[[source]]\nname = \"{name}\"\nweight = {weight}\nfiles = [{files:?}]\nformat = \"{format}\"\ntext = \"{column}\"\n{extra}"));
    }
    text
}

/// The benchmark behind BENCHMARKS.md "Hub streaming": `dsprep pack` of a corpus made
/// by ../shared/bench/peer/make_corpus.py, read locally and through the fake Hub, alternately.
///
/// DSPREP_BENCH_CORPUS=/tmp/hubcorpus cargo test --release -p dsprep --test hub -- --ignored --nocapture
///
/// `DSPREP_BENCH_BIN` runs another `dsprep` binary (an older build, to compare in one run).
#[test]
#[ignore = "benchmark: needs DSPREP_BENCH_CORPUS and a release build"]
fn bench_hub_streaming_against_local() {
    let corpus = PathBuf::from(std::env::var("DSPREP_BENCH_CORPUS").expect("DSPREP_BENCH_CORPUS"));
    let rounds: usize = std::env::var("DSPREP_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let hub = FakeHub::start();
    let (repo, corpus_bytes) = corpus_repo(&corpus);
    let num_files = repo.files.len();
    let bin = std::env::var("DSPREP_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_dsprep").to_string());
    hub.add_repo("bench/corpus", repo);
    let tmp = tempfile::tempdir().unwrap();
    let recipe = |remote: bool| bench_recipe(&corpus, remote, "");
    println!("corpus: {corpus_bytes} bytes in {num_files} files");
    let mut outputs = Vec::new();
    for round in 0..rounds {
        for remote in [false, true] {
            let name = format!("{}-{round}", if remote { "hub" } else { "local" });
            let path = tmp.path().join(format!("{name}.toml"));
            std::fs::write(&path, recipe(remote)).unwrap();
            let out = tmp.path().join(&name);
            let time_file = tmp.path().join(format!("{name}.time"));
            hub.clear_log();
            let mut cmd = Command::new("/usr/bin/time");
            cmd.args(["-f", "%M %e", "-o", time_file.to_str().unwrap()]);
            cmd.arg(&bin);
            cmd.args([
                "pack",
                "--recipe",
                path.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--threads",
                "2",
                "--quiet",
            ]);
            for key in [
                "HF_TOKEN",
                "http_proxy",
                "https_proxy",
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "ALL_PROXY",
                "all_proxy",
            ] {
                cmd.env_remove(key);
            }
            cmd.env("HF_ENDPOINT", &hub.endpoint)
                .env("HF_TOKEN_PATH", "/nonexistent");
            let output = cmd.output().unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let time = std::fs::read_to_string(&time_file).unwrap();
            let mut fields = time.split_whitespace();
            let rss_kib: u64 = fields.next().unwrap().parse().unwrap();
            let wall: f64 = fields.next().unwrap().parse().unwrap();
            let m = manifest(&out);
            let tokens: u64 = m.sources.iter().map(|s| s.tokens).sum();
            let log = hub.log();
            let files_read = resolves_per_file(&log).len().max(1);
            let requests = log.len();
            println!(
                "{{\"run\":\"{name}\",\"wall_s\":{wall},\"tokens\":{tokens},\"tokens_per_s\":{:.0},\"peak_rss_mib\":{:.0},\"requests\":{requests},\"files_read\":{files_read},\"requests_per_file\":{:.1},\"cdn_requests\":{}}}",
                tokens as f64 / wall,
                rss_kib as f64 / 1024.0,
                requests as f64 / files_read as f64,
                count(&log, |l| l.host == Host::Cdn),
            );
            outputs.push((remote, stream_bytes(&out)));
        }
    }
    let first_local = &outputs[0].1;
    assert!(
        outputs.iter().all(|(_, bytes)| bytes == first_local),
        "every run packs the same bytes"
    );
}
