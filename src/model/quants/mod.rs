//! Tensor element formats: dequantization of every ggml type to f32, the activation quantizers
//! each weight type pairs with, and scalar reference dot products. These are the definitions the
//! fast kernels in `backend` are tested against: plain loops, no SIMD, no threads.

mod activations;
mod grouped;
pub mod half;
mod iquants;
mod kquants;
mod legacy;
mod lowbit;
#[rustfmt::skip]
mod tables;

pub use activations::{quantize_q8_0, quantize_q8_1, quantize_q8_k};
pub use half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

use super::error::ModelError;
use super::types::GgmlType;
use kquants::BlockK;
use legacy::Block32;

/// One block type's routines over raw block bytes.
struct Kernels {
    dequantize: fn(&[u8], &mut [f32]),
    /// One weight block against the activation bytes covering the same elements.
    dot: fn(&[u8], &[u8]) -> f32,
}

/// Both routines of a type from its decoder: every decoded block form has `dequantize` and `dot`.
macro_rules! kernels {
    ($decode:path) => {
        Kernels {
            dequantize: |b, y| $decode(b).dequantize(y),
            dot: |w, a| $decode(w).dot(a),
        }
    };
}

fn kernels(t: GgmlType) -> Option<Kernels> {
    use GgmlType::*;
    Some(match t {
        Q4_0 => kernels!(Block32::q4_0),
        Q4_1 => kernels!(Block32::q4_1),
        Q5_0 => kernels!(Block32::q5_0),
        Q5_1 => kernels!(Block32::q5_1),
        Q8_0 => kernels!(Block32::q8_0),
        Q8_1 => kernels!(Block32::q8_1),
        Q2K => kernels!(BlockK::q2_k),
        Q3K => kernels!(BlockK::q3_k),
        Q4K => kernels!(BlockK::q4_k),
        Q5K => kernels!(BlockK::q5_k),
        Q6K => kernels!(BlockK::q6_k),
        Q8K => kernels!(BlockK::q8_k),
        Iq2Xxs => kernels!(iquants::iq2_xxs),
        Iq2Xs => kernels!(iquants::iq2_xs),
        Iq2S => kernels!(iquants::iq2_s),
        Iq3Xxs => kernels!(iquants::iq3_xxs),
        Iq3S => kernels!(iquants::iq3_s),
        Iq1S => kernels!(iquants::iq1_s),
        Iq1M => kernels!(iquants::iq1_m),
        Iq4Nl => kernels!(iquants::iq4_nl),
        Iq4Xs => kernels!(iquants::iq4_xs),
        Tq1_0 => kernels!(lowbit::tq1_0),
        Tq2_0 => kernels!(lowbit::tq2_0),
        Q1_0 => kernels!(lowbit::q1_0),
        Q2_0 => kernels!(lowbit::q2_0),
        Mxfp4 => kernels!(lowbit::mxfp4),
        Nvfp4 => kernels!(lowbit::nvfp4),
        F32 | F16 | Bf16 | I8 | I16 | I32 | I64 | F64 => return None,
    })
}

/// Byte offsets of the f16 scale fields in one block of `t`: multiplying all of them by `k`
/// multiplies every value of the block by `k`. Empty for float types and for types whose scales
/// are not plain f16 fields (IQ1_M, MXFP4, NVFP4, Q8_K).
pub fn f16_scale_offsets(t: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match t {
        Q4_0 | Q5_0 | Q8_0 | Q8_1 | Q1_0 | Q2_0 | Iq4Nl | Iq4Xs => &[0],
        Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq1S => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        Tq1_0 => &[52],
        Tq2_0 => &[64],
        F32 | F16 | Bf16 | Q8K | Iq1M | Mxfp4 | Nvfp4 | I8 | I16 | I32 | I64 | F64 => &[],
    }
}

fn unsupported(t: GgmlType, what: &str) -> ModelError {
    ModelError::Quant {
        ggml_type: t,
        reason: format!("{what} is not implemented for this type"),
    }
}

/// Checks that `bytes` holds exactly `n` elements of `t`.
fn check_len(t: GgmlType, bytes: usize, n: usize, what: &str) -> Result<(), ModelError> {
    match t.bytes_for(n as u64) {
        Some(need) if need == bytes as u64 => Ok(()),
        Some(need) => Err(ModelError::Quant {
            ggml_type: t,
            reason: format!("{what}: {n} elements take {need} bytes, got {bytes}"),
        }),
        None => Err(ModelError::Quant {
            ggml_type: t,
            reason: format!(
                "{what}: {n} elements are not a whole number of {}-element blocks",
                t.block_size()
            ),
        }),
    }
}

