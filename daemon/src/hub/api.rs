//! The Hub's JSON API for datasets: a revision resolved to its commit sha
//! (`/api/datasets/{repo}/revision/{rev}`) and a folder listed recursively
//! (`/api/datasets/{repo}/tree/{sha}/{path}?recursive=true&expand=false`), page after page by
//! the `Link: <…>; rel="next"` header. File names always come from a listing, never built.

use super::{HubClient, HubError, HubInner, Subject, encode_path, encode_segment};
use reqwest::{Method, Url};
use serde::Deserialize;
use std::time::Instant;

/// One entry of a tree listing, as the Hub sends it.
#[derive(Clone, Debug, Deserialize)]
pub struct TreeEntry {
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    #[serde(default)]
    pub size: u64,
    /// Git blob sha1 (the `ETag` of small files).
    #[serde(default)]
    pub oid: Option<String>,
    #[serde(default)]
    pub lfs: Option<LfsInfo>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct LfsInfo {
    /// sha256 of the file's bytes (`X-Linked-Etag`).
    pub oid: String,
    pub size: u64,
}

/// A file of a dataset repo at a pinned commit: what a shard is read from, and what the
/// manifest records so a later run reads the same bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    pub repo: String,
    /// The commit sha the recipe's revision resolved to.
    pub commit: String,
    /// Path inside the repo, exactly as listed.
    pub path: String,
    pub size: u64,
    /// sha256 of the bytes, for LFS files (all large dataset files are).
    pub sha256: Option<String>,
    /// The git blob id.
    pub oid: Option<String>,
}

/// `hf://datasets/{repo}@{commit}/{path}`.
pub fn location(repo: &str, commit: &str, path: &str) -> String {
    format!("hf://datasets/{repo}@{commit}/{path}")
}

impl HubFile {
    fn from_entry(repo: &str, commit: &str, entry: &TreeEntry) -> HubFile {
        HubFile {
            repo: repo.to_string(),
            commit: commit.to_string(),
            path: entry.path.clone(),
            size: entry.lfs.as_ref().map_or(entry.size, |l| l.size),
            sha256: entry.lfs.as_ref().map(|l| l.oid.clone()),
            oid: entry.oid.clone(),
        }
    }

    /// `hf://datasets/{repo}@{commit}/{path}`: how the file is named in messages and positions.
    pub fn location(&self) -> String {
        location(&self.repo, &self.commit, &self.path)
    }

    pub(crate) fn subject(&self) -> Subject<'_> {
        Subject {
            repo: &self.repo,
            revision: Some(&self.commit),
            path: Some(&self.path),
        }
    }

    /// `/datasets/{repo}/resolve/{commit}/{path}`, every segment encoded.
    pub(crate) fn resolve_url(&self, hub: &HubInner) -> Result<Url, HubError> {
        hub.url(&format!(
            "datasets/{}/resolve/{}/{}",
            encode_path(&self.repo),
            encode_segment(&self.commit),
            encode_path(&self.path)
        ))
    }
}

#[derive(Deserialize)]
struct RevisionInfo {
    sha: String,
}

