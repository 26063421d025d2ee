//! Streaming from the Hugging Face Hub, end to end: the real `dsprep` binary against a fake Hub
//! (real HTTP on loopback: API + resolver, a download host it redirects to, an S3-like blob
//! server) serving the repo's real sample files. A pack through the Hub must equal a pack of the
//! same files on disk, byte for byte, with and without injected faults; the token must reach the
//! Hub only; listings, resolves and error messages are checked exactly.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

#[path = "hub/bench.rs"]
mod bench;
#[path = "hub/bench_verify.rs"]
mod bench_verify;
#[path = "hub/fake_hub.rs"]
mod fake_hub;
#[path = "hub/fake_routes.rs"]
mod fake_routes;
#[path = "hub/fixtures.rs"]
mod fixtures;
#[path = "hub/listing.rs"]
mod listing;
#[path = "hub/plan.rs"]
mod plan;
mod support;
#[path = "hub/verify.rs"]
mod verify;

use dsprep_client::format::Manifest;
use fake_hub::{FakeHub, Fault, Host, Logged, Repo, sha_of};
use fixtures::{DATASETS, Dataset, lay_out, seed, serve, sources};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

/// The `dsprep` binary with a clean Hub environment (no token, no proxy) plus `env`.
fn dsprep_env(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsprep"));
    cmd.args(args);
    for key in [
        "HF_TOKEN",
        "HF_ENDPOINT",
        "HF_HOME",
        "DSPREP_LOG",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(key);
    }
    cmd.env("HF_TOKEN_PATH", "/nonexistent/dsprep-test/token");
    cmd.env("DSPREP_HUB_BACKOFF_MS", "20");
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.output().expect("the dsprep binary runs")
}

fn endpoint(hub: &FakeHub) -> (&'static str, String) {
    ("HF_ENDPOINT", hub.endpoint.clone())
}

/// Pack `sources` (quickstart-like: seq_len 128, buffer 50, all_exhausted) into `dir/name`.
fn pack(dir: &Path, name: &str, sources: &str, env: &[(&str, String)]) -> (PathBuf, String) {
    let recipe = dir.join(format!("{name}.toml"));
    std::fs::write(&recipe, support::recipe(128, 50, "all_exhausted", sources)).unwrap();
    let out = dir.join(format!("out-{name}"));
    let output = dsprep_env(
        &[
            "pack",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--threads",
            "2",
            "--quiet",
        ],
        env,
    );
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "pack {name} failed:\n{stderr}");
    (out, stderr)
}

/// The token stream and document index of a packed directory (the manifest differs: it names
/// the recipe and the inputs).
fn stream_bytes(out: &Path) -> Vec<(String, Vec<u8>)> {
    let files: Vec<_> = support::dir_bytes(out)
        .into_iter()
        .filter(|(name, _)| name.starts_with("tokens-") || name.starts_with("doc_starts"))
        .collect();
    assert!(
        files.iter().any(|(n, _)| n == "tokens-00000.bin"),
        "{out:?} has tokens"
    );
    files
}

fn manifest(out: &Path) -> Manifest {
    serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap()
}

/// Same documents, rows and tokens per source.
fn assert_same_counts(local: &Manifest, remote: &Manifest) {
    for (a, b) in local.sources.iter().zip(&remote.sources) {
        assert_eq!(
            (
                &a.name,
                a.documents,
                a.tokens,
                a.rows_read,
                a.rows_filtered,
                a.rows_empty,
                a.passes_completed
            ),
            (
                &b.name,
                b.documents,
                b.tokens,
                b.rows_read,
                b.rows_filtered,
                b.rows_empty,
                b.passes_completed
            ),
        );
    }
}

fn count(log: &[Logged], f: impl Fn(&Logged) -> bool) -> usize {
    log.iter().filter(|l| f(l)).count()
}

fn resolves_per_file(log: &[Logged]) -> BTreeMap<String, usize> {
    let mut per_file = BTreeMap::new();
    for l in log
        .iter()
        .filter(|l| l.host == Host::Hub && l.target.contains("/resolve/"))
    {
        *per_file.entry(l.target.clone()).or_insert(0) += 1;
    }
    per_file
}

