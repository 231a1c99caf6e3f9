//! The cache shared with upstream, checked against upstream itself: `llama download` (b11434) and
//! bloomery pull from the same local hub into one cache, and each reuses what the other fetched.
//! Skips with a reason when the upstream build is absent (scripts/upstream.sh makes it).

mod hub_server;

use bloomery::hub::{self, HubRequest, Progress};
use hub_server::{bytes, HubFile, HubRepo, LocalHub, Scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

const COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";

fn upstream_bin(name: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| dirs::home_dir().unwrap_or_default().join(".cache/bloomery"));
    let bin = cache.join("upstream/b11434/bin").join(name);
    if bin.is_file() {
        Some(bin)
    } else {
        println!(
            "skipping: {} is absent (scripts/upstream.sh builds it)",
            bin.display()
        );
        None
    }
}

fn repo() -> HubRepo {
    let files = [
        "README.md",
        "Tiny-Q8_0.gguf",
        "Tiny-UD-Q4_K_XL.gguf",
        "Q4_K_M/Tiny-Q4_K_M-00001-of-00002.gguf",
        "Q4_K_M/Tiny-Q4_K_M-00002-of-00002.gguf",
        "mmproj-Tiny-F16.gguf",
    ];
    HubRepo {
        id: "owner/Tiny-GGUF".to_string(),
        commit: COMMIT.to_string(),
        files: files
            .iter()
            .enumerate()
            .map(|(i, p)| HubFile::new(p, bytes(i as u8 + 40, 2000 + 100 * i)))
            .collect(),
        token: None,
    }
}

fn temp_dir(name: &str) -> Scratch {
    Scratch::new(&format!("upstream-{name}"))
}

