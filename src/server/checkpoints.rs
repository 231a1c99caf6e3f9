//! Upstream's context checkpoints, kept for the prompt batches they shape.
//!
//! For a model with sliding-window attention, llama-server snapshots the part of the KV cache it
//! cannot roll back (the window) at chosen points of a prompt, and to get such points it ends a
//! prompt batch there: at the start of the last user message (and of earlier ones, spaced by
//! `--checkpoint-min-step`), `4 + n_ubatch` tokens before the end and 4 tokens before the end.
//! When a later task shares a prefix, it resumes from a checkpoint (or from scratch) instead of
//! from the end of the shared prefix.
//!
//! Our KV cache keeps every position, so it needs no snapshot. But where a batch ends decides
//! which rows are multiplied together, and ggml's kernels round differently for different row
//! counts; a drop-in must end its batches where upstream does to give the same tokens. This
//! module holds upstream's bookkeeping (the checkpoint list of each slot, its positions and
//! eviction) without the snapshots, and answers the three questions the scheduler asks: where
//! a prompt resumes, where the current batch ends, and whether a checkpoint is taken before it.

/// When and how checkpoints are taken: the server's options and the model's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// `--ctx-checkpoints`: most checkpoints per slot (0: none).
    pub max: usize,
    /// `--checkpoint-min-step`: least spacing in tokens between checkpoints.
    pub min_step: usize,
    /// The model's attention window (0: no window, or `--swa-full`).
    pub n_swa: usize,
    /// `-b` and `-ub`.
    pub n_batch: usize,
    pub n_ubatch: usize,
    /// Cells of upstream's window cache: once a sequence outgrows it, its oldest positions are
    /// overwritten and the cache's first position moves up.
    pub swa_cells: usize,
}