/// A fake Hub serving the samples, and the same files on disk under `tmp/local`.
fn setup() -> (FakeHub, tempfile::TempDir, PathBuf) {
    let hub = FakeHub::start();
    let seed = seed();
    serve(&hub, &seed);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("local");
    lay_out(&root, &seed);
    (hub, tmp, root)
}

fn pick(names: &[&str]) -> Vec<&'static Dataset> {
    DATASETS
        .iter()
        .filter(|d| names.contains(&d.source))
        .collect()
}

#[test]
fn packing_through_the_hub_equals_packing_the_same_files_locally() {
    let (hub, tmp, root) = setup();
    let all: Vec<&Dataset> = DATASETS.iter().collect();
    let (local, _) = pack(
        tmp.path(),
        "local",
        &sources(&all, None, &root, "repository"),
        &[],
    );
    let token = "hf_TESTtoken4711neverLogged";
    let (remote, stderr) = pack(
        tmp.path(),
        "hub",
        &sources(&all, Some(&hub), &root, "repository"),
        &[
            endpoint(&hub),
            ("HF_TOKEN", token.into()),
            ("DSPREP_LOG", "debug".into()),
        ],
    );
    assert_eq!(
        stream_bytes(&local),
        stream_bytes(&remote),
        "same token stream"
    );
    let (m_local, m_hub) = (manifest(&local), manifest(&remote));
    assert_same_counts(&m_local, &m_hub);
    assert!(
        m_hub.sources.iter().all(|s| s.passes_completed >= 1),
        "every source read whole"
    );

    // The manifest pins every Hub input: repo, commit, path, size, sha256.
    assert_eq!(m_hub.inputs.len(), 10);
    let seed = seed();
    for input in &m_hub.inputs {
        let repo = input.repo.as_deref().unwrap();
        assert_eq!(input.commit.as_deref(), Some(sha_of(repo).as_str()));
        let (_, _, bytes) = seed
            .files
            .iter()
            .find(|(r, p, _)| *r == repo && *p == input.path)
            .unwrap();
        assert_eq!(input.size_bytes, bytes.len() as u64);
        assert_eq!(
            input.sha256,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes))
        );
    }
    let local_sums: Vec<_> = m_local
        .inputs
        .iter()
        .map(|i| (&i.source, &i.sha256))
        .collect();
    let hub_sums: Vec<_> = m_hub
        .inputs
        .iter()
        .map(|i| (&i.source, &i.sha256))
        .collect();
    assert_eq!(local_sums, hub_sums, "the same bytes, by checksum");

    // Verified by default: the samples carry no page CRCs, so every file, parquet or JSON
    // lines, was read whole and checked against its sha256.
    let verified: Vec<Option<&str>> = (m_hub.inputs.iter())
        .map(|i| i.verified.as_deref())
        .collect();
    assert_eq!(verified, vec![Some("sha256"); 10]);

    // One revision lookup per repo, one listing per source (one page each), one resolve per file.
    let log = hub.log();
    assert_eq!(count(&log, |l| l.target.contains("/revision/")), 5);
    assert_eq!(count(&log, |l| l.target.contains("/tree/")), 5);
    let resolves = resolves_per_file(&log);
    assert_eq!(resolves.len(), 10, "{resolves:?}");
    assert!(resolves.values().all(|&n| n == 1), "{resolves:?}");
    assert!(
        log.iter()
            .all(|l| l.method != "GET" || l.host != Host::Hub || !l.target.contains("/resolve/"))
    );

    // The token goes to the Hub only: never to the download host or the blob server, never to the log.
    let bearer = format!("Bearer {token}");
    for l in &log {
        match l.host {
            Host::Hub => assert_eq!(l.authorization.as_deref(), Some(bearer.as_str()), "{l:?}"),
            Host::Cdn | Host::S3 => assert_eq!(l.authorization, None, "{l:?}"),
        }
    }
    assert!(count(&log, |l| l.host == Host::Cdn) > 0 && count(&log, |l| l.host == Host::S3) > 0);
    assert!(
        stderr.contains("hub client: endpoint"),
        "debug logging was on:\n{stderr}"
    );
    assert!(!stderr.contains(token), "the token leaked into the log");
    assert!(
        !stderr.contains("X-Amz-Signature"),
        "a presigned URL leaked into the log"
    );
}