impl HubClient {
    /// The commit sha of `revision` (branch, tag, `refs/convert/parquet`, or a sha), resolved
    /// once per process.
    pub fn resolve_revision(&self, repo: &str, revision: &str) -> Result<String, HubError> {
        let key = (repo.to_string(), revision.to_string());
        if let Some(sha) = lock(&self.inner().revisions).get(&key) {
            return Ok(sha.clone());
        }
        let hub = self.inner().clone();
        let url = hub.url(&format!(
            "api/datasets/{}/revision/{}",
            encode_path(repo),
            encode_segment(revision)
        ))?;
        let what = format!("dataset {repo} revision {revision}");
        let subject = Subject {
            repo,
            revision: Some(revision),
            path: None,
        };
        let body = self.block_on(get_json_text(&hub, url, &what, subject))?.0;
        let info: RevisionInfo = serde_json::from_str(&body).map_err(|e| HubError::Protocol {
            what: what.clone(),
            message: format!("the revision info is not the documented JSON: {e}"),
        })?;
        if info.sha.len() != 40 || !info.sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(HubError::Protocol {
                what,
                message: format!("{:?} is not a commit sha", info.sha),
            });
        }
        if info.sha != revision {
            tracing::info!("dataset {repo}: revision {revision} is commit {}", info.sha);
        }
        lock(&self.inner().revisions).insert(key, info.sha.clone());
        Ok(info.sha)
    }

    /// Every file under `prefix` (the whole repo when empty) at commit `sha`, following the
    /// listing's pages. A folder that does not exist lists as nothing.
    pub fn list_files(
        &self,
        repo: &str,
        sha: &str,
        prefix: &str,
    ) -> Result<Vec<HubFile>, HubError> {
        let hub = self.inner().clone();
        let mut path = format!(
            "api/datasets/{}/tree/{}",
            encode_path(repo),
            encode_segment(sha)
        );
        if !prefix.is_empty() {
            path.push('/');
            path.push_str(&encode_path(prefix));
        }
        let mut url = hub.url(&path)?;
        url.set_query(Some("recursive=true&expand=false"));
        let what = format!("listing of dataset {repo}@{sha}/{prefix}");
        let subject = Subject {
            repo,
            revision: Some(sha),
            path: Some(prefix),
        };
        let mut files = Vec::new();
        let mut next = Some(url);
        let mut pages = 0;
        // A dataset of 100k files lists for minutes: say how far it is, as other long steps do.
        let progress_every = crate::progress::plain_every();
        let mut logged = Instant::now();
        while let Some(url) = next.take() {
            pages += 1;
            let (body, link) = match self.block_on(get_json_text(&hub, url, &what, subject)) {
                Ok(page) => page,
                Err(HubError::NotFound(_)) if pages == 1 && !prefix.is_empty() => {
                    return Ok(Vec::new());
                }
                Err(e) => return Err(e),
            };
            let entries: Vec<TreeEntry> =
                serde_json::from_str(&body).map_err(|e| HubError::Protocol {
                    what: what.clone(),
                    message: format!("page {pages} is not the documented JSON list: {e}"),
                })?;
            files.extend(
                entries
                    .iter()
                    .filter(|e| e.kind == "file")
                    .map(|e| HubFile::from_entry(repo, sha, e)),
            );
            if let Some(link) = link {
                next = Some(hub.endpoint().join(&link).map_err(|e| HubError::Protocol {
                    what: what.clone(),
                    message: format!("bad next-page link {link:?}: {e}"),
                })?);
                if logged.elapsed() >= progress_every {
                    logged = Instant::now();
                    tracing::info!("{what}: {} files in {pages} page(s) so far", files.len());
                }
            }
        }
        tracing::debug!("{what}: {} files in {pages} page(s)", files.len());
        Ok(files)
    }
}

/// GET a JSON API URL (with retries); the body and the `rel="next"` link if any.
async fn get_json_text(
    hub: &HubInner,
    url: Url,
    what: &str,
    subject: Subject<'_>,
) -> Result<(String, Option<String>), HubError> {
    let timeout = hub.config.request_timeout;
    hub.config
        .retry
        .run(what, |_| {
            let request = hub.request(Method::GET, &url).timeout(timeout);
            async move {
                let response = request
                    .send()
                    .await
                    .map_err(|e| HubError::network(what, e))?;
                let status = response.status().as_u16();
                if status != 200 {
                    return Err(hub.status_error(what, subject, status, response.headers()));
                }
                let link = response
                    .headers()
                    .get_all("link")
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(next_link);
                let body = response
                    .text()
                    .await
                    .map_err(|e| HubError::network(what, e))?;
                Ok((body, link))
            }
        })
        .await
}

/// The target of the `rel="next"` member of a `Link` header.
pub fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|member| {
        let (target, params) = member.split_once(';')?;
        let is_next = params.split(';').any(|p| {
            let p = p.trim();
            p == "rel=\"next\"" || p == "rel=next"
        });
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| target.to_string())
    })
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_links_are_found_among_other_relations() {
        assert_eq!(
            next_link(
                "<https://huggingface.co/api/datasets/a/b/tree/main?cursor=xyz&recursive=true>; rel=\"next\""
            ),
            Some(
                "https://huggingface.co/api/datasets/a/b/tree/main?cursor=xyz&recursive=true"
                    .into()
            )
        );
        assert_eq!(
            next_link("</p?page=1>; rel=\"prev\", </p?page=3>; rel=\"next\""),
            Some("/p?page=3".into())
        );
        assert_eq!(next_link("</p?page=1>; rel=\"prev\""), None);
    }
}
