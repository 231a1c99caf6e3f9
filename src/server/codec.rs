//! What the server needs from a tokenizer, behind one trait so the server can be built and tested
//! before (and independently of) the real vocabulary.

use crate::sampling::DryVocab;
use crate::tokenizer::SpecialIds;

pub trait TextCodec: Send + Sync {
    /// Vocabulary size.
    fn n_tokens(&self) -> usize;
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32>;
    /// The bytes of one token; `special` renders control tokens as their text.
    fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8>;
    /// Tokens back to text, as llama.cpp's `common_detokenize` (`special` keeps control tokens).
    fn detokenize(&self, tokens: &[u32], special: bool) -> Vec<u8>;
    /// End-of-generation tokens (EOS, EOT and the like).
    fn is_eog(&self, id: u32) -> bool;
    /// Every end-of-generation token, for `ignore_eos`.
    fn eog_tokens(&self) -> Vec<u32>;
    /// Whether tokenizing with `add_special` prepends BOS.
    fn add_bos(&self) -> bool;
    /// Whether the vocabulary appends EOS / SEP to special-token sequences (reranking prompts
    /// put them between query and document).
    fn add_eos(&self) -> bool {
        false
    }
    fn add_sep(&self) -> bool {
        false
    }

    /// The vocabulary's special tokens (BOS, the fill-in-the-middle ones, ...).
    fn special_ids(&self) -> SpecialIds {
        SpecialIds::default()
    }

    /// The one token `text` (special tokens parsed) is, if it is exactly one.
    fn single_token(&self, text: &str) -> Option<u32> {
        match self.tokenize(text, false, true)[..] {
            [one] => Some(one),
            _ => None,
        }
    }
}

/// DRY reads the vocabulary through the codec.
pub struct CodecVocab<'a>(pub &'a dyn TextCodec);

impl DryVocab for CodecVocab<'_> {
    fn n_tokens(&self) -> usize {
        self.0.n_tokens()
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.0.detokenize(&[id], true)
    }

    fn tokenize_plain(&self, text: &str) -> Vec<u32> {
        self.0.tokenize(text, false, false)
    }
}

/// The real vocabulary: upstream's `common_tokenize`, `common_token_to_piece` and
/// `common_detokenize` (which keeps BOS/EOS).
impl TextCodec for crate::tokenizer::Vocab {
    fn n_tokens(&self) -> usize {
        crate::tokenizer::Vocab::n_tokens(self)
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        crate::tokenizer::Vocab::tokenize(self, text, add_special, parse_special)
    }

    fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        crate::tokenizer::Vocab::token_to_piece(self, id, special)
    }

    fn detokenize(&self, tokens: &[u32], special: bool) -> Vec<u8> {
        crate::tokenizer::Vocab::detokenize(self, tokens, false, special)
    }

    fn is_eog(&self, id: u32) -> bool {
        crate::tokenizer::Vocab::is_eog(self, id)
    }

    fn eog_tokens(&self) -> Vec<u32> {
        self.eog_ids().collect()
    }

    fn add_bos(&self) -> bool {
        crate::tokenizer::Vocab::add_bos(self)
    }

    fn add_eos(&self) -> bool {
        crate::tokenizer::Vocab::add_eos(self)
    }

    fn add_sep(&self) -> bool {
        crate::tokenizer::Vocab::add_sep(self)
    }

    fn special_ids(&self) -> SpecialIds {
        crate::tokenizer::Vocab::special_ids(self)
    }
}
