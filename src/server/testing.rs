//! Stand-ins for the tokenizer and the engine, so the server can be exercised without a model
//! (the project's own tests and anyone checking the HTTP surface).
//!
//! `ByteCodec`: tokens 0..=255 are bytes, 256 is BOS, 257 is EOS. `MockEngine`: a KV cache of
//! (position, token id) cells per sequence, and logits that are a pure function of the
//! sequence's whole content in position order, so a wrong cache (a missed or misplaced token)
//! changes the output.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::codec::TextCodec;
use crate::engine::{Batch, EngineError, Forward, SeqId, SeqState};

pub const BYTE_BOS: u32 = 256;
pub const BYTE_EOS: u32 = 257;

pub struct ByteCodec;

impl TextCodec for ByteCodec {
    fn n_tokens(&self) -> usize {
        258
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() + 1);
        if add_special {
            out.push(BYTE_BOS);
        }
        let mut rest = text;
        while !rest.is_empty() {
            if parse_special {
                if let Some(r) = rest.strip_prefix("<s>") {
                    out.push(BYTE_BOS);
                    rest = r;
                    continue;
                }
                if let Some(r) = rest.strip_prefix("</s>") {
                    out.push(BYTE_EOS);
                    rest = r;
                    continue;
                }
            }
            let c = rest.chars().next().map_or(1, char::len_utf8);
            out.extend(rest.as_bytes()[..c].iter().map(|&b| u32::from(b)));
            rest = &rest[c..];
        }
        out
    }

    fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        match id {
            0..=255 => vec![id as u8],
            BYTE_BOS if special => b"<s>".to_vec(),
            BYTE_EOS if special => b"</s>".to_vec(),
            _ => Vec::new(),
        }
    }

    fn detokenize(&self, tokens: &[u32], special: bool) -> Vec<u8> {
        tokens
            .iter()
            .flat_map(|&t| self.token_to_piece(t, special))
            .collect()
    }

    fn is_eog(&self, id: u32) -> bool {
        id == BYTE_EOS
    }

    fn eog_tokens(&self) -> Vec<u32> {
        vec![BYTE_EOS]
    }

    fn add_bos(&self) -> bool {
        true
    }
}

/// A fake model over `ByteCodec`'s vocabulary. Greedy output after a sequence is a fixed
/// function of all its tokens; it emits only printable ASCII and EOS.
pub struct MockEngine {
    pub n_ctx: usize,
    /// Per-step delay, to make timing-dependent behaviour (interleaving, cancellation) visible.
    pub step_delay: Duration,
    /// Emit EOS after a sequence reaches this many tokens (`usize::MAX`: never).
    pub eos_after: usize,
    /// (position, token) cells per sequence, as a KV cache holds them: removing a range leaves
    /// a gap, and only a shift moves positions.
    cache: HashMap<SeqId, Vec<(u32, u32)>>,
    /// The size of every `decode` call, shared so a test can read it while the engine runs.
    pub step_sizes: Arc<Mutex<Vec<usize>>>,
    /// Whether it saves sequences for the host prompt cache (an engine may not).
    pub saves: bool,
}

impl MockEngine {
    pub fn new(n_ctx: usize) -> Self {
        MockEngine {
            n_ctx,
            step_delay: Duration::ZERO,
            eos_after: usize::MAX,
            cache: HashMap::new(),
            step_sizes: Arc::default(),
            saves: true,
        }
    }

