//! llama.cpp's config files (`/etc/llama.cpp/config.ini`, `~/.config/llama.cpp/config.ini`):
//! read before the environment, which they yield to, as the command line yields to nothing.

use bloomery::cli::config::GpuLayers;
use bloomery::cli::{parse_with_config_files, Parsed, Source};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

fn ini(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bloomery-cli-ini-{}-{name}", std::process::id()));
    std::fs::create_dir_all(dir.join("llama.cpp")).expect("temp dir");
    let path = dir.join("llama.cpp/config.ini");
    std::fs::write(&path, text).expect("temp file");
    path
}

fn run(files: &[PathBuf], args: &[&str], env: &[(&str, &str)]) -> Result<Parsed, String> {
    let argv: Vec<String> = std::iter::once("bloomery-serve")
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    let vars: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parse_with_config_files(&argv, &|k| vars.get(k).cloned(), files).map_err(|f| f.message)
}

#[test]
fn file_then_variable_then_flag() {
    let path = ini(
        "order",
        "ngl = 10\nctx-size = 1024\nport = 9000\n[*]\nno-cont-batching = 1\nbogus = 2\n",
    );
    let shown = path.display().to_string();
    let p = run(
        std::slice::from_ref(&path),
        &["-c", "4096"],
        &[("LLAMA_ARG_PORT", "9100")],
    )
    .unwrap();
    assert_eq!(p.placement.n_gpu_layers.value, GpuLayers::Count(10));
    assert_eq!(p.placement.n_gpu_layers.source, Source::File(shown.clone()));
    assert_eq!(p.config.context.ctx_size, 4096, "the flag wins");
    assert_eq!(p.config.serve.port, 9100, "the variable wins over the file");
    assert!(!p.config.slots.cont_batching, "a negative spelling as key");
    assert_eq!(
        p.warnings,
        vec![
            format!("using config file: {shown}"),
            format!("ignoring option 'bogus' from {shown}: not supported by this program"),
        ]
    );
    std::fs::remove_dir_all(path.parent().and_then(|p| p.parent()).unwrap()).unwrap();
}

#[test]
fn bad_files_are_refused() {
    let path = ini("syntax", "just text\n");
    let e = run(std::slice::from_ref(&path), &[], &[]).err().unwrap();
    assert_eq!(
        e,
        format!("failed to parse server config file: {}", path.display())
    );
    let path = ini("value", "ctx-size = x\n");
    assert_eq!(
        run(std::slice::from_ref(&path), &[], &[]).err().unwrap(),
        "stoi"
    );
    let path = ini("fit", "[*]\nfit = maybe\n");
    assert_eq!(
        run(&[path], &[], &[]).err().unwrap(),
        "error: unknown value for --fit: 'maybe'\n"
    );
}

fn upstream() -> Option<PathBuf> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/bloomery")))?;
    let bin = cache.join("upstream/b11434/bin/llama-server");
    bin.is_file().then_some(bin)
}

/// Exit status and the stderr lines that are not upstream's timestamped log lines.
fn outcome(bin: &str, config_home: &str) -> (Option<i32>, Vec<String>) {
    let out = Command::new(bin)
        .arg("--nope")
        .env_clear()
        .env("XDG_CONFIG_HOME", config_home)
        .current_dir(std::env::temp_dir())
        .output()
        .expect("runs");
    let lines = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| {
            l.split_once(" W ")
                .or_else(|| l.split_once(" I "))
                .map_or(l, |(_, m)| m)
                .to_string()
        })
        .filter(|l| !l.is_empty())
        .collect();
    (out.status.code(), lines)
}

#[test]
fn config_files_match_upstream_binary() {
    let Some(up) = upstream() else {
        eprintln!("skipped: upstream llama-server not built (scripts/upstream.sh builds it)");
        return;
    };
    for (name, text) in [
        ("u-stoi", "ctx-size = x\n"),
        ("u-syntax", "just text\n"),
        ("u-ok", "bogus = 1\nno-cont-batching = 1\nctx-size = 64\n"),
        ("u-fit", "[*]\nfit = maybe\n"),
    ] {
        let path = ini(name, text);
        let home = path.parent().and_then(|p| p.parent()).unwrap();
        let home_str = home.display().to_string();
        // upstream's logger runs on its own thread: its lines may come late, or not at all when
        // the process exits at once (seen on a loaded machine), so its fullest of three runs
        // counts
        let theirs = (0..3)
            .map(|_| outcome(&up.display().to_string(), &home_str))
            .max_by_key(|o| o.1.len())
            .unwrap();
        let ours = outcome(env!("CARGO_BIN_EXE_bloomery-serve"), &home_str);
        let strip = |v: Vec<String>| -> Vec<String> {
            let mut kept: Vec<String> = v
                .into_iter()
                .filter(|l| !l.starts_with("using config file"))
                .collect();
            kept.sort();
            kept
        };
        assert_eq!(
            (ours.0, strip(ours.1)),
            (theirs.0, strip(theirs.1)),
            "{text:?}"
        );
        std::fs::remove_dir_all(home).unwrap();
    }
}
