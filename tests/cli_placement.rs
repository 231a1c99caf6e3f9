//! Placement flags: each value grammar, bad values (upstream's message shape), the precedence of
//! flag over variable with the source recorded, and `--print-config`.

use bloomery::cli::config::{
    CardBudget, DeviceChoice, GpuLayers, LoadMode, Place, SplitMode, TensorOverride,
};
use bloomery::cli::{parse, Exit, Parsed, Source};
use std::collections::HashMap;

fn with_env(args: &[&str], env: &[(&str, &str)]) -> Result<Parsed, String> {
    let argv: Vec<String> = std::iter::once("bloomery-serve")
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    let vars: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parse(&argv, &|k| vars.get(k).cloned()).map_err(|f| f.message)
}

fn ok(args: &[&str]) -> Parsed {
    with_env(args, &[]).unwrap_or_else(|e| panic!("{args:?} refused: {e}"))
}

fn refused(args: &[&str]) -> String {
    match with_env(args, &[]) {
        Ok(_) => panic!("{args:?} was accepted"),
        Err(e) => e,
    }
}

/// Upstream's refusal shape: the reason, then the option's usage, then a pointer to -h.
fn assert_refusal(args: &[&str], spelled: &str, reason: &str) {
    let e = refused(args);
    let head = format!("error while handling argument \"{spelled}\": {reason}");
    assert!(
        e.starts_with(&head),
        "{args:?}: expected '{head}...', got '{e}'"
    );
    assert!(e.contains("\n\nusage:\n"), "{e}");
    assert!(
        e.ends_with("\n\nto show complete usage, run with -h"),
        "{e}"
    );
}

fn flag(s: &str) -> Source {
    Source::Flag(s.into())
}

fn var(s: &str) -> Source {
    Source::Env(s.into())
}

#[test]
fn gpu_layers_grammar() {
    for (v, want) in [
        ("auto", GpuLayers::Auto),
        ("all", GpuLayers::All),
        ("12", GpuLayers::Count(12)),
        ("0", GpuLayers::Count(0)),
        ("-1", GpuLayers::Auto),
        ("-2", GpuLayers::All),
        ("99x", GpuLayers::Count(99)),
    ] {
        let p = ok(&["-ngl", v]);
        assert_eq!(p.placement.n_gpu_layers.value, want, "-ngl {v}");
        assert_eq!(p.placement.n_gpu_layers.source, flag("-ngl"));
    }
    assert_eq!(
        ok(&["--n-gpu-layers", "3"]).placement.n_gpu_layers.source,
        flag("--n-gpu-layers")
    );
    assert_eq!(
        ok(&["--n_gpu_layers", "3"]).placement.n_gpu_layers.value,
        GpuLayers::Count(3),
        "-- spellings accept _"
    );
    assert_refusal(&["-ngl", "many"], "-ngl", "stoi\n");
    assert_eq!(
        ok(&["-ngld", "all"]).placement.draft.n_gpu_layers.value,
        GpuLayers::All
    );
    assert_eq!(ok(&[]).placement.n_gpu_layers.source, Source::Default);
}

#[test]
fn tensor_split_grammar() {
    assert_eq!(
        ok(&["-ts", "3,1"]).placement.tensor_split.value,
        vec![3.0, 1.0]
    );
    assert_eq!(
        ok(&["-ts", "3/1"]).placement.tensor_split.value,
        vec![3.0, 1.0]
    );
    assert_eq!(
        ok(&["--tensor-split", "0.5,0.25,0.25"])
            .placement
            .tensor_split
            .value,
        vec![0.5, 0.25, 0.25]
    );
    assert_refusal(&["-ts", "3,x"], "-ts", "stof\n");
    let many = vec!["1"; 16].join(",");
    assert_refusal(
        &["-ts", &many],
        "-ts",
        "got 16 input configs, but system only has 16 devices\n",
    );
}

#[test]
fn fit_grammar() {
    assert!(ok(&[]).placement.fit.value);
    assert!(!ok(&["-fit", "off"]).placement.fit.value);
    assert!(ok(&["--fit", "on"]).placement.fit.value);
    assert!(!ok(&["-fit", "disabled"]).placement.fit.value);
    assert_refusal(
        &["-fit", "maybe"],
        "-fit",
        "error: unknown value for --fit: 'maybe'\n",
    );
    assert_eq!(
        ok(&["-fitt", "512"]).placement.fit_target_mib.value,
        vec![512]
    );
    assert_eq!(
        ok(&["-fitt", "512,2048"]).placement.fit_target_mib.value,
        vec![512, 2048]
    );
    assert_refusal(&["-fitt", "lots"], "-fitt", "stoull\n");
    assert_eq!(ok(&["-fitc", "8192"]).placement.fit_ctx.value, 8192);
    let full = ok(&["-c", "0"]);
    assert_eq!(
        full.placement.fit_ctx.value,
        u32::MAX,
        "-c 0 asks for the full context"
    );
    assert_eq!(full.placement.fit_ctx.source, flag("-c"));
}

