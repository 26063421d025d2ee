//! Recipe validation without IO: every problem is collected, each with its field path.

use super::{
    ContentSpec, FieldError, Format, HubLocation, MAX_DOCUMENT_BYTES_LIMIT, MAX_POOL_BYTES,
    MixUnit, Oversize, PackStrategy, RECIPE_VERSION, Recipe, TextField, TokenRef,
};
use crate::split::MIN_SPLIT_LIMIT_BYTES;
use std::collections::HashSet;

/// Largest `seq_len` accepted: windows are indexed with `u32` token offsets.
const MAX_SEQ_LEN: u32 = 1 << 24;
/// Most lanes a recipe may ask for (each is a pipeline with its own reader thread).
const MAX_LANES: u32 = 4096;
/// Largest shuffle buffer accepted (documents held in memory at once).
const MAX_BUFFER_SIZE: usize = 100_000_000;

pub(super) fn validate(recipe: &Recipe) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut fail = |path: String, message: String| errors.push(FieldError { path, message });

    if recipe.version != RECIPE_VERSION {
        fail(
            "version".into(),
            format!(
                "unsupported recipe version {} (this dsprep reads version {RECIPE_VERSION})",
                recipe.version
            ),
        );
    }
    if recipe.tokenizer.path.trim().is_empty() {
        fail(
            "tokenizer.path".into(),
            "must name a tokenizer.json file".into(),
        );
    }
    for (field, token) in [
        ("eos", Some(&recipe.tokenizer.eos)),
        ("bos", recipe.tokenizer.bos.as_ref()),
    ] {
        if let Some(TokenRef::Text(text)) = token
            && text.is_empty()
        {
            fail(
                format!("tokenizer.{field}"),
                "must be a token string or id, got an empty string".into(),
            );
        }
    }
    let seq_len = recipe.packing.seq_len;
    if seq_len == 0 || seq_len > MAX_SEQ_LEN {
        fail(
            "packing.seq_len".into(),
            format!("must be between 1 and {MAX_SEQ_LEN}, got {seq_len}"),
        );
    }
    packing_problems(recipe, &mut fail);
    if recipe.shuffle.buffer_size > MAX_BUFFER_SIZE {
        fail(
            "shuffle.buffer_size".into(),
            format!(
                "must be at most {MAX_BUFFER_SIZE}, got {}",
                recipe.shuffle.buffer_size
            ),
        );
    }

    if let Some(lanes) = &recipe.lanes {
        if lanes.count == 0 || lanes.count > MAX_LANES {
            fail(
                "lanes.count".into(),
                format!("must be between 1 and {MAX_LANES}, got {}", lanes.count),
            );
        }
        if lanes.block_windows == 0 {
            fail(
                "lanes.block_windows".into(),
                "must be at least 1 (windows taken from one lane in a row)".into(),
            );
        }
    }

    if recipe.sources.is_empty() {
        fail(
            "source".into(),
            "a recipe needs at least one [[source]]".into(),
        );
    }
    let mut names = HashSet::new();
    for (i, source) in recipe.sources.iter().enumerate() {
        let at = |field: &str| format!("source[{i}].{field}");
        let name = &source.name;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            fail(
                at("name"),
                format!(
                    "must be non-empty and use only letters, digits, '-', '_', '.', got {name:?}"
                ),
            );
        } else if !names.insert(name.as_str()) {
            fail(at("name"), format!("{name:?} is used by an earlier source"));
        }
        if !source.weight.is_finite() || source.weight < 0.0 {
            fail(
                at("weight"),
                format!("must be a finite number >= 0, got {}", source.weight),
            );
        }
        if source.files.is_empty() {
            fail(
                at("files"),
                "must list at least one file or glob pattern".into(),
            );
        }
        for (j, pattern) in source.files.iter().enumerate() {
            if pattern.trim().is_empty() {
                fail(format!("source[{i}].files[{j}]"), "is empty".into());
            } else if HubLocation::is_hub(pattern)
                && let Err(message) = HubLocation::parse(pattern)
            {
                fail(format!("source[{i}].files[{j}]"), message);
            }
        }
        if let Some(limit) = source.max_document_bytes
            && !(1..=MAX_DOCUMENT_BYTES_LIMIT).contains(&limit)
        {
            fail(
                at("max_document_bytes"),
                format!("must be 1 to {MAX_DOCUMENT_BYTES_LIMIT} (1 GiB), got {limit}"),
            );
        }
        if source.oversize == Some(Oversize::Split)
            && let Some(limit) = source.max_document_bytes
            && limit < MIN_SPLIT_LIMIT_BYTES
        {
            fail(
                at("max_document_bytes"),
                format!(
                    "must be at least {MIN_SPLIT_LIMIT_BYTES} with oversize = \"split\" (a piece \
                     must hold any character), got {limit}"
                ),
            );
        }
        if let Some(content) = &source.content {
            for (field, message) in content_problems(content, &source.text, source.format) {
                fail(format!("source[{i}].content{field}"), message);
            }
        }
        match &source.text {
            TextField::Column(column) if column.is_empty() => {
                fail(at("text"), "must name a column".into())
            }
            TextField::Join(join) if join.list.is_empty() || join.field.is_empty() => {
                fail(
                    at("text"),
                    "`list` and `field` must name a column and a field".into(),
                );
            }
            _ => {}
        }
    }
    if !recipe.sources.is_empty() && recipe.sources.iter().all(|s| s.weight == 0.0) {
        fail(
            "source".into(),
            "all weights are zero: at least one source needs weight > 0".into(),
        );
    }
    for (path, message) in phase_problems(recipe) {
        fail(path, message);
    }
    for (path, message) in adaptive_problems(recipe) {
        fail(path, message);
    }
    errors
}

