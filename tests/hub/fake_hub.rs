//! A fake Hugging Face Hub for the tests: three real HTTP/1.1 listeners on loopback, each on its
//! own address so "host" differs — the Hub API and resolver (127.0.0.1), the download host a
//! resolve redirects to (127.0.0.2, serves Range requests), and an S3-like blob server
//! (127.0.0.3). Hand-rolled on std sockets so faults can be injected at the byte level: a status
//! (429 with `Retry-After` or `RateLimit`, 500, 403), a body cut mid-way, a 200 to a ranged
//! request, a body that stalls. Every request is logged (target, `Authorization`, `Range`, body
//! bytes sent).
#![allow(dead_code)]

use super::fake_routes as routes;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    Hub,
    Cdn,
    S3,
}

#[derive(Clone, Debug)]
pub struct Logged {
    pub host: Host,
    pub method: String,
    /// The request target exactly as sent (still %-encoded).
    pub target: String,
    pub authorization: Option<String>,
    pub range: Option<String>,
    /// Body bytes the fake sent in its answer (0 for HEAD).
    pub bytes: u64,
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with this status and these headers instead.
    Status(u16, Vec<(&'static str, String)>),
    /// Announce the whole body, send half of it, close the connection.
    CutMidBody,
    /// Answer a ranged request with 200 and the whole file.
    IgnoreRange,
    /// Send half the body, wait this long, then the rest.
    Stall(Duration),
    /// Flip the lowest bit of the file's byte at this offset. Fires only on a body that holds
    /// that byte (a GET whose range covers it), so every firing changes what is sent.
    FlipByte(usize),
}

pub(crate) struct Rule {
    host: Host,
    /// The request target must contain this.
    contains: String,
    ranged_only: bool,
    /// Matching requests let through before the fault fires.
    skip: usize,
    times: usize,
    fault: Fault,
}

#[derive(Clone, Debug, Default)]
pub struct Repo {
    pub sha: String,
    /// Other revision names (branches, tags, `refs/convert/parquet`) → this repo's sha.
    pub revisions: Vec<String>,
    pub gated: bool,
    pub files: BTreeMap<String, Arc<Vec<u8>>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) repos: Mutex<HashMap<String, Repo>>,
    pub(crate) blobs: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    pub(crate) rules: Mutex<Vec<Rule>>,
    pub(crate) log: Mutex<Vec<Logged>>,
    pub(crate) page_size: AtomicUsize,
    /// The token that opens gated repos.
    pub(crate) token: Mutex<Option<String>>,
    pub(crate) endpoint: Mutex<String>,
    pub(crate) cdn: Mutex<String>,
}

pub struct FakeHub {
    pub endpoint: String,
    pub cdn: String,
    pub s3: String,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeHub {
    pub fn start() -> FakeHub {
        let state = Arc::new(State::default());
        state.page_size.store(1000, Ordering::SeqCst);
        let stop = Arc::new(AtomicBool::new(false));
        let mut urls = Vec::new();
        for (host, ip) in [
            (Host::Hub, "127.0.0.1"),
            (Host::Cdn, "127.0.0.2"),
            (Host::S3, "127.0.0.3"),
        ] {
            let listener = TcpListener::bind((ip, 0)).expect("bind a loopback port");
            let addr = listener.local_addr().expect("local addr");
            urls.push(format!("http://{addr}"));
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = state.clone();
                    std::thread::spawn(move || serve_connection(host, stream, &state));
                }
            });
        }
        *lock(&state.endpoint) = urls[0].clone();
        *lock(&state.cdn) = urls[1].clone();
        FakeHub {
            endpoint: urls[0].clone(),
            cdn: urls[1].clone(),
            s3: urls[2].clone(),
            state,
            stop,
        }
    }

    pub fn add_repo(&self, id: &str, repo: Repo) {
        lock(&self.state.repos).insert(id.to_string(), repo);
    }

    pub fn add_blob(&self, id: &str, bytes: Vec<u8>) {
        lock(&self.state.blobs).insert(id.to_string(), Arc::new(bytes));
    }

    pub fn set_page_size(&self, n: usize) {
        self.state.page_size.store(n, Ordering::SeqCst);
    }

    pub fn set_token(&self, token: &str) {
        *lock(&self.state.token) = Some(token.to_string());
    }

    /// Fire `fault` on the `skip+1`-th .. `skip+times`-th request to `host` whose target contains
    /// `contains` (and that has a Range header, when `ranged_only`).
    pub fn fault(
        &self,
        host: Host,
        contains: &str,
        ranged_only: bool,
        skip: usize,
        times: usize,
        fault: Fault,
    ) {
        lock(&self.state.rules).push(Rule {
            host,
            contains: contains.to_string(),
            ranged_only,
            skip,
            times,
            fault,
        });
    }

    /// Faults not fired yet (a test checks its faults all happened).
    pub fn pending_faults(&self) -> usize {
        lock(&self.state.rules)
            .iter()
            .filter(|r| r.times > 0)
            .count()
    }

    pub fn log(&self) -> Vec<Logged> {
        lock(&self.state.log).clone()
    }

    pub fn clear_log(&self) {
        lock(&self.state.log).clear();
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for url in [&self.endpoint, &self.cdn, &self.s3] {
            let _ = TcpStream::connect(url.trim_start_matches("http://"));
        }
    }
}

