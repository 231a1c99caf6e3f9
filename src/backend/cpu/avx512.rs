//! AVX-512 VNNI dot products: the k-quants decode leans on (Q4_K, Q5_K against Q8_K), where one
//! `vpdpbusd` multiplies 64 weight nibbles by 64 activation bytes and sums them in fours, and the
//! Q8_0 family (Q4_0, Q5_0, Q8_0, MXFP4), where a 256-bit `vpdpbusd` replaces AVX2's
//! multiply-add pair. The quantized results equal the AVX2 kernels' bit for bit (the same eight
//! integer lane sums per block, the same float steps), as ggml's do: its x86 quantized products
//! are the same code in both builds. Its F16 and F32 products are not: built for AVX-512 they sum
//! sixteen lanes per register in another order, so [`f16_f16`] and [`f32_f32`] follow that build.
//! Each function is `unsafe` only because the caller must have detected avx512f, avx512bw and
//! avx512vnni; [`super::dot::kernel`] does that once.

use std::arch::x86_64::*;

use super::avx2::{
    e8m0_scales, f16_scales, hsum, hsum4_epi32, hsum_epi32, mxfp4_qs, q4_0_qs, q5_0_qs,
    q8_0_family, q8_0_family4, q8_0_kernels, q8_0_qs, rd_f16, rd_f16_pair, rd_f32, KFloat,
    SCALE_GROUP,
};
use super::quant::{Q8_0_BYTES, Q8_K_BYTES, QK8_0, QK_K};

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K block's 12 scale bytes, all at
/// once (the layout `scale_min_k4` reads one sub-block at a time).
#[inline(always)]
pub fn k4_scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    // sub-blocks 0-3 keep 6 bits in bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take 4
    // low bits from bytes 8-11 and their top 2 bits from the top of bytes 0-7
    let scales_lo = w0 & LOW6;
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let mins_lo = w1 & LOW6;
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    let mut s = [0u8; 8];
    let mut m = [0u8; 8];
    s[..4].copy_from_slice(&scales_lo.to_le_bytes());
    s[4..].copy_from_slice(&scales_hi.to_le_bytes());
    m[..4].copy_from_slice(&mins_lo.to_le_bytes());
    m[4..].copy_from_slice(&mins_hi.to_le_bytes());
    (s, m)
}