#[test]
fn override_tensor_grammar() {
    let p = ok(&[
        "-ot",
        r"blk\.(1|2)\.ffn_.*_exps=CPU,token_embd=CUDA0",
        "-ot",
        "exps=CUDA1",
    ]);
    let want = [
        (r"blk\.(1|2)\.ffn_.*_exps", "CPU"),
        ("token_embd", "CUDA0"),
        ("exps", "CUDA1"),
    ]
    .map(|(pattern, buffer_type)| TensorOverride {
        pattern: pattern.into(),
        buffer_type: buffer_type.into(),
    });
    assert_eq!(p.placement.override_tensor.value, want, "repeats add up");
    assert_refusal(&["-ot", "exps"], "-ot", "invalid value\n");
    assert_refusal(&["-ot", "exps="], "-ot", "unknown buffer type\n");
    assert_eq!(
        ok(&["-otd", "exps=CPU"])
            .placement
            .draft
            .override_tensor
            .value
            .len(),
        1
    );
}

#[test]
fn devices_split_and_main_gpu() {
    assert_eq!(
        ok(&["-dev", "none"]).placement.devices.value,
        DeviceChoice::NoOffload
    );
    assert_eq!(
        ok(&["--device", "CUDA0,CUDA1"]).placement.devices.value,
        DeviceChoice::Named(vec!["CUDA0".into(), "CUDA1".into()])
    );
    assert_refusal(&["-dev", "CPU"], "-dev", "invalid device: CPU\n");
    assert_eq!(
        ok(&["-devd", "CUDA1"]).placement.draft.devices.value,
        DeviceChoice::Named(vec!["CUDA1".into()])
    );
    for (v, want) in [
        ("none", SplitMode::None),
        ("layer", SplitMode::Layer),
        ("row", SplitMode::Row),
        ("tensor", SplitMode::Tensor),
    ] {
        assert_eq!(ok(&["-sm", v]).placement.split_mode.value, want);
    }
    assert_refusal(&["-sm", "rows"], "-sm", "invalid value\n");
    assert_eq!(ok(&["-mg", "1"]).placement.main_gpu.value, 1);
}

#[test]
fn moe_and_ffn_on_host() {
    let p = ok(&["--cpu-moe", "-ncmoe", "24", "-ncffn", "3"]);
    assert!(p.placement.cpu_moe.value);
    assert_eq!(p.placement.cpu_moe.source, flag("--cpu-moe"));
    assert_eq!(p.placement.n_cpu_moe.value, 24);
    assert_eq!(p.placement.n_cpu_ffn.value, 3);
    assert_refusal(&["-ncmoe", "-1"], "-ncmoe", "invalid value\n");
    assert_refusal(&["--n-cpu-ffn", "-3"], "--n-cpu-ffn", "invalid value\n");
    let d = ok(&["-cmoed", "-ncmoed", "4"]).placement.draft;
    assert!(d.cpu_moe.value);
    assert_eq!(d.n_cpu_moe.value, 4);
}

#[test]
fn load_mode_and_cache_types() {
    assert_eq!(
        ok(&["-lm", "mmap+mlock"]).placement.load_mode.value,
        LoadMode::MmapMlock
    );
    assert_eq!(
        ok(&["--load-mode", "none"]).placement.load_mode.value,
        LoadMode::None
    );
    assert_refusal(&["-lm", "mmap,mlock"], "-lm", "invalid value\n");
    assert!(!ok(&["-nkvo"]).placement.kv_offload.value);
    assert!(!ok(&["--no-op-offload"]).placement.op_offload.value);
    let p = ok(&["-ctk", "q8_0", "-ctv", "q4_0", "-ctkd", "bf16"]);
    assert_eq!(p.placement.cache_type_k.value, "q8_0");
    assert_eq!(p.placement.cache_type_v.value, "q4_0");
    assert_eq!(p.placement.draft.cache_type_k.value, "bf16");
    assert_refusal(&["-ctk", "q9"], "-ctk", "Unsupported cache type: q9\n");
}

