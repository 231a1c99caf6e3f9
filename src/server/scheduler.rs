//! The scheduler thread: it owns the engine and the slots, and runs llama-server's loop. Each
//! step puts the next token of every generating slot and a share of pending prompt tokens into
//! one batch (continuous batching), so a long prompt advances one ubatch at a time between
//! decode steps instead of freezing the streams already running.
//!
//! A slot keeps the tokens its sequence holds in the KV cache after a task ends; the next task
//! that shares a prefix (`cache_prompt`) only evaluates the rest. A task whose receiver is gone
//! (the client disconnected) is dropped at the next step and its slot freed.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::checkpoints::{user_starts, CheckpointPolicy, Checkpoints, UserStarts};
use super::codec::{CodecVocab, TextCodec};
use super::embed::{Pooler, Pooling};
use super::prompt_cache::{Entry, PromptCache};
use super::task::{
    EmbdResult, ErrorKind, Event, FinalResult, StopType, TaskError, TaskKind, TaskParams,
    TaskRequest, Timings, TokenOutput, TokenProb,
};
use crate::engine::{Batch, Forward, SeqId};
use crate::grammar::{Grammar, GrammarState, TokenTexts, Triggers};
use crate::sampling::{token_probabilities, utf8_complete, GrammarSource, GrammarTrigger, Sampler};

/// How slots keep prompts: upstream's context checkpoints (which, with the model's attention
/// window, decide where prompt batches end: `server::checkpoints`) and its host-memory prompt
/// cache (`server::prompt_cache`).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheOptions {
    /// `--kv-unified`: the slots share one KV pool.
    pub kv_unified: bool,
    /// `--ctx-checkpoints`, `--checkpoint-min-step`, `--swa-full`.
    pub ctx_checkpoints: i32,
    pub checkpoint_min_step: i32,
    pub swa_full: bool,
    /// `--cache-ram` (MiB; 0: no host prompt cache, -1: no limit) and `--cache-idle-slots`.
    pub cache_ram_mib: i32,
    pub cache_idle_slots: bool,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            kv_unified: false,
            ctx_checkpoints: 32,
            checkpoint_min_step: 8192,
            swa_full: false,
            cache_ram_mib: 8192,
            cache_idle_slots: true,
        }
    }
}

/// How the scheduler runs; the server maps its own parameters onto this.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub n_slots: usize,
    /// Per-slot context; 0 takes the engine's.
    pub n_ctx_slot: usize,
    /// Most prompt tokens evaluated in one step (with the running decodes).
    pub n_ubatch: usize,
    /// `-b`: with checkpoints, a prompt's last batches are cut to it.
    pub n_batch: usize,
    pub cache: CacheOptions,
    /// Fraction of a prompt that must match a slot's cache to prefer that slot.
    pub slot_prompt_similarity: f32,
    /// Context shift when a generation reaches the end of its slot's context.
    pub ctx_shift: bool,
    /// Where `/slots` save and restore files live; `None` refuses those actions.
    pub slot_save_path: Option<PathBuf>,
    /// Server-wide default for `n_predict` when a request sets none (-1: unlimited).
    pub n_predict: i32,
    /// How embedding and reranking tasks pool the prompt's hidden states.
    pub pooling: Pooling,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            n_slots: 1,
            n_ctx_slot: 0,
            n_ubatch: 512,
            n_batch: 2048,
            cache: CacheOptions::default(),
            slot_prompt_similarity: 0.1,
            ctx_shift: false,
            slot_save_path: None,
            n_predict: -1,
            pooling: Pooling::None,
        }
    }
}

/// A slot as `/slots` shows it.
#[derive(Clone, Debug)]
pub struct SlotInfo {
    pub id: usize,
    pub n_ctx: usize,
    pub is_processing: bool,
    pub id_task: Option<u64>,
    pub params: Option<Arc<TaskParams>>,
    pub n_prompt_tokens: usize,
    pub n_prompt_tokens_processed: usize,
    pub n_prompt_tokens_cache: usize,
    pub has_next_token: bool,
    pub has_new_line: bool,
    pub n_remain: i64,
    pub n_decoded: usize,
    pub prompt: String,
    pub generated: String,
}

/// Cumulative counters behind `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics {
    pub n_prompt_tokens_processed_total: u64,
    pub n_prompt_tokens_cached_total: u64,
    pub t_prompt_processing_total_us: u64,
    pub n_tokens_predicted_total: u64,
    pub t_tokens_generation_total_us: u64,
    pub n_decode_total: u64,
    pub n_busy_slots_total: u64,
    pub n_tokens_max: u64,
    /// Since the last `/metrics` read (upstream resets these buckets then).
    pub bucket_prompt_steps: u64,
    pub bucket_prompt_us: u64,
    pub bucket_predict_steps: u64,
    pub bucket_predict_us: u64,
    pub n_processing: u64,
    pub n_deferred: u64,
}

impl Metrics {
    pub fn prompt_tokens_per_second(&self) -> f64 {
        rate(self.bucket_prompt_steps, self.bucket_prompt_us)
    }

    pub fn predicted_tokens_per_second(&self) -> f64 {
        rate(self.bucket_predict_steps, self.bucket_predict_us)
    }
}

fn rate(steps: u64, us: u64) -> f64 {
    if us > 0 {
        steps as f64 / us as f64 * 1e6
    } else {
        0.0
    }
}

