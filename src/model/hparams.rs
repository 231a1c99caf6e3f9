//! Typed access to metadata: `--override-kv` overrides (parsed as llama.cpp parses them, applied
//! where a typed read asks for a key, as its loader does), architecture keys (`{arch}.*`), and
//! `Hparams`, the hyper-parameters the engine builds a model from.

use std::collections::BTreeMap;

use super::error::ModelError;
use super::gguf::{GgufFile, MetaValue};

/// Architectures the engine serves; any other `general.architecture` is refused by name.
pub const SERVED_ARCHITECTURES: &[&str] = &[
    "llama",
    "qwen2",
    "qwen2moe",
    "qwen3",
    "qwen3moe",
    "gemma3",
    "gpt-oss",
    "deepseek2",
    "glm4moe",
];

/// llama.cpp's limit on layers per model (`LLAMA_MAX_LAYERS`).
const MAX_LAYERS: u32 = 512;

/// One `--override-kv KEY=TYPE:VALUE` item.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KvOverride {
    pub key: String,
    pub value: OverrideValue,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OverrideValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl OverrideValue {
    fn type_name(&self) -> &'static str {
        match self {
            OverrideValue::Int(_) => "int",
            OverrideValue::Float(_) => "float",
            OverrideValue::Bool(_) => "bool",
            OverrideValue::Str(_) => "str",
        }
    }
}

/// C `atol`: leading blanks, a sign, then as many digits as there are; 0 when there are none.
fn c_atol(s: &str) -> i64 {
    let s = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let v = digits
        .bytes()
        .take_while(u8::is_ascii_digit)
        .fold(0i64, |v, d| {
            v.saturating_mul(10).saturating_add((d - b'0') as i64)
        });
    if neg {
        -v
    } else {
        v
    }
}

/// C `atof`: the longest prefix (after leading blanks) that reads as a number; 0 when none does.
fn c_atof(s: &str) -> f64 {
    let s = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    (1..=s.len())
        .rev()
        .filter(|&n| s.is_char_boundary(n))
        .find_map(|n| s[..n].parse::<f64>().ok())
        .unwrap_or(0.0)
}

impl KvOverride {
    /// Parses one `KEY=TYPE:VALUE` item with llama.cpp's rules: the key is at most 127 bytes;
    /// `int:` and `float:` read like C's `atol` / `atof`; `bool:` takes exactly `true` or `false`;
    /// `str:` at most 127 bytes.
    pub fn parse(item: &str) -> Result<KvOverride, String> {
        let (key, rest) = item
            .split_once('=')
            .filter(|(k, _)| k.len() < 128)
            .ok_or_else(|| format!("malformed KV override '{item}'"))?;
        let value = if let Some(v) = rest.strip_prefix("int:") {
            OverrideValue::Int(c_atol(v))
        } else if let Some(v) = rest.strip_prefix("float:") {
            OverrideValue::Float(c_atof(v))
        } else if let Some(v) = rest.strip_prefix("bool:") {
            match v {
                "true" => OverrideValue::Bool(true),
                "false" => OverrideValue::Bool(false),
                _ => return Err(format!("invalid boolean value for KV override '{item}'")),
            }
        } else if let Some(v) = rest.strip_prefix("str:") {
            if v.len() > 127 {
                return Err(format!(
                    "malformed KV override '{item}', value cannot exceed 127 chars"
                ));
            }
            OverrideValue::Str(v.to_string())
        } else {
            return Err(format!("invalid type for KV override '{item}'"));
        };
        Ok(KvOverride {
            key: key.to_string(),
            value,
        })
    }
}

/// Writes `overrides` into a file's metadata so every reader (engine, tokenizer, chat template,
/// placement) sees them, with llama.cpp's loader rules: an override replaces a key of its own kind
/// (`int` any integer key, `float` a float key, `bool`, `str`) or adds a missing key; one of another
/// kind is ignored with the loader's warning.
pub fn apply_overrides(metadata: &mut BTreeMap<String, MetaValue>, overrides: &[KvOverride]) {
    for o in overrides {
        let kind = |v: &MetaValue| match v {
            MetaValue::U8(_)
            | MetaValue::I8(_)
            | MetaValue::U16(_)
            | MetaValue::I16(_)
            | MetaValue::U32(_)
            | MetaValue::I32(_)
            | MetaValue::U64(_)
            | MetaValue::I64(_) => "int",
            MetaValue::F32(_) | MetaValue::F64(_) => "float",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "str",
            MetaValue::Array(..) => "array",
        };
        if let Some(old) = metadata.get(&o.key) {
            if kind(old) != o.value.type_name() {
                log::warn!(
                    "bad metadata override type for key '{}', expected {} but got {}",
                    o.key,
                    kind(old),
                    o.value.type_name()
                );
                continue;
            }
        }
        let value = match &o.value {
            OverrideValue::Int(v) => MetaValue::I64(*v),
            OverrideValue::Float(v) => MetaValue::F64(*v),
            OverrideValue::Bool(v) => MetaValue::Bool(*v),
            OverrideValue::Str(v) => MetaValue::String(v.clone()),
        };
        metadata.insert(o.key.clone(), value);
    }
}

