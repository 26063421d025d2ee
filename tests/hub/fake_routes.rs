//! The fake Hub's routes: what each of its three hosts answers before faults (see fake_hub.rs).

use super::fake_hub::{Repo, Request, Response, State, lock, simple};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::sync::atomic::Ordering;

fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = segment
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn not_found(code: &str) -> Response {
    simple(
        404,
        vec![("X-Error-Code", code.to_string())],
        "{\"error\":\"not found\"}",
    )
}

/// The repo (`owner/name` from two decoded segments) and whether the request may read it.
fn find_repo(
    state: &State,
    request: &Request,
    owner: &str,
    name: &str,
) -> Result<(String, Repo), Response> {
    let id = format!("{}/{}", decode(owner), decode(name));
    let Some(repo) = lock(&state.repos).get(&id).cloned() else {
        return Err(not_found("RepoNotFound"));
    };
    if repo.gated {
        let token = lock(&state.token).clone();
        let sent = request.headers.get("authorization").cloned();
        if token.is_none() || sent != token.map(|t| format!("Bearer {t}")) {
            return Err(simple(
                401,
                vec![("X-Error-Code", "GatedRepo".into())],
                "{\"error\":\"gated\"}",
            ));
        }
    }
    Ok((id, repo))
}

fn revision_sha(repo: &Repo, revision: &str) -> Option<String> {
    (revision == "main" || revision == repo.sha || repo.revisions.iter().any(|r| r == revision))
        .then(|| repo.sha.clone())
}

pub(crate) fn hub(state: &State, request: &Request) -> Response {
    let (path, query) = request
        .target
        .split_once('?')
        .unwrap_or((&request.target, ""));
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", "datasets", owner, name, "revision", rev] => {
            let (id, repo) = match find_repo(state, request, owner, name) {
                Ok(found) => found,
                Err(response) => return response,
            };
            match revision_sha(&repo, &decode(rev)) {
                Some(sha) => simple(
                    200,
                    vec![("Content-Type", "application/json".into())],
                    &format!("{{\"id\":\"{id}\",\"sha\":\"{sha}\"}}"),
                ),
                None => not_found("RevisionNotFound"),
            }
        }
        ["api", "datasets", owner, name, "tree", rev, rest @ ..] => {
            let (_, repo) = match find_repo(state, request, owner, name) {
                Ok(found) => found,
                Err(response) => return response,
            };
            if revision_sha(&repo, &decode(rev)).is_none() {
                return not_found("RevisionNotFound");
            }
            let prefix = rest.iter().map(|s| decode(s)).collect::<Vec<_>>().join("/");
            let under: Vec<(&String, &Arc<Vec<u8>>)> = repo
                .files
                .iter()
                .filter(|(p, _)| prefix.is_empty() || p.starts_with(&format!("{prefix}/")))
                .collect();
            if under.is_empty() {
                return not_found("EntryNotFound");
            }
            let cursor: usize = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("cursor="))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let page_size = state.page_size.load(Ordering::SeqCst);
            let page: Vec<String> = under
                .iter()
                .skip(cursor)
                .take(page_size)
                .map(|(path, bytes)| {
                    let sha256 = hex::encode(Sha256::digest(bytes.as_slice()));
                    format!(
                        "{{\"type\":\"file\",\"oid\":\"{}\",\"size\":{},\"path\":{},\"lfs\":{{\"oid\":\"{sha256}\",\"size\":{},\"pointerSize\":134}}}}",
                        &sha256[..40],
                        bytes.len(),
                        serde_json::to_string(path).expect("a path is JSON"),
                        bytes.len()
                    )
                })
                .collect();
            let mut headers = vec![("Content-Type", "application/json".to_string())];
            if cursor + page_size < under.len() {
                let endpoint = lock(&state.endpoint).clone();
                headers.push((
                    "Link",
                    format!(
                        "<{endpoint}{path}?recursive=true&expand=false&cursor={}>; rel=\"next\"",
                        cursor + page_size
                    ),
                ));
            }
            // A directory entry too, as the Hub sends them: it must be skipped.
            let mut entries = page;
            entries.push(format!(
                "{{\"type\":\"directory\",\"oid\":\"0\",\"size\":0,\"path\":{}}}",
                serde_json::to_string(&format!("{prefix}/subdir")).expect("json")
            ));
            simple(200, headers, &format!("[{}]", entries.join(",")))
        }
        ["datasets", owner, name, "resolve", rev, rest @ ..] => {
            let (_, repo) = match find_repo(state, request, owner, name) {
                Ok(found) => found,
                Err(response) => return response,
            };
            if revision_sha(&repo, &decode(rev)).is_none() {
                return not_found("RevisionNotFound");
            }
            let file = rest.iter().map(|s| decode(s)).collect::<Vec<_>>().join("/");
            if !repo.files.contains_key(&file) {
                return not_found("EntryNotFound");
            }
            let cdn = lock(&state.cdn).clone();
            simple(
                302,
                vec![(
                    "Location",
                    format!(
                        "{cdn}/lfs/{owner}/{name}/{}?X-Amz-Signature=presigned",
                        rest.join("/")
                    ),
                )],
                "",
            )
        }
        _ => not_found("EntryNotFound"),
    }
}

/// `bytes=a-b` or `bytes=a-` over a body of `len` bytes → [a, b+1).
fn parse_range(value: &str, len: usize) -> Option<(usize, usize)> {
    let spec = value.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let a: usize = a.parse().ok()?;
    let b: usize = if b.is_empty() {
        len.checked_sub(1)?
    } else {
        b.parse::<usize>().ok()?.min(len.checked_sub(1)?)
    };
    (a <= b).then_some((a, b + 1))
}

fn serve_bytes(request: &Request, body: Arc<Vec<u8>>) -> Response {
    let range = match request.headers.get("range") {
        Some(value) => match parse_range(value, body.len()) {
            Some(r) => Some(r),
            None => return simple(416, Vec::new(), "bad range"),
        },
        None => None,
    };
    Response {
        status: 200,
        headers: vec![("Accept-Ranges", "bytes".into())],
        body,
        range,
    }
}

pub(crate) fn cdn(state: &State, request: &Request) -> Response {
    let path = request.target.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["lfs", owner, name, rest @ ..] = segments.as_slice() else {
        return simple(404, Vec::new(), "no such key");
    };
    let id = format!("{}/{}", decode(owner), decode(name));
    let file = rest.iter().map(|s| decode(s)).collect::<Vec<_>>().join("/");
    let bytes = lock(&state.repos)
        .get(&id)
        .and_then(|r| r.files.get(&file).cloned());
    match bytes {
        Some(bytes) => serve_bytes(request, bytes),
        None => simple(404, Vec::new(), "no such key"),
    }
}

pub(crate) fn s3(state: &State, request: &Request) -> Response {
    let id = request.target.trim_start_matches("/content/");
    match lock(&state.blobs).get(id).cloned() {
        Some(bytes) => serve_bytes(request, bytes),
        None => simple(404, Vec::new(), "<Error><Code>NoSuchKey</Code></Error>"),
    }
}
