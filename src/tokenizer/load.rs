//! Reading a vocabulary from GGUF metadata with llama.cpp's defaults, overrides and fix-ups:
//! per-model special ids, `add_*` switches, EOG detection by token text, and token attributes.

use std::collections::BTreeSet;

use crate::model::gguf::{GgufFile, MetaValue};

use super::fxhash::FxHashMap;
use super::pretok::{PreKind, PreTokenizer};
use super::special::SpecialMatcher;
use super::ugm::Ugm;
use super::{attr, Options, SpecialIds, TokenData, TokenizerError, Vocab, VocabType};

const K_MODEL: &str = "tokenizer.ggml.model";
const K_PRE: &str = "tokenizer.ggml.pre";
const K_TOKENS: &str = "tokenizer.ggml.tokens";
const K_SCORES: &str = "tokenizer.ggml.scores";
const K_TYPES: &str = "tokenizer.ggml.token_type";
const K_MERGES: &str = "tokenizer.ggml.merges";
const K_CHARSMAP: &str = "tokenizer.ggml.precompiled_charsmap";

/// Selects one id of [`SpecialIds`].
type IdField = fn(&mut SpecialIds) -> &mut Option<u32>;

fn bad(key: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::BadKey {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// One row of upstream's `tokenizer.ggml.pre` table: names, kind, and the switches it implies.
struct PreRow {
    names: &'static [&'static str],
    kind: PreKind,
    clean_spaces: Option<bool>,
    ignore_merges: bool,
    add_bos: bool,
    add_sep: bool,
    escape_whitespaces: bool,
    no_bos: bool,
    no_lowercase: bool,
}

const fn row(names: &'static [&'static str], kind: PreKind) -> PreRow {
    PreRow {
        names,
        kind,
        clean_spaces: None,
        ignore_merges: false,
        add_bos: false,
        add_sep: false,
        escape_whitespaces: false,
        no_bos: false,
        no_lowercase: false,
    }
}

impl PreRow {
    const fn unclean(mut self) -> Self {
        self.clean_spaces = Some(false);
        self
    }
    const fn ignore_merges(mut self) -> Self {
        self.ignore_merges = true;
        self
    }
    const fn bos(mut self) -> Self {
        self.add_bos = true;
        self
    }
    const fn sep(mut self) -> Self {
        self.add_sep = true;
        self
    }
    const fn escape(mut self) -> Self {
        self.escape_whitespaces = true;
        self
    }
    const fn no_bos(mut self) -> Self {
        self.no_bos = true;
        self
    }
    const fn no_lowercase(mut self) -> Self {
        self.no_lowercase = true;
        self
    }
}

