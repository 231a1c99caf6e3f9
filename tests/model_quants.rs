//! ggml types: the reference dot product of every weight type against its activation format
//! agrees with dequantize-then-dot, and dequantization matches the `gguf` package's numpy code bit
//! for bit.

use bloomery::model::quants::{self, f32_to_f16};
use bloomery::model::GgmlType;

/// splitmix64: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Byte offsets of the f16 scale fields in one block, so random blocks get finite, sane scales.
fn f16_fields(t: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match t {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        _ => &[],
    }
}

/// Random weight blocks of `t` with small positive f16 scales.
fn random_blocks(rng: &mut Rng, t: GgmlType, n_blocks: usize) -> Vec<u8> {
    let mut b = rng.bytes(n_blocks * t.type_size());
    for blk in b.chunks_exact_mut(t.type_size()) {
        for &at in f16_fields(t) {
            let h = f32_to_f16(0.001 + 0.02 * rng.unit().abs());
            blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    b
}

const BLOCK_TYPES: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

#[test]
fn reference_dot_matches_dequantize_then_dot() {
    let mut rng = Rng(7);
    let n = 1024;
    let float_types = [GgmlType::F32, GgmlType::F16, GgmlType::Bf16];
    for &t in BLOCK_TYPES.iter().chain(&float_types) {
        let at = quants::vec_dot_type(t);
        for round in 0..20 {
            let w = if float_types.contains(&t) {
                let x: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
                let mut w = Vec::new();
                quants::quantize_activations(t, &x, &mut w).unwrap();
                w
            } else {
                random_blocks(&mut rng, t, n / t.block_size())
            };
            let x: Vec<f32> = (0..n).map(|_| rng.unit() * 3.0).collect();
            let mut a = Vec::new();
            quants::quantize_activations(at, &x, &mut a).unwrap();
            let mut wf = vec![0f32; n];
            let mut af = vec![0f32; n];
            quants::dequantize(t, &w, &mut wf).unwrap();
            quants::dequantize(at, &a, &mut af).unwrap();
            let want: f64 = wf.iter().zip(&af).map(|(&w, &a)| w as f64 * a as f64).sum();
            let scale: f64 = wf
                .iter()
                .zip(&af)
                .map(|(&w, &a)| (w as f64 * a as f64).abs())
                .sum();
            let got = quants::vec_dot_ref(t, &w, &a, n).unwrap() as f64;
            assert!(
                (got - want).abs() <= 1e-5 * scale + 1e-6,
                "{t} round {round}: reference dot {got}, dequantize-then-dot {want} (scale {scale})"
            );
        }
    }
}

#[test]
fn refuses_wrong_lengths_by_name() {
    let mut y = vec![0f32; 32];
    let e = quants::dequantize(GgmlType::Q4_0, &[0u8; 17], &mut y).unwrap_err();
    assert!(e.to_string().contains("q4_0"), "{e}");
    let mut y = vec![0f32; 33];
    let e = quants::dequantize(GgmlType::Q4_0, &[0u8; 18], &mut y).unwrap_err();
    assert!(e.to_string().contains("whole number"), "{e}");
    let e = quants::vec_dot_ref(GgmlType::Q4K, &[0u8; 144], &[0u8; 10], 256).unwrap_err();
    assert!(e.to_string().contains("activations"), "{e}");
}
