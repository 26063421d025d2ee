//! No byte from the Hub taken on trust: a download host that changes one byte of a file, once
//! or every time. A file read whole (C4's `.json.gz`, parquet with `verify = "full"`, and by
//! default parquet without page CRCs) is hashed and checked against the listing's LFS sha256
//! before any of it is used; a parquet file with page CRCs is read by ranges and has each page
//! checked against the CRC in its header. Once: downloaded again, and the pack equals the pack
//! of the true file. Every time: the pack stops naming the file and both hashes (or the page and
//! both CRCs), and leaves nothing behind. The manifest says per input what was checked; the
//! opt-outs (`verify = "pages"`, `"none"`) say `none` for a file without page CRCs.

use super::fake_hub::{FakeHub, Fault, Host, Repo, sha_of};
use super::{dsprep_env, endpoint, manifest, stream_bytes, support};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A parquet file written by pyarrow with `write_page_checksum=True` (the FineWeb-Edu sample of
/// `config/samples`, 4 row groups, 4 KiB pages): every page header carries its CRC.
fn crc_parquet() -> Vec<u8> {
    std::fs::read(support::repo_root().join("tests/hub/data/fineweb-edu-page-crc.parquet")).unwrap()
}

fn sample(rel: &str) -> Vec<u8> {
    std::fs::read(support::repo_root().join("config/samples").join(rel)).unwrap()
}

/// One repo `test/{name}` holding `file` at `path`, on a fresh fake Hub.
fn hub_with(name: &str, path: &str, file: &[u8]) -> FakeHub {
    let hub = FakeHub::start();
    let repo = format!("test/{name}");
    hub.add_repo(
        &repo,
        Repo {
            sha: sha_of(&repo),
            files: [(path.to_string(), Arc::new(file.to_vec()))].into(),
            ..Repo::default()
        },
    );
    hub
}

fn source(files: &str, format: &str, extra: &str) -> String {
    format!("[[source]]\nname = \"s\"\nfiles = [{files:?}]\nformat = \"{format}\"\n{extra}")
}

/// `dsprep pack` of one source; the output directory and the run's result.
fn pack(dir: &Path, name: &str, source: &str, hub: Option<&FakeHub>) -> (PathBuf, bool, String) {
    pack_env(dir, name, source, hub, &[])
}

/// [`pack`] with more environment.
fn pack_env(
    dir: &Path,
    name: &str,
    source: &str,
    hub: Option<&FakeHub>,
    more: &[(&str, String)],
) -> (PathBuf, bool, String) {
    let recipe = dir.join(format!("{name}.toml"));
    std::fs::write(&recipe, support::recipe(64, 20, "first_exhausted", source)).unwrap();
    let out = dir.join(format!("out-{name}"));
    let mut env: Vec<(&str, String)> = hub.map(endpoint).into_iter().collect();
    env.extend(more.iter().cloned());
    let output = dsprep_env(
        &[
            "pack",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        &env,
    );
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (out, output.status.success(), stderr)
}

/// The same file packed from disk: what the Hub pack must equal.
fn local_pack(dir: &Path, file_name: &str, bytes: &[u8], format: &str, extra: &str) -> PathBuf {
    let file = dir.join("local").join(file_name);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, bytes).unwrap();
    let (out, ok, stderr) = pack(
        dir,
        "local",
        &source(file.to_str().unwrap(), format, extra),
        None,
    );
    assert!(ok, "{stderr}");
    out
}

/// A pack of `source` through `hub` after arming `fault`: it must succeed with the fault fired,
/// equal the `local` pack, and record `verified`; its stderr.
fn pack_through(
    tmp: &Path,
    hub: &FakeHub,
    name: &str,
    source: &str,
    local: &Path,
    verified_as: &str,
) -> (PathBuf, String) {
    let (out, ok, stderr) = pack(tmp, name, source, Some(hub));
    assert!(ok, "{stderr}");
    assert_eq!(hub.pending_faults(), 0, "the flipped byte was served");
    assert!(
        stream_bytes(&out) == stream_bytes(local),
        "the Hub pack differs from the local one"
    );
    assert_eq!(verified(&out), vec![Some(verified_as.to_string())]);
    (out, stderr)
}

fn verified(out: &Path) -> Vec<Option<String>> {
    manifest(out)
        .inputs
        .into_iter()
        .map(|i| i.verified)
        .collect()
}

/// Bytes of a file's first page header the default reads to learn whether its pages carry CRCs.
const PROBE: usize = 16 << 10;

/// Requests to the download host with exactly this `Range`.
fn count_ranges(log: &[super::fake_hub::Logged], range: &str) -> usize {
    log.iter()
        .filter(|l| l.host == Host::Cdn && l.range.as_deref() == Some(range))
        .count()
}

/// Bytes `start..end` of the `text` column chunk of row group `group` of a parquet file.
fn text_chunk(file: &[u8], group: usize) -> (usize, usize) {
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(bytes::Bytes::from(
        file.to_vec(),
    ))
    .unwrap();
    use parquet::file::reader::FileReader;
    let column = reader.metadata().row_group(group).column(0);
    assert_eq!(column.column_path().string(), "text");
    let (start, len) = column.byte_range();
    (start as usize, (start + len) as usize)
}

#[test]
fn a_parquet_page_changed_on_the_way_is_caught_by_its_crc_and_downloaded_again() {
    let tmp = tempfile::tempdir().unwrap();
    let file = crc_parquet();
    let path = "data/000_00000.parquet";
    let hub = hub_with("crc", path, &file);
    let local = local_pack(tmp.path(), "000_00000.parquet", &file, "parquet", "");
    let files = "hf://datasets/test/crc/data/*.parquet";

    // The last byte of row group 0's text column: inside its last page, before the footer read.
    let (start, end) = text_chunk(&file, 0);
    let flip = end - 1;
    assert!(
        flip < file.len() - (64 << 10),
        "row group 0 lies before the footer read"
    );
    hub.fault(Host::Cdn, path, true, 0, 1, Fault::FlipByte(flip));
    let (_, stderr) = pack_through(
        tmp.path(),
        &hub,
        "once",
        &source(files, "parquet", ""),
        &local,
        "page-crc",
    );
    assert!(
        stderr.contains("downloading row group 0 again (1 of 3)"),
        "{stderr}"
    );
    // Read by ranges, never whole: the probe of the first page header (bytes 4..16388, one
    // request), the footer, the row groups; row group 0 twice.
    let log = hub.log();
    assert!(
        log.iter().all(|l| l.host != Host::Cdn || l.range.is_some()),
        "{log:?}"
    );
    assert_eq!(count_ranges(&log, &format!("bytes=4-{}", 4 + PROBE - 1)), 1);
    let fetched = log
        .iter()
        .filter(|l| {
            l.host == Host::Cdn
                && l.range.as_deref().is_some_and(|r| {
                    r.starts_with(&format!("bytes={start}-"))
                        && r != format!("bytes=4-{}", 4 + PROBE - 1)
                })
        })
        .count();
    assert_eq!(fetched, 2, "row group 0 was downloaded twice");

    // Changed on every download: the pack stops, naming the file, the page and both CRCs.
    hub.fault(Host::Cdn, path, true, 0, 100, Fault::FlipByte(flip));
    let (out, ok, stderr) = pack(
        tmp.path(),
        "always",
        &source(files, "parquet", ""),
        Some(&hub),
    );
    assert!(!ok);
    let location = format!("hf://datasets/test/crc@{}/{path}", sha_of("test/crc"));
    assert!(
        stderr.contains(&format!(
            "shard {location} row 0: row group 0 column \"text\": page "
        )) && stderr.contains("its bytes give CRC ")
            && stderr.contains("where its header says ")
            && stderr.contains("on 3 downloads"),
        "{stderr}"
    );
    assert!(!out.exists() && !tmp.path().join("out-always.partial").exists());
}

#[test]
fn a_whole_file_changed_on_the_way_is_caught_by_its_sha256_before_any_of_it_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let file = sample("c4/en/c4-train.00001-of-00003.json.gz");
    let path = "en/c4-train.00001-of-00003.json.gz";
    let hub = hub_with("c4", path, &file);
    let local = local_pack(tmp.path(), "c4.json.gz", &file, "jsonl.gz", "");
    let files = "hf://datasets/test/c4/en/*.json.gz";
    let flip = file.len() / 2;

    hub.fault(Host::Cdn, path, false, 0, 1, Fault::FlipByte(flip));
    let (_, stderr) = pack_through(
        tmp.path(),
        &hub,
        "once",
        &source(files, "jsonl.gz", ""),
        &local,
        "sha256",
    );
    let truth = hex::encode(Sha256::digest(&file));
    let changed = {
        let mut f = file.clone();
        f[flip] ^= 0x01;
        hex::encode(Sha256::digest(&f))
    };
    assert!(
        stderr.contains(&format!(
            "the bytes downloaded hash to {changed}, the Hub's sha256 is {truth}; downloading \
             again (1 of 3)"
        )),
        "{stderr}"
    );

    hub.fault(Host::Cdn, path, false, 0, 100, Fault::FlipByte(flip));
    let (out, ok, stderr) = pack(
        tmp.path(),
        "always",
        &source(files, "jsonl.gz", ""),
        Some(&hub),
    );
    assert!(!ok);
    let location = format!("hf://datasets/test/c4@{}/{path}", sha_of("test/c4"));
    assert!(
        stderr.contains(&format!(
            "{location}: the bytes downloaded do not match the Hub's sha256 (3 downloads): \
             expected {truth}, got {changed}; nothing of the file was used"
        )),
        "{stderr}"
    );
    assert!(!out.exists() && !tmp.path().join("out-always.partial").exists());
}

