//! The typed results of parsing: `Config` (everything but placement) and `PlacementIntent` (what
//! the planner reads). Plain data with pub fields; defaults are upstream b11434's server defaults.

use crate::sampling::{GrammarOrigin, GrammarSource, SamplerType, SamplingParams};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Where a value came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    #[default]
    Default,
    /// The spelling used on the command line, e.g. `-ngl`.
    Flag(String),
    /// The environment variable, e.g. `LLAMA_ARG_N_GPU_LAYERS`.
    Env(String),
    /// A llama.cpp config file, e.g. `/etc/llama.cpp/config.ini`.
    File(String),
}

/// A value with its origin; the planner sees both.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sourced<T> {
    pub value: T,
    pub source: Source,
}

impl<T> Sourced<T> {
    pub fn default_value(value: T) -> Self {
        Sourced {
            value,
            source: Source::Default,
        }
    }
}

/// `-ngl` / `-ngld`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuLayers {
    /// Let `--fit` decide (upstream `-1`).
    #[default]
    Auto,
    /// Every layer (upstream `-2` or below).
    All,
    Count(u32),
}

/// `-sm`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    None,
    #[default]
    Layer,
    Row,
    Tensor,
}

/// `-dev` / `-devd`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// Every usable device (or, for the draft model, whatever the main model uses).
    #[default]
    All,
    /// `none`: keep everything on the host.
    NoOffload,
    /// The named devices, in order.
    Named(Vec<String>),
}

/// One `-ot` entry: tensors whose name matches `pattern` go to `buffer_type`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorOverride {
    pub pattern: String,
    pub buffer_type: String,
}

/// `-lm`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadMode {
    #[default]
    Auto,
    None,
    Mmap,
    Mlock,
    #[serde(rename = "mmap+mlock")]
    MmapMlock,
    Dio,
}

/// `-lzm`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LazyMode {
    On,
    #[default]
    Auto,
    Off,
}

/// bloomery's `--place`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Place {
    /// `a`: the planner chooses cards and split.
    #[default]
    Auto,
    /// `bp` (balanced pipeline): attention on the larger of two cards, experts on the other.
    BalancedPipeline,
    /// `0+1`: exactly these card indices.
    Cards(Vec<u32>),
}

/// One `BLOOMERY_CARD_BUDGET` entry: at most `bytes` of the named card may be used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CardBudget {
    pub device: String,
    pub bytes: u64,
}

/// The placement options of the draft model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DraftPlacement {
    pub devices: Sourced<DeviceChoice>,
    pub n_gpu_layers: Sourced<GpuLayers>,
    pub cpu_moe: Sourced<bool>,
    pub n_cpu_moe: Sourced<u32>,
    pub override_tensor: Sourced<Vec<TensorOverride>>,
    pub cache_type_k: Sourced<String>,
    pub cache_type_v: Sourced<String>,
}

/// Everything that decides where tensors and caches live. The planner reads only this.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlacementIntent {
    pub devices: Sourced<DeviceChoice>,
    pub split_mode: Sourced<SplitMode>,
    pub main_gpu: Sourced<i32>,
    /// Proportions per device; devices past the list get 0; all zero (or empty) = by free memory.
    pub tensor_split: Sourced<Vec<f32>>,
    pub n_gpu_layers: Sourced<GpuLayers>,
    pub cpu_moe: Sourced<bool>,
    pub n_cpu_moe: Sourced<u32>,
    pub n_cpu_ffn: Sourced<u32>,
    pub override_tensor: Sourced<Vec<TensorOverride>>,
    pub fit: Sourced<bool>,
    /// Free memory to leave per device, MiB. A single value applies to every device; with
    /// several, devices past the list keep 1024.
    pub fit_target_mib: Sourced<Vec<u64>>,
    /// Smallest context `--fit` may shrink to; `u32::MAX` once `-c 0` asked for the full context.
    pub fit_ctx: Sourced<u32>,
    pub load_mode: Sourced<LoadMode>,
    pub lazy_mode: Sourced<LazyMode>,
    pub kv_offload: Sourced<bool>,
    pub op_offload: Sourced<bool>,
    pub repack: Sourced<bool>,
    pub no_host: Sourced<bool>,
    pub cache_type_k: Sourced<String>,
    pub cache_type_v: Sourced<String>,
    pub draft: DraftPlacement,
    pub place: Sourced<Place>,
    pub card_budget: Sourced<Vec<CardBudget>>,
}

