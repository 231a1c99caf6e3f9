//! The option table: one entry per llama-server b11434 option (plus bloomery's own), in upstream's
//! help order and groups. Each entry holds every spelling, the value hint (which fixes the arity),
//! the environment variable, our help text, and the small function that applies a value. Parsing,
//! `--help`, completions and the man page are all generated from `GROUPS`.

use super::config::{
    CardBudget, DeviceChoice, GpuLayers, Grammar, LazyMode, LoadMode, Place, ScaledFile, SplitMode,
    TensorOverride,
};
use super::parse::{Exit, Parsed};
use super::values::{
    csv_row, is_falsey, is_truthy, parse_json, parse_size, parse_tristate, read_text_file,
    schema_grammar, split_list, stof, stoi, stoull, strict_f64, trimmed_items, Applied, Refusal,
};
use crate::model::KvOverride;
use crate::sampling::SamplerType;

/// How an option takes its value; this also decides how its environment variable is read
/// (a flag applies when the variable is truthy, a toggle parses a boolean, the rest take text).
#[derive(Clone, Copy)]
pub enum Handler {
    /// No value.
    Flag(fn(&mut Parsed) -> Applied),
    /// No value; the positive or negative spelling gives the boolean.
    Toggle(fn(&mut Parsed, bool) -> Applied),
    /// One integer value read like `stoi`.
    Int(fn(&mut Parsed, i32) -> Applied),
    /// One text value.
    Text(fn(&mut Parsed, &str) -> Applied),
    /// Two text values.
    Pair(fn(&mut Parsed, &str, &str) -> Applied),
}

/// One option.
#[derive(Clone, Copy)]
pub struct Opt {
    /// Positive spellings, short first.
    pub names: &'static [&'static str],
    /// Negative spellings (`--no-...`).
    pub negs: &'static [&'static str],
    /// Value hint, empty for options without a value.
    pub hint: &'static str,
    /// Second value hint, for the one option that takes two values.
    pub hint2: &'static str,
    pub env: Option<&'static str>,
    pub help: &'static str,
    pub handler: Handler,
    /// The feature this option controls when bloomery does not have it yet.
    pub pending: Option<&'static str>,
}

/// A titled section of `--help`, matching upstream's sections.
pub struct Group {
    pub title: &'static str,
    pub options: &'static [Opt],
}

impl Opt {
    const fn new(
        names: &'static [&'static str],
        hint: &'static str,
        help: &'static str,
        handler: Handler,
    ) -> Opt {
        Opt {
            names,
            negs: &[],
            hint,
            hint2: "",
            env: None,
            help,
            handler,
            pending: None,
        }
    }
    const fn env(self, env: &'static str) -> Opt {
        Opt {
            env: Some(env),
            ..self
        }
    }
    const fn pending(self, feature: &'static str) -> Opt {
        Opt {
            pending: Some(feature),
            ..self
        }
    }
    /// Every spelling, positive then negative.
    pub fn spellings(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.names.iter().chain(self.negs.iter()).copied()
    }
    /// The first `--` spelling, used as the option's name in sources and warnings.
    pub fn long_name(&self) -> &'static str {
        self.names
            .iter()
            .copied()
            .find(|n| n.starts_with("--"))
            .unwrap_or(self.names[0])
    }
    /// Whether the option takes no value.
    pub fn is_switch(&self) -> bool {
        matches!(self.handler, Handler::Flag(_) | Handler::Toggle(_))
    }
}

const fn flag(
    names: &'static [&'static str],
    help: &'static str,
    f: fn(&mut Parsed) -> Applied,
) -> Opt {
    Opt::new(names, "", help, Handler::Flag(f))
}
const fn toggle(
    names: &'static [&'static str],
    negs: &'static [&'static str],
    help: &'static str,
    f: fn(&mut Parsed, bool) -> Applied,
) -> Opt {
    Opt {
        negs,
        ..Opt::new(names, "", help, Handler::Toggle(f))
    }
}
const fn int(
    names: &'static [&'static str],
    hint: &'static str,
    help: &'static str,
    f: fn(&mut Parsed, i32) -> Applied,
) -> Opt {
    Opt::new(names, hint, help, Handler::Int(f))
}
const fn text(
    names: &'static [&'static str],
    hint: &'static str,
    help: &'static str,
    f: fn(&mut Parsed, &str) -> Applied,
) -> Opt {
    Opt::new(names, hint, help, Handler::Text(f))
}
const fn pair(
    names: &'static [&'static str],
    hint: &'static str,
    hint2: &'static str,
    help: &'static str,
    f: fn(&mut Parsed, &str, &str) -> Applied,
) -> Opt {
    Opt {
        hint2,
        ..Opt::new(names, hint, help, Handler::Pair(f))
    }
}

/// KV cache element types upstream accepts for `-ctk`/`-ctv`.
pub const KV_CACHE_TYPES: [&str; 9] = [
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
];

/// Upstream's device limit for per-device lists (`-ts`, `-fitt`).
const MAX_DEVICES: usize = 16;

fn kv_type(v: &str) -> Result<String, Refusal> {
    KV_CACHE_TYPES
        .iter()
        .find(|t| **t == v)
        .map(|t| t.to_string())
        .ok_or_else(|| format!("Unsupported cache type: {v}"))
}

fn gpu_layers(v: &str) -> Result<GpuLayers, Refusal> {
    Ok(match v {
        "auto" => GpuLayers::Auto,
        "all" => GpuLayers::All,
        _ => match stoi(v)? {
            -1 => GpuLayers::Auto,
            n if n < -1 => GpuLayers::All,
            n => GpuLayers::Count(n as u32),
        },
    })
}

/// Device names are checked against the real devices by the planner; here only what upstream
/// refuses without looking at hardware is refused (an empty name, or the host itself).
fn device_list(v: &str) -> Result<DeviceChoice, Refusal> {
    let names: Vec<&str> = v.split(',').collect();
    if names == ["none"] {
        return Ok(DeviceChoice::NoOffload);
    }
    for n in &names {
        if n.is_empty() || n.eq_ignore_ascii_case("cpu") {
            return Err(format!("invalid device: {n}"));
        }
    }
    Ok(DeviceChoice::Named(
        names.iter().map(|n| n.to_string()).collect(),
    ))
}

/// `pattern=BUFT,...`; buffer type names are checked against the real devices by the planner.
fn tensor_overrides(v: &str) -> Result<Vec<TensorOverride>, Refusal> {
    v.split(',')
        .map(|item| match item.split_once('=') {
            Some((pattern, buft)) if !buft.is_empty() => Ok(TensorOverride {
                pattern: pattern.to_string(),
                buffer_type: buft.to_string(),
            }),
            Some(_) => Err("unknown buffer type".to_string()),
            None => Err("invalid value".to_string()),
        })
        .collect()
}

fn per_device_list(v: &str) -> Result<Vec<&str>, Refusal> {
    let parts = split_list(v);
    if parts.len() >= MAX_DEVICES {
        return Err(format!(
            "got {} input configs, but system only has {MAX_DEVICES} devices",
            parts.len()
        ));
    }
    Ok(parts)
}

fn scaled_files(v: &str, format_hint: &str) -> Result<Vec<ScaledFile>, Refusal> {
    csv_row(v)
        .iter()
        .map(|item| {
            let parts: Vec<&str> = item.split(':').collect();
            match parts[..] {
                [path, scale] => Ok(ScaledFile {
                    path: path.into(),
                    scale: stof(scale)?,
                }),
                _ => Err(format!("{format_hint} format: FNAME:SCALE")),
            }
        })
        .collect()
}

fn unscaled_files(v: &str) -> Vec<ScaledFile> {
    csv_row(v)
        .into_iter()
        .map(|path| ScaledFile { path, scale: 1.0 })
        .collect()
}

fn cpu_mask(v: &str) -> Result<String, Refusal> {
    let digits = v.strip_prefix("0x").unwrap_or(v);
    if digits.chars().take(128).all(|c| c.is_ascii_hexdigit()) {
        Ok(v.to_string())
    } else {
        Err("invalid cpumask".into())
    }
}

fn cpu_range(v: &str) -> Result<String, Refusal> {
    const MAX_THREADS: u64 = 512;
    let (lo, hi) = v.split_once('-').ok_or("invalid range")?;
    for end in [lo, hi] {
        if !end.is_empty() && stoull(end, "stoull")? >= MAX_THREADS {
            return Err("invalid range".into());
        }
    }
    Ok(v.to_string())
}

fn priority(v: i32, lowest: i32) -> Result<i32, Refusal> {
    if (lowest..=3).contains(&v) {
        Ok(v)
    } else {
        Err("invalid value".into())
    }
}

fn non_negative(v: i32) -> Result<u32, Refusal> {
    u32::try_from(v).map_err(|_| "invalid value".into())
}

fn ngram_size(v: i32, letter: char) -> Result<i32, Refusal> {
    if (1..=1024).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "ngram size {letter} must be between 1 and 1024 inclusive"
        ))
    }
}

fn ngram_hits(v: i32) -> Result<i32, Refusal> {
    if v >= 1 {
        Ok(v)
    } else {
        Err("ngram min hits must be at least 1".into())
    }
}

fn ngram_bound(v: i32, which: &str) -> Result<i32, Refusal> {
    if (0..=1024).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "ngram {which} must be between 0 and 1024 inclusive"
        ))
    }
}

fn one_of(v: &str, allowed: &[&str]) -> Result<String, Refusal> {
    if allowed.contains(&v) {
        Ok(v.to_string())
    } else {
        Err("invalid value".into())
    }
}

fn finite(v: &str, what: &str) -> Result<f32, Refusal> {
    let x = stof(v)?;
    if x.is_finite() {
        Ok(x)
    } else {
        Err(format!("error: {what} must be finite\n"))
    }
}

/// One `--override-kv` item, parsed by the model's rules (the loader applies it).
fn kv_override(item: &str) -> Option<KvOverride> {
    KvOverride::parse(item).ok()
}

const SPEC_TYPES: [&str; 11] = [
    "none",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
];

fn place(v: &str) -> Result<Place, Refusal> {
    match v {
        "a" | "auto" => Ok(Place::Auto),
        "bp" => Ok(Place::BalancedPipeline),
        _ => v
            .split('+')
            .map(|c| c.parse::<u32>().map_err(|_| format!("invalid placement '{v}': expected a, bp, or card indices joined by + (e.g. 0+1)")))
            .collect::<Result<Vec<_>, _>>()
            .map(Place::Cards),
    }
}

fn card_budget(v: &str) -> Result<Vec<CardBudget>, Refusal> {
    v.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|entry| {
            let (device, size) = entry.split_once('=').ok_or_else(|| {
                format!("invalid card budget '{entry}': expected DEVICE=SIZE such as CUDA0=38G")
            })?;
            Ok(CardBudget {
                device: device.trim().to_string(),
                bytes: parse_size(size)?,
            })
        })
        .collect()
}

/// Marks a sampling parameter as chosen by the user.
fn user_sampling(p: &mut Parsed, name: &str) {
    p.config.sampling.user_set.insert(name.to_string());
}

/// A fill-in-the-middle model preset.
struct Preset {
    repo: &'static str,
    file: &'static str,
    port: i32,
}

fn apply_fim_preset(p: &mut Parsed, preset: Preset) -> Applied {
    let c = &mut p.config;
    c.model.hf_repo = preset.repo.into();
    c.model.hf_file = preset.file.into();
    c.serve.port = preset.port;
    c.context.ubatch = 1024;
    c.context.batch = 1024;
    c.context.ctx_size = 0;
    c.slots.cache_reuse = 256;
    Ok(())
}

