//! Block layouts the kernels read and quantization of activations to the type each weight type is
//! multiplied with (ggml's `vec_dot_type`). Activations are quantized exactly as ggml's x86 CPU
//! backend does, because greedy tokens only match upstream's when the activations round the same
//! way. The scalar reference dot products and dequantizers are `model::quants`'.

use crate::model::quants::{f16_to_f32, f32_to_f16};
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
    #[cfg(target_arch = "x86_64")]
    if super::dot::isa() != super::dot::Isa::Scalar {
        // SAFETY: the AVX2 level was detected.
        return unsafe { quantize_q8_0_avx2(x, out) };
    }
    quantize_q8_0_scalar(x, out);
}

/// [`quantize_q8_0`] one value at a time.
fn quantize_q8_0_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (o, v) in ob[2..].iter_mut().zip(xb) {
            *o = rint(v * id) as i32 as i8 as u8;
        }
    }
}

/// [`quantize_q8_0`] a block at a time in four vectors: the same maximum, scale, products and
/// nearest-even rounding.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0_avx2(x: &[f32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (xb, ob) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
        );
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let s = _mm256_set1_ps(id);
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let r = _mm256_round_ps(
                _mm256_mul_ps(v[i], s),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            _mm256_cvtps_epi32(r)
        });
        // 32 i32 to 32 bytes in order (the packs interleave 128-bit lanes; the permute undoes it)
        let p16a = _mm256_packs_epi32(q[0], q[1]);
        let p16b = _mm256_packs_epi32(q[2], q[3]);
        let p8 = _mm256_packs_epi16(p16a, p16b);
        let ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(ob.as_mut_ptr().add(2) as *mut __m256i, ordered);
    }
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2^22` (activation quants are at
/// most 127 in magnitude): adding and subtracting 1.5 * 2^23 leaves no fraction bits, and the add
/// rounds as the FPU rounds, to nearest even. `round_ties_even` is a libm call on a baseline
/// x86-64 build, and quantizing a decode step's activations sat on the critical path.
#[inline(always)]
fn rint(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// ggml's `quantize_row_q8_K` (on x86 the reference one), written into `out`: the same bytes as
/// `model::quants::quantize_q8_k` without its allocations.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::dot::isa() != super::dot::Isa::Scalar {
        // SAFETY: the AVX2 level was detected.
        return unsafe { quantize_q8_k_avx2(x, out) };
    }
    quantize_q8_k_with(x, out, q8_k_quants);
}

/// One Q8_K block's quants, one at a time.
fn q8_k_quants(iscale: f32, blk: &[f32], qs: &mut [u8]) {
    for (q, &v) in qs.iter_mut().zip(blk) {
        *q = (rint(iscale * v) as i32).min(127) as i8 as u8;
    }
}

/// [`quantize_q8_k`]'s blocks: the value of largest magnitude (the first of equals) sets the
/// scale, `quants(iscale, block, qs)` writes the 256 quants, then the sums of sixteen.
#[inline(always)]
fn quantize_q8_k_with(x: &[f32], out: &mut [u8], quants: impl Fn(f32, &[f32], &mut [u8])) {
    for (blk, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        // the largest magnitude in one branch-free pass, then the first value that has it
        let amax = blk
            .iter()
            .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let max = *blk.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127.0 / max;
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        let (qs, sums) = ob[4..].split_at_mut(QK_K);
        quants(iscale, blk, qs);
        for (g, s) in qs.chunks_exact(16).zip(sums.chunks_exact_mut(2)) {
            let sum: i32 = g.iter().map(|&q| q as i8 as i32).sum();
            s.copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
}

/// [`quantize_q8_k`] with the quants eight at a time: the same products, nearest-even rounding
/// (as [`rint`]) and clamp.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx2(x: &[f32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    quantize_q8_k_with(x, out, |iscale, blk, qs| {
        // SAFETY (all): `blk` holds 256 floats and `qs` 256 bytes, read and written in eights.
        unsafe {
            let s = _mm256_set1_ps(iscale);
            let hi = _mm256_set1_epi32(127);
            for (v8, q8) in blk.chunks_exact(8).zip(qs.chunks_exact_mut(8)) {
                let v = _mm256_mul_ps(s, _mm256_loadu_ps(v8.as_ptr()));
                let r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                let i = _mm256_min_epi32(_mm256_cvtps_epi32(r), hi);
                // eight i32 in [-128, 127] to eight bytes
                let p = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
                let b = _mm_packs_epi16(p, p);
                _mm_storel_epi64(q8.as_mut_ptr() as *mut __m128i, b);
            }
        }
    });
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

    /// The vector Q8_0 quantizer writes the scalar one's bytes (random blocks, a zero block,
    /// ties at .5 steps).
    #[test]
    fn q8_0_vector_equals_scalar() {
        if crate::backend::cpu::dot::isa() == crate::backend::cpu::dot::Isa::Scalar {
            return;
        }
        let mut x: Vec<f32> = (0..8 * QK8_0)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.0137)
            .collect();
        x[QK8_0..2 * QK8_0].fill(0.0);
        for (i, v) in x[2 * QK8_0..3 * QK8_0].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 0.5 + 0.25 * (i % 3) as f32;
        }
        let mut want = vec![0u8; act_row_bytes(GgmlType::Q8_0, x.len())];
        quantize_q8_0_scalar(&x, &mut want);
        let mut got = vec![0xaa; want.len()];
        quantize_q8_0(&x, &mut got);
        assert_eq!(got, want);
    }

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

    #[test]
    fn q8_k_equals_the_reference_quantizer() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut f = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for case in 0..200 {
            let mut x: Vec<f32> = (0..512).map(|_| f() * (1 + case % 7) as f32).collect();
            if case % 3 == 0 {
                // exact halves after scaling: ties must go to even as ggml's rounding does
                x[1] = 127.0;
                x.iter_mut()
                    .skip(2)
                    .take(40)
                    .enumerate()
                    .for_each(|(i, v)| {
                        *v = i as f32 + 0.5 - 20.0;
                    });
            }
            if case == 5 {
                x[256..].fill(0.0);
            }
            if case == 7 {
                // the largest magnitude twice, opposite signs: the first sets the scale's sign
                x[5] = -99.0;
                x[9] = 99.0;
            }
            let mut reference = Vec::new();
            crate::model::quants::quantize_q8_k(&x, &mut reference);
            let mut ours = vec![0xa5u8; 2 * Q8_K_BYTES];
            quantize_q8_k(&x, &mut ours);
            assert_eq!(ours, reference, "case {case}");
            // the one-at-a-time quants too (the vector ones ran above where the CPU has them)
            let mut scalar = vec![0x5au8; 2 * Q8_K_BYTES];
            quantize_q8_k_with(&x, &mut scalar, q8_k_quants);
            assert_eq!(scalar, reference, "case {case}, scalar");
        }
    }

    #[test]
    fn rint_rounds_as_round_ties_even() {
        for i in -300_000..300_000 {
            let x = i as f32 / 1000.0;
            assert_eq!(rint(x), x.round_ties_even(), "{x}");
        }
        for x in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -127.5, 1e-30, -1e-30] {
            assert_eq!(rint(x), x.round_ties_even(), "{x}");
        }
    }
}
