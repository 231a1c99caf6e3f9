//! The GGUF reader: header, metadata, tensor inventory, over a read-only memory map. Every length,
//! offset and count read from the file is checked against the file before use, so a damaged or
//! hostile file is refused by name, never a panic or an out-of-bounds read.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::ModelError;
use super::types::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limit on tensor dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal GGUF (gguf-py writes them); no real file nests them this deep.
const MAX_ARRAY_NESTING: u32 = 8;

/// One metadata value. Arrays keep their element type even when empty.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// GGUF metadata value type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl MetaType {
    fn from_id(id: u32) -> Option<MetaType> {
        use MetaType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }
}

impl MetaValue {
    /// Integer value of any integer type (and bool), as llama.cpp's loader accepts them.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            MetaValue::U8(v) => v as i64,
            MetaValue::I8(v) => v as i64,
            MetaValue::U16(v) => v as i64,
            MetaValue::I16(v) => v as i64,
            MetaValue::U32(v) => v as i64,
            MetaValue::I32(v) => v as i64,
            MetaValue::U64(v) => i64::try_from(v).ok()?,
            MetaValue::I64(v) => v,
            MetaValue::Bool(v) => v as i64,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

/// Where one tensor's bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml order: `shape[0]` is the row length (contiguous dimension).
    pub shape: Vec<u64>,
    /// Byte offset from the start of the file.
    pub offset: u64,
    pub size: u64,
    /// Index of the split part holding it (0 for single files).
    pub file_index: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The bytes of one file: mapped from disk, or handed over in memory.
enum Backing {
    Map(Mmap),
    Bytes(Vec<u8>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Bytes(b) => b,
        }
    }
}

/// One opened GGUF file (or the first part of a split model with all its parts).
pub struct GgufFile {
    pub version: u32,
    pub alignment: u64,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    index: BTreeMap<String, usize>,
    parts: Vec<Backing>,
    pub paths: Vec<PathBuf>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn truncated(&self, what: &str) -> ModelError {
        ModelError::Truncated {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            offset: self.pos as u64,
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.truncated(what))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Counts are u32 in GGUF v1 and u64 from v2 on.
    fn count(&mut self, version: u32, what: &str) -> Result<u64, ModelError> {
        if version == 1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    fn string(&mut self, version: u32, what: &str) -> Result<String, ModelError> {
        let len = self.count(version, what)?;
        let len = usize::try_from(len).map_err(|_| self.truncated(what))?;
        let bytes = self.take(len, what)?;
        // llama.cpp keeps strings as raw bytes; vocabularies with invalid UTF-8 still load.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: MetaType, version: u32, key: &str) -> Result<MetaValue, ModelError> {
        self.value_at(ty, version, key, 0)
    }

    /// `depth` counts enclosing arrays: nesting is bounded so that a hostile file cannot
    /// exhaust the stack.
    fn value_at(
        &mut self,
        ty: MetaType,
        version: u32,
        key: &str,
        depth: u32,
    ) -> Result<MetaValue, ModelError> {
        Ok(match ty {
            MetaType::U8 => MetaValue::U8(self.array::<1>(key)?[0]),
            MetaType::I8 => MetaValue::I8(self.array::<1>(key)?[0] as i8),
            MetaType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            MetaType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            MetaType::U32 => MetaValue::U32(self.u32(key)?),
            MetaType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            MetaType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            MetaType::Bool => MetaValue::Bool(self.array::<1>(key)?[0] != 0),
            MetaType::String => MetaValue::String(self.string(version, key)?),
            MetaType::U64 => MetaValue::U64(self.u64(key)?),
            MetaType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            MetaType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            MetaType::Array => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(ModelError::BadMetadata {
                        path: self.path.to_path_buf(),
                        key: key.to_string(),
                        reason: format!("arrays nested deeper than {MAX_ARRAY_NESTING}"),
                    });
                }
                let elem_id = self.u32(key)?;
                let elem = MetaType::from_id(elem_id).ok_or_else(|| ModelError::BadMetadata {
                    path: self.path.to_path_buf(),
                    key: key.to_string(),
                    reason: format!("unknown array element type {elem_id}"),
                })?;
                let n = self.count(version, key)?;
                // Every element takes at least one byte: a count larger than what is left is a lie.
                if n > (self.buf.len() - self.pos) as u64 {
                    return Err(self.truncated(key));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value_at(elem, version, key, depth + 1)?);
                }
                MetaValue::Array(elem, items)
            }
        })
    }
}

