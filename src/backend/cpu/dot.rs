//! Runtime choice of the dot-product kernel for a weight type: AVX-512 VNNI where we have a kernel
//! for it and the CPU runs it, else AVX2+FMA, else the scalar reference. Decided once per
//! process.

use std::sync::OnceLock;

use super::quant::mxfp4_q8_0;
use crate::model::quants::vec_dot_ref;
use crate::model::GgmlType;

/// `n` elements of a weight row against activations in the weight type's `vec_dot_type`.
pub type DotFn = fn(usize, &[u8], &[u8]) -> f32;

/// One weight row against four activation rows; each result equals the [`DotFn`] of the same
/// type on that row bit for bit.
pub type DotFn4 = fn(usize, &[u8], [&[u8]; 4]) -> [f32; 4];
/// Weight rows in fours against activation rows in fours: `*out.add(t * ld + r)` gets the
/// one-row kernel's product of row `r` and activation row `t`.
///
/// # Safety
/// `out` must take `a.len()` rows of `ld` floats, `ld` at least the number of weight rows.
pub type DotTile = unsafe fn(usize, &[&[u8]], &[&[u8]], *mut f32, usize);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    /// AVX2 plus avx512f, avx512bw, avx512vnni and avx512vl.
    Avx512Vnni,
}

/// The instruction set the kernels use on this machine (`BLOOMERY_CPU_ISA=scalar` or `avx2`
/// caps it, for tests and for comparing speeds).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let found = detect();
        match std::env::var("BLOOMERY_CPU_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") if found != Isa::Scalar => Isa::Avx2,
            _ => found,
        }
    })
}

fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
            {
                return Isa::Avx512Vnni;
            }
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// `model::quants`' reference product for a type the loader accepted (lengths are exact there).
fn reference(t: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    vec_dot_ref(t, w, a, n).unwrap_or_else(|e| panic!("reference dot product: {e}"))
}

/// The scalar kernel for weights of type `w`, or `None` when we have none.
pub fn scalar_kernel(w: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match w {
        F32 => |n, w, a| reference(F32, n, w, a),
        F16 => |n, w, a| reference(F16, n, w, a),
        Q4_0 => |n, w, a| reference(Q4_0, n, w, a),
        Q5_0 => |n, w, a| reference(Q5_0, n, w, a),
        Q8_0 => |n, w, a| reference(Q8_0, n, w, a),
        Q4K => |n, w, a| reference(Q4K, n, w, a),
        Q5K => |n, w, a| reference(Q5K, n, w, a),
        Q6K => |n, w, a| reference(Q6K, n, w, a),
        Mxfp4 => mxfp4_q8_0,
        _ => return None,
    })
}

/// The fastest kernel this CPU runs for weights of type `w`.
pub fn kernel(w: GgmlType) -> Option<DotFn> {
    kernel_for(isa(), w)
}

/// The fastest kernel for weights of type `w` using at most `isa`.
fn kernel_for(isa: Isa, w: GgmlType) -> Option<DotFn> {
    match isa {
        Isa::Scalar => scalar_kernel(w),
        Isa::Avx2 => simd_kernel(w).or_else(|| scalar_kernel(w)),
        Isa::Avx512Vnni => vnni_kernel(w).or_else(|| kernel_for(Isa::Avx2, w)),
    }
}

/// The four-row kernel for weights of type `w`, where this CPU's one-row kernel has one.
///
/// Its results equal the one-row kernel's for every type but Q4_K, whose four rows are summed
/// as ggml's repacked four-row kernel sums them (`avx2::KFloat::Pairs`): ggml runs a
/// product's rows in fours through that kernel and the rest one at a time, and [`super::matmul`]
/// splits them the same way.
pub fn kernel4(w: GgmlType) -> Option<DotFn4> {
    kernel4_for(isa(), w)
}

