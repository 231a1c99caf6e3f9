//! The float steps of ggml's CPU flash attention for long ubatches (its tiled path): a
//! multiply-add chain per output element for the two products, ggml's vector `exp` and its
//! softmax sums. Each is lane-wise or has a fixed reduction order, so the results here are
//! ggml's bit for bit whatever vector width computes them; the AVX-512 bodies are for speed.

use std::sync::OnceLock;

use super::dot::{isa, Isa};

/// Which of ggml's `ggml_v_expf` and softmax reductions the machine's native build compiles:
/// the AVX-512 one (with AVX512F and AVX512DQ) or the AVX2 one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpFlavor {
    Avx512,
    Avx2,
}

impl ExpFlavor {
    /// The floats in one of the flavor's vectors.
    pub fn lanes(self) -> usize {
        match self {
            ExpFlavor::Avx512 => 16,
            ExpFlavor::Avx2 => 8,
        }
    }

    /// One lane of the flavor's `ggml_v_expf`.
    pub fn expf_lane(self, x: f32) -> f32 {
        match self {
            ExpFlavor::Avx512 => expf_avx512_lane(x),
            ExpFlavor::Avx2 => expf_avx2_lane(x),
        }
    }
}

pub fn exp_flavor() -> ExpFlavor {
    static F: OnceLock<ExpFlavor> = OnceLock::new();
    *F.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if isa() == Isa::Avx512Vnni && is_x86_feature_detected!("avx512dq") {
            return ExpFlavor::Avx512;
        }
        ExpFlavor::Avx2
    })
}

// ggml's constants (ARM's optimized-routines expf), as bits
const SHIFT: u32 = 0x4b40_0000; // 0x1.8p23
const LOG2E: u32 = 0x3fb8_aa3b;
const LN2_LO: u32 = 0x35bf_be8e;
const LN2_HI: u32 = 0x3f31_7200;
const C5: u32 = 0x3c07_2010;
const C4: u32 = 0x3d2b_9f17;
const C3: u32 = 0x3e2a_af33;
const C2: u32 = 0x3eff_fedb;
const C1: u32 = 0x3f7f_fff6;

fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// The reduction and polynomial shared by both flavors: `(n, b, z)`.
#[inline]
fn reduce(x: f32) -> (f32, f32, f32) {
    let r = c(SHIFT);
    let z = x.mul_add(c(LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(c(LN2_LO), (-n).mul_add(c(LN2_HI), x));
    (n, b, z)
}

/// One lane of ggml's AVX-512 `ggml_v_expf`.
pub fn expf_avx512_lane(x: f32) -> f32 {
    let (n, b, _) = reduce(x);
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = c(C5)
        .mul_add(b, c(C4))
        .mul_add(u, c(C3).mul_add(b, c(C2)))
        .mul_add(u, c(C1).mul_add(b, 1.0));
    // `scalef`: j * 2^n rounded once (exact in f64, then one rounding to f32, subnormals too)
    (j as f64 * 2f64.powi(n as i32)) as f32
}

/// One lane of ggml's AVX2 `ggml_v_expf`.
pub fn expf_avx2_lane(x: f32) -> f32 {
    let (n, b, z) = reduce(x);
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = c(C5)
        .mul_add(b, c(C4))
        .mul_add(u, c(C3).mul_add(b, c(C2)))
        .mul_add(u, c(C1) * b);
    // ordered comparisons, as the vector body's: a NaN takes the common path
    if n.abs().partial_cmp(&126.0) != Some(std::cmp::Ordering::Greater) {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// ggml's `ggml_vec_soft_max_f32` for a row of 64 scores (`n` a multiple of 16): each score
/// becomes `exp(x - max)` and the sum of those comes back, in ggml's order (a vector's lanes
/// reduced in a fixed tree, each vector's sum added to a double).
pub fn soft_max_row(row: &mut [f32], max: f32) -> f64 {
    let flavor = exp_flavor();
    #[cfg(target_arch = "x86_64")]
    if flavor == ExpFlavor::Avx512 {
        // SAFETY: the flavor is Avx512 only where avx512f and avx512dq were detected.
        return unsafe { x86::soft_max_row_avx512(row, max) };
    }
    soft_max_row_lanes(row, max, flavor)
}

/// `ggml_vec_soft_max_f32` for a row of any length: [`soft_max_row`] over the whole vectors, then
/// libm's `expf` for the last values, each added to the double sum.
pub fn soft_max_any(row: &mut [f32], max: f32) -> f64 {
    let lanes = exp_flavor().lanes();
    let body = row.len() / lanes * lanes;
    let (head, tail) = row.split_at_mut(body);
    let mut sum = soft_max_row(head, max);
    for x in tail {
        let v = (*x - max).exp();
        sum += v as f64;
        *x = v;
    }
    sum
}

/// [`soft_max_row`] one lane at a time (the reference the vector body is tested against).
pub fn soft_max_row_lanes(row: &mut [f32], max: f32, flavor: ExpFlavor) -> f64 {
    let mut sum = 0f64;
    match flavor {
        ExpFlavor::Avx512 => {
            for v in row.chunks_exact_mut(16) {
                v.iter_mut().for_each(|x| *x = expf_avx512_lane(*x - max));
                let a: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
                let b: [f32; 4] = std::array::from_fn(|i| a[i] + a[i + 4]);
                sum += ((b[0] + b[2]) + (b[1] + b[3])) as f64;
            }
        }
        ExpFlavor::Avx2 => {
            for v in row.chunks_exact_mut(8) {
                v.iter_mut().for_each(|x| *x = expf_avx2_lane(*x - max));
                let a: [f32; 4] = std::array::from_fn(|i| v[i + 4] + v[i]);
                sum += ((a[0] + a[2]) + (a[1] + a[3])) as f64;
            }
        }
    }
    sum
}

/// `C[m x n] += A[m x k] * B[k x n]` as ggml's `simd_gemm` computes it: each element of C is
/// one multiply-add chain over `k` in order, starting from C's value. Row strides `lda`, `ldb`,
/// `ldc`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_acc(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    (m, k, n): (usize, usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= (m - 1) * ldc + n && a.len() >= (m - 1) * lda + k);
    assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512Vnni {
        // SAFETY: the ISA check found avx512f; the bounds were asserted above.
        unsafe { x86::gemm_acc_avx512(c, ldc, a, lda, b, ldb, (m, k, n)) };
        return;
    }
    gemm_acc_scalar(c, ldc, a, lda, b, ldb, (m, k, n));
}

/// [`gemm_acc`] one element at a time.
fn gemm_acc_scalar(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    (m, k, n): (usize, usize, usize),
) {
    for i in 0..m {
        for j in 0..n {
            let mut acc = c[i * ldc + j];
            for kk in 0..k {
                acc = a[i * lda + kk].mul_add(b[kk * ldb + j], acc);
            }
            c[i * ldc + j] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::silu_mul_avx512;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::avx512::reduce_add_ps as reduce_add;
    use super::*;

    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn v_expf(x: __m512) -> __m512 {
        let r = _mm512_set1_ps(c(SHIFT));
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(c(LOG2E)), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(c(LN2_LO)),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(c(LN2_HI)), x),
        );
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(c(C5)), b, _mm512_set1_ps(c(C4))),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(c(C3)), b, _mm512_set1_ps(c(C2))),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(c(C1)), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let zero = _mm512_setzero_ps();
        let alt = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero),
            _mm512_set1_ps(f32::INFINITY),
            zero,
        );
        _mm512_mask_blend_ps(d, res, alt)
    }

    /// `gate = gate / (1 + exp(-gate)) * up` sixteen at a time (`ggml_v_silu`); the lengths are
    /// a multiple of 16.
    ///
    /// # Safety
    /// The CPU must have AVX512F and AVX512DQ ([`super::exp_flavor`] is `Avx512`).
    #[target_feature(enable = "avx512f,avx512dq")]
    pub unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
        let one = _mm512_set1_ps(1.0);
        for (g, u) in gate.chunks_exact_mut(16).zip(up.chunks_exact(16)) {
            let x = _mm512_loadu_ps(g.as_ptr());
            let e = v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(
                g.as_mut_ptr(),
                _mm512_mul_ps(s, _mm512_loadu_ps(u.as_ptr())),
            );
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
    pub unsafe fn soft_max_row_avx512(row: &mut [f32], max: f32) -> f64 {
        let mut sum = 0f64;
        let m = _mm512_set1_ps(max);
        for v in row.chunks_exact_mut(16) {
            let e = v_expf(_mm512_sub_ps(_mm512_loadu_ps(v.as_ptr()), m));
            _mm512_storeu_ps(v.as_mut_ptr(), e);
            sum += reduce_add(e) as f64;
        }
        sum
    }

    /// Four rows by 64 columns per step (sixteen accumulators), then 16-column strips, then the
    /// last columns one at a time; every element is the same chain as the scalar body's.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_acc_avx512(
        c: &mut [f32],
        ldc: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        (m, k, n): (usize, usize, usize),
    ) {
        let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
        let mut i = 0;
        while i + 4 <= m {
            let mut j = 0;
            while j + 64 <= n {
                let mut acc = [[_mm512_setzero_ps(); 4]; 4];
                for (r, row) in acc.iter_mut().enumerate() {
                    for (q, v) in row.iter_mut().enumerate() {
                        *v = _mm512_loadu_ps(cp.add((i + r) * ldc + j + 16 * q));
                    }
                }
                for kk in 0..k {
                    let bb: [__m512; 4] =
                        std::array::from_fn(|q| _mm512_loadu_ps(bp.add(kk * ldb + j + 16 * q)));
                    for (r, row) in acc.iter_mut().enumerate() {
                        let p = _mm512_set1_ps(*ap.add((i + r) * lda + kk));
                        for (q, v) in row.iter_mut().enumerate() {
                            *v = _mm512_fmadd_ps(bb[q], p, *v);
                        }
                    }
                }
                for (r, row) in acc.iter().enumerate() {
                    for (q, v) in row.iter().enumerate() {
                        _mm512_storeu_ps(cp.add((i + r) * ldc + j + 16 * q), *v);
                    }
                }
                j += 64;
            }
            strips(cp, ldc, ap, lda, bp, ldb, (i, 4), k, (j, n));
            i += 4;
        }
        while i < m {
            strips(cp, ldc, ap, lda, bp, ldb, (i, 1), k, (0, n));
            i += 1;
        }
    }

    /// Rows `i0..i0 + rows`, columns `j0..n`: 16 columns at a time, then one at a time.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn strips(
        cp: *mut f32,
        ldc: usize,
        ap: *const f32,
        lda: usize,
        bp: *const f32,
        ldb: usize,
        (i0, rows): (usize, usize),
        k: usize,
        (j0, n): (usize, usize),
    ) {
        let mut j = j0;
        while j + 16 <= n {
            for r in i0..i0 + rows {
                let mut v = _mm512_loadu_ps(cp.add(r * ldc + j));
                for kk in 0..k {
                    let p = _mm512_set1_ps(*ap.add(r * lda + kk));
                    v = _mm512_fmadd_ps(_mm512_loadu_ps(bp.add(kk * ldb + j)), p, v);
                }
                _mm512_storeu_ps(cp.add(r * ldc + j), v);
            }
            j += 16;
        }
        for r in i0..i0 + rows {
            for jj in j..n {
                let mut acc = *cp.add(r * ldc + jj);
                for kk in 0..k {
                    acc = (*ap.add(r * lda + kk)).mul_add(*bp.add(kk * ldb + jj), acc);
                }
                *cp.add(r * ldc + jj) = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: &mut u64) -> f32 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed >> 40) as f32 / (1u64 << 24) as f32
    }

    #[test]
    fn exp_lanes_are_close_to_exp() {
        for f in [expf_avx512_lane, expf_avx2_lane] {
            for i in -2000..=100 {
                let x = i as f32 * 0.05;
                let (got, want) = (f(x) as f64, (x as f64).exp());
                assert!(
                    (got - want).abs() <= want * 4e-7 + 1e-44,
                    "exp({x}) = {got}, want {want}"
                );
            }
            assert_eq!(f(f32::NEG_INFINITY), 0.0);
            assert_eq!(f(-200.0), 0.0);
            assert_eq!(f(0.0), 1.0);
        }
    }

    #[test]
    fn vector_softmax_equals_its_lanes() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for round in 0..200 {
            let mut row: Vec<f32> = (0..64).map(|_| (rng(&mut seed) - 0.5) * 40.0).collect();
            if round % 3 == 0 {
                row[(round * 7) % 64] = f32::NEG_INFINITY;
            }
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let mut lanes = row.clone();
            let want = soft_max_row_lanes(&mut lanes, max, exp_flavor());
            let got = soft_max_row(&mut row, max);
            assert_eq!(got.to_bits(), want.to_bits());
            assert!(row
                .iter()
                .zip(&lanes)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn gemm_is_one_chain_per_element() {
        let mut seed = 0xdead_beef_1234_5678u64;
        for (m, k, n) in [
            (64, 256, 64),
            (7, 33, 80),
            (5, 64, 256),
            (1, 3, 17),
            (4, 0, 64),
        ] {
            let (lda, ldb, ldc) = (k + 3, n + 5, n + 1);
            let a: Vec<f32> = (0..m * lda).map(|_| rng(&mut seed) - 0.5).collect();
            let b: Vec<f32> = (0..k.max(1) * ldb).map(|_| rng(&mut seed) - 0.5).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|_| rng(&mut seed) - 0.5).collect();
            let mut got = c0.clone();
            gemm_acc(&mut got, ldc, &a, lda, &b, ldb, (m, k, n));
            let mut want = c0.clone();
            gemm_acc_scalar(&mut want, ldc, &a, lda, &b, ldb, (m, k, n));
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{m}x{k}x{n}"
            );
        }
    }
}
