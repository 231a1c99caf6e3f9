//! How unevenly routes spread over experts: the figures that say whether keeping the hottest
//! experts on the card can pay (a top-25% share near 0.25 means it cannot). Pure functions over
//! route counts; where the counts come from is the caller's business.

use super::heat::Heat;

/// Skew figures of one distribution of route counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Skew {
    /// Experts the counts cover.
    pub n_expert: usize,
    /// Routes counted.
    pub routes: f64,
    /// Share of the routes taken by the hottest 10% and 25% of experts (0.10 and 0.25 when
    /// uniform). A fraction that falls inside an expert counts that share of its routes, so the
    /// figures are points of the Lorenz curve and compare across expert counts.
    pub top10: f64,
    pub top25: f64,
    /// Gini coefficient: 0 when uniform, (n - 1) / n when one expert takes every route.
    pub gini: f64,
    /// Shannon entropy over ln(n): 1 when uniform, 0 when one expert takes every route.
    pub entropy: f64,
    /// Experts no route reached.
    pub unused: usize,
}

/// The skew of `counts` (one count per expert, any order); `None` when nothing was routed.
pub fn skew(counts: &[f32]) -> Option<Skew> {
    let n = counts.len();
    let mut sorted: Vec<f64> = counts.iter().map(|&c| c.max(0.0) as f64).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let total: f64 = sorted.iter().sum();
    if n == 0 || total <= 0.0 {
        return None;
    }
    let top = |frac: f64| {
        let k = frac * n as f64;
        let whole = k.floor() as usize;
        let part = sorted.get(whole).map_or(0.0, |&c| c * (k - whole as f64));
        (sorted[..whole].iter().sum::<f64>() + part) / total
    };
    // Gini over the ascending order: sum((2i - n - 1) x_i) / (n * total), i from 1
    let gini = sorted
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &c)| (2.0 * (i + 1) as f64 - n as f64 - 1.0) * c)
        .sum::<f64>()
        / (n as f64 * total);
    let entropy = if n > 1 {
        let h: f64 = sorted
            .iter()
            .filter(|&&c| c > 0.0)
            .map(|&c| c / total * (total / c).ln())
            .sum();
        h / (n as f64).ln()
    } else {
        1.0
    };
    Some(Skew {
        n_expert: n,
        routes: total,
        top10: top(0.10),
        top25: top(0.25),
        gini,
        entropy,
        unused: sorted.iter().filter(|&&c| c == 0.0).count(),
    })
}

/// The skew of each layer that routed anything (its index and figures), and of all their
/// experts pooled as one set: what a single budget of card slots for the whole model faces.
pub fn of_heat(heat: &Heat) -> (Vec<(usize, Skew)>, Option<Skew>) {
    let mut layers = Vec::new();
    let mut pooled = Vec::new();
    for il in 0..heat.n_layer() {
        if let Some(s) = skew(heat.layer(il)) {
            layers.push((il, s));
            pooled.extend_from_slice(heat.layer(il));
        }
    }
    (layers, skew(&pooled))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn uniform_counts_have_no_skew() {
        let s = skew(&[5.0; 40]).unwrap();
        assert_eq!((s.n_expert, s.routes, s.unused), (40, 200.0, 0));
        assert!(close(s.top10, 0.10) && close(s.top25, 0.25), "{s:?}");
        assert!(close(s.gini, 0.0) && close(s.entropy, 1.0), "{s:?}");
    }

    #[test]
    fn one_expert_taking_every_route_is_the_maximum() {
        let mut c = vec![0.0; 8];
        c[5] = 12.0;
        let s = skew(&c).unwrap();
        assert_eq!(s.unused, 7);
        // the top 10% of eight experts is 0.8 of the hottest
        assert!(close(s.top10, 0.8) && close(s.top25, 1.0), "{s:?}");
        assert!(close(s.gini, 7.0 / 8.0) && close(s.entropy, 0.0), "{s:?}");
    }

    #[test]
    fn known_distributions() {
        // ascending 1, 2, 3, 4: Gini = (2 * 30) / (4 * 10) - 5 / 4
        let s = skew(&[3.0, 1.0, 4.0, 2.0]).unwrap();
        assert!(close(s.gini, 0.25), "{s:?}");
        // top 25% = exactly the hottest of four; top 10% = 0.4 of it
        assert!(close(s.top25, 0.4) && close(s.top10, 0.16), "{s:?}");
        // two equal experts of four: entropy ln 2 / ln 4, Gini 0.5
        let h = skew(&[0.0, 7.0, 0.0, 7.0]).unwrap();
        assert!(close(h.entropy, 0.5) && close(h.gini, 0.5), "{h:?}");
        assert!(close(h.top25, 0.5) && close(h.top10, 0.2), "{h:?}");
        assert_eq!(h.unused, 2);
        // ten experts: the top 10% is exactly the hottest
        let mut c = vec![1.0; 10];
        c[0] = 11.0;
        let t = skew(&c).unwrap();
        assert!(close(t.top10, 0.55), "{t:?}");
        // 2.5 experts: 11 + 1 + 0.5
        assert!(close(t.top25, 12.5 / 20.0), "{t:?}");
    }

    #[test]
    fn heat_layers_and_pool() {
        let mut h = Heat::new(3, 4, 0);
        for e in 0..4 {
            h.record(0, &[e]);
        }
        h.record(2, &[1, 1]);
        let (layers, all) = of_heat(&h);
        let idx: Vec<usize> = layers.iter().map(|l| l.0).collect();
        assert_eq!(idx, [0, 2], "layer 1 routed nothing");
        assert!(close(layers[0].1.gini, 0.0) && close(layers[1].1.top25, 1.0));
        let all = all.unwrap();
        // pooled: eight experts, counts 1, 1, 1, 1, 0, 2, 0, 0
        assert_eq!((all.n_expert, all.routes, all.unused), (8, 6.0, 3));
        assert!(close(all.top25, 3.0 / 6.0), "{all:?}");
    }

    #[test]
    fn nothing_routed_has_no_figures() {
        assert_eq!(skew(&[0.0; 4]), None);
        assert_eq!(skew(&[]), None);
    }
}
