//! Synthetic models: a valid GGUF for a supported architecture with real (or tiny) shapes, random
//! but well-scaled weights in a chosen quantization mix, the tokenizer of a real vocabulary GGUF,
//! and optionally a skew of expert popularity. For tests and benchmarks that need a model of a
//! given shape without downloading one.

use std::path::Path;

use super::error::ModelError;
use super::gguf::{GgufFile, MetaValue};
use super::quants::{self, f32_to_bf16, f32_to_f16};
use super::types::GgmlType;
use super::writer::{GgufWriter, PlannedTensor};

/// Shapes and hyper-parameters of one model.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub arch: &'static str,
    pub n_layer: u32,
    pub n_embd: u32,
    /// Dense feed-forward width (written as `feed_forward_length` for MoE models too).
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    /// 0 for dense models.
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub n_ff_exp: u32,
    pub n_ctx: u32,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Sliding-window attention width, 0 for none.
    pub sliding_window: u32,
    /// Shared experts (DeepSeek-V2 family), each `n_ff_exp` wide.
    pub n_expert_shared: u32,
    /// Leading layers with a dense FFN (DeepSeek-V2 family).
    pub n_leading_dense: u32,
    /// Multi-head latent attention (DeepSeek-V2 family): low-rank query (0: none) and key-value
    /// projections, and the rotary part of each key head (`head_dim` is the key head width,
    /// `value_dim` the value head width).
    pub q_lora_rank: u32,
    pub kv_lora_rank: u32,
    pub rope_dim: u32,
    pub value_dim: u32,
    /// YaRN context extension as the GGUF states it: `(rope.scaling.factor,
    /// rope.scaling.original_context_length)`; `None` for plain RoPE.
    pub yarn: Option<(f32, u32)>,
    /// `expert_weights_scale`, written when non-zero (GLM-4.5: 2.5, -Air: 1.0).
    pub expert_scale: f32,
    /// `expert_gating_func` (0: not written, the family's default; 1 softmax, 2 sigmoid) and
    /// `expert_weights_norm`; sigmoid gating comes with a selection bias (`exp_probs_b`).
    pub gating: u32,
    pub expert_norm: bool,
    /// Group-limited routing: `(expert_group_count, expert_group_used_count)`, (0, 0) for none.
    pub expert_groups: (u32, u32),
    /// Latent attention in the absorbed form llama.cpp's converter writes today (`attn_k_b`,
    /// `attn_v_b`, one cached key head); `false` writes the older `attn_kv_b`.
    pub mla_absorbed: bool,
    /// `rope.scaling.yarn_log_multiplier` (DeepSeek: 0.1 x `mscale_all_dim`), written when
    /// non-zero.
    pub yarn_log_mul: f32,
}

const fn dense(
    name: &'static str,
    arch: &'static str,
    n_layer: u32,
    n_embd: u32,
    n_ff: u32,
    heads: (u32, u32, u32),
) -> Preset {
    Preset {
        name,
        arch,
        n_layer,
        n_embd,
        n_ff,
        n_head: heads.0,
        n_head_kv: heads.1,
        head_dim: heads.2,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_exp: 0,
        n_ctx: 4096,
        rope_freq_base: 10000.0,
        rms_eps: 1e-6,
        sliding_window: 0,
        n_expert_shared: 0,
        n_leading_dense: 0,
        q_lora_rank: 0,
        kv_lora_rank: 0,
        rope_dim: heads.2,
        value_dim: heads.2,
        yarn: None,
        expert_scale: 0.0,
        gating: 0,
        expert_norm: false,
        expert_groups: (0, 0),
        mla_absorbed: false,
        yarn_log_mul: 0.0,
    }
}