/// `tokenizer.ggml.pre` values llama.cpp b11434 accepts.
fn pre_rows() -> Vec<PreRow> {
    use PreKind::*;
    vec![
        row(&["default"], Default),
        row(&["minicpm5"], Minicpm5).ignore_merges(),
        row(
            &[
                "llama3",
                "llama-v3",
                "llama-bpe",
                "falcon3",
                "falcon-h1",
                "pixtral",
                "midm-2.0",
                "lfm2",
                "jina-v5-nano",
            ],
            Llama3,
        )
        .ignore_merges()
        .bos(),
        row(&["deepseek-llm"], DeepseekLlm).unclean(),
        row(&["deepseek-coder"], DeepseekCoder).unclean(),
        row(&["deepseek-v3"], Deepseek3Llm).unclean(),
        row(&["spark2_5"], Spark25).unclean(),
        row(&["youtu"], Youtu).unclean().ignore_merges(),
        row(&["falcon"], Falcon),
        row(&["mpt"], Mpt),
        row(&["starcoder"], Starcoder),
        row(
            &[
                "gpt-2",
                "phi-2",
                "jina-es",
                "jina-de",
                "gigachat",
                "jina-v2-es",
                "jina-v2-de",
                "a.x-4.0",
                "mellum",
                "modern-bert",
            ],
            Gpt2,
        ),
        row(&["jais-2"], Jais2),
        row(&["gemma4", "granite-embed-multi-311m"], Gemma4).escape(),
        row(&["mmbert"], Mmbert).escape(),
        row(&["sarvam-moe"], SarvamMoe).escape().unclean(),
        row(&["jina-v1-en", "jina-v2-code", "roberta-bpe"], Gpt2).sep(),
        row(&["whitespace"], Whitespace).no_lowercase(),
        row(&["refact"], Refact),
        row(&["command-r"], CommandR).unclean(),
        row(&["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], Qwen2).unclean(),
        row(&["qwen35"], Qwen35).unclean(),
        row(&["stablelm2"], Stablelm2),
        row(&["olmo"], Olmo),
        row(&["dbrx"], Dbrx),
        row(&["smaug-bpe"], Smaug),
        row(&["poro-chat"], Poro).unclean(),
        row(&["chatglm-bpe"], Chatglm4).no_bos(),
        row(&["glm4", "glm5"], Chatglm4).no_bos().ignore_merges(),
        row(&["viking"], Viking).unclean(),
        row(&["jais"], Jais),
        row(&["tekken"], Tekken).unclean().ignore_merges().bos(),
        row(&["smollm"], Smollm).unclean(),
        row(&["codeshell"], Codeshell),
        row(&["bloom"], Bloom),
        row(&["gpt3-finnish"], Gpt3Finnish),
        row(&["exaone"], Exaone),
        row(&["exaone4"], Gpt2),
        row(&["exaone-moe"], ExaoneMoe),
        row(&["chameleon"], Chameleon).bos().unclean(),
        row(&["minerva-7b"], Minerva),
        row(&["megrez"], Qwen2),
        row(&["gpt-4o", "llama4", "kanana2", "talkie"], Gpt4o).unclean(),
        row(&["granite-embed-multi-97m"], GraniteEmbMulti)
            .unclean()
            .ignore_merges(),
        row(&["tiny_aya", "cohere2moe"], TinyAya).unclean(),
        row(&["superbpe"], Superbpe).unclean(),
        row(&["trillion"], Trillion).unclean(),
        row(&["granite-docling"], GraniteDocling).unclean(),
        row(&["bailingmoe", "bailingmoe2", "llada-moe"], Bailingmoe).unclean(),
        row(&["seed-coder"], SeedCoder).unclean(),
        row(&["hunyuan"], Hunyuan).unclean(),
        row(&["hunyuan-dense"], HunyuanDense).unclean(),
        row(&["hy_v4"], HyV4).unclean(),
        row(&["joyai-llm"], JoyaiLlm).unclean(),
        row(&["kimi-k2"], KimiK2).unclean(),
        row(&["ufakzeka"], Ufakzeka).unclean(),
        row(&["grok-2"], Grok2).unclean(),
        row(&["afmoe"], Afmoe).unclean(),
        row(&["laguna"], Laguna).unclean(),
        row(&["minimax-m2"], MinimaxM2).unclean(),
        row(&["solar-open"], SolarOpen).unclean(),
        row(&["mellum2"], Mellum2),
    ]
}

fn int_of(v: &MetaValue) -> Option<i64> {
    v.as_i64()
}

pub(super) fn load(g: &GgufFile) -> Result<Vocab, TokenizerError> {
    let model = g
        .get_str(K_MODEL)
        .ok_or_else(|| TokenizerError::MissingKey(K_MODEL.into()))?
        .to_string();
    let mut pre_name = g.get_str(K_PRE).unwrap_or("").to_string();
    let mut special = SpecialIds::default();
    let mut o = Options {
        escape_whitespaces: true,
        lowercase: true,
        strip_accents: true,
        ..Options::default()
    };
    let needs_merges;
    let kind = match model.as_str() {
        "llama" => {
            special.bos = Some(1);
            special.eos = Some(2);
            special.unk = Some(0);
            needs_merges = false;
            VocabType::Spm
        }
        "bert" => {
            special.bos = Some(101);
            special.unk = Some(100);
            special.sep = Some(102);
            special.pad = Some(0);
            special.mask = Some(103);
            o.add_sep = true;
            needs_merges = false;
            VocabType::Wpm
        }
        "gpt2" | "whitespace" | "gemma4" => {
            if model == "gemma4" {
                pre_name = "gemma4".into();
            } else {
                special.bos = Some(11);
                special.eos = Some(11);
            }
            needs_merges = pre_name != "kimi-k2" || model == "gemma4";
            VocabType::Bpe
        }
        "t5" => {
            special.eos = Some(1);
            special.unk = Some(2);
            special.pad = Some(0);
            needs_merges = false;
            VocabType::Ugm
        }
        other => return Err(TokenizerError::UnknownModel(other.to_string())),
    };

    let mut bpe_ranks = FxHashMap::default();
    match g.get(K_MERGES) {
        Some(v) if kind == VocabType::Bpe => {
            let merges = v
                .as_array()
                .ok_or_else(|| bad(K_MERGES, "is not an array of strings"))?;
            for (i, m) in merges.iter().enumerate() {
                let m = m
                    .as_str()
                    .ok_or_else(|| bad(K_MERGES, format!("entry {i} is not a string")))?;
                // upstream splits at the first space after the first byte; no space: an empty pair
                let key = if m.bytes().skip(1).any(|b| b == b' ') {
                    m.to_string()
                } else {
                    " ".to_string()
                };
                bpe_ranks.entry(key).or_insert(i as u32);
            }
        }
        None if kind == VocabType::Bpe && needs_merges => {
            return Err(TokenizerError::MissingKey(K_MERGES.into()))
        }
        _ => {}
    }

    let mut pre = PreKind::Default;
    match kind {
        VocabType::Bpe => {
            o.add_space_prefix = false;
            o.escape_whitespaces = false;
            o.clean_spaces = true;
            if !pre_name.is_empty() {
                let r = pre_rows()
                    .into_iter()
                    .find(|r| r.names.contains(&pre_name.as_str()))
                    .ok_or_else(|| TokenizerError::UnknownPre(pre_name.clone()))?;
                pre = r.kind;
                if let Some(c) = r.clean_spaces {
                    o.clean_spaces = c;
                }
                o.ignore_merges |= r.ignore_merges;
                o.add_bos |= r.add_bos;
                o.add_sep |= r.add_sep;
                o.escape_whitespaces |= r.escape_whitespaces;
                if r.no_bos {
                    special.bos = None;
                }
                if r.no_lowercase {
                    o.lowercase = false;
                }
            }
        }
        VocabType::Spm => {
            o.add_space_prefix = true;
            o.clean_spaces = false;
            o.add_bos = true;
            o.add_eos = false;
        }
        VocabType::Wpm => {
            o.add_space_prefix = false;
            o.clean_spaces = true;
            o.add_bos = true;
            o.add_eos = false;
            o.add_sep = true;
        }
        VocabType::Ugm => {
            o.add_bos = false;
            o.add_eos = true;
        }
    }
    let get_bool = |key: &str| g.get(key).and_then(MetaValue::as_bool);
    if let Some(b) = get_bool("tokenizer.ggml.add_space_prefix") {
        o.add_space_prefix = b;
    }
    if let Some(b) = get_bool("tokenizer.ggml.remove_extra_whitespaces") {
        o.remove_extra_whitespaces = b;
    }

    // tokens, scores, types
    let texts = g
        .get(K_TOKENS)
        .ok_or_else(|| TokenizerError::MissingKey(K_TOKENS.into()))?
        .as_array()
        .ok_or_else(|| bad(K_TOKENS, "is not an array of strings"))?;
    let n = texts.len();
    let scores = match g.get(K_SCORES) {
        None => None,
        Some(v) => {
            let a = v
                .as_array()
                .ok_or_else(|| bad(K_SCORES, "is not an array"))?;
            if a.len() < n {
                return Err(bad(K_SCORES, format!("{} scores for {n} tokens", a.len())));
            }
            Some(a)
        }
    };
    let types = match g.get(K_TYPES) {
        None => None,
        Some(v) => {
            let a = v
                .as_array()
                .ok_or_else(|| bad(K_TYPES, "is not an array"))?;
            if a.len() < n {
                return Err(bad(
                    K_TYPES,
                    format!("{} token types for {n} tokens", a.len()),
                ));
            }
            Some(a)
        }
    };
    let mut tokens = Vec::with_capacity(n);
    let mut token_to_id = FxHashMap::with_capacity_and_hasher(n, Default::default());
    let mut max_token_len = 0;
    for (i, t) in texts.iter().enumerate() {
        let mut text = t
            .as_str()
            .ok_or_else(|| bad(K_TOKENS, format!("entry {i} is not a string")))?
            .to_string();
        if text.is_empty() {
            text = format!("[EMPTY_{i}]");
        }
        let score = scores.and_then(|s| s[i].as_f64()).map_or(0.0, |v| v as f32);
        let a = match types.map(|t| t[i].as_i64()) {
            None => attr::NORMAL,
            Some(Some(1)) => attr::NORMAL,
            Some(Some(2)) => attr::UNKNOWN,
            Some(Some(3)) => attr::CONTROL,
            Some(Some(4)) => attr::USER_DEFINED,
            Some(Some(5)) => attr::UNUSED,
            Some(Some(6)) => attr::BYTE,
            Some(_) => attr::UNDEFINED,
        };
        max_token_len = max_token_len.max(text.len());
        token_to_id.insert(text.clone(), i as u32);
        tokens.push(TokenData {
            text,
            score,
            attr: a,
        });
    }

    let charsmap: Vec<u8> = match g.get(K_CHARSMAP) {
        Some(v) if kind == VocabType::Ugm => v
            .as_array()
            .ok_or_else(|| bad(K_CHARSMAP, "is not a byte array"))?
            .iter()
            .map(|b| b.as_i64().map(|x| x as u8))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(K_CHARSMAP, "holds a non-byte value"))?,
        _ => Vec::new(),
    };

    // special ids from metadata: an id past the vocabulary keeps the default
    let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    for id in [
        &mut special.bos,
        &mut special.eos,
        &mut special.unk,
        &mut special.sep,
        &mut special.pad,
        &mut special.mask,
    ] {
        *id = in_range(*id);
    }
    let id_keys: [(&str, IdField); 17] = [
        ("bos_token_id", |s| &mut s.bos),
        ("eos_token_id", |s| &mut s.eos),
        ("eot_token_id", |s| &mut s.eot),
        ("eom_token_id", |s| &mut s.eom),
        ("unknown_token_id", |s| &mut s.unk),
        ("seperator_token_id", |s| &mut s.sep),
        ("padding_token_id", |s| &mut s.pad),
        ("mask_token_id", |s| &mut s.mask),
        ("fim_pre_token_id", |s| &mut s.fim_pre),
        ("fim_suf_token_id", |s| &mut s.fim_suf),
        ("fim_mid_token_id", |s| &mut s.fim_mid),
        ("fim_pad_token_id", |s| &mut s.fim_pad),
        ("fim_rep_token_id", |s| &mut s.fim_rep),
        ("fim_sep_token_id", |s| &mut s.fim_sep),
        ("prefix_token_id", |s| &mut s.fim_pre),
        ("suffix_token_id", |s| &mut s.fim_suf),
        ("middle_token_id", |s| &mut s.fim_mid),
    ];
    for (key, field) in id_keys {
        if let Some(v) = g.get(&format!("tokenizer.ggml.{key}")).and_then(int_of) {
            if (0..n as i64).contains(&v) {
                *field(&mut special) = Some(v as u32);
            }
        }
    }
    if let Some(b) = get_bool("tokenizer.ggml.add_bos_token") {
        o.add_bos = b;
    }
    if let Some(b) = get_bool("tokenizer.ggml.add_eos_token") {
        o.add_eos = b;
    }
    if let Some(b) = get_bool("tokenizer.ggml.add_sep_token") {
        o.add_sep = b;
    }
    if pre == PreKind::Gemma4 {
        o.add_bos = true;
    }
    if let Some(b) = get_bool("tokenizer.ggml.normalizer.lowercase") {
        o.lowercase = b;
    }
    o.strip_accents = o.lowercase;
    if let Some(b) = get_bool("tokenizer.ggml.normalizer.strip_accents") {
        o.strip_accents = b;
    }

    let eog = detect_special_tokens(&mut tokens, &token_to_id, &mut special);
    adjust_attrs_by_model(g, &mut tokens, &token_to_id, &pre_name);

    let pretok = if kind == VocabType::Bpe {
        Some(PreTokenizer::new(pre).map_err(TokenizerError::BadPattern)?)
    } else {
        None
    };
    let ugm = if kind == VocabType::Ugm {
        Some(Ugm::new(&tokens, &charsmap).map_err(|e| bad(K_CHARSMAP, e))?)
    } else {
        None
    };
    let specials = SpecialMatcher::new(&tokens);
    let mut v = Vocab {
        kind,
        model,
        pre,
        tokens,
        token_to_id,
        bpe_ranks,
        special,
        opts: o,
        eog,
        max_token_len,
        pretok,
        specials,
        ugm,
        piece_bytes: Vec::new(),
        piece_ends: Vec::with_capacity(n),
    };
    for id in 0..n as u32 {
        let p = v.compute_piece(id);
        v.piece_bytes.extend_from_slice(&p);
        v.piece_ends.push(v.piece_bytes.len());
    }
    Ok(v)
}

/// Texts by which upstream recognises special tokens the metadata does not name.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Finds unnamed EOT/EOM/FIM tokens by text, marks control-looking tokens as control and
/// "unused" control tokens as unused, and derives the end-of-generation set. Upstream walks its
/// text -> id hash map here, so when several texts qualify for one role the pick follows that
/// map's order, which in practice visits later ids first: we take the highest id, which agrees
/// with upstream on every vocabulary we record (llama3, phi-3 and qwen2 each have two
/// candidates).
fn detect_special_tokens(
    tokens: &mut [TokenData],
    ids: &FxHashMap<String, u32>,
    s: &mut SpecialIds,
) -> BTreeSet<u32> {
    let find = |texts: &[&str]| texts.iter().filter_map(|t| ids.get(*t).copied()).max();
    let roles: [(&[&str], IdField); 8] = [
        (EOT_TEXTS, |s| &mut s.eot),
        (EOM_TEXTS, |s| &mut s.eom),
        (FIM_PRE_TEXTS, |s| &mut s.fim_pre),
        (FIM_SUF_TEXTS, |s| &mut s.fim_suf),
        (FIM_MID_TEXTS, |s| &mut s.fim_mid),
        (FIM_PAD_TEXTS, |s| &mut s.fim_pad),
        (FIM_REP_TEXTS, |s| &mut s.fim_rep),
        (FIM_SEP_TEXTS, |s| &mut s.fim_sep),
    ];
    for (texts, field) in roles {
        if field(s).is_some() {
            continue;
        }
        if let Some(id) = find(texts) {
            *field(s) = Some(id);
            tokens[id as usize].attr |= attr::CONTROL;
        }
    }
    for t in tokens.iter_mut() {
        if t.attr & attr::CONTROL != 0 && t.text.contains("unused") {
            t.attr |= attr::UNUSED;
        }
    }
    let mut eog: BTreeSet<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for id in EOG_TEXTS.iter().filter_map(|t| ids.get(*t).copied()) {
        eog.insert(id);
        tokens[id as usize].attr |= attr::CONTROL;
    }
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = ids.get(t) {
            tokens[id as usize].attr = attr::USER_DEFINED;
        }
    }
    eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());

    // harmony / solar-open: "<|end|>" ends a message, not generation
    let text_of = |id: u32| tokens[id as usize].text.as_str();
    let has = |t: &str| eog.iter().any(|&id| text_of(id) == t);
    let end_id = eog.iter().copied().find(|&id| text_of(id) == "<|end|>");
    let has_call = has("<|call|>") || has("<|calls|>");
    if let Some(end) = end_id {
        if has_call && (has("<|return|>") || has("<|flush|>")) {
            eog.remove(&end);
            tokens[end as usize].attr = attr::USER_DEFINED;
        }
    }
    // gemma4 and plamo have an ordinary "</s>"
    let text_of = |id: u32| tokens[id as usize].text.as_str();
    let normal_s = eog
        .iter()
        .any(|&id| matches!(text_of(id), "<|tool_response>" | "<|plamo:eos|>"));
    if let Some(s_id) = eog.iter().copied().find(|&id| text_of(id) == "</s>") {
        if normal_s {
            eog.remove(&s_id);
            tokens[s_id as usize].attr = attr::NORMAL;
        }
    }
    eog
}

