//! Block layouts the kernels read, quantization of activations to the type each weight type is
//! multiplied with (ggml's `vec_dot_type`), and scalar dot products that are the reference for the
//! SIMD ones. Activations are quantized exactly as ggml's x86 CPU backend does, because greedy
//! tokens only match upstream's when the activations round the same way.

use super::f16::{f16_to_f32, f32_to_f16};
use crate::model::GgmlType;

pub const QK8_0: usize = 32;
pub const Q8_0_BYTES: usize = 34;
pub const QK_K: usize = 256;
/// `float d; int8 qs[256]; int16 bsums[16]`.
pub const Q8_K_BYTES: usize = 292;

/// The element type activations are converted to before a product with weights of type `w`, or
/// `None` when we have no kernel for `w`.
pub fn vec_dot_type(w: GgmlType) -> Option<GgmlType> {
    use GgmlType::*;
    match w {
        F32 => Some(F32),
        F16 => Some(F16),
        Q4_0 | Q5_0 | Q8_0 | Mxfp4 => Some(Q8_0),
        Q2K | Q3K | Q4K | Q5K | Q6K => Some(Q8K),
        _ => None,
    }
}

#[inline]
fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline]
fn rd_f32(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
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

/// Converts one row of activations to `ty` (one of [`vec_dot_type`]'s answers).
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

/// ggml's x86 `quantize_row_q8_0`: scale `max|x|/127` stored as f16, values `x * (127/max)`
/// rounded to nearest-even (the SIMD rounding mode), not away from zero.
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

/// ggml's `quantize_row_q8_K_ref`: scale from the signed value of largest magnitude, f32 scale,
/// sums of each 16 values kept for the K-quant minimums.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        let (head, rest) = ob.split_at_mut(4);
        let (qs, bsums) = rest.split_at_mut(QK_K);
        for (q, &v) in qs.iter_mut().zip(xb) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8 as u8;
        }
        for (j, bs) in bsums.chunks_exact_mut(2).enumerate() {
            let s: i32 = qs[j * 16..j * 16 + 16]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            bs.copy_from_slice(&(s as i16).to_le_bytes());
        }
        head.copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
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

/// Scalar dot products: `n` elements of a weight row `w` against activations `a` already in the
/// weight type's [`vec_dot_type`].
pub mod scalar {
    use super::*;