/// Result of a `/slots` action.
#[derive(Clone, Debug, PartialEq)]
pub enum SlotActionResult {
    Saved {
        id_slot: usize,
        filename: String,
        n_saved: usize,
        n_written: usize,
        ms: f64,
    },
    Restored {
        id_slot: usize,
        filename: String,
        n_restored: usize,
        n_read: usize,
        ms: f64,
    },
    Erased {
        id_slot: usize,
        n_erased: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotAction {
    Save(String),
    Restore(String),
    Erase,
}

type ActionReply = oneshot::Sender<Result<SlotActionResult, TaskError>>;

/// A slot action waiting for its slot to be free.
type PendingAction = (i64, SlotAction, ActionReply);

enum Command {
    Submit(TaskRequest, u64),
    Slots(oneshot::Sender<Vec<SlotInfo>>),
    Metrics {
        reset_bucket: bool,
        reply: oneshot::Sender<Metrics>,
    },
    SlotAction {
        id_slot: i64,
        action: SlotAction,
        reply: ActionReply,
    },
    Shutdown,
}

/// The handle HTTP handlers use; cheap to clone.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
    ready: Arc<AtomicBool>,
    pub n_slots: usize,
    pub n_ctx_slot: usize,
    pub n_vocab: usize,
}

impl SchedulerHandle {
    /// Queues a task; returns its id.
    pub fn submit(&self, task: TaskRequest) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::SendError(Command::Submit(task, _))) =
            self.tx.send(Command::Submit(task, id))
        {
            let _ = task.events.send(Event::Error(TaskError::new(
                ErrorKind::Unavailable,
                "the scheduler has stopped",
            )));
        }
        id
    }

    pub async fn slots(&self) -> Vec<SlotInfo> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::Slots(reply)).is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    pub async fn metrics(&self, reset_bucket: bool) -> Metrics {
        let (reply, rx) = oneshot::channel();
        if self
            .tx
            .send(Command::Metrics {
                reset_bucket,
                reply,
            })
            .is_err()
        {
            return Metrics::default();
        }
        rx.await.unwrap_or_default()
    }

    pub async fn slot_action(
        &self,
        id_slot: i64,
        action: SlotAction,
    ) -> Result<SlotActionResult, TaskError> {
        let (reply, rx) = oneshot::channel();
        let stopped = || TaskError::new(ErrorKind::Unavailable, "the scheduler has stopped");
        self.tx
            .send(Command::SlotAction {
                id_slot,
                action,
                reply,
            })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Whether the scheduler has started serving.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// Starts the scheduler thread.
pub fn spawn(
    engine: Box<dyn Forward>,
    codec: Arc<dyn TextCodec>,
    config: SchedulerConfig,
) -> std::io::Result<(SchedulerHandle, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let n_ctx_slot = if config.n_ctx_slot > 0 {
        config.n_ctx_slot.min(engine.n_ctx_seq())
    } else {
        engine.n_ctx_seq()
    };
    let ready = Arc::new(AtomicBool::new(false));
    let handle = SchedulerHandle {
        tx,
        next_id: Arc::new(AtomicU64::new(0)),
        ready: ready.clone(),
        n_slots: config.n_slots.max(1),
        n_ctx_slot,
        n_vocab: engine.n_vocab(),
    };
    let mut scheduler = Scheduler::new(engine, codec, config, n_ctx_slot);
    let thread = std::thread::Builder::new()
        .name("scheduler".into())
        .spawn(move || {
            ready.store(true, Ordering::Release);
            scheduler.run(rx);
        })?;
    Ok((handle, thread))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Prompt,
    Generating,
}

struct Active {
    id: u64,
    request: TaskRequest,
    sampler: Sampler,
    phase: Phase,
    /// Last sampled token, fed at the next step.
    sampled: u32,
    n_predict_max: i32,
    generated: Vec<u8>,
    n_sent_text: usize,
    generated_tokens: Vec<u32>,
    probs: Vec<TokenOutput>,
    n_gen: usize,
    stop: StopType,
    stopping_word: String,
    truncated: bool,
    has_new_line: bool,
    last_nl_pos: usize,
    has_next_token: bool,
    n_prompt_cached: usize,
    n_prompt_processed: usize,
    t_start: Instant,
    t_prompt_done: Option<Instant>,
    t_gen_last: Option<Instant>,
    /// Row of this slot's logits in the current step.
    logits_row: Option<usize>,
    /// Where the prompt's user messages start (prompt batches end there).
    users: UserStarts,
    /// Embedding and reranking tasks: the hidden states read so far, and the rows of this
    /// step's output that are this slot's (first, count).
    pooler: Option<Pooler>,
    embd_rows: (usize, usize),
}

impl Active {
    fn timings(&self) -> Timings {
        let prompt_ms = self
            .t_prompt_done
            .map_or(0.0, |t| (t - self.t_start).as_secs_f64() * 1e3);
        let gen_ms = match (self.t_prompt_done, self.t_gen_last) {
            (Some(p), Some(g)) => ((g - p).as_secs_f64() * 1e3).max(1e-3),
            _ => 0.0,
        };
        Timings {
            n_prompt_cached: self.n_prompt_cached,
            n_prompt_processed: self.n_prompt_processed,
            n_gen: self.n_gen,
            prompt_ms,
            gen_ms,
        }
    }

    fn has_budget(&self) -> bool {
        self.n_predict_max == -1 || self.n_predict_max - (self.n_gen as i32) > 0
    }

    fn send(&self, event: Event) {
        let _ = self.request.events.send(event);
    }
}

struct Slot {
    id: usize,
    /// Tokens this slot's sequence holds in the KV cache, position i at index i.
    cache: Vec<u32>,
    active: Option<Active>,
    last_used: i64,
    /// The last finished task, for `/slots`.
    last_task: Option<(u64, Arc<TaskParams>, Vec<u32>, String)>,
    /// Upstream's context checkpoints for this slot (positions only).
    checkpoints: Checkpoints,
}

struct Scheduler {
    engine: Box<dyn Forward>,
    codec: Arc<dyn TextCodec>,
    config: SchedulerConfig,
    n_ctx_slot: usize,
    /// Where prompt batches end for the model's attention window.
    checkpoint_policy: CheckpointPolicy,
    /// Prompts saved in host memory (`--cache-ram`); `None` when off.
    prompt_cache: Option<PromptCache>,
    slots: Vec<Slot>,
    waiting: VecDeque<(u64, TaskRequest)>,
    deferred_actions: VecDeque<PendingAction>,
    metrics: Metrics,
    clock: i64,
    logits: Vec<f32>,
    /// Every token's text for grammars, built when the first grammar arrives.
    grammar_texts: Option<Arc<TokenTexts>>,
}

impl Scheduler {
    fn new(
        engine: Box<dyn Forward>,
        codec: Arc<dyn TextCodec>,
        config: SchedulerConfig,
        n_ctx_slot: usize,
    ) -> Self {
        let n_slots = config.n_slots.max(1);
        log::info!("initializing slots, n_slots = {n_slots}, n_ctx_slot = {n_ctx_slot}");
        let n_swa = engine.n_swa();
        // the KV cache's cells in all
        let n_ctx = if config.cache.kv_unified {
            n_ctx_slot
        } else {
            n_ctx_slot * n_slots
        };
        let checkpoint_policy = CheckpointPolicy::new(
            config.cache.ctx_checkpoints,
            config.cache.checkpoint_min_step,
            n_swa,
            config.cache.swa_full,
            config.n_batch,
            config.n_ubatch,
            n_ctx,
            if config.cache.kv_unified { n_slots } else { 1 },
        );
        let prompt_cache = (config.cache.cache_ram_mib != 0)
            .then(|| PromptCache::new(config.cache.cache_ram_mib, n_ctx));
        Scheduler {
            engine,
            codec,
            config,
            n_ctx_slot,
            checkpoint_policy,
            prompt_cache,
            slots: (0..n_slots)
                .map(|id| Slot {
                    id,
                    cache: Vec::new(),
                    active: None,
                    last_used: -1,
                    last_task: None,
                    checkpoints: Checkpoints::default(),
                })
                .collect(),
            waiting: VecDeque::new(),
            deferred_actions: VecDeque::new(),
            metrics: Metrics::default(),
            clock: 0,
            logits: Vec::new(),
            grammar_texts: None,
        }
    }

    /// Constrains a sampler by the grammar a request asks for, as upstream's sampler set-up
    /// does: GBNF parsed with `<text>` terminals resolved by the vocabulary; a lazy grammar then
    /// waits for its triggers, any other is fed the generation prompt when it expects it. Errors
    /// carry upstream's message.
    fn constrain(
        &mut self,
        sampler: &mut Sampler,
        params: &TaskParams,
        source: &GrammarSource,
    ) -> Result<(), String> {
        let generation_prompt = params.generation_prompt.as_str();
        let (lazy, trigger_list) = (
            params.sampling.grammar_lazy,
            &params.sampling.grammar_triggers,
        );
        if source.text.starts_with("%llguidance") {
            return Err("failed to parse grammar: llguidance is not enabled".into());
        }
        let codec = self.codec.clone();
        let texts = self
            .grammar_texts
            .get_or_insert_with(|| {
                Arc::new(TokenTexts::new(
                    codec.n_tokens(),
                    |t| codec.token_to_piece(t, true),
                    |t| codec.is_eog(t),
                ))
            })
            .clone();
        let lookup = |text: &str| codec.single_token(text);
        let grammar = Grammar::new(&source.text, "root", Some(&lookup)).map_err(|e| {
            log::error!("error parsing grammar: {e}");
            "failed to parse grammar".to_string()
        })?;
        if lazy {
            let mut triggers = Triggers::default();
            for t in trigger_list {
                match t {
                    GrammarTrigger::Token { token, .. } => triggers.tokens.push(*token),
                    other => {
                        let pattern = other.pattern().unwrap_or_default();
                        let re = regex::bytes::Regex::new(&pattern).map_err(|e| {
                            log::error!("grammar trigger pattern {pattern:?}: {e}");
                            format!("invalid grammar trigger pattern: {pattern}")
                        })?;
                        triggers.patterns.push(re);
                    }
                }
            }
            sampler.set_grammar(GrammarState::lazy(grammar, triggers), texts);
            return Ok(());
        }
        sampler.set_grammar(GrammarState::new(grammar), texts);
        if source.needs_prefill() {
            let tokens = generation_prompt_tokens(codec.as_ref(), generation_prompt);
            sampler.prefill_grammar(&tokens).map_err(|e| e.0)?;
        }
        Ok(())
    }

    fn busy(&self) -> bool {
        self.slots.iter().any(|s| s.active.is_some())
    }

    fn run(&mut self, rx: Receiver<Command>) {
        loop {
            // Idle: block for work. Busy: take what has arrived and keep stepping.
            if !self.busy() {
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            self.drop_abandoned();
            self.launch_waiting();
            self.run_deferred_actions();
            if self.busy() {
                self.step();
            }
        }
    }

    /// Returns false on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit(task, id) => self.waiting.push_back((id, task)),
            Command::Slots(reply) => {
                let _ = reply.send(self.slot_infos());
            }
            Command::Metrics {
                reset_bucket,
                reply,
            } => {
                let mut m = self.metrics;
                m.n_processing = self.slots.iter().filter(|s| s.active.is_some()).count() as u64;
                m.n_deferred = self.waiting.len() as u64;
                let _ = reply.send(m);
                if reset_bucket {
                    self.metrics.bucket_prompt_steps = 0;
                    self.metrics.bucket_prompt_us = 0;
                    self.metrics.bucket_predict_steps = 0;
                    self.metrics.bucket_predict_us = 0;
                }
            }
            Command::SlotAction {
                id_slot,
                action,
                reply,
            } => self.deferred_actions.push_back((id_slot, action, reply)),
            Command::Shutdown => {
                for slot in &mut self.slots {
                    if let Some(active) = slot.active.take() {
                        active.send(Event::Error(TaskError::new(
                            ErrorKind::Unavailable,
                            "the server is shutting down",
                        )));
                    }
                }
                return false;
            }
        }
        true
    }

    fn slot_infos(&self) -> Vec<SlotInfo> {
        self.slots
            .iter()
            .map(|slot| {
                let mut info = SlotInfo {
                    id: slot.id,
                    n_ctx: self.n_ctx_slot,
                    is_processing: slot.active.is_some(),
                    id_task: None,
                    params: None,
                    n_prompt_tokens: slot.cache.len(),
                    n_prompt_tokens_processed: 0,
                    n_prompt_tokens_cache: 0,
                    has_next_token: false,
                    has_new_line: false,
                    n_remain: -1,
                    n_decoded: 0,
                    prompt: String::new(),
                    generated: String::new(),
                };
                if let Some(a) = &slot.active {
                    info.id_task = Some(a.id);
                    info.params = Some(a.request.params.clone());
                    info.n_prompt_tokens_processed = a.n_prompt_processed;
                    info.n_prompt_tokens_cache = a.n_prompt_cached;
                    info.has_next_token = a.has_next_token;
                    info.has_new_line = a.has_new_line;
                    info.n_remain = if a.n_predict_max == -1 {
                        -1
                    } else {
                        i64::from(a.n_predict_max) - a.n_gen as i64
                    };
                    info.n_decoded = a.n_gen;
                    info.prompt = self.text(&a.request.tokens);
                    info.generated = String::from_utf8_lossy(&a.generated).into_owned();
                } else if let Some((id, params, prompt, generated)) = &slot.last_task {
                    info.id_task = Some(*id);
                    info.params = Some(params.clone());
                    info.prompt = self.text(prompt);
                    info.generated = generated.clone();
                }
                info
            })
            .collect()
    }

    fn text(&self, tokens: &[u32]) -> String {
        String::from_utf8_lossy(&self.codec.detokenize(tokens, true)).into_owned()
    }

    /// Frees slots whose client went away.
    fn drop_abandoned(&mut self) {
        for slot in &mut self.slots {
            let gone = slot
                .active
                .as_ref()
                .is_some_and(|a| a.request.events.is_closed());
            if gone {
                if let Some(a) = slot.active.take() {
                    log::info!("slot {}: task {} cancelled (client gone)", slot.id, a.id);
                    // Tokens of an unfinished prompt chunk are in the cache; keep what is
                    // consistent (the cache vector is only extended with decoded tokens).
                }
                self.clock += 1;
                slot.last_used = self.clock;
            }
        }
        self.waiting.retain(|(_, t)| !t.events.is_closed());
    }

    fn launch_waiting(&mut self) {
        let mut still_waiting = VecDeque::new();
        while let Some((id, task)) = self.waiting.pop_front() {
            match self.pick_slot(&task) {
                Some((i, swap)) => {
                    if swap && !task.params.infill {
                        self.swap_prompt(i, &task.tokens);
                    }
                    self.launch(i, id, task);
                    if self.config.cache.cache_idle_slots {
                        self.save_idle_slots();
                    }
                }
                None => still_waiting.push_back((id, task)),
            }
        }
        self.waiting = still_waiting;
    }

    /// Upstream's choice: the requested slot; else the free slot whose cache best covers the
    /// prompt (above the similarity threshold); else the least recently used free slot. With it,
    /// whether the slot's prompt goes to the host prompt cache first (upstream's `update_cache`:
    /// the slot is about to lose more than half of what it holds, or was taken as least
    /// recently used).
    fn pick_slot(&self, task: &TaskRequest) -> Option<(usize, bool)> {
        let n = self.slots.len() as i32;
        // Ids wrap modulo the slot count; a negative remainder names no slot and, as upstream,
        // falls through to the usual choice.
        if task.id_slot != -1 && task.id_slot % n >= 0 {
            let wanted = task.id_slot % n;
            let i = self
                .slots
                .iter()
                .position(|s| s.id as i32 == wanted && s.active.is_none())?;
            let mut swap = false;
            if self.config.slot_prompt_similarity != 0.0 {
                // upstream measures the kept share with the similarity only when it passed the
                // threshold (0 otherwise), and an empty slot gives 0/0
                let held = &self.slots[i].cache;
                let lcp = common_prefix(held, &task.tokens);
                let sim = lcp as f32 / task.tokens.len().max(1) as f32;
                let best = if !held.is_empty() && sim > self.config.slot_prompt_similarity {
                    sim
                } else {
                    0.0
                };
                let f_keep = best * task.tokens.len() as f32 / held.len() as f32;
                swap = f_keep < 0.5;
            }
            return Some((i, swap));
        }
        let mut best = None;
        let mut best_sim = 0.0f32;
        if self.config.slot_prompt_similarity != 0.0 && !task.tokens.is_empty() {
            for (i, slot) in self.slots.iter().enumerate() {
                if slot.active.is_some() || slot.cache.is_empty() {
                    continue;
                }
                let lcp = common_prefix(&slot.cache, &task.tokens);
                let sim = lcp as f32 / task.tokens.len() as f32;
                if sim > best_sim && sim > self.config.slot_prompt_similarity {
                    best_sim = sim;
                    best = Some(i);
                }
            }
        }
        if let Some(i) = best {
            let f_keep = best_sim * task.tokens.len() as f32 / self.slots[i].cache.len() as f32;
            return Some((i, f_keep < 0.5));
        }
        let mut t_last = -1;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.active.is_some() {
                continue;
            }
            if best.is_none() || slot.last_used <= t_last {
                t_last = slot.last_used;
                best = Some(i);
            }
        }
        best.map(|i| (i, true))
    }

    /// Saves slot `i`'s prompt in the host prompt cache, unless it is empty, held there whole
    /// already, too big, or the engine cannot save its sequence (`None` then).
    fn save_prompt(&mut self, i: usize) -> Option<bool> {
        let Some(cache) = self.prompt_cache.as_mut() else {
            return Some(false);
        };
        let slot = &self.slots[i];
        if cache.holds(&slot.cache) {
            return Some(false);
        }
        let state = self.engine.seq_save(slot.id as SeqId)?;
        if cache.too_big(state.bytes) {
            log::warn!(
                "slot {}: prompt state of {} bytes exceeds the prompt cache limit, not saved",
                slot.id,
                state.bytes
            );
            return Some(false);
        }
        log::debug!(
            "slot {}: saving prompt of {} tokens",
            slot.id,
            slot.cache.len()
        );
        cache.save(Entry {
            tokens: slot.cache.clone(),
            checkpoints: slot.checkpoints.clone(),
            bytes: state.bytes,
            state,
        });
        Some(true)
    }

    /// Before slot `i` takes a task of `prompt`: its own prompt goes to the host prompt cache,
    /// and a saved prompt that covers the new one better takes its place.
    fn swap_prompt(&mut self, i: usize, prompt: &[u32]) {
        if self.prompt_cache.is_none() {
            return;
        }
        self.save_prompt(i);
        let slot = &mut self.slots[i];
        let seq = slot.id as SeqId;
        let cache = self.prompt_cache.as_mut().expect("checked above");
        if let Some(entry) = cache.take_better(&slot.cache, prompt) {
            if self.engine.seq_load(seq, &entry.state) {
                log::info!(
                    "slot {}: restored a prompt of {} tokens from the prompt cache",
                    slot.id,
                    entry.tokens.len()
                );
                slot.cache = entry.tokens;
                slot.checkpoints = entry.checkpoints;
            } else {
                log::warn!(
                    "slot {}: could not restore a cached prompt, clearing",
                    slot.id
                );
                self.engine.seq_rm(seq, 0, None);
                slot.cache.clear();
                slot.checkpoints.clear();
            }
        }
        cache.trim();
    }

    /// `--cache-idle-slots`: after a task starts, every idle slot's prompt goes to the host
    /// prompt cache (and, with one unified KV pool, leaves the slot, as upstream's does; but not
    /// with an engine that cannot save it, where it would be lost).
    fn save_idle_slots(&mut self) {
        if self.prompt_cache.is_none() {
            return;
        }
        for i in 0..self.slots.len() {
            if self.slots[i].active.is_some() {
                continue;
            }
            let saved = self.save_prompt(i);
            if saved == Some(true) {
                if let Some(cache) = self.prompt_cache.as_mut() {
                    cache.trim();
                }
            }
            if self.config.cache.kv_unified && saved.is_some() {
                let slot = &mut self.slots[i];
                self.engine.seq_rm(slot.id as SeqId, 0, None);
                slot.cache.clear();
                slot.checkpoints.clear();
            }
        }
    }

    fn launch(&mut self, slot_idx: usize, id: u64, request: TaskRequest) {
        let n_vocab = self.engine.n_vocab();
        let n_ctx = self.n_ctx_slot;
        let fail = |request: &TaskRequest, err: TaskError| {
            log::error!("task {id}: {}", err.message);
            let _ = request.events.send(Event::Error(err));
        };
        if let Some(bad) = request.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            log::debug!("task {id}: token {bad} is outside the vocabulary of {n_vocab}");
            fail(
                &request,
                TaskError::invalid("Prompt contains invalid tokens"),
            );
            return;
        }
        let params = request.params.clone();
        let sampler = Sampler::new(&params.sampling, n_vocab, &CodecVocab(self.codec.as_ref()))
            .map_err(|e| e.0)
            .and_then(|mut sampler| {
                if let Some(source) = &params.sampling.grammar {
                    self.constrain(&mut sampler, &params, source)?;
                }
                let codec = self.codec.clone();
                let complete = move |t| utf8_complete(&codec.token_to_piece(t, false));
                sampler.set_budget(&params.sampling, Arc::new(complete));
                sampler.prefill_budget(&generation_prompt_tokens(
                    self.codec.as_ref(),
                    &params.generation_prompt,
                ));
                Ok(sampler)
            });
        let sampler = match sampler {
            Ok(s) => s,
            Err(e) => {
                fail(
                    &request,
                    TaskError::invalid(format!("Failed to initialize samplers: {e}")),
                );
                return;
            }
        };
        let n_tokens = request.tokens.len();
        let embd = params.kind != TaskKind::Completion;
        if embd {
            if let Err(e) = self.embd_fits(n_tokens) {
                fail(&request, e);
                return;
            }
        } else if n_tokens == 0 {
            log::warn!("task {id}: empty prompt - releasing slot");
        } else if n_tokens >= n_ctx {
            fail(
                &request,
                TaskError::new(
                    ErrorKind::ExceedContextSize {
                        n_prompt_tokens: n_tokens,
                        n_ctx,
                    },
                    format!(
                        "request ({n_tokens} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
                    ),
                ),
            );
            return;
        }
        let n_predict_max = if params.n_predict != -1 {
            params.n_predict
        } else {
            self.config.n_predict
        };
        let delimiters: Vec<(bool, Vec<u32>)> = params
            .message_delimiters
            .iter()
            .filter(|(_, text)| !text.is_empty())
            .map(|(role, text)| (role == "user", self.codec.tokenize(text, false, true)))
            .collect();
        let users = user_starts(&request.tokens, &delimiters);
        let slot = &mut self.slots[slot_idx];
        let seq = slot.id as SeqId;
        // embeddings and reranking are stateless upstream: evaluated from the start
        let reuse = params.cache_prompt && !embd;
        let mut n_shared = if reuse {
            common_prefix(&slot.cache, &request.tokens)
        } else {
            0
        };
        if reuse && params.n_cache_reuse > 0 {
            if self.engine.can_shift() {
                n_shared = reuse_chunks(
                    self.engine.as_mut(),
                    seq,
                    &mut slot.cache,
                    &request.tokens,
                    n_shared,
                    params.n_cache_reuse as usize,
                );
            } else {
                log::warn!(
                    "slot {}: cache reuse is not supported - ignoring n_cache_reuse = {}",
                    slot.id,
                    params.n_cache_reuse
                );
            }
        }
        // With an attention window, upstream resumes from a checkpoint inside the shared prefix.
        let mut n_past = slot.checkpoints.resume(
            &self.checkpoint_policy,
            slot.cache.len(),
            n_shared,
            n_tokens,
        );
        // At least one prompt token is evaluated, to get logits.
        if n_past == n_tokens && n_past > 0 {
            n_past -= 1;
        }
        if n_past < slot.cache.len() {
            self.engine.seq_rm(seq, n_past as u32, None);
            slot.cache.truncate(n_past);
        }
        log::info!(
            "slot {}: task {id}, n_ctx_slot = {n_ctx}, prompt = {n_tokens} tokens, cached = {n_past}",
            slot.id
        );
        self.metrics.n_prompt_tokens_cached_total += n_past as u64;
        let active = Active {
            id,
            request,
            sampler,
            phase: Phase::Prompt,
            sampled: 0,
            n_predict_max,
            generated: Vec::new(),
            n_sent_text: 0,
            generated_tokens: Vec::new(),
            probs: Vec::new(),
            n_gen: 0,
            stop: StopType::None,
            stopping_word: String::new(),
            truncated: false,
            has_new_line: false,
            last_nl_pos: 0,
            has_next_token: true,
            n_prompt_cached: n_past,
            n_prompt_processed: 0,
            t_start: Instant::now(),
            t_prompt_done: None,
            t_gen_last: None,
            logits_row: None,
            users,
            pooler: embd.then(|| Pooler::new(self.config.pooling, self.engine.n_embd(), n_tokens)),
            embd_rows: (0, 0),
        };
        if n_tokens == 0 {
            let result = final_result(slot.id, slot.cache.len(), &active, self.codec.as_ref());
            active.send(Event::Final(Box::new(result)));
            return;
        }
        slot.active = Some(active);
    }

    fn run_deferred_actions(&mut self) {
        let mut still = VecDeque::new();
        while let Some((id_slot, action, reply)) = self.deferred_actions.pop_front() {
            let n = self.slots.len() as i64;
            let idx = id_slot % n;
            if idx < 0 {
                let _ = reply.send(Err(TaskError::invalid("Invalid slot ID")));
                continue;
            }
            let idx = idx as usize;
            if self.slots[idx].active.is_some() {
                still.push_back((id_slot, action, reply));
                continue;
            }
            let _ = reply.send(self.slot_action(idx, action));
        }
        self.deferred_actions = still;
    }

    fn slot_action(
        &mut self,
        idx: usize,
        action: SlotAction,
    ) -> Result<SlotActionResult, TaskError> {
        let t0 = Instant::now();
        let ms = |t0: Instant| t0.elapsed().as_secs_f64() * 1e3;
        match action {
            SlotAction::Erase => {
                let slot = &mut self.slots[idx];
                let n_erased = slot.cache.len();
                self.engine.seq_rm(slot.id as SeqId, 0, None);
                slot.cache.clear();
                Ok(SlotActionResult::Erased {
                    id_slot: idx,
                    n_erased,
                })
            }
            SlotAction::Save(filename) => {
                let path = self.slot_file(&filename)?;
                let slot = &self.slots[idx];
                let bytes = encode_slot_file(&slot.cache);
                std::fs::write(&path, &bytes).map_err(|e| {
                    log::error!("saving slot {idx} to {}: {e}", path.display());
                    TaskError::new(ErrorKind::Server, "Unable to save slot")
                })?;
                Ok(SlotActionResult::Saved {
                    id_slot: idx,
                    filename,
                    n_saved: slot.cache.len(),
                    n_written: bytes.len(),
                    ms: ms(t0),
                })
            }
            SlotAction::Restore(filename) => {
                let path = self.slot_file(&filename)?;
                let restore_err =
                    |why: &str| TaskError::invalid(format!("Unable to restore slot: {why}"));
                let bytes = std::fs::read(&path).map_err(|e| {
                    log::error!("restoring slot {idx} from {}: {e}", path.display());
                    restore_err("No available space in KV cache or invalid slot save file")
                })?;
                let tokens = decode_slot_file(&bytes).ok_or_else(|| {
                    restore_err("No available space in KV cache or invalid slot save file")
                })?;
                if tokens.len() > self.n_ctx_slot {
                    return Err(restore_err(
                        "Restored prompt does not fit in the slot context",
                    ));
                }
                if tokens.iter().any(|&t| t as usize >= self.engine.n_vocab()) {
                    return Err(restore_err("Invalid tokens in slot save file"));
                }
                let seq = self.slots[idx].id as SeqId;
                self.engine.seq_rm(seq, 0, None);
                self.slots[idx].cache.clear();
                self.slots[idx].checkpoints.clear();
                // The engine exposes no state import, so the cache is rebuilt by evaluating the
                // saved tokens again.
                for (chunk_no, chunk) in tokens.chunks(self.config.n_ubatch.max(1)).enumerate() {
                    let mut batch = Batch::default();
                    let start = chunk_no * self.config.n_ubatch.max(1);
                    for (i, &t) in chunk.iter().enumerate() {
                        batch.push(t, (start + i) as u32, seq, false);
                    }
                    self.logits.clear();
                    if let Err(e) = self.engine.decode(&batch, &mut self.logits) {
                        self.engine.seq_rm(seq, 0, None);
                        self.slots[idx].cache.clear();
                        return Err(restore_err(&e.to_string()));
                    }
                    self.slots[idx].cache.extend_from_slice(chunk);
                }
                Ok(SlotActionResult::Restored {
                    id_slot: idx,
                    filename,
                    n_restored: tokens.len(),
                    n_read: bytes.len(),
                    ms: ms(t0),
                })
            }
        }
    }

    fn slot_file(&self, filename: &str) -> Result<PathBuf, TaskError> {
        let dir = self.config.slot_save_path.as_ref().ok_or_else(|| {
            TaskError::new(
                ErrorKind::NotSupported,
                "This server does not support slots action. Start it with `--slot-save-path`",
            )
        })?;
        Ok(dir.join(filename))
    }

    /// Context shift: drop `n_discard` tokens after `n_keep` and re-evaluate the kept tail at
    /// its new positions (the engine has no position-shift call).
    fn shift_context(&mut self, slot_idx: usize) -> Result<(), TaskError> {
        let slot = &mut self.slots[slot_idx];
        let Some(active) = slot.active.as_mut() else {
            return Ok(());
        };
        let n_ctx = self.n_ctx_slot as i64;
        let params = &active.request.params;
        let mut n_keep = if params.n_keep < 0 {
            active.request.tokens.len() as i64
        } else {
            i64::from(params.n_keep)
        };
        if self.codec.add_bos() {
            n_keep += 1;
        }
        let n_keep = n_keep.min(n_ctx - 4).max(0) as usize;
        let n_left = slot.cache.len() as i64 - n_keep as i64;
        let n_discard = if params.n_discard > 0 {
            i64::from(params.n_discard)
        } else {
            n_left / 2
        };
        let n_discard = n_discard.clamp(0, (n_left - 1).max(0)) as usize;
        log::warn!(
            "slot {}: context shift, n_keep = {n_keep}, n_left = {n_left}, n_discard = {n_discard}",
            slot.id
        );
        let seq = slot.id as SeqId;
        let tail: Vec<u32> = slot.cache[n_keep + n_discard..].to_vec();
        self.engine.seq_rm(seq, n_keep as u32, None);
        slot.cache.truncate(n_keep);
        for chunk in tail.chunks(self.config.n_ubatch.max(1)) {
            let mut batch = Batch::default();
            for &t in chunk {
                batch.push(t, slot.cache.len() as u32, seq, false);
                slot.cache.push(t);
            }
            self.logits.clear();
            self.engine.decode(&batch, &mut self.logits).map_err(|e| {
                TaskError::new(ErrorKind::Server, format!("context shift failed: {e}"))
            })?;
        }
        active.truncated = true;
        Ok(())
    }

    fn step(&mut self) {
        // Slots at the end of their context either shift or were stopped in process_token.
        for i in 0..self.slots.len() {
            let full = self.slots[i].active.as_ref().is_some_and(|a| {
                a.phase == Phase::Generating && self.slots[i].cache.len() + 1 >= self.n_ctx_slot
            });
            if full && self.config.ctx_shift {
                if let Err(e) = self.shift_context(i) {
                    self.fail_slot(i, e);
                }
            }
        }

        let mut batch = Batch::default();
        // Logits rows come back only for flagged entries, in batch order.
        let mut n_outputs = 0usize;
        // A step returns logits or hidden states: embedding and reranking prompts go first, in
        // steps of their own (upstream batches a slot only with slots of the same kind).
        let embd_mode = self
            .slots
            .iter()
            .any(|s| s.active.as_ref().is_some_and(|a| a.pooler.is_some()));
        // Decode tokens first.
        for slot in &mut self.slots {
            let Some(active) = slot.active.as_mut() else {
                continue;
            };
            if active.phase != Phase::Generating || embd_mode {
                continue;
            }
            active.logits_row = Some(n_outputs);
            n_outputs += 1;
            batch.push(
                active.sampled,
                slot.cache.len() as u32,
                slot.id as SeqId,
                true,
            );
            slot.cache.push(active.sampled);
        }
        let n_decoding = batch.len();
        // Then prompt tokens, at least half a ubatch of them per step.
        let n_ubatch = self.config.n_ubatch.max(1);
        let mut budget = n_ubatch - n_decoding.min(n_ubatch / 2);
        let mut prompt_slots = 0u64;
        for slot in self.slots.iter_mut() {
            if budget == 0 {
                break;
            }
            let Some(active) = slot.active.as_mut() else {
                continue;
            };
            if active.phase != Phase::Prompt || active.pooler.is_some() != embd_mode {
                continue;
            }
            let prompt = &active.request.tokens;
            let start = slot.cache.len();
            let completion = !active.request.params.infill;
            let end = start + (prompt.len() - start).min(budget);
            let policy = &self.checkpoint_policy;
            let take = slot.checkpoints.batch_len(
                policy,
                completion,
                &active.users,
                prompt.len(),
                start,
                end,
            );
            slot.checkpoints.before_batch(
                policy,
                completion,
                &active.users,
                active.id,
                prompt.len(),
                start,
                start + take,
            );
            let first_row = n_outputs;
            for k in 0..take {
                let pos = start + k;
                let out = if embd_mode {
                    self.config.pooling.wants(pos, prompt.len())
                } else {
                    pos + 1 == prompt.len()
                };
                if out {
                    if !embd_mode {
                        active.logits_row = Some(n_outputs);
                    }
                    n_outputs += 1;
                }
                batch.push(prompt[pos], pos as u32, slot.id as SeqId, out);
                slot.cache.push(prompt[pos]);
            }
            if embd_mode {
                active.embd_rows = (first_row, n_outputs - first_row);
            }
            active.n_prompt_processed += take;
            budget -= take;
            prompt_slots += 1;
        }
        if batch.is_empty() {
            return;
        }

        let t0 = Instant::now();
        self.logits.clear();
        let result = if embd_mode {
            self.engine.decode_embd(&batch, &mut self.logits)
        } else {
            self.engine.decode(&batch, &mut self.logits)
        };
        let elapsed_us = t0.elapsed().as_micros() as u64;
        self.metrics.n_decode_total += 1;
        self.metrics.n_busy_slots_total += n_decoding as u64 + prompt_slots;
        let n_prompt_in_batch = (batch.len() - n_decoding) as u64;
        self.metrics.n_prompt_tokens_processed_total += n_prompt_in_batch;
        if n_prompt_in_batch > 0 {
            self.metrics.t_prompt_processing_total_us += elapsed_us;
            self.metrics.bucket_prompt_steps += n_prompt_in_batch;
            self.metrics.bucket_prompt_us += elapsed_us;
        }
        if n_decoding > 0 {
            self.metrics.t_tokens_generation_total_us += elapsed_us;
            self.metrics.bucket_predict_steps += n_decoding as u64;
            self.metrics.bucket_predict_us += elapsed_us;
        }
        if let Err(e) = result {
            log::error!("decode failed: {e}");
            // Nothing of this batch is trustworthy: drop it from every slot involved.
            for i in 0..self.slots.len() {
                let seq = self.slots[i].id as SeqId;
                let mut touched_from = None;
                for k in 0..batch.len() {
                    if batch.seq[k] == seq {
                        touched_from = Some(touched_from.unwrap_or(batch.pos[k]));
                    }
                }
                if let Some(p0) = touched_from {
                    self.engine.seq_rm(seq, p0, None);
                    self.slots[i].cache.truncate(p0 as usize);
                    self.slots[i].checkpoints.clear();
                    self.fail_slot(
                        i,
                        TaskError::new(ErrorKind::Server, format!("decode() failed: {e}")),
                    );
                }
            }
            return;
        }

        for i in 0..self.slots.len() {
            if embd_mode {
                self.after_embd(i);
            } else {
                self.after_decode(i);
            }
        }
    }

    /// Upstream's size checks for an embedding or reranking prompt of `n` tokens: without
    /// last-token pooling the whole prompt must fit one ubatch.
    fn embd_fits(&self, n: usize) -> Result<(), TaskError> {
        let n_ctx = self.n_ctx_slot;
        let exceeds = |message: String| {
            TaskError::new(
                ErrorKind::ExceedContextSize {
                    n_prompt_tokens: n,
                    n_ctx,
                },
                message,
            )
        };
        if n == 0 {
            return Err(TaskError::invalid("Input content cannot be empty"));
        }
        if self.config.pooling.can_split() {
            if n >= n_ctx {
                return Err(exceeds(format!(
                    "request ({n} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
                )));
            }
            return Ok(());
        }
        let n_ubatch = self.config.n_ubatch;
        if n > n_ubatch {
            return Err(TaskError::new(
                ErrorKind::Server,
                format!(
                    "input ({n} tokens) is too large to process. increase the physical batch size (current batch size: {n_ubatch})"
                ),
            ));
        }
        if n > n_ctx {
            return Err(exceeds(format!(
                "input ({n} tokens) is larger than the max context size ({n_ctx} tokens). skipping"
            )));
        }
        Ok(())
    }

    /// Takes an embedding or reranking slot's hidden states from this step; once its whole
    /// prompt is in, sends the result and frees the slot.
    fn after_embd(&mut self, i: usize) {
        let n_embd = self.engine.n_embd();
        let slot = &mut self.slots[i];
        let Some(active) = slot.active.as_mut() else {
            return;
        };
        let (first, count) = std::mem::take(&mut active.embd_rows);
        let Some(pooler) = active.pooler.as_mut() else {
            return;
        };
        let Some(rows) = self.logits.get(first * n_embd..(first + count) * n_embd) else {
            let err = TaskError::new(
                ErrorKind::Server,
                "the engine returned too few hidden states",
            );
            self.fail_slot(i, err);
            return;
        };
        rows.chunks_exact(n_embd.max(1)).for_each(|r| pooler.add(r));
        if slot.cache.len() < active.request.tokens.len() {
            return;
        }
        let Some(mut a) = slot.active.take() else {
            return;
        };
        let params = &a.request.params;
        let normalize = (params.kind == TaskKind::Embedding).then_some(params.embd_normalize);
        let rows = a
            .pooler
            .take()
            .map(|p| p.finish(normalize))
            .unwrap_or_default();
        log::info!(
            "slot {}: task {} done, {} prompt tokens, {} row(s) of {n_embd}",
            slot.id,
            a.id,
            a.request.tokens.len(),
            rows.len()
        );
        a.send(Event::Embd(Box::new(EmbdResult {
            index: a.request.index,
            rows,
            n_tokens: a.request.tokens.len(),
        })));
        self.clock += 1;
        slot.last_used = self.clock;
    }

    fn fail_slot(&mut self, i: usize, err: TaskError) {
        let slot = &mut self.slots[i];
        if let Some(a) = slot.active.take() {
            log::error!("slot {}: task {}: {}", slot.id, a.id, err.message);
            a.send(Event::Error(err));
            self.clock += 1;
            slot.last_used = self.clock;
        }
    }

    /// Samples for a slot whose logits this step produced, and handles the token.
    fn after_decode(&mut self, i: usize) {
        let n_vocab = self.engine.n_vocab();
        let n_ctx = self.n_ctx_slot;
        let codec = self.codec.clone();
        let slot = &mut self.slots[i];
        let Some(active) = slot.active.as_mut() else {
            return;
        };
        let Some(row) = active.logits_row.take() else {
            return;
        };
        if active.phase == Phase::Prompt {
            active.phase = Phase::Generating;
            for &t in &active.request.tokens {
                active.sampler.accept(t);
            }
        }
        let Some(logits) = self.logits.get(row * n_vocab..(row + 1) * n_vocab) else {
            let err = TaskError::new(ErrorKind::Server, "the engine returned too few logits");
            self.fail_slot(i, err);
            return;
        };
        let token = match active.sampler.sample(logits) {
            Ok(t) => t,
            Err(e) => {
                let err = TaskError::new(ErrorKind::Server, e.0);
                self.fail_slot(i, err);
                return;
            }
        };
        if let Err(e) = active.sampler.accept_generated(token) {
            // upstream's request handler reports the grammar's exception this way
            let err = TaskError::new(ErrorKind::Server, format!("got exception: {}", e.0));
            self.fail_slot(i, err);
            return;
        }
        let now = Instant::now();
        active.n_gen += 1;
        if active.n_gen == 1 {
            active.t_prompt_done = Some(now);
        }
        active.t_gen_last = Some(now);
        active.sampled = token;

        let params = active.request.params.clone();
        let special = params.special;
        let piece = codec.token_to_piece(token, special);
        let mut out = TokenOutput {
            id: token,
            text: String::new(),
            piece: piece.clone(),
            prob: 1.0,
            probs: Vec::new(),
        };
        let n_probs = params.sampling.n_probs.max(0) as usize;
        if n_probs > 0 {
            fill_probs(
                &mut out,
                &mut active.sampler,
                logits,
                n_probs,
                params.post_sampling_probs,
                codec.as_ref(),
                special,
            );
        }
        let is_eog = codec.is_eog(token);
        let keep_going = process_token(
            active,
            out,
            &piece,
            is_eog,
            slot.cache.len(),
            n_ctx,
            self.config.ctx_shift,
        );
        self.metrics.n_tokens_predicted_total += 1;
        self.metrics.n_tokens_max = self.metrics.n_tokens_max.max((slot.cache.len() + 1) as u64);
        if !keep_going {
            let result = final_result(slot.id, slot.cache.len(), active, codec.as_ref());
            log::info!(
                "slot {}: task {} done, prompt {} tokens ({} cached), generated {} ({})",
                slot.id,
                active.id,
                result.n_prompt_tokens,
                result.n_prompt_cached,
                result.n_decoded,
                result.stop.as_str()
            );
            active.send(Event::Final(Box::new(result)));
            if let Some(a) = slot.active.take() {
                slot.last_task = Some((
                    a.id,
                    a.request.params.clone(),
                    a.request.tokens.clone(),
                    String::from_utf8_lossy(&a.generated).into_owned(),
                ));
            }
            self.clock += 1;
            slot.last_used = self.clock;
        }
    }
}

