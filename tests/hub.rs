//! `-hf` and `-mu` pulls against a local hub on 127.0.0.1: quant tags, split files, the cache layout
//! llama-server shares, resume after a cut, corrupted bytes, offline use, tokens and hub errors.

mod hub_server;

use bloomery::hub::{self, HubError, HubRequest, Progress, UrlRequest};
use hub_server::{bytes, sha256_hex, HubFile, HubRepo, LocalHub, Scratch};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const TOKEN: &str = "hf_abcdefghijklmnopqrstuvwxyz0123456789";

fn temp_dir(name: &str) -> Scratch {
    Scratch::new(&format!("hub-{name}"))
}

/// A repo shaped like a real GGUF repo: plain quants, an `UD-` quant, a split quant in a folder,
/// projectors, an imatrix and a README.
fn gguf_repo(id: &str) -> HubRepo {
    let files = [
        ("README.md", 40),
        ("Tiny-Q8_0.gguf", 3000),
        ("Tiny-UD-Q4_K_XL.gguf", 2500),
        ("Tiny-F16.gguf", 4000),
        ("Q4_K_M/Tiny-Q4_K_M-00001-of-00003.gguf", 1500),
        ("Q4_K_M/Tiny-Q4_K_M-00002-of-00003.gguf", 1400),
        ("Q4_K_M/Tiny-Q4_K_M-00003-of-00003.gguf", 900),
        ("mmproj-Tiny-F16.gguf", 700),
        ("mmproj-Tiny-Q8_0.gguf", 600),
        ("imatrix_unsloth.gguf", 100),
    ];
    HubRepo {
        id: id.to_string(),
        commit: COMMIT.to_string(),
        files: files
            .iter()
            .enumerate()
            .map(|(i, (p, n))| HubFile::new(p, bytes(i as u8, *n)))
            .collect(),
        token: None,
    }
}

/// The endpoint read the way upstream reads it, from `MODEL_ENDPOINT` (over `HF_ENDPOINT`).
fn request(hub_url: &str, repo: &str, cache: &Path) -> HubRequest {
    let env: HashMap<&str, &str> = [
        ("MODEL_ENDPOINT", hub_url),
        ("HF_ENDPOINT", "http://127.0.0.1:9/"),
    ]
    .into();
    HubRequest {
        repo: repo.to_string(),
        file: None,
        token: None,
        offline: false,
        mmproj: false,
        sidecars: Default::default(),
        endpoint: hub::endpoint(&|k| env.get(k).map(|v| v.to_string())),
        cache_dir: cache.to_path_buf(),
        progress: Progress::Quiet,
    }
}

fn data_of<'a>(repo: &'a HubRepo, path: &str) -> &'a [u8] {
    &repo.files.iter().find(|f| f.path == path).unwrap().data
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn quant_tags_pick_files_and_fill_the_shared_cache_layout() {
    let hub = LocalHub::start(vec![gguf_repo("owner/Tiny-GGUF")]);
    let expected = gguf_repo("owner/Tiny-GGUF");
    let cache = temp_dir("tags");

    // Case-insensitive tag, found behind the `UD-` prefix.
    let got = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:q4_k_xl", &cache)).unwrap();
    let snapshot = cache
        .join("models--owner--Tiny-GGUF/snapshots")
        .join(COMMIT);
    assert_eq!(got.model, [snapshot.join("Tiny-UD-Q4_K_XL.gguf")]);
    assert_eq!(
        read(&got.model[0]),
        data_of(&expected, "Tiny-UD-Q4_K_XL.gguf")
    );

    // Exactly llama-server's layout: refs/main, blobs named by sha256, relative snapshot links.
    let root = cache.join("models--owner--Tiny-GGUF");
    assert_eq!(
        std::fs::read_to_string(root.join("refs/main")).unwrap(),
        COMMIT
    );
    let sha = sha256_hex(data_of(&expected, "Tiny-UD-Q4_K_XL.gguf"));
    assert_eq!(
        std::fs::read_link(&got.model[0]).unwrap(),
        PathBuf::from(format!("../../blobs/{sha}"))
    );
    assert!(root.join("blobs").join(&sha).is_file());

    // A split model in a folder: every part, first first, each linked from its folder.
    let got = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:Q4_K_M", &cache)).unwrap();
    let parts: Vec<String> = (1..=3)
        .map(|i| format!("Q4_K_M/Tiny-Q4_K_M-0000{i}-of-00003.gguf"))
        .collect();
    assert_eq!(
        got.model,
        parts.iter().map(|p| snapshot.join(p)).collect::<Vec<_>>()
    );
    for (path, part) in got.model.iter().zip(&parts) {
        assert_eq!(read(path), data_of(&expected, part));
        let link = std::fs::read_link(path).unwrap();
        assert!(link.starts_with("../../../blobs"), "{}", link.display());
    }

    // No tag: Q4_K_M first. With a projector asked for: the one closest in width.
    let mut req = request(&hub.url, "owner/Tiny-GGUF", &cache);
    req.mmproj = true;
    let got = hub::resolve_model(&req).unwrap();
    assert_eq!(got.model[0], snapshot.join(&parts[0]));
    assert_eq!(got.mmproj, Some(snapshot.join("mmproj-Tiny-Q8_0.gguf")));

    // `-hff` names a file exactly, whatever the tag says.
    let mut req = request(&hub.url, "owner/Tiny-GGUF:Q8_0", &cache);
    req.file = Some("Tiny-F16.gguf".to_string());
    assert_eq!(
        hub::resolve_model(&req).unwrap().model,
        [snapshot.join("Tiny-F16.gguf")]
    );

    // --cache-list lists each model quant once (by path order), projectors left out.
    assert_eq!(
        hub::cache_list(&cache),
        [
            "owner/Tiny-GGUF:Q4_K_M",
            "owner/Tiny-GGUF:F16",
            "owner/Tiny-GGUF:Q4_K_XL"
        ]
    );
}

