//! Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) as llama.cpp's `deepseek2` graph runs
//! it. Keys and values come from one compressed row per token (`kv_lora_rank` wide, normed) plus
//! one rotary key shared by all heads. Files written for the absorbed form (`attn_k_b`,
//! `attn_v_b`) cache just that row: each query head's non-rotary part is multiplied into the
//! compressed space first (so attention is one key head of `kv_lora_rank + n_rot` and one value
//! head of `kv_lora_rank`, the first `kv_lora_rank` values of the key), and each head's output is
//! decompressed after attention. Older files (`attn_kv_b`) decompress keys and values per head
//! before attention and cache those, as any multi-head model.

use super::arch::{Hparams, MlaDims, RopeKind};
use super::dump;
use super::model::{rms_norm_in_place, rope, rope_cache};
use super::weights::{Loader, Tensor};
use super::EngineError;
use crate::backend::cpu::matmul::{matmul, Activations};
use crate::backend::cpu::{QMat, ThreadPool};

/// The query projection: one matrix, or two with a norm between (`q_lora_rank` > 0).
pub(super) enum Query {
    Full(Tensor),
    Lora {
        a: Tensor,
        norm: Vec<f32>,
        b: Tensor,
    },
}

/// How the compressed row becomes per-head keys and values.
pub(super) enum Decompress {
    /// `attn_k_b` (`[nope, kv_rank, n_head]`) absorbed into the queries, `attn_v_b`
    /// (`[kv_rank, head_v, n_head]`) applied to the attention's output.
    Absorbed { k_b: Tensor, v_b: Tensor },
    /// `attn_kv_b` (`[kv_rank, n_head x (nope + head_v)]`): keys and values per head.
    Full(Tensor),
}

pub(super) struct Mla {
    pub query: Query,
    /// `attn_kv_a_mqa`: the compressed row and the shared rotary key.
    pub kv_a: Tensor,
    pub kv_a_norm: Vec<f32>,
    pub kv: Decompress,
}

/// Scratch rows of [`Mla::project`] and [`Mla::decompress`].
#[derive(Default)]
pub(super) struct MlaBufs {
    q_a: Vec<f32>,
    q: Vec<f32>,
    ckv: Vec<f32>,
    kvb: Vec<f32>,
    gather: Vec<f32>,
    prod: Vec<f32>,
}

impl Mla {
    /// Layer `il`'s latent-attention tensors, checked for shape against `hp`.
    pub fn load(ld: &Loader, hp: &Hparams, il: usize) -> Result<Mla, EngineError> {
        let t = |name: &str| format!("blk.{il}.{name}.weight");
        let m = &hp.mla;
        let (e, h) = (hp.n_embd, hp.n_head);
        let nope = m.head_k - hp.n_rot;
        let query = if ld.has(&t("attn_q_a")) {
            if m.q_rank == 0 {
                return Err(EngineError::Load(format!(
                    "{} needs attention.q_lora_rank",
                    t("attn_q_a")
                )));
            }
            Query::Lora {
                a: ld.matrix(&t("attn_q_a"), &[e, m.q_rank])?,
                norm: ld.vector(&t("attn_q_a_norm"), m.q_rank)?,
                b: ld.matrix(&t("attn_q_b"), &[m.q_rank, h * m.head_k])?,
            }
        } else {
            Query::Full(ld.matrix(&t("attn_q"), &[e, h * m.head_k])?)
        };
        let kv = if m.absorbed {
            Decompress::Absorbed {
                k_b: ld.matrix(&t("attn_k_b"), &[nope, m.kv_rank, h])?,
                v_b: ld.matrix(&t("attn_v_b"), &[m.kv_rank, m.head_v, h])?,
            }
        } else {
            Decompress::Full(ld.matrix(&t("attn_kv_b"), &[m.kv_rank, h * (nope + m.head_v)])?)
        };
        Ok(Mla {
            query,
            kv_a: ld.matrix(&t("attn_kv_a_mqa"), &[e, m.kv_rank + hp.n_rot])?,
            kv_a_norm: ld.vector(&t("attn_kv_a_norm"), m.kv_rank)?,
            kv,
        })
    }