fn fill_probs(
    out: &mut TokenOutput,
    sampler: &mut Sampler,
    logits: &[f32],
    n_probs: usize,
    post_sampling: bool,
    codec: &dyn TextCodec,
    special: bool,
) {
    let token = out.id;
    if post_sampling {
        let cur = sampler.candidates_by_probability();
        if let Some(t) = cur.data.iter().find(|t| t.id == token) {
            out.prob = t.p;
        }
        for t in cur.data.iter().take(n_probs) {
            if t.p == 0.0 {
                break;
            }
            out.probs.push(TokenProb {
                id: t.id,
                piece: codec.token_to_piece(t.id, special),
                p: t.p,
            });
        }
    } else {
        let cur = token_probabilities(logits, n_probs);
        if let Some(t) = cur.iter().find(|t| t.id == token) {
            out.prob = t.p;
        }
        for t in cur.iter().take(n_probs) {
            out.probs.push(TokenProb {
                id: t.id,
                piece: codec.token_to_piece(t.id, special),
                p: t.p,
            });
        }
    }
}

/// Upstream's `process_token`: appends the token's text, finds stop words (a full match cuts
/// the text; a possible beginning holds text back), and decides whether to continue.
fn process_token(
    active: &mut Active,
    mut out: TokenOutput,
    piece: &[u8],
    is_eog: bool,
    n_cached: usize,
    n_ctx: usize,
    ctx_shift: bool,
) -> bool {
    let params = active.request.params.clone();
    active.generated.extend_from_slice(piece);
    if params.return_tokens {
        active.generated_tokens.push(out.id);
    }
    active.has_next_token = true;
    let incomplete = valid_utf8_prefix(&active.generated) < active.generated.len();
    if !incomplete {
        let mut pos = active.n_sent_text.min(active.generated.len());
        let tail = active.generated[pos..].to_vec();
        let mut send_text = true;
        if let Some((stop_pos, word)) = find_stop(&tail, piece.len(), &params.stop, true) {
            active.stop = StopType::Word;
            active.stopping_word = word;
            active.has_next_token = false;
            active.generated.truncate(pos + stop_pos);
            pos = active.n_sent_text.min(active.generated.len());
        } else if !is_eog && find_stop(&tail, piece.len(), &params.stop, false).is_some() {
            send_text = false;
        }
        if send_text {
            out.text = String::from_utf8_lossy(&active.generated[pos..]).into_owned();
            active.n_sent_text += active.generated.len() - pos;
        }
        if params.n_probs_enabled() {
            active.probs.push(out.clone());
        }
        if params.stream {
            active.send(Event::Token {
                index: active.request.index,
                token: out.clone(),
                n_decoded: active.n_gen,
                n_prompt_tokens: active.request.tokens.len(),
                n_prompt_cached: active.n_prompt_cached,
                // upstream times every chunk with timings_per_token, and the chunk that ends
                // the completion (a stop word found in this token) always
                timings: (params.timings_per_token || active.stop != StopType::None)
                    .then(|| active.timings()),
            });
        }
    }
    if !ctx_shift && n_cached + 1 >= n_ctx {
        active.truncated = true;
        active.stop = StopType::Limit;
        active.has_next_token = false;
    }
    if active.n_gen > 0 && active.has_next_token && !active.has_budget() {
        active.stop = StopType::Limit;
        active.has_next_token = false;
    }
    if active.has_new_line && params.n_indent > 0 && active.last_nl_pos > 0 {
        let text = &active.generated;
        let mut p = active.last_nl_pos;
        let mut n_indent = 0;
        while p < text.len() && (text[p] == b' ' || text[p] == b'\t') {
            n_indent += 1;
            p += 1;
        }
        if p < text.len() && n_indent < params.n_indent {
            active.stop = StopType::Limit;
            active.has_next_token = false;
            active.generated.truncate(p);
        }
    }
    if params.n_indent > 0 {
        if let Some(nl) = active.generated[active.last_nl_pos.min(active.generated.len())..]
            .iter()
            .position(|&b| b == b'\n')
        {
            active.last_nl_pos += nl + 1;
        }
    }
    if out.text.contains('\n') {
        active.has_new_line = true;
        if params.t_max_predict_ms > 0 && active.timings().gen_ms > params.t_max_predict_ms as f64 {
            active.stop = StopType::Limit;
            active.has_next_token = false;
        }
    }
    if is_eog {
        active.stop = StopType::Eos;
        active.has_next_token = false;
    }
    active.has_next_token
}

