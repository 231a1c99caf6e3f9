//! llama.cpp's sampler chain and its parameters (`common/sampling.cpp` over
//! `src/llama-sampler.cpp`): logit bias, then the configurable stages in `samplers` order, then
//! a seeded draw (or mirostat). Knows nothing about HTTP or the engine; it reads one logits row
//! and returns a token.
//!
//! Greedy decoding is not a separate path: `temperature <= 0` keeps only the best logit and the
//! final draw then has one live candidate, exactly as upstream does.

mod budget;
mod candidates;
mod rng;
mod stages;

pub use budget::{utf8_complete, Budget, BudgetState};
pub use candidates::{Candidates, TokenData};
pub use rng::{resolve_seed, Mt19937, DEFAULT_SEED};
pub use stages::DryVocab;

use stages::{Dist, Dry, Mirostat, MirostatV2, Penalties, Stage, Xtc};

use std::sync::Arc;

use crate::grammar::{GrammarState, TokenTexts};

/// Where a grammar came from, which decides whether the template's generation prompt is fed
/// through it before sampling (upstream prefills schema and tool-call grammars, never a user's
/// GBNF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrammarOrigin {
    /// `grammar` / `--grammar`: GBNF from the user.
    User,
    /// Converted from `json_schema`, `response_format` or `--json-schema`.
    Schema,
    /// Built by a chat template's tool-call handling.
    ToolCalls,
}

/// A GBNF grammar generations must follow.
#[derive(Clone, Debug, PartialEq)]
pub struct GrammarSource {
    pub text: String,
    pub origin: GrammarOrigin,
}

impl GrammarSource {
    pub fn needs_prefill(&self) -> bool {
        self.origin != GrammarOrigin::User
    }
}

/// What wakes a lazy grammar (upstream's `common_grammar_trigger`; `type_code` is its number).
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarTrigger {
    /// A token, named by the word it stands for.
    Token { token: u32, word: String },
    /// Literal text anywhere in the output.
    Word(String),
    /// A regular expression found anywhere in the output.
    Pattern(String),
    /// A regular expression the whole output must match.
    PatternFull(String),
}

impl GrammarTrigger {
    pub fn type_code(&self) -> i64 {
        match self {
            GrammarTrigger::Token { .. } => 0,
            GrammarTrigger::Word(_) => 1,
            GrammarTrigger::Pattern(_) => 2,
            GrammarTrigger::PatternFull(_) => 3,
        }
    }

    pub fn value(&self) -> &str {
        match self {
            GrammarTrigger::Token { word, .. } => word,
            GrammarTrigger::Word(v)
            | GrammarTrigger::Pattern(v)
            | GrammarTrigger::PatternFull(v) => v,
        }
    }

    /// The regular expression the grammar waits for (none for a token trigger).
    pub fn pattern(&self) -> Option<String> {
        match self {
            GrammarTrigger::Token { .. } => None,
            GrammarTrigger::Word(w) => Some(regex::escape(w)),
            GrammarTrigger::Pattern(p) => Some(p.clone()),
            GrammarTrigger::PatternFull(p) if p.is_empty() => Some("^$".into()),
            GrammarTrigger::PatternFull(p) => Some(format!(
                "{}{p}{}",
                if p.starts_with('^') { "" } else { "^" },
                if p.ends_with('$') { "" } else { "$" }
            )),
        }
    }
}

/// A configurable stage of the chain, named as upstream's `samplers` option names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerType {
    Dry,
    TopK,
    TopP,
    TopNSigma,
    TypicalP,
    MinP,
    Temperature,
    Xtc,
    Infill,
    Penalties,
    AdaptiveP,
}

