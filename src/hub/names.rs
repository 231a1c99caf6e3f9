//! What a `-hf owner/repo[:quant]` request means in terms of the repo's file names: the quant tag of a
//! GGUF file, its split numbering, and which file a tag picks. The rules are llama-server's, so the
//! same request picks the same file in both programs.

use super::HubError;
use regex::{Regex, RegexBuilder};
use std::sync::OnceLock;

/// `owner/name` and the optional `:quant` tag of a `-hf` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoTag {
    pub repo: String,
    pub tag: String,
}

/// Splits `owner/name[:quant]`. As upstream, the tag is the text after the last `:` and the repo
/// the text before the first one; the repo must have exactly one `/`.
pub fn split_repo_tag(value: &str) -> Result<RepoTag, HubError> {
    let mut parts = value.split(':');
    let repo = parts.next().unwrap_or_default().to_string();
    let tag = if value.contains(':') {
        value.rsplit(':').next().unwrap_or_default().to_string()
    } else {
        String::new()
    };
    if repo.split('/').count() != 2 {
        return Err(HubError::InvalidRepo {
            value: value.to_string(),
        });
    }
    Ok(RepoTag { repo, tag })
}

/// The hub's own rule for repo ids: `[A-Za-z0-9_]` runs joined by single `/`, `.` or `-`, exactly
/// one `/`, at most 256 bytes. Upstream skips cache folders and requests that break it.
pub fn is_valid_repo_id(repo: &str) -> bool {
    if repo.is_empty() || repo.len() > 256 {
        return false;
    }
    let mut slashes = 0;
    let mut after_special = true;
    for c in repo.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            after_special = false;
        } else if matches!(c, '/' | '.' | '-') {
            if after_special {
                return false;
            }
            slashes += usize::from(c == '/');
            after_special = true;
        } else {
            return false;
        }
    }
    !after_special && slashes == 1
}

/// How a `.gguf` path is numbered: `prefix` is the path without `.gguf` and without the
/// `-0000i-of-0000n` part (directories included), `tag` the upper-cased quant name at its end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SplitInfo {
    pub prefix: String,
    pub tag: String,
    pub index: u32,
    pub count: u32,
}

fn split_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        RegexBuilder::new(r"^(.+)-([0-9]{5})-of-([0-9]{5})$")
            .case_insensitive(true)
            .build()
            .expect("split pattern is a valid regex")
    })
}

fn tag_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        RegexBuilder::new(r"[-.]([A-Z0-9_]+)$")
            .case_insensitive(true)
            .build()
            .expect("tag pattern is a valid regex")
    })
}

/// Split numbering and quant tag of `path`; `None` when it does not end in `.gguf`.
pub fn split_info(path: &str) -> Option<SplitInfo> {
    let mut prefix = path.strip_suffix(".gguf")?.to_string();
    let (mut index, mut count) = (1, 1);
    if let Some(m) = split_re().captures(&prefix) {
        // Five ASCII digits always fit a u32.
        index = m[2].parse().unwrap_or(1);
        count = m[3].parse().unwrap_or(1);
        prefix = m[1].to_string();
    }
    let tag = tag_re()
        .captures(&prefix)
        .map(|m| m[1].to_ascii_uppercase())
        .unwrap_or_default();
    Some(SplitInfo {
        prefix,
        tag,
        index,
        count,
    })
}

/// The number in a quant tag: `Q4_K_M` -> 4, `F16` -> 16, `NVFP4` -> 4; 0 without one.
fn tag_bits(tag: &str) -> i64 {
    let digits: String = tag
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap_or(0)
}

/// Sidecar files that sit beside a model in the same repo and are never the model itself.
const SIDECAR_MARKERS: [&str; 6] = ["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"];

