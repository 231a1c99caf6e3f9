//! Quantized activation formats (Q8_0, Q8_1, Q8_K) and their quantizers, rounding exactly as
//! ggml's reference quantizers do so that dot products match upstream's bit for bit.

use super::half::{f32_to_f16, read_f16};

pub const QK8_0: usize = 32;
pub const QK_K: usize = 256;
/// f32 scale, 256 int8 quants, 16 int16 sums of 16 quants each.
pub const Q8_K_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);

/// Scale `amax / 127` and its inverse (0 for an all-zero block), as Q8_0 and Q8_1 use them.
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// Appends Q8_0 blocks for `x` (length a multiple of 32): f16 scale, 32 int8 rounded half away
/// from zero.
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    for blk in x.chunks_exact(QK8_0) {
        let (d, id) = q8_scale(blk);
        out.extend(f32_to_f16(d).to_le_bytes());
        out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
    }
}

/// Appends Q8_1 blocks: as Q8_0 plus the f16 of `d * sum(quants)`, which Q4_1 / Q5_1 dot
/// products use for their offset term.
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<u8>) {
    for blk in x.chunks_exact(QK8_0) {
        let (d, id) = q8_scale(blk);
        let qs: Vec<i8> = blk.iter().map(|v| (v * id).round() as i8).collect();
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        out.extend(f32_to_f16(d).to_le_bytes());
        out.extend(f32_to_f16(sum as f32 * d).to_le_bytes());
        out.extend(qs.iter().map(|&q| q as u8));
    }
}

/// Appends Q8_K blocks for `x` (length a multiple of 256). The scale comes from the element of
/// largest magnitude (the first one on ties) with its sign, mapped to -127; quants round half to
/// even and are capped at 127.
pub fn quantize_q8_k(x: &[f32], out: &mut Vec<u8>) {
    for blk in x.chunks_exact(QK_K) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in blk {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            out.extend(std::iter::repeat_n(0u8, Q8_K_BYTES));
            continue;
        }
        let iscale = -127.0 / max;
        let qs: Vec<i8> = blk
            .iter()
            .map(|&v| ((iscale * v).round_ties_even() as i32).min(127) as i8)
            .collect();
        out.extend((1.0 / iscale).to_le_bytes());
        out.extend(qs.iter().map(|&q| q as u8));
        for group in qs.chunks_exact(16) {
            let s: i32 = group.iter().map(|&q| q as i32).sum();
            out.extend((s as i16).to_le_bytes());
        }
    }
}

/// Views of one activation block's fields.
pub struct Q8Block<'a> {
    pub d: f32,
    pub qs: &'a [u8],
}

impl Q8Block<'_> {
    pub fn q(&self, i: usize) -> i32 {
        self.qs[i] as i8 as i32
    }
}

pub fn q8_0_block(b: &[u8]) -> Q8Block<'_> {
    Q8Block {
        d: read_f16(b, 0),
        qs: &b[2..2 + QK8_0],
    }
}

/// A Q8_1 block and its `d * sum` term.
pub fn q8_1_block(b: &[u8]) -> (Q8Block<'_>, f32) {
    (
        Q8Block {
            d: read_f16(b, 0),
            qs: &b[4..4 + QK8_0],
        },
        read_f16(b, 2),
    )
}

/// A Q8_K block and its 16 group sums.
pub fn q8_k_block(b: &[u8]) -> (Q8Block<'_>, [i32; 16]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut bsums = [0i32; 16];
    for (j, s) in bsums.iter_mut().enumerate() {
        let at = 4 + QK_K + 2 * j;
        *s = i16::from_le_bytes([b[at], b[at + 1]]) as i32;
    }
    (
        Q8Block {
            d,
            qs: &b[4..4 + QK_K],
        },
        bsums,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_k_takes_the_signed_extreme() {
        let mut x = vec![0.0f32; QK_K];
        x[3] = -2.0;
        x[7] = 1.0;
        x[9] = 2.0;
        let mut out = Vec::new();
        quantize_q8_k(&x, &mut out);
        let (b, sums) = q8_k_block(&out);
        // The first largest magnitude is -2.0: it maps to -127, so the inverse scale is 63.5.
        assert_eq!(b.q(3), -127);
        assert_eq!(b.q(9), 127);
        assert_eq!(b.q(7), 64, "63.5 rounds half to even");
        assert_eq!(sums[0], 64);
        assert_eq!(b.d, 1.0 / 63.5);
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        let mut x = vec![0.0f32; QK8_0];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let mut out = Vec::new();
        quantize_q8_0(&x, &mut out);
        let b = q8_0_block(&out);
        assert_eq!((b.q(0), b.q(1), b.q(2)), (127, 3, -3));
    }
}
