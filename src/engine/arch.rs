//! Architectures as data: what each family's layers contain and how its hyper-parameters are
//! read from the GGUF keys (`{arch}.embedding_length`, ...). The forward pass in `model.rs` is
//! written once over these descriptions.

use super::EngineError;
use crate::model::{GgufFile, MetaValue};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Rotates adjacent pairs (llama).
    Norm,
    /// Rotates element `i` with `i + n_rot/2` (GPT-NeoX, qwen, gemma).
    Neox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// SwiGLU: silu(gate) * up.
    Silu,
    /// GeGLU with the tanh approximation of GELU: gelu(gate) * up.
    Gelu,
    /// gpt-oss's clamped SwiGLU: `min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)`.
    SwigluOai,
}

/// How router logits become expert weights (llama.cpp's `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, top-k of the probabilities.
    Softmax,
    /// Sigmoid of each logit; a selection bias (`exp_probs_b`) may steer the top-k.
    Sigmoid,
    /// Top-k of the raw logits, softmax over the chosen ones (gpt-oss).
    SoftmaxWeight,
}

impl Gating {
    /// The GGUF key's code (`{arch}.expert_gating_func`); 0 means "the family's default".
    fn from_code(code: usize) -> Option<Option<Gating>> {
        match code {
            0 => Some(None),
            1 => Some(Some(Gating::Softmax)),
            2 => Some(Some(Gating::Sigmoid)),
            3 => Some(Some(Gating::SoftmaxWeight)),
            _ => None,
        }
    }
}

/// Whether a family's layers carry a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    No,
    Optional,
    Required,
}

/// What a family's layers contain beyond the common pre-norm attention + gated FFN block.
#[derive(Clone, Copy, Debug)]
pub struct ArchSpec {
    pub name: &'static str,
    pub rope: RopeKind,
    pub act: Act,
    /// Token embeddings are multiplied by sqrt(n_embd) (gemma).
    pub embd_scale: bool,
    /// RMS norms on each head of Q and K before RoPE.
    pub qk_norm: Presence,
    /// The name of the norm in front of the FFN (`ffn_norm`, or `post_attention_norm` where a
    /// family stores it under that name: gpt-oss, glm4moe).
    pub ffn_norm: &'static str,
    /// Norms on the attention and FFN outputs before their residual adds (gemma).
    pub post_norms: bool,
    /// Q is multiplied by the attention scale before attention, which then runs with scale 1
    /// (gemma; the others scale the scores).
    pub scale_q: bool,
    /// Sliding-window layer pattern when the file gives a window but no pattern: every n-th layer
    /// is global (gemma3: 6).
    pub swa_period: Option<u32>,
    /// Mixture-of-experts layers are allowed (`{arch}.expert_count` > 0).
    pub moe: bool,
    /// The family's expert gating, unless the file's `expert_gating_func` names one (read only
    /// where llama.cpp reads it: `gating_key`).
    pub gating: Gating,
    pub gating_key: bool,
    /// Top-k weights renormalized to sum to 1: fixed by the family, or `None` to read
    /// `expert_weights_norm` (default false).
    pub expert_norm: Option<bool>,
    /// Per-head attention sinks (`attn_sinks`): a logit every query's softmax also counts.
    pub sinks: bool,
    /// Sliding-window layers use the same RoPE base default and scaling as the others (gpt-oss);
    /// otherwise they default to base 10000 without scaling (gemma3).
    pub swa_rope_same: bool,
    /// Only the rows whose logits are wanted go through the last layer's FFN (most families);
    /// gpt-oss trims them after the last layer.
    pub trim_last_ffn: bool,
    /// Multi-head latent attention (DeepSeek-V2 family): low-rank query and key-value
    /// projections, a shared rotary key, per-head decompression (`model::Attn::Mla`).
    pub latent_attn: bool,
    /// The CUDA engine builds this family's layers.
    pub cuda: bool,
}

