//! The inference engine: forward passes per architecture family over the CPU backend, the KV cache
//! and batches of sequences. Parses no flags and knows nothing about HTTP.
//!
//! The server drives an engine only through [`Forward`], the same shape as llama.cpp's
//! `llama_decode` plus its memory calls: a batch of (token, position, sequence, wants-logits)
//! entries in, logits for the marked entries out.

use std::fmt;

use crate::model::{GgmlType, GgufFile};

mod arch;
mod attention;
mod dump;
mod gpu;
mod kv;
mod mla;
mod model;
mod moe;
pub mod tier;

pub use arch::{RopeOverrides, RopeScaling};
pub use gpu::GROUP_ROWS;
mod weights;

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

    /// Refuses a batch whose columns differ in length, or that names a token outside the
    /// vocabulary or a sequence that was not allocated: the checks every backend makes before
    /// anything runs.
    pub fn check_shape(&self, n_vocab: usize, n_seq_max: usize) -> Result<(), EngineError> {
        let n = self.tokens.len();
        if self.pos.len() != n || self.seq.len() != n || self.logits.len() != n {
            return Err(EngineError::BadBatch(format!(
                "lengths differ: {} tokens, {} positions, {} sequence ids, {} logits flags",
                n,
                self.pos.len(),
                self.seq.len(),
                self.logits.len()
            )));
        }
        for i in 0..n {
            if self.tokens[i] as usize >= n_vocab {
                return Err(EngineError::BadBatch(format!(
                    "token {} at entry {i} is outside the vocabulary of {n_vocab}",
                    self.tokens[i]
                )));
            }
            if self.seq[i] as usize >= n_seq_max {
                return Err(EngineError::BadBatch(format!(
                    "sequence {} at entry {i}: only {n_seq_max} sequences were allocated",
                    self.seq[i]
                )));
            }
        }
        Ok(())
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

/// A sequence's cached positions saved apart from the engine, for the host prompt cache.
pub struct SeqState {
    /// Bytes it holds.
    pub bytes: usize,
    data: Box<dyn std::any::Any + Send>,
}

impl SeqState {
    pub fn new<T: std::any::Any + Send>(data: T, bytes: usize) -> Self {
        SeqState {
            bytes,
            data: Box::new(data),
        }
    }

    /// The saved data, when it is of the engine's type.
    pub fn get<T: std::any::Any>(&self) -> Option<&T> {
        self.data.downcast_ref()
    }
}

/// What the server needs from a loaded model.
pub trait Forward: Send {
    /// Vocabulary size: the length of each logits row.
    fn n_vocab(&self) -> usize;
    /// Context length per sequence this engine was loaded with.
    fn n_ctx_seq(&self) -> usize;
    /// The model's sliding attention window in tokens; 0 when no layer has one.
    fn n_swa(&self) -> usize {
        0
    }
    /// Runs one step; appends one logits row (`n_vocab` floats) to `out` per entry whose
    /// `logits` flag is set, in batch order.
    fn decode(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError>;
    /// Width of the hidden states [`decode_embd`](Forward::decode_embd) returns (`n_embd`).
    fn n_embd(&self) -> usize;
    /// Whether steps return each flagged entry's hidden state after the output norm (`n_embd`
    /// floats: llama.cpp's `t_embd`, before any pooling) instead of its logits.
    fn output_hidden(&mut self, on: bool);
    /// Runs one step as [`decode`](Forward::decode) does, but returning hidden states (see
    /// [`output_hidden`](Forward::output_hidden)). The server's embeddings and reranking read
    /// these.
    fn decode_embd(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.output_hidden(true);
        let result = self.decode(batch, out);
        self.output_hidden(false);
        result
    }
    /// Drops the cached positions `[p0, p1)` of `seq` (`p1 = None`: to the end).
    fn seq_rm(&mut self, seq: SeqId, p0: u32, p1: Option<u32>);
    /// Copies the cached positions `[0, n)` of `src` into `dst` (prompt-cache reuse).
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, n: u32);
    /// Whether [`seq_add`](Forward::seq_add) can move cached positions (llama.cpp's
    /// `llama_memory_can_shift`): the server's `--cache-reuse` needs it.
    fn can_shift(&self) -> bool {
        false
    }
    /// Moves `seq`'s cached positions `[p0, p1)` by `delta`, their keys rotated to the new
    /// positions as llama.cpp's K-shift rotates them. Does nothing where
    /// [`can_shift`](Forward::can_shift) is false.
    fn seq_add(&mut self, _seq: SeqId, _p0: u32, _p1: u32, _delta: i32) {}
    /// Saves `seq`'s cached positions for the host prompt cache; `None` when the sequence is
    /// empty or this engine cannot (the default).
    fn seq_save(&self, _seq: SeqId) -> Option<SeqState> {
        None
    }
    /// Replaces `seq`'s cached positions with saved ones; false when this engine cannot.
    fn seq_load(&mut self, _seq: SeqId, _state: &SeqState) -> bool {
        false
    }
    /// Starts counting (from zero) the tokens each MoE layer routes to each of its experts, for
    /// [`route_counts`](Forward::route_counts); off until called, costing nothing then. False
    /// when this engine does not count: only the CPU engine does, since the CUDA engine routes
    /// on the card and counting there would read every step's choices back.
    fn count_routes(&mut self) -> bool {
        false
    }
    /// The routes counted since [`count_routes`](Forward::count_routes) (dense layers stay at
    /// zero); `None` when not counting.
    fn route_counts(&self) -> Option<&tier::heat::Heat> {
        None
    }
}

/// What `load` needs besides the file: the llama-server options that shape the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineParams {
    /// Context length per sequence (`-c` divided among `--parallel` slots).
    pub n_ctx_seq: usize,
    /// Sequences (slots) that may be cached at once.
    pub n_seq_max: usize,
    /// Threads for decode steps (`-t`).
    pub n_threads: usize,
    /// Threads for prompt batches (`-tb`).
    pub n_threads_batch: usize,
    /// Tokens per forward pass (`-ub`).
    pub n_ubatch: usize,
    /// KV cache types (`-ctk`, `-ctv`).
    pub type_k: GgmlType,
    pub type_v: GgmlType,
    /// The CUDA card that serves the model, or `None` to serve on the CPU.
    pub gpu: Option<usize>,
    /// `--kv-unified` and `--swa-full`: upstream's cache sizes follow them, and with them which
    /// of ggml's attention kernels a step takes (see `kv::UpstreamLayout`).
    pub kv_unified: bool,
    pub swa_full: bool,
    /// With a card: the experts of each layer (ascending indices) that get a card copy; the
    /// others stay in host memory, computed there for small batches and streamed through the
    /// card for long prompts. `None`: every expert on the card.
    pub card_experts: Option<CardExperts>,
    /// `--rope-*` and `--yarn-*` over the model's RoPE parameters.
    pub rope: RopeOverrides,
}