impl Default for PlacementIntent {
    fn default() -> Self {
        fn d<T>(value: T) -> Sourced<T> {
            Sourced::default_value(value)
        }
        PlacementIntent {
            devices: d(DeviceChoice::All),
            split_mode: d(SplitMode::Layer),
            main_gpu: d(0),
            tensor_split: d(Vec::new()),
            n_gpu_layers: d(GpuLayers::Auto),
            cpu_moe: d(false),
            n_cpu_moe: d(0),
            n_cpu_ffn: d(0),
            override_tensor: d(Vec::new()),
            fit: d(true),
            fit_target_mib: d(vec![1024]),
            fit_ctx: d(4096),
            load_mode: d(LoadMode::Auto),
            lazy_mode: d(LazyMode::Auto),
            kv_offload: d(true),
            op_offload: d(true),
            repack: d(true),
            no_host: d(false),
            cache_type_k: d("f16".into()),
            cache_type_v: d("f16".into()),
            draft: DraftPlacement {
                devices: d(DeviceChoice::All),
                n_gpu_layers: d(GpuLayers::Auto),
                cpu_moe: d(false),
                n_cpu_moe: d(0),
                override_tensor: d(Vec::new()),
                cache_type_k: d("f16".into()),
                cache_type_v: d("f16".into()),
            },
            place: d(Place::Auto),
            card_budget: d(Vec::new()),
        }
    }
}

/// Where the model comes from, and what is changed in it at load.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ModelSource {
    pub path: String,
    pub url: String,
    pub docker_repo: String,
    pub hf_repo: String,
    pub hf_file: String,
    pub hf_token: String,
    pub offline: bool,
    pub aliases: BTreeSet<String>,
    pub tags: BTreeSet<String>,
    pub override_kv: Vec<crate::model::KvOverride>,
    pub check_tensors: bool,
}

/// A LoRA adapter or control vector file with its scale.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaledFile {
    pub path: String,
    pub scale: f32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Adapters {
    pub lora: Vec<ScaledFile>,
    pub lora_init_without_apply: bool,
    pub control_vectors: Vec<ScaledFile>,
    /// Inclusive first and last layer; `None` = every layer.
    pub control_vector_layers: Option<(i32, i32)>,
}

/// CPU threads of one phase (generation or batch).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuParams {
    /// -1 = the engine's choice (physical cores).
    pub threads: i32,
    /// Hex mask, empty = any CPU.
    pub cpu_mask: String,
    /// `lo-hi`, empty = none.
    pub cpu_range: String,
    pub strict: u64,
    /// -1 low .. 3 realtime.
    pub priority: i32,
    pub poll: u64,
}