/// The sha256 of `file`, and of `file` with the lowest bit of byte `flip` changed.
fn hashes(file: &[u8], flip: usize) -> (String, String) {
    let mut changed = file.to_vec();
    changed[flip] ^= 0x01;
    (
        hex::encode(Sha256::digest(file)),
        hex::encode(Sha256::digest(&changed)),
    )
}

#[test]
fn by_default_a_parquet_file_without_page_crcs_is_checked_whole_against_its_sha256() {
    let tmp = tempfile::tempdir().unwrap();
    // Written without page CRCs, as most Hub parquet files are.
    let file = sample("fineweb-edu/sample/10BT/000_00000.parquet");
    let path = "data/000_00000.parquet";
    let hub = hub_with("default", path, &file);
    let local = local_pack(tmp.path(), "000_00000.parquet", &file, "parquet", "");
    let files = "hf://datasets/test/default/data/*.parquet";
    let location = format!(
        "hf://datasets/test/default@{}/{path}",
        sha_of("test/default")
    );

    // A byte of row group 0's text, past the probe: changed on the first download only.
    let (_, end) = text_chunk(&file, 0);
    let flip = end - 1;
    assert!(flip >= 4 + PROBE, "the flipped byte lies past the probe");
    let (truth, changed) = hashes(&file, flip);
    hub.fault(Host::Cdn, path, false, 0, 1, Fault::FlipByte(flip));
    let (_, stderr) = pack_through(
        tmp.path(),
        &hub,
        "once",
        &source(files, "parquet", ""),
        &local,
        "sha256",
    );
    assert!(
        stderr.contains(&format!(
            "{location}: the bytes downloaded hash to {changed}, the Hub's sha256 is {truth}; \
             downloading again (1 of 3)"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("hub input {location}: verified sha256")),
        "{stderr}"
    );
    // One probe of the first page header, then the whole file twice; nothing else.
    let log = hub.log();
    let gets: Vec<(Option<&str>, u64)> = (log.iter())
        .filter(|l| l.host == Host::Cdn)
        .map(|l| (l.range.as_deref(), l.bytes))
        .collect();
    let probe = format!("bytes=4-{}", 4 + PROBE - 1);
    let size = file.len() as u64;
    assert_eq!(
        gets,
        vec![
            (Some(probe.as_str()), PROBE as u64),
            (None, size),
            (None, size)
        ]
    );

    // Changed on every download: the pack stops naming the file and both hashes; no tokens.
    hub.fault(Host::Cdn, path, false, 0, 100, Fault::FlipByte(flip));
    let (out, ok, stderr) = pack(
        tmp.path(),
        "always",
        &source(files, "parquet", ""),
        Some(&hub),
    );
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "{location}: the bytes downloaded do not match the Hub's sha256 (3 downloads): \
             expected {truth}, got {changed}; nothing of the file was used"
        )),
        "{stderr}"
    );
    assert!(!out.exists() && !tmp.path().join("out-always.partial").exists());
}

