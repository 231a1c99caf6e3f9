//! The inference engine: forward passes per architecture family over the CPU backend, the KV cache
//! and batches of sequences. Parses no flags and knows nothing about HTTP.
//!
//! The server drives an engine only through [`Forward`], the same shape as llama.cpp's
//! `llama_decode` plus its memory calls: a batch of (token, position, sequence, wants-logits)
//! entries in, logits for the marked entries out.

use std::fmt;

/// A sequence (one slot's conversation) in the KV cache.
pub type SeqId = u32;

/// One engine step: entry `i` is token `tokens[i]` at position `pos[i]` of sequence `seq[i]`.
/// Entries of one sequence appear in position order; several sequences may share a batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<u32>,
    pub seq: Vec<SeqId>,
    /// Whether logits are wanted for entry `i`.
    pub logits: Vec<bool>,
}

impl Batch {
    pub fn push(&mut self, token: u32, pos: u32, seq: SeqId, logits: bool) {
        self.tokens.push(token);
        self.pos.push(pos);
        self.seq.push(seq);
        self.logits.push(logits);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum EngineError {
    /// The batch is malformed (lengths differ, token out of vocabulary, position beyond context).
    BadBatch(String),
    /// The KV cache has no room for the batch.
    NoSpace {
        seq: SeqId,
        needed: usize,
        capacity: usize,
    },
    /// Loading failed: what and why.
    Load(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::BadBatch(why) => write!(f, "bad batch: {why}"),
            EngineError::NoSpace {
                seq,
                needed,
                capacity,
            } => write!(
                f,
                "KV cache full for sequence {seq}: {needed} cells needed, {capacity} available"
            ),
            EngineError::Load(why) => write!(f, "load failed: {why}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// What the server needs from a loaded model.
pub trait Forward: Send {
    /// Vocabulary size: the length of each logits row.
    fn n_vocab(&self) -> usize;
    /// Context length per sequence this engine was loaded with.
    fn n_ctx_seq(&self) -> usize;
    /// Runs one step; appends one logits row (`n_vocab` floats) to `out` per entry whose
    /// `logits` flag is set, in batch order.
    fn decode(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError>;
    /// Drops the cached positions `[p0, p1)` of `seq` (`p1 = None`: to the end).
    fn seq_rm(&mut self, seq: SeqId, p0: u32, p1: Option<u32>);
    /// Copies the cached positions `[0, n)` of `src` into `dst` (prompt-cache reuse).
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, n: u32);
}
