//! The forward pass with the whole model on one CUDA card: the same blocks as `model.rs` (it
//! loads the same [`Weights`]), each one a kernel launch on the card's stream. The KV cache is
//! f16 on the card, one row per (sequence, position); the host keeps only each sequence's
//! length. Mixture-of-experts layers run the chosen experts' rows directly for decode and group
//! tokens by expert for prompts.

use super::arch::{Act, ArchSpec, Hparams, RopeKind};
use super::model::{Ffn, Weights};
use super::weights::Tensor;
use super::{Batch, EngineError, EngineParams, Forward, SeqId};
use crate::backend::cuda::ops::{self, MAX_EXPERTS, MAX_HEAD_DIM, MMV_MAX};
use crate::backend::cuda::{Buf, Cuda, CudaError, DevBuf, DevMatrix, Graph, RowMove};
use crate::model::GgmlType;

impl From<CudaError> for EngineError {
    fn from(e: CudaError) -> Self {
        EngineError::Load(format!("CUDA: {e}"))
    }
}

enum GpuFfn {
    Dense {
        gate: DevMatrix,
        up: DevMatrix,
        down: DevMatrix,
    },
    Moe {
        router: DevMatrix,
        gate: DevMatrix,
        up: DevMatrix,
        down: DevMatrix,
    },
}

struct GpuLayer {
    attn_norm: DevBuf,
    wq: DevMatrix,
    wk: DevMatrix,
    wv: DevMatrix,
    wo: DevMatrix,
    bq: Option<DevBuf>,
    bk: Option<DevBuf>,
    bv: Option<DevBuf>,
    bo: Option<DevBuf>,
    q_norm: Option<DevBuf>,
    k_norm: Option<DevBuf>,
    post_attn_norm: Option<DevBuf>,
    ffn_norm: DevBuf,
    ffn: GpuFfn,
    post_ffn_norm: Option<DevBuf>,
    swa: bool,
    rope_base: f32,
    rope_scale: f32,
    k_cache: DevBuf,
    v_cache: DevBuf,
}

/// Activations and index buffers for one ubatch, sized once at load.
struct Scratch {
    x: DevBuf,
    cur: DevBuf,
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    attn: DevBuf,
    o: DevBuf,
    gate: DevBuf,
    up: DevBuf,
    ffn: DevBuf,
    router: DevBuf,
    moe_ids: DevBuf,
    moe_w: DevBuf,
    moe_y: DevBuf,
    /// tokens, positions, sequence bases, cells and wanted rows of the ubatch
    ints: DevBuf,
    /// per-expert token and pair lists of a prompt pass, padded to the largest group
    moe_lists: DevBuf,
    logits: DevBuf,
}

/// Rows of logits computed per head product (bounds the logits scratch for large vocabularies).
const LOGIT_ROWS: usize = 64;
/// Runs of at least this many consecutive tokens of one sequence attend through cuBLAS products;
/// shorter ones (decode) through the attention kernel.
const PROMPT_ATTN_MIN: usize = 16;

/// How a stretch of a ubatch attends: a long run of one sequence's consecutive positions through
/// cuBLAS products, or any mix of tokens through the attention kernel (which reads each token's
/// position and sequence from the card, so a decode step's launches do not depend on which
/// sequences it holds and can be replayed as a graph).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Span {
    Prompt {
        start: usize,
        len: usize,
        seq: usize,
        p0: usize,
    },
    Kernel {
        start: usize,
        len: usize,
    },
}

fn spans(seq: &[SeqId], pos: &[u32]) -> Vec<Span> {
    // maximal runs of one sequence at consecutive positions
    let mut runs: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (i, (&s, &p)) in seq.iter().zip(pos).enumerate() {
        match runs.last_mut() {
            Some(r) if r.2 == s as usize && r.3 + r.1 == p as usize => r.1 += 1,
            _ => runs.push((i, 1, s as usize, p as usize)),
        }
    }
    let mut out: Vec<Span> = Vec::new();
    for (start, len, seq, p0) in runs {
        if len >= PROMPT_ATTN_MIN {
            out.push(Span::Prompt {
                start,
                len,
                seq,
                p0,
            });
        } else if let Some(Span::Kernel { len: l, .. }) = out.last_mut() {
            *l += len;
        } else {
            out.push(Span::Kernel { start, len });
        }
    }
    out
}