#[test]
fn range_read_and_listing_faults_lose_and_duplicate_nothing() {
    let (hub, tmp, root) = setup();
    let chosen = pick(&["fineweb-edu", "zyda-2", "finemath"]);
    let (local, _) = pack(
        tmp.path(),
        "local",
        &sources(&chosen, None, &root, "repository"),
        &[],
    );
    let retry_after = vec![("Retry-After", "1".to_string())];
    hub.fault(
        Host::Hub,
        "fineweb-edu/revision/",
        false,
        0,
        1,
        Fault::Status(500, vec![]),
    );
    hub.fault(
        Host::Hub,
        "Zyda-2/tree/",
        false,
        0,
        1,
        Fault::Status(429, vec![("RateLimit", "\"api\";r=0;t=1".into())]),
    );
    hub.fault(
        Host::Cdn,
        "000_00000.parquet",
        true,
        0,
        1,
        Fault::Status(429, retry_after),
    );
    hub.fault(
        Host::Cdn,
        "000_00000.parquet",
        true,
        1,
        1,
        Fault::CutMidBody,
    );
    hub.fault(
        Host::Cdn,
        "001_00000.parquet",
        true,
        0,
        1,
        Fault::Status(500, vec![]),
    );
    hub.fault(
        Host::Cdn,
        "001_00000.parquet",
        true,
        2,
        1,
        Fault::IgnoreRange,
    );
    hub.fault(
        Host::Cdn,
        "dclm_0000.parquet",
        true,
        1,
        1,
        Fault::Stall(Duration::from_millis(1500)),
    );
    hub.fault(
        Host::Cdn,
        "fwe3_0000.parquet",
        true,
        0,
        1,
        Fault::Status(403, vec![]),
    );
    hub.fault(
        Host::Cdn,
        "train-00001-of-00002.parquet",
        true,
        0,
        1,
        Fault::CutMidBody,
    );
    // Read by ranges (`verify = "pages"`: the samples carry no page CRCs, so the default would
    // read them whole).
    let by_ranges = sources(&chosen, Some(&hub), &root, "repository").replace(
        "format = \"parquet\"\n",
        "format = \"parquet\"\nverify = \"pages\"\n",
    );
    let (remote, stderr) = pack(
        tmp.path(),
        "hub",
        &by_ranges,
        &[
            endpoint(&hub),
            ("DSPREP_HUB_READ_TIMEOUT_MS", "400".into()),
            ("DSPREP_LOG", "debug".into()),
        ],
    );
    assert_eq!(hub.pending_faults(), 0, "every fault fired");
    assert_eq!(
        stream_bytes(&local),
        stream_bytes(&remote),
        "nothing lost or duplicated:\n{stderr}"
    );
    assert_same_counts(&manifest(&local), &manifest(&remote));
    let resolves = resolves_per_file(&hub.log());
    for (file, n) in &resolves {
        let want = if file.contains("fwe3_0000") { 2 } else { 1 };
        assert_eq!(
            *n, want,
            "{file}: an expired download URL (403) is resolved again, once"
        );
    }
    for message in [
        "HTTP 429",
        "HTTP 500",
        "the body was cut",
        "ignored the Range header",
        "timed out",
        "HTTP 403",
    ] {
        assert!(stderr.contains(message), "{message} was retried:\n{stderr}");
    }
}

