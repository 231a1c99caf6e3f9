//! SentencePiece BPE as llama.cpp runs it: start from single characters, repeatedly merge the
//! adjacent pair whose concatenation is the highest-scoring token (leftmost on ties), and write
//! characters no token covers as byte tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{unicode, Vocab, VocabType};

/// A run of the input that is currently one symbol; `n == 0` once merged into its left neighbour.
#[derive(Clone, Copy)]
pub(crate) struct Symbol {
    pub start: usize,
    pub n: usize,
    pub prev: usize,
    pub next: usize,
}

pub(crate) const NONE: usize = usize::MAX;

/// Splits `text` into one symbol per UTF-8 character (upstream's length guess, clamped).
pub(crate) fn char_symbols(text: &[u8], out: &mut Vec<Symbol>) {
    out.clear();
    let mut offs = 0;
    while offs < text.len() {
        let n = unicode::utf8_len(text[offs]).min(text.len() - offs);
        let idx = out.len();
        offs += n;
        out.push(Symbol {
            start: offs - n,
            n,
            prev: if idx == 0 { NONE } else { idx - 1 },
            next: if offs == text.len() { NONE } else { idx + 1 },
        });
    }
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then(o.left.cmp(&self.left))
    }
}

impl Vocab {
    /// Tokenizes one text fragment (spaces already escaped as U+2581).
    pub(crate) fn spm_text(&self, text: &str, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        let mut syms = Vec::with_capacity(bytes.len());
        char_symbols(bytes, &mut syms);
        let mut queue = BinaryHeap::new();
        let try_add =
            |syms: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: usize, right: usize| {
                if left == NONE || right == NONE {
                    return;
                }
                let (l, r) = (syms[left], syms[right]);
                let Some(piece) = text.get(l.start..l.start + l.n + r.n) else {
                    return;
                };
                if let Some(id) = self.text_to_token(piece) {
                    queue.push(Bigram {
                        score: self.tokens[id as usize].score,
                        left,
                        right,
                        size: l.n + r.n,
                    });
                }
            };
        for i in 1..syms.len() {
            try_add(&syms, &mut queue, i - 1, i);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            if l.n == 0 || r.n == 0 || l.n + r.n != b.size {
                continue;
            }
            syms[b.left].n += r.n;
            syms[b.right].n = 0;
            syms[b.left].next = r.next;
            if r.next != NONE {
                syms[r.next].prev = b.left;
            }
            let prev = syms[b.left].prev;
            let next = syms[b.left].next;
            try_add(&syms, &mut queue, prev, b.left);
            try_add(&syms, &mut queue, b.left, next);
        }
        // Every merged symbol is a token (a pair is queued only when it is one), so only single
        // characters can miss the vocabulary; they fall back to bytes.
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = syms[i];
            let piece = &bytes[s.start..s.start + s.n];
            match std::str::from_utf8(piece)
                .ok()
                .and_then(|p| self.text_to_token(p))
            {
                Some(id) => out.push(id),
                None => piece
                    .iter()
                    .for_each(|&b| out.extend(self.byte_to_token(b))),
            }
            i = s.next;
        }
    }

    /// The token standing for one raw byte: `<0xXX>`, else the byte itself as text (SPM/UGM), or
    /// its GPT-2 alphabet character (BPE/WPM).
    pub(crate) fn byte_to_token(&self, b: u8) -> Option<u32> {
        match self.kind {
            VocabType::Spm | VocabType::Ugm => {
                self.text_to_token(&format!("<0x{b:02X}>")).or_else(|| {
                    std::str::from_utf8(&[b])
                        .ok()
                        .and_then(|s| self.text_to_token(s))
                })
            }
            VocabType::Bpe | VocabType::Wpm => {
                let c = char::from_u32(unicode::byte_to_cpt(b))?;
                self.text_to_token(c.encode_utf8(&mut [0u8; 4]))
            }
        }
    }
}
