//! Model output back into an OpenAI message: reasoning split from content by the family's
//! thinking tags, and tool calls recognised in the family's syntax, both for a whole message
//! and incrementally while it streams (deltas of `reasoning_content`, `content` and tool-call
//! arguments). Text that may still become a tag is held back while streaming, and a tool call
//! that is cut short or malformed is dropped rather than leaked into `content`.

use serde_json::Value as Json;

use super::template::{specialised_family, ChatTemplate, Family};
use super::ChatError;

/// `--reasoning-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// Thinking stays in `content`, tags included.
    None,
    /// Thinking goes to `reasoning_content`.
    #[default]
    Deepseek,
    /// Accepted as upstream accepts it; upstream b11434's server splits it as `deepseek`
    /// (recorded in `tests/data/reasoning-split.json`).
    DeepseekLegacy,
    /// Like `deepseek`.
    Auto,
}

impl ReasoningFormat {
    /// Parses a `--reasoning-format` / request `reasoning_format` value.
    pub fn from_name(name: &str) -> Result<Self, ChatError> {
        Ok(match name {
            "none" => ReasoningFormat::None,
            "deepseek" => ReasoningFormat::Deepseek,
            "deepseek-legacy" => ReasoningFormat::DeepseekLegacy,
            "auto" => ReasoningFormat::Auto,
            other => {
                return Err(ChatError::Messages(format!(
                    "Unknown reasoning format: {other}"
                )))
            }
        })
    }

    fn extracts(self) -> bool {
        self != ReasoningFormat::None
    }
}

/// One parsed tool call. `arguments` is the JSON text the model wrote (for XML-style families,
/// the JSON object built from its parameters).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// An assistant message as parsed from model output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning_content: String,
    pub tool_calls: Vec<ToolCall>,
}

/// How a family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// No tool calls are recognised.
    None,
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5/3, Granite 4).
    Hermes,
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
    Qwen3Coder,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]` (Mistral Nemo).
    MistralJson,
    /// `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}` (Mistral Small 3.2, Devstral, Ministral 3).
    MistralArgs,
    /// `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>` (Llama 3.x).
    Llama3Json,
    /// Harmony channels: `<|channel|>commentary to=functions.NAME<|message|>{...}` (gpt-oss).
    Harmony,
    /// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`.
    DeepSeekR1,
    /// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (DeepSeek V3.1).
    DeepSeekV31,
    /// `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`
    /// (Kimi K2; the `functions.NAME:IDX` is the call's id).
    KimiK2,
    /// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>` (GLM 4.x).
    Glm,
    /// `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>\n</minimax:tool_call>`
    /// (MiniMax M2).
    MiniMaxM2,
    /// `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>`,
    /// content wrapped in `<|START_RESPONSE|>` (Command R7B) or `<|START_TEXT|>` (Cohere2 MoE);
    /// the `tool_call_id` is the call's id.
    CommandR7B,
    /// `<function=NAME>{...}</function>` (Functionary v3.1).
    FunctionaryV31,
    /// `>>>RECIPIENT\n...` after a prompt ending in `>>>`: `all` is content, any other recipient
    /// a tool call with JSON arguments (Functionary v3.2).
    FunctionaryV32,
    /// `<TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>` (Nemotron Nano v2).
    Nemotron,
    /// `<tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls>` (Apriel 1.5 / 1.6).
    Apriel,
    /// ` functools[{"name": ..., "arguments": {...}}]` (FireFunction v2).
    FireFunction,
    /// `<|tools_prefix|>[{"NAME": {...}}]<|tools_suffix|>` (Apertus).
    Apertus,
    /// `<seed:tool_call>\n<function=NAME>\n<parameter=K>V</parameter>\n</function>\n</seed:tool_call>`
    /// (Seed-OSS; values kept as written).
    SeedOss,
    /// `<|tool_call_start|>[NAME(K=V, ...)]<|tool_call_end|>` with Python literals (LFM2, LFM2.5).
    Lfm2,
    /// `Action:\n```json\n[{"tool_name": ..., "parameters": {...}}]\n```` (Command R+).
    CommandRPlus,
}

