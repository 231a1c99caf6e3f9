//! The "i-quants": IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (points of a lattice grid
//! with separately stored signs) and IQ4_NL, IQ4_XS (a non-linear 16-level table), each decoded to
//! the shared grouped form.

use super::grouped::{Acts, Grouped};
use super::half::{f16_to_f32, read_f16};
use super::tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};

/// The shift IQ1_S / IQ1_M grids carry: +1/8, or -1/8 when the sign bit is set.
const IQ1_DELTA: f32 = 0.125;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Byte `j` of a packed grid point, as an unsigned magnitude.
fn grid_byte(point: u64, j: usize) -> i32 {
    ((point >> (8 * j)) & 0xff) as i32
}

/// Writes `count` grid magnitudes with the signs of bits `sign_shift..` of `signs`.
fn put_signed(q: &mut [i32], point: u64, count: usize, signs: u8, sign_shift: usize) {
    for (j, out) in q.iter_mut().enumerate().take(count) {
        let m = grid_byte(point, j);
        *out = if (signs >> (sign_shift + j)) & 1 == 1 {
            -m
        } else {
            m
        };
    }
}

/// `d * (0.5 + s) * k`: the IQ2/IQ3_XXS sub-block scale, in ggml's order of float operations.
fn half_step_scale(d: f32, s: u32, k: f32) -> f32 {
    d * (0.5 + s as f32) * k
}

/// IQ2_XXS: d, then per 32 elements two u32: four 8-bit grid indices; four 7-bit sign indices
/// and a 4-bit scale.
pub fn iq2_xxs(b: &[u8]) -> Grouped {
    let d = read_f16(b, 0);
    let mut g = Grouped::new(256, 32, Acts::Q8K);
    for ib in 0..8 {
        let at = 2 + 8 * ib;
        let aux = u32_at(b, at + 4);
        g.scales[ib] = half_step_scale(d, aux >> 28, 0.25);
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let point = IQ2XXS_GRID[b[at + l] as usize];
            put_signed(&mut g.q[32 * ib + 8 * l..], point, 8, signs, 0);
        }
    }
    g
}

/// IQ2_XS: d, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of two 4-bit scales.
pub fn iq2_xs(b: &[u8]) -> Grouped {
    let d = read_f16(b, 0);
    let mut g = Grouped::new(256, 16, Acts::Q8K);
    for ib in 0..8 {
        let sc = b[66 + ib];
        g.scales[2 * ib] = half_step_scale(d, (sc & 0xf) as u32, 0.25);
        g.scales[2 * ib + 1] = half_step_scale(d, (sc >> 4) as u32, 0.25);
        for l in 0..4 {
            let v = u16_at(b, 2 + 2 * (4 * ib + l));
            let point = IQ2XS_GRID[(v & 511) as usize];
            let signs = KSIGNS_IQ2XS[(v >> 9) as usize];
            put_signed(&mut g.q[32 * ib + 8 * l..], point, 8, signs, 0);
        }
    }
    g
}

/// IQ2_S: d, qs[32] grid index low bits, signs[32] (explicit, one bit per element), qh[8] (2 high
/// index bits per group of 8), 8 bytes of two 4-bit scales.
pub fn iq2_s(b: &[u8]) -> Grouped {
    let d = read_f16(b, 0);
    let (qs, signs, qh, sc) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    let mut g = Grouped::new(256, 16, Acts::Q8K);
    for ib in 0..8 {
        g.scales[2 * ib] = half_step_scale(d, (sc[ib] & 0xf) as u32, 0.25);
        g.scales[2 * ib + 1] = half_step_scale(d, (sc[ib] >> 4) as u32, 0.25);
        for l in 0..4 {
            let index = qs[4 * ib + l] as usize | ((((qh[ib] >> (2 * l)) & 3) as usize) << 8);
            let out = &mut g.q[32 * ib + 8 * l..];
            put_signed(out, IQ2S_GRID[index], 8, signs[4 * ib + l], 0);
        }
    }
    g
}

/// IQ3_XXS: d, qs[64] (8-bit indices into a grid of 4-value points), then per 32 elements one
/// u32 of four 7-bit sign indices and a 4-bit scale.
pub fn iq3_xxs(b: &[u8]) -> Grouped {
    let d = read_f16(b, 0);
    let (qs, aux) = (&b[2..66], &b[66..98]);
    let mut g = Grouped::new(256, 32, Acts::Q8K);
    for ib in 0..8 {
        let a = u32_at(aux, 4 * ib);
        g.scales[ib] = half_step_scale(d, a >> 28, 0.5);
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((a >> (7 * l)) & 127) as usize];
            let out = &mut g.q[32 * ib + 8 * l..];
            let p1 = IQ3XXS_GRID[qs[8 * ib + 2 * l] as usize] as u64;
            let p2 = IQ3XXS_GRID[qs[8 * ib + 2 * l + 1] as usize] as u64;
            put_signed(out, p1, 4, signs, 0);
            put_signed(&mut out[4..], p2, 4, signs, 4);
        }
    }
    g
}