/// Q4_K (`wb` 144) or Q5_K (`wb` 176, `five`) blocks of one weight row against `R` rows of Q8_K
/// activations: each block's nibbles, fifth bits and scales are decoded once for the `R` rows
/// (four in prompt products, where the decode was most of a block's work). Each row's result is
/// the same with any `R`: the same integer lanes and float steps per row, in the same order.
/// The float steps per type are those of the AVX2 kernel (`super::avx2::qk_4_5` says why Q4_K's
/// differ from Q5_K's).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn qk_4_5<const R: usize>(
    n: usize,
    w: &[u8],
    wb: usize,
    a: [&[u8]; R],
    five: bool,
    order: KFloat,
) -> [f32; R] {
    let nb = n / QK_K;
    assert!(w.len() >= nb * wb && a.iter().all(|a| a.len() >= nb * Q8_K_BYTES));
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_m = [0.0f32; R];
    let mut acc_s = [0.0f32; R];
    let low4 = _mm256_set1_epi8(0x0f);
    // lanes 0-7 of a chunk's product belong to its even sub-block, 8-15 to its odd one
    let mut pick = [_mm512_setzero_si512(); 4];
    for (c, p) in pick.iter_mut().enumerate() {
        let c = c as i32;
        *p = _mm512_inserti64x4(_mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 1), 1);
    }
    let sixteen = _mm512_set1_epi8(16);
    let qs_at = if five { 48 } else { 16 };
    for i in 0..nb {
        let bw = w.as_ptr().add(i * wb);
        let (dw, dminw) = rd_f16_pair(std::slice::from_raw_parts(bw, 4), 0);
        let (sc, mn) = k4_scales_mins(std::slice::from_raw_parts(bw.add(4), 12));
        let mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
        let scales = _mm512_cvtepu8_epi32(_mm_loadl_epi64(sc.as_ptr() as *const __m128i));
        let qh = if five {
            let h = _mm256_loadu_si256(bw.add(16) as *const __m256i);
            _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1)
        } else {
            _mm512_setzero_si512()
        };
        let mut q = [_mm512_setzero_si512(); 4];
        let mut chunk_scales = [_mm512_setzero_si512(); 4];
        for c in 0..4 {
            let raw = _mm256_loadu_si256(bw.add(qs_at + 32 * c) as *const __m256i);
            let lo = _mm256_and_si256(raw, low4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            let mut v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            if five {
                // bit 2c of each qh byte is the fifth bit of the low half, 2c+1 of the high
                let bit = _mm512_inserti64x4(
                    _mm512_set1_epi8(1 << (2 * c)),
                    _mm256_set1_epi8(1 << (2 * c + 1)),
                    1,
                );
                v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(qh, bit), v, sixteen);
            }
            q[c] = v;
            chunk_scales[c] = _mm512_permutexvar_epi32(pick[c], scales);
        }
        for r in 0..R {
            let ba = a[r].as_ptr().add(i * Q8_K_BYTES);
            let da = f32::from_le_bytes(*(ba as *const [u8; 4]));
            let (d, dmin) = (dw * da, dminw * da);
            // mins times the activations' sub-block sums (pairs of the 16 stored i16 sums)
            let bsums = _mm256_loadu_si256(ba.add(4 + QK_K) as *const __m256i);
            let sub_sums = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
            let summ = hsum_epi32(_mm256_mullo_epi32(sub_sums, mins));
            let mut sumi = _mm512_setzero_si512();
            for c in 0..4 {
                let x = _mm512_loadu_si512(ba.add(4 + 64 * c) as *const __m512i);
                let dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], x);
                let pair = _mm512_mullo_epi32(dots, chunk_scales[c]);
                if order == KFloat::Pairs {
                    // this pair of sub-blocks' integers, then its two float steps
                    let p8 = _mm256_add_epi32(
                        _mm512_castsi512_si256(pair),
                        _mm512_extracti64x4_epi64(pair, 1),
                    );
                    let sub: [i32; 8] = std::mem::transmute(sub_sums);
                    let pair_m =
                        mn[2 * c] as i32 * sub[2 * c] + mn[2 * c + 1] as i32 * sub[2 * c + 1];
                    acc_s[r] = (hsum_epi32(p8) as f32).mul_add(d, acc_s[r]);
                    acc_m[r] = (pair_m as f32).mul_add(dmin, acc_m[r]);
                } else {
                    sumi = _mm512_add_epi32(sumi, pair);
                }
            }
            // lanes i and 8 + i are the two halves of the AVX2 kernel's lane i: folded, the
            // block's eight integer sums and everything after them equal that kernel's bit for bit
            let s8 = _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64(sumi, 1),
            );
            match order {
                KFloat::Lanes => {
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s8), acc[r]);
                    acc_m[r] += dmin * summ as f32;
                }
                KFloat::Blocks => {
                    acc_s[r] = (hsum_epi32(s8) as f32).mul_add(d, acc_s[r]);
                    acc_m[r] = (summ as f32).mul_add(dmin, acc_m[r]);
                }
                KFloat::Tiled => {
                    let res = (-dminw).mul_add(summ as f32, hsum_epi32(s8) as f32 * dw);
                    acc_s[r] = res.mul_add(da, acc_s[r]);
                }
                KFloat::Pairs => {}
            }
        }
    }
    match order {
        KFloat::Lanes => std::array::from_fn(|r| hsum(acc[r]) - acc_m[r]),
        KFloat::Blocks | KFloat::Pairs => std::array::from_fn(|r| acc_s[r] - acc_m[r]),
        KFloat::Tiled => acc_s,
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn q4_k_q8_k_x4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    qk_4_5(n, w, 144, a, false, KFloat::Pairs)
}

/// Four Q4_K rows each summed as the one-row kernel sums it ([`KFloat::Blocks`]): ggml's expert
/// products run every row through its one-row kernel.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn q4_k_q8_k_x4_blocks(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    qk_4_5(n, w, 144, a, false, KFloat::Blocks)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn q5_k_q8_k_x4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    qk_4_5(n, w, 176, a, true, KFloat::Lanes)
}

/// Four Q5_K rows as ggml's tiled product sums them ([`KFloat::Tiled`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn q5_k_q8_k_tiled_x4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    qk_4_5(n, w, 176, a, true, KFloat::Tiled)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn q4_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    qk_4_5(n, w, 144, [a], false, KFloat::Blocks)[0]
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn q5_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    qk_4_5(n, w, 176, [a], true, KFloat::Lanes)[0]
}

/// Unsigned bytes times signed bytes summed in fours: the same eight lanes as AVX2's
/// `maddubs` + `madd` (which cannot saturate on these operands), in one instruction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
unsafe fn dpbusd(ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy)
}

q8_0_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl", dpbusd);

