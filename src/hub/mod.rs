//! `-hf owner/repo[:quant]` and `-mu URL` model pulls, and the download cache shared with
//! llama-server: the same quant-tag rules pick the same files, into the same cache layout, so a
//! model either program pulled is reused by the other. Downloads resume after a cut and refuse bytes
//! whose sha256 differs from the hub's. Knows nothing of GGUF contents, flags or HTTP serving: the
//! caller turns options into a [`HubRequest`] and loads the paths it gets back.
//!
//! Built on `hf-hub` (its repo/cache types name the folders and write refs); file listing and
//! transfers go through ureq directly, for the reasons in `fetch.rs`.

mod cache;
mod error;
mod fetch;
mod names;

pub use cache::{
    cache_list, cached_files, endpoint, format_cache_list, hf_cache_dir, url_cache_dir, CachedFile,
    EnvLookup,
};
pub use error::HubError;
pub use names::{split_repo_tag, RepoTag};

use cache::{is_commit, is_inner_path, is_oid, link_snapshot, RepoDir};
use fetch::Client;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// How transfers show their progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// An `indicatif` bar on stderr.
    Bar,
    /// A log line at every tenth of the file.
    Lines,
    Quiet,
}

impl Progress {
    /// A bar when stderr is a terminal, log lines otherwise.
    pub fn detect() -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::Bar
        } else {
            Progress::Lines
        }
    }

    /// A progress display for one transfer; bars of parallel transfers stack in `bars`.
    fn start(
        self,
        bars: &indicatif::MultiProgress,
        name: &str,
        total: Option<u64>,
        done: u64,
    ) -> ProgressSink {
        let sink = match self {
            Progress::Bar => {
                let bar = bars.add(indicatif::ProgressBar::new(total.unwrap_or(0)));
                if total.is_none() {
                    bar.unset_length();
                }
                let style = indicatif::ProgressStyle::with_template(
                    "{msg:32!} {wide_bar:.208/238} {percent:>3}% {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
                bar.set_style(style);
                bar.set_message(name.to_string());
                bar.set_position(done);
                ProgressSink::Bar(bar)
            }
            Progress::Lines => ProgressSink::Lines {
                name: name.to_string(),
                total,
                next_tenth: total.map_or(u64::MAX, |t| done * 10 / t.max(1) + 1),
            },
            Progress::Quiet => ProgressSink::Quiet,
        };
        if self == Progress::Lines {
            match total {
                Some(t) if done > 0 => log::info!("{name}: resuming at {done} of {t} bytes"),
                Some(t) => log::info!("{name}: downloading {t} bytes"),
                None => log::info!("{name}: downloading"),
            }
        }
        sink
    }
}

enum ProgressSink {
    Bar(indicatif::ProgressBar),
    Lines {
        name: String,
        total: Option<u64>,
        next_tenth: u64,
    },
    Quiet,
}

impl ProgressSink {
    fn update(&mut self, done: u64) {
        match self {
            ProgressSink::Bar(bar) => bar.set_position(done),
            ProgressSink::Lines {
                name,
                total: Some(t),
                next_tenth,
            } => {
                let tenth = done * 10 / (*t).max(1);
                if tenth >= *next_tenth {
                    log::info!("{name}: {}% ({done} of {t} bytes)", tenth * 10);
                    *next_tenth = tenth + 1;
                }
            }
            _ => {}
        }
    }

