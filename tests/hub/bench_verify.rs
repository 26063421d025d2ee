//! The cost of verifying every Hub byte by default, against `verify = "pages"` (ignored by
//! default; release build): wall time, bytes downloaded and the spool's disk peak.

use super::bench::{bench_recipe, corpus_repo};
use super::*;
use std::time::Instant;

/// The benchmark behind BENCHMARKS.md "Verified by default (issue 48)": `dsprep pack` of a
/// corpus made by ../shared/bench/peer/make_corpus.py through the fake Hub, with the default
/// `verify` and with `verify = "pages"`, alternately. Per run: wall time, bytes and requests to
/// the download host, peak RSS, and the spool's peak (the sizes of the process's open spool
/// files, polled every 5 ms from /proc).
///
/// DSPREP_BENCH_CORPUS=/tmp/hubcorpus cargo test --release -p dsprep --test hub -- --ignored --nocapture bench_verified
#[test]
#[ignore = "benchmark: needs DSPREP_BENCH_CORPUS and a release build"]
fn bench_verified_by_default_against_pages() {
    let corpus = PathBuf::from(std::env::var("DSPREP_BENCH_CORPUS").expect("DSPREP_BENCH_CORPUS"));
    let rounds: usize = std::env::var("DSPREP_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let hub = FakeHub::start();
    let (repo, corpus_bytes) = corpus_repo(&corpus);
    println!("corpus: {corpus_bytes} bytes in {} files", repo.files.len());
    hub.add_repo("bench/corpus", repo);
    let tmp = tempfile::tempdir().unwrap();
    let spool = tmp.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    let mut outputs = Vec::new();
    for round in 0..rounds {
        for (name, extra) in [("default", ""), ("pages", "verify = \"pages\"\n")] {
            let run = format!("{name}-{round}");
            let recipe = tmp.path().join(format!("{run}.toml"));
            std::fs::write(&recipe, bench_recipe(&corpus, true, extra)).unwrap();
            let out = tmp.path().join(&run);
            hub.clear_log();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsprep"));
            cmd.args([
                "pack",
                "--recipe",
                recipe.to_str().unwrap(),
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
            ] {
                cmd.env_remove(key);
            }
            cmd.env("HF_ENDPOINT", &hub.endpoint)
                .env("HF_TOKEN_PATH", "/nonexistent")
                .env("DSPREP_LOG", "warn")
                .env("DSPREP_SPOOL_DIR", &spool)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            let started = Instant::now();
            let mut child = cmd.spawn().unwrap();
            let pid = child.id();
            let (mut spool_peak, mut rss_peak_kib) = (0u64, 0u64);
            while child.try_wait().unwrap().is_none() {
                spool_peak = spool_peak.max(open_spool_bytes(pid, &spool));
                rss_peak_kib = rss_peak_kib.max(vm_hwm_kib(pid));
                std::thread::sleep(Duration::from_millis(5));
            }
            let wall = started.elapsed().as_secs_f64();
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let m = manifest(&out);
            let tokens: u64 = m.sources.iter().map(|s| s.tokens).sum();
            let verified: BTreeMap<String, usize> =
                m.inputs.iter().fold(BTreeMap::new(), |mut n, i| {
                    *n.entry(i.verified.clone().unwrap_or_default()).or_insert(0) += 1;
                    n
                });
            let log = hub.log();
            let cdn = |l: &&Logged| l.host == Host::Cdn;
            println!(
                "{{\"run\":\"{run}\",\"wall_s\":{wall:.2},\"tokens\":{tokens},\"cdn_bytes\":{},\"cdn_requests\":{},\"requests\":{},\"spool_peak_bytes\":{spool_peak},\"peak_rss_mib\":{:.0},\"verified\":{verified:?}}}",
                log.iter().filter(cdn).map(|l| l.bytes).sum::<u64>(),
                log.iter().filter(cdn).count(),
                log.len(),
                rss_peak_kib as f64 / 1024.0,
            );
            outputs.push(stream_bytes(&out));
        }
    }
    assert!(
        outputs.iter().all(|bytes| bytes == &outputs[0]),
        "every run packs the same bytes"
    );
}

/// Bytes of the spool files process `pid` holds open (anonymous files in `spool`), each file
/// once however many descriptors it has open (the parquet reader clones its file's).
fn open_spool_bytes(pid: u32, spool: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let prefix = spool.display().to_string();
    let files: BTreeMap<(u64, u64), u64> = fds
        .filter_map(Result::ok)
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.display().to_string().starts_with(&prefix))
        })
        .filter_map(|fd| std::fs::metadata(fd.path()).ok())
        .map(|m| ((m.dev(), m.ino()), m.len()))
        .collect();
    files.values().sum()
}

/// The process's peak resident memory so far (`VmHWM`), in KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}