/// `llama download` with the cache and endpoint given; the paths it printed.
fn upstream_download(llama: &Path, hub: &LocalHub, cache: &Path, args: &[&str]) -> Vec<PathBuf> {
    let out = Command::new(llama)
        .arg("download")
        .args(args)
        .env("LLAMA_CACHE", cache)
        .env("MODEL_ENDPOINT", &hub.url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "llama download {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

fn upstream_cache_list(llama_server: &Path, cache: &Path) -> String {
    let out = Command::new(llama_server)
        .arg("--cache-list")
        .env("LLAMA_CACHE", cache)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn request(hub: &LocalHub, repo: &str, cache: &Path) -> HubRequest {
    HubRequest {
        repo: repo.to_string(),
        file: None,
        token: None,
        offline: false,
        mmproj: true,
        sidecars: Default::default(),
        endpoint: hub.url.clone(),
        cache_dir: cache.to_path_buf(),
        progress: Progress::Quiet,
    }
}

#[test]
fn upstream_pulls_are_reused_and_ours_are_reused_by_upstream() {
    let (Some(llama), Some(server)) = (upstream_bin("llama"), upstream_bin("llama-server")) else {
        return;
    };
    let hub = LocalHub::start(vec![repo()]);

    // Upstream pulls first; bloomery then finds the same files without fetching a byte.
    let cache = temp_dir("theirs");
    let theirs = upstream_download(&llama, &hub, &cache, &["-hf", "owner/Tiny-GGUF:q4_k_m"]);
    let fetched = hub.transfers().len();
    let ours = hub::resolve_model(&request(&hub, "owner/Tiny-GGUF:q4_k_m", &cache)).unwrap();
    assert_eq!(
        hub.transfers().len(),
        fetched,
        "bloomery fetched what upstream had"
    );
    assert_eq!(ours.model[0], theirs[0]);
    assert_eq!(ours.mmproj.as_ref(), theirs.get(1));
    assert_eq!(
        hub::format_cache_list(&hub::cache_list(&cache)),
        upstream_cache_list(&server, &cache)
    );

    // bloomery pulls first; upstream then finds them, online and offline.
    let cache = temp_dir("ours");
    let ours = hub::resolve_model(&request(&hub, "owner/Tiny-GGUF:Q4_K_XL", &cache)).unwrap();
    let fetched = hub.transfers().len();
    let theirs = upstream_download(&llama, &hub, &cache, &["-hf", "owner/Tiny-GGUF:Q4_K_XL"]);
    assert_eq!(
        hub.transfers().len(),
        fetched,
        "upstream fetched what bloomery had"
    );
    assert_eq!(theirs[0], ours.model[0]);
    let theirs = upstream_download(
        &llama,
        &hub,
        &cache,
        &["-hf", "owner/Tiny-GGUF:Q4_K_XL", "--offline"],
    );
    assert_eq!(theirs[0], ours.model[0]);
    assert_eq!(
        hub::format_cache_list(&hub::cache_list(&cache)),
        upstream_cache_list(&server, &cache)
    );
}

/// Repo shapes from upstream's resolution tests; upstream's `llama download` and bloomery must
/// pick the same model parts and projector from each, for each tag.
#[test]
fn quant_tags_pick_what_upstream_picks() {
    let Some(llama) = upstream_bin("llama") else {
        return;
    };
    let shapes: [(&str, &[&str], &[&str]); 5] = [
        (
            "owner/flat",
            &[
                "README.md",
                "model-BF16.gguf",
                "model-Q4_K_M.gguf",
                "model-Q8_0.gguf",
                "mmproj-model-BF16.gguf",
                "mmproj-model-Q8_0.gguf",
                "mtp-model-Q8_0.gguf",
            ],
            &["", "Q8_0", "bf16", "q4_k_m"],
        ),
        (
            "owner/subdir",
            &[
                "mmproj-model-f16.gguf",
                "model-mtp-BF16.gguf",
                "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf",
                "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
                "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf",
                "Q8_0/model-Q8_0-00001-of-00002.gguf",
                "Q8_0/model-Q8_0-00002-of-00002.gguf",
            ],
            &["", "Q3_K_M", "q8_0"],
        ),
        (
            "owner/unsloth",
            &[
                "model-UD-Q8_K_XL.gguf",
                "mmproj-BF16.gguf",
                "model-MTP-BF16.gguf",
            ],
            &["", "Q8_K_XL", "UD-Q8_K_XL"],
        ),
        (
            "owner/vendors",
            &[
                "TheDrummer_Model-24B-v4.1-Q8_0.gguf",
                "BlackSheep-24B.Q8_0.gguf",
                "x.IQ4_XS.gguf",
            ],
            &["", "Q8_0", "iq4_xs"],
        ),
        (
            "owner/spark",
            &[
                "README.md",
                "model-MXFP4.gguf",
                "dspark-model-BF16.gguf",
                "imatrix.gguf",
            ],
            &["", "mxfp4"],
        ),
    ];
    let repos = shapes
        .iter()
        .map(|(id, files, _)| HubRepo {
            id: id.to_string(),
            commit: COMMIT.to_string(),
            files: files
                .iter()
                .enumerate()
                .map(|(i, p)| HubFile::new(p, bytes(i as u8, 500 + i)))
                .collect(),
            token: None,
        })
        .collect();
    let hub = LocalHub::start(repos);
    for (id, _, tags) in shapes {
        for tag in tags {
            let repo = if tag.is_empty() {
                id.to_string()
            } else {
                format!("{id}:{tag}")
            };
            let theirs_cache = temp_dir(&format!("pick-theirs-{}", repo.replace([':', '/'], "-")));
            let ours_cache = temp_dir(&format!("pick-ours-{}", repo.replace([':', '/'], "-")));
            let theirs = upstream_download(&llama, &hub, &theirs_cache, &["-hf", &repo]);
            let ours = hub::resolve_model(&request(&hub, &repo, &ours_cache)).unwrap();
            let rel = |p: &Path, root: &Path| p.strip_prefix(root).unwrap().to_path_buf();
            let mut ours_printed = vec![rel(&ours.model[0], &ours_cache)];
            ours_printed.extend(ours.mmproj.iter().map(|p| rel(p, &ours_cache)));
            let theirs_printed: Vec<PathBuf> =
                theirs.iter().map(|p| rel(p, &theirs_cache)).collect();
            assert_eq!(ours_printed, theirs_printed, "{repo}");
            // Every part upstream fetched, bloomery fetched too.
            let listing = |root: &Path| {
                let mut names: Vec<_> = hub::cached_files(root, None)
                    .into_iter()
                    .map(|f| f.path)
                    .collect();
                names.sort();
                names
            };
            assert_eq!(listing(&ours_cache), listing(&theirs_cache), "{repo}");
        }
    }
}

/// What `-hf`, `-hfd`, `--spec-type` and the projector options make each server fetch: both
/// binaries run with the same options against one local hub, each into its own cache, and must
/// leave the same files. The files are not models, so both refuse to load them afterwards.
#[test]
fn draft_and_projector_pulls_fetch_what_upstream_fetches() {
    let Some(server) = upstream_bin("llama-server") else {
        return;
    };
    let repo = |id: &str, files: &[&str]| HubRepo {
        id: id.to_string(),
        commit: COMMIT.to_string(),
        files: files
            .iter()
            .enumerate()
            .map(|(i, p)| HubFile::new(p, bytes(i as u8 + 7, 300 + 10 * i)))
            .collect(),
        token: None,
    };
    let hub = LocalHub::start(vec![
        repo(
            "owner/main",
            &[
                "model-Q4_K_M.gguf",
                "model-Q8_0.gguf",
                "mmproj-model-F16.gguf",
                "mmproj-model-Q8_0.gguf",
                "mtp-model-Q8_0.gguf",
                "eagle3-model-BF16.gguf",
            ],
        ),
        repo("owner/draft", &["small-Q4_K_M.gguf", "small-Q8_0.gguf"]),
        repo(
            "owner/draft-heads",
            &[
                "small-Q8_0.gguf",
                "dflash-small-Q8_0.gguf",
                "eagle3-small-Q8_0.gguf",
                "dspark-small-BF16.gguf",
            ],
        ),
        repo(
            "owner/heads-only",
            &["eagle3-head-Q8_0.gguf", "eagle3-head-F16.gguf"],
        ),
    ]);
    let cases: [&[&str]; 11] = [
        &["-hf", "owner/main"],
        &["-hf", "owner/main:Q8_0", "--no-mmproj"],
        &[
            "-hf",
            "owner/main",
            "--mmproj",
            "/nonexistent/projector.gguf",
        ],
        &["-hf", "owner/main", "--spec-type", "draft-mtp"],
        &["-hf", "owner/main", "--spec-type", "draft-eagle3,draft-mtp"],
        &["-hf", "owner/main", "-hfd", "owner/draft"],
        &["-hf", "owner/main", "-hfd", "owner/draft:Q8_0"],
        &["-hf", "owner/main", "-hfd", "owner/draft-heads"],
        &[
            "-hf",
            "owner/main",
            "-hfd",
            "owner/draft-heads",
            "--spec-type",
            "draft-eagle3",
        ],
        &[
            "-hf",
            "owner/main",
            "-hfd",
            "owner/draft-heads",
            "-md",
            "small-Q8_0.gguf",
        ],
        &["-hf", "owner/main", "-hfd", "owner/heads-only:Q8_0"],
    ];
    let listing = |root: &Path| {
        let mut names: Vec<_> = hub::cached_files(root, None)
            .into_iter()
            .map(|f| format!("{}/{}", f.repo, f.path))
            .collect();
        names.sort();
        names
    };
    let ours_bin = PathBuf::from(env!("CARGO_BIN_EXE_bloomery-serve"));
    for (i, args) in cases.iter().enumerate() {
        let mut fetched = Vec::new();
        for (who, bin) in [("theirs", &server), ("ours", &ours_bin)] {
            let cache = temp_dir(&format!("pulls-{i}-{who}"));
            let out = Command::new(bin)
                .args(*args)
                .args(["--port", "9", "--host", "127.0.0.1"])
                .env("LLAMA_CACHE", &*cache)
                .env("MODEL_ENDPOINT", &hub.url)
                .env_remove("HF_TOKEN")
                .output()
                .unwrap();
            assert!(
                !out.status.success(),
                "{who} {args:?} loaded a file that is no model"
            );
            fetched.push(listing(&cache));
        }
        assert!(
            !fetched[0].is_empty(),
            "upstream fetched nothing for {args:?}"
        );
        assert_eq!(fetched[1], fetched[0], "ours vs upstream for {args:?}");
    }
}
