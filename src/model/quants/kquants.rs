//! The 256-element "k-quant" super-blocks Q2_K..Q6_K (and Q8_K as a weight). Each is decoded to
//! 256 integer quants plus integer sub-block scales (and minimums for Q2_K, Q4_K, Q5_K) under
//! f16 super-scales; dequantization and the dot product against Q8_K are written once over that.

use super::activations::{q8_k_block, QK_K};
use super::half::read_f16;

pub struct BlockK {
    d: f32,
    /// Elements per sub-block: 16 (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K).
    group: usize,
    scales: [i32; 16],
    /// Super-scale and per-sub-block minimums, subtracted after scaling.
    mins: Option<(f32, [i32; 16])>,
    q: [i32; QK_K],
}

/// Q4_K / Q5_K pack eight 6-bit scales and eight 6-bit minimums into 12 bytes: the low six bits
/// of bytes 0..8 hold scales 0..4 and minimums 0..4; bytes 8..12 hold the low nibbles of scales
/// 4..8 and minimums 4..8, whose top two bits sit in the spare bits of bytes 0..8.
fn scale_min_6bit(s: &[u8], j: usize) -> (i32, i32) {
    if j < 4 {
        ((s[j] & 63) as i32, (s[j + 4] & 63) as i32)
    } else {
        (
            ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4)) as i32,
            ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i32,
        )
    }
}

impl BlockK {
    /// scales[16] (low nibble scale, high nibble min), qs[64] (2 bits), d, dmin.
    pub fn q2_k(b: &[u8]) -> BlockK {
        let (sc, qs) = (&b[0..16], &b[16..80]);
        BlockK {
            d: read_f16(b, 80),
            group: 16,
            scales: std::array::from_fn(|j| (sc[j] & 0xf) as i32),
            mins: Some((
                read_f16(b, 82),
                std::array::from_fn(|j| (sc[j] >> 4) as i32),
            )),
            q: std::array::from_fn(|e| {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                ((qs[32 * half + l] >> (2 * j)) & 3) as i32
            }),
        }
    }

    /// hmask[32] (high bit, set means no -4 offset), qs[64] (low 2 bits), 12 bytes of 6-bit
    /// scales offset by 32, d.
    pub fn q3_k(b: &[u8]) -> BlockK {
        let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
        BlockK {
            d: read_f16(b, 108),
            group: 16,
            scales: std::array::from_fn(|i| {
                let low = (sc[i % 8] >> (4 * (i / 8))) & 0xf;
                let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
                (low | (high << 4)) as i32 - 32
            }),
            mins: None,
            q: std::array::from_fn(|e| {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                let low = ((qs[32 * half + l] >> (2 * j)) & 3) as i32;
                let high = (hmask[l] >> (4 * half + j)) & 1;
                low - if high == 1 { 0 } else { 4 }
            }),
        }
    }

    /// d, dmin, 12 bytes of 6-bit scales/minimums, qs[128] (4 bits).
    pub fn q4_k(b: &[u8]) -> BlockK {
        let (sc, qs) = (&b[4..16], &b[16..144]);
        BlockK {
            d: read_f16(b, 0),
            group: 32,
            scales: scales_of(sc),
            mins: Some((read_f16(b, 2), mins_of(sc))),
            q: std::array::from_fn(|e| low4(qs, e)),
        }
    }

    /// As Q4_K plus qh[32] holding each element's fifth bit.
    pub fn q5_k(b: &[u8]) -> BlockK {
        let (sc, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
        BlockK {
            d: read_f16(b, 0),
            group: 32,
            scales: scales_of(sc),
            mins: Some((read_f16(b, 2), mins_of(sc))),
            q: std::array::from_fn(|e| {
                low4(qs, e) | ((((qh[e % 32] >> (e / 32)) & 1) as i32) << 4)
            }),
        }
    }

    /// ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d; quants offset by 32.
    pub fn q6_k(b: &[u8]) -> BlockK {
        let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
        BlockK {
            d: read_f16(b, 208),
            group: 16,
            scales: std::array::from_fn(|j| sc[j] as i8 as i32),
            mins: None,
            q: std::array::from_fn(|e| {
                let (half, quarter, l) = (e / 128, (e % 128) / 32, e % 32);
                let lo = ql[64 * half + 32 * (quarter % 2) + l] >> (4 * (quarter / 2));
                let hi = (qh[32 * half + l] >> (2 * quarter)) & 3;
                ((lo & 0xf) | (hi << 4)) as i32 - 32
            }),
        }
    }

    /// Q8_K read as a weight: f32 scale, int8 quants.
    pub fn q8_k(b: &[u8]) -> BlockK {
        let (y, _) = q8_k_block(b);
        BlockK {
            d: y.d,
            group: 16,
            scales: [1; 16],
            mins: None,
            q: std::array::from_fn(|e| y.q(e)),
        }
    }

    pub fn dequantize(&self, y: &mut [f32]) {
        for (g, (out, q)) in y
            .chunks_exact_mut(self.group)
            .zip(self.q.chunks_exact(self.group))
            .enumerate()
        {
            let dl = self.d * self.scales[g] as f32;
            match self.mins {
                None => out.iter_mut().zip(q).for_each(|(o, &q)| *o = dl * q as f32),
                Some((dmin, m)) => {
                    let ml = dmin * m[g] as f32;
                    out.iter_mut()
                        .zip(q)
                        .for_each(|(o, &q)| *o = dl * q as f32 - ml)
                }
            }
        }
    }

    /// Dot product with one Q8_K block. Minimums meet the activation block's stored 16-element
    /// sums, as ggml's kernels use them.
    pub fn dot(&self, a: &[u8]) -> f32 {
        let (y, bsums) = q8_k_block(a);
        let mut isum = 0i32;
        for (g, q) in self.q.chunks_exact(self.group).enumerate() {
            let base = g * self.group;
            let s: i32 = q.iter().enumerate().map(|(i, &q)| q * y.q(base + i)).sum();
            isum += self.scales[g] * s;
        }
        let mut sumf = (y.d * self.d) * isum as f32;
        if let Some((dmin, m)) = self.mins {
            let per = self.group / 16;
            let summs: i32 = (0..QK_K / self.group)
                .map(|g| m[g] * bsums[g * per..(g + 1) * per].iter().sum::<i32>())
                .sum();
            sumf -= (y.d * dmin) * summs as f32;
        }
        sumf
    }
}

/// Element `e` of 4-bit quants stored 64 elements per 32 bytes, low nibbles first.
fn low4(qs: &[u8], e: usize) -> i32 {
    ((qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0xf) as i32
}

fn scales_of(sc: &[u8]) -> [i32; 16] {
    std::array::from_fn(|j| if j < 8 { scale_min_6bit(sc, j).0 } else { 0 })
}

fn mins_of(sc: &[u8]) -> [i32; 16] {
    std::array::from_fn(|j| if j < 8 { scale_min_6bit(sc, j).1 } else { 0 })
}