impl SamplerType {
    const ALL: [SamplerType; 11] = [
        SamplerType::Dry,
        SamplerType::TopK,
        SamplerType::TopP,
        SamplerType::TopNSigma,
        SamplerType::TypicalP,
        SamplerType::MinP,
        SamplerType::Temperature,
        SamplerType::Xtc,
        SamplerType::Infill,
        SamplerType::Penalties,
        SamplerType::AdaptiveP,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SamplerType::Dry => "dry",
            SamplerType::TopK => "top_k",
            SamplerType::TopP => "top_p",
            SamplerType::TopNSigma => "top_n_sigma",
            SamplerType::TypicalP => "typ_p",
            SamplerType::MinP => "min_p",
            SamplerType::Temperature => "temperature",
            SamplerType::Xtc => "xtc",
            SamplerType::Infill => "infill",
            SamplerType::Penalties => "penalties",
            SamplerType::AdaptiveP => "adaptive_p",
        }
    }

    pub fn letter(self) -> char {
        match self {
            SamplerType::Dry => 'd',
            SamplerType::TopK => 'k',
            SamplerType::TopP => 'p',
            SamplerType::TopNSigma => 's',
            SamplerType::TypicalP => 'y',
            SamplerType::MinP => 'm',
            SamplerType::Temperature => 't',
            SamplerType::Xtc => 'x',
            SamplerType::Infill => 'i',
            SamplerType::Penalties => 'e',
            SamplerType::AdaptiveP => 'a',
        }
    }

    /// Canonical names, their kebab-case and dashless spellings, and upstream's few aliases;
    /// case-insensitive.
    pub fn from_name(name: &str) -> Option<SamplerType> {
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "nucleus" => return Some(SamplerType::TopP),
            "temp" => return Some(SamplerType::Temperature),
            "typ" => return Some(SamplerType::TypicalP),
            _ => {}
        }
        Self::ALL.into_iter().find(|t| {
            let canonical = t.name();
            canonical == lower
                || (canonical.contains('_')
                    && (canonical.replace('_', "-") == lower
                        || canonical.replace('_', "") == lower))
        })
    }

    pub fn from_letter(c: char) -> Option<SamplerType> {
        Self::ALL.into_iter().find(|t| t.letter() == c)
    }

    /// Names that match nothing are skipped with a warning, as upstream does.
    pub fn parse_names<S: AsRef<str>>(names: &[S]) -> Vec<SamplerType> {
        names
            .iter()
            .filter_map(|n| {
                let found = SamplerType::from_name(n.as_ref());
                if found.is_none() {
                    log::warn!("unable to match sampler by name '{}'", n.as_ref());
                }
                found
            })
            .collect()
    }

    pub fn parse_letters(letters: &str) -> Vec<SamplerType> {
        letters
            .chars()
            .filter_map(|c| {
                let found = SamplerType::from_letter(c);
                if found.is_none() {
                    log::warn!("unable to match sampler by char '{c}'");
                }
                found
            })
            .collect()
    }
}

