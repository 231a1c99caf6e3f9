//! Tokenization identical to llama.cpp b11434: SPM, BPE with its pre-tokenizers, WPM and UGM,
//! special-token splitting, BOS/EOS rules, the end-of-generation set, and detokenization.
//!
//! Owns: turning text into token ids and ids back into bytes, from a GGUF vocabulary.
//! Must not: know about HTTP, sampling or the engine.
//!
//! Pieces are bytes, not strings: a token may hold part of a UTF-8 character, so streaming output
//! goes through [`Utf8Stream`], which holds back an incomplete character until the rest arrives.

mod bpe;
mod fxhash;
mod load;
mod pretok;
mod special;
mod spm;
mod ugm;
pub mod unicode;
mod unicode_data;
mod wpm;

use std::collections::BTreeSet;

use fxhash::FxHashMap;
use std::fmt;

pub use pretok::PreKind;

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const NORMALIZED: u32 = 1 << 6;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
    pub const SINGLE_WORD: u32 = 1 << 9;
}

/// Why a vocabulary could not be read.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizerError {
    MissingKey(String),
    BadKey { key: String, reason: String },
    UnknownModel(String),
    UnknownPre(String),
    BadPattern(String),
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::MissingKey(k) => write!(f, "vocabulary key {k} is missing"),
            TokenizerError::BadKey { key, reason } => write!(f, "vocabulary key {key}: {reason}"),
            TokenizerError::UnknownModel(m) => write!(f, "unknown tokenizer model {m:?}"),
            TokenizerError::UnknownPre(p) => write!(f, "unknown pre-tokenizer type {p:?}"),
            TokenizerError::BadPattern(p) => write!(f, "pre-tokenizer pattern: {p}"),
        }
    }
}

impl std::error::Error for TokenizerError {}

/// The tokenizer families llama.cpp implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabType {
    /// SentencePiece BPE (`tokenizer.ggml.model = llama`).
    Spm,
    /// Byte-level BPE (`gpt2`, `gemma4`, `whitespace`).
    Bpe,
    /// WordPiece (`bert`).
    Wpm,
    /// Unigram (`t5`).
    Ugm,
}

#[derive(Clone, Debug)]
pub(crate) struct TokenData {
    pub text: String,
    pub score: f32,
    pub attr: u32,
}

/// Special token ids, `None` where the vocabulary has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Switches read from the GGUF or implied by the tokenizer kind.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Options {
    pub add_space_prefix: bool,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
    pub treat_whitespace_as_suffix: bool,
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// A model's vocabulary and everything needed to tokenize with it.
pub struct Vocab {
    pub(crate) kind: VocabType,
    pub(crate) model: String,
    pub(crate) pre: PreKind,
    pub(crate) tokens: Vec<TokenData>,
    pub(crate) token_to_id: FxHashMap<String, u32>,
    /// "left right" -> merge rank.
    pub(crate) bpe_ranks: FxHashMap<String, u32>,
    pub(crate) special: SpecialIds,
    pub(crate) opts: Options,
    pub(crate) eog: BTreeSet<u32>,
    pub(crate) max_token_len: usize,
    pub(crate) pretok: Option<pretok::PreTokenizer>,
    pub(crate) specials: special::SpecialMatcher,
    pub(crate) ugm: Option<ugm::Ugm>,
    /// `token_to_piece(id, special = true)` of every id, concatenated; id i's piece is
    /// `piece_bytes[piece_ends[i - 1]..piece_ends[i]]`.
    pub(crate) piece_bytes: Vec<u8>,
    pub(crate) piece_ends: Vec<usize>,
}

impl fmt::Debug for Vocab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vocab")
            .field("kind", &self.kind)
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("n_tokens", &self.tokens.len())
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

impl Vocab {
    /// Reads the vocabulary of a GGUF file the way llama.cpp's loader does.
    pub fn from_gguf(gguf: &crate::model::gguf::GgufFile) -> Result<Vocab, TokenizerError> {
        load::load(gguf)
    }

    pub fn vocab_type(&self) -> VocabType {
        self.kind
    }

    /// `tokenizer.ggml.model` as read.
    pub fn model_name(&self) -> &str {
        &self.model
    }