#[test]
fn streamed_body_and_blob_faults_lose_and_duplicate_nothing() {
    let (hub, tmp, root) = setup();
    let chosen = pick(&["c4", "the-stack-v2"]);
    let (local, _) = pack(
        tmp.path(),
        "local",
        &sources(&chosen, None, &root, "file"),
        &[],
    );
    hub.fault(Host::Cdn, "c4-train.00000", false, 0, 1, Fault::CutMidBody);
    hub.fault(
        Host::Cdn,
        "c4-train.00001",
        false,
        0,
        1,
        Fault::Stall(Duration::from_millis(1500)),
    );
    hub.fault(Host::Cdn, "c4-train.00002", false, 0, 1, Fault::CutMidBody);
    hub.fault(Host::Cdn, "c4-train.00002", true, 0, 1, Fault::IgnoreRange);
    let blobs: Vec<String> = seed().blobs.iter().map(|(id, _)| id.clone()).collect();
    hub.fault(Host::S3, &blobs[1], false, 0, 1, Fault::Status(500, vec![]));
    hub.fault(Host::S3, &blobs[5], false, 0, 1, Fault::CutMidBody);
    hub.fault(
        Host::S3,
        &blobs[9],
        false,
        0,
        1,
        Fault::Status(429, vec![("Retry-After", "1".into())]),
    );
    hub.fault(
        Host::S3,
        &blobs[13],
        false,
        0,
        1,
        Fault::Status(503, vec![]),
    );
    let (remote, stderr) = pack(
        tmp.path(),
        "hub",
        &sources(&chosen, Some(&hub), &root, "file"),
        &[
            endpoint(&hub),
            ("DSPREP_HUB_READ_TIMEOUT_MS", "400".into()),
            ("DSPREP_LOG", "debug".into()),
        ],
    );
    assert_eq!(hub.pending_faults(), 0, "every fault fired");
    assert_eq!(
        stream_bytes(&local),
        stream_bytes(&remote),
        "nothing lost or duplicated:\n{stderr}"
    );
    let (m_local, m_hub) = (manifest(&local), manifest(&remote));
    assert_same_counts(&m_local, &m_hub);
    let stack = m_hub
        .sources
        .iter()
        .find(|s| s.name == "the-stack-v2")
        .unwrap();
    assert!(
        stack.passes_completed >= 1 && stack.rows_read >= 63,
        "per file: 62 files and a latin-1 one per pass: {stack:?}"
    );
    // A cut body resumes where it stopped: a ranged request from a non-zero offset.
    let log = hub.log();
    assert!(log.iter().any(|l| l.target.contains("c4-train.00000")
        && l.range.as_deref().is_some_and(|r| r != "bytes=0-")));
    assert!(
        stderr.contains("the server ignored the Range header"),
        "{stderr}"
    );
}

/// A parquet file on the Hub whose page claims 2 GiB: read by ranges (`verify = "pages"`), its
/// page headers are checked in the prefetched row group, before the decoder sees it; read whole
/// (the default, for a file without page CRCs), in the checked local copy, as a local file's
/// are (tests/hostile.rs). Either way the pack stops naming the Hub file, the row group, the
/// column and the sizes.
#[test]
fn a_hub_parquet_page_claiming_2_gib_is_refused_before_it_is_decoded() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("000_00000.parquet");
    support::parquet_pages::write_text_parquet(
        &file,
        Arc::new(arrow_array::StringArray::from(vec![
            "a document",
            "another",
        ])),
        support::parquet_pages::one_page(parquet::basic::Compression::SNAPPY, false),
    );
    support::parquet_pages::claim_uncompressed(&file, i32::MAX);
    let repo = Repo {
        sha: sha_of("hostile/pages"),
        files: [(
            "data/000_00000.parquet".to_string(),
            Arc::new(std::fs::read(&file).unwrap()),
        )]
        .into(),
        ..Repo::default()
    };
    hub.add_repo("hostile/pages", repo);
    for (verify, at) in [("pages", " row 0"), ("auto", "")] {
        let recipe = tmp.path().join(format!("hostile-{verify}.toml"));
        let source = format!(
            "[[source]]\nname = \"fw\"\nfiles = [\"hf://datasets/hostile/pages/data/*.parquet\"]\n\
             format = \"parquet\"\nverify = \"{verify}\"\n"
        );
        std::fs::write(&recipe, support::recipe(16, 0, "first_exhausted", &source)).unwrap();
        let out = tmp.path().join(format!("out-{verify}"));
        let output = dsprep_env(
            &[
                "pack",
                "--recipe",
                recipe.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--quiet",
            ],
            &[endpoint(&hub)],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "shard hf://datasets/hostile/pages@{}/data/000_00000.parquet{at}: row group 0 \
                 column \"text\": page 0 at byte 4 claims 2147483647 bytes uncompressed from ",
                sha_of("hostile/pages")
            )) && stderr.contains("a decompression bomb or a corrupt file"),
            "{stderr}"
        );
        assert!(!out.exists() && !tmp.path().join(format!("out-{verify}.partial")).exists());
    }
}