/// What to look for in one family's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFormat {
    pub think_start: String,
    pub think_end: String,
    /// When the prompt already opened the thinking block (so output starts inside it), what
    /// the prompt ends with from its opening tag on (`<think>\n`): the parser reads the output
    /// after it, as upstream does. Empty otherwise.
    pub opened: String,
    /// The whitespace the template writes after the opening tag and after the closing one (Qwen3:
    /// `\n` and `\n\n`); the parser takes it as part of the tags, one character at a time.
    pub start_ws: String,
    pub end_ws: String,
    pub tools: ToolSyntax,
}

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const KIMI_SECTION: &str = "<|tool_calls_section_begin|>";
const KIMI_CALL: &str = "<|tool_call_begin|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const MINIMAX_OPEN: &str = "<minimax:tool_call>";
const MINIMAX_CLOSE: &str = "</minimax:tool_call>";
const ACTION_START: &str = "<|START_ACTION|>";
const ACTION_END: &str = "<|END_ACTION|>";
/// Command R7B's and Cohere2 MoE's content wrappers: (start, end).
const COHERE_CONTENT: [(&str, &str); 2] = [
    ("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    ("<|START_TEXT|>", "<|END_TEXT|>"),
];
const LFM2_OPEN: &str = "<|tool_call_start|>";
const LFM2_CLOSE: &str = "<|tool_call_end|>";

impl OutputFormat {
    /// The format of a template's family; `prompt` is the rendered prompt the output follows
    /// (it tells whether thinking was opened by the template).
    pub fn for_template(template: &ChatTemplate, prompt: &str) -> Self {
        let mut format = Self::from_source(template.source(), prompt);
        if let Some((start, end)) = template.reasoning_wrapping() {
            let after = |wrapped: &str, tag: &str| {
                wrapped
                    .find(tag)
                    .map(|at| wrapped[at + tag.len()..].to_string())
                    .filter(|ws| ws.chars().all(is_ws))
                    .unwrap_or_default()
            };
            format.start_ws = after(start, &format.think_start);
            format.end_ws = after(end, &format.think_end);
        }
        format
    }

    fn from_source(src: &str, prompt: &str) -> Self {
        let family = specialised_family(src);
        let (think_start, think_end) =
            if family == Some(Family::Ministral3) || src.contains("[THINK]") {
                ("[THINK]", "[/THINK]")
            } else if src.contains("<|START_THINKING|>") {
                ("<|START_THINKING|>", "<|END_THINKING|>")
            } else if src.contains("<seed:think>") {
                ("<seed:think>", "</seed:think>")
            } else {
                ("<think>", "</think>")
            };
        let tools = if family == Some(Family::GptOss) {
            ToolSyntax::Harmony
        } else if family == Some(Family::FunctionaryV32) {
            ToolSyntax::FunctionaryV32
        } else if family == Some(Family::KimiK2) {
            ToolSyntax::KimiK2
        } else if matches!(family, Some(Family::Lfm2 | Family::Lfm25)) {
            ToolSyntax::Lfm2
        } else if src.contains(ACTION_START) {
            ToolSyntax::CommandR7B
        } else if src.contains("Action:\\n```json") {
            ToolSyntax::CommandRPlus
        } else if src.contains(MINIMAX_OPEN) {
            ToolSyntax::MiniMaxM2
        } else if src.contains("<seed:tool_call>") {
            ToolSyntax::SeedOss
        } else if src.contains("<arg_key>") {
            ToolSyntax::Glm
        } else if matches!(family, Some(Family::Ministral3)) || src.contains("[ARGS]") {
            ToolSyntax::MistralArgs
        } else if src.contains("[TOOL_CALLS]") {
            ToolSyntax::MistralJson
        } else if family == Some(Family::Qwen3Coder) {
            ToolSyntax::Qwen3Coder
        } else if src.contains(DS_SEP) && src.contains("```json") {
            ToolSyntax::DeepSeekR1
        } else if src.contains(DS_SEP) {
            ToolSyntax::DeepSeekV31
        } else if src.contains("<function=")
            && src.contains("</function>")
            && !src.contains("<parameter=")
        {
            ToolSyntax::FunctionaryV31
        } else if src.contains("<TOOLCALL>") {
            ToolSyntax::Nemotron
        } else if src.contains("<tool_calls>[") {
            ToolSyntax::Apriel
        } else if src.contains("functools[") {
            ToolSyntax::FireFunction
        } else if src.contains("<|tools_prefix|>") {
            ToolSyntax::Apertus
        } else if src.contains("<tool_call>") {
            ToolSyntax::Hermes
        } else if src.contains("<|python_tag|>") || src.contains("\"parameters\": ") {
            ToolSyntax::Llama3Json
        } else {
            ToolSyntax::None
        };
        let forced_open = tools != ToolSyntax::Harmony && prompt.trim_end().ends_with(think_start);
        let opened = match prompt.rfind(think_start) {
            Some(at) if forced_open => prompt[at..].to_string(),
            _ => String::new(),
        };
        OutputFormat {
            think_start: think_start.to_string(),
            think_end: think_end.to_string(),
            opened,
            start_ws: String::new(),
            end_ws: String::new(),
            tools,
        }
    }

    /// Whether the prompt already opened the thinking block, so output starts inside it.
    pub fn thinking_forced_open(&self) -> bool {
        !self.opened.is_empty()
    }

    /// Parses the whole output (`partial`: more is coming, so hold back what may still
    /// become a tag and keep an unfinished tool call with the arguments seen so far).
    pub fn parse(
        &self,
        text: &str,
        reasoning: ReasoningFormat,
        parse_tools: bool,
        partial: bool,
    ) -> ParsedMessage {
        if self.tools == ToolSyntax::Harmony {
            return parse_harmony(text, reasoning, parse_tools, partial);
        }
        if self.tools == ToolSyntax::FunctionaryV32 {
            return parse_functionary_v32(text, parse_tools, partial);
        }
        let mut msg = ParsedMessage::default();
        // thinking the prompt opened is read from its opening tag on; otherwise whitespace before
        // an opening tag is skipped (and held back while it may still precede one)
        let joined;
        let text = if self.thinking_forced_open() {
            joined = format!("{}{text}", self.opened);
            joined.as_str()
        } else {
            let trimmed = text.trim_start_matches(is_ws);
            if partial && trimmed.is_empty() {
                return msg;
            }
            let tag = self.think_start.as_str();
            if trimmed.starts_with(tag) || (partial && tag.starts_with(trimmed)) {
                trimmed
            } else {
                text
            }
        };
        let (thinking, rest) = self.split_reasoning(text, parse_tools, partial);
        if let Some(thinking) = thinking {
            if reasoning.extracts() {
                // upstream's parsers drop reasoning that is only whitespace
                if !thinking.chars().all(is_ws) {
                    msg.reasoning_content = thinking.to_string();
                }
            } else {
                msg.content.push_str(&text[..text.len() - rest.len()]);
            }
        }
        if self.tools == ToolSyntax::CommandR7B {
            if let Some(content) = cohere_content(rest, partial) {
                msg.content.push_str(content);
                return msg;
            }
        }
        if parse_tools && self.tools != ToolSyntax::None {
            let (content, calls) = parse_tool_calls(self.tools, rest, partial);
            msg.content.push_str(content);
            msg.tool_calls = calls;
        } else {
            msg.content.push_str(hold_back(rest, partial, &[]));
        }
        msg
    }

    /// Splits off the thinking block at the start of `text`: (thinking, rest). The whitespace
    /// the template writes after each tag goes with the tag; the thinking keeps the rest.
    fn split_reasoning<'a>(
        &self,
        text: &'a str,
        parse_tools: bool,
        partial: bool,
    ) -> (Option<&'a str>, &'a str) {
        let openers = if parse_tools {
            openers(self.tools)
        } else {
            &[]
        };
        let body = if let Some(after) = text.strip_prefix(self.think_start.as_str()) {
            skip_chars(after, &self.start_ws)
        } else if partial && !text.is_empty() && self.think_start.starts_with(text) {
            return (None, "");
        } else {
            return (None, text);
        };
        match body.find(self.think_end.as_str()) {
            Some(end) => (
                Some(&body[..end]),
                skip_chars(&body[end + self.think_end.len()..], &self.end_ws),
            ),
            // thinking the model never closed ends where a tool call starts (when the request
            // has tools)
            None if let Some(call) = openers.iter().filter_map(|m| body.find(m)).min() => {
                (Some(&body[..call]), &body[call..])
            }
            None => {
                let shown = if partial {
                    let mut markers = vec![self.think_end.as_str()];
                    markers.extend(openers);
                    hold_back(body, true, &markers)
                } else {
                    body
                };
                (Some(shown), "")
            }
        }
    }
}

