//! The built-in chat formats used when Jinja is off (`--no-jinja`): upstream's fixed renderings
//! of plain (role, content) messages, picked by name (`--chat-template gemma`) or by recognising
//! a family from marker strings in a Jinja template's text, checked in upstream's order.
//!
//! Owns: the table of names, family detection, rendering. Must not: run Jinja, or know about
//! tools, reasoning or HTTP (callers refuse what this path cannot carry).

/// One built-in format. `Dots1` has no name: it is only ever detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    ChatMl,
    Llama2,
    Llama2Sys,
    Llama2SysBos,
    Llama2SysStrip,
    MistralV1,
    MistralV3,
    MistralV3Tekken,
    MistralV7,
    MistralV7Tekken,
    Phi3,
    Phi4,
    Falcon3,
    Zephyr,
    Monarch,
    Gemma,
    Orion,
    OpenChat,
    Vicuna,
    VicunaOrca,
    Deepseek,
    Deepseek2,
    Deepseek3,
    DeepseekOcr,
    CommandR,
    Llama3,
    ChatGlm3,
    ChatGlm4,
    GlmEdge,
    MiniCpm,
    Exaone3,
    Exaone4,
    ExaoneMoe,
    RwkvWorld,
    Granite3,
    Granite40,
    Granite41,
    GigaChat,
    Megrez,
    Yandex,
    Bailing,
    BailingThink,
    Bailing2,
    Llama4,
    SmolVlm,
    Dots1,
    HunyuanMoe,
    GptOss,
    HunyuanDense,
    HunyuanVl,
    KimiK2,
    SeedOss,
    Grok2,
    PanguEmbedded,
    SolarOpen,
}

/// The names `--chat-template` accepts without Jinja, sorted as upstream lists them.
const NAMES: &[(&str, Format)] = &[
    ("bailing", Format::Bailing),
    ("bailing-think", Format::BailingThink),
    ("bailing2", Format::Bailing2),
    ("chatglm3", Format::ChatGlm3),
    ("chatglm4", Format::ChatGlm4),
    ("chatml", Format::ChatMl),
    ("command-r", Format::CommandR),
    ("deepseek", Format::Deepseek),
    ("deepseek-ocr", Format::DeepseekOcr),
    ("deepseek2", Format::Deepseek2),
    ("deepseek3", Format::Deepseek3),
    ("exaone-moe", Format::ExaoneMoe),
    ("exaone3", Format::Exaone3),
    ("exaone4", Format::Exaone4),
    ("falcon3", Format::Falcon3),
    ("gemma", Format::Gemma),
    ("gigachat", Format::GigaChat),
    ("glmedge", Format::GlmEdge),
    ("gpt-oss", Format::GptOss),
    ("granite", Format::Granite3),
    ("granite-4.0", Format::Granite40),
    ("granite-4.1", Format::Granite41),
    ("grok-2", Format::Grok2),
    ("hunyuan-dense", Format::HunyuanDense),
    ("hunyuan-moe", Format::HunyuanMoe),
    ("hunyuan-vl", Format::HunyuanVl),
    ("kimi-k2", Format::KimiK2),
    ("llama2", Format::Llama2),
    ("llama2-sys", Format::Llama2Sys),
    ("llama2-sys-bos", Format::Llama2SysBos),
    ("llama2-sys-strip", Format::Llama2SysStrip),
    ("llama3", Format::Llama3),
    ("llama4", Format::Llama4),
    ("megrez", Format::Megrez),
    ("minicpm", Format::MiniCpm),
    ("mistral-v1", Format::MistralV1),
    ("mistral-v3", Format::MistralV3),
    ("mistral-v3-tekken", Format::MistralV3Tekken),
    ("mistral-v7", Format::MistralV7),
    ("mistral-v7-tekken", Format::MistralV7Tekken),
    ("monarch", Format::Monarch),
    ("openchat", Format::OpenChat),
    ("orion", Format::Orion),
    ("pangu-embedded", Format::PanguEmbedded),
    ("phi3", Format::Phi3),
    ("phi4", Format::Phi4),
    ("rwkv-world", Format::RwkvWorld),
    ("seed_oss", Format::SeedOss),
    ("smolvlm", Format::SmolVlm),
    ("solar-open", Format::SolarOpen),
    ("vicuna", Format::Vicuna),
    ("vicuna-orca", Format::VicunaOrca),
    ("yandex", Format::Yandex),
    ("zephyr", Format::Zephyr),
];

