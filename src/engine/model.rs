//! The decoder-only transformer, written once over [`ArchSpec`]: pre-norm attention (GQA, RoPE,
//! optional Q/K norms, sliding windows) and a gated FFN (dense or mixture of experts), with the
//! optional post-norms some families add. Each operation mirrors the rounding of ggml's CPU
//! backend where it decides greedy tokens (activation quantization, f16 KV, GELU through f16).

use std::ops::Range;
use std::sync::OnceLock;

use super::arch::{Act, ArchSpec, Hparams, Presence, RopeKind, Yarn};
use super::attention::{attend, AttnMode, AttnShape};
use super::dump;
use super::kv::{KvCache, SeqCells, UpstreamLayout};
use super::mla::{Mla, MlaBufs};
use super::tier::heat::Heat;
use super::weights::{Loader, Tensor};
use super::{Batch, EngineError, EngineParams, Forward, SeqId, SeqState};
use crate::backend::cpu::matmul::{matmul, matmul_prepared, Activations};
use crate::backend::cpu::pool::{split_range, SyncPtr};
use crate::backend::cpu::quant::QK8_0;
use crate::backend::cpu::vec::{gelu_mul, silu_mul};
use crate::backend::cpu::ThreadPool;
use crate::model::quants::{f16_to_f32, f32_to_f16, vec_dot_type};
use crate::model::GgmlType;

// one per layer: boxing the larger variant would save nothing worth an indirection
#[allow(clippy::large_enum_variant)]
pub(super) enum Ffn {
    Dense {
        gate: Tensor,
        up: Tensor,
        down: Tensor,
    },
    Moe {
        router: Tensor,
        gate: Tensor,
        up: Tensor,
        down: Tensor,
        /// Added to the router's logits (gpt-oss).
        router_b: Option<Vec<f32>>,
        /// Added to the gating probabilities for choosing experts only (`exp_probs_b`).
        probs_b: Option<Vec<f32>>,
        /// Per-expert biases of the three products (gpt-oss).
        bias: Option<ExpertBias>,
        /// Shared experts: a dense gated FFN every token runs beside its routed experts.
        shared: Option<[Tensor; 3]>,
    },
}

impl Ffn {
    /// A MoE layer's routed-expert tensors; `None` for a dense layer.
    pub fn moe_weights(&self) -> Option<super::moe::MoeWeights<'_>> {
        match self {
            Ffn::Dense { .. } => None,
            Ffn::Moe {
                router,
                gate,
                up,
                down,
                router_b,
                probs_b,
                bias,
                ..
            } => Some(super::moe::MoeWeights {
                mats: [router, gate, up, down],
                router_b: router_b.as_deref(),
                probs_b: probs_b.as_deref(),
                bias: bias.as_ref(),
            }),
        }
    }
}

