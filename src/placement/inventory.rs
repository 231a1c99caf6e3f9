//! What the planner knows about a model: each tensor's name and size, which layer it belongs to,
//! whether it holds experts, and the shapes that size the KV cache and the compute scratch.

use crate::model::{GgufFile, Hparams, KvOverride, Metadata, ModelError};

/// One weight tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub bytes: u64,
    /// `Some(il)` for `blk.{il}.*` tensors, and `Some(0)` for `token_embd_norm`, which upstream
    /// runs with the first layer.
    pub layer: Option<u32>,
    /// An expert tensor (`ffn_{up,gate,down,gate_up}_exps`, also the `chexps` spelling), whose
    /// bytes are `n_expert` equal slices.
    pub expert: bool,
}

impl TensorEntry {
    /// The layer and expert flags follow from the name.
    pub fn new(name: &str, bytes: u64) -> TensorEntry {
        let layer = match name.strip_prefix("blk.") {
            Some(rest) => rest.split('.').next().and_then(|il| il.parse().ok()),
            None => name.starts_with("token_embd_norm.").then_some(0),
        };
        TensorEntry {
            name: name.to_string(),
            bytes,
            layer,
            expert: is_expert_tensor(name),
        }
    }

    /// Upstream's input layer (token, position, token-type and per-layer embeddings), which
    /// always stays on the host.
    pub fn is_input(&self) -> bool {
        self.layer.is_none() && is_input_name(&self.name)
    }
}

pub(crate) fn is_input_name(name: &str) -> bool {
    let base = name.split('.').next().unwrap_or(name);
    [
        "token_embd",
        "pos_embd",
        "token_types",
        "per_layer_token_embd",
        "masked_embd_centroids",
        "masked_embd_ordering",
    ]
    .contains(&base)
}

/// The tensors upstream's `--cpu-moe` pattern `\.ffn_(up|down|gate|gate_up)_(ch|)exps` matches.
fn is_expert_tensor(name: &str) -> bool {
    ["up", "gate", "down", "gate_up"].iter().any(|part| {
        ["exps", "chexps"]
            .iter()
            .any(|kind| name.contains(&format!(".ffn_{part}_{kind}")))
    })
}

/// K and V elements one token adds to one layer's cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerKv {
    pub k: u64,
    pub v: u64,
    /// Sliding-window size for layers that only attend to the last `window` tokens.
    pub window: Option<u32>,
}

/// The model as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Inventory {
    pub tensors: Vec<TensorEntry>,
    pub n_layer: u32,
    /// 0 for dense models.
    pub n_expert: u32,
    pub n_ctx_train: u32,
    /// One entry per layer.
    pub kv: Vec<LayerKv>,
    /// Bytes of the output projection's copy of `token_embd` when the model ties them (upstream
    /// loads the tied matrix a second time for the output layer's device).
    pub tied_output_bytes: u64,
    pub n_embd: u32,
    pub n_vocab: u32,
    /// The widest feed-forward activation of one token: the dense width, or the expert width times
    /// the experts used, whichever is larger.
    pub n_ff_active: u32,
    /// One expert's feed-forward width, and the experts each token uses (0 for dense models):
    /// they size the card's buffers for expert products.
    pub n_ff_exp: u32,
    pub n_expert_used: u32,
}

impl Inventory {
    /// Reads the tensor list and the hyper-parameters (with `--override-kv` applied).
    pub fn from_gguf(file: &GgufFile, overrides: &[KvOverride]) -> Result<Inventory, ModelError> {
        let hp = Hparams::read(&Metadata::new(file, overrides))?;
        let tensors = file
            .tensors
            .iter()
            .map(|t| TensorEntry::new(&t.name, t.size))
            .collect();
        Ok(Inventory::new(tensors, &hp))
    }

    /// The planner's view of `tensors` of a model with hyper-parameters `hp`.
    pub fn new(tensors: Vec<TensorEntry>, hp: &Hparams) -> Inventory {
        let tied_output_bytes = if tensors.iter().any(|t| t.name == "output.weight") {
            0
        } else {
            tensors
                .iter()
                .find(|t| t.name == "token_embd.weight")
                .map_or(0, |t| t.bytes)
        };
        let (n_expert, n_ff_exp, n_expert_used) = hp.moe.as_ref().map_or((0, 0, 0), |m| {
            (m.n_expert, m.n_ff_exp.unwrap_or(0), m.n_expert_used)
        });
        let n_ff_experts = n_ff_exp * n_expert_used;
        Inventory {
            tensors,
            n_layer: hp.n_layer,
            n_expert,
            n_ctx_train: hp.n_ctx_train,
            kv: layer_kv(hp),
            tied_output_bytes,
            n_embd: hp.n_embd,
            n_vocab: hp.n_vocab,
            n_ff_active: hp.n_ff.iter().copied().max().unwrap_or(0).max(n_ff_experts),
            n_ff_exp,
            n_expert_used,
        }
    }

    /// Bytes of all expert tensors of layer `il`.
    pub fn layer_expert_bytes(&self, il: u32) -> u64 {
        self.tensors
            .iter()
            .filter(|t| t.expert && t.layer == Some(il))
            .map(|t| t.bytes)
            .sum()
    }
}

/// Per-layer KV widths. Latent attention in the absorbed form caches keys only (one head of the
/// compressed KV plus the rotary part) and reads values from them; older latent-attention files
/// cache per-head keys and values as any multi-head model. A sliding window is applied only when the file gives its layer pattern
/// (every `pattern`-th layer global); without a pattern every layer is sized for the full
/// context, which can only overestimate.
fn layer_kv(hp: &Hparams) -> Vec<LayerKv> {
    (0..hp.n_layer as usize)
        .map(|il| {
            let heads = hp.n_head_kv.get(il).copied().unwrap_or(0) as u64;
            let k = heads * hp.n_embd_head_k as u64;
            // latent attention's absorbed form reads its values from the keys' rows
            let v = if hp.mla_absorbed {
                0
            } else {
                heads * hp.n_embd_head_v as u64
            };
            let window = match (hp.sliding_window, hp.sliding_window_pattern) {
                (Some(w), Some(p)) if p > 0 && (il as u32) % p < p - 1 => Some(w),
                _ => None,
            };
            LayerKv { k, v, window }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_layer_and_expert() {
        let t = TensorEntry::new("blk.12.ffn_up_exps.weight", 10);
        assert_eq!((t.layer, t.expert), (Some(12), true));
        assert!(TensorEntry::new("blk.0.ffn_gate_up_exps.weight", 1).expert);
        assert!(TensorEntry::new("blk.0.ffn_down_chexps.weight", 1).expert);
        let shared = TensorEntry::new("blk.3.ffn_up_shexp.weight", 1);
        assert_eq!((shared.layer, shared.expert), (Some(3), false));
        let router = TensorEntry::new("blk.3.ffn_gate_inp.weight", 1);
        assert!(!router.expert);
        let norm = TensorEntry::new("token_embd_norm.weight", 1);
        assert_eq!(norm.layer, Some(0), "runs with the first layer");
        let embd = TensorEntry::new("token_embd.weight", 1);
        assert_eq!(embd.layer, None);
        assert!(embd.is_input());
        assert!(!TensorEntry::new("output.weight", 1).is_input());
    }
}