    pub fn f32_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
        (0..n).map(|i| rd_f32(w, 4 * i) * rd_f32(a, 4 * i)).sum()
    }

    pub fn f16_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
        (0..n).map(|i| rd_f16(w, 2 * i) * rd_f16(a, 2 * i)).sum()
    }

    fn q8_blocks(
        n: usize,
        w: &[u8],
        wb: usize,
        a: &[u8],
        qs: impl Fn(&[u8], &mut [i32; 32]),
    ) -> f32 {
        let mut sum = 0.0f32;
        let mut q = [0i32; 32];
        for (bw, ba) in w
            .chunks_exact(wb)
            .zip(a.chunks_exact(Q8_0_BYTES))
            .take(n / QK8_0)
        {
            qs(bw, &mut q);
            let dot: i32 = q
                .iter()
                .zip(&ba[2..])
                .map(|(&x, &y)| x * (y as i8 as i32))
                .sum();
            sum += dot as f32 * (rd_f16(bw, 0) * rd_f16(ba, 0));
        }
        sum
    }

    pub fn q8_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
        q8_blocks(n, w, 34, a, |b, q| {
            for (o, &v) in q.iter_mut().zip(&b[2..34]) {
                *o = v as i8 as i32;
            }
        })
    }

    pub fn q4_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
        q8_blocks(n, w, 18, a, |b, q| {
            for j in 0..16 {
                q[j] = (b[2 + j] & 0xf) as i32 - 8;
                q[j + 16] = (b[2 + j] >> 4) as i32 - 8;
            }
        })
    }

    pub fn q5_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
        q8_blocks(n, w, 22, a, |b, q| {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let lo = (b[6 + j] & 0xf) as u32 | (((qh >> j) & 1) << 4);
                let hi = (b[6 + j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
                q[j] = lo as i32 - 16;
                q[j + 16] = hi as i32 - 16;
            }
        })
    }

    /// MXFP4: e8m0 shared exponent, 4-bit e2m1 values as doubled integers (ggml's kvalues).
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
    fn e8m0_half(e: u8) -> f32 {
        if e < 2 {
            f32::from_bits(0x0020_0000 << e)
        } else {
            f32::from_bits(((e as u32) - 1) << 23)
        }
    }

    fn q8k_parts(a: &[u8]) -> (f32, &[u8], [i32; 16]) {
        let mut bs = [0i32; 16];
        for (j, b) in bs.iter_mut().enumerate() {
            *b = i16::from_le_bytes([a[260 + 2 * j], a[261 + 2 * j]]) as i32;
        }
        (rd_f32(a, 0), &a[4..260], bs)
    }

    pub fn q4_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut sum = 0.0f32;
        for (bw, ba) in w
            .chunks_exact(144)
            .zip(a.chunks_exact(Q8_K_BYTES))
            .take(n / QK_K)
        {
            let (da, qa, bsums) = q8k_parts(ba);
            let d = rd_f16(bw, 0) * da;
            let dmin = rd_f16(bw, 2) * da;
            let scales = &bw[4..16];
            let qs = &bw[16..144];
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, scales);
                let chunk = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
                let mut dot = 0i32;
                for l in 0..32 {
                    let v = if j % 2 == 0 {
                        chunk[l] & 0xf
                    } else {
                        chunk[l] >> 4
                    };
                    dot += v as i32 * (qa[j * 32 + l] as i8 as i32);
                }
                sumi += dot * sc as i32;
                summ += m as i32 * (bsums[2 * j] + bsums[2 * j + 1]);
            }
            sum += d * sumi as f32 - dmin * summ as f32;
        }
        sum
    }

    pub fn q5_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut sum = 0.0f32;
        for (bw, ba) in w
            .chunks_exact(176)
            .zip(a.chunks_exact(Q8_K_BYTES))
            .take(n / QK_K)
        {
            let (da, qa, bsums) = q8k_parts(ba);
            let d = rd_f16(bw, 0) * da;
            let dmin = rd_f16(bw, 2) * da;
            let scales = &bw[4..16];
            let qh = &bw[16..48];
            let qs = &bw[48..176];
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, scales);
                let chunk = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
                let mut dot = 0i32;
                for l in 0..32 {
                    let lo = if j % 2 == 0 {
                        chunk[l] & 0xf
                    } else {
                        chunk[l] >> 4
                    };
                    let hi = (qh[l] >> j) & 1;
                    dot += (lo | (hi << 4)) as i32 * (qa[j * 32 + l] as i8 as i32);
                }
                sumi += dot * sc as i32;
                summ += m as i32 * (bsums[2 * j] + bsums[2 * j + 1]);
            }
            sum += d * sumi as f32 - dmin * summ as f32;
        }
        sum
    }

    pub fn q6_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut sum = 0.0f32;
        for (bw, ba) in w
            .chunks_exact(210)
            .zip(a.chunks_exact(Q8_K_BYTES))
            .take(n / QK_K)
        {
            let (da, qa, _) = q8k_parts(ba);
            let ql = &bw[0..128];
            let qh = &bw[128..192];
            let sc = &bw[192..208];
            let d = rd_f16(bw, 208) * da;
            let mut sumi = 0i32;
            for half in 0..2 {
                let ql = &ql[half * 64..];
                let qh = &qh[half * 32..];
                let sc = &sc[half * 8..];
                let qa = &qa[half * 128..];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    sumi += (sc[is] as i8 as i32) * q1 * (qa[l] as i8 as i32)
                        + (sc[is + 2] as i8 as i32) * q2 * (qa[l + 32] as i8 as i32)
                        + (sc[is + 4] as i8 as i32) * q3 * (qa[l + 64] as i8 as i32)
                        + (sc[is + 6] as i8 as i32) * q4 * (qa[l + 96] as i8 as i32);
                }
            }
            sum += d * sumi as f32;
        }
        sum
    }
}

/// Dequantizes one row of `ty` (the types the KV cache and embeddings use) into `out`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = rd_f32(c, 0);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = rd_f16(c, 0);
            }
        }
        GgmlType::Q8_0 => {
            for (ob, b) in out
                .chunks_exact_mut(QK8_0)
                .zip(src.chunks_exact(Q8_0_BYTES))
            {
                let d = rd_f16(b, 0);
                for (o, &q) in ob.iter_mut().zip(&b[2..]) {
                    *o = q as i8 as f32 * d;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (ob, b) in out.chunks_exact_mut(QK8_0).zip(src.chunks_exact(18)) {
                let d = rd_f16(b, 0);
                for j in 0..16 {
                    ob[j] = ((b[2 + j] & 0xf) as i32 - 8) as f32 * d;
                    ob[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        other => unreachable!("dequantize_row is not used for {other}"),
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
        let d = rd_f32(&out, 0);
        assert!((d - 2.0 / 127.0).abs() < 1e-7, "{d}");
        assert_eq!(out[4 + 7] as i8, -127);
        let bs0 = i16::from_le_bytes([out[260], out[261]]);
        assert_eq!(bs0 as i32, -127 + 15 * 32);
    }
}