impl CheckpointPolicy {
    /// Upstream's policy for a model with window `n_swa` (0 for none) served with these options;
    /// `n_seq_unified` is the number of sequences sharing one cache (1 unless `--kv-unified`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        max: i32,
        min_step: i32,
        n_swa: usize,
        swa_full: bool,
        n_batch: usize,
        n_ubatch: usize,
        n_ctx: usize,
        n_seq_unified: usize,
    ) -> Self {
        let n_swa = if swa_full { 0 } else { n_swa };
        let pad = |n: usize| n.div_ceil(256) * 256;
        CheckpointPolicy {
            max: max.max(0) as usize,
            min_step: min_step.max(0) as usize,
            n_swa,
            n_batch: n_batch.max(1),
            n_ubatch: n_ubatch.max(1),
            swa_cells: pad(n_ctx.min(n_swa * n_seq_unified.max(1) + n_ubatch)),
        }
    }

    fn enabled(&self) -> bool {
        self.max > 0 && self.n_swa > 0
    }

    /// The first position the window cache still holds for a sequence of `len` tokens (-1 when
    /// empty). A sequence shorter than the cache keeps position 0; a longer one has overwritten
    /// its oldest cells in order.
    fn pos_min(&self, len: usize) -> i64 {
        if len == 0 {
            -1
        } else if self.n_swa == 0 {
            0
        } else {
            len.saturating_sub(self.swa_cells) as i64
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Checkpoint {
    /// Prompt tokens before the batch it was taken ahead of.
    n_tokens: usize,
    pos_min: i64,
    pos_max: i64,
    task: u64,
}

/// Where a task's user messages start in its prompt (token indices), from the chat template's
/// message delimiters; empty for a plain completion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserStarts(pub Vec<usize>);

impl UserStarts {
    fn contains(&self, pos: usize) -> bool {
        self.0.contains(&pos)
    }

    fn last(&self) -> Option<usize> {
        self.0.last().copied()
    }
}

/// A slot's checkpoint list.
#[derive(Clone, Debug, Default)]
pub struct Checkpoints {
    list: Vec<Checkpoint>,
}

impl Checkpoints {
    /// Where a task resumes whose prompt shares `n_past` tokens with the `cached` tokens the
    /// slot holds; drops the checkpoints past that point. With a window, a prefix within the
    /// window's reach resumes from the last checkpoint taken inside it (one token before its
    /// end, as upstream counts) or from scratch when there is none.
    pub fn resume(
        &mut self,
        policy: &CheckpointPolicy,
        cached: usize,
        n_past: usize,
        n_prompt: usize,
    ) -> usize {
        let mut n_past = n_past;
        let mut pos_next = n_past as i64;
        let has_new_tokens = n_past < n_prompt;
        let thold = (pos_next - policy.n_swa as i64 - i64::from(!has_new_tokens)).max(0);
        if n_past > 0 && n_past <= cached && policy.pos_min(cached) >= thold {
            let found = self.list.iter().rev().find(|c| {
                // a checkpoint reaching past the resume point cannot serve
                c.pos_max <= pos_next && (c.pos_min < thold || c.pos_min == 0)
            });
            match found {
                Some(c) => {
                    pos_next = pos_next.min((c.pos_min + 1).max(c.pos_max));
                    n_past = (pos_next.max(0) as usize).min(c.n_tokens);
                }
                None => {
                    pos_next = 0;
                    n_past = 0;
                }
            }
        }
        self.list.retain(|c| c.pos_max <= pos_next);
        n_past
    }

    /// How many of the prompt tokens `[start, end)` the current batch takes: the batch ends
    /// early where upstream ends it to take a checkpoint. `completion` is false for the task
    /// kinds upstream takes no checkpoints for (fill-in-the-middle).
    pub fn batch_len(
        &self,
        policy: &CheckpointPolicy,
        completion: bool,
        users: &UserStarts,
        n_prompt: usize,
        start: usize,
        end: usize,
    ) -> usize {
        if !(policy.enabled() && completion) {
            return end - start;
        }
        let last_user = users.last();
        let offsets = [4 + policy.n_ubatch, 4].map(|o| o.min(policy.n_batch));
        for n in start + 1..=end {
            if users.contains(n)
                && (Some(n) == last_user
                    || self.list.is_empty()
                    || self
                        .list
                        .last()
                        .is_some_and(|c| n > c.n_tokens + policy.min_step))
            {
                return n - start;
            }
            if offsets.iter().any(|&o| n_prompt == n + o) {
                return n - start;
            }
        }
        end - start
    }

    /// Called before the batch that evaluates prompt tokens `[start, end)` of task `task`:
    /// takes a checkpoint there when upstream would.
    #[allow(clippy::too_many_arguments)]
    pub fn before_batch(
        &mut self,
        policy: &CheckpointPolicy,
        completion: bool,
        users: &UserStarts,
        task: u64,
        n_prompt: usize,
        start: usize,
        end: usize,
    ) {
        if !(policy.enabled() && completion) {
            return;
        }
        let near_end = n_prompt < end + policy.n_ubatch;
        if end < n_prompt && !users.contains(start) && !near_end {
            return;
        }
        let pos_min = policy.pos_min(start);
        if pos_min < 0 {
            return;
        }
        let spaced = match self.list.last() {
            None => true,
            Some(c) => start > c.n_tokens + policy.min_step,
        };
        if !(spaced || Some(start) == users.last() || near_end) {
            return;
        }
        self.take(policy, task, start, pos_min, start as i64 - 1);
    }

    fn take(
        &mut self,
        policy: &CheckpointPolicy,
        task: u64,
        n_tokens: usize,
        pos_min: i64,
        pos_max: i64,
    ) {
        // a full list first drops checkpoints of other tasks that sit within the minimum step
        // of the one kept before them
        if self.list.len() + 1 >= policy.max {
            let mut last: Option<usize> = None;
            self.list.retain(|c| {
                if c.task != task && last.is_some_and(|l| c.n_tokens <= l + policy.min_step) {
                    return false;
                }
                last = Some(c.n_tokens);
                true
            });
        }
        while self.list.len() >= policy.max {
            self.list.remove(0);
        }
        self.list.retain(|c| c.n_tokens != n_tokens);
        self.list.push(Checkpoint {
            n_tokens,
            pos_min,
            pos_max,
            task,
        });
    }

    /// Forgets every checkpoint (the slot's cache was cleared).
    pub fn clear(&mut self) {
        self.list.clear();
    }
}

/// Where the user messages of `tokens` start: the positions where one of the `delimiters`
/// (role, tokens) matches, the first matching delimiter taken at each position, as upstream
/// splits a prompt into message spans.
pub fn user_starts(tokens: &[u32], delimiters: &[(bool, Vec<u32>)]) -> UserStarts {
    let mut out = Vec::new();
    if delimiters.is_empty() {
        return UserStarts(out);
    }
    for i in 0..tokens.len() {
        for (is_user, d) in delimiters {
            if tokens[i..].starts_with(d) {
                if *is_user {
                    out.push(i);
                }
                break;
            }
        }
    }
    UserStarts(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemma() -> CheckpointPolicy {
        // Gemma 3 270M as the compat suite serves it: window 512, -c 2048, one slot
        CheckpointPolicy::new(32, 8192, 512, false, 2048, 512, 2048, 1)
    }

    /// Splits a fresh prompt into the batches the scheduler would run, one slot alone, steps of
    /// at most `n_ubatch` tokens, taking checkpoints as it goes.
    fn batches(
        cp: &mut Checkpoints,
        p: &CheckpointPolicy,
        users: &UserStarts,
        n: usize,
        from: usize,
    ) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = from;
        while start < n {
            let end = (start + p.n_ubatch).min(n);
            let len = cp.batch_len(p, true, users, n, start, end);
            cp.before_batch(p, true, users, 7, n, start, start + len);
            out.push((start, start + len));
            start += len;
        }
        out
    }

    #[test]
    fn the_last_four_tokens_go_alone_and_a_long_prompt_breaks_before_the_last_ubatch() {
        let p = gemma();
        let none = UserStarts::default();
        assert_eq!(
            batches(&mut Checkpoints::default(), &p, &none, 19, 0),
            [(0, 15), (15, 19)]
        );
        // 5 tokens: one, then four
        assert_eq!(
            batches(&mut Checkpoints::default(), &p, &none, 5, 0),
            [(0, 1), (1, 5)]
        );
        // 4 or fewer: one batch
        assert_eq!(
            batches(&mut Checkpoints::default(), &p, &none, 4, 0),
            [(0, 4)]
        );
        // 1000: up to 516 before the end, then one ubatch, then 4
        assert_eq!(
            batches(&mut Checkpoints::default(), &p, &none, 1000, 0),
            [(0, 484), (484, 996), (996, 1000)]
        );
        // no window, or checkpoints off, or fill-in-the-middle: plain ubatches
        let plain = CheckpointPolicy::new(32, 8192, 0, false, 2048, 512, 2048, 1);
        assert_eq!(
            batches(&mut Checkpoints::default(), &plain, &none, 19, 0),
            [(0, 19)]
        );
        let off = CheckpointPolicy::new(0, 8192, 512, false, 2048, 512, 2048, 1);
        assert_eq!(
            batches(&mut Checkpoints::default(), &off, &none, 19, 0),
            [(0, 19)]
        );
        let full = CheckpointPolicy::new(32, 8192, 512, true, 2048, 512, 2048, 1);
        assert_eq!(
            batches(&mut Checkpoints::default(), &full, &none, 19, 0),
            [(0, 19)]
        );
        assert_eq!(
            Checkpoints::default().batch_len(&p, false, &none, 19, 0, 19),
            19
        );
    }

    #[test]
    fn batches_end_before_user_messages() {
        let p = gemma();
        // user messages at 1 and 30 of a 40-token chat prompt
        let users = UserStarts(vec![1, 30]);
        let mut cp = Checkpoints::default();
        // the first user start ends a batch while no checkpoint exists; the last always does
        assert_eq!(
            batches(&mut cp, &p, &users, 40, 0),
            [(0, 1), (1, 30), (30, 36), (36, 40)]
        );
        // checkpoints before the batches that start a user message or end near the prompt's
        // end, not before the first batch (nothing cached yet)
        let taken: Vec<usize> = cp.list.iter().map(|c| c.n_tokens).collect();
        assert_eq!(taken, [1, 30, 36]);
    }

    #[test]
    fn a_shared_prefix_resumes_from_the_last_checkpoint_inside_it() {
        let p = gemma();
        let none = UserStarts::default();
        let mut cp = Checkpoints::default();
        // a 19-token prompt took a checkpoint at 15 (positions 0..=14); 20 more were generated
        batches(&mut cp, &p, &none, 19, 0);
        assert_eq!(cp.list.len(), 1);
        // the same prompt again: resumes at 14, one token before the checkpoint's end
        let mut again = cp.clone();
        assert_eq!(again.resume(&p, 39, 19, 19), 14);
        assert_eq!(batches(&mut again, &p, &none, 19, 14), [(14, 15), (15, 19)]);
        // a prompt sharing only 10 tokens: no checkpoint inside, so from scratch
        let mut short = cp.clone();
        assert_eq!(short.resume(&p, 39, 10, 25), 0);
        assert!(
            short.list.is_empty(),
            "a checkpoint past the resume point is dropped"
        );
        // a prefix beyond the window's reach keeps it all (the window cache still starts at 0)
        let mut long = Checkpoints::default();
        assert_eq!(long.resume(&p, 900, 800, 850), 800);
        // without a window, the whole shared prefix is kept
        let plain = CheckpointPolicy::new(32, 8192, 0, false, 2048, 512, 2048, 1);
        assert_eq!(Checkpoints::default().resume(&plain, 39, 19, 25), 19);
    }

    #[test]
    fn a_full_list_drops_the_oldest() {
        let p = CheckpointPolicy::new(2, 0, 512, false, 2048, 512, 2048, 1);
        let mut cp = Checkpoints::default();
        for (i, n) in [10usize, 20, 30].into_iter().enumerate() {
            cp.take(&p, i as u64, n, 0, n as i64 - 1);
        }
        let kept: Vec<usize> = cp.list.iter().map(|c| c.n_tokens).collect();
        assert_eq!(kept, [20, 30]);
    }

    #[test]
    fn user_starts_follow_the_first_matching_delimiter() {
        let delims = vec![(false, vec![5]), (true, vec![6, 7])];
        assert_eq!(user_starts(&[6, 7, 1, 5, 6, 7], &delims).0, [0, 4]);
        assert!(user_starts(&[6, 7], &[]).0.is_empty());
        // where two match, the first listed wins
        assert!(
            user_starts(&[6, 7], &[(false, vec![6]), (true, vec![6, 7])])
                .0
                .is_empty()
        );
        assert_eq!(
            user_starts(&[6, 7], &[(true, vec![6, 7]), (false, vec![6])]).0,
            [0]
        );
    }
}
