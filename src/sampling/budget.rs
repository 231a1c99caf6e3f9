//! The reasoning budget (upstream's `common_reasoning_budget` sampler): once a start tag is
//! generated, count the tokens of the thinking block; when the budget runs out (and the last
//! token completed its UTF-8 character), force the end sequence token by token. A natural end
//! tag stops the count; a later start tag counts again.

/// Where the budget stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetState {
    /// Outside a thinking block.
    Idle,
    Counting,
    /// Budget spent in the middle of a character: force once it is complete.
    WaitingUtf8,
    Forcing,
    Done,
}

/// Finds token sequences at the end of what was generated; the history restarts after a match.
#[derive(Clone, Debug)]
struct SeqMatcher {
    seqs: Vec<Vec<u32>>,
    recent: Vec<u32>,
}

impl SeqMatcher {
    fn new(seqs: &[Vec<u32>]) -> Self {
        let mut unique: Vec<Vec<u32>> = Vec::new();
        for s in seqs {
            if !s.is_empty() && !unique.contains(s) {
                unique.push(s.clone());
            }
        }
        SeqMatcher {
            seqs: unique,
            recent: Vec::new(),
        }
    }

    /// Which sequence (by index) the history ends with after `token`.
    fn advance(&mut self, token: u32) -> Option<usize> {
        self.recent.push(token);
        let longest = self.seqs.iter().map(Vec::len).max().unwrap_or(0);
        if self.recent.len() > longest {
            self.recent.drain(..self.recent.len() - longest);
        }
        let found = self.seqs.iter().position(|s| self.recent.ends_with(s));
        if found.is_some() {
            self.recent.clear();
        }
        found
    }

    fn reset(&mut self) {
        self.recent.clear();
    }
}

/// A reasoning budget for one generation.
#[derive(Clone, Debug)]
pub struct Budget {
    start: SeqMatcher,
    end: SeqMatcher,
    forced: Vec<u32>,
    budget: i64,
    remaining: i64,
    state: BudgetState,
    force_pos: usize,
    /// The end sequence that closed the last block, when one did.
    end_match: Option<usize>,
}

impl Budget {
    /// `budget` tokens per thinking block (negative: unlimited); `forced` is what ends a block
    /// whose budget ran out (the message, then the first end tag).
    pub fn new(start: &[u32], ends: &[Vec<u32>], forced: Vec<u32>, budget: i32) -> Self {
        let budget = if budget < 0 {
            i64::from(i32::MAX)
        } else {
            i64::from(budget)
        };
        Budget {
            start: SeqMatcher::new(&[start.to_vec()]),
            end: SeqMatcher::new(ends),
            forced,
            budget,
            remaining: budget,
            state: BudgetState::Idle,
            force_pos: 0,
            end_match: None,
        }
    }

    /// The end sequence that closed the last thinking block (a lazy grammar replays it).
    pub fn ended_with(&self) -> Option<&[u32]> {
        self.end_match
            .and_then(|i| self.end.seqs.get(i))
            .map(Vec::as_slice)
    }

    pub fn state(&self) -> BudgetState {
        self.state
    }

    /// While forcing, the next forced token is the only candidate left.
    pub fn forced_token(&self) -> Option<u32> {
        (self.state == BudgetState::Forcing)
            .then(|| self.forced.get(self.force_pos).copied())
            .flatten()
    }

    fn enter_block(&mut self) {
        self.state = BudgetState::Counting;
        self.remaining = self.budget;
        if self.remaining <= 0 {
            self.state = BudgetState::Forcing;
            self.force_pos = 0;
        }
    }

    fn start_forcing(&mut self) {
        self.state = BudgetState::Forcing;
        self.force_pos = 0;
        self.end.reset();
    }

    /// Records a token; `complete` says whether its text ends on a whole UTF-8 character.
    pub fn accept(&mut self, token: u32, complete: bool) {
        match self.state {
            BudgetState::Idle => {
                if self.start.advance(token).is_some() {
                    self.enter_block();
                }
            }
            BudgetState::Counting | BudgetState::WaitingUtf8 => {
                if let Some(m) = self.end.advance(token) {
                    self.state = BudgetState::Done;
                    self.end_match = Some(m);
                    return;
                }
                if self.state == BudgetState::WaitingUtf8 {
                    if complete {
                        self.start_forcing();
                    }
                    return;
                }
                self.remaining -= 1;
                if self.remaining <= 0 {
                    if complete {
                        self.start_forcing();
                    } else {
                        self.state = BudgetState::WaitingUtf8;
                        self.end.reset();
                    }
                }
            }
            BudgetState::Forcing => {
                let m = self.end.advance(token);
                self.force_pos += 1;
                if self.force_pos >= self.forced.len() {
                    self.state = BudgetState::Done;
                    self.end_match = m;
                }
            }
            BudgetState::Done => {
                if self.start.advance(token).is_some() {
                    self.end.reset();
                    self.end_match = None;
                    self.enter_block();
                }
            }
        }
    }
}

/// Whether `bytes` ends on a whole UTF-8 character (upstream's `common_utf8_is_complete`).
pub fn utf8_complete(bytes: &[u8]) -> bool {
    // Look back over at most the last four bytes for the lead byte of the final character.
    for (back, &b) in bytes.iter().rev().take(4).enumerate() {
        let need = match b {
            0x00..=0x7f => 1,
            0x80..=0xbf => continue,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        return back + 1 >= need;
    }
    bytes.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_then_forces_the_end_sequence() {
        // start tag [1], end tag [2]; forced = message [7] + end [2]; budget 2
        let mut b = Budget::new(&[1], &[vec![2]], vec![7, 2], 2);
        b.accept(5, true);
        assert_eq!(b.state(), BudgetState::Idle);
        b.accept(1, true);
        assert_eq!(b.state(), BudgetState::Counting);
        b.accept(5, true);
        assert_eq!(b.forced_token(), None);
        b.accept(5, true);
        assert_eq!(b.forced_token(), Some(7));
        b.accept(7, true);
        assert_eq!(b.forced_token(), Some(2));
        b.accept(2, true);
        assert_eq!(b.state(), BudgetState::Done);
        // a new block counts again
        b.accept(1, true);
        assert_eq!(b.state(), BudgetState::Counting);
    }

    #[test]
    fn a_natural_end_stops_the_count_and_split_characters_wait() {
        let mut b = Budget::new(&[1, 3], &[vec![2]], vec![2], 1);
        b.accept(1, true);
        b.accept(3, true);
        assert_eq!(b.state(), BudgetState::Counting);
        b.accept(9, false);
        assert_eq!(b.state(), BudgetState::WaitingUtf8);
        b.accept(9, true);
        assert_eq!(b.forced_token(), Some(2));
        let mut b = Budget::new(&[1], &[vec![2]], vec![2], 5);
        b.accept(1, true);
        b.accept(2, true);
        assert_eq!(b.state(), BudgetState::Done);
        let b = Budget::new(&[1], &[vec![2]], vec![2], 0);
        assert_eq!(b.state(), BudgetState::Idle);
    }

    #[test]
    fn utf8_completeness() {
        assert!(utf8_complete(b"abc"));
        assert!(utf8_complete("é".as_bytes()));
        assert!(!utf8_complete(&[0xc3]));
        assert!(!utf8_complete(&[b'a', 0xe2, 0x82]));
        assert!(utf8_complete(&[0xe2, 0x82, 0xac]));
    }
}