/// `text` after as many of `chars`' characters, in order, as it starts with.
fn skip_chars<'a>(mut text: &'a str, chars: &str) -> &'a str {
    for c in chars.chars() {
        match text.strip_prefix(c) {
            Some(rest) => text = rest,
            None => break,
        }
    }
    text
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\n' | '\r' | '\t')
}

/// While streaming, the end of `text` that could be the start of `markers` is not shown yet.
fn hold_back<'a>(text: &'a str, partial: bool, markers: &[&str]) -> &'a str {
    if !partial {
        return text;
    }
    let mut cut = text.len();
    for marker in markers {
        for (start, _) in text.char_indices().rev().take(marker.len()) {
            let tail = &text[start..];
            if marker.starts_with(tail) && start < cut {
                cut = start;
            }
        }
    }
    &text[..cut]
}

fn openers(syntax: ToolSyntax) -> &'static [&'static str] {
    match syntax {
        ToolSyntax::Hermes | ToolSyntax::Qwen3Coder => &["<tool_call>"],
        ToolSyntax::MistralJson | ToolSyntax::MistralArgs => &["[TOOL_CALLS]"],
        ToolSyntax::Llama3Json => &["<|python_tag|>"],
        ToolSyntax::KimiK2 => &[KIMI_SECTION, KIMI_CALL],
        ToolSyntax::Glm => &["<tool_call>"],
        ToolSyntax::DeepSeekR1 | ToolSyntax::DeepSeekV31 => &[DS_CALLS_BEGIN, DS_CALL_BEGIN],
        ToolSyntax::MiniMaxM2 => &[MINIMAX_OPEN],
        ToolSyntax::CommandR7B => &[ACTION_START],
        ToolSyntax::FunctionaryV31 => &["<function="],
        ToolSyntax::Nemotron => &["<TOOLCALL>"],
        ToolSyntax::Apriel => &["<tool_calls>"],
        ToolSyntax::FireFunction => &["functools["],
        ToolSyntax::Apertus => &["<|tools_prefix|>"],
        ToolSyntax::SeedOss => &["<seed:tool_call>"],
        ToolSyntax::Lfm2 => &[LFM2_OPEN],
        ToolSyntax::CommandRPlus => &["Action:"],
        ToolSyntax::None | ToolSyntax::Harmony | ToolSyntax::FunctionaryV32 => &[],
    }
}

/// Content before the first tool call, and the calls.
fn parse_tool_calls(syntax: ToolSyntax, text: &str, partial: bool) -> (&str, Vec<ToolCall>) {
    let markers = openers(syntax);
    if syntax == ToolSyntax::Llama3Json {
        let trimmed = text.trim_start_matches(is_ws);
        if trimmed.starts_with('{') {
            // Llama 3 answers with a bare JSON object when it calls a tool
            return ("", llama3_calls(trimmed, partial).unwrap_or_default());
        }
    }
    let first = markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, *m)))
        .min();
    let Some((start, marker)) = first else {
        // streaming: whitespace may turn out to precede a tool call, which drops it
        let shown = hold_back(text, partial, markers);
        let shown = if partial {
            shown.trim_end_matches(is_ws)
        } else {
            shown
        };
        return (shown, Vec::new());
    };
    let content = text[..start].trim_end_matches(is_ws);
    let content = if content.len() < start && partial {
        content
    } else {
        &text[..start]
    };
    let body = &text[start..];
    let calls = match syntax {
        ToolSyntax::Hermes => tagged_calls(body, "<tool_call>", "</tool_call>", partial, json_call),
        ToolSyntax::Qwen3Coder => {
            tagged_calls(body, "<tool_call>", "</tool_call>", partial, |i, p| {
                function_params_call(i, p, true)
            })
        }
        ToolSyntax::MistralJson => mistral_json_calls(&body[marker.len()..], partial),
        ToolSyntax::MistralArgs => mistral_args_calls(body, partial),
        ToolSyntax::Llama3Json => {
            llama3_calls(body[marker.len()..].trim_start(), partial).unwrap_or_default()
        }
        ToolSyntax::DeepSeekR1 | ToolSyntax::DeepSeekV31 => tagged_calls(
            body,
            DS_CALL_BEGIN,
            DS_CALL_END,
            partial,
            |inner, partial| deepseek_call(syntax, inner, partial),
        ),
        ToolSyntax::KimiK2 => tagged_calls(body, KIMI_CALL, KIMI_CALL_END, partial, kimi_call),
        ToolSyntax::Glm => tagged_calls(body, "<tool_call>", "</tool_call>", partial, glm_call),
        ToolSyntax::MiniMaxM2 => {
            tagged_sections(body, MINIMAX_OPEN, MINIMAX_CLOSE, partial, |s, p| {
                tagged_calls(s, "<invoke name=", "</invoke>", p, minimax_invoke)
            })
        }
        ToolSyntax::CommandR7B => {
            array_sections(body, ACTION_START, Some(ACTION_END), partial, |o, p| {
                keyed_json_call(o, p, "tool_name", "parameters", "tool_call_id")
            })
        }
        ToolSyntax::FunctionaryV31 => {
            tagged_calls(body, "<function=", "</function>", partial, functionary_call)
        }
        ToolSyntax::Nemotron => {
            array_sections(body, "<TOOLCALL>", Some("</TOOLCALL>"), partial, json_call)
        }
        ToolSyntax::Apriel => array_sections(
            body,
            "<tool_calls>",
            Some("</tool_calls>"),
            partial,
            json_call,
        ),
        ToolSyntax::FireFunction => array_sections(body, "functools", None, partial, json_call),
        ToolSyntax::Apertus => array_sections(
            body,
            "<|tools_prefix|>",
            Some("<|tools_suffix|>"),
            partial,
            name_keyed_call,
        ),
        ToolSyntax::SeedOss => tagged_calls(
            body,
            "<seed:tool_call>",
            "</seed:tool_call>",
            partial,
            |i, p| function_params_call(i, p, false),
        ),
        ToolSyntax::Lfm2 => tagged_sections(body, LFM2_OPEN, LFM2_CLOSE, partial, lfm2_calls),
        ToolSyntax::CommandRPlus => command_r_plus_calls(&body[marker.len()..], partial),
        ToolSyntax::None | ToolSyntax::Harmony | ToolSyntax::FunctionaryV32 => Vec::new(),
    };
    (content.trim_end_matches(is_ws), calls)
}

