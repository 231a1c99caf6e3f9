//! HTTP to the hub: JSON API calls and file transfers that resume after a cut and refuse bytes
//! whose sha256 differs from the hub's.
//!
//! hf-hub's own blocking client is not used for this: it lists files through
//! `api/models/<repo>/revision/<rev>` where llama-server uses `refs` + `tree/<commit>` (so the two
//! would disagree on commits and paths), reads only `HF_ENDPOINT` (not `MODEL_ENDPOINT`), does not
//! check the sha256 of what it wrote, and its partial files are not upstream's
//! `<blob>.downloadInProgress`, so a transfer llama-server left half done would start over. ureq,
//! the client hf-hub itself builds on, does the transfers here.

use super::{HubError, Progress};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Tries per file before giving up, and the first pause between them (doubled each time), as
/// llama-server retries.
const ATTEMPTS: u32 = 3;
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(2);

/// The hub's token shape (`hf_` then 34 or more letters and digits). Upstream sends only tokens of
/// this shape to the API and warns about others; file transfers carry the token as given.
pub fn is_hub_token(token: &str) -> bool {
    (37..=256).contains(&token.len())
        && token.starts_with("hf_")
        && token[3..].bytes().all(|b| b.is_ascii_alphanumeric())
}

pub struct Client {
    agent: ureq::Agent,
    token: Option<String>,
    bars: indicatif::MultiProgress,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .user_agent(concat!("bloomery/", env!("CARGO_PKG_VERSION")))
        .timeout_connect(Some(Duration::from_secs(30)))
        // The hub answers resolve URLs with a redirect to its storage; the token must not follow
        // to another host, but does follow a same-host redirect (a renamed repo).
        .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
        .build()
        .into()
}

fn transport(url: &str, e: impl std::fmt::Display) -> HubError {
    HubError::Transport {
        url: url.to_string(),
        message: e.to_string(),
    }
}

/// The hub puts a reason in `{"error": "..."}`; otherwise the start of the body says it.
fn error_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(200).collect())
}

fn status_error(url: &str, status: u16, body: &str, token_sent: bool) -> HubError {
    if status == 401 || status == 403 {
        HubError::Unauthorized {
            url: url.to_string(),
            status,
            token_sent,
        }
    } else {
        HubError::Status {
            url: url.to_string(),
            status,
            message: error_message(body),
        }
    }
}

type Response = ureq::http::Response<ureq::Body>;