pub struct GpuModel {
    spec: &'static ArchSpec,
    hp: Hparams,
    n_vocab: usize,
    cuda: Cuda,
    tok_embd: DevMatrix,
    output: Option<DevMatrix>,
    output_norm: DevBuf,
    layers: Vec<GpuLayer>,
    n_ctx_seq: usize,
    seq_len: Vec<u32>,
    n_ubatch: usize,
    s: Scratch,
    host_ints: Vec<i32>,
    /// The layers of a decode step of `n` tokens (index `n - 1`), captured once and replayed.
    graphs: Vec<Option<Graph>>,
}

fn matrix(cuda: &Cuda, t: &Tensor, n_expert: usize) -> Result<DevMatrix, EngineError> {
    let rows: usize = t.shape[1..].iter().product::<usize>() / n_expert;
    cuda.upload_matrix(t.data(), t.ty, t.shape[0], rows, n_expert)
        .map_err(|e| EngineError::Load(format!("{}: {e}", t.name)))
}

fn opt_f32(cuda: &Cuda, v: &Option<Vec<f32>>) -> Result<Option<DevBuf>, EngineError> {
    Ok(match v {
        Some(v) => Some(cuda.upload_f32(v)?),
        None => None,
    })
}

/// Why the card cannot serve these weights with these parameters, if it cannot (checked before
/// any upload).
pub fn unsupported(w: &Weights, hp: &Hparams, params: &EngineParams) -> Option<String> {
    if params.type_k != GgmlType::F16 || params.type_v != GgmlType::F16 {
        return Some(format!(
            "the CUDA engine keeps its KV cache in f16; -ctk {} -ctv {} are not built for it yet",
            params.type_k.name(),
            params.type_v.name()
        ));
    }
    let mut types: Vec<(String, GgmlType)> = vec![("token_embd.weight".into(), w.tok_embd.ty)];
    if let Some(o) = &w.output {
        types.push((o.name.clone(), o.ty));
    }
    for l in &w.layers {
        for t in [&l.wq, &l.wk, &l.wv, &l.wo] {
            types.push((t.name.clone(), t.ty));
        }
        let ffn = match &l.ffn {
            Ffn::Dense { gate, up, down } => [None, Some(gate), Some(up), Some(down)],
            Ffn::Moe {
                router,
                gate,
                up,
                down,
            } => [Some(router), Some(gate), Some(up), Some(down)],
        };
        types.extend(ffn.into_iter().flatten().map(|t| (t.name.clone(), t.ty)));
    }
    if let Some((name, ty)) = types.iter().find(|(_, ty)| !ops::supports(*ty)) {
        return Some(format!(
            "{name} is {}, which has no CUDA kernel yet",
            ty.name()
        ));
    }
    if hp.head_dim_k > MAX_HEAD_DIM || hp.head_dim_v > MAX_HEAD_DIM {
        return Some(format!(
            "head width {} is above the attention kernel's {MAX_HEAD_DIM}",
            hp.head_dim_k.max(hp.head_dim_v)
        ));
    }
    if hp.n_expert > MAX_EXPERTS {
        return Some(format!(
            "{} experts is above the router kernel's {MAX_EXPERTS}",
            hp.n_expert
        ));
    }
    None
}

