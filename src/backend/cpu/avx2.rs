//! AVX2 + FMA dot products, the same products as `model::quants::vec_dot_ref` with the integer
//! sums done in SIMD. Each function is `unsafe` only because the caller must have detected the
//! features; [`super::dot::kernel`] does that once.

use std::arch::x86_64::*;

use super::quant::{e8m0_half, scale_min_k4, Q8_0_BYTES, Q8_K_BYTES, QK8_0, QK_K};
use crate::model::quants::f16_to_f32;

/// The half at byte `at`, converted by F16C (exact, as `f16_to_f32`; the software conversion
/// was most of a Q8_0 block's cost).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rd_f16(b: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// The two halves at bytes `at..at + 4` (a K-quant block's `d` and `dmin`), converted by one
/// F16C instruction from a whole-register move, so the conversion waits on nothing else.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rd_f16_pair(b: &[u8], at: usize) -> (f32, f32) {
    let both = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let f = _mm_cvtph_ps(_mm_cvtsi32_si128(both as i32));
    (_mm_cvtss_f32(f), _mm_cvtss_f32(_mm_movehdup_ps(f)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(b: &[u8], at: usize) -> __m256i {
    debug_assert!(at + 32 <= b.len());
    _mm256_loadu_si256(b.as_ptr().add(at) as *const __m256i)
}

/// 16 packed nibbles -> 32 bytes: low nibbles first, then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(b: &[u8], at: usize) -> __m256i {
    debug_assert!(at + 16 <= b.len());
    let q = _mm_loadu_si128(b.as_ptr().add(at) as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// 32 bits -> 32 bytes, 0xff where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let spread = _mm256_shuffle_epi8(v, shuf);
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, mask), _mm256_set1_epi64x(-1))
}

/// Blocks whose scales are converted together: one F16C conversion of eight halves instead of
/// eight. Converting one half at a time let LLVM insert each half into whatever register was
/// free (`vpinsrw`), the accumulator included, which chained every block's scale behind the
/// previous block's sum: Q8_0 decode ran at half the memory's speed.
pub(super) const SCALE_GROUP: usize = 8;

/// The f16 at byte 0 of each of `m` (at most 8) blocks `stride` bytes apart from `p`, as eight
/// floats (lanes from `m` on are 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_scales(p: *const u8, stride: usize, m: usize) -> __m256 {
    let mut h = [0u16; SCALE_GROUP];
    for (j, v) in h.iter_mut().enumerate().take(m) {
        *v = (p.add(j * stride) as *const u16).read_unaligned();
    }
    _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
}

/// The E8M0 scale at byte 0 of each of `m` (at most 8) blocks `stride` bytes apart from `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn e8m0_scales(p: *const u8, stride: usize, m: usize) -> __m256 {
    let mut f = [0f32; SCALE_GROUP];
    for (j, v) in f.iter_mut().enumerate().take(m) {
        *v = e8m0_half(*p.add(j * stride));
    }
    _mm256_loadu_ps(f.as_ptr())
}

