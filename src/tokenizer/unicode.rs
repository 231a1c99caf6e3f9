//! Unicode answers exactly as llama.cpp b11434 gives them: its category flags (from its own tables,
//! not Rust's), lowercase map, NFD base characters, and GPT-2's byte <-> codepoint mapping.

use std::sync::OnceLock;

use super::unicode_data::{LOWERCASE, NFD, RANGES_FLAGS, WHITESPACE};

/// llama.cpp's per-codepoint flag bits (`unicode_cpt_flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(pub u16);

impl Flags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const ACCENT_MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const CATEGORIES: u16 = 0x00FF;
    pub const WHITESPACE: u16 = 0x0100;

    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_accent_mark(self) -> bool {
        self.0 & Self::ACCENT_MARK != 0
    }
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub fn is_symbol(self) -> bool {
        self.0 & Self::SYMBOL != 0
    }
    pub fn is_control(self) -> bool {
        self.0 & Self::CONTROL != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// Any flag at all: positions outside the text have none.
    pub fn any(self) -> bool {
        self.0 != 0
    }
    pub fn category(self) -> u16 {
        self.0 & Self::CATEGORIES
    }
}

const MAX_CODEPOINTS: usize = 0x110000;

fn flag_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = vec![Flags::UNDEFINED; MAX_CODEPOINTS];
        for w in RANGES_FLAGS.windows(2) {
            let (lo, flags) = w[0];
            let hi = (w[1].0 as usize).min(MAX_CODEPOINTS);
            t[lo as usize..hi].fill(flags);
        }
        for &c in WHITESPACE.iter() {
            t[c as usize] |= Flags::WHITESPACE;
        }
        t
    })
}

/// Flags of one codepoint; codepoints past U+10FFFF are undefined, as upstream answers.
pub fn flags(cpt: u32) -> Flags {
    Flags(
        flag_table()
            .get(cpt as usize)
            .copied()
            .unwrap_or(Flags::UNDEFINED),
    )
}

pub fn to_lower(cpt: u32) -> u32 {
    match LOWERCASE.binary_search_by_key(&cpt, |&(c, _)| c) {
        Ok(i) => LOWERCASE[i].1,
        Err(_) => cpt,
    }
}

/// The first codepoint of a character's canonical decomposition (what upstream's NFD keeps).
pub fn nfd_base(cpt: u32) -> u32 {
    let i = NFD.partition_point(|&(first, _, _)| first <= cpt);
    match i.checked_sub(1).map(|i| NFD[i]) {
        Some((first, last, base)) if first <= cpt && cpt <= last => base,
        _ => cpt,
    }
}

/// Han characters as Kimi-K2's pre-tokenizer counts them.
pub fn is_han(cpt: u32) -> bool {
    matches!(cpt,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// Byte length of a UTF-8 sequence from its first byte, as upstream guesses it (no validation).
pub fn utf8_len(first: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(first >> 4) as usize]
}

/// Codepoints of `text`, the way upstream decodes bytes: a bad sequence costs one byte and
/// becomes U+FFFD; well-formed-looking sequences are taken without range checks.
pub fn codepoints(text: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match decode_one(&text[i..]) {
            Some((c, n)) => {
                out.push(c);
                i += n;
            }
            None => {
                out.push(0xFFFD);
                i += 1;
            }
        }
    }
    out
}

/// One codepoint from the start of `s` and its byte length, or None for a bad sequence.
pub fn decode_one(s: &[u8]) -> Option<(u32, usize)> {
    let b0 = *s.first()?;
    let cont = |k: usize| {
        s.get(k)
            .filter(|&&b| b & 0xC0 == 0x80)
            .map(|&b| (b & 0x3F) as u32)
    };
    if b0 & 0x80 == 0 {
        return Some((b0 as u32, 1));
    }
    if b0 & 0x40 == 0 {
        return None;
    }
    if b0 & 0x20 == 0 {
        return Some((((b0 & 0x1F) as u32) << 6 | cont(1)?, 2));
    }
    if b0 & 0x10 == 0 {
        return Some((((b0 & 0x0F) as u32) << 12 | cont(1)? << 6 | cont(2)?, 3));
    }
    if b0 & 0x08 == 0 {
        let c = ((b0 & 0x07) as u32) << 18 | cont(1)? << 12 | cont(2)? << 6 | cont(3)?;
        return Some((c, 4));
    }
    None
}