const fn base(name: &'static str, rope: RopeKind) -> ArchSpec {
    ArchSpec {
        name,
        rope,
        act: Act::Silu,
        embd_scale: false,
        qk_norm: Presence::No,
        ffn_norm: "ffn_norm",
        post_norms: false,
        scale_q: false,
        swa_period: None,
        moe: false,
        gating: Gating::Softmax,
        gating_key: false,
        expert_norm: Some(true),
        sinks: false,
        swa_rope_same: false,
        trim_last_ffn: true,
        latent_attn: false,
        cuda: true,
    }
}

pub const ARCHS: &[ArchSpec] = &[
    ArchSpec {
        moe: true,
        ..base("llama", RopeKind::Norm)
    },
    base("qwen2", RopeKind::Neox),
    ArchSpec {
        qk_norm: Presence::Required,
        ..base("qwen3", RopeKind::Neox)
    },
    ArchSpec {
        qk_norm: Presence::Required,
        moe: true,
        ..base("qwen3moe", RopeKind::Neox)
    },
    ArchSpec {
        act: Act::Gelu,
        embd_scale: true,
        qk_norm: Presence::Required,
        post_norms: true,
        scale_q: true,
        swa_period: Some(6),
        ..base("gemma3", RopeKind::Neox)
    },
    // gpt-oss: biases on Q/K/V/O and every expert, attention sinks, every other layer windowed,
    // YaRN on all layers, top-k of the raw router logits then a softmax over those
    ArchSpec {
        act: Act::SwigluOai,
        ffn_norm: "post_attention_norm",
        swa_period: Some(2),
        moe: true,
        gating: Gating::SoftmaxWeight,
        expert_norm: Some(false),
        sinks: true,
        swa_rope_same: true,
        trim_last_ffn: false,
        cuda: false,
        ..base("gpt-oss", RopeKind::Neox)
    },
    // GLM-4.5: Q/K/V biases, partial RoPE, leading dense layers, sigmoid routing with a
    // selection bias, shared experts; optional Q/K norms (the 355B model)
    ArchSpec {
        qk_norm: Presence::Optional,
        ffn_norm: "post_attention_norm",
        moe: true,
        gating: Gating::Sigmoid,
        gating_key: true,
        expert_norm: None,
        cuda: false,
        ..base("glm4moe", RopeKind::Neox)
    },
    // DeepSeek-V2/V3, Kimi-K2: latent attention, leading dense layers, shared experts, softmax
    // (V2) or sigmoid (V3) gating with a selection bias and expert groups
    ArchSpec {
        moe: true,
        gating_key: true,
        expert_norm: None,
        latent_attn: true,
        cuda: false,
        ..base("deepseek2", RopeKind::Norm)
    },
];

pub fn spec(arch: &str) -> Result<&'static ArchSpec, EngineError> {
    ARCHS.iter().find(|a| a.name == arch).ok_or_else(|| {
        let served: Vec<&str> = ARCHS.iter().map(|a| a.name).collect();
        EngineError::Load(format!(
            "architecture {arch:?} is not served by this engine (served: {})",
            served.join(", ")
        ))
    })
}

/// Hyper-parameters of one loaded model, as llama.cpp derives them from the GGUF keys.
#[derive(Clone, Debug)]
pub struct Hparams {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub n_rot: usize,
    pub eps: f32,
    pub rope_base: f32,
    /// Position multiplier (1 / the scaling factor).
    pub rope_scale: f32,
    pub rope_base_swa: f32,
    pub rope_scale_swa: f32,
    pub yarn: Yarn,
    pub n_swa: u32,
    pub swa_layers: Vec<bool>,
    pub final_softcap: Option<f32>,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub gating: Gating,
    /// Top-k expert weights are renormalized to sum to 1.
    pub expert_norm: bool,
    pub expert_scale: f32,
    /// Shared experts run on every token beside the routed ones (`expert_shared_count`).
    pub n_expert_shared: usize,
    /// The first layers have a dense FFN (`leading_dense_block_count`).
    pub n_leading_dense: usize,
    /// Group-limited routing (DeepSeek-V3): experts in `n_expert_groups` equal groups, each
    /// token choosing only among the `n_group_used` groups with the best two-expert sums.
    pub n_expert_groups: usize,
    pub n_group_used: usize,
    /// Latent attention's sizes (zero for other families).
    pub mla: MlaDims,
}

