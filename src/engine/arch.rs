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
    pub qk_norm: bool,
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
}

const fn base(name: &'static str, rope: RopeKind) -> ArchSpec {
    ArchSpec {
        name,
        rope,
        act: Act::Silu,
        embd_scale: false,
        qk_norm: false,
        post_norms: false,
        scale_q: false,
        swa_period: None,
        moe: false,
    }
}

pub const ARCHS: &[ArchSpec] = &[
    ArchSpec {
        moe: true,
        ..base("llama", RopeKind::Norm)
    },
    base("qwen2", RopeKind::Neox),
    ArchSpec {
        qk_norm: true,
        ..base("qwen3", RopeKind::Neox)
    },
    ArchSpec {
        qk_norm: true,
        moe: true,
        ..base("qwen3moe", RopeKind::Neox)
    },
    ArchSpec {
        act: Act::Gelu,
        embd_scale: true,
        qk_norm: true,
        post_norms: true,
        scale_q: true,
        swa_period: Some(6),
        ..base("gemma3", RopeKind::Neox)
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
    /// Position multiplier (1 / linear scaling factor).
    pub rope_scale: f32,
    pub rope_base_swa: f32,
    pub n_swa: u32,
    pub swa_layers: Vec<bool>,
    pub final_softcap: Option<f32>,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    /// Top-k expert weights are renormalized to sum to 1.
    pub expert_norm: bool,
    pub expert_scale: f32,
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
    pub fn read(spec: &ArchSpec, keys: &Keys) -> Result<Hparams, EngineError> {
        let n_embd = keys.usize("embedding_length")?;
        let n_layer = keys.usize("block_count")?;
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
        let rope_base = keys.opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        let rope_scale = match (
            keys.opt_str("rope.scaling.type"),
            keys.opt_f32("rope.scaling.factor")?,
        ) {
            (Some("linear"), Some(f)) if f > 0.0 => 1.0 / f,
            (Some("none") | None, _) | (Some("linear"), _) => 1.0,
            (Some(other), _) => {
                return Err(EngineError::Load(format!(
                    "rope scaling {other:?} is not supported yet"
                )))
            }
        };
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
        let rope_base_swa = keys.opt_f32("rope.freq_base_swa")?.unwrap_or(10000.0);
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
        // llama (Mixtral) and qwen3moe always renormalize; later families say so in a key
        let expert_norm = keys.opt_bool("expert_weights_norm")?.unwrap_or(true);
        let expert_scale = keys.opt_f32("expert_weights_scale")?.unwrap_or(1.0);
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
            n_swa,
            swa_layers,
            final_softcap: softcap(keys.opt_f32("final_logit_softcapping")?),
            n_expert,
            n_expert_used,
            n_ff_exp,
            expert_norm,
            expert_scale,
        })
    }
}