impl TaskParams {
    fn n_probs_enabled(&self) -> bool {
        self.sampling.n_probs > 0
    }
}

/// The earliest stop word in `text`: a full match searched only near the end (where the newest
/// token could have completed it), or with `full = false` a suffix that could begin one.
fn find_stop(
    text: &[u8],
    last_token_len: usize,
    stops: &[String],
    full: bool,
) -> Option<(usize, String)> {
    let mut best: Option<(usize, String)> = None;
    for word in stops {
        let w = word.as_bytes();
        let pos = if full {
            let reach = w.len() + last_token_len;
            let from = text.len().saturating_sub(reach);
            find_bytes(&text[from..], w).map(|p| p + from)
        } else {
            partial_stop(text, w)
        };
        if let Some(p) = pos {
            if best.as_ref().is_none_or(|(b, _)| p < *b) {
                best = Some((p, word.clone()));
            }
        }
    }
    best
}

fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Where a suffix of `text` equal to a prefix of `stop` starts.
fn partial_stop(text: &[u8], stop: &[u8]) -> Option<usize> {
    let last = *text.last()?;
    if stop.is_empty() {
        return None;
    }
    (1..=text.len().min(stop.len()))
        .rev()
        .find(|&len| stop[len - 1] == last && text.ends_with(&stop[..len]))
        .map(|len| text.len() - len)
}