/// What a chat request gets when its template has no built-in format (upstream's words).
pub const UNSUPPORTED: &str = "this custom template is not supported, try using --jinja";

/// The built-in names, in upstream's order.
pub fn names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().map(|(name, _)| *name)
}

/// Refuses a `--chat-template` value (a name or template text) that has no built-in format,
/// with the message upstream prints before exiting.
pub fn check_override(template: &str) -> Result<(), String> {
    match Format::detect(template) {
        Some(_) => Ok(()),
        None => Err(format!(
            "error: the supplied chat template is not supported: {template}\n\
             note: llama.cpp was started without --jinja, we only support commonly used templates\n"
        )),
    }
}

/// Upstream passes strings as C strings: anything after a NUL is not seen.
fn c_str(s: &str) -> &str {
    s.split('\0').next().unwrap_or_default()
}

/// Trims the C locale's white space (`isspace`), not Unicode's.
fn c_trim(s: &str) -> &str {
    s.trim_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r'])
}

impl Format {
    pub fn from_name(name: &str) -> Option<Format> {
        NAMES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    /// The format for a name or for a template's text, as upstream decides it: an exact name
    /// first, then marker strings in a fixed order (the first family that matches wins).
    pub fn detect(template: &str) -> Option<Format> {
        let t = c_str(template);
        if let Some(format) = Format::from_name(t) {
            return Some(format);
        }
        let has = |needle: &str| t.contains(needle);
        let all = |needles: &[&str]| needles.iter().all(|n| t.contains(n));
        let format = if has("<|im_start|>") {
            if has("<|im_sep|>") {
                Format::Phi4
            } else if has("<end_of_utterance>") {
                // SmolVLM starts with <|im_start|> but is not ChatML
                Format::SmolVlm
            } else {
                Format::ChatMl
            }
        } else if t.starts_with("mistral") || has("[INST]") {
            if has("[SYSTEM_PROMPT]") {
                Format::MistralV7
            } else if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
                if has(" [INST]") {
                    Format::MistralV1
                } else if has("\"[INST]\"") {
                    Format::MistralV3Tekken
                } else {
                    Format::MistralV3
                }
            } else if has("content.strip()") {
                Format::Llama2SysStrip
            } else if has("bos_token + '[INST]") {
                Format::Llama2SysBos
            } else if has("<<SYS>>") {
                Format::Llama2Sys
            } else {
                Format::Llama2
            }
        } else if all(&["<|assistant|>", "<|end|>"]) {
            Format::Phi3
        } else if has("[gMASK]<sop>") {
            Format::ChatGlm4
        } else if all(&["<|assistant|>", "<|user|>"]) {
            if has("<|tool_declare|>") {
                Format::ExaoneMoe
            } else if has("</s>") {
                Format::Falcon3
            } else {
                Format::GlmEdge
            }
        } else if all(&["<|{{ item['role'] }}|>", "<|begin_of_image|>"]) {
            Format::GlmEdge
        } else if all(&["<|user|>", "<|endoftext|>"]) {
            Format::Zephyr
        } else if has("bos_token + message['role']") {
            Format::Monarch
        } else if has("<start_of_turn>") {
            Format::Gemma
        } else if has("'\\n\\nAssistant: ' + eos_token") {
            Format::Orion
        } else if has("GPT4 Correct ") {
            Format::OpenChat
        } else if all(&["USER: ", "ASSISTANT: "]) {
            if has("SYSTEM: ") {
                Format::VicunaOrca
            } else {
                Format::Vicuna
            }
        } else if all(&["### Instruction:", "<|EOT|>"]) {
            Format::Deepseek
        } else if all(&["<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"]) {
            Format::CommandR
        } else if all(&["<|start_header_id|>", "<|end_header_id|>"]) {
            Format::Llama3
        } else if has("[gMASK]sop") {
            Format::ChatGlm3
        } else if has("<用户>") {
            Format::MiniCpm
        } else if has("'Assistant: ' + message['content'] + eos_token") {
            Format::Deepseek2
        } else if all(&["<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"]) {
            Format::Deepseek3
        } else if all(&["[|system|]", "[|assistant|]", "[|endofturn|]"]) {
            if has("[|tool|]") {
                Format::Exaone4
            } else {
                Format::Exaone3
            }
        } else if has("rwkv-world") || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}")
        {
            Format::RwkvWorld
        } else if has("<|start_of_role|>") {
            if has("<tool_call>") || has("<tools>") {
                if has("g4_default_system_message") {
                    Format::Granite40
                } else {
                    Format::Granite41
                }
            } else {
                Format::Granite3
            }
        } else if has(
            "message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]",
        ) {
            Format::GigaChat
        } else if has("<|role_start|>") {
            Format::Megrez
        } else if has(" Ассистент:") {
            Format::Yandex
        } else if all(&["<role>ASSISTANT</role>", "'HUMAN'"]) {
            Format::Bailing
        } else if all(&["<role>ASSISTANT</role>", "\"HUMAN\"", "<think>"]) {
            Format::BailingThink
        } else if all(&["<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"]) {
            Format::Bailing2
        } else if all(&["<|header_start|>", "<|header_end|>"]) {
            Format::Llama4
        } else if has("<|endofuserprompt|>") {
            Format::Dots1
        } else if all(&["<|extra_0|>", "<|extra_4|>"]) {
            Format::HunyuanMoe
        } else if all(&["<|start|>", "<|channel|>"]) {
            Format::GptOss
        } else if all(&["<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"]) {
            Format::HunyuanVl
        } else if all(&["<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"]) {
            Format::HunyuanDense
        } else if has("<|im_assistant|>assistant<|im_middle|>") {
            Format::KimiK2
        } else if has("<seed:bos>") {
            Format::SeedOss
        } else if has("'Assistant: '  + message['content'] + '<|separator|>") {
            Format::Grok2
        } else if has("[unused9]系统：[unused10]") {
            Format::PanguEmbedded
        } else if all(&["<|begin|>", "<|end|>", "<|content|>"]) {
            Format::SolarOpen
        } else {
            return None;
        };
        Some(format)
    }

    /// Renders `(role, content)` messages; `add_generation_prompt` opens the assistant's turn
    /// where the format has a way to (some formats always or never do).
    pub fn render(self, messages: &[(&str, &str)], add_generation_prompt: bool) -> String {
        let chat: Vec<(&str, &str)> = messages
            .iter()
            .map(|(role, content)| (c_str(role), c_str(content)))
            .collect();
        let mut out = String::new();
        let opening = self.render_turns(&chat, &mut out);
        if add_generation_prompt {
            out.push_str(opening);
        }
        out
    }

    /// Writes the messages; returns what opens the assistant's turn ("" where the format has
    /// none).
    fn render_turns(self, chat: &[(&str, &str)], out: &mut String) -> &'static str {
        use Format::*;
        match self {
            ChatMl => {
                for (role, content) in chat {
                    push_all(out, &["<|im_start|>", role, "\n", content, "<|im_end|>\n"]);
                }
                "<|im_start|>assistant\n"
            }
            MistralV7 | MistralV7Tekken => {
                let space = if self == MistralV7 { " " } else { "" };
                for (role, content) in chat {
                    match *role {
                        "system" => push_all(
                            out,
                            &["[SYSTEM_PROMPT]", space, content, "[/SYSTEM_PROMPT]"],
                        ),
                        "user" => push_all(out, &["[INST]", space, content, "[/INST]"]),
                        _ => push_all(out, &[space, content, "</s>"]),
                    }
                }
                ""
            }
            MistralV1 | MistralV3 | MistralV3Tekken => {
                let leading = if self == MistralV1 { " " } else { "" };
                let trailing = if self == MistralV3Tekken { "" } else { " " };
                let mut inside_turn = false;
                for (role, content) in chat {
                    if !inside_turn {
                        push_all(out, &[leading, "[INST]", trailing]);
                        inside_turn = true;
                    }
                    match *role {
                        "system" => push_all(out, &[content, "\n\n"]),
                        "user" => push_all(out, &[content, leading, "[/INST]"]),
                        _ => {
                            let text = if self == MistralV3 {
                                c_trim(content)
                            } else {
                                content
                            };
                            push_all(out, &[trailing, text, "</s>"]);
                            inside_turn = false;
                        }
                    }
                }
                ""
            }
            Llama2 | Llama2Sys | Llama2SysBos | Llama2SysStrip => {
                // the first turn opens without a BOS; later ones may carry one
                out.push_str("[INST] ");
                let mut inside_turn = true;
                for (role, content) in chat {
                    let content = if self == Llama2SysStrip {
                        c_trim(content)
                    } else {
                        content
                    };
                    if !inside_turn {
                        inside_turn = true;
                        out.push_str(if self == Llama2SysBos {
                            "<s>[INST] "
                        } else {
                            "[INST] "
                        });
                    }
                    match *role {
                        // without system support the text still goes first, unmarked
                        "system" if self == Llama2 => push_all(out, &[content, "\n"]),
                        "system" => push_all(out, &["<<SYS>>\n", content, "\n<</SYS>>\n\n"]),
                        "user" => push_all(out, &[content, " [/INST]"]),
                        _ => {
                            push_all(out, &[content, "</s>"]);
                            inside_turn = false;
                        }
                    }
                }
                ""
            }
            Phi3 => {
                for (role, content) in chat {
                    push_all(out, &["<|", role, "|>\n", content, "<|end|>\n"]);
                }
                "<|assistant|>\n"
            }
            Phi4 => {
                for (role, content) in chat {
                    push_all(
                        out,
                        &["<|im_start|>", role, "<|im_sep|>", content, "<|im_end|>"],
                    );
                }
                "<|im_start|>assistant<|im_sep|>"
            }
            Falcon3 => {
                for (role, content) in chat {
                    push_all(out, &["<|", role, "|>\n", content, "\n"]);
                }
                "<|assistant|>\n"
            }
            Zephyr => {
                for (role, content) in chat {
                    push_all(out, &["<|", role, "|>\n", content, "<|endoftext|>\n"]);
                }
                "<|assistant|>\n"
            }
            Monarch => {
                for (i, (role, content)) in chat.iter().enumerate() {
                    let bos = if i == 0 { "" } else { "<s>" };
                    push_all(out, &[bos, role, "\n", content, "</s>\n"]);
                }
                "<s>assistant\n"
            }
            Gemma => {
                // no system turn: system text is held and put before the next non-model turn
                let mut system = String::new();
                for (role, content) in chat {
                    if *role == "system" {
                        system.push_str(c_trim(content));
                        continue;
                    }
                    let role = if *role == "assistant" { "model" } else { role };
                    push_all(out, &["<start_of_turn>", role, "\n"]);
                    if !system.is_empty() && role != "model" {
                        push_all(out, &[&system, "\n\n"]);
                        system.clear();
                    }
                    push_all(out, &[c_trim(content), "<end_of_turn>\n"]);
                }
                "<start_of_turn>model\n"
            }
            Orion => {
                let mut system = String::new();
                for (role, content) in chat {
                    match *role {
                        "system" => system.push_str(content),
                        "user" => {
                            out.push_str("Human: ");
                            if !system.is_empty() {
                                push_all(out, &[&system, "\n\n"]);
                                system.clear();
                            }
                            push_all(out, &[content, "\n\nAssistant: </s>"]);
                        }
                        _ => push_all(out, &[content, "</s>"]),
                    }
                }
                ""
            }
            OpenChat => {
                for (role, content) in chat {
                    if *role == "system" {
                        push_all(out, &[content, "<|end_of_turn|>"]);
                    } else {
                        let mut chars = role.chars();
                        let first = chars.next().map(|c| c.to_ascii_uppercase());
                        out.push_str("GPT4 Correct ");
                        out.extend(first);
                        push_all(out, &[chars.as_str(), ": ", content, "<|end_of_turn|>"]);
                    }
                }
                "GPT4 Correct Assistant:"
            }
            Vicuna | VicunaOrca => {
                for (role, content) in chat {
                    match *role {
                        "system" if self == VicunaOrca => {
                            push_all(out, &["SYSTEM: ", content, "\n"])
                        }
                        "system" => push_all(out, &[content, "\n\n"]),
                        "user" => push_all(out, &["USER: ", content, "\n"]),
                        "assistant" => push_all(out, &["ASSISTANT: ", content, "</s>\n"]),
                        _ => {}
                    }
                }
                "ASSISTANT:"
            }
            Deepseek => {
                for (role, content) in chat {
                    match *role {
                        "system" => out.push_str(content),
                        "user" => push_all(out, &["### Instruction:\n", content, "\n"]),
                        "assistant" => push_all(out, &["### Response:\n", content, "\n<|EOT|>\n"]),
                        _ => {}
                    }
                }
                "### Response:\n"
            }
            CommandR => {
                for (role, content) in chat {
                    let token = match *role {
                        "system" => "<|SYSTEM_TOKEN|>",
                        "user" => "<|USER_TOKEN|>",
                        "assistant" => "<|CHATBOT_TOKEN|>",
                        _ => continue,
                    };
                    push_all(
                        out,
                        &[
                            "<|START_OF_TURN_TOKEN|>",
                            token,
                            c_trim(content),
                            "<|END_OF_TURN_TOKEN|>",
                        ],
                    );
                }
                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
            }
            Llama3 => {
                for (role, content) in chat {
                    push_all(
                        out,
                        &[
                            "<|start_header_id|>",
                            role,
                            "<|end_header_id|>\n\n",
                            c_trim(content),
                            "<|eot_id|>",
                        ],
                    );
                }
                "<|start_header_id|>assistant<|end_header_id|>\n\n"
            }
            ChatGlm3 => {
                out.push_str("[gMASK]sop");
                for (role, content) in chat {
                    push_all(out, &["<|", role, "|>\n ", content]);
                }
                "<|assistant|>"
            }
            ChatGlm4 => {
                out.push_str("[gMASK]<sop>");
                for (role, content) in chat {
                    push_all(out, &["<|", role, "|>\n", content]);
                }
                "<|assistant|>\n"
            }
            GlmEdge => {
                for (role, content) in chat {
                    push_all(out, &["<|", role, "|>\n", content]);
                }
                "<|assistant|>"
            }
            MiniCpm => {
                for (role, content) in chat {
                    if *role == "user" {
                        push_all(out, &["<用户>", c_trim(content), "<AI>"]);
                    } else {
                        out.push_str(c_trim(content));
                    }
                }
                ""
            }
            Deepseek2 => {
                for (role, content) in chat {
                    match *role {
                        "system" => push_all(out, &[content, "\n\n"]),
                        "user" => push_all(out, &["User: ", content, "\n\n"]),
                        "assistant" => {
                            push_all(out, &["Assistant: ", content, "<｜end▁of▁sentence｜>"])
                        }
                        _ => {}
                    }
                }
                "Assistant:"
            }
            Deepseek3 => {
                for (role, content) in chat {
                    match *role {
                        "system" => push_all(out, &[content, "\n\n"]),
                        "user" => push_all(out, &["<｜User｜>", content]),
                        "assistant" => {
                            push_all(out, &["<｜Assistant｜>", content, "<｜end▁of▁sentence｜>"])
                        }
                        _ => {}
                    }
                }
                "<｜Assistant｜>"
            }
            DeepseekOcr => {
                for (_, content) in chat {
                    out.push_str(content);
                }
                ""
            }
            Exaone3 | Exaone4 => {
                for (role, content) in chat {
                    let content = c_trim(content);
                    match *role {
                        "system" => push_all(out, &["[|system|]", content, "[|endofturn|]\n"]),
                        "user" => push_all(out, &["[|user|]", content, "\n"]),
                        "assistant" => {
                            push_all(out, &["[|assistant|]", content, "[|endofturn|]\n"])
                        }
                        "tool" if self == Exaone4 => {
                            push_all(out, &["[|tool|]", content, "[|endofturn|]\n"])
                        }
                        _ => {}
                    }
                }
                "[|assistant|]"
            }
            ExaoneMoe => {
                for (role, content) in chat {
                    if matches!(*role, "system" | "user" | "assistant" | "tool") {
                        push_all(
                            out,
                            &["<|", role, "|>\n", c_trim(content), "<|endofturn|>\n"],
                        );
                    }
                }
                "<|assistant|>\n"
            }
            RwkvWorld => {
                // never a generation prompt of its own: a last user turn opens the reply
                for (i, (role, content)) in chat.iter().enumerate() {
                    let content = c_trim(content);
                    match *role {
                        "system" => push_all(out, &["System: ", content, "\n\n"]),
                        "user" => {
                            push_all(out, &["User: ", content, "\n\n"]);
                            if i + 1 == chat.len() {
                                out.push_str("Assistant:");
                            }
                        }
                        "assistant" => push_all(out, &["Assistant: ", content, "\n\n"]),
                        _ => {}
                    }
                }
                ""
            }
            Granite3 => {
                for (role, content) in chat {
                    push_all(out, &["<|start_of_role|>", role, "<|end_of_role|>"]);
                    if *role == "assistant_tool_call" {
                        out.push_str("<|tool_call|>");
                    }
                    push_all(out, &[content, "<|end_of_text|>\n"]);
                }
                "<|start_of_role|>assistant<|end_of_role|>"
            }
            Granite40 | Granite41 => {
                for (role, content) in chat {
                    if *role == "assistant_tool_call" {
                        out.push_str("<|start_of_role|>assistant<|end_of_role|><|tool_call|>");
                    } else {
                        push_all(out, &["<|start_of_role|>", role, "<|end_of_role|>"]);
                    }
                    push_all(out, &[content, "<|end_of_text|>\n"]);
                }
                "<|start_of_role|>assistant<|end_of_role|>"
            }
            GigaChat => {
                let system = chat.first().filter(|(role, _)| *role == "system");
                out.push_str("<s>");
                if let Some((_, content)) = system {
                    push_all(out, &[content, "<|message_sep|>"]);
                }
                for (role, content) in &chat[usize::from(system.is_some())..] {
                    match *role {
                        "user" => push_all(
                            out,
                            &[
                                "user<|role_sep|>",
                                content,
                                "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>",
                            ],
                        ),
                        "assistant" => {
                            push_all(out, &["assistant<|role_sep|>", content, "<|message_sep|>"])
                        }
                        _ => {}
                    }
                }
                "assistant<|role_sep|>"
            }
            Megrez => {
                for (role, content) in chat {
                    push_all(
                        out,
                        &[
                            "<|role_start|>",
                            role,
                            "<|role_end|>",
                            content,
                            "<|turn_end|>",
                        ],
                    );
                }
                "<|role_start|>assistant<|role_end|>"
            }
            Yandex => {
                for (role, content) in chat {
                    match *role {
                        "user" => push_all(out, &[" Пользователь: ", content, "\n\n"]),
                        "assistant" => push_all(out, &[" Ассистент: ", content, "\n\n"]),
                        _ => {}
                    }
                }
                " Ассистент:[SEP]"
            }
            Bailing | BailingThink => {
                for (role, content) in chat {
                    push_all(out, &["<role>", &bailing_role(role), "</role>", content]);
                }
                if self == BailingThink {
                    "<role>ASSISTANT</role><think>"
                } else {
                    "<role>ASSISTANT</role>"
                }
            }
            Bailing2 => {
                if chat.first().is_none_or(|(role, _)| *role != "system") {
                    out.push_str("<role>SYSTEM</role>detailed thinking off<|role_end|>");
                }
                for (role, content) in chat {
                    push_all(
                        out,
                        &[
                            "<role>",
                            &bailing_role(role),
                            "</role>",
                            content,
                            "<|role_end|>",
                        ],
                    );
                }
                "<role>ASSISTANT</role>"
            }
            Llama4 => {
                for (role, content) in chat {
                    push_all(
                        out,
                        &[
                            "<|header_start|>",
                            role,
                            "<|header_end|>\n\n",
                            c_trim(content),
                            "<|eot|>",
                        ],
                    );
                }
                "<|header_start|>assistant<|header_end|>\n\n"
            }
            SmolVlm => {
                // <|im_start|> is this family's BOS, not a ChatML turn
                out.push_str("<|im_start|>");
                for (role, content) in chat {
                    match *role {
                        "system" => push_all(out, &[content, "\n\n"]),
                        "user" => push_all(out, &["User: ", content, "<end_of_utterance>\n"]),
                        _ => push_all(out, &["Assistant: ", content, "<end_of_utterance>\n"]),
                    }
                }
                "Assistant:"
            }
            Dots1 => {
                for (role, content) in chat {
                    match *role {
                        "system" => push_all(out, &["<|system|>", content, "<|endofsystem|>"]),
                        "user" => {
                            push_all(out, &["<|userprompt|>", content, "<|endofuserprompt|>"])
                        }
                        _ => push_all(out, &["<|response|>", content, "<|endofresponse|>"]),
                    }
                }
                "<|response|>"
            }
            HunyuanMoe => {
                for (role, content) in chat {
                    match *role {
                        "system" => push_all(out, &["<|startoftext|>", content, "<|extra_4|>"]),
                        "assistant" => push_all(out, &[content, "<|eos|>"]),
                        _ => push_all(out, &["<|startoftext|>", content, "<|extra_0|>"]),
                    }
                }
                ""
            }
            GptOss => {
                for (role, content) in chat {
                    let end = if *role == "assistant" {
                        "<|return|>"
                    } else {
                        "<|end|>"
                    };
                    push_all(out, &["<|start|>", role, "<|message|>", content, end]);
                }
                "<|start|>assistant"
            }
            HunyuanDense => {
                for (i, (role, content)) in chat.iter().enumerate() {
                    match *role {
                        "system" if i == 0 => {
                            push_all(out, &[content, "<｜hy_place▁holder▁no▁3｜>"])
                        }
                        "assistant" => push_all(
                            out,
                            &["<｜hy_Assistant｜>", content, "<｜hy_place▁holder▁no▁2｜>"],
                        ),
                        "user" => push_all(out, &["<｜hy_User｜>", content, "<｜hy_Assistant｜>"]),
                        _ => {}
                    }
                }
                ""
            }
            HunyuanVl => {
                out.push_str("<｜hy_begin▁of▁sentence｜>");
                for (i, (role, content)) in chat.iter().enumerate() {
                    match *role {
                        "system" if i == 0 => {
                            push_all(out, &[content, "<｜hy_place▁holder▁no▁3｜>"])
                        }
                        "user" => push_all(out, &[content, "<｜hy_User｜>"]),
                        "assistant" => push_all(out, &[content, "<｜hy_Assistant｜>"]),
                        _ => {}
                    }
                }
                ""
            }
            KimiK2 => {
                for (role, content) in chat {
                    let header = match *role {
                        "system" => "<|im_system|>system<|im_middle|>",
                        "user" => "<|im_user|>user<|im_middle|>",
                        "assistant" => "<|im_assistant|>assistant<|im_middle|>",
                        "tool" => "<|im_system|>tool<|im_middle|>",
                        _ => "",
                    };
                    push_all(out, &[header, content, "<|im_end|>"]);
                }
                "<|im_assistant|>assistant<|im_middle|>"
            }
            SeedOss => {
                for (role, content) in chat {
                    let content = if *role == "assistant" {
                        c_trim(content)
                    } else {
                        content
                    };
                    push_all(out, &["<seed:bos>", role, "\n", content, "<seed:eos>"]);
                }
                "<seed:bos>assistant\n"
            }
            Grok2 => {
                for (role, content) in chat {
                    match *role {
                        "system" => {
                            push_all(out, &["System: ", c_trim(content), "<|separator|>\n\n"])
                        }
                        "user" => push_all(out, &["Human: ", c_trim(content), "<|separator|>\n\n"]),
                        "assistant" => {
                            push_all(out, &["Assistant: ", content, "<|separator|>\n\n"])
                        }
                        _ => {}
                    }
                }
                "Assistant:"
            }
            PanguEmbedded => {
                for (i, (role, content)) in chat.iter().enumerate() {
                    if i == 0 && *role != "system" {
                        out.push_str("[unused9]系统：[unused10]");
                    }
                    let speaker = match *role {
                        "system" => "系统",
                        "user" => "用户",
                        "assistant" => "助手",
                        "tool" => "工具",
                        "function" => "方法",
                        _ => continue,
                    };
                    push_all(out, &["[unused9]", speaker, "：", content, "[unused10]"]);
                }
                "[unused9]助手："
            }
            SolarOpen => {
                for (role, content) in chat {
                    push_all(out, &["<|begin|>", role, "<|content|>", content, "<|end|>"]);
                }
                "<|begin|>assistant"
            }
        }
    }
}

