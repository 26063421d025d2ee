//! Hugging Face `tokenizers` 1.x (a release candidate, the `tokenizers1` dependency) as an engine
//! of the stage beside HF 0.23 and the fast path ([`crate::EngineChoice::Hf1`]): it reads the
//! same `tokenizer.json` (upgraded to 1.x's canonical form by its own converter) and gives the
//! ids of `encode(text, add_special_tokens=False)`; the stage adds BOS/EOS as for any engine.
//! Synchronous: built without 1.x's `parallelism` feature, it starts no thread.

use std::cell::RefCell;

use tokenizers1::pipeline::{EncodeOptions, PipelineToken, PipelineTokenizer};

use super::EncodeError;

/// The version pinned in the workspace's Cargo.toml, for the engine line.
pub(crate) const VERSION: &str = "1.0.0-rc.3";

thread_local! {
    /// 1.x appends `PipelineToken`s; one buffer per thread, reused, so an encode allocates
    /// nothing of its own before its ids are copied out.
    static TOKENS: RefCell<Vec<PipelineToken>> = const { RefCell::new(Vec::new()) };
}

/// Whether 1.x cuts `text` into the pieces 0.23 cuts it into, as far as is known. Two kinds of
/// text are not, and go to HF 0.23 itself:
/// - a whitespace run longer than 64 KiB: there fancy-regex, which 0.23 splits with, may give up
///   (its backtrack limit, at about a million characters) and leave the rest of the text uncut,
///   where 1.x's pre-tokenizer cuts on (a million spaces under cl100k and o200k: 3 ids against
///   7,819). The bound is the one below which dsprep's scanners are proven to match the regex
///   ([`crate::scanner::SCANNED_RUN_LIMIT`]);
/// - a character 0.23's Unicode tables do not assign (`\p{Cn}` of `regex-syntax`, the crate
///   fancy-regex compiles 0.23's patterns with), which 1.x's newer tables may: "𲎰", U+323B0,
///   assigned in Unicode 17, is a letter to 1.x and a symbol to 0.23 (DeepSeek V3: `" 𲎰"` is
///   one id and four under 0.23);
/// - "ſ" (U+017F, long s), which Unicode case folding makes an `s`: 0.23's regex takes `'ſ` for
///   the contraction `(?i:'s)` of cl100k's and o200k's patterns, 1.x does not (o200k:
///   `"'s'ſ'vEA"` is 7 ids under 0.23, 8 under 1.x; found by the random fragments).
///
/// An ASCII text is read once, by `is_ascii`; most texts are decided at their first pass.
pub(crate) fn cuts_like_hf(text: &str) -> bool {
    const LIMIT: usize = crate::scanner::SCANNED_RUN_LIMIT;
    if text.len() > LIMIT && has_whitespace_run_over(text, LIMIT) {
        return false;
    }
    text.is_ascii() || !unassigned_in_hf023().any_in(text)
}

/// Whether `text` holds a run of whitespace longer than `limit` bytes.
fn has_whitespace_run_over(text: &str, limit: usize) -> bool {
    let mut run = 0;
    for c in text.chars() {
        if c.is_whitespace() {
            run += c.len_utf8();
            if run > limit {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// The characters 0.23's regex tables do not assign: the Basic Multilingual Plane as a bitmap
/// (8 KiB), the planes above as ranges.
struct Unassigned {
    bmp: Box<[u64; 1024]>,
    astral: Vec<(u32, u32)>,
}

impl Unassigned {
    fn any_in(&self, text: &str) -> bool {
        text.chars().filter(|c| !c.is_ascii()).any(|c| {
            let c = u32::from(c);
            match usize::try_from(c) {
                Ok(i) if c < 0x1_0000 => self.bmp[i / 64] & (1 << (i % 64)) != 0,
                _ => crate::scanner::char_classes::contains(&self.astral, c),
            }
        })
    }
}

/// The characters that Unicode simple case folding makes one of a contraction's letters (`s t r
/// e v m l d`) besides the ASCII ones: 0.23's `(?i:'s|…)` matches them, 1.x's pre-tokenizer does
/// not. Only the long s (U+017F → `s`); the Kelvin sign (U+212A) folds to `k`, in no contraction.
const FOLDS_TO_A_CONTRACTION: [u32; 1] = [0x017F];

/// [`Unassigned`], built once per process from `regex-syntax`'s `\p{Cn}`. Should the class not
/// parse (it always does), every non-ASCII character counts as unassigned: such texts go to 0.23.
fn unassigned_in_hf023() -> &'static Unassigned {
    static TABLE: std::sync::OnceLock<Unassigned> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let ranges = crate::scanner::char_classes::ranges(r"\p{Cn}")
            .unwrap_or_else(|_| vec![(0x80, 0x10_FFFF)]);
        let mut bmp = Box::new([0u64; 1024]);
        let mut astral = Vec::new();
        for (start, end) in ranges {
            for c in start..=end.min(0xFFFF) {
                bmp[(c / 64) as usize] |= 1 << (c % 64);
            }
            if end > 0xFFFF {
                astral.push((start.max(0x1_0000), end));
            }
        }
        // Not unassigned, but cut otherwise by 1.x all the same (see `cuts_like_hf`).
        for c in FOLDS_TO_A_CONTRACTION {
            bmp[(c / 64) as usize] |= 1 << (c % 64);
        }
        Unassigned { bmp, astral }
    })
}

/// Why HF `tokenizers` 1.x does not read a `tokenizer.json` (its own error's text included).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Hf1Error {
    #[error("not UTF-8: {0}")]
    NotUtf8(std::str::Utf8Error),
    /// 1.x's converter to its canonical form refused the file.
    #[error("its converter refused the file: {message}")]
    Converter { message: String },
    /// 1.x's reader refused the converted file.
    #[error("its reader refused the converted file: {message}")]
    Reader { message: String },
}