/// The opt-outs and `full`: `verify = "pages"` reads by ranges and says `none` for a file
/// without page CRCs; `verify = "none"` reads by ranges and checks nothing, CRCs or not;
/// `verify = "full"` reads whole, page CRCs or not. The tokens and the recipe hash are the
/// same every way.
#[test]
fn verify_pages_none_and_full_read_as_they_say() {
    let tmp = tempfile::tempdir().unwrap();
    let file = sample("fineweb-edu/sample/10BT/000_00000.parquet");
    let path = "data/000_00000.parquet";
    let hub = hub_with("optout", path, &file);
    let local = local_pack(tmp.path(), "000_00000.parquet", &file, "parquet", "");
    let files = "hf://datasets/test/optout/data/*.parquet";
    let mut hashes_seen = Vec::new();
    for (verify, word) in [("pages", "none"), ("none", "none")] {
        hub.clear_log();
        let (out, stderr) = pack_through(
            tmp.path(),
            &hub,
            verify,
            &source(files, "parquet", &format!("verify = \"{verify}\"\n")),
            &local,
            word,
        );
        let log = hub.log();
        assert!(
            log.iter().all(|l| l.host != Host::Cdn || l.range.is_some()),
            "{verify}: by ranges only: {log:?}"
        );
        // No probe: the footer is read first.
        assert_eq!(count_ranges(&log, &format!("bytes=4-{}", 4 + PROBE - 1)), 0);
        assert!(
            stderr.contains("verified none (read unchecked)"),
            "{stderr}"
        );
        hashes_seen.push(manifest(&out).recipe_hash);
    }

    // Whole: a byte changed once is caught and downloaded again.
    let (_, end) = text_chunk(&file, 0);
    let full = source(files, "parquet", "verify = \"full\"\n");
    hub.fault(Host::Cdn, path, false, 0, 1, Fault::FlipByte(end - 1));
    let (out, stderr) = pack_through(tmp.path(), &hub, "full", &full, &local, "sha256");
    assert!(stderr.contains("downloading again (1 of 3)"), "{stderr}");
    hashes_seen.push(manifest(&out).recipe_hash);
    // `verify` is a safety setting: the recipe hash is the same.
    hashes_seen.dedup();
    assert_eq!(hashes_seen.len(), 1);

    // `none` on a file with page CRCs: a byte of a text page changed on the way (inside a
    // snappy literal of row group 0's dictionary page) is not caught, and the pack holds other
    // tokens: what the default prevents, for a user who says so.
    let other = tempfile::tempdir().unwrap();
    let crc = crc_parquet();
    let crc_local = local_pack(other.path(), "000_00000.parquet", &crc, "parquet", "");
    let crc_hub = hub_with("crcnone", path, &crc);
    crc_hub.fault(Host::Cdn, path, true, 0, 1, Fault::FlipByte(12_000));
    let (out, ok, stderr) = pack(
        other.path(),
        "crc-none",
        &source(
            "hf://datasets/test/crcnone/data/*.parquet",
            "parquet",
            "verify = \"none\"\n",
        ),
        Some(&crc_hub),
    );
    assert!(ok, "{stderr}");
    assert_eq!(crc_hub.pending_faults(), 0);
    assert_eq!(verified(&out), vec![Some("none".to_string())]);
    assert!(stream_bytes(&out) != stream_bytes(&crc_local));
}

