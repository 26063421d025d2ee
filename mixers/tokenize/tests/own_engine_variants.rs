//! When dsprep's own engine ([`EngineChoice::Own`]: the fast path) reproduces a file and when it
//! refuses: GPT-2's tokenizer.json edited
//! into variants (other normalizers, split behaviours, added-token flags, merge orders, …), Yi's
//! (SentencePiece-style BPE, fetched) edited into the normalizers and pre-tokenizers of Llama 2,
//! Gemma and Gemma 3 and into ones the fast path refuses, and tiny hand-made vocabularies. A variant the fast path accepts must give HF's ids; one it
//! refuses must name the reason in `engine_description()` and still encode (with HF).

#[path = "../../../tests/support/fetched_tokenizer.rs"]
mod support;

use std::sync::LazyLock;

use dsprep_tokenize::{EngineChoice, TokenizeStage};
use dsprep_tokenize::{TokenRef, TokenizerSpec};
use serde_json::{Value, json};

const GPT2: &str = "../../config/tokenizers/gpt2/tokenizer.json";

static GPT2_JSON: LazyLock<Value> = LazyLock::new(|| {
    let bytes = std::fs::read(GPT2).expect("gpt2 tokenizer.json (tests run from mixers/)");
    serde_json::from_slice(&bytes).expect("json")
});

/// Texts that reach splits, gaps, added tokens, NFC and long pieces.
const TEXTS: &[&str] = &[
    "",
    "Hello, World! It's 2024: 3.14 + 2 = 5.14\n\n\tdone  ",
    "café cafe\u{301} \u{212b} ǅ ﬁ ⅷ ① Straße İstanbul",
    "  spaces   and\ttabs\r\n\r\nnewlines   ",
    "<|endoftext|>text<|endoftext|> <|endoftext|>\n",
    "abc abcabc xyz xyzab bcbc ab",
    "日本語 🦀 \u{FFFD} 1234567890123",
];

fn spec() -> TokenizerSpec {
    TokenizerSpec {
        path: "tokenizer.json".into(),
        eos: TokenRef::Id(0),
        bos: None,
    }
}

fn stage(json: &Value, choice: EngineChoice) -> TokenizeStage {
    let bytes = serde_json::to_vec(json).expect("serialize");
    TokenizeStage::from_json_bytes_with(&bytes, &spec(), "variant", choice).expect("builds")
}

fn encode(stage: &TokenizeStage, text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    stage.encode_doc(text, &mut ids).expect("encodes");
    ids
}

/// The variant takes the fast path and agrees with HF on every text.
fn assert_fast_and_equal(json: &Value, texts: &[&str]) {
    let fast = stage(json, EngineChoice::Own);
    let hf = stage(json, EngineChoice::Hf);
    let description = fast.engine_description();
    assert!(description.starts_with("fast path"), "{description}");
    for text in texts {
        assert_eq!(encode(&fast, text), encode(&hf, text), "{text:?}");
    }
}

/// The variant runs HF, and says why.
fn assert_refused(json: &Value, reason: &str) {
    let auto = stage(json, EngineChoice::Own);
    let description = auto.engine_description();
    assert!(description.starts_with("HF tokenizers: "), "{description}");
    assert!(
        description.contains(reason),
        "{description:?} lacks {reason:?}"
    );
    let hf = stage(json, EngineChoice::Hf);
    for text in TEXTS {
        assert_eq!(encode(&auto, text), encode(&hf, text), "{text:?}");
    }
}

fn gpt2_with(edit: impl FnOnce(&mut Value)) -> Value {
    let mut json = GPT2_JSON.clone();
    edit(&mut json);
    json
}

#[test]
fn lowercase_normalizer_falls_back_to_hf() {
    let json = gpt2_with(|j| j["normalizer"] = json!({"type": "Lowercase"}));
    assert_refused(
        &json,
        "normalizer Lowercase is not reproduced by the fast path",
    );
}