    fn stop(&self) {
        if let ProgressSink::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// One `-hf` pull: what the options and environment said.
#[derive(Debug, Clone)]
pub struct HubRequest {
    /// `owner/name[:quant]` as given to `-hf` (or `-hfd` for the draft model).
    pub repo: String,
    /// `-hff`: an exact repo path, overriding the quant tag.
    pub file: Option<String>,
    /// `-hft` / `HF_TOKEN`.
    pub token: Option<String>,
    /// `--offline`: use only the cache.
    pub offline: bool,
    /// Also fetch the repo's best-fitting multimodal projector (`mmproj`), as upstream does unless
    /// `--no-mmproj`, `--mmproj` or `--mmproj-url` is given.
    pub mmproj: bool,
    /// Speculative-decoding sidecars to look for beside the model (see [`Sidecars`]).
    pub sidecars: Sidecars,
    /// From [`endpoint`].
    pub endpoint: String,
    /// From [`hf_cache_dir`].
    pub cache_dir: PathBuf,
    pub progress: Progress,
}

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl HubRequest {
    /// A request as llama-server builds one: `repo`, `file` and `token` from the options (empty =
    /// not given), the endpoint and cache folder from the environment, a progress bar on a
    /// terminal. `mmproj` starts true; clear it for `--no-mmproj` or an explicit projector.
    pub fn new(repo: &str, file: &str, token: &str, offline: bool) -> Result<HubRequest, HubError> {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Ok(HubRequest {
            repo: repo.to_string(),
            file: non_empty(file),
            token: non_empty(token),
            offline,
            mmproj: true,
            sidecars: Sidecars::default(),
            endpoint: endpoint(&process_env),
            cache_dir: hf_cache_dir(&process_env).ok_or(HubError::NoCacheDir)?,
            progress: Progress::detect(),
        })
    }
}

/// A speculative-decoding head a repo may ship beside its model, named by a file-name marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sidecar {
    Mtp,
    Dspark,
    Dflash,
    Eagle3,
}

impl Sidecar {
    /// Upstream's order of preference when the speculative type is left to the draft repo: MTP,
    /// then DSpark (its head carries more than DFlash's), DFlash, Eagle3.
    pub const ALL: [Sidecar; 4] = [
        Sidecar::Mtp,
        Sidecar::Dspark,
        Sidecar::Dflash,
        Sidecar::Eagle3,
    ];

    /// The marker in the file name (`mtp-Model-Q8_0.gguf`).
    pub fn marker(self) -> &'static str {
        match self {
            Sidecar::Mtp => "mtp-",
            Sidecar::Dspark => "dspark-",
            Sidecar::Dflash => "dflash-",
            Sidecar::Eagle3 => "eagle3-",
        }
    }

    /// The `--spec-type` name that asks for this sidecar.
    pub fn spec_type(self) -> &'static str {
        match self {
            Sidecar::Mtp => "draft-mtp",
            Sidecar::Dspark => "draft-dspark",
            Sidecar::Dflash => "draft-dflash",
            Sidecar::Eagle3 => "draft-eagle3",
        }
    }
}

/// Which sidecars a pull looks for, and what finding one means.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sidecars {
    /// The kinds to look for, each matched to the model (or the tag) as a projector is.
    pub kinds: Vec<Sidecar>,
    /// A draft repo: a sidecar found stands in for the model, whose files are then not fetched;
    /// with `first_only`, only the first kind found (in `kinds` order) is kept. A repo holding
    /// only sidecars is then no error.
    pub instead_of_model: bool,
    pub first_only: bool,
}

/// What a pull left on disk, as snapshot paths in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Every part of the model, first part first; empty when a sidecar stands in for it.
    pub model: Vec<PathBuf>,
    pub mmproj: Option<PathBuf>,
    pub sidecars: Vec<(Sidecar, PathBuf)>,
}

/// A repo file and where its bytes go.
struct RepoFile {
    path: String,
    /// The file's URL on the hub (empty for files known only from the cache).
    url: String,
    /// LFS sha256 or git sha1; the blob's name.
    oid: String,
    /// `snapshots/<commit>/<path>`: what the caller gets.
    snapshot: PathBuf,
}

impl RepoFile {
    /// Where the bytes are written: the blob, unless the snapshot entry already exists or the hub
    /// gave no object id.
    fn target(&self, dir: &RepoDir) -> PathBuf {
        if self.oid.is_empty() || self.snapshot.symlink_metadata().is_ok() {
            self.snapshot.clone()
        } else {
            dir.blob(&self.oid)
        }
    }
}

fn str_field<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str()
}