/// Per-expert biases: `gate` and `up` hold `n_ff_exp` floats per expert, `down` `n_embd`.
pub struct ExpertBias {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// Grouped-query attention's projections: Q, K and V each from the normed input, with the
/// optional biases and per-head norms some families add.
pub(super) struct Gqa {
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
}

/// How a layer makes the queries, keys and values its attention runs on.
// one per layer: boxing the larger variant would save nothing worth an indirection
#[allow(clippy::large_enum_variant)]
pub(super) enum Attn {
    Gqa(Gqa),
    /// DeepSeek-V2's latent attention.
    Mla(Mla),
}

pub(super) struct Layer {
    pub attn_norm: Vec<f32>,
    pub attn: Attn,
    pub wo: Tensor,
    pub bo: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// Per-head attention sinks (gpt-oss).
    pub sinks: Option<Vec<f32>>,
    pub swa: bool,
    pub rope_base: f32,
    pub rope_scale: f32,
}

/// A model's weights as views of its file, checked for shape; what every backend loads from.
pub(super) struct Weights {
    pub n_vocab: usize,
    pub tok_embd: Tensor,
    /// `None`: the output head is `tok_embd` (tied embeddings).
    pub output: Option<Tensor>,
    pub output_norm: Vec<f32>,
    pub layers: Vec<Layer>,
}

pub struct Model {
    spec: &'static ArchSpec,
    hp: Hparams,
    w: Weights,
    kv: KvCache,
    n_ubatch: usize,
    pool: ThreadPool,
    /// Pool for prompts when `-tb` differs from `-t`.
    pool_batch: Option<ThreadPool>,
    buf: Buffers,
    /// Routes per (layer, expert) since [`Forward::count_routes`]; `None`: not counting.
    routes: Option<Heat>,
    /// The step returns hidden states after the output norm instead of logits
    /// ([`Forward::decode_embd`]).
    embd_out: bool,
}

#[derive(Default)]
struct Buffers {
    x: Vec<f32>,
    cur: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    ffn: Vec<f32>,
    act: Activations,
    pairs: super::moe::PairBufs,
    mla: MlaBufs,
    /// The attention's output decompressed (latent attention's absorbed form).
    attn_out: Vec<f32>,
    logits: Vec<f32>,
}

impl Weights {
    pub fn load(spec: &ArchSpec, hp: &Hparams, ld: &Loader) -> Result<Weights, EngineError> {
        let n_embd = hp.n_embd;
        let info = ld
            .gguf
            .tensor("token_embd.weight")
            .ok_or_else(|| EngineError::Load("missing tensor token_embd.weight".into()))?;
        let n_vocab = info.shape.get(1).copied().unwrap_or(0) as usize;
        let tok_embd = ld.matrix("token_embd.weight", &[n_embd, n_vocab])?;
        // embedding rows are dequantized on lookup: refuse a type we cannot read now, not later
        tok_embd.row_f32(0, &mut vec![0.0; n_embd])?;
        let output = ld.optional_matrix("output.weight", &[n_embd, n_vocab])?;
        let output_norm = ld.vector("output_norm.weight", n_embd)?;
        let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
        let (nq, nkv) = (hp.n_head * hk, hp.n_head_kv * hk);
        let nv = hp.n_head_kv * hv;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let t = |name: &str| format!("blk.{il}.{name}");
            let norm = |name: &str| ld.vector(&t(name), n_embd);
            let opt_norm = |name: &str, n| ld.optional_vector(&t(name), n);
            let ffn = if hp.n_expert > 0 && il >= hp.n_leading_dense {
                let (ne, nf) = (hp.n_expert, hp.n_ff_exp);
                let bias = if ld.has(&t("ffn_gate_exps.bias")) {
                    Some(ExpertBias {
                        gate: ld.floats(&t("ffn_gate_exps.bias"), &[nf, ne])?,
                        up: ld.floats(&t("ffn_up_exps.bias"), &[nf, ne])?,
                        down: ld.floats(&t("ffn_down_exps.bias"), &[n_embd, ne])?,
                    })
                } else {
                    None
                };
                let shared = if hp.n_expert_shared > 0 {
                    let ns = nf * hp.n_expert_shared;
                    Some([
                        ld.matrix(&t("ffn_gate_shexp.weight"), &[n_embd, ns])?,
                        ld.matrix(&t("ffn_up_shexp.weight"), &[n_embd, ns])?,
                        ld.matrix(&t("ffn_down_shexp.weight"), &[ns, n_embd])?,
                    ])
                } else {
                    None
                };
                Ffn::Moe {
                    router: ld.matrix(&t("ffn_gate_inp.weight"), &[n_embd, ne])?,
                    gate: ld.matrix(&t("ffn_gate_exps.weight"), &[n_embd, nf, ne])?,
                    up: ld.matrix(&t("ffn_up_exps.weight"), &[n_embd, nf, ne])?,
                    down: ld.matrix(&t("ffn_down_exps.weight"), &[nf, n_embd, ne])?,
                    router_b: ld.optional_vector(&t("ffn_gate_inp.bias"), ne)?,
                    probs_b: ld.optional_vector(&t("exp_probs_b.bias"), ne)?,
                    bias,
                    shared,
                }
            } else {
                Ffn::Dense {
                    gate: ld.matrix(&t("ffn_gate.weight"), &[n_embd, hp.n_ff])?,
                    up: ld.matrix(&t("ffn_up.weight"), &[n_embd, hp.n_ff])?,
                    down: ld.matrix(&t("ffn_down.weight"), &[hp.n_ff, n_embd])?,
                }
            };
            let swa = hp.swa_layers[il];
            let qk_norm = |name: &str| match spec.qk_norm {
                Presence::Required => ld.vector(&t(name), hk).map(Some),
                Presence::Optional => ld.optional_vector(&t(name), hk),
                Presence::No => Ok(None),
            };
            let post = |name: &str| {
                if spec.post_norms {
                    norm(name).map(Some)
                } else {
                    Ok(None)
                }
            };
            let (attn, head_out) = if spec.latent_attn {
                let mla = Mla::load(ld, hp, il)?;
                (Attn::Mla(mla), hp.mla.head_v)
            } else {
                let gqa = Gqa {
                    wq: ld.matrix(&t("attn_q.weight"), &[n_embd, nq])?,
                    wk: ld.matrix(&t("attn_k.weight"), &[n_embd, nkv])?,
                    wv: ld.matrix(&t("attn_v.weight"), &[n_embd, nv])?,
                    bq: opt_norm("attn_q.bias", nq)?,
                    bk: opt_norm("attn_k.bias", nkv)?,
                    bv: opt_norm("attn_v.bias", nv)?,
                    q_norm: qk_norm("attn_q_norm.weight")?,
                    k_norm: qk_norm("attn_k_norm.weight")?,
                };
                (Attn::Gqa(gqa), hv)
            };
            layers.push(Layer {
                attn_norm: norm("attn_norm.weight")?,
                attn,
                wo: ld.matrix(&t("attn_output.weight"), &[hp.n_head * head_out, n_embd])?,
                bo: opt_norm("attn_output.bias", n_embd)?,
                post_attn_norm: post("post_attention_norm.weight")?,
                ffn_norm: norm(&format!("{}.weight", spec.ffn_norm))?,
                ffn,
                post_ffn_norm: post("post_ffw_norm.weight")?,
                sinks: if spec.sinks {
                    Some(ld.vector(&t("attn_sinks.weight"), hp.n_head)?)
                } else {
                    None
                },
                swa,
                rope_base: if swa { hp.rope_base_swa } else { hp.rope_base },
                rope_scale: if swa {
                    hp.rope_scale_swa
                } else {
                    hp.rope_scale
                },
            });
        }
        Ok(Weights {
            n_vocab,
            tok_embd,
            output,
            output_norm,
            layers,
        })
    }
}

