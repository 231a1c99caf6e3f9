//! Byte-level BPE as llama.cpp runs it: pre-tokenize, then within each piece repeatedly apply the
//! lowest-ranked merge among adjacent symbol pairs (leftmost on ties).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::fxhash::FxHashMap;
use super::pretok::PreKind;
use super::spm::{char_symbols, Symbol, NONE};
use super::Vocab;

/// (rank, left, right, left size, right size) of a candidate merge.
type QueuedMerge = (u32, usize, usize, usize, usize);

impl Vocab {
    /// Tokenizes one text fragment.
    pub(crate) fn bpe_text(&self, text: &str, out: &mut Vec<u32>) {
        let Some(pretok) = &self.pretok else {
            return;
        };
        if self.model == "whitespace" {
            // the whitespace model drops whitespace and tokenizes what lies between
            let mut segment = String::new();
            for ch in text.chars() {
                if super::unicode::flags(ch as u32).is_whitespace() {
                    if !segment.is_empty() {
                        self.bpe_words(&pretok.split(&segment), pretok.byte_encode, out);
                        segment.clear();
                    }
                } else if self.opts.lowercase {
                    segment.push(char::from_u32(super::unicode::to_lower(ch as u32)).unwrap_or(ch));
                } else {
                    segment.push(ch);
                }
            }
            if !segment.is_empty() {
                self.bpe_words(&pretok.split(&segment), pretok.byte_encode, out);
            }
            return;
        }
        let mut words = pretok.split(text);
        if self.pre == PreKind::Mmbert {
            words = metaspace_words(words);
        }
        self.bpe_words(&words, pretok.byte_encode, out);
    }

    fn bpe_words(&self, words: &[String], byte_encode: bool, out: &mut Vec<u32>) {
        let mut syms = Vec::new();
        let mut key = String::new();
        // a piece always tokenizes the same way, and text repeats its words
        let mut seen: FxHashMap<&str, std::ops::Range<usize>> = FxHashMap::default();
        for word in words {
            if let Some(r) = seen.get(word.as_str()) {
                out.extend_from_within(r.clone());
                continue;
            }
            let first = out.len();
            self.bpe_word(word, byte_encode, &mut syms, &mut key, out);
            seen.insert(word, first..out.len());
        }
    }

    fn bpe_word(
        &self,
        word: &str,
        byte_encode: bool,
        syms: &mut Vec<Symbol>,
        key: &mut String,
        out: &mut Vec<u32>,
    ) {
        let all_newlines = !word.is_empty() && word.bytes().all(|b| b == b'\n');
        let whole = (self.opts.ignore_merges
            || (matches!(self.pre, PreKind::Gemma4 | PreKind::Mmbert) && all_newlines))
            .then(|| self.text_to_token(word))
            .flatten();
        if let Some(id) = whole {
            out.push(id);
            return;
        }
        self.merge_word(word, syms, key);
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = syms[i];
            let piece = &word[s.start..s.start + s.n];
            match self.text_to_token(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        let id = if byte_encode {
                            std::str::from_utf8(&[b])
                                .ok()
                                .and_then(|c| self.text_to_token(c))
                        } else {
                            self.text_to_token(&format!("<0x{b:02X}>"))
                        };
                        out.extend(id);
                    }
                }
            }
            i = s.next;
        }
    }

    fn rank(&self, key: &mut String, left: &str, right: &str) -> Option<u32> {
        key.clear();
        key.push_str(left);
        key.push(' ');
        key.push_str(right);
        self.bpe_ranks.get(key.as_str()).copied()
    }

    /// Merges one piece down to its final symbols (left in `syms`, chained by `next`).
    fn merge_word(&self, word: &str, syms: &mut Vec<Symbol>, key: &mut String) {
        char_symbols(word.as_bytes(), syms);
        // (rank, left, right, left size, right size): a popped pair is stale when either side has
        // changed size since it was queued.
        let mut queue: BinaryHeap<Reverse<QueuedMerge>> = BinaryHeap::new();
        let text_of = |s: &Symbol| &word[s.start..s.start + s.n];
        let mut add = |syms: &[Symbol], queue: &mut BinaryHeap<_>, l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            let (a, b) = (&syms[l], &syms[r]);
            if let Some(rank) = self.rank(key, text_of(a), text_of(b)) {
                queue.push(Reverse((rank, l, r, a.n, b.n)));
            }
        };
        for i in 1..syms.len() {
            add(syms, &mut queue, i - 1, i);
        }
        while let Some(Reverse((_, l, r, ln, rn))) = queue.pop() {
            if syms[l].n != ln || syms[r].n != rn || ln == 0 || rn == 0 {
                continue;
            }
            let right = syms[r];
            syms[l].n += right.n;
            syms[r].n = 0;
            syms[l].next = right.next;
            if right.next != NONE {
                syms[right.next].prev = l;
            }
            let (prev, next) = (syms[l].prev, syms[l].next);
            add(syms, &mut queue, prev, l);
            add(syms, &mut queue, l, next);
        }
    }
}

/// mmBERT's Metaspace pre-tokenizer: a piece starts with an escaped space, and each escaped space
/// starts a new word; runs of newlines stay whole.
fn metaspace_words(words: Vec<String>) -> Vec<String> {
    const SPACE: &str = "\u{2581}";
    let mut out = Vec::with_capacity(words.len());
    for mut w in words {
        if w.bytes().all(|b| b == b'\n') {
            out.push(w);
            continue;
        }
        if !w.starts_with(SPACE) {
            w.insert_str(0, SPACE);
        }
        let mut start = 0;
        while start < w.len() {
            let end = w[start + SPACE.len()..]
                .find(SPACE)
                .map_or(w.len(), |k| k + start + SPACE.len());
            out.push(w[start..end].to_string());
            start = end;
        }
    }
    out
}
