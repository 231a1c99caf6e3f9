//! Tensors of a loaded model: zero-copy views of the GGUF files through our own read-only memory
//! maps (the engine outlives the `GgufFile` it was loaded from), found by name and checked for
//! shape and for a kernel that can multiply them.

use std::fs::File;
use std::sync::{Arc, OnceLock};

use memmap2::Mmap;

use super::EngineError;
use crate::backend::cpu::dot::kernel;
use crate::backend::cpu::packed::{pack_q4k, packable};
use crate::backend::cpu::QMat;
use crate::model::quants::dequantize;
use crate::model::{GgmlType, GgufFile};

#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `shape[0]` is the row length.
    pub shape: Vec<usize>,
    map: Arc<Mmap>,
    offset: usize,
    len: usize,
    /// The rows repacked for the CPU's products (`backend::cpu::packed`), made at first use.
    packed: Arc<OnceLock<Option<Vec<u8>>>>,
}

impl Tensor {
    pub fn data(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    /// The tensor as rows of `shape[0]` elements (all further dimensions flattened).
    pub fn mat(&self) -> QMat<'_> {
        QMat {
            ty: self.ty,
            rows: self.shape[1..].iter().product(),
            cols: self.shape[0],
            data: self.data(),
            packed: None,
        }
    }

    /// [`Tensor::mat`] for the CPU's matrix products: a 2-D tensor of a type the CPU runs
    /// repacked carries its repacked rows, made on the first call (as ggml repacks such weights
    /// at load; the file's pages are then no longer read).
    pub fn product_mat(&self) -> QMat<'_> {
        let m = self.mat();
        let packed = self.packed.get_or_init(|| {
            (self.shape.len() == 2 && packable(m.ty, m.rows))
                .then(|| pack_q4k(m.data, m.rows, m.cols))
        });
        QMat {
            packed: packed.as_deref(),
            ..m
        }
    }

    /// Row `r` as floats (embedding lookups).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<(), EngineError> {
        dequantize(self.ty, self.mat().row(r), out)
            .map_err(|e| EngineError::Load(format!("reading a row of {}: {e}", self.name)))
    }
}

/// Whether to map `file` with every page read in and entered in the page table now (as
/// llama.cpp maps with `MAP_POPULATE`): yes when it fits in half the host's available memory.
/// Otherwise each page is faulted in when first used, and a decode step that routes to an expert
/// for the first time pays the faults of its rows inside the step. A file too large for that stays
/// lazy, so the disk tier can serve what does not fit.
fn populate(file: &File) -> bool {
    let size = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    crate::placement::host_memory().is_ok_and(|h| size <= h.free_bytes / 2)
}

pub struct Loader<'a> {
    pub gguf: &'a GgufFile,
    maps: Vec<Arc<Mmap>>,
}

impl<'a> Loader<'a> {
    pub fn new(gguf: &'a GgufFile) -> Result<Loader<'a>, EngineError> {
        let mut maps = Vec::new();
        for path in &gguf.paths {
            let file = File::open(path)
                .map_err(|e| EngineError::Load(format!("opening {}: {e}", path.display())))?;
            let mut options = memmap2::MmapOptions::new();
            if populate(&file) {
                options.populate();
            }
            // SAFETY: read-only map of a model file; like llama.cpp we assume nobody truncates
            // it while we serve.
            let map = unsafe { options.map(&file) }
                .map_err(|e| EngineError::Load(format!("mapping {}: {e}", path.display())))?;
            maps.push(Arc::new(map));
        }
        Ok(Loader { gguf, maps })
    }

    pub fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    /// The tensor `name`, whose shape must be `shape` (ggml order).
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor, EngineError> {
        let info = self
            .gguf
            .tensor(name)
            .ok_or_else(|| EngineError::Load(format!("missing tensor {name}")))?;
        let got: Vec<usize> = info.shape.iter().map(|&d| d as usize).collect();
        if got != shape {
            return Err(EngineError::Load(format!(
                "tensor {name} has shape {got:?}, expected {shape:?}"
            )));
        }
        let map = self.maps.get(info.file_index).ok_or_else(|| {
            EngineError::Load(format!("tensor {name}: no split part {}", info.file_index))
        })?;
        let (offset, len) = (info.offset as usize, info.size as usize);
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(EngineError::Load(format!(
                "tensor {name} lies beyond the end of its file (file changed since it was opened?)"
            )));
        }
        Ok(Tensor {
            name: name.to_string(),
            ty: info.ggml_type,
            shape: got,
            map: Arc::clone(map),
            offset,
            len,
            packed: Arc::new(OnceLock::new()),
        })
    }

    /// `tensor`, absent allowed.
    pub fn optional(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>, EngineError> {
        if self.has(name) {
            self.tensor(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A weight we multiply with: its type needs a dot kernel.
    pub fn matrix(&self, name: &str, shape: &[usize]) -> Result<Tensor, EngineError> {
        let t = self.tensor(name, shape)?;
        check_matrix(&t)?;
        Ok(t)
    }

    pub fn optional_matrix(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<Tensor>, EngineError> {
        let t = self.optional(name, shape)?;
        if let Some(t) = &t {
            check_matrix(t)?;
        }
        Ok(t)
    }

    /// A small F32 (or F16) vector: norm weights, biases.
    pub fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, EngineError> {
        self.floats(name, &[n])
    }

    /// A small F32 (or F16) tensor of `shape` as floats in file order (per-expert biases).
    pub fn floats(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        let t = self.tensor(name, shape)?;
        let n = shape.iter().product();
        if !matches!(t.ty, GgmlType::F32 | GgmlType::F16) {
            return Err(EngineError::Load(format!(
                "tensor {name} is {}, expected f32 or f16",
                t.ty
            )));
        }
        let mut out = vec![0.0; n];
        dequantize(t.ty, t.data(), &mut out)
            .map_err(|e| EngineError::Load(format!("tensor {name}: {e}")))?;
        Ok(out)
    }

    pub fn optional_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, EngineError> {
        if self.has(name) {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn check_matrix(t: &Tensor) -> Result<(), EngineError> {
    if kernel(t.ty).is_none() {
        return Err(EngineError::Load(format!(
            "tensor {} has type {}, which the CPU backend cannot multiply yet",
            t.name, t.ty
        )));
    }
    Ok(())
}