#[test]
fn nfkc_normalizer_is_reproduced() {
    // Alone (Claude's 2023 file) and as a Sequence of one; a normalized added token is looked for
    // by its NFKC form ("ﬁ!" is "fi!").
    let compatibility = ["ﬁne ① x² Ⅻ ｶﾞ ㎏ \u{a0}nbsp ﬀ ﬃ ½ ™ ℌ ſt", "ﬁ! fi! ﬁ!!"];
    let texts: Vec<&str> = TEXTS.iter().copied().chain(compatibility).collect();
    for normalizer in [
        json!({"type": "NFKC"}),
        json!({"type": "Sequence", "normalizers": [{"type": "NFKC"}]}),
    ] {
        let json = gpt2_with(|j| {
            j["normalizer"] = normalizer.clone();
            j["added_tokens"].as_array_mut().expect("list").push(json!({
                "id": 50257, "content": "ﬁ!", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": true, "special": false
            }));
        });
        assert_fast_and_equal(&json, &texts);
        let fast = stage(&json, EngineChoice::Own);
        assert!(
            fast.engine_description().contains("normalizer NFKC"),
            "{}",
            fast.engine_description()
        );
        assert_eq!(encode(&fast, "fi!"), [50257, 0]);
    }
    // Two normalizers in a Sequence are still refused.
    let json = gpt2_with(|j| {
        j["normalizer"] =
            json!({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "NFC"}]});
    });
    assert_refused(
        &json,
        "normalizer Sequence is not reproduced by the fast path",
    );
}

#[test]
fn nfc_normalizer_is_reproduced() {
    let json = gpt2_with(|j| j["normalizer"] = json!({"type": "NFC"}));
    assert_fast_and_equal(&json, TEXTS);
}

#[test]
fn normalized_added_token_matches_its_nfc_form() {
    // A normalized added token is looked for, by its NFC form, in the NFC'd text.
    let json = gpt2_with(|j| {
        j["normalizer"] = json!({"type": "NFC"});
        j["added_tokens"].as_array_mut().expect("list").push(json!({
            "id": 50257, "content": "cafe\u{301}!", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": true, "special": false
        }));
    });
    assert_fast_and_equal(&json, &["café! cafe\u{301}! cafe!", "xcafé!!"]);
    let ids = encode(&stage(&json, EngineChoice::Own), "café!");
    assert_eq!(ids, [50257, 0]);
}

#[test]
fn added_token_flags_fall_back_to_hf() {
    for flag in ["lstrip", "rstrip", "single_word"] {
        let json = gpt2_with(|j| j["added_tokens"][0][flag] = json!(true));
        assert_refused(&json, "has single_word/lstrip/rstrip");
    }
}

#[test]
fn split_behaviours_with_gaps_are_reproduced() {
    // A regex that leaves gaps (everything but letters): Isolated keeps both, Removed keeps the
    // gaps, and invert swaps which is which.
    for (behavior, invert) in [
        ("Isolated", false),
        ("Isolated", true),
        ("Removed", false),
        ("Removed", true),
    ] {
        let json = gpt2_with(|j| {
            j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": behavior, "invert": invert},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]});
        });
        assert_fast_and_equal(&json, TEXTS);
    }
}

/// Regex Splits one after another before ByteLevel (DeepSeek V3's shape): HF applies each to
/// every piece the one before kept, and so does the fast path; an empty normalizer Sequence, or
/// one of NFC alone, is that normalizer.
#[test]
fn splits_one_after_another_are_reproduced() {
    // GPT-2's pattern, which its ByteLevel pre-tokenizer holds inside.
    let gpt2_pattern =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    let texts: Vec<&str> = TEXTS
        .iter()
        .copied()
        .chain([
            "12345 1234567 a1b22c333d4444",
            "日本語のテキストです。中文 mixed 文字123",
        ])
        .collect();
    for (first, behavior, normalizer) in [
        (
            "\\p{N}{1,3}",
            "Isolated",
            json!({"type": "Sequence", "normalizers": []}),
        ),
        (
            "[一-龥぀-ゟ゠-ヿ]+",
            "Isolated",
            json!({"type": "Sequence", "normalizers": [{"type": "NFC"}]}),
        ),
        ("\\s+", "Removed", Value::Null),
    ] {
        let json = gpt2_with(|j| {
            j["normalizer"] = normalizer.clone();
            j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": first}, "behavior": behavior, "invert": false},
                {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Isolated", "invert": false},
                {"type": "Split", "pattern": {"Regex": gpt2_pattern}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]});
        });
        assert_fast_and_equal(&json, &texts);
        let description = stage(&json, EngineChoice::Own).engine_description();
        assert!(description.contains("\" then \""), "{description}");
    }
    // The last cut before a ByteLevel without its regex must be a regex Split.
    let json = gpt2_with(|j| {
        j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": false},
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]});
    });
    assert_refused(
        &json,
        "pre-tokenizer [Split, Digits, ByteLevel] is not reproduced",
    );
}

