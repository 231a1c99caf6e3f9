//! WordPiece (BERT) as llama.cpp runs it: normalize (lowercase, strip accents), split on
//! whitespace and around punctuation and CJK characters, then take the longest vocabulary match
//! from left to right within each word; a word with any unmatched position becomes `[UNK]`.

use super::unicode;
use super::Vocab;

impl Vocab {
    pub(crate) fn wpm_text(&self, text: &str, out: &mut Vec<u32>) {
        for word in self.wpm_words(text) {
            if word.is_empty() {
                continue;
            }
            let word1 = format!("\u{2581}{word}");
            let n = word1.len();
            let before = out.len();
            let mut i = 0;
            while i < n {
                let mut matched = None;
                let mut j = n.min(i + self.max_token_len + 1);
                while j > i {
                    if let Some(id) = word1.get(i..j).and_then(|s| self.text_to_token(s)) {
                        matched = Some((id, j));
                        break;
                    }
                    j -= 1;
                }
                match matched {
                    Some((id, end)) => {
                        out.push(id);
                        i = end;
                    }
                    None => {
                        out.truncate(before);
                        break;
                    }
                }
            }
            if out.len() == before {
                out.extend(self.special.unk);
            }
        }
    }

    fn wpm_words(&self, text: &str) -> Vec<String> {
        let mut words = vec![String::new()];
        for ch in text.chars() {
            let mut cpt = ch as u32;
            if self.opts.strip_accents {
                cpt = unicode::nfd_base(cpt);
            }
            let f = unicode::flags(cpt);
            if f.is_whitespace() {
                if words.last().is_some_and(|w| !w.is_empty()) {
                    words.push(String::new());
                }
                continue;
            }
            if cpt == 0 || cpt == 0xFFFD || f.is_control() {
                continue;
            }
            if self.opts.strip_accents && f.is_accent_mark() {
                continue;
            }
            let c = if self.opts.lowercase {
                unicode::to_lower(cpt)
            } else {
                cpt
            };
            let c = char::from_u32(c).unwrap_or('\u{FFFD}');
            let last = words.len() - 1;
            if f.is_punctuation() || (cpt < 0x7F && f.is_symbol()) || is_chinese_char(cpt) {
                if !words[last].is_empty() {
                    words.push(String::new());
                }
                let last = words.len() - 1;
                words[last] = c.to_string();
                words.push(String::new());
            } else {
                words[last].push(c);
            }
        }
        if words.last().is_some_and(|w| w.is_empty()) {
            words.pop();
        }
        words
    }
}

fn is_chinese_char(c: u32) -> bool {
    // upstream (after HF) starts the fifth extension at 0x2B920
    matches!(c,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}