/// The sizes of DeepSeek-V2-style latent attention, as llama.cpp reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MlaDims {
    /// Query projection rank (`attention.q_lora_rank`, 0: one full projection).
    pub q_rank: usize,
    /// Compressed key-value width (`attention.kv_lora_rank`).
    pub kv_rank: usize,
    /// A query/key head's width before absorption (the non-rotary part plus `n_rot`) and a value
    /// head's width after decompression: `attention.key_length_mla`/`value_length_mla` in files
    /// written for the absorbed form, the plain head widths in older ones.
    pub head_k: usize,
    pub head_v: usize,
    /// The file stores the absorbed form (`attn_k_b`/`attn_v_b`; the cache holds one latent head
    /// of `kv_rank + n_rot`), not `attn_kv_b`.
    pub absorbed: bool,
    /// The attention scale: YaRN's magnitude squared over the square root of `head_k`.
    pub kq_scale: f32,
}

/// YaRN's RoPE parameters as llama.cpp's context derives them (`ext_factor` 0: plain RoPE, and
/// then only `attn_factor` applies, as a multiplier of cos and sin).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: u32,
    /// `rope.scaling.yarn_log_multiplier` as llama.cpp holds it (DeepSeek-V2 family; 0: none).
    pub log_mul: f32,
}

impl Yarn {
    /// ggml's `ggml_rope_yarn_corr_dims`: the first and last dimension pair of the ramp between
    /// extrapolated and interpolated angles.
    pub fn corr_dims(&self, n_rot: usize, base: f32) -> [f32; 2] {
        let corr = |beta: f32| {
            let pi2 = beta * 2.0 * std::f32::consts::PI;
            n_rot as f32 * (self.n_ctx_orig as f32 / pi2).ln() / (2.0 * base.ln())
        };
        let start = corr(self.beta_fast).floor();
        let end = corr(self.beta_slow).ceil();
        [start.max(0.0), end.min(n_rot as f32 - 1.0)]
    }
}

/// A RoPE scaling type (`rope.scaling.type`, `--rope-scaling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeScaling {
    None,
    Linear,
    Yarn,
}

impl RopeScaling {
    pub fn parse(s: &str) -> Option<RopeScaling> {
        match s {
            "none" => Some(RopeScaling::None),
            "linear" => Some(RopeScaling::Linear),
            "yarn" => Some(RopeScaling::Yarn),
            _ => None,
        }
    }
}

/// The command line's RoPE and YaRN settings (`--rope-scaling`, `--rope-freq-base`,
/// `--rope-freq-scale`/`--rope-scale`, `--yarn-*`) in llama.cpp's terms: `None`, 0 or a negative
/// value leaves the model's. They apply to the layers without a window; windowed layers keep the
/// file's base and scale, as upstream's do.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeOverrides {
    pub scaling: Option<RopeScaling>,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub yarn_orig_ctx: u32,
    pub yarn_ext_factor: f32,
    pub yarn_attn_factor: f32,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
}

impl Default for RopeOverrides {
    fn default() -> Self {
        RopeOverrides {
            scaling: None,
            freq_base: 0.0,
            freq_scale: 0.0,
            yarn_orig_ctx: 0,
            yarn_ext_factor: -1.0,
            yarn_attn_factor: -1.0,
            yarn_beta_fast: -1.0,
            yarn_beta_slow: -1.0,
        }
    }
}

