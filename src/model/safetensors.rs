//! Checkpoint folders (`-m FOLDER`): `config.json`, `model.safetensors` or
//! `model.safetensors.index.json` with its shards, memory-mapped and read in their own formats:
//! F32 / F16 / BF16, FP8 E4M3 with block scales (`weight_scale_inv`), and NVFP4 as ModelOpt
//! writes it (packed E2M1 `weight`, E4M3 `weight_scale` per 16 elements, f32 `weight_scale_2`).
//! Every offset in a shard header is checked against the shard before use.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;

use super::error::ModelError;
use super::quants::{bf16_to_f32, f16_to_f32};

/// Element types of safetensors files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    F64,
    F32,
    F16,
    Bf16,
    F8E4M3,
    F8E5M2,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl StDtype {
    fn parse(s: &str) -> Option<StDtype> {
        use StDtype::*;
        Some(match s {
            "F64" => F64,
            "F32" => F32,
            "F16" => F16,
            "BF16" => Bf16,
            "F8_E4M3" => F8E4M3,
            "F8_E5M2" => F8E5M2,
            "I64" => I64,
            "I32" => I32,
            "I16" => I16,
            "I8" => I8,
            "U8" => U8,
            "BOOL" => Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> u64 {
        use StDtype::*;
        match self {
            F64 | I64 => 8,
            F32 | I32 => 4,
            F16 | Bf16 | I16 => 2,
            F8E4M3 | F8E5M2 | I8 | U8 | Bool => 1,
        }
    }
}

/// Where one tensor's bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct StTensor {
    pub name: String,
    pub dtype: StDtype,
    /// Row-major, outermost first (PyTorch order).
    pub shape: Vec<u64>,
    /// Byte offset from the start of the shard file.
    pub offset: u64,
    pub size: u64,
    pub file_index: usize,
}

/// The weight formats a checkpoint's `quantization_config` can declare.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointQuant {
    None,
    /// FP8 E4M3 weights with one scale per block of `[rows, cols]` elements.
    Fp8Block {
        block: [u64; 2],
    },
    /// ModelOpt NVFP4: E2M1 pairs per byte, an E4M3 scale per 16 elements, an f32 global scale.
    Nvfp4,
}

pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: Value,
    pub quant: CheckpointQuant,
    pub tensors: Vec<StTensor>,
    index: BTreeMap<String, usize>,
    maps: Vec<Mmap>,
    pub shards: Vec<PathBuf>,
}

fn io_err(path: &Path, e: impl ToString) -> ModelError {
    ModelError::Io {
        path: path.to_path_buf(),
        error: e.to_string(),
    }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read(path).map_err(|e| io_err(path, e))?;
    serde_json::from_slice(&text).map_err(|e| ModelError::BadMetadata {
        path: path.to_path_buf(),
        key: "(json)".into(),
        reason: e.to_string(),
    })
}

fn quant_of(config: &Value, path: &Path) -> Result<CheckpointQuant, ModelError> {
    let Some(q) = config.get("quantization_config") else {
        return Ok(CheckpointQuant::None);
    };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    let algo = q.get("quant_algo").and_then(Value::as_str).unwrap_or("");
    match (method, algo) {
        ("fp8", _) => {
            let block = q
                .get("weight_block_size")
                .and_then(Value::as_array)
                .and_then(|b| Some([b.first()?.as_u64()?, b.get(1)?.as_u64()?]))
                .filter(|b| b[0] > 0 && b[1] > 0)
                .ok_or_else(|| ModelError::BadMetadata {
                    path: path.to_path_buf(),
                    key: "quantization_config.weight_block_size".into(),
                    reason: format!("expected two positive sizes, found {q}"),
                })?;
            Ok(CheckpointQuant::Fp8Block { block })
        }
        ("modelopt", "NVFP4") => Ok(CheckpointQuant::Nvfp4),
        _ => Err(ModelError::BadMetadata {
            path: path.to_path_buf(),
            key: "quantization_config".into(),
            reason: format!("unsupported quantization '{method}' '{algo}'"),
        }),
    }
}

