//! The `bloomery-serve` binary's exit statuses and output streams, and, when upstream's
//! llama-server b11434 has been built (`scripts/upstream.sh`), the same refusal lines and exit
//! statuses as upstream for bad options, bad values and bad variables.

use std::path::PathBuf;
use std::process::{Command, Output};

const OURS: &str = env!("CARGO_BIN_EXE_bloomery-serve");

fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args).env_clear().envs(env.iter().copied());
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    let dir = std::env::temp_dir();
    cmd.current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn refusal_exits_1_with_message_on_stderr() {
    let out = run(OURS, &["--nope"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: invalid argument: --nope\n");
    assert!(out.stdout.is_empty());
}

#[test]
fn help_print_config_and_devices_exit_0_on_stdout() {
    let out = run(OURS, &["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).starts_with("----- common params -----\n\n-h,    --help, --usage"));
    let out = run(
        OURS,
        &["-ngl", "all", "--print-config"],
        &[("LLAMA_ARG_PORT", "9001")],
    );
    assert_eq!(out.status.code(), Some(0));
    let j: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("--print-config prints JSON");
    assert_eq!(j["placement"]["n_gpu_layers"]["value"], "all");
    assert_eq!(j["config"]["serve"]["port"], 9001);
    let out = run(OURS, &["--list-devices"], &[]);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "Available devices:\n  (none)\n".into())
    );
    let out = run(OURS, &["--version"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stderr).starts_with("version: "));
}

#[test]
fn not_built_options_warn_at_start() {
    let out = run(OURS, &["--lora", "x.gguf", "--print-config"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stderr),
        "warn: not built yet: LoRA adapters; --lora has no effect\n"
    );
}

/// A command line and its environment.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);

fn upstream() -> Option<PathBuf> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/bloomery")))?;
    let bin = cache.join("upstream/b11434/bin/llama-server");
    bin.is_file().then_some(bin)
}

/// The refusal line (the one starting with `error`), and the spellings of the usage block.
fn refusal(stderr: &str) -> (String, String) {
    let from = stderr.find("error").map_or("", |i| &stderr[i..]);
    let (reason, usage) = from.split_once("\n\nusage:\n").unwrap_or((from, ""));
    let head = usage.lines().next().unwrap_or_default();
    (
        reason.trim_end().to_string(),
        head.get(..40.min(head.len()))
            .unwrap_or(head)
            .trim_end()
            .to_string(),
    )
}

#[test]
fn refusals_match_upstream_binary() {
    let Some(up) = upstream() else {
        eprintln!("skipped: upstream llama-server not built (scripts/upstream.sh builds it)");
        return;
    };
    let up = up.to_string_lossy().into_owned();
    let cases: &[Case] = &[
        (&["--nope"], &[]),
        (&["--n_gpu_layerz", "3"], &[]),
        (&["-c"], &[]),
        (&["-c", "abc"], &[]),
        (&["-ngl", "many"], &[]),
        (&["-ts", "3,x"], &[]),
        (&["-ts", "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1"], &[]),
        (&["-fit", "maybe"], &[]),
        (&["-fitt", "lots"], &[]),
        (&["-ot", "exps"], &[]),
        (&["-sm", "rows"], &[]),
        (&["-ncmoe", "-1"], &[]),
        (&["-ncffn", "-2"], &[]),
        (&["-ctk", "q9"], &[]),
        (&["-ctvd", "q9"], &[]),
        (&["-lm", "fast"], &[]),
        (&["-lzm", "maybe"], &[]),
        (&["-dev", "CPU"], &[]),
        (&["-fa", "sometimes"], &[]),
        (&["--draft", "4"], &[]),
        (&["--draft-min", "2"], &[]),
        (&["--spec-ngram-size-n", "3"], &[]),
        (&["--spec-ngram-size-m", "3"], &[]),
        (&["--spec-ngram-min-hits", "3"], &[]),
        (&["--rpc", "h:1"], &[]),
        (&["-np", "0"], &[]),
        (&["--api-key-file", "/nonexistent/keys"], &[]),
        (&["--slot-save-path", "/nonexistent/dir"], &[]),
        (&["--repeat-penalty", "0"], &[]),
        (&["--spec-type", "magic"], &[]),
        (&["--reasoning-format", "loud"], &[]),
        (&["--override-kv", "a=int"], &[]),
        (&["--sleep-idle-seconds", "0"], &[]),
        (&["-cms", "-1"], &[]),
        (&["--prio", "9"], &[]),
        (&["-C", "zz"], &[]),
        (&["-lv", "x"], &[]),
        (&["--host", " , "], &[]),
        (&["--control-vector-layer-range", "1"], &[]),
        (&["--lora-scaled", "a.gguf"], &[]),
        (&["-l", "15043"], &[]),
        (&["--spec-draft-sampling", "x"], &[]),
        (&["--spec-ngram-mod-n-min", "2000"], &[]),
        (&[], &[("LLAMA_ARG_CTX_SIZE", "x")]),
        (&[], &[("LLAMA_ARG_CONT_BATCHING", "maybe")]),
        (&[], &[("LLAMA_ARG_FIT", "maybe")]),
        (&[], &[("LLAMA_ARG_DRAFT_MAX", "4")]),
        (&[], &[("LLAMA_ARG_N_GPU_LAYERS", "lots")]),
        (&["-ngl", "3", "--nope"], &[("LLAMA_ARG_N_GPU_LAYERS", "5")]),
        // device names: refused before the (missing) model is looked at
        (&["-m", "/nonexistent/m.gguf", "-dev", "CUDA7"], &[]),
        (&["-m", "/nonexistent/m.gguf", "--device", "CUDA7"], &[]),
        (&["-m", "/nonexistent/m.gguf", "-ot", "exps=CUDA9"], &[]),
        (
            &["-m", "/nonexistent/m.gguf"],
            &[("LLAMA_ARG_DEVICE", "CUDA7")],
        ),
        (
            &["-m", "/nonexistent/m.gguf"],
            &[("LLAMA_ARG_OVERRIDE_TENSOR", "exps=CUDA9")],
        ),
    ];
    for (args, env) in cases {
        let theirs = run(&up, args, env);
        let ours = run(OURS, args, env);
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "exit status for {args:?} {env:?}"
        );
        assert_eq!(
            refusal(&text(&ours.stderr)),
            refusal(&text(&theirs.stderr)),
            "refusal for {args:?} {env:?}\nours:\n{}\ntheirs:\n{}",
            text(&ours.stderr),
            text(&theirs.stderr)
        );
    }
    let empty = std::env::temp_dir().join(format!("bloomery-cli-cache-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("temp dir");
    let cache = empty.to_string_lossy().into_owned();
    let listings: [Case; 3] = [
        (&["--list-devices"], &[]),
        (&["-cl"], &[("LLAMA_CACHE", &cache)]),
        // the buffer types upstream lists before refusing an unknown one
        (&["-m", "/nonexistent/m.gguf", "-ot", "exps=CUDA9"], &[]),
    ];
    for (args, env) in listings {
        let theirs = run(&up, args, env);
        let ours = run(OURS, args, env);
        assert_eq!(
            (ours.status.code(), text(&ours.stdout)),
            (theirs.status.code(), text(&theirs.stdout)),
            "{args:?}"
        );
    }
    std::fs::remove_dir_all(&empty).expect("temp dir removed");
}