/// The spool folder cannot take a file (here `DSPREP_SPOOL_DIR` names a file, not a folder; a
/// full or read-only one fails the same way): one error naming the file, the folder and the
/// setting, before any byte is downloaded whole.
#[test]
fn a_spool_dir_that_cannot_be_written_is_named_with_its_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let file = sample("fineweb-edu/sample/10BT/000_00000.parquet");
    let path = "data/000_00000.parquet";
    let hub = hub_with("spool", path, &file);
    let not_a_dir = tmp.path().join("spool-is-a-file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let (out, ok, stderr) = pack_env(
        tmp.path(),
        "spool",
        &source("hf://datasets/test/spool/data/*.parquet", "parquet", ""),
        Some(&hub),
        &[("DSPREP_SPOOL_DIR", not_a_dir.display().to_string())],
    );
    assert!(!ok);
    let location = format!("hf://datasets/test/spool@{}/{path}", sha_of("test/spool"));
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(
        errors,
        vec![format!(
            "error: source \"s\": shard {location}: cannot read: {location}: cannot create its \
             spool file in {} (Not a directory (os error 20)): set DSPREP_SPOOL_DIR to a \
             writable local folder with room for two of the source's files",
            not_a_dir.display()
        )]
    );
    assert!(!out.exists() && !tmp.path().join("out-spool.partial").exists());
    assert!(
        hub.log()
            .iter()
            .all(|l| l.host != Host::Cdn || l.range.is_some()),
        "nothing downloaded whole"
    );
}