impl Model {
    pub fn load(
        spec: &'static ArchSpec,
        hp: Hparams,
        ld: &Loader,
        params: &EngineParams,
    ) -> Result<Model, EngineError> {
        let w = Weights::load(spec, &hp, ld)?;
        let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
        let (nkv, nv) = (hp.n_head_kv * hk, hp.n_head_kv * hv);
        // latent attention's absorbed form caches keys only; its values are the first
        // `kv_lora_rank` of each key, so they take the key type (`-ctv` does not apply)
        let type_v = if hp.mla.absorbed {
            params.type_k
        } else {
            params.type_v
        };
        let mut kv = KvCache::new(
            params.type_k,
            type_v,
            nkv,
            nv,
            hp.n_layer,
            params.n_ctx_seq,
            params.n_seq_max,
        )?;
        if hp.mla.absorbed {
            kv.set_v_in_k();
        }
        kv.set_layout(UpstreamLayout {
            kv_unified: params.kv_unified,
            swa_full: params.swa_full,
            n_ubatch: params.n_ubatch,
            n_swa: hp.n_swa as usize,
        });
        if params.type_k != GgmlType::F16 && params.type_k != GgmlType::F32 && hk % QK8_0 != 0 {
            return Err(EngineError::Load(format!(
                "K cache type {} needs a head size that is a multiple of 32, not {hk}",
                params.type_k
            )));
        }
        let pool = ThreadPool::new(params.n_threads);
        let pool_batch = (params.n_threads_batch != params.n_threads)
            .then(|| ThreadPool::new(params.n_threads_batch));
        Ok(Model {
            spec,
            hp,
            w,
            kv,
            n_ubatch: params.n_ubatch.max(1),
            pool,
            pool_batch,
            buf: Buffers::default(),
            routes: None,
            embd_out: false,
        })
    }

    fn check(&self, batch: &Batch) -> Result<(), EngineError> {
        batch.check_shape(self.w.n_vocab, self.kv.n_seq_max())?;
        let n = batch.tokens.len();
        // room: new positions per sequence, counted before anything is written
        let mut seqs: Vec<SeqId> = batch.seq.clone();
        seqs.sort_unstable();
        seqs.dedup();
        for s in seqs {
            let mut new: Vec<u32> = (0..n)
                .filter(|&i| batch.seq[i] == s)
                .map(|i| batch.pos[i])
                .collect();
            new.sort_unstable();
            new.dedup();
            let fresh = new
                .iter()
                .filter(|&&p| self.kv.count_in(s, p, p + 1) == 0)
                .count();
            let needed = self.kv.len(s) + fresh;
            if needed > self.kv.n_ctx_seq() {
                return Err(EngineError::NoSpace {
                    seq: s,
                    needed,
                    capacity: self.kv.n_ctx_seq(),
                });
            }
        }
        Ok(())
    }