#[test]
fn bloomery_place_and_card_budget() {
    assert_eq!(ok(&["--place", "a"]).placement.place.value, Place::Auto);
    assert_eq!(
        ok(&["--place", "bp"]).placement.place.value,
        Place::BalancedPipeline
    );
    assert_eq!(
        ok(&["--place", "0+1"]).placement.place.value,
        Place::Cards(vec![0, 1])
    );
    assert!(refused(&["--place", "left"]).contains("invalid placement 'left'"));
    let p = with_env(
        &[],
        &[
            ("BLOOMERY_CARD_BUDGET", "CUDA0=38G,CUDA1=20G"),
            ("BLOOMERY_PLACE", "1"),
        ],
    )
    .unwrap();
    assert_eq!(
        p.placement.card_budget.value,
        vec![
            CardBudget {
                device: "CUDA0".into(),
                bytes: 38 << 30
            },
            CardBudget {
                device: "CUDA1".into(),
                bytes: 20 << 30
            }
        ]
    );
    assert_eq!(p.placement.card_budget.source, var("BLOOMERY_CARD_BUDGET"));
    assert_eq!(p.placement.place.value, Place::Cards(vec![1]));
    let e = with_env(&[], &[("BLOOMERY_CARD_BUDGET", "CUDA0")])
        .err()
        .unwrap();
    assert!(e.starts_with("error while handling environment variable \"BLOOMERY_CARD_BUDGET\": invalid card budget 'CUDA0'"), "{e}");
}

#[test]
fn flag_wins_over_variable_with_upstreams_warning() {
    let p = with_env(&["-ngl", "20"], &[("LLAMA_ARG_N_GPU_LAYERS", "10")]).unwrap();
    assert_eq!(p.placement.n_gpu_layers.value, GpuLayers::Count(20));
    assert_eq!(p.placement.n_gpu_layers.source, flag("-ngl"));
    assert_eq!(
        p.warnings,
        vec!["warn: LLAMA_ARG_N_GPU_LAYERS environment variable is set, but will be overwritten by command line argument -ngl"]
    );
    let p = with_env(&[], &[("LLAMA_ARG_N_GPU_LAYERS", "10")]).unwrap();
    assert_eq!(p.placement.n_gpu_layers.value, GpuLayers::Count(10));
    assert_eq!(
        p.placement.n_gpu_layers.source,
        var("LLAMA_ARG_N_GPU_LAYERS")
    );
    assert!(p.warnings.is_empty());
    // a variable for a non-placement option records its origin too
    let p = with_env(
        &["-c", "4096"],
        &[("LLAMA_ARG_CTX_SIZE", "100"), ("LLAMA_ARG_PORT", "9000")],
    )
    .unwrap();
    assert_eq!(p.config.context.ctx_size, 4096);
    assert_eq!(p.config.serve.port, 9000);
    assert_eq!(p.config.origins["--ctx-size"], flag("-c"));
    assert_eq!(p.config.origins["--port"], var("LLAMA_ARG_PORT"));
}

#[test]
fn variables_read_like_upstream() {
    let e = |k: &str, v: &str| with_env(&[], &[(k, v)]);
    assert!(
        !e("LLAMA_ARG_CONT_BATCHING", "disabled")
            .unwrap()
            .config
            .slots
            .cont_batching
    );
    assert!(
        !e("LLAMA_ARG_NO_CONT_BATCHING", "1")
            .unwrap()
            .config
            .slots
            .cont_batching,
        "the NO_ twin"
    );
    let p = e("LLAMA_ARG_NO_KV_OFFLOAD", "anything").unwrap();
    assert!(!p.placement.kv_offload.value);
    assert_eq!(
        p.placement.kv_offload.source,
        var("LLAMA_ARG_NO_KV_OFFLOAD")
    );
    assert_eq!(
        e("LLAMA_ARG_CONT_BATCHING", "maybe").err().unwrap(),
        "error while handling environment variable \"LLAMA_ARG_CONT_BATCHING\": invalid boolean value\n\n"
    );
    assert!(
        !e("LLAMA_ARG_CPU_MOE", "false")
            .unwrap()
            .placement
            .cpu_moe
            .value,
        "a falsy flag variable is ignored"
    );
    assert!(
        e("LLAMA_ARG_CPU_MOE", "on")
            .unwrap()
            .placement
            .cpu_moe
            .value
    );
    assert_eq!(
        e("LLAMA_API_KEY", "k1,k2").unwrap().config.serve.api_keys,
        vec!["k1", "k2"]
    );
    assert_eq!(e("HF_TOKEN", "t").unwrap().config.model.hf_token, "t");
    assert_eq!(
        e("LLAMA_ARG_DRAFT_MAX", "4").err().unwrap(),
        "error while handling environment variable \"LLAMA_ARG_DRAFT_MAX\": the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max\n\n"
    );
}