/// Length of `text` without a multi-byte character cut off at its end.
fn valid_utf8_prefix(text: &[u8]) -> usize {
    let len = text.len();
    for i in 1..=4.min(len) {
        let c = text[len - i];
        let needed = if c & 0xE0 == 0xC0 {
            2
        } else if c & 0xF0 == 0xE0 {
            3
        } else if c & 0xF8 == 0xF0 {
            4
        } else {
            continue;
        };
        if i < needed {
            return len - i;
        }
    }
    len
}

fn final_result(
    slot_id: usize,
    n_cached: usize,
    active: &Active,
    codec: &dyn TextCodec,
) -> FinalResult {
    let params = &active.request.params;
    let streamed = params.stream;
    let mut probs = active.probs.clone();
    if !streamed && active.stop == StopType::Word {
        let n_stop = codec.tokenize(&active.stopping_word, false, false).len();
        probs.truncate(probs.len() - n_stop.min(probs.len()));
    }
    FinalResult {
        index: active.request.index,
        id_slot: slot_id,
        content: if streamed {
            String::new()
        } else {
            String::from_utf8_lossy(&active.generated).into_owned()
        },
        tokens: if streamed {
            Vec::new()
        } else {
            active.generated_tokens.clone()
        },
        probs,
        prompt: String::from_utf8_lossy(&codec.detokenize(&active.request.tokens, true))
            .into_owned(),
        stop: active.stop,
        stopping_word: active.stopping_word.clone(),
        truncated: active.truncated,
        has_new_line: active.has_new_line,
        n_decoded: active.n_gen,
        n_prompt_tokens: active.request.tokens.len(),
        n_prompt_cached: active.n_prompt_cached,
        n_tokens_cached: n_cached,
        timings: active.timings(),
    }
}

