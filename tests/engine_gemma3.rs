//! The CPU engine against upstream llama-server b11434 on Gemma 3 270M: greedy tokens and top-5
//! log-probabilities of `compat/golden/b11434/engine/gemma3-270m.json`
//! (recorded by `scripts/record-engine-goldens.py`), plus batching and KV-cache operations.

use std::path::{Path, PathBuf};

mod engine_common;

use bloomery::engine::{self, Batch, EngineParams, Forward};
use bloomery::model::GgufFile;
use bloomery::server::checkpoints::CheckpointPolicy;
use engine_common::{argmax, read_golden, run_case, same_machine};

/// Upstream's log-probabilities and ours are the same floats: same logits, same softmax steps
/// (measured 2026-12-04: 0 difference over all 768 steps' top 5). Any difference fails.
const LOGPROB_TOLERANCE: f64 = 0.0;

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

/// Greedy tokens equal upstream's, and the logits too to f32 rounding. The prompt is split into
/// the batches upstream's server runs for this windowed model (`server::checkpoints`): ggml's
/// kernels round differently for different row counts. The golden holds the recording CPU's
/// features; on a CPU with others ggml takes other float steps, and the test says so and stops.
#[test]
fn greedy_tokens_and_logprobs_match_upstream() {
    let Some(path) = model_path() else { return };
    let golden = read_golden("gemma3-270m.json");
    if !same_machine(&golden) {
        return;
    }
    let mut eng = load(&path, 1);
    // upstream's server with -c 4096 --parallel 1 and its default -b, -ub and checkpoints
    let policy = CheckpointPolicy::new(32, 8192, eng.n_swa(), false, 2048, 512, 4096, 1);
    assert!(policy.n_swa > 0, "Gemma 3 has a window");
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
        let r = run_case(
            eng.as_mut(),
            &policy,
            case,
            &format!("case {ci}"),
            0.0,
            only.is_some(),
        );
        worst = worst.max(r.worst);
        mismatches.extend(r.mismatches);
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
