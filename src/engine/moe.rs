//! Mixture-of-experts FFN: softmax routing, top-k, optional renormalization and scaling as the
//! family's keys say. Prompt ubatches group the expert products by expert (each expert's weights
//! are read once per ubatch, however many tokens chose it); decode steps run every chosen
//! (token, expert) pair in one threaded pass per matrix ([`expert_pairs`], which the CUDA engine
//! also uses for the experts it keeps on the host).

use super::arch::{Act, Hparams};
use super::model::glu;
use super::tier::heat::Heat;
use super::weights::Tensor;
use crate::backend::cpu::matmul::{
    check_groups, group_tile, group_tiles, matmul, matmul_groups, matmul_pairs, pair_dots,
    Activations, Group,
};
use crate::backend::cpu::pool::{split_range, SyncPtr};
use crate::backend::cpu::{QMat, ThreadPool};
use crate::model::quants::vec_dot_type;

/// Batches up to this many tokens run their experts as pairs (decode); larger ones group by
/// expert.
const PAIRS_MAX_TOKENS: usize = 8;

/// Reusable buffers of [`expert_pairs`].
pub struct PairBufs {
    x: Activations,
    x_up: Activations,
    h: Activations,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Converts the few activation rows of a decode step on the calling thread: waking the
    /// pool costs more than the conversion.
    serial: ThreadPool,
}

impl Default for PairBufs {
    fn default() -> Self {
        PairBufs {
            x: Activations::new(),
            x_up: Activations::new(),
            h: Activations::new(),
            gate: Vec::new(),
            up: Vec::new(),
            serial: ThreadPool::new(1),
        }
    }
}

/// The unweighted outputs of the experts in `pairs` (token, expert) for the token rows of `x`
/// (`gate.cols` floats each): `out` gets one row of `gate.cols` floats per pair, in pair order.
/// `gate`, `up` and `down` are the stacked expert tensors (`nf` rows per expert for gate and up,
/// `gate.cols` rows per expert for down). Two passes of the pool: gate, up and the activation
/// function together, then down.
#[allow(clippy::too_many_arguments)]
pub fn expert_pairs(
    pool: &ThreadPool,
    act: Act,
    [gate, up, down]: [QMat; 3],
    nf: usize,
    x: &[f32],
    pairs: &[(usize, usize)],
    out: &mut [f32],
    b: &mut PairBufs,
) {
    let e = gate.cols;
    let n_tok = x.len() / e;
    let np = pairs.len();
    // the products index (expert block, activation row)
    let by_token: Vec<(usize, usize)> = pairs.iter().map(|&(t, x)| (x, t)).collect();
    b.x.prepare(&b.serial, gate.ty, x, e, n_tok);
    let same = vec_dot_type(up.ty) == vec_dot_type(gate.ty);
    if !same {
        b.x_up.prepare(&b.serial, up.ty, x, e, n_tok);
    }
    let x_up = if same { &b.x } else { &b.x_up };
    b.gate.resize(np * nf, 0.0);
    b.up.resize(np * nf, 0.0);
    matmul_pairs_glu(
        pool,
        act,
        [&gate, &up],
        nf,
        &by_token,
        [&b.x, x_up],
        &mut b.gate,
        &mut b.up,
    );
    b.h.prepare(&b.serial, down.ty, &b.gate, nf, np);
    let by_pair: Vec<(usize, usize)> = pairs.iter().enumerate().map(|(j, p)| (p.1, j)).collect();
    matmul_pairs(pool, &down, e, &by_pair, &b.h, out);
}

/// [`matmul_pairs`] of `gate` and `up` over the same pairs in one pass, each thread applying the
/// activation function to the rows it computed: `g = act(g) * u`.
#[allow(clippy::too_many_arguments)]
fn matmul_pairs_glu(
    pool: &ThreadPool,
    act: Act,
    [gate, up]: [&QMat; 2],
    rows_per: usize,
    pairs: &[(usize, usize)],
    [xg, xu]: [&Activations; 2],
    g: &mut [f32],
    u: &mut [f32],
) {
    let n = pairs.len() * rows_per;
    let (gp, up_out) = (SyncPtr::new(g.as_mut_ptr()), SyncPtr::new(u.as_mut_ptr()));
    pool.run(|ith, nth| {
        let (i0, i1) = split_range(n, ith, nth, 16);
        if i0 >= i1 {
            return;
        }
        // SAFETY: each thread writes only rows [i0, i1) of both buffers, sized by the caller.
        let (gs, us) = unsafe {
            (
                std::slice::from_raw_parts_mut(gp.get().add(i0), i1 - i0),
                std::slice::from_raw_parts_mut(up_out.get().add(i0), i1 - i0),
            )
        };
        pair_dots(gate, rows_per, pairs, xg, i0, gs);
        pair_dots(up, rows_per, pairs, xu, i0, us);
        glu(act, gs, us);
    });
}