#[test]
fn a_pulled_model_is_never_fetched_twice_and_works_offline() {
    let hub = LocalHub::start(vec![gguf_repo("owner/Tiny-GGUF")]);
    let cache = temp_dir("offline");
    let first = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:Q8_0", &cache)).unwrap();
    assert_eq!(hub.transfers().len(), 1);

    let again = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:Q8_0", &cache)).unwrap();
    assert_eq!(again, first);
    assert_eq!(
        hub.transfers().len(),
        1,
        "the cached blob was fetched again"
    );

    // Offline: the hub is not asked at all (its endpoint here is a closed port).
    let mut req = request("http://127.0.0.1:9/", "owner/Tiny-GGUF:q8_0", &cache);
    req.offline = true;
    assert_eq!(hub::resolve_model(&req).unwrap(), first);

    req.repo = "owner/Tiny-GGUF:F16".to_string();
    let err = hub::resolve_model(&req).unwrap_err();
    assert!(matches!(err, HubError::NoMatch { .. }), "{err}");
    req.repo = "owner/Other-GGUF".to_string();
    let err = hub::resolve_model(&req).unwrap_err();
    assert!(matches!(err, HubError::NotCached { .. }), "{err}");
    assert!(err.to_string().contains("owner/Other-GGUF"), "{err}");

    // Online but the hub is down: the cached copy serves.
    let req = request("http://127.0.0.1:9/", "owner/Tiny-GGUF:Q8_0", &cache);
    assert_eq!(hub::resolve_model(&req).unwrap(), first);
}

#[test]
fn a_cache_written_by_llama_server_is_reused() {
    let cache = temp_dir("upstream-cache");
    let data = bytes(9, 1234);
    let sha = sha256_hex(&data);
    let root = cache.join("models--ggml-org--gemma-3-270m-GGUF");
    std::fs::create_dir_all(root.join("blobs")).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::create_dir_all(root.join("snapshots").join(COMMIT)).unwrap();
    std::fs::write(root.join("blobs").join(&sha), &data).unwrap();
    std::fs::write(root.join("refs/main"), COMMIT).unwrap();
    let entry = root
        .join("snapshots")
        .join(COMMIT)
        .join("gemma-3-270m-Q4_K_M.gguf");
    std::os::unix::fs::symlink(format!("../../blobs/{sha}"), &entry).unwrap();

    let mut repo = gguf_repo("ggml-org/gemma-3-270m-GGUF");
    repo.files = vec![HubFile::new("gemma-3-270m-Q4_K_M.gguf", data.clone())];
    let hub = LocalHub::start(vec![repo]);
    let got = hub::resolve_model(&request(&hub.url, "ggml-org/gemma-3-270m-GGUF", &cache)).unwrap();
    assert_eq!(got.model, [entry]);
    assert!(hub.transfers().is_empty());
    assert_eq!(
        hub::cache_list(&cache),
        ["ggml-org/gemma-3-270m-GGUF:Q4_K_M"]
    );
    assert_eq!(
        hub::format_cache_list(&hub::cache_list(&cache)),
        "number of models in cache: 1\n   1. ggml-org/gemma-3-270m-GGUF:Q4_K_M\n"
    );
}