pub const PRESETS: &[Preset] = &[
    dense("tiny-llama", "llama", 2, 256, 512, (4, 2, 64)),
    dense("tiny-qwen3", "qwen3", 2, 256, 512, (4, 2, 64)),
    Preset {
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 256,
        ..dense("tiny-qwen3moe", "qwen3moe", 2, 256, 512, (4, 2, 64))
    },
    Preset {
        sliding_window: 128,
        rope_freq_base: 1e6,
        ..dense("tiny-gemma3", "gemma3", 2, 256, 512, (4, 1, 64))
    },
    Preset {
        n_ctx: 32768,
        rope_freq_base: 1e6,
        sliding_window: 512,
        ..dense("gemma-3-270m", "gemma3", 18, 640, 2048, (4, 1, 256))
    },
    // DeepSeek-V3's design at a small size: low-rank queries, the absorbed latent attention,
    // sigmoid gating with a selection bias, expert groups, YaRN with its log multiplier
    Preset {
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 256,
        n_expert_shared: 1,
        n_leading_dense: 1,
        q_lora_rank: 128,
        kv_lora_rank: 128,
        rope_dim: 32,
        value_dim: 64,
        n_ctx: 163840,
        yarn: Some((40.0, 4096)),
        yarn_log_mul: 0.1,
        expert_scale: 2.5,
        gating: 2,
        expert_norm: true,
        expert_groups: (4, 2),
        mla_absorbed: true,
        ..dense("tiny-deepseek2", "deepseek2", 2, 256, 512, (4, 1, 96))
    },
    // DeepSeek-V2's design as older files store it: `attn_kv_b` (keys and values decompressed
    // before the cache), softmax gating (llama.cpp wants a query rank unless the layer count is
    // a Lite model's)
    Preset {
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 256,
        n_expert_shared: 2,
        n_leading_dense: 1,
        q_lora_rank: 128,
        kv_lora_rank: 128,
        rope_dim: 32,
        value_dim: 64,
        ..dense("tiny-deepseek2-kvb", "deepseek2", 2, 256, 512, (4, 4, 96))
    },
    Preset {
        n_expert: 64,
        n_expert_used: 6,
        n_ff_exp: 1408,
        n_expert_shared: 2,
        n_leading_dense: 1,
        kv_lora_rank: 512,
        rope_dim: 64,
        value_dim: 128,
        n_ctx: 163840,
        n_head_kv: 1,
        mla_absorbed: true,
        ..dense(
            "deepseek-v2-lite",
            "deepseek2",
            27,
            2048,
            10944,
            (16, 16, 192),
        )
    },
    Preset {
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 256,
        n_expert_shared: 1,
        n_leading_dense: 1,
        rope_dim: 32,
        expert_scale: 2.5,
        gating: 2,
        expert_norm: true,
        ..dense("tiny-glm4moe", "glm4moe", 2, 256, 512, (4, 2, 64))
    },
    Preset {
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 1408,
        n_expert_shared: 1,
        n_leading_dense: 1,
        rope_dim: 64,
        n_ctx: 131072,
        rope_freq_base: 1e6,
        rms_eps: 1e-5,
        expert_scale: 1.0,
        gating: 2,
        expert_norm: true,
        ..dense("glm-4.5-air", "glm4moe", 46, 4096, 10944, (96, 8, 128))
    },
    Preset {
        n_expert: 4,
        n_expert_used: 2,
        n_ff_exp: 256,
        sliding_window: 128,
        rope_freq_base: 150000.0,
        yarn: Some((32.0, 4096)),
        ..dense("tiny-gpt-oss", "gpt-oss", 2, 256, 256, (4, 2, 64))
    },
    Preset {
        n_expert: 32,
        n_expert_used: 4,
        n_ff_exp: 2880,
        n_ctx: 131072,
        rope_freq_base: 150000.0,
        rms_eps: 1e-5,
        sliding_window: 128,
        yarn: Some((32.0, 4096)),
        ..dense("gpt-oss-20b", "gpt-oss", 24, 2880, 2880, (64, 8, 64))
    },
    Preset {
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 768,
        n_ctx: 40960,
        rope_freq_base: 1e6,
        ..dense("qwen3-30b-a3b", "qwen3moe", 48, 2048, 6144, (32, 4, 128))
    },
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// Which type each kind of tensor is written in. Norms and expert routers are always F32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantMix {
    pub weights: GgmlType,
    pub experts: GgmlType,
    pub embeddings: GgmlType,
}

impl QuantMix {
    pub fn uniform(t: GgmlType) -> QuantMix {
        QuantMix {
            weights: t,
            experts: t,
            embeddings: GgmlType::Q8_0,
        }
    }
}

pub struct SyntheticOptions<'a> {
    pub preset: &'a Preset,
    pub mix: QuantMix,
    /// A GGUF whose `tokenizer.*` keys are copied (an upstream `ggml-vocab-*.gguf` will do).
    pub vocab: &'a Path,
    pub seed: u64,
    /// 0 for uniform expert popularity; larger values make low-numbered ranks of a seeded
    /// permutation of experts win routing more often.
    pub expert_skew: f32,
}