thread_local! {
    /// [`q8_0_family_strip`]'s decoded weight blocks, scales and activation corrections, reused.
    #[allow(clippy::type_complexity)]
    static STRIP: std::cell::RefCell<(Vec<__m256i>, Vec<f32>, Vec<__m256i>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}

/// The Q8_0-family product of the weight rows `w` (a multiple of four) against the activation
/// rows `a` (a multiple of four), in register tiles of four rows by four tokens:
/// `*out.add(t * ld + r)` gets the one-row product of row `r` and token `t`, bit for bit.
///
/// Each row's blocks are decoded once for all the tokens, as unsigned bytes `x + offset`
/// (`qs` gives the signed values `x`). Each token block's lanes then start from
/// `-offset * (its four activations' sum)`, computed once for all the rows, so one `vpdpbusd`
/// per row and token gives the one-row kernel's integer lanes exactly (the one-row kernel
/// spends a `vpsignb` more on magnitudes and signs); the float steps are the one-row kernel's,
/// in its order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
#[allow(clippy::needless_range_loop)] // `j`, `r` and `t` index blocks, rows and scales together
#[allow(clippy::too_many_arguments)]
unsafe fn q8_0_family_strip<const BLOCKS: bool>(
    n: usize,
    w: &[&[u8]],
    (wb, offset): (usize, u8),
    a: &[&[u8]],
    (out, ld): (*mut f32, usize),
    qs: impl Fn(&[u8]) -> __m256i,
    dw: impl Fn(*const u8, usize, usize) -> __m256,
) {
    let nb = n / QK8_0;
    let nr = w.len();
    assert!(w.iter().all(|w| w.len() >= nb * wb) && a.iter().all(|a| a.len() >= nb * Q8_0_BYTES));
    assert!(nr.is_multiple_of(4) && a.len().is_multiple_of(4) && ld >= nr);
    // each row's scales padded by a group, so a group's eight lanes can always be loaded
    let stride = nb + SCALE_GROUP;
    // the body stays in this function (a closure would not carry its target features)
    // SAFETY: nothing below reaches this thread's `STRIP` again while the buffers are borrowed.
    let (dec, dws, corr, das) = &mut *STRIP.with(|c| c.as_ptr());
    dec.clear();
    dec.reserve(nr * nb);
    let off = _mm256_set1_epi8(offset as i8);
    // by row group, then block, then row within the group
    for g in w.chunks_exact(4) {
        for i in 0..nb {
            for w in g {
                let x = qs(std::slice::from_raw_parts(w.as_ptr().add(i * wb), wb));
                dec.push(_mm256_add_epi8(x, off));
            }
        }
    }
    scales_of(w, (wb, nb, stride), &dw, dws);
    let zero = _mm256_setzero_si256();
    let mut ds = [[[0f32; SCALE_GROUP]; 4]; 4];
    for (q, aq) in a.chunks_exact(4).enumerate() {
        // the four tokens' lane corrections and scales, block by block, for every row group
        corr.resize(nb * 4, zero);
        for i in 0..nb {
            for (t, a) in aq.iter().enumerate() {
                let y = _mm256_loadu_si256(a.as_ptr().add(i * Q8_0_BYTES + 2) as *const __m256i);
                corr[i * 4 + t] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, off, y));
            }
        }
        scales_of(
            aq,
            (Q8_0_BYTES, nb, stride),
            &|p, st, m| f16_scales(p, st, m),
            das,
        );
        for gi in 0..nr / 4 {
            let dec = &dec[gi * nb * 4..(gi + 1) * nb * 4];
            let mut acc = [[_mm256_setzero_ps(); 4]; 4];
            let mut acc_b = [_mm_setzero_ps(); 4];
            let mut i = 0;
            while i < nb {
                let m = (nb - i).min(SCALE_GROUP);
                let da: [__m256; 4] =
                    std::array::from_fn(|t| _mm256_loadu_ps(das.as_ptr().add(t * stride + i)));
                for r in 0..4 {
                    let dwv = _mm256_loadu_ps(dws.as_ptr().add((gi * 4 + r) * stride + i));
                    for (t, da) in da.iter().enumerate() {
                        _mm256_storeu_ps(ds[r][t].as_mut_ptr(), _mm256_mul_ps(dwv, *da));
                    }
                }
                for j in 0..m {
                    let b = i + j;
                    let y: [__m256i; 4] = std::array::from_fn(|t| {
                        _mm256_loadu_si256(aq[t].as_ptr().add(b * Q8_0_BYTES + 2) as *const __m256i)
                    });
                    let c: [__m256i; 4] = std::array::from_fn(|t| corr[b * 4 + t]);
                    for r in 0..4 {
                        let u = dec[b * 4 + r];
                        let ps: [__m256i; 4] =
                            std::array::from_fn(|t| _mm256_dpbusd_epi32(c[t], u, y[t]));
                        if BLOCKS {
                            // the four tokens' integer sums in one reduction and one fused step
                            // in four lanes (each lane's chain is the one-row kernel's)
                            let d4 =
                                _mm_setr_ps(ds[r][0][j], ds[r][1][j], ds[r][2][j], ds[r][3][j]);
                            acc_b[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(ps)), d4, acc_b[r]);
                        } else {
                            for t in 0..4 {
                                acc[r][t] = _mm256_fmadd_ps(
                                    _mm256_set1_ps(ds[r][t][j]),
                                    _mm256_cvtepi32_ps(ps[t]),
                                    acc[r][t],
                                );
                            }
                        }
                    }
                }
                i += m;
            }
            for r in 0..4 {
                let mut v = [0f32; 4];
                if BLOCKS {
                    _mm_storeu_ps(v.as_mut_ptr(), acc_b[r]);
                } else {
                    v = std::array::from_fn(|t| hsum(acc[r][t]));
                }
                for (t, v) in v.iter().enumerate() {
                    *out.add((q * 4 + t) * ld + gi * 4 + r) = *v;
                }
            }
        }
    }
}