/// How many activation rows make ggml take its tiled K-quant product (`GGML_CPU_TILED_MM`) for
/// Q5_K and Q6_K weights, which sums in another order ([`kernel_batched`]).
pub const TILED_MIN_ROWS: usize = 8;

/// The one-row and four-row kernels for a product of [`TILED_MIN_ROWS`] or more activation rows
/// where ggml's result differs from its row-by-row kernel's (Q5_K and Q6_K, at the AVX2 level and
/// above: `avx2::KFloat::Tiled`); `None`: the usual kernels.
pub fn kernel_batched(w: GgmlType) -> Option<(DotFn, Option<DotFn4>)> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::{avx2, avx512};
        // SAFETY (all): each kernel is reached only at the level `isa()` detected.
        return match (isa(), w) {
            (Isa::Scalar, _) => None,
            (_, GgmlType::Q6K) => Some((
                |n, w, a| unsafe { avx2::q6_k_q8_k_tiled(n, w, a) },
                Some(|n, w, a| unsafe { avx2::q6_k_q8_k_tiled_x4(n, w, a) }),
            )),
            (Isa::Avx512Vnni, GgmlType::Q5K) => Some((
                |n, w, a| unsafe { avx2::q5_k_q8_k_tiled(n, w, a) },
                Some(|n, w, a| unsafe { avx512::q5_k_q8_k_tiled_x4(n, w, a) }),
            )),
            (_, GgmlType::Q5K) => Some((|n, w, a| unsafe { avx2::q5_k_q8_k_tiled(n, w, a) }, None)),
            _ => None,
        };
    }
    #[allow(unreachable_code)]
    {
        let _ = w;
        None
    }
}

/// The one-row kernel for a product of two or more activation rows where ggml runs llamafile's
/// `tinyBLAS` instead of its dot product (F32 and F16 weights whose rows come in fours), whose
/// order differs: one vector accumulator per result (`avx512::f32_f32_sgemm`); `None`: the usual
/// one.
pub fn kernel_sgemm(w: GgmlType) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::{avx2, avx512};
        // SAFETY (both): each kernel is reached only at the level `isa()` detected.
        return match (isa(), w) {
            (Isa::Avx512Vnni, GgmlType::F32) => {
                Some(|n, w, a| unsafe { avx512::f32_f32_sgemm(n, w, a) })
            }
            (Isa::Avx2, GgmlType::F32) => Some(|n, w, a| unsafe { avx2::f32_f32_sgemm(n, w, a) }),
            (Isa::Avx512Vnni, GgmlType::F16) => {
                Some(|n, w, a| unsafe { avx512::f16_f16_sgemm(n, w, a) })
            }
            (Isa::Avx2, GgmlType::F16) => Some(|n, w, a| unsafe { avx2::f16_f16_sgemm(n, w, a) }),
            _ => None,
        };
    }
    #[allow(unreachable_code)]
    {
        let _ = w;
        None
    }
}

/// A four-row kernel whose results equal the one-row kernel's for every type (expert products:
/// ggml runs each of their rows through its one-row kernel).
pub fn kernel4_rowwise(w: GgmlType) -> Option<DotFn4> {
    match (isa(), w) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only reached when `isa()` detected the AVX-512 VNNI level.
        (Isa::Avx512Vnni, GgmlType::Q4K) => {
            Some(|n, w, a| unsafe { super::avx512::q4_k_q8_k_x4_blocks(n, w, a) })
        }
        (_, GgmlType::Q4K) => None,
        _ => kernel4(w),
    }
}

fn kernel4_for(isa: Isa, w: GgmlType) -> Option<DotFn4> {
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 => simd_kernel4(w),
        Isa::Avx512Vnni => vnni_kernel4(w).or_else(|| simd_kernel4(w)),
    }
}