fn header(resp: &Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

impl Client {
    pub fn new(token: Option<&str>) -> Client {
        Client {
            agent: agent(),
            token: token.filter(|t| !t.is_empty()).map(str::to_string),
            bars: indicatif::MultiProgress::with_draw_target(
                indicatif::ProgressDrawTarget::stderr(),
            ),
        }
    }

    fn get(
        &self,
        url: &str,
        token: Option<&str>,
    ) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let req = self.agent.get(url);
        match token {
            Some(t) => req.header("Authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    /// GET a JSON document from the hub API.
    pub fn api_get(&self, url: &str) -> Result<serde_json::Value, HubError> {
        let token = match &self.token {
            Some(t) if is_hub_token(t) => Some(t.as_str()),
            Some(_) => {
                log::warn!("the Hugging Face token is not of the form hf_...; not sending it to the hub API");
                None
            }
            None => None,
        };
        let mut resp = self
            .get(url, token)
            .header("Accept", "application/json")
            .call()
            .map_err(|e| transport(url, e))?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| transport(url, e))?;
        if status != 200 {
            return Err(status_error(url, status, &body, token.is_some()));
        }
        serde_json::from_str(&body).map_err(|e| HubError::BadAnswer {
            url: url.to_string(),
            message: e.to_string(),
        })
    }

    /// HEAD `url`: its status and `ETag`, `None` when the request failed.
    pub fn head_etag(&self, url: &str) -> Option<(u16, Option<String>)> {
        let mut req = self.agent.head(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = req.call().ok()?;
        Some((resp.status().as_u16(), header(&resp, "etag")))
    }

    /// Downloads `url` into `dest` through `<dest>.downloadInProgress`, resuming that file when it
    /// exists (upstream's name, so either program resumes the other's transfer). With `sha256`,
    /// the finished bytes must hash to it or they are thrown away and fetched again. Returns the
    /// response's `ETag`.
    pub fn download(
        &self,
        url: &str,
        dest: &Path,
        sha256: Option<&str>,
        progress: Progress,
    ) -> Result<Option<String>, HubError> {
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(HubError::io(dir))?;
        }
        let partial = partial_path(dest);
        let name = url
            .rsplit('/')
            .next()
            .unwrap_or(url)
            .split('?')
            .next()
            .unwrap_or(url);
        let mut delay = FIRST_RETRY_DELAY;
        let mut last_error = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                log::warn!(
                    "{name}: {}; retrying in {} s",
                    last_error
                        .as_ref()
                        .map_or(String::new(), |e: &HubError| e.to_string()),
                    delay.as_secs()
                );
                std::thread::sleep(delay);
                delay *= 2;
            }
            match self.try_download(url, &partial, sha256, name, progress) {
                Ok(etag) => {
                    std::fs::rename(&partial, dest).map_err(HubError::io(dest))?;
                    return Ok(etag);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e)) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| transport(url, "no attempt made")))
    }

    fn try_download(
        &self,
        url: &str,
        partial: &Path,
        sha256: Option<&str>,
        name: &str,
        progress: Progress,
    ) -> Result<Option<String>, Attempt> {
        let have = partial.metadata().map_or(0, |m| m.len());
        let mut req = self.get(url, self.token.as_deref());
        if have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        let mut resp = req.call().map_err(|e| Attempt::Retry(transport(url, e)))?;
        let status = resp.status().as_u16();
        let etag = header(&resp, "etag");
        let resumed = match status {
            206 if have > 0 => true,
            200 => false,
            // The partial file already holds every byte: check it as it is.
            416 if have > 0 => {
                let digest = sha256
                    .map(|_| sha256_file(partial))
                    .transpose()
                    .map_err(Attempt::Fatal)?;
                return check(partial, sha256, digest, name, etag).map_err(Attempt::Retry);
            }
            _ => {
                let body = resp.body_mut().read_to_string().unwrap_or_default();
                let error = status_error(url, status, &body, self.token.is_some());
                return Err(if status >= 500 {
                    Attempt::Retry(error)
                } else {
                    Attempt::Fatal(error)
                });
            }
        };
        let length: Option<u64> = header(&resp, "content-length").and_then(|v| v.parse().ok());
        let start = if resumed { have } else { 0 };
        let total = length.map(|l| start + l);

        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(resumed)
            .truncate(!resumed)
            .open(partial)
            .map_err(|e| Attempt::Fatal(HubError::io(partial)(e)))?;
        // Hashing while the bytes arrive spares a second read of a file that may be 100 GB.
        let mut hasher = match sha256 {
            Some(_) if resumed => Some(sha256_prefix(partial).map_err(Attempt::Fatal)?),
            Some(_) => Some(Sha256::new()),
            None => None,
        };
        let mut bar = progress.start(&self.bars, name, total, start);
        let mut body = resp.body_mut().as_reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut done = start;
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    bar.stop();
                    return Err(Attempt::Retry(transport(
                        url,
                        format!(
                            "transfer cut after {done} of {} bytes: {e}",
                            total.map_or("?".into(), |t| t.to_string())
                        ),
                    )));
                }
            };
            file.write_all(&buf[..n])
                .map_err(|e| Attempt::Fatal(HubError::io(partial)(e)))?;
            if let Some(h) = hasher.as_mut() {
                h.update(&buf[..n]);
            }
            done += n as u64;
            bar.update(done);
        }
        bar.stop();
        file.flush()
            .map_err(|e| Attempt::Fatal(HubError::io(partial)(e)))?;
        if let Some(t) = total.filter(|&t| done < t) {
            return Err(Attempt::Retry(transport(
                url,
                format!("transfer cut after {done} of {t} bytes"),
            )));
        }
        let digest = hasher.map(|h| hex(&h.finalize()));
        check(partial, sha256, digest, name, etag).map_err(Attempt::Retry)
    }
}

enum Attempt {
    /// Worth trying again: a cut, a server error, bad bytes.
    Retry(HubError),
    /// Trying again cannot help: a refusal, a missing file, a full disk.
    Fatal(HubError),
}

pub fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".downloadInProgress");
    PathBuf::from(name)
}

/// Compares a complete partial file's digest with the hub's sha256; bad bytes are deleted so the
/// next try starts from zero.
fn check(
    partial: &Path,
    sha256: Option<&str>,
    digest: Option<String>,
    name: &str,
    etag: Option<String>,
) -> Result<Option<String>, HubError> {
    let (Some(expected), Some(actual)) = (sha256, digest) else {
        return Ok(etag);
    };
    if actual.eq_ignore_ascii_case(expected) {
        return Ok(etag);
    }
    std::fs::remove_file(partial).map_err(HubError::io(partial))?;
    Err(HubError::Checksum {
        file: name.to_string(),
        expected: expected.to_string(),
        actual,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_file(path: &Path) -> Result<String, HubError> {
    sha256_prefix(path).map(|h| hex(&h.finalize()))
}

/// A hasher fed with every byte of `path` so far.
fn sha256_prefix(path: &Path) -> Result<Sha256, HubError> {
    let mut file = File::open(path).map_err(HubError::io(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(HubError::io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shape() {
        assert!(is_hub_token(&format!("hf_{}", "a".repeat(34))));
        assert!(!is_hub_token(&format!("hf_{}", "a".repeat(33))));
        assert!(!is_hub_token(&format!("xx_{}", "a".repeat(34))));
        assert!(!is_hub_token(&format!("hf_{}-", "a".repeat(34))));
    }

    #[test]
    fn error_messages_come_from_the_json_error_field() {
        assert_eq!(
            error_message(r#"{"error":"Repository not found"}"#),
            "Repository not found"
        );
        assert_eq!(error_message("plain"), "plain");
    }
}