impl GpuModel {
    pub fn load(
        spec: &'static ArchSpec,
        hp: Hparams,
        w: &Weights,
        params: &EngineParams,
        cuda: Cuda,
    ) -> Result<GpuModel, EngineError> {
        let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
        let (nkv, nv) = (hp.n_head_kv * hk, hp.n_head_kv * hv);
        let cells = params.n_ctx_seq * params.n_seq_max;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let ffn = match &l.ffn {
                Ffn::Dense { gate, up, down } => GpuFfn::Dense {
                    gate: matrix(&cuda, gate, 1)?,
                    up: matrix(&cuda, up, 1)?,
                    down: matrix(&cuda, down, 1)?,
                },
                Ffn::Moe {
                    router,
                    gate,
                    up,
                    down,
                } => GpuFfn::Moe {
                    router: matrix(&cuda, router, 1)?,
                    gate: matrix(&cuda, gate, hp.n_expert)?,
                    up: matrix(&cuda, up, hp.n_expert)?,
                    down: matrix(&cuda, down, hp.n_expert)?,
                },
            };
            layers.push(GpuLayer {
                attn_norm: cuda.upload_f32(&l.attn_norm)?,
                wq: matrix(&cuda, &l.wq, 1)?,
                wk: matrix(&cuda, &l.wk, 1)?,
                wv: matrix(&cuda, &l.wv, 1)?,
                wo: matrix(&cuda, &l.wo, 1)?,
                bq: opt_f32(&cuda, &l.bq)?,
                bk: opt_f32(&cuda, &l.bk)?,
                bv: opt_f32(&cuda, &l.bv)?,
                bo: opt_f32(&cuda, &l.bo)?,
                q_norm: opt_f32(&cuda, &l.q_norm)?,
                k_norm: opt_f32(&cuda, &l.k_norm)?,
                post_attn_norm: opt_f32(&cuda, &l.post_attn_norm)?,
                ffn_norm: cuda.upload_f32(&l.ffn_norm)?,
                ffn,
                post_ffn_norm: opt_f32(&cuda, &l.post_ffn_norm)?,
                swa: l.swa,
                rope_base: l.rope_base,
                rope_scale: l.rope_scale,
                k_cache: cuda.gpu.alloc(cells * nkv * 2)?,
                v_cache: cuda.gpu.alloc(cells * nv * 2)?,
            });
        }
        let nub = params.n_ubatch.max(1);
        let e = hp.n_embd;
        let (nq, na) = (hp.n_head * hk, hp.n_head * hv);
        let k_used = hp.n_expert_used.max(1);
        let ff = (nub * hp.n_ff)
            .max(nub * hp.n_ff_exp)
            .max(MMV_MAX * k_used * hp.n_ff_exp);
        let f = |n: usize| cuda.gpu.alloc(n * 4);
        let s = Scratch {
            x: f(nub * e)?,
            cur: f(nub * e)?,
            q: f(nub * nq)?,
            k: f(nub * nkv)?,
            v: f(nub * nv)?,
            attn: f(nub * na)?,
            o: f(nub * e)?,
            gate: f(ff)?,
            up: f(ff)?,
            ffn: f(nub * e)?,
            router: f(nub * hp.n_expert)?,
            moe_ids: f(nub * k_used)?,
            moe_w: f(nub * k_used)?,
            moe_y: f(nub * k_used * e)?,
            ints: f(5 * nub)?,
            moe_lists: f(2 * hp.n_expert * nub)?,
            logits: f(LOGIT_ROWS * w.n_vocab)?,
        };
        let model = GpuModel {
            spec,
            n_vocab: w.n_vocab,
            tok_embd: matrix(&cuda, &w.tok_embd, 1)?,
            output: match &w.output {
                Some(t) => Some(matrix(&cuda, t, 1)?),
                None => None,
            },
            output_norm: cuda.upload_f32(&w.output_norm)?,
            layers,
            n_ctx_seq: params.n_ctx_seq,
            seq_len: vec![0; params.n_seq_max],
            n_ubatch: nub,
            s,
            host_ints: Vec::new(),
            graphs: (0..MMV_MAX).map(|_| None).collect(),
            hp,
            cuda,
        };
        model.cuda.gpu.sync()?;
        Ok(model)
    }

    /// Refuses a batch before anything runs: its shape, and positions that must continue each
    /// sequence without a gap inside its context.
    fn check(&self, batch: &Batch) -> Result<(), EngineError> {
        batch.check_shape(self.n_vocab, self.seq_len.len())?;
        let mut len = self.seq_len.clone();
        for i in 0..batch.len() {
            let (s, p) = (batch.seq[i] as usize, batch.pos[i]);
            if p as usize >= self.n_ctx_seq {
                return Err(EngineError::NoSpace {
                    seq: s as SeqId,
                    needed: p as usize + 1,
                    capacity: self.n_ctx_seq,
                });
            }
            if p > len[s] {
                return Err(EngineError::BadBatch(format!(
                    "position {p} of sequence {s} at entry {i} leaves a gap after {}",
                    len[s]
                )));
            }
            len[s] = len[s].max(p + 1);
        }
        Ok(())
    }

    fn ubatch(
        &mut self,
        batch: &Batch,
        r: std::ops::Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), CudaError> {
        let n = r.len();
        let e = self.hp.n_embd;
        let ints = &mut self.host_ints;
        ints.clear();
        ints.extend(batch.tokens[r.clone()].iter().map(|&t| t as i32));
        ints.extend(batch.pos[r.clone()].iter().map(|&p| p as i32));
        ints.extend(
            batch.seq[r.clone()]
                .iter()
                .map(|&s| (s as usize * self.n_ctx_seq) as i32),
        );
        for i in r.clone() {
            ints.push((batch.seq[i] as usize * self.n_ctx_seq) as i32 + batch.pos[i] as i32);
        }
        let wanted: Vec<usize> = (0..n).filter(|&i| batch.logits[r.start + i]).collect();
        ints.extend(wanted.iter().map(|&i| i as i32));
        self.cuda.gpu.upload(self.s.ints.ptr(), ints)?;
        let spans = spans(&batch.seq[r.clone()], &batch.pos[r.clone()]);
        if n <= MMV_MAX {
            // a decode step: no host round trip inside, so the layers replay as one graph
            if self.graphs[n - 1].is_none() {
                self.cuda.gpu.begin_capture()?;
                let recorded = self.layers(n, &spans);
                let graph = self.cuda.gpu.end_capture();
                recorded?;
                self.graphs[n - 1] = Some(graph?);
            }
            if let Some(g) = &self.graphs[n - 1] {
                g.launch()?;
            }
        } else {
            self.layers(n, &spans)?;
        }
        let (c, s, hp) = (&mut self.cuda, &self.s, &self.hp);
        if wanted.is_empty() {
            return c.gpu.sync();
        }
        let head = self.output.as_ref().unwrap_or(&self.tok_embd);
        let nw = wanted.len();
        c.move_rows(
            RowMove::Gather,
            s.x.ptr(),
            s.ints.at(4 * 4 * n),
            s.cur.ptr(),
            e,
            nw,
        )?;
        c.rms_norm(
            s.cur.ptr(),
            self.output_norm.ptr(),
            s.cur.ptr(),
            nw,
            e,
            hp.eps,
        )?;
        let start = out.len();
        out.resize(start + nw * self.n_vocab, 0.0);
        for chunk in (0..nw).step_by(LOGIT_ROWS) {
            let m = (nw - chunk).min(LOGIT_ROWS);
            c.matmul(head, 0, s.cur.at(4 * chunk * e), m, s.logits.ptr())?;
            if let Some(cap) = hp.final_softcap {
                c.softcap(s.logits.ptr(), cap, m * self.n_vocab)?;
            }
            let dst = &mut out[start + chunk * self.n_vocab..start + (chunk + m) * self.n_vocab];
            c.gpu.download(dst, s.logits.ptr())?;
        }
        Ok(())
    }

    /// The embeddings and every layer of the `n` tokens whose indices are in `s.ints`, leaving
    /// the final hidden states in `s.x`.
    fn layers(&mut self, n: usize, spans: &[Span]) -> Result<(), CudaError> {
        let (c, s, hp) = (&mut self.cuda, &self.s, &self.hp);
        let e = hp.n_embd;
        let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
        let (nq, nkv, nv, na) = (
            hp.n_head * hk,
            hp.n_head_kv * hk,
            hp.n_head_kv * hv,
            hp.n_head * hv,
        );
        let at = |k: usize| s.ints.at(4 * k * n);
        let (tokens, pos, base, cells) = (at(0), at(1), at(2), at(3));
        c.get_rows(&self.tok_embd, tokens, n, s.x.ptr())?;
        if self.spec.embd_scale {
            c.scale(s.x.ptr(), (e as f32).sqrt(), n * e)?;
        }
        let neox = self.spec.rope == RopeKind::Neox;
        let q_scale = 1.0 / (hk as f32).sqrt();
        let gelu = self.spec.act == Act::Gelu;
        for l in &self.layers {
            c.rms_norm(s.x.ptr(), l.attn_norm.ptr(), s.cur.ptr(), n, e, hp.eps)?;
            c.matmul(&l.wq, 0, s.cur.ptr(), n, s.q.ptr())?;
            c.matmul(&l.wk, 0, s.cur.ptr(), n, s.k.ptr())?;
            c.matmul(&l.wv, 0, s.cur.ptr(), n, s.v.ptr())?;
            for (x, b, width) in [(&s.q, &l.bq, nq), (&s.k, &l.bk, nkv), (&s.v, &l.bv, nv)] {
                if let Some(b) = b {
                    c.add_bias(x.ptr(), b.ptr(), width, n * width)?;
                }
            }
            if let Some(w) = &l.q_norm {
                c.rms_norm(s.q.ptr(), w.ptr(), s.q.ptr(), n * hp.n_head, hk, hp.eps)?;
            }
            if let Some(w) = &l.k_norm {
                c.rms_norm(s.k.ptr(), w.ptr(), s.k.ptr(), n * hp.n_head_kv, hk, hp.eps)?;
            }
            for (x, heads) in [(&s.q, hp.n_head), (&s.k, hp.n_head_kv)] {
                c.rope(
                    x.ptr(),
                    pos,
                    n,
                    heads,
                    hk,
                    hp.n_rot,
                    l.rope_base,
                    l.rope_scale,
                    neox,
                )?;
            }
            let kq_scale = if self.spec.scale_q {
                c.scale(s.q.ptr(), q_scale, n * nq)?;
                1.0
            } else {
                q_scale
            };
            c.kv_store(s.k.ptr(), l.k_cache.ptr(), cells, nkv, n)?;
            c.kv_store(s.v.ptr(), l.v_cache.ptr(), cells, nv, n)?;
            let n_swa = if l.swa { hp.n_swa } else { 0 };
            for &span in spans {
                match span {
                    Span::Prompt {
                        start,
                        len,
                        seq,
                        p0,
                    } => c.attention_prompt(
                        s.q.at(4 * start * nq),
                        l.k_cache.ptr(),
                        l.v_cache.ptr(),
                        s.attn.at(4 * start * na),
                        seq * self.n_ctx_seq,
                        p0,
                        len,
                        (hp.n_head, hp.n_head_kv),
                        (hk, hv),
                        kq_scale,
                        n_swa,
                    )?,
                    Span::Kernel { start, len } => c.attention(
                        s.q.at(4 * start * nq),
                        l.k_cache.ptr(),
                        l.v_cache.ptr(),
                        base + 4 * start as u64,
                        pos + 4 * start as u64,
                        s.attn.at(4 * start * na),
                        len,
                        (hp.n_head, hp.n_head_kv),
                        (hk, hv),
                        kq_scale,
                        n_swa,
                    )?,
                }
            }
            c.matmul(&l.wo, 0, s.attn.ptr(), n, s.o.ptr())?;
            if let Some(b) = &l.bo {
                c.add_bias(s.o.ptr(), b.ptr(), e, n * e)?;
            }
            if let Some(w) = &l.post_attn_norm {
                c.rms_norm(s.o.ptr(), w.ptr(), s.o.ptr(), n, e, hp.eps)?;
            }
            c.add(s.x.ptr(), s.o.ptr(), n * e)?;
            c.rms_norm(s.x.ptr(), l.ffn_norm.ptr(), s.cur.ptr(), n, e, hp.eps)?;
            match &l.ffn {
                GpuFfn::Dense { gate, up, down } => {
                    c.matmul(gate, 0, s.cur.ptr(), n, s.gate.ptr())?;
                    c.matmul(up, 0, s.cur.ptr(), n, s.up.ptr())?;
                    c.glu(s.gate.ptr(), s.up.ptr(), n * hp.n_ff, gelu)?;
                    c.matmul(down, 0, s.gate.ptr(), n, s.ffn.ptr())?;
                }
                GpuFfn::Moe {
                    router,
                    gate,
                    up,
                    down,
                } => moe(
                    c,
                    hp,
                    gelu,
                    [router, gate, up, down],
                    s,
                    n,
                    &mut self.host_ints,
                )?,
            }
            if let Some(w) = &l.post_ffn_norm {
                c.rms_norm(s.ffn.ptr(), w.ptr(), s.ffn.ptr(), n, e, hp.eps)?;
            }
            c.add(s.x.ptr(), s.ffn.ptr(), n * e)?;
        }
        Ok(())
    }
}