pub struct Keys<'a> {
    pub gguf: &'a GgufFile,
    pub arch: &'a str,
}

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&MetaValue> {
        self.gguf.get(&format!("{}.{key}", self.arch))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, EngineError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .filter(|&n| n >= 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.bad(key, v)),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize, EngineError> {
        self.opt_usize(key)?
            .ok_or_else(|| EngineError::Load(format!("missing key {}.{key}", self.arch)))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, EngineError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| self.bad(key, v)),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, EngineError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.bad(key, v)),
        }
    }

    pub fn opt_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetaValue::as_str)
    }

    fn bad(&self, key: &str, v: &MetaValue) -> EngineError {
        EngineError::Load(format!(
            "key {}.{key} has an unusable value {v:?}",
            self.arch
        ))
    }

    /// The vocabulary's size as llama.cpp's loader reads it (`vocab_size`, else the token list).
    pub fn n_vocab(&self) -> usize {
        self.opt_usize("vocab_size")
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                self.gguf
                    .get("tokenizer.ggml.tokens")
                    .and_then(MetaValue::as_array)
                    .map_or(0, |a| a.len())
            })
    }

    /// A per-layer bool array (`attention.sliding_window_pattern` as an array).
    pub fn opt_bool_array(&self, key: &str) -> Option<Vec<bool>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_bool().or_else(|| v.as_i64().map(|n| n != 0)))
            .collect()
    }
}

