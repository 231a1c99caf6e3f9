//! The 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (and Q8_1 as a weight). Each block
//! is decoded to 32 integer quants, a scale and, for the `_1` types, a minimum; dequantization and
//! the dot product are then written once over that decoded form.

use super::activations::{q8_0_block, q8_1_block, QK8_0};
use super::half::read_f16;

pub struct Block32 {
    d: f32,
    /// Added after scaling (Q4_1, Q5_1); such blocks pair with Q8_1 activations.
    min: Option<f32>,
    q: [i32; QK8_0],
}

/// Low nibbles hold elements 0..16, high nibbles 16..32.
fn nibble(qs: &[u8], e: usize) -> i32 {
    if e < 16 {
        (qs[e] & 0xf) as i32
    } else {
        (qs[e - 16] >> 4) as i32
    }
}

fn with_fifth_bits(qh: &[u8], qs: &[u8], offset: i32) -> [i32; QK8_0] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    std::array::from_fn(|e| (nibble(qs, e) | ((((qh >> e) & 1) as i32) << 4)) - offset)
}

impl Block32 {
    pub fn q4_0(b: &[u8]) -> Block32 {
        Block32 {
            d: read_f16(b, 0),
            min: None,
            q: std::array::from_fn(|e| nibble(&b[2..18], e) - 8),
        }
    }

    pub fn q4_1(b: &[u8]) -> Block32 {
        Block32 {
            d: read_f16(b, 0),
            min: Some(read_f16(b, 2)),
            q: std::array::from_fn(|e| nibble(&b[4..20], e)),
        }
    }

    pub fn q5_0(b: &[u8]) -> Block32 {
        Block32 {
            d: read_f16(b, 0),
            min: None,
            q: with_fifth_bits(&b[2..6], &b[6..22], 16),
        }
    }

    pub fn q5_1(b: &[u8]) -> Block32 {
        Block32 {
            d: read_f16(b, 0),
            min: Some(read_f16(b, 2)),
            q: with_fifth_bits(&b[4..8], &b[8..24], 0),
        }
    }

    pub fn q8_0(b: &[u8]) -> Block32 {
        Block32 {
            d: read_f16(b, 0),
            min: None,
            q: std::array::from_fn(|e| b[2 + e] as i8 as i32),
        }
    }

    /// Q8_1 read as a weight: its sum field plays no part in the values.
    pub fn q8_1(b: &[u8]) -> Block32 {
        Block32 {
            d: read_f16(b, 0),
            min: None,
            q: std::array::from_fn(|e| b[4 + e] as i8 as i32),
        }
    }

    pub fn dequantize(&self, y: &mut [f32]) {
        for (out, &q) in y.iter_mut().zip(&self.q) {
            *out = match self.min {
                None => self.d * q as f32,
                Some(m) => self.d * q as f32 + m,
            };
        }
    }

    /// Dot product with the activation block covering the same 32 elements: Q8_1 when the block
    /// has a minimum (its `d * sum` term carries the offset), Q8_0 otherwise.
    pub fn dot(&self, a: &[u8]) -> f32 {
        match self.min {
            None => {
                let y = q8_0_block(a);
                let sumi: i32 = (0..QK8_0).map(|i| self.q[i] * y.q(i)).sum();
                sumi as f32 * (self.d * y.d)
            }
            Some(m) => {
                let (y, s) = q8_1_block(a);
                let sumi: i32 = (0..QK8_0).map(|i| self.q[i] * y.q(i)).sum();
                (self.d * y.d) * sumi as f32 + m * s
            }
        }
    }
}
