//! Mixture-of-experts FFN: softmax routing, top-k, optional renormalization and scaling as the
//! family's keys say. Prompt ubatches group the expert products by expert (each expert's weights
//! are read once per ubatch, however many tokens chose it); decode steps run every chosen
//! (token, expert) pair in one threaded pass per matrix ([`expert_pairs`], which the CUDA engine
//! also uses for the experts it keeps on the host).

use super::arch::{Act, Gating, Hparams};
use super::model::{glu, ExpertBias};
use super::tier::heat::Heat;
use super::weights::Tensor;
use crate::backend::cpu::fa::soft_max_any;
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
    bias: Option<&ExpertBias>,
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
        bias,
    );
    b.h.prepare(&b.serial, down.ty, &b.gate, nf, np);
    let by_pair: Vec<(usize, usize)> = pairs.iter().enumerate().map(|(j, p)| (p.1, j)).collect();
    matmul_pairs(pool, &down, e, &by_pair, &b.h, out);
    if let Some(bias) = bias {
        for (o, &(_, x)) in out.chunks_exact_mut(e).zip(pairs) {
            add_row(o, &bias.down[x * e..(x + 1) * e]);
        }
    }
}

/// `o += b`, element by element (ggml's `add_id` of an expert's bias row).
fn add_row(o: &mut [f32], b: &[f32]) {
    o.iter_mut().zip(b).for_each(|(o, b)| *o += b);
}

/// Adds the gate and up biases of `expert` to `nf`-wide rows' entries `r0..r0 + g.len()`.
fn add_glu_bias(
    bias: &ExpertBias,
    nf: usize,
    expert: usize,
    r0: usize,
    g: &mut [f32],
    u: &mut [f32],
) {
    let at = expert * nf + r0;
    add_row(g, &bias.gate[at..at + g.len()]);
    add_row(u, &bias.up[at..at + u.len()]);
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
    bias: Option<&ExpertBias>,
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
        if let Some(bias) = bias {
            // row by row of each pair this thread holds
            let mut i = i0;
            while i < i1 {
                let (j, r) = (i / rows_per, i % rows_per);
                let end = ((j + 1) * rows_per).min(i1);
                let (a, z) = (i - i0, end - i0);
                add_glu_bias(bias, rows_per, pairs[j].0, r, &mut gs[a..z], &mut us[a..z]);
                i = end;
            }
        }
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
    bias: Option<&ExpertBias>,
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
                    let g = std::slice::from_raw_parts_mut(gp.get().add(at), r1 - r0);
                    let u = std::slice::from_raw_parts_mut(upp.get().add(at), r1 - r0);
                    if let Some(bias) = bias {
                        add_glu_bias(bias, nf, gr.block, r0, g, u);
                    }
                    glu(act, g, u);
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
        let (x, w) = routes[t][s];
        if let Some(bias) = bias {
            add_row(&mut y[p * e..(p + 1) * e], &bias.down[x * e..(x + 1) * e]);
        }
        ys[(t * k + s) * e..(t * k + s + 1) * e]
            .iter_mut()
            .zip(&y[p * e..(p + 1) * e])
            .for_each(|(d, v)| *d = v * w);
    }
}

/// How a family turns router logits into chosen experts and weights.
#[derive(Clone, Copy, Debug)]
pub struct Routing {
    pub k: usize,
    pub gating: Gating,
    /// Renormalize the chosen weights to sum to 1.
    pub norm: bool,
    pub scale: f32,
    /// `(groups, used)`: experts in `groups` equal groups, each token choosing among the `used`
    /// groups whose two best selection scores sum highest (0 or 1 group: no limit).
    pub groups: (usize, usize),
}

impl Routing {
    pub fn of(hp: &Hparams) -> Routing {
        Routing {
            k: hp.n_expert_used,
            gating: hp.gating,
            norm: hp.expert_norm,
            scale: hp.expert_scale,
            groups: (hp.n_expert_groups, hp.n_group_used),
        }
    }
}

