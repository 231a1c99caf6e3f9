//! The GGUF reader against the `gguf` package: the Gemma 3 270M model and every upstream
//! vocabulary GGUF open, and their metadata (types and values) and tensor inventories match what
//! gguf-py reports. Hyper-parameters and overrides read from the real model.

mod model_common;

use std::path::{Path, PathBuf};

use bloomery::model::{GgufFile, Hparams, KvOverride, MetaValue, Metadata};
use model_common::{cache_dir, gguf_py, oracle};
use serde_json::Value;

fn gemma() -> Result<PathBuf, String> {
    let p = cache_dir()?.join("models/gemma-3-270m-q4_k_m.gguf");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} is missing (scripts/fetch-test-data.sh fetches it)",
            p.display()
        ))
    }
}

/// gguf-py's name for a metadata value's type.
fn type_name(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::U8(_) => "UINT8",
        MetaValue::I8(_) => "INT8",
        MetaValue::U16(_) => "UINT16",
        MetaValue::I16(_) => "INT16",
        MetaValue::U32(_) => "UINT32",
        MetaValue::I32(_) => "INT32",
        MetaValue::F32(_) => "FLOAT32",
        MetaValue::Bool(_) => "BOOL",
        MetaValue::String(_) => "STRING",
        MetaValue::Array(..) => "ARRAY",
        MetaValue::U64(_) => "UINT64",
        MetaValue::I64(_) => "INT64",
        MetaValue::F64(_) => "FLOAT64",
    }
}

/// Compares one value with the oracle's JSON (floats arrive as Python's exact repr).
fn same_value(ours: &MetaValue, theirs: &Value) -> bool {
    match ours {
        MetaValue::Array(_, items) => theirs.as_array().is_some_and(|t| {
            t.len() == items.len() && items.iter().zip(t).all(|(a, b)| same_value(a, b))
        }),
        MetaValue::String(s) => theirs.as_str() == Some(s),
        MetaValue::Bool(b) => theirs.as_bool() == Some(*b),
        MetaValue::F32(_) | MetaValue::F64(_) => theirs
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .zip(ours.as_f64())
            .is_some_and(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
        MetaValue::U64(v) => theirs.as_u64() == Some(*v),
        _ => theirs.as_i64() == ours.as_i64(),
    }
}

/// gguf-py's inventory of `path`. GGUFReader takes seconds of CPU per vocabulary, so answers are
/// kept under $BLOOMERY_CACHE/oracle, keyed by the file's and the oracle script's size and mtime.
fn gguf_py_inventory(gguf_py: &Path, path: &Path) -> Value {
    let stamp = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        let t = m
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        format!("{}-{}", m.len(), t.as_secs())
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gguf_oracle.py");
    let key = format!(
        "inventory-{}-{}-{}.json",
        path.file_name().unwrap().to_string_lossy(),
        stamp(path),
        stamp(&script)
    );
    let cached = cache_dir().unwrap().join("oracle").join(key);
    let bytes = match std::fs::read(&cached) {
        Ok(b) => b,
        Err(_) => {
            let b = oracle(gguf_py, &["inventory", path.to_str().unwrap()]);
            std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
            std::fs::write(&cached, &b).unwrap();
            b
        }
    };
    serde_json::from_slice(&bytes).unwrap()
}

fn check_inventory(gguf_py: &Path, path: &Path) {
    let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{e}"));
    let want = gguf_py_inventory(gguf_py, path);
    let name = path.display();
    assert_eq!(Some(f.version as u64), want["version"].as_u64(), "{name}");
    let meta = want["metadata"].as_object().unwrap();
    let keys: Vec<&String> = f.metadata.keys().collect();
    let mut want_keys: Vec<&String> = meta.keys().collect();
    want_keys.sort();
    assert_eq!(keys, want_keys, "{name}: metadata keys");
    for (key, v) in &f.metadata {
        let w = &meta[key];
        assert_eq!(Some(type_name(v)), w["type"].as_str(), "{name}: {key} type");
        if let MetaValue::Array(elem, items) = v {
            let elem_name = items.first().map(type_name).unwrap_or("");
            if !items.is_empty() {
                assert_eq!(
                    Some(elem_name),
                    w["elem"].as_str(),
                    "{name}: {key} ({elem:?})"
                );
            }
        }
        assert!(same_value(v, &w["value"]), "{name}: {key} = {v:?}");
    }
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(f.tensors.len(), tensors.len(), "{name}: tensor count");
    for (t, w) in f.tensors.iter().zip(tensors) {
        assert_eq!(Some(t.name.as_str()), w["name"].as_str(), "{name}");
        let tn = &t.name;
        assert_eq!(
            Some(t.ggml_type.name().to_uppercase().as_str()),
            w["type"].as_str(),
            "{name}: {tn} type"
        );
        let shape: Vec<u64> = w["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.shape, shape, "{name}: {tn} shape");
        assert_eq!(Some(t.offset), w["offset"].as_u64(), "{name}: {tn} offset");
        assert_eq!(Some(t.size), w["size"].as_u64(), "{name}: {tn} size");
    }
}

#[test]
fn gemma_inventory_matches_gguf_py() {
    let gguf_py = or_skip!(gguf_py());
    check_inventory(&gguf_py, &or_skip!(gemma()));
}

#[test]
fn every_vocab_gguf_matches_gguf_py() {
    let gguf_py = or_skip!(gguf_py());
    let models = gguf_py.parent().unwrap().join("models");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("ggml-vocab-") && n.ends_with(".gguf")
        })
        .collect();
    files.sort();
    assert!(files.len() >= 10, "only {} vocab files", files.len());
    for p in &files {
        check_inventory(&gguf_py, p);
    }
}