/// Calls between `open` and `close` tags; the last may be unterminated while streaming.
fn tagged_calls(
    body: &str,
    open: &str,
    close: &str,
    partial: bool,
    parse_one: impl Fn(&str, bool) -> Option<ToolCall>,
) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(start) = rest.find(open) {
        let inner = &rest[start + open.len()..];
        match inner.find(close) {
            Some(end) => {
                calls.extend(parse_one(&inner[..end], false));
                rest = &inner[end + close.len()..];
            }
            None => {
                if partial {
                    calls.extend(parse_one(hold_back(inner, true, &[close]), true));
                }
                break;
            }
        }
    }
    calls
}

/// `{"name": ..., "arguments": {...}}` with the arguments kept as written.
fn json_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let inner = inner.trim_matches(is_ws);
    let name = json_string_field(inner, "name")?;
    let arguments = raw_json_field(inner, &["arguments", "parameters"], partial)?;
    Some(ToolCall {
        id: json_string_field(inner, "id").unwrap_or_default(),
        name,
        arguments,
    })
}

/// The value of `"key": "..."` in a JSON object text, even an unfinished one.
fn json_string_field(text: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\"");
    let at = text.find(&pattern)?;
    let after = text[at + pattern.len()..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
    de.next()?.ok()
}

/// The raw text of the first of `keys` whose value is an object (or, finished, any JSON
/// value). Unfinished, the text seen so far; finished, it must be valid JSON.
fn raw_json_field(text: &str, keys: &[&str], partial: bool) -> Option<String> {
    for key in keys {
        let pattern = format!("\"{key}\"");
        let Some(at) = text.find(&pattern) else {
            continue;
        };
        let after = text[at + pattern.len()..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        return json_prefix(after, partial);
    }
    None
}

/// The JSON value at the start of `text`: complete, or (streaming) as much as was written.
fn json_prefix(text: &str, partial: bool) -> Option<String> {
    let end = json_value_end(text);
    match end {
        Some(end) => {
            let value = &text[..end];
            serde_json::from_str::<Json>(value)
                .ok()
                .map(|_| value.to_string())
        }
        None if partial => Some(text.trim_end_matches(is_ws).to_string()),
        None => None,
    }
}

/// Byte length of the balanced JSON value at the start of `text`, if it is complete.
fn json_value_end(text: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            c if depth == 0 && (c == ',' || is_ws(c)) && i > 0 => return Some(i),
            _ => {}
        }
    }
    (depth == 0 && !in_string && !text.is_empty() && !text.ends_with(is_ws))
        .then_some(text.len())
        .filter(|_| serde_json::from_str::<Json>(text).is_ok())
}

/// Qwen3-Coder / Seed-OSS style: `<function=NAME>` then `<parameter=KEY>VALUE</parameter>`s;
/// values that parse as JSON keep their type, others become strings. Qwen3-Coder writes each
/// value between newlines (`trim_newlines`), Seed-OSS as is.
fn function_params_call(inner: &str, partial: bool, trim_newlines: bool) -> Option<ToolCall> {
    let body = inner.trim_matches(is_ws);
    let after = body.strip_prefix("<function=")?;
    let name_end = after.find('>')?;
    let name = after[..name_end].trim().to_string();
    let tags = ParamTags {
        open: "<parameter=",
        name_end: ">",
        close: "</parameter>",
        trim_newlines,
    };
    let args = xml_params(&after[name_end + 1..], &tags, partial)?;
    Some(ToolCall {
        id: String::new(),
        name,
        arguments: object_text(args, partial),
    })
}

/// How an XML-style family writes one parameter: `{open}KEY{name_end}VALUE{close}`.
struct ParamTags {
    open: &'static str,
    name_end: &'static str,
    close: &'static str,
    trim_newlines: bool,
}

