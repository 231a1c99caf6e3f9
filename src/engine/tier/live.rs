//! Residency while serving: each layer that splits its experts between the card and the host
//! keeps its own heat and its own card slots (how many slots a layer has is the plan's; which
//! experts fill them is decided here). The engine reports the experts every small step routed
//! to ([`Live::record`]), asks between steps which copies to start ([`Live::plan`]), and says when
//! a copy has landed ([`Live::landed`]). Swaps across all layers compete for one per-step budget,
//! the largest heat gains first, so the copies never hold up a step and the hottest misplaced
//! experts move first. Hits (routes served from a card slot) are counted as the engine reports
//! routes, against the slots that served them.

use super::heat::Heat;
use super::residency::{Residency, Swap};
use super::ExpertId;

/// How residency behaves; `Default` is what the engine uses unless told otherwise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LiveParams {
    /// Steps after which a count has halved.
    pub half_life: u32,
    /// Copies started between two steps, over all layers.
    pub max_swaps: usize,
    /// Hysteresis: an expert displaces another only when hotter by this fraction (and by half a
    /// route).
    pub margin: f32,
}

impl Default for LiveParams {
    fn default() -> Self {
        LiveParams {
            half_life: 512,
            max_swaps: 16,
            margin: 0.25,
        }
    }
}

struct Layer {
    heat: Heat,
    slots: Residency,
}

/// Routes seen and how many of them a card slot served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveStats {
    pub routes: u64,
    pub hits: u64,
    pub swaps: u64,
}

impl LiveStats {
    pub fn hit_rate(&self) -> f64 {
        if self.routes == 0 {
            0.0
        } else {
            self.hits as f64 / self.routes as f64
        }
    }
}

pub struct Live {
    layers: Vec<Option<Layer>>,
    params: LiveParams,
    stats: LiveStats,
}

impl Live {
    /// `layers[il]`: for a layer whose experts are split, the experts its slots hold at load, in
    /// slot order (slot `i` holds `layers[il][i]`); `None` for a layer residency leaves alone
    /// (all experts on the card, or none). Expert indices are below `n_expert`.
    pub fn new(layers: &[Option<Vec<u32>>], n_expert: usize, params: LiveParams) -> Live {
        let layers = layers
            .iter()
            .map(|l| {
                l.as_ref().map(|held| {
                    let mut slots = Residency::new(held.len());
                    for (slot, &e) in held.iter().enumerate() {
                        slots.seed(slot, ExpertId::new(0, e));
                    }
                    Layer {
                        heat: Heat::new(1, n_expert, params.half_life),
                        slots,
                    }
                })
            })
            .collect();
        Live {
            layers,
            params,
            stats: LiveStats::default(),
        }
    }

    /// Whether any layer has slots to manage.
    pub fn active(&self) -> bool {
        self.layers.iter().flatten().any(|l| l.slots.n_slots() > 0)
    }

    /// The experts of one step in layer `il` (the engine's routing, token-major; negative ids are
    /// ignored).
    pub fn record(&mut self, il: usize, experts: &[i32]) {
        let Some(Some(l)) = self.layers.get_mut(il) else {
            return;
        };
        for &e in experts.iter().filter(|&&e| e >= 0) {
            let e = e as u32;
            l.heat.record(0, &[e]);
            self.stats.routes += 1;
            if l.slots.slot_of(ExpertId::new(0, e)).is_some() {
                self.stats.hits += 1;
            }
        }
    }

    /// The end of a step: heat decays, and up to `max_swaps` copies start, the largest heat
    /// gains over all layers first. Each returned `(layer, swap)` has begun: from now on the
    /// evicted expert is served from the host, and the loaded one once its copy has landed.
    pub fn plan(&mut self) -> Vec<(usize, Swap)> {
        let mut candidates: Vec<(f32, usize, Swap)> = Vec::new();
        for (il, l) in self.layers.iter_mut().enumerate() {
            let Some(l) = l else { continue };
            l.heat.step();
            for s in l
                .slots
                .plan(&l.heat, self.params.max_swaps, self.params.margin)
            {
                let gain = l.heat.get(s.load) - s.evict.map_or(0.0, |e| l.heat.get(e));
                candidates.push((gain, il, s));
            }
        }
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        candidates.truncate(self.params.max_swaps);
        let mut out = Vec::with_capacity(candidates.len());
        for (_, il, s) in candidates {
            if let Some(Some(l)) = self.layers.get_mut(il) {
                l.slots.begin(&s);
                self.stats.swaps += 1;
                out.push((il, s));
            }
        }
        out
    }