impl Hparams {
    /// The hyper-parameters of the file `keys` reads, with the command line's RoPE settings
    /// (`rope`) over the file's.
    pub fn read(
        spec: &ArchSpec,
        keys: &Keys,
        rope: &RopeOverrides,
    ) -> Result<Hparams, EngineError> {
        let n_embd = keys.usize("embedding_length")?;
        // multi-token-prediction layers (`nextn_predict_layers`) follow the trunk's and are
        // skipped, as llama.cpp skips them unless asked to draft with them
        let n_nextn = keys.opt_usize("nextn_predict_layers")?.unwrap_or(0);
        let n_layer = keys
            .usize("block_count")?
            .checked_sub(n_nextn)
            .filter(|&n| n > 0)
            .ok_or_else(|| EngineError::Load("no layers besides the next-token ones".into()))?;
        let n_head = keys.usize("attention.head_count")?;
        let n_head_kv = keys.opt_usize("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(EngineError::Load(format!(
                "{} heads cannot share {n_head_kv} KV heads",
                n_head
            )));
        }
        let head_dim_k = keys
            .opt_usize("attention.key_length")?
            .unwrap_or(n_embd / n_head);
        let head_dim_v = keys
            .opt_usize("attention.value_length")?
            .unwrap_or(n_embd / n_head);
        let n_rot = keys
            .opt_usize("rope.dimension_count")?
            .unwrap_or(head_dim_k);
        let eps = keys
            .opt_f32("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5);
        // the file's values (llama.cpp's `hparams`), then the command line's over them (its
        // `cparams`); windowed layers keep the file's
        let base_train = keys.opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        let scaling_train = keys.opt_str("rope.scaling.type").unwrap_or("linear");
        let scaling_train = RopeScaling::parse(scaling_train).ok_or_else(|| {
            EngineError::Load(format!(
                "rope scaling {scaling_train:?} is not supported yet"
            ))
        })?;
        // the factor scales positions whatever the type says (absent type: linear)
        let factor = keys
            .opt_f32("rope.scaling.factor")?
            .or(keys.opt_f32("rope.scale_linear")?)
            .filter(|&f| f != 0.0);
        let scale_train = factor.map_or(1.0, |f| 1.0 / f);
        let scaling = rope.scaling.unwrap_or(scaling_train);
        let rope_base = if rope.freq_base != 0.0 {
            rope.freq_base
        } else {
            base_train
        };
        let rope_scale = match scaling {
            RopeScaling::None => 1.0,
            _ if rope.freq_scale != 0.0 => rope.freq_scale,
            _ => scale_train,
        };
        let n_ctx_train = keys.opt_usize("context_length")?.unwrap_or(0) as u32;
        let n_ctx_orig = match rope.yarn_orig_ctx {
            0 => keys
                .opt_usize("rope.scaling.original_context_length")?
                .map_or(n_ctx_train, |n| n as u32),
            n => n,
        };
        // DeepSeek-V2's converter stores 0.1 x `mscale_all_dim` (llama.cpp divides it back)
        let log_mul = if spec.latent_attn {
            keys.opt_f32("rope.scaling.yarn_log_multiplier")?
                .map_or(0.0, |m| m / 0.1)
        } else {
            0.0
        };
        let yarn = Yarn::derive(
            scaling == RopeScaling::Yarn,
            rope_scale,
            keys.opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0),
            n_ctx_orig,
            rope,
            (log_mul, spec.latent_attn),
        );
        let n_swa = keys.opt_usize("attention.sliding_window")?.unwrap_or(0) as u32;
        let swa_layers = match spec.swa_period {
            Some(period) if n_swa > 0 => keys
                .opt_bool_array("attention.sliding_window_pattern")
                .filter(|v| v.len() == n_layer)
                .unwrap_or_else(|| {
                    let period = keys
                        .opt_usize("attention.sliding_window_pattern")
                        .ok()
                        .flatten()
                        .map_or(period, |p| p as u32);
                    // every `period`-th layer (the last of each group) is global
                    (0..n_layer as u32)
                        .map(|il| period == 0 || il % period < period - 1)
                        .collect()
                }),
            _ => vec![false; n_layer],
        };
        let (base_swa, rope_scale_swa) = if spec.swa_rope_same {
            (base_train, scale_train)
        } else {
            (10000.0, 1.0)
        };
        let rope_base_swa = keys.opt_f32("rope.freq_base_swa")?.unwrap_or(base_swa);
        let n_expert = if spec.moe {
            keys.opt_usize("expert_count")?.unwrap_or(0)
        } else {
            0
        };
        let n_expert_used = keys.opt_usize("expert_used_count")?.unwrap_or(0);
        if n_expert > 0 && (n_expert_used == 0 || n_expert_used > n_expert) {
            return Err(EngineError::Load(format!(
                "{n_expert_used} experts used per token out of {n_expert}"
            )));
        }
        let n_ff = if n_expert > 0 {
            keys.opt_usize("feed_forward_length")?.unwrap_or(0)
        } else {
            keys.usize("feed_forward_length")?
        };
        let n_ff_exp = keys
            .opt_usize("expert_feed_forward_length")?
            .unwrap_or(n_ff);
        // llama (Mixtral) and qwen3moe always renormalize, gpt-oss never; later families say so
        // in a key
        let expert_norm = match spec.expert_norm {
            Some(v) => v,
            None => keys.opt_bool("expert_weights_norm")?.unwrap_or(false),
        };
        // 0 (the default) and 1 both mean no scaling
        let expert_scale = keys
            .opt_f32("expert_weights_scale")?
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0);
        let mut gating = spec.gating;
        if spec.latent_attn && (n_layer == 47 || n_layer == 48) && keys.n_vocab() == 154880 {
            // GLM-4.7 Lite files in this family name no gating function: sigmoid, as upstream
            // assumes
            gating = Gating::Sigmoid;
        }
        if spec.gating_key {
            if let Some(code) = keys.opt_usize("expert_gating_func")? {
                match Gating::from_code(code) {
                    Some(g) => gating = g.unwrap_or(spec.gating),
                    None => {
                        return Err(EngineError::Load(format!(
                            "expert gating function {code} is not supported"
                        )))
                    }
                }
            }
        }
        let n_expert_shared = keys.opt_usize("expert_shared_count")?.unwrap_or(0);
        let n_leading_dense = keys
            .opt_usize("leading_dense_block_count")?
            .unwrap_or(0)
            .min(n_layer);
        let n_expert_groups = keys.opt_usize("expert_group_count")?.unwrap_or(0);
        let n_group_used = keys.opt_usize("expert_group_used_count")?.unwrap_or(0);
        if n_expert > 0 && n_expert_groups > 1 {
            let per = n_expert / n_expert_groups;
            if n_expert % n_expert_groups != 0
                || per < 2
                || n_group_used == 0
                || n_group_used > n_expert_groups
                || n_group_used * per < n_expert_used
            {
                return Err(EngineError::Load(format!(
                    "{n_expert} experts in {n_expert_groups} groups, {n_group_used} of them \
                     used, cannot give {n_expert_used} experts a token"
                )));
            }
        }
        let mla = if spec.latent_attn {
            if keys
                .opt_f32("attention.temperature_scale")?
                .is_some_and(|t| t != 0.0)
            {
                return Err(EngineError::Load(
                    "attention temperature tuning (attention.temperature_scale) is not \
                     supported yet"
                        .into(),
                ));
            }
            MlaDims::read(
                keys,
                (head_dim_k, head_dim_v),
                n_head_kv,
                n_rot,
                &yarn,
                rope_scale,
            )?
        } else {
            MlaDims::default()
        };
        let softcap = |v: Option<f32>| v.filter(|&c| c != 0.0);
        Ok(Hparams {
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff,
            n_rot,
            eps,
            rope_base,
            rope_scale,
            rope_base_swa,
            rope_scale_swa,
            yarn,
            n_swa,
            swa_layers,
            final_softcap: softcap(keys.opt_f32("final_logit_softcapping")?),
            n_expert,
            n_expert_used,
            n_ff_exp,
            gating,
            expert_norm,
            expert_scale,
            n_expert_shared,
            n_leading_dense,
            n_expert_groups,
            n_group_used,
            mla,
        })
    }
}

