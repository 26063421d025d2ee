//! Turning a source's patterns into its shard list. Local patterns are globs on disk; Hub
//! patterns (`hf://datasets/…`) resolve their revision to a commit sha once, list the folder
//! before the first glob character through the tree API (every page), and match the glob over
//! that listing — file names are never built. Every pattern must match at least one file;
//! matches are sorted by path and de-duplicated, then shuffled with the recipe seed when
//! `shuffle_shards` is on (each source has its own stream, keyed by its name).

use super::Shard;
use crate::hub::{HubClient, HubError};
use dsprep_mixers::recipe::{HubLocation, Recipe, SourceSpec};
use dsprep_mixers::rng::StageRng;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    #[error("source {name:?}: files[{index}] {pattern:?}: {error}")]
    Hub {
        name: String,
        index: usize,
        pattern: String,
        /// Not a `source`: its text is in this message already.
        error: HubError,
    },
    /// `listing`: which repo, commit and folder were listed, and how many files it held.
    #[error("source {name:?}: files[{index}] {pattern:?} matches no file of {listing}")]
    NoHubMatch {
        name: String,
        index: usize,
        pattern: String,
        listing: String,
    },
    #[error(
        "source {name:?}: files[{index}] {pattern:?} is on the Hub, and no Hub client was made"
    )]
    NoHubClient {
        name: String,
        index: usize,
        pattern: String,
    },
}

/// The local shards of `spec`, in reading order. Patterns are relative to `base` (the recipe's
/// folder); a Hub pattern is an error here (use [`list_source`]).
pub fn list_shards(
    recipe: &Recipe,
    spec: &SourceSpec,
    base: &Path,
) -> Result<Vec<PathBuf>, ListError> {
    Ok(list_source(recipe, spec, base, None)?
        .iter()
        .map(Shard::display_path)
        .collect())
}

/// The shards of `spec`, local or on the Hub, in reading order.
pub fn list_source(
    recipe: &Recipe,
    spec: &SourceSpec,
    base: &Path,
    hub: Option<&Arc<HubClient>>,
) -> Result<Vec<Shard>, ListError> {
    let mut shards = Vec::new();
    for (index, pattern) in spec.files.iter().enumerate() {
        let before = shards.len();
        if HubLocation::is_hub(pattern) {
            list_hub(spec, index, pattern, hub, &mut shards)?;
            continue;
        }
        let resolved = base.join(pattern);
        let pattern_text = resolved.to_string_lossy().into_owned();
        let matches = glob::glob(&pattern_text).map_err(|e| ListError::Pattern {
            name: spec.name.clone(),
            index,
            pattern: pattern.clone(),
            message: e.to_string(),
        })?;
        for entry in matches {
            let path = entry.map_err(|e| ListError::Unreadable {
                name: spec.name.clone(),
                path: e.path().to_path_buf(),
                message: e.error().to_string(),
            })?;
            if path.is_file() {
                shards.push(Shard::Local(path));
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
    // Sorted by the path that names them, so a Hub folder and the same files on disk are read in
    // the same order.
    shards.sort_by_cached_key(Shard::display_path);
    shards.dedup();
    if recipe.shuffle.shuffle_shards {
        StageRng::new(recipe.shuffle.seed, &format!("shards/{}", spec.name)).shuffle(&mut shards);
    }
    Ok(shards)
}

fn list_hub(
    spec: &SourceSpec,
    index: usize,
    pattern: &str,
    hub: Option<&Arc<HubClient>>,
    shards: &mut Vec<Shard>,
) -> Result<(), ListError> {
    let hub_error = |error: HubError| ListError::Hub {
        name: spec.name.clone(),
        index,
        pattern: pattern.to_string(),
        error,
    };
    let location = HubLocation::parse(pattern).map_err(|message| ListError::Pattern {
        name: spec.name.clone(),
        index,
        pattern: pattern.to_string(),
        message,
    })?;
    let glob = glob::Pattern::new(&location.pattern).map_err(|e| ListError::Pattern {
        name: spec.name.clone(),
        index,
        pattern: pattern.to_string(),
        message: e.to_string(),
    })?;
    let Some(hub) = hub else {
        return Err(ListError::NoHubClient {
            name: spec.name.clone(),
            index,
            pattern: pattern.to_string(),
        });
    };
    let commit = hub
        .resolve_revision(&location.repo, &location.revision)
        .map_err(hub_error)?;
    let prefix = location.list_prefix();
    let files = hub
        .list_files(&location.repo, &commit, &prefix)
        .map_err(hub_error)?;
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    let listed = files.len();
    let before = shards.len();
    shards.extend(
        files
            .into_iter()
            .filter(|f| glob.matches_with(&f.path, options))
            .map(|f| Shard::Hub(Arc::new(f))),
    );
    if shards.len() == before {
        return Err(ListError::NoHubMatch {
            name: spec.name.clone(),
            index,
            pattern: pattern.to_string(),
            listing: format!(
                "dataset {}@{commit} ({listed} files listed under {prefix:?})",
                location.repo
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn globs_match_listed_paths_by_segment() {
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        let matches = |p: &str, path: &str| {
            glob::Pattern::new(p)
                .expect("valid")
                .matches_with(path, options)
        };
        assert!(matches(
            "sample/10BT/*.parquet",
            "sample/10BT/000_00000.parquet"
        ));
        assert!(!matches(
            "sample/10BT/*.parquet",
            "sample/10BT/x/000_00000.parquet"
        ));
        assert!(matches("data/dclm/**/*.parquet", "data/dclm/a/b/x.parquet"));
        assert!(matches("data/dclm/**/*.parquet", "data/dclm/x.parquet"));
        assert!(matches("data/zyda /*.parquet", "data/zyda /x.parquet"));
    }
}