/// splitmix64 with a Box-Muller normal.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// The type llama.cpp's quantizer writes when a row of `row` elements cannot hold `t`'s blocks:
/// 256-wide i-quants drop to IQ4_NL, the 2- and 3-bit and ternary types to Q4_0, Q4_K/Q5_K/Q6_K
/// to Q5_0/Q5_1/Q8_0, and whatever still does not fit to F16 (a 32-wide type only to F16).
fn fitting_type(t: GgmlType, row: u64) -> GgmlType {
    use GgmlType::*;
    let fits = |c: GgmlType| row.is_multiple_of(c.block_size() as u64);
    if fits(t) {
        return t;
    }
    let fallback = match t {
        Iq1S | Iq1M | Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq4Xs => Iq4Nl,
        Q2_0 | Q2K | Q3K | Tq1_0 | Tq2_0 => Q4_0,
        Q4K => Q5_0,
        Q5K => Q5_1,
        Q6K => Q8_0,
        _ => F16,
    };
    if fits(fallback) {
        fallback
    } else {
        F16
    }
}

/// Scales one random block of `t` so its values have root-mean-square near `target`.
fn scale_block(t: GgmlType, block: &mut [u8], target: f32) -> Result<(), ModelError> {
    // Random scales and mins make most types' blocks lean one way (a K-quant's sc*q - m is
    // mostly positive); flipping the sign of every scale of half the blocks, picked by a random
    // bit of the block read before any scale is written, leaves the weights zero-mean, as
    // trained weights are. A shared lean would add one common direction to every layer's
    // output, and all tokens would route alike.
    let sign = if block[block.len() - 1] & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let mut y = vec![0f32; t.block_size()];
    let set = |block: &mut [u8], k: f32| {
        let h = f32_to_f16(k).to_le_bytes();
        for &at in quants::f16_scale_offsets(t) {
            block[at..at + 2].copy_from_slice(&h);
        }
        if t == GgmlType::Iq1M {
            let h = f32_to_f16(k);
            for i in 0..4 {
                let at = 48 + 2 * i + 1;
                block[at] = (block[at] & 0x0f) | ((((h >> (4 * i)) & 0xf) as u8) << 4);
            }
        }
    };
    set(block, 1.0);
    match t {
        // Power-of-two scales: E8M0 exponent 127 is 0.5; UE4M3 0x38 is 0.5.
        GgmlType::Mxfp4 => block[0] = 127,
        GgmlType::Nvfp4 => block[..4].fill(0x38),
        _ => {}
    }
    quants::dequantize(t, block, &mut y)?;
    let rms = (y.iter().map(|v| v * v).sum::<f32>() / y.len() as f32).sqrt();
    if rms == 0.0 || !rms.is_finite() {
        return Ok(());
    }
    let k = target / rms;
    // FP4 types' scales have no sign: their values' sign bits (bit 3 of each nibble) flip instead
    let flip = |qs: &mut [u8]| {
        if sign < 0.0 {
            qs.iter_mut().for_each(|b| *b ^= 0x88);
        }
    };
    match t {
        GgmlType::Mxfp4 => {
            block[0] = (127.0 + k.log2().round()).clamp(1.0, 254.0) as u8;
            flip(&mut block[1..]);
        }
        GgmlType::Nvfp4 => {
            let exp = (7.0 + k.log2().round()).clamp(1.0, 14.0) as u8;
            block[..4].fill(exp << 3);
            flip(&mut block[4..]);
        }
        _ => set(block, sign * k),
    }
    Ok(())
}

/// `values` in a float type or Q8_0 (whose quantizer is the reference one).
fn encode_floats(t: GgmlType, values: &[f32]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match t {
        GgmlType::F32 => out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
        GgmlType::F16 => out.extend(values.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes())),
        GgmlType::Bf16 => out.extend(values.iter().flat_map(|&v| f32_to_bf16(v).to_le_bytes())),
        GgmlType::Q8_0 => quants::quantize_q8_0(values, &mut out),
        _ => return None,
    }
    Some(out)
}