/// Metadata with overrides on top. A typed read of a key with an override of that type gets the
/// override (even when the file lacks the key); an override of another type is ignored with a
/// warning, as llama.cpp's loader does.
pub struct Metadata<'a> {
    file: &'a GgufFile,
    overrides: BTreeMap<String, OverrideValue>,
}

impl<'a> Metadata<'a> {
    pub fn new(file: &'a GgufFile, overrides: &[KvOverride]) -> Metadata<'a> {
        Metadata {
            file,
            overrides: overrides
                .iter()
                .map(|o| (o.key.clone(), o.value.clone()))
                .collect(),
        }
    }

    pub fn file(&self) -> &GgufFile {
        self.file
    }

    fn bad(&self, key: &str, reason: String) -> ModelError {
        ModelError::BadMetadata {
            path: self.file.paths[0].clone(),
            key: key.to_string(),
            reason,
        }
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::MissingKey {
            path: self.file.paths[0].clone(),
            key: key.to_string(),
        }
    }

    /// The override for `key` when it has type `want`.
    fn overridden(&self, key: &str, want: &str) -> Option<&OverrideValue> {
        let o = self.overrides.get(key)?;
        if o.type_name() == want {
            Some(o)
        } else {
            log::warn!(
                "bad metadata override type for key '{key}', expected {want} but got {}",
                o.type_name()
            );
            None
        }
    }

    /// An integer key, or `None` when absent. Present with another type: refused.
    pub fn int(&self, key: &str) -> Result<Option<i64>, ModelError> {
        if let Some(OverrideValue::Int(v)) = self.overridden(key, "int") {
            return Ok(Some(*v));
        }
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .filter(|_| !matches!(v, MetaValue::Bool(_)))
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected an integer, found {v:?}"))),
        }
    }

    /// An integer key that must fit in u32.
    pub fn u32(&self, key: &str) -> Result<Option<u32>, ModelError> {
        self.int(key)?
            .map(|v| u32::try_from(v).map_err(|_| self.bad(key, format!("{v} is out of range"))))
            .transpose()
    }

    pub fn require_u32(&self, key: &str) -> Result<u32, ModelError> {
        self.u32(key)?.ok_or_else(|| self.missing(key))
    }

    /// A float key (integers are accepted and widened), or `None` when absent.
    pub fn float(&self, key: &str) -> Result<Option<f64>, ModelError> {
        if let Some(OverrideValue::Float(v)) = self.overridden(key, "float") {
            return Ok(Some(*v));
        }
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected a number, found {v:?}"))),
        }
    }

    pub fn f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.float(key)?.map(|v| v as f32))
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        if let Some(OverrideValue::Bool(v)) = self.overridden(key, "bool") {
            return Ok(Some(*v));
        }
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected a bool, found {v:?}"))),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&str>, ModelError> {
        if let Some(OverrideValue::Str(v)) = self.overridden(key, "str") {
            return Ok(Some(v));
        }
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected a string, found {v:?}"))),
        }
    }

    /// A per-layer integer key: a scalar applies to every layer, an array gives one value per
    /// layer (and must have exactly `n_layer` of them). Overrides replace it for every layer.
    pub fn per_layer_u32(&self, key: &str, n_layer: u32) -> Result<Option<Vec<u32>>, ModelError> {
        if let Some(MetaValue::Array(_, items)) = self.file.get(key) {
            if !self.overrides.contains_key(key) {
                if items.len() != n_layer as usize {
                    return Err(
                        self.bad(key, format!("{} values for {n_layer} layers", items.len()))
                    );
                }
                return items
                    .iter()
                    .map(|v| {
                        v.as_i64()
                            .and_then(|v| u32::try_from(v).ok())
                            .ok_or_else(|| self.bad(key, format!("bad per-layer value {v:?}")))
                    })
                    .collect::<Result<Vec<u32>, _>>()
                    .map(Some);
            }
        }
        Ok(self.u32(key)?.map(|v| vec![v; n_layer as usize]))
    }
}