/// Parses one shard's header and checks every tensor against the shard.
fn shard_tensors(path: &Path, map: &[u8], file_index: usize) -> Result<Vec<StTensor>, ModelError> {
    let truncated = |what: &str| ModelError::Truncated {
        path: path.to_path_buf(),
        what: what.to_string(),
        offset: 0,
    };
    let len = u64::from_le_bytes(
        map.get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| truncated("header length"))?,
    );
    let header_end = 8u64
        .checked_add(len)
        .filter(|&e| e <= map.len() as u64)
        .ok_or_else(|| truncated("header"))?;
    let header: Value = serde_json::from_slice(&map[8..header_end as usize]).map_err(|e| {
        ModelError::BadMetadata {
            path: path.to_path_buf(),
            key: "(header)".into(),
            reason: e.to_string(),
        }
    })?;
    let entries = header.as_object().ok_or_else(|| ModelError::BadMetadata {
        path: path.to_path_buf(),
        key: "(header)".into(),
        reason: "not a JSON object".into(),
    })?;
    let mut out = Vec::new();
    for (name, info) in entries {
        if name == "__metadata__" {
            continue;
        }
        let bad = |reason: String| ModelError::BadTensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            reason,
        };
        let dtype_name = info.get("dtype").and_then(Value::as_str).unwrap_or("");
        let dtype = StDtype::parse(dtype_name)
            .ok_or_else(|| bad(format!("unknown dtype '{dtype_name}'")))?;
        let shape = info
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|s| s.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
            .ok_or_else(|| bad(format!("bad shape {:?}", info.get("shape"))))?;
        let offsets = info
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|o| Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?)))
            .ok_or_else(|| bad(format!("bad data_offsets {:?}", info.get("data_offsets"))))?;
        let n = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        if offsets.1 < offsets.0 || offsets.1 - offsets.0 != n {
            return Err(bad(format!(
                "data_offsets {offsets:?} do not hold {n} bytes of {dtype:?} {shape:?}"
            )));
        }
        let offset = header_end + offsets.0;
        if offset + n > map.len() as u64 {
            return Err(bad(format!(
                "data [{offset}, +{n}) lies outside the file ({} bytes)",
                map.len()
            )));
        }
        out.push(StTensor {
            name: name.clone(),
            dtype,
            shape,
            offset,
            size: n,
            file_index,
        });
    }
    out.sort_by_key(|t| t.offset);
    Ok(out)
}

impl Checkpoint {
    /// Opens a checkpoint folder: `config.json` plus `model.safetensors` or the shards listed by
    /// `model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let config_path = dir.join("config.json");
        let config = read_json(&config_path)?;
        let quant = quant_of(&config, &config_path)?;
        let index_path = dir.join("model.safetensors.index.json");
        let shards: Vec<PathBuf> = if index_path.is_file() {
            let index = read_json(&index_path)?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| ModelError::MissingKey {
                    path: index_path.clone(),
                    key: "weight_map".into(),
                })?;
            let mut files: Vec<&str> = map.values().filter_map(Value::as_str).collect();
            files.sort();
            files.dedup();
            if files.iter().any(|f| f.contains('/') || f.contains("..")) {
                return Err(ModelError::BadSplit {
                    path: index_path,
                    reason: "a shard name leaves the folder".into(),
                });
            }
            files.iter().map(|f| dir.join(f)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut ck = Checkpoint {
            dir: dir.to_path_buf(),
            config,
            quant,
            tensors: Vec::new(),
            index: BTreeMap::new(),
            maps: Vec::new(),
            shards: shards.clone(),
        };
        for (i, shard) in shards.iter().enumerate() {
            if !shard.is_file() {
                return Err(ModelError::BadSplit {
                    path: dir.to_path_buf(),
                    reason: format!("missing shard {}", shard.display()),
                });
            }
            let file = File::open(shard).map_err(|e| io_err(shard, e))?;
            // SAFETY: read-only map of a file we do not modify (as for GGUF files).
            let map = unsafe { Mmap::map(&file) }.map_err(|e| io_err(shard, e))?;
            for t in shard_tensors(shard, &map, i)? {
                if ck.index.insert(t.name.clone(), ck.tensors.len()).is_some() {
                    return Err(ModelError::BadTensor {
                        path: shard.clone(),
                        tensor: t.name,
                        reason: "duplicate tensor name".into(),
                    });
                }
                ck.tensors.push(t);
            }
            ck.maps.push(map);
        }
        Ok(ck)
    }

    pub fn tensor(&self, name: &str) -> Option<&StTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    pub fn tensor_data(&self, t: &StTensor) -> &[u8] {
        &self.maps[t.file_index][t.offset as usize..(t.offset + t.size) as usize]
    }