/// The commit the hub's `main` branch (else its first valid branch) points at, recorded in refs.
fn remote_commit(client: &Client, req: &HubRequest, dir: &RepoDir) -> Result<String, HubError> {
    let url = format!("{}api/models/{}/refs", req.endpoint, dir.repo);
    let refs = client.api_get(&url)?;
    let branches = refs
        .get("branches")
        .and_then(|b| b.as_array())
        .ok_or_else(|| HubError::BadAnswer {
            url: url.clone(),
            message: "no 'branches' list".to_string(),
        })?;
    let valid: Vec<(&str, &str)> = branches
        .iter()
        .filter_map(|b| Some((str_field(b, "name")?, str_field(b, "targetCommit")?)))
        .filter(|(name, commit)| is_commit(commit) && is_inner_path(name))
        .collect();
    let (branch, commit) = valid
        .iter()
        .find(|(name, _)| *name == "main")
        .or(valid.first())
        .ok_or_else(|| HubError::BadAnswer {
            url,
            message: "no branch with a valid commit".to_string(),
        })?;
    dir.write_ref(&req.cache_dir, branch, commit)?;
    Ok(commit.to_string())
}

/// The repo's files at its current commit, from the hub.
fn remote_files(
    client: &Client,
    req: &HubRequest,
    dir: &RepoDir,
) -> Result<Vec<RepoFile>, HubError> {
    let commit = remote_commit(client, req, dir)?;
    let url = format!(
        "{}api/models/{}/tree/{commit}?recursive=true",
        req.endpoint, dir.repo
    );
    let tree = client.api_get(&url)?;
    let items = tree.as_array().ok_or_else(|| HubError::BadAnswer {
        url: url.clone(),
        message: "the file tree is not a list".to_string(),
    })?;
    let snapshot = dir.snapshot(&commit);
    let mut files = Vec::new();
    for item in items {
        if str_field(item, "type") != Some("file") {
            continue;
        }
        let Some(path) = str_field(item, "path").filter(|p| is_inner_path(p)) else {
            log::warn!("{}: skipping a file with an unsafe path: {item}", dir.repo);
            continue;
        };
        let oid = item
            .get("lfs")
            .filter(|l| l.is_object())
            .map_or_else(|| str_field(item, "oid"), |lfs| str_field(lfs, "oid"))
            .unwrap_or_default();
        if !oid.is_empty() && !is_oid(oid) {
            log::warn!("{}: skipping {path}: invalid object id {oid}", dir.repo);
            continue;
        }
        files.push(RepoFile {
            path: path.to_string(),
            url: format!("{}{}/resolve/{commit}/{path}", req.endpoint, dir.repo),
            oid: oid.to_string(),
            snapshot: snapshot.join(path),
        });
    }
    Ok(files)
}

fn local_files(req: &HubRequest, repo: &str) -> Vec<RepoFile> {
    cached_files(&req.cache_dir, Some(repo))
        .into_iter()
        .map(|f| RepoFile {
            path: f.path,
            url: String::new(),
            oid: String::new(),
            snapshot: f.local,
        })
        .collect()
}

