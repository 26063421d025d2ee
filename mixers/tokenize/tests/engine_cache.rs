//! The engine cache: dsprep's own engine built from a cache entry ([`EngineChoice::Own`]) gives
//! exactly the ids, BOS/EOS and vocabulary size of one built from the file (and of HF), on real
//! C4 rows, for every tokenizer it reproduces; so does the engine `Auto` chose, from its entry; an
//! entry that is corrupt, cut short, of an older format (an engine since replaced), for another
//! file or unable to resolve the recipe's tokens is ignored (the engine line says why), the
//! engine is built from the file, and a sound entry takes the bad one's place.

#[path = "../../../tests/support/fetched_tokenizer.rs"]
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dsprep_tokenize::{EngineCache, EngineChoice, SharedEngineCache, TokenizeStage};
use dsprep_tokenize::{TokenRef, TokenizerSpec};

/// Entries in memory, counting stores.
#[derive(Default)]
struct MemoryCache {
    entries: Mutex<HashMap<String, Vec<u8>>>,
    stores: AtomicUsize,
}

impl MemoryCache {
    fn stores(&self) -> usize {
        self.stores.load(Ordering::SeqCst)
    }
    fn insert(&self, tokenizer_sha256: &str, entry: Vec<u8>) {
        let mut entries = self.entries.lock().expect("not poisoned");
        entries.insert(tokenizer_sha256.to_string(), entry);
    }
}

impl EngineCache for MemoryCache {
    fn load(&self, tokenizer_sha256: &str) -> Option<Vec<u8>> {
        let entries = self.entries.lock().expect("not poisoned");
        entries.get(tokenizer_sha256).cloned()
    }
    fn store(&self, tokenizer_sha256: &str, entry: &[u8]) {
        self.stores.fetch_add(1, Ordering::SeqCst);
        self.insert(tokenizer_sha256, entry.to_vec());
    }
}

fn spec(eos: &str, bos: Option<TokenRef>) -> TokenizerSpec {
    TokenizerSpec {
        path: "tokenizer.json".into(),
        eos: TokenRef::Text(eos.into()),
        bos,
    }
}

/// A stage running dsprep's own engine, its tables from `cache` when it holds them.
fn stage(json: &[u8], spec: &TokenizerSpec, cache: Option<&Arc<MemoryCache>>) -> TokenizeStage {
    stage_with(json, spec, cache, EngineChoice::Own)
}

fn stage_with(
    json: &[u8],
    spec: &TokenizerSpec,
    cache: Option<&Arc<MemoryCache>>,
    choice: EngineChoice,
) -> TokenizeStage {
    TokenizeStage::from_json_bytes_cached(
        Arc::new(json.to_vec()),
        spec,
        "test",
        choice,
        cache.map(|c| Arc::clone(c) as SharedEngineCache),
    )
    .expect("tokenizer builds")
}

fn c4_rows(n: usize) -> Vec<String> {
    let path = "../../tests/bench/data/c4-en-1000.json.gz";
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(path).expect("bench rows"));
    BufReader::new(gz)
        .lines()
        .take(n)
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(&line.expect("line")).expect("json");
            row["text"].as_str().expect("text").to_string()
        })
        .collect()
}

fn ids(stage: &TokenizeStage, rows: &[String]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|text| {
            let mut ids = Vec::new();
            stage.encode_doc(text, &mut ids).expect("encodes");
            ids
        })
        .collect()
}