/// Appends the UTF-8 encoding of a codepoint, including surrogates as upstream writes them.
pub fn push_utf8(out: &mut Vec<u8>, cpt: u32) {
    match cpt {
        0..=0x7F => out.push(cpt as u8),
        0x80..=0x7FF => out.extend([0xC0 | (cpt >> 6) as u8, 0x80 | (cpt & 0x3F) as u8]),
        0x800..=0xFFFF => out.extend([
            0xE0 | (cpt >> 12) as u8,
            0x80 | ((cpt >> 6) & 0x3F) as u8,
            0x80 | (cpt & 0x3F) as u8,
        ]),
        _ => out.extend([
            0xF0 | ((cpt >> 18) & 0x07) as u8,
            0x80 | ((cpt >> 12) & 0x3F) as u8,
            0x80 | ((cpt >> 6) & 0x3F) as u8,
            0x80 | (cpt & 0x3F) as u8,
        ]),
    }
}

/// GPT-2's byte-level alphabet: byte -> the codepoint that stands for it in BPE vocabularies.
pub fn byte_to_cpt(b: u8) -> u32 {
    byte_tables().0[b as usize]
}

/// The byte a GPT-2 alphabet codepoint stands for, if it is one.
pub fn cpt_to_byte(c: u32) -> Option<u8> {
    byte_tables().1.get(c as usize).copied().flatten()
}

#[allow(clippy::type_complexity)]
fn byte_tables() -> &'static ([u32; 256], Vec<Option<u8>>) {
    static T: OnceLock<([u32; 256], Vec<Option<u8>>)> = OnceLock::new();
    T.get_or_init(|| {
        let mut fwd = [0u32; 256];
        let printable =
            |b: usize| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut n = 0;
        for (b, slot) in fwd.iter_mut().enumerate() {
            *slot = if printable(b) {
                b as u32
            } else {
                n += 1;
                255 + n
            };
        }
        let mut back = vec![None; 256 + 68];
        for (b, &c) in fwd.iter().enumerate() {
            back[c as usize] = Some(b as u8);
        }
        (fwd, back)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_upstream_tables() {
        assert!(flags('a' as u32).is_letter());
        assert!(flags('7' as u32).is_number());
        assert!(flags(' ' as u32).is_whitespace());
        assert!(flags(0x3000).is_whitespace());
        assert!(flags('!' as u32).is_punctuation());
        assert!(flags('$' as u32).is_symbol());
        assert!(flags(0x0301).is_accent_mark());
        assert_eq!(flags(0x110000).0, Flags::UNDEFINED);
        assert_eq!(to_lower('Ä' as u32), 'ä' as u32);
        assert_eq!(nfd_base('é' as u32), 'e' as u32);
    }

    #[test]
    fn gpt2_byte_alphabet_round_trips() {
        assert_eq!(byte_to_cpt(b' '), 0x120);
        assert_eq!(byte_to_cpt(b'a'), 'a' as u32);
        for b in 0..=255u8 {
            assert_eq!(cpt_to_byte(byte_to_cpt(b)), Some(b));
        }
    }

    #[test]
    fn bad_utf8_becomes_replacement_per_byte() {
        assert_eq!(codepoints(b"a\xffb"), vec![97, 0xFFFD, 98]);
        assert_eq!(codepoints(b"\xe2\x82"), vec![0xFFFD, 0xFFFD]);
        assert_eq!(codepoints("é".as_bytes()), vec![0xE9]);
    }
}
