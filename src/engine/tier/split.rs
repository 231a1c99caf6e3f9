//! How a small step shares its host experts between the CPU and the card. The CPU reads host
//! memory at its own speed; the card's copy engine reads the same page-locked memory over the
//! bus at another, and the two add up. So in each layer step some of the routed host experts are
//! copied onto the card and multiplied there while the CPU computes the others, in the same step.
//! How many go to the card follows both sides' measured cost per expert (moving averages, so
//! the split tracks the machine it runs on): the count that makes the slower side finish
//! soonest. Each side keeps at least one expert of a step that has two or more, so both costs
//! stay measured: an early slow measurement (a cold first step) must not starve a side of the
//! work that would correct it.

/// The card's share of a layer step's host experts, from both sides' measured costs.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Microseconds per expert on the CPU and on the card (copy and products), once measured.
    cpu_us: Option<f64>,
    card_us: Option<f64>,
    /// Experts sent before both costs are known.
    start: usize,
    /// The most one step may send (the card buffers' capacity).
    max: usize,
    /// A fixed count that does not adapt (for measuring).
    fixed: Option<usize>,
}

/// Weight of a new measurement in the moving averages.
const WEIGHT: f64 = 1.0 / 16.0;

fn average(avg: &mut Option<f64>, x: f64) {
    *avg = Some(match *avg {
        Some(a) => a + WEIGHT * (x - a),
        None => x,
    });
}

impl Split {
    /// A split that sends `start` experts a step until both sides are measured, and at most
    /// `max`; `fixed` pins the count instead.
    pub fn new(start: usize, max: usize, fixed: Option<usize>) -> Split {
        Split {
            cpu_us: None,
            card_us: None,
            start: start.min(max),
            max,
            fixed: fixed.map(|f| f.min(max)),
        }
    }

    /// Experts to send to the card when the step has `host` distinct host experts: the count
    /// whose slower side finishes soonest (fewer sent among equals), each side keeping one
    /// when there are two or more.
    pub fn count(&self, host: usize) -> usize {
        if let Some(f) = self.fixed {
            return f.min(host).min(self.max);
        }
        let (lo, top) = if host >= 2 {
            (1, (host - 1).min(self.max))
        } else {
            (0, host.min(self.max))
        };
        let (Some(p), Some(c)) = (self.cpu_us, self.card_us) else {
            return self.start.clamp(lo.min(top), top);
        };
        let cost = |m: usize| (m as f64 * c).max((host - m) as f64 * p);
        (lo.min(top)..=top).fold(
            lo.min(top),
            |best, m| {
                if cost(m) < cost(best) {
                    m
                } else {
                    best
                }
            },
        )
    }

    /// The CPU computed `experts` experts in `us` microseconds.
    pub fn cpu(&mut self, experts: usize, us: f64) {
        if experts > 0 {
            average(&mut self.cpu_us, us / experts as f64);
        }
    }

    /// The card copied and multiplied `experts` experts in `us` microseconds.
    pub fn card(&mut self, experts: usize, us: f64) {
        if experts > 0 {
            average(&mut self.card_us, us / experts as f64);
        }
    }

    /// The measured costs per expert (CPU, card), in microseconds.
    pub fn costs(&self) -> (Option<f64>, Option<f64>) {
        (self.cpu_us, self.card_us)
    }
}

/// The distinct experts of `pairs` (`(token, expert)`) in the order they go to the card: those
/// most tokens chose first (each is read once for all of them on either side, and the card's
/// product costs little per token), lower indices first among equals.
pub fn by_use(pairs: &[(usize, usize)]) -> Vec<usize> {
    let mut counts: Vec<(usize, usize)> = Vec::new();
    for &(_, x) in pairs {
        match counts.iter_mut().find(|c| c.0 == x) {
            Some(c) => c.1 += 1,
            None => counts.push((x, 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    counts.into_iter().map(|c| c.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of `k` host experts on sides costing `cpu_us` and `card_us` per expert (with a
    /// little noise): the counts the split chose.
    fn serve(split: &mut Split, k: usize, cpu_us: f64, card_us: f64, steps: usize) -> Vec<usize> {
        let mut seen = Vec::new();
        for i in 0..steps {
            let m = split.count(k);
            seen.push(m);
            let noise = 1.0 + 0.1 * ((i * 7919 % 13) as f64 / 13.0 - 0.5);
            split.cpu(k - m, (k - m) as f64 * cpu_us * noise);
            split.card(m, m as f64 * card_us / noise);
        }
        seen
    }

    #[test]
    fn the_count_balances_both_sides() {
        // CPU 44 us an expert, card 53: of 8, 4 to the card (max(212, 176)) beats 3
        // (max(159, 220))
        let mut s = Split::new(2, 8, None);
        let seen = serve(&mut s, 8, 44.0, 53.0, 100);
        assert_eq!(
            seen[0], 2,
            "the starting count until both sides are measured"
        );
        assert!(seen[50..].iter().all(|&m| m == 4), "{:?}", &seen[50..]);
        // a card twice as fast takes two thirds
        let mut s = Split::new(2, 8, None);
        let seen = serve(&mut s, 9, 40.0, 20.0, 100);
        assert!(seen[50..].iter().all(|&m| m == 6), "{:?}", &seen[50..]);
    }

    #[test]
    fn a_slow_side_keeps_one_expert_and_stays_measured() {
        let mut s = Split::new(3, 8, None);
        let seen = serve(&mut s, 8, 10.0, 1000.0, 50);
        assert!(seen[1..].iter().all(|&m| m == 1), "{seen:?}");
        let mut s = Split::new(3, 8, None);
        let seen = serve(&mut s, 8, 100.0, 1.0, 50);
        assert!(seen[1..].iter().all(|&m| m == 7), "{seen:?}");
        // a step with one host expert may send it
        assert_eq!(s.count(1), 1);
        assert_eq!(Split::new(3, 8, None).count(1), 1);
    }

    #[test]
    fn a_cold_first_step_does_not_starve_the_cpu() {
        // the first CPU measurement is ten times its cost (the card then looks faster), later
        // ones are true: the count comes back to the balance
        let mut s = Split::new(2, 8, None);
        s.cpu(6, 6.0 * 460.0);
        s.card(2, 2.0 * 71.0);
        assert_eq!(s.count(8), 7);
        let seen = serve(&mut s, 8, 46.0, 71.0, 200);
        assert!(seen[150..].iter().all(|&m| m == 3), "{:?}", &seen[150..]);
    }

    #[test]
    fn counts_respect_the_step_and_the_buffers() {
        let mut s = Split::new(6, 4, None);
        assert_eq!(s.count(8), 4, "no more than the buffers hold");
        assert_eq!(
            s.count(2),
            1,
            "the CPU keeps one of the step's host experts"
        );
        s.cpu(4, 400.0);
        s.card(2, 2.0);
        assert_eq!(s.count(8), 4);
        assert_eq!(s.count(0), 0);
        let mut f = Split::new(0, 8, Some(3));
        f.cpu(8, 800.0);
        f.card(1, 1000.0);
        assert_eq!(f.count(8), 3, "a fixed count does not adapt");
        assert_eq!(Split::new(0, 8, Some(0)).count(8), 0);
    }

    #[test]
    fn the_most_shared_experts_go_first() {
        let pairs = [(0, 7), (0, 3), (1, 3), (1, 9), (2, 9), (2, 3), (3, 1)];
        assert_eq!(by_use(&pairs), vec![3, 9, 1, 7]);
        assert_eq!(by_use(&[]), Vec::<usize>::new());
    }
}