fn apply_gpt_oss_preset(p: &mut Parsed, repo: &str, file: &str) -> Applied {
    let c = &mut p.config;
    c.model.hf_repo = repo.into();
    if !file.is_empty() {
        c.model.hf_file = file.into();
    }
    c.serve.port = 8013;
    c.context.ubatch = 2048;
    c.context.batch = 32768;
    c.slots.n_parallel = 2;
    c.context.ctx_size = 131072 * 2;
    c.sampling.temp = 1.0;
    c.sampling.top_p = 1.0;
    c.sampling.top_k = 0;
    c.sampling.min_p = 0.01;
    c.chat.jinja = true;
    Ok(())
}

fn apply_vision_preset(p: &mut Parsed, repo: &str) -> Applied {
    let c = &mut p.config;
    c.model.hf_repo = repo.into();
    c.serve.port = 8014;
    c.context.ctx_size = 0;
    c.chat.jinja = true;
    Ok(())
}

fn set_draft_spec_model(p: &mut Parsed) {
    p.config.speculative.draft_hf_repo = "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF".into();
    p.config.speculative.draft_hf_file = "qwen2.5-coder-0.5b-q8_0.gguf".into();
}

const CPU_AFFINITY: &str = "CPU affinity, priority and polling";
const SPECULATIVE: &str = "speculative decoding";
const MULTIMODAL: &str = "multimodal input";
const AGENT: &str = "built-in agent tools and MCP";
const ROUTER: &str = "router mode (several models)";
const EMBEDDING_GEMMA: &str = "the gemma-embedding architecture (EmbeddingGemma)";
const LORA: &str = "LoRA adapters";
const CONTROL_VECTORS: &str = "control vectors";
const STATIC_FILES: &str = "static files and the web UI";