#[test]
fn a_cut_transfer_resumes_where_it_stopped() {
    let repo = gguf_repo("owner/Tiny-GGUF");
    let want = data_of(&repo, "Tiny-F16.gguf").to_vec();
    let sha = sha256_hex(&want);
    let hub = LocalHub::start(vec![repo]);
    let cache = temp_dir("cut");
    hub.cut("Tiny-F16.gguf", 1, 1000);

    let got = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:F16", &cache)).unwrap();
    assert_eq!(read(&got.model[0]), want);
    let ranges: Vec<Option<String>> = hub.transfers().into_iter().map(|s| s.range).collect();
    assert_eq!(ranges, [None, Some("bytes=1000-".to_string())]);

    // A half-done transfer left by an earlier run (ours or llama-server's) is picked up too.
    let cache = temp_dir("cut-earlier");
    let blobs = cache.join("models--owner--Tiny-GGUF/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(
        blobs.join(format!("{sha}.downloadInProgress")),
        &want[..2500],
    )
    .unwrap();
    let before = hub.transfers().len();
    let got = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:F16", &cache)).unwrap();
    assert_eq!(read(&got.model[0]), want);
    let transfers = hub.transfers();
    assert_eq!(transfers.len(), before + 1);
    assert_eq!(transfers[before].range.as_deref(), Some("bytes=2500-"));
    assert!(!blobs.join(format!("{sha}.downloadInProgress")).exists());
}

#[test]
fn corrupted_bytes_are_refused_and_fetched_again() {
    let repo = gguf_repo("owner/Tiny-GGUF");
    let want = data_of(&repo, "Tiny-Q8_0.gguf").to_vec();
    let hub = LocalHub::start(vec![repo]);

    let cache = temp_dir("corrupt-once");
    hub.corrupt("Tiny-Q8_0.gguf", 1);
    let got = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:Q8_0", &cache)).unwrap();
    assert_eq!(read(&got.model[0]), want);
    let ranges: Vec<Option<String>> = hub.transfers().into_iter().map(|s| s.range).collect();
    assert_eq!(
        ranges,
        [None, None],
        "bad bytes must be fetched again from zero"
    );

    let cache = temp_dir("corrupt-always");
    hub.corrupt("Tiny-Q8_0.gguf", 10);
    let err = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:Q8_0", &cache)).unwrap_err();
    match &err {
        HubError::Checksum {
            expected, actual, ..
        } => {
            assert_eq!(expected, &sha256_hex(&want));
            assert_ne!(actual, expected);
        }
        other => panic!("expected a checksum refusal, got {other}"),
    }
    let root = cache.join("models--owner--Tiny-GGUF");
    let blobs: Vec<_> = std::fs::read_dir(root.join("blobs")).unwrap().collect();
    assert!(blobs.is_empty(), "refused bytes stayed in the cache");
    assert!(!root
        .join("snapshots")
        .join(COMMIT)
        .join("Tiny-Q8_0.gguf")
        .exists());
}

#[test]
fn gated_repos_need_the_token() {
    let mut repo = gguf_repo("owner/Gated-GGUF");
    repo.token = Some(TOKEN.to_string());
    let hub = LocalHub::start(vec![repo]);
    let cache = temp_dir("gated");

    let mut req = request(&hub.url, "owner/Gated-GGUF:Q8_0", &cache);
    let err = hub::resolve_model(&req).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::Unauthorized {
                status: 401,
                token_sent: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");

    req.token = Some(format!("hf_{}", "z".repeat(40)));
    let err = hub::resolve_model(&req).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::Unauthorized {
                token_sent: true,
                ..
            }
        ),
        "{err}"
    );

    req.token = Some(TOKEN.to_string());
    let got = hub::resolve_model(&req).unwrap();
    assert_eq!(got.model.len(), 1);
    let resolves: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.target.contains("/resolve/"))
        .collect();
    assert!(!resolves.is_empty());
    assert!(resolves
        .iter()
        .all(|s| s.auth.as_deref() == Some(&format!("Bearer {TOKEN}"))));
}