/// Random data for tensor `t`: normal values of standard deviation `std` for float types and
/// Q8_0, otherwise random blocks scaled to that root-mean-square.
fn random_tensor(rng: &mut Rng, t: &PlannedTensor, std: f32) -> Result<Vec<u8>, ModelError> {
    random_data(rng, t.ggml_type, t.n_elements() as usize, std)
}

fn random_data(rng: &mut Rng, ty: GgmlType, n: usize, std: f32) -> Result<Vec<u8>, ModelError> {
    if matches!(
        ty,
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 | GgmlType::Q8_0
    ) {
        let values: Vec<f32> = (0..n).map(|_| rng.normal() * std).collect();
        return Ok(encode_floats(ty, &values).unwrap_or_default());
    }
    let bytes = ty
        .bytes_for(n as u64)
        .ok_or_else(|| ModelError::BadTensor {
            path: Default::default(),
            tensor: format!("{n} random {} values", ty.name()),
            reason: "not a whole number of blocks".into(),
        })?;
    let mut out: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    for block in out.chunks_exact_mut(ty.type_size()) {
        scale_block(ty, block, std)?;
    }
    Ok(out)
}

/// `n` random values in `ty`'s blocks with root-mean-square near `std` (kernel tests).
pub fn random_blocks(ty: GgmlType, n: usize, seed: u64, std: f32) -> Result<Vec<u8>, ModelError> {
    random_data(&mut Rng(seed), ty, n, std)
}

struct Layout {
    tensors: Vec<(String, GgmlType, Vec<u64>)>,
}

impl Layout {
    fn add(&mut self, name: String, t: GgmlType, shape: &[u64]) {
        self.tensors
            .push((name, fitting_type(t, shape[0]), shape.to_vec()));
    }

    /// A gated FFN `n_embd -> f -> n_embd` of layer `i`: `ffn_{gate,up,down}{suffix}` (no
    /// suffix for a dense FFN, `_shexp` for shared experts).
    fn gated_ffn(&mut self, i: u32, suffix: &str, t: GgmlType, e: u64, f: u64) {
        let w = |part: &str| format!("blk.{i}.ffn_{part}{suffix}.weight");
        self.add(w("gate"), t, &[e, f]);
        self.add(w("up"), t, &[e, f]);
        self.add(w("down"), t, &[f, e]);
    }

    /// `x` routed experts of width `fx` in layer `i` (`ffn_{gate,up,down}_exps`).
    fn experts(&mut self, i: u32, t: GgmlType, e: u64, fx: u64, x: u64) {
        let w = |part: &str| format!("blk.{i}.ffn_{part}_exps.weight");
        self.add(w("gate"), t, &[e, fx, x]);
        self.add(w("up"), t, &[e, fx, x]);
        self.add(w("down"), t, &[fx, e, x]);
    }
}

