//! Causal attention over the KV cache for a ubatch of tokens from any number of sequences, each
//! query seeing only its own sequence's cells at positions up to its own (and within the sliding
//! window on SWA layers). The arithmetic follows ggml's CPU flash attention, which upstream's
//! server uses by default, because its f16 rounding moves logits enough to change greedy tokens:
//! for small ubatches Q is converted to the K type and the V accumulator is kept in f16; ubatches
//! of 64 tokens or more (ggml's tiled path) work in f32.

use super::kv::KvCache;
use super::SeqId;
use crate::backend::cpu::dot::kernel;
use crate::backend::cpu::pool::{split_range, SyncPtr, ThreadPool};
use crate::backend::cpu::quant::{act_row_bytes, quantize_act};
use crate::backend::cpu::vec::{mad_f16, scale_f16};
use crate::model::quants::{dequantize, f16_to_f32, vec_dot_type};
use crate::model::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMode {
    /// ggml's one-chunk kernel: Q in the K cache type, f16 V accumulator when V is f16.
    HalfAccum,
    /// ggml's tiled kernel: everything in f32.
    Exact,
}

pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplies each score.
    pub scale: f32,
    /// Sliding window (0: none): keys at `p - n_swa` or earlier are hidden from position `p`.
    pub n_swa: u32,
    pub mode: AttnMode,
}

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
    let n_items = seqs.len() * shape.n_head;
    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(|ith, nth| {
        let (a, b) = split_range(n_items, ith, nth, 1);
        let mut scratch = Scratch::default();
        for item in a..b {
            let (i, h) = (item / shape.n_head, item % shape.n_head);
            let hq = &q[item * shape.head_dim_k..(item + 1) * shape.head_dim_k];
            // SAFETY: each item writes its own head_dim_v floats of `out`.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    out.get().add(item * shape.head_dim_v),
                    shape.head_dim_v,
                )
            };
            one_head(kv, il, shape, seqs[i], pos[i], h, hq, dst, &mut scratch);
        }
    });
}

#[derive(Default)]
struct Scratch {
    q_conv: Vec<u8>,
    k32: Vec<f32>,
    v32: Vec<f32>,
    acc16: Vec<u16>,
    acc32: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
fn one_head(
    kv: &KvCache,
    il: usize,
    shape: &AttnShape,
    seq: SeqId,
    p: u32,
    h: usize,
    hq: &[f32],
    dst: &mut [f32],
    sc: &mut Scratch,
) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let kvh = h / (shape.n_head / shape.n_head_kv);
    let Some(cells) = kv.seq(seq) else {
        dst.fill(0.0);
        return;
    };
    let kb = kv.k_row / shape.n_head_kv;
    let vb = kv.v_row / shape.n_head_kv;
    let k_rows = &cells.k[il];
    let v_rows = &cells.v[il];
    let half_v = shape.mode == AttnMode::HalfAccum && kv.type_v == GgmlType::F16;
    let (q_ty, kdot) = match shape.mode {
        AttnMode::HalfAccum => (
            vec_dot_type(kv.type_k),
            kernel(kv.type_k).expect("cache types are checked at load"),
        ),
        AttnMode::Exact => (GgmlType::F32, kernel(GgmlType::F32).expect("f32 kernel")),
    };
    sc.q_conv.resize(act_row_bytes(q_ty, dk), 0);
    quantize_act(q_ty, hq, &mut sc.q_conv);
    if half_v {
        sc.acc16.clear();
        sc.acc16.resize(dv, 0);
    } else {
        sc.acc32.clear();
        sc.acc32.resize(dv, 0.0);
        sc.v32.resize(dv, 0.0);
    }
    let mut k_f32_bytes = Vec::new();
    let mut sum = 0.0f32;
    let mut max = f32::NEG_INFINITY;
    for (c, &cp) in cells.pos.iter().enumerate() {
        if cp > p || (shape.n_swa > 0 && p - cp >= shape.n_swa) {
            continue;
        }
        let krow = &k_rows[c * kv.k_row + kvh * kb..c * kv.k_row + (kvh + 1) * kb];
        let s = match shape.mode {
            AttnMode::HalfAccum => kdot(dk, krow, &sc.q_conv),
            AttnMode::Exact => {
                sc.k32.resize(dk, 0.0);
                dequantize(kv.type_k, krow, &mut sc.k32).expect("cache types are checked at load");
                k_f32_bytes.clear();
                k_f32_bytes.extend(sc.k32.iter().flat_map(|v| v.to_le_bytes()));
                kdot(dk, &k_f32_bytes, &sc.q_conv)
            }
        } * shape.scale;
        let vrow = &v_rows[c * kv.v_row + kvh * vb..c * kv.v_row + (kvh + 1) * vb];
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
            sc.acc32
                .iter_mut()
                .zip(&sc.v32)
                .for_each(|(a, v)| *a += v * vs);
        }
        sum = sum * ms + vs;
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    if half_v {
        for (d, &a) in dst.iter_mut().zip(&sc.acc16) {
            *d = f16_to_f32(a) * inv;
        }
    } else {
        for (d, &a) in dst.iter_mut().zip(&sc.acc32) {
            *d = a * inv;
        }
    }
}