/// The four-by-four tile kernel for weights of type `w`, where this CPU has one at the AVX-512
/// level: its sixteen accumulators fit AVX-512's 32 vector registers; with AVX2's 16 the tile
/// spills and runs slower than the four-row kernel (`tile_speed`: Q5_0 12.7 against 11.6 ns per
/// 256 weights per token; with VNNI 8.3 against 10.1).
pub fn kernel_tile(w: GgmlType) -> Option<DotTile> {
    match isa() {
        Isa::Avx512Vnni => kernel_tile_for(Isa::Avx512Vnni, w),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
fn kernel_tile_for(isa: Isa, w: GgmlType) -> Option<DotTile> {
    use super::avx512;
    use GgmlType::*;
    // SAFETY (all): each level's kernels are reached only when `isa()` detected that level.
    match isa {
        // sixteen registers cannot hold the tile
        Isa::Scalar | Isa::Avx2 => None,
        Isa::Avx512Vnni => Some(match w {
            Q4_0 => avx512::q4_0_q8_0_strip,
            Q5_0 => avx512::q5_0_q8_0_strip,
            Q8_0 => avx512::q8_0_q8_0_strip,
            Mxfp4 => avx512::mxfp4_q8_0_strip,
            _ => return None,
        }),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn kernel_tile_for(_isa: Isa, _w: GgmlType) -> Option<DotTile> {
    None
}

#[cfg(target_arch = "x86_64")]
fn vnni_kernel4(w: GgmlType) -> Option<DotFn4> {
    use super::avx512;
    use GgmlType::*;
    // SAFETY (all): only reached when `isa()` detected the AVX-512 VNNI level.
    Some(match w {
        Q4K => |n, w, a| unsafe { avx512::q4_k_q8_k_x4(n, w, a) },
        Q5K => |n, w, a| unsafe { avx512::q5_k_q8_k_x4(n, w, a) },
        Q4_0 => |n, w, a| unsafe { avx512::q4_0_q8_0_x4(n, w, a) },
        Q5_0 => |n, w, a| unsafe { avx512::q5_0_q8_0_x4(n, w, a) },
        Q8_0 => |n, w, a| unsafe { avx512::q8_0_q8_0_x4(n, w, a) },
        Mxfp4 => |n, w, a| unsafe { avx512::mxfp4_q8_0_x4(n, w, a) },
        _ => return None,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn vnni_kernel4(_w: GgmlType) -> Option<DotFn4> {
    None
}

#[cfg(target_arch = "x86_64")]
fn simd_kernel4(w: GgmlType) -> Option<DotFn4> {
    use super::avx2;
    use GgmlType::*;
    // SAFETY (all): only reached when `isa()` detected avx2, fma and f16c.
    Some(match w {
        Q4_0 => |n, w, a| unsafe { avx2::q4_0_q8_0_x4(n, w, a) },
        Q5_0 => |n, w, a| unsafe { avx2::q5_0_q8_0_x4(n, w, a) },
        Q8_0 => |n, w, a| unsafe { avx2::q8_0_q8_0_x4(n, w, a) },
        Mxfp4 => |n, w, a| unsafe { avx2::mxfp4_q8_0_x4(n, w, a) },
        Q6K => |n, w, a| unsafe { avx2::q6_k_q8_k_x4(n, w, a) },
        // no shared decode here: the four rows' float steps, as ggml's four-row kernel takes them
        Q4K => |n, w, a| a.map(|a| unsafe { avx2::q4_k_q8_k_pairs(n, w, a) }),
        _ => return None,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn simd_kernel4(_w: GgmlType) -> Option<DotFn4> {
    None
}

#[cfg(target_arch = "x86_64")]
fn simd_kernel(w: GgmlType) -> Option<DotFn> {
    use super::avx2;
    use GgmlType::*;
    // SAFETY (all): only reached when `isa()` detected avx2, fma and f16c.
    Some(match w {
        F32 => |n, w, a| unsafe { avx2::f32_f32(n, w, a) },
        F16 => |n, w, a| unsafe { avx2::f16_f16(n, w, a) },
        Q4_0 => |n, w, a| unsafe { avx2::q4_0_q8_0(n, w, a) },
        Q5_0 => |n, w, a| unsafe { avx2::q5_0_q8_0(n, w, a) },
        Q8_0 => |n, w, a| unsafe { avx2::q8_0_q8_0(n, w, a) },
        Mxfp4 => |n, w, a| unsafe { avx2::mxfp4_q8_0(n, w, a) },
        Q4K => |n, w, a| unsafe { avx2::q4_k_q8_k(n, w, a) },
        Q5K => |n, w, a| unsafe { avx2::q5_k_q8_k(n, w, a) },
        Q6K => |n, w, a| unsafe { avx2::q6_k_q8_k(n, w, a) },
        _ => return None,
    })
}

#[cfg(target_arch = "x86_64")]
fn vnni_kernel(w: GgmlType) -> Option<DotFn> {
    use super::avx512;
    use GgmlType::*;
    // SAFETY (all): only reached when `isa()` detected avx512f, avx512bw and avx512vnni besides
    // avx2, fma and f16c.
    Some(match w {
        F32 => |n, w, a| unsafe { avx512::f32_f32(n, w, a) },
        F16 => |n, w, a| unsafe { avx512::f16_f16(n, w, a) },
        Q4K => |n, w, a| unsafe { avx512::q4_k_q8_k(n, w, a) },
        Q5K => |n, w, a| unsafe { avx512::q5_k_q8_k(n, w, a) },
        Q4_0 => |n, w, a| unsafe { avx512::q4_0_q8_0(n, w, a) },
        Q5_0 => |n, w, a| unsafe { avx512::q5_0_q8_0(n, w, a) },
        Q8_0 => |n, w, a| unsafe { avx512::q8_0_q8_0(n, w, a) },
        Mxfp4 => |n, w, a| unsafe { avx512::mxfp4_q8_0(n, w, a) },
        _ => return None,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn simd_kernel(_w: GgmlType) -> Option<DotFn> {
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn vnni_kernel(_w: GgmlType) -> Option<DotFn> {
    None
}

#[cfg(test)]
mod tests {
    use super::super::quant::{act_row_bytes, quantize_act};
    use super::*;
    use crate::model::quants::vec_dot_type;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn f(&mut self) -> f32 {
            (self.next() % 20001) as f32 / 10000.0 - 1.0
        }
    }

    /// Random weight bytes with sane block scales (a random f16 could be inf or NaN).
    fn random_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
        let mut w: Vec<u8> = (0..ty.bytes_for(n as u64).unwrap())
            .map(|_| rng.next() as u8)
            .collect();
        let half = |v: f32| crate::model::quants::f32_to_f16(v).to_le_bytes();
        let bs = ty.type_size();
        for b in w.chunks_exact_mut(bs) {
            match ty {
                GgmlType::F32 => b.copy_from_slice(&rng.f().to_le_bytes()),
                GgmlType::F16 => b.copy_from_slice(&half(rng.f())),
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
                    b[..2].copy_from_slice(&half(rng.f() * 0.01))
                }
                GgmlType::Mxfp4 => b[0] = 110 + (rng.next() % 20) as u8,
                GgmlType::Q4K | GgmlType::Q5K => {
                    b[..2].copy_from_slice(&half(rng.f() * 0.01));
                    b[2..4].copy_from_slice(&half(rng.f() * 0.01));
                }
                GgmlType::Q6K => b[208..210].copy_from_slice(&half(rng.f() * 0.01)),
                _ => unreachable!(),
            }
        }
        w
    }

    /// `cargo test --release --lib kernel_speed -- --ignored --nocapture`: nanoseconds per
    /// 256 weights of each kernel level on cache-resident rows (no timing is asserted).
    #[test]
    #[ignore]
    fn kernel_speed() {
        use GgmlType::*;
        let mut rng = Rng(7);
        for ty in [Q4K, Q5K, Q6K, Q8_0, Q4_0] {
            let n = 4096;
            let act = vec_dot_type(ty);
            let x: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let mut a = vec![0u8; act_row_bytes(act, n)];
            quantize_act(act, &x, &mut a);
            let rows: Vec<Vec<u8>> = (0..8).map(|_| random_weights(ty, n, &mut rng)).collect();
            for level in simd_levels() {
                let f = kernel_for(level, ty).unwrap();
                let reps = 20_000;
                let t = std::time::Instant::now();
                let mut sink = 0.0;
                for r in 0..reps {
                    sink += f(n, &rows[r % 8], &a);
                }
                let ns = t.elapsed().as_nanos() as f64 / (reps * n / 256) as f64;
                println!("{ty} {level:?}: {ns:.1} ns per 256 weights ({sink:.1})");
            }
        }
    }

    #[test]
    fn avx512_kernels_equal_avx2_bit_for_bit() {
        use GgmlType::*;
        if detect() != Isa::Avx512Vnni {
            println!("skipped: this CPU has no AVX-512 VNNI");
            return;
        }
        let mut rng = Rng(0x51ed_2701_7a3c_9e11);
        for ty in [Q4K, Q5K, Q4_0, Q5_0, Q8_0, Mxfp4] {
            for n in [256, 2048, 4096] {
                let x: Vec<f32> = (0..n).map(|_| rng.f() * 3.0).collect();
                let mut a = vec![0u8; act_row_bytes(vec_dot_type(ty), n)];
                quantize_act(vec_dot_type(ty), &x, &mut a);
                let w = random_weights(ty, n, &mut rng);
                let avx2 = kernel_for(Isa::Avx2, ty).unwrap()(n, &w, &a);
                let avx512 = kernel_for(Isa::Avx512Vnni, ty).unwrap()(n, &w, &a);
                assert_eq!(
                    avx2.to_bits(),
                    avx512.to_bits(),
                    "{ty} n={n}: {avx2} {avx512}"
                );
            }
        }
    }

    /// `count` activation rows of `n` values (random, times `scale`) converted for weights of
    /// type `ty`.
    fn random_acts(
        ty: GgmlType,
        n: usize,
        count: usize,
        scale: f32,
        rng: &mut Rng,
    ) -> Vec<Vec<u8>> {
        (0..count)
            .map(|_| {
                let x: Vec<f32> = (0..n).map(|_| rng.f() * scale).collect();
                let mut a = vec![0u8; act_row_bytes(vec_dot_type(ty), n)];
                quantize_act(vec_dot_type(ty), &x, &mut a);
                a
            })
            .collect()
    }

    /// The SIMD levels this CPU runs.
    fn simd_levels() -> impl Iterator<Item = Isa> {
        [Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .filter(|&l| l as u8 <= detect() as u8)
    }

    #[test]
    fn four_row_kernels_equal_one_row_kernels_bit_for_bit() {
        use GgmlType::*;
        let mut rng = Rng(0x0dd_ba11_cafe);
        for ty in [Q4_0, Q5_0, Q8_0, Mxfp4, Q4K, Q5K, Q6K] {
            let n = 1024;
            let w = random_weights(ty, n, &mut rng);
            let acts = random_acts(ty, n, 4, 2.0, &mut rng);
            for level in simd_levels() {
                let Some(four) = kernel4_for(level, ty) else {
                    // Q5_K has a four-row kernel at the VNNI level only
                    assert!(ty == Q5K && level == Isa::Avx2, "{ty} {level:?}");
                    continue;
                };
                // Q4_K's four rows follow ggml's four-row kernel (see `kernel4`)
                let one: DotFn = if ty == Q4K {
                    |n, w, a| unsafe { super::super::avx2::q4_k_q8_k_pairs(n, w, a) }
                } else {
                    kernel_for(level, ty).unwrap()
                };
                let got = four(n, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
                for (j, a) in acts.iter().enumerate() {
                    let want = one(n, &w, a);
                    assert_eq!(got[j].to_bits(), want.to_bits(), "{ty} {level:?} row {j}");
                }
            }
        }
    }

    /// Q4_0 and MXFP4 take the order of ggml's repacked x86 kernels: per block the integer sum
    /// of weight and activation quants, then one fused multiply-add by `dw * da`, in block order
    /// from zero.
    #[test]
    fn q4_0_and_mxfp4_sum_as_ggml_repacked_kernels() {
        use GgmlType::*;
        const MXFP4: [i32; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
        let mut rng = Rng(0x5eed_1234);
        let n = 1024;
        for ty in [Q4_0, Mxfp4] {
            let w = random_weights(ty, n, &mut rng);
            let a = &random_acts(ty, n, 1, 2.0, &mut rng)[0];
            let (wb, ab) = (ty.type_size(), super::super::quant::Q8_0_BYTES);
            let mut want = 0f32;
            for (bw, ba) in w.chunks_exact(wb).zip(a.chunks_exact(ab)) {
                let (dw, q): (f32, Vec<i32>) = match ty {
                    Q4_0 => (
                        crate::model::quants::f16_to_f32(u16::from_le_bytes([bw[0], bw[1]])),
                        (0..32)
                            .map(|i| (bw[2 + i % 16] >> (4 * (i / 16)) & 15) as i32 - 8)
                            .collect(),
                    ),
                    _ => (
                        super::super::quant::e8m0_half(bw[0]),
                        (0..32)
                            .map(|i| MXFP4[(bw[1 + i % 16] >> (4 * (i / 16)) & 15) as usize])
                            .collect(),
                    ),
                };
                let da = crate::model::quants::f16_to_f32(u16::from_le_bytes([ba[0], ba[1]]));
                let sum: i32 = (0..32).map(|i| q[i] * ba[2 + i] as i8 as i32).sum();
                want = (sum as f32).mul_add(dw * da, want);
            }
            for level in simd_levels() {
                let got = kernel_for(level, ty).unwrap()(n, &w, a);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} {level:?}: {got} vs {want}"
                );
            }
        }
    }

    /// F32 products of several rows follow tinyBLAS: one accumulator of the build's width, a
    /// fused step per vector (the tail zero-padded), then that width's reduction tree.
    #[test]
    fn f32_sgemm_order_is_tinyblas() {
        use crate::model::quants::{f16_to_f32, f32_to_f16};
        let mut rng = Rng(77);
        for n in [256usize, 2880, 100] {
            let w: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let a: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let (wb, ab) = (bytes(&w), bytes(&a));
            for (level, lanes) in [(Isa::Avx2, 8usize), (Isa::Avx512Vnni, 16)] {
                if level as u8 > detect() as u8 {
                    continue;
                }
                let mut acc = vec![0f32; lanes];
                for l in (0..n).step_by(lanes) {
                    for (i, c) in acc.iter_mut().enumerate() {
                        let (x, y) = (w.get(l + i), a.get(l + i));
                        *c = x.unwrap_or(&0.0).mul_add(*y.unwrap_or(&0.0), *c);
                    }
                }
                let want = if lanes == 16 {
                    let t: Vec<f32> = (0..8).map(|i| acc[i] + acc[i + 8]).collect();
                    let t: Vec<f32> = (0..4).map(|i| t[i] + t[i + 4]).collect();
                    (t[0] + t[2]) + (t[1] + t[3])
                } else {
                    let t: Vec<f32> = (0..4).map(|i| acc[i + 4] + acc[i]).collect();
                    (t[0] + t[2]) + (t[1] + t[3])
                };
                let got = match level {
                    Isa::Avx2 => unsafe { super::super::avx2::f32_f32_sgemm(n, &wb, &ab) },
                    _ => unsafe { super::super::avx512::f32_f32_sgemm(n, &wb, &ab) },
                };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "n {n} {level:?}: {got} vs {want}"
                );
                // F16: the same steps on the halves' values
                let h = |v: &[f32]| -> (Vec<u8>, Vec<u8>) {
                    let hs: Vec<u16> = v.iter().map(|&x| f32_to_f16(x)).collect();
                    let back: Vec<f32> = hs.iter().map(|&x| f16_to_f32(x)).collect();
                    (
                        hs.iter().flat_map(|x| x.to_le_bytes()).collect(),
                        bytes(&back),
                    )
                };
                let ((wh, wf), (ah, af)) = (h(&w), h(&a));
                let (got, want) = match level {
                    Isa::Avx2 => unsafe {
                        (
                            super::super::avx2::f16_f16_sgemm(n, &wh, &ah),
                            super::super::avx2::f32_f32_sgemm(n, &wf, &af),
                        )
                    },
                    _ => unsafe {
                        (
                            super::super::avx512::f16_f16_sgemm(n, &wh, &ah),
                            super::super::avx512::f32_f32_sgemm(n, &wf, &af),
                        )
                    },
                };
                assert_eq!(got.to_bits(), want.to_bits(), "f16 n {n} {level:?}");
            }
        }
    }

    #[test]
    fn tile_kernels_equal_one_row_kernels_bit_for_bit() {
        use GgmlType::*;
        let mut rng = Rng(0x0071_17e5_ca1e);
        for ty in [Q4_0, Q5_0, Q8_0, Mxfp4] {
            // 40 blocks: five scale groups of eight, the last one partial
            for n in [1280, 256] {
                // two groups of four rows, three of four tokens
                let ws: Vec<Vec<u8>> = (0..8).map(|_| random_weights(ty, n, &mut rng)).collect();
                let acts = random_acts(ty, n, 12, 2.0, &mut rng);
                for level in simd_levels() {
                    let Some(tile) = kernel_tile_for(level, ty) else {
                        continue;
                    };
                    let one = kernel_for(level, ty).unwrap();
                    let w8: Vec<&[u8]> = ws.iter().map(|w| &w[..]).collect();
                    let a: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
                    let mut got = vec![f32::NAN; a.len() * w8.len()];
                    // SAFETY: `got` holds a row of w8.len() floats per activation row.
                    unsafe { tile(n, &w8, &a, got.as_mut_ptr(), w8.len()) };
                    for (r, w) in ws.iter().enumerate() {
                        for (t, a) in acts.iter().enumerate() {
                            let want = one(n, w, a);
                            assert_eq!(
                                got[t * w8.len() + r].to_bits(),
                                want.to_bits(),
                                "{ty} {level:?} n={n} row {r} token {t}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Prompt-shaped products on cache-resident data, ns per 256 weights per token: one token
    /// at a time, the four-token kernel and the four-by-four tile, where the type has them
    /// (`cargo test --release --lib tile_speed -- --ignored --nocapture`).
    #[test]
    #[ignore = "timing, for measuring"]
    fn tile_speed() {
        use GgmlType::*;
        let mut rng = Rng(11);
        for ty in [Q5_0, Q8_0, Q4_0, Mxfp4, Q6K, Q4K] {
            let n = 2048;
            let acts = random_acts(ty, n, 4, 1.0, &mut rng);
            let a4 = [&acts[0][..], &acts[1], &acts[2], &acts[3]];
            let ws: Vec<Vec<u8>> = (0..8).map(|_| random_weights(ty, n, &mut rng)).collect();
            for level in simd_levels() {
                let reps = 4000;
                let per = (reps * 16 * n / 256) as f64;
                let mut sink = 0.0;
                let mut line = format!("{ty} {level:?}:");
                let one = kernel_for(level, ty).unwrap();
                let t = std::time::Instant::now();
                for r in 0..reps {
                    for w in &ws[(r % 2) * 4..(r % 2) * 4 + 4] {
                        for a in a4 {
                            sink += one(n, w, a);
                        }
                    }
                }
                line += &format!(" one {:.2}", t.elapsed().as_nanos() as f64 / per);
                if let Some(four) = kernel4_for(level, ty) {
                    let t = std::time::Instant::now();
                    for r in 0..reps {
                        for w in &ws[(r % 2) * 4..(r % 2) * 4 + 4] {
                            sink += four(n, w, a4)[0];
                        }
                    }
                    line += &format!(", four {:.2}", t.elapsed().as_nanos() as f64 / per);
                }
                if let Some(tile) = kernel_tile_for(level, ty) {
                    // a strip of 16 tokens (four copies of the four rows), as prompts run it
                    let a16: Vec<&[u8]> = (0..16).map(|t| a4[t % 4]).collect();
                    let w8: Vec<&[u8]> = ws.iter().map(|w| &w[..]).collect();
                    let mut out = vec![0f32; 16 * 8];
                    let t = std::time::Instant::now();
                    for _ in 0..reps / 8 {
                        // SAFETY: `out` holds a row of 8 floats per activation row.
                        unsafe { tile(n, &w8, &a16, out.as_mut_ptr(), 8) };
                        sink += out[0];
                    }
                    line += &format!(", strip {:.2}", t.elapsed().as_nanos() as f64 / per);
                }
                println!("{line} ns per 256 weights per token ({sink:.1})");
            }
        }
    }

    #[test]
    fn simd_kernels_agree_with_scalar() {
        use GgmlType::*;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for ty in [F32, F16, Q4_0, Q5_0, Q8_0, Mxfp4, Q4K, Q5K, Q6K] {
            let n = 512;
            let act = vec_dot_type(ty);
            let x: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let mut a = vec![0u8; act_row_bytes(act, n)];
            quantize_act(act, &x, &mut a);
            let w = random_weights(ty, n, &mut rng);
            let reference = scalar_kernel(ty).unwrap()(n, &w, &a);
            // every level this machine runs, not only the best
            let levels = [Isa::Avx2, Isa::Avx512Vnni];
            for level in levels.into_iter().filter(|&l| l as u8 <= detect() as u8) {
                let fast = kernel_for(level, ty).unwrap()(n, &w, &a);
                let tol = 1e-4 * reference.abs().max(1.0);
                assert!(
                    (reference - fast).abs() <= tol,
                    "{ty} {level:?}: scalar {reference} simd {fast}"
                );
            }
        }
    }

    #[test]
    fn rowwise_four_row_kernels_equal_one_row_kernels_bit_for_bit() {
        use GgmlType::*;
        let mut rng = Rng(0x0005_eed0_f4e4);
        for ty in [Q4K, Q5K, Q4_0, Q8_0] {
            let n = 1024;
            let w = random_weights(ty, n, &mut rng);
            let acts = random_acts(ty, n, 4, 2.0, &mut rng);
            let Some(four) = kernel4_rowwise(ty) else {
                continue;
            };
            let one = kernel(ty).unwrap();
            let got = four(n, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
            for (j, a) in acts.iter().enumerate() {
                assert_eq!(got[j].to_bits(), one(n, &w, a).to_bits(), "{ty} row {j}");
            }
        }
    }

    #[test]
    fn batched_kernels_agree_in_every_width() {
        use GgmlType::*;
        let mut rng = Rng(0x0ba7_c4ed);
        for ty in [Q5K, Q6K] {
            let n = 1024;
            let w = random_weights(ty, n, &mut rng);
            let acts = random_acts(ty, n, 4, 2.0, &mut rng);
            let Some((one, four)) = kernel_batched(ty) else {
                continue;
            };
            let usual = kernel(ty).unwrap();
            if let Some(four) = four {
                let got = four(n, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
                for (j, a) in acts.iter().enumerate() {
                    assert_eq!(got[j].to_bits(), one(n, &w, a).to_bits(), "{ty} row {j}");
                }
            }
            // the same product, summed in another order
            for a in &acts {
                let (x, y) = (one(n, &w, a), usual(n, &w, a));
                assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{ty}: {x} {y}");
            }
        }
    }
}