/// The tensors llama.cpp expects for the preset's architecture, with their types.
fn layout(p: &Preset, n_vocab: u64, mix: QuantMix) -> Layout {
    let (e, f, fx) = (p.n_embd as u64, p.n_ff as u64, p.n_ff_exp as u64);
    let (q, kv) = (
        (p.n_head * p.head_dim) as u64,
        (p.n_head_kv * p.head_dim) as u64,
    );
    let hd = p.head_dim as u64;
    let x = p.n_expert as u64;
    let qk_norm = matches!(p.arch, "qwen3" | "qwen3moe" | "gemma3");
    let gemma = p.arch == "gemma3";
    // gpt-oss: biases everywhere, attention sinks, and the post-attention norm as FFN norm.
    let oss = p.arch == "gpt-oss";
    let mut l = Layout {
        tensors: Vec::new(),
    };
    let f32t = GgmlType::F32;
    l.add("token_embd.weight".into(), mix.embeddings, &[e, n_vocab]);
    l.add("output_norm.weight".into(), f32t, &[e]);
    if !gemma {
        l.add("output.weight".into(), mix.embeddings, &[e, n_vocab]);
    }
    for i in 0..p.n_layer {
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        l.add(b("attn_norm"), f32t, &[e]);
        if p.arch == "deepseek2" {
            mla_layer(&mut l, p, i, mix);
            continue;
        }
        if p.arch == "glm4moe" {
            glm_layer(&mut l, p, i, mix);
            continue;
        }
        l.add(b("attn_q"), mix.weights, &[e, q]);
        l.add(b("attn_k"), mix.weights, &[e, kv]);
        l.add(b("attn_v"), mix.weights, &[e, kv]);
        l.add(b("attn_output"), mix.weights, &[q, e]);
        if oss {
            let bias = |s: &str| format!("blk.{i}.{s}.bias");
            l.add(bias("attn_q"), f32t, &[q]);
            l.add(bias("attn_k"), f32t, &[kv]);
            l.add(bias("attn_v"), f32t, &[kv]);
            l.add(bias("attn_output"), f32t, &[e]);
            l.add(b("attn_sinks"), f32t, &[p.n_head as u64]);
            l.add(b("post_attention_norm"), f32t, &[e]);
            l.add(b("ffn_gate_inp"), f32t, &[e, x]);
            l.add(bias("ffn_gate_inp"), f32t, &[x]);
            l.experts(i, mix.experts, e, fx, x);
            l.add(bias("ffn_gate_exps"), f32t, &[fx, x]);
            l.add(bias("ffn_up_exps"), f32t, &[fx, x]);
            l.add(bias("ffn_down_exps"), f32t, &[e, x]);
            continue;
        }
        if qk_norm {
            l.add(b("attn_q_norm"), f32t, &[hd]);
            l.add(b("attn_k_norm"), f32t, &[hd]);
        }
        if gemma {
            l.add(b("post_attention_norm"), f32t, &[e]);
        }
        l.add(b("ffn_norm"), f32t, &[e]);
        if x > 0 {
            l.add(b("ffn_gate_inp"), f32t, &[e, x]);
            l.experts(i, mix.experts, e, fx, x);
        } else {
            l.gated_ffn(i, "", mix.weights, e, f);
        }
        if gemma {
            l.add(b("post_ffw_norm"), f32t, &[e]);
        }
    }
    l
}

/// One DeepSeek-V2 layer: latent attention, then a dense FFN (leading layers) or routed plus
/// shared experts.
fn mla_layer(l: &mut Layout, p: &Preset, i: u32, mix: QuantMix) {
    let b = |s: &str| format!("blk.{i}.{s}.weight");
    let (e, h) = (p.n_embd as u64, p.n_head as u64);
    let (kv_rank, q_rank) = (p.kv_lora_rank as u64, p.q_lora_rank as u64);
    let (k_dim, v_dim, rope) = (p.head_dim as u64, p.value_dim as u64, p.rope_dim as u64);
    let f32t = GgmlType::F32;
    if q_rank > 0 {
        l.add(b("attn_q_a_norm"), f32t, &[q_rank]);
        l.add(b("attn_q_a"), mix.weights, &[e, q_rank]);
        l.add(b("attn_q_b"), mix.weights, &[q_rank, h * k_dim]);
    } else {
        l.add(b("attn_q"), mix.weights, &[e, h * k_dim]);
    }
    l.add(b("attn_kv_a_norm"), f32t, &[kv_rank]);
    // llama-quantize leaves these three as the converter wrote them (f16 here)
    let f16t = GgmlType::F16;
    l.add(b("attn_kv_a_mqa"), f16t, &[e, kv_rank + rope]);
    if p.mla_absorbed {
        l.add(b("attn_k_b"), f16t, &[k_dim - rope, kv_rank, h]);
        l.add(b("attn_v_b"), f16t, &[kv_rank, v_dim, h]);
    } else {
        l.add(
            b("attn_kv_b"),
            mix.weights,
            &[kv_rank, h * (k_dim - rope + v_dim)],
        );
    }
    l.add(b("attn_output"), mix.weights, &[h * v_dim, e]);
    l.add(b("ffn_norm"), f32t, &[e]);
    let (f, fx, x) = (p.n_ff as u64, p.n_ff_exp as u64, p.n_expert as u64);
    if i < p.n_leading_dense {
        l.gated_ffn(i, "", mix.weights, e, f);
        return;
    }
    let shared = fx * p.n_expert_shared as u64;
    l.add(b("ffn_gate_inp"), f32t, &[e, x]);
    if p.gating == 2 {
        l.add(format!("blk.{i}.exp_probs_b.bias"), f32t, &[x]);
    }
    l.experts(i, mix.experts, e, fx, x);
    l.gated_ffn(i, "_shexp", mix.weights, e, shared);
}