/// The scales of the first `nb` blocks (`bytes` apart) of each of `rows`, as floats: row `r`'s
/// at `to[r * stride..]`, read eight blocks at a time by `read`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_of(
    rows: &[&[u8]],
    (bytes, nb, stride): (usize, usize, usize),
    read: &impl Fn(*const u8, usize, usize) -> __m256,
    to: &mut Vec<f32>,
) {
    to.clear();
    to.resize(rows.len() * stride, 0.0);
    for (r, row) in rows.iter().enumerate() {
        let mut i = 0;
        while i < nb {
            let m = (nb - i).min(SCALE_GROUP);
            let v = read(row.as_ptr().add(i * bytes), bytes, m);
            _mm256_storeu_ps(to.as_mut_ptr().add(r * stride + i), v);
            i += m;
        }
    }
}

/// The Q8_0-family types' [`q8_0_family_strip`]s: (name, block bytes, offset that makes the
/// values unsigned, decoder, scale reader, ggml's repacked order).
macro_rules! q8_0_strips {
    ($($name:ident, $wb:expr, $off:expr, $qs:ident, $dw:ident, $blocks:expr;)*) => {$(
        /// # Safety
        /// The VNNI level; `out` takes `a.len()` rows of `ld` floats (`w.len()` written in each).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
        pub unsafe fn $name(n: usize, w: &[&[u8]], a: &[&[u8]], out: *mut f32, ld: usize) {
            q8_0_family_strip::<$blocks>(
                n,
                w,
                ($wb, $off),
                a,
                (out, ld),
                |b| $qs(b),
                |p, stride, m| $dw(p, stride, m),
            )
        }
    )*};
}

q8_0_strips! {
    q8_0_q8_0_strip, 34, 128, q8_0_qs, f16_scales, false;
    q4_0_q8_0_strip, 18, 8, q4_0_qs, f16_scales, true;
    q5_0_q8_0_strip, 22, 16, q5_0_qs, f16_scales, false;
    mxfp4_q8_0_strip, 17, 12, mxfp4_qs, e8m0_scales, true;
}

/// ggml's F16 dot product as built for AVX-512: four accumulators of sixteen f32 lanes, 64
/// elements a step, reduced as [`hsum512_ggml`] does, the rest added in f64.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn f16_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let full = n / 64 * 64;
    let mut i = 0;
    while i < full {
        for (k, s) in acc.iter_mut().enumerate() {
            let at = 2 * (i + 16 * k);
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(at) as *const __m256i));
            let y = _mm512_cvtph_ps(_mm256_loadu_si256(a.as_ptr().add(at) as *const __m256i));
            *s = _mm512_fmadd_ps(x, y, *s);
        }
        i += 64;
    }
    let mut sum = hsum512_ggml(acc) as f64;
    for j in full..n {
        sum += (rd_f16(w, 2 * j) * rd_f16(a, 2 * j)) as f64;
    }
    sum as f32
}