/// The mixture-of-experts FFN of `n` tokens in `s.cur` into `s.ffn`.
fn moe(
    c: &mut Cuda,
    hp: &Hparams,
    gelu: bool,
    [router, gate, up, down]: [&DevMatrix; 4],
    s: &Scratch,
    n: usize,
    host: &mut Vec<i32>,
) -> Result<(), CudaError> {
    let (ne, k, nf, e) = (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_embd);
    c.matmul(router, 0, s.cur.ptr(), n, s.router.ptr())?;
    let (ids, w) = (s.moe_ids.ptr(), s.moe_w.ptr());
    c.route(
        s.router.ptr(),
        n,
        ne,
        k,
        hp.expert_norm,
        hp.expert_scale,
        ids,
        w,
    )?;
    if n <= MMV_MAX {
        // decode: each (token, slot) pair reads only its expert's rows
        c.matmul_id(gate, ids, s.cur.ptr(), k, n * k, s.gate.ptr())?;
        c.matmul_id(up, ids, s.cur.ptr(), k, n * k, s.up.ptr())?;
        c.glu(s.gate.ptr(), s.up.ptr(), n * k * nf, gelu)?;
        c.matmul_id(down, ids, s.gate.ptr(), 1, n * k, s.moe_y.ptr())?;
        return c.moe_combine(s.moe_y.ptr(), w, s.ffn.ptr(), n, k, e);
    }
    // prompt: each expert's tokens gathered into a group padded to the largest group, and all
    // groups multiplied in one batched product per matrix
    let mut chosen = vec![0i32; n * k];
    c.gpu.download(&mut chosen, ids)?;
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); ne];
    for (p, &x) in chosen.iter().enumerate() {
        by_expert[x as usize].push(p);
    }
    let m = by_expert.iter().map(Vec::len).max().unwrap_or(0);
    host.clear();
    host.resize(2 * ne * m, -1);
    for (x, pairs) in by_expert.iter().enumerate() {
        for (j, &p) in pairs.iter().enumerate() {
            host[x * m + j] = (p / k) as i32;
            host[ne * m + x * m + j] = p as i32;
        }
    }
    let (tok_lists, pair_lists) = (s.moe_lists.ptr(), s.moe_lists.at(4 * ne * m));
    c.gpu.upload(tok_lists, host)?;
    let rows = ne * m;
    let x16 = c.buf(Buf::X16, rows * e * 2)?;
    c.move_rows(RowMove::GatherF16, s.cur.ptr(), tok_lists, x16, e, rows)?;
    let g = c.buf(Buf::MoeGate, rows * nf * 4)?;
    let u = c.buf(Buf::MoeUp, rows * nf * 4)?;
    c.matmul_experts(gate, x16, m, g)?;
    c.matmul_experts(up, x16, m, u)?;
    c.glu(g, u, rows * nf, gelu)?;
    let g16 = c.buf(Buf::X16, rows * nf * 2)?;
    c.to_f16(g, g16, rows * nf)?;
    let y = c.buf(Buf::MoeOut, rows * e * 4)?;
    c.matmul_experts(down, g16, m, y)?;
    c.move_rows(RowMove::Scatter, y, pair_lists, s.moe_y.ptr(), e, rows)?;
    c.moe_combine(s.moe_y.ptr(), w, s.ffn.ptr(), n, k, e)
}