    /// The copy into `slot` of layer `il` has landed: its expert is served from the card.
    pub fn landed(&mut self, il: usize, slot: usize) {
        if let Some(Some(l)) = self.layers.get_mut(il) {
            l.slots.complete(slot);
        }
    }

    /// The card slot serving expert `expert` of layer `il`, if one does.
    pub fn slot_of(&self, il: usize, expert: u32) -> Option<usize> {
        match self.layers.get(il) {
            Some(Some(l)) => l.slots.slot_of(ExpertId::new(0, expert)),
            _ => None,
        }
    }

    pub fn stats(&self) -> LiveStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generator of skewed routing: expert `e` is chosen with weight `1 / (e + 1)^s`, `k`
    /// distinct experts per token (xorshift, so the test is deterministic).
    struct Router {
        state: u64,
        weights: Vec<f64>,
    }

    impl Router {
        fn new(n_expert: usize, s: f64, seed: u64) -> Router {
            Router {
                state: seed | 1,
                weights: (0..n_expert)
                    .map(|e| 1.0 / ((e + 1) as f64).powf(s))
                    .collect(),
            }
        }

        fn next(&mut self) -> f64 {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            (self.state >> 11) as f64 / (1u64 << 53) as f64
        }

        fn route(&mut self, k: usize, perm: &[u32]) -> Vec<i32> {
            let mut out: Vec<i32> = Vec::new();
            while out.len() < k {
                let total: f64 = self.weights.iter().sum();
                let mut r = self.next() * total;
                let mut pick = 0;
                for (e, w) in self.weights.iter().enumerate() {
                    if r < *w {
                        pick = e;
                        break;
                    }
                    r -= w;
                }
                let e = perm[pick] as i32;
                if !out.contains(&e) {
                    out.push(e);
                }
            }
            out
        }
    }

    /// Runs `steps` decode steps of one token over `n_layer` layers, landing every copy before
    /// the next step; returns the hit rate over the last `tail` steps.
    fn serve(live: &mut Live, routers: &mut [Router], perms: &[Vec<u32>], steps: usize) -> f64 {
        let before = live.stats();
        for _ in 0..steps {
            for (il, r) in routers.iter_mut().enumerate() {
                let ids = r.route(8, &perms[il]);
                live.record(il, &ids);
            }
            for (il, s) in live.plan() {
                live.landed(il, s.slot);
            }
        }
        let after = live.stats();
        (after.hits - before.hits) as f64 / (after.routes - before.routes) as f64
    }

