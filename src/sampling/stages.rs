//! One sampler stage per upstream sampler (`src/llama-sampler.cpp`), each narrowing or reshaping
//! the candidates; the last stage of a chain selects a token.

use std::collections::{HashMap, VecDeque};

use super::candidates::{Candidates, TokenData};
use super::rng::{resolve_seed, Mt19937};

/// Upstream's DRY uses the vocabulary to find every token that contains or starts a sequence
/// breaker.
pub trait DryVocab {
    fn n_tokens(&self) -> usize;
    /// The text of one token with special tokens rendered (`detokenize({id}, true)`).
    fn token_bytes(&self, id: u32) -> Vec<u8>;
    /// Plain tokenization: no BOS, special tokens not parsed.
    fn tokenize_plain(&self, text: &str) -> Vec<u32>;
}

pub struct Penalties {
    last_n: usize,
    repeat: f32,
    freq: f32,
    present: f32,
    prev: VecDeque<u32>,
    counts: HashMap<u32, i32>,
}

impl Penalties {
    /// `None` when the settings disable the stage (upstream installs an empty sampler then).
    pub fn new(last_n: i32, repeat: f32, freq: f32, present: f32) -> Option<Self> {
        let last_n = last_n.max(0) as usize;
        if last_n == 0 || (repeat == 1.0 && freq == 0.0 && present == 0.0) {
            return None;
        }
        Some(Penalties {
            last_n,
            repeat,
            freq,
            present,
            prev: VecDeque::with_capacity(last_n),
            counts: HashMap::new(),
        })
    }

    pub(super) fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
        if self.prev.len() >= self.last_n {
            if let Some(old) = self.prev.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.prev.push_back(token);
    }

    fn apply(&self, cur: &mut Candidates) {
        for t in &mut cur.data {
            let Some(&count) = self.counts.get(&t.id) else {
                continue;
            };
            if t.logit <= 0.0 {
                t.logit *= self.repeat;
            } else {
                t.logit /= self.repeat;
            }
            t.logit -= count as f32 * self.freq + if count > 0 { self.present } else { 0.0 };
        }
        cur.sorted = false;
    }
}

pub struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: i32,
    penalty_last_n: usize,
    /// Head token -> tails that complete a breaker after it.
    breakers: HashMap<u32, Vec<Vec<u32>>>,
    last_tokens: VecDeque<u32>,
}

const DRY_MAX_BREAKER_CHARS: usize = 40;
const DRY_MAX_TAIL_TOKENS: usize = 20;

impl Dry {
    pub fn new(
        vocab: &dyn DryVocab,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        penalty_last_n: i32,
        breakers: &[String],
    ) -> Option<Self> {
        let penalty_last_n = penalty_last_n.max(0) as usize;
        if multiplier == 0.0 || base < 1.0 || penalty_last_n == 0 {
            return None;
        }
        let mut processed: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for breaker in breakers {
            if breaker.is_empty() {
                log::warn!("skipping empty DRY sequence breaker");
                continue;
            }
            let mut bytes = breaker.as_bytes().to_vec();
            if bytes.len() > DRY_MAX_BREAKER_CHARS {
                log::warn!("truncating DRY sequence breaker to {DRY_MAX_BREAKER_CHARS} characters");
                bytes.truncate(DRY_MAX_BREAKER_CHARS);
            }
            overlapping_token_sequences(vocab, &bytes, &mut processed);
        }
        Some(Dry {
            multiplier,
            base,
            allowed_length,
            penalty_last_n,
            breakers: processed,
            last_tokens: VecDeque::with_capacity(penalty_last_n),
        })
    }

    pub(super) fn accept(&mut self, token: u32) {
        if self.last_tokens.len() == self.penalty_last_n {
            self.last_tokens.pop_front();
        }
        self.last_tokens.push_back(token);
    }

    /// The token `i` places from the end (0 = newest).
    fn rat(&self, i: usize) -> u32 {
        self.last_tokens[self.last_tokens.len() - 1 - i]
    }

