//! BPE pre-tokenizers: the split patterns llama.cpp runs for each `tokenizer.ggml.pre`, applied in
//! sequence, each one refining the pieces the previous produced.
//!
//! Upstream runs the common patterns through hand-written scanners and everything else through
//! `std::regex` (ECMAScript) over a "collapsed" text in which each non-ASCII codepoint is replaced by
//! one stand-in character per Unicode category. We follow the same split: the scanners below
//! reproduce upstream's scanners (quirks included), and other patterns run through `fancy-regex`
//! (backtracking, lookahead) over the same collapsed text, so category decisions come from
//! upstream's own Unicode tables.

use fancy_regex::Regex;

use super::unicode::{self, Flags};

/// One split step.
enum Step {
    Gpt2,
    /// llama3 / qwen2 / qwen35 share one scanner shape.
    Llama3Like {
        max_digits: usize,
        marks: bool,
    },
    KimiK2,
    DigitGroups,
    Newlines,
    Regex {
        re: Box<Regex>,
        collapsed: bool,
    },
}

pub struct PreTokenizer {
    steps: Vec<Step>,
    /// GPT-2 byte-level encoding of each piece (false for SPM-style BPE on raw UTF-8).
    pub byte_encode: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_ORIG: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const NEWLINES: &str = r"[^\n]+|[\n]+";
const KIMI: &str = r"\p{Han}+";
const AFMOE_DIGITS: &str = r"\p{AFMoE_digits}";
const TINY_AYA_DIGITS: &str = r"\d{1,3}(?=(?:\d{3})*\b)";
const CONTRACTIONS: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

/// The split patterns of one pre-tokenizer kind, upstream's list verbatim.
pub fn patterns(kind: PreKind) -> (Vec<String>, bool) {
    use PreKind::*;
    let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let gpt4o_words = |mark: &str| {
        format!(
            r"[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}{mark}])([^a-z]))*((?=[\p{{L}}{mark}])([^A-Z]))+{c}?|[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}{mark}])([^a-z]))+((?=[\p{{L}}{mark}])([^A-Z]))*{c}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            c = CONTRACTIONS
        )
    };
    let deepseek3_words = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
    let case_words = format!(
        r"[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]*[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]+{c}?|[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]+[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]*{c}?",
        c = CONTRACTIONS
    );
    let list = match kind {
        Llama3 | Dbrx | Smaug => s(&[LLAMA3]),
        Jais2 => s(&[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
        ]),
        DeepseekLlm => s(&[
            "[\r\n]",
            "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
            "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
            r"\s+$",
            "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
            r"\p{N}+",
        ]),
        Deepseek3Llm | HunyuanDense | JoyaiLlm | HyV4 => {
            s(&[r"\p{N}{1,3}", "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+", deepseek3_words])
        }
        Spark25 => s(&[
            r"\p{N}{1,3}",
            "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
            r"\p{N}",
        ]),
        Youtu => vec![
            "[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+".to_string(),
            format!(
                r"{case_words}|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ),
        ],
        DeepseekCoder => s(&[
            "[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
            r"\p{N}",
        ]),
        Falcon => s(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        Starcoder | Refact | CommandR | Smollm | Codeshell | Exaone | Minerva | Mellum2 => {
            s(&[r"\p{N}", GPT2])
        }
        Gpt2 | Mpt | Olmo | Jais | Trillion | GraniteDocling => s(&[GPT2]),
        Stablelm2 | Qwen2 | Hunyuan | SolarOpen | Grok2 => s(&[QWEN2]),
        Qwen35 => s(&[QWEN35]),
        Poro | Bloom | Gpt3Finnish => s(&[" ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+"]),
        Chatglm4 => s(&[LLAMA3]),
        Viking => s(&[" ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+", r"\p{N}"]),
        Tekken => s(&[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ]),
        Chameleon => s(&[
            "<sentinel:[0-9]+>",
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            "([\\t\\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            GPT2,
        ]),
        Gpt4o | MinimaxM2 => vec![gpt4o_words("")],
        GraniteEmbMulti => vec![gpt4o_words(r"\p{M}")],
        TinyAya => vec![
            TINY_AYA_DIGITS.to_string(),
            format!(
                r"{case_words}|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ),
        ],
        KimiK2 => s(&[KIMI]),
        Superbpe => s(&[r"\p{N}+", r"(?=(\d{3})+(?!\d))"]),
        Bailingmoe => s(&[
            r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        ]),
        SeedCoder => s(&[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        ]),
        Ufakzeka => s(&[
            r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ]),
        Afmoe => s(&[
            AFMOE_DIGITS,
            "[\u{4E00}-\u{9FFF}\u{3400}-\u{4DBF}\u{8C48}-\u{FAFF}\u{3040}-\u{309F}\u{30A0}-\u{30FF}\u{FF65}-\u{FF9F}\u{2F00}-\u{2FDF}\u{E40}-\u{E7F}\u{E80}-\u{EFF}\u{1780}-\u{17FF}\u{1000}-\u{109F}\u{AA60}-\u{AA7F}\u{A9E0}-\u{A9FF}\u{AC00}-\u{D7AF}\u{1100}-\u{11FF}]+",
            deepseek3_words,
        ]),
        Laguna => s(&[NEWLINES, QWEN2]),
        ExaoneMoe => s(&[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        ]),
        Gemma4 | SarvamMoe | Mmbert => return (s(&[NEWLINES]), false),
        Minicpm5 => s(&[
            r"\p{N}{1,3}",
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ]),
        Whitespace => return (s(&[r"\S+"]), false),
        Default => s(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
    };
    (list, true)
}

/// Pre-tokenizer kinds llama.cpp distinguishes (`LLAMA_VOCAB_PRE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreKind {
    Default,
    Llama3,
    Jais2,
    Dbrx,
    Smaug,
    DeepseekLlm,
    Deepseek3Llm,
    HunyuanDense,
    JoyaiLlm,
    HyV4,
    Spark25,
    Youtu,
    DeepseekCoder,
    Falcon,
    Starcoder,
    Refact,
    CommandR,
    Smollm,
    Codeshell,
    Exaone,
    Minerva,
    Mellum2,
    Gpt2,
    Mpt,
    Olmo,
    Jais,
    Trillion,
    GraniteDocling,
    Stablelm2,
    Qwen2,
    Hunyuan,
    SolarOpen,
    Qwen35,
    Poro,
    Bloom,
    Gpt3Finnish,
    Chatglm4,
    Viking,
    Tekken,
    Chameleon,
    Gpt4o,
    MinimaxM2,
    GraniteEmbMulti,
    TinyAya,
    KimiK2,
    Superbpe,
    Bailingmoe,
    SeedCoder,
    Ufakzeka,
    Grok2,
    Afmoe,
    Laguna,
    ExaoneMoe,
    Gemma4,
    SarvamMoe,
    Mmbert,
    Minicpm5,
    Whitespace,
}

impl PreTokenizer {
    pub fn new(kind: PreKind) -> Result<PreTokenizer, String> {
        let (pats, byte_encode) = patterns(kind);
        let steps = pats
            .iter()
            .map(|p| Step::compile(p))
            .collect::<Result<_, _>>()?;
        Ok(PreTokenizer { steps, byte_encode })
    }

    /// Splits `text` into pieces; with `byte_encode`, each piece is written in GPT-2's byte alphabet.
    pub fn split(&self, text: &str) -> Vec<String> {
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let mut offsets = vec![cpts.len()];
        for step in &self.steps {
            offsets = step.apply(&cpts, &offsets);
        }
        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for len in offsets {
            let piece = &cpts[start..start + len];
            start += len;
            let mut w = String::new();
            for &c in piece {
                let ch = char::from_u32(c).unwrap_or('\u{FFFD}');
                if self.byte_encode {
                    let mut buf = [0u8; 4];
                    for &b in ch.encode_utf8(&mut buf).as_bytes() {
                        w.push(char::from_u32(unicode::byte_to_cpt(b)).unwrap_or('\u{FFFD}'));
                    }
                } else {
                    w.push(ch);
                }
            }
            words.push(w);
        }
        words
    }
}

impl Step {
    fn compile(pat: &str) -> Result<Step, String> {
        Ok(match pat {
            GPT2 => Step::Gpt2,
            LLAMA3 | LLAMA3_ORIG => Step::Llama3Like {
                max_digits: 3,
                marks: false,
            },
            QWEN2 => Step::Llama3Like {
                max_digits: 1,
                marks: false,
            },
            QWEN35 => Step::Llama3Like {
                max_digits: 1,
                marks: true,
            },
            KIMI => Step::KimiK2,
            AFMOE_DIGITS | TINY_AYA_DIGITS => Step::DigitGroups,
            NEWLINES => Step::Newlines,
            _ => {
                let collapsed = CATEGORIES.iter().any(|(name, _, _)| pat.contains(name));
                let translated = if collapsed {
                    if !pat.is_ascii() {
                        return Err(format!(
                            "pattern {pat:?} mixes Unicode categories with non-ASCII characters"
                        ));
                    }
                    collapse_pattern(pat)
                } else {
                    pat.to_string()
                };
                let re = Regex::new(&translated)
                    .map_err(|e| format!("pattern {pat:?} (as {translated:?}): {e}"))?;
                Step::Regex {
                    re: Box::new(re),
                    collapsed,
                }
            }
        })
    }

    fn apply(&self, cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
        let mut out = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for &len in offsets {
            let s = Scan {
                cpts,
                ini: start,
                end: start + len,
            };
            match self {
                Step::Gpt2 => split_gpt2(&s, &mut out),
                &Step::Llama3Like { max_digits, marks } => {
                    split_llama3(&s, &mut out, max_digits, marks)
                }
                Step::KimiK2 => split_kimi(&s, &mut out),
                Step::DigitGroups => split_digit_groups(&s, &mut out),
                Step::Newlines => split_newlines(&s, &mut out),
                Step::Regex { re, collapsed } => split_regex(re, *collapsed, &s, &mut out),
            }
            start += len;
        }
        out
    }
}

/// Unicode categories upstream rewrites into stand-in characters: (pattern name, stand-in, the
/// ASCII members of that category).
const CATEGORIES: [(&str, char, &str); 10] = [
    (r"\p{N}", '\u{D1}', "0-9"),
    (r"\p{L}", '\u{D2}', "A-Za-z"),
    (r"\p{P}", '\u{D3}', r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
    (r"\p{M}", '\u{D4}', ""),
    (r"\p{S}", '\u{D5}', r"\$\+<=>\^`\|~"),
    (r"\p{Lu}", '\u{D2}', "A-Za-z"),
    (r"\p{Ll}", '\u{D2}', "A-Za-z"),
    (r"\p{Lt}", '\u{D2}', "A-Za-z"),
    (r"\p{Lm}", '\u{D2}', "A-Za-z"),
    (r"\p{Lo}", '\u{D2}', "A-Za-z"),
];

/// Rewrites `\p{..}` into classes over the collapsed alphabet, tracking `[...]` as upstream does.
fn collapse_pattern(pat: &str) -> String {
    let b = pat.as_bytes();
    let mut out = String::new();
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if c == b'\\' && b.get(i + 1) == Some(&b'p') && b.get(i + 2) == Some(&b'{') {
            if let Some(close) = pat[i..].find('}').map(|k| k + i) {
                let name = &pat[i..=close];
                if let Some((_, stand_in, ascii)) = CATEGORIES.iter().find(|(n, _, _)| *n == name) {
                    if !inside {
                        out.push('[');
                    }
                    out.push(*stand_in);
                    out.push_str(ascii);
                    if !inside {
                        out.push(']');
                    }
                    i = close + 1;
                    continue;
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    out
}

/// The character a codepoint becomes in the text a regex step runs over.
fn regex_char(cpt: u32, collapsed: bool) -> char {
    if cpt < 128 {
        return cpt as u8 as char;
    }
    let f = unicode::flags(cpt);
    if f.is_whitespace() {
        // std::regex's \s knows only ASCII whitespace; upstream substitutes vertical tab
        return '\u{0B}';
    }
    if !collapsed {
        return char::from_u32(cpt).unwrap_or('\u{FFFD}');
    }
    match f.category() {
        Flags::NUMBER => '\u{D1}',
        Flags::LETTER => '\u{D2}',
        Flags::PUNCTUATION => '\u{D3}',
        Flags::ACCENT_MARK => '\u{D4}',
        Flags::SYMBOL => '\u{D5}',
        _ => '\u{D0}',
    }
}

fn split_regex(re: &Regex, collapsed: bool, s: &Scan, out: &mut Vec<usize>) {
    let text: String = s.cpts[s.ini..s.end]
        .iter()
        .map(|&c| regex_char(c, collapsed))
        .collect();
    let count = |a: usize, b: usize| text[a..b].chars().count();
    let mut pos = 0;
    let mut last = 0;
    while pos <= text.len() {
        let m = match re.find_from_pos(&text, pos) {
            Ok(Some(m)) => m,
            _ => break,
        };
        if m.start() > last {
            out.push(count(last, m.start()));
        }
        out.push(count(m.start(), m.end()));
        last = m.end();
        pos = if m.start() == m.end() {
            match text[m.end()..].chars().next() {
                Some(ch) => m.end() + ch.len_utf8(),
                None => break,
            }
        } else {
            m.end()
        };
    }
    if last < text.len() {
        out.push(count(last, text.len()));
    }
}

/// A view of one piece: positions outside it read as "no codepoint, no flags".
struct Scan<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
}

const OUT_OF_RANGE: u32 = u32::MAX;

impl Scan<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            unicode::flags(self.cpts[pos])
        } else {
            Flags(0)
        }
    }
}

/// Emits pieces ending at the given positions, skipping empty ones.
struct Emit<'o> {
    out: &'o mut Vec<usize>,
    prev: usize,
}

impl Emit<'_> {
    fn to(&mut self, end: usize) -> usize {
        let len = end - self.prev;
        if len > 0 {
            self.out.push(len);
        }
        self.prev = end;
        len
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-folded when `fold`): the length matched.
fn contraction(s: &Scan, pos: usize, fold: bool) -> usize {
    if s.cpt(pos) != '\'' as u32 || pos + 1 >= s.end {
        return 0;
    }
    let low = |c: u32| if fold { unicode::to_lower(c) } else { c };
    let n1 = low(s.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&c| n1 == c as u32) {
        return 2;
    }
    if pos + 2 < s.end {
        let n2 = low(s.cpt(pos + 2));
        let pair = |a: u8, b: u8| n1 == a as u32 && n2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return 3;
        }
    }
    0
}

/// Whitespace run at `pos`: (count, position after the last \r or \n in it, or 0).
fn whitespace_run(s: &Scan, pos: usize) -> (usize, usize) {
    let mut n = 0;
    let mut last_nl = 0;
    while s.flags(pos + n).is_whitespace() {
        let c = s.cpt(pos + n);
        if c == '\r' as u32 || c == '\n' as u32 {
            last_nl = pos + n + 1;
        }
        n += 1;
    }
    (n, last_nl)
}

fn split_gpt2(s: &Scan, out: &mut Vec<usize>) {
    let mut e = Emit { out, prev: s.ini };
    let mut pos = s.ini;
    while pos < s.end {
        let cpt = s.cpt(pos);
        let n = contraction(s, pos, false);
        if n > 0 {
            pos += e.to(pos + n);
            continue;
        }
        let space = cpt == ' ' as u32;
        let mut f2 = if space {
            s.flags(pos + 1)
        } else {
            s.flags(pos)
        };
        if f2.is_letter() {
            pos += space as usize;
            while f2.is_letter() {
                pos += 1;
                f2 = s.flags(pos);
            }
            e.to(pos);
            continue;
        }
        if f2.is_number() {
            pos += space as usize;
            while f2.is_number() {
                pos += 1;
                f2 = s.flags(pos);
            }
            e.to(pos);
            continue;
        }
        let other = |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
        if other(f2) {
            pos += space as usize;
            while other(f2) {
                pos += 1;
                f2 = s.flags(pos);
            }
            e.to(pos);
            continue;
        }
        let (nws, _) = whitespace_run(s, pos);
        if nws > 1 && s.cpt(pos + nws) != OUT_OF_RANGE {
            pos += nws - 1;
            e.to(pos);
            continue;
        }
        if nws > 0 {
            pos += nws;
            e.to(pos);
            continue;
        }
        pos += 1;
        e.to(pos);
    }
}

/// Upstream's llama3 scanner; qwen2 is the same with single digits, qwen35 also lets combining
/// marks join letter runs.
fn split_llama3(s: &Scan, out: &mut Vec<usize>, max_digits: usize, marks: bool) {
    let mut e = Emit { out, prev: s.ini };
    let wordish = |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
    let mut pos = s.ini;
    while pos < s.end {
        let cpt = s.cpt(pos);
        let flags = s.flags(pos);
        let n = contraction(s, pos, true);
        if n > 0 {
            pos += e.to(pos + n);
            continue;
        }
        if !(cpt == '\r' as u32 || cpt == '\n' as u32 || flags.is_number())
            && (wordish(flags) || wordish(s.flags(pos + 1)))
        {
            pos += 1;
            while wordish(s.flags(pos)) {
                pos += 1;
            }
            e.to(pos);
            continue;
        }
        if flags.is_number() {
            let mut ini = pos;
            while s.flags(pos).is_number() {
                pos += 1;
                if pos - ini >= max_digits {
                    e.to(pos);
                    ini = pos;
                }
            }
            e.to(pos);
            continue;
        }
        let space = cpt == ' ' as u32;
        let mut f2 = if space { s.flags(pos + 1) } else { flags };
        let other = |f: Flags| {
            !(f.is_whitespace() || f.is_letter() || f.is_number() || (marks && f.is_accent_mark()))
        };
        if other(f2) && flags.any() {
            pos += space as usize;
            while other(f2) && f2.any() {
                pos += 1;
                f2 = s.flags(pos);
            }
            while s.cpt(pos) == '\r' as u32 || s.cpt(pos) == '\n' as u32 {
                pos += 1;
            }
            e.to(pos);
            continue;
        }
        let (nws, last_nl) = whitespace_run(s, pos);
        if last_nl > 0 {
            pos = last_nl;
            e.to(pos);
            continue;
        }
        if nws > 1 && s.cpt(pos + nws) != OUT_OF_RANGE {
            pos += nws - 1;
            e.to(pos);
            continue;
        }
        if nws > 0 {
            pos += nws;
            e.to(pos);
            continue;
        }
        pos += 1;
        e.to(pos);
    }
}

fn split_kimi(s: &Scan, out: &mut Vec<usize>) {
    let mut e = Emit { out, prev: s.ini };
    let letter = |p: usize| s.flags(p).is_letter() && !unicode::is_han(s.cpt(p));
    let mut pos = s.ini;
    while pos < s.end {
        let cpt = s.cpt(pos);
        let flags = s.flags(pos);
        if unicode::is_han(cpt) {
            while unicode::is_han(s.cpt(pos)) {
                pos += 1;
            }
            e.to(pos);
            continue;
        }
        let leading_ok =
            !(cpt == '\r' as u32 || cpt == '\n' as u32 || flags.is_letter() || flags.is_number());
        if letter(pos) || (leading_ok && letter(pos + 1)) {
            let mut has_leading = false;
            if leading_ok {
                has_leading = true;
                pos += 1;
            }
            let mut has_letters = false;
            while letter(pos) {
                has_letters = true;
                pos += 1;
            }
            if has_letters || (!has_leading && letter(pos)) {
                if !has_letters {
                    pos += 1;
                }
                while letter(pos) {
                    pos += 1;
                }
                pos += contraction(s, pos, true);
                e.to(pos);
                continue;
            } else if has_leading {
                pos -= 1;
            }
        }
        if flags.is_number() {
            let mut ini = pos;
            while s.flags(pos).is_number() {
                pos += 1;
                if pos - ini >= 3 {
                    e.to(pos);
                    ini = pos;
                }
            }
            e.to(pos);
            continue;
        }
        let space = cpt == ' ' as u32;
        let mut f2 = if space { s.flags(pos + 1) } else { flags };
        let other = |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
        if other(f2) {
            pos += space as usize;
            while other(f2) {
                pos += 1;
                f2 = s.flags(pos);
            }
            while s.cpt(pos) == '\r' as u32 || s.cpt(pos) == '\n' as u32 {
                pos += 1;
            }
            e.to(pos);
            continue;
        }
        let (nws, last_nl) = whitespace_run(s, pos);
        if last_nl > 0 {
            pos = last_nl;
            e.to(pos);
            continue;
        }
        if nws > 1 && s.cpt(pos + nws) != OUT_OF_RANGE {
            pos += nws - 1;
            e.to(pos);
            continue;
        }
        if nws > 0 {
            pos += nws;
            e.to(pos);
            continue;
        }
        pos += 1;
        e.to(pos);
    }
}

/// Digit runs split into groups of three from the right; everything else left in one piece.
fn split_digit_groups(s: &Scan, out: &mut Vec<usize>) {
    let mut e = Emit { out, prev: s.ini };
    let mut pos = s.ini;
    while pos < s.end {
        if s.flags(pos).is_number() {
            let start = pos;
            while pos < s.end && s.flags(pos).is_number() {
                pos += 1;
            }
            let count = pos - start;
            let mut cur = start;
            if !count.is_multiple_of(3) {
                cur += count % 3;
                e.to(cur);
            }
            while cur < pos {
                cur += 3;
                e.to(cur);
            }
            continue;
        }
        pos += 1;
    }
    if e.prev < s.end {
        e.to(s.end);
    }
}

fn split_newlines(s: &Scan, out: &mut Vec<usize>) {
    let mut pos = s.ini;
    while pos < s.end {
        let nl = s.cpts[pos] == '\n' as u32;
        let start = pos;
        while pos < s.end && (s.cpts[pos] == '\n' as u32) == nl {
            pos += 1;
        }
        out.push(pos - start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(kind: PreKind, text: &str) -> Vec<String> {
        let mut p = PreTokenizer::new(kind).unwrap();
        p.byte_encode = false;
        p.split(text)
    }

    #[test]
    fn every_kind_compiles() {
        use PreKind::*;
        for k in [
            Default,
            Llama3,
            Jais2,
            Dbrx,
            Smaug,
            DeepseekLlm,
            Deepseek3Llm,
            HunyuanDense,
            JoyaiLlm,
            HyV4,
            Spark25,
            Youtu,
            DeepseekCoder,
            Falcon,
            Starcoder,
            Refact,
            CommandR,
            Smollm,
            Codeshell,
            Exaone,
            Minerva,
            Mellum2,
            Gpt2,
            Mpt,
            Olmo,
            Jais,
            Trillion,
            GraniteDocling,
            Stablelm2,
            Qwen2,
            Hunyuan,
            SolarOpen,
            Qwen35,
            Poro,
            Bloom,
            Gpt3Finnish,
            Chatglm4,
            Viking,
            Tekken,
            Chameleon,
            Gpt4o,
            MinimaxM2,
            GraniteEmbMulti,
            TinyAya,
            KimiK2,
            Superbpe,
            Bailingmoe,
            SeedCoder,
            Ufakzeka,
            Grok2,
            Afmoe,
            Laguna,
            ExaoneMoe,
            Gemma4,
            SarvamMoe,
            Mmbert,
            Minicpm5,
            Whitespace,
        ] {
            let p = PreTokenizer::new(k).unwrap_or_else(|e| panic!("{k:?}: {e}"));
            assert!(
                !p.split("Hello world 123 ¿qué? 你好\n\n").is_empty(),
                "{k:?}"
            );
        }
    }

    #[test]
    fn gpt2_and_llama3_split_like_upstream() {
        assert_eq!(
            words(PreKind::Gpt2, "Hello world's  12345 !!"),
            ["Hello", " world", "'s", " ", " 12345", " !!"]
        );
        assert_eq!(
            words(PreKind::Llama3, "Hello world's  12345 !!\n\n x"),
            ["Hello", " world", "'s", " ", " ", "123", "45", " !!\n\n", " x"]
        );
        assert_eq!(words(PreKind::Default, "a+b"), ["a", "+", "b"]);
    }
}
