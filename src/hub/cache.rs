//! The download cache on disk, laid out exactly as llama-server b11434 lays it out (the Hugging Face
//! hub cache): `<cache>/models--owner--name/{refs/main, blobs/<sha256>, snapshots/<commit>/<path>}`,
//! snapshot entries being relative symlinks into `blobs/`. A model pulled by either program is found
//! by the other and never fetched twice.

use super::names::{is_listed_model, is_valid_repo_id, split_info};
use super::HubError;
use std::path::{Component, Path, PathBuf};

/// Reads one environment variable; empty values count as unset, as upstream treats them.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

fn non_empty(env: EnvLookup, name: &str) -> Option<PathBuf> {
    env(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The `-hf` cache directory: the first of `LLAMA_CACHE`, `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
/// `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`, `HOME/.cache/huggingface/hub` that is set, then
/// the password database's home. `None` only when no home can be found at all.
pub fn hf_cache_dir(env: EnvLookup) -> Option<PathBuf> {
    let hub = Path::new("huggingface").join("hub");
    let candidates: [(&str, PathBuf); 6] = [
        ("LLAMA_CACHE", PathBuf::new()),
        ("HF_HUB_CACHE", PathBuf::new()),
        ("HUGGINGFACE_HUB_CACHE", PathBuf::new()),
        ("HF_HOME", PathBuf::from("hub")),
        ("XDG_CACHE_HOME", hub.clone()),
        ("HOME", Path::new(".cache").join(&hub)),
    ];
    for (name, below) in candidates {
        if let Some(base) = non_empty(env, name) {
            return Some(base.join(below));
        }
    }
    dirs::home_dir().map(|home| home.join(".cache").join(hub))
}

/// Where `-mu URL` downloads land: `LLAMA_CACHE`, else `XDG_CACHE_HOME/llama.cpp`, else
/// `HOME/.cache/llama.cpp` (upstream's `fs_get_cache_directory`).
pub fn url_cache_dir(env: EnvLookup) -> Option<PathBuf> {
    if let Some(dir) = non_empty(env, "LLAMA_CACHE") {
        return Some(dir);
    }
    let base = non_empty(env, "XDG_CACHE_HOME")
        .or_else(|| non_empty(env, "HOME").map(|h| h.join(".cache")))
        .or_else(|| dirs::home_dir().map(|h| h.join(".cache")))?;
    Some(base.join("llama.cpp"))
}

/// The hub's base URL: `MODEL_ENDPOINT`, else `HF_ENDPOINT`, else `https://huggingface.co/`,
/// always ending in `/`.
pub fn endpoint(env: EnvLookup) -> String {
    let mut url = env("MODEL_ENDPOINT")
        .filter(|v| !v.is_empty())
        .or_else(|| env("HF_ENDPOINT").filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "https://huggingface.co/".to_string());
    if !url.ends_with('/') {
        url.push('/');
    }
    url
}

/// One repo's folder in the cache.
pub struct RepoDir {
    pub repo: String,
    pub root: PathBuf,
}

impl RepoDir {
    pub fn new(cache_dir: &Path, repo: &str) -> RepoDir {
        let folder = hf_hub::Repo::model(repo.to_string()).folder_name();
        RepoDir {
            repo: repo.to_string(),
            root: cache_dir.join(folder),
        }
    }

    pub fn blob(&self, oid: &str) -> PathBuf {
        self.root.join("blobs").join(oid)
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    /// Records which commit a branch points at (`refs/<branch>`), as upstream does after asking
    /// the hub, so that offline runs know which snapshot is current.
    pub fn write_ref(&self, cache_dir: &Path, branch: &str, commit: &str) -> Result<(), HubError> {
        let repo = hf_hub::Repo::with_revision(
            self.repo.clone(),
            hf_hub::RepoType::Model,
            branch.to_string(),
        );
        hf_hub::Cache::new(cache_dir.to_path_buf())
            .repo(repo)
            .create_ref(commit)
            .map_err(HubError::io(self.root.join("refs").join(branch)))
    }

    /// The commit the cache considers current: `refs/main`, else the first other branch file.
    pub fn cached_commit(&self) -> Option<String> {
        let mut refs: Vec<PathBuf> = std::fs::read_dir(self.root.join("refs"))
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        refs.sort_by_key(|p| p.file_name() != Some("main".as_ref()));
        refs.iter().find_map(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            let commit = text.lines().next()?.trim().to_string();
            is_commit(&commit).then_some(commit)
        })
    }
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn is_commit(s: &str) -> bool {
    is_hex(s, 40)
}

/// A git (sha1) or LFS (sha256) object id.
pub fn is_oid(s: &str) -> bool {
    is_hex(s, 40) || is_hex(s, 64)
}

/// Whether `sub` stays inside its parent folder: relative, with no `..`, root or prefix parts.
/// Hub file paths and branch names become file names here, so they must not climb out.
pub fn is_inner_path(sub: &str) -> bool {
    !sub.is_empty()
        && Path::new(sub)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// A file as the cache holds it: its path in the repo and where it is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedFile {
    pub repo: String,
    pub path: String,
    pub local: PathBuf,
}

fn collect_files(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            collect_files(&path, base, out);
        } else if kind.is_file() || kind.is_symlink() {
            if let Ok(rel) = path.strip_prefix(base) {
                out.push(rel.to_path_buf());
            }
        }
    }
}

/// Files of the current snapshot of every cached repo (or only `repo`), sorted by repo and path.
pub fn cached_files(cache_dir: &Path, repo: Option<&str>) -> Vec<CachedFile> {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return Vec::new();
    };
    let mut repos: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join("snapshots").is_dir())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some(name.strip_prefix("models--")?.replace("--", "/"))
        })
        .filter(|r| is_valid_repo_id(r) && repo.is_none_or(|want| want == r))
        .collect();
    repos.sort();

    let mut files = Vec::new();
    for repo_id in repos {
        let dir = RepoDir::new(cache_dir, &repo_id);
        let Some(commit) = dir.cached_commit() else {
            continue;
        };
        let snapshot = dir.snapshot(&commit);
        let mut rels = Vec::new();
        collect_files(&snapshot, &snapshot, &mut rels);
        rels.sort();
        for rel in rels {
            let path: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            files.push(CachedFile {
                repo: repo_id.clone(),
                path: path.join("/"),
                local: snapshot.join(&rel),
            });
        }
    }
    files
}