    fn apply(&self, cur: &mut Candidates) {
        let last_n = self.last_tokens.len().min(self.penalty_last_n);
        if last_n as i32 <= self.allowed_length {
            return;
        }
        // Step 1: the newest breaker limits how far back a repetition may reach.
        let mut rep_limit = last_n as i32;
        for i in 0..last_n {
            let Some(tails) = self.breakers.get(&self.rat(i)) else {
                continue;
            };
            let mut longest: i32 = -1;
            for tail in tails {
                let len = tail.len() as i32;
                if len > longest
                    && len <= i as i32
                    && tail
                        .iter()
                        .enumerate()
                        .all(|(off, &t)| t == self.rat(i - off - 1))
                {
                    longest = len;
                }
            }
            if longest >= 0 {
                rep_limit = i as i32 - longest;
                break;
            }
        }
        if rep_limit < self.allowed_length {
            return;
        }
        // Step 2: Z-algorithm from the end: for each position, how long a suffix of the context
        // also ends there.
        let mut repeat_count = vec![0i32; last_n];
        let last = last_n - 1;
        let (mut lt, mut rt) = (0usize, 0usize);
        for k in 1..last_n {
            if k > rt {
                let mut n = 0;
                while n + k < last_n && self.rat(n) == self.rat(n + k) {
                    n += 1;
                }
                repeat_count[last - k] = (n as i32).min(rep_limit);
                if n > 0 {
                    lt = k;
                    rt = k + n - 1;
                }
            } else {
                let p = k - lt;
                let right_part_len = (rt - k + 1) as i32;
                if repeat_count[last - p] < right_part_len {
                    repeat_count[last - k] = repeat_count[last - p].min(rep_limit);
                } else {
                    let mut i = rt + 1;
                    while i < last_n && self.rat(i) == self.rat(i - k) {
                        i += 1;
                    }
                    repeat_count[last - k] = ((i - k) as i32).min(rep_limit);
                    lt = k;
                    rt = i - 1;
                }
            }
        }
        // Step 3: the token following each repeat would extend it.
        let mut max_repeat: HashMap<u32, i32> = HashMap::new();
        for (i, &len) in repeat_count.iter().enumerate().take(last_n - 1) {
            if len >= self.allowed_length {
                let token = self.rat(last_n - 2 - i);
                let entry = max_repeat.entry(token).or_insert(len);
                if *entry < len {
                    *entry = len;
                }
            }
        }
        // Step 4: penalise, with the exponent clamped so the power stays finite.
        const FLOAT_MAX_LOG: f32 = 88.722_84;
        let max_exponent = if self.base > 1.000_001 {
            (FLOAT_MAX_LOG / self.base.ln()) as i32
        } else {
            0
        };
        for t in &mut cur.data {
            let Some(&len) = max_repeat.get(&t.id) else {
                continue;
            };
            let single_token_breaker = self
                .breakers
                .get(&t.id)
                .is_some_and(|tails| tails.iter().any(Vec::is_empty));
            if single_token_breaker {
                continue;
            }
            let mut exp = len - self.allowed_length;
            if max_exponent > 0 && exp > max_exponent {
                exp = max_exponent;
            }
            t.logit -= self.multiplier * self.base.powi(exp);
        }
        cur.sorted = false;
    }
}