/// `[mix.adaptive]`: its own settings, and what it needs of the rest of the recipe (a mix in
/// tokens: its decisions are shares of tokens; no `[[mix.phase]]` beside it). What the lanes can
/// give is checked once they are dealt (`driver::lanes`).
fn adaptive_problems(recipe: &Recipe) -> Vec<(String, String)> {
    let Some(spec) = &recipe.mix.adaptive else {
        return Vec::new();
    };
    let sources = recipe.sources.iter().filter(|s| s.weight > 0.0).count();
    let mut problems = super::adaptive::adaptive_problems(spec, sources);
    if recipe.mix.unit != MixUnit::Tokens {
        problems.push((
            "mix.adaptive".into(),
            "decides shares of tokens: it needs [mix] unit = \"tokens\"".into(),
        ));
    }
    if !recipe.mix.phases.is_empty() {
        problems.push((
            "mix.adaptive".into(),
            "cannot be combined with [[mix.phase]]: the decisions are the stream's phases".into(),
        ));
    }
    problems
}

/// `[packing]` beyond `seq_len`: the pool of `best_fit` and what it needs (whether `pad` names
/// a special token of the tokenizer is checked once the tokenizer is loaded).
fn packing_problems(recipe: &Recipe, fail: &mut impl FnMut(String, String)) {
    let packing = &recipe.packing;
    let window = packing.window_tokens() as u64;
    match packing.strategy {
        PackStrategy::Concat => {
            for (field, set) in [
                ("pool_documents", packing.pool_documents.is_some()),
                ("pad", packing.pad.is_some()),
            ] {
                if set {
                    fail(
                        format!("packing.{field}"),
                        "only applies to strategy = \"best_fit\" (concat never pads): remove it \
                         or set packing.strategy = \"best_fit\""
                            .into(),
                    );
                }
            }
        }
        PackStrategy::BestFit => {
            let pool = packing.pool_documents().unwrap_or_default();
            let bytes = (pool as u64).saturating_mul(window).saturating_mul(4);
            if pool == 0 {
                fail(
                    "packing.pool_documents".into(),
                    "must be at least 1 (documents waiting to fill windows; the default is 10000)"
                        .into(),
                );
            } else if bytes > MAX_POOL_BYTES {
                fail(
                    "packing.pool_documents".into(),
                    format!(
                        "{pool} documents of up to {window} tokens may hold {} GiB, over the \
                         pool's cap of {} GiB: use at most {} documents at this seq_len",
                        bytes >> 30,
                        MAX_POOL_BYTES >> 30,
                        MAX_POOL_BYTES / (window * 4)
                    ),
                );
            }
            let overhead = 1 + u64::from(recipe.tokenizer.bos.is_some());
            if window <= overhead {
                fail(
                    "packing.seq_len".into(),
                    format!(
                        "a window of {window} tokens holds nothing but the BOS/EOS every \
                         document carries: best_fit needs seq_len of at least {overhead}"
                    ),
                );
            }
            if let Some(TokenRef::Text(text)) = &packing.pad
                && text.is_empty()
            {
                fail(
                    "packing.pad".into(),
                    "must be a token string or id, got an empty string".into(),
                );
            }
        }
    }
}

