//! Which experts get card copies when the cards hold only some of a model's experts.
//!
//! Decode pays twice for a layer with host experts: the host's time on each routed host expert,
//! and a round trip (the card stops, the host computes, the card resumes) in every step that
//! routes to any host expert at all. Copies spread thinly over every layer cut the first and
//! keep the second in every layer; the same copies gathered into whole layers take those layers
//! off the host path entirely. The fill here weighs both: each move copies the next expert of
//! one layer, or completes a layer, whichever saves the most expected host time per byte, with
//! the layer's routing shares (its routing counts, or even routing without them) deciding what a
//! copy saves. A round trip costs `round_trip` host experts; at 0 the copies spread evenly (or
//! hottest first), as bloomery planned them before the round trip was weighed.

/// How the fill weighs a layer's round trip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyPolicy {
    /// A decode step's round trip through the host, in host experts' time. Session 20 on the
    /// H200: the card's part of a round trip (waiting for the layer's head, sending the results
    /// back) ~90-120 us, against ~26 us an expert on the host path (CPU and card share
    /// together), so about 4.
    pub round_trip: f64,
}

impl CopyPolicy {
    pub const LAYERS: CopyPolicy = CopyPolicy { round_trip: 4.0 };
    pub const SPREAD: CopyPolicy = CopyPolicy { round_trip: 0.0 };

    /// `BLOOMERY_EXPERT_COPIES`: `layers` (the default) or `spread`.
    pub fn parse(s: &str) -> Option<CopyPolicy> {
        match s {
            "layers" => Some(CopyPolicy::LAYERS),
            "spread" => Some(CopyPolicy::SPREAD),
            _ => None,
        }
    }
}

impl Default for CopyPolicy {
    fn default() -> Self {
        CopyPolicy::LAYERS
    }
}

/// One layer's expected decode cost, in host experts' time, as a function of how many of its
/// experts (the most routed first) have card copies.
struct LayerCost {
    /// Experts, the most routed first.
    ranked: Vec<u32>,
    /// `share[i]`: the share of routes `ranked[i]` takes (kept beside `covered` rather than
    /// differenced from it, so experts of equal share give exactly equal gains and tie).
    share: Vec<f64>,
    /// `covered[s]`: the share of routes the first `s` ranked experts take.
    covered: Vec<f64>,
    n_used: f64,
    round_trip: f64,
}

impl LayerCost {
    fn new(counts: Option<&[u64]>, n_expert: u32, n_used: u32, round_trip: f64) -> LayerCost {
        let n = n_expert as usize;
        let counts: Vec<u64> = (0..n)
            .map(|e| counts.and_then(|c| c.get(e)).copied().unwrap_or(0))
            .collect();
        let total: u64 = counts.iter().sum();
        let mut ranked: Vec<u32> = (0..n_expert).collect();
        // stable: equal counts keep expert order
        ranked.sort_by_key(|&e| std::cmp::Reverse(counts[e as usize]));
        let share: Vec<f64> = ranked
            .iter()
            .map(|&e| match total {
                0 => 1.0 / n as f64,
                t => counts[e as usize] as f64 / t as f64,
            })
            .collect();
        let mut covered = vec![0.0];
        let mut acc = 0.0;
        for &x in &share {
            acc += x;
            covered.push(acc.min(1.0));
        }
        LayerCost {
            ranked,
            share,
            covered,
            n_used: n_used.max(1) as f64,
            round_trip,
        }
    }

    /// The chance that a decoded token routes to some expert without a copy when the first `s`
    /// ranked experts have one (the token's `n_used` choices taken as independent draws).
    fn trip(&self, s: usize) -> f64 {
        if s >= self.ranked.len() {
            0.0
        } else {
            1.0 - self.covered[s].powf(self.n_used)
        }
    }

    /// What copying the next ranked expert saves: its routes, and the round trips it spares.
    fn next_gain(&self, s: usize) -> f64 {
        self.n_used * self.share[s] + self.round_trip * (self.trip(s) - self.trip(s + 1))
    }

    /// What copying every expert from the `s`-th on saves.
    fn rest_gain(&self, s: usize) -> f64 {
        self.n_used * (1.0 - self.covered[s]).max(0.0) + self.round_trip * self.trip(s)
    }
}