/// Every token that contains `breaker`, or ends with a prefix of it (then with the tokens of the
/// rest of the breaker as the tail to match).
fn overlapping_token_sequences(
    vocab: &dyn DryVocab,
    breaker: &[u8],
    out: &mut HashMap<u32, Vec<Vec<u32>>>,
) {
    for id in 0..vocab.n_tokens() as u32 {
        let word = vocab.token_bytes(id);
        if contains(&word, breaker) {
            out.entry(id).or_default().push(Vec::new());
            continue;
        }
        for pos in 0..word.len() {
            if word[pos] != breaker[0] {
                continue;
            }
            let overlap = (word.len() - pos).min(breaker.len());
            if word[pos..pos + overlap] != breaker[..overlap] {
                continue;
            }
            let rest = String::from_utf8_lossy(&breaker[overlap..]);
            let mut tail = vocab.tokenize_plain(&rest);
            tail.truncate(DRY_MAX_TAIL_TOKENS);
            let tails = out.entry(id).or_default();
            if !tails.contains(&tail) {
                tails.push(tail);
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

pub struct Xtc {
    probability: f32,
    threshold: f32,
    min_keep: usize,
    seed: u32,
    rng: Mt19937,
}

impl Xtc {
    pub fn new(probability: f32, threshold: f32, min_keep: usize, seed: u32) -> Option<Self> {
        if probability <= 0.0 || threshold > 0.5 {
            return None;
        }
        Some(Xtc {
            probability,
            threshold,
            min_keep,
            seed,
            rng: Mt19937::new(resolve_seed(seed)),
        })
    }

    fn apply(&mut self, cur: &mut Candidates) {
        if cur.len() < 2 {
            return;
        }
        if self.rng.uniform_f32() > self.probability {
            return;
        }
        cur.softmax(true);
        let mut pos_last = 0;
        for (i, t) in cur.data.iter().enumerate() {
            if t.p >= self.threshold {
                pos_last = i;
            } else {
                break;
            }
        }
        if cur.len() - pos_last >= self.min_keep && pos_last > 0 {
            cur.data.drain(..pos_last);
        }
    }
}

pub struct Mirostat {
    n_vocab: usize,
    tau: f32,
    eta: f32,
    m: usize,
    mu: f32,
    seed: u32,
    seed_cur: u32,
    rng: Mt19937,
}

impl Mirostat {
    pub fn new(n_vocab: usize, seed: u32, tau: f32, eta: f32, m: usize) -> Self {
        let seed_cur = resolve_seed(seed);
        Mirostat {
            n_vocab,
            tau,
            eta,
            m,
            mu: 2.0 * tau,
            seed,
            seed_cur,
            rng: Mt19937::new(seed_cur),
        }
    }

    fn apply(&mut self, cur: &mut Candidates) {
        cur.softmax(true);
        let (mut sum_ti_bi, mut sum_ti_sq) = (0.0f32, 0.0f32);
        let mut i = 0;
        while i + 1 < self.m && i + 1 < cur.len() {
            let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
            let b_i = (cur.data[i].p / cur.data[i + 1].p).ln();
            sum_ti_bi += t_i * b_i;
            sum_ti_sq += t_i * t_i;
            i += 1;
        }
        let s_hat = sum_ti_bi / sum_ti_sq;
        let epsilon_hat = s_hat - 1.0;
        let k = ((epsilon_hat * 2f32.powf(self.mu))
            / (1.0 - (self.n_vocab as f32).powf(-epsilon_hat)))
        .powf(1.0 / s_hat);
        // A float-to-int conversion saturates in Rust; upstream's is undefined for NaN or huge k,
        // and in practice lands on a value that keeps at least one token.
        cur.keep_top((k as i32).max(1) as usize);
        cur.softmax(true);
        let idx = self.rng.discrete(cur.data.iter().map(|t| t.p));
        cur.selected = Some(idx);
        let observed = -cur.data[idx].p.log2();
        self.mu -= self.eta * (observed - self.tau);
    }
}

pub struct MirostatV2 {
    tau: f32,
    eta: f32,
    mu: f32,
    seed: u32,
    seed_cur: u32,
    rng: Mt19937,
}

impl MirostatV2 {
    pub fn new(seed: u32, tau: f32, eta: f32) -> Self {
        let seed_cur = resolve_seed(seed);
        MirostatV2 {
            tau,
            eta,
            mu: 2.0 * tau,
            seed,
            seed_cur,
            rng: Mt19937::new(seed_cur),
        }
    }

    fn apply(&mut self, cur: &mut Candidates) {
        cur.softmax(true);
        let keep = cur
            .data
            .iter()
            .position(|t| -t.p.log2() > self.mu)
            .unwrap_or(cur.len())
            .max(1);
        cur.data.truncate(keep);
        cur.softmax(true);
        let idx = self.rng.discrete(cur.data.iter().map(|t| t.p));
        cur.selected = Some(idx);
        let observed = -cur.data[idx].p.log2();
        self.mu -= self.eta * (observed - self.tau);
    }
}

#[derive(Clone)]
pub struct Dist {
    seed: u32,
    seed_cur: u32,
    rng: Mt19937,
}

impl Dist {
    pub fn new(seed: u32) -> Self {
        let seed_cur = resolve_seed(seed);
        Dist {
            seed,
            seed_cur,
            rng: Mt19937::new(seed_cur),
        }
    }

    fn apply(&mut self, cur: &mut Candidates) {
        if cur.is_empty() {
            cur.selected = None;
            return;
        }
        cur.selected = Some(0);
        if cur.len() == 1 {
            // One draw per output even here, as upstream keeps its stream aligned.
            self.rng.uniform_f64();
            cur.data[0].p = 1.0;
            return;
        }
        let max_l = if cur.sorted {
            cur.data[0].logit
        } else {
            cur.data
                .iter()
                .skip(1)
                .fold(cur.data[0].logit, |m, t| m.max(t.logit))
        };
        let mut sum = 0.0f64;
        for t in &mut cur.data {
            t.p = (t.logit - max_l).exp();
            sum += f64::from(t.p);
        }
        let target = sum * self.rng.uniform_f64();
        let mut running = 0.0f64;
        let mut found = None;
        for (i, t) in cur.data.iter_mut().enumerate() {
            if found.is_none() {
                running += f64::from(t.p);
                if running >= target {
                    found = Some(i);
                }
            }
            t.p = (f64::from(t.p) / sum) as f32;
        }
        cur.selected = Some(found.unwrap_or(cur.len() - 1));
    }
}

/// One stage of a chain.
pub enum Stage {
    LogitBias(Vec<(u32, f32)>),
    Penalties(Penalties),
    Dry(Dry),
    TopNSigma(f32),
    TopK(usize),
    TypicalP {
        p: f32,
        min_keep: usize,
    },
    TopP {
        p: f32,
        min_keep: usize,
    },
    MinP {
        p: f32,
        min_keep: usize,
    },
    Xtc(Xtc),
    TempExt {
        temp: f32,
        delta: f32,
        exponent: f32,
    },
    Temp(f32),
    Dist(Dist),
    Mirostat(Mirostat),
    MirostatV2(MirostatV2),
}

impl Stage {
    pub fn accept(&mut self, token: u32) {
        match self {
            Stage::Penalties(s) => s.accept(token),
            Stage::Dry(s) => s.accept(token),
            _ => {}
        }
    }

    pub fn apply(&mut self, cur: &mut Candidates) {
        match self {
            Stage::LogitBias(biases) => apply_logit_bias(biases, cur),
            Stage::Penalties(s) => s.apply(cur),
            Stage::Dry(s) => s.apply(cur),
            Stage::TopNSigma(n) => apply_top_n_sigma(*n, cur),
            Stage::TopK(k) => {
                if !cur.sorted {
                    cur.keep_top(*k);
                } else {
                    cur.data.truncate(*k);
                }
            }
            Stage::TypicalP { p, min_keep } => apply_typical(*p, *min_keep, cur),
            Stage::TopP { p, min_keep } => apply_top_p(*p, *min_keep, cur),
            Stage::MinP { p, min_keep } => apply_min_p(*p, *min_keep, cur),
            Stage::Xtc(s) => s.apply(cur),
            Stage::TempExt {
                temp,
                delta,
                exponent,
            } => apply_temp_ext(*temp, *delta, *exponent, cur),
            Stage::Temp(t) => cur.scale_temperature(*t),
            Stage::Dist(s) => s.apply(cur),
            Stage::Mirostat(s) => s.apply(cur),
            Stage::MirostatV2(s) => s.apply(cur),
        }
    }

    /// Re-seeds random stages and forgets history (`llama_sampler_reset`).
    pub fn reset(&mut self) {
        match self {
            Stage::Penalties(s) => {
                s.prev.clear();
                s.counts.clear();
            }
            Stage::Dry(s) => s.last_tokens.clear(),
            Stage::Xtc(s) => s.rng = Mt19937::new(resolve_seed(s.seed)),
            Stage::Dist(s) => {
                s.seed_cur = resolve_seed(s.seed);
                s.rng = Mt19937::new(s.seed_cur);
            }
            Stage::Mirostat(s) => {
                s.mu = 2.0 * s.tau;
                s.seed_cur = resolve_seed(s.seed);
                s.rng = Mt19937::new(s.seed_cur);
            }
            Stage::MirostatV2(s) => {
                s.mu = 2.0 * s.tau;
                s.seed_cur = resolve_seed(s.seed);
                s.rng = Mt19937::new(s.seed_cur);
            }
            _ => {}
        }
    }

    /// The seed a random final stage is using.
    pub fn seed_in_use(&self) -> Option<u32> {
        match self {
            Stage::Dist(s) => Some(s.seed_cur),
            Stage::Mirostat(s) => Some(s.seed_cur),
            Stage::MirostatV2(s) => Some(s.seed_cur),
            _ => None,
        }
    }
}

fn apply_logit_bias(biases: &[(u32, f32)], cur: &mut Candidates) {
    for &(token, bias) in biases {
        let idx = token as usize;
        if idx < cur.len() && cur.data[idx].id == token {
            cur.data[idx].logit += bias;
        } else if let Some(t) = cur.data.iter_mut().find(|t| t.id == token) {
            t.logit += bias;
        }
    }
}

fn apply_top_n_sigma(n: f32, cur: &mut Candidates) {
    if n <= 0.0 || cur.len() <= 1 {
        return;
    }
    let mut max = cur.data[0].logit;
    let mut sum = 0.0f32;
    let mut valid = 0usize;
    for t in &cur.data {
        if t.logit != f32::NEG_INFINITY {
            max = max.max(t.logit);
            sum += t.logit;
            valid += 1;
        }
    }
    let mean = if valid > 0 { sum / valid as f32 } else { 0.0 };
    let mut acc = 0.0f32;
    for t in &cur.data {
        if t.logit != f32::NEG_INFINITY {
            acc += (f64::from(t.logit - mean).powi(2)) as f32;
        }
    }
    let std = if valid > 0 {
        (acc / valid as f32).sqrt()
    } else {
        0.0
    };
    for t in &mut cur.data {
        if t.logit < max - n * std {
            t.logit = f32::NEG_INFINITY;
        }
    }
}

fn apply_typical(p: f32, min_keep: usize, cur: &mut Candidates) {
    if p >= 1.0 {
        return;
    }
    cur.softmax(true);
    let entropy: f32 = cur.data.iter().map(|t| -t.p * t.p.ln()).sum();
    let shifted: Vec<f32> = cur
        .data
        .iter()
        .map(|t| (-t.p.ln() - entropy).abs())
        .collect();
    let mut order: Vec<usize> = (0..cur.len()).collect();
    order.sort_by(|&a, &b| shifted[a].total_cmp(&shifted[b]));
    let mut cum = 0.0f32;
    let mut last = order.len();
    for (i, &idx) in order.iter().enumerate() {
        cum += cur.data[idx].p;
        if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
            last = i + 1;
            break;
        }
    }
    let kept: Vec<TokenData> = order[..last].iter().map(|&i| cur.data[i]).collect();
    cur.data = kept;
    cur.sorted = false;
}

fn apply_top_p(p: f32, min_keep: usize, cur: &mut Candidates) {
    if p >= 1.0 || cur.is_empty() {
        return;
    }
    // Probabilities over the current (possibly unsorted) set, then the smallest prefix of the
    // sorted set that reaches p.
    cur.softmax(false);
    cur.sort();
    let mut cum = 0.0f32;
    let mut last = cur.len();
    for (i, t) in cur.data.iter().enumerate() {
        cum += t.p;
        if cum >= p && i + 1 >= min_keep {
            last = i + 1;
            break;
        }
    }
    cur.data.truncate(last);
}

fn apply_min_p(p: f32, min_keep: usize, cur: &mut Candidates) {
    if p <= 0.0 || cur.is_empty() {
        return;
    }
    if !cur.sorted {
        let max_logit = cur.data.iter().fold(-f32::MAX, |m, t| m.max(t.logit));
        let min_logit = max_logit + p.ln();
        let kept: Vec<TokenData> = cur
            .data
            .iter()
            .filter(|t| t.logit >= min_logit)
            .copied()
            .collect();
        if !kept.is_empty() && kept.len() >= min_keep {
            cur.data = kept;
            return;
        }
        cur.sort();
    }
    let min_logit = cur.data[0].logit + p.ln();
    let mut i = 1;
    while i < cur.len() {
        if cur.data[i].logit < min_logit && i >= min_keep {
            break;
        }
        i += 1;
    }
    cur.data.truncate(i);
}

fn apply_temp_ext(temp: f32, delta: f32, exponent: f32, cur: &mut Candidates) {
    if delta <= 0.0 {
        cur.scale_temperature(temp);
        return;
    }
    let min_temp = (temp - delta).max(0.0);
    let max_temp = temp + delta;
    if cur.len() <= 1 {
        return;
    }
    let max_entropy = -(1.0f32 / cur.len() as f32).ln();
    cur.softmax(true);
    let entropy: f32 = cur
        .data
        .iter()
        .filter(|t| t.p > 0.0)
        .map(|t| -t.p * t.p.ln())
        .sum();
    let normalized = entropy / max_entropy;
    let dyn_temp = min_temp + (max_temp - min_temp) * normalized.powf(exponent);
    cur.scale_temperature(dyn_temp);
    let max_l = f64::from(cur.data[0].logit);
    let mut sum = 0.0f64;
    for t in &mut cur.data {
        let p = (f64::from(t.logit) - max_l).exp();
        t.p = p as f32;
        sum += p;
    }
    for t in &mut cur.data {
        t.p = (f64::from(t.p) / sum) as f32;
    }
}
