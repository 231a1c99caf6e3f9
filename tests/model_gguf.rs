//! The GGUF reader against the `gguf` package: the Gemma 3 270M model and every upstream
//! vocabulary GGUF open, and their metadata (types and values) and tensor inventories match what
//! gguf-py reports. Hyper-parameters and overrides read from the real model.

mod model_common;

use std::path::{Path, PathBuf};

use bloomery::model::hparams::served_architecture;
use bloomery::model::writer::GgufWriter;
use bloomery::model::{GgmlType, GgufFile, Hparams, KvOverride, MetaValue, Metadata, ModelError};
use model_common::{cache_dir, cached, gguf_py, oracle};
use serde_json::Value;

fn gemma() -> Result<PathBuf, String> {
    cached("models/gemma-3-270m-q4_k_m.gguf")
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
    let huge = [KvOverride::parse("gemma3.block_count=int:100000").unwrap()];
    let e = Hparams::read(&Metadata::new(&f, &huge)).unwrap_err();
    assert!(e.to_string().contains("gemma3.block_count"), "{e}");
    let meta = Metadata::new(&f, &overrides[..2]);
    let h = Hparams::read(&meta).unwrap();
    assert_eq!((h.n_ctx_train, h.rope.freq_base), (4096, 5e5));
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bloomery-gguf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `dir/m-0000i-of-0000n.gguf` parts, part i holding tensor `t{i}` filled with byte i.
fn write_split(dir: &Path, n: u16) -> PathBuf {
    for i in 0..n {
        let mut w = GgufWriter::new();
        w.set("general.architecture", MetaValue::String("llama".into()));
        w.set("split.no", MetaValue::U16(i));
        w.set("split.count", MetaValue::U16(n));
        w.set("split.tensors.count", MetaValue::I32(n as i32));
        w.add_tensor(&format!("t{i}"), GgmlType::Q8_0, &[32, 2])
            .unwrap();
        let p = dir.join(format!("m-{:05}-of-{:05}.gguf", i + 1, n));
        w.write(&p, |t| Ok(vec![i as u8; t.size() as usize]))
            .unwrap();
    }
    dir.join(format!("m-00001-of-{n:05}.gguf"))
}

#[test]
fn split_models_join_all_parts_and_refuse_a_missing_one() {
    let dir = temp_dir("split");
    let first = write_split(&dir, 3);
    let f = GgufFile::open(&first).unwrap();
    assert_eq!(f.paths.len(), 3);
    for i in 0..3u8 {
        let t = f.tensor(&format!("t{i}")).unwrap();
        assert_eq!(t.file_index, i as usize);
        assert!(f.tensor_data(t).iter().all(|&b| b == i));
    }
    std::fs::remove_file(dir.join("m-00003-of-00003.gguf")).unwrap();
    let e = GgufFile::open(&first).err().unwrap();
    assert!(
        matches!(e, ModelError::BadSplit { .. }) && e.to_string().contains("m-00003-of-00003"),
        "{e}"
    );
    let renamed = dir.join("renamed.gguf");
    std::fs::copy(&first, &renamed).unwrap();
    let e = GgufFile::open(&renamed).err().unwrap();
    assert!(matches!(e, ModelError::BadSplit { .. }), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A one-tensor file (Q4_0, 64 elements) and the offset of its first dimension in the header.
fn one_tensor_file(arch: &str) -> (Vec<u8>, usize) {
    let dir = temp_dir("one");
    let p = dir.join(format!("{arch}.gguf"));
    let mut w = GgufWriter::new();
    w.set("general.architecture", MetaValue::String(arch.into()));
    w.add_tensor("w", GgmlType::Q4_0, &[64]).unwrap();
    w.write(&p, |t| Ok(vec![1; t.size() as usize])).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    // Tensor record: name length (8) + "w" + n_dims (4), then the dimension.
    let at = bytes
        .windows(9)
        .position(|x| x == b"\x01\0\0\0\0\0\0\0w")
        .unwrap()
        + 9
        + 4;
    (bytes, at)
}

#[test]
fn refuses_damaged_files_by_name() {
    let refuse = |bytes: Vec<u8>| {
        GgufFile::from_bytes(Path::new("x.gguf"), bytes)
            .err()
            .unwrap()
    };
    let (good, dim_at) = one_tensor_file("llama");
    assert!(GgufFile::from_bytes(Path::new("x.gguf"), good.clone()).is_ok());

    let mut bad = good.clone();
    bad[dim_at..dim_at + 8].copy_from_slice(&48u64.to_le_bytes());
    let e = refuse(bad);
    assert!(
        e.to_string()
            .contains("not a multiple of q4_0's block size 32"),
        "{e}"
    );

    // The 36 data bytes (two blocks) are followed by 28 bytes of padding.
    let e = refuse(good[..good.len() - 29].to_vec());
    assert!(e.to_string().contains("lies outside the file"), "{e}");

    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GGML");
    assert!(matches!(refuse(bad), ModelError::BadMagic { .. }));

    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&4u32.to_le_bytes());
    assert!(matches!(
        refuse(bad),
        ModelError::UnsupportedVersion { version: 4, .. }
    ));

    let mut bad = good.clone();
    bad[dim_at + 8..dim_at + 12].copy_from_slice(&4u32.to_le_bytes());
    let e = refuse(bad);
    assert!(e.to_string().contains("unknown ggml type 4"), "{e}");

    // A scalar (no dimensions) of a block type: found by the fuzzer, once a panic.
    let mut bad = good.clone();
    bad[dim_at - 4..dim_at].copy_from_slice(&0u32.to_le_bytes());
    bad.drain(dim_at..dim_at + 8);
    let e = refuse(bad);
    assert!(
        e.to_string().contains("row length 1 is not a multiple"),
        "{e}"
    );

    for cut in 0..good.len() - 28 {
        assert!(GgufFile::from_bytes(Path::new("x.gguf"), good[..cut].to_vec()).is_err());
    }
}

#[test]
fn refuses_an_architecture_not_served() {
    let (bytes, _) = one_tensor_file("bert");
    let f = GgufFile::from_bytes(Path::new("bert.gguf"), bytes).unwrap();
    let e = served_architecture(&Metadata::new(&f, &[])).unwrap_err();
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { ref arch, .. } if arch == "bert"),
        "{e}"
    );
    let (bytes, _) = one_tensor_file("qwen3moe");
    let f = GgufFile::from_bytes(Path::new("q.gguf"), bytes).unwrap();
    assert_eq!(
        served_architecture(&Metadata::new(&f, &[])).unwrap(),
        "qwen3moe"
    );
}