/// A product in the order of llamafile's `tinyBLAS` (AVX-512 build), which ggml takes for F32 and
/// F16 weights whose rows come in fours and two or more activation rows: one 16-lane
/// accumulator, a fused multiply-add per 16 values, `load(p, mask)` reading the lanes of `mask`
/// (zero elsewhere) as floats, then `_mm512_reduce_add_ps`'s tree.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn tinyblas16<T>(
    n: usize,
    w: *const T,
    a: *const T,
    load: impl Fn(*const T, __mmask16) -> __m512,
) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut l = 0;
    while l < n {
        let m: __mmask16 = if n - l >= 16 {
            u16::MAX
        } else {
            (1u16 << (n - l)) - 1
        };
        acc = _mm512_fmadd_ps(load(w.add(l), m), load(a.add(l), m), acc);
        l += 16;
    }
    reduce_add_ps(acc)
}

/// [`tinyblas16`] of F32 weights and activations.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn f32_f32_sgemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    let load = |p: *const f32, m| _mm512_maskz_loadu_ps(m, p);
    tinyblas16(n, w.as_ptr() as *const f32, a.as_ptr() as *const f32, load)
}

/// [`tinyblas16`] of F16 weights and activations (each 16 halves converted to floats).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn f16_f16_sgemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n);
    let load = |p: *const i16, m| _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    tinyblas16(n, w.as_ptr() as *const i16, a.as_ptr() as *const i16, load)
}

/// ggml's F32 dot product as built for AVX-512 (the layout of [`f16_f16`]); the rest one
/// multiply-add at a time in f32.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn f32_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let full = n / 64 * 64;
    let mut i = 0;
    while i < full {
        for (k, s) in acc.iter_mut().enumerate() {
            let at = 4 * (i + 16 * k);
            let x = _mm512_loadu_ps(w.as_ptr().add(at) as *const f32);
            let y = _mm512_loadu_ps(a.as_ptr().add(at) as *const f32);
            *s = _mm512_fmadd_ps(x, y, *s);
        }
        i += 64;
    }
    let mut sum = hsum512_ggml(acc);
    for j in full..n {
        sum = rd_f32(w, 4 * j).mul_add(rd_f32(a, 4 * j), sum);
    }
    sum
}

/// ggml's `GGML_F32x16_REDUCE`: the accumulators summed (0 + 2, 1 + 3), then those two, then the
/// lanes halved down to one (256-bit halves, 128-bit halves, then lanes (0 + 2) + (1 + 3)), as
/// `_mm512_reduce_add_ps` does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn hsum512_ggml(acc: [__m512; 4]) -> f32 {
    reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc[0], acc[2]),
        _mm512_add_ps(acc[1], acc[3]),
    ))
}

/// `_mm512_reduce_add_ps`'s order: 256-bit halves, 128-bit halves, then (0 + 2) + (1 + 3).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn reduce_add_ps(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    let t3 = _mm256_add_ps(lo, hi);
    let t6 = _mm_add_ps(_mm256_castps256_ps128(t3), _mm256_extractf128_ps(t3, 1));
    let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
    _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
}

/// `y = f16(y + x * v)` with one rounding, as upstream's f16 loops compute it on an
/// AVX512-FP16 CPU (`vfmadd231ph`, 32 halves an instruction); `vh` is `v` as a half. `x` holds
/// little-endian halves; `y.len()` must be a multiple of 32.
///
/// # Safety
/// The CPU has AVX512-FP16 (`vec::half_arith`).
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn mad_f16_fp16(y: &mut [u16], x: &[u8], vh: u16) {
    assert!(y.len().is_multiple_of(32) && x.len() >= 2 * y.len());
    let v = _mm512_set1_epi16(vh as i16);
    for i in (0..y.len()).step_by(32) {
        let py = y.as_mut_ptr().add(i);
        let px = x.as_ptr().add(2 * i);
        // SAFETY: 32 halves at `py` and at `px`, checked above; the caller checked the CPU.
        std::arch::asm!(
            "vmovdqu16 {a}, zmmword ptr [{py}]",
            "vfmadd231ph {a}, {v}, zmmword ptr [{px}]",
            "vmovdqu16 zmmword ptr [{py}], {a}",
            py = in(reg) py,
            px = in(reg) px,
            v = in(zmm_reg) v,
            a = out(zmm_reg) _,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::quant::scale_min_k4;
    use super::*;

    #[test]
    fn all_scales_at_once_equal_one_at_a_time() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut q = [0u8; 12];
            for b in &mut q {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let (s, m) = k4_scales_mins(&q);
            for j in 0..8 {
                assert_eq!((s[j], m[j]), scale_min_k4(j, &q), "sub-block {j} of {q:?}");
            }
        }
    }
}