/// The parameters in `text`; a value is only taken once closed (its type is not known before),
/// and a finished call with an unclosed one is malformed.
fn xml_params(
    text: &str,
    tags: &ParamTags,
    partial: bool,
) -> Option<serde_json::Map<String, Json>> {
    let mut args = serde_json::Map::new();
    let mut rest = text;
    while let Some(p) = rest.find(tags.open) {
        let tail = &rest[p + tags.open.len()..];
        let Some(key_end) = tail.find(tags.name_end) else {
            if partial {
                break;
            }
            return None;
        };
        let key = tail[..key_end].trim().to_string();
        let value_text = &tail[key_end + tags.name_end.len()..];
        let Some(end) = value_text.find(tags.close) else {
            if partial {
                break;
            }
            return None;
        };
        let mut value = &value_text[..end];
        if tags.trim_newlines {
            value = value.strip_prefix('\n').unwrap_or(value);
            value = value.strip_suffix('\n').unwrap_or(value);
        }
        args.insert(key, typed_value(value));
        rest = &value_text[end + tags.close.len()..];
    }
    Some(args)
}

/// MiniMax M2: `"NAME">` then `<parameter name="KEY">VALUE</parameter>`s.
fn minimax_invoke(inner: &str, partial: bool) -> Option<ToolCall> {
    let after = inner.trim_start_matches(is_ws).strip_prefix('"')?;
    let name_end = after.find("\">")?;
    let tags = ParamTags {
        open: "<parameter name=\"",
        name_end: "\">",
        close: "</parameter>",
        trim_newlines: false,
    };
    let args = xml_params(&after[name_end + 2..], &tags, partial)?;
    Some(ToolCall {
        id: String::new(),
        name: after[..name_end].to_string(),
        arguments: object_text(args, partial),
    })
}

/// Functionary v3.1: `NAME>{...}` (inside `<function=` ... `</function>`).
fn functionary_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let name_end = inner.find('>')?;
    let name = inner[..name_end].trim();
    if name.is_empty() {
        return None;
    }
    let arguments = json_prefix(inner[name_end + 1..].trim_matches(is_ws), partial)?;
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments,
    })
}

/// Sections between `open` and `close`, each holding any number of calls. The last may be
/// unterminated: while streaming it is read as far as written; finished, only what is complete
/// in it counts.
fn tagged_sections(
    body: &str,
    open: &str,
    close: &str,
    partial: bool,
    parse_many: impl Fn(&str, bool) -> Vec<ToolCall>,
) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(start) = rest.find(open) {
        let inner = &rest[start + open.len()..];
        match inner.find(close) {
            Some(end) => {
                calls.extend(parse_many(&inner[..end], false));
                rest = &inner[end + close.len()..];
            }
            None => {
                calls.extend(parse_many(hold_back(inner, partial, &[close]), partial));
                break;
            }
        }
    }
    calls
}

/// JSON lists of calls after `open` (and before `close`, when the family closes them).
fn array_sections(
    body: &str,
    open: &str,
    close: Option<&str>,
    partial: bool,
    parse_obj: fn(&str, bool) -> Option<ToolCall>,
) -> Vec<ToolCall> {
    match close {
        Some(close) => tagged_sections(body, open, close, partial, |s, p| {
            json_array_calls(s, p, parse_obj)
        }),
        None => json_array_calls(body.strip_prefix(open).unwrap_or(body), partial, parse_obj),
    }
}

/// A call object with the given keys for its name, arguments and id; while streaming a call is
/// shown as soon as its name is known.
fn keyed_json_call(
    inner: &str,
    partial: bool,
    name_key: &str,
    args_key: &str,
    id_key: &str,
) -> Option<ToolCall> {
    let inner = inner.trim_matches(is_ws);
    let name = json_string_field(inner, name_key)?;
    let arguments = match raw_json_field(inner, &[args_key], partial) {
        Some(args) => args,
        None if partial && !inner.contains(&format!("\"{args_key}\"")) => String::new(),
        None => return None,
    };
    let id = if id_key.is_empty() {
        None
    } else {
        json_string_field(inner, id_key)
    };
    Some(ToolCall {
        id: id.unwrap_or_default(),
        name,
        arguments,
    })
}

/// Command R+: after `Action:`, a ```json fenced list of `{"tool_name": ..., "parameters": ...}`.
fn command_r_plus_calls(text: &str, partial: bool) -> Vec<ToolCall> {
    const FENCE: &str = "```json";
    let text = text.trim_start_matches(is_ws);
    let Some(fenced) = text.strip_prefix(FENCE) else {
        return Vec::new();
    };
    let (list, closed) = match fenced.find("```") {
        Some(end) => (&fenced[..end], true),
        None => (hold_back(fenced, partial, &["```"]), false),
    };
    json_array_calls(list, partial && !closed, |o, p| {
        keyed_json_call(o, p, "tool_name", "parameters", "")
    })
}

/// Apertus: `{"NAME": {...arguments...}}`.
fn name_keyed_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let after = inner.trim_matches(is_ws).strip_prefix('{')?.trim_start();
    let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
    let name = de.next()?.ok()?;
    let rest = after[de.byte_offset()..].trim_start().strip_prefix(':')?;
    let arguments = json_prefix(rest.trim_start(), partial)?;
    Some(ToolCall {
        id: String::new(),
        name,
        arguments,
    })
}

/// LFM2: `[NAME(KEY=VALUE, ...), ...]` with Python (or JSON) literal values. While streaming,
/// a call is shown once its name is written and its arguments grow as each value completes.
fn lfm2_calls(section: &str, partial: bool) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let Some(mut rest) = section.trim_start_matches(is_ws).strip_prefix('[') else {
        return calls;
    };
    loop {
        rest = rest.trim_start_matches(|c: char| is_ws(c) || c == ',');
        let Some(open) = rest.find('(') else {
            break;
        };
        let name = rest[..open].trim();
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !valid_name {
            break;
        }
        let mut args = serde_json::Map::new();
        let mut body = &rest[open + 1..];
        let closed = loop {
            body = body.trim_start_matches(|c: char| is_ws(c) || c == ',');
            if let Some(after) = body.strip_prefix(')') {
                body = after;
                break true;
            }
            let Some(eq) = body.find('=') else {
                break false;
            };
            let key = body[..eq].trim();
            match python_value(body[eq + 1..].trim_start_matches(is_ws)) {
                Some((value, used)) if !key.is_empty() => {
                    args.insert(key.to_string(), value);
                    let start = body.len() - body[eq + 1..].trim_start_matches(is_ws).len();
                    body = &body[start + used..];
                }
                _ => break false,
            }
        };
        if !closed && !partial {
            // malformed or cut short: dropped
            break;
        }
        calls.push(ToolCall {
            id: String::new(),
            name: name.to_string(),
            arguments: object_text(args, !closed),
        });
        if !closed {
            break;
        }
        rest = body;
    }
    calls
}