/// Dequantizes `src` (whole blocks of `t`) into `dst`, whose length gives the element count.
pub fn dequantize(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), ModelError> {
    check_len(t, src.len(), dst.len(), "dequantize")?;
    match t {
        GgmlType::F32 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::Bf16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        _ => {
            let k = kernels(t).ok_or_else(|| unsupported(t, "dequantization"))?;
            for (y, b) in dst
                .chunks_exact_mut(t.block_size())
                .zip(src.chunks_exact(t.type_size()))
            {
                (k.dequantize)(b, y);
            }
        }
    }
    Ok(())
}

/// The activation format a weight type's dot product takes (ggml-cpu's `vec_dot_type`).
pub fn vec_dot_type(t: GgmlType) -> GgmlType {
    use GgmlType::*;
    match t {
        F16 => F16,
        Bf16 => Bf16,
        Q4_1 | Q5_1 | Q8_1 => Q8_1,
        Q1_0 | Q2_0 | Q4_0 | Q5_0 | Q8_0 | Mxfp4 | Nvfp4 | Iq4Nl => Q8_0,
        Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq1S | Iq1M
        | Iq4Xs | Tq1_0 | Tq2_0 => Q8K,
        F32 | I8 | I16 | I32 | I64 | F64 => F32,
    }
}

/// Replaces `out` with `x` in activation format `t` (F32, F16, BF16, Q8_0, Q8_1 or Q8_K).
pub fn quantize_activations(t: GgmlType, x: &[f32], out: &mut Vec<u8>) -> Result<(), ModelError> {
    if !x.len().is_multiple_of(t.block_size()) {
        return Err(ModelError::Quant {
            ggml_type: t,
            reason: format!(
                "{} activations are not a whole number of {}-element blocks",
                x.len(),
                t.block_size()
            ),
        });
    }
    out.clear();
    match t {
        GgmlType::F32 => out.extend(x.iter().flat_map(|v| v.to_le_bytes())),
        GgmlType::F16 => out.extend(x.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes())),
        GgmlType::Bf16 => out.extend(x.iter().flat_map(|&v| f32_to_bf16(v).to_le_bytes())),
        GgmlType::Q8_0 => quantize_q8_0(x, out),
        GgmlType::Q8_1 => quantize_q8_1(x, out),
        GgmlType::Q8K => quantize_q8_k(x, out),
        _ => return Err(unsupported(t, "activation quantization")),
    }
    Ok(())
}

/// Scalar reference dot product of one weight row of `n` elements of type `t` with activations
/// already in `vec_dot_type(t)`. Float rows accumulate in f64 and block rows in f32, as ggml's
/// scalar kernels do.
pub fn vec_dot_ref(t: GgmlType, weights: &[u8], acts: &[u8], n: usize) -> Result<f32, ModelError> {
    let at = vec_dot_type(t);
    check_len(t, weights.len(), n, "dot product weights")?;
    check_len(at, acts.len(), n, "dot product activations")?;
    let float_dot = |width: usize, read: fn(&[u8]) -> f32| -> f32 {
        let sum: f64 = weights
            .chunks_exact(width)
            .zip(acts.chunks_exact(width))
            .map(|(w, a)| (read(w) * read(a)) as f64)
            .sum();
        sum as f32
    };
    match t {
        GgmlType::F32 => Ok(float_dot(4, |b| {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })),
        GgmlType::F16 => Ok(float_dot(2, |b| {
            f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
        })),
        GgmlType::Bf16 => Ok(float_dot(2, |b| {
            bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
        })),
        GgmlType::Q8_1 | GgmlType::Q8K => Err(unsupported(t, "a weight dot product")),
        _ => {
            let k = kernels(t).ok_or_else(|| unsupported(t, "the dot product"))?;
            // One weight block spans this many activation bytes.
            let act_bytes = t.block_size() / at.block_size() * at.type_size();
            Ok(weights
                .chunks_exact(t.type_size())
                .zip(acts.chunks_exact(act_bytes))
                .map(|(w, a)| (k.dot)(w, a))
                .sum())
        }
    }
}