/// llama-server's `--cache-reuse`: after the `n_past` tokens `cache` shares with `prompt`, each
/// run of at least `min` cached tokens that the prompt has next is moved to its prompt positions
/// (the cells between removed, the run's keys shifted), so it needs no evaluation; cached
/// tokens that start no such run are skipped. Returns how many leading tokens of `cache` now
/// equal the prompt's and sit at their positions; the cells after them are the caller's to drop.
fn reuse_chunks(
    engine: &mut dyn Forward,
    seq: SeqId,
    cache: &mut [u32],
    prompt: &[u32],
    mut n_past: usize,
    min: usize,
) -> usize {
    let (mut head_c, mut head_p) = (n_past, n_past);
    while head_c < cache.len() && head_p < prompt.len() {
        let n = cache[head_c..]
            .iter()
            .zip(&prompt[head_p..])
            .take_while(|(a, b)| a == b)
            .count();
        if n >= min {
            log::debug!(
                "reusing chunk with size {n}, shifting KV cache [{head_c}, {}) -> [{head_p}, {})",
                head_c + n,
                head_p + n
            );
            engine.seq_rm(seq, head_p as u32, Some(head_c as u32));
            engine.seq_add(
                seq,
                head_c as u32,
                (head_c + n) as u32,
                head_p as i32 - head_c as i32,
            );
            cache.copy_within(head_c..head_c + n, head_p);
            n_past += n;
            head_c += n;
            head_p += n;
        } else {
            head_c += 1;
        }
    }
    n_past
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

const SLOT_FILE_MAGIC: &[u8; 8] = b"BLMSLOT1";

/// Slot files hold the cached tokens: magic, count (u32 LE), tokens (u32 LE).
fn encode_slot_file(tokens: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + tokens.len() * 4);
    out.extend_from_slice(SLOT_FILE_MAGIC);
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out
}

