//! The server's view of a tokenizer ([`TextCodec`]) answered by the real vocabulary.

use crate::server::codec::TextCodec;

use super::Vocab;

impl TextCodec for Vocab {
    fn n_tokens(&self) -> usize {
        Vocab::n_tokens(self)
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        Vocab::tokenize(self, text, add_special, parse_special)
    }

    fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        Vocab::token_to_piece(self, id, special)
    }

    /// `common_detokenize`: nothing removed, control tokens rendered only with `special`.
    fn detokenize(&self, tokens: &[u32], special: bool) -> Vec<u8> {
        Vocab::detokenize(self, tokens, false, special)
    }

    fn is_eog(&self, id: u32) -> bool {
        Vocab::is_eog(self, id)
    }

    fn eog_tokens(&self) -> Vec<u32> {
        self.eog_ids().collect()
    }

    fn add_bos(&self) -> bool {
        Vocab::add_bos(self)
    }
}