impl Default for CpuParams {
    fn default() -> Self {
        CpuParams {
            threads: -1,
            cpu_mask: String::new(),
            cpu_range: String::new(),
            strict: 0,
            priority: 0,
            poll: 50,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Threads {
    pub generation: CpuParams,
    /// Fields left at their default follow `generation`.
    pub batch: CpuParams,
    /// `distribute`, `isolate`, `numactl`, or empty = off.
    pub numa: String,
}

/// Context and KV cache shape, RoPE, and per-token behaviour of the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Context {
    /// 0 = the model's trained context.
    pub ctx_size: i32,
    pub batch: i32,
    pub ubatch: i32,
    /// `None` = auto.
    pub flash_attn: Option<bool>,
    pub swa_full: bool,
    pub kv_unified: Option<bool>,
    pub kv_unified_per_slot: i32,
    /// `none`, `linear`, `yarn`, or empty = the model's.
    pub rope_scaling: String,
    /// 0 = the model's.
    pub rope_freq_base: f32,
    /// 0 = the model's.
    pub rope_freq_scale: f32,
    pub yarn_orig_ctx: i32,
    pub yarn_ext_factor: f32,
    pub yarn_attn_factor: f32,
    pub yarn_beta_slow: f32,
    pub yarn_beta_fast: f32,
    /// `none`, `mean`, `cls`, `last`, `rank`, or empty = the model's.
    pub pooling: String,
    pub embd_normalize: i32,
    pub warmup: bool,
    pub escape: bool,
    pub special: bool,
    pub spm_infill: bool,
    pub reverse_prompts: Vec<String>,
    /// Upstream ignores it; kept so a script that sets it sees it echoed.
    pub defrag_thold: Option<String>,
}

impl Default for Context {
    fn default() -> Self {
        Context {
            ctx_size: 0,
            batch: 2048,
            ubatch: 512,
            flash_attn: None,
            swa_full: false,
            kv_unified: None,
            kv_unified_per_slot: 0,
            rope_scaling: String::new(),
            rope_freq_base: 0.0,
            rope_freq_scale: 0.0,
            yarn_orig_ctx: 0,
            yarn_ext_factor: -1.0,
            yarn_attn_factor: -1.0,
            yarn_beta_slow: -1.0,
            yarn_beta_fast: -1.0,
            pooling: String::new(),
            embd_normalize: 2,
            warmup: true,
            escape: true,
            special: false,
            spm_infill: false,
            reverse_prompts: Vec::new(),
            defrag_thold: None,
        }
    }
}

/// Slots, batching and the prompt cache.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Slots {
    /// -1 = auto.
    pub n_parallel: i32,
    pub cont_batching: bool,
    /// -1 = unlimited.
    pub n_predict: i32,
    pub keep: i32,
    pub cache_prompt: bool,
    pub cache_reuse: i32,
    pub cache_ram_mib: i32,
    pub cache_idle_slots: bool,
    pub ctx_checkpoints: i32,
    pub checkpoint_min_step: i32,
    pub context_shift: bool,
    pub slot_prompt_similarity: f32,
    /// Ends with `/` when set.
    pub slot_save_path: String,
    pub lookup_cache_static: String,
    pub lookup_cache_dynamic: String,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            n_parallel: -1,
            cont_batching: true,
            n_predict: -1,
            keep: 0,
            cache_prompt: true,
            cache_reuse: 0,
            cache_ram_mib: 8192,
            cache_idle_slots: true,
            ctx_checkpoints: 32,
            checkpoint_min_step: 8192,
            context_shift: false,
            slot_prompt_similarity: 0.1,
            slot_save_path: String::new(),
            lookup_cache_static: String::new(),
            lookup_cache_dynamic: String::new(),
        }
    }
}

/// HTTP serving.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Serve {
    pub hosts: Vec<String>,
    pub port: i32,
    pub reuse_port: bool,
    pub static_path: String,
    pub api_prefix: String,
    pub api_keys: Vec<String>,
    pub ssl_key_file: String,
    pub ssl_cert_file: String,
    /// Read and write timeout, seconds.
    pub timeout: i32,
    pub sse_ping_interval: i32,
    pub threads_http: i32,
    pub cors_origins: String,
    /// Whether `--cors-origins` was given (tools and MCP narrow the default otherwise).
    pub cors_origins_explicit: bool,
    pub cors_methods: String,
    pub cors_headers: String,
    pub cors_credentials: bool,
    pub metrics: bool,
    pub props: bool,
    pub slots_endpoint: bool,
    pub media_path: String,
    pub ui: bool,
    pub ui_config_json: String,
    pub ui_mcp_proxy: bool,
    pub tools: Vec<String>,
    pub tools_runtime: String,
    pub mcp_servers_config: String,
    pub mcp_servers_json: String,
    pub embedding: bool,
    pub models_dir: String,
    pub models_preset: String,
    pub models_max: i32,
    pub models_autoload: bool,
    /// -1 = never sleep.
    pub sleep_idle_seconds: i32,
    pub log_prompts_dir: String,
}

