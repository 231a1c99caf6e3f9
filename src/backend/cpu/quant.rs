//! Block layouts the kernels read and quantization of activations to the type each weight type is
//! multiplied with (ggml's `vec_dot_type`). Activations are quantized exactly as ggml's x86 CPU
//! backend does, because greedy tokens only match upstream's when the activations round the same
//! way. The scalar reference dot products and dequantizers are `model::quants`'.

use crate::model::quants::{f16_to_f32, f32_to_f16, quantize_q8_k as reference_q8_k};
use crate::model::GgmlType;

pub const QK8_0: usize = 32;
pub const Q8_0_BYTES: usize = 34;
pub const QK_K: usize = 256;
/// `float d; int8 qs[256]; int16 bsums[16]`.
pub const Q8_K_BYTES: usize = 292;

#[inline]
fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Bytes `n` activations take once converted to `ty`.
pub fn act_row_bytes(ty: GgmlType, n: usize) -> usize {
    match ty {
        GgmlType::F32 => n * 4,
        GgmlType::F16 => n * 2,
        GgmlType::Q8_0 => n / QK8_0 * Q8_0_BYTES,
        GgmlType::Q8K => n / QK_K * Q8_K_BYTES,
        other => unreachable!("{other} is never an activation type"),
    }
}

/// Converts one row of activations to `ty` (F32, F16, Q8_0 or Q8_K: the `vec_dot_type` of the
/// weight types we have kernels for).
pub fn quantize_act(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => quantize_q8_0(x, out),
        GgmlType::Q8K => quantize_q8_k(x, out),
        other => unreachable!("{other} is never an activation type"),
    }
}

/// ggml's x86 `quantize_row_q8_0`, which upstream's server runs: scale `max|x|/127` stored as
/// f16, values `x * (127/max)` rounded to nearest-even (the SIMD rounding mode). ggml's reference
/// quantizer (`model::quants::quantize_q8_0`) divides by the scale and rounds half away from zero,
/// which gives different quants for some inputs.
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (o, v) in ob[2..].iter_mut().zip(xb) {
            *o = (v * id).round_ties_even() as i32 as i8 as u8;
        }
    }
}

/// ggml's `quantize_row_q8_K` (on x86 the reference one), written into `out`.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let mut tmp = Vec::with_capacity(out.len());
    reference_q8_k(x, &mut tmp);
    out.copy_from_slice(&tmp);
}

/// The 6-bit scale and minimum `j` (0..8) of a Q4_K/Q5_K block's packed 12 scale bytes.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// MXFP4 weights against Q8_0 activations: e8m0 shared exponent, 4-bit e2m1 values as doubled
/// integers (ggml's `kvalues_mxfp4`). The scalar reference until `model::quants` has MXFP4.
pub fn mxfp4_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    const KV: [i32; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
    let mut sum = 0.0f32;
    for (bw, ba) in w
        .chunks_exact(17)
        .zip(a.chunks_exact(Q8_0_BYTES))
        .take(n / QK8_0)
    {
        let mut dot = 0i32;
        for j in 0..16 {
            dot += KV[(bw[1 + j] & 0xf) as usize] * (ba[2 + j] as i8 as i32);
            dot += KV[(bw[1 + j] >> 4) as usize] * (ba[18 + j] as i8 as i32);
        }
        sum += dot as f32 * (e8m0_half(bw[0]) * rd_f16(ba, 0));
    }
    sum
}

/// ggml's `GGML_E8M0_TO_FP32_HALF`: 2^(e-128), the half accounting for the doubled values.
pub fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

/// Quantizes one row of f32 into a KV cache type (F16, Q8_0 or Q4_0), as ggml's `from_float`.
pub fn quantize_kv_row(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    match ty {
        GgmlType::F16 | GgmlType::F32 => quantize_act(ty, x, out),
        GgmlType::Q8_0 => quantize_q8_0(x, out),
        GgmlType::Q4_0 => {
            for (xb, ob) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(18)) {
                // ggml's reference: the signed value of largest magnitude maps to -8
                let mut amax = 0.0f32;
                let mut max = 0.0f32;
                for &v in xb {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((xb[j] * id + 8.5) as i32).min(15) as u8;
                    let q1 = ((xb[j + 16] * id + 8.5) as i32).min(15) as u8;
                    ob[2 + j] = q0 | (q1 << 4);
                }
            }
        }
        other => unreachable!("{other} is not a KV cache type"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_rounds_ties_to_even() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        let mut out = [0u8; 34];
        quantize_q8_0(&x, &mut out);
        assert_eq!(f16_to_f32(u16::from_le_bytes([out[0], out[1]])), 1.0);
        assert_eq!(out[3] as i8, 2);
        assert_eq!(out[4] as i8, -4);
    }

    #[test]
    fn q8_k_scale_follows_signed_max() {
        let mut x = [0.5f32; 256];
        x[7] = -2.0;
        let mut out = [0u8; Q8_K_BYTES];
        quantize_q8_k(&x, &mut out);
        let d = f32::from_le_bytes([out[0], out[1], out[2], out[3]]);
        assert!((d - 2.0 / 127.0).abs() < 1e-7, "{d}");
        assert_eq!(out[4 + 7] as i8, -127);
        let bs0 = i16::from_le_bytes([out[260], out[261]]);
        assert_eq!(bs0 as i32, -127 + 15 * 32);
    }
}
