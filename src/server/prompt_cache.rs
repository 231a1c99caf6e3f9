//! Upstream's host-memory prompt cache (`--cache-ram`, `--cache-idle-slots`): when a slot is
//! about to lose most of what it holds to a new task, its tokens, checkpoints and cached
//! sequence are saved in host memory, and a task whose prompt an earlier saved prompt covers
//! better than the slot's own starts from that one instead.
//!
//! The policy is upstream's, step for step (which prompts are kept, which one is taken, which
//! are dropped first), so that the same requests resume from the same points and evaluate the
//! same batches. The sequence itself is the engine's ([`SeqState`]); an engine that cannot save
//! one saves nothing, and the cache stays empty.

use std::collections::VecDeque;

use super::checkpoints::Checkpoints;
use crate::engine::SeqState;

/// One saved prompt.
pub struct Entry<S = SeqState> {
    pub tokens: Vec<u32>,
    pub checkpoints: Checkpoints,
    pub state: S,
    pub bytes: usize,
}

/// The saved prompts, oldest first.
pub struct PromptCache<S = SeqState> {
    entries: VecDeque<Entry<S>>,
    /// Bytes (0: no limit).
    limit_bytes: usize,
    /// Tokens (0: no limit), raised to what `limit_bytes` holds at the mean size per token.
    limit_tokens: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<S> PromptCache<S> {
    /// `cache_ram_mib` as `--cache-ram` gives it (-1: no limit) and the server's total context.
    pub fn new(cache_ram_mib: i32, n_ctx: usize) -> Self {
        PromptCache {
            entries: VecDeque::new(),
            limit_bytes: 1024 * 1024 * cache_ram_mib.max(0) as usize,
            limit_tokens: n_ctx,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    fn n_tokens(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }

    /// Whether a saved prompt already holds all of `tokens` (an empty prompt counts as held):
    /// then it is not saved again.
    pub fn holds(&self, tokens: &[u32]) -> bool {
        tokens.is_empty()
            || self
                .entries
                .iter()
                .any(|e| common_prefix(&e.tokens, tokens) == tokens.len())
    }

    /// Whether a prompt of `bytes` alone exceeds the limit (it is not saved).
    pub fn too_big(&self, bytes: usize) -> bool {
        self.limit_bytes > 0 && bytes > self.limit_bytes
    }

    /// Saves a prompt neither held nor too big: saved prompts it holds whole go, then the
    /// oldest while the limit needs room.
    pub fn save(&mut self, entry: Entry<S>) {
        let tokens = &entry.tokens;
        self.entries
            .retain(|e| common_prefix(&e.tokens, tokens) != e.tokens.len());
        if self.limit_bytes > 0 {
            while !self.entries.is_empty() && self.bytes() + entry.bytes > self.limit_bytes {
                self.entries.pop_front();
            }
        }
        self.entries.push_back(entry);
    }

    /// The saved prompt to start a task of `prompt` from, taken out of the cache: the one that
    /// keeps a larger share of itself and covers more of the prompt than the slot's own
    /// (`slot` tokens), and keeps at least a quarter of itself.
    pub fn take_better(&mut self, slot: &[u32], prompt: &[u32]) -> Option<Entry<S>> {
        let lcp = common_prefix(slot, prompt);
        let mut f_keep_best = if slot.is_empty() {
            -1.0
        } else {
            lcp as f32 / slot.len() as f32
        };
        let mut f_sim_best = lcp as f32 / prompt.len() as f32;
        let mut best = None;
        for (i, e) in self.entries.iter().enumerate() {
            let lcp = common_prefix(&e.tokens, prompt);
            let f_keep = lcp as f32 / e.tokens.len() as f32;
            let f_sim = lcp as f32 / prompt.len() as f32;
            // don't trash large prompts
            if f_keep < 0.25 {
                continue;
            }
            if f_keep_best < f_keep && f_sim_best < f_sim {
                f_keep_best = f_keep;
                f_sim_best = f_sim;
                best = Some(i);
            }
        }
        best.and_then(|i| self.entries.remove(i))
    }

    /// Drops the oldest prompts beyond the limits.
    pub fn trim(&mut self) {
        if self.limit_bytes > 0 {
            while !self.entries.is_empty() && self.bytes() > self.limit_bytes {
                self.entries.pop_front();
            }
        }
        let per_token = (self.bytes() as f32 / self.n_tokens().max(1) as f32).max(1.0);
        let limit_tokens = if self.limit_bytes > 0 {
            self.limit_tokens
                .max((self.limit_bytes as f32 / per_token) as usize)
        } else {
            self.limit_tokens
        };
        if self.limit_tokens > 0 {
            while !self.entries.is_empty() && self.n_tokens() > limit_tokens {
                self.entries.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tokens: &[u32], bytes: usize) -> Entry<()> {
        Entry {
            tokens: tokens.to_vec(),
            checkpoints: Checkpoints::default(),
            state: (),
            bytes,
        }
    }

    #[test]
    fn a_prompt_held_whole_is_not_saved_again_and_replaces_its_prefixes() {
        let mut c = PromptCache::<()>::new(8192, 4096);
        assert!(!c.holds(&[1, 2, 3]));
        c.save(entry(&[1, 2, 3], 10));
        assert!(c.holds(&[1, 2]), "held whole by [1, 2, 3]");
        assert!(c.holds(&[]));
        assert!(!c.holds(&[1, 2, 3, 4]));
        c.save(entry(&[1, 2, 3, 4], 10));
        assert_eq!(c.len(), 1, "[1, 2, 3] is held whole by the new one");
        let mut small = PromptCache::<()>::new(1, 4096);
        assert!(small.too_big(2 << 20), "over the limit alone");
        assert!(
            !PromptCache::<()>::new(-1, 4096).too_big(usize::MAX),
            "no limit"
        );
        small.save(entry(&[5], 600 << 10));
        small.save(entry(&[6], 600 << 10));
        assert_eq!(small.len(), 1, "the oldest made room");
    }

    #[test]
    fn the_better_prompt_must_keep_more_of_itself_and_cover_more() {
        let mut c = PromptCache::<()>::new(8192, 4096);
        c.save(entry(&[1, 2, 3, 4, 5, 6, 7, 8], 8));
        c.save(entry(&[9, 9, 9, 9], 4));
        // the slot holds an unrelated prompt: [1..8] covers 3 of 4 prompt tokens, keeps 3/8
        let got = c
            .take_better(&[7, 7], &[1, 2, 3, 0])
            .expect("a better prompt");
        assert_eq!(got.tokens, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(c.len(), 1, "taken out");
        // keeping less than a quarter of itself: not taken
        c.save(entry(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], 13));
        assert!(c.take_better(&[], &[1, 2, 3, 0]).is_none());
        // the slot's own prompt already covers as much
        c.save(entry(&[4, 5, 6], 3));
        assert!(c.take_better(&[4, 5, 6, 7], &[4, 5, 6, 1]).is_none());
        // an empty slot takes any that keeps a quarter and covers something
        assert!(c.take_better(&[], &[4, 5, 1]).is_some());
    }

    #[test]
    fn trimming_drops_the_oldest_beyond_the_token_limit() {
        let mut c = PromptCache::<()>::new(0, 10);
        c.save(entry(&[1; 6], 1));
        c.save(entry(&[2; 6], 1));
        c.trim();
        assert_eq!(c.len(), 1);
        assert_eq!(c.entries[0].tokens, [2; 6]);
    }
}