/// The weighted expert outputs of a prompt ubatch, grouped by expert: `ys` gets row `t * k + s`
/// for token `t`'s `s`th chosen expert. The token rows are converted once; gate and up of every
/// expert run in one pass of the pool (each thread applying the activation function to its own
/// tiles), then down in another, each expert's weights read once for all the tokens that chose
/// it. The same products as one [`matmul`] per expert, bit for bit.
#[allow(clippy::too_many_arguments)]
fn expert_groups(
    pool: &ThreadPool,
    act: Act,
    [gate, up, down]: [QMat; 3],
    nf: usize,
    x: &[f32],
    routes: &[Vec<(usize, f32)>],
    ys: &mut [f32],
    b: &mut PairBufs,
) {
    let (e, n) = (gate.cols, routes.len());
    let k = routes.first().map_or(0, Vec::len);
    let ne = gate.rows / nf;
    // (token, slot) pairs by expert, in token order within each
    let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ne];
    for (t, r) in routes.iter().enumerate() {
        for (s, c) in r.iter().enumerate() {
            users[c.0].push((t, s));
        }
    }
    let mut groups = Vec::new();
    let mut order = Vec::with_capacity(n * k);
    for (x, u) in users.iter().enumerate().filter(|(_, u)| !u.is_empty()) {
        groups.push(Group {
            block: x,
            rows: u.iter().map(|p| p.0).collect(),
            out: order.len(),
        });
        order.extend_from_slice(u);
    }
    b.x.prepare(pool, gate.ty, x, e, n);
    let same = vec_dot_type(up.ty) == vec_dot_type(gate.ty);
    if !same {
        b.x_up.prepare(pool, up.ty, x, e, n);
    }
    let x_up = if same { &b.x } else { &b.x_up };
    let np = order.len();
    b.gate.resize(np * nf, 0.0);
    b.up.resize(np * nf, 0.0);
    check_groups(&gate, nf, &groups, &b.x, b.gate.len());
    check_groups(&up, nf, &groups, x_up, b.up.len());
    let (gp, upp) = (
        SyncPtr::new(b.gate.as_mut_ptr()),
        SyncPtr::new(b.up.as_mut_ptr()),
    );
    let xg = &b.x;
    pool.run(|ith, nth| {
        for (g, r0, r1) in group_tiles(&groups, nf, ith, nth) {
            let gr = &groups[g];
            // SAFETY: tiles are disjoint (group, rows) ranges of both buffers, checked above;
            // the activation function then runs on exactly the entries this tile wrote.
            unsafe {
                group_tile(&gate, nf, gr, xg, r0, r1, gp);
                group_tile(&up, nf, gr, x_up, r0, r1, upp);
                for j in 0..gr.rows.len() {
                    let at = (gr.out + j) * nf + r0;
                    glu(
                        act,
                        std::slice::from_raw_parts_mut(gp.get().add(at), r1 - r0),
                        std::slice::from_raw_parts(upp.get().add(at), r1 - r0),
                    );
                }
            }
        }
    });
    b.h.prepare(pool, down.ty, &b.gate, nf, np);
    for g in &mut groups {
        g.rows = (g.out..g.out + g.rows.len()).collect();
    }
    let mut y = vec![0.0f32; np * e];
    matmul_groups(pool, &down, e, &groups, &b.h, &mut y);
    for (p, &(t, s)) in order.iter().enumerate() {
        let w = routes[t][s].1;
        ys[(t * k + s) * e..(t * k + s + 1) * e]
            .iter_mut()
            .zip(&y[p * e..(p + 1) * e])
            .for_each(|(d, v)| *d = v * w);
    }
}