/// `Digits` before ByteLevel (Command R+'s shape, each digit a piece), or before other splits:
/// cut where `char::is_numeric` holds, as HF cuts (at this build's versions that takes digits the
/// regex tables do not know yet: U+11DE0.., U+16FF4..).
#[test]
fn digits_before_the_last_split_are_reproduced() {
    let texts: Vec<&str> = TEXTS
        .iter()
        .copied()
        .chain([
            "12345 1234567 a1b22c333d4444 ٣٤٥ ²³ Ⅻ ½ 𝟙𝟚",
            // GPT-2's merges give these the same ids however they are cut; the cut itself is
            // checked against HF's `Digits` in engines/byte_level.rs.
            "\u{11DE0}\u{11DE1}x \u{16FF4}\u{16FF5}\u{16FF6}y 1\u{11DE9}2 \u{11DE0}",
        ])
        .collect();
    for (individual, then, byte_level_regex, shown) in [
        (true, None, true, "Digits (each) then "),
        (false, None, true, "Digits (runs) then "),
        (true, Some("\\s+"), false, "Digits (each) then \"\\\\s+\""),
    ] {
        let json = gpt2_with(|j| {
            let mut steps = vec![json!({"type": "Digits", "individual_digits": individual})];
            if let Some(pattern) = then {
                steps.push(json!({"type": "Split", "pattern": {"Regex": pattern},
                    "behavior": "Isolated", "invert": false}));
            }
            steps.push(json!({"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": true, "use_regex": byte_level_regex}));
            j["normalizer"] = json!({"type": "NFC"});
            j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": steps});
        });
        assert_fast_and_equal(&json, &texts);
        let description = stage(&json, EngineChoice::Own).engine_description();
        assert!(description.contains(shown), "{description}");
    }
}

#[test]
fn other_pre_tokenizers_fall_back_to_hf() {
    let merged = gpt2_with(|j| {
        j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "MergedWithPrevious", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]});
    });
    assert_refused(&merged, "Split behavior MergedWithPrevious");
    let prefix = gpt2_with(|j| j["pre_tokenizer"]["add_prefix_space"] = json!(true));
    assert_refused(&prefix, "pre-tokenizer [ByteLevel] is not reproduced");
    let whitespace = gpt2_with(|j| j["pre_tokenizer"] = json!({"type": "Whitespace"}));
    assert_refused(&whitespace, "pre-tokenizer [Whitespace] is not reproduced");
}

#[test]
fn model_and_tokenizer_settings_fall_back_to_hf() {
    let dropout = gpt2_with(|j| j["model"]["dropout"] = json!(0.1));
    let description = stage(&dropout, EngineChoice::Own).engine_description();
    assert!(description.contains("dropout"), "{description}");
    let fallback = gpt2_with(|j| j["model"]["byte_fallback"] = json!(true));
    // byte_fallback is SentencePiece-style BPE, whose engine wants its normalizer.
    assert_refused(
        &fallback,
        "SentencePiece-style BPE: the fast path reproduces spaces written as",
    );
    let truncation = gpt2_with(|j| {
        j["truncation"] =
            json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0});
    });
    assert_refused(&truncation, "truncation is set");
}

#[test]
fn ignore_merges_is_reproduced() {
    let json = gpt2_with(|j| j["model"]["ignore_merges"] = json!(true));
    assert_fast_and_equal(&json, TEXTS);
}

/// The fast path runs HF's merge loop over HF's merges, so merge order need not follow the ids
/// (the tiktoken-based engine before it refused such files).
#[test]
fn merges_out_of_id_order_are_reproduced() {
    // Swap merges #1 ("Ġ a" → 257) and #2 ("h e" → 258): HF's order no longer follows the ids.
    let json = gpt2_with(|j| {
        let merges = j["model"]["merges"].as_array_mut().expect("merges");
        merges.swap(1, 2);
    });
    assert_fast_and_equal(&json, TEXTS);
}

