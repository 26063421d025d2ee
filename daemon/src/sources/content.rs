//! Rows that carry content ids, not text (The Stack v2 `*-ids`: repository rows whose `files`
//! list holds `blob_id` and `src_encoding`). Each blob is fetched from a URL template (Software
//! Heritage's bucket by default) with bounded concurrency and retries, or read from a local
//! mirror folder; gunzipped when gzip; decoded from its encoding on the reader thread. While one
//! batch of rows is handed out, the next batch's blobs are already being fetched.
//!
//! Documents are one per repository (files joined with the separator, in list order) or one per
//! file. Per file, a document's row is `repository_row << 24 | file_index` (see [`FILE_BITS`]).

use super::parquet::{BatchSource, keeps, list_items, string_at};
use super::{RowText, ShardError};
use crate::hub::{HubClient, HubError, HubInner, encode_segment};
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use bytes::Bytes;
use dsprep_mixers::recipe::{ContentPer, ContentSpec, RowFilter, SourceSpec, TextField};
use flate2::read::MultiGzDecoder;
use reqwest::Method;
use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Per-file documents number their rows `repository_row << FILE_BITS | file_index`.
pub const FILE_BITS: u32 = 24;
/// Batches whose blobs are requested before they are needed (the one being read included).
const BATCHES_IN_FLIGHT: usize = 2;
/// Repository rows per batch: a batch's blobs are held in memory at once.
pub(crate) const CONTENT_BATCH_ROWS: usize = 64;

/// Where blob contents come from.
pub(crate) enum ContentResolver {
    Mirror(PathBuf),
    Http {
        client: Arc<HubClient>,
        template: String,
        permits: Arc<Semaphore>,
    },
}

impl ContentResolver {
    /// `None` when the source has no `[source.content]`. Relative mirrors are under `base`.
    pub(crate) fn for_source(
        spec: &SourceSpec,
        base: &Path,
        client: Option<&Arc<HubClient>>,
    ) -> Result<Option<Arc<ContentResolver>>, String> {
        let Some(content) = &spec.content else {
            return Ok(None);
        };
        let resolver = match (&content.mirror_dir, &content.url_template, client) {
            (Some(dir), _, _) => ContentResolver::Mirror(base.join(dir)),
            (None, Some(template), Some(client)) => ContentResolver::Http {
                client: client.clone(),
                template: template.clone(),
                permits: Arc::new(Semaphore::new(content.concurrency)),
            },
            _ => return Err("content: no mirror_dir and no HTTP client".into()),
        };
        Ok(Some(Arc::new(resolver)))
    }
}

struct Blob {
    id: String,
    encoding: Option<String>,
}

/// A repository row: filtered out, or its blobs.
struct RowBlobs {
    row: u64,
    blobs: Option<Vec<Blob>>,
}

struct PendingBatch {
    rows: Vec<RowBlobs>,
    /// HTTP fetches in flight; `None` for a mirror (read when the batch is needed).
    fetch: Option<tokio::task::JoinHandle<Vec<Result<Bytes, HubError>>>>,
}

pub(crate) struct BlobShard<B> {
    label: PathBuf,
    batches: B,
    exhausted: bool,
    resolver: Arc<ContentResolver>,
    list: String,
    field: String,
    separator: String,
    content: ContentSpec,
    filter: Option<RowFilter>,
    next_row: u64,
    pending: VecDeque<PendingBatch>,
    ready: VecDeque<(u64, RowText)>,
}

impl<B: BatchSource> BlobShard<B> {
    pub(crate) fn new(
        label: PathBuf,
        batches: B,
        spec: &SourceSpec,
        resolver: Arc<ContentResolver>,
    ) -> Self {
        let (list, field, separator) = match &spec.text {
            TextField::Join(join) => (
                join.list.clone(),
                join.field.clone(),
                join.separator.clone(),
            ),
            TextField::Column(name) => (name.clone(), String::new(), String::new()), // refused by validation
        };
        Self {
            label,
            batches,
            exhausted: false,
            resolver,
            list,
            field,
            separator,
            content: spec
                .content
                .clone()
                .unwrap_or_else(|| unreachable!("a content source")),
            filter: spec.filter.clone(),
            next_row: 0,
            pending: VecDeque::new(),
            ready: VecDeque::new(),
        }
    }

    /// The batches begin at repository row `row` of the file (not at its first row).
    pub(crate) fn starting_at(mut self, row: u64) -> Self {
        self.next_row = row;
        self
    }

    /// The repository row a document row (as this shard numbers them) belongs to.
    pub(crate) fn repository_row(spec: &SourceSpec, row: u64) -> u64 {
        match spec.content.as_ref().map(|c| c.per) {
            Some(ContentPer::File) => row >> FILE_BITS,
            _ => row,
        }
    }