/// One GLM-4.5 layer: attention with q/k/v biases, the post-attention norm in front of the FFN,
/// a dense FFN (leading layers) or routed experts with a routing bias plus shared experts.
fn glm_layer(l: &mut Layout, p: &Preset, i: u32, mix: QuantMix) {
    let b = |s: &str| format!("blk.{i}.{s}.weight");
    let bias = |s: &str| format!("blk.{i}.{s}.bias");
    let (e, q, kv) = (
        p.n_embd as u64,
        (p.n_head * p.head_dim) as u64,
        (p.n_head_kv * p.head_dim) as u64,
    );
    let f32t = GgmlType::F32;
    l.add(b("attn_q"), mix.weights, &[e, q]);
    l.add(b("attn_k"), mix.weights, &[e, kv]);
    l.add(b("attn_v"), mix.weights, &[e, kv]);
    l.add(bias("attn_q"), f32t, &[q]);
    l.add(bias("attn_k"), f32t, &[kv]);
    l.add(bias("attn_v"), f32t, &[kv]);
    l.add(b("attn_output"), mix.weights, &[q, e]);
    l.add(b("post_attention_norm"), f32t, &[e]);
    let (f, fx, x) = (p.n_ff as u64, p.n_ff_exp as u64, p.n_expert as u64);
    if i < p.n_leading_dense {
        l.gated_ffn(i, "", mix.weights, e, f);
        return;
    }
    let shared = fx * p.n_expert_shared as u64;
    l.add(b("ffn_gate_inp"), f32t, &[e, x]);
    l.add(bias("exp_probs_b"), f32t, &[x]);
    l.experts(i, mix.experts, e, fx, x);
    l.gated_ffn(i, "_shexp", mix.weights, e, shared);
}