/// A byte-level BPE from GPT-2's 256 byte tokens (ids 0–255) plus `extra` tokens (ids from 256)
/// and `merges`.
fn tiny_bpe(extra: &[&str], merges: &[&str], ignore_merges: bool) -> Value {
    let mut vocab: serde_json::Map<String, Value> = GPT2_JSON["model"]["vocab"]
        .as_object()
        .expect("vocab")
        .iter()
        .filter(|(_, id)| id.as_u64().is_some_and(|id| id < 256))
        .map(|(t, id)| (t.clone(), id.clone()))
        .collect();
    for (i, token) in extra.iter().enumerate() {
        vocab.insert(token.to_string(), json!(256 + i));
    }
    let mut json = GPT2_JSON.clone();
    json["added_tokens"] = json!([]);
    json["model"] = json!({
        "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
        "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
    });
    json
}

#[test]
fn a_token_only_a_non_listed_pair_makes_is_never_merged() {
    // Ids rise along the merges, and "a" + "bc" would make "abc" (a token), but that pair is not
    // a listed merge: HF gives [a, bc], and so does the fast path.
    let json = tiny_bpe(&["bc", "ab", "abc"], &["b c", "a b", "ab c"], false);
    assert_fast_and_equal(&json, &["abc", "abcab", "xabc abc"]);
    let a = GPT2_JSON["model"]["vocab"]["a"].as_u64().expect("a");
    assert_eq!(
        encode(&stage(&json, EngineChoice::Own), "abc"),
        [a as u32, 256, 0]
    );
}

#[test]
fn token_no_merge_reaches_is_left_out_unless_ignore_merges() {
    // "xyz" is in the vocabulary but no merge builds it: HF gives x, y, z unless
    // ignore_merges, when it looks the whole piece up.
    let texts = ["xyz", "abxyz", " xyz xyzab", "ab"];
    let strict = tiny_bpe(&["ab", "xyz"], &["a b"], false);
    assert_fast_and_equal(&strict, &texts);
    assert_eq!(encode(&stage(&strict, EngineChoice::Own), "xyz").len(), 4);
    let lookup = tiny_bpe(&["ab", "xyz"], &["a b"], true);
    assert_fast_and_equal(&lookup, &texts);
    assert_eq!(encode(&stage(&lookup, EngineChoice::Own), "xyz"), [257, 0]);
}

/// Vocabularies converted from tiktoken (Llama 3, cl100k) list every split of a token into two
/// tokens, one after another, in rank order. tiktoken builds "abc" from "ab" + "c" (its second
/// listed merge here); HF reaches the same, so the fast path is taken and agrees.
#[test]
fn several_merges_for_one_token_in_rank_order_take_the_fast_path() {
    let texts = [
        "abc",
        "abcabc",
        "aabcc",
        "bcabc",
        "a bc ab c",
        "cba",
        "abbc",
        "xabcx",
    ];
    let json = tiny_bpe(&["ab", "bc", "abc"], &["a b", "b c", "a bc", "ab c"], false);
    assert_fast_and_equal(&json, &texts);
    assert_eq!(encode(&stage(&json, EngineChoice::Own), "abc"), [258, 0]);
    let lookup = tiny_bpe(&["ab", "bc", "abc"], &["a b", "b c", "a bc", "ab c"], true);
    assert_fast_and_equal(&lookup, &texts);
}

/// A token's merges split by another token's (ids go down along the list): reproduced.
#[test]
fn merges_of_one_token_apart_are_reproduced() {
    let json = tiny_bpe(&["ab", "bc", "abc"], &["a b", "a bc", "b c", "ab c"], false);
    assert_fast_and_equal(
        &json,
        &["abc", "abcabc", "aabcc", "bcabc", "a bc ab c", "xabcx"],
    );
}

