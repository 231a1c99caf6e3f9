//! Mixture-of-experts FFN: softmax routing, top-k, optional renormalization and scaling as the
//! family's keys say, and expert products grouped by expert across the ubatch (each expert's
//! weights are read once per ubatch, however many tokens chose it).

use super::arch::{Act, Hparams};
use super::model::glu;
use super::weights::Tensor;
use crate::backend::cpu::matmul::{matmul, Activations};
use crate::backend::cpu::ThreadPool;

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
) {
    let (ne, k, nf, n_embd) = (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_embd);
    let mut logits = vec![0.0; n * ne];
    matmul(pool, &router.mat(), cur, n, &mut logits, abuf);
    let routes: Vec<Vec<(usize, f32)>> = logits
        .chunks_exact(ne)
        .map(|l| route(l, k, hp.expert_norm, hp.expert_scale))
        .collect();
    // per (token, slot) expert outputs, summed in slot order at the end as ggml does
    let mut ys = vec![0.0f32; n * k * n_embd];
    let (gm, um, dm) = (gate.mat(), up.mat(), down.mat());
    for e in 0..ne {
        let users: Vec<(usize, usize)> = routes
            .iter()
            .enumerate()
            .flat_map(|(t, r)| {
                r.iter()
                    .enumerate()
                    .filter(|(_, c)| c.0 == e)
                    .map(move |(s, _)| (t, s))
            })
            .collect();
        if users.is_empty() {
            continue;
        }
        let m = users.len();
        let mut xg = Vec::with_capacity(m * n_embd);
        for &(t, _) in &users {
            xg.extend_from_slice(&cur[t * n_embd..(t + 1) * n_embd]);
        }
        let mut g = vec![0.0; m * nf];
        let mut u = vec![0.0; m * nf];
        matmul(pool, &gm.rows(e * nf, (e + 1) * nf), &xg, m, &mut g, abuf);
        matmul(pool, &um.rows(e * nf, (e + 1) * nf), &xg, m, &mut u, abuf);
        glu(act, &mut g, &u);
        let mut y = vec![0.0; m * n_embd];
        matmul(
            pool,
            &dm.rows(e * n_embd, (e + 1) * n_embd),
            &g,
            m,
            &mut y,
            abuf,
        );
        for (j, &(t, s)) in users.iter().enumerate() {
            let w = routes[t][s].1;
            let dst = &mut ys[(t * k + s) * n_embd..(t * k + s + 1) * n_embd];
            dst.iter_mut()
                .zip(&y[j * n_embd..(j + 1) * n_embd])
                .for_each(|(d, v)| *d = v * w);
        }
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

    #[test]
    fn top_k_renormalized() {
        let r = route(&[0.0, 2.0, 1.0, 2.0], 2, true, 1.0);
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        let r = route(&[0.0, 0.0], 1, false, 2.0);
        assert!((r[0].1 - 1.0).abs() < 1e-6);
    }
}
