//! Q4_K weights repacked sixteen rows at a time for AVX-512 VNNI, as ggml repacks them (its
//! `block_q4_Kx8`, eight rows) so one instruction works on every row of the group: each 32-bit
//! lane holds four consecutive weights of one row, so a product's integer sums land one row per
//! lane and the float steps run on sixteen rows at once, with no horizontal sums. The float steps
//! are ggml's repacked kernels' (`avx2::KFloat::Pairs` for four activation rows, `Blocks` for
//! one), lane by lane, so the results equal the row-by-row kernels' bit for bit.
//!
//! A group's block of 256 columns (`BLOCK` bytes): the sixteen rows' `d` (f16), their `dmin`
//! (f16), the eight sub-blocks' scales (a byte per row), their mins, then the quants: for each of
//! the four 32-byte chunks of a Q4_K block and each 4-byte piece of it, the sixteen rows' pieces
//! side by side (64 bytes).

use super::quant::{scale_min_k4, Q8_K_BYTES, QK_K};
use crate::model::GgmlType;

/// Rows per group.
pub const ROWS: usize = 16;
const Q4K_BYTES: usize = 144;
const AT_DMIN: usize = 2 * ROWS;
const AT_SCALES: usize = 4 * ROWS;
const AT_MINS: usize = AT_SCALES + 8 * ROWS;
const AT_QS: usize = AT_MINS + 8 * ROWS;
/// Bytes of one group's block.
pub const BLOCK: usize = AT_QS + ROWS * 128;

/// Whether this module's kernels serve a matrix of `rows` rows: whole groups, on a CPU with the
/// kernels.
pub fn in_groups(rows: usize) -> bool {
    rows > 0 && rows.is_multiple_of(ROWS) && available()
}

/// Whether [`pack_q4k`] applies: Q4_K rows in whole groups, on a CPU with the kernel.
pub fn packable(ty: GgmlType, rows: usize) -> bool {
    ty == GgmlType::Q4K && in_groups(rows)
}

fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::dot::isa() == super::dot::Isa::Avx512Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `rows` Q4_K rows of `cols` columns (ggml's layout) in groups of [`ROWS`].
pub fn pack_q4k(data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let nb = cols / QK_K;
    let rb = nb * Q4K_BYTES;
    assert!(rows.is_multiple_of(ROWS) && data.len() >= rows * rb);
    let mut out = vec![0u8; rows / ROWS * nb * BLOCK];
    for (g, grp) in out.chunks_exact_mut(nb * BLOCK).enumerate() {
        let group: [&[u8]; ROWS] = std::array::from_fn(|r| &data[(g * ROWS + r) * rb..][..rb]);
        for (b, blk) in grp.chunks_exact_mut(BLOCK).enumerate() {
            pack_q4k_block(&group, b, blk);
        }
    }
    out
}

/// Block `b` of sixteen Q4_K rows in the packed layout (`BLOCK` bytes of `blk`).
fn pack_q4k_block(rows: &[&[u8]; ROWS], b: usize, blk: &mut [u8]) {
    for (r, row) in rows.iter().enumerate() {
        let src = &row[b * Q4K_BYTES..][..Q4K_BYTES];
        blk[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
        blk[AT_DMIN + 2 * r..AT_DMIN + 2 * r + 2].copy_from_slice(&src[2..4]);
        for sb in 0..8 {
            let (sc, mn) = scale_min_k4(sb, &src[4..16]);
            blk[AT_SCALES + sb * ROWS + r] = sc;
            blk[AT_MINS + sb * ROWS + r] = mn;
        }
        for piece in 0..32 {
            let at = AT_QS + piece * 4 * ROWS + 4 * r;
            blk[at..at + 4].copy_from_slice(&src[16 + 4 * piece..16 + 4 * piece + 4]);
        }
    }
}

/// Sixteen Q4_K rows (ggml's layout) against the activation rows `acts`, every token summed as
/// ggml's one-row kernel sums it (`Blocks`: its expert products), packing each block once for
/// all the tokens: `out[t][r]`.
pub fn q4k_rows_blocks(cols: usize, rows: [&[u8]; ROWS], acts: &[&[u8]], out: &mut [[f32; ROWS]]) {
    let nb = cols / QK_K;
    assert!(rows.iter().all(|r| r.len() >= nb * Q4K_BYTES) && out.len() >= acts.len());
    assert!(acts.iter().all(|a| a.len() >= nb * Q8_K_BYTES) && available());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` found the AVX-512 VNNI level; sizes checked above.
    unsafe {
        x86::q4k_rows_blocks(nb, &rows, acts, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("only on x86_64")
}

/// Four activation rows (Q8_K) against one group: `out[t][r]`, summed as ggml's four-row kernel
/// sums them.
pub fn q4k_group_x4(cols: usize, group: &[u8], a: [&[u8]; 4]) -> [[f32; ROWS]; 4] {
    check(cols, group, &a);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `check` asserted `available()` (the AVX-512 VNNI level) and the sizes.
    unsafe {
        x86::q4k_group::<4>(cols / QK_K, group, a, true)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("packed groups exist only on x86_64")
}

/// One activation row against one group, summed as ggml's one-row kernel sums it.
pub fn q4k_group_x1(cols: usize, group: &[u8], a: &[u8]) -> [f32; ROWS] {
    check(cols, group, &[a]);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `q4k_group_x4`.
    unsafe {
        x86::q4k_group::<1>(cols / QK_K, group, [a], false)[0]
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("packed groups exist only on x86_64")
}

fn check(cols: usize, group: &[u8], a: &[&[u8]]) {
    let nb = cols / QK_K;
    assert!(group.len() >= nb * BLOCK && a.iter().all(|a| a.len() >= nb * Q8_K_BYTES));
    assert!(available(), "packed kernels need the AVX-512 VNNI level");
}

/// Q6_K products of eight or more activation rows (`dot::TILED_MIN_ROWS`): `rows` (sixteen Q6_K
/// rows of `cols` columns) against the activation rows `acts` (Q8_K), `out[t][r]`. Each block of
/// the rows is unpacked once into a small buffer (a byte per weight, four of a row side by side
/// per lane) and used for every token. The float steps are ggml's tiled product's
/// (`avx2::KFloat::Tiled`): per block the integer sum times `d`, then one multiply-add by the
/// activations' scale, lane by lane.
pub fn q6k_tiled_group(cols: usize, rows: [&[u8]; ROWS], acts: &[&[u8]], out: &mut [[f32; ROWS]]) {
    let nb = cols / QK_K;
    assert!(rows.iter().all(|r| r.len() >= nb * Q6K_BYTES) && available());
    assert!(acts.iter().all(|a| a.len() >= nb * Q8_K_BYTES) && out.len() >= acts.len());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` found the AVX-512 VNNI level; sizes checked above.
    unsafe {
        x86::q6k_tiled_group(nb, &rows, acts, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("only on x86_64")
}

const Q6K_BYTES: usize = 210;

/// Block `b` of Q6_K row `row` as 256 six-bit values (0..63), in order.
fn q6k_values(row: &[u8], b: usize, v: &mut [u8; QK_K]) {
    let bw = &row[b * Q6K_BYTES..(b + 1) * Q6K_BYTES];
    for half in 0..2 {
        let (ql, qh) = (
            &bw[half * 64..half * 64 + 64],
            &bw[128 + half * 32..128 + half * 32 + 32],
        );
        let o = half * 128;
        for l in 0..32 {
            v[o + l] = (ql[l] & 0xf) | ((qh[l] & 3) << 4);
            v[o + 32 + l] = (ql[32 + l] & 0xf) | (((qh[l] >> 2) & 3) << 4);
            v[o + 64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            v[o + 96 + l] = (ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    pub unsafe fn q4k_group<const R: usize>(
        nb: usize,
        group: &[u8],
        a: [&[u8]; R],
        pairs: bool,
    ) -> [[f32; ROWS]; R] {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for b in 0..nb {
            let qa: [*const u8; R] = std::array::from_fn(|t| a[t].as_ptr().add(b * Q8_K_BYTES));
            q4k_block(group.as_ptr().add(b * BLOCK), qa, pairs, &mut acc);
        }
        let mut out = [[0.0f32; ROWS]; R];
        for t in 0..R {
            _mm512_storeu_ps(out[t].as_mut_ptr(), _mm512_sub_ps(acc[t][0], acc[t][1]));
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    pub unsafe fn q4k_rows_blocks(
        nb: usize,
        rows: &[&[u8]; ROWS],
        acts: &[&[u8]],
        out: &mut [[f32; ROWS]],
    ) {
        let n = acts.len();
        let mut acc = vec![[_mm512_setzero_ps(); 2]; n];
        let mut blk = [0u8; BLOCK];
        for b in 0..nb {
            super::pack_q4k_block(rows, b, &mut blk);
            let at = |t: usize| acts[t].as_ptr().add(b * Q8_K_BYTES);
            let mut t = 0;
            while t + 4 <= n {
                let mut four = [acc[t], acc[t + 1], acc[t + 2], acc[t + 3]];
                q4k_block(
                    blk.as_ptr(),
                    [at(t), at(t + 1), at(t + 2), at(t + 3)],
                    false,
                    &mut four,
                );
                acc[t..t + 4].copy_from_slice(&four);
                t += 4;
            }
            for (t, a) in acc.iter_mut().enumerate().skip(t) {
                let mut one = [*a];
                q4k_block(blk.as_ptr(), [at(t)], false, &mut one);
                *a = one[0];
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(a[0], a[1]));
        }
    }

    /// One packed block (`bw`) against `R` tokens' activation blocks (`qa`), into each token's
    /// `[sums, mins]` accumulators: ggml's float steps per pair of sub-blocks (`pairs`) or per
    /// block.
    #[inline(always)]
    unsafe fn q4k_block<const R: usize>(
        bw: *const u8,
        qa: [*const u8; R],
        pairs: bool,
        acc: &mut [[__m512; 2]; R],
    ) {
        let low4 = _mm512_set1_epi8(0x0f);
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(bw as *const __m256i));
        let dminw = _mm512_cvtph_ps(_mm256_loadu_si256(bw.add(AT_DMIN) as *const __m256i));
        let mut d = [_mm512_setzero_ps(); R];
        let mut dmin = [_mm512_setzero_ps(); R];
        // each token's sub-block sums of its activations (pairs of the 16 stored sums)
        let mut sub = [[0i32; 8]; R];
        for t in 0..R {
            let ba = qa[t];
            let da = _mm512_set1_ps(f32::from_le_bytes(*(ba as *const [u8; 4])));
            d[t] = _mm512_mul_ps(dw, da);
            dmin[t] = _mm512_mul_ps(dminw, da);
            for (j, s) in sub[t].iter_mut().enumerate() {
                let p = ba.add(4 + QK_K + 4 * j);
                *s = i16::from_le_bytes([*p, *p.add(1)]) as i32
                    + i16::from_le_bytes([*p.add(2), *p.add(3)]) as i32;
            }
        }
        let mut blk_s = [_mm512_setzero_si512(); R];
        let mut blk_m = [_mm512_setzero_si512(); R];
        for c in 0..4 {
            let mut lo_acc = [_mm512_setzero_si512(); R];
            let mut hi_acc = [_mm512_setzero_si512(); R];
            for piece in 0..8 {
                let v = _mm512_loadu_si512(
                    bw.add(AT_QS + (c * 8 + piece) * 4 * ROWS) as *const __m512i
                );
                let lo = _mm512_and_si512(v, low4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                for t in 0..R {
                    let x = qa[t].add(4);
                    let xl = (x.add(64 * c + 4 * piece) as *const i32).read_unaligned();
                    let xh = (x.add(64 * c + 32 + 4 * piece) as *const i32).read_unaligned();
                    lo_acc[t] = _mm512_dpbusd_epi32(lo_acc[t], lo, _mm512_set1_epi32(xl));
                    hi_acc[t] = _mm512_dpbusd_epi32(hi_acc[t], hi, _mm512_set1_epi32(xh));
                }
            }
            let byte_lanes =
                |at: usize| _mm512_cvtepu8_epi32(_mm_loadu_si128(bw.add(at) as *const __m128i));
            let (sc_lo, sc_hi) = (
                byte_lanes(AT_SCALES + 2 * c * ROWS),
                byte_lanes(AT_SCALES + (2 * c + 1) * ROWS),
            );
            let (mn_lo, mn_hi) = (
                byte_lanes(AT_MINS + 2 * c * ROWS),
                byte_lanes(AT_MINS + (2 * c + 1) * ROWS),
            );
            for t in 0..R {
                let p = _mm512_add_epi32(
                    _mm512_mullo_epi32(lo_acc[t], sc_lo),
                    _mm512_mullo_epi32(hi_acc[t], sc_hi),
                );
                let pm = _mm512_add_epi32(
                    _mm512_mullo_epi32(mn_lo, _mm512_set1_epi32(sub[t][2 * c])),
                    _mm512_mullo_epi32(mn_hi, _mm512_set1_epi32(sub[t][2 * c + 1])),
                );
                if pairs {
                    acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d[t], acc[t][0]);
                    acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pm), dmin[t], acc[t][1]);
                } else {
                    blk_s[t] = _mm512_add_epi32(blk_s[t], p);
                    blk_m[t] = _mm512_add_epi32(blk_m[t], pm);
                }
            }
        }
        if !pairs {
            for t in 0..R {
                acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(blk_s[t]), d[t], acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(blk_m[t]), dmin[t], acc[t][1]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    pub unsafe fn q6k_tiled_group(
        nb: usize,
        rows: &[&[u8]; ROWS],
        acts: &[&[u8]],
        out: &mut [[f32; ROWS]],
    ) {
        let n = acts.len();
        let mut acc = vec![_mm512_setzero_ps(); n];
        // the block's values, piece p (values 4p..4p+4) of row r at 64 p + 4 r
        let mut buf = [0u8; QK_K * ROWS];
        let mut vals = [0u8; QK_K];
        let mut dw = [0f32; ROWS];
        let mut sc = [[0i32; ROWS]; 16];
        for b in 0..nb {
            for (r, row) in rows.iter().enumerate() {
                super::q6k_values(row, b, &mut vals);
                for p in 0..QK_K / 4 {
                    buf[p * 4 * ROWS + 4 * r..p * 4 * ROWS + 4 * r + 4]
                        .copy_from_slice(&vals[4 * p..4 * p + 4]);
                }
                let bw = &row[b * Q6K_BYTES..(b + 1) * Q6K_BYTES];
                dw[r] = crate::model::quants::f16_to_f32(u16::from_le_bytes([bw[208], bw[209]]));
                for (s, scs) in sc.iter_mut().enumerate() {
                    scs[r] = bw[192 + s] as i8 as i32;
                }
            }
            let dwv = _mm512_loadu_ps(dw.as_ptr());
            let scv: [__m512i; 16] =
                std::array::from_fn(|s| _mm512_loadu_si512(sc[s].as_ptr() as *const __m512i));
            for (t, a) in acts.iter().enumerate() {
                let ba = a.as_ptr().add(b * Q8_K_BYTES);
                let da = f32::from_le_bytes(*(ba as *const [u8; 4]));
                let mut total = _mm512_setzero_si512();
                for (s, scs) in scv.iter().enumerate() {
                    let mut dot = _mm512_setzero_si512();
                    for p in 0..4 {
                        let w = _mm512_loadu_si512(
                            buf.as_ptr().add((4 * s + p) * 4 * ROWS) as *const __m512i
                        );
                        let x = (ba.add(4 + 16 * s + 4 * p) as *const i32).read_unaligned();
                        dot = _mm512_dpbusd_epi32(dot, w, _mm512_set1_epi32(x));
                    }
                    // the values' offset of 32 against this sub-block's activation sum
                    let q = ba.add(4 + QK_K + 2 * s);
                    let bsum = i16::from_le_bytes([*q, *q.add(1)]) as i32;
                    let dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(32 * bsum));
                    total = _mm512_add_epi32(total, _mm512_mullo_epi32(dot, *scs));
                }
                let res = _mm512_mul_ps(_mm512_cvtepi32_ps(total), dwv);
                acc[t] = _mm512_fmadd_ps(res, _mm512_set1_ps(da), acc[t]);
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            _mm512_storeu_ps(o.as_mut_ptr(), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::dot::{kernel, kernel4};
    use crate::model::quants::{f32_to_f16, quantize_activations};

    /// `n` activation rows of `cols` values `x(i, t)`, as Q8_K.
    fn q8k_acts(n: usize, cols: usize, x: impl Fn(usize, usize) -> f32) -> Vec<Vec<u8>> {
        (0..n)
            .map(|t| {
                let row: Vec<f32> = (0..cols).map(|i| x(i, t)).collect();
                let mut q = Vec::new();
                quantize_activations(GgmlType::Q8K, &row, &mut q).unwrap();
                q
            })
            .collect()
    }

    /// Q4_K rows with random quants, scales, mins and block scales.
    fn q4k_rows(rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        let mut data = Vec::new();
        for _ in 0..rows * cols / QK_K {
            let d = f32_to_f16(0.001 + (next() % 1000) as f32 * 1e-5).to_le_bytes();
            let m = f32_to_f16((next() % 1000) as f32 * 2e-5).to_le_bytes();
            data.extend_from_slice(&d);
            data.extend_from_slice(&m);
            for _ in 0..140 {
                data.push(next() as u8);
            }
        }
        data
    }

    #[test]
    fn q6k_tiled_groups_equal_the_row_kernel() {
        if !in_groups(ROWS) {
            return;
        }
        let mut seed = 0x0123_4567_89ab_cdefu64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let cols = 512;
        let nb = cols / QK_K;
        let mut w = Vec::new();
        for _ in 0..ROWS * nb {
            for _ in 0..208 {
                w.push(next() as u8);
            }
            let d = f32_to_f16(0.0005 + (next() % 1000) as f32 * 1e-6).to_le_bytes();
            w.extend_from_slice(&d);
        }
        let acts = q8k_acts(11, cols, |i, t| {
            (((i * 5 + t * 17) % 29) as f32 - 14.0) * 0.21
        });
        let refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
        let rb = nb * Q6K_BYTES;
        let rows: [&[u8]; ROWS] = std::array::from_fn(|r| &w[r * rb..(r + 1) * rb]);
        let mut out = vec![[0.0f32; ROWS]; refs.len()];
        q6k_tiled_group(cols, rows, &refs, &mut out);
        let (one, _) = crate::backend::cpu::dot::kernel_batched(GgmlType::Q6K).unwrap();
        for (t, a) in refs.iter().enumerate() {
            for r in 0..ROWS {
                assert_eq!(
                    out[t][r].to_bits(),
                    one(cols, rows[r], a).to_bits(),
                    "token {t} row {r}"
                );
            }
        }
    }

    #[test]
    fn packed_groups_equal_the_row_kernels() {
        if !packable(GgmlType::Q4K, ROWS) {
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let (rows, cols) = (32, 768);
        let w = q4k_rows(rows, cols, &mut seed);
        let packed = pack_q4k(&w, rows, cols);
        let acts = q8k_acts(4, cols, |i, t| {
            (((i * 7 + t * 13) % 23) as f32 - 11.0) * 0.37
        });
        let one = kernel(GgmlType::Q4K).unwrap();
        let four = kernel4(GgmlType::Q4K).unwrap();
        let rb = cols / QK_K * Q4K_BYTES;
        for g in 0..rows / ROWS {
            let grp = &packed[g * (cols / QK_K) * BLOCK..];
            let a4 = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
            let x4 = q4k_group_x4(cols, grp, a4);
            let x1 = q4k_group_x1(cols, grp, &acts[2]);
            for r in 0..ROWS {
                let row = &w[(g * ROWS + r) * rb..][..rb];
                let want4 = four(cols, row, a4);
                for t in 0..4 {
                    assert_eq!(
                        x4[t][r].to_bits(),
                        want4[t].to_bits(),
                        "group {g} row {r} token {t}"
                    );
                }
                assert_eq!(
                    x1[r].to_bits(),
                    one(cols, row, &acts[2]).to_bits(),
                    "row {r}"
                );
            }
        }
    }
}