    pub fn pre_kind(&self) -> PreKind {
        self.pre
    }

    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// The token's text as stored in the vocabulary (empty for an id out of range).
    pub fn token_text(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map_or("", |t| t.text.as_str())
    }

    pub fn token_score(&self, id: u32) -> f32 {
        self.tokens.get(id as usize).map_or(0.0, |t| t.score)
    }

    /// Attribute bits of a token (see [`attr`]); 0 for an id out of range.
    pub fn token_attr(&self, id: u32) -> u32 {
        self.tokens.get(id as usize).map_or(0, |t| t.attr)
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id) & attr::CONTROL != 0
    }

    /// The id of a token by its exact text.
    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn special_ids(&self) -> SpecialIds {
        self.special
    }

    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.special.eot
    }

    pub fn add_bos(&self) -> bool {
        self.opts.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.opts.add_eos
    }

    pub fn add_sep(&self) -> bool {
        self.opts.add_sep
    }

    /// Whether generating this token ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Every end-of-generation token, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// Text to ids. `add_special` adds BOS/EOS (and WPM's SEP) as the vocabulary asks;
    /// `parse_special` lets control tokens written in the text become their ids (user-defined
    /// tokens always do).
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = self.specials.partition(text, parse_special, &self.tokens);
        let mut out = Vec::new();
        match self.kind {
            VocabType::Spm => self.tokenize_spm(text, &frags, add_special, &mut out),
            VocabType::Bpe => {
                if add_special && self.opts.add_bos {
                    out.extend(self.special.bos);
                }
                for f in &frags {
                    match *f {
                        special::Fragment::Token(id) => out.push(id),
                        special::Fragment::Text(a, b) => {
                            if self.opts.escape_whitespaces {
                                self.bpe_text(&text[a..b].replace(' ', "\u{2581}"), &mut out)
                            } else {
                                self.bpe_text(&text[a..b], &mut out)
                            }
                        }
                    }
                }
                if add_special && self.opts.add_eos {
                    out.extend(self.special.eos);
                }
            }
            VocabType::Wpm => {
                if add_special {
                    out.extend(self.special.bos);
                }
                for f in &frags {
                    match *f {
                        special::Fragment::Token(id) => out.push(id),
                        special::Fragment::Text(a, b) => self.wpm_text(&text[a..b], &mut out),
                    }
                }
                if add_special {
                    out.extend(self.special.sep);
                }
            }
            VocabType::Ugm => {
                if add_special && self.opts.add_bos {
                    out.extend(self.special.bos);
                }
                for f in &frags {
                    match *f {
                        special::Fragment::Token(id) => out.push(id),
                        special::Fragment::Text(a, b) => self.ugm_text(&text[a..b], &mut out),
                    }
                }
                if add_special && self.opts.add_eos {
                    out.extend(self.special.eos);
                }
            }
        }
        out
    }

    fn tokenize_spm(
        &self,
        text: &str,
        frags: &[special::Fragment],
        add_special: bool,
        out: &mut Vec<u32>,
    ) {
        if add_special && self.opts.add_bos {
            out.extend(self.special.bos);
        }
        // the first fragment, and any right after a special token, gets the space prefix
        let mut prev_special = true;
        for f in frags {
            match *f {
                special::Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                special::Fragment::Text(a, b) => {
                    let mut s = String::with_capacity(b - a + 3);
                    if self.opts.add_space_prefix && prev_special {
                        s.push(' ');
                    }
                    s.push_str(&text[a..b]);
                    self.spm_text(&s.replace(' ', "\u{2581}"), out);
                    prev_special = false;
                }
            }
        }
        if add_special && self.opts.add_eos {
            out.extend(self.special.eos);
        }
    }

    /// One token's bytes. With `special` false, control and unknown tokens give nothing.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        self.piece(id, special, 0).to_vec()
    }

    /// The piece with up to `lstrip` leading spaces removed.
    fn piece(&self, id: u32, special: bool, lstrip: usize) -> &[u8] {
        let a = self.token_attr(id);
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return &[];
        }
        let i = id as usize;
        let mut p: &[u8] = match self.piece_ends.get(i) {
            Some(&end) => &self.piece_bytes[if i == 0 { 0 } else { self.piece_ends[i - 1] }..end],
            None => &[],
        };
        for _ in 0..lstrip {
            match p.split_first() {
                Some((b' ', rest)) => p = rest,
                _ => break,
            }
        }
        p
    }

    /// The piece of a token computed from its text and attributes (what the cache holds).
    fn compute_piece(&self, id: u32) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let a = t.attr;
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return t.text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            if self.kind == VocabType::Bpe && !self.opts.escape_whitespaces {
                return decode_byte_level(&t.text);
            }
            return t.text.replace('\u{2581}', " ").into_bytes();
        }
        if a & attr::BYTE != 0 && self.kind != VocabType::Wpm {
            return t
                .text
                .get(3..5)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .map_or_else(Vec::new, |b| vec![b]);
        }
        Vec::new()
    }

    /// Ids to bytes, as upstream's `llama_detokenize`: `remove_special` drops the BOS/EOS the
    /// vocabulary adds; `unparse_special` renders control tokens as their text.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.opts.add_space_prefix;
        if remove_special && self.opts.add_bos {
            if let (Some(&first), Some(bos)) = (ids.first(), self.special.bos) {
                if first == bos {
                    remove_space = false;
                    ids = &ids[1..];
                }
            }
        }
        if remove_special && self.opts.add_eos {
            if let (Some(&last), Some(eos)) = (ids.last(), self.special.eos) {
                if last == eos {
                    ids = &ids[..ids.len() - 1];
                }
            }
        }
        let mut text = Vec::new();
        for &id in ids {
            text.extend_from_slice(self.piece(id, unparse_special, remove_space as usize));
            remove_space = false;
        }
        if self.opts.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }
}

