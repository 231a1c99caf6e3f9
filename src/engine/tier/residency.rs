//! Which experts hold the card's expert slots, and which swaps to start between steps. A swap
//! moves a host expert into a slot: the slot's old expert stops being served from the card when
//! the copy starts, and the new one is served from the card once the copy has landed, so a step
//! never reads a half-written slot. Swaps are proposed only when the incoming expert is hotter
//! than the outgoing one by a margin and by more than counting noise, so experts of similar heat
//! do not trade places every step (on the card, even routing with a looser rule copied an expert
//! into a slot 14 times a step and slowed decode by 12-26%).

use std::collections::HashMap;

use super::heat::Heat;
use super::ExpertId;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Swap {
    pub slot: usize,
    /// The expert the slot held, now served from the host again.
    pub evict: Option<ExpertId>,
    pub load: ExpertId,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Slot {
    Free,
    Holds(ExpertId),
    /// A copy of this expert is in flight.
    Loading(ExpertId),
}

/// Whether an expert of heat `hot` should displace one of heat `cold`: hotter by the margin,
/// and by more than the noise of counting routes (three standard deviations of the difference
/// of two Poisson counts), so experts that decode uses about equally do not trade places on
/// chance.
fn worth_swapping(hot: f32, cold: f32, margin: f32) -> bool {
    hot - cold > margin * cold + 3.0 * (hot + cold).sqrt() + 0.5
}

pub struct Residency {
    slots: Vec<Slot>,
    served: HashMap<ExpertId, usize>,
}

impl Residency {
    pub fn new(n_slots: usize) -> Residency {
        Residency {
            slots: vec![Slot::Free; n_slots],
            served: HashMap::new(),
        }
    }

    /// Slot `slot` holds `id` already (what the plan copied at load); a slot out of range is
    /// ignored.
    pub fn seed(&mut self, slot: usize, id: ExpertId) {
        if slot < self.slots.len() {
            if let Slot::Holds(old) = self.slots[slot] {
                self.served.remove(&old);
            }
            self.slots[slot] = Slot::Holds(id);
            self.served.insert(id, slot);
        }
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// The slot that serves `id` from the card, if one does.
    pub fn slot_of(&self, id: ExpertId) -> Option<usize> {
        self.served.get(&id).copied()
    }

    /// Up to `max` swaps that bring the card's slots closer to holding the hottest experts.
    /// `margin` is the hysteresis: an expert displaces another only when hotter by more than
    /// `margin` times the other's heat (plus a small absolute term, so cold ties never swap).
    pub fn plan(&self, heat: &Heat, max: usize, margin: f32) -> Vec<Swap> {
        let n = self.slots.len();
        let ranked = heat.ranked();
        let in_flight = |id: ExpertId| self.slots.contains(&Slot::Loading(id));
        let wanted: Vec<(ExpertId, f32)> = ranked
            .iter()
            .take(n)
            .filter(|(id, h)| *h > 0.0 && !self.served.contains_key(id) && !in_flight(*id))
            .copied()
            .collect();
        let mut free: Vec<usize> = (0..n).filter(|&s| self.slots[s] == Slot::Free).collect();
        free.reverse();
        // resident experts outside the hottest n, coldest first
        let top: Vec<ExpertId> = ranked.iter().take(n).map(|r| r.0).collect();
        let mut victims: Vec<(ExpertId, usize, f32)> = self
            .served
            .iter()
            .filter(|(id, _)| !top.contains(id))
            .map(|(&id, &slot)| (id, slot, heat.get(id)))
            .collect();
        victims.sort_by(|a, b| b.2.total_cmp(&a.2).then(b.0.cmp(&a.0)));
        let mut swaps = Vec::new();
        for (load, h) in wanted {
            if swaps.len() == max {
                break;
            }
            if let Some(slot) = free.pop() {
                swaps.push(Swap {
                    slot,
                    evict: None,
                    load,
                });
                continue;
            }
            match victims.last() {
                Some(&(evict, slot, cold)) if worth_swapping(h, cold, margin) => {
                    victims.pop();
                    swaps.push(Swap {
                        slot,
                        evict: Some(evict),
                        load,
                    });
                }
                _ => break,
            }
        }
        swaps
    }

    /// The copy of `swap` starts: the evicted expert is served from the host from now on.
    pub fn begin(&mut self, swap: &Swap) {
        if let Some(e) = swap.evict {
            self.served.remove(&e);
        }
        self.slots[swap.slot] = Slot::Loading(swap.load);
    }

    /// The copy into `slot` has landed: its expert is served from the card.
    pub fn complete(&mut self, slot: usize) {
        if let Some(Slot::Loading(id)) = self.slots.get(slot).copied() {
            self.slots[slot] = Slot::Holds(id);
            self.served.insert(id, slot);
        }
    }

    /// Experts served from the card.
    pub fn resident(&self) -> usize {
        self.served.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heat_of(rows: &[&[u32]], n_expert: usize) -> Heat {
        let mut h = Heat::new(1, n_expert, 0);
        for r in rows {
            h.record(0, r);
        }
        h
    }

    /// `rows` routed `times` times over.
    fn heat_times(rows: &[&[u32]], times: usize, n_expert: usize) -> Heat {
        let mut h = Heat::new(1, n_expert, 0);
        for _ in 0..times {
            for r in rows {
                h.record(0, r);
            }
        }
        h
    }

    fn apply(r: &mut Residency, swaps: &[Swap]) {
        for s in swaps {
            r.begin(s);
        }
        for s in swaps {
            r.complete(s.slot);
        }
    }

    #[test]
    fn free_slots_take_the_hottest_experts_first() {
        let heat = heat_of(&[&[3, 1], &[3, 2], &[3, 1]], 4);
        let mut r = Residency::new(2);
        let swaps = r.plan(&heat, 8, 0.25);
        let loads: Vec<u32> = swaps.iter().map(|s| s.load.expert).collect();
        assert_eq!(loads, [3, 1]);
        assert!(swaps.iter().all(|s| s.evict.is_none()));
        apply(&mut r, &swaps);
        assert_eq!(r.resident(), 2);
        assert!(r.plan(&heat, 8, 0.25).is_empty(), "already the hottest two");
    }

    #[test]
    fn a_hotter_expert_displaces_the_coldest_only_past_the_margin() {
        let mut r = Residency::new(2);
        let heat = heat_of(&[&[0, 1], &[0, 1]], 4);
        let swaps = r.plan(&heat, 8, 0.25);
        apply(&mut r, &swaps);
        // expert 2 hotter than 1 (30 routes to 20): within the margin and the counting noise,
        // nothing moves
        let close = heat_times(&[&[0, 1], &[0, 1], &[0, 2], &[2], &[2]], 10, 4);
        assert!(r.plan(&close, 8, 0.5).is_empty());
        // 8 to 2 is a clear lead in proportion but not past the noise of so few routes
        let few = heat_times(&[&[0, 1], &[0, 2], &[0, 2], &[2], &[2], &[2], &[2]], 2, 4);
        assert!(r.plan(&few, 8, 0.5).is_empty());
        // 60 to 10: it takes the coldest slot
        let hot = heat_times(&[&[0, 1], &[0, 2], &[0, 2], &[2], &[2], &[2], &[2]], 10, 4);
        let swaps = r.plan(&hot, 8, 0.5);
        assert_eq!(swaps.len(), 1);
        assert_eq!(swaps[0].evict, Some(ExpertId::new(0, 1)));
        assert_eq!(swaps[0].load, ExpertId::new(0, 2));
    }

    #[test]
    fn a_slot_in_flight_serves_nobody_and_is_not_planned_twice() {
        let mut r = Residency::new(1);
        let heat = heat_of(&[&[1], &[1]], 2);
        let swaps = r.plan(&heat, 1, 0.0);
        r.begin(&swaps[0]);
        assert_eq!(
            r.slot_of(ExpertId::new(0, 1)),
            None,
            "not served until it lands"
        );
        assert!(
            r.plan(&heat, 1, 0.0).is_empty(),
            "the copy is already in flight"
        );
        r.complete(swaps[0].slot);
        assert_eq!(r.slot_of(ExpertId::new(0, 1)), Some(0));
        // an eviction stops serving the old expert as soon as the copy starts
        let heat = heat_times(&[&[0], &[0], &[0], &[0], &[0], &[0]], 5, 2);
        let swaps = r.plan(&heat, 1, 0.25);
        assert_eq!(swaps[0].evict, Some(ExpertId::new(0, 1)));
        r.begin(&swaps[0]);
        assert_eq!(r.slot_of(ExpertId::new(0, 1)), None);
        assert_eq!(r.slot_of(ExpertId::new(0, 0)), None);
        r.complete(0);
        assert_eq!(r.slot_of(ExpertId::new(0, 0)), Some(0));
    }

    #[test]
    fn cold_experts_never_take_slots() {
        let r = Residency::new(4);
        assert!(r.plan(&Heat::new(2, 8, 0), 8, 0.25).is_empty());
    }
}