    fn require(&self, name: &str) -> Result<&StTensor, ModelError> {
        self.tensor(name).ok_or_else(|| ModelError::MissingTensor {
            path: self.dir.clone(),
            tensor: name.to_string(),
        })
    }

    /// The logical f32 values of weight `name` (a `*.weight` tensor), applying the checkpoint's
    /// quantization: FP8 block scales from `*.weight_scale_inv`, NVFP4 scales from
    /// `*.weight_scale` and `*.weight_scale_2`.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        let t = self.require(name)?;
        let data = self.tensor_data(t);
        let bad = |reason: String| ModelError::BadTensor {
            path: self.dir.clone(),
            tensor: name.to_string(),
            reason,
        };
        let (rows, cols) = match t.shape[..] {
            [r, c] => (r as usize, c as usize),
            [c] => (1, c as usize),
            _ => (1, t.shape.iter().product::<u64>() as usize),
        };
        let base = name.strip_suffix(".weight").unwrap_or(name);
        match (t.dtype, &self.quant) {
            (StDtype::F8E4M3, CheckpointQuant::Fp8Block { block }) => {
                let s = self.require(&format!("{base}.weight_scale_inv"))?;
                let scales =
                    floats(s, self.tensor_data(s)).ok_or_else(|| bad("bad scales".into()))?;
                let (br, bc) = (block[0] as usize, block[1] as usize);
                let scale_cols = cols.div_ceil(bc);
                if scales.len() != rows.div_ceil(br) * scale_cols {
                    return Err(bad(format!(
                        "{} block scales for a {rows}x{cols} weight in {br}x{bc} blocks",
                        scales.len()
                    )));
                }
                Ok((0..rows * cols)
                    .map(|i| {
                        let (r, c) = (i / cols, i % cols);
                        fp8_e4m3_to_f32(data[i]) * scales[(r / br) * scale_cols + c / bc]
                    })
                    .collect())
            }
            (StDtype::U8, CheckpointQuant::Nvfp4) => {
                let s = self.require(&format!("{base}.weight_scale"))?;
                let g = self.require(&format!("{base}.weight_scale_2"))?;
                let global = floats(g, self.tensor_data(g))
                    .and_then(|v| v.first().copied())
                    .ok_or_else(|| bad("bad weight_scale_2".into()))?;
                let n_cols = cols * 2;
                let scales =
                    floats(s, self.tensor_data(s)).ok_or_else(|| bad("bad scales".into()))?;
                if scales.len() != rows * n_cols.div_ceil(16) {
                    return Err(bad(format!(
                        "{} scales for {rows}x{n_cols} NVFP4 values",
                        scales.len()
                    )));
                }
                let per_row = n_cols.div_ceil(16);
                Ok((0..rows * n_cols)
                    .map(|i| {
                        let (r, c) = (i / n_cols, i % n_cols);
                        let byte = data[r * cols + c / 2];
                        let code = if c % 2 == 0 { byte & 0xf } else { byte >> 4 };
                        E2M1[code as usize] * scales[r * per_row + c / 16] * global
                    })
                    .collect())
            }
            _ => floats(t, data).ok_or_else(|| bad(format!("{:?} is not a float type", t.dtype))),
        }
    }
}

/// E2M1 (FP4) code to value.
const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// FP8 E4M3 ("fn": no infinities; 0x7f / 0xff are NaN), exponent bias 7.
pub fn fp8_e4m3_to_f32(x: u8) -> f32 {
    let sign = if x & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exp, man) = ((x >> 3) & 0xf, (x & 7) as f32);
    if exp == 0xf && x & 7 == 7 {
        return f32::NAN;
    }
    sign * if exp == 0 {
        man * f32::powi(2.0, -9)
    } else {
        (1.0 + man / 8.0) * f32::powi(2.0, exp as i32 - 7)
    }
}

/// A float tensor's values, or `None` for integer types.
fn floats(t: &StTensor, b: &[u8]) -> Option<Vec<f32>> {
    Some(match t.dtype {
        StDtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        StDtype::F16 => b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        StDtype::Bf16 => b
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        StDtype::F8E4M3 => b.iter().map(|&x| fp8_e4m3_to_f32(x)).collect(),
        _ => return None,
    })
}
