//! The texts both differential tests encode (`engine_differential.rs`, `hf1_differential.rs`):
//! real C4 rows, source code, hand-made edge cases; and the helpers they share. Every file read
//! is in the repository, but Python's standard library, used when installed.

use std::io::{BufRead, BufReader};
use std::path::Path;

use dsprep_tokenize::TokenizeStage;

pub const GPT2: &str = "../../config/tokenizers/gpt2/tokenizer.json";
pub const QWEN3: &str = "../../config/tokenizers/qwen3/tokenizer.json";
const C4_SAMPLES: &str = "../../config/samples/c4/en";
pub const C4_1000: &str = "../../tests/bench/data/c4-en-1000.json.gz";
const PYTHON_STDLIB: &str = "/root/.pyenv/versions/3.11.7/lib/python3.11";

pub fn read(path: impl AsRef<Path>) -> Vec<u8> {
    let path = path.as_ref();
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e} (tests run from mixers/tokenize/)", path.display()))
}

/// The ids of one document (`[BOS] text EOS`).
pub fn encode(stage: &TokenizeStage, text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    stage.encode_doc(text, &mut ids).expect("encodes");
    ids
}

/// The `text` of every row of a JSON-lines gzip file, labelled by file and line.
pub fn json_gz_rows(file: &Path) -> Vec<(String, String)> {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(file).expect("open"));
    (BufReader::new(gz).lines().enumerate())
        .map(|(n, line)| {
            let line = line.expect("gzip line");
            let row: serde_json::Value = serde_json::from_str(&line).expect("json row");
            let text = row["text"].as_str().expect("text field").to_string();
            (format!("{}:{}", file.display(), n + 1), text)
        })
        .collect()
}

/// The C4 rows of config/samples, in file order.
pub fn c4_rows() -> Vec<(String, String)> {
    let mut files: Vec<_> = std::fs::read_dir(C4_SAMPLES)
        .expect("c4 samples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    files.sort();
    files.iter().flat_map(|file| json_gz_rows(file)).collect()
}

/// Source code: this crate's own Rust files always, then up to `python_files` of Python's
/// standard library when installed (sorted by path).
pub fn source_files(python_files: usize) -> Vec<(String, String)> {
    fn walk(dir: &Path, ext: &str, limit: usize, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            if out.len() >= limit {
                return;
            }
            if path.is_dir() && ext == "rs" {
                walk(&path, ext, limit, out);
            } else if path.extension().is_some_and(|e| e == ext)
                && let Ok(text) = std::fs::read_to_string(&path)
            {
                out.push((path.display().to_string(), text));
            }
        }
    }
    let mut files = Vec::new();
    walk(Path::new("src"), "rs", usize::MAX, &mut files);
    let rust = files.len();
    assert!(rust > 5, "expected the crate's sources under src/");
    let limit = rust.saturating_add(python_files);
    walk(Path::new(PYTHON_STDLIB), "py", limit, &mut files);
    if files.len() == rust {
        eprintln!("{PYTHON_STDLIB} not found: source code is this crate's Rust files only");
    }
    files
}

/// Hand-made texts on the engines' edges (whitespace and digit runs, emoji, CJK, U+FFFD, NFC vs
/// NFD, what NFKC folds), and each of the file's `added` tokens inside text.
pub fn edge_cases(added: &[String]) -> Vec<(String, String)> {
    let lossy =
        String::from_utf8_lossy(b"abc\xff\xfe def \xc3\x28 x\xe2\x82 end\xf0\x9f").into_owned();
    let mut docs: Vec<String> = vec![
        String::new(),
        " ".into(),
        "\n".into(),
        "  hello world  ".into(),
        "   leading spaces".into(),
        "trailing spaces   ".into(),
        "Let $f(x) = 3x^2 + 2x - 7$. Then f'(x) = 6x+2; ∫₀¹ f(x) dx = -5. 2+2=4, 10/3≈3.333…, \
         e^{iπ}+1=0, x≤y≥z≠w, ∑_{n=1}^{∞} 1/n² = π²/6, (a+b)^2=a^2+2ab+b^2, 1e-9*3.5E+10"
            .into(),
        "I ❤️ Rust 🦀🦀 👨‍👩‍👧‍👦 family; flags 🇺🇸🇯🇵; thumbs 👍🏽👍🏿 ok👌".into(),
        "日本語のテキストです。中文文本，包含标点！한국어 텍스트입니다. 混合 mixed 文字 text"
            .into(),
        "العربية עברית हिन्दी के साथ ไทยภาษา Ελληνικά Русский".into(),
        lossy,
        "\u{FFFD}\u{FFFD}x\u{FFFD} \u{FFFD}".into(),
        " ".repeat(1000),
        format!("a{}b", " ".repeat(20_000)),
        "\t".repeat(300),
        "\n".repeat(500),
        " \t\n\r\n  \u{a0}\u{3000}\u{2028}x".repeat(40),
        "x \n \n\n  \t y\r\n\r\nz   \n".repeat(30),
        "1".repeat(5000),
        "0123456789".repeat(200),
        "3.14159265358979323846264338327950288419716939937510 and 1,000,000.00".into(),
        "१२३४ ٠١٢٣ ①②③ ½ ¼ Ⅻ 𝟙𝟚𝟛".into(),
        "a".repeat(10_000),
        "!!!!".repeat(1000),
        "-".repeat(2000),
        "=".repeat(300) + "\n" + &"#".repeat(300),
        "I'm, you're, they've, she'll, he'd, it's; IT'S, DON'T, We'Ll 's 'S ''s".into(),
        "café cafe\u{301} CAFÉ CAFE\u{301} \u{212b} A\u{30a} \u{1e9b}\u{323} q\u{307}\u{323}"
            .into(),
        "\u{1100}\u{1161}\u{11a8} 각 \u{ac00}\u{11a8}".into(),
        "カタカナ・ひらがな゛゜゠ー ２０２４年3月15日 〇一二三 .NET's e.g. U.S.A. (x)->y «z» ‹w›"
            .into(),
        "McDonald's HTTPServer iPhone XMLHttpRequest DON'T Don't \u{301}ABC! ǅungla ʰA Aʰb a//b !\n/"
            .into(),
        // What NFKC folds (Claude's file): ligatures, circled and super-script digits, half-width
        // kana, squared units, NBSP, letterlike symbols.
        "ﬁne ① x² Ⅻ ｶﾞ ㎏ \u{a0}nbsp ﬀ ﬃ ½ ™ ℌ ſt ﹏ ︵ ＡＢＣ１２３".into(),
        "e\u{301}<|endoftext|>\u{301}x".into(),
        "\u{0}\u{1}\u{7f} zero\u{200d}width \u{feff}bom \u{200b}".into(),
        "aGVsbG8gd29ybGQgdGhpcyBpcyBiYXNlNjQ=".repeat(50),
        "<|endoftext|".into(),
        "<|endoftext|>>".into(),
        "<<|endoftext|>".into(),
        "|endoftext|>".into(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>ok<|im_end|>"
            .into(),
    ];
    for token in added {
        docs.extend([
            token.clone(),
            format!("before{token}after"),
            format!(" {token} "),
            format!("{token}{token}"),
            format!("text\n\n{token}\n\nmore text"),
            format!("é{token}e\u{301}"),
        ]);
    }
    docs.into_iter()
        .enumerate()
        .map(|(i, d)| (format!("edge case #{i}"), d))
        .collect()
}
