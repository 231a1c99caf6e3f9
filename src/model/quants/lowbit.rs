//! Ternary, 1- and 2-bit and FP4 formats: TQ1_0, TQ2_0, Q1_0, Q2_0, MXFP4, NVFP4, each decoded to
//! the shared grouped form.

use super::grouped::{Acts, Grouped};
use super::half::read_f16;
use super::tables::KVALUES_FP4;

/// TQ1_0: qs[48] with five base-3 digits per byte, qh[4] with four, d. A byte holds its digits as
/// a fixed-point fraction: multiplying by 3^n (mod 256) brings digit n to the top, and
/// `(byte * 3) >> 8` reads it.
pub fn tq1_0(b: &[u8]) -> Grouped {
    let (qs, qh) = (&b[0..48], &b[48..52]);
    let mut g = Grouped::new(256, 256, Acts::Q8K);
    g.scales[0] = read_f16(b, 52);
    let digit = |byte: u8, n: u32| ((byte.wrapping_mul(3u8.pow(n)) as u16 * 3) >> 8) as i32 - 1;
    let mut e = 0;
    // The first 32 bytes give 5 x 32 elements, the next 16 give 5 x 16, qh gives 4 x 4.
    for (bytes, digits) in [(&qs[0..32], 5), (&qs[32..48], 5), (qh, 4)] {
        for n in 0..digits {
            for &byte in bytes {
                g.q[e] = digit(byte, n);
                e += 1;
            }
        }
    }
    g
}

/// TQ2_0: qs[64] with four 2-bit digits per byte (value - 1), d.
pub fn tq2_0(b: &[u8]) -> Grouped {
    let mut g = Grouped::new(256, 256, Acts::Q8K);
    g.scales[0] = read_f16(b, 64);
    for (e, q) in g.q.iter_mut().enumerate() {
        let (chunk, shift, m) = (e / 128, (e % 128) / 32, e % 32);
        *q = ((b[32 * chunk + m] >> (2 * shift)) & 3) as i32 - 1;
    }
    g
}

/// Q1_0: d, then 128 sign bits (set: +d, clear: -d).
pub fn q1_0(b: &[u8]) -> Grouped {
    let mut g = Grouped::new(128, 128, Acts::Q8_0);
    g.scales[0] = read_f16(b, 0);
    for (e, q) in g.q.iter_mut().take(128).enumerate() {
        *q = if (b[2 + e / 8] >> (e % 8)) & 1 == 1 {
            1
        } else {
            -1
        };
    }
    g
}

/// Q2_0: d, then 64 2-bit values meaning -1, 0, 1, 2.
pub fn q2_0(b: &[u8]) -> Grouped {
    let mut g = Grouped::new(64, 64, Acts::Q8_0);
    g.scales[0] = read_f16(b, 0);
    for (e, q) in g.q.iter_mut().take(64).enumerate() {
        *q = ((b[2 + e / 4] >> (2 * (e % 4))) & 3) as i32 - 1;
    }
    g
}

/// E8M0 exponent byte to `2^(x - 127) / 2`, the half compensating for the doubled E2M1 levels.
fn e8m0_half(x: u8) -> f32 {
    f32::from_bits(if x < 2 {
        0x0020_0000 << x
    } else {
        (x as u32 - 1) << 23
    })
}

/// Unsigned E4M3 scale (bias 7, top bit ignored, 0x7f read as 0), halved like `e8m0_half`.
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let (exp, man) = ((x >> 3) & 0xf, (x & 7) as f32);
    let raw = if exp == 0 {
        man * f32::powi(2.0, -9)
    } else {
        (1.0 + man / 8.0) * f32::powi(2.0, exp as i32 - 7)
    };
    raw * 0.5
}

/// Sixteen E2M1 codes packed as a 16-element run (low nibbles first) in `qs[8]`.
fn fp4_run(qs: &[u8], out: &mut [i32]) {
    let half = qs.len();
    for (j, &byte) in qs.iter().enumerate() {
        out[j] = KVALUES_FP4[(byte & 0xf) as usize] as i32;
        out[j + half] = KVALUES_FP4[(byte >> 4) as usize] as i32;
    }
}

/// MXFP4: one E8M0 exponent, 32 E2M1 codes.
pub fn mxfp4(b: &[u8]) -> Grouped {
    let mut g = Grouped::new(32, 32, Acts::Q8_0);
    g.scales[0] = e8m0_half(b[0]);
    fp4_run(&b[1..17], &mut g.q[..32]);
    g
}

/// NVFP4: four UE4M3 scales, one per 16 elements, then 64 E2M1 codes.
pub fn nvfp4(b: &[u8]) -> Grouped {
    let mut g = Grouped::new(64, 16, Acts::Q8_0);
    for s in 0..4 {
        g.scales[s] = ue4m3_half(b[s]);
        fp4_run(&b[4 + 8 * s..12 + 8 * s], &mut g.q[16 * s..16 * (s + 1)]);
    }
    g
}