fn decode_slot_file(bytes: &[u8]) -> Option<Vec<u32>> {
    let rest = bytes.strip_prefix(SLOT_FILE_MAGIC)?;
    let (count, body) = rest.split_first_chunk::<4>()?;
    let count = u32::from_le_bytes(*count) as usize;
    if body.len() != count.checked_mul(4)? {
        return None;
    }
    Some(
        body.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// The generation prompt as tokens fed through a grammar or reasoning budget before sampling,
/// as upstream tokenizes it: special tokens parsed, and a leading space some tokenizers put
/// before a first special token dropped.
fn generation_prompt_tokens(codec: &dyn TextCodec, generation_prompt: &str) -> Vec<u32> {
    if generation_prompt.is_empty() {
        return Vec::new();
    }
    let mut tokens = codec.tokenize(generation_prompt, false, true);
    let first_is_space = tokens.first().is_some_and(|&t| {
        codec
            .token_to_piece(t, true)
            .first()
            .is_some_and(u8::is_ascii_whitespace)
    });
    if first_is_space && !generation_prompt.starts_with(|c: char| c.is_ascii_whitespace()) {
        tokens.remove(0);
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_stop_finds_a_started_word() {
        assert_eq!(partial_stop(b"hello wor", b"world"), Some(6));
        assert_eq!(partial_stop(b"hello", b"world"), None);
        assert_eq!(partial_stop(b"ab", b"b"), Some(1));
    }

    #[test]
    fn full_stop_only_looks_near_the_end() {
        let stops = vec!["END".to_string()];
        assert_eq!(find_stop(b"abcEND", 1, &stops, true).map(|s| s.0), Some(3));
        // "END" far from the newest token was already checked when it was produced.
        assert_eq!(find_stop(b"END......", 1, &stops, true), None);
    }

    #[test]
    fn cut_utf8_is_detected() {
        assert_eq!(valid_utf8_prefix("é".as_bytes()), 2);
        assert_eq!(valid_utf8_prefix(&"é".as_bytes()[..1]), 0);
        assert_eq!(valid_utf8_prefix(&"日".as_bytes()[..2]), 0);
        assert_eq!(valid_utf8_prefix(b"abc"), 3);
    }

    #[test]
    fn slot_files_round_trip_and_refuse_garbage() {
        let tokens = vec![1, 2, 300_000];
        assert_eq!(decode_slot_file(&encode_slot_file(&tokens)), Some(tokens));
        assert_eq!(decode_slot_file(b"BLMSLOT1\x05\0\0\0"), None);
        assert_eq!(decode_slot_file(b"garbage"), None);
    }
}