/// Resolves an `-hf` request to files on disk, downloading what the cache lacks. Online, the hub
/// says which commit is current and what it holds; when the hub cannot be reached but the repo is
/// cached, the cache is used with a warning (as upstream). Offline, only the cache is consulted.
pub fn resolve_model(req: &HubRequest) -> Result<Resolved, HubError> {
    let RepoTag { repo, tag } = split_repo_tag(&req.repo)?;
    let dir = RepoDir::new(&req.cache_dir, &repo);
    let client = Client::new(req.token.as_deref());

    let files = if req.offline {
        local_files(req, &repo)
    } else {
        match remote_files(&client, req, &dir) {
            Ok(files) => files,
            Err(e) => {
                let cached = local_files(req, &repo);
                if cached.is_empty() {
                    return Err(e);
                }
                log::warn!("{e}; using the cached copy of {repo}");
                cached
            }
        }
    };
    if files.is_empty() {
        return Err(HubError::NotCached {
            what: format!("repository {repo}"),
            cache_dir: req.cache_dir.clone(),
        });
    }

    // Upstream treats a repo with a root preset.ini as a set of models to serve in router mode.
    if files.iter().any(|f| f.path == "preset.ini") {
        return Err(HubError::PresetRepo { repo });
    }
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let available = || paths.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let primary = match &req.file {
        Some(file) => Some(paths.iter().find(|p| *p == file).copied().ok_or_else(|| {
            HubError::FileNotInRepo {
                repo: repo.clone(),
                file: file.clone(),
                available: available(),
            }
        })?),
        None => names::best_model(&paths, &tag),
    };
    // A sidecar is matched against the model when there is one, else against the tag alone.
    let mut sidecars: Vec<(Sidecar, &str)> = req
        .sidecars
        .kinds
        .iter()
        .filter_map(|&kind| {
            names::best_sibling(&paths, primary.unwrap_or(""), kind.marker(), &tag)
                .map(|p| (kind, p))
        })
        .collect();
    if req.sidecars.first_only {
        sidecars.truncate(1);
    }
    let parts = match primary {
        Some(_) if req.sidecars.instead_of_model && !sidecars.is_empty() => Vec::new(),
        Some(primary) => names::split_parts(&paths, primary),
        None if req.sidecars.instead_of_model && !sidecars.is_empty() => Vec::new(),
        None => {
            return Err(HubError::NoMatch {
                repo: repo.clone(),
                tag: tag.clone(),
                available: available(),
            })
        }
    };
    let mmproj = primary
        .filter(|_| req.mmproj)
        .and_then(|primary| names::best_sibling(&paths, primary, "mmproj", ""));

    let by_path = |p: &str| files.iter().find(|f| f.path == p);
    let wanted: Vec<&RepoFile> = parts
        .iter()
        .chain(&mmproj)
        .chain(sidecars.iter().map(|(_, p)| p))
        .filter_map(|p| by_path(p))
        .collect();
    // Each blob once (two repo files may share one), all at once as upstream fetches them: a
    // split model arrives in the time of its largest part.
    let mut unique: Vec<&RepoFile> = Vec::new();
    for file in &wanted {
        if !unique.iter().any(|u| u.target(&dir) == file.target(&dir)) {
            unique.push(file);
        }
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = unique
            .iter()
            .map(|file| scope.spawn(|| fetch_blob(&client, req, &dir, file)))
            .collect();
        // The scope waits for every transfer even when one fails early.
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })?;
    let mut fetched = Vec::new();
    for file in &wanted {
        link_snapshot(&dir.root, &file.target(&dir), &file.snapshot)?;
        fetched.push(file.snapshot.clone());
    }
    let mut fetched = fetched.into_iter();
    let model = fetched.by_ref().take(parts.len()).collect();
    let mmproj = mmproj.and_then(|_| fetched.next());
    let sidecars = sidecars
        .iter()
        .map(|(kind, _)| *kind)
        .zip(fetched)
        .collect();
    Ok(Resolved {
        model,
        mmproj,
        sidecars,
    })
}

/// Makes one repo file's bytes present in the cache, downloading them when missing.
fn fetch_blob(
    client: &Client,
    req: &HubRequest,
    dir: &RepoDir,
    file: &RepoFile,
) -> Result<(), HubError> {
    let target = file.target(dir);
    // A complete blob was checked when it was written; upstream reuses it the same way.
    if !target.exists() {
        if req.offline || file.url.is_empty() {
            return Err(HubError::NotCached {
                what: format!("{} from {}", file.path, dir.repo),
                cache_dir: req.cache_dir.clone(),
            });
        }
        let sha256 = (file.oid.len() == 64).then_some(file.oid.as_str());
        client.download(&file.url, &target, sha256, req.progress)?;
    }
    Ok(())
}

/// One `-mu URL` download (or `-mmu` for a projector).
#[derive(Debug, Clone)]
pub struct UrlRequest {
    pub url: String,
    /// `-m PATH` given with the URL: where a single file goes (split parts go beside it).
    pub path: Option<PathBuf>,
    pub token: Option<String>,
    pub offline: bool,
    /// From [`url_cache_dir`]; used when no `path` is given.
    pub cache_dir: PathBuf,
    pub progress: Progress,
}

