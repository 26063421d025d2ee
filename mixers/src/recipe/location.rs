//! Hub file patterns in a recipe's `files`: `hf://datasets/{owner}/{name}[@{revision}]/{glob}`.
//! Parsed here without IO, so a bad location is a recipe error with its field path; the daemon
//! resolves the revision, lists the repo and matches the glob over the listing.

/// What a `files` entry starts with when it names Hub files.
pub const HUB_SCHEME: &str = "hf://";

/// The revision used when a location names none.
pub const DEFAULT_REVISION: &str = "main";

/// A parsed `hf://datasets/…` pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubLocation {
    /// `owner/name`, e.g. `HuggingFaceFW/fineweb-edu`.
    pub repo: String,
    /// Branch, tag or commit sha, percent-decoded (`refs%2Fconvert%2Fparquet` in the location is
    /// the revision `refs/convert/parquet`).
    pub revision: String,
    /// Glob over paths inside the repo, e.g. `sample/10BT/*.parquet`.
    pub pattern: String,
}

impl HubLocation {
    pub fn is_hub(location: &str) -> bool {
        location.starts_with(HUB_SCHEME)
    }

    pub fn parse(location: &str) -> Result<HubLocation, String> {
        const FORM: &str = "expected hf://datasets/OWNER/NAME[@REVISION]/PATH_GLOB";
        let rest = location
            .strip_prefix(HUB_SCHEME)
            .ok_or_else(|| format!("does not start with {HUB_SCHEME}"))?;
        let Some(rest) = rest.strip_prefix("datasets/") else {
            return Err(format!("only dataset repos can be read ({FORM})"));
        };
        let mut parts = rest.splitn(3, '/');
        let (Some(owner), Some(name_rev), Some(pattern)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("has no path inside the repo ({FORM})"));
        };
        let (name, revision) = match name_rev.split_once('@') {
            Some((name, rev)) => (name, percent_decode(rev)?),
            None => (name_rev, DEFAULT_REVISION.to_string()),
        };
        for (what, part) in [("owner", owner), ("name", name)] {
            if part.is_empty()
                || !part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(format!(
                    "repo {what} {part:?} must be non-empty and use only letters, digits, '-', '_', '.' ({FORM})"
                ));
            }
        }
        if revision.is_empty() {
            return Err(format!("has an empty revision after '@' ({FORM})"));
        }
        if pattern.is_empty() || pattern.starts_with('/') {
            return Err(format!("has no path inside the repo ({FORM})"));
        }
        Ok(HubLocation {
            repo: format!("{owner}/{name}"),
            revision,
            pattern: pattern.to_string(),
        })
    }

    /// The folder to list: the pattern's leading path segments without glob characters. Listing
    /// only it keeps the number of listing requests to what the pattern can match.
    pub fn list_prefix(&self) -> String {
        let segments: Vec<&str> = self.pattern.split('/').collect();
        let literal = segments[..segments.len() - 1]
            .iter()
            .take_while(|s| !s.contains(['*', '?', '[', ']', '{', '}']))
            .copied()
            .collect::<Vec<_>>();
        literal.join("/")
    }
}

/// `%2F` → `/`; any `%XX`, so a revision with slashes fits in one segment of the location.
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("revision {text:?} has a bad %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("revision {text:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_repo_revision_and_pattern() {
        let l = HubLocation::parse(
            "hf://datasets/HuggingFaceFW/fineweb-edu@v1.4.0/sample/10BT/*.parquet",
        )
        .expect("valid");
        assert_eq!(l.repo, "HuggingFaceFW/fineweb-edu");
        assert_eq!(l.revision, "v1.4.0");
        assert_eq!(l.pattern, "sample/10BT/*.parquet");
        assert_eq!(l.list_prefix(), "sample/10BT");
        let l =
            HubLocation::parse("hf://datasets/allenai/c4/en/c4-train.*.json.gz").expect("valid");
        assert_eq!(l.revision, "main");
        assert_eq!(l.list_prefix(), "en");
        let l = HubLocation::parse(
            "hf://datasets/HuggingFaceTB/finemath@refs%2Fconvert%2Fparquet/*/train/*.parquet",
        )
        .expect("valid");
        assert_eq!(l.revision, "refs/convert/parquet");
        assert_eq!(l.list_prefix(), "");
        let l =
            HubLocation::parse("hf://datasets/Zyphra/Zyda-2/data/dclm_crossdeduped/**/*.parquet")
                .expect("valid");
        assert_eq!(l.list_prefix(), "data/dclm_crossdeduped");
    }

    #[test]
    fn rejects_what_cannot_be_a_dataset_file_pattern() {
        for bad in [
            "hf://models/gpt2/x.bin",
            "hf://datasets/allenai",
            "hf://datasets/allenai/c4",
            "hf://datasets/allenai/c4/",
            "hf://datasets/allenai/c4@/en/*.json.gz",
            "hf://datasets/all enai/c4/en/*.json.gz",
            "hf://datasets/allenai/c4@%zz/en/*.json.gz",
        ] {
            assert!(HubLocation::parse(bad).is_err(), "{bad}");
        }
    }
}
