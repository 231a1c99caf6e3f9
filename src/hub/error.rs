//! Why a model pull failed, with the repo, file, URL or path involved.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum HubError {
    /// A `-hf` value that is not `owner/name[:quant]`.
    InvalidRepo { value: String },
    /// The hub refused the request for want of a (valid) token.
    Unauthorized {
        url: String,
        status: u16,
        token_sent: bool,
    },
    /// The hub answered something other than success.
    Status {
        url: String,
        status: u16,
        message: String,
    },
    /// The connection failed or broke.
    Transport { url: String, message: String },
    /// The hub's answer could not be read as the JSON expected.
    BadAnswer { url: String, message: String },
    /// No file in the repo matches the quant tag (`tag` empty: no GGUF model at all).
    NoMatch {
        repo: String,
        tag: String,
        available: Vec<String>,
    },
    /// `--hf-file` names a file the repo does not have.
    FileNotInRepo {
        repo: String,
        file: String,
        available: Vec<String>,
    },
    /// `--offline` and the cache lacks what was asked for.
    NotCached { what: String, cache_dir: PathBuf },
    /// A finished download whose bytes do not hash to the hub's sha256, after every retry.
    Checksum {
        file: String,
        expected: String,
        actual: String,
    },
    /// No environment variable names a cache folder and no home folder exists.
    NoCacheDir,
    /// The repo holds a `preset.ini`: llama-server serves such a repo in router mode, which
    /// bloomery does not have.
    PresetRepo { repo: String },
    /// Reading or writing the cache failed.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HubError {
        let path = path.into();
        move |source| HubError::Io { path, source }
    }
}

fn gguf_list(available: &[String]) -> String {
    let ggufs: Vec<&str> = available
        .iter()
        .map(String::as_str)
        .filter(|p| p.ends_with(".gguf"))
        .collect();
    if ggufs.is_empty() {
        "no GGUF files".to_string()
    } else {
        format!("available GGUF files: {}", ggufs.join(", "))
    }
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubError::InvalidRepo { value } => write!(
                f,
                "invalid HF repo format '{value}', expected <user>/<model>[:quant]"
            ),
            HubError::Unauthorized {
                url,
                status,
                token_sent: false,
            } => write!(
                f,
                "{url}: HTTP {status}: this repo needs a Hugging Face token; pass -hft TOKEN or set HF_TOKEN"
            ),
            HubError::Unauthorized { url, status, .. } => write!(
                f,
                "{url}: HTTP {status}: the Hugging Face token was refused (check it has access to this repo)"
            ),
            HubError::Status {
                url,
                status,
                message,
            } => write!(f, "{url}: HTTP {status}: {message}"),
            HubError::Transport { url, message } => write!(f, "{url}: {message}"),
            HubError::BadAnswer { url, message } => {
                write!(f, "{url}: unexpected answer from the hub: {message}")
            }
            HubError::NoMatch {
                repo,
                tag,
                available,
            } if tag.is_empty() => {
                write!(f, "no GGUF model files in repository {repo} ({})", gguf_list(available))
            }
            HubError::NoMatch {
                repo,
                tag,
                available,
            } => write!(
                f,
                "no GGUF file in repository {repo} matches quant '{tag}' ({})",
                gguf_list(available)
            ),
            HubError::FileNotInRepo {
                repo,
                file,
                available,
            } => write!(
                f,
                "file '{file}' not found in repository {repo} ({})",
                gguf_list(available)
            ),
            HubError::NotCached { what, cache_dir } => write!(
                f,
                "offline mode: {what} is not in the cache {}",
                cache_dir.display()
            ),
            HubError::Checksum {
                file,
                expected,
                actual,
            } => write!(
                f,
                "{file}: downloaded bytes hash to sha256 {actual}, the hub says {expected}"
            ),
            HubError::NoCacheDir => write!(
                f,
                "no cache folder: set LLAMA_CACHE (or HF_HOME, or HOME)"
            ),
            HubError::PresetRepo { repo } => write!(
                f,
                "repository {repo} is a preset repo (preset.ini): llama-server's router mode, not supported"
            ),
            HubError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for HubError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HubError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