/// The hyper-parameters of one model, read from `{arch}.*` keys with llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    pub arch: String,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub n_embd: u32,
    pub n_layer: u32,
    /// Per layer; 0 where a layer has no dense feed-forward block.
    pub n_ff: Vec<u32>,
    pub n_head: Vec<u32>,
    pub n_head_kv: Vec<u32>,
    pub n_embd_head_k: u32,
    pub n_embd_head_v: u32,
    pub rms_eps: Option<f32>,
    pub norm_eps: Option<f32>,
    pub rope: Rope,
    pub moe: Option<Moe>,
    pub sliding_window: Option<u32>,
    pub sliding_window_pattern: Option<u32>,
    pub attn_logit_softcap: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    /// Multi-head latent attention (DeepSeek-V2 family).
    pub q_lora_rank: Option<u32>,
    pub kv_lora_rank: Option<u32>,
    /// The file stores latent attention in the absorbed form (`attention.key_length_mla` and
    /// `value_length_mla`): the cache holds keys only, one head of `key_length`, and the values
    /// are the start of each key row.
    pub mla_absorbed: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub freq_base: f32,
    pub freq_base_swa: Option<f32>,
    pub n_rot: u32,
    /// `none`, `linear`, `yarn`, ... as stored; `None` when the file does not say.
    pub scaling_type: Option<String>,
    /// `rope.scaling.factor`, else `rope.scale_linear`.
    pub scaling_factor: Option<f32>,
    pub orig_ctx: Option<u32>,
    pub attn_factor: Option<f32>,
    pub yarn_log_multiplier: Option<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub n_expert_shared: u32,
    pub n_ff_exp: Option<u32>,
    pub n_ff_shexp: Option<u32>,
    /// Leading layers with a dense FFN instead of experts.
    pub n_leading_dense: u32,
    pub weights_scale: Option<f32>,
    pub weights_norm: bool,
    /// 1 softmax, 2 sigmoid (llama.cpp's `expert_gating_func` numbering).
    pub gating_func: Option<u32>,
}

impl Hparams {
    /// Reads the hyper-parameters of `meta`'s architecture. Required: block count, embedding
    /// length, context length and head count; the rest default as llama.cpp defaults them.
    pub fn read(meta: &Metadata) -> Result<Hparams, ModelError> {
        let arch = meta
            .str("general.architecture")?
            .ok_or_else(|| meta.missing("general.architecture"))?
            .to_string();
        let k = |suffix: &str| format!("{arch}.{suffix}");
        let n_layer = meta.require_u32(&k("block_count"))?;
        if n_layer > MAX_LAYERS {
            return Err(meta.bad(
                &k("block_count"),
                format!("{n_layer} layers (llama.cpp allows at most {MAX_LAYERS})"),
            ));
        }
        let n_embd = meta.require_u32(&k("embedding_length"))?;
        let n_ctx_train = meta.require_u32(&k("context_length"))?;
        let n_head = meta
            .per_layer_u32(&k("attention.head_count"), n_layer)?
            .ok_or_else(|| meta.missing(&k("attention.head_count")))?;
        let n_head_kv = meta
            .per_layer_u32(&k("attention.head_count_kv"), n_layer)?
            .unwrap_or_else(|| n_head.clone());
        let n_ff = meta
            .per_layer_u32(&k("feed_forward_length"), n_layer)?
            .unwrap_or_else(|| vec![0; n_layer as usize]);
        let head0 = n_head.first().copied().unwrap_or(0);
        let default_head_dim = n_embd.checked_div(head0).unwrap_or(0);
        let n_embd_head_k = meta
            .u32(&k("attention.key_length"))?
            .unwrap_or(default_head_dim);
        let n_embd_head_v = meta
            .u32(&k("attention.value_length"))?
            .unwrap_or(default_head_dim);
        let n_vocab = match meta.u32(&k("vocab_size"))? {
            Some(v) => v,
            None => meta
                .file()
                .get("tokenizer.ggml.tokens")
                .and_then(MetaValue::as_array)
                .map_or(0, |t| t.len() as u32),
        };
        let rope = Rope {
            freq_base: meta.f32(&k("rope.freq_base"))?.unwrap_or(10000.0),
            freq_base_swa: meta.f32(&k("rope.freq_base_swa"))?,
            n_rot: meta
                .u32(&k("rope.dimension_count"))?
                .unwrap_or(n_embd_head_k),
            scaling_type: meta.str(&k("rope.scaling.type"))?.map(str::to_string),
            scaling_factor: match meta.f32(&k("rope.scaling.factor"))? {
                Some(v) => Some(v),
                None => meta.f32(&k("rope.scale_linear"))?,
            },
            orig_ctx: meta.u32(&k("rope.scaling.original_context_length"))?,
            attn_factor: meta.f32(&k("rope.scaling.attn_factor"))?,
            yarn_log_multiplier: meta.f32(&k("rope.scaling.yarn_log_multiplier"))?,
        };
        let n_expert = meta.u32(&k("expert_count"))?.unwrap_or(0);
        let moe = if n_expert > 0 {
            Some(Moe {
                n_expert,
                n_expert_used: meta.require_u32(&k("expert_used_count"))?,
                n_expert_shared: meta.u32(&k("expert_shared_count"))?.unwrap_or(0),
                n_ff_exp: meta.u32(&k("expert_feed_forward_length"))?,
                n_ff_shexp: meta.u32(&k("expert_shared_feed_forward_length"))?,
                n_leading_dense: meta.u32(&k("leading_dense_block_count"))?.unwrap_or(0),
                weights_scale: meta.f32(&k("expert_weights_scale"))?,
                weights_norm: meta.bool(&k("expert_weights_norm"))?.unwrap_or(false),
                gating_func: meta.u32(&k("expert_gating_func"))?,
            })
        } else {
            None
        };
        Ok(Hparams {
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            n_embd_head_k,
            n_embd_head_v,
            rms_eps: meta.f32(&k("attention.layer_norm_rms_epsilon"))?,
            norm_eps: meta.f32(&k("attention.layer_norm_epsilon"))?,
            rope,
            moe,
            sliding_window: meta.u32(&k("attention.sliding_window"))?,
            sliding_window_pattern: meta.u32(&k("attention.sliding_window_pattern"))?,
            attn_logit_softcap: meta.f32(&k("attn_logit_softcapping"))?,
            final_logit_softcap: meta.f32(&k("final_logit_softcapping"))?,
            q_lora_rank: meta.u32(&k("attention.q_lora_rank"))?,
            kv_lora_rank: meta.u32(&k("attention.kv_lora_rank"))?,
            mla_absorbed: meta.u32(&k("attention.key_length_mla"))?.unwrap_or(0) > 0
                && meta.u32(&k("attention.value_length_mla"))?.unwrap_or(0) > 0,
            arch,
        })
    }
}