/// A repo's commit sha, made from its name.
pub fn sha_of(name: &str) -> String {
    hex::encode(Sha256::digest(name.as_bytes()))[..40].to_string()
}

pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) headers: HashMap<String, String>,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Some(Request {
        method,
        target,
        headers,
    })
}

/// A response before faults: status, headers, body.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Arc<Vec<u8>>,
    pub(crate) range: Option<(usize, usize)>,
}

pub(crate) fn simple(status: u16, headers: Vec<(&'static str, String)>, body: &str) -> Response {
    Response {
        status,
        headers,
        body: Arc::new(body.as_bytes().to_vec()),
        range: None,
    }
}

fn serve_connection(host: Host, stream: TcpStream, state: &State) {
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut writer = writer;
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let entry = Logged {
            host,
            method: request.method.clone(),
            target: request.target.clone(),
            authorization: request.headers.get("authorization").cloned(),
            range: request.headers.get("range").cloned(),
            bytes: 0,
        };
        let response = match host {
            Host::Hub => routes::hub(state, &request),
            Host::Cdn => routes::cdn(state, &request),
            Host::S3 => routes::s3(state, &request),
        };
        let fault = take_fault(state, host, &request, &response);
        let log = |bytes| lock(&state.log).push(Logged { bytes, ..entry });
        if !write_response(&mut writer, &request, response, fault, log) {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
    }
}

fn take_fault(state: &State, host: Host, request: &Request, response: &Response) -> Option<Fault> {
    let mut rules = lock(&state.rules);
    let ranged = request.headers.contains_key("range");
    let holds = |offset: usize| {
        request.method == "GET"
            && match response.range {
                Some((a, b)) => a <= offset && offset < b,
                None => response.status == 200 && offset < response.body.len(),
            }
    };
    for rule in rules.iter_mut() {
        if rule.host == host
            && rule.times > 0
            && request.target.contains(&rule.contains)
            && (ranged || !rule.ranged_only)
            && !matches!(rule.fault, Fault::FlipByte(at) if !holds(at))
        {
            if rule.skip > 0 {
                rule.skip -= 1;
                continue;
            }
            rule.times -= 1;
            return Some(rule.fault.clone());
        }
    }
    None
}

/// Write the response with its fault, calling `log` with the body bytes it will send before
/// sending anything; false when the connection must close.
fn write_response(
    w: &mut TcpStream,
    request: &Request,
    response: Response,
    fault: Option<Fault>,
    log: impl FnOnce(u64),
) -> bool {
    let reason = |s: u16| match s {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        _ => "Status",
    };
    let head_only = request.method == "HEAD";
    let (status, mut headers, body): (u16, Vec<(&str, String)>, Vec<u8>) =
        match (&fault, response.range) {
            (Some(Fault::Status(code, extra)), _) => (*code, extra.clone(), b"fault".to_vec()),
            (Some(Fault::IgnoreRange), Some(_)) => (200, Vec::new(), response.body.to_vec()),
            (_, Some((a, b))) => (
                206,
                {
                    let mut h = response.headers.clone();
                    h.push((
                        "Content-Range",
                        format!("bytes {a}-{}/{}", b - 1, response.body.len()),
                    ));
                    h
                },
                response.body[a..b].to_vec(),
            ),
            _ => (
                response.status,
                response.headers.clone(),
                response.body.to_vec(),
            ),
        };
    let mut body = body;
    if let Some(Fault::FlipByte(at)) = fault {
        let at = at - response.range.map_or(0, |(a, _)| a);
        body[at] ^= 0x01;
    }
    headers.push(("Content-Length", body.len().to_string()));
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (k, v) in &headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let half = body.len() / 2;
    log(match (head_only, &fault) {
        (true, _) => 0,
        (false, Some(Fault::CutMidBody)) => half as u64,
        (false, _) => body.len() as u64,
    });
    if w.write_all(head.as_bytes()).is_err() {
        return false;
    }
    if head_only {
        return w.flush().is_ok();
    }
    match fault {
        Some(Fault::CutMidBody) => {
            let _ = w.write_all(&body[..half]);
            let _ = w.flush();
            false
        }
        Some(Fault::Stall(wait)) => {
            let _ = w.write_all(&body[..half]);
            let _ = w.flush();
            std::thread::sleep(wait);
            w.write_all(&body[half..]).is_ok() && w.flush().is_ok()
        }
        _ => w.write_all(&body).is_ok() && w.flush().is_ok(),
    }
}
