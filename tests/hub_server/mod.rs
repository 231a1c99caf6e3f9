//! A local Hugging Face hub for tests: a small HTTP/1.1 server on 127.0.0.1 speaking the subset of
//! the hub API that `-hf` pulls use (`api/models/<repo>/refs`, `api/models/<repo>/tree/<commit>`,
//! `<repo>/resolve/<commit>/<path>` with ETag and byte ranges), with faults on demand: error
//! statuses, transfers cut short, corrupted bytes, gated repos.

// Each test crate including this module uses a different part of it.
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

pub struct HubFile {
    pub path: String,
    pub data: Vec<u8>,
    /// Stored through LFS (has a sha256 in the tree listing), as every GGUF on the hub is.
    pub lfs: bool,
}

impl HubFile {
    pub fn new(path: &str, data: Vec<u8>) -> HubFile {
        HubFile {
            path: path.to_string(),
            lfs: path.ends_with(".gguf"),
            data,
        }
    }

    pub fn sha256(&self) -> String {
        sha256_hex(&self.data)
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub struct HubRepo {
    pub id: String,
    pub commit: String,
    pub files: Vec<HubFile>,
    /// A gated repo: every request must carry `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

/// Distinct, deterministic file contents of `len` bytes.
pub fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed as u32 * 7) as u8)
        .collect()
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

#[derive(Default)]
struct Faults {
    /// Path suffix -> (responses left to cut, bytes sent before the cut).
    cut: HashMap<String, (usize, usize)>,
    /// Path suffix -> responses left whose bytes are corrupted.
    corrupt: HashMap<String, usize>,
    /// Target substring -> (responses left, status to answer).
    fail: Vec<(String, usize, u16)>,
}

#[derive(Default)]
struct State {
    repos: Vec<HubRepo>,
    faults: Faults,
    seen: Vec<Seen>,
}

pub struct LocalHub {
    /// The endpoint to put in `MODEL_ENDPOINT`, ending in `/`.
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl LocalHub {
    pub fn start(repos: Vec<HubRepo>) -> LocalHub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://{}/", listener.local_addr().expect("local addr"));
        let state = Arc::new(Mutex::new(State {
            repos,
            ..State::default()
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        LocalHub { url, state }
    }

    /// The next `times` transfers of a file whose path ends with `path` stop after `at` bytes.
    pub fn cut(&self, path: &str, times: usize, at: usize) {
        self.state
            .lock()
            .unwrap()
            .faults
            .cut
            .insert(path.to_string(), (times, at));
    }

    /// The next `times` transfers of a file whose path ends with `path` carry one flipped byte.
    pub fn corrupt(&self, path: &str, times: usize) {
        self.state
            .lock()
            .unwrap()
            .faults
            .corrupt
            .insert(path.to_string(), times);
    }

    /// The next `times` requests whose target contains `part` are answered with `status`.
    pub fn fail(&self, part: &str, times: usize, status: u16) {
        self.state
            .lock()
            .unwrap()
            .faults
            .fail
            .push((part.to_string(), times, status));
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// File transfers seen so far: GETs of the LFS store (where resolve URLs redirect).
    pub fn transfers(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "GET" && s.target.starts_with("/cdn/"))
            .collect()
    }
}

fn take(count: &mut usize) -> bool {
    if *count > 0 {
        *count -= 1;
        true
    } else {
        false
    }
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
    head_only: bool,
) {
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    };
    let mut head = format!("HTTP/1.1 {status} {reason}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers.iter().any(|(k, _)| *k == "Content-Length") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    if !head_only {
        let _ = stream.write_all(body);
    }
    let _ = stream.flush();
}

fn json_error(stream: &mut TcpStream, status: u16, message: &str) {
    let body = serde_json::json!({ "error": message }).to_string();
    respond(
        stream,
        status,
        &[("Content-Type", "application/json".into())],
        body.as_bytes(),
        false,
    );
}

fn serve(mut stream: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default().to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let seen = Seen {
        method: method.clone(),
        target: target.clone(),
        range: headers.get("range").cloned(),
        auth: headers.get("authorization").cloned(),
    };
    let mut st = state.lock().unwrap();
    st.seen.push(seen.clone());
    let head_only = method == "HEAD";

    let failing = st
        .faults
        .fail
        .iter_mut()
        .find(|(part, left, _)| target.contains(part.as_str()) && *left > 0)
        .map(|(_, left, status)| {
            *left -= 1;
            *status
        });
    if let Some(status) = failing {
        drop(st);
        return json_error(
            &mut stream,
            status,
            "Internal Error - We're working hard to fix this as soon as possible!",
        );
    }

    let path = target.split('?').next().unwrap_or_default();
    // The LFS store, where resolve URLs of LFS files redirect to (as the hub sends them to its
    // CDN): no token needed, byte ranges served, faults applied.
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let found = st
            .repos
            .iter()
            .flat_map(|r| &r.files)
            .find(|f| f.lfs && f.sha256() == sha)
            .map(|f| (f.path.clone(), f.data.clone()));
        return match found {
            Some((file_path, data)) => serve_bytes(&mut stream, st, &file_path, data, &seen),
            None => {
                drop(st);
                json_error(&mut stream, 404, "Not Found")
            }
        };
    }
    let api = path.strip_prefix("/api/models/");
    let segments: Vec<&str> = api
        .unwrap_or(path.trim_start_matches('/'))
        .splitn(4, '/')
        .collect();
    if segments.len() < 3 {
        drop(st);
        return json_error(&mut stream, 404, "Not Found");
    }
    let repo_id = format!("{}/{}", segments[0], segments[1]);
    let Some(repo) = st.repos.iter().find(|r| r.id == repo_id) else {
        drop(st);
        return json_error(&mut stream, 404, "Repository not found");
    };
    if let Some(token) = &repo.token {
        if seen.auth.as_deref() != Some(&format!("Bearer {token}")) {
            drop(st);
            return json_error(
                &mut stream,
                401,
                "Invalid credentials in Authorization header",
            );
        }
    }

    match (api.is_some(), segments[2]) {
        (true, "refs") => {
            let body = serde_json::json!({
                "branches": [
                    {"name": "dev", "ref": "refs/heads/dev", "targetCommit": "1".repeat(40)},
                    {"name": "main", "ref": "refs/heads/main", "targetCommit": repo.commit},
                ],
                "converts": [], "tags": []
            });
            drop(st);
            respond(
                &mut stream,
                200,
                &[("Content-Type", "application/json".into())],
                body.to_string().as_bytes(),
                head_only,
            );
        }
        (true, "tree") if segments.get(3) == Some(&repo.commit.as_str()) => {
            let mut items = Vec::new();
            let mut dirs: Vec<&str> = repo
                .files
                .iter()
                .filter_map(|f| f.path.rsplit_once('/').map(|(d, _)| d))
                .collect();
            dirs.dedup();
            for d in dirs {
                items.push(serde_json::json!({"type": "directory", "oid": "d".repeat(40), "size": 0, "path": d}));
            }
            for f in &repo.files {
                let sha = f.sha256();
                let mut item = serde_json::json!({"type": "file", "oid": &sha[..40], "size": f.data.len(), "path": f.path});
                if f.lfs {
                    item["lfs"] =
                        serde_json::json!({"oid": sha, "size": f.data.len(), "pointerSize": 134});
                }
                items.push(item);
            }
            drop(st);
            let body = serde_json::Value::Array(items).to_string();
            respond(
                &mut stream,
                200,
                &[("Content-Type", "application/json".into())],
                body.as_bytes(),
                head_only,
            );
        }
        (false, "resolve") => {
            let rest = segments.get(3).copied().unwrap_or_default();
            let file = rest.split_once('/').and_then(|(commit, file_path)| {
                repo.files
                    .iter()
                    .find(|f| f.path == file_path && (commit == repo.commit || commit == "main"))
            });
            let Some(file) = file else {
                drop(st);
                return json_error(&mut stream, 404, "Entry not found");
            };
            if file.lfs {
                let sha = file.sha256();
                drop(st);
                let headers = [
                    ("Location", format!("/cdn/{sha}")),
                    ("ETag", format!("\"{sha}\"")),
                    ("X-Linked-Etag", format!("\"{sha}\"")),
                ];
                return respond(&mut stream, 302, &headers, b"", head_only);
            }
            let (file_path, data) = (file.path.clone(), file.data.clone());
            serve_bytes(&mut stream, st, &file_path, data, &seen);
        }
        _ => {
            drop(st);
            json_error(&mut stream, 404, "Not Found");
        }
    }
}

/// Sends a file's bytes, honouring `Range: bytes=N-` and the faults set for it.
fn serve_bytes(
    stream: &mut TcpStream,
    mut st: std::sync::MutexGuard<'_, State>,
    file_path: &str,
    mut data: Vec<u8>,
    seen: &Seen,
) {
    let head_only = seen.method == "HEAD";
    let etag = format!("\"{}\"", sha256_hex(&data));
    let matching = |k: &&String| file_path.ends_with(k.as_str());
    let mut cut_at = None;
    if !head_only {
        if let Some(k) = st.faults.corrupt.keys().find(matching).cloned() {
            if take(st.faults.corrupt.get_mut(&k).unwrap()) && !data.is_empty() {
                let mid = data.len() / 2;
                data[mid] ^= 0xff;
            }
        }
        if let Some(k) = st.faults.cut.keys().find(matching).cloned() {
            let (left, at) = st.faults.cut.get_mut(&k).unwrap();
            let at = *at;
            if take(left) {
                cut_at = Some(at);
            }
        }
    }
    drop(st);
    let len = data.len();
    let from = seen
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let mut headers = vec![("ETag", etag), ("Accept-Ranges", "bytes".to_string())];
    let (status, body) = match from {
        Some(n) if n >= len => {
            headers.push(("Content-Range", format!("bytes */{len}")));
            return respond(stream, 416, &headers, b"", head_only);
        }
        Some(n) => {
            headers.push(("Content-Range", format!("bytes {n}-{}/{len}", len - 1)));
            (206, &data[n..])
        }
        None => (200, &data[..]),
    };
    match cut_at {
        Some(at) if at < body.len() => {
            headers.push(("Content-Length", body.len().to_string()));
            respond(stream, status, &headers, &body[..at], false);
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        _ => respond(stream, status, &headers, body, head_only),
    }
}