/// The experts token `t` uses, best first, with their weights.
pub fn route(logits: &[f32], k: usize, norm: bool, scale: f32) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let total: f32 = exps.iter().sum();
    let probs: Vec<f32> = exps.iter().map(|&e| e / total).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(usize, f32)> = order[..k].iter().map(|&e| (e, probs[e])).collect();
    if norm {
        // ggml clamps the sum so an all-zero top-k cannot divide by zero
        let sum = chosen.iter().map(|c| c.1).sum::<f32>().max(6.103_515_6e-5);
        chosen.iter_mut().for_each(|c| c.1 /= sum);
    }
    if scale != 1.0 {
        chosen.iter_mut().for_each(|c| c.1 *= scale);
    }
    chosen
}

/// Each of the `n` token rows of `cur` routed: its chosen experts and their weights.
pub fn routes_of(
    pool: &ThreadPool,
    hp: &Hparams,
    router: &Tensor,
    cur: &[f32],
    n: usize,
    abuf: &mut Activations,
) -> Vec<Vec<(usize, f32)>> {
    let ne = hp.n_expert;
    let mut logits = vec![0.0; n * ne];
    matmul(pool, &router.mat(), cur, n, &mut logits, abuf);
    logits
        .chunks_exact(ne)
        .map(|l| route(l, hp.n_expert_used, hp.expert_norm, hp.expert_scale))
        .collect()
}

/// Counts each row's chosen experts into `heat` for `layer`.
pub fn record(heat: &mut Heat, layer: u32, routes: &[Vec<(usize, f32)>]) {
    let mut experts = Vec::new();
    for r in routes {
        experts.clear();
        experts.extend(r.iter().map(|c| c.0 as u32));
        heat.record(layer, &experts);
    }
}

