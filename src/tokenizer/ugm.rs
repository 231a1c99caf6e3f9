//! Unigram (T5) as llama.cpp runs it: normalize with the model's precompiled character map
//! (a XOR-compressed double array of prefix replacements), then pick the tokenization with the
//! highest total score by Viterbi over byte positions; characters no token covers become `<unk>`
//! with a penalty, and runs of `<unk>` collapse into one.

use super::fxhash::FxHashMap;
use super::{attr, unicode, TokenData, Vocab};

/// A byte trie: node 0 is the root.
#[derive(Default)]
struct Trie {
    edges: FxHashMap<(u32, u8), u32>,
    values: Vec<Option<u32>>,
}

impl Trie {
    fn new() -> Trie {
        Trie {
            edges: FxHashMap::default(),
            values: vec![None],
        }
    }

    fn insert(&mut self, key: &[u8], value: u32) {
        let mut node = 0u32;
        for &b in key {
            node = match self.edges.get(&(node, b)) {
                Some(&n) => n,
                None => {
                    let n = self.values.len() as u32;
                    self.values.push(None);
                    self.edges.insert((node, b), n);
                    n
                }
            };
        }
        self.values[node as usize] = Some(value);
    }

    fn step(&self, node: u32, b: u8) -> Option<u32> {
        self.edges.get(&(node, b)).copied()
    }

