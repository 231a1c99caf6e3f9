//! Causal attention over the KV cache for a ubatch of tokens from any number of sequences, each
//! query seeing only its own sequence's cells at positions up to its own (and within the sliding
//! window on SWA layers). The arithmetic follows ggml's CPU flash attention, which upstream's
//! server uses by default, because its f16 rounding moves logits enough to change greedy tokens:
//! for small ubatches Q is converted to the K type and the V accumulator is kept in f16; ubatches
//! of 64 tokens or more take ggml's tiled path (f32, tiles of 64 queries by 64 cells, one softmax
//! step per tile); a one-token step over a view of 512 cells or more takes ggml's split path
//! (the cells divided among the threads, their partial sums combined).

use super::kv::KvCache;
use super::SeqId;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::backend::cpu::dot::kernel;
use crate::backend::cpu::fa::{gemm_acc, soft_max_row};
use crate::backend::cpu::pool::{SyncPtr, ThreadPool};
use crate::backend::cpu::quant::{act_row_bytes, quantize_act};
use crate::backend::cpu::vec::{f16_to_f32_slice, mad_f16, scale_f16};
use crate::model::quants::{dequantize, f16_to_f32, vec_dot_type};
use crate::model::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMode {
    /// ggml's one-chunk kernel: Q in the K cache type, f16 V accumulator when V is f16.
    HalfAccum,
    /// ggml's tiled kernel: everything in f32 (ubatches of 64 tokens or more, F16/F32 cache).
    Exact,
}

pub struct AttnShape<'a> {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplies each score.
    pub scale: f32,
    /// Sliding window (0: none): keys at `p - n_swa` or earlier are hidden from position `p`.
    pub n_swa: u32,
    /// Per query head, a logit the softmax counts beside the cells' (gpt-oss's sinks).
    pub sinks: Option<&'a [f32]>,
    pub mode: AttnMode,
    /// Cells upstream's graph attends over in a one-token step (`KvCache::n_kv_view`), 0 for
    /// other steps: 512 or more takes ggml's split decode path.
    pub n_kv_view: usize,
}

/// ggml's tile sizes (`GGML_FA_TILE_Q`, `GGML_FA_TILE_KV`).
const TILE_Q: usize = 64;
const TILE_KV: usize = 64;
/// ggml splits a one-token step's cells among its threads from this view length on.
const SPLIT_MIN_VIEW: usize = 512;

/// `out[i][h]` = attention of query head `h` of token `i` (at `pos[i]` in `seqs[i]`) over layer
/// `il` of the cache. `q` holds `n x n_head x head_dim_k` floats.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    pool: &ThreadPool,
    kv: &KvCache,
    il: usize,
    shape: &AttnShape,
    seqs: &[SeqId],
    pos: &[u32],
    q: &[f32],
    out: &mut [f32],
) {
    let plain = kv.type_k == kv.type_v && matches!(kv.type_k, GgmlType::F16 | GgmlType::F32);
    if shape.mode == AttnMode::Exact && plain {
        return attend_tiled(pool, kv, il, shape, seqs, pos, q, out);
    }
    if seqs.len() == 1 && plain && shape.n_kv_view >= SPLIT_MIN_VIEW {
        return attend_split(pool, kv, il, shape, (seqs[0], pos[0]), q, out);
    }
    let n_items = seqs.len() * shape.n_head;
    let out = SyncPtr::new(out.as_mut_ptr());
    for_each_item(pool, n_items, Scratch::default, |sc, item| {
        let (i, h) = (item / shape.n_head, item % shape.n_head);
        let hq = &q[item * shape.head_dim_k..(item + 1) * shape.head_dim_k];
        // SAFETY: each item writes its own head_dim_v floats of `out`.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out.get().add(item * shape.head_dim_v), shape.head_dim_v)
        };
        let n_cells = kv.len(seqs[i]);
        let (m, s) = one_head(kv, il, shape, (seqs[i], pos[i], h), hq, 0..n_cells, sc);
        let (_, s) = apply_sink(shape, h, (m, s), &mut sc.acc32);
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        dst.iter_mut()
            .zip(&sc.acc32)
            .for_each(|(d, &a)| *d = a * inv);
    });
}