fn push_all(out: &mut String, parts: &[&str]) {
    for part in parts {
        out.push_str(part);
    }
}

/// Bailing's role tags: `user` is HUMAN, any other role in capitals (ASCII only, as C's
/// `toupper`).
fn bailing_role(role: &str) -> String {
    if role == "user" {
        "HUMAN".to_string()
    } else {
        role.to_ascii_uppercase()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_and_dots1_is_only_detected() {
        assert_eq!(names().count(), 54);
        let mut sorted: Vec<&str> = names().collect();
        sorted.sort_unstable();
        assert!(names().eq(sorted), "names are listed in byte order");
        for name in names() {
            assert_eq!(Format::detect(name), Format::from_name(name), "{name}");
        }
        assert!(NAMES.iter().all(|(_, f)| *f != Format::Dots1));
        assert_eq!(
            Format::detect("{{'<|userprompt|>'}}<|endofuserprompt|>"),
            Some(Format::Dots1)
        );
    }

    #[test]
    fn detection_follows_upstream_order() {
        // <|im_start|> wins over everything that follows it
        assert_eq!(
            Format::detect("<|im_start|><start_of_turn>"),
            Some(Format::ChatMl)
        );
        assert_eq!(Format::detect("mistral please"), Some(Format::Llama2));
        assert_eq!(Format::detect("a mistral"), None);
        assert_eq!(
            Format::detect("x [INST][AVAILABLE_TOOLS]"),
            Some(Format::MistralV1)
        );
        assert_eq!(
            Format::detect("\"[INST]\"[AVAILABLE_TOOLS]"),
            Some(Format::MistralV3Tekken)
        );
        assert_eq!(
            Format::detect("[INST][AVAILABLE_TOOLS]"),
            Some(Format::MistralV3)
        );
        // the Bailing think variant is shadowed when both quote styles are present
        assert_eq!(
            Format::detect("<role>ASSISTANT</role>'HUMAN'\"HUMAN\"<think>"),
            Some(Format::Bailing)
        );
        assert_eq!(Format::detect("gemma "), None, "names match exactly");
        assert_eq!(Format::detect("gemma\0tail"), Some(Format::Gemma));
    }

    #[test]
    fn check_override_words_the_refusal_as_upstream() {
        assert_eq!(check_override("gemma"), Ok(()));
        assert_eq!(
            check_override("nope").unwrap_err(),
            "error: the supplied chat template is not supported: nope\nnote: llama.cpp was started without --jinja, we only support commonly used templates\n"
        );
    }

    #[test]
    fn trimming_is_the_c_locale_s() {
        let msgs = [("user", "\u{a0} x \x0b\x0c")];
        assert_eq!(
            Format::Llama3.render(&msgs, false),
            "<|start_header_id|>user<|end_header_id|>\n\n\u{a0} x<|eot_id|>"
        );
    }

    #[test]
    fn generation_prompt_only_where_the_format_has_one() {
        let msgs = [("user", "hi")];
        assert_eq!(
            Format::Gemma.render(&msgs, true),
            "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            Format::RwkvWorld.render(&msgs, false),
            "User: hi\n\nAssistant:"
        );
        assert_eq!(
            Format::Orion.render(&msgs, true),
            Format::Orion.render(&msgs, false)
        );
        assert_eq!(
            Format::OpenChat.render(&[("", "x")], false),
            "GPT4 Correct : x<|end_of_turn|>"
        );
    }
}