/// The file's architecture when the engine serves it; otherwise refused by name.
pub fn served_architecture(meta: &Metadata) -> Result<String, ModelError> {
    let arch = meta
        .str("general.architecture")?
        .ok_or_else(|| meta.missing("general.architecture"))?;
    if SERVED_ARCHITECTURES.contains(&arch) {
        Ok(arch.to_string())
    } else {
        Err(ModelError::UnsupportedArchitecture {
            path: meta.file().paths[0].clone(),
            arch: arch.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn overrides_written_into_the_file_follow_the_loaders_kinds() {
        let mut m = BTreeMap::new();
        m.insert("a.block_count".to_string(), MetaValue::U32(24));
        m.insert("a.flag".to_string(), MetaValue::Bool(true));
        let parse = |s: &str| KvOverride::parse(s).unwrap();
        apply_overrides(
            &mut m,
            &[
                parse("a.block_count=int:12"),
                parse("a.flag=int:0"),
                parse("a.new=float:0.5"),
            ],
        );
        assert_eq!(m["a.block_count"].as_i64(), Some(12));
        assert_eq!(m["a.flag"], MetaValue::Bool(true), "wrong kind: ignored");
        assert_eq!(m["a.new"].as_f64(), Some(0.5));
    }

    use super::*;

    #[test]
    fn parses_overrides_as_llama_cpp_does() {
        let o = KvOverride::parse("tokenizer.ggml.add_bos_token=bool:false").unwrap();
        assert_eq!(o.key, "tokenizer.ggml.add_bos_token");
        assert_eq!(o.value, OverrideValue::Bool(false));
        let int = |s: &str| KvOverride::parse(s).unwrap().value;
        assert_eq!(int("a=int:  -42xyz"), OverrideValue::Int(-42));
        assert_eq!(int("a=int:"), OverrideValue::Int(0));
        assert_eq!(int("a=float:1.5e3x"), OverrideValue::Float(1500.0));
        assert_eq!(int("a=float:abc"), OverrideValue::Float(0.0));
        assert_eq!(int("a=str:x=y"), OverrideValue::Str("x=y".into()));
        assert!(KvOverride::parse("a=bool:1").is_err());
        assert!(KvOverride::parse("a=uint:1").is_err());
        assert!(KvOverride::parse("novalue").is_err());
        assert!(KvOverride::parse(&format!("{}=int:1", "k".repeat(128))).is_err());
        assert!(KvOverride::parse(&format!("{}=int:1", "k".repeat(127))).is_ok());
        assert!(KvOverride::parse(&format!("a=str:{}", "v".repeat(128))).is_err());
    }
}