#[test]
fn gemma_hparams_and_overrides() {
    let f = GgufFile::open(&or_skip!(gemma())).unwrap();
    let h = Hparams::read(&Metadata::new(&f, &[])).unwrap();
    assert_eq!(h.arch, "gemma3");
    assert_eq!((h.n_layer, h.n_embd, h.n_ctx_train), (18, 640, 32768));
    assert_eq!(h.n_head, vec![4; 18]);
    assert_eq!(h.n_head_kv, vec![1; 18]);
    assert_eq!(h.n_ff, vec![2048; 18]);
    assert_eq!(
        (h.n_embd_head_k, h.n_embd_head_v, h.rope.n_rot),
        (256, 256, 256)
    );
    assert_eq!(h.rope.freq_base, 1_000_000.0);
    assert_eq!(h.rms_eps, Some(f32::from_bits(0x358637bd)));
    assert_eq!(h.sliding_window, Some(512));
    assert_eq!(h.n_vocab, 262144);
    assert!(h.moe.is_none());

    let overrides = [
        KvOverride::parse("gemma3.context_length=int:4096").unwrap(),
        KvOverride::parse("gemma3.rope.freq_base=float:5e5").unwrap(),
        // A wrong type is ignored, as upstream ignores it (with a warning).
        KvOverride::parse("gemma3.block_count=str:7").unwrap(),
        KvOverride::parse("gemma3.expert_count=int:8").unwrap(),
    ];
    let meta = Metadata::new(&f, &overrides);
    let e = Hparams::read(&meta).unwrap_err();
    assert!(
        e.to_string().contains("gemma3.expert_used_count"),
        "an expert count without a used count is refused by name: {e}"
    );
    assert_eq!(meta.u32("gemma3.context_length").unwrap(), Some(4096));
    assert_eq!(meta.f32("gemma3.rope.freq_base").unwrap(), Some(5e5));
    assert_eq!(meta.u32("gemma3.block_count").unwrap(), Some(18));
    let meta = Metadata::new(&f, &overrides[..2]);
    let h = Hparams::read(&meta).unwrap();
    assert_eq!((h.n_ctx_train, h.rope.freq_base), (4096, 5e5));
}