/// The Q8_0-family product: `qs` decodes a weight block's 32 signed values, `dw` reads the
/// scales of up to eight consecutive blocks ([`f16_scales`] or [`e8m0_scales`]), and `mul` sums
/// the products of unsigned magnitudes and sign-carrying activations in fours into eight i32
/// lanes ([`madd_u8_i8`] here; `vpdpbusd` gives the same lanes on VNNI machines). Each block
/// adds `dw * da * lanes` to one accumulator, in block order, whose lanes are summed at the end
/// (ggml's dot product); with `BLOCKS`, each block's lanes are summed first (exact: integers)
/// and `sum * (dw * da)` is added to one float in a fused multiply-add (ggml's repacked
/// `*_8x8_q8_0` kernels, which x86 builds use for Q4_0, IQ4_NL and MXFP4 rows in eights).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_family<const BLOCKS: bool>(
    n: usize,
    w: &[u8],
    wb: usize,
    a: &[u8],
    qs: impl Fn(&[u8]) -> __m256i,
    dw: impl Fn(*const u8, usize, usize) -> __m256,
    mul: impl Fn(__m256i, __m256i) -> __m256i,
) -> f32 {
    let nb = n / QK8_0;
    assert!(w.len() >= nb * wb && a.len() >= nb * Q8_0_BYTES);
    let mut acc = _mm256_setzero_ps();
    let mut acc_b = 0f32;
    let mut ds = [0f32; SCALE_GROUP];
    let mut i = 0;
    while i < nb {
        let m = (nb - i).min(SCALE_GROUP);
        let d = _mm256_mul_ps(
            dw(w.as_ptr().add(i * wb), wb, m),
            f16_scales(a.as_ptr().add(i * Q8_0_BYTES), Q8_0_BYTES, m),
        );
        _mm256_storeu_ps(ds.as_mut_ptr(), d);
        let mut ps = [_mm256_setzero_si256(); SCALE_GROUP];
        for (j, &d) in ds.iter().enumerate().take(m) {
            let bw = std::slice::from_raw_parts(w.as_ptr().add((i + j) * wb), wb);
            let ba = std::slice::from_raw_parts(a.as_ptr().add((i + j) * Q8_0_BYTES), Q8_0_BYTES);
            let x = qs(bw);
            let p = mul(_mm256_sign_epi8(x, x), _mm256_sign_epi8(load(ba, 2), x));
            if BLOCKS {
                ps[j] = p;
            } else {
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
            }
        }
        if BLOCKS {
            // the blocks' integer sums four at a time, then one fused step per block in order
            let mut sums = [0f32; SCALE_GROUP];
            _mm_storeu_ps(
                sums.as_mut_ptr(),
                _mm_cvtepi32_ps(hsum4_epi32([ps[0], ps[1], ps[2], ps[3]])),
            );
            if m > 4 {
                _mm_storeu_ps(
                    sums.as_mut_ptr().add(4),
                    _mm_cvtepi32_ps(hsum4_epi32([ps[4], ps[5], ps[6], ps[7]])),
                );
            }
            for (s, d) in sums.iter().zip(&ds).take(m) {
                acc_b = s.mul_add(*d, acc_b);
            }
        }
        i += m;
    }
    if BLOCKS {
        acc_b
    } else {
        hsum(acc)
    }
}

/// [`q8_0_family`] of one weight row against four activation rows, each weight block decoded
/// once for the four; each result equals the one-row product bit for bit (the same operations
/// per row, in the same order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_family4<const BLOCKS: bool>(
    n: usize,
    w: &[u8],
    wb: usize,
    a: [&[u8]; 4],
    qs: impl Fn(&[u8]) -> __m256i,
    dw: impl Fn(*const u8, usize, usize) -> __m256,
    mul: impl Fn(__m256i, __m256i) -> __m256i,
) -> [f32; 4] {
    let nb = n / QK8_0;
    assert!(w.len() >= nb * wb && a.iter().all(|a| a.len() >= nb * Q8_0_BYTES));
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_b = _mm_setzero_ps();
    let mut ds = [[0f32; SCALE_GROUP]; 4];
    let mut i = 0;
    while i < nb {
        let m = (nb - i).min(SCALE_GROUP);
        let dwv = dw(w.as_ptr().add(i * wb), wb, m);
        for (d, a) in ds.iter_mut().zip(a) {
            let da = f16_scales(a.as_ptr().add(i * Q8_0_BYTES), Q8_0_BYTES, m);
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(dwv, da));
        }
        for j in 0..m {
            let bw = std::slice::from_raw_parts(w.as_ptr().add((i + j) * wb), wb);
            let x = qs(bw);
            let ax = _mm256_sign_epi8(x, x);
            let mut ps = [_mm256_setzero_si256(); 4];
            for (t, (a, d)) in a.iter().zip(&ds).enumerate() {
                let ba =
                    std::slice::from_raw_parts(a.as_ptr().add((i + j) * Q8_0_BYTES), Q8_0_BYTES);
                let p = mul(ax, _mm256_sign_epi8(load(ba, 2), x));
                if BLOCKS {
                    ps[t] = p;
                } else {
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d[j]), _mm256_cvtepi32_ps(p), acc[t]);
                }
            }
            if BLOCKS {
                // one lane per token: each lane's own fused step, as one at a time
                let d4 = _mm_setr_ps(ds[0][j], ds[1][j], ds[2][j], ds[3][j]);
                acc_b = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(ps)), d4, acc_b);
            }
        }
        i += m;
    }
    if BLOCKS {
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), acc_b);
        out
    } else {
        [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
    }
}