/// Writes a synthetic model for `opts` to `out`.
pub fn write_synthetic(opts: &SyntheticOptions, out: &Path) -> Result<(), ModelError> {
    let p = opts.preset;
    let vocab = GgufFile::open(opts.vocab)?;
    let n_vocab = vocab
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .map(|t| t.len() as u64)
        .ok_or_else(|| ModelError::MissingKey {
            path: opts.vocab.to_path_buf(),
            key: "tokenizer.ggml.tokens".into(),
        })?;
    let mut w = GgufWriter::new();
    let s = |v: &str| MetaValue::String(v.to_string());
    let k = |suffix: &str| format!("{}.{suffix}", p.arch);
    w.set("general.architecture", s(p.arch));
    w.set("general.name", s(&format!("synthetic {}", p.name)));
    w.set("general.quantization_version", MetaValue::U32(2));
    w.set(&k("context_length"), MetaValue::U32(p.n_ctx));
    w.set(&k("embedding_length"), MetaValue::U32(p.n_embd));
    w.set(&k("block_count"), MetaValue::U32(p.n_layer));
    w.set(&k("feed_forward_length"), MetaValue::U32(p.n_ff));
    w.set(&k("attention.head_count"), MetaValue::U32(p.n_head));
    w.set(&k("attention.head_count_kv"), MetaValue::U32(p.n_head_kv));
    if p.mla_absorbed {
        // the cache's one latent head, and the per-head widths before absorption
        let (rank, rope) = (p.kv_lora_rank, p.rope_dim);
        w.set(&k("attention.key_length"), MetaValue::U32(rank + rope));
        w.set(&k("attention.value_length"), MetaValue::U32(rank));
        w.set(&k("attention.key_length_mla"), MetaValue::U32(p.head_dim));
        w.set(
            &k("attention.value_length_mla"),
            MetaValue::U32(p.value_dim),
        );
    } else {
        w.set(&k("attention.key_length"), MetaValue::U32(p.head_dim));
        w.set(&k("attention.value_length"), MetaValue::U32(p.value_dim));
    }
    w.set(
        &k("attention.layer_norm_rms_epsilon"),
        MetaValue::F32(p.rms_eps),
    );
    w.set(&k("rope.freq_base"), MetaValue::F32(p.rope_freq_base));
    if p.sliding_window > 0 {
        w.set(
            &k("attention.sliding_window"),
            MetaValue::U32(p.sliding_window),
        );
    }
    if p.rope_dim != p.head_dim {
        w.set(&k("rope.dimension_count"), MetaValue::U32(p.rope_dim));
    }
    if let Some((factor, n_ctx_orig)) = p.yarn {
        w.set(&k("rope.scaling.type"), s("yarn"));
        w.set(&k("rope.scaling.factor"), MetaValue::F32(factor));
        w.set(
            &k("rope.scaling.original_context_length"),
            MetaValue::U32(n_ctx_orig),
        );
    }
    if p.expert_scale != 0.0 {
        w.set(&k("expert_weights_scale"), MetaValue::F32(p.expert_scale));
    }
    if p.gating != 0 {
        w.set(&k("expert_gating_func"), MetaValue::U32(p.gating));
    }
    if p.expert_norm {
        w.set(&k("expert_weights_norm"), MetaValue::Bool(true));
    }
    if p.expert_groups.0 > 0 {
        w.set(&k("expert_group_count"), MetaValue::U32(p.expert_groups.0));
        w.set(
            &k("expert_group_used_count"),
            MetaValue::U32(p.expert_groups.1),
        );
    }
    if p.yarn_log_mul != 0.0 {
        w.set(
            &k("rope.scaling.yarn_log_multiplier"),
            MetaValue::F32(p.yarn_log_mul),
        );
    }
    if p.kv_lora_rank > 0 {
        w.set(&k("attention.kv_lora_rank"), MetaValue::U32(p.kv_lora_rank));
    }
    if p.q_lora_rank > 0 {
        w.set(&k("attention.q_lora_rank"), MetaValue::U32(p.q_lora_rank));
    }
    if p.n_expert_shared > 0 {
        w.set(&k("expert_shared_count"), MetaValue::U32(p.n_expert_shared));
    }
    if p.n_leading_dense > 0 {
        w.set(
            &k("leading_dense_block_count"),
            MetaValue::U32(p.n_leading_dense),
        );
    }
    if p.n_expert > 0 {
        w.set(&k("expert_count"), MetaValue::U32(p.n_expert));
        w.set(&k("expert_used_count"), MetaValue::U32(p.n_expert_used));
        w.set(&k("expert_feed_forward_length"), MetaValue::U32(p.n_ff_exp));
    }
    for (key, v) in &vocab.metadata {
        if key.starts_with("tokenizer.") {
            w.set(key, v.clone());
        }
    }
    for (name, t, shape) in layout(p, n_vocab, opts.mix).tensors {
        w.add_tensor(&name, t, &shape)?;
    }
    let mut rng = Rng(opts.seed);
    let e = p.n_embd as usize;
    // Token embeddings as large as one layer's output, so that every token keeps its own
    // direction through the layers instead of all sharing the context average attention adds;
    // Gemma scales its embeddings by sqrt(n_embd) itself.
    let embd_std = if p.arch.starts_with("gemma") {
        1.0 / (e as f32).sqrt()
    } else {
        1.0
    };
    // Each layer's output projections shrink with depth so that the residual stream's sum of
    // layer outputs stays near the embedding's size however many layers there are.
    let out_scale = 1.0 / (2.0 * p.n_layer.max(1) as f32).sqrt();
    // Popularity skew: every token embedding shares a component along `common` (a fifth of its
    // energy), and each router row leans towards it by its expert's rank, so that after the
    // norm the most popular expert's logit rises by about `SKEW_LOGITS * skew` over the least
    // popular one's (beside logits of standard deviation 1 from the random rows).
    const COMMON_SHARE: f32 = 0.5;
    const SKEW_LOGITS: f32 = 2.0;
    let common: Vec<f32> = {
        let v: Vec<f32> = (0..e).map(|_| rng.normal()).collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / norm).collect()
    };
    let mut rank: Vec<usize> = (0..p.n_expert as usize).collect();
    for i in (1..rank.len()).rev() {
        rank.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let skew = opts.expert_skew;
    let common_amp = COMMON_SHARE * embd_std * (e as f32).sqrt();
    // The component along `common` of a normed hidden state holding it as the embedding does.
    let common_normed =
        COMMON_SHARE * (e as f32).sqrt() / (1.0 + COMMON_SHARE * COMMON_SHARE).sqrt();
    w.write(out, |t| {
        let fan_in = t.shape[0] as f32;
        let name = t.name.as_str();
        // Biases and sinks are random too, so that a model that drops one differs: attention
        // sinks of a few logits as trained ones, router biases that move the selection.
        let bias_std = if name.ends_with("attn_sinks.weight") {
            Some(1.0)
        } else if name.ends_with("ffn_gate_inp.bias") || name.ends_with("exp_probs_b.bias") {
            Some(0.5)
        } else if name.ends_with(".bias") {
            Some(0.2)
        } else {
            None
        };
        if let Some(std) = bias_std {
            return random_tensor(&mut rng, t, std);
        }
        if name.ends_with("_norm.weight") {
            // every family multiplies by the stored weight (Gemma's converter stores 1 + w)
            return Ok(
                encode_floats(GgmlType::F32, &vec![1.0; t.n_elements() as usize])
                    .unwrap_or_default(),
            );
        }
        if name == "token_embd.weight" {
            if skew > 0.0 {
                let mut v = Vec::with_capacity(t.n_elements() as usize);
                for _ in 0..t.shape[1] {
                    v.extend(
                        common
                            .iter()
                            .map(|c| rng.normal() * embd_std + common_amp * c),
                    );
                }
                if let Some(bytes) = encode_floats(t.ggml_type, &v) {
                    return Ok(bytes);
                }
            }
            return random_tensor(&mut rng, t, embd_std);
        }
        if name.ends_with("ffn_gate_inp.weight") && skew > 0.0 {
            let std = 1.0 / fan_in.sqrt();
            let mut v = Vec::with_capacity(t.n_elements() as usize);
            for &r in &rank {
                let lean =
                    skew * SKEW_LOGITS * (1.0 - r as f32 / rank.len() as f32) / common_normed;
                v.extend(common.iter().map(|c| rng.normal() * std + lean * c));
            }
            return Ok(encode_floats(GgmlType::F32, &v).unwrap_or_default());
        }
        let is_output_projection = ["attn_output", "ffn_down", "ffn_down_exps", "ffn_down_shexp"]
            .iter()
            .any(|p| name.ends_with(&format!(".{p}.weight")));
        let scale = if is_output_projection { out_scale } else { 1.0 };
        random_tensor(&mut rng, t, scale / fan_in.sqrt())
    })
}

