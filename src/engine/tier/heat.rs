//! Routing heat: how often decode routes to each expert, decaying so that residency follows what
//! the current requests use rather than what the first ones did. With a half-life of 0 it is a
//! plain count of routes, which is what `Forward::count_routes` records for measuring skew.

use super::ExpertId;

pub struct Heat {
    n_expert: usize,
    counts: Vec<f32>,
    /// Multiplier applied at every step: 0.5 ^ (1 / half_life).
    decay: f32,
}

impl Heat {
    /// Counts for `n_layer` x `n_expert` experts that halve every `half_life` steps (0: never).
    pub fn new(n_layer: usize, n_expert: usize, half_life: u32) -> Heat {
        Heat {
            n_expert,
            counts: vec![0.0; n_layer * n_expert],
            decay: if half_life == 0 {
                1.0
            } else {
                0.5f32.powf(1.0 / half_life as f32)
            },
        }
    }

    pub fn n_layer(&self) -> usize {
        self.counts.len() / self.n_expert.max(1)
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// The counts of layer `layer`'s experts, by expert index (empty outside the model).
    pub fn layer(&self, layer: usize) -> &[f32] {
        let start = (layer * self.n_expert).min(self.counts.len());
        let end = (start + self.n_expert).min(self.counts.len());
        &self.counts[start..end]
    }

    fn at(&self, id: ExpertId) -> usize {
        id.layer as usize * self.n_expert + id.expert as usize
    }

    /// One token routed to `experts` in `layer`. Ids outside the model are ignored.
    pub fn record(&mut self, layer: u32, experts: &[u32]) {
        for &e in experts {
            let i = self.at(ExpertId::new(layer, e));
            if (e as usize) < self.n_expert && i < self.counts.len() {
                self.counts[i] += 1.0;
            }
        }
    }

    /// The end of an engine step: every count decays.
    pub fn step(&mut self) {
        if self.decay < 1.0 {
            self.counts.iter_mut().for_each(|c| *c *= self.decay);
        }
    }

    pub fn get(&self, id: ExpertId) -> f32 {
        self.counts.get(self.at(id)).copied().unwrap_or(0.0)
    }

    /// Every expert, hottest first; equal heat in (layer, expert) order so plans are stable.
    pub fn ranked(&self) -> Vec<(ExpertId, f32)> {
        let mut v: Vec<(ExpertId, f32)> = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let id = ExpertId::new((i / self.n_expert) as u32, (i % self.n_expert) as u32);
                (id, c)
            })
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_rank_and_halve_with_the_half_life() {
        let mut h = Heat::new(2, 4, 2);
        h.record(0, &[1, 3]);
        h.record(0, &[3]);
        h.record(1, &[0, 9]);
        let top: Vec<ExpertId> = h.ranked().iter().take(3).map(|r| r.0).collect();
        assert_eq!(
            top,
            [
                ExpertId::new(0, 3),
                ExpertId::new(0, 1),
                ExpertId::new(1, 0)
            ]
        );
        assert_eq!((h.n_layer(), h.n_expert()), (2, 4));
        assert_eq!(h.layer(0), [0.0, 1.0, 0.0, 2.0]);
        assert_eq!(h.layer(1), [1.0, 0.0, 0.0, 0.0]);
        assert!(h.layer(2).is_empty(), "outside the model");
        h.step();
        h.step();
        assert!(
            (h.get(ExpertId::new(0, 3)) - 1.0).abs() < 1e-6,
            "two steps = one half-life"
        );
        assert_eq!(h.get(ExpertId::new(7, 0)), 0.0, "outside the model");
        let mut keep = Heat::new(1, 2, 0);
        keep.record(0, &[1]);
        keep.step();
        assert_eq!(
            keep.get(ExpertId::new(0, 1)),
            1.0,
            "half-life 0 never decays"
        );
    }
}