impl MlaDims {
    /// The latent-attention sizes of a DeepSeek-V2-family file whose plain head widths are
    /// `(head_k, head_v)`, checked against each other, and the attention scale as llama.cpp's
    /// graph derives it from the context's YaRN settings.
    fn read(
        keys: &Keys,
        (head_k, head_v): (usize, usize),
        n_head_kv: usize,
        n_rot: usize,
        yarn: &Yarn,
        freq_scale: f32,
    ) -> Result<MlaDims, EngineError> {
        let kv_rank = keys.usize("attention.kv_lora_rank")?;
        let q_rank = keys.opt_usize("attention.q_lora_rank")?.unwrap_or(0);
        let k_mla = keys.opt_usize("attention.key_length_mla")?;
        let v_mla = keys.opt_usize("attention.value_length_mla")?;
        let (absorbed, hk, hv) = match (k_mla, v_mla) {
            (Some(k), Some(v)) if k > 0 && v > 0 => (true, k, v),
            _ => (false, head_k, head_v),
        };
        let bad = |what: String| Err(EngineError::Load(format!("latent attention: {what}")));
        if hk <= n_rot || kv_rank == 0 {
            return bad(format!(
                "key heads of {hk} with {n_rot} rotary dimensions and rank {kv_rank}"
            ));
        }
        if absorbed && (head_k != kv_rank + n_rot || head_v != kv_rank || n_head_kv != 1) {
            return bad(format!(
                "the absorbed form caches one head of {} keys and {kv_rank} values, the file \
                 says {n_head_kv} heads of {head_k} and {head_v}",
                kv_rank + n_rot
            ));
        }
        // llama.cpp cancels the kernel's own YaRN correction to recover the original factor,
        // then scales the scores by the square of the magnitude with `log_mul`
        let inv = 1.0 / freq_scale;
        let attn_factor_org = yarn.attn_factor * (1.0 + 0.1 * inv.ln());
        let mscale = attn_factor_org * (1.0 + 0.1 * yarn.log_mul * inv.ln());
        let kq_scale = 1.0 * mscale * mscale / (hk as f32).sqrt();
        Ok(MlaDims {
            q_rank,
            kv_rank,
            head_k: hk,
            head_v: hv,
            absorbed,
            kq_scale,
        })
    }
}

