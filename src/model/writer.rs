//! A GGUF (version 3) writer: metadata, then the tensor directory, then tensor data aligned to
//! `general.alignment`. Tensor bytes are asked for one tensor at a time, in directory order, so
//! files larger than memory can be written.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::error::ModelError;
use super::gguf::{MetaType, MetaValue};
use super::types::GgmlType;

const ALIGNMENT: u64 = 32;

/// One tensor's entry in the directory.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml order: `shape[0]` is the row length.
    pub shape: Vec<u64>,
}

impl PlannedTensor {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes of data; whole blocks per row is checked when the tensor is added.
    pub fn size(&self) -> u64 {
        self.ggml_type.bytes_for(self.n_elements()).unwrap_or(0)
    }
}

#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PlannedTensor>,
}

fn meta_type(v: &MetaValue) -> MetaType {
    match v {
        MetaValue::U8(_) => MetaType::U8,
        MetaValue::I8(_) => MetaType::I8,
        MetaValue::U16(_) => MetaType::U16,
        MetaValue::I16(_) => MetaType::I16,
        MetaValue::U32(_) => MetaType::U32,
        MetaValue::I32(_) => MetaType::I32,
        MetaValue::F32(_) => MetaType::F32,
        MetaValue::Bool(_) => MetaType::Bool,
        MetaValue::String(_) => MetaType::String,
        MetaValue::Array(..) => MetaType::Array,
        MetaValue::U64(_) => MetaType::U64,
        MetaValue::I64(_) => MetaType::I64,
        MetaValue::F64(_) => MetaType::F64,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// The value's bytes without its type id.
fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
        MetaValue::Array(elem, items) => {
            out.extend((*elem as u32).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets a metadata key, replacing an earlier value; keys keep their first position.
    pub fn set(&mut self, key: &str, value: MetaValue) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    pub fn tensors(&self) -> &[PlannedTensor] {
        &self.tensors
    }

    /// Adds a tensor to the directory. Rows must be whole blocks of its type.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        shape: &[u64],
    ) -> Result<(), ModelError> {
        let bad = |reason: String| ModelError::BadTensor {
            path: "(being written)".into(),
            tensor: name.to_string(),
            reason,
        };
        if shape.is_empty() || shape.len() > 4 {
            return Err(bad(format!("{} dimensions", shape.len())));
        }
        if !shape[0].is_multiple_of(ggml_type.block_size() as u64) {
            return Err(bad(format!(
                "row length {} is not a multiple of {ggml_type}'s block size {}",
                shape[0],
                ggml_type.block_size()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("duplicate tensor name".into()));
        }
        self.tensors.push(PlannedTensor {
            name: name.to_string(),
            ggml_type,
            shape: shape.to_vec(),
        });
        Ok(())
    }

    fn header(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend(b"GGUF");
        h.extend(3u32.to_le_bytes());
        h.extend((self.tensors.len() as u64).to_le_bytes());
        h.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut h, k);
            h.extend((meta_type(v) as u32).to_le_bytes());
            put_value(&mut h, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend((t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                h.extend(d.to_le_bytes());
            }
            h.extend(t.ggml_type.id().to_le_bytes());
            h.extend(offset.to_le_bytes());
            offset = (offset + t.size()).div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        h.resize(
            (h.len() as u64).div_ceil(ALIGNMENT) as usize * ALIGNMENT as usize,
            0,
        );
        h
    }

    /// Writes the file, asking `data` for each tensor's bytes in directory order.
    pub fn write(
        &self,
        path: &Path,
        mut data: impl FnMut(&PlannedTensor) -> Result<Vec<u8>, ModelError>,
    ) -> Result<(), ModelError> {
        let io = |e: std::io::Error| ModelError::Io {
            path: path.to_path_buf(),
            error: e.to_string(),
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        out.write_all(&self.header()).map_err(io)?;
        for t in &self.tensors {
            let bytes = data(t)?;
            if bytes.len() as u64 != t.size() {
                return Err(ModelError::BadTensor {
                    path: path.to_path_buf(),
                    tensor: t.name.clone(),
                    reason: format!(
                        "{} bytes of data for a {}-byte tensor",
                        bytes.len(),
                        t.size()
                    ),
                });
            }
            out.write_all(&bytes).map_err(io)?;
            let pad = (t.size().div_ceil(ALIGNMENT) * ALIGNMENT - t.size()) as usize;
            out.write_all(&vec![0u8; pad]).map_err(io)?;
        }
        out.flush().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GgufFile;

    #[test]
    fn round_trips_through_the_reader() {
        let mut w = GgufWriter::new();
        w.set("general.architecture", MetaValue::String("llama".into()));
        w.set(
            "nested",
            MetaValue::Array(
                MetaType::Array,
                vec![
                    MetaValue::Array(MetaType::I32, vec![MetaValue::I32(-1)]),
                    MetaValue::Array(MetaType::String, vec![MetaValue::String("x".into())]),
                ],
            ),
        );
        w.set("f", MetaValue::F64(0.25));
        w.add_tensor("a", GgmlType::F32, &[3]).unwrap();
        w.add_tensor("b", GgmlType::Q4_0, &[64, 2]).unwrap();
        assert!(w.add_tensor("c", GgmlType::Q4_0, &[48]).is_err());
        let dir = std::env::temp_dir().join(format!("bloomery-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("w.gguf");
        w.write(&p, |t| Ok(vec![7u8; t.size() as usize])).unwrap();
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(
            f.get("nested"),
            w.metadata.iter().find(|m| m.0 == "nested").map(|m| &m.1)
        );
        assert_eq!(f.get("f").and_then(MetaValue::as_f64), Some(0.25));
        let b = f.tensor("b").unwrap();
        assert_eq!((b.size, b.offset % 32), (72, 0));
        assert!(f.tensor_data(b).iter().all(|&x| x == 7));
        std::fs::remove_dir_all(&dir).ok();
    }
}