impl GgufFile {
    /// Opens a GGUF file. For the first part of a split model (`name-00001-of-0000N.gguf`) all
    /// other parts are opened from the same folder and their tensors joined into one inventory.
    pub fn open(path: &Path) -> Result<GgufFile, ModelError> {
        let mut first = Self::open_one(path, 0)?;
        let n_split = first
            .get("split.count")
            .and_then(MetaValue::as_i64)
            .unwrap_or(0);
        if n_split > 1 {
            let prefix = split_prefix(path).ok_or_else(|| ModelError::BadSplit {
                path: path.to_path_buf(),
                reason: format!("the file declares {n_split} parts but its name is not NAME-00001-of-{n_split:05}.gguf"),
            })?;
            for i in 1..n_split as usize {
                let part = PathBuf::from(format!("{prefix}-{:05}-of-{:05}.gguf", i + 1, n_split));
                if !part.exists() {
                    return Err(ModelError::BadSplit {
                        path: path.to_path_buf(),
                        reason: format!("missing split part {}", part.display()),
                    });
                }
                let other = Self::open_one(&part, i)?;
                for t in other.tensors {
                    first.push_tensor(t, &part)?;
                }
                first.parts.extend(other.parts);
                first.paths.extend(other.paths);
            }
        }
        Ok(first)
    }

    fn push_tensor(&mut self, t: TensorInfo, path: &Path) -> Result<(), ModelError> {
        if self.index.contains_key(&t.name) {
            return Err(ModelError::BadTensor {
                path: path.to_path_buf(),
                tensor: t.name,
                reason: "duplicate tensor name".into(),
            });
        }
        self.index.insert(t.name.clone(), self.tensors.len());
        self.tensors.push(t);
        Ok(())
    }

    fn open_one(path: &Path, file_index: usize) -> Result<GgufFile, ModelError> {
        let file = File::open(path).map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            error: e.to_string(),
        })?;
        // SAFETY: the map is read-only; a model file changed under a running server is outside
        // what any inference server can defend against (llama.cpp maps files the same way).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            error: e.to_string(),
        })?;
        Self::parse(path, Backing::Map(map), file_index)
    }

    /// Reads a single GGUF held in memory; `label` names it in errors. Split parts are not
    /// followed.
    pub fn from_bytes(label: &Path, bytes: Vec<u8>) -> Result<GgufFile, ModelError> {
        Self::parse(label, Backing::Bytes(bytes), 0)
    }

    fn parse(path: &Path, map: Backing, file_index: usize) -> Result<GgufFile, ModelError> {
        let mut c = Cursor {
            buf: &map,
            pos: 0,
            path,
        };
        let magic = c.array::<4>("magic")?;
        if &magic != MAGIC {
            return Err(ModelError::BadMagic {
                path: path.to_path_buf(),
                found: magic,
            });
        }
        let version = c.u32("version")?;
        if !(1..=3).contains(&version) {
            return Err(ModelError::UnsupportedVersion {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = c.count(version, "tensor count")?;
        let n_kv = c.count(version, "metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string(version, "metadata key")?;
            let ty_id = c.u32(&key)?;
            let ty = MetaType::from_id(ty_id).ok_or_else(|| ModelError::BadMetadata {
                path: path.to_path_buf(),
                key: key.clone(),
                reason: format!("unknown value type {ty_id}"),
            })?;
            let v = c.value(ty, version, &key)?;
            if metadata.contains_key(&key) {
                return Err(ModelError::BadMetadata {
                    path: path.to_path_buf(),
                    key,
                    reason: "duplicate key".into(),
                });
            }
            metadata.insert(key, v);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_i64() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => {
                    return Err(ModelError::BadMetadata {
                        path: path.to_path_buf(),
                        key: "general.alignment".into(),
                        reason: format!("{v:?} is not a power of two"),
                    })
                }
            },
        };
        let mut raw = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string(version, "tensor name")?;
            let n_dims = c.u32(&name)?;
            if n_dims > MAX_DIMS {
                return Err(ModelError::BadTensor {
                    path: path.to_path_buf(),
                    tensor: name,
                    reason: format!("{n_dims} dimensions (at most {MAX_DIMS})"),
                });
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                shape.push(c.count(version, &name)?);
            }
            let type_id = c.u32(&name)?;
            let offset = c.u64(&name)?;
            raw.push((name, shape, type_id, offset));
        }
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = map.len() as u64;
        let mut out = GgufFile {
            version,
            alignment,
            metadata,
            tensors: Vec::with_capacity(raw.len()),
            index: BTreeMap::new(),
            parts: Vec::new(),
            paths: vec![path.to_path_buf()],
        };
        for (name, shape, type_id, rel) in raw {
            let bad = |reason: String| ModelError::BadTensor {
                path: path.to_path_buf(),
                tensor: name.clone(),
                reason,
            };
            let ggml_type = GgmlType::from_id(type_id)
                .ok_or_else(|| bad(format!("unknown ggml type {type_id}")))?;
            let n_el = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
            // A tensor without dimensions is a scalar: one row of one element.
            let row = shape.first().copied().unwrap_or(1);
            if !row.is_multiple_of(ggml_type.block_size() as u64) {
                return Err(bad(format!(
                    "row length {row} is not a multiple of {ggml_type}'s block size {}",
                    ggml_type.block_size()
                )));
            }
            let size = ggml_type.bytes_for(n_el).ok_or_else(|| {
                bad(format!(
                    "{n_el} elements do not fill whole {ggml_type} blocks"
                ))
            })?;
            if rel % alignment != 0 {
                return Err(bad(format!(
                    "data offset {rel} is not aligned to {alignment}"
                )));
            }
            let offset = data_start
                .checked_add(rel)
                .filter(|o| o.checked_add(size).is_some_and(|end| end <= file_len))
                .ok_or_else(|| {
                    bad(format!(
                        "data [{}, +{size}) lies outside the file ({file_len} bytes)",
                        data_start.saturating_add(rel)
                    ))
                })?;
            out.push_tensor(
                TensorInfo {
                    name: name.clone(),
                    ggml_type,
                    shape,
                    offset,
                    size,
                    file_index,
                },
                path,
            )?;
        }
        out.parts.push(map);
        Ok(out)
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetaValue::as_str)
    }

    /// The model's architecture name (`general.architecture`).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor (checked against the file at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.parts[t.file_index][t.offset as usize..(t.offset + t.size) as usize]
    }
}