    /// Runs entries `r` of `batch` as one ubatch.
    fn ubatch(
        &mut self,
        batch: &Batch,
        r: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let n = r.len();
        let hp = &self.hp;
        let n_embd = hp.n_embd;
        let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
        let (nkv, nv) = (hp.n_head_kv * hk, hp.n_head_kv * hv);
        let seqs = &batch.seq[r.clone()];
        let pos = &batch.pos[r.clone()];
        let mut cells = Vec::with_capacity(n);
        for i in 0..n {
            cells.push(self.kv.alloc(seqs[i], pos[i])?);
        }
        let pool = match (&self.pool_batch, n > 1) {
            (Some(p), true) => p,
            _ => &self.pool,
        };
        let b = &mut self.buf;
        b.x.resize(n * n_embd, 0.0);
        let embd_scale = (n_embd as f32).sqrt();
        for (i, &tok) in batch.tokens[r.clone()].iter().enumerate() {
            let row = &mut b.x[i * n_embd..(i + 1) * n_embd];
            self.w.tok_embd.row_f32(tok as usize, row)?;
            if self.spec.embd_scale {
                row.iter_mut().for_each(|v| *v *= embd_scale);
            }
        }
        dump::put("inp_scaled", None, &b.x, n_embd);
        let mode = if n >= 64
            && self.kv.type_k == self.kv.type_v
            && matches!(self.kv.type_k, GgmlType::F16 | GgmlType::F32)
        {
            AttnMode::Exact
        } else {
            AttnMode::HalfAccum
        };
        let q_scale = 1.0 / (hk as f32).sqrt();
        let wanted: Vec<usize> = (0..n).filter(|&i| batch.logits[r.start + i]).collect();
        // rows still computed: all of them until the last layer's attention is done
        let mut rows = n;
        let n_layer = self.w.layers.len();
        for (il, layer) in self.w.layers.iter().enumerate() {
            rms_norm_rows(&b.x, &layer.attn_norm, hp.eps, n_embd, &mut b.cur);
            dump::put("attn_norm", Some(il), &b.cur, n_embd);
            let kq_scale = match &layer.attn {
                Attn::Gqa(a) => {
                    gqa_project(
                        pool,
                        (self.spec, hp, layer, il),
                        a,
                        &b.cur,
                        pos,
                        [&mut b.q, &mut b.k, &mut b.v],
                        &mut b.act,
                    );
                    if self.spec.scale_q {
                        b.q.iter_mut().for_each(|v| *v *= q_scale);
                        1.0
                    } else {
                        q_scale
                    }
                }
                Attn::Mla(m) => {
                    m.project(
                        pool,
                        hp,
                        (il, layer.rope_base, layer.rope_scale),
                        &b.cur,
                        pos,
                        [&mut b.q, &mut b.k, &mut b.v],
                        &mut b.mla,
                        &mut b.act,
                    );
                    hp.mla.kq_scale
                }
            };
            for i in 0..n {
                self.kv.store(
                    seqs[i],
                    il,
                    cells[i],
                    &b.k[i * nkv..(i + 1) * nkv],
                    &b.v[i * nv..(i + 1) * nv],
                );
            }
            b.attn.resize(n * hp.n_head * hv, 0.0);
            let shape = AttnShape {
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim_k: hk,
                head_dim_v: hv,
                scale: kq_scale,
                n_swa: if layer.swa { hp.n_swa } else { 0 },
                mode,
                sinks: layer.sinks.as_deref(),
                // a one-token step of one sequence: the view decides ggml's split decode
                n_kv_view: if n == 1 {
                    self.kv.n_kv_view(seqs[0], layer.swa)
                } else {
                    0
                },
            };
            attend(pool, &self.kv, il, &shape, seqs, pos, &b.q, &mut b.attn);
            let attn_out = match &layer.attn {
                Attn::Mla(m) => {
                    m.decompress(pool, hp, &b.attn, &mut b.attn_out, &mut b.mla, &mut b.act)
                }
                Attn::Gqa(_) => None,
            }
            .unwrap_or(&b.attn);
            dump::put("kqv_out", Some(il), attn_out, attn_out.len() / n.max(1));
            b.o.resize(n * n_embd, 0.0);
            matmul(
                pool,
                &layer.wo.product_mat(),
                attn_out,
                n,
                &mut b.o,
                &mut b.act,
            );
            add_bias(&mut b.o, layer.bo.as_deref());
            dump::put("attn_wo", Some(il), &b.o, n_embd);
            if let Some(w) = &layer.post_attn_norm {
                rms_norm_in_place(&mut b.o, w, hp.eps, n_embd);
            }
            dump::put("attn_post_norm", Some(il), &b.o, n_embd);
            b.x.iter_mut().zip(&b.o).for_each(|(x, o)| *x += o);
            dump::put("sa_out", Some(il), &b.x, n_embd);
            rms_norm_rows(&b.x, &layer.ffn_norm, hp.eps, n_embd, &mut b.cur);
            dump::put("ffn_norm", Some(il), &b.cur, n_embd);
            // most families trim here; gpt-oss after the last layer (below), unless no row at all
            // is wanted
            let trim = self.spec.trim_last_ffn || wanted.is_empty();
            if il + 1 == n_layer && wanted.len() < n && trim {
                if let (Some(heat), Some(mw)) = (self.routes.as_mut(), layer.ffn.moe_weights()) {
                    // counting routes: the rows that stop here are routed all the same
                    let stop: Vec<usize> = (0..n).filter(|i| !wanted.contains(i)).collect();
                    let mut cur = b.cur.clone();
                    keep_rows(&mut cur, &stop, n_embd);
                    let routes = super::moe::routes_of(pool, hp, &mw, &cur, stop.len(), &mut b.act);
                    super::moe::record(heat, il as u32, &routes);
                }
                // as ggml: only the rows whose logits are wanted go on into the last FFN (the
                // norms before it are row by row, so trimming here equals ggml's trim after the
                // attention; the row count decides the float order of the products that follow)
                keep_rows(&mut b.cur, &wanted, n_embd);
                keep_rows(&mut b.x, &wanted, n_embd);
                rows = wanted.len();
                if rows == 0 {
                    return Ok(());
                }
            }
            b.ffn.resize(rows * n_embd, 0.0);
            match &layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    dense_ffn(
                        pool,
                        self.spec.act,
                        [gate, up, down],
                        &b.cur,
                        rows,
                        DenseBufs {
                            gate: &mut b.gate,
                            up: &mut b.up,
                            out: &mut b.ffn,
                            act: &mut b.act,
                        },
                        Some(il),
                    );
                }
                Ffn::Moe { shared, .. } => {
                    super::moe::moe_ffn(
                        pool,
                        hp,
                        self.spec.act,
                        layer.ffn.moe_weights().expect("a MoE layer"),
                        &b.cur,
                        rows,
                        &mut b.ffn,
                        &mut b.act,
                        &mut b.pairs,
                        self.routes.as_mut().map(|h| (h, il as u32)),
                    );
                    if let Some([sg, su, sd]) = shared {
                        b.o.resize(rows * n_embd, 0.0);
                        dense_ffn(
                            pool,
                            self.spec.act,
                            [sg, su, sd],
                            &b.cur,
                            rows,
                            DenseBufs {
                                gate: &mut b.gate,
                                up: &mut b.up,
                                out: &mut b.o,
                                act: &mut b.act,
                            },
                            None,
                        );
                        // routed + shared, as ggml adds them
                        b.ffn.iter_mut().zip(&b.o).for_each(|(r, s)| *r += s);
                    }
                }
            }
            dump::put("ffn_out", Some(il), &b.ffn, n_embd);
            if let Some(w) = &layer.post_ffn_norm {
                rms_norm_in_place(&mut b.ffn, w, hp.eps, n_embd);
            }
            dump::put("ffn_post_norm", Some(il), &b.ffn, n_embd);
            b.x.iter_mut().zip(&b.ffn).for_each(|(x, f)| *x += f);
            dump::put("l_out", Some(il), &b.x, n_embd);
        }
        if wanted.is_empty() {
            return Ok(());
        }
        if rows != wanted.len() {
            // gpt-oss: every row went through the last layer
            keep_rows(&mut b.x, &wanted, n_embd);
            rows = wanted.len();
        }
        // the rows left are the wanted ones, in order
        b.cur.resize(rows * n_embd, 0.0);
        for j in 0..rows {
            rms_norm(
                &b.x[j * n_embd..(j + 1) * n_embd],
                &self.w.output_norm,
                hp.eps,
                &mut b.cur[j * n_embd..(j + 1) * n_embd],
            );
        }
        dump::put("result_norm", None, &b.cur, n_embd);
        if self.embd_out {
            out.extend_from_slice(&b.cur);
            return Ok(());
        }
        let head = self.w.output.as_ref().unwrap_or(&self.w.tok_embd);
        b.logits.resize(wanted.len() * self.w.n_vocab, 0.0);
        matmul(
            pool,
            &head.product_mat(),
            &b.cur,
            wanted.len(),
            &mut b.logits,
            &mut b.act,
        );
        if let Some(cap) = hp.final_softcap {
            b.logits
                .iter_mut()
                .for_each(|v| *v = (*v * (1.0 / cap)).tanh() * cap);
        }
        dump::put("result_output", None, &b.logits, self.w.n_vocab);
        out.extend_from_slice(&b.logits);
        Ok(())
    }
}