    fn rows_of(&self, batch: &RecordBatch, first_row: u64) -> Vec<RowBlobs> {
        (0..batch.num_rows())
            .map(|i| {
                let row = first_row + i as u64;
                if !keeps(self.filter.as_ref(), batch, i) {
                    return RowBlobs { row, blobs: None };
                }
                let Some(items) = list_items(batch, &self.list, i) else {
                    return RowBlobs {
                        row,
                        blobs: Some(Vec::new()),
                    };
                };
                let items = items.as_struct();
                let ids = items.column_by_name(&self.field).expect("projected");
                let encodings = items.column_by_name(&self.content.encoding_field);
                let blobs = (0..ids.len())
                    .filter_map(|k| {
                        let id = string_at(ids.as_ref(), k)?;
                        Some(Blob {
                            id: id.to_string(),
                            encoding: encodings
                                .and_then(|e| string_at(e.as_ref(), k))
                                .map(str::to_string),
                        })
                    })
                    .collect();
                RowBlobs {
                    row,
                    blobs: Some(blobs),
                }
            })
            .collect()
    }

    /// Decode batches and request their blobs until [`BATCHES_IN_FLIGHT`] are pending.
    fn fill(&mut self) -> Result<(), ShardError> {
        while !self.exhausted && self.pending.len() < BATCHES_IN_FLIGHT {
            let Some(batch) = self.batches.next_batch(self.next_row)? else {
                self.exhausted = true;
                break;
            };
            let rows = self.rows_of(&batch, self.next_row);
            self.next_row += batch.num_rows() as u64;
            let fetch = match &*self.resolver {
                ContentResolver::Mirror(_) => None,
                ContentResolver::Http {
                    client,
                    template,
                    permits,
                } => {
                    let ids: Vec<String> = rows
                        .iter()
                        .flat_map(|r| r.blobs.iter().flatten().map(|b| b.id.clone()))
                        .collect();
                    let (hub, template, permits) =
                        (client.inner().clone(), template.clone(), permits.clone());
                    Some(client.spawn(fetch_all(hub, template, permits, ids)))
                }
            };
            self.pending.push_back(PendingBatch { rows, fetch });
        }
        Ok(())
    }

    /// Wait for a batch's blobs, decode them and queue its documents.
    fn deliver(&mut self, batch: PendingBatch) -> Result<(), ShardError> {
        let mut fetched = match (batch.fetch, &*self.resolver) {
            (Some(handle), ContentResolver::Http { client, .. }) => client
                .block_on(handle)
                .map_err(|e| {
                    ShardError::new(&self.label, None, format!("blob fetch stopped: {e}"))
                })?
                .into_iter(),
            _ => Vec::new().into_iter(),
        };
        for RowBlobs { row, blobs } in batch.rows {
            let at = |k: usize| Some(format!("row {row} file {k}"));
            let Some(blobs) = blobs else {
                self.ready
                    .push_back((row << self.row_shift(), RowText::Filtered));
                continue;
            };
            let mut texts = Vec::with_capacity(blobs.len());
            for (k, blob) in blobs.iter().enumerate() {
                let raw = match &*self.resolver {
                    ContentResolver::Mirror(dir) => read_mirror(dir, &blob.id),
                    ContentResolver::Http { .. } => fetched
                        .next()
                        .unwrap_or_else(|| {
                            Err(HubError::Protocol {
                                what: format!("blob {}", blob.id),
                                message: "missing from its batch".into(),
                            })
                        })
                        .map_err(|e| e.to_string()),
                };
                let text = raw
                    .and_then(|bytes| decode_blob(&blob.id, &bytes, blob.encoding.as_deref()))
                    .map_err(|message| ShardError::new(&self.label, at(k), message))?;
                texts.push(text);
            }
            match self.content.per {
                ContentPer::Repository => {
                    let parts: Vec<&str> = texts
                        .iter()
                        .map(String::as_str)
                        .filter(|t| !t.is_empty())
                        .collect();
                    let text = parts.join(&self.separator);
                    let outcome = if text.is_empty() {
                        RowText::Empty
                    } else {
                        RowText::Text(text)
                    };
                    self.ready.push_back((row, outcome));
                }
                ContentPer::File => {
                    if texts.is_empty() {
                        self.ready.push_back((row << FILE_BITS, RowText::Empty));
                    }
                    if texts.len() >= 1 << FILE_BITS {
                        return Err(ShardError::new(
                            &self.label,
                            at(0),
                            format!("more than {} files in one repository", 1u64 << FILE_BITS),
                        ));
                    }
                    for (k, text) in texts.into_iter().enumerate() {
                        let outcome = if text.is_empty() {
                            RowText::Empty
                        } else {
                            RowText::Text(text)
                        };
                        self.ready
                            .push_back(((row << FILE_BITS) | k as u64, outcome));
                    }
                }
            }
        }
        Ok(())
    }

    fn row_shift(&self) -> u32 {
        match self.content.per {
            ContentPer::Repository => 0,
            ContentPer::File => FILE_BITS,
        }
    }
}

impl<B: BatchSource> super::ShardReader for BlobShard<B> {
    fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Ok(Some(item));
            }
            self.fill()?;
            let Some(batch) = self.pending.pop_front() else {
                return Ok(None);
            };
            self.fill()?; // the next batch's blobs are fetched while this one is decoded
            self.deliver(batch)?;
        }
    }
}