/// ggml's sink step after a head's cells: the sink's logit joins the running maximum and sum as
/// one more score whose value row is zero. Returns the new `(M, S)`.
fn apply_sink(shape: &AttnShape, h: usize, (m, s): (f32, f32), acc: &mut [f32]) -> (f32, f32) {
    let Some(sinks) = shape.sinks else {
        return (m, s);
    };
    let sink = sinks[h];
    let (mut ms, mut vs) = (1.0f32, 1.0f32);
    let mut m = m;
    if sink > m {
        ms = (m - sink).exp();
        m = sink;
        acc.iter_mut().for_each(|a| *a *= ms);
    } else {
        vs = (sink - m).exp();
    }
    // fused, as `S = S*ms + vs` in the cell loop
    (m, s.mul_add(ms, vs))
}

/// Runs `f(scratch, item)` for items `0..n` on the pool's threads, each taking the next item
/// as it finishes one (the items' costs differ: later queries see more cells), last items
/// first.
fn for_each_item<S, I, F>(pool: &ThreadPool, n: usize, init: I, f: F)
where
    I: Fn() -> S + Sync,
    F: Fn(&mut S, usize) + Sync,
{
    let next = AtomicUsize::new(0);
    pool.run(|_, _| {
        let mut scratch = init();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= n {
                break;
            }
            f(&mut scratch, n - 1 - k);
        }
    });
}

/// A cache buffer of `ty` values as floats.
fn to_f32(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0f32; bytes.len() / ty.type_size() * ty.block_size()];
    if ty == GgmlType::F16 {
        f16_to_f32_slice(bytes, &mut out);
    } else {
        dequantize(ty, bytes, &mut out).expect("cache types are checked at load");
    }
    out
}

#[derive(Default)]
struct Scratch {
    q_conv: Vec<u8>,
    acc16: Vec<u16>,
    /// The head's unnormalized output after [`one_head`].
    acc32: Vec<f32>,
    v32: Vec<f32>,
}

/// ggml's one-chunk kernel for query head `h` of the token at `p` in `seq` over the cells
/// `cells` of its sequence: leaves the unnormalized output in `sc.acc32` and returns the running
/// maximum and sum `(M, S)`.
fn one_head(
    kv: &KvCache,
    il: usize,
    shape: &AttnShape,
    (seq, p, h): (SeqId, u32, usize),
    hq: &[f32],
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
) -> (f32, f32) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let kvh = h / (shape.n_head / shape.n_head_kv);
    sc.acc32.clear();
    sc.acc32.resize(dv, 0.0);
    let Some(cells) = kv.seq(seq) else {
        return (f32::NEG_INFINITY, 0.0);
    };
    let kb = kv.k_row / shape.n_head_kv;
    let vb = kv.v_row / shape.n_head_kv;
    let k_rows = &cells.k[il];
    let (v_rows, v_stride) = kv.v_rows(cells, il);
    let half_v = kv.type_v == GgmlType::F16;
    let q_ty = vec_dot_type(kv.type_k);
    let kdot = kernel(kv.type_k).expect("cache types are checked at load");
    sc.q_conv.resize(act_row_bytes(q_ty, dk), 0);
    quantize_act(q_ty, hq, &mut sc.q_conv);
    if half_v {
        sc.acc16.clear();
        sc.acc16.resize(dv, 0);
    }
    sc.v32.resize(dv, 0.0);
    let mut sum = 0.0f32;
    let mut max = f32::NEG_INFINITY;
    for c in range {
        let cp = cells.pos[c];
        if cp > p || (shape.n_swa > 0 && p - cp >= shape.n_swa) {
            continue;
        }
        let krow = &k_rows[c * kv.k_row + kvh * kb..c * kv.k_row + (kvh + 1) * kb];
        let s = kdot(dk, krow, &sc.q_conv) * shape.scale;
        let vrow = &v_rows[c * v_stride + kvh * vb..c * v_stride + (kvh + 1) * vb];
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > max {
            let old = max;
            max = s;
            ms = (old - max).exp();
            if half_v {
                scale_f16(&mut sc.acc16, ms);
            } else {
                sc.acc32.iter_mut().for_each(|a| *a *= ms);
            }
        } else {
            vs = (s - max).exp();
        }
        if half_v {
            mad_f16(&mut sc.acc16, vrow, vs);
        } else {
            dequantize(kv.type_v, vrow, &mut sc.v32).expect("cache types are checked at load");
            // ggml_vec_mad_f32: a multiply-add per element
            sc.acc32
                .iter_mut()
                .zip(&sc.v32)
                .for_each(|(a, &v)| *a = v.mul_add(vs, *a));
        }
        // fused, as ggml's compiler builds `S = S*ms + vs`
        sum = sum.mul_add(ms, vs);
    }
    if half_v {
        for (d, &a) in sc.acc32.iter_mut().zip(&sc.acc16) {
            *d = f16_to_f32(a);
        }
    }
    (max, sum)
}