    fn logits_for(&self, seq: &[u32], out: &mut Vec<f32>) {
        let start = out.len();
        out.resize(start + 258, 0.0);
        let row = &mut out[start..];
        if seq.len() >= self.eos_after {
            row[BYTE_EOS as usize] = 10.0;
            return;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &t in seq {
            h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Printable ASCII only: 32..127, with distinct, hash-derived logits.
        for (k, v) in row.iter_mut().enumerate().take(127).skip(32) {
            let x = h.wrapping_add(k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            *v = (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0;
        }
    }
}

/// Width of [`MockEngine`]'s hidden states.
pub const MOCK_EMBD: usize = 8;

impl Forward for MockEngine {
    fn n_vocab(&self) -> usize {
        258
    }

    fn n_ctx_seq(&self) -> usize {
        self.n_ctx
    }

    fn n_embd(&self) -> usize {
        MOCK_EMBD
    }

    /// Hidden states come from [`Forward::decode_embd`] below.
    fn output_hidden(&mut self, _on: bool) {}

    /// A flagged entry's "hidden state": part of the row its logits would be (a function of
    /// the whole sequence up to it, as a causal model's is).
    fn decode_embd(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError> {
        let mut rows = Vec::new();
        self.decode(batch, &mut rows)?;
        for row in rows.chunks_exact(258) {
            out.extend_from_slice(&row[32..32 + MOCK_EMBD]);
        }
        Ok(())
    }

    fn decode(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError> {
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        if let Ok(mut sizes) = self.step_sizes.lock() {
            sizes.push(batch.len());
        }
        for i in 0..batch.len() {
            let (tok, pos, seq) = (batch.tokens[i], batch.pos[i] as usize, batch.seq[i]);
            if tok >= 258 {
                return Err(EngineError::BadBatch(format!(
                    "token {tok} out of vocabulary"
                )));
            }
            let cells = self.cache.entry(seq).or_default();
            // the cached positions must be exactly 0..pos
            if pos != cells.len() || cells.iter().any(|&(p, _)| p as usize >= pos) {
                return Err(EngineError::BadBatch(format!(
                    "sequence {seq}: position {pos} but {} cells cached",
                    cells.len()
                )));
            }
            if pos >= self.n_ctx {
                return Err(EngineError::NoSpace {
                    seq,
                    needed: pos + 1,
                    capacity: self.n_ctx,
                });
            }
            cells.push((pos as u32, tok));
            if batch.logits[i] {
                let mut ordered = cells.clone();
                ordered.sort_unstable();
                let tokens: Vec<u32> = ordered.iter().map(|&(_, t)| t).collect();
                self.logits_for(&tokens, out);
            }
        }
        Ok(())
    }

    fn seq_rm(&mut self, seq: SeqId, p0: u32, p1: Option<u32>) {
        if let Some(cells) = self.cache.get_mut(&seq) {
            let p1 = p1.unwrap_or(u32::MAX);
            cells.retain(|&(p, _)| p < p0 || p >= p1);
        }
    }

    fn seq_cp(&mut self, src: SeqId, dst: SeqId, n: u32) {
        let copied: Vec<(u32, u32)> = self
            .cache
            .get(&src)
            .map(|c| c.iter().copied().filter(|&(p, _)| p < n).collect())
            .unwrap_or_default();
        self.cache.insert(dst, copied);
    }

    fn can_shift(&self) -> bool {
        true
    }

    fn seq_add(&mut self, seq: SeqId, p0: u32, p1: u32, delta: i32) {
        let Some(cells) = self.cache.get_mut(&seq) else {
            return;
        };
        for cell in cells.iter_mut() {
            if cell.0 >= p0 && cell.0 < p1 {
                cell.0 = (i64::from(cell.0) + i64::from(delta)) as u32;
            }
        }
        let mut seen: Vec<u32> = cells.iter().map(|&(p, _)| p).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), cells.len(), "seq_add moved a cell onto another");
    }

    fn seq_save(&self, seq: SeqId) -> Option<SeqState> {
        if !self.saves {
            return None;
        }
        let cells = self.cache.get(&seq).filter(|c| !c.is_empty())?.clone();
        let bytes = 4 * cells.len();
        Some(SeqState::new(cells, bytes))
    }

    fn seq_load(&mut self, seq: SeqId, state: &SeqState) -> bool {
        match state.get::<Vec<(u32, u32)>>() {
            Some(cells) => {
                self.cache.insert(seq, cells.clone());
                true
            }
            None => false,
        }
    }
}

/// What greedy decoding of a fresh [`MockEngine`] gives for `tokens`: `n` generated bytes as text.
/// The reference a test compares the server's (or the scheduler's) output with.
pub fn mock_greedy(tokens: &[u32], n: usize) -> String {
    let mut engine = MockEngine::new(4096);
    let mut tokens = tokens.to_vec();
    let mut batch = Batch::default();
    for (i, &t) in tokens.iter().enumerate() {
        batch.push(t, i as u32, 0, i + 1 == tokens.len());
    }
    let mut logits = Vec::new();
    engine.decode(&batch, &mut logits).expect("decode");
    let mut out = String::new();
    for _ in 0..n {
        let best = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .expect("logits");
        out.push(best as u8 as char);
        let mut b = Batch::default();
        b.push(best, tokens.len() as u32, 0, true);
        tokens.push(best);
        logits.clear();
        engine.decode(&b, &mut logits).expect("decode");
    }
    out
}