impl Forward for Model {
    fn n_vocab(&self) -> usize {
        self.w.n_vocab
    }

    fn n_ctx_seq(&self) -> usize {
        self.kv.n_ctx_seq()
    }

    fn n_swa(&self) -> usize {
        if self.hp.swa_layers.iter().any(|&s| s) {
            self.hp.n_swa as usize
        } else {
            0
        }
    }

    fn n_embd(&self) -> usize {
        self.hp.n_embd
    }

    fn output_hidden(&mut self, on: bool) {
        self.embd_out = on;
    }

    fn decode(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.check(batch)?;
        let mut start = 0;
        while start < batch.len() {
            let end = (start + self.n_ubatch).min(batch.len());
            self.ubatch(batch, start..end, out)?;
            start = end;
        }
        Ok(())
    }

    fn seq_rm(&mut self, seq: SeqId, p0: u32, p1: Option<u32>) {
        self.kv.seq_rm(seq, p0, p1);
    }

    fn seq_cp(&mut self, src: SeqId, dst: SeqId, n: u32) {
        self.kv.seq_cp(src, dst, n);
    }

    /// Grouped-query attention caches shift; latent attention's (whose rotary part sits after
    /// the compressed row, with its own magnitude rule in llama.cpp) does not yet.
    fn can_shift(&self) -> bool {
        !self.spec.latent_attn
    }