/// `--cache-list`: one `repo:TAG` per cached model (first split parts with a quant tag, no
/// projectors or speculative sidecars), each once.
pub fn cache_list(cache_dir: &Path) -> Vec<String> {
    let mut seen = Vec::new();
    for file in cached_files(cache_dir, None) {
        let Some(info) = split_info(&file.path).filter(is_listed_model) else {
            continue;
        };
        let entry = format!("{}:{}", file.repo, info.tag);
        if !seen.contains(&entry) {
            seen.push(entry);
        }
    }
    seen
}

/// The text `--cache-list` prints, in upstream's format.
pub fn format_cache_list(models: &[String]) -> String {
    let mut out = format!("number of models in cache: {}\n", models.len());
    for (i, m) in models.iter().enumerate() {
        out.push_str(&format!("{:4}. {m}\n", i + 1));
    }
    out
}

/// Makes the snapshot entry `snapshot` point at `blob`: a relative symlink as upstream makes, or
/// where symlinks are refused, the blob moved (or copied) into place.
pub fn link_snapshot(root: &Path, blob: &Path, snapshot: &Path) -> Result<(), HubError> {
    if blob == snapshot || snapshot.symlink_metadata().is_ok() {
        return Ok(());
    }
    let parent = snapshot.parent().unwrap_or(root);
    std::fs::create_dir_all(parent).map_err(HubError::io(parent))?;
    let depth = parent
        .strip_prefix(root)
        .map_or(0, |p| p.components().count());
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push(blob.strip_prefix(root).unwrap_or(blob));
    if std::os::unix::fs::symlink(&target, snapshot).is_ok() {
        return Ok(());
    }
    log::warn!(
        "cannot symlink {} -> {}; moving the blob into the snapshot instead",
        snapshot.display(),
        target.display()
    );
    std::fs::rename(blob, snapshot)
        .or_else(|_| std::fs::copy(blob, snapshot).map(|_| ()))
        .map_err(HubError::io(snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn cache_dir_follows_upstream_precedence() {
        let all = [
            ("LLAMA_CACHE", "/l"),
            ("HF_HUB_CACHE", "/h"),
            ("HUGGINGFACE_HUB_CACHE", "/hh"),
            ("HF_HOME", "/home/hf"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/u"),
        ];
        let expect = [
            "/l",
            "/h",
            "/hh",
            "/home/hf/hub",
            "/x/huggingface/hub",
            "/u/.cache/huggingface/hub",
        ];
        for i in 0..all.len() {
            let env = env_of(&all[i..]);
            assert_eq!(hf_cache_dir(&env), Some(PathBuf::from(expect[i])));
        }
        let empty_first = env_of(&[("LLAMA_CACHE", ""), ("HF_HOME", "/hf")]);
        assert_eq!(hf_cache_dir(&empty_first), Some(PathBuf::from("/hf/hub")));
        let env = env_of(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/u")]);
        assert_eq!(url_cache_dir(&env), Some(PathBuf::from("/x/llama.cpp")));
        let env = env_of(&[("LLAMA_CACHE", "/l"), ("HOME", "/u")]);
        assert_eq!(url_cache_dir(&env), Some(PathBuf::from("/l")));
    }

    #[test]
    fn endpoint_prefers_model_endpoint_and_ends_in_slash() {
        let env = env_of(&[
            ("MODEL_ENDPOINT", "http://a:1"),
            ("HF_ENDPOINT", "http://b/"),
        ]);
        assert_eq!(endpoint(&env), "http://a:1/");
        assert_eq!(
            endpoint(&env_of(&[("HF_ENDPOINT", "http://b/")])),
            "http://b/"
        );
        assert_eq!(
            endpoint(&env_of(&[("MODEL_ENDPOINT", "")])),
            "https://huggingface.co/"
        );
    }

    #[test]
    fn inner_paths_cannot_climb_out() {
        assert!(is_inner_path("a/b.gguf"));
        for bad in ["", "../x", "a/../../x", "/etc/passwd"] {
            assert!(!is_inner_path(bad), "{bad}");
        }
    }

    #[test]
    fn format_matches_upstream() {
        let text = format_cache_list(&["a/b:Q4_K_M".to_string()]);
        assert_eq!(text, "number of models in cache: 1\n   1. a/b:Q4_K_M\n");
    }
}
