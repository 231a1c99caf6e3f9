//! Elementwise helpers on half-precision vectors for attention, dispatched like the dot kernels.

use super::dot::{isa, Isa};
use crate::model::quants::{f16_to_f32, f32_to_f16};

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

/// `y = f16(y + x * v)`, one rounding per element.
pub fn mad_f16(y: &mut [u16], x: &[u8], v: f32) {
    match isa() {
        // SAFETY: the features were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { super::avx2::mad_f16(y, x, v) },
        _ => mad_f16_scalar(y, x, v),
    }
}

/// `y = f16(y * v)`.
pub fn scale_f16(y: &mut [u16], v: f32) {
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

#[cfg(test)]
mod tests {
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
        mad_f16(&mut a, &x, 0.3);
        mad_f16_scalar(&mut b, &x, 0.3);
        assert_eq!(a, b);
        scale_f16(&mut a, 0.7);
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
}