impl Yarn {
    /// The parameters llama.cpp's context sets up (`llama_context`'s constructor) for the
    /// scaling type in effect, the position scale, the file's `rope.scaling.attn_factor` and the
    /// command line's settings: YaRN extrapolates fully (`ext_factor` 1) unless told otherwise,
    /// and then its magnitude comes from the factor (a `--yarn-attn-factor` is overwritten, as
    /// upstream overwrites it), cancelling the correction ggml's kernel applies. A file with a
    /// `yarn_log_multiplier` (`log_mul`, 0: none) makes that magnitude the ratio of two of
    /// YaRN's `mscale`s, the second taking the multiplier (and the first too in DeepSeek-V2's
    /// files, `deepseek2`, when it is not 1).
    pub fn derive(
        is_yarn: bool,
        freq_scale: f32,
        rope_attn_factor: f32,
        n_ctx_orig: u32,
        cli: &RopeOverrides,
        (log_mul, deepseek2): (f32, bool),
    ) -> Yarn {
        let set = |v: f32, default: f32| if v >= 0.0 { v } else { default };
        let mut y = Yarn {
            ext_factor: set(cli.yarn_ext_factor, if is_yarn { 1.0 } else { 0.0 }),
            attn_factor: set(cli.yarn_attn_factor, 1.0),
            beta_fast: set(cli.yarn_beta_fast, 32.0),
            beta_slow: set(cli.yarn_beta_slow, 1.0),
            n_ctx_orig,
            log_mul,
        };
        if y.ext_factor != 0.0 {
            // llama.cpp's `get_mscale`, then the kernel's own correction cancelled
            let factor = 1.0 / freq_scale;
            let get_mscale = |mscale: f32| {
                if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * mscale * factor.ln() + 1.0
                }
            };
            y.attn_factor = if log_mul != 0.0 {
                let mscale = if deepseek2 && log_mul != 1.0 {
                    log_mul
                } else {
                    1.0
                };
                get_mscale(mscale) / get_mscale(log_mul)
            } else {
                get_mscale(1.0)
            };
            y.attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        y.attn_factor *= rope_attn_factor;
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama_context's YaRN set-up: extrapolation on for YaRN files unless the command line says
    /// otherwise; the magnitude from the factor (a given `--yarn-attn-factor` is overwritten
    /// then, and kept when YaRN is off); the file's `attn_factor` multiplies either.
    #[test]
    fn yarn_parameters_follow_llama_context() {
        let none = RopeOverrides::default();
        let y = Yarn::derive(true, 1.0 / 32.0, 1.0, 4096, &none, (0.0, false));
        let want = (0.1 * 32f32.ln() + 1.0) * (1.0 / (1.0 + 0.1 * 32f32.ln()));
        assert_eq!(
            (y.ext_factor, y.attn_factor, y.beta_fast, y.beta_slow),
            (1.0, want, 32.0, 1.0)
        );
        let plain = Yarn::derive(false, 1.0, 2.0, 4096, &none, (0.0, false));
        assert_eq!((plain.ext_factor, plain.attn_factor), (0.0, 2.0));
        let cli = RopeOverrides {
            yarn_ext_factor: 0.0,
            yarn_attn_factor: 0.5,
            yarn_beta_fast: 16.0,
            yarn_beta_slow: 2.0,
            ..RopeOverrides::default()
        };
        let y = Yarn::derive(true, 1.0 / 32.0, 1.0, 4096, &cli, (0.0, false));
        assert_eq!(
            (y.ext_factor, y.attn_factor, y.beta_fast, y.beta_slow),
            (0.0, 0.5, 16.0, 2.0)
        );
        let cli = RopeOverrides {
            yarn_ext_factor: 0.25,
            yarn_attn_factor: 0.5,
            ..RopeOverrides::default()
        };
        let y = Yarn::derive(false, 1.0 / 4.0, 1.0, 4096, &cli, (0.0, false));
        let want = (0.1 * 4f32.ln() + 1.0) * (1.0 / (1.0 + 0.1 * 4f32.ln()));
        assert_eq!((y.ext_factor, y.attn_factor), (0.25, want));
    }

    #[test]
    fn rope_scaling_names() {
        assert_eq!(RopeScaling::parse("yarn"), Some(RopeScaling::Yarn));
        assert_eq!(RopeScaling::parse("none"), Some(RopeScaling::None));
        assert_eq!(RopeScaling::parse("linear"), Some(RopeScaling::Linear));
        assert_eq!(RopeScaling::parse(""), None);
        assert_eq!(RopeScaling::parse("longrope"), None);
    }
}