#[test]
fn hub_errors_name_what_failed() {
    let preset = HubRepo {
        id: "owner/Preset".to_string(),
        commit: COMMIT.to_string(),
        files: vec![
            HubFile::new("preset.ini", b"[model]\n".to_vec()),
            HubFile::new("m-Q8_0.gguf", bytes(1, 10)),
        ],
        token: None,
    };
    let hub = LocalHub::start(vec![gguf_repo("owner/Tiny-GGUF"), preset]);
    let cache = temp_dir("errors");

    let err = hub::resolve_model(&request(&hub.url, "owner/Preset", &cache)).unwrap_err();
    assert!(matches!(err, HubError::PresetRepo { .. }), "{err}");

    let err = hub::resolve_model(&request(&hub.url, "owner/Missing-GGUF", &cache)).unwrap_err();
    assert!(matches!(err, HubError::Status { status: 404, .. }), "{err}");
    assert!(err.to_string().contains("Repository not found"), "{err}");

    let err = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:IQ1_S", &cache)).unwrap_err();
    assert!(matches!(err, HubError::NoMatch { .. }), "{err}");
    assert!(
        err.to_string().contains("Tiny-Q8_0.gguf"),
        "the choices are listed: {err}"
    );

    let mut req = request(&hub.url, "owner/Tiny-GGUF", &cache);
    req.file = Some("nope.gguf".to_string());
    let err = hub::resolve_model(&req).unwrap_err();
    assert!(matches!(err, HubError::FileNotInRepo { .. }), "{err}");

    let err = hub::resolve_model(&request(&hub.url, "no-slash:Q4_0", &cache)).unwrap_err();
    assert!(matches!(err, HubError::InvalidRepo { .. }), "{err}");

    // A server error on the listing with nothing cached fails by name...
    hub.fail("/refs", 1, 500);
    let err = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:Q8_0", &cache)).unwrap_err();
    assert!(matches!(err, HubError::Status { status: 500, .. }), "{err}");

    // ...and one on a transfer is retried.
    hub.fail("/resolve/", 1, 500);
    let got = hub::resolve_model(&request(&hub.url, "owner/Tiny-GGUF:Q8_0", &cache)).unwrap();
    assert_eq!(
        read(&got.model[0]),
        data_of(&gguf_repo("x/y"), "Tiny-Q8_0.gguf")
    );
}

#[test]
fn model_urls_download_split_parts_and_keep_their_etag() {
    let hub = LocalHub::start(vec![gguf_repo("owner/Tiny-GGUF")]);
    let dir = temp_dir("url");
    let req = UrlRequest {
        url: format!(
            "{}owner/Tiny-GGUF/resolve/main/Q4_K_M/Tiny-Q4_K_M-00001-of-00003.gguf",
            hub.url
        ),
        path: None,
        token: None,
        offline: false,
        cache_dir: dir.to_path_buf(),
        progress: Progress::Quiet,
    };
    let got = hub::download_url(&req).unwrap();
    let repo = gguf_repo("owner/Tiny-GGUF");
    assert_eq!(got.len(), 3);
    for (i, path) in got.iter().enumerate() {
        let name = format!("Tiny-Q4_K_M-0000{}-of-00003.gguf", i + 1);
        assert_eq!(path, &dir.join(&name));
        assert_eq!(read(path), data_of(&repo, &format!("Q4_K_M/{name}")));
        let etag = std::fs::read_to_string(dir.join(format!("{name}.etag"))).unwrap();
        assert_eq!(etag, format!("\"{}\"", sha256_hex(&read(path))));
    }
    let before = hub.transfers().len();
    assert_eq!(hub::download_url(&req).unwrap(), got);
    assert_eq!(hub.transfers().len(), before, "same ETag: nothing fetched");

    // A stale ETag means the file changed on the server: fetched again.
    std::fs::write(dir.join("Tiny-Q4_K_M-00002-of-00003.gguf.etag"), "\"old\"").unwrap();
    assert_eq!(hub::download_url(&req).unwrap(), got);
    assert_eq!(hub.transfers().len(), before + 1);

    let offline = UrlRequest {
        url: format!("{}owner/Tiny-GGUF/resolve/main/Tiny-F16.gguf", hub.url),
        offline: true,
        ..req
    };
    assert!(matches!(
        hub::download_url(&offline),
        Err(HubError::NotCached { .. })
    ));
}

#[test]
fn files_sharing_a_blob_fetch_it_once() {
    let same = bytes(7, 3000);
    let repo = HubRepo {
        id: "owner/Dup-GGUF".to_string(),
        commit: COMMIT.to_string(),
        files: vec![
            HubFile::new("Dup-Q2_K-00001-of-00002.gguf", same.clone()),
            HubFile::new("Dup-Q2_K-00002-of-00002.gguf", same.clone()),
        ],
        token: None,
    };
    let hub = LocalHub::start(vec![repo]);
    let cache = temp_dir("dup");
    let got = hub::resolve_model(&request(&hub.url, "owner/Dup-GGUF:Q2_K", &cache)).unwrap();
    assert_eq!(got.model.len(), 2);
    for path in &got.model {
        assert_eq!(read(path), same);
    }
    assert_eq!(hub.transfers().len(), 1);
}