/// Upstream's `common_params_sampling` fields that shape the chain, with its defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub seed: u32,
    pub n_prev: i32,
    pub n_probs: i32,
    pub min_keep: i32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub xtc_probability: f32,
    pub xtc_threshold: f32,
    pub typ_p: f32,
    pub temp: f32,
    pub dynatemp_range: f32,
    pub dynatemp_exponent: f32,
    pub penalty_last_n: i32,
    pub penalty_repeat: f32,
    pub penalty_freq: f32,
    pub penalty_present: f32,
    pub dry_multiplier: f32,
    pub dry_base: f32,
    pub dry_allowed_length: i32,
    pub dry_penalty_last_n: i32,
    pub mirostat: i32,
    pub top_n_sigma: f32,
    pub mirostat_tau: f32,
    pub mirostat_eta: f32,
    pub ignore_eos: bool,
    pub dry_sequence_breakers: Vec<String>,
    pub samplers: Vec<SamplerType>,
    /// (token, bias) pairs; `-inf` bans a token.
    pub logit_bias: Vec<(u32, f32)>,
    /// The grammar the output must follow, if any.
    pub grammar: Option<GrammarSource>,
    /// The grammar waits for one of `grammar_triggers` before it constrains anything.
    pub grammar_lazy: bool,
    pub grammar_triggers: Vec<GrammarTrigger>,
    /// Tokens a trigger word may stand for (`preserved_tokens`).
    pub preserved_tokens: Vec<u32>,
    /// Tokens per thinking block (-1: unlimited), the tags that open and close one, and what
    /// is forced when the budget runs out (the message, then the first end tag).
    pub reasoning_budget_tokens: i32,
    pub reasoning_start: Vec<u32>,
    pub reasoning_ends: Vec<Vec<u32>>,
    pub reasoning_forced: Vec<u32>,
    pub reasoning_control: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            seed: DEFAULT_SEED,
            n_prev: 64,
            n_probs: 0,
            min_keep: 0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            xtc_probability: 0.0,
            xtc_threshold: 0.10,
            typ_p: 1.0,
            temp: 0.80,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            penalty_last_n: 64,
            penalty_repeat: 1.0,
            penalty_freq: 0.0,
            penalty_present: 0.0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            mirostat: 0,
            top_n_sigma: -1.0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.10,
            ignore_eos: false,
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
            samplers: vec![
                SamplerType::Penalties,
                SamplerType::Dry,
                SamplerType::TopNSigma,
                SamplerType::TopK,
                SamplerType::TypicalP,
                SamplerType::TopP,
                SamplerType::MinP,
                SamplerType::Xtc,
                SamplerType::Temperature,
            ],
            logit_bias: Vec::new(),
            grammar: None,
            grammar_lazy: false,
            grammar_triggers: Vec::new(),
            preserved_tokens: Vec::new(),
            reasoning_budget_tokens: -1,
            reasoning_start: Vec::new(),
            reasoning_ends: Vec::new(),
            reasoning_forced: Vec::new(),
            reasoning_control: false,
        }
    }
}

/// Why a chain could not be built.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingError(pub String);

impl std::fmt::Display for SamplingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SamplingError {}

/// One request's sampler: the chain plus the history of accepted tokens, and the grammar state
/// when the output is constrained.
pub struct Sampler {
    stages: Vec<Stage>,
    candidates: Candidates,
    grammar: Option<(GrammarState, Arc<TokenTexts>)>,
    grammar_lazy: bool,
    /// The reasoning budget, with whether each token's text ends on a whole character.
    budget: Option<(Budget, TokenCompleteness)>,
}

/// Whether a token's text (special tokens not rendered) ends on a whole UTF-8 character.
pub type TokenCompleteness = Arc<dyn Fn(u32) -> bool + Send + Sync>;

