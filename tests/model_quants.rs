//! ggml types: the reference dot product of every weight type against its activation format
//! agrees with dequantize-then-dot, and dequantization matches the `gguf` package's numpy code bit
//! for bit.

mod model_common;

use bloomery::model::quants::{self, f32_to_f16};
use bloomery::model::GgmlType;
use model_common::{gguf_py, oracle, Rng};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// IQ1_M spreads its f16 super-scale over the top nibbles of its last four u16.
fn set_iq1m_scale(blk: &mut [u8], h: u16) {
    for i in 0..4 {
        let at = 48 + 2 * i + 1;
        blk[at] = (blk[at] & 0x0f) | ((((h >> (4 * i)) & 0xf) as u8) << 4);
    }
}

/// Random weight blocks of `t` with small positive scales.
fn random_blocks(rng: &mut Rng, t: GgmlType, n_blocks: usize) -> Vec<u8> {
    let mut b = rng.bytes(n_blocks * t.type_size());
    for blk in b.chunks_exact_mut(t.type_size()) {
        for &at in quants::f16_scale_offsets(t) {
            let h = f32_to_f16(0.001 + 0.02 * rng.unit().abs());
            blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
        match t {
            // E8M0 exponent near 2^-6.
            GgmlType::Mxfp4 => blk[0] = 118 + (rng.next() % 6) as u8,
            GgmlType::Iq1M => set_iq1m_scale(blk, f32_to_f16(0.001 + 0.02 * rng.unit().abs())),
            _ => {}
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
    GgmlType::Iq1S,
    GgmlType::Iq1M,
    GgmlType::Iq2Xxs,
    GgmlType::Iq2Xs,
    GgmlType::Iq2S,
    GgmlType::Iq3Xxs,
    GgmlType::Iq3S,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Tq1_0,
    GgmlType::Tq2_0,
    GgmlType::Mxfp4,
    GgmlType::Nvfp4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

/// Types the `gguf` package cannot dequantize (ggml-common.h has them, gguf-py does not yet).
const NOT_IN_GGUF_PY: &[GgmlType] = &[GgmlType::Q1_0, GgmlType::Q2_0];

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
        for &at in quants::f16_scale_offsets(t) {
            make_finite(&mut blk[at + 1]);
        }
        if t == GgmlType::Iq1M {
            // The super-scale's exponent top bit is bit 14, in the last byte.
            let d = (0..4).fold(0u16, |d, i| {
                d | (((blk[49 + 2 * i] >> 4) as u16) << (4 * i))
            });
            if d & 0x7c00 == 0x7c00 {
                blk[55] &= !0x40;
            }
        }
    }
    b
}

#[test]
fn dequantization_matches_gguf_py_bit_for_bit() {
    let gguf_py = or_skip!(gguf_py());
    let dir = std::env::temp_dir().join(format!("bloomery-quant-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng(11);
    let types: Vec<GgmlType> = [GgmlType::F32, GgmlType::F16, GgmlType::Bf16]
        .into_iter()
        .chain(BLOCK_TYPES.iter().copied())
        .filter(|t| !NOT_IN_GGUF_PY.contains(t))
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

/// ggml's own C routines (scripts/ggml_oracle.c with the sdist's ggml-quants.c), built once into
/// a temporary folder; or why they cannot be built here.
fn ggml_oracle() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let gguf_py = gguf_py()?;
            let ggml = gguf_py.parent().unwrap().join("ggml");
            let dir =
                std::env::temp_dir().join(format!("bloomery-ggml-oracle-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let exe = dir.join("ggml_oracle");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ggml_oracle.c");
            let out = Command::new("cc")
                .args(["-O1", "-w", "-o"])
                .arg(&exe)
                .arg("-I")
                .arg(ggml.join("include"))
                .arg("-I")
                .arg(ggml.join("src"))
                .arg(script)
                .arg(ggml.join("src/ggml-quants.c"))
                .arg("-lm")
                .output()
                .map_err(|e| format!("no C compiler: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "building ggml_oracle failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(exe)
        })
        .clone()
}

fn run_ggml_oracle(exe: &Path, op: &str, t: GgmlType, input: &[u8]) -> Vec<u8> {
    let dir = exe.parent().unwrap();
    let (src, dst) = (
        dir.join(format!("{op}-{t}.in")),
        dir.join(format!("{op}-{t}.out")),
    );
    std::fs::write(&src, input).unwrap();
    let out = Command::new(exe)
        .args([op, t.name()])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ggml_oracle {op} {t}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&dst).unwrap()
}

#[test]
fn dequantization_matches_ggml_c_bit_for_bit() {
    let exe = or_skip!(ggml_oracle());
    let mut rng = Rng(13);
    for &t in BLOCK_TYPES.iter().chain(&[GgmlType::Q8K]) {
        let blocks = oracle_blocks(&mut rng, t, 64 * 256 / t.block_size().min(256));
        let want = run_ggml_oracle(&exe, "dequant", t, &blocks);
        let mut got = vec![0f32; blocks.len() / t.type_size() * t.block_size()];
        quants::dequantize(t, &blocks, &mut got).unwrap();
        assert_eq!(want.len(), 4 * got.len(), "{t}");
        for (i, (g, w)) in got.iter().zip(want.chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{t}: element {i} is {g}, ggml says {w}"
            );
        }
    }
}

#[test]
fn activation_quantizers_match_ggml_c_byte_for_byte() {
    let exe = or_skip!(ggml_oracle());
    let mut rng = Rng(17);
    let mut x: Vec<f32> = (0..256 * 40)
        .map(|i| rng.unit() * [1e-3, 0.5, 7.0, 300.0][i / 2560])
        .collect();
    // Exact halves after scaling (amax 127 makes the scale 1), a zero block, ties for the
    // signed maximum, and a block whose extreme is negative.
    for (i, v) in x[..256].iter_mut().enumerate() {
        *v = if i % 32 == 0 {
            127.0
        } else {
            (i % 64) as f32 - 31.5
        };
    }
    x[256..512].iter_mut().for_each(|v| *v = 0.0);
    x[512] = -5.0;
    x[513] = 5.0;
    x[1024] = -9.0;
    for t in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K] {
        let input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let want = run_ggml_oracle(&exe, "quantize", t, &input);
        let mut got = Vec::new();
        quants::quantize_activations(t, &x, &mut got).unwrap();
        assert_eq!(got.len(), want.len(), "{t}");
        if let Some(at) = got.iter().zip(&want).position(|(g, w)| g != w) {
            panic!(
                "{t}: byte {at} (block {}) is {:#04x}, ggml wrote {:#04x}",
                at / t.type_size(),
                got[at],
                want[at]
            );
        }
    }
}

#[test]
fn lookup_tables_are_current_with_ggml_common_h() {
    let gguf_py = or_skip!(gguf_py());
    let header = gguf_py.parent().unwrap().join("ggml/src/ggml-common.h");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gen_quant_tables.py");
    let out = Command::new("python3")
        .arg(script)
        .arg("--check")
        .arg(header)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