impl Default for Serve {
    fn default() -> Self {
        Serve {
            hosts: vec!["127.0.0.1".into()],
            port: 8080,
            reuse_port: false,
            static_path: String::new(),
            api_prefix: String::new(),
            api_keys: Vec::new(),
            ssl_key_file: String::new(),
            ssl_cert_file: String::new(),
            timeout: 3600,
            sse_ping_interval: 30,
            threads_http: -1,
            cors_origins: "*".into(),
            cors_origins_explicit: false,
            cors_methods: "GET, POST, DELETE, OPTIONS".into(),
            cors_headers: "*".into(),
            cors_credentials: true,
            metrics: false,
            props: false,
            slots_endpoint: true,
            media_path: String::new(),
            ui: true,
            ui_config_json: String::new(),
            ui_mcp_proxy: false,
            tools: Vec::new(),
            tools_runtime: String::new(),
            mcp_servers_config: String::new(),
            mcp_servers_json: String::new(),
            embedding: false,
            models_dir: String::new(),
            models_preset: String::new(),
            models_max: 4,
            models_autoload: true,
            sleep_idle_seconds: -1,
            log_prompts_dir: String::new(),
        }
    }
}

/// A grammar constraint given at start-up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grammar {
    /// GBNF text.
    Gbnf(String),
    /// GBNF converted from a JSON schema (`--json-schema`, `--json-schema-file`).
    JsonSchema(String),
}

/// Default sampling parameters; requests may override each.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SamplingDefaults {
    /// `u32::MAX` = a random seed per request.
    pub seed: u32,
    /// Top probabilities returned per token; no option sets it, requests do.
    pub n_probs: i32,
    /// Candidates every sampler must leave; no option sets it, requests do.
    pub min_keep: i32,
    /// Canonical names in order (`penalties`, `dry`, `top_n_sigma`, `top_k`, ...).
    pub samplers: Vec<String>,
    pub ignore_eos: bool,
    pub temp: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub top_n_sigma: f32,
    pub xtc_probability: f32,
    pub xtc_threshold: f32,
    pub typical_p: f32,
    pub repeat_last_n: i32,
    pub n_prev: i32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub dry_multiplier: f32,
    pub dry_base: f32,
    pub dry_allowed_length: i32,
    pub dry_penalty_last_n: i32,
    pub dry_sequence_breakers: Vec<String>,
    pub adaptive_target: f32,
    pub adaptive_decay: f32,
    pub dynatemp_range: f32,
    pub dynatemp_exponent: f32,
    pub mirostat: i32,
    pub mirostat_lr: f32,
    pub mirostat_ent: f32,
    pub logit_bias: Vec<(i32, f32)>,
    pub grammar: Option<Grammar>,
    pub backend_sampling: bool,
    pub reasoning_budget: i32,
    pub reasoning_budget_message: String,
    /// Names of the parameters the user set, so a model's own defaults never override them.
    pub user_set: BTreeSet<String>,
}

/// The default sampler order, by canonical name.
pub const DEFAULT_SAMPLERS: [&str; 9] = [
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
];

impl Default for SamplingDefaults {
    fn default() -> Self {
        SamplingDefaults {
            seed: u32::MAX,
            n_probs: 0,
            min_keep: 0,
            samplers: DEFAULT_SAMPLERS.iter().map(|s| s.to_string()).collect(),
            ignore_eos: false,
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            typical_p: 1.0,
            repeat_last_n: 64,
            n_prev: 64,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
            adaptive_target: -1.0,
            adaptive_decay: 0.9,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            mirostat: 0,
            mirostat_lr: 0.1,
            mirostat_ent: 5.0,
            logit_bias: Vec::new(),
            grammar: None,
            backend_sampling: false,
            reasoning_budget: -1,
            reasoning_budget_message: String::new(),
            user_set: BTreeSet::new(),
        }
    }
}