/// The experts each layer gets copies of. `card[il]` is the card that layer `il` copies to
/// (`None`: the layer takes no copies); `room[c]` is what card `c` has left, and shrinks by what
/// the copies take; `copy_bytes(il, count)` is what `count` copies of layer `il` take. `heat`
/// gives routing counts per layer and expert when known. Each layer's experts come back sorted.
pub fn choose(
    card: &[Option<usize>],
    n_expert: u32,
    n_used: u32,
    heat: Option<&[Vec<u64>]>,
    copy_bytes: &dyn Fn(u32, usize) -> u64,
    room: &mut [u64],
    policy: CopyPolicy,
) -> Vec<Vec<u32>> {
    let n = n_expert as usize;
    let costs: Vec<LayerCost> = (0..card.len())
        .map(|il| {
            let counts = heat.and_then(|h| h.get(il)).map(|c| c.as_slice());
            LayerCost::new(counts, n_expert, n_used, policy.round_trip)
        })
        .collect();
    let mut have = vec![0usize; card.len()];
    while let Some(m) = best_move(card, &costs, &have, n, copy_bytes, room) {
        if let Some(c) = card[m.layer] {
            room[c] -= m.bytes;
        }
        have[m.layer] = m.to;
    }
    have.iter()
        .zip(&costs)
        .map(|(&s, cost)| {
            let mut experts = cost.ranked[..s].to_vec();
            experts.sort_unstable();
            experts
        })
        .collect()
}

/// Copying experts of `layer` until it has `to` copies.
#[derive(Clone, Copy, Debug)]
struct Move {
    layer: usize,
    to: usize,
    bytes: u64,
    /// Host experts' time saved per byte.
    gain: f64,
}

/// The move that saves the most per byte and fits: the next copy of a layer, or all its missing
/// ones. Ties go to the layer with fewer copies (so equal layers fill evenly), then to the
/// earlier layer, then to the smaller move. Earlier layers first, where upstream's `-ncmoe`
/// keeps the last layers' experts on the card: a prompt pass starts streaming the first host
/// layers' experts through the ring while the card computes the whole layers before them.
fn best_move(
    card: &[Option<usize>],
    costs: &[LayerCost],
    have: &[usize],
    n: usize,
    copy_bytes: &dyn Fn(u32, usize) -> u64,
    room: &[u64],
) -> Option<Move> {
    let mut best: Option<Move> = None;
    for (layer, c) in card.iter().enumerate() {
        let s = have[layer];
        let Some(&left) = c.and_then(|c| room.get(c)) else {
            continue;
        };
        if s >= n {
            continue;
        }
        let at = |count: usize| copy_bytes(layer as u32, count);
        let cost = &costs[layer];
        // completing a layer in one move only differs from copy after copy by the round trip
        let tos: &[usize] = if s + 1 == n || cost.round_trip == 0.0 {
            &[s + 1]
        } else {
            &[s + 1, n]
        };
        for &to in tos {
            let bytes = at(to) - at(s);
            if bytes > left {
                continue;
            }
            let saved = if to == s + 1 {
                cost.next_gain(s)
            } else {
                cost.rest_gain(s)
            };
            let gain = saved / bytes.max(1) as f64;
            let m = Move {
                layer,
                to,
                bytes,
                gain,
            };
            if best.is_none_or(|b| before(&m, &b, have)) {
                best = Some(m);
            }
        }
    }
    best
}