impl Sampler {
    /// Builds the chain `params` describe. `vocab` is needed only when DRY is on.
    pub fn new(
        params: &SamplingParams,
        n_vocab: usize,
        vocab: &dyn DryVocab,
    ) -> Result<Sampler, SamplingError> {
        let repeat = params.penalty_repeat;
        if !repeat.is_finite() || repeat <= 0.0 || !(1.0 / repeat).is_finite() {
            return Err(SamplingError(
                "penalty_repeat must be finite and greater than 0".into(),
            ));
        }
        if !params.penalty_freq.is_finite() {
            return Err(SamplingError("penalty_freq must be finite".into()));
        }
        if !params.penalty_present.is_finite() {
            return Err(SamplingError("penalty_present must be finite".into()));
        }
        let min_keep = params.min_keep.max(0) as usize;
        let mut stages = Vec::new();
        if !params.logit_bias.is_empty() {
            stages.push(Stage::LogitBias(params.logit_bias.clone()));
        }
        match params.mirostat {
            0 => {
                for kind in &params.samplers {
                    let stage = match kind {
                        SamplerType::Dry => Dry::new(
                            vocab,
                            params.dry_multiplier,
                            params.dry_base,
                            params.dry_allowed_length,
                            params.dry_penalty_last_n,
                            &params.dry_sequence_breakers,
                        )
                        .map(Stage::Dry),
                        SamplerType::TopK => {
                            (params.top_k > 0).then_some(Stage::TopK(params.top_k as usize))
                        }
                        SamplerType::TopP => (params.top_p < 1.0).then_some(Stage::TopP {
                            p: params.top_p,
                            min_keep,
                        }),
                        SamplerType::TopNSigma => (params.top_n_sigma > 0.0)
                            .then_some(Stage::TopNSigma(params.top_n_sigma)),
                        SamplerType::MinP => (params.min_p > 0.0).then_some(Stage::MinP {
                            p: params.min_p,
                            min_keep,
                        }),
                        SamplerType::Xtc => Xtc::new(
                            params.xtc_probability,
                            params.xtc_threshold,
                            min_keep,
                            params.seed,
                        )
                        .map(Stage::Xtc),
                        SamplerType::TypicalP => (params.typ_p < 1.0).then_some(Stage::TypicalP {
                            p: params.typ_p,
                            min_keep,
                        }),
                        SamplerType::Temperature => (params.temp != 1.0
                            || params.dynatemp_range > 0.0)
                            .then_some(Stage::TempExt {
                                temp: params.temp,
                                delta: params.dynatemp_range,
                                exponent: params.dynatemp_exponent,
                            }),
                        SamplerType::Penalties => Penalties::new(
                            params.penalty_last_n,
                            params.penalty_repeat,
                            params.penalty_freq,
                            params.penalty_present,
                        )
                        .map(Stage::Penalties),
                        SamplerType::Infill | SamplerType::AdaptiveP => {
                            return Err(SamplingError(format!(
                                "sampler '{}' is not supported",
                                kind.name()
                            )))
                        }
                    };
                    stages.extend(stage);
                }
                stages.push(Stage::Dist(Dist::new(params.seed)));
            }
            1 => {
                if params.temp != 1.0 {
                    stages.push(Stage::Temp(params.temp));
                }
                stages.push(Stage::Mirostat(Mirostat::new(
                    n_vocab,
                    params.seed,
                    params.mirostat_tau,
                    params.mirostat_eta,
                    100,
                )));
            }
            2 => {
                if params.temp != 1.0 {
                    stages.push(Stage::Temp(params.temp));
                }
                stages.push(Stage::MirostatV2(MirostatV2::new(
                    params.seed,
                    params.mirostat_tau,
                    params.mirostat_eta,
                )));
            }
            other => return Err(SamplingError(format!("unknown mirostat version {other}"))),
        }
        Ok(Sampler {
            stages,
            candidates: Candidates::default(),
            grammar: None,
            grammar_lazy: params.grammar_lazy,
            budget: None,
        })
    }

    /// Adds the reasoning budget `params` describe, as upstream does: only with start and end
    /// tags, and only when it limits something (a budget of 0 or more, a lazy grammar, or
    /// runtime control).
    pub fn set_budget(&mut self, params: &SamplingParams, complete: TokenCompleteness) {
        let wanted = !params.reasoning_start.is_empty()
            && !params.reasoning_ends.is_empty()
            && (params.grammar_lazy
                || params.reasoning_budget_tokens >= 0
                || params.reasoning_control);
        if wanted {
            let budget = Budget::new(
                &params.reasoning_start,
                &params.reasoning_ends,
                params.reasoning_forced.clone(),
                params.reasoning_budget_tokens,
            );
            self.budget = Some((budget, complete));
        }
    }

    /// Whether the grammar constrains this step: a lazy grammar stands aside inside a
    /// thinking block the budget is tracking.
    fn grammar_applies(&self) -> bool {
        if self.grammar.is_none() {
            return false;
        }
        match &self.budget {
            Some((b, _)) if self.grammar_lazy => {
                matches!(b.state(), BudgetState::Idle | BudgetState::Done)
            }
            _ => true,
        }
    }