/// Per layer, the ascending indices of the experts with a card copy (empty for a dense layer or
/// one whose experts all live on the host).
pub type CardExperts = Vec<Vec<u32>>;

impl Default for EngineParams {
    fn default() -> Self {
        EngineParams {
            n_ctx_seq: 4096,
            n_seq_max: 1,
            n_threads: 2,
            n_threads_batch: 2,
            n_ubatch: 512,
            type_k: GgmlType::F16,
            type_v: GgmlType::F16,
            kv_unified: false,
            swa_full: false,
            gpu: None,
            card_experts: None,
            rope: RopeOverrides::default(),
        }
    }
}

/// Loads the model in `gguf` on the card `params.gpu` names, or on the CPU; an architecture we
/// do not serve is refused by name. Weights the card's kernels cannot read yet are served on the
/// CPU, with a warning that names them.
pub fn load(gguf: &GgufFile, params: &EngineParams) -> Result<Box<dyn Forward>, EngineError> {
    let arch_name = gguf
        .architecture()
        .ok_or_else(|| EngineError::Load("the file has no general.architecture".into()))?;
    let spec = arch::spec(arch_name)?;
    let keys = arch::Keys {
        gguf,
        arch: arch_name,
    };
    let hp = arch::Hparams::read(spec, &keys, &params.rope)?;
    let loader = weights::Loader::new(gguf)?;
    // a family the CUDA engine does not build is refused before any weight is read for the card
    let card = params.gpu.filter(|_| {
        if !spec.cuda {
            log::warn!(
                "serving on the CPU: the CUDA engine does not build {} layers yet",
                spec.name
            );
        }
        spec.cuda
    });
    if let Some(ordinal) = card {
        let w = model::Weights::load(spec, &hp, &loader)?;
        match gpu::unsupported(&w, &hp, params) {
            Some(why) => log::warn!("serving on the CPU: {why}"),
            None => {
                let cuda = crate::backend::cuda::Cuda::open(ordinal)?;
                log::info!(
                    "loading the whole model onto CUDA{ordinal} ({})",
                    cuda.gpu.info.description
                );
                return Ok(Box::new(gpu::GpuModel::load(spec, hp, &w, params, cuda)?));
            }
        }
    }
    Ok(Box::new(model::Model::load(spec, hp, &loader, params)?))
}