/// IQ3_S: d, qs[64] (index low bits), qh[8] (index bit 8, one per index), signs[32] (one bit per
/// element), 4 bytes of two 4-bit scales meaning `1 + 2s`.
pub fn iq3_s(b: &[u8]) -> Grouped {
    let d = read_f16(b, 0);
    let (qs, qh, signs, sc) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    let mut g = Grouped::new(256, 32, Acts::Q8K);
    for ib in 0..8 {
        let s = (sc[ib / 2] >> (4 * (ib % 2))) & 0xf;
        g.scales[ib] = d * (1 + 2 * s as i32) as f32;
        for m in 0..8 {
            let index = qs[8 * ib + m] as usize | ((((qh[ib] >> m) & 1) as usize) << 8);
            let sign_byte = signs[4 * ib + m / 2];
            let out = &mut g.q[32 * ib + 4 * m..];
            put_signed(out, IQ3S_GRID[index] as u64, 4, sign_byte, 4 * (m % 2));
        }
    }
    g
}

/// Byte `j` of an IQ1 grid point, a signed value in {-1, 0, 1}.
fn iq1_value(point: u64, j: usize) -> i32 {
    ((point >> (8 * j)) & 0xff) as u8 as i8 as i32
}

fn iq1_delta(negative: bool) -> f32 {
    if negative {
        -IQ1_DELTA
    } else {
        IQ1_DELTA
    }
}

/// IQ1_S: d, qs[32] (index low bits), then per 32 elements one u16: four 3-bit index high parts,
/// a 3-bit scale meaning `2s + 1`, and the delta's sign.
pub fn iq1_s(b: &[u8]) -> Grouped {
    let d = read_f16(b, 0);
    let qs = &b[2..34];
    let mut g = Grouped::new(256, 32, Acts::Q8K);
    for ib in 0..8 {
        let qh = u16_at(b, 34 + 2 * ib);
        g.scales[ib] = d * (2 * ((qh >> 12) & 7) as i32 + 1) as f32;
        g.offsets[ib] = iq1_delta(qh & 0x8000 != 0);
        for l in 0..4 {
            let index = qs[4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
            for j in 0..8 {
                g.q[32 * ib + 8 * l + j] = iq1_value(IQ1S_GRID[index], j);
            }
        }
    }
    g
}

/// IQ1_M: qs[32] (index low bits), qh[16] (a nibble per group of 8: 3 index high bits and the
/// delta's sign), scales as four u16 whose low 12 bits hold four 3-bit scales (`2s + 1`, one per
/// 16 elements) and whose top nibbles together form the f16 super-scale.
pub fn iq1_m(b: &[u8]) -> Grouped {
    let (qs, qh) = (&b[0..32], &b[32..48]);
    let sc: [u16; 4] = std::array::from_fn(|i| u16_at(b, 48 + 2 * i));
    let d = f16_to_f32(
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000),
    );
    let mut g = Grouped::new(256, 8, Acts::Q8K);
    for k in 0..32 {
        let s = (sc[k / 8] >> (3 * ((k / 2) % 4))) & 7;
        g.scales[k] = d * (2 * s as i32 + 1) as f32;
        let nibble = (qh[k / 2] >> (4 * (k % 2))) & 0xf;
        g.offsets[k] = iq1_delta(nibble & 8 != 0);
        let index = qs[k] as usize | (((nibble & 7) as usize) << 8);
        for j in 0..8 {
            g.q[8 * k + j] = iq1_value(IQ1S_GRID[index], j);
        }
    }
    g
}

/// IQ4_NL: d, 32 4-bit table indices laid out as Q4_0's.
pub fn iq4_nl(b: &[u8]) -> Grouped {
    let mut g = Grouped::new(32, 32, Acts::Q8_0);
    g.scales[0] = read_f16(b, 0);
    for j in 0..16 {
        g.q[j] = KVALUES_IQ4NL[(b[2 + j] & 0xf) as usize] as i32;
        g.q[j + 16] = KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as i32;
    }
    g
}

/// IQ4_XS: d, scales_h (u16, 2 high bits per 32 elements), scales_l[4] (4 low bits each), then
/// 32-element runs laid out as IQ4_NL's; scales are offset by 32.
pub fn iq4_xs(b: &[u8]) -> Grouped {
    let d = read_f16(b, 0);
    let scales_h = u16_at(b, 2);
    let mut g = Grouped::new(256, 32, Acts::Q8K);
    for ib in 0..8 {
        let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        g.scales[ib] = d * ((low | (high << 4)) as i32 - 32) as f32;
        let qs = &b[8 + 16 * ib..24 + 16 * ib];
        for j in 0..16 {
            g.q[32 * ib + j] = KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as i32;
            g.q[32 * ib + j + 16] = KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
        }
    }
    g
}
