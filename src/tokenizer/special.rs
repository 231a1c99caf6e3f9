//! Splitting special tokens out of the text before the tokenizer proper runs.
//!
//! Upstream takes the special tokens longest first and, for each, splits every remaining text
//! fragment at its occurrences (leftmost, non-overlapping), stripping whitespace beside tokens
//! marked LSTRIP/RSTRIP. That is one full text scan per special token; Gemma has over 6000. We find
//! every occurrence of every special token in one Aho-Corasick pass and then replay upstream's
//! order over them: an occurrence is taken when nothing taken before overlaps it, which is exactly
//! when upstream's scan of the fragment holding it would find it.

use std::collections::BTreeMap;

use aho_corasick::AhoCorasick;

use super::{attr, TokenData};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    /// Byte range of the input text still to tokenize.
    Text(usize, usize),
    Token(u32),
}

pub struct SpecialMatcher {
    ac: Option<AhoCorasick>,
    /// Pattern index -> token id; the index is the priority (longest text first).
    ids: Vec<u32>,
}

impl SpecialMatcher {
    /// Control, user-defined and unknown tokens, longest first (ties by id).
    pub fn new(tokens: &[TokenData]) -> SpecialMatcher {
        let mut ids: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&id| {
                tokens[id as usize].attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        ids.sort_by(|&a, &b| {
            let (ta, tb) = (&tokens[a as usize].text, &tokens[b as usize].text);
            tb.len().cmp(&ta.len()).then(a.cmp(&b))
        });
        let ac = if ids.is_empty() {
            None
        } else {
            AhoCorasick::new(ids.iter().map(|&id| tokens[id as usize].text.as_bytes())).ok()
        };
        SpecialMatcher { ac, ids }
    }

    /// Splits `text` into text ranges and special tokens. Without `parse_special`, only
    /// user-defined tokens are split out.
    pub fn partition(
        &self,
        text: &str,
        parse_special: bool,
        tokens: &[TokenData],
    ) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let Some(ac) = &self.ac else {
            return vec![Fragment::Text(0, text.len())];
        };
        let skip = attr::CONTROL | attr::UNKNOWN;
        let mut hits: Vec<(u32, usize, usize)> = ac
            .find_overlapping_iter(text)
            .filter(|m| {
                parse_special || tokens[self.ids[m.pattern().as_usize()] as usize].attr & skip == 0
            })
            .map(|m| (m.pattern().as_u32(), m.start(), m.end()))
            .collect();
        if hits.is_empty() {
            return vec![Fragment::Text(0, text.len())];
        }
        hits.sort_unstable();
        let bytes = text.as_bytes();
        // start -> (end, token or None for stripped whitespace)
        let mut taken: BTreeMap<usize, (usize, Option<u32>)> = BTreeMap::new();
        for (pat, start, end) in hits {
            let before = taken.range(..end).next_back().map(|(&s, &(e, _))| (s, e));
            if before.is_some_and(|(s, e)| s >= start || e > start) {
                continue;
            }
            let left_edge = before.map_or(0, |(_, e)| e);
            let right_edge = taken.range(end..).next().map_or(text.len(), |(&s, _)| s);
            let id = self.ids[pat as usize];
            let a = tokens[id as usize].attr;
            if a & attr::LSTRIP != 0 {
                let mut k = start;
                while k > left_edge && is_c_space(bytes[k - 1]) {
                    k -= 1;
                }
                if k < start {
                    taken.insert(k, (start, None));
                }
            }
            if a & attr::RSTRIP != 0 {
                let mut k = end;
                while k < right_edge && is_c_space(bytes[k]) {
                    k += 1;
                }
                if k > end {
                    taken.insert(end, (k, None));
                }
            }
            taken.insert(start, (end, Some(id)));
        }
        let mut out = Vec::new();
        let mut pos = 0;
        for (&s, &(e, id)) in &taken {
            if s > pos {
                out.push(Fragment::Text(pos, s));
            }
            if let Some(id) = id {
                out.push(Fragment::Token(id));
            }
            pos = e;
        }
        if pos < text.len() {
            out.push(Fragment::Text(pos, text.len()));
        }
        out
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(text: &str, attr: u32) -> TokenData {
        TokenData {
            text: text.into(),
            score: 0.0,
            attr,
        }
    }

    #[test]
    fn longer_tokens_win_even_when_a_shorter_one_starts_first() {
        let toks = vec![
            tok("ab", attr::USER_DEFINED),
            tok("bcd", attr::USER_DEFINED),
            tok("<c>", attr::CONTROL | attr::RSTRIP),
        ];
        let m = SpecialMatcher::new(&toks);
        use Fragment::*;
        assert_eq!(
            m.partition("abcd ab", false, &toks),
            [Text(0, 1), Token(1), Text(4, 5), Token(0)]
        );
        assert_eq!(m.partition("x<c>  y", false, &toks), [Text(0, 7)]);
        assert_eq!(
            m.partition("x<c>  y", true, &toks),
            [Text(0, 1), Token(2), Text(6, 7)]
        );
    }
}