/// Unsigned bytes times signed bytes, summed in pairs then quads: eight i32 lanes (no pair can
/// saturate: magnitudes are at most 128 and activations at most 127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn madd_u8_i8(ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_qs(b: &[u8]) -> __m256i {
    load(b, 2)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_qs(b: &[u8]) -> __m256i {
    _mm256_sub_epi8(nibbles(b, 2), _mm256_set1_epi8(8))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_qs(b: &[u8]) -> __m256i {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    _mm256_sub_epi8(_mm256_or_si256(nibbles(b, 6), hi), _mm256_set1_epi8(16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mxfp4_qs(b: &[u8]) -> __m256i {
    let table = _mm256_setr_epi8(
        0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8, 12, 0, -1,
        -2, -3, -4, -6, -8, -12,
    );
    _mm256_shuffle_epi8(table, nibbles(b, 1))
}

/// The Q8_0-activation weight types' kernels at one instruction level (its target features and
/// lane product, `madd_u8_i8` here and `dpbusd` for VNNI): one table of block bytes, quant
/// decoder and scale reader serves the one-row and four-token products of both levels (the
/// VNNI level's tiles are `avx512::q8_0_family_strip`). The item names in the body resolve where the macro is used.
macro_rules! q8_0_kernels {
    ($feat:literal, $mul:ident) => {
        q8_0_kernels! {
            @each $feat, $mul;
            // the last field: ggml's repacked order (`q8_0_family`'s BLOCKS)
            q8_0_q8_0, q8_0_q8_0_x4, 34, q8_0_qs, f16_scales, false;
            q4_0_q8_0, q4_0_q8_0_x4, 18, q4_0_qs, f16_scales, true;
            q5_0_q8_0, q5_0_q8_0_x4, 22, q5_0_qs, f16_scales, false;
            mxfp4_q8_0, mxfp4_q8_0_x4, 17, mxfp4_qs, e8m0_scales, true;
        }
    };
    (@each $feat:literal, $mul:ident; $($one:ident, $four:ident, $wb:expr, $qs:ident, $dw:ident, $blocks:expr;)*) => {$(
        #[target_feature(enable = $feat)]
        pub unsafe fn $one(n: usize, w: &[u8], a: &[u8]) -> f32 {
            q8_0_family::<$blocks>(
                n,
                w,
                $wb,
                a,
                |b| $qs(b),
                |p, stride, m| $dw(p, stride, m),
                |x, y| $mul(x, y),
            )
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn $four(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            q8_0_family4::<$blocks>(
                n,
                w,
                $wb,
                a,
                |b| $qs(b),
                |p, stride, m| $dw(p, stride, m),
                |x, y| $mul(x, y),
            )
        }

    )*};
}
pub(super) use q8_0_kernels;

q8_0_kernels!("avx2,fma,f16c", madd_u8_i8);

#[inline]
fn bsums(a: &[u8]) -> [i32; 16] {
    let mut bs = [0i32; 16];
    for (j, b) in bs.iter_mut().enumerate() {
        *b = i16::from_le_bytes([a[260 + 2 * j], a[261 + 2 * j]]) as i32;
    }
    bs
}

#[inline]
pub(super) fn rd_f32(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The eight lanes' sums of four vectors, one per lane of the result (exact: integers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum4_epi32(p: [__m256i; 4]) -> __m128i {
    let a = _mm256_hadd_epi32(p[0], p[1]);
    let b = _mm256_hadd_epi32(p[2], p[3]);
    let c = _mm256_hadd_epi32(a, b);
    _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1))
}

/// The eight lanes' sum (exact: integers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
}

/// How a K-quant product turns its integer sums into floats: the float steps are part of the
/// result, and ggml's differ by type and by path on x86.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KFloat {
    /// ggml's dot product (Q5_K): eight lane sums per block scaled into eight accumulators,
    /// summed at the end; the mins' term in a plain multiply-add.
    Lanes,
    /// ggml's repacked one-row kernel (`gemv`, Q4_K; every row of an expert product): a block's
    /// integers summed first, then `sum * (d * da)` into one accumulator and `mins * (dmin * da)`
    /// into another, a fused multiply-add each, the second subtracted at the end.
    Blocks,
    /// ggml's repacked four-row kernel (`gemm`, Q4_K; a prompt's rows in fours): as `Blocks`, one
    /// step per pair of sub-blocks (64 values) instead of per block.
    Pairs,
    /// ggml's tiled K-quant product (Q5_K, Q6_K; products of 8 or more rows): a block's integers
    /// summed first, `sum * dw`, less `dmin * mins` in one fused step (Q5_K), then added to one
    /// accumulator times `da` in another.
    Tiled,
}

/// Q4_K and Q5_K share their scale layout; `five` adds Q5_K's fifth bits; `order` picks the
/// float steps ([`KFloat`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_4_5(n: usize, w: &[u8], wb: usize, a: &[u8], five: bool, order: KFloat) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = 0.0f32;
    let mut acc_s = 0.0f32;
    for (bw, ba) in w
        .chunks_exact(wb)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let da = rd_f32(ba, 0);
        let (dw, dminw) = rd_f16_pair(bw, 0);
        let (d, dmin) = (dw * da, dminw * da);
        let scales = &bw[4..16];
        let bs = bsums(ba);
        let qs_at = if five { 48 } else { 16 };
        let qh = if five {
            load(bw, 16)
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = _mm256_setzero_si256();
        let mut summ = 0i32;
        for c in 0..4 {
            let raw = load(bw, qs_at + 32 * c);
            let mut lo = _mm256_and_si256(raw, _mm256_set1_epi8(0x0f));
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
            if five {
                // bit 2c of each qh byte belongs to `lo`, bit 2c+1 to `hi`
                let m_lo = _mm256_set1_epi8(1 << (2 * c));
                let m_hi = _mm256_set1_epi8(1 << (2 * c + 1));
                let b_lo = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m_lo), m_lo);
                let b_hi = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m_hi), m_hi);
                lo = _mm256_or_si256(lo, _mm256_and_si256(b_lo, _mm256_set1_epi8(16)));
                hi = _mm256_or_si256(hi, _mm256_and_si256(b_hi, _mm256_set1_epi8(16)));
            }
            let (s0, m0) = scale_min_k4(2 * c, scales);
            let (s1, m1) = scale_min_k4(2 * c + 1, scales);
            let p0 = _mm256_maddubs_epi16(lo, load(ba, 4 + 64 * c));
            let p1 = _mm256_maddubs_epi16(hi, load(ba, 4 + 64 * c + 32));
            let pair = _mm256_add_epi32(
                _mm256_madd_epi16(p0, _mm256_set1_epi16(s0 as i16)),
                _mm256_madd_epi16(p1, _mm256_set1_epi16(s1 as i16)),
            );
            let pair_m = m0 as i32 * (bs[4 * c] + bs[4 * c + 1])
                + m1 as i32 * (bs[4 * c + 2] + bs[4 * c + 3]);
            if order == KFloat::Pairs {
                acc_s = (hsum_epi32(pair) as f32).mul_add(d, acc_s);
                acc_m = (pair_m as f32).mul_add(dmin, acc_m);
            } else {
                sumi = _mm256_add_epi32(sumi, pair);
                summ += pair_m;
            }
        }
        match order {
            KFloat::Lanes => {
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
                acc_m += dmin * summ as f32;
            }
            KFloat::Blocks => {
                acc_s = (hsum_epi32(sumi) as f32).mul_add(d, acc_s);
                acc_m = (summ as f32).mul_add(dmin, acc_m);
            }
            KFloat::Tiled => {
                let res = (-dminw).mul_add(summ as f32, hsum_epi32(sumi) as f32 * dw);
                acc_s = res.mul_add(da, acc_s);
            }
            KFloat::Pairs => {}
        }
    }
    match order {
        KFloat::Lanes => hsum(acc) - acc_m,
        KFloat::Blocks | KFloat::Pairs => acc_s - acc_m,
        KFloat::Tiled => acc_s,
    }
}