/// SentencePiece-style BPE: the fast path reproduces a normalizer that writes spaces as "▁", with
/// or without a "▁" prepended, and a pre-tokenizer that cuts nothing once it has (none, or a
/// Split on a string with a space in it); it refuses anything else, saying which.
#[test]
fn sentencepiece_normalizers_and_pre_tokenizers() {
    let Some(path) = support::fetched_tokenizer("yi") else {
        return;
    };
    let yi: Value = serde_json::from_slice(&std::fs::read(path).expect("yi")).expect("json");
    let yi_with = |edit: &dyn Fn(&mut Value)| {
        let mut json = yi.clone();
        edit(&mut json);
        json
    };
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let prepend = json!({"type": "Prepend", "prepend": "\u{2581}"});
    // Yi's own: a Sequence of one Replace; Gemma's: the Replace alone; Llama 2's: Prepend first.
    assert_fast_and_equal(&yi, TEXTS);
    assert_fast_and_equal(&yi_with(&|j| j["normalizer"] = replace.clone()), TEXTS);
    let llama2_like = yi_with(&|j| {
        j["normalizer"] = json!({"type": "Sequence", "normalizers": [prepend, replace]});
    });
    assert_fast_and_equal(&llama2_like, TEXTS);
    assert!(
        stage(&llama2_like, EngineChoice::Own)
            .engine_description()
            .contains("normalizer Prepend \"▁\" + Replace")
    );
    // Gemma 3's Split on " ", after every space became "▁".
    let split = |pattern: &str, invert: bool| {
        json!({"type": "Split", "pattern": {"String": pattern}, "behavior": "MergedWithPrevious",
               "invert": invert})
    };
    assert_fast_and_equal(&yi_with(&|j| j["pre_tokenizer"] = split(" ", false)), TEXTS);
    for refused in [
        split("e", false),
        split(" ", true),
        json!({"type": "Whitespace"}),
    ] {
        let json = yi_with(&|j| j["pre_tokenizer"] = refused.clone());
        assert_refused(&json, "SentencePiece-style BPE with pre-tokenizer");
    }
    // No normalizer and a Metaspace pre-tokenizer (what recent `transformers` writes), each
    // prepend scheme, on texts that start with a space, a "▁" or an added token, or none.
    let metaspace_texts: Vec<String> = TEXTS
        .iter()
        .flat_map(|t| {
            [
                t.to_string(),
                format!(" {t}"),
                format!("\u{2581}{t}"),
                format!("<|endoftext|>{t}"),
                format!("<|endoftext|> {t}<|endoftext|>x"),
            ]
        })
        .collect();
    let metaspace_texts: Vec<&str> = metaspace_texts.iter().map(String::as_str).collect();
    let metaspace = |scheme: &str, split: bool| {
        yi_with(&|j| {
            j["normalizer"] = Value::Null;
            j["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "\u{2581}",
                "prepend_scheme": scheme, "split": split});
        })
    };
    for scheme in ["first", "always", "never"] {
        let json = metaspace(scheme, false);
        assert_fast_and_equal(&json, &metaspace_texts);
        let description = stage(&json, EngineChoice::Own).engine_description();
        assert!(
            description.contains(&format!("Metaspace (prepend_scheme {scheme})")),
            "{description}"
        );
    }
    // Cutting before every "▁" is not reproduced.
    assert_refused(&metaspace("first", true), "not the normalizer none");
    // Spaces as something else, or one more step: refused.
    let underscore = json!({"type": "Replace", "pattern": {"String": " "}, "content": "_"});
    let lowercase = json!({"type": "Sequence", "normalizers": [replace, {"type": "Lowercase"}]});
    for refused in [underscore, lowercase] {
        let json = yi_with(&|j| j["normalizer"] = refused.clone());
        assert_refused(&json, "the fast path reproduces spaces written as");
    }
    // A byte token an ASCII character with its own token never needs may be missing (Gemma has
    // "\t" and no <0x09>); one a character outside the vocabulary would need may not.
    let without = |byte: &str| {
        yi_with(&|j| {
            let vocab = j["model"]["vocab"].as_object_mut().expect("vocab");
            assert!(vocab.remove(byte).is_some(), "{byte} in Yi's vocabulary");
        })
    };
    assert_fast_and_equal(&without("<0x09>"), &["a\tb\t\t", "\t 🦀\t"]);
    assert_refused(&without("<0xF0>"), "byte fallback token <0xF0> is missing");
}