/// GPT-2 byte-level token text back to bytes; a codepoint outside the alphabet is written the way
/// upstream writes it.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for ch in text.chars() {
        match unicode::cpt_to_byte(ch as u32) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in ch.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// `clean_up_tokenization_spaces`: " ?" " !" " ." " ," lose the space, " ' " loses both spaces,
/// " 's" " 'm" " 're" " 've" lose the space.
fn clean_up_spaces(text: &mut Vec<u8>) {
    let t = std::mem::take(text);
    // pass 1
    let mut a: Vec<u8> = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // pass 2: upstream blanks the following space in place and reads it back as a zero byte
    let mut src = a;
    let mut b: Vec<u8> = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            b.pop();
            src[i + 1] = 0;
            b.push(x);
            i += 2;
            continue;
        }
        b.push(x);
        i += 1;
    }
    // pass 3
    let mut c: Vec<u8> = Vec::with_capacity(b.len());
    for (i, &x) in b.iter().enumerate() {
        if i > 0 && b[i - 1] == b' ' && x == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let drop = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => i + 2 < b.len() && (x1 == b'r' || x1 == b'v') && b[i + 2] == b'e',
            };
            if drop {
                c.pop();
            }
        }
        c.push(x);
    }
    *text = c;
}

/// Joins streamed pieces into text, holding back a UTF-8 character split across pieces.
#[derive(Default, Debug, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Utf8Stream {
        Utf8Stream::default()
    }

    /// Adds a piece and returns the text now complete (invalid bytes become U+FFFD); an
    /// unfinished character at the end waits for the next piece.
    pub fn push(&mut self, piece: &[u8]) -> String {
        self.pending.extend_from_slice(piece);
        let keep = incomplete_tail(&self.pending);
        let ready = self.pending.len() - keep;
        let out = String::from_utf8_lossy(&self.pending[..ready]).into_owned();
        self.pending.drain(..ready);
        out
    }

    /// Bytes held back so far.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back is returned, invalid bytes as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// Length of an unfinished UTF-8 sequence at the end of `b` (0 if the end is complete).
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(4) {
        let c = b[b.len() - back];
        if c & 0xC0 == 0x80 {
            continue;
        }
        let need = match c {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_holds_back_split_characters() {
        let mut s = Utf8Stream::new();
        let euro = "€".as_bytes();
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&euro[2..]), "€");
        assert_eq!(s.push(b"\xff"), "\u{FFFD}");
        assert_eq!(s.push(&euro[..2]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    #[test]
    fn clean_spaces_matches_upstream_passes() {
        let mut t = b"Hello , world ! it 's a ' quote ' and we 're done .".to_vec();
        clean_up_spaces(&mut t);
        assert_eq!(t, b"Hello, world! it's a'quote'and we're done.".to_vec());
    }
}