impl SamplingDefaults {
    /// The sampler chain parameters these defaults give; requests override them one by one.
    /// A negative token id in a logit bias matches no token and is left out.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            seed: self.seed,
            n_prev: self.n_prev,
            n_probs: self.n_probs,
            min_keep: self.min_keep,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            typ_p: self.typical_p,
            temp: self.temp,
            dynatemp_range: self.dynatemp_range,
            dynatemp_exponent: self.dynatemp_exponent,
            penalty_last_n: self.repeat_last_n,
            penalty_repeat: self.repeat_penalty,
            penalty_freq: self.frequency_penalty,
            penalty_present: self.presence_penalty,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: self.dry_penalty_last_n,
            mirostat: self.mirostat,
            top_n_sigma: self.top_n_sigma,
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            ignore_eos: self.ignore_eos,
            dry_sequence_breakers: self.dry_sequence_breakers.clone(),
            samplers: self
                .samplers
                .iter()
                .filter_map(|n| SamplerType::from_name(n))
                .collect(),
            logit_bias: self
                .logit_bias
                .iter()
                .filter_map(|&(t, b)| u32::try_from(t).ok().map(|t| (t, b)))
                .collect(),
            grammar: match &self.grammar {
                Some(Grammar::Gbnf(text)) => Some(GrammarSource {
                    text: text.clone(),
                    origin: GrammarOrigin::User,
                }),
                Some(Grammar::JsonSchema(text)) => Some(GrammarSource {
                    text: text.clone(),
                    origin: GrammarOrigin::Schema,
                }),
                None => None,
            },
            reasoning_budget_tokens: self.reasoning_budget,
            ..SamplingParams::default()
        }
    }
}

/// Chat templates and reasoning.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chat {
    pub jinja: bool,
    /// Template text or built-in name; empty = the model's.
    pub template: String,
    /// Extra template variables, each a JSON value in text form.
    pub template_kwargs: BTreeMap<String, String>,
    /// `none`, `auto`, `deepseek`, `deepseek-legacy`.
    pub reasoning_format: String,
    /// `None` = detect from the template.
    pub reasoning: Option<bool>,
    pub skip_chat_parsing: bool,
    pub prefill_assistant: bool,
}

