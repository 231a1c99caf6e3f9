//! Byte counts the planner weighs: the KV cache per layer for a context size, the compute
//! scratch of a pool, and copies of single experts.

use super::inventory::Inventory;
use super::ContextRequest;
use crate::model::GgmlType;

/// Upstream pads the sliding-window cache to 256 cells.
const SWA_PAD: u64 = 256;

pub struct Sizing<'a> {
    pub inv: &'a Inventory,
    pub type_k: GgmlType,
    pub type_v: GgmlType,
    pub ctx: ContextRequest,
}

impl Sizing<'_> {
    /// Bytes `n` elements of `ty` take, whole blocks.
    fn elements(ty: GgmlType, n: u64) -> u64 {
        n.div_ceil(ty.block_size() as u64) * ty.type_size() as u64
    }

    /// Cells of layer `il`'s cache for `n_ctx` tokens in total: a sliding-window layer keeps the
    /// window of every sequence plus one ubatch (padded), as upstream sizes it, unless
    /// `--swa-full`.
    fn cells(&self, il: u32, n_ctx: u32) -> u64 {
        let full = n_ctx as u64;
        let window = self.inv.kv.get(il as usize).and_then(|kv| kv.window);
        match window {
            Some(w) if !self.ctx.swa_full => {
                let c = &self.ctx;
                let n_seq = c.n_seq.max(1) as u64;
                let ub = c.n_ubatch as u64;
                if c.kv_unified {
                    full.min((w as u64 * n_seq + ub).next_multiple_of(SWA_PAD))
                } else {
                    (full / n_seq).min((w as u64 + ub).next_multiple_of(SWA_PAD)) * n_seq
                }
            }
            _ => full,
        }
    }

    pub fn kv_bytes(&self, il: u32, n_ctx: u32) -> u64 {
        let kv = self.inv.kv.get(il as usize).copied().unwrap_or_default();
        let cells = self.cells(il, n_ctx);
        cells * (Self::elements(self.type_k, kv.k) + Self::elements(self.type_v, kv.v))
    }

    /// An estimate of one pool's compute buffers for a ubatch, in f32: the residual stream and
    /// attention in and out (4 rows of `n_embd`), the widest feed-forward activation three times
    /// (gate, up, product), and the logits where the output layer runs.
    pub fn scratch(&self, output: bool) -> u64 {
        let inv = self.inv;
        let per_token = 4 * inv.n_embd as u64
            + 3 * inv.n_ff_active as u64
            + if output { inv.n_vocab as u64 } else { 0 };
        self.ctx.n_ubatch as u64 * per_token * 4
    }

    /// What the CUDA engine holds on a card that computes, beyond [`Sizing::scratch`]: its f16
    /// weight pass and attention-score pass (both bounded, see `backend::cuda::ops`), the padded
    /// rows of a pass of expert products, the expert outputs of a ubatch twice (the card's and
    /// those sent back by the host), and its working copy of the token embeddings. Buffers grow
    /// to an eighth above what they were asked for.
    pub fn card_buffers(&self) -> u64 {
        use crate::backend::cuda::ops::{ATTN_PASS_BYTES, W16_PASS_BYTES};
        use crate::engine::GROUP_ROWS;
        let inv = self.inv;
        let (e, nf) = (inv.n_embd as u64, inv.n_ff_exp as u64);
        let nub = self.ctx.n_ubatch as u64;
        let moe = if inv.n_expert > 0 {
            let rows = (GROUP_ROWS as u64).max(nub);
            // f16 inputs (reused for the f16 activations), gate, up, outputs
            rows * (2 * e.max(nf) + 8 * nf + 4 * e) + 2 * nub * inv.n_expert_used as u64 * e * 4
        } else {
            0
        };
        let grown = (W16_PASS_BYTES + ATTN_PASS_BYTES) as u64 + moe;
        let embeddings = inv
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .map_or(0, |t| t.bytes);
        // a tied head is the embeddings themselves, counted with the output layer
        let embeddings = if inv.tied_output_bytes > 0 {
            0
        } else {
            embeddings
        };
        grown + grown / 8 + embeddings
    }

    /// Bytes of `count` experts of layer `il` copied to a card: their share of each expert
    /// tensor, so all of them add up to the tensors exactly.
    pub fn expert_copy_bytes(&self, il: u32, count: usize) -> u64 {
        let total = self.inv.layer_expert_bytes(il);
        let n = self.inv.n_expert.max(1) as u128;
        (total as u128 * count as u128 / n) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::inventory::LayerKv;

    fn inv(kv: Vec<LayerKv>) -> Inventory {
        Inventory {
            tensors: Vec::new(),
            n_layer: kv.len() as u32,
            n_expert: 0,
            n_ctx_train: 4096,
            kv,
            tied_output_bytes: 0,
            n_embd: 8,
            n_vocab: 100,
            n_ff_active: 16,
            n_ff_exp: 0,
            n_expert_used: 0,
        }
    }

    fn ctx(n_seq: u32, unified: bool) -> ContextRequest {
        ContextRequest {
            n_ctx: 0,
            n_seq,
            kv_unified: unified,
            swa_full: false,
            n_ubatch: 512,
        }
    }

    #[test]
    fn kv_bytes_follow_types_and_windows() {
        let full = LayerKv {
            k: 256,
            v: 256,
            window: None,
        };
        let swa = LayerKv {
            window: Some(1024),
            ..full
        };
        let inv = inv(vec![full, swa]);
        let s = Sizing {
            inv: &inv,
            type_k: GgmlType::F16,
            type_v: GgmlType::Q8_0,
            ctx: ctx(4, true),
        };
        // f16: 512 bytes; q8_0: 8 blocks of 34 bytes
        assert_eq!(s.kv_bytes(0, 8192), 8192 * (512 + 272));
        // 1024 * 4 + 512 = 4608 cells, already a multiple of 256
        assert_eq!(s.kv_bytes(1, 32768), 4608 * (512 + 272));
        assert_eq!(
            s.kv_bytes(1, 2048),
            2048 * (512 + 272),
            "never above the context"
        );
        let split = Sizing {
            ctx: ctx(4, false),
            ..s
        };
        // per sequence: min(8192, 1536) cells
        assert_eq!(split.kv_bytes(1, 32768), 4 * 1536 * (512 + 272));
    }

    #[test]
    fn scratch_counts_logits_only_with_the_output() {
        let inv = inv(Vec::new());
        let s = Sizing {
            inv: &inv,
            type_k: GgmlType::F16,
            type_v: GgmlType::F16,
            ctx: ctx(1, true),
        };
        assert_eq!(s.scratch(false), 512 * (32 + 48) * 4);
        assert_eq!(s.scratch(true), 512 * (32 + 48 + 100) * 4);
    }
}