    /// The queries, keys and values of the `n` normed rows `cur` at positions `pos`, shaped for
    /// the cache and attention: `q` gets `n x n_head x head_dim_k` floats, `k` and `v`
    /// `n x n_head_kv x head_dim_k` and `... x head_dim_v`. `rope` is the layer's base and scale.
    #[allow(clippy::too_many_arguments)]
    pub fn project(
        &self,
        pool: &ThreadPool,
        hp: &Hparams,
        (il, rope_base, rope_scale): (usize, f32, f32),
        cur: &[f32],
        pos: &[u32],
        [q, k, v]: [&mut Vec<f32>; 3],
        b: &mut MlaBufs,
        act: &mut Activations,
    ) {
        let n = pos.len();
        let MlaDims {
            q_rank,
            kv_rank,
            head_k,
            head_v,
            ..
        } = hp.mla;
        let (h, n_rot) = (hp.n_head, hp.n_rot);
        let nope = head_k - n_rot;
        b.q.resize(n * h * head_k, 0.0);
        match &self.query {
            Query::Full(wq) => matmul(pool, &wq.product_mat(), cur, n, &mut b.q, act),
            Query::Lora { a, norm, b: wb } => {
                b.q_a.resize(n * q_rank, 0.0);
                matmul(pool, &a.product_mat(), cur, n, &mut b.q_a, act);
                rms_norm_in_place(&mut b.q_a, norm, hp.eps, q_rank);
                matmul(pool, &wb.product_mat(), &b.q_a, n, &mut b.q, act);
            }
        }
        dump::put("q", Some(il), &b.q, head_k);
        let wa = kv_rank + n_rot;
        b.ckv.resize(n * wa, 0.0);
        matmul(pool, &self.kv_a.product_mat(), cur, n, &mut b.ckv, act);
        dump::put("kv_cmpr_pe", Some(il), &b.ckv, wa);
        // per token: the shared rotary key roped, the compressed row normed, the query heads'
        // rotary parts roped
        for (t, &p) in pos.iter().enumerate() {
            let cache = rope_cache(p, n_rot, rope_base, rope_scale, &hp.yarn);
            let row = &mut b.ckv[t * wa..(t + 1) * wa];
            rope(&mut row[kv_rank..], &cache, RopeKind::Norm);
            rms_norm_in_place(&mut row[..kv_rank], &self.kv_a_norm, hp.eps, kv_rank);
            for head in b.q[t * h * head_k..(t + 1) * h * head_k].chunks_exact_mut(head_k) {
                rope(&mut head[nope..], &cache, RopeKind::Norm);
            }
        }
        match &self.kv {
            Decompress::Absorbed { k_b, .. } => {
                // Q: each head's non-rotary part through its slab of `k_b`, then its rotary part
                let hk = hp.head_dim_k;
                q.resize(n * h * hk, 0.0);
                for hd in 0..h {
                    gather(&b.q, n, head_k, (hd, h), 0..nope, &mut b.gather);
                    b.prod.resize(n * kv_rank, 0.0);
                    matmul(pool, &slab(k_b, hd), &b.gather, n, &mut b.prod, act);
                    for t in 0..n {
                        let dst = &mut q[(t * h + hd) * hk..(t * h + hd + 1) * hk];
                        dst[..kv_rank].copy_from_slice(&b.prod[t * kv_rank..(t + 1) * kv_rank]);
                        let src = (t * h + hd) * head_k + nope;
                        dst[kv_rank..].copy_from_slice(&b.q[src..src + n_rot]);
                    }
                }
                // K: the normed row and the rotary key; V: the normed row
                k.clear();
                k.extend_from_slice(&b.ckv);
                v.clear();
                for row in b.ckv.chunks_exact(wa) {
                    v.extend_from_slice(&row[..kv_rank]);
                }
            }
            Decompress::Full(wkv_b) => {
                let wide = nope + head_v;
                b.gather.clear();
                for row in b.ckv.chunks_exact(wa) {
                    b.gather.extend_from_slice(&row[..kv_rank]);
                }
                b.kvb.resize(n * h * wide, 0.0);
                matmul(pool, &wkv_b.product_mat(), &b.gather, n, &mut b.kvb, act);
                // the queries are the projection's, roped in place
                std::mem::swap(q, &mut b.q);
                k.resize(n * h * head_k, 0.0);
                v.resize(n * h * head_v, 0.0);
                for t in 0..n {
                    let k_pe = &b.ckv[t * wa + kv_rank..(t + 1) * wa];
                    for hd in 0..h {
                        let src = &b.kvb[(t * h + hd) * wide..(t * h + hd + 1) * wide];
                        let kd = &mut k[(t * h + hd) * head_k..(t * h + hd + 1) * head_k];
                        kd[..nope].copy_from_slice(&src[..nope]);
                        kd[nope..].copy_from_slice(k_pe);
                        v[(t * h + hd) * head_v..(t * h + hd + 1) * head_v]
                            .copy_from_slice(&src[nope..]);
                    }
                }
            }
        }
        dump::put("Qcur", Some(il), q, hp.head_dim_k);
        dump::put("Kcur", Some(il), k, hp.head_dim_k);
        dump::put("Vcur", Some(il), v, hp.head_dim_v);
    }

