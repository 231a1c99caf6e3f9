//! Elementwise helpers on half-precision vectors for attention, dispatched like the dot kernels.
//!
//! ggml's flash attention keeps its V accumulator in f16. How it rounds depends on the CPU it
//! was built for: without AVX512-FP16 each multiply-add runs in f32 and is rounded to f16; built
//! natively for a CPU with AVX512-FP16 (Sapphire Rapids and later) it runs in f16 itself, the
//! factor rounded to f16 first and each multiply-add rounded once, in blocks of 128 elements
//! (the rest as without). [`half_arith`] says which one this machine's upstream does.

use std::sync::OnceLock;

use super::dot::{isa, Isa};
use super::fa;
use crate::model::quants::{f16_to_f32, f32_to_f16};

/// Elements per block of ggml's f16 loops (`GGML_F16_STEP` with AVX512-FP16); the rest of a row
/// takes the f32 route.
pub const HALF_STEP: usize = 128;

/// Whether the f16 accumulator does its arithmetic in f16 here: AVX-512 kernels in use (not
/// capped by `BLOOMERY_CPU_ISA`) on a CPU with AVX512-FP16.
pub fn half_arith() -> bool {
    static HALF: OnceLock<bool> = OnceLock::new();
    *HALF.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            isa() == Isa::Avx512Vnni && is_x86_feature_detected!("avx512fp16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `f16(y + x * v)` rounded once, as an f16 fused multiply-add does, for `x` and `v` that are f16
/// values: `x * v` is exact in f32 (two 11-bit significands), the sum's rounding error is
/// recovered exactly (two-sum) and folded into the last bit (round to odd), so the rounding to
/// f16 is the only one that counts.
#[inline]
pub fn fma_f16_once(y: f32, x: f32, v: f32) -> u16 {
    let p = x * v;
    let s = y + p;
    let bb = s - y;
    let e = (y - (s - bb)) + (p - bb);
    let mut bits = s.to_bits();
    if e != 0.0 && bits & 1 == 0 {
        if (e > 0.0) == (s > 0.0) {
            bits += 1;
        } else {
            bits -= 1;
        }
    }
    f32_to_f16(f32::from_bits(bits))
}

/// [`fma_f16_once`] over a row; `v` is already an f16 value.
pub fn mad_f16_once_scalar(y: &mut [u16], x: &[u8], v: f32) {
    for (a, b) in y.iter_mut().zip(x.chunks_exact(2)) {
        let b = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        *a = fma_f16_once(f16_to_f32(*a), b, v);
    }
}

/// `x` holds little-endian halves.
pub fn mad_f16_scalar(y: &mut [u16], x: &[u8], v: f32) {
    for (a, b) in y.iter_mut().zip(x.chunks_exact(2)) {
        let b = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        *a = f32_to_f16(b.mul_add(v, f16_to_f32(*a)));
    }
}

pub fn scale_f16_scalar(y: &mut [u16], v: f32) {
    for a in y.iter_mut() {
        *a = f32_to_f16(f16_to_f32(*a) * v);
    }
}

/// `y = f16(y + x * v)` as this machine's upstream computes it (see the module comment).
pub fn mad_f16(y: &mut [u16], x: &[u8], v: f32) {
    if half_arith() {
        let n = y.len().min(x.len() / 2);
        let np = n / HALF_STEP * HALF_STEP;
        let (head, tail) = y[..n].split_at_mut(np);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `half_arith` detected AVX512-FP16; `np` is a multiple of 128.
        unsafe {
            super::avx512::mad_f16_fp16(head, x, f32_to_f16(v))
        };
        #[cfg(not(target_arch = "x86_64"))]
        mad_f16_once_scalar(head, x, f16_to_f32(f32_to_f16(v)));
        return mad_f16_f32(tail, &x[2 * np..], v);
    }
    mad_f16_f32(y, x, v)
}

/// `y = f16(y + x * v)` through f32: a fused multiply-add in f32, then rounded to f16.
fn mad_f16_f32(y: &mut [u16], x: &[u8], v: f32) {
    match isa() {
        // SAFETY: the features were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { super::avx2::mad_f16(y, x, v) },
        _ => mad_f16_scalar(y, x, v),
    }
}

/// `y = f16(y * v)` as this machine's upstream computes it: in f16 arithmetic the factor is
/// rounded to f16 first (the product of two f16 values is exact in f32, so rounding it once to f16
/// is what an f16 multiply gives).
pub fn scale_f16(y: &mut [u16], v: f32) {
    if half_arith() {
        let np = y.len() / HALF_STEP * HALF_STEP;
        let (head, tail) = y.split_at_mut(np);
        scale_f16_f32(head, f16_to_f32(f32_to_f16(v)));
        return scale_f16_f32(tail, v);
    }
    scale_f16_f32(y, v)
}

fn scale_f16_f32(y: &mut [u16], v: f32) {
    match isa() {
        // SAFETY: the features were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { super::avx2::scale_f16(y, v) },
        _ => scale_f16_scalar(y, v),
    }
}

/// Little-endian halves to floats (exact either way).
pub fn f16_to_f32_slice(src: &[u8], dst: &mut [f32]) {
    match isa() {
        // SAFETY: the features were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { super::avx2::f16_to_f32_slice(src, dst) },
        _ => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

/// ggml's GELU times `up` (`ggml_vec_geglu_f32`): `gate` at or below -10 gives 0, at or above 10
/// itself times `up`, between through `table` (65,536 f16 results indexed by the input rounded
/// to f16, plus one padding entry) times `up`.
pub fn gelu_mul(table: &[u16], gate: &mut [f32], up: &[f32]) {
    assert!(
        table.len() > u16::MAX as usize + 1,
        "the table carries a padding entry"
    );
    assert_eq!(gate.len(), up.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa() != Isa::Scalar {
        // SAFETY: the ISA check found avx2 and f16c; the table's length was checked above.
        done = unsafe { gelu_mul_f16c(table, gate, up) };
    }
    for (g, &u) in gate[done..].iter_mut().zip(&up[done..]) {
        *g = gelu_one(table, *g, u);
    }
}

#[inline]
fn gelu_one(table: &[u16], x: f32, u: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x * u
    } else {
        f16_to_f32(table[f32_to_f16(x) as usize]) * u
    }
}

/// Eight at a time: F16C's rounding to f16 (to nearest, even on ties, as ggml's conversion), a
/// gather from the table and F16C back. Returns how many elements it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_mul_f16c(table: &[u16], gate: &mut [f32], up: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = gate.len() / 8 * 8;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mask16 = _mm256_set1_epi32(0xffff);
    for i in (0..n).step_by(8) {
        let x = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        let idx = _mm256_cvtepu16_epi32(h);
        // 32 bits at byte 2 * idx: the entry in the low half (the padding entry keeps the last
        // read inside the table)
        let g32 = _mm256_and_si256(
            _mm256_i32gather_epi32::<2>(table.as_ptr() as *const i32, idx),
            mask16,
        );
        let halves = _mm_packus_epi32(
            _mm256_castsi256_si128(g32),
            _mm256_extracti128_si256::<1>(g32),
        );
        let y = _mm256_mul_ps(_mm256_cvtph_ps(halves), u);
        let big = _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi);
        let y = _mm256_blendv_ps(y, _mm256_mul_ps(x, u), big);
        let small = _mm256_cmp_ps::<_CMP_LE_OQ>(x, lo);
        let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), small);
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), y);
    }
    n
}

