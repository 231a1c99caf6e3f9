//! IEEE half (f16) and bfloat16 conversions, bit-identical to ggml's: round to nearest even,
//! subnormals kept, NaN made quiet (in both directions).

/// Exact widening of an IEEE binary16 value.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match exp {
        0 => {
            // Zero or subnormal: mant * 2^-24 is exact in f32.
            let v = mant as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        0x1f if mant == 0 => sign | 0x7f80_0000,
        // NaN comes out quiet, as ggml's conversion (a float multiply) makes it.
        0x1f => sign | 0x7fc0_0000 | (mant << 13),
        _ => sign | ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

/// Narrowing to binary16 with round-to-nearest-even; NaN becomes ggml's quiet NaN `0x7e00`.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let abs = b & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    // 65520 and above (and infinity) round to infinity.
    if abs >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    let exp = (abs >> 23) as i32 - 127 + 15;
    let mant = abs & 0x7f_ffff;
    if exp >= 1 {
        let half = ((exp as u32) << 10) | (mant >> 13);
        let rest = mant & 0x1fff;
        let up = rest > 0x1000 || (rest == 0x1000 && half & 1 == 1);
        // A carry out of the mantissa correctly bumps the exponent.
        return sign | (half + up as u32) as u16;
    }
    // Subnormal result: count in units of 2^-24.
    let shift = (14 - exp) as u32;
    if shift > 24 {
        return sign;
    }
    let m = mant | 0x80_0000;
    let half = m >> shift;
    let rest = m & ((1 << shift) - 1);
    let halfway = 1 << (shift - 1);
    let up = rest > halfway || (rest == halfway && half & 1 == 1);
    sign | (half + up as u32) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Narrowing to bfloat16 with round-to-nearest-even; NaN keeps its top bits and is made quiet.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 64) as u16;
    }
    ((b as u64 + 0x7fff + ((b >> 16) & 1) as u64) >> 16) as u16
}

/// Little-endian f16 at `b[at..at + 2]`, widened.
pub(crate) fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert_eq!(f32_to_f16(f) & 0x7c00, 0x7c00);
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f}");
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0000)), 0);
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0001)), 1);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        assert_eq!(f32_to_f16(f32::NAN), 0x7e00);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_to_f32(0x4049), f32::from_bits(0x4049_0000));
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }
}
