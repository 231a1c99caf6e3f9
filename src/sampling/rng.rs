//! The random numbers llama.cpp's samplers draw, bit for bit: the 32-bit Mersenne Twister
//! (`std::mt19937`) and the way GCC's libstdc++ turns its output into uniform reals and discrete
//! choices. Seeded requests therefore pick the same tokens as upstream.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// The seed value that asks for a random seed (`LLAMA_DEFAULT_SEED`).
pub const DEFAULT_SEED: u32 = u32::MAX;

#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    index: usize,
}

impl Mt19937 {
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % N] & LOWER_MASK);
            let mut next = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= MATRIX_A;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `std::uniform_real_distribution<double>(0, 1)`: two draws, low word first.
    pub fn uniform_f64(&mut self) -> f64 {
        let lo = self.next_u32() as f64;
        let hi = self.next_u32() as f64;
        let r = (lo + hi * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        if r >= 1.0 {
            1.0f64.next_down()
        } else {
            r
        }
    }

    /// `std::uniform_real_distribution<float>(0, 1)`: one draw, rounded to float first.
    pub fn uniform_f32(&mut self) -> f32 {
        let r = self.next_u32() as f32 / 4_294_967_296.0f32;
        if r >= 1.0 {
            1.0f32.next_down()
        } else {
            r
        }
    }

    /// `std::discrete_distribution<int>` over `weights`, drawn once: weights are normalised in
    /// double, accumulated, the last sum forced to 1, and the first sum not below a uniform
    /// double wins. Fewer than two weights pick index 0 without drawing.
    pub fn discrete(&mut self, weights: impl Iterator<Item = f32> + Clone) -> usize {
        let count = weights.clone().count();
        if count < 2 {
            return 0;
        }
        let total: f64 = weights.clone().map(f64::from).sum();
        let mut cumulative = Vec::with_capacity(count);
        let mut running = 0.0f64;
        for w in weights {
            running += f64::from(w) / total;
            cumulative.push(running);
        }
        if let Some(last) = cumulative.last_mut() {
            *last = 1.0;
        }
        let u = self.uniform_f64();
        cumulative.partition_point(|&c| c < u)
    }
}

/// The seed a sampler actually uses: the given one, or a fresh one when `DEFAULT_SEED` asks for
/// randomness.
pub fn resolve_seed(seed: u32) -> u32 {
    if seed != DEFAULT_SEED {
        return seed;
    }
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_matches_the_standard_10000th_output() {
        // The C++ standard requires this value for a default-seeded mt19937.
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn uniform_and_discrete_match_libstdcxx() {
        // Recorded from g++ 12 / libstdc++: mt19937(42), uniform_real_distribution<double>,
        // <float>, and discrete_distribution<int>{1, 2, 3, 4} drawn in that order.
        let mut rng = Mt19937::new(42);
        let d = rng.uniform_f64();
        let f = rng.uniform_f32();
        let picks: Vec<usize> = (0..8)
            .map(|_| rng.discrete([1.0f32, 2.0, 3.0, 4.0].into_iter()))
            .collect();
        assert_eq!(format!("{d:.17}"), GOLDEN_F64);
        assert_eq!(format!("{f:.9}"), GOLDEN_F32);
        assert_eq!(picks, GOLDEN_PICKS);
    }

    const GOLDEN_F64: &str = "0.79654298428784598";
    const GOLDEN_F32: &str = "0.950714290";
    const GOLDEN_PICKS: [usize; 8] = [3, 2, 1, 1, 0, 3, 3, 3];
}