/// A Python (or JSON) literal at the start of `text` as JSON, and the bytes it took; None when
/// it is unfinished or not a literal.
fn python_value(text: &str) -> Option<(Json, usize)> {
    let first = text.chars().next()?;
    match first {
        '"' | '\'' => {
            let mut out = String::new();
            let mut chars = text.char_indices().skip(1);
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        let (_, e) = chars.next()?;
                        match e {
                            'n' => out.push('\n'),
                            't' => out.push('\t'),
                            'r' => out.push('\r'),
                            '0' => out.push('\0'),
                            'u' => {
                                let hex: String = (0..4)
                                    .filter_map(|_| chars.next().map(|(_, h)| h))
                                    .collect();
                                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                            }
                            other => out.push(other),
                        }
                    }
                    c if c == first => return Some((Json::String(out), i + 1)),
                    c => out.push(c),
                }
            }
            None
        }
        '[' | '(' | '{' => {
            let close = match first {
                '[' => ']',
                '(' => ')',
                _ => '}',
            };
            let mut rest = &text[1..];
            let mut items = Vec::new();
            let mut object = serde_json::Map::new();
            loop {
                rest = rest.trim_start_matches(is_ws);
                if let Some(after) = rest.strip_prefix(close) {
                    let used = text.len() - after.len();
                    let value = if first == '{' {
                        Json::Object(object)
                    } else {
                        Json::Array(items)
                    };
                    return Some((value, used));
                }
                let (value, used) = python_value(rest)?;
                rest = rest[used..].trim_start_matches(is_ws);
                if first == '{' {
                    let key = match value {
                        Json::String(k) => k,
                        other => other.to_string(),
                    };
                    rest = rest.strip_prefix(':')?.trim_start_matches(is_ws);
                    let (value, used) = python_value(rest)?;
                    object.insert(key, value);
                    rest = rest[used..].trim_start_matches(is_ws);
                } else {
                    items.push(value);
                }
                if let Some(after) = rest.strip_prefix(',') {
                    rest = after;
                } else if !rest.starts_with(close) {
                    return None;
                }
            }
        }
        _ => {
            let end = text.find(|c: char| is_ws(c) || matches!(c, ',' | ')' | ']' | '}' | ':'))?;
            let word = &text[..end];
            let value = match word {
                "True" | "true" => Json::Bool(true),
                "False" | "false" => Json::Bool(false),
                "None" | "null" => Json::Null,
                number => serde_json::from_str::<serde_json::Number>(number)
                    .ok()
                    .map(Json::Number)?,
            };
            Some((value, end))
        }
    }
}

/// Command R7B / Cohere2 MoE content: the text inside `<|START_RESPONSE|>` / `<|START_TEXT|>`
/// (None when the output does not start with one).
fn cohere_content(rest: &str, partial: bool) -> Option<&str> {
    let trimmed = rest.trim_start_matches(is_ws);
    for (start, end) in COHERE_CONTENT {
        if let Some(body) = trimmed.strip_prefix(start) {
            return Some(match body.find(end) {
                Some(e) => &body[..e],
                None => hold_back(body, partial, &[end]),
            });
        }
    }
    let may_open = COHERE_CONTENT
        .iter()
        .any(|(start, _)| start.starts_with(trimmed));
    (partial && !trimmed.is_empty() && may_open).then_some("")
}

/// Functionary v3.2: the prompt ends with `>>>`, so the output starts with a recipient line;
/// `all` is content, any other recipient a tool call whose JSON arguments follow. Later
/// messages start with `>>>` again.
fn parse_functionary_v32(text: &str, parse_tools: bool, partial: bool) -> ParsedMessage {
    let mut msg = ParsedMessage::default();
    if !parse_tools {
        // without tools everything after the `all` recipient is content
        match text.strip_prefix("all\n") {
            Some(rest) => msg.content = rest.to_string(),
            None if partial && "all\n".starts_with(text) => {}
            None => msg.content = text.to_string(),
        }
        return msg;
    }
    let segments: Vec<&str> = text.split(">>>").collect();
    let count = segments.len();
    for (i, segment) in segments.into_iter().enumerate() {
        let last = i + 1 == count;
        let Some((recipient, body)) = segment.split_once('\n') else {
            // a recipient still being written; finished, a lone first line is plain text
            if count == 1 && !partial {
                msg.content.push_str(segment);
            }
            break;
        };
        let recipient = recipient.trim();
        if recipient == "all" {
            let body = if last {
                hold_back(body, partial, &[">>>"])
            } else {
                body
            };
            msg.content.push_str(body);
        } else if !recipient.is_empty() {
            let arguments = json_prefix(body.trim_matches(is_ws), last && partial);
            if let Some(arguments) = arguments {
                msg.tool_calls.push(ToolCall {
                    id: String::new(),
                    name: recipient.to_string(),
                    arguments,
                });
            }
        }
    }
    msg
}

fn kimi_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let (id, args) = inner.split_once(KIMI_ARGS)?;
    let id = id.trim();
    let name = id.strip_prefix("functions.").unwrap_or(id);
    let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
    let arguments = json_prefix(args.trim_matches(is_ws), partial)?;
    Some(ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments,
    })
}