    /// Length of the longest path from the root along `key` (whether or not it ends on a value,
    /// as upstream's user-defined matcher measures it).
    fn longest_path(&self, key: &[u8]) -> usize {
        let mut node = 0;
        let mut n = 0;
        for &b in key {
            match self.step(node, b) {
                Some(next) => {
                    node = next;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }
}

pub(crate) struct Ugm {
    xcda: Vec<u32>,
    replacements: Vec<u8>,
    tokens: Trie,
    user_defined: Trie,
    unknown_score: f32,
}

impl Ugm {
    pub fn new(tokens: &[TokenData], charsmap: &[u8]) -> Result<Ugm, String> {
        let (xcda, replacements) = if charsmap.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let size = charsmap
                .get(..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .ok_or("precompiled_charsmap too small for its size header")?;
            if size + 4 >= charsmap.len() {
                return Err(format!(
                    "precompiled_charsmap declares {size} bytes of index but has {}",
                    charsmap.len()
                ));
            }
            let xcda = charsmap[4..4 + size]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (xcda, charsmap[4 + size..].to_vec())
        };
        let mut min_score = f32::MAX;
        let mut t = Trie::new();
        let mut u = Trie::new();
        for (id, tok) in tokens.iter().enumerate() {
            if tok.attr & attr::NORMAL != 0 {
                min_score = min_score.min(tok.score);
            }
            if tok.attr & (attr::NORMAL | attr::USER_DEFINED | attr::UNUSED) != 0 {
                t.insert(tok.text.as_bytes(), id as u32);
            }
            if tok.attr & attr::USER_DEFINED != 0 {
                u.insert(tok.text.as_bytes(), 0);
            }
        }
        Ok(Ugm {
            xcda,
            replacements,
            tokens: t,
            user_defined: u,
            unknown_score: min_score - 10.0,
        })
    }

    fn node(&self, i: usize) -> Option<u32> {
        self.xcda.get(i).copied()
    }

    /// The charsmap's replacement for the longest matching prefix of `input`: (replacement,
    /// bytes consumed).
    fn charsmap_prefix(&self, input: &[u8]) -> Option<(&[u8], usize)> {
        if self.xcda.is_empty() {
            return None;
        }
        let base = |p: u32| (p >> 10) << ((p & (1 << 9)) >> 6);
        let lcheck = |p: u32| p & ((1 << 31) | 0xFF);
        let leaf = |p: u32| (p >> 8) & 1 == 1;
        let value = |p: u32| p & ((1 << 31) - 1);
        let mut node = base(self.node(0)?) as usize;
        let mut best = None;
        for (k, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= c as usize;
            let p = self.node(node)?;
            if lcheck(p) != c as u32 {
                break;
            }
            let is_leaf = leaf(p);
            node ^= base(p) as usize;
            if is_leaf {
                best = Some((k + 1, value(self.node(node)?) as usize));
            }
        }
        let (len, off) = best?;
        let rest = self.replacements.get(off..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some((&rest[..end], len))
    }
}

impl Vocab {
    pub(crate) fn ugm_text(&self, text: &str, out: &mut Vec<u32>) {
        let Some(ugm) = &self.ugm else {
            return;
        };
        let norm = self.ugm_normalize(ugm, text.as_bytes());
        if norm.is_empty() {
            return;
        }
        let unk = self.special.unk;
        // best[i] = (token ending at i, where it starts, total score)
        let mut best: Vec<(Option<u32>, usize, f64)> = vec![(unk, 0, f64::MIN); norm.len() + 1];
        best[0] = (unk, 0, 0.0);
        let mut pos = 0;
        while pos < norm.len() {
            let n_char = unicode::utf8_len(norm[pos]).min(norm.len() - pos);
            let current = best[pos].2;
            let mut single_char_found = false;
            let mut node = ugm.tokens.step(0, norm[pos]);
            let mut end = pos + 1;
            while let Some(nd) = node {
                if let Some(id) = ugm.tokens.values[nd as usize] {
                    if end - pos == n_char {
                        single_char_found = true;
                    }
                    let t = &self.tokens[id as usize];
                    let score = if t.attr & attr::USER_DEFINED != 0 {
                        0.0
                    } else {
                        t.score as f64
                    };
                    let challenger = current + score;
                    if challenger > best[end].2 {
                        best[end] = (Some(id), pos, challenger);
                    }
                }
                if end >= norm.len() {
                    break;
                }
                node = ugm.tokens.step(nd, norm[end]);
                end += 1;
            }
            if !single_char_found {
                let challenger = current + ugm.unknown_score as f64;
                let end = pos + n_char;
                if challenger > best[end].2 {
                    best[end] = (unk, pos, challenger);
                }
            }
            pos += n_char;
        }
        let first = out.len();
        let mut prev_unknown = false;
        let mut i = norm.len();
        loop {
            let (id, start, _) = best[i];
            let is_unknown = id == unk;
            if !(prev_unknown && is_unknown) {
                out.extend(id);
            }
            if start == 0 {
                break;
            }
            prev_unknown = is_unknown;
            i = start;
        }
        out[first..].reverse();
    }

    fn ugm_normalize(&self, ugm: &Ugm, input: &[u8]) -> Vec<u8> {
        let space: &[u8] = if self.opts.escape_whitespaces {
            "\u{2581}".as_bytes()
        } else {
            b" "
        };
        let suffix = self.opts.treat_whitespace_as_suffix;
        let prepend = !suffix && self.opts.add_space_prefix;
        let append = suffix && self.opts.add_space_prefix;
        let merge = self.opts.remove_extra_whitespaces;
        let mut out = Vec::with_capacity(input.len() * 3);
        let mut space_prepended = false;
        let mut in_word = false;
        let mut pos = 0;
        while pos < input.len() {
            let rest = &input[pos..];
            let user = ugm.user_defined.longest_path(rest);
            let (piece, consumed): (&[u8], usize) = if user > 0 {
                (&rest[..user], user)
            } else if let Some(r) = ugm.charsmap_prefix(rest) {
                r
            } else {
                match unicode::decode_one(rest) {
                    Some((_, n)) => (&rest[..n], n),
                    None => ("\u{FFFD}".as_bytes(), 1),
                }
            };
            for &c in piece {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (prepend && !space_prepended) || merge {
                            out.extend_from_slice(space);
                            space_prepended = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(space);
                    }
                }
            }
            pos += consumed;
        }
        if append {
            out.extend_from_slice(space);
        }
        out
    }
}