/// The MoE FFN of the `n` token rows of `cur` into `out`. With `seen` (the heat and this layer's
/// index), every token's chosen experts are counted there; the products do not depend on it.
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn(
    pool: &ThreadPool,
    hp: &Hparams,
    act: Act,
    [router, gate, up, down]: [&Tensor; 4],
    cur: &[f32],
    n: usize,
    out: &mut [f32],
    abuf: &mut Activations,
    pairs_buf: &mut PairBufs,
    seen: Option<(&mut Heat, u32)>,
) {
    let (k, nf, n_embd) = (hp.n_expert_used, hp.n_ff_exp, hp.n_embd);
    let routes = routes_of(pool, hp, router, cur, n, abuf);
    if let Some((heat, layer)) = seen {
        record(heat, layer, &routes);
    }
    // per (token, slot) expert outputs, summed in slot order at the end as ggml does
    let mut ys = vec![0.0f32; n * k * n_embd];
    let (gm, um, dm) = (gate.mat(), up.mat(), down.mat());
    if n <= PAIRS_MAX_TOKENS {
        let pairs: Vec<(usize, usize)> = routes
            .iter()
            .enumerate()
            .flat_map(|(t, r)| r.iter().map(move |c| (t, c.0)))
            .collect();
        expert_pairs(pool, act, [gm, um, dm], nf, cur, &pairs, &mut ys, pairs_buf);
        for (j, (t, s)) in (0..n).flat_map(|t| (0..k).map(move |s| (t, s))).enumerate() {
            let w = routes[t][s].1;
            ys[j * n_embd..(j + 1) * n_embd]
                .iter_mut()
                .for_each(|v| *v *= w);
        }
    } else {
        expert_groups(
            pool,
            act,
            [gm, um, dm],
            nf,
            cur,
            &routes,
            &mut ys,
            pairs_buf,
        );
    }
    for t in 0..n {
        let o = &mut out[t * n_embd..(t + 1) * n_embd];
        o.copy_from_slice(&ys[t * k * n_embd..(t * k + 1) * n_embd]);
        for s in 1..k {
            let y = &ys[(t * k + s) * n_embd..(t * k + s + 1) * n_embd];
            o.iter_mut().zip(y).for_each(|(a, b)| *a += b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::matmul::q8_0_test_rows;
    use crate::model::GgmlType;

    #[test]
    fn expert_pairs_equal_one_product_per_expert() {
        let pool = ThreadPool::new(2);
        let (ne, nf, e, n) = (4, 64, 96, 3);
        let (gd, ud, dd) = (
            q8_0_test_rows(ne * nf, e, 1),
            q8_0_test_rows(ne * nf, e, 2),
            q8_0_test_rows(ne * e, nf, 3),
        );
        let (g, u, d) = (
            QMat {
                ty: GgmlType::Q8_0,
                rows: ne * nf,
                cols: e,
                data: &gd,
                packed: None,
            },
            QMat {
                ty: GgmlType::Q8_0,
                rows: ne * nf,
                cols: e,
                data: &ud,
                packed: None,
            },
            QMat {
                ty: GgmlType::Q8_0,
                rows: ne * e,
                cols: nf,
                data: &dd,
                packed: None,
            },
        );
        let x: Vec<f32> = (0..n * e)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.05)
            .collect();
        let pairs = [(0, 3), (0, 1), (1, 1), (2, 0), (2, 3)];
        let mut out = vec![f32::NAN; pairs.len() * e];
        let mut bufs = PairBufs::default();
        expert_pairs(
            &pool,
            Act::Silu,
            [g, u, d],
            nf,
            &x,
            &pairs,
            &mut out,
            &mut bufs,
        );
        let mut abuf = Activations::new();
        for (j, &(t, xp)) in pairs.iter().enumerate() {
            let xt = &x[t * e..(t + 1) * e];
            let (mut gv, mut uv) = (vec![0.0; nf], vec![0.0; nf]);
            matmul(
                &pool,
                &g.rows(xp * nf, (xp + 1) * nf),
                xt,
                1,
                &mut gv,
                &mut abuf,
            );
            matmul(
                &pool,
                &u.rows(xp * nf, (xp + 1) * nf),
                xt,
                1,
                &mut uv,
                &mut abuf,
            );
            glu(Act::Silu, &mut gv, &uv);
            let mut y = vec![0.0; e];
            matmul(
                &pool,
                &d.rows(xp * e, (xp + 1) * e),
                &gv,
                1,
                &mut y,
                &mut abuf,
            );
            assert_eq!(&out[j * e..(j + 1) * e], &y[..], "pair {j}");
        }
    }

    #[test]
    fn grouped_experts_equal_pairs_bit_for_bit() {
        let pool = ThreadPool::new(2);
        let (ne, nf, e, n, k) = (7, 64, 96, 13, 3);
        let (gd, ud, dd) = (
            q8_0_test_rows(ne * nf, e, 4),
            q8_0_test_rows(ne * nf, e, 5),
            q8_0_test_rows(ne * e, nf, 6),
        );
        let mat = |data, rows, cols| QMat {
            ty: GgmlType::Q8_0,
            rows,
            cols,
            data,
            packed: None,
        };
        let mats = [
            mat(&gd[..], ne * nf, e),
            mat(&ud[..], ne * nf, e),
            mat(&dd[..], ne * e, nf),
        ];
        let x: Vec<f32> = (0..n * e)
            .map(|i| ((i * 17 % 31) as f32 - 15.0) * 0.04)
            .collect();
        // expert 5 takes most tokens, expert 4 three, expert 6 none
        let routes: Vec<Vec<(usize, f32)>> = (0..n)
            .map(|t| {
                let mut r = vec![(5, 0.5), ((t % 4), 0.3), ((t + 1) % 4, 0.2)];
                if t % 5 == 0 {
                    r[0].0 = 4;
                }
                r
            })
            .collect();
        let mut ys = vec![f32::NAN; n * k * e];
        let mut bufs = PairBufs::default();
        expert_groups(&pool, Act::Silu, mats, nf, &x, &routes, &mut ys, &mut bufs);
        let pairs: Vec<(usize, usize)> = routes
            .iter()
            .enumerate()
            .flat_map(|(t, r)| r.iter().map(move |c| (t, c.0)))
            .collect();
        let mut want = vec![0.0; pairs.len() * e];
        expert_pairs(
            &pool,
            Act::Silu,
            mats,
            nf,
            &x,
            &pairs,
            &mut want,
            &mut PairBufs::default(),
        );
        for (j, (t, s)) in (0..n).flat_map(|t| (0..k).map(move |s| (t, s))).enumerate() {
            let w = routes[t][s].1;
            let row: Vec<f32> = want[j * e..(j + 1) * e].iter().map(|v| v * w).collect();
            assert_eq!(&ys[j * e..(j + 1) * e], &row[..], "token {t} slot {s}");
        }
    }

    #[test]
    fn top_k_renormalized() {
        let r = route(&[0.0, 2.0, 1.0, 2.0], 2, true, 1.0);
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        let r = route(&[0.0, 0.0], 1, false, 2.0);
        assert!((r[0].1 - 1.0).abs() < 1e-6);
    }
}