    #[test]
    fn slots_converge_on_the_hot_experts_of_every_layer() {
        // 4 layers of 64 experts, 16 slots each seeded with experts 0..16; each layer's hot
        // experts are a different permutation, so the seed is as good as a random guess
        let (n_layer, n_expert, n_slots) = (4, 64, 16);
        let perms: Vec<Vec<u32>> = (0..n_layer as u32)
            .map(|il| {
                (0..n_expert as u32)
                    .map(|e| (e * 37 + il * 11 + 5) % 64)
                    .collect()
            })
            .collect();
        let seeds: Vec<Option<Vec<u32>>> = (0..n_layer)
            .map(|_| Some((0..n_slots as u32).collect()))
            .collect();
        let mut live = Live::new(&seeds, n_expert, LiveParams::default());
        assert!(live.active());
        let mut routers: Vec<Router> = (0..n_layer)
            .map(|il| Router::new(n_expert, 1.0, 99 + il as u64))
            .collect();
        let cold = serve(&mut live, &mut routers, &perms, 1);
        let warm = serve(&mut live, &mut routers, &perms, 200);
        let late = serve(&mut live, &mut routers, &perms, 400);
        // the best any 16 of 64 can do under these weights (distinct picks make it a little
        // lower than the plain share): the share of weight in the hottest 16
        let w: Vec<f64> = (0..n_expert).map(|e| 1.0 / (e + 1) as f64).collect();
        let best = w[..n_slots].iter().sum::<f64>() / w.iter().sum::<f64>();
        assert!(cold < 0.45, "the seed is a poor guess: {cold}");
        assert!(late > 0.85 * best, "late hit rate {late} vs best {best}");
        assert!(
            late >= warm - 0.02,
            "no regression once warm: {warm} -> {late}"
        );
        for (il, perm) in perms.iter().enumerate() {
            for &hot in &perm[..4] {
                assert!(
                    live.slot_of(il, hot).is_some(),
                    "layer {il}'s expert {hot} is among its hottest four"
                );
            }
        }
        // settled: swaps have almost stopped
        let swaps = live.stats().swaps;
        serve(&mut live, &mut routers, &perms, 100);
        assert!(
            live.stats().swaps - swaps < 40,
            "{} swaps in 100 settled steps",
            live.stats().swaps - swaps
        );
    }

    #[test]
    fn even_routing_does_not_churn_the_slots() {
        // every expert equally likely: no expert deserves a slot more than another, so copies
        // would only cost; counting noise must not trade experts
        let (n_layer, n_expert, n_slots) = (4, 64, 16);
        let perms: Vec<Vec<u32>> = (0..n_layer)
            .map(|_| (0..n_expert as u32).collect())
            .collect();
        let seeds: Vec<Option<Vec<u32>>> = (0..n_layer)
            .map(|_| Some((0..n_slots as u32).collect()))
            .collect();
        let mut live = Live::new(&seeds, n_expert, LiveParams::default());
        let mut routers: Vec<Router> = (0..n_layer)
            .map(|il| Router::new(n_expert, 0.0, 7 + il as u64))
            .collect();
        let rate = serve(&mut live, &mut routers, &perms, 600);
        let swaps = live.stats().swaps;
        assert!(
            swaps < 60,
            "{swaps} copies in 600 steps of even routing over {n_layer} layers"
        );
        assert!(
            (rate - 0.25).abs() < 0.03,
            "hit rate {rate}, slots hold a quarter"
        );
    }

    #[test]
    fn the_step_budget_bounds_copies_and_goes_to_the_largest_gains() {
        let seeds = vec![Some(vec![0, 1]), None, Some(vec![0, 1])];
        let params = LiveParams {
            max_swaps: 1,
            ..LiveParams::default()
        };
        let mut live = Live::new(&seeds, 8, params);
        // layer 0 wants expert 5, layer 2 wants expert 6 more
        for _ in 0..12 {
            live.record(0, &[5, -1]);
        }
        for _ in 0..20 {
            live.record(2, &[6]);
        }
        live.record(1, &[3, 3, 3]);
        let swaps = live.plan();
        assert_eq!(swaps.len(), 1);
        assert_eq!(swaps[0].0, 2);
        assert_eq!(swaps[0].1.load, ExpertId::new(0, 6));
        assert_eq!(live.slot_of(2, 6), None, "not served before the copy lands");
        live.landed(2, swaps[0].1.slot);
        assert_eq!(live.slot_of(2, 6), Some(swaps[0].1.slot));
        assert_eq!(live.slot_of(1, 3), None, "a layer without slots");
        let st = live.stats();
        assert_eq!(
            (st.routes, st.swaps),
            (32, 1),
            "layer 1 is not tracked, -1 is no route"
        );
        assert_eq!(st.hits, 0);
        let next = live.plan();
        assert_eq!(next.len(), 1, "layer 0's turn: {next:?}");
        assert_eq!((next[0].0, next[0].1.load), (0, ExpertId::new(0, 5)));
    }

    #[test]
    fn layers_without_slots_leave_it_inactive() {
        let live = Live::new(&[None, Some(Vec::new())], 8, LiveParams::default());
        assert!(!live.active());
    }
}