/// One Q4_K row as ggml's repacked one-row kernel sums it ([`KFloat::Blocks`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    qk_4_5(n, w, 144, a, false, KFloat::Blocks)
}

/// One Q4_K row as ggml's repacked four-row kernel sums each of its rows ([`KFloat::Pairs`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_k_q8_k_pairs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    qk_4_5(n, w, 144, a, false, KFloat::Pairs)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    qk_4_5(n, w, 176, a, true, KFloat::Lanes)
}

/// Q6_K blocks of one weight row against `R` rows of Q8_K activations: each block's six-bit
/// values are assembled once for the `R` rows. Each row's result is the same with any `R` (the
/// same integer lanes and float steps per row, in the same order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_rows<const R: usize>(n: usize, w: &[u8], a: [&[u8]; R], order: KFloat) -> [f32; R] {
    let nb = n / QK_K;
    assert!(w.len() >= nb * 210 && a.iter().all(|a| a.len() >= nb * Q8_K_BYTES));
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_s = [0.0f32; R];
    let m4 = _mm256_set1_epi8(0x0f);
    for (b, bw) in w.chunks_exact(210).take(nb).enumerate() {
        let ba: [&[u8]; R] = std::array::from_fn(|r| &a[r][b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES]);
        // the half ends the block: read with the two bytes before it (the last scales), so the
        // conversion starts from a whole-register move (see `rd_f16_pair`)
        let dw = rd_f16_pair(bw, 206).1;
        let sc = &bw[192..208];
        // the values' offset of 32, as ggml takes it: lane k of the sums loses 32 times the
        // activation sums of sixteen-value groups 2k and 2k+1 times their scales (which lane
        // takes it changes the float steps that follow)
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        let corr: [__m256i; R] = std::array::from_fn(|r| {
            _mm256_slli_epi32(_mm256_madd_epi16(load(ba[r], 4 + QK_K), scales16), 5)
        });
        let mut sumi = [_mm256_setzero_si256(); R];
        for half in 0..2 {
            let ql0 = load(bw, half * 64);
            let ql1 = load(bw, half * 64 + 32);
            let qh = load(bw, 128 + half * 32);
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0c)), 2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), _mm256_set1_epi8(0x30)),
                ),
            ];
            for (k, qk) in q.iter().enumerate() {
                let s_lo = sc[half * 8 + 2 * k] as i8 as i16;
                let s_hi = sc[half * 8 + 2 * k + 1] as i8 as i16;
                let scales = _mm256_set_m128i(_mm_set1_epi16(s_hi), _mm_set1_epi16(s_lo));
                for (s, ba) in sumi.iter_mut().zip(&ba) {
                    let p = _mm256_maddubs_epi16(*qk, load(ba, 4 + half * 128 + 32 * k));
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, scales));
                }
            }
        }
        for r in 0..R {
            let da = rd_f32(ba[r], 0);
            let total = _mm256_sub_epi32(sumi[r], corr[r]);
            if order == KFloat::Tiled {
                let res = hsum_epi32(total) as f32 * dw;
                acc_s[r] = res.mul_add(da, acc_s[r]);
            } else {
                let d = dw * da;
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(total), acc[r]);
            }
        }
    }
    if order == KFloat::Tiled {
        acc_s
    } else {
        std::array::from_fn(|r| hsum(acc[r]))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q6_k_rows(n, w, [a], KFloat::Lanes)[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k_q8_k_x4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    q6_k_rows(n, w, a, KFloat::Lanes)
}

/// One Q6_K row as ggml's tiled product of 8 or more rows sums it ([`KFloat::Tiled`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k_q8_k_tiled(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q6_k_rows(n, w, [a], KFloat::Tiled)[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k_q8_k_tiled_x4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    q6_k_rows(n, w, a, KFloat::Tiled)
}