    /// llama.cpp's K-shift: every key head of a moved cell turned by RoPE at the difference of
    /// positions, with the layer's base and scale (YaRN's magnitude factor included, as there).
    fn seq_add(&mut self, seq: SeqId, p0: u32, p1: u32, delta: i32) {
        if !self.can_shift() || delta == 0 || p0 >= p1 {
            return;
        }
        let hp = &self.hp;
        let caches: Vec<Vec<(f32, f32)>> = self
            .w
            .layers
            .iter()
            .map(|l| rope_cache_at(delta as f32, hp.n_rot, l.rope_base, l.rope_scale, &hp.yarn))
            .collect();
        let (hk, kind) = (hp.head_dim_k, self.spec.rope);
        self.kv.shift(seq, (p0, p1), delta, |l, row| {
            for head in row.chunks_exact_mut(hk) {
                rope(head, &caches[l], kind);
            }
        });
    }

    fn seq_save(&self, seq: SeqId) -> Option<SeqState> {
        let cells = self.kv.seq(seq)?.clone();
        let bytes =
            cells.k.iter().chain(&cells.v).map(Vec::len).sum::<usize>() + 4 * cells.pos.len();
        Some(SeqState::new(cells, bytes))
    }

    fn seq_load(&mut self, seq: SeqId, state: &SeqState) -> bool {
        match state.get::<SeqCells>() {
            Some(cells) => self.kv.put(seq, cells.clone()),
            None => false,
        }
    }

    fn count_routes(&mut self) -> bool {
        self.routes = Some(Heat::new(self.hp.n_layer, self.hp.n_expert, 0));
        true
    }

    fn route_counts(&self) -> Option<&Heat> {
        self.routes.as_ref()
    }
}

/// Grouped-query attention's queries, keys and values of the `n` normed rows `cur` at `pos`:
/// products, biases, per-head norms, then RoPE on both Q and K.
fn gqa_project(
    pool: &ThreadPool,
    (spec, hp, layer, il): (&ArchSpec, &Hparams, &Layer, usize),
    a: &Gqa,
    cur: &[f32],
    pos: &[u32],
    [q, k, v]: [&mut Vec<f32>; 3],
    act: &mut Activations,
) {
    let n = pos.len();
    let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
    let (nq, nkv, nv) = (hp.n_head * hk, hp.n_head_kv * hk, hp.n_head_kv * hv);
    q.resize(n * nq, 0.0);
    k.resize(n * nkv, 0.0);
    v.resize(n * nv, 0.0);
    matmul(pool, &a.wq.product_mat(), cur, n, q, act);
    matmul(pool, &a.wk.product_mat(), cur, n, k, act);
    matmul(pool, &a.wv.product_mat(), cur, n, v, act);
    add_bias(q, a.bq.as_deref());
    add_bias(k, a.bk.as_deref());
    add_bias(v, a.bv.as_deref());
    if let Some(w) = &a.q_norm {
        rms_norm_in_place(q, w, hp.eps, hk);
    }
    if let Some(w) = &a.k_norm {
        rms_norm_in_place(k, w, hp.eps, hk);
    }
    dump::put("Qcur_normed", Some(il), q, hk);
    dump::put("Kcur_normed", Some(il), k, hk);
    let qk_rows = q.chunks_exact_mut(nq).zip(k.chunks_exact_mut(nkv));
    for ((qr, kr), &p) in qk_rows.zip(pos) {
        let cache = rope_cache(p, hp.n_rot, layer.rope_base, layer.rope_scale, &hp.yarn);
        for h in qr.chunks_exact_mut(hk).chain(kr.chunks_exact_mut(hk)) {
            rope(h, &cache, spec.rope);
        }
    }
    dump::put("Qcur", Some(il), q, hk);
    dump::put("Kcur", Some(il), k, hk);
    dump::put("Vcur", Some(il), v, hv);
}