/// Whether a repo path is a model GGUF rather than a projector, imatrix or speculative sidecar.
/// As upstream, only the file name (not its folder) is looked at.
pub fn is_model_file(path: &str) -> bool {
    if !path.ends_with(".gguf") {
        return false;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    !SIDECAR_MARKERS.iter().any(|m| name.contains(m))
}

/// Whether a cached file counts as a model in `--cache-list`: a first (or only) part with a tag,
/// and no sidecar marker in its prefix (imatrix files are listed, as upstream does).
pub fn is_listed_model(info: &SplitInfo) -> bool {
    info.index == 1
        && !info.tag.is_empty()
        && !["mmproj", "mtp-", "eagle3-", "dflash-", "dspark-"]
            .iter()
            .any(|m| info.prefix.contains(m))
}

fn is_first_part(path: &str) -> bool {
    split_info(path).is_none_or(|s| s.count <= 1 || s.index == 1)
}

/// The model file a tag picks among `paths` (repo order): the first model GGUF whose path contains
/// the tag followed by `.` or `-`, case-insensitively, wherever it sits (so `Q4_K_XL` finds
/// `UD-Q4_K_XL` files and files in a `Q4_K_XL/` folder). Without a tag, `Q4_K_M`, then `Q8_0`,
/// then the first model GGUF. Later split parts never start a model.
pub fn best_model<'a>(paths: &[&'a str], tag: &str) -> Option<&'a str> {
    let tags: Vec<&str> = if tag.is_empty() {
        vec!["Q4_K_M", "Q8_0"]
    } else {
        vec![tag]
    };
    for t in tags {
        // The tag is matched as literal text; upstream builds a regex from it, which agrees for
        // every real quant name (letters, digits, `_`, `-`).
        let pattern = RegexBuilder::new(&format!("{}[.-]", regex::escape(t)))
            .case_insensitive(true)
            .build()
            .ok()?;
        let found = paths
            .iter()
            .find(|p| is_model_file(p) && pattern.is_match(p) && is_first_part(p));
        if let Some(p) = found {
            return Some(p);
        }
    }
    if tag.is_empty() {
        return paths
            .iter()
            .find(|p| is_model_file(p) && is_first_part(p))
            .copied();
    }
    None
}

/// All parts of the split model that `first` starts, first part first; just `first` when it is
/// not split. Parts belong together when prefix (folder included) and part count agree.
pub fn split_parts<'a>(paths: &[&'a str], first: &'a str) -> Vec<&'a str> {
    let Some(info) = split_info(first).filter(|s| s.count > 1) else {
        return vec![first];
    };
    let mut parts: Vec<(u32, &str)> = paths
        .iter()
        .filter_map(|p| {
            let s = split_info(p)?;
            (s.count == info.count && s.prefix == info.prefix).then_some((s.index, *p))
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, p)| p).collect()
}