/// HF `tokenizers` 1.x's tokenizer for one `tokenizer.json`.
pub(crate) struct Hf1Engine {
    tokenizer: PipelineTokenizer,
    options: EncodeOptions,
    /// Padding set in the file: 0.23's `encode` pads a lone document, which 1.x does only on its
    /// general path, not in `encode_into`.
    pads: bool,
}

impl Hf1Engine {
    /// Read a `tokenizer.json`, or say why 1.x does not.
    pub fn from_json(json: &[u8]) -> Result<Self, Hf1Error> {
        let text = std::str::from_utf8(json).map_err(Hf1Error::NotUtf8)?;
        let canonical = tokenizers1::canonicalize_str(text).map_err(|e| Hf1Error::Converter {
            message: e.to_string(),
        })?;
        let tokenizer = tokenizers1::from_json(&canonical).map_err(|e| Hf1Error::Reader {
            message: e.to_string(),
        })?;
        let pads = tokenizer.get_padding().is_some();
        Ok(Self {
            tokenizer,
            options: EncodeOptions::no_specials(),
            pads,
        })
    }

    /// The engine line: the engine, and `why` it encodes.
    pub fn description(&self, why: &str) -> String {
        format!("HF tokenizers {VERSION} ({why})")
    }

    /// Append the ids of `text` to `out`; on error `out` may hold some of them (the stage
    /// truncates).
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), EncodeError> {
        let failed = |e: &dyn std::fmt::Display| EncodeError::Hf1 {
            message: e.to_string(),
        };
        if self.pads {
            let encodings = self
                .tokenizer
                .encode(text, &self.options)
                .wait()
                .map_err(|e| failed(&e))?;
            for encoding in &encodings {
                out.extend(encoding.ids().iter().map(|t| t.id()));
            }
            return Ok(());
        }
        TOKENS.with_borrow_mut(|tokens| {
            tokens.clear();
            let encoded = self
                .tokenizer
                .encode_into(text, &self.options, tokens)
                .map_err(|e| failed(&e));
            out.extend(tokens.iter().map(|t| t.id()));
            encoded
        })
    }
}

#[cfg(test)]
mod tests {
    use super::cuts_like_hf;
    use crate::scanner::SCANNED_RUN_LIMIT as LIMIT;

    /// Only a whitespace run over the bound sends a text to 0.23: of spaces, or of wider
    /// whitespace (U+3000, three bytes), counted in bytes; a long text without one stays.
    #[test]
    fn a_whitespace_run_past_the_bound_goes_to_hf_023() {
        assert!(cuts_like_hf(&" ".repeat(LIMIT)));
        assert!(cuts_like_hf(&format!("a{}b", " ".repeat(LIMIT))));
        assert!(!cuts_like_hf(&format!("a{}b", " ".repeat(LIMIT + 1))));
        assert!(!cuts_like_hf(&format!(
            "a{}",
            "\u{3000}".repeat(LIMIT / 3 + 1)
        )));
        assert!(!cuts_like_hf(&format!(
            "x\n{}\t",
            "\u{a0} ".repeat(LIMIT / 3 + 1)
        )));
        assert!(cuts_like_hf(&"word ".repeat(3 * LIMIT)));
        assert!(cuts_like_hf(&format!(
            "{}x{}",
            " ".repeat(LIMIT),
            " ".repeat(LIMIT)
        )));
    }

    /// A character 0.23's tables do not assign sends a text to 0.23: U+323B0 (Unicode 17) and
    /// U+0378 (unassigned everywhere); assigned ones, in and above the BMP, do not.
    #[test]
    fn a_character_hf_023_does_not_know_goes_to_hf_023() {
        assert!(!cuts_like_hf("a \u{323B0} b"));
        assert!(!cuts_like_hf("\u{0378}"));
        assert!(cuts_like_hf("日本語 café 😀 𝟙 \u{20000} Ελληνικά"));
        assert!(cuts_like_hf("plain ASCII"));
    }

    /// The long s, a contraction's `s` to 0.23's case-insensitive regex, sends a text to 0.23.
    #[test]
    fn the_long_s_goes_to_hf_023() {
        assert!(!cuts_like_hf("'s'\u{17F}'vEA"));
        assert!(!cuts_like_hf("Waſſer"));
        assert!(cuts_like_hf("Wasser \u{212A}"));
    }
}
