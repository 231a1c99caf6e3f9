//! The CPU engine against upstream llama-server b11434 on Gemma 3 270M: greedy tokens and top-5
//! log-probabilities of `compat/golden/b11434/engine/gemma3-270m.json`
//! (recorded by `scripts/record-engine-goldens.py`), plus batching and KV-cache operations.

use std::path::{Path, PathBuf};

use bloomery::engine::{self, Batch, EngineParams, Forward};
use bloomery::model::GgufFile;
use serde_json::Value;

/// Upstream's log-probabilities and ours may differ by this much (f32 sums in another order).
const LOGPROB_TOLERANCE: f64 = 1e-2;

fn model_path() -> Option<PathBuf> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/bloomery")
        });
    let p = cache.join("models/gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} is absent (scripts/fetch-test-data.sh fetches it)",
            p.display()
        );
        None
    }
}

fn load(path: &Path, n_seq_max: usize) -> Box<dyn Forward> {
    let gguf = GgufFile::open(path).expect("model opens");
    let params = EngineParams {
        n_seq_max,
        ..EngineParams::default()
    };
    engine::load(&gguf, &params).expect("gemma3 loads")
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(v: &[f32]) -> Vec<f64> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = v.iter().map(|&x| (x as f64 - max).exp()).sum();
    v.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Fails today: top-5 logprobs differ by up to 1.04 (measured 2026-12-03, case 2 step 29; the
/// same at `4ad87f0`, so an earlier change moved it from the 0.39 first recorded) and greedy
/// tokens part at near-ties (in 11 of the first 12 mismatches our own logprobs put upstream's
/// token within 0.25 of ours). This model
/// amplifies the differences between our f32 sums and ggml's (each activation is re-quantized to
/// 8 bits, so one rounding flip propagates); which other step differs is not yet found. Run with
/// `--ignored` to measure.
#[test]
#[ignore = "engine does not yet reproduce ggml's numerics on Gemma 3 (worst 1.04)"]
fn greedy_tokens_and_logprobs_match_upstream() {
    let Some(path) = model_path() else { return };
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/compat/golden/b11434/engine/gemma3-270m.json"
        ))
        .expect("golden file"),
    )
    .expect("golden json");
    let mut eng = load(&path, 1);
    let mut worst = 0.0f64;
    let mut mismatches = Vec::new();
    let cases = golden["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10, "at least 10 prompts");
    // BLOOMERY_ENGINE_CASES=0,3 runs only those cases (for investigating one)
    let only: Option<Vec<usize>> = std::env::var("BLOOMERY_ENGINE_CASES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect());
    for (ci, case) in cases.iter().enumerate() {
        if only.as_ref().is_some_and(|o| !o.contains(&ci)) {
            continue;
        }
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["tokens"]);
        let probs = case["top_logprobs"].as_array().expect("top_logprobs");
        eng.seq_rm(0, 0, None);
        let mut batch = Batch::default();
        for (i, &t) in prompt.iter().enumerate() {
            batch.push(t, i as u32, 0, i + 1 == prompt.len());
        }
        for (pos, (step, &expected)) in (prompt.len() as u32..).zip(want.iter().enumerate()) {
            let mut logits = Vec::new();
            eng.decode(&batch, &mut logits).expect("decode");
            let got = argmax(&logits);
            let lp = log_softmax(&logits);
            let mut pairs = Vec::new();
            let mut step_worst = 0.0f64;
            for pair in probs[step].as_array().expect("top-5") {
                let id = pair[0].as_u64().expect("id") as usize;
                let theirs = pair[1].as_f64().expect("logprob");
                step_worst = step_worst.max((lp[id] - theirs).abs());
                pairs.push(format!("{id}: {:.4} vs {theirs:.4}", lp[id]));
            }
            worst = worst.max(step_worst);
            if only.is_some() {
                eprintln!("case {ci} step {step}: worst top-5 difference {step_worst:.4}");
            }
            if got != expected {
                mismatches.push(format!(
                    "case {ci} step {step}: ours {got} ({:.4}), upstream {expected}; ours vs upstream: {}",
                    lp[got as usize],
                    pairs.join(", ")
                ));
            }
            // upstream's token goes in, so one early difference does not hide later ones
            batch = Batch::default();
            batch.push(expected, pos, 0, true);
        }
    }
    eprintln!("worst top-5 logprob difference: {worst:.3e}");
    assert!(
        mismatches.is_empty(),
        "greedy tokens differ:\n{}",
        mismatches.join("\n")
    );
    assert!(
        worst <= LOGPROB_TOLERANCE,
        "worst top-5 logprob difference {worst}"
    );
}

/// Two sequences in one batch give the logits each gives alone; a copied prefix continues like
/// the original; a removed tail is recomputed identically.
#[test]
fn batched_sequences_and_cache_operations() {
    let Some(path) = model_path() else { return };
    let a: Vec<u32> = vec![2, 818, 5279, 529, 7001, 563];
    let b: Vec<u32> = vec![2, 4906, 3324, 496, 990];
    let mut alone = load(&path, 3);
    let run = |eng: &mut Box<dyn Forward>, toks: &[u32], seq: u32| {
        let mut batch = Batch::default();
        for (i, &t) in toks.iter().enumerate() {
            batch.push(t, i as u32, seq, i + 1 == toks.len());
        }
        let mut out = Vec::new();
        eng.decode(&batch, &mut out).expect("decode");
        out
    };
    let la = run(&mut alone, &a, 0);
    let lb = run(&mut alone, &b, 1);
    let mut both = load(&path, 3);
    let mut batch = Batch::default();
    for (i, &t) in a.iter().enumerate() {
        batch.push(t, i as u32, 0, i + 1 == a.len());
    }
    for (i, &t) in b.iter().enumerate() {
        batch.push(t, i as u32, 1, i + 1 == b.len());
    }
    let mut out = Vec::new();
    both.decode(&batch, &mut out).expect("decode");
    let n = both.n_vocab();
    assert_eq!(argmax(&out[..n]), argmax(&la));
    assert_eq!(argmax(&out[n..]), argmax(&lb));
    let close = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| (p - q).abs() < 1e-3);
    assert!(close(&out[..n], &la) && close(&out[n..], &lb));

    // copy seq 0's first 4 positions to seq 2, then continue both with the same token
    both.seq_cp(0, 2, 4);
    both.seq_rm(0, 4, None);
    let mut step = Batch::default();
    step.push(a[4], 4, 0, true);
    step.push(a[4], 4, 2, true);
    let mut out = Vec::new();
    both.decode(&step, &mut out).expect("decode");
    assert_eq!(
        &out[..n],
        &out[n..],
        "a copied prefix continues like its source"
    );
    let mut step = Batch::default();
    step.push(a[5], 5, 2, true);
    let mut again = Vec::new();
    both.decode(&step, &mut again).expect("decode");
    assert!(close(&again, &la), "recomputed tail gives the same logits");
}