/// (name, path, eos, bos) for every tokenizer of the fast path that is here.
fn tokenizers() -> Vec<(&'static str, String, &'static str, Option<TokenRef>)> {
    let mut list = vec![
        (
            "gpt2",
            "../../config/tokenizers/gpt2/tokenizer.json".to_string(),
            "<|endoftext|>",
            None,
        ),
        (
            "qwen3",
            "../../config/tokenizers/qwen3/tokenizer.json".to_string(),
            "<|endoftext|>",
            Some(TokenRef::Text("<|im_start|>".into())),
        ),
    ];
    if let Some(path) = support::fetched_tokenizer("llama3") {
        list.push((
            "llama3",
            path.display().to_string(),
            "<|end_of_text|>",
            Some(TokenRef::Id(128_000)),
        ));
    }
    if let Some(path) = support::fetched_tokenizer("llama2") {
        list.push((
            "llama2",
            path.display().to_string(),
            "</s>",
            Some(TokenRef::Text("<s>".into())),
        ));
    }
    // SentencePiece-style BPE without the prepended "▁": Gemma (no <0x09> in its vocabulary),
    // Gemma 3 (6,415 added tokens) and Yi.
    for (name, eos, bos) in [
        ("gemma", "<eos>", "<bos>"),
        ("gemma3", "<eos>", "<bos>"),
        ("yi", "<|endoftext|>", "<|startoftext|>"),
    ] {
        if let Some(path) = support::fetched_tokenizer(name) {
            let bos = Some(TokenRef::Text(bos.into()));
            list.push((name, path.display().to_string(), eos, bos));
        }
    }
    list
}

#[test]
fn an_engine_from_the_cache_gives_the_same_ids() {
    let rows = c4_rows(300);
    for (name, path, eos, bos) in tokenizers() {
        let json = std::fs::read(&path).expect("tokenizer");
        let spec = spec(eos, bos);
        let cache = Arc::new(MemoryCache::default());
        let built = stage(&json, &spec, Some(&cache));
        assert_eq!(
            cache.stores(),
            1,
            "{name}: the first build keeps its tables"
        );
        assert!(
            !built.engine_description().contains("engine cache"),
            "{name}: {}",
            built.engine_description()
        );
        let cached = stage(&json, &spec, Some(&cache));
        assert_eq!(cache.stores(), 1, "{name}: a hit writes nothing");
        assert!(
            cached
                .engine_description()
                .ends_with("(tables from the engine cache)"),
            "{name}: {}",
            cached.engine_description()
        );
        let hf = TokenizeStage::from_json_bytes_with(&json, &spec, "test", EngineChoice::Hf)
            .expect("HF builds");
        let expected = ids(&hf, &rows);
        assert_eq!(ids(&built, &rows), expected, "{name}: built");
        assert_eq!(ids(&cached, &rows), expected, "{name}: from the cache");
        for stage in [&built, &cached] {
            assert_eq!(stage.eos_id(), hf.eos_id(), "{name}");
            assert_eq!(stage.bos_id(), hf.bos_id(), "{name}");
            assert_eq!(stage.vocab_size(), hf.vocab_size(), "{name}");
            assert_eq!(stage.sha256(), hf.sha256(), "{name}");
        }
        assert_eq!(cached.bos_id().is_some(), spec.bos.is_some(), "{name}");
        // decode parses HF's tokenizer when first asked.
        assert_eq!(
            cached.decode(&expected[0]).expect("decodes"),
            hf.decode(&expected[0]).expect("decodes"),
            "{name}"
        );
    }
}

/// The entry kept for GPT-2, and the cache holding it.
fn gpt2_cache() -> (Vec<u8>, String, Arc<MemoryCache>) {
    let json = std::fs::read("../../config/tokenizers/gpt2/tokenizer.json").expect("gpt2");
    let cache = Arc::new(MemoryCache::default());
    let built = stage(&json, &spec("<|endoftext|>", None), Some(&cache));
    let sha = built.sha256().to_string();
    (json, sha, cache)
}

/// The entry of dsprep's own engine for the file `sha`.
fn entry(cache: &MemoryCache, sha: &str) -> Vec<u8> {
    cache.entries.lock().expect("not poisoned")[&format!("{sha}-own")].clone()
}

/// An entry of the current format around `payload`, its hash right: what only a build with a
/// bug, or a hand, would write.
fn sealed(payload: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let header = format!(
        "dsprep-engine-cache/8 {}\n",
        hex::encode(sha2::Sha256::digest(payload))
    );
    [header.as_bytes(), payload].concat()
}