impl Default for Chat {
    fn default() -> Self {
        Chat {
            jinja: true,
            template: String::new(),
            template_kwargs: BTreeMap::new(),
            reasoning_format: "deepseek".into(),
            reasoning: None,
            skip_chat_parsing: false,
            prefill_assistant: true,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Logging {
    pub disable: bool,
    pub file: String,
    pub jsonl: bool,
    /// `None` = colours when writing to a terminal.
    pub colors: Option<bool>,
    /// 0 output, 1 error, 2 warning, 3 info, 4 trace, 5 debug; `i32::MAX` = everything.
    pub verbosity: i32,
    pub prefix: bool,
    pub timestamps: bool,
    pub perf: bool,
}

impl Default for Logging {
    fn default() -> Self {
        Logging {
            disable: false,
            file: String::new(),
            jsonl: false,
            colors: None,
            verbosity: 3,
            prefix: false,
            timestamps: false,
            perf: true,
        }
    }
}

/// Multimodal projector and media limits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Multimodal {
    pub mmproj: String,
    pub mmproj_url: String,
    pub mmproj_auto: bool,
    pub mmproj_offload: bool,
    /// Empty = follows `--device`.
    pub mmproj_device: String,
    pub image_min_tokens: i32,
    pub image_max_tokens: i32,
    pub batch_max_tokens: i32,
    pub video_fps: f32,
    pub video_timestamp_interval_ms: i32,
    pub video_ffmpeg_dir: String,
}

impl Default for Multimodal {
    fn default() -> Self {
        Multimodal {
            mmproj: String::new(),
            mmproj_url: String::new(),
            mmproj_auto: true,
            mmproj_offload: true,
            mmproj_device: String::new(),
            image_min_tokens: -1,
            image_max_tokens: -1,
            batch_max_tokens: 1024,
            video_fps: 4.0,
            video_timestamp_interval_ms: 5000,
            video_ffmpeg_dir: String::new(),
        }
    }
}

/// One n-gram speculative method's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NgramSizes {
    pub size_n: i32,
    pub size_m: i32,
    pub min_hits: i32,
}

const NGRAM_DEFAULT: NgramSizes = NgramSizes {
    size_n: 12,
    size_m: 48,
    min_hits: 1,
};

/// Speculative decoding (draft model placement is in `PlacementIntent::draft`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Speculative {
    /// Requested methods by name (`draft-simple`, `ngram-mod`, ...); empty = none.
    pub types: Vec<String>,
    pub draft_model: String,
    pub draft_hf_repo: String,
    pub draft_hf_file: String,
    pub draft_threads: CpuParams,
    pub draft_threads_batch: CpuParams,
    pub n_max: i32,
    pub n_min: i32,
    pub p_split: f32,
    pub p_min: f32,
    pub backend_sampling: bool,
    pub probabilistic: bool,
    pub synth_len: f64,
    pub synth_rates: Vec<f64>,
    pub ngram_mod_n_min: i32,
    pub ngram_mod_n_max: i32,
    pub ngram_mod_n_match: i32,
    pub ngram_simple: NgramSizes,
    pub ngram_map_k: NgramSizes,
    pub ngram_map_k4v: NgramSizes,
}

impl Default for Speculative {
    fn default() -> Self {
        Speculative {
            types: Vec::new(),
            draft_model: String::new(),
            draft_hf_repo: String::new(),
            draft_hf_file: String::new(),
            draft_threads: CpuParams::default(),
            draft_threads_batch: CpuParams::default(),
            n_max: 3,
            n_min: 0,
            p_split: 0.1,
            p_min: 0.0,
            backend_sampling: true,
            probabilistic: false,
            synth_len: -1.0,
            synth_rates: Vec::new(),
            ngram_mod_n_min: 48,
            ngram_mod_n_max: 64,
            ngram_mod_n_match: 24,
            ngram_simple: NGRAM_DEFAULT,
            ngram_map_k: NGRAM_DEFAULT,
            ngram_map_k4v: NGRAM_DEFAULT,
        }
    }
}

/// An option the user set whose feature bloomery does not have yet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct NotBuilt {
    pub option: String,
    pub feature: String,
}

/// Everything parsed from the command line and environment except placement.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Config {
    pub model: ModelSource,
    pub serve: Serve,
    pub slots: Slots,
    pub context: Context,
    pub threads: Threads,
    pub sampling: SamplingDefaults,
    pub chat: Chat,
    pub log: Logging,
    pub adapters: Adapters,
    pub multimodal: Multimodal,
    pub speculative: Speculative,
    /// Options set by the user whose feature is not built yet, each listed once.
    pub not_built: BTreeSet<NotBuilt>,
    /// The origin of each option that was set, by its long name.
    pub origins: BTreeMap<String, Source>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_defaults_are_the_samplers_defaults() {
        assert_eq!(
            SamplingDefaults::default().params(),
            SamplingParams::default()
        );
    }

    #[test]
    fn sampling_values_reach_the_sampler() {
        let d = SamplingDefaults {
            temp: 0.1,
            samplers: vec!["top_k".into(), "temperature".into()],
            logit_bias: vec![(5, 1.0), (-1, 2.0)],
            ..SamplingDefaults::default()
        };
        let p = d.params();
        assert_eq!(p.temp, 0.1);
        assert_eq!(
            p.samplers,
            vec![SamplerType::TopK, SamplerType::Temperature]
        );
        assert_eq!(p.logit_bias, vec![(5, 1.0)]);
    }
}