/// ggml's split decode path: the view's cells in `nth` equal chunks (the pool's threads), each
/// chunk's partial `(M, S, output)` from the one-chunk kernel, then combined in chunk order.
fn attend_split(
    pool: &ThreadPool,
    kv: &KvCache,
    il: usize,
    shape: &AttnShape,
    (seq, p): (SeqId, u32),
    q: &[f32],
    out: &mut [f32],
) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let nth = pool.n_threads();
    let view = shape.n_kv_view;
    let chunk = view.div_ceil(nth);
    let n_cells = kv.len(seq);
    // each (head, chunk) item's running maximum and sum, and its unnormalized output
    let n_items = shape.n_head * nth;
    let mut ms = vec![(f32::NEG_INFINITY, 0.0f32); n_items];
    let mut vkqs = vec![0.0f32; n_items * dv];
    let (msp, vkqp) = (
        SyncPtr::new(ms.as_mut_ptr()),
        SyncPtr::new(vkqs.as_mut_ptr()),
    );
    for_each_item(pool, n_items, Scratch::default, |sc, item| {
        let (h, c) = (item / nth, item % nth);
        let (start, end) = ((c * chunk).min(n_cells), ((c + 1) * chunk).min(n_cells));
        let hq = &q[h * dk..(h + 1) * dk];
        let mut ms_item = one_head(kv, il, shape, (seq, p, h), hq, start..end, sc);
        // ggml applies the sink in the first chunk only
        if c == 0 {
            ms_item = apply_sink(shape, h, ms_item, &mut sc.acc32);
        }
        // SAFETY: each item writes only its own entry of `ms` and its dv floats of `vkqs`.
        unsafe {
            *msp.get().add(item) = ms_item;
            std::ptr::copy_nonoverlapping(sc.acc32.as_ptr(), vkqp.get().add(item * dv), dv);
        }
    });
    for h in 0..shape.n_head {
        let dst = &mut out[h * dv..(h + 1) * dv];
        dst.fill(0.0);
        let (mut m_fin, mut s_fin) = (f32::NEG_INFINITY, 0.0f32);
        for c in 0..nth {
            if c * chunk >= view {
                continue;
            }
            let (m, s) = ms[h * nth + c];
            if s == 0.0 {
                continue;
            }
            let vkq = &vkqs[(h * nth + c) * dv..(h * nth + c + 1) * dv];
            let m_new = m_fin.max(m);
            let (so, sn) = ((m_fin - m_new).exp(), (m - m_new).exp());
            // as ggml's compiler builds `a*so + b*sn`: the first product fused
            dst.iter_mut()
                .zip(vkq)
                .for_each(|(d, &v)| *d = d.mul_add(so, v * sn));
            s_fin = s_fin.mul_add(so, s * sn);
            m_fin = m_new;
        }
        if s_fin != 0.0 {
            let inv = 1.0 / s_fin;
            dst.iter_mut().for_each(|d| *d *= inv);
        }
    }
}