#[test]
fn a_damaged_entry_is_ignored_and_replaced() {
    let (json, sha, cache) = gpt2_cache();
    let sound = entry(&cache, &sha);
    let rows = c4_rows(50);
    let expected = ids(&stage(&json, &spec("<|endoftext|>", None), None), &rows);
    let mut flipped = sound.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x01;
    let damaged: [(&str, Vec<u8>, &str); 6] = [
        (
            "a flipped byte",
            flipped,
            "payload does not match its sha256",
        ),
        (
            "cut short",
            sound[..sound.len() - 100].to_vec(),
            "payload does not match its sha256",
        ),
        ("empty", Vec::new(), "no header line"),
        (
            "the previous format",
            [b"dsprep-engine-cache/7".as_slice(), &sound[21..]].concat(),
            "format \"dsprep-engine-cache/7\", this build reads \"dsprep-engine-cache/8\"",
        ),
        (
            "no head line",
            sealed(b"{\"tokenizer_sha256\":\"\"}"),
            "payload has no head line",
        ),
        (
            "a head that is not one",
            sealed(b"{not a head}\n{}"),
            "head does not parse: ",
        ),
    ];
    for (what, bytes, why) in damaged {
        cache.insert(&format!("{sha}-own"), bytes);
        let stage = stage(&json, &spec("<|endoftext|>", None), Some(&cache));
        let line = stage.engine_description();
        assert!(
            line.contains(&format!("engine cache entry ignored: {why}")),
            "{what}: {line}"
        );
        assert!(line.starts_with("fast path"), "{what}: {line}");
        assert_eq!(ids(&stage, &rows), expected, "{what}");
        assert_eq!(
            entry(&cache, &sha),
            sound,
            "{what}: a sound entry replaces it"
        );
    }
}

/// An entry whose hash, file and build check out but whose tables do not build (here: not
/// JSON) is found out on the thread building the engine: the engine is learnt from the file, the
/// line says why, the ids are HF's, and a sound entry takes the bad one's place, so the next
/// process builds from the cache again.
#[test]
fn tables_that_do_not_build_are_learnt_from_the_file_and_replaced() {
    let (json, sha, cache) = gpt2_cache();
    let sound = entry(&cache, &sha);
    let header_end = sound.iter().position(|&b| b == b'\n').expect("header") + 1;
    let head_end = header_end
        + sound[header_end..]
            .iter()
            .position(|&b| b == b'\n')
            .expect("head line")
        + 1;
    let payload = [&sound[header_end..head_end], b"{not the tables".as_slice()].concat();
    let forged = sealed(&payload);
    cache.insert(&format!("{sha}-own"), forged);
    let rows = c4_rows(50);
    let expected = ids(&stage(&json, &spec("<|endoftext|>", None), None), &rows);
    let first = stage(&json, &spec("<|endoftext|>", None), Some(&cache));
    assert_eq!(ids(&first, &rows), expected);
    let line = first.engine_description();
    assert!(line.starts_with("fast path"), "{line}");
    assert!(
        line.contains("; engine cache entry ignored: tables do not parse: "),
        "{line}"
    );
    assert_eq!(
        cache.stores(),
        2,
        "the file's build stored once, the replacement once"
    );
    assert_eq!(entry(&cache, &sha), sound, "a sound entry replaces it");
    let next = stage(&json, &spec("<|endoftext|>", None), Some(&cache));
    assert!(
        next.engine_description()
            .ends_with("(tables from the engine cache)"),
        "{}",
        next.engine_description()
    );
    assert_eq!(ids(&next, &rows), expected);
}

#[test]
fn an_entry_for_another_file_is_ignored() {
    let (_, gpt2_sha, cache) = gpt2_cache();
    let qwen3 = std::fs::read("../../config/tokenizers/qwen3/tokenizer.json").expect("qwen3");
    let qwen3_sha = stage(&qwen3, &spec("<|endoftext|>", None), None)
        .sha256()
        .to_string();
    let gpt2_entry = entry(&cache, &gpt2_sha);
    cache.insert(&format!("{qwen3_sha}-own"), gpt2_entry);
    let stage = stage(&qwen3, &spec("<|endoftext|>", None), Some(&cache));
    let line = stage.engine_description();
    assert!(
        line.contains(&format!(
            "engine cache entry ignored: entry is for tokenizer sha256 {gpt2_sha}, not {qwen3_sha}"
        )),
        "{line}"
    );
    assert!(line.starts_with("fast path"), "{line}");
    let hf = TokenizeStage::from_json_bytes_with(
        &qwen3,
        &spec("<|endoftext|>", None),
        "test",
        EngineChoice::Hf,
    )
    .expect("HF builds");
    assert_eq!(stage.vocab_size(), hf.vocab_size());
    assert_eq!(stage.eos_id(), hf.eos_id());
}