fn read_mirror(dir: &Path, id: &str) -> Result<Bytes, String> {
    if id.is_empty() || id.contains(['/', '\\']) || id.starts_with('.') {
        return Err(format!("blob id {id:?} cannot name a file"));
    }
    let path = dir.join(id);
    std::fs::read(&path)
        .map(Bytes::from)
        .map_err(|e| format!("blob {id}: cannot read {}: {e}", path.display()))
}

/// Gunzip (when gzip) and decode from `encoding` (UTF-8 when unnamed).
fn decode_blob(id: &str, bytes: &[u8], encoding: Option<&str>) -> Result<String, String> {
    let mut plain = Vec::new();
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        MultiGzDecoder::new(bytes)
            .read_to_end(&mut plain)
            .map_err(|e| format!("blob {id}: not valid gzip: {e}"))?;
        plain.as_slice()
    } else {
        bytes
    };
    let name = encoding
        .unwrap_or("UTF-8")
        .trim()
        .to_ascii_lowercase()
        .replace('_', "-");
    match name.as_str() {
        "utf-8" | "utf8" | "ascii" | "us-ascii" => String::from_utf8(bytes.to_vec()).map_err(|e| {
            format!(
                "blob {id}: not valid {} (byte {})",
                encoding.unwrap_or("UTF-8"),
                e.utf8_error().valid_up_to()
            )
        }),
        "iso-8859-1" | "latin-1" | "latin1" | "iso8859-1" | "l1" => {
            Ok(bytes.iter().map(|&b| char::from(b)).collect())
        }
        _ => Err(format!(
            "blob {id}: encoding {:?} is not supported (UTF-8 and ISO-8859-1 are)",
            encoding.unwrap_or("")
        )),
    }
}

/// Every blob of a batch, in order, at most `permits` at once across the source.
async fn fetch_all(
    hub: Arc<HubInner>,
    template: String,
    permits: Arc<Semaphore>,
    ids: Vec<String>,
) -> Vec<Result<Bytes, HubError>> {
    let fetches = ids.into_iter().map(|id| {
        let (hub, template, permits) = (hub.clone(), template.clone(), permits.clone());
        async move {
            let _permit = permits.acquire().await.map_err(|_| HubError::Protocol {
                what: format!("blob {id}"),
                message: "the fetcher was closed".into(),
            })?;
            fetch_blob(&hub, &template, &id).await
        }
    });
    futures_util::future::join_all(fetches).await
}

async fn fetch_blob(hub: &HubInner, template: &str, id: &str) -> Result<Bytes, HubError> {
    let text = template.replace("{blob_id}", &encode_segment(id));
    let url = reqwest::Url::parse(&text).map_err(|e| {
        HubError::Config(format!(
            "content url_template gives a bad URL for blob {id}: {e}"
        ))
    })?;
    let host = url.host_str().unwrap_or("").to_string();
    let what = format!("blob {id}");
    let timeout = hub.config.request_timeout;
    hub.config
        .retry
        .run(&what, |_| {
            let request = hub.request(Method::GET, &url).timeout(timeout);
            let (what, host) = (&what, &host);
            async move {
                let response = request.send().await.map_err(|e| HubError::network(what, e))?;
                let status = response.status().as_u16();
                match status {
                    200 => response.bytes().await.map_err(|e| HubError::network(what, e)),
                    404 => Err(HubError::NotFound(format!("{what} not found at {host} (HTTP 404)"))),
                    401 | 403 => Err(HubError::Denied(format!(
                        "{what}: HTTP {status} from {host}: the bucket wants signed requests, which dsprep does not make: set [source.content] mirror_dir, or a url_template of a mirror or of presigned URLs"
                    ))),
                    _ if crate::hub::is_transient_status(status) => Err(HubError::Status {
                        what: what.clone(),
                        status,
                        retry_after: crate::hub::server_wait(response.headers()),
                    }),
                    _ => Err(HubError::Protocol { what: what.clone(), message: format!("unexpected HTTP {status} from {host}") }),
                }
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::decode_blob;

    #[test]
    fn blobs_decode_from_utf8_and_latin1_and_name_themselves_otherwise() {
        assert_eq!(
            decode_blob("a", "héllo".as_bytes(), None).as_deref(),
            Ok("héllo")
        );
        assert_eq!(
            decode_blob("b", b"caf\xe9", Some("ISO-8859-1")).as_deref(),
            Ok("café")
        );
        assert_eq!(
            decode_blob("c", b"caf\xe9", Some("UTF-8")),
            Err("blob c: not valid UTF-8 (byte 3)".to_string())
        );
        assert_eq!(
            decode_blob("d", b"x", Some("Shift_JIS")),
            Err(
                "blob d: encoding \"Shift_JIS\" is not supported (UTF-8 and ISO-8859-1 are)"
                    .to_string()
            )
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b"print(1)\n").expect("write");
        let gz = gz.finish().expect("finish");
        assert_eq!(
            decode_blob("e", &gz, Some("utf-8")).as_deref(),
            Ok("print(1)\n")
        );
    }
}
