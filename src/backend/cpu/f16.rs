//! IEEE half-precision conversion, rounding to nearest-even as the F16C instructions do (ggml's
//! CPU backend converts with them, so our rounding must agree bit for bit).

/// f16 bits -> f32 (exact).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // subnormal: value = man * 2^-24
            let v = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// f32 -> f16 bits, round to nearest, ties to even; overflow gives infinity, NaN stays NaN.
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        return sign
            | 0x7c00
            | if man != 0 {
                0x200 | (man >> 13) as u16
            } else {
                0
            };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // subnormal half: shift the full mantissa (with its implicit bit) into place
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && (h & 1) == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1; // a carry into the exponent is the correct rounding (up to infinity)
    }
    sign | h as u16
}

/// Rounds through f16 and back.
#[inline]
pub fn round_f16(f: f32) -> f32 {
    f16_to_f32(f32_to_f16(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_round_trips() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16(f), h, "half {h:#06x} = {f}");
            }
        }
    }

    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and the next half: ties go to the even (1.0)
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25)), 0);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25) * 1.5), 1);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn agrees_with_f16c() {
        if !is_x86_feature_detected!("f16c") {
            return;
        }
        let mut state = 0x1234_5678u32;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let f = f32::from_bits(state);
            if f.is_nan() {
                continue;
            }
            // SAFETY: f16c was detected above.
            let hw = unsafe { f16c_convert(f) };
            assert_eq!(f32_to_f16(f), hw, "{f:e}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "f16c")]
    unsafe fn f16c_convert(f: f32) -> u16 {
        use std::arch::x86_64::*;
        _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0) as u16
    }
}