/// GLM: the name, then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs; values that
/// parse as JSON keep their type, others become strings.
fn glm_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let body = inner.trim_start_matches(is_ws);
    let name_end = body.find("<arg_key>").unwrap_or(body.len());
    let name = body[..name_end].trim();
    if name.is_empty() || (partial && name_end == body.len() && !body.ends_with(is_ws)) {
        // the name may still be growing
        return None;
    }
    let mut args = serde_json::Map::new();
    let mut rest = &body[name_end..];
    while let Some(k) = rest.find("<arg_key>") {
        let tail = &rest[k + "<arg_key>".len()..];
        let Some(key_end) = tail.find("</arg_key>") else {
            break;
        };
        let key = tail[..key_end].trim().to_string();
        let after = &tail[key_end + "</arg_key>".len()..];
        let Some(v) = after.find("<arg_value>") else {
            break;
        };
        let value_text = &after[v + "<arg_value>".len()..];
        let Some(end) = value_text.find("</arg_value>") else {
            if partial {
                break;
            }
            return None;
        };
        args.insert(key, typed_value(&value_text[..end]));
        rest = &value_text[end + "</arg_value>".len()..];
    }
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments: object_text(args, partial),
    })
}

/// A parameter value as JSON: its own type when it parses, a string otherwise.
fn typed_value(text: &str) -> Json {
    serde_json::from_str::<Json>(text)
        .ok()
        .filter(|v| !v.is_string())
        .unwrap_or_else(|| Json::String(text.to_string()))
}

/// Arguments built from parameters; while streaming the object is left open so later
/// parameters only append.
fn object_text(args: serde_json::Map<String, Json>, partial: bool) -> String {
    let text = Json::Object(args).to_string();
    if partial {
        text.trim_end_matches('}').to_string()
    } else {
        text
    }
}

fn mistral_json_calls(text: &str, partial: bool) -> Vec<ToolCall> {
    json_array_calls(text, partial, json_call)
}

/// The calls of a JSON list (the last possibly unfinished while streaming); finished, the list
/// must be complete and valid.
fn json_array_calls(
    text: &str,
    partial: bool,
    parse_obj: impl Fn(&str, bool) -> Option<ToolCall>,
) -> Vec<ToolCall> {
    let text = text.trim_matches(is_ws);
    let complete = json_value_end(text)
        .is_some_and(|end| serde_json::from_str::<Json>(&text[..end]).is_ok_and(|v| v.is_array()));
    if !complete && !partial {
        return Vec::new();
    }
    // each object of the list, the last possibly still being written
    let Some(inner) = text.strip_prefix('[') else {
        return Vec::new();
    };
    split_objects(inner)
        .into_iter()
        .filter_map(|obj| parse_obj(obj, partial))
        .collect()
}

/// The top-level `{...}` objects in a (possibly unfinished) list body.
fn split_objects(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text.trim_start_matches(|c: char| is_ws(c) || c == ',');
    while rest.starts_with('{') {
        match json_value_end(rest) {
            Some(end) => {
                out.push(&rest[..end]);
                rest = rest[end..].trim_start_matches(|c: char| is_ws(c) || c == ',');
            }
            None => {
                out.push(rest);
                break;
            }
        }
    }
    out
}

fn mistral_args_calls(body: &str, partial: bool) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    for chunk in body.split("[TOOL_CALLS]").skip(1) {
        let Some(args_at) = chunk.find("[ARGS]") else {
            continue;
        };
        let head = &chunk[..args_at];
        let (name, id) = match head.split_once("[CALL_ID]") {
            Some((name, id)) => (name, id),
            None => (head, ""),
        };
        let args = chunk[args_at + "[ARGS]".len()..].trim_matches(is_ws);
        let arguments = if partial && json_value_end(args).is_none() {
            Some(args.to_string())
        } else {
            json_prefix(args, false)
        };
        if let Some(arguments) = arguments {
            calls.push(ToolCall {
                id: id.trim().to_string(),
                name: name.trim().to_string(),
                arguments,
            });
        }
    }
    calls
}

fn llama3_calls(text: &str, partial: bool) -> Option<Vec<ToolCall>> {
    let call = json_call(text, partial)?;
    if !partial && json_value_end(text).is_none() {
        return None;
    }
    Some(vec![call])
}

fn deepseek_call(syntax: ToolSyntax, inner: &str, partial: bool) -> Option<ToolCall> {
    let (head, args) = inner.split_once(DS_SEP)?;
    if syntax == ToolSyntax::DeepSeekV31 {
        let arguments = json_prefix(args.trim_matches(is_ws), partial)?;
        return Some(ToolCall {
            id: String::new(),
            name: head.trim().to_string(),
            arguments,
        });
    }
    // R1 writes `function<｜tool▁sep｜>NAME` then the arguments in a ```json fence
    let (name, fenced) = args.split_once('\n')?;
    let fenced = fenced.trim_start();
    let json = match fenced.strip_prefix("```json") {
        Some(json) => json.trim_start(),
        None if partial && "```json".starts_with(fenced) => "",
        None => fenced,
    };
    let json = json
        .trim_end_matches(is_ws)
        .trim_end_matches('`')
        .trim_end_matches(is_ws);
    let arguments = json_prefix(json, partial)?;
    Some(ToolCall {
        id: String::new(),
        name: name.trim().to_string(),
        arguments,
    })
}

/// Harmony (gpt-oss): messages `<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>TEXT`
/// separated by `<|end|><|start|>assistant`; `analysis` is reasoning, `final` and plain
/// `commentary` are content, a `to=functions.NAME` recipient makes a tool call.
fn parse_harmony(
    text: &str,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    partial: bool,
) -> ParsedMessage {
    let mut msg = ParsedMessage::default();
    if !reasoning.extracts() {
        // upstream shows the analysis message raw and the final message's text
        let mut out = String::new();
        for (header, body, _) in harmony_messages(text, partial) {
            if header.contains("final") {
                out.push_str(&body);
            } else {
                out.push_str(&format!("<|channel|>{header}<|message|>{body}<|end|>"));
            }
        }
        msg.content = out;
        return msg;
    }
    for (header, body, closed) in harmony_messages(text, partial) {
        let recipient = header
            .split_whitespace()
            .find_map(|w| w.strip_prefix("to=functions."))
            .map(|n| n.trim_end_matches("<|constrain|>json").to_string());
        match recipient {
            Some(name) if parse_tools => {
                let args = body.trim_matches(is_ws);
                let arguments = if closed || !partial {
                    json_prefix(args, false)
                } else {
                    Some(args.to_string())
                };
                if let Some(arguments) = arguments {
                    msg.tool_calls.push(ToolCall {
                        id: String::new(),
                        name,
                        arguments,
                    });
                }
            }
            Some(_) => {}
            None if header.starts_with("analysis") => msg.reasoning_content.push_str(&body),
            None => msg.content.push_str(&body),
        }
    }
    msg
}