#[test]
fn refusals_match_upstream() {
    assert_eq!(refused(&["--nope"]), "error: invalid argument: --nope");
    assert_eq!(
        refused(&["-ngl", "1", "--mmap"]),
        "error: invalid argument: --mmap",
        "retired before b11434, refused by it"
    );
    assert_refusal(&["-c"], "-c", "expected value for argument\n");
    assert_refusal(
        &["--draft", "4"],
        "--draft",
        "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max\n",
    );
    assert_refusal(&["--draft-max", "x"], "--draft-max", "stoi\n");
    assert_refusal(
        &["--spec-ngram-size-n", "3"],
        "--spec-ngram-size-n",
        "the argument has been removed. use the respective --spec-ngram-*-size-n\n",
    );
    assert_refusal(
        &["--rpc", "h:1"],
        "--rpc",
        "RPC not supported in this build\n",
    );
    assert_refusal(
        &["--api-key-file", "/nonexistent/keys"],
        "--api-key-file",
        "error: failed to open file '/nonexistent/keys'\n",
    );
    assert_refusal(
        &["--slot-save-path", "/nonexistent/dir"],
        "--slot-save-path",
        "not a directory: /nonexistent/dir\n",
    );
    assert!(refused(&["-j", "{not json"])
        .starts_with("error while handling argument \"-j\": [json.exception.parse_error]"));
    assert_refusal(
        &["-np", "0"],
        "-np",
        "error: invalid value for n_parallel\n",
    );
    assert_refusal(
        &["--repeat-penalty", "0"],
        "--repeat-penalty",
        "error: repeat-penalty must be finite and greater than 0\n",
    );
    assert_refusal(
        &["--spec-type", "magic"],
        "--spec-type",
        "unknown speculative type: magic\n",
    );
    assert_refusal(
        &["--reasoning-format", "loud"],
        "--reasoning-format",
        "Unknown reasoning format: loud\n",
    );
    assert_refusal(
        &["--override-kv", "a=int"],
        "--override-kv",
        "error: Invalid type for KV override: a=int\n",
    );
}

#[test]
fn exits_and_repeats() {
    assert_eq!(
        ok(&["--version", "--bogus"]).exit,
        Some(Exit::Version),
        "--version exits before later arguments"
    );
    assert_eq!(
        refused(&["--help", "--bogus"]),
        "error: invalid argument: --bogus",
        "--help waits for the whole line"
    );
    assert_eq!(ok(&["--list-devices"]).exit, Some(Exit::ListDevices));
    let out = ok(&["--list-devices"]).exit_output().unwrap();
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "Available devices:\n  (none)\n")
    );
    let p = ok(&["-c", "1", "-c", "2"]);
    assert_eq!(p.config.context.ctx_size, 2, "the last value wins");
    assert_eq!(
        p.warnings,
        vec!["DEPRECATED: argument '-c' specified multiple times, use comma-separated values instead (only last value will be used)"]
    );
}

#[test]
fn not_built_options_are_named_once() {
    let p = ok(&["--lora", "a.gguf", "--lora", "b.gguf", "-ngl", "5"]);
    let w = p.not_built_warnings();
    assert_eq!(
        w,
        vec!["warn: not built yet: LoRA adapters; --lora has no effect"]
    );
    assert_eq!(p.config.adapters.lora.len(), 2, "still recorded in Config");
    assert!(ok(&["-ngl", "5", "-c", "4096", "--port", "9000"])
        .not_built_warnings()
        .is_empty());
}

#[test]
fn print_config_shows_values_and_sources() {
    let p = with_env(
        &["-ngl", "12", "--print-config"],
        &[("LLAMA_ARG_CTX_SIZE", "8192"), ("BLOOMERY_PLACE", "bp")],
    )
    .unwrap();
    assert_eq!(p.exit, Some(Exit::PrintConfig));
    let out = p.exit_output().unwrap();
    assert_eq!(out.code, 0);
    let j: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        j["placement"]["n_gpu_layers"],
        serde_json::json!({"value": {"count": 12}, "source": {"flag": "-ngl"}})
    );
    assert_eq!(
        j["placement"]["place"],
        serde_json::json!({"value": "balanced-pipeline", "source": {"env": "BLOOMERY_PLACE"}})
    );
    assert_eq!(
        j["placement"]["split_mode"],
        serde_json::json!({"value": "layer", "source": "default"})
    );
    assert_eq!(j["config"]["context"]["ctx_size"], 8192);
    assert_eq!(
        j["config"]["origins"]["--ctx-size"],
        serde_json::json!({"env": "LLAMA_ARG_CTX_SIZE"})
    );
    assert_eq!(j["config"]["slots"]["n_parallel"], -1);
    assert_eq!(
        j["config"]["serve"]["hosts"],
        serde_json::json!(["127.0.0.1"])
    );
}