/// ggml's `rms_norm`: the mean of squares summed in f64, then `x * scale * w` in f32.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// [`rms_norm`]'s `1 / sqrt(mean(x^2) + eps)`.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, width: usize, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    for (xr, or) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        rms_norm(xr, w, eps, or);
    }
}

/// [`rms_norm`] of each row of `width` values of `x`, in place (the same floats).
pub(super) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32, width: usize) {
    for row in x.chunks_exact_mut(width) {
        let scale = rms_scale(row, eps);
        row.iter_mut()
            .zip(w)
            .for_each(|(v, &g)| *v = *v * scale * g);
    }
}

/// Keeps rows `keep` (ascending) of `x`, rows of `width`, in order at the front.
fn keep_rows(x: &mut Vec<f32>, keep: &[usize], width: usize) {
    for (j, &i) in keep.iter().enumerate() {
        x.copy_within(i * width..(i + 1) * width, j * width);
    }
    x.truncate(keep.len() * width);
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, c)| *v += c);
        }
    }
}

/// The buffers of [`dense_ffn`].
struct DenseBufs<'a> {
    gate: &'a mut Vec<f32>,
    up: &'a mut Vec<f32>,
    out: &'a mut Vec<f32>,
    act: &'a mut Activations,
}

/// A gated FFN `down(act(gate x) * up x)` of the `rows` rows of `cur` into `b.out`; `dump_layer`
/// names the layer whose tensors are dumped (`None`: a shared expert, not dumped).
fn dense_ffn(
    pool: &ThreadPool,
    act: Act,
    [gate, up, down]: [&Tensor; 3],
    cur: &[f32],
    rows: usize,
    b: DenseBufs,
    dump_layer: Option<usize>,
) {
    let (n_embd, nf) = (gate.shape[0], gate.shape[1]);
    b.gate.resize(rows * nf, 0.0);
    b.up.resize(rows * nf, 0.0);
    b.out.resize(rows * n_embd, 0.0);
    // gate and up share one conversion of the input when their types allow
    b.act.prepare(pool, gate.ty, cur, n_embd, rows);
    matmul_prepared(pool, &gate.product_mat(), b.act, b.gate);
    if vec_dot_type(up.ty) == vec_dot_type(gate.ty) {
        matmul_prepared(pool, &up.product_mat(), b.act, b.up);
    } else {
        matmul(pool, &up.product_mat(), cur, rows, b.up, b.act);
    }
    if let Some(il) = dump_layer {
        dump::put("ffn_gate", Some(il), b.gate, nf);
        dump::put("ffn_up", Some(il), b.up, nf);
    }
    glu_threaded(pool, act, b.gate, b.up);
    if let Some(il) = dump_layer {
        let glu_name = match act {
            Act::Silu => "ffn_swiglu",
            Act::Gelu => "ffn_geglu",
            Act::SwigluOai => "ffn_swiglu_oai",
        };
        dump::put(glu_name, Some(il), b.gate, nf);
    }
    matmul(pool, &down.product_mat(), b.gate, rows, b.out, b.act);
}

/// cos/sin pairs for one position, computed as ggml does: the angle multiplied by
/// `base^(-2/n_rot)` step by step in f32, with YaRN's ramp between the interpolated and the
/// extrapolated angle and its magnitude factor where `yarn` asks for them.
pub fn rope_cache(pos: u32, n_rot: usize, base: f32, scale: f32, yarn: &Yarn) -> Vec<(f32, f32)> {
    rope_cache_at(pos as f32, n_rot, base, scale, yarn)
}

/// [`rope_cache`] at any position, negative ones included (a K-shift turns keys by the
/// difference between their new and old positions).
pub fn rope_cache_at(
    pos: f32,
    n_rot: usize,
    base: f32,
    scale: f32,
    yarn: &Yarn,
) -> Vec<(f32, f32)> {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let ext = yarn.ext_factor;
    let corr = if ext != 0.0 {
        yarn.corr_dims(n_rot, base)
    } else {
        [0.0; 2]
    };
    // ggml's compiler fuses the `1 + 0.1 * log` of the magnitude correction
    let mscale = if ext != 0.0 {
        yarn.attn_factor * 0.1f32.mul_add((1.0 / scale).ln(), 1.0)
    } else {
        yarn.attn_factor
    };
    let mut theta = pos;
    (0..n_rot / 2)
        .map(|i| {
            let extrap = theta;
            let interp = scale * extrap;
            let t = if ext != 0.0 {
                let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp = (1.0 - y.clamp(0.0, 1.0)) * ext;
                // the first product fused, as ggml's compiler builds `a*b + c*d`
                interp.mul_add(1.0 - ramp, extrap * ramp)
            } else {
                interp
            };
            theta *= theta_scale;
            (t.cos() * mscale, t.sin() * mscale)
        })
        .collect()
}

