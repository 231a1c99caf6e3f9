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
use crate::backend::cpu::vec::{f16_to_f32_slice, mad_f16, scale_f16};
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
    // the tiled (f32) path reads every cached row once per query head: convert each sequence's
    // rows of this layer to f32 once per step instead (the same values: conversion is exact)
    let mut f32_rows: Vec<(SeqId, Vec<f32>, Vec<f32>)> = Vec::new();
    if shape.mode == AttnMode::Exact {
        for &s in seqs {
            if f32_rows.iter().any(|r| r.0 == s) {
                continue;
            }
            if let Some(cells) = kv.seq(s) {
                let n = cells.pos.len();
                let kr = &cells.k[il][..n * kv.k_row];
                let vr = &cells.v[il][..n * kv.v_row];
                f32_rows.push((s, to_f32(kv.type_k, kr), to_f32(kv.type_v, vr)));
            }
        }
    }
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
            let rows = f32_rows
                .iter()
                .find(|r| r.0 == seqs[i])
                .map(|r| (&r.1[..], &r.2[..]));
            one_head(
                kv,
                il,
                shape,
                (seqs[i], pos[i], h),
                hq,
                rows,
                dst,
                &mut scratch,
            );
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

/// `v` as the little-endian bytes the f32 dot kernel reads.
fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialized bytes, and u8 has no alignment to keep (this target is
    // little-endian, as the kernels' byte reads assume).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4) }
}

#[derive(Default)]
struct Scratch {
    q_conv: Vec<u8>,
    acc16: Vec<u16>,
    acc32: Vec<f32>,
}

/// Query head `h` of the token at position `p` of `seq`; `rows` are the sequence's K and V rows
/// of this layer as floats (the tiled path only).
#[allow(clippy::too_many_arguments)]
fn one_head(
    kv: &KvCache,
    il: usize,
    shape: &AttnShape,
    (seq, p, h): (SeqId, u32, usize),
    hq: &[f32],
    rows: Option<(&[f32], &[f32])>,
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
    }
    // floats per cell of all KV heads
    let (kf, vf) = (shape.n_head_kv * dk, shape.n_head_kv * dv);
    let mut v32 = vec![0.0f32; if rows.is_some() { 0 } else { dv }];
    let mut sum = 0.0f32;
    let mut max = f32::NEG_INFINITY;
    for (c, &cp) in cells.pos.iter().enumerate() {
        if cp > p || (shape.n_swa > 0 && p - cp >= shape.n_swa) {
            continue;
        }
        let s = match rows {
            Some((k32, _)) => {
                let at = c * kf + kvh * dk;
                kdot(dk, f32_bytes(&k32[at..at + dk]), &sc.q_conv)
            }
            None => {
                let krow = &k_rows[c * kv.k_row + kvh * kb..c * kv.k_row + (kvh + 1) * kb];
                kdot(dk, krow, &sc.q_conv)
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
            let v = match rows {
                Some((_, v32)) => &v32[c * vf + kvh * dv..c * vf + (kvh + 1) * dv],
                None => {
                    dequantize(kv.type_v, vrow, &mut v32).expect("cache types are checked at load");
                    &v32[..]
                }
            };
            sc.acc32.iter_mut().zip(v).for_each(|(a, v)| *a += v * vs);
        }
        // fused, as ggml's compiler builds `S = S*ms + vs`
        sum = sum.mul_add(ms, vs);
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