/// The projector (`keyword` = "mmproj") or other sidecar that best fits `model`: it must sit in the
/// model's folder or one above it; deeper shared folders win, then an exact `-TAG.` in the name
/// (when a tag was asked for), then the quant width closest to the tag's (or the model's).
pub fn best_sibling<'a>(
    paths: &[&'a str],
    model: &str,
    keyword: &str,
    tag: &str,
) -> Option<&'a str> {
    let tag_upper = tag.to_ascii_uppercase();
    let model_bits = if tag_upper.is_empty() {
        split_info(model).map_or(0, |s| tag_bits(&s.tag))
    } else {
        tag_bits(&tag_upper)
    };
    let model_dirs: Vec<&str> = model.split('/').collect();
    let model_dirs = &model_dirs[..model_dirs.len() - 1];

    let mut best: Option<(&str, usize, bool, i64)> = None;
    for path in paths {
        if !path.ends_with(".gguf") || !path.contains(keyword) {
            continue;
        }
        let dirs: Vec<&str> = path.split('/').collect();
        let dirs = &dirs[..dirs.len() - 1];
        let shared = model_dirs
            .iter()
            .zip(dirs)
            .take_while(|(a, b)| a == b)
            .count();
        if shared != dirs.len() {
            continue;
        }
        let bits = split_info(path).map_or(0, |s| tag_bits(&s.tag));
        let diff = (bits - model_bits).abs();
        let exact = !tag_upper.is_empty()
            && path
                .to_ascii_uppercase()
                .contains(&format!("-{tag_upper}."));
        let better = match best {
            None => true,
            Some((_, d, e, df)) => {
                shared > d
                    || (shared == d && exact && !e)
                    || (shared == d && exact == e && diff < df)
            }
        };
        if better {
            best = Some((path, shared, exact, diff));
        }
    }
    best.map(|(p, ..)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_and_tag_split_like_upstream() {
        let rt = split_repo_tag("ggml-org/gemma-3-270m-GGUF:q4_k_m").unwrap();
        assert_eq!(
            (rt.repo.as_str(), rt.tag.as_str()),
            ("ggml-org/gemma-3-270m-GGUF", "q4_k_m")
        );
        assert_eq!(split_repo_tag("a/b").unwrap().tag, "");
        assert_eq!(split_repo_tag("a/b:x:Y").unwrap().tag, "Y");
        assert!(matches!(
            split_repo_tag("justname"),
            Err(HubError::InvalidRepo { .. })
        ));
        assert!(split_repo_tag("a/b/c:Q4_0").is_err());
    }

    #[test]
    fn repo_ids_follow_the_hub_rule() {
        assert!(is_valid_repo_id("unsloth/Qwen3-30B-A3B-GGUF"));
        assert!(is_valid_repo_id("a_b/c.d"));
        for bad in [
            "", "a", "a//b", "/a", "a/b/", "a/b/c", "a/-b", "a b/c", "a/b..c",
        ] {
            assert!(!is_valid_repo_id(bad), "{bad}");
        }
    }

    #[test]
    fn split_info_reads_parts_and_tags() {
        let s = split_info("Q4_K_M/Model-UD-Q4_K_M-00002-of-00003.gguf").unwrap();
        assert_eq!(s.prefix, "Q4_K_M/Model-UD-Q4_K_M");
        assert_eq!((s.tag.as_str(), s.index, s.count), ("Q4_K_M", 2, 3));
        let s = split_info("gemma-3-270m-it-q8_0.gguf").unwrap();
        assert_eq!((s.tag.as_str(), s.index, s.count), ("Q8_0", 1, 1));
        assert_eq!(split_info("README.md"), None);
        assert_eq!(tag_bits("NVFP4"), 4);
        assert_eq!(tag_bits("BF16"), 16);
        assert_eq!(tag_bits("MODEL"), 0);
    }

    const REPO: [&str; 9] = [
        "README.md",
        "Model-Q8_0.gguf",
        "Model-UD-Q4_K_XL.gguf",
        "Model-f16.gguf",
        "Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf",
        "Q4_K_M/Model-Q4_K_M-00002-of-00002.gguf",
        "mmproj-Model-f16.gguf",
        "mmproj-Model-Q8_0.gguf",
        "imatrix_unsloth.gguf",
    ];

    #[test]
    fn tags_pick_files_like_upstream() {
        assert_eq!(best_model(&REPO, "q4_k_xl"), Some("Model-UD-Q4_K_XL.gguf"));
        assert_eq!(best_model(&REPO, "F16"), Some("Model-f16.gguf"));
        assert_eq!(
            best_model(&REPO, "Q4_K_M"),
            Some("Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf")
        );
        // No tag: Q4_K_M is preferred over the first file.
        assert_eq!(best_model(&REPO, ""), best_model(&REPO, "Q4_K_M"));
        assert_eq!(best_model(&REPO, "IQ1_S"), None);
        assert_eq!(
            best_model(&["x-Q2_K.gguf", "imatrix.gguf"], ""),
            Some("x-Q2_K.gguf")
        );
        assert_eq!(best_model(&["mmproj-F16.gguf"], ""), None);
    }

    /// Repo shapes and picks from upstream's own resolution tests (tests/test-model-resolution.cpp):
    /// (listing, tag, model parts, projector).
    #[test]
    fn upstream_resolution_cases() {
        let flat = [
            "README.md",
            "model-BF16.gguf",
            "model-Q4_K_M.gguf",
            "model-Q8_0.gguf",
            "mmproj-model-BF16.gguf",
            "mmproj-model-Q8_0.gguf",
            "mtp-model-BF16.gguf",
            "mtp-model-Q4_0.gguf",
            "mtp-model-Q8_0.gguf",
            "dflash-model-BF16.gguf",
            "dflash-model-Q8_0.gguf",
        ];
        let subdir = [
            "mmproj-model-f16.gguf",
            "model-mtp-BF16.gguf",
            "model-mtp-Q8_0.gguf",
            "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf",
            "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
            "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf",
            "Q8_0/model-Q8_0-00001-of-00002.gguf",
            "Q8_0/model-Q8_0-00002-of-00002.gguf",
        ];
        let hole = [
            "model-BF16.gguf",
            "model-Q4_K_M.gguf",
            "model-Q8_0.gguf",
            "mtp-model-Q4_0.gguf",
        ];
        let unsloth = [
            "model-UD-Q8_K_XL.gguf",
            "mmproj-BF16.gguf",
            "model-MTP-BF16.gguf",
        ];
        let vendors = [
            "TheDrummer_Model-24B-v4.1-Q8_0.gguf",
            "BlackSheep-24B.Q8_0.gguf",
        ];
        let spark = [
            "README.md",
            "model-MXFP4.gguf",
            "dspark-model-BF16.gguf",
            "dspark-model-MXFP4.gguf",
        ];
        type Case<'a> = (&'a [&'a str], &'a str, &'a [&'a str], Option<&'a str>);
        let cases: [Case; 8] = [
            (
                &flat,
                "Q8_0",
                &["model-Q8_0.gguf"],
                Some("mmproj-model-Q8_0.gguf"),
            ),
            // Q4_K_M is 4 bits wide: the Q8_0 projector is nearer than BF16.
            (
                &flat,
                "",
                &["model-Q4_K_M.gguf"],
                Some("mmproj-model-Q8_0.gguf"),
            ),
            (
                &unsloth,
                "",
                &["model-UD-Q8_K_XL.gguf"],
                Some("mmproj-BF16.gguf"),
            ),
            (
                &subdir,
                "Q3_K_M",
                &[
                    "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf",
                    "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
                    "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf",
                ],
                Some("mmproj-model-f16.gguf"),
            ),
            (&hole, "Q4_0", &[], None),
            (
                &unsloth,
                "Q8_K_XL",
                &["model-UD-Q8_K_XL.gguf"],
                Some("mmproj-BF16.gguf"),
            ),
            (
                &vendors,
                "Q8_0",
                &["TheDrummer_Model-24B-v4.1-Q8_0.gguf"],
                None,
            ),
            (&spark, "", &["model-MXFP4.gguf"], None),
        ];
        for (files, tag, parts, mmproj) in cases {
            let primary = best_model(files, tag);
            let got: Vec<&str> = primary.map_or_else(Vec::new, |p| split_parts(files, p));
            assert_eq!(got, parts, "{tag} in {files:?}");
            let projector = primary.and_then(|p| best_sibling(files, p, "mmproj", ""));
            assert_eq!(projector, mmproj, "{tag} in {files:?}");
        }
    }

    #[test]
    fn split_parts_come_first_first() {
        let shuffled = [
            "d/M-Q2_K-00003-of-00003.gguf",
            "d/M-Q2_K-00001-of-00003.gguf",
            "other/M-Q2_K-00002-of-00003.gguf",
            "d/M-Q2_K-00002-of-00003.gguf",
        ];
        assert_eq!(
            split_parts(&shuffled, "d/M-Q2_K-00001-of-00003.gguf"),
            [shuffled[1], shuffled[3], shuffled[0]]
        );
        assert_eq!(split_parts(&REPO, "Model-f16.gguf"), ["Model-f16.gguf"]);
    }

    #[test]
    fn projector_is_the_nearest_in_folder_and_width() {
        assert_eq!(
            best_sibling(&REPO, "Model-Q8_0.gguf", "mmproj", ""),
            Some("mmproj-Model-Q8_0.gguf")
        );
        assert_eq!(
            best_sibling(&REPO, "Model-f16.gguf", "mmproj", ""),
            Some("mmproj-Model-f16.gguf")
        );
        let nested = [
            "mmproj-F16.gguf",
            "sub/mmproj-F32.gguf",
            "other/mmproj-F16.gguf",
        ];
        assert_eq!(
            best_sibling(&nested, "sub/m-F16.gguf", "mmproj", ""),
            Some(nested[1])
        );
        assert_eq!(
            best_sibling(&nested, "m-F16.gguf", "mmproj", ""),
            Some(nested[0])
        );
        assert_eq!(best_sibling(&REPO, "Model-f16.gguf", "nothing", ""), None);
    }
}