/// The names of all presets, for help texts.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::*;

    /// Random weights of every quantized type are zero-mean at the RMS asked for: a lean shared
    /// by a matrix's rows would give every token the same routing.
    #[test]
    fn random_blocks_are_zero_mean() {
        for t in [
            Q4_0, Q4_1, Q5_0, Q5_1, Q2K, Q3K, Q4K, Q5K, Q6K, Iq2Xxs, Iq2Xs, Iq2S, Iq3Xxs, Iq3S,
            Iq1S, Iq1M, Iq4Nl, Iq4Xs, Tq1_0, Tq2_0, Mxfp4, Nvfp4,
        ] {
            let n = 256 * 2048;
            let data = random_blocks(t, n, 7, 1.0).unwrap();
            let mut y = vec![0f32; n];
            quants::dequantize(t, &data, &mut y).unwrap();
            let mean = y.iter().sum::<f32>() / n as f32;
            let rms = (y.iter().map(|v| v * v).sum::<f32>() / n as f32).sqrt();
            assert!(mean.abs() < 0.1 * rms, "{t:?}: mean {mean}, rms {rms}");
            // every block at the asked scale: none collapsed to (near) zero
            for (i, b) in y.chunks_exact(t.block_size()).enumerate() {
                let r = (b.iter().map(|v| v * v).sum::<f32>() / b.len() as f32).sqrt();
                assert!(r > 0.25 && r < 4.0, "{t:?} block {i}: rms {r}");
            }
        }
    }

    /// Rows a type cannot hold fall back as llama.cpp's quantizer does (`tensor_type_fallback`).
    #[test]
    fn unfitting_rows_fall_back_as_llama_quantize_does() {
        let cases = [
            (Q4K, 1408, Q5_0),
            (Q5K, 1408, Q5_1),
            (Q6K, 1408, Q8_0),
            (Iq2Xxs, 1408, Iq4Nl),
            (Iq4Xs, 1408, Iq4Nl),
            (Q2K, 1408, Q4_0),
            (Tq2_0, 1408, Q4_0),
            (Q4K, 2048, Q4K),
            (Q8_0, 48, F16),
            (Q4K, 80, F16),
            (Mxfp4, 2880, Mxfp4),
        ];
        for (t, row, want) in cases {
            assert_eq!(fitting_type(t, row), want, "{t:?} in rows of {row}");
        }
    }
}
