//! The decoded form shared by the lookup-table, ternary and FP4 formats: integer values per element
//! (grid points with their signs, table levels, ternary digits), one float scale and one additive
//! offset per group of elements, so that `y = scale * (q + offset)`. The offset is 0 except for
//! IQ1_S / IQ1_M, whose grids are shifted by a signed delta.

use super::activations::{q8_0_block, q8_k_block, Q8Block, QK8_0, QK_K};

/// Which activation format the type's dot product takes.
#[derive(Clone, Copy)]
pub enum Acts {
    Q8_0,
    Q8K,
}

pub struct Grouped {
    pub n: usize,
    pub group: usize,
    pub q: [i32; QK_K],
    pub scales: [f32; 32],
    pub offsets: [f32; 32],
    pub acts: Acts,
}

impl Grouped {
    /// A block of `n` elements in groups of `group`, all values, scales and offsets zero.
    pub fn new(n: usize, group: usize, acts: Acts) -> Grouped {
        Grouped {
            n,
            group,
            q: [0; QK_K],
            scales: [0.0; 32],
            offsets: [0.0; 32],
            acts,
        }
    }

    pub fn dequantize(&self, y: &mut [f32]) {
        for (e, out) in y.iter_mut().enumerate().take(self.n) {
            let g = e / self.group;
            *out = self.scales[g] * (self.q[e] as f32 + self.offsets[g]);
        }
    }

    /// Dot product with the activation blocks covering this block's elements. Sums are taken in
    /// integers over each run of elements sharing a group and an activation block, then scaled.
    pub fn dot(&self, a: &[u8]) -> f32 {
        let (act_block, act_bytes) = match self.acts {
            Acts::Q8_0 => (QK8_0, 34),
            Acts::Q8K => (QK_K, 292),
        };
        let run = self.group.min(act_block);
        let mut sumf = 0.0f32;
        for start in (0..self.n).step_by(run) {
            let g = start / self.group;
            let b = start / act_block;
            let blk = &a[b * act_bytes..(b + 1) * act_bytes];
            let y: Q8Block = match self.acts {
                Acts::Q8_0 => q8_0_block(blk),
                Acts::Q8K => q8_k_block(blk).0,
            };
            let (mut isum, mut asum) = (0i32, 0i32);
            for e in start..start + run {
                let qa = y.q(e % act_block);
                isum += self.q[e] * qa;
                asum += qa;
            }
            sumf += self.scales[g] * y.d * (isum as f32 + self.offsets[g] * asum as f32);
        }
        sumf
    }
}