    /// The attention's output `attn` (rows of `n_head x head_dim_v`) as the output projection
    /// takes it (rows of `n_head x head_v`): each head through its slab of `attn_v_b` in the absorbed
    /// form, unchanged otherwise (`None`).
    pub fn decompress<'a>(
        &self,
        pool: &ThreadPool,
        hp: &Hparams,
        attn: &[f32],
        out: &'a mut Vec<f32>,
        b: &mut MlaBufs,
        act: &mut Activations,
    ) -> Option<&'a [f32]> {
        let Decompress::Absorbed { v_b, .. } = &self.kv else {
            return None;
        };
        let (h, kv_rank, head_v) = (hp.n_head, hp.mla.kv_rank, hp.mla.head_v);
        let n = attn.len() / (h * kv_rank);
        out.resize(n * h * head_v, 0.0);
        for hd in 0..h {
            gather(attn, n, kv_rank, (hd, h), 0..kv_rank, &mut b.gather);
            b.prod.resize(n * head_v, 0.0);
            matmul(pool, &slab(v_b, hd), &b.gather, n, &mut b.prod, act);
            for t in 0..n {
                out[(t * h + hd) * head_v..(t * h + hd + 1) * head_v]
                    .copy_from_slice(&b.prod[t * head_v..(t + 1) * head_v]);
            }
        }
        Some(out)
    }
}

/// Entries `cols` of head `hd` (of `heads`, each `width` wide) of every one of the `n` rows of
/// `x`, as `n` contiguous rows.
fn gather(
    x: &[f32],
    n: usize,
    width: usize,
    (hd, heads): (usize, usize),
    cols: std::ops::Range<usize>,
    out: &mut Vec<f32>,
) {
    out.clear();
    for t in 0..n {
        let at = (t * heads + hd) * width;
        out.extend_from_slice(&x[at + cols.start..at + cols.end]);
    }
}

/// Matrix `i` of a 3-D tensor (`shape[1]` rows of `shape[0]`), as ggml multiplies one head of
/// a batched product: the plain rows, never repacked (ggml repacks only 2-D weights).
fn slab(t: &Tensor, i: usize) -> QMat<'_> {
    let m = t.mat();
    let per = t.shape[1];
    m.rows(i * per, (i + 1) * per)
}