/// A BOS the entry cannot resolve (an ordinary token, not an added one) is looked up in HF's
/// tokenizer, parsed for it; an unknown EOS is the same error with or without an entry.
#[test]
fn tokens_the_entry_cannot_resolve_go_to_hf() {
    let (json, _, cache) = gpt2_cache();
    let plain = spec("<|endoftext|>", Some(TokenRef::Text("hello".into())));
    let stage = stage(&json, &plain, Some(&cache));
    assert_eq!(stage.bos_id(), Some(31_373));
    assert!(
        !stage.engine_description().contains("engine cache"),
        "{}",
        stage.engine_description()
    );
    let unknown = spec("<|no such token|>", None);
    let cached = TokenizeStage::from_json_bytes_cached(
        Arc::new(json.clone()),
        &unknown,
        "test",
        EngineChoice::Own,
        Some(cache as SharedEngineCache),
    )
    .err()
    .expect("unknown eos")
    .to_string();
    let uncached = TokenizeStage::from_json_bytes(&json, &unknown, "test")
        .err()
        .expect("unknown eos")
        .to_string();
    assert_eq!(cached, uncached);
    assert_eq!(
        cached,
        "tokenizer.eos: token \"<|no such token|>\" is not in the vocabulary of test"
    );
}

/// Beside the fast engine a stage keeps the file's bytes for HF's parse, should it be needed (a
/// `decode`, a pad), not HF's tokenizer (tens of MB for Qwen3 and Llama 3): the caller's bytes,
/// shared, not a copy of them. That holds whether its tables came from an entry or were learnt
/// from the file. A stage that encodes with HF keeps HF and no bytes. Every way, `decode` (HF's)
/// works.
#[test]
fn a_stage_beside_the_fast_engine_shares_the_files_bytes() {
    let (json, _, cache) = gpt2_cache();
    let json = Arc::new(json);
    let eos = spec("<|endoftext|>", None);
    let build_with = |cache: Option<SharedEngineCache>, choice| {
        TokenizeStage::from_json_bytes_cached(Arc::clone(&json), &eos, "test", choice, cache)
            .expect("builds")
    };
    let build = |cache| build_with(cache, EngineChoice::Own);
    let cached = build(Some(cache as SharedEngineCache));
    assert_eq!(
        Arc::strong_count(&json),
        2,
        "the stage holds the caller's bytes"
    );
    assert_eq!(cached.decode(&[31_373]).expect("decodes"), "hello");
    assert!(
        cached
            .engine_description()
            .contains("(tables from the engine cache)")
    );
    drop(cached);
    assert_eq!(Arc::strong_count(&json), 1);
    let learnt = build(None);
    assert!(!learnt.engine_description().starts_with("HF"));
    assert_eq!(
        Arc::strong_count(&json),
        2,
        "learnt: the bytes kept, HF dropped"
    );
    assert_eq!(learnt.decode(&[31_373]).expect("decodes"), "hello");
    drop(learnt);
    let hf = build_with(None, EngineChoice::Hf);
    assert_eq!(Arc::strong_count(&json), 1, "HF encodes: HF kept, no bytes");
    assert_eq!(hf.decode(&[31_373]).expect("decodes"), "hello");
}