/// Whether move `a` goes before move `b` (see [`best_move`]).
fn before(a: &Move, b: &Move, have: &[usize]) -> bool {
    if a.gain != b.gain {
        return a.gain > b.gain;
    }
    let key = |m: &Move| (have[m.layer], m.layer, m.to);
    key(a) < key(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// `n` experts of 1 MiB in every layer.
    fn bytes(_il: u32, count: usize) -> u64 {
        count as u64 * MIB
    }

    fn counts(chosen: &[Vec<u32>]) -> Vec<usize> {
        chosen.iter().map(|e| e.len()).collect()
    }

    /// `n_layer` layers of 16 experts (8 used) on card 0 with `room` MiB: the experts chosen
    /// and the room left.
    fn fill(
        n_layer: usize,
        room: u64,
        heat: Option<&[Vec<u64>]>,
        policy: CopyPolicy,
    ) -> (Vec<Vec<u32>>, u64) {
        let mut room = vec![room * MIB];
        let got = choose(
            &vec![Some(0); n_layer],
            16,
            8,
            heat,
            &bytes,
            &mut room,
            policy,
        );
        (got, room[0])
    }

    #[test]
    fn even_routing_fills_whole_layers_from_the_back_or_spreads() {
        // room for 2.5 layers; what is left after the whole layers goes to the layer after them
        let (whole, left) = fill(6, 40, None, CopyPolicy::LAYERS);
        assert_eq!((counts(&whole), left), (vec![16, 16, 8, 0, 0, 0], 0));
        assert_eq!(whole[0], (0..16).collect::<Vec<_>>());
        // spread: round robin over the layers: expert 0 of each, then 1, ...
        let (spread, left) = fill(6, 40, None, CopyPolicy::SPREAD);
        assert_eq!((counts(&spread), left), (vec![7, 7, 7, 7, 6, 6], 0));
        assert_eq!(spread[5], (0..6).collect::<Vec<_>>());
    }

    #[test]
    fn concentrated_routing_takes_the_hot_experts_of_every_layer() {
        // each layer routes almost everything to experts 3 and 9: two copies a layer serve
        // nearly every route and leave the round trip rare, which beats whole layers
        let mut heat = vec![vec![1u64; 16]; 6];
        for h in &mut heat {
            h[3] = 10_000;
            h[9] = 10_000;
        }
        let card = vec![Some(0); 6];
        let mut room = vec![12 * MIB];
        let got = choose(
            &card,
            16,
            2,
            Some(&heat),
            &bytes,
            &mut room,
            CopyPolicy::LAYERS,
        );
        assert!(got.iter().all(|e| e == &vec![3, 9]), "{got:?}");
    }

    #[test]
    fn layers_without_a_card_or_room_get_nothing() {
        let card = vec![None, Some(0), Some(1), None];
        let mut room = vec![20 * MIB, 3 * MIB];
        let got = choose(&card, 16, 8, None, &bytes, &mut room, CopyPolicy::LAYERS);
        assert_eq!(counts(&got), vec![0, 16, 3, 0]);
        assert_eq!(room, vec![4 * MIB, 0]);
    }

    #[test]
    fn nothing_fits_nothing_copied() {
        let (got, left) = fill(3, 0, None, CopyPolicy::LAYERS);
        assert_eq!(counts(&got), vec![0, 0, 0]);
        assert_eq!(left, 0);
    }

    #[test]
    fn spread_policy_takes_the_hottest_first() {
        let mut heat = vec![vec![0u64; 16]; 4];
        heat[1][12] = 50;
        heat[1][13] = 40;
        heat[3][2] = 45;
        let (got, _) = fill(4, 7, Some(&heat), CopyPolicy::SPREAD);
        // the three hot experts, then the layers without counts (taken as even routing) round
        // robin; the other experts of layers 1 and 3 take no routes, so they come last
        assert_eq!(got, vec![vec![0, 1], vec![12, 13], vec![0, 1], vec![2]]);
    }

    #[test]
    fn partly_skewed_layers_mix_hot_copies_and_whole_layers() {
        // layer 0 routes 97% of its routes to 4 experts, layers 1-3 evenly; room for 20 copies:
        // the 4 hot experts, then one whole layer, the first of the others
        let mut heat = vec![vec![0u64; 16]; 4];
        heat[0] = vec![1; 16];
        heat[0][..4].copy_from_slice(&[100, 100, 100, 100]);
        let (got, _) = fill(4, 20, Some(&heat), CopyPolicy::LAYERS);
        assert_eq!(got[0], vec![0, 1, 2, 3]);
        assert_eq!(counts(&got), vec![4, 16, 0, 0]);
    }

    #[test]
    fn gains_of_a_layer_add_up() {
        let l = LayerCost::new(None, 16, 8, 4.0);
        // copying every expert saves the host's 8 experts a token and the round trip
        assert!((l.rest_gain(0) - 12.0).abs() < 1e-9);
        let steps: f64 = (0..16).map(|s| l.next_gain(s)).sum();
        assert!((steps - 12.0).abs() < 1e-9);
        // the round trip is spared only near the end: the last copy saves the most
        assert!(l.next_gain(15) > l.next_gain(0));
        assert!(l.rest_gain(0) / 16.0 > l.next_gain(0));
    }
}