/// `dir/name-00001-of-00003.gguf` -> `dir/name`.
fn split_prefix(path: &Path) -> Option<String> {
    let s = path.to_str()?;
    let re = regex::Regex::new(r"^(.*)-00001-of-\d{5}\.gguf$").ok()?;
    re.captures(s).map(|c| c[1].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_str(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    /// A minimal v3 file: one u32 key, one string array, one F32 tensor of 4 elements.
    fn tiny() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        put_str(&mut b, "llama.block_count");
        b.extend(4u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        put_str(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        put_str(&mut b, "a");
        put_str(&mut b, "bc");
        put_str(&mut b, "w");
        b.extend(1u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for v in [1.0f32, 2.0, 3.0, 4.0] {
            b.extend(v.to_le_bytes());
        }
        b
    }

    fn write(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("bloomery-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let p = write("tiny.gguf", &tiny());
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.get("llama.block_count").and_then(|v| v.as_i64()), Some(7));
        let toks = f.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
        assert_eq!(toks[1].as_str(), Some("bc"));
        let t = f.tensor("w").unwrap();
        assert_eq!(t.ggml_type, GgmlType::F32);
        let d = f.tensor_data(t);
        assert_eq!(f32::from_le_bytes(d[12..16].try_into().unwrap()), 4.0);
    }

    #[test]
    fn refuses_damage_by_name() {
        let good = tiny();
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        let e = GgufFile::open(&write("m.gguf", &bad_magic)).err().unwrap();
        assert!(matches!(e, ModelError::BadMagic { .. }), "{e}");
        // Every truncation point is refused, none panics.
        for cut in 0..good.len() {
            let p = write("cut.gguf", &good[..cut]);
            assert!(GgufFile::open(&p).is_err(), "cut at {cut} accepted");
        }
        // The tensor record is: name "w" (8 + 1 bytes), n_dims (4), one dim (8), type id (4).
        let rec = good
            .windows(9)
            .position(|w| w == b"\x01\0\0\0\0\0\0\0w")
            .unwrap();
        let type_pos = rec + 9 + 4 + 8;
        let mut bad_type = good.clone();
        bad_type[type_pos..type_pos + 4].copy_from_slice(&99u32.to_le_bytes());
        let e = GgufFile::open(&write("t.gguf", &bad_type)).err().unwrap();
        assert!(e.to_string().contains("unknown ggml type 99"), "{e}");
    }
}