/// Under `Auto` the entry keeps the engine chosen: for GPT-2 HF tokenizers 1.x, which reads the
/// file itself, so the entry is its head and the choice; for Qwen3 (NFC, which 1.x applies with
/// other Unicode tables) dsprep's own engine and its tables. The next stage starts from it (no
/// HF 0.23 parse) and gives HF 0.23's ids; `Own`'s entry for the same file is another.
#[test]
fn auto_keeps_its_choice() {
    let rows = c4_rows(100);
    for (path, hf1) in [
        ("../../config/tokenizers/gpt2/tokenizer.json", true),
        ("../../config/tokenizers/qwen3/tokenizer.json", false),
    ] {
        let json = std::fs::read(path).expect("tokenizer");
        let eos = spec("<|endoftext|>", None);
        let cache = Arc::new(MemoryCache::default());
        let built = stage_with(&json, &eos, Some(&cache), EngineChoice::Auto);
        assert_eq!(cache.stores(), 1, "{path}");
        let sha = built.sha256().to_string();
        let kept = cache.entries.lock().expect("not poisoned")[&sha].clone();
        let tables = kept.split(|&b| b == b'\n').nth(2).expect("tables line");
        assert_eq!(
            tables == b"\"Hf1\"",
            hf1,
            "{path}: the choice, no tables, for 1.x"
        );
        let cached = stage_with(&json, &eos, Some(&cache), EngineChoice::Auto);
        assert_eq!(cache.stores(), 1, "{path}: a hit writes nothing");
        let (engine, from_entry) = if hf1 {
            (
                "HF tokenizers 1.0.0-rc.3 (byte-level BPE",
                "(chosen by the engine cache)",
            )
        } else {
            ("fast path", "(tables from the engine cache)")
        };
        let line = built.engine_description();
        assert!(line.starts_with(engine), "{line}");
        let line = cached.engine_description();
        assert!(
            line.starts_with(engine) && line.ends_with(from_entry),
            "{line}"
        );
        let hf = TokenizeStage::from_json_bytes_with(&json, &eos, "test", EngineChoice::Hf)
            .expect("HF builds");
        let expected = ids(&hf, &rows);
        assert_eq!(ids(&built, &rows), expected, "{path}: built");
        assert_eq!(ids(&cached, &rows), expected, "{path}: from the cache");
        assert_eq!(cached.vocab_size(), hf.vocab_size());
        let own = stage_with(&json, &eos, Some(&cache), EngineChoice::Own);
        assert!(own.engine_description().starts_with("fast path"));
        assert_eq!(cache.stores(), 2, "{path}: Own keeps an entry of its own");
        assert_eq!(ids(&own, &rows), expected, "{path}: own engine");
    }
}

/// An entry written before this build chose HF 1.x for GPT-2 (format 7: dsprep's byte-level
/// tables, kept under the file's sha256) is ignored, with the reason, and replaced by the choice.
#[test]
fn an_entry_of_a_replaced_engine_is_ignored_and_rebuilt() {
    let (json, sha, cache) = gpt2_cache();
    let own = entry(&cache, &sha);
    let old = [b"dsprep-engine-cache/7".as_slice(), &own[21..]].concat();
    cache.insert(&sha, old);
    let eos = spec("<|endoftext|>", None);
    let stage = stage_with(&json, &eos, Some(&cache), EngineChoice::Auto);
    let line = stage.engine_description();
    assert!(
        line.starts_with("HF tokenizers 1.0.0-rc.3 (byte-level BPE"),
        "{line}"
    );
    assert!(
        line.ends_with(
            "; engine cache entry ignored: format \"dsprep-engine-cache/7\", this build reads \
             \"dsprep-engine-cache/8\""
        ),
        "{line}"
    );
    let rebuilt = cache.entries.lock().expect("not poisoned")[&sha].clone();
    assert!(rebuilt.starts_with(b"dsprep-engine-cache/8 "));
    let next = stage_with(&json, &eos, Some(&cache), EngineChoice::Auto);
    assert!(
        next.engine_description()
            .ends_with("(chosen by the engine cache)"),
        "{}",
        next.engine_description()
    );
    let rows = c4_rows(50);
    let hf = TokenizeStage::from_json_bytes_with(&json, &eos, "test", EngineChoice::Hf)
        .expect("HF builds");
    assert_eq!(ids(&next, &rows), ids(&hf, &rows));
}