/// Per-model attribute fixes upstream applies by model name, pre-tokenizer or architecture.
fn adjust_attrs_by_model(
    g: &GgufFile,
    tokens: &mut [TokenData],
    ids: &FxHashMap<String, u32>,
    pre: &str,
) {
    let name = g.get_str("general.name").unwrap_or("").to_ascii_lowercase();
    let arch = g.architecture().unwrap_or("");
    let pre_meta = g.get_str(K_PRE).unwrap_or(pre);
    let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
    let set = |tokens: &mut [TokenData], text: &str, a: u32, on: bool| {
        if let Some(&id) = ids.get(text) {
            let t = &mut tokens[id as usize].attr;
            *t = if on { *t | a } else { *t & !a };
        }
    };
    if contains_any(
        pre_meta,
        &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"],
    ) || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
    {
        set(tokens, "<mask>", attr::LSTRIP, true);
    } else if contains_any(&name, &["phi-3", "phi3"]) {
        let special: Vec<String> = tokens
            .iter()
            .filter(|t| t.attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .map(|t| t.text.clone())
            .collect();
        for t in &special {
            set(tokens, t, attr::RSTRIP, true);
        }
        set(tokens, "</s>", attr::RSTRIP, true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set(tokens, t, attr::RSTRIP, false);
        }
    } else if contains_any(&name, &["modern-bert"]) {
        set(tokens, "[MASK]", attr::LSTRIP, true);
    }
}