    /// Feeds the generation prompt's tokens through the reasoning budget (a template that opens
    /// its thinking block in the prompt starts the count there).
    pub fn prefill_budget(&mut self, tokens: &[u32]) {
        if let Some((b, complete)) = &mut self.budget {
            for &t in tokens {
                b.accept(t, complete(t));
            }
        }
    }

    /// Constrains the output: from now on only tokens `state` allows are sampled, and
    /// `accept_generated` advances it.
    pub fn set_grammar(&mut self, state: GrammarState, texts: Arc<TokenTexts>) {
        self.grammar = Some((state, texts));
    }

    /// Records a generated token, as upstream's order: the reasoning budget, then the grammar
    /// (when it applied to this step; a lazy grammar that stood aside is fed the end tag that
    /// closed the thinking block instead), then the chain's history.
    pub fn accept_generated(&mut self, token: u32) -> Result<(), SamplingError> {
        let grammar_applied = self.grammar_applies();
        let mut replay = Vec::new();
        if let Some((b, complete)) = &mut self.budget {
            b.accept(token, complete(token));
            if !grammar_applied && b.state() == BudgetState::Done {
                replay = b.ended_with().map(<[u32]>::to_vec).unwrap_or_default();
            }
        }
        if let Some((state, texts)) = &mut self.grammar {
            let fed: &[u32] = if grammar_applied { &[token] } else { &replay };
            for &t in fed {
                state
                    .accept(t, texts)
                    .map_err(|e| SamplingError(e.to_string()))?;
            }
        }
        self.accept(token);
        Ok(())
    }