/// DeepSeek-V3's group limit on the selection scores `select`: each group scored by the sum of
/// its two best (ggml sums rows in double), the best `used` groups kept and every other expert's
/// score set to minus infinity.
fn limit_groups(select: &mut [f32], (groups, used): (usize, usize)) {
    if groups <= 1 {
        return;
    }
    let per = select.len() / groups;
    let score = |g: &[f32]| {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &x in g {
            if x > a {
                (a, b) = (x, a);
            } else if x > b {
                b = x;
            }
        }
        (0.0f64 + a as f64 + b as f64) as f32
    };
    let scores: Vec<f32> = select.chunks_exact(per).map(score).collect();
    let mut order: Vec<usize> = (0..groups).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    for &g in &order[used..] {
        select[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
    }
}

/// ggml's `soft_max` of one row: its maximum, `exp(x - max)` in ggml's order, then each value
/// times the reciprocal of the (double) sum.
fn soft_max(x: &[f32]) -> Vec<f32> {
    let max = x
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v });
    let mut y = x.to_vec();
    let sum = soft_max_any(&mut y, max);
    let inv = (1.0 / sum) as f32;
    y.iter_mut().for_each(|v| *v *= inv);
    y
}

/// The experts a token with router `logits` (biases added) uses, best first (ggml's slot order,
/// `ggml_argsort_top_k`; the slots' outputs are summed in it), with their weights, as
/// llama.cpp's `build_moe_ffn` chooses and weighs them: gating probabilities, top-k of those
/// plus the selection bias `probs_b`, the chosen probabilities (a softmax over them for
/// [`Gating::SoftmaxWeight`]), then optional renormalization and scaling.
pub fn route(logits: &[f32], probs_b: Option<&[f32]>, r: &Routing) -> Vec<(usize, f32)> {
    let probs = match r.gating {
        Gating::Softmax => soft_max(logits),
        Gating::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
        Gating::SoftmaxWeight => logits.to_vec(),
    };
    let mut select: Vec<f32> = match probs_b {
        Some(b) => probs.iter().zip(b).map(|(p, b)| p + b).collect(),
        None => probs.clone(),
    };
    limit_groups(&mut select, r.groups);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| select[b].total_cmp(&select[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(usize, f32)> = order[..r.k].iter().map(|&e| (e, probs[e])).collect();
    if r.gating == Gating::SoftmaxWeight {
        let w: Vec<f32> = chosen.iter().map(|c| c.1).collect();
        for (c, w) in chosen.iter_mut().zip(soft_max(&w)) {
            c.1 = w;
        }
    }
    if r.norm {
        // ggml sums in double and clamps the sum so an all-zero top-k cannot divide by zero
        let sum = chosen.iter().map(|c| c.1 as f64).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        chosen.iter_mut().for_each(|c| c.1 /= sum);
    }
    if r.scale != 1.0 {
        chosen.iter_mut().for_each(|c| c.1 *= r.scale);
    }
    chosen
}

/// Each of the `n` token rows of `cur` routed: its chosen experts and their weights.
pub fn routes_of(
    pool: &ThreadPool,
    hp: &Hparams,
    w: &MoeWeights,
    cur: &[f32],
    n: usize,
    abuf: &mut Activations,
) -> Vec<Vec<(usize, f32)>> {
    let ne = hp.n_expert;
    let mut logits = vec![0.0; n * ne];
    matmul(pool, &w.mats[0].mat(), cur, n, &mut logits, abuf);
    let routing = Routing::of(hp);
    logits
        .chunks_exact_mut(ne)
        .map(|l| {
            if let Some(b) = w.router_b {
                add_row(l, b);
            }
            route(l, w.probs_b, &routing)
        })
        .collect()
}

/// A MoE layer's tensors: router, gate, up, down, and the biases some families add.
pub struct MoeWeights<'a> {
    pub mats: [&'a Tensor; 4],
    pub router_b: Option<&'a [f32]>,
    pub probs_b: Option<&'a [f32]>,
    pub bias: Option<&'a ExpertBias>,
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
    w: MoeWeights,
    cur: &[f32],
    n: usize,
    out: &mut [f32],
    abuf: &mut Activations,
    pairs_buf: &mut PairBufs,
    seen: Option<(&mut Heat, u32)>,
) {
    let (k, nf, n_embd) = (hp.n_expert_used, hp.n_ff_exp, hp.n_embd);
    let routes = routes_of(pool, hp, &w, cur, n, abuf);
    let [_, gate, up, down] = w.mats;
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
        expert_pairs(
            pool,
            act,
            [gm, um, dm],
            nf,
            cur,
            &pairs,
            &mut ys,
            pairs_buf,
            w.bias,
        );
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
            w.bias,
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

    /// Gate, up and down bytes of `ne` Q8_0 test experts `nf` wide over `e` (seeds `s..s + 3`).
    fn test_experts(ne: usize, nf: usize, e: usize, s: usize) -> [Vec<u8>; 3] {
        [
            q8_0_test_rows(ne * nf, e, s),
            q8_0_test_rows(ne * nf, e, s + 1),
            q8_0_test_rows(ne * e, nf, s + 2),
        ]
    }

    /// [`test_experts`]' bytes as stacked gate, up and down matrices.
    fn expert_mats(d: &[Vec<u8>; 3], ne: usize, nf: usize, e: usize) -> [QMat<'_>; 3] {
        let mat = |data, rows, cols| QMat {
            ty: GgmlType::Q8_0,
            rows,
            cols,
            data,
            packed: None,
        };
        [
            mat(&d[0][..], ne * nf, e),
            mat(&d[1][..], ne * nf, e),
            mat(&d[2][..], ne * e, nf),
        ]
    }

    #[test]
    fn expert_pairs_equal_one_product_per_expert() {
        let pool = ThreadPool::new(2);
        let (ne, nf, e, n) = (4, 64, 96, 3);
        let bytes = test_experts(ne, nf, e, 1);
        let [g, u, d] = expert_mats(&bytes, ne, nf, e);
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
            None,
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
        let bytes = test_experts(ne, nf, e, 4);
        let mats = expert_mats(&bytes, ne, nf, e);
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
        expert_groups(
            &pool,
            Act::Silu,
            mats,
            nf,
            &x,
            &routes,
            &mut ys,
            &mut bufs,
            None,
        );
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
            None,
        );
        for (j, (t, s)) in (0..n).flat_map(|t| (0..k).map(move |s| (t, s))).enumerate() {
            let w = routes[t][s].1;
            let row: Vec<f32> = want[j * e..(j + 1) * e].iter().map(|v| v * w).collect();
            assert_eq!(&ys[j * e..(j + 1) * e], &row[..], "token {t} slot {s}");
        }
    }

    fn routing(k: usize, gating: Gating, norm: bool, scale: f32) -> Routing {
        Routing {
            k,
            gating,
            norm,
            scale,
            groups: (0, 0),
        }
    }

    /// DeepSeek-V3's group limit: groups ranked by their two best scores (not their best one,
    /// nor their sum), the others' experts out of reach however high they score alone.
    #[test]
    fn group_limited_routing() {
        let mut r = routing(2, Gating::SoftmaxWeight, false, 1.0);
        r.groups = (3, 1);
        // group 0: one high score (9, 0); group 1: two good ones (5, 5); group 2: (1, 1)
        let logits = [9.0, 0.0, 5.0, 5.0, 1.0, 1.0];
        let chosen: Vec<usize> = route(&logits, None, &r).iter().map(|c| c.0).collect();
        assert_eq!(chosen, vec![2, 3]);
        r.groups = (3, 2);
        let chosen: Vec<usize> = route(&logits, None, &r).iter().map(|c| c.0).collect();
        assert_eq!(chosen, vec![0, 2]);
        // the selection bias counts in the group scores
        r.groups = (3, 1);
        let bias = [0.0, 0.0, 0.0, 0.0, 6.0, 6.0];
        let chosen: Vec<usize> = route(&logits, Some(&bias), &r)
            .iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(chosen, vec![4, 5]);
        // without groups the best two overall
        r.groups = (0, 0);
        let chosen: Vec<usize> = route(&logits, None, &r).iter().map(|c| c.0).collect();
        assert_eq!(chosen, vec![0, 2]);
    }

    #[test]
    fn top_k_renormalized() {
        let r = route(
            &[0.0, 2.0, 1.0, 2.0],
            None,
            &routing(2, Gating::Softmax, true, 1.0),
        );
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        // ggml's slots: best first (its upstream dump `ffn_moe_weights` shows that order)
        let r = route(
            &[0.0, 5.0, 1.0, 4.0, 3.0],
            None,
            &routing(4, Gating::Softmax, false, 1.0),
        );
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3, 4, 2]);
        let r = route(&[0.0, 0.0], None, &routing(1, Gating::Softmax, false, 2.0));
        assert!((r[0].1 - 1.0).abs() < 1e-6);
    }

    /// Sigmoid gating chooses by probability plus selection bias but weighs by the unbiased
    /// probability; softmax-weight gating takes the top raw logits and a softmax over those.
    #[test]
    fn sigmoid_with_selection_bias_and_softmax_weight() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let bias = [0.0f32, 0.0, 5.0, 0.0];
        let r = route(
            &logits,
            Some(&bias),
            &routing(2, Gating::Sigmoid, false, 2.5),
        );
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2, 1]);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert_eq!(r[0].1, sig(-1.0) * 2.5);
        assert_eq!(r[1].1, sig(2.0) * 2.5);
        let r = route(
            &logits,
            None,
            &routing(2, Gating::SoftmaxWeight, false, 1.0),
        );
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3]);
        let (a, b) = (1.0f32, (-1.0f32).exp());
        assert!((r[0].1 - a / (a + b)).abs() < 1e-7 && (r[1].1 - b / (a + b)).abs() < 1e-7);
    }

    /// Per-expert biases enter before the activation (gate, up) and before the weighting
    /// (down), the same in the decode pairs and the prompt groups.
    #[test]
    fn expert_biases_in_pairs_and_groups() {
        let pool = ThreadPool::new(2);
        let (ne, nf, e, n, k) = (3, 64, 96, 12, 2);
        let bytes = test_experts(ne, nf, e, 7);
        let mats = expert_mats(&bytes, ne, nf, e);
        let bias = ExpertBias {
            gate: (0..ne * nf).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect(),
            up: (0..ne * nf).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect(),
            down: (0..ne * e).map(|i| (i % 3) as f32 - 1.0).collect(),
        };
        let x: Vec<f32> = (0..n * e)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.05)
            .collect();
        let routes: Vec<Vec<(usize, f32)>> = (0..n)
            .map(|t| vec![(t % ne, 0.75), ((t + 1) % ne, 0.25)])
            .collect();
        let pairs: Vec<(usize, usize)> = routes
            .iter()
            .enumerate()
            .flat_map(|(t, r)| r.iter().map(move |c| (t, c.0)))
            .collect();
        let mut plain = vec![0.0; pairs.len() * e];
        let mut biased = vec![0.0; pairs.len() * e];
        let mut bufs = PairBufs::default();
        let act = Act::SwigluOai;
        expert_pairs(
            &pool, act, mats, nf, &x, &pairs, &mut plain, &mut bufs, None,
        );
        expert_pairs(
            &pool,
            act,
            mats,
            nf,
            &x,
            &pairs,
            &mut biased,
            &mut bufs,
            Some(&bias),
        );
        assert_ne!(plain, biased, "the biases change the outputs");
        let mut ys = vec![f32::NAN; n * k * e];
        expert_groups(
            &pool,
            act,
            mats,
            nf,
            &x,
            &routes,
            &mut ys,
            &mut bufs,
            Some(&bias),
        );
        for (j, (t, s)) in (0..n).flat_map(|t| (0..k).map(move |s| (t, s))).enumerate() {
            let w = routes[t][s].1;
            let row: Vec<f32> = biased[j * e..(j + 1) * e].iter().map(|v| v * w).collect();
            assert_eq!(&ys[j * e..(j + 1) * e], &row[..], "token {t} slot {s}");
        }
    }
}
