//! Turning a source's glob patterns into its shard list: every pattern must match at least one
//! file; matches are sorted by path and de-duplicated, then shuffled with the recipe seed when
//! `shuffle_shards` is on (each source has its own stream, keyed by its name).

use dsprep_mixers::recipe::{Recipe, SourceSpec};
use dsprep_mixers::rng::StageRng;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("source {name:?}: files[{index}] {pattern:?} is not a valid glob pattern: {message}")]
    Pattern {
        name: String,
        index: usize,
        pattern: String,
        message: String,
    },
    #[error("source {name:?}: files[{index}] {pattern:?} matches no file (looked for {})", resolved.display())]
    NoMatch {
        name: String,
        index: usize,
        pattern: String,
        resolved: PathBuf,
    },
    #[error("source {name:?}: cannot read {}: {message}", path.display())]
    Unreadable {
        name: String,
        path: PathBuf,
        message: String,
    },
}

/// The shards of `spec`, in reading order. Patterns are relative to `base` (the recipe's folder).
pub fn list_shards(
    recipe: &Recipe,
    spec: &SourceSpec,
    base: &Path,
) -> Result<Vec<PathBuf>, ListError> {
    let mut shards = Vec::new();
    for (index, pattern) in spec.files.iter().enumerate() {
        let resolved = base.join(pattern);
        let pattern_text = resolved.to_string_lossy().into_owned();
        let matches = glob::glob(&pattern_text).map_err(|e| ListError::Pattern {
            name: spec.name.clone(),
            index,
            pattern: pattern.clone(),
            message: e.to_string(),
        })?;
        let before = shards.len();
        for entry in matches {
            let path = entry.map_err(|e| ListError::Unreadable {
                name: spec.name.clone(),
                path: e.path().to_path_buf(),
                message: e.error().to_string(),
            })?;
            if path.is_file() {
                shards.push(path);
            }
        }
        if shards.len() == before {
            return Err(ListError::NoMatch {
                name: spec.name.clone(),
                index,
                pattern: pattern.clone(),
                resolved,
            });
        }
    }
    shards.sort();
    shards.dedup();
    if recipe.shuffle.shuffle_shards {
        StageRng::new(recipe.shuffle.seed, &format!("shards/{}", spec.name)).shuffle(&mut shards);
    }
    Ok(shards)
}