/// ggml's SiLU times `up` (`ggml_vec_swiglu_f32`, one row): `gate = gate / (1 + exp(-gate)) *
/// up`, whole vectors (16 lanes in an AVX-512 build, 8 in an AVX2 one) through ggml's vector
/// `exp`, the row's last values through libm's `expf`. `gate` is one row: the vectors start at
/// its first value.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let flavor = fa::exp_flavor();
    let body = gate.len() / flavor.lanes() * flavor.lanes();
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if flavor == fa::ExpFlavor::Avx512 {
        // SAFETY: the flavor is Avx512 only where avx512f and avx512dq were detected.
        unsafe { fa::silu_mul_avx512(&mut gate[..body], &up[..body]) };
        done = body;
    }
    for (g, &u) in gate[done..body].iter_mut().zip(&up[done..body]) {
        *g = *g / (1.0 + flavor.expf_lane(0.0 - *g)) * u;
    }
    for (g, &u) in gate[body..].iter_mut().zip(&up[body..]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(test)]
mod tests {
    /// The vector body equals ggml's lanes one at a time, the tail is libm's, and both are SiLU
    /// to a few ulps.
    #[test]
    fn silu_vectors_are_ggml_lanes() {
        let x: Vec<f32> = (0..16 * 300 + 11)
            .map(|i| (i as f32 - 2400.0) * 0.0371)
            .chain([-120.0, 95.0, 0.0, -0.0, 1e-30])
            .collect();
        let up: Vec<f32> = (0..x.len()).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect();
        let mut got = x.clone();
        super::silu_mul(&mut got, &up);
        let flavor = super::fa::exp_flavor();
        let body = x.len() / flavor.lanes() * flavor.lanes();
        for i in 0..x.len() {
            let e = if i < body {
                flavor.expf_lane(-x[i])
            } else {
                (-x[i]).exp()
            };
            let want = x[i] / (1.0 + e) * up[i];
            assert_eq!(got[i].to_bits(), want.to_bits(), "x = {}", x[i]);
            let exact = (x[i] as f64 / (1.0 + (-x[i] as f64).exp()) * up[i] as f64) as f32;
            assert!(
                (got[i] - exact).abs() <= 1e-6 * exact.abs().max(1e-30),
                "x = {}",
                x[i]
            );
        }
    }