/// One Q5_K row as ggml's tiled product of 8 or more rows sums it ([`KFloat::Tiled`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_k_q8_k_tiled(n: usize, w: &[u8], a: &[u8]) -> f32 {
    qk_4_5(n, w, 176, a, true, KFloat::Tiled)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let full = n / 32 * 32;
    let mut i = 0;
    while i < full {
        for (k, s) in acc.iter_mut().enumerate() {
            let at = 2 * (i + 8 * k);
            let x = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(at) as *const __m128i));
            let y = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(at) as *const __m128i));
            *s = _mm256_fmadd_ps(x, y, *s);
        }
        i += 32;
    }
    // the rest in f64, each product rounded to f32 first (exact for two halves)
    let mut sum = hsum_ggml(acc) as f64;
    for j in full..n {
        sum += (rd_f16(w, 2 * j) * rd_f16(a, 2 * j)) as f64;
    }
    sum as f32
}

/// ggml's `GGML_F32x8_REDUCE` for an AVX2 build: the four accumulators summed (0 + 2, 1 + 3),
/// then those two, then the two 128-bit halves, then two horizontal adds. The order is part of
/// the result: [`f16_f16`] and [`f32_f32`] keep it so their sums equal upstream's bit for bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ggml(acc: [__m256; 4]) -> f32 {
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// Little-endian halves to floats, eight at a time with F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_to_f32_slice(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        dst[j] = f16_to_f32(u16::from_le_bytes([src[2 * j], src[2 * j + 1]]));
    }
}