/// One sequence's cache rows for the tiled path, as floats: K transposed per KV head and tile
/// (`[kv head][tile][dim][64 cells]`, zero-padded), V as stored (`[cell][kv heads x dim]`).
struct TiledRows {
    seq: SeqId,
    /// The batch's tokens of this sequence, in batch order.
    tokens: Vec<usize>,
    n_cells: usize,
    kt: Vec<f32>,
    v: Vec<f32>,
}

#[derive(Default)]
struct TileScratch {
    q: Vec<f32>,
    kq: Vec<f32>,
    vkq: Vec<f32>,
    visible: Vec<bool>,
}

/// ggml's tiled flash attention (`ggml_compute_forward_flash_attn_ext_tiled`): per query, tiles
/// of 64 cells; each tile's scores as one multiply-add chain over the head's dimensions, scaled,
/// masked, then one online-softmax step per tile (the tile's maximum, ggml's `exp` and sums) and
/// the values as one chain over the tile's cells.
#[allow(clippy::too_many_arguments)]
fn attend_tiled(
    pool: &ThreadPool,
    kv: &KvCache,
    il: usize,
    shape: &AttnShape,
    seqs: &[SeqId],
    pos: &[u32],
    q: &[f32],
    out: &mut [f32],
) {
    let (dk, dv, nkvh) = (shape.head_dim_k, shape.head_dim_v, shape.n_head_kv);
    let mut groups: Vec<TiledRows> = Vec::new();
    for (i, &s) in seqs.iter().enumerate() {
        match groups.iter_mut().find(|g| g.seq == s) {
            Some(g) => g.tokens.push(i),
            None => groups.push(TiledRows {
                seq: s,
                tokens: vec![i],
                n_cells: 0,
                kt: Vec::new(),
                v: Vec::new(),
            }),
        }
    }
    for g in &mut groups {
        let Some(cells) = kv.seq(g.seq) else { continue };
        let n = cells.pos.len();
        g.n_cells = n;
        let k = to_f32(kv.type_k, &cells.k[il][..n * kv.k_row]);
        let (v_rows, v_stride) = kv.v_rows(cells, il);
        g.v = if v_stride == kv.v_row {
            to_f32(kv.type_v, &v_rows[..n * kv.v_row])
        } else {
            let rows: Vec<u8> = (0..n)
                .flat_map(|c| &v_rows[c * v_stride..c * v_stride + kv.v_row])
                .copied()
                .collect();
            to_f32(kv.type_v, &rows)
        };
        let n_tiles = n.div_ceil(TILE_KV);
        g.kt = vec![0.0; nkvh * n_tiles * dk * TILE_KV];
        for h in 0..nkvh {
            for c in 0..n {
                let (t, tk) = (c / TILE_KV, c % TILE_KV);
                let base = (h * n_tiles + t) * dk * TILE_KV + tk;
                let row = &k[c * nkvh * dk + h * dk..c * nkvh * dk + (h + 1) * dk];
                for (d, &x) in row.iter().enumerate() {
                    g.kt[base + d * TILE_KV] = x;
                }
            }
        }
    }
    // items: (group, head, first token of the query tile)
    let mut items: Vec<(usize, usize, usize)> = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for h in 0..shape.n_head {
            for t0 in (0..g.tokens.len()).step_by(TILE_Q) {
                items.push((gi, h, t0));
            }
        }
    }
    items.sort_by_key(|&(gi, h, t0)| (t0, gi, h));
    let out = SyncPtr::new(out.as_mut_ptr());
    let cells_of = |g: &TiledRows| kv.seq(g.seq).map(|c| &c.pos[..]).unwrap_or(&[]);
    for_each_item(pool, items.len(), TileScratch::default, |sc, k| {
        let (gi, h, t0) = items[k];
        let g = &groups[gi];
        let toks = &g.tokens[t0..(t0 + TILE_Q).min(g.tokens.len())];
        let rows = toks.len();
        let kvh = h / (shape.n_head / nkvh);
        let cpos = cells_of(g);
        sc.q.clear();
        for &i in toks {
            let at = (i * shape.n_head + h) * dk;
            sc.q.extend_from_slice(&q[at..at + dk]);
        }
        sc.vkq.clear();
        sc.vkq.resize(rows * dv, 0.0);
        sc.kq.resize(rows * TILE_KV, 0.0);
        sc.visible.resize(rows * TILE_KV, false);
        let mut m = [f32::NEG_INFINITY; TILE_Q];
        let mut s = [0.0f32; TILE_Q];
        let n_tiles = g.n_cells.div_ceil(TILE_KV);
        for t in 0..n_tiles {
            let (c0, c1) = (t * TILE_KV, ((t + 1) * TILE_KV).min(g.n_cells));
            let mut any = false;
            for (r, &i) in toks.iter().enumerate() {
                let p = pos[i];
                for tk in 0..TILE_KV {
                    let c = c0 + tk;
                    let vis = c < c1 && {
                        let cp = cpos[c];
                        cp <= p && (shape.n_swa == 0 || p - cp < shape.n_swa)
                    };
                    sc.visible[r * TILE_KV + tk] = vis;
                    any |= vis;
                }
            }
            if !any {
                continue;
            }
            sc.kq.fill(0.0);
            let kt =
                &g.kt[(kvh * n_tiles + t) * dk * TILE_KV..(kvh * n_tiles + t + 1) * dk * TILE_KV];
            gemm_acc(
                &mut sc.kq,
                TILE_KV,
                &sc.q,
                dk,
                kt,
                TILE_KV,
                (rows, dk, TILE_KV),
            );
            for r in 0..rows {
                let row = &mut sc.kq[r * TILE_KV..(r + 1) * TILE_KV];
                let vis = &sc.visible[r * TILE_KV..(r + 1) * TILE_KV];
                for (x, &v) in row.iter_mut().zip(vis) {
                    *x = if v {
                        *x * shape.scale
                    } else {
                        f32::NEG_INFINITY
                    };
                }
                let tile_max = row
                    .iter()
                    .fold(f32::NEG_INFINITY, |a, &x| if a > x { a } else { x });
                if tile_max == f32::NEG_INFINITY {
                    row.fill(0.0);
                    continue;
                }
                let m_new = m[r].max(tile_max);
                if m_new > m[r] {
                    let ms = (m[r] - m_new).exp();
                    sc.vkq[r * dv..(r + 1) * dv]
                        .iter_mut()
                        .for_each(|x| *x *= ms);
                    s[r] *= ms;
                }
                m[r] = m_new;
                s[r] = (s[r] as f64 + soft_max_row(row, m_new)) as f32;
            }
            let vt = &g.v[c0 * nkvh * dv + kvh * dv..];
            gemm_acc(
                &mut sc.vkq,
                dv,
                &sc.kq,
                TILE_KV,
                vt,
                nkvh * dv,
                (rows, c1 - c0, dv),
            );
        }
        for r in 0..rows {
            let acc = &mut sc.vkq[r * dv..(r + 1) * dv];
            (m[r], s[r]) = apply_sink(shape, h, (m[r], s[r]), acc);
        }
        for (r, &i) in toks.iter().enumerate() {
            let inv = if s[r] == 0.0 { 0.0 } else { 1.0 / s[r] };
            let item = i * shape.n_head + h;
            // SAFETY: each (token, head) is written by the one item that holds it.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(item * dv), dv) };
            for (d, &a) in dst.iter_mut().zip(&sc.vkq[r * dv..(r + 1) * dv]) {
                *d = a * inv;
            }
        }
    });
}