impl Forward for GpuModel {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn n_ctx_seq(&self) -> usize {
        self.n_ctx_seq
    }

    fn decode(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.check(batch)?;
        self.cuda
            .gpu
            .bind()
            .map_err(|e| EngineError::BadBatch(format!("CUDA: {e}")))?;
        for i in 0..batch.len() {
            let s = batch.seq[i] as usize;
            self.seq_len[s] = self.seq_len[s].max(batch.pos[i] + 1);
        }
        let mut start = 0;
        while start < batch.len() {
            let end = (start + self.n_ubatch).min(batch.len());
            self.ubatch(batch, start..end, out)
                .map_err(|e| EngineError::BadBatch(format!("CUDA step failed: {e}")))?;
            start = end;
        }
        Ok(())
    }

    fn seq_rm(&mut self, seq: SeqId, p0: u32, p1: Option<u32>) {
        // positions are rows, so removing a middle range would leave a gap: everything from p0
        // on goes (the server only ever truncates, with p1 = None)
        let _ = p1;
        if let Some(len) = self.seq_len.get_mut(seq as usize) {
            *len = (*len).min(p0);
        }
    }

    fn seq_cp(&mut self, src: SeqId, dst: SeqId, n: u32) {
        let (src, dst) = (src as usize, dst as usize);
        if src >= self.seq_len.len() || dst >= self.seq_len.len() || src == dst {
            return;
        }
        let n = n.min(self.seq_len[src]) as usize;
        if let Err(e) = self.cuda.gpu.bind() {
            log::error!("copying the KV cache of sequence {src} to {dst}: {e}");
            return;
        }
        let hp = &self.hp;
        let (kw, vw) = (
            hp.n_head_kv * hp.head_dim_k * 2,
            hp.n_head_kv * hp.head_dim_v * 2,
        );
        for l in &self.layers {
            for (buf, w) in [(&l.k_cache, kw), (&l.v_cache, vw)] {
                let (from, to) = (
                    buf.at(src * self.n_ctx_seq * w),
                    buf.at(dst * self.n_ctx_seq * w),
                );
                if let Err(e) = self.cuda.gpu.copy(to, from, n * w) {
                    log::error!("copying the KV cache of sequence {src} to {dst}: {e}");
                    self.seq_len[dst] = 0;
                    return;
                }
            }
        }
        self.seq_len[dst] = n as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_attend_through_products_and_the_rest_through_the_kernel() {
        // a 20-token prompt chunk of sequence 1 between decode tokens of sequences 0 and 2
        let mut seq = vec![0u32];
        let mut pos = vec![7u32];
        seq.extend([1; 20]);
        pos.extend(30..50);
        seq.extend([2, 0]);
        pos.extend([3, 8]);
        assert_eq!(
            spans(&seq, &pos),
            vec![
                Span::Kernel { start: 0, len: 1 },
                Span::Prompt {
                    start: 1,
                    len: 20,
                    seq: 1,
                    p0: 30
                },
                Span::Kernel { start: 21, len: 2 },
            ]
        );
        // a decode step is one kernel stretch whatever sequences it holds
        assert_eq!(
            spans(&[0, 1, 0], &[5, 9, 6]),
            vec![Span::Kernel { start: 0, len: 3 }]
        );
        // a position gap ends a run
        let (seq, pos): (Vec<u32>, Vec<u32>) = (0..32).map(|i| (0, i + (i / 16) * 5)).unzip();
        assert_eq!(spans(&seq, &pos).len(), 2);
    }
}