static COMMON: &[Opt] = &[
    flag(&["-h", "--help", "--usage"], "show this help and exit", |p| {
        p.exit = Some(Exit::Help);
        Ok(())
    }),
    flag(&["--version"], "show the version and exit", |p| {
        p.exit = Some(Exit::Version);
        Ok(())
    }),
    flag(&["-cl", "--cache-list"], "list the models in the download cache and exit", |p| {
        p.exit = Some(Exit::CacheList);
        Ok(())
    }),
    flag(&["--completion-bash"], "print a bash completion script to source, and exit", |p| {
        p.exit = Some(Exit::CompletionBash);
        Ok(())
    }),
    int(&["-t", "--threads"], "N", "CPU threads for generation (default: -1, chosen from the CPU)", |p, v| {
        p.config.threads.generation.threads = if v <= 0 { hardware_threads() } else { v };
        Ok(())
    })
    .env("LLAMA_ARG_THREADS"),
    int(&["-tb", "--threads-batch"], "N", "CPU threads for prompt and batch processing (default: as --threads)", |p, v| {
        p.config.threads.batch.threads = if v <= 0 { hardware_threads() } else { v };
        Ok(())
    }),
    text(&["-C", "--cpu-mask"], "M", "CPU affinity as a hex mask of any length; adds to --cpu-range (default: \"\")", |p, v| {
        p.config.threads.generation.cpu_mask = cpu_mask(v)?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    text(&["-Cr", "--cpu-range"], "lo-hi", "CPU affinity as a range of CPU numbers; adds to --cpu-mask", |p, v| {
        p.config.threads.generation.cpu_range = cpu_range(v)?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    text(&["--cpu-strict"], "<0|1>", "pin threads strictly to the chosen CPUs (default: 0)\n", |p, v| {
        p.config.threads.generation.strict = stoull(v, "stoul")?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    int(&["--prio"], "N", "thread priority: -1 low, 0 normal, 1 medium, 2 high, 3 realtime (default: 0)\n", |p, v| {
        p.config.threads.generation.priority = priority(v, -1)?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    text(&["--poll"], "<0...100>", "how much to busy-wait for work, 0 = sleep (default: 50)\n", |p, v| {
        p.config.threads.generation.poll = stoull(v, "stoul")?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    text(&["-Cb", "--cpu-mask-batch"], "M", "hex CPU affinity mask for batch threads; adds to --cpu-range-batch (default: as --cpu-mask)", |p, v| {
        p.config.threads.batch.cpu_mask = cpu_mask(v)?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    text(&["-Crb", "--cpu-range-batch"], "lo-hi", "CPU number range for batch threads; adds to --cpu-mask-batch", |p, v| {
        p.config.threads.batch.cpu_range = cpu_range(v)?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    int(&["--cpu-strict-batch"], "<0|1>", "pin batch threads strictly (default: as --cpu-strict)", |p, v| {
        p.config.threads.batch.strict = v as i64 as u64;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    int(&["--prio-batch"], "N", "batch thread priority: 0 normal, 1 medium, 2 high, 3 realtime (default: 0)\n", |p, v| {
        p.config.threads.batch.priority = priority(v, 0)?;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    int(&["--poll-batch"], "<0|1>", "busy-wait for batch work (default: as --poll)", |p, v| {
        p.config.threads.batch.poll = v as i64 as u64;
        Ok(())
    })
    .pending(CPU_AFFINITY),
    int(&["-c", "--ctx-size"], "N", "context size in tokens; 0 takes the model's trained size (default: 0)", |p, v| {
        p.config.context.ctx_size = v;
        if v == 0 {
            // an explicit full context must not be shrunk by --fit
            p.placement.fit_ctx = p.sourced(u32::MAX);
        }
        Ok(())
    })
    .env("LLAMA_ARG_CTX_SIZE"),
    int(&["-n", "--predict", "--n-predict"], "N", "tokens to generate per request, -1 = no limit (default: -1)", |p, v| {
        p.config.slots.n_predict = v;
        Ok(())
    })
    .env("LLAMA_ARG_N_PREDICT"),
    int(&["-b", "--batch-size"], "N", "largest logical batch, in tokens (default: 2048)", |p, v| {
        p.config.context.batch = v;
        Ok(())
    })
    .env("LLAMA_ARG_BATCH"),
    int(&["-ub", "--ubatch-size"], "N", "largest physical batch, in tokens (default: 512)", |p, v| {
        p.config.context.ubatch = v;
        Ok(())
    })
    .env("LLAMA_ARG_UBATCH"),
    int(&["--keep"], "N", "prompt tokens kept when the context shifts, -1 = all (default: 0)", |p, v| {
        p.config.slots.keep = v;
        Ok(())
    }),
    flag(&["--swa-full"], "give sliding-window layers a full-size cache (default: false)", |p| {
        p.config.context.swa_full = true;
        Ok(())
    })
    .env("LLAMA_ARG_SWA_FULL"),
    text(&["-fa", "--flash-attn"], "[on|off|auto]", "Flash Attention: 'on', 'off' or 'auto' (default: 'auto')", |p, v| {
        p.config.context.flash_attn = parse_tristate(v, "--flash-attn")?;
        Ok(())
    })
    .env("LLAMA_ARG_FLASH_ATTN"),
    toggle(&["--perf"], &["--no-perf"], "record internal performance timings (default: false)", |p, v| {
        p.config.log.perf = v;
        Ok(())
    })
    .env("LLAMA_ARG_PERF")
    .pending("performance timings"),
    toggle(&["-e", "--escape"], &["--no-escape"], "expand escapes (\\n, \\r, \\t, \\', \\\", \\\\) in reverse prompts and DRY breakers (default: true)", |p, v| {
        p.config.context.escape = v;
        Ok(())
    }),
    text(&["--rope-scaling"], "{none,linear,yarn}", "RoPE scaling method; the model's, or linear, when unset", |p, v| {
        p.config.context.rope_scaling = one_of(v, &["none", "linear", "yarn"])?;
        Ok(())
    })
    .env("LLAMA_ARG_ROPE_SCALING_TYPE"),
    text(&["--rope-scale"], "N", "RoPE context scale: the context grows N times", |p, v| {
        p.config.context.rope_freq_scale = 1.0 / stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_ROPE_SCALE"),
    text(&["--rope-freq-base"], "N", "RoPE base frequency for NTK-aware scaling (default: the model's)", |p, v| {
        p.config.context.rope_freq_base = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_ROPE_FREQ_BASE"),
    text(&["--rope-freq-scale"], "N", "RoPE frequency scale: the context grows 1/N times", |p, v| {
        p.config.context.rope_freq_scale = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_ROPE_FREQ_SCALE"),
    int(&["--yarn-orig-ctx"], "N", "YaRN: the model's original context (default: 0 = its training context)", |p, v| {
        p.config.context.yarn_orig_ctx = v;
        Ok(())
    })
    .env("LLAMA_ARG_YARN_ORIG_CTX"),
    text(&["--yarn-ext-factor"], "N", "YaRN: extrapolation mix, 0.0 = interpolate only (default: -1.00)", |p, v| {
        p.config.context.yarn_ext_factor = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_YARN_EXT_FACTOR"),
    text(&["--yarn-attn-factor"], "N", "YaRN: attention magnitude scale (default: -1.00)", |p, v| {
        p.config.context.yarn_attn_factor = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_YARN_ATTN_FACTOR"),
    text(&["--yarn-beta-slow"], "N", "YaRN: high correction dimension, alpha (default: -1.00)", |p, v| {
        p.config.context.yarn_beta_slow = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_YARN_BETA_SLOW"),
    text(&["--yarn-beta-fast"], "N", "YaRN: low correction dimension, beta (default: -1.00)", |p, v| {
        p.config.context.yarn_beta_fast = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_YARN_BETA_FAST"),
    toggle(&["-kvo", "--kv-offload"], &["-nkvo", "--no-kv-offload"], "keep the KV cache on the devices (default: enabled)", |p, v| {
        p.placement.kv_offload = p.sourced(v);
        Ok(())
    })
    .env("LLAMA_ARG_KV_OFFLOAD"),
    toggle(&["--repack"], &["-nr", "--no-repack"], "repack weights into faster CPU layouts (default: enabled)", |p, v| {
        p.placement.repack = p.sourced(v);
        Ok(())
    })
    .env("LLAMA_ARG_REPACK"),
    flag(&["--no-host"], "skip the pinned host buffer so extra buffer types can be used", |p| {
        p.placement.no_host = p.sourced(true);
        Ok(())
    })
    .env("LLAMA_ARG_NO_HOST"),
    text(&["-ctk", "--cache-type-k"], "TYPE", "element type of the K cache\none of: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1\n(default: f16)", |p, v| {
        p.placement.cache_type_k = p.sourced(kv_type(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_CACHE_TYPE_K"),
    text(&["-ctv", "--cache-type-v"], "TYPE", "element type of the V cache\none of: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1\n(default: f16)", |p, v| {
        p.placement.cache_type_v = p.sourced(kv_type(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_CACHE_TYPE_V"),
    text(&["-dt", "--defrag-thold"], "N", "KV cache defragmentation threshold (DEPRECATED, has no effect)", |p, v| {
        p.config.context.defrag_thold = Some(v.to_string());
        p.warn("DEPRECATED: --defrag-thold is deprecated and no longer necessary to specify");
        Ok(())
    })
    .env("LLAMA_ARG_DEFRAG_THOLD"),
    text(&["--rpc"], "SERVERS", "RPC servers to offload to, comma-separated host:port (not in this build)", |_, _| {
        Err("RPC not supported in this build".into())
    })
    .env("LLAMA_ARG_RPC"),
    text(&["-lm", "--load-mode"], "MODE", "how model weights are read (default: auto)\n- auto: mmap unless a device cannot use it\n- none: plain reads\n- mmap: map the file into memory\n- mlock: read and lock in RAM\n- mmap+mlock: map and lock in RAM\n- dio: direct I/O where available\n", |p, v| {
        let mode = match v {
            "auto" => LoadMode::Auto,
            "none" => LoadMode::None,
            "mmap" => LoadMode::Mmap,
            "mlock" => LoadMode::Mlock,
            "mmap+mlock" => LoadMode::MmapMlock,
            "dio" => LoadMode::Dio,
            _ => return Err("invalid value".into()),
        };
        p.placement.load_mode = p.sourced(mode);
        Ok(())
    })
    .env("LLAMA_ARG_LOAD_MODE")
    .pending("load modes"),
    text(&["-lzm", "--lazy-mode"], "MODE", "read some large tensors (e.g. per-layer embeddings) from disk on demand (default: auto)\n- on: read their rows when needed (needs mmap)\n- auto: on for such tensors above 4 GiB\n- off: keep them resident", |p, v| {
        let mode = match v {
            "on" => LazyMode::On,
            "auto" => LazyMode::Auto,
            "off" => LazyMode::Off,
            _ => return Err("invalid value".into()),
        };
        p.placement.lazy_mode = p.sourced(mode);
        Ok(())
    })
    .env("LLAMA_ARG_LAZY_MODE")
    .pending("load modes"),
    text(&["--numa"], "TYPE", "NUMA strategy\n- distribute: spread threads over all nodes\n- isolate: stay on the starting node\n- numactl: follow numactl's CPU map\ndropping the page cache first helps", |p, v| {
        p.config.threads.numa = match v {
            "" | "distribute" => "distribute".into(),
            "isolate" | "numactl" => v.into(),
            _ => return Err("invalid value".into()),
        };
        Ok(())
    })
    .env("LLAMA_ARG_NUMA")
    .pending("NUMA strategies"),
    text(&["-dev", "--device"], "<dev1,dev2,..>", "devices to offload to, comma-separated; none = host only\n--list-devices shows them", |p, v| {
        p.placement.devices = p.sourced(device_list(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_DEVICE"),
    flag(&["--list-devices"], "list the devices and exit", |p| {
        p.exit = Some(Exit::ListDevices);
        Ok(())
    }),
    text(&["-ot", "--override-tensor"], "<tensor name pattern>=<buffer type>,...", "put tensors matching a pattern into the named buffer type", |p, v| {
        let mut all = p.placement.override_tensor.value.clone();
        all.extend(tensor_overrides(v)?);
        p.placement.override_tensor = p.sourced(all);
        Ok(())
    })
    .env("LLAMA_ARG_OVERRIDE_TENSOR"),
    flag(&["-cmoe", "--cpu-moe"], "keep every Mixture-of-Experts expert weight on the host", |p| {
        p.placement.cpu_moe = p.sourced(true);
        Ok(())
    })
    .env("LLAMA_ARG_CPU_MOE"),
    int(&["-ncmoe", "--n-cpu-moe"], "N", "keep the expert weights of the first N layers on the host", |p, v| {
        p.placement.n_cpu_moe = p.sourced(non_negative(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_N_CPU_MOE"),
    int(&["-ncffn", "--n-cpu-ffn"], "N", "keep the dense FFN weights of the first N layers on the host\n(dense models; experts use --n-cpu-moe)", |p, v| {
        p.placement.n_cpu_ffn = p.sourced(non_negative(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_N_CPU_FFN"),
    text(&["-ngl", "--gpu-layers", "--n-gpu-layers"], "N", "most layers to put on the devices: a number, 'auto' or 'all' (default: auto)", |p, v| {
        p.placement.n_gpu_layers = p.sourced(gpu_layers(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_N_GPU_LAYERS"),
    text(&["-sm", "--split-mode"], "{none,layer,row,tensor}", "how to spread the model over several devices:\n- none: one device\n- layer (default): whole layers and their KV per device, pipelined\n- row: weight rows across devices, in parallel\n- tensor: weights and KV across devices, in parallel (EXPERIMENTAL)", |p, v| {
        let mode = match v {
            "none" => SplitMode::None,
            "layer" => SplitMode::Layer,
            "row" => SplitMode::Row,
            "tensor" => SplitMode::Tensor,
            _ => return Err("invalid value".into()),
        };
        p.placement.split_mode = p.sourced(mode);
        Ok(())
    })
    .env("LLAMA_ARG_SPLIT_MODE"),
    text(&["-ts", "--tensor-split"], "N0,N1,N2,...", "share of the model per device, as proportions separated by , or / (e.g. 3,1)", |p, v| {
        let shares = per_device_list(v)?.into_iter().map(stof).collect::<Result<Vec<_>, _>>()?;
        p.placement.tensor_split = p.sourced(shares);
        Ok(())
    })
    .env("LLAMA_ARG_TENSOR_SPLIT"),
    int(&["-mg", "--main-gpu"], "INDEX", "device for the whole model with split-mode none, or for intermediates and KV with split-mode row (default: 0)", |p, v| {
        p.placement.main_gpu = p.sourced(v);
        Ok(())
    })
    .env("LLAMA_ARG_MAIN_GPU"),
    text(&["-fit", "--fit"], "[on|off]", "shrink options left unset until the model fits in device memory: 'on' or 'off' (default: 'on')", |p, v| {
        let on = if is_truthy(v) {
            true
        } else if is_falsey(v) {
            false
        } else {
            return Err(format!("error: unknown value for --fit: '{v}'\n"));
        };
        p.placement.fit = p.sourced(on);
        Ok(())
    })
    .env("LLAMA_ARG_FIT"),
    text(&["-fitt", "--fit-target"], "MiB0,MiB1,MiB2,...", "memory --fit leaves free on each device, MiB, comma-separated; one value applies to all devices (default: 1024)", |p, v| {
        let mib = per_device_list(v)?
            .into_iter()
            .map(|x| stoull(x, "stoull"))
            .collect::<Result<Vec<_>, _>>()?;
        p.placement.fit_target_mib = p.sourced(mib);
        Ok(())
    })
    .env("LLAMA_ARG_FIT_TARGET"),
    int(&["-fitc", "--fit-ctx"], "N", "smallest context --fit may choose (default: 4096)", |p, v| {
        p.placement.fit_ctx = p.sourced(v as u32);
        Ok(())
    })
    .env("LLAMA_ARG_FIT_CTX"),
    flag(&["--check-tensors"], "check tensor data for invalid values while loading (default: false)", |p| {
        p.config.model.check_tensors = true;
        Ok(())
    })
    .pending("tensor data checks"),
    text(&["--override-kv"], "KEY=TYPE:VALUE,...", "replace model metadata values, comma-separated; TYPE is int, float, bool or str\ne.g. --override-kv tokenizer.ggml.add_bos_token=bool:false", |p, v| {
        for item in csv_row(v) {
            let kv = kv_override(&item).ok_or_else(|| format!("error: Invalid type for KV override: {item}\n"))?;
            p.config.model.override_kv.push(kv);
        }
        Ok(())
    }),
    toggle(&["--op-offload"], &["--no-op-offload"], "run host-resident tensor operations on a device (default: true)", |p, v| {
        p.placement.op_offload = p.sourced(v);
        Ok(())
    }),
    text(&["--lora"], "FNAME", "LoRA adapter file; comma-separated for several", |p, v| {
        p.config.adapters.lora.extend(unscaled_files(v));
        Ok(())
    })
    .pending(LORA),
    text(&["--lora-scaled"], "FNAME:SCALE,...", "LoRA adapter files with a scale each (FNAME:SCALE,...)\ncomma-separated", |p, v| {
        p.config.adapters.lora.extend(scaled_files(v, "lora-scaled")?);
        Ok(())
    })
    .pending(LORA),
    text(&["--control-vector"], "FNAME", "control vector file\ncomma-separated for several", |p, v| {
        p.config.adapters.control_vectors.extend(unscaled_files(v));
        Ok(())
    })
    .pending(CONTROL_VECTORS),
    text(&["--control-vector-scaled"], "FNAME:SCALE,...", "control vector files with a scale each\ncomma-separated (FNAME:SCALE,...)", |p, v| {
        p.config.adapters.control_vectors.extend(scaled_files(v, "control-vector-scaled")?);
        Ok(())
    })
    .pending(CONTROL_VECTORS),
    pair(&["--control-vector-layer-range"], "START", "END", "first and last layer (inclusive) the control vectors act on", |p, a, b| {
        p.config.adapters.control_vector_layers = Some((stoi(a)?, stoi(b)?));
        Ok(())
    })
    .pending(CONTROL_VECTORS),
    text(&["-m", "--model"], "FNAME", "model file to load", |p, v| {
        p.config.model.path = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MODEL"),
    text(&["-mu", "--model-url"], "MODEL_URL", "URL to download the model from (default: unused)", |p, v| {
        p.config.model.url = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MODEL_URL"),
    text(&["-dr", "--docker-repo"], "[<repo>/]<model>[:quant]", "model from Docker Hub; repo defaults to ai/, quant to :latest\ne.g. gemma3\n(default: unused)", |p, v| {
        p.config.model.docker_repo = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_DOCKER_REPO")
    .pending("Docker Hub models"),
    text(&["-hf", "-hfr", "--hf-repo"], "<user>/<model>[:quant]", "model from a Hugging Face repository; quant is case-insensitive, Q4_K_M by default, else the repository's first file\nits mmproj comes too unless --no-mmproj\ne.g. ggml-org/GLM-4.7-Flash-GGUF:Q4_K_M\n(default: unused)", |p, v| {
        p.config.model.hf_repo = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_HF_REPO"),
    text(&["-hff", "--hf-file"], "FILE", "file in the --hf-repo repository; overrides its quant (default: unused)", |p, v| {
        p.config.model.hf_file = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_HF_FILE"),
    text(&["-hft", "--hf-token"], "TOKEN", "Hugging Face access token (default: the HF_TOKEN variable)", |p, v| {
        p.config.model.hf_token = v.into();
        Ok(())
    })
    .env("HF_TOKEN"),
    flag(&["--log-disable"], "turn logging off", |p| {
        p.config.log.disable = true;
        Ok(())
    }),
    text(&["--log-file"], "FNAME", "also write the log to this file", |p, v| {
        p.config.log.file = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_LOG_FILE")
    .pending("log files"),
    toggle(&["--log-jsonl"], &["--no-log-jsonl"], "log one JSON object per line to stdout, without colours (default: disabled)", |p, v| {
        p.config.log.jsonl = v;
        Ok(())
    })
    .env("LLAMA_ARG_LOG_JSONL")
    .pending("JSONL logs"),
    text(&["--log-colors"], "[on|off|auto]", "coloured log: 'on', 'off' or 'auto' (default: 'auto')\n'auto' colours a terminal only", |p, v| {
        p.config.log.colors = parse_tristate(v, "--log-colors")?;
        Ok(())
    })
    .env("LLAMA_ARG_LOG_COLORS")
    .pending("log colours and timestamps"),
    flag(&["-v", "--verbose", "--log-verbose"], "log everything (verbosity without limit), for debugging", |p| {
        p.config.log.verbosity = i32::MAX;
        Ok(())
    }),
    flag(&["--offline"], "use only the download cache, never the network", |p| {
        p.config.model.offline = true;
        Ok(())
    })
    .env("LLAMA_ARG_OFFLINE"),
    int(&["-lv", "--verbosity", "--log-verbosity"], "N", "log only messages at or below this level:\n - 0: output\n - 1: errors\n - 2: warnings\n - 3: info\n - 4: trace\n - 5: debug\n(default: 3)\n", |p, v| {
        p.config.log.verbosity = v;
        Ok(())
    })
    .env("LLAMA_ARG_LOG_VERBOSITY"),
    toggle(&["--log-prefix"], &["--no-log-prefix"], "prefix log lines with their level", |p, v| {
        p.config.log.prefix = v;
        Ok(())
    })
    .env("LLAMA_ARG_LOG_PREFIX"),
    toggle(&["--log-timestamps"], &["--no-log-timestamps"], "prefix log lines with a timestamp", |p, v| {
        p.config.log.timestamps = v;
        Ok(())
    })
    .env("LLAMA_ARG_LOG_TIMESTAMPS")
    .pending("log colours and timestamps"),
    text(&["--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"], "TYPE", "element type of the draft model's K cache\none of: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1\n(default: f16)", |p, v| {
        p.placement.draft.cache_type_k = p.sourced(kv_type(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K")
    .pending(SPECULATIVE),
    text(&["--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"], "TYPE", "element type of the draft model's V cache\none of: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1\n(default: f16)", |p, v| {
        p.placement.draft.cache_type_v = p.sourced(kv_type(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V")
    .pending(SPECULATIVE),
];

fn hardware_threads() -> i32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i32)
}

static SAMPLING: &[Opt] = &[
    text(&["--samplers"], "SAMPLERS", "samplers to apply, in order, separated by ';'\n(default: penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)", |p, v| {
        let mut chosen = Vec::new();
        for name in v.split(';') {
            match SamplerType::from_name(name) {
                Some(s) => chosen.push(s.name().to_string()),
                None => p.warn(&format!("common_sampler_types_from_names: unable to match sampler by name '{}'", name.to_ascii_lowercase())),
            }
        }
        p.config.sampling.samplers = chosen;
        user_sampling(p, "samplers");
        Ok(())
    }),
    text(&["-s", "--seed"], "SEED", "random seed; -1 picks a new one each time (default: -1)", |p, v| {
        p.config.sampling.seed = stoull(v, "stoul")? as u32;
        Ok(())
    }),
    text(&["--sampler-seq", "--sampling-seq"], "SEQUENCE", "samplers as one letter each (default: edskypmxt)", |p, v| {
        let mut chosen = Vec::new();
        for c in v.chars() {
            match SamplerType::from_letter(c) {
                Some(s) => chosen.push(s.name().to_string()),
                None => p.warn(&format!("common_sampler_types_from_chars: unable to match sampler by char '{c}'")),
            }
        }
        p.config.sampling.samplers = chosen;
        Ok(())
    }),
    flag(&["--ignore-eos"], "keep generating past the end-of-stream token (as if its logit bias were -inf)", |p| {
        p.config.sampling.ignore_eos = true;
        Ok(())
    }),
    text(&["--temp", "--temperature"], "N", "temperature (default: 0.80)", |p, v| {
        p.config.sampling.temp = stof(v)?.max(0.0);
        user_sampling(p, "temp");
        Ok(())
    })
    .env("LLAMA_ARG_TEMPERATURE"),
    int(&["--top-k"], "N", "top-k sampling, 0 = off (default: 40)", |p, v| {
        p.config.sampling.top_k = v;
        user_sampling(p, "top_k");
        Ok(())
    })
    .env("LLAMA_ARG_TOP_K"),
    text(&["--top-p"], "N", "top-p (nucleus) sampling, 1.0 = off (default: 0.95)", |p, v| {
        p.config.sampling.top_p = stof(v)?;
        user_sampling(p, "top_p");
        Ok(())
    })
    .env("LLAMA_ARG_TOP_P"),
    text(&["--min-p"], "N", "min-p sampling, 0.0 = off (default: 0.05)", |p, v| {
        p.config.sampling.min_p = stof(v)?;
        user_sampling(p, "min_p");
        Ok(())
    })
    .env("LLAMA_ARG_MIN_P"),
    text(&["--top-nsigma", "--top-n-sigma"], "N", "top-n-sigma sampling, -1.0 = off (default: -1.00)", |p, v| {
        p.config.sampling.top_n_sigma = stof(v)?;
        Ok(())
    }),
    text(&["--xtc-probability"], "N", "XTC probability, 0.0 = off (default: 0.00)", |p, v| {
        p.config.sampling.xtc_probability = stof(v)?;
        user_sampling(p, "xtc_probability");
        Ok(())
    }),
    text(&["--xtc-threshold"], "N", "XTC threshold, 1.0 = off (default: 0.10)", |p, v| {
        p.config.sampling.xtc_threshold = stof(v)?;
        user_sampling(p, "xtc_threshold");
        Ok(())
    }),
    text(&["--typical", "--typical-p"], "N", "locally typical sampling p, 1.0 = off (default: 1.00)", |p, v| {
        p.config.sampling.typical_p = stof(v)?;
        Ok(())
    }),
    int(&["--repeat-last-n"], "N", "how many recent tokens the penalties look at, 0 = off (default: 64)", |p, v| {
        if v < 0 {
            return Err(format!("error: invalid repeat-last-n = {v}\n"));
        }
        let s = &mut p.config.sampling;
        s.repeat_last_n = v;
        s.n_prev = s.n_prev.max(v);
        user_sampling(p, "repeat_last_n");
        Ok(())
    }),
    text(&["--repeat-penalty"], "N", "penalty for repeated tokens, 1.0 = off (default: 1.00)", |p, v| {
        let x = stof(v)?;
        if !x.is_finite() || x <= 0.0 || !(1.0 / x).is_finite() {
            return Err("error: repeat-penalty must be finite and greater than 0\n".into());
        }
        p.config.sampling.repeat_penalty = x;
        user_sampling(p, "repeat_penalty");
        Ok(())
    })
    .env("LLAMA_ARG_REPEAT_PENALTY"),
    text(&["--presence-penalty"], "N", "presence penalty, 0.0 = off (default: 0.00)", |p, v| {
        p.config.sampling.presence_penalty = finite(v, "presence-penalty")?;
        Ok(())
    })
    .env("LLAMA_ARG_PRESENCE_PENALTY"),
    text(&["--frequency-penalty"], "N", "frequency penalty, 0.0 = off (default: 0.00)", |p, v| {
        p.config.sampling.frequency_penalty = finite(v, "frequency-penalty")?;
        Ok(())
    })
    .env("LLAMA_ARG_FREQUENCY_PENALTY"),
    text(&["--dry-multiplier"], "N", "DRY multiplier, 0.0 = off (default: 0.00)", |p, v| {
        p.config.sampling.dry_multiplier = stof(v)?;
        Ok(())
    }),
    text(&["--dry-base"], "N", "DRY base; values below 1.0 are ignored (default: 1.75)", |p, v| {
        let x = stof(v)?;
        if x >= 1.0 {
            p.config.sampling.dry_base = x;
        }
        Ok(())
    }),
    int(&["--dry-allowed-length"], "N", "DRY: repetitions up to this length go unpenalised (default: 2)", |p, v| {
        p.config.sampling.dry_allowed_length = v;
        Ok(())
    }),
    int(&["--dry-penalty-last-n"], "N", "DRY: how many recent tokens to scan, 0 = off (default: 64)", |p, v| {
        if v < 0 {
            return Err(format!("error: invalid dry-penalty-last-n = {v}\n"));
        }
        p.config.sampling.dry_penalty_last_n = v;
        Ok(())
    }),
    text(&["--dry-sequence-breaker"], "STRING", "add a DRY sequence breaker; the first use drops the defaults ('\\n', ':', '\"', '*'), \"none\" leaves no breakers\n", |p, v| {
        if !p.dry_breakers_given {
            p.config.sampling.dry_sequence_breakers.clear();
            p.dry_breakers_given = true;
        }
        if v == "none" {
            p.config.sampling.dry_sequence_breakers.clear();
        } else {
            p.config.sampling.dry_sequence_breakers.push(v.into());
        }
        Ok(())
    }),
    text(&["--adaptive-target"], "N", "adaptive-p: aim for tokens of about this probability, 0.0 to 1.0; negative = off (default: -1.00)", |p, v| {
        p.config.sampling.adaptive_target = stof(v)?;
        Ok(())
    }),
    text(&["--adaptive-decay"], "N", "adaptive-p: how slowly the target adapts, 0.0 (fast) to 0.99 (steady) (default: 0.90)", |p, v| {
        p.config.sampling.adaptive_decay = stof(v)?;
        Ok(())
    }),
    text(&["--dynatemp-range"], "N", "dynamic temperature range, 0.0 = off (default: 0.00)", |p, v| {
        p.config.sampling.dynatemp_range = stof(v)?;
        Ok(())
    }),
    text(&["--dynatemp-exp"], "N", "dynamic temperature exponent (default: 1.00)", |p, v| {
        p.config.sampling.dynatemp_exponent = stof(v)?;
        Ok(())
    }),
    int(&["--mirostat"], "N", "Mirostat sampling; replaces top-k, top-p and typical\n(default: 0; 0 = off, 1 = Mirostat, 2 = Mirostat 2.0)", |p, v| {
        p.config.sampling.mirostat = v;
        user_sampling(p, "mirostat");
        Ok(())
    }),
    text(&["--mirostat-lr"], "N", "Mirostat learning rate, eta (default: 0.10)", |p, v| {
        p.config.sampling.mirostat_lr = stof(v)?;
        user_sampling(p, "mirostat_eta");
        Ok(())
    }),
    text(&["--mirostat-ent"], "N", "Mirostat target entropy, tau (default: 5.00)", |p, v| {
        p.config.sampling.mirostat_ent = stof(v)?;
        user_sampling(p, "mirostat_tau");
        Ok(())
    }),
    text(&["-l", "--logit-bias"], "TOKEN_ID(+/-)BIAS", "raise or lower one token's likelihood,\ne.g. `--logit-bias 15043+1` makes token 15043 likelier,\n`--logit-bias 15043-1` less likely", |p, v| {
        p.config.sampling.logit_bias.push(logit_bias(v).ok_or("invalid input format")?);
        Ok(())
    }),
    text(&["--grammar"], "GRAMMAR", "GBNF grammar that generations must follow", |p, v| {
        p.config.sampling.grammar = Some(Grammar::Gbnf(v.into()));
        Ok(())
    }),
    text(&["--grammar-file"], "FNAME", "file holding a GBNF grammar", |p, v| {
        p.config.sampling.grammar = Some(Grammar::Gbnf(read_text_file(v)?));
        Ok(())
    }),
    text(&["-j", "--json-schema"], "SCHEMA", "JSON schema that generations must follow, e.g. `{\"type\": \"object\"}`", |p, v| {
        p.config.sampling.grammar = Some(Grammar::JsonSchema(schema_grammar(v)?));
        Ok(())
    }),
    text(&["-jf", "--json-schema-file"], "FILE", "file holding a JSON schema that generations must follow", |p, v| {
        p.config.sampling.grammar = Some(Grammar::JsonSchema(schema_grammar(&read_text_file(v)?)?));
        Ok(())
    }),
    flag(&["-bs", "--backend-sampling"], "sample on the device (experimental) (default: disabled)", |p| {
        p.config.sampling.backend_sampling = true;
        Ok(())
    })
    .env("LLAMA_ARG_BACKEND_SAMPLING")
    .pending("device-side sampling"),
];

/// `TOKEN(+|-)BIAS`, blanks allowed between the parts.
fn logit_bias(v: &str) -> Option<(i32, f32)> {
    let t = v.trim_start();
    let digits_end = t
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(t.len(), |(i, _)| i);
    let token: i32 = t[..digits_end].parse().ok()?;
    let rest = t[digits_end..].trim_start();
    let sign = rest.chars().next()?;
    let magnitude = stof(&rest[1..]).ok()?;
    match sign {
        '+' => Some((token, magnitude)),
        '-' => Some((token, -magnitude)),
        _ => None,
    }
}

static SPECULATIVE_OPTS: &[Opt] = &[
    text(&["--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"], "<user>/<model>[:quant]", "draft model from a Hugging Face repository, like --hf-repo (default: unused)", |p, v| {
        p.config.speculative.draft_hf_repo = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_HF_REPO")
    .pending(SPECULATIVE),
    int(&["--spec-draft-threads", "-td", "--threads-draft"], "N", "draft model threads for generation (default: as --threads)", |p, v| {
        p.config.speculative.draft_threads.threads = if v <= 0 { hardware_threads() } else { v };
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"], "N", "draft model threads for batches (default: as --threads-draft)", |p, v| {
        p.config.speculative.draft_threads_batch.threads = if v <= 0 { hardware_threads() } else { v };
        Ok(())
    })
    .pending(SPECULATIVE),
    text(&["--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"], "M", "hex CPU affinity mask for the draft model; adds to --cpu-range-draft (default: as --cpu-mask)", |p, v| {
        p.config.speculative.draft_threads.cpu_mask = cpu_mask(v)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    text(&["--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"], "lo-hi", "CPU number range for the draft model; adds to --cpu-mask-draft", |p, v| {
        p.config.speculative.draft_threads.cpu_range = cpu_range(v)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-draft-cpu-strict", "--cpu-strict-draft"], "<0|1>", "pin draft model threads strictly (default: as --cpu-strict)", |p, v| {
        p.config.speculative.draft_threads.strict = v as i64 as u64;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-draft-prio", "--prio-draft"], "N", "draft thread priority: 0 normal, 1 medium, 2 high, 3 realtime (default: 0)\n", |p, v| {
        p.config.speculative.draft_threads.priority = priority(v, 0)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-draft-poll", "--poll-draft"], "<0|1>", "busy-wait for draft model work (default: as --poll)", |p, v| {
        p.config.speculative.draft_threads.poll = v as i64 as u64;
        Ok(())
    })
    .pending(SPECULATIVE),
    text(&["--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"], "M", "hex CPU affinity mask for draft batch threads (default: as --cpu-mask)", |p, v| {
        p.config.speculative.draft_threads_batch.cpu_mask = cpu_mask(v)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"], "<0|1>", "pin draft batch threads strictly (default: as --cpu-strict-draft)", |p, v| {
        p.config.speculative.draft_threads_batch.strict = v as i64 as u64;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-draft-prio-batch", "--prio-batch-draft"], "N", "draft batch thread priority: 0 normal, 1 medium, 2 high, 3 realtime (default: 0)\n", |p, v| {
        p.config.speculative.draft_threads_batch.priority = priority(v, 0)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-draft-poll-batch", "--poll-batch-draft"], "<0|1>", "busy-wait for draft batch work (default: as --poll-draft)", |p, v| {
        p.config.speculative.draft_threads_batch.poll = v as i64 as u64;
        Ok(())
    })
    .pending(SPECULATIVE),
    text(&["--spec-draft-override-tensor", "-otd", "--override-tensor-draft"], "<tensor name pattern>=<buffer type>,...", "like --override-tensor, for the draft model", |p, v| {
        let mut all = p.placement.draft.override_tensor.value.clone();
        all.extend(tensor_overrides(v)?);
        p.placement.draft.override_tensor = p.sourced(all);
        Ok(())
    })
    .pending(SPECULATIVE),
    flag(&["--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"], "keep every expert weight of the draft model on the host", |p| {
        p.placement.draft.cpu_moe = p.sourced(true);
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_CPU_MOE")
    .pending(SPECULATIVE),
    int(&["--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"], "N", "keep the draft model's expert weights of the first N layers on the host", |p, v| {
        p.placement.draft.n_cpu_moe = p.sourced(non_negative(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE")
    .pending(SPECULATIVE),
    int(&["--spec-draft-n-max"], "N", "most tokens to draft per step (default: 3)", |p, v| {
        p.config.speculative.n_max = non_negative(v)? as i32;
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_N_MAX")
    .pending(SPECULATIVE),
    int(&["--spec-draft-n-min"], "N", "fewest draft tokens worth using (default: 0)", |p, v| {
        p.config.speculative.n_min = v;
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_N_MIN")
    .pending(SPECULATIVE),
    text(&["--spec-synth-len"], "L", "benchmarking only: mean synthetic acceptance length, target token included", |p, v| {
        let len = strict_f64(v)?;
        if len == -1.0 {
            return Err("invalid value".into());
        }
        p.config.speculative.synth_len = len;
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_SYNTH_LEN")
    .pending(SPECULATIVE),
    text(&["--spec-synth-rates"], "P0,P1,...", "benchmarking only: synthetic acceptance probability per position, comma-separated", |p, v| {
        p.config.speculative.synth_rates = v.split(',').map(strict_f64).collect::<Result<_, _>>()?;
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_SYNTH_RATES")
    .pending(SPECULATIVE),
    text(&["--spec-draft-p-split", "--draft-p-split"], "P", "speculative split probability (default: 0.10)", |p, v| {
        p.config.speculative.p_split = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_P_SPLIT")
    .pending(SPECULATIVE),
    text(&["--spec-draft-p-min", "--draft-p-min"], "P", "least draft probability to keep drafting, greedy (default: 0.00)", |p, v| {
        p.config.speculative.p_min = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_P_MIN")
    .pending(SPECULATIVE),
    toggle(&["--spec-draft-backend-sampling"], &["--no-spec-draft-backend-sampling"], "sample the draft on the device (default: enabled)", |p, v| {
        p.config.speculative.backend_sampling = v;
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING")
    .pending(SPECULATIVE),
    text(&["--spec-draft-sampling"], "{greedy,probabilistic}", "greedy takes the draft's argmax; probabilistic samples it and verifies by rejection sampling (default: greedy)", |p, v| {
        p.config.speculative.probabilistic = match v {
            "greedy" => false,
            "probabilistic" => true,
            _ => return Err("invalid value, must be one of: greedy, probabilistic".into()),
        };
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_SAMPLING")
    .pending(SPECULATIVE),
    text(&["--spec-draft-device", "-devd", "--device-draft"], "<dev1,dev2,..>", "devices for the draft model, comma-separated; none = host only (default: as --device)\n--list-devices shows them", |p, v| {
        p.placement.draft.devices = p.sourced(device_list(v)?);
        Ok(())
    })
    .pending(SPECULATIVE),
    text(&["--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"], "N", "most draft model layers on the devices: a number, 'auto' or 'all' (default: auto)", |p, v| {
        p.placement.draft.n_gpu_layers = p.sourced(gpu_layers(v)?);
        Ok(())
    })
    .env("LLAMA_ARG_N_GPU_LAYERS_DRAFT")
    .pending(SPECULATIVE),
    text(&["--spec-draft-model", "-md", "--model-draft"], "FNAME", "draft model file for speculative decoding (default: unused)", |p, v| {
        p.config.speculative.draft_model = v.into();
        p.config.speculative.draft_hf_file = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_DRAFT_MODEL")
    .pending(SPECULATIVE),
    text(&["--spec-type"], "none,draft-simple,draft-eagle3,draft-mtp,draft-dflash,draft-dspark,ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache", "speculative methods to use, comma-separated (default: none)\n", |p, v| {
        let names: Vec<&str> = v.split(',').collect();
        if let Some(bad) = names.iter().find(|n| !SPEC_TYPES.contains(n)) {
            return Err(format!("unknown speculative type: {bad}"));
        }
        if names.contains(&"none") {
            p.config.speculative.types.clear();
        } else {
            p.config.speculative.types.extend(names.iter().map(|n| n.to_string()));
        }
        Ok(())
    })
    .env("LLAMA_ARG_SPEC_TYPE")
    .pending(SPECULATIVE),
    int(&["--spec-ngram-mod-n-min"], "N", "fewest n-gram tokens worth drafting (default: 48)", |p, v| {
        p.config.speculative.ngram_mod_n_min = ngram_bound(v, "n-min")?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-mod-n-max"], "N", "most n-gram tokens to draft (default: 64)", |p, v| {
        p.config.speculative.ngram_mod_n_max = ngram_bound(v, "n-max")?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-mod-n-match"], "N", "ngram-mod lookup length (default: 24)", |p, v| {
        p.config.speculative.ngram_mod_n_match = ngram_size(v, 'N')?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-simple-size-n"], "N", "ngram-simple: lookup n-gram length (default: 12)", |p, v| {
        p.config.speculative.ngram_simple.size_n = ngram_size(v, 'N')?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-simple-size-m"], "N", "ngram-simple: drafted m-gram length (default: 48)", |p, v| {
        p.config.speculative.ngram_simple.size_m = ngram_size(v, 'M')?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-simple-min-hits"], "N", "ngram-simple: hits needed before drafting (default: 1)", |p, v| {
        p.config.speculative.ngram_simple.min_hits = ngram_hits(v)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-map-k-size-n"], "N", "ngram-map-k: lookup n-gram length (default: 12)", |p, v| {
        p.config.speculative.ngram_map_k.size_n = ngram_size(v, 'N')?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-map-k-size-m"], "N", "ngram-map-k: drafted m-gram length (default: 48)", |p, v| {
        p.config.speculative.ngram_map_k.size_m = ngram_size(v, 'M')?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-map-k-min-hits"], "N", "ngram-map-k: hits needed before drafting (default: 1)", |p, v| {
        p.config.speculative.ngram_map_k.min_hits = ngram_hits(v)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-map-k4v-size-n"], "N", "ngram-map-k4v: lookup n-gram length (default: 12)", |p, v| {
        p.config.speculative.ngram_map_k4v.size_n = ngram_size(v, 'N')?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-map-k4v-size-m"], "N", "ngram-map-k4v: drafted m-gram length (default: 48)", |p, v| {
        p.config.speculative.ngram_map_k4v.size_m = ngram_size(v, 'M')?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--spec-ngram-map-k4v-min-hits"], "N", "ngram-map-k4v: hits needed before drafting (default: 1)", |p, v| {
        p.config.speculative.ngram_map_k4v.min_hits = ngram_hits(v)?;
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--draft", "--draft-n", "--draft-max"], "N", "retired: use --spec-draft-n-max or --spec-ngram-mod-n-max", |_, _| {
        Err("the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max".into())
    })
    .env("LLAMA_ARG_DRAFT_MAX"),
    int(&["--draft-min", "--draft-n-min"], "N", "retired: use --spec-draft-n-min or --spec-ngram-mod-n-min", |_, _| {
        Err("the argument has been removed. use --spec-draft-n-min or --spec-ngram-mod-n-min".into())
    })
    .env("LLAMA_ARG_DRAFT_MIN"),
    int(&["--spec-ngram-size-n"], "N", "retired: use the --spec-ngram-*-size-n of the method, or --spec-ngram-mod-n-match", |_, _| {
        Err("the argument has been removed. use the respective --spec-ngram-*-size-n".into())
    }),
    int(&["--spec-ngram-size-m"], "N", "retired: use the --spec-ngram-*-size-m of the method", |_, _| {
        Err("the argument has been removed. use the respective --spec-ngram-*-size-m".into())
    }),
    int(&["--spec-ngram-min-hits"], "N", "retired: use the --spec-ngram-*-min-hits of the method", |_, _| {
        Err("the argument has been removed. use the respective --spec-ngram-*-min-hits".into())
    }),
];

static SERVER: &[Opt] = &[
    text(&["-lcs", "--lookup-cache-static"], "FNAME", "static lookup cache for lookup decoding (never updated)", |p, v| {
        p.config.slots.lookup_cache_static = v.into();
        Ok(())
    })
    .pending(SPECULATIVE),
    text(&["-lcd", "--lookup-cache-dynamic"], "FNAME", "dynamic lookup cache for lookup decoding (updated while generating)", |p, v| {
        p.config.slots.lookup_cache_dynamic = v.into();
        Ok(())
    })
    .pending(SPECULATIVE),
    int(&["--kv-unified-per-slot"], "N", "context limit per slot (default: unset)\nwithout -c, the shared KV pool holds n_parallel*N tokens", |p, v| {
        p.config.context.kv_unified_per_slot = v;
        Ok(())
    })
    .env("LLAMA_ARG_KV_UNIFIED_PER_SLOT"),
    int(&["-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"], "N", "most context checkpoints kept per slot (default: 32)", |p, v| {
        p.config.slots.ctx_checkpoints = v;
        Ok(())
    })
    .env("LLAMA_ARG_CTX_CHECKPOINTS"),
    int(&["-cms", "--checkpoint-min-step"], "N", "least distance between context checkpoints, tokens, 0 = any (default: 8192)", |p, v| {
        if v < 0 {
            return Err("checkpoint-min-step must be non-negative".into());
        }
        p.config.slots.checkpoint_min_step = v;
        Ok(())
    })
    .env("LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"),
    int(&["-cram", "--cache-ram"], "N", "prompt cache size limit, MiB; -1 = none, 0 = no cache (default: 8192)", |p, v| {
        p.config.slots.cache_ram_mib = v;
        Ok(())
    })
    .env("LLAMA_ARG_CACHE_RAM"),
    toggle(&["-kvu", "--kv-unified"], &["-no-kvu", "--no-kv-unified"], "one KV buffer shared by all slots (default: on when the slot count is auto)", |p, v| {
        p.config.context.kv_unified = Some(v);
        Ok(())
    })
    .env("LLAMA_ARG_KV_UNIFIED"),
    toggle(&["--cache-idle-slots"], &["--no-cache-idle-slots"], "move idle slots into the prompt cache when a task starts (default: enabled, needs cache-ram)", |p, v| {
        p.config.slots.cache_idle_slots = v;
        Ok(())
    })
    .env("LLAMA_ARG_CACHE_IDLE_SLOTS"),
    toggle(&["--context-shift"], &["--no-context-shift"], "shift the context when an endless generation fills it (default: disabled)", |p, v| {
        p.config.slots.context_shift = v;
        Ok(())
    })
    .env("LLAMA_ARG_CONTEXT_SHIFT"),
    text(&["-r", "--reverse-prompt"], "PROMPT", "stop generating at PROMPT\n", |p, v| {
        p.config.context.reverse_prompts.push(v.into());
        Ok(())
    }),
    flag(&["-sp", "--special"], "print special tokens in the output (default: false)", |p| {
        p.config.context.special = true;
        Ok(())
    }),
    toggle(&["--warmup"], &["--no-warmup"], "run one empty pass at start-up (default: enabled)", |p, v| {
        p.config.context.warmup = v;
        Ok(())
    }),
    flag(&["--spm-infill"], "infill in Suffix/Prefix/Middle order, which some models prefer (default: disabled)", |p| {
        p.config.context.spm_infill = true;
        Ok(())
    }),
    text(&["--pooling"], "{none,mean,cls,last,rank}", "embedding pooling; the model's when unset", |p, v| {
        p.config.context.pooling = one_of(v, &["none", "mean", "cls", "last", "rank"])?;
        Ok(())
    })
    .env("LLAMA_ARG_POOLING"),
    int(&["-np", "--parallel"], "N", "number of slots (default: -1, -1 = auto)", |p, v| {
        if v == 0 {
            return Err("error: invalid value for n_parallel\n".into());
        }
        p.config.slots.n_parallel = v;
        Ok(())
    })
    .env("LLAMA_ARG_N_PARALLEL"),
    toggle(&["-cb", "--cont-batching"], &["-nocb", "--no-cont-batching"], "continuous (dynamic) batching (default: enabled)", |p, v| {
        p.config.slots.cont_batching = v;
        Ok(())
    })
    .env("LLAMA_ARG_CONT_BATCHING"),
    text(&["-mm", "--mmproj"], "FILE", "multimodal projector file\nwith -hf it can be left out", |p, v| {
        p.config.multimodal.mmproj = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MMPROJ")
    .pending(MULTIMODAL),
    text(&["-mmu", "--mmproj-url"], "URL", "URL of a multimodal projector file", |p, v| {
        p.config.multimodal.mmproj_url = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MMPROJ_URL")
    .pending(MULTIMODAL),
    toggle(&["--mmproj-auto"], &["--no-mmproj", "--no-mmproj-auto"], "use the repository's multimodal projector when there is one, for -hf (default: enabled)", |p, v| {
        p.config.multimodal.mmproj_auto = v;
        Ok(())
    })
    .env("LLAMA_ARG_MMPROJ_AUTO"),
    toggle(&["--mmproj-offload"], &["--no-mmproj-offload"], "put the multimodal projector on a device (default: enabled)", |p, v| {
        p.config.multimodal.mmproj_offload = v;
        Ok(())
    })
    .env("LLAMA_ARG_MMPROJ_OFFLOAD")
    .pending(MULTIMODAL),
    text(&["-mmdev", "--mmproj-device"], "DEVICE", "device for the multimodal projector; none = host (default: as --device)\n--list-devices shows them", |p, v| {
        if v == "none" {
            p.config.multimodal.mmproj_offload = false;
            p.config.multimodal.mmproj_device.clear();
            return Ok(());
        }
        match device_list(v)? {
            DeviceChoice::Named(names) if names.len() == 1 => {
                p.config.multimodal.mmproj_offload = true;
                p.config.multimodal.mmproj_device = names[0].clone();
                Ok(())
            }
            _ => Err("only one device may be specified for mmproj".into()),
        }
    })
    .env("MTMD_BACKEND_DEVICE")
    .pending(MULTIMODAL),
    int(&["--image-min-tokens"], "N", "fewest tokens per image, for vision models with dynamic resolution (default: the model's)", |p, v| {
        p.config.multimodal.image_min_tokens = v;
        Ok(())
    })
    .env("LLAMA_ARG_IMAGE_MIN_TOKENS")
    .pending(MULTIMODAL),
    int(&["--image-max-tokens"], "N", "most tokens per image, for vision models with dynamic resolution (default: the model's)", |p, v| {
        p.config.multimodal.image_max_tokens = v;
        Ok(())
    })
    .env("LLAMA_ARG_IMAGE_MAX_TOKENS")
    .pending(MULTIMODAL),
    int(&["--mtmd-batch-max-tokens"], "N", "most image tokens encoded per batch (default: 1024)", |p, v| {
        p.config.multimodal.batch_max_tokens = v;
        Ok(())
    })
    .env("LLAMA_ARG_MTMD_BATCH_MAX_TOKENS")
    .pending(MULTIMODAL),
    text(&["--video-fps"], "N", "frames per second taken from videos (default: 4.0)", |p, v| {
        p.config.multimodal.video_fps = stof(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_VIDEO_FPS")
    .pending(MULTIMODAL),
    int(&["--video-timestamp-interval"], "N", "milliseconds between text timestamps in videos (default: 5000)", |p, v| {
        p.config.multimodal.video_timestamp_interval_ms = v;
        Ok(())
    })
    .env("LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL")
    .pending(MULTIMODAL),
    text(&["--video-ffmpeg-dir"], "DIR", "folder holding ffmpeg and ffprobe (default: found through PATH)", |p, v| {
        p.config.multimodal.video_ffmpeg_dir = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_VIDEO_FFMPEG_DIR")
    .pending(MULTIMODAL),
    text(&["-a", "--alias"], "STRING", "model names the API answers to, comma-separated", |p, v| {
        p.config.model.aliases.extend(trimmed_items(v));
        Ok(())
    })
    .env("LLAMA_ARG_ALIAS"),
    text(&["--tags"], "STRING", "model tags, comma-separated (shown only, never used for routing)", |p, v| {
        p.config.model.tags.extend(trimmed_items(v));
        Ok(())
    })
    .env("LLAMA_ARG_TAGS"),
    int(&["--embd-normalize"], "N", "embedding normalisation (default: 2) (-1 none, 0 max absolute int16, 1 taxicab, 2 euclidean, >2 p-norm)", |p, v| {
        p.config.context.embd_normalize = v;
        Ok(())
    }),
    text(&["--host"], "HOST", "addresses to listen on, comma-separated, or UNIX socket paths ending in .sock; with several TCP addresses :: means IPv6 only; overlapping addresses are undefined (default: 127.0.0.1)", |p, v| {
        let hosts: Vec<String> = csv_row(v).into_iter().map(|h| h.trim().to_string()).filter(|h| !h.is_empty()).collect();
        if hosts.is_empty() {
            return Err("--host requires at least one address".into());
        }
        p.config.serve.hosts = hosts;
        Ok(())
    })
    .env("LLAMA_ARG_HOST"),
    int(&["--port"], "PORT", "port to listen on (default: 8080)", |p, v| {
        p.config.serve.port = v;
        Ok(())
    })
    .env("LLAMA_ARG_PORT"),
    flag(&["--reuse-port"], "let several sockets bind the same port (default: disabled)", |p| {
        p.config.serve.reuse_port = true;
        Ok(())
    })
    .env("LLAMA_ARG_REUSE_PORT")
    .pending("SO_REUSEPORT"),
    text(&["--path"], "PATH", "folder of static files to serve (default: )", |p, v| {
        p.config.serve.static_path = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_STATIC_PATH")
    .pending(STATIC_FILES),
    text(&["--cors-origins"], "ORIGINS", "allowed CORS origins, comma-separated (default: *)\n'localhost' echoes the Origin header only for localhost", |p, v| {
        p.config.serve.cors_origins = v.into();
        p.config.serve.cors_origins_explicit = true;
        Ok(())
    })
    .env("LLAMA_ARG_CORS_ORIGINS"),
    text(&["--cors-methods"], "METHODS", "allowed CORS methods, comma-separated (default: GET, POST, DELETE, OPTIONS)", |p, v| {
        p.config.serve.cors_methods = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_CORS_METHODS"),
    text(&["--cors-headers"], "HEADERS", "allowed CORS headers, comma-separated (default: *)", |p, v| {
        p.config.serve.cors_headers = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_CORS_HEADERS"),
    toggle(&["--cors-credentials"], &["--no-cors-credentials"], "allow CORS credentials (default: enabled)\nwith --cors-origins * the Origin header is echoed and credentials always allowed", |p, v| {
        p.config.serve.cors_credentials = v;
        Ok(())
    })
    .env("LLAMA_ARG_CORS_CREDENTIALS"),
    text(&["--api-prefix"], "PREFIX", "path prefix of every route, without a trailing slash (default: )", |p, v| {
        p.config.serve.api_prefix = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_API_PREFIX"),
    text(&["--ui-config", "--webui-config"], "JSON", "JSON of default web UI settings", |p, v| {
        p.config.serve.ui_config_json = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_UI_CONFIG")
    .pending("web UI settings"),
    text(&["--ui-config-file", "--webui-config-file"], "PATH", "JSON file of default web UI settings", |p, v| {
        p.config.serve.ui_config_json = read_text_file(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_UI_CONFIG_FILE")
    .pending("web UI settings"),
    toggle(&["--ui-mcp-proxy", "--webui-mcp-proxy"], &["--no-ui-mcp-proxy", "--no-webui-mcp-proxy"], "experimental MCP CORS proxy; never on untrusted networks (default: disabled)", |p, v| {
        p.config.serve.ui_mcp_proxy = v;
        Ok(())
    })
    .env("LLAMA_ARG_UI_MCP_PROXY")
    .pending(AGENT),
    text(&["--tools"], "TOOL1,TOOL2,...", "experimental built-in agent tools; never on untrusted networks (default: none)\n\"all\" enables every tool\ntools: read_file, file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info\nnarrows the default --cors-origins to localhost", |p, v| {
        p.config.serve.tools = csv_row(v);
        Ok(())
    })
    .env("LLAMA_ARG_TOOLS")
    .pending(AGENT),
    text(&["--tools-runtime"], "OPTION", "experimental: where tools run (default: none, this host)\none of:\n'docker:<image>', 'podman:<image>': a new container reused for every call, removed at exit\n'docker-container:<id>', 'podman-container:<id>': an existing container, left running\n'ssh:<target>': a POSIX host over SSH with key login and a known host key\n", |p, v| {
        p.config.serve.tools_runtime = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_TOOLS_RUNTIME")
    .pending(AGENT),
    text(&["--mcp-servers-config"], "PATH", "experimental: JSON file of MCP servers (Cursor format); never on untrusted networks (default: none)\nnarrows the default --cors-origins to localhost", |p, v| {
        p.config.serve.mcp_servers_config = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MCP_SERVERS_CONFIG")
    .pending(AGENT),
    text(&["--mcp-servers-json"], "JSON", "experimental: MCP servers as inline JSON (Cursor format); never on untrusted networks (default: none)\nnarrows the default --cors-origins to localhost", |p, v| {
        p.config.serve.mcp_servers_json = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MCP_SERVERS_JSON")
    .pending(AGENT),
    toggle(&["-ag", "--agent"], &["-no-ag", "--no-agent"], "the CORS proxy and every built-in tool; never on untrusted networks (default: disabled)\nnarrows the default --cors-origins to localhost", |p, v| {
        p.config.serve.tools = if v { vec!["all".into()] } else { Vec::new() };
        p.config.serve.ui_mcp_proxy = v;
        Ok(())
    })
    .env("LLAMA_ARG_AGENT")
    .pending(AGENT),
    toggle(&["--ui", "--webui"], &["--no-ui", "--no-webui"], "serve the web UI (default: enabled)", |p, v| {
        p.config.serve.ui = v;
        Ok(())
    })
    .env("LLAMA_ARG_UI"),
    flag(&["--embedding", "--embeddings"], "serve embeddings only; for dedicated embedding models (default: disabled)", |p| {
        p.config.serve.embedding = true;
        Ok(())
    })
    .env("LLAMA_ARG_EMBEDDINGS"),
    flag(&["--rerank", "--reranking"], "serve the reranking endpoint (default: disabled)", |p| {
        p.config.serve.embedding = true;
        p.config.context.pooling = "rank".into();
        Ok(())
    })
    .env("LLAMA_ARG_RERANKING"),
    text(&["--api-key"], "KEY", "API keys clients must present, comma-separated (default: none)", |p, v| {
        p.config.serve.api_keys.extend(csv_row(v).into_iter().filter(|k| !k.is_empty()));
        Ok(())
    })
    .env("LLAMA_API_KEY"),
    text(&["--api-key-file"], "FNAME", "file of API keys, one per line; lines starting with # are skipped (default: none)", |p, v| {
        let keys = read_text_file(v)?;
        p.config.serve.api_keys.extend(keys.lines().filter(|k| !k.is_empty() && !k.starts_with('#')).map(String::from));
        Ok(())
    })
    .env("LLAMA_ARG_API_KEY_FILE"),
    text(&["--ssl-key-file"], "FNAME", "PEM file of the TLS private key", |p, v| {
        p.config.serve.ssl_key_file = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_SSL_KEY_FILE")
    .pending("TLS"),
    text(&["--ssl-cert-file"], "FNAME", "PEM file of the TLS certificate", |p, v| {
        p.config.serve.ssl_cert_file = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_SSL_CERT_FILE")
    .pending("TLS"),
    text(&["--chat-template-kwargs"], "STRING", "extra chat template variables as a JSON object, e.g. '{\"key1\":\"value1\",\"key2\":\"value2\"}'", |p, v| {
        let serde_json::Value::Object(map) = parse_json(v)? else {
            return Err("type must be an object".into());
        };
        for (key, value) in map {
            if key == "enable_thinking" {
                p.warn("Setting 'enable_thinking' via --chat-template-kwargs is deprecated. Use --reasoning on / --reasoning off instead.");
            }
            if key == "preserve_reasoning" {
                p.warn("Setting 'preserve_reasoning' via --chat-template-kwargs is deprecated. Use --reasoning-preserve / --no-reasoning-preserve instead.");
            }
            p.config.chat.template_kwargs.insert(key, value.to_string());
        }
        Ok(())
    })
    .env("LLAMA_ARG_CHAT_TEMPLATE_KWARGS"),
    int(&["-to", "--timeout"], "N", "HTTP read and write timeout, seconds (default: 3600)", |p, v| {
        p.config.serve.timeout = v;
        Ok(())
    })
    .env("LLAMA_ARG_TIMEOUT"),
    int(&["--sse-ping-interval"], "N", "seconds between SSE keep-alive pings, -1 = none (default: 30)", |p, v| {
        p.config.serve.sse_ping_interval = v;
        Ok(())
    })
    .env("LLAMA_ARG_SSE_PING_INTERVAL")
    .pending("SSE keep-alive pings"),
    int(&["--threads-http"], "N", "threads serving HTTP requests (default: -1)", |p, v| {
        p.config.serve.threads_http = v;
        Ok(())
    })
    .env("LLAMA_ARG_THREADS_HTTP"),
    toggle(&["--cache-prompt"], &["--no-cache-prompt"], "reuse the cached prompt of a slot (default: enabled)", |p, v| {
        p.config.slots.cache_prompt = v;
        Ok(())
    })
    .env("LLAMA_ARG_CACHE_PROMPT"),
    int(&["--cache-reuse"], "N", "smallest chunk reused from the cache by shifting the KV, needs prompt caching (default: 0)", |p, v| {
        p.config.slots.cache_reuse = v;
        Ok(())
    })
    .env("LLAMA_ARG_CACHE_REUSE"),
    flag(&["--metrics"], "serve Prometheus metrics (default: disabled)", |p| {
        p.config.serve.metrics = true;
        Ok(())
    })
    .env("LLAMA_ARG_ENDPOINT_METRICS"),
    flag(&["--props"], "allow changing global properties through POST /props (default: disabled)", |p| {
        p.config.serve.props = true;
        Ok(())
    })
    .env("LLAMA_ARG_ENDPOINT_PROPS"),
    toggle(&["--slots"], &["--no-slots"], "serve the slot monitoring endpoint (default: enabled)", |p, v| {
        p.config.serve.slots_endpoint = v;
        Ok(())
    })
    .env("LLAMA_ARG_ENDPOINT_SLOTS"),
    text(&["--slot-save-path"], "PATH", "folder where slot KV caches are saved (default: disabled)", |p, v| {
        p.config.slots.slot_save_path = existing_dir(v)?;
        Ok(())
    }),
    text(&["--media-path"], "PATH", "folder local media is read from, through relative file:// URLs (default: disabled)", |p, v| {
        p.config.serve.media_path = existing_dir(v)?;
        Ok(())
    })
    .pending(MULTIMODAL),
    text(&["--models-dir"], "PATH", "folder of models for router mode (default: disabled)", |p, v| {
        p.config.serve.models_dir = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MODELS_DIR")
    .pending(ROUTER),
    text(&["--models-preset"], "PATH", "INI file of model presets for router mode (default: disabled)", |p, v| {
        p.config.serve.models_preset = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_MODELS_PRESET")
    .pending(ROUTER),
    int(&["--models-max"], "N", "router mode: most models loaded at once, 0 = no limit (default: 4)", |p, v| {
        p.config.serve.models_max = v;
        Ok(())
    })
    .env("LLAMA_ARG_MODELS_MAX")
    .pending(ROUTER),
    toggle(&["--models-autoload"], &["--no-models-autoload"], "router mode: load a model when a request names it (default: enabled)", |p, v| {
        p.config.serve.models_autoload = v;
        Ok(())
    })
    .env("LLAMA_ARG_MODELS_AUTOLOAD")
    .pending(ROUTER),
    toggle(&["--jinja"], &["--no-jinja"], "render chat templates with the Jinja engine (default: enabled)", |p, v| {
        p.config.chat.jinja = v;
        Ok(())
    })
    .env("LLAMA_ARG_JINJA"),
    text(&["--reasoning-format"], "FORMAT", "how thinking is returned:\n- none: left in `message.content`\n- deepseek: moved to `message.reasoning_content`\n- deepseek-legacy: `<think>` tags kept in `message.content` and also copied to `message.reasoning_content`\n(default: auto)", |p, v| {
        if !["none", "auto", "deepseek", "deepseek-legacy"].contains(&v) {
            return Err(format!("Unknown reasoning format: {v}"));
        }
        p.config.chat.reasoning_format = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_THINK"),
    text(&["-rea", "--reasoning"], "[on|off|auto]", "let the model think: 'on', 'off' or 'auto' (default: 'auto', from the template)", |p, v| {
        let on = parse_tristate(v, "--reasoning")?;
        if let Some(on) = on {
            p.config.chat.template_kwargs.insert("enable_thinking".into(), on.to_string());
        }
        p.config.chat.reasoning = on;
        Ok(())
    })
    .env("LLAMA_ARG_REASONING"),
    text(&["--reasoning-effort"], "LEVEL", "reasoning effort passed to the chat template: 'default' keeps the template's,\nor e.g. 'minimal', 'low', 'medium', 'high', 'xhigh', 'max' (default: default)", |p, v| {
        if v == "default" {
            p.config.chat.template_kwargs.remove("reasoning_effort");
        } else {
            p.config.chat.template_kwargs.insert("reasoning_effort".into(), serde_json::Value::from(v).to_string());
        }
        Ok(())
    })
    .env("LLAMA_ARG_REASONING_EFFORT"),
    int(&["--reasoning-budget"], "N", "thinking token budget: -1 unlimited, 0 end at once, N>0 at most N (default: -1)", |p, v| {
        if v < -1 {
            return Err("invalid value".into());
        }
        p.config.sampling.reasoning_budget = v;
        Ok(())
    })
    .env("LLAMA_ARG_THINK_BUDGET"),
    text(&["--reasoning-budget-message"], "MESSAGE", "text inserted before the end-of-thinking tag when the budget runs out (default: none)", |p, v| {
        p.config.sampling.reasoning_budget_message = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_THINK_BUDGET_MESSAGE"),
    toggle(&["--reasoning-preserve"], &["--no-reasoning-preserve"], "keep earlier thinking in the history, not only the last assistant message's (default: enabled)\nfor templates that can ('supports_preserve_reasoning')\nsee https://docs.z.ai/guides/capabilities/thinking-mode#preserved-thinking", |p, v| {
        p.config.chat.template_kwargs.insert("preserve_reasoning".into(), v.to_string());
        Ok(())
    })
    .env("LLAMA_ARG_REASONING_PRESERVE"),
    text(&["--chat-template"], "JINJA_TEMPLATE", "chat template text or built-in name (default: the model's)\nignored when a suffix or prefix is set\nwithout --jinja before it, only common templates are accepted\nbuilt-in names:\nbailing, bailing-think, bailing2, chatglm3, chatglm4, chatml, command-r, deepseek, deepseek-ocr, deepseek2, deepseek3, exaone-moe, exaone3, exaone4, falcon3, gemma, gigachat, glmedge, gpt-oss, granite, granite-4.0, granite-4.1, grok-2, hunyuan-dense, hunyuan-moe, hunyuan-vl, kimi-k2, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, llama4, megrez, minicpm, mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, monarch, openchat, orion, pangu-embedded, phi3, phi4, rwkv-world, seed_oss, smolvlm, solar-open, vicuna, vicuna-orca, yandex, zephyr", |p, v| {
        p.config.chat.template = v.into();
        Ok(())
    })
    .env("LLAMA_ARG_CHAT_TEMPLATE"),
    text(&["--chat-template-file"], "JINJA_TEMPLATE_FILE", "file holding the chat template (default: the model's)\nignored when a suffix or prefix is set\nwithout --jinja before it, only common templates are accepted\nbuilt-in names are listed under --chat-template", |p, v| {
        p.config.chat.template = read_text_file(v)?;
        Ok(())
    })
    .env("LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    toggle(&["--skip-chat-parsing"], &["--no-skip-chat-parsing"], "return all output as content, even with a Jinja template: no reasoning or tool-call parsing (default: disabled)", |p, v| {
        p.config.chat.skip_chat_parsing = v;
        Ok(())
    })
    .env("LLAMA_ARG_SKIP_CHAT_PARSING"),
    toggle(&["--prefill-assistant"], &["--no-prefill-assistant"], "continue a trailing assistant message instead of treating it as complete (default: prefill enabled)\n", |p, v| {
        p.config.chat.prefill_assistant = v;
        Ok(())
    })
    .env("LLAMA_ARG_PREFILL_ASSISTANT"),
    text(&["-sps", "--slot-prompt-similarity"], "SIMILARITY", "how closely a request's prompt must match a slot's to reuse that slot, 0.0 = off (default: 0.10)\n", |p, v| {
        p.config.slots.slot_prompt_similarity = stof(v)?;
        Ok(())
    }),
    flag(&["--lora-init-without-apply"], "load LoRA adapters without applying them; apply later with POST /lora-adapters (default: disabled)", |p| {
        p.config.adapters.lora_init_without_apply = true;
        Ok(())
    })
    .pending(LORA),
    int(&["--sleep-idle-seconds"], "SECONDS", "idle seconds before the server sleeps (default: -1; -1 = never)", |p, v| {
        if v == 0 || v < -1 {
            return Err("invalid value: cannot be 0 or less than -1".into());
        }
        p.config.serve.sleep_idle_seconds = v;
        Ok(())
    })
    .pending("sleeping when idle"),
    text(&["--log-prompts-dir"], "PATH", "write prompts to this folder, for debugging (default: disabled)", |p, v| {
        p.config.serve.log_prompts_dir = v.into();
        Ok(())
    })
    .pending("prompt logging"),
    flag(&["--embd-gemma-default"], "preset: EmbeddingGemma (downloads weights)", |p| {
        let c = &mut p.config;
        c.model.hf_repo = "ggml-org/embeddinggemma-300M-qat-q4_0-GGUF".into();
        c.model.hf_file = "embeddinggemma-300M-qat-Q4_0.gguf".into();
        c.serve.port = 8011;
        c.context.ubatch = 2048;
        c.context.batch = 2048;
        c.slots.n_parallel = 32;
        c.context.ctx_size = 2048 * 32;
        c.serve.embedding = true;
        Ok(())
    })
    .pending(EMBEDDING_GEMMA),
    flag(&["--fim-qwen-1.5b-default"], "preset: Qwen 2.5 Coder 1.5B for fill-in-the-middle (downloads weights)", |p| {
        apply_fim_preset(p, Preset { repo: "ggml-org/Qwen2.5-Coder-1.5B-Q8_0-GGUF", file: "qwen2.5-coder-1.5b-q8_0.gguf", port: 8012 })
    }),
    flag(&["--fim-qwen-3b-default"], "preset: Qwen 2.5 Coder 3B for fill-in-the-middle (downloads weights)", |p| {
        apply_fim_preset(p, Preset { repo: "ggml-org/Qwen2.5-Coder-3B-Q8_0-GGUF", file: "qwen2.5-coder-3b-q8_0.gguf", port: 8012 })
    }),
    flag(&["--fim-qwen-7b-default"], "preset: Qwen 2.5 Coder 7B for fill-in-the-middle (downloads weights)", |p| {
        apply_fim_preset(p, Preset { repo: "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF", file: "qwen2.5-coder-7b-q8_0.gguf", port: 8012 })
    }),
    flag(&["--fim-qwen-7b-spec"], "preset: Qwen 2.5 Coder 7B with a 0.5B draft model (downloads weights)", |p| {
        set_draft_spec_model(p);
        apply_fim_preset(p, Preset { repo: "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF", file: "qwen2.5-coder-7b-q8_0.gguf", port: 8012 })
    })
    .pending(SPECULATIVE),
    flag(&["--fim-qwen-14b-spec"], "preset: Qwen 2.5 Coder 14B with a 0.5B draft model (downloads weights)", |p| {
        set_draft_spec_model(p);
        apply_fim_preset(p, Preset { repo: "ggml-org/Qwen2.5-Coder-14B-Q8_0-GGUF", file: "qwen2.5-coder-14b-q8_0.gguf", port: 8012 })
    })
    .pending(SPECULATIVE),
    flag(&["--fim-qwen-30b-default"], "preset: Qwen 3 Coder 30B A3B Instruct (downloads weights)", |p| {
        apply_fim_preset(p, Preset { repo: "ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF", file: "qwen3-coder-30b-a3b-instruct-q8_0.gguf", port: 8012 })
    }),
    flag(&["--gpt-oss-20b-default"], "preset: gpt-oss-20b (downloads weights)", |p| {
        apply_gpt_oss_preset(p, "ggml-org/gpt-oss-20b-GGUF", "gpt-oss-20b-mxfp4.gguf")
    }),
    flag(&["--gpt-oss-120b-default"], "preset: gpt-oss-120b (downloads weights)", |p| {
        apply_gpt_oss_preset(p, "ggml-org/gpt-oss-120b-GGUF", "")
    }),
    flag(&["--vision-gemma-4b-default"], "preset: Gemma 3 4B QAT with vision (downloads weights)", |p| {
        apply_vision_preset(p, "ggml-org/gemma-3-4b-it-qat-GGUF")
    })
    .pending(MULTIMODAL),
    flag(&["--vision-gemma-12b-default"], "preset: Gemma 3 12B QAT with vision (downloads weights)", |p| {
        apply_vision_preset(p, "ggml-org/gemma-3-12b-it-qat-GGUF")
    })
    .pending(MULTIMODAL),
    flag(&["--spec-default"], "preset: the default speculative decoding settings (ngram-mod)", |p| {
        let s = &mut p.config.speculative;
        s.types.push("ngram-mod".into());
        s.ngram_mod_n_match = 24;
        s.ngram_mod_n_min = 48;
        s.ngram_mod_n_max = 64;
        Ok(())
    })
    .pending(SPECULATIVE),
];

/// Upstream's check for folder options: the folder must exist; the stored path ends with `/`.
fn existing_dir(v: &str) -> Result<String, Refusal> {
    if !std::path::Path::new(v).is_dir() {
        return Err(format!("not a directory: {v}"));
    }
    Ok(if v.ends_with(std::path::MAIN_SEPARATOR) {
        v.to_string()
    } else {
        format!("{v}{}", std::path::MAIN_SEPARATOR)
    })
}

static BLOOMERY: &[Opt] = &[
    text(&["--place"], "a|bp|N+M", "bloomery: where the model goes: a = the planner decides; bp = attention on the larger of two cards, experts on the other; 0+1 = only these cards (default: a)", |p, v| {
        p.placement.place = p.sourced(place(v)?);
        Ok(())
    })
    .env("BLOOMERY_PLACE"),
    text(&["--card-budget"], "DEV=SIZE,...", "bloomery: most memory to use on each card, e.g. CUDA0=38G,CUDA1=20G (units K, M, G, T; powers of 1024)", |p, v| {
        p.placement.card_budget = p.sourced(card_budget(v)?);
        Ok(())
    })
    .env("BLOOMERY_CARD_BUDGET"),
    flag(&["--print-config"], "bloomery: print the resolved configuration and placement intent as JSON, with each value's source, and exit", |p| {
        p.exit = Some(Exit::PrintConfig);
        Ok(())
    }),
    text(&["--generate"], "KIND", "bloomery: print generated documentation and exit; KIND is man, complete-bash, complete-zsh or complete-fish", |p, v| {
        let kind = super::docs::DocKind::from_name(v).ok_or("invalid value, must be one of: man, complete-bash, complete-zsh, complete-fish")?;
        p.exit = Some(Exit::Generate(kind));
        Ok(())
    }),
];

/// Every option, by help section, in upstream's order; bloomery's own come last.
pub static GROUPS: &[Group] = &[
    Group {
        title: "common params",
        options: COMMON,
    },
    Group {
        title: "sampling params",
        options: SAMPLING,
    },
    Group {
        title: "speculative params",
        options: SPECULATIVE_OPTS,
    },
    Group {
        title: "example-specific params",
        options: SERVER,
    },
    Group {
        title: "bloomery params",
        options: BLOOMERY,
    },
];

/// Every option in table order.
pub fn all_options() -> impl Iterator<Item = &'static Opt> {
    GROUPS.iter().flat_map(|g| g.options.iter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn spellings_and_env_names_are_unique() {
        let mut spellings = HashSet::new();
        let mut envs = HashSet::new();
        for o in all_options() {
            for s in o.spellings() {
                assert!(spellings.insert(s), "spelling {s} appears twice");
            }
            if let Some(e) = o.env {
                assert!(envs.insert(e), "variable {e} appears twice");
            }
            assert_eq!(
                o.is_switch(),
                o.hint.is_empty(),
                "{}: value hint and arity disagree",
                o.long_name()
            );
        }
    }

    #[test]
    fn logit_bias_grammar() {
        assert_eq!(logit_bias("15043+1"), Some((15043, 1.0)));
        assert_eq!(logit_bias("15043-0.5"), Some((15043, -0.5)));
        assert_eq!(logit_bias(" 7 + 2"), Some((7, 2.0)));
        assert_eq!(logit_bias("15043"), None);
        assert_eq!(logit_bias("x+1"), None);
    }

    #[test]
    fn kv_override_grammar() {
        use crate::model::OverrideValue;
        assert_eq!(
            kv_override("a.b=bool:false").map(|k| k.value),
            Some(OverrideValue::Bool(false))
        );
        assert_eq!(
            kv_override("n=int:12").map(|k| k.value),
            Some(OverrideValue::Int(12))
        );
        assert_eq!(
            kv_override("s=str:hi").map(|k| k.value),
            Some(OverrideValue::Str("hi".into()))
        );
        assert!(kv_override("s=bool:maybe").is_none());
        assert!(kv_override("s=oops:1").is_none());
        assert!(kv_override("nokey").is_none());
    }
}