    #[test]
    fn gelu_vector_equals_one_at_a_time() {
        // a table whose entries differ by index, so a wrong index shows
        let table: Vec<u16> = (0..=u16::MAX as u32 + 1)
            .map(|i| (i * 7919 % 31744) as u16)
            .collect();
        let mut x: Vec<f32> = (0..70_000)
            .map(|i| (i as f32 - 35_000.0) * 3.3e-4)
            .collect();
        x.extend([
            -10.0, 10.0, -10.5, 11.0, 65504.0, 1e-7, -1e-8, 0.0, -0.0, 9.999, -9.999,
        ]);
        let up: Vec<f32> = (0..x.len())
            .map(|i| ((i % 13) as f32 - 6.0) * 0.25)
            .collect();
        let mut got = x.clone();
        super::gelu_mul(&table, &mut got, &up);
        for i in 0..x.len() {
            let want = super::gelu_one(&table, x[i], up[i]);
            assert_eq!(got[i].to_bits(), want.to_bits(), "x = {}", x[i]);
        }
    }

    use super::*;

    #[test]
    fn simd_matches_scalar() {
        let x: Vec<u8> = (0..37)
            .flat_map(|i| f32_to_f16(i as f32 * 0.37 - 5.0).to_le_bytes())
            .collect();
        let mut a: Vec<u16> = (0..37)
            .map(|i| f32_to_f16(i as f32 * -0.11 + 1.0))
            .collect();
        let mut b = a.clone();
        mad_f16_f32(&mut a, &x, 0.3);
        mad_f16_scalar(&mut b, &x, 0.3);
        assert_eq!(a, b);
        scale_f16_f32(&mut a, 0.7);
        scale_f16_scalar(&mut b, 0.7);
        assert_eq!(a, b);
        let mut fast = vec![0.0f32; 37];
        f16_to_f32_slice(&x, &mut fast);
        for (f, h) in fast.iter().zip(x.chunks_exact(2)) {
            assert_eq!(
                f.to_bits(),
                f16_to_f32(u16::from_le_bytes([h[0], h[1]])).to_bits()
            );
        }
    }

    /// The f16 value nearest `r` (ties to the even bit pattern), found by search: the reference
    /// the round-once multiply-add is held to.
    fn nearest_f16(r: f64) -> u16 {
        let guess = f32_to_f16(r as f32);
        let mut best = guess;
        for d in [-2i32, -1, 1, 2] {
            let c = (guess as i32 + d) as u16;
            if c & 0x7c00 == 0x7c00 || (c ^ guess) & 0x8000 != 0 && c & 0x7fff != 0 {
                continue;
            }
            let (dc, db) = (
                (f16_to_f32(c) as f64 - r).abs(),
                (f16_to_f32(best) as f64 - r).abs(),
            );
            if dc < db || dc == db && c & 1 == 0 {
                best = c;
            }
        }
        best
    }

    #[test]
    fn half_fma_rounds_once() {
        // exactly below a tie between two halves: f32 alone lands on the tie and rounds to even
        let (y, x, v) = (
            1.0 - 2f32.powi(-11),
            2f32.powi(-12) * (1.0 + 2f32.powi(-10)),
            1.0 - 2f32.powi(-10),
        );
        assert_eq!(f32_to_f16(y + x * v), 0x3c00, "the f32 route rounds twice");
        assert_eq!(fma_f16_once(y, x, v), 0x3bff);
        // pseudo-random halves across the range, subnormals and sign changes included
        let mut next = finite_halves();
        for _ in 0..200_000 {
            let (y, x) = (f16_to_f32(next() & 0xbfff), f16_to_f32(next() & 0xbfff));
            let v = f16_to_f32(next() & 0xbbff);
            let exact = y as f64 + x as f64 * v as f64;
            if exact.abs() > 65504.0 {
                continue;
            }
            assert_eq!(fma_f16_once(y, x, v), nearest_f16(exact), "{y} + {x} * {v}");
        }
    }

    /// Pseudo-random finite halves (an infinity or NaN pattern becomes 1.0), every bit random.
    fn finite_halves() -> impl FnMut() -> u16 {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let h = (state & 0xffff) as u16;
            if h & 0x7c00 == 0x7c00 {
                0x3c00
            } else {
                h
            }
        }
    }

    /// The AVX512-FP16 kernel rounds each `y + x * v` once, as the reference does, over random
    /// halves below 2 in magnitude (`v` below 1), subnormals included, so every sum is finite
    /// (the reference is checked against exact arithmetic above, on the same ranges).
    #[test]
    fn half_mad_fp16_matches_scalar() {
        #[cfg(target_arch = "x86_64")]
        if half_arith() {
            let mut next = finite_halves();
            for _ in 0..200 {
                let n = 2 * HALF_STEP;
                let x: Vec<u8> = (0..n)
                    .flat_map(|_| (next() & 0xbfff).to_le_bytes())
                    .collect();
                let mut a: Vec<u16> = (0..n).map(|_| next() & 0xbfff).collect();
                let mut b = a.clone();
                let vh = next() & 0xbbff;
                // SAFETY: `half_arith` detected AVX512-FP16; n is a multiple of 32.
                unsafe { crate::backend::cpu::avx512::mad_f16_fp16(&mut a, &x, vh) };
                mad_f16_once_scalar(&mut b, &x, f16_to_f32(vh));
                assert_eq!(a, b);
            }
        }
    }
}