fn url_file_name(url: &str) -> &str {
    let url = url.split('#').next().unwrap_or(url);
    let url = url.split('?').next().unwrap_or(url);
    url.rsplit('/').next().unwrap_or(url)
}

/// Every part URL of a split GGUF URL (`...-00001-of-00003.gguf`), or just `url`.
fn url_parts(url: &str) -> Vec<String> {
    match names::split_info(url).filter(|s| s.count > 1) {
        Some(s) => (1..=s.count)
            .map(|i| format!("{}-{i:05}-of-{:05}.gguf", s.prefix, s.count))
            .collect(),
        None => vec![url.to_string()],
    }
}

impl UrlRequest {
    /// A `-mu` / `-mmu` request: `path` is the `-m` / `--mmproj` value (empty = not given), the
    /// cache folder comes from the environment.
    pub fn new(url: &str, path: &str, token: &str, offline: bool) -> Result<UrlRequest, HubError> {
        Ok(UrlRequest {
            url: url.to_string(),
            path: (!path.is_empty()).then(|| PathBuf::from(path)),
            token: (!token.is_empty()).then(|| token.to_string()),
            offline,
            cache_dir: url_cache_dir(&process_env).ok_or(HubError::NoCacheDir)?,
            progress: Progress::detect(),
        })
    }
}

/// `--cache-list` as upstream prints it, for the cache the environment names.
pub fn cache_list_text() -> Result<String, HubError> {
    let dir = hf_cache_dir(&process_env).ok_or(HubError::NoCacheDir)?;
    Ok(format_cache_list(&cache_list(&dir)))
}

/// Downloads a model from a plain URL, as upstream: into the `-m` path or the llama.cpp cache
/// folder under the URL's file name; an existing file is kept unless the server's `ETag` differs
/// from the one recorded in `<file>.etag` beside it. Returns every part, first first.
pub fn download_url(req: &UrlRequest) -> Result<Vec<PathBuf>, HubError> {
    let parts = url_parts(&req.url);
    let client = Client::new(req.token.as_deref());
    let mut paths = Vec::new();
    for url in &parts {
        let name = url_file_name(url);
        let path = match &req.path {
            Some(p) if parts.len() == 1 => p.clone(),
            Some(p) => p.parent().unwrap_or(Path::new(".")).join(name),
            None => req.cache_dir.join(name),
        };
        fetch_url(&client, req, url, &path)?;
        paths.push(path);
    }
    Ok(paths)
}

fn etag_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".etag");
    PathBuf::from(name)
}

fn fetch_url(client: &Client, req: &UrlRequest, url: &str, path: &Path) -> Result<(), HubError> {
    let exists = path.exists();
    if req.offline {
        return if exists {
            Ok(())
        } else {
            Err(HubError::NotCached {
                what: url.to_string(),
                cache_dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            })
        };
    }
    if exists {
        let recorded = std::fs::read_to_string(etag_path(path)).ok();
        match client.head_etag(url) {
            // No answer, no ETag, or the same one: the file on disk is current.
            None | Some((_, None)) => return Ok(()),
            Some((status, _)) if !(200..300).contains(&status) => return Ok(()),
            Some((_, Some(etag))) if recorded.as_deref().map(str::trim) == Some(etag.as_str()) => {
                return Ok(())
            }
            Some(_) => std::fs::remove_file(path).map_err(HubError::io(path))?,
        }
    }
    if let Some(etag) = client.download(url, path, None, req.progress)? {
        let tag_file = etag_path(path);
        std::fs::write(&tag_file, etag).map_err(HubError::io(tag_file))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parts_and_names() {
        assert_eq!(
            url_parts("http://h/m/x-Q2_K-00001-of-00003.gguf"),
            [
                "http://h/m/x-Q2_K-00001-of-00003.gguf",
                "http://h/m/x-Q2_K-00002-of-00003.gguf",
                "http://h/m/x-Q2_K-00003-of-00003.gguf"
            ]
        );
        assert_eq!(
            url_parts("http://h/x.gguf?download=1"),
            ["http://h/x.gguf?download=1"]
        );
        assert_eq!(url_file_name("http://h/a/x.gguf?download=1#f"), "x.gguf");
    }
}