    /// Feeds tokens the prompt already holds through the grammar only (the generation prompt
    /// of a chat template, for grammars that expect it).
    pub fn prefill_grammar(&mut self, tokens: &[u32]) -> Result<(), SamplingError> {
        if let Some((state, texts)) = &mut self.grammar {
            for &t in tokens {
                state
                    .accept(t, texts)
                    .map_err(|e| SamplingError(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Records a token into the history (prompt tokens with `is_generated = false`, as upstream
    /// feeds a slot's prompt before generating).
    pub fn accept(&mut self, token: u32) {
        for stage in &mut self.stages {
            stage.accept(token);
        }
    }

    /// Runs the chain over one logits row and returns the selected token. With a grammar, as
    /// upstream: the chain picks from all candidates first; only when the grammar refuses that
    /// pick is the row masked by the grammar and the chain run again (its stages run twice, so
    /// a seeded draw advances twice).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        let picked = self.run_chain(self.budgeted(logits))?;
        let Some((state, texts)) = self.grammar.as_ref().filter(|_| self.grammar_applies()) else {
            return Ok(picked);
        };
        if state.allowed(&[picked], texts)[0] {
            return Ok(picked);
        }
        let mut masked = self.budgeted(logits);
        let ids: Vec<u32> = masked.data.iter().map(|t| t.id).collect();
        for (t, ok) in masked.data.iter_mut().zip(state.allowed(&ids, texts)) {
            if !ok {
                t.logit = f32::NEG_INFINITY;
            }
        }
        self.run_chain(masked)
    }

    /// A logits row as candidates, with only the forced token left while the reasoning budget
    /// forces its end sequence.
    fn budgeted(&self, logits: &[f32]) -> Candidates {
        let mut c = Candidates::from_logits(logits);
        if let Some(forced) = self.budget.as_ref().and_then(|(b, _)| b.forced_token()) {
            for t in c.data.iter_mut().filter(|t| t.id != forced) {
                t.logit = f32::NEG_INFINITY;
            }
        }
        c
    }

    fn run_chain(&mut self, candidates: Candidates) -> Result<u32, SamplingError> {
        self.candidates = candidates;
        for stage in &mut self.stages {
            stage.apply(&mut self.candidates);
        }
        match self.candidates.selected {
            Some(i) => Ok(self.candidates.data[i].id),
            None => Err(SamplingError(
                "no selected token during sampling - check your sampling configuration".into(),
            )),
        }
    }

    /// The candidates left after the last `sample`, sorted by probability (upstream's
    /// post-sampling probabilities).
    pub fn candidates_by_probability(&mut self) -> &Candidates {
        self.candidates.sort_by_probability();
        &self.candidates
    }

    pub fn reset(&mut self) {
        for stage in &mut self.stages {
            stage.reset();
        }
    }

    /// The seed the drawing stage is using (the resolved one when a random seed was asked for).
    pub fn seed_in_use(&self) -> u32 {
        self.stages
            .iter()
            .rev()
            .find_map(Stage::seed_in_use)
            .unwrap_or(DEFAULT_SEED)
    }

    /// The stage names in order, as upstream prints the chain.
    pub fn describe(&self) -> String {
        self.stages
            .iter()
            .map(|s| match s {
                Stage::LogitBias(_) => "logit-bias",
                Stage::Penalties(_) => "penalties",
                Stage::Dry(_) => "dry",
                Stage::TopNSigma(_) => "top-n-sigma",
                Stage::TopK(_) => "top-k",
                Stage::TypicalP { .. } => "typical",
                Stage::TopP { .. } => "top-p",
                Stage::MinP { .. } => "min-p",
                Stage::Xtc(_) => "xtc",
                Stage::TempExt { .. } => "temp-ext",
                Stage::Temp(_) => "temp",
                Stage::Dist(_) => "dist",
                Stage::Mirostat(_) => "mirostat",
                Stage::MirostatV2(_) => "mirostat-v2",
            })
            .collect::<Vec<_>>()
            .join(" -> ")
    }
}

/// Softmax over a whole logits row with the `n_top` best first (upstream's
/// `get_token_probabilities`, used for pre-sampling `n_probs`).
pub fn token_probabilities(logits: &[f32], n_top: usize) -> Vec<TokenData> {
    let mut cur = Candidates::from_logits(logits);
    let n_top = n_top.min(cur.len());
    if n_top > 0 {
        // libstdc++'s order for the rest too: the normalizing sum below runs over it in f32
        partial_sort_libstdcxx(&mut cur.data, n_top, |a, b| a.logit > b.logit);
    }
    let max_l = if n_top > 0 {
        cur.data[0].logit
    } else {
        cur.data
            .iter()
            .fold(f32::NEG_INFINITY, |m, t| m.max(t.logit))
    };
    let mut sum = 0.0f32;
    for t in &mut cur.data {
        t.p = (t.logit - max_l).exp();
        sum += t.p;
    }
    for t in &mut cur.data {
        t.p /= sum;
    }
    cur.data
}

/// `std::partial_sort(first, first + middle, last, comp)` as GCC's libstdc++ does it (a heap of
/// the first `middle`, then the rest sifted through it, then the heap sorted), leaving every
/// element where it leaves it.
fn partial_sort_libstdcxx<T: Copy>(v: &mut [T], middle: usize, comp: impl Fn(&T, &T) -> bool) {
    let middle = middle.min(v.len());
    // __make_heap
    if middle >= 2 {
        let mut parent = (middle - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, middle, value, &comp);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    // the rest through the heap
    for i in middle..v.len() {
        if middle > 0 && comp(&v[i], &v[0]) {
            let value = v[i];
            v[i] = v[0];
            adjust_heap(v, 0, middle, value, &comp);
        }
    }
    // __sort_heap
    let mut last = middle;
    while last > 1 {
        last -= 1;
        let value = v[last];
        v[last] = v[0];
        adjust_heap(v, 0, last, value, &comp);
    }
}

/// libstdc++'s `__adjust_heap` over `v[..len]`: the hole at `hole` sinks to a leaf, then `value`
/// rises from there.
fn adjust_heap<T: Copy>(
    v: &mut [T],
    mut hole: usize,
    len: usize,
    value: T,
    comp: &impl Fn(&T, &T) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while len >= 1 && child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if comp(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len.is_multiple_of(2) && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // __push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(&v[parent], &value) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = value;
}

#[cfg(test)]
mod tests;