/// A product in the order of llamafile's `tinyBLAS` (AVX2 build), which ggml takes for F32 and
/// F16 weights whose rows come in fours and two or more activation rows: one 8-lane accumulator,
/// a fused multiply-add per 8 values (`load` reads 8 elements as floats; the last ones are
/// zero-padded), then its `hsum`: halves added, then (0 + 2) + (1 + 3).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tinyblas8<T: Copy + Default>(
    n: usize,
    w: *const T,
    a: *const T,
    load: impl Fn(*const T) -> __m256,
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut l = 0;
    while l + 8 <= n {
        acc = _mm256_fmadd_ps(load(w.add(l)), load(a.add(l)), acc);
        l += 8;
    }
    if l < n {
        let (mut x, mut y) = ([T::default(); 8], [T::default(); 8]);
        x[..n - l].copy_from_slice(std::slice::from_raw_parts(w.add(l), n - l));
        y[..n - l].copy_from_slice(std::slice::from_raw_parts(a.add(l), n - l));
        acc = _mm256_fmadd_ps(load(x.as_ptr()), load(y.as_ptr()), acc);
    }
    let x = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

/// [`tinyblas8`] of F32 weights and activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_f32_sgemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    let load = |p: *const f32| _mm256_loadu_ps(p);
    tinyblas8(n, w.as_ptr() as *const f32, a.as_ptr() as *const f32, load)
}

/// [`tinyblas8`] of F16 weights and activations (each 8 halves converted to floats).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_f16_sgemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n);
    let load = |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
    tinyblas8(n, w.as_ptr() as *const u16, a.as_ptr() as *const u16, load)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let full = n / 32 * 32;
    let mut i = 0;
    while i < full {
        for (k, s) in acc.iter_mut().enumerate() {
            let at = 4 * (i + 8 * k);
            let x = _mm256_loadu_ps(w.as_ptr().add(at) as *const f32);
            let y = _mm256_loadu_ps(a.as_ptr().add(at) as *const f32);
            *s = _mm256_fmadd_ps(x, y, *s);
        }
        i += 32;
    }
    // the rest one multiply-add at a time, as ggml's compiler contracts `sum += x * y`
    let mut sum = hsum_ggml(acc);
    for j in full..n {
        sum = rd_f32(w, 4 * j).mul_add(rd_f32(a, 4 * j), sum);
    }
    sum
}

/// `y = f16(y + x * v)` elementwise, halves in and out, with one rounding per element as ggml's
/// F16 flash-attention accumulator does.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad_f16(y: &mut [u16], x: &[u8], v: f32) {
    let n = y.len().min(x.len() / 2);
    let full = n / 8 * 8;
    let vv = _mm256_set1_ps(v);
    let mut i = 0;
    while i < full {
        let py = y.as_mut_ptr().add(i) as *mut __m128i;
        let yf = _mm256_cvtph_ps(_mm_loadu_si128(py));
        let xf = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(2 * i) as *const __m128i));
        let r = _mm256_fmadd_ps(xf, vv, yf);
        _mm_storeu_si128(py, _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
        i += 8;
    }
    super::vec::mad_f16_scalar(&mut y[full..n], &x[2 * full..2 * n], v);
}

/// `y = f16(y * v)` elementwise.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_f16(y: &mut [u16], v: f32) {
    let full = y.len() / 8 * 8;
    let vv = _mm256_set1_ps(v);
    let mut i = 0;
    while i < full {
        let py = y.as_mut_ptr().add(i) as *mut __m128i;
        let r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(py)), vv);
        _mm_storeu_si128(py, _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
        i += 8;
    }
    super::vec::scale_f16_scalar(&mut y[full..], v);
}