/// `[[mix.phase]]`: a mix in tokens, points in increasing order, weights of named sources, not
/// all zero.
fn phase_problems(recipe: &Recipe) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let phases = &recipe.mix.phases;
    if phases.is_empty() {
        return problems;
    }
    if recipe.mix.unit != MixUnit::Tokens {
        problems.push((
            "mix.phase".into(),
            "phases switch at a number of tokens: they need [mix] unit = \"tokens\"".into(),
        ));
    }
    let mut previous = 0u64;
    for (k, phase) in phases.iter().enumerate() {
        let at = |field: &str| format!("mix.phase[{k}].{field}");
        if phase.at_tokens <= previous {
            problems.push((
                at("at_tokens"),
                match k {
                    0 => format!("must be above 0, got {}", phase.at_tokens),
                    _ => format!(
                        "must be after phase[{}]'s {previous}, got {}",
                        k - 1,
                        phase.at_tokens
                    ),
                },
            ));
        }
        previous = previous.max(phase.at_tokens);
        for (name, &weight) in &phase.weights {
            if !recipe.sources.iter().any(|s| &s.name == name) {
                problems.push((
                    format!("mix.phase[{k}].weights.{name}"),
                    "no [[source]] has this name".into(),
                ));
            } else if !weight.is_finite() || weight < 0.0 {
                problems.push((
                    format!("mix.phase[{k}].weights.{name}"),
                    format!("must be a finite number >= 0, got {weight}"),
                ));
            }
        }
        if !phase.weights.values().any(|&w| w > 0.0) {
            problems.push((
                at("weights"),
                "no source has weight > 0 in this phase".into(),
            ));
        }
    }
    problems
}

/// Largest `content.concurrency` accepted.
const MAX_CONTENT_CONCURRENCY: usize = 1024;

/// Problems of a `[source.content]` table, as (field suffix, message).
fn content_problems(
    content: &ContentSpec,
    text: &TextField,
    format: Format,
) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    match (&content.url_template, &content.mirror_dir) {
        (Some(_), Some(_)) => problems.push((
            "",
            "set either url_template or mirror_dir, not both".to_string(),
        )),
        (Some(template), None) if !template.contains("{blob_id}") => problems.push((
            ".url_template",
            format!("must contain {{blob_id}}, got {template:?}"),
        )),
        (None, Some(dir)) if dir.trim().is_empty() => {
            problems.push((".mirror_dir", "is empty".to_string()))
        }
        _ => {}
    }
    if content.concurrency == 0 || content.concurrency > MAX_CONTENT_CONCURRENCY {
        problems.push((
            ".concurrency",
            format!(
                "must be between 1 and {MAX_CONTENT_CONCURRENCY}, got {}",
                content.concurrency
            ),
        ));
    }
    if content.encoding_field.is_empty() {
        problems.push((".encoding_field", "must name a field".to_string()));
    }
    if !matches!(text, TextField::Join(_)) {
        problems.push((
            "",
            "needs text = { list = \"files\", field = \"blob_id\" }: the list of files and their id field"
                .to_string(),
        ));
    }
    if format != Format::Parquet {
        problems.push(("", "needs format = \"parquet\"".to_string()));
    }
    problems
}

/// `source.2.weights` (serde_ignored's path) → `source[2].weights`.
pub(super) fn index_path(path: &str) -> String {
    let mut out = String::new();
    for segment in path.split('.').filter(|s| *s != "?") {
        if segment.chars().all(|c| c.is_ascii_digit()) && !out.is_empty() {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(segment);
        }
    }
    out
}
