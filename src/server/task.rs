//! One completion task as the scheduler sees it: the prompt tokens and per-request parameters
//! going in, the token events and final result coming out.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use crate::sampling::SamplingParams;

/// Upstream's `task_params`: everything a request may set besides its prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskParams {
    pub sampling: SamplingParams,
    pub stream: bool,
    pub include_usage: bool,
    pub cache_prompt: bool,
    pub return_tokens: bool,
    pub return_progress: bool,
    pub timings_per_token: bool,
    pub post_sampling_probs: bool,
    pub verbose: bool,
    /// -1: until the context is full or an end token.
    pub n_predict: i32,
    pub n_indent: i32,
    pub n_keep: i32,
    pub n_discard: i32,
    pub n_cmpl: i32,
    pub n_cache_reuse: i32,
    pub t_max_predict_ms: i64,
    pub stop: Vec<String>,
    pub response_fields: Vec<String>,
    /// Render control tokens in the output text.
    pub special: bool,
    /// What a chat template appended to start the reply (`<|im_start|>assistant\n`); schema
    /// and tool-call grammars read it before the first sampled token.
    pub generation_prompt: String,
    /// `message_delimiters`: (role, text) pairs marking where a chat prompt's messages start,
    /// as a chat request passes its template's on; the user messages' starts end prompt
    /// batches where upstream takes context checkpoints.
    pub message_delimiters: Vec<(String, String)>,
    /// Fill-in-the-middle tasks take no context checkpoints upstream.
    pub infill: bool,
    /// What the task computes.
    pub kind: TaskKind,
    /// An embedding's normalization (`--embd-normalize` or the request's `embd_normalize`).
    pub embd_normalize: i32,
}

/// What a task computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskKind {
    /// Tokens generated after the prompt.
    #[default]
    Completion,
    /// The prompt's hidden states, pooled and normalized as the server's pooling says.
    Embedding,
    /// A reranking score: the first value of the prompt's pooled (rank) state.
    Rerank,
}

impl Default for TaskParams {
    fn default() -> Self {
        TaskParams {
            sampling: SamplingParams::default(),
            stream: false,
            include_usage: false,
            cache_prompt: true,
            return_tokens: false,
            return_progress: false,
            timings_per_token: false,
            post_sampling_probs: false,
            verbose: false,
            n_predict: -1,
            n_indent: 0,
            n_keep: 0,
            n_discard: 0,
            n_cmpl: 1,
            n_cache_reuse: 0,
            t_max_predict_ms: -1,
            stop: Vec::new(),
            response_fields: Vec::new(),
            special: false,
            message_delimiters: Vec::new(),
            infill: false,
            generation_prompt: String::new(),
            kind: TaskKind::Completion,
            embd_normalize: 2,
        }
    }
}

/// A task handed to the scheduler.
pub struct TaskRequest {
    pub tokens: Vec<u32>,
    pub params: Arc<TaskParams>,
    /// -1: any free slot.
    pub id_slot: i32,
    /// Position of this result among a request's several prompts.
    pub index: usize,
    pub events: UnboundedSender<Event>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopType {
    None,
    Eos,
    Word,
    Limit,
}

impl StopType {
    pub fn as_str(self) -> &'static str {
        match self {
            StopType::None => "none",
            StopType::Eos => "eos",
            StopType::Word => "word",
            StopType::Limit => "limit",
        }
    }
}

/// One candidate in an `n_probs` list.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenProb {
    pub id: u32,
    pub piece: Vec<u8>,
    pub p: f32,
}

/// One generated token as streamed.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOutput {
    pub id: u32,
    /// Text released to the client with this token (held back while a stop word may begin).
    pub text: String,
    /// The token's own bytes.
    pub piece: Vec<u8>,
    pub prob: f32,
    pub probs: Vec<TokenProb>,
}

/// Prompt and generation counters and times of one task (upstream's `server_slot_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    pub n_prompt_cached: usize,
    pub n_prompt_processed: usize,
    pub n_gen: usize,
    pub prompt_ms: f64,
    pub gen_ms: f64,
}

impl Timings {
    fn n_gen_steps(&self) -> usize {
        self.n_gen.saturating_sub(1)
    }

    pub fn prompt_per_token_ms(&self) -> f64 {
        if self.n_prompt_processed > 0 {
            self.prompt_ms / self.n_prompt_processed as f64
        } else {
            0.0
        }
    }

    pub fn prompt_per_second(&self) -> f64 {
        if self.prompt_ms > 0.0 {
            1e3 / self.prompt_ms * self.n_prompt_processed as f64
        } else {
            0.0
        }
    }

    pub fn gen_per_token_ms(&self) -> f64 {
        if self.n_gen_steps() > 0 {
            self.gen_ms / self.n_gen_steps() as f64
        } else {
            0.0
        }
    }

    pub fn gen_per_second(&self) -> f64 {
        if self.gen_ms > 0.0 {
            1e3 / self.gen_ms * self.n_gen_steps() as f64
        } else {
            0.0
        }
    }
}

/// The end of a task.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalResult {
    pub index: usize,
    pub id_slot: usize,
    /// Whole text (empty when streamed: the chunks carried it).
    pub content: String,
    pub tokens: Vec<u32>,
    pub probs: Vec<TokenOutput>,
    pub prompt: String,
    pub stop: StopType,
    pub stopping_word: String,
    pub truncated: bool,
    pub has_new_line: bool,
    pub n_decoded: usize,
    pub n_prompt_tokens: usize,
    pub n_prompt_cached: usize,
    pub n_tokens_cached: usize,
    pub timings: Timings,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    Authentication,
    Server,
    NotFound,
    Permission,
    Unavailable,
    NotSupported,
    ExceedContextSize {
        n_prompt_tokens: usize,
        n_ctx: usize,
    },
}

impl ErrorKind {
    pub fn code(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ExceedContextSize { .. } => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::Permission => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::Server => 500,
            ErrorKind::NotSupported => 501,
            ErrorKind::Unavailable => 503,
        }
    }

    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Permission => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::Server => "server_error",
            ErrorKind::NotSupported => "not_supported_error",
            ErrorKind::Unavailable => "unavailable_error",
            ErrorKind::ExceedContextSize { .. } => "exceed_context_size_error",
        }
    }
}

/// An error with upstream's classification.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskError {
    pub kind: ErrorKind,
    pub message: String,
}

impl TaskError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        TaskError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }
}

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.type_name())
    }
}

/// What a task's receiver gets, in order: tokens (when streaming, or always for timing), then
/// exactly one `Final` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token {
        index: usize,
        token: TokenOutput,
        n_decoded: usize,
        n_prompt_tokens: usize,
        n_prompt_cached: usize,
        /// Present on every chunk when `timings_per_token`.
        timings: Option<Timings>,
    },
    Final(Box<FinalResult>),
    /// The end of an embedding or reranking task.
    Embd(Box<EmbdResult>),
    Error(TaskError),
}

/// An embedding or reranking task's result: its rows (one pooled vector, or every token's
/// with pooling none) and the prompt tokens it evaluated.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbdResult {
    pub index: usize,
    pub rows: Vec<Vec<f32>>,
    pub n_tokens: usize,
}