/// A recipe with lanes: each lane's manifest records what the Hub files it read were checked
/// against, and the finish takes it from there, so parts packed by other processes and then
/// finished write the bytes of one pack, `verified` included.
#[test]
fn lanes_record_what_they_verified_and_parts_finish_to_the_bytes_of_one_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let repo = "test/lanes";
    let files: std::collections::BTreeMap<String, Arc<Vec<u8>>> = [0, 1, 2]
        .iter()
        .map(|n| {
            let name = format!("c4-train.0000{n}-of-00003.json.gz");
            (
                format!("en/{name}"),
                Arc::new(sample(&format!("c4/en/{name}"))),
            )
        })
        .collect();
    hub.add_repo(
        repo,
        Repo {
            sha: sha_of(repo),
            files,
            ..Repo::default()
        },
    );
    let source = source("hf://datasets/test/lanes/en/*.json.gz", "jsonl.gz", "");
    let recipe = tmp.path().join("lanes.toml");
    let text = support::recipe(64, 20, "first_exhausted", &source)
        .replace("[mix]", "[lanes]\ncount = 3\nblock_windows = 1\n[mix]");
    std::fs::write(&recipe, text).unwrap();
    let run = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "pack",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        let output = dsprep_env(&args, &[endpoint(&hub)]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let whole = tmp.path().join("whole");
    run(&whole, &[]);
    assert_eq!(verified(&whole), vec![Some("sha256".to_string()); 3]);
    let parts = tmp.path().join("parts");
    for part in ["0", "1", "2"] {
        run(&parts, &["--part", part, "--parts", "3"]);
    }
    run(&parts, &["--finish"]);
    assert!(
        support::dir_bytes(&parts) == support::dir_bytes(&whole),
        "parts + finish wrote other bytes than one pack"
    );
}

/// Unmounts a tmpfs the test mounted, however the test ends.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A full spool folder (a 64 KiB tmpfs: the 104 KB file does not fit): one error naming the
/// file, the folder, the disk's answer and the setting; nothing packed. Mounting needs root:
/// where the test may not mount, it says so and checks nothing.
#[test]
fn a_full_spool_dir_is_named_with_its_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = tmp.path().join("tiny");
    std::fs::create_dir(&tiny).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&tiny)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (not root)");
        return;
    }
    let _unmount = Mounted(tiny.clone());
    let file = sample("fineweb-edu/sample/10BT/000_00000.parquet");
    assert!(file.len() > 64 << 10);
    let path = "data/000_00000.parquet";
    let hub = hub_with("full-spool", path, &file);
    let (out, ok, stderr) = pack_env(
        tmp.path(),
        "full-spool",
        &source(
            "hf://datasets/test/full-spool/data/*.parquet",
            "parquet",
            "",
        ),
        Some(&hub),
        &[("DSPREP_SPOOL_DIR", tiny.display().to_string())],
    );
    assert!(!ok);
    let location = format!(
        "hf://datasets/test/full-spool@{}/{path}",
        sha_of("test/full-spool")
    );
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(
        errors,
        vec![format!(
            "error: source \"s\": shard {location}: cannot read: {location}: cannot write its \
             spool file in {} (No space left on device (os error 28)): set DSPREP_SPOOL_DIR to \
             a writable local folder with room for two of the source's files",
            tiny.display()
        )]
    );
    assert!(!out.exists() && !tmp.path().join("out-full-spool.partial").exists());
}
