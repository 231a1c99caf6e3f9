//! Checkpoint folders: safetensors shards found from the index, read in their own formats (BF16,
//! FP8 E4M3 with block scales, ModelOpt NVFP4), refusals by name.

mod model_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use bloomery::model::safetensors::{fp8_e4m3_to_f32, Checkpoint, CheckpointQuant, StDtype};
use bloomery::model::ModelError;
use serde_json::json;

/// (name, dtype, shape, bytes)
type Entry<'a> = (&'a str, &'a str, Vec<u64>, Vec<u8>);

fn write_shard(path: &Path, entries: &[Entry]) {
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    for (name, dtype, shape, bytes) in entries {
        let begin = data.len();
        data.extend(bytes);
        header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

fn folder(tag: &str, config: serde_json::Value, shards: &[(&str, Vec<Entry>)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bloomery-ckpt-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut weight_map = serde_json::Map::new();
    for (file, entries) in shards {
        write_shard(&dir.join(file), entries);
        for e in entries {
            weight_map.insert(e.0.to_string(), json!(file));
        }
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    dir
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn fp8_block_scaled_and_bf16_shards() {
    // FP8 codes: 0x38 = 1.0, 0x40 = 2.0, 0xb8 = -1.0, 0x01 = 2^-9.
    let w: Vec<u8> = (0..24).map(|i| [0x38, 0x40, 0xb8, 0x01][i % 4]).collect();
    let dir = folder(
        "fp8",
        json!({"architectures": ["X"], "quantization_config":
            {"quant_method": "fp8", "weight_block_size": [2, 4]}}),
        &[
            (
                "model-00001-of-00002.safetensors",
                vec![("a.weight", "BF16", vec![2], vec![0x80, 0x3f, 0x40, 0xc0])],
            ),
            (
                "model-00002-of-00002.safetensors",
                vec![
                    ("b.weight", "F8_E4M3", vec![4, 6], w.clone()),
                    (
                        "b.weight_scale_inv",
                        "F32",
                        vec![2, 2],
                        f32s(&[1.0, 10.0, 100.0, 1000.0]),
                    ),
                ],
            ),
        ],
    );
    let ck = Checkpoint::open(&dir).unwrap();
    assert_eq!(ck.quant, CheckpointQuant::Fp8Block { block: [2, 4] });
    assert_eq!(ck.shards.len(), 2);
    assert_eq!(ck.tensor("b.weight").unwrap().dtype, StDtype::F8E4M3);
    assert_eq!(ck.tensor("b.weight").unwrap().file_index, 1);
    assert_eq!(ck.dequantize("a.weight").unwrap(), vec![1.0, -3.0]);
    let b = ck.dequantize("b.weight").unwrap();
    for (i, v) in b.iter().enumerate() {
        let (r, c) = (i / 6, i % 6);
        let scale = [1.0, 10.0, 100.0, 1000.0][(r / 2) * 2 + c / 4];
        assert_eq!(*v, fp8_e4m3_to_f32(w[i]) * scale, "element {i}");
    }
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let e = Checkpoint::open(&dir).err().unwrap();
    assert!(e.to_string().contains("missing shard"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn modelopt_nvfp4_weights() {
    // One row of 32 values: codes 0..16 then 16..0 (low nibble first); two E4M3 group scales.
    let codes: Vec<u8> = (0..16).chain((0..16).rev()).collect();
    let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
    let dir = folder(
        "nvfp4",
        json!({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}),
        &[(
            "model-00001-of-00001.safetensors",
            vec![
                ("w.weight", "U8", vec![1, 16], packed),
                ("w.weight_scale", "F8_E4M3", vec![1, 2], vec![0x38, 0x40]),
                ("w.weight_scale_2", "F32", vec![], f32s(&[0.5])),
            ],
        )],
    );
    let ck = Checkpoint::open(&dir).unwrap();
    let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let got = ck.dequantize("w.weight").unwrap();
    assert_eq!(got.len(), 32);
    for (i, &c) in codes.iter().enumerate() {
        let v = e2m1[(c & 7) as usize] * if c & 8 != 0 { -1.0 } else { 1.0 };
        let want = v * [1.0, 2.0][i / 16] * 0.5;
        assert_eq!(got[i], want, "element {i}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn refuses_damaged_shards_by_name() {
    let dir = folder(
        "bad",
        json!({}),
        &[(
            "model-00001-of-00001.safetensors",
            vec![("x", "F32", vec![2], f32s(&[1.0, 2.0]))],
        )],
    );
    let shard = dir.join("model-00001-of-00001.safetensors");
    let good = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &good[..good.len() - 1]).unwrap();
    let e = Checkpoint::open(&dir).err().unwrap();
    assert!(
        matches!(e, ModelError::BadTensor { .. }) && e.to_string().contains("'x'"),
        "{e}"
    );
    for cut in 0..good.len() - 8 {
        std::fs::write(&shard, &good[..cut]).unwrap();
        assert!(Checkpoint::open(&dir).is_err(), "cut at {cut} accepted");
    }
    std::fs::write(
        dir.join("config.json"),
        r#"{"quantization_config": {"quant_method": "awq"}}"#,
    )
    .unwrap();
    let e = Checkpoint::open(&dir).err().unwrap();
    assert!(e.to_string().contains("awq"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fp8_e4m3_matches_ml_dtypes() {
    let probe = Command::new("python3")
        .args(["-c", "import ml_dtypes"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !probe {
        println!("skipped: python3 has no ml_dtypes (pip install ml_dtypes)");
        return;
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, numpy as np, ml_dtypes; sys.stdout.buffer.write(np.arange(256, \
             dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype('<f4').tobytes())",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    for (code, w) in out.stdout.chunks_exact(4).enumerate() {
        let want = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        let got = fp8_e4m3_to_f32(code as u8);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "code {code:#04x}: {got}, ml_dtypes says {want}"
        );
    }
}