pub fn rope(head: &mut [f32], cache: &[(f32, f32)], kind: RopeKind) {
    let half = cache.len();
    for (i, &(c, s)) in cache.iter().enumerate() {
        let (a, b) = match kind {
            RopeKind::Norm => (2 * i, 2 * i + 1),
            RopeKind::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        // ggml's compiler fuses the first product of each line into a multiply-add
        head[a] = x0.mul_add(c, -(x1 * s));
        head[b] = x0.mul_add(s, x1 * c);
    }
}

/// [`glu`] split over the pool for a prompt's rows (a decode step's one row stays on the calling
/// thread: waking the pool costs more). Element by element, so the same values either way.
pub fn glu_threaded(pool: &ThreadPool, act: Act, gate: &mut [f32], up: &[f32]) {
    const SERIAL_MAX: usize = 1 << 14;
    if gate.len() <= SERIAL_MAX || pool.n_threads() == 1 {
        glu(act, gate, up);
        return;
    }
    assert_eq!(gate.len(), up.len(), "gate and up rows");
    let g = SyncPtr::new(gate.as_mut_ptr());
    pool.run(|ith, nth| {
        let (i0, i1) = split_range(up.len(), ith, nth, 64);
        // SAFETY: each thread writes only elements [i0, i1) of `gate`, which has `up.len()`.
        let mine = unsafe { std::slice::from_raw_parts_mut(g.get().add(i0), i1 - i0) };
        glu(act, mine, &up[i0..i1]);
    });
}

/// `gate = act(gate) * up`.
pub fn glu(act: Act, gate: &mut [f32], up: &[f32]) {
    match act {
        // pieces of rows start a multiple of 16 values into their row (ggml's vectors)
        Act::Silu => silu_mul(gate, up),
        Act::Gelu => gelu_mul(gelu_table(), gate, up),
        // ggml_swiglu_oai's alpha and limit, element by element with libm's expf
        Act::SwigluOai => gate.iter_mut().zip(up).for_each(|(g, &u)| {
            const ALPHA: f32 = 1.702;
            const LIMIT: f32 = 7.0;
            let x = if LIMIT < *g { LIMIT } else { *g };
            let y = u.clamp(-LIMIT, LIMIT);
            *g = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
        }),
    }
}

/// ggml's CPU GELU table: inputs in (-10, 10) are looked up by their f16 value, the entries
/// the tanh approximation rounded to f16 (`vec::gelu_mul` reads it), plus a padding entry.
fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        (0..=u16::MAX)
            .map(|h| {
                let x = f16_to_f32(h);
                // `1 + a*x*x` fused into one multiply-add, as ggml's compiler builds it
                let inner = (0.044715 * x).mul_add(x, 1.0);
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh());
                f32_to_f16(y)
            })
            .chain([0])
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threaded_glu_equals_serial() {
        let pool = ThreadPool::new(3);
        for act in [Act::Silu, Act::Gelu] {
            let n = (1 << 14) * 3 + 77;
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.07)
                .collect();
            let u: Vec<f32> = (0..n)
                .map(|i| ((i * 11 % 53) as f32 - 26.0) * 0.05)
                .collect();
            let (mut serial, mut threaded) = (g.clone(), g);
            glu(act, &mut serial, &u);
            glu_threaded(&pool, act, &mut threaded, &u);
            assert_eq!(serial, threaded);
        }
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, -4.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let s = 1.0 / (12.5f32).sqrt();
        assert_eq!(out, [3.0 * s, -8.0 * s]);
    }

    #[test]
    fn rope_rotates_pairs() {
        let cache = rope_cache(
            1,
            4,
            10000.0,
            1.0,
            &Yarn::derive(false, 1.0, 1.0, 4096, &Default::default(), (0.0, false)),
        );
        let mut a = [1.0, 0.0, 1.0, 0.0];
        rope(&mut a, &cache, RopeKind::Norm);
        assert!((a[0] - 1f32.cos()).abs() < 1e-6 && (a[1] - 1f32.sin()).abs() < 1e-6);
        let mut b = [1.0, 1.0, 0.0, 0.0];
        rope(&mut b, &cache, RopeKind::Neox);
        assert!((b[2] - 1f32.sin()).abs() < 1e-6);
        assert!((b[3] - (0.01f32).sin()).abs() < 1e-6);
    }

    #[test]
    fn gelu_matches_tanh_form() {
        let gelu = |x: f32| {
            let mut g = [x];
            gelu_mul(gelu_table(), &mut g, &[1.0]);
            g[0]
        };
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.841_192).abs() < 1e-3);
        assert_eq!(gelu(-12.0), 0.0);
        assert_eq!(gelu(12.0), 12.0);
    }
}