/// (header, text, finished) of each Harmony message in the output.
fn harmony_messages(text: &str, partial: bool) -> Vec<(String, String, bool)> {
    const MARKERS: [&str; 6] = [
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "<|call|>",
        "<|return|>",
    ];
    let mut out = Vec::new();
    let mut rest = text;
    // a role header may carry the recipient: " to=functions.NAME<|channel|>..."
    while let Some(ch) = rest.find("<|channel|>") {
        let prefix = &rest[..ch];
        let after = &rest[ch + "<|channel|>".len()..];
        let Some(msg_at) = after.find("<|message|>") else {
            break;
        };
        let mut header = after[..msg_at].trim().to_string();
        if let Some(to) = prefix.split_whitespace().find(|w| w.starts_with("to=")) {
            header = format!("{header} {to}");
        }
        let body_all = &after[msg_at + "<|message|>".len()..];
        let end = ["<|end|>", "<|call|>", "<|return|>"]
            .iter()
            .filter_map(|m| body_all.find(m).map(|p| (p, m.len())))
            .min();
        match end {
            Some((p, len)) => {
                out.push((header, body_all[..p].to_string(), true));
                rest = &body_all[p + len..];
            }
            None => {
                let body = hold_back(body_all, partial, &MARKERS);
                out.push((header, body.to_string(), false));
                break;
            }
        }
    }
    if out.is_empty() && !text.contains("<|channel|>") {
        out.push((
            "final".into(),
            hold_back(text, partial, &MARKERS).to_string(),
            !partial,
        ));
    }
    out
}

/// One streamed change to the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    /// The start of tool call `index` (its id and name), or more of its arguments.
    ToolCall {
        index: usize,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
}

/// Parses output as it streams: feed pieces, get deltas; ids are given to tool calls that
/// have none (as upstream's server does) and kept stable across deltas.
#[derive(Debug)]
pub struct StreamParser {
    format: OutputFormat,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    text: String,
    shown: ParsedMessage,
    ids: Vec<String>,
    id_seed: u64,
}

impl StreamParser {
    pub fn new(format: OutputFormat, reasoning: ReasoningFormat, parse_tools: bool) -> Self {
        let id_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        StreamParser {
            format,
            reasoning,
            parse_tools,
            text: String::new(),
            shown: ParsedMessage::default(),
            ids: Vec::new(),
            id_seed,
        }
    }

    /// Adds generated text; returns what became visible.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        self.text.push_str(piece);
        let parsed = self
            .format
            .parse(&self.text, self.reasoning, self.parse_tools, true);
        self.advance(parsed)
    }

    /// Ends the stream: the final message and the last deltas.
    pub fn finish(mut self) -> (ParsedMessage, Vec<Delta>) {
        let parsed = self
            .format
            .parse(&self.text, self.reasoning, self.parse_tools, false);
        let deltas = self.advance(parsed);
        (self.shown, deltas)
    }

    fn next_id(&mut self) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..32)
            .map(|_| {
                // xorshift: ids need to be unique, not unpredictable
                self.id_seed ^= self.id_seed << 13;
                self.id_seed ^= self.id_seed >> 7;
                self.id_seed ^= self.id_seed << 17;
                ALPHABET[(self.id_seed % ALPHABET.len() as u64) as usize] as char
            })
            .collect()
    }

    fn advance(&mut self, mut parsed: ParsedMessage) -> Vec<Delta> {
        let mut deltas = Vec::new();
        // never take back what was shown: only growth is streamed
        if let Some(more) = parsed
            .reasoning_content
            .strip_prefix(self.shown.reasoning_content.as_str())
        {
            if !more.is_empty() {
                deltas.push(Delta::Reasoning(more.to_string()));
            }
        } else {
            parsed.reasoning_content = self.shown.reasoning_content.clone();
        }
        if let Some(more) = parsed.content.strip_prefix(self.shown.content.as_str()) {
            if !more.is_empty() {
                deltas.push(Delta::Content(more.to_string()));
            }
        } else {
            parsed.content = self.shown.content.clone();
        }
        for (index, call) in parsed.tool_calls.iter_mut().enumerate() {
            if index >= self.ids.len() {
                let id = if call.id.is_empty() {
                    self.next_id()
                } else {
                    call.id.clone()
                };
                self.ids.push(id);
            }
            call.id = self.ids[index].clone();
            match self.shown.tool_calls.get(index) {
                None => deltas.push(Delta::ToolCall {
                    index,
                    id: Some(call.id.clone()),
                    name: Some(call.name.clone()),
                    arguments: call.arguments.clone(),
                }),
                Some(old) => match call.arguments.strip_prefix(old.arguments.as_str()) {
                    Some(more) if !more.is_empty() => deltas.push(Delta::ToolCall {
                        index,
                        id: None,
                        name: None,
                        arguments: more.to_string(),
                    }),
                    Some(_) => {}
                    None => call.arguments = old.arguments.clone(),
                },
            }
        }
        if parsed.tool_calls.len() < self.shown.tool_calls.len() {
            parsed.tool_calls = self.shown.tool_calls.clone();
        }
        self.shown = parsed;
        deltas
    }
}
